//! `raft::Storage` over journal format 2 (`log::journal2`) and the `raft-state` file
//! (`docs/REPLICATION.md` §5.3): what raft reads of its own log and hard state, served
//! from an entry cache and, below it, from the journal.
//!
//! Writes stay the caller's, in the Ready loop: [`JournalStorage::append`] (a Ready's
//! entries, cutting back first when they replace some), [`JournalStorage::hard_state_job`]
//! (a `raft-state` write, on the fsync pool) and the journal's sync jobs. Raft reads through
//! `&self` at any time, so the cache holds every entry appended and not yet evicted, and
//! entries below it are read back from the journal with `pread`.
//!
//! ```text
//! raft-state (a meta file, log/meta.rs): term u64, vote u64, commit u64 (big-endian)
//! ```

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use raft::eraftpb::{ConfState, Entry, HardState, Snapshot};
use raft::{GetEntriesContext, RaftState};

use crate::log::journal2::{Checkpoint2, RaftJournal, RaftJournalReport, RaftJournalSync};
use crate::log::{meta, Storage, StorageError};

/// The hard state's file in the data directory; its presence makes a data directory a
/// cluster node's.
pub const RAFT_STATE_FILE: &str = "raft-state";
/// The journal's directory in a cluster data directory.
pub const RAFT_JOURNAL_DIR: &str = "raft-journal";
/// Entry data kept in memory for raft (appends to followers, apply): the newest entries
/// up to this many bytes. Older ones are read back from the journal.
pub const ENTRY_CACHE_BYTES_MAX: usize = 16 * 1024 * 1024;
const RAFT_STATE_BYTES: usize = 24;

/// Writing the hard state: raft's term, vote and commit index.
#[derive(Debug)]
pub struct HardStateWrite {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    bytes: [u8; RAFT_STATE_BYTES],
}

impl HardStateWrite {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        meta::write_atomic(&*self.storage, &self.path, &self.bytes)
    }
}

fn encode_hard_state(hs: &HardState) -> [u8; RAFT_STATE_BYTES] {
    let mut bytes = [0u8; RAFT_STATE_BYTES];
    for (i, v) in [hs.term, hs.vote, hs.commit].into_iter().enumerate() {
        bytes[8 * i..8 * i + 8].copy_from_slice(&v.to_be_bytes());
    }
    bytes
}

/// Writes `hs` as the `raft-state` of data directory `dir`. Blocking: fsync worker.
pub fn write_hard_state(storage: &dyn Storage, dir: &Path, hs: &HardState) -> io::Result<()> {
    meta::write_atomic(storage, &dir.join(RAFT_STATE_FILE), &encode_hard_state(hs))
}

/// The raft log and hard state of one node.
pub struct JournalStorage {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    journal: RaftJournal,
    hard_state: HardState,
    conf_state: ConfState,
    /// The newest entries, contiguous, ending at the journal's last.
    cache: VecDeque<Entry>,
    cache_bytes: usize,
    /// Snapshots made for a peer (`replica::install`), each handed to raft once.
    offers: RefCell<BTreeMap<u64, Snapshot>>,
    /// Peers raft asked a snapshot for and found none: the broker makes one.
    wanted: RefCell<BTreeSet<u64>>,
}

