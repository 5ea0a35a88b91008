//! The one table of metrics. A row names a figure once: Prometheus family, type, HELP,
//! unit, place in `/stats`, and how to read it from a [`Snapshot`]. `/metrics`,
//! `/stats` and `mortarctl stats` only walk [`METRICS`]; adding a figure is adding a
//! row (and, for new data, the `Snapshot` field that feeds it).

use std::borrow::Cow;

use super::Json::{self, Bool, Float, Null, Num, Str};
use super::{ClusterFigures, PartitionFigures, PeerFigures, Snapshot, TopicFigures};
use crate::broker::{FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use crate::consume::{GroupSnapshot, MemberSnapshot, PartitionSnapshot};
use crate::wire::ErrorCode;

/// The Prometheus type. `Info` rows name rather than measure (ids, names, flags,
/// states): `/stats` shows them, `/metrics` shows them only as labels (see
/// [`Metric::elsewhere`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
    Info,
}

impl Kind {
    /// The word on the `# TYPE` line.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
            Kind::Info => "info",
        }
    }
}

/// The unit of a figure as `/stats` holds it; `/metrics` shows times in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// Events or things: connections, frames, requests, fsyncs, files.
    Count,
    Bytes,
    Records,
    /// A record's place in its partition: a position, not an amount.
    Sequence,
    /// A generation number that only grows (leader, membership, ownership).
    Epoch,
    Milliseconds,
    Microseconds,
    /// Not a quantity: an id, name, flag or state.
    Label,
}

/// How a row reads its figure. The variant also says what tells its values apart:
/// labels in `/metrics`, arrays on the row's `/stats` path (see [`Read::points`]).
pub enum Read {
    /// One value for the whole broker.
    Scalar(fn(&Snapshot) -> Json),
    /// One count per value of the label (op, close reason, error code); in `/stats` an
    /// object keyed by that value.
    ByLabel(&'static str, fn(&Snapshot) -> Vec<(&'static str, u64)>),
    /// Labels `topic`; path `topics[]`.
    PerTopic(fn(&TopicFigures) -> Json),
    /// Labels `topic`, `partition`; path `topics[].partitions[]`.
    PerPartition(fn(&PartitionFigures) -> Json),
    /// Labels `group`, `topic`; path `groups[]`.
    PerGroup(fn(&Snapshot, &GroupSnapshot) -> Json),
    /// Labels `group`, `topic`, `member`; path `groups[].members[]`.
    PerMember(fn(&MemberSnapshot) -> Json),
    /// Labels `group`, `topic`, `partition`; path `groups[].partitions[]`.
    PerGroupPartition(fn(&Snapshot, &GroupSnapshot, &PartitionSnapshot) -> Json),
    /// Counts per bucket of `bounds` (a last one is +Inf) and the sum of what was
    /// observed, in the row's unit.
    Histogram {
        bounds: &'static [u64],
        counts: fn(&Snapshot) -> &[u64],
        sum: fn(&Snapshot) -> u64,
    },
    /// A figure of this cluster node; path `cluster.`. Cluster rows show nothing on a
    /// single node (see [`Metric::shown`]).
    Cluster(fn(&ClusterFigures) -> Json),
    /// Always 1, with the figure as the label's value (a state, such as the role).
    ClusterLabel(&'static str, fn(&ClusterFigures) -> &'static str),
    /// Labels `peer`; path `cluster.peers[]`. A [`Json::Null`] is a figure the node
    /// does not have (no sample).
    PerPeer(fn(&PeerFigures) -> Json),
    /// [`Read::ByLabel`] of a cluster node: one count per value of the label; path
    /// `cluster.`, an object keyed by that value.
    ClusterByLabel(&'static str, fn(&ClusterFigures) -> &[(&'static str, u64)]),
}

pub struct Metric {
    /// The Prometheus family; `None` when only `/stats` shows the figure.
    pub family: Option<&'static str>,
    pub kind: Kind,
    pub help: &'static str,
    pub unit: Unit,
    /// Dotted place in `/stats`, `[]` marking an array with one element per entity;
    /// `None` when only `/metrics` shows the figure.
    pub path: Option<&'static str>,
    pub read: Read,
    /// For a `/stats` row without a family: where `/metrics` shows it instead, a label
    /// name (`topic`) or the family it is derived from (`mortar_fsync_seconds`). `None`
    /// only for `Info` rows that `/metrics` does not show at all (docs/DECISIONS.md,
    /// "Metrics (issue 17)"). The parity tests walk this column.
    pub elsewhere: Option<&'static str>,
}

