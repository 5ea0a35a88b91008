//! # Storage log: one append-only, segmented, checksummed log per topic partition
//!
//! This room is for putting records on disk and getting them back: it knows directories,
//! files, byte positions, sequences and fsync. It does not know sockets, ops, topics,
//! producers' dedup rules or mio. It may depend on std, memmap2, crc32fast and log, and on
//! nothing else in the crate; `broker/` calls it and converts [`StorageError`] into wire
//! error codes at that boundary.
//!
//! ## Life of a record
//!
//! 1. [`PartitionLog::append`] encodes the record into an in-memory write buffer and gives
//!    it the next sequence. No syscall: the reactor appends every PUB of a loop pass.
//! 2. [`PartitionLog::flush_with`] hands the new records to the node's journal, and they
//!    are WRITTEN (page cache) and readable. Their segment write is staged until
//!    [`STAGED_BYTES_MAX`] of them gather, a read reaches them, or a checkpoint,
//!    housekeeping or the close asks ([`PartitionLog::write_staged`]); then one
//!    `write_all` per segment touched takes them, and their index entries wait in memory
//!    until a page of them gathers (`segment.rs`). A failed segment write is undone whole:
//!    staged records stay staged, records not yet in the journal are dropped.
//!    [`PartitionLog::flush`] (journal replay, a cluster node's apply) writes at once.
//! 3. [`PartitionLog::take_sync_job`] hands a [`SyncJob`] to the fsync pool, which calls
//!    [`SyncJob::run`] on a worker thread; the reactor then calls `sync_done` (records
//!    are FSYNCED) or `sync_failed` (the partition is poisoned for good: see
//!    [`StorageError::Poisoned`]).
//! 4. [`PartitionLog::read`] serves consumers from read-only memory maps, verifying each
//!    record's CRC; [`PartitionLog::enforce_retention`] deletes whole closed segments.
//!
//! ## Files in a partition directory
//!
//! ```text
//! 00000000000000000001.log   segment: 16-byte header, then records (see record.rs)
//! 00000000000000000001.idx   index: one u32 BE byte position per record (see segment.rs)
//! 00000000000000000958.log   the next segment starts at the previous last sequence + 1
//! 00000000000000000958.idx
//! ```
//!
//! Every layout is drawn in the doc comment of the code that encodes it: `record.rs`
//! (record), `segment.rs` (segment header and index entry), `meta.rs` (meta files).
//! `docs/STORAGE.md` repeats them for operators.
//!
//! ## Invariants
//!
//! - `segments` is never empty; the last one is the active segment, the only one with a
//!   writer; sequences are contiguous across segments.
//! - Every byte below a segment's `len_bytes` was written by this process or verified by
//!   recovery, and is never rewritten; maps never extend past `len_bytes`.
//! - `synced_sequence <= segment_sequence <= written_sequence < next_sequence`; the
//!   records between `segment_sequence` and `written_sequence` are the staged ones.

pub mod journal;
pub mod journal2;
mod journal_files;
pub mod meta;
pub mod simdisk;
pub mod storage;

mod checkpoint;
mod error;
mod mmap;
mod purge;
mod record;
mod recovery;
mod segment;
#[cfg(test)]
mod tests;
mod time;

pub use error::{is_no_space_io, StorageError};
pub use journal::{JOURNAL_FILE_BYTES_MAX, JOURNAL_FILE_BYTES_MIN};
pub use purge::PurgeFiles;
pub use record::{
    decode as decode_record, encode as encode_record, RecordView, RECORD_BYTES_MAX,
    RECORD_KEY_BYTES_MAX, RECORD_OVERHEAD_BYTES, RECORD_VALUE_BYTES_MAX,
};
pub use recovery::{
    check_partition, Backup, Change, ChangeKind, CheckProblem, CheckReport, DamagedRecord,
    RecoveryReport,
};
pub use segment::{
    INDEX_ENTRY_BYTES, SEGMENT_BYTES_MAX, SEGMENT_FORMAT_VERSION, SEGMENT_HEADER_BYTES,
};
pub use storage::{FsStorage, Storage};

use checkpoint::{PointWrite, RecoveryPoint, RECOVERY_POINT_FILE};
use recovery::VerifyMode;
use segment::{encode_header, Segment, Writer, INDEX_UNWRITTEN_BYTES_MAX};
use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use storage::{FileRef, Open};

/// Default segment size when the operator sets none (`--segment-size`).
pub const SEGMENT_SIZE_BYTES_DEFAULT: u64 = 16 * 1024 * 1024;
/// Segments kept mapped at once per partition. Maps cost address space, which matters on
/// 32-bit hosts; the least recently read segment is unmapped first. The active segment
/// counts too.
pub const MAPPED_SEGMENTS_MAX: usize = 16;
/// After a flush, a write buffer that grew past this is shrunk back, so one burst does not
/// pin its peak memory for the life of the process.
pub const WRITE_BUFFER_RETAIN_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Records the journal holds wait in memory for their segment write until this many
/// bytes of them gather (or a read reaches them, a checkpoint needs them, housekeeping
/// comes or the log closes): with 64 partitions written in a pass, a write per partition
/// per pass covered about two records and parts of two pages, and those writes were what
/// FSYNC publish over 64 partitions waited on (`docs/BENCHMARKS.md`, round 8). Per
/// partition; 64 KiB is 16 pages per write.
pub const STAGED_BYTES_MAX: usize = 64 * 1024;
/// Records per batch when `scan_headers` walks the log.
const SCAN_HEADERS_BATCH_RECORDS: usize = 1024;

const _: () = assert!(SEGMENT_SIZE_BYTES_DEFAULT <= SEGMENT_BYTES_MAX);
const _: () = assert!(
    MAPPED_SEGMENTS_MAX >= 2,
    "a read must map one segment beside the active"
);

/// Per-partition storage settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogConfig {
    /// `--segment-size`: a segment is rolled when the next record would take it past this
    /// size. A record larger than this still goes in whole, alone in its own segment.
    /// 1..=SEGMENT_BYTES_MAX.
    pub segment_size_bytes: u64,
    /// `--retention-size`: delete the oldest closed segments while the partition is
    /// bigger. 0 = unlimited.
    pub retention_size_bytes: u64,
    /// `--retention-age`: delete closed segments whose newest record is older than this.
    /// 0 = unlimited.
    pub retention_age_ms: u64,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_size_bytes: SEGMENT_SIZE_BYTES_DEFAULT,
            retention_size_bytes: 0,
            retention_age_ms: 0,
        }
    }
}

impl LogConfig {
    fn validate(&self) -> Result<(), StorageError> {
        if self.segment_size_bytes == 0 || self.segment_size_bytes > SEGMENT_BYTES_MAX {
            return Err(StorageError::InvalidConfig {
                reason: format!(
                    "segment_size_bytes {} not in 1..={SEGMENT_BYTES_MAX}",
                    self.segment_size_bytes
                ),
            });
        }
        Ok(())
    }
}

/// What a [`PartitionLog::read`] delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadOutcome {
    /// Records passed to the callback.
    pub records: usize,
    /// Their key + value bytes (what `max_bytes` limits).
    pub bytes: usize,
    /// Where the next read should start: one past the last record delivered, or the
    /// (clamped) start when none was.
    pub next_sequence: u64,
    /// Sequences below `first_sequence` that were asked for but deleted by retention
    /// (the caller counts these as skipped).
    pub skipped: u64,
}

/// What [`PartitionLog::enforce_retention`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionReport {
    pub segments_deleted: u32,
    pub bytes_deleted: u64,
    /// Oldest retained sequence afterwards.
    pub first_sequence: u64,
    /// A segment due for deletion holds records past `saved_through`: it goes once the
    /// caller saved them.
    pub waits_for_save: bool,
}

