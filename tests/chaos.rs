//! The fault tool `mortar-chaos` (issue 15, docs/REPLICATION.md §9.4) end to end: short
//! seeded runs against real 3- and 5-node clusters compacting their journals must show
//! no violation, and its checker,
//! given the same history with one acknowledged record taken out of one node's log,
//! must say the record is lost and exit non-zero. (`tools/chaos/tests.rs` has the
//! checker's unit tests, one per rule.) A third run steps the leader's wall clock
//! (`--clock-faults`, through libfaketime, which `tools/test.sh` installs).

use std::path::Path;
use std::process::{Command, Output};
use std::sync::Mutex;

/// Seconds of faults: each round of eight faults has every kind once, in a drawn order;
/// 35 s holds about eight.
const FAULT_SECONDS: u64 = 35;
/// The seed CI runs (any seed must pass): its first round starts with the leader
/// isolated, kill -9, one-way, split and SIGSTOP, the kinds the test asserts.
const SEED: u64 = 27;
/// The 5-node run: shorter, a few faults of whichever kinds the seed draws first.
const FIVE_NODE_SEED: u64 = 5;
const FIVE_NODE_FAULT_SECONDS: u64 = 20;
/// The clock run: seed 11's first fault steps the leader's wall clock
/// (`tools/chaos/tests.rs` holds it), then one-way loss and a kill -9 may follow.
const CLOCK_SEED: u64 = 11;
const CLOCK_FAULT_SECONDS: u64 = 12;

fn chaos(args: &[&str]) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_mortar-chaos"))
        .args(args)
        .output()
        .expect("run mortar-chaos");
    println!(
        "mortar-chaos {args:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn summary(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("chaos: faults"));
    line.expect("a summary line").to_string()
}

/// The history with the value of the first acknowledged record removed from node 2's
/// log of its partition.
fn without_one_ack_on_node_2(history: &Path, doctored: &Path) {
    let text = std::fs::read_to_string(history).expect("history");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let ack = lines
        .iter()
        .find(|e| e["ev"] == "ack")
        .expect("an acknowledged record");
    let mut out = String::new();
    for mut e in lines.clone() {
        if e["ev"] == "log" && e["node"] == 2 && e["partition"] == ack["partition"] {
            let records = e["records"].as_array_mut().expect("records");
            records.retain(|r| r[1] != ack["value"]);
        }
        out += &format!("{e}\n");
    }
    std::fs::write(doctored, out).expect("write the doctored history");
}

/// One run at a time: two clusters at once on two cores would starve each other's
/// elections.
static ONE_RUN: Mutex<()> = Mutex::new(());

/// A compacting run (64 KiB journal files) of `nodes` nodes, seed `seed`, `seconds` of
/// faults: its output and summary line, after checking that it found no violation
/// and that every node compacted its journal under the faults.
fn compacting_run(nodes: u8, seed: u64, seconds: u64, history: &Path) -> (Output, String) {
    let (run, line) = clean_run(nodes, seed, seconds, history, &[]);
    let out = String::from_utf8_lossy(&run.stdout);
    let firsts = out
        .lines()
        .find_map(|l| l.strip_prefix("mortar-chaos: journal first index: "))
        .unwrap_or_else(|| panic!("no compaction report: {out}"));
    assert_eq!(firsts.split(", ").count(), usize::from(nodes), "{firsts}");
    for node in firsts.split(", ") {
        let first: u64 = node.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(first > 1, "a node never compacted: {firsts}");
    }
    (run, line)
}

/// A run as [`compacting_run`]'s with `more` flags: its output and summary line, after
/// checking that it found no violation.
fn clean_run(
    nodes: u8,
    seed: u64,
    seconds: u64,
    history: &Path,
    more: &[&str],
) -> (Output, String) {
    let _one = ONE_RUN.lock().unwrap_or_else(|e| e.into_inner());
    let (nodes, duration, seed) = (nodes.to_string(), format!("{seconds}s"), seed.to_string());
    let mut args = vec![
        "--nodes",
        &nodes,
        "--duration",
        &duration,
        "--seed",
        &seed,
        "--history",
        history.to_str().unwrap(),
        "--mortard",
        env!("CARGO_BIN_EXE_mortard"),
        // Small journal files: every node compacts many times under the faults.
        "--mortard-arg=--journal-file-size=64KiB",
    ];
    args.extend(more);
    let run = chaos(&args);
    let line = summary(&run);
    assert!(run.status.success(), "{line}");
    assert!(line.ends_with("lost: 0, violations: 0"), "{line}");
    (run, line)
}

#[test]
fn a_short_seeded_chaos_run_finds_no_violation_and_its_checker_finds_a_lost_record() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let (_, line) = compacting_run(3, SEED, FAULT_SECONDS, &history);
    for kind in [
        "KillLeader",
        "PauseLeader",
        "IsolateLeader",
        "Split",
        "OneWay",
    ] {
        assert!(
            line.contains(&format!("{kind}=")),
            "no {kind} fault: {line}"
        );
    }

    let recheck = chaos(&["--check", history.to_str().unwrap()]);
    assert!(recheck.status.success(), "{}", summary(&recheck));

    let doctored = dir.path().join("doctored.jsonl");
    without_one_ack_on_node_2(&history, &doctored);
    let bad = chaos(&["--check", doctored.to_str().unwrap()]);
    let line = summary(&bad);
    assert_eq!(bad.status.code(), Some(1), "{line}");
    assert!(line.contains("lost: 1,"), "{line}");
    let text = String::from_utf8_lossy(&bad.stdout);
    assert!(text.contains("violation: lost: "), "{text}");
}

#[test]
fn a_short_five_node_run_compacts_under_faults_and_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let (_, line) = compacting_run(5, FIVE_NODE_SEED, FIVE_NODE_FAULT_SECONDS, &history);
    assert!(line.contains("nodes checked 5"), "{line}");
}

#[test]
fn a_short_run_with_the_leaders_wall_clock_stepped_finds_no_violation() {
    let dir = tempfile::tempdir().expect("tempdir");
    let history = dir.path().join("history.jsonl");
    let args = ["--clock-faults"];
    let (_, line) = clean_run(3, CLOCK_SEED, CLOCK_FAULT_SECONDS, &history, &args);
    assert!(line.contains("ClockStep="), "no clock stepped: {line}");
    let text = std::fs::read_to_string(&history).expect("the history");
    let stepped = text.lines().find(|l| l.contains("\"wall clock "));
    assert!(
        stepped.is_some_and(|l| !l.contains("not stepped")),
        "{stepped:?}"
    );
}
