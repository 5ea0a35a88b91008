//! Start-up recovery and the offline checker: scan, verify, truncate, report.
//!
//! Runs before any segment is mapped, which is what makes truncation here safe (see
//! `mmap.rs`). Reads files with plain buffered reads, never maps. Depends on std, log, the
//! storage seam and the segment and record layouts.
//!
//! Cost on open: for every closed segment, its header, its index and ONE record (the last
//! one the index names: a closed segment's index was synced with its last records); the
//! last segment is read whole, because its index is never synced and after a power cut
//! any entry of it may be stale or torn. Start-up time therefore grows with the number of
//! segments and at most one segment size per partition, not with the bytes in the log. A
//! segment whose index fails the cheap check is scanned in full, once, and its index
//! rewritten.

use super::checkpoint::{self, RecoveryPoint};
use super::error::StorageError;
use super::record::{self, DecodeError, RECORD_LENGTH_BYTES};
use super::segment::{
    check_header, decode_index, encode_header, encode_index, index_path, parse_file_name,
    segment_path, INDEX_SUFFIX, SEGMENT_HEADER_BYTES, SEGMENT_SUFFIX,
};
use super::storage::{read_exact_at, FileReader, FileRef, Open, Storage, StorageFile};
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// Read buffer for scanning segments; records larger than this are read directly.
pub const RECOVERY_READ_BUFFER_BYTES: usize = 64 * 1024;

/// What recovery found and did. Logged at warn by `PartitionLog::open` when not clean.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from torn or corrupt tails plus the size of every segment removed.
    pub truncated_bytes: u64,
    /// The first cut: the file and the byte offset it now ends at.
    pub truncated_at: Option<(PathBuf, u64)>,
    /// Index files rewritten because they were missing, short or inconsistent.
    pub indexes_rebuilt: u32,
    /// Segments deleted because they followed a cut or broke sequence continuity.
    pub segments_removed: u32,
    /// Index files deleted because their segment file no longer exists.
    pub orphan_indexes_removed: u32,
    /// Every sequence at or above this that was ever written is gone (None: nothing lost).
    pub lost_from_sequence: Option<u64>,
    /// Damaged records followed by whole ones, kept in place (reading them reports them).
    pub damaged_records_kept: u64,
    /// Segments in the partition after recovery.
    pub segments: u32,
    pub first_sequence: u64,
    pub next_sequence: u64,
    /// Every file changed (or, in a dry run, that would be), in the order of the changes:
    /// what `mortarctl check` prints and backs up.
    pub changes: Vec<Change>,
    /// The damaged records kept in place, for a report that names each one.
    pub damaged: Vec<DamagedRecord>,
}

/// One change recovery makes to one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: PathBuf,
    pub what: ChangeKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Cut to `to` bytes, `bytes` bytes lost.
    Truncate { to: u64, bytes: u64 },
    /// A segment without a good header restarted empty (`bytes` lost).
    Reset { bytes: u64 },
    /// Deleted (`bytes` long).
    Remove { bytes: u64 },
    /// An index rewritten to list exactly the records kept.
    RewriteIndex,
}

/// A damaged record below the recovery point, kept in place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRecord {
    pub path: PathBuf,
    pub position: u64,
    pub sequence: u64,
    pub reason: String,
}

impl RecoveryReport {
    /// True when nothing was truncated or removed (rebuilt indexes are not data loss).
    pub fn is_clean(&self) -> bool {
        self.truncated_at.is_none() && self.segments_removed == 0 && self.truncated_bytes == 0
    }

    fn note_change(&mut self, path: &Path, what: ChangeKind) {
        self.changes.push(Change {
            path: path.to_path_buf(),
            what,
        });
    }

    fn note_cut(&mut self, path: &Path, position: u64, first_lost: u64) {
        if self.truncated_at.is_none() {
            self.truncated_at = Some((path.to_path_buf(), position));
        }
        if self.lost_from_sequence.is_none() {
            self.lost_from_sequence = Some(first_lost);
        }
    }
}

