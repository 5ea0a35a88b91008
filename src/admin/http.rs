//! The admin HTTP listener: one tiny_http thread, which never touches reactor or broker
//! state (see the room's doc in `src/admin.rs`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{render_metrics, render_stats, AdminRequest, Snapshot};

/// How long a request waits for the reactor's snapshot before answering 503.
pub const SNAPSHOT_TIMEOUT_MS: u64 = 2_000;
/// The reactor counts as stalled when it has not turned for this long (it turns at
/// least once a second, for housekeeping).
pub const REACTOR_STALL_MS: u64 = 5_000;
/// Name of the probe file `/healthz` writes to check the data directory.
const HEALTH_PROBE_FILE: &str = ".healthz-probe";
/// errno for "no space left on device": the probe's failure worth naming.
const ENOSPC: i32 = 28;
/// /proc/self/status gives VmRSS in KiB.
const BYTES_PER_KIB: u64 = 1024;

pub struct Admin {
    pub addr: SocketAddr,
    server: Arc<tiny_http::Server>,
    thread: Option<JoinHandle<()>>,
}

impl Admin {
    /// Binds the admin listener and starts its thread.
    pub fn start(
        addr: SocketAddr,
        data_dir: PathBuf,
        requests: Sender<AdminRequest>,
        wake: Arc<dyn Fn() + Send + Sync>,
        last_turn_ms: Arc<AtomicU64>,
        started: Instant,
    ) -> Result<Admin, String> {
        let server = tiny_http::Server::http(addr)
            .map_err(|e| format!("cannot listen on --admin-listen {addr}: {e}"))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or("admin listener has no IP address")?;
        let server = Arc::new(server);
        let serving = Arc::clone(&server);
        let thread = std::thread::Builder::new()
            .name("mortar-admin".into())
            .spawn(move || {
                let ctx = Ctx {
                    data_dir,
                    requests,
                    wake,
                    last_turn_ms,
                    started,
                };
                for request in serving.incoming_requests() {
                    ctx.serve(request);
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(Admin {
            addr,
            server,
            thread: Some(thread),
        })
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Ctx {
    data_dir: PathBuf,
    requests: Sender<AdminRequest>,
    wake: Arc<dyn Fn() + Send + Sync>,
    last_turn_ms: Arc<AtomicU64>,
    started: Instant,
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("static header")
}

impl Ctx {
    fn serve(&self, request: tiny_http::Request) {
        let url = request.url().to_string();
        let (path, query) = url.split_once('?').unwrap_or((&url, ""));
        let known = matches!(path, "/healthz" | "/metrics" | "/stats");
        let (status, content_type, body) = if !known {
            (404, "text/plain", "not found\n".to_string())
        } else if *request.method() != tiny_http::Method::Get {
            (405, "text/plain", "only GET\n".to_string())
        } else {
            match path {
                "/healthz" => match self.health() {
                    Ok(()) => (200, "text/plain", "ok\n".to_string()),
                    Err(why) => (503, "text/plain", format!("{why}\n")),
                },
                _ => match self.snapshot() {
                    Some(s) if path == "/metrics" => {
                        (200, "text/plain; version=0.0.4", render_metrics(&s))
                    }
                    Some(s) => {
                        let pretty = query.split('&').any(|q| q == "pretty" || q == "pretty=1");
                        (200, "application/json", render_stats(&s, pretty))
                    }
                    None => (
                        503,
                        "text/plain",
                        "the reactor did not answer in time\n".into(),
                    ),
                },
            }
        };
        // The whole body is known: send Content-Length, never chunked (tiny_http chunks
        // bodies over 32 KiB by default, which simple scripts and clients mishandle).
        let mut response = tiny_http::Response::from_string(body)
            .with_status_code(status)
            .with_chunked_threshold(usize::MAX);
        response.add_header(header("Content-Type", content_type));
        if status == 405 {
            response.add_header(header("Allow", "GET"));
        }
        let _ = request.respond(response);
    }

    fn health(&self) -> Result<(), String> {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.last_turn_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) > REACTOR_STALL_MS {
            return Err(format!("reactor stalled: no turn for {} ms", now - last));
        }
        let probe = self.data_dir.join(HEALTH_PROBE_FILE);
        let written = std::fs::write(&probe, b"ok");
        let _ = std::fs::remove_file(&probe);
        match written {
            Ok(()) => Ok(()),
            Err(e) if e.raw_os_error() == Some(ENOSPC) => Err("disk full: data directory".into()),
            Err(e) => Err(format!("data directory not writable: {e}")),
        }
    }

    fn snapshot(&self) -> Option<Box<Snapshot>> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.requests.send(AdminRequest { reply: tx }).ok()?;
        (self.wake)();
        let mut snapshot = rx
            .recv_timeout(Duration::from_millis(SNAPSHOT_TIMEOUT_MS))
            .ok()?;
        // Read here, not on the reactor thread, which never waits on a file.
        snapshot.rss_bytes = rss_bytes();
        Some(snapshot)
    }
}

/// Takes every waiting admin request without blocking (the reactor, once per turn).
pub fn pending_requests(rx: &Receiver<AdminRequest>) -> impl Iterator<Item = AdminRequest> + '_ {
    rx.try_iter()
}

/// The process's resident set size, from /proc (0 where unavailable).
pub fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * BYTES_PER_KIB)
}
