//! `mortar-chaos`: the fault tool of issue 15 (`docs/REPLICATION.md` §9.4), Jepsen-style
//! on loopback. It starts a cluster of 3 or 5 (`--nodes`) real `mortard` processes with a
//! fault-injecting proxy on every directed peer link ([`proxy`]), runs idempotent
//! REPLICATED producers and a consumer group against it ([`load`]) while a seeded
//! schedule ([`faults`]) kills, pauses, partitions, slows and restarts nodes, writes
//! everything that happened to a history of JSON lines ([`history`]), then heals the
//! cluster, waits until every node has applied the same index, reads every node's log,
//! stops the nodes and checks the history ([`check`]). It prints one summary line and
//! exits 1 on any violation.
//!
//! ```text
//! mortar-chaos --duration 45s --seed 7 --history chaos.jsonl [--nodes 5] [--mortard PATH]
//! mortar-chaos --disk-faults ...        # a ninth kind: EIO/ENOSPC through strace
//! mortar-chaos --wipe-faults ...        # a follower's data directory deleted
//! mortar-chaos --check chaos.jsonl      # check a history again (or a doctored one)
//! ```

mod check;
mod cluster;
mod disk;
mod faults;
mod history;
mod load;
mod proxy;

use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use getopts::Options;
use mortarmq::config::parse_duration;
use mortarmq::log::simdisk::SimRng;
use serde_json::json;

use cluster::{get_json, Cluster};
use history::History;
use load::{Load, TOPIC};

/// Cluster sizes `--nodes` takes: odd, so a split always leaves a majority, and small
/// enough for loopback on a small machine.
const NODE_COUNTS: [u8; 2] = [3, 5];
/// Each of two waits after healing: for the acknowledged records to be delivered, then for every
/// node to apply the same index.
const SETTLE_TIMEOUT_MS: u64 = 60_000;
/// The applied indexes must stay equal this long (group positions ride a BATCH every
/// 100 ms) before the logs are read.
const CONVERGED_FOR_MS: u64 = 1_000;
/// Records per page read from a node's admin records endpoint (its maximum).
const PAGE_RECORDS: u64 = 1_000;
/// Exit status for a run with violations (2 is a usage error).
const EXIT_VIOLATIONS: u8 = 1;

struct Opts {
    nodes: u8,
    duration: Duration,
    seed: u64,
    history: PathBuf,
    mortard: PathBuf,
    mortard_args: Vec<String>,
    producers: u64,
    members: u64,
    partitions: u16,
    rate: u64,
    /// The ninth kind, [`faults::Kind::DiskFault`]: off unless asked for, so that a
    /// seed's schedule stays what it was.
    disk_faults: bool,
    /// [`faults::Kind::WipeFollower`], likewise opt-in.
    wipe_faults: bool,
    /// [`faults::Kind::ClockStep`], likewise opt-in.
    clock_faults: bool,
    check_only: Option<PathBuf>,
}

fn main() -> ExitCode {
    let opts = match parse_opts(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mortar-chaos: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(path) = &opts.check_only {
        return match history::read(path) {
            Ok(events) => verdict(&check::check(&events), &[]),
            Err(e) => {
                eprintln!("mortar-chaos: {e}");
                ExitCode::from(2)
            }
        };
    }
    match run(&opts) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mortar-chaos: {e}");
            ExitCode::from(EXIT_VIOLATIONS)
        }
    }
}

