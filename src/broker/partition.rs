//! One partition as the publish path sees it: its log, its producers, the PUBs waiting for
//! the durability they asked for, and its group-commit bookkeeping.

use crate::log::PartitionLog;
use crate::wire::ops::PubResult;
use crate::wire::{Durability, PubResultFlags, Response};

use super::producers::Producers;
use super::ConnRef;

/// A PUB whose answer waits for its record (or, for a duplicate, the original's).
#[derive(Debug, Clone, Copy)]
pub struct Waiter {
    pub conn: ConnRef,
    pub slot: u64,
    pub sequence: u64,
    pub need: Durability,
    pub deduplicated: bool,
}

pub struct Partition {
    pub topic_id: u16,
    pub index: u16,
    pub log: PartitionLog,
    pub producers: Producers,
    pub waiters: Vec<Waiter>,
    /// fdatasync jobs running now (at most SYNCS_IN_FLIGHT_PER_PARTITION_MAX).
    pub syncs_in_flight: u8,
    /// The `upto_sequence` of the latest sync job started.
    pub sync_taken_sequence: u64,
    /// Last sequence the producer snapshot on disk covers; one write at a time.
    pub producers_snapshot_covered: u64,
    pub producers_snapshot_in_flight: bool,
    /// Bytes flushed to the segment since start, and of those covered by a completed
    /// sync; the difference is what BACKPRESSURE watches.
    pub flushed_bytes: u64,
    pub synced_bytes: u64,
    /// Queued in the broker's flush list this pass.
    pub dirty: bool,
}

impl Partition {
    pub fn new(topic_id: u16, index: u16, log: PartitionLog) -> Partition {
        Partition {
            sync_taken_sequence: log.synced_sequence(),
            topic_id,
            index,
            log,
            producers: Producers::default(),
            waiters: Vec::new(),
            syncs_in_flight: 0,
            producers_snapshot_covered: 0,
            producers_snapshot_in_flight: false,
            flushed_bytes: 0,
            synced_bytes: 0,
            dirty: false,
        }
    }

    pub fn unsynced_bytes(&self) -> u64 {
        self.flushed_bytes - self.synced_bytes
    }

    /// Whether a record at `sequence` has reached `need`.
    pub fn reached(&self, sequence: u64, need: Durability) -> bool {
        sequence <= self.reached_sequence(need)
    }

    /// The highest sequence that has reached `level` (a single node never replicates).
    fn reached_sequence(&self, level: Durability) -> u64 {
        match level {
            Durability::Written => self.log.written_sequence(),
            Durability::Fsynced => self.log.synced_sequence(),
            Durability::Replicated => 0,
        }
    }

    /// The level a record at `sequence` has reached now (for the PUB result).
    pub fn level_of(&self, sequence: u64) -> Durability {
        if sequence <= self.log.synced_sequence() {
            Durability::Fsynced
        } else {
            Durability::Written
        }
    }

    /// Removes and returns the waiters whose records reached what they asked for.
    pub fn take_ready(&mut self, out: &mut Vec<Waiter>) {
        let reached = [Durability::Written, Durability::Fsynced].map(|l| self.reached_sequence(l));
        self.waiters.retain(|w| {
            let ready = match w.need {
                Durability::Written => w.sequence <= reached[0],
                Durability::Fsynced => w.sequence <= reached[1],
                Durability::Replicated => false,
            };
            if ready {
                out.push(*w);
            }
            !ready
        });
    }

    /// The OK of a PUB whose record reached (at least) what it asked for.
    pub fn pub_response(&self, w: &Waiter, leader_epoch: u64) -> Response {
        Response::Pub(PubResult {
            sequence: w.sequence,
            durability: self.level_of(w.sequence).as_code(),
            leader_epoch,
            commit_seq: self.log.synced_sequence(),
            result_flags: if w.deduplicated {
                PubResultFlags::DEDUPLICATED
            } else {
                PubResultFlags::empty()
            },
        })
    }

    /// The bookkeeping agrees with the log: nothing synced beyond what was written, sync
    /// jobs within their cap, and no waiter left whose level was already reached (it
    /// would never be answered).
    pub fn check_invariants(&self, syncs_in_flight_max: u8) {
        self.log.check_invariants();
        let (written, synced) = (self.log.written_sequence(), self.log.synced_sequence());
        assert!(synced <= written, "synced {synced} > written {written}");
        assert!(written < self.log.next_sequence());
        assert!(self.sync_taken_sequence <= written);
        assert!(self.syncs_in_flight <= syncs_in_flight_max);
        assert!(self.synced_bytes <= self.flushed_bytes);
        for w in &self.waiters {
            assert!(
                !self.reached(w.sequence, w.need),
                "waiter for {} at {:?} was never answered",
                w.sequence,
                w.need
            );
        }
    }
}