impl JournalStorage {
    /// Opens the node's log in `dir` (the data directory): `raft-state` and the journal,
    /// replayed. `voters` are the ids of `--peers`: static membership, the same on every
    /// node, as `MemStorage::initialize_with_conf_state` would set it. Blocking: start-up.
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        journal_file_bytes: u64,
        voters: Vec<u64>,
    ) -> Result<(JournalStorage, RaftJournalReport), StorageError> {
        let state_path = dir.join(RAFT_STATE_FILE);
        let io = |e| StorageError::from_io(&state_path, None, e);
        let mut hard_state = HardState::default();
        if let Some(b) = meta::read_checked(&**storage, &state_path).map_err(io)? {
            let at = |i: usize| {
                b.get(i..i + 8)
                    .map(|s| u64::from_be_bytes(s.try_into().expect("8")))
            };
            let (Some(term), Some(vote), Some(commit)) = (at(0), at(8), at(16)) else {
                let bad = io::Error::new(io::ErrorKind::InvalidData, "raft-state too short");
                return Err(io(bad));
            };
            hard_state.term = term;
            hard_state.vote = vote;
            hard_state.commit = commit;
        }
        // A process killed between the rename of a `raft-state` write and the directory's
        // sync leaves the new name in the page cache only; raft goes on from the term and
        // vote read here, so they must outlive a power cut from now on.
        storage.sync_dir(dir).map_err(io)?;
        let (journal, report) = RaftJournal::open(
            storage,
            &dir.join(RAFT_JOURNAL_DIR),
            journal_file_bytes,
            |_| {},
        )?;
        // Entries replayed may carry a newer commit than the last raft-state write.
        // A checkpoint's index was applied, hence committed, even where no later entry's
        // `commit` field says so.
        let commit = hard_state
            .commit
            .max(report.commit)
            .max(report.checkpoint.index);
        if commit > journal.last_index() {
            // A power cut between a Ready's `raft-state` write and its journal sync does
            // this, harmlessly (the Ready never counted as persisted); so does a disk
            // that lost synced entries, which is not harmless. The leader sends the
            // entries again either way; the operator should know which it was.
            log::warn!(
                "{}: commit index {commit} lies past the journal's last entry {}: entries \
                 known committed are missing (cut off by a power loss before their sync, \
                 or lost by the disk after it); the leader sends them again",
                dir.display(),
                journal.last_index()
            );
        }
        hard_state.commit = commit.min(journal.last_index());
        let conf_state = ConfState {
            voters,
            ..ConfState::default()
        };
        let store = JournalStorage {
            storage: Arc::clone(storage),
            dir: dir.to_path_buf(),
            journal,
            hard_state,
            conf_state,
            cache: VecDeque::new(),
            cache_bytes: 0,
            offers: RefCell::new(BTreeMap::new()),
            wanted: RefCell::new(BTreeSet::new()),
        };
        Ok((store, report))
    }

    /// Appends a Ready's entries, cutting back first when they start at or below the last
    /// index (a new leader's entries replace this node's uncommitted ones), and writes
    /// them. The caller then takes a sync job; raft may read them from now on.
    pub fn append(&mut self, entries: &[Entry]) -> Result<(), StorageError> {
        let Some(first) = entries.first() else {
            return Ok(());
        };
        if first.index <= self.journal.last_index() {
            self.journal.truncate_from(first.index)?;
            while self.cache.back().is_some_and(|e| e.index >= first.index) {
                let e = self.cache.pop_back().expect("checked");
                self.cache_bytes -= e.data.len();
            }
        }
        for e in entries {
            self.journal
                .append(e.term, e.index, self.hard_state.commit, &e.data);
        }
        self.journal.write()?;
        for e in entries {
            self.cache_bytes += e.data.len();
            self.cache.push_back(e.clone());
        }
        while self.cache_bytes > ENTRY_CACHE_BYTES_MAX && self.cache.len() > 1 {
            let e = self.cache.pop_front().expect("len checked");
            self.cache_bytes -= e.data.len();
        }
        Ok(())
    }

    /// Takes a Ready's hard state; returns the `raft-state` write for the fsync pool.
    /// The Ready counts as persisted only once it is done (the vote, the term).
    pub fn hard_state_job(&mut self, hs: &HardState) -> HardStateWrite {
        self.hard_state = hs.clone();
        HardStateWrite {
            storage: Arc::clone(&self.storage),
            path: self.dir.join(RAFT_STATE_FILE),
            bytes: encode_hard_state(hs),
        }
    }

    /// A new commit index from a Ready without a new term or vote: kept for the next
    /// entries' `commit` field and the next `raft-state` write, not written on its own
    /// (replay recovers it from the entries).
    pub fn set_commit(&mut self, commit: u64) {
        self.hard_state.commit = commit;
    }

    /// The hard state as last handed to [`JournalStorage::hard_state_job`] or
    /// [`JournalStorage::set_commit`].
    pub fn hard_state(&self) -> &HardState {
        &self.hard_state
    }

    pub fn journal(&self) -> &RaftJournal {
        &self.journal
    }

    /// A job making the journal's next file ahead finished.
    pub fn spare_made(&mut self, result: &io::Result<()>) {
        self.journal.spare_made(result);
    }

    /// The peers raft asked a snapshot for since the last call.
    pub fn take_wanted_snapshots(&self) -> BTreeSet<u64> {
        std::mem::take(&mut *self.wanted.borrow_mut())
    }

    /// A snapshot at applied entry `index` whose data is `data` (an INSTALL manifest),
    /// for raft to send to `to` the next time it asks.
    pub fn offer_snapshot(&mut self, to: u64, index: u64, data: Vec<u8>) {
        let mut snapshot = Snapshot::default();
        let meta = snapshot.mut_metadata();
        meta.index = index;
        meta.term = self.journal.term(index).expect("an applied entry is held");
        meta.set_conf_state(self.conf_state.clone());
        snapshot.data = data.into();
        self.offers.get_mut().insert(to, snapshot);
    }

    /// A checkpoint is durable: the journal forgets what lies below it and returns the
    /// files to remove.
    pub fn checkpoint_done(&mut self, point: Checkpoint2) -> Vec<PathBuf> {
        self.journal.checkpoint_done(point)
    }

    pub fn take_sync_job(&mut self) -> Option<RaftJournalSync> {
        self.journal.take_sync_job()
    }

    pub fn sync_done(&mut self, job: u64) -> u64 {
        self.journal.sync_done(job)
    }

    /// A sync job failed: the journal is poisoned (sticky, as in format 1).
    pub fn sync_failed(&mut self, err: &io::Error) {
        self.journal.sync_failed(err);
    }

    fn entry(&self, index: u64) -> raft::Result<Entry> {
        let cached_from = self.cache.front().map_or(u64::MAX, |e| e.index);
        if index >= cached_from {
            return Ok(self.cache[(index - cached_from) as usize].clone());
        }
        let data = self
            .journal
            .read(index, index + 1)
            .map_err(|e| raft::Error::Store(raft::StorageError::Other(Box::new(e))))?;
        Ok(Entry {
            index,
            term: self.journal.term(index).expect("held"),
            data: data.into_iter().next().expect("one").into(),
            ..Entry::default()
        })
    }
}