/// One segment as recovery leaves it: the file is exactly `len_bytes` long and holds
/// `record_count` good records; its index file holds exactly their positions.
#[derive(Debug, Clone)]
pub(crate) struct RecoveredSegment {
    pub first_sequence: u64,
    pub len_bytes: u64,
    pub record_count: u64,
    pub last_timestamp_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VerifyMode {
    /// Open: cheap check of closed segments, record-by-record check of the last one.
    Tails,
    /// Repair: every record of every segment.
    Everything,
}

fn io_err(path: &Path, position: Option<u64>, e: io::Error) -> StorageError {
    StorageError::from_io(path, position, e)
}

/// Sorted first sequences of the `.log` files and of the `.idx` files in `dir`.
fn list_dir(storage: &dyn Storage, dir: &Path) -> Result<(Vec<u64>, Vec<u64>), StorageError> {
    let mut logs = Vec::new();
    let mut idxs = Vec::new();
    for name in storage.list_dir(dir).map_err(|e| io_err(dir, None, e))? {
        let Some((seq, suffix)) = parse_file_name(&name) else {
            continue; // not ours: the broker may keep meta files beside the segments
        };
        if suffix == SEGMENT_SUFFIX {
            logs.push(seq);
        } else if suffix == INDEX_SUFFIX {
            idxs.push(seq);
        }
    }
    logs.sort_unstable();
    idxs.sort_unstable();
    Ok((logs, idxs))
}

/// Where a scan stopped. `stop` is None when it reached the end (or its record budget).
#[derive(Default)]
pub(crate) struct ScanEnd {
    pub end_pos: u64,
    pub stop: Option<DecodeError>,
    pub last_timestamp_ms: Option<u64>,
    /// Records passed, the damaged ones kept in place included.
    pub records: u64,
    /// Damaged records kept in place (see [`Resync`]): position, sequence, what is wrong.
    pub damaged: Vec<(u64, u64, DecodeError)>,
}

/// Whether a scan may step over a damaged record, and where else to look for the record
/// after it. A torn write only ever damages the unsynced tail; a bad record followed by a
/// whole record carrying the next sequence is damage in place (bit rot, a stray write)
/// to records that may have been acknowledged long ago. Cutting there would throw away
/// every good record after it, so recovery keeps it: reading it reports it.
#[derive(Clone, Copy)]
pub(crate) enum Resync<'a> {
    /// Stop at the first bad record (the checker reports it).
    Never,
    /// Keep a damaged record that starts below `below` (the durable part: see
    /// `checkpoint.rs`) when the next one is whole. The next one is looked for where the
    /// damaged record's length says it ends and at the first of these index entries past
    /// it (the length itself may be what is damaged). Index entries are only hints: a
    /// record found through one must still pass its CRC and sequence checks.
    KeepDamaged { index_hints: &'a [u32], below: u64 },
}

/// Reads records from `start_pos` until `file_len`, a bad record, or `max_records`,
/// checking each one's length, CRC and sequence, and calls `visit(position)` for each
/// good one (and each damaged one `resync` keeps). A bad record is reported in `stop`,
/// not as an error: the caller decides whether to truncate (recovery) or to report
/// (check).
pub(crate) fn scan_records(
    file: &dyn StorageFile,
    path: &Path,
    (start_pos, file_len): (u64, u64),
    first_sequence: u64,
    max_records: Option<u64>,
    resync: Resync<'_>,
    mut visit: impl FnMut(u64),
) -> Result<ScanEnd, StorageError> {
    let reader_at =
        |pos| BufReader::with_capacity(RECOVERY_READ_BUFFER_BYTES, FileReader::new(file, pos));
    let mut reader = reader_at(start_pos);
    let mut buf = Vec::new();
    let mut end = ScanEnd {
        end_pos: start_pos,
        ..ScanEnd::default()
    };
    loop {
        let pos = end.end_pos;
        if pos >= file_len || max_records.is_some_and(|m| end.records >= m) {
            return Ok(end);
        }
        let sequence = first_sequence + end.records;
        let available = (file_len - pos) as usize;
        let read = read_record(&mut reader, &mut buf, available)
            .map_err(|e| io_err(path, Some(pos), e))?;
        let claimed_end = read.as_ref().ok().map(|&total| pos + total as u64);
        let decoded = read.and_then(|total| {
            record::decode(&buf, Some(sequence)).map(|(d, _)| (d.timestamp_ms, total))
        });
        let bad = match decoded {
            Ok((timestamp_ms, total)) => {
                visit(pos);
                end.last_timestamp_ms = Some(timestamp_ms);
                end.end_pos = pos + total as u64;
                end.records += 1;
                continue;
            }
            Err(bad) => bad,
        };
        let last_expected = max_records == Some(end.records + 1);
        let kept = match resync {
            Resync::KeepDamaged { index_hints, below } if pos < below => {
                let at = (pos, claimed_end, file_len);
                keep_damaged(file, at, sequence, (index_hints, below), last_expected)
            }
            _ => None,
        };
        let Some(kept) = kept else {
            return Ok(ScanEnd {
                stop: Some(bad),
                ..end
            });
        };
        visit(pos);
        end.damaged.push((pos, sequence, bad));
        end.records += 1;
        end.end_pos = match kept {
            Kept::Alone { end_pos } => end_pos,
            Kept::WithNext(next_pos, timestamp_ms, total) => {
                visit(next_pos);
                end.last_timestamp_ms = Some(timestamp_ms);
                end.records += 1;
                next_pos + total as u64
            }
        };
        reader = reader_at(end.end_pos);
    }
}

/// Why a damaged record below the recovery point may be kept.
enum Kept {
    /// The whole record after it: its position, timestamp and length.
    WithNext(u64, u64, usize),
    /// Nothing follows, but it ends exactly where the durable bytes end.
    Alone { end_pos: u64 },
}

/// Whether the damaged record numbered `sequence` at `pos` (whose length field says it
/// ends at `claimed_end`) is damage in place rather than a torn write: the record after
/// it is whole where its length says or where the first index hint past it says (the
/// length itself may be what is damaged). When nothing follows, it still is when it ends
/// where the durable bytes end: at `below` (the last record the point vouches for), or,
/// for the last record of a closed segment (`last_expected`), at the end of the file.
/// Cutting there would lose a durable record, and for a closed segment every later
/// segment; start-up, which does not read it, keeps it too.
fn keep_damaged(
    file: &dyn StorageFile,
    (pos, claimed_end, file_len): (u64, Option<u64>, u64),
    sequence: u64,
    (index_hints, below): (&[u32], u64),
    last_expected: bool,
) -> Option<Kept> {
    let after = index_hints.iter().map(|&p| u64::from(p)).find(|&p| p > pos);
    let next = [claimed_end, after]
        .into_iter()
        .flatten()
        .filter(|&p| p < file_len)
        .find_map(|p| whole_record_at(file, p, file_len, sequence + 1).map(|r| (p, r)));
    if let Some((next_pos, (timestamp_ms, total))) = next {
        return Some(Kept::WithNext(next_pos, timestamp_ms, total));
    }
    let end_pos = claimed_end?;
    (end_pos == below || (last_expected && end_pos == file_len)).then_some(Kept::Alone { end_pos })
}

/// The timestamp and length of the record at `pos` when it is whole and numbered
/// `sequence`; `None` otherwise, a failed read included (this only looks for a reason to
/// keep data, never for one to drop it).
fn whole_record_at(
    file: &dyn StorageFile,
    pos: u64,
    file_len: u64,
    sequence: u64,
) -> Option<(u64, usize)> {
    let mut reader = FileReader::new(file, pos);
    let mut buf = Vec::new();
    let total = read_record(&mut reader, &mut buf, (file_len - pos) as usize)
        .ok()?
        .ok()?;
    let (d, _) = record::decode(&buf, Some(sequence)).ok()?;
    Some((d.timestamp_ms, total))
}

/// Reads the next record's bytes into `buf` when `available` bytes can hold it; the
/// length prefix is checked before anything is allocated for it. The inner error is a
/// record that is torn or impossible, the outer one a failed read.
fn read_record(
    reader: &mut impl Read,
    buf: &mut Vec<u8>,
    available: usize,
) -> io::Result<Result<usize, DecodeError>> {
    let torn = |needed| Ok(Err(DecodeError::Torn { needed, available }));
    if available < RECORD_LENGTH_BYTES {
        return torn(RECORD_LENGTH_BYTES);
    }
    let mut prefix = [0u8; RECORD_LENGTH_BYTES];
    reader.read_exact(&mut prefix)?;
    let total = match record::total_len_from_prefix(prefix) {
        Ok(total) if total > available => return torn(total),
        Ok(total) => total,
        Err(e) => return Ok(Err(e)),
    };
    buf.clear();
    buf.extend_from_slice(&prefix);
    buf.resize(total, 0);
    reader.read_exact(&mut buf[RECORD_LENGTH_BYTES..])?;
    Ok(Ok(total))
}

/// Length of the prefix of `entries` that is plausible for a file of `file_len` bytes:
/// starts at the header, strictly increasing, inside the file. A crash can lose index
/// pages (they are never fsynced), which shows up as zeros, i.e. a non-increasing entry.
fn plausible_prefix_len(entries: &[u32], file_len: u64) -> usize {
    let mut prev: Option<u32> = None;
    for (i, &p) in entries.iter().enumerate() {
        let ok = match prev {
            None => p as usize == SEGMENT_HEADER_BYTES,
            Some(q) => p > q,
        } && (p as u64) < file_len;
        if !ok {
            return i;
        }
        prev = Some(p);
    }
    entries.len()
}

/// Recovers every segment in `dir`, oldest first, truncating at the first bad record past
/// the recovery point (before it, a bad record is kept in place: `checkpoint.rs`) and
/// removing everything after a cut. Leaves each surviving segment's index exact. Also
/// returns the recovery point it went by. Without `write` it changes nothing and only
/// lists in the report what it would change: `check_partition` shows that plan, then
/// runs this same code with `write` to carry it out, so the two cannot disagree.
pub(crate) fn recover(
    storage: &dyn Storage,
    dir: &Path,
    mode: VerifyMode,
    write: bool,
) -> Result<(Vec<RecoveredSegment>, RecoveryReport, Option<RecoveryPoint>), StorageError> {
    let mut report = RecoveryReport::default();
    let point = checkpoint::read(storage, dir);
    let (logs, idxs) = list_dir(storage, dir)?;
    for seq in idxs.iter().filter(|s| logs.binary_search(s).is_err()) {
        // Retention unlinks the .log first, so a crash between the two unlinks leaves this.
        remove(storage, &index_path(dir, *seq), write, &mut report)?;
        report.orphan_indexes_removed += 1;
    }
    let mut out: Vec<RecoveredSegment> = Vec::with_capacity(logs.len());
    let mut cut_after: Option<usize> = None;
    for (n, &first) in logs.iter().enumerate() {
        if let Some(prev) = out.last() {
            let expected = prev.first_sequence + prev.record_count;
            if first != expected {
                let path = segment_path(dir, first);
                log::warn!(
                    "{}: starts at sequence {first} but the previous segment ends before \
                     {expected}; removing it and every later segment",
                    path.display()
                );
                report.note_cut(&path, 0, expected);
                cut_after = Some(n);
                break;
            }
        }
        let next_first = logs.get(n + 1).copied();
        let range = (first, next_first);
        let how = (mode, point, write);
        let (seg, cut) = recover_segment(storage, dir, range, how, &mut report)?;
        out.push(seg);
        if cut {
            cut_after = Some(n + 1);
            break;
        }
    }
    if let Some(from) = cut_after {
        for &first in &logs[from..] {
            let path = segment_path(dir, first);
            let len = remove(storage, &path, write, &mut report)?;
            remove(storage, &index_path(dir, first), write, &mut report)?;
            log::warn!(
                "{}: removed ({len} bytes) after a truncation",
                path.display()
            );
            report.truncated_bytes += len;
            report.segments_removed += 1;
        }
    }
    report.segments = out.len() as u32;
    if let (Some(first), Some(last)) = (out.first(), out.last()) {
        report.first_sequence = first.first_sequence;
        report.next_sequence = last.first_sequence + last.record_count;
    }
    Ok((out, report, point))
}

/// Removes `path` (or, without `write`, only notes that it would) and returns its size;
/// one already gone is no change.
fn remove(
    storage: &dyn Storage,
    path: &Path,
    write: bool,
    report: &mut RecoveryReport,
) -> Result<u64, StorageError> {
    let bytes = match storage.file_len(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err(path, None, e)),
    };
    if write {
        match storage.remove_file(path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(path, None, e)),
        }
    }
    report.note_change(path, ChangeKind::Remove { bytes });
    Ok(bytes)
}