fn options() -> Options {
    let mut o = Options::new();
    o.optopt("", "nodes", "nodes in the cluster: 3 or 5 (default 3)", "N");
    o.optopt("", "duration", "time under faults (default 60s)", "DUR");
    o.optopt(
        "",
        "seed",
        "seed of the fault schedule (default: the clock)",
        "N",
    );
    o.optopt(
        "",
        "history",
        "where the history goes (default chaos-history.jsonl)",
        "PATH",
    );
    o.optopt(
        "",
        "mortard",
        "the broker binary (default: beside this one)",
        "PATH",
    );
    o.optmulti(
        "",
        "mortard-arg",
        "a flag for every node, as --mortard-arg=--journal-file-size=64KiB (repeatable)",
        "ARG",
    );
    o.optopt("", "producers", "idempotent producers (default 3)", "N");
    o.optopt("", "members", "group members (default 2)", "N");
    o.optopt("", "partitions", "partitions of the topic (default 4)", "N");
    o.optopt(
        "",
        "rate",
        "records per second per producer (default 200)",
        "N",
    );
    o.optflag(
        "",
        "disk-faults",
        "also fail a node's fdatasync/pwrite64/write with EIO or ENOSPC (needs strace)",
    );
    o.optflag(
        "",
        "wipe-faults",
        "also kill -9 a follower, delete its data directory and start it again (it must \
         come back through INSTALL with every acknowledged record); one at a time, never \
         the leader",
    );
    o.optflag(
        "",
        "clock-faults",
        "also step the leader's wall clock back or ahead for a while (needs libfaketime, \
         Debian package faketime)",
    );
    o.optopt(
        "",
        "check",
        "only check this history, start nothing",
        "PATH",
    );
    o.optflag("h", "help", "this text");
    o
}

fn parse_opts(args: impl IntoIterator<Item = String>) -> Result<Opts, String> {
    let o = options();
    let m = o.parse(args).map_err(|e| e.to_string())?;
    if m.opt_present("help") {
        print!("{}", o.usage("Usage: mortar-chaos [options]"));
        std::process::exit(0);
    }
    let number = |name: &str, default: u64| -> Result<u64, String> {
        m.opt_str(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name}: not a number: {v}"))
        })
    };
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    let duration = m.opt_str("duration").unwrap_or_else(|| "60s".into());
    let nodes = number("nodes", 3)?;
    let Some(&nodes) = NODE_COUNTS.iter().find(|&&c| u64::from(c) == nodes) else {
        return Err(format!("--nodes: the tool runs 3 or 5 nodes, not {nodes}"));
    };
    Ok(Opts {
        nodes,
        duration: parse_duration(&duration).map_err(|e| format!("--duration: {e}"))?,
        seed: number("seed", clock.map_or(1, |d| d.as_nanos() as u64))?,
        history: PathBuf::from(m.opt_str("history").unwrap_or("chaos-history.jsonl".into())),
        mortard: m
            .opt_str("mortard")
            .map_or_else(default_mortard, PathBuf::from),
        mortard_args: m.opt_strs("mortard-arg"),
        producers: number("producers", 3)?.max(1),
        members: number("members", 2)?.max(1),
        partitions: number("partitions", 4)?.clamp(1, 64) as u16,
        rate: number("rate", 200)?.max(1),
        disk_faults: m.opt_present("disk-faults"),
        wipe_faults: m.opt_present("wipe-faults"),
        clock_faults: m.opt_present("clock-faults"),
        check_only: m.opt_str("check").map(PathBuf::from),
    })
}

fn default_mortard() -> PathBuf {
    let beside = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join("mortard")));
    [
        beside,
        Some(PathBuf::from("target/release/mortard")),
        Some(PathBuf::from("target/debug/mortard")),
    ]
    .into_iter()
    .flatten()
    .find(|p| p.is_file())
    .unwrap_or_else(|| PathBuf::from("target/release/mortard"))
}

/// Prints the summary (and the first violations) and picks the exit status.
fn verdict(report: &check::Report, extra: &[String]) -> ExitCode {
    for v in report.violations.iter().chain(extra).take(30) {
        println!("violation: {v}");
    }
    let mut summary = report.summary();
    if !extra.is_empty() {
        summary += &format!(" (+{} from the run itself)", extra.len());
    }
    println!("{summary}");
    if let Some(wipes) = report.wipe_summary() {
        println!("{wipes}");
    }
    if report.violations.is_empty() && extra.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_VIOLATIONS)
    }
}

fn work_dir() -> Result<PathBuf, String> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!("mortar-chaos-{}-{nanos}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(dir)
}

