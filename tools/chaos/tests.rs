//! The checker against small hand-made histories: a clean one passes, and each kind of
//! bug the tool exists to find is flagged on its own, for 3 nodes and for 5. Then the
//! fault choices that depend on the number of nodes, the rounds of kinds with and
//! without `--disk-faults` and `--wipe-faults`, the disk faults' draws and strace
//! command lines, and what a wipe may hit and how the checker takes a wiped node.

use std::collections::BTreeSet;
use std::path::Path;

use mortarmq::log::simdisk::SimRng;
use serde_json::{json, Value};

use crate::check;
use crate::disk::{self, Choice, Errno, Syscall};
use crate::faults::{self, between_sides, follower_of, split_sides, Kind};

fn ack(producer: u64, value: &str, partition: u64, sequence: u64, epoch: u64, scan: u64) -> Value {
    json!({"ev": "ack", "t": scan, "producer": producer, "value": value,
        "partition": partition, "sequence": sequence, "leader_epoch": epoch,
        "commit_seq": sequence, "durability": "REPLICATED", "dedup": false, "scan": scan})
}

fn deliver(value: &str) -> Value {
    json!({"ev": "deliver", "t": 0, "member": 0, "value": value, "partition": 0,
        "sequence": 0, "attempt": 1})
}

fn log(node: u64, partition: u64, records: &[(u64, &str)]) -> Value {
    json!({"ev": "log", "t": 0, "node": node, "partition": partition, "records": records})
}

fn position(node: u64, life: u64, t: u64, committed: u64) -> Value {
    json!({"ev": "position", "t": t, "node": node, "life": life, "role": "follower",
        "term": 2, "partition": 0, "committed": committed})
}

/// Two producers, two records each, held by three nodes, delivered, positions forward.
fn clean() -> Vec<Value> {
    clean_of(3)
}

/// [`clean`] on `nodes` nodes.
fn clean_of(nodes: u64) -> Vec<Value> {
    let mut h = vec![
        json!({"ev": "run", "t": 0, "nodes": nodes, "seed": 1, "partitions": 2}),
        json!({"ev": "fault", "t": 0, "kind": "KillLeader", "phase": "begin", "node": 1}),
        ack(0, "a", 0, 1, 1, 1),
        ack(1, "b", 0, 2, 1, 1),
        ack(0, "c", 0, 3, 2, 2),
        ack(1, "d", 1, 1, 2, 3),
    ];
    h.extend(["a", "b", "c", "d"].map(deliver));
    h.extend([
        position(1, 1, 10, 1),
        position(1, 1, 20, 3),
        position(1, 2, 30, 2),
    ]);
    h.extend((1..=nodes).flat_map(|node| [final_position(node, 0, 3), final_position(node, 1, 1)]));
    for node in 1..=nodes {
        h.push(log(node, 0, &[(1, "a"), (2, "b"), (3, "c")]));
        h.push(log(node, 1, &[(1, "d")]));
    }
    h
}

fn check(h: &[Value]) -> check::Report {
    check::check(h)
}

fn violations(h: &[Value]) -> Vec<String> {
    check(h).violations
}

fn final_position(node: u64, partition: u64, committed: u64) -> Value {
    json!({"ev": "final_position", "t": 99, "node": node, "life": 1, "role": "follower",
        "term": 3, "partition": partition, "committed": committed})
}

#[test]
fn a_clean_history_has_no_violation() {
    let report = check(&clean());
    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(
        (report.acknowledged, report.delivered, report.lost),
        (4, 4, 0)
    );
    assert_eq!(report.faults["KillLeader"], 1);
    assert!(report
        .summary()
        .ends_with("nodes checked 3, lost: 0, violations: 0"));
}

