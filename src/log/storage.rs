//! The storage seam: every byte the log and the broker's metadata put on disk, and every
//! fsync, goes through a [`Storage`]. The real one is [`FsStorage`] (`std::fs`, `mmap` for
//! reads); the simulated one is [`SimDisk`](super::simdisk::SimDisk), which keeps what a
//! power cut would keep apart from what it would lose (`tests/simulation.rs`).
//!
//! Paths stay real paths in both: the simulated disk keys its files by them.

use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::ops::Deref;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

use memmap2::Mmap;

/// How [`Storage::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Open {
    /// Read only; the file must exist.
    Read,
    /// Read and write; the file must exist.
    ReadWrite,
    /// Read and write; creates it, keeping what it holds if it exists.
    Create,
    /// Read and write; the file must not exist.
    CreateNew,
}

/// A file system as the log needs it. Directory operations (create, rename, remove) are
/// durable only after [`Storage::sync_dir`] of the directory holding them.
pub trait Storage: Send + Sync + fmt::Debug {
    fn open(&self, path: &Path, how: Open) -> io::Result<FileRef>;
    /// The whole file.
    fn read(&self, path: &Path) -> io::Result<Vec<u8>>;
    /// Creates or truncates the file and writes `bytes` (not synced).
    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove_file(&self, path: &Path) -> io::Result<()>;
    fn remove_dir_all(&self, path: &Path) -> io::Result<()>;
    fn create_dir_all(&self, path: &Path) -> io::Result<()>;
    /// The names of the entries of a directory.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;
    fn is_dir(&self, path: &Path) -> bool;
    fn file_len(&self, path: &Path) -> io::Result<u64>;
    /// Makes the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, path: &Path) -> io::Result<()>;
}

/// An open file, shared between the reactor (writes, maps) and fsync workers (syncs).
pub type FileRef = Arc<dyn StorageFile>;

pub trait StorageFile: Send + Sync + fmt::Debug {
    /// Writes all of `bytes` at `position`.
    fn write_at(&self, position: u64, bytes: &[u8]) -> io::Result<()>;
    /// Reads up to `buf.len()` bytes at `position`; 0 at the end of the file.
    fn read_at(&self, position: u64, buf: &mut [u8]) -> io::Result<usize>;
    /// The file's length in bytes.
    fn size(&self) -> io::Result<u64>;
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// fdatasync: the file's data written so far survives a power cut.
    fn sync_data(&self) -> io::Result<()>;
    /// Writes the dirty data from `from` to the end of the file to the device in slices,
    /// waiting for each, ahead of a `sync_data` that then has little left to write: a
    /// sync of many MiB would otherwise put all of it on the device queue at once, ahead
    /// of the journal's own small fdatasyncs that acknowledgements wait for. Makes nothing
    /// durable by itself (no device cache flush, no metadata).
    fn write_back(&self, from: u64) -> io::Result<()> {
        let _ = from;
        Ok(())
    }
    /// The first `len` bytes (> 0, within the file) for reading. A memory map may reach
    /// up to `reach` bytes (>= `len`, possibly past the end of the file), so that it
    /// shows bytes appended later without a new map; a copy holds exactly `len`.
    fn map(&self, len: usize, reach: usize) -> io::Result<Mapped>;
}

/// Bytes of a file being read: a memory map of the real file, or a copy.
pub enum Mapped {
    Map(Mmap),
    Copy(Arc<[u8]>),
}

impl Deref for Mapped {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            Mapped::Map(m) => m,
            Mapped::Copy(c) => c,
        }
    }
}

/// Reads exactly `buf.len()` bytes at `position`.
pub fn read_exact_at(
    file: &dyn StorageFile,
    mut position: u64,
    mut buf: &mut [u8],
) -> io::Result<()> {
    while !buf.is_empty() {
        match file.read_at(position, buf)? {
            0 => return Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                position += n as u64;
                buf = &mut buf[n..];
            }
        }
    }
    Ok(())
}

