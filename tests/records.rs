//! Reading without consuming (issue 17): the admin records endpoint over real HTTP, and
//! `mortarctl peek`, `tail -f`, `dlq list` and `dlq replay` run as processes against a
//! real broker.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::mortarctl;
use common::mortard::Mortard;
use common::repo::readme_block;
use common::wait;
use mortarmq::client::{Consumer, StartPolicy};
use mortarmq::wire::{DeclareFlags, Durability};
use serde_json::Value;

/// Longest a `mortarctl` run, or a wait for the broker, may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// `mortarctl --broker B --admin A args…`, killed after RUN_TIMEOUT; no MORTAR_ variable
/// of the caller's shell reaches it.
fn ctl(broker: &Mortard, args: &[&str]) -> Output {
    mortarctl::run_to_end(ctl_command(broker, args), b"", RUN_TIMEOUT)
        .unwrap_or_else(|_| panic!("mortarctl {args:?} did not finish"))
}

fn ctl_command(broker: &Mortard, args: &[&str]) -> Command {
    let mut cmd = mortarctl::against(broker);
    cmd.args(args).stdin(Stdio::null());
    cmd
}

/// Runs and expects exit 0; returns stdout.
fn ok(broker: &Mortard, args: &[&str]) -> String {
    let out = ctl(broker, args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(0),
        "mortarctl {args:?}: {stdout}{stderr}"
    );
    stdout
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// GET `path` on the admin listener: (status, JSON body).
fn get(broker: &Mortard, path: &str) -> (u16, Value) {
    let (status, body) = broker.http("GET", path);
    let doc = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body}"));
    (status, doc)
}

fn sequences(doc: &Value) -> Vec<u64> {
    let records = doc["records"].as_array().expect("records");
    records
        .iter()
        .map(|r| r["sequence"].as_u64().unwrap())
        .collect()
}

/// Waits until `ready` holds (the broker dead-letters on its own time); panics after
/// RUN_TIMEOUT.
fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    wait::wait_until(what, RUN_TIMEOUT, ready);
}

#[test]
fn the_records_endpoint_pages_finds_times_and_refuses_clearly() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let topic = c
        .declare("orders", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for value in [&b"one"[..], b"two", &[0xff, 0xfe], b"four", b"five"] {
        c.publish_value(topic, 0, value, Some(Durability::Fsynced))
            .unwrap();
    }
    let base = "/topics/orders/partitions/0/records";

    let (status, first) = get(&broker, &format!("{base}?max=2"));
    assert_eq!(status, 200, "{first}");
    assert_eq!(sequences(&first), [1, 2]);
    assert_eq!(
        (first["next"].as_u64(), first["partitions"].as_u64()),
        (Some(3), Some(2))
    );
    assert_eq!(
        (
            first["first_sequence"].as_u64(),
            first["last_sequence"].as_u64()
        ),
        (Some(1), Some(5))
    );
    assert_eq!(
        (
            first["records"][1]["value"].as_str(),
            first["records"][1]["encoding"].as_str()
        ),
        (Some("two"), Some("text"))
    );
    let (_, rest) = get(&broker, &format!("{base}?from=3"));
    assert_eq!(
        (sequences(&rest), rest["next"].as_u64()),
        (vec![3, 4, 5], Some(6))
    );
    let binary = &rest["records"][0];
    assert_eq!(
        (binary["encoding"].as_str(), binary["value"].as_str()),
        (Some("base64"), Some("//4="))
    );

    // from_time: the first record stamped at or after the time.
    let stamps: Vec<u64> = [&first["records"], &rest["records"]]
        .iter()
        .flat_map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|r| r["timestamp_ms"].as_u64().unwrap())
        })
        .collect();
    for (i, &t) in stamps.iter().enumerate() {
        let (_, at) = get(&broker, &format!("{base}?from_time={t}&max=1"));
        let want = stamps.iter().position(|&s| s >= t).unwrap() as u64 + 1;
        assert_eq!(sequences(&at), [want], "from_time of record {}", i + 1);
    }
    let after = stamps[4] + 1;
    let (_, none) = get(&broker, &format!("{base}?from_time={after}"));
    assert_eq!((sequences(&none), none["next"].as_u64()), (vec![], Some(6)));

    for (path, status, error, says) in [
        (
            "/topics/nope/partitions/0/records",
            404,
            "UNKNOWN_TOPIC",
            "no topic named 'nope'",
        ),
        (
            "/topics/orders/partitions/2/records",
            400,
            "UNKNOWN_PARTITION",
            "0 to 1, not 2",
        ),
        (
            "/topics/orders/partitions/x/records",
            400,
            "INVALID_ARGUMENT",
            "partition: 'x'",
        ),
        (
            &format!("{base}?max=many"),
            400,
            "INVALID_ARGUMENT",
            "max: 'many'",
        ),
        (
            &format!("{base}?from=1&from_time=1"),
            400,
            "INVALID_ARGUMENT",
            "one of from",
        ),
        (
            &format!("{base}?offset=1"),
            400,
            "INVALID_ARGUMENT",
            "unknown parameter 'offset'",
        ),
    ] {
        let (got, doc) = get(&broker, path);
        assert_eq!(
            (got, doc["error"].as_str()),
            (status, Some(error)),
            "{path}: {doc}"
        );
        assert!(
            doc["message"].as_str().unwrap().contains(says),
            "{path}: {doc}"
        );
    }
    assert_eq!(broker.http("POST", base).0, 405);
    // Nothing was consumed: reading made no group.
    let (_, stats) = get(&broker, "/stats");
    assert_eq!(
        stats["groups"].as_array().map(Vec::len),
        Some(0),
        "{}",
        stats["groups"]
    );
}

