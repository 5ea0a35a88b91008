//! The consume driver: it runs the group coordinator (`consume`) with the log as its
//! record source, turns the coordinator's effects into pushes and answers, appends dead
//! letters to `.dlq` twins (`dlq.rs`) and persists committed positions (`positions.rs`).

use std::collections::HashMap;

use crate::consume::{self, Coordinator, OutputRoom, RecordBytes, Records};
use crate::log::{RecordView, StorageError};
use crate::wire::ops::{
    begin_frame, encode_ok_empty, end_frame, Ack, ControlAck, Credit, Heartbeat, Message, Msg,
    MsgRecord, Nack, Origin, Pull, Sub,
};
use crate::wire::{ErrorCode, HeartbeatState, Op, Response};

use super::counters::BrokerCounters;
use super::dlq::{self, RECORD_FLAG_ORIGIN};
use super::idhash::IdMap;
use super::positions::Positions;
use super::publish::Partitions;
use super::registry::TopicRegistry;
use super::topics::{pair_of, Registry, TopicPair};
use super::{Broker, ConnRef, Effect, Handled, Now, PartitionKey, PullAnswer};

/// What reading the record a dead letter copies found.
enum SourceRead {
    Record(Vec<u8>, Vec<u8>),
    /// It can never be copied: settled in its group without a dead letter.
    Settle(String),
    /// It could not be read just now: appended again later.
    Retry,
}

/// A dead letter appended to a twin, settled in its group once durable.
struct DeadLetterWait {
    twin: PartitionKey,
    twin_sequence: u64,
    group_id: u16,
    origin: Origin,
}

impl DeadLetterWait {
    fn origin(&self) -> Origin {
        self.origin
    }

    /// Its group counts the record settled: the dead letter is where it must be.
    fn settle_in(&self, coordinator: &mut Coordinator) {
        let o = &self.origin;
        coordinator.dead_lettered(
            self.group_id,
            o.origin_topic_id,
            o.origin_partition,
            o.origin_sequence,
        );
    }
}

/// The coordinator and what the broker keeps beside it.
pub struct ConsumeDriver {
    coordinator: Coordinator,
    /// Serials of connections that used the consume plane (the coordinator knows ids).
    conn_serials: IdMap<u32, u64>,
    /// Reused between calls: the coordinator's effects being translated.
    scratch: Vec<consume::Effect>,
    dead_letters: Vec<DeadLetterWait>,
    /// Dead letters whose source could not be read or whose twin append or flush
    /// failed: tried again by housekeeping, never dropped (their group's committed
    /// position waits for them).
    dead_letter_retries: Vec<(u16, Origin)>,
    positions: Positions,
    /// Bumped by every pump: a record read for its size in one is not CRC-checked again
    /// when its MSG is encoded before the next (`PartitionLog::read_one_in_pass`).
    read_pass: u64,
}

/// The log as the coordinator sees it: only flushed records are deliverable.
struct LogRecords<'a> {
    topics: &'a TopicRegistry,
    partitions: &'a mut Partitions,
    /// Bumped for every record that fails its CRC on read.
    corrupt: &'a mut u64,
    read_pass: u64,
}

impl Records for LogRecords<'_> {
    fn partition_count(&self, topic_id: u16) -> Option<u16> {
        self.topics.usable(topic_id).map(|p| p.partition_count)
    }

    fn first_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions
            .get((topic_id, partition))
            .map_or(1, |p| p.log.first_sequence())
    }

    fn next_sequence(&self, topic_id: u16, partition: u16) -> u64 {
        self.partitions
            .get((topic_id, partition))
            .map_or(1, |p| p.log.written_sequence() + 1)
    }

    fn record_bytes(&mut self, topic_id: u16, partition: u16, sequence: u64) -> RecordBytes {
        let Some(part) = self.partitions.get_mut((topic_id, partition)) else {
            return RecordBytes::Gone;
        };
        match part.log.read_one_in_pass(sequence, self.read_pass) {
            Ok(Some(r)) => RecordBytes::Size((r.key.len() + r.value.len()) as u32),
            Ok(None) => RecordBytes::Gone,
            Err(e @ StorageError::Corrupt { .. }) => {
                // Skipped, never delivered wrong: its CRC proved it damaged.
                log::error!("topic {topic_id} partition {partition} seq {sequence}: {e}");
                *self.corrupt += 1;
                RecordBytes::Gone
            }
            Err(e) => {
                // EIO, EMFILE, ENOMEM: the record may read fine in a moment.
                log::warn!("topic {topic_id} partition {partition} seq {sequence}: {e}; retrying");
                RecordBytes::Unreadable
            }
        }
    }
}

