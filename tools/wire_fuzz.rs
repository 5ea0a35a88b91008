//! `mortar-wire-fuzz`: a live wire fuzzer against a running `mortard` (issue 8).
//!
//! For `--duration`, `--connections` threads each open connection after connection and
//! send: golden frames (`--golden-dir`, parsed here: byte lines are hex pairs before `#`
//! and `repeat 0xAB N` lines; transcripts skipped), mutated golden frames (bit flips,
//! truncations, lies in the length field, swapped op bytes, splices), valid frames split
//! at random across several writes, and random garbage — about half of the connections
//! after a valid CONNECT. Whatever the broker answers is read and dropped.
//!
//! Mixed in, one connection in ten is honest: CONNECT, then batches of pipelined PINGs
//! and PUBs whose answers must come exactly once each, in request order (PUB sequences
//! increasing). Meanwhile a bystander client pings and publishes in a loop: it must
//! see no error and no stall (a request slower than `STALL`), and its latencies are
//! reported. At the end the broker must still answer PING (and `/healthz` with
//! `--admin`). Exit status 1 on any violation, 2 on a usage error.

use mortarmq::config::parse_duration;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use getopts::Options;
use mortarmq::client::{Client, ClientError};
use mortarmq::wire::ops::*;
use mortarmq::wire::{DeclareFlags, Durability, ErrorCode, PubFlags};

/// A bystander request slower than this is a stall.
const STALL: Duration = Duration::from_secs(3);
/// Golden vectors bigger than this are not sent (the 16 MiB ones).
const VECTOR_BYTES_MAX: usize = 256 * 1024;
/// Fuzz inputs sent on one connection before it is closed and another opened, at most.
const INPUTS_PER_CONN_MAX: u64 = 40;
/// Honest batches: this many pipelined requests at most.
const HONEST_BATCH_MAX: u64 = 40;
const IO_TIMEOUT: Duration = Duration::from_secs(10);

struct Opts {
    broker: SocketAddr,
    admin: Option<SocketAddr>,
    connections: u64,
    duration: Duration,
    seed: u64,
    golden_dir: PathBuf,
}

/// xorshift64*: deterministic per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// 0..n (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

fn parse_opts() -> Result<Opts, String> {
    let mut o = Options::new();
    o.optopt("", "broker", "mortard client listener (required)", "ADDR");
    o.optopt(
        "",
        "admin",
        "admin listener, for /healthz at the end",
        "ADDR",
    );
    o.optopt(
        "",
        "connections",
        "fuzzing connections at once (default 50)",
        "N",
    );
    o.optopt("", "duration", "how long to fuzz (default 10s)", "DUR");
    o.optopt("", "seed", "random seed (default: from the clock)", "N");
    o.optopt("", "golden-dir", "golden vectors (default golden/)", "DIR");
    o.optflag("h", "help", "this text");
    let m = o
        .parse(std::env::args().skip(1))
        .map_err(|e| e.to_string())?;
    if m.opt_present("help") {
        print!(
            "{}",
            o.usage("Usage: mortar-wire-fuzz --broker ADDR [options]")
        );
        std::process::exit(0);
    }
    let addr = |name: &str| -> Result<Option<SocketAddr>, String> {
        m.opt_str(name)
            .map(|v| v.parse().map_err(|e| format!("--{name} {v}: {e}")))
            .transpose()
    };
    let clock = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let num = |name: &str, default: u64| -> Result<u64, String> {
        m.opt_str(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v}"))
        })
    };
    Ok(Opts {
        broker: addr("broker")?.ok_or("--broker ADDR is required")?,
        admin: addr("admin")?,
        connections: num("connections", 50)?.max(1),
        duration: parse_duration(&m.opt_str("duration").unwrap_or_else(|| "10s".into()))?,
        seed: num("seed", clock)?,
        golden_dir: PathBuf::from(m.opt_str("golden-dir").unwrap_or_else(|| "golden".into())),
    })
}

// ---- the seed corpus ------------------------------------------------------------------