/// Snapshot for `/stats` and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionStats {
    pub first_sequence: u64,
    pub next_sequence: u64,
    pub written_sequence: u64,
    /// Highest durable sequence (synced in its segment or in the journal).
    pub synced_sequence: u64,
    /// Bytes in segment files, headers included; indexes and staged records not counted.
    pub bytes: u64,
    pub segments: u32,
    pub pending_bytes: usize,
    pub poisoned: bool,
}

/// One group-commit fdatasync, built on the reactor thread, run on an fsync worker.
#[derive(Debug)]
pub struct SyncJob {
    storage: Arc<dyn Storage>,
    /// Every segment file written since the previous job.
    pub files: Vec<FileRef>,
    /// Set when a segment file was created since the previous job: its directory entry
    /// must be made durable too, or a crash could lose the whole file.
    pub sync_dir: Option<PathBuf>,
    /// After a successful run, every sequence up to this one is durable.
    pub upto_sequence: u64,
    /// Moves the recovery point to what earlier jobs made durable, after the syncs.
    point: Option<PointWrite>,
}

impl SyncJob {
    /// fdatasyncs every file, then fsyncs the directory if asked. Blocks: call it from an
    /// fsync worker thread, never from the reactor. On error the caller must report
    /// `sync_failed` and never run the same job again as if nothing happened.
    pub fn run(&self) -> io::Result<()> {
        for file in &self.files {
            file.write_back(0)?;
            file.sync_data()?;
        }
        if let Some(dir) = &self.sync_dir {
            self.storage.sync_dir(dir)?;
        }
        match &self.point {
            Some(point) => point.run(),
            None => Ok(()),
        }
    }
}

/// A sync job taken and not yet reported.
#[derive(Debug, Clone, Copy)]
struct InFlightSync {
    upto_sequence: u64,
    done: bool,
    /// Where `upto_sequence` ends: the recovery point it makes possible.
    at: RecoveryPoint,
    /// The job writes `at` as the recovery point once its syncs are done.
    moves_point: bool,
}

/// A buffered, not yet flushed record: its encoded length in `write_buf`.
struct PendingRecord {
    len: u32,
    timestamp_ms: u64,
}

/// State to put back when a flush fails part way.
struct FlushUndo {
    segments: usize,
    len_bytes: u64,
    record_count: u64,
    last_timestamp_ms: Option<u64>,
}

/// Test-only fault injection: fail the Nth write after writing half its bytes, the way a
/// disk that fills up mid-write does. Zero-sized and inert outside tests.
#[derive(Default)]
struct FaultHook {
    #[cfg(test)]
    fail_write: std::cell::Cell<Option<(u32, i32)>>,
}

impl FaultHook {
    fn before_write(&self, file: &FileRef, position: u64, bytes: &[u8]) -> io::Result<()> {
        #[cfg(test)]
        if let Some((writes_left, errno)) = self.fail_write.get() {
            if writes_left == 0 {
                self.fail_write.set(None);
                file.write_at(position, &bytes[..bytes.len() / 2])?;
                return Err(io::Error::from_raw_os_error(errno));
            }
            self.fail_write.set(Some((writes_left - 1, errno)));
        }
        let _ = (file, position, bytes);
        Ok(())
    }
}

/// Positioned write: after an undo truncates, a file cursor would lie.
fn write_at(
    fault: &FaultHook,
    file: &FileRef,
    path: &Path,
    position: u64,
    bytes: &[u8],
) -> Result<(), StorageError> {
    fault
        .before_write(file, position, bytes)
        .and_then(|()| file.write_at(position, bytes))
        .map_err(|e| StorageError::from_io(path, Some(position), e))
}

/// Decodes the record at `position` of a mapped segment and insists on `sequence`.
/// Never returns wrong data: any mismatch is `Corrupt`, logged with path and position.
fn decode_mapped<'m>(
    bytes: &'m [u8],
    position: u64,
    sequence: u64,
    path: &Path,
) -> Result<(RecordView<'m>, usize), StorageError> {
    decode_mapped_checking(bytes, (position, sequence), path, record::Crc::Check)
}

fn decode_mapped_checking<'m>(
    bytes: &'m [u8],
    (position, sequence): (u64, u64),
    path: &Path,
    crc: record::Crc,
) -> Result<(RecordView<'m>, usize), StorageError> {
    let tail = bytes.get(position as usize..).unwrap_or(&[]);
    record::decode_checking(tail, Some(sequence), crc).map_err(|e| {
        log::error!(
            "{}: corrupt record at byte {position} (sequence {sequence}): {e}",
            path.display()
        );
        StorageError::Corrupt {
            path: path.to_path_buf(),
            position,
            reason: e.to_string(),
        }
    })
}

/// Byte position of `sequence` in its mapped segment, from the mapped index.
fn index_position(seg: &Segment, sequence: u64) -> Result<u64, StorageError> {
    seg.position_of(sequence).map_err(|reason| {
        let position = (sequence - seg.first_sequence) * INDEX_ENTRY_BYTES as u64;
        log::error!(
            "{}: bad index entry at byte {position}: {reason}",
            seg.idx_path.display()
        );
        StorageError::Corrupt {
            path: seg.idx_path.clone(),
            position,
            reason,
        }
    })
}

/// Makes every recovered segment durable as it is now (recovery may have cut it) and
/// opens the last one for appending.
fn sync_and_open_writer(
    storage: &dyn Storage,
    segments: &mut [Segment],
) -> Result<(), StorageError> {
    let io = |path: &Path, e: io::Error| StorageError::from_io(path, None, e);
    let last_i = segments.len() - 1;
    for (i, seg) in segments.iter_mut().enumerate() {
        let log = storage.open(&seg.log_path, Open::ReadWrite);
        let log = log.map_err(|e| io(&seg.log_path, e))?;
        log.sync_data().map_err(|e| io(&seg.log_path, e))?;
        if i == last_i {
            let idx = storage.open(&seg.idx_path, Open::Create);
            let idx = idx.map_err(|e| io(&seg.idx_path, e))?;
            seg.writer = Some(Writer { log, idx });
        }
    }
    Ok(())
}

/// Moves the recovery point to the end of the last segment, all of which is durable now:
/// a stale point could name a segment recovery just removed, whose first sequence a new
/// segment may take again.
fn point_at_open(
    storage: &dyn Storage,
    dir: &Path,
    segments: &[Segment],
    found: Option<RecoveryPoint>,
) -> Result<(FileRef, RecoveryPoint), StorageError> {
    let path = dir.join(RECOVERY_POINT_FILE);
    let io = |e: io::Error| StorageError::from_io(&path, None, e);
    let file = storage.open(&path, Open::Create).map_err(io)?;
    let last = segments.last().expect("a partition always has a segment");
    let at = RecoveryPoint {
        segment_first: last.first_sequence,
        records: last.record_count,
        end_position: last.len_bytes,
    };
    let writer = last.writer.as_ref().expect("the last segment has a writer");
    if found == Some(at) {
        // Recovery may have rewritten the index all the same (entries past the point):
        // the point trusts the entries before it to be durable.
        writer
            .idx
            .sync_data()
            .map_err(|e| StorageError::from_io(&last.idx_path, None, e))?;
    } else {
        let write = PointWrite {
            index: Arc::clone(&writer.idx),
            file: Arc::clone(&file),
            point: at,
        };
        write.run().map_err(io)?;
    }
    Ok((file, at))
}