#[test]
fn an_acknowledged_record_missing_on_one_node_is_lost() {
    let mut h = clean();
    let node2 = h
        .iter_mut()
        .find(|e| e["ev"] == "log" && e["node"] == 2)
        .unwrap();
    *node2 = log(2, 0, &[(1, "a"), (3, "c")]);
    let report = check(&h);
    assert_eq!(report.lost, 1);
    assert!(
        report.violations.iter().any(|v| v.starts_with("lost: b")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_record_stamped_before_the_one_ahead_of_it_is_time_going_back() {
    let stamped = |stamps: [u64; 3]| {
        let mut h = clean();
        let node2 = (h.iter_mut())
            .find(|e| e["ev"] == "log" && e["node"] == 2 && e["partition"] == 0)
            .unwrap();
        let records = [
            (1, "a", stamps[0]),
            (2, "b", stamps[1]),
            (3, "c", stamps[2]),
        ];
        *node2 = json!({"ev": "log", "t": 0, "node": 2, "partition": 0, "records": records});
        violations(&h)
    };
    assert_eq!(stamped([1_000, 1_000, 1_001]), Vec::<String>::new());
    let back = stamped([1_000, 2_000, 1_999]);
    assert_eq!(back.len(), 1, "{back:?}");
    assert!(
        back[0].starts_with("time went back: node 2 partition 0: sequence 3"),
        "{back:?}"
    );
}

#[test]
fn a_record_held_twice_is_a_duplicate() {
    let mut h = clean();
    h.push(log(3, 1, &[(1, "d"), (2, "a")]));
    let v = violations(&h);
    assert!(
        v.iter().any(|v| v.starts_with("duplicate: node 3 holds a")),
        "{v:?}"
    );
}

#[test]
fn nodes_holding_different_values_at_one_sequence_disagree() {
    let mut h = clean();
    h.push(log(1, 1, &[(1, "d"), (2, "x")]));
    h.push(log(2, 1, &[(1, "d"), (2, "y")]));
    h.push(log(3, 1, &[(1, "d"), (2, "x")]));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("disagreement at (partition, sequence) (1, 2)"),
        "{v:?}"
    );
}

#[test]
fn an_ok_under_a_lower_epoch_than_one_seen_before_is_a_regression() {
    let mut h = clean();
    h.push(ack(0, "e", 0, 4, 1, 4));
    h.push(deliver("e"));
    for node in 1..=3 {
        h.push(log(node, 0, &[(1, "a"), (2, "b"), (3, "c"), (4, "e")]));
    }
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("epoch regression: producer 0 got e"),
        "{v:?}"
    );
}

#[test]
fn answers_found_in_one_look_may_come_in_any_epoch_order() {
    let mut h = clean();
    // Producer 0's look 5 finds both; the client cannot tell which answer came first.
    h.push(ack(0, "f", 0, 5, 3, 5));
    h.push(ack(0, "e", 0, 4, 2, 5));
    h.extend(["e", "f"].map(deliver));
    for node in 1..=3 {
        h.push(log(
            node,
            0,
            &[(1, "a"), (2, "b"), (3, "c"), (4, "e"), (5, "f")],
        ));
    }
    assert_eq!(violations(&h), Vec::<String>::new());
}

#[test]
fn a_position_moving_backwards_within_one_life_is_flagged() {
    let mut h = clean();
    h.push(position(1, 2, 40, 1));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("position backwards: node 1 (life 2)"),
        "{v:?}"
    );
}

#[test]
fn an_acknowledged_record_never_delivered_is_flagged() {
    let h: Vec<Value> = clean().into_iter().filter(|e| *e != deliver("c")).collect();
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("never delivered: c"), "{v:?}");
}

#[test]
fn a_node_that_exits_on_its_own_is_flagged() {
    let mut h = clean();
    h.push(json!({"ev": "crash", "t": 5, "node": 2, "status": "signal: 6 (SIGABRT)"}));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(v[0].starts_with("crash: node 2"), "{v:?}");
}

#[test]
fn a_history_without_node_logs_proves_nothing() {
    let h: Vec<Value> = clean().into_iter().filter(|e| e["ev"] != "log").collect();
    assert!(violations(&h).iter().any(|v| v.contains("no node logs")));
}

#[test]
fn a_node_showing_another_group_position_after_healing_diverges() {
    let mut h = clean();
    h.push(final_position(2, 0, 1));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("positions diverge after healing: partition 0"),
        "{v:?}"
    );
}

