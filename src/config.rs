//! Command-line flags of `mortard`: parse, check, and describe them.
//!
//! This room turns `argv` into a typed [`Config`] (or a `--help` / `--version` text) and
//! says no, in one line, to anything an operator could get wrong. Every flag is one row of
//! `FLAGS`: name, group, the field it sets (which fixes its value form), its bounds and
//! a line of help. Parsing, range checks, `--help`, [`Config::flag_values`] and the test
//! that `man/mortard.8` documents the same flags with the same defaults all read that table.
//!
//! Defaults are not here: [`Config`] holds the layers' own config structs, so a default is
//! the one in `impl Default` of the layer that uses it (`ReactorConfig`, `BrokerConfig`,
//! `LogConfig`, `ConsumeConfig`), and unit tests of a layer run on the production numbers.
//! Only the flags no layer owns (`--admin-listen`, `--listen-peer`, `--token-file`,
//! `--fsync-threads`) have their defaults in [`Config`]'s `Default`, and the cluster flags
//! theirs in [`ClusterConfig`]'s until the replica room that will run them exists
//! (`docs/REPLICATION.md` §6, §10).
//!
//! Dependencies: `std`, `getopts`, and the config types (and limits) of `wire`, `log`,
//! `consume`, `broker` and `reactor`; nothing that runs.
//!
//! Conventions:
//! - Durations always carry a unit (`500ms`, `10s`, `2m`, `1h`, `7d`): a bare `30` is
//!   refused, because "30 what?" is how a 30 ms session timeout reaches production.
//!   Fields hold them as `_ms`.
//! - Sizes are binary (`KiB` = 1024 bytes). `MB`/`KB` are refused rather than guessed.
//! - Every flag takes effect at start; there is no reload (no SIGHUP).
//! - The log level is `--log-level`; `RUST_LOG` (env_logger syntax), when set, overrides
//!   it, because it is the finer tool (per-module filters) and what existing units set.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::PathBuf;
use std::time::Duration;

use crate::broker::BrokerConfig;
use crate::log::JOURNAL_FILE_BYTES_MAX;
use crate::log::JOURNAL_FILE_BYTES_MIN;
use crate::log::SEGMENT_BYTES_MAX;
use crate::reactor::ReactorConfig;
use crate::wire::limits::{FRAME_HEADER_BYTES, MAX_FRAME_LEN_BYTES};
pub use crate::wire::Durability;

/// Program name used in messages, so every error line starts the same way.
const PROGRAM: &str = "mortard";

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;
const TIB: u64 = 1024 * GIB;

const MS_PER_SECOND: u64 = 1000;
const MS_PER_MINUTE: u64 = 60 * MS_PER_SECOND;
const MS_PER_HOUR: u64 = 60 * MS_PER_MINUTE;
const MS_PER_DAY: u64 = 24 * MS_PER_HOUR;

/// Largest duration any flag accepts: 100 years. Deadlines are computed as
/// `Instant + Duration`, which panics on overflow; with `panic = "abort"` a typo such as
/// `--ack-wait 9999999999999d` would kill the broker on the first delivery instead of at
/// start. 100 years is far from overflow on every platform and longer than any retention.
pub const DURATION_MS_MAX: u64 = 36_500 * MS_PER_DAY;

/// Smallest `--segment-size`. Below a page or so, segment files, their `.idx` files and
/// their open descriptors multiply faster than the records they hold.
pub const SEGMENT_SIZE_BYTES_MIN: u64 = 4 * KIB;
/// Largest `--segment-size`. Segments are memory-mapped; a 32-bit host (the small boards
/// this broker is for) cannot map much more than 1 GiB of address space per file, and
/// retention deletes whole segments, so a huge segment makes retention coarse.
pub const SEGMENT_SIZE_BYTES_MAX: u64 = GIB;

/// Largest `--fsync-threads`. fdatasync calls to one disk gain nothing past a handful of
/// workers, and each thread reserves a stack that a small host feels.
pub const FSYNC_THREADS_MAX: u64 = 64;

/// Largest `--listen-backlog`: listen(2) takes an int.
pub const LISTEN_BACKLOG_MAX: u64 = i32::MAX as u64;

/// Largest `--max-credit-size`: SUB and CREDIT carry `credit_bytes` as a u32.
pub const CREDIT_SIZE_BYTES_MAX: u64 = u32::MAX as u64;

/// Largest `--node-id`: the spec's ids are 1..=255 (a u8 on the peer links).
pub const NODE_ID_MAX: u64 = u8::MAX as u64;

/// The cluster sizes `--peers` may name: odd, so that a majority is unambiguous, and small,
/// because every node holds every record (`docs/REPLICATION.md` §3).
pub const CLUSTER_NODES_ALLOWED: [usize; 2] = [3, 5];

/// `--raft-tick` bounds. Below 10 ms the tick timer would wake the reactor more often than
/// a pass takes on a busy host; above 10 s a failover would take minutes.
pub const RAFT_TICK_MS_MIN: u64 = 10;
pub const RAFT_TICK_MS_MAX: u64 = 10 * MS_PER_SECOND;

/// Largest `--heartbeat-ticks` and `--election-ticks`: with the longest tick, more would
/// put an election timeout past a day, which no operator means.
pub const RAFT_TICKS_MAX: u64 = 10_000;

/// The largest frame on the wire, length prefix included: the least `--max-output-size`.
const FRAME_BYTES_MAX: u64 = MAX_FRAME_LEN_BYTES as u64 + FRAME_HEADER_BYTES as u64;

// The log must open every segment size the flag allows.
const _: () = assert!(SEGMENT_SIZE_BYTES_MAX <= SEGMENT_BYTES_MAX);

/// What every duration error suggests instead.
const DURATION_HINT: &str = "use e.g. 500ms, 10s, 2m, 1h, 7d";
/// What every size error suggests instead.
const SIZE_HINT: &str = "use e.g. 4096, 512KiB, 16MiB, 1GiB; units B, KiB, MiB, GiB, TiB";

/// Everything `mortard` is told at start: the layers' configs, which `main` hands over
/// whole, and the few flags `main` itself acts on. See `mortard --help`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Network and per-connection limits. `tokens` is filled by `main` from `token_file`.
    pub reactor: ReactorConfig,
    /// Storage, publish and (in `broker.consume`) consume settings.
    pub broker: BrokerConfig,
    /// `--admin-listen`: admin HTTP listener; `None` = off.
    pub admin_listen: Option<SocketAddr>,
    /// `--listen-peer`: where a cluster node accepts peer links (`None`: its `--peers`
    /// entry); ignored, with a warning, without `--peers`.
    pub listen_peer: Option<SocketAddr>,
    /// `--node-id`, `--peers` and the replication settings.
    pub cluster: ClusterConfig,
    /// `--token-file`: one token per line; `None` = every token is accepted.
    pub token_file: Option<PathBuf>,
    /// `--fsync-threads`: fdatasync worker pool size.
    pub fsync_threads: usize,
    /// `--log-level`: the most detailed lines logged, unless `RUST_LOG` is set.
    pub log_level: LogLevel,
    /// `--log-format`: how each log line on standard error is written.
    pub log_format: LogFormat,
}

/// One `--peers` entry: a node's id and the address its peer links are dialled at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub id: u8,
    pub addr: SocketAddr,
}

/// The cluster flags (`docs/REPLICATION.md` §6). Without `--peers` the broker is a single
/// node and only the tuning values are checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// `--node-id`: this node's id among `peers`; required with `--peers`.
    pub node_id: Option<u8>,
    /// `--peers`: every node of the cluster, this one included, sorted by id; empty = a
    /// single node.
    pub peers: Vec<Peer>,
    /// `--advertise`: the client address peers hand out in NOT_LEADER; `None` = `--listen`.
    pub advertise: Option<SocketAddr>,
    /// `--replication-timeout`: how long a REPLICATED PUB waits for a majority, and how
    /// long a node may be without a leader before LEADER_UNKNOWN becomes
    /// ELECTION_TIMEOUT.
    pub replication_timeout_ms: u64,
    /// `--raft-tick`: raft's logical clock.
    pub raft_tick_ms: u64,
    /// `--heartbeat-ticks`: a leader heartbeats every this many ticks.
    pub heartbeat_ticks: u32,
    /// `--election-ticks`: a follower that heard no leader for a random time in
    /// `[election_ticks, 2 * election_ticks)` ticks starts an election.
    pub election_ticks: u32,
    /// `--journal-retain`: journal kept for lagging followers before they get a snapshot.
    pub journal_retain_bytes: u64,
    /// `--cluster-id`: the cluster's own id, written into a data directory that has none
    /// and checked against one that has (`broker::settle_cluster_id`).
    pub cluster_id: Option<u64>,
}

impl Default for ClusterConfig {
    /// Fails over in about 1.6 s (`docs/REPLICATION.md` §6): an election after 0.5–1.0 s
    /// of silence, heartbeats every 100 ms.
    fn default() -> Self {
        ClusterConfig {
            node_id: None,
            peers: Vec::new(),
            advertise: None,
            replication_timeout_ms: 5 * MS_PER_SECOND,
            raft_tick_ms: 50,
            heartbeat_ticks: 2,
            election_ticks: 10,
            journal_retain_bytes: 256 * MIB,
            cluster_id: None,
        }
    }
}

impl ClusterConfig {
    /// `--peers` was given: this node is one of a cluster.
    pub fn is_cluster(&self) -> bool {
        !self.peers.is_empty()
    }

    /// This node's own `--peers` entry.
    pub fn own_peer(&self) -> Option<Peer> {
        let id = self.node_id?;
        self.peers.iter().copied().find(|p| p.id == id)
    }
}

/// `--log-level`, least to most detailed; `main` maps it onto the `log` crate's levels
/// (this module has no logger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

impl LogLevel {
    pub const ALL: [LogLevel; 5] = [
        LogLevel::Error,
        LogLevel::Warn,
        LogLevel::Info,
        LogLevel::Debug,
        LogLevel::Trace,
    ];

    /// The flag value, as `--log-level` takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogLevel::Error => "error",
            LogLevel::Warn => "warn",
            LogLevel::Info => "info",
            LogLevel::Debug => "debug",
            LogLevel::Trace => "trace",
        }
    }
}

/// `--log-format`: `text` for a person reading the journal, `json` (one object per line)
/// for a log shipper.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

impl LogFormat {
    pub const ALL: [LogFormat; 2] = [LogFormat::Text, LogFormat::Json];

    /// The flag value, as `--log-format` takes it.
    pub fn name(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            reactor: ReactorConfig::default(),
            broker: BrokerConfig::default(),
            admin_listen: Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7412))),
            listen_peer: None,
            cluster: ClusterConfig::default(),
            token_file: None,
            fsync_threads: 2,
            log_level: LogLevel::Info,
            log_format: LogFormat::Text,
        }
    }
}

/// What the command line asks for.
// `Run` is much larger than the text variants; boxing it would buy nothing, since the
// command line is parsed once per process.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Start the broker with this (validated) configuration.
    Run(Config),
    /// Print this text to stdout and exit 0.
    Help(String),
    /// Print this text to stdout and exit 0.
    Version(String),
}

/// A usage error: one line, starting with `mortard:`, naming the flag and the bad value.
/// `main` prints it to stderr and exits 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// A usage error about one flag: `mortard: --flag: <why>`.
fn flag_error(name: &str, why: &str) -> ConfigError {
    ConfigError(format!("{PROGRAM}: --{name}: {why}"))
}

// ---- The flag table: the single list that drives parsing, checks, --help and rendering. ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Group {
    Network,
    Storage,
    Publish,
    Consume,
    Cluster,
    Limits,
    Logging,
}

