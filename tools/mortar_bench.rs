//! `mortar-bench`: load generator and latency meter for MortarMQ (issue 7).
//!
//! ```text
//! mortar-bench [--broker ADDR] [--json] COMMAND [options]
//!   publish        N connections x D PUBs in flight: ops/s, MB/s, PUB->OK latency
//!   consume        push (credit window) or PULL, one ACK per message: msgs/s
//!   end-to-end     paced PUBs on one connection, one push consumer: latencies
//!   idle           hold N CONNECTed connections (RSS per idle connection)
//!   redis-consume  XREADGROUP COUNT n + XACK against Redis (for tools/compare.sh)
//! ```
//!
//! The tool speaks the wire protocol through its own small connection type rather
//! than `client::Client`: the hot loops decode frames in place from one reused read
//! buffer and encode into one reused write buffer, so no message allocates, and
//! replies, pushes and notices interleave freely (ACK answers arrive among MSGs).
//! With `--api`, `publish` and `consume` drive the same load through the client library
//! instead (`mortarmq::client::Producer`, idempotent, and `Consumer`), so that the
//! library is measured against the raw frames (docs/BENCHMARKS.md).
//! Timings: PUB->OK with `Instant`; publish->deliver with the SystemTime nanos the
//! publisher writes into the first 8 bytes of the value (same host, same clock).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

// The broker's own unit parsers: the same forms as `mortard`'s flags.
use mortarmq::config::{parse_duration, parse_size};
use mortarmq::wire::limits::{
    FRAME_HEADER_BYTES, MAX_FRAME_LEN_BYTES, OP_BYTES, SUB_PARTITION_ANY, WIRE_VERSION,
};
use mortarmq::wire::ops::*;
use mortarmq::wire::{split_frame, ErrorCode};
use mortarmq::wire::{
    AckFlags, ControlResult, DeclareFlags, Durability, NoticeKind, PubFlags, StartPolicy, SubFlags,
};

const BROKER_DEFAULT: &str = "127.0.0.1:7411";
const EXIT_FAILURE: u8 = 1;
const EXIT_USAGE: u8 = 2;
/// Bytes asked of the socket per read; the read buffer grows for larger frames.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// A broker silent this long fails the run instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// DECLARE flags bit2: look up, never create.
/// Linux USER_HZ, the unit of utime/stime in /proc/self/stat.
const CLOCK_TICKS_PER_SEC: f64 = 100.0;

type Res<T> = Result<T, String>;

fn usage() -> String {
    format!(
        "usage: mortar-bench [--broker ADDR] [--json] COMMAND [options]\n\
         \n  --broker ADDR          broker address (default {BROKER_DEFAULT})\n\
         \x20 --json                 one JSON object on stdout instead of the table\n\
         \x20 --token TOKEN          CONNECT token (default empty)\n\
         \ncommands:\n\
         \x20 publish    --connections N (1) --pipeline D (16) --value-size SIZE (1024)\n\
         \x20            --durability written|fsync|replicated (fsync) --partitions P (1)\n\
         \x20            --topic NAME (bench) --duration 10s | --count N\n\
         \x20            [--idempotent]: PUBs with a producer_id and producer_seqs\n\
         \x20            [--api [--not-idempotent]]: through mortarmq::client::Producer\n\
         \x20 consume    --mode push|pull (push) --credit N (256) --count N (100000)\n\
         \x20            --topic NAME --partitions P --value-size SIZE (prefill)\n\
         \x20            [--api]: through mortarmq::client::Consumer\n\
         \x20 end-to-end --rate R (20000) --duration 10s --durability written|fsync\n\
         \x20            --value-size SIZE (1024) --topic NAME (bench-e2e)\n\
         \x20 idle       --connections N (1000) --duration 30s\n\
         \x20 redis-consume --count N --credit N (XREADGROUP COUNT) --topic KEY\n\
         \x20            --value-size SIZE (prefill with XADD if XLEN < count)\n"
    )
}

