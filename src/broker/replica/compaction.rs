//! Journal compaction in a cluster (`docs/REPLICATION.md` §5.4). The leader proposes a
//! FLOOR entry, the lowest match index over every voter, once its journal has grown a
//! file past its checkpoint; every node that applies one checkpoints there: the segments
//! written since the last checkpoint are synced, the group positions written, then the
//! journal's checkpoint; the journal files wholly below it are removed, and start-up
//! applies from it on. No node compacts past what every voter held when the FLOOR was
//! proposed, so no leader, this one or a later one, has to send an entry it no longer
//! has. A voter that stays behind holds the floor, and so every journal, where it was,
//! until the journal passes `--journal-retain`: then the floor is the commit index and
//! that voter gets a snapshot (INSTALL, `docs/REPLICATION.md` §5.5).
//!
//! Depends on what `broker::replica::cluster` may.

use std::io;
use std::sync::Arc;

use super::entry::EntryData;
use crate::broker::jobs::{DurableJob, SegmentSync, SpareJobs, Work};
use crate::broker::{Broker, Now};
use crate::log::journal2::Checkpoint2Write;

/// How often a serving leader asks whether a FLOOR is due: each proposal is one small
/// entry, and a checkpoint on every node.
pub const FLOOR_INTERVAL_MS: u64 = 1_000;

/// A cluster node's compaction state.
#[derive(Debug, Default)]
pub struct Compaction {
    /// The highest FLOOR applied here: checkpoints go up to it, never past it.
    floor: u64,
    /// The highest FLOOR this node proposed.
    proposed: u64,
    next_proposal_ms: u64,
    in_flight: bool,
    /// A checkpoint failed since the last housekeeping: the next waits for it, as a single
    /// node's does (`GroupCommit`), rather than running again at once on a failing disk.
    failed: bool,
    spares: SpareJobs,
}

/// A [`Work::RaftCheckpoint`] back from the pool, taken apart.
pub struct CheckpointDone {
    pub syncs: Vec<SegmentSync>,
    pub positions: bool,
    pub positions_result: Option<io::Result<()>>,
    /// `None`: segment syncs alone.
    pub write: Option<Checkpoint2Write>,
    pub result: io::Result<()>,
}

impl CheckpointDone {
    /// `work` is a [`Work::RaftCheckpoint`] back from the pool with its `result`.
    pub fn new(work: Work, result: io::Result<()>) -> CheckpointDone {
        let Work::RaftCheckpoint {
            syncs,
            positions,
            positions_result,
            write,
        } = work
        else {
            unreachable!("a RaftCheckpoint")
        };
        CheckpointDone {
            syncs,
            positions: positions.is_some(),
            positions_result,
            write,
            result,
        }
    }
}

impl Compaction {
    /// A start: the checkpoint was taken at a FLOOR, so the floor is at least there.
    pub fn from_checkpoint(index: u64) -> Compaction {
        Compaction {
            floor: index,
            ..Compaction::default()
        }
    }

    /// Compaction never passes what every voter held nor what this node applied: the
    /// journal's `checkpoint` and `first_index` against the node's `applied` index.
    pub fn check(&self, checkpoint: u64, first_index: u64, applied: u64) {
        assert!(
            checkpoint <= applied,
            "checkpoint {checkpoint} past applied {applied}"
        );
        let floor = self.floor;
        assert!(
            checkpoint <= floor,
            "checkpoint {checkpoint} past the floor {floor}"
        );
        assert!(first_index <= checkpoint + 1, "entries lost");
    }
}

impl Broker {
    /// On a serving leader, at most every [`FLOOR_INTERVAL_MS`]: a FLOOR when the journal
    /// grew `--journal-file-size` past its checkpoint and the voters' lowest match moved
    /// past the last FLOOR. A refused proposal is tried again on the next turn.
    pub(super) fn propose_floor(&mut self, now: Now) {
        let file_bytes = self.config.journal_file_bytes;
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        if !c.serving() || now.mono_ms < c.compaction.next_proposal_ms {
            return;
        }
        c.compaction.next_proposal_ms = now.mono_ms + FLOOR_INTERVAL_MS;
        let Some(floor) = c.replica.compaction_floor() else {
            return;
        };
        let grown = c.replica.journal_bytes_since_checkpoint() >= file_bytes;
        let last = c.compaction.proposed.max(c.replica.checkpoint().index);
        if !grown || floor <= last {
            return;
        }
        let entry = EntryData::Floor(floor);
        if c.replica.propose(&entry, Vec::new(), now.mono_ms).is_ok() {
            c.compaction.proposed = floor;
        }
    }