fn unit(r: Result<(), ErrorCode>, op: Op) -> Handled {
    Handled::Answer(match r {
        Ok(()) => Response::ok(op),
        Err(code) => Response::err_advice(code, op),
    })
}

impl ConsumeDriver {
    pub(super) fn new(
        storage: std::sync::Arc<dyn crate::log::Storage>,
        config: &super::BrokerConfig,
    ) -> ConsumeDriver {
        ConsumeDriver {
            coordinator: Coordinator::new(config.consume.clone()),
            conn_serials: IdMap::default(),
            scratch: Vec::new(),
            dead_letters: Vec::new(),
            dead_letter_retries: Vec::new(),
            positions: Positions::new(storage, &config.data_dir, config.commit_interval_ms),
            read_pass: 0,
        }
    }

    pub fn coordinator(&self) -> &Coordinator {
        &self.coordinator
    }

    /// For operator changes (`manage.rs`): the coordinator and the positions file.
    pub(super) fn parts_mut(&mut self) -> (&mut Coordinator, &mut Positions) {
        (&mut self.coordinator, &mut self.positions)
    }

    /// Whether a pair has live subscriptions (DELETE with IF_UNUSED).
    pub(super) fn topic_in_use(&self, pair: &TopicPair) -> bool {
        self.coordinator.topic_has_members(pair.source_id())
            || self.coordinator.topic_has_members(pair.twin_id())
    }

    /// DELETE of a pair: every owner gets REVOKE, the groups go.
    pub(super) fn topic_deleted(&mut self, pair: &TopicPair, now: Now) {
        for topic_id in [pair.source_id(), pair.twin_id()] {
            self.coordinator.topic_deleted(topic_id, now.mono_ms);
        }
        // The id may be given to a new topic, whose twin starts again at sequence 1.
        let source = pair.source_id();
        self.positions.retain_tombstones(|t| t.topic_id != source);
    }

    /// New records were written to a partition: its groups may deliver.
    pub(super) fn records_available(&mut self, topic_id: u16, partition: u16) {
        self.coordinator.records_available(topic_id, partition);
    }

    fn note_conn(&mut self, conn: ConnRef) {
        self.conn_serials.insert(conn.id, conn.serial);
    }

    fn conn_ref(&self, id: u32) -> Option<ConnRef> {
        self.conn_serials
            .get(&id)
            .map(|&serial| ConnRef { id, serial })
    }

    /// The PULL answers handed to the reactor are in their connections now.
    pub(super) fn outputs_caught_up(&mut self) {
        self.coordinator.outputs_caught_up();
    }

    pub(super) fn connection_closed(&mut self, conn: ConnRef, now: Now) {
        if self.conn_serials.get(&conn.id) == Some(&conn.serial) {
            self.conn_serials.remove(&conn.id);
            self.coordinator.connection_closed(conn.id, now.mono_ms);
        }
    }

    pub(super) fn next_deadline_ms(&self) -> u64 {
        let positions = self.positions.next_write_ms();
        self.coordinator
            .next_deadline_ms()
            .map_or(positions, |d| d.min(positions))
    }

    /// Settles dead letters whose twin append is durable (fsynced).
    pub(super) fn settle_dead_letters(&mut self, partitions: &Partitions) {
        let coordinator = &mut self.coordinator;
        self.dead_letters.retain(|d| {
            let durable = partitions
                .get(d.twin)
                .is_none_or(|p| p.log.durable_sequence() >= d.twin_sequence);
            if durable {
                d.settle_in(coordinator);
            }
            !durable
        });
    }

