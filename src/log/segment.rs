//! Segment and index files: names, the segment header, the index entry, and the in-memory
//! handle for one segment (its lengths, its writer while active, its lazy read maps).
//!
//! Knows files and byte positions; knows nothing about buffering, syncing or retention
//! policy. Depends on std, the storage seam (`storage.rs`) and the record layout.
//!
//! # Segment file `<first_sequence:020>.log`
//!
//! ```text
//! offset  width  field                 meaning
//! ------  -----  --------------------  -----------------------------------------------
//! 0       4      magic  "MMQL"         identifies a MortarMQ log segment
//! 4       2      format_version u16    SEGMENT_FORMAT_VERSION (1)
//! 6       2      reserved u16          0
//! 8       8      first_sequence u64    equals the number in the file name
//! 16      ...    records               back to back, see `record.rs`; record i (0-based)
//!                                      has sequence first_sequence + i
//! ```
//!
//! # Index file `<first_sequence:020>.idx`
//!
//! ```text
//! offset  width  field            meaning
//! ------  -----  ---------------  ----------------------------------------------------
//! 4*i     4      position u32 BE  byte offset in the .log of the record with sequence
//!                                 first_sequence + i (so entry 0 is always 16)
//! ```
//!
//! The index is dense (sequences are contiguous, so no sequence is stored). The active
//! segment's newest entries wait in memory (`Segment::idx_unwritten`) and are written
//! once `INDEX_UNWRITTEN_BYTES_MAX` of them gather, before a sync job fdatasyncs the
//! index, and when the segment closes: a write per partition per flush cost as much as
//! the records' own write (`docs/STORAGE.md`). When the segment closes (a roll) the index
//! gets a seal,
//!
//! ```text
//! 4*n     4      0xFFFFFFFF       no position is this large: marks the seal
//! 4*n+4   4      crc u32 BE       crc32 (crc32fast) of the n entries before it
//! ```
//!
//! and is fdatasynced with the segment's last records. Recovery trusts a closed segment's
//! index only when its seal checks out: unsynced index pages may come back stale or torn
//! after a power cut, in the middle as well as at the end. An index without a good seal
//! is derived data, rebuilt from the segment.

use super::record::RECORD_BYTES_MAX;
use super::storage::{FileRef, Mapped, Open, Storage};
use std::io;
use std::path::{Path, PathBuf};

/// Fixed bytes at the start of every segment file.
pub const SEGMENT_HEADER_BYTES: usize = 16;
/// First four bytes of every segment file.
pub const SEGMENT_MAGIC: [u8; 4] = *b"MMQL";
/// Bumped whenever the segment, record or index layout changes.
pub const SEGMENT_FORMAT_VERSION: u16 = 1;
/// Digits in a segment or index file name (u64::MAX has 20).
pub const SEGMENT_NAME_DIGITS: usize = 20;
/// Largest configurable `segment_size_bytes`. Record positions are u32 in the index: a
/// record starts below this limit and may run one RECORD_BYTES_MAX past it.
pub const SEGMENT_BYTES_MAX: u64 = 1024 * 1024 * 1024;
/// Width of one index entry.
pub const INDEX_ENTRY_BYTES: usize = 4;
/// The active segment's index entries held in memory before one write puts them in the
/// file: a page's worth, 1,024 records.
pub const INDEX_UNWRITTEN_BYTES_MAX: usize = 4096;

const _: () = assert!(SEGMENT_BYTES_MAX + RECORD_BYTES_MAX as u64 <= u32::MAX as u64);
const _: () = assert!(SEGMENT_HEADER_BYTES == 4 + 2 + 2 + 8);

pub const SEGMENT_SUFFIX: &str = "log";
pub const INDEX_SUFFIX: &str = "idx";

pub fn segment_path(dir: &Path, first_sequence: u64) -> PathBuf {
    dir.join(format!(
        "{first_sequence:0width$}.{SEGMENT_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    ))
}

pub fn index_path(dir: &Path, first_sequence: u64) -> PathBuf {
    dir.join(format!(
        "{first_sequence:0width$}.{INDEX_SUFFIX}",
        width = SEGMENT_NAME_DIGITS
    ))
}

/// `Some((first_sequence, suffix))` for `<20 digits>.log` or `<20 digits>.idx`.
pub fn parse_file_name(name: &str) -> Option<(u64, &str)> {
    let (stem, suffix) = name.split_once('.')?;
    if stem.len() != SEGMENT_NAME_DIGITS || !stem.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if suffix != SEGMENT_SUFFIX && suffix != INDEX_SUFFIX {
        return None;
    }
    Some((stem.parse().ok()?, suffix))
}

pub fn encode_header(first_sequence: u64) -> [u8; SEGMENT_HEADER_BYTES] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES];
    h[0..4].copy_from_slice(&SEGMENT_MAGIC);
    h[4..6].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_be_bytes());
    h[8..16].copy_from_slice(&first_sequence.to_be_bytes());
    h
}