/// The log of one topic partition, living in its own directory. Single-threaded: owned by
/// the reactor; only [`SyncJob`]s cross to other threads.
pub struct PartitionLog {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    config: LogConfig,
    /// Oldest first; never empty; the last is the active segment.
    segments: Vec<Segment>,
    /// Encoded records not in a segment yet, back to back: the staged ones first.
    write_buf: Vec<u8>,
    pending: Vec<PendingRecord>,
    /// The first `staged` of `pending` (the first `staged_bytes` of `write_buf`) are in
    /// the node's journal and wait for their segment write (`flush_with`).
    staged: usize,
    staged_bytes: usize,
    /// Highest sequence written to a segment file.
    segment_sequence: u64,
    synced_sequence: u64,
    /// `segment_sequence` when the last sync job was taken.
    sync_taken_sequence: u64,
    /// Sync jobs taken and not yet reported, oldest first: the `upto_sequence` of each
    /// and whether it completed. The synced watermark moves only over a completed prefix:
    /// a later job may cover only a newer segment (after a roll), so its success says
    /// nothing about the files of the jobs before it.
    syncs_in_flight: VecDeque<InFlightSync>,
    /// Highest sequence the node's journal made durable (`journal.rs`); the segment
    /// itself may not be synced that far yet.
    journaled_sequence: u64,
    /// The journal counts no record past this one: the cut of an undone write here
    /// could not be synced, so a power cut may bring the undone records back at the
    /// sequences later records took (`undo_not_durable`).
    journal_cap: Option<u64>,
    /// Where `synced_sequence` ends (within the segment holding it).
    synced_at: RecoveryPoint,
    /// The recovery point last written (by a completed job, or at open).
    point_sent: RecoveryPoint,
    point_file: FileRef,
    /// Segment files written since the last sync job (no duplicates).
    unsynced_files: Vec<FileRef>,
    /// A segment file was created since the last sync job.
    dir_dirty: bool,
    /// Why writes are refused, once an fsync (or a failed-write undo) has failed.
    poisoned: Option<String>,
    /// A failed write could not be undone: the files no longer match memory, so not even
    /// staged records are written to them.
    undo_failed: bool,
    map_tick: u64,
    mapped_segments: usize,
    /// What [`PartitionLog::read_one_in_pass`] checked in its caller's current pass.
    checked: CheckedRun,
    fault: FaultHook,
}

#[cfg(test)]
thread_local! {
    /// CRCs [`PartitionLog::read_one_in_pass`] computed on this thread.
    static CRCS_IN_PASS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Consecutive records whose CRC one pass of the caller checked, in one map of one
/// segment (docs/DECISIONS.md, "One CRC check per delivery").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct CheckedRun {
    pass: u64,
    segment: u64,
    /// Where the segment's map starts: a map replaced since is not the one checked.
    map_at: usize,
    from: u64,
    to: u64,
}

impl CheckedRun {
    fn covers(&self, at: &CheckedRun, sequence: u64) -> bool {
        (self.pass, self.segment, self.map_at) == (at.pass, at.segment, at.map_at)
            && (self.from..self.to).contains(&sequence)
    }

    /// `sequence` was checked just now: the run grows by it, or starts again at it.
    fn note(&mut self, at: CheckedRun, sequence: u64) {
        let same = (self.pass, self.segment, self.map_at) == (at.pass, at.segment, at.map_at);
        if !(same && self.to == sequence) {
            *self = CheckedRun {
                from: sequence,
                ..at
            };
        }
        self.to = sequence + 1;
    }
}

/// A new partition's first segment (sequence 1), written with its empty index.
fn first_segment(
    storage: &dyn Storage,
    dir: &Path,
    report: &mut RecoveryReport,
) -> Result<Segment, StorageError> {
    let io = |path: &Path, e: io::Error| StorageError::from_io(path, None, e);
    let seg = Segment::new(dir, 1, SEGMENT_HEADER_BYTES as u64, 0);
    storage
        .write(&seg.log_path, &encode_header(1))
        .map_err(|e| io(&seg.log_path, e))?;
    storage
        .write(&seg.idx_path, &[])
        .map_err(|e| io(&seg.idx_path, e))?;
    report.segments = 1;
    report.first_sequence = 1;
    report.next_sequence = 1;
    Ok(seg)
}

/// A log closed in an orderly way leaves its segment and index whole, so the next open has
/// nothing to replay or rebuild. A crash loses the staged records (the journal has them)
/// and the unwritten entries, which recovery rebuilds from the records.
impl Drop for PartitionLog {
    fn drop(&mut self) {
        if self.poisoned.is_none() {
            if let Err(e) = self.write_staged() {
                log::warn!("{}: staged records not written: {e}", self.dir.display());
            }
            if let Err(e) = self.write_index_tail() {
                log::warn!("{}: index entries not written: {e}", self.dir.display());
            }
        }
    }
}

