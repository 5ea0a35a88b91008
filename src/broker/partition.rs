//! One partition as the publish path sees it: its log, its producers, the PUBs waiting for
//! the durability they asked for, and its share of the journal's group commit.

use std::sync::{Arc, Mutex};

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

/// A partition's producer snapshot file: the writes made of it and which is on disk.
#[derive(Debug, Default)]
pub struct ProducerSnapshots {
    /// The last sequence the newest write made covers: the periodic one skips a state
    /// already written.
    pub made_covered: u64,
    /// A periodic write is in flight (one at a time).
    pub in_flight: bool,
    /// A write failed since the last interval: retention does not ask again before it.
    pub failed: bool,
    /// Writes made so far, each numbered in turn: a later one holds the newer state,
    /// whatever it covers (a failed write's undo moves the log back).
    pub made: u64,
    /// (number, covered) of the newest write known on disk: retention deletes no
    /// segment holding a record past it, so a restart still knows the producers of the
    /// records it removes.
    pub durable: (u64, u64),
    /// The number of the write on disk as the fsync workers see it, held while one
    /// writes (`jobs::SnapshotWrite`): an older write never replaces a newer one. The
    /// reactor never takes it.
    pub on_disk: Arc<Mutex<u64>>,
}

impl ProducerSnapshots {
    /// After a start-up rebuild: the snapshot found covers `covered` (write number 0).
    pub fn rebuilt(covered: u64) -> ProducerSnapshots {
        ProducerSnapshots {
            made_covered: covered,
            durable: (0, covered),
            ..ProducerSnapshots::default()
        }
    }

    /// The last sequence the snapshot on disk is known to cover.
    pub fn saved_through(&self) -> u64 {
        self.durable.1
    }
}

pub struct Partition {
    pub topic_id: u16,
    pub index: u16,
    pub log: PartitionLog,
    pub producers: Producers,
    pub waiters: Vec<Waiter>,
    pub snapshots: ProducerSnapshots,
    /// Bytes flushed to the segment since start, and of those made durable by the
    /// journal; the difference is what BACKPRESSURE watches.
    pub flushed_bytes: u64,
    pub synced_bytes: u64,
    /// Queued in the broker's flush list this pass.
    pub dirty: bool,
    /// Written since the last checkpoint took its segment syncs.
    pub segment_dirty: bool,
}

impl Partition {
    pub fn new(topic_id: u16, index: u16, log: PartitionLog) -> Partition {
        Partition {
            topic_id,
            index,
            log,
            producers: Producers::default(),
            waiters: Vec::new(),
            snapshots: ProducerSnapshots::default(),
            flushed_bytes: 0,
            synced_bytes: 0,
            dirty: false,
            segment_dirty: false,
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
            Durability::Fsynced => self.log.durable_sequence(),
            Durability::Replicated => 0,
        }
    }

    /// The level a record at `sequence` has reached now (for the PUB result).
    pub fn level_of(&self, sequence: u64) -> Durability {
        if sequence <= self.log.durable_sequence() {
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
            commit_seq: self.log.durable_sequence(),
            result_flags: if w.deduplicated {
                PubResultFlags::DEDUPLICATED
            } else {
                PubResultFlags::empty()
            },
        })
    }

    /// The bookkeeping agrees with the log: nothing durable beyond what was written, and
    /// no waiter left whose level was already reached (it would never be answered).
    pub fn check_invariants(&self) {
        self.log.check_invariants();
        let (written, durable) = (self.log.written_sequence(), self.log.durable_sequence());
        assert!(durable <= written, "durable {durable} > written {written}");
        assert!(written < self.log.next_sequence());
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
