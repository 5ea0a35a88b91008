//! A simulated disk for the deterministic simulator (`tests/simulation.rs`): a
//! [`Storage`] that keeps, per file, the durable image and the writes since its last
//! sync, and per directory the entries made durable by a directory sync.
//!
//! [`SimDisk::power_cut`] is what a real disk may do when the power goes: every write not
//! yet synced is lost, kept, or torn at a random byte, each on its own; directory changes
//! not yet synced survive as a prefix of the order they were made in (a journaling file
//! system commits metadata in order), and whatever a lost directory held is lost with it
//! (out of reach, as in lost+found). Faults (EIO, ENOSPC) are drawn from the same seeded
//! generator, so one seed replays one history exactly.
//!
//! Open handles name an inode, as on a real file system: a file renamed or unlinked while
//! open is still written through its handle. After a power cut every older handle fails.
//!
//! [`SimDisk::crash_after`] stops the process between two operations, wherever they fall:
//! inside a durable job (between a rename and its directory sync) as well as between
//! jobs. From that point every change fails with EIO and leaves no trace, so what the
//! next process finds (after a kill, or a power cut) is what the dead one had done.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use super::storage::{FileRef, Mapped, Open, Storage, StorageFile};

/// errno values the simulated disk fails with.
const EIO: i32 = 5;
const ENOSPC: i32 = 28;
const ENOENT: i32 = 2;
const EEXIST: i32 = 17;

/// A small deterministic generator (xorshift64*): no dependency, same sequence per seed.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> SimRng {
        SimRng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `per_million` / 1 000 000.
    pub fn chance(&mut self, per_million: u32) -> bool {
        self.below(1_000_000) < u64::from(per_million)
    }
}

/// How often operations fail, per million operations of each kind.
#[derive(Debug, Clone, Copy, Default)]
pub struct FaultRates {
    /// `write_at` and `write` fail with EIO, or with ENOSPC.
    pub write_eio: u32,
    pub write_enospc: u32,
    /// `sync_data` and `sync_dir` fail with EIO.
    pub sync_eio: u32,
    /// `open`, `read`, `read_at` and `map` fail with EIO.
    pub read_eio: u32,
}

#[derive(Debug, Clone)]
enum DataOp {
    Write { position: u64, bytes: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default)]
struct Inode {
    durable: Vec<u8>,
    live: Vec<u8>,
    /// What changed `live` since the last sync, in order.
    volatile: Vec<DataOp>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    File(u64),
    Dir,
}

/// A directory change not yet made durable, filed under the directory it changes.
#[derive(Debug, Clone)]
struct DirOp {
    dir: PathBuf,
    path: PathBuf,
    entry: Option<Entry>,
}

#[derive(Debug, Default)]
struct Disk {
    inodes: BTreeMap<u64, Inode>,
    next_inode: u64,
    live: BTreeMap<PathBuf, Entry>,
    durable: BTreeMap<PathBuf, Entry>,
    pending: Vec<DirOp>,
    rng: Option<SimRng>,
    faults: FaultRates,
    /// Bumped by every power cut; handles from before it fail.
    generation: u64,
    /// Changes left before the process crashes (`crash_after`), and whether it has.
    crash_in: Option<u64>,
    crashed: bool,
    /// Counters for the simulator's report.
    power_cuts: u64,
    writes_torn: u64,
    writes_lost: u64,
}

/// The simulated disk; clones share it. Its root `/` always exists.
#[derive(Clone)]
pub struct SimDisk(Arc<Mutex<Disk>>);

impl std::fmt::Debug for SimDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SimDisk")
    }
}

impl Default for SimDisk {
    fn default() -> Self {
        let mut disk = Disk::default();
        disk.live.insert(PathBuf::from("/"), Entry::Dir);
        disk.durable.insert(PathBuf::from("/"), Entry::Dir);
        SimDisk(Arc::new(Mutex::new(disk)))
    }
}