    /// Cluster mode: as [`Self::settle_dead_letters`], once the BATCH that carried a
    /// dead letter is applied. A proposal refused or truncated gives its sequence to
    /// another record, so the record found there must be this dead letter, or it is
    /// appended again; so is one whose sequence is neither applied nor proposed on a
    /// leader that has applied all it proposed before (`proposed_end`, `None` while that
    /// cannot be known: `Cluster::proposed_end`).
    pub(super) fn settle_replicated_dead_letters(
        &mut self,
        partitions: &mut Partitions,
        proposed_end: &dyn Fn(PartitionKey) -> Option<u64>,
    ) {
        let (coordinator, retries) = (&mut self.coordinator, &mut self.dead_letter_retries);
        self.dead_letters.retain(|d| {
            let Some(part) = partitions.get_mut(d.twin) else {
                // The pair is gone, as on a single node (`settle_dead_letters`).
                d.settle_in(coordinator);
                return false;
            };
            if part.log.durable_sequence() < d.twin_sequence {
                let end = proposed_end(d.twin).map(|p| p.max(part.log.next_sequence()));
                let lost = end.is_some_and(|end| d.twin_sequence >= end);
                if lost {
                    retries.push((d.group_id, d.origin));
                }
                return !lost;
            }
            let found = match part.log.read_one(d.twin_sequence) {
                Ok(Some(r)) => dlq::split_origin(r.flags, r.value).1 == Some(d.origin),
                // Gone to retention, or unreadable: it was applied, so it was there.
                Ok(None) | Err(_) => true,
            };
            match found {
                true => d.settle_in(coordinator),
                false => retries.push((d.group_id, d.origin)),
            }
            false
        });
    }

    /// A twin's flush failed: its records above `written` never reached the file, so the
    /// dead letters that waited for them are appended again (the sequences they waited
    /// for will be given to other records).
    pub(super) fn twin_flush_failed(&mut self, twin: PartitionKey, written: u64) {
        let retries = &mut self.dead_letter_retries;
        self.dead_letters.retain(|d| {
            let lost = d.twin == twin && d.twin_sequence > written;
            if lost {
                retries.push((d.group_id, d.origin()));
            }
            !lost
        });
    }

    /// A positions write runs: a checkpoint waits for it rather than race it.
    pub(super) fn positions_writing(&self) -> bool {
        self.positions.in_flight()
    }

    pub(super) fn positions_written(&mut self, result: &std::io::Result<()>) {
        self.positions.written(result);
    }

    /// A positions write when they changed and the interval passed (or `force`): of the
    /// positions `held` picks, the node's durable ones (`broker::durable_positions`).
    pub(super) fn positions_job(
        &mut self,
        now: Now,
        force: bool,
        held: impl FnOnce(&Coordinator) -> Vec<consume::GroupPosition>,
    ) -> Option<super::DurableJob> {
        let coordinator = &self.coordinator;
        self.positions
            .write_job(now.mono_ms, force, || held(coordinator))
    }

    /// The positions file's bytes with `positions` and the tombstones (a snapshot's).
    pub(super) fn positions_bytes(&self, positions: &[consume::GroupPosition]) -> Vec<u8> {
        self.positions.encode(positions)
    }

    /// This cluster node leads in `term`: groups' epochs continue above the term's base.
    pub(super) fn leading_in(&mut self, term: u64) {
        self.coordinator.raise_epochs(term << 32);
    }

    /// A committed position replicated from the leader (`replica::cluster`).
    pub(super) fn replicated_position(&mut self, change: (&[u8], u16, u16, u64), now: Now) {
        let (group, topic_id, partition, committed) = change;
        self.coordinator
            .restore_position((group, topic_id), partition, committed, now.mono_ms);
    }

    /// Dead letters in a BATCH part of a twin: settled for their groups, as start-up
    /// does with what it finds in the twins (`restore`), so a follower that comes to
    /// lead does not write them again. A leader's live groups ignore them.
    pub(super) fn replicated_dead_letters(
        &mut self,
        first_sequence: u64,
        records: &[u8],
        now: Now,
    ) {
        let (mut pos, mut sequence) = (0, first_sequence);
        while let Ok((r, len)) = crate::log::decode_record(&records[pos..], Some(sequence)) {
            if let (_, Some((origin, group))) = dlq::split_dead_letter(r.flags, r.value) {
                let source = (group, origin.origin_topic_id);
                let (partition, seq) = (origin.origin_partition, origin.origin_sequence);
                self.coordinator
                    .restore_dead_lettered(source, partition, seq, now.mono_ms);
            }
            pos += len;
            sequence += 1;
            if pos >= records.len() {
                break;
            }
        }
    }

