//! The publish path: every partition's log and producers, PUB with the durability it
//! asks for, and group commit.
//!
//! A PUB is appended to its partition's write buffer at once; at the end of the reactor
//! pass each dirty partition is written with one write ([`Partitions::flush_dirty`]),
//! the same records go to the node's journal, and a journal sync job covers every
//! partition written before it was taken (group commit, `commit.rs`). A PUB is answered
//! when its record reached what it asked for (`docs/STORAGE.md`, `man/mortarmq.7` PUB).

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log::journal::Journal;
use crate::log::{meta, LogConfig, PartitionLog, RecordView, Storage, StorageError};
use crate::wire::limits::{MAX_KEY_LEN_BYTES, MAX_VALUE_LEN_BYTES};
use crate::wire::ops::Pub;
use crate::wire::{Durability, ErrorCode, Op, Response};

use super::commit::GroupCommit;
use super::counters::{bucket_of, BrokerCounters, FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use super::idhash::IdMap;
use super::jobs::{DurableJob, OpenedLogs, SegmentSync, SnapshotWrite, Work};
use super::partition::{Partition, ProducerSnapshots, Waiter};
use super::producers::{self, Idempotence, Producers};
use super::topics::{partition_dir, TopicPair};
use super::{ConnRef, Effect, Handled, Now, PartitionKey, JOURNAL_DIR};

/// A partition with more written-but-unsynced bytes than this refuses PUBs with
/// BACKPRESSURE until the disk catches up: a producer faster than the disk must not
/// fill the page cache (and block the reactor in `write`).
pub const UNSYNCED_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// What a publish-path operation failed with, before it becomes an ERR.
fn storage_code(e: &StorageError) -> ErrorCode {
    match e {
        StorageError::NoSpace { .. } => ErrorCode::StorageFull,
        _ => ErrorCode::InternalError,
    }
}

fn fail(code: ErrorCode, message: String) -> Handled {
    Handled::Answer(Response::err(code, Op::Pub as u8, message))
}

/// A finished [`Work::SyncJournal`], as the publish path needs it.
pub(super) struct SyncDone<'a> {
    pub upto_lsn: u64,
    pub undone: Vec<super::jobs::SegmentSync>,
    pub records: u64,
    pub result: &'a std::io::Result<()>,
    pub elapsed: std::time::Duration,
}

/// Every open partition, source and `.dlq` twin alike.
pub struct Partitions {
    storage: Arc<dyn Storage>,
    map: IdMap<PartitionKey, Partition>,
    /// Partitions with buffered records this pass.
    flush_list: Vec<PartitionKey>,
    /// The journal, its syncs and checkpoints.
    commit: GroupCommit,
    /// Bytes of every segment (kept current by flushes, recounted in housekeeping).
    data_bytes: u64,
    topics_dir: PathBuf,
    log_config: LogConfig,
    producer_ttl_ms: u64,
    /// `--max-producers`.
    max_producers: usize,
    /// `--max-data-size` (0 = none).
    max_data_bytes: u64,
    /// Cluster mode: the log's clock, the newest leader's wall-clock reading this node
    /// applied (a BATCH's stamp, a record's timestamp). A producer's activity is its
    /// record's timestamp and `--producer-ttl` and `--retention-age` are measured on
    /// this clock, not on the node's own: every node, whenever it applies the log and
    /// wherever its wall clock stands, ages, evicts and expires the same producers
    /// and deletes segments by the same time (`docs/DECISIONS.md`, "The log's clock").
    /// `None` on a single node, whose producers age on its monotonic clock.
    log_clock_ms: Option<u64>,
    leader_epoch: u64,
    next_producer_snapshot_ms: u64,
    /// Reused between passes: waiters answered in one go.
    ready: Vec<Waiter>,
}

impl Partitions {
    pub(super) fn new(
        storage: Arc<dyn Storage>,
        topics_dir: PathBuf,
        config: &super::BrokerConfig,
        epoch: u64,
    ) -> Self {
        let journal_dir = config.data_dir.join(JOURNAL_DIR);
        let journal = Journal::new(&storage, &journal_dir, config.journal_file_bytes, epoch);
        Partitions {
            commit: GroupCommit::new(&storage, journal, config.journal_file_bytes),
            storage,
            map: IdMap::default(),
            flush_list: Vec::new(),
            data_bytes: 0,
            topics_dir,
            log_config: config.log,
            producer_ttl_ms: config.producer_ttl_ms,
            max_producers: config.max_producers_per_partition,
            max_data_bytes: config.max_data_bytes,
            log_clock_ms: None,
            leader_epoch: epoch,
            next_producer_snapshot_ms: producers::PRODUCER_SNAPSHOT_INTERVAL_MS,
            ready: Vec::new(),
        }
    }

    pub fn get(&self, key: PartitionKey) -> Option<&Partition> {
        self.map.get(&key)
    }

