//! What the reactor is told at start, and its defaults (the `--help` and `man/mortard.8`
//! defaults of the Network and Limits flags come from here).

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};

use crate::wire::limits::{HALF_FRAME_TIMEOUT_MS, IDLE_TIMEOUT_MS};

const MIB: usize = 1024 * 1024;

#[derive(Clone, PartialEq, Eq)]
pub struct ReactorConfig {
    /// `--listen`: the client protocol listener.
    pub listen: SocketAddr,
    /// `--listen-backlog`: connections the kernel queues before `accept`; 0 = the host's
    /// `net.core.somaxconn`, at least [`LISTEN_BACKLOG_MIN`](super::LISTEN_BACKLOG_MIN).
    pub listen_backlog: u32,
    /// `--max-connections`: the CONNECT of one more gets CONNECTION_LIMIT and a close.
    pub max_connections: usize,
    /// `--idle-timeout`: no complete frame for this long closes the connection.
    pub idle_timeout_ms: u64,
    /// `--half-frame-timeout`: a frame begun but not finished within this closes it.
    pub half_frame_timeout_ms: u64,
    /// `--connect-timeout`: a connection without a successful CONNECT this long after it
    /// was accepted is closed, whatever else it sends.
    pub connect_timeout_ms: u64,
    /// `--max-output-size`: a client whose unread output passes this is closed.
    pub max_output_bytes: usize,
    /// `--max-pending-requests`: above it the socket is not read until half are answered.
    pub max_pending_requests: usize,
    /// `--max-memory`: above this many bytes in connection buffers, PUB, SUB and PULL
    /// get MEMORY_LIMIT (0x4004) and are not applied.
    pub max_memory_bytes: usize,
    /// Loaded by `mortard` from `--token-file`. `None`: every token is accepted.
    pub tokens: Option<Vec<Vec<u8>>>,
}

impl Default for ReactorConfig {
    fn default() -> Self {
        ReactorConfig {
            listen: SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 7411)),
            listen_backlog: 0,
            max_connections: 4096,
            // 1.5 x the 30 s client keepalive, so one late PING does not cost a connection.
            idle_timeout_ms: IDLE_TIMEOUT_MS,
            half_frame_timeout_ms: HALF_FRAME_TIMEOUT_MS,
            // CONNECT is a client's first frame: 10 s is many round trips on any link, and
            // short enough that peers that never log in cannot keep the connection slots.
            connect_timeout_ms: 10_000,
            max_output_bytes: 64 * MIB,
            max_pending_requests: 1024,
            max_memory_bytes: 256 * MIB,
            tokens: None,
        }
    }
}

/// Tokens are secrets: a `{:?}` of the config (a failed test, a log line) shows how many
/// there are, never what they are.
impl fmt::Debug for ReactorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReactorConfig")
            .field("listen", &self.listen)
            .field("listen_backlog", &self.listen_backlog)
            .field("max_connections", &self.max_connections)
            .field("idle_timeout_ms", &self.idle_timeout_ms)
            .field("half_frame_timeout_ms", &self.half_frame_timeout_ms)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("max_output_bytes", &self.max_output_bytes)
            .field("max_pending_requests", &self.max_pending_requests)
            .field("max_memory_bytes", &self.max_memory_bytes)
            .field("tokens", &self.tokens.as_ref().map(Vec::len))
            .finish()
    }
}