    /// A cluster node's role this pass (`Coordinator::set_following`).
    pub(super) fn set_following(&mut self, following: bool, now: Now) {
        if following && !self.coordinator.following() {
            // Their groups are gone (`Coordinator::stop_leading`): the new leader
            // delivers those records again and writes what dead letters they need.
            self.dead_letters.clear();
            self.dead_letter_retries.clear();
        }
        self.coordinator.set_following(following, now.mono_ms);
    }

    pub(super) fn following(&self) -> bool {
        self.coordinator.following()
    }

    /// A cluster node stops leading, or leads a new term with its last term's groups:
    /// they end, and the `changed` ones, whose operator change is not applied yet, hold
    /// their positions in `applied`, the applied log's (`Coordinator::follow_replicated`).
    pub(super) fn stop_leading(
        &mut self,
        changed: &[(Vec<u8>, u16)],
        applied: &[consume::GroupPosition],
        now: Now,
    ) {
        self.set_following(true, now);
        (self.coordinator).follow_replicated(changed, applied, now.mono_ms);
    }

    /// Writes the positions `held` picks on the calling thread (shutdown).
    pub(super) fn persist_positions_now(
        &mut self,
        held: impl FnOnce(&Coordinator) -> Vec<consume::GroupPosition>,
    ) -> std::io::Result<()> {
        let positions = held(&self.coordinator);
        self.positions.write_now(&positions)
    }

    /// Restores committed positions and already-written dead letters at start-up;
    /// returns how many positions were read.
    pub(super) fn restore(
        &mut self,
        registry: &Registry,
        partitions: &mut Partitions,
        counters: &mut BrokerCounters,
        now: Now,
    ) -> Result<usize, String> {
        let positions = self.positions.read()?;
        self.drop_spent_tombstones(partitions);
        // (group, topic) -> committed position per partition.
        let mut known: HashMap<(Vec<u8>, u16), HashMap<u16, u64>> = HashMap::new();
        for p in positions
            .iter()
            .filter(|p| registry.by_topic_id(p.topic_id).is_some())
        {
            self.coordinator.restore_position(
                (&p.group, p.topic_id),
                p.partition,
                p.committed,
                now.mono_ms,
            );
            known
                .entry((p.group.clone(), p.topic_id))
                .or_default()
                .insert(p.partition, p.committed);
        }
        let twins: Vec<PartitionKey> = partitions.keys().filter(|(t, _)| t % 2 == 0).collect();
        for twin in twins {
            let part = partitions.get_mut(twin).expect("listed");
            let mut found = Vec::new();
            counters.corrupt_records_found +=
                dlq::scan_dead_letters(&mut part.log, &mut found).map_err(|e| e.to_string())?;
            self.restore_dead_letters(twin.1, found, &known, now);
        }
        Ok(positions.len())
    }

    /// Dead letters above a group's committed point were appended but maybe not yet
    /// settled in the group when the broker stopped: they are settled, not resent. Those
    /// a deleted group wrote before its delete (below its tombstone's mark) are not read
    /// back, or the group would come back holding a `--max-groups` slot.
    fn restore_dead_letters(
        &mut self,
        twin_partition: u16,
        found: Vec<(Vec<u8>, Origin, u64)>,
        known: &HashMap<(Vec<u8>, u16), HashMap<u16, u64>>,
        now: Now,
    ) {
        for (group, origin, twin_sequence) in found {
            let tombstone = self.positions.tombstone_of(&group, origin.origin_topic_id);
            if tombstone.is_some_and(|t| t.hides(twin_partition, twin_sequence)) {
                continue;
            }
            let committed = known
                .get(&(group.clone(), origin.origin_topic_id))
                .and_then(|c| c.get(&origin.origin_partition))
                .copied()
                .unwrap_or(0);
            if origin.origin_sequence > committed {
                self.coordinator.restore_dead_lettered(
                    (&group, origin.origin_topic_id),
                    origin.origin_partition,
                    origin.origin_sequence,
                    now.mono_ms,
                );
            }
        }
    }