    pub(super) fn get_mut(&mut self, key: PartitionKey) -> Option<&mut Partition> {
        self.map.get_mut(&key)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Partition> {
        self.map.values()
    }

    pub(super) fn keys(&self) -> impl Iterator<Item = PartitionKey> + '_ {
        self.map.keys().copied()
    }

    /// Opens (creating if needed) one partition's directory and recovers its log. Its
    /// producers are rebuilt by [`recover`](Self::recover), after the journal replay.
    pub(super) fn open(
        &mut self,
        key: PartitionKey,
        name: &str,
        counters: &mut BrokerCounters,
    ) -> Result<(), StorageError> {
        let dir = partition_dir(&self.topics_dir, key.0, name, key.1);
        let (log, recovery) = PartitionLog::open(&self.storage, &dir, self.log_config)?;
        if recovery.truncated_bytes > 0 {
            log::warn!(
                "recovery truncated {} bytes of topic {} partition {} at {:?}",
                recovery.truncated_bytes,
                key.0,
                key.1,
                recovery.truncated_at
            );
            counters.recovery_truncations += 1;
            counters.recovery_truncated_bytes += recovery.truncated_bytes;
        }
        self.data_bytes += log.stats().bytes;
        self.map.insert(key, Partition::new(key.0, key.1, log));
        Ok(())
    }

    /// Start-up, once every partition is open: replays the journal into the partitions
    /// that lost records (`commit.rs`), then rebuilds each one's producers from its
    /// snapshot and the records after it.
    pub(super) fn recover(
        &mut self,
        now: Now,
        counters: &mut BrokerCounters,
    ) -> Result<(), StorageError> {
        let report = self.commit.recover(&mut self.map, counters)?;
        log::info!(
            "journal: {} entries from lsn {} to {} replayed; {} records given back to \
             partitions that had lost them",
            report.entries_replayed,
            report.checkpoint_lsn,
            report.end_lsn,
            counters.journal_records_replayed
        );
        if let Some(why) = &report.ended_by {
            log::info!("journal: ends at {why}");
        }
        self.rebuild_all_producers(now, counters);
        Ok(())
    }

    /// Cluster mode, before the producers are rebuilt: see `log_clock_ms`.
    pub(super) fn run_on_log_clock(&mut self) {
        self.log_clock_ms = Some(0);
    }

    /// Moves the log's clock on to a leader's reading, if later (a leader whose clock
    /// was set back does not move it back).
    pub(super) fn log_clock_reads(&mut self, leader_wall_ms: u64) {
        if let Some(clock) = &mut self.log_clock_ms {
            *clock = (*clock).max(leader_wall_ms);
        }
    }

    pub fn log_clock_ms(&self) -> Option<u64> {
        self.log_clock_ms
    }

    /// The wall-clock reading a leader stamps on what it proposes (a record's timestamp,
    /// a BATCH): its own, but never behind the log's clock, so a leader whose clock was
    /// set back neither stamps records older than ones committed before them nor has its
    /// producers expire the moment they are applied.
    pub(super) fn stamp_ms(&self, now: Now) -> u64 {
        self.log_clock_ms
            .map_or(now.wall_ms, |clock| clock.max(now.wall_ms))
    }

    /// The clock producers' activity and retention are measured on: in cluster mode the
    /// log's, as both readings of a `Now`.
    fn aging_now(&self, now: Now) -> Now {
        match self.log_clock_ms {
            Some(clock) => Now {
                mono_ms: clock,
                wall_ms: clock,
            },
            None => now,
        }
    }

    /// Every partition's producers, from its snapshot and the records after it.
    pub(super) fn rebuild_all_producers(&mut self, now: Now, counters: &mut BrokerCounters) {
        if self.log_clock_ms.is_some() {
            self.read_log_clock();
        }
        let keys: Vec<PartitionKey> = self.map.keys().copied().collect();
        for key in keys {
            let mut part = self.map.remove(&key).expect("listed");
            let dir = part.log.dir().to_path_buf();
            let (producers, covered) =
                self.rebuild_producers(key, &dir, &mut part.log, now, counters);
            part.producers = producers;
            part.snapshots = ProducerSnapshots::rebuilt(covered);
            self.map.insert(key, part);
        }
        self.data_bytes = self.map.values().map(|p| p.log.stats().bytes).sum();
    }

    /// At start, the log's clock from the newest record of every partition: what this
    /// node applied before it stopped (applying the journal after its checkpoint again
    /// moves it on from there).
    fn read_log_clock(&mut self) {
        for part in self.map.values_mut() {
            match part.log.newest_timestamp() {
                Ok(newest) => self.log_clock_ms = self.log_clock_ms.max(newest),
                // Then this partition's records count from their next apply on.
                Err(e) => log::warn!("{}: newest record unread: {e}", part.log.dir().display()),
            }
        }
    }

