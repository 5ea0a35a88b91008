//! The node-wide journal: every partition's records go through it, and one fdatasync of it
//! makes a whole reactor pass durable, however many partitions the pass wrote.
//!
//! Partition segments are still written on every pass (readers map them) but synced only
//! at checkpoints; until then the journal is what a power cut cannot take away. At start,
//! the entries after the last checkpoint are replayed into the partitions that lost them
//! (`broker/publish.rs`). This room knows files, byte positions and entries; it does not
//! know what a partition is beyond the two numbers an entry carries. Depends on std, log,
//! the journal files it shares with format 2 (`journal_files.rs`: naming, headers,
//! replay, writing, syncing) and the storage seam (`storage.rs`).
//!
//! # Files: `<first_lsn:020>.jnl` and `checkpoint` in the journal directory
//!
//! LSN: an entry's place in the journal stream, counting entry bytes only (file headers
//! and the unused end of a full file do not count). A file's name is the LSN of its first
//! entry; the entry at LSN `l` of a file named `f` starts at byte `16 + l - f`.
//!
//! ```text
//! file header
//! offset  width  field              meaning
//! 0       4      magic "MMQJ"
//! 4       2      format_version u16 JOURNAL_FORMAT_VERSION (1)
//! 6       2      reserved u16       0
//! 8       8      first_lsn u64      equals the number in the file name
//!
//! entry (all integers big-endian)
//! 0       4      length u32         bytes of the whole entry, header included
//! 4       4      crc u32            crc32 (crc32fast) of bytes [8, length)
//! 8       8      lsn u64            where the entry is in the stream
//! 16      8      epoch u64          the leader epoch of the broker that wrote it
//! 24      2      topic_id u16
//! 26      2      partition u16
//! 28      8      first_sequence u64 the sequence of the first record
//! 36      4      count u32          records that follow
//! 40      ...    records            back to back, exactly as in a segment (record.rs)
//! ```
//!
//! An entry counts only when its CRC checks out, its LSN is the one expected at that
//! place and its epoch is not lower than the entry before it: bytes a crash left past the
//! end of the journal (a torn write, or a whole entry whose page reached the disk when the
//! page before it did not) came from an earlier epoch, and never follow a newer entry.
//! The journal ends at the first entry that does not count, unless a file named with the
//! LSN expected next exists (the writer moved on because the entry did not fit).
//!
//! `checkpoint` (a meta file, `meta.rs`) holds one LSN: every entry below it is in
//! segments that were fdatasynced, so replay starts there and the files wholly below it
//! are deleted. It also holds the epoch of the broker that wrote it, which the first entry
//! after it must reach too (a checkpoint written before that field reads as epoch 0).

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::StorageError;
use super::journal_files::{
    self, EntryBounds, FilesSync, JournalFile, JournalFiles, FILE_HEADER_BYTES,
};
pub use super::journal_files::{journal_file_path, CHECKPOINT_FILE, JOURNAL_MAGIC, JOURNAL_SUFFIX};
use super::meta;
use super::storage::{Open, Storage};

/// A journal file is closed once the next entry would take it past this size (an entry
/// larger than this gets a file of its own).
pub const JOURNAL_FILE_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;
/// Smallest `--journal-file-size`: below it checkpoints (a sync of every written
/// segment each) would come too often.
pub const JOURNAL_FILE_BYTES_MIN: u64 = 64 * 1024;
/// Largest `--journal-file-size`: start-up replays up to one file's worth of entries.
pub const JOURNAL_FILE_BYTES_MAX: u64 = 1024 * 1024 * 1024;
/// Bumped whenever the journal layout changes.
pub const JOURNAL_FORMAT_VERSION: u16 = 1;
pub const JOURNAL_FILE_HEADER_BYTES: usize = FILE_HEADER_BYTES;
pub const JOURNAL_ENTRY_HEADER_BYTES: usize = 40;
/// The largest entry a reader accepts before allocating for it: one pass's records of one
/// partition stay far below it (the broker refuses PUBs past 64 MiB unsynced).
pub const JOURNAL_ENTRY_BYTES_MAX: usize = 1024 * 1024 * 1024;
/// A file whose blocks are already allocated, renamed into place when the journal needs
/// its next file: writing inside allocated blocks leaves fdatasync nothing but the data to
/// commit (no size or extent change), about a quarter of the cost of an appending write's
/// here (`docs/BENCHMARKS.md`). A journal file a checkpoint let go becomes the next spare;
/// the first one is filled with zeros by a job.
pub const SPARE_FILE: &str = "spare.jnl";
/// Zeros written per call when a spare is filled. Each chunk is written back before the
/// next (`StorageFile::write_back`): the fill is background work beside the journal's own
/// fdatasyncs on the same disk and, on a small host, beside the reactor on the same core,
/// and one 64 MiB sync at the end queued the journal's syncs behind it and held the core
/// for milliseconds (e2e p999 and max, `docs/BENCHMARKS.md`).
const SPARE_FILL_CHUNK_BYTES: usize = 1024 * 1024;
const ENTRY_BOUNDS: EntryBounds =
    EntryBounds::new(JOURNAL_ENTRY_HEADER_BYTES, JOURNAL_ENTRY_BYTES_MAX);