#[derive(Debug)]
struct SimFile {
    disk: SimDisk,
    inode: u64,
    generation: u64,
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn parent(path: &Path) -> PathBuf {
    path.parent().map(Path::to_path_buf).unwrap_or_default()
}

fn apply(image: &mut Vec<u8>, op: &DataOp) {
    match op {
        DataOp::Write { position, bytes } => {
            let end = *position as usize + bytes.len();
            if image.len() < end {
                image.resize(end, 0);
            }
            image[*position as usize..end].copy_from_slice(bytes);
        }
        DataOp::SetLen(len) => image.resize(*len as usize, 0),
    }
}

impl Disk {
    /// Every change passes here first: past the crash point nothing changes any more.
    fn change(&mut self) -> io::Result<()> {
        match self.crash_in {
            _ if self.crashed => return Err(errno(EIO)),
            Some(0) => {
                self.crashed = true;
                self.crash_in = None;
                return Err(errno(EIO));
            }
            Some(left) => self.crash_in = Some(left - 1),
            None => {}
        }
        Ok(())
    }

    fn fault(&mut self, per_million: u32) -> bool {
        per_million > 0 && self.rng.as_mut().is_some_and(|r| r.chance(per_million))
    }

    fn write_fault(&mut self) -> io::Result<()> {
        let (eio, enospc) = (self.faults.write_eio, self.faults.write_enospc);
        if self.fault(eio) {
            return Err(errno(EIO));
        }
        if self.fault(enospc) {
            return Err(errno(ENOSPC));
        }
        Ok(())
    }

    fn read_fault(&mut self) -> io::Result<()> {
        let rate = self.faults.read_eio;
        if self.fault(rate) {
            return Err(errno(EIO));
        }
        Ok(())
    }

    fn link(&mut self, path: &Path, entry: Option<Entry>) {
        match entry {
            Some(e) => self.live.insert(path.to_path_buf(), e),
            None => self.live.remove(path),
        };
        self.pending.push(DirOp {
            dir: parent(path),
            path: path.to_path_buf(),
            entry,
        });
    }

    fn new_file(&mut self, path: &Path) -> io::Result<u64> {
        if self.live.get(&parent(path)) != Some(&Entry::Dir) && parent(path) != Path::new("") {
            return Err(errno(ENOENT));
        }
        let inode = self.next_inode;
        self.next_inode += 1;
        self.inodes.insert(inode, Inode::default());
        self.link(path, Some(Entry::File(inode)));
        Ok(inode)
    }

    fn file(&self, path: &Path) -> io::Result<u64> {
        match self.live.get(path) {
            Some(Entry::File(inode)) => Ok(*inode),
            _ => Err(errno(ENOENT)),
        }
    }

    fn data_op(&mut self, inode: u64, op: DataOp) {
        let node = self.inodes.get_mut(&inode).expect("open inode");
        apply(&mut node.live, &op);
        node.volatile.push(op);
    }

    /// One unsynced write at a power cut: lost, kept, or cut short at a random byte.
    fn survivor(&mut self, op: DataOp) -> Option<DataOp> {
        let rng = self.rng.as_mut().expect("a power cut needs a seeded disk");
        match (op, rng.below(3)) {
            (_, 0) => {
                self.writes_lost += 1;
                None
            }
            (DataOp::Write { position, bytes }, 1) if !bytes.is_empty() => {
                let keep = rng.below(bytes.len() as u64) as usize;
                self.writes_torn += 1;
                Some(DataOp::Write {
                    position,
                    bytes: bytes[..keep].to_vec(),
                })
            }
            (op, _) => Some(op),
        }
    }
}

impl SimDisk {
    /// A disk whose faults and power cuts are drawn from `seed`.
    pub fn seeded(seed: u64) -> SimDisk {
        let disk = SimDisk::default();
        disk.lock().rng = Some(SimRng::new(seed));
        disk
    }

    fn lock(&self) -> MutexGuard<'_, Disk> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_faults(&self, rates: FaultRates) {
        self.lock().faults = rates;
    }

