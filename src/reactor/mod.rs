//! The reactor room: the one thread that owns every socket.
//!
//! A single mio `Poll` drives the listener, every client connection (kept in a
//! `slab`, keyed by `Token`), a `Waker` through which the fsync pool reports
//! completions, and the signal source. Each pass: read what is readable and handle
//! every complete frame; let the broker flush its logs and start fsyncs; apply the
//! broker's effects (answers, pushes); fire timers; write each connection's output
//! with one write; free closed connections. Nothing here blocks: no fsync, no DNS, no
//! sleep; timeouts come from a deadline heap, not from polling.
//!
//! mio's two rules, quoted from its docs, shape the read and write loops:
//! "Draining readiness": with edge-triggered events, an operation must be repeated
//! until it returns `WouldBlock`; and "Spurious events": an event is a hint, so a read
//! may find nothing and must be harmless.
//!
//! Frames are handled only when complete; backpressure (too much queued output or too
//! many unanswered requests) stops handling at a frame boundary and stops reading the
//! socket, and resumes below the low-water marks. Bytes are never dropped.
//!
//! `accept.rs` holds the accept path (listen backlog, retry after EMFILE); `gate.rs`
//! what surrounds CONNECT (failed tokens answered late, client ERR frames logged
//! briefly); the connect timeout is one more deadline of the timer heap.
//!
//! `cluster.rs` joins a cluster (`attach_peers`, only with `--peers`): the `peer` room's
//! links on this `Poll` in their own token range and raft's tick timer; each pass hands
//! what they bring to the replica after the reads and before the broker's end of pass,
//! and writes peer messages after the clients' output. Without it, nothing changes.
//!
//! Depends on every room below it: `wire`, `session`, `broker`, `fsync`, `peer`.

mod accept;
mod cluster;
mod config;
pub mod conn;
mod gate;
mod manage;

pub use accept::LISTEN_BACKLOG_MIN;
pub use cluster::{ClusterCounters, ClusterInput};
pub use config::ReactorConfig;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token, Waker};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slab::Slab;

use crate::admin::{
    AdminAnswer, AdminAsk, AdminRequest, Liveness, PartitionFigures, ProcessFigures, Snapshot,
    TopicFigures,
};
use crate::broker::{Broker, ConnRef, DurableJob, Effect, Handled, JobDone, Now};
use crate::fsync::{FsyncPool, Submitter};
use crate::session::{dispatch, Admit, Answer, AuthFailures, Call};
use crate::wire::frame::split_frame;
use crate::wire::ops::Message as _;
use crate::wire::{ErrorCode, Request, Response};
use conn::{CloseReason, Conn, ConnState};
use gate::DelayedAnswer;

pub const LISTENER_TOKEN: Token = Token(0);
pub const WAKER_TOKEN: Token = Token(1);
pub const SIGNAL_TOKEN: Token = Token(2);
/// The peer links' tokens (`peer::TOKENS` of them), past the fixed tokens; used only in
/// a cluster.
pub const PEER_TOKEN_BASE: usize = 16;
/// Connection tokens are slab keys plus this, past the peer links' tokens.
const CONN_TOKEN_BASE: usize = PEER_TOKEN_BASE + crate::peer::TOKENS;

/// Bytes read from a socket per `read` call, into the reactor's one shared buffer:
/// idle connections then own no read buffer at all.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Reads per connection per turn before the others get theirs (fairness); a
/// connection with more goes on the read list for the next pass.
const READS_PER_TURN_MAX: usize = 16;
/// Stop reading a connection once this much output waits for it...
const OUTPUT_HIGH_WATER_BYTES: usize = 1024 * 1024;
/// ...and read again once it is below this.
const OUTPUT_LOW_WATER_BYTES: usize = 256 * 1024;
/// An emptied output buffer keeps at most this much capacity.
const OUTPUT_IDLE_CAPACITY_MAX_BYTES: usize = 16 * 1024;
/// An emptied input buffer keeps at most this much capacity.
const INPUT_IDLE_CAPACITY_MAX_BYTES: usize = 4 * 1024;
/// A connection closing after an ERR gets this long to take its last bytes.
const CLOSE_FLUSH_MS: u64 = 2_000;
/// At shutdown, in-flight answers get this long before the broker exits anyway.
const SHUTDOWN_DRAIN_MS: u64 = 5_000;
/// Housekeeping (retention, producer expiry) runs this often.
const HOUSEKEEPING_INTERVAL_MS: u64 = 1_000;
/// Events taken from one `poll`.
const EVENTS_CAPACITY: usize = 1024;

const _: () = assert!(OUTPUT_LOW_WATER_BYTES < OUTPUT_HIGH_WATER_BYTES);
const _: () = assert!(PEER_TOKEN_BASE > SIGNAL_TOKEN.0);

/// Counters the reactor keeps (read by the admin room through snapshots).
#[derive(Debug, Default, Clone)]
pub struct ReactorCounters {
    pub accepted: u64,
    pub refused_connection_limit: u64,
    pub closed: [u64; CloseReason::ALL.len()],
    /// Frames received per op byte 0x00–0x0F (0x00: illegal ones, 0xFF too, and those
    /// of an invalid length); reserved ops count in `frames_in_reserved`.
    pub frames_in: [u64; 16],
    pub frames_in_reserved: u64,
    pub frames_out_answers: u64,
    pub errors_sent: std::collections::BTreeMap<u16, u64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub backpressure_pauses: u64,
    /// MSG frames sent: pushed, or in a PULL's answer.
    pub msgs_out: u64,
    pub notices_out: u64,
    /// Raft messages received from peers and handed to the broker's replica.
    pub peer_messages_in: u64,
    /// Raft messages the links could not queue (down, output full; `cluster.rs`).
    pub peer_messages_dropped: u64,
}

