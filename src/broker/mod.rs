//! The broker room: topic registry, publish with durability, and (via `consume`) groups
//! and delivery. Plain state: it takes decoded requests plus the time and returns
//! answers and effects. No sockets, no threads, no clock of its own.
//!
//! Depends on `wire` (types and codes), `log` (partition storage), `consume` (the
//! group coordinator) and `fsync` (only the `Job` type: durable I/O is handed to a
//! [`JobSink`], the reactor's worker pool, and comes back through [`Broker::job_done`]).
//!
//! A request is answered now ([`Handled::Answer`]) or later ([`Handled::Wait`]): the
//! answer then arrives as [`Effect::Answer`] naming the connection and the response
//! slot the reactor reserved for it.

pub mod answer;
mod config;
mod counters;
pub mod deliver;
pub mod idhash;
pub mod publish;
pub mod topics;

#[cfg(test)]
mod tests;

use std::collections::VecDeque;

use idhash::IdMap;
use std::io;
use std::path::{Path, PathBuf};

use crate::consume::{self, Coordinator, GroupPosition};
use crate::fsync::{Completion, Job};
use crate::log::{meta, PartitionLog, RecordView, StorageError};
use crate::wire::limits::{MAX_KEY_LEN_BYTES, MAX_VALUE_LEN_BYTES};
use crate::wire::ops::{Declare, DeclareResult, Op, Pub, PubResult};
use crate::wire::{DeclareCreated, DeclareFlags, Durability, ErrorCode, PubResultFlags};