/// The bytes of one golden file, or None for a transcript. Minimal parser: a byte line
/// is hex pairs before `#` (spaces allowed) or `repeat 0xAB N`; `@` lines are directives.
fn parse_golden(text: &str) -> Result<Option<Vec<u8>>, String> {
    let mut bytes = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.starts_with("@kind transcript") {
            return Ok(None);
        }
        if line.is_empty() || line.starts_with('@') {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what}: {line}", n + 1);
        if let Some(rest) = line.strip_prefix("repeat") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let [b, count] = words[..] else {
                return Err(bad("expected `repeat 0xAB N`"));
            };
            let b = u8::from_str_radix(b.trim_start_matches("0x"), 16).map_err(|_| bad("byte"))?;
            let count: usize = count.parse().map_err(|_| bad("count"))?;
            bytes.extend(std::iter::repeat_n(b, count));
            continue;
        }
        let hex: String = line.chars().filter(|c| !c.is_whitespace()).collect();
        if !hex.len().is_multiple_of(2) {
            return Err(bad("odd number of hex digits"));
        }
        for i in (0..hex.len()).step_by(2) {
            let b = u8::from_str_radix(&hex[i..i + 2], 16).map_err(|_| bad("not hex"))?;
            bytes.push(b);
        }
    }
    Ok(Some(bytes))
}

/// Golden vectors: (file name, bytes).
type Corpus = Vec<(String, Vec<u8>)>;

/// Every usable vector, and how many files were skipped.
fn load_corpus(dir: &Path) -> Result<(Corpus, usize), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut names: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "hex"))
        .collect();
    names.sort();
    let mut corpus = Vec::new();
    let mut skipped = 0;
    for path in names {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{name}: {e}"))?;
        match parse_golden(&text).map_err(|e| format!("{name}: {e}"))? {
            Some(b) if !b.is_empty() && b.len() <= VECTOR_BYTES_MAX => corpus.push((name, b)),
            _ => skipped += 1,
        }
    }
    if corpus.is_empty() {
        return Err(format!("no golden vectors in {}", dir.display()));
    }
    Ok((corpus, skipped))
}

// ---- fuzzing connections --------------------------------------------------------------

#[derive(Default)]
struct Figures {
    inputs: AtomicU64,
    frames: AtomicU64,
    bytes: AtomicU64,
    connections: AtomicU64,
    closed_by_broker: AtomicU64,
    honest_batches: AtomicU64,
    honest_requests: AtomicU64,
    honest_backpressure: AtomicU64,
}

struct Shared {
    opts: Opts,
    corpus: Vec<(String, Vec<u8>)>,
    connect_frame: Vec<u8>,
    topic: u16,
    deadline: Instant,
    figures: Figures,
    violations: Mutex<Vec<String>>,
}

impl Shared {
    fn violation(&self, what: String) {
        eprintln!("VIOLATION: {what}");
        self.violations.lock().unwrap().push(what);
    }
}

/// One fuzz input: the writes to make (a valid frame split at random is several).
fn fuzz_input(rng: &mut Rng, corpus: &[(String, Vec<u8>)]) -> (&'static str, Vec<Vec<u8>>) {
    let pick = |rng: &mut Rng| corpus[rng.below(corpus.len() as u64) as usize].1.clone();
    let mut b = pick(rng);
    let kind = match rng.below(8) {
        0 => "golden",
        1 => {
            for _ in 0..=rng.below(4) {
                let bit = rng.below(b.len() as u64 * 8);
                b[(bit / 8) as usize] ^= 1 << (bit % 8);
            }
            "bit flips"
        }
        2 => {
            b.truncate(rng.below(b.len() as u64) as usize);
            "truncated"
        }
        3 if b.len() >= 4 => {
            let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
            let lie = match rng.below(7) {
                0 => 0,
                1 => len.saturating_sub(1),
                2 => len + 1,
                3 => 65_537,
                4 => 16 * 1024 * 1024 + 1,
                5 => u32::MAX,
                _ => rng.next() as u32 % (1 << 20),
            };
            b[..4].copy_from_slice(&lie.to_be_bytes());
            "length lie"
        }
        4 if b.len() >= 5 => {
            b[4] = rng.next() as u8;
            "op swapped"
        }
        5 => {
            let other = pick(rng);
            let cut = rng.below(other.len() as u64) as usize;
            b.extend_from_slice(&other[cut..]);
            "spliced"
        }
        6 => {
            // A valid frame across several writes.
            let mut writes = Vec::new();
            let mut rest = &b[..];
            while !rest.is_empty() {
                let n = 1 + rng.below(rest.len().min(16) as u64) as usize;
                writes.push(rest[..n].to_vec());
                rest = &rest[n..];
            }
            return ("split", writes);
        }
        _ => {
            let n = 1 + rng.below(512) as usize;
            b = rng.bytes(n);
            "garbage"
        }
    };
    (kind, vec![b])
}