fn main() -> ExitCode {
    let mut o = getopts::Options::new();
    o.optopt("", "broker", "broker address", "ADDR");
    o.optflag("", "json", "JSON output");
    o.optopt("", "token", "CONNECT token", "TOKEN");
    o.optopt("", "connections", "connections", "N");
    o.optopt("", "pipeline", "PUBs in flight per connection", "D");
    o.optopt("", "value-size", "value bytes", "SIZE");
    o.optopt(
        "",
        "durability",
        "written|fsync|replicated (a cluster)",
        "D",
    );
    o.optopt("", "partitions", "partitions of the topic", "P");
    o.optopt("", "topic", "topic name", "NAME");
    o.optopt("", "duration", "run time", "DUR");
    o.optopt("", "count", "messages", "N");
    o.optopt("", "mode", "push|pull", "MODE");
    o.optopt("", "credit", "credit window", "N");
    o.optopt("", "rate", "messages per second", "R");
    o.optflag("", "api", "publish/consume through mortarmq::client");
    o.optflag(
        "",
        "not-idempotent",
        "with --api: a producer with producer_id 0",
    );
    o.optflag(
        "",
        "idempotent",
        "raw publish: producer_id and producer_seqs",
    );
    o.optflag("h", "help", "this help");
    let m = match o.parse(std::env::args().skip(1)) {
        Ok(m) => m,
        Err(e) => {
            eprint!("mortar-bench: {e}\n{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if m.opt_present("help") {
        print!("{}", usage());
        return ExitCode::SUCCESS;
    }
    let args = match Args::from(&m) {
        Ok(a) => a,
        Err(e) => {
            eprint!("mortar-bench: {e}\n{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match m.free.first().map(String::as_str) {
        Some("publish") if args.api => api::publish(&args),
        Some("publish") => publish(&args),
        Some("consume") if args.api => api::consume(&args),
        Some("consume") => consume(&args),
        Some("end-to-end") => end_to_end(&args),
        Some("idle") => idle(&args),
        Some("redis-consume") => redis_consume(&args),
        _ => {
            eprint!("{}", usage());
            return ExitCode::from(EXIT_USAGE);
        }
    };
    match result {
        Ok(report) => {
            report.print(m.opt_present("json"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mortar-bench: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

// ---- arguments ----------------------------------------------------------------------

struct Args {
    broker: String,
    token: String,
    connections: Option<usize>,
    pipeline: usize,
    value_size: usize,
    durability: Durability,
    partitions: u16,
    topic: Option<String>,
    duration: Option<Duration>,
    count: Option<u64>,
    pull: bool,
    credit: u16,
    rate: u64,
    api: bool,
    idempotent: bool,
    raw_idempotent: bool,
}

impl Args {
    fn from(m: &getopts::Matches) -> Res<Args> {
        let num = |name: &str| -> Res<Option<u64>> {
            m.opt_str(name)
                .map(|s| {
                    s.parse::<u64>()
                        .map_err(|_| format!("--{name}: not a number: {s}"))
                })
                .transpose()
        };
        let durability = match m.opt_str("durability").as_deref() {
            None => Durability::Fsynced,
            Some(name) => match Durability::from_flag_name(name) {
                Some(d @ (Durability::Written | Durability::Fsynced | Durability::Replicated)) => d,
                _ => {
                    return Err(format!(
                        "--durability: written, fsync or replicated, not {name}"
                    ))
                }
            },
        };
        let pull = match m.opt_str("mode").as_deref() {
            None | Some("push") => false,
            Some("pull") => true,
            Some(other) => return Err(format!("--mode: push or pull, not {other}")),
        };
        let a = Args {
            broker: m.opt_str("broker").unwrap_or_else(|| BROKER_DEFAULT.into()),
            token: m.opt_str("token").unwrap_or_default(),
            connections: num("connections")?.map(|n| n as usize),
            pipeline: num("pipeline")?.unwrap_or(16) as usize,
            value_size: m
                .opt_str("value-size")
                .map_or(Ok(1024), |s| parse_size(&s).map(|n| n as usize))?,
            durability,
            partitions: num("partitions")?.unwrap_or(1).clamp(1, 65535) as u16,
            topic: m.opt_str("topic"),
            duration: m
                .opt_str("duration")
                .map(|s| parse_duration(&s))
                .transpose()?,
            count: num("count")?,
            pull,
            credit: num("credit")?.unwrap_or(256).clamp(1, 65535) as u16,
            rate: num("rate")?.unwrap_or(20_000).max(1),
            api: m.opt_present("api"),
            idempotent: !m.opt_present("not-idempotent"),
            raw_idempotent: m.opt_present("idempotent"),
        };
        if a.pipeline == 0 || a.connections == Some(0) {
            return Err("--pipeline and --connections must be at least 1".into());
        }
        Ok(a)
    }

    fn topic(&self, default: &str) -> String {
        self.topic.clone().unwrap_or_else(|| default.into())
    }
}

// ---- report -------------------------------------------------------------------------

enum Val {
    Num(f64),
    Int(u64),
    Text(String),
}

#[derive(Default)]
struct Report {
    rows: Vec<(String, Val)>,
}

impl Report {
    fn num(&mut self, k: &str, v: f64) {
        self.rows.push((k.into(), Val::Num(v)));
    }
    fn int(&mut self, k: &str, v: u64) {
        self.rows.push((k.into(), Val::Int(v)));
    }
    fn text(&mut self, k: &str, v: &str) {
        self.rows.push((k.into(), Val::Text(v.into())));
    }
    /// `<prefix>_p50_us` … `<prefix>_max_us` for the given percentiles.
    fn hist(&mut self, prefix: &str, h: &Hist, pcts: &[(&str, f64)]) {
        for (name, p) in pcts {
            self.num(
                &format!("{prefix}_{name}_us"),
                h.percentile(*p) as f64 / 1e3,
            );
        }
        self.num(&format!("{prefix}_max_us"), h.max as f64 / 1e3);
    }

    fn print(&self, json: bool) {
        let fmt = |v: &Val| match v {
            Val::Num(x) if x.abs() < 100.0 => format!("{:.3}", x),
            Val::Num(x) => format!("{:.1}", x),
            Val::Int(x) => x.to_string(),
            Val::Text(t) if json => format!("\"{}\"", t.replace('"', "'")),
            Val::Text(t) => t.clone(),
        };
        if json {
            let body: Vec<String> = self
                .rows
                .iter()
                .map(|(k, v)| format!("\"{k}\":{}", fmt(v)))
                .collect();
            println!("{{{}}}", body.join(","));
        } else {
            let w = self.rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
            for (k, v) in &self.rows {
                println!("{k:<w$}  {}", fmt(v));
            }
        }
    }
}

/// CPU seconds (user + system) this process has used so far.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the parenthesised command name start at field 3 (state).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    ticks as f64 / CLOCK_TICKS_PER_SEC
}

// ---- histogram ----------------------------------------------------------------------

/// Log-linear histogram of nanoseconds: 32 linear sub-buckets per power of two, so a
/// percentile is within ~3 % of the true value. Fixed size; recording never allocates.
struct Hist {
    counts: Vec<u64>,
    n: u64,
    max: u64,
}

const BUCKET_BITS: u32 = 5;
const BUCKETS_PER_POWER: u64 = 1 << BUCKET_BITS;

impl Hist {
    fn new() -> Hist {
        Hist {
            counts: vec![0; (64 * BUCKETS_PER_POWER) as usize],
            n: 0,
            max: 0,
        }
    }

    fn index(v: u64) -> usize {
        if v < BUCKETS_PER_POWER {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - BUCKET_BITS;
        let bucket = (u64::from(shift) + 1) << BUCKET_BITS;
        (bucket + ((v >> shift) & (BUCKETS_PER_POWER - 1))) as usize
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < BUCKETS_PER_POWER {
            return i;
        }
        let shift = i / BUCKETS_PER_POWER - 1;
        ((BUCKETS_PER_POWER + i % BUCKETS_PER_POWER) << shift) + ((1u64 << shift) >> 1)
    }

    fn record(&mut self, ns: u64) {
        self.counts[Hist::index(ns)] += 1;
        self.n += 1;
        self.max = self.max.max(ns);
    }

    fn merge(&mut self, o: &Hist) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.n += o.n;
        self.max = self.max.max(o.max);
    }

    fn percentile(&self, p: f64) -> u64 {
        if self.n == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * self.n as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Hist::value(i).min(self.max);
            }
        }
        self.max
    }
}

const PCT_PUB: [(&str, f64); 2] = [("p50", 50.0), ("p99", 99.0)];
const PCT_E2E: [(&str, f64); 4] = [("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p999", 99.9)];

// ---- connection ---------------------------------------------------------------------

/// One TCP connection with a reused read buffer (frames are decoded in place between
/// `start` and `end`) and a reused write buffer.
struct Conn {
    stream: TcpStream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    out: Vec<u8>,
}

impl Conn {
    fn open(addr: &str) -> Res<Conn> {
        let stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).map_err(io_err)?;
        Conn::from_stream(stream)
    }

    fn from_stream(stream: TcpStream) -> Res<Conn> {
        stream.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
        Ok(Conn {
            stream,
            buf: vec![0; READ_CHUNK_BYTES],
            start: 0,
            end: 0,
            out: Vec::with_capacity(64 * 1024),
        })
    }

    /// Opens a connection and CONNECTs with `token`.
    fn connect(addr: &str, token: &str) -> Res<Conn> {
        let mut c = Conn::open(addr)?;
        c.request(&Frame::Connect(Connect {
            protocol_version: WIRE_VERSION,
            client_flags: 0,
            token: token.as_bytes(),
            reserved: 0,
        }))?;
        Ok(c)
    }

    fn flush(&mut self) -> Res<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).map_err(io_err)?;
            self.out.clear();
        }
        Ok(())
    }

    /// The next complete frame already buffered, consumed: (op, payload range). The
    /// payload stays valid until the next [`Conn::fill`].
    fn buffered(&mut self) -> Res<Option<(Op, usize, usize)>> {
        match split_frame(&self.buf[self.start..self.end], MAX_FRAME_LEN_BYTES) {
            Ok(Some(raw)) => {
                let op = Op::from_u8(raw.op).ok_or_else(|| format!("op 0x{:02X}", raw.op))?;
                let p = self.start + FRAME_HEADER_BYTES + OP_BYTES;
                self.start += raw.total_bytes;
                Ok(Some((op, p, self.start)))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(format!("from broker: {e}")),
        }
    }

    /// Reads more bytes from the socket (blocking, bounded by IO_TIMEOUT).
    fn fill(&mut self) -> Res<()> {
        match self.try_fill()? {
            true => Ok(()),
            false => Err("connection: no answer within the read timeout".into()),
        }
    }

    /// Like [`Conn::fill`], but a read timeout answers `false`.
    fn try_fill(&mut self) -> Res<bool> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        } else if self.buf.len() - self.end < READ_CHUNK_BYTES / 2 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.buf.len() - self.end < READ_CHUNK_BYTES / 2 {
            self.buf.resize(self.end + READ_CHUNK_BYTES, 0);
        }
        match self.stream.read(&mut self.buf[self.end..]) {
            Ok(0) => Err("the server closed the connection".into()),
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(io_err(e)),
        }
    }

    /// The next frame, reading as needed. Flushes queued bytes before blocking.
    fn next(&mut self) -> Res<(Op, usize, usize)> {
        loop {
            if let Some(f) = self.buffered()? {
                return Ok(f);
            }
            self.flush()?;
            self.fill()?;
        }
    }

    /// Sends `frame` and waits for its answer; notices arriving first are kept.
    fn request_keep(&mut self, frame: &Frame<'_>, kept: &mut Vec<Notice>) -> Res<Vec<u8>> {
        frame.encode(&mut self.out);
        self.flush()?;
        loop {
            let (op, p, e) = self.next()?;
            match decode(op, &self.buf[p..e])? {
                Frame::Ok(ok) => return Ok(ok.result.to_vec()),
                Frame::Err(err) => return Err(broker_err(&err)),
                Frame::Notice(n) => kept.push(n),
                other => return Err(format!("unexpected {:?} during setup", other.op())),
            }
        }
    }

    fn request(&mut self, frame: &Frame<'_>) -> Res<Vec<u8>> {
        let mut kept = Vec::new();
        let r = self.request_keep(frame, &mut kept)?;
        match kept.is_empty() {
            true => Ok(r),
            false => Err("unexpected NOTICE on a connection without subscriptions".into()),
        }
    }
}

fn io_err(e: io::Error) -> String {
    format!("connection: {e}")
}

fn decode(op: Op, payload: &[u8]) -> Res<Frame<'_>> {
    Frame::decode(op, payload).map_err(|e| e.to_string())
}

