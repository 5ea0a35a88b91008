//! Operator changes in a cluster (issue 15; `docs/REPLICATION.md` §4, docs/DECISIONS.md
//! "Admin writes"): a topic purge, a group delete or reset goes through the raft log as
//! an ADMIN entry (`replica::entry`), as DECLARE and DELETE go as REGISTRY entries, and
//! every node applies it at its index.
//!
//! - **Leader, proposal**: only a serving leader takes one (a follower answers with the
//!   gate's NOT_LEADER, naming the leader). The pass's records are proposed first, so
//!   the entry's numbers count every record proposed before it; the leader resolves
//!   them then: a purge's per-partition bound (the records below it go), a reset's
//!   targets (`earliest`, `latest`, `sequence:N`, `time:T` become sequences), a
//!   delete's tombstone marks (where the `.dlq` twin's proposed records end), so every
//!   node applies the same ones whatever it holds when it applies them. A group change
//!   is also made at once in the leader's live groups, as a single node makes it: the
//!   group had no member and nothing in flight (checked first), and from then on its
//!   acknowledgements start from the change, so the positions the leader's BATCHes carry
//!   are older than the entry before it and newer after, in log order. A purge waits
//!   for apply: records removed before commit could not be brought back.
//! - **Every node, apply**: a purge drops the partitions' records below the bound
//!   (`PartitionLog::purge_below`: applied again after a restart it drops no later
//!   record) and moves the groups past them; a delete removes the group's positions
//!   and buries it (its tombstone, `broker::positions`); a reset sets the positions to
//!   the targets, lower or not (`Coordinator::replicated_reset`), where a BATCH only
//!   raises them. The leader that made the group change when proposing leaves its live
//!   groups alone. Every node also records the change in its applied positions
//!   (`replica::applied`), which the groups a leader changed for entries not applied
//!   yet take when it stops leading: a change truncated with its entry does not outlive
//!   that leader's term.
//! - **Answer**: the leader answers the operator once the entry is applied there and
//!   durable, as a single node does (the positions write, the purge's file job); a
//!   proposal that fails (truncated, deposed, `--replication-timeout`) is answered with
//!   its 0x6xxx code.
//!
//! A restart applies the entries after its checkpoint again, in order, so a reset or a
//! delete lands between the BATCH positions before and after it as the first time; the
//! positions file and a snapshot hold the applied positions (`broker::durable_positions`),
//! so neither brings back a change whose entry did not commit, and the entries after
//! them replay on top.

use super::entry::{AdminChange, EntryData};
use super::machine::{Replicated, Waiter};
use crate::broker::manage::{
    group_refusal, Change, ChangeDone, ManageError, ManageErrorKind, ResetTo,
};
use crate::broker::{Broker, ConnRef, Now, PartitionKey};
use crate::wire::ErrorCode;

/// The waiter of an ADMIN proposal: no connection has this id and serial; its slot is
/// the operator's ticket.
pub(super) const ADMIN_CONN: ConnRef = ConnRef {
    id: u32::MAX,
    serial: u64::MAX,
};

fn cluster_error(code: ErrorCode, message: String) -> ManageError {
    ManageError {
        kind: ManageErrorKind::Cluster(code),
        message,
    }
}

/// The gate's refusal as an operator reads it.
fn not_served(code: ErrorCode, text: String) -> ManageError {
    let message = match code {
        ErrorCode::NotLeader if text.starts_with("leader ") => format!(
            "this node is not the leader; {text} (node id, client address): send the \
             change to that node's admin listener"
        ),
        _ => format!("this node takes no change now: {text}"),
    };
    cluster_error(code, message)
}

impl Broker {
    /// [`Broker::change`] on a cluster node: an ADMIN proposal on the serving leader.
    pub(in crate::broker) fn change_replicated(
        &mut self,
        ticket: u64,
        change: &Change,
        now: Now,
    ) -> Result<(), ManageError> {
        let c = self.cluster_mut();
        c.gate(now.mono_ms)
            .map_err(|(code, text)| not_served(code, text))?;
        if let Err(r) = c.replica.check_replicas() {
            return Err(cluster_error(r.code, r.text));
        }
        // The records of this pass take their entry ahead of this one, so the numbers
        // resolved below count every record proposed before it.
        self.propose_pass(now);
        if let Err((code, text)) = self.cluster_mut().gate(now.mono_ms) {
            return Err(not_served(code, text));
        }
        let admin = self.admin_entry(change)?;
        let waiter = Waiter {
            conn: ADMIN_CONN,
            slot: ticket,
            part: None,
        };
        let entry = EntryData::Admin(admin);
        let c = self.cluster_mut();
        let index = (c.replica.propose(&entry, vec![waiter], now.mono_ms))
            .map_err(|r| cluster_error(r.code, r.text))?;
        c.admin_tickets.insert(ticket, index);
        let EntryData::Admin(admin) = entry else {
            unreachable!("built above")
        };
        match admin {
            AdminChange::Purge { .. } | AdminChange::GroupExpire { .. } => {}
            AdminChange::GroupDelete {
                topic_id, group, ..
            } => {
                c.admin_made.insert(index, (group.clone(), topic_id));
                c.resend_positions(&group, topic_id);
                let (coordinator, _) = self.consume.parts_mut();
                let deleted = coordinator.delete_group((&group, topic_id));
                deleted.expect("checked in this call");
            }
            AdminChange::GroupReset {
                topic_id,
                group,
                targets,
                ..
            } => {
                c.admin_made.insert(index, (group.clone(), topic_id));
                c.resend_positions(&group, topic_id);
                let (coordinator, _) = self.consume.parts_mut();
                let reset = coordinator.reset_group((&group, topic_id), &targets);
                reset.expect("checked in this call");
            }
        }
        Ok(())
    }

