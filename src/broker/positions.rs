//! Committed group positions on disk: the `groups` file, written atomically at least every
//! `--commit-interval` when they changed, and at clean shutdown. A cluster node writes the
//! positions its applied log says, not its live groups' (`broker::durable_positions`).
//!
//! It also carries the tombstones of deleted groups: a deleted group's dead letters stay
//! in the `.dlq` twin, and without its tombstone start-up would read the group back from
//! them (`deliver.rs` `restore`).
//!
//! ```text
//! mortar-groups 2
//! <topic_id> <partition> <committed> <group name>
//! deleted <topic_id> <twin partition>:<mark>[,<twin partition>:<mark>...] <group name>
//! ```
//!
//! Version 2 only adds the `deleted` lines (a position line starts with a digit, so the
//! two never mix up). Version 1 files (positions only) are read as before, and a file
//! without tombstones is still written as version 1, so a broker from before tombstones
//! reads it; one that holds a tombstone is refused by such a broker ("unknown header")
//! rather than read without it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::consume::GroupPosition;
use crate::log::{meta, Storage};

use super::jobs::{DurableJob, Work};

/// The committed-positions file in the data directory.
pub const GROUPS_FILE: &str = "groups";
const GROUPS_MAGIC_V1: &str = "mortar-groups 1";
const GROUPS_MAGIC_V2: &str = "mortar-groups 2";
const TOMBSTONE_WORD: &str = "deleted";
/// Most tombstones kept; a delete beyond it drops the oldest. That group, if it still has
/// dead letters below its mark, comes back at the next start as a group without members
/// until `--group-ttl` (as every deleted group did before tombstones): a bounded file and
/// a bounded start-up cost against a rare, self-healing leftover.
pub const GROUP_TOMBSTONES_MAX: usize = 1024;

/// A deleted group: its dead letters in the twin below the marks are not its any more.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupTombstone {
    pub group: Vec<u8>,
    /// The source topic the group consumed.
    pub topic_id: u16,
    /// Per twin partition: the twin's next sequence at the delete (buffered records
    /// included, so dead letters still waiting for their fsync are covered too).
    pub marks: Vec<(u16, u64)>,
}

impl GroupTombstone {
    /// The restore rule: a dead letter of this group at `twin_sequence` in twin partition
    /// `partition` was written before the delete, so it is ignored. A group re-created
    /// under the same name writes its dead letters above the mark and keeps them.
    pub fn hides(&self, partition: u16, twin_sequence: u64) -> bool {
        self.marks
            .iter()
            .any(|&(p, mark)| p == partition && twin_sequence < mark)
    }

    /// Given per twin partition its (first retained, next) sequences (`None`: no such
    /// partition), lowers every mark to the twin's next sequence and says whether the
    /// tombstone still hides a record. A mark above next counted records that never
    /// reached the disk (a crash took them before their flush): their sequences go to
    /// new records, which the tombstone must not hide. Once retention or a purge removed
    /// everything below every mark, or the topic is gone, it has nothing left to hide.
    pub fn settle(&mut self, twin: impl Fn(u16) -> Option<(u64, u64)>) -> bool {
        let mut hides = false;
        for (p, mark) in &mut self.marks {
            let Some((first, next)) = twin(*p) else {
                return false;
            };
            *mark = (*mark).min(next);
            hides |= first < *mark;
        }
        hides
    }
}

/// What is on disk and when to write next.
pub struct Positions {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    interval_ms: u64,
    /// Deleted groups, oldest first, at most [`GROUP_TOMBSTONES_MAX`].
    tombstones: Vec<GroupTombstone>,
    /// What the last write (or start-up) put on disk; `None` when unknown (a write
    /// failed), so the next turn writes whatever it is.
    persisted: Option<(Vec<GroupPosition>, Vec<GroupTombstone>)>,
    in_flight: bool,
    next_write_ms: u64,
    /// Bumped by every change an operator waits for ([`Positions::wait`]).
    generation: u64,
    /// The generation the write in flight (or the last one) carries.
    started_generation: u64,
    /// Operator changes waiting for a write: (generation, ticket).
    waiting: Vec<(u64, u64)>,
    /// Tickets whose change is on disk (`Ok`) or could not be written.
    done: Vec<(u64, Result<(), String>)>,
}

impl Positions {
    pub fn new(storage: Arc<dyn Storage>, data_dir: &Path, interval_ms: u64) -> Positions {
        Positions {
            storage,
            path: data_dir.join(GROUPS_FILE),
            interval_ms,
            tombstones: Vec::new(),
            persisted: None,
            in_flight: false,
            next_write_ms: 0,
            generation: 0,
            started_generation: 0,
            waiting: Vec::new(),
            done: Vec::new(),
        }
    }

