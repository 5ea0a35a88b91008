//! Journal format 2: the node-wide journal of a cluster data directory, which is also the
//! raft log (`docs/REPLICATION.md` §3.2). Format 1 (`journal.rs`) stays the single-node
//! journal, byte for byte. Both keep their files through `journal_files.rs` (naming, the
//! file header with the format version its caller gives, replay file by file, writing,
//! syncing) and frame entries the same way (length, CRC, LSN); what follows the LSN in an
//! entry, when one counts, the checkpoint and truncation are this file's alone, so that a
//! change to one format's entries cannot move the other's bytes.
//!
//! An entry carries raft's coordinates (index, term) where format 1 carries a partition's,
//! and the data is raft's `Entry.data`, opaque here. Besides appending, this journal can
//! cut itself back ([`RaftJournal::truncate_from`]): raft replaces a follower's
//! uncommitted entries that conflict with a new leader's. Depends on std, log, the
//! journal files (`journal_files.rs`) and the storage seam, like the rest of `log`.
//!
//! # Files: `<first_lsn:020>.jnl` and `checkpoint` in the journal directory
//!
//! LSNs count entry bytes, as in format 1: a file named `f` holds the entry at LSN `l` at
//! byte `16 + l - f`.
//!
//! ```text
//! file header
//! offset  width  field              meaning
//! 0       4      magic "MMQJ"
//! 4       2      format_version u16 2
//! 6       2      reserved u16       0
//! 8       8      first_lsn u64      equals the number in the file name
//!
//! entry (all integers big-endian)
//! 0       4      length u32         bytes of the whole entry, header included
//! 4       4      crc u32            crc32 (crc32fast) of bytes [8, length)
//! 8       8      lsn u64            where the entry is in the stream
//! 16      8      term u64           raft term: the leader_epoch of its records
//! 24      8      index u64          raft index: the previous entry's + 1
//! 32      8      prev_term u64      the term of the entry at index - 1
//! 40      8      commit u64         the writer's commit index when written
//! 48      ...    data               raft's Entry.data, byte for byte
//! ```
//!
//! An entry counts when its CRC checks, its LSN is the one expected there, its index is
//! the previous entry's + 1, its `prev_term` is the previous entry's term, and its term
//! is not below that. The `prev_term` check is what makes cutting back safe: after
//! [`truncate_from`](RaftJournal::truncate_from) a power cut may keep the new entries but
//! lose the cut, leaving old entries right behind them, possibly at the very LSN and
//! index expected next. Raft gives one index and term one entry, so an old entry that
//! follows a replacement of a different term names the wrong `prev_term`, and one that
//! follows an entry of the same term followed that same entry: it is still the log.
//! (The term check alone would not do: a new leader may replace an entry with an older
//! term's.) The journal ends at the first entry that does not count, unless a file named
//! with the LSN expected next exists.
//!
//! `checkpoint` (a meta file) holds `lsn u64, index u64, term u64`: the entries below
//! `lsn` are applied and in synced segments; `(index, term)` is the last of them, which
//! raft asks for as the term of the entry before the first one kept.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::StorageError;
use super::journal::{SpareWrite, Spares};
use super::journal_files::{self, EntryBounds, FilesSync, JournalFiles};
use super::journal_files::{CHECKPOINT_FILE, FILE_HEADER_BYTES};
use super::meta;
use super::storage::{self, Storage};

/// The `format_version` of a format 2 file.
pub const JOURNAL2_FORMAT_VERSION: u16 = 2;
pub const JOURNAL2_FILE_HEADER_BYTES: usize = FILE_HEADER_BYTES;
pub const JOURNAL2_ENTRY_HEADER_BYTES: usize = 48;
/// The largest entry a reader accepts before allocating for it. A pass's proposal is
/// bounded by the 64 MiB of unsynced bytes the broker allows, far below it.
pub const JOURNAL2_ENTRY_BYTES_MAX: usize = 1024 * 1024 * 1024;
/// Bytes of the checkpoint's payload: lsn, index, term.
const CHECKPOINT2_BYTES: usize = 24;
const ENTRY_BOUNDS: EntryBounds =
    EntryBounds::new(JOURNAL2_ENTRY_HEADER_BYTES, JOURNAL2_ENTRY_BYTES_MAX);

/// One format 2 entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftEntry<'a> {
    pub lsn: u64,
    pub term: u64,
    pub index: u64,
    pub prev_term: u64,
    pub commit: u64,
    pub data: &'a [u8],
}

/// Where replay starts and what the entry before it was: the checkpoint's `(index,
/// term)`, or `(0, 0)` in a journal that was never checkpointed (raft's log starts at 1).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checkpoint2 {
    pub lsn: u64,
    pub index: u64,
    pub term: u64,
}

