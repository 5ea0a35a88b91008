//! The replicated state machine, sans-IO (`docs/REPLICATION.md` §5.2, §7.1): a `RawNode`
//! over [`JournalStorage`], driven by the caller's ticks, peer messages and job
//! completions, answering with [`Effect`]s: messages to peers, persist jobs for the fsync
//! pool, committed entries to apply, answers for REPLICATED waiters.
//!
//! Persistence before acknowledgement: a Ready's entries and hard state become a
//! [`PersistJob`]; raft is told (`on_persist_ready`) and the Ready's persisted messages
//! (a follower's append and vote responses) go out only after the caller reports the job
//! done, in Ready order. The leader's appends go out at once (raft thesis §10.2.1), and
//! it counts itself toward a commit only after its own job, so "committed" always means a
//! majority fsynced.
//!
//! No acknowledgement after deposal (§7.3): OK answers wait while the leader's lease is
//! expired, the lease being the time since the leader sent heartbeats a majority answered,
//! shorter than the shortest election timeout by [`LEASE_MARGIN_MS`].
//!
//! Not here yet (§10, increment 4): the pending overlay of §4, snapshots.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt;
use std::io;
use std::path::Path;
use std::sync::Arc;

use raft::eraftpb::{Entry, EntryType, Message, MessageType};
use raft::{RawNode, Ready, StateRole, INVALID_ID};

use super::entry::{EntryData, EntryError};
use super::logger::raft_logger;
use super::storage::{HardStateWrite, JournalStorage};
use super::vet::{vet, Lie, Verdict, View};
use crate::broker::ConnRef;
use crate::log::journal::SpareWrite;
use crate::log::journal2::{Checkpoint2, Checkpoint2Write, RaftJournalReport, RaftJournalSync};
use crate::log::simdisk::SimRng;
use crate::log::{Storage, StorageError};
use crate::wire::ErrorCode;

/// Entry bytes in one append message (peer frames are capped at 2 MiB, §5.6).
pub const MSG_BYTES_MAX: u64 = 1024 * 1024;
/// Append messages in flight to one follower before the leader waits for responses.
pub const INFLIGHT_MSGS_MAX: usize = 32;
/// Raft journal fdatasyncs running at once. Past it a Ready's entries wait, written, for
/// the next sync, which takes everything written by then: group commit, as the single
/// node's `JOURNAL_SYNCS_IN_FLIGHT_MAX` (`docs/REPLICATION.md` §5.2).
pub const RAFT_SYNCS_IN_FLIGHT_MAX: usize = 1;
/// Committed entry bytes one Ready hands to apply: bounds the reactor's pass (§4).
pub const COMMITTED_BYTES_PER_READY_MAX: u64 = 4 * 1024 * 1024;
/// Proposed and not committed bytes before proposals answer BACKPRESSURE (§5.2): the
/// single node's `UNSYNCED_BYTES_MAX`.
pub const UNCOMMITTED_BYTES_MAX: u64 = crate::broker::publish::UNSYNCED_BYTES_MAX;

/// How much shorter the lease is than the shortest election timeout (§7.3), at least two
/// ticks: covers a heartbeat's way to the follower and one tick of the follower's
/// election clock (it may count its first tick right after hearing from the leader).
/// Clock drift between nodes is assumed well below it.
pub const LEASE_MARGIN_MS: u64 = 100;
/// `--raft-tick`'s default, for callers that do not say (the lease is counted in ms).
pub const TICK_MS_DEFAULT: u64 = 50;
/// Tags a heartbeat's `context` with the leader's term and send time (ms); followers echo
/// it in their response, so the lease runs from when the answered heartbeat was sent.
const LEASE_STAMP_TAG: &[u8; 4] = b"MMQL";
const LEASE_STAMP_BYTES: usize = 4 + 8 + 8;

/// Settings beyond the cluster's flags, each with a default ([`Replica::open_with`]).
#[derive(Debug, Clone)]
pub struct ReplicaOptions {
    /// `--raft-tick`: how long a tick is, so that the lease is counted in ms.
    pub tick_ms: u64,
    /// Draws election timeouts from this seed instead of raft's `thread_rng`, so that a
    /// simulation replays one history per seed. `None`: raft draws them.
    pub election_seed: Option<u64>,
    /// Raft drops proposals past this many bytes of uncommitted entries (0x4001): the
    /// broker's own cap on unsynced bytes, [`UNCOMMITTED_BYTES_MAX`]; tests lower it to
    /// reach a refusal with a few records.
    pub uncommitted_bytes_max: u64,
}

impl Default for ReplicaOptions {
    fn default() -> Self {
        ReplicaOptions {
            tick_ms: TICK_MS_DEFAULT,
            election_seed: None,
            uncommitted_bytes_max: UNCOMMITTED_BYTES_MAX,
        }
    }
}

/// What a node needs to know about the cluster (the flags of §6).
#[derive(Debug, Clone)]
pub struct ReplicaConfig {
    pub id: u64,
    /// Every voter's id and advertised client address (`host:port`), this node included.
    pub nodes: BTreeMap<u64, String>,
    pub election_ticks: usize,
    pub heartbeat_ticks: usize,
    pub journal_file_bytes: u64,
    /// `--journal-retain`: journal bytes a leader keeps for a follower behind the others;
    /// past it, that follower gets a snapshot (§5.5).
    pub journal_retain_bytes: u64,
    /// The index the broker's state already holds (apply starts after it).
    pub applied: u64,
    /// Leaderless time after which the gate answers ELECTION_TIMEOUT, not LEADER_UNKNOWN.
    pub replication_timeout_ms: u64,
}

