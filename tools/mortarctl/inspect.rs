//! The read commands over admin `/stats`: `stats`, `topics list`, `groups list` and
//! `groups describe`, as aligned tables or the JSON itself.

use mortarmq::admin::Unit;
use serde_json::Value;

use crate::{runtime_err, Ctx, Outcome};

const MS_PER_SECOND: u64 = 1_000;

/// Columns aligned; a column whose cells are all numbers is right-aligned.
pub(crate) fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    let mut numeric = vec![!rows.is_empty(); cols];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            width[i] = width[i].max(cell.chars().count());
            numeric[i] &= cell.parse::<f64>().is_ok() || cell == "-";
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = width[i] - cell.chars().count();
            if numeric[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub(crate) fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

pub(crate) fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

pub(crate) fn array_of<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map_or(&[], Vec::as_slice)
}

pub(crate) fn print_json(v: &Value) {
    println!("{v}");
}

/// `1536` → `1.5 KiB`.
pub(crate) fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < units.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", units[unit])
    }
}

/// The sections of `stats`, in the order shown (those of `/stats` but `topics`, which
/// `topics list` shows, and `groups`, shown last as a table).
const STATS_ORDER: [&str; 6] = [
    "broker",
    "connections",
    "storage",
    "fsync",
    "publish",
    "delivery",
];

/// A section's `label  value` rows; `used` lists the `/stats` paths shown so far, so
/// that the rest of the section's figures follow its rows as they are.
pub(crate) struct Section {
    rows: Vec<(String, String)>,
    used: Vec<String>,
}

impl Section {
    fn row(&mut self, label: &str, value: String, paths: &[&str]) {
        self.rows.push((label.to_string(), value));
        self.used.extend(paths.iter().map(|p| p.to_string()));
    }
}

/// `stats` for a person: grouped sections in human units (durations, KiB/MiB/GiB,
/// milliseconds), the summary rows first, then every other figure the metrics table
/// puts in the section, then the groups with their lag.
pub(crate) fn stats_report(stats: &Value) -> String {
    let mut out = String::new();
    // Figures shown so far: a summary row may show figures of other sections.
    let mut used = Vec::new();
    // A cluster node's own section last, before the groups; a single node has none.
    let cluster = stats["cluster"].is_object().then_some("cluster");
    for name in STATS_ORDER.iter().copied().chain(cluster) {
        let mut section = Section {
            rows: Vec::new(),
            used: std::mem::take(&mut used),
        };
        match name {
            "broker" => broker_rows(stats, &mut section),
            "storage" => storage_rows(stats, &mut section),
            "fsync" => fsync_rows(stats, &mut section),
            _ => {}
        }
        other_rows(stats, name, &mut section);
        if name == "cluster" {
            let peers = super::cluster::links(&stats["cluster"]);
            section.row("peers", peers, &[]);
        }
        used = section.used;
        out.push_str(name);
        out.push('\n');
        let width = section.rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
        for (label, value) in &section.rows {
            out.push_str(format!("  {label:<width$}  {value}").trim_end());
            out.push('\n');
        }
        out.push('\n');
    }
    out.push_str("groups\n");
    let groups = group_rows(stats);
    if groups.is_empty() {
        out.push_str("  none\n");
    } else {
        for line in table(&GROUP_HEADER, &groups).lines() {
            out.push_str(&format!("  {line}\n"));
        }
    }
    out
}

fn broker_rows(stats: &Value, s: &mut Section) {
    let b = &stats["broker"];
    s.row(
        "version",
        str_of(b, "version").to_string(),
        &["broker.version"],
    );
    let uptime = human_duration(u64_of(b, "uptime_ms"));
    s.row("uptime", uptime, &["broker.uptime_ms"]);
    let c = &stats["connections"];
    let connections = format!(
        "{} open ({} accepted, {} refused since start)",
        u64_of(c, "open"),
        u64_of(c, "accepted"),
        u64_of(c, "refused")
    );
    let paths = [
        "connections.open",
        "connections.accepted",
        "connections.refused",
    ];
    s.row("connections", connections, &paths);
    let memory = format!("{} resident", human_bytes(u64_of(b, "rss_bytes")));
    s.row("memory", memory, &["broker.rss_bytes"]);
}