impl Metric {
    /// Whether `s` has this row at all: the cluster rows only on a cluster node, so that
    /// a single node's `/stats` and `/metrics` are what they were before clusters.
    pub fn shown(&self, s: &Snapshot) -> bool {
        let cluster_row = matches!(
            self.read,
            Read::Cluster(_) | Read::ClusterLabel(..) | Read::PerPeer(_) | Read::ClusterByLabel(..)
        );
        !cluster_row || s.cluster.is_some()
    }
}

/// The top-level sections of `/stats`, in document order.
pub const STATS_SECTIONS: [&str; 9] = [
    "broker",
    "connections",
    "topics",
    "groups",
    "delivery",
    "storage",
    "fsync",
    "publish",
    "cluster",
];

/// In the family column: not exported to Prometheus.
const STATS_ONLY: &str = "";
/// In the path column: not in `/stats`.
const METRICS_ONLY: &str = "";
/// In an `Info` row's label column: `/metrics` does not show it.
const NOT_EXPORTED: &str = "";

const fn row(
    kind: Kind,
    unit: Unit,
    family: &'static str,
    path: &'static str,
    help: &'static str,
    read: Read,
) -> Metric {
    let (family, path) = (non_empty(family), non_empty(path));
    Metric {
        family,
        kind,
        help,
        unit,
        path,
        read,
        elsewhere: None,
    }
}

/// A row that names rather than measures, shown in `/stats`, and in `/metrics` as the
/// label `label` (or, for [`NOT_EXPORTED`], not at all).
const fn info(path: &'static str, label: &'static str, help: &'static str, read: Read) -> Metric {
    let mut m = row(Info, Label, STATS_ONLY, path, help, read);
    m.elsewhere = non_empty(label);
    m
}

/// A `/stats` figure computed from a family `/metrics` exports whole (a mean from a
/// histogram's `_sum` and `_count`): a second family would only repeat it.
const fn derived(
    unit: Unit,
    path: &'static str,
    from: &'static str,
    help: &'static str,
    read: Read,
) -> Metric {
    let mut m = row(Gauge, unit, STATS_ONLY, path, help, read);
    m.elsewhere = Some(from);
    m
}