const GROUPS: [(Group, &str); 7] = [
    (Group::Network, "Network"),
    (Group::Storage, "Storage"),
    (Group::Publish, "Publish"),
    (Group::Consume, "Consume"),
    (Group::Cluster, "Cluster"),
    (Group::Limits, "Limits"),
    (Group::Logging, "Logging"),
];

/// Reads and writes one non-numeric field of a [`Config`].
struct At<T: 'static> {
    get: fn(&Config) -> &T,
    get_mut: fn(&mut Config) -> &mut T,
}

/// Reads and writes one numeric field of a [`Config`] as a `u64`, whatever its type.
struct Num {
    get: fn(&Config) -> u64,
    set: fn(&mut Config, u64),
}

/// The field a flag sets; its variant fixes the value form (`--help`'s second column),
/// the parser and the renderer.
enum Field {
    Addr(At<SocketAddr>),
    AddrOrOff(At<Option<SocketAddr>>),
    /// An address that may be unset (rendered `none`): another flag supplies it.
    OptAddr(At<Option<SocketAddr>>),
    /// `--node-id`: 1..=[`NODE_ID_MAX`], or unset (rendered `none`).
    NodeId(At<Option<u8>>),
    /// `--peers`: `ID=IP:PORT,...`, or `off`.
    Peers(At<Vec<Peer>>),
    /// `--cluster-id`: 16 hexadecimal digits, not all zero; or unset (rendered `none`).
    ClusterId(At<Option<u64>>),
    Path(At<PathBuf>),
    /// A path that may be unset (rendered `none`).
    OptPath(At<Option<PathBuf>>),
    Durability(At<Durability>),
    LogLevel(At<LogLevel>),
    LogFormat(At<LogFormat>),
    /// Milliseconds, written with a unit.
    Dur(Num),
    /// Bytes, written with a binary unit or none.
    Size(Num),
    /// A whole number no larger than the second value (what the field's type can hold).
    Count(Num, u64),
}

