use super::*;
use crate::broker::{FSYNC_BATCH_BUCKETS, FSYNC_LATENCY_BUCKETS_US};
use crate::consume::{
    ConsumeStats, GroupSnapshot, MemberSnapshot, OwnershipState, PartitionSnapshot,
};

#[test]
fn json_strings_are_escaped() {
    let doc = Json::Obj(vec![("k", Json::Str("a\"b\\c\n\u{1}é".into()))]);
    assert_eq!(doc.render(false), r#"{"k":"a\"b\\c\n\u0001é"}"#);
    assert!(doc.render(true).contains("\n  \"k\": "));
}

#[test]
fn metrics_have_help_and_type_for_every_family() {
    let text = render_metrics(&Snapshot::default());
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = name
            .strip_suffix("_bucket")
            .or(name.strip_suffix("_sum"))
            .or(name.strip_suffix("_count"))
            .unwrap_or(name);
        assert!(
            text.contains(&format!("# TYPE {family} ")),
            "no TYPE for {name}"
        );
        assert!(
            text.contains(&format!("# HELP {family} ")),
            "no HELP for {name}"
        );
    }
}

fn partition(partition: u16, first: u64, last: u64, bytes: u64) -> PartitionFigures {
    PartitionFigures {
        partition,
        first_sequence: first,
        last_sequence: last,
        commit_sequence: last.saturating_sub(1),
        bytes,
        segments: u32::from(partition) + 1,
        poisoned: false,
        producers: u64::from(partition) * 2,
    }
}

fn member(member_id: u64, pull_mode: bool) -> MemberSnapshot {
    MemberSnapshot {
        member_id,
        membership_epoch: 2,
        assignment_epoch: 3,
        conn: 7,
        subscription_id: 4,
        pull_mode,
        credit_count: 16,
        credit_bytes: 65_536,
        credit_epoch: 1,
        outstanding_count: 5,
        outstanding_bytes: 2_048,
        pending_pulls: 0,
    }
}

fn group_partition(partition: u16, owner: Option<u64>, state: OwnershipState) -> PartitionSnapshot {
    PartitionSnapshot {
        partition,
        owner,
        state,
        ownership_epoch: 9,
        committed: 40,
        next_sequence: 45,
        outstanding: 3,
        pending_redeliveries: 1,
        dead_letter_pending: 0,
    }
}