/// `jobs` with one partition: "bad" (key j1) rejected by group `workers` into jobs.dlq,
/// "good" acknowledged; returns once the dead letter is readable.
fn one_dead_letter(broker: &Mortard) -> Consumer {
    ok(broker, &["topics", "create", "jobs", "--partitions", "1"]);
    ok(broker, &["pub", "jobs", "--key", "j1", "--value", "bad"]);
    ok(broker, &["pub", "jobs", "--key", "j2", "--value", "good"]);
    let mut c = Consumer::connect(broker.addr).unwrap();
    c.subscribe("workers", "jobs", StartPolicy::Earliest)
        .unwrap();
    for _ in 0..2 {
        let m = c.poll(Some(RUN_TIMEOUT)).unwrap().expect("a record");
        if &*m.value == b"bad" {
            assert!(m.reject());
        } else {
            assert!(m.ack());
        }
    }
    let twin = "/topics/jobs.dlq/partitions/0/records";
    wait_for("the dead letter", || {
        !sequences(&get(broker, twin).1).is_empty()
    });
    c
}

#[test]
fn a_dead_letter_twin_reads_with_its_origin() {
    let broker = Mortard::start(&[]);
    let _c = one_dead_letter(&broker);
    let (status, doc) = get(&broker, "/topics/jobs.dlq/partitions/0/records");
    assert_eq!(status, 200);
    assert_eq!(doc["dlq_twin"], true);
    let r = &doc["records"][0];
    assert_eq!(
        (r["key"].as_str(), r["value"].as_str()),
        (Some("j1"), Some("bad"))
    );
    let o = &r["origin"];
    assert_eq!(
        (
            o["topic"].as_str(),
            o["partition"].as_u64(),
            o["sequence"].as_u64()
        ),
        (Some("jobs"), Some(0), Some(1))
    );
    assert_eq!(
        (
            o["reason"].as_str(),
            o["attempts"].as_u64(),
            o["group"].as_str()
        ),
        (Some("REJECTED"), Some(1), Some("workers"))
    );
    let (_, source) = get(&broker, "/topics/jobs/partitions/0/records");
    assert!(source["records"][0].get("origin").is_none());
}

