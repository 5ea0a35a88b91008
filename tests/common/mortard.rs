//! Starts a real `mortard` process on a free port with a temporary data directory.
//! Its log goes to `<data dir>/../mortard.log`, printed when a test fails (on drop
//! while panicking).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use mortarmq::client::Client;

/// How long a started broker may take to print its listening line.
const START_TIMEOUT: Duration = Duration::from_secs(20);

pub struct Mortard {
    child: Option<Child>,
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    dir: tempfile::TempDir,
    data_name: String,
    args: Vec<String>,
    /// RLIMIT_NOFILE (soft, hard) the broker process starts with; `None`: inherited.
    nofile: Option<(u64, u64)>,
    /// A command the broker runs under (`strace …`): its words, the broker's path last.
    wrapper: Vec<String>,
    /// The broker's own pid when it runs under a wrapper (the child is the wrapper).
    wrapped_pid: Option<u32>,
}

impl Mortard {
    pub fn start(args: &[&str]) -> Mortard {
        Mortard::start_in("data", args)
    }

    /// Like `start`, on a port of its own that stays the same across restarts, so that
    /// clients can reconnect to the address they know.
    pub fn start_on_fixed_port(args: &[&str]) -> Mortard {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut all = vec!["--listen", listen.as_str()];
        all.extend_from_slice(args);
        Mortard::start(&all)
    }

    /// Like `start`, with the data directory named `data_name` (inside a temp dir).
    pub fn start_in(data_name: &str, args: &[&str]) -> Mortard {
        Mortard::start_with(data_name, args, None)
    }

    /// Like `start`, with the broker's RLIMIT_NOFILE set to (soft, hard) before it runs,
    /// so that a test can make its `accept` hit EMFILE.
    pub fn start_with_nofile(args: &[&str], soft: u64, hard: u64) -> Mortard {
        Mortard::start_with("data", args, Some((soft, hard)))
    }

    /// [`Mortard::start_in`] under a RLIMIT_NOFILE of `nofile` (soft and hard).
    pub fn start_in_with_nofile(data_name: &str, args: &[&str], nofile: u64) -> Mortard {
        Mortard::start_with(data_name, args, Some((nofile, nofile)))
    }

    /// Like `start`, under the command `wrapper` makes from the data directory (such as
    /// `strace -P <a segment file in it> …`); the broker's path is appended to it.
    pub fn start_wrapped(wrapper: impl FnOnce(&Path) -> Vec<String>, args: &[&str]) -> Mortard {
        let mut m = Mortard::new("data", args, None);
        m.wrapper = wrapper(&m.data_dir());
        m.spawn();
        m
    }

    fn start_with(data_name: &str, args: &[&str], nofile: Option<(u64, u64)>) -> Mortard {
        let mut m = Mortard::new(data_name, args, nofile);
        m.spawn();
        m
    }

    fn new(data_name: &str, args: &[&str], nofile: Option<(u64, u64)>) -> Mortard {
        Mortard {
            child: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            admin: None,
            dir: tempfile::tempdir().expect("tempdir"),
            data_name: data_name.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            nofile,
            wrapper: Vec::new(),
            wrapped_pid: None,
        }
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join(&self.data_name)
    }

    /// `GET`/other method on the admin listener: (status, body).
    pub fn http(&self, method: &str, path: &str) -> (u16, String) {
        self.try_http(method, path).expect("admin request")
    }

    /// [`Mortard::http`], `None` when the listener does not answer (the process is
    /// restarting itself).
    pub fn try_http(&self, method: &str, path: &str) -> Option<(u16, String)> {
        use std::io::{Read, Write};
        let addr = self.admin.expect("admin listener");
        let mut s = TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        let status = text.split(' ').nth(1).and_then(|c| c.parse().ok())?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        Some((status, body))
    }

    /// The broker's count of damaged records met so far (`/stats` storage.corrupt_records).
    pub fn corrupt_records(&self) -> u64 {
        let (_, body) = self.http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        stats["storage"]["corrupt_records"].as_u64().unwrap()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mortard.log")
    }

