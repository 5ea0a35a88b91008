//! The commands that speak the wire protocol: `topics create|delete`, `ping`, `pub`
//! and `sub` (the last two through the client library).

use std::collections::VecDeque;
use std::io::{self, IsTerminal, Read, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use getopts::Matches;
use mortarmq::client::{
    Consumer, Error as ApiError, Message, Producer, Record, SendHandle, DEFAULT_RECONNECT_TIMEOUT,
};
use mortarmq::config::parse_duration;
use mortarmq::wire::limits::KEEPALIVE_MS;
use mortarmq::wire::{DeclareCreated, DeclareFlags, Durability, ErrorCode, StartPolicy};

use crate::{check_name, runtime_err, usage_err, Ctx, Failure, Outcome};

/// How often the `pub` progress line is redrawn, and how long `pub` runs before it shows.
pub(crate) const PROGRESS_EVERY: Duration = Duration::from_millis(250);
pub(crate) const PROGRESS_AFTER: Duration = Duration::from_secs(1);

/// `pub --keepalive` unless given: the protocol's keepalive, which the broker's default
/// `--idle-timeout` (1.5 times it) allows.
pub(crate) const KEEPALIVE_DEFAULT: Duration = Duration::from_millis(KEEPALIVE_MS);

/// Most records a bounded `sub --count` asks credit for at once (the broker's default).
pub(crate) const SUB_CREDIT_MAX: u64 = 256;

/// `pub` reads standard input this much at a time, at most this many reads ahead of
/// what it has sent.
pub(crate) const STDIN_BUFFER_BYTES: usize = 64 * 1024;
pub(crate) const STDIN_CHUNKS_QUEUED_MAX: usize = 4;

pub(crate) fn parse_num<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, Failure> {
    text.parse()
        .or_else(|_| usage_err(format!("--{flag}: '{text}' is not a valid number")))
}

pub(crate) fn cmd_topics_create(ctx: &Ctx) -> Outcome {
    let name = ctx.topic()?;
    let partitions = ctx.matches.opt_str("partitions").unwrap_or_default();
    let partitions: u16 = parse_num("partitions", &partitions)?;
    let mut c = ctx.connect()?;
    let r = c.declare(name, partitions, DeclareFlags::empty())?;
    let n = r.partition_count;
    if DeclareCreated::from_code(r.created) == Some(DeclareCreated::Created) {
        let id = r.topic_id;
        println!("created topic {name} (id {id}, {n} partitions; dead letters go to {name}.dlq)");
    } else {
        println!(
            "topic {name} already exists (id {}, {n} partitions)",
            r.topic_id
        );
    }
    Ok(())
}

pub(crate) fn cmd_topics_delete(ctx: &Ctx) -> Outcome {
    let name = ctx.topic()?;
    let mut flags = DeclareFlags::DELETE;
    flags.set(
        DeclareFlags::IF_UNUSED,
        ctx.matches.opt_present("if-unused"),
    );
    let mut c = ctx.connect()?;
    c.declare(name, 0, flags)?;
    println!("deleted topic {name} and {name}.dlq");
    Ok(())
}

pub(crate) fn cmd_ping(ctx: &Ctx) -> Outcome {
    let started = Instant::now();
    let mut c = ctx.connect()?;
    let connected = started.elapsed();
    let t = Instant::now();
    c.ping()?;
    println!(
        "pong from {} in {:?} (connect {:?})",
        ctx.broker,
        t.elapsed(),
        connected
    );
    Ok(())
}

/// Redraws one status line on stderr, only when stderr is a terminal.
pub(crate) struct Progress {
    enabled: bool,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress {
            enabled: enabled && io::stderr().is_terminal(),
            started: Instant::now(),
            drawn: None,
        }
    }

    fn update(&mut self, acked: u64) {
        if !self.enabled || self.started.elapsed() < PROGRESS_AFTER {
            return;
        }
        if self.drawn.is_some_and(|d| d.elapsed() < PROGRESS_EVERY) {
            return;
        }
        let rate = acked as f64 / self.started.elapsed().as_secs_f64();
        eprint!("\r\x1b[Kpublished {acked} records, {rate:.0} records/s");
        self.drawn = Some(Instant::now());
    }

    fn finish(&self) {
        if self.drawn.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}

/// The one way a publishing `mortarctl` stops early: the broker's (or the
/// connection's) error, with how far it got.
pub(crate) fn pub_failed(e: ApiError, acked: u64) -> Failure {
    let (what, hint) = crate::hints::api_error(&e);
    Failure::Runtime(format!(
        "{what} (after {acked} records were published){hint}"
    ))
}

/// An error about `topic`, which names it.
fn topic_failed(topic: &str, e: &ApiError) -> Failure {
    let (what, hint) = crate::hints::api_error(e);
    Failure::Runtime(format!("topic {topic}: {what}{hint}"))
}

/// What each `pub` record carries besides its value.
pub(crate) struct PubTarget<'a> {
    topic: &'a str,
    key: &'a [u8],
    partition: Option<u16>,
}

