//! Durability under a real kernel (issue 12): `mortard` runs under `strace`, which
//! delays or fails the fdatasync calls on the journal's first file (`docs/STORAGE.md`:
//! every record goes through the node's journal, and a journal fdatasync is what makes a
//! FSYNC PUB durable) and records, with their times, every write to that file and every
//! fdatasync of it. Clients publish with FSYNC from
//! several connections at once and note when each answer arrived. The check: whenever an
//! answer arrived, at least as many records as had been acknowledged by then were written
//! before the start of an fdatasync of the file that had already returned with success.
//!
//! Why the times can be compared: strace stops the traced thread at every syscall entry
//! and exit and stamps the stop before letting it go on, so an fdatasync's entry stamp is
//! no later than the moment it really starts, a write's exit stamp is no earlier than the
//! moment its bytes were in the page cache, and nothing the broker does after a syscall
//! (answering included) happens before that syscall's exit stamp. The client's clock is
//! the same wall clock.
//!
//! Four more fail other calls: every `sync_file_range` (the write-back before a
//! checkpoint's segment fdatasync, `docs/STORAGE.md`): that partition must refuse writes
//! and still answer, and keep, what it took; a few segment `pwrite64`s with ENOSPC (a
//! full disk) under records big enough to be written at once: their PUBs get
//! STORAGE_FULL and take no sequence, the rest are stored; every segment `pwrite64` under
//! small records, whose writes wait staged behind the journal: all are acknowledged and
//! the next start writes them from the journal; and a journal `pwrite64` with ENOSPC:
//! the node refuses writes at once, counts one failure, and a producer backs off between
//! its resends. One more only watches: a start fsyncs the data directory and every
//! directory above it.
//!
//! `tools/test.sh` installs strace where it is missing.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use common::mortard::Mortard;
use common::wait;
use mortarmq::broker::JOURNAL_DIR;
use mortarmq::client::{ClientError, Producer};
use mortarmq::log::journal::{
    journal_file_path, JOURNAL_ENTRY_HEADER_BYTES, JOURNAL_FILE_HEADER_BYTES, SPARE_FILE,
};
use mortarmq::log::{FsStorage, LogConfig, PartitionLog, RECORD_OVERHEAD_BYTES, STAGED_BYTES_MAX};
use mortarmq::wire::ops::{Frame, Ping, Pub};
use mortarmq::wire::{DeclareFlags, Durability, ErrorCode, Op, PubFlags};

const TOPIC: &str = "t";
/// The first topic declared in a fresh data directory gets id 1.
const TOPIC_ID: u16 = 1;
const VALUE_BYTES: usize = 100;
const RECORD_BYTES: u64 = (RECORD_OVERHEAD_BYTES + VALUE_BYTES) as u64;
const CONNECTIONS: usize = 6;
const PUBS_PER_CONNECTION: usize = 40;
/// How long every fdatasync of the journal is held before it returns: far longer than an
/// answer takes, so an answer sent before its fdatasync returned cannot hide.
const FDATASYNC_DELAY_US: u64 = 30_000;

/// The first journal file of `data_dir` (it holds every entry of these short tests).
fn journal_file(data_dir: &Path) -> PathBuf {
    journal_file_path(&data_dir.join(JOURNAL_DIR), 0)
}

/// Waits until the broker's first spare journal file is ready. The first file is then
/// made from it and written until full; a first file made by appending (a PUB before
/// the spare) would be left for a newer file, which the trace does not follow, as soon
/// as the spare is ready.
fn wait_for_spare(broker: &Mortard) {
    let spare = broker.data_dir().join(JOURNAL_DIR).join(SPARE_FILE);
    wait_for("the first spare journal file", || spare.exists());
}

/// `strace` tracing `pwrite64` and `fdatasync` on the journal file only, with `inject`
/// applied to its fdatasyncs, into `trace`.
fn strace(trace: &Path, inject: &str) -> impl FnOnce(&Path) -> Vec<String> {
    let trace = trace.to_path_buf();
    let inject = inject.to_string();
    move |data_dir| {
        let journal = journal_file(data_dir);
        let words = [
            "strace",
            "-f",
            "-ttt",
            "-T",
            "-y",
            "-s0",
            "-e",
            "trace=pwrite64,fdatasync",
            "-e",
            &format!("inject=fdatasync:{inject}"),
            "-P",
            journal.to_str().unwrap(),
            "-o",
            trace.to_str().unwrap(),
        ];
        words.iter().map(|w| w.to_string()).collect()
    }
}