    /// The positions file at start-up (none yet: empty); its tombstones are kept here.
    pub fn read(&mut self) -> Result<Vec<GroupPosition>, String> {
        let shown = self.path.display();
        let (positions, tombstones) = match meta::read_checked(&*self.storage, &self.path) {
            Ok(Some(bytes)) => decode_positions(&bytes).map_err(|e| format!("{shown}: {e}"))?,
            Ok(None) => (Vec::new(), Vec::new()),
            Err(e) => return Err(format!("{shown}: {e}")),
        };
        self.tombstones = tombstones.clone();
        self.persisted = Some((positions.clone(), tombstones));
        Ok(positions)
    }

    /// The tombstone of `(group, topic_id)`, if it was deleted.
    pub fn tombstone_of(&self, group: &[u8], topic_id: u16) -> Option<&GroupTombstone> {
        self.tombstones
            .iter()
            .find(|t| t.topic_id == topic_id && t.group == group)
    }

    /// A group was deleted: its tombstone replaces an older one of the same group and
    /// goes with the next write (the one the delete waits for).
    pub fn add_tombstone(&mut self, tombstone: GroupTombstone) {
        let (group, topic_id) = (&tombstone.group, tombstone.topic_id);
        self.tombstones
            .retain(|t| !(t.topic_id == topic_id && &t.group == group));
        if tombstone.marks.is_empty() {
            return; // an empty twin: no dead letter to hide
        }
        self.tombstones.push(tombstone);
        let over = self.tombstones.len().saturating_sub(GROUP_TOMBSTONES_MAX);
        self.tombstones.drain(..over);
    }

    /// Keeps the tombstones `keep` says are still needed (retention, deleted topics).
    pub fn retain_tombstones(&mut self, keep: impl FnMut(&mut GroupTombstone) -> bool) {
        self.tombstones.retain_mut(keep);
    }

    pub fn in_flight(&self) -> bool {
        self.in_flight
    }

    pub fn next_write_ms(&self) -> u64 {
        self.next_write_ms
    }

    /// An operator changed positions (reset, delete, purge) and waits, as `ticket`, for
    /// them to be on disk: the next turn writes them, interval or not.
    pub fn wait(&mut self, ticket: u64) {
        self.generation += 1;
        self.waiting.push((self.generation, ticket));
    }

    /// The waits that ended since the last call.
    pub fn take_done(&mut self) -> Vec<(u64, Result<(), String>)> {
        std::mem::take(&mut self.done)
    }

    /// A write of `current` when the interval passed (or `force`, or an operator waits),
    /// it changed, and no write runs.
    pub fn write_job(
        &mut self,
        now_ms: u64,
        force: bool,
        current: impl FnOnce() -> Vec<GroupPosition>,
    ) -> Option<DurableJob> {
        let waited_for = self.generation > self.started_generation;
        if self.in_flight || (!force && !waited_for && now_ms < self.next_write_ms) {
            return None;
        }
        self.next_write_ms = now_ms + self.interval_ms;
        let current = (current(), self.tombstones.clone());
        self.started_generation = self.generation;
        if self.persisted.as_ref() == Some(&current) {
            // No write in flight and nothing new: the last one put this on disk.
            self.end_waits(&Ok(()));
            return None;
        }
        let bytes = encode_positions(&current.0, &current.1);
        self.in_flight = true;
        self.persisted = Some(current);
        Some(DurableJob {
            storage: Arc::clone(&self.storage),
            work: Work::WritePositions {
                path: self.path.clone(),
                bytes,
                generation: self.generation,
            },
        })
    }

    /// Answers the waits a write of `started_generation` covered.
    fn end_waits(&mut self, result: &std::io::Result<()>) {
        let upto = self.started_generation;
        let (ended, still): (Vec<_>, Vec<_>) = self.waiting.iter().partition(|(g, _)| *g <= upto);
        self.waiting = still;
        let outcome = match result {
            Ok(()) => Ok(()),
            Err(e) => Err(format!("writing the group positions failed: {e}")),
        };
        self.done
            .extend(ended.into_iter().map(|(_, t)| (t, outcome.clone())));
    }

    pub fn written(&mut self, result: &std::io::Result<()>) {
        self.in_flight = false;
        self.end_waits(result);
        if let Err(e) = result {
            log::error!("persisting group positions failed: {e}");
            // Forget what we thought was on disk so the next turn rewrites it.
            self.persisted = None;
        }
    }

    /// What the file holds with `positions` and the tombstones kept.
    pub fn encode(&self, positions: &[GroupPosition]) -> Vec<u8> {
        encode_positions(positions, &self.tombstones)
    }

