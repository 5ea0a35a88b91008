//! Group commit through the node-wide journal (`log/journal.rs`): what each journal sync
//! makes durable, and the checkpoints that let old journal files go.
//!
//! Every pass, the records each partition flushed are queued in the journal as one entry,
//! and the journal is written with one write. A journal sync job covers everything
//! written before it was taken, for every partition at once, so the number of
//! fdatasyncs per pass does not grow with the number of partitions written (it did when
//! each partition synced its own segment: 1 partition 174k msgs/s, 64 partitions 9k, see
//! `docs/BENCHMARKS.md`). Segments are synced by checkpoints, once per
//! `checkpoint_bytes` of journal, in one job.
//!
//! Depends on the log (journal, partition logs) and the broker's partitions and jobs.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::Arc;

use crate::log::journal::{Journal, JournalReport};
use crate::log::{Storage, StorageError};

use super::counters::BrokerCounters;
use super::idhash::IdMap;
use super::jobs::{DurableJob, SegmentSync, SpareJobs, Work};
use super::partition::Partition;
use super::PartitionKey;

/// Journal fdatasyncs running at once. Two, so that records arriving while one runs
/// start their own at once instead of waiting for it; a sync covers everything written
/// before it started, so completions may come in any order.
pub const JOURNAL_SYNCS_IN_FLIGHT_MAX: usize = 2;

/// Files one partition may write after a checkpoint took its syncs before its flushes
/// wait for a checkpoint. A closed segment keeps its two descriptors until a checkpoint
/// syncs it (a descriptor opened later need not report a write-back error that happened
/// before it was opened), so with a small `--segment-size` a partition written faster
/// than its segments could be synced ran the broker out of descriptors: 4 KiB segments
/// and 3,900-byte records hit EMFILE at a 1,024 limit after 535 records, then refused
/// every PUB. 64 files are 32 segments; with the default sizes a checkpoint (every
/// `--journal-file-size`) comes long before.
pub const UNSYNCED_FILES_PER_PARTITION_MAX: usize = 64;

/// `part` wrote [`UNSYNCED_FILES_PER_PARTITION_MAX`] files since a checkpoint took its
/// syncs.
fn crowded(part: &Partition) -> bool {
    part.log.unsynced_file_count() >= UNSYNCED_FILES_PER_PARTITION_MAX
}

/// How far one partition got in a journal write: once the journal is synced past it,
/// its records up to `sequence` are durable.
#[derive(Debug, Clone, Copy)]
struct Cover {
    key: PartitionKey,
    sequence: u64,
    flushed_bytes: u64,
}

/// The journal and what its syncs and checkpoints cover.
pub struct GroupCommit {
    storage: Arc<dyn Storage>,
    journal: Journal,
    /// Partitions flushed since the last sync job was taken, and their records and bytes.
    pending: Vec<Cover>,
    pending_records: u64,
    pending_bytes: u64,
    /// Each sync job in flight, oldest first: its LSN and what it covers.
    in_flight: VecDeque<(u64, Vec<Cover>)>,
    /// Partitions written since the last checkpoint took its segment syncs.
    segments_dirty: Vec<PartitionKey>,
    /// One of them wrote [`UNSYNCED_FILES_PER_PARTITION_MAX`] files since (a cluster
    /// node syncs them early, `replica::compaction`).
    files_crowded: bool,
    checkpoint_in_flight: bool,
    /// A checkpoint failed since the last housekeeping: the next waits for it (about a
    /// second, `Broker::housekeeping`), so a full or failing disk is not tried again on
    /// every pass that the failure's own completion starts.
    checkpoint_failed: bool,
    /// A checkpoint is taken once the journal is this far past the last one.
    checkpoint_bytes: u64,
    /// Segments cut back after a failed write, synced by the next journal sync job.
    undone: Vec<SegmentSync>,
    spares: SpareJobs,
    /// Checkpoints completed since start.
    pub checkpoints_done: u64,
    /// Take a checkpoint at the end of the pass whatever the journal's growth (a topic
    /// was deleted: its pair is reused only once a checkpoint passed its records).
    pub checkpoint_requested: bool,
    /// A segment fdatasync failed: that partition's records are durable only in the
    /// journal now, so no checkpoint may pass them until a restart replays them.
    checkpoints_blocked: bool,
}