/// One journal entry: the records one partition wrote in one pass.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<'a> {
    pub lsn: u64,
    pub epoch: u64,
    pub topic_id: u16,
    pub partition: u16,
    pub first_sequence: u64,
    pub count: u32,
    /// Encoded records, as a segment holds them.
    pub records: &'a [u8],
}

impl Entry<'_> {
    pub fn encoded_len(&self) -> usize {
        JOURNAL_ENTRY_HEADER_BYTES + self.records.len()
    }

    fn encode(&self, buf: &mut Vec<u8>) {
        let start = journal_files::begin_entry(buf, self.encoded_len(), self.lsn);
        buf.extend_from_slice(&self.epoch.to_be_bytes());
        buf.extend_from_slice(&self.topic_id.to_be_bytes());
        buf.extend_from_slice(&self.partition.to_be_bytes());
        buf.extend_from_slice(&self.first_sequence.to_be_bytes());
        buf.extend_from_slice(&self.count.to_be_bytes());
        buf.extend_from_slice(self.records);
        journal_files::seal_entry(buf, start);
    }

    /// The entry `bytes` holds (exactly one, header included), if it counts at `lsn`
    /// after an entry of `min_epoch`.
    fn decode(bytes: &[u8], lsn: u64, min_epoch: u64) -> Result<Entry<'_>, String> {
        journal_files::check_entry(bytes, ENTRY_BOUNDS, lsn)?;
        let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().expect("8"));
        let u32_at = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4"));
        let u16_at = |at: usize| u16::from_be_bytes(bytes[at..at + 2].try_into().expect("2"));
        let entry = Entry {
            lsn: u64_at(8),
            epoch: u64_at(16),
            topic_id: u16_at(24),
            partition: u16_at(26),
            first_sequence: u64_at(28),
            count: u32_at(36),
            records: &bytes[JOURNAL_ENTRY_HEADER_BYTES..],
        };
        if entry.epoch < min_epoch {
            return Err(format!("epoch {} after epoch {min_epoch}", entry.epoch));
        }
        Ok(entry)
    }
}

/// One fdatasync of everything the journal wrote before the job was taken.
#[derive(Debug)]
pub struct JournalSync {
    sync: FilesSync,
    /// After a successful run every entry below this LSN is durable.
    pub upto_lsn: u64,
}

impl JournalSync {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        self.sync.run()
    }
}

/// Writing a checkpoint: once the segments holding every entry below `lsn` are synced.
#[derive(Debug)]
pub struct CheckpointWrite {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    pub lsn: u64,
    /// The epoch of the broker that writes it: no entry after the checkpoint was written
    /// by an earlier one (`docs/STORAGE.md`, "Journal").
    epoch: u64,
}

/// A checkpoint's payload: the LSN (8 bytes), then the epoch that wrote it (8 bytes;
/// absent from checkpoints written before 2026-12-03, read as epoch 0).
const CHECKPOINT_BYTES: usize = 16;
const CHECKPOINT_BYTES_WITHOUT_EPOCH: usize = 8;

impl CheckpointWrite {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        let mut payload = [0u8; CHECKPOINT_BYTES];
        payload[..8].copy_from_slice(&self.lsn.to_be_bytes());
        payload[8..].copy_from_slice(&self.epoch.to_be_bytes());
        meta::write_atomic(&*self.storage, &self.path, &payload)
    }
}

/// What [`Journal::open`] found.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct JournalReport {
    pub checkpoint_lsn: u64,
    pub entries_replayed: u64,
    pub end_lsn: u64,
    /// Why the journal ended where it did, when not at the end of its last file.
    pub ended_by: Option<String>,
    /// Files past the end (made by a writer whose entries were lost) and files wholly
    /// below the checkpoint, deleted.
    pub files_removed: u32,
}

