//! The files of a journal directory, whatever the entries in them: what format 1
//! (`journal.rs`, the node-wide journal) and format 2 (`journal2.rs`, the raft journal)
//! both do with them. Naming (`<first_lsn:020>.jnl`), the 16-byte file header (magic,
//! format version, first LSN), listing, opening with a header check, replaying entries
//! file by file, removing what lies outside the journal, cutting the last file at its end
//! after replay, starting files, writing queued entries across them, and gathering what
//! the next fdatasync must cover.
//!
//! What an entry holds, when one counts, checkpoints and truncation stay in each format's
//! file: this room sees an entry only as length, CRC, LSN and bytes, and the format
//! version it writes into headers is its caller's. Depends on std, log and the storage
//! seam (`storage.rs`), like the rest of `log`, and crc32fast for the entry framing
//! both formats share (length, CRC, LSN).

use std::collections::VecDeque;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::error::StorageError;
use super::meta;
use super::storage::{self, FileReader, FileRef, Open, Storage};

/// First four bytes of every journal file, of either format.
pub const JOURNAL_MAGIC: [u8; 4] = *b"MMQJ";
/// The file header of both formats: magic, format version, reserved, first LSN.
pub const FILE_HEADER_BYTES: usize = 16;
pub const JOURNAL_SUFFIX: &str = "jnl";
/// The checkpoint's file name in the journal directory.
pub const CHECKPOINT_FILE: &str = "checkpoint";
/// Read buffer when replaying.
const REPLAY_READ_BUFFER_BYTES: usize = 256 * 1024;

pub fn journal_file_path(dir: &Path, first_lsn: u64) -> PathBuf {
    dir.join(format!("{first_lsn:020}.{JOURNAL_SUFFIX}"))
}

fn file_header(format_version: u16, first_lsn: u64) -> [u8; FILE_HEADER_BYTES] {
    let mut h = [0u8; FILE_HEADER_BYTES];
    h[..4].copy_from_slice(&JOURNAL_MAGIC);
    h[4..6].copy_from_slice(&format_version.to_be_bytes());
    h[8..].copy_from_slice(&first_lsn.to_be_bytes());
    h
}

/// A format's entry framing: every entry starts with its whole length as a big-endian
/// u32, inside a header of `header_bytes`; readers allocate for at most `max_bytes`.
#[derive(Debug, Clone, Copy)]
pub struct EntryBounds {
    pub header_bytes: usize,
    pub max_bytes: usize,
}

impl EntryBounds {
    pub const fn new(header_bytes: usize, max_bytes: usize) -> EntryBounds {
        assert!(max_bytes <= u32::MAX as usize, "lengths are u32");
        assert!(header_bytes >= 16, "length, crc and lsn come first");
        EntryBounds {
            header_bytes,
            max_bytes,
        }
    }
}

/// The error for a write to a journal in `dir` that refuses writes since `poisoned`.
pub fn refuse_if_poisoned(poisoned: &Option<String>, dir: &Path) -> Result<(), StorageError> {
    match poisoned {
        Some(reason) => Err(StorageError::Poisoned {
            path: dir.to_path_buf(),
            reason: reason.clone(),
        }),
        None => Ok(()),
    }
}

/// After a failed `what`, the journal in `dir` refuses writes until restart: entries
/// after a hole could never be replayed. The first reason stays.
pub fn poison_on(
    poisoned: &mut Option<String>,
    dir: &Path,
    result: &Result<(), StorageError>,
    what: &str,
) {
    if let Err(e) = result {
        log::error!(
            "{}: {what}, refusing writes until restart: {e}",
            dir.display()
        );
        poisoned.get_or_insert_with(|| format!("{what}: {e}"));
    }
}

/// A journal file and the LSNs it holds.
pub struct JournalFile {
    pub first_lsn: u64,
    pub path: PathBuf,
    pub file: FileRef,
    /// Bytes used, header included.
    pub len: u64,
    /// Made from a spare (format 1): its blocks are allocated, appends do not grow it.
    pub preallocated: bool,
}

/// One fdatasync of the journal files written since the previous one, and of the
/// directory when a file was created or removed.
#[derive(Debug)]
pub struct FilesSync {
    storage: Arc<dyn Storage>,
    files: Vec<FileRef>,
    sync_dir: Option<PathBuf>,
}