    /// The producer state of a partition at start; returns it and the last sequence the
    /// snapshot on disk covers.
    fn rebuild_producers(
        &self,
        key: PartitionKey,
        dir: &Path,
        log: &mut PartitionLog,
        now: Now,
        counters: &mut BrokerCounters,
    ) -> (Producers, u64) {
        let (ttl_ms, max_producers) = (self.producer_ttl_ms, self.max_producers);
        let on_log_clock = self.log_clock_ms.is_some();
        let now = self.aging_now(now);
        let written = log.written_sequence();
        let snapshot = meta::read_checked(&*self.storage, &dir.join(producers::PRODUCERS_FILE))
            .ok()
            .flatten()
            .and_then(|bytes| {
                Producers::decode(&bytes, (now.mono_ms, now.wall_ms), ttl_ms, max_producers)
                    .map_err(|e| log::warn!("{}: producer snapshot ignored: {e}", dir.display()))
                    .ok()
            });
        let (mut producers, first) = match snapshot {
            Some((mut producers, covered)) => {
                // The log may have lost an unsynced tail the snapshot saw (power loss).
                producers.roll_back_above(written);
                (producers, covered.min(written) + 1)
            }
            None => (Producers::default(), log.first_sequence()),
        };
        let first = first.max(log.first_sequence());
        let scanned = log.scan_headers(first, |sequence, timestamp_ms, producer_id, seq| {
            if producer_id != 0 && now.wall_ms.saturating_sub(timestamp_ms) <= ttl_ms {
                // Idleness is measured on the monotonic clock from start-up on; in a
                // cluster from the record's timestamp, as apply does.
                let active_ms = if on_log_clock {
                    timestamp_ms
                } else {
                    now.mono_ms
                };
                let evicted =
                    producers.record(producer_id, seq, sequence, active_ms, max_producers);
                counters.producers_evicted += evicted as u64;
            }
        });
        match scanned {
            // Reads of a damaged record report it; the count shows in /stats.
            Ok(damaged) => counters.corrupt_records_found += damaged,
            Err(e) => {
                // An I/O error must not keep every topic down: the partition starts with
                // the producer state found before it.
                log::error!(
                    "topic {} partition {}: producer state rebuild stopped: {e}",
                    key.0,
                    key.1
                );
            }
        }
        (producers, first - 1)
    }