fn broker_err(e: &ErrFrame<'_>) -> String {
    let name = ErrorCode::from_code(e.code).map_or("unregistered".into(), |c| c.to_string());
    format!(
        "broker ERR 0x{:04X} {name} to op 0x{:02X}: {}",
        e.code,
        e.request_op,
        String::from_utf8_lossy(e.message)
    )
}

fn typed<R: OkResult>(bytes: &[u8]) -> Res<R> {
    R::decode_result(bytes).map_err(|e| e.to_string())
}

/// Creates the topic with `partitions` if it is missing; returns (topic_id, partitions).
fn declare(c: &mut Conn, topic: &str, partitions: u16) -> Res<(u16, u16)> {
    let passive = Declare {
        topic: topic.as_bytes(),
        partition_count: 0,
        flags: DeclareFlags::PASSIVE,
    };
    let r = match c.request(&Frame::Declare(passive)) {
        Ok(r) => r,
        Err(_) => c.request(&Frame::Declare(Declare {
            topic: topic.as_bytes(),
            partition_count: partitions,
            flags: DeclareFlags::empty(),
        }))?,
    };
    let d: DeclareResult = typed(&r)?;
    Ok((d.topic_id, d.partition_count))
}

fn control_ack(n: &Notice) -> ControlAck {
    ControlAck::answering(n, ControlResult::Ok)
}

fn ack_of(m: &Msg<'_>) -> Ack {
    m.delivery_ref().ack(AckFlags::empty())
}

fn unique_group(kind: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("bench-{kind}-{}-{nanos}", std::process::id())
}

fn wall_nanos() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A subscribed member holding all `partitions`, ASSIGNs acknowledged.
struct Member {
    sub: SubResult,
    assignment_epoch: u32,
    membership_epoch: u32,
}

fn subscribe(
    c: &mut Conn,
    topic_id: u16,
    partitions: u16,
    how: (u16, StartPolicy, SubFlags),
) -> Res<Member> {
    let (credit, start_policy, flags) = how;
    let group = unique_group("g");
    let mut notices = Vec::new();
    let r = c.request_keep(
        &Frame::Sub(Sub {
            group: group.as_bytes(),
            topic_id,
            partition: SUB_PARTITION_ANY,
            start_policy: start_policy.as_code(),
            credit_count: credit,
            credit_bytes: 0,
            flags,
        }),
        &mut notices,
    )?;
    let sub: SubResult = typed(&r)?;
    let mut m = Member {
        sub,
        assignment_epoch: sub.assignment_epoch,
        membership_epoch: sub.membership_epoch,
    };
    let mut held = 0;
    let deadline = Instant::now() + IO_TIMEOUT;
    while held < partitions {
        if Instant::now() > deadline {
            return Err("no ASSIGN of every partition in time".into());
        }
        if notices.is_empty() {
            let (op, p, e) = c.next()?;
            match decode(op, &c.buf[p..e])? {
                Frame::Notice(n) => notices.push(n),
                other => return Err(format!("unexpected {:?} before ASSIGN", other.op())),
            }
            continue;
        }
        let n = notices.remove(0);
        m.assignment_epoch = n.assignment_epoch;
        m.membership_epoch = n.membership_epoch;
        if NoticeKind::from_code(n.kind) == Some(NoticeKind::Assign) {
            held += 1;
        }
        c.request_keep(&Frame::ControlAck(control_ack(&n)), &mut notices)?;
    }
    Ok(m)
}