#[test]
fn a_clean_five_node_history_has_no_violation() {
    let report = check(&clean_of(5));
    assert_eq!(report.violations, Vec::<String>::new());
    assert!(report
        .summary()
        .ends_with("nodes checked 5, lost: 0, violations: 0"));
}

#[test]
fn an_acknowledged_record_missing_on_the_fifth_node_is_lost() {
    let mut h = clean_of(5);
    let node5 = h
        .iter_mut()
        .find(|e| e["ev"] == "log" && e["node"] == 5 && e["partition"] == 1)
        .unwrap();
    *node5 = log(5, 1, &[]);
    let report = check(&h);
    assert_eq!(report.lost, 1);
    assert!(
        (report.violations.iter()).any(|v| v.starts_with("lost: d") && v.contains("node 5")),
        "{:?}",
        report.violations
    );
}

#[test]
fn a_node_of_the_run_without_a_log_is_flagged() {
    let h: Vec<Value> = (clean_of(5).into_iter())
        .filter(|e| !(e["ev"] == "log" && e["node"] == 4 && e["partition"] == 0))
        .collect();
    let v = violations(&h);
    assert!(
        v.iter()
            .any(|v| v.starts_with("unread: node 4 of 5 has no log of partitions [0]")),
        "{v:?}"
    );
}

/// Every (nodes, leader, seed) a split test looks at.
fn splits(n: u8) -> impl Iterator<Item = (u8, u64, Vec<u8>, Vec<u8>)> {
    (1..=n).flat_map(move |leader| {
        (0..500).map(move |seed| {
            let (minority, majority) = split_sides(n, leader, &mut SimRng::new(seed));
            (leader, seed, minority, majority)
        })
    })
}

#[test]
fn a_five_node_split_leaves_three_together_and_partitions_every_node() {
    let all: BTreeSet<u8> = (1..=5).collect();
    for (leader, seed, minority, majority) in splits(5) {
        let at = format!("leader {leader} seed {seed}: {minority:?} / {majority:?}");
        assert_eq!((minority.len(), majority.len()), (2, 3), "{at}");
        let sides: BTreeSet<u8> = minority.iter().chain(&majority).copied().collect();
        assert_eq!(sides, all, "{at}");
        assert!(minority.is_sorted() && majority.is_sorted(), "{at}");
        let cut = between_sides(&minority, &majority);
        assert_eq!(cut.len(), 2 * 2 * 3, "{at}");
        for (from, to) in &cut {
            assert_ne!(minority.contains(from), minority.contains(to), "{at}");
            assert!(cut.contains(&(*to, *from)), "{at}: one way only");
        }
    }
}

#[test]
fn a_five_node_split_puts_the_leader_on_either_side_with_any_company() {
    for leader in 1..=5 {
        let minorities: BTreeSet<Vec<u8>> =
            splits(5).filter(|s| s.0 == leader).map(|s| s.2).collect();
        // The leader with one of the 4 others, or 2 of the 4 others without it.
        assert_eq!(minorities.len(), 4 + 6, "leader {leader}: {minorities:?}");
        let with = minorities.iter().filter(|m| m.contains(&leader)).count();
        assert_eq!(with, 4, "leader {leader}: {minorities:?}");
    }
}

#[test]
fn a_three_node_split_isolates_the_leader_and_draws_nothing() {
    for (leader, seed, minority, majority) in splits(3) {
        assert_eq!(minority, vec![leader]);
        assert_eq!(majority.len(), 2);
        assert!(!majority.contains(&leader));
        // No draw: a seed's 3-node schedule is the one it had before `--nodes`.
        let mut used = SimRng::new(seed);
        split_sides(3, leader, &mut used);
        assert_eq!(used.next_u64(), SimRng::new(seed).next_u64());
    }
}

#[test]
fn a_follower_restart_hits_every_node_but_the_leader() {
    for n in [3, 5] {
        for t in 0..n {
            let mut rng = SimRng::new(9);
            let hit: BTreeSet<usize> = (0..200).map(|_| follower_of(n, t, &mut rng)).collect();
            let others: BTreeSet<usize> = (0..n).filter(|&i| i != t).collect();
            assert_eq!(hit, others, "{n} nodes, leader {t}");
        }
    }
}

