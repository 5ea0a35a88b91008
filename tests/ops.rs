//! Operator surface under a service manager (issue 17): log levels and formats, journald
//! priority prefixes, `Type=notify` readiness, the non-loopback warning, and a failed
//! start that must not take a leader epoch. Each test runs real `mortard` processes with
//! their own environment and standard error (not `common::mortard`, which sets RUST_LOG).

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::Duration;

use common::mortard::signal;
use mortarmq::client::Client;

/// How long a broker may take to print `listening ADDR`, or to exit when it cannot start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long the test waits for a datagram on its notify socket.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(20);
/// Exit status of a start that fails at run time (man/mortard.8, EXIT STATUS).
const EXIT_FAILURE: i32 = 1;

/// One `mortard` process with its data directory and standard error in a temp dir.
struct Broker {
    child: Child,
    /// Lines of its standard output, read by a thread.
    stdout: Receiver<String>,
    stderr_path: PathBuf,
}

struct Setup {
    dir: tempfile::TempDir,
    runs: u32,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            dir: tempfile::tempdir().expect("tempdir"),
            runs: 0,
        }
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The file the next broker's standard error goes to (created empty).
    fn next_stderr(&mut self) -> PathBuf {
        self.runs += 1;
        let path = self.dir.path().join(format!("stderr.{}", self.runs));
        File::create(&path).expect("stderr file");
        path
    }

    /// Starts `mortard` with `args` (plus a data dir, and loopback port 0 listeners unless
    /// given), RUST_LOG removed and `env` set, standard error to `stderr`.
    fn spawn(&self, args: &[&str], env: &[(&str, &str)], stderr: &Path) -> Broker {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortard"));
        cmd.arg("--data-dir").arg(self.data_dir()).args(args);
        if !args.contains(&"--listen") {
            cmd.args(["--listen", "127.0.0.1:0"]);
        }
        if !args.contains(&"--admin-listen") {
            cmd.args(["--admin-listen", "127.0.0.1:0"]);
        }
        cmd.env_remove("RUST_LOG")
            .env_remove("JOURNAL_STREAM")
            .env_remove("NOTIFY_SOCKET")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::options().append(true).open(stderr).expect("stderr"));
        let mut child = cmd.spawn().expect("spawn mortard");
        let out = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Broker {
            child,
            stdout: rx,
            stderr_path: stderr.to_path_buf(),
        }
    }

    /// Starts a broker and waits for its `listening ADDR` line.
    fn start(&mut self, args: &[&str], env: &[(&str, &str)]) -> (Broker, SocketAddr) {
        let stderr = self.next_stderr();
        let mut broker = self.spawn(args, env, &stderr);
        let addr = broker.listening();
        (broker, addr)
    }
}

impl Broker {
    /// The address of the `listening ADDR` line on standard output (what tools parse).
    fn listening(&mut self) -> SocketAddr {
        loop {
            match self.stdout.recv_timeout(START_TIMEOUT) {
                Ok(line) => {
                    if let Some(addr) = line.strip_prefix("listening ") {
                        return addr.parse().expect("listening address");
                    }
                }
                Err(e) => {
                    let _ = self.child.kill();
                    panic!("mortard did not start ({e:?}); stderr:\n{}", self.stderr());
                }
            }
        }
    }

    /// Waits for a broker that is expected to fail at start: its standard output closes
    /// when it exits. Returns the exit status and whether it printed `listening`.
    fn failed_start(mut self) -> (ExitStatus, bool, String) {
        let mut listened = false;
        loop {
            match self.stdout.recv_timeout(START_TIMEOUT) {
                Ok(line) => listened |= line.starts_with("listening "),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!("mortard neither started nor exited:\n{}", self.stderr());
                }
            }
        }
        let status = self.child.wait().expect("wait");
        (status, listened, self.stderr())
    }

    /// SIGTERM, wait for the exit, and return standard error.
    fn stop(mut self) -> String {
        signal(self.child.id(), "TERM");
        let status = self.child.wait().expect("wait");
        let text = self.stderr();
        assert!(status.success(), "mortard exited {status}:\n{text}");
        text
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }
}