pub struct Reactor {
    poll: Poll,
    listener: Option<TcpListener>,
    signals: Signals,
    waker: Arc<Waker>,
    pool: Option<FsyncPool<DurableJob>>,
    conns: Slab<Conn>,
    next_serial: u64,
    timers: BinaryHeap<Reverse<(u64, usize, u64)>>,
    read_list: Vec<usize>,
    flush_list: Vec<usize>,
    close_list: Vec<usize>,
    scratch: Vec<u8>,
    effects: Vec<Effect>,
    completions: Vec<JobDone>,
    broker: Broker,
    config: ReactorConfig,
    started: Instant,
    /// [`boot_ms`] at `started`: the zero of every `Now::mono_ms` of this reactor.
    started_boot_ms: u64,
    draining_since_ms: Option<u64>,
    next_housekeeping_ms: u64,
    admin_requests: Option<Receiver<AdminRequest>>,
    /// Bytes held in every connection's input and output buffers: their length, not
    /// their capacity (see `Conn::held_bytes`).
    buffered_bytes: usize,
    /// When to call `accept` again without a listener event: after a failure (EMFILE), or
    /// when one pass took its maximum and more may be queued.
    accept_again_at_ms: Option<u64>,
    /// `accept` calls failed in a row (logged once when it starts, once when it ends).
    accept_failures: u64,
    /// Failed CONNECTs per peer address, for the growing delay of their answers.
    auth_failures: AuthFailures,
    /// Answers held back until their time (failed CONNECTs), soonest first.
    delayed: BinaryHeap<Reverse<DelayedAnswer>>,
    /// Monotonic ms of the last turn, read by `/healthz` on the admin thread.
    /// Also the leader this node can reach (`cluster.rs`).
    liveness: Arc<Liveness>,
    /// Operator changes waiting to be durable, by ticket (`manage.rs`).
    admin_waits: std::collections::HashMap<u64, std::sync::mpsc::SyncSender<AdminAnswer>>,
    next_admin_ticket: u64,
    pub counters: ReactorCounters,
    /// Peer links and raft's tick timer; `None` without `--peers` (`cluster.rs`).
    cluster: Option<cluster::Cluster>,
    /// What the pass hands the replica, kept for its allocation.
    cluster_inputs: Vec<ClusterInput>,
    /// The replica's messages of this pass, on their way to the links (reused).
    peer_out: Vec<crate::peer::Message>,
    /// INSTALL frames of this pass, each with its peer (reused).
    install_out: Vec<(u64, Vec<u8>)>,
}

/// Why [`Reactor::run`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// A signal asked, and everything was drained and synced.
    Shutdown,
    /// The process must start again on its data directory (`mortard` re-executes).
    Restart,
}

/// The fsync pool, whose workers wake the reactor when a job is done.
fn start_pool(threads: usize, waker: &Arc<Waker>) -> Result<FsyncPool<DurableJob>, String> {
    let wake = Arc::clone(waker);
    let on_done = Arc::new(move || {
        let _ = wake.wake();
    });
    FsyncPool::new(threads, on_done).map_err(|e| format!("cannot start fsync workers: {e}"))
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

fn interrupted(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted
}

fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds on CLOCK_BOOTTIME, which keeps counting while the host is suspended
/// (CLOCK_MONOTONIC, `Instant`'s, stops): a leader's lease (`docs/REPLICATION.md` §7.3)
/// must run out during a suspend, as the other hosts' election clocks ran on.
fn boot_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    (t.tv_sec as u64).saturating_mul(1_000) + t.tv_nsec as u64 / 1_000_000
}

