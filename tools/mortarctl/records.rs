//! The commands that read records without consuming them, over the admin records
//! endpoint (`GET /topics/NAME/partitions/P/records`, man/mortard.8): `peek`, `tail`
//! (`-f` to follow) and `dlq list`; and `dlq replay`, which reads a `.dlq` twin there
//! and publishes its dead letters again through the client library's Producer. No group
//! is joined and nothing is acknowledged: a read leaves every consumer where it was.

use std::io::{self, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use mortarmq::client::Record;
use mortarmq::config::parse_duration;
use mortarmq::wire::{Durability, DLQ_SUFFIX};
use serde_json::{json, Value};

use crate::wire_cmds::parse_num;
use crate::{runtime_err, usage_err, Ctx, Failure, Outcome};

/// `--max` of `peek` and `dlq list` unless given: records of each partition.
pub(crate) const PEEK_MAX_DEFAULT: u64 = 10;
/// `tail` shows this many records of each partition before it follows (`-n`).
pub(crate) const TAIL_LINES_DEFAULT: u64 = 10;
/// How long `tail -f` waits before asking again after a round that found nothing new.
pub(crate) const TAIL_POLL_INTERVAL: Duration = Duration::from_millis(500);
/// Records asked for per request: the broker cuts a page to its own cap (1000) anyway.
const PAGE_RECORDS: u64 = 1_000;
/// `dlq list` shows at most this many characters of a value (the JSON has all of it).
const DLQ_LIST_VALUE_CHARS: usize = 40;

/// Where a read starts in each partition.
#[derive(Clone, Copy)]
enum Start {
    Sequence(u64),
    TimeMs(u64),
}

impl Start {
    fn query(self) -> String {
        match self {
            Start::Sequence(s) => format!("from={s}"),
            Start::TimeMs(t) => format!("from_time={t}"),
        }
    }
}

/// One record of a page, decoded.
struct Rec {
    json: Value,
    key: Vec<u8>,
    value: Vec<u8>,
}

/// One page: its records and where the next starts.
struct Page {
    records: Vec<Rec>,
    next: u64,
    last_sequence: u64,
    partitions: u16,
}

/// GETs one page of `topic`'s partition `p`; an error from the endpoint reads as its
/// message and registry name.
fn page(ctx: &Ctx, topic: &str, p: u16, start: Start, max: u64) -> Result<Page, Failure> {
    let path = format!(
        "/topics/{topic}/partitions/{p}/records?{}&max={}",
        start.query(),
        max.min(PAGE_RECORDS)
    );
    let body = ctx.get(&path).map_err(endpoint_failure)?;
    let doc: Value = serde_json::from_str(&body)
        .or_else(|e| runtime_err(format!("admin {}{path}: not JSON: {e}", ctx.admin)))?;
    let number = |name: &str| doc[name].as_u64().unwrap_or(0);
    let mut records = Vec::new();
    for r in doc["records"].as_array().into_iter().flatten() {
        let mut json = r.clone();
        json["partition"] = json!(p);
        records.push(Rec {
            key: decode(r, "key")?,
            value: decode(r, "value")?,
            json,
        });
    }
    Ok(Page {
        records,
        next: number("next"),
        last_sequence: number("last_sequence"),
        partitions: number("partitions") as u16,
    })
}

/// The endpoint's JSON error (`{"error", "message"}`) as a sentence; anything else
/// (a broker without the endpoint, a proxy's page) as it came.
fn endpoint_failure(e: Failure) -> Failure {
    let Failure::Runtime(text) = e else { return e };
    let doc = text
        .find('{')
        .and_then(|at| serde_json::from_str::<Value>(&text[at..]).ok());
    match doc
        .as_ref()
        .and_then(|d| Some((d["error"].as_str()?, d["message"].as_str()?)))
    {
        Some((name, message)) => {
            let hint = match name {
                "UNKNOWN_TOPIC" => "; `mortarctl topics list` shows the topics",
                _ => "",
            };
            Failure::Runtime(format!("{message} ({name}){hint}"))
        }
        None => Failure::Runtime(text),
    }
}

/// A key or value as bytes, by the record's `encoding`.
fn decode(r: &Value, field: &str) -> Result<Vec<u8>, Failure> {
    let text = r[field].as_str().unwrap_or_default();
    match r["encoding"].as_str() {
        Some("base64") => base64::engine::general_purpose::STANDARD
            .decode(text)
            .or_else(|e| runtime_err(format!("record {}: bad base64 {field}: {e}", r["sequence"]))),
        _ => Ok(text.as_bytes().to_vec()),
    }
}

/// The partitions to read: `--partition P` (checked against the topic's count), or all.
fn partitions(ctx: &Ctx, topic: &str) -> Result<Vec<u16>, Failure> {
    let given = match ctx.matches.opt_str("partition") {
        Some(p) => Some(parse_num::<u16>("partition", &p)?),
        None => None,
    };
    // A one-record page of partition 0 (or the one given) says how many there are.
    let probe = page(ctx, topic, given.unwrap_or(0), Start::Sequence(0), 1)?;
    Ok(given.map_or_else(|| (0..probe.partitions).collect(), |p| vec![p]))
}

/// `--from SEQ` or `--from-time TIME` (ms since the Unix epoch, or a duration ago).
fn start(ctx: &Ctx) -> Result<Option<Start>, Failure> {
    let m = &ctx.matches;
    match (m.opt_str("from"), m.opt_str("from-time")) {
        (Some(_), Some(_)) => usage_err("--from and --from-time exclude each other"),
        (Some(s), None) => Ok(Some(Start::Sequence(parse_num("from", &s)?))),
        (None, Some(t)) => Ok(Some(Start::TimeMs(time_ms(&t)?))),
        (None, None) => Ok(None),
    }
}

/// `1718000000000` (ms since the Unix epoch) or `15m` (that long before now).
fn time_ms(text: &str) -> Result<u64, Failure> {
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return parse_num("from-time", text);
    }
    let ago = parse_duration(text).or_else(|why| {
        usage_err(format!(
            "--from-time: {why}; or give ms since the Unix epoch"
        ))
    })?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    Ok(now.saturating_sub(ago).as_millis() as u64)
}

