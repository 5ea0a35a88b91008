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
}

impl Mortard {
    pub fn start(args: &[&str]) -> Mortard {
        Mortard::start_in("data", args)
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

    fn start_with(data_name: &str, args: &[&str], nofile: Option<(u64, u64)>) -> Mortard {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut m = Mortard {
            child: None,
            addr: "127.0.0.1:0".parse().unwrap(),
            admin: None,
            dir,
            data_name: data_name.to_string(),
            args: args.iter().map(|s| s.to_string()).collect(),
            nofile,
        };
        m.spawn();
        m
    }

    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join(&self.data_name)
    }

    /// `GET`/other method on the admin listener: (status, body).
    pub fn http(&self, method: &str, path: &str) -> (u16, String) {
        use std::io::{Read, Write};
        let addr = self.admin.expect("admin listener");
        let mut s = TcpStream::connect(addr).expect("admin connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut text = String::new();
        s.read_to_string(&mut text).expect("admin response");
        let status = text
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .expect("status");
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_string();
        (status, body)
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mortard.log")
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortard"));
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
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        signal(child.id(), "TERM");
        child.wait().expect("wait")
    }

    pub fn restart(&mut self) {
        if self.child.is_some() {
            self.terminate();
        }
        self.spawn();
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
