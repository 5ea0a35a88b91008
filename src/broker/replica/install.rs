//! INSTALL (`docs/REPLICATION.md` §5.5): a snapshot for a node whose log is gone, a data
//! directory lost or a node that joins with none, once the leader compacted the entries
//! it would need.
//!
//! **Leader.** Raft asks its storage for a snapshot; the broker answers with a
//! *manifest* of its state at its applied index `A`: each segment file of every
//! partition with the bytes flushed to it (apply writes segments, and only committed
//! entries are applied, so these are exactly the records up to `A`), and the registry,
//! group positions and each partition's producers as of `A`, which it keeps in memory
//! (the producers of records a purge or retention removed are in no segment).
//! Segments are append-only, so the listed prefixes stay as they are while the follower
//! pulls them; a segment removed meanwhile (retention, a DELETE) fails the read, and the
//! follower gives up and starts over. The leader reads chunks on the fsync pool, never
//! on the reactor.
//!
//! **Follower.** A Ready with a snapshot stops raft for good in this process: the node
//! writes an `install` marker (leader, manifest, raft's term and vote) and restarts its
//! own process (`exec`). A start that finds the marker wipes the partition files, the
//! registry, the positions and the raft journal (`raft-state`, the term and vote, stays)
//! and comes up with raft stopped, answering 0x6009 SNAPSHOT_IN_PROGRESS; it pulls the
//! files from the leader in chunks over the peer links (INSTALL frames, below), a few in
//! flight, written by the pool. Then one job fdatasyncs every file and directory,
//! restarts the raft journal after `(A, term)`, writes `raft-state` with commit `A`,
//! renames the staged registry and positions over the live ones and removes the
//! marker, and the process restarts again: an ordinary start, from the installed files.
//! Entries after `A` then come from the leader as appends. A crash anywhere before the
//! marker is gone repeats the install from its start; a leader that no longer serves it,
//! or no progress for [`INSTALL_STALL_MS`], wipes and restarts without the marker: raft
//! then asks the leader for a new snapshot.
//!
//! ```text
//! INSTALL frame body (peer frame kind 3; big-endian)
//! 0  1  kind       1 REQUEST, 2 CHUNK, 3 REFUSED
//! 1  8  index      the snapshot's index: which manifest
//! REQUEST: file u32 (its place in the manifest), offset u64, len u32
//! CHUNK:   file u32, offset u64, then the bytes
//! REFUSED: nothing more (the leader holds no such snapshot for this node)
//!
//! snapshot data (raft Snapshot.data), version 2: version u8 = 2, index u64, term u64,
//! manifest length u32, manifest CRC-32 u32. The manifest is then pulled like a file,
//! file number MANIFEST_FILE (u32::MAX), before the files it lists. Version 1 (a leader
//! from before version 2) is the manifest itself, still read.
//!
//! manifest: version u8 = 1, index u64, term u64, count u32, then per file: len u64,
//! path_len u16, path (relative to the data directory, `/`-separated)
//!
//! install marker (a meta file): leader u64, term u64, vote u64, then the snapshot data
//! ```
//!
//! The manifest is not in raft's message because that message travels in one peer
//! frame, at most `FRAME_BYTES_MAX` (2 MiB): a node with some 38,000 segments (many
//! partitions, long retention, small `--segment-size`) made a manifest past it, the
//! link dropped the snapshot on every try, and a follower behind compaction never caught
//! up. Pulled in chunks, a manifest is bounded only by [`MANIFEST_BYTES_MAX`].
//!
//! Depends on what `broker::replica::cluster` may.

use std::collections::BTreeMap;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::entry::{EntryError, Reader};
use super::storage::{write_hard_state, RAFT_JOURNAL_DIR};
use crate::broker::jobs::{DurableJob, Work};
use crate::broker::positions::GROUPS_FILE;
use crate::broker::producers::PRODUCERS_FILE;
use crate::broker::registry::REGISTRY_FILE;
use crate::broker::{Broker, Now, TOPICS_DIR};
use crate::log::storage::{create_dir_durable, Open};
use crate::log::{meta, Storage};
use crate::wire::ErrorCode;

/// The marker of an install in progress, in the data directory.
pub const INSTALL_MARKER_FILE: &str = "install";
/// Where the registry and the group positions of an install wait for its end.
pub const STAGED_REGISTRY_FILE: &str = "install.registry";
pub const STAGED_GROUPS_FILE: &str = "install.groups";
/// Bytes one CHUNK carries at most: well inside a peer frame (`FRAME_BYTES_MAX`).
pub const CHUNK_BYTES_MAX: u32 = 1024 * 1024;
/// Chunks a follower asks for before the first comes back: the link stays busy while
/// the leader's pool reads and the follower's pool writes.
pub const CHUNKS_IN_FLIGHT_MAX: usize = 4;
/// A chunk asked for and not back within this is asked for again (a full output
/// buffer or a link that went down drops it; reads and writes are idempotent).
pub const CHUNK_TIMEOUT_MS: u64 = 2_000;
/// An install that made no progress for this long is given up (its leader is gone).
pub const INSTALL_STALL_MS: u64 = 20_000;
/// A leader forgets a snapshot it made for a peer that asked nothing for this long.
pub const OFFER_IDLE_MS: u64 = 60_000;
/// A manifest path longer than this is refused (a bug or an attack, not a file of ours).
const PATH_BYTES_MAX: usize = 4096;
/// The file number a follower asks for to get a version-2 snapshot's manifest.
pub const MANIFEST_FILE: u32 = u32::MAX;
/// Largest manifest a follower takes (it holds the whole of it in memory while it pulls
/// it): some 1.2 million files, far past what a node holds open (two descriptors per
/// segment). More is a bug or a bad peer.
pub const MANIFEST_BYTES_MAX: u32 = 64 * 1024 * 1024;
/// Files a manifest may list: what [`MANIFEST_BYTES_MAX`] holds of the shortest entries
/// a leader writes. A count from the data is never trusted for an allocation either.
pub const MANIFEST_FILES_MAX: u32 = MANIFEST_BYTES_MAX / 32;
/// Bytes a snapshot may ask a follower to write, in all: 16 TiB, past any small host's
/// disk. A bigger sum is a bug or a bad peer, and a sum must never overflow.
pub const INSTALL_BYTES_MAX: u64 = 1 << 44;
/// A manifest's first byte, and raft's snapshot data before version 2.
const MANIFEST_VERSION: u8 = 1;
/// Raft's snapshot data that names a manifest to pull.
const SNAPSHOT_DATA_VERSION: u8 = 2;