/// Creates `dir` and any missing parents so that they survive a power cut: each new
/// directory's entry lives in its parent, which is synced once the entry exists.
pub fn create_dir_durable(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    let mut missing = Vec::new();
    let mut d = dir;
    while !storage.is_dir(d) {
        missing.push(d);
        match d.parent() {
            Some(p) if !p.as_os_str().is_empty() => d = p,
            _ => break,
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    storage.create_dir_all(dir)?;
    for created in missing.iter().rev() {
        if let Some(parent) = created.parent().filter(|p| !p.as_os_str().is_empty()) {
            storage.sync_dir(parent)?;
        }
    }
    Ok(())
}

/// Failures to sync a directory above the data directory that say the process could not
/// have made it there: not readable by it, on a read-only file system, or on one that
/// cannot sync a directory (`EINVAL`; some read-only roots of small hosts).
const ANCESTOR_SYNC_SKIPPED: [io::ErrorKind; 3] = [
    io::ErrorKind::PermissionDenied,
    io::ErrorKind::ReadOnlyFilesystem,
    io::ErrorKind::InvalidInput,
];

/// [`create_dir_durable`] for a directory of the data directory (`topics/`), and then
/// every directory above it synced as well, the data directory first, up to the root (or
/// the working directory, for a relative path). A directory that already exists is not
/// known to be durable: `mortard` makes the data directory with a plain `create_dir_all`
/// before it takes the lock, and a start that died between its mkdir and the sync of the
/// parent left a directory the next start finds. A directory it could not have made is
/// skipped (`ANCESTOR_SYNC_SKIPPED`). Blocking: start-up only.
pub fn create_data_dir_durable(storage: &dyn Storage, dir: &Path) -> io::Result<()> {
    create_dir_durable(storage, dir)?;
    for ancestor in dir.ancestors().skip(1) {
        // A relative path's last ancestor is "": the working directory holds its entry.
        let ancestor = match ancestor.as_os_str().is_empty() {
            true => Path::new("."),
            false => ancestor,
        };
        match storage.sync_dir(ancestor) {
            Err(e) if ANCESTOR_SYNC_SKIPPED.contains(&e.kind()) => {}
            result => result?,
        }
    }
    Ok(())
}

/// Bytes [`copy_durable`] moves per read and write: a segment is not read whole.
const COPY_CHUNK_BYTES: usize = 1 << 20;

/// Copies `from` to `to` (made or replaced) and makes the copy durable: its bytes, its
/// entry in its directory, and that directory's own entries up the way
/// [`create_dir_durable`] makes them. A backup must outlive a power cut that comes
/// right after the original changes. Blocking.
pub fn copy_durable(storage: &dyn Storage, from: &Path, to: &Path) -> io::Result<()> {
    let dir = to.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        create_dir_durable(storage, dir)?;
    }
    let source = storage.open(from, Open::Read)?;
    let copy = storage.open(to, Open::Create)?;
    let mut chunk = vec![0u8; COPY_CHUNK_BYTES];
    let mut at = 0;
    loop {
        let n = source.read_at(at, &mut chunk)?;
        if n == 0 {
            break;
        }
        copy.write_at(at, &chunk[..n])?;
        at += n as u64;
    }
    copy.set_len(at)?;
    copy.sync_data()?;
    match dir {
        Some(dir) => storage.sync_dir(dir),
        None => Ok(()),
    }
}

/// A `Read` over a storage file from a position, for buffered sequential scans.
pub struct FileReader<'a> {
    file: &'a dyn StorageFile,
    position: u64,
}

impl<'a> FileReader<'a> {
    pub fn new(file: &'a dyn StorageFile, position: u64) -> Self {
        FileReader { file, position }
    }
}

impl io::Read for FileReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read_at(self.position, buf)?;
        self.position += n as u64;
        Ok(n)
    }
}

/// The real file system.
#[derive(Debug, Default, Clone, Copy)]
pub struct FsStorage;

impl FsStorage {
    /// The real file system, as the shared handle the log and the broker take.
    pub fn shared() -> Arc<dyn Storage> {
        Arc::new(FsStorage)
    }
}

#[derive(Debug)]
struct FsFile(File);