/// One segment file being recovered.
struct SegmentFile<'s> {
    storage: &'s dyn Storage,
    /// The first sequence of the next segment; `None` for the last one.
    next_first: Option<u64>,
    file: FileRef,
    path: PathBuf,
    idx_path: PathBuf,
    first: u64,
    len: u64,
    /// False in a dry run: every change is only noted in the report.
    write: bool,
}

impl<'s> SegmentFile<'s> {
    fn open(
        storage: &'s dyn Storage,
        dir: &Path,
        (first, next_first): (u64, Option<u64>),
        write: bool,
    ) -> Result<Self, StorageError> {
        let path = segment_path(dir, first);
        let file = storage
            .open(&path, if write { Open::ReadWrite } else { Open::Read })
            .map_err(|e| io_err(&path, None, e))?;
        let len = file.size().map_err(|e| io_err(&path, None, e))?;
        Ok(SegmentFile {
            storage,
            next_first,
            file,
            path,
            idx_path: index_path(dir, first),
            first,
            len,
            write,
        })
    }

    fn segment(&self, len_bytes: u64, records: u64, ts: Option<u64>) -> RecoveredSegment {
        RecoveredSegment {
            first_sequence: self.first,
            len_bytes,
            record_count: records,
            last_timestamp_ms: ts,
        }
    }

