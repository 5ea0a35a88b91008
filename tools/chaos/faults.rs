//! The fault schedule: from one seed, one fault at a time, each held for a drawn time,
//! then undone, then a drawn quiet gap. What a fault hits (the leader, a follower, a
//! link) is read from the nodes' `/stats` when it begins. The choices that depend on
//! the number of nodes (3 or 5) are the pure [`split_sides`] and [`follower_of`], so
//! that their unit tests (`tests.rs`) need no cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mortarmq::log::simdisk::SimRng;
use serde_json::json;

use crate::cluster::{get_json, Cluster, State};
use crate::disk;
use crate::load::Load;
use crate::proxy::Fault;

/// A fault is held between these (ms): long enough for an election (≤ 3 s failover)
/// or not, both cases being interesting.
const HOLD_MS: (u64, u64) = (500, 5_000);
/// Quiet time between faults (ms).
const GAP_MS: (u64, u64) = (300, 2_500);

/// The first fault waits for the first leader this long at most.
const FIRST_LEADER_MS: u64 = 10_000;

/// The kinds, drawn uniformly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// kill -9 of the leader, restarted when the hold ends.
    KillLeader,
    /// SIGSTOP of the leader, SIGCONT when the hold ends.
    PauseLeader,
    /// Every link to and from the leader cut (closed) or silent (all frames dropped).
    IsolateLeader,
    /// A majority/minority split, cut or silent both ways between the sides: with 3
    /// nodes the leader alone against the other two (2/1), with 5 a side of 2 against a
    /// side of 3, the leader on either (see [`split_sides`]).
    Split,
    /// The leader's outbound links (or its inbound ones) silent, the other way working.
    OneWay,
    /// Every link drops a share of its frames.
    Loss,
    /// Every link holds its frames.
    Delay,
    /// A follower killed and restarted at once (or SIGTERMed: a clean restart).
    RestartFollower,
    /// Some data-file syscalls of the leader or a follower failed (EIO, ENOSPC) through
    /// strace, the node restarted when the hold ends (`disk.rs`). Only with
    /// `--disk-faults`.
    DiskFault,
}

const KINDS: [Kind; 8] = [
    Kind::KillLeader,
    Kind::PauseLeader,
    Kind::IsolateLeader,
    Kind::Split,
    Kind::OneWay,
    Kind::Loss,
    Kind::Delay,
    Kind::RestartFollower,
];

/// The kinds of a run: [`KINDS`], and the disk fault last if asked for. Without it the
/// list, hence every draw of a seed's schedule, is what it was before disk faults
/// (`tests/chaos.rs` relies on seed 27's).
pub fn kinds(disk_faults: bool) -> Vec<Kind> {
    let mut kinds = KINDS.to_vec();
    if disk_faults {
        kinds.push(Kind::DiskFault);
    }
    kinds
}

/// One round: every kind of `kinds` once, in a drawn order (taken from the end).
pub fn shuffled(kinds: &[Kind], rng: &mut SimRng) -> Vec<Kind> {
    let mut round = kinds.to_vec();
    for i in (1..round.len()).rev() {
        round.swap(i, rng.below(i as u64 + 1) as usize);
    }
    round
}

fn between(rng: &mut SimRng, (lo, hi): (u64, u64)) -> u64 {
    lo + rng.below(hi - lo + 1)
}

fn has_leader(cluster: &Cluster) -> bool {
    let running = cluster.nodes.iter().filter(|n| n.state == State::Running);
    running
        .filter_map(|n| get_json(n.admin, "/stats").ok())
        .any(|s| s["cluster"]["role"] == "leader")
}

/// The node (index) that says it leads with the highest term, else a running one.
pub fn leader(cluster: &Cluster, rng: &mut SimRng) -> usize {
    let mut best: Option<(u64, usize)> = None;
    for (i, n) in cluster.nodes.iter().enumerate() {
        if n.state != State::Running {
            continue;
        }
        let Ok(stats) = get_json(n.admin, "/stats") else {
            continue;
        };
        if stats["cluster"]["role"] == "leader" {
            let term = stats["cluster"]["term"].as_u64().unwrap_or(0);
            if best.is_none_or(|(t, _)| term > t) {
                best = Some((term, i));
            }
        }
    }
    best.map_or_else(|| rng.below(cluster.nodes.len() as u64) as usize, |b| b.1)
}