const fn non_empty(text: &'static str) -> Option<&'static str> {
    if text.is_empty() {
        None
    } else {
        Some(text)
    }
}

use Kind::{Counter, Gauge, Histogram, Info};
use Read::{ByLabel, PerGroup, PerGroupPartition, PerMember, PerPartition, PerTopic, Scalar};
use Read::{Cluster, ClusterByLabel, ClusterLabel, PerPeer};
use Unit::{Bytes, Count, Epoch, Label, Microseconds, Milliseconds, Records, Sequence};

/// Every figure `/metrics`, `/stats` and `mortarctl stats` show, in `/metrics` order.
#[rustfmt::skip]
pub static METRICS: &[Metric] = &[
    // kind, unit, Prometheus family, /stats path, HELP, read from the Snapshot
    info("broker.version", "version", "Version of the running broker.",
        Scalar(|s| Str(s.version.into()))),
    row(Gauge, Label, "mortar_build_info", METRICS_ONLY, "Always 1; the version as a label.",
        ByLabel("version", |s| vec![(s.version, 1)])),
    row(Gauge, Milliseconds, "mortar_uptime_seconds", "broker.uptime_ms", "Seconds since start.",
        Scalar(|s| Num(s.uptime_ms))),
    row(Gauge, Epoch, "mortar_leader_epoch", "broker.leader_epoch", "The broker's leader epoch.",
        Scalar(|s| Num(s.leader_epoch))),
    row(Gauge, Bytes, "mortar_rss_bytes", "broker.rss_bytes", "Resident set size.",
        Scalar(|s| Num(s.rss_bytes))),
    info("broker.data_dir", NOT_EXPORTED, "The data directory.",
        Scalar(|s| Str(s.data_dir.display().to_string()))),
    row(Gauge, Bytes, "process_resident_memory_bytes", METRICS_ONLY, "Resident memory size.",
        Scalar(|s| Num(s.process.resident_bytes))),
    row(Gauge, Bytes, "process_virtual_memory_bytes", METRICS_ONLY, "Virtual memory size.",
        Scalar(|s| Num(s.process.virtual_bytes))),
    row(Gauge, Count, "process_open_fds", METRICS_ONLY, "Open file descriptors.",
        Scalar(|s| Num(s.process.open_fds))),
    row(Gauge, Count, "process_max_fds", METRICS_ONLY, "Limit on open file descriptors.",
        Scalar(|s| Num(s.process.max_fds))),
    row(Gauge, Microseconds, "process_start_time_seconds", METRICS_ONLY,
        "Start time of the process since the Unix epoch, in seconds.",
        Scalar(|s| Num(s.process.start_time_us))),
    row(Counter, Microseconds, "process_cpu_seconds_total", METRICS_ONLY,
        "User and system CPU time spent, in seconds.", Scalar(|s| Num(s.process.cpu_us))),
    row(Gauge, Count, "mortar_connections_open", "connections.open", "Open client connections.",
        Scalar(|s| Num(s.connections_open))),
    row(Counter, Count, "mortar_connections_accepted_total", "connections.accepted",
        "Client connections accepted.", Scalar(|s| Num(s.connections_accepted))),
    row(Counter, Count, "mortar_connections_refused_total", "connections.refused",
        "Connections refused over --max-connections.", Scalar(|s| Num(s.connections_refused))),
    row(Counter, Count, "mortar_connections_closed_total", "connections.closed",
        "Connections closed, by reason.", ByLabel("reason", |s| s.connections_closed.clone())),
    row(Counter, Count, "mortar_frames_in_total", METRICS_ONLY,
        "Frames received, by the op clients send (SERVER_ONLY, RESERVED, ILLEGAL: bad ones).",
        ByLabel("op", |s| s.frames_in.clone())),
    row(Counter, Count, "mortar_frames_out_total", METRICS_ONLY,
        "Frames sent, by op (MSG: pushed and in PULL answers).",
        ByLabel("op", |s| s.frames_out.clone())),
    row(Counter, Count, "mortar_errors_total", METRICS_ONLY,
        "ERR frames sent, by registry code.", ByLabel("code", errors_by_name)),
    row(Counter, Bytes, "mortar_bytes_in_total", "connections.bytes_in",
        "Bytes read from clients.", Scalar(|s| Num(s.bytes_in))),
    row(Counter, Bytes, "mortar_bytes_out_total", "connections.bytes_out",
        "Bytes written to clients.", Scalar(|s| Num(s.bytes_out))),
    row(Counter, Count, "mortar_backpressure_pauses_total", "connections.backpressure_pauses",
        "Times a connection stopped being read (output or pending-request high water).",
        Scalar(|s| Num(s.backpressure_pauses))),
    row(Gauge, Bytes, "mortar_buffered_bytes", "connections.buffered_bytes",
        "Bytes held by connection buffers (what --max-memory limits).",
        Scalar(|s| Num(s.buffered_bytes))),
    row(Counter, Count, "mortar_pubs_total", "publish.pubs", "PUB requests accepted for checking.",
        Scalar(|s| Num(s.broker.pubs))),
    row(Counter, Count, "mortar_pubs_deduplicated_total", "publish.deduplicated",
        "PUBs answered as duplicates of an earlier record.",
        Scalar(|s| Num(s.broker.pubs_deduplicated))),
    row(Counter, Count, "mortar_pubs_non_idempotent_total", "publish.non_idempotent",
        "PUBs with producer_id 0.", Scalar(|s| Num(s.broker.pubs_non_idempotent))),
    row(Counter, Count, "mortar_producers_evicted_total", "publish.producers_evicted",
        "Idempotent producers forgotten past --max-producers (the idlest first).",
        Scalar(|s| Num(s.broker.producers_evicted))),
    row(Counter, Records, "mortar_broker_records_appended_total", "publish.records_appended",
        "Records appended since start, all topics.", Scalar(|s| Num(s.broker.records_appended))),
    row(Counter, Count, "mortar_fsyncs_total", "fsync.count", "Completed group-commit fdatasyncs.",
        Scalar(|s| Num(s.broker.fsyncs))),
    row(Counter, Count, "mortar_fsync_failures_total", "fsync.failures", "Failed fdatasyncs.",
        Scalar(|s| Num(s.broker.fsync_failures))),
    row(Counter, Records, "mortar_fsync_records_total", "fsync.records",
        "Records made durable by fdatasyncs.", Scalar(|s| Num(s.broker.fsync_records))),
    derived(Milliseconds, "fsync.mean_ms", "mortar_fsync_seconds", "Mean fdatasync latency.",
        Scalar(|s| Float(per_fsync(s, s.broker.fsync_micros_total) / MICROSECONDS_PER_MS))),
    derived(Milliseconds, "fsync.p50_ms", "mortar_fsync_seconds",
        "Median fdatasync latency, at most: its histogram bucket's bound, or max_ms if less.",
        Scalar(|s| Float(fsync_quantile_ms(s, MEDIAN)))),
    derived(Milliseconds, "fsync.p99_ms", "mortar_fsync_seconds",
        "99th percentile fdatasync latency, at most (as p50_ms).",
        Scalar(|s| Float(fsync_quantile_ms(s, P99)))),
    derived(Milliseconds, "fsync.max_ms", "mortar_fsync_max_seconds",
        "Longest fdatasync since start.",
        Scalar(|s| Float(s.broker.fsync_micros_max as f64 / MICROSECONDS_PER_MS))),
    row(Gauge, Microseconds, "mortar_fsync_max_seconds", METRICS_ONLY,
        "Longest fdatasync since start.", Scalar(|s| Num(s.broker.fsync_micros_max))),
    derived(Records, "fsync.mean_batch_records", "mortar_fsync_batch_records",
        "Mean records made durable by one fdatasync.",
        Scalar(|s| Float(per_fsync(s, s.broker.fsync_records)))),
    row(Histogram, Microseconds, "mortar_fsync_seconds", METRICS_ONLY, "fdatasync latency.",
        Read::Histogram { bounds: &FSYNC_LATENCY_BUCKETS_US, counts: |s| &s.broker.fsync_latency,
                          sum: |s| s.broker.fsync_micros_total }),
    row(Histogram, Records, "mortar_fsync_batch_records", METRICS_ONLY,
        "Records made durable by one fdatasync (group commit).",
        Read::Histogram { bounds: &FSYNC_BATCH_BUCKETS, counts: |s| &s.broker.fsync_batch,
                          sum: |s| s.broker.fsync_records }),
    row(Gauge, Bytes, "mortar_storage_bytes", "storage.bytes", "Bytes in segment files.",
        Scalar(|s| Num(partitions(s).map(|p| p.bytes).sum()))),
    row(Gauge, Bytes, "mortar_storage_max_bytes", "storage.max_bytes",
        "--max-data-size, the cap on storage bytes (0: none).", Scalar(|s| Num(s.max_data_bytes))),
    row(Gauge, Count, "mortar_storage_segments", "storage.segments", "Segment files.",
        Scalar(|s| Num(partitions(s).map(|p| u64::from(p.segments)).sum()))),
    row(Counter, Count, "mortar_recovery_truncations_total", "storage.recovery_truncations",
        "Partitions whose torn or corrupt tail recovery truncated at start.",
        Scalar(|s| Num(s.broker.recovery_truncations))),
    row(Counter, Bytes, "mortar_recovery_truncated_bytes_total",
        "storage.recovery_truncated_bytes",
        "Bytes recovery cut off torn or corrupt tails at start.",
        Scalar(|s| Num(s.broker.recovery_truncated_bytes))),
    row(Counter, Records, "mortar_corrupt_records_total", "storage.corrupt_records",
        "Records that failed their CRC when read (never delivered).",
        Scalar(|s| Num(s.broker.corrupt_records_found))),
    info("topics[].topic_id", NOT_EXPORTED, "Topic id.", PerTopic(|t| Num(t.topic_id.into()))),
    info("topics[].name", "topic", "Topic name.", PerTopic(|t| Str(t.name.clone()))),
    info("topics[].dlq_twin", NOT_EXPORTED, "Whether it is a dead-letter twin.",
        PerTopic(|t| Bool(t.dlq_twin))),
    row(Counter, Records, "mortar_records_appended_total", METRICS_ONLY,
        "Records appended, by topic.",
        PerTopic(|t| Num(t.partitions.iter().map(|p| p.last_sequence).sum()))),
    info("topics[].partitions[].partition", "partition", "Partition index.",
        PerPartition(|p| Num(p.partition.into()))),
    row(Gauge, Sequence, "mortar_partition_first_sequence", "topics[].partitions[].first_sequence",
        "Oldest retained sequence.", PerPartition(|p| Num(p.first_sequence))),
    row(Gauge, Sequence, "mortar_partition_last_sequence", "topics[].partitions[].last_sequence",
        "Last written sequence, by partition.", PerPartition(|p| Num(p.last_sequence))),
    row(Gauge, Sequence, "mortar_partition_commit_sequence",
        "topics[].partitions[].commit_sequence", "Last fsynced sequence.",
        PerPartition(|p| Num(p.commit_sequence))),
    row(Gauge, Bytes, "mortar_partition_bytes", "topics[].partitions[].bytes",
        "Bytes in segment files.", PerPartition(|p| Num(p.bytes))),
    row(Gauge, Count, "mortar_partition_segments", "topics[].partitions[].segments",
        "Segment files.", PerPartition(|p| Num(p.segments.into()))),
    row(Gauge, Label, "mortar_partition_poisoned", "topics[].partitions[].poisoned",
        "1 when an I/O error stopped its appends.", PerPartition(|p| Bool(p.poisoned))),
    row(Gauge, Count, "mortar_partition_producers", "topics[].partitions[].producers",
        "Idempotent producers remembered (at most --max-producers).",
        PerPartition(|p| Num(p.producers))),
    row(Counter, Count, "mortar_deliveries_total", "delivery.deliveries",
        "MSGs delivered (pushed or pulled).", Scalar(|s| Num(s.groups.stats.deliveries))),
    row(Counter, Count, "mortar_redeliveries_total", "delivery.redeliveries",
        "Deliveries with attempt > 1.", Scalar(|s| Num(s.groups.stats.redeliveries))),
    row(Counter, Count, "mortar_delivery_expiries_total", "delivery.expired",
        "Deliveries past --ack-wait.", Scalar(|s| Num(s.groups.stats.expired))),
    row(Counter, Records, "mortar_dead_letters_total", "delivery.dead_letters",
        "Records dead-lettered.", Scalar(|s| Num(s.groups.stats.dead_letters))),
    row(Counter, Count, "mortar_read_retries_total", "delivery.read_retries",
        "Record reads that failed (EIO, EMFILE) and were retried.",
        Scalar(|s| Num(s.groups.stats.read_retries))),
    row(Counter, Count, "mortar_assigns_taken_back_total", "delivery.assigns_taken_back",
        "ASSIGNs not CONTROL_ACKed within --revoke-timeout, taken back.",
        Scalar(|s| Num(s.groups.stats.assigns_taken_back))),
    row(Counter, Count, "mortar_groups_expired_total", "delivery.groups_expired",
        "Groups removed after --group-ttl without members, with their positions.",
        Scalar(|s| Num(s.groups.stats.groups_expired))),
    row(Counter, Count, "mortar_acks_total", METRICS_ONLY, "ACK frames received.",
        Scalar(|s| Num(frames_in(s, "ACK")))),
    row(Counter, Count, "mortar_nacks_total", METRICS_ONLY, "NACK frames received.",
        Scalar(|s| Num(frames_in(s, "NACK")))),
    info("groups[].group", "group", "Group name.",
        PerGroup(|_, g| Str(group_name(g).into_owned()))),
    info("groups[].group_id", NOT_EXPORTED, "Group id (0: read back at start, no member since).",
        PerGroup(|_, g| Num(g.group_id.into()))),
    info("groups[].topic_id", NOT_EXPORTED, "Topic id.", PerGroup(|_, g| Num(g.topic_id.into()))),
    info("groups[].topic", "topic", "Topic name.", PerGroup(|s, g| Str(topic_name(s, g).into()))),
    row(Gauge, Count, "mortar_group_members", METRICS_ONLY, "Members of the group.",
        PerGroup(|_, g| Num(g.members.len() as u64))),
    info("groups[].members[].member_id", "member", "Member id.", PerMember(|m| Num(m.member_id))),
    row(Gauge, Epoch, "mortar_member_membership_epoch", "groups[].members[].membership_epoch",
        "Epoch of the membership.", PerMember(|m| Num(m.membership_epoch.into()))),
    row(Gauge, Epoch, "mortar_member_assignment_epoch", "groups[].members[].assignment_epoch",
        "Epoch of the member's assignment.", PerMember(|m| Num(m.assignment_epoch.into()))),
    info("groups[].members[].subscription_id", NOT_EXPORTED, "Subscription id on its connection.",
        PerMember(|m| Num(m.subscription_id.into()))),
    row(Gauge, Label, "mortar_member_pull_mode", "groups[].members[].pull_mode",
        "1 when it pulls.", PerMember(|m| Bool(m.pull_mode))),
    row(Gauge, Records, "mortar_member_credit_records", "groups[].members[].credit_count",
        "Records of credit left.", PerMember(|m| Num(m.credit_count.into()))),
    row(Gauge, Bytes, "mortar_member_credit_bytes", "groups[].members[].credit_bytes",
        "Bytes of credit left.", PerMember(|m| Num(m.credit_bytes.into()))),
    row(Gauge, Records, "mortar_member_outstanding_records",
        "groups[].members[].outstanding_count", "Deliveries not yet settled.",
        PerMember(|m| Num(m.outstanding_count.into()))),
    row(Gauge, Bytes, "mortar_member_outstanding_bytes", "groups[].members[].outstanding_bytes",
        "Bytes of deliveries not yet settled.", PerMember(|m| Num(m.outstanding_bytes))),
    info("groups[].partitions[].partition", "partition", "Partition index.",
        PerGroupPartition(|_, _, p| Num(p.partition.into()))),
    row(Gauge, Label, "mortar_group_partition_owner", "groups[].partitions[].owner",
        "Owning member id (0: none).", PerGroupPartition(|_, _, p| Num(p.owner.unwrap_or(0)))),
    info("groups[].partitions[].state", NOT_EXPORTED, "Ownership state.",
        PerGroupPartition(|_, _, p| Str(format!("{:?}", p.state).to_lowercase()))),
    row(Gauge, Epoch, "mortar_group_partition_ownership_epoch",
        "groups[].partitions[].ownership_epoch", "Ownership epoch.",
        PerGroupPartition(|_, _, p| Num(p.ownership_epoch))),
    row(Gauge, Sequence, "mortar_group_partition_committed_sequence",
        "groups[].partitions[].committed", "Committed position.",
        PerGroupPartition(|_, _, p| Num(p.committed))),
    row(Gauge, Records, "mortar_consumer_lag_records", "groups[].partitions[].lag",
        "Records above the committed position.", PerGroupPartition(|s, g, p| Num(lag(s, g, p)))),
    row(Gauge, Records, "mortar_group_partition_outstanding_records",
        "groups[].partitions[].outstanding", "Deliveries not yet settled.",
        PerGroupPartition(|_, _, p| Num(p.outstanding as u64))),
    row(Gauge, Records, "mortar_group_partition_pending_redeliveries",
        "groups[].partitions[].pending_redeliveries", "Deliveries waiting to be sent again.",
        PerGroupPartition(|_, _, p| Num(p.pending_redeliveries as u64))),
    // Cluster nodes only (docs/REPLICATION.md §7.5).
    row(Gauge, Label, "mortar_cluster_node_id", "cluster.node_id", "This node's --node-id.",
        Cluster(|c| Num(c.node_id))),
    info("cluster.role", "role",
        "Raft role: leader, follower, candidate, pre-candidate; installing: taking a snapshot.",
        Cluster(|c| Str(c.role.into()))),
    row(Gauge, Label, "mortar_cluster_role", METRICS_ONLY, "Always 1; the raft role as a label.",
        ClusterLabel("role", |c| c.role)),
    row(Gauge, Epoch, "mortar_cluster_term", "cluster.term", "Raft term.",
        Cluster(|c| Num(c.term))),
    row(Gauge, Label, "mortar_cluster_leader_id", "cluster.leader_id",
        "The leader this node can reach: itself, or a peer whose link is up (0: none).",
        Cluster(|c| Num(c.leader_id))),
    row(Gauge, Sequence, "mortar_cluster_commit_index", "cluster.commit_index",
        "Last raft entry known committed.", Cluster(|c| Num(c.commit_index))),
    row(Gauge, Sequence, "mortar_cluster_applied_index", "cluster.applied_index",
        "Last raft entry applied to this broker.", Cluster(|c| Num(c.applied_index))),
    row(Gauge, Sequence, "mortar_cluster_last_index", "cluster.last_index",
        "Last raft entry in this node's log, committed or not.", Cluster(|c| Num(c.last_index))),
    row(Gauge, Sequence, "mortar_cluster_checkpoint_index", "cluster.checkpoint_index",
        "Raft entry of the journal's checkpoint: a start applies from the next.",
        Cluster(|c| Num(c.checkpoint_index))),
    row(Gauge, Sequence, "mortar_cluster_first_index", "cluster.first_index",
        "First raft entry still in the journal; the ones below were compacted.",
        Cluster(|c| Num(c.first_index))),
    row(Gauge, Bytes, "mortar_cluster_journal_bytes", "cluster.journal_bytes",
        "Entry bytes the raft journal still holds; a node that stays behind keeps it growing.",
        Cluster(|c| Num(c.journal_bytes))),
    row(Gauge, Milliseconds, "mortar_cluster_log_clock_seconds", "cluster.log_clock_ms",
        "The log's clock (Unix time): the newest leader's stamp applied; TTL, retention run on it.",
        Cluster(|c| Num(c.log_clock_ms))),
    row(Counter, Count, "mortar_cluster_clock_skewed_batches_total", "cluster.clock_skewed_batches",
        "BATCHes applied stamped over 30 s ahead of this node's wall clock: a clock set wrong.",
        Cluster(|c| Num(c.clock_skewed_batches))),
    row(Counter, Bytes, "mortar_cluster_snapshot_sent_bytes_total", "cluster.snapshot_bytes_sent",
        "Snapshot chunk bytes sent to nodes that installed one (INSTALL), since start.",
        Cluster(|c| Num(c.snapshot_bytes_sent))),
    row(Gauge, Bytes, "mortar_cluster_install_done_bytes", "cluster.install_bytes_done",
        "While this node installs a snapshot: bytes written so far (0 otherwise).",
        Cluster(|c| Num(c.install_bytes_done))),
    row(Gauge, Bytes, "mortar_cluster_install_total_bytes", "cluster.install_bytes_total",
        "While this node installs a snapshot: its bytes in all (0 otherwise).",
        Cluster(|c| Num(c.install_bytes_total))),
    row(Counter, Count, "mortar_peer_refused_total", "cluster.refused",
        "Peer connections, frames and raft messages refused, by reason (each logged at most \
         once a second).", ClusterByLabel("reason", |c| &c.refused)),
    info("cluster.peers[].id", "peer", "Peer node id.", PerPeer(|p| Num(p.id))),
    row(Gauge, Label, "mortar_peer_link_up", "cluster.peers[].link_up",
        "1 when both links with the peer are open and its HELLO was accepted.",
        PerPeer(|p| Bool(p.link_up))),
    row(Gauge, Milliseconds, "mortar_peer_last_contact_seconds", "cluster.peers[].last_contact_ms",
        "Time since a frame last arrived from the peer (none: never).",
        PerPeer(|p| p.last_contact_ms.map_or(Null, Num))),
    row(Gauge, Sequence, "mortar_peer_match_index", "cluster.peers[].match_index",
        "Last entry known in the peer's log (only while this node leads).",
        PerPeer(|p| p.match_index.map_or(Null, Num))),
    row(Gauge, Count, "mortar_peer_lag_entries", "cluster.peers[].lag",
        "Entries of this node's log the peer lacks (only while this node leads).",
        PerPeer(|p| p.lag.map_or(Null, Num))),
    info("cluster.peers[].client_addr", NOT_EXPORTED, "The peer's client address (its HELLO).",
        PerPeer(|p| Str(p.client_addr.clone()))),
    info("cluster.peers[].admin_addr", NOT_EXPORTED, "The peer's admin address (its HELLO).",
        PerPeer(|p| Str(p.admin_addr.clone()))),
    row(Counter, Bytes, "mortar_peer_bytes_in_total", "cluster.peers[].bytes_in",
        "Bytes read from the peer's links.", PerPeer(|p| Num(p.bytes_in))),
    row(Counter, Bytes, "mortar_peer_bytes_out_total", "cluster.peers[].bytes_out",
        "Bytes written to the peer's links.", PerPeer(|p| Num(p.bytes_out))),
    row(Counter, Count, "mortar_peer_frames_in_total", "cluster.peers[].frames_in",
        "Frames received from the peer.", PerPeer(|p| Num(p.frames_in))),
    row(Counter, Count, "mortar_peer_frames_out_total", "cluster.peers[].frames_out",
        "Raft frames queued for the peer (HELLOs not counted).", PerPeer(|p| Num(p.frames_out))),
];

/// One value of a row: its labels in `/metrics`, its element in each array on its
/// `/stats` path, and the value. A point without a value is an entity that holds the
/// row's entities, so that `/stats` shows its array even when empty.
pub struct Point<'a> {
    pub labels: Labels<'a>,
    pub at: Vec<usize>,
    pub value: Option<Json>,
}