fn storage_rows(stats: &Value, s: &mut Section) {
    let st = &stats["storage"];
    let bytes = u64_of(st, "bytes");
    let topics = array_of(stats, "topics");
    let sources = topics.iter().filter(|t| t["dlq_twin"] != true).count();
    let data = format!(
        "{} in {}, {} (each with its .dlq twin)",
        human_bytes(bytes),
        plural(u64_of(st, "segments"), "segment"),
        plural(sources as u64, "topic")
    );
    s.row("data", data, &["storage.bytes", "storage.segments"]);
    let headroom = match st["max_bytes"].as_u64() {
        // A broker older than this mortarctl.
        None => return,
        Some(0) => "no --max-data-size: as much as the disk holds".to_string(),
        Some(max) => format!(
            "{} free of --max-data-size {} ({:.1}% used)",
            human_bytes(max.saturating_sub(bytes)),
            human_bytes(max),
            bytes as f64 * 100.0 / max as f64
        ),
    };
    s.row("headroom", headroom, &["storage.max_bytes"]);
}

fn fsync_rows(stats: &Value, s: &mut Section) {
    let f = &stats["fsync"];
    let ms = |key: &str| human_ms(f[key].as_f64().unwrap_or(0.0));
    let fsyncs = format!(
        "{} ({} failed), {} records, {:.1} records per fsync",
        u64_of(f, "count"),
        u64_of(f, "failures"),
        u64_of(f, "records"),
        f["mean_batch_records"].as_f64().unwrap_or(0.0)
    );
    let paths = ["fsync.count", "fsync.failures", "fsync.records"];
    s.row("fsyncs", fsyncs, &paths);
    s.used.push("fsync.mean_batch_records".into());
    if f.get("p99_ms").is_none() {
        return;
    }
    let latency = if u64_of(f, "count") == 0 {
        "no fsync yet".to_string()
    } else {
        format!(
            "p50 <= {}, p99 <= {}, max {} (mean {})",
            ms("p50_ms"),
            ms("p99_ms"),
            ms("max_ms"),
            ms("mean_ms")
        )
    };
    let paths = [
        "fsync.p50_ms",
        "fsync.p99_ms",
        "fsync.max_ms",
        "fsync.mean_ms",
    ];
    s.row("latency", latency, &paths);
}

/// The figures of `section` the rows so far did not show, labelled by their key, in
/// the table's order; per-label objects as `label n` pairs.
fn other_rows(stats: &Value, section: &str, s: &mut Section) {
    let prefix = format!("{section}.");
    for metric in mortarmq::admin::in_stats_order() {
        let path = metric.path.unwrap_or_default();
        let Some(key) = path.strip_prefix(&prefix) else {
            continue;
        };
        if path.contains("[]") || s.used.iter().any(|u| u == path) {
            continue;
        }
        let Some(v) = stats.pointer(&format!("/{}", path.replace('.', "/"))) else {
            // A broker older than this mortarctl.
            continue;
        };
        let value = match v {
            Value::Object(by_label) => {
                let counts: Vec<String> = (by_label.iter())
                    .filter(|(_, n)| n.as_u64() != Some(0))
                    .map(|(label, n)| format!("{label} {}", stat_cell(metric.unit, n)))
                    .collect();
                if counts.is_empty() {
                    "none".to_string()
                } else {
                    counts.join(", ")
                }
            }
            v => stat_cell(metric.unit, v),
        };
        let label = key.trim_end_matches("_ms").replace('_', " ");
        s.row(&label, value, &[path]);
    }
}

/// A value in its unit for a person: bytes in B/KiB/MiB/GiB, milliseconds as a
/// duration or in ms.
pub(crate) fn stat_cell(unit: Unit, v: &Value) -> String {
    match (unit, v) {
        (Unit::Bytes, Value::Number(n)) if n.is_u64() => human_bytes(n.as_u64().unwrap_or(0)),
        (Unit::Milliseconds, Value::Number(n)) if n.is_u64() => {
            human_duration(n.as_u64().unwrap_or(0))
        }
        (Unit::Milliseconds, Value::Number(n)) => human_ms(n.as_f64().unwrap_or(0.0)),
        (_, Value::Bool(b)) => if *b { "yes" } else { "no" }.to_string(),
        (_, v) => v.as_str().map_or_else(|| v.to_string(), str::to_string),
    }
}

/// `1 topic`, `2 topics`.
fn plural(n: u64, thing: &str) -> String {
    match n {
        1 => format!("1 {thing}"),
        n => format!("{n} {thing}s"),
    }
}

/// `93784000` → `1d 2h 3m 4s`: the units from the largest present down to seconds,
/// zeros left out; below a second, `250 ms`.
pub(crate) fn human_duration(ms: u64) -> String {
    if ms < MS_PER_SECOND {
        return format!("{ms} ms");
    }
    let mut left = ms / MS_PER_SECOND;
    let mut parts = Vec::new();
    for (per, unit) in [(86_400, "d"), (3_600, "h"), (60, "m"), (1, "s")] {
        if left >= per {
            parts.push(format!("{}{unit}", left / per));
            left %= per;
        }
    }
    parts.join(" ")
}

