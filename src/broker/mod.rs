//! The broker room: plain state that takes decoded requests plus the time and returns
//! responses and effects. No sockets, no threads, no clock of its own.
//!
//! It is split by job, each part with its own state and file:
//! - [`registry`]: the topic registry and DECLARE, durable before it is answered;
//! - [`publish`]: every partition's log and producers, PUB, group commit;
//! - [`deliver`]: the consume driver around the group coordinator, dead letters and
//!   committed positions;
//! - [`manage`]: operator changes (group delete and reset, purge) and topic
//!   descriptions, answered once durable;
//! - [`replica`]: replication; a broker opened with [`Broker::open_cluster`] owns a raft
//!   replica and changes its state only by applying committed entries
//!   (`replica::cluster`).
//!
//! Blocking I/O leaves as [`DurableJob`]s for a [`JobSink`] (the reactor's fsync pool)
//! and comes back whole through [`Broker::job_done`]. A request is answered now
//! ([`Handled::Answer`]) or later ([`Handled::Wait`]): the response then arrives as
//! [`Effect::Answer`] (or [`Effect::PullAnswer`]) naming the connection and the slot the
//! reactor reserved for it. What a connection's output can still take comes in as an
//! [`OutputRoom`]: PULL answers are cut to fit it.
//!
//! Depends on `wire` (types and codes), `log` (partition storage), `consume` (the group
//! coordinator) and `fsync` (only its `Job` trait and `Completion`).

mod commit;
mod config;
mod counters;
pub mod deliver;
pub mod dlq;
pub mod idhash;
pub mod jobs;
pub mod manage;
pub mod partition;
pub mod peek;
pub mod positions;
pub mod producers;
pub mod publish;
pub mod registry;
pub mod replica;
pub mod topics;

#[cfg(test)]
mod tests;

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;

pub use crate::consume::{unlimited_room, OutputRoom};
use crate::log::{meta, Storage};
use crate::wire::ops::{Notice, Pub};
use crate::wire::{Durability, ErrorCode, Op, Response};

pub use config::BrokerConfig;

/// The `reason` labels of the raft messages a cluster node drops (`replica::vet`), for
/// `mortar_peer_refused_total`.
pub const PEER_MESSAGE_REFUSALS: [&str; replica::vet::Lie::ALL.len()] = {
    let mut labels = [""; replica::vet::Lie::ALL.len()];
    let mut i = 0;
    while i < labels.len() {
        labels[i] = replica::vet::Lie::ALL[i].label();
        i += 1;
    }
    labels
};
pub use counters::{bucket_of, BrokerCounters, FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use deliver::ConsumeDriver;
pub use jobs::{DurableJob, JobDone, JobSink, Work};
use publish::{Partitions, SyncDone};
use registry::TopicRegistry;
pub use topics::Registry;

const EPOCH_FILE: &str = "epoch";
/// The data directory's lock file: whoever holds an exclusive `flock` on it (a running
/// `mortard`, or `mortarctl check --repair`) is the only process writing the directory.
pub const LOCK_FILE: &str = "lock";
/// Where the topic directories live, under the data directory.
pub const TOPICS_DIR: &str = "topics";
/// Where the journal lives, under the data directory (`log/journal.rs`).
pub const JOURNAL_DIR: &str = "journal";

/// A partition: (topic id, partition index).
pub type PartitionKey = (u16, u16);

/// Identifies one connection incarnation: `id` is the reactor's slot (reused after a
/// close), `serial` is never reused, so a late answer cannot reach a newer connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnRef {
    pub id: u32,
    pub serial: u64,
}

/// The two clocks the broker needs: monotonic for deadlines, wall for timestamps.
#[derive(Debug, Clone, Copy, Default)]
pub struct Now {
    pub mono_ms: u64,
    pub wall_ms: u64,
}

pub enum Handled {
    Answer(Response),
    /// The reactor keeps the request's slot open; an [`Effect::Answer`] fills it.
    Wait,
}

pub enum Effect {
    Answer {
        conn: ConnRef,
        slot: u64,
        response: Response,
    },
    /// Push a NOTICE (no slot).
    Notice { conn: ConnRef, notice: Notice },
    /// Push a MSG (no slot): the reactor calls [`Broker::encode_delivery`] straight into
    /// the connection's output buffer.
    Deliver {
        conn: ConnRef,
        delivery: crate::consume::Delivery,
    },
    /// Fill a PULL's slot: the reactor calls [`Broker::encode_pull_answer`] into the
    /// connection's output when the slot reaches the head (until then `answer.bytes`
    /// counts against the connection's output cap and the memory budget).
    PullAnswer {
        conn: ConnRef,
        slot: u64,
        answer: PullAnswer,
    },
}