    /// Drops the tombstones with nothing left to hide (`GroupTombstone::settle`): their
    /// topic is gone, or retention (or a purge) removed every twin record below their
    /// marks; lowers marks above what the twin holds.
    pub(super) fn drop_spent_tombstones(&mut self, partitions: &Partitions) {
        self.positions.retain_tombstones(|t| {
            let twin_id = crate::wire::dlq_twin_id(t.topic_id);
            t.settle(|p| {
                let part = partitions.get((twin_id, p))?;
                Some((part.log.first_sequence(), part.log.next_sequence()))
            })
        });
    }

    /// `proposed_end`: in a cluster, where a twin's records proposed and not applied yet
    /// end (`None` while unknown: `Cluster::proposed_end`); 0 on a single node.
    pub(super) fn check_invariants(
        &self,
        partitions: &Partitions,
        proposed_end: &dyn Fn(PartitionKey) -> Option<u64>,
    ) {
        for d in &self.dead_letters {
            let Some(end) = proposed_end(d.twin) else {
                continue;
            };
            let twin = partitions.get(d.twin);
            assert!(
                twin.is_none_or(|p| p.log.next_sequence().max(end) > d.twin_sequence),
                "a dead letter waits for a record its twin never got"
            );
        }
    }
}

impl Broker {
    /// The coordinator and its record source, borrowed together.
    fn coordinated(&mut self) -> (&mut Coordinator, LogRecords<'_>) {
        (
            &mut self.consume.coordinator,
            LogRecords {
                topics: &self.topics,
                partitions: &mut self.partitions,
                corrupt: &mut self.counters.corrupt_records_found,
                read_pass: self.consume.read_pass,
            },
        )
    }

    /// Answers an op of the consume plane, then carries out the coordinator's effects
    /// (after the answer, so a SUB's OK reaches the client before NOTICEs naming it).
    fn consumed(&mut self, handled: Handled, now: Now) -> Handled {
        self.collect_consume_effects(now);
        handled
    }

    pub fn subscribe(&mut self, conn: ConnRef, s: &Sub<'_>, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let (coordinator, mut records) = self.coordinated();
        let response = match coordinator.subscribe(conn.id, s, now.mono_ms, &mut records) {
            Ok(r) => Response::Sub(r),
            Err(code) => Response::err_advice(code, Op::Sub),
        };
        self.consumed(Handled::Answer(response), now)
    }

    pub fn ack(&mut self, conn: ConnRef, a: &Ack, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let r = self.consume.coordinator.ack(conn.id, a, now.mono_ms);
        self.consumed(unit(r, Op::Ack), now)
    }

    pub fn nack(&mut self, conn: ConnRef, n: &Nack, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let r = self.consume.coordinator.nack(conn.id, n, now.mono_ms);
        self.consumed(unit(r, Op::Nack), now)
    }

    pub fn heartbeat(&mut self, conn: ConnRef, h: &Heartbeat, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let r = self.consume.coordinator.heartbeat(conn.id, h, now.mono_ms);
        if r.is_ok() && h.state == HeartbeatState::Leave.as_code() {
            if let Some(cluster) = self.cluster.as_deref_mut() {
                cluster.replicate_positions_now();
            }
        }
        self.consumed(unit(r, Op::Heartbeat), now)
    }

    pub fn control_ack(&mut self, conn: ConnRef, c: &ControlAck, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let r = self
            .consume
            .coordinator
            .control_ack(conn.id, c, now.mono_ms);
        self.consumed(unit(r, Op::ControlAck), now)
    }

    pub fn credit(&mut self, conn: ConnRef, c: &Credit, now: Now) -> Handled {
        self.consume.note_conn(conn);
        let response = match self.consume.coordinator.credit(conn.id, c, now.mono_ms) {
            Ok(r) => Response::Credit(r),
            Err(code) => Response::err_advice(code, Op::Credit),
        };
        self.consumed(Handled::Answer(response), now)
    }