impl FilesSync {
    /// Blocks: fsync worker only.
    pub fn run(&self) -> io::Result<()> {
        for file in &self.files {
            file.sync_data()?;
        }
        match &self.sync_dir {
            Some(dir) => self.storage.sync_dir(dir),
            None => Ok(()),
        }
    }
}

/// Takes the bytes of one entry (exactly one, header included) and the LSN expected
/// there during replay; `Err(why)` when the entry does not count, which ends the journal.
pub type OnEntry<'a> = dyn FnMut(&[u8], u64) -> Result<(), String> + 'a;

/// What [`JournalFiles::replay`] found.
#[derive(Debug, Default)]
pub struct Replayed {
    /// Where replay started: the checkpoint's LSN, or the oldest file's.
    pub start_lsn: u64,
    pub end_lsn: u64,
    /// Why the journal ended where it did, when not at the end of its last file.
    pub ended_by: Option<String>,
    pub files_removed: u32,
}

/// The files of one journal directory, oldest first; the last one is written to.
pub struct JournalFiles {
    pub storage: Arc<dyn Storage>,
    pub dir: PathBuf,
    format_version: u16,
    bounds: EntryBounds,
    pub open: VecDeque<JournalFile>,
    unsynced: Vec<FileRef>,
    /// A file was created or removed since the previous sync job.
    pub dir_dirty: bool,
}

impl JournalFiles {
    pub fn new(
        storage: &Arc<dyn Storage>,
        dir: &Path,
        format_version: u16,
        bounds: EntryBounds,
    ) -> JournalFiles {
        JournalFiles {
            storage: Arc::clone(storage),
            dir: dir.to_path_buf(),
            format_version,
            bounds,
            open: VecDeque::new(),
            unsynced: Vec::new(),
            dir_dirty: false,
        }
    }

    /// Makes the directory if missing. Blocking: start-up only.
    pub fn create_dir(&self) -> Result<(), StorageError> {
        storage::create_dir_durable(&*self.storage, &self.dir)
            .map_err(|e| StorageError::from_io(&self.dir, None, e))
    }

    /// The checkpoint's payload when it is one of `lens` bytes long; `None` when there is
    /// none or it cannot be read. Blocking: start-up only.
    pub fn read_checkpoint(&self, lens: &[usize]) -> Option<Vec<u8>> {
        let path = self.dir.join(CHECKPOINT_FILE);
        match meta::read_checked(&*self.storage, &path) {
            Ok(Some(b)) if lens.contains(&b.len()) => Some(b),
            Ok(None) => None,
            Ok(Some(_)) | Err(_) => {
                // Replaying from the oldest file is always safe, only slower: entries
                // already applied are skipped.
                log::warn!(
                    "{}: unreadable; replaying the whole journal",
                    path.display()
                );
                None
            }
        }
    }

    /// Finds the files and hands `on_entry` the bytes of every entry from `checkpoint`
    /// (`None`: the oldest file) with the LSN expected there, until it refuses one or
    /// the journal ends; removes the files wholly below the start and those past the
    /// end, and cuts the last file at the end. Blocking: start-up only.
    pub fn replay(
        &mut self,
        checkpoint: Option<u64>,
        on_entry: &mut OnEntry<'_>,
    ) -> Result<Replayed, StorageError> {
        let mut firsts = self.list()?;
        let start = checkpoint.unwrap_or_else(|| firsts.first().copied().unwrap_or(0));
        let mut report = Replayed {
            start_lsn: start,
            ..Replayed::default()
        };
        // Files wholly below the checkpoint: an interrupted removal.
        while firsts.len() >= 2 && firsts[1] <= start {
            self.remove(firsts.remove(0), &mut report)?;
        }
        let mut lsn = start;
        let mut used = 0;
        while used < firsts.len() && firsts[used] <= lsn {
            let file = self.replay_file(firsts[used], &mut lsn, on_entry, &mut report)?;
            self.open.push_back(file);
            used += 1;
            // Only a file that starts exactly where this one ended continues the journal.
            if firsts.get(used) != Some(&lsn) {
                break;
            }
        }
        for &first in &firsts[used..] {
            self.remove(first, &mut report)?;
        }
        report.end_lsn = lsn;
        self.settle_after_replay()?;
        Ok(report)
    }