/// Which parsed values a flag accepts; checked before the field is set, and again by
/// [`Config::validate`] for a `Config` built in code.
#[derive(Clone, Copy)]
enum Bounds {
    Any,
    /// A count of 0 would disable what the flag limits.
    AtLeastOne,
    /// A duration of 0 has no "off" meaning; the text says what 0 would do.
    Positive(&'static str),
    /// `min..=max`, and why the limit, if the message should say.
    Within(u64, u64, &'static str),
}

struct FlagSpec {
    /// Long name without the leading `--`.
    name: &'static str,
    group: Group,
    field: Field,
    bounds: Bounds,
    /// One short line for `--help`; the man page has the long story.
    help: &'static str,
}

const fn row(
    name: &'static str,
    group: Group,
    field: Field,
    bounds: Bounds,
    help: &'static str,
) -> FlagSpec {
    FlagSpec {
        name,
        group,
        field,
        bounds,
        help,
    }
}

/// The field types a numeric flag may set.
trait Unsigned: TryFrom<u64> + TryInto<u64> {
    const MAX: Self;
}
impl Unsigned for u16 {
    const MAX: Self = u16::MAX;
}
impl Unsigned for u32 {
    const MAX: Self = u32::MAX;
}
impl Unsigned for u64 {
    const MAX: Self = u64::MAX;
}
impl Unsigned for usize {
    const MAX: Self = usize::MAX;
}

fn widen<T: Unsigned>(v: T) -> u64 {
    v.try_into().unwrap_or(u64::MAX)
}

/// Bounds and count caps are checked before a set, so only a size in a `usize` field on a
/// 32-bit host can be too large here; it saturates, which for a byte budget means "more
/// than this host can address".
fn narrow<T: Unsigned>(v: u64) -> T {
    T::try_from(v).unwrap_or(T::MAX)
}

/// `field!(Kind, path.to.field)`: the accessors of one field, for a row of [`FLAGS`].
macro_rules! field {
    (Dur, $($f:ident).+) => { Field::Dur(field!(num $($f).+)) };
    (Size, $($f:ident).+) => { Field::Size(field!(num $($f).+)) };
    (Count($max:expr), $($f:ident).+) => { Field::Count(field!(num $($f).+), $max as u64) };
    (num $($f:ident).+) => {
        Num { get: |c| widen(c.$($f).+), set: |c, v| c.$($f).+ = narrow(v) }
    };
    ($kind:ident, $($f:ident).+) => {
        Field::$kind(At { get: |c| &c.$($f).+, get_mut: |c| &mut c.$($f).+ })
    };
}

/// Every flag, in `--help` order. Adding a flag is one row here (plus its field and
/// default in the owning layer's config, and its entry in `man/mortard.8`).
#[rustfmt::skip]
const FLAGS: &[FlagSpec] = {
    use Bounds::{AtLeastOne, Any, Positive, Within};
    use Group::{Cluster, Consume, Limits, Logging, Network, Publish, Storage};
    &[
    row("listen", Network, field!(Addr, reactor.listen), Any,
        "client protocol (v1) listener, IP:PORT"),
    row("admin-listen", Network, field!(AddrOrOff, admin_listen), Any,
        "admin HTTP /healthz /metrics /stats; keep on loopback"),
    row("listen-peer", Network, field!(AddrOrOff, listen_peer), Any,
        "cluster peer links; default: own --peers entry"),
    row("token-file", Network, field!(OptPath, token_file), Any,
        "CONNECT tokens, one per line; none = accept all"),
    row("max-connections", Network, field!(Count(u32::MAX), reactor.max_connections),
        AtLeastOne, "client connections; more get CONNECTION_LIMIT"),
    row("listen-backlog", Network, field!(Count(LISTEN_BACKLOG_MAX), reactor.listen_backlog),
        Any, "queued connections; 0 = net.core.somaxconn, >= 1024"),
    row("idle-timeout", Network, field!(Dur, reactor.idle_timeout_ms),
        Positive("0 would close every connection at once"),
        "close a connection with no complete frame this long"),
    row("half-frame-timeout", Network, field!(Dur, reactor.half_frame_timeout_ms),
        Positive("0 would close every connection in the middle of its first frame"),
        "close a connection whose begun frame is not done"),
    row("connect-timeout", Network, field!(Dur, reactor.connect_timeout_ms),
        Positive("0 would close every connection before its CONNECT"),
        "close a connection not CONNECTed this long"),
    row("data-dir", Storage, field!(Path, broker.data_dir), Any,
        "segment log, topic registry and group positions"),
    row("segment-size", Storage, field!(Size, broker.log.segment_size_bytes),
        Within(SEGMENT_SIZE_BYTES_MIN, SEGMENT_SIZE_BYTES_MAX, ""),
        "start a new segment file at this size (4KiB..1GiB)"),
    row("journal-file-size", Storage, field!(Size, broker.journal_file_bytes),
        Within(JOURNAL_FILE_BYTES_MIN, JOURNAL_FILE_BYTES_MAX, ""),
        "journal file size; a checkpoint each (64KiB..1GiB)"),
    row("retention-size", Storage, field!(Size, broker.log.retention_size_bytes), Any,
        "per partition, oldest deleted first; 0 = unlimited"),
    row("retention-age", Storage, field!(Dur, broker.log.retention_age_ms), Any,
        "delete segments older than this; 0s = unlimited"),
    row("max-data-size", Storage, field!(Size, broker.max_data_bytes), Any,
        "data dir cap, then STORAGE_FULL; 0 = unlimited"),
    row("fsync-threads", Storage, field!(Count(u32::MAX), fsync_threads),
        Within(1, FSYNC_THREADS_MAX, ""), "fdatasync worker threads (1..64)"),
    row("durability", Storage, field!(Durability, broker.durability), Any,
        "what a PUB with DEFAULT durability waits for"),
    row("producer-ttl", Publish, field!(Dur, broker.producer_ttl_ms),
        Positive("0 would forget producers at once and disable deduplication"),
        "forget an idle producer's dedup state after this"),
    row("max-partitions", Publish, field!(Count(u16::MAX), broker.max_partitions),
        AtLeastOne, "largest partition count of a topic (1..65535)"),
    row("max-producers", Publish, field!(Count(u32::MAX), broker.max_producers_per_partition),
        AtLeastOne, "per partition: producers deduplicated; idlest evicted"),
    row("session-timeout", Consume, field!(Dur, broker.consume.session_timeout_ms),
        Positive("0 would expel every member at once"),
        "expel a group member silent for this long"),
    row("revoke-timeout", Consume, field!(Dur, broker.consume.revoke_timeout_ms),
        Positive("0 would move partitions before the old owner can stop"),
        "take back a REVOKE or ASSIGN not CONTROL_ACKed then"),
    row("ack-wait", Consume, field!(Dur, broker.consume.ack_wait_ms),
        Positive("0 would redeliver every message as soon as it is sent"),
        "redeliver a delivery not ACKed or NACKed within this"),
    row("nack-delay", Consume, field!(Dur, broker.consume.nack_delay_ms),
        Positive("use e.g. 10ms for a near-immediate retry"),
        "redeliver after NACK RETRY once this has passed"),
    row("max-attempts", Consume, field!(Count(u16::MAX), broker.consume.max_attempts),
        AtLeastOne, "dead-letter a record failing this attempt (1..65535)"),
    row("max-credit-count", Consume, field!(Count(u16::MAX), broker.consume.max_credit_count),
        AtLeastOne, "credit window cap in messages, per subscription"),
    row("max-credit-size", Consume, field!(Size, broker.consume.max_credit_bytes),
        Within(1, CREDIT_SIZE_BYTES_MAX, ": credit_bytes is a u32 on the wire"),
        "credit window cap in bytes, per subscription"),
    row("commit-interval", Consume, field!(Dur, broker.commit_interval_ms),
        Positive("0 would rewrite the groups file on every ACK"),
        "persist group positions at least this often"),
    row("group-ttl", Consume, field!(Dur, broker.consume.group_ttl_ms),
        Positive("0 would remove a group as soon as its last member leaves"),
        "remove a group without members, and its positions"),
    row("node-id", Cluster, field!(NodeId, cluster.node_id), Any,
        "this node's id in --peers (1..255); with --peers only"),
    row("peers", Cluster, field!(Peers, cluster.peers), Any,
        "every node's peer address, this one too (3 or 5)"),
    row("cluster-id", Cluster, field!(ClusterId, cluster.cluster_id), Any,
        "this cluster's id (16 hex digits), kept in the data dir"),
    row("advertise", Cluster, field!(OptAddr, cluster.advertise), Any,
        "client address NOT_LEADER names; none = --listen"),
    row("replication-timeout", Cluster, field!(Dur, cluster.replication_timeout_ms),
        Positive("0 would time out every REPLICATED PUB at once"),
        "REPLICATED wait, then REPLICATION_TIMEOUT"),
    row("raft-tick", Cluster, field!(Dur, cluster.raft_tick_ms),
        Within(RAFT_TICK_MS_MIN, RAFT_TICK_MS_MAX, ""), "raft's clock (10ms..10s)"),
    row("heartbeat-ticks", Cluster, field!(Count(u32::MAX), cluster.heartbeat_ticks),
        Within(1, RAFT_TICKS_MAX, ""), "the leader heartbeats every N ticks"),
    row("election-ticks", Cluster, field!(Count(u32::MAX), cluster.election_ticks),
        Within(1, RAFT_TICKS_MAX, ""), "elect after N..2N ticks without a leader"),
    row("journal-retain", Cluster, field!(Size, cluster.journal_retain_bytes), Any,
        "journal kept for laggards, then a snapshot"),
    row("max-memory", Limits, field!(Size, reactor.max_memory_bytes), Any,
        "broker-wide buffer budget, then MEMORY_LIMIT"),
    row("max-output-size", Limits, field!(Size, reactor.max_output_bytes), Any,
        "per connection: close a client whose output exceeds"),
    row("max-pending-requests", Limits, field!(Count(u32::MAX), reactor.max_pending_requests),
        AtLeastOne, "per connection: stop reading till half are answered"),
    row("max-subscriptions", Limits,
        field!(Count(u16::MAX), broker.consume.max_subscriptions_per_conn),
        AtLeastOne, "per connection (1..65535)"),
    row("max-groups", Limits, field!(Count(u32::MAX), broker.consume.max_groups),
        AtLeastOne, "consumer groups, broker-wide"),
    row("max-members-per-group", Limits,
        field!(Count(u32::MAX), broker.consume.max_members_per_group),
        AtLeastOne, "members in one consumer group"),
    row("log-level", Logging, field!(LogLevel, log_level), Any,
        "error, warn, info, debug or trace; RUST_LOG overrides"),
    row("log-format", Logging, field!(LogFormat, log_format), Any,
        "stderr lines as text or JSON objects, one per line"),
    ]
};

impl FlagSpec {
    /// The value form shown in `--help`.
    fn form(&self) -> &'static str {
        match self.field {
            Field::Addr(_) => "ADDR",
            Field::AddrOrOff(_) => "ADDR|off",
            Field::OptAddr(_) => "ADDR",
            Field::NodeId(_) => "N",
            Field::Peers(_) => "ID=ADDR,...",
            Field::ClusterId(_) => "HEX16",
            Field::Path(_) | Field::OptPath(_) => "PATH",
            Field::Durability(_) => "LEVEL",
            Field::LogLevel(_) => "LEVEL",
            Field::LogFormat(_) => "text|json",
            Field::Dur(_) => "DUR",
            Field::Size(_) => "SIZE",
            Field::Count(..) => "N",
        }
    }

    /// Sets the field from its command-line text. The error is the reason only; the
    /// caller adds the program and flag name.
    fn apply(&self, c: &mut Config, text: &str) -> Result<(), String> {
        match &self.field {
            Field::Addr(at) => *(at.get_mut)(c) = parse_addr(text)?,
            Field::AddrOrOff(at) => *(at.get_mut)(c) = parse_addr_or_off(text)?,
            Field::OptAddr(at) => *(at.get_mut)(c) = Some(parse_addr(text)?),
            Field::NodeId(at) => *(at.get_mut)(c) = Some(parse_node_id(text)?),
            Field::Peers(at) => *(at.get_mut)(c) = parse_peers(text)?,
            Field::ClusterId(at) => *(at.get_mut)(c) = Some(parse_cluster_id(text)?),
            Field::Path(at) => *(at.get_mut)(c) = parse_path(text)?,
            Field::OptPath(at) => *(at.get_mut)(c) = Some(parse_path(text)?),
            Field::Durability(at) => *(at.get_mut)(c) = parse_durability(text)?,
            Field::LogLevel(at) => *(at.get_mut)(c) = parse_log_level(text)?,
            Field::LogFormat(at) => *(at.get_mut)(c) = parse_log_format(text)?,
            Field::Dur(num) => {
                let ms = parse_duration(text)?.as_millis();
                self.set_number(c, num, u64::try_from(ms).unwrap_or(u64::MAX))?
            }
            Field::Size(num) => self.set_number(c, num, parse_size(text)?)?,
            Field::Count(num, max) => self.set_number(c, num, parse_count(text, *max)?)?,
        }
        Ok(())
    }

    fn set_number(&self, c: &mut Config, num: &Num, value: u64) -> Result<(), String> {
        self.check_number(value)?;
        (num.set)(c, value);
        Ok(())
    }

    /// The rules on this flag's value alone.
    fn check(&self, c: &Config) -> Result<(), String> {
        match &self.field {
            Field::Path(at) if (at.get)(c).as_os_str().is_empty() => {
                Err("must not be empty".to_string())
            }
            Field::Dur(num) | Field::Size(num) | Field::Count(num, _) => {
                self.check_number((num.get)(c))
            }
            _ => Ok(()),
        }
    }

    fn check_number(&self, v: u64) -> Result<(), String> {
        match self.bounds {
            Bounds::AtLeastOne if v == 0 => Err("must be at least 1".to_string()),
            Bounds::Positive(why) if v == 0 => Err(format!("must be more than 0s ({why})")),
            Bounds::Within(min, max, why) if !(min..=max).contains(&v) => Err(format!(
                "{} is out of range (allowed {}..{}{why})",
                self.show(v),
                self.show(min),
                self.show(max)
            )),
            _ => Ok(()),
        }
    }

    /// The field's value in the syntax [`parse_args`] accepts; `None` if unset.
    fn render(&self, c: &Config) -> Option<String> {
        let text = match &self.field {
            Field::Addr(at) => (at.get)(c).to_string(),
            Field::AddrOrOff(at) => format_addr_or_off(*(at.get)(c)),
            Field::OptAddr(at) => return (at.get)(c).map(|a| a.to_string()),
            Field::NodeId(at) => return (at.get)(c).map(|id| id.to_string()),
            Field::Peers(at) => format_peers((at.get)(c)),
            Field::ClusterId(at) => return (at.get)(c).map(|id| format!("{id:016x}")),
            Field::Path(at) => (at.get)(c).display().to_string(),
            Field::OptPath(at) => return (at.get)(c).as_ref().map(|p| p.display().to_string()),
            Field::Durability(at) => (at.get)(c).to_string(),
            Field::LogLevel(at) => (at.get)(c).name().to_string(),
            Field::LogFormat(at) => (at.get)(c).name().to_string(),
            Field::Dur(num) | Field::Size(num) | Field::Count(num, _) => self.show((num.get)(c)),
        };
        Some(text)
    }

    /// A numeric value in this flag's unit.
    fn show(&self, v: u64) -> String {
        match self.field {
            Field::Dur(_) => format_duration(Duration::from_millis(v)),
            Field::Size(_) => format_size(v),
            _ => v.to_string(),
        }
    }
}

impl Config {
    /// Checks every flag's bounds and the rules that involve more than one field.
    /// [`parse_args`] calls it; call it yourself on a `Config` built in code (tests,
    /// embedding).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for flag in FLAGS {
            flag.check(self)
                .map_err(|why| flag_error(flag.name, &why))?;
        }
        self.validate_sizes()?;
        self.validate_listeners()?;
        self.validate_raft_clock()?;
        if self.cluster.is_cluster() {
            self.validate_cluster()
        } else {
            self.validate_single_node()
        }
    }

    /// Raft's own rule (its `Config::validate`): a follower must hear several heartbeats
    /// within one election timeout, or it calls elections against a live leader.
    fn validate_raft_clock(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if c.election_ticks <= c.heartbeat_ticks {
            return Err(flag_error(
                "election-ticks",
                &format!(
                    "{} must be more than --heartbeat-ticks {}",
                    c.election_ticks, c.heartbeat_ticks
                ),
            ));
        }
        // A laggard gets a snapshot once it is this far behind: less than one journal file
        // would send snapshots to a follower that merely restarted.
        let (retain, file) = (c.journal_retain_bytes, self.broker.journal_file_bytes);
        not_below("journal-retain", retain, "journal-file-size", file, "")
    }

    /// Without `--peers`, the flags that only name this node's place in a cluster would
    /// silently do nothing; they are refused instead.
    fn validate_single_node(&self) -> Result<(), ConfigError> {
        let why = "only with --peers (without it this is a single node)";
        if self.cluster.node_id.is_some() {
            return Err(flag_error("node-id", why));
        }
        if self.cluster.advertise.is_some() {
            return Err(flag_error("advertise", why));
        }
        if self.cluster.cluster_id.is_some() {
            return Err(flag_error("cluster-id", why));
        }
        if self.broker.durability == Durability::Replicated {
            return Err(flag_error(
                "durability",
                "replicated needs --peers (a single node answers REPLICATED with \
                 0x600B DURABILITY_UNAVAILABLE)",
            ));
        }
        Ok(())
    }

    fn validate_cluster(&self) -> Result<(), ConfigError> {
        let c = &self.cluster;
        if !CLUSTER_NODES_ALLOWED.contains(&c.peers.len()) {
            return Err(flag_error(
                "peers",
                &format!(
                    "{} nodes; a cluster has 3 or 5 (an odd number, for a clear majority)",
                    c.peers.len()
                ),
            ));
        }
        for (i, a) in c.peers.iter().enumerate() {
            if let Some(b) = c.peers[i + 1..].iter().find(|b| b.addr == a.addr) {
                let why = format!("nodes {} and {} share the address {}", a.id, b.id, a.addr);
                return Err(flag_error("peers", &why));
            }
        }
        let Some(id) = c.node_id else {
            return Err(flag_error(
                "peers",
                "needs --node-id (which of them this node is)",
            ));
        };
        if c.own_peer().is_none() {
            let ids: Vec<String> = c.peers.iter().map(|p| p.id.to_string()).collect();
            let why = format!("{id} is not in --peers (ids {})", ids.join(", "));
            return Err(flag_error("node-id", &why));
        }
        let listen = self.reactor.listen;
        if c.advertise.is_none() && listen.ip().is_unspecified() {
            return Err(flag_error(
                "advertise",
                &format!(
                    "required with --peers when --listen {listen} is an unspecified \
                     address: NOT_LEADER must name an address clients can reach"
                ),
            ));
        }
        Ok(())
    }

    fn validate_sizes(&self) -> Result<(), ConfigError> {
        let log = &self.broker.log;
        // Retention deletes whole closed segments, so a limit below one segment can never
        // be met; it is almost always a unit slip (MiB for GiB).
        if log.retention_size_bytes != 0 {
            let why = " (retention deletes whole segments; use 0 for unlimited)";
            let (retention, segment) = (log.retention_size_bytes, log.segment_size_bytes);
            not_below("retention-size", retention, "segment-size", segment, why)?;
        }
        // Below one segment, the first PUB of a new partition would already be STORAGE_FULL.
        if self.broker.max_data_bytes != 0 {
            let why = " (use 0 for unlimited)";
            let (cap, segment) = (self.broker.max_data_bytes, log.segment_size_bytes);
            not_below("max-data-size", cap, "segment-size", segment, why)?;
        }
        // A connection must be able to hold one maximal frame, or a consumer that is sent
        // one large message is closed although it did nothing wrong.
        let output = widen(self.reactor.max_output_bytes);
        if output < FRAME_BYTES_MAX {
            return Err(flag_error(
                "max-output-size",
                &format!(
                    "{} is below one maximal frame ({FRAME_BYTES_MAX}B = 16MiB + 4B header)",
                    format_size(output)
                ),
            ));
        }
        // A consumer may be granted --max-credit-size bytes of pushed MSGs; if the output cap
        // were lower, a client that follows its credit could be closed for it.
        let credit = u64::from(self.broker.consume.max_credit_bytes);
        not_below("max-output-size", output, "max-credit-size", credit, "")?;
        // The broker-wide budget must hold at least one connection's worth of output.
        let memory = widen(self.reactor.max_memory_bytes);
        not_below("max-memory", memory, "max-output-size", output, "")
    }

    /// Catches a clash here with a message naming both flags, instead of EADDRINUSE from
    /// whichever bind happens second.
    fn validate_listeners(&self) -> Result<(), ConfigError> {
        let listeners = [
            ("listen", Some(self.reactor.listen)),
            ("admin-listen", self.admin_listen),
            // Without --listen-peer, peer links are accepted at this node's --peers entry.
            match self.listen_peer {
                Some(addr) => ("listen-peer", Some(addr)),
                None => ("peers", self.listen_peer_addr()),
            },
        ];
        for (i, (name_a, addr_a)) in listeners.iter().enumerate() {
            for (name_b, addr_b) in &listeners[i + 1..] {
                if let (Some(a), Some(b)) = (addr_a, addr_b) {
                    if addrs_clash(*a, *b) {
                        return Err(flag_error(
                            name_b,
                            &format!("{b} clashes with --{name_a} {a}; use another port"),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// Where peer links are accepted: `--listen-peer`, else this node's `--peers` entry.
    pub fn listen_peer_addr(&self) -> Option<SocketAddr> {
        self.listen_peer
            .or_else(|| self.cluster.own_peer().map(|p| p.addr))
    }

    /// Settings that are legal but worth a `warn!` at start; `main` logs each line (this
    /// module has no logger).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(admin) = self.admin_listen {
            if !admin.ip().is_loopback() {
                out.push(format!(
                    "--admin-listen {admin} is not loopback: /stats and /metrics show topic \
                     and group names to anyone who can reach it; firewall it"
                ));
            }
        }
        if self.token_file.is_none() && !self.reactor.listen.ip().is_loopback() {
            out.push(format!(
                "--listen {} is not loopback and there is no --token-file: anyone who can \
                 reach it can publish and consume; give it a token file or firewall it",
                self.reactor.listen
            ));
        }
        let peer_listen = self
            .listen_peer_addr()
            .filter(|_| self.cluster.is_cluster());
        if let Some(peer) = peer_listen.filter(|a| !a.ip().is_loopback()) {
            out.push(format!(
                "peer links on {peer} are plain TCP (peer TLS is not built yet): whoever \
                 reaches the port can speak for a node; keep it on a private network and \
                 give every node --cluster-id"
            ));
        }
        if let Some(peer) = self.listen_peer.filter(|_| !self.cluster.is_cluster()) {
            out.push(format!(
                "--listen-peer {peer} without --peers: a single node; nothing listens there"
            ));
        }
        out
    }

    /// Every flag with its value in flag syntax, in `--help` order, e.g.
    /// `("segment-size", Some("16MiB"))`. `None` means the flag is unset (only
    /// `--token-file`). For the startup log line and `/stats`.
    pub fn flag_values(&self) -> Vec<(&'static str, Option<String>)> {
        FLAGS.iter().map(|f| (f.name, f.render(self))).collect()
    }
}

/// `--name` (a size) must be at least `--other`'s value.
fn not_below(
    name: &str,
    value: u64,
    other: &str,
    floor: u64,
    why: &str,
) -> Result<(), ConfigError> {
    if value < floor {
        return Err(flag_error(
            name,
            &format!(
                "{} is smaller than --{other} {}{why}",
                format_size(value),
                format_size(floor)
            ),
        ));
    }
    Ok(())
}

/// Two listeners clash if they name the same port on the same or an overlapping address
/// (an unspecified address, 0.0.0.0 or [::], overlaps every other). Port 0 (pick any free
/// port, used by tests) never clashes.
fn addrs_clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

// ---- Parsing the command line. ----

fn options() -> getopts::Options {
    let mut opts = getopts::Options::new();
    for f in FLAGS {
        opts.optopt("", f.name, f.help, f.form());
    }
    opts.optflag("h", "help", "print this help and exit");
    opts.optflag("V", "version", "print the version and exit");
    opts
}

/// Parses the arguments after `argv[0]`. `--help` and `--version` win over everything
/// else that is well-formed; values are checked (and the result validated) only for `Run`.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Command, ConfigError> {
    let args: Vec<String> = args.into_iter().collect();
    let matches = options().parse(&args).map_err(getopts_error)?;
    if matches.opt_present("help") {
        return Ok(Command::Help(help_text()));
    }
    if matches.opt_present("version") {
        return Ok(Command::Version(version_text()));
    }
    if let Some(stray) = matches.free.first() {
        return Err(ConfigError(format!(
            "{PROGRAM}: unexpected argument '{stray}' (mortard takes only flags; \
             see mortard --help)"
        )));
    }
    let mut config = Config::default();
    for f in FLAGS {
        if let Some(value) = matches.opt_str(f.name) {
            f.apply(&mut config, &value)
                .map_err(|why| flag_error(f.name, &why))?;
        }
    }
    // In a cluster, a PUB asking for the DEFAULT durability gets REPLICATED: the level
    // that survives the loss of a node, which is what a cluster is run for.
    if config.cluster.is_cluster() && !matches.opt_present("durability") {
        config.broker.durability = Durability::Replicated;
    }
    config.validate()?;
    Ok(Command::Run(config))
}

/// getopts names options without dashes; put them back so the operator sees what to type.
fn getopts_error(fail: getopts::Fail) -> ConfigError {
    fn dashed(name: &str) -> String {
        if name.chars().count() == 1 {
            format!("-{name}")
        } else {
            format!("--{name}")
        }
    }
    let text = match fail {
        getopts::Fail::UnrecognizedOption(n) => {
            format!("unknown option '{}' (see mortard --help)", dashed(&n))
        }
        getopts::Fail::ArgumentMissing(n) => format!("{} needs a value", dashed(&n)),
        getopts::Fail::OptionDuplicated(n) => format!("{} given more than once", dashed(&n)),
        getopts::Fail::UnexpectedArgument(n) => format!("{} does not take a value", dashed(&n)),
        getopts::Fail::OptionMissing(n) => format!("{} is required", dashed(&n)),
    };
    ConfigError(format!("{PROGRAM}: {text}"))
}

/// The `--version` text.
pub fn version_text() -> String {
    format!("{PROGRAM} {} (wire v1)", env!("CARGO_PKG_VERSION"))
}

/// The `--help` text: usage, then one line per flag (value form, default, meaning) by group.
pub fn help_text() -> String {
    let defaults = Config::default();
    let rows: Vec<(Group, String, String, &str)> = FLAGS
        .iter()
        .map(|f| {
            let form = format!("--{} {}", f.name, f.form());
            let default = f.render(&defaults).unwrap_or_else(|| "none".to_string());
            (f.group, form, default, f.help)
        })
        .collect();
    let form_width = rows.iter().map(|r| r.1.len()).max().unwrap_or(0);
    let default_width = rows.iter().map(|r| r.2.len()).max().unwrap_or(0);
    let mut out = String::new();
    out.push_str(&format!("Usage: {PROGRAM} [OPTIONS]\n\n"));
    out.push_str(
        "Persistent message broker for small hosts. Flags take effect at start (no reload).\n\
         DUR: 500ms, 10s, 2m, 1h, 7d (unit required). SIZE: bytes or B, KiB, MiB, GiB, TiB.\n\
         Log level: --log-level, or RUST_LOG if set (it wins). See mortard(8).\n",
    );
    out.push_str(&format!(
        "\n  {:<form_width$}  {:<default_width$}  MEANING\n",
        "FLAG", "DEFAULT"
    ));
    for (group, title) in GROUPS {
        out.push_str(&format!("\n{title}:\n"));
        for (_, form, default, meaning) in rows.iter().filter(|r| r.0 == group) {
            out.push_str(&format!(
                "  {form:<form_width$}  {default:<default_width$}  {meaning}\n"
            ));
        }
    }
    out.push_str("\nOther:\n");
    for (form, meaning) in [
        ("-h, --help", "print this help and exit"),
        ("-V, --version", "print the version and exit"),
    ] {
        out.push_str(&format!(
            "  {form:<form_width$}  {:<default_width$}  {meaning}\n",
            ""
        ));
    }
    out
}

// ---- Value syntax. Each returns the reason only, quoting the value. ----

/// Splits `"16MiB"` into `("16", "MiB")` at the first non-digit.
fn split_number(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    s.split_at(end)
}

/// Parses a duration: a whole number with a unit `ms`, `s`, `m`, `h` or `d` (`500ms`,
/// `10s`, `2m`, `1h`, `7d`). A bare number is refused (units are required). `0s` parses;
/// whether 0 is allowed is up to the flag ([`Config::validate`]).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    if s.is_empty() {
        return Err(format!(
            "an empty value is not a duration ({DURATION_HINT})"
        ));
    }
    if s.starts_with('-') {
        return Err(format!("'{s}' is negative; durations are 0 or more"));
    }
    let (number, unit) = split_number(s);
    if number.is_empty() {
        return Err(format!("'{s}' is not a duration ({DURATION_HINT})"));
    }
    if unit.is_empty() {
        return Err(format!("'{s}' has no unit ({DURATION_HINT})"));
    }
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "'{s}' is not a whole number (use a smaller unit, e.g. 1500ms for 1.5s)"
        ));
    }
    let ms_per_unit = match unit {
        "ms" => 1,
        "s" => MS_PER_SECOND,
        "m" => MS_PER_MINUTE,
        "h" => MS_PER_HOUR,
        "d" => MS_PER_DAY,
        _ => return Err(format!("'{s}' is not a duration ({DURATION_HINT})")),
    };
    let too_large = || {
        format!(
            "'{s}' is too large (max {})",
            format_duration(Duration::from_millis(DURATION_MS_MAX))
        )
    };
    // `number` is all ASCII digits, so the only way `parse` fails is overflow.
    let n: u64 = number.parse().map_err(|_| too_large())?;
    let ms = n
        .checked_mul(ms_per_unit)
        .filter(|&ms| ms <= DURATION_MS_MAX)
        .ok_or_else(too_large)?;
    Ok(Duration::from_millis(ms))
}

