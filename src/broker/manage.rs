//! Operator changes and descriptions, asked for through the admin listener
//! (`src/admin/manage.rs`): describe a topic, delete a group, reset a group's positions,
//! purge a topic. docs/DECISIONS.md ("Admin writes") says what each means.
//!
//! A change is answered only once it is durable: it carries a `ticket` from the caller,
//! and its outcome comes back from [`Broker::take_manage_done`] after the positions
//! write (group changes) or the purge job (`log/purge.rs`) completed. A change refused
//! up front is answered at once, and changes nothing.
//!
//! A cluster node takes a change only as the serving leader, and through the raft log
//! (`broker::replica::admin`): every node applies it, and the leader answers it once
//! applied here and durable as above.

use std::collections::HashMap;

use crate::consume::GroupRefusal;
use crate::log::{PartitionLog, PurgeFiles, StorageError};
use crate::wire::ErrorCode;

use super::jobs::{DurableJob, SnapshotWrite, Work};
use super::positions::GroupTombstone;
use super::{Broker, Now, PartitionKey};

/// Reads one time lookup may make (binary search steps, damaged records stepped over):
/// it runs on the reactor thread, which must never loop without bound.
pub const TIME_LOOKUP_READS_MAX: u32 = 256;

/// Where a reset puts a group's next delivery, per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    /// The oldest retained record.
    Earliest,
    /// Past the newest record: only records published after the reset.
    Latest,
    /// This sequence, clamped to what the partition holds.
    Sequence(u64),
    /// The first record stamped at or after this wall-clock time (ms since the epoch);
    /// past the newest when there is none.
    TimeMs(u64),
}

/// An operator change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    DeleteGroup {
        group: String,
        topic: String,
    },
    ResetGroup {
        group: String,
        topic: String,
        to: ResetTo,
        partition: Option<u16>,
    },
    /// Purges `topic`, which may be a source topic or a `.dlq` twin (each alone).
    Purge {
        topic: String,
    },
}

/// Why a change or a description was refused; the admin listener maps it to an HTTP
/// status and an error name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManageErrorKind {
    UnknownTopic,
    UnknownPartition,
    UnknownGroup,
    GroupHasMembers,
    GroupBusy,
    /// A cluster node that cannot take the change now, with the code its client ops get:
    /// NOT_LEADER (the message names the leader), LEADER_UNKNOWN, NOT_ENOUGH_REPLICAS,
    /// or, once proposed, what the raft entry met (`man/mortarmq.7`, the 0x6xxx codes).
    Cluster(ErrorCode),
    /// The change was made in memory but writing it failed.
    Storage,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManageError {
    pub kind: ManageErrorKind,
    pub message: String,
}

fn refused<T>(kind: ManageErrorKind, message: String) -> Result<T, ManageError> {
    Err(ManageError { kind, message })
}

/// What a change did, once durable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChangeDone {
    GroupDeleted,
    /// Per partition: the next sequence the group delivers.
    GroupReset(Vec<(u16, u64)>),
    /// Per partition: the new first sequence and the records dropped.
    Purged(Vec<(u16, u64, u64)>),
}

/// One partition in a topic description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionDescription {
    pub partition: u16,
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub bytes: u64,
    pub segments: u32,
    pub poisoned: bool,
}

/// One group on a described topic, with its committed position and lag per partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupOnTopic {
    pub name: String,
    pub members: usize,
    /// (partition, committed, lag in records).
    pub partitions: Vec<(u16, u64, u64)>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub topic_id: u16,
    pub dlq_twin: bool,
    /// The other topic of the pair (the twin of a source, the source of a twin).
    pub paired_with: String,
    pub segment_size_bytes: u64,
    pub retention_size_bytes: u64,
    pub retention_age_ms: u64,
    pub partitions: Vec<PartitionDescription>,
    pub groups: Vec<GroupOnTopic>,
}

/// Changes waiting to be durable: ticket → what to answer when they are.
#[derive(Default)]
pub struct ManageWaits {
    waiting: HashMap<u64, ChangeDone>,
    done: Vec<(u64, Result<ChangeDone, ManageError>)>,
    /// Purge file jobs submitted and not back: a cluster checkpoint waits for them, or
    /// a crash could bring back records whose purge entry it compacted.
    purges_running: usize,
}

impl Broker {
    /// The topic `name` (a source or a twin): (topic id, partition count, is twin).
    pub(super) fn topic_named(&self, name: &str) -> Result<(u16, u16, bool), ManageError> {
        let registry = self.topics.registry();
        let found = match name.strip_suffix(crate::wire::DLQ_SUFFIX) {
            Some(source) => registry.lookup(source).map(|p| (p.twin_id(), p, true)),
            None => None,
        };
        let found = found.or_else(|| registry.lookup(name).map(|p| (p.source_id(), p, false)));
        match found {
            Some((id, pair, twin)) if self.topics.usable(id).is_some() => {
                Ok((id, pair.partition_count, twin))
            }
            _ => refused(ManageErrorKind::UnknownTopic, format!("no topic {name}")),
        }
    }