// ---- publish ------------------------------------------------------------------------

struct PubStats {
    hist: Hist,
    ops: u64,
    errors: u64,
    first_error: Option<String>,
}

/// When a publishing connection stops issuing PUBs.
#[derive(Clone, Copy)]
enum Stop {
    Count(u64),
    Until(Instant),
}

struct PubJob {
    topic_id: u16,
    partitions: u16,
    first_partition: u16,
    depth: usize,
    value_size: usize,
    durability: Durability,
    stop: Stop,
    /// Non-zero: PUBs carry it and a producer_seq per partition, as an idempotent
    /// producer's do.
    producer_id: u64,
}

/// One connection keeping `depth` PUBs in flight: every batch of answers read from the
/// socket is replaced by as many new PUBs, written with one syscall.
fn publish_conn(mut c: Conn, job: &PubJob) -> Res<PubStats> {
    let value = vec![b'x'; job.value_size];
    let mut sent_at: VecDeque<Instant> = VecDeque::with_capacity(job.depth);
    let mut st = PubStats {
        hist: Hist::new(),
        ops: 0,
        errors: 0,
        first_error: None,
    };
    let mut sent = 0u64;
    let mut partition = job.first_partition;
    let mut seqs = vec![0u64; usize::from(job.partitions)];
    loop {
        let now = Instant::now();
        let more = |sent: u64| match job.stop {
            Stop::Count(n) => sent < n,
            Stop::Until(t) => now < t,
        };
        while sent_at.len() < job.depth && more(sent) {
            let seq = &mut seqs[usize::from(partition)];
            *seq += u64::from(job.producer_id != 0);
            Pub {
                topic_id: job.topic_id,
                partition,
                producer_id: job.producer_id,
                producer_seq: *seq,
                flags: PubFlags::requesting(Some(job.durability)),
                value: &value,
                ..Pub::default()
            }
            .encode_frame(&mut c.out);
            partition = (partition + 1) % job.partitions;
            sent_at.push_back(now);
            sent += 1;
        }
        if sent_at.is_empty() {
            return Ok(st);
        }
        // Block for one answer, then take every answer already buffered.
        let mut frame = Some(c.next()?);
        while let Some((op, p, e)) = frame {
            let at = sent_at.pop_front().ok_or("an answer without a request")?;
            match decode(op, &c.buf[p..e])? {
                Frame::Ok(_) => {
                    st.hist.record(at.elapsed().as_nanos() as u64);
                    st.ops += 1;
                }
                Frame::Err(err) => {
                    st.errors += 1;
                    st.first_error.get_or_insert_with(|| broker_err(&err));
                }
                other => return Err(format!("unexpected {:?} answering PUB", other.op())),
            }
            frame = c.buffered()?;
        }
    }
}

fn publish(a: &Args) -> Res<Report> {
    let conns = a.connections.unwrap_or(1);
    let topic = a.topic("bench");
    let mut setup = Conn::connect(&a.broker, &a.token)?;
    let (topic_id, partitions) = declare(&mut setup, &topic, a.partitions)?;
    let mut clients = Vec::with_capacity(conns);
    for _ in 0..conns {
        clients.push(Conn::connect(&a.broker, &a.token)?);
    }
    let duration = a.duration.unwrap_or(Duration::from_secs(10));
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let handles: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let stop = match a.count {
                Some(n) => Stop::Count(n / conns as u64 + u64::from((i as u64) < n % conns as u64)),
                None => Stop::Until(t0 + duration),
            };
            let job = PubJob {
                topic_id,
                partitions,
                first_partition: (i % usize::from(partitions)) as u16,
                depth: a.pipeline,
                value_size: a.value_size,
                durability: a.durability,
                stop,
                producer_id: match a.raw_idempotent {
                    true => wall_nanos() >> 1 | 1,
                    false => 0,
                },
            };
            thread::spawn(move || publish_conn(c, &job))
        })
        .collect();
    let mut hist = Hist::new();
    let (mut ops, mut errors, mut first_error) = (0, 0, None);
    for h in handles {
        let st = h.join().map_err(|_| "a publishing thread panicked")??;
        hist.merge(&st.hist);
        ops += st.ops;
        errors += st.errors;
        first_error = first_error.or(st.first_error);
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let mut r = Report::default();
    r.text("workload", "publish");
    r.text("durability", a.durability.flag_name());
    r.text("idempotent", if a.raw_idempotent { "yes" } else { "no" });
    r.int("connections", conns as u64);
    r.int("pipeline", a.pipeline as u64);
    r.int("value_size", a.value_size as u64);
    r.int("partitions", u64::from(partitions));
    r.int("ops", ops);
    r.num("seconds", secs);
    r.num("ops_per_sec", ops as f64 / secs);
    r.num(
        "mb_per_sec",
        (ops * a.value_size as u64) as f64 / secs / 1e6,
    );
    r.hist("pub_ok", &hist, &PCT_PUB);
    r.int("errors", errors);
    r.num("tool_cpu_pct", cpu / secs * 100.0);
    if let Some(e) = first_error {
        r.text("first_error", &e);
    }
    Ok(r)
}

// ---- consume ------------------------------------------------------------------------

/// Prefill rounds at most: a round that met BACKPRESSURE (a disk behind the publishers)
/// waits [`PREFILL_BACKOFF_MS`] and publishes what is still missing.
const PREFILL_ROUNDS_MAX: u32 = 30;
const PREFILL_BACKOFF_MS: u64 = 500;

