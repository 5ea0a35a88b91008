//! The admin room: a tiny_http thread serving `/healthz`, `/metrics` and `/stats`.
//!
//! It never touches reactor or broker state. For `/metrics` and `/stats` it sends an
//! [`AdminRequest`] through a channel, wakes the reactor with its `Waker`, and waits a
//! bounded time for a [`Snapshot`] (plain copied data) that it renders on its own
//! thread. `/healthz` needs no reactor turn at all: the reactor stores the time of its
//! last turn in an atomic, so a stalled reactor makes `/healthz` answer 503 instead
//! of hanging.
//!
//! Depends on `broker` and `consume` for the shapes of the snapshot's parts.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::broker::{BrokerCounters, FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use crate::consume::CoordinatorSnapshot;
use crate::wire::ErrorCode;

/// How long a request waits for the reactor's snapshot before answering 503.
pub const SNAPSHOT_TIMEOUT_MS: u64 = 2_000;
/// The reactor counts as stalled when it has not turned for this long (it turns at
/// least once a second, for housekeeping).
pub const REACTOR_STALL_MS: u64 = 5_000;
/// Name of the probe file `/healthz` writes to check the data directory.
const HEALTH_PROBE_FILE: &str = ".healthz-probe";

/// A request for a snapshot; the reactor answers on `reply`.
pub struct AdminRequest {
    pub reply: SyncSender<Box<Snapshot>>,
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
}

#[derive(Debug, Clone, Default)]
pub struct TopicFigures {
    pub topic_id: u16,
    pub name: String,
    pub dlq_twin: bool,
    pub partitions: Vec<PartitionFigures>,
}

/// Everything `/stats` and `/metrics` show, copied by the reactor in one turn.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub version: &'static str,
    pub uptime_ms: u64,
    pub leader_epoch: u64,
    pub data_dir: PathBuf,
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
}

