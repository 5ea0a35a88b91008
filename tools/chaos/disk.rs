//! Disk faults (`--disk-faults`, off by default): `strace` attached to one running node
//! fails some of its data-file syscalls for the fault's hold, then detaches; the fault's
//! end restarts the node (kill -9, start on its data directory) whatever state it is in.
//! The choices (which node, which syscall, which errno, which calls) come from the seed
//! through the pure [`choose`]; the command line through the pure [`strace_args`]; both
//! are unit-tested (`tests.rs`).
//!
//! What can be failed, and why only that (`tests/faults.rs` does the same to a single
//! node, `docs/STORAGE.md` says what each file is):
//! - `fdatasync`: in `mortard` only data files are synced (raft journal, segments and
//!   their indexes, recovery points, meta files); a failure poisons what it covered.
//! - `pwrite64`: only data files are written at an offset (journal entries, records,
//!   index entries, headers).
//! - `write` to `raft-state.tmp` only (`-P`): the hard state (term, vote) goes through
//!   a temporary file written with write(2). Other writes are stderr, pipes and mio's
//!   eventfd waker: failing those would fault the process, not its disk.
//!
//! Each injection is bounded by `when=first..last`, counted per thread (strace counts
//! per tracee): a disk that fails a few calls and then works again, as a flaky disk or
//! a briefly full file system does. Ptrace stops every syscall of the node while
//! attached (`--seccomp-bpf` does not apply to `-p`), so the node is also slowed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use mortarmq::log::simdisk::SimRng;
use serde_json::{json, Value};

use crate::faults::follower_of;

/// How long strace may take to attach every thread of the node.
const ATTACH_TIMEOUT_MS: u64 = 5_000;
/// How long strace may take to detach after SIGTERM.
const DETACH_TIMEOUT_MS: u64 = 5_000;
/// The first failed call (per thread) is drawn in `1..=FIRST_MAX`.
const FIRST_MAX: u64 = 8;
/// Calls failed in a row (per thread), drawn in `1..=FAILED_MAX`.
const FAILED_MAX: u64 = 32;
/// Error lines of the node's log copied into the fault's end event.
const LOG_LINES_KEPT: usize = 4;
/// The temporary file the hard state is written to before its rename
/// (`broker/replica/storage.rs` `RAFT_STATE_FILE` and `log/meta.rs` `META_TMP_SUFFIX`).
const RAFT_STATE_TMP: &str = "raft-state.tmp";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Syscall {
    Fdatasync,
    Pwrite64,
    /// `write` to `raft-state.tmp` only.
    WriteRaftState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Errno {
    Eio,
    Enospc,
}

/// One disk fault as drawn: where and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// The node hit (an index), the leader or a follower.
    pub node: usize,
    pub on_leader: bool,
    pub syscall: Syscall,
    pub errno: Errno,
    /// The calls failed, per thread: `first..=last`.
    pub first: u64,
    pub last: u64,
}

impl Syscall {
    fn name(self) -> &'static str {
        match self {
            Syscall::Fdatasync => "fdatasync",
            Syscall::Pwrite64 => "pwrite64",
            Syscall::WriteRaftState => "write",
        }
    }
}

impl Errno {
    fn name(self) -> &'static str {
        match self {
            Errno::Eio => "EIO",
            Errno::Enospc => "ENOSPC",
        }
    }
}

/// Draws a disk fault among `n` nodes whose leader is `leader` (an index): the leader or
/// a follower, then the syscall, the errno and the calls failed.
pub fn choose(n: usize, leader: usize, rng: &mut SimRng) -> Choice {
    let on_leader = rng.below(2) == 0;
    let node = match on_leader {
        true => leader,
        false => follower_of(n, leader, rng),
    };
    let syscall = match rng.below(3) {
        0 => Syscall::Fdatasync,
        1 => Syscall::Pwrite64,
        _ => Syscall::WriteRaftState,
    };
    let errno = match rng.below(2) {
        0 => Errno::Eio,
        _ => Errno::Enospc,
    };
    let first = 1 + rng.below(FIRST_MAX);
    let last = first + rng.below(FAILED_MAX);
    Choice {
        node,
        on_leader,
        syscall,
        errno,
        first,
        last,
    }
}

/// The strace command line for `choice` on process `pid` whose data directory is `data`,
/// its trace of the failed syscall going to `out`.
pub fn strace_args(pid: u32, data: &Path, choice: &Choice, out: &Path) -> Vec<String> {
    let name = choice.syscall.name();
    let mut args = vec![
        "strace".to_string(),
        "-qq".into(),
        "-f".into(),
        "-p".into(),
        pid.to_string(),
        "-e".into(),
        format!("trace={name}"),
        "-e".into(),
        "signal=none".into(),
        "-e".into(),
        format!(
            "inject={name}:error={}:when={}..{}",
            choice.errno.name(),
            choice.first,
            choice.last
        ),
    ];
    if choice.syscall == Syscall::WriteRaftState {
        args.push("-P".into());
        args.push(data.join(RAFT_STATE_TMP).display().to_string());
    }
    args.push("-o".into());
    args.push(out.display().to_string());
    args
}