/// A latency in ms with the digits that matter: `0.31 ms`, `12.5 ms`, `1500 ms`.
pub(crate) fn human_ms(ms: f64) -> String {
    match ms {
        ms if ms >= 100.0 => format!("{ms:.0} ms"),
        ms if ms >= 10.0 => format!("{ms:.1} ms"),
        ms => format!("{ms:.2} ms"),
    }
}

// ---- read path ----

pub(crate) fn cmd_stats(ctx: &Ctx) -> Outcome {
    if ctx.matches.opt_present("json") {
        let body = ctx.get("/stats")?;
        println!("{}", body.trim_end());
        return Ok(());
    }
    let stats = ctx.stats()?;
    print!("{}", stats_report(&stats));
    Ok(())
}

pub(crate) fn cmd_topics_list(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    if ctx.matches.opt_present("json") {
        print_json(&stats["topics"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = array_of(&stats, "topics")
        .iter()
        .map(|t| {
            let parts = array_of(t, "partitions");
            let records: u64 = parts
                .iter()
                .map(|p| {
                    let (first, last) = (u64_of(p, "first_sequence"), u64_of(p, "last_sequence"));
                    if last >= first.max(1) {
                        last - first.max(1) + 1
                    } else {
                        0
                    }
                })
                .sum();
            let bytes: u64 = parts.iter().map(|p| u64_of(p, "bytes")).sum();
            let segments: u64 = parts.iter().map(|p| u64_of(p, "segments")).sum();
            let dlq = t["dlq_twin"].as_bool().unwrap_or(false);
            vec![
                str_of(t, "name").to_string(),
                u64_of(t, "topic_id").to_string(),
                parts.len().to_string(),
                records.to_string(),
                bytes.to_string(),
                segments.to_string(),
                if dlq { "dlq" } else { "source" }.to_string(),
            ]
        })
        .collect();
    let header = [
        "TOPIC",
        "ID",
        "PARTITIONS",
        "RECORDS",
        "BYTES",
        "SEGMENTS",
        "KIND",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}

const GROUP_HEADER: [&str; 6] = [
    "GROUP",
    "TOPIC",
    "MEMBERS",
    "PARTITIONS",
    "LAG",
    "OUTSTANDING",
];

/// A row per group: name, topic, members, partitions, lag and outstanding deliveries.
pub(crate) fn group_rows(stats: &Value) -> Vec<Vec<String>> {
    array_of(stats, "groups")
        .iter()
        .map(|g| {
            let parts = array_of(g, "partitions");
            let sum = |key: &str| parts.iter().map(|p| u64_of(p, key)).sum::<u64>();
            vec![
                str_of(g, "group").to_string(),
                str_of(g, "topic").to_string(),
                array_of(g, "members").len().to_string(),
                parts.len().to_string(),
                sum("lag").to_string(),
                sum("outstanding").to_string(),
            ]
        })
        .collect()
}

pub(crate) fn cmd_groups_list(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    if ctx.matches.opt_present("json") {
        print_json(&stats["groups"]);
        return Ok(());
    }
    print!("{}", table(&GROUP_HEADER, &group_rows(&stats)));
    Ok(())
}

pub(crate) fn cmd_groups_describe(ctx: &Ctx) -> Outcome {
    let name = ctx.positional(0);
    let topic = ctx.matches.opt_str("topic");
    let stats = ctx.stats()?;
    let found: Vec<&Value> = array_of(&stats, "groups")
        .iter()
        .filter(|g| str_of(g, "group") == name)
        .filter(|g| topic.as_deref().is_none_or(|t| str_of(g, "topic") == t))
        .collect();
    if found.is_empty() {
        let on = topic.map_or(String::new(), |t| format!(" on topic {t}"));
        return runtime_err(format!("no consumer group {name}{on}"));
    }
    if ctx.matches.opt_present("json") {
        print_json(&Value::Array(found.into_iter().cloned().collect()));
        return Ok(());
    }
    for (i, g) in found.iter().enumerate() {
        if i > 0 {
            println!();
        }
        // Group id 0: read back from disk at start, no member has joined since (the
        // broker gives it an id then).
        let group_id = match u64_of(g, "group_id") {
            0 => "restored at start".to_string(),
            id => format!("group id {id}"),
        };
        println!(
            "group {}  topic {}  ({group_id}, topic id {})\n",
            str_of(g, "group"),
            str_of(g, "topic"),
            u64_of(g, "topic_id")
        );
        let members: Vec<Vec<String>> = array_of(g, "members")
            .iter()
            .map(|m| {
                let mode = if m["pull_mode"].as_bool().unwrap_or(false) {
                    "pull"
                } else {
                    "push"
                };
                vec![
                    u64_of(m, "member_id").to_string(),
                    u64_of(m, "subscription_id").to_string(),
                    u64_of(m, "membership_epoch").to_string(),
                    u64_of(m, "assignment_epoch").to_string(),
                    mode.to_string(),
                    format!(
                        "{}/{}",
                        u64_of(m, "credit_count"),
                        u64_of(m, "credit_bytes")
                    ),
                    u64_of(m, "outstanding_count").to_string(),
                ]
            })
            .collect();
        if members.is_empty() {
            println!("no members\n");
        } else {
            let header = [
                "MEMBER",
                "SUBSCRIPTION",
                "MEMBERSHIP_EPOCH",
                "ASSIGNMENT_EPOCH",
                "MODE",
                "CREDIT",
                "OUTSTANDING",
            ];
            println!("{}", table(&header, &members));
        }
        let parts: Vec<Vec<String>> = array_of(g, "partitions")
            .iter()
            .map(|p| {
                let owner = match u64_of(p, "owner") {
                    0 => "-".to_string(),
                    o => o.to_string(),
                };
                vec![
                    u64_of(p, "partition").to_string(),
                    owner,
                    str_of(p, "state").to_string(),
                    u64_of(p, "ownership_epoch").to_string(),
                    u64_of(p, "committed").to_string(),
                    u64_of(p, "lag").to_string(),
                    u64_of(p, "outstanding").to_string(),
                    u64_of(p, "pending_redeliveries").to_string(),
                ]
            })
            .collect();
        let header = [
            "PARTITION",
            "OWNER",
            "STATE",
            "OWNERSHIP_EPOCH",
            "COMMITTED",
            "LAG",
            "OUTSTANDING",
            "REDELIVERIES",
        ];
        print!("{}", table(&header, &parts));
    }
    Ok(())
}

// ---- write path ----

#[cfg(test)]
mod tests {
    use super::*;

    /// The admin room's golden `/stats` document (its resident set size masked there).
    fn golden_stats() -> Value {
        let text = include_str!("../../src/admin/golden/stats.json");
        serde_json::from_str(&text.replace("RSS", "6680576")).unwrap()
    }

    #[test]
    fn stats_reads_as_sections_in_human_units() {
        let report = stats_report(&golden_stats());
        let sections: Vec<&str> = report
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with(' '))
            .collect();
        let mut want = STATS_ORDER.to_vec();
        want.push("groups");
        assert_eq!(sections, want);
        for line in [
            "  uptime        2m 3s",
            "  connections   4 open (17 accepted, 2 refused since start)",
            "  memory        6.4 MiB resident",
            "  closed               auth_failed 2, peer_closed 9, protocol_error 1",
            "  data                      1.9 MiB in 7 segments, 3 topics (each with its .dlq \
             twin)",
            "  headroom                  10.0 GiB free of --max-data-size 10.0 GiB (0.0% used)",
            "  latency  p50 <= 1.00 ms, p99 <= 1500 ms, max 1500 ms (mean 1.76 ms)",
            "  records appended   117",
            "  billing  orders             2           2   37            6",
        ] {
            assert!(
                report.contains(&format!("{line}\n")),
                "{line:?} not in\n{report}"
            );
        }
        // Every figure the table puts in a shown section is on some line, once.
        assert!(!report.contains("uptime ms"), "{report}");
        assert_eq!(report.matches("accepted").count(), 1, "{report}");
    }

    #[test]
    fn durations_and_latencies_read_as_a_person_writes_them() {
        assert_eq!(human_duration(250), "250 ms");
        assert_eq!(human_duration(42_000), "42s");
        assert_eq!(human_duration(93_784_000), "1d 2h 3m 4s");
        assert_eq!(human_duration(3_600_000), "1h");
        assert_eq!(human_ms(0.3069974811083123), "0.31 ms");
        assert_eq!(human_ms(12.54), "12.5 ms");
        assert_eq!(human_ms(1500.0), "1500 ms");
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
    }

    /// A broker without `--max-data-size` says so rather than showing a cap of 0.
    #[test]
    fn headroom_without_a_cap() {
        let mut stats = golden_stats();
        stats["storage"]["max_bytes"] = 0.into();
        let report = stats_report(&stats);
        assert!(
            report.contains("headroom                  no --max-data-size: as much as the disk"),
            "{report}"
        );
    }
}