impl Reactor {
    /// Binds the listener. The broker's fsync pool is created here because its wake
    /// callback is this reactor's Waker.
    pub fn bind(
        config: ReactorConfig,
        fsync_threads: usize,
        open_broker: impl FnOnce(Submitter<DurableJob>) -> Result<Broker, String>,
    ) -> Result<Reactor, String> {
        let poll = Poll::new().map_err(|e| format!("cannot create poll: {e}"))?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKER_TOKEN).map_err(|e| e.to_string())?);
        let pool = start_pool(fsync_threads, &waker)?;
        let (backlog, warning) = accept::listen_backlog(config.listen_backlog);
        warning.iter().for_each(|w| log::warn!("{w}"));
        // Bound before the broker opens, which bumps the leader epoch: a start that cannot
        // listen (port in use) must leave the data directory as it found it. Connections
        // that arrive during recovery wait in the backlog.
        let mut listener = accept::bind(config.listen, backlog)
            .map_err(|e| format!("cannot listen on {}: {e}", config.listen))?;
        log::info!("listen backlog {backlog}");
        // The broker gets a pool of its own handle: jobs go out through it, completions
        // come back through `self.pool`, which shares the channels.
        let broker = open_broker(pool.submitter())?;
        poll.registry()
            .register(&mut listener, LISTENER_TOKEN, Interest::READABLE)
            .map_err(|e| e.to_string())?;
        let mut signals = Signals::new([SIGTERM, SIGINT, SIGHUP]).map_err(|e| e.to_string())?;
        poll.registry()
            .register(&mut signals, SIGNAL_TOKEN, Interest::READABLE)
            .map_err(|e| e.to_string())?;
        Ok(Reactor {
            poll,
            listener: Some(listener),
            signals,
            waker,
            pool: Some(pool),
            conns: Slab::new(),
            next_serial: 1,
            timers: BinaryHeap::new(),
            read_list: Vec::new(),
            flush_list: Vec::new(),
            close_list: Vec::new(),
            // Allocated at the first read: an idle broker without clients holds none of it.
            scratch: Vec::new(),
            effects: Vec::new(),
            completions: Vec::new(),
            broker,
            config,
            started: Instant::now(),
            started_boot_ms: boot_ms(),
            draining_since_ms: None,
            next_housekeeping_ms: 0,
            admin_requests: None,
            buffered_bytes: 0,
            accept_again_at_ms: None,
            accept_failures: 0,
            auth_failures: AuthFailures::default(),
            delayed: BinaryHeap::new(),
            liveness: Arc::new(Liveness::new()),
            admin_waits: std::collections::HashMap::new(),
            next_admin_ticket: 0,
            counters: ReactorCounters::default(),
            cluster: None,
            cluster_inputs: Vec::new(),
            peer_out: Vec::new(),
            install_out: Vec::new(),
        })
    }

    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    pub fn waker(&self) -> Arc<Waker> {
        Arc::clone(&self.waker)
    }

    pub fn started(&self) -> Instant {
        self.started
    }

    /// Connects the admin thread: its snapshot requests, and the turn clock it reads.
    pub fn attach_admin(&mut self, requests: Receiver<AdminRequest>) -> Arc<Liveness> {
        self.admin_requests = Some(requests);
        Arc::clone(&self.liveness)
    }

    fn now(&self) -> Now {
        Now {
            mono_ms: boot_ms().saturating_sub(self.started_boot_ms),
            wall_ms: wall_ms(),
        }
    }

    /// Runs until SIGTERM/SIGINT, then drains and returns; or until the broker needs
    /// the process restarted (a cluster node's INSTALL), then returns at once: nothing
    /// of this process's state is to be kept.
    pub fn run(&mut self) -> io::Result<Stopped> {
        let mut events = Events::with_capacity(EVENTS_CAPACITY);
        while !self.turn(&mut events, self.poll_timeout())? {
            if self.broker.restart_requested() {
                return Ok(Stopped::Restart);
            }
        }
        self.shutdown()?;
        Ok(Stopped::Shutdown)
    }

    /// One pass: wait for events (at most `timeout`), handle them, end the pass.
    /// Returns whether a shutdown finished draining.
    fn turn(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<bool> {
        if let Err(e) = self.poll.poll(events, timeout) {
            return if interrupted(&e) { Ok(false) } else { Err(e) };
        }
        let now = self.now();
        for event in events.iter() {
            match event.token() {
                LISTENER_TOKEN => self.accept(now),
                WAKER_TOKEN => {}
                SIGNAL_TOKEN => self.on_signals(now),
                Token(t) if t < CONN_TOKEN_BASE => self.on_peer_event(event, now),
                Token(t) => {
                    let key = t - CONN_TOKEN_BASE;
                    if !self.conns.contains(key) {
                        continue;
                    }
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        self.queue_read(key);
                    }
                    if event.is_writable() {
                        self.queue_flush(key);
                    }
                }
            }
        }
        self.read_turn(now);
        self.cluster_pass(now);
        self.pass_end(now);
        Ok(self
            .draining_since_ms
            .is_some_and(|since| self.conns.is_empty() || now.mono_ms >= since + SHUTDOWN_DRAIN_MS))
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if !self.read_list.is_empty() {
            return Some(Duration::ZERO);
        }
        let now = self.started.elapsed().as_millis() as u64;
        let mut next = self.next_housekeeping_ms;
        if let Some(Reverse((at, _, _))) = self.timers.peek() {
            next = next.min(*at);
        }
        if let Some(at) = self.broker.next_deadline_ms() {
            next = next.min(at);
        }
        if let Some(at) = self.accept_again_at_ms {
            next = next.min(at);
        }
        if let Some(Reverse(d)) = self.delayed.peek() {
            next = next.min(d.due_ms);
        }
        if let Some(cluster) = &self.cluster {
            next = next.min(cluster.next_deadline_ms());
        }
        if self.draining_since_ms.is_some() {
            next = next.min(now + 50);
        }
        Some(Duration::from_millis(next.saturating_sub(now)))
    }

    // ---- reading and handling frames -----------------------------------------------

    fn queue_read(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        if !conn.read_queued {
            conn.read_queued = true;
            self.read_list.push(key);
        }
    }

    fn queue_flush(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        if !conn.flush_queued {
            conn.flush_queued = true;
            self.flush_list.push(key);
        }
    }

    /// Re-counts the bytes one connection's buffers hold into `buffered_bytes`.
    fn account(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let now_held = conn.held_bytes();
        self.buffered_bytes = self.buffered_bytes + now_held - conn.accounted_bytes;
        conn.accounted_bytes = now_held;
    }

    fn read_turn(&mut self, now: Now) {
        let list = std::mem::take(&mut self.read_list);
        for &key in &list {
            if let Some(conn) = self.conns.get_mut(key) {
                conn.read_queued = false;
                self.read_conn(key, now);
                self.account(key);
            }
        }
        // Reuse the allocation; read_conn may have queued connections again.
        let mut list = list;
        list.clear();
        list.append(&mut self.read_list);
        self.read_list = list;
    }

    /// Handles what a connection has buffered, then reads its socket until it would
    /// block, pauses, closes, or used up its turn.
    fn read_conn(&mut self, key: usize, now: Now) {
        self.handle_input(key, now);
        for _ in 0..READS_PER_TURN_MAX {
            let conn = &mut self.conns[key];
            if !conn.is_open() || conn.paused {
                return;
            }
            let result = if conn.input.is_empty() {
                // Checked at the read itself: a read into an empty buffer returns 0,
                // which would pass for the end of the stream.
                if self.scratch.is_empty() {
                    self.scratch = vec![0; READ_CHUNK_BYTES];
                }
                conn.stream.read(&mut self.scratch)
            } else {
                read_into_input(conn)
            };
            match result {
                Ok(0) => {
                    if conn.partial_since_ms.is_some() {
                        log::debug!(
                            "conn {} closed mid-frame; nothing of it applied",
                            conn.serial
                        );
                    }
                    self.close(key, CloseReason::PeerClosed);
                    return;
                }
                Ok(n) => {
                    self.counters.bytes_in += n as u64;
                    if self.conns[key].input.is_empty() {
                        let consumed = self.handle_bytes(key, FromScratch(n), now);
                        let rest = &self.scratch[consumed..n];
                        if !rest.is_empty() && self.conns.contains(key) {
                            self.conns[key].input.extend_from_slice(rest);
                        }
                    } else {
                        self.handle_input(key, now);
                    }
                    self.note_partial(key, now);
                }
                Err(e) if would_block(&e) => return,
                Err(e) if interrupted(&e) => continue,
                Err(e) => {
                    log::debug!("conn {} read error: {e}", self.conns[key].serial);
                    self.close(key, CloseReason::IoError);
                    return;
                }
            }
        }
        // Turn used up with more perhaps waiting: come back next pass.
        self.queue_read(key);
    }

    fn handle_input(&mut self, key: usize, now: Now) {
        if self.conns[key].input.is_empty() {
            return;
        }
        let input = std::mem::take(&mut self.conns[key].input);
        let consumed = self.handle_bytes(key, FromInput(&input), now);
        if let Some(conn) = self.conns.get_mut(key) {
            let mut input = input;
            input.drain(..consumed);
            if input.is_empty() && input.capacity() > INPUT_IDLE_CAPACITY_MAX_BYTES {
                input = Vec::new();
            }
            conn.input = input;
            self.note_partial(key, now);
        }
    }

    /// Tracks when the current incomplete frame began, for the half-frame timeout.
    fn note_partial(&mut self, key: usize, now: Now) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let incomplete = !conn.input.is_empty()
            && matches!(
                split_frame(&conn.input, conn.session.frame_len_max()),
                Ok(None)
            );
        match (incomplete, conn.partial_since_ms) {
            (true, None) => {
                conn.partial_since_ms = Some(now.mono_ms);
                self.schedule_timer(key);
            }
            (false, Some(_)) => conn.partial_since_ms = None,
            _ => {}
        }
    }

    /// Handles every complete frame at the start of `bytes`; returns how many bytes
    /// were consumed. Stops at a frame boundary on backpressure or close.
    fn handle_bytes(&mut self, key: usize, source: Source<'_>, now: Now) -> usize {
        let scratch = std::mem::take(&mut self.scratch);
        let bytes: &[u8] = match source {
            FromScratch(n) => &scratch[..n],
            FromInput(b) => b,
        };
        let mut at = 0;
        loop {
            let conn = &self.conns[key];
            if !conn.is_open() || conn.paused {
                break;
            }
            match split_frame(&bytes[at..], conn.session.frame_len_max()) {
                Ok(None) => break,
                Err(e) => {
                    log::info!("conn {} sent a bad frame header: {e}", conn.serial);
                    self.count_frame_in(e.request_op());
                    self.refuse(key, e.code(), e.request_op(), &e.to_string());
                    break;
                }
                Ok(Some(raw)) => {
                    at += raw.total_bytes;
                    let conn = &mut self.conns[key];
                    conn.last_frame_ms = now.mono_ms;
                    conn.partial_since_ms = None;
                    self.count_frame_in(raw.op);
                    self.handle_frame(key, raw.op, raw.payload, now);
                    self.check_pause(key);
                }
            }
        }
        self.scratch = scratch;
        at
    }

    fn count_frame_in(&mut self, op: u8) {
        use crate::wire::frame::{classify_op, OpClass};
        // 0xFF is as illegal as 0x00 (`man/mortarmq.7`): one count for both.
        let op = match classify_op(op) {
            OpClass::Illegal => 0,
            _ => op,
        };
        match self.counters.frames_in.get_mut(usize::from(op)) {
            Some(n) => *n += 1,
            None => self.counters.frames_in_reserved += 1,
        }
    }

    fn handle_frame(&mut self, key: usize, op_byte: u8, payload: &[u8], now: Now) {
        let request = match self.conns[key].session.admit(op_byte, payload) {
            Admit::Request(request) => request,
            Admit::Ignore(err) => return self.log_client_err(key, &err, now),
            Admit::Refuse(code, why) => return self.refuse(key, code, op_byte, &why),
        };
        if self.buffered_bytes > self.config.max_memory_bytes && holds_memory(&request) {
            let why = "the broker's --max-memory budget for buffers is used up";
            return self.refuse(key, ErrorCode::MemoryLimit, op_byte, why);
        }
        let conn = &mut self.conns[key];
        let call = Call {
            conn: ConnRef {
                id: key as u32,
                serial: conn.serial,
            },
            slot: conn.slots.next_id(),
            now,
            tokens: self.config.tokens.as_deref(),
            output_room_bytes: conn.output_room(self.config.max_output_bytes),
        };
        match dispatch(&mut conn.session, &mut self.broker, call, request) {
            Handled::Answer(r) if r.error_code() == Some(ErrorCode::AuthFailed) => {
                self.refuse_connect(key, r, now)
            }
            Handled::Answer(response) => self.answer(key, response),
            Handled::Wait => {
                conn.slots.wait();
            }
        }
    }

    /// Sends an error for the current frame; closes after it when the registry says so.
    fn refuse(&mut self, key: usize, code: ErrorCode, request_op: u8, why: &str) {
        self.answer(key, Response::err(code, request_op, why));
    }

    fn answer(&mut self, key: usize, response: Response) {
        let closes = response.error_code().filter(|c| c.closes_connection());
        if let Some(code) = response.error_code() {
            *self.counters.errors_sent.entry(code.code()).or_default() += 1;
        }
        self.counters.frames_out_answers += 1;
        let conn = &mut self.conns[key];
        conn.slots.answer_now(response, &mut conn.output);
        self.queue_flush(key);
        if let Some(code) = closes {
            self.begin_close(key, CloseReason::after_error(code), code);
        }
    }

    fn check_pause(&mut self, key: usize) {
        let max_pending = self.config.max_pending_requests;
        let max_output = self.config.max_output_bytes;
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let pending = conn.output_pending();
        if pending > max_output {
            log::warn!(
                "conn {} closed: {pending} bytes of output not taken (cap {max_output})",
                conn.serial
            );
            self.close(key, CloseReason::OutputOverflow);
            return;
        }
        if !conn.paused && (pending > OUTPUT_HIGH_WATER_BYTES || conn.slots.len() >= max_pending) {
            conn.paused = true;
            self.counters.backpressure_pauses += 1;
        } else if conn.paused
            && self.draining_since_ms.is_none()
            && pending <= OUTPUT_LOW_WATER_BYTES
            && conn.slots.len() <= max_pending / 2
        {
            conn.paused = false;
            // Frames may already be buffered: handle them, and read on.
            self.queue_read(key);
        }
    }

    // ---- closing ------------------------------------------------------------------

    /// Stops reading; the queued output (ending with an ERR) goes out, then the close.
    fn begin_close(&mut self, key: usize, reason: CloseReason, code: ErrorCode) {
        let now = self.started.elapsed().as_millis() as u64;
        let conn = &mut self.conns[key];
        if conn.is_open() {
            log::info!("conn {} closing after {code}", conn.serial);
            conn.state = ConnState::Flushing(reason);
            conn.close_deadline_ms = now + CLOSE_FLUSH_MS;
            self.schedule_timer(key);
        }
    }

    /// Marks a connection closed; it is freed at the end of the pass (never while a
    /// handler may still hold its key).
    fn close(&mut self, key: usize, reason: CloseReason) {
        let conn = &mut self.conns[key];
        if matches!(conn.state, ConnState::Closed(_)) {
            return;
        }
        conn.state = ConnState::Closed(reason);
        self.close_list.push(key);
    }

    fn free_closed(&mut self) {
        let now = self.now();
        let mut list = std::mem::take(&mut self.close_list);
        for key in list.drain(..) {
            let mut conn = self.conns.remove(key);
            self.buffered_bytes -= conn.accounted_bytes;
            if conn.read_queued {
                // Else a later connection in the same slab slot would inherit the entry.
                self.read_list.retain(|&k| k != key);
            }
            let _ = self.poll.registry().deregister(&mut conn.stream);
            let reason = match conn.state {
                ConnState::Closed(r) => r,
                _ => CloseReason::IoError,
            };
            self.counters.closed[CloseReason::ALL
                .iter()
                .position(|r| *r == reason)
                .unwrap_or(0)] += 1;
            log::debug!(
                "conn {} from {} closed: {}",
                conn.serial,
                conn.session.peer,
                reason.name()
            );
            self.broker.connection_closed(
                ConnRef {
                    id: key as u32,
                    serial: conn.serial,
                },
                now,
            );
        }
        self.close_list = list;
    }

    // ---- timers -------------------------------------------------------------------

    fn deadline_of(&self, conn: &Conn) -> u64 {
        let mut at = conn.last_frame_ms + self.config.idle_timeout_ms;
        if let Some(since) = conn.partial_since_ms {
            at = at.min(since + self.config.half_frame_timeout_ms);
        }
        if let Some(connect_by) = self.connect_deadline(conn) {
            at = at.min(connect_by);
        }
        at.min(conn.close_deadline_ms)
    }

    /// When an open connection that has not completed CONNECT is closed. A connection
    /// already closing (a refused CONNECT whose answer is held back) keeps its own
    /// close deadline.
    fn connect_deadline(&self, conn: &Conn) -> Option<u64> {
        (conn.is_open() && !conn.session.is_connected())
            .then(|| conn.opened_ms + self.config.connect_timeout_ms)
    }

    fn schedule_timer(&mut self, key: usize) {
        let deadline = self.deadline_of(&self.conns[key]);
        let conn = &mut self.conns[key];
        if deadline < conn.timer_at_ms {
            conn.timer_at_ms = deadline;
            self.timers.push(Reverse((deadline, key, conn.serial)));
        }
    }

    fn fire_timers(&mut self, now: Now) {
        while let Some(&Reverse((at, key, serial))) = self.timers.peek() {
            if at > now.mono_ms {
                break;
            }
            self.timers.pop();
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            if conn.serial != serial || conn.timer_at_ms != at {
                continue; // stale: superseded by an earlier entry, or another connection
            }
            conn.timer_at_ms = u64::MAX;
            if !matches!(conn.state, ConnState::Closed(_)) {
                self.timer_fired(key, now);
            }
        }
    }

    /// A connection's deadline came: close it for the first reason due, or wait on.
    fn timer_fired(&mut self, key: usize, now: Now) {
        let conn = &self.conns[key];
        let due = |at: Option<u64>| at.is_some_and(|t| now.mono_ms >= t);
        let half_frame_at = conn
            .partial_since_ms
            .map(|s| s + self.config.half_frame_timeout_ms);
        let idle_at = conn.last_frame_ms + self.config.idle_timeout_ms;
        let (reason, why) = if now.mono_ms >= conn.close_deadline_ms {
            // Only a flushing connection has a close deadline: it closes for the reason
            // it began to (a refused token is not a shutdown).
            match conn.state {
                ConnState::Flushing(reason) => (reason, None),
                _ => (CloseReason::Shutdown, None),
            }
        } else if due(self.connect_deadline(conn)) {
            let why = "no CONNECT within the connect timeout";
            (CloseReason::ConnectTimeout, Some(why))
        } else if due(half_frame_at) {
            (CloseReason::HalfFrameTimeout, Some("half-frame timeout"))
        } else if now.mono_ms >= idle_at {
            (CloseReason::IdleTimeout, Some("idle timeout"))
        } else {
            return self.schedule_timer(key);
        };
        if let Some(why) = why {
            log::debug!("conn {} closed: {why}", conn.serial);
        }
        self.close(key, reason);
    }

    // ---- the end of a pass ----------------------------------------------------------

    fn pass_end(&mut self, now: Now) {
        if let Some(pool) = &self.pool {
            pool.drain_completions(&mut self.completions);
        }
        for done in self.completions.drain(..) {
            self.broker.job_done(done, now);
        }
        let max_output = self.config.max_output_bytes;
        self.broker
            .end_pass(now, &output_rooms(&self.conns, max_output));
        self.apply_effects();
        self.fire_timers(now);
        self.answer_delayed(now);
        if self.accept_again_at_ms.is_some_and(|at| now.mono_ms >= at) {
            self.accept(now);
        }
        if now.mono_ms >= self.next_housekeeping_ms {
            self.next_housekeeping_ms = now.mono_ms + HOUSEKEEPING_INTERVAL_MS;
            self.broker.housekeeping(now);
            self.auth_failures.expire(now.mono_ms);
        }
        if self.draining_since_ms.is_some() {
            self.drain_step();
        }
        self.flush_all();
        self.cluster_flush(now);
        self.free_closed();
        self.liveness
            .last_turn_ms
            .store(now.mono_ms, Ordering::Relaxed);
        self.publish_leader();
        self.answer_admin(now);
        if cfg!(debug_assertions) {
            self.check_invariants();
            self.broker.check_invariants();
        }
    }

    /// The reactor's bookkeeping holds together at the end of a pass. Debug builds run it
    /// on every pass, so every integration test (which runs a debug `mortard`) checks it.
    fn check_invariants(&self) {
        assert!(self.conns.len() <= self.config.max_connections);
        assert!(self.flush_list.is_empty() && self.close_list.is_empty());
        let mut accounted = 0;
        let mut read_queued = 0;
        for (key, c) in self.conns.iter() {
            assert!(
                !matches!(c.state, ConnState::Closed(_)),
                "conn {key} closed but not freed"
            );
            assert_eq!(
                c.accounted_bytes,
                c.held_bytes(),
                "conn {key}: buffers changed without being accounted"
            );
            assert!(c.output_sent <= c.output.len());
            assert!(!c.flush_queued);
            assert!(
                c.timer_at_ms <= self.deadline_of(c),
                "conn {key} has no live timer"
            );
            c.slots.check_invariants();
            accounted += c.accounted_bytes;
            read_queued += usize::from(c.read_queued);
        }
        assert_eq!(
            self.buffered_bytes, accounted,
            "buffered bytes equal the sum"
        );
        assert_eq!(
            read_queued,
            self.read_list.len(),
            "each queued read is listed once"
        );
    }

    fn answer_admin(&mut self, now: Now) {
        let Some(rx) = &self.admin_requests else {
            return;
        };
        let requests: Vec<AdminRequest> = crate::admin::pending_requests(rx).collect();
        for request in requests {
            let answer = match request.ask {
                AdminAsk::Snapshot => AdminAnswer::Snapshot(Box::new(self.snapshot(now))),
                AdminAsk::Records(ask) => {
                    AdminAnswer::Records(self.broker.peek(&ask).map(Box::new))
                }
                AdminAsk::Manage(ask) => {
                    self.manage(ask, request.reply, now);
                    continue;
                }
            };
            // The admin thread may have given up waiting; nothing to do then.
            let _ = request.reply.send(answer);
        }
        self.answer_manage_done();
    }

    /// Copies what /stats and /metrics show. Runs only when asked, on this thread.
    fn snapshot(&self, now: Now) -> Snapshot {
        let c = &self.counters;
        let ops = crate::wire::ops::Op::ALL;
        // By the ops clients send; the ones only the server sends, when a client sends
        // one (refused), are counted together.
        let received = |op: &crate::wire::ops::Op| c.frames_in[*op as usize];
        let mut frames_in: Vec<(&'static str, u64)> = (ops.iter())
            .filter(|op| !op.is_server_only())
            .map(|op| (op.name(), received(op)))
            .collect();
        let server_only = ops.iter().filter(|op| op.is_server_only()).map(received);
        frames_in.push(("SERVER_ONLY", server_only.sum()));
        frames_in.push(("RESERVED", c.frames_in_reserved));
        frames_in.push(("ILLEGAL", c.frames_in[0]));
        let errors: u64 = c.errors_sent.values().sum();
        Snapshot {
            version: env!("CARGO_PKG_VERSION"),
            uptime_ms: now.mono_ms,
            leader_epoch: self.broker.leader_epoch(),
            // Filled in by the admin thread: reading /proc is no work for the reactor.
            rss_bytes: 0,
            data_dir: self.broker.data_dir().to_path_buf(),
            max_data_bytes: self.broker.max_data_bytes(),
            process: ProcessFigures::default(),
            connections_open: self.conns.len() as u64,
            connections_accepted: c.accepted,
            connections_refused: c.refused_connection_limit,
            connections_closed: CloseReason::ALL
                .iter()
                .zip(c.closed.iter())
                .map(|(r, n)| (r.name(), *n))
                .collect(),
            frames_in,
            frames_out: vec![
                ("OK", c.frames_out_answers.saturating_sub(errors)),
                ("ERR", errors),
                ("MSG", c.msgs_out),
                ("NOTICE", c.notices_out),
            ],
            errors_sent: c.errors_sent.clone(),
            bytes_in: c.bytes_in,
            bytes_out: c.bytes_out,
            backpressure_pauses: c.backpressure_pauses,
            buffered_bytes: self.buffered_bytes as u64,
            broker: self.broker.counters.clone(),
            topics: self.topic_figures(),
            groups: self.broker.coordinator().snapshot(),
            cluster: self.cluster_figures(now),
        }
    }

    /// Every topic and its dead-letter twin, in registry order, with their partitions.
    fn topic_figures(&self) -> Vec<TopicFigures> {
        let mut topics = Vec::new();
        let mut pairs: Vec<_> = self.broker.registry().pairs().collect();
        pairs.sort_by_key(|p| p.pair);
        for pair in pairs {
            for ((topic_id, name), dlq_twin) in pair.topics().into_iter().zip([false, true]) {
                let partitions = (0..pair.partition_count)
                    .filter_map(|i| self.broker.partition(topic_id, i))
                    .map(|p| {
                        let st = p.log.stats();
                        PartitionFigures {
                            partition: p.index,
                            first_sequence: st.first_sequence,
                            last_sequence: st.written_sequence,
                            commit_sequence: st.synced_sequence,
                            bytes: st.bytes,
                            segments: st.segments,
                            poisoned: st.poisoned,
                            producers: p.producers.len() as u64,
                        }
                    })
                    .collect();
                topics.push(TopicFigures {
                    topic_id,
                    name,
                    dlq_twin,
                    partitions,
                });
            }
        }
        topics
    }

    fn apply_effects(&mut self) {
        self.broker.drain_effects(&mut self.effects);
        let mut effects = std::mem::take(&mut self.effects);
        for effect in effects.drain(..) {
            match effect {
                Effect::Answer {
                    conn,
                    slot,
                    response,
                } => {
                    if let Some(code) = response.error_code() {
                        *self.counters.errors_sent.entry(code.code()).or_default() += 1;
                    }
                    self.fill_slot(conn, slot, Answer::Response(response));
                }
                Effect::PullAnswer { conn, slot, answer } => {
                    self.fill_slot(conn, slot, Answer::Pull(answer));
                }
                Effect::Notice { conn, notice } => {
                    let Some(c) = self.live_conn(conn) else {
                        continue;
                    };
                    notice.encode_frame(&mut c.output);
                    self.counters.notices_out += 1;
                    self.queue_flush(conn.id as usize);
                }
                Effect::Deliver { conn, delivery } => {
                    let key = conn.id as usize;
                    if self.live_conn(conn).is_none() {
                        continue;
                    }
                    let c = &mut self.conns[key];
                    if self.broker.encode_delivery(&delivery, &mut c.output) {
                        self.counters.msgs_out += 1;
                    }
                    self.queue_flush(key);
                    self.check_pause(key);
                }
            }
        }
        self.effects = effects;
    }

    /// Answers a request that waited; a PULL's answer is encoded from the log straight
    /// into the output when its slot reaches the head.
    fn fill_slot(&mut self, conn: ConnRef, slot: u64, answer: Answer) {
        let key = conn.id as usize;
        let broker = &mut self.broker;
        let Some(c) = self
            .conns
            .get_mut(key)
            .filter(|c| c.serial == conn.serial && !matches!(c.state, ConnState::Closed(_)))
        else {
            return;
        };
        self.counters.frames_out_answers += 1;
        let mut msgs = 0;
        let mut encode_pull = |a: &_, out: &mut Vec<u8>| msgs += broker.encode_pull_answer(a, out);
        if !c.slots.fill(slot, answer, &mut c.output, &mut encode_pull) {
            log::error!("conn {}: answer for unknown slot {slot}", c.serial);
        }
        self.counters.msgs_out += msgs;
        self.queue_flush(key);
        self.check_pause(key);
    }

    /// The connection an effect names, unless it closed (or its slot was reused).
    fn live_conn(&mut self, conn: ConnRef) -> Option<&mut Conn> {
        self.conns
            .get_mut(conn.id as usize)
            .filter(|c| c.serial == conn.serial && !matches!(c.state, ConnState::Closed(_)))
    }

    fn flush_all(&mut self) {
        let list = std::mem::take(&mut self.flush_list);
        for &key in &list {
            let Some(conn) = self.conns.get_mut(key) else {
                continue;
            };
            conn.flush_queued = false;
            if matches!(conn.state, ConnState::Closed(_)) {
                continue;
            }
            self.flush_conn(key);
            self.account(key);
        }
        let mut list = list;
        list.clear();
        list.append(&mut self.flush_list);
        self.flush_list = list;
    }

    fn flush_conn(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        while conn.output_sent < conn.output.len() {
            match conn.stream.write(&conn.output[conn.output_sent..]) {
                Ok(0) => break,
                Ok(n) => {
                    conn.output_sent += n;
                    self.counters.bytes_out += n as u64;
                }
                Err(e) if would_block(&e) => break,
                Err(e) if interrupted(&e) => continue,
                Err(e) => {
                    log::debug!("conn {} write error: {e}", conn.serial);
                    self.close(key, CloseReason::IoError);
                    return;
                }
            }
        }
        if conn.output_sent == conn.output.len() {
            conn.output.clear();
            conn.output_sent = 0;
            if conn.output.capacity() > OUTPUT_IDLE_CAPACITY_MAX_BYTES {
                conn.output = Vec::new();
            }
            if let ConnState::Flushing(reason) = conn.state {
                if conn.slots.is_empty() {
                    self.close(key, reason);
                    return;
                }
            }
        } else if conn.output_sent > OUTPUT_HIGH_WATER_BYTES {
            // Keep the unsent tail only, so a slow reader's buffer does not grow by
            // what it already took.
            conn.output.drain(..conn.output_sent);
            conn.output_sent = 0;
        }
        self.check_pause(key);
    }

    // ---- signals and shutdown ----------------------------------------------------------

    fn on_signals(&mut self, now: Now) {
        let pending: Vec<i32> = self.signals.pending().collect();
        for signal in pending {
            if signal == SIGHUP {
                log::info!("SIGHUP ignored: flags are read at start only; restart to change them");
                continue;
            }
            if self.draining_since_ms.is_none() {
                log::info!(
                    "signal {signal}: draining {} connections and shutting down",
                    self.conns.len()
                );
                self.draining_since_ms = Some(now.mono_ms);
                // Under systemd's Type=notify: the unit shows "deactivating" from here on.
                if let Err(e) = crate::systemd::notify(crate::systemd::State::Stopping) {
                    log::warn!("cannot send STOPPING=1 to $NOTIFY_SOCKET: {e}");
                }
                if let Some(mut listener) = self.listener.take() {
                    let _ = self.poll.registry().deregister(&mut listener);
                }
                for (_, conn) in self.conns.iter_mut() {
                    conn.paused = true;
                }
            }
        }
    }

    /// While draining: a connection whose in-flight answers are all out gets ERR
    /// SHUTTING_DOWN (for whatever it sent after) and is closed once that is written.
    fn drain_step(&mut self) {
        let ready: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.is_open() && c.slots.is_empty())
            .map(|(k, _)| k)
            .collect();
        for key in ready {
            self.answer(
                key,
                Response::err(ErrorCode::ShuttingDown, 0, "the broker is shutting down"),
            );
        }
    }

    /// Writes and syncs what is still buffered; an error means something acknowledged
    /// as WRITTEN may not be on disk, which the exit status must say (`man/mortard.8`).
    fn shutdown(&mut self) -> io::Result<()> {
        // The loop has stopped, so blocking here delays nobody.
        let now = self.now();
        let max_output = self.config.max_output_bytes;
        self.broker
            .end_pass(now, &output_rooms(&self.conns, max_output));
        if let Some(pool) = self.pool.take() {
            for done in pool.shutdown() {
                self.broker.job_done(done, self.now());
            }
        }
        self.broker
            .shutdown_sync(self.now())
            .map_err(|e| io::Error::other(format!("final sync failed: {e}")))?;
        log::info!("shut down");
        Ok(())
    }
}