    /// Cuts the last file at the end of its last entry (what follows was never
    /// acknowledged, and a later entry must not land after it) and makes every file kept
    /// and the directory durable. Replay read the page cache, which outlives a killed
    /// process: an entry written, or a cut made, just before the kill may not be on the
    /// disk yet, and from here on it counts as durable (a raft follower reports it as
    /// persisted, a producer's resend is answered as a duplicate). A later sync covers
    /// only the files written after the restart, so without this a power cut could take
    /// back an earlier file's tail, or undo its cut, and replay would end there, behind
    /// entries synced since.
    fn settle_after_replay(&mut self) -> Result<(), StorageError> {
        if let Some(last) = self.open.back() {
            let io = |e| StorageError::from_io(&last.path, Some(last.len), e);
            last.file.set_len(last.len).map_err(io)?;
        }
        for f in &self.open {
            let io = |e| StorageError::from_io(&f.path, Some(f.len), e);
            f.file.sync_data().map_err(io)?;
        }
        self.storage
            .sync_dir(&self.dir)
            .map_err(|e| StorageError::from_io(&self.dir, None, e))
    }

    /// The first LSNs of the journal files, sorted.
    fn list(&self) -> Result<Vec<u64>, StorageError> {
        let names = self
            .storage
            .list_dir(&self.dir)
            .map_err(|e| StorageError::from_io(&self.dir, None, e))?;
        let mut firsts: Vec<u64> = names
            .iter()
            .filter_map(|n| n.strip_suffix(&format!(".{JOURNAL_SUFFIX}")))
            .filter(|stem| stem.len() == 20 && stem.bytes().all(|b| b.is_ascii_digit()))
            .filter_map(|stem| stem.parse().ok())
            .collect();
        firsts.sort_unstable();
        Ok(firsts)
    }

    fn remove(&self, first: u64, report: &mut Replayed) -> Result<(), StorageError> {
        let path = journal_file_path(&self.dir, first);
        log::info!("{}: removed (outside the journal)", path.display());
        report.files_removed += 1;
        self.storage
            .remove_file(&path)
            .map_err(|e| StorageError::from_io(&path, None, e))
    }

    /// Replays file `first` from `*lsn`, moving `*lsn` past each entry `on_entry` takes;
    /// returns the file, open for writing after the last of them.
    fn replay_file(
        &self,
        first: u64,
        lsn: &mut u64,
        on_entry: &mut OnEntry<'_>,
        report: &mut Replayed,
    ) -> Result<JournalFile, StorageError> {
        let path = journal_file_path(&self.dir, first);
        let (file, size) = self.open_checked(first, &path)?;
        let io = |pos, e| StorageError::from_io(&path, pos, e);
        let start = FILE_HEADER_BYTES as u64 + (*lsn - first);
        let mut reader =
            BufReader::with_capacity(REPLAY_READ_BUFFER_BYTES, FileReader::new(&*file, start));
        let mut pos = start;
        let mut bytes = Vec::new();
        loop {
            let available = size.saturating_sub(pos);
            let why = match read_entry(&mut reader, &mut bytes, available, self.bounds) {
                Ok(Some(())) => match on_entry(&bytes, *lsn) {
                    Ok(()) => {
                        *lsn += bytes.len() as u64;
                        pos += bytes.len() as u64;
                        continue;
                    }
                    Err(why) => Some(why),
                },
                Ok(None) => None,
                Err(e) => return Err(io(Some(pos), e)),
            };
            report.ended_by = why.map(|w| format!("{} at byte {pos}: {w}", path.display()));
            return Ok(JournalFile {
                first_lsn: first,
                path,
                file,
                len: pos,
                // Cut at its end just after: it grows again.
                preallocated: false,
            });
        }
    }