/// When an answer arrived (wall clock, seconds), and its sequence or ERR code.
type Answer = (f64, Result<u64, u16>);

/// One completed syscall from the trace.
#[derive(Debug, Clone)]
struct Call {
    name: String,
    start: f64,
    end: f64,
    /// The return value; `None` for an error (-1 E…).
    ret: Option<u64>,
    /// strace held the thread after the call (`delay_exit`): `end` includes the delay.
    delayed: bool,
}

/// The completed pwrite64 and fdatasync calls of a `strace -f -ttt -T -o` file, joining
/// the halves of calls strace printed as `<unfinished ...>` and `<... resumed>`. `-T`
/// times the call itself; a delayed call's thread goes on `delay_us` later.
fn parse_trace(text: &str, delay_us: u64) -> Vec<Call> {
    let mut open: HashMap<u32, (String, f64)> = HashMap::new();
    let mut calls = Vec::new();
    for line in text.lines() {
        // "<pid, padded> <seconds.micros> <call>"
        let Some((pid, line)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let Some((ts, rest)) = line.trim_start().split_once(' ') else {
            continue;
        };
        let (Ok(pid), Ok(start)) = (pid.parse::<u32>(), ts.parse::<f64>()) else {
            continue;
        };
        let rest = rest.trim_start();
        let (name, start) = if let Some(resumed) = rest.strip_prefix("<... ") {
            let name = resumed.split(' ').next().unwrap().to_string();
            match open.remove(&pid) {
                Some((n, s)) if n == name => (name, s),
                _ => panic!("resumed call without its start: {line}"),
            }
        } else {
            let name = rest.split('(').next().unwrap().to_string();
            if rest.ends_with("<unfinished ...>") {
                open.insert(pid, (name, start));
                continue;
            }
            (name, start)
        };
        if name != "pwrite64" && name != "fdatasync" {
            continue;
        }
        let (_, result) = rest.rsplit_once(") = ").expect("a completed call");
        let ret = result.split(' ').next().unwrap().parse::<u64>().ok();
        let took = result
            .rsplit_once('<')
            .and_then(|(_, t)| t.trim_end_matches('>').parse::<f64>().ok())
            .expect("-T time");
        let delayed = result.contains("(DELAYED)");
        let held = if delayed { delay_us as f64 / 1e6 } else { 0.0 };
        calls.push(Call {
            name,
            start,
            end: start + took + held,
            ret,
            delayed,
        });
    }
    calls
}

/// Records durable at wall time `t` by the trace: written before the start of an
/// fdatasync that returned success by `t`. After a failed fdatasync, no later one
/// proves anything (the kernel may have dropped the dirty pages), so only fdatasyncs that
/// started before the first failure count.
fn durable_records_at(calls: &[Call], t: f64) -> u64 {
    let first_failure = calls
        .iter()
        .filter(|c| c.name == "fdatasync" && c.ret.is_none())
        .map(|c| c.start)
        .fold(f64::INFINITY, f64::min);
    let covered_until = calls
        .iter()
        .filter(|c| c.name == "fdatasync" && c.ret == Some(0))
        .filter(|c| c.end <= t && c.start < first_failure)
        .map(|c| c.start)
        .fold(f64::NEG_INFINITY, f64::max);
    calls
        .iter()
        .filter(|c| c.name == "pwrite64" && c.end <= covered_until)
        .filter_map(|c| c.ret)
        .filter(|&bytes| bytes > JOURNAL_FILE_HEADER_BYTES as u64)
        .map(records_in_write)
        .sum()
}

/// Records in one journal write: one pass's entry for the one partition these tests
/// publish to, an entry header then its records.
fn records_in_write(bytes: u64) -> u64 {
    let records = bytes - JOURNAL_ENTRY_HEADER_BYTES as u64;
    assert_eq!(
        records % RECORD_BYTES,
        0,
        "a write of {bytes} bytes is not one entry"
    );
    records / RECORD_BYTES
}

/// The answers to FSYNC PUBs from several connections at once: for each, when it
/// arrived (wall clock, seconds) and whether it was OK.
fn publish_from_many(broker: &Mortard) -> Vec<Answer> {
    let threads: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let mut client = broker.client();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                for _ in 0..PUBS_PER_CONNECTION {
                    let value = [7u8; VALUE_BYTES];
                    let r = client.publish_value(TOPIC_ID, 0, &value, Some(Durability::Fsynced));
                    let at = SystemTime::now()
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .unwrap()
                        .as_secs_f64();
                    answers.push((
                        at,
                        match r {
                            Ok(ok) => Ok(ok.sequence),
                            Err(ClientError::Broker { code, .. }) => Err(code),
                            Err(e) => panic!("{e}"),
                        },
                    ));
                }
                answers
            })
        })
        .collect();
    let mut answers: Vec<_> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    answers.sort_by(|a, b| a.0.total_cmp(&b.0));
    answers
}

