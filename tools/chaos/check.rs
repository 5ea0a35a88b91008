//! The checker: reads a history ([`crate::history`]) and applies issue 15's rules
//! (`docs/REPLICATION.md` §9.3, §9.4):
//!
//! 1. every REPLICATED-acknowledged record is, on every node's log after healing, at the
//!    sequence its OK named, with its value (otherwise *lost* on that node); every node
//!    the `run` event names (3 or 5) has a log of every partition in the history;
//! 2. no value is twice in a node's log (an idempotent producer never makes a copy);
//! 3. no two nodes disagree on a (partition, sequence): every node holds the same value
//!    there, or (a gap on one node) the same set of sequences;
//! 4. no producer sees an OK under a `leader_epoch` lower than one it already saw (in an
//!    earlier look at its answers: see `scan`), and every OK says REPLICATED;
//! 5. a group's committed position on a node never moves backwards within one life of
//!    that node: one process, so a restart, a wipe (`wipe`: the node's data directory
//!    deleted, its positions lost with it) and an INSTALL's re-exec (the same process
//!    id, its `uptime_ms` starting again) each begin a new one, the comparison being
//!    with what that process itself showed;
//! 6. every acknowledged record is delivered to the group at least once;
//! 7. no node exits on its own (a `crash`: a panic, an abort);
//! 8. after healing (every node applied the same index, the members gone), every node
//!    shows the same committed position for every partition of the group: positions
//!    are replicated state, and a node holding a lower one would, once elected, move
//!    the group's committed position backwards and deliver acknowledged records again;
//! 9. record timestamps never go back along a partition of a node's log: a leader
//!    stamps its wall clock but never behind the log's clock (`docs/DECISIONS.md`, "The
//!    log's clock"), whatever `--clock-faults` did to it. A history whose logs carry no
//!    timestamps (before they were read) is not checked.
//!
//! A wiped node (`--wipe-faults`) gets no exception from rules 1–3 and 8: its log and
//! positions are read only after healing, when it must again hold every acknowledged
//! record, once, at its sequence. [`Report::wipes`] says, per wiped node, how many it
//! holds.

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::Value;

/// One acknowledgement from the history.
struct Ack {
    producer: u64,
    value: String,
    partition: u64,
    sequence: u64,
    epoch: u64,
    scan: u64,
    durability: String,
}

/// What the history holds and what is wrong with it.
#[derive(Default)]
pub struct Report {
    pub faults: BTreeMap<String, u64>,
    pub sent: u64,
    pub acknowledged: u64,
    pub delivered: u64,
    /// Deliveries of a value after its first (at-least-once allows them; counted).
    pub redelivered: u64,
    pub lost: u64,
    pub nodes_checked: u64,
    /// Wiped node → (wipes, acknowledged records missing from its log after healing).
    pub wipes: BTreeMap<u64, (u64, u64)>,
    /// Wipes whose node caught up before the fault ended (bounded; after healing it
    /// must have in any case): liveness, no violation.
    pub wipes_caught_up: u64,
    pub violations: Vec<String>,
}

impl Report {
    /// The one summary line.
    pub fn summary(&self) -> String {
        let faults: Vec<String> = self
            .faults
            .iter()
            .map(|(k, n)| format!("{k}={n}"))
            .collect();
        format!(
            "chaos: faults {} ({}); sent {}, acknowledged {}, delivered {} (acknowledged \
             ones), redelivered {}, nodes checked {}, lost: {}, violations: {}",
            self.faults.values().sum::<u64>(),
            faults.join(" "),
            self.sent,
            self.acknowledged,
            self.delivered,
            self.redelivered,
            self.nodes_checked,
            self.lost,
            self.violations.len()
        )
    }

    /// The line about wipes, if there were any: how many, and whether each wiped node
    /// came back with every acknowledged record (rule 1 after healing).
    pub fn wipe_summary(&self) -> Option<String> {
        if self.wipes.is_empty() {
            return None;
        }
        let nodes: Vec<String> = (self.wipes.iter())
            .map(|(node, &(wipes, missing))| {
                let held = self.acknowledged - missing;
                let verdict = if missing == 0 && self.nodes_checked > 0 {
                    "every acknowledged record back"
                } else {
                    "NOT every acknowledged record back"
                };
                format!(
                    "node {node} wiped {wipes}x: {verdict} ({held} of {})",
                    self.acknowledged
                )
            })
            .collect();
        let total: u64 = self.wipes.values().map(|w| w.0).sum();
        Some(format!(
            "chaos: wipes {total} (caught up before the fault ended: {}); {}",
            self.wipes_caught_up,
            nodes.join("; ")
        ))
    }
}