    /// Scans up to `max` records from `pos`, the first of them numbered `sequence`.
    fn scan(&self, pos: u64, sequence: u64, max: Option<u64>) -> Result<ScanEnd, StorageError> {
        scan_records(
            &*self.file,
            &self.path,
            (pos, self.len),
            sequence,
            max,
            Resync::Never,
            |_| {},
        )
    }

    /// A segment without a good header holds no trustworthy record: it restarts empty.
    fn reset(&mut self, reason: &str, is_last: bool, report: &mut RecoveryReport) -> IoResult {
        // A crash between creating a segment and writing its header leaves a short or
        // zero-filled file; anything else here is damage.
        if self.len > 0 || !is_last {
            log::warn!(
                "{}: {reason}; truncating it to an empty segment",
                self.path.display()
            );
            report.note_cut(&self.path, 0, self.first);
            report.truncated_bytes += self.len;
        }
        report.note_change(&self.path, ChangeKind::Reset { bytes: self.len });
        report.note_change(&self.idx_path, ChangeKind::RewriteIndex);
        if !self.write {
            return Ok(());
        }
        let at_start = |e| io_err(&self.path, Some(0), e);
        self.file.set_len(0).map_err(at_start)?;
        self.file
            .write_at(0, &encode_header(self.first))
            .map_err(at_start)?;
        let idx_err = |e| io_err(&self.idx_path, None, e);
        self.storage.write(&self.idx_path, &[]).map_err(idx_err)
    }

