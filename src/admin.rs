//! The admin room: an HTTP listener serving `/healthz`, `/metrics`, `/stats`, the
//! records of a partition (`/topics/NAME/partitions/P/records`, `records.rs`) and the
//! operator's `/topics` and `/groups` routes (`manage.rs`: describe, purge, group delete
//! and reset, with the broker's token).
//!
//! It never touches reactor or broker state. For everything but `/healthz` it sends an
//! [`AdminRequest`] (an [`AdminAsk`]) through a channel, wakes the reactor with its
//! `Waker`, and waits a bounded time for the answer (plain copied data, such as a
//! [`Snapshot`]) that it renders on its own thread. `/healthz` needs no reactor turn at
//! all: the reactor stores the time of its last turn in an atomic, so a stalled reactor
//! makes `/healthz` answer 503 instead of hanging.
//!
//! Every figure shown is one row of [`METRICS`] (`metrics.rs`): `/metrics` and `/stats`
//! (`render.rs`) and `mortarctl stats` walk that table, so a new metric is one row
//! there, plus the `Snapshot` field that feeds it if it is new. The HTTP side lives in
//! `http.rs`.
//!
//! Depends on `broker` and `consume` for the shapes of the snapshot's parts, of a page
//! of records (`broker::peek`) and of the changes, on `session` for the token check, and
//! on `wire` for the error registry's names.

mod http;
mod manage;
mod metrics;
mod process;
mod records;
mod render;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::mpsc::SyncSender;

use crate::broker::peek::{Peek, PeekAsk, PeekError};
use crate::broker::BrokerCounters;
use crate::consume::CoordinatorSnapshot;

pub use http::{
    pending_requests, rss_bytes, Admin, ADMIN_CONNECTIONS_MAX, ADMIN_REQUEST_HEAD_BYTES_MAX,
    ADMIN_REQUEST_TIMEOUT_MS, ADMIN_THREADS_MAX, REACTOR_STALL_MS, SNAPSHOT_TIMEOUT_MS,
};
pub use manage::{parse_reset_to, rfc3339_ms, ManageAnswer, ManageAsk, ADMIN_CHANGE_TIMEOUT_MS};
pub use metrics::{Kind, Metric, Point, Read, Unit, METRICS, STATS_SECTIONS};
pub use process::ProcessFigures;
pub use records::{render_records, ENCODING_BASE64, ENCODING_TEXT, RECORDS_DEFAULT};
pub use render::{in_stats_order, render_metrics, render_stats, Json};

/// What the admin thread asks of the reactor, which owns every piece of state.
#[derive(Debug)]
pub enum AdminAsk {
    /// Everything `/stats` and `/metrics` show.
    Snapshot,
    /// A bounded page of one partition's records, read without a group (`records.rs`).
    Records(PeekAsk),
    /// A topic described, or a change to groups or topics (`manage.rs`).
    Manage(ManageAsk),
}

/// The reactor's answer to an [`AdminAsk`], of the same name.
#[derive(Debug)]
pub enum AdminAnswer {
    Snapshot(Box<Snapshot>),
    Records(Result<Box<Peek>, PeekError>),
    Manage(ManageAnswer),
}

/// One [`AdminAsk`]; the reactor answers on `reply` when it can (at once for a read; a
/// change may answer only once it is durable). The admin thread waits a bounded time.
pub struct AdminRequest {
    pub ask: AdminAsk,
    pub reply: SyncSender<AdminAnswer>,
}

/// One partition's figures.
#[derive(Debug, Clone, Default)]
pub struct PartitionFigures {
    pub partition: u16,
    pub first_sequence: u64,
    pub last_sequence: u64,
    pub commit_sequence: u64,
    pub bytes: u64,
    pub segments: u32,
    pub poisoned: bool,
    /// Idempotent producers it remembers (at most `--max-producers`).
    pub producers: u64,
}

#[derive(Debug, Clone, Default)]
pub struct TopicFigures {
    pub topic_id: u16,
    pub name: String,
    pub dlq_twin: bool,
    pub partitions: Vec<PartitionFigures>,
}

