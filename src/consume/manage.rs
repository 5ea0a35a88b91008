//! What an operator does to groups through the admin listener (`src/admin/manage.rs`):
//! delete a group, reset its positions, and the groups' side of a topic purge.
//!
//! Like Kafka's `kafka-consumer-groups --delete/--reset-offsets`, a group is changed
//! only while it has no member: a member holds deliveries and partitions whose
//! positions the change would pull from under it (docs/DECISIONS.md, "Admin writes").
//! A group counts whether it lives (members left, `--group-ttl` not yet run out) or
//! was read back at start and not claimed by a SUB yet.

use super::{Coordinator, Timer};

/// Why a group change was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupRefusal {
    /// No such group on that topic.
    Unknown,
    /// It has this many members (they must leave first).
    HasMembers(usize),
    /// Deliveries or dead-letter appends are still in flight; they end within
    /// `--ack-wait` or one fsync.
    InFlight,
}

impl Coordinator {
    /// Whether the group `(name, topic_id)` exists, live or restored.
    pub fn group_exists(&self, name: &[u8], topic_id: u16) -> bool {
        let key = (name.to_vec(), topic_id);
        self.group_ids.contains_key(&key) || self.restored.contains_key(&key)
    }

    /// May the group be changed now? (`Unknown`, members, things in flight.)
    fn changeable(&self, name: &[u8], topic_id: u16) -> Result<Option<u16>, GroupRefusal> {
        let key = (name.to_vec(), topic_id);
        let Some(&gid) = self.group_ids.get(&key) else {
            return match self.restored.contains_key(&key) {
                true => Ok(None),
                false => Err(GroupRefusal::Unknown),
            };
        };
        let g = &self.groups[&gid];
        if !g.members.is_empty() {
            return Err(GroupRefusal::HasMembers(g.members.len()));
        }
        if !g.idle() {
            return Err(GroupRefusal::InFlight);
        }
        Ok(Some(gid))
    }

    /// Moves the group's positions: for each `(partition, next)` the next delivery is
    /// `next` (the committed position `next - 1`). Partitions not named keep theirs.
    pub fn reset_group(
        &mut self,
        (name, topic_id): (&[u8], u16),
        targets: &[(u16, u64)],
    ) -> Result<(), GroupRefusal> {
        match self.changeable(name, topic_id)? {
            Some(gid) => {
                let g = self.groups.get_mut(&gid).expect("found");
                for &(p, next) in targets {
                    if usize::from(p) < g.partitions.len() {
                        g.reset_partition(&mut self.sh, usize::from(p), next);
                    }
                }
            }
            None => {
                let r = self.restored.get_mut(&(name.to_vec(), topic_id));
                let r = r.expect("found");
                for &(p, next) in targets {
                    r.committed.insert(p, next.saturating_sub(1));
                    if let Some(dead) = r.dead_lettered.get_mut(&p) {
                        dead.retain(|&s| s >= next);
                    }
                }
            }
        }
        Ok(())
    }

    /// Removes the group and its positions: it no longer holds a `--max-groups` slot,
    /// and a later SUB of the same name starts by its start policy.
    pub fn delete_group(&mut self, (name, topic_id): (&[u8], u16)) -> Result<(), GroupRefusal> {
        match self.changeable(name, topic_id)? {
            Some(gid) => {
                let g = self.groups.remove(&gid).expect("found");
                g.clear_timers(&mut self.sh);
                if let Some(at_ms) = g.expires_at_ms {
                    self.sh
                        .timer_clear(at_ms, Timer::GroupExpiry { group_id: gid });
                }
                self.group_ids.remove(&(g.name, g.topic_id));
                self.sh.dirty.remove(&gid);
                self.free_group_ids.insert(gid);
                for cs in self.conns.values_mut() {
                    cs.subs.retain(|_, s| s.group_id != gid);
                }
            }
            None => {
                self.restored.remove(&(name.to_vec(), topic_id));
            }
        }
        Ok(())
    }

    /// Whether [`Coordinator::reset_group`] or [`Coordinator::delete_group`] would take
    /// the group now (a cluster leader asks before it proposes the change).
    pub fn check_changeable(&self, name: &[u8], topic_id: u16) -> Result<(), GroupRefusal> {
        self.changeable(name, topic_id).map(|_| ())
    }

    /// A reset applied from the raft log (`broker::replica::admin`) on a node that did
    /// not make it when proposing it: the positions are set to the targets, lower or
    /// higher, not raised as replicated positions are (`restore_position`), so a reset
    /// backwards holds until a later entry moves them. A group this node does not know
    /// (its positions were not replicated yet) is restored at the targets.
    pub fn replicated_reset(
        &mut self,
        (name, topic_id): (&[u8], u16),
        targets: &[(u16, u64)],
        now_ms: u64,
    ) {
        match self.changeable(name, topic_id) {
            Ok(_) => self
                .reset_group((name, topic_id), targets)
                .expect("changeable"),
            Err(GroupRefusal::Unknown) => {
                let r = self.restored_entry(name, topic_id, now_ms);
                let r = r.expect("not a live group");
                for &(p, next) in targets {
                    r.committed.insert(p, next.saturating_sub(1));
                }
            }
            // Only a serving leader has live groups, and it made its own changes when it
            // proposed them; one that leads a new term ended its groups first, and
            // serves no SUB before it applied its log. Not expected, then: a live
            // group's state wins, as over any replicated position.
            Err(why) => log::warn!(
                "reset of group {} not applied to its live state: {why:?}",
                String::from_utf8_lossy(name)
            ),
        }
    }

    /// A group delete applied from the raft log on a node that did not make it when
    /// proposing it (as [`Coordinator::replicated_reset`]).
    pub fn replicated_delete(&mut self, (name, topic_id): (&[u8], u16)) {
        match self.delete_group((name, topic_id)) {
            Ok(()) | Err(GroupRefusal::Unknown) => {}
            Err(why) => log::warn!(
                "delete of group {} not applied to its live state: {why:?}",
                String::from_utf8_lossy(name)
            ),
        }
    }

    /// A group expiry applied from the raft log (`broker::replica::admin`): a node
    /// forgets the positions it kept for the group, as its leader's coordinator did. The
    /// records its dead letters settled stay known, as a single node reads them back
    /// from the twin at its next start: a restart applies the entry again over what that
    /// read found, which may include a later group's of the same name. A live group of
    /// that name was created by this leader after it proposed the expiry (a node serves
    /// no SUB before it applied its log), so it stays.
    pub fn replicated_expiry(&mut self, (name, topic_id): (&[u8], u16)) {
        let key = (name.to_vec(), topic_id);
        if self.group_ids.contains_key(&key) {
            return;
        }
        if let Some(r) = self.restored.get_mut(&key) {
            r.committed.clear();
            if r.dead_lettered.is_empty() {
                self.restored.remove(&key);
            }
        }
    }

    /// The records of `(topic_id, partition)` below `first` were purged: every group on
    /// the topic moves past them (`Group::purged`), restored positions too.
    pub fn purged(&mut self, topic_id: u16, partition: u16, first: u64) {
        for g in self.groups.values_mut().filter(|g| g.topic_id == topic_id) {
            g.purged(&mut self.sh, usize::from(partition), first);
        }
        for ((_, t), r) in self.restored.iter_mut() {
            if *t != topic_id {
                continue;
            }
            let committed = r.committed.entry(partition).or_default();
            *committed = (*committed).max(first.saturating_sub(1));
            if let Some(dead) = r.dead_lettered.get_mut(&partition) {
                dead.retain(|&s| s >= first);
            }
        }
    }
}
