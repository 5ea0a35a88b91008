//! The admin write commands and `topics describe` (issue 17): `groups delete`,
//! `groups reset`, `topics purge`, `topics describe`, over the admin listener's routes
//! (`src/admin/manage.rs`). Changes send the token as `Authorization: Bearer`.

use std::io::{Read, Write};
use std::time::Duration;

use getopts::Options;
use serde_json::Value;

use crate::http::{dechunk, dial};
use crate::inspect::{array_of, human_bytes, print_json, str_of, table, u64_of};
use crate::{check_name, check_topic_or_twin, json_option, runtime_err, usage_err};
use crate::{Ctx, Failure, Outcome, Via};

pub(crate) fn group_options(o: &mut Options) {
    o.reqopt("", "topic", "the topic the group consumes", "TOPIC");
}

pub(crate) fn reset_options(o: &mut Options) {
    group_options(o);
    o.reqopt(
        "",
        "to",
        "earliest, latest, sequence:N, time:RFC3339 or time:MS (ms since the epoch)",
        "WHERE",
    );
    o.optopt("", "partition", "only this partition (default: all)", "P");
    json_option(o);
}

/// `%XX` for every byte but the unreserved ones (RFC 3986).
fn encode(text: &str) -> String {
    let unreserved = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    let encoded = text.bytes().map(|b| match unreserved(b) {
        true => (b as char).to_string(),
        false => format!("%{b:02X}"),
    });
    encoded.collect()
}

