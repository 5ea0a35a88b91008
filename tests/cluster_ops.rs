//! The operator's view of a cluster (issue 15 Deliver 4, `docs/REPLICATION.md` §7.5):
//! `/stats` `cluster`, its `/metrics` series, `/healthz` naming the leader, and
//! `mortarctl cluster status`, on three real `mortard` processes on loopback.

mod common;

use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::mortarctl;
use common::mortard::{free_port, Mortard};
use common::repo::{promtool_check, readme_block};
use common::wait::wait_until;
use mortarmq::client::Client;
use mortarmq::wire::DeclareFlags;
use serde_json::Value;

/// Longest an election may take here: 0.5–1.0 s by default, more on a loaded 2-core host.
const ELECTION_LIMIT: Duration = Duration::from_secs(20);
/// How long the survivor of two kills may take to give up its leader: a follower drops
/// it with the link, a leader steps down after an election timeout without a quorum.
const NO_LEADER_LIMIT: Duration = Duration::from_secs(20);
const MORTARCTL_LIMIT: Duration = Duration::from_secs(30);
/// The README's cluster block: three starts, two elections, a few commands.
const README_LIMIT: Duration = Duration::from_secs(120);
/// The README's ports are `74N1`..`74N3` for nodes 1..3: the test moves the `74` to a
/// free block of its own. At most 640, so that `640N3` is a port.
const PORT_PREFIX_MAX: u16 = 640;
const PORT_PREFIX_MIN: u16 = 200;

/// Node `i`'s `/stats` `cluster` section.
fn cluster_of(cluster: &Cluster, i: usize) -> Value {
    let (status, body) = cluster.nodes[i].http("GET", "/stats");
    assert_eq!(status, 200, "{body}");
    let stats: Value = serde_json::from_str(&body).expect("JSON");
    stats["cluster"].clone()
}

/// Waits for node `leader` to lead and every node to name it with all links up.
fn wait_settled(cluster: &Cluster) -> usize {
    let leader = cluster.wait_leader(ELECTION_LIMIT);
    let id = cluster.id(leader);
    wait_until(
        "every node names the leader, links up",
        ELECTION_LIMIT,
        || {
            (0..3).all(|i| {
                let c = cluster_of(cluster, i);
                let links = c["peers"].as_array().unwrap().iter();
                c["leader_id"] == id && links.clone().all(|p| p["link_up"] == true)
            })
        },
    );
    leader
}

fn healthz(node: &Mortard) -> (u16, String) {
    let (status, body) = node.http("GET", "/healthz");
    (status, body.trim().to_string())
}