/// Makes sure the topic holds at least `count` records, publishing the missing ones
/// with WRITTEN durability; returns (topic id, partitions, records published).
fn prefill(a: &Args, topic: &str, count: u64) -> Res<(u16, u16, u64)> {
    let mut published = 0;
    for _ in 0..PREFILL_ROUNDS_MAX {
        let mut c = Conn::connect(&a.broker, &a.token)?;
        let (topic_id, partitions) = declare(&mut c, topic, a.partitions)?;
        let missing = count.saturating_sub(records_held(a, &mut c, topic_id, partitions)?);
        if missing == 0 {
            return Ok((topic_id, partitions, published));
        }
        let job = PubJob {
            topic_id,
            partitions,
            first_partition: 0,
            depth: 256,
            value_size: a.value_size,
            durability: Durability::Written,
            stop: Stop::Count(missing),
            producer_id: 0,
        };
        let st = publish_conn(c, &job)?;
        published += st.ops;
        match st.first_error {
            None => return Ok((topic_id, partitions, published)),
            Some(e) if e.contains(&ErrorCode::Backpressure.to_string()) => {
                std::thread::sleep(Duration::from_millis(PREFILL_BACKOFF_MS));
            }
            Some(e) => return Err(format!("prefill: {e}")),
        }
    }
    Err(format!(
        "prefill: still BACKPRESSURE after {PREFILL_ROUNDS_MAX} rounds"
    ))
}

/// The records a topic holds: one WRITTEN probe per partition, whose sequence is the
/// partition's record count.
fn records_held(a: &Args, c: &mut Conn, topic_id: u16, partitions: u16) -> Res<u64> {
    let probe = vec![b'x'; a.value_size];
    let mut have = 0;
    for partition in 0..partitions {
        Pub {
            topic_id,
            partition,
            flags: PubFlags::requesting(Some(Durability::Written)),
            value: &probe,
            ..Pub::default()
        }
        .encode_frame(&mut c.out);
        let r: PubResult = typed(&c.request_flushed()?)?;
        have += r.sequence;
    }
    Ok(have)
}

impl Conn {
    /// Flushes the queued request and waits for its OK.
    fn request_flushed(&mut self) -> Res<Vec<u8>> {
        self.flush()?;
        let (op, p, e) = self.next()?;
        match decode(op, &self.buf[p..e])? {
            Frame::Ok(ok) => Ok(ok.result.to_vec()),
            Frame::Err(err) => Err(broker_err(&err)),
            other => Err(format!("unexpected {:?}", other.op())),
        }
    }
}