const FRAME_REQUEST: u8 = 1;
const FRAME_CHUNK: u8 = 2;
const FRAME_REFUSED: u8 = 3;

/// What a snapshot holds: the files of the leader's data directory at its applied
/// `index` (`term` is that entry's), each with the bytes to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub index: u64,
    pub term: u64,
    /// Path relative to the data directory, and length.
    pub files: Vec<(String, u64)>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![MANIFEST_VERSION];
        out.extend_from_slice(&self.index.to_be_bytes());
        out.extend_from_slice(&self.term.to_be_bytes());
        out.extend_from_slice(&(self.files.len() as u32).to_be_bytes());
        for (path, len) in &self.files {
            out.extend_from_slice(&len.to_be_bytes());
            out.extend_from_slice(&(path.len() as u16).to_be_bytes());
            out.extend_from_slice(path.as_bytes());
        }
        out
    }

    /// A manifest whose every path is the registry, the positions or a file under
    /// `topics/`, with no `..`: nothing else of the follower's may be written.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, String> {
        let mut r = Reader { data: bytes };
        if r.u8().map_err(short)? != MANIFEST_VERSION {
            return Err("unknown manifest version".into());
        }
        let mut fixed = || Ok::<_, EntryError>((r.u64()?, r.u64()?, r.u32()?));
        let (index, term, count) = fixed().map_err(short)?;
        if count > MANIFEST_FILES_MAX {
            return Err(format!(
                "{count} files, past the {MANIFEST_FILES_MAX}-file cap"
            ));
        }
        let mut files = Vec::new();
        let mut total = 0u64;
        for _ in 0..count {
            let mut field = || Ok::<_, EntryError>((r.u64()?, r.u16()? as usize));
            let (len, path_len) = field().map_err(short)?;
            total = total.saturating_add(len);
            if total > INSTALL_BYTES_MAX {
                return Err(format!(
                    "past the {INSTALL_BYTES_MAX}-byte cap of a snapshot"
                ));
            }
            let path = std::str::from_utf8(r.bytes(path_len).map_err(short)?)
                .map_err(|_| "a path that is not UTF-8".to_string())?;
            check_path(path)?;
            files.push((path.to_string(), len));
        }
        if !r.data.is_empty() {
            return Err("bytes past the last file".into());
        }
        Ok(Manifest { index, term, files })
    }

    pub fn total_bytes(&self) -> u64 {
        self.files.iter().map(|(_, len)| len).sum()
    }
}

fn short(e: EntryError) -> String {
    e.0.to_string()
}

/// Where a manifest is pulled from: raft's snapshot data, version 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestRef {
    pub index: u64,
    pub term: u64,
    pub len: u32,
    pub crc: u32,
}

/// Raft's snapshot data, as a leader sends it and a marker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotData {
    /// Version 1, from a leader before version 2: the manifest itself.
    Listed(Manifest),
    /// Version 2: the manifest is pulled first.
    Pulled(ManifestRef),
}

impl SnapshotData {
    /// A leader's: the data raft sends, naming `manifest`, which is served as
    /// [`MANIFEST_FILE`].
    pub fn naming(manifest: &[u8], index: u64, term: u64) -> SnapshotData {
        SnapshotData::Pulled(ManifestRef {
            index,
            term,
            len: manifest.len() as u32,
            crc: crc32fast::hash(manifest),
        })
    }

    pub fn index(&self) -> u64 {
        match self {
            SnapshotData::Listed(m) => m.index,
            SnapshotData::Pulled(r) => r.index,
        }
    }

    pub fn term(&self) -> u64 {
        match self {
            SnapshotData::Listed(m) => m.term,
            SnapshotData::Pulled(r) => r.term,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        match self {
            SnapshotData::Listed(m) => m.encode(),
            SnapshotData::Pulled(r) => {
                let mut out = vec![SNAPSHOT_DATA_VERSION];
                out.extend_from_slice(&r.index.to_be_bytes());
                out.extend_from_slice(&r.term.to_be_bytes());
                out.extend_from_slice(&r.len.to_be_bytes());
                out.extend_from_slice(&r.crc.to_be_bytes());
                out
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<SnapshotData, String> {
        if bytes.first() == Some(&MANIFEST_VERSION) {
            return Manifest::decode(bytes).map(SnapshotData::Listed);
        }
        let mut r = Reader { data: bytes };
        if r.u8().map_err(short)? != SNAPSHOT_DATA_VERSION {
            return Err("unknown snapshot data version".into());
        }
        let mut fields = || Ok::<_, EntryError>((r.u64()?, r.u64()?, r.u32()?, r.u32()?));
        let (index, term, len, crc) = fields().map_err(short)?;
        if !r.data.is_empty() {
            return Err("bytes past the end of the snapshot data".into());
        }
        if len > MANIFEST_BYTES_MAX {
            return Err(format!(
                "a {len}-byte manifest, past the {MANIFEST_BYTES_MAX}-byte cap"
            ));
        }
        Ok(SnapshotData::Pulled(ManifestRef {
            index,
            term,
            len,
            crc,
        }))
    }
}

fn check_path(path: &str) -> Result<(), String> {
    let p = Path::new(path);
    let plain = p.components().all(|c| matches!(c, Component::Normal(_)));
    let in_topics = p.starts_with(TOPICS_DIR) && p.components().count() > 1;
    let ours = path == REGISTRY_FILE || path == GROUPS_FILE || in_topics;
    if !plain || !ours || path.len() > PATH_BYTES_MAX {
        return Err(format!("a path outside the topics: {path:?}"));
    }
    Ok(())
}

/// Where a follower writes a manifest path: in place under `topics/` (wiped before), the
/// registry and positions beside the live ones until the end.
fn staged_path(data_dir: &Path, path: &str) -> PathBuf {
    match path {
        REGISTRY_FILE => data_dir.join(STAGED_REGISTRY_FILE),
        GROUPS_FILE => data_dir.join(STAGED_GROUPS_FILE),
        _ => data_dir.join(path),
    }
}

/// The marker: what a start needs to resume an install.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub leader: u64,
    /// Raft's term and vote when the snapshot arrived.
    pub hard_state: (u64, u64),
    pub snapshot: SnapshotData,
}

impl Marker {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [self.leader, self.hard_state.0, self.hard_state.1] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(&self.snapshot.encode());
        out
    }

    fn decode(bytes: &[u8]) -> Result<Marker, String> {
        let mut r = Reader { data: bytes };
        let mut fixed = || Ok::<_, EntryError>((r.u64()?, r.u64()?, r.u64()?));
        let (leader, term, vote) = fixed().map_err(short)?;
        Ok(Marker {
            leader,
            hard_state: (term, vote),
            snapshot: SnapshotData::decode(r.data)?,
        })
    }
}

/// One INSTALL frame's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstallFrame {
    Request {
        index: u64,
        file: u32,
        offset: u64,
        len: u32,
    },
    Chunk {
        index: u64,
        file: u32,
        offset: u64,
        data: Vec<u8>,
    },
    Refused {
        index: u64,
    },
}

impl InstallFrame {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            InstallFrame::Request {
                index,
                file,
                offset,
                len,
            } => {
                out.push(FRAME_REQUEST);
                out.extend_from_slice(&index.to_be_bytes());
                out.extend_from_slice(&file.to_be_bytes());
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(&len.to_be_bytes());
            }
            InstallFrame::Chunk {
                index,
                file,
                offset,
                data,
            } => {
                out.push(FRAME_CHUNK);
                out.extend_from_slice(&index.to_be_bytes());
                out.extend_from_slice(&file.to_be_bytes());
                out.extend_from_slice(&offset.to_be_bytes());
                out.extend_from_slice(data);
            }
            InstallFrame::Refused { index } => {
                out.push(FRAME_REFUSED);
                out.extend_from_slice(&index.to_be_bytes());
            }
        }
        out
    }

    pub fn decode(body: &[u8]) -> Result<InstallFrame, String> {
        let mut r = Reader { data: body };
        let frame = Self::fields(&mut r).map_err(short)?;
        let frame = frame.ok_or_else(|| format!("unknown INSTALL frame kind {}", body[0]))?;
        if !r.data.is_empty() {
            return Err("bytes past the end of an INSTALL frame".into());
        }
        Ok(frame)
    }

    /// `None`: an unknown kind.
    fn fields(r: &mut Reader<'_>) -> Result<Option<InstallFrame>, EntryError> {
        let (kind, index) = (r.u8()?, r.u64()?);
        Ok(Some(match kind {
            FRAME_REQUEST => InstallFrame::Request {
                index,
                file: r.u32()?,
                offset: r.u64()?,
                len: r.u32()?,
            },
            FRAME_CHUNK => InstallFrame::Chunk {
                index,
                file: r.u32()?,
                offset: r.u64()?,
                data: std::mem::take(&mut r.data).to_vec(),
            },
            FRAME_REFUSED => InstallFrame::Refused { index },
            _ => return Ok(None),
        }))
    }
}