    /// A closed segment's cheap check: the index is whole and its last entry names a
    /// good record with the right sequence that ends exactly at the end of the file.
    fn closed_checks_out(
        &self,
        entries: &[u32],
        next_first: u64,
    ) -> Result<Option<RecoveredSegment>, StorageError> {
        let n = entries.len() as u64;
        if self.first + n != next_first {
            return Ok(None);
        }
        let (ok, ts) = match entries.last() {
            None => (self.len == SEGMENT_HEADER_BYTES as u64, None),
            Some(&p) => {
                let end = self.scan(u64::from(p), self.first + n - 1, Some(1))?;
                let whole = end.stop.is_none() && end.records == 1 && end.end_pos == self.len;
                (whole, end.last_timestamp_ms)
            }
        };
        Ok(ok.then(|| self.segment(self.len, n, ts)))
    }

    /// Logs and counts the damaged records the scan kept in place.
    fn note_damaged(&self, end: &ScanEnd, report: &mut RecoveryReport) {
        for (pos, sequence, why) in &end.damaged {
            log::warn!(
                "{}: corrupt record at byte {pos} (sequence {sequence}: {why}), in bytes \
                 known durable: kept in place, reading it reports it",
                self.path.display()
            );
        }
        report.damaged_records_kept += end.damaged.len() as u64;
        report.damaged.extend(
            end.damaged
                .iter()
                .map(|(pos, sequence, why)| DamagedRecord {
                    path: self.path.clone(),
                    position: *pos,
                    sequence: *sequence,
                    reason: why.to_string(),
                }),
        );
    }

