//! The consume side of the broker: it drives the group coordinator (`consume`) with
//! the log as its record source, turns the coordinator's effects into pushes and
//! answers, appends dead letters to `.dlq` twins, and persists committed positions.
//!
//! Dead letters are stored in the twin with the log record flag
//! [`RECORD_FLAG_ORIGIN`], the stored value laid out as
//!
//! ```text
//! original value | origin trailer (15 bytes, semantics §4) | group name | group_len:u8
//! ```
//!
//! so a MSG from the twin carries the original value and the trailer (the group name is
//! the broker's own bookkeeping and never sent). Start-up reads the group name and the
//! origin back to settle, not resend, what each group already dead-lettered: at most
//! once per group, even across a crash and even before the group's first position was
//! persisted. The record's producer_id is a hash of the group name with the top bit set
//! and its producer_seq the origin sequence, for tools reading the twin.

use std::collections::HashMap;

use crate::consume::{self, Records};
use crate::log::{meta, PartitionLog, RecordView};
use crate::wire::ops::{begin_frame, encode_ok_empty, end_frame, Message, Msg, MsgRecord, Origin};
use crate::wire::{ErrorCode, Frame, Op};

use super::topics::{pair_of, Registry};
use super::{Answer, Broker, ConnRef, Effect, Handled, JobKind, Now, Partition};

/// Log record flag bit0: the value ends with an origin trailer (a dead letter).
pub const RECORD_FLAG_ORIGIN: u16 = 0x0001;
/// Top bit of a dead letter's producer_id; PUBs from clients may use any id, but the
/// twin is written only by the broker and replay tools.
const DLQ_PRODUCER_ID_BIT: u64 = 1 << 63;
/// The committed-positions file in the data directory.
pub const GROUPS_FILE: &str = "groups";
const GROUPS_MAGIC: &str = "mortar-groups 1";
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

/// Committed position per partition index.
type PartitionPositions = HashMap<u16, u64>;

/// A dead letter appended to a twin, settled in its group once durable.
pub(super) struct DeadLetterWait {
    pub twin: (u16, u16),
    pub twin_sequence: u64,
    pub group_id: u16,
    pub topic_id: u16,
    pub partition: u16,
    pub sequence: u64,
}

/// The log as the coordinator sees it: only flushed records are deliverable.
pub(super) struct LogRecords<'a> {
    pub registry: &'a Registry,
    pub partitions: &'a mut super::idhash::IdMap<(u16, u16), Partition>,
    /// Bumped for every record that fails its CRC on read.
    pub corrupt: &'a mut u64,
}

impl Records for LogRecords<'_> {
    fn partition_count(&self, topic_id: u16) -> Option<u16> {
        self.registry
            .by_topic_id(topic_id)
            .map(|(p, _)| p.partition_count)
    }

    fn first_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions
            .get(&(topic_id, partition))
            .map_or(1, |p| p.log.first_sequence())
    }

    fn next_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions
            .get(&(topic_id, partition))
            .map_or(1, |p| p.log.written_sequence() + 1)
    }

    fn record_bytes(&mut self, topic_id: u16, partition: u16, sequence: u64) -> Option<u32> {
        let part = self.partitions.get_mut(&(topic_id, partition))?;
        match part.log.read_one(sequence) {
            Ok(Some(r)) => Some((r.key.len() + r.value.len()) as u32),
            Ok(None) => None,
            Err(e) => {
                // Skipped, never delivered wrong: the coordinator treats it as gone.
                log::error!("topic {topic_id} partition {partition} seq {sequence}: {e}");
                *self.corrupt += 1;
                None
            }
        }
    }
}

fn code_answer(code: ErrorCode, op: Op) -> Answer {
    Answer::err(code, op as u8, code.client_should())
}

impl Broker {
    fn records(&mut self) -> (LogRecords<'_>, &mut consume::Coordinator) {
        (
            LogRecords {
                registry: &self.registry,
                partitions: &mut self.partitions,
                corrupt: &mut self.counters.corrupt_records_found,
            },
            &mut self.coordinator,
        )
    }