impl Storage for FsStorage {
    fn open(&self, path: &Path, how: Open) -> io::Result<FileRef> {
        let mut o = OpenOptions::new();
        o.read(true);
        match how {
            Open::Read => &mut o,
            Open::ReadWrite => o.write(true),
            Open::Create => o.write(true).create(true).truncate(false),
            Open::CreateNew => o.write(true).create_new(true),
        };
        Ok(Arc::new(FsFile(o.open(path)?)))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        fs::read(path)
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        fs::write(path, bytes)
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        fs::remove_file(path)
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::remove_dir_all(path)
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        fs::create_dir_all(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in fs::read_dir(path)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        Ok(fs::metadata(path)?.len())
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        File::open(path)?.sync_all()
    }
}

/// Dirty bytes a [`StorageFile::write_back`] puts on the device at a time: how long the
/// journal's fdatasync may wait behind it (about half a millisecond on the disk of
/// `docs/BENCHMARKS.md`), against one more system call per slice.
const WRITE_BACK_SLICE_BYTES: u64 = 1024 * 1024;

fn write_back_unsupported(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Unsupported
        || matches!(
            e.raw_os_error(),
            Some(libc::EINVAL | libc::ENOSYS | libc::ESPIPE)
        )
}

impl StorageFile for FsFile {
    fn write_at(&self, position: u64, bytes: &[u8]) -> io::Result<()> {
        self.0.write_all_at(bytes, position)
    }

    fn read_at(&self, position: u64, buf: &mut [u8]) -> io::Result<usize> {
        FileExt::read_at(&self.0, buf, position)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.0.metadata()?.len())
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.0.set_len(len)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.0.sync_data()
    }

    fn write_back(&self, from: u64) -> io::Result<()> {
        let len = self.0.metadata()?.len();
        let mut at = from;
        while at < len {
            let n = WRITE_BACK_SLICE_BYTES.min(len - at);
            match super::mmap::write_back_range(&self.0, at, n) {
                Ok(()) => at += n,
                // A file system without it: the fdatasync that follows writes it all.
                Err(e) if write_back_unsupported(&e) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn map(&self, len: usize, reach: usize) -> io::Result<Mapped> {
        super::mmap::map_prefix(&self.0, reach.max(len)).map(Mapped::Map)
    }
}

#[cfg(test)]
mod tests {
    use super::super::simdisk::SimDisk;
    use super::*;

    #[test]
    fn a_copy_made_durable_survives_a_power_cut_whole_with_its_directories() {
        let bytes: Vec<u8> = (0..COPY_CHUNK_BYTES * 2 + 7).map(|i| i as u8).collect();
        let survived = (0..64).all(|seed| {
            let disk = SimDisk::seeded(seed);
            create_dir_durable(&disk, Path::new("/data/topics")).unwrap();
            disk.write(Path::new("/data/topics/00.log"), &bytes)
                .unwrap();
            disk.open(Path::new("/data/topics/00.log"), Open::ReadWrite)
                .and_then(|f| f.sync_data())
                .unwrap();
            disk.sync_dir(Path::new("/data/topics")).unwrap();
            let to = Path::new("/data/check-backup-1/topics/00.log");
            copy_durable(&disk, Path::new("/data/topics/00.log"), to).unwrap();
            disk.power_cut();
            disk.read(to).ok() == Some(bytes.clone())
        });
        assert!(survived, "a power cut took the copy or some of its bytes");
    }

    #[test]
    fn a_data_dir_someone_made_without_a_sync_survives_a_power_cut_once_the_broker_opened_it() {
        // `mortard`'s own `create_dir_all`, or a start that died before its parent syncs.
        let survived = (0..64).all(|seed| {
            let disk = SimDisk::seeded(seed);
            disk.create_dir_all(Path::new("/srv/mq/data")).unwrap();
            create_data_dir_durable(&disk, Path::new("/srv/mq/data/topics")).unwrap();
            disk.power_cut();
            disk.is_dir(Path::new("/srv/mq/data/topics"))
        });
        assert!(survived, "a power cut took a directory the start found");
    }

    #[test]
    fn write_back_runs_to_the_end_of_a_file_from_any_offset_and_keeps_its_bytes() {
        let tmp = tempfile::TempDir::new().unwrap();
        let path = tmp.path().join("f");
        let file = FsStorage.open(&path, Open::Create).unwrap();
        // Two and a half slices, so the last slice is a short one.
        let len = WRITE_BACK_SLICE_BYTES * 5 / 2;
        let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        file.write_at(0, &bytes).unwrap();
        for from in [0, 1, WRITE_BACK_SLICE_BYTES + 5, len, len + 1] {
            file.write_back(from).unwrap();
        }
        file.sync_data().unwrap();
        let mut back = vec![0; len as usize];
        read_exact_at(&*file, 0, &mut back).unwrap();
        assert!(back == bytes);
    }
}