    /// The job that makes a new pair's partition directories and first segments on the
    /// fsync pool (directory and file creation fsync: not on the reactor thread).
    pub(super) fn create_job(&self, pair: &TopicPair) -> DurableJob {
        let mut plan = Vec::new();
        for (topic_id, name) in pair.topics() {
            for index in 0..pair.partition_count {
                let dir = partition_dir(&self.topics_dir, topic_id, &name, index);
                plan.push(((topic_id, index), dir));
            }
        }
        DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::CreateTopic {
                topics_dir: self.topics_dir.clone(),
                pair: pair.clone(),
                plan,
                config: self.log_config,
                opened: OpenedLogs::default(),
            },
        }
    }

    /// Takes over the logs a creation job opened: new, empty partitions.
    pub(super) fn install(&mut self, opened: OpenedLogs) {
        for (key, log) in opened.0 {
            self.data_bytes += log.stats().bytes;
            self.map.insert(key, Partition::new(key.0, key.1, log));
        }
    }

    /// The `--max-data-size` cap when `extra_bytes` more would pass it.
    pub(super) fn over_data_cap(&self, extra_bytes: u64) -> Option<u64> {
        let cap = self.max_data_bytes;
        (cap > 0 && self.data_bytes + extra_bytes > cap).then_some(cap)
    }

    /// Forgets a pair's partitions; PUBs still waiting on them are answered now.
    pub(super) fn remove_pair(&mut self, pair: &TopicPair, effects: &mut Vec<Effect>) {
        for topic_id in [pair.source_id(), pair.twin_id()] {
            for index in 0..pair.partition_count {
                let Some(p) = self.map.remove(&(topic_id, index)) else {
                    continue;
                };
                self.data_bytes = self.data_bytes.saturating_sub(p.log.stats().bytes);
                for w in p.waiters {
                    effects.push(Effect::Answer {
                        conn: w.conn,
                        slot: w.slot,
                        response: Response::err(
                            ErrorCode::UnknownTopic,
                            Op::Pub as u8,
                            "topic deleted",
                        ),
                    });
                }
            }
        }
        let gone = |&(t, _): &PartitionKey| t != pair.source_id() && t != pair.twin_id();
        self.flush_list.retain(gone);
    }

    /// PUB to a partition that exists (the caller checked the topic and the index):
    /// limits, idempotence, storage caps, then the append. Answered now (an error or an
    /// already-durable duplicate) or when the record reaches `need`.
    pub(super) fn publish(
        &mut self,
        conn: ConnRef,
        slot: u64,
        p: &Pub<'_>,
        need: Durability,
        now: Now,
        counters: &mut BrokerCounters,
    ) -> Handled {
        if let Some(refused) = refuse_fields(p) {
            return refused;
        }
        let (data_bytes, max_data_bytes) = (self.data_bytes, self.max_data_bytes);
        let key = (p.topic_id, p.partition);
        let Some(part) = self.map.get_mut(&key) else {
            return fail(ErrorCode::InternalError, "partition not open".into());
        };
        if part.log.is_poisoned() {
            return fail(
                ErrorCode::InternalError,
                "a previous fsync of this partition failed; it refuses writes until a restart"
                    .into(),
            );
        }
        if let Some(why) = self.commit.poisoned() {
            return fail(
                ErrorCode::InternalError,
                format!("{why}; the broker refuses writes until a restart"),
            );
        }
        counters.pubs += 1;
        let waiter = Waiter {
            conn,
            slot,
            sequence: 0,
            need,
            deduplicated: false,
        };
        if let Some(answered) = check_producer(part, p, waiter, self.leader_epoch, counters) {
            return answered;
        }
        let record_bytes = (p.key.len() + p.value.len()) as u64;
        if let Some(refused) = refuse_capacity(part, data_bytes + record_bytes, max_data_bytes) {
            return refused;
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
        let sequence = match self.append(key, &record) {
            Ok(sequence) => sequence,
            Err(e) => return fail(storage_code(&e), e.to_string()),
        };
        let part = self.map.get_mut(&key).expect("appended above");
        if p.producer_id != 0 {
            let (id, seq, max) = (p.producer_id, p.producer_seq, self.max_producers);
            let evicted = part.producers.record(id, seq, sequence, now.mono_ms, max);
            counters.producers_evicted += evicted as u64;
        }
        part.waiters.push(Waiter { sequence, ..waiter });
        Handled::Wait
    }

    /// Buffers a record in a partition and queues the partition for this pass's flush.
    pub(super) fn append(
        &mut self,
        key: PartitionKey,
        record: &RecordView<'_>,
    ) -> Result<u64, StorageError> {
        let part = self
            .map
            .get_mut(&key)
            .expect("the caller found the partition");
        let sequence = part.log.append(record)?;
        if !part.dirty {
            part.dirty = true;
            self.flush_list.push(key);
        }
        Ok(sequence)
    }

    /// Writes each dirty partition's buffered records with one write, queues them in the
    /// journal, writes the journal, and answers the PUBs that needed only WRITTEN. Calls
    /// `flushed` for every partition flushed, so the caller can wake its consumers: with
    /// `Ok`, or with `Err(written)` when the write failed and every record above
    /// `written` is gone.
    pub(super) fn flush_dirty(
        &mut self,
        effects: &mut Vec<Effect>,
        counters: &mut BrokerCounters,
        mut flushed: impl FnMut(PartitionKey, Result<(), u64>),
    ) {
        let mut flush_list = std::mem::take(&mut self.flush_list);
        let mut waiting = Vec::new();
        for key in flush_list.drain(..) {
            let Some(part) = self.map.get_mut(&key) else {
                continue;
            };
            if self.commit.flush_must_wait(part) {
                waiting.push(key); // still dirty: a pass after the checkpoint flushes it
                continue;
            }
            part.dirty = false;
            let outcome = match self.flush_one(key, counters) {
                Ok(()) => Ok(()),
                Err(e) => {
                    let part = self.map.get_mut(&key).expect("flushed above");
                    fail_unwritten(part, &e, effects);
                    self.commit.flush_undone(key, part);
                    Err(part.log.written_sequence())
                }
            };
            self.answer_ready(key, effects);
            flushed(key, outcome);
        }
        flush_list.append(&mut waiting);
        self.flush_list = flush_list;
        if let Err((why, keys)) = self.commit.write(&mut self.map) {
            counters.fsync_failures += 1;
            self.fail_waiting(&keys, &why, effects);
        }
    }

    /// Writes one partition's buffered records to its segment and queues them in the
    /// journal.
    fn flush_one(
        &mut self,
        key: PartitionKey,
        counters: &mut BrokerCounters,
    ) -> Result<(), StorageError> {
        let part = self
            .map
            .get_mut(&key)
            .expect("the caller found the partition");
        let before = part.log.written_sequence();
        let pending = part.log.pending_bytes() as u64;
        let journal = self.commit.journal();
        part.log
            .flush_with(|first, count, bytes| journal.append(key.0, key.1, first, count, bytes))?;
        let records = part.log.written_sequence() - before;
        counters.records_appended += records;
        self.data_bytes += pending;
        part.flushed_bytes += pending;
        if records > 0 {
            self.commit.flushed(key, part, records, pending);
        }
        Ok(())
    }

    /// Cluster mode, apply of a committed BATCH part (`docs/REPLICATION.md` §4): the
    /// journal-replay path appends the records the log does not hold yet, writes them to
    /// the segment and feeds their producers to the dedup state. Returns how many were
    /// appended. Applied entries are in this node's fsynced raft journal (raft hands out
    /// only persisted committed entries), so they count as durable.
    pub(super) fn apply_part(
        &mut self,
        key: PartitionKey,
        first_sequence: u64,
        records: &[u8],
        counters: &mut BrokerCounters,
    ) -> Result<u64, StorageError> {
        let max_producers = self.max_producers;
        let Some(part) = self.map.get_mut(&key) else {
            // A pair deleted by a later entry this node applied before a restart.
            return Ok(0);
        };
        let next = part.log.next_sequence();
        let pending = part.log.pending_bytes() as u64;
        let appended = part.log.replay(first_sequence, records)?;
        let bytes = part.log.pending_bytes() as u64 - pending;
        part.log.flush()?;
        part.log.journal_durable(part.log.written_sequence());
        if appended > 0 {
            self.commit.segment_written(key, part);
        }
        let (mut pos, mut sequence) = (0, first_sequence);
        while pos < records.len() {
            let (rec, len) =
                crate::log::decode_record(&records[pos..], Some(sequence)).map_err(|e| {
                    StorageError::Corrupt {
                        path: part.log.dir().to_path_buf(),
                        position: pos as u64,
                        reason: format!("raft entry record {sequence}: {e}"),
                    }
                })?;
            if sequence >= next && rec.producer_id != 0 {
                let (id, seq) = (rec.producer_id, rec.producer_seq);
                let evicted =
                    part.producers
                        .record(id, seq, sequence, rec.timestamp_ms, max_producers);
                counters.producers_evicted += evicted as u64;
            }
            pos += len;
            sequence += 1;
        }
        counters.records_appended += appended;
        self.data_bytes += bytes;
        Ok(appended)
    }

    /// Records appended here and not yet flushed. A cluster node appends only by applying
    /// committed entries (`replica::cluster`), so it never has any.
    pub(super) fn has_unflushed(&self) -> bool {
        !self.flush_list.is_empty()
    }

    /// A partition wrote so many files since the last checkpoint took its syncs that a
    /// cluster node syncs them before applying more (`replica::compaction`).
    pub(super) fn segment_files_crowded(&self) -> bool {
        self.commit.files_crowded()
    }

    /// Cluster mode: the syncs of every segment apply wrote since the last checkpoint
    /// took them (`replica::compaction`).
    pub(super) fn take_applied_syncs(&mut self) -> Vec<SegmentSync> {
        self.commit.take_segment_syncs(&mut self.map)
    }

    /// Their outcomes, as a single node's checkpoint takes them.
    pub(super) fn applied_syncs_done(&mut self, syncs: Vec<SegmentSync>) {
        self.commit.segment_syncs_done(syncs, &mut self.map);
    }

    /// A segment sync failed: no checkpoint may claim its records until a restart.
    pub(super) fn checkpoints_blocked(&self) -> bool {
        self.commit.checkpoints_blocked()
    }

    /// Group commit: a journal sync job for what this pass wrote (unless enough run),
    /// and a checkpoint when the journal has grown enough since the last one.
    pub(super) fn take_sync_jobs(&mut self, out: &mut Vec<DurableJob>) {
        self.commit.take_sync_job(out);
        let force = std::mem::take(&mut self.commit.checkpoint_requested);
        self.commit.take_checkpoint(&mut self.map, force, out);
        self.commit.take_spare_if_due(out);
    }

    /// A journal sync job finished on a worker.
    pub(super) fn sync_done(
        &mut self,
        done: SyncDone<'_>,
        effects: &mut Vec<Effect>,
        counters: &mut BrokerCounters,
        jobs: &mut Vec<DurableJob>,
    ) {
        let synced =
            self.commit
                .sync_done((done.upto_lsn, done.undone), done.result, &mut self.map);
        for (key, why) in &synced.poisoned {
            self.fail_waiting(&[*key], &format!("syncing an undone write: {why}"), effects);
        }
        match synced.failed {
            Some(why) => {
                counters.fsync_failures += 1;
                self.fail_waiting(&synced.keys, &why, effects);
            }
            None => {
                count_sync(counters, done.records, done.elapsed);
                for key in synced.keys {
                    self.answer_ready(key, effects);
                }
            }
        }
        // Records written while the job ran get theirs now.
        self.take_sync_jobs(jobs);
    }

    /// A checkpoint job finished on a worker.
    pub(super) fn checkpoint_done(
        &mut self,
        syncs: Vec<super::jobs::SegmentSync>,
        lsn: u64,
        result: &std::io::Result<()>,
        (jobs, counters, effects): (&mut Vec<DurableJob>, &mut BrokerCounters, &mut Vec<Effect>),
    ) {
        let synced =
            self.commit
                .checkpoint_done(syncs, lsn, result, &mut self.map, (jobs, counters));
        // Records a segment sync covered that the journal had not yet.
        for key in synced {
            self.answer_ready(key, effects);
        }
    }

    /// The journal failed: the waiters of `keys` can no longer be made durable.
    fn fail_waiting(&mut self, keys: &[PartitionKey], why: &str, effects: &mut Vec<Effect>) {
        let error = std::io::Error::other(why.to_string());
        for key in keys {
            if let Some(part) = self.map.get_mut(key) {
                fail_unsynced(part, &error, self.leader_epoch, effects);
            }
        }
    }

    /// A job making the journal's spare file finished.
    pub(super) fn spare_made(&mut self, result: &std::io::Result<()>) {
        self.commit.spare_made(result);
    }

    /// Where the journal's next entry goes.
    pub(super) fn journal_written_lsn(&mut self) -> u64 {
        self.commit.journal().written_lsn() + self.commit.journal().pending_bytes() as u64
    }

    /// Takes a checkpoint at the end of this pass, however little the journal grew.
    pub(super) fn request_checkpoint(&mut self) {
        self.commit.checkpoint_requested = true;
    }

    fn answer_ready(&mut self, key: PartitionKey, effects: &mut Vec<Effect>) {
        let Some(part) = self.map.get_mut(&key) else {
            return;
        };
        part.take_ready(&mut self.ready);
        for w in self.ready.drain(..) {
            effects.push(Effect::Answer {
                conn: w.conn,
                slot: w.slot,
                response: part.pub_response(&w, self.leader_epoch),
            });
        }
    }

    /// Retention, producer expiry, the exact data size and changed producer snapshots
    /// (about once a second).
    pub(super) fn housekeeping(
        &mut self,
        now: Now,
        counters: &mut BrokerCounters,
        jobs: &mut Vec<DurableJob>,
    ) {
        self.commit.retry_checkpoint();
        let aging_now = self.aging_now(now);
        // Staged records reach their segment files within a housekeeping interval even
        // when no more come to push them out, and before the count below.
        for part in self.map.values_mut() {
            if let Err(e) = part.log.write_staged() {
                log::warn!("topic {} partition {}: {e}", part.topic_id, part.index);
            }
        }
        // `data_bytes` follows every flush; this exact count (segment headers, retention)
        // visits every partition, so it runs here and not on every pass. Records whose
        // staged write failed are left out until it succeeds.
        self.data_bytes = self.map.values().map(|p| p.log.stats().bytes).sum();
        for part in self.map.values_mut() {
            let saved = part.snapshots.saved_through();
            match part.log.enforce_retention(aging_now.wall_ms, saved) {
                Ok(report) => {
                    if report.segments_deleted > 0 {
                        log::info!(
                            "retention deleted {} segments of topic {} partition {}",
                            report.segments_deleted,
                            part.topic_id,
                            part.index
                        );
                    }
                    // Retention waits for this snapshot: written now, not at the interval
                    // (unless one failed since: then at the interval, as a retry).
                    let ask = report.waits_for_save && !part.snapshots.failed;
                    let work = ask.then(|| snapshot_job(part, aging_now));
                    jobs.extend(work.flatten().map(|work| DurableJob {
                        storage: Arc::clone(&self.storage),
                        work,
                    }));
                }
                Err(e) => log::warn!(
                    "retention on topic {} partition {}: {e}",
                    part.topic_id,
                    part.index
                ),
            }
            counters.producers_expired +=
                part.producers
                    .expire(aging_now.mono_ms, self.producer_ttl_ms) as u64;
        }
        if now.mono_ms >= self.next_producer_snapshot_ms {
            self.next_producer_snapshot_ms = now.mono_ms + producers::PRODUCER_SNAPSHOT_INTERVAL_MS;
            for part in self.map.values_mut() {
                part.snapshots.failed = false;
                let work = snapshot_job(part, aging_now);
                jobs.extend(work.map(|work| DurableJob {
                    storage: Arc::clone(&self.storage),
                    work,
                }));
            }
        }
    }

    pub(super) fn snapshot_written(&mut self, write: &SnapshotWrite, result: &io::Result<()>) {
        let key = write.key;
        let Some(part) = self.map.get_mut(&key) else {
            return;
        };
        part.snapshots.in_flight = false;
        match result {
            Ok(()) => self.snapshots_durable(std::slice::from_ref(write)),
            Err(e) => {
                // Start-up scans from the previous snapshot, and retention waits for the
                // next one, which the next interval writes.
                part.snapshots.made_covered = part.snapshots.saved_through();
                part.snapshots.failed = true;
                log::warn!(
                    "producer snapshot of topic {} partition {}: {e}",
                    key.0,
                    key.1
                );
            }
        }
    }

    /// Snapshot writes done: what the newest one written covers is saved.
    pub(super) fn snapshots_durable(&mut self, writes: &[SnapshotWrite]) {
        for w in writes.iter().filter(|w| w.written) {
            if let Some(part) = self.map.get_mut(&w.key) {
                let durable = &mut part.snapshots.durable;
                if w.number > durable.0 {
                    *durable = (w.number, w.covered);
                }
            }
        }
    }

    /// `part`'s producer snapshot as of its newest record (an INSTALL's copy).
    pub(super) fn producers_file(&self, part: &Partition, now: Now) -> Vec<u8> {
        let now = self.aging_now(now);
        let covered = part.log.next_sequence() - 1;
        part.producers.encode(covered, now.mono_ms, now.wall_ms)
    }

    /// The producer snapshots a purge of `keys` writes before it removes files, so that
    /// a restart still knows the producers of the records it removes (as this node does
    /// until then, and every node of a cluster that does not restart).
    pub(super) fn purge_snapshots(
        &mut self,
        keys: &[PartitionKey],
        now: Now,
    ) -> Vec<SnapshotWrite> {
        let now = self.aging_now(now);
        let mut writes = Vec::with_capacity(keys.len());
        for key in keys {
            writes.extend(self.map.get_mut(key).map(|part| snapshot_write(part, now)));
        }
        writes
    }

    /// At shutdown, after the worker pool stopped: writes and syncs everything still
    /// buffered on the calling thread and saves every producer snapshot.
    pub(super) fn shutdown_sync(
        &mut self,
        now: Now,
        failed: &mut Vec<String>,
        counters: &mut BrokerCounters,
    ) {
        let keys: Vec<PartitionKey> = self.map.keys().copied().collect();
        for key in keys {
            if let Err(e) = self.flush_one(key, counters) {
                failed.push(e.to_string());
            }
        }
        if let Err(e) = self.commit.shutdown(&mut self.map, counters) {
            failed.push(e);
        }
        let now = self.aging_now(now);
        for part in self.map.values_mut() {
            let covered = part.log.written_sequence();
            let bytes = part.producers.encode(covered, now.mono_ms, now.wall_ms);
            let path = part.log.dir().join(producers::PRODUCERS_FILE);
            if let Err(e) = meta::write_atomic(&*self.storage, &path, &bytes) {
                failed.push(format!("producer snapshot: {e}"));
            }
        }
    }

    pub(super) fn check_invariants(&self) {
        for part in self.map.values() {
            part.check_invariants();
            part.producers.check_len(self.max_producers);
        }
        self.commit.check_invariants();
        for key in &self.flush_list {
            assert!(self.map[key].dirty, "flush list holds a clean partition");
        }
        assert_eq!(
            self.flush_list.len(),
            self.map.values().filter(|p| p.dirty).count(),
            "every dirty partition is on the flush list once"
        );
    }
}