impl PartitionLog {
    /// Opens (creating if missing) the partition in `dir` and recovers it: checks every
    /// closed segment cheaply, verifies the last segment's tail record by record,
    /// truncates at the first bad record, rebuilds indexes that do not agree, and fsyncs
    /// what it keeps so `synced_sequence() == written_sequence()` afterwards (the previous
    /// process may have died with written-but-unsynced records still in the page cache).
    pub fn open(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        config: LogConfig,
    ) -> Result<(PartitionLog, RecoveryReport), StorageError> {
        config.validate()?;
        let io = |path: &Path, e: io::Error| StorageError::from_io(path, None, e);
        storage::create_dir_durable(&**storage, dir).map_err(|e| io(dir, e))?;
        let (recovered, mut report, point) =
            recovery::recover(&**storage, dir, VerifyMode::Tails, true)?;
        let mut segments: Vec<Segment> = recovered
            .iter()
            .map(|r| {
                let mut s = Segment::new(dir, r.first_sequence, r.len_bytes, r.record_count);
                s.last_timestamp_ms = r.last_timestamp_ms;
                s
            })
            .collect();
        if segments.is_empty() {
            segments.push(first_segment(&**storage, dir, &mut report)?);
        }
        sync_and_open_writer(&**storage, &mut segments)?;
        let (point_file, at) = point_at_open(&**storage, dir, &segments, point)?;
        storage.sync_dir(dir).map_err(|e| io(dir, e))?;
        let written = segments[segments.len() - 1].end_sequence() - 1;
        if !report.is_clean() {
            log::warn!("{}: recovered with data loss: {report:?}", dir.display());
        } else if report.indexes_rebuilt > 0 {
            log::info!(
                "{}: recovered, {} index(es) rebuilt",
                dir.display(),
                report.indexes_rebuilt
            );
        }
        let log = PartitionLog {
            storage: Arc::clone(storage),
            dir: dir.to_path_buf(),
            config,
            segments,
            write_buf: Vec::new(),
            pending: Vec::new(),
            staged: 0,
            staged_bytes: 0,
            segment_sequence: written,
            synced_sequence: written,
            journaled_sequence: written,
            journal_cap: None,
            sync_taken_sequence: written,
            syncs_in_flight: VecDeque::new(),
            synced_at: at,
            point_sent: at,
            point_file,
            unsynced_files: Vec::new(),
            dir_dirty: false,
            poisoned: None,
            undo_failed: false,
            map_tick: 0,
            mapped_segments: 0,
            checked: CheckedRun::default(),
            fault: FaultHook::default(),
        };
        Ok((log, report))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn config(&self) -> LogConfig {
        self.config
    }

    fn check_poisoned(&self) -> Result<(), StorageError> {
        match &self.poisoned {
            None => Ok(()),
            Some(reason) => Err(StorageError::Poisoned {
                path: self.dir.clone(),
                reason: reason.clone(),
            }),
        }
    }

    fn active(&self) -> &Segment {
        self.segments
            .last()
            .expect("a partition always has an active segment")
    }

    /// Buffers one record and returns its sequence. Encodes into memory only; the record
    /// is not readable and not on disk until [`flush`](Self::flush). The log assigns the
    /// sequence: `rec.sequence` must be [`next_sequence`](Self::next_sequence) (checked in
    /// debug builds; the log's own value is written either way).
    pub fn append(&mut self, rec: &RecordView<'_>) -> Result<u64, StorageError> {
        self.check_poisoned()?;
        if rec.key.len() > RECORD_KEY_BYTES_MAX || rec.value.len() > RECORD_VALUE_BYTES_MAX {
            return Err(StorageError::RecordTooLarge {
                key_bytes: rec.key.len(),
                value_bytes: rec.value.len(),
            });
        }
        let sequence = self.next_sequence();
        debug_assert_eq!(rec.sequence, sequence, "append out of sequence");
        let start = self.write_buf.len();
        record::encode(&mut self.write_buf, &RecordView { sequence, ..*rec });
        let len = (self.write_buf.len() - start) as u32;
        self.pending.push(PendingRecord {
            len,
            timestamp_ms: rec.timestamp_ms,
        });
        Ok(sequence)
    }

    /// Writes every buffered record: one `write_all` per segment touched (one in the
    /// common case); the index entries are written once a page of them gathers. Rolls to
    /// a new segment when the next record would pass `segment_size_bytes`. On failure
    /// (ENOSPC -> `NoSpace`, EIO -> `Io`) the files are cut back to their last good
    /// length, new segments are removed, the records appended since the last flush are
    /// dropped and `next_sequence` goes back to `written_sequence + 1`: the caller fails
    /// every append since the last flush. Staged records (already in the journal) stay
    /// staged.
    pub fn flush(&mut self) -> Result<(), StorageError> {
        self.check_poisoned()?;
        if self.pending.is_empty() {
            return Ok(());
        }
        let all = self.pending.len();
        let bytes = self.write_pending(all)?;
        self.written(all, bytes);
        Ok(())
    }

    /// Hands `journal` the records appended since the last flush (their first sequence,
    /// their count and their bytes, back to back), which makes them WRITTEN and readable.
    /// Their segment write waits in memory (staged) until [`STAGED_BYTES_MAX`] of them
    /// gather, a read reaches them, a checkpoint needs them, housekeeping comes or the log
    /// closes (`docs/STORAGE.md`, "Writes and durability"). When this flush brings the
    /// staged bytes to the limit, everything is written to the segment first, and the new
    /// records go to the journal only if that succeeds: on failure they are dropped, as
    /// [`flush`](Self::flush) drops them, and the staged ones stay.
    pub fn flush_with(
        &mut self,
        journal: impl FnOnce(u64, u32, &[u8]),
    ) -> Result<(), StorageError> {
        self.check_poisoned()?;
        if self.pending.len() == self.staged {
            return Ok(());
        }
        let first_sequence = self.segment_sequence + 1 + self.staged as u64;
        let count = (self.pending.len() - self.staged) as u32;
        let fresh_from = self.staged_bytes;
        if self.write_buf.len() < STAGED_BYTES_MAX {
            journal(first_sequence, count, &self.write_buf[fresh_from..]);
            (self.staged, self.staged_bytes) = (self.pending.len(), self.write_buf.len());
            return Ok(());
        }
        let all = self.pending.len();
        let bytes = self.write_pending(all)?;
        journal(first_sequence, count, &self.write_buf[fresh_from..bytes]);
        self.written(all, bytes);
        Ok(())
    }

    /// Writes the staged records (those in the journal) to their segment now. On failure
    /// they stay staged and the files are cut back; a later call writes them again. A
    /// partition poisoned by a failed sync still writes them (its files are as its memory
    /// says, and they were acknowledged WRITTEN), one poisoned by a failed undo does not.
    pub fn write_staged(&mut self) -> Result<(), StorageError> {
        if self.staged == 0 {
            return Ok(());
        }
        if self.undo_failed {
            self.check_poisoned()?;
        }
        let (count, bytes) = (self.staged, self.staged_bytes);
        self.write_pending(count)?;
        self.written(count, bytes);
        Ok(())
    }

    /// Records staged for their segment write, and their bytes.
    pub fn staged(&self) -> (usize, usize) {
        (self.staged, self.staged_bytes)
    }

    /// Writes the first `count` pending records (at least the staged ones) to their
    /// segment and returns their bytes; the caller then calls `written`. On failure undoes
    /// the write and drops the pending records that are not staged.
    fn write_pending(&mut self, count: usize) -> Result<usize, StorageError> {
        debug_assert!(count >= self.staged && count <= self.pending.len());
        let active = self.active();
        let undo = FlushUndo {
            segments: self.segments.len(),
            len_bytes: active.len_bytes,
            record_count: active.record_count,
            last_timestamp_ms: active.last_timestamp_ms,
        };
        match self.flush_write(count) {
            Ok((mut touched, bytes)) => {
                // Segments closed by this flush give up their descriptors; sync jobs keep
                // theirs alive through the Arc until the data is durable. A closed
                // segment's index is synced once, with its last records: recovery trusts
                // a closed segment's index after a cheap check (`recovery.rs`).
                let last = self.segments.len() - 1;
                for seg in &mut self.segments[undo.segments - 1..last] {
                    if let Some(w) = seg.writer.take() {
                        touched.push(w.idx);
                    }
                }
                for file in touched {
                    if !self.unsynced_files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                        self.unsynced_files.push(file);
                    }
                }
                self.segment_sequence = self.active().end_sequence() - 1;
                Ok(bytes)
            }
            Err(err) => {
                let dropped = self.pending.len() - self.staged;
                log::error!(
                    "{}: segment write failed, {dropped} new records dropped, {} staged \
                     kept: {err}",
                    self.dir.display(),
                    self.staged
                );
                self.flush_undo(undo);
                self.pending.truncate(self.staged);
                self.write_buf.truncate(self.staged_bytes);
                Err(err)
            }
        }
    }

    /// The first `count` pending records (`bytes` of the buffer) are in their segment.
    fn written(&mut self, count: usize, bytes: usize) {
        self.pending.drain(..count);
        self.write_buf.drain(..bytes);
        (self.staged, self.staged_bytes) = (0, 0);
        if self.write_buf.capacity() > WRITE_BUFFER_RETAIN_BYTES_MAX {
            let keep = self.write_buf.len().max(WRITE_BUFFER_RETAIN_BYTES_MAX);
            self.write_buf.shrink_to(keep);
        }
    }

