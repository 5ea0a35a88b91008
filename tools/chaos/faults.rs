//! The fault schedule: from one seed, one fault at a time, each held for a drawn time,
//! then undone, then a drawn quiet gap. What a fault hits (the leader, a follower, a
//! link) is read from the nodes' `/stats` when it begins. The choices that depend on
//! the number of nodes (3 or 5) are the pure [`split_sides`] and [`follower_of`], so
//! that their unit tests (`tests.rs`) need no cluster.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mortarmq::log::simdisk::SimRng;
use serde_json::{json, Value};

use crate::cluster::{get_json, Cluster, Node, State};
use crate::disk;
use crate::load::Load;
use crate::proxy::Fault;

/// A fault is held between these (ms): long enough for an election (≤ 3 s failover)
/// or not, both cases being interesting.
const HOLD_MS: (u64, u64) = (500, 5_000);
/// Quiet time between faults (ms).
const GAP_MS: (u64, u64) = (300, 2_500);

/// A wiped node's fault ends when it caught up, or after this long (ms).
const RECOVER_MS: u64 = 60_000;
/// Before a wipe every node is given this long (ms) to show it caught up (a node wiped
/// earlier, or one the broker is installing a snapshot on, may not have); else the
/// wipe is skipped.
const RECHECK_MS: u64 = 4_000;
/// Caught up means serving in one process at or above the target this long (ms).
const STEADY_MS: u64 = 1_000;

/// A stepped wall clock stands up to this far behind the real time (s)...
const CLOCK_BEHIND_MAX_S: u64 = 600;
/// ...or up to this far ahead: far below `--producer-ttl`, so no producer expires
/// early; further ahead, a leader's clock ages producers by design (`docs/DECISIONS.md`,
/// "The log's clock").
const CLOCK_AHEAD_MAX_S: u64 = 120;
/// A clock step is held at least this long (ms): a node's libfaketime reads its offset
/// at most a second late (`Cluster::step_clock`), so the step is in force for a while
/// and so is its undoing.
const CLOCK_HOLD_MIN_MS: u64 = 2_500;

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
    /// A follower killed (-9), its whole data directory deleted, started again on the
    /// same ports with the same flags: it must come back through INSTALL (or the
    /// leader's journal) with every acknowledged record. Never the leader, only when
    /// every node is intact (one wiped at a time, a majority always intact); the end
    /// waits, bounded, until it caught up. Only with `--wipe-faults`.
    WipeFollower,
    /// The leader's wall clock stepped back (up to 10 minutes) or ahead (up to 2), and
    /// back to the real time when the hold ends: the records it stamps meanwhile must
    /// not go back in time (rule 9). Only with `--clock-faults`.
    ClockStep,
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