pub type Labels<'a> = Vec<(&'static str, Cow<'a, str>)>;

impl Read {
    /// Every value the row reads from `s`, in snapshot order (none for histograms).
    pub fn points<'a>(&self, s: &'a Snapshot) -> Vec<Point<'a>> {
        let mut out = Vec::new();
        let mut put = |labels, at, value| out.push(Point { labels, at, value });
        let (topics, groups) = (
            s.topics.iter().enumerate(),
            s.groups.groups.iter().enumerate(),
        );
        let topic = |t: &'a TopicFigures| vec![("topic", Cow::from(t.name.as_str()))];
        let group = |g| vec![("group", group_name(g)), ("topic", topic_name(s, g).into())];
        let and = |mut labels: Labels<'a>, name, value: String| {
            labels.push((name, value.into()));
            labels
        };
        match self {
            Read::Scalar(read) => put(vec![], vec![], Some(read(s))),
            Read::ByLabel(label, read) => {
                for (value, n) in read(s) {
                    put(vec![(*label, value.into())], vec![], Some(Num(n)));
                }
            }
            Read::PerTopic(read) => topics.for_each(|(i, t)| put(topic(t), vec![i], Some(read(t)))),
            Read::PerGroup(read) => {
                groups.for_each(|(i, g)| put(group(g), vec![i], Some(read(s, g))))
            }
            Read::PerPartition(read) => {
                for (i, t) in topics {
                    put(topic(t), vec![i], None);
                    for (j, p) in t.partitions.iter().enumerate() {
                        let labels = and(topic(t), "partition", p.partition.to_string());
                        put(labels, vec![i, j], Some(read(p)));
                    }
                }
            }
            Read::PerMember(read) => {
                for (i, g) in groups {
                    put(group(g), vec![i], None);
                    for (j, m) in g.members.iter().enumerate() {
                        let labels = and(group(g), "member", m.member_id.to_string());
                        put(labels, vec![i, j], Some(read(m)));
                    }
                }
            }
            Read::PerGroupPartition(read) => {
                for (i, g) in groups {
                    put(group(g), vec![i], None);
                    for (j, p) in g.partitions.iter().enumerate() {
                        let labels = and(group(g), "partition", p.partition.to_string());
                        put(labels, vec![i, j], Some(read(s, g, p)));
                    }
                }
            }
            Read::Histogram { .. } => {}
            Read::Cluster(_)
            | Read::ClusterLabel(..)
            | Read::PerPeer(_)
            | Read::ClusterByLabel(..) => {
                if let Some(c) = &s.cluster {
                    self.cluster_points(c, &mut put);
                }
            }
        }
        out
    }

    /// The points of a cluster row, on a cluster node.
    fn cluster_points<'a>(
        &self,
        c: &'a ClusterFigures,
        put: &mut impl FnMut(Labels<'a>, Vec<usize>, Option<Json>),
    ) {
        match self {
            Read::Cluster(read) => put(vec![], vec![], Some(read(c))),
            Read::ClusterLabel(label, read) => {
                put(vec![(*label, read(c).into())], vec![], Some(Num(1)))
            }
            Read::ClusterByLabel(label, read) => {
                for &(value, n) in read(c) {
                    put(vec![(*label, value.into())], vec![], Some(Num(n)));
                }
            }
            Read::PerPeer(read) => {
                put(vec![], vec![], None);
                for (j, p) in c.peers.iter().enumerate() {
                    let labels = vec![("peer", Cow::from(p.id.to_string()))];
                    put(labels, vec![j], Some(read(p)));
                }
            }
            _ => unreachable!("not a cluster row"),
        }
    }
}