/// Runs the publishers against a broker whose journal fdatasyncs get `inject` (holding
/// each for `delay_us`), then stops it with SIGTERM; returns the answers, the trace and
/// the broker's exit status.
fn run(inject: &str, delay_us: u64) -> (Vec<Answer>, Vec<Call>, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("strace.out");
    assert!(
        Command::new("strace").arg("-V").output().is_ok(),
        "strace is needed (tools/test.sh installs it)"
    );
    let mut broker = Mortard::start_wrapped(strace(&trace, inject), &[]);
    wait_for_spare(&broker);
    let declared = broker
        .client()
        .declare(TOPIC, 1, DeclareFlags::empty())
        .unwrap();
    assert_eq!(declared.topic_id, TOPIC_ID);
    let answers = publish_from_many(&broker);
    let exit = broker.terminate().code();
    let calls = parse_trace(&std::fs::read_to_string(&trace).unwrap(), delay_us);
    (answers, calls, exit)
}

/// Every OK answer arrived when at least that many records were durable.
fn assert_no_answer_ahead_of_its_fdatasync(answers: &[Answer], calls: &[Call]) {
    let mut acknowledged = 0;
    for (at, answer) in answers {
        if answer.is_ok() {
            acknowledged += 1;
            let durable = durable_records_at(calls, *at);
            assert!(
                acknowledged <= durable,
                "answer {acknowledged} arrived at {at:.6} with only {durable} records durable"
            );
        }
    }
}

#[test]
fn no_fsync_pub_is_answered_before_the_fdatasync_covering_it_returned() {
    let delay = FDATASYNC_DELAY_US;
    let (answers, calls, exit) = run(&format!("delay_exit={delay}"), delay);
    assert_eq!(exit, Some(0));
    let syncs = calls.iter().filter(|c| c.name == "fdatasync").count();
    let delayed = calls
        .iter()
        .filter(|c| c.name == "fdatasync" && c.delayed)
        .count();
    assert!(syncs >= 2 && delayed == syncs, "{calls:?}");
    assert_eq!(answers.len(), CONNECTIONS * PUBS_PER_CONNECTION);
    assert!(answers.iter().all(|(_, a)| a.is_ok()), "{answers:?}");
    // Group commit: several connections' records share an fdatasync.
    assert!(
        syncs < answers.len(),
        "{syncs} fdatasyncs for {} PUBs",
        answers.len()
    );
    assert_no_answer_ahead_of_its_fdatasync(&answers, &calls);
}

#[test]
fn an_fdatasync_eio_acknowledges_nothing_it_did_not_cover() {
    // The 4th group commit's fdatasync of the journal fails, and every later one.
    let (answers, calls, exit) = run("error=EIO:when=4+", 0);
    // Records written since the failure may not be on disk: the exit status says so.
    assert_eq!(exit, Some(1));
    let failed = calls
        .iter()
        .filter(|c| c.name == "fdatasync" && c.ret.is_none())
        .count();
    assert!(failed >= 1, "{calls:?}");
    let ok = answers.iter().filter(|(_, a)| a.is_ok()).count();
    let refused = answers.len() - ok;
    assert!(ok > 0 && refused > 0, "{answers:?}");
    assert_no_answer_ahead_of_its_fdatasync(&answers, &calls);
    // The partition refuses writes until a restart re-reads the disk.
    assert!(
        answers
            .iter()
            .all(|(_, a)| a.is_ok() || *a == Err(ErrorCode::InternalError.code())),
        "{answers:?}"
    );
}