#[test]
fn peek_prints_records_without_consuming_them() {
    let broker = Mortard::start(&[]);
    ok(&broker, &["topics", "create", "logs", "--partitions", "2"]);
    ok(
        &broker,
        &["pub", "logs", "--partition", "0", "--value", "a0"],
    );
    ok(
        &broker,
        &["pub", "logs", "--partition", "1", "--value", "b0"],
    );
    ok(
        &broker,
        &[
            "pub",
            "logs",
            "--partition",
            "0",
            "--key",
            "k",
            "--value",
            "a1",
        ],
    );
    assert_eq!(
        ok(&broker, &["peek", "logs"]),
        "a0\na1\nb0\n",
        "every partition, in turn"
    );
    assert_eq!(
        ok(&broker, &["peek", "logs", "--partition", "0", "--max", "1"]),
        "a0\n"
    );
    let meta = ok(
        &broker,
        &["peek", "logs", "--partition", "0", "--from", "2", "--meta"],
    );
    let cells: Vec<&str> = meta.trim_end().split('\t').collect();
    assert_eq!(
        (cells[0], cells[1], cells[3], cells[4]),
        ("0", "2", "k", "a1"),
        "{meta}"
    );
    assert!(
        cells[2].parse::<u64>().unwrap() > 1_600_000_000_000,
        "a time in ms"
    );
    let json = ok(&broker, &["peek", "logs", "--partition", "1", "--json"]);
    let r: Value = serde_json::from_str(json.trim_end()).unwrap();
    assert_eq!(
        (r["partition"].as_u64(), r["value"].as_str()),
        (Some(1), Some("b0"))
    );
    // Anything stamped from an hour ago on: all of it; from the future: none.
    assert_eq!(
        ok(
            &broker,
            &["peek", "logs", "--from-time", "1h", "--max", "5"]
        ),
        "a0\na1\nb0\n"
    );
    assert_eq!(
        ok(&broker, &["peek", "logs", "--from-time", "99999999999999"]),
        ""
    );
    // A group reading after all that still gets every record: peek moved nothing.
    let got = ok(&broker, &["sub", "logs", "--group", "g", "--count", "3"]);
    let mut got: Vec<&str> = got.lines().collect();
    got.sort_unstable();
    assert_eq!(got, ["a0", "a1", "b0"]);

    let unknown = ctl(&broker, &["peek", "nope"]);
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("no topic named 'nope' (UNKNOWN_TOPIC)"),
        "{}",
        text(&unknown.stderr)
    );
    let both = ctl(
        &broker,
        &["peek", "logs", "--from", "1", "--from-time", "1h"],
    );
    assert_eq!(both.status.code(), Some(2), "{}", text(&both.stderr));
    assert_eq!(ctl(&broker, &["peek", "bad name"]).status.code(), Some(2));
    assert_eq!(
        ctl(&broker, &["peek", "logs", "--max", "0"]).status.code(),
        Some(2)
    );
    assert_eq!(ok(&broker, &["tail", "logs", "-n", "0"]), "");
    assert_eq!(ok(&broker, &["tail", "logs", "-n", "1"]), "a1\nb0\n");
}

#[test]
fn tail_f_prints_a_record_published_after_it_started_and_ends_with_its_reader() {
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "events", "--partitions", "1"],
    );
    ok(&broker, &["pub", "events", "--value", "old"]);
    ok(&broker, &["pub", "events", "--value", "last"]);
    let mut child = ctl_command(
        &broker,
        &["tail", "-f", "-n", "1", "events", "--poll", "20ms"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    // The reader takes two lines and then lets go of the pipe, as `head -2` would.
    let (lines, got) = mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().take(2) {
            lines.send(line.unwrap()).unwrap();
        }
    });
    assert_eq!(got.recv_timeout(RUN_TIMEOUT).unwrap(), "last");
    assert!(
        got.recv_timeout(Duration::from_millis(200)).is_err(),
        "nothing new yet"
    );
    ok(&broker, &["pub", "events", "--value", "new"]);
    assert_eq!(got.recv_timeout(RUN_TIMEOUT).unwrap(), "new");
    reader.join().unwrap();
    let deadline = Instant::now() + RUN_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("tail -f went on after its reader closed the pipe");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
}