impl RaftEntry<'_> {
    pub fn encoded_len(&self) -> usize {
        JOURNAL2_ENTRY_HEADER_BYTES + self.data.len()
    }

    fn encode(&self, buf: &mut Vec<u8>) {
        let start = journal_files::begin_entry(buf, self.encoded_len(), self.lsn);
        for v in [self.term, self.index, self.prev_term, self.commit] {
            buf.extend_from_slice(&v.to_be_bytes());
        }
        buf.extend_from_slice(self.data);
        journal_files::seal_entry(buf, start);
    }

    /// The entry `bytes` holds (exactly one, header included), if it counts at `lsn`
    /// after `prev`; `prev` is `None` for the first entry of a journal replayed without a
    /// checkpoint, which has nothing to follow.
    fn decode(bytes: &[u8], lsn: u64, prev: Option<(u64, u64)>) -> Result<RaftEntry<'_>, String> {
        journal_files::check_entry(bytes, ENTRY_BOUNDS, lsn)?;
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8"));
        let e = RaftEntry {
            lsn: u64_at(8),
            term: u64_at(16),
            index: u64_at(24),
            prev_term: u64_at(32),
            commit: u64_at(40),
            data: &bytes[JOURNAL2_ENTRY_HEADER_BYTES..],
        };
        if let Some((index, term)) = prev {
            if e.index != index + 1 || e.prev_term != term {
                return Err(format!(
                    "index {} after term {} where {} after term {term} was expected",
                    e.index,
                    e.prev_term,
                    index + 1
                ));
            }
        }
        if e.term < e.prev_term || e.index == 0 {
            return Err(format!("term {} after term {}", e.term, e.prev_term));
        }
        Ok(e)
    }
}

/// One fdatasync of everything the journal wrote before the job was taken.
#[derive(Debug)]
pub struct RaftJournalSync {
    sync: FilesSync,
    /// Numbers the job for [`RaftJournal::sync_done`].
    pub job: u64,
}

impl RaftJournalSync {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        self.sync.run()
    }
}

/// Writing a checkpoint: once the segments holding every entry up to `point.index` are
/// synced.
#[derive(Debug)]
pub struct Checkpoint2Write {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    pub point: Checkpoint2,
}

impl Checkpoint2Write {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        let p = self.point;
        let mut bytes = Vec::with_capacity(CHECKPOINT2_BYTES);
        for v in [p.lsn, p.index, p.term] {
            bytes.extend_from_slice(&v.to_be_bytes());
        }
        meta::write_atomic(&*self.storage, &self.path, &bytes)
    }
}

/// Makes `dir` a journal that starts after entry `index` of `term`: the checkpoint
/// `(0, index, term)` written, every other file removed (an INSTALL's end: the segments
/// hold everything up to `index`, `broker::replica::install`). Blocking: fsync worker or
/// start-up.
pub fn reset_to(storage: &dyn Storage, dir: &Path, index: u64, term: u64) -> io::Result<()> {
    storage.create_dir_all(dir)?;
    let point = Checkpoint2 {
        lsn: 0,
        index,
        term,
    };
    let mut bytes = Vec::with_capacity(CHECKPOINT2_BYTES);
    for v in [point.lsn, point.index, point.term] {
        bytes.extend_from_slice(&v.to_be_bytes());
    }
    meta::write_atomic(storage, &dir.join(CHECKPOINT_FILE), &bytes)?;
    for name in storage.list_dir(dir)? {
        if name != CHECKPOINT_FILE {
            storage.remove_file(&dir.join(name))?;
        }
    }
    storage.sync_dir(dir)
}

/// What [`RaftJournal::open`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct RaftJournalReport {
    pub checkpoint: Checkpoint2,
    pub entries_replayed: u64,
    pub end_lsn: u64,
    /// The highest `commit` field replayed: entries up to it may be applied at start.
    pub commit: u64,
    /// Why the journal ended where it did, when not at the end of its last file.
    pub ended_by: Option<String>,
    /// Files past the end and files wholly below the checkpoint, deleted.
    pub files_removed: u32,
}

/// Which entries the journal holds: the LSN of each from `first_index` on, the terms as
/// runs, and the entry before the first (the checkpoint's, or what compaction let go).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct IndexTable {
    /// `(index, term)` of the entry before `first_index`.
    before: (u64, u64),
    /// LSN of entry `before.0 + 1 + i`.
    lsns: VecDeque<u64>,
    /// `(first index, term)` of each run of one term, ascending, covering `lsns`.
    terms: Vec<(u64, u64)>,
}

impl IndexTable {
    fn first_index(&self) -> u64 {
        self.before.0 + 1
    }

    fn last_index(&self) -> u64 {
        self.before.0 + self.lsns.len() as u64
    }

    fn term(&self, index: u64) -> Option<u64> {
        if index == self.before.0 {
            return Some(self.before.1);
        }
        if index < self.first_index() || index > self.last_index() {
            return None;
        }
        let run = self.terms.partition_point(|&(first, _)| first <= index);
        Some(self.terms[run - 1].1)
    }

    fn last_term(&self) -> u64 {
        self.terms.last().map_or(self.before.1, |r| r.1)
    }

    fn push(&mut self, index: u64, term: u64, lsn: u64) {
        debug_assert_eq!(index, self.last_index() + 1);
        if self.terms.last().is_none_or(|r| r.1 != term) {
            self.terms.push((index, term));
        }
        self.lsns.push_back(lsn);
    }

