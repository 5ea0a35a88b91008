//! What the reactor is told at start (built from the flags by `config`).

use std::net::SocketAddr;

pub struct ReactorConfig {
    pub listen: SocketAddr,
    pub max_connections: usize,
    pub idle_timeout_ms: u64,
    pub half_frame_timeout_ms: u64,
    pub max_output_bytes: usize,
    pub max_pending_requests: usize,
    /// `--max-memory`: above this many bytes in connection buffers, PUB, SUB and PULL
    /// get MEMORY_LIMIT (0x4004) and are not applied.
    pub max_memory_bytes: usize,
    /// `None`: every token is accepted.
    pub tokens: Option<Vec<Vec<u8>>>,
}