    /// The writes of the first `count` pending records; returns the files written and the
    /// bytes. Mutates segment lengths as each chunk lands; `flush_undo` puts them back if
    /// a later chunk fails.
    fn flush_write(&mut self, count: usize) -> Result<(Vec<FileRef>, usize), StorageError> {
        let limit = self.config.segment_size_bytes;
        let mut touched: Vec<FileRef> = Vec::new();
        let mut i = 0;
        let mut buf_pos = 0usize;
        while i < count {
            let active = self.segments.last_mut().expect("active segment");
            let unwritten_before = active.idx_unwritten.len();
            let mut chunk_bytes = 0u64;
            let mut j = i;
            while j < count {
                let rec = self.pending[j].len as u64;
                let records_before = active.record_count + (j - i) as u64;
                // An empty segment takes any record, however large: it gets one of its own.
                if records_before > 0 && active.len_bytes + chunk_bytes + rec > limit {
                    break;
                }
                let position = active.len_bytes + chunk_bytes;
                debug_assert!(position <= u32::MAX as u64);
                active
                    .idx_unwritten
                    .extend_from_slice(&(position as u32).to_be_bytes());
                chunk_bytes += rec;
                j += 1;
            }
            if j == i {
                self.seal_active_index()?;
                self.flush_roll()?;
                continue;
            }
            let w = active
                .writer
                .as_ref()
                .expect("the active segment has a writer");
            let bytes = &self.write_buf[buf_pos..buf_pos + chunk_bytes as usize];
            let written = write_at(
                &self.fault,
                &w.log,
                &active.log_path,
                active.len_bytes,
                bytes,
            );
            if let Err(e) = written {
                active.idx_unwritten.truncate(unwritten_before);
                return Err(e);
            }
            if !touched.iter().any(|f| Arc::ptr_eq(f, &w.log)) {
                touched.push(Arc::clone(&w.log));
            }
            active.len_bytes += chunk_bytes;
            active.record_count += (j - i) as u64;
            active.last_timestamp_ms = Some(self.pending[j - 1].timestamp_ms);
            buf_pos += chunk_bytes as usize;
            i = j;
            if active.idx_unwritten.len() >= INDEX_UNWRITTEN_BYTES_MAX {
                self.write_index_tail()?;
            }
        }
        Ok((touched, buf_pos))
    }

    /// Writes the active segment's unwritten index entries to its index file.
    fn write_index_tail(&mut self) -> Result<(), StorageError> {
        let active = self.segments.last_mut().expect("active segment");
        if active.idx_unwritten.is_empty() {
            return Ok(());
        }
        let w = active
            .writer
            .as_ref()
            .expect("the active segment has a writer");
        let at = active.index_file_bytes() as u64;
        write_at(
            &self.fault,
            &w.idx,
            &active.idx_path,
            at,
            &active.idx_unwritten,
        )?;
        active.idx_unwritten.clear();
        Ok(())
    }

    /// Seals the index of the active segment before it closes (`segment.rs`): writes its
    /// unwritten entries and, in the same write, the crc of all of them (those in the
    /// file read back from the page cache the earlier writes left them in).
    fn seal_active_index(&mut self) -> Result<(), StorageError> {
        let active = self.segments.last_mut().expect("active segment");
        let w = active
            .writer
            .as_ref()
            .expect("the active segment has a writer");
        let in_file = active.index_file_bytes();
        let mut entries = vec![0u8; in_file];
        storage::read_exact_at(&*w.idx, 0, &mut entries)
            .map_err(|e| StorageError::from_io(&active.idx_path, Some(0), e))?;
        entries.extend_from_slice(&active.idx_unwritten);
        let seal = segment::index_seal(&entries);
        entries.extend_from_slice(&seal);
        let tail = &entries[in_file..];
        write_at(&self.fault, &w.idx, &active.idx_path, in_file as u64, tail)?;
        active.idx_unwritten.clear();
        Ok(())
    }

    /// Starts a new segment after the active one. The old one keeps its writer until the
    /// flush commits, so an undo can still cut it back.
    fn flush_roll(&mut self) -> Result<(), StorageError> {
        let first = self.active().end_sequence();
        let mut seg = Segment::new(&self.dir, first, SEGMENT_HEADER_BYTES as u64, 0);
        let io = |path: &Path, e: io::Error| StorageError::from_io(path, None, e);
        let log = self.storage.open(&seg.log_path, Open::CreateNew);
        let log = log.map_err(|e| io(&seg.log_path, e))?;
        self.dir_dirty = true;
        // A stale index of the same name (an earlier undone roll) must not survive.
        let idx = match self.storage.write(&seg.idx_path, &[]) {
            Ok(()) => self.storage.open(&seg.idx_path, Open::ReadWrite),
            Err(e) => Err(e),
        };
        let idx = match idx {
            Ok(f) => f,
            Err(e) => {
                let _ = self.storage.remove_file(&seg.log_path);
                return Err(io(&seg.idx_path, e));
            }
        };
        seg.writer = Some(Writer { log, idx });
        self.segments.push(seg);
        let seg = self.active();
        let w = seg.writer.as_ref().expect("just set");
        write_at(&self.fault, &w.log, &seg.log_path, 0, &encode_header(first))?;
        log::debug!(
            "{}: rolled to a new segment at sequence {first}",
            self.dir.display()
        );
        Ok(())
    }

    /// Puts the files and counters back to `undo` after a failed flush. If that fails too
    /// the files no longer match memory, so the partition is poisoned.
    fn flush_undo(&mut self, undo: FlushUndo) {
        let mut failure: Option<String> = None;
        while self.segments.len() > undo.segments {
            // The removals must be durable before a later record can be acknowledged.
            self.dir_dirty = true;
            let seg = self.segments.pop().expect("len checked");
            for path in [&seg.log_path, &seg.idx_path] {
                match self.storage.remove_file(path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => failure = Some(format!("removing {}: {e}", path.display())),
                }
            }
        }
        let active = self.segments.last_mut().expect("active segment");
        // Entries of the undone records go, in memory or in the file; the file keeps any
        // of the older records' that a full tail or a seal put there.
        let in_file = active.index_file_bytes();
        let kept = undo.record_count as usize * INDEX_ENTRY_BYTES;
        active.idx_unwritten.truncate(kept.saturating_sub(in_file));
        if let Some(w) = &active.writer {
            if let Err(e) = w.log.set_len(undo.len_bytes) {
                failure = Some(format!("truncating {}: {e}", active.log_path.display()));
            }
            let idx_len = in_file.min(kept) as u64;
            if let Err(e) = w.idx.set_len(idx_len) {
                failure = Some(format!("truncating {}: {e}", active.idx_path.display()));
            }
            // The next sync job makes the truncation durable too: a power cut that kept
            // the failed write but lost the cut would put unacknowledged records back.
            for file in [&w.log, &w.idx] {
                if !self.unsynced_files.iter().any(|f| Arc::ptr_eq(f, file)) {
                    self.unsynced_files.push(Arc::clone(file));
                }
            }
        }
        active.len_bytes = undo.len_bytes;
        active.record_count = undo.record_count;
        active.last_timestamp_ms = undo.last_timestamp_ms;
        if let Some(reason) = failure {
            log::error!(
                "{}: undo of a failed flush failed, poisoning: {reason}",
                self.dir.display()
            );
            self.poisoned = Some(reason);
            self.undo_failed = true;
        }
    }

    /// Bytes appended and not yet flushed (staged records are flushed).
    pub fn pending_bytes(&self) -> usize {
        self.write_buf.len() - self.staged_bytes
    }

    /// The sequence the next append gets.
    /// Each segment's file and the bytes flushed to it, oldest first: what a copy of the
    /// partition must hold (a cluster's INSTALL). Bytes below these lengths are never
    /// rewritten.
    pub fn segment_files(&self) -> Vec<(PathBuf, u64)> {
        debug_assert_eq!(
            self.staged, 0,
            "a cluster node writes what it applies at once"
        );
        let files = self.segments.iter();
        files.map(|s| (s.log_path.clone(), s.len_bytes)).collect()
    }

    pub fn next_sequence(&self) -> u64 {
        self.segment_sequence + 1 + self.pending.len() as u64
    }

    /// The oldest retained sequence; equals `written_sequence() + 1` when nothing is kept.
    pub fn first_sequence(&self) -> u64 {
        self.segments[0].first_sequence
    }