#[test]
fn nodes_other_than_3_or_5_are_refused() {
    let args = |n: &str| ["--nodes".to_string(), n.to_string()];
    for n in ["3", "5"] {
        assert_eq!(
            crate::parse_opts(args(n)).map(|o| o.nodes.to_string()),
            Ok(n.into())
        );
    }
    for n in ["1", "2", "4", "7", "x"] {
        let e = crate::parse_opts(args(n)).err().unwrap_or_default();
        assert!(e.starts_with("--nodes: "), "{n}: {e}");
    }
    assert_eq!(
        crate::parse_opts(Vec::<String>::new()).map(|o| o.nodes),
        Ok(3)
    );
}

#[test]
fn disk_faults_are_off_unless_asked_for() {
    let parse = |args: &[&str]| crate::parse_opts(args.iter().map(|a| a.to_string()));
    assert_eq!(parse(&[]).map(|o| o.disk_faults), Ok(false));
    assert_eq!(parse(&["--disk-faults"]).map(|o| o.disk_faults), Ok(true));
}

/// The kinds of the first round of `seed`, in the order they run, drawn as `run` and
/// `faults::run` draw them (the cluster's proxy seed first).
fn first_round(seed: u64, disk_faults: bool) -> Vec<Kind> {
    first_round_of(seed, &faults::kinds(disk_faults, false, false))
}

fn first_round_of(seed: u64, kinds: &[Kind]) -> Vec<Kind> {
    let mut rng = SimRng::new(seed);
    rng.next_u64();
    let mut round = faults::shuffled(kinds, &mut rng);
    round.reverse();
    round
}

#[test]
fn without_disk_faults_a_seed_keeps_its_schedule() {
    assert_eq!(
        faults::kinds(false, false, false),
        [
            Kind::KillLeader,
            Kind::PauseLeader,
            Kind::IsolateLeader,
            Kind::Split,
            Kind::OneWay,
            Kind::Loss,
            Kind::Delay,
            Kind::RestartFollower,
        ]
    );
    // Seed 27's first round as `tests/chaos.rs` knows it (the leader isolated, kill -9,
    // one-way, split, SIGSTOP, ...), drawn before disk faults existed.
    assert_eq!(
        first_round(27, false),
        [
            Kind::IsolateLeader,
            Kind::KillLeader,
            Kind::OneWay,
            Kind::Split,
            Kind::PauseLeader,
            Kind::Loss,
            Kind::Delay,
            Kind::RestartFollower,
        ]
    );
}

#[test]
fn with_disk_faults_every_round_has_one_of_nine_kinds_each() {
    let mut all = faults::kinds(false, false, false);
    all.push(Kind::DiskFault);
    assert_eq!(faults::kinds(true, false, false), all);
    let mut rng = SimRng::new(27);
    let mut places = BTreeSet::new();
    for _ in 0..200 {
        let round = faults::shuffled(&faults::kinds(true, false, false), &mut rng);
        assert_eq!(round.len(), 9);
        for kind in &all {
            assert_eq!(round.iter().filter(|k| *k == kind).count(), 1, "{round:?}");
        }
        places.insert(round.iter().position(|k| *k == Kind::DiskFault));
    }
    assert_eq!(places.len(), 9, "the disk fault comes anywhere in a round");
}

#[test]
fn a_disk_fault_hits_the_leader_or_any_follower_with_every_syscall_and_errno() {
    for n in [3, 5] {
        for leader in 0..n {
            let mut rng = SimRng::new(20261207);
            let drawn: Vec<Choice> = (0..300)
                .map(|_| disk::choose(n, leader, &mut rng))
                .collect();
            let nodes: BTreeSet<usize> = drawn.iter().map(|c| c.node).collect();
            assert_eq!(nodes, (0..n).collect(), "{n} nodes, leader {leader}");
            for c in &drawn {
                assert_eq!(c.on_leader, c.node == leader, "{c:?}");
                assert!((1..=8).contains(&c.first) && (c.first..c.first + 32).contains(&c.last));
            }
            let kinds: BTreeSet<String> = (drawn.iter())
                .map(|c| format!("{:?} {:?}", c.syscall, c.errno))
                .collect();
            assert_eq!(kinds.len(), 3 * 2, "{kinds:?}");
        }
    }
    // One seed, one fault.
    let draw = || disk::choose(3, 1, &mut SimRng::new(5));
    assert_eq!(draw(), draw());
}