/// The journal of a data directory. Single-threaded: owned by the reactor; only
/// [`JournalSync`] and [`CheckpointWrite`] cross to the fsync workers.
pub struct Journal {
    file_bytes: u64,
    epoch: u64,
    files: JournalFiles,
    /// Entries appended this pass, and each one's length.
    buf: Vec<u8>,
    entry_lens: Vec<usize>,
    written_lsn: u64,
    sync_taken_lsn: u64,
    synced_lsn: u64,
    /// Sync jobs taken and not yet reported: the LSN each covers and whether it is done.
    /// The synced LSN moves only over a completed prefix: a job taken after a new file
    /// was started covers only that file.
    syncs_in_flight: VecDeque<(u64, bool)>,
    checkpoint_lsn: u64,
    spares: Spares,
    poisoned: Option<String>,
}

/// The journal's next file, made ahead ([`SPARE_FILE`]): the same for both formats.
#[derive(Debug, Default)]
pub(super) struct Spares {
    /// `SPARE_FILE` exists, whole, for the next file.
    ready: bool,
    /// The next write starts a new file: after a restart the last file was cut at its
    /// end, and appending to it would grow it again (a size change for every fdatasync)
    /// while a spare is ready.
    roll_at_next_write: bool,
    /// Making a spare failed since the current file started (a full disk): the next try
    /// waits for the next file, rather than failing again on every pass.
    failed: bool,
}

impl Spares {
    /// Start-up, before replay: whether a spare waits.
    pub(super) fn found(&mut self, files: &JournalFiles) {
        self.ready = files.storage.file_len(&files.dir.join(SPARE_FILE)).is_ok();
    }

    /// Start-up, after replay: with a spare ready, the next write leaves the last file.
    pub(super) fn replayed(&mut self, files: &JournalFiles) {
        self.roll_at_next_write = self.ready && !files.open.is_empty();
    }

    #[cfg(test)]
    pub(super) fn is_ready(&self) -> bool {
        self.ready
    }

    /// Writes `buf` (entries of `entry_lens`) at `written_lsn`, starting each new file
    /// from the spare when one is ready.
    pub(super) fn write_entries(
        &mut self,
        files: &mut JournalFiles,
        (buf, entry_lens): (&[u8], &[usize]),
        file_bytes: u64,
        written_lsn: &mut u64,
    ) -> Result<(), StorageError> {
        // An empty file keeps its name (its first LSN is the next one): it is written
        // into, growing, as is a file made before the spare was ready.
        let has_entries = |f: &JournalFile| f.len > JOURNAL_FILE_HEADER_BYTES as u64;
        if std::mem::take(&mut self.roll_at_next_write)
            && files.open.back().is_some_and(has_entries)
        {
            self.start_file(files, *written_lsn)?;
        }
        files.write_entries(
            buf,
            entry_lens,
            file_bytes,
            written_lsn,
            &mut |files, first| self.start_file(files, first),
        )
    }

    /// Starts the file whose first entry has LSN `first_lsn`, from the spare when one
    /// is ready.
    fn start_file(&mut self, files: &mut JournalFiles, first_lsn: u64) -> Result<(), StorageError> {
        let spare = std::mem::take(&mut self.ready).then(|| files.dir.join(SPARE_FILE));
        self.failed = false;
        files.start_file(first_lsn, spare.as_deref())
    }

    /// Whether to make the next spare now: the file being written is past half full (a
    /// checkpoint will have let a file go by then, to be recycled), or there is no file
    /// yet, so that the first one is preallocated too.
    pub(super) fn due(&self, files: &JournalFiles, file_bytes: u64) -> bool {
        !self.failed && files.open.back().is_none_or(|f| 2 * f.len >= file_bytes)
    }

    /// The job that makes the next spare, when there is none: from `recycle` (a file a
    /// checkpoint let go) or, without one, by filling a new file with zeros.
    pub(super) fn job(
        &self,
        files: &JournalFiles,
        file_bytes: u64,
        recycle: Option<PathBuf>,
    ) -> Option<SpareWrite> {
        (!self.ready).then(|| SpareWrite {
            storage: Arc::clone(&files.storage),
            dir: files.dir.clone(),
            recycle,
            bytes: file_bytes,
        })
    }

    /// A spare job finished.
    pub(super) fn made(&mut self, files: &JournalFiles, result: &io::Result<()>) {
        match result {
            Ok(()) => {
                self.ready = true;
                // A file that grows costs a size change per fdatasync: leave it now.
                self.roll_at_next_write = files.open.back().is_some_and(|f| !f.preallocated);
            }
            // Harmless: the next file is made by appending, as without a spare.
            Err(e) => {
                self.failed = true;
                log::warn!(
                    "{}: cannot make the spare journal file: {e}",
                    files.dir.display()
                );
            }
        }
    }
}