/// Connects and completes CONNECT, so the broker has accepted (and logged) a connection.
fn connect_once(addr: SocketAddr) {
    let client = Client::connect(addr, b"").expect("connect");
    drop(client);
}

#[test]
fn json_log_format_writes_one_object_per_line() {
    let mut setup = Setup::new();
    let (broker, addr) = setup.start(&["--log-format", "json"], &[]);
    connect_once(addr);
    let text = broker.stop();
    let mut messages = Vec::new();
    for line in text.lines() {
        let value: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON object ({e}): {line}"));
        for key in ["ts", "level", "target", "msg"] {
            assert!(value[key].is_string(), "no string {key:?} in {line}");
        }
        let ts = value["ts"].as_str().unwrap();
        assert!(
            ts.len() >= 20 && ts.ends_with('Z') && ts.contains('T'),
            "{ts}"
        );
        let level = value["level"].as_str().unwrap();
        assert!(["error", "warn", "info"].contains(&level), "{line}");
        messages.push(value["msg"].as_str().unwrap().to_string());
    }
    assert!(
        messages
            .iter()
            .any(|m| m.contains(&format!("listening on {addr}"))),
        "{text}"
    );
    assert!(
        messages.iter().any(|m| m.contains("leader_epoch 1")),
        "{text}"
    );
}

#[test]
fn connection_lines_are_debug_and_log_level_sets_the_filter() {
    let mut setup = Setup::new();
    let (broker, addr) = setup.start(&[], &[]);
    connect_once(addr);
    let text = broker.stop();
    assert!(
        text.contains("listening on"),
        "default level is info:\n{text}"
    );
    assert!(
        !text.contains(" open from "),
        "connection lines at info:\n{text}"
    );

    let (broker, addr) = setup.start(&["--log-level", "debug"], &[]);
    connect_once(addr);
    let text = broker.stop();
    assert!(text.contains(" open from 127.0.0.1:"), "{text}");

    let (broker, _) = setup.start(&["--log-level", "warn"], &[]);
    let text = broker.stop();
    assert!(
        !text.contains("INFO"),
        "--log-level warn logged info:\n{text}"
    );

    // RUST_LOG, when set, wins over the flag (man/mortard.8, ENVIRONMENT).
    let (broker, addr) = setup.start(&["--log-level", "warn"], &[("RUST_LOG", "debug")]);
    connect_once(addr);
    let text = broker.stop();
    assert!(text.contains(" open from "), "{text}");
    assert!(text.contains("overrides --log-level warn"), "{text}");
}

/// The `DEVICE:INODE` systemd would put in JOURNAL_STREAM for this file.
fn dev_ino(path: &Path) -> String {
    let meta = std::fs::metadata(path).expect("stat");
    format!("{}:{}", meta.dev(), meta.ino())
}

#[test]
fn journal_stream_gets_syslog_priority_prefixes() {
    let mut setup = Setup::new();
    let stderr = setup.next_stderr();
    let stream = dev_ino(&stderr);
    // Not loopback and no token file: a warning, so both <4> and <6> lines appear.
    let args = ["--listen", "0.0.0.0:0"];
    let mut broker = setup.spawn(&args, &[("JOURNAL_STREAM", &stream)], &stderr);
    broker.listening();
    let text = broker.stop();
    assert!(!text.is_empty());
    for line in text.lines() {
        let priority = line.get(..3).unwrap_or_default();
        assert!(["<3>", "<4>", "<6>"].contains(&priority), "{line}");
    }
    let find = |needle: &str| text.lines().find(|l| l.contains(needle)).unwrap_or("");
    assert!(find("listening on").starts_with("<6>"), "{text}");
    assert!(find("is not loopback").starts_with("<4>"), "{text}");

    // JOURNAL_STREAM inherited, but standard error is another file: no prefixes.
    let other = setup.next_stderr();
    let mut broker = setup.spawn(&[], &[("JOURNAL_STREAM", &stream)], &other);
    broker.listening();
    let text = broker.stop();
    assert!(text.lines().all(|l| !l.starts_with('<')), "{text}");
    assert!(text.contains("listening on"), "{text}");
}