    /// The power goes and comes back: only what was synced, and what the disk happened to
    /// keep of the rest, is there afterwards.
    pub fn power_cut(&self) {
        let mut d = self.lock();
        d.power_cuts += 1;
        d.crash_in = None;
        d.crashed = false;
        d.generation += 1;
        // Metadata: a prefix of the unsynced directory changes survives.
        let pending = std::mem::take(&mut d.pending);
        let keep = d
            .rng
            .as_mut()
            .expect("seeded")
            .below(pending.len() as u64 + 1);
        for op in pending.into_iter().take(keep as usize) {
            match op.entry {
                Some(e) => d.durable.insert(op.path, e),
                None => d.durable.remove(&op.path),
            };
        }
        // What lived in a directory whose own entry was lost is out of reach (a real
        // file system's fsck puts it in lost+found). A parent sorts before its children.
        let mut reachable = BTreeMap::new();
        for (path, entry) in std::mem::take(&mut d.durable) {
            let in_reach = match path.parent() {
                Some(dir) if dir.parent().is_some() => reachable.get(dir) == Some(&Entry::Dir),
                _ => true,
            };
            if in_reach {
                reachable.insert(path, entry);
            }
        }
        d.durable = reachable;
        // Data: each unsynced write of each file on its own.
        let inodes: Vec<u64> = d.inodes.keys().copied().collect();
        for inode in inodes {
            let volatile = std::mem::take(&mut d.inodes.get_mut(&inode).expect("listed").volatile);
            let mut image = d.inodes[&inode].durable.clone();
            for op in volatile {
                if let Some(op) = d.survivor(op) {
                    apply(&mut image, &op);
                }
            }
            let node = d.inodes.get_mut(&inode).expect("listed");
            node.durable = image.clone();
            node.live = image;
        }
        d.live = d.durable.clone();
        let referenced: Vec<u64> = d
            .durable
            .values()
            .filter_map(|e| match e {
                Entry::File(i) => Some(*i),
                Entry::Dir => None,
            })
            .collect();
        d.inodes.retain(|i, _| referenced.contains(i));
    }

    /// The process crashes just before its `changes`-th next change (0: the next one).
    pub fn crash_after(&self, changes: u64) {
        self.lock().crash_in = Some(changes);
    }

    /// Whether the process reached its crash point.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// Whether a crash point is set and not reached yet.
    pub fn crash_armed(&self) -> bool {
        self.lock().crash_in.is_some()
    }

    /// A new process starts over the page cache the crashed one left (a kill): changes
    /// work again.
    pub fn restarted(&self) {
        let mut d = self.lock();
        d.crash_in = None;
        d.crashed = false;
    }

    /// (power cuts, unsynced writes lost, unsynced writes torn) so far.
    pub fn cut_counts(&self) -> (u64, u64, u64) {
        let d = self.lock();
        (d.power_cuts, d.writes_lost, d.writes_torn)
    }

    fn handle(&self, inode: u64) -> FileRef {
        let generation = self.lock().generation;
        Arc::new(SimFile {
            disk: self.clone(),
            inode,
            generation,
        })
    }
}

impl Storage for SimDisk {
    fn open(&self, path: &Path, how: Open) -> io::Result<FileRef> {
        let mut d = self.lock();
        d.read_fault()?;
        let inode = match (how, d.file(path)) {
            (Open::CreateNew, Ok(_)) => return Err(errno(EEXIST)),
            (Open::Create | Open::CreateNew, Err(_)) => {
                d.change()?;
                d.new_file(path)?
            }
            (_, found) => found?,
        };
        drop(d);
        Ok(self.handle(inode))
    }

    fn read(&self, path: &Path) -> io::Result<Vec<u8>> {
        let mut d = self.lock();
        d.read_fault()?;
        let inode = d.file(path)?;
        Ok(d.inodes[&inode].live.clone())
    }

    fn write(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        d.write_fault()?;
        let inode = match d.file(path) {
            Ok(inode) => inode,
            Err(_) => d.new_file(path)?,
        };
        d.data_op(inode, DataOp::SetLen(0));
        let op = DataOp::Write {
            position: 0,
            bytes: bytes.to_vec(),
        };
        d.data_op(inode, op);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        d.write_fault()?;
        let inode = d.file(from)?;
        if parent(from) != parent(to) {
            return Err(io::Error::other(
                "the simulated disk renames within a directory",
            ));
        }
        d.link(from, None);
        d.link(to, Some(Entry::File(inode)));
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        d.file(path)?;
        d.link(path, None);
        Ok(())
    }