/// Checks a header read from disk against the sequence in the file's name.
pub fn check_header(bytes: &[u8], first_sequence: u64) -> Result<(), String> {
    if bytes.len() < SEGMENT_HEADER_BYTES {
        return Err(format!(
            "segment header torn: {} of {SEGMENT_HEADER_BYTES} bytes",
            bytes.len()
        ));
    }
    if bytes[0..4] != SEGMENT_MAGIC {
        return Err("bad segment magic".to_string());
    }
    let version = u16::from_be_bytes([bytes[4], bytes[5]]);
    if version != SEGMENT_FORMAT_VERSION {
        return Err(format!("unknown segment format version {version}"));
    }
    let mut seq = [0u8; 8];
    seq.copy_from_slice(&bytes[8..16]);
    let stored = u64::from_be_bytes(seq);
    if stored != first_sequence {
        return Err(format!(
            "header says first sequence {stored}, file name says {first_sequence}"
        ));
    }
    Ok(())
}

/// Marks the seal of a closed segment's index: no record position is this large.
pub const INDEX_SEAL_MARK: [u8; 4] = [0xFF; 4];
/// Bytes of the seal: the mark and the crc of the entries.
pub const INDEX_SEAL_BYTES: usize = 8;

/// The seal of an index whose entries are `entries`.
pub fn index_seal(entries: &[u8]) -> [u8; INDEX_SEAL_BYTES] {
    let mut seal = [0u8; INDEX_SEAL_BYTES];
    seal[..4].copy_from_slice(&INDEX_SEAL_MARK);
    seal[4..].copy_from_slice(&crc32fast::hash(entries).to_be_bytes());
    seal
}

/// An index file read back: its positions, and whether a good seal closed it.
pub struct DecodedIndex {
    pub entries: Vec<u32>,
    pub sealed: bool,
}

/// Decodes index bytes into positions; a torn trailing partial entry is ignored, and a
/// seal is recognised only when its crc matches the entries.
pub fn decode_index(bytes: &[u8]) -> DecodedIndex {
    let n = bytes.len();
    let sealed = n >= INDEX_SEAL_BYTES
        && n.is_multiple_of(INDEX_ENTRY_BYTES)
        && bytes[n - INDEX_SEAL_BYTES..n - 4] == INDEX_SEAL_MARK
        && index_seal(&bytes[..n - INDEX_SEAL_BYTES]) == bytes[n - INDEX_SEAL_BYTES..];
    let entries = if sealed {
        &bytes[..n - INDEX_SEAL_BYTES]
    } else {
        bytes
    };
    DecodedIndex {
        entries: entries
            .chunks_exact(INDEX_ENTRY_BYTES)
            .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        sealed,
    }
}

/// The bytes of an index listing `positions`, sealed for a closed segment.
pub fn encode_index(positions: &[u32], sealed: bool) -> Vec<u8> {
    let mut out: Vec<u8> = positions.iter().flat_map(|p| p.to_be_bytes()).collect();
    if sealed {
        let seal = index_seal(&out);
        out.extend_from_slice(&seal);
    }
    out
}

/// Open handles of the active segment. Closed segments hold no descriptors: a host with
/// many partitions would otherwise run out of them.
pub(crate) struct Writer {
    /// Shared with sync jobs, which fdatasync it on a worker thread.
    pub log: FileRef,
    pub idx: FileRef,
}

/// The smallest map of a segment being written: see [`map_len_for`].
const ACTIVE_MAP_BYTES_MIN: usize = 64 * 1024;

/// How much of a segment being written to map when `needed` bytes must be covered: the
/// next power of two, so that a segment growing to its size is remapped a few times
/// (about log2(segment size / 64 KiB)) instead of after every flush, with at most twice
/// its length in address space.
fn map_len_for(needed: usize) -> usize {
    needed.next_power_of_two().max(ACTIVE_MAP_BYTES_MIN)
}

