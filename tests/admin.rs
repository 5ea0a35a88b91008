//! The admin HTTP surface (issue 6): /healthz, /metrics, /stats over real HTTP.

mod common;

use std::io::Write as _;
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use common::repo::promtool_check;
use mortarmq::admin::{Kind, METRICS};
use mortarmq::client::Client;
use mortarmq::wire::limits::SUB_PARTITION_ANY;
use mortarmq::wire::ops::{Frame, Sub, SubResult};
use mortarmq::wire::{DeclareFlags, Durability, StartPolicy, SubFlags};

#[test]
fn healthz_metrics_stats_and_errors() {
    // A data directory whose name needs JSON escaping.
    let broker = Mortard::start_in("da\"ta\\dir", &[]);
    let mut c = broker.client();
    let topic = c
        .declare("orders", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..5u8 {
        c.publish_value(topic, 0, &[i], Some(Durability::Fsynced))
            .unwrap();
    }

    assert_eq!(broker.http("GET", "/healthz"), (200, "ok\n".to_string()));
    assert_eq!(broker.http("GET", "/nope").0, 404);
    assert_eq!(broker.http("POST", "/stats").0, 405);

    let (status, body) = broker.http("GET", "/stats");
    assert_eq!(status, 200);
    let stats: serde_json::Value = serde_json::from_str(&body).expect("valid JSON");
    assert!(stats["broker"]["data_dir"]
        .as_str()
        .unwrap()
        .ends_with("da\"ta\\dir"));
    assert_eq!(stats["broker"]["leader_epoch"], 1);
    assert!(stats["broker"]["rss_bytes"].as_u64().unwrap() > 0);
    let topics = stats["topics"].as_array().unwrap();
    assert_eq!(topics.len(), 2, "source and twin");
    assert_eq!(topics[0]["name"], "orders");
    assert_eq!(topics[1]["name"], "orders.dlq");
    assert_eq!(topics[0]["partitions"][0]["last_sequence"], 5);
    assert_eq!(topics[0]["partitions"][0]["commit_sequence"], 5);
    assert!(stats["fsync"]["count"].as_u64().unwrap() >= 1);
    let (_, pretty) = broker.http("GET", "/stats?pretty");
    assert!(pretty.contains("\n  \"broker\": {"));
    let _: serde_json::Value = serde_json::from_str(&pretty).unwrap();

    let (status, metrics) = broker.http("GET", "/metrics");
    assert_eq!(status, 200);
    for line in metrics
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        let value = line.rsplit(' ').next().unwrap();
        assert!(value.parse::<f64>().is_ok(), "bad sample line: {line}");
    }
    assert!(metrics.contains("# TYPE mortar_fsync_seconds histogram"));
    assert!(metrics.contains("mortar_pubs_total 5"));
    assert!(metrics.contains("mortar_frames_in_total{op=\"PUB\"} 5"));
    assert!(metrics.contains("mortar_records_appended_total{topic=\"orders\"} 5"));

    // A data directory the broker cannot write to makes /healthz say so (the probe
    // path taken by a directory: even root cannot write a file there).
    std::fs::create_dir(broker.data_dir().join(".healthz-probe")).unwrap();
    let (status, body) = broker.http("GET", "/healthz");
    assert_eq!(status, 503);
    assert!(body.contains("not writable"), "{body}");
}

#[test]
fn admin_listen_off_binds_nothing() {
    let broker = Mortard::start(&["--admin-listen", "off"]);
    assert!(broker.admin.is_none());
    broker.client().ping().unwrap();
}

/// A broker with something in every part of /stats: a topic with records, a group
/// with a member and partitions. Returns the member's client, which must stay open.
fn busy_broker() -> (Mortard, Client) {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let topic = c
        .declare("orders", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..5u8 {
        c.publish_value(topic, u16::from(i % 2), &[i], Some(Durability::Fsynced))
            .unwrap();
    }
    let _: SubResult = c
        .request(&Frame::Sub(Sub {
            group: b"billing",
            topic_id: topic,
            partition: SUB_PARTITION_ANY,
            start_policy: StartPolicy::Earliest.as_code(),
            credit_count: 0,
            credit_bytes: 0,
            flags: SubFlags::empty(),
        }))
        .unwrap()
        .typed()
        .unwrap();
    (broker, c)
}

/// The leaves of a /stats document as dotted paths, arrays as `[]` (the table's
/// notation), with whether the value is a number.
fn leaves(value: &serde_json::Value, path: String, out: &mut Vec<(String, bool)>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_string()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        serde_json::Value::Object(fields) => {
            fields.iter().for_each(|(k, v)| leaves(v, join(k), out));
        }
        serde_json::Value::Array(items) => {
            items
                .iter()
                .for_each(|v| leaves(v, format!("{path}[]"), out));
        }
        v => out.push((path, v.is_number())),
    }
}