    /// Cuts the file at the first bad record the scan met.
    fn cut(&mut self, end: &ScanEnd, records: u64, report: &mut RecoveryReport) -> IoResult {
        let why = end.stop.as_ref().map(|e| e.to_string()).unwrap_or_default();
        let lost = self.len - end.end_pos;
        report.truncated_bytes += lost;
        let to = end.end_pos;
        report.note_change(&self.path, ChangeKind::Truncate { to, bytes: lost });
        if self.write {
            let at_end = |e| io_err(&self.path, Some(to), e);
            self.file.set_len(to).map_err(at_end)?;
        }
        if Some(self.first + records) == self.next_first {
            // Every record the segment should hold is there: the bytes after them are a
            // failed write whose undo the power cut lost. Nothing of the log goes.
            log::warn!(
                "{}: {lost} stray bytes after its last record ({why}); truncated",
                self.path.display()
            );
            return Ok(());
        }
        log::warn!(
            "{}: bad record at byte {} ({why}); truncating {lost} bytes, sequences from {} \
             on are lost",
            self.path.display(),
            end.end_pos,
            self.first + records
        );
        report.note_cut(&self.path, end.end_pos, self.first + records);
        Ok(())
    }
}

type IoResult = Result<(), StorageError>;

/// What the index file of a segment holds.
struct IndexFile {
    bytes: Vec<u8>,
    missing: bool,
    entries: Vec<u32>,
    sealed: bool,
}

impl IndexFile {
    fn read(storage: &dyn Storage, path: &Path) -> Result<IndexFile, StorageError> {
        let (bytes, missing) = match storage.read(path) {
            Ok(b) => (b, false),
            Err(e) if e.kind() == io::ErrorKind::NotFound => (Vec::new(), true),
            Err(e) => return Err(io_err(path, None, e)),
        };
        let decoded = decode_index(&bytes);
        Ok(IndexFile {
            bytes,
            missing,
            entries: decoded.entries,
            sealed: decoded.sealed,
        })
    }

    /// The active segment keeps its newest entries in memory (`segment.rs`): after a
    /// crash its index lists the first positions only.
    fn is_short_prefix_of(&self, positions: &[u32]) -> bool {
        self.entries.len() < positions.len() && positions.starts_with(&self.entries)
    }

    /// Rewrites the index of `seg` when it does not list exactly `positions` (sealed when
    /// the segment is closed).
    fn settle(
        &self,
        seg: &SegmentFile<'_>,
        positions: &[u32],
        (closed, expected_gap): (bool, bool),
        report: &mut RecoveryReport,
    ) -> IoResult {
        let path = &seg.idx_path;
        let bytes = encode_index(positions, closed);
        if self.bytes == bytes {
            return Ok(());
        }
        report.indexes_rebuilt += 1;
        report.note_change(path, ChangeKind::RewriteIndex);
        if !expected_gap {
            // A last segment whose index is short is the ordinary crash before its newest
            // entries were written; anything else is worth a line in the log.
            log::info!(
                "{}: index {} ({} entries, {} records); rewriting it",
                path.display(),
                if self.missing {
                    "missing"
                } else {
                    "inconsistent"
                },
                self.entries.len(),
                positions.len()
            );
        }
        if seg.write {
            seg.storage
                .write(path, &bytes)
                .map_err(|e| io_err(path, None, e))?;
        }
        Ok(())
    }
}