    /// `GET /topics/{name}`: partitions, retention and the groups on it with their lag.
    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, ManageError> {
        let (topic_id, count, dlq_twin) = self.topic_named(name)?;
        let partitions: Vec<PartitionDescription> = (0..count)
            .filter_map(|i| self.partitions.get((topic_id, i)))
            .map(|p| {
                let st = p.log.stats();
                PartitionDescription {
                    partition: p.index,
                    first_sequence: st.first_sequence,
                    last_sequence: st.written_sequence,
                    bytes: st.bytes,
                    segments: st.segments,
                    poisoned: st.poisoned,
                }
            })
            .collect();
        let config = self.config.log;
        let last = |p: u16| {
            partitions
                .get(usize::from(p))
                .map_or(0, |d| d.last_sequence)
        };
        let groups = (self.coordinator().snapshot().groups.into_iter())
            .filter(|g| g.topic_id == topic_id)
            .map(|g| GroupOnTopic {
                name: String::from_utf8_lossy(&g.name).into_owned(),
                members: g.members.len(),
                partitions: (g.partitions.iter())
                    .map(|p| {
                        let lag = last(p.partition).saturating_sub(p.committed);
                        (p.partition, p.committed, lag)
                    })
                    .collect(),
            })
            .collect();
        let paired_with = match dlq_twin {
            true => name
                .strip_suffix(crate::wire::DLQ_SUFFIX)
                .unwrap_or(name)
                .to_string(),
            false => format!("{name}{}", crate::wire::DLQ_SUFFIX),
        };
        Ok(TopicDescription {
            name: name.to_string(),
            topic_id,
            dlq_twin,
            paired_with,
            segment_size_bytes: config.segment_size_bytes,
            retention_size_bytes: config.retention_size_bytes,
            retention_age_ms: config.retention_age_ms,
            partitions,
            groups,
        })
    }

    /// Starts a change; `Err` when it is refused (nothing changed). On `Ok` its outcome
    /// comes from [`Broker::take_manage_done`] under `ticket` once durable.
    pub fn change(&mut self, ticket: u64, change: &Change, now: Now) -> Result<(), ManageError> {
        if self.cluster.is_some() {
            return self.change_replicated(ticket, change, now);
        }
        match change {
            Change::DeleteGroup { group, topic } => {
                let (topic_id, count, _) = self.topic_named(topic)?;
                let (coordinator, _) = self.consume.parts_mut();
                let key = (group.as_bytes(), topic_id);
                let refusal = |r| group_refusal(r, group, topic);
                coordinator.delete_group(key).map_err(refusal)?;
                self.bury_group(group.as_bytes(), topic_id, count);
                self.wait_for_positions(ticket, ChangeDone::GroupDeleted, now);
            }
            Change::ResetGroup {
                group,
                topic,
                to,
                partition,
            } => {
                let targets = self.reset_targets(topic, *to, *partition)?;
                let (topic_id, _, _) = self.topic_named(topic)?;
                let (coordinator, _) = self.consume.parts_mut();
                let key = (group.as_bytes(), topic_id);
                let refusal = |r| group_refusal(r, group, topic);
                coordinator.reset_group(key, &targets).map_err(refusal)?;
                self.wait_for_positions(ticket, ChangeDone::GroupReset(targets), now);
            }
            Change::Purge { topic } => self.purge(ticket, topic, now)?,
        }
        Ok(())
    }

    /// The deleted group's tombstone (`positions.rs`), so start-up does not read it back
    /// from the dead letters it left in the twin; it is on disk with the write the delete
    /// waits for. Spent tombstones are dropped here, at the rate of operator deletes.
    pub(super) fn bury_group(&mut self, group: &[u8], topic_id: u16, partition_count: u16) {
        let twin_id = crate::wire::dlq_twin_id(topic_id);
        let marks = (0..partition_count)
            .filter_map(|p| Some((p, self.partitions.get((twin_id, p))?.log.next_sequence())))
            .collect();
        self.bury_group_at(group, topic_id, marks);
    }

