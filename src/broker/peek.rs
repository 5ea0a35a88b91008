//! Reading records without consuming them: what the admin records endpoint (and
//! `mortarctl peek`, `tail -f`, `dlq list|replay`) shows. No group, no position, nothing
//! acknowledged; a dead letter comes back split into its original value and its origin.
//!
//! It runs on the reactor thread through the same [`PartitionLog::read`] consumers are
//! served from (memory maps, every record CRC-checked), so it does no I/O delivery does
//! not, and each answer is bounded: at most [`PEEK_RECORDS_MAX`] records and
//! [`PEEK_ANSWER_BYTES_MAX`] bytes of keys and values, copied out for the admin thread.
//!
//! [`PartitionLog::read`]: crate::log::PartitionLog::read

use crate::log::{PartitionLog, StorageError};
use crate::wire::ops::Origin;
use crate::wire::{ErrorCode, OriginReason, DLQ_SUFFIX};

use super::{dlq, Broker};

/// Records in one answer, at most; a larger `max` is cut to it (the answer's `next`
/// says where to go on).
pub const PEEK_RECORDS_MAX: usize = 1_000;
/// Key and value bytes copied into one answer, at most. The first record is always
/// copied whatever its size (at most a 16 MiB value), so paging always moves on.
pub const PEEK_ANSWER_BYTES_MAX: usize = 1024 * 1024;
/// Damaged records stepped over in one answer, at most, when they come before any
/// readable one: each is logged, and a run of them ends the answer early rather than
/// the reactor's turn late.
pub const PEEK_CORRUPT_SKIPS_MAX: usize = 16;

/// Where a read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeekFrom {
    /// This sequence (below the oldest retained one: the oldest).
    Sequence(u64),
    /// The first record stamped at or after this time, ms since the Unix epoch.
    TimeMs(u64),
}

/// One read: a topic (a source, or its `.dlq` twin by name), a partition, where to start
/// and how many records at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekAsk {
    pub topic: String,
    pub partition: u16,
    pub from: PeekFrom,
    pub max_records: usize,
}

/// A dead letter's origin, as its twin record carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekOrigin {
    pub topic_id: u16,
    /// The origin topic's name (empty if it is gone).
    pub topic: String,
    pub partition: u16,
    pub sequence: u64,
    pub attempts: u16,
    /// The registry name of the reason (`REJECTED`, `MAX_ATTEMPTS`).
    pub reason: &'static str,
    /// The group that dead-lettered it.
    pub group: String,
}

/// One record, owning its bytes; a dead letter's value is the original one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekRecord {
    pub sequence: u64,
    pub timestamp_ms: u64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub origin: Option<PeekOrigin>,
}

/// A page of records and where the partition stands.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Peek {
    pub topic: String,
    pub topic_id: u16,
    pub dlq_twin: bool,
    pub partition: u16,
    pub partition_count: u16,
    /// Oldest retained and newest readable sequence (`last < first` when empty).
    pub first_sequence: u64,
    pub last_sequence: u64,
    /// Where the next page starts: one past the last record in this one, or where
    /// this one would have started when it holds none.
    pub next_sequence: u64,
    pub records: Vec<PeekRecord>,
    /// Damaged records stepped over (their CRC failed), by sequence.
    pub corrupt: Vec<u64>,
}

/// Why there is no page: a registry code and a sentence for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeekError {
    pub code: ErrorCode,
    pub message: String,
}

impl PeekError {
    fn new(code: ErrorCode, message: String) -> PeekError {
        PeekError { code, message }
    }
}

impl Broker {
    /// One bounded page of `ask`'s partition, read as consumers read it (flushed
    /// records), without any group.
    pub fn peek(&mut self, ask: &PeekAsk) -> Result<Peek, PeekError> {
        let mut page = self.peek_target(ask)?;
        let key = (page.topic_id, ask.partition);
        let Some(part) = self.partitions.get_mut(key) else {
            return Err(unknown_partition(ask, page.partition_count));
        };
        let log = &mut part.log;
        let start = match ask.from {
            PeekFrom::Sequence(s) => s.max(log.first_sequence()),
            PeekFrom::TimeMs(t) => log.first_sequence_at_time(t).map_err(storage_error)?,
        };
        page.first_sequence = log.first_sequence();
        page.last_sequence = log.written_sequence();
        page.next_sequence = start;
        let raw = read_page(log, &mut page, ask.max_records.clamp(1, PEEK_RECORDS_MAX))?;
        page.records = raw
            .into_iter()
            .map(|r| PeekRecord {
                sequence: r.sequence,
                timestamp_ms: r.timestamp_ms,
                key: r.key,
                value: r.value,
                origin: r.origin.map(|(o, group)| self.peek_origin(&o, group)),
            })
            .collect();
        Ok(page)
    }