/// The PUB checks that need no partition state (`man/mortarmq.7`, PUB).
pub(super) fn refuse_fields(p: &Pub<'_>) -> Option<Handled> {
    if p.key.len() > MAX_KEY_LEN_BYTES {
        return Some(fail(
            ErrorCode::KeyTooLarge,
            format!("key_len {} > {MAX_KEY_LEN_BYTES}", p.key.len()),
        ));
    }
    if p.value.len() > MAX_VALUE_LEN_BYTES as usize {
        return Some(fail(
            ErrorCode::ValueTooLarge,
            format!("value_len {} > {MAX_VALUE_LEN_BYTES}", p.value.len()),
        ));
    }
    if (p.producer_id == 0) != (p.producer_seq == 0) {
        return Some(fail(
            ErrorCode::InvalidProducer,
            "producer_id and producer_seq must both be 0 or both be non-zero".into(),
        ));
    }
    None
}

/// The idempotence check (`man/mortarmq.7`, PUB): `None` lets the PUB append; a
/// duplicate is answered with its original's sequence (now, or once that reached `need`);
/// a seq out of order is refused.
fn check_producer(
    part: &mut Partition,
    p: &Pub<'_>,
    waiter: Waiter,
    leader_epoch: u64,
    counters: &mut BrokerCounters,
) -> Option<Handled> {
    if p.producer_id == 0 {
        counters.pubs_non_idempotent += 1;
        return None;
    }
    match part.producers.check(p.producer_id, p.producer_seq) {
        Idempotence::Fresh => None,
        Idempotence::Duplicate { sequence } => {
            counters.pubs_deduplicated += 1;
            let waiter = Waiter {
                sequence,
                deduplicated: true,
                ..waiter
            };
            Some(answer_or_wait(part, waiter, leader_epoch))
        }
        Idempotence::OutOfOrder { expected, too_old } => {
            let why = if too_old {
                "older than the dedup window"
            } else {
                "skips ahead"
            };
            Some(fail(
                ErrorCode::SequenceOutOfOrder,
                format!("producer_seq {} {why}; expected {expected}", p.producer_seq),
            ))
        }
    }
}