    /// [`Broker::bury_group`] at marks resolved elsewhere (a cluster leader's, when it
    /// proposed the delete); a partition whose twin holds nothing below its mark needs
    /// none.
    pub(super) fn bury_group_at(&mut self, group: &[u8], topic_id: u16, marks: Vec<(u16, u64)>) {
        let twin_id = crate::wire::dlq_twin_id(topic_id);
        let marks = (marks.into_iter())
            .filter(|&(p, mark)| {
                let part = self.partitions.get((twin_id, p));
                part.is_some_and(|part| part.log.first_sequence() < mark)
            })
            .collect();
        self.consume.drop_spent_tombstones(&self.partitions);
        let (_, positions) = self.consume.parts_mut();
        positions.add_tombstone(GroupTombstone {
            group: group.to_vec(),
            topic_id,
            marks,
        });
    }

    /// Per partition (all, or the one named), the next sequence `to` means now.
    pub(super) fn reset_targets(
        &mut self,
        topic: &str,
        to: ResetTo,
        only: Option<u16>,
    ) -> Result<Vec<(u16, u64)>, ManageError> {
        let (topic_id, count, _) = self.topic_named(topic)?;
        if let Some(p) = only.filter(|&p| p >= count) {
            let why = format!("topic {topic} has no partition {p} (partition_count {count})");
            return refused(ManageErrorKind::UnknownPartition, why);
        }
        let mut targets = Vec::new();
        for p in (0..count).filter(|&p| only.is_none_or(|o| o == p)) {
            let part = self.partitions.get_mut((topic_id, p)).expect("registered");
            let (first, end) = (part.log.first_sequence(), part.log.written_sequence() + 1);
            let next = match to {
                ResetTo::Earliest => first,
                ResetTo::Latest => end,
                ResetTo::Sequence(n) => n.clamp(first, end),
                ResetTo::TimeMs(t) => first_at_or_after(&mut part.log, t).map_err(|e| {
                    let why = format!("topic {topic} partition {p}: {e}");
                    ManageError {
                        kind: ManageErrorKind::Storage,
                        message: why,
                    }
                })?,
            };
            targets.push((p, next));
        }
        Ok(targets)
    }

    /// The change is made; it is answered once the positions file holds it.
    pub(super) fn wait_for_positions(&mut self, ticket: u64, done: ChangeDone, now: Now) {
        self.manage.waiting.insert(ticket, done);
        let (_, positions) = self.consume.parts_mut();
        positions.wait(ticket);
        self.write_waited_positions(now);
    }

    /// A positions write when an operator waits for one (and none is running).
    pub(super) fn write_waited_positions(&mut self, now: Now) {
        // `false`: only a waiting operator makes it run ahead of the interval.
        let write = self.positions_job(now, false);
        self.jobs.extend(write);
        self.submit_jobs();
        self.collect_positions_done();
    }

    /// Moves the operator waits the positions file ended into `manage.done`.
    fn collect_positions_done(&mut self) {
        let (_, positions) = self.consume.parts_mut();
        for (ticket, result) in positions.take_done() {
            let Some(done) = self.manage.waiting.remove(&ticket) else {
                continue;
            };
            let result = result.map(|()| done).map_err(|message| ManageError {
                kind: ManageErrorKind::Storage,
                message,
            });
            self.manage.done.push((ticket, result));
        }
    }

    /// Purges every partition of `topic` and submits the file work; the records are
    /// gone for readers at once, the answer waits for the files.
    fn purge(&mut self, ticket: u64, topic: &str, now: Now) -> Result<(), ManageError> {
        let (topic_id, count, _) = self.topic_named(topic)?;
        let mut files = Vec::new();
        let mut report = Vec::new();
        for p in 0..count {
            let key: PartitionKey = (topic_id, p);
            let part = self.partitions.get_mut(key).expect("registered");
            let purged = part.log.purge().map_err(|e| ManageError {
                kind: ManageErrorKind::Storage,
                message: format!("topic {topic} partition {p}: {e}"),
            })?;
            let first = part.log.first_sequence();
            let (coordinator, _) = self.consume.parts_mut();
            coordinator.purged(topic_id, p, first);
            report.push((p, first, purged.as_ref().map_or(0, |f| f.records)));
            files.extend(purged.map(|f| (key, f)));
        }
        self.submit_purge(Some(ticket), report, files, now);
        Ok(())
    }

    /// The file work of a purge made in memory, after the purged partitions' producer
    /// snapshots; `ticket`, if someone waits, is answered with `report` once it is done
    /// (at once when no file was involved).
    pub(super) fn submit_purge(
        &mut self,
        ticket: Option<u64>,
        report: Vec<(u16, u64, u64)>,
        files: Vec<(PartitionKey, PurgeFiles)>,
        now: Now,
    ) {
        if files.is_empty() {
            if let Some(ticket) = ticket {
                let done = Ok(ChangeDone::Purged(report));
                self.manage.done.push((ticket, done));
            }
            return;
        }
        if let Some(ticket) = ticket {
            let done = ChangeDone::Purged(report);
            self.manage.waiting.insert(ticket, done);
        }
        self.manage.purges_running += 1;
        let keys: Vec<PartitionKey> = files.iter().map(|(key, _)| *key).collect();
        let snapshots = self.partitions.purge_snapshots(&keys, now);
        let job = DurableJob {
            storage: std::sync::Arc::clone(&self.storage),
            work: Work::Purge {
                ticket,
                snapshots,
                files,
            },
        };
        self.sink.submit(job);
    }