/// `strace` failing every `sync_file_range` of the broker: the write-back of a segment
/// before a checkpoint's fdatasync, and of each chunk of a spare journal file.
fn failing_write_back(_data_dir: &Path) -> Vec<String> {
    let words = [
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=sync_file_range",
        "-e",
        "inject=sync_file_range:error=EIO",
        "-o",
        "/dev/null",
    ];
    words.iter().map(|w| w.to_string()).collect()
}

#[test]
fn a_failed_write_back_at_a_checkpoint_stops_the_partition_and_keeps_what_was_acknowledged() {
    // A checkpoint once the journal grew 64 KiB: a few hundred records in.
    let broker = Mortard::start_wrapped(failing_write_back, &["--journal-file-size", "64KiB"]);
    let mut client = broker.client();
    let declared = client.declare(TOPIC, 1, DeclareFlags::empty()).unwrap();
    let value = [7u8; VALUE_BYTES];
    let mut acknowledged = 0;
    let refused = loop {
        assert!(
            acknowledged < 20_000,
            "no PUB refused: the write-back never failed"
        );
        match client.publish_value(declared.topic_id, 0, &value, Some(Durability::Fsynced)) {
            Ok(ok) => {
                acknowledged += 1;
                assert_eq!(ok.sequence, acknowledged);
            }
            Err(ClientError::Broker { code, .. }) => break code,
            Err(e) => panic!("{e}"),
        }
    };
    // Failed like a failed segment fdatasync: that partition takes no more writes.
    assert_eq!(refused, ErrorCode::InternalError.code());
    assert!(acknowledged > 0);
    wait_for("the failed checkpoint in the log", || {
        broker.log_text().contains("checkpoint at journal lsn")
    });
    // What was acknowledged is still there (in the journal and the page cache).
    let path = format!("/topics/{TOPIC}/partitions/0/records?from={acknowledged}&max=1");
    let (status, body) = broker.http("GET", &path);
    assert_eq!(status, 200, "{body}");
    let page: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        page["records"][0]["sequence"].as_u64(),
        Some(acknowledged),
        "{body}"
    );
}

/// `strace` failing calls `when` (strace's `N..M`, counted per thread) of `pwrite64` on
/// the first segment of the test topic's partition 0 with ENOSPC: a disk that fills up
/// under the records and then has room again.
fn full_segment_writes(when: &'static str) -> impl FnOnce(&Path) -> Vec<String> {
    move |data_dir| {
        let topic = format!("{TOPIC_ID}-{:08x}", crc32fast::hash(TOPIC.as_bytes()));
        let segment = data_dir.join("topics").join(topic).join("0");
        full_writes_of(&segment.join(format!("{:020}.log", 1)), when)
    }
}

#[test]
fn segment_writes_that_hit_a_full_disk_refuse_their_pubs_and_lose_nothing_acknowledged() {
    const PUBS: usize = 40;
    let mut broker = Mortard::start_wrapped(full_segment_writes("6..8"), &[]);
    let mut client = broker.client();
    let declared = client.declare(TOPIC, 1, DeclareFlags::empty()).unwrap();
    assert_eq!(declared.topic_id, TOPIC_ID);
    let mut acknowledged: Vec<Vec<u8>> = Vec::new();
    let mut refused = 0;
    for i in 0..PUBS {
        // Each record fills the partition's staged bytes alone, so its flush writes the
        // segment before the journal takes it (`docs/STORAGE.md`, "Writes and
        // durability"): a failed write is that PUB's.
        let value = segment_filling_value(i);
        match client.publish_value(TOPIC_ID, 0, &value, Some(Durability::Fsynced)) {
            Ok(ok) => {
                acknowledged.push(value);
                // A refused record took no sequence.
                assert_eq!(ok.sequence, acknowledged.len() as u64);
            }
            Err(ClientError::Broker { code, .. }) => {
                assert_eq!(code, ErrorCode::StorageFull.code(), "PUB {i}");
                refused += 1;
            }
            Err(e) => panic!("PUB {i}: {e}"),
        }
    }
    assert_eq!(
        refused, 3,
        "the three failed writes refuse their PUBs, and only them"
    );
    assert_eq!(broker.terminate().code(), Some(0));
    assert_eq!(stored_values(&broker, PUBS), acknowledged);
}