/// A PULL's answer before it is bytes: MSG for each delivery, then OK.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullAnswer {
    pub deliveries: Vec<crate::consume::Delivery>,
    /// The encoded answer is at most this long.
    pub bytes: usize,
}

/// A record read back from a partition, owning its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredRecord {
    pub sequence: u64,
    pub timestamp_ms: u64,
    pub producer_id: u64,
    pub producer_seq: u64,
    pub flags: u16,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// What start-up found, for the log and /stats.
#[derive(Debug, Default)]
pub struct StartupReport {
    pub leader_epoch: u64,
    pub topics: usize,
    pub partitions: usize,
    pub truncations: u64,
    pub journal_records_replayed: u64,
    pub orphan_dirs_removed: usize,
    pub group_positions: usize,
}

pub struct Broker {
    storage: Arc<dyn Storage>,
    config: BrokerConfig,
    leader_epoch: u64,
    topics: TopicRegistry,
    partitions: Partitions,
    consume: ConsumeDriver,
    sink: Box<dyn JobSink>,
    effects: Vec<Effect>,
    /// Reused every pass: jobs gathered before they are submitted.
    jobs: Vec<DurableJob>,
    /// Operator changes waiting to be durable (`manage.rs`).
    manage: manage::ManageWaits,
    pub counters: BrokerCounters,
    /// Cluster mode (`replica::cluster`): the raft group and what waits on it; `None` on
    /// a single node.
    cluster: Option<Box<replica::cluster::Cluster>>,
}

/// Refuses a data directory of the other kind before anything opens it: a single node's
/// (it has an `epoch` file) started with `--peers`, or a cluster node's (`raft-state`)
/// started without. Their journals differ in format (`docs/REPLICATION.md` §3.2), and a
/// format 1 reader resets a file whose header it does not know.
pub fn check_data_dir_kind(dir: &Path, cluster: bool) -> Result<(), String> {
    let single = dir.join(EPOCH_FILE).exists();
    let clustered = dir.join(replica::storage::RAFT_STATE_FILE).exists();
    match (cluster, single, clustered) {
        (true, true, _) => Err(format!(
            "{} is a single node's data directory (it has an {EPOCH_FILE} file): a cluster \
             node starts from an empty one; start without --peers to serve it",
            dir.display()
        )),
        (false, _, true) => Err(format!(
            "{} is a cluster node's data directory (it has {}): start it with its \
             --node-id and --peers",
            dir.display(),
            replica::storage::RAFT_STATE_FILE
        )),
        _ => Ok(()),
    }
}

/// A cluster node's data directory names the cluster it belongs to (issue 42), as etcd's
/// and KRaft's do: a stale disk or an old backup of another cluster made on the same
/// `--peers` must not join this one.
pub const CLUSTER_ID_FILE: &str = "cluster-id";

/// The cluster id this node runs with (blocking: start-up, under the data directory's
/// lock). A directory that holds one keeps it: `given` (`--cluster-id`) must match, or
/// the start is refused naming both. A directory without one takes `given` (a new node,
/// or one from before cluster ids), written durably before anything else. `None`: no id
/// anywhere, the cluster is told apart by its `--peers` alone.
pub fn settle_cluster_id(
    storage: &dyn Storage,
    dir: &Path,
    given: Option<u64>,
) -> Result<Option<u64>, String> {
    let path = dir.join(CLUSTER_ID_FILE);
    let fail = |e: std::io::Error| format!("{}: {e}", path.display());
    let stored = match meta::read_checked(storage, &path).map_err(fail)? {
        None => None,
        Some(bytes) => Some(
            <[u8; 8]>::try_from(bytes.as_slice())
                .map(u64::from_be_bytes)
                .map_err(|_| format!("{}: not a cluster id", path.display()))?,
        ),
    };
    match (stored, given) {
        (Some(s), Some(g)) if s != g => Err(format!(
            "{} belongs to cluster {s:016x}; this node was started with --cluster-id \
             {g:016x}: it is another cluster's data directory (start it with its own \
             cluster's id, or give this node an empty one)",
            dir.display()
        )),
        (Some(s), _) => Ok(Some(s)),
        (None, Some(g)) => {
            meta::write_atomic(storage, &path, &g.to_be_bytes()).map_err(fail)?;
            log::info!("data directory {} joins cluster {g:016x}", dir.display());
            Ok(Some(g))
        }
        (None, None) => Ok(None),
    }
}