    /// Highest sequence flushed: written to a segment file, or staged for that write
    /// after the journal took it (0 if none ever was). Every record up to it is readable.
    pub fn written_sequence(&self) -> u64 {
        self.segment_sequence + self.staged as u64
    }

    /// Highest sequence covered by a completed sync job (or by the fsync at open).
    pub fn synced_sequence(&self) -> u64 {
        self.synced_sequence
    }

    /// Highest sequence that survives a power cut: synced in its segment, or in the
    /// journal.
    pub fn durable_sequence(&self) -> u64 {
        self.synced_sequence.max(self.journaled_sequence)
    }

    /// The journal made every record up to `upto` durable. Poisoned or not: a segment
    /// whose own sync failed still had these records handed to the journal, whose sync
    /// succeeded, and a restart replays them from it; their PUBs wait for this (they
    /// went unanswered when a checkpoint's segment sync failed while they waited).
    pub fn journal_durable(&mut self, upto: u64) {
        let upto = upto
            .min(self.written_sequence())
            .min(self.journal_cap.unwrap_or(u64::MAX));
        self.journaled_sequence = self.journaled_sequence.max(upto);
    }

    /// The sync of an undone write's cut failed: the undone records may come back after
    /// a power cut at their sequences, which records written since took, so nothing past
    /// `undo_point` (the last record before them) counts as durable until a restart
    /// re-reads the disk, and the partition refuses writes.
    pub fn undo_not_durable(&mut self, undo_point: u64, err: &io::Error) {
        let cap = self.journal_cap.map_or(undo_point, |c| c.min(undo_point));
        self.journal_cap = Some(cap);
        self.sync_failed(err);
    }

    /// Start-up replay of a journal entry: appends those of its records (`first_sequence`
    /// on, encoded back to back) that the log lost; returns how many. The caller flushes.
    /// A record after a gap cannot be appended: the gap is returned as an error.
    pub fn replay(&mut self, first_sequence: u64, records: &[u8]) -> Result<u64, StorageError> {
        let mut appended = 0;
        let mut pos = 0;
        let mut sequence = first_sequence;
        while pos < records.len() {
            let (rec, len) = record::decode(&records[pos..], Some(sequence)).map_err(|e| {
                StorageError::Corrupt {
                    path: self.dir.clone(),
                    position: pos as u64,
                    reason: format!("journal entry record {sequence}: {e}"),
                }
            })?;
            let next = self.next_sequence();
            if sequence > next {
                return Err(StorageError::Corrupt {
                    path: self.dir.clone(),
                    position: 0,
                    reason: format!(
                        "journal holds sequence {sequence}, the log ends before {next}"
                    ),
                });
            }
            if sequence == next {
                self.append_encoded(&rec, &records[pos..pos + len])?;
                appended += 1;
            }
            pos += len;
            sequence += 1;
        }
        Ok(appended)
    }

    /// [`append`](Self::append) of a record already encoded and checked (`bytes`, which
    /// `rec` was decoded from at the next sequence): copied as it is, not encoded and
    /// checksummed again (a cluster node applies every record this way).
    fn append_encoded(&mut self, rec: &RecordView<'_>, bytes: &[u8]) -> Result<u64, StorageError> {
        self.check_poisoned()?;
        let sequence = self.next_sequence();
        debug_assert_eq!(rec.sequence, sequence, "append out of sequence");
        self.write_buf.extend_from_slice(bytes);
        self.pending.push(PendingRecord {
            len: bytes.len() as u32,
            timestamp_ms: rec.timestamp_ms,
        });
        Ok(sequence)
    }

    /// The fdatasync work for everything flushed since the previous job, or None if there
    /// is none (or the partition is poisoned: nothing it writes can be acknowledged).
    /// When no other job is in flight, the job also moves the recovery point to where the
    /// log ends now, after its own syncs (`checkpoint.rs`): a job taken while another
    /// runs cannot vouch for the other's files.
    pub fn take_sync_job(&mut self) -> Option<SyncJob> {
        if self.poisoned.is_some() || self.segment_sequence <= self.sync_taken_sequence {
            return None;
        }
        // The point vouches for index entries too: they go to the file first. Should that
        // write fail, the point stops where the file's entries do (recovery reads the rest).
        if let Err(e) = self.write_index_tail() {
            log::warn!("{}: index entries not written: {e}", self.dir.display());
        }
        let active = self.active();
        let at = RecoveryPoint {
            segment_first: active.first_sequence,
            records: (active.index_file_bytes() / INDEX_ENTRY_BYTES) as u64,
            end_position: match active.idx_unwritten.first_chunk::<INDEX_ENTRY_BYTES>() {
                Some(first) => u64::from(u32::from_be_bytes(*first)),
                None => active.len_bytes,
            },
        };
        let point = match (&active.writer, self.syncs_in_flight.is_empty()) {
            (Some(writer), true) => Some(PointWrite {
                index: Arc::clone(&writer.idx),
                file: Arc::clone(&self.point_file),
                point: at,
            }),
            _ => None,
        };
        let job = SyncJob {
            storage: Arc::clone(&self.storage),
            files: std::mem::take(&mut self.unsynced_files),
            sync_dir: self.dir_dirty.then(|| self.dir.clone()),
            upto_sequence: self.segment_sequence,
            point,
        };
        self.dir_dirty = false;
        self.sync_taken_sequence = self.segment_sequence;
        self.syncs_in_flight.push_back(InFlightSync {
            upto_sequence: job.upto_sequence,
            done: false,
            at,
            moves_point: job.point.is_some(),
        });
        Some(job)
    }

    /// The job taken with this `upto_sequence` completed. Every record up to it is
    /// durable once every job taken before it has completed too.
    pub fn sync_done(&mut self, upto_sequence: u64) {
        if let Some(entry) = self
            .syncs_in_flight
            .iter_mut()
            .find(|s| s.upto_sequence == upto_sequence)
        {
            entry.done = true;
        }
        while let Some(&InFlightSync {
            upto_sequence: upto,
            done: true,
            at,
            moves_point,
        }) = self.syncs_in_flight.front()
        {
            self.syncs_in_flight.pop_front();
            self.synced_sequence = self.synced_sequence.max(upto.min(self.segment_sequence));
            self.synced_at = at;
            if moves_point {
                self.point_sent = at;
            }
        }
    }

    /// After a failed flush was undone: an fdatasync of the files the undo cut back (and
    /// of whatever else is unsynced), to run before a later record at the same
    /// sequences is acknowledged. It moves no watermark and leaves the files owed to the
    /// next regular job, so its outcome matters only if it fails (`sync_failed`).
    pub fn undo_sync(&self) -> Option<SyncJob> {
        if self.poisoned.is_some() || (self.unsynced_files.is_empty() && !self.dir_dirty) {
            return None;
        }
        Some(SyncJob {
            storage: Arc::clone(&self.storage),
            files: self.unsynced_files.clone(),
            sync_dir: self.dir_dirty.then(|| self.dir.clone()),
            upto_sequence: self.segment_sequence,
            point: None,
        })
    }

    /// A job was taken but never run (the checkpoint holding it stopped at an earlier
    /// failure): its files are owed a sync again.
    pub fn sync_not_run(&mut self, job: SyncJob) {
        self.syncs_in_flight
            .retain(|s| s.upto_sequence != job.upto_sequence);
        for file in job.files {
            if !self.unsynced_files.iter().any(|f| Arc::ptr_eq(f, &file)) {
                self.unsynced_files.push(file);
            }
        }
        self.dir_dirty |= job.sync_dir.is_some();
        let taken = self.syncs_in_flight.back().map(|s| s.upto_sequence);
        self.sync_taken_sequence = taken.unwrap_or(self.synced_sequence);
    }