fn num(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

fn text(v: &Value, k: &str) -> String {
    v[k].as_str().unwrap_or_default().to_string()
}

/// Every node's log after healing: node → (partition, sequence) → value.
type Logs = BTreeMap<u64, BTreeMap<(u64, u64), String>>;

pub fn check(events: &[Value]) -> Report {
    let mut report = Report::default();
    let mut acks = Vec::new();
    let mut delivered = HashSet::new();
    let mut logs = Logs::new();
    let mut run = None;
    let mut logs_read = HashSet::new();
    for e in events {
        match e["ev"].as_str().unwrap_or_default() {
            "send" => report.sent += 1,
            "ack" => acks.push(Ack {
                producer: num(e, "producer"),
                value: text(e, "value"),
                partition: num(e, "partition"),
                sequence: num(e, "sequence"),
                epoch: num(e, "leader_epoch"),
                scan: num(e, "scan"),
                durability: text(e, "durability"),
            }),
            "crash" => report.violations.push(format!(
                "crash: node {} exited on its own ({}) at {} ms",
                num(e, "node"),
                text(e, "status"),
                num(e, "t")
            )),
            "deliver" => report.redelivered += u64::from(!delivered.insert(text(e, "value"))),
            "fault" if e["phase"] == "begin" => {
                *report.faults.entry(text(e, "kind")).or_default() += 1;
            }
            "fault" if e["recovery"]["caught_up"] == true => report.wipes_caught_up += 1,
            "run" => run = Some((num(e, "nodes"), num(e, "partitions"))),
            "wipe" => report.wipes.entry(num(e, "node")).or_default().0 += 1,
            "log" => {
                check_timestamps(e, &mut report);
                logs_read.insert((num(e, "node"), num(e, "partition")));
                let log = logs.entry(num(e, "node")).or_default();
                for r in e["records"].as_array().into_iter().flatten() {
                    let seq = r[0].as_u64().unwrap_or(0);
                    let value = r[1].as_str().unwrap_or_default().to_string();
                    log.insert((num(e, "partition"), seq), value);
                }
            }
            _ => {}
        }
    }
    report.acknowledged = acks.len() as u64;
    report.nodes_checked = logs.len() as u64;
    if let Some(run) = run {
        check_every_log_read(run, &logs_read, &mut report);
    }
    check_acks_present(&acks, &logs, &mut report);
    check_no_copies(&logs, &mut report);
    check_nodes_agree(&logs, &mut report);
    check_epochs(&acks, &mut report);
    check_positions(events, &mut report);
    check_delivered(&acks, &delivered, &mut report);
    check_final_positions(events, &logs, &mut report);
    report
}

/// Rule 9 on one node's log of one partition (`[sequence, value, timestamp_ms]` each).
fn check_timestamps(log: &Value, report: &mut Report) {
    let mut before: Option<(u64, u64)> = None;
    for r in log["records"].as_array().into_iter().flatten() {
        let (Some(sequence), Some(stamped)) = (r[0].as_u64(), r[2].as_u64()) else {
            continue;
        };
        if let Some((prev_sequence, prev_stamped)) = before.filter(|&(_, t)| stamped < t) {
            report.violations.push(format!(
                "time went back: node {} partition {}: sequence {sequence} stamped \
                 {stamped}, sequence {prev_sequence} {prev_stamped}",
                num(log, "node"),
                num(log, "partition"),
            ));
        }
        before = Some((sequence, stamped));
    }
}

/// Rule 1; `lost` counts acknowledged records missing from at least one node.
fn check_acks_present(acks: &[Ack], logs: &Logs, report: &mut Report) {
    if logs.is_empty() {
        report
            .violations
            .push("the history has no node logs to check".into());
    }
    let mut lost = HashSet::new();
    for a in acks {
        for (node, log) in logs {
            let held = log.get(&(a.partition, a.sequence));
            if held != Some(&a.value) {
                lost.insert(a.value.as_str());
                if let Some(wiped) = report.wipes.get_mut(node) {
                    wiped.1 += 1;
                }
                report.violations.push(format!(
                    "lost: {} acknowledged at partition {} sequence {} (epoch {}) is not \
                     there on node {node} (found {held:?})",
                    a.value, a.partition, a.sequence, a.epoch
                ));
            }
        }
    }
    report.lost = lost.len() as u64;
}

/// Rule 1's premise: a node whose log is not in the history would pass unseen.
fn check_every_log_read(
    (nodes, partitions): (u64, u64),
    read: &HashSet<(u64, u64)>,
    report: &mut Report,
) {
    for node in 1..=nodes {
        let missing: Vec<u64> = (0..partitions)
            .filter(|p| !read.contains(&(node, *p)))
            .collect();
        if !missing.is_empty() {
            report.violations.push(format!(
                "unread: node {node} of {nodes} has no log of partitions {missing:?}"
            ));
        }
    }
}

/// Rule 2.
fn check_no_copies(logs: &Logs, report: &mut Report) {
    for (node, log) in logs {
        let mut seen: HashMap<&str, (u64, u64)> = HashMap::new();
        for (at, value) in log {
            if let Some(first) = seen.insert(value, *at) {
                report.violations.push(format!(
                    "duplicate: node {node} holds {value} at (partition, sequence) {first:?} \
                     and {at:?}"
                ));
            }
        }
    }
}

/// Rule 3.
fn check_nodes_agree(logs: &Logs, report: &mut Report) {
    let mut all: BTreeMap<(u64, u64), BTreeMap<u64, &str>> = BTreeMap::new();
    for (node, log) in logs {
        for (at, value) in log {
            all.entry(*at).or_default().insert(*node, value);
        }
    }
    for (at, holders) in all {
        let values: HashSet<&str> = holders.values().copied().collect();
        if values.len() > 1 || holders.len() != logs.len() {
            report.violations.push(format!(
                "disagreement at (partition, sequence) {at:?}: {holders:?} of {} nodes",
                logs.len()
            ));
        }
    }
}

/// Rule 4.
fn check_epochs(acks: &[Ack], report: &mut Report) {
    // producer → (scan of the newest look, highest epoch before it, highest in it)
    let mut seen: HashMap<u64, (u64, u64, u64)> = HashMap::new();
    for a in acks {
        if a.durability != "REPLICATED" {
            report
                .violations
                .push(format!("{} acknowledged as {}", a.value, a.durability));
        }
        let s = seen.entry(a.producer).or_insert((a.scan, 0, 0));
        if a.scan != s.0 {
            *s = (a.scan, s.1.max(s.2), 0);
        }
        if a.epoch < s.1 {
            report.violations.push(format!(
                "epoch regression: producer {} got {} acknowledged under epoch {} after an OK \
                 under epoch {}",
                a.producer, a.value, a.epoch, s.1
            ));
        }
        s.2 = s.2.max(a.epoch);
    }
}

/// Rule 5. A life is (node, `life`, wipes of the node so far, re-execs seen in that
/// life): a wipe starts the node again anyway (a new `life`), but the history says so
/// itself; a re-exec shows as `uptime_ms` going down.
fn check_positions(events: &[Value], report: &mut Report) {
    // (node, life, wipes, re-execs, partition) → (highest committed, its ms)
    type Process = (u64, u64, u64, u64, u64);
    let mut last: HashMap<Process, (u64, u64)> = HashMap::new();
    let mut wipes: HashMap<u64, u64> = HashMap::new();
    // (node, life) → (re-execs seen, the last uptime)
    let mut boots: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for e in events {
        if e["ev"] == "wipe" {
            *wipes.entry(num(e, "node")).or_default() += 1;
        }
        if e["ev"] != "position" {
            continue;
        }
        let (node, life) = (num(e, "node"), num(e, "life"));
        let boot = boots.entry((node, life)).or_default();
        if let Some(up) = e["uptime_ms"].as_u64() {
            boot.0 += u64::from(up < boot.1);
            boot.1 = up;
        }
        let wiped = wipes.get(&node).copied().unwrap_or(0);
        let key = (node, life, wiped, boot.0, num(e, "partition"));
        let (committed, t) = (num(e, "committed"), num(e, "t"));
        if let Some(&(before, t0)) = last.get(&key) {
            if committed < before {
                report.violations.push(format!(
                    "position backwards: node {} (life {}) partition {}: committed {before} \
                     at {t0} ms, {committed} at {t} ms",
                    key.0, key.1, key.4
                ));
            }
        }
        let keep = last.get(&key).map_or(committed, |&(b, _)| b.max(committed));
        last.insert(key, (keep, t));
    }
}

/// Rule 6.
fn check_delivered(acks: &[Ack], delivered: &HashSet<String>, report: &mut Report) {
    for a in acks {
        if delivered.contains(&a.value) {
            report.delivered += 1;
        } else {
            report.violations.push(format!(
                "never delivered: {} (partition {} sequence {})",
                a.value, a.partition, a.sequence
            ));
        }
    }
}

/// Rule 8.
fn check_final_positions(events: &[Value], logs: &Logs, report: &mut Report) {
    let mut shown: BTreeMap<u64, BTreeMap<u64, u64>> = BTreeMap::new();
    for e in events.iter().filter(|e| e["ev"] == "final_position") {
        let at = shown.entry(num(e, "partition")).or_default();
        at.insert(num(e, "node"), num(e, "committed"));
    }
    for (partition, nodes) in shown {
        let values: HashSet<u64> = nodes.values().copied().collect();
        if values.len() > 1 || nodes.len() != logs.len() {
            report.violations.push(format!(
                "positions diverge after healing: partition {partition}: node → committed \
                 {nodes:?} of {} nodes",
                logs.len()
            ));
        }
    }
}