#[test]
fn small_records_whose_segment_writes_hit_a_full_disk_are_acknowledged_from_the_journal() {
    const PUBS: usize = 40;
    // Every segment write of the first run fails: the records stay staged, held by the
    // journal alone, through housekeeping and an orderly shutdown.
    let mut broker = Mortard::start_wrapped(full_segment_writes("1+"), &[]);
    let mut client = broker.client();
    client.declare(TOPIC, 1, DeclareFlags::empty()).unwrap();
    let mut acknowledged: Vec<Vec<u8>> = Vec::new();
    for i in 0..PUBS {
        let value = format!("record {i}").into_bytes();
        let ok = client
            .publish_value(TOPIC_ID, 0, &value, Some(Durability::Fsynced))
            .unwrap_or_else(|e| panic!("PUB {i}: {e}"));
        acknowledged.push(value);
        assert_eq!(ok.sequence, acknowledged.len() as u64);
    }
    drop(client);
    broker.terminate();
    assert!(
        broker.log_text().contains("staged records not written"),
        "the shutdown's segment write failed:\n{}",
        broker.log_text()
    );
    // The next start replays the journal into the segment, which has room again.
    broker.restart_unwrapped();
    assert_eq!(broker.terminate().code(), Some(0));
    assert_eq!(stored_values(&broker, PUBS), acknowledged);
}

/// A value of exactly [`STAGED_BYTES_MAX`] bytes that names its PUB.
fn segment_filling_value(i: usize) -> Vec<u8> {
    let mut value = format!("record {i} ").into_bytes();
    value.resize(STAGED_BYTES_MAX, b'.');
    value
}

/// Up to `max` values of the test topic's partition 0 on disk, read back after the
/// broker stopped.
fn stored_values(broker: &Mortard, max: usize) -> Vec<Vec<u8>> {
    let dir = broker.data_dir().join("topics");
    let dir = dir.join(format!(
        "{TOPIC_ID}-{:08x}",
        crc32fast::hash(TOPIC.as_bytes())
    ));
    let config = LogConfig::default();
    let (mut log, _) = PartitionLog::open(&FsStorage::shared(), &dir.join("0"), config).unwrap();
    let mut stored = Vec::new();
    log.read(1, max, usize::MAX, |r| stored.push(r.value.to_vec()))
        .unwrap();
    stored
}

/// `strace` failing calls `when` of `pwrite64` on the first journal file with ENOSPC.
fn full_journal_writes(when: &'static str) -> impl FnOnce(&Path) -> Vec<String> {
    move |data_dir| full_writes_of(&journal_file(data_dir), when)
}

/// The `strace` command line failing calls `when` of `pwrite64` on `file` with ENOSPC.
fn full_writes_of(file: &Path, when: &str) -> Vec<String> {
    let inject = format!("inject=pwrite64:error=ENOSPC:when={when}");
    let file = file.to_str().unwrap();
    let words = [
        "strace",
        "-f",
        "-qq",
        "-e",
        "trace=pwrite64",
        "-e",
        &inject,
        "-P",
        file,
    ];
    let mut words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
    words.extend(["-o".to_string(), "/dev/null".to_string()]);
    words
}

/// `fsync.failures` of the broker's `/stats`.
fn fsync_failures(broker: &Mortard) -> u64 {
    let (status, body) = broker.http("GET", "/stats");
    assert_eq!(status, 200, "{body}");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    stats["fsync"]["failures"].as_u64().expect("fsync.failures")
}

#[test]
fn a_journal_write_that_hits_a_full_disk_fails_pubs_at_once_and_producers_back_off() {
    // The journal's write for the second record fails; the journal refuses writes from
    // then on, until a restart (`docs/STORAGE.md`).
    let broker = Mortard::start_wrapped(full_journal_writes("3..3"), &[]);
    wait_for_spare(&broker);
    let mut client = broker.client();
    client.declare(TOPIC, 1, DeclareFlags::empty()).unwrap();
    let value = [7u8; VALUE_BYTES];
    let fsync = Some(Durability::Fsynced);
    assert!(client.publish_value(TOPIC_ID, 0, &value, fsync).is_ok());
    for i in 0..3 {
        match client.publish_value(TOPIC_ID, 0, &value, fsync) {
            Err(ClientError::Broker { code, .. }) => {
                assert_eq!(code, ErrorCode::InternalError.code(), "PUB {i}")
            }
            other => panic!("PUB {i} after the failed journal write: {other:?}"),
        }
    }
    // One failure, not one more per pass of a broker with nothing to write.
    for _ in 0..20 {
        client.ping().unwrap();
    }
    assert_eq!(fsync_failures(&broker), 1);
    // A producer resends an INTERNAL_ERROR's record idempotently, after a backoff that
    // doubles: a handful of resends within its retry timeout, not a storm of them.
    let errors = |broker: &Mortard| {
        let (_, body) = broker.http("GET", "/metrics");
        let name = "mortar_errors_total{code=\"INTERNAL_ERROR\"}";
        let line = body.lines().find(|l| l.starts_with(name));
        line.and_then(|l| l[name.len()..].trim().parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} in {body}"))
    };
    let before = errors(&broker);
    let mut producer = Producer::builder(broker.addr)
        .retry_timeout(Duration::from_millis(500))
        .connect()
        .unwrap();
    let failed = producer.publish(TOPIC, b"", value, fsync).unwrap_err();
    assert_eq!(failed.code(), Some(ErrorCode::InternalError), "{failed}");
    let refused = errors(&broker) - before;
    assert!(
        (2..=12).contains(&refused),
        "{refused} PUBs refused in 500 ms"
    );
}