    /// Purge file jobs not back yet.
    pub(super) fn purges_running(&self) -> bool {
        self.manage.purges_running > 0
    }

    /// Answers `ticket` now (a cluster change refused or failed after its proposal).
    pub(super) fn manage_answer(&mut self, ticket: u64, result: Result<ChangeDone, ManageError>) {
        self.manage.waiting.remove(&ticket);
        self.manage.done.push((ticket, result));
    }

    /// The purge job of `ticket` finished. A failed one left old segment files on disk
    /// that the partitions no longer know: a later purge or retention would remove newer
    /// ones in front of them, and a restart would cut the log at that gap (everything
    /// after it) as recovery does. So the partitions refuse writes and keep their files
    /// until a restart, which finds the old segments again, contiguous, and a cluster
    /// node stops: its restart applies the purge again (a checkpoint waits for purge jobs,
    /// so it did not pass the entry).
    pub(super) fn purge_done(
        &mut self,
        ticket: Option<u64>,
        (snapshots, files): (&[SnapshotWrite], &[(PartitionKey, PurgeFiles)]),
        result: &std::io::Result<()>,
    ) {
        self.manage.purges_running = self.manage.purges_running.saturating_sub(1);
        if result.is_ok() {
            self.partitions.snapshots_durable(snapshots);
        }
        if let Err(e) = result {
            log::error!("removing the files of purged records failed: {e}");
            for &(key, _) in files {
                if let Some(part) = self.partitions.get_mut(key) {
                    part.log.purge_failed(e);
                }
            }
            if self.cluster.is_some() {
                self.cluster_failed(format!("removing the files of purged records: {e}"));
            }
        }
        let Some((ticket, done)) = ticket.and_then(|t| Some((t, self.manage.waiting.remove(&t)?)))
        else {
            return;
        };
        let result = match result {
            Ok(()) => Ok(done),
            Err(e) => refused(
                ManageErrorKind::Storage,
                format!(
                    "removing the purged records' files failed: {e}; the partitions refuse \
                     writes until a restart, which finds the records again"
                ),
            ),
        };
        self.manage.done.push((ticket, result));
    }

    /// Changes that became durable (or failed to) since the last call.
    pub fn take_manage_done(&mut self) -> Vec<(u64, Result<ChangeDone, ManageError>)> {
        self.collect_positions_done();
        std::mem::take(&mut self.manage.done)
    }
}

pub(super) fn group_refusal(r: GroupRefusal, group: &str, topic: &str) -> ManageError {
    let (kind, message) = match r {
        GroupRefusal::Unknown => (
            ManageErrorKind::UnknownGroup,
            format!("no consumer group {group} on topic {topic}"),
        ),
        GroupRefusal::HasMembers(n) => (
            ManageErrorKind::GroupHasMembers,
            format!(
                "group {group} on topic {topic} has {n} member(s); stop its consumers \
                 (or wait for their sessions to end) and try again"
            ),
        ),
        GroupRefusal::InFlight => (
            ManageErrorKind::GroupBusy,
            format!(
                "group {group} on topic {topic} still has deliveries or dead letters in \
                 flight; try again in a moment"
            ),
        ),
    };
    ManageError { kind, message }
}

/// The first sequence of `log` whose record is stamped at or after `t_ms` (the next
/// sequence when none is). Binary search: timestamps are the broker's wall clock at
/// append, so they rise with sequences unless the clock was stepped back. A damaged
/// record counts as "at or after", so it is never a reason to start later.
pub fn first_at_or_after(log: &mut PartitionLog, t_ms: u64) -> Result<u64, StorageError> {
    let (mut lo, mut hi) = (log.first_sequence(), log.written_sequence() + 1);
    let mut reads = 0u32;
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let mut probe = mid;
        let mut stamp = None;
        while probe < hi && stamp.is_none() && reads < TIME_LOOKUP_READS_MAX {
            reads += 1;
            match log.read_one(probe) {
                Ok(Some(r)) => stamp = Some(r.timestamp_ms),
                Ok(None) | Err(StorageError::Corrupt { .. }) => probe += 1,
                Err(e) => return Err(e),
            }
        }
        match stamp {
            Some(ts) if ts < t_ms => lo = probe + 1,
            _ => hi = mid,
        }
    }
    Ok(lo)
}