/// Receives one datagram from the notify socket.
fn receive(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 256];
    let n = socket.recv(&mut buf).expect("notification");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn notify_socket_gets_ready_after_bind_and_stopping_on_drain() {
    let mut setup = Setup::new();
    let path = setup.dir.path().join("notify");
    let socket = UnixDatagram::bind(&path).expect("bind notify socket");
    socket.set_read_timeout(Some(NOTIFY_TIMEOUT)).unwrap();
    let notify = path.to_str().unwrap().to_string();
    let (broker, addr) = setup.start(&[], &[("NOTIFY_SOCKET", &notify)]);
    assert_eq!(receive(&socket), "READY=1\n");
    // Ready means serving: the listener answers.
    TcpStream::connect(addr).expect("connect after READY=1");
    signal(broker.child.id(), "TERM");
    assert_eq!(receive(&socket), "STOPPING=1\n");
    broker.stop();
}

#[test]
fn notify_socket_may_be_an_abstract_name() {
    use std::os::linux::net::SocketAddrExt;
    let mut setup = Setup::new();
    let name = format!("mortar-ops-test-{}", std::process::id());
    let at = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let socket = UnixDatagram::bind_addr(&at).expect("bind abstract notify socket");
    socket.set_read_timeout(Some(NOTIFY_TIMEOUT)).unwrap();
    let notify = format!("@{name}");
    let (broker, _) = setup.start(&[], &[("NOTIFY_SOCKET", &notify)]);
    assert_eq!(receive(&socket), "READY=1\n");
    broker.stop();
}

fn epoch_file(setup: &Setup) -> Vec<u8> {
    std::fs::read(setup.data_dir().join("epoch")).expect("epoch file")
}

#[test]
fn start_on_a_port_in_use_takes_no_leader_epoch() {
    let mut setup = Setup::new();
    let (broker, _) = setup.start(&[], &[]);
    assert!(broker.stop().contains("leader_epoch 1,"));
    let before = epoch_file(&setup);
    let taken = TcpListener::bind("127.0.0.1:0").expect("occupy a port");
    let port = taken.local_addr().unwrap().to_string();
    for flag in ["--listen", "--admin-listen"] {
        let stderr = setup.next_stderr();
        let broker = setup.spawn(&[flag, &port], &[], &stderr);
        let (status, listened, text) = broker.failed_start();
        assert_eq!(status.code(), Some(EXIT_FAILURE), "{flag}: {text}");
        assert!(!listened, "{flag}: {text}");
        let reason = text.lines().find(|l| l.contains("cannot listen on"));
        assert!(reason.is_some_and(|l| l.contains(&port)), "{flag}: {text}");
        assert_eq!(
            epoch_file(&setup),
            before,
            "{flag} in use changed the epoch"
        );
    }
    let (broker, _) = setup.start(&[], &[]);
    let text = broker.stop();
    assert!(text.contains("leader_epoch 2,"), "{text}");
}

#[test]
fn non_loopback_listen_without_token_file_warns() {
    let warning = "is not loopback and there is no --token-file";
    let mut setup = Setup::new();
    let (broker, _) = setup.start(&["--listen", "0.0.0.0:0"], &[]);
    let text = broker.stop();
    let line = text.lines().find(|l| l.contains(warning)).unwrap_or("");
    assert!(line.contains("WARN"), "{text}");

    let tokens = setup.dir.path().join("tokens");
    std::fs::write(&tokens, "secret\n").unwrap();
    std::fs::set_permissions(&tokens, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let args = [
        "--listen",
        "0.0.0.0:0",
        "--token-file",
        tokens.to_str().unwrap(),
    ];
    let (broker, _) = setup.start(&args, &[]);
    assert!(!broker.stop().contains(warning));

    let (broker, _) = setup.start(&[], &[]);
    assert!(!broker.stop().contains(warning), "warned on loopback");
}