/// Parses a size: a whole number of bytes, optionally with a binary unit `B`, `KiB`,
/// `MiB`, `GiB` or `TiB` (`4096`, `512KiB`, `16MiB`). Decimal units (`MB`, `KB`) are
/// refused rather than guessed.
pub fn parse_size(s: &str) -> Result<u64, String> {
    if s.is_empty() {
        return Err(format!("an empty value is not a size ({SIZE_HINT})"));
    }
    if s.starts_with('-') {
        return Err(format!("'{s}' is negative; sizes are 0 or more"));
    }
    let (number, unit) = split_number(s);
    if number.is_empty() {
        return Err(format!("'{s}' is not a size ({SIZE_HINT})"));
    }
    if unit.starts_with(['.', ',']) {
        return Err(format!(
            "'{s}' is not a whole number (use a smaller unit, e.g. 1536MiB for 1.5GiB)"
        ));
    }
    let bytes_per_unit = match unit {
        "" | "B" => 1,
        "KiB" => KIB,
        "MiB" => MIB,
        "GiB" => GIB,
        "TiB" => TIB,
        _ => {
            return Err(format!(
                "'{s}' has an unknown unit '{unit}' (units: B, KiB, MiB, GiB, TiB; \
                 binary, 1KiB = 1024B)"
            ))
        }
    };
    let too_large = || format!("'{s}' is too large (max {} bytes)", u64::MAX);
    let n: u64 = number.parse().map_err(|_| too_large())?;
    n.checked_mul(bytes_per_unit).ok_or_else(too_large)
}

/// Formats a duration in the largest unit that represents it exactly (`45s`, `7d`,
/// `1500ms`, `0s`), so the result parses back with [`parse_duration`]. A duration that is
/// not a whole number of milliseconds (a latency in `/stats`) is shown in `us` or `ns`,
/// which `parse_duration` does not accept.
pub fn format_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".to_string();
    }
    if !nanos.is_multiple_of(1_000_000) {
        if nanos.is_multiple_of(1_000) {
            return format!("{}us", nanos / 1_000);
        }
        return format!("{nanos}ns");
    }
    let ms = d.as_millis();
    for (per, unit) in [
        (MS_PER_DAY, "d"),
        (MS_PER_HOUR, "h"),
        (MS_PER_MINUTE, "m"),
        (MS_PER_SECOND, "s"),
    ] {
        let per = u128::from(per);
        if ms.is_multiple_of(per) {
            return format!("{}{unit}", ms / per);
        }
    }
    format!("{ms}ms")
}

