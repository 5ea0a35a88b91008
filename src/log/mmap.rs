//! The only `unsafe` in the log: read-only memory maps of segment and index files.
//!
//! memmap2 marks every file-backed constructor unsafe because touching a mapping whose file
//! was truncated underneath it raises SIGBUS, and a file modified by someone else changes
//! bytes a `&[u8]` promised were fixed. Keeping the calls in this one file keeps that
//! argument in one place. Depends on std and memmap2 only.

use memmap2::{Mmap, MmapOptions};
use std::fs::File;
use std::io;

/// Maps the first `len` bytes of `file` read-only. `len` must be > 0 and within the file.
pub(crate) fn map_prefix(file: &File, len: usize) -> io::Result<Mmap> {
    debug_assert!(len > 0, "memmap2 rejects empty maps on some platforms");
    // SAFETY: the mapping covers only bytes this process has already written and counted as
    // flushed (`len` <= the segment's committed length), and those bytes are never rewritten:
    // segment and index files are append-only while the log is open. The only truncations
    // are (a) recovery, which runs before any mapping exists, and (b) undoing a failed
    // flush, which cuts back to the committed length, never below it, so never into a mapped
    // page range. Retention deletes by unlinking, which keeps existing mappings valid. The
    // data directory belongs to one broker process (other processes must not write it).
    unsafe { MmapOptions::new().len(len).map(file) }
}