pub use answer::Answer;
pub use config::BrokerConfig;
pub use counters::{bucket_of, BrokerCounters, FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use publish::{Idempotence, Partition, Waiter};
use topics::{Registry, TopicPair, DLQ_SUFFIX};

/// fdatasyncs one partition may have running at once. Two, so that records arriving
/// while one sync runs start their own at once instead of waiting for it (a pipelining
/// client's burst often straddles two reactor passes). A sync covers everything written
/// before it started, whichever finishes first, so completions may come in any order.
pub const SYNCS_IN_FLIGHT_PER_PARTITION_MAX: u8 = 2;
/// A partition with more written-but-unsynced bytes than this refuses PUBs with
/// BACKPRESSURE until the disk catches up: a producer faster than the disk must not
/// fill the page cache (and block the reactor in `write`).
pub const UNSYNCED_BYTES_MAX: u64 = 64 * 1024 * 1024;

const REGISTRY_FILE: &str = "registry";
const EPOCH_FILE: &str = "epoch";
const TOPICS_DIR: &str = "topics";

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

/// Where the broker sends durable I/O: the fsync worker pool, or a fake in tests.
pub trait JobSink {
    fn submit(&self, id: u64, job: Job);
}

impl JobSink for crate::fsync::Submitter {
    fn submit(&self, id: u64, job: Job) {
        crate::fsync::Submitter::submit(self, id, job)
    }
}

pub enum Handled {
    Answer(Answer),
    /// The reactor keeps the request's slot open; an [`Effect::Answer`] fills it.
    Wait,
}

pub enum Effect {
    Answer {
        conn: ConnRef,
        slot: u64,
        answer: Answer,
    },
    /// Push a NOTICE (no slot).
    Notice {
        conn: ConnRef,
        notice: crate::wire::ops::Notice,
    },
    /// Push a MSG (no slot): the reactor calls [`Broker::encode_delivery`] straight into
    /// the connection's output buffer.
    Deliver {
        conn: ConnRef,
        delivery: consume::Delivery,
    },
}

enum JobKind {
    Sync {
        key: (u16, u16),
        upto: u64,
        records: u64,
        bytes: u64,
    },
    Registry {
        version: u64,
    },
    Positions,
    ProducerSnapshot {
        key: (u16, u16),
    },
}

struct RegistryWaiter {
    conn: ConnRef,
    slot: u64,
    version: u64,
    answer: Answer,
}

/// What start-up found, for the log and /stats.
#[derive(Debug, Default)]
pub struct StartupReport {
    pub leader_epoch: u64,
    pub topics: usize,
    pub partitions: usize,
    pub truncations: u64,
    pub orphan_dirs_removed: usize,
    pub group_positions: usize,
}

pub struct Broker {
    config: BrokerConfig,
    leader_epoch: u64,
    registry: Registry,
    registry_version: u64,
    registry_durable: u64,
    registry_in_flight: bool,
    registry_waiters: VecDeque<RegistryWaiter>,
    /// Directories of deleted pairs, removed once the registry without them is durable.
    doomed_dirs: Vec<PathBuf>,
    partitions: IdMap<(u16, u16), Partition>,
    flush_list: Vec<(u16, u16)>,
    sync_list: Vec<(u16, u16)>,
    jobs: IdMap<u64, JobKind>,
    next_job_id: u64,
    sink: Box<dyn JobSink>,
    effects: Vec<Effect>,
    ready: Vec<Waiter>,
    data_bytes: u64,
    coordinator: Coordinator,
    /// Serials of connections that used the consume plane (the coordinator knows ids).
    conn_serials: IdMap<u32, u64>,
    consume_effects: Vec<consume::Effect>,
    dead_letters: Vec<deliver::DeadLetterWait>,
    persisted_positions: Vec<GroupPosition>,
    positions_in_flight: bool,
    next_positions_write_ms: u64,
    next_producer_snapshot_ms: u64,
    pub counters: BrokerCounters,
}

/// A topic's directory: `<topic_id>-<crc32 of its name, 8 hex digits>`. Not the name
/// itself: a 255-byte name (plus `.dlq`) does not fit a file name (NAME_MAX).
fn topic_dir_name(topic_id: u16, name: &str) -> String {
    format!("{topic_id}-{:08x}", crc32fast::hash(name.as_bytes()))
}

fn partition_dir(data_dir: &Path, topic_id: u16, name: &str, index: u16) -> PathBuf {
    data_dir
        .join(TOPICS_DIR)
        .join(topic_dir_name(topic_id, name))
        .join(index.to_string())
}

fn storage_code(e: &StorageError) -> ErrorCode {
    match e {
        StorageError::NoSpace { .. } => ErrorCode::StorageFull,
        _ => ErrorCode::InternalError,
    }
}

fn io_code(e: &io::Error) -> ErrorCode {
    if e.raw_os_error() == Some(28) {
        ErrorCode::StorageFull
    } else {
        ErrorCode::InternalError
    }
}

impl Broker {
    /// Opens the data directory: bumps and persists the leader epoch, loads the
    /// registry, recovers every partition and rebuilds producer state. Runs before the
    /// listener opens, so blocking I/O is fine here.
    pub fn open(
        config: BrokerConfig,
        sink: Box<dyn JobSink>,
        now: Now,
    ) -> Result<(Broker, StartupReport), String> {
        let dir = &config.data_dir;
        std::fs::create_dir_all(dir.join(TOPICS_DIR))
            .map_err(|e| format!("cannot create data directory {}: {e}", dir.display()))?;
        let epoch_path = dir.join(EPOCH_FILE);
        let previous = match meta::read_checked(&epoch_path) {
            Ok(Some(bytes)) => std::str::from_utf8(&bytes)
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .ok_or_else(|| format!("{} is unreadable", epoch_path.display()))?,
            Ok(None) => 0,
            Err(e) => return Err(format!("{}: {e}", epoch_path.display())),
        };
        let leader_epoch = previous + 1;
        meta::write_atomic(&epoch_path, leader_epoch.to_string().as_bytes()).map_err(|e| {
            format!(
                "cannot persist leader epoch in {}: {e}",
                epoch_path.display()
            )
        })?;

        let registry = match meta::read_checked(&dir.join(REGISTRY_FILE)) {
            Ok(Some(bytes)) => Registry::decode(&bytes).map_err(|e| format!("registry: {e}"))?,
            Ok(None) => Registry::default(),
            Err(e) => return Err(format!("registry: {e}")),
        };
        let config_consume = config.consume.clone();
        let mut broker = Broker {
            config,
            leader_epoch,
            registry,
            registry_version: 0,
            registry_durable: 0,
            registry_in_flight: false,
            registry_waiters: VecDeque::new(),
            doomed_dirs: Vec::new(),
            partitions: IdMap::default(),
            flush_list: Vec::new(),
            sync_list: Vec::new(),
            jobs: IdMap::default(),
            next_job_id: 1,
            sink,
            effects: Vec::new(),
            ready: Vec::new(),
            data_bytes: 0,
            coordinator: Coordinator::new(config_consume),
            conn_serials: IdMap::default(),
            consume_effects: Vec::new(),
            dead_letters: Vec::new(),
            persisted_positions: Vec::new(),
            positions_in_flight: false,
            next_positions_write_ms: 0,
            next_producer_snapshot_ms: publish::PRODUCER_SNAPSHOT_INTERVAL_MS,
            counters: BrokerCounters::default(),
        };
        let mut report = StartupReport {
            leader_epoch,
            topics: broker.registry.len(),
            ..StartupReport::default()
        };
        let pairs: Vec<TopicPair> = broker.registry.pairs().cloned().collect();
        for pair in &pairs {
            for (topic_id, name) in [
                (pair.source_id(), pair.name.clone()),
                (pair.twin_id(), pair.twin_name()),
            ] {
                for index in 0..pair.partition_count {
                    broker.open_partition(topic_id, &name, index, now)?;
                    report.partitions += 1;
                }
            }
        }
        report.truncations = broker.counters.recovery_truncations;
        report.group_positions = broker.restore_groups()?;
        report.orphan_dirs_removed = broker.remove_orphan_dirs(&pairs);
        Ok((broker, report))
    }

    fn open_partition(
        &mut self,
        topic_id: u16,
        name: &str,
        index: u16,
        now: Now,
    ) -> Result<(), String> {
        let dir = partition_dir(&self.config.data_dir, topic_id, name, index);
        let (mut log, recovery) =
            PartitionLog::open(&dir, self.config.log).map_err(|e| e.to_string())?;
        if recovery.truncated_bytes > 0 {
            log::warn!(
                "recovery truncated {} bytes of topic {topic_id} partition {index} at {:?}",
                recovery.truncated_bytes,
                recovery.truncated_at
            );
            self.counters.recovery_truncations += 1;
            self.counters.recovery_truncated_bytes += recovery.truncated_bytes;
        }
        let ttl_ms = self.config.producer_ttl_ms;
        let written = log.written_sequence();
        let snapshot = meta::read_checked(&dir.join(publish::PRODUCERS_FILE))
            .ok()
            .flatten()
            .and_then(|bytes| {
                publish::Producers::decode(&bytes, now.mono_ms, now.wall_ms, ttl_ms)
                    .map_err(|e| log::warn!("{}: producer snapshot ignored: {e}", dir.display()))
                    .ok()
            });
        let (mut producers, first) = match snapshot {
            Some((mut producers, covered)) => {
                // The log may have lost an unsynced tail the snapshot saw (power loss).
                producers.roll_back_above(written);
                (producers, covered.min(written) + 1)
            }
            None => (publish::Producers::default(), log.first_sequence()),
        };
        let first = first.max(log.first_sequence());
        let scanned = log.scan_headers(
            first,
            |sequence, timestamp_ms, producer_id, producer_seq| {
                if producer_id != 0 && now.wall_ms.saturating_sub(timestamp_ms) <= ttl_ms {
                    // Idleness is measured on the monotonic clock from start-up on.
                    producers.record(producer_id, producer_seq, sequence, now.mono_ms);
                }
            },
        );
        if let Err(e) = scanned {
            // A damaged record in a closed segment must not keep every topic down: the
            // partition starts with the producer state found before it, reads of that
            // record report the corruption, and the count shows in /stats.
            log::error!("topic {topic_id} partition {index}: producer state rebuild stopped: {e}");
            self.counters.corrupt_records_found += 1;
        }
        self.data_bytes += log.stats().bytes;
        let mut partition = Partition::new(topic_id, index, log);
        partition.producers = producers;
        partition.producers_snapshot_covered = first - 1;
        self.partitions.insert((topic_id, index), partition);
        Ok(())
    }

    fn remove_orphan_dirs(&self, pairs: &[TopicPair]) -> usize {
        let known: std::collections::HashSet<String> = pairs
            .iter()
            .flat_map(|p| {
                [
                    topic_dir_name(p.source_id(), &p.name),
                    topic_dir_name(p.twin_id(), &p.twin_name()),
                ]
            })
            .collect();
        let Ok(entries) = std::fs::read_dir(self.config.data_dir.join(TOPICS_DIR)) else {
            return 0;
        };
        let mut removed = 0;
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !known.contains(&name) {
                // Left by a DELETE whose registry write landed before a crash.
                log::info!("removing directory of deleted topic {name}");
                if std::fs::remove_dir_all(entry.path()).is_ok() {
                    removed += 1;
                }
            }
        }
        removed
    }

    pub fn data_dir(&self) -> &Path {
        &self.config.data_dir
    }

    pub fn leader_epoch(&self) -> u64 {
        self.leader_epoch
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    pub fn partition(&self, topic_id: u16, index: u16) -> Option<&Partition> {
        self.partitions.get(&(topic_id, index))
    }

    pub fn partitions(&self) -> impl Iterator<Item = &Partition> {
        self.partitions.values()
    }

    /// Moves pending effects into `out` (the reactor reuses one Vec).
    pub fn drain_effects(&mut self, out: &mut Vec<Effect>) {
        out.append(&mut self.effects);
    }

    fn submit(&mut self, kind: JobKind, job: Job) {
        let id = self.next_job_id;
        self.next_job_id += 1;
        self.jobs.insert(id, kind);
        self.sink.submit(id, job);
    }

    // ---- DECLARE ------------------------------------------------------------------

    pub fn declare(&mut self, conn: ConnRef, slot: u64, d: &Declare<'_>, now: Now) -> Handled {
        let op = Op::Declare as u8;
        let fail = |code, msg: String| Handled::Answer(Answer::err(code, op, msg));
        if !topics::valid_name(d.topic) {
            return fail(
                ErrorCode::InvalidTopicName,
                "topic names are 1-255 bytes of [A-Za-z0-9._-]".into(),
            );
        }
        // valid_name admits only ASCII, so this cannot fail.
        let name = std::str::from_utf8(d.topic).unwrap_or_default();
        if name.ends_with(DLQ_SUFFIX) {
            return fail(
                ErrorCode::MutationNotPackable,
                format!("'{name}' is a dead-letter twin: address its source topic"),
            );
        }
        let existing = self.registry.lookup(name).cloned();
        if d.flags.contains(DeclareFlags::DELETE) {
            let Some(pair) = existing else {
                return fail(ErrorCode::UnknownTopic, format!("no topic '{name}'"));
            };
            if d.flags.contains(DeclareFlags::IF_UNUSED) && self.topic_in_use(&pair) {
                return fail(
                    ErrorCode::TopicInUse,
                    format!("topic '{name}' has live subscriptions"),
                );
            }
            self.delete_pair(&pair);
            for topic_id in [pair.source_id(), pair.twin_id()] {
                self.coordinator.topic_deleted(topic_id, now.mono_ms);
            }
            self.collect_consume_effects_pub(now);
            let answer = Answer::Declare(DeclareResult {
                topic_id: pair.source_id(),
                partition_count: pair.partition_count,
                created: DeclareCreated::Deleted.as_code(),
            });
            return self.after_registry_write(conn, slot, answer);
        }
        if let Some(pair) = existing {
            if d.partition_count != pair.partition_count
                && !(d.flags.contains(DeclareFlags::PASSIVE) && d.partition_count == 0)
            {
                return fail(
                    ErrorCode::TopicConfigConflict,
                    format!(
                        "topic '{name}' exists with {} partitions",
                        pair.partition_count
                    ),
                );
            }
            let answer = Answer::Declare(DeclareResult {
                topic_id: pair.source_id(),
                partition_count: pair.partition_count,
                created: DeclareCreated::IdempotentOk.as_code(),
            });
            // A topic created by a DECLARE still waiting for its registry write must
            // not be confirmed to anyone before that write is durable.
            return self.after_registry_write(conn, slot, answer);
        }
        if d.flags.contains(DeclareFlags::PASSIVE) {
            return fail(ErrorCode::UnknownTopic, format!("no topic '{name}'"));
        }
        if d.partition_count == 0 || d.partition_count > self.config.max_partitions {
            return fail(
                ErrorCode::InvalidArgument,
                format!("partition_count must be 1..={}", self.config.max_partitions),
            );
        }
        let pair = match self.registry.create(name, d.partition_count) {
            Ok(pair) => pair,
            Err(code) => return fail(code, "all 32767 topic pairs are in use".into()),
        };
        for (topic_id, topic_name) in [
            (pair.source_id(), pair.name.clone()),
            (pair.twin_id(), pair.twin_name()),
        ] {
            for index in 0..pair.partition_count {
                if let Err(e) = self.open_partition(topic_id, &topic_name, index, now) {
                    log::error!("cannot create topic '{name}': {e}");
                    self.drop_pair_state(&pair);
                    self.registry.delete(pair.pair);
                    let code = if e.contains("No space") {
                        ErrorCode::StorageFull
                    } else {
                        ErrorCode::InternalError
                    };
                    return fail(code, format!("cannot create topic files: {e}"));
                }
            }
        }
        log::info!(
            "created topic '{name}' id {} with {} partitions",
            pair.source_id(),
            pair.partition_count
        );
        self.registry_version += 1;
        let answer = Answer::Declare(DeclareResult {
            topic_id: pair.source_id(),
            partition_count: pair.partition_count,
            created: DeclareCreated::Created.as_code(),
        });
        self.after_registry_write(conn, slot, answer)
    }

    /// Whether a pair has live subscriptions (DELETE with IF_UNUSED).
    fn topic_in_use(&self, pair: &TopicPair) -> bool {
        self.coordinator.topic_has_members(pair.source_id())
            || self.coordinator.topic_has_members(pair.twin_id())
    }

    fn delete_pair(&mut self, pair: &TopicPair) {
        self.drop_pair_state(pair);
        self.registry.delete(pair.pair);
        self.registry_version += 1;
        for (topic_id, name) in [
            (pair.source_id(), pair.name.clone()),
            (pair.twin_id(), pair.twin_name()),
        ] {
            self.doomed_dirs.push(
                self.config
                    .data_dir
                    .join(TOPICS_DIR)
                    .join(topic_dir_name(topic_id, &name)),
            );
        }
        log::info!("deleted topic '{}' id {}", pair.name, pair.source_id());
    }

    /// Forgets a pair's partitions; PUBs still waiting on them are answered now.
    fn drop_pair_state(&mut self, pair: &TopicPair) {
        for topic_id in [pair.source_id(), pair.twin_id()] {
            for index in 0..pair.partition_count {
                if let Some(p) = self.partitions.remove(&(topic_id, index)) {
                    self.data_bytes = self.data_bytes.saturating_sub(p.log.stats().bytes);
                    for w in p.waiters {
                        self.effects.push(Effect::Answer {
                            conn: w.conn,
                            slot: w.slot,
                            answer: Answer::err(
                                ErrorCode::UnknownTopic,
                                Op::Pub as u8,
                                "topic deleted",
                            ),
                        });
                    }
                }
            }
        }
        self.flush_list
            .retain(|&(t, _)| t != pair.source_id() && t != pair.twin_id());
        self.sync_list
            .retain(|&(t, _)| t != pair.source_id() && t != pair.twin_id());
    }

    fn after_registry_write(&mut self, conn: ConnRef, slot: u64, answer: Answer) -> Handled {
        if self.registry_durable >= self.registry_version {
            return Handled::Answer(answer);
        }
        self.registry_waiters.push_back(RegistryWaiter {
            conn,
            slot,
            version: self.registry_version,
            answer,
        });
        Handled::Wait
    }

    // ---- PUB ----------------------------------------------------------------------

    pub fn publish(&mut self, conn: ConnRef, slot: u64, p: &Pub<'_>, now: Now) -> Handled {
        let op = Op::Pub as u8;
        let fail = |code, msg: String| Handled::Answer(Answer::err(code, op, msg));
        let need = p.flags.durability().unwrap_or(self.config.durability);
        if need == Durability::Replicated {
            return fail(
                ErrorCode::DurabilityUnavailable,
                "REPLICATED durability needs replicas; this broker is a single node".into(),
            );
        }
        if p.key.len() > MAX_KEY_LEN_BYTES {
            return fail(
                ErrorCode::KeyTooLarge,
                format!("key_len {} > {MAX_KEY_LEN_BYTES}", p.key.len()),
            );
        }
        if p.value.len() > MAX_VALUE_LEN_BYTES as usize {
            return fail(
                ErrorCode::ValueTooLarge,
                format!("value_len {} > {MAX_VALUE_LEN_BYTES}", p.value.len()),
            );
        }
        if (p.producer_id == 0) != (p.producer_seq == 0) {
            return fail(
                ErrorCode::InvalidProducer,
                "producer_id and producer_seq must both be 0 or both be non-zero".into(),
            );
        }
        let Some((pair, _)) = self.registry.by_topic_id(p.topic_id) else {
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
        let max_data_bytes = self.config.max_data_bytes;
        let data_bytes = self.data_bytes;
        let Some(part) = self.partitions.get_mut(&(p.topic_id, p.partition)) else {
            return fail(ErrorCode::InternalError, "partition not open".into());
        };
        if part.log.is_poisoned() {
            return fail(
                ErrorCode::InternalError,
                "a previous fsync of this partition failed; it refuses writes until a restart"
                    .into(),
            );
        }
        self.counters.pubs += 1;
        if p.producer_id != 0 {
            match part.producers.check(p.producer_id, p.producer_seq) {
                Idempotence::Fresh => {}
                Idempotence::Duplicate { sequence } => {
                    self.counters.pubs_deduplicated += 1;
                    let waiter = Waiter {
                        conn,
                        slot,
                        sequence,
                        need,
                        deduplicated: true,
                    };
                    if part.reached(sequence, need) {
                        return Handled::Answer(pub_answer(part, self.leader_epoch, &waiter));
                    }
                    part.waiters.push(waiter);
                    return Handled::Wait;
                }
                Idempotence::OutOfOrder { expected, too_old } => {
                    let why = if too_old {
                        "older than the dedup window"
                    } else {
                        "skips ahead"
                    };
                    return fail(
                        ErrorCode::SequenceOutOfOrder,
                        format!("producer_seq {} {why}; expected {expected}", p.producer_seq),
                    );
                }
            }
        } else {
            self.counters.pubs_non_idempotent += 1;
        }
        let record_bytes = (p.key.len() + p.value.len()) as u64;
        if max_data_bytes > 0 && data_bytes + record_bytes > max_data_bytes {
            return fail(
                ErrorCode::StorageFull,
                format!("data directory cap of {max_data_bytes} bytes reached"),
            );
        }
        if part.unsynced_bytes() > UNSYNCED_BYTES_MAX {
            return fail(
                ErrorCode::Backpressure,
                "the disk is behind: too many unsynced bytes".into(),
            );
        }
        let record = RecordView {
            sequence: part.log.next_sequence(),
            timestamp_ms: now.wall_ms,
            producer_id: p.producer_id,
            producer_seq: p.producer_seq,
            flags: 0,
            key: p.key,
            value: p.value,
        };
        let sequence = match part.log.append(&record) {
            Ok(sequence) => sequence,
            Err(e) => return fail(storage_code(&e), e.to_string()),
        };
        if p.producer_id != 0 {
            part.producers
                .record(p.producer_id, p.producer_seq, sequence, now.mono_ms);
        }
        part.waiters.push(Waiter {
            conn,
            slot,
            sequence,
            need,
            deduplicated: false,
        });
        if !part.dirty {
            part.dirty = true;
            self.flush_list.push((p.topic_id, p.partition));
        }
        Handled::Wait
    }

    // ---- the end of a reactor pass, and completions ----------------------------------

    /// Called once per reactor pass after all readable sockets were handled: writes
    /// each dirty partition's buffered records with one write, answers the PUBs that
    /// needed only WRITTEN, and starts fdatasyncs and registry writes (group commit:
    /// at most one sync in flight per partition; what arrives meanwhile rides the next).
    pub fn end_pass(&mut self, now: Now) {
        let mut flush_list = std::mem::take(&mut self.flush_list);
        for key in flush_list.drain(..) {
            let Some(part) = self.partitions.get_mut(&key) else {
                continue;
            };
            part.dirty = false;
            let before = part.log.written_sequence();
            let pending = part.log.pending_bytes() as u64;
            match part.log.flush() {
                Ok(()) => {
                    let appended = part.log.written_sequence() - before;
                    self.counters.records_appended += appended;
                    self.data_bytes += pending;
                    part.flushed_bytes += pending;
                    if part.syncs_in_flight < SYNCS_IN_FLIGHT_PER_PARTITION_MAX {
                        self.sync_list.push(key);
                    }
                }
                Err(e) => {
                    log::error!("append to topic {} partition {} failed: {e}", key.0, key.1);
                    let written = part.log.written_sequence();
                    part.producers.roll_back_above(written);
                    let code = storage_code(&e);
                    let message = e.to_string();
                    part.waiters.retain(|w| {
                        if w.sequence <= written {
                            return true;
                        }
                        self.effects.push(Effect::Answer {
                            conn: w.conn,
                            slot: w.slot,
                            answer: Answer::err(code, Op::Pub as u8, message.clone()),
                        });
                        false
                    });
                }
            }
            self.answer_ready(key);
            self.coordinator.records_available(key.0, key.1);
        }
        self.flush_list = flush_list;
        let mut sync_list = std::mem::take(&mut self.sync_list);
        for key in sync_list.drain(..) {
            self.start_sync(key);
        }
        self.sync_list = sync_list;
        self.start_registry_write();
        self.settle_dead_letters();
        self.pump_consume(now);
        self.maybe_persist_positions(now, false);
        // Dead letters appended by the pump are flushed on the next pass.
    }

    /// Re-derives the data-dir size from the partitions. `data_bytes` is kept up to
    /// date incrementally on every flush; this exact count (segment headers, retention
    /// deletions) runs with housekeeping, not on every pass: it visits every partition.
    fn recount_data_bytes(&mut self) {
        self.data_bytes = self.partitions.values().map(|p| p.log.stats().bytes).sum();
    }

    fn start_sync(&mut self, key: (u16, u16)) {
        let Some(part) = self.partitions.get_mut(&key) else {
            return;
        };
        if part.syncs_in_flight >= SYNCS_IN_FLIGHT_PER_PARTITION_MAX {
            return;
        }
        let Some(job) = part.log.take_sync_job() else {
            return;
        };
        part.syncs_in_flight += 1;
        let upto = job.upto_sequence;
        // Records and bytes this job adds to what the jobs before it cover.
        let records = upto.saturating_sub(part.sync_taken_sequence);
        part.sync_taken_sequence = upto;
        let bytes = part.flushed_bytes;
        self.submit(
            JobKind::Sync {
                key,
                upto,
                records,
                bytes,
            },
            Box::new(move || job.run()),
        );
    }

    fn start_registry_write(&mut self) {
        if self.registry_in_flight || self.registry_durable >= self.registry_version {
            return;
        }
        self.registry_in_flight = true;
        let version = self.registry_version;
        let bytes = self.registry.encode();
        let path = self.config.data_dir.join(REGISTRY_FILE);
        let doomed = std::mem::take(&mut self.doomed_dirs);
        self.submit(
            JobKind::Registry { version },
            Box::new(move || {
                meta::write_atomic(&path, &bytes)?;
                // Files of deleted pairs go only once the registry no longer names
                // them; a crash in between leaves orphans that start-up removes.
                for dir in doomed {
                    if let Err(e) = std::fs::remove_dir_all(&dir) {
                        log::warn!("cannot remove {}: {e}", dir.display());
                    }
                }
                Ok(())
            }),
        );
    }

    /// A durable-I/O job finished on a worker.
    pub fn job_done(&mut self, done: Completion) {
        let Some(kind) = self.jobs.remove(&done.id) else {
            return;
        };
        match kind {
            JobKind::Sync {
                key,
                upto,
                records,
                bytes,
            } => {
                let Some(part) = self.partitions.get_mut(&key) else {
                    return;
                };
                part.syncs_in_flight -= 1;
                match &done.result {
                    Ok(()) if part.log.is_poisoned() => {
                        // An earlier sync failed: this one's success may hide lost
                        // pages (the kernel reports a writeback error once), so it
                        // acknowledges nothing.
                    }
                    Ok(()) => {
                        part.log.sync_done(upto);
                        part.synced_bytes = part.synced_bytes.max(bytes);
                        self.counters.fsyncs += 1;
                        self.counters.fsync_records += records;
                        let micros = done.elapsed.as_micros() as u64;
                        self.counters.fsync_micros_total += micros;
                        self.counters.fsync_latency
                            [bucket_of(&FSYNC_LATENCY_BUCKETS_US, micros)] += 1;
                        self.counters.fsync_batch[bucket_of(&FSYNC_BATCH_BUCKETS, records)] += 1;
                        if part.log.written_sequence() > upto {
                            self.sync_list.push(key);
                        }
                        self.answer_ready(key);
                        self.settle_dead_letters();
                    }
                    Err(e) => {
                        // Sticky: what was not synced is never acknowledged, and the
                        // partition refuses writes until a restart re-verifies it.
                        log::error!(
                            "fdatasync of topic {} partition {} failed: {e}; partition is poisoned",
                            key.0,
                            key.1
                        );
                        self.counters.fsync_failures += 1;
                        part.log.sync_failed(e);
                        let waiters = std::mem::take(&mut part.waiters);
                        let synced = part.log.synced_sequence();
                        for w in waiters {
                            let reached = (w.need == Durability::Written
                                && w.sequence <= part.log.written_sequence())
                                || w.sequence <= synced;
                            let answer = if reached {
                                pub_answer(part, self.leader_epoch, &w)
                            } else {
                                Answer::err(
                                    ErrorCode::InternalError,
                                    Op::Pub as u8,
                                    format!("fdatasync failed: {e}"),
                                )
                            };
                            self.effects.push(Effect::Answer {
                                conn: w.conn,
                                slot: w.slot,
                                answer,
                            });
                        }
                    }
                }
            }
            JobKind::ProducerSnapshot { key } => {
                if let Some(part) = self.partitions.get_mut(&key) {
                    part.producers_snapshot_in_flight = false;
                }
                if let Err(e) = &done.result {
                    // Harmless: start-up then scans from the previous snapshot.
                    log::warn!(
                        "producer snapshot of topic {} partition {}: {e}",
                        key.0,
                        key.1
                    );
                }
            }
            JobKind::Positions => {
                self.positions_in_flight = false;
                if let Err(e) = &done.result {
                    log::error!("persisting group positions failed: {e}");
                    // Forget what we thought was on disk so the next turn rewrites it.
                    self.persisted_positions.clear();
                }
            }
            JobKind::Registry { version } => {
                self.registry_in_flight = false;
                match &done.result {
                    Ok(()) => {
                        self.registry_durable = version;
                        while self
                            .registry_waiters
                            .front()
                            .is_some_and(|w| w.version <= version)
                        {
                            let w = self.registry_waiters.pop_front().expect("front exists");
                            self.effects.push(Effect::Answer {
                                conn: w.conn,
                                slot: w.slot,
                                answer: w.answer,
                            });
                        }
                    }
                    Err(e) => {
                        log::error!("writing the topic registry failed: {e}");
                        let code = io_code(e);
                        for w in self.registry_waiters.drain(..) {
                            self.effects.push(Effect::Answer {
                                conn: w.conn,
                                slot: w.slot,
                                answer: Answer::err(
                                    code,
                                    Op::Declare as u8,
                                    format!("registry write failed: {e}"),
                                ),
                            });
                        }
                        // The next mutation retries the write with the whole registry.
                        self.registry_durable = self.registry_version.saturating_sub(1);
                    }
                }
            }
        }
    }

    fn answer_ready(&mut self, key: (u16, u16)) {
        let Some(part) = self.partitions.get_mut(&key) else {
            return;
        };
        part.take_ready(&mut self.ready);
        for w in self.ready.drain(..) {
            self.effects.push(Effect::Answer {
                conn: w.conn,
                slot: w.slot,
                answer: pub_answer(part, self.leader_epoch, &w),
            });
        }
    }

    /// The earliest time the broker needs a turn without any socket event.
    pub fn next_deadline_ms(&self) -> Option<u64> {
        let positions = self.next_positions_write_ms;
        Some(
            self.coordinator
                .next_deadline_ms()
                .map_or(positions, |d| d.min(positions)),
        )
    }

    /// A connection went away: its waiting answers are dropped by the reactor (their
    /// serial no longer matches); its group memberships end.
    pub fn connection_closed(&mut self, conn: ConnRef, now: Now) {
        if self.conn_serials.get(&conn.id) == Some(&conn.serial) {
            self.conn_serials.remove(&conn.id);
            self.coordinator.connection_closed(conn.id, now.mono_ms);
        }
    }

    /// At shutdown, after the worker pool stopped: writes and syncs everything still
    /// buffered on the calling thread, and persists what must survive a restart.
    pub fn shutdown_sync(&mut self, now: Now) -> Result<(), String> {
        let mut failed = Vec::new();
        for part in self.partitions.values_mut() {
            if let Err(e) = part.log.flush() {
                failed.push(e.to_string());
                continue;
            }
            if let Some(job) = part.log.take_sync_job() {
                match job.run() {
                    Ok(()) => part.log.sync_done(job.upto_sequence),
                    Err(e) => failed.push(e.to_string()),
                }
            }
            let covered = part.log.written_sequence();
            let bytes = part.producers.encode(covered, now.mono_ms, now.wall_ms);
            if let Err(e) =
                meta::write_atomic(&part.log.dir().join(publish::PRODUCERS_FILE), &bytes)
            {
                failed.push(format!("producer snapshot: {e}"));
            }
        }
        if let Err(e) = self.persist_positions_now() {
            failed.push(format!("group positions: {e}"));
        }
        if failed.is_empty() {
            Ok(())
        } else {
            Err(failed.join("; "))
        }
    }

    /// The coordinator's effects after a DECLARE DELETE (REVOKEs to the owners).
    fn collect_consume_effects_pub(&mut self, now: Now) {
        self.pump_consume(now);
    }

    /// The consumer groups, for /stats.
    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// Periodic housekeeping (about once a second): retention and producer expiry.
    pub fn housekeeping(&mut self, now: Now) {
        self.recount_data_bytes();
        for part in self.partitions.values_mut() {
            match part.log.enforce_retention(now.wall_ms) {
                Ok(report) if report.segments_deleted > 0 => {
                    log::info!(
                        "retention deleted {} segments of topic {} partition {}",
                        report.segments_deleted,
                        part.topic_id,
                        part.index
                    );
                }
                Ok(_) => {}
                Err(e) => log::warn!(
                    "retention on topic {} partition {}: {e}",
                    part.topic_id,
                    part.index
                ),
            }
            self.counters.producers_expired +=
                part.producers
                    .expire(now.mono_ms, self.config.producer_ttl_ms) as u64;
        }
        if now.mono_ms >= self.next_producer_snapshot_ms {
            self.next_producer_snapshot_ms = now.mono_ms + publish::PRODUCER_SNAPSHOT_INTERVAL_MS;
            let keys: Vec<(u16, u16)> = self.partitions.keys().copied().collect();
            for key in keys {
                self.snapshot_producers(key, now);
            }
        }
    }

    /// Writes a partition's producer snapshot on a worker when it changed.
    fn snapshot_producers(&mut self, key: (u16, u16), now: Now) {
        let Some(part) = self.partitions.get_mut(&key) else {
            return;
        };
        let covered = part.log.next_sequence() - 1;
        if part.producers_snapshot_in_flight || covered == part.producers_snapshot_covered {
            return;
        }
        part.producers_snapshot_in_flight = true;
        part.producers_snapshot_covered = covered;
        let bytes = part.producers.encode(covered, now.mono_ms, now.wall_ms);
        let path = part.log.dir().join(publish::PRODUCERS_FILE);
        self.submit(
            JobKind::ProducerSnapshot { key },
            Box::new(move || meta::write_atomic(&path, &bytes)),
        );
    }
}

fn pub_answer(part: &Partition, leader_epoch: u64, w: &Waiter) -> Answer {
    Answer::Pub(PubResult {
        sequence: w.sequence,
        durability: part.level_of(w.sequence).as_code(),
        leader_epoch,
        commit_seq: part.log.synced_sequence(),
        result_flags: if w.deduplicated {
            PubResultFlags::DEDUPLICATED
        } else {
            PubResultFlags::empty()
        },
    })
}

impl Broker {
    /// The single dispatch of client requests that reach the broker (CONNECT and PING
    /// are the session's). `slot` is where a waiting answer will go.
    pub fn handle(
        &mut self,
        conn: ConnRef,
        slot: u64,
        frame: &crate::wire::Frame<'_>,
        now: Now,
    ) -> Handled {
        use crate::wire::Frame;
        match frame {
            Frame::Declare(d) => self.declare(conn, slot, d, now),
            Frame::Pub(p) => self.publish(conn, slot, p, now),
            Frame::Sub(_)
            | Frame::Ack(_)
            | Frame::Nack(_)
            | Frame::Pull(_)
            | Frame::Heartbeat(_)
            | Frame::ControlAck(_)
            | Frame::Credit(_) => self.handle_consume(conn, slot, frame, now),
            other => Handled::Answer(Answer::err(
                ErrorCode::InternalError,
                other.op() as u8,
                "op not handled by this broker",
            )),
        }
    }
}