/// `fsync.mean_ms` is summed in µs and shown in ms.
const MICROSECONDS_PER_MS: f64 = 1e3;

/// The quantiles `/stats` shows of the fsync latency histogram.
const MEDIAN: f64 = 0.5;
const P99: f64 = 0.99;

/// The `q` quantile of fsync latency in ms, as an upper bound: the bound of the
/// histogram bucket it falls in, or the longest fsync if that is less (0 before the
/// first fsync).
fn fsync_quantile_ms(s: &Snapshot, q: f64) -> f64 {
    let counts = &s.broker.fsync_latency;
    let total: u64 = counts.iter().sum();
    // The rank of the quantile among the fsyncs, 1-based.
    let rank = (q * total as f64).ceil().max(1.0) as u64;
    let mut seen = 0;
    let bucket = counts.iter().position(|n| {
        seen += n;
        seen >= rank
    });
    let Some(bucket) = bucket.filter(|_| total > 0) else {
        return 0.0;
    };
    let bound = FSYNC_LATENCY_BUCKETS_US.get(bucket).copied();
    let micros = bound.map_or(s.broker.fsync_micros_max, |b| {
        b.min(s.broker.fsync_micros_max)
    });
    micros as f64 / MICROSECONDS_PER_MS
}

/// `total` per completed fsync (0 before the first).
fn per_fsync(s: &Snapshot, total: u64) -> f64 {
    match s.broker.fsyncs {
        0 => 0.0,
        fsyncs => total as f64 / fsyncs as f64,
    }
}