/// Everything `/stats` and `/metrics` show, copied by the reactor in one turn; the rows
/// of [`METRICS`] say which field feeds which figure.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub version: &'static str,
    pub uptime_ms: u64,
    pub leader_epoch: u64,
    /// Resident set size, read by the admin thread when the snapshot arrives.
    pub rss_bytes: u64,
    pub data_dir: PathBuf,
    /// `--max-data-size` (0: none).
    pub max_data_bytes: u64,
    /// The `process_*` figures, read by the admin thread like `rss_bytes`.
    pub process: ProcessFigures,
    pub connections_open: u64,
    pub connections_accepted: u64,
    pub connections_refused: u64,
    pub connections_closed: Vec<(&'static str, u64)>,
    pub frames_in: Vec<(&'static str, u64)>,
    pub frames_out: Vec<(&'static str, u64)>,
    pub errors_sent: BTreeMap<u16, u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub backpressure_pauses: u64,
    /// Bytes held by connection buffers (what `--max-memory` limits).
    pub buffered_bytes: u64,
    pub broker: BrokerCounters,
    pub topics: Vec<TopicFigures>,
    pub groups: CoordinatorSnapshot,
    /// This node's place in its cluster; `None` on a single node, whose `/stats` and
    /// `/metrics` then show no cluster figures at all.
    pub cluster: Option<ClusterFigures>,
}

/// A cluster node's raft figures and its links (`docs/REPLICATION.md` §7.5).
#[derive(Debug, Clone, Default)]
pub struct ClusterFigures {
    pub node_id: u64,
    /// `leader`, `follower`, `candidate` or `pre-candidate`.
    pub role: &'static str,
    pub term: u64,
    /// The leader this node knows of and can reach (itself, or a peer whose link is up);
    /// 0 when none.
    pub leader_id: u64,
    pub commit_index: u64,
    pub applied_index: u64,
    /// The last entry in this node's log, committed or not.
    pub last_index: u64,
    /// The journal's checkpoint (start-up applies from there) and the first entry it
    /// still holds: compaction's progress.
    pub checkpoint_index: u64,
    pub first_index: u64,
    /// Entry bytes the journal still holds: a laggard keeps it growing (up to
    /// `--journal-retain`).
    pub journal_bytes: u64,
    /// The newest leader's wall-clock stamp applied (Unix ms): what `--producer-ttl` and
    /// `--retention-age` are measured on in a cluster.
    pub log_clock_ms: u64,
    /// BATCHes applied whose stamp stood far ahead of this node's wall clock.
    pub clock_skewed_batches: u64,
    /// Snapshot chunk bytes this node sent (INSTALL, as a leader), since start.
    pub snapshot_bytes_sent: u64,
    /// While this node installs a snapshot: bytes written so far and in all.
    pub install_bytes_done: u64,
    pub install_bytes_total: u64,
    /// Peer connections, frames and raft messages refused, by reason (issue 42).
    pub refused: Vec<(&'static str, u64)>,
    pub peers: Vec<PeerFigures>,
}

/// One other node, as this node sees it.
#[derive(Debug, Clone, Default)]
pub struct PeerFigures {
    pub id: u64,
    pub link_up: bool,
    /// Milliseconds since a frame last arrived from it; `None` if none ever did.
    pub last_contact_ms: Option<u64>,
    /// The last entry known in its log, and how many of this node's entries it lacks:
    /// only while this node leads (raft tracks progress only there).
    pub match_index: Option<u64>,
    pub lag: Option<u64>,
    /// Its client and admin addresses from its HELLO (empty before one arrived).
    pub client_addr: String,
    pub admin_addr: String,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub frames_in: u64,
    pub frames_out: u64,
}

/// What `/healthz` reads without a reactor turn, written by the reactor each turn.
#[derive(Debug)]
pub struct Liveness {
    /// Monotonic ms of the reactor's last turn.
    pub last_turn_ms: AtomicU64,
    /// [`SINGLE_NODE`], [`NO_LEADER`], or the id of the leader this node can reach.
    pub leader: AtomicU64,
}

impl Liveness {
    pub fn new() -> Liveness {
        Liveness {
            last_turn_ms: AtomicU64::new(0),
            leader: AtomicU64::new(SINGLE_NODE),
        }
    }
}

impl Default for Liveness {
    fn default() -> Liveness {
        Liveness::new()
    }
}

/// In [`Liveness::leader`]: no `--peers`, so `/healthz` asks nothing about leaders.
pub const SINGLE_NODE: u64 = u64::MAX;
/// In [`Liveness::leader`]: a cluster node that knows no leader it can reach.
pub const NO_LEADER: u64 = 0;

#[cfg(test)]
mod tests;