    fn remove_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        if d.live.get(path) != Some(&Entry::Dir) {
            return Err(errno(ENOENT));
        }
        let inside: Vec<PathBuf> = d
            .live
            .keys()
            .filter(|p| p.starts_with(path) && p.as_path() != path)
            .cloned()
            .collect();
        // Deepest first, so every removal is filed under a directory that still exists.
        for p in inside.into_iter().rev() {
            d.link(&p, None);
        }
        d.link(path, None);
        Ok(())
    }

    fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        let mut missing = Vec::new();
        let mut p = path;
        while !p.as_os_str().is_empty() && d.live.get(p) != Some(&Entry::Dir) {
            if matches!(d.live.get(p), Some(Entry::File(_))) {
                return Err(errno(EEXIST));
            }
            missing.push(p.to_path_buf());
            p = p.parent().unwrap_or(Path::new(""));
        }
        for dir in missing.into_iter().rev() {
            d.link(&dir, Some(Entry::Dir));
        }
        Ok(())
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let d = self.lock();
        if d.live.get(path) != Some(&Entry::Dir) {
            return Err(errno(ENOENT));
        }
        Ok(d.live
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn is_dir(&self, path: &Path) -> bool {
        self.lock().live.get(path) == Some(&Entry::Dir)
    }

    fn file_len(&self, path: &Path) -> io::Result<u64> {
        let d = self.lock();
        let inode = d.file(path)?;
        Ok(d.inodes[&inode].live.len() as u64)
    }

    fn sync_dir(&self, path: &Path) -> io::Result<()> {
        let mut d = self.lock();
        d.change()?;
        let rate = d.faults.sync_eio;
        if d.fault(rate) {
            return Err(errno(EIO));
        }
        let pending = std::mem::take(&mut d.pending);
        let (mine, rest): (Vec<DirOp>, Vec<DirOp>) =
            pending.into_iter().partition(|op| op.dir == path);
        d.pending = rest;
        for op in mine {
            match op.entry {
                Some(e) => d.durable.insert(op.path, e),
                None => d.durable.remove(&op.path),
            };
        }
        Ok(())
    }
}

impl SimFile {
    /// The disk, if this handle is from the current power generation.
    fn disk(&self) -> io::Result<MutexGuard<'_, Disk>> {
        let d = self.disk.lock();
        if d.generation != self.generation || !d.inodes.contains_key(&self.inode) {
            return Err(errno(EIO));
        }
        Ok(d)
    }
}

impl StorageFile for SimFile {
    fn write_at(&self, position: u64, bytes: &[u8]) -> io::Result<()> {
        let mut d = self.disk()?;
        d.change()?;
        d.write_fault()?;
        let op = DataOp::Write {
            position,
            bytes: bytes.to_vec(),
        };
        d.data_op(self.inode, op);
        Ok(())
    }

    fn read_at(&self, position: u64, buf: &mut [u8]) -> io::Result<usize> {
        let mut d = self.disk()?;
        d.read_fault()?;
        let live = &d.inodes[&self.inode].live;
        let start = (position as usize).min(live.len());
        let n = buf.len().min(live.len() - start);
        buf[..n].copy_from_slice(&live[start..start + n]);
        Ok(n)
    }

    fn size(&self) -> io::Result<u64> {
        Ok(self.disk()?.inodes[&self.inode].live.len() as u64)
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        let mut d = self.disk()?;
        d.change()?;
        d.data_op(self.inode, DataOp::SetLen(len));
        Ok(())
    }

    fn sync_data(&self) -> io::Result<()> {
        let mut d = self.disk()?;
        d.change()?;
        let rate = d.faults.sync_eio;
        if d.fault(rate) {
            return Err(errno(EIO));
        }
        let node = d.inodes.get_mut(&self.inode).expect("checked");
        node.durable = node.live.clone();
        node.volatile.clear();
        Ok(())
    }

