//! Topic names to ids, shared by the producer and the consumer: DECLARE PASSIVE, an
//! optional create on first use, and the dead-letter twin addressed through its source
//! (the broker refuses to DECLARE a twin's name).

use crate::wire::ops::{Declare, DeclareResult, Frame, OkResult};
use crate::wire::{dlq_twin_id, DeclareFlags, ErrorCode, DLQ_SUFFIX};

use super::error::{Error, Result};

/// What the broker knows of a topic: its id and partition count. For a `.dlq` twin,
/// `source_id` is its source topic's id.
///
/// ```no_run
/// use mortarmq::client::Producer;
///
/// let mut producer = Producer::builder("127.0.0.1:7411").declare(4).connect()?;
/// let orders = producer.topic("orders")?;
/// let twin = producer.topic("orders.dlq")?;
/// assert_eq!((twin.id, twin.source_id), (orders.id + 1, Some(orders.id)));
/// assert_eq!(twin.partitions, orders.partitions);
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TopicInfo {
    pub id: u16,
    pub partitions: u16,
    pub source_id: Option<u16>,
}

/// The partition `mortarctl pub` picks for `key`: CRC-32 of the key modulo the partition
/// count; no key is partition 0. The Python client picks the same.
///
/// ```
/// use mortarmq::client::partition_for_key;
///
/// assert_eq!(partition_for_key(b"", 4), 0);
/// assert!(partition_for_key(b"customer-42", 4) < 4);
/// ```
pub fn partition_for_key(key: &[u8], partitions: u16) -> u16 {
    if key.is_empty() {
        return 0;
    }
    (crc32fast::hash(key) % u32::from(partitions.max(1))) as u16
}

/// Sends one DECLARE and returns its typed result.
pub(crate) type DeclareCall<'a> = dyn FnMut(&Frame<'_>) -> Result<Vec<u8>> + 'a;

/// Looks `name` up; with `create` (a partition count) a missing topic is created. A
/// `.dlq` name is its source's twin.
pub(crate) fn resolve(
    name: &str,
    create: Option<u16>,
    call: &mut DeclareCall<'_>,
) -> Result<TopicInfo> {
    if let Some(source) = name.strip_suffix(DLQ_SUFFIX) {
        let s = resolve(source, create, call)?;
        return Ok(TopicInfo {
            id: dlq_twin_id(s.id),
            partitions: s.partitions,
            source_id: Some(s.id),
        });
    }
    let passive = declare(name, 0, DeclareFlags::PASSIVE);
    let found = match (declared(call(&passive)), create) {
        (Err(e), Some(partitions)) if e.code() == Some(ErrorCode::UnknownTopic) => {
            match declared(call(&declare(name, partitions, DeclareFlags::empty()))) {
                // Created meanwhile by someone else with another count: use theirs.
                Err(e) if e.code() == Some(ErrorCode::TopicConfigConflict) => {
                    declared(call(&passive))
                }
                other => other,
            }
        }
        (found, _) => found,
    }?;
    Ok(TopicInfo {
        id: found.topic_id,
        partitions: found.partition_count,
        source_id: None,
    })
}

fn declare(name: &str, partition_count: u16, flags: DeclareFlags) -> Frame<'_> {
    Frame::Declare(Declare {
        topic: name.as_bytes(),
        partition_count,
        flags,
    })
}

fn declared(answer: Result<Vec<u8>>) -> Result<DeclareResult> {
    DeclareResult::decode_result(&answer?).map_err(|e| Error::Protocol(e.to_string()))
}