    /// A FLOOR was applied (every node, in index order).
    pub(super) fn apply_floor(&mut self, floor: u64) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        c.compaction.floor = c.compaction.floor.max(floor);
    }

    /// At the end of a pass: a checkpoint at the FLOOR once it passed the last one, when
    /// nothing the checkpoint must cover is still being written (the registry, a topic's
    /// files, the positions) and no checkpoint runs. Between FLOORs, the segment syncs
    /// alone once a partition wrote too many files (`Partitions::segment_files_crowded`):
    /// closed segments keep their descriptors until synced, and small segments ran every
    /// node out of them at once (`docs/DECISIONS.md`, "Descriptors").
    pub(super) fn take_cluster_checkpoint(&mut self, now: Now) {
        let c = self.cluster.as_deref().expect("cluster mode");
        let floor = c.compaction.floor;
        // Apply passed the FLOOR's index, which is above the floor: only a node that
        // restarted from an older checkpoint and has not applied that far yet waits.
        let due = floor > c.replica.checkpoint().index && floor <= c.applied_index;
        let crowded = self.partitions.segment_files_crowded();
        let held = c.compaction.in_flight || c.compaction.failed || c.failed.is_some();
        if !(due || crowded) || held {
            return;
        }
        // A purge's files not gone yet could come back after a crash, and its entry
        // would not be applied again from past this checkpoint.
        let busy = !self.topics.settled()
            || self.purges_running()
            || self.consume.positions_writing()
            || self.partitions.checkpoints_blocked();
        if busy {
            return;
        }
        let syncs = self.partitions.take_applied_syncs();
        let positions = match due {
            true => self.positions_job(now, true).map(Box::new),
            false => None,
        };
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        c.compaction.in_flight = true;
        let write = due.then(|| c.replica.checkpoint_job(floor));
        self.jobs.push(DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::RaftCheckpoint {
                syncs,
                positions,
                positions_result: None,
                write,
            },
        });
    }

    /// Housekeeping: a cluster checkpoint that failed may be tried again.
    pub(in crate::broker) fn retry_cluster_checkpoint(&mut self) {
        if let Some(c) = self.cluster.as_deref_mut() {
            c.compaction.failed = false;
        }
    }

    /// A cluster checkpoint came back: segment and positions outcomes to their owners;
    /// once written, the journal files below it go.
    pub(in crate::broker) fn cluster_checkpoint_done(&mut self, done: CheckpointDone, now: Now) {
        self.partitions.applied_syncs_done(done.syncs);
        if done.positions {
            let not_run = || Err(io::Error::other("the segment syncs before it failed"));
            let result = done.positions_result.unwrap_or_else(not_run);
            self.consume.positions_written(&result);
            self.write_waited_positions(now);
        }
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        c.compaction.in_flight = false;
        c.compaction.failed = done.result.is_err();
        let Some(point) = done.write.map(|w| w.point) else {
            if let Err(e) = done.result {
                log::error!("segment syncs between checkpoints failed: {e}");
            }
            return self.submit_jobs();
        };
        match done.result {
            Ok(()) => {
                let mut paths = c.replica.checkpoint_done(point);
                self.counters.checkpoints += 1;
                // The first file let go becomes the next spare, if one is wanted.
                let recycle = (!paths.is_empty()).then(|| paths.remove(0));
                self.take_raft_spare(recycle);
                if !paths.is_empty() {
                    self.jobs.push(DurableJob {
                        storage: Arc::clone(&self.storage),
                        work: Work::RemoveFiles { paths },
                    });
                }
            }
            Err(e) => log::error!("checkpoint at raft index {} failed: {e}", point.index),
        }
        self.submit_jobs();
    }

    /// The raft journal's next file made ahead, as a single node's journal does
    /// (`log/journal.rs`, spares): from `recycle` (a file a checkpoint let go), or from
    /// zeros when one is due.
    pub(super) fn take_raft_spare(&mut self, recycle: Option<std::path::PathBuf>) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        if recycle.is_none() && !c.replica.spare_due() {
            return;
        }
        let replica = &c.replica;
        let spare_job = |recycle| replica.spare_job(recycle);
        c.compaction
            .spares
            .take(&self.storage, recycle, spare_job, &mut self.jobs);
    }

    /// A job making the raft journal's next file finished.
    pub(in crate::broker) fn raft_spare_made(&mut self, result: &io::Result<()>) {
        let c = self.cluster.as_deref_mut().expect("cluster mode");
        c.compaction.spares.done();
        c.replica.spare_made(result);
    }
}