/// Formats a byte count in the largest binary unit that represents it exactly (`16MiB`,
/// `1536KiB`, `1000B`, `0B`); the result parses back with [`parse_size`].
pub fn format_size(n: u64) -> String {
    if n != 0 {
        for (per, unit) in [(TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")] {
            if n.is_multiple_of(per) {
                return format!("{}{unit}", n / per);
            }
        }
    }
    format!("{n}B")
}

fn parse_count(s: &str, max: u64) -> Result<u64, String> {
    if s.is_empty() {
        return Err("an empty value is not a number".to_string());
    }
    if s.starts_with('-') {
        return Err(format!("'{s}' is negative"));
    }
    if !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("'{s}' is not a whole number"));
    }
    let too_large = || format!("'{s}' is too large (max {max})");
    s.parse().ok().filter(|&n| n <= max).ok_or_else(too_large)
}

fn parse_addr(s: &str) -> Result<SocketAddr, String> {
    s.parse().map_err(|_| {
        format!("'{s}' is not an address (use IP:PORT, e.g. 127.0.0.1:7411 or [::1]:7411)")
    })
}

/// `off` or an address. Only the exact word `off`: a host named "off" cannot be meant,
/// since addresses are IP:PORT.
fn parse_addr_or_off(s: &str) -> Result<Option<SocketAddr>, String> {
    if s == "off" {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("'{s}' is not an address (use IP:PORT, e.g. 127.0.0.1:7412, or off)"))
}

fn format_addr_or_off(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "off".to_string(), |a| a.to_string())
}

fn parse_node_id(s: &str) -> Result<u8, String> {
    match parse_count(s, NODE_ID_MAX)? {
        0 => Err(format!(
            "'{s}' is out of range (node ids are 1..{NODE_ID_MAX})"
        )),
        id => Ok(id as u8),
    }
}

/// Exactly 16 hexadecimal digits (what `mortarctl cluster id` prints), not all zero: a
/// shorter id is likelier typed than drawn, and two clusters must not share one.
fn parse_cluster_id(s: &str) -> Result<u64, String> {
    let hex = s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit());
    match u64::from_str_radix(s, 16) {
        Ok(id) if hex && id != 0 => Ok(id),
        _ => Err(format!(
            "'{s}' is not a cluster id (16 hexadecimal digits, not all zero; \
             `mortarctl cluster id` makes one)"
        )),
    }
}

/// `off`, or `ID=IP:PORT` entries separated by commas, each id once. Sorted by id, so
/// that every node, whatever order its operator wrote, holds the same list.
fn parse_peers(s: &str) -> Result<Vec<Peer>, String> {
    if s == "off" {
        return Ok(Vec::new());
    }
    let mut peers = Vec::new();
    for item in s.split(',') {
        let (id, addr) = item.split_once('=').ok_or_else(|| {
            format!("'{item}' is not ID=IP:PORT (e.g. 1=10.0.0.1:7413,2=10.0.0.2:7413,...)")
        })?;
        let peer = Peer {
            id: parse_node_id(id).map_err(|why| format!("in '{item}': {why}"))?,
            addr: parse_addr(addr).map_err(|why| format!("in '{item}': {why}"))?,
        };
        if peers.iter().any(|p: &Peer| p.id == peer.id) {
            return Err(format!("node id {} is given more than once", peer.id));
        }
        peers.push(peer);
    }
    peers.sort_by_key(|p| p.id);
    Ok(peers)
}

fn format_peers(peers: &[Peer]) -> String {
    if peers.is_empty() {
        return "off".to_string();
    }
    let items: Vec<String> = peers
        .iter()
        .map(|p| format!("{}={}", p.id, p.addr))
        .collect();
    items.join(",")
}

fn parse_path(s: &str) -> Result<PathBuf, String> {
    if s.is_empty() {
        return Err("an empty path".to_string());
    }
    Ok(PathBuf::from(s))
}

fn parse_durability(s: &str) -> Result<Durability, String> {
    match Durability::from_flag_name(s) {
        Some(d) => Ok(d),
        None => Err(format!(
            "'{s}' is not a durability (use written, fsync or replicated)"
        )),
    }
}

fn parse_log_level(s: &str) -> Result<LogLevel, String> {
    LogLevel::ALL
        .into_iter()
        .find(|l| l.name() == s)
        .ok_or_else(|| format!("'{s}' is not a log level (use error, warn, info, debug or trace)"))
}