    /// SUB, ACK, NACK, PULL, HEARTBEAT, CONTROL_ACK and CREDIT.
    pub(super) fn handle_consume(
        &mut self,
        conn: ConnRef,
        slot: u64,
        frame: &Frame<'_>,
        now: Now,
    ) -> Handled {
        self.conn_serials.insert(conn.id, conn.serial);
        let id = conn.id;
        let t = now.mono_ms;
        let answer = match frame {
            Frame::Sub(s) => {
                let (mut recs, coordinator) = self.records();
                match coordinator.subscribe(id, s, t, &mut recs) {
                    Ok(r) => Answer::Sub(r),
                    Err(code) => code_answer(code, Op::Sub),
                }
            }
            Frame::Ack(a) => {
                let r = self.coordinator.ack(id, a, t);
                self.unit(r, Op::Ack)
            }
            Frame::Nack(n) => {
                let r = self.coordinator.nack(id, n, t);
                self.unit(r, Op::Nack)
            }
            Frame::Heartbeat(h) => {
                let r = self.coordinator.heartbeat(id, h, t);
                self.unit(r, Op::Heartbeat)
            }
            Frame::ControlAck(c) => {
                let r = self.coordinator.control_ack(id, c, t);
                self.unit(r, Op::ControlAck)
            }
            Frame::Credit(c) => match self.coordinator.credit(id, c, t) {
                Ok(r) => Answer::Credit(r),
                Err(code) => code_answer(code, Op::Credit),
            },
            Frame::Pull(p) => {
                let (mut recs, coordinator) = self.records();
                match coordinator.pull(id, slot, p, t, &mut recs) {
                    // Answered by an Effect::PullAnswer, perhaps within this pass.
                    Ok(()) => return Handled::Wait,
                    Err(code) => code_answer(code, Op::Pull),
                }
            }
            other => Answer::err(
                ErrorCode::InternalError,
                other.op() as u8,
                "not a consume op",
            ),
        };
        self.collect_consume_effects(now);
        Handled::Answer(answer)
    }

    fn unit(&self, r: Result<(), ErrorCode>, op: Op) -> Answer {
        match r {
            Ok(()) => Answer::Ok {
                request_op: op as u8,
            },
            Err(code) => code_answer(code, op),
        }
    }

    /// Runs the coordinator's timers and deliveries, then turns its effects into ours.
    pub(super) fn pump_consume(&mut self, now: Now) {
        let (mut recs, coordinator) = self.records();
        coordinator.pump(now.mono_ms, &mut recs);
        self.collect_consume_effects(now);
    }

    fn collect_consume_effects(&mut self, now: Now) {
        let mut effects = std::mem::take(&mut self.consume_effects);
        self.coordinator.drain_effects(&mut effects);
        for effect in effects.drain(..) {
            match effect {
                consume::Effect::Notice { conn, notice } => {
                    if let Some(conn) = self.conn_ref(conn) {
                        self.effects.push(Effect::Notice { conn, notice });
                    }
                }
                consume::Effect::Deliver { conn, delivery } => {
                    if let Some(conn) = self.conn_ref(conn) {
                        self.effects.push(Effect::Deliver { conn, delivery });
                    }
                }
                consume::Effect::PullAnswer {
                    conn,
                    pull_id,
                    deliveries,
                } => {
                    let Some(conn) = self.conn_ref(conn) else {
                        continue;
                    };
                    let mut bytes = Vec::new();
                    for d in &deliveries {
                        self.encode_delivery(d, &mut bytes);
                    }
                    encode_ok_empty(&mut bytes, Op::Pull as u8);
                    self.effects.push(Effect::Answer {
                        conn,
                        slot: pull_id,
                        answer: Answer::Frames(bytes),
                    });
                }
                consume::Effect::DeadLetter {
                    group_id,
                    topic_id,
                    partition,
                    sequence,
                    attempts,
                    reason,
                } => {
                    let origin = Origin {
                        origin_topic_id: topic_id,
                        origin_partition: partition,
                        origin_sequence: sequence,
                        attempts,
                        reason: reason.as_code(),
                    };
                    self.dead_letter(group_id, origin, now);
                }
            }
        }
        self.consume_effects = effects;
    }

    fn conn_ref(&self, id: u32) -> Option<ConnRef> {
        self.conn_serials
            .get(&id)
            .map(|&serial| ConnRef { id, serial })
    }

    /// Appends MSG for `d` to `out`, reading the record from the log (its mapping: the
    /// key and value are copied once, into the output buffer). Returns false when the
    /// record cannot be read (retention removed it, or it is corrupt): nothing is
    /// appended and the delivery expires and is retried or skipped by the coordinator.
    pub fn encode_delivery(&mut self, d: &consume::Delivery, out: &mut Vec<u8>) -> bool {
        let r = &d.reference;
        let Some(part) = self.partitions.get_mut(&(r.topic_id, r.partition)) else {
            return false;
        };
        let record = match part.log.read_one(r.sequence) {
            Ok(Some(r)) => r,
            Ok(None) => return false,
            Err(e) => {
                log::error!(
                    "cannot deliver topic {} partition {} seq {}: {e}",
                    r.topic_id,
                    r.partition,
                    r.sequence
                );
                self.counters.corrupt_records_found += 1;
                return false;
            }
        };
        let (value, origin) = split_origin(record.flags, record.value);
        let msg = Msg::of(
            r,
            d.attempt,
            MsgRecord {
                producer_id: record.producer_id,
                producer_seq: record.producer_seq,
                key: record.key,
                value,
                origin,
            },
        );
        let start = begin_frame(out, Op::Msg);
        msg.encode_payload(out);
        end_frame(out, start);
        true
    }