    /// The page's topic fields, or why `ask` names no readable partition.
    fn peek_target(&self, ask: &PeekAsk) -> Result<Peek, PeekError> {
        let source_name = ask.topic.strip_suffix(DLQ_SUFFIX).unwrap_or(&ask.topic);
        let dlq_twin = source_name.len() != ask.topic.len();
        let pair = self
            .topics
            .registry()
            .lookup(source_name)
            .filter(|p| self.topics.usable(p.source_id()).is_some());
        let Some(pair) = pair else {
            let text = format!("no topic named '{}'", ask.topic);
            return Err(PeekError::new(ErrorCode::UnknownTopic, text));
        };
        if ask.partition >= pair.partition_count {
            return Err(unknown_partition(ask, pair.partition_count));
        }
        Ok(Peek {
            topic: ask.topic.clone(),
            topic_id: if dlq_twin {
                pair.twin_id()
            } else {
                pair.source_id()
            },
            dlq_twin,
            partition: ask.partition,
            partition_count: pair.partition_count,
            ..Peek::default()
        })
    }

    fn peek_origin(&self, o: &Origin, group: String) -> PeekOrigin {
        let topic = self.topics.registry().by_topic_id(o.origin_topic_id);
        PeekOrigin {
            topic_id: o.origin_topic_id,
            topic: topic
                .map(|(pair, twin)| pair.name_of(twin))
                .unwrap_or_default(),
            partition: o.origin_partition,
            sequence: o.origin_sequence,
            attempts: o.attempts,
            reason: OriginReason::from_code(o.reason).map_or("UNKNOWN", OriginReason::name),
            group,
        }
    }
}

/// A record as read, before its origin's topic is named.
struct RawRecord {
    sequence: u64,
    timestamp_ms: u64,
    key: Vec<u8>,
    value: Vec<u8>,
    origin: Option<(Origin, String)>,
}

/// Copies up to `max_records` from `page.next_sequence` on, moving `next_sequence` past
/// them. A damaged record is stepped over (and named in `page.corrupt`), as delivery
/// steps over it; the page ends after it unless nothing was copied yet, so that every
/// read but the last starts a page and [`PEEK_ANSWER_BYTES_MAX`] holds.
fn read_page(
    log: &mut PartitionLog,
    page: &mut Peek,
    max_records: usize,
) -> Result<Vec<RawRecord>, PeekError> {
    let mut records = Vec::new();
    while page.next_sequence <= page.last_sequence {
        let from = page.next_sequence;
        let read = log.read(from, max_records, PEEK_ANSWER_BYTES_MAX, |r| {
            let (value, dead) = dlq::split_dead_letter(r.flags, r.value);
            records.push(RawRecord {
                sequence: r.sequence,
                timestamp_ms: r.timestamp_ms,
                key: r.key.to_vec(),
                value: value.to_vec(),
                origin: dead.map(|(o, group)| (o, String::from_utf8_lossy(group).into())),
            });
        });
        match read {
            Ok(outcome) => {
                page.next_sequence = outcome.next_sequence;
                break;
            }
            Err(StorageError::Corrupt { .. }) => {
                // `records` holds this read's only: the loop goes on only while empty.
                let damaged = from + records.len() as u64;
                log::error!(
                    "peek {} partition {}: seq {damaged} is damaged",
                    page.topic,
                    page.partition
                );
                page.corrupt.push(damaged);
                page.next_sequence = damaged + 1;
                if !records.is_empty() || page.corrupt.len() >= PEEK_CORRUPT_SKIPS_MAX {
                    break;
                }
            }
            Err(e) => return Err(storage_error(e)),
        }
    }
    Ok(records)
}

fn unknown_partition(ask: &PeekAsk, count: u16) -> PeekError {
    let text = format!(
        "topic '{}' has partitions 0 to {}, not {}",
        ask.topic,
        count.saturating_sub(1),
        ask.partition
    );
    PeekError::new(ErrorCode::UnknownPartition, text)
}

/// A read that failed for a reason other than a damaged record (EIO, ENOMEM): the
/// partition may read fine in a moment.
fn storage_error(e: StorageError) -> PeekError {
    PeekError::new(
        ErrorCode::InternalError,
        format!("reading the partition failed: {e}"),
    )
}

#[cfg(test)]
mod tests {
    use super::super::tests::{declare, open, settle, CONN};
    use super::*;
    use crate::broker::{unlimited_room, Now};
    use crate::log::RecordView;
    use crate::wire::ops::Pub;
    use crate::wire::{Durability, PubFlags};

    fn put(broker: &mut Broker, topic_id: u16, key: &[u8], value: &[u8], wall_ms: u64) {
        let p = Pub {
            topic_id,
            flags: PubFlags::requesting(Some(Durability::Written)),
            key,
            value,
            ..Pub::default()
        };
        let now = Now {
            wall_ms,
            mono_ms: 0,
        };
        broker.publish(CONN, 0, &p, now);
        broker.end_pass(now, &unlimited_room);
    }

    fn ask(topic: &str, partition: u16, from: PeekFrom, max_records: usize) -> PeekAsk {
        PeekAsk {
            topic: topic.into(),
            partition,
            from,
            max_records,
        }
    }

    fn sequences(page: &Peek) -> Vec<u64> {
        page.records.iter().map(|r| r.sequence).collect()
    }

