//! Where a record's outcome waits for its [`SendHandle`](super::SendHandle): written
//! once by the producer, read by whoever holds the handle, on any thread. A receipt is
//! kept in atomics, so that settling and reading one (once per record) takes no lock;
//! an error, the rare case, under a lock.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::wire::Durability;

use super::super::error::{Error, Result};
use super::Receipt;

const SLOT_PENDING: u8 = 0;
const SLOT_STORED: u8 = 1;
const SLOT_FAILED: u8 = 2;

#[derive(Debug, Default)]
pub(super) struct Slot {
    outcome: AtomicU8,
    sequence: AtomicU64,
    leader_epoch: AtomicU64,
    commit_seq: AtomicU64,
    /// partition (bits 0–15), durability code (16–23), deduplicated (24).
    packed: AtomicU32,
    error: Mutex<Option<Error>>,
}

impl Slot {
    pub fn is_done(&self) -> bool {
        self.outcome.load(Ordering::Acquire) != SLOT_PENDING
    }

    pub fn get(&self) -> Option<Result<Receipt>> {
        match self.outcome.load(Ordering::Acquire) {
            SLOT_STORED => Some(Ok(self.receipt())),
            SLOT_FAILED => {
                let e = self.error.lock().unwrap_or_else(|e| e.into_inner());
                Some(Err(e.clone().expect("a failed slot holds its error")))
            }
            _ => None,
        }
    }

    fn receipt(&self) -> Receipt {
        let packed = self.packed.load(Ordering::Relaxed);
        Receipt {
            partition: packed as u16,
            sequence: self.sequence.load(Ordering::Relaxed),
            durability: Durability::from_code((packed >> 16) as u8)
                .expect("stored from a Durability"),
            leader_epoch: self.leader_epoch.load(Ordering::Relaxed),
            commit_seq: self.commit_seq.load(Ordering::Relaxed),
            deduplicated: packed >> 24 != 0,
        }
    }

    /// Settles the slot; the Release store publishes every field written before it.
    pub fn set(&self, outcome: Result<Receipt>) {
        match outcome {
            Ok(r) => {
                self.sequence.store(r.sequence, Ordering::Relaxed);
                self.leader_epoch.store(r.leader_epoch, Ordering::Relaxed);
                self.commit_seq.store(r.commit_seq, Ordering::Relaxed);
                let packed = u32::from(r.partition)
                    | u32::from(r.durability.as_code()) << 16
                    | u32::from(r.deduplicated) << 24;
                self.packed.store(packed, Ordering::Relaxed);
                self.outcome.store(SLOT_STORED, Ordering::Release);
            }
            Err(e) => {
                *self.error.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                self.outcome.store(SLOT_FAILED, Ordering::Release);
            }
        }
    }

    /// Empties a slot nobody else holds, for the next record.
    pub fn reset(&mut self) {
        *self.outcome.get_mut() = SLOT_PENDING;
        *self.error.get_mut().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_receipt_or_an_error_comes_back_as_stored() {
        let mut slot = Slot::default();
        assert!(!slot.is_done() && slot.get().is_none());
        let r = Receipt {
            partition: 65535,
            sequence: u64::MAX,
            durability: Durability::Fsynced,
            leader_epoch: 7,
            commit_seq: 9,
            deduplicated: true,
        };
        slot.set(Ok(r));
        assert_eq!(slot.get().unwrap().unwrap(), r);
        slot.reset();
        assert!(slot.get().is_none());
        slot.set(Err(Error::Timeout("t".into())));
        assert!(matches!(slot.get(), Some(Err(Error::Timeout(_)))));
    }
}