fn consume(a: &Args) -> Res<Report> {
    let count = a.count.unwrap_or(100_000);
    let topic = a.topic("bench");
    let (topic_id, partitions, prefilled) = prefill(a, &topic, count)?;
    let mut c = Conn::connect(&a.broker, &a.token)?;
    let flags = if a.pull {
        SubFlags::PULL_MODE
    } else {
        SubFlags::empty()
    };
    let t0 = Instant::now();
    let cpu0 = cpu_seconds();
    let member = subscribe(
        &mut c,
        topic_id,
        partitions,
        (a.credit, StartPolicy::Earliest, flags),
    )?;
    let pull = |m: &Member| Pull {
        subscription_id: m.sub.subscription_id,
        member_id: m.sub.member_id,
        membership_epoch: m.membership_epoch,
        assignment_epoch: m.assignment_epoch,
        ownership_epochs: Vec::new(),
        max_msgs: a.credit,
        max_bytes: 0,
        wait_ms: 1000,
        min_bytes: 0,
    };
    if a.pull {
        Frame::Pull(pull(&member)).encode(&mut c.out);
    }
    let (mut got, mut acked, mut errors, mut empty_pulls) = (0u64, 0u64, 0u64, 0u64);
    let mut in_pull = 0u64;
    while acked < count {
        let (op, p, e) = c.next()?;
        match decode(op, &c.buf[p..e])? {
            Frame::Msg(m) => {
                in_pull += 1;
                if got < count {
                    got += 1;
                    ack_of(&m).encode_frame(&mut c.out);
                }
            }
            Frame::Ok(ok) if ok.request_op == Op::Ack as u8 => acked += 1,
            Frame::Ok(ok) if ok.request_op == Op::Pull as u8 => {
                if in_pull == 0 {
                    empty_pulls += 1;
                    if empty_pulls > 10 {
                        return Err(format!("PULLs answer nothing after {got} messages"));
                    }
                }
                in_pull = 0;
                if got < count {
                    Frame::Pull(pull(&member)).encode(&mut c.out);
                }
            }
            Frame::Ok(_) => {}
            Frame::Notice(n) => Frame::ControlAck(control_ack(&n)).encode(&mut c.out),
            Frame::Err(err) => {
                errors += 1;
                if errors == 1 {
                    eprintln!("mortar-bench: {}", broker_err(&err));
                }
                if err.request_op == Op::Ack as u8 {
                    acked += 1;
                }
            }
            other => return Err(format!("unexpected {:?} while consuming", other.op())),
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let counts = (partitions, prefilled, got, errors);
    Ok(consume_report("consume", a, counts, secs, cpu))
}

/// The report of a consume run, raw or through the client library, so that the two
/// compare field by field: `counts` is (partitions, prefilled, messages, errors).
fn consume_report(
    workload: &str,
    a: &Args,
    (partitions, prefilled, got, errors): (u16, u64, u64, u64),
    secs: f64,
    cpu: f64,
) -> Report {
    let mut r = Report::default();
    r.text("workload", workload);
    r.text("mode", if a.pull { "pull" } else { "push" });
    r.int("credit", u64::from(a.credit));
    r.int("partitions", u64::from(partitions));
    r.int("prefilled", prefilled);
    r.int("msgs", got);
    r.num("seconds", secs);
    r.num("msgs_per_sec", got as f64 / secs);
    r.int("errors", errors);
    r.num("tool_cpu_pct", cpu / secs * 100.0);
    r
}

// ---- through the client library -----------------------------------------------------

/// `publish` and `consume` through `mortarmq::client`, reporting the same figures as the
/// raw loops (less the per-request latency, which the library does not expose).
mod api {
    use std::collections::VecDeque;
    use std::thread;
    use std::time::{Duration, Instant};

    use mortarmq::client::{Consumer, Producer, Record, SendHandle, StartPolicy};

    use super::{cpu_seconds, prefill, unique_group, Args, Report, Res, Stop, IO_TIMEOUT};

    /// A producer keeping the raw loop's depth in flight.
    fn producer(a: &Args) -> Res<Producer> {
        Producer::builder(a.broker.as_str())
            .token(&a.token)
            .durability(a.durability)
            .idempotent(a.idempotent)
            .max_in_flight(a.pipeline)
            .declare(a.partitions)
            .connect()
            .map_err(|e| format!("connect: {e}"))
    }

    /// Records answered so far, counted in order: (stored, failed).
    #[derive(Default)]
    struct Tally {
        handles: VecDeque<SendHandle>,
        ok: u64,
        failed: u64,
    }

    impl Tally {
        fn settle(&mut self) {
            while let Some(outcome) = self.handles.front().and_then(SendHandle::result) {
                self.handles.pop_front();
                match outcome {
                    Ok(_) => self.ok += 1,
                    Err(_) => self.failed += 1,
                }
            }
        }
    }

    /// One producer sending until `stop`, to the partitions in turn as the raw loop
    /// does: (stored, failed).
    fn produce(a: &Args, mut p: Producer, first: u16, stop: Stop) -> Res<(u64, u64)> {
        let topic = a.topic("bench");
        let partitions = p.topic(&topic).map_err(|e| e.to_string())?.partitions;
        let value = vec![b'x'; a.value_size];
        let mut tally = Tally::default();
        let mut sent = 0u64;
        let mut partition = first % partitions;
        while match stop {
            Stop::Count(n) => sent < n,
            Stop::Until(t) => Instant::now() < t,
        } {
            let record = Record::new(&topic, &value).partition(partition);
            let handle = p.send_record(record).map_err(|e| e.to_string())?;
            tally.handles.push_back(handle);
            partition = (partition + 1) % partitions;
            sent += 1;
            tally.settle();
        }
        let _ = p.flush();
        tally.settle();
        Ok((tally.ok, tally.failed))
    }

    pub fn publish(a: &Args) -> Res<Report> {
        let conns = a.connections.unwrap_or(1);
        let producers: Vec<Producer> = (0..conns).map(|_| producer(a)).collect::<Res<_>>()?;
        let duration = a.duration.unwrap_or(Duration::from_secs(10));
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        let results: Vec<Res<(u64, u64)>> = thread::scope(|s| {
            let running: Vec<_> = producers
                .into_iter()
                .enumerate()
                .map(|(i, p)| {
                    let stop = match a.count {
                        Some(n) => {
                            Stop::Count(n / conns as u64 + u64::from((i as u64) < n % conns as u64))
                        }
                        None => Stop::Until(t0 + duration),
                    };
                    s.spawn(move || produce(a, p, i as u16, stop))
                })
                .collect();
            running.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let (mut ops, mut errors) = (0, 0);
        for r in results {
            let (ok, failed) = r?;
            ops += ok;
            errors += failed;
        }
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let mut r = Report::default();
        r.text("workload", "publish-api");
        r.text("durability", a.durability.flag_name());
        r.text("idempotent", if a.idempotent { "yes" } else { "no" });
        r.int("connections", conns as u64);
        r.int("pipeline", a.pipeline as u64);
        r.int("value_size", a.value_size as u64);
        r.int("ops", ops);
        r.num("seconds", secs);
        r.num("ops_per_sec", ops as f64 / secs);
        r.num(
            "mb_per_sec",
            (ops * a.value_size as u64) as f64 / secs / 1e6,
        );
        r.int("errors", errors);
        r.num("tool_cpu_pct", cpu / secs * 100.0);
        Ok(r)
    }

    pub fn consume(a: &Args) -> Res<Report> {
        let count = a.count.unwrap_or(100_000);
        let topic = a.topic("bench");
        let (_, partitions, prefilled) = prefill(a, &topic, count)?;
        let mut c = Consumer::builder(a.broker.as_str())
            .token(&a.token)
            .credit(a.credit, 0)
            .pull(a.pull)
            .connect()
            .map_err(|e| format!("connect: {e}"))?;
        let t0 = Instant::now();
        let cpu0 = cpu_seconds();
        c.subscribe(&unique_group("api"), &topic, StartPolicy::Earliest)
            .map_err(|e| e.to_string())?;
        let mut got = 0u64;
        while got < count {
            match c.poll(Some(IO_TIMEOUT)).map_err(|e| e.to_string())? {
                Some(m) => {
                    m.ack();
                    got += 1;
                }
                None => return Err(format!("nothing more after {got} messages")),
            }
        }
        c.flush(IO_TIMEOUT).map_err(|e| e.to_string())?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = cpu_seconds() - cpu0;
        let ignored = c.stats().ignored_errors;
        c.close().map_err(|e| e.to_string())?;
        let counts = (partitions, prefilled, got, ignored);
        Ok(super::consume_report("consume-api", a, counts, secs, cpu))
    }
}

// ---- end-to-end ---------------------------------------------------------------------

fn end_to_end(a: &Args) -> Res<Report> {
    let duration = a.duration.unwrap_or(Duration::from_secs(10));
    let total = (a.rate as f64 * duration.as_secs_f64()) as u64;
    let topic = a.topic("bench-e2e");
    let value_size = a.value_size.max(8);
    let mut prod = Conn::connect(&a.broker, &a.token)?;
    let (topic_id, partitions) = declare(&mut prod, &topic, a.partitions)?;

    // The consumer: push, credit 256, from the end of the log.
    let mut cons = Conn::connect(&a.broker, &a.token)?;
    subscribe(
        &mut cons,
        topic_id,
        partitions,
        (256, StartPolicy::Latest, SubFlags::empty()),
    )?;
    let done = Arc::new(AtomicBool::new(false));
    let consumer = {
        let done = done.clone();
        thread::spawn(move || e2e_consume(cons, total, &done))
    };

    // The publisher's answers are read by their own thread; the i-th OK answers the
    // i-th PUB, whose send time is in `sent_ns[i]`.
    let sent_ns: Arc<Vec<AtomicU64>> = Arc::new((0..total).map(|_| AtomicU64::new(0)).collect());
    let reader = {
        let rd = Conn::from_stream(prod.stream.try_clone().map_err(io_err)?)?;
        let sent_ns = sent_ns.clone();
        thread::spawn(move || e2e_pub_answers(rd, &sent_ns))
    };
    let mut value = vec![b'x'; value_size];
    let interval = Duration::from_secs_f64(1.0 / a.rate as f64);
    let t0 = Instant::now();
    let mut i = 0u64;
    while i < total {
        let now = Instant::now();
        let due = t0 + interval.mul_f64(i as f64);
        if now < due {
            thread::sleep(due - now);
            continue;
        }
        // Everything due by now goes out in one write.
        while i < total && t0 + interval.mul_f64(i as f64) <= now {
            let ts = wall_nanos();
            value[..8].copy_from_slice(&ts.to_le_bytes());
            sent_ns[i as usize].store(ts, Ordering::Release);
            Pub {
                topic_id,
                partition: (i % u64::from(partitions)) as u16,
                flags: PubFlags::requesting(Some(a.durability)),
                value: &value,
                ..Pub::default()
            }
            .encode_frame(&mut prod.out);
            i += 1;
        }
        prod.flush()?;
    }
    let send_secs = t0.elapsed().as_secs_f64();
    let (pub_hist, pub_errors) = reader.join().map_err(|_| "reader panicked")??;
    // Allow the consumer a grace period for the last deliveries.
    let grace = Instant::now() + Duration::from_secs(5);
    while !consumer.is_finished() && Instant::now() < grace {
        thread::sleep(Duration::from_millis(10));
    }
    done.store(true, Ordering::Release);
    let (del_hist, delivered) = consumer.join().map_err(|_| "consumer panicked")??;
    let mut r = Report::default();
    r.text("workload", "end-to-end");
    r.text("durability", a.durability.flag_name());
    r.int("rate_target", a.rate);
    r.num("rate_achieved", total as f64 / send_secs);
    r.int("published", total);
    r.int("delivered", delivered);
    r.int("errors", pub_errors);
    r.hist("deliver", &del_hist, &PCT_E2E);
    r.hist("pub_ok", &pub_hist, &PCT_E2E);
    Ok(r)
}

fn e2e_pub_answers(mut c: Conn, sent_ns: &[AtomicU64]) -> Res<(Hist, u64)> {
    let mut h = Hist::new();
    let mut errors = 0;
    for sent in sent_ns {
        let (op, p, e) = c.next()?;
        let now = wall_nanos();
        match decode(op, &c.buf[p..e])? {
            Frame::Ok(_) => {
                let t = sent.load(Ordering::Acquire);
                if t != 0 {
                    h.record(now.saturating_sub(t));
                }
            }
            Frame::Err(err) => {
                errors += 1;
                if errors == 1 {
                    eprintln!("mortar-bench: {}", broker_err(&err));
                }
            }
            other => return Err(format!("unexpected {:?} answering PUB", other.op())),
        }
    }
    Ok((h, errors))
}

fn e2e_consume(mut c: Conn, total: u64, done: &AtomicBool) -> Res<(Hist, u64)> {
    c.stream
        .set_read_timeout(Some(Duration::from_millis(100)))
        .map_err(io_err)?;
    let mut h = Hist::new();
    let mut got = 0;
    while got < total && !done.load(Ordering::Acquire) {
        let (op, p, e) = match c.buffered()? {
            Some(f) => f,
            None => {
                c.flush()?;
                c.try_fill()?;
                continue;
            }
        };
        let now = wall_nanos();
        match decode(op, &c.buf[p..e])? {
            Frame::Msg(m) => {
                if m.value.len() >= 8 {
                    let ts = u64::from_le_bytes(m.value[..8].try_into().unwrap());
                    h.record(now.saturating_sub(ts));
                }
                got += 1;
                ack_of(&m).encode_frame(&mut c.out);
            }
            Frame::Notice(n) => Frame::ControlAck(control_ack(&n)).encode(&mut c.out),
            Frame::Ok(_) => {}
            Frame::Err(err) => eprintln!("mortar-bench: consumer: {}", broker_err(&err)),
            other => return Err(format!("unexpected {:?} while consuming", other.op())),
        }
    }
    Ok((h, got))
}

// ---- idle ---------------------------------------------------------------------------

/// Opens N connections, CONNECTs each, prints `ready N` and holds them (PINGing every
/// 20 s, within the broker's 45 s idle timeout) until the duration has passed.
fn idle(a: &Args) -> Res<Report> {
    let n = a.connections.unwrap_or(1000);
    let duration = a.duration.unwrap_or(Duration::from_secs(30));
    let mut connect = Vec::new();
    Frame::Connect(Connect {
        protocol_version: WIRE_VERSION,
        client_flags: 0,
        token: a.token.as_bytes(),
        reserved: 0,
    })
    .encode(&mut connect);
    let mut ping = Vec::new();
    Frame::Ping(Ping {}).encode(&mut ping);
    let t0 = Instant::now();
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n {
        let mut s = TcpStream::connect(&a.broker).map_err(|e| format!("connect: {e}"))?;
        s.write_all(&connect).map_err(io_err)?;
        socks.push(s);
    }
    let mut answer = [0u8; 64];
    for s in &mut socks {
        s.set_read_timeout(Some(IO_TIMEOUT)).map_err(io_err)?;
        let got = s.read(&mut answer).map_err(io_err)?;
        if got < 5 || answer[4] != Op::Ok as u8 {
            return Err("CONNECT not answered with OK".into());
        }
    }
    let setup = t0.elapsed().as_secs_f64();
    println!("ready {n}");
    io::stdout().flush().map_err(io_err)?;
    let end = Instant::now() + duration;
    let mut next_ping = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        thread::sleep(Duration::from_millis(100).min(end - Instant::now()));
        if Instant::now() >= next_ping {
            for s in &mut socks {
                s.write_all(&ping).map_err(io_err)?;
                s.read(&mut answer).map_err(io_err)?;
            }
            next_ping += Duration::from_secs(20);
        }
    }
    let mut r = Report::default();
    r.text("workload", "idle");
    r.int("connections", n as u64);
    r.num("connect_seconds", setup);
    Ok(r)
}

// ---- Redis streams consumer ---------------------------------------------------------

/// Appends a RESP command (an array of bulk strings).
fn resp(out: &mut Vec<u8>, args: &[&[u8]]) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        resp_bulk(out, a);
    }
}

fn resp_bulk(out: &mut Vec<u8>, a: &[u8]) {
    out.extend_from_slice(b"$");
    let num = itoa(a.len() as u64);
    out.extend_from_slice(num.as_slice());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(a);
    out.extend_from_slice(b"\r\n");
}

/// A small decimal formatter that does not allocate.
struct Digits {
    buf: [u8; 20],
    at: usize,
}

impl Digits {
    fn as_slice(&self) -> &[u8] {
        &self.buf[self.at..]
    }
}

fn itoa(mut v: u64) -> Digits {
    let mut d = Digits {
        buf: [0; 20],
        at: 20,
    };
    loop {
        d.at -= 1;
        d.buf[d.at] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            return d;
        }
    }
}