    pub fn pid(&self) -> u32 {
        self.wrapped_pid
            .unwrap_or_else(|| self.child.as_ref().expect("running").id())
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let broker = env!("CARGO_BIN_EXE_mortard");
        let mut cmd = match self.wrapper.split_first() {
            Some((program, words)) => {
                let mut cmd = Command::new(program);
                cmd.args(words).arg(broker);
                cmd
            }
            None => Command::new(broker),
        };
        if !self
            .args
            .iter()
            .any(|a| a == "--listen" || a.starts_with("--listen="))
        {
            cmd.arg("--listen").arg("127.0.0.1:0");
        }
        cmd.arg("--data-dir")
            .arg(self.data_dir())
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("MORTARD_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log));
        if !self.args.iter().any(|a| a.starts_with("--admin-listen")) {
            cmd.arg("--admin-listen").arg("127.0.0.1:0");
        }
        if let Some((soft, hard)) = self.nofile {
            use std::os::unix::process::CommandExt;
            let limit = rustix::process::Rlimit {
                current: Some(soft),
                maximum: Some(hard),
            };
            // SAFETY: the closure runs in the forked child before exec and makes one
            // async-signal-safe system call (setrlimit), touching no locks or memory.
            unsafe {
                cmd.pre_exec(move || {
                    rustix::process::setrlimit(rustix::process::Resource::Nofile, limit)
                        .map_err(std::io::Error::from)
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn mortard");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = Instant::now() + START_TIMEOUT;
        let mut addr = None;
        let admin_off = self
            .args
            .windows(2)
            .any(|w| w[0] == "--admin-listen" && w[1] == "off");
        self.admin = None;
        while addr.is_none() || (!admin_off && self.admin.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = rx.recv_timeout(left).unwrap_or_else(|_| {
                let _ = child.kill();
                panic!("mortard did not start; log:\n{}", self.log_text())
            });
            if let Some(a) = line.strip_prefix("listening ") {
                addr = Some(a.parse().expect("listening address"));
            } else if let Some(a) = line.strip_prefix("admin ") {
                self.admin = Some(a.parse().expect("admin address"));
            }
        }
        // Later lines (the admin address) arrive without waiting here.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        self.addr = addr.unwrap();
        if !self.wrapper.is_empty() {
            // The wrapper's only child: the broker, which has printed its address.
            let children = format!("/proc/{0}/task/{0}/children", child.id());
            let pid = std::fs::read_to_string(children).expect("wrapper's children");
            self.wrapped_pid = Some(pid.split_whitespace().next().unwrap().parse().unwrap());
        }
        self.child = Some(child);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn client(&self) -> Client {
        let c = Client::connect(self.addr, b"").expect("connect");
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c
    }

    pub fn raw(&self) -> TcpStream {
        let s = TcpStream::connect(self.addr).expect("tcp connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// SIGKILL: no chance to flush or sync anything.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = self.wrapped_pid.take() {
                signal(pid, "KILL");
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit status (a wrapper such as strace exits with its
    /// command's).
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(self.wrapped_pid.take().unwrap_or(child.id()), "TERM");
        child.wait().expect("wait")
    }

    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.terminate();
        }
        self.spawn();
    }

    /// Restarts without the wrapper `start_wrapped` gave it: the fault is gone.
    pub fn restart_unwrapped(&mut self) {
        self.wrapper.clear();
        self.restart();
    }

    pub fn restart_after_kill9(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => c.try_wait().ok().flatten().is_none(),
            None => false,
        }
    }

    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid())
    }
}

/// A loopback port nobody listens on now. Binding port 0 and closing it leaves a small
/// race with other processes; the broker reports a clear error if it loses it.
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    l.local_addr().expect("local address").port()
}

pub fn signal(pid: u32, name: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status();
}

pub fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

pub fn dir_exists(p: &Path) -> bool {
    p.is_dir()
}

impl Drop for Mortard {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!("---- mortard log ----\n{}", self.log_text());
        }
    }
}