/// The blocking parts of an install, run by the fsync pool.
#[derive(Debug)]
pub enum InstallJob {
    /// Follower: the marker, before the restart into the install.
    Begin { path: PathBuf, marker: Vec<u8> },
    /// Leader: `len` bytes of a listed file at `offset`, for peer `to`.
    Read {
        to: u64,
        index: u64,
        file: u32,
        offset: u64,
        path: PathBuf,
        len: u32,
        data: Vec<u8>,
    },
    /// Follower: a chunk into its file.
    Write {
        path: PathBuf,
        offset: u64,
        data: Vec<u8>,
    },
    /// Follower: every file and directory written made durable, the raft journal and
    /// `raft-state` restarted after the snapshot, the staged files renamed over the live
    /// ones, then the marker removed.
    Finish {
        data_dir: PathBuf,
        files: Vec<PathBuf>,
        index: u64,
        term: u64,
        hard_state: (u64, u64),
    },
    /// Follower: gives up; what was written goes, then the marker.
    Abandon { data_dir: PathBuf },
}

impl InstallJob {
    /// Blocks: fsync worker only.
    pub fn run(&mut self, storage: &dyn Storage) -> io::Result<()> {
        match self {
            InstallJob::Begin { path, marker } => meta::write_atomic(storage, path, marker),
            InstallJob::Read {
                path,
                offset,
                len,
                data,
                ..
            } => {
                data.resize(*len as usize, 0);
                let file = storage.open(path, Open::Read)?;
                crate::log::storage::read_exact_at(&*file, *offset, data)
            }
            InstallJob::Write { path, offset, data } => {
                if let Some(dir) = path.parent() {
                    storage.create_dir_all(dir)?;
                }
                storage.open(path, Open::Create)?.write_at(*offset, data)
            }
            InstallJob::Finish {
                data_dir,
                files,
                index,
                term,
                hard_state,
            } => finish(storage, data_dir, files, (*index, *term), *hard_state),
            InstallJob::Abandon { data_dir } => {
                wipe(storage, data_dir)?;
                remove_marker(storage, data_dir)
            }
        }
    }
}

fn finish(
    storage: &dyn Storage,
    data_dir: &Path,
    files: &[PathBuf],
    (index, term): (u64, u64),
    (hs_term, vote): (u64, u64),
) -> io::Result<()> {
    let mut dirs = std::collections::BTreeSet::new();
    for f in files {
        // An empty file was never asked for: it is made here.
        if let Some(dir) = f.parent() {
            storage.create_dir_all(dir)?;
        }
        storage.open(f, Open::Create)?.sync_data()?;
        let mut dir = f.parent();
        while let Some(d) = dir.filter(|d| d.starts_with(data_dir) && *d != data_dir) {
            dirs.insert(d.to_path_buf());
            dir = d.parent();
        }
    }
    // Deepest first: a directory's entry is durable once its parent is synced after it.
    for d in dirs.iter().rev() {
        storage.sync_dir(d)?;
    }
    crate::log::journal2::reset_to(storage, &data_dir.join(RAFT_JOURNAL_DIR), index, term)?;
    let hs = raft::eraftpb::HardState {
        term: hs_term.max(term),
        vote: if hs_term >= term { vote } else { 0 },
        commit: index,
        ..Default::default()
    };
    write_hard_state(storage, data_dir, &hs)?;
    for (staged, live) in [
        (STAGED_REGISTRY_FILE, REGISTRY_FILE),
        (STAGED_GROUPS_FILE, GROUPS_FILE),
    ] {
        let staged = data_dir.join(staged);
        if storage.file_len(&staged).is_ok() {
            storage.rename(&staged, &data_dir.join(live))?;
        }
    }
    storage.sync_dir(data_dir)?;
    remove_marker(storage, data_dir)
}