/// One RESP line starting at `i` (type byte included): (line, index after CRLF).
fn resp_line(b: &[u8], i: usize) -> Option<(&[u8], usize)> {
    let rest = b.get(i..)?;
    let at = rest.windows(2).position(|w| w == b"\r\n")?;
    Some((&rest[..at], i + at + 2))
}

fn resp_int(line: &[u8]) -> Res<i64> {
    std::str::from_utf8(&line[1..])
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad RESP length {}", String::from_utf8_lossy(line)))
}

/// Skips one complete value at `i`; `None` when more bytes are needed.
fn resp_skip(b: &[u8], i: usize) -> Res<Option<usize>> {
    let Some((line, mut next)) = resp_line(b, i) else {
        return Ok(None);
    };
    match line.first() {
        Some(b'+') | Some(b':') => Ok(Some(next)),
        Some(b'-') => Err(format!("redis: {}", String::from_utf8_lossy(line))),
        Some(b'$') => {
            let n = resp_int(line)?;
            if n < 0 {
                return Ok(Some(next));
            }
            let end = next + n as usize + 2;
            Ok((end <= b.len()).then_some(end))
        }
        Some(b'*') => {
            for _ in 0..resp_int(line)?.max(0) {
                match resp_skip(b, next)? {
                    Some(n) => next = n,
                    None => return Ok(None),
                }
            }
            Ok(Some(next))
        }
        _ => Err(format!("bad RESP: {}", String::from_utf8_lossy(line))),
    }
}