/// The kinds of a run: [`KINDS`], then the disk fault, the wipe and the clock step if
/// asked for. Without them the list, hence every draw of a seed's schedule, is what it
/// was before any existed (`tests/chaos.rs` relies on seed 27's).
pub fn kinds(disk_faults: bool, wipe_faults: bool, clock_faults: bool) -> Vec<Kind> {
    let mut kinds = KINDS.to_vec();
    if disk_faults {
        kinds.push(Kind::DiskFault);
    }
    if wipe_faults {
        kinds.push(Kind::WipeFollower);
    }
    if clock_faults {
        kinds.push(Kind::ClockStep);
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
        let mut hold = Duration::from_millis(between(rng, HOLD_MS));
        if kind == Kind::ClockStep {
            hold = hold.max(Duration::from_millis(CLOCK_HOLD_MIN_MS));
        }
        let target = leader(cluster, rng);
        let mut held = None;
        let mut wiped = None;
        let detail = begin(cluster, kind, target, rng, (&mut held, &mut wiped));
        let h = &load.history;
        // A disk fault and a wipe name the node they hit; the others the leader they
        // aimed at.
        let hit = held.as_ref().map(|i| i.choice.node);
        let hit = hit.or(wiped.as_ref().map(|w: &(usize, Value)| w.0));
        let node = cluster.nodes[hit.unwrap_or(target)].id;
        let name = format!("{kind:?}");
        let mut event = json!({"kind": name, "phase": "begin", "node": node, "detail": detail});
        if let Some(injection) = &held {
            event["disk"] = injection.what.clone();
        }
        h.add("fault", event);
        if let Some((_, wipe)) = wiped {
            h.add("wipe", wipe);
        }
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
        if kind == Kind::WipeFollower && hit.is_some() {
            // Held until the wiped node caught up (bounded): the next fault (a kill -9
            // of the leader, say) must find a majority of intact nodes.
            publish_observable(cluster, load);
            event["recovery"] = recover(cluster, hit.unwrap_or(target), RECOVER_MS);
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
/// disk fault leaves its attached strace in `held`, a wipe the node it hit and its
/// `wipe` event in `wiped`.
fn begin(
    cluster: &mut Cluster,
    kind: Kind,
    t: usize,
    rng: &mut SimRng,
    (held, wiped): (&mut Option<disk::Injection>, &mut Option<(usize, Value)>),
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
        Kind::WipeFollower => wipe_follower(cluster, t, rng, wiped),
        Kind::ClockStep => {
            let drawn = between(rng, (0, CLOCK_BEHIND_MAX_S + CLOCK_AHEAD_MAX_S));
            let offset_s = drawn as i64 - CLOCK_BEHIND_MAX_S as i64;
            match cluster.step_clock(t, offset_s) {
                Ok(()) => format!("wall clock {offset_s:+} s"),
                Err(e) => format!("wall clock not stepped: {e}"),
            }
        }
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
        Kind::RestartFollower | Kind::WipeFollower => Ok(()),
        Kind::ClockStep => cluster.step_clock(t, 0),
        _ => {
            cluster.links.heal();
            Ok(())
        }
    }
}

/// The node (index) a wipe hits: drawn as a follower restart's, any of `intact.len()`
/// but the leader `t` (one draw whatever the cluster's state, so that the rest of the
/// seed's schedule does not depend on it). `None` with no leader known (a wipe must not
/// hit it) or a node not intact (a wiped node not caught up yet, one not running): one
/// node wiped at a time, every other one intact, a majority.
pub fn wipe_target(t: Option<usize>, intact: &[bool], rng: &mut SimRng) -> Option<usize> {
    let f = follower_of(intact.len(), t.unwrap_or(0), rng);
    (t.is_some() && intact.iter().all(|&ok| ok)).then_some(f)
}

fn says_leader(cluster: &Cluster, i: usize) -> bool {
    get_json(cluster.nodes[i].admin, "/stats").is_ok_and(|s| s["cluster"]["role"] == "leader")
}

/// kill -9 of a follower, its data directory removed, started again (see
/// [`Kind::WipeFollower`]).
fn wipe_follower(
    cluster: &mut Cluster,
    t: usize,
    rng: &mut SimRng,
    wiped: &mut Option<(usize, Value)>,
) -> String {
    // Intact: running, and caught up now in one process (not a wiped node still coming
    // back, nor one the broker itself is installing a snapshot on).
    let all: Vec<usize> = (0..cluster.nodes.len()).collect();
    let caught_up = steady(cluster, &all, RECHECK_MS);
    let intact: Vec<bool> = (cluster.nodes.iter_mut().zip(caught_up))
        .map(|(n, (ok, _))| {
            n.intact |= ok;
            n.intact && ok && n.state == State::Running
        })
        .collect();
    let known = says_leader(cluster, t);
    let Some(f) = wipe_target(known.then_some(t), &intact, rng) else {
        let why = if known {
            let behind = (intact.iter().zip(&cluster.nodes)).filter(|(ok, _)| !**ok);
            let ids: Vec<u8> = behind.map(|(_, n)| n.id).collect();
            format!("nodes {ids:?} not caught up")
        } else {
            "no leader known".into()
        };
        return format!("{why}; nothing wiped");
    };
    let id = cluster.nodes[f].id;
    // It may have won an election since the leader was read.
    if says_leader(cluster, f) {
        return format!("node {id} leads now; nothing wiped");
    }
    let life_before = cluster.nodes[f].life;
    cluster.kill9(f);
    let data = cluster.nodes[f].data().to_path_buf();
    let (files, bytes) = tree_size(&data);
    let removed = std::fs::remove_dir_all(&data).map_err(|e| e.to_string());
    cluster.nodes[f].intact = false;
    let started = cluster.start(f);
    let wipe = json!({"node": id, "life_before": life_before, "life": cluster.nodes[f].life,
        "files": files, "bytes": bytes, "removed": removed.clone().err(),
        "started": started.clone().err()});
    *wiped = Some((f, wipe));
    match (removed, started) {
        (Ok(()), Ok(())) => {
            format!("node {id} killed, {files} files ({bytes} bytes) removed, started empty")
        }
        (r, s) => format!("node {id}: removed {r:?}, started {s:?}"),
    }
}

/// Files and bytes under `dir`.
fn tree_size(dir: &std::path::Path) -> (u64, u64) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return (0, 0);
    };
    let mut sum = (0, 0);
    for e in entries.flatten() {
        let Ok(meta) = e.metadata() else { continue };
        let (f, b) = if meta.is_dir() {
            tree_size(&e.path())
        } else {
            (1, meta.len())
        };
        sum = (sum.0 + f, sum.1 + b);
    }
    sum
}

