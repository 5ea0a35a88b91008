//! Admin writes (issue 17): group delete and reset, topic purge and describe over the
//! admin listener and through `mortarctl`, with the broker's token; each change
//! survives a kill -9 right after its answer.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::consume::{self, consume_all};
use common::mortarctl;
use common::mortard::Mortard;
use common::wait;
use mortarmq::client::{Client, ClientError, Delivery};
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::{Ack, Frame, Nack, Sub};
use mortarmq::wire::{
    AckFlags, DeclareFlags, Durability, ErrorCode, NackReason, StartPolicy, SubFlags,
};
use serde_json::Value;

const TOKEN: &str = "s3cret-admin";
/// Nothing expires while a test looks; a closed connection ends its member at once.
const FLAGS: &[&str] = &["--ack-wait", "60s", "--session-timeout", "60s"];
/// How long a test waits for a delivery or for the broker to notice a closed member.
const WAIT: Duration = Duration::from_secs(10);

/// One admin request, with `Authorization: Bearer token` when given: (status, head, body).
fn send(broker: &Mortard, method: &str, path: &str, token: Option<&str>) -> (u16, String, Value) {
    let mut s = TcpStream::connect(broker.admin.unwrap()).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    let json = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, head.to_string(), json)
}

/// A request expected to answer `status`; its JSON.
fn expect(broker: &Mortard, method: &str, path: &str, status: u16) -> Value {
    let (got, head, body) = send(broker, method, path, None);
    assert_eq!(got, status, "{method} {path}: {head}\n{body}");
    body
}

fn describe(broker: &Mortard, topic: &str) -> Value {
    expect(broker, "GET", &format!("/topics/{topic}"), 200)
}

