//! The read commands over admin `/stats`: `stats`, `topics list`, `groups list` and
//! `groups describe`, as aligned tables or the JSON itself.

use mortarmq::admin::Unit;
use serde_json::Value;

use crate::{runtime_err, Ctx, Outcome};

/// `stats` also shows byte counts from this size up in KiB, MiB or GiB.
pub(crate) const HUMAN_BYTES_MIN: u64 = 1024;

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

/// One `section.key  value` row per figure of the metrics table that `/stats` shows for
/// the whole broker, in document order; per-label objects give a row per label, and
/// topics and groups are counted (`topics list` and `groups list` show them).
pub(crate) fn stats_rows(stats: &Value) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for metric in mortarmq::admin::in_stats_order() {
        let path = metric.path.unwrap_or_default();
        if let Some((list, _)) = path.split_once("[]") {
            if !rows.iter().any(|r| r[0] == list) {
                rows.push(vec![
                    list.to_string(),
                    array_of(stats, list).len().to_string(),
                ]);
            }
            continue;
        }
        match stats.pointer(&format!("/{}", path.replace('.', "/"))) {
            Some(Value::Object(by_label)) => rows.extend(
                by_label
                    .iter()
                    .map(|(label, v)| vec![format!("{path}.{label}"), stat_cell(metric.unit, v)]),
            ),
            Some(v) => rows.push(vec![path.to_string(), stat_cell(metric.unit, v)]),
            // A broker older than this mortarctl: nothing to show.
            None => {}
        }
    }
    rows
}

/// A value as JSON shows it, byte counts also in KiB/MiB/GiB.
pub(crate) fn stat_cell(unit: Unit, v: &Value) -> String {
    let mut cell = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    if let (Unit::Bytes, Some(n)) = (unit, v.as_u64().filter(|n| *n >= HUMAN_BYTES_MIN)) {
        cell = format!("{cell} ({})", human_bytes(n));
    }
    cell
}

// ---- read path ----

pub(crate) fn cmd_stats(ctx: &Ctx) -> Outcome {
    if ctx.matches.opt_present("json") {
        let body = ctx.get("/stats")?;
        println!("{}", body.trim_end());
        return Ok(());
    }
    let stats = ctx.stats()?;
    print!("{}", table(&["STAT", "VALUE"], &stats_rows(&stats)));
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

pub(crate) fn cmd_groups_list(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    if ctx.matches.opt_present("json") {
        print_json(&stats["groups"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = array_of(&stats, "groups")
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
        .collect();
    let header = [
        "GROUP",
        "TOPIC",
        "MEMBERS",
        "PARTITIONS",
        "LAG",
        "OUTSTANDING",
    ];
    print!("{}", table(&header, &rows));
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