impl<'a> PubTarget<'a> {
    fn record(&self, value: &'a [u8]) -> Record<'a> {
        Record {
            topic: self.topic,
            key: self.key,
            value,
            partition: self.partition,
            durability: None,
        }
    }
}

pub(crate) fn cmd_pub(ctx: &Ctx) -> Outcome {
    let m = &ctx.matches;
    let topic = ctx.topic()?;
    let partition = match m.opt_str("partition") {
        Some(p) => Some(parse_num::<u16>("partition", &p)?),
        None => None,
    };
    let durability = match m.opt_str("durability").as_deref() {
        None => None,
        Some(name) => match Durability::from_flag_name(name) {
            Some(d @ (Durability::Written | Durability::Fsynced)) => Some(d),
            _ => return usage_err(format!("--durability: '{name}' is not written|fsync")),
        },
    };
    let keepalive = match m.opt_str("keepalive") {
        None => KEEPALIVE_DEFAULT,
        Some(text) => match parse_duration(&text) {
            Ok(d) if !d.is_zero() => d,
            Ok(_) => return usage_err("--keepalive: 0s would PING without end"),
            Err(why) => return usage_err(format!("--keepalive: {why}")),
        },
    };
    let mut producer = ctx.producer(durability, keepalive)?;
    producer.topic(topic).map_err(|e| topic_failed(topic, &e))?;
    let key = m.opt_str("key").unwrap_or_default().into_bytes();
    let target = PubTarget {
        topic,
        key: &key,
        partition,
    };
    if let Some(value) = m.opt_str("value") {
        let r = producer
            .publish_record(target.record(value.as_bytes()))
            .map_err(|e| pub_failed(e, 0))?;
        let reached = match r.durability {
            Durability::Written => "written",
            Durability::Fsynced => "fsynced",
            Durability::Replicated => "replicated",
        };
        println!(
            "published to {topic} partition {} at sequence {} ({reached})",
            r.partition, r.sequence
        );
        return producer.close().map_err(|e| pub_failed(e, 1));
    }
    let mut progress = Progress::new(true);
    let sent = pub_lines(&mut producer, &target, &mut progress, keepalive);
    progress.finish();
    let acked = sent?;
    println!("published {acked} records to {topic}");
    Ok(())
}

/// Records sent by `pub`, counted as their answers come, in order.
pub(crate) struct Tally<'a> {
    handles: VecDeque<SendHandle>,
    acked: u64,
    progress: &'a mut Progress,
}

impl Tally<'_> {
    /// Counts the records answered so far; the first failure ends the run.
    fn settle(&mut self) -> Result<u64, Failure> {
        while let Some(outcome) = self.handles.front().and_then(SendHandle::result) {
            outcome.map_err(|e| pub_failed(e, self.acked))?;
            self.handles.pop_front();
            self.acked += 1;
        }
        self.progress.update(self.acked);
        Ok(self.acked)
    }
}

/// Standard input as a reader thread hands it over: chunks of what one read returned,
/// an empty one at the end. A thread, so that `pub` can PING while its input is quiet
/// (`tail -f app.log | mortarctl pub logs`).
pub(crate) fn stdin_chunks() -> mpsc::Receiver<io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::sync_channel(STDIN_CHUNKS_QUEUED_MAX);
    std::thread::spawn(move || {
        let mut input = io::stdin().lock();
        loop {
            let mut chunk = vec![0; STDIN_BUFFER_BYTES];
            let got = match input.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(n) => Ok(n),
                Err(e) => Err(e),
            };
            let last = !matches!(got, Ok(n) if n > 0);
            let sent = tx.send(got.map(|n| {
                chunk.truncate(n);
                chunk
            }));
            if last || sent.is_err() {
                return;
            }
        }
    });
    rx
}