fn run(opts: &Opts) -> Result<ExitCode, String> {
    if opts.disk_faults && Command::new("strace").arg("-V").output().is_err() {
        return Err("--disk-faults needs strace (tools/test.sh installs it)".into());
    }
    let libfaketime = match opts.clock_faults {
        true => Some(find_libfaketime()?),
        false => None,
    };
    let dir = work_dir()?;
    let history = Arc::new(History::create(&opts.history)?);
    let mut rng = SimRng::new(opts.seed);
    println!(
        "mortar-chaos: seed {} duration {:?}, {} nodes in {}, history {}",
        opts.seed,
        opts.duration,
        opts.nodes,
        dir.display(),
        opts.history.display()
    );
    let mut cluster = Cluster::new(
        opts.nodes,
        &dir,
        (&opts.mortard, &opts.mortard_args),
        rng.next_u64(),
    );
    if let Some(lib) = &libfaketime {
        cluster.fake_clocks(lib)?;
    }
    cluster.start_all()?;
    history.add(
        "run",
        json!({"nodes": opts.nodes, "seed": opts.seed, "partitions": opts.partitions,
            "disk_faults": opts.disk_faults, "wipe_faults": opts.wipe_faults,
            "clock_faults": opts.clock_faults}),
    );
    let load = Arc::new(Load::new(
        Arc::clone(&history),
        cluster.client_addrs(),
        opts.partitions,
        opts.rate,
    ));
    faults::publish_observable(&cluster, &load);
    let threads = spawn_load(&load, opts);
    faults::run(
        &mut cluster,
        &load,
        &mut rng,
        Instant::now() + opts.duration,
        &faults::kinds(opts.disk_faults, opts.wipe_faults, opts.clock_faults),
    );
    let mut extra = Vec::new();
    settle(&mut cluster, &load, threads, &mut extra)?;
    read_logs(&cluster, &history, opts.partitions, &mut extra);
    if let Err(e) = cluster.stop_all() {
        extra.push(e);
    }
    history.flush();
    let report = check::check(&history::read(&opts.history)?);
    let code = verdict(&report, &extra);
    if code == ExitCode::SUCCESS {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        println!("mortar-chaos: node logs and data kept in {}", dir.display());
    }
    Ok(code)
}

/// Where Debian's `libfaketime` package puts the library: `/usr/lib/<triplet>/faketime/`.
fn find_libfaketime() -> Result<PathBuf, String> {
    let lib_dirs = std::fs::read_dir("/usr/lib").map_err(|e| format!("/usr/lib: {e}"))?;
    lib_dirs
        .filter_map(Result::ok)
        .map(|d| d.path().join("faketime/libfaketime.so.1"))
        .find(|p| p.exists())
        .ok_or_else(|| "--clock-faults needs libfaketime (tools/test.sh installs it)".into())
}

type Threads = (
    Vec<std::thread::JoinHandle<()>>,
    Vec<std::thread::JoinHandle<()>>,
);

fn spawn_load(load: &Arc<Load>, opts: &Opts) -> Threads {
    let spawn = |f: Box<dyn FnOnce(&Load) + Send>| {
        let load = Arc::clone(load);
        std::thread::spawn(move || f(&load))
    };
    let producers = (0..opts.producers)
        .map(|id| spawn(Box::new(move |l: &Load| load::run_producer(l, id))))
        .collect();
    let mut consumers: Vec<_> = (0..opts.members)
        .map(|id| spawn(Box::new(move |l: &Load| load::run_member(l, id))))
        .collect();
    consumers.push(spawn(Box::new(load::run_observer)));
    (producers, consumers)
}