/// What the recovery point says of one segment.
#[derive(Debug, Clone, Copy)]
enum Durable {
    /// It names a later segment: every byte of this one was durable.
    All,
    /// It names this segment: its records up to the point were durable.
    Upto(RecoveryPoint),
    /// Nothing: a damaged record may be a torn write.
    Unknown,
}

impl Durable {
    fn of(point: Option<RecoveryPoint>, first: u64) -> Durable {
        match point {
            Some(p) if p.segment_first > first => Durable::All,
            Some(p) if p.segment_first == first => Durable::Upto(p),
            _ => Durable::Unknown,
        }
    }

    /// Bytes below this were durable: a bad record there is damage, not a torn write.
    fn below(self) -> u64 {
        match self {
            Durable::All => u64::MAX,
            Durable::Upto(p) => p.end_position,
            Durable::Unknown => 0,
        }
    }
}

/// Recovers one segment. Returns it and whether it was cut (so later segments must go).
fn recover_segment(
    storage: &dyn Storage,
    dir: &Path,
    (first, next_first): (u64, Option<u64>),
    (mode, point, write): (VerifyMode, Option<RecoveryPoint>, bool),
    report: &mut RecoveryReport,
) -> Result<(RecoveredSegment, bool), StorageError> {
    let is_last = next_first.is_none();
    let mut seg = SegmentFile::open(storage, dir, (first, next_first), write)?;
    let mut header = vec![0u8; (seg.len as usize).min(SEGMENT_HEADER_BYTES)];
    read_exact_at(&*seg.file, 0, &mut header).map_err(|e| io_err(&seg.path, Some(0), e))?;
    if let Err(reason) = check_header(&header, first) {
        seg.reset(&reason, is_last, report)?;
        return Ok((seg.segment(SEGMENT_HEADER_BYTES as u64, 0, None), true));
    }
    let index = IndexFile::read(storage, &seg.idx_path)?;
    let plausible = plausible_prefix_len(&index.entries, seg.len);
    let idx_whole =
        index.bytes.len() % 4 == 0 && plausible == index.entries.len() && !index.missing;
    let durable = Durable::of(point, first);
    // Only a segment the recovery point shows was synced whole may skip the full read.
    if mode == VerifyMode::Tails && matches!(durable, Durable::All) {
        if let Some(next) = next_first.filter(|_| idx_whole && index.sealed) {
            if let Some(recovered) = seg.closed_checks_out(&index.entries, next)? {
                return Ok((recovered, false));
            }
        }
    }
    // Trusted without reading: the durable records of the last segment, which the point
    // names with their (durable) index entries. The rest is read record by record.
    let mut positions: Vec<u32> = match durable {
        Durable::Upto(p) if mode == VerifyMode::Tails => {
            trusted_prefix(&index.entries[..plausible], p, seg.len)
        }
        _ => Vec::new(),
    };
    let start = match positions.len() {
        0 => SEGMENT_HEADER_BYTES as u64,
        _ => durable.below(),
    };
    // A closed segment holds exactly the records up to the next one's first: anything
    // after them is a failed write whose undo the power cut lost.
    let trusted = positions.len() as u64;
    let end = scan_records(
        &*seg.file,
        &seg.path,
        (start, seg.len),
        first + trusted,
        next_first.map(|next| next.saturating_sub(first + trusted)),
        Resync::KeepDamaged {
            index_hints: &index.entries[..plausible],
            below: durable.below(),
        },
        |p| positions.push(p as u32),
    )?;
    seg.note_damaged(&end, report);
    let records = positions.len() as u64;
    let whole = next_first == Some(first + records);
    if end.stop.is_some() || end.end_pos < seg.len {
        seg.cut(&end, records, report)?;
    }
    let cut = end.stop.is_some() && !whole;
    let expected_gap = is_last && idx_whole && index.is_short_prefix_of(&positions);
    let closed = !is_last && !cut;
    index.settle(&seg, &positions, (closed, expected_gap), report)?;
    let ts = end.last_timestamp_ms;
    Ok((seg.segment(end.end_pos, positions.len() as u64, ts), cut))
}