/// One request with `Connection: close`, the token as a Bearer credential when there is
/// one; (status, body). `timeout` bounds the connect, the write and each read.
fn http_send(
    admin: &str,
    method: &str,
    path: &str,
    token: &[u8],
    timeout: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = dial(admin, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let auth = match token.is_empty() {
        true => String::new(),
        false => format!(
            "Authorization: Bearer {}\r\n",
            String::from_utf8_lossy(token)
        ),
    };
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {admin}\r\nAccept: application/json\r\n\
         {auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((status, body))
}

/// Sends one admin request; the JSON of a 200 answer, else the broker's error as text.
fn request(ctx: &Ctx, method: &str, path: &str) -> Result<Value, Failure> {
    let sent = http_send(&ctx.admin, method, path, &ctx.token, ctx.timeout);
    let (status, body) = sent.map_err(|e| {
        Failure::Runtime(format!("admin {}: {}", ctx.admin, ctx.io(&e, Via::Admin)))
    })?;
    let json: Option<Value> = serde_json::from_str(&body).ok();
    if status == 200 {
        return json.map_or_else(
            || runtime_err(format!("admin {}{path}: not JSON", ctx.admin)),
            Ok,
        );
    }
    let Some(err) = json.filter(|j| j["error"].is_string()) else {
        return runtime_err(format!(
            "admin {}{path}: HTTP {status}: {}",
            ctx.admin,
            body.trim()
        ));
    };
    let code = err["code"]
        .as_str()
        .map_or(String::new(), |c| format!(" ({c})"));
    let hint = match status {
        401 if ctx.token.is_empty() => {
            "\nhint: give the broker's token with --token, --token-file or $MORTAR_TOKEN"
        }
        401 => "\nhint: the token given is not in the broker's --token-file",
        409 => "\nhint: stop the group's consumers, then run the command again",
        421 => {
            "\nhint: a cluster takes these changes on its leader: run the command with \
                --admin set to the admin listener of the node named"
        }
        503 if err["code"].is_string() => {
            "\nhint: the cluster cannot take the change now (no reachable leader or \
             majority); try again in a moment"
        }
        _ => "",
    };
    runtime_err(format!(
        "{}{code}: {} (HTTP {status}){hint}",
        str_of(&err, "error"),
        str_of(&err, "message")
    ))
}

fn group_and_topic(ctx: &Ctx) -> Result<(String, String), Failure> {
    let group = ctx.positional(0);
    check_name("GROUP", "group", group)?;
    let topic = ctx.matches.opt_str("topic").unwrap_or_default();
    check_topic_or_twin("--topic", &topic)?;
    Ok((group.to_string(), topic))
}

pub(crate) fn cmd_groups_delete(ctx: &Ctx) -> Outcome {
    let (group, topic) = group_and_topic(ctx)?;
    let path = format!("/groups/{}?topic={}", encode(&group), encode(&topic));
    request(ctx, "DELETE", &path)?;
    println!("deleted group {group} on topic {topic}");
    Ok(())
}

pub(crate) fn cmd_groups_reset(ctx: &Ctx) -> Outcome {
    let (group, topic) = group_and_topic(ctx)?;
    let to = ctx.matches.opt_str("to").unwrap_or_default();
    if let Err(why) = mortarmq::admin::parse_reset_to(&to) {
        return usage_err(format!("--to: {why}"));
    }
    let mut path = format!(
        "/groups/{}/reset?topic={}&to={}",
        encode(&group),
        encode(&topic),
        encode(&to)
    );
    if let Some(p) = ctx.matches.opt_str("partition") {
        let p: u16 = crate::wire_cmds::parse_num("--partition", &p)?;
        path.push_str(&format!("&partition={p}"));
    }
    let done = request(ctx, "POST", &path)?;
    if ctx.matches.opt_present("json") {
        print_json(&done);
        return Ok(());
    }
    println!("group {group} on topic {topic} reset to {to}:");
    let rows: Vec<Vec<String>> = array_of(&done, "partitions")
        .iter()
        .map(|p| {
            vec![
                u64_of(p, "partition").to_string(),
                u64_of(p, "next_sequence").to_string(),
            ]
        })
        .collect();
    print!("{}", table(&["PARTITION", "NEXT_SEQUENCE"], &rows));
    Ok(())
}

pub(crate) fn cmd_topics_purge(ctx: &Ctx) -> Outcome {
    let topic = ctx.topic_or_twin()?;
    let done = request(ctx, "POST", &format!("/topics/{}/purge", encode(topic)))?;
    let purged: u64 = array_of(&done, "partitions")
        .iter()
        .map(|p| u64_of(p, "records_purged"))
        .sum();
    println!("purged {purged} records from topic {topic}");
    Ok(())
}

pub(crate) fn cmd_topics_describe(ctx: &Ctx) -> Outcome {
    let topic = ctx.topic_or_twin()?;
    let d = request(ctx, "GET", &format!("/topics/{}", encode(topic)))?;
    if ctx.matches.opt_present("json") {
        print_json(&d);
        return Ok(());
    }
    let limit = |n: u64, text: String| {
        if n == 0 {
            "unlimited".to_string()
        } else {
            text
        }
    };
    let (size, age) = (
        u64_of(&d, "retention_size_bytes"),
        u64_of(&d, "retention_age_ms"),
    );
    println!(
        "topic {} (id {}), paired with {}\nretention: size {} per partition, age {}; \
         segments of {}\n",
        str_of(&d, "name"),
        u64_of(&d, "topic_id"),
        str_of(&d, "paired_with"),
        limit(size, human_bytes(size)),
        limit(
            age,
            mortarmq::config::format_duration(Duration::from_millis(age))
        ),
        human_bytes(u64_of(&d, "segment_size_bytes")),
    );
    let cells = |p: &Value, keys: &[&str]| keys.iter().map(|k| u64_of(p, k).to_string()).collect();
    let keys = [
        "partition",
        "first_sequence",
        "last_sequence",
        "records",
        "bytes",
        "segments",
    ];
    let rows: Vec<Vec<String>> = array_of(&d, "partitions")
        .iter()
        .map(|p| cells(p, &keys))
        .collect();
    let header = ["PARTITION", "FIRST", "LAST", "RECORDS", "BYTES", "SEGMENTS"];
    print!("{}", table(&header, &rows));
    let groups = array_of(&d, "groups");
    if groups.is_empty() {
        println!("\nno consumer groups");
        return Ok(());
    }
    let mut rows = Vec::new();
    for g in groups {
        for p in array_of(g, "partitions") {
            let mut row = vec![
                str_of(g, "name").to_string(),
                u64_of(g, "members").to_string(),
            ];
            row.extend(cells(p, &["partition", "committed", "lag"]));
            rows.push(row);
        }
    }
    println!();
    print!(
        "{}",
        table(
            &["GROUP", "MEMBERS", "PARTITION", "COMMITTED", "LAG"],
            &rows
        )
    );
    Ok(())
}
