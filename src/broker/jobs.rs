//! The broker's durable I/O as data: each job is a variant that carries what its worker
//! needs and what its completion needs, and comes back whole from the fsync pool
//! (`fsync::Completion`). No closure, no table of jobs looked up by id.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};

use crate::log::journal::{CheckpointWrite, JournalSync, SpareWrite};
use crate::log::journal2::Checkpoint2Write;
use crate::log::{meta, LogConfig, PartitionLog, PurgeFiles, Storage, SyncJob};

use super::topics::{write_topic_files, TopicPair};
use super::PartitionKey;

/// One piece of blocking I/O for an fsync worker, and the storage it runs on.
#[derive(Debug)]
pub struct DurableJob {
    pub storage: Arc<dyn Storage>,
    pub work: Work,
}

/// The partition logs a [`Work::CreateTopic`] opened, handed back to the reactor.
#[derive(Default)]
pub struct OpenedLogs(pub Vec<(PartitionKey, PartitionLog)>);

impl std::fmt::Debug for OpenedLogs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(key, _)| key))
            .finish()
    }
}

/// One partition's segment fdatasync inside a [`Work::Checkpoint`], and how it went.
#[derive(Debug)]
pub struct SegmentSync {
    pub key: PartitionKey,
    pub sync: SyncJob,
    pub result: Option<io::Result<()>>,
}

/// One write of a partition's producer snapshot, the state through `covered`: the
/// periodic one, or a purge's before its files go.
#[derive(Debug)]
pub struct SnapshotWrite {
    pub key: PartitionKey,
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub covered: u64,
    /// Its place among the partition's writes (`ProducerSnapshots::made`).
    pub number: u64,
    /// The number of the write on disk (`ProducerSnapshots::on_disk`).
    pub on_disk: Arc<Mutex<u64>>,
    /// Set by the worker: it wrote (a newer write was not on disk already).
    pub written: bool,
}

impl SnapshotWrite {
    /// Holds the partition's snapshot lock while it writes, so a periodic write and a
    /// purge's never share the temporary file, and never replaces a newer snapshot.
    fn run(&mut self, storage: &dyn Storage) -> io::Result<()> {
        let mut on_disk = self.on_disk.lock().unwrap_or_else(PoisonError::into_inner);
        if *on_disk > self.number {
            return Ok(());
        }
        meta::write_atomic(storage, &self.path, &self.bytes)?;
        *on_disk = self.number;
        self.written = true;
        Ok(())
    }
}

/// What a [`DurableJob`] does.
#[derive(Debug)]
pub enum Work {
    /// A new topic pair's directories, topic files and first segments, made durable; the
    /// logs come back open in `opened`.
    CreateTopic {
        topics_dir: PathBuf,
        pair: TopicPair,
        plan: Vec<(PartitionKey, PathBuf)>,
        config: LogConfig,
        opened: OpenedLogs,
    },
    /// fdatasync of what the journal wrote before the job was taken: group commit for
    /// every partition at once.
    SyncJournal {
        sync: JournalSync,
        /// Segments whose failed write was undone (cut back), synced first: a later
        /// record at the same sequence must not be acknowledged while a power cut could
        /// still bring the undone one back.
        undone: Vec<SegmentSync>,
        /// Records and bytes this job covers beyond the jobs taken before it.
        records: u64,
        bytes: u64,
    },
    /// fdatasync of every segment written since the previous checkpoint, then the
    /// checkpoint (`log/journal.rs`). Each sync's outcome comes back beside it; the
    /// checkpoint is written only when all of them succeeded.
    Checkpoint {
        syncs: Vec<SegmentSync>,
        write: CheckpointWrite,
    },
    /// Journal files wholly below a durable checkpoint.
    RemoveFiles { paths: Vec<PathBuf> },
    /// The journal's next file, made ahead: recycled or filled with zeros.
    MakeSpare { write: SpareWrite },
    /// The topic registry, replaced atomically; answers DECLAREs up to `version`.
    WriteRegistry {
        version: u64,
        path: PathBuf,
        bytes: Vec<u8>,
    },
    /// Directories of deleted pairs, removed once the registry `version` without them is
    /// durable (a crash in between leaves orphans that start-up removes).
    RemoveDirectories { version: u64, dirs: Vec<PathBuf> },
    /// The committed group positions, as of the operator changes up to `generation`
    /// (`positions.rs`).
    WritePositions {
        path: PathBuf,
        bytes: Vec<u8>,
        generation: u64,
    },
    /// Partitions' purges (`log/purge.rs`): answers the operator's `ticket` once done
    /// (`None`: a cluster node applying a purge no operator waits for here). Their
    /// producer snapshots are written first: a producer whose records the purge removes
    /// is still known after a restart, as it is until then.
    Purge {
        ticket: Option<u64>,
        snapshots: Vec<SnapshotWrite>,
        files: Vec<(PartitionKey, PurgeFiles)>,
    },
    /// A partition's producer-state snapshot.
    WriteProducerSnapshot { write: SnapshotWrite },
    /// Cluster mode: one raft Ready's journal fdatasync and `raft-state` write
    /// (`broker::replica::machine`).
    Persist {
        job: super::replica::machine::PersistJob,
    },
    /// Cluster mode (`docs/REPLICATION.md` §5.4): every segment written since the last
    /// sync, then the group positions as applied (a [`Work::WritePositions`], if they
    /// changed), then the raft journal's checkpoint, written only when both succeeded.
    RaftCheckpoint {
        syncs: Vec<SegmentSync>,
        positions: Option<Box<DurableJob>>,
        /// The positions write's own outcome, for the positions bookkeeping.
        positions_result: Option<io::Result<()>>,
        /// `None`: the segment syncs alone, which let closed segments' descriptors go
        /// between FLOORs (`replica::compaction`).
        write: Option<Checkpoint2Write>,
    },
    /// Cluster mode: an INSTALL's reads, writes, marker and end
    /// (`broker::replica::install`).
    Install {
        job: super::replica::install::InstallJob,
    },
}

