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

    fn map(&self, len: usize, reach: usize) -> io::Result<Mapped> {
        super::mmap::map_prefix(&self.0, reach.max(len)).map(Mapped::Map)
    }
}
