//! The only `unsafe` in the log: read-only memory maps of segment and index files.
//!
//! memmap2 marks every file-backed constructor unsafe because touching a mapping whose file
//! was truncated underneath it raises SIGBUS, and a file modified by someone else changes
//! bytes a `&[u8]` promised were fixed. Keeping the calls in this one file keeps that
//! argument in one place. Depends on std and memmap2 only.

use memmap2::{Mmap, MmapOptions};
use std::fs::File;
use std::io;

/// Maps the first `len` bytes of `file` read-only. `len` must be > 0; it may reach past
/// the end of a file still being appended to.
pub(crate) fn map_prefix(file: &File, len: usize) -> io::Result<Mmap> {
    debug_assert!(len > 0, "memmap2 rejects empty maps on some platforms");
    // SAFETY: only bytes this process has already written and counted as flushed are read
    // through the mapping (`Segment::log_bytes`/`idx_bytes` cut it at the committed length;
    // a map of a segment being written may reach past the end of the file, where touching
    // a page wholly past it would raise SIGBUS), and those bytes are never rewritten:
    // segment and index files are append-only while the log is open. The only truncations
    // are (a) recovery, which runs before any mapping exists, and (b) undoing a failed
    // flush, which cuts back to the committed length, never below it, so never into bytes
    // read through a mapping. Retention deletes by unlinking, which keeps existing mappings
    // valid. The data directory belongs to one broker process (others must not write it).
    unsafe { MmapOptions::new().len(len).map(file) }
}