/// Waits until `ready` holds, polling (the trace and the log are files another process
/// writes); panics after `WAIT_LIMIT`.
fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT_LIMIT, ready);
}

/// How long `wait_for` waits for another process.
const WAIT_LIMIT: Duration = Duration::from_secs(20);

#[test]
fn a_draining_broker_answers_what_it_read_and_reads_nothing_new() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("strace.out");
    // One second per fdatasync: the PUB is still waiting for its own when SIGTERM comes.
    let hold_us = 1_000_000;
    let mut broker = Mortard::start_wrapped(strace(&trace, &format!("delay_exit={hold_us}")), &[]);
    wait_for_spare(&broker);
    let mut client = broker.client();
    client.declare(TOPIC, 1, DeclareFlags::empty()).unwrap();
    let value = [1u8; VALUE_BYTES];
    client
        .send(&Frame::Pub(Pub {
            topic_id: TOPIC_ID,
            partition: 0,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            value: &value,
            ..Pub::default()
        }))
        .unwrap();
    let trace_text = || std::fs::read_to_string(&trace).unwrap_or_default();
    wait_for("the record's write", || trace_text().contains("pwrite64("));
    common::mortard::signal(broker.pid(), "TERM");
    wait_for("draining", || broker.log_text().contains("draining"));
    // Sent while draining: never read, so never answered PONG.
    client.send(&Frame::Ping(Ping {})).unwrap();
    let answer = client
        .recv_reply()
        .expect("the PUB read before the signal is answered");
    assert_eq!(answer.request_op, Op::Pub as u8);
    match client.recv_reply() {
        Err(e) => assert_eq!(e.code(), Some(ErrorCode::ShuttingDown), "{e}"),
        Ok(r) => panic!("a request sent while draining was answered: {r:?}"),
    }
    assert!(broker.terminate().success());
}

/// Every start syncs the data directory and each directory above it (`docs/STORAGE.md`,
/// "Data directory"): `mortard` makes the data directory with a plain mkdir, and one that
/// exists (made so, or by a start that died before its parent's sync) is not yet
/// durable, so a power cut could take it with everything acknowledged in it.
#[test]
fn a_start_syncs_the_data_directory_and_every_directory_above_it() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("strace.out");
    let words = {
        let trace = trace.clone();
        move |_: &Path| {
            let trace = trace.to_str().unwrap();
            ["strace", "-f", "-y", "-e", "trace=fsync", "-o", trace]
                .iter()
                .map(|w| w.to_string())
                .collect()
        }
    };
    let mut broker = Mortard::start_wrapped(words, &[]);
    let data_dir = broker.data_dir();
    assert!(broker.terminate().success());
    let text = std::fs::read_to_string(&trace).unwrap();
    // strace pads the result: `fsync(8</tmp/x/data>)    = 0`.
    let synced: Vec<String> = text
        .lines()
        .filter(|l| l.contains(" fsync(") && l.ends_with(" = 0"))
        .filter_map(|l| Some(l.split_once('<')?.1.split_once(">)")?.0.to_string()))
        .collect();
    for d in data_dir.ancestors() {
        assert!(
            synced.iter().any(|s| Path::new(s) == d),
            "no fsync of {} at start; the trace:\n{text}",
            d.display()
        );
    }
}