pub struct Admin {
    pub addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Admin {
    /// Binds the admin listener and starts its thread.
    pub fn start(
        addr: SocketAddr,
        data_dir: PathBuf,
        requests: Sender<AdminRequest>,
        wake: Arc<dyn Fn() + Send + Sync>,
        last_turn_ms: Arc<AtomicU64>,
        started: Instant,
    ) -> Result<Admin, String> {
        let server = tiny_http::Server::http(addr)
            .map_err(|e| format!("cannot listen on --admin-listen {addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or("admin listener has no IP address")?;
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("mortar-admin".into())
            .spawn(move || {
                let ctx = Ctx {
                    data_dir,
                    requests,
                    wake,
                    last_turn_ms,
                    started,
                };
                for request in serving.incoming_requests() {
                    ctx.serve(request);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Admin {
            addr,
            server,
            thread: Some(thread),
        })
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Ctx {
    data_dir: PathBuf,
    requests: Sender<AdminRequest>,
    wake: Arc<dyn Fn() + Send + Sync>,
    last_turn_ms: Arc<AtomicU64>,
    started: Instant,
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("static header")
}

impl Ctx {
    fn serve(&self, request: tiny_http::Request) {
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let known = matches!(path, "/healthz" | "/metrics" | "/stats");
        let (status, content_type, body) = if !known {
            (404, "text/plain", "not found\n".to_string())
        } else if *request.method() != tiny_http::Method::Get {
            (405, "text/plain", "only GET\n".to_string())
        } else {
            match path {
                "/healthz" => match self.health() {
                    Ok(()) => (200, "text/plain", "ok\n".to_string()),
                    Err(why) => (503, "text/plain", format!("{why}\n")),
                },
                _ => match self.snapshot() {
                    Some(s) if path == "/metrics" => {
                        (200, "text/plain; version=0.0.4", render_metrics(&s))
                    }
                    Some(s) => {
                        let pretty = query.split('&').any(|q| q == "pretty" || q == "pretty=1");
                        (200, "application/json", render_stats(&s, pretty))
                    }
                    None => (
                        503,
                        "text/plain",
                        "the reactor did not answer in time\n".into(),
                    ),
                },
            }
        };
        // The whole body is known: send Content-Length, never chunked (tiny_http chunks
        // bodies over 32 KiB by default, which simple scripts and clients mishandle).
        let mut response = tiny_http::Response::from_string(body)
            .with_status_code(status)
            .with_chunked_threshold(usize::MAX);
        response.add_header(header("Content-Type", content_type));
        if status == 405 {
            response.add_header(header("Allow", "GET"));
        }
        let _ = request.respond(response);
    }

    fn health(&self) -> Result<(), String> {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_turn_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) > REACTOR_STALL_MS {
            return Err(format!("reactor stalled: no turn for {} ms", now - last));
        }
        let probe = self.data_dir.join(HEALTH_PROBE_FILE);
        let written = std::fs::write(&probe, b"ok");
        let _ = std::fs::remove_file(&probe);
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(28) => Err("disk full: data directory".into()),
            Err(e) => Err(format!("data directory not writable: {e}")),
        }
    }

    fn snapshot(&self) -> Option<Box<Snapshot>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.requests.send(AdminRequest { reply: tx }).ok()?;
        (self.wake)();
        rx.recv_timeout(Duration::from_millis(SNAPSHOT_TIMEOUT_MS))
            .ok()
    }
}

/// Takes every waiting admin request without blocking (the reactor, once per turn).
pub fn pending_requests(rx: &Receiver<AdminRequest>) -> impl Iterator<Item = AdminRequest> + '_ {
    rx.try_iter()
}

/// The process's resident set size, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

// ---- /metrics: Prometheus text format 0.0.4 -----------------------------------------

struct Metrics(String);

impl Metrics {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape_label(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {value}");
    }

    fn single(&mut self, name: &str, kind: &str, help: &str, value: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }

    fn histogram(
        &mut self,
        name: &str,
        help: &str,
        bounds: &[u64],
        scale: f64,
        counts: &[u64],
        sum: f64,
    ) {
        self.family(name, "histogram", help);
        let mut cumulative = 0;
        for (i, count) in counts.iter().enumerate() {
            cumulative += count;
            let le = bounds
                .get(i)
                .map_or("+Inf".to_string(), |b| format!("{}", *b as f64 * scale));
            self.sample(&format!("{name}_bucket"), &[("le", &le)], cumulative);
        }
        self.sample(&format!("{name}_sum"), &[], sum);
        self.sample(&format!("{name}_count"), &[], cumulative);
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn render_metrics(s: &Snapshot) -> String {
    let mut m = Metrics(String::new());
    let b = &s.broker;
    m.single(
        "mortar_uptime_seconds",
        "gauge",
        "Seconds since start.",
        s.uptime_ms / 1000,
    );
    m.single(
        "mortar_leader_epoch",
        "gauge",
        "The broker's leader epoch.",
        s.leader_epoch,
    );
    m.single(
        "mortar_rss_bytes",
        "gauge",
        "Resident set size.",
        rss_bytes(),
    );
    m.single(
        "mortar_connections_open",
        "gauge",
        "Open client connections.",
        s.connections_open,
    );
    m.single(
        "mortar_connections_accepted_total",
        "counter",
        "Client connections accepted.",
        s.connections_accepted,
    );
    m.single(
        "mortar_connections_refused_total",
        "counter",
        "Connections refused over --max-connections.",
        s.connections_refused,
    );
    m.family(
        "mortar_connections_closed_total",
        "counter",
        "Connections closed, by reason.",
    );
    for (reason, n) in &s.connections_closed {
        m.sample("mortar_connections_closed_total", &[("reason", reason)], n);
    }
    m.family(
        "mortar_frames_in_total",
        "counter",
        "Frames received, by op.",
    );
    for (op, n) in &s.frames_in {
        m.sample("mortar_frames_in_total", &[("op", op)], n);
    }
    m.family("mortar_frames_out_total", "counter", "Frames sent, by op.");
    for (op, n) in &s.frames_out {
        m.sample("mortar_frames_out_total", &[("op", op)], n);
    }
    m.family(
        "mortar_errors_total",
        "counter",
        "ERR frames sent, by registry code.",
    );
    for (code, n) in &s.errors_sent {
        let name = ErrorCode::from_code(*code).map_or("UNKNOWN", |c| c.name());
        m.sample("mortar_errors_total", &[("code", name)], n);
    }
    m.single(
        "mortar_bytes_in_total",
        "counter",
        "Bytes read from clients.",
        s.bytes_in,
    );
    m.single(
        "mortar_bytes_out_total",
        "counter",
        "Bytes written to clients.",
        s.bytes_out,
    );
    m.single(
        "mortar_backpressure_pauses_total",
        "counter",
        "Times a connection stopped being read (output or pending-request high water).",
        s.backpressure_pauses,
    );
    m.single(
        "mortar_pubs_total",
        "counter",
        "PUB requests accepted for checking.",
        b.pubs,
    );
    m.single(
        "mortar_pubs_deduplicated_total",
        "counter",
        "PUBs answered as duplicates of an earlier record.",
        b.pubs_deduplicated,
    );
    m.single(
        "mortar_pubs_non_idempotent_total",
        "counter",
        "PUBs with producer_id 0.",
        b.pubs_non_idempotent,
    );
    m.single(
        "mortar_fsyncs_total",
        "counter",
        "Completed group-commit fdatasyncs.",
        b.fsyncs,
    );
    m.single(
        "mortar_fsync_failures_total",
        "counter",
        "Failed fdatasyncs.",
        b.fsync_failures,
    );
    m.histogram(
        "mortar_fsync_seconds",
        "fdatasync latency.",
        &FSYNC_LATENCY_BUCKETS_US,
        1e-6,
        &b.fsync_latency,
        b.fsync_micros_total as f64 * 1e-6,
    );
    m.histogram(
        "mortar_fsync_batch_records",
        "Records made durable by one fdatasync (group commit).",
        &FSYNC_BATCH_BUCKETS,
        1.0,
        &b.fsync_batch,
        b.fsync_records as f64,
    );
    m.single(
        "mortar_recovery_truncations_total",
        "counter",
        "Partitions whose torn or corrupt tail recovery truncated at start.",
        b.recovery_truncations,
    );
    m.single(
        "mortar_corrupt_records_total",
        "counter",
        "Records that failed their CRC when read (never delivered).",
        b.corrupt_records_found,
    );
    m.family(
        "mortar_records_appended_total",
        "counter",
        "Records appended, by topic.",
    );
    for t in &s.topics {
        let appended: u64 = t.partitions.iter().map(|p| p.last_sequence).sum();
        m.sample(
            "mortar_records_appended_total",
            &[("topic", &t.name)],
            appended,
        );
    }
    m.family(
        "mortar_partition_last_sequence",
        "gauge",
        "Last written sequence, by partition.",
    );
    let c = &s.groups.stats;
    m.single(
        "mortar_deliveries_total",
        "counter",
        "MSGs delivered (pushed or pulled).",
        c.deliveries,
    );
    m.single(
        "mortar_redeliveries_total",
        "counter",
        "Deliveries with attempt > 1.",
        c.redeliveries,
    );
    m.single(
        "mortar_delivery_expiries_total",
        "counter",
        "Deliveries past --ack-wait.",
        c.expired,
    );
    m.single(
        "mortar_dead_letters_total",
        "counter",
        "Records dead-lettered.",
        c.dead_letters,
    );
    m.single(
        "mortar_acks_total",
        "counter",
        "ACK frames received.",
        frame_count(&s.frames_in, "ACK"),
    );
    m.single(
        "mortar_nacks_total",
        "counter",
        "NACK frames received.",
        frame_count(&s.frames_in, "NACK"),
    );
    m.family(
        "mortar_consumer_lag_records",
        "gauge",
        "Records above the committed position.",
    );
    for g in &s.groups.groups {
        let topic = s.topics.iter().find(|t| t.topic_id == g.topic_id);
        let group = String::from_utf8_lossy(&g.name);
        for p in &g.partitions {
            let last = topic
                .and_then(|t| t.partitions.iter().find(|q| q.partition == p.partition))
                .map_or(0, |q| q.last_sequence);
            let name = topic.map_or(String::new(), |t| t.name.clone());
            let partition = p.partition.to_string();
            m.sample(
                "mortar_consumer_lag_records",
                &[
                    ("group", &group),
                    ("topic", &name),
                    ("partition", &partition),
                ],
                last.saturating_sub(p.committed),
            );
        }
    }
    m.0
}

fn frame_count(frames: &[(&'static str, u64)], op: &str) -> u64 {
    frames.iter().find(|(o, _)| *o == op).map_or(0, |(_, n)| *n)
}

// ---- /stats: one JSON document ------------------------------------------------------

/// A JSON value, rendered with correct string escaping (compact or pretty).
pub enum Json {
    Num(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Arr(Vec<Json>),
    Obj(Vec<(&'static str, Json)>),
}

impl Json {
    pub fn render(&self, pretty: bool) -> String {
        let mut out = String::new();
        self.write(&mut out, pretty, 0);
        if pretty {
            out.push('\n');
        }
        out
    }

    fn write(&self, out: &mut String, pretty: bool, depth: usize) {
        let newline = |out: &mut String, depth: usize| {
            if pretty {
                out.push('\n');
                out.push_str(&"  ".repeat(depth));
            }
        };
        match self {
            Json::Num(n) => {
                let _ = write!(out, "{n}");
            }
            Json::Float(f) if f.is_finite() => {
                let _ = write!(out, "{f}");
            }
            Json::Float(_) => out.push_str("null"),
            Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Json::Str(s) => write_json_string(out, s),
            Json::Arr(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    newline(out, depth + 1);
                    item.write(out, pretty, depth + 1);
                }
                if !items.is_empty() {
                    newline(out, depth);
                }
                out.push(']');
            }
            Json::Obj(fields) => {
                out.push('{');
                for (i, (k, v)) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    newline(out, depth + 1);
                    write_json_string(out, k);
                    out.push_str(if pretty { ": " } else { ":" });
                    v.write(out, pretty, depth + 1);
                }
                if !fields.is_empty() {
                    newline(out, depth);
                }
                out.push('}');
            }
        }
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn counts(pairs: &[(&'static str, u64)]) -> Json {
    Json::Obj(pairs.iter().map(|(k, v)| (*k, Json::Num(*v))).collect())
}

pub fn render_stats(s: &Snapshot, pretty: bool) -> String {
    let b = &s.broker;
    let topics = s
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    Json::Obj(vec![
                        ("partition", Json::Num(p.partition.into())),
                        ("first_sequence", Json::Num(p.first_sequence)),
                        ("last_sequence", Json::Num(p.last_sequence)),
                        ("commit_sequence", Json::Num(p.commit_sequence)),
                        ("bytes", Json::Num(p.bytes)),
                        ("segments", Json::Num(p.segments.into())),
                        ("poisoned", Json::Bool(p.poisoned)),
                    ])
                })
                .collect();
            Json::Obj(vec![
                ("topic_id", Json::Num(t.topic_id.into())),
                ("name", Json::Str(t.name.clone())),
                ("dlq_twin", Json::Bool(t.dlq_twin)),
                ("partitions", Json::Arr(partitions)),
            ])
        })
        .collect();
    let groups = s
        .groups
        .groups
        .iter()
        .map(|g| {
            let topic = s.topics.iter().find(|t| t.topic_id == g.topic_id);
            let members = g
                .members
                .iter()
                .map(|m| {
                    Json::Obj(vec![
                        ("member_id", Json::Num(m.member_id)),
                        ("membership_epoch", Json::Num(m.membership_epoch.into())),
                        ("assignment_epoch", Json::Num(m.assignment_epoch.into())),
                        ("subscription_id", Json::Num(m.subscription_id.into())),
                        ("pull_mode", Json::Bool(m.pull_mode)),
                        ("credit_count", Json::Num(m.credit_count.into())),
                        ("credit_bytes", Json::Num(m.credit_bytes.into())),
                        ("outstanding_count", Json::Num(m.outstanding_count.into())),
                        ("outstanding_bytes", Json::Num(m.outstanding_bytes)),
                    ])
                })
                .collect();
            let partitions = g
                .partitions
                .iter()
                .map(|p| {
                    let last = topic
                        .and_then(|t| t.partitions.iter().find(|q| q.partition == p.partition))
                        .map_or(0, |q| q.last_sequence);
                    Json::Obj(vec![
                        ("partition", Json::Num(p.partition.into())),
                        ("owner", p.owner.map_or(Json::Num(0), Json::Num)),
                        ("state", Json::Str(format!("{:?}", p.state).to_lowercase())),
                        ("ownership_epoch", Json::Num(p.ownership_epoch)),
                        ("committed", Json::Num(p.committed)),
                        ("lag", Json::Num(last.saturating_sub(p.committed))),
                        ("outstanding", Json::Num(p.outstanding as u64)),
                        (
                            "pending_redeliveries",
                            Json::Num(p.pending_redeliveries as u64),
                        ),
                    ])
                })
                .collect();
            Json::Obj(vec![
                (
                    "group",
                    Json::Str(String::from_utf8_lossy(&g.name).into_owned()),
                ),
                ("group_id", Json::Num(g.group_id.into())),
                ("topic_id", Json::Num(g.topic_id.into())),
                (
                    "topic",
                    Json::Str(topic.map_or(String::new(), |t| t.name.clone())),
                ),
                ("members", Json::Arr(members)),
                ("partitions", Json::Arr(partitions)),
            ])
        })
        .collect();
    let storage_bytes: u64 = s
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.bytes)
        .sum();
    let segments: u64 = s
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| u64::from(p.segments))
        .sum();
    let c = &s.groups.stats;
    let fsync_mean_ms = if b.fsyncs > 0 {
        b.fsync_micros_total as f64 / b.fsyncs as f64 / 1e3
    } else {
        0.0
    };
    let batch_mean = if b.fsyncs > 0 {
        b.fsync_records as f64 / b.fsyncs as f64
    } else {
        0.0
    };
    let doc = Json::Obj(vec![
        (
            "broker",
            Json::Obj(vec![
                ("version", Json::Str(s.version.to_string())),
                ("uptime_ms", Json::Num(s.uptime_ms)),
                ("leader_epoch", Json::Num(s.leader_epoch)),
                ("rss_bytes", Json::Num(rss_bytes())),
                ("data_dir", Json::Str(s.data_dir.display().to_string())),
            ]),
        ),
        (
            "connections",
            Json::Obj(vec![
                ("open", Json::Num(s.connections_open)),
                ("accepted", Json::Num(s.connections_accepted)),
                ("refused", Json::Num(s.connections_refused)),
                ("closed", counts(&s.connections_closed)),
                ("bytes_in", Json::Num(s.bytes_in)),
                ("bytes_out", Json::Num(s.bytes_out)),
                ("backpressure_pauses", Json::Num(s.backpressure_pauses)),
                ("buffered_bytes", Json::Num(s.buffered_bytes)),
            ]),
        ),
        ("topics", Json::Arr(topics)),
        ("groups", Json::Arr(groups)),
        (
            "delivery",
            Json::Obj(vec![
                ("deliveries", Json::Num(c.deliveries)),
                ("redeliveries", Json::Num(c.redeliveries)),
                ("expired", Json::Num(c.expired)),
                ("dead_letters", Json::Num(c.dead_letters)),
            ]),
        ),
        (
            "storage",
            Json::Obj(vec![
                ("bytes", Json::Num(storage_bytes)),
                ("segments", Json::Num(segments)),
                ("recovery_truncations", Json::Num(b.recovery_truncations)),
                (
                    "recovery_truncated_bytes",
                    Json::Num(b.recovery_truncated_bytes),
                ),
                ("corrupt_records", Json::Num(b.corrupt_records_found)),
            ]),
        ),
        (
            "fsync",
            Json::Obj(vec![
                ("count", Json::Num(b.fsyncs)),
                ("failures", Json::Num(b.fsync_failures)),
                ("records", Json::Num(b.fsync_records)),
                ("mean_ms", Json::Float(fsync_mean_ms)),
                ("mean_batch_records", Json::Float(batch_mean)),
            ]),
        ),
        (
            "publish",
            Json::Obj(vec![
                ("pubs", Json::Num(b.pubs)),
                ("deduplicated", Json::Num(b.pubs_deduplicated)),
                ("non_idempotent", Json::Num(b.pubs_non_idempotent)),
                ("records_appended", Json::Num(b.records_appended)),
            ]),
        ),
    ]);
    doc.render(pretty)
}

#[cfg(test)]
mod tests;