    fn dead_letter(&mut self, group_id: u16, origin: Origin, now: Now) {
        let source = (origin.origin_topic_id, origin.origin_partition);
        let settle_now = |b: &mut Broker, why: &str| {
            log::warn!(
                "dead letter of topic {} seq {} dropped: {why}",
                source.0,
                origin.origin_sequence
            );
            b.coordinator
                .dead_lettered(group_id, source.0, source.1, origin.origin_sequence);
        };
        let Some((_, is_twin)) = pair_of(source.0) else {
            return settle_now(self, "unknown topic");
        };
        if is_twin {
            // A record read from a twin has nowhere further to go.
            return settle_now(self, "the record is itself a dead letter");
        }
        let twin = (source.0 + 1, source.1);
        let Some(part) = self.partitions.get_mut(&source) else {
            return settle_now(self, "no partition");
        };
        let (key, mut value) = match part.log.read_one(origin.origin_sequence) {
            Ok(Some(r)) => (r.key.to_vec(), r.value.to_vec()),
            Ok(None) => return settle_now(self, "retention removed the record"),
            Err(e) => return settle_now(self, &e.to_string()),
        };
        origin.write(&mut value);
        let group = self.coordinator.group_name(group_id).unwrap_or_default();
        // Group names are at most 255 bytes (MAX_GROUP_LEN_BYTES): the length fits a u8.
        value.extend_from_slice(group);
        value.push(group.len() as u8);
        let record = RecordView {
            sequence: 0,
            timestamp_ms: now.wall_ms,
            producer_id: dlq_producer_id(group),
            producer_seq: origin.origin_sequence,
            flags: RECORD_FLAG_ORIGIN,
            key: &key,
            value: &value,
        };
        let Some(twin_part) = self.partitions.get_mut(&twin) else {
            return settle_now(self, "no twin");
        };
        let record = RecordView {
            sequence: twin_part.log.next_sequence(),
            ..record
        };
        match twin_part.log.append(&record) {
            Ok(twin_sequence) => {
                self.dead_letters.push(super::deliver::DeadLetterWait {
                    twin,
                    twin_sequence,
                    group_id,
                    topic_id: source.0,
                    partition: source.1,
                    sequence: origin.origin_sequence,
                });
                self.counters.dead_letters_appended += 1;
                if !twin_part.dirty {
                    twin_part.dirty = true;
                    self.flush_list.push(twin);
                }
            }
            // The record stays unsettled in its group (holding the committed position)
            // and is retried at the next expiry: better late than lost.
            Err(e) => log::error!("dead-letter append to topic {} failed: {e}", twin.0),
        }
    }

    /// Settles dead letters whose twin append is durable (fsynced).
    pub(super) fn settle_dead_letters(&mut self) {
        let partitions = &self.partitions;
        let coordinator = &mut self.coordinator;
        self.dead_letters.retain(|d| {
            let durable = partitions
                .get(&d.twin)
                .is_none_or(|p| p.log.synced_sequence() >= d.twin_sequence);
            if durable {
                coordinator.dead_lettered(d.group_id, d.topic_id, d.partition, d.sequence);
            }
            !durable
        });
    }