/// (committed, lag, members) of group `group` on partition 0 of `topic`.
fn group_on(broker: &Mortard, topic: &str, group: &str) -> Option<(u64, u64, u64)> {
    let d = describe(broker, topic);
    let g = d["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == group)?;
    let p = &g["partitions"][0];
    Some((
        p["committed"].as_u64().unwrap(),
        p["lag"].as_u64().unwrap(),
        g["members"].as_u64().unwrap(),
    ))
}

fn wait_for(what: &str, ready: impl FnMut() -> bool) {
    wait::wait_until(what, WAIT, ready);
}

fn sub(c: &mut Client, group: &str, topic_id: u16) -> Result<(), ClientError> {
    c.request(&Frame::Sub(Sub {
        group: group.as_bytes(),
        topic_id,
        partition: SUB_PARTITION_ANY,
        start_policy: StartPolicy::Earliest.as_code(),
        credit_count: 0,
        credit_bytes: 0,
        flags: SubFlags::empty(),
    }))
    .map(|_| ())
}

/// Answers ASSIGNs and returns the first `n` MSGs.
fn receive(c: &mut Client, n: usize) -> Vec<Delivery> {
    consume::receive(c, n, WAIT)
}

fn ack(c: &mut Client, m: &Delivery) -> Result<(), ClientError> {
    let a: Ack = m.ack(AckFlags::empty());
    c.request(&Frame::Ack(a)).map(|_| ())
}

fn publish(c: &mut Client, topic: u16, n: u8) -> Vec<u64> {
    (0..n)
        .map(|i| {
            let r = c.publish_value(topic, 0, &[i], Some(Durability::Fsynced));
            r.unwrap().sequence
        })
        .collect()
}

fn refused_with(e: &ClientError, code: ErrorCode) -> bool {
    matches!(e, ClientError::Broker { code: c, .. } if *c == code.code())
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Group `g` joins `topic`, receives `n` records and acknowledges the first `acked`;
/// the client is returned still a member, with what it received.
fn member_with_acks(
    broker: &Mortard,
    topic: u16,
    n: usize,
    acked: usize,
) -> (Client, Vec<Delivery>) {
    let mut c = broker.client();
    sub(&mut c, "g", topic).unwrap();
    let got = receive(&mut c, n);
    for m in &got[..acked] {
        ack(&mut c, m).unwrap();
    }
    (c, got)
}

#[test]
fn reset_and_delete_a_group_and_the_changes_survive_kill_9() {
    let mut broker = Mortard::start(&[FLAGS, &["--max-groups", "1"]].concat());
    let mut p = broker.client();
    let topic = p
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish(&mut p, topic, 3);
    let boundary = wall_ms() + 1;
    wait_for("the clock to pass the boundary", || wall_ms() > boundary);
    let later = publish(&mut p, topic, 3);
    assert_eq!(later, [4, 5, 6]);

    let (member, _) = member_with_acks(&broker, topic, 6, 2);
    let reset = "/groups/g/reset?topic=orders&to=earliest";
    let body = expect(&broker, "POST", reset, 409);
    assert_eq!(body["error"], "GROUP_HAS_MEMBERS", "{body}");
    assert_eq!(
        expect(&broker, "DELETE", "/groups/g?topic=orders", 409)["error"],
        "GROUP_HAS_MEMBERS"
    );
    assert_eq!(
        group_on(&broker, "orders", "g"),
        Some((2, 4, 1)),
        "nothing changed"
    );
    drop(member);
    wait_for("the member to leave", || {
        group_on(&broker, "orders", "g").unwrap().2 == 0
    });

    let to = |w: &str| format!("/groups/g/reset?topic=orders&to={w}");
    let body = expect(&broker, "POST", &to(&format!("time:{boundary}")), 200);
    assert_eq!(body["partitions"][0]["next_sequence"], 4, "{body}");
    assert_eq!(group_on(&broker, "orders", "g"), Some((3, 3, 0)));
    expect(&broker, "POST", &to("time:1970-01-01T00:00:00Z"), 200);
    assert_eq!(group_on(&broker, "orders", "g"), Some((0, 6, 0)));
    expect(
        &broker,
        "POST",
        &to("time:2999-01-01T00:00:00%2B02:00"),
        200,
    );
    assert_eq!(
        group_on(&broker, "orders", "g"),
        Some((6, 0, 0)),
        "no record that late"
    );
    let body = expect(
        &broker,
        "POST",
        &format!("{}&partition=0", to("sequence:99")),
        200,
    );
    assert_eq!(
        body["partitions"][0]["next_sequence"], 7,
        "clamped to the end"
    );
    expect(&broker, "POST", &to("sequence:5"), 200);
    // Answered 200: on disk, whatever happens to the process now.
    broker.restart_after_kill9();
    assert_eq!(group_on(&broker, "orders", "g"), Some((4, 2, 0)));
    let mut again = broker.client();
    sub(&mut again, "g", topic).unwrap();
    assert_eq!(
        receive(&mut again, 1)[0].sequence,
        5,
        "delivery resumes at the reset"
    );
    drop(again);
    wait_for("the member to leave", || {
        group_on(&broker, "orders", "g").unwrap().2 == 0
    });

    // --max-groups 1: group g holds the only slot until it is deleted.
    let mut other = broker.client();
    let full = sub(&mut other, "h", topic).unwrap_err();
    assert!(
        refused_with(&full, ErrorCode::GroupLimitReached),
        "{full:?}"
    );
    expect(&broker, "DELETE", "/groups/g?topic=orders", 200);
    assert_eq!(group_on(&broker, "orders", "g"), None);
    broker.restart_after_kill9();
    assert_eq!(
        group_on(&broker, "orders", "g"),
        None,
        "the delete is on disk"
    );
    let mut other = broker.client();
    sub(&mut other, "h", topic).unwrap();
    assert_eq!(
        receive(&mut other, 1)[0].sequence,
        1,
        "h starts by its start policy"
    );
}

/// The group names `/stats` shows.
fn stats_groups(broker: &Mortard) -> Vec<String> {
    let (_, body) = broker.http("GET", "/stats");
    let stats: Value = serde_json::from_str(&body).unwrap();
    let groups = stats["groups"].as_array().unwrap().iter();
    groups
        .map(|g| g["group"].as_str().unwrap().to_string())
        .collect()
}

/// A deleted group's dead letters stay in the twin; its tombstone in the positions file
/// keeps start-up from reading the group back from them (docs/DECISIONS.md, issue 17).
#[test]
fn a_deleted_group_with_dead_letters_stays_deleted_after_kill_9() {
    let mut broker = Mortard::start(&[FLAGS, &["--max-groups", "1"]].concat());
    let mut p = broker.client();
    let topic = p
        .declare("jobs", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish(&mut p, topic, 2);
    let mut c = broker.client();
    sub(&mut c, "g", topic).unwrap();
    let got = receive(&mut c, 2);
    let reject: Nack = got[0].nack(NackReason::Reject);
    c.request(&Frame::Nack(reject)).unwrap();
    ack(&mut c, &got[1]).unwrap();
    drop(c);
    // Committed past the rejected record: its dead letter is durable in jobs.dlq.
    wait_for("the dead letter and the ack to settle", || {
        group_on(&broker, "jobs", "g") == Some((2, 0, 0))
    });
    expect(&broker, "DELETE", "/groups/g?topic=jobs", 200);
    assert_eq!(stats_groups(&broker), Vec::<String>::new());

    broker.restart_after_kill9();
    assert_eq!(
        stats_groups(&broker),
        Vec::<String>::new(),
        "not read back from its dead letter"
    );
    let mut other = broker.client();
    sub(&mut other, "h", topic).expect("g's --max-groups slot is free");
    assert_eq!(receive(&mut other, 1)[0].sequence, 1);
    let dead = describe(&broker, "jobs.dlq");
    assert_eq!(
        dead["partitions"][0]["last_sequence"], 1,
        "the dead letter stays"
    );
}

#[test]
fn refusals_are_json_with_registry_names() {
    let broker = Mortard::start(FLAGS);
    let mut p = broker.client();
    let topic = p
        .declare("orders", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish(&mut p, topic, 1);
    drop(member_with_acks(&broker, topic, 1, 1));
    wait_for("the member to leave", || {
        group_on(&broker, "orders", "g").unwrap().2 == 0
    });

    let cases: &[(&str, &str, u16, &str)] = &[
        ("GET", "/topics/nope", 404, "UNKNOWN_TOPIC"),
        ("POST", "/topics/nope/purge", 404, "UNKNOWN_TOPIC"),
        ("DELETE", "/groups/zz?topic=orders", 404, "UNKNOWN_GROUP"),
        ("DELETE", "/groups/g?topic=nope", 404, "UNKNOWN_TOPIC"),
        ("DELETE", "/groups/g", 400, "INVALID_ARGUMENT"),
        (
            "DELETE",
            "/groups/b%20d?topic=orders",
            400,
            "INVALID_GROUP_NAME",
        ),
        ("GET", "/topics/b%21d", 400, "INVALID_TOPIC_NAME"),
        (
            "POST",
            "/groups/g/reset?topic=orders&to=yesterday",
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "POST",
            "/groups/g/reset?topic=orders&to=latest&partition=9",
            404,
            "UNKNOWN_PARTITION",
        ),
        (
            "POST",
            "/groups/g/reset?topic=orders&to=latest&partition=x",
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "GET",
            "/groups/g/reset?topic=orders&to=latest",
            405,
            "METHOD_NOT_ALLOWED",
        ),
        ("POST", "/topics/orders", 405, "METHOD_NOT_ALLOWED"),
    ];
    for &(method, path, status, name) in cases {
        let (got, head, body) = send(&broker, method, path, None);
        assert_eq!(
            (got, body["error"].as_str()),
            (status, Some(name)),
            "{method} {path}"
        );
        assert!(body["message"].as_str().is_some_and(|m| !m.is_empty()));
        if status == 405 {
            let allow = if method == "GET" {
                "Allow: POST"
            } else {
                "Allow: GET"
            };
            assert!(head.contains(allow), "{head}");
        }
    }
    let (_, _, body) = send(&broker, "GET", "/topics/nope", None);
    assert_eq!(
        body["code"],
        format!("0x{:04X}", ErrorCode::UnknownTopic.code())
    );
    let d = describe(&broker, "orders");
    assert_eq!(d["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(d["paired_with"], "orders.dlq");
    assert_eq!(d["partitions"][0]["records"], 1);
    assert_eq!(describe(&broker, "orders.dlq")["dlq_twin"], true);
}

#[test]
fn changes_need_the_brokers_token_and_reads_stay_open() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("other\n{TOKEN}\n")).unwrap();
    let tokens = tokens.to_str().unwrap();
    let broker = Mortard::start(&["--token-file", tokens]);
    let mut p = Client::connect(broker.addr, TOKEN.as_bytes()).unwrap();
    p.declare("orders", 1, DeclareFlags::empty()).unwrap();

    let purge = "/topics/orders/purge";
    for token in [None, Some("wrong"), Some("")] {
        let (status, head, body) = send(&broker, "POST", purge, token);
        assert_eq!(status, 401, "{token:?}: {body}");
        assert_eq!(body["error"], "AUTH_FAILED");
        assert!(head.contains("WWW-Authenticate: Bearer"), "{head}");
    }
    let (status, _, body) = send(&broker, "POST", purge, Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    let (status, _, _) = send(&broker, "POST", purge, Some("other"));
    assert_eq!(status, 200, "any token of the file");
    let (status, _, body) = send(&broker, "GET", "/topics/orders", None);
    assert_eq!(status, 200, "describe needs no token: {body}");
}

#[test]
fn purge_drops_records_moves_groups_up_and_never_reuses_sequences() {
    let mut broker = Mortard::start(FLAGS);
    let mut p = broker.client();
    let topic = p
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish(&mut p, topic, 5);
    let (mut member, held) = member_with_acks(&broker, topic, 5, 2);
    assert_eq!(group_on(&broker, "orders", "g"), Some((2, 3, 1)));

    let body = expect(&broker, "POST", "/topics/orders/purge", 200);
    assert_eq!(body["partitions"][0]["records_purged"], 5, "{body}");
    assert_eq!(body["partitions"][0]["first_sequence"], 6);
    let d = describe(&broker, "orders");
    let part = &d["partitions"][0];
    assert_eq!(
        (part["first_sequence"].as_u64(), part["records"].as_u64()),
        (Some(6), Some(0))
    );
    assert_eq!(part["segments"], 1);
    assert_eq!(
        group_on(&broker, "orders", "g"),
        Some((5, 0, 1)),
        "in flight moved up"
    );
    let late = ack(&mut member, &held[2]).unwrap_err();
    assert!(refused_with(&late, ErrorCode::UnknownDelivery), "{late:?}");
    assert_eq!(publish(&mut p, topic, 1), [6], "sequences go on");
    assert_eq!(receive(&mut member, 1)[0].sequence, 6);

    broker.restart_after_kill9();
    let part = &describe(&broker, "orders")["partitions"][0];
    assert_eq!(
        (
            part["first_sequence"].as_u64(),
            part["last_sequence"].as_u64()
        ),
        (Some(6), Some(6))
    );
    let mut p = broker.client();
    assert_eq!(publish(&mut p, topic, 1), [7], "not reused after a restart");
    let fresh: Vec<u64> = consume_all(&mut broker.client(), topic)
        .iter()
        .map(|r| r.0)
        .collect();
    assert_eq!(fresh, [6, 7]);
    let twin = expect(&broker, "POST", "/topics/orders.dlq/purge", 200);
    assert_eq!(
        twin["partitions"][0]["records_purged"], 0,
        "the twin is purged on its own"
    );
}

/// `mortarctl --broker B --admin A args…` with `env` (and no other MORTAR_ variable);
/// (exit code, stdout, stderr).
fn ctl(broker: &Mortard, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = mortarctl::against(broker);
    cmd.args(args).envs(env.iter().copied());
    let out = mortarctl::run_to_end(cmd, b"", WAIT)
        .unwrap_or_else(|_| panic!("mortarctl {args:?} did not finish"));
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn mortarctl_describes_resets_deletes_and_purges() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, format!("{TOKEN}\n")).unwrap();
    let broker = Mortard::start(&[FLAGS, &["--token-file", tokens.to_str().unwrap()]].concat());
    let mut p = Client::connect(broker.addr, TOKEN.as_bytes()).unwrap();
    let topic = p
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    publish(&mut p, topic, 4);
    let mut c = Client::connect(broker.addr, TOKEN.as_bytes()).unwrap();
    sub(&mut c, "g", topic).unwrap();
    for m in receive(&mut c, 4) {
        ack(&mut c, &m).unwrap();
    }
    drop(c);

    let (code, out, err) = ctl(&broker, &["topics", "describe", "orders"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("paired with orders.dlq"), "{out}");
    let row = |l: &str| l.split_whitespace().take(4).collect::<Vec<_>>() == ["0", "1", "4", "4"];
    assert!(
        out.lines().any(row),
        "partition 0, first 1, last 4, 4 records: {out}"
    );
    wait_for("the member to leave", || {
        let (_, out, _) = ctl(&broker, &["topics", "describe", "orders", "--json"], &[]);
        serde_json::from_str::<Value>(&out).unwrap()["groups"][0]["members"] == 0
    });

    let reset = [
        "groups",
        "reset",
        "g",
        "--topic",
        "orders",
        "--to",
        "time:1970-01-01T00:00:00Z",
    ];
    let (code, _, err) = ctl(&broker, &reset, &[]);
    assert_eq!(code, 1, "no token: {err}");
    assert!(
        err.contains("AUTH_FAILED") && err.contains("hint:"),
        "{err}"
    );
    let (code, out, err) = ctl(&broker, &reset, &[("MORTAR_TOKEN", TOKEN)]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("reset to time:1970-01-01T00:00:00Z"), "{out}");
    let json = ctl(&broker, &["topics", "describe", "orders", "--json"], &[]).1;
    let d: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(d["groups"][0]["partitions"][0]["lag"], 4, "{d}");

    let bad = [
        "groups",
        "reset",
        "g",
        "--topic",
        "orders",
        "--to",
        "yesterday",
    ];
    assert_eq!(ctl(&broker, &bad, &[]).0, 2, "a usage error");
    let delete = [
        "groups", "delete", "g", "--topic", "orders", "--token", TOKEN,
    ];
    let (code, out, err) = ctl(&broker, &delete, &[]);
    assert_eq!(
        (code, out.trim()),
        (0, "deleted group g on topic orders"),
        "{err}"
    );
    let (code, _, err) = ctl(&broker, &delete, &[]);
    assert_eq!(code, 1);
    assert!(
        err.contains("UNKNOWN_GROUP") && err.contains("404"),
        "{err}"
    );

    let token_file = tokens.to_str().unwrap();
    let purge = ["topics", "purge", "orders", "--token-file", token_file];
    let (code, out, err) = ctl(&broker, &purge, &[]);
    assert_eq!(
        (code, out.trim()),
        (0, "purged 4 records from topic orders"),
        "{err}"
    );
}