/// What a finished journal sync made durable.
pub struct Synced {
    pub keys: Vec<PartitionKey>,
    /// The sync failed: every partition that was waiting on the journal.
    pub failed: Option<String>,
    /// Partitions whose undone write could not be synced: they refuse writes now.
    pub poisoned: Vec<(PartitionKey, String)>,
}

impl GroupCommit {
    pub fn new(storage: &Arc<dyn Storage>, journal: Journal, checkpoint_bytes: u64) -> Self {
        GroupCommit {
            storage: Arc::clone(storage),
            journal,
            pending: Vec::new(),
            pending_records: 0,
            pending_bytes: 0,
            in_flight: VecDeque::new(),
            segments_dirty: Vec::new(),
            files_crowded: false,
            checkpoint_in_flight: false,
            checkpoint_failed: false,
            checkpoint_bytes,
            undone: Vec::new(),
            spares: SpareJobs::default(),
            checkpoints_done: 0,
            checkpoint_requested: false,
            checkpoints_blocked: false,
        }
    }

    /// Start-up: replays the journal into the partitions that lost records, flushes
    /// them, then makes every segment durable and checkpoints at the journal's end, so
    /// that no later start replays these entries again (a topic pair may be reused).
    pub fn recover(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
        counters: &mut BrokerCounters,
    ) -> Result<JournalReport, StorageError> {
        let mut replay = |entry: &crate::log::journal::Entry<'_>| {
            let Some(part) = map.get_mut(&(entry.topic_id, entry.partition)) else {
                return; // a deleted topic's
            };
            match part.log.replay(entry.first_sequence, entry.records) {
                Ok(n) => counters.journal_records_replayed += n,
                Err(e) => {
                    log::error!(
                        "journal replay into topic {} partition {}: {e}",
                        entry.topic_id,
                        entry.partition
                    );
                    counters.journal_replay_gaps += 1;
                }
            }
        };
        let report = self.journal.recover(&mut replay)?;
        for part in map.values_mut() {
            part.log.flush()?;
            if let Some(job) = part.log.take_sync_job() {
                job.run()
                    .map_err(|e| StorageError::from_io(part.log.dir(), None, e))?;
                part.log.sync_done(job.upto_sequence);
            }
        }
        let write = self.journal.checkpoint_job(self.journal.written_lsn());
        write
            .run()
            .map_err(|e| StorageError::from_io(self.journal.dir(), None, e))?;
        for path in self.journal.checkpoint_done(write.lsn) {
            self.storage
                .remove_file(&path)
                .map_err(|e| StorageError::from_io(&path, None, e))?;
        }
        Ok(report)
    }

    pub fn journal(&mut self) -> &mut Journal {
        &mut self.journal
    }

    pub fn poisoned(&self) -> Option<&str> {
        self.journal.poisoned()
    }

    /// `part` flushed `records` records (`bytes` bytes) into its segment and the journal
    /// queue this pass.
    pub fn flushed(&mut self, key: PartitionKey, part: &mut Partition, records: u64, bytes: u64) {
        self.pending.push(Cover {
            key,
            sequence: part.log.written_sequence(),
            flushed_bytes: part.flushed_bytes,
        });
        self.pending_records += records;
        self.pending_bytes += bytes;
        self.segment_written(key, part);
    }

    /// `part`'s segment holds data the next checkpoint must sync.
    pub fn segment_written(&mut self, key: PartitionKey, part: &mut Partition) {
        if !part.segment_dirty {
            part.segment_dirty = true;
            self.segments_dirty.push(key);
        }
        self.files_crowded |= crowded(part);
    }

    /// A partition wrote [`UNSYNCED_FILES_PER_PARTITION_MAX`] files since the last
    /// checkpoint took its syncs (and checkpoints are not blocked: none would take them).
    pub fn files_crowded(&self) -> bool {
        self.files_crowded && !self.checkpoints_blocked
    }

    /// Whether `part` must not be flushed this pass: it wrote
    /// [`UNSYNCED_FILES_PER_PARTITION_MAX`] files since a checkpoint took its syncs, so
    /// one is asked for, and the flush waits while another runs. Never while checkpoints
    /// are blocked: none would end the wait.
    pub fn flush_must_wait(&mut self, part: &Partition) -> bool {
        if !crowded(part) || self.checkpoints_blocked {
            return false;
        }
        self.checkpoint_requested = true;
        self.checkpoint_in_flight
    }

    /// Writes the staged records of every partition written since the last checkpoint
    /// took its syncs (every staged one is among them) to their segments.
    pub fn write_staged(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Result<(), StorageError> {
        for key in &self.segments_dirty {
            if let Some(part) = map.get_mut(key) {
                part.log.write_staged()?;
            }
        }
        Ok(())
    }

    /// The syncs of every segment written since the last checkpoint took them.
    pub fn take_segment_syncs(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Vec<SegmentSync> {
        let mut syncs = Vec::new();
        self.files_crowded = false;
        for key in self.segments_dirty.drain(..) {
            let Some(part) = map.get_mut(&key) else {
                continue;
            };
            part.segment_dirty = false;
            if let Some(sync) = part.log.take_sync_job() {
                syncs.push(SegmentSync {
                    key,
                    sync,
                    result: None,
                });
            }
        }
        syncs
    }

    /// Each segment sync's outcome goes to its partition: a failure poisons it, as any
    /// failed fdatasync does, and blocks checkpoints until a restart (the journal alone
    /// holds those records durably); one not run is taken again by the next
    /// checkpoint. Returns the partitions synced.
    pub fn segment_syncs_done(
        &mut self,
        syncs: Vec<SegmentSync>,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Vec<PartitionKey> {
        let mut synced = Vec::new();
        for s in syncs {
            let Some(part) = map.get_mut(&s.key) else {
                continue;
            };
            match s.result {
                Some(Ok(())) => {
                    part.log.sync_done(s.sync.upto_sequence);
                    synced.push(s.key);
                }
                Some(Err(e)) => {
                    part.log.sync_failed(&e);
                    log::error!(
                        "no journal checkpoint until a restart: topic {} partition {} holds \
                         records only the journal has made durable",
                        s.key.0,
                        s.key.1
                    );
                    self.checkpoints_blocked = true;
                }
                None => {
                    part.log.sync_not_run(s.sync);
                    self.segment_written(s.key, part);
                }
            }
        }
        synced
    }

    pub fn checkpoints_blocked(&self) -> bool {
        self.checkpoints_blocked
    }

    /// `part`'s flush failed and was undone (its files cut back): the next journal sync
    /// also syncs them, before anything that job covers is acknowledged.
    pub fn flush_undone(&mut self, key: PartitionKey, part: &mut Partition) {
        if let Some(sync) = part.log.undo_sync() {
            self.undone.push(SegmentSync {
                key,
                sync,
                result: None,
            });
        }
    }

    /// Writes this pass's journal entries. On failure returns the partitions whose
    /// waiters can no longer be made durable (the journal refuses writes from now on).
    pub fn write(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Result<(), (String, Vec<PartitionKey>)> {
        self.journal.write().map_err(|e| {
            // The staged records were answered WRITTEN on the journal's word: their
            // segments take them now.
            if let Err(e) = self.write_staged(map) {
                log::error!("after a failed journal write: {e}");
            }
            (e.to_string(), self.abandon())
        })
    }

    /// Every partition waiting on the journal, forgetting what it waited for.
    fn abandon(&mut self) -> Vec<PartitionKey> {
        let mut keys: Vec<PartitionKey> = self.pending.drain(..).map(|c| c.key).collect();
        for (_, covers) in self.in_flight.drain(..) {
            keys.extend(covers.iter().map(|c| c.key));
        }
        keys.sort_unstable();
        keys.dedup();
        keys
    }

    /// A journal sync job for what was written since the previous one, unless
    /// [`JOURNAL_SYNCS_IN_FLIGHT_MAX`] already run.
    pub fn take_sync_job(&mut self, out: &mut Vec<DurableJob>) {
        if self.journal.syncs_in_flight() >= JOURNAL_SYNCS_IN_FLIGHT_MAX {
            return;
        }
        let Some(sync) = self.journal.take_sync_job() else {
            return;
        };
        self.in_flight
            .push_back((sync.upto_lsn, std::mem::take(&mut self.pending)));
        out.push(DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::SyncJournal {
                sync,
                undone: std::mem::take(&mut self.undone),
                records: std::mem::take(&mut self.pending_records),
                bytes: std::mem::take(&mut self.pending_bytes),
            },
        });
    }

    /// A journal sync job finished: marks what became durable in each partition it
    /// covered (and in those of earlier jobs, once they have all finished).
    pub fn sync_done(
        &mut self,
        (upto_lsn, undone): (u64, Vec<SegmentSync>),
        result: &std::io::Result<()>,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Synced {
        let poisoned = self.undone_synced(undone, map);
        if let Err(e) = result {
            self.journal.sync_failed(e);
            return Synced {
                keys: self.abandon(),
                failed: Some(format!("journal fdatasync failed: {e}")),
                poisoned,
            };
        }
        let synced = self.journal.sync_done(upto_lsn);
        let mut keys = Vec::new();
        while self
            .in_flight
            .front()
            .is_some_and(|(lsn, _)| *lsn <= synced)
        {
            let (_, covers) = self.in_flight.pop_front().expect("checked");
            for c in covers {
                if let Some(part) = map.get_mut(&c.key) {
                    part.log.journal_durable(c.sequence);
                    part.synced_bytes = part.synced_bytes.max(c.flushed_bytes);
                    keys.push(c.key);
                }
            }
        }
        Synced {
            keys,
            failed: None,
            poisoned,
        }
    }

    /// The outcome of the undone segments' syncs: the partitions whose sync failed.
    fn undone_synced(
        &mut self,
        undone: Vec<SegmentSync>,
        map: &mut IdMap<PartitionKey, Partition>,
    ) -> Vec<(PartitionKey, String)> {
        let mut failed = Vec::new();
        for s in undone {
            let Some(part) = map.get_mut(&s.key) else {
                continue;
            };
            if let Some(Err(e)) = s.result {
                // Its later records must not be acknowledged: the undone ones may come
                // back at their sequences. Capped before this job's coverage counts
                // (they were acknowledged when this only poisoned the partition after).
                // The journal keeps what it has.
                part.log.undo_not_durable(s.sync.upto_sequence, &e);
                self.checkpoints_blocked = true;
                failed.push((s.key, e.to_string()));
            }
        }
        failed
    }

    /// The job that makes the journal's next file ahead of need, when there is none and
    /// none is being made: from `recycle` when given, else by filling one with zeros (only
    /// before the first checkpoint let a file go).
    pub fn take_spare_job(&mut self, recycle: Option<PathBuf>, out: &mut Vec<DurableJob>) {
        let journal = &self.journal;
        let spare_job = |recycle| journal.spare_job(recycle);
        self.spares.take(&self.storage, recycle, spare_job, out);
    }

    /// A spare job finished.
    pub fn spare_made(&mut self, result: &std::io::Result<()>) {
        self.spares.done();
        self.journal.spare_made(result);
    }

    /// Once per pass: a spare when one is due (`Journal::spare_due`) and none is ready.
    pub fn take_spare_if_due(&mut self, out: &mut Vec<DurableJob>) {
        if self.journal.spare_due() && self.journal.poisoned().is_none() {
            self.take_spare_job(None, out);
        }
    }

    /// A checkpoint once the journal has grown `checkpoint_bytes` past the last one (or
    /// when `force`d), unless one is running: every segment written since the last one
    /// is synced, then the checkpoint is written at the journal's end.
    pub fn take_checkpoint(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
        force: bool,
        out: &mut Vec<DurableJob>,
    ) {
        let grown = self.journal.written_lsn() - self.journal.checkpoint_lsn();
        let small = grown == 0 || (grown < self.checkpoint_bytes && !force);
        let held = self.checkpoint_failed && !force;
        if self.checkpoint_in_flight || self.checkpoints_blocked || small || held {
            return;
        }
        // A poisoned partition takes no segment sync, so a checkpoint would pass records
        // of it that only the journal holds durably (a failed journal write poisons every
        // partition that waited on it): none until a restart replays them.
        let poisoned = |key: &PartitionKey| map.get(key).is_some_and(|p| p.log.is_poisoned());
        if self.journal.poisoned().is_some() || self.segments_dirty.iter().any(poisoned) {
            self.checkpoints_blocked = true;
            return;
        }
        // The checkpoint lets go of journal files whose records only their partitions'
        // segments hold then.
        if let Err(e) = self.write_staged(map) {
            log::warn!("checkpoint waits for a segment write: {e}");
            self.checkpoint_failed = true;
            return;
        }
        let syncs = self.take_segment_syncs(map);
        self.checkpoint_in_flight = true;
        let write = self.journal.checkpoint_job(self.journal.written_lsn());
        out.push(DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::Checkpoint { syncs, write },
        });
    }

    /// A checkpoint job finished: each segment sync's outcome goes to its partition
    /// (a failure poisons it, as any failed fdatasync does); when the checkpoint was
    /// written, the journal files below it are removed off the reactor.
    pub fn checkpoint_done(
        &mut self,
        syncs: Vec<SegmentSync>,
        lsn: u64,
        result: &std::io::Result<()>,
        map: &mut IdMap<PartitionKey, Partition>,
        (out, counters): (&mut Vec<DurableJob>, &mut BrokerCounters),
    ) -> Vec<PartitionKey> {
        self.checkpoint_in_flight = false;
        let synced = self.segment_syncs_done(syncs, map);
        match result {
            Ok(()) => {
                self.checkpoints_done += 1;
                counters.checkpoints += 1;
                let mut paths = self.journal.checkpoint_done(lsn);
                if !self.spares.in_flight() {
                    if let Some(recycle) = paths.pop() {
                        self.take_spare_job(Some(recycle), out);
                    }
                }
                if !paths.is_empty() {
                    out.push(DurableJob {
                        storage: Arc::clone(&self.storage),
                        work: Work::RemoveFiles { paths },
                    });
                }
            }
            Err(e) => {
                self.checkpoint_failed = true;
                log::error!("checkpoint at journal lsn {lsn} failed: {e}");
            }
        }
        synced
    }

    /// Housekeeping: a checkpoint that failed may be tried again.
    pub fn retry_checkpoint(&mut self) {
        self.checkpoint_failed = false;
    }

    /// At shutdown, after the worker pool stopped: writes and syncs the journal, then
    /// checkpoints on the calling thread.
    pub fn shutdown(
        &mut self,
        map: &mut IdMap<PartitionKey, Partition>,
        counters: &mut BrokerCounters,
    ) -> Result<(), String> {
        self.journal.write().map_err(|e| e.to_string())?;
        if let Some(sync) = self.journal.take_sync_job() {
            sync.run().map_err(|e| format!("journal fdatasync: {e}"))?;
            self.journal.sync_done(sync.upto_lsn);
        }
        let mut out = Vec::new();
        self.take_checkpoint(map, true, &mut out);
        for mut job in out {
            use crate::fsync::Job;
            let result = job.run();
            if let Work::Checkpoint { syncs, write } = job.work {
                let failed = result.as_ref().err().map(|e| e.to_string());
                let mut removals = Vec::new();
                self.checkpoint_done(syncs, write.lsn, &result, map, (&mut removals, counters));
                for mut removal in removals {
                    let _ = removal.run();
                }
                if let Some(e) = failed {
                    return Err(format!("checkpoint: {e}"));
                }
            }
        }
        Ok(())
    }

    pub fn check_invariants(&self) {
        self.journal.check_invariants();
        assert!(self.journal.syncs_in_flight() <= JOURNAL_SYNCS_IN_FLIGHT_MAX);
        if self.journal.poisoned().is_none() && !cfg!(feature = "sim-bug-early-ack") {
            assert_eq!(self.in_flight.len(), self.journal.syncs_in_flight());
        }
        let mut last = 0;
        for (lsn, _) in &self.in_flight {
            assert!(*lsn > last, "covers in LSN order");
            last = *lsn;
        }
    }
}