/// An exclusive `flock` on `DATA_DIR/lock`, released when dropped (or when the process
/// dies, however it dies). Two writers on one log would truncate each other's files.
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
}

impl DataDirLock {
    /// Takes the lock of `dir` and records this process's pid in it; fails, naming the
    /// holder's pid, when another process holds it.
    pub fn acquire(dir: &Path) -> Result<DataDirLock, String> {
        let path = dir.join(LOCK_FILE);
        let fail = |e: std::io::Error| format!("cannot lock {}: {e}", path.display());
        // No truncate here: until the lock is ours, the pid in the file is the holder's.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(fail)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => return Err(held_by(dir, &mut file)),
            Err(TryLockError::Error(e)) => return Err(fail(e)),
        }
        file.set_len(0).map_err(fail)?;
        writeln!(file, "{}", std::process::id()).map_err(fail)?;
        Ok(DataDirLock { _file: file })
    }

    /// Who holds the lock of `dir` now, for a reader that must not take it: `Some`
    /// message naming the holder's pid, `None` when nobody does.
    pub fn holder(dir: &Path) -> Option<String> {
        let mut file = File::open(dir.join(LOCK_FILE)).ok()?;
        // A shared lock is refused only while someone holds the exclusive one; if it is
        // granted, dropping the file releases it at once.
        match file.try_lock_shared() {
            Err(TryLockError::WouldBlock) => Some(held_by(dir, &mut file)),
            _ => None,
        }
    }
}

/// The refusal for a locked data directory, with the pid its holder wrote.
fn held_by(dir: &Path, lock: &mut File) -> String {
    let mut text = String::new();
    let pid = lock
        .read_to_string(&mut text)
        .ok()
        .and_then(|_| text.trim().parse::<u32>().ok());
    let holder = match pid {
        Some(pid) => format!("pid {pid}"),
        // Between its flock and its write the holder has not recorded itself yet.
        None => "another process (its pid is not recorded yet)".to_string(),
    };
    format!(
        "data directory {} is locked by {holder} ({}): another mortard or \
         'mortarctl check --repair' is using it",
        dir.display(),
        dir.join(LOCK_FILE).display()
    )
}