fn errors_by_name(s: &Snapshot) -> Vec<(&'static str, u64)> {
    let name = |code| ErrorCode::from_code(code).map_or("UNKNOWN", |c| c.name());
    s.errors_sent.iter().map(|(c, n)| (name(*c), *n)).collect()
}

fn frames_in(s: &Snapshot, op: &str) -> u64 {
    s.frames_in
        .iter()
        .find(|(o, _)| *o == op)
        .map_or(0, |f| f.1)
}

fn partitions(s: &Snapshot) -> impl Iterator<Item = &PartitionFigures> {
    s.topics.iter().flat_map(|t| &t.partitions)
}

fn group_name(g: &GroupSnapshot) -> Cow<'_, str> {
    String::from_utf8_lossy(&g.name)
}

fn topic_of<'a>(s: &'a Snapshot, g: &GroupSnapshot) -> Option<&'a TopicFigures> {
    s.topics.iter().find(|t| t.topic_id == g.topic_id)
}

/// The group's topic name, empty when the topic is gone.
fn topic_name<'a>(s: &'a Snapshot, g: &GroupSnapshot) -> &'a str {
    topic_of(s, g).map_or("", |t| &t.name)
}

fn lag(s: &Snapshot, g: &GroupSnapshot, p: &PartitionSnapshot) -> u64 {
    let last = topic_of(s, g)
        .and_then(|t| t.partitions.iter().find(|q| q.partition == p.partition))
        .map_or(0, |q| q.last_sequence);
    last.saturating_sub(p.committed)
}