/// The history's account of `choice` on node `id`.
pub fn describe(choice: &Choice, id: u8, args: &[String]) -> Value {
    json!({
        "node": id,
        "role": if choice.on_leader { "leader" } else { "follower" },
        "syscall": choice.syscall.name(),
        "errno": choice.errno.name(),
        "when": format!("{}..{}", choice.first, choice.last),
        "strace": args.join(" "),
    })
}

/// Calls strace's trace shows it failed (`(INJECTED)`), and calls it shows in all: each
/// completed call once, a call another thread interrupted (`<unfinished ...>`) on the
/// line of its `resumed>` end.
pub fn count_injected(trace: &str) -> (u64, u64) {
    let done = (trace.lines()).filter(|l| l.contains(" = ") && !l.ends_with("<unfinished ...>"));
    let (mut injected, mut calls) = (0, 0);
    for line in done {
        calls += 1;
        if line.trim_end().ends_with("(INJECTED)") {
            injected += 1;
        }
    }
    (injected, calls)
}

/// An attached strace, until [`Injection::detach`].
pub struct Injection {
    pub choice: Choice,
    /// [`describe`]'s account, for the history.
    pub what: Value,
    strace: Child,
    out: PathBuf,
    log: PathBuf,
    /// The node's log length when strace attached: what it logs under the fault follows.
    log_from: u64,
}

/// Starts strace on node `id`'s process `pid` (its data directory and log given) and
/// waits until it traces every thread of the node.
pub fn attach(
    pid: u32,
    id: u8,
    (data, log): (&Path, &Path),
    choice: Choice,
    out: &Path,
) -> Result<Injection, String> {
    let args = strace_args(pid, data, &choice, out);
    let log_from = std::fs::metadata(log).map_or(0, |m| m.len());
    let strace = Command::new(&args[0])
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("strace: {e}"))?;
    let mut injection = Injection {
        what: describe(&choice, id, &args),
        choice,
        strace,
        out: out.to_path_buf(),
        log: log.to_path_buf(),
        log_from,
    };
    let deadline = Instant::now() + Duration::from_millis(ATTACH_TIMEOUT_MS);
    let tracer = injection.strace.id();
    while !traced_by(pid, tracer) {
        if let Ok(Some(status)) = injection.strace.try_wait() {
            return Err(format!("strace exited before attaching: {status}"));
        }
        if Instant::now() >= deadline {
            let _ = injection.detach();
            return Err(format!("strace did not attach to {pid}"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(injection)
}

/// Every thread of `pid` has `tracer` as its tracer (`/proc/PID/task/*/status`).
fn traced_by(pid: u32, tracer: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let want = format!("TracerPid:\t{tracer}");
    let mut any = false;
    for task in tasks.flatten() {
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        if !status.lines().any(|l| l == want) {
            return false;
        }
        any = true;
    }
    any
}

impl Injection {
    /// Detaches (SIGTERM: strace lets every tracee go on) and returns what the fault
    /// did, for the history: calls failed and seen, the node's error lines meanwhile.
    pub fn detach(mut self) -> Value {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.strace.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_millis(DETACH_TIMEOUT_MS);
        while matches!(self.strace.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        // Stuck (it should not be): SIGKILL; the node is killed and started next anyway.
        if matches!(self.strace.try_wait(), Ok(None)) {
            let _ = self.strace.kill();
        }
        let status = self.strace.wait().map(|s| s.to_string());
        let trace = std::fs::read_to_string(&self.out).unwrap_or_default();
        let (injected, calls) = count_injected(&trace);
        let (errors, first_errors) = self.node_errors();
        json!({
            "injected": injected,
            "calls": calls,
            "strace_exit": status.unwrap_or_else(|e| e.to_string()),
            "node_error_lines": errors,
            "node_errors": first_errors,
        })
    }

    /// The node's ERROR lines since the fault began: how many, and the first few.
    fn node_errors(&self) -> (usize, Vec<String>) {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let from = (self.log_from as usize).min(text.len());
        let text = String::from_utf8_lossy(&text[from..]);
        let errors: Vec<&str> = text.lines().filter(|l| l.contains(" ERROR ")).collect();
        let kept = errors.iter().take(LOG_LINES_KEPT).map(|l| l.to_string());
        (errors.len(), kept.collect())
    }
}