/// The three in-process harnesses' cluster (`sim`, `simnet`, `cluster_sim`): node `id`
/// of `nodes`, each at client address `127.0.0.1:7000+id`, on the default timers; each
/// harness overrides what it tunes.
#[cfg(test)]
pub(super) fn test_config(id: u64, nodes: u64) -> ReplicaConfig {
    ReplicaConfig {
        id,
        nodes: (1..=nodes).map(|n| (n, test_address(n))).collect(),
        election_ticks: 10,
        heartbeat_ticks: 2,
        journal_file_bytes: 64 * 1024,
        journal_retain_bytes: u64::MAX,
        applied: 0,
        replication_timeout_ms: 5_000,
    }
}

/// Node `id`'s client address in [`test_config`].
#[cfg(test)]
pub(super) fn test_address(id: u64) -> String {
    format!("127.0.0.1:{}", 7000 + id)
}

/// A request the role gate turns away, with the ERR frame's code and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub text: String,
}

/// A request waiting for its entry to commit; `part` is the PUB's partition
/// `(topic_id, partition)`, whose committed sequence the answer carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiter {
    pub conn: ConnRef,
    pub slot: u64,
    pub part: Option<(u16, u16)>,
}

/// A REPLICATED answer's fields (`man/mortarmq.7`, PUB result).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replicated {
    pub index: u64,
    /// The term of the entry holding the record.
    pub leader_epoch: u64,
    /// The partition's highest committed sequence, applied on this node.
    pub commit_seq: u64,
}

#[derive(Debug)]
pub enum Effect {
    /// To peer `msg.to`.
    Send(Message),
    /// Run on the fsync pool, then [`Replica::persist_done`].
    Persist(PersistJob),
    /// A committed entry, in index order, to apply to the broker's state.
    Apply {
        index: u64,
        term: u64,
        entry: EntryData,
    },
    Answer {
        waiter: Waiter,
        result: Result<Replicated, ErrorCode>,
    },
    /// A leader's snapshot (`replica::install`): raft on this node stops here, for
    /// good; the broker installs it and restarts the process.
    Install {
        /// The manifest, which names the snapshot's index and term.
        data: Vec<u8>,
        /// Raft's term and vote now, for the `raft-state` the install writes.
        hard_state: (u64, u64),
    },
}

/// The persistence of one or more Readies: their entries' fdatasync and, on a new term or
/// vote, the `raft-state` write.
#[derive(Debug)]
pub struct PersistJob {
    /// The Readies it makes persisted: one, or those whose entries waited for a sync.
    pub readies: Vec<u64>,
    sync: Option<RaftJournalSync>,
    hard_state: Option<HardStateWrite>,
}

impl PersistJob {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        if let Some(sync) = &self.sync {
            sync.run()?;
        }
        if let Some(hs) = &self.hard_state {
            hs.run()?;
        }
        Ok(())
    }
}

/// The node cannot go on: its log failed or holds an entry it cannot apply.
#[derive(Debug)]
pub enum ReplicaError {
    Storage(StorageError),
    Raft(raft::Error),
    Entry {
        index: u64,
        error: EntryError,
    },
    /// A peer's message [`vet`] dropped; the node goes on.
    Refused {
        lie: Lie,
        why: String,
    },
}

impl fmt::Display for ReplicaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplicaError::Storage(e) => write!(f, "{e}"),
            ReplicaError::Raft(e) => write!(f, "raft: {e}"),
            ReplicaError::Entry { index, error } => write!(f, "entry {index}: {error}"),
            ReplicaError::Refused { lie, why } => write!(f, "{}: {why}", lie.label()),
        }
    }
}

impl std::error::Error for ReplicaError {}

impl From<StorageError> for ReplicaError {
    fn from(e: StorageError) -> Self {
        ReplicaError::Storage(e)
    }
}

/// The fdatasync of every entry written by now. Entries written and no sync to take: only
/// a poisoned journal says so, and nothing may then count as persisted.
fn take_sync_job(store: &mut JournalStorage) -> Result<RaftJournalSync, ReplicaError> {
    store.take_sync_job().ok_or_else(|| {
        ReplicaError::Storage(StorageError::Poisoned {
            path: store.journal().dir().to_path_buf(),
            reason: "no fdatasync for entries written".to_string(),
        })
    })
}

/// A waiter and the entry it waits for: proposed in `term`, at `since_ms`.
struct Pending {
    term: u64,
    since_ms: u64,
    waiter: Waiter,
}

/// A Ready handed out and not yet known persisted, with the messages that wait for it.
struct Persisting {
    ready: u64,
    /// Its entries are written and wait for a sync job (`RAFT_SYNCS_IN_FLIGHT_MAX` ran).
    wants_sync: bool,
    done: bool,
    messages: Vec<Message>,
}

pub struct Replica {
    raw: RawNode<JournalStorage>,
    nodes: BTreeMap<u64, String>,
    replication_timeout_ms: u64,
    journal_retain_bytes: u64,
    election_ticks: usize,
    /// Ticks taken, and the tick at which each peer was last heard from.
    ticks: u64,
    last_heard: HashMap<u64, u64>,
    persisting: VecDeque<Persisting>,
    /// By entry index; indexes and `since_ms` grow together.
    waiters: BTreeMap<u64, Vec<Pending>>,
    committed_seqs: HashMap<(u16, u16), u64>,
    applied: u64,
    was_leader: bool,
    leaderless_since_ms: Option<u64>,
    effects: Vec<Effect>,
    /// §7.3: per peer, the send time (ms) of the newest heartbeat of `lease_term` it
    /// answered; OK answers wait in `held` while fewer than a majority are recent.
    lease_ms: u64,
    lease_term: u64,
    lease_acks: HashMap<u64, u64>,
    held: VecDeque<(Pending, Replicated)>,
    /// The pass's time, for stamping heartbeats.
    now_ms: u64,
    /// The term in which this node, as leader, last pinged its followers.
    pinged_term: u64,
    elections: Option<SeededElections>,
    /// Opened on an empty log with no term: a new cluster's node, or one whose data
    /// directory was lost (§11).
    started_empty: bool,
    /// A peer's HELLO reported a log this long while this node started empty: no vote
    /// until its own log reaches it (§11).
    abstain_below: u64,
    /// A snapshot arrived: raft takes no further step in this process (§5.5).
    paused: bool,
    /// A snapshot that passed [`vet`] from a node not yet known as its term's leader.
    held_snapshot: Option<Message>,
}

