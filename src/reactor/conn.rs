//! One client connection: its socket, buffers, session and timers.

use std::net::SocketAddr;

use mio::net::TcpStream;

use crate::session::{Session, Slots};
use crate::wire::ErrorCode;

/// Why the broker closes a connection (logged, counted per reason in /metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CloseReason {
    PeerClosed,
    ProtocolError,
    /// CONNECT with a token not accepted (AUTH_FAILED), told apart from a broken client.
    AuthFailed,
    IdleTimeout,
    HalfFrameTimeout,
    ConnectTimeout,
    OutputOverflow,
    IoError,
    Shutdown,
}

impl CloseReason {
    pub const ALL: [CloseReason; 9] = [
        CloseReason::PeerClosed,
        CloseReason::ProtocolError,
        CloseReason::AuthFailed,
        CloseReason::IdleTimeout,
        CloseReason::HalfFrameTimeout,
        CloseReason::ConnectTimeout,
        CloseReason::OutputOverflow,
        CloseReason::IoError,
        CloseReason::Shutdown,
    ];

    /// Why a connection closes after an ERR with `code` that closes it: a refused token
    /// or the broker stopping is not the client's protocol error (issue 17).
    pub fn after_error(code: ErrorCode) -> CloseReason {
        match code {
            ErrorCode::AuthFailed => CloseReason::AuthFailed,
            ErrorCode::ShuttingDown => CloseReason::Shutdown,
            _ => CloseReason::ProtocolError,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CloseReason::PeerClosed => "peer_closed",
            CloseReason::ProtocolError => "protocol_error",
            CloseReason::AuthFailed => "auth_failed",
            CloseReason::IdleTimeout => "idle_timeout",
            CloseReason::HalfFrameTimeout => "half_frame_timeout",
            CloseReason::ConnectTimeout => "connect_timeout",
            CloseReason::OutputOverflow => "output_overflow",
            CloseReason::IoError => "io_error",
            CloseReason::Shutdown => "shutdown",
        }
    }
}

/// The life of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnState {
    /// Reading frames and answering them.
    Open,
    /// Reads nothing more; sends what is queued, then closes (after an ERR that closes,
    /// or at shutdown). Closed at the latest at its close deadline.
    Flushing(CloseReason),
    /// On the close list: freed at the end of the pass, never touched again.
    Closed(CloseReason),
}

pub struct Conn {
    pub stream: TcpStream,
    /// Never reused; told apart from a later connection in the same slab slot.
    pub serial: u64,
    pub state: ConnState,
    pub session: Session,
    pub slots: Slots,
    /// Bytes read and not yet handled: an incomplete frame, or complete frames held
    /// back by backpressure. Empty (no allocation) while idle.
    pub input: Vec<u8>,
    pub output: Vec<u8>,
    /// How much of `output` the socket has taken.
    pub output_sent: usize,
    /// Stopped reading: too much queued output or too many unanswered requests.
    pub paused: bool,
    /// When it was accepted: `--connect-timeout` counts from here.
    pub opened_ms: u64,
    pub last_frame_ms: u64,
    /// When the first byte of the current incomplete frame arrived.
    pub partial_since_ms: Option<u64>,
    /// Deadline of this connection's live timer-heap entry (u64::MAX = none).
    pub timer_at_ms: u64,
    pub close_deadline_ms: u64,
    /// Already on the pass's flush list.
    pub flush_queued: bool,
    /// This connection's share of the reactor's `buffered_bytes`.
    pub accounted_bytes: usize,
    /// Already on the read list (more to read or handle than one turn allowed).
    pub read_queued: bool,
    /// Client ERR frames logged in the current log window, and when it began.
    pub err_logs: u32,
    pub err_log_window_ms: u64,
    /// Client ERR frames not logged since the last one that was (rate limit).
    pub err_logs_dropped: u64,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: SocketAddr, serial: u64, now_ms: u64) -> Conn {
        Conn {
            stream,
            serial,
            state: ConnState::Open,
            session: Session::new(peer),
            slots: Slots::default(),
            input: Vec::new(),
            output: Vec::new(),
            output_sent: 0,
            paused: false,
            opened_ms: now_ms,
            last_frame_ms: now_ms,
            partial_since_ms: None,
            timer_at_ms: u64::MAX,
            close_deadline_ms: u64::MAX,
            flush_queued: false,
            accounted_bytes: 0,
            read_queued: false,
            err_logs: 0,
            err_log_window_ms: now_ms,
            err_logs_dropped: 0,
        }
    }

    /// What this connection counts against `--max-memory`: the bytes its buffers hold,
    /// and the answers ready behind a waiting slot (a PULL's answer is held as deliveries,
    /// but becomes that many bytes of output when its turn comes).
    pub fn held_bytes(&self) -> usize {
        self.input.len() + self.output.len() + self.slots.parked_bytes()
    }

    /// Output the connection owes: bytes not yet sent, and answers parked behind an
    /// earlier request (what `--max-output-size` limits).
    pub fn output_pending(&self) -> usize {
        self.output.len() - self.output_sent + self.slots.parked_bytes()
    }

    /// How much more output it may be given before `max_output_bytes` closes it.
    pub fn output_room(&self, max_output_bytes: usize) -> u64 {
        max_output_bytes.saturating_sub(self.output_pending()) as u64
    }

    pub fn is_open(&self) -> bool {
        self.state == ConnState::Open
    }
}