#[test]
fn stats_and_metrics_show_the_role_term_indexes_and_links_of_leader_and_follower() {
    let cluster = Cluster::start(3, &[]);
    let leader = wait_settled(&cluster);
    let follower = (leader + 1) % 3;
    let (lid, fid) = (cluster.id(leader), cluster.id(follower));

    let l = cluster_of(&cluster, leader);
    assert_eq!(
        (l["node_id"].as_u64(), l["role"].as_str()),
        (Some(lid), Some("leader"))
    );
    assert!(l["term"].as_u64() >= Some(1), "{l}");
    // Entries past the leader's no-op one, so that matching means something.
    let mut c = Client::connect(cluster.nodes[leader].addr, b"").expect("connect");
    c.set_read_timeout(Some(ELECTION_LIMIT)).unwrap();
    let topic_id = c
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for _ in 0..3 {
        c.publish_value(topic_id, 0, b"v", None)
            .expect("REPLICATED by default");
    }
    let l = cluster_of(&cluster, leader);
    assert!(
        l["last_index"].as_u64() >= Some(3) && l["commit_index"] == l["last_index"],
        "{l}"
    );
    wait_until(
        "the leader's followers match its log",
        ELECTION_LIMIT,
        || {
            let l = cluster_of(&cluster, leader);
            let peers = l["peers"].as_array().unwrap().clone();
            peers
                .iter()
                .all(|p| p["match_index"] == l["last_index"] && p["lag"] == 0)
                && l["applied_index"] == l["commit_index"]
        },
    );
    let l = cluster_of(&cluster, leader);
    let to_follower = l["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == fid);
    let to_follower = to_follower.expect("the follower among the leader's peers");
    let f_node = &cluster.nodes[follower];
    assert_eq!(to_follower["client_addr"], f_node.addr.to_string(), "{l}");
    assert_eq!(
        to_follower["admin_addr"],
        f_node.admin.unwrap().to_string(),
        "{l}"
    );
    for counter in ["bytes_in", "bytes_out", "frames_in", "frames_out"] {
        assert!(to_follower[counter].as_u64() > Some(0), "{counter}: {l}");
    }
    assert!(
        to_follower["last_contact_ms"].as_u64() < Some(10_000),
        "{l}"
    );

    let f = cluster_of(&cluster, follower);
    assert_eq!(
        (f["node_id"].as_u64(), f["role"].as_str()),
        (Some(fid), Some("follower"))
    );
    assert_eq!(
        (f["leader_id"].as_u64(), f["term"].clone()),
        (Some(lid), l["term"].clone())
    );
    let to_leader = f["peers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == lid)
        .unwrap();
    assert!(
        to_leader["match_index"].is_null() && to_leader["lag"].is_null(),
        "{f}"
    );
    assert_eq!(
        to_leader["admin_addr"],
        cluster.nodes[leader].admin.unwrap().to_string()
    );

    let (status, metrics) = cluster.nodes[leader].http("GET", "/metrics");
    assert_eq!(status, 200);
    promtool_check(&metrics);
    let sample = |line: String| assert!(metrics.contains(&format!("\n{line}\n")), "{line}");
    sample("mortar_cluster_role{role=\"leader\"} 1".into());
    sample(format!("mortar_cluster_node_id {lid}"));
    sample(format!("mortar_cluster_leader_id {lid}"));
    sample(format!("mortar_peer_link_up{{peer=\"{fid}\"}} 1"));
    sample(format!("mortar_peer_lag_entries{{peer=\"{fid}\"}} 0"));
    // `mortarctl stats` shows the section too, last before the groups.
    let mut cmd = mortarctl::command();
    cmd.args([
        "--admin",
        &cluster.nodes[leader].admin.unwrap().to_string(),
        "stats",
    ]);
    let out = mortarctl::run_to_end(cmd, b"", MORTARCTL_LIMIT).expect("mortarctl ended");
    let text = String::from_utf8_lossy(&out.stdout);
    let section = text.split("\ncluster\n").nth(1).expect("a cluster section");
    let role = section
        .lines()
        .find(|l| l.trim_start().starts_with("role "));
    assert_eq!(
        role.map(|l| l.split_whitespace().last()),
        Some(Some("leader")),
        "{text}"
    );
    assert!(section.contains(&format!("{fid} up lag 0")), "{text}");
    let (_, metrics) = f_node.http("GET", "/metrics");
    assert!(metrics.contains("\nmortar_cluster_role{role=\"follower\"} 1\n"));
    // Raft tracks no follower's progress on a follower: no series rather than a 0.
    assert!(!metrics.contains("\nmortar_peer_match_index{"), "{metrics}");
}

/// `/healthz` names the leader on every node; with two nodes gone the last one knows no
/// leader (a leader steps down without a quorum) and says so with 503. `mortarctl
/// cluster status` shows the same, one row per node, and fails without a leader.
#[test]
fn healthz_and_cluster_status_name_the_leader_until_a_quorum_is_lost() {
    let mut cluster = Cluster::start(3, &[]);
    let leader = wait_settled(&cluster);
    let lid = cluster.id(leader);
    for node in &cluster.nodes {
        assert_eq!(healthz(node), (200, format!("ok leader {lid}")));
    }

    let follower = (leader + 1) % 3;
    let out = cluster_status(&cluster.nodes[follower]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 4, "header and three nodes:\n{text}");
    assert_eq!(
        rows[0][..9],
        ["NODE", "ADMIN", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "FIRST", "PEERS"],
        "{text}"
    );
    for (i, row) in rows[1..].iter().enumerate() {
        let role = if i == leader { "leader" } else { "follower" };
        let admin = cluster.nodes[i].admin.unwrap().to_string();
        assert_eq!(
            row[..3],
            [cluster.id(i).to_string(), admin, role.into()],
            "{text}"
        );
        assert_eq!(row[4], lid.to_string(), "{text}");
        assert_eq!(row[7], "1", "nothing compacted yet: {text}");
    }
    let leader_row = rows[1 + leader].join(" ");
    assert!(
        leader_row.contains(" up lag "),
        "the leader shows its peers' lag:\n{text}"
    );

    // Kill the leader's followers: it stays the last node and must stop naming itself.
    let (a, b) = ((leader + 1) % 3, (leader + 2) % 3);
    cluster.kill9(a);
    cluster.kill9(b);
    let last = &cluster.nodes[leader];
    wait_until("the last node says no leader", NO_LEADER_LIMIT, || {
        healthz(last) == (503, "no leader".to_string())
    });
    let out = cluster_status(last);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(1), "{text}{err}");
    assert!(
        err.contains("no node that answered knows a leader"),
        "{err}"
    );
    assert!(text.matches("unreachable").count() >= 2, "{text}");
    let own = text
        .lines()
        .find(|l| l.trim_start().starts_with(&lid.to_string()))
        .unwrap();
    assert!(own.contains("none") && own.contains("down"), "{text}");
}

/// A single node's `/stats` and `/healthz` are what they were before clusters, and
/// `mortarctl cluster status` says it is no cluster node.
#[test]
fn a_single_node_shows_no_cluster_and_is_healthy_without_a_leader() {
    let broker = Mortard::start(&[]);
    let (status, stats) = broker.http("GET", "/stats");
    assert_eq!(status, 200);
    let stats: Value = serde_json::from_str(&stats).unwrap();
    assert!(stats.get("cluster").is_none(), "{stats}");
    assert_eq!(healthz(&broker), (200, "ok".to_string()));
    let (_, metrics) = broker.http("GET", "/metrics");
    assert!(!metrics.contains("mortar_cluster_") && !metrics.contains("mortar_peer_"));
    let out = cluster_status(&broker);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a cluster node"));
}

fn cluster_status(node: &Mortard) -> std::process::Output {
    let mut cmd = mortarctl::command();
    cmd.args([
        "--admin",
        &node.admin.unwrap().to_string(),
        "cluster",
        "status",
    ]);
    mortarctl::run_to_end(cmd, b"", MORTARCTL_LIMIT).expect("mortarctl ended")
}

/// A prefix `P` whose nine ports `P11`..`P33` are all free now.
fn free_port_prefix() -> u16 {
    loop {
        let prefix = free_port() / 100;
        if !(PORT_PREFIX_MIN..=PORT_PREFIX_MAX).contains(&prefix) {
            continue;
        }
        let mut ports = (1..=3).flat_map(|n| (1..=3).map(move |k| prefix * 100 + n * 10 + k));
        if ports.all(|p| TcpListener::bind(("127.0.0.1", p)).is_ok()) {
            return prefix;
        }
    }
}

/// README "Run a 3-node cluster on one machine", run by bash line for line as written
/// (`set -e`: every command must succeed), in an empty directory with this build's
/// binaries first on `PATH`; only its ports are moved to a free block.
#[test]
fn the_readme_cluster_block_runs_as_written() {
    let block = readme_block("Run a 3-node cluster on one machine");
    let prefix = free_port_prefix();
    let block = block.replace("127.0.0.1:74", &format!("127.0.0.1:{prefix}"));
    let dir = tempfile::tempdir().unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_mortard")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = format!("trap 'kill $(jobs -p) 2>/dev/null' EXIT\nset -ex\n{block}");
    let mut child = Command::new("bash")
        .args(["-c", &script])
        .current_dir(dir.path())
        .env("PATH", path)
        .env_remove("MORTAR_ADMIN")
        .env_remove("MORTAR_BROKER")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .expect("bash");
    let deadline = Instant::now() + README_LIMIT;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            // The script, its brokers and commands: its own process group.
            let group = format!("-{}", child.id());
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    let logs: String = (1..=3)
        .map(|n| std::fs::read_to_string(dir.path().join(format!("node{n}.log"))))
        .filter_map(Result::ok)
        .collect();
    let said = format!("stdout:\n{text}\nstderr:\n{err}\nlogs:\n{logs}");
    assert!(out.status.success(), "{said}");
    // The group's second member on the new leader resumes after what the first ACKed
    // (only `three`), then `peek` on a survivor prints everything acknowledged.
    assert!(
        text.ends_with("\nthree\none\ntwo\nthree\n"),
        "sub after the failover, then peek on a survivor: {said}"
    );
    let tables: Vec<&str> = text.split("NODE ").skip(1).collect();
    assert_eq!(tables.len(), 3, "three cluster status tables: {said}");
    assert_eq!(tables[0].matches(" follower ").count(), 2, "{said}");
    assert!(
        tables[0].ends_with("one\ntwo\n"),
        "the group's first sub, before the kill: {said}"
    );
    assert!(
        tables[2].contains(" unreachable ") && tables[2].contains(" leader "),
        "{said}"
    );
}