/// Election timeouts drawn from a seed: redrawn whenever raft may have reset its own
/// (a change of term, role or leader), and set again after every call into raft, so
/// raft's `thread_rng` draw is never the one an election waits for.
struct SeededElections {
    rng: SimRng,
    min_ticks: usize,
    seen: Option<(u64, StateRole, u64)>,
    drawn: usize,
}

impl Replica {
    /// Opens the node's log in `dir` (blocking: start-up) and starts as a follower.
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        config: ReplicaConfig,
        now_ms: u64,
    ) -> Result<(Replica, RaftJournalReport), ReplicaError> {
        Replica::open_with(storage, dir, config, ReplicaOptions::default(), now_ms)
    }

    /// [`Replica::open`] with `options`.
    pub fn open_with(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        config: ReplicaConfig,
        options: ReplicaOptions,
        now_ms: u64,
    ) -> Result<(Replica, RaftJournalReport), ReplicaError> {
        let voters = config.nodes.keys().copied().collect();
        let (store, report) =
            JournalStorage::open(storage, dir, config.journal_file_bytes, voters)?;
        // What the checkpoint covers is in the broker's synced state: apply goes on after.
        let applied = config.applied.max(report.checkpoint.index);
        let started_empty = store.journal().last_index() == 0 && store.hard_state().term == 0;
        let raft_config = raft::Config {
            id: config.id,
            election_tick: config.election_ticks,
            heartbeat_tick: config.heartbeat_ticks,
            applied,
            pre_vote: true,
            check_quorum: true,
            max_size_per_msg: MSG_BYTES_MAX,
            max_inflight_msgs: INFLIGHT_MSGS_MAX,
            max_committed_size_per_ready: COMMITTED_BYTES_PER_READY_MAX,
            max_uncommitted_size: options.uncommitted_bytes_max,
            ..raft::Config::default()
        };
        let raw = RawNode::new(&raft_config, store, &raft_logger()).map_err(ReplicaError::Raft)?;
        // Never less than two ticks short: with a long `--raft-tick` the follower's tick
        // phase alone would eat a 100 ms margin.
        let margin_ms = LEASE_MARGIN_MS.max(2 * options.tick_ms);
        let lease_ms = (config.election_ticks as u64 * options.tick_ms).saturating_sub(margin_ms);
        let elections = options.election_seed.map(|seed| SeededElections {
            rng: SimRng::new(seed),
            min_ticks: config.election_ticks,
            seen: None,
            drawn: config.election_ticks,
        });
        let mut replica = Replica {
            raw,
            nodes: config.nodes,
            replication_timeout_ms: config.replication_timeout_ms,
            journal_retain_bytes: config.journal_retain_bytes,
            election_ticks: config.election_ticks,
            ticks: 0,
            last_heard: HashMap::new(),
            persisting: VecDeque::new(),
            waiters: BTreeMap::new(),
            committed_seqs: HashMap::new(),
            applied,
            was_leader: false,
            leaderless_since_ms: Some(now_ms),
            effects: Vec::new(),
            lease_ms,
            lease_term: 0,
            lease_acks: HashMap::new(),
            held: VecDeque::new(),
            now_ms,
            pinged_term: 0,
            elections,
            started_empty,
            abstain_below: 0,
            paused: false,
            held_snapshot: None,
        };
        replica.seed_election_timeout();
        Ok((replica, report))
    }

    pub fn id(&self) -> u64 {
        self.raw.raft.id
    }

    pub fn is_leader(&self) -> bool {
        self.raw.raft.state == StateRole::Leader
    }

    /// Raft's role, as `/stats` names it.
    pub fn role(&self) -> &'static str {
        match self.raw.raft.state {
            StateRole::Leader => "leader",
            StateRole::Follower => "follower",
            StateRole::Candidate => "candidate",
            StateRole::PreCandidate => "pre-candidate",
        }
    }

    /// While this node leads: each other node's id and the last entry known to be in its
    /// log (raft's progress tracker); empty otherwise, where raft tracks nothing.
    pub fn match_indexes(&self) -> Vec<(u64, u64)> {
        if !self.is_leader() {
            return Vec::new();
        }
        let me = self.id();
        let mut out: Vec<(u64, u64)> = (self.raw.raft.prs().iter())
            .filter(|(id, _)| **id != me)
            .map(|(id, pr)| (*id, pr.matched))
            .collect();
        out.sort_unstable();
        out
    }

    /// Raft's view of every peer's progress, for a test's failure message.
    #[cfg(test)]
    pub fn progress_debug(&self) -> String {
        let prs = self.raw.raft.prs().iter();
        let all: Vec<String> = prs.map(|(id, pr)| format!("{id}: {pr:?}")).collect();
        all.join("; ")
    }

    /// While this node leads: the lowest match index over every voter, itself included
    /// (its own is what it persisted). No node needs an entry at or below it again, so a
    /// FLOOR entry carrying it lets every node compact up to it (§5.4). Once the journal
    /// holds more than `--journal-retain`, the commit index instead, which a majority
    /// holds: a voter still below it gets a snapshot (§5.5).
    pub fn compaction_floor(&self) -> Option<u64> {
        if !self.is_leader() {
            return None;
        }
        let lowest = self.raw.raft.prs().iter().map(|(_, pr)| pr.matched).min()?;
        if self.journal_bytes() > self.journal_retain_bytes {
            return Some(lowest.max(self.commit_index()));
        }
        Some(lowest)
    }

    /// The journal's checkpoint: the entries up to its index are applied and in synced
    /// segments, and no longer replayed at start-up.
    pub fn checkpoint(&self) -> Checkpoint2 {
        self.raw.store().journal().checkpoint()
    }

    /// Journal bytes written after the checkpoint: what the next one could release.
    pub fn journal_bytes_since_checkpoint(&self) -> u64 {
        let journal = self.raw.store().journal();
        journal.written_lsn() - journal.checkpoint().lsn
    }

    /// Entry bytes the journal's files still hold.
    pub fn journal_bytes(&self) -> u64 {
        self.raw.store().journal().held_bytes()
    }

    /// The first entry still in the journal.
    pub fn first_index(&self) -> u64 {
        self.raw.store().journal().first_index()
    }

    /// The journal's next file is due to be made ahead (`log/journal.rs`, spares).
    pub fn spare_due(&self) -> bool {
        self.raw.store().journal().spare_due()
    }

    /// The job making it, from `recycle` or zeros; `None` when one is ready.
    pub fn spare_job(&self, recycle: Option<std::path::PathBuf>) -> Option<SpareWrite> {
        self.raw.store().journal().spare_job(recycle)
    }

    pub fn spare_made(&mut self, result: &io::Result<()>) {
        self.raw.mut_store().spare_made(result);
    }

    /// The checkpoint write at applied entry `index` (blocking: the fsync pool runs it).
    pub fn checkpoint_job(&self, index: u64) -> Checkpoint2Write {
        self.raw.store().journal().checkpoint_job(index)
    }

    /// A checkpoint is durable: the journal files wholly below it, for the pool to
    /// remove. Raft asks the storage for entries below it no more: the FLOOR said
    /// nobody needs them.
    pub fn checkpoint_done(&mut self, point: Checkpoint2) -> Vec<std::path::PathBuf> {
        self.raw.mut_store().checkpoint_done(point)
    }

    /// The term of entry `index`, applied here (a snapshot's).
    pub fn term_of(&self, index: u64) -> u64 {
        self.raw
            .store()
            .journal()
            .term(index)
            .expect("an applied entry is held")
    }

    /// The leader this node knows of, if any.
    pub fn leader_id(&self) -> Option<u64> {
        Some(self.raw.raft.leader_id).filter(|&id| id != INVALID_ID)
    }

    /// Sets node `id`'s advertised client address, the `host:port` of NOT_LEADER's text:
    /// a peer's arrives in its HELLO (`docs/REPLICATION.md` §5.6).
    pub fn set_node_addr(&mut self, id: u64, addr: String) {
        if let Some(known) = self.nodes.get_mut(&id) {
            *known = addr;
        }
    }

    /// A message to `id` was dropped (link down, output full): raft stops pipelining
    /// appends to it and probes again.
    pub fn report_unreachable(&mut self, id: u64) {
        self.raw.report_unreachable(id);
    }

    /// Raft's term: the `leader_epoch` of what this node appends as leader.
    pub fn term(&self) -> u64 {
        self.raw.raft.term
    }

    /// Whom this node voted for in its term (0: no one).
    #[cfg(test)]
    pub fn vote(&self) -> u64 {
        self.raw.raft.vote
    }

    /// The last entry in this node's log, persisted or not.
    pub fn last_index(&self) -> u64 {
        self.raw.raft.raft_log.last_index()
    }

    /// The term of that entry.
    pub fn last_term(&self) -> u64 {
        self.raw.raft.raft_log.last_term()
    }

    pub fn commit_index(&self) -> u64 {
        self.raw.raft.raft_log.committed
    }

    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The partition's highest committed sequence applied here.
    pub fn commit_seq(&self, topic_id: u16, partition: u16) -> u64 {
        self.committed_seqs
            .get(&(topic_id, partition))
            .copied()
            .unwrap_or(0)
    }

    /// Starts an election now (tests steer which node leads; raft 0.7 draws timeouts
    /// from `thread_rng`).
    #[cfg(test)]
    pub(crate) fn campaign(&mut self) -> Result<(), ReplicaError> {
        self.raw.campaign().map_err(ReplicaError::Raft)
    }

    /// Keeps raft stopped in a process that only installs a snapshot: no tick, message
    /// or Ready reaches it, as after a snapshot arrived ([`Effect::Install`]).
    pub fn pause(&mut self) {
        self.paused = true;
    }

    /// The peers raft wants a snapshot for (`JournalStorage::snapshot`).
    pub fn take_wanted_snapshots(&self) -> std::collections::BTreeSet<u64> {
        self.raw.store().take_wanted_snapshots()
    }

    /// A snapshot for `to` at applied entry `index`, whose data is `manifest`.
    pub fn offer_snapshot(&mut self, to: u64, index: u64, manifest: Vec<u8>) {
        self.raw.mut_store().offer_snapshot(to, index, manifest);
    }

    /// Peer `id`'s link went down or came up again: a snapshot sent to it is not being
    /// installed by the process raft sent it to, so raft probes it afresh.
    pub fn report_snapshot_failure(&mut self, id: u64) {
        if self.paused || !self.is_leader() {
            return;
        }
        self.raw.report_snapshot(id, raft::SnapshotStatus::Failure);
    }

    /// One raft tick (the caller's `--raft-tick` timer).
    pub fn tick(&mut self) {
        if self.paused {
            return;
        }
        self.ticks += 1;
        self.raw.tick();
        self.seed_election_timeout();
    }

    /// Sets raft's election timeout from the seed, if there is one (see
    /// [`SeededElections`]). Raft checks the timeout only in `tick`, after this ran.
    fn seed_election_timeout(&mut self) {
        let Some(e) = &mut self.elections else {
            return;
        };
        let r = &mut self.raw.raft;
        let now = Some((r.term, r.state, r.leader_id));
        if e.seen != now {
            e.seen = now;
            // raft's range: [election_tick, 2 * election_tick).
            e.drawn = e.min_ticks + e.rng.below(e.min_ticks as u64) as usize;
        }
        r.set_randomized_election_timeout(e.drawn);
    }

    /// §7.3: whether this node leads and a majority, itself included, answered a
    /// heartbeat it sent within the lease (`--election-ticks` × `--raft-tick` less
    /// [`LEASE_MARGIN_MS`]). No other leader can have been elected meanwhile: each of
    /// them ignores votes for an election timeout after hearing from this one. The broker
    /// sends no OK (WRITTEN, FSYNC, DECLARE either) while this is false.
    pub fn lease_valid(&self, now_ms: u64) -> bool {
        if !self.is_leader() || self.lease_term != self.term() {
            return false;
        }
        let me = self.id();
        let recent = |id: &&u64| {
            **id == me
                || self
                    .lease_acks
                    .get(id)
                    .is_some_and(|&sent| now_ms.saturating_sub(sent) < self.lease_ms)
        };
        self.nodes.keys().filter(recent).count() > self.nodes.len() / 2
    }

    /// A follower's heartbeat response echoing this leader's stamp of the current term.
    fn note_lease_ack(&mut self, msg: &Message) {
        let term = self.term();
        if msg.get_msg_type() != MessageType::MsgHeartbeatResponse
            || msg.term != term
            || !self.is_leader()
        {
            return;
        }
        let Some((stamp_term, sent_ms)) = read_lease_stamp(&msg.context) else {
            return;
        };
        if stamp_term != term {
            return;
        }
        if self.lease_term != term {
            self.lease_term = term;
            self.lease_acks.clear();
        }
        let at = self.lease_acks.entry(msg.from).or_default();
        *at = (*at).max(sent_ms);
    }

    /// A message from a peer. An error is the peer's (a lie [`vet`] caught, an unknown
    /// sender, a local message type): the message is dropped, the node goes on.
    pub fn step(&mut self, msg: Message) -> Result<(), ReplicaError> {
        if self.paused {
            return Ok(());
        }
        match vet(&msg, &self.view()) {
            Verdict::Step => {}
            Verdict::Hold => {
                self.held_snapshot = Some(msg);
                return Ok(());
            }
            Verdict::Drop(lie, why) => return Err(ReplicaError::Refused { lie, why }),
        }
        self.step_vetted(msg)?;
        self.step_held_snapshot()
    }

    /// What [`vet`] reads of this node's raft state.
    fn view(&self) -> View<'_> {
        let r = &self.raw.raft;
        View {
            me: r.id,
            voters: &self.nodes,
            term: r.term,
            leader_id: r.leader_id,
            is_leader: self.is_leader(),
            committed: r.raft_log.committed,
            last_index: r.raft_log.last_index(),
            committed_term: r.raft_log.term(r.raft_log.committed).ok(),
            now_ms: self.now_ms,
        }
    }

    /// A held snapshot steps once its sender is known as the leader of its term, and is
    /// forgotten once that term passed or it no longer fits (raft's leader sends another).
    fn step_held_snapshot(&mut self) -> Result<(), ReplicaError> {
        let Some(held) = self.held_snapshot.take() else {
            return Ok(());
        };
        match vet(&held, &self.view()) {
            Verdict::Step => self.step_vetted(held),
            Verdict::Hold if held.term >= self.term() => {
                self.held_snapshot = Some(held);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn step_vetted(&mut self, msg: Message) -> Result<(), ReplicaError> {
        self.last_heard.insert(msg.from, self.ticks);
        self.note_lease_ack(&msg);
        if self.keeps_promise_of_a_past_life(&msg) || self.abstains(&msg) {
            return Ok(());
        }
        let mut msg = msg;
        let last_index = self.raw.raft.raft_log.last_index();
        if msg.get_msg_type() == MessageType::MsgHeartbeat && msg.commit > last_index {
            // The leader counts this node up to entries it lost (a data directory
            // replaced, §11); raft would panic. Nothing new is committed here until the
            // leader, told by this node's HELLO, replicates from its log's real end.
            msg.commit = self.raw.raft.raft_log.committed;
        }
        let stepped = self.raw.step(msg).map_err(ReplicaError::Raft);
        self.seed_election_timeout();
        stepped
    }

    /// §7.3 after a restart: before it went down this node may have answered a leader's
    /// heartbeat, which promised that leader no vote for an election timeout; the
    /// promise is not on disk, so for its first election timeout a node ignores vote
    /// requests of a newer term, as raft's check-quorum does while it hears a leader.
    fn keeps_promise_of_a_past_life(&self, msg: &Message) -> bool {
        is_vote_request(msg) && msg.term > self.term() && self.ticks < self.election_ticks as u64
    }

    /// Peer `id`'s HELLO says its log ends at `last_index`. A node that started empty
    /// while a peer holds entries lost its data directory (or joins a cluster that has
    /// a log): before, it may have voted in a term it no longer knows, so it votes in no
    /// election until its log has caught up with what that peer held (§11).
    pub fn peer_log(&mut self, id: u64, last_index: u64) {
        self.probe_from_peer_log(id, last_index);
        self.abstention_over();
        if !self.started_empty || last_index <= self.raw.raft.raft_log.last_index() {
            return;
        }
        if self.abstain_below == 0 {
            log::warn!(
                "started with an empty raft log while node {id} holds entries up to \
                 {last_index}: this node votes in no election until its log reaches that \
                 index (a lost data directory must not vote twice in a term)"
            );
        }
        self.abstain_below = self.abstain_below.max(last_index);
    }

    /// A leader learns from peer `id`'s HELLO where its log ends (a link came up: the
    /// peer may have restarted). Raft's progress may say otherwise:
    /// - a match past that end: the peer lost entries it had acknowledged (its data
    ///   directory was replaced). Raft would read its rejections as stale and keep
    ///   sending from there, and its heartbeats would name a commit index past the
    ///   peer's log; the match goes back to the log's end.
    /// - a probe from below that end (after a lost match, or a restart out of an
    ///   INSTALL, whose log starts at the snapshot): the entries it would send first may
    ///   be compacted, and raft would send a snapshot the peer does not need.
    ///
    /// So the next probe starts at the log's end; a peer whose log differs there rejects
    /// it and raft walks back as usual, to a snapshot only when it must (§5.5).
    fn probe_from_peer_log(&mut self, id: u64, last_index: u64) {
        if !self.is_leader() || self.paused {
            return;
        }
        let leader_last = self.raw.raft.raft_log.last_index();
        let Some(pr) = self.raw.raft.mut_prs().get_mut(id) else {
            return;
        };
        if pr.matched > last_index {
            log::warn!(
                "node {id} lost entries {}..={} it had acknowledged (a data directory \
                 replaced?): replicating to it from its log's end",
                last_index + 1,
                pr.matched
            );
            pr.matched = last_index;
        }
        if pr.state != raft::ProgressState::Snapshot {
            pr.become_probe();
            pr.next_idx = (last_index + 1).clamp(pr.matched + 1, leader_last + 1);
        }
    }

    /// §11: a node that started empty votes in no election until its log reached what
    /// a peer said it held; then the abstention ends for good, so that a later HELLO
    /// (a lagging peer's, a stale one) cannot start it again.
    fn abstains(&mut self, msg: &Message) -> bool {
        is_vote_request(msg) && !self.abstention_over()
    }

    /// Whether no abstention holds, ending one whose index the log reached.
    fn abstention_over(&mut self) -> bool {
        if self.abstain_below == 0 {
            return true;
        }
        if self.raw.raft.raft_log.last_index() < self.abstain_below {
            return false;
        }
        log::info!(
            "the raft log reached index {}: this node votes again",
            self.abstain_below
        );
        (self.started_empty, self.abstain_below) = (false, 0);
        true
    }

    /// The role gate of §7.1 for requests that change or read broker state.
    pub fn admit(&self, now_ms: u64) -> Result<(), Refusal> {
        if self.is_leader() {
            return Ok(());
        }
        if let Some(id) = self.leader_id() {
            let addr = self.nodes.get(&id).map_or("", String::as_str);
            return Err(Refusal {
                code: ErrorCode::NotLeader,
                text: format!("leader {id} {addr}"),
            });
        }
        let leaderless_ms = self
            .leaderless_since_ms
            .map_or(0, |since| now_ms.saturating_sub(since));
        let (code, text) = if leaderless_ms >= self.replication_timeout_ms {
            let text = format!("no leader for {leaderless_ms} ms");
            (ErrorCode::ElectionTimeout, text)
        } else {
            (ErrorCode::LeaderUnknown, "no leader known".to_string())
        };
        Err(Refusal { code, text })
    }

    /// 0x6004 NOT_ENOUGH_REPLICAS (§7.1), for a leader to ask before it takes a
    /// REPLICATED PUB or a DECLARE into a proposal: fewer than a majority, itself
    /// included, heard from within an election timeout, so nothing is written.
    pub fn check_replicas(&self) -> Result<(), Refusal> {
        let me = self.id();
        let recent = |id: &&u64| {
            **id == me
                || self
                    .last_heard
                    .get(id)
                    .is_some_and(|&at| self.ticks - at < self.election_ticks as u64)
        };
        let heard = self.nodes.keys().filter(recent).count();
        if heard > self.nodes.len() / 2 {
            return Ok(());
        }
        Err(Refusal {
            code: ErrorCode::NotEnoughReplicas,
            text: format!("{heard} of {} nodes reachable", self.nodes.len()),
        })
    }

    /// Proposes `entry`; `waiters` are answered once it commits (or fails). Returns the
    /// entry's index. The caller ran [`Replica::admit`] first in this pass.
    pub fn propose(
        &mut self,
        entry: &EntryData,
        waiters: Vec<Waiter>,
        now_ms: u64,
    ) -> Result<u64, Refusal> {
        self.admit(now_ms)?;
        if let Err(e) = self.raw.propose(Vec::new(), entry.encode()) {
            // ProposalDropped: past UNCOMMITTED_BYTES_MAX (a leader transfer would drop
            // too, but membership is static and no transfer is ever started).
            return Err(Refusal {
                code: ErrorCode::Backpressure,
                text: format!("replication backlog full ({e})"),
            });
        }
        let index = self.raw.raft.raft_log.last_index();
        let term = self.raw.raft.term;
        let list = self.waiters.entry(index).or_default();
        let pending = |waiter| Pending {
            term,
            since_ms: now_ms,
            waiter,
        };
        list.extend(waiters.into_iter().map(pending));
        Ok(index)
    }

    /// A persist job finished. An error is sticky (the journal is poisoned): the node
    /// must stop, as a single node does when its journal fdatasync fails.
    pub fn persist_done(
        &mut self,
        job: &PersistJob,
        result: io::Result<()>,
    ) -> Result<(), ReplicaError> {
        let store = self.raw.mut_store();
        if let Err(e) = result {
            store.sync_failed(&e);
            return Err(ReplicaError::Storage(StorageError::from_io(
                store.journal().dir(),
                None,
                e,
            )));
        }
        if let Some(sync) = &job.sync {
            store.sync_done(sync.job);
        }
        for p in self.persisting.iter_mut() {
            if job.readies.contains(&p.ready) {
                p.done = true;
            }
        }
        Ok(())
    }

    /// The end of a pass: every Ready raft has, then what became persisted. Returns the
    /// effects of everything since the previous poll.
    pub fn poll(&mut self, now_ms: u64) -> Result<Vec<Effect>, ReplicaError> {
        self.now_ms = now_ms;
        while !self.paused {
            self.release_persisted();
            self.persist_job(None)?;
            if self.is_leader() && self.pinged_term != self.term() {
                // A new leader's lease starts with a heartbeat round now, not after
                // `--heartbeat-ticks`: its first OKs wait one round trip, not a tick.
                self.pinged_term = self.term();
                self.raw.ping();
            }
            if !self.raw.has_ready() {
                break;
            }
            let rd = self.raw.ready();
            self.handle_ready(rd)?;
        }
        self.seed_election_timeout();
        self.note_role(now_ms);
        if self.lease_valid(now_ms) {
            for (p, ok) in std::mem::take(&mut self.held) {
                let (waiter, result) = (p.waiter, Ok(ok));
                self.effects.push(Effect::Answer { waiter, result });
            }
        }
        self.expire_waiters(now_ms);
        Ok(std::mem::take(&mut self.effects))
    }

    /// 0x6006 for waiters older than `--replication-timeout`: the outcome is unknown, the
    /// entry stays and may still commit (an idempotent producer resends, §7.2).
    fn expire_waiters(&mut self, now_ms: u64) {
        let timeout = self.replication_timeout_ms;
        let expired = |p: &Pending| now_ms.saturating_sub(p.since_ms) >= timeout;
        while let Some(first) = self.waiters.first_entry() {
            if !first.get().iter().any(expired) {
                break;
            }
            for Pending { waiter, .. } in first.remove() {
                let result = Err(ErrorCode::ReplicationTimeout);
                self.effects.push(Effect::Answer { waiter, result });
            }
        }
        // Committed, but the lease stayed out for as long: the client resends (§7.2) and
        // the duplicate is answered with the original sequence.
        while self.held.front().is_some_and(|(p, _)| expired(p)) {
            let (Pending { waiter, .. }, _) = self.held.pop_front().expect("checked");
            let result = Err(ErrorCode::ReplicationTimeout);
            self.effects.push(Effect::Answer { waiter, result });
        }
    }

    /// A Ready with a snapshot is neither advanced nor persisted: the process restarts
    /// into the install, which writes the log's new start itself (§5.5).
    fn stop_at_snapshot(&mut self, rd: &Ready) -> bool {
        if rd.snapshot().is_empty() {
            return false;
        }
        let hs = self.raw.raft.hard_state();
        self.effects.push(Effect::Install {
            data: rd.snapshot().data.to_vec(),
            hard_state: (hs.term, hs.vote),
        });
        self.paused = true;
        true
    }

    fn handle_ready(&mut self, mut rd: Ready) -> Result<(), ReplicaError> {
        if self.stop_at_snapshot(&rd) {
            return Ok(());
        }
        let stamp = lease_stamp(self.term(), self.now_ms);
        for mut m in rd.take_messages() {
            // Raft sends an empty context unless a ReadIndex is pending, and we issue none.
            if m.get_msg_type() == MessageType::MsgHeartbeat && m.context.is_empty() {
                m.context = stamp.clone().into();
            }
            self.effects.push(Effect::Send(m));
        }
        self.fail_replaced(rd.entries());
        let store = self.raw.mut_store();
        store.append(rd.entries())?;
        let hard_state = match rd.hs() {
            Some(hs)
                if hs.term != store.hard_state().term || hs.vote != store.hard_state().vote =>
            {
                Some(store.hard_state_job(hs))
            }
            Some(hs) => {
                store.set_commit(hs.commit);
                None
            }
            None => None,
        };
        let ready = rd.number();
        let wants_sync = !rd.entries().is_empty();
        let mut messages = rd.take_persisted_messages();
        if cfg!(feature = "sim-bug-ack-before-follower-fsync") {
            // The hole the replica simulator must find: acknowledged before the fsync.
            self.effects.extend(messages.drain(..).map(Effect::Send));
        }
        self.persisting.push_back(Persisting {
            ready,
            wants_sync,
            done: !wants_sync && hard_state.is_none(),
            messages,
        });
        self.persist_job(hard_state.map(|hs| (ready, hs)))?;
        let committed = rd.take_committed_entries();
        self.raw.advance_append_async(rd);
        self.apply(committed)?;
        self.raw.advance_apply_to(self.applied);
        Ok(())
    }

    /// Readies whose entries wait for a sync get one, once fewer than
    /// `RAFT_SYNCS_IN_FLIGHT_MAX` run: it covers every entry written by now. A new term or
    /// vote (`hard_state`, of Ready number `ready`) is written at once, with a sync of
    /// whatever waits, so that the next sync never finds nothing to do for a Ready.
    fn persist_job(
        &mut self,
        hard_state: Option<(u64, HardStateWrite)>,
    ) -> Result<(), ReplicaError> {
        let store = self.raw.mut_store();
        let waiting = self.persisting.iter().any(|p| p.wants_sync);
        let sync_now = waiting
            && (hard_state.is_some()
                || store.journal().syncs_in_flight() < RAFT_SYNCS_IN_FLIGHT_MAX);
        if !sync_now && hard_state.is_none() {
            return Ok(());
        }
        let (mut readies, mut sync) = (Vec::new(), None);
        if sync_now {
            sync = Some(take_sync_job(store)?);
            for p in self.persisting.iter_mut().filter(|p| p.wants_sync) {
                p.wants_sync = false;
                readies.push(p.ready);
            }
        }
        let hard_state = hard_state.map(|(ready, hs)| {
            if !readies.contains(&ready) {
                readies.push(ready);
            }
            hs
        });
        self.effects.push(Effect::Persist(PersistJob {
            readies,
            sync,
            hard_state,
        }));
        Ok(())
    }

    /// Tells raft about the persisted prefix of Readies and sends what waited for it.
    fn release_persisted(&mut self) {
        let mut last = None;
        while self.persisting.front().is_some_and(|p| p.done) {
            let p = self.persisting.pop_front().expect("checked");
            last = Some(p.ready);
            self.effects
                .extend(p.messages.into_iter().map(Effect::Send));
        }
        if let Some(ready) = last {
            self.raw.on_persist_ready(ready);
        }
    }

    fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        for e in entries {
            self.applied = e.index;
            // Static membership: no configuration change is ever proposed.
            if e.get_entry_type() != EntryType::EntryNormal {
                continue;
            }
            let entry = EntryData::decode(&e.data).map_err(|error| ReplicaError::Entry {
                index: e.index,
                error,
            })?;
            if let EntryData::Batch(batch) = &entry {
                for p in &batch.parts {
                    let seq = self
                        .committed_seqs
                        .entry((p.topic_id, p.partition))
                        .or_default();
                    *seq = (*seq).max(p.last_sequence());
                }
            }
            if entry != EntryData::Noop {
                self.effects.push(Effect::Apply {
                    index: e.index,
                    term: e.term,
                    entry,
                });
            }
            self.answer_committed(e.index, e.term);
        }
        Ok(())
    }

    /// Entry `index` of term `term` committed: its waiters get OK, unless they wait for
    /// another entry that once had this index (replaced, so LOG_TRUNCATED).
    fn answer_committed(&mut self, index: u64, term: u64) {
        while let Some(first) = self.waiters.first_entry() {
            if *first.key() > index {
                break;
            }
            let (at, list) = first.remove_entry();
            for Pending {
                term: t,
                since_ms,
                waiter,
            } in list
            {
                let pending = Pending {
                    term: t,
                    since_ms,
                    waiter,
                };
                if at == index && t == term {
                    let ok = Replicated {
                        index,
                        leader_epoch: term,
                        commit_seq: waiter.part.map_or(0, |(t, p)| self.commit_seq(t, p)),
                    };
                    // Answered at the end of the pass if the lease holds (§7.3).
                    self.held.push_back((pending, ok));
                } else {
                    let result = Err(ErrorCode::LogTruncated);
                    self.effects.push(Effect::Answer { waiter, result });
                }
            }
        }
    }

    /// A Ready's entries replace this node's from their first index on: waiters for an
    /// entry not among them with the same term lost it (§7.1, 0x6008).
    fn fail_replaced(&mut self, entries: &[Entry]) {
        let Some(first) = entries.first().map(|e| e.index) else {
            return;
        };
        let kept = |at: u64, term: u64| {
            entries
                .get((at - first) as usize)
                .is_some_and(|e| e.term == term)
        };
        let indexes: Vec<u64> = self.waiters.range(first..).map(|(&i, _)| i).collect();
        for at in indexes {
            let list = self.waiters.remove(&at).expect("listed");
            let (keep, lost): (Vec<_>, Vec<_>) = list.into_iter().partition(|p| kept(at, p.term));
            for Pending { waiter, .. } in lost {
                let result = Err(ErrorCode::LogTruncated);
                self.effects.push(Effect::Answer { waiter, result });
            }
            if !keep.is_empty() {
                self.waiters.insert(at, keep);
            }
        }
    }

    /// Every waiter, held OKs too: their entries may have committed, but this node can
    /// no longer tell that no later leader answered first (§7.3). For a node that
    /// stopped leading, and for one whose journal failed (it stops taking part).
    pub fn take_waiters(&mut self) -> Vec<Waiter> {
        let held = std::mem::take(&mut self.held).into_iter().map(|(p, _)| p);
        let waiting = std::mem::take(&mut self.waiters).into_values().flatten();
        held.chain(waiting).map(|p| p.waiter).collect()
    }

    /// After the pass's Readies: a node that stopped leading fails the waiters whose
    /// entries it still holds (0x6005: they may yet commit), and the gate's leaderless
    /// clock starts or stops.
    fn note_role(&mut self, now_ms: u64) {
        let leader = self.is_leader();
        if self.was_leader && !leader {
            for waiter in self.take_waiters() {
                let result = Err(ErrorCode::NotEnoughReplicasAfterAppend);
                self.effects.push(Effect::Answer { waiter, result });
            }
        }
        self.was_leader = leader;
        match self.leader_id() {
            Some(_) => self.leaderless_since_ms = None,
            None => {
                self.leaderless_since_ms.get_or_insert(now_ms);
            }
        }
    }
}

/// A vote or pre-vote request: what the two vote holds of `Replica::step` drop.
fn is_vote_request(msg: &Message) -> bool {
    matches!(
        msg.get_msg_type(),
        MessageType::MsgRequestVote | MessageType::MsgRequestPreVote
    )
}

pub(super) fn lease_stamp(term: u64, now_ms: u64) -> Vec<u8> {
    let mut stamp = Vec::with_capacity(LEASE_STAMP_BYTES);
    stamp.extend_from_slice(LEASE_STAMP_TAG);
    stamp.extend_from_slice(&term.to_be_bytes());
    stamp.extend_from_slice(&now_ms.to_be_bytes());
    stamp
}

/// `(term, sent_ms)` of a stamp this node's kind wrote; anything else is not one.
pub(super) fn read_lease_stamp(context: &[u8]) -> Option<(u64, u64)> {
    if context.len() != LEASE_STAMP_BYTES || !context.starts_with(LEASE_STAMP_TAG) {
        return None;
    }
    let word = |at: usize| u64::from_be_bytes(context[at..at + 8].try_into().expect("8 bytes"));
    Some((word(4), word(12)))
}
