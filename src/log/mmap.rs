//! The only `unsafe` in the log: read-only memory maps of segment and index files, and
//! the one system call std lacks (`sync_file_range`).
//!
//! memmap2 marks every file-backed constructor unsafe because touching a mapping whose file
//! was truncated underneath it raises SIGBUS, and a file modified by someone else changes
//! bytes a `&[u8]` promised were fixed. Keeping the calls in this one file keeps that
//! argument in one place. Depends on std, memmap2 and libc only.

use memmap2::{Mmap, MmapOptions};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Writes the file's dirty pages in `[offset, offset + len)` to the device and waits for
/// them, without the device cache flush of an fdatasync (so it makes nothing durable by
/// itself). Blocks: fsync workers only.
pub(crate) fn write_back_range(file: &File, offset: u64, len: u64) -> io::Result<()> {
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE
        | libc::SYNC_FILE_RANGE_WRITE
        | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    let (offset, len) = (offset as libc::off64_t, len as libc::off64_t);
    // SAFETY: the descriptor is borrowed from a live `File` for the whole call, and no
    // memory of this process is passed: the kernel only reads the arguments.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), offset, len, flags) };
    match rc {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

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