    fn map(&self, len: usize, _reach: usize) -> io::Result<Mapped> {
        let mut d = self.disk()?;
        d.read_fault()?;
        // A copy is a snapshot: bytes past `len` may still be rewritten (a failed flush
        // undone), so it holds exactly the bytes asked for.
        let live = &d.inodes[&self.inode].live;
        let bytes = live.get(..len).ok_or_else(|| errno(EIO))?;
        Ok(Mapped::Copy(Arc::from(bytes)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut_until<F: Fn(&SimDisk) -> bool>(make: impl Fn(u64) -> SimDisk, want: F) -> bool {
        (0..200).any(|seed| {
            let disk = make(seed);
            disk.power_cut();
            want(&disk)
        })
    }

    #[test]
    fn synced_data_and_directories_survive_and_the_rest_may_not() {
        let setup = |seed| {
            let disk = SimDisk::seeded(seed);
            disk.create_dir_all(Path::new("/d")).unwrap();
            disk.sync_dir(Path::new("/")).unwrap();
            let f = disk.open(Path::new("/d/a"), Open::CreateNew).unwrap();
            f.write_at(0, b"durable").unwrap();
            f.sync_data().unwrap();
            disk.sync_dir(Path::new("/d")).unwrap();
            f.write_at(7, b" volatile").unwrap();
            disk
        };
        for seed in 0..50 {
            let disk = setup(seed);
            disk.power_cut();
            let bytes = disk.read(Path::new("/d/a")).unwrap();
            assert!(bytes.starts_with(b"durable"), "{bytes:?}");
        }
        let read = |d: &SimDisk| d.read(Path::new("/d/a")).unwrap();
        assert!(
            cut_until(setup, |d| read(d) == b"durable"),
            "a write can be lost"
        );
        assert!(
            cut_until(setup, |d| read(d) == b"durable volatile"),
            "or kept"
        );
        assert!(
            cut_until(setup, |d| read(d).len() > 7 && read(d).len() < 16),
            "or torn"
        );
    }

    #[test]
    fn a_crash_point_stops_every_change_and_a_restart_or_power_cut_clears_it() {
        let disk = SimDisk::seeded(7);
        disk.create_dir_all(Path::new("/d")).unwrap();
        let f = disk.open(Path::new("/d/a"), Open::CreateNew).unwrap();
        disk.crash_after(1);
        f.write_at(0, b"made").unwrap();
        assert!(!disk.crashed());
        assert!(f.sync_data().is_err(), "the crash point");
        assert!(disk.crashed());
        assert!(disk.rename(Path::new("/d/a"), Path::new("/d/b")).is_err());
        assert!(disk.open(Path::new("/d/c"), Open::Create).is_err());
        assert_eq!(
            disk.read(Path::new("/d/a")).unwrap(),
            b"made",
            "reads still work"
        );
        disk.restarted();
        assert!(!disk.crashed() && !disk.crash_armed());
        f.sync_data().unwrap();
        disk.sync_dir(Path::new("/")).unwrap();
        disk.sync_dir(Path::new("/d")).unwrap();
        disk.crash_after(0);
        assert!(disk.crash_armed());
        disk.power_cut();
        assert!(!disk.crash_armed());
        assert_eq!(disk.read(Path::new("/d/a")).unwrap(), b"made");
    }

    #[test]
    fn an_unsynced_directory_entry_may_vanish_and_old_handles_fail() {
        let setup = |seed| {
            let disk = SimDisk::seeded(seed);
            disk.create_dir_all(Path::new("/d")).unwrap();
            let f = disk.open(Path::new("/d/a"), Open::CreateNew).unwrap();
            f.write_at(0, b"x").unwrap();
            f.sync_data().unwrap();
            disk
        };
        assert!(cut_until(setup, |d| d.read(Path::new("/d/a")).is_err()));
        let disk = setup(1);
        let f = disk.open(Path::new("/d/a"), Open::Read).unwrap();
        disk.power_cut();
        assert!(f.size().is_err(), "a handle from before the cut");
    }
}