/// Every figure a real /stats shows is a row of the table, and /metrics has that row's
/// family, or the table says where /metrics shows it instead (a label on the samples,
/// or the family it is derived from); only names, ids and states are shown nowhere.
#[test]
fn every_stats_figure_has_a_metrics_family() {
    let (broker, _member) = busy_broker();
    let (_, stats) = broker.http("GET", "/stats");
    let (_, metrics) = broker.http("GET", "/metrics");
    let mut figures = Vec::new();
    leaves(
        &serde_json::from_str(&stats).unwrap(),
        String::new(),
        &mut figures,
    );
    for needed in [
        "groups[].members[].credit_bytes",
        "groups[].partitions[].lag",
    ] {
        assert!(
            figures.iter().any(|(p, _)| p == needed),
            "no {needed} in {stats}"
        );
    }
    for (path, numeric) in figures {
        // A by-label figure (connections.closed.peer_closed) is its row's object.
        let row = METRICS.iter().find(|m| {
            m.path.is_some_and(|p| {
                p == path
                    || path
                        .strip_prefix(p)
                        .is_some_and(|r| r.starts_with('.') && !r[1..].contains('.'))
            })
        });
        let row = row.unwrap_or_else(|| panic!("/stats {path}: no row in the table"));
        let shown_as = row.family.or(row.elsewhere);
        match shown_as {
            Some(family) if family.starts_with("mortar_") || family.starts_with("process_") => {
                let typed = format!("\n# TYPE {family} ");
                assert!(
                    metrics.contains(&typed),
                    "/stats {path}: no {family} in {metrics}"
                );
                let sampled = format!("\n{family}");
                assert!(
                    metrics.contains(&sampled),
                    "/stats {path}: {family} has no sample"
                );
            }
            Some(label) => {
                let labelled = format!("{label}=\"");
                assert!(
                    metrics.contains(&labelled),
                    "/stats {path}: no {label} label"
                );
            }
            None => assert!(
                row.kind == Kind::Info || !numeric,
                "/stats {path}: a figure /metrics does not show"
            ),
        }
    }
}

/// `promtool check metrics` (the Prometheus project's own linter: exposition syntax,
/// HELP and TYPE, `_total` on counters, base units) finds nothing in a real /metrics.
/// tools/test.sh installs it (package prometheus) where it is missing.
#[test]
fn metrics_pass_promtool_check() {
    let (broker, _member) = busy_broker();
    let (status, metrics) = broker.http("GET", "/metrics");
    assert_eq!(status, 200);
    promtool_check(&metrics);
    for family in [
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ] {
        assert!(metrics.contains(&format!("\n{family} ")), "no {family}");
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(metrics.contains(&format!("\nmortar_build_info{{version=\"{version}\"}} 1\n")));
    assert!(!metrics.contains("9999999"), "float noise in {metrics}");
}

/// A refused token closes the connection as `auth_failed`, not as a protocol error.
#[test]
fn a_refused_token_is_counted_as_auth_failed() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    let broker = Mortard::start(&["--token-file", tokens.to_str().unwrap()]);
    assert!(Client::connect(broker.addr, b"wrong").is_err());
    let counted = "mortar_connections_closed_total{reason=\"auth_failed\"} 1\n";
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let (_, metrics) = broker.http("GET", "/metrics");
        if metrics.contains(counted) || Instant::now() > deadline {
            break metrics;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(metrics.contains(counted), "{metrics}");
    assert!(metrics.contains("mortar_connections_closed_total{reason=\"protocol_error\"} 0\n"));
}

/// A connection the broker closes because it stops is closed as `shutdown` (its log
/// line names the reason /metrics counts), not as a protocol error.
#[test]
fn a_shutdown_close_is_counted_as_shutdown() {
    // Close lines are at debug, and the harness sets RUST_LOG=info: a shell sets it
    // for the broker (and stays its parent, as `start_wrapped` expects).
    let script = "RUST_LOG=debug \"$@\"; exit $?";
    let shell = |_: &std::path::Path| ["sh", "-c", script, "sh"].map(String::from).to_vec();
    let mut broker = Mortard::start_wrapped(shell, &[]);
    let mut c = broker.client();
    c.ping().unwrap();
    assert!(broker.terminate().success());
    let log = broker.log_text();
    assert!(log.contains("closed: shutdown"), "{log}");
    assert!(!log.contains("closed: protocol_error"), "{log}");
}

/// The samples of one `/metrics` family with a single label: label value → count.
fn by_label(metrics: &str, family: &str) -> std::collections::BTreeMap<String, u64> {
    let prefix = format!("{family}{{");
    metrics
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|l| {
            let (label, value) = l.split_once("} ").unwrap();
            let label = label.split_once('"').unwrap().1.trim_end_matches('"');
            (label.to_string(), value.parse().unwrap())
        })
        .collect()
}