fn remove_marker(storage: &dyn Storage, data_dir: &Path) -> io::Result<()> {
    match storage.remove_file(&data_dir.join(INSTALL_MARKER_FILE)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    storage.sync_dir(data_dir)
}

/// Everything an install replaces: partitions, registry, positions, the raft journal
/// (`raft-state`, the term and vote, stays). Blocking.
fn wipe(storage: &dyn Storage, data_dir: &Path) -> io::Result<()> {
    for dir in [TOPICS_DIR, RAFT_JOURNAL_DIR] {
        let dir = data_dir.join(dir);
        if storage.is_dir(&dir) {
            storage.remove_dir_all(&dir)?;
        }
    }
    for name in [
        REGISTRY_FILE,
        GROUPS_FILE,
        STAGED_REGISTRY_FILE,
        STAGED_GROUPS_FILE,
    ] {
        match storage.remove_file(&data_dir.join(name)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    storage.sync_dir(data_dir)?;
    create_dir_durable(storage, &data_dir.join(TOPICS_DIR))
}

/// Start-up, before anything else opens the data directory: an install the marker says
/// is under way starts over from a wiped directory. Returns its marker. Blocking.
pub fn resume(storage: &dyn Storage, data_dir: &Path) -> Result<Option<Marker>, String> {
    let path = data_dir.join(INSTALL_MARKER_FILE);
    let bytes = match meta::read_checked(storage, &path) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let marker = Marker::decode(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
    wipe(storage, data_dir).map_err(|e| format!("wiping {}: {e}", data_dir.display()))?;
    Ok(Some(marker))
}

/// Where a leader reads a listed file from.
#[derive(Clone)]
enum Source {
    /// A segment's flushed prefix: read on the pool.
    Disk(PathBuf),
    /// The registry or positions as of the snapshot: copied from memory.
    Bytes(Vec<u8>),
}

/// A snapshot a leader made for one peer, served until it goes idle.
#[derive(Clone)]
pub(super) struct Offer {
    index: u64,
    /// Raft's snapshot data, to send again.
    data: Vec<u8>,
    /// The encoded manifest, served as [`MANIFEST_FILE`].
    manifest: (Source, u64),
    files: Vec<(Source, u64)>,
    last_request_ms: u64,
}

/// A chunk asked for and not yet back.
#[derive(Debug, Clone, Copy)]
struct Asked {
    file: u32,
    offset: u64,
    len: u32,
    /// `None`: to be asked for (again) on the next turn.
    sent_ms: Option<u64>,
}

/// A follower's install under way (after the restart into it).
pub(super) struct Pull {
    marker: Marker,
    /// At once from a version-1 snapshot; from version 2 once pulled.
    manifest: Option<Manifest>,
    /// A version-2 manifest while it arrives (sized at its first chunk), and how many of
    /// its bytes did.
    manifest_bytes: Vec<u8>,
    manifest_arrived: u64,
    /// The next byte nobody asked for: (file, offset); the manifest's until it arrived.
    next: (usize, u64),
    asked: Vec<Asked>,
    writes_in_flight: usize,
    written_bytes: u64,
    /// Set on the first turn: the clock a start is given may be another's.
    last_progress_ms: Option<u64>,
    /// Given up: nothing more is asked for, and the wipe waits for the writes in flight.
    giving_up: bool,
    /// The last job (the end, or the wipe of giving up) was submitted.
    finishing: bool,
}

impl Pull {
    pub(super) fn new(marker: Marker) -> Pull {
        let manifest = match &marker.snapshot {
            SnapshotData::Listed(m) => Some(m.clone()),
            SnapshotData::Pulled(_) => None,
        };
        Pull {
            marker,
            manifest,
            manifest_bytes: Vec::new(),
            manifest_arrived: 0,
            next: (0, 0),
            asked: Vec::new(),
            writes_in_flight: 0,
            written_bytes: 0,
            last_progress_ms: None,
            giving_up: false,
            finishing: false,
        }
    }

    fn index(&self) -> u64 {
        self.marker.snapshot.index()
    }

    /// The files' bytes in all; 0 until the manifest arrived.
    fn total_bytes(&self) -> u64 {
        self.manifest.as_ref().map_or(0, Manifest::total_bytes)
    }

    /// The gate's answer meanwhile.
    pub(super) fn refusal(&self) -> (ErrorCode, String) {
        let (index, leader) = (self.index(), self.marker.leader);
        let text = if self.manifest.is_some() {
            format!(
                "installing a snapshot at index {index} from node {leader}: {} of {} bytes",
                self.written_bytes,
                self.total_bytes()
            )
        } else {
            let what = "pulling its manifest";
            format!("installing a snapshot at index {index} from node {leader}: {what}")
        };
        (ErrorCode::SnapshotInProgress, text)
    }

    /// The next request, if another may be in flight: the manifest's bytes first, then
    /// the files', skipping empty ones.
    fn next_request(&mut self, now_ms: u64) -> Option<Asked> {
        let (file, end) = match (&self.manifest, &self.marker.snapshot) {
            (Some(m), _) => {
                let files = &m.files;
                while self.next.0 < files.len() && self.next.1 >= files[self.next.0].1 {
                    self.next = (self.next.0 + 1, 0);
                }
                (self.next.0 as u32, files.get(self.next.0)?.1)
            }
            (None, SnapshotData::Pulled(r)) => (MANIFEST_FILE, u64::from(r.len)),
            (None, SnapshotData::Listed(_)) => return None,
        };
        let offset = self.next.1;
        if self.asked.len() >= CHUNKS_IN_FLIGHT_MAX || offset >= end {
            return None;
        }
        let len = (end - offset).min(u64::from(CHUNK_BYTES_MAX)) as u32;
        self.next.1 += u64::from(len);
        let asked = Asked {
            file,
            offset,
            len,
            sent_ms: Some(now_ms),
        };
        self.asked.push(asked);
        Some(asked)
    }

    fn request(&self, a: &Asked) -> (u64, Vec<u8>) {
        let frame = InstallFrame::Request {
            index: self.index(),
            file: a.file,
            offset: a.offset,
            len: a.len,
        };
        (self.marker.leader, frame.encode())
    }

    /// A chunk of the manifest that was asked for (so it fits and comes once): kept, and
    /// the whole checked against the snapshot data once every byte came. An error means
    /// this snapshot cannot be installed.
    fn manifest_chunk(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        let SnapshotData::Pulled(r) = &self.marker.snapshot else {
            return Err("a manifest chunk for a snapshot that listed its files".into());
        };
        self.manifest_bytes.resize(r.len as usize, 0);
        let at = offset as usize;
        self.manifest_bytes[at..at + data.len()].copy_from_slice(data);
        self.manifest_arrived += data.len() as u64;
        if self.manifest_arrived < u64::from(r.len) {
            return Ok(());
        }
        let bytes = std::mem::take(&mut self.manifest_bytes);
        if crc32fast::hash(&bytes) != r.crc {
            return Err("its manifest does not match the snapshot's CRC-32".into());
        }
        let m = Manifest::decode(&bytes)?;
        if (m.index, m.term) != (r.index, r.term) {
            return Err(format!(
                "its manifest is of index {} term {}, the snapshot of index {} term {}",
                m.index, m.term, r.index, r.term
            ));
        }
        log::info!(
            "snapshot {}: {} files, {} bytes to pull",
            m.index,
            m.files.len(),
            m.total_bytes()
        );
        self.manifest = Some(m);
        self.next = (0, 0);
        Ok(())
    }

    /// Everything asked for, back and written (call after `next_request` said `None`).
    fn done(&self) -> bool {
        let listed = self.manifest.as_ref().map(|m| m.files.len());
        listed.is_some_and(|files| self.next.0 >= files)
            && self.asked.is_empty()
            && self.writes_in_flight == 0
    }
}

/// What a cluster node does about snapshots, leader and follower alike.
#[derive(Default)]
pub(super) struct Installs {
    /// Leader: by peer.
    offers: BTreeMap<u64, Offer>,
    /// Follower, in the process that installs.
    pub(super) pull: Option<Pull>,
    /// Follower: raft stopped at a snapshot and the marker is being written.
    pub(super) beginning: Option<(u64, u64)>,
    /// INSTALL frames to send, by peer.
    out: Vec<(u64, Vec<u8>)>,
    /// Chunk bytes sent as a leader, since start.
    bytes_sent: u64,
    /// The process must restart (into the install, or out of it).
    pub(super) restart: bool,
}

impl super::cluster::Cluster {
    /// Raft wants a snapshot for `to` while `to` may still be pulling the last one (its
    /// probe fell back below the compacted entries when it restarted into the install):
    /// the same snapshot again, not a new one that would refuse the chunks it asks for.
    /// Only while it asked within [`INSTALL_STALL_MS`] and this node still holds the
    /// entries after it. Returns whether it offered.
    pub(super) fn reoffer(&mut self, to: u64, now_ms: u64) -> bool {
        let first = self.replica.first_index();
        let Some(o) = self.installs.offers.get(&to) else {
            return false;
        };
        if now_ms >= o.last_request_ms + INSTALL_STALL_MS || o.index + 1 < first {
            return false;
        }
        let (index, data) = (o.index, o.data.clone());
        self.replica.offer_snapshot(to, index, data);
        true
    }
}

impl Installs {
    pub(super) fn bytes_sent(&self) -> u64 {
        self.bytes_sent
    }

    /// While installing: bytes written and in all; `(0, 0)` otherwise.
    pub(super) fn progress(&self) -> (u64, u64) {
        let pull = self.pull.as_ref();
        pull.map_or((0, 0), |p| (p.written_bytes, p.total_bytes()))
    }

    /// Queues a chunk for `to`, counted as sent.
    fn send_chunk(&mut self, to: u64, (index, file, offset): (u64, u32, u64), data: Vec<u8>) {
        self.bytes_sent += data.len() as u64;
        let frame = InstallFrame::Chunk {
            index,
            file,
            offset,
            data,
        };
        self.out.push((to, frame.encode()));
    }

    /// The gate while a snapshot is on its way in: 0x6009.
    pub(super) fn refusal(&self) -> Option<(ErrorCode, String)> {
        if let Some(pull) = &self.pull {
            return Some(pull.refusal());
        }
        let (index, leader) = self.beginning?;
        let text = format!("starting to install a snapshot at index {index} from node {leader}");
        Some((ErrorCode::SnapshotInProgress, text))
    }
}

impl Broker {
    fn installs(&mut self) -> &mut Installs {
        &mut self.cluster.as_deref_mut().expect("cluster mode").installs
    }

    fn install_job(&mut self, job: InstallJob) {
        self.jobs.push(DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::Install { job },
        });
    }

    /// Leader, at the end of a pass: a snapshot for every peer raft asked one for, at
    /// this node's applied index, unless a topic's files or the registry are being
    /// written (raft asks again a heartbeat later).
    pub(super) fn offer_snapshots(&mut self, now: Now) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        let mut wanted = c.replica.take_wanted_snapshots();
        wanted.retain(|&to| !c.reoffer(to, now.mono_ms));
        if wanted.is_empty() || !self.topics.settled() {
            return;
        }
        let (manifest, sources) = self.manifest_now(now);
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        let encoded = manifest.encode();
        if encoded.len() > MANIFEST_BYTES_MAX as usize {
            log::error!(
                "a snapshot's manifest of {} files takes {} bytes, past the \
                 {MANIFEST_BYTES_MAX}-byte cap a follower takes: not offered",
                manifest.files.len(),
                encoded.len()
            );
            return;
        }
        let data = SnapshotData::naming(&encoded, manifest.index, manifest.term).encode();
        let offer = Offer {
            index: manifest.index,
            data: data.clone(),
            manifest: (Source::Bytes(encoded.clone()), encoded.len() as u64),
            files: sources,
            last_request_ms: now.mono_ms,
        };
        for to in wanted {
            log::info!(
                "node {to} needs entries this node compacted: offering a snapshot at index \
                 {} ({} files, {} bytes)",
                manifest.index,
                manifest.files.len(),
                manifest.total_bytes()
            );
            c.replica.offer_snapshot(to, manifest.index, data.clone());
            c.installs.offers.insert(to, offer.clone());
        }
    }

    /// The manifest of this node's state at its applied index, and where each file is
    /// read from.
    fn manifest_now(&self, now: Now) -> (Manifest, Vec<(Source, u64)>) {
        let c = self.cluster.as_deref().expect("cluster mode");
        let data_dir = &self.config.data_dir;
        let index = c.applied_index;
        let mut files: Vec<(String, Source, u64)> = Vec::new();
        for part in self.partitions.iter() {
            for (path, len) in part.log.segment_files() {
                if let Ok(rel) = path.strip_prefix(data_dir) {
                    let rel = rel.to_string_lossy().into_owned();
                    files.push((rel, Source::Disk(path), len));
                }
            }
            // The producers as applied, those of records a purge or retention removed
            // included: the follower's start rebuilds from it and the records after.
            let path = part.log.dir().join(PRODUCERS_FILE);
            if let Ok(rel) = path.strip_prefix(data_dir) {
                let bytes = meta::with_footer(&self.partitions.producers_file(part, now));
                let len = bytes.len() as u64;
                files.push((
                    rel.to_string_lossy().into_owned(),
                    Source::Bytes(bytes),
                    len,
                ));
            }
        }
        // As their files hold them, so that the follower's copies read back; the
        // positions as of `index` (`broker::durable_positions`), not the live groups'.
        let registry = meta::with_footer(&self.topics.registry().encode());
        let groups = meta::with_footer(&self.consume.positions_bytes(&c.applied_positions()));
        for (name, bytes) in [(REGISTRY_FILE, registry), (GROUPS_FILE, groups)] {
            let len = bytes.len() as u64;
            files.push((name.to_string(), Source::Bytes(bytes), len));
        }
        let manifest = Manifest {
            index,
            term: c.replica.term_of(index),
            files: files.iter().map(|(p, _, len)| (p.clone(), *len)).collect(),
        };
        (
            manifest,
            files.into_iter().map(|(_, s, len)| (s, len)).collect(),
        )
    }

    /// An INSTALL frame from peer `from`. A malformed one is dropped (the link itself
    /// checked the framing); the follower asks again.
    pub fn peer_install(&mut self, from: u64, body: &[u8], now: Now) {
        if self.cluster.is_none() {
            return;
        }
        match InstallFrame::decode(body) {
            Ok(InstallFrame::Request {
                index,
                file,
                offset,
                len,
            }) => self.serve_chunk(from, (index, file, offset, len), now),
            Ok(InstallFrame::Chunk {
                index,
                file,
                offset,
                data,
            }) => self.chunk_arrived(from, (index, file, offset), data, now),
            Ok(InstallFrame::Refused { index }) => {
                let pulling = self.installs().pull.as_ref().map(Pull::index);
                if pulling == Some(index) {
                    self.abandon_install(format!("node {from} no longer serves snapshot {index}"));
                }
            }
            Err(e) => log::warn!("peer {from}: INSTALL frame dropped: {e}"),
        }
    }

    /// Leader: a chunk of an offered snapshot, from memory or read by the pool.
    fn serve_chunk(&mut self, to: u64, (index, file, offset, len): (u64, u32, u64, u32), now: Now) {
        let installs = self.installs();
        let offer = installs.offers.get_mut(&to).filter(|o| o.index == index);
        let listed = offer.and_then(|o| {
            o.last_request_ms = now.mono_ms;
            match file {
                MANIFEST_FILE => Some(&o.manifest),
                _ => o.files.get(file as usize),
            }
        });
        let fits =
            |flen: u64| len <= CHUNK_BYTES_MAX && offset.saturating_add(u64::from(len)) <= flen;
        match listed {
            Some((Source::Bytes(bytes), flen)) if fits(*flen) => {
                let data = bytes[offset as usize..(offset + u64::from(len)) as usize].to_vec();
                installs.send_chunk(to, (index, file, offset), data);
            }
            Some((Source::Disk(path), flen)) if fits(*flen) => {
                let path = path.clone();
                self.install_job(InstallJob::Read {
                    to,
                    index,
                    file,
                    offset,
                    path,
                    len,
                    data: Vec::new(),
                });
                self.submit_jobs();
            }
            _ => installs
                .out
                .push((to, InstallFrame::Refused { index }.encode())),
        }
    }

    /// Follower: a chunk it asked for goes to the pool.
    fn chunk_arrived(
        &mut self,
        from: u64,
        (index, file, offset): (u64, u32, u64),
        data: Vec<u8>,
        now: Now,
    ) {
        let data_dir = self.config.data_dir.clone();
        let Some(pull) = self.installs().pull.as_mut().filter(|p| !p.giving_up) else {
            return;
        };
        let asked = pull
            .asked
            .iter()
            .position(|a| a.file == file && a.offset == offset && a.len as usize == data.len());
        let ours = pull.index() == index && from == pull.marker.leader;
        let (Some(at), true) = (asked, ours) else {
            log::debug!("chunk of file {file} at {offset} from node {from} not asked for");
            return; // a duplicate of one asked again, or from another snapshot
        };
        pull.asked.swap_remove(at);
        pull.last_progress_ms = Some(now.mono_ms);
        if file == MANIFEST_FILE {
            if let Err(e) = pull.manifest_chunk(offset, &data) {
                return self.abandon_install(format!("node {from}'s snapshot {index}: {e}"));
            }
            return self.pull_turn(now);
        }
        // Asked for only once the manifest listed it.
        let listed = pull.manifest.as_ref().map(|m| &m.files[file as usize].0);
        let path = staged_path(&data_dir, listed.expect("a file asked for is listed"));
        pull.writes_in_flight += 1;
        self.install_job(InstallJob::Write { path, offset, data });
        self.pull_turn(now);
    }

    /// Follower: raft stopped at a snapshot; the marker first, then a restart.
    pub(super) fn begin_install(&mut self, data: &[u8], hard_state: (u64, u64)) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        let leader = c.replica.leader_id().unwrap_or(0);
        let snapshot = match SnapshotData::decode(data) {
            Ok(s) => s,
            Err(e) => return self.cluster_failed(format!("node {leader}'s snapshot: {e}")),
        };
        log::warn!(
            "this node's log is behind what node {leader} kept: installing its snapshot at \
             index {}; the process restarts into the install",
            snapshot.index()
        );
        c.installs.beginning = Some((snapshot.index(), leader));
        let marker = Marker {
            leader,
            hard_state,
            snapshot,
        };
        let path = self.config.data_dir.join(INSTALL_MARKER_FILE);
        let marker = marker.encode();
        self.install_job(InstallJob::Begin { path, marker });
    }

    /// Start-up in the install (`resume` found the marker): raft stays stopped, and the
    /// pull starts with the first pass.
    pub(super) fn resume_install(&mut self, marker: Marker) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        log::warn!(
            "installing node {}'s snapshot at index {}",
            marker.leader,
            marker.snapshot.index()
        );
        c.replica.pause();
        c.installs.pull = Some(Pull::new(marker));
    }

    /// Every pass while installing: requests up to the window, requests again what timed
    /// out, the end once all is written; a leader forgets idle offers.
    pub(super) fn pull_turn(&mut self, now: Now) {
        // Fields apart, not `installs()`: every pass of every node comes here, and the data
        // directory is copied only for the end of an install.
        let data_dir = &self.config.data_dir;
        let installs = &mut self.cluster.as_deref_mut().expect("cluster mode").installs;
        installs
            .offers
            .retain(|_, o| now.mono_ms < o.last_request_ms + OFFER_IDLE_MS);
        let Some(pull) = installs.pull.as_mut() else {
            return;
        };
        if pull.giving_up {
            return self.end_giving_up();
        }
        if pull.finishing {
            return;
        }
        let since = *pull.last_progress_ms.get_or_insert(now.mono_ms);
        if now.mono_ms >= since + INSTALL_STALL_MS {
            let why = format!(
                "no chunk from node {} for {INSTALL_STALL_MS} ms",
                pull.marker.leader
            );
            return self.abandon_install(why);
        }
        for i in 0..pull.asked.len() {
            let due = pull.asked[i]
                .sent_ms
                .is_none_or(|at| now.mono_ms >= at + CHUNK_TIMEOUT_MS);
            if due {
                pull.asked[i].sent_ms = Some(now.mono_ms);
                installs.out.push(pull.request(&pull.asked[i]));
            }
        }
        while let Some(a) = pull.next_request(now.mono_ms) {
            log::debug!(
                "asking for file {} at {} ({} bytes)",
                a.file,
                a.offset,
                a.len
            );
            installs.out.push(pull.request(&a));
        }
        if pull.done() {
            pull.finishing = true;
            let m = pull.manifest.as_ref().expect("done: the manifest arrived");
            let files = m
                .files
                .iter()
                .map(|(p, _)| staged_path(data_dir, p))
                .collect();
            let job = InstallJob::Finish {
                data_dir: data_dir.clone(),
                files,
                index: m.index,
                term: m.term,
                hard_state: pull.marker.hard_state,
            };
            self.install_job(job);
        }
    }

    /// Follower: the link to the leader came up: what was asked may have gone with the
    /// old one, so the next pass asks again.
    pub(super) fn install_link_up(&mut self, id: u64) {
        let Some(pull) = self.installs().pull.as_mut() else {
            return;
        };
        if pull.marker.leader == id {
            for a in pull.asked.iter_mut() {
                a.sent_ms = None;
            }
        }
    }

    /// Gives the install up, once: the wipe runs when no chunk write is in flight (one
    /// landing after it would leave files no registry names).
    fn abandon_install(&mut self, why: String) {
        let Some(pull) = self.installs().pull.as_mut() else {
            return;
        };
        if pull.giving_up || pull.finishing {
            return;
        }
        pull.giving_up = true;
        log::warn!("install given up ({why}): the node restarts without it and asks again");
        self.end_giving_up();
    }

    fn end_giving_up(&mut self) {
        let data_dir = self.config.data_dir.clone();
        let Some(pull) = self.installs().pull.as_mut() else {
            return;
        };
        if pull.giving_up && !pull.finishing && pull.writes_in_flight == 0 {
            pull.finishing = true;
            self.install_job(InstallJob::Abandon { data_dir });
        }
    }

    /// An install job came back from the pool.
    pub(in crate::broker) fn install_job_done(
        &mut self,
        job: InstallJob,
        result: io::Result<()>,
        now: Now,
    ) {
        match (job, result) {
            (
                InstallJob::Read {
                    to,
                    index,
                    file,
                    offset,
                    data,
                    ..
                },
                Ok(()),
            ) => self.installs().send_chunk(to, (index, file, offset), data),
            (
                InstallJob::Read {
                    to, index, path, ..
                },
                Err(e),
            ) => {
                log::warn!(
                    "snapshot {index} for node {to}: {}: {e}; refused",
                    path.display()
                );
                let installs = self.installs();
                installs.offers.remove(&to);
                installs
                    .out
                    .push((to, InstallFrame::Refused { index }.encode()));
            }
            (InstallJob::Write { data, .. }, Ok(())) => {
                if let Some(pull) = self.installs().pull.as_mut() {
                    pull.writes_in_flight -= 1;
                    pull.written_bytes += data.len() as u64;
                }
                self.pull_turn(now);
            }
            (
                InstallJob::Begin { .. } | InstallJob::Finish { .. } | InstallJob::Abandon { .. },
                Ok(()),
            ) => {
                self.installs().restart = true;
            }
            (job, Err(e)) => {
                let what = match job {
                    InstallJob::Begin { .. } => "writing the install marker",
                    InstallJob::Write { .. } => "writing a snapshot chunk",
                    InstallJob::Finish { .. } => "ending the install",
                    _ => "giving the install up",
                };
                self.cluster_failed(format!("{what}: {e}"));
            }
        }
        self.submit_jobs();
    }

    /// INSTALL frames to send, each with its peer.
    pub fn drain_install_frames(&mut self, out: &mut Vec<(u64, Vec<u8>)>) {
        if let Some(c) = self.cluster.as_deref_mut() {
            out.append(&mut c.installs.out);
        }
    }

    /// The process must restart: into an install, or out of one (`mortard` re-executes
    /// itself; the simulator reopens the node).
    pub fn restart_requested(&self) -> bool {
        self.cluster.as_deref().is_some_and(|c| c.installs.restart)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::simdisk::SimDisk;

    fn manifest() -> Manifest {
        Manifest {
            index: 84,
            term: 3,
            files: vec![
                (
                    "topics/00001-orders/0/00000000000000000001.log".into(),
                    5_000,
                ),
                (REGISTRY_FILE.into(), 40),
                (GROUPS_FILE.into(), 0),
            ],
        }
    }

    #[test]
    fn manifests_markers_and_frames_read_back_as_written() {
        let m = manifest();
        assert_eq!(Manifest::decode(&m.encode()), Ok(m.clone()));
        let pulled = SnapshotData::naming(&m.encode(), m.index, m.term);
        for snapshot in [SnapshotData::Listed(m.clone()), pulled] {
            assert_eq!(
                SnapshotData::decode(&snapshot.encode()),
                Ok(snapshot.clone())
            );
            let marker = Marker {
                leader: 2,
                hard_state: (3, 2),
                snapshot,
            };
            assert_eq!(Marker::decode(&marker.encode()), Ok(marker));
        }
        let frames = [
            InstallFrame::Request {
                index: 84,
                file: 1,
                offset: 7,
                len: CHUNK_BYTES_MAX,
            },
            InstallFrame::Chunk {
                index: 84,
                file: 0,
                offset: 1 << 40,
                data: b"records".to_vec(),
            },
            InstallFrame::Refused { index: 84 },
        ];
        for f in frames {
            assert_eq!(InstallFrame::decode(&f.encode()), Ok(f));
        }
        assert!(InstallFrame::decode(&[9, 0, 0, 0, 0, 0, 0, 0, 1]).is_err());
        assert!(InstallFrame::decode(&[FRAME_REFUSED, 0]).is_err(), "short");
    }

    #[test]
    fn a_manifest_naming_a_file_outside_the_topics_is_refused() {
        for path in [
            "topics/../raft-state",
            "/etc/passwd",
            "raft-state",
            "raft-journal/checkpoint",
            "topics",
            "",
        ] {
            let mut m = manifest();
            m.files.push((path.into(), 1));
            assert!(Manifest::decode(&m.encode()).is_err(), "{path:?} accepted");
        }
    }

    /// Issue 42: a peer's manifest must not fill the disk nor overflow a sum.
    #[test]
    fn a_manifest_past_the_file_or_byte_caps_is_refused() {
        let mut m = manifest();
        m.files = vec![("topics/a".into(), u64::MAX), ("topics/b".into(), 2)];
        let err = Manifest::decode(&m.encode()).unwrap_err();
        assert!(err.contains("byte cap"), "{err}");
        let mut bytes = manifest().encode();
        bytes[17..21].copy_from_slice(&(MANIFEST_FILES_MAX + 1).to_be_bytes());
        let err = Manifest::decode(&bytes).unwrap_err();
        assert!(err.contains("file cap"), "{err}");
    }

    #[test]
    fn a_start_with_the_marker_wipes_what_the_install_replaces_and_keeps_the_vote() {
        let disk = SimDisk::seeded(7);
        let dir = Path::new("/data");
        let kept = dir.join(crate::broker::replica::storage::RAFT_STATE_FILE);
        let gone = [
            dir.join("topics/00001-orders/0/00000000000000000001.log"),
            dir.join(REGISTRY_FILE),
            dir.join(STAGED_GROUPS_FILE),
            dir.join(RAFT_JOURNAL_DIR).join("00000000000000000000.jnl"),
        ];
        for f in gone.iter().chain([&kept]) {
            disk.create_dir_all(f.parent().unwrap()).unwrap();
            disk.write(f, b"bytes").unwrap();
        }
        assert_eq!(resume(&disk, dir), Ok(None), "no marker: nothing touched");
        assert!(disk.file_len(&gone[0]).is_ok());
        let m = manifest();
        let marker = Marker {
            leader: 2,
            hard_state: (3, 2),
            snapshot: SnapshotData::naming(&m.encode(), m.index, m.term),
        };
        let mut begin = InstallJob::Begin {
            path: dir.join(INSTALL_MARKER_FILE),
            marker: marker.encode(),
        };
        begin.run(&disk).unwrap();
        disk.power_cut();
        assert_eq!(resume(&disk, dir), Ok(Some(marker)));
        for f in &gone {
            assert!(disk.file_len(f).is_err(), "{} kept", f.display());
        }
        assert!(
            disk.file_len(&kept).is_ok(),
            "the term and vote must survive"
        );
        assert!(disk.is_dir(&dir.join(TOPICS_DIR)));
    }

    /// A manifest of `files` segment files, each path as long as a real one.
    fn manifest_of(files: usize) -> Manifest {
        let path = |i: usize| format!("topics/1-0badcafe/{}/{:020}.log", i % 64, i);
        Manifest {
            index: 9_000,
            term: 4,
            files: (0..files).map(|i| (path(i), 16 << 20)).collect(),
        }
    }

    #[test]
    fn a_snapshot_past_a_peer_frame_names_its_manifest_in_a_few_bytes() {
        let m = manifest_of(50_000);
        let encoded = m.encode();
        // `peer::FRAME_BYTES_MAX`, which this room does not name.
        let peer_frame_bytes_max = 2 << 20;
        assert!(encoded.len() > peer_frame_bytes_max, "the case at issue");
        let data = SnapshotData::naming(&encoded, m.index, m.term).encode();
        assert_eq!(data.len(), 25, "version, index, term, length, CRC");
        let too_big = SnapshotData::Pulled(ManifestRef {
            index: 1,
            term: 1,
            len: MANIFEST_BYTES_MAX + 1,
            crc: 0,
        });
        let refused = SnapshotData::decode(&too_big.encode()).unwrap_err();
        assert!(refused.contains("cap"), "{refused}");
        assert!(SnapshotData::decode(&[9]).is_err(), "unknown version");
        assert!(SnapshotData::decode(&data[..24]).is_err(), "short");
    }

    /// A follower's pull of a 2.7 MB manifest: three chunks asked for first, taken in any
    /// order; only then the listed files; a manifest that does not match its CRC stops
    /// the install.
    #[test]
    fn a_manifest_is_pulled_in_chunks_before_the_files_it_lists() {
        let m = manifest_of(50_000);
        let encoded = m.encode();
        let snapshot = SnapshotData::naming(&encoded, m.index, m.term);
        let pull = |snapshot: SnapshotData| {
            Pull::new(Marker {
                leader: 2,
                hard_state: (4, 2),
                snapshot,
            })
        };
        let mut p = pull(snapshot.clone());
        let mut asked = Vec::new();
        while let Some(a) = p.next_request(0) {
            asked.push(a);
        }
        assert_eq!(asked.len(), 3, "{} bytes in 1 MiB chunks", encoded.len());
        assert!(asked.iter().all(|a| a.file == MANIFEST_FILE));
        assert_eq!(p.refusal().0, ErrorCode::SnapshotInProgress);
        assert!(p.refusal().1.contains("manifest"));
        for a in asked.iter().rev() {
            let (at, end) = (a.offset as usize, (a.offset + u64::from(a.len)) as usize);
            assert!(p.manifest.is_none(), "not before its last byte");
            p.manifest_chunk(a.offset, &encoded[at..end]).unwrap();
        }
        assert_eq!(p.manifest.as_ref(), Some(&m));
        p.asked.clear();
        let first = p.next_request(0).unwrap();
        assert_eq!((first.file, first.offset), (0, 0), "then the files");
        assert!(!p.done(), "the files are still to come");

        let mut bad = pull(snapshot);
        let a = bad.next_request(0).unwrap();
        let mut wrong = encoded.clone();
        wrong[40] ^= 1;
        bad.manifest_chunk(0, &wrong[..a.len as usize]).unwrap();
        let mut last = Ok(());
        while let Some(a) = bad.next_request(0) {
            let (at, end) = (a.offset as usize, (a.offset + u64::from(a.len)) as usize);
            last = bad.manifest_chunk(a.offset, &wrong[at..end]);
        }
        assert!(last.unwrap_err().contains("CRC"));
        assert!(bad.manifest.is_none());
    }
}