/// Reads and drops whatever the broker sent; false once it closed the connection.
fn drain(s: &mut TcpStream, buf: &mut [u8]) -> bool {
    loop {
        match s.read(buf) {
            Ok(0) => return false,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return true,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return false,
        }
    }
}

fn fuzz_worker(shared: Arc<Shared>, seed: u64) {
    let mut rng = Rng::new(seed);
    let mut buf = vec![0u8; 64 * 1024];
    let f = &shared.figures;
    while Instant::now() < shared.deadline {
        let Ok(mut s) = TcpStream::connect(shared.opts.broker) else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        f.connections.fetch_add(1, Ordering::Relaxed);
        let _ = s.set_write_timeout(Some(Duration::from_secs(2)));
        let _ = s.set_nodelay(true);
        let _ = s.set_nonblocking(false);
        let mut open = true;
        if rng.chance(50) {
            open = s.write_all(&shared.connect_frame).is_ok();
        }
        let _ = s.set_nonblocking(true);
        let inputs = 1 + rng.below(INPUTS_PER_CONN_MAX);
        for _ in 0..inputs {
            if !open || Instant::now() >= shared.deadline {
                break;
            }
            let (_kind, writes) = fuzz_input(&mut rng, &shared.corpus);
            f.inputs.fetch_add(1, Ordering::Relaxed);
            f.frames.fetch_add(1, Ordering::Relaxed);
            for w in &writes {
                if write_all_nonblocking(&mut s, w, &mut buf).is_err() {
                    open = false;
                    break;
                }
                f.bytes.fetch_add(w.len() as u64, Ordering::Relaxed);
                if writes.len() > 1 && rng.chance(20) {
                    std::thread::sleep(Duration::from_millis(rng.below(3)));
                }
            }
            if open && !drain(&mut s, &mut buf) {
                open = false;
            }
        }
        if !open {
            f.closed_by_broker.fetch_add(1, Ordering::Relaxed);
        }
        // Sometimes linger with a half frame, sometimes close at once.
        if open && rng.chance(10) {
            std::thread::sleep(Duration::from_millis(rng.below(200)));
        }
    }
}