/// Making the spare: filling a new file with zeros, or renaming a file a checkpoint let go.
#[derive(Debug)]
pub struct SpareWrite {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// A journal file to rename into the spare; `None`: fill a new one.
    recycle: Option<PathBuf>,
    bytes: u64,
}

impl SpareWrite {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        let spare = self.dir.join(SPARE_FILE);
        match &self.recycle {
            Some(old) => self.storage.rename(old, &spare)?,
            None => {
                let tmp = self.dir.join(format!("{SPARE_FILE}.tmp"));
                let file = self.storage.open(&tmp, Open::Create)?;
                let zeros = vec![0u8; SPARE_FILL_CHUNK_BYTES];
                let mut at = 0;
                while at < self.bytes {
                    let n = (self.bytes - at).min(zeros.len() as u64) as usize;
                    file.write_at(at, &zeros[..n])?;
                    file.write_back(at)?;
                    at += n as u64;
                    // Lets a runnable reactor on this core go first between chunks.
                    std::thread::yield_now();
                }
                file.sync_data()?;
                self.storage.rename(&tmp, &spare)?;
            }
        }
        self.storage.sync_dir(&self.dir)
    }
}

impl Journal {
    /// A journal for `dir` that has not read anything yet: [`recover`](Self::recover)
    /// must run before anything is appended. `epoch` must be above every epoch already in
    /// the journal.
    pub fn new(storage: &Arc<dyn Storage>, dir: &Path, file_bytes: u64, epoch: u64) -> Journal {
        Journal {
            file_bytes,
            epoch,
            files: JournalFiles::new(storage, dir, JOURNAL_FORMAT_VERSION, ENTRY_BOUNDS),
            buf: Vec::new(),
            entry_lens: Vec::new(),
            written_lsn: 0,
            sync_taken_lsn: 0,
            synced_lsn: 0,
            syncs_in_flight: VecDeque::new(),
            checkpoint_lsn: 0,
            spares: Spares::default(),
            poisoned: None,
        }
    }

    /// Opens the journal in `dir` (making it if missing), calls `replay` for every entry
    /// from the checkpoint to the end, deletes what lies past the end, and leaves the
    /// writer there. Blocking: start-up only.
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        file_bytes: u64,
        epoch: u64,
        mut replay: impl FnMut(&Entry<'_>),
    ) -> Result<(Journal, JournalReport), StorageError> {
        let mut journal = Journal::new(storage, dir, file_bytes, epoch);
        let report = journal.recover(&mut replay)?;
        Ok((journal, report))
    }

