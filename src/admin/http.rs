//! The admin HTTP listener: one accept thread and a bounded set of connection threads,
//! which never touch reactor or broker state (see the room's doc in `src/admin.rs`).
//!
//! tiny_http's `Server` cannot be bounded from outside (issue 13): it spawns a thread
//! per connection (a failed spawn panics, which `panic = "abort"` makes a dead broker),
//! sets no read timeout, reads a request line of any length into memory, and ends its
//! accept loop for good on the first accept error (EMFILE). So this file accepts on its
//! own listener and reads the request head itself, under [`ADMIN_CONNECTIONS_MAX`],
//! [`ADMIN_REQUEST_TIMEOUT_MS`] and [`ADMIN_REQUEST_HEAD_BYTES_MAX`]; tiny_http still
//! writes every answer (`Response::raw_print`). One request per connection
//! (`Connection: close`): scrapers and `mortarctl` open one per request anyway.

use std::io::{self, BufWriter, Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::manage::{self, ManageAsk, ADMIN_CHANGE_TIMEOUT_MS};
use super::{render_metrics, render_stats, AdminAnswer, AdminAsk, AdminRequest, Snapshot};
use super::{Liveness, NO_LEADER, SINGLE_NODE};

/// How long a request waits for the reactor's snapshot (or page of records) before
/// answering 503.
pub const SNAPSHOT_TIMEOUT_MS: u64 = 2_000;
/// The reactor counts as stalled when it has not turned for this long (it turns at
/// least once a second, for housekeeping).
pub const REACTOR_STALL_MS: u64 = 5_000;
/// Admin connections served at once (a thread each). A new connection past it closes
/// the oldest one still sending its request, so idle connections cannot lock out a
/// `/healthz` probe; when all are being answered it gets 503 at once.
pub const ADMIN_CONNECTIONS_MAX: usize = 16;
/// Connection threads alive at once: the connections served plus evicted ones still
/// ending. At it, the accept thread waits for one to end (up to
/// [`ADMIN_THREAD_WAIT_MS`]), so a flood of connections cannot pile up threads faster
/// than they end; it is accepted only as fast as evicted threads go.
pub const ADMIN_THREADS_MAX: usize = 2 * ADMIN_CONNECTIONS_MAX;
/// How long a newcomer waits for a thread to end before it gets 503. Only evicted
/// threads (blocked in a read that now fails) are waited for, so this is slack for a
/// loaded machine, not a queue.
const ADMIN_THREAD_WAIT_MS: u64 = 1_000;
/// A request's line and headers must arrive whole within this: a client that opens a
/// connection and sends nothing (or a byte a second) holds a slot no longer.
pub const ADMIN_REQUEST_TIMEOUT_MS: u64 = 3_000;
/// Request line plus headers: a longer head gets 431 and is never read further, so a
/// 100 MB request line costs 8 KiB.
pub const ADMIN_REQUEST_HEAD_BYTES_MAX: usize = 8 * 1024;
/// An answer not taken by the client within this is dropped with its connection.
const ADMIN_WRITE_TIMEOUT_MS: u64 = 10_000;
/// After a failed accept (EMFILE: out of descriptors) the accept thread waits this long
/// and tries again; it never gives up, so the listener outlives the shortage.
const ADMIN_ACCEPT_RETRY_MS: u64 = 100;
/// Stack of a connection thread: it renders at most a /stats document (heap), so the
/// default 2 MiB stack would only be address space held by idle threads.
const ADMIN_THREAD_STACK_BYTES: usize = 256 * 1024;
/// Bytes read from a connection per `read` while looking for the end of its head.
const ADMIN_READ_CHUNK_BYTES: usize = 1024;
/// Name of the probe file `/healthz` writes to check the data directory.
const HEALTH_PROBE_FILE: &str = ".healthz-probe";
/// errno for "no space left on device": the probe's failure worth naming.
const ENOSPC: i32 = 28;
/// /proc/self/status gives VmRSS in KiB.
const BYTES_PER_KIB: u64 = 1024;

const _: () = assert!(ADMIN_READ_CHUNK_BYTES <= ADMIN_REQUEST_HEAD_BYTES_MAX);

pub struct Admin {
    pub addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Admin {
    /// Binds the admin listener. Apart from [`Admin::start`] so that `mortard` binds every
    /// listener before the broker opens (and bumps the leader epoch): a port in use then
    /// leaves the data directory as it was.
    pub fn bind(addr: SocketAddr) -> Result<TcpListener, String> {
        TcpListener::bind(addr).map_err(|e| format!("cannot listen on --admin-listen {addr}: {e}"))
    }

    /// Starts the accept thread on a listener from [`Admin::bind`].
    pub fn start(
        listener: TcpListener,
        data_dir: PathBuf,
        requests: Sender<AdminRequest>,
        wake: Arc<dyn Fn() + Send + Sync>,
        liveness: Arc<Liveness>,
        started: Instant,
        tokens: Option<Vec<Vec<u8>>>,
    ) -> Result<Admin, String> {
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let ctx = Arc::new(Ctx {
            tokens,
            data_dir,
            requests,
            wake,
            liveness,
            started,
        });
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("mortar-admin".into())
            .spawn(move || accept_loop(&listener, &ctx, &stopping))
            .map_err(|e| e.to_string())?;
        Ok(Admin {
            addr,
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Admin {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A connection of our own wakes the blocked accept; without one (no descriptor
        // left) the thread is left to end with the process rather than waited for.
        let mut wake_at = self.addr;
        if wake_at.ip().is_unspecified() {
            wake_at.set_ip(match wake_at {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        if TcpStream::connect(wake_at).is_ok() {
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }
}

fn accept_loop(listener: &TcpListener, ctx: &Arc<Ctx>, stop: &AtomicBool) {
    let conns = Arc::new(Conns::default());
    let mut workers = Workers::default();
    let mut failures = 0u64;
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                if failures > 0 {
                    log::info!("admin accept works again after {failures} failures");
                    failures = 0;
                }
                if !stop.load(Ordering::Relaxed) {
                    admit(stream, ctx, &conns, &mut workers);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => {
                if failures == 0 {
                    log::warn!(
                        "admin accept failed: {e}; retrying every {ADMIN_ACCEPT_RETRY_MS} ms"
                    );
                }
                failures += 1;
                std::thread::sleep(Duration::from_millis(ADMIN_ACCEPT_RETRY_MS));
            }
        }
    }
}

/// Serves a new connection on a thread of its own, if there is room for it.
fn admit(stream: TcpStream, ctx: &Arc<Ctx>, conns: &Arc<Conns>, workers: &mut Workers) {
    let stream = Arc::new(stream);
    let slot = workers.room(conns).then(|| conns.enter(&stream));
    let Some(Some(id)) = slot else {
        let busy = "every admin connection is being answered; try again\n";
        let _ = stream.set_write_timeout(Some(Duration::from_millis(ADMIN_WRITE_TIMEOUT_MS)));
        respond(&stream, 503, busy.to_string(), &[]);
        return;
    };
    let (ctx, conns_of_thread, stream) = (Arc::clone(ctx), Arc::clone(conns), stream);
    let spawned = std::thread::Builder::new()
        .name("mortar-admin-conn".into())
        .stack_size(ADMIN_THREAD_STACK_BYTES)
        .spawn(move || {
            ctx.serve_conn(&stream, id, &conns_of_thread);
            conns_of_thread.leave(id);
            conns_of_thread.thread_done(id);
        });
    match spawned {
        Ok(handle) => workers.alive.push((id, handle)),
        Err(e) => {
            // Out of threads or memory: this connection is dropped, the listener goes on.
            log::warn!("admin connection dropped: cannot start its thread: {e}");
            conns.leave(id);
        }
    }
}

/// The connection threads not yet joined, owned by the accept thread. A thread counts
/// against [`ADMIN_THREADS_MAX`] until it is joined, that is until the OS has ended it,
/// not merely until its work is done: on a loaded machine finished threads can linger
/// for a while, and the cap is on threads the process holds.
#[derive(Default)]
struct Workers {
    alive: Vec<(u64, JoinHandle<()>)>,
}

impl Workers {
    /// Joins the threads that have finished; true once fewer than [`ADMIN_THREADS_MAX`]
    /// are left, waiting up to [`ADMIN_THREAD_WAIT_MS`] for one to finish.
    fn room(&mut self, conns: &Conns) -> bool {
        let deadline = Instant::now() + Duration::from_millis(ADMIN_THREAD_WAIT_MS);
        loop {
            let finished = {
                let mut done = conns.lock_done();
                while self.alive.len().saturating_sub(done.len()) >= ADMIN_THREADS_MAX {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    done = conns
                        .thread_ended
                        .wait_timeout(done, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                std::mem::take(&mut *done)
            };
            for id in finished {
                if let Some(at) = self.alive.iter().position(|(w, _)| *w == id) {
                    // Its closure has returned: this waits only for the OS to end it.
                    let _ = self.alive.swap_remove(at).1.join();
                }
            }
            if self.alive.len() < ADMIN_THREADS_MAX {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
        }
    }
}

/// The connections being served, oldest first, so the accept thread can cap them.
#[derive(Default)]
struct Conns {
    table: Mutex<Vec<ConnEntry>>,
    next_id: AtomicU64,
    /// Connection threads whose work is done, waiting to be joined by the accept thread,
    /// and a signal when one is added.
    done: Mutex<Vec<u64>>,
    thread_ended: Condvar,
}

struct ConnEntry {
    id: u64,
    stream: Arc<TcpStream>,
    /// Still reading its request head (and so the one to close for a newcomer).
    reading: bool,
}

impl Conns {
    fn lock_done(&self) -> std::sync::MutexGuard<'_, Vec<u64>> {
        self.done.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called by connection thread `id` as its last act.
    fn thread_done(&self, id: u64) {
        self.lock_done().push(id);
        self.thread_ended.notify_one();
    }

    /// Takes a slot for `stream`, closing the oldest connection still reading its
    /// request if every slot is taken; `None` if all are being answered.
    fn enter(&self, stream: &Arc<TcpStream>) -> Option<u64> {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if table.len() >= ADMIN_CONNECTIONS_MAX {
            let oldest = table.iter().position(|c| c.reading)?;
            let evicted = table.remove(oldest);
            // Its thread's read fails now, and it ends.
            let _ = evicted.stream.shutdown(Shutdown::Both);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        table.push(ConnEntry {
            id,
            stream: Arc::clone(stream),
            reading: true,
        });
        Some(id)
    }

    fn done_reading(&self, id: u64) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = table.iter_mut().find(|c| c.id == id) {
            c.reading = false;
        }
    }

    fn leave(&self, id: u64) {
        let mut table = self.table.lock().unwrap_or_else(|e| e.into_inner());
        table.retain(|c| c.id != id);
    }
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// Longer than [`ADMIN_REQUEST_HEAD_BYTES_MAX`].
    TooLarge,
    /// Not whole within [`ADMIN_REQUEST_TIMEOUT_MS`].
    TimedOut,
    /// The peer went away (or the accept thread closed it for a newcomer).
    Closed,
}

/// Reads a request's line and headers, up to the blank line that ends them.
fn read_head(mut stream: &TcpStream) -> Result<Vec<u8>, HeadError> {
    let deadline = Instant::now() + Duration::from_millis(ADMIN_REQUEST_TIMEOUT_MS);
    let mut head = Vec::with_capacity(ADMIN_READ_CHUNK_BYTES);
    let mut chunk = [0u8; ADMIN_READ_CHUNK_BYTES];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err(HeadError::TimedOut);
        }
        let n = match stream.read(&mut chunk) {
            Ok(0) => return Err(HeadError::Closed),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(HeadError::TimedOut)
            }
            Err(_) => return Err(HeadError::Closed),
        };
        let searched = head.len().saturating_sub(2);
        head.extend_from_slice(&chunk[..n]);
        if let Some(end) = head_end(&head, searched) {
            head.truncate(end);
            return match end <= ADMIN_REQUEST_HEAD_BYTES_MAX {
                true => Ok(head),
                false => Err(HeadError::TooLarge),
            };
        }
        if head.len() > ADMIN_REQUEST_HEAD_BYTES_MAX {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the head ends (the blank line: `\n\n` or `\n\r\n`), searching from `from`.
fn head_end(head: &[u8], from: usize) -> Option<usize> {
    (from..head.len()).find(|&i| {
        head[i] == b'\n' && (head[i + 1..].starts_with(b"\n") || head[i + 1..].starts_with(b"\r\n"))
    })
}

/// One request as the routes see it: its line, split, and its headers.
#[derive(Debug)]
pub(super) struct Request {
    pub method: tiny_http::Method,
    pub path: String,
    /// After the `?`, still percent-encoded; empty without one.
    pub query: String,
    headers: Vec<(String, String)>,
}

impl Request {
    /// A header's value (names compare case-insensitively, as HTTP says).
    pub fn header(&self, name: &str) -> Option<&str> {
        let found = self
            .headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name));
        found.map(|(_, v)| v.as_str())
    }
}

/// `METHOD TARGET HTTP/1.x` and the header lines of a head.
pub(super) fn parse_request(head: &[u8]) -> Option<Request> {
    let mut lines = std::str::from_utf8(head).ok()?.split('\n');
    let line = lines.next()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !version.starts_with("HTTP/1.") || !target.starts_with('/') {
        return None;
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    let headers = lines
        .filter_map(|l| l.trim_end_matches('\r').split_once(':'))
        .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
        .collect();
    Some(Request {
        method: tiny_http::Method::from_str(method).ok()?,
        path: path.to_string(),
        query: query.to_string(),
        headers,
    })
}

/// Writes one answer with tiny_http, then ends the connection.
fn respond(stream: &TcpStream, status: u16, body: String, extra: &[(&str, &str)]) {
    // The whole body is known: send Content-Length, never chunked (tiny_http chunks
    // bodies over 32 KiB by default, which simple scripts and clients mishandle).
    let mut response = tiny_http::Response::from_string(body)
        .with_status_code(status)
        .with_chunked_threshold(usize::MAX);
    response.add_header(header("Connection", "close"));
    for (name, value) in extra {
        response.add_header(header(name, value));
    }
    let mut out = BufWriter::new(stream);
    let version = tiny_http::HTTPVersion(1, 1);
    if response
        .raw_print(&mut out, version, &[], false, None)
        .is_ok()
        && out.flush().is_ok()
    {
        let _ = stream.shutdown(Shutdown::Write);
    }
}

struct Ctx {
    /// `--token-file`'s tokens, one of which a change must offer (`manage.rs`).
    tokens: Option<Vec<Vec<u8>>>,
    data_dir: PathBuf,
    requests: Sender<AdminRequest>,
    wake: Arc<dyn Fn() + Send + Sync>,
    liveness: Arc<Liveness>,
    started: Instant,
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name.as_bytes(), value.as_bytes()).expect("static header")
}

impl Ctx {
    /// Reads one request from a connection and answers it.
    fn serve_conn(&self, stream: &TcpStream, id: u64, conns: &Conns) {
        let _ = stream.set_nodelay(true);
        let _ = stream.set_write_timeout(Some(Duration::from_millis(ADMIN_WRITE_TIMEOUT_MS)));
        let head = read_head(stream);
        conns.done_reading(id);
        let text = |s: &str| format!("{s}\n");
        let peer = stream.peer_addr().ok().map(|a| a.ip());
        let mut headers = Vec::new();
        let (status, content_type, body) = match head.as_deref().map(parse_request) {
            Ok(Some(request)) => match self.manage(&request, peer) {
                Some((status, content_type, body, extra)) => {
                    headers = extra;
                    (status, content_type, body)
                }
                None => self.answer(&request),
            },
            Ok(None) => (400, "text/plain", text("not an HTTP/1 request line")),
            Err(HeadError::TooLarge) => {
                let why =
                    format!("request line and headers over {ADMIN_REQUEST_HEAD_BYTES_MAX} bytes");
                (431, "text/plain", text(&why))
            }
            Err(HeadError::TimedOut) => (408, "text/plain", text("request not sent in time")),
            Err(HeadError::Closed) => return,
        };
        let mut extra = vec![("Content-Type", content_type)];
        extra.extend(headers.iter().map(|(n, v)| (*n, v.as_str())));
        if status == 405 && !extra.iter().any(|(n, _)| *n == "Allow") {
            extra.push(("Allow", "GET"));
        }
        respond(stream, status, body, &extra);
    }

    /// (status, content type, body) for one request.
    fn answer(&self, request: &Request) -> (u16, &'static str, String) {
        let wait = Duration::from_millis(SNAPSHOT_TIMEOUT_MS);
        if let Some(answer) = super::records::answer(request, |ask| self.ask(ask, wait)) {
            return answer;
        }
        let (path, query) = (request.path.as_str(), request.query.as_str());
        let known = matches!(path, "/healthz" | "/metrics" | "/stats");
        if !known {
            return (404, "text/plain", "not found\n".to_string());
        }
        if request.method != tiny_http::Method::Get {
            return (405, "text/plain", "only GET\n".to_string());
        }
        match path {
            "/healthz" => match self.health() {
                Ok(ok) => (200, "text/plain", format!("{ok}\n")),
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
    }

    /// `ok`, on a cluster node `ok leader ID`; or why not.
    fn health(&self) -> Result<String, String> {
        let now = self.started.elapsed().as_millis() as u64;
        let last = self.liveness.last_turn_ms.load(Ordering::Relaxed);
        if now.saturating_sub(last) > REACTOR_STALL_MS {
            return Err(format!("reactor stalled: no turn for {} ms", now - last));
        }
        let probe = self.data_dir.join(HEALTH_PROBE_FILE);
        let written = std::fs::write(&probe, b"ok");
        let _ = std::fs::remove_file(&probe);
        written.map_err(|e| match e.raw_os_error() {
            Some(ENOSPC) => "disk full: data directory".to_string(),
            _ => format!("data directory not writable: {e}"),
        })?;
        // A cluster node without a leader it can reach takes no writes: a load balancer
        // or orchestrator should send clients elsewhere (docs/REPLICATION.md §7.5).
        match self.liveness.leader.load(Ordering::Relaxed) {
            SINGLE_NODE => Ok("ok".into()),
            NO_LEADER => Err("no leader".into()),
            id => Ok(format!("ok leader {id}")),
        }
    }

    /// The reactor's answer to `ask`, or `None` when it gave none within `wait`.
    fn ask(&self, ask: AdminAsk, wait: Duration) -> Option<AdminAnswer> {
        let (reply, answer) = mpsc::sync_channel(1);
        self.requests.send(AdminRequest { ask, reply }).ok()?;
        (self.wake)();
        answer.recv_timeout(wait).ok()
    }

    /// The routes of `manage.rs`, asking the reactor with [`ADMIN_CHANGE_TIMEOUT_MS`].
    fn manage(&self, request: &Request, peer: Option<IpAddr>) -> Option<manage::Reply> {
        let ask = |ask: ManageAsk| {
            if self.health_stalled() {
                return Err(true);
            }
            let wait = Duration::from_millis(ADMIN_CHANGE_TIMEOUT_MS);
            match self.ask(AdminAsk::Manage(ask), wait) {
                Some(AdminAnswer::Manage(answer)) => Ok(answer),
                _ => Err(false),
            }
        };
        let asker = manage::Asker {
            peer,
            tokens: self.tokens.as_deref(),
            ask: &ask,
        };
        manage::route(request, &asker)
    }

    /// The reactor has not turned for [`REACTOR_STALL_MS`].
    fn health_stalled(&self) -> bool {
        let now = self.started.elapsed().as_millis() as u64;
        now.saturating_sub(self.liveness.last_turn_ms.load(Ordering::Relaxed)) > REACTOR_STALL_MS
    }

    fn snapshot(&self) -> Option<Box<Snapshot>> {
        let wait = Duration::from_millis(SNAPSHOT_TIMEOUT_MS);
        let Some(AdminAnswer::Snapshot(mut snapshot)) = self.ask(AdminAsk::Snapshot, wait) else {
            return None;
        };
        // Read here, not on the reactor thread, which never waits on a file.
        snapshot.rss_bytes = rss_bytes();
        snapshot.process = super::process::read();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_ends_at_its_blank_line() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0), Some(24));
        assert_eq!(head_end(b"GET / HTTP/1.0\n\n", 0), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\nHost: x\r\n", 0), None);
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n", 0), None);
    }

    #[test]
    fn requests_are_method_path_query_and_headers() {
        let head = b"GET /stats?pretty HTTP/1.1\r\nHost: x\r\nauthorization:  Bearer t ";
        let r = parse_request(head).unwrap();
        assert_eq!(
            (r.method.clone(), r.path.as_str(), r.query.as_str()),
            (tiny_http::Method::Get, "/stats", "pretty")
        );
        assert_eq!(r.header("Authorization"), Some("Bearer t"));
        assert_eq!(r.header("host"), Some("x"));
        assert_eq!(r.header("Cookie"), None);
        assert!(parse_request(b"GET /x HTTP/1.0").is_some());
        for bad in [
            &b"GET /"[..],
            b"GET / HTTP/2",
            b"GET x HTTP/1.1",
            b"GET  / HTTP/1.1",
            b"",
        ] {
            assert!(
                parse_request(bad).is_none(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// A connected pair of loopback sockets.
    fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (client, listener.accept().unwrap().0)
    }

    #[test]
    fn a_head_over_the_cap_is_refused_without_reading_on() {
        let (mut client, server) = pair();
        client.write_all(b"GET /").unwrap();
        client
            .write_all(&vec![b'a'; 3 * ADMIN_REQUEST_HEAD_BYTES_MAX])
            .unwrap();
        assert_eq!(read_head(&server), Err(HeadError::TooLarge));
        let (mut client, server) = pair();
        client
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        assert_eq!(
            read_head(&server).unwrap(),
            b"GET /healthz HTTP/1.1\r\nHost: x\r"
        );
        drop(client);
        let (client, server) = pair();
        drop(client);
        assert_eq!(read_head(&server), Err(HeadError::Closed));
    }

    #[test]
    fn at_the_thread_cap_a_newcomer_waits_for_a_thread_to_end() {
        let conns = Arc::new(Conns::default());
        let mut workers = Workers::default();
        let (release, released) = mpsc::channel::<()>();
        let released = Arc::new(Mutex::new(released));
        for id in 0..ADMIN_THREADS_MAX as u64 {
            assert!(workers.room(&conns));
            let (conns, released) = (Arc::clone(&conns), Arc::clone(&released));
            let handle = std::thread::spawn(move || {
                let _ = released.lock().unwrap().recv();
                conns.thread_done(id);
            });
            workers.alive.push((id, handle));
        }
        let ender = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            release.send(()).unwrap();
            release
        });
        let started = Instant::now();
        assert!(workers.room(&conns), "one ended within the wait");
        assert!(started.elapsed() < Duration::from_millis(ADMIN_THREAD_WAIT_MS));
        assert_eq!(workers.alive.len(), ADMIN_THREADS_MAX - 1, "and was joined");
        let release = ender.join().unwrap();
        workers.alive.push((u64::MAX, std::thread::spawn(|| {})));
        assert!(!workers.room(&conns), "none ends: refused after the wait");
        drop(release);
        for (_, handle) in workers.alive.drain(..) {
            handle.join().unwrap();
        }
    }

    #[test]
    fn the_cap_closes_the_oldest_connection_still_reading() {
        let conns = Conns::default();
        let mut clients = Vec::new();
        let mut ids = Vec::new();
        for _ in 0..ADMIN_CONNECTIONS_MAX {
            let (client, server) = pair();
            clients.push(client);
            ids.push(conns.enter(&Arc::new(server)).unwrap());
        }
        conns.done_reading(ids[0]);
        let (_client, server) = pair();
        let newcomer = conns.enter(&Arc::new(server)).unwrap();
        // ids[0] is being answered, so ids[1] (the oldest still reading) was closed.
        let mut b = [0u8; 1];
        assert_eq!((&clients[1]).read(&mut b).unwrap(), 0);
        let table = conns.table.lock().unwrap();
        assert_eq!(table.len(), ADMIN_CONNECTIONS_MAX);
        assert!(table.iter().any(|c| c.id == ids[0]));
        assert!(!table.iter().any(|c| c.id == ids[1]));
        drop(table);
        for id in ids[2..].iter().chain([&newcomer]) {
            conns.done_reading(*id);
        }
        let (_client, server) = pair();
        assert!(
            conns.enter(&Arc::new(server)).is_none(),
            "all answering: 503"
        );
    }
}