/// One segment as the running log sees it. `len_bytes` and `record_count` count only
/// flushed bytes; the writer may have bytes beyond them only in the middle of a flush.
pub(crate) struct Segment {
    pub first_sequence: u64,
    pub log_path: PathBuf,
    pub idx_path: PathBuf,
    pub len_bytes: u64,
    pub record_count: u64,
    /// Timestamp of the last record, when known without a read (set on flush).
    pub last_timestamp_ms: Option<u64>,
    pub writer: Option<Writer>,
    /// Index entries of the last records, not in the index file yet (the active segment
    /// only; empty once it closes). The file holds the entries before them.
    pub idx_unwritten: Vec<u8>,
    pub log_map: Option<Mapped>,
    pub idx_map: Option<Mapped>,
    /// Tick of the last read through the maps; the least recent are unmapped first.
    pub map_used_tick: u64,
}

impl Segment {
    pub fn new(dir: &Path, first_sequence: u64, len_bytes: u64, record_count: u64) -> Self {
        Segment {
            first_sequence,
            log_path: segment_path(dir, first_sequence),
            idx_path: index_path(dir, first_sequence),
            len_bytes,
            record_count,
            last_timestamp_ms: None,
            writer: None,
            idx_unwritten: Vec::new(),
            log_map: None,
            idx_map: None,
            map_used_tick: 0,
        }
    }

    /// One past the last flushed sequence of this segment.
    pub fn end_sequence(&self) -> u64 {
        self.first_sequence + self.record_count
    }

    pub fn is_mapped(&self) -> bool {
        self.log_map.is_some() || self.idx_map.is_some()
    }

    pub fn unmap(&mut self) {
        self.log_map = None;
        self.idx_map = None;
    }

    /// Makes the maps cover every flushed byte, remapping a segment that grew since. The
    /// segment being written is mapped past its end ([`map_len_for`]): a consumer at the
    /// tail would otherwise remap it after every flush, and each munmap of a large map
    /// stalls the reactor (measured up to 10 ms, `docs/BENCHMARKS.md`).
    pub fn ensure_mapped(&mut self, storage: &dyn Storage) -> io::Result<()> {
        let log_len = self.len_bytes as usize;
        if self.log_map.as_ref().is_none_or(|m| m.len() < log_len) {
            self.log_map = Some(self.map_file(storage, false, log_len)?);
        }
        let idx_len = self.index_file_bytes();
        if idx_len > 0 && self.idx_map.as_ref().is_none_or(|m| m.len() < idx_len) {
            self.idx_map = Some(self.map_file(storage, true, idx_len)?);
        }
        Ok(())
    }

    /// Bytes of index entries in the file: every flushed record's but the unwritten ones.
    pub fn index_file_bytes(&self) -> usize {
        self.record_count as usize * INDEX_ENTRY_BYTES - self.idx_unwritten.len()
    }

    /// The flushed bytes of the segment file, from its map (empty when not mapped). A map
    /// may reach past them: nothing past them is ever read (a page wholly past the end
    /// of the file would raise SIGBUS).
    pub fn log_bytes(&self) -> &[u8] {
        let m = self.log_map.as_deref().unwrap_or(&[]);
        &m[..m.len().min(self.len_bytes as usize)]
    }

    /// The index entries in the file, from the index map.
    pub fn idx_bytes(&self) -> &[u8] {
        let m = self.idx_map.as_deref().unwrap_or(&[]);
        &m[..m.len().min(self.index_file_bytes())]
    }

    fn map_file(&self, storage: &dyn Storage, index: bool, len: usize) -> io::Result<Mapped> {
        match (&self.writer, index) {
            (Some(w), false) => w.log.map(len, map_len_for(len)),
            (Some(w), true) => w.idx.map(len, map_len_for(len)),
            (None, false) => storage.open(&self.log_path, Open::Read)?.map(len, len),
            (None, true) => storage.open(&self.idx_path, Open::Read)?.map(len, len),
        }
    }

    /// Byte position of `sequence` from the mapped index, or from the unwritten entries;
    /// the caller mapped first.
    pub fn position_of(&self, sequence: u64) -> Result<u64, String> {
        debug_assert!(sequence >= self.first_sequence && sequence < self.end_sequence());
        let i = (sequence - self.first_sequence) as usize * INDEX_ENTRY_BYTES;
        let in_file = self.index_file_bytes();
        let entry = match i.checked_sub(in_file) {
            None => self.idx_bytes().get(i..i + INDEX_ENTRY_BYTES),
            Some(j) => self.idx_unwritten.get(j..j + INDEX_ENTRY_BYTES),
        };
        let Some(b) = entry else {
            return Err(format!("index has no entry for sequence {sequence}"));
        };
        let pos = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as u64;
        if pos < SEGMENT_HEADER_BYTES as u64 || pos >= self.len_bytes {
            return Err(format!(
                "index entry for sequence {sequence} points to byte {pos}"
            ));
        }
        Ok(pos)
    }
}