    /// A job failed. Sticky: after a failed fsync the kernel may have dropped the dirty
    /// pages and a retry can succeed without the data, so every later append and flush
    /// returns `Poisoned` until a restart re-reads the disk. Reads keep working. Nothing
    /// past the watermark is ever acknowledged now, whatever later jobs report.
    pub fn sync_failed(&mut self, err: &io::Error) {
        log::error!(
            "{}: fdatasync failed; partition refuses writes until restart: {err}",
            self.dir.display()
        );
        if self.poisoned.is_none() {
            self.poisoned = Some(format!("fdatasync failed: {err}"));
        }
        self.syncs_in_flight.clear();
    }

    pub fn is_poisoned(&self) -> bool {
        self.poisoned.is_some()
    }

    /// Files written since the last sync job took them. Each holds its descriptor until
    /// that job ran, a closed segment's too.
    pub fn unsynced_file_count(&self) -> usize {
        self.unsynced_files.len()
    }

    /// The partition's bookkeeping holds together: segments contiguous and in order, the
    /// last one ending at `written_sequence`, nothing synced that was not written, the
    /// buffered bytes those of the pending records, and at most
    /// [`MAPPED_SEGMENTS_MAX`] maps. The broker runs it after every step in tests.
    pub fn check_invariants(&self) {
        assert!(
            !self.segments.is_empty(),
            "a partition always has a segment"
        );
        for pair in self.segments.windows(2) {
            assert_eq!(
                pair[0].end_sequence(),
                pair[1].first_sequence,
                "segments contiguous"
            );
        }
        let last = self.segments.last().expect("not empty");
        assert_eq!(
            last.end_sequence(),
            self.segment_sequence + 1,
            "last segment ends at written"
        );
        assert!(
            self.synced_sequence <= self.segment_sequence,
            "synced beyond written"
        );
        assert!(self.journaled_sequence <= self.written_sequence());
        assert!(self.sync_taken_sequence <= self.segment_sequence);
        let mut last = self.synced_sequence;
        for &InFlightSync {
            upto_sequence: upto,
            ..
        } in self.syncs_in_flight.iter()
        {
            assert!(upto > last, "sync jobs in order above the watermark");
            assert!(upto <= self.sync_taken_sequence);
            last = upto;
        }
        assert!(
            self.syncs_in_flight.front().is_none_or(|s| !s.done),
            "a completed job at the head would have moved the watermark"
        );
        self.check_buffer_invariants();
        for seg in &self.segments[..self.segments.len() - 1] {
            assert!(
                seg.idx_unwritten.is_empty(),
                "a closed segment's index is written"
            );
        }
        let active = self.active();
        let unwritten = active.idx_unwritten.len();
        assert!(unwritten <= active.record_count as usize * INDEX_ENTRY_BYTES);
        if self.pending.is_empty() {
            assert!(
                unwritten < INDEX_UNWRITTEN_BYTES_MAX,
                "a full tail is written"
            );
        }
        // A recovery point claims only what completed jobs made durable.
        let (at, sent) = (self.synced_at, self.point_sent);
        assert!(sent.segment_first < at.segment_first || sent.end_position <= at.end_position);
        let mapped = self.segments.iter().filter(|s| s.is_mapped()).count();
        assert_eq!(mapped, self.mapped_segments);
        assert!(self.mapped_segments <= MAPPED_SEGMENTS_MAX);
    }

    /// The write buffer holds the pending records, the staged ones first.
    fn check_buffer_invariants(&self) {
        let bytes =
            |records: &[PendingRecord]| -> u64 { records.iter().map(|r| u64::from(r.len)).sum() };
        assert_eq!(
            bytes(&self.pending),
            self.write_buf.len() as u64,
            "write buffer holds the pending records"
        );
        assert!(self.staged <= self.pending.len());
        assert_eq!(
            bytes(&self.pending[..self.staged]),
            self.staged_bytes as u64,
            "staged bytes those of the records"
        );
    }

    /// Index of the segment holding `sequence` (which is >= first_sequence).
    fn segment_index_of(&self, sequence: u64) -> usize {
        // Last segment starting at or below `sequence`; an empty segment shares its first
        // sequence with the next one, and this picks the later, non-empty, one.
        self.segments
            .partition_point(|s| s.first_sequence <= sequence)
            .saturating_sub(1)
    }

    /// Maps segment `i` (remapping if it grew) and unmaps the least recently read one
    /// when over MAPPED_SEGMENTS_MAX.
    fn map_segment(&mut self, i: usize) -> Result<(), StorageError> {
        self.map_tick += 1;
        let seg = &mut self.segments[i];
        let was_mapped = seg.is_mapped();
        let mapped = seg.ensure_mapped(&*self.storage);
        // Count before propagating: a failure may leave one of the two files mapped.
        if !was_mapped && seg.is_mapped() {
            self.mapped_segments += 1;
        }
        seg.map_used_tick = self.map_tick;
        let mapped = mapped.map_err(|e| StorageError::from_io(&seg.log_path, None, e));
        // Even after a failure: half a map still counts against the cap.
        if self.mapped_segments > MAPPED_SEGMENTS_MAX {
            let victim = (0..self.segments.len())
                .filter(|&j| j != i && self.segments[j].is_mapped())
                .min_by_key(|&j| self.segments[j].map_used_tick);
            if let Some(j) = victim {
                self.segments[j].unmap();
                self.mapped_segments -= 1;
            }
        }
        mapped
    }

    /// Where a read from `start` of up to `max_records` may go (exclusive): staged records
    /// it would reach are written to their segment first. When that write fails, a read
    /// that starts before them still gets the records before them.
    fn readable_end(&mut self, start: u64, max_records: usize) -> Result<u64, StorageError> {
        let reaches_staged = start.saturating_add(max_records as u64) > self.segment_sequence + 1;
        if self.staged > 0 && reaches_staged {
            if let Err(e) = self.write_staged() {
                if start > self.segment_sequence {
                    return Err(e);
                }
            }
        }
        Ok(self.segment_sequence + 1)
    }

    /// Calls `f` for flushed records from `from_sequence` on (clamped up to
    /// `first_sequence`, the gap reported as `skipped`), stopping after `max_records`, at
    /// the end of the log, or before a record that would take the key + value bytes past
    /// `max_bytes`, except that the first record is always delivered. Every record's CRC
    /// and sequence are checked; a bad one ends the read with `Corrupt` (records before it
    /// were already delivered). `max_records == 0` reads nothing.
    pub fn read(
        &mut self,
        from_sequence: u64,
        max_records: usize,
        max_bytes: usize,
        mut f: impl FnMut(RecordView<'_>),
    ) -> Result<ReadOutcome, StorageError> {
        let start = from_sequence.max(self.first_sequence());
        let mut out = ReadOutcome {
            records: 0,
            bytes: 0,
            next_sequence: start,
            // Sequences start at 1: asking from 0 skips nothing that ever existed.
            skipped: start - from_sequence.clamp(1, start),
        };
        let end = self.readable_end(start, max_records)?;
        let mut sequence = start;
        'segments: while sequence < end && out.records < max_records {
            let i = self.segment_index_of(sequence);
            self.map_segment(i)?;
            let seg = &self.segments[i];
            let mut position = index_position(seg, sequence)?;
            let bytes = seg.log_bytes();
            let seg_end = seg.end_sequence().min(end);
            // The index finds the first record; the rest follow by length, so a read
            // touches the index once per segment.
            while sequence < seg_end && out.records < max_records {
                let (d, total_len) = decode_mapped(bytes, position, sequence, &seg.log_path)?;
                let payload = d.key.len() + d.value.len();
                if out.records > 0 && out.bytes + payload > max_bytes {
                    break 'segments;
                }
                position += total_len as u64;
                f(d);
                out.records += 1;
                out.bytes += payload;
                sequence += 1;
                out.next_sequence = sequence;
            }
        }
        Ok(out)
    }