/// `--max N` (1 or more) or `default`.
fn max(ctx: &Ctx, flag: &str, default: u64) -> Result<u64, Failure> {
    match ctx.matches.opt_str(flag).map(|n| parse_num(flag, &n)) {
        None => Ok(default),
        Some(Ok(0)) => usage_err(format!("--{flag} 0 would read nothing; give 1 or more")),
        Some(n) => n,
    }
}

/// How `peek` and `tail` print a record: its value alone (a line each), with `--meta`
/// partition, sequence, timestamp (ms) and key before it (tabs), or with `--json` the
/// endpoint's record object (plus `partition`), one a line.
fn print(out: &mut impl Write, ctx: &Ctx, r: &Rec) -> io::Result<()> {
    if ctx.matches.opt_present("json") {
        writeln!(out, "{}", r.json)?;
    } else {
        if ctx.matches.opt_present("meta") {
            let (j, key) = (&r.json, String::from_utf8_lossy(&r.key));
            write!(
                out,
                "{}\t{}\t{}\t{key}\t",
                j["partition"], j["sequence"], j["timestamp_ms"]
            )?;
        }
        out.write_all(&r.value)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// A write to standard output failed: a closed pipe (`| head`) ends the command
/// quietly, anything else is an error.
fn output_failed(e: io::Error) -> Outcome {
    match e.kind() {
        io::ErrorKind::BrokenPipe => Ok(()),
        _ => runtime_err(format!("standard output: {e}")),
    }
}

/// Prints up to `max` records of partition `p` from `start`; returns where it stopped,
/// or `None` when standard output's reader went away (the command then ends quietly).
fn print_from(
    ctx: &Ctx,
    topic: &str,
    p: u16,
    start: Start,
    max: u64,
) -> Result<Option<u64>, Failure> {
    let mut out = io::stdout().lock();
    let (mut at, mut left) = (start, max);
    loop {
        let page = page(ctx, topic, p, at, left)?;
        for r in &page.records {
            if let Err(e) = print(&mut out, ctx, r) {
                output_failed(e)?;
                return Ok(None);
            }
        }
        left -= (page.records.len() as u64).min(left);
        if page.records.is_empty() || left == 0 {
            return Ok(Some(page.next));
        }
        at = Start::Sequence(page.next);
    }
}

/// The TOPIC argument, a source topic or its `.dlq` twin, checked as a name.
/// The `.dlq` twin of the TOPIC argument (which may name the twin itself).
fn twin_arg(ctx: &Ctx) -> Result<String, Failure> {
    let topic = ctx.topic_or_twin()?;
    let source = topic.strip_suffix(DLQ_SUFFIX).unwrap_or(topic);
    Ok(format!("{source}{DLQ_SUFFIX}"))
}

pub(crate) fn cmd_peek(ctx: &Ctx) -> Outcome {
    let topic = ctx.topic_or_twin()?;
    let (start, max) = (start(ctx)?, max(ctx, "max", PEEK_MAX_DEFAULT)?);
    for p in partitions(ctx, topic)? {
        let from = start.unwrap_or(Start::Sequence(0));
        if print_from(ctx, topic, p, from, max)?.is_none() {
            break;
        }
    }
    Ok(())
}

pub(crate) fn cmd_tail(ctx: &Ctx) -> Outcome {
    let topic = ctx.topic_or_twin()?;
    let lines = match ctx.matches.opt_str("lines") {
        Some(n) => parse_num("lines", &n)?,
        None => TAIL_LINES_DEFAULT,
    };
    let poll = match ctx.matches.opt_str("poll") {
        None => TAIL_POLL_INTERVAL,
        Some(text) => parse_duration(&text).or_else(|why| usage_err(format!("--poll: {why}")))?,
    };
    let mut next = Vec::new();
    for p in partitions(ctx, topic)? {
        let last = page(ctx, topic, p, Start::Sequence(0), 1)?.last_sequence;
        if lines == 0 {
            next.push((p, last + 1));
            continue;
        }
        let from = Start::Sequence((last + 1).saturating_sub(lines));
        match print_from(ctx, topic, p, from, lines)? {
            Some(at) => next.push((p, at)),
            None => return Ok(()),
        }
    }
    if !ctx.matches.opt_present("follow") {
        return Ok(());
    }
    follow(ctx, topic, &mut next, poll)
}

/// `tail -f`: asks every partition from where it stopped, and waits `poll` after a
/// round that found nothing. Ends when standard output's reader goes away, also while
/// nothing arrives (a pipe's far end closing shows as an error on our end of it).
fn follow(ctx: &Ctx, topic: &str, next: &mut [(u16, u64)], poll: Duration) -> Outcome {
    loop {
        let mut found = false;
        for (p, at) in next.iter_mut() {
            let before = *at;
            match print_from(ctx, topic, *p, Start::Sequence(before), PAGE_RECORDS)? {
                Some(after) => *at = after,
                None => return Ok(()),
            }
            found |= *at > before;
        }
        if !found && stdout_closed(poll) {
            return Ok(());
        }
    }
}

/// Waits up to `wait` for standard output to report an error or a hang-up (its reader
/// gone); true if it did.
fn stdout_closed(wait: Duration) -> bool {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};
    let stdout = io::stdout();
    let mut fds = [PollFd::new(&stdout, PollFlags::empty())];
    let timeout = Timespec::try_from(wait).ok();
    match poll(&mut fds, timeout.as_ref()) {
        Ok(n) if n > 0 => fds[0].revents().intersects(PollFlags::ERR | PollFlags::HUP),
        Ok(_) => false,
        // Interrupted, or stdout cannot be polled: wait anyway, or the broker would be
        // asked without pause; a gone reader still shows on the next write.
        Err(_) => {
            std::thread::sleep(wait);
            false
        }
    }
}

pub(crate) fn cmd_dlq_list(ctx: &Ctx) -> Outcome {
    let twin = twin_arg(ctx)?;
    let (start, max) = (start(ctx)?, max(ctx, "max", PEEK_MAX_DEFAULT)?);
    let json = ctx.matches.opt_present("json");
    let mut out = io::stdout().lock();
    let mut shown = 0;
    for p in partitions(ctx, &twin)? {
        let mut at = start.unwrap_or(Start::Sequence(0));
        let mut left = max;
        while left > 0 {
            let page = page(ctx, &twin, p, at, left)?;
            for r in &page.records {
                let line = if json {
                    r.json.to_string()
                } else {
                    dead_letter_line(r)
                };
                if let Err(e) = writeln!(out, "{line}") {
                    return output_failed(e);
                }
                shown += 1;
            }
            left -= (page.records.len() as u64).min(left);
            if page.records.is_empty() {
                break;
            }
            at = Start::Sequence(page.next);
        }
    }
    if !json && shown == 0 {
        eprintln!("no dead letters in {twin}");
    }
    Ok(())
}

/// `P SEQ  from TOPIC/P@SEQ REASON after N attempts by GROUP  key=K  VALUE…`.
fn dead_letter_line(r: &Rec) -> String {
    let (j, o) = (&r.json, &r.json["origin"]);
    let mut value: String = String::from_utf8_lossy(&r.value)
        .chars()
        .take(DLQ_LIST_VALUE_CHARS)
        .collect();
    if value.len() < r.value.len() {
        value.push('…');
    }
    let origin = match o.is_object() {
        true => format!(
            "from {}/{}@{} {} after {} attempts by group {}",
            o["topic"].as_str().unwrap_or("?"),
            o["partition"],
            o["sequence"],
            o["reason"].as_str().unwrap_or("?"),
            o["attempts"],
            o["group"].as_str().unwrap_or("?"),
        ),
        false => "(no origin: not a dead letter)".to_string(),
    };
    let key = String::from_utf8_lossy(&r.key);
    format!(
        "{}\t{}\t{origin}\tkey={key}\t{value}",
        j["partition"], j["sequence"]
    )
}

pub(crate) fn cmd_dlq_replay(ctx: &Ctx) -> Outcome {
    let twin = twin_arg(ctx)?;
    let durability = match ctx.matches.opt_str("durability").as_deref() {
        None | Some("fsync") => Durability::Fsynced,
        Some("written") => Durability::Written,
        Some(other) => return usage_err(format!("--durability: '{other}' is not written|fsync")),
    };
    let start = start(ctx)?.unwrap_or(Start::Sequence(0));
    let max = max(ctx, "max", u64::MAX)?;
    let mut producer = ctx.producer(Some(durability), crate::wire_cmds::KEEPALIVE_DEFAULT)?;
    let mut replayed = 0u64;
    let mut spans = Vec::new();
    for p in partitions(ctx, &twin)? {
        let first = page(ctx, &twin, p, start, 1)?;
        // Up to the end as it is now: dead letters the replayed records make again are
        // left for the next replay instead of being chased for ever.
        let (mut at, end) = (start, first.last_sequence);
        let mut left = max;
        let mut span: Option<(u64, u64)> = None;
        while left > 0 {
            let page = page(ctx, &twin, p, at, left)?;
            let records: Vec<&Rec> = page.records.iter().filter(|r| seq(r) <= end).collect();
            for r in &records {
                send_again(&mut producer, r, replayed)?;
                span = Some((span.map_or(seq(r), |s| s.0), seq(r)));
            }
            producer.flush().map_err(|e| replay_failed(e, replayed))?;
            replayed += records.len() as u64;
            left -= (records.len() as u64).min(left);
            if records.is_empty() || page.next > end {
                break;
            }
            at = Start::Sequence(page.next);
        }
        if let Some((a, b)) = span {
            spans.push(format!(
                "partition {p}: sequences {a}-{b}, next --from {}",
                b + 1
            ));
        }
    }
    producer.close().map_err(|e| replay_failed(e, replayed))?;
    let source = twin.strip_suffix(DLQ_SUFFIX).unwrap_or(&twin);
    let spans = if spans.is_empty() {
        String::new()
    } else {
        format!(" ({})", spans.join("; "))
    };
    println!(
        "replayed {replayed} dead letters from {twin} to {source}{spans}; they stay in {twin}"
    );
    Ok(())
}

fn seq(r: &Rec) -> u64 {
    r.json["sequence"].as_u64().unwrap_or(0)
}

/// Publishes a dead letter's key and value to the partition it came from.
fn send_again(producer: &mut mortarmq::client::Producer, r: &Rec, done: u64) -> Outcome {
    let o = &r.json["origin"];
    let (Some(topic), Some(partition)) = (o["topic"].as_str(), o["partition"].as_u64()) else {
        return runtime_err(format!(
            "sequence {} has no origin: not a dead letter (after {done} were replayed)",
            seq(r)
        ));
    };
    let record = Record::new(topic, &r.value)
        .key(&r.key)
        .partition(partition as u16);
    producer
        .send_record(record)
        .map_err(|e| replay_failed(e, done))?;
    Ok(())
}

fn replay_failed(e: mortarmq::client::Error, done: u64) -> Failure {
    Failure::Runtime(format!("{e} (after {done} dead letters were replayed)"))
}

fn read_options(o: &mut getopts::Options, max_default: &str) {
    o.optopt(
        "",
        "partition",
        "only this partition (default: every one)",
        "P",
    );
    o.optopt(
        "",
        "from",
        "start at this sequence (default: the oldest)",
        "SEQ",
    );
    o.optopt(
        "",
        "from-time",
        "start at the first record stamped at or after TIME: ms since the Unix epoch, \
         or a duration ago (15m)",
        "TIME",
    );
    o.optopt(
        "",
        "max",
        &format!("records of each partition, at most (default {max_default})"),
        "N",
    );
}

fn print_options(o: &mut getopts::Options) {
    o.optflag(
        "",
        "meta",
        "print partition, sequence, timestamp (ms), key, value (tabs)",
    );
    o.optflag(
        "",
        "json",
        "print each record as the endpoint's JSON object, one a line",
    );
}

pub(crate) fn peek_options(o: &mut getopts::Options) {
    read_options(o, &PEEK_MAX_DEFAULT.to_string());
    print_options(o);
}

pub(crate) fn tail_options(o: &mut getopts::Options) {
    o.optflag(
        "f",
        "follow",
        "keep printing records as they arrive, until killed",
    );
    o.optopt(
        "n",
        "lines",
        &format!("last N records of each partition ({TAIL_LINES_DEFAULT})"),
        "N",
    );
    o.optopt(
        "",
        "partition",
        "only this partition (default: every one)",
        "P",
    );
    let poll = TAIL_POLL_INTERVAL.as_millis();
    o.optopt(
        "",
        "poll",
        &format!("with -f, ask again after DURATION ({poll}ms)"),
        "DURATION",
    );
    print_options(o);
}

pub(crate) fn dlq_list_options(o: &mut getopts::Options) {
    read_options(o, &PEEK_MAX_DEFAULT.to_string());
    o.optflag(
        "",
        "json",
        "print each dead letter as the endpoint's JSON object, one a line",
    );
}

pub(crate) fn dlq_replay_options(o: &mut getopts::Options) {
    read_options(o, "all");
    o.optopt(
        "",
        "durability",
        "wait for: written or fsync (default fsync)",
        "LEVEL",
    );
}