    /// Writes `positions` on the calling thread (shutdown).
    pub fn write_now(&mut self, positions: &[GroupPosition]) -> std::io::Result<()> {
        let bytes = encode_positions(positions, &self.tombstones);
        meta::write_atomic(&*self.storage, &self.path, &bytes)
    }
}

/// The positions file: one `topic_id partition committed group` line per position, then
/// one `deleted topic_id marks group` line per tombstone (version 2 only when there is one).
fn encode_positions(positions: &[GroupPosition], tombstones: &[GroupTombstone]) -> Vec<u8> {
    let magic = match tombstones.is_empty() {
        true => GROUPS_MAGIC_V1,
        false => GROUPS_MAGIC_V2,
    };
    let mut out = format!("{magic}\n");
    for p in positions {
        out.push_str(&format!(
            "{} {} {} {}\n",
            p.topic_id,
            p.partition,
            p.committed,
            String::from_utf8_lossy(&p.group)
        ));
    }
    for t in tombstones {
        let marks: Vec<String> = t.marks.iter().map(|(p, m)| format!("{p}:{m}")).collect();
        out.push_str(&format!(
            "{TOMBSTONE_WORD} {} {} {}\n",
            t.topic_id,
            marks.join(","),
            String::from_utf8_lossy(&t.group)
        ));
    }
    out.into_bytes()
}

type Decoded = (Vec<GroupPosition>, Vec<GroupTombstone>);

