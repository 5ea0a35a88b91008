//! The group positions as a cluster node's applied log says them (`docs/REPLICATION.md`
//! §4, "Operator changes"; docs/DECISIONS.md "Admin writes"): what every follower holds
//! at the same index, kept on the leader too, beside its live groups.
//!
//! A leader's live positions run ahead of its log: acknowledgements not proposed yet,
//! and a group reset or delete it makes when it proposes the entry. If that entry is
//! truncated after the leader is deposed, the live positions keep the change, and
//! replicated positions only raise them, so a reset forwards would make the node skip
//! committed records the day it leads again. A node that stops leading therefore gives
//! these positions, exactly, to the groups it changed for entries not applied yet
//! (`Coordinator::follow_replicated`): it may redeliver what their members acknowledged
//! and no BATCH carried, never skip. Its other groups keep their own positions, which
//! only acknowledgements moved, so that no position moves back at a failover. They are
//! also what the node makes durable, in its positions file and in a snapshot
//! (`broker::durable_positions`): read back as applied state, the live ones would bring
//! a truncated change back after a restart or an INSTALL.

use std::collections::BTreeMap;

use crate::consume::GroupPosition;

/// (group, topic id, partition) → committed position.
#[derive(Default)]
pub(super) struct AppliedPositions(BTreeMap<(Vec<u8>, u16, u16), u64>);

impl AppliedPositions {
    /// What the node read back at start (the positions file, before any entry past the
    /// checkpoint is applied again).
    pub(super) fn from_start(positions: Vec<GroupPosition>) -> AppliedPositions {
        let held = positions.into_iter();
        AppliedPositions(
            held.map(|p| ((p.group, p.topic_id, p.partition), p.committed))
                .collect(),
        )
    }

    /// A BATCH's position: raised only, as on a follower (`Coordinator::restore_position`).
    pub(super) fn raise(&mut self, group: &[u8], topic_id: u16, partition: u16, committed: u64) {
        let at = (self.0)
            .entry((group.to_vec(), topic_id, partition))
            .or_insert(committed);
        *at = (*at).max(committed);
    }

    /// An applied reset: `(partition, next delivery)`, lower or higher.
    pub(super) fn reset(&mut self, group: &[u8], topic_id: u16, targets: &[(u16, u64)]) {
        for &(p, next) in targets {
            let key = (group.to_vec(), topic_id, p);
            self.0.insert(key, next.saturating_sub(1));
        }
    }

    /// An applied group delete or expiry.
    pub(super) fn delete(&mut self, group: &[u8], topic_id: u16) {
        (self.0).retain(|(g, t, _), _| !(g == group && *t == topic_id));
    }

    /// An applied purge: the topic's groups move past the records below `first` on
    /// `partition` (`Coordinator::purged`).
    pub(super) fn purged(&mut self, topic_id: u16, partition: u16, first: u64) {
        let mut groups: Vec<Vec<u8>> = (self.0.keys())
            .filter(|(_, t, _)| *t == topic_id)
            .map(|(g, _, _)| g.clone())
            .collect();
        groups.dedup();
        for group in groups {
            let at = self.0.entry((group, topic_id, partition)).or_default();
            *at = (*at).max(first.saturating_sub(1));
        }
    }

    /// An applied topic delete: its groups go.
    pub(super) fn topic_deleted(&mut self, topic_id: u16) {
        self.0.retain(|(_, t, _), _| *t != topic_id);
    }

    pub(super) fn positions(&self) -> Vec<GroupPosition> {
        let held = self.0.iter();
        held.map(|((group, topic_id, partition), &committed)| GroupPosition {
            group: group.clone(),
            topic_id: *topic_id,
            partition: *partition,
            committed,
        })
        .collect()
    }
}