/// Runs faults of `kinds` until `until`, leaving the cluster as the last one left it
/// (the caller heals).
pub fn run(cluster: &mut Cluster, load: &Load, rng: &mut SimRng, until: Instant, kinds: &[Kind]) {
    let first_leader = Instant::now() + Duration::from_millis(FIRST_LEADER_MS);
    while !has_leader(cluster) && Instant::now() < first_leader {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut round = Vec::new();
    while Instant::now() < until {
        reap(cluster, load);
        publish_observable(cluster, load);
        if round.is_empty() {
            // Every kind once per round, in a drawn order: a short run sees them all.
            round = shuffled(kinds, rng);
        }
        let kind = round.pop().expect("refilled");
        let hold = Duration::from_millis(between(rng, HOLD_MS));
        let target = leader(cluster, rng);
        let mut held = None;
        let detail = begin(cluster, kind, target, rng, &mut held);
        let h = &load.history;
        // A disk fault names the node it hit; the others the leader they aimed at.
        let node = cluster.nodes[held.as_ref().map_or(target, |i| i.choice.node)].id;
        let name = format!("{kind:?}");
        let mut event = json!({"kind": name, "phase": "begin", "node": node, "detail": detail});
        if let Some(injection) = &held {
            event["disk"] = injection.what.clone();
        }
        h.add("fault", event);
        publish_observable(cluster, load);
        std::thread::sleep(hold.min(until.saturating_duration_since(Instant::now())));
        let mut event = json!({"kind": name, "phase": "end", "node": node});
        if let Some(injection) = held {
            // Detached before the reap: a node that exited under the fault is a crash.
            event["disk"] = injection.detach();
        }
        reap(cluster, load);
        if let Err(e) = end(cluster, kind, target, node) {
            h.add("note", json!({"text": format!("ending {name}: {e}")}));
        }
        h.add("fault", event);
        publish_observable(cluster, load);
        std::thread::sleep(Duration::from_millis(between(rng, GAP_MS)));
    }
}

/// Writes a `crash` for every node that exited on its own and starts it again.
pub fn reap(cluster: &mut Cluster, load: &Load) {
    for (node, status) in cluster.reap() {
        load.history
            .add("crash", json!({"node": node, "status": status}));
        let i = cluster
            .nodes
            .iter()
            .position(|n| n.id == node)
            .expect("a node of ours");
        if let Err(e) = cluster.start(i) {
            load.history
                .add("note", json!({"text": format!("restart after crash: {e}")}));
        }
    }
}

/// Tells the observer which nodes it may ask (a paused one would only time out).
pub fn publish_observable(cluster: &Cluster, load: &Load) {
    let running = cluster.nodes.iter().filter(|n| n.state == State::Running);
    let list = running.map(|n| n.observable()).collect();
    *load.observable.lock().unwrap_or_else(|e| e.into_inner()) = list;
}

/// Starts `kind` on node `t` (an index); returns what was done, for the history. A
/// disk fault leaves its attached strace in `held`.
fn begin(
    cluster: &mut Cluster,
    kind: Kind,
    t: usize,
    rng: &mut SimRng,
    held: &mut Option<disk::Injection>,
) -> String {
    let n = cluster.nodes.len() as u8;
    let id = cluster.nodes[t].id;
    let others = (1..=n).filter(move |&o| o != id);
    let links = &cluster.links;
    match kind {
        Kind::KillLeader => {
            cluster.kill9(t);
            "kill -9".into()
        }
        Kind::PauseLeader => {
            cluster.pause(t);
            "SIGSTOP".into()
        }
        Kind::IsolateLeader => {
            let fault = cut_or_silent(rng);
            for o in others {
                links.set(id, o, fault);
                links.set(o, id, fault);
            }
            format!("{fault:?} both ways")
        }
        Kind::Split => {
            // The fault before the sides: the order of draws a 3-node seed always had.
            let fault = cut_or_silent(rng);
            let (minority, majority) = split_sides(n, id, rng);
            for (from, to) in between_sides(&minority, &majority) {
                links.set(from, to, fault);
            }
            format!("{fault:?} both ways between {minority:?} and {majority:?}")
        }
        Kind::OneWay => {
            let outbound = rng.below(2) == 0;
            for o in others {
                let (from, to) = if outbound { (id, o) } else { (o, id) };
                links.set(from, to, Fault::Drop(100));
            }
            if outbound {
                "outbound silent"
            } else {
                "inbound silent"
            }
            .into()
        }
        Kind::Loss | Kind::Delay => all_links(cluster, kind, rng),
        Kind::RestartFollower => restart_follower(cluster, t, rng),
        Kind::DiskFault => disk_fault(cluster, t, rng, held),
    }
}

fn cut_or_silent(rng: &mut SimRng) -> Fault {
    if rng.below(2) == 0 {
        Fault::Cut
    } else {
        Fault::Drop(100)
    }
}

/// The two sides of a split of nodes `1..=n` around `leader` (an id): (minority,
/// majority), each sorted, together every node. A minority has `(n - 1) / 2` nodes, so
/// the majority can still elect. With 3 nodes the leader is the minority and nothing is
/// drawn, as before 5 nodes were possible, so that a seed keeps its 3-node schedule
/// (`tests/chaos.rs` relies on seed 27's). With more, the seed puts the leader on either
/// side (on the minority side it must step down and the majority elect; on the majority
/// side it keeps leading and the minority must not disturb it) and draws the rest of its
/// side.
pub fn split_sides(n: u8, leader: u8, rng: &mut SimRng) -> (Vec<u8>, Vec<u8>) {
    let mut others: Vec<u8> = (1..=n).filter(|&o| o != leader).collect();
    if n <= 3 {
        return (vec![leader], others);
    }
    let minority_size = usize::from((n - 1) / 2);
    let leader_in_minority = rng.below(2) == 0;
    for i in (1..others.len()).rev() {
        others.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let with_leader = usize::from(leader_in_minority);
    let (mut minority, mut majority) = (
        others[..minority_size - with_leader].to_vec(),
        others[minority_size - with_leader..].to_vec(),
    );
    if leader_in_minority {
        minority.push(leader);
    } else {
        majority.push(leader);
    }
    minority.sort_unstable();
    majority.sort_unstable();
    (minority, majority)
}

/// Every directed link from one side to the other, both ways.
pub fn between_sides(a: &[u8], b: &[u8]) -> Vec<(u8, u8)> {
    let pairs = a.iter().flat_map(|&x| b.iter().map(move |&y| (x, y)));
    pairs.flat_map(|(x, y)| [(x, y), (y, x)]).collect()
}

/// The node (index) a follower restart hits: any of the `n` but the leader `t`.
pub fn follower_of(n: usize, t: usize, rng: &mut SimRng) -> usize {
    (t + 1 + rng.below(n as u64 - 1) as usize) % n
}

fn all_links(cluster: &Cluster, kind: Kind, rng: &mut SimRng) -> String {
    let n = cluster.nodes.len() as u8;
    let fault = match kind {
        Kind::Loss => Fault::Drop(between(rng, (5, 40)) as u32),
        _ => Fault::Delay(between(rng, (5, 300))),
    };
    for from in 1..=n {
        for to in (1..=n).filter(|&to| to != from) {
            cluster.links.set(from, to, fault);
        }
    }
    format!("{fault:?} on every link")
}

/// Restarts a node other than the leader `t` (kill -9 or SIGTERM); the fault's hold is
/// then a quiet time.
fn restart_follower(cluster: &mut Cluster, t: usize, rng: &mut SimRng) -> String {
    let f = follower_of(cluster.nodes.len(), t, rng);
    if cluster.nodes[f].state != State::Running {
        return format!("node {} not running; nothing done", cluster.nodes[f].id);
    }
    let how = if rng.below(2) == 0 {
        cluster.kill9(f);
        "kill -9"
    } else {
        cluster.terminate(f);
        "SIGTERM"
    };
    match cluster.start(f) {
        Ok(()) => format!("node {} restarted after {how}", cluster.nodes[f].id),
        Err(e) => format!(
            "node {} not restarted after {how}: {e}",
            cluster.nodes[f].id
        ),
    }
}

/// Attaches strace to the leader or a follower (drawn, with what fails: `disk.rs`).
fn disk_fault(
    cluster: &mut Cluster,
    t: usize,
    rng: &mut SimRng,
    held: &mut Option<disk::Injection>,
) -> String {
    let choice = disk::choose(cluster.nodes.len(), t, rng);
    let n = &cluster.nodes[choice.node];
    let (id, pid) = (n.id, cluster.pid(choice.node));
    let Some(pid) = pid.filter(|_| n.state == State::Running) else {
        return format!("node {id} not running; nothing injected");
    };
    // No draw for the name: what a seed draws must not depend on the file system.
    static FAULTS: AtomicU64 = AtomicU64::new(0);
    let count = FAULTS.fetch_add(1, Ordering::Relaxed);
    let out = n.log().with_extension(format!("disk{count}.strace"));
    match disk::attach(pid, id, (n.data(), n.log()), choice, &out) {
        Ok(injection) => {
            let strace = injection.what["strace"].as_str().unwrap_or_default();
            let detail = format!("node {id}: {strace}");
            *held = Some(injection);
            detail
        }
        Err(e) => format!("node {id}: nothing injected: {e}"),
    }
}

fn end(cluster: &mut Cluster, kind: Kind, t: usize, node: u8) -> Result<(), String> {
    match kind {
        Kind::KillLeader => cluster.start(t),
        Kind::DiskFault => {
            // Whatever the fault left (a poisoned journal, a node that stopped serving,
            // or nothing), it comes back from its data directory, as after a kill -9.
            let i = (cluster.nodes.iter())
                .position(|n| n.id == node)
                .expect("a node of ours");
            cluster.kill9(i);
            cluster.start(i)
        }
        Kind::PauseLeader => {
            cluster.resume(t);
            Ok(())
        }
        Kind::RestartFollower => Ok(()),
        _ => {
            cluster.links.heal();
            Ok(())
        }
    }
}