/// `frames_in` is by the ops clients send (and the bad ones), `frames_out` by the ops
/// the broker sends, named as the spec names them; MSGs pushed and pulled both count.
#[test]
fn frames_are_counted_by_the_ops_each_side_sends() {
    use mortarmq::client::{Consumer, Producer};
    use mortarmq::wire::ops::Op;
    let broker = Mortard::start(&[]);
    let mut p = Producer::builder(broker.addr).declare(1).connect().unwrap();
    for v in ["a", "b", "c"] {
        p.publish("t", "", v, None).unwrap();
    }
    p.close().unwrap();
    for (group, pull) in [("pushed", false), ("pulled", true)] {
        let mut c = Consumer::builder(broker.addr).pull(pull).connect().unwrap();
        c.subscribe(group, "t", StartPolicy::Earliest).unwrap();
        for _ in 0..3 {
            let m = c
                .poll(Some(Duration::from_secs(20)))
                .unwrap()
                .expect("a record");
            m.ack();
        }
        c.close().unwrap();
    }
    // A frame of an op only the broker sends (OK), then an illegal one (0xFF).
    for op in [Op::Ok as u8, 0xFF] {
        let mut s = broker.raw();
        s.write_all(&[0, 0, 0, 1, op]).unwrap();
        let mut answer = Vec::new();
        let _ = std::io::Read::read_to_end(&mut s, &mut answer);
    }
    let (_, metrics) = broker.http("GET", "/metrics");
    let frames_in = by_label(&metrics, "mortar_frames_in_total");
    let client_ops = Op::ALL.iter().filter(|op| !op.is_server_only());
    let mut want: Vec<&str> = client_ops.map(|op| op.name()).collect();
    want.extend(["SERVER_ONLY", "RESERVED", "ILLEGAL"]);
    assert_eq!(frames_in.keys().collect::<Vec<_>>().len(), want.len());
    for name in &want {
        assert!(frames_in.contains_key(*name), "{name}: {frames_in:?}");
    }
    assert_eq!(frames_in["PUB"], 3);
    assert_eq!(frames_in["ACK"], 6);
    assert_eq!(frames_in["SERVER_ONLY"], 1);
    assert_eq!(frames_in["ILLEGAL"], 1);
    assert_eq!(frames_in["RESERVED"], 0);
    let frames_out = by_label(&metrics, "mortar_frames_out_total");
    let labels: Vec<&str> = frames_out.keys().map(String::as_str).collect();
    assert_eq!(labels, ["ERR", "MSG", "NOTICE", "OK"]);
    assert_eq!(frames_out["MSG"], 6, "3 pushed, 3 in PULL answers");
    let errors = by_label(&metrics, "mortar_errors_total");
    assert_eq!(errors["NOT_CONNECTED"], 1, "{errors:?}: OK before CONNECT");
    assert_eq!(errors["ILLEGAL_OP"], 1);
    assert_eq!(frames_out["ERR"], errors.values().sum::<u64>());
    assert!(frames_out["NOTICE"] >= 2, "an ASSIGN to each member");
}
