//! Committed group positions on disk: the `groups` file, written atomically at least every
//! `--commit-interval` when they changed, and at clean shutdown.
//!
//! ```text
//! mortar-groups 1
//! <topic_id> <partition> <committed> <group name>
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::consume::GroupPosition;
use crate::log::{meta, Storage};

use super::jobs::{DurableJob, Work};

/// The committed-positions file in the data directory.
pub const GROUPS_FILE: &str = "groups";
const GROUPS_MAGIC: &str = "mortar-groups 1";

/// What is on disk and when to write next.
pub struct Positions {
    storage: Arc<dyn Storage>,
    path: PathBuf,
    interval_ms: u64,
    /// What the last write (or start-up) put on disk.
    persisted: Vec<GroupPosition>,
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
            persisted: Vec::new(),
            in_flight: false,
            next_write_ms: 0,
            generation: 0,
            started_generation: 0,
            waiting: Vec::new(),
            done: Vec::new(),
        }
    }

    /// The positions file at start-up (none yet: empty).
    pub fn read(&mut self) -> Result<&[GroupPosition], String> {
        let shown = self.path.display();
        self.persisted = match meta::read_checked(&*self.storage, &self.path) {
            Ok(Some(bytes)) => decode_positions(&bytes).map_err(|e| format!("{shown}: {e}"))?,
            Ok(None) => Vec::new(),
            Err(e) => return Err(format!("{shown}: {e}")),
        };
        Ok(&self.persisted)
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
        let positions = current();
        self.started_generation = self.generation;
        if positions == self.persisted {
            // No write in flight and nothing new: the last one put this on disk.
            self.end_waits(&Ok(()));
            return None;
        }
        let bytes = encode_positions(&positions);
        self.in_flight = true;
        self.persisted = positions;
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
            self.persisted.clear();
        }
    }

    /// Writes `positions` on the calling thread (shutdown).
    pub fn write_now(&mut self, positions: &[GroupPosition]) -> std::io::Result<()> {
        meta::write_atomic(&*self.storage, &self.path, &encode_positions(positions))
    }
}

/// The positions file: one `topic_id partition committed group` line per position.
fn encode_positions(positions: &[GroupPosition]) -> Vec<u8> {
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

fn decode_positions(bytes: &[u8]) -> Result<Vec<GroupPosition>, String> {
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
            Ok(GroupPosition {
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
        assert_eq!(
            decode_positions(&encode_positions(&positions)).unwrap(),
            positions
        );
        assert!(decode_positions(b"nope").is_err());
    }
}