    /// Forgets `index` and every later entry.
    fn cut(&mut self, index: u64) {
        self.lsns.truncate((index - self.first_index()) as usize);
        while self.terms.last().is_some_and(|r| r.0 >= index) {
            self.terms.pop();
        }
    }

    /// Forgets every entry below LSN `lsn` (files a checkpoint let go).
    fn compact_below(&mut self, lsn: u64) {
        while self.lsns.front().is_some_and(|&l| l < lsn) {
            let index = self.first_index();
            let term = self.term(index).expect("held");
            self.lsns.pop_front();
            self.before = (index, term);
            let second = self.terms.get(1).map(|r| r.0);
            if second == Some(index + 1) || self.lsns.is_empty() {
                self.terms.remove(0);
            } else if let Some(first) = self.terms.first_mut() {
                first.0 = index + 1;
            }
        }
    }
}

/// The format 2 journal of a cluster data directory. Single-threaded, like format 1:
/// owned by the reactor; only [`RaftJournalSync`] and [`Checkpoint2Write`] cross to the
/// fsync workers.
pub struct RaftJournal {
    file_bytes: u64,
    files: JournalFiles,
    table: IndexTable,
    /// Entries appended and not yet written, and each one's length.
    buf: Vec<u8>,
    entry_lens: Vec<usize>,
    /// `(index, term)` of the last entry appended, written or not.
    queued_last: (u64, u64),
    written_lsn: u64,
    synced_lsn: u64,
    /// Sync jobs taken and not reported: number, LSN covered, done. A cut lowers the LSN
    /// of jobs in flight: bytes written after it are not theirs to cover.
    syncs_in_flight: VecDeque<(u64, u64, bool)>,
    next_job: u64,
    checkpoint: Checkpoint2,
    /// Files made ahead, as format 1 makes them (`log/journal.rs`): an append inside
    /// allocated blocks leaves fdatasync no size change to commit.
    spares: Spares,
    poisoned: Option<String>,
}

impl RaftJournal {
    /// Opens the journal in `dir` (making it if missing), calls `replay` for every entry
    /// from the checkpoint to the end, deletes what lies past the end, and leaves the
    /// writer there. Blocking: start-up only.
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        file_bytes: u64,
        mut replay: impl FnMut(&RaftEntry<'_>),
    ) -> Result<(RaftJournal, RaftJournalReport), StorageError> {
        let mut j = RaftJournal {
            file_bytes,
            files: JournalFiles::new(storage, dir, JOURNAL2_FORMAT_VERSION, ENTRY_BOUNDS),
            table: IndexTable::default(),
            buf: Vec::new(),
            entry_lens: Vec::new(),
            queued_last: (0, 0),
            written_lsn: 0,
            synced_lsn: 0,
            syncs_in_flight: VecDeque::new(),
            next_job: 0,
            checkpoint: Checkpoint2::default(),
            spares: Spares::default(),
            poisoned: None,
        };
        j.files.create_dir()?;
        j.spares.found(&j.files);
        let checkpoint = j.files.read_checkpoint(&[CHECKPOINT2_BYTES]).map(|b| {
            let at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8"));
            Checkpoint2 {
                lsn: at(0),
                index: at(8),
                term: at(16),
            }
        });
        let report = j.replay_from(checkpoint, &mut replay)?;
        j.spares.replayed(&j.files);
        Ok((j, report))
    }

    /// Finds the files, replays from the checkpoint, cuts what is past the end.
    fn replay_from(
        &mut self,
        checkpoint: Option<Checkpoint2>,
        replay: &mut dyn FnMut(&RaftEntry<'_>),
    ) -> Result<RaftJournalReport, StorageError> {
        let mut prev = checkpoint.map(|c| (c.index, c.term));
        if let Some(c) = checkpoint {
            self.table.before = (c.index, c.term);
            self.checkpoint = c;
        }
        let mut report = RaftJournalReport::default();
        let table = &mut self.table;
        let found = self
            .files
            .replay(checkpoint.map(|c| c.lsn), &mut |bytes, lsn| {
                let e = RaftEntry::decode(bytes, lsn, prev)?;
                if prev.is_none() {
                    table.before = (e.index - 1, e.prev_term);
                }
                table.push(e.index, e.term, e.lsn);
                replay(&e);
                report.entries_replayed += 1;
                report.commit = report.commit.max(e.commit);
                prev = Some((e.index, e.term));
                Ok(())
            })?;
        let lsn = found.end_lsn;
        self.written_lsn = lsn;
        self.synced_lsn = lsn;
        self.checkpoint.lsn = self.checkpoint.lsn.min(lsn);
        self.queued_last = (self.table.last_index(), self.table.last_term());
        report.checkpoint = self.checkpoint;
        report.end_lsn = lsn;
        report.ended_by = found.ended_by;
        report.files_removed = found.files_removed;
        Ok(report)
    }
}

impl RaftJournal {
    pub fn dir(&self) -> &Path {
        &self.files.dir
    }