#[test]
fn dlq_list_shows_origins_and_replay_makes_dead_letters_consumable_again() {
    let broker = Mortard::start(&[]);
    let mut c = one_dead_letter(&broker);
    let list = ok(&broker, &["dlq", "list", "jobs"]);
    assert_eq!(
        list,
        "0\t1\tfrom jobs/0@1 REJECTED after 1 attempts by group workers\tkey=j1\tbad\n"
    );
    let json = ok(&broker, &["dlq", "list", "jobs.dlq", "--json"]);
    let r: Value = serde_json::from_str(json.trim_end()).unwrap();
    assert_eq!(r["origin"]["group"], "workers");

    let replay = ok(&broker, &["dlq", "replay", "jobs"]);
    assert_eq!(
        replay,
        "replayed 1 dead letters from jobs.dlq to jobs (partition 0: sequences 1-1, \
         next --from 2); they stay in jobs.dlq\n"
    );
    // The group that rejected it gets it again, as a new record of jobs.
    let m = c
        .poll(Some(RUN_TIMEOUT))
        .unwrap()
        .expect("the replayed record");
    assert_eq!(
        (&*m.key, &*m.value, m.sequence, m.origin.is_some()),
        (&b"j1"[..], &b"bad"[..], 3, false)
    );
    assert!(m.ack());
    assert_eq!(
        ok(&broker, &["dlq", "list", "jobs"]),
        list,
        "replay removes nothing"
    );
    let none = ok(&broker, &["dlq", "replay", "jobs", "--from", "2"]);
    assert_eq!(
        none,
        "replayed 0 dead letters from jobs.dlq to jobs; they stay in jobs.dlq\n"
    );
    let future = ["dlq", "replay", "jobs", "--from-time", "99999999999999"];
    assert!(ok(&broker, &future).starts_with("replayed 0 dead letters"));
}

#[test]
fn the_readme_peeks_and_replays_dead_letters_as_written() {
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "orders", "--partitions", "2"],
    );
    ok(
        &broker,
        &["pub", "orders", "--partition", "0", "--value", "fine"],
    );
    ok(
        &broker,
        &[
            "pub",
            "orders",
            "--partition",
            "0",
            "--key",
            "k",
            "--value",
            "poison",
        ],
    );
    let mut c = Consumer::connect(broker.addr).unwrap();
    c.subscribe("billing", "orders", StartPolicy::Earliest)
        .unwrap();
    for _ in 0..2 {
        let m = c.poll(Some(RUN_TIMEOUT)).unwrap().expect("a record");
        let _ = if &*m.value == b"poison" {
            m.reject()
        } else {
            m.ack()
        };
    }
    let twin = "/topics/orders.dlq/partitions/0/records";
    wait_for("the dead letter", || {
        !sequences(&get(&broker, twin).1).is_empty()
    });

    let mut printed = String::new();
    for heading in ["Look without consuming", "Dead letters"] {
        for line in readme_block(heading).lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(words[0], "mortarctl", "{line}");
            printed += &ok(&broker, &words[1..]);
        }
    }
    for shown in [
        "0\t1\t",
        "\tfine\n",
        "\tk\tpoison\n",
        "from orders/0@2 REJECTED",
        "replayed 1",
    ] {
        assert!(printed.contains(shown), "{shown:?} not in {printed}");
    }
    let m = c
        .poll(Some(RUN_TIMEOUT))
        .unwrap()
        .expect("the replayed record");
    assert_eq!((&*m.value, m.sequence), (&b"poison"[..], 3));
}