fn choice(syscall: Syscall, errno: Errno, (first, last): (u64, u64)) -> Choice {
    Choice {
        node: 1,
        on_leader: false,
        syscall,
        errno,
        first,
        last,
    }
}

#[test]
fn each_disk_fault_is_one_bounded_strace_injection() {
    let args = |c: &Choice| {
        disk::strace_args(4321, Path::new("/d/node2"), c, Path::new("/d/x.strace")).join(" ")
    };
    assert_eq!(
        args(&choice(Syscall::Fdatasync, Errno::Eio, (3, 9))),
        "strace -qq -f -p 4321 -e trace=fdatasync -e signal=none \
         -e inject=fdatasync:error=EIO:when=3..9 -o /d/x.strace"
    );
    assert_eq!(
        args(&choice(Syscall::Pwrite64, Errno::Enospc, (1, 1))),
        "strace -qq -f -p 4321 -e trace=pwrite64 -e signal=none \
         -e inject=pwrite64:error=ENOSPC:when=1..1 -o /d/x.strace"
    );
    // write(2) only on the hard state's temporary file: never stderr or a waker.
    assert_eq!(
        args(&choice(Syscall::WriteRaftState, Errno::Eio, (8, 39))),
        "strace -qq -f -p 4321 -e trace=write -e signal=none \
         -e inject=write:error=EIO:when=8..39 -P /d/node2/raft-state.tmp -o /d/x.strace"
    );
}

#[test]
fn the_calls_strace_failed_are_counted_from_its_trace() {
    let trace = "\
19445 fdatasync(15)                     = 0
19444 fdatasync(18 <unfinished ...>
19445 fdatasync(15)                     = -1 EIO (Input/output error) (INJECTED)
19444 <... fdatasync resumed>)          = -1 EIO (Input/output error) (INJECTED)
19446 fdatasync(20)                     = 0
";
    assert_eq!(disk::count_injected(trace), (2, 4));
    assert_eq!(disk::count_injected(""), (0, 0));
}

#[test]
fn an_answer_read_across_a_restart_is_not_the_old_life_s() {
    let dir = std::env::temp_dir().join(format!("chaos-unit-{}", std::process::id()));
    let mortard = (Path::new("/nonexistent/mortard"), &[][..]);
    let mut cluster = crate::cluster::Cluster::new(3, &dir, mortard, 1);
    let (first, other) = (cluster.nodes[0].observable(), cluster.nodes[1].observable());
    assert!(first.same_process() && other.same_process());
    // A disk fault's end: kill -9 and start again, while the observer holds `first`.
    cluster.kill9(0);
    assert!(
        !first.same_process(),
        "an answer now may come from the next process"
    );
    assert!(other.same_process());
    assert!(cluster.nodes[0].observable().same_process());
}

#[test]
fn wipe_faults_are_off_unless_asked_for() {
    let parse = |args: &[&str]| crate::parse_opts(args.iter().map(|a| a.to_string()));
    assert_eq!(parse(&[]).map(|o| o.wipe_faults), Ok(false));
    assert_eq!(parse(&["--wipe-faults"]).map(|o| o.wipe_faults), Ok(true));
    assert_eq!(
        parse(&["--disk-faults"]).map(|o| (o.disk_faults, o.wipe_faults)),
        Ok((true, false))
    );
}