/// The index entries of the records `point` says were durable, when the index agrees
/// with it (it was synced before the point was written); none when it does not, and the
/// segment is read from its start.
fn trusted_prefix(entries: &[u32], point: RecoveryPoint, file_len: u64) -> Vec<u32> {
    let n = point.records as usize;
    let agrees = n > 0
        && n <= entries.len()
        && u64::from(entries[n - 1]) < point.end_position
        && point.end_position <= file_len;
    if agrees {
        entries[..n].to_vec()
    } else {
        Vec::new()
    }
}

/// One finding of [`check_partition`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckProblem {
    pub path: PathBuf,
    pub position: u64,
    pub reason: String,
}

/// Result of [`check_partition`]: the partition as recovery leaves it, and what recovery
/// does (or, without a repair, would do) to get there.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub segments: u32,
    /// Records recovery keeps, the damaged ones kept in place included.
    pub records: u64,
    /// Bytes of the segments recovery keeps.
    pub bytes: u64,
    pub first_sequence: u64,
    pub next_sequence: u64,
    /// The dry run: every change recovery would make and every damaged record it keeps.
    pub plan: RecoveryReport,
    /// The plan, one line per file changed or record damaged.
    pub problems: Vec<CheckProblem>,
    /// Set when a repair was asked for and the plan changed something: what it did.
    pub repaired: Option<RecoveryReport>,
}

impl CheckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Called with each file a repair is about to change, before the change.
pub type Backup<'a> = &'a mut dyn FnMut(&Path) -> io::Result<()>;

/// Runs start-up recovery over `dir` reading every record, as a dry run: the report says
/// what recovery would change (a torn tail past the recovery point cut, a damaged record
/// below it kept, an index rewritten) and changes nothing. With `backup`, and only when
/// the plan changes a file, it then calls `backup` once for every file the plan names,
/// before any change, and runs the same recovery for real. Must not run while a broker
/// has the partition open (the two runs must see the same files).
pub fn check_partition(
    storage: &dyn Storage,
    dir: &Path,
    backup: Option<Backup<'_>>,
) -> Result<CheckReport, StorageError> {
    let (segments, plan, _) = recover(storage, dir, VerifyMode::Everything, false)?;
    let mut problems: Vec<CheckProblem> = plan
        .damaged
        .iter()
        .map(|d| {
            let why = format!("damaged record, sequence {}: {}", d.sequence, d.reason);
            report_problem(&d.path, d.position, why)
        })
        .collect();
    problems.extend(plan.changes.iter().map(|c| {
        let (position, why) = describe_change(c.what);
        report_problem(&c.path, position, why)
    }));
    let mut report = CheckReport {
        segments: segments.len() as u32,
        records: segments.iter().map(|s| s.record_count).sum(),
        bytes: segments.iter().map(|s| s.len_bytes).sum(),
        first_sequence: plan.first_sequence,
        next_sequence: plan.next_sequence,
        problems,
        repaired: None,
        plan,
    };
    let Some(backup) = backup.filter(|_| !report.plan.changes.is_empty()) else {
        return Ok(report);
    };
    let mut saved: Vec<&Path> = Vec::new();
    for change in &report.plan.changes {
        if !saved.contains(&change.path.as_path()) {
            backup(&change.path).map_err(|e| io_err(&change.path, None, e))?;
            saved.push(&change.path);
        }
    }
    let (_, done, _) = recover(storage, dir, VerifyMode::Everything, true)?;
    report.repaired = Some(done);
    Ok(report)
}

/// Where a change starts and what it is, for a problem line.
fn describe_change(what: ChangeKind) -> (u64, String) {
    match what {
        ChangeKind::Truncate { to, bytes } => (to, format!("truncate {bytes} bytes")),
        ChangeKind::Reset { bytes } => (0, format!("bad header: reset, {bytes} bytes lost")),
        ChangeKind::Remove { bytes } => (0, format!("remove ({bytes} bytes)")),
        ChangeKind::RewriteIndex => (0, "rewrite the index".to_string()),
    }
}

fn report_problem(path: &Path, position: u64, reason: String) -> CheckProblem {
    log::warn!("check: {} at byte {position}: {reason}", path.display());
    CheckProblem {
        path: path.to_path_buf(),
        position,
        reason,
    }
}