    /// PULL: answered by an [`Effect::PullAnswer`] in its slot, perhaps within this pass,
    /// cut to what `room` says the connection's output can take.
    pub fn pull(
        &mut self,
        conn: ConnRef,
        slot: u64,
        p: &Pull,
        now: Now,
        room: &dyn OutputRoom,
    ) -> Handled {
        self.consume.note_conn(conn);
        let (coordinator, mut records) = self.coordinated();
        let handled = match coordinator.pull(conn.id, slot, p, now.mono_ms, &mut records, room) {
            Ok(()) => Handled::Wait,
            Err(code) => Handled::Answer(Response::err_advice(code, Op::Pull)),
        };
        self.consumed(handled, now)
    }

    /// Runs the coordinator's timers and deliveries, then carries out its effects.
    /// A cluster leader whose lease lapsed delivers nothing until it holds the lease
    /// again or stops leading: a new leader may already have settled and replicated
    /// what its groups would deliver (`docs/REPLICATION.md` §7.4).
    pub(super) fn pump_consume(&mut self, now: Now, room: &dyn OutputRoom) {
        self.consume.read_pass += 1;
        let delivering = (self.cluster.as_deref()).is_none_or(|c| c.delivers(now.mono_ms));
        let (coordinator, mut records) = self.coordinated();
        if delivering {
            coordinator.pump(now.mono_ms, &mut records, room);
        } else {
            coordinator.run_timers(now.mono_ms);
        }
        self.collect_consume_effects(now);
    }

    pub(super) fn collect_consume_effects(&mut self, now: Now) {
        let mut effects = std::mem::take(&mut self.consume.scratch);
        self.consume.coordinator.drain_effects(&mut effects);
        for effect in effects.drain(..) {
            self.consume_effect(effect, now);
        }
        self.consume.scratch = effects;
    }

