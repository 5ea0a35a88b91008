//! How a dead letter is stored in its `.dlq` twin, and how start-up finds the dead
//! letters a group already wrote.
//!
//! A dead letter is a twin record with the log record flag [`RECORD_FLAG_ORIGIN`], its
//! stored value laid out as
//!
//! ```text
//! original value | origin trailer (15 bytes, man/mortarmq.7) | group name | group_len:u8
//! ```
//!
//! so a MSG from the twin carries the original value and the trailer (the group name is
//! the broker's own bookkeeping and never sent). Start-up reads the group name and the
//! origin back to settle, not resend, what each group already dead-lettered: at most
//! once per group, even across a crash and even before the group's first position was
//! persisted. The record's producer_id is a hash of the group name with the top bit set
//! and its producer_seq the origin sequence, for tools reading the twin.

use crate::log::{PartitionLog, RecordView, StorageError};
use crate::wire::ops::Origin;

/// Log record flag bit0: the value ends with an origin trailer (a dead letter).
pub const RECORD_FLAG_ORIGIN: u16 = 0x0001;
/// Top bit of a dead letter's producer_id; PUBs from clients may use any id, but the
/// twin is written only by the broker and replay tools.
const DLQ_PRODUCER_ID_BIT: u64 = 1 << 63;
/// Records read per batch when start-up scans a twin for dead letters.
const DLQ_SCAN_BATCH_RECORDS: usize = 1024;

/// FNV-1a: a stable 63-bit name for a group inside a dead letter's producer_id.
pub fn dlq_producer_id(group: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in group {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h | DLQ_PRODUCER_ID_BIT
}

/// The stored value of a dead letter of `group`: the original value, the trailer, the
/// group name and its length.
pub fn dead_letter_value(original: &[u8], origin: &Origin, group: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(original.len() + Origin::ENCODED_BYTES + group.len() + 1);
    value.extend_from_slice(original);
    origin.write(&mut value);
    value.extend_from_slice(group);
    // Group names are at most 255 bytes (MAX_GROUP_LEN_BYTES): the length fits a u8.
    value.push(group.len() as u8);
    value
}

/// Splits a stored dead letter into (original value, origin, group name); a record
/// without the flag is all value.
pub fn split_dead_letter(flags: u16, value: &[u8]) -> (&[u8], Option<(Origin, &[u8])>) {
    if flags & RECORD_FLAG_ORIGIN == 0 {
        return (value, None);
    }
    let Some((&group_len, rest)) = value.split_last() else {
        return (value, None);
    };
    let group_len = usize::from(group_len);
    let Some(head_len) = rest.len().checked_sub(group_len + Origin::ENCODED_BYTES) else {
        return (value, None);
    };
    let (original, tail) = rest.split_at(head_len);
    let (trailer, group) = tail.split_at(Origin::ENCODED_BYTES);
    match Origin::decode(trailer) {
        Some(origin) => (original, Some((origin, group))),
        None => (value, None),
    }
}

/// Splits a stored value into the original value and its origin trailer.
pub fn split_origin(flags: u16, value: &[u8]) -> (&[u8], Option<Origin>) {
    let (original, dead) = split_dead_letter(flags, value);
    (original, dead.map(|(origin, _)| origin))
}

/// Every dead letter stored in a twin: (group name, origin, twin sequence). A record
/// whose CRC fails is skipped and counted, like a corrupt record anywhere else: one
/// flipped byte must not keep the broker from starting. Returns how many were skipped.
pub fn scan_dead_letters(
    log: &mut PartitionLog,
    found: &mut Vec<(Vec<u8>, Origin, u64)>,
) -> Result<u64, StorageError> {
    let push = |found: &mut Vec<(Vec<u8>, Origin, u64)>, r: RecordView<'_>| {
        if let (_, Some((origin, group))) = split_dead_letter(r.flags, r.value) {
            found.push((group.to_vec(), origin, r.sequence));
        }
    };
    let mut corrupt = 0;
    let mut from = log.first_sequence();
    let mut batch = Vec::new();
    loop {
        batch.clear();
        match log.read(from, DLQ_SCAN_BATCH_RECORDS, usize::MAX, |r| {
            push(&mut batch, r)
        }) {
            Ok(outcome) if outcome.records == 0 => return Ok(corrupt),
            Ok(outcome) => {
                found.append(&mut batch);
                from = outcome.next_sequence;
            }
            // Somewhere in this batch: find it record by record.
            Err(StorageError::Corrupt { .. }) => {
                let end = from.saturating_add(DLQ_SCAN_BATCH_RECORDS as u64);
                while from < end {
                    match log.read_one(from) {
                        Ok(Some(r)) => push(found, r),
                        Ok(None) => return Ok(corrupt),
                        Err(StorageError::Corrupt { .. }) => corrupt += 1,
                        Err(e) => return Err(e),
                    }
                    from += 1;
                }
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_trailer_splits_only_when_flagged() {
        let origin = Origin {
            origin_topic_id: 1,
            origin_partition: 2,
            origin_sequence: 3,
            attempts: 5,
            reason: 1,
        };
        let stored = dead_letter_value(b"hello", &origin, b"billing");
        assert_eq!(
            split_dead_letter(RECORD_FLAG_ORIGIN, &stored),
            (&b"hello"[..], Some((origin, &b"billing"[..])))
        );
        assert_eq!(
            split_origin(RECORD_FLAG_ORIGIN, &stored),
            (&b"hello"[..], Some(origin))
        );
        assert_eq!(split_origin(0, &stored).1, None);
    }

    #[test]
    fn group_hashes_are_stable_and_marked() {
        assert_eq!(dlq_producer_id(b"billing"), dlq_producer_id(b"billing"));
        assert_ne!(dlq_producer_id(b"billing"), dlq_producer_id(b"billinh"));
        assert!(dlq_producer_id(b"") & DLQ_PRODUCER_ID_BIT != 0);
    }
}