    /// The entry of `change`, its numbers resolved now; refusals as on a single node.
    fn admin_entry(&mut self, change: &Change) -> Result<AdminChange, ManageError> {
        let changeable = |b: &Broker, group: &str, topic: &str, topic_id| {
            let coordinator = b.consume.coordinator();
            (coordinator.check_changeable(group.as_bytes(), topic_id))
                .map_err(|r| group_refusal(r, group, topic))
        };
        Ok(match change {
            Change::Purge { topic } => {
                let (topic_id, count, _) = self.topic_named(topic)?;
                let below = (0..count)
                    .map(|p| (p, self.proposed_next((topic_id, p))))
                    .collect();
                AdminChange::Purge {
                    topic_id,
                    topic: topic.as_bytes().to_vec(),
                    below,
                }
            }
            Change::DeleteGroup { group, topic } => {
                let (topic_id, count, _) = self.topic_named(topic)?;
                changeable(self, group, topic, topic_id)?;
                // The group's dead letters proposed so far lie below; a group of this
                // name created after the delete writes above.
                let twin_id = crate::wire::dlq_twin_id(topic_id);
                let marks = (0..count)
                    .map(|p| (p, self.proposed_next((twin_id, p))))
                    .collect();
                AdminChange::GroupDelete {
                    topic_id,
                    topic: topic.as_bytes().to_vec(),
                    group: group.as_bytes().to_vec(),
                    marks,
                }
            }
            Change::ResetGroup {
                group,
                topic,
                to,
                partition,
            } => {
                let mut targets = self.reset_targets(topic, *to, *partition)?;
                let (topic_id, _, _) = self.topic_named(topic)?;
                changeable(self, group, topic, topic_id)?;
                // Records proposed and not applied yet are held by the time the entry
                // applies: "latest" is past them, a sequence among them is kept.
                for (p, next) in &mut targets {
                    let end = self.proposed_next((topic_id, *p));
                    match *to {
                        ResetTo::Latest => *next = end,
                        ResetTo::Sequence(n) => *next = (*next).max(n.min(end)),
                        ResetTo::Earliest | ResetTo::TimeMs(_) => {}
                    }
                }
                AdminChange::GroupReset {
                    topic_id,
                    topic: topic.as_bytes().to_vec(),
                    group: group.as_bytes().to_vec(),
                    targets,
                }
            }
        })
    }

    /// The sequence the next record of `key` proposed after now takes, on a serving
    /// leader that proposed its pass: past what is applied and what is proposed.
    fn proposed_next(&self, key: PartitionKey) -> u64 {
        let applied = self
            .partitions
            .get(key)
            .map_or(0, |p| p.log.next_sequence());
        let c = self.cluster.as_deref().expect("cluster mode");
        applied.max(c.proposed_end(key).unwrap_or(0))
    }

    /// The replica's answer for an ADMIN proposal: an OK waits for apply, which answers
    /// once the change is durable; a failure is the operator's answer, unless apply
    /// came first.
    pub(super) fn admin_waiter(&mut self, ticket: u64, result: Result<Replicated, ErrorCode>) {
        let Err(code) = result else {
            return;
        };
        if self.cluster_mut().admin_tickets.remove(&ticket).is_none() {
            return;
        }
        let text = super::cluster::waiter_text(code);
        self.manage_answer(ticket, Err(cluster_error(code, text)));
    }