    /// Queues raft entry `index` (the one after the last appended) of `term`;
    /// [`write`](Self::write) writes what was queued. `commit` is the writer's commit
    /// index now.
    pub fn append(&mut self, term: u64, index: u64, commit: u64, data: &[u8]) {
        let (last_index, last_term) = self.queued_last;
        assert_eq!(
            index,
            last_index + 1,
            "raft entries are appended in index order"
        );
        assert!(term >= last_term, "a term never goes down in a log");
        let entry = RaftEntry {
            lsn: self.written_lsn + self.buf.len() as u64,
            term,
            index,
            prev_term: last_term,
            commit,
            data,
        };
        let before = self.buf.len();
        entry.encode(&mut self.buf);
        self.entry_lens.push(self.buf.len() - before);
        self.table.push(index, term, entry.lsn);
        self.queued_last = (index, term);
    }

    /// Writes the queued entries: one write per file touched, starting a new file when
    /// the next entry would pass the file size. A failure poisons the journal.
    pub fn write(&mut self) -> Result<(), StorageError> {
        journal_files::refuse_if_poisoned(&self.poisoned, &self.files.dir)?;
        if self.buf.is_empty() {
            return Ok(());
        }
        let result = self.write_entries();
        self.buf.clear();
        self.entry_lens.clear();
        self.poison_on(&result, "journal write failed");
        result
    }

    fn poison_on(&mut self, result: &Result<(), StorageError>, what: &str) {
        journal_files::poison_on(&mut self.poisoned, &self.files.dir, result, what);
    }

    fn write_entries(&mut self) -> Result<(), StorageError> {
        let entries = (&self.buf[..], &self.entry_lens[..]);
        let (files, lsn) = (&mut self.files, &mut self.written_lsn);
        self.spares
            .write_entries(files, entries, self.file_bytes, lsn)
    }

    /// Whether to make the next spare file now (`log/journal.rs`, `Journal::spare_due`).
    pub fn spare_due(&self) -> bool {
        self.poisoned.is_none() && self.spares.due(&self.files, self.file_bytes)
    }

    /// The job that makes the next spare, from `recycle` (a file a checkpoint let go) or
    /// filled with zeros; `None` when one is ready.
    pub fn spare_job(&self, recycle: Option<PathBuf>) -> Option<SpareWrite> {
        self.spares.job(&self.files, self.file_bytes, recycle)
    }

    /// A spare job finished.
    pub fn spare_made(&mut self, result: &io::Result<()>) {
        self.spares.made(&self.files, result);
    }

    /// Cuts the journal back so that `index` is the next entry appended: raft replaces
    /// a follower's uncommitted entries from `index` on with a new leader's. Queued
    /// entries are written first. Files past the cut are deleted and the file holding it
    /// is shortened; the next sync job makes both durable. Until then a power cut may
    /// bring old entries back behind new ones: replay's `prev_term` check ends the
    /// journal there (module doc).
    pub fn truncate_from(&mut self, index: u64) -> Result<(), StorageError> {
        self.write()?;
        let last = self.table.last_index();
        if index > last {
            return Ok(());
        }
        assert!(
            index > self.checkpoint.index && index >= self.table.first_index(),
            "cut at {index} below the checkpoint ({}) or the first entry held ({})",
            self.checkpoint.index,
            self.table.first_index()
        );
        let cut = self.table.lsns[(index - self.table.first_index()) as usize];
        let result = self.cut_files(cut);
        self.poison_on(&result, "journal truncation failed");
        result?;
        self.table.cut(index);
        self.queued_last = (
            index - 1,
            self.table.term(index - 1).expect("held or before"),
        );
        self.written_lsn = cut;
        self.synced_lsn = self.synced_lsn.min(cut);
        for job in &mut self.syncs_in_flight {
            job.1 = job.1.min(cut);
        }
        Ok(())
    }

    /// Deletes the files that start past `cut` and shortens the one holding it.
    fn cut_files(&mut self, cut: u64) -> Result<(), StorageError> {
        let files = &mut self.files;
        while files.open.len() > 1 && files.open.back().is_some_and(|f| f.first_lsn > cut) {
            let f = files.open.pop_back().expect("len checked");
            files.forget(&f.file);
            files
                .storage
                .remove_file(&f.path)
                .map_err(|e| StorageError::from_io(&f.path, None, e))?;
            files.dir_dirty = true;
        }
        let f = files.open.back_mut().expect("the cut is in a file");
        let len = JOURNAL2_FILE_HEADER_BYTES as u64 + (cut - f.first_lsn);
        f.file
            .set_len(len)
            .map_err(|e| StorageError::from_io(&f.path, Some(len), e))?;
        f.len = len;
        let file = Arc::clone(&f.file);
        files.mark_unsynced(file);
        Ok(())
    }

    /// The fdatasync for everything written (or cut) since the previous job, if anything.
    pub fn take_sync_job(&mut self) -> Option<RaftJournalSync> {
        if self.poisoned.is_some() || !self.files.sync_due() {
            return None;
        }
        let job = RaftJournalSync {
            sync: self.files.take_sync(),
            job: self.next_job,
        };
        self.next_job += 1;
        self.syncs_in_flight
            .push_back((job.job, self.written_lsn, false));
        Some(job)
    }