    /// Restores committed positions and already-written dead letters at start-up.
    pub(super) fn restore_groups(&mut self) -> Result<usize, String> {
        let path = self.config.data_dir.join(GROUPS_FILE);
        let bytes = match meta::read_checked(&path) {
            Ok(Some(b)) => b,
            Ok(None) => return Ok(0),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let positions = decode_positions(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
        // (group, topic) -> committed position per partition.
        let mut known: HashMap<(Vec<u8>, u16), PartitionPositions> = HashMap::new();
        for p in &positions {
            if self.registry.by_topic_id(p.topic_id).is_none() {
                continue; // the topic was deleted since
            }
            self.coordinator
                .restore_position(&p.group, p.topic_id, p.partition, p.committed);
            known
                .entry((p.group.clone(), p.topic_id))
                .or_default()
                .insert(p.partition, p.committed);
        }
        // Dead letters above a group's committed point were appended but maybe not yet
        // settled in the group when the broker stopped: they are settled, not resent.
        let twins: Vec<(u16, u16)> = self
            .partitions
            .keys()
            .filter(|(t, _)| t % 2 == 0)
            .copied()
            .collect();
        for twin in twins {
            let part = self.partitions.get_mut(&twin).expect("listed");
            let mut found = Vec::new();
            scan_dead_letters(&mut part.log, &mut found).map_err(|e| e.to_string())?;
            for (group, origin) in found {
                let committed = known
                    .get(&(group.clone(), origin.origin_topic_id))
                    .and_then(|c| c.get(&origin.origin_partition))
                    .copied()
                    .unwrap_or(0);
                if origin.origin_sequence > committed {
                    self.coordinator.restore_dead_lettered(
                        &group,
                        origin.origin_topic_id,
                        origin.origin_partition,
                        origin.origin_sequence,
                    );
                }
            }
        }
        self.persisted_positions = positions;
        Ok(self.persisted_positions.len())
    }

    /// Starts a positions write when they changed and the interval passed.
    pub(super) fn maybe_persist_positions(&mut self, now: Now, force: bool) {
        if self.positions_in_flight || (!force && now.mono_ms < self.next_positions_write_ms) {
            return;
        }
        self.next_positions_write_ms = now.mono_ms + self.config.commit_interval_ms;
        let positions = self.coordinator.positions();
        if positions == self.persisted_positions {
            return;
        }
        let bytes = encode_positions(&positions);
        let path = self.config.data_dir.join(GROUPS_FILE);
        self.positions_in_flight = true;
        self.persisted_positions = positions;
        self.submit(
            JobKind::Positions,
            Box::new(move || meta::write_atomic(&path, &bytes)),
        );
    }

    /// Writes the positions on the calling thread (shutdown).
    pub(super) fn persist_positions_now(&mut self) -> std::io::Result<()> {
        let positions = self.coordinator.positions();
        meta::write_atomic(
            &self.config.data_dir.join(GROUPS_FILE),
            &encode_positions(&positions),
        )
    }
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

fn scan_dead_letters(
    log: &mut PartitionLog,
    found: &mut Vec<(Vec<u8>, Origin)>,
) -> Result<(), crate::log::StorageError> {
    let mut from = log.first_sequence();
    loop {
        let outcome = log.read(from, DLQ_SCAN_BATCH_RECORDS, usize::MAX, |r| {
            if let (_, Some((origin, group))) = split_dead_letter(r.flags, r.value) {
                found.push((group.to_vec(), origin));
            }
        })?;
        if outcome.records == 0 {
            return Ok(());
        }
        from = outcome.next_sequence;
    }
}

/// The positions file: one `topic_id partition committed group` line per position.
fn encode_positions(positions: &[consume::GroupPosition]) -> Vec<u8> {
    let mut out = format!("{GROUPS_MAGIC}\n");
    for p in positions {
        out.push_str(&format!(
            "{} {} {} {}\n",
            p.topic_id,
            p.partition,
            p.committed,
            String::from_utf8_lossy(&p.group)
        ));
    }
    out.into_bytes()
}

fn decode_positions(bytes: &[u8]) -> Result<Vec<consume::GroupPosition>, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    if lines.next() != Some(GROUPS_MAGIC) {
        return Err("unknown header".into());
    }
    lines
        .map(|line| {
            let w: Vec<&str> = line.splitn(4, ' ').collect();
            let bad = || format!("bad line: {line}");
            if w.len() != 4 {
                return Err(bad());
            }
            Ok(consume::GroupPosition {
                topic_id: w[0].parse().map_err(|_| bad())?,
                partition: w[1].parse().map_err(|_| bad())?,
                committed: w[2].parse().map_err(|_| bad())?,
                group: w[3].as_bytes().to_vec(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_file_round_trips() {
        let positions = vec![
            consume::GroupPosition {
                group: b"billing".to_vec(),
                topic_id: 1,
                partition: 0,
                committed: 42,
            },
            consume::GroupPosition {
                group: b"a.b-c_d".to_vec(),
                topic_id: 3,
                partition: 7,
                committed: 0,
            },
        ];
        assert_eq!(
            decode_positions(&encode_positions(&positions)).unwrap(),
            positions
        );
        assert!(decode_positions(b"nope").is_err());
    }

    #[test]
    fn origin_trailer_splits_only_when_flagged() {
        let origin = Origin {
            origin_topic_id: 1,
            origin_partition: 2,
            origin_sequence: 3,
            attempts: 5,
            reason: 1,
        };
        let mut stored = b"hello".to_vec();
        origin.write(&mut stored);
        stored.extend_from_slice(b"billing");
        stored.push(7);
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