    /// Opens file `first` for replay, with its size; one whose header was lost (made
    /// just before a crash) holds nothing, and is reset to an empty file under its name.
    fn open_checked(&self, first: u64, path: &Path) -> Result<(FileRef, u64), StorageError> {
        let io = |pos, e| StorageError::from_io(path, pos, e);
        let file = self
            .storage
            .open(path, Open::ReadWrite)
            .map_err(|e| io(None, e))?;
        let mut size = file.size().map_err(|e| io(None, e))?;
        let header = file_header(self.format_version, first);
        let mut found = [0u8; FILE_HEADER_BYTES];
        let header_ok = size >= FILE_HEADER_BYTES as u64
            && storage::read_exact_at(&*file, 0, &mut found).is_ok()
            && found == header;
        if !header_ok {
            file.set_len(0).map_err(|e| io(Some(0), e))?;
            file.write_at(0, &header).map_err(|e| io(Some(0), e))?;
            size = FILE_HEADER_BYTES as u64;
        }
        Ok((file, size))
    }

    /// Writes `buf` (entries of `entry_lens` bytes, back to back, the first at LSN
    /// `*written_lsn`) into the last file and, when the next entry would take a file past
    /// `file_bytes`, into new ones started by `start_file`; moves `*written_lsn`.
    pub fn write_entries(
        &mut self,
        buf: &[u8],
        entry_lens: &[usize],
        file_bytes: u64,
        written_lsn: &mut u64,
        start_file: &mut dyn FnMut(&mut JournalFiles, u64) -> Result<(), StorageError>,
    ) -> Result<(), StorageError> {
        let (mut at, mut i) = (0, 0);
        while i < entry_lens.len() {
            let Some(f) = self.open.back() else {
                start_file(self, *written_lsn)?;
                continue;
            };
            let room = file_bytes.saturating_sub(f.len) as usize;
            let fresh = f.len == FILE_HEADER_BYTES as u64;
            let (mut chunk, mut j) = (0, i);
            // A file takes entries while they fit; an empty one takes any entry.
            while j < entry_lens.len() && (chunk + entry_lens[j] <= room || (fresh && j == i)) {
                chunk += entry_lens[j];
                j += 1;
            }
            if j == i {
                start_file(self, *written_lsn)?;
                continue;
            }
            let f = self.open.back_mut().expect("a file to write to");
            f.file
                .write_at(f.len, &buf[at..at + chunk])
                .map_err(|e| StorageError::from_io(&f.path, Some(f.len), e))?;
            f.len += chunk as u64;
            let file = Arc::clone(&f.file);
            self.mark_unsynced(file);
            *written_lsn += chunk as u64;
            at += chunk;
            i = j;
        }
        Ok(())
    }

    /// Starts the file whose first entry has LSN `first_lsn`: from `spare` (a file whose
    /// blocks are allocated, renamed into place) or a new one.
    pub fn start_file(&mut self, first_lsn: u64, spare: Option<&Path>) -> Result<(), StorageError> {
        let path = journal_file_path(&self.dir, first_lsn);
        let io = |e| StorageError::from_io(&path, Some(0), e);
        let file = match spare {
            Some(spare) => {
                // The old bytes past the header are entries of other LSNs: they never
                // count.
                self.storage.rename(spare, &path).map_err(io)?;
                self.storage.open(&path, Open::ReadWrite).map_err(io)?
            }
            None => self.storage.open(&path, Open::CreateNew).map_err(io)?,
        };
        let header = file_header(self.format_version, first_lsn);
        file.write_at(0, &header).map_err(io)?;
        self.dir_dirty = true;
        self.open.push_back(JournalFile {
            first_lsn,
            path,
            file,
            len: FILE_HEADER_BYTES as u64,
            preallocated: spare.is_some(),
        });
        Ok(())
    }

    /// `file` was written to (or cut): the next sync job covers it.
    pub fn mark_unsynced(&mut self, file: FileRef) {
        if !self.unsynced.iter().any(|u| Arc::ptr_eq(u, &file)) {
            self.unsynced.push(file);
        }
    }

    /// Drops `file` from what the next sync covers: it is going away.
    pub fn forget(&mut self, file: &FileRef) {
        self.unsynced.retain(|u| !Arc::ptr_eq(u, file));
    }

    /// Whether anything was written, cut, created or removed since the previous job.
    pub fn sync_due(&self) -> bool {
        !self.unsynced.is_empty() || self.dir_dirty
    }