    /// An ADMIN entry committed: applied here as on every node; its ticket, on the
    /// leader that proposed it, is answered once the change is durable.
    pub(super) fn apply_admin(&mut self, index: u64, change: AdminChange, now: Now) {
        let c = self.cluster_mut();
        let ticket = (c.admin_tickets.iter())
            .find(|&(_, &i)| i == index)
            .map(|(&t, _)| t);
        if let Some(t) = ticket {
            c.admin_tickets.remove(&t);
        }
        let made_here = c.admin_made.remove(&index).is_some();
        let (AdminChange::Purge {
            topic_id, topic, ..
        }
        | AdminChange::GroupDelete {
            topic_id, topic, ..
        }
        | AdminChange::GroupReset {
            topic_id, topic, ..
        }
        | AdminChange::GroupExpire {
            topic_id, topic, ..
        }) = &change;
        let (topic_id, name) = (*topic_id, String::from_utf8_lossy(topic).into_owned());
        // A restart applies again entries whose topic a later entry deleted, and whose
        // id a later DECLARE may have given to another topic.
        let count = match self.topic_named(&name) {
            Ok((id, count, _)) if id == topic_id => count,
            _ => {
                if let Some(t) = ticket {
                    let why = format!("no topic {name}");
                    let kind = ManageErrorKind::UnknownTopic;
                    let error = ManageError { kind, message: why };
                    self.manage_answer(t, Err(error));
                }
                return;
            }
        };
        match change {
            AdminChange::Purge { below, .. } => {
                self.apply_purge(ticket, (topic_id, count), &name, &below, now)
            }
            AdminChange::GroupDelete { group, marks, .. } => {
                self.cluster_mut().applied.delete(&group, topic_id);
                if !made_here {
                    let (coordinator, _) = self.consume.parts_mut();
                    coordinator.replicated_delete((&group, topic_id));
                }
                match marks.is_empty() {
                    true => self.bury_group(&group, topic_id, count),
                    false => self.bury_group_at(&group, topic_id, marks),
                }
                if let Some(t) = ticket {
                    self.wait_for_positions(t, ChangeDone::GroupDeleted, now);
                }
            }
            AdminChange::GroupReset { group, targets, .. } => {
                self.cluster_mut().applied.reset(&group, topic_id, &targets);
                if !made_here {
                    let (coordinator, _) = self.consume.parts_mut();
                    coordinator.replicated_reset((&group, topic_id), &targets, now.mono_ms);
                }
                if let Some(t) = ticket {
                    self.wait_for_positions(t, ChangeDone::GroupReset(targets), now);
                }
            }
            AdminChange::GroupExpire { group, .. } => self.apply_group_expiry(&group, topic_id),
        }
    }

    /// Every node forgets the group's positions; its live state on the leader that
    /// proposed the expiry is already gone.
    fn apply_group_expiry(&mut self, group: &[u8], topic_id: u16) {
        self.cluster_mut().applied.delete(group, topic_id);
        let (coordinator, _) = self.consume.parts_mut();
        coordinator.replicated_expiry((group, topic_id));
    }

    /// The leader's coordinator removed a group after `--group-ttl` without members:
    /// every node's applied positions, which a node that comes to lead restores and
    /// which the positions file and snapshots hold, drop it too, or a failover or a
    /// restart would bring back a group the leader let go (`docs/REPLICATION.md` §7.4).
    /// Nobody waits for it: on a leader that cannot propose now the group stays in the
    /// applied positions, comes back as a group without members where it is restored,
    /// and expires again a `--group-ttl` later.
    pub(in crate::broker) fn propose_group_expiry(
        &mut self,
        group: Vec<u8>,
        topic_id: u16,
        now: Now,
    ) {
        let registry = self.topics.registry();
        let Some((pair, twin)) = registry.by_topic_id(topic_id) else {
            return; // its topic is gone, and its positions with it
        };
        let topic = pair.name_of(twin);
        let c = self.cluster_mut();
        // A group of this name created later starts from its own positions.
        c.resend_positions(&group, topic_id);
        if c.gate(now.mono_ms).is_err() {
            return;
        }
        let entry = EntryData::Admin(AdminChange::GroupExpire {
            topic_id,
            topic: topic.into_bytes(),
            group,
        });
        if let Err(refused) = c.replica.propose(&entry, Vec::new(), now.mono_ms) {
            log::debug!("group expiry not proposed: {}", refused.text);
        }
    }

    /// Drops every record below its partition's bound and moves the groups past them;
    /// the file work goes to the pool as a single node's purge does.
    fn apply_purge(
        &mut self,
        ticket: Option<u64>,
        (topic_id, count): (u16, u16),
        name: &str,
        below: &[(u16, u64)],
        now: Now,
    ) {
        let (mut files, mut report) = (Vec::new(), Vec::new());
        for &(p, below) in below.iter().filter(|&&(p, _)| p < count) {
            let key = (topic_id, p);
            let Some(part) = self.partitions.get_mut(key) else {
                continue;
            };
            let purged = match part.log.purge_below(below) {
                Ok(purged) => purged,
                Err(e) => {
                    let why = format!("purging topic {name} partition {p}: {e}");
                    if let Some(t) = ticket {
                        let kind = ManageErrorKind::Storage;
                        let message = why.clone();
                        self.manage_answer(t, Err(ManageError { kind, message }));
                    }
                    // The node's records no longer follow the log: as a BATCH that
                    // cannot be applied.
                    return self.cluster_failed(why);
                }
            };
            let first = part.log.first_sequence();
            let (coordinator, _) = self.consume.parts_mut();
            coordinator.purged(topic_id, p, first);
            self.cluster_mut().applied.purged(topic_id, p, first);
            report.push((p, first, purged.as_ref().map_or(0, |f| f.records)));
            files.extend(purged.map(|f| (key, f)));
        }
        self.submit_purge(ticket, report, files, now);
    }
}