impl raft::Storage for JournalStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        Ok(RaftState::new(
            self.hard_state.clone(),
            self.conf_state.clone(),
        ))
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        _context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        if low < self.journal.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        if high > self.journal.last_index() + 1 {
            return Err(raft::Error::Store(raft::StorageError::Unavailable));
        }
        let max_size = max_size.into();
        let (mut out, mut bytes) = (Vec::new(), 0u64);
        for index in low..high {
            let e = self.entry(index)?;
            bytes += e.data.len() as u64;
            out.push(e);
            if max_size.is_some_and(|max| bytes > max) {
                break;
            }
        }
        raft::util::limit_size(&mut out, max_size);
        Ok(out)
    }

    fn term(&self, index: u64) -> raft::Result<u64> {
        if index + 1 < self.journal.first_index() {
            return Err(raft::Error::Store(raft::StorageError::Compacted));
        }
        self.journal
            .term(index)
            .ok_or(raft::Error::Store(raft::StorageError::Unavailable))
    }

    fn first_index(&self) -> raft::Result<u64> {
        Ok(self.journal.first_index())
    }

    fn last_index(&self) -> raft::Result<u64> {
        Ok(self.journal.last_index())
    }

    /// Journals are compacted only up to a FLOOR every voter had reached (§5.4), so a
    /// snapshot is wanted only by a node that lost its log (or joins with none). None is
    /// made here: raft's `&self` cannot read the broker, so the first ask names the
    /// peer, the broker makes a manifest of its files at its applied index
    /// ([`JournalStorage::offer_snapshot`]), and raft's next ask, one heartbeat later,
    /// takes it. An offer from before the journal's first entry (made for an earlier
    /// ask the peer then caught up without) is not taken: the peer would need entries
    /// that are gone after installing it, and raft, whose match for the peer may already
    /// be past it, would wait in its Snapshot state for a report that never comes. A new
    /// one is asked for.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let offered = self.offers.borrow_mut().remove(&to);
        let first = self.journal.first_index();
        match offered {
            Some(s) if s.get_metadata().index >= request_index.max(first - 1) => Ok(s),
            _ => {
                self.wanted.borrow_mut().insert(to);
                Err(raft::Error::Store(
                    raft::StorageError::SnapshotTemporarilyUnavailable,
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::logger::raft_logger;
    use super::*;
    use crate::log::simdisk::SimDisk;
    use raft::eraftpb::Message;
    use raft::{RawNode, StateRole};

    const NODES: u64 = 3;
    const JOURNAL_FILE_BYTES: u64 = 64 * 1024;
    /// Ticks and message rounds a 3-node group may take to elect and replicate.
    const ROUNDS_MAX: usize = 500;

    struct Node {
        disk: SimDisk,
        raw: RawNode<JournalStorage>,
        applied: Vec<(u64, Vec<u8>)>,
    }

    fn start(disk: SimDisk, id: u64) -> Node {
        let storage: Arc<dyn Storage> = Arc::new(disk.clone());
        let voters = (1..=NODES).collect();
        let (store, _) =
            JournalStorage::open(&storage, Path::new("/data"), JOURNAL_FILE_BYTES, voters).unwrap();
        let applied = store.hard_state.commit;
        let config = raft::Config {
            id,
            election_tick: 10,
            heartbeat_tick: 2,
            pre_vote: true,
            check_quorum: true,
            applied,
            max_size_per_msg: 1024 * 1024,
            max_inflight_msgs: 32,
            ..raft::Config::default()
        };
        let raw = RawNode::new(&config, store, &raft_logger()).unwrap();
        Node {
            disk,
            raw,
            applied: Vec::new(),
        }
    }

    /// One Ready of `node`, persisted as the reactor will: entries written and synced and
    /// the hard state written before the Ready counts as persisted. Returns messages out.
    fn handle_ready(node: &mut Node) -> Vec<Message> {
        if !node.raw.has_ready() {
            return Vec::new();
        }
        let mut rd = node.raw.ready();
        let mut out = rd.take_messages();
        let store = node.raw.mut_store();
        store.append(rd.entries()).unwrap();
        if let Some(job) = store.take_sync_job() {
            job.run().unwrap();
            store.sync_done(job.job);
        }
        if let Some(hs) = rd.hs() {
            store.hard_state_job(hs).run().unwrap();
        } else if let Some(commit) = rd.committed_entries().last().map(|e| e.index) {
            store.set_commit(commit);
        }
        apply(&mut node.applied, rd.take_committed_entries());
        out.extend(rd.take_persisted_messages());
        let mut light = node.raw.advance(rd);
        if let Some(commit) = light.commit_index() {
            node.raw.mut_store().set_commit(commit);
        }
        out.extend(light.take_messages());
        apply(&mut node.applied, light.take_committed_entries());
        node.raw.advance_apply();
        out
    }

    fn apply(applied: &mut Vec<(u64, Vec<u8>)>, entries: Vec<Entry>) {
        // Empty entries are the no-op a new leader appends.
        applied.extend(
            entries
                .into_iter()
                .filter(|e| !e.data.is_empty())
                .map(|e| (e.index, e.data.to_vec())),
        );
    }

    /// Ticks every node, then delivers messages until none is left, `rounds` times.
    fn run(nodes: &mut [Node], rounds: usize, done: impl Fn(&[Node]) -> bool) -> bool {
        for _ in 0..rounds {
            for n in nodes.iter_mut() {
                n.raw.tick();
            }
            let mut msgs: Vec<Message> = nodes.iter_mut().flat_map(handle_ready).collect();
            while !msgs.is_empty() {
                for m in std::mem::take(&mut msgs) {
                    nodes[m.to as usize - 1].raw.step(m).unwrap();
                }
                msgs = nodes.iter_mut().flat_map(handle_ready).collect();
            }
            if done(nodes) {
                return true;
            }
        }
        false
    }

    fn leader(nodes: &[Node]) -> Option<usize> {
        nodes
            .iter()
            .position(|n| n.raw.raft.state == StateRole::Leader)
    }

    /// A process killed between the rename of a `raft-state` write and the directory's
    /// sync: the restart reads the new term and vote from the page cache and goes on
    /// from them, so a later power cut must not bring the old ones back (a vote given
    /// twice in one term).
    #[test]
    fn a_hard_state_read_at_start_outlives_a_later_power_cut() {
        let disk = SimDisk::seeded(1);
        let storage: Arc<dyn Storage> = Arc::new(disk.clone());
        let dir = Path::new("/data");
        let open = || JournalStorage::open(&storage, dir, JOURNAL_FILE_BYTES, vec![1, 2, 3]);
        let voted = |term, vote| HardState {
            term,
            vote,
            ..HardState::default()
        };
        drop(open().unwrap());
        write_hard_state(&*storage, dir, &voted(4, 2)).unwrap();
        let (path, tmp) = (dir.join(RAFT_STATE_FILE), dir.join("raft-state.new"));
        storage
            .write(&tmp, &meta::with_footer(&encode_hard_state(&voted(5, 3))))
            .unwrap();
        storage
            .open(&tmp, crate::log::storage::Open::ReadWrite)
            .unwrap()
            .sync_data()
            .unwrap();
        storage.rename(&tmp, &path).unwrap();
        let (read, _) = open().unwrap();
        assert_eq!(read.hard_state, voted(5, 3), "the page cache's");
        disk.power_cut();
        let (again, _) = open().unwrap();
        assert_eq!(again.hard_state, read.hard_state);
    }

    #[test]
    fn three_nodes_over_simulated_disks_elect_a_leader_replicate_and_restart() {
        let mut nodes: Vec<Node> = (1..=NODES)
            .map(|id| start(SimDisk::seeded(id), id))
            .collect();
        assert!(
            run(&mut nodes, ROUNDS_MAX, |n| leader(n).is_some()),
            "no leader"
        );
        let l = leader(&nodes).unwrap();
        let term = nodes[l].raw.raft.term;
        for i in 0..20u8 {
            nodes[l].raw.propose(vec![], vec![i; 100]).unwrap();
        }
        let all_applied = |n: &[Node]| n.iter().all(|n| n.applied.len() == 20);
        assert!(run(&mut nodes, ROUNDS_MAX, all_applied), "not replicated");
        for n in &nodes {
            let data: Vec<Vec<u8>> = n.applied.iter().map(|a| a.1.clone()).collect();
            assert_eq!(data, (0..20u8).map(|i| vec![i; 100]).collect::<Vec<_>>());
            assert_eq!(
                n.applied, nodes[l].applied,
                "same entries at the same indexes"
            );
        }
        // A follower loses power: what it acknowledged was synced, so it comes back whole,
        // with its term and vote.
        let f = (l + 1) % NODES as usize;
        let last = nodes[f].raw.store().journal().last_index();
        let disk = nodes[f].disk.clone();
        disk.power_cut();
        nodes[f] = start(disk, f as u64 + 1);
        let store = nodes[f].raw.store();
        assert_eq!(store.journal().last_index(), last);
        assert_eq!(store.hard_state.term, term);
        assert!(
            store.hard_state.commit >= last - 1,
            "commit {}",
            store.hard_state.commit
        );
        assert_eq!(raft::Storage::term(store, last).unwrap(), term);
        // The group goes on with it.
        let l = leader(&nodes).unwrap();
        nodes[l].raw.propose(vec![], b"after".to_vec()).unwrap();
        let caught_up = |n: &[Node]| n.iter().all(|n| n.raw.raft.raft_log.applied > last);
        assert!(
            run(&mut nodes, ROUNDS_MAX, caught_up),
            "the restarted follower lags"
        );
    }
}