/// A broker with something in every part of the snapshot: several topics (one with
/// a name that needs escaping, one poisoned, one without partitions), groups with and
/// without members, on known and unknown topics, errors with known and unknown codes,
/// and both histograms filled.
fn busy() -> Snapshot {
    let mut broker = BrokerCounters {
        pubs: 120,
        pubs_deduplicated: 3,
        pubs_non_idempotent: 17,
        records_appended: 117,
        fsyncs: 7,
        fsync_records: 117,
        fsync_failures: 1,
        fsync_micros_total: 12_345,
        recovery_truncations: 1,
        recovery_truncated_bytes: 77,
        producers_expired: 2,
        producers_evicted: 5,
        dead_letters_appended: 4,
        corrupt_records_found: 2,
        fsync_micros_max: 1_500_000,
        ..BrokerCounters::default()
    };
    broker.fsync_latency[0] = 1;
    broker.fsync_latency[3] = 4;
    broker.fsync_latency[FSYNC_LATENCY_BUCKETS_US.len()] = 2;
    broker.fsync_batch[2] = 5;
    broker.fsync_batch[FSYNC_BATCH_BUCKETS.len()] = 2;
    let mut poisoned = partition(0, 1, 9, 900);
    poisoned.poisoned = true;
    let topics = vec![
        TopicFigures {
            topic_id: 1,
            name: "orders".into(),
            dlq_twin: false,
            partitions: vec![partition(0, 1, 60, 6_000), partition(1, 5, 57, 2_000_000)],
        },
        TopicFigures {
            topic_id: 2,
            name: "orders.dlq".into(),
            dlq_twin: true,
            partitions: vec![partition(0, 0, 0, 0), partition(1, 1, 4, 400)],
        },
        TopicFigures {
            topic_id: 3,
            name: "we\"ird\\name".into(),
            dlq_twin: false,
            partitions: vec![poisoned],
        },
        TopicFigures {
            topic_id: 5,
            name: "empty".into(),
            dlq_twin: false,
            partitions: vec![],
        },
    ];
    let groups = vec![
        GroupSnapshot {
            group_id: 1,
            name: b"billing".to_vec(),
            topic_id: 1,
            members: vec![member(11, false), member(12, true)],
            partitions: vec![
                group_partition(0, Some(11), OwnershipState::Owned),
                group_partition(1, None, OwnershipState::Unowned),
            ],
        },
        GroupSnapshot {
            group_id: 2,
            name: b"au\"dit".to_vec(),
            topic_id: 3,
            members: vec![],
            partitions: vec![group_partition(0, Some(13), OwnershipState::Revoking)],
        },
        GroupSnapshot {
            group_id: 3,
            name: b"orphan".to_vec(),
            topic_id: 9,
            members: vec![member(14, false)],
            partitions: vec![group_partition(2, Some(14), OwnershipState::Assigning)],
        },
    ];
    Snapshot {
        version: "0.1.0-golden",
        uptime_ms: 123_456,
        leader_epoch: 3,
        rss_bytes: 6_680_576,
        data_dir: PathBuf::from("/var/lib/mortar \"q\""),
        max_data_bytes: 10 << 30,
        process: ProcessFigures {
            resident_bytes: 6_680_576,
            virtual_bytes: 120_000_000,
            open_fds: 12,
            max_fds: 1_024,
            start_time_us: 1_764_590_400_010_000,
            cpu_us: 1_230_000,
        },
        connections_open: 4,
        connections_accepted: 17,
        connections_refused: 2,
        connections_closed: vec![
            ("peer_closed", 9),
            ("protocol_error", 1),
            ("auth_failed", 2),
            ("shutdown", 0),
        ],
        frames_in: vec![
            ("PUB", 120),
            ("ACK", 30),
            ("NACK", 2),
            ("SERVER_ONLY", 1),
            ("RESERVED", 1),
            ("ILLEGAL", 0),
        ],
        frames_out: vec![("OK", 140), ("ERR", 4), ("MSG", 33), ("NOTICE", 2)],
        errors_sent: BTreeMap::from([(0x2001, 1), (0x4004, 2), (0xFFFF, 1)]),
        bytes_in: 65_432,
        bytes_out: 1_234_567,
        backpressure_pauses: 6,
        buffered_bytes: 3_000,
        broker,
        topics,
        groups: CoordinatorSnapshot {
            groups,
            stats: ConsumeStats {
                deliveries: 33,
                redeliveries: 5,
                expired: 2,
                dead_letters: 1,
                skipped_records: 8,
                read_retries: 4,
                notices: 6,
                groups_expired: 3,
                assigns_taken_back: 1,
            },
        },
        cluster: None,
    }
}

/// The resident set size is read from /proc when rendering; everything else is the
/// snapshot's, so only that value is masked.
fn mask_rss(text: &str) -> String {
    text.split_inclusive('\n')
        .map(|line| {
            let sample = "mortar_rss_bytes ";
            let keep = if line.starts_with(sample) {
                Some(sample.len())
            } else {
                ["\"rss_bytes\": ", "\"rss_bytes\":"]
                    .iter()
                    .find_map(|p| line.find(p).map(|at| at + p.len()))
            };
            match keep {
                Some(end) => {
                    let rest = line[end..].trim_start_matches(|c: char| c.is_ascii_digit());
                    format!("{}RSS{rest}", &line[..end])
                }
                None => line.to_string(),
            }
        })
        .collect()
}