/// Waits up to `within_ms` until each node of `which` (indexes) has applied what the
/// cluster had committed when the wait began, and kept serving for [`STEADY_MS`] in the
/// same process: an INSTALL takes seconds, and the leader may have compacted past its
/// snapshot meanwhile, when the node re-execs into another install and is without its
/// records again (seen as its `uptime_ms` going down). Returns, per node, whether it
/// did and what was seen.
fn steady(cluster: &Cluster, which: &[usize], within_ms: u64) -> Vec<(bool, Value)> {
    let began = Instant::now();
    let committed = |n: &Node| {
        let stats = get_json(n.admin, "/stats").ok()?;
        stats["cluster"]["commit_index"].as_u64()
    };
    let target = (cluster.nodes.iter())
        .filter_map(committed)
        .max()
        .unwrap_or(0);
    // Per node: applied, last uptime, steady since, re-execs seen, done.
    let mut seen = vec![(None, 0, None, 0u32, false); which.len()];
    while began.elapsed() < Duration::from_millis(within_ms) && !seen.iter().all(|s| s.4) {
        for (k, &i) in which.iter().enumerate() {
            let (applied, uptime, since, re_execs, done) = &mut seen[k];
            if *done {
                continue;
            }
            let stats = get_json(cluster.nodes[i].admin, "/stats").unwrap_or_default();
            let c = &stats["cluster"];
            *applied = c["applied_index"].as_u64();
            let up = stats["broker"]["uptime_ms"].as_u64().unwrap_or(0);
            *re_execs += u32::from(up < *uptime);
            let serving = c["role"] == "follower" || c["role"] == "leader";
            let ok = serving && up >= *uptime && applied.is_some_and(|a| a >= target);
            *uptime = up;
            *since = if ok {
                since.or(Some(Instant::now()))
            } else {
                None
            };
            *done = since.is_some_and(|t: Instant| t.elapsed() >= Duration::from_millis(STEADY_MS));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let ms = began.elapsed().as_millis() as u64;
    (seen.into_iter())
        .map(|(applied, _, _, re_execs, done)| {
            let what = json!({"caught_up": done && target > 0, "ms": ms, "target": target,
                "applied": applied, "re_execs_seen": re_execs});
            (done && target > 0, what)
        })
        .collect()
}

/// [`steady`] for a wiped node `i`, marking it intact if it caught up.
fn recover(cluster: &mut Cluster, i: usize, within_ms: u64) -> Value {
    let (ok, what) = steady(cluster, &[i], within_ms).remove(0);
    cluster.nodes[i].intact = ok;
    what
}