    /// Sync job `job` finished; returns the synced LSN, which moves once every job taken
    /// before it finished too.
    pub fn sync_done(&mut self, job: u64) -> u64 {
        if let Some(entry) = self.syncs_in_flight.iter_mut().find(|j| j.0 == job) {
            entry.2 = true;
        }
        while let Some(&(_, upto, true)) = self.syncs_in_flight.front() {
            self.syncs_in_flight.pop_front();
            if self.poisoned.is_none() {
                self.synced_lsn = self.synced_lsn.max(upto);
            }
        }
        self.synced_lsn
    }

    /// A sync job failed: sticky, as in format 1.
    pub fn sync_failed(&mut self, err: &io::Error) {
        let failed: Result<(), StorageError> =
            Err(StorageError::from_io(&self.files.dir, None, clone_io(err)));
        self.poison_on(&failed, "journal fdatasync failed");
        self.syncs_in_flight.clear();
    }
}

fn clone_io(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

impl RaftJournal {
    /// The checkpoint write at entry `index` (written, not below the last checkpoint).
    /// The caller runs it once `index` is applied and the segments holding what it
    /// applied up to there are synced.
    pub fn checkpoint_job(&self, index: u64) -> Checkpoint2Write {
        assert!(index >= self.checkpoint.index && index <= self.table.last_index());
        let first = self.table.first_index();
        let lsn = match self.table.lsns.get((index + 1 - first) as usize) {
            Some(&next) => next,
            None => self.written_lsn + self.buf.len() as u64,
        };
        let term = self.table.term(index).expect("held");
        Checkpoint2Write {
            storage: Arc::clone(&self.files.storage),
            path: self.files.dir.join(CHECKPOINT_FILE),
            point: Checkpoint2 { lsn, index, term },
        }
    }

    /// A checkpoint is durable: returns the files wholly below it, which the caller
    /// deletes off the reactor, and forgets their entries. The file being written is
    /// never one of them.
    pub fn checkpoint_done(&mut self, point: Checkpoint2) -> Vec<PathBuf> {
        if point.index > self.checkpoint.index {
            self.checkpoint = point;
        }
        let gone = self.files.release_below(self.checkpoint.lsn);
        if let Some(first) = self.files.open.front() {
            self.table.compact_below(first.first_lsn);
        }
        gone
    }

    /// The data of written entries `lo..hi`. Blocking (preads): for entries no longer
    /// cached, off the reactor or where a read of pages just written is acceptable.
    pub fn read(&self, lo: u64, hi: u64) -> io::Result<Vec<Vec<u8>>> {
        let first = self.table.first_index();
        assert!(lo >= first && hi <= self.table.last_index() + 1 && lo <= hi);
        let mut out = Vec::with_capacity((hi - lo) as usize);
        for index in lo..hi {
            let lsn = self.table.lsns[(index - first) as usize];
            let end = match self.table.lsns.get((index + 1 - first) as usize) {
                Some(&next) => next,
                None => self.written_lsn,
            };
            if end > self.written_lsn {
                return Err(io::Error::other(format!(
                    "entry {index} is not written yet"
                )));
            }
            let at = self.files.open.partition_point(|f| f.first_lsn <= lsn);
            let f = &self.files.open[at - 1];
            let mut bytes = vec![0u8; (end - lsn) as usize];
            let pos = JOURNAL2_FILE_HEADER_BYTES as u64 + (lsn - f.first_lsn);
            storage::read_exact_at(&*f.file, pos, &mut bytes)?;
            let entry = RaftEntry::decode(&bytes, lsn, None)
                .map_err(|why| io::Error::new(io::ErrorKind::InvalidData, why))?;
            out.push(entry.data.to_vec());
        }
        Ok(out)
    }

    /// The first entry held (the one after the checkpoint or what compaction let go).
    pub fn first_index(&self) -> u64 {
        self.table.first_index()
    }

    /// The last entry appended, written or not.
    pub fn last_index(&self) -> u64 {
        self.table.last_index()
    }

    /// The term of entry `index`, for `first_index() - 1 ..= last_index()`.
    pub fn term(&self, index: u64) -> Option<u64> {
        self.table.term(index)
    }

    pub fn last_term(&self) -> u64 {
        self.table.last_term()
    }

    /// The term runs `(first index, term)` of the entries held.
    pub fn term_runs(&self) -> &[(u64, u64)] {
        &self.table.terms
    }

    pub fn written_lsn(&self) -> u64 {
        self.written_lsn
    }

    /// Sync jobs taken and not yet done.
    pub fn syncs_in_flight(&self) -> usize {
        self.syncs_in_flight.len()
    }

    pub fn synced_lsn(&self) -> u64 {
        self.synced_lsn
    }

    /// Bytes of entries the journal's files hold, from the first kept file on: what
    /// compaction has not released yet.
    pub fn held_bytes(&self) -> u64 {
        let first = self
            .files
            .open
            .front()
            .map_or(self.written_lsn, |f| f.first_lsn);
        self.written_lsn.saturating_sub(first)
    }

    pub fn checkpoint(&self) -> Checkpoint2 {
        self.checkpoint
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Bookkeeping holds together: files contiguous, the writer at the end of the last,
    /// the index table's LSNs ascending and within the files, term runs ascending.
    pub fn check_invariants(&self) {
        assert!(self.synced_lsn <= self.written_lsn);
        assert!(self.checkpoint.lsn <= self.written_lsn + self.buf.len() as u64);
        self.files.check_invariants(self.written_lsn);
        let t = &self.table;
        assert!(t.lsns.iter().zip(t.lsns.iter().skip(1)).all(|(a, b)| a < b));
        assert!(t
            .terms
            .windows(2)
            .all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
        assert!(t
            .terms
            .first()
            .is_none_or(|r| r.0 == t.first_index() && r.1 >= t.before.1));
        assert_eq!(self.queued_last, (t.last_index(), t.last_term()));
        for &(_, upto, _) in &self.syncs_in_flight {
            assert!(upto <= self.written_lsn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::simdisk::SimDisk;
    use super::super::storage::FsStorage;
    use super::*;

    /// What replay saw: (index, term, commit, data).
    type Seen = Vec<(u64, u64, u64, Vec<u8>)>;

    fn open_on(storage: &Arc<dyn Storage>, dir: &Path, file_bytes: u64) -> (RaftJournal, Seen) {
        let mut seen = Vec::new();
        let (j, _) = RaftJournal::open(storage, dir, file_bytes, |e| {
            seen.push((e.index, e.term, e.commit, e.data.to_vec()))
        })
        .unwrap();
        j.check_invariants();
        (j, seen)
    }

    fn open(dir: &Path, file_bytes: u64) -> (RaftJournal, Seen) {
        open_on(&FsStorage::shared(), dir, file_bytes)
    }

    /// Entry data that raft's rule makes a function of (index, term): one index and
    /// term, one entry. Padded to one length, so that old and new entries line up.
    fn data(index: u64, term: u64) -> Vec<u8> {
        format!("{index:04}@{term:04}").into_bytes()
    }

    fn put(j: &mut RaftJournal, index: u64, term: u64) {
        j.append(term, index, index.saturating_sub(2), &data(index, term));
        j.write().unwrap();
        j.check_invariants();
    }

    fn sync(j: &mut RaftJournal) {
        let job = j.take_sync_job().unwrap();
        job.run().unwrap();
        j.sync_done(job.job);
        j.check_invariants();
    }

    fn terms_of(seen: &Seen) -> Vec<(u64, u64)> {
        seen.iter().map(|s| (s.0, s.1)).collect()
    }

    #[test]
    fn entries_and_term_runs_come_back_across_files_and_restarts() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, seen) = open(tmp.path(), 256);
        assert!(seen.is_empty());
        assert_eq!(
            (j.first_index(), j.last_index(), j.term(0)),
            (1, 0, Some(0))
        );
        for i in 1..=12 {
            put(&mut j, i, 1 + i / 5); // terms 1, 2, 3 in runs
        }
        sync(&mut j);
        assert!(
            j.files.open.len() > 2,
            "small files roll: {}",
            j.files.open.len()
        );
        assert_eq!(j.term_runs(), &[(1, 1), (5, 2), (10, 3)]);
        drop(j);
        let (mut j, seen) = open(tmp.path(), 256);
        assert_eq!(seen.len(), 12);
        for (i, s) in seen.iter().enumerate() {
            let i = i as u64 + 1;
            assert_eq!(s, &(i, 1 + i / 5, i.saturating_sub(2), data(i, 1 + i / 5)));
        }
        assert_eq!(
            j.term_runs(),
            &[(1, 1), (5, 2), (10, 3)],
            "rebuilt by replay"
        );
        assert_eq!(
            j.read(4, 7).unwrap(),
            vec![data(4, 1), data(5, 2), data(6, 2)]
        );
        // The same term across a restart continues its run; a new one starts another.
        put(&mut j, 13, 3);
        put(&mut j, 14, 7);
        sync(&mut j);
        drop(j);
        let (j, seen) = open(tmp.path(), 256);
        assert_eq!(seen.len(), 14);
        assert_eq!(j.term_runs(), &[(1, 1), (5, 2), (10, 3), (14, 7)]);
        assert_eq!(
            (j.last_index(), j.last_term(), j.term(12)),
            (14, 7, Some(3))
        );
    }

    #[test]
    fn files_start_from_spares_and_replay_stops_at_their_zeros_and_old_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), 256);
        assert!(j.spare_due(), "no file yet: the first is preallocated too");
        j.spare_made(&j.spare_job(None).unwrap().run());
        assert!(j.spare_job(None).is_none(), "one is ready");
        put(&mut j, 1, 1);
        sync(&mut j);
        assert!(j.files.open.back().unwrap().preallocated);
        let first = j.files.open.back().unwrap().path.clone();
        // A file let go becomes the next spare: its old entries lie past the new ones.
        let mut recycled = false;
        for i in 2..=6 {
            put(&mut j, i, 1);
            if j.spare_due() && !recycled {
                let old = tmp.path().join("old.jnl");
                std::fs::copy(&first, &old).unwrap();
                j.spare_made(&j.spare_job(Some(old)).unwrap().run());
                recycled = true;
            }
        }
        assert!(recycled);
        sync(&mut j);
        assert!(j.files.open.len() >= 2, "rolled into the spare");
        drop(j);
        let (j, seen) = open(tmp.path(), 256);
        assert_eq!(terms_of(&seen), (1..=6).map(|i| (i, 1)).collect::<Vec<_>>());
        assert_eq!(j.last_index(), 6);
    }

    #[test]
    fn truncate_from_then_replay_inside_a_file_and_across_files() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), 256);
        for i in 1..=15 {
            put(&mut j, i, 2);
        }
        sync(&mut j);
        let files = j.files.open.len();
        // Inside the last file.
        j.truncate_from(15).unwrap();
        put(&mut j, 15, 3);
        // Across files: everything from 4 on goes, later files with it.
        j.truncate_from(4).unwrap();
        assert!(j.files.open.len() < files, "{} files", j.files.open.len());
        assert_eq!((j.last_index(), j.last_term()), (3, 2));
        for i in 4..=6 {
            put(&mut j, i, 5);
        }
        sync(&mut j);
        drop(j);
        let (mut j, seen) = open(tmp.path(), 256);
        let want: Vec<(u64, u64)> = (1..=3)
            .map(|i| (i, 2))
            .chain((4..=6).map(|i| (i, 5)))
            .collect();
        assert_eq!(terms_of(&seen), want);
        assert_eq!(j.read(6, 7).unwrap(), vec![data(6, 5)]);
        // Cutting past the end does nothing; cutting at the first entry empties the log.
        j.truncate_from(7).unwrap();
        assert_eq!(j.last_index(), 6);
        j.truncate_from(1).unwrap();
        put(&mut j, 1, 9);
        sync(&mut j);
        drop(j);
        let (_, seen) = open(tmp.path(), 256);
        assert_eq!(terms_of(&seen), vec![(1, 9)]);
    }

    /// The case the `prev_term` field exists for: a new leader replaces entry 4 of term 3
    /// with its own entry 4 of an older term 2, and a power cut keeps the new entry but
    /// not the cut, leaving old entries 5 and 6 (term 3) right behind it, at the LSN and
    /// index expected next. Their term (3 >= 2) and index would pass.
    #[test]
    fn old_entries_behind_a_replacement_of_an_older_term_never_count() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), JOURNAL2_ENTRY_BYTES_MAX as u64);
        for (i, t) in [(1, 1), (2, 1), (3, 2), (4, 3), (5, 3), (6, 3)] {
            put(&mut j, i, t);
        }
        sync(&mut j);
        let path = j.files.open[0].path.clone();
        let old = std::fs::read(&path).unwrap();
        j.truncate_from(4).unwrap();
        put(&mut j, 4, 2);
        sync(&mut j);
        drop(j);
        let mut now = std::fs::read(&path).unwrap();
        let entry = (JOURNAL2_ENTRY_HEADER_BYTES + data(1, 1).len()) as u64;
        let header = JOURNAL2_FILE_HEADER_BYTES as u64;
        assert_eq!(
            now.len() as u64,
            header + 4 * entry,
            "cut after 3, new 4 written"
        );
        now.extend_from_slice(&old[now.len()..]);
        std::fs::write(&path, &now).unwrap();
        let (j, seen) = open(tmp.path(), JOURNAL2_ENTRY_BYTES_MAX as u64);
        assert_eq!(terms_of(&seen), vec![(1, 1), (2, 1), (3, 2), (4, 2)]);
        assert_eq!(j.last_index(), 4);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(len, header + 4 * entry, "the file is cut at the end again");
    }

    #[test]
    fn a_torn_last_entry_ends_the_journal_and_the_next_index_follows_the_last_whole_one() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), 4096);
        for i in 1..=5 {
            put(&mut j, i, 1);
        }
        sync(&mut j);
        let path = j.files.open[0].path.clone();
        drop(j);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        drop(f);
        let (mut j, seen) = open(tmp.path(), 4096);
        assert_eq!(seen.len(), 4);
        assert_eq!(j.last_index(), 4);
        put(&mut j, 5, 2);
        sync(&mut j);
        drop(j);
        let (_, seen) = open(tmp.path(), 4096);
        assert_eq!(
            terms_of(&seen),
            vec![(1, 1), (2, 1), (3, 1), (4, 1), (5, 2)]
        );
    }

    #[test]
    fn a_checkpoint_keeps_index_and_term_of_the_entry_before_the_first_one_replayed() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), 256);
        for i in 1..=12 {
            put(&mut j, i, 1 + i / 4);
        }
        sync(&mut j);
        let job = j.checkpoint_job(9);
        assert_eq!((job.point.index, job.point.term), (9, 3));
        job.run().unwrap();
        let gone = j.checkpoint_done(job.point);
        assert!(!gone.is_empty());
        for p in &gone {
            std::fs::remove_file(p).unwrap();
        }
        j.check_invariants();
        assert!(
            j.first_index() > 1 && j.first_index() <= 10,
            "{}",
            j.first_index()
        );
        let before = j.first_index() - 1;
        assert_eq!(
            j.term(before),
            Some(1 + before / 4),
            "the entry before the first"
        );
        drop(j);
        let (mut j, seen) = open(tmp.path(), 256);
        assert_eq!(terms_of(&seen), vec![(10, 3), (11, 3), (12, 4)]);
        assert_eq!((j.first_index(), j.term(9), j.term(8)), (10, Some(3), None));
        assert_eq!(j.checkpoint().index, 9);
        // Entries up to the checkpoint are applied: raft never cuts there.
        j.truncate_from(10).unwrap();
        put(&mut j, 10, 5);
        sync(&mut j);
        drop(j);
        let (_, seen) = open(tmp.path(), 256);
        assert_eq!(terms_of(&seen), vec![(10, 5)]);
    }

    #[test]
    fn a_sync_in_flight_during_a_cut_covers_only_what_is_below_the_cut() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _) = open(tmp.path(), 4096);
        put(&mut j, 1, 1);
        put(&mut j, 2, 1);
        let job = j.take_sync_job().unwrap();
        j.truncate_from(2).unwrap();
        let cut = j.written_lsn();
        put(&mut j, 2, 2);
        job.run().unwrap();
        assert_eq!(j.sync_done(job.job), cut, "not the new entry 2");
        sync(&mut j);
        assert_eq!(j.synced_lsn(), j.written_lsn());
    }

    /// Power cuts and killed processes at random points of a raft follower's life:
    /// appends, syncs taken and finished in order, cuts by new leaders (each with a fresh
    /// term, the common case), and syncs in flight when the power goes. After each the
    /// journal replays to (1) a log holding every entry a finished sync covered, or an
    /// earlier replay found, and no cut took back since, and (2) a prefix of a log that
    /// existed: never old entries spliced behind new ones. A killed process leaves the
    /// page cache as it was, so its replay finds unsynced entries and cuts; they count
    /// from then on, and a later power cut must keep them.
    #[test]
    fn power_cuts_keep_synced_entries_and_never_splice_old_entries_behind_new_ones() {
        for seed in 0..150 {
            simulate(seed);
        }
    }

    fn reopen(disk: &SimDisk, dir: &Path) -> (RaftJournal, Vec<u64>) {
        let storage: Arc<dyn Storage> = Arc::new(disk.clone());
        let (j, seen) = open_on(&storage, dir, 200);
        for s in &seen {
            assert_eq!(s.3, data(s.0, s.1), "data of ({}, {})", s.0, s.1);
        }
        (j, seen.iter().map(|s| s.1).collect())
    }

    fn simulate(seed: u64) {
        use super::super::simdisk::SimRng;
        let disk = SimDisk::seeded(seed);
        let mut rng = SimRng::new(seed);
        let dir = Path::new("/journal");
        let (mut j, _) = reopen(&disk, dir);
        // The model: terms of entries 1.., every log that existed, what syncs made durable.
        let (mut log, mut versions, mut acked) = (Vec::<u64>::new(), Vec::new(), Vec::new());
        let mut in_flight: VecDeque<(RaftJournalSync, Vec<u64>)> = VecDeque::new();
        let mut term = 1;
        for step in 0..80 {
            match rng.below(11) {
                0..=3 => {
                    for _ in 0..=rng.below(3) {
                        log.push(term);
                        j.append(term, log.len() as u64, 0, &data(log.len() as u64, term));
                    }
                    j.write().unwrap();
                }
                4 if !log.is_empty() => {
                    // A new leader replaces entries from `from` on.
                    let from = 1 + rng.below(log.len() as u64);
                    term += 1;
                    j.truncate_from(from).unwrap();
                    let keep = from as usize - 1;
                    log.truncate(keep);
                    acked.truncate(keep.min(acked.len()));
                    for job in &mut in_flight {
                        job.1.truncate(keep.min(job.1.len()));
                    }
                    log.push(term);
                    j.append(term, from, 0, &data(from, term));
                    j.write().unwrap();
                }
                5 | 6 => in_flight.extend(j.take_sync_job().map(|job| (job, log.clone()))),
                7 | 8 => {
                    if let Some((job, covered)) = in_flight.pop_front() {
                        job.run().unwrap();
                        j.sync_done(job.job);
                        acked = covered;
                    }
                }
                roll => {
                    // 10: the process is killed, the page cache stays; else the power goes.
                    if roll != 10 {
                        disk.power_cut();
                    }
                    in_flight.clear();
                    drop(j);
                    let (again, recovered) = reopen(&disk, dir);
                    j = again;
                    let at = format!("seed {seed} step {step}: {recovered:?} acked {acked:?}");
                    assert!(recovered.starts_with(&acked), "lost a synced entry, {at}");
                    assert!(
                        versions
                            .iter()
                            .chain([&log])
                            .any(|v: &Vec<u64>| v.starts_with(&recovered)),
                        "not a log that existed, {at}"
                    );
                    // What replay found counts as durable from here on.
                    log = recovered;
                    acked = log.clone();
                    term = term.max(j.last_term());
                }
            }
            j.check_invariants();
            versions.push(log.clone());
        }
    }
}