    /// The fdatasync of everything written since the previous job.
    pub fn take_sync(&mut self) -> FilesSync {
        FilesSync {
            storage: Arc::clone(&self.storage),
            files: std::mem::take(&mut self.unsynced),
            sync_dir: std::mem::take(&mut self.dir_dirty).then(|| self.dir.clone()),
        }
    }

    /// Lets go of the files wholly below `checkpoint_lsn` and returns their paths, which
    /// the caller deletes off the reactor. The file being written is never one of them.
    pub fn release_below(&mut self, checkpoint_lsn: u64) -> Vec<PathBuf> {
        let mut gone = Vec::new();
        while self.open.len() >= 2 && self.open[1].first_lsn <= checkpoint_lsn {
            let f = self.open.pop_front().expect("len checked");
            self.forget(&f.file);
            gone.push(f.path);
        }
        gone
    }

    /// Files contiguous in LSNs and the writer at `written_lsn`, the end of the last.
    pub fn check_invariants(&self, written_lsn: u64) {
        for pair in self.open.iter().collect::<Vec<_>>().windows(2) {
            let held = pair[0].len - FILE_HEADER_BYTES as u64;
            assert_eq!(
                pair[0].first_lsn + held,
                pair[1].first_lsn,
                "journal files contiguous"
            );
        }
        if let Some(last) = self.open.back() {
            let held = last.len - FILE_HEADER_BYTES as u64;
            assert_eq!(last.first_lsn + held, written_lsn, "the writer at the end");
        }
    }
}

/// Starts an entry of `len` bytes at the end of `buf` with what both formats begin
/// every entry with: its length, room for its CRC, its LSN. Returns where it starts, for
/// [`seal_entry`] once the rest is there.
pub fn begin_entry(buf: &mut Vec<u8>, len: usize, lsn: u64) -> usize {
    let start = buf.len();
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    buf.extend_from_slice(&[0; 4]); // the crc, once the rest is there
    buf.extend_from_slice(&lsn.to_be_bytes());
    start
}

/// Writes the CRC of the entry at `start` (the rest of `buf`): crc32 of its bytes from
/// offset 8 on.
pub fn seal_entry(buf: &mut [u8], start: usize) {
    let crc = crc32fast::hash(&buf[start + 8..]);
    buf[start + 4..start + 8].copy_from_slice(&crc.to_be_bytes());
}

/// Checks what both formats check first in the entry `bytes` holds (exactly one,
/// header included): its header is whole, its length and CRC match, its LSN is `lsn`.
pub fn check_entry(bytes: &[u8], bounds: EntryBounds, lsn: u64) -> Result<(), String> {
    if bytes.len() < bounds.header_bytes {
        return Err("short entry".into());
    }
    let u32_at = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4"));
    if u32_at(0) as usize != bytes.len() || crc32fast::hash(&bytes[8..]) != u32_at(4) {
        return Err("length or crc mismatch".into());
    }
    let found = u64::from_be_bytes(bytes[8..16].try_into().expect("8"));
    if found != lsn {
        return Err(format!("lsn {found} where {lsn} was expected"));
    }
    Ok(())
}

/// Reads the next entry's bytes into `buf` when `available` bytes can hold it: `None` at
/// the end (fewer bytes than a header, a zero or impossible length, or a length past the
/// end); the length is checked before anything is allocated for it.
fn read_entry(
    reader: &mut impl Read,
    buf: &mut Vec<u8>,
    available: u64,
    bounds: EntryBounds,
) -> io::Result<Option<()>> {
    if available < bounds.header_bytes as u64 {
        return Ok(None);
    }
    buf.clear();
    buf.resize(bounds.header_bytes, 0);
    reader.read_exact(buf)?;
    let len = u32::from_be_bytes(buf[..4].try_into().expect("4")) as usize;
    let possible = bounds.header_bytes..=bounds.max_bytes;
    if !possible.contains(&len) || len as u64 > available {
        return Ok(None);
    }
    buf.resize(len, 0);
    reader.read_exact(&mut buf[bounds.header_bytes..])?;
    Ok(Some(()))
}
