//! `mortarctl cluster status`: every node's own view of the cluster, one row a node
//! (`docs/REPLICATION.md` §7.5). The node `--admin` names gives the others' admin
//! addresses (from their HELLOs, in its `/stats` `cluster.peers[]`); each is asked for
//! its own `/stats`, so a node cut off from the rest shows what it believes.

use serde_json::{json, Value};

use super::http::{http_get, HttpError};
use super::inspect::{array_of, str_of, table, u64_of};
use super::{runtime_err, Ctx, Outcome};

/// One node as the table shows it: its `cluster` section, or why it did not answer.
struct Node {
    id: u64,
    admin: String,
    view: Result<Value, String>,
}

/// A cluster id drawn from the kernel's random source: ids tell clusters apart, so two
/// must never be drawn alike (no clock or counter).
pub(crate) fn cmd_cluster_id(_: &Ctx) -> Outcome {
    use std::io::Read;
    let mut bytes = [0u8; 8];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if let Err(e) = read {
        return runtime_err(format!("cannot read /dev/urandom: {e}"));
    }
    // All zero means "no id": drawn once in 2^64 tries, but never printed.
    bytes[7] |= u8::from(bytes == [0; 8]);
    println!("{:016x}", u64::from_be_bytes(bytes));
    Ok(())
}

pub(crate) fn cmd_cluster_status(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    let first = &stats["cluster"];
    if !first.is_object() {
        return runtime_err(format!(
            "admin {}: not a cluster node (its /stats has no cluster section: mortard \
             runs without --peers)",
            ctx.admin
        ));
    }
    let mut nodes = vec![Node {
        id: u64_of(first, "node_id"),
        admin: ctx.admin.clone(),
        view: Ok(first.clone()),
    }];
    for peer in array_of(first, "peers") {
        let admin = str_of(peer, "admin_addr").to_string();
        let view = if admin.is_empty() {
            Err("admin address not known yet (no HELLO from it)".to_string())
        } else {
            cluster_of(ctx, &admin)
        };
        let id = u64_of(peer, "id");
        nodes.push(Node { id, admin, view });
    }
    nodes.sort_by_key(|n| n.id);
    let leader = nodes
        .iter()
        .filter_map(|n| n.view.as_ref().ok())
        .map(|c| u64_of(c, "leader_id"))
        .find(|&l| l != 0);
    if ctx.matches.opt_present("json") {
        let all: Vec<Value> = nodes.iter().map(node_json).collect();
        println!(
            "{}",
            json!({ "leader_id": leader.unwrap_or(0), "nodes": all })
        );
    } else {
        let header = [
            "NODE", "ADMIN", "ROLE", "TERM", "LEADER", "COMMIT", "APPLIED", "FIRST", "PEERS",
        ];
        let rows: Vec<Vec<String>> = nodes.iter().map(row).collect();
        print!("{}", table(&header, &rows));
    }
    match leader {
        Some(_) => Ok(()),
        None => runtime_err("no node that answered knows a leader it can reach"),
    }
}

/// The `cluster` section of the `/stats` of the node at `admin`.
fn cluster_of(ctx: &Ctx, admin: &str) -> Result<Value, String> {
    let body = http_get(admin, "/stats", ctx.timeout).map_err(|e| match e {
        HttpError::Io(e) => format!("unreachable: {e}"),
        HttpError::Answer(text) => text,
    })?;
    let stats: Value = serde_json::from_str(&body).map_err(|e| format!("not JSON: {e}"))?;
    Ok(stats["cluster"].clone())
}

fn row(n: &Node) -> Vec<String> {
    let c = match &n.view {
        Ok(c) => c,
        Err(why) => {
            let mut row = vec![n.id.to_string(), n.admin.clone(), "unreachable".into()];
            row.extend(["-", "-", "-", "-", "-"].map(String::from));
            row.push(why.clone());
            return row;
        }
    };
    let leader = match u64_of(c, "leader_id") {
        0 => "none".to_string(),
        l => l.to_string(),
    };
    vec![
        n.id.to_string(),
        n.admin.clone(),
        str_of(c, "role").to_string(),
        u64_of(c, "term").to_string(),
        leader,
        u64_of(c, "commit_index").to_string(),
        u64_of(c, "applied_index").to_string(),
        u64_of(c, "first_index").to_string(),
        links(c),
    ]
}

/// `2 up lag 0, 3 down`: each peer's link as this node sees it, with its lag when this
/// node leads (only a leader tracks it).
pub(crate) fn links(c: &Value) -> String {
    let peer = |p: &Value| {
        let state = if p["link_up"].as_bool() == Some(true) {
            "up"
        } else {
            "down"
        };
        match p["lag"].as_u64() {
            Some(lag) => format!("{} {state} lag {lag}", u64_of(p, "id")),
            None => format!("{} {state}", u64_of(p, "id")),
        }
    };
    let all: Vec<String> = array_of(c, "peers").iter().map(peer).collect();
    all.join(", ")
}

fn node_json(n: &Node) -> Value {
    match &n.view {
        Ok(c) => json!({ "id": n.id, "admin": n.admin, "cluster": c }),
        Err(why) => json!({ "id": n.id, "admin": n.admin, "error": why }),
    }
}
