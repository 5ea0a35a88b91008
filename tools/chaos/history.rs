//! The history: one JSON object per line, each with `ev` (what happened) and `t`
//! (milliseconds since the run started), written as things happen so that a crash of the
//! tool still leaves what came before. The events and their fields:
//!
//! ```text
//! run       nodes seed partitions disk_faults wipe_faults what was started (first)
//! send      producer value partition                      a PUB queued
//! ack       producer value partition sequence leader_epoch commit_seq durability
//!           dedup scan                                    its REPLICATED OK
//! fail      producer value error                          given up (outcome unknown)
//! deliver   member value partition sequence attempt       a MSG handed to a member
//! position  node life role term partition committed       a group position a node shows
//!           uptime_ms                                     (lower: the same pid re-exec'd)
//! fault     kind phase(begin|end) node detail             a fault and its end; a
//!           disk{node role syscall errno when strace}     DiskFault's begin says what
//!           disk{injected calls strace_exit               it failed where, its end how
//!           node_error_lines node_errors}                 often and what the node logged
//! wipe      node life_before life files bytes removed     a follower's data directory
//!           started                                       deleted (`--wipe-faults`)
//! log       node partition records[[sequence, value]…]    a node's log after healing
//! note      text                                          anything else worth reading
//! ```
//!
//! `scan` numbers the producer's looks at its finished sends: answers found in one look
//! arrived in an order the client cannot tell, so the epoch rule compares looks.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use serde_json::{json, Value};

pub struct History {
    out: Mutex<BufWriter<File>>,
    start: Instant,
}

impl History {
    pub fn create(path: &Path) -> Result<History, String> {
        let file = File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(History {
            out: Mutex::new(BufWriter::new(file)),
            start: Instant::now(),
        })
    }

    pub fn ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Writes `fields` with `ev` and `t` added.
    pub fn add(&self, ev: &str, mut fields: Value) {
        fields["ev"] = json!(ev);
        fields["t"] = json!(self.ms());
        let mut out = self.out.lock().unwrap_or_else(|e| e.into_inner());
        let _ = writeln!(out, "{fields}");
    }

    pub fn flush(&self) {
        let _ = self.out.lock().unwrap_or_else(|e| e.into_inner()).flush();
    }
}

/// Reads a history back: every line a JSON object.
pub fn read(path: &Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", n + 1)))
        .collect()
}