#[test]
fn without_wipe_faults_a_seed_keeps_its_schedule_and_with_them_a_wipe_is_in_every_round() {
    let eight = faults::kinds(false, false, false);
    let mut nine = eight.clone();
    nine.push(Kind::DiskFault);
    assert_eq!(faults::kinds(true, false, false), nine);
    // The lists before `--wipe-faults`, so every seed's draws: seed 27's first round as
    // `tests/chaos.rs` knows it, and for other seeds the same round from the old lists.
    assert_eq!(
        first_round(27, false)[..2],
        [Kind::IsolateLeader, Kind::KillLeader]
    );
    for seed in [27, 31, 32] {
        assert_eq!(first_round(seed, false), first_round_of(seed, &eight));
        assert_eq!(first_round(seed, true), first_round_of(seed, &nine));
    }
    for (disk, kinds) in [(false, 9), (true, 10)] {
        let with = faults::kinds(disk, true, false);
        assert_eq!(with.len(), kinds);
        assert_eq!(with.last(), Some(&Kind::WipeFollower));
        let mut rng = SimRng::new(31);
        let mut places = BTreeSet::new();
        for _ in 0..300 {
            let round = faults::shuffled(&with, &mut rng);
            let wipes = round.iter().filter(|k| **k == Kind::WipeFollower).count();
            assert_eq!(wipes, 1, "{round:?}");
            places.insert(round.iter().position(|k| *k == Kind::WipeFollower));
        }
        assert_eq!(places.len(), kinds, "the wipe comes anywhere in a round");
    }
}

#[test]
fn a_wipe_hits_every_follower_and_never_the_leader() {
    for n in [3, 5] {
        for t in 0..n {
            let mut rng = SimRng::new(31);
            let intact = vec![true; n];
            let hit: BTreeSet<usize> = (0..300)
                .map(|_| faults::wipe_target(Some(t), &intact, &mut rng).expect("all intact"))
                .collect();
            let others: BTreeSet<usize> = (0..n).filter(|&i| i != t).collect();
            assert_eq!(hit, others, "{n} nodes, leader {t}");
        }
    }
}

#[test]
fn a_wipe_waits_until_every_node_is_intact_and_a_leader_is_known() {
    for n in [3, 5] {
        for not_intact in 0..n {
            let mut intact = vec![true; n];
            intact[not_intact] = false;
            for t in 0..n {
                let mut rng = SimRng::new(32);
                assert_eq!(faults::wipe_target(Some(t), &intact, &mut rng), None);
                // One draw all the same: what follows in the schedule does not depend
                // on whether the wipe happened.
                let mut drawn = SimRng::new(32);
                drawn.next_u64();
                assert_eq!(rng.next_u64(), drawn.next_u64());
            }
        }
        let mut rng = SimRng::new(32);
        assert_eq!(faults::wipe_target(None, &vec![true; n], &mut rng), None);
    }
}

fn position_as(node: u64, life: u64, t: u64, committed: u64, role: &str, uptime: u64) -> Value {
    json!({"ev": "position", "t": t, "node": node, "life": life, "role": role,
        "term": 2, "partition": 0, "committed": committed, "uptime_ms": uptime})
}

fn wipe(node: u64, t: u64, life_before: u64) -> Value {
    json!({"ev": "wipe", "t": t, "node": node, "life_before": life_before,
        "life": life_before + 1, "files": 12, "bytes": 4096})
}

/// [`clean`] with node 2 wiped at 25 ms: before it showed committed 3 (life 1); after,
/// empty, it shows nothing, then (life 2) the INSTALL's re-exec, then 2 and 3 from the
/// snapshot and the entries after it. Its final log is whole (from [`clean`]).
fn clean_with_a_wipe() -> Vec<Value> {
    let mut h = clean();
    h.extend([
        json!({"ev": "fault", "t": 24, "kind": "WipeFollower", "phase": "begin", "node": 2}),
        json!({"ev": "fault", "t": 34, "kind": "WipeFollower", "phase": "end", "node": 2,
            "recovery": {"caught_up": true, "ms": 9, "target": 7, "applied": 7}}),
        position_as(2, 1, 21, 3, "follower", 5_000),
        wipe(2, 25, 1),
        position_as(2, 2, 26, 0, "follower", 100),
        position_as(2, 2, 27, 1, "follower", 400),
        position_as(2, 2, 28, 0, "follower", 50),
        position_as(2, 2, 29, 2, "follower", 900),
        position_as(2, 2, 35, 3, "leader", 1_200),
    ]);
    h
}