/// Parses an XREADGROUP reply at `i`, appending each entry id as a RESP bulk string to
/// `ids`. Returns (index after the reply, entries) or `None` when incomplete.
fn resp_read_ids(b: &[u8], i: usize, ids: &mut Vec<u8>) -> Res<Option<(usize, u64)>> {
    let mark = ids.len();
    let r = resp_read_ids_inner(b, i, ids);
    if !matches!(r, Ok(Some(_))) {
        ids.truncate(mark);
    }
    r
}

fn resp_read_ids_inner(b: &[u8], i: usize, ids: &mut Vec<u8>) -> Res<Option<(usize, u64)>> {
    macro_rules! line {
        ($at:expr) => {
            match resp_line(b, $at) {
                Some(l) => l,
                None => return Ok(None),
            }
        };
    }
    let (top, mut at) = line!(i);
    if top.first() == Some(&b'-') {
        return Err(format!("redis: {}", String::from_utf8_lossy(top)));
    }
    let streams = resp_int(top)?;
    let mut n = 0;
    for _ in 0..streams.max(0) {
        let (_, a) = line!(at); // [name, entries]
        let Some(a) = resp_skip(b, a)? else {
            return Ok(None);
        };
        let (entries, a) = line!(a);
        at = a;
        for _ in 0..resp_int(entries)?.max(0) {
            let (_, a) = line!(at); // [id, fields]
            let (id_len, a) = line!(a);
            let len = resp_int(id_len)? as usize;
            let Some(id) = b.get(a..a + len) else {
                return Ok(None);
            };
            resp_bulk(ids, id);
            let Some(a) = resp_skip(b, a + len + 2)? else {
                return Ok(None);
            };
            at = a;
            n += 1;
        }
    }
    Ok(Some((at, n)))
}

impl Conn {
    /// Reads one complete RESP value, fails on an error reply, returns its first line.
    fn resp_reply(&mut self) -> Res<String> {
        self.flush()?;
        loop {
            if let Some(end) = resp_skip(&self.buf[..self.end], self.start)? {
                let (line, _) = resp_line(&self.buf, self.start).unwrap_or((b"", 0));
                let line = String::from_utf8_lossy(line).into_owned();
                self.start = end;
                return Ok(line);
            }
            self.fill()?;
        }
    }
}

fn redis_consume(a: &Args) -> Res<Report> {
    let count = a.count.unwrap_or(100_000);
    let key = a.topic("bench");
    let key = key.as_bytes();
    let mut c = Conn::open(&a.broker)?;
    // Prefill with pipelined XADDs when the stream is shorter than `count`.
    resp(&mut c.out, &[b"XLEN", key]);
    let have = resp_int(c.resp_reply()?.as_bytes())? as u64;
    let missing = count.saturating_sub(have);
    let value = vec![b'x'; a.value_size];
    let mut added = 0;
    while added < missing {
        let batch = (missing - added).min(256);
        for _ in 0..batch {
            resp(&mut c.out, &[b"XADD", key, b"*", b"f", &value]);
        }
        for _ in 0..batch {
            c.resp_reply()?;
        }
        added += batch;
    }
    let group = unique_group("redis");
    let group = group.as_bytes();
    resp(&mut c.out, &[b"XGROUP", b"CREATE", key, group, b"0"]);
    c.resp_reply()?;
    let cpu0 = cpu_seconds();
    let t0 = Instant::now();
    let mut ids: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut pending = 0u64;
    let mut got = 0u64;
    loop {
        if pending > 0 {
            let head = itoa(pending + 3);
            c.out.extend_from_slice(b"*");
            c.out.extend_from_slice(head.as_slice());
            c.out.extend_from_slice(b"\r\n");
            resp_bulk(&mut c.out, b"XACK");
            resp_bulk(&mut c.out, key);
            resp_bulk(&mut c.out, group);
            c.out.extend_from_slice(&ids);
            ids.clear();
        }
        let acking = std::mem::take(&mut pending);
        if got >= count {
            if acking > 0 {
                c.resp_reply()?;
            }
            break;
        }
        let want = itoa((count - got).min(u64::from(a.credit)));
        let read: [&[u8]; 9] = [
            b"XREADGROUP",
            b"GROUP",
            group,
            b"c",
            b"COUNT",
            want.as_slice(),
            b"STREAMS",
            key,
            b">",
        ];
        resp(&mut c.out, &read);
        if acking > 0 {
            let line = c.resp_reply()?;
            if resp_int(line.as_bytes())? as u64 != acking {
                return Err(format!("XACK settled {line}, not {acking}"));
            }
        }
        c.flush()?;
        loop {
            if let Some((end, n)) = resp_read_ids(&c.buf[..c.end], c.start, &mut ids)? {
                c.start = end;
                pending = n;
                break;
            }
            c.fill()?;
        }
        if pending == 0 {
            return Err(format!("the stream ran dry after {got} entries"));
        }
        got += pending;
    }
    let secs = t0.elapsed().as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let mut r = Report::default();
    r.text("workload", "redis-consume");
    r.int("count_per_read", u64::from(a.credit));
    r.int("prefilled", missing);
    r.int("msgs", got);
    r.num("seconds", secs);
    r.num("msgs_per_sec", got as f64 / secs);
    r.num("tool_cpu_pct", cpu / secs * 100.0);
    Ok(r)
}
