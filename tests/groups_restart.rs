//! Groups after a restart (issue 17): a group whose positions were read back at start is
//! shown by `/stats`, `/metrics` and `mortarctl groups` with its committed positions, its
//! lag and no members, and becomes a normal group, once, when a member joins.

mod common;

use std::time::Duration;

use common::consume;
use common::mortarctl;
use common::mortard::Mortard;
use mortarmq::client::{Client, Delivery};
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::{Ack, Frame, Sub};
use mortarmq::wire::{AckFlags, DeclareFlags, Durability, StartPolicy, SubFlags};
use serde_json::Value;

const TOPIC: &str = "restart";
const GROUP: &str = "g";
/// Records published per partition, and how many of them group g acknowledges.
const RECORDS: [u64; 2] = [6, 4];
const ACKED: [u64; 2] = [3, 1];
/// Longest a single `mortarctl` run may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a delivery the test waits for may take.
const MSG_TIMEOUT: Duration = Duration::from_secs(10);

/// Session and ack-wait long enough that nothing expires while the test looks.
const FLAGS: &[&str] = &["--ack-wait", "60s", "--session-timeout", "60s"];

fn sub(c: &mut Client, topic_id: u16) {
    c.request(&Frame::Sub(Sub {
        group: GROUP.as_bytes(),
        topic_id,
        partition: SUB_PARTITION_ANY,
        start_policy: StartPolicy::Earliest.as_code(),
        credit_count: 0,
        credit_bytes: 0,
        flags: SubFlags::empty(),
    }))
    .unwrap();
}

/// Answers ASSIGNs and returns the MSGs until `n` of them arrived.
fn receive(c: &mut Client, n: usize) -> Vec<Delivery> {
    consume::receive(c, n, MSG_TIMEOUT)
}

fn ack(c: &mut Client, m: &Delivery) {
    let a: Ack = m.ack(AckFlags::empty());
    c.request(&Frame::Ack(a)).unwrap();
}

fn stats(broker: &Mortard) -> Value {
    let (status, body) = broker.http("GET", "/stats");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("valid JSON")
}

/// The groups named g in `/stats`.
fn groups_g(broker: &Mortard) -> Vec<Value> {
    let s = stats(broker);
    let all = s["groups"].as_array().expect("groups array").clone();
    all.into_iter().filter(|g| g["group"] == GROUP).collect()
}

/// `mortarctl --broker B --admin A args…`, expected to exit 0; its stdout.
fn ctl(broker: &Mortard, args: &[&str]) -> String {
    let mut cmd = mortarctl::against(broker);
    cmd.args(args);
    let out = mortarctl::run_to_end(cmd, b"", RUN_TIMEOUT)
        .unwrap_or_else(|_| panic!("mortarctl {args:?} did not finish"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    assert!(
        out.status.success(),
        "mortarctl {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Publishes RECORDS, has group g receive them all and acknowledge ACKED per partition.
fn publish_and_consume_some(broker: &Mortard) -> u16 {
    let mut producer = broker.client();
    let topic = producer
        .declare(TOPIC, 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for (p, &n) in RECORDS.iter().enumerate() {
        for i in 0..n {
            producer
                .publish_value(topic, p as u16, &[i as u8], Some(Durability::Fsynced))
                .unwrap();
        }
    }
    let mut c = broker.client();
    sub(&mut c, topic);
    let total = RECORDS.iter().sum::<u64>() as usize;
    for m in receive(&mut c, total) {
        if m.sequence <= ACKED[usize::from(m.partition)] {
            ack(&mut c, &m);
        }
    }
    topic
}

fn u64_at(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} in {v}"))
}

#[test]
fn a_restored_group_is_shown_with_lag_and_no_members_until_a_member_joins() {
    let mut broker = Mortard::start(FLAGS);
    let topic = publish_and_consume_some(&broker);
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    broker.restart();

    // /stats: the group, no members, its committed positions and lag per partition.
    let found = groups_g(&broker);
    assert_eq!(found.len(), 1, "group g after the restart: {found:?}");
    let g = &found[0];
    assert_eq!(g["topic"], TOPIC);
    assert_eq!(u64_at(g, "group_id"), 0, "not rejoined yet");
    assert!(g["members"].as_array().unwrap().is_empty(), "{g}");
    let parts: Vec<(u64, u64, u64)> = (g["partitions"].as_array().unwrap().iter())
        .map(|p| {
            (
                u64_at(p, "partition"),
                u64_at(p, "committed"),
                u64_at(p, "lag"),
            )
        })
        .collect();
    let want: Vec<(u64, u64, u64)> = (0..2)
        .map(|p| (p as u64, ACKED[p], RECORDS[p] - ACKED[p]))
        .collect();
    assert_eq!(parts, want);

    // /metrics: the lag does not drop to 0 while the consumers are away.
    let (status, metrics) = broker.http("GET", "/metrics");
    assert_eq!(status, 200);
    for p in 0..2 {
        let labels = format!("group=\"{GROUP}\",topic=\"{TOPIC}\",partition=\"{p}\"");
        let line = format!(
            "mortar_consumer_lag_records{{{labels}}} {}",
            RECORDS[p] - ACKED[p]
        );
        assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
    }

    // mortarctl groups list / describe.
    let list = ctl(&broker, &["groups", "list"]);
    let row = list
        .lines()
        .find(|l| l.starts_with("g "))
        .expect("row of g");
    let lag: u64 = RECORDS.iter().zip(ACKED).map(|(r, a)| r - a).sum();
    let want_row = ["g", TOPIC, "0", "2", &lag.to_string(), "0"];
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        want_row,
        "{list}"
    );
    let described = ctl(&broker, &["groups", "describe", GROUP]);
    assert!(described.contains("restored at start"), "{described}");
    assert!(described.contains("no members"), "{described}");

    // A member joins: it continues from the committed positions, the group is one group
    // with one member.
    let mut c = broker.client();
    sub(&mut c, topic);
    let lagging = lag as usize;
    let mut got: Vec<(u16, u64)> = receive(&mut c, lagging)
        .iter()
        .map(|m| (m.partition, m.sequence))
        .collect();
    got.sort();
    let want: Vec<(u16, u64)> = (0..2)
        .flat_map(|p| (ACKED[p] + 1..=RECORDS[p]).map(move |s| (p as u16, s)))
        .collect();
    assert_eq!(got, want, "resumed from the committed positions");
    let found = groups_g(&broker);
    assert_eq!(found.len(), 1, "no duplicate: {found:?}");
    assert_ne!(u64_at(&found[0], "group_id"), 0);
    assert_eq!(found[0]["members"].as_array().unwrap().len(), 1);
    let committed: Vec<u64> = (found[0]["partitions"].as_array().unwrap().iter())
        .map(|p| u64_at(p, "committed"))
        .collect();
    assert_eq!(committed, ACKED.to_vec(), "positions kept");
    let list = ctl(&broker, &["groups", "list"]);
    let row = list
        .lines()
        .find(|l| l.starts_with("g "))
        .expect("row of g");
    assert_eq!(row.split_whitespace().nth(2), Some("1"), "{list}");
}