impl crate::fsync::Job for DurableJob {
    fn run(&mut self) -> io::Result<()> {
        if let Work::CreateTopic {
            topics_dir,
            pair,
            plan,
            config,
            opened,
        } = &mut self.work
        {
            // Topic files first: a crash after them leaves directories that a registry
            // rebuild names rightly; a crash before them leaves nothing of the topic.
            write_topic_files(&*self.storage, topics_dir, pair)?;
            for (key, dir) in plan.iter() {
                let (log, _) =
                    PartitionLog::open(&self.storage, dir, *config).map_err(|e| e.into_io())?;
                opened.0.push((*key, log));
            }
            return Ok(());
        }
        if let Work::Checkpoint { syncs, write } = &mut self.work {
            run_syncs(syncs)?;
            return write.run();
        }
        if let Work::Install { job } = &mut self.work {
            return job.run(&*self.storage);
        }
        if let Work::RaftCheckpoint { .. } = &self.work {
            return self.work.run_raft_checkpoint();
        }
        if let Work::SyncJournal { sync, undone, .. } = &mut self.work {
            for s in undone.iter_mut() {
                s.result = Some(s.sync.run());
            }
            return sync.run();
        }
        let storage = &*self.storage;
        match &mut self.work {
            Work::CreateTopic { .. }
            | Work::Checkpoint { .. }
            | Work::RaftCheckpoint { .. }
            | Work::Install { .. }
            | Work::SyncJournal { .. } => Ok(()),
            Work::MakeSpare { write } => write.run(),
            Work::Persist { job } => job.run(),
            Work::Purge {
                snapshots, files, ..
            } => run_purge(storage, snapshots, files),
            Work::RemoveFiles { paths } => {
                for path in paths {
                    if let Err(e) = storage.remove_file(path) {
                        log::warn!("cannot remove {}: {e}", path.display());
                    }
                }
                Ok(())
            }
            Work::WriteRegistry { path, bytes, .. } | Work::WritePositions { path, bytes, .. } => {
                meta::write_atomic(storage, path, bytes)
            }
            Work::WriteProducerSnapshot { write } => write.run(storage),
            Work::RemoveDirectories { dirs, .. } => {
                for dir in dirs.iter() {
                    if let Err(e) = storage.remove_dir_all(dir) {
                        log::warn!("cannot remove {}: {e}", dir.display());
                    }
                }
                Ok(())
            }
        }
    }
}