/// Reads the previous leader epoch and persists the next one (`man/mortarmq.7`, PUB:
/// every start of a data directory takes the previous value + 1).
fn next_leader_epoch(storage: &dyn Storage, dir: &Path) -> Result<u64, String> {
    let path = dir.join(EPOCH_FILE);
    let previous = match meta::read_checked(storage, &path) {
        Ok(Some(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("{} is unreadable", path.display()))?,
        Ok(None) => 0,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let epoch = previous + 1;
    meta::write_atomic(storage, &path, epoch.to_string().as_bytes())
        .map_err(|e| format!("cannot persist leader epoch in {}: {e}", path.display()))?;
    Ok(epoch)
}

impl Broker {
    /// Groups and their committed positions from the positions file, once the partitions
    /// are open; the count of positions restored.
    fn restore_groups(&mut self, now: Now) -> Result<usize, String> {
        let registry = self.topics.registry();
        self.consume
            .restore(registry, &mut self.partitions, &mut self.counters, now)
    }

    /// A broker over a loaded registry, before any partition is opened; single node
    /// (`cluster` is set by `open_cluster`).
    fn assemble(
        config: BrokerConfig,
        storage: Arc<dyn Storage>,
        topics: TopicRegistry,
        sink: Box<dyn JobSink>,
        leader_epoch: u64,
    ) -> Broker {
        let topics_dir = config.data_dir.join(TOPICS_DIR);
        Broker {
            partitions: Partitions::new(Arc::clone(&storage), topics_dir, &config, leader_epoch),
            consume: ConsumeDriver::new(Arc::clone(&storage), &config),
            storage,
            config,
            leader_epoch,
            topics,
            sink,
            effects: Vec::new(),
            jobs: Vec::new(),
            manage: manage::ManageWaits::default(),
            counters: BrokerCounters::default(),
            cluster: None,
        }
    }

    /// Opens the data directory: loads the registry, bumps and persists the leader epoch,
    /// recovers every partition and rebuilds producer state. Runs before the listener
    /// opens, so blocking I/O is fine here. The caller holds the directory's
    /// [`DataDirLock`] (`mortard` takes it first thing, before anything is written).
    pub fn open(
        config: BrokerConfig,
        storage: Arc<dyn Storage>,
        sink: Box<dyn JobSink>,
        now: Now,
    ) -> Result<(Broker, StartupReport), String> {
        let dir = &config.data_dir;
        let topics_dir = dir.join(TOPICS_DIR);
        crate::log::storage::create_data_dir_durable(&*storage, &topics_dir)
            .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
        // A start refused by the registry leaves every file (the epoch too) as it was.
        let (topics, registry_read) = TopicRegistry::load(Arc::clone(&storage), dir)?;
        let leader_epoch = next_leader_epoch(&*storage, dir)?;
        let mut broker = Broker::assemble(config, storage, topics, sink, leader_epoch);
        let mut report = StartupReport {
            leader_epoch,
            topics: broker.topics.registry().len(),
            ..StartupReport::default()
        };
        let pairs: Vec<topics::TopicPair> = broker.topics.registry().pairs().cloned().collect();
        for pair in &pairs {
            report.partitions += broker.open_pair(pair)?;
        }
        broker
            .partitions
            .recover(now, &mut broker.counters)
            .map_err(|e| format!("journal: {e}"))?;
        // The journal's first file preallocated too, when this start has none.
        broker.partitions.take_sync_jobs(&mut broker.jobs);
        broker.submit_jobs();
        report.truncations = broker.counters.recovery_truncations;
        report.journal_records_replayed = broker.counters.journal_records_replayed;
        report.group_positions = broker.restore_groups(now)?;
        // Only a registry read from disk tells a deleted topic's directory from a live one.
        if registry_read {
            report.orphan_dirs_removed = broker.remove_orphan_dirs(&pairs);
        }
        Ok((broker, report))
    }

    /// Opens the partitions of a registered pair at start; returns how many.
    fn open_pair(&mut self, pair: &topics::TopicPair) -> Result<usize, String> {
        for (topic_id, name) in pair.topics() {
            for index in 0..pair.partition_count {
                self.partitions
                    .open((topic_id, index), &name, &mut self.counters)
                    .map_err(|e| e.to_string())?;
            }
        }
        let topics_dir = self.config.data_dir.join(TOPICS_DIR);
        match topics::write_missing_topic_files(&*self.storage, &topics_dir, pair) {
            Ok(true) => log::info!("wrote the topic files of topic '{}'", pair.name),
            Ok(false) => {}
            // Only a later registry rebuild needs them: that would fall back to a
            // placeholder name, so the start goes on.
            Err(e) => log::warn!("cannot write the topic files of topic '{}': {e}", pair.name),
        }
        Ok(2 * usize::from(pair.partition_count))
    }

    fn remove_orphan_dirs(&self, pairs: &[topics::TopicPair]) -> usize {
        let topics_dir = self.config.data_dir.join(TOPICS_DIR);
        let known: std::collections::HashSet<std::path::PathBuf> = pairs
            .iter()
            .flat_map(|p| p.topics())
            .map(|(id, name)| topics::topic_dir(&topics_dir, id, &name))
            .collect();
        let Ok(entries) = self.storage.list_dir(&topics_dir) else {
            return 0;
        };
        let mut removed = 0;
        for name in entries {
            let path = topics_dir.join(&name);
            if !known.contains(&path) {
                // Left by a DELETE whose registry write landed before a crash.
                log::info!("removing directory of deleted topic {name}");
                if self.storage.remove_dir_all(&path).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    /// `--max-data-size` (0: none).
    pub fn max_data_bytes(&self) -> u64 {
        self.config.max_data_bytes
    }

    /// The epoch of this start; in a cluster, raft's term.
    pub fn leader_epoch(&self) -> u64 {
        match &self.cluster {
            Some(c) => c.term(),
            None => self.leader_epoch,
        }
    }

    pub fn registry(&self) -> &Registry {
        self.topics.registry()
    }

    pub fn partition(&self, topic_id: u16, index: u16) -> Option<&partition::Partition> {
        self.partitions.get((topic_id, index))
    }

    pub fn partitions(&self) -> impl Iterator<Item = &partition::Partition> {
        self.partitions.iter()
    }

    /// One stored record, owned: for checkers (`tests/simulation.rs`) and read-only tools.
    /// `Ok(None)` when the partition or the sequence is not there.
    pub fn read_record(
        &mut self,
        topic_id: u16,
        partition: u16,
        sequence: u64,
    ) -> Result<Option<StoredRecord>, crate::log::StorageError> {
        let Some(part) = self.partitions.get_mut((topic_id, partition)) else {
            return Ok(None);
        };
        Ok(part.log.read_one(sequence)?.map(|r| StoredRecord {
            sequence: r.sequence,
            timestamp_ms: r.timestamp_ms,
            producer_id: r.producer_id,
            producer_seq: r.producer_seq,
            flags: r.flags,
            key: r.key.to_vec(),
            value: r.value.to_vec(),
        }))
    }

    /// The consumer groups, for /stats.
    pub fn coordinator(&self) -> &crate::consume::Coordinator {
        self.consume.coordinator()
    }

    /// Moves pending effects into `out` (the reactor reuses one Vec). The caller puts
    /// every PULL answer among them into its connection before it reports room again.
    pub fn drain_effects(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
        self.consume.outputs_caught_up();
    }

    fn submit_jobs(&mut self) {
        for job in self.jobs.drain(..) {
            self.sink.submit(job);
        }
    }

    /// PUB: the topic and partition must exist; the publish path does the rest.
    pub fn publish(&mut self, conn: ConnRef, slot: u64, p: &Pub<'_>, now: Now) -> Handled {
        let fail =
            |code, message: String| Handled::Answer(Response::err(code, Op::Pub as u8, message));
        let need = p.flags.durability().unwrap_or(self.config.durability);
        if need == Durability::Replicated && self.cluster.is_none() {
            return fail(
                ErrorCode::DurabilityUnavailable,
                "REPLICATED durability needs replicas; this broker is a single node".into(),
            );
        }
        let Some(pair) = self.topics.usable(p.topic_id) else {
            return fail(
                ErrorCode::UnknownTopic,
                format!("no topic with id {}", p.topic_id),
            );
        };
        if p.partition >= pair.partition_count {
            return fail(
                ErrorCode::UnknownPartition,
                format!(
                    "partition {} >= partition_count {}",
                    p.partition, pair.partition_count
                ),
            );
        }
        if self.cluster.is_some() {
            return self.publish_replicated(conn, slot, p, need, now);
        }
        self.partitions
            .publish(conn, slot, p, need, now, &mut self.counters)
    }

    /// Called once per reactor pass after all readable sockets were handled: writes
    /// each dirty partition with one write, answers what needed only WRITTEN, and starts
    /// fdatasyncs and registry writes (group commit: every PUB written before a sync
    /// starts rides it). PULLs answered here fit `room`.
    pub fn end_pass(&mut self, now: Now, room: &dyn OutputRoom) {
        if self.cluster.is_some() {
            return self.end_pass_cluster(now, room);
        }
        let consume = &mut self.consume;
        let flushed = |key: PartitionKey, written: Result<(), u64>| match written {
            Ok(()) => consume.records_available(key.0, key.1),
            Err(written) => consume.twin_flush_failed(key, written),
        };
        self.partitions
            .flush_dirty(&mut self.effects, &mut self.counters, flushed);
        self.partitions.take_sync_jobs(&mut self.jobs);
        self.jobs.extend(self.topics.take_write_job(now.mono_ms));
        self.consume.settle_dead_letters(&self.partitions);
        self.pump_consume(now, room);
        let write = self.positions_job(now, false);
        self.jobs.extend(write);
        self.submit_jobs();
        // Dead letters appended by the pump are flushed on the next pass.
    }

    /// A positions write when they changed and the interval passed (or `force`), of
    /// the positions this node makes durable ([`durable_positions`]).
    pub(in crate::broker) fn positions_job(&mut self, now: Now, force: bool) -> Option<DurableJob> {
        let cluster = self.cluster.as_deref();
        (self.consume).positions_job(now, force, |c| durable_positions(cluster, c))
    }

    /// A durable-I/O job finished on a worker.
    pub fn job_done(&mut self, done: JobDone, now: Now) {
        let JobDone {
            job,
            result,
            elapsed,
        } = done;
        match job.work {
            Work::SyncJournal {
                sync,
                undone,
                records,
                ..
            } => {
                let done = SyncDone {
                    upto_lsn: sync.upto_lsn,
                    undone,
                    records,
                    result: &result,
                    elapsed,
                };
                self.partitions.sync_done(
                    done,
                    &mut self.effects,
                    &mut self.counters,
                    &mut self.jobs,
                );
                self.consume.settle_dead_letters(&self.partitions);
                self.submit_jobs();
            }
            Work::Checkpoint { syncs, write } => {
                let done = (&mut self.jobs, &mut self.counters, &mut self.effects);
                self.partitions
                    .checkpoint_done(syncs, write.lsn, &result, done);
                self.topics.checkpointed(write.lsn);
                self.submit_jobs();
            }
            Work::RemoveFiles { .. } => {}
            Work::MakeSpare { .. } if self.cluster.is_some() => self.raft_spare_made(&result),
            Work::MakeSpare { .. } => self.partitions.spare_made(&result),
            Work::CreateTopic { opened, .. } => self.topic_created(opened, &result, now),
            Work::WriteRegistry { version, .. } => {
                let removal =
                    self.topics
                        .write_done(version, &result, now.mono_ms, &mut self.effects);
                self.jobs.extend(removal);
                self.submit_jobs();
            }
            Work::RemoveDirectories { version, .. } => {
                self.topics.directories_removed(version, &mut self.effects)
            }
            Work::WritePositions { .. } => {
                self.consume.positions_written(&result);
                self.write_waited_positions(now);
            }
            Work::Purge {
                ticket,
                snapshots,
                files,
            } => self.purge_done(ticket, (&snapshots, &files), &result),
            Work::WriteProducerSnapshot { write } => {
                self.partitions.snapshot_written(&write, &result)
            }
            Work::Persist { job } => self.persist_done(&job, result),
            Work::Install { job } => self.install_job_done(job, result, now),
            work @ Work::RaftCheckpoint { .. } => {
                let done = replica::compaction::CheckpointDone::new(work, result);
                self.cluster_checkpoint_done(done, now);
            }
        }
    }

    /// The earliest time the broker needs a turn without any socket event.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        Some(self.consume.next_deadline_ms())
    }

    /// A connection went away: its waiting answers are dropped by the reactor (their
    /// serial no longer matches); its group memberships end.
    pub fn connection_closed(&mut self, conn: ConnRef, now: Now) {
        self.consume.connection_closed(conn, now);
    }

    /// Periodic housekeeping (about once a second): retention, producer expiry,
    /// producer snapshots, and another try at a checkpoint that failed.
    pub fn housekeeping(&mut self, now: Now) {
        self.partitions
            .housekeeping(now, &mut self.counters, &mut self.jobs);
        self.retry_cluster_checkpoint();
        self.retry_dead_letters(now);
        self.submit_jobs();
    }

    /// At shutdown, after the worker pool stopped: writes and syncs everything still
    /// buffered on the calling thread, and persists what must survive a restart.
    pub fn shutdown_sync(&mut self, now: Now) -> Result<(), String> {
        let mut failed = Vec::new();
        // A cluster node's records are in its raft journal; a start applies them again.
        if self.cluster.is_none() {
            self.partitions
                .shutdown_sync(now, &mut failed, &mut self.counters);
        }
        let cluster = self.cluster.as_deref();
        let held = |c: &_| durable_positions(cluster, c);
        if let Err(e) = self.consume.persist_positions_now(held) {
            failed.push(format!("group positions: {e}"));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    /// The broker's bookkeeping holds together; the tests and the reactor's debug builds
    /// run it after every step.
    pub fn check_invariants(&self) {
        self.topics.check_invariants(self.registry_in_flight());
        self.partitions.check_invariants();
        assert!(
            self.cluster.is_none() || !self.partitions.has_unflushed(),
            "a cluster node appended outside apply"
        );
        if let Some(c) = self.cluster.as_deref() {
            c.check_invariants();
        }
        let proposed_end = |key| {
            self.cluster
                .as_deref()
                .map_or(Some(0), |c| c.proposed_end(key))
        };
        self.consume
            .check_invariants(&self.partitions, &proposed_end);
        assert!(self.jobs.is_empty(), "jobs gathered but never submitted");
    }
}

/// The group positions a node makes durable, in its positions file and in a snapshot's:
/// a single node's groups' own; a cluster node's as its applied log says them
/// (`replica::applied`), the state at its applied index. A cluster leader's live ones
/// run ahead of its log, with operator changes whose entries may still be truncated
/// (docs/DECISIONS.md "Admin writes"): read back after a restart, or installed from a
/// snapshot, a reset forwards among them would skip records never acknowledged. What
/// the applied ones lack, acknowledgements no BATCH carried yet, is delivered again.
fn durable_positions(
    cluster: Option<&replica::cluster::Cluster>,
    coordinator: &crate::consume::Coordinator,
) -> Vec<crate::consume::GroupPosition> {
    match cluster {
        Some(c) => c.applied_positions(),
        None => coordinator.positions(),
    }
}