/// Compares with a golden file, showing where the first difference is (the compact
/// JSON document is a single line).
fn assert_golden(file: &str, golden: &str, rendered: &str) {
    const CONTEXT_CHARS: usize = 60;
    let rendered = mask_rss(rendered);
    let at = golden
        .bytes()
        .zip(rendered.bytes())
        .position(|(g, r)| g != r)
        .unwrap_or(golden.len().min(rendered.len()));
    let line = golden[..at].matches('\n').count() + 1;
    let near = |text: &str| {
        let from = text.floor_char_boundary(at.saturating_sub(CONTEXT_CHARS));
        let to = text.ceil_char_boundary((at + CONTEXT_CHARS).min(text.len()));
        text[from..to].to_string()
    };
    assert!(
        golden == rendered,
        "src/admin/golden/{file} differs from the rendering at line {line}:\n  golden:   \
         {:?}\n  rendered: {:?}\n/metrics and /stats are read by scrapers, dashboards and \
         `mortarctl`: change the golden file only with them.",
        near(golden),
        near(&rendered),
    );
}

#[test]
fn metrics_match_the_golden_text() {
    let golden = include_str!("golden/metrics.txt");
    assert_golden("metrics.txt", golden, &render_metrics(&busy()));
}

#[test]
fn stats_match_the_golden_json() {
    let compact = include_str!("golden/stats.json");
    assert_golden("stats.json", compact, &render_stats(&busy(), false));
    let pretty = include_str!("golden/stats.pretty.json");
    assert_golden("stats.pretty.json", pretty, &render_stats(&busy(), true));
}

#[test]
fn the_resident_set_size_comes_from_the_snapshot() {
    let s = busy();
    assert!(render_metrics(&s).contains("\nmortar_rss_bytes 6680576\n"));
    assert!(render_stats(&s, false).contains("\"rss_bytes\":6680576,"));
}

/// The rules the renderers rely on, and Prometheus naming: one row per family and per
/// path, every path under a known section and through the arrays its `Read` walks,
/// counters (only they) ending in `_total`, times exported in seconds.
#[test]
fn every_row_of_the_table_is_consistent() {
    let (mut families, mut paths) = (Vec::new(), Vec::new());
    for m in METRICS {
        let name = m.family.or(m.path).expect("a row someone shows");
        assert!(!m.help.is_empty(), "{name}: no HELP");
        if let Some(family) = m.family {
            assert!(!families.contains(&family), "{family} twice");
            families.push(family);
            let standard = family.starts_with("process_");
            assert!(family.starts_with("mortar_") || standard, "{family}");
            assert_ne!(m.kind, Kind::Info, "{family}: Info rows are never exported");
            let counter = m.kind == Kind::Counter;
            assert_eq!(
                family.ends_with("_total"),
                counter,
                "{family}: _total and counter"
            );
            if matches!(m.unit, Unit::Milliseconds | Unit::Microseconds) {
                assert!(
                    family.ends_with("_seconds") || family.ends_with("_seconds_total"),
                    "{family}: exported in seconds"
                );
            }
        }
        let Some(path) = m.path else { continue };
        assert!(!paths.contains(&path), "{path} twice");
        paths.push(path);
        let section = path.split(['.', '[']).next().unwrap();
        assert!(STATS_SECTIONS.contains(&section), "{path}: unknown section");
        let through = match m.read {
            Read::Scalar(_) | Read::ByLabel(..) => "",
            Read::PerTopic(_) => "topics[].",
            Read::PerPartition(_) => "topics[].partitions[].",
            Read::PerGroup(_) => "groups[].",
            Read::PerMember(_) => "groups[].members[].",
            Read::PerGroupPartition(_) => "groups[].partitions[].",
            Read::Cluster(_) | Read::ClusterByLabel(..) => "cluster.",
            Read::PerPeer(_) => "cluster.peers[].",
            Read::Histogram { .. } | Read::ClusterLabel(..) => {
                panic!("{path}: only /metrics shows it")
            }
        };
        let rest = path
            .strip_prefix(through)
            .unwrap_or_else(|| panic!("{path}: {through}"));
        assert!(
            !rest.contains("[]"),
            "{path}: more arrays than its Read walks"
        );
    }
}