    /// Reads the checkpoint, replays every entry from it to the end of the journal into
    /// `replay`, deletes what lies past the end, and leaves the writer there. Blocking:
    /// start-up only.
    pub fn recover(
        &mut self,
        replay: &mut dyn FnMut(&Entry<'_>),
    ) -> Result<JournalReport, StorageError> {
        self.files.create_dir()?;
        let lens = [CHECKPOINT_BYTES, CHECKPOINT_BYTES_WITHOUT_EPOCH];
        let checkpoint = self.files.read_checkpoint(&lens).map(|b| {
            let lsn = u64::from_be_bytes(b[..8].try_into().expect("8"));
            let epoch = b
                .get(8..16)
                .map_or(0, |e| u64::from_be_bytes(e.try_into().expect("8")));
            (lsn, epoch)
        });
        self.spares.found(&self.files);
        let report = self.replay_from(checkpoint, replay)?;
        self.spares.replayed(&self.files);
        Ok(report)
    }

    /// Finds the files, replays from the checkpoint, cuts what is past the end.
    fn replay_from(
        &mut self,
        checkpoint: Option<(u64, u64)>,
        replay: &mut dyn FnMut(&Entry<'_>),
    ) -> Result<JournalReport, StorageError> {
        let mut entries_replayed = 0;
        // The first entry after the checkpoint is held to the checkpoint's epoch: bytes
        // an earlier epoch left at the checkpoint's own LSN (a spare whose rename into
        // place a crash undid, used again under the same name) must not count.
        let (checkpoint, mut min_epoch) = checkpoint.map_or((None, 0), |(l, e)| (Some(l), e));
        let found = self.files.replay(checkpoint, &mut |bytes, lsn| {
            let entry = Entry::decode(bytes, lsn, min_epoch)?;
            replay(&entry);
            entries_replayed += 1;
            min_epoch = entry.epoch;
            Ok(())
        })?;
        let lsn = found.end_lsn;
        self.written_lsn = lsn;
        self.sync_taken_lsn = lsn;
        self.synced_lsn = lsn;
        self.checkpoint_lsn = found.start_lsn.min(lsn);
        Ok(JournalReport {
            checkpoint_lsn: found.start_lsn,
            entries_replayed,
            end_lsn: lsn,
            ended_by: found.ended_by,
            files_removed: found.files_removed,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.files.dir
    }

    /// Queues the entry for `records` (`count` records from `first_sequence`) of one
    /// partition; [`write`](Self::write) writes what was queued.
    pub fn append(
        &mut self,
        topic_id: u16,
        partition: u16,
        first_sequence: u64,
        count: u32,
        records: &[u8],
    ) {
        let entry = Entry {
            lsn: self.written_lsn + self.buf.len() as u64,
            epoch: self.epoch,
            topic_id,
            partition,
            first_sequence,
            count,
            records,
        };
        let before = self.buf.len();
        entry.encode(&mut self.buf);
        self.entry_lens.push(self.buf.len() - before);
    }

    /// Bytes queued and not written yet.
    pub fn pending_bytes(&self) -> usize {
        self.buf.len()
    }

    /// Writes the queued entries: one write per file touched (one in the common case),
    /// starting a new file when the next entry would pass the file size. A failure
    /// poisons the journal: entries after a hole could never be replayed.
    pub fn write(&mut self) -> Result<(), StorageError> {
        // Nothing queued is nothing refused: a poisoned journal answered every later pass
        // with an error, and each counted as one more failed fdatasync.
        if self.buf.is_empty() {
            return Ok(());
        }
        if let Err(refused) = journal_files::refuse_if_poisoned(&self.poisoned, &self.files.dir) {
            self.buf.clear();
            self.entry_lens.clear();
            return Err(refused);
        }
        let result = self.write_entries();
        self.buf.clear();
        self.entry_lens.clear();
        let what = "journal write failed";
        journal_files::poison_on(&mut self.poisoned, &self.files.dir, &result, what);
        result
    }

    fn write_entries(&mut self) -> Result<(), StorageError> {
        let entries = (&self.buf[..], &self.entry_lens[..]);
        let (files, lsn) = (&mut self.files, &mut self.written_lsn);
        self.spares
            .write_entries(files, entries, self.file_bytes, lsn)
    }

    /// The fdatasync for everything written since the previous job, if anything was.
    pub fn take_sync_job(&mut self) -> Option<JournalSync> {
        if self.poisoned.is_some() || self.written_lsn <= self.sync_taken_lsn {
            return None;
        }
        let job = JournalSync {
            sync: self.files.take_sync(),
            upto_lsn: self.written_lsn,
        };
        self.sync_taken_lsn = self.written_lsn;
        self.syncs_in_flight.push_back((job.upto_lsn, false));
        Some(job)
    }

    /// Sync jobs taken and not yet reported.
    pub fn syncs_in_flight(&self) -> usize {
        self.syncs_in_flight.len()
    }

    /// The job that covered up to `upto_lsn` finished; returns the synced LSN, which
    /// moves once every job taken before it finished too.
    pub fn sync_done(&mut self, upto_lsn: u64) -> u64 {
        if let Some(entry) = self
            .syncs_in_flight
            .iter_mut()
            .find(|(u, _)| *u == upto_lsn)
        {
            entry.1 = true;
        }
        if cfg!(feature = "sim-bug-early-ack") && self.poisoned.is_none() {
            // The hole the simulator must find: the synced LSN taken from whichever sync
            // completes, whatever the jobs before it did (after a new journal file was
            // started, a later job covers only that file).
            self.synced_lsn = self.synced_lsn.max(upto_lsn);
        }
        while let Some(&(upto, true)) = self.syncs_in_flight.front() {
            self.syncs_in_flight.pop_front();
            if self.poisoned.is_none() {
                self.synced_lsn = self.synced_lsn.max(upto);
            }
        }
        self.synced_lsn
    }

    /// A sync job failed. Sticky, like a partition's (`PartitionLog::sync_failed`).
    pub fn sync_failed(&mut self, err: &io::Error) {
        log::error!(
            "{}: journal fdatasync failed; refusing writes until restart: {err}",
            self.files.dir.display()
        );
        if self.poisoned.is_none() {
            self.poisoned = Some(format!("journal fdatasync failed: {err}"));
        }
        self.syncs_in_flight.clear();
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.poisoned.as_deref()
    }

    /// Whether to make the next spare now: the file being written is past half full (a
    /// checkpoint will have let a file go by then, to be recycled), or there is no file
    /// yet, so that the first one is preallocated too.
    pub fn spare_due(&self) -> bool {
        self.spares.due(&self.files, self.file_bytes)
    }

    pub fn written_lsn(&self) -> u64 {
        self.written_lsn
    }

    pub fn synced_lsn(&self) -> u64 {
        self.synced_lsn
    }

    pub fn checkpoint_lsn(&self) -> u64 {
        self.checkpoint_lsn
    }

    /// The checkpoint write for `lsn` (at most what is written). The caller runs it after
    /// syncing every segment written before the journal reached `lsn`.
    pub fn checkpoint_job(&self, lsn: u64) -> CheckpointWrite {
        debug_assert!(lsn <= self.written_lsn);
        CheckpointWrite {
            storage: Arc::clone(&self.files.storage),
            path: self.files.dir.join(CHECKPOINT_FILE),
            lsn,
            epoch: self.epoch,
        }
    }

    /// A checkpoint at `lsn` is durable: returns the files wholly below it, which the
    /// caller deletes off the reactor. The file being written is never one of them.
    pub fn checkpoint_done(&mut self, lsn: u64) -> Vec<PathBuf> {
        self.checkpoint_lsn = self.checkpoint_lsn.max(lsn);
        self.files.release_below(self.checkpoint_lsn)
    }

    /// The job that makes the next spare, when there is none: from `recycle` (a file a
    /// checkpoint let go) or, without one, by filling a new file with zeros. The caller
    /// reports the outcome with [`spare_made`](Self::spare_made).
    pub fn spare_job(&self, recycle: Option<PathBuf>) -> Option<SpareWrite> {
        self.spares.job(&self.files, self.file_bytes, recycle)
    }

    /// A spare job finished.
    pub fn spare_made(&mut self, result: &io::Result<()>) {
        self.spares.made(&self.files, result);
    }

    /// Bookkeeping holds together: files in LSN order and contiguous, the writer at the
    /// end of the last, nothing synced past what was written.
    pub fn check_invariants(&self) {
        assert!(self.synced_lsn <= self.sync_taken_lsn && self.sync_taken_lsn <= self.written_lsn);
        assert!(self.checkpoint_lsn <= self.written_lsn);
        for pair in self.files.open.iter().collect::<Vec<_>>().windows(2) {
            assert!(
                pair[0].first_lsn < pair[1].first_lsn,
                "journal files in order"
            );
        }
        self.files.check_invariants(self.written_lsn);
        let mut last = self.synced_lsn;
        for &(upto, _) in &self.syncs_in_flight {
            // The injected hole moves the synced LSN past jobs still in flight; the
            // simulator, not this check, has to notice what that loses.
            if !cfg!(feature = "sim-bug-early-ack") {
                assert!(upto > last, "journal syncs in order");
            }
            assert!(upto <= self.sync_taken_lsn);
            last = upto;
        }
        assert_eq!(self.buf.len(), self.entry_lens.iter().sum::<usize>());
    }
}

#[cfg(test)]
mod tests {
    use super::super::storage::FsStorage;
    use super::*;

    /// What replay saw: (lsn, epoch, topic, partition, first sequence, count, records).
    type Seen = Vec<(u64, u64, u16, u16, u64, u32, Vec<u8>)>;

    fn open(dir: &Path, file_bytes: u64, epoch: u64) -> (Journal, JournalReport, Seen) {
        let mut seen = Vec::new();
        let (j, report) = Journal::open(&FsStorage::shared(), dir, file_bytes, epoch, |e| {
            seen.push((
                e.lsn,
                e.epoch,
                e.topic_id,
                e.partition,
                e.first_sequence,
                e.count,
                e.records.to_vec(),
            ))
        })
        .unwrap();
        (j, report, seen)
    }

    /// Appends entry `i` (partition `i % 3`, `i + 1` bytes of records) and writes it.
    fn put(j: &mut Journal, i: u64) {
        j.append(1, (i % 3) as u16, 10 * i, 1, &vec![i as u8; i as usize + 1]);
        j.write().unwrap();
        j.check_invariants();
    }

    fn sync(j: &mut Journal) {
        let job = j.take_sync_job().unwrap();
        job.run().unwrap();
        j.sync_done(job.upto_lsn);
        j.check_invariants();
    }

    #[test]
    fn entries_come_back_in_order_across_files_and_from_the_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, seen) = open(dir, 256, 1);
        assert!(seen.is_empty());
        for i in 0..20 {
            put(&mut j, i);
        }
        sync(&mut j);
        assert!(
            j.files.open.len() > 3,
            "small files roll: {}",
            j.files.open.len()
        );
        let end = j.written_lsn();
        drop(j);
        let (mut j, report, seen) = open(dir, 256, 2);
        assert_eq!(report.end_lsn, end);
        assert_eq!(seen.len(), 20);
        for (i, s) in seen.iter().enumerate() {
            let i = i as u64;
            assert_eq!(
                (s.1, s.3, s.4, s.6.len()),
                (1, (i % 3) as u16, 10 * i, i as usize + 1)
            );
        }
        // A checkpoint in the middle: replay starts there, files below it go. Written as
        // by the broker of epoch 1 that wrote those entries: a later epoch checkpoints
        // only at or past every entry it found (`GroupCommit::recover`).
        let middle = seen[12].0;
        CheckpointWrite {
            epoch: 1,
            ..j.checkpoint_job(middle)
        }
        .run()
        .unwrap();
        let gone = j.checkpoint_done(middle);
        assert!(!gone.is_empty());
        for path in &gone {
            std::fs::remove_file(path).unwrap();
        }
        put(&mut j, 20);
        sync(&mut j);
        drop(j);
        let (_, _, seen) = open(dir, 256, 3);
        let firsts: Vec<u64> = seen.iter().map(|s| s.4).collect();
        assert_eq!(firsts, (12..=20).map(|i| 10 * i).collect::<Vec<_>>());
        assert_eq!(seen.last().unwrap().1, 2, "written under epoch 2");
    }

    #[test]
    fn entries_an_earlier_epoch_left_at_the_checkpoints_own_lsn_never_count() {
        // Epoch 1 wrote entries; a crash undid the file's rename, so the start of epoch 2
        // found the journal ending before them and checkpointed there; the same bytes then
        // came back under the expected name (simulator seed 1796286794289416690).
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, _) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 1);
        for i in 0..3 {
            put(&mut j, i);
        }
        sync(&mut j);
        drop(j);
        let (j, _, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 2);
        assert_eq!(seen.len(), 3, "epoch 1's entries are replayed once");
        CheckpointWrite {
            lsn: 0,
            ..j.checkpoint_job(0)
        }
        .run()
        .unwrap();
        drop(j);
        let (_, report, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 3);
        assert!(
            seen.is_empty(),
            "replayed again after epoch 2's checkpoint: {seen:?}"
        );
        assert!(report.ended_by.unwrap().contains("epoch 1 after epoch 2"));
    }