#[test]
fn a_wiped_node_that_lost_its_records_and_positions_and_got_them_back_is_no_violation() {
    let report = check(&clean_with_a_wipe());
    assert_eq!(report.violations, Vec::<String>::new());
    assert_eq!(report.lost, 0);
    assert_eq!(report.wipes.get(&2), Some(&(1, 0)));
    assert_eq!(
        report.wipe_summary().as_deref(),
        Some(
            "chaos: wipes 1 (caught up before the fault ended: 1); node 2 wiped 1x: every \
             acknowledged record back (4 of 4)"
        )
    );
    assert_eq!(check(&clean()).wipe_summary(), None);
}

#[test]
fn a_record_missing_on_the_wiped_node_after_healing_is_lost() {
    let mut h = clean_with_a_wipe();
    let node2 = (h.iter_mut())
        .find(|e| e["ev"] == "log" && e["node"] == 2 && e["partition"] == 1)
        .unwrap();
    *node2 = log(2, 1, &[]);
    let report = check(&h);
    assert_eq!(report.lost, 1);
    assert!(
        (report.violations.iter()).any(|v| v.starts_with("lost: d") && v.contains("node 2")),
        "{:?}",
        report.violations
    );
    assert_eq!(report.wipes.get(&2), Some(&(1, 1)));
    assert!(report.wipe_summary().is_some_and(
        |l| l.contains("node 2 wiped 1x: NOT every acknowledged record back (3 of 4)")
    ));
}

#[test]
fn a_record_held_twice_by_the_wiped_node_after_healing_is_a_duplicate() {
    let mut h = clean_with_a_wipe();
    let node2 = (h.iter_mut())
        .find(|e| e["ev"] == "log" && e["node"] == 2 && e["partition"] == 1)
        .unwrap();
    *node2 = log(2, 1, &[(1, "d"), (2, "d")]);
    let v = violations(&h);
    assert!(
        v.iter().any(|v| v.starts_with("duplicate: node 2")),
        "{v:?}"
    );
}

#[test]
fn positions_still_never_go_backwards_within_one_process_of_a_wiped_node() {
    // After the wipe, node 2 leads (life 2, no re-exec) and goes from 3 back to 1.
    let mut h = clean_with_a_wipe();
    h.push(position_as(2, 2, 40, 1, "leader", 1_500));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("position backwards: node 2 (life 2)"),
        "{v:?}"
    );
    // And the leader of the clean history, never wiped, likewise.
    let mut h = clean_with_a_wipe();
    h.push(position_as(1, 2, 41, 3, "leader", 9_000));
    h.push(position_as(1, 2, 42, 2, "leader", 9_100));
    let v = violations(&h);
    assert_eq!(v.len(), 1, "{v:?}");
    assert!(
        v[0].starts_with("position backwards: node 1 (life 2)") && v[0].ends_with("2 at 42 ms"),
        "{v:?}"
    );
}

#[test]
fn a_wipe_event_alone_separates_the_node_s_observations() {
    // A history whose restart after the wipe kept the life number (a doctored one, or a
    // start that failed): the wipe event itself ends the old life.
    let mut h = clean();
    h.extend([
        position_as(3, 1, 21, 3, "follower", 5_000),
        wipe(3, 25, 1),
        position_as(3, 1, 26, 1, "follower", 9_000),
    ]);
    assert_eq!(violations(&h), Vec::<String>::new());
}

#[test]
fn clock_faults_are_off_unless_asked_for_and_seed_11_steps_a_clock_first() {
    let parse = |args: &[&str]| crate::parse_opts(args.iter().map(|a| a.to_string()));
    assert_eq!(parse(&[]).map(|o| o.clock_faults), Ok(false));
    assert_eq!(parse(&["--clock-faults"]).map(|o| o.clock_faults), Ok(true));
    let with = faults::kinds(false, false, true);
    assert_eq!(with.last(), Some(&Kind::ClockStep));
    assert!(!faults::kinds(true, true, false).contains(&Kind::ClockStep));
    // `tests/chaos.rs` runs seed 11 for a few seconds: its first fault steps a clock.
    assert_eq!(
        first_round_of(11, &with)[..2],
        [Kind::ClockStep, Kind::OneWay]
    );
}