/// write_all on a nonblocking socket, draining answers while the broker is busy.
fn write_all_nonblocking(s: &mut TcpStream, mut w: &[u8], buf: &mut [u8]) -> std::io::Result<()> {
    let started = Instant::now();
    while !w.is_empty() {
        match s.write(w) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => w = &w[n..],
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                // The broker paused reading us (backpressure) or is slow: read, retry.
                if !drain(s, buf) || started.elapsed() > Duration::from_secs(2) {
                    return Err(ErrorKind::TimedOut.into());
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

// ---- honest connections and the bystander ---------------------------------------------

/// Pipelined PINGs and PUBs after CONNECT; every answer once, in order.
fn honest_worker(shared: Arc<Shared>, index: u64, seed: u64) {
    let mut rng = Rng::new(seed);
    let f = &shared.figures;
    let partition = (index % 4) as u16;
    while Instant::now() < shared.deadline {
        let mut c = match Client::connect(shared.opts.broker, b"") {
            Ok(c) => c,
            Err(e) => {
                shared.violation(format!("honest {index}: CONNECT failed: {e}"));
                return;
            }
        };
        f.connections.fetch_add(1, Ordering::Relaxed);
        let _ = c.set_read_timeout(Some(IO_TIMEOUT));
        let mut last_seq = 0u64;
        for _ in 0..1 + rng.below(10) {
            if Instant::now() >= shared.deadline {
                break;
            }
            let n = 1 + rng.below(HONEST_BATCH_MAX);
            let mut sent = Vec::new();
            for i in 0..n {
                if rng.chance(50) {
                    c.queue(&Frame::Ping(Ping {}));
                    sent.push(Op::Ping as u8);
                } else {
                    let value = format!("honest {index} {i}");
                    c.queue(&Frame::Pub(Pub {
                        topic_id: shared.topic,
                        partition,
                        flags: PubFlags::requesting(Some(Durability::Written)),
                        value: value.as_bytes(),
                        ..Pub::default()
                    }));
                    sent.push(Op::Pub as u8);
                }
            }
            if let Err(e) = c.flush() {
                shared.violation(format!("honest {index}: write failed: {e}"));
                return;
            }
            for (i, &op) in sent.iter().enumerate() {
                match c.recv_reply() {
                    Ok(r) if r.request_op != op => {
                        shared.violation(format!(
                            "honest {index}: answer {i} is for op 0x{:02X}, sent 0x{op:02X}",
                            r.request_op
                        ));
                        return;
                    }
                    Ok(r) if op == Op::Pub as u8 => match r.typed::<PubResult>() {
                        Ok(p) if p.sequence > last_seq => last_seq = p.sequence,
                        other => {
                            shared.violation(format!(
                                "honest {index}: PUB answer {other:?} after sequence {last_seq}"
                            ));
                            return;
                        }
                    },
                    Ok(_) => {}
                    Err(ClientError::Broker {
                        code, request_op, ..
                    }) if request_op == op
                        && matches!(
                            ErrorCode::from_code(code),
                            Some(ErrorCode::Backpressure | ErrorCode::MemoryLimit)
                        ) =>
                    {
                        f.honest_backpressure.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        shared.violation(format!("honest {index}: answer {i} of {n}: {e}"));
                        return;
                    }
                }
                f.honest_requests.fetch_add(1, Ordering::Relaxed);
            }
            f.honest_batches.fetch_add(1, Ordering::Relaxed);
        }
        // Nothing extra was answered: the next answer is this PING's.
        match c.request(&Frame::Ping(Ping {})) {
            Ok(r) if r.request_op == Op::Ping as u8 => {}
            other => shared.violation(format!("honest {index}: closing PING got {other:?}")),
        }
    }
}

struct Latencies {
    pings: Vec<Duration>,
    pubs: Vec<Duration>,
    errors: Vec<String>,
}

fn bystander(shared: Arc<Shared>) -> Latencies {
    let mut l = Latencies {
        pings: Vec::new(),
        pubs: Vec::new(),
        errors: Vec::new(),
    };
    let mut c = match Client::connect(shared.opts.broker, b"") {
        Ok(c) => c,
        Err(e) => {
            l.errors.push(format!("CONNECT: {e}"));
            return l;
        }
    };
    let _ = c.set_read_timeout(Some(IO_TIMEOUT));
    let mut i = 0u64;
    while Instant::now() < shared.deadline {
        let t = Instant::now();
        if let Err(e) = c.ping() {
            l.errors.push(format!("PING: {e}"));
            return l;
        }
        l.pings.push(t.elapsed());
        let t = Instant::now();
        let value = format!("bystander {i}");
        i += 1;
        if let Err(e) =
            c.publish_value(shared.topic, 0, value.as_bytes(), Some(Durability::Written))
        {
            l.errors.push(format!("PUB: {e}"));
            return l;
        }
        l.pubs.push(t.elapsed());
        std::thread::sleep(Duration::from_millis(2));
    }
    l
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    if v.is_empty() {
        return Duration::ZERO;
    }
    v.sort();
    let i = ((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1;
    v[i]
}

fn healthz(admin: SocketAddr) -> Result<u16, String> {
    let mut s = TcpStream::connect(admin).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    write!(
        s,
        "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    text.split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no status in {text:?}"))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn run(opts: Opts) -> Result<bool, String> {
    let (corpus, skipped) = load_corpus(&opts.golden_dir)?;
    let mut connect_frame = Vec::new();
    Frame::Connect(Connect {
        protocol_version: 1,
        client_flags: 0,
        token: b"",
        reserved: 0,
    })
    .encode(&mut connect_frame);
    let topic = Client::connect(opts.broker, b"")
        .and_then(|mut c| c.declare("fuzz", 4, DeclareFlags::empty()))
        .map_err(|e| format!("cannot DECLARE on {}: {e}", opts.broker))?
        .topic_id;
    println!(
        "wire-fuzz: {} for {:?} with {} connections, seed {}, {} golden vectors ({} skipped)",
        opts.broker,
        opts.duration,
        opts.connections,
        opts.seed,
        corpus.len(),
        skipped
    );
    let shared = Arc::new(Shared {
        deadline: Instant::now() + opts.duration,
        corpus,
        connect_frame,
        topic,
        figures: Figures::default(),
        violations: Mutex::new(Vec::new()),
        opts,
    });
    let seed = shared.opts.seed;
    let honest = (shared.opts.connections / 10).max(2);
    let mut workers = Vec::new();
    for i in 0..shared.opts.connections {
        let s = Arc::clone(&shared);
        let worker_seed = seed ^ (i + 1).wrapping_mul(0xD1B5_4A32_D192_ED03);
        workers.push(std::thread::spawn(move || {
            if i < honest {
                honest_worker(s, i, worker_seed)
            } else {
                fuzz_worker(s, worker_seed)
            }
        }));
    }
    let s = Arc::clone(&shared);
    let by = std::thread::spawn(move || bystander(s));
    for w in workers {
        if w.join().is_err() {
            shared.violation("a fuzz thread panicked".into());
        }
    }
    let mut l = by
        .join()
        .map_err(|_| "the bystander panicked".to_string())?;

    // The broker is alive and still answers.
    let alive = Client::connect(shared.opts.broker, b"").and_then(|mut c| {
        c.set_read_timeout(Some(IO_TIMEOUT))?;
        c.ping()
    });
    if let Err(e) = &alive {
        shared.violation(format!("broker not alive after fuzzing: PING: {e}"));
    }
    let health = shared.opts.admin.map(healthz);
    match &health {
        Some(Ok(200)) | None => {}
        Some(other) => shared.violation(format!("/healthz after fuzzing: {other:?}")),
    }

    let f = &shared.figures;
    let ping_max = l.pings.iter().max().copied().unwrap_or_default();
    let pub_max = l.pubs.iter().max().copied().unwrap_or_default();
    let (ping_p99, pub_p99) = (
        percentile(&mut l.pings, 0.99),
        percentile(&mut l.pubs, 0.99),
    );
    for e in &l.errors {
        shared.violation(format!("bystander: {e}"));
    }
    if ping_max > STALL || pub_max > STALL {
        shared.violation(format!(
            "bystander stalled: max PING {ping_max:?}, PUB {pub_max:?}"
        ));
    }
    println!(
        "wire-fuzz: sent {} fuzz inputs ({} bytes) on {} connections ({} closed by the \
         broker); honest: {} pipelined batches, {} requests answered once and in order \
         ({} BACKPRESSURE/MEMORY_LIMIT)",
        f.frames.load(Ordering::Relaxed),
        f.bytes.load(Ordering::Relaxed),
        f.connections.load(Ordering::Relaxed),
        f.closed_by_broker.load(Ordering::Relaxed),
        f.honest_batches.load(Ordering::Relaxed),
        f.honest_requests.load(Ordering::Relaxed),
        f.honest_backpressure.load(Ordering::Relaxed),
    );
    println!(
        "wire-fuzz: bystander {} PINGs p99 {:.2} ms max {:.2} ms, {} PUBs p99 {:.2} ms \
         max {:.2} ms, errors {}; broker alive: {}; /healthz: {}",
        l.pings.len(),
        ms(ping_p99),
        ms(ping_max),
        l.pubs.len(),
        ms(pub_p99),
        ms(pub_max),
        l.errors.len(),
        alive.is_ok(),
        match health {
            None => "not checked".to_string(),
            Some(Ok(code)) => code.to_string(),
            Some(Err(e)) => e,
        }
    );
    let violations = shared.violations.lock().unwrap();
    for v in violations.iter() {
        println!("wire-fuzz: VIOLATION {v}");
    }
    println!(
        "wire-fuzz: {}",
        if violations.is_empty() {
            "OK"
        } else {
            "FAILED"
        }
    );
    Ok(violations.is_empty())
}

fn main() -> ExitCode {
    let opts = match parse_opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mortar-wire-fuzz: {e}");
            return ExitCode::from(2);
        }
    };
    match run(opts) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("mortar-wire-fuzz: {e}");
            ExitCode::from(1)
        }
    }
}