/// Heals, lets the producers finish, waits for delivery and convergence.
fn settle(
    cluster: &mut Cluster,
    load: &Load,
    (producers, consumers): Threads,
    extra: &mut Vec<String>,
) -> Result<(), String> {
    let h = &load.history;
    faults::reap(cluster, load);
    cluster.heal()?;
    faults::publish_observable(cluster, load);
    h.add("note", json!({"text": "healed"}));
    load.stop_producing.store(true, Ordering::Relaxed);
    for t in producers {
        let _ = t.join();
    }
    let deadline = Instant::now() + Duration::from_millis(SETTLE_TIMEOUT_MS);
    while load.undelivered_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    load.stop_consuming.store(true, Ordering::Relaxed);
    for t in consumers {
        let _ = t.join();
    }
    faults::reap(cluster, load);
    match converge(
        cluster,
        Instant::now() + Duration::from_millis(SETTLE_TIMEOUT_MS),
    ) {
        Ok(index) => {
            h.add(
                "note",
                json!({"text": format!("every node applied {index}")}),
            );
            report_compaction(cluster, h);
        }
        Err(e) => extra.push(e),
    }
    for n in &cluster.nodes {
        load::observe_as(h, "final_position", &n.observable());
    }
    Ok(())
}

/// Prints (and notes) the first raft index each node's journal still holds: above 1,
/// it compacted during the run.
fn report_compaction(cluster: &Cluster, h: &History) {
    let firsts: Vec<String> = (cluster.nodes.iter())
        .map(|n| {
            let stats = get_json(n.admin, "/stats").unwrap_or_default();
            let first = stats["cluster"]["first_index"].as_u64().unwrap_or(0);
            format!("node{} {first}", n.id)
        })
        .collect();
    let text = format!("journal first index: {}", firsts.join(", "));
    println!("mortar-chaos: {text}");
    h.add("note", json!({ "text": text }));
}

/// Waits until every node's applied and commit indexes are one and the same number for
/// [`CONVERGED_FOR_MS`]; returns it.
fn converge(cluster: &Cluster, deadline: Instant) -> Result<u64, String> {
    let mut same_since: Option<(Instant, u64)> = None;
    loop {
        let mut seen = Vec::new();
        for n in &cluster.nodes {
            let c = get_json(n.admin, "/stats").map(|s| s["cluster"].clone());
            let c = c.unwrap_or_default();
            seen.push((c["applied_index"].as_u64(), c["commit_index"].as_u64()));
        }
        let first = seen[0].0;
        let equal = first.is_some() && seen.iter().all(|&(a, c)| a == first && c == first);
        same_since = match (equal, same_since, first) {
            (true, Some((t, i)), Some(f)) if i == f => Some((t, i)),
            (true, _, Some(f)) => Some((Instant::now(), f)),
            _ => None,
        };
        if let Some((t, i)) = same_since {
            if t.elapsed() >= Duration::from_millis(CONVERGED_FOR_MS) {
                return Ok(i);
            }
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "nodes did not converge: (applied, commit) {seen:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every node's whole log of every partition, as `log` events.
fn read_logs(cluster: &Cluster, history: &History, partitions: u16, extra: &mut Vec<String>) {
    for n in &cluster.nodes {
        for p in 0..partitions {
            match read_partition(n.admin, p) {
                Ok(records) => history.add(
                    "log",
                    json!({"node": n.id, "partition": p, "records": records}),
                ),
                Err(e) => extra.push(format!("node {}: partition {p}: {e}", n.id)),
            }
        }
    }
}

/// Partition `p`'s records on a node: (sequence, value, timestamp_ms) each.
fn read_partition(admin: std::net::SocketAddr, p: u16) -> Result<Vec<(u64, String, u64)>, String> {
    let mut out = Vec::new();
    let mut from = 0;
    loop {
        let path = format!("/topics/{TOPIC}/partitions/{p}/records?from={from}&max={PAGE_RECORDS}");
        let page = get_json(admin, &path)?;
        let records = page["records"].as_array().cloned().unwrap_or_default();
        if records.is_empty() {
            return Ok(out);
        }
        for r in &records {
            if r["encoding"] != "text" {
                return Err(format!("a record not written by this tool: {r}"));
            }
            let seq = r["sequence"]
                .as_u64()
                .ok_or("a record without a sequence")?;
            let value = r["value"].as_str().unwrap_or_default().to_string();
            let timestamp_ms = r["timestamp_ms"]
                .as_u64()
                .ok_or("a record without a time")?;
            out.push((seq, value, timestamp_ms));
        }
        from = page["next"].as_u64().ok_or("a page without next")?;
    }
}

#[cfg(test)]
mod tests;