#[test]
fn time_bounds_are_written_as_exact_decimals() {
    let us = |n| render::in_seconds(n, Unit::Microseconds);
    assert_eq!(us(100), "0.0001");
    assert_eq!(us(25_000), "0.025");
    assert_eq!(us(50_000), "0.05");
    assert_eq!(us(1_000_000), "1");
    assert_eq!(us(2_500_000), "2.5");
    assert_eq!(us(0), "0");
    assert_eq!(render::in_seconds(1_500, Unit::Milliseconds), "1.5");
    assert_eq!(render::in_seconds(7, Unit::Records), "7");
    for b in FSYNC_LATENCY_BUCKETS_US {
        let text = us(b);
        assert_eq!(text.parse::<f64>().unwrap(), b as f64 / 1e6, "{text}");
        assert!(
            text.len() <= "0.000001".len().max(b.to_string().len()),
            "{text}"
        );
    }
    let metrics = render_metrics(&busy());
    let bounds = metrics.lines().filter_map(|l| l.split("le=\"").nth(1));
    for le in bounds.map(|rest| rest.split('"').next().unwrap()) {
        assert!(
            !le.contains("9999") && !le.contains("0000001"),
            "float noise: {le}"
        );
    }
}

/// The samples of a /metrics text: series (name and labels, as rendered) to value.
fn samples(text: &str) -> BTreeMap<String, String> {
    let lines = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty());
    let split = |l: &str| {
        l.rsplit_once(' ')
            .map(|(k, v)| (k.to_string(), v.to_string()))
    };
    lines.map(|l| split(l).unwrap()).collect()
}

/// The /stats value on `path`, entering element `at[k]` of the k-th array.
fn stats_value<'a>(doc: &'a serde_json::Value, path: &str, at: &[usize]) -> &'a serde_json::Value {
    let mut at = at.iter();
    let mut node = doc;
    for step in path.split('.') {
        node = &node[step.trim_end_matches("[]")];
        if step.ends_with("[]") {
            node = &node[*at.next().unwrap()];
        }
    }
    node
}

/// Every /stats figure is in /metrics with the same value (times in seconds), or the
/// table says where /metrics shows it instead: as a label, or as the family it is
/// derived from. Only rows that name rather than measure may be shown nowhere.
#[test]
fn every_stats_figure_is_in_the_metrics() {
    figures_match(&busy());
    figures_match(&clustered());
}

/// [`busy`] on a cluster node that leads: one peer up and behind, one never heard from.
fn clustered() -> Snapshot {
    let up = PeerFigures {
        id: 2,
        link_up: true,
        last_contact_ms: Some(1_500),
        match_index: Some(40),
        lag: Some(2),
        client_addr: "127.0.0.1:7002".into(),
        admin_addr: "127.0.0.1:8002".into(),
        bytes_in: 900,
        bytes_out: 4_000,
        frames_in: 30,
        frames_out: 31,
    };
    let never = PeerFigures {
        id: 3,
        ..PeerFigures::default()
    };
    Snapshot {
        cluster: Some(ClusterFigures {
            node_id: 1,
            role: "leader",
            term: 4,
            leader_id: 1,
            commit_index: 41,
            applied_index: 41,
            last_index: 42,
            checkpoint_index: 30,
            first_index: 25,
            journal_bytes: 65_536,
            log_clock_ms: 1_764_600_000_123,
            clock_skewed_batches: 0,
            snapshot_bytes_sent: 1 << 20,
            install_bytes_done: 0,
            install_bytes_total: 0,
            refused: vec![("frame", 2), ("raft_ack", 1)],
            peers: vec![up, never],
        }),
        ..busy()
    }
}