fn decode_positions(bytes: &[u8]) -> Result<Decoded, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| e.to_string())?;
    let mut lines = text.lines();
    let with_tombstones = match lines.next() {
        Some(GROUPS_MAGIC_V1) => false,
        Some(GROUPS_MAGIC_V2) => true,
        _ => return Err("unknown header".into()),
    };
    let (mut positions, mut tombstones) = (Vec::new(), Vec::new());
    for line in lines {
        let w: Vec<&str> = line.splitn(4, ' ').collect();
        let bad = || format!("bad line: {line}");
        if w.len() != 4 {
            return Err(bad());
        }
        if w[0] != TOMBSTONE_WORD {
            positions.push(GroupPosition {
                topic_id: w[0].parse().map_err(|_| bad())?,
                partition: w[1].parse().map_err(|_| bad())?,
                committed: w[2].parse().map_err(|_| bad())?,
                group: w[3].as_bytes().to_vec(),
            });
            continue;
        }
        if !with_tombstones {
            return Err(bad());
        }
        let mark = |m: &str| -> Option<(u16, u64)> {
            let (p, s) = m.split_once(':')?;
            Some((p.parse().ok()?, s.parse().ok()?))
        };
        let marks: Option<Vec<_>> = w[2].split(',').map(mark).collect();
        tombstones.push(GroupTombstone {
            group: w[3].as_bytes().to_vec(),
            topic_id: w[1].parse().map_err(|_| bad())?,
            marks: marks.ok_or_else(bad)?,
        });
    }
    Ok((positions, tombstones))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(committed: u64) -> Vec<GroupPosition> {
        vec![GroupPosition {
            group: b"g".to_vec(),
            topic_id: 1,
            partition: 0,
            committed,
        }]
    }

    #[test]
    fn an_operator_wait_ends_with_the_write_that_holds_its_change() {
        let dir = tempfile::tempdir().unwrap();
        let interval_ms = 60_000;
        let mut p = Positions::new(crate::log::FsStorage::shared(), dir.path(), interval_ms);
        assert!(p.write_job(interval_ms, false, || at(1)).is_some());
        p.written(&Ok(()));
        // Within the interval, a change someone waits for is written anyway.
        p.wait(7);
        assert!(p.write_job(interval_ms + 1, false, || at(2)).is_some());
        p.wait(8);
        assert!(
            p.write_job(interval_ms + 2, false, || at(3)).is_none(),
            "one at a time"
        );
        p.written(&Ok(()));
        assert_eq!(
            p.take_done(),
            vec![(7, Ok(()))],
            "8 came after that write began"
        );
        assert!(p.write_job(interval_ms + 3, false, || at(3)).is_some());
        p.written(&Err(std::io::Error::other("disk gone")));
        let done = p.take_done();
        assert_eq!(done.len(), 1);
        assert!(
            matches!(&done[0], (8, Err(e)) if e.contains("disk gone")),
            "{done:?}"
        );
        // Nothing new to write: what is on disk already holds the change.
        p.write_job(interval_ms + 4, true, || at(3)).unwrap();
        p.written(&Ok(()));
        p.wait(9);
        assert!(p.write_job(interval_ms + 5, false, || at(3)).is_none());
        assert_eq!(p.take_done(), vec![(9, Ok(()))]);
    }

    #[test]
    fn positions_file_round_trips() {
        let positions = vec![
            GroupPosition {
                group: b"billing".to_vec(),
                topic_id: 1,
                partition: 0,
                committed: 42,
            },
            GroupPosition {
                group: b"a.b-c_d".to_vec(),
                topic_id: 3,
                partition: 7,
                committed: 0,
            },
        ];
        let bytes = encode_positions(&positions, &[]);
        assert!(
            bytes.starts_with(b"mortar-groups 1\n"),
            "older brokers read it"
        );
        assert_eq!(decode_positions(&bytes).unwrap(), (positions, vec![]));
        assert!(decode_positions(b"nope").is_err());
    }

    fn tombstone(group: &[u8], marks: &[(u16, u64)]) -> GroupTombstone {
        GroupTombstone {
            group: group.to_vec(),
            topic_id: 3,
            marks: marks.to_vec(),
        }
    }

    #[test]
    fn a_version_1_file_is_read_and_tombstones_round_trip_as_version_2() {
        let old = b"mortar-groups 1\n1 0 42 billing\n3 7 0 a.b-c_d\n";
        let (positions, tombstones) = decode_positions(old).unwrap();
        assert_eq!(positions.len(), 2);
        assert_eq!(positions[1].group, b"a.b-c_d");
        assert!(tombstones.is_empty());
        assert!(
            decode_positions(b"mortar-groups 1\ndeleted 3 0:4 g\n").is_err(),
            "version 1 has no tombstones"
        );

        let tombstones = vec![
            tombstone(b"gone", &[(0, 4), (2, 19)]),
            tombstone(b"x", &[(1, 1)]),
        ];
        let bytes = encode_positions(&positions, &tombstones);
        assert!(bytes.starts_with(b"mortar-groups 2\n"));
        assert_eq!(decode_positions(&bytes).unwrap(), (positions, tombstones));
        for bad in [
            "deleted 3 0:x g",
            "deleted 3 - g",
            "deleted x 0:1 g",
            "deleted 3 0:1",
        ] {
            let text = format!("mortar-groups 2\n{bad}\n");
            assert!(decode_positions(text.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn tombstones_hide_dead_letters_below_their_mark_until_retention_passes_it() {
        let t = tombstone(b"g", &[(0, 5), (1, 2)]);
        assert!(t.hides(0, 4), "written before the delete");
        assert!(!t.hides(0, 5), "written after: a re-created group's");
        assert!(t.hides(1, 1));
        assert!(!t.hides(2, 0), "no mark on that partition");
        // (first retained, next) per twin partition.
        let twin = |firsts: [u64; 2]| move |p: u16| Some((firsts[p as usize], 9));
        assert!(t.clone().settle(twin([1, 1])));
        assert!(
            t.clone().settle(twin([5, 1])),
            "partition 1 still holds sequence 1"
        );
        assert!(
            !t.clone().settle(twin([5, 2])),
            "retention removed all below the marks"
        );
        assert!(!t.clone().settle(|_| None), "the topic is gone");
        // A crash lost the twin's records from 3 on: 3 and 4 go to new records.
        let mut lost = t.clone();
        assert!(lost.settle(|_| Some((1, 3))));
        assert_eq!(lost.marks, [(0, 3), (1, 2)]);
        assert!(lost.hides(0, 2) && !lost.hides(0, 3));
    }

    #[test]
    fn tombstones_are_bounded_and_a_new_delete_replaces_the_old_mark() {
        let dir = tempfile::tempdir().unwrap();
        let mut p = Positions::new(crate::log::FsStorage::shared(), dir.path(), 1);
        p.add_tombstone(tombstone(b"g", &[(0, 2)]));
        p.add_tombstone(tombstone(b"g", &[(0, 7)]));
        assert_eq!(p.tombstone_of(b"g", 3).unwrap().marks, [(0, 7)]);
        p.add_tombstone(tombstone(b"g", &[]));
        assert!(p.tombstone_of(b"g", 3).is_none(), "nothing to hide");
        for i in 0..=GROUP_TOMBSTONES_MAX {
            p.add_tombstone(tombstone(format!("g{i}").as_bytes(), &[(0, 1)]));
        }
        assert_eq!(p.tombstones.len(), GROUP_TOMBSTONES_MAX);
        assert!(p.tombstone_of(b"g0", 3).is_none(), "the oldest went");
        // Written with the positions, read back at start.
        p.write_now(&[]).unwrap();
        let mut again = Positions::new(crate::log::FsStorage::shared(), dir.path(), 1);
        again.read().unwrap();
        assert_eq!(again.tombstones, p.tombstones);
    }
}