/// The producer snapshots first: nothing is unlinked before they are durable.
fn run_purge(
    storage: &dyn Storage,
    snapshots: &mut [SnapshotWrite],
    files: &[(PartitionKey, PurgeFiles)],
) -> io::Result<()> {
    snapshots.iter_mut().try_for_each(|w| w.run(storage))?;
    files.iter().try_for_each(|(_, f)| f.run())
}

impl Work {
    /// Segment syncs, then the positions, then the checkpoint: each only if all before
    /// it succeeded.
    fn run_raft_checkpoint(&mut self) -> io::Result<()> {
        let Work::RaftCheckpoint {
            syncs,
            positions,
            positions_result,
            write,
        } = self
        else {
            unreachable!("called on a RaftCheckpoint")
        };
        run_syncs(syncs)?;
        if let Some(job) = positions {
            let result = crate::fsync::Job::run(&mut **job);
            let failed = result.as_ref().err().map(clone_io);
            *positions_result = Some(result);
            if let Some(e) = failed {
                return Err(e);
            }
        }
        write.as_ref().map_or(Ok(()), |w| w.run())
    }
}

/// Runs every segment sync, each outcome kept beside it; the first failure is the result.
fn run_syncs(syncs: &mut [SegmentSync]) -> io::Result<()> {
    let mut failed = None;
    for s in syncs.iter_mut() {
        let result = s.sync.run();
        if let Err(e) = &result {
            failed.get_or_insert_with(|| clone_io(e));
        }
        s.result = Some(result);
    }
    failed.map_or(Ok(()), Err)
}

fn clone_io(e: &io::Error) -> io::Error {
    io::Error::new(e.kind(), e.to_string())
}

/// Making a journal's next file ahead (`log/journal.rs`, spares), for the owner of either
/// journal format: one job at a time.
#[derive(Debug, Default)]
pub struct SpareJobs {
    in_flight: bool,
}

impl SpareJobs {
    /// A job making the spare from `recycle` (a file a checkpoint let go) or from zeros,
    /// unless one runs; `spare_job` is the journal's (`None`: a spare is ready). A file
    /// given to recycle and not needed is removed, like the others a checkpoint let go.
    pub fn take(
        &mut self,
        storage: &Arc<dyn Storage>,
        recycle: Option<PathBuf>,
        spare_job: impl FnOnce(Option<PathBuf>) -> Option<SpareWrite>,
        out: &mut Vec<DurableJob>,
    ) {
        let job = match self.in_flight {
            true => None,
            false => spare_job(recycle.clone()),
        };
        let work = match (job, recycle) {
            (Some(write), _) => {
                self.in_flight = true;
                Work::MakeSpare { write }
            }
            (None, Some(path)) => Work::RemoveFiles { paths: vec![path] },
            (None, None) => return,
        };
        let storage = Arc::clone(storage);
        out.push(DurableJob { storage, work });
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    /// The job finished (the journal takes its outcome).
    pub fn done(&mut self) {
        self.in_flight = false;
    }
}

/// Where the broker sends durable I/O: the fsync worker pool, or a fake in tests that
/// completes jobs in whatever order the test chooses.
pub trait JobSink {
    fn submit(&self, job: DurableJob);
}

impl JobSink for crate::fsync::Submitter<DurableJob> {
    fn submit(&self, job: DurableJob) {
        crate::fsync::Submitter::submit(self, job)
    }
}

/// The completion the reactor hands back to [`Broker::job_done`](super::Broker::job_done).
pub type JobDone = crate::fsync::Completion<DurableJob>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_producer_snapshot_written_late_never_replaces_a_newer_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = crate::log::FsStorage::shared();
        let on_disk = Arc::new(Mutex::new(0));
        let write = |number: u64, covered: u64| SnapshotWrite {
            key: (1, 0),
            path: dir.path().join("producers"),
            bytes: format!("covered {covered}").into_bytes(),
            covered,
            number,
            on_disk: Arc::clone(&on_disk),
            written: false,
        };
        // Write 2, made after an undo moved the log back, lands before write 1.
        let (mut newer, mut older) = (write(2, 25), write(1, 40));
        newer.run(&*storage).unwrap();
        older.run(&*storage).unwrap();
        assert!(newer.written && !older.written);
        let path = dir.path().join("producers");
        let held = meta::read_checked(&*storage, &path).unwrap().unwrap();
        assert_eq!(held, b"covered 25");
        assert_eq!(*on_disk.lock().unwrap(), 2);
    }
}
