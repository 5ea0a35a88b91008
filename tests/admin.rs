//! The admin HTTP surface (issue 6): /healthz, /metrics, /stats over real HTTP.

mod common;

use common::mortard::Mortard;
use mortarmq::wire::{DeclareFlags, Durability};

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