/// What each connection's output can still take before `max_output_bytes`, for the
/// broker's PULL answers (a connection that is gone takes nothing).
fn output_rooms(conns: &Slab<Conn>, max_output_bytes: usize) -> impl Fn(u32) -> u64 + '_ {
    move |id| {
        conns
            .get(id as usize)
            .map_or(0, |c| c.output_room(max_output_bytes))
    }
}

enum Source<'a> {
    FromScratch(usize),
    FromInput(&'a [u8]),
}
use Source::{FromInput, FromScratch};

/// PUB, SUB and PULL make the broker hold bytes for the connection (records, deliveries,
/// answers); over `--max-memory` they are refused with MEMORY_LIMIT.
fn holds_memory(request: &Request<'_>) -> bool {
    matches!(
        request,
        Request::Pub(_) | Request::Sub(_) | Request::Pull(_)
    )
}

/// Reads into a connection's own input buffer, which grows with the bytes that arrive,
/// never ahead of them: a header announcing 16 MiB gets room for one read chunk, and
/// the buffer grows only as the body comes (doubling, so a large frame is not copied
/// over and over, but never past the frame's announced end).
fn read_into_input(conn: &mut Conn) -> io::Result<usize> {
    let start = conn.input.len();
    let (want, frame_end) = match crate::wire::frame::declared_length(&conn.input) {
        Some(len) => {
            let frame_end = crate::wire::limits::FRAME_HEADER_BYTES + len as usize;
            let want = frame_end.saturating_sub(start).clamp(1, READ_CHUNK_BYTES);
            (want, frame_end)
        }
        None => (READ_CHUNK_BYTES, 0),
    };
    let need = start + want;
    if conn.input.capacity() < need {
        let target = (conn.input.capacity() * 2).min(frame_end).max(need);
        conn.input.reserve_exact(target - start);
    }
    conn.input.resize(need, 0);
    let result = conn.stream.read(&mut conn.input[start..]);
    let got = *result.as_ref().unwrap_or(&0);
    conn.input.truncate(start + got);
    result
}