/// The storage caps: `--max-data-size` for the whole data directory, and
/// [`UNSYNCED_BYTES_MAX`] per partition (a producer faster than the disk).
fn refuse_capacity(
    part: &Partition,
    data_bytes_after: u64,
    max_data_bytes: u64,
) -> Option<Handled> {
    if max_data_bytes > 0 && data_bytes_after > max_data_bytes {
        return Some(fail(
            ErrorCode::StorageFull,
            format!("data directory cap of {max_data_bytes} bytes reached"),
        ));
    }
    if part.unsynced_bytes() > UNSYNCED_BYTES_MAX {
        return Some(fail(
            ErrorCode::Backpressure,
            "the disk is behind: too many unsynced bytes".into(),
        ));
    }
    None
}

/// A duplicate PUB: answered now if its original already reached `need`, else it waits.
fn answer_or_wait(part: &mut Partition, waiter: Waiter, leader_epoch: u64) -> Handled {
    if part.reached(waiter.sequence, waiter.need) {
        return Handled::Answer(part.pub_response(&waiter, leader_epoch));
    }
    part.waiters.push(waiter);
    Handled::Wait
}

/// A flush failed: the records since the last flush were never written; their PUBs fail
/// and their producers forget them.
fn fail_unwritten(part: &mut Partition, e: &StorageError, effects: &mut Vec<Effect>) {
    log::error!(
        "append to topic {} partition {} failed: {e}",
        part.topic_id,
        part.index
    );
    let written = part.log.written_sequence();
    part.producers.roll_back_above(written);
    let code = storage_code(e);
    let message = e.to_string();
    part.waiters.retain(|w| {
        if w.sequence <= written {
            return true;
        }
        effects.push(Effect::Answer {
            conn: w.conn,
            slot: w.slot,
            response: Response::err(code, Op::Pub as u8, message.clone()),
        });
        false
    });
}