    fn consume_effect(&mut self, effect: consume::Effect, now: Now) {
        match effect {
            consume::Effect::Notice { conn, notice } => {
                if let Some(conn) = self.consume.conn_ref(conn) {
                    self.effects.push(Effect::Notice { conn, notice });
                }
            }
            consume::Effect::Deliver { conn, delivery } => {
                if let Some(conn) = self.consume.conn_ref(conn) {
                    self.effects.push(Effect::Deliver { conn, delivery });
                }
            }
            consume::Effect::PullAnswer {
                conn,
                pull_id,
                deliveries,
                bytes,
            } => {
                let Some(conn) = self.consume.conn_ref(conn) else {
                    return;
                };
                self.effects.push(Effect::PullAnswer {
                    conn,
                    slot: pull_id,
                    answer: PullAnswer {
                        deliveries,
                        bytes: usize::try_from(bytes).unwrap_or(usize::MAX),
                    },
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
            consume::Effect::GroupExpired { group, topic_id } => {
                if self.cluster.is_some() {
                    self.propose_group_expiry(group, topic_id, now);
                }
            }
        }
    }

    /// Appends a PULL's answer to `out`: MSG for each delivery, read from the log, then
    /// OK. Called when the answer's slot is at the head, into the connection's output,
    /// so no copy of the whole answer is ever made. Returns how many MSGs it wrote.
    pub fn encode_pull_answer(&mut self, answer: &PullAnswer, out: &mut Vec<u8>) -> u64 {
        // Room for the whole answer at once: grown MSG by MSG, the buffer would double
        // past twice the answer's size.
        out.reserve(answer.bytes);
        let mut msgs = 0;
        for d in &answer.deliveries {
            msgs += u64::from(self.encode_delivery(d, out));
        }
        encode_ok_empty(out, Op::Pull as u8);
        msgs
    }

    /// Appends MSG for `d` to `out`, reading the record from the log (its mapping: the
    /// key and value are copied once, into the output buffer; its CRC was computed when
    /// the group took it, if that was in this pass). Returns false when the
    /// record cannot be read (retention removed it, or it is corrupt): nothing is
    /// appended and the delivery expires and is retried or skipped by the coordinator.
    pub fn encode_delivery(&mut self, d: &consume::Delivery, out: &mut Vec<u8>) -> bool {
        let r = &d.reference;
        let Some(part) = self.partitions.get_mut((r.topic_id, r.partition)) else {
            return false;
        };
        let record = match part
            .log
            .read_one_in_pass(r.sequence, self.consume.read_pass)
        {
            Ok(Some(record)) => record,
            Ok(None) => return false,
            Err(e) => {
                log::error!(
                    "cannot deliver topic {} partition {} seq {}: {e}",
                    r.topic_id,
                    r.partition,
                    r.sequence
                );
                if matches!(e, StorageError::Corrupt { .. }) {
                    self.counters.corrupt_records_found += 1;
                }
                return false;
            }
        };
        let (value, origin) = dlq::split_origin(record.flags, record.value);
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

    /// Appends the record `origin` names to its twin, with the trailer and the group; the
    /// group settles it once the append is durable.
    fn dead_letter(&mut self, group_id: u16, origin: Origin, now: Now) {
        let source = (origin.origin_topic_id, origin.origin_partition);
        let (key, value) = match self.dead_letter_source(&origin) {
            SourceRead::Record(key, value) => (key, value),
            SourceRead::Retry => return self.consume.dead_letter_retries.push((group_id, origin)),
            SourceRead::Settle(why) => {
                log::warn!(
                    "dead letter of topic {} seq {} dropped: {why}",
                    source.0,
                    origin.origin_sequence
                );
                let coordinator = &mut self.consume.coordinator;
                return coordinator.dead_lettered(
                    group_id,
                    source.0,
                    source.1,
                    origin.origin_sequence,
                );
            }
        };
        let twin = (source.0 + 1, source.1);
        let group = self
            .consume
            .coordinator
            .group_name(group_id)
            .unwrap_or_default();
        let value = dlq::dead_letter_value(&value, &origin, group);
        let record = RecordView {
            sequence: self
                .partitions
                .get(twin)
                .map_or(0, |p| p.log.next_sequence()),
            timestamp_ms: now.wall_ms,
            producer_id: dlq::dlq_producer_id(group),
            producer_seq: origin.origin_sequence,
            flags: RECORD_FLAG_ORIGIN,
            key: &key,
            value: &value,
        };
        // In a cluster the twin is replicated like any partition: the record goes into
        // the pass's BATCH and is settled once applied (`replica::cluster`).
        let appended = match self.cluster.is_some() {
            true => self.propose_dead_letter(twin, &record, now).ok_or(None),
            false => self.partitions.append(twin, &record).map_err(Some),
        };
        match appended {
            Ok(twin_sequence) => {
                self.consume.dead_letters.push(DeadLetterWait {
                    twin,
                    twin_sequence,
                    group_id,
                    origin,
                });
                self.counters.dead_letters_appended += 1;
            }
            // The record stays unsettled in its group (holding the committed position)
            // and is appended again by housekeeping: better late than lost. A cluster
            // node that does not serve (not leading, lease lapsed) waits the same way.
            Err(e) => {
                if let Some(e) = e {
                    log::error!("dead-letter append to topic {} failed: {e}", twin.0);
                }
                self.consume.dead_letter_retries.push((group_id, origin));
            }
        }
    }

    /// The key and value of the record a dead letter copies, or why there is none.
    fn dead_letter_source(&mut self, origin: &Origin) -> SourceRead {
        let source = (origin.origin_topic_id, origin.origin_partition);
        match pair_of(source.0) {
            None => return SourceRead::Settle("unknown topic".into()),
            // A record read from a twin has nowhere further to go.
            Some((_, true)) => return SourceRead::Settle("the record is a dead letter".into()),
            Some((_, false)) => {}
        }
        if self.partitions.get((source.0 + 1, source.1)).is_none() {
            return SourceRead::Settle("no twin".into());
        }
        let Some(part) = self.partitions.get_mut(source) else {
            return SourceRead::Settle("no partition".into());
        };
        match part.log.read_one(origin.origin_sequence) {
            Ok(Some(r)) => SourceRead::Record(r.key.to_vec(), r.value.to_vec()),
            Ok(None) => SourceRead::Settle("retention removed the record".into()),
            Err(e @ StorageError::Corrupt { .. }) => SourceRead::Settle(e.to_string()),
            Err(e) => {
                log::warn!("dead letter of topic {} waits: {e}", source.0);
                SourceRead::Retry
            }
        }
    }

    /// Appends again the dead letters that could not be (housekeeping, once a second).
    pub(super) fn retry_dead_letters(&mut self, now: Now) {
        for (group_id, origin) in std::mem::take(&mut self.consume.dead_letter_retries) {
            self.dead_letter(group_id, origin, now);
        }
    }
}