/// The cluster figures are there on a cluster node, and a single node's output is the
/// golden one (`stats_match_the_golden_json`) with no trace of them.
#[test]
fn cluster_figures_only_on_a_cluster_node() {
    let single = render_stats(&busy(), false) + &render_metrics(&busy());
    assert!(!single.contains("cluster") && !single.contains("mortar_peer_"));
    let (s, text) = (clustered(), render_metrics(&clustered()));
    let doc: serde_json::Value = serde_json::from_str(&render_stats(&s, false)).unwrap();
    let c = &doc["cluster"];
    assert_eq!(c["role"], "leader");
    assert_eq!(
        (c["leader_id"].as_u64(), c["last_index"].as_u64()),
        (Some(1), Some(42))
    );
    assert_eq!(c["peers"][0]["admin_addr"], "127.0.0.1:8002");
    assert_eq!(c["peers"][0]["lag"], 2);
    assert!(c["peers"][1]["match_index"].is_null() && c["peers"][1]["link_up"] == false);
    let metrics = samples(&text);
    assert_eq!(metrics["mortar_cluster_role{role=\"leader\"}"], "1");
    assert_eq!(metrics["mortar_peer_lag_entries{peer=\"2\"}"], "2");
    assert_eq!(metrics["mortar_peer_last_contact_seconds{peer=\"2\"}"], "1");
    assert!(!metrics.contains_key("mortar_peer_match_index{peer=\"3\"}"));
    assert_eq!(metrics["mortar_peer_link_up{peer=\"3\"}"], "0");
}

fn figures_match(s: &Snapshot) {
    let s = s.clone();
    let (text, doc) = (render_metrics(&s), render_stats(&s, false));
    let (metrics, doc) = (samples(&text), serde_json::from_str(&doc).unwrap());
    for m in METRICS.iter().filter(|m| m.path.is_some() && m.shown(&s)) {
        let path = m.path.unwrap();
        let Some(family) = m.family else {
            match m.elsewhere {
                Some(f) if f.starts_with("mortar_") => {
                    // A histogram's mean or quantile, or a figure /metrics alone
                    // shows in its own unit (fsync.max_ms: mortar_fsync_max_seconds).
                    let from = METRICS.iter().find(|r| r.family == Some(f));
                    assert!(
                        from.is_some_and(|r| r.kind == Kind::Histogram || r.path.is_none()),
                        "{path}: {f}"
                    );
                }
                Some(label) => {
                    let label = format!("{label}=\"");
                    assert!(text.contains(&label), "{path}: no sample labelled {label}");
                }
                None => assert_eq!(m.kind, Kind::Info, "{path}: a figure /metrics lacks"),
            }
            continue;
        };
        // Each value's labels and its place in /stats: a by-label figure is one field
        // of its row's object; the others are walked as the renderers walk them.
        let points: Vec<(metrics::Labels, String, Vec<usize>)> = match &m.read {
            Read::ByLabel(label, read) => read(&s)
                .into_iter()
                .map(|(k, _)| (vec![(*label, k.into())], format!("{path}.{k}"), vec![]))
                .collect(),
            Read::ClusterByLabel(label, read) => (s.cluster.as_ref().map_or(&[][..], read))
                .iter()
                .map(|&(k, _)| (vec![(*label, k.into())], format!("{path}.{k}"), vec![]))
                .collect(),
            read => read
                .points(&s)
                .into_iter()
                .filter(|p| p.value.as_ref().is_some_and(|v| !matches!(v, Json::Null)))
                .map(|p| (p.labels, path.to_string(), p.at))
                .collect(),
        };
        for (labels, path, at) in points {
            let mut series = String::new();
            render::sample(&mut series, family, &labels, "");
            let series = series.trim_end();
            let shown = metrics
                .get(series)
                .unwrap_or_else(|| panic!("no {series} in /metrics"));
            let stats = stats_value(&doc, &path, &at);
            let expected = match (stats, m.unit) {
                (serde_json::Value::Bool(b), _) => u8::from(*b).to_string(),
                (n, Unit::Milliseconds) => (n.as_u64().unwrap() / 1_000).to_string(),
                (n, _) => n.to_string(),
            };
            assert_eq!(*shown, expected, "{series} against /stats {path}");
        }
    }
}