    /// The flushed record with `sequence`, or None if it is not retained or not flushed.
    pub fn read_one(&mut self, sequence: u64) -> Result<Option<RecordView<'_>>, StorageError> {
        self.read_one_checking(sequence, None)
    }

    /// [`Self::read_one`] for a caller that reads each record twice in one pass of its
    /// own (consume: the record's size when the group delivers it, then its bytes into
    /// the MSG): the CRC of a record is computed once per `pass`, on its first read in
    /// that pass from the same map; every other check is made on every read. A new
    /// `pass` value starts over (docs/DECISIONS.md, "One CRC check per delivery").
    pub fn read_one_in_pass(
        &mut self,
        sequence: u64,
        pass: u64,
    ) -> Result<Option<RecordView<'_>>, StorageError> {
        self.read_one_checking(sequence, Some(pass))
    }

    fn read_one_checking(
        &mut self,
        sequence: u64,
        pass: Option<u64>,
    ) -> Result<Option<RecordView<'_>>, StorageError> {
        if sequence < self.first_sequence() || sequence > self.written_sequence() {
            return Ok(None);
        }
        if sequence > self.segment_sequence {
            self.write_staged()?;
        }
        let i = self.segment_index_of(sequence);
        self.map_segment(i)?;
        let seg = &self.segments[i];
        let position = index_position(seg, sequence)?;
        let bytes = seg.log_bytes();
        let Some(pass) = pass else {
            return Ok(Some(
                decode_mapped(bytes, position, sequence, &seg.log_path)?.0,
            ));
        };
        let at = CheckedRun {
            pass,
            segment: seg.first_sequence,
            map_at: bytes.as_ptr() as usize,
            from: 0,
            to: 0,
        };
        if self.checked.covers(&at, sequence) {
            let crc = record::Crc::CheckedBefore;
            let (r, _) = decode_mapped_checking(bytes, (position, sequence), &seg.log_path, crc)?;
            return Ok(Some(r));
        }
        #[cfg(test)]
        CRCS_IN_PASS.with(|n| n.set(n.get() + 1));
        let crc = record::Crc::Check;
        let (r, _) = decode_mapped_checking(bytes, (position, sequence), &seg.log_path, crc)?;
        self.checked.note(at, sequence);
        Ok(Some(r))
    }

    /// Calls `f(sequence, timestamp_ms, producer_id, producer_seq)` for every flushed
    /// record from `from_sequence` on, CRC-checked. For rebuilding producer state at start.
    /// Steps over damaged records (a record kept in place by recovery, or bit rot in a
    /// closed segment) and returns how many: stopping at one would forget every producer
    /// sequence after it, and resent records would be appended twice.
    pub fn scan_headers(
        &mut self,
        from_sequence: u64,
        mut f: impl FnMut(u64, u64, u64, u64),
    ) -> Result<u64, StorageError> {
        let mut next = from_sequence.max(self.first_sequence());
        let mut damaged = 0;
        while next <= self.written_sequence() {
            let read = self.read(next, SCAN_HEADERS_BATCH_RECORDS, usize::MAX, |r| {
                next = r.sequence + 1;
                f(r.sequence, r.timestamp_ms, r.producer_id, r.producer_seq)
            });
            match read {
                Ok(out) if out.records == 0 => break,
                Ok(_) => {}
                // `next` is the damaged record: the callback saw every one before it.
                Err(StorageError::Corrupt { .. }) => {
                    damaged += 1;
                    next += 1;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(damaged)
    }

    /// Timestamp of the log's newest record, `None` while it holds none.
    pub fn newest_timestamp(&mut self) -> Result<Option<u64>, StorageError> {
        match (self.segments.iter()).rposition(|s| s.record_count > 0) {
            Some(i) => self.segment_last_timestamp(i),
            None => Ok(None),
        }
    }

    /// Timestamp of the newest record of segment `i`, reading it if not cached.
    fn segment_last_timestamp(&mut self, i: usize) -> Result<Option<u64>, StorageError> {
        let seg = &self.segments[i];
        if seg.last_timestamp_ms.is_some() || seg.record_count == 0 {
            return Ok(seg.last_timestamp_ms);
        }
        let last = seg.end_sequence() - 1;
        let ts = self.read_one(last)?.map(|r| r.timestamp_ms);
        self.segments[i].last_timestamp_ms = ts;
        Ok(ts)
    }

    /// Deletes closed segments, oldest first, while the partition is over
    /// `retention_size_bytes` or the oldest segment's newest record is more than
    /// `retention_age_ms` older than `now_ms`. Never deletes the active segment, never
    /// part of a segment, never one holding a record above `saved_through` (the
    /// caller's state derived from the records, its producers, is saved up to there).
    /// Readers below the new first sequence skip ahead.
    pub fn enforce_retention(
        &mut self,
        now_ms: u64,
        saved_through: u64,
    ) -> Result<RetentionReport, StorageError> {
        let mut report = RetentionReport::default();
        if self.poisoned.is_some() {
            // After a failed purge job files it no longer lists may precede its oldest
            // segment (`purge_failed`); it deletes nothing until a restart.
            return Ok(report);
        }
        let size_max = self.config.retention_size_bytes;
        let age_max = self.config.retention_age_ms;
        while self.segments.len() > 1 {
            let total: u64 = self.segments.iter().map(|s| s.len_bytes).sum();
            let over_size = size_max > 0 && total > size_max;
            let too_old = age_max > 0
                && match self.segment_last_timestamp(0)? {
                    Some(ts) => now_ms.saturating_sub(ts) > age_max,
                    None => true, // holds no record
                };
            if !over_size && !too_old {
                break;
            }
            // The oldest segment's last record is the one before the next one's first.
            if self.segments[1].first_sequence - 1 > saved_through {
                report.waits_for_save = true;
                break;
            }
            let seg = &self.segments[0];
            // The .log goes first: a crash between the two unlinks leaves an orphan index,
            // which recovery deletes, never a segment without its start.
            self.storage
                .remove_file(&seg.log_path)
                .map_err(|e| StorageError::from_io(&seg.log_path, None, e))?;
            match self.storage.remove_file(&seg.idx_path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::from_io(&seg.idx_path, None, e)),
            }
            let seg = self.segments.remove(0);
            if seg.is_mapped() {
                self.mapped_segments -= 1;
            }
            log::info!(
                "{}: retention deleted segment {} ({} bytes, {} records)",
                self.dir.display(),
                seg.first_sequence,
                seg.len_bytes,
                seg.record_count
            );
            report.segments_deleted += 1;
            report.bytes_deleted += seg.len_bytes;
        }
        report.first_sequence = self.first_sequence();
        Ok(report)
    }

    pub fn stats(&self) -> PartitionStats {
        PartitionStats {
            first_sequence: self.first_sequence(),
            next_sequence: self.next_sequence(),
            written_sequence: self.written_sequence(),
            synced_sequence: self.durable_sequence(),
            bytes: self.segments.iter().map(|s| s.len_bytes).sum(),
            segments: self.segments.len() as u32,
            pending_bytes: self.pending_bytes(),
            poisoned: self.poisoned.is_some(),
        }
    }

    #[cfg(test)]
    fn fail_write_after(&self, writes_ok: u32, errno: i32) {
        self.fault.fail_write.set(Some((writes_ok, errno)));
    }
}