    #[test]
    fn pages_are_bounded_and_say_where_to_go_on() {
        let dir = tempfile::tempdir().unwrap();
        let (mut broker, jobs) = open(dir.path());
        let t = declare(&mut broker, &jobs, "t", 2);
        for i in 0..PEEK_RECORDS_MAX as u64 + 5 {
            put(&mut broker, t, b"k", format!("v{i}").as_bytes(), 1_000 + i);
        }
        settle(&mut broker, &jobs);
        let page = broker.peek(&ask("t", 0, PeekFrom::Sequence(0), 2)).unwrap();
        assert_eq!(sequences(&page), [1, 2]);
        assert_eq!((page.first_sequence, page.last_sequence), (1, 1005));
        assert_eq!((page.next_sequence, page.partition_count), (3, 2));
        assert_eq!(
            (
                page.records[1].key.as_slice(),
                page.records[1].value.as_slice()
            ),
            (&b"k"[..], &b"v1"[..])
        );
        assert_eq!(page.records[1].timestamp_ms, 1_001);
        let all = broker
            .peek(&ask("t", 0, PeekFrom::Sequence(3), usize::MAX))
            .unwrap();
        assert_eq!(all.records.len(), PEEK_RECORDS_MAX, "cut to the cap");
        assert_eq!(all.next_sequence, 3 + PEEK_RECORDS_MAX as u64);
        let at = broker
            .peek(&ask("t", 0, PeekFrom::TimeMs(1_500), 1))
            .unwrap();
        assert_eq!(sequences(&at), [501]);
        let end = broker
            .peek(&ask("t", 0, PeekFrom::Sequence(2_000), 5))
            .unwrap();
        assert_eq!((end.records.len(), end.next_sequence), (0, 2_000));
        let empty = broker.peek(&ask("t", 1, PeekFrom::Sequence(0), 5)).unwrap();
        assert_eq!(
            (
                empty.records.len(),
                empty.next_sequence,
                empty.last_sequence
            ),
            (0, 1, 0)
        );

        // Bytes: two records of 600 KiB do not fit one answer; one always does.
        let big = vec![b'x'; 600 * 1024];
        put(&mut broker, t, b"", &big, 9_000);
        put(&mut broker, t, b"", &big, 9_001);
        settle(&mut broker, &jobs);
        let page = broker
            .peek(&ask("t", 0, PeekFrom::Sequence(1_006), 10))
            .unwrap();
        assert_eq!((sequences(&page), page.next_sequence), (vec![1_006], 1_007));
    }

    #[test]
    fn dead_letters_come_with_their_origin_and_bad_asks_with_a_code() {
        let dir = tempfile::tempdir().unwrap();
        let (mut broker, jobs) = open(dir.path());
        let t = declare(&mut broker, &jobs, "jobs", 1);
        put(&mut broker, t, b"j1", b"bad", 5);
        let origin = Origin {
            origin_topic_id: t,
            origin_partition: 0,
            origin_sequence: 1,
            attempts: 3,
            reason: OriginReason::MaxAttempts.as_code(),
        };
        let value = dlq::dead_letter_value(b"bad", &origin, b"workers");
        let record = RecordView {
            sequence: 1,
            timestamp_ms: 7,
            producer_id: dlq::dlq_producer_id(b"workers"),
            producer_seq: 1,
            flags: dlq::RECORD_FLAG_ORIGIN,
            key: b"j1",
            value: &value,
        };
        broker.partitions.append((t + 1, 0), &record).unwrap();
        settle(&mut broker, &jobs);
        let page = broker
            .peek(&ask("jobs.dlq", 0, PeekFrom::Sequence(1), 10))
            .unwrap();
        assert!(page.dlq_twin);
        assert_eq!(page.topic_id, t + 1);
        let r = &page.records[0];
        assert_eq!(
            (r.key.as_slice(), r.value.as_slice()),
            (&b"j1"[..], &b"bad"[..])
        );
        let want = PeekOrigin {
            topic_id: t,
            topic: "jobs".into(),
            partition: 0,
            sequence: 1,
            attempts: 3,
            reason: "MAX_ATTEMPTS",
            group: "workers".into(),
        };
        assert_eq!(r.origin.as_ref(), Some(&want));
        let source = broker
            .peek(&ask("jobs", 0, PeekFrom::Sequence(1), 10))
            .unwrap();
        assert_eq!(source.records[0].origin, None);

        let code = |b: &mut Broker, a: PeekAsk| b.peek(&a).unwrap_err().code;
        let from = PeekFrom::Sequence(1);
        assert_eq!(
            code(&mut broker, ask("nope", 0, from, 1)),
            ErrorCode::UnknownTopic
        );
        assert_eq!(
            code(&mut broker, ask("nope.dlq", 0, from, 1)),
            ErrorCode::UnknownTopic
        );
        let e = broker.peek(&ask("jobs", 1, from, 1)).unwrap_err();
        assert_eq!(e.code, ErrorCode::UnknownPartition);
        assert!(e.message.contains("partitions 0 to 0"), "{}", e.message);
    }
}