    #[test]
    fn a_torn_last_entry_ends_the_journal_and_the_next_writes_replace_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, _) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 1);
        for i in 0..5 {
            put(&mut j, i);
        }
        sync(&mut j);
        let path = j.files.open[0].path.clone();
        drop(j);
        let len = std::fs::metadata(&path).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(len - 3).unwrap();
        drop(f);
        let (mut j, report, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 2);
        assert_eq!(seen.len(), 4);
        assert!(report.ended_by.is_none(), "a short tail is just the end");
        put(&mut j, 7);
        sync(&mut j);
        drop(j);
        let (_, _, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 3);
        let firsts: Vec<u64> = seen.iter().map(|s| s.4).collect();
        assert_eq!(firsts, vec![0, 10, 20, 30, 70]);
    }

    #[test]
    fn a_whole_entry_left_past_the_end_by_an_earlier_epoch_never_counts() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, _) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 1);
        for i in 0..3 {
            put(&mut j, i);
        }
        let path = j.files.open[0].path.clone();
        let bytes = std::fs::read(&path).unwrap();
        drop(j);
        // A power cut kept entries 0 and 2 but lost entry 1's page: the journal ends
        // after entry 0, and the next start writes a shorter entry there...
        let entry_1 = 16 + 41..16 + 41 + 42;
        let mut cut = bytes.clone();
        cut[entry_1].fill(0);
        std::fs::write(&path, &cut).unwrap();
        let (mut j, _, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 2);
        assert_eq!(seen.len(), 1);
        // 42 bytes, like entry 1: the next entry is expected exactly where the old entry
        // 2 was, with the LSN it carries.
        j.append(1, 0, 100, 1, &[9; 2]);
        j.write().unwrap();
        sync(&mut j);
        drop(j);
        // ...and a cut that lost the later writes could leave old entry 2 right behind.
        let mut now = std::fs::read(&path).unwrap();
        assert_eq!(now.len(), 16 + 41 + 42);
        now.extend_from_slice(&bytes[16 + 41 + 42..]);
        std::fs::write(&path, &now).unwrap();
        let (_, report, seen) = open(dir, JOURNAL_FILE_BYTES_DEFAULT, 3);
        let firsts: Vec<u64> = seen.iter().map(|s| s.4).collect();
        assert_eq!(firsts, vec![0, 100], "old entry 2 never counts");
        assert!(report.ended_by.unwrap().contains("epoch 1 after epoch 2"));
    }

    #[test]
    fn a_spare_file_becomes_the_next_file_and_its_old_bytes_never_count() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // Entries of one size, so that the recycled file's old entries sit exactly where
        // new ones are expected: only their LSN tells them apart.
        let put_same = |j: &mut Journal, i: u64| {
            j.append(1, 0, i, 1, &[i as u8; 8]);
            j.write().unwrap();
        };
        let (mut j, _, _) = open(dir, 256, 1);
        for i in 0..12 {
            put_same(&mut j, i);
        }
        sync(&mut j);
        // The oldest file, let go by a checkpoint, becomes the spare.
        let lsn = j.written_lsn();
        j.checkpoint_job(lsn).run().unwrap();
        let mut gone = j.checkpoint_done(lsn);
        let recycled = gone.pop().unwrap();
        let spare = j.spare_job(Some(recycled)).unwrap();
        let made = spare.run();
        j.spare_made(&made);
        assert!(j.spares.is_ready());
        // Fill the file being written, then one entry into the next: the spare.
        while j.files.open.len() < 2 {
            let next = 100 + j.written_lsn();
            put_same(&mut j, next);
        }
        sync(&mut j);
        assert!(!j.spares.is_ready(), "used for the next file");
        let last = j.files.open.back().unwrap().path.clone();
        assert!(
            std::fs::metadata(&last).unwrap().len() > 16 + 48,
            "old bytes behind"
        );
        let expected: Vec<u64> = {
            let (_, _, seen) = open(tmp.path(), 256, 2);
            seen.iter().map(|s| s.4).collect()
        };
        assert!(expected.iter().all(|&f| f >= 100), "{expected:?}");
    }

    #[test]
    fn a_restart_with_a_spare_writes_into_it_and_a_failed_spare_waits_for_the_next_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, _) = open(dir, 4096, 1);
        assert!(
            j.spare_due(),
            "no file yet: the first one is preallocated too"
        );
        j.spare_made(&j.spare_job(None).unwrap().run());
        put(&mut j, 1);
        sync(&mut j);
        assert!(j.files.open.back().unwrap().preallocated);
        assert!(!j.spare_due(), "not half full");
        j.spare_made(&j.spare_job(None).unwrap().run());
        drop(j);
        // The file written last was cut at its end: appending would grow it again.
        let (mut j, _, seen) = open(dir, 4096, 2);
        assert_eq!(seen.len(), 1);
        put(&mut j, 2);
        sync(&mut j);
        assert_eq!(j.files.open.len(), 2, "rolled into the spare");
        assert!(j.files.open.back().unwrap().preallocated);
        // A spare that cannot be made (a full disk) is not tried again on every pass.
        j.spare_made(&Err(io::Error::from_raw_os_error(28)));
        while 2 * j.files.open.back().unwrap().len < j.file_bytes {
            put(&mut j, 3);
        }
        assert!(!j.spare_due(), "failed for this file");
        while j.files.open.len() < 3 {
            put(&mut j, 4);
        }
        while 2 * j.files.open.back().unwrap().len < j.file_bytes {
            put(&mut j, 5);
        }
        assert!(j.spare_due(), "a new file tries again");
    }

    #[test]
    fn a_restart_with_a_spare_writes_into_an_empty_last_file_under_its_own_name() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let (mut j, _, _) = open(dir, 256, 1);
        while j.files.open.len() < 2 {
            put(&mut j, 7);
        }
        sync(&mut j);
        let last = j.files.open.back().unwrap().path.clone();
        j.spare_made(&j.spare_job(None).unwrap().run());
        drop(j);
        // The second file's entries were lost: its header is all that is left.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&last)
            .unwrap()
            .set_len(JOURNAL_FILE_HEADER_BYTES as u64)
            .unwrap();
        let (mut j, _, _) = open(dir, 256, 2);
        put(&mut j, 8);
        sync(&mut j);
        let names: Vec<&Path> = j.files.open.iter().map(|f| f.path.as_path()).collect();
        assert_eq!(names.len(), 2, "{names:?}");
        assert_eq!(names[1], last, "the empty file is written into");
        assert!(j.spares.is_ready(), "the spare waits for the next file");
    }

    #[test]
    fn the_synced_lsn_moves_only_over_a_completed_prefix_of_sync_jobs() {
        let tmp = tempfile::tempdir().unwrap();
        let (mut j, _, _) = open(tmp.path(), 256, 1);
        put(&mut j, 5);
        let first = j.take_sync_job().unwrap();
        for i in 0..8 {
            put(&mut j, i); // rolls: the second job covers newer files only
        }
        let second = j.take_sync_job().unwrap();
        second.run().unwrap();
        assert_eq!(
            j.sync_done(second.upto_lsn),
            0,
            "the first has not finished"
        );
        first.run().unwrap();
        assert_eq!(j.sync_done(first.upto_lsn), second.upto_lsn);
        j.check_invariants();
    }
}