fn parse_log_format(s: &str) -> Result<LogFormat, String> {
    LogFormat::ALL
        .into_iter()
        .find(|f| f.name() == s)
        .ok_or_else(|| format!("'{s}' is not a log format (use text or json)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::IpAddr;

    /// The flag names promised to operators, written out independently of `FLAGS` so that
    /// renaming or dropping one in the table fails a test instead of shipping.
    const FLAG_NAMES: &[&str] = &[
        "listen",
        "admin-listen",
        "listen-peer",
        "token-file",
        "max-connections",
        "listen-backlog",
        "idle-timeout",
        "half-frame-timeout",
        "connect-timeout",
        "data-dir",
        "segment-size",
        "journal-file-size",
        "retention-size",
        "retention-age",
        "max-data-size",
        "fsync-threads",
        "durability",
        "producer-ttl",
        "max-partitions",
        "max-producers",
        "session-timeout",
        "revoke-timeout",
        "ack-wait",
        "nack-delay",
        "max-attempts",
        "max-credit-count",
        "max-credit-size",
        "commit-interval",
        "group-ttl",
        "node-id",
        "peers",
        "cluster-id",
        "advertise",
        "replication-timeout",
        "raft-tick",
        "heartbeat-ticks",
        "election-ticks",
        "journal-retain",
        "max-memory",
        "max-output-size",
        "max-pending-requests",
        "max-subscriptions",
        "max-groups",
        "max-members-per-group",
        "log-level",
        "log-format",
    ];

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn run(list: &[&str]) -> Config {
        match parse_args(args(list)) {
            Ok(Command::Run(c)) => c,
            other => panic!("{list:?}: expected Run, got {other:?}"),
        }
    }

    fn err(list: &[&str]) -> String {
        match parse_args(args(list)) {
            Err(ConfigError(text)) => {
                assert!(text.starts_with("mortard: "), "{text}");
                assert!(!text.contains('\n'), "error must be one line: {text}");
                text
            }
            other => panic!("{list:?}: expected an error, got {other:?}"),
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    // ---- durations ----

    #[test]
    fn duration_every_unit() {
        assert_eq!(parse_duration("500ms"), Ok(ms(500)));
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("007s"), Ok(Duration::from_secs(7)));
        assert_eq!(parse_duration("36500d"), Ok(ms(DURATION_MS_MAX)));
    }

    #[test]
    fn duration_bad_values() {
        let cases = [
            ("", "empty value is not a duration"),
            ("10", "'10' has no unit"),
            ("0", "'0' has no unit"),
            (
                "10x",
                "'10x' is not a duration (use e.g. 500ms, 10s, 2m, 1h, 7d)",
            ),
            ("10S", "is not a duration"),
            ("10sec", "is not a duration"),
            ("10 s", "is not a duration"),
            (" 10s", "is not a duration"),
            ("s", "is not a duration"),
            ("1.5s", "not a whole number"),
            ("-5s", "negative"),
            ("+5s", "is not a duration"),
            ("36501d", "too large (max 36500d)"),
            ("99999999999999999999ms", "too large"),
            ("18446744073709551615d", "too large"),
            ("1h30m", "is not a duration"),
        ];
        for (input, want) in cases {
            let got = parse_duration(input).expect_err(input);
            assert!(got.contains(want), "{input:?}: {got}");
            assert!(!got.contains('\n'));
        }
    }

    #[test]
    fn duration_format() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(ms(500)), "500ms");
        assert_eq!(format_duration(ms(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_secs(45)), "45s");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(120)), "2m");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
        assert_eq!(
            format_duration(Duration::from_nanos(1_500_001)),
            "1500001ns"
        );
    }

    // ---- sizes ----

    #[test]
    fn size_every_unit() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("17B"), Ok(17));
        assert_eq!(parse_size("1KiB"), Ok(1024));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2TiB"), Ok(2 << 40));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_size("16777215TiB"), Ok(16_777_215 << 40));
    }

    #[test]
    fn size_bad_values() {
        let cases = [
            ("", "empty value is not a size"),
            ("MiB", "is not a size"),
            ("16MB", "unknown unit 'MB'"),
            ("16M", "unknown unit 'M'"),
            ("16KB", "unknown unit 'KB'"),
            ("16mib", "unknown unit 'mib'"),
            ("16 MiB", "unknown unit ' MiB'"),
            ("1.5GiB", "not a whole number"),
            ("-1", "negative"),
            ("-1MiB", "negative"),
            ("18446744073709551616", "too large"),
            ("16777216TiB", "too large"),
            ("99999999999999999999999B", "too large"),
        ];
        for (input, want) in cases {
            let got = parse_size(input).expect_err(input);
            assert!(got.contains(want), "{input:?}: {got}");
            assert!(!got.contains('\n'));
        }
    }

    #[test]
    fn size_format() {
        assert_eq!(format_size(0), "0B");
        assert_eq!(format_size(1000), "1000B");
        assert_eq!(format_size(1024), "1KiB");
        assert_eq!(format_size(1536 * 1024), "1536KiB");
        assert_eq!(format_size(16 << 20), "16MiB");
        assert_eq!(format_size(256 << 20), "256MiB");
        assert_eq!(format_size(1 << 30), "1GiB");
        assert_eq!(format_size(3 << 40), "3TiB");
        assert_eq!(format_size(u64::MAX), "18446744073709551615B");
    }

    proptest! {
        #[test]
        fn size_round_trips(n in any::<u64>()) {
            prop_assert_eq!(parse_size(&format_size(n)), Ok(n));
        }

        #[test]
        fn size_round_trips_in_units(n in 0u64..(1 << 20), shift in 0u32..=4) {
            let bytes = n << (10 * shift);
            prop_assert_eq!(parse_size(&format_size(bytes)), Ok(bytes));
        }

        #[test]
        fn duration_round_trips(n in 0u64..=DURATION_MS_MAX) {
            prop_assert_eq!(parse_duration(&format_duration(ms(n))), Ok(ms(n)));
        }

        #[test]
        fn parsers_never_panic(s in "\\PC{0,24}") {
            let _ = parse_size(&s);
            let _ = parse_duration(&s);
            let _ = parse_args(vec![format!("--segment-size={s}")]);
        }
    }

    // ---- every flag, both spellings ----

    type Check = fn(&Config) -> bool;

    /// One non-default value per flag, and how to see it landed in the right field.
    const FLAG_CASES: &[(&str, &str, Check)] = &[
        ("listen", "0.0.0.0:9000", |c| {
            c.reactor.listen == "0.0.0.0:9000".parse().unwrap()
        }),
        ("admin-listen", "[::1]:9001", |c| {
            c.admin_listen == "[::1]:9001".parse().ok()
        }),
        ("listen-peer", "10.0.0.1:7413", |c| {
            c.listen_peer == "10.0.0.1:7413".parse().ok()
        }),
        ("token-file", "/etc/mortar/tokens", |c| {
            c.token_file.as_deref() == Some("/etc/mortar/tokens".as_ref())
        }),
        ("max-connections", "10", |c| c.reactor.max_connections == 10),
        ("listen-backlog", "8192", |c| {
            c.reactor.listen_backlog == 8192
        }),
        ("idle-timeout", "2m", |c| {
            c.reactor.idle_timeout_ms == 120_000
        }),
        ("half-frame-timeout", "1500ms", |c| {
            c.reactor.half_frame_timeout_ms == 1500
        }),
        ("connect-timeout", "3s", |c| {
            c.reactor.connect_timeout_ms == 3_000
        }),
        ("data-dir", "/var/lib/mortar", |c| {
            c.broker.data_dir == Path::new("/var/lib/mortar")
        }),
        ("segment-size", "32MiB", |c| {
            c.broker.log.segment_size_bytes == 32 << 20
        }),
        ("journal-file-size", "128MiB", |c| {
            c.broker.journal_file_bytes == 128 << 20
        }),
        ("retention-size", "1GiB", |c| {
            c.broker.log.retention_size_bytes == 1 << 30
        }),
        ("retention-age", "14d", |c| {
            c.broker.log.retention_age_ms == 14 * 86_400_000
        }),
        ("max-data-size", "10GiB", |c| {
            c.broker.max_data_bytes == 10 << 30
        }),
        ("fsync-threads", "4", |c| c.fsync_threads == 4),
        ("durability", "written", |c| {
            c.broker.durability == Durability::Written
        }),
        ("producer-ttl", "12h", |c| {
            c.broker.producer_ttl_ms == 12 * 3_600_000
        }),
        ("max-partitions", "128", |c| c.broker.max_partitions == 128),
        ("max-producers", "64", |c| {
            c.broker.max_producers_per_partition == 64
        }),
        ("session-timeout", "20s", |c| {
            c.broker.consume.session_timeout_ms == 20_000
        }),
        ("revoke-timeout", "5s", |c| {
            c.broker.consume.revoke_timeout_ms == 5_000
        }),
        ("ack-wait", "1m", |c| c.broker.consume.ack_wait_ms == 60_000),
        ("nack-delay", "250ms", |c| {
            c.broker.consume.nack_delay_ms == 250
        }),
        ("max-attempts", "9", |c| c.broker.consume.max_attempts == 9),
        ("max-credit-count", "1000", |c| {
            c.broker.consume.max_credit_count == 1000
        }),
        ("max-credit-size", "8MiB", |c| {
            c.broker.consume.max_credit_bytes == 8 << 20
        }),
        ("commit-interval", "5s", |c| {
            c.broker.commit_interval_ms == 5_000
        }),
        ("group-ttl", "1h", |c| {
            c.broker.consume.group_ttl_ms == 3_600_000
        }),
        ("node-id", "2", |c| c.cluster.node_id == Some(2)),
        (
            "peers",
            "3=10.0.0.3:7413,1=10.0.0.1:7413,2=10.0.0.2:7413",
            |c| {
                let ids: Vec<u8> = c.cluster.peers.iter().map(|p| p.id).collect();
                ids == [1, 2, 3] && c.cluster.peers[2].addr == "10.0.0.3:7413".parse().unwrap()
            },
        ),
        ("cluster-id", "00c0ffee00c0ffee", |c| {
            c.cluster.cluster_id == Some(0x00c0_ffee_00c0_ffee)
        }),
        ("advertise", "10.0.0.2:9000", |c| {
            c.cluster.advertise == "10.0.0.2:9000".parse().ok()
        }),
        ("replication-timeout", "2s", |c| {
            c.cluster.replication_timeout_ms == 2_000
        }),
        ("raft-tick", "100ms", |c| c.cluster.raft_tick_ms == 100),
        ("heartbeat-ticks", "3", |c| c.cluster.heartbeat_ticks == 3),
        ("election-ticks", "20", |c| c.cluster.election_ticks == 20),
        ("journal-retain", "1GiB", |c| {
            c.cluster.journal_retain_bytes == 1 << 30
        }),
        ("max-memory", "512MiB", |c| {
            c.reactor.max_memory_bytes == 512 << 20
        }),
        ("max-output-size", "128MiB", |c| {
            c.reactor.max_output_bytes == 128 << 20
        }),
        ("max-pending-requests", "99", |c| {
            c.reactor.max_pending_requests == 99
        }),
        ("max-subscriptions", "7", |c| {
            c.broker.consume.max_subscriptions_per_conn == 7
        }),
        ("max-groups", "3", |c| c.broker.consume.max_groups == 3),
        ("max-members-per-group", "11", |c| {
            c.broker.consume.max_members_per_group == 11
        }),
        ("log-level", "debug", |c| c.log_level == LogLevel::Debug),
        ("log-format", "json", |c| c.log_format == LogFormat::Json),
    ];

    use std::path::Path;

    const PEERS: &str = "1=10.0.0.1:7413,2=10.0.0.2:7413,3=10.0.0.3:7413";
    /// Peer links on loopback start without a warning about plain TCP.
    const LOCAL_PEERS: &str = "1=127.0.0.1:7413,2=127.0.0.2:7413,3=127.0.0.3:7413";

    /// The flags a cluster flag cannot go without, to try it alone.
    fn needed_with(name: &str) -> Vec<&'static str> {
        match name {
            "node-id" => vec!["--peers", PEERS],
            "peers" => vec!["--node-id", "1"],
            "advertise" | "cluster-id" => vec!["--node-id", "1", "--peers", PEERS],
            _ => vec![],
        }
    }

    #[test]
    fn every_flag_in_both_forms() {
        let defaults = Config::default();
        for &(name, value, check) in FLAG_CASES {
            let needed = needed_with(name);
            let spaced_flag = format!("--{name}");
            let joined_flag = format!("--{name}={value}");
            let spaced = run(&[&needed[..], &[spaced_flag.as_str(), value]].concat());
            let joined = run(&[&needed[..], &[joined_flag.as_str()]].concat());
            assert!(check(&spaced), "--{name} {value} did not set its field");
            assert_eq!(spaced, joined, "--{name}");
            assert_ne!(spaced, defaults, "--{name} {value} changed nothing");
            // Only this field moved (with what it needs, and the durability a cluster
            // defaults to): render every flag and compare with the defaults.
            let mut moved: Vec<_> = spaced
                .flag_values()
                .into_iter()
                .zip(defaults.flag_values())
                .filter(|(a, b)| a != b)
                .map(|(a, _)| a.0)
                .collect();
            let mut want: Vec<&str> = needed.iter().filter_map(|a| a.strip_prefix("--")).collect();
            want.push(name);
            if spaced.cluster.is_cluster() {
                want.push("durability");
            }
            moved.sort_unstable();
            want.sort_unstable();
            assert_eq!(moved, want, "--{name} {value}");
        }
    }

    #[test]
    fn all_flags_together_round_trip_through_flag_values() {
        let mut list = Vec::new();
        for &(name, value, _) in FLAG_CASES {
            list.push(format!("--{name}={value}"));
        }
        let config = run(&list.iter().map(String::as_str).collect::<Vec<_>>());
        for &(name, value, check) in FLAG_CASES {
            assert!(check(&config), "--{name} {value}");
        }
        let again: Vec<String> = config
            .flag_values()
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| format!("--{name}={v}")))
            .collect();
        assert_eq!(parse_args(again), Ok(Command::Run(config)));
    }

    #[test]
    fn defaults_round_trip_through_flag_values() {
        let list: Vec<String> = Config::default()
            .flag_values()
            .into_iter()
            .filter_map(|(name, value)| value.map(|v| format!("--{name}={v}")))
            .collect();
        let unset = ["token-file", "node-id", "cluster-id", "advertise"];
        assert_eq!(
            list.len(),
            FLAGS.len() - unset.len(),
            "only {unset:?} are unset"
        );
        assert_eq!(parse_args(list), Ok(Command::Run(Config::default())));
    }

    #[test]
    fn off_handling() {
        assert_eq!(run(&["--admin-listen", "off"]).admin_listen, None);
        assert_eq!(run(&["--admin-listen=off"]).admin_listen, None);
        assert_eq!(run(&["--listen-peer", "off"]).listen_peer, None);
        assert_eq!(run(&[]).listen_peer, None);
        let c = run(&["--admin-listen", "off", "--listen-peer", "off"]);
        assert_eq!(
            c.flag_values()[1],
            ("admin-listen", Some("off".to_string()))
        );
        assert_eq!(c.flag_values()[2], ("listen-peer", Some("off".to_string())));
        assert!(err(&["--admin-listen", "OFF"]).contains("'OFF' is not an address"));
        assert!(err(&["--admin-listen", "none"]).contains("or off"));
        assert!(err(&["--listen", "off"]).contains("'off' is not an address"));
        assert!(err(&["--listen-peer", ""]).contains("not an address"));
    }

    #[test]
    fn addresses() {
        assert_eq!(
            run(&["--listen", "[::]:7411"]).reactor.listen.ip(),
            IpAddr::from([0u16; 8])
        );
        assert_eq!(run(&["--listen", "127.0.0.1:0"]).reactor.listen.port(), 0);
        for bad in [
            "localhost:7411",
            "127.0.0.1",
            ":7411",
            "127.0.0.1:70000",
            "::1:7411",
        ] {
            let e = err(&["--listen", bad]);
            assert!(e.contains("is not an address (use IP:PORT"), "{bad}: {e}");
        }
    }

    #[test]
    fn log_level_and_format_values() {
        for level in LogLevel::ALL {
            assert_eq!(run(&["--log-level", level.name()]).log_level, level);
        }
        assert_eq!(run(&[]).log_level, LogLevel::Info);
        assert_eq!(run(&["--log-format=json"]).log_format, LogFormat::Json);
        assert_eq!(run(&[]).log_format, LogFormat::Text);
        assert_eq!(
            err(&["--log-level", "verbose"]),
            "mortard: --log-level: 'verbose' is not a log level (use error, warn, info, \
             debug or trace)"
        );
        assert!(err(&["--log-level", "INFO"]).contains("not a log level"));
        assert!(err(&["--log-format", "syslog"]).contains("(use text or json)"));
    }

    #[test]
    fn durability_values() {
        assert_eq!(
            run(&["--durability", "fsync"]).broker.durability,
            Durability::Fsynced
        );
        assert_eq!(
            run(&["--durability=written"]).broker.durability,
            Durability::Written
        );
        let e = err(&["--durability", "always"]);
        assert_eq!(
            e,
            "mortard: --durability: 'always' is not a durability (use written, fsync or \
             replicated)"
        );
        assert!(err(&["--durability", "replicated"]).contains("replicated needs --peers"));
        assert!(err(&["--durability", "FSYNC"]).contains("not a durability"));
    }

    #[test]
    fn counts() {
        assert!(err(&["--max-connections", "many"]).contains("'many' is not a whole number"));
        assert!(err(&["--max-connections", "-1"]).contains("'-1' is negative"));
        assert!(err(&["--max-connections", "+1"]).contains("not a whole number"));
        assert!(err(&["--max-connections", "1e3"]).contains("not a whole number"));
        assert!(err(&["--max-connections="]).contains("empty value"));
        assert!(err(&["--max-connections", "4294967296"]).contains("too large (max 4294967295)"));
        assert!(err(&["--max-partitions", "65536"]).contains("too large (max 65535)"));
        assert!(err(&["--max-attempts", "65536"]).contains("too large (max 65535)"));
        assert!(err(&["--max-credit-count", "65536"]).contains("too large (max 65535)"));
        assert!(err(&["--max-subscriptions", "65536"]).contains("too large (max 65535)"));
        assert_eq!(
            run(&["--max-partitions", "65535"]).broker.max_partitions,
            65535
        );
    }

    #[test]
    fn flag_error_messages_name_the_flag_and_value() {
        assert_eq!(
            err(&["--idle-timeout", "10x"]),
            "mortard: --idle-timeout: '10x' is not a duration (use e.g. 500ms, 10s, 2m, 1h, 7d)"
        );
        assert_eq!(
            err(&["--ack-wait=30"]),
            "mortard: --ack-wait: '30' has no unit (use e.g. 500ms, 10s, 2m, 1h, 7d)"
        );
        assert!(err(&["--segment-size", "16MB"]).starts_with("mortard: --segment-size: '16MB'"));
        assert!(err(&["--data-dir="]).contains("--data-dir: an empty path"));
        assert!(err(&["--token-file="]).contains("--token-file: an empty path"));
    }

    // ---- defaults ----

    #[test]
    fn defaults_equal_documented_constants() {
        let c = Config::default();
        let (r, b, k) = (&c.reactor, &c.broker, &c.broker.consume);
        assert_eq!(r.listen, "127.0.0.1:7411".parse().unwrap());
        assert_eq!(c.admin_listen, Some("127.0.0.1:7412".parse().unwrap()));
        assert_eq!(c.listen_peer, None);
        assert_eq!(c.token_file, None);
        assert_eq!(r.tokens, None);
        assert_eq!(r.max_connections, 4096);
        assert_eq!(r.idle_timeout_ms, 45_000);
        assert_eq!(r.half_frame_timeout_ms, 10_000);
        assert_eq!(r.listen_backlog, 0);
        assert_eq!(r.connect_timeout_ms, 10_000);
        assert_eq!(b.data_dir, PathBuf::from("./mortar-data"));
        assert_eq!(b.log.segment_size_bytes, 16 << 20);
        assert_eq!(
            b.log.segment_size_bytes,
            crate::log::SEGMENT_SIZE_BYTES_DEFAULT
        );
        assert_eq!(b.log.retention_size_bytes, 0);
        assert_eq!(b.log.retention_age_ms, 0);
        assert_eq!(b.max_data_bytes, 0);
        assert_eq!(c.fsync_threads, 2);
        assert_eq!(b.durability, Durability::Fsynced);
        assert_eq!(b.producer_ttl_ms, 7 * 86_400_000);
        assert_eq!(b.max_partitions, 64);
        assert_eq!(k.session_timeout_ms, 30_000);
        assert_eq!(k.revoke_timeout_ms, 10_000);
        assert_eq!(k.ack_wait_ms, 30_000);
        assert_eq!(k.nack_delay_ms, 1_000);
        assert_eq!(k.max_attempts, 5);
        assert_eq!(k.max_credit_count, 65535);
        assert_eq!(k.max_credit_bytes, 16 << 20);
        assert_eq!(b.commit_interval_ms, 1_000);
        assert_eq!(r.max_memory_bytes, 256 << 20);
        assert_eq!(r.max_output_bytes, 64 << 20);
        assert_eq!(r.max_pending_requests, 1024);
        assert_eq!(k.max_subscriptions_per_conn, 64);
        assert_eq!(k.max_groups, 1024);
        assert_eq!(k.max_members_per_group, 256);
        let cl = &c.cluster;
        assert_eq!((cl.node_id, cl.peers.len(), cl.advertise), (None, 0, None));
        assert_eq!(cl.replication_timeout_ms, 5_000);
        assert_eq!(cl.raft_tick_ms, 50);
        assert_eq!(cl.heartbeat_ticks, 2);
        assert_eq!(cl.election_ticks, 10);
        assert_eq!(cl.journal_retain_bytes, 256 << 20);
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(run(&[]), c);
        assert!(c.warnings().is_empty());
    }

    /// A count's cap and a bounded size's maximum must fit the field they land in, or
    /// `narrow` would saturate a value the flag accepted.
    #[test]
    fn every_accepted_number_fits_its_field() {
        for f in FLAGS {
            let (num, max) = match (&f.field, f.bounds) {
                (Field::Count(num, cap), Bounds::Within(_, max, _)) => (num, max.min(*cap)),
                (Field::Count(num, cap), _) => (num, *cap),
                (Field::Size(num) | Field::Dur(num), Bounds::Within(_, max, _)) => (num, max),
                _ => continue,
            };
            let mut c = Config::default();
            (num.set)(&mut c, max);
            assert_eq!((num.get)(&c), max, "--{}", f.name);
        }
    }

    // ---- help and version ----

    #[test]
    fn flag_table_matches_the_promised_names() {
        let table: Vec<&str> = FLAGS.iter().map(|s| s.name).collect();
        assert_eq!(table, FLAG_NAMES.to_vec());
        let cases: Vec<&str> = FLAG_CASES.iter().map(|c| c.0).collect();
        assert_eq!(cases, FLAG_NAMES.to_vec());
    }

    #[test]
    fn help_mentions_every_flag_with_its_default() {
        let Ok(Command::Help(help)) = parse_args(args(&["--help"])) else {
            panic!("--help");
        };
        assert!(help.starts_with("Usage: mortard [OPTIONS]\n"));
        let defaults = Config::default().flag_values();
        for (name, default) in defaults {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("--{name} ")))
                .unwrap_or_else(|| panic!("--help lacks --{name}"));
            let default = default.unwrap_or_else(|| "none".to_string());
            let columns: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(columns.get(2), Some(&default.as_str()), "{line}");
        }
        for name in FLAG_NAMES {
            assert!(
                help.contains(&format!("--{name} ")),
                "--help lacks --{name}"
            );
        }
        let mut last = 0;
        for title in [
            "Network:", "Storage:", "Publish:", "Consume:", "Cluster:", "Limits:", "Other:",
        ] {
            let at = help.find(title).unwrap_or_else(|| panic!("no {title}"));
            assert!(at > last, "{title} out of order");
            last = at;
        }
        assert!(help.contains("-h, --help") && help.contains("-V, --version"));
        assert!(help.contains("RUST_LOG"));
        assert!(
            help.lines().all(|l| l.len() <= 100),
            "keep --help within 100 columns"
        );
    }

    #[test]
    fn help_and_version_forms() {
        let version = format!("mortard {} (wire v1)", env!("CARGO_PKG_VERSION"));
        for list in [
            &["-h"][..],
            &["--help"],
            &["--help", "--version"],
            &["-V", "-h"],
        ] {
            assert!(
                matches!(parse_args(args(list)), Ok(Command::Help(_))),
                "{list:?}"
            );
        }
        for list in [&["-V"][..], &["--version"]] {
            assert_eq!(
                parse_args(args(list)),
                Ok(Command::Version(version.clone()))
            );
        }
        // --help wins over a bad value: the operator asking for help gets it.
        assert!(matches!(
            parse_args(args(&["--idle-timeout", "10x", "--help"])),
            Ok(Command::Help(_))
        ));
        assert!(err(&["--help=yes"]).contains("--help does not take a value"));
    }

    // ---- command-line shape ----

    #[test]
    fn unknown_flags_and_stray_arguments() {
        assert_eq!(
            err(&["--listn", "127.0.0.1:1"]),
            "mortard: unknown option '--listn' (see mortard --help)"
        );
        assert!(err(&["-x"]).contains("unknown option '-x'"));
        assert!(err(&["--loglevel", "debug"]).contains("unknown option '--loglevel'"));
        assert!(
            err(&["--max-conn", "5"]).contains("unknown option"),
            "no prefix matching"
        );
        assert!(err(&["start"]).contains("unexpected argument 'start'"));
        assert!(err(&["--data-dir", "/d", "extra"]).contains("unexpected argument 'extra'"));
        assert!(err(&["--", "--listen"]).contains("unexpected argument '--listen'"));
        assert!(err(&["--listen"]).contains("--listen needs a value"));
        assert!(err(&["--max-groups", "1", "--max-groups=2"]).contains("given more than once"));
    }

    // ---- cross-field validation ----

    #[test]
    fn validation_errors() {
        let cases: [(&[&str], &str); 31] = [
            (
                &["--max-connections", "0"],
                "--max-connections: must be at least 1",
            ),
            (
                &["--idle-timeout", "0s"],
                "--idle-timeout: must be more than 0s",
            ),
            (
                &["--half-frame-timeout", "0ms"],
                "--half-frame-timeout: must be more than 0s",
            ),
            (
                &["--connect-timeout", "0s"],
                "--connect-timeout: must be more than 0s",
            ),
            (
                &["--listen-backlog", "2147483648"],
                "--listen-backlog: '2147483648' is too large (max 2147483647)",
            ),
            (
                &["--segment-size", "4095"],
                "--segment-size: 4095B is out of range",
            ),
            (&["--segment-size", "2GiB"], "allowed 4KiB..1GiB"),
            (
                &["--retention-size", "1MiB"],
                "smaller than --segment-size 16MiB",
            ),
            (
                &["--max-data-size", "1MiB"],
                "--max-data-size: 1MiB is smaller",
            ),
            (
                &["--fsync-threads", "0"],
                "--fsync-threads: 0 is out of range (allowed 1..64)",
            ),
            (&["--fsync-threads", "65"], "out of range"),
            (
                &["--producer-ttl", "0d"],
                "--producer-ttl: must be more than 0s",
            ),
            (
                &["--max-partitions", "0"],
                "--max-partitions: must be at least 1",
            ),
            (
                &["--session-timeout", "0s"],
                "--session-timeout: must be more than 0s",
            ),
            (
                &["--revoke-timeout", "0s"],
                "--revoke-timeout: must be more than 0s",
            ),
            (&["--ack-wait", "0s"], "--ack-wait: must be more than 0s"),
            (
                &["--nack-delay", "0s"],
                "--nack-delay: must be more than 0s",
            ),
            (
                &["--max-attempts", "0"],
                "--max-attempts: must be at least 1",
            ),
            (
                &["--max-credit-count", "0"],
                "--max-credit-count: must be at least 1",
            ),
            (
                &["--max-credit-size", "0"],
                "--max-credit-size: 0B is out of range",
            ),
            (&["--max-credit-size", "4GiB"], "credit_bytes is a u32"),
            (
                &["--commit-interval", "0s"],
                "--commit-interval: must be more than 0s",
            ),
            (&["--max-output-size", "16MiB"], "below one maximal frame"),
            (
                &["--max-output-size", "32MiB", "--max-credit-size", "48MiB"],
                "--max-output-size: 32MiB is smaller than --max-credit-size 48MiB",
            ),
            (
                &["--max-memory", "32MiB"],
                "--max-memory: 32MiB is smaller than --max-output",
            ),
            (
                &["--max-pending-requests", "0"],
                "--max-pending-requests: must be at least 1",
            ),
            (
                &["--max-subscriptions", "0"],
                "--max-subscriptions: must be at least 1",
            ),
            (&["--max-groups", "0"], "--max-groups: must be at least 1"),
            (
                &["--max-members-per-group", "0"],
                "--max-members-per-group: must be at least",
            ),
            (
                &["--admin-listen", "127.0.0.1:7411"],
                "--admin-listen: 127.0.0.1:7411 clashes with --listen 127.0.0.1:7411",
            ),
            (
                &["--listen", "0.0.0.0:7000", "--listen-peer", "10.0.0.1:7000"],
                "--listen-peer: 10.0.0.1:7000 clashes with --listen",
            ),
        ];
        for (list, want) in cases {
            let e = err(list);
            assert!(e.contains(want), "{list:?}: {e}");
        }
    }

    #[test]
    fn validation_accepts_the_edges() {
        run(&[
            "--segment-size",
            "4KiB",
            "--retention-size",
            "4KiB",
            "--max-data-size",
            "4KiB",
        ]);
        run(&[
            "--segment-size",
            "1GiB",
            "--retention-age",
            "0s",
            "--retention-size",
            "0",
        ]);
        run(&[
            "--fsync-threads",
            "64",
            "--max-attempts",
            "1",
            "--nack-delay",
            "1ms",
        ]);
        run(&["--max-credit-size", "64MiB"]);
        run(&["--max-output-size", "16777220", "--max-memory", "16777220"]);
        // Port 0 (any free port) never clashes; tests start brokers this way.
        run(&["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"]);
        run(&[
            "--listen",
            "127.0.0.1:7411",
            "--listen-peer",
            "127.0.0.2:7411",
        ]);
        run(&["--admin-listen", "off", "--listen", "127.0.0.1:7412"]);
    }

    fn cluster(extra: &[&str]) -> Result<Config, String> {
        let list = [&["--node-id", "2", "--peers", PEERS][..], extra].concat();
        match parse_args(args(&list)) {
            Ok(Command::Run(c)) => Ok(c),
            Err(ConfigError(text)) => Err(text),
            other => panic!("{list:?}: {other:?}"),
        }
    }

    /// Issue 42: plain peer links off loopback start with a warning, and a cluster id is
    /// 16 hex digits.
    #[test]
    fn plain_peer_links_off_loopback_warn_and_cluster_ids_are_checked() {
        let plain = run(&["--node-id", "2", "--peers", PEERS]);
        assert!(plain.warnings().iter().any(|w| w.contains("plain TCP")));
        let local = ["--node-id", "2", "--peers", LOCAL_PEERS];
        assert!(run(&local).warnings().is_empty());
        let single = err(&["--cluster-id", "00c0ffee00c0ffee"]);
        assert!(single.contains("--cluster-id") && single.contains("only with --peers"));
        for bad in [
            "c0ffee",
            "00000000000000000",
            "0000000000000000",
            "xyzxyzxyzxyzxyzx",
        ] {
            let e = err(&[&local[..], &["--cluster-id", bad]].concat());
            assert!(e.contains("not a cluster id"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_cluster_node_names_itself_among_its_peers() {
        let c = cluster(&[]).unwrap();
        assert!(c.cluster.is_cluster());
        let own = c.cluster.own_peer().unwrap();
        assert_eq!((own.id, own.addr), (2, "10.0.0.2:7413".parse().unwrap()));
        assert_eq!(
            c.listen_peer_addr(),
            Some(own.addr),
            "--listen-peer defaults to it"
        );
        assert_eq!(
            c.broker.durability,
            Durability::Replicated,
            "the cluster default"
        );
        let written = cluster(&["--durability", "written"]).unwrap();
        assert_eq!(written.broker.durability, Durability::Written);
        let bound = cluster(&["--listen-peer", "0.0.0.0:7413"]).unwrap();
        assert_eq!(bound.listen_peer_addr(), "0.0.0.0:7413".parse().ok());
        // Five nodes, written in any order, come out sorted by id.
        let five = "5=10.0.0.5:1,4=10.0.0.4:1,3=10.0.0.3:1,2=10.0.0.2:1,1=10.0.0.1:1";
        let c = run(&["--node-id", "5", "--peers", five]);
        let ids: Vec<u8> = c.cluster.peers.iter().map(|p| p.id).collect();
        assert_eq!(ids, [1, 2, 3, 4, 5]);
        assert_eq!(
            c.flag_values()[FLAG_NAMES.iter().position(|&n| n == "peers").unwrap()].1,
            Some("1=10.0.0.1:1,2=10.0.0.2:1,3=10.0.0.3:1,4=10.0.0.4:1,5=10.0.0.5:1".into())
        );
        assert!(!run(&[]).cluster.is_cluster());
        assert!(!run(&["--peers", "off"]).cluster.is_cluster());
        // --listen on every address needs an address to hand clients.
        let any = ["--listen", "0.0.0.0:7411", "--token-file", "/t"];
        assert!(cluster(&any)
            .unwrap_err()
            .contains("--advertise: required with --peers"));
        assert!(cluster(&[&any[..], &["--advertise", "10.0.0.2:7411"]].concat()).is_ok());
    }

    #[test]
    fn cluster_flags_are_checked() {
        let cases: &[(&[&str], &str)] = &[
            (&["--node-id", "1"], "--node-id: only with --peers"),
            (
                &["--advertise", "10.0.0.1:7411"],
                "--advertise: only with --peers",
            ),
            (&["--peers", PEERS], "--peers: needs --node-id"),
            (
                &["--node-id", "4", "--peers", PEERS],
                "--node-id: 4 is not in --peers (ids 1, 2, 3)",
            ),
            (
                &["--node-id", "0", "--peers", PEERS],
                "--node-id: '0' is out of range",
            ),
            (
                &["--node-id", "256"],
                "--node-id: '256' is too large (max 255)",
            ),
            (
                &["--node-id", "1", "--peers", "1=10.0.0.1:1,2=10.0.0.2:1"],
                "--peers: 2 nodes; a cluster has 3 or 5",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--peers",
                    "1=10.0.0.1:1,2=10.0.0.2:1,3=10.0.0.3:1,4=10.0.0.4:1",
                ],
                "--peers: 4 nodes",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--peers",
                    "1=10.0.0.1:1,2=10.0.0.2:1,1=10.0.0.3:1",
                ],
                "--peers: node id 1 is given more than once",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--peers",
                    "1=10.0.0.1:1,2=10.0.0.1:1,3=10.0.0.3:1",
                ],
                "--peers: nodes 1 and 2 share the address 10.0.0.1:1",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--peers",
                    "1=localhost:1,2=10.0.0.2:1,3=10.0.0.3:1",
                ],
                "--peers: in '1=localhost:1': 'localhost:1' is not an address",
            ),
            (
                &["--node-id", "1", "--peers", "10.0.0.1:1"],
                "'10.0.0.1:1' is not ID=IP:PORT",
            ),
            (
                &[
                    "--node-id",
                    "1",
                    "--peers",
                    "1=127.0.0.1:7411,2=10.0.0.2:1,3=10.0.0.3:1",
                ],
                "--peers: 127.0.0.1:7411 clashes with --listen 127.0.0.1:7411",
            ),
            (
                &["--election-ticks", "2"],
                "--election-ticks: 2 must be more than --heartbeat-ticks 2",
            ),
            (
                &["--heartbeat-ticks", "0"],
                "--heartbeat-ticks: 0 is out of range (allowed 1..10000)",
            ),
            (
                &["--election-ticks", "10001"],
                "--election-ticks: 10001 is out of range",
            ),
            (
                &["--raft-tick", "5ms"],
                "--raft-tick: 5ms is out of range (allowed 10ms..10s)",
            ),
            (&["--raft-tick", "11s"], "--raft-tick: 11s is out of range"),
            (
                &["--replication-timeout", "0s"],
                "--replication-timeout: must be more than 0s",
            ),
            (
                &["--journal-retain", "1MiB"],
                "--journal-retain: 1MiB is smaller than --journal-file-size 64MiB",
            ),
        ];
        for (list, want) in cases {
            let e = err(list);
            assert!(e.contains(want), "{list:?}: {e}");
        }
        run(&[
            "--heartbeat-ticks",
            "1",
            "--election-ticks",
            "2",
            "--raft-tick",
            "10ms",
        ]);
        run(&["--journal-retain", "64KiB", "--journal-file-size", "64KiB"]);
    }

    /// Issue 15: the defaults fail over in at most 3 s. A follower calls an election at
    /// most two election timeouts (the randomized upper end) after the leader's last
    /// heartbeat; even one split vote (a second round) fits.
    #[test]
    fn the_default_raft_clock_fails_over_within_3_seconds() {
        let c = ClusterConfig::default();
        let election_ms_max = 2 * u64::from(c.election_ticks) * c.raft_tick_ms;
        assert_eq!(election_ms_max, 1_000);
        assert!(2 * election_ms_max <= 3_000);
        let heartbeat_ms = u64::from(c.heartbeat_ticks) * c.raft_tick_ms;
        assert!(
            5 * heartbeat_ms <= election_ms_max / 2,
            "several heartbeats per timeout"
        );
    }

    #[test]
    fn warnings_for_risky_but_legal_settings() {
        let c = run(&[
            "--admin-listen",
            "0.0.0.0:7412",
            "--listen-peer",
            "10.0.0.1:7413",
        ]);
        let w = c.warnings();
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].contains("not loopback"));
        assert!(w[1].contains("nothing listens"));
        assert!(run(&["--admin-listen", "[::1]:7412"]).warnings().is_empty());
        // Clients on a reachable address with no token file: anyone may come in.
        let open = run(&["--listen", "0.0.0.0:7411"]).warnings();
        assert_eq!(open.len(), 1, "{open:?}");
        assert!(open[0].contains("no --token-file"), "{open:?}");
        let guarded = [
            "--listen",
            "0.0.0.0:7411",
            "--token-file",
            "/etc/mortar/tokens",
        ];
        assert!(run(&guarded).warnings().is_empty());
        assert!(run(&["--listen", "[::1]:7411"]).warnings().is_empty());
    }

    // ---- the man page documents exactly the table's flags, with its defaults ----

    fn man_page() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/man/mortard.8");
        let text = std::fs::read_to_string(path)
            .unwrap_or_else(|e| panic!("{path}: {e} (the man page ships with this module)"));
        text.replace("\\-", "-")
    }

    #[test]
    fn man_page_documents_every_flag_and_no_other() {
        let text = man_page();
        let names: Vec<&str> = FLAGS.iter().map(|f| f.name).collect();
        for name in &names {
            assert!(
                text.contains(&format!("--{name}")),
                "man page lacks --{name}"
            );
        }
        for (at, _) in text.match_indices("--") {
            let rest = &text[at + 2..];
            let end = rest
                .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
                .unwrap_or(rest.len());
            let name = &rest[..end];
            if name.is_empty() {
                continue;
            }
            assert!(
                names.contains(&name) || ["help", "version", "pretty"].contains(&name),
                "man page names unknown flag --{name}"
            );
        }
    }

    /// The default `man/mortard.8` states for `--name`: in the flag's `.TP` entry, the word
    /// after `Default:`, or the word of the `.B`/`.BR` line after it.
    fn man_default<'a>(lines: &[&'a str], name: &str) -> Option<&'a str> {
        let head = format!("--{name} ");
        let is_head =
            |l: &str| (l.starts_with(".BI ") || l.starts_with(".BR ")) && l[4..].starts_with(&head);
        let at = lines
            .windows(2)
            .position(|w| w[0] == ".TP" && is_head(w[1]))?;
        let entry: Vec<&str> = lines[at + 2..]
            .iter()
            .copied()
            .take_while(|l| !l.starts_with(".TP") && !l.starts_with(".S"))
            .collect();
        let i = entry.iter().position(|l| l.starts_with("Default:"))?;
        let rest = entry[i]["Default:".len()..].trim();
        let word = if rest.is_empty() {
            entry.get(i + 1)?.split_whitespace().nth(1)?
        } else {
            rest.split_whitespace().next()?
        };
        Some(word.trim_end_matches([',', '.']))
    }

    #[test]
    fn man_page_states_the_tables_defaults() {
        let text = man_page();
        let lines: Vec<&str> = text.lines().collect();
        let defaults = Config::default();
        for f in FLAGS {
            let want = f.render(&defaults).unwrap_or_else(|| "none".to_string());
            let stated = man_default(&lines, f.name)
                .unwrap_or_else(|| panic!("mortard.8 states no default for --{}", f.name));
            assert_eq!(stated, want, "mortard.8's default for --{}", f.name);
        }
    }
}