/// A sync failed. Sticky: what was not synced is never acknowledged, and the partition
/// refuses writes until a restart re-verifies it.
fn fail_unsynced(
    part: &mut Partition,
    e: &std::io::Error,
    leader_epoch: u64,
    effects: &mut Vec<Effect>,
) {
    log::error!(
        "fdatasync of topic {} partition {} failed: {e}; partition is poisoned",
        part.topic_id,
        part.index
    );
    part.log.sync_failed(e);
    for w in std::mem::take(&mut part.waiters) {
        let response = if part.reached(w.sequence, w.need) {
            part.pub_response(&w, leader_epoch)
        } else {
            Response::err(
                ErrorCode::InternalError,
                Op::Pub as u8,
                format!("fdatasync failed: {e}"),
            )
        };
        effects.push(Effect::Answer {
            conn: w.conn,
            slot: w.slot,
            response,
        });
    }
}

fn count_sync(counters: &mut BrokerCounters, records: u64, elapsed: std::time::Duration) {
    let micros = elapsed.as_micros() as u64;
    counters.fsyncs += 1;
    counters.fsync_records += records;
    counters.fsync_micros_total += micros;
    counters.fsync_micros_max = counters.fsync_micros_max.max(micros);
    counters.fsync_latency[bucket_of(&FSYNC_LATENCY_BUCKETS_US, micros)] += 1;
    counters.fsync_batch[bucket_of(&FSYNC_BATCH_BUCKETS, records)] += 1;
}

/// A write of a partition's producer snapshot, when it changed and none is in flight.
fn snapshot_job(part: &mut Partition, now: Now) -> Option<Work> {
    let covered = part.log.next_sequence() - 1;
    if part.snapshots.in_flight || covered == part.snapshots.made_covered {
        return None;
    }
    part.snapshots.in_flight = true;
    let write = snapshot_write(part, now);
    Some(Work::WriteProducerSnapshot { write })
}

/// The partition's producer state now, as a snapshot write.
fn snapshot_write(part: &mut Partition, now: Now) -> SnapshotWrite {
    let covered = part.log.next_sequence() - 1;
    let snapshots = &mut part.snapshots;
    snapshots.made_covered = covered;
    snapshots.made += 1;
    SnapshotWrite {
        key: (part.topic_id, part.index),
        path: part.log.dir().join(producers::PRODUCERS_FILE),
        bytes: part.producers.encode(covered, now.mono_ms, now.wall_ms),
        covered,
        number: snapshots.made,
        on_disk: Arc::clone(&snapshots.on_disk),
        written: false,
    }
}