/// The next chunk of standard input; while none comes, the producer's records are
/// written, and after `keepalive` their answers counted and the connection kept alive.
fn next_chunk(
    input: &mpsc::Receiver<io::Result<Vec<u8>>>,
    p: &mut Producer,
    tally: &mut Tally<'_>,
    keepalive: Duration,
) -> Result<Vec<u8>, Failure> {
    let mut wait = match input.try_recv() {
        Ok(chunk) => return chunk.or_else(|e| runtime_err(format!("standard input: {e}"))),
        Err(_) => {
            // Send what is queued before a wait that could be long. The answers are
            // left to the next record, or to the keep-alive once input stays quiet:
            // waiting for them here would stop the pipeline whenever input lags.
            p.send_queued();
            keepalive
        }
    };
    loop {
        match input.recv_timeout(wait) {
            Ok(chunk) => return chunk.or_else(|e| runtime_err(format!("standard input: {e}"))),
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(Vec::new()),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        wait = p.keep_alive().map_err(|e| pub_failed(e, tally.acked))?;
        tally.settle()?;
    }
}

/// Publishes one record per line of standard input (PUB_WINDOW in flight); returns
/// how many the broker stored. A last line without its newline is a record too.
pub(crate) fn pub_lines(
    p: &mut Producer,
    target: &PubTarget<'_>,
    progress: &mut Progress,
    keepalive: Duration,
) -> Result<u64, Failure> {
    let input = stdin_chunks();
    // The start of a line whose end is in a later chunk.
    let mut partial = Vec::new();
    let mut tally = Tally {
        handles: VecDeque::new(),
        acked: 0,
        progress,
    };
    let send = |p: &mut Producer, tally: &mut Tally<'_>, line: &[u8]| {
        let sent = p.send_record(target.record(line));
        let handle = sent.map_err(|e| pub_failed(e, tally.acked))?;
        tally.handles.push_back(handle);
        tally.settle()
    };
    loop {
        let chunk = next_chunk(&input, p, &mut tally, keepalive)?;
        if chunk.is_empty() {
            break;
        }
        let mut lines = chunk.split(|b| *b == b'\n');
        let last = lines.next_back().unwrap_or_default();
        for (i, line) in lines.enumerate() {
            if i == 0 && !partial.is_empty() {
                partial.extend_from_slice(line);
                send(p, &mut tally, &partial)?;
                partial.clear();
            } else {
                send(p, &mut tally, line)?;
            }
        }
        partial.extend_from_slice(last);
    }
    if !partial.is_empty() {
        send(p, &mut tally, &partial)?;
    }
    let flushed = p.flush();
    let acked = tally.settle()?;
    flushed.map_err(|e| pub_failed(e, acked))?;
    Ok(acked)
}

pub(crate) fn print_record(out: &mut impl Write, m: &Message, meta: bool) -> io::Result<()> {
    if meta {
        let key = String::from_utf8_lossy(&m.key);
        write!(
            out,
            "{}\t{}\t{}\t{key}\t",
            m.partition, m.sequence, m.attempt
        )?;
    }
    out.write_all(&m.value)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// A bounded `sub` pulls, and the library pulls (with the window as its size) only once
/// every record delivered so far has been handed out: a window no wider than the records
/// still wanted, set before the next poll, keeps the broker from sending more than
/// `--count` in all. Records sent past it would go back to the group as redeliveries,
/// spending an attempt each. 0 left: nothing more is polled.
pub(crate) fn narrow_credit(consumer: &mut Consumer, window: &mut u16, left: u64) -> Outcome {
    if left > 0 && left < u64::from(*window) {
        *window = consumer.set_credit(left as u16, 0)?.granted_count;
    }
    Ok(())
}

/// How long `sub` rejoins a broker that went away before it gives up: a `sub` without
/// `--count` follows the topic like `tail -f` and outlives any restart; a bounded one
/// (a script's) fails as the library does by default.
fn reconnect_timeout(m: &Matches, count: Option<u64>) -> Result<Option<Duration>, Failure> {
    match m.opt_str("reconnect-timeout") {
        Some(text) => match parse_duration(&text) {
            Ok(d) => Ok(Some(d)),
            Err(why) => usage_err(format!("--reconnect-timeout: {why}")),
        },
        None => Ok(count.map(|_| DEFAULT_RECONNECT_TIMEOUT)),
    }
}

pub(crate) fn cmd_sub(ctx: &Ctx) -> Outcome {
    let m = &ctx.matches;
    let topic = ctx.topic()?;
    let group = m.opt_str("group").unwrap_or_default();
    check_name("--group", "group", &group)?;
    let start_policy = match m.opt_str("from").as_deref() {
        None | Some("earliest") => StartPolicy::Earliest,
        Some("latest") => StartPolicy::Latest,
        Some(other) => return usage_err(format!("--from: '{other}' is not earliest|latest")),
    };
    let count = match m.opt_str("count") {
        Some(n) => Some(parse_num::<u64>("count", &n)?),
        None => None,
    };
    let meta = m.opt_present("meta");
    let credit = count.map_or(0, |n| n.clamp(1, SUB_CREDIT_MAX) as u16);
    let mut consumer = ctx.consumer(credit, count.is_some(), reconnect_timeout(m, count)?)?;
    consumer
        .subscribe(&group, topic, start_policy)
        .map_err(|e| match e.code() {
            Some(ErrorCode::UnknownTopic) => topic_failed(topic, &e),
            _ => e.into(),
        })?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut printed = 0u64;
    let mut window = credit;
    while count.is_none_or(|n| printed < n) {
        let Some(m) = consumer.poll(None)? else {
            break;
        };
        match print_record(&mut out, &m, meta) {
            Ok(()) => {}
            // Left unacknowledged: the broker delivers it again to the group.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return runtime_err(format!("standard output: {e}")),
        }
        m.ack();
        printed += 1;
        if let Some(n) = count {
            narrow_credit(&mut consumer, &mut window, n - printed)?;
        }
    }
    // Answers awaited, then HEARTBEAT LEAVE: the group rebalances now rather than after
    // --session-timeout. Records read past --count go back to the group unacknowledged.
    Ok(consumer.close()?)
}
