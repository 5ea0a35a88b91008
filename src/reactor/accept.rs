//! The accept path: the client listener, bound with a listen backlog of the broker's
//! choosing, and `accept` that keeps going when descriptors run out.
//!
//! mio's `TcpListener::bind` (like std's) always asks for a backlog of 128. After a
//! broker restart every client reconnects at once; 128 queued handshakes overflow in
//! milliseconds, the kernel drops the SYNs that do not fit, and their clients retry only
//! after 1 s, 3 s, 7 s: 5,000 clients took 37 s to get in (issue 13). A backlog as large
//! as the host allows takes them in one go.
//!
//! The listener is edge-triggered: one event, then nothing until another connection
//! arrives. When `accept` fails (EMFILE: out of descriptors) the connections already
//! queued would wait for a newcomer, so the reactor tries again on a timer instead.

use std::io::{self, Write as _};
use std::net::SocketAddr;

use mio::net::TcpStream;
use mio::{Interest, Token};
use rustix::net::{AddressFamily, SocketFlags, SocketType};

use super::{interrupted, would_block, Conn, Reactor, CONN_TOKEN_BASE};
use crate::broker::Now;
use crate::wire::ops::Op;
use crate::wire::ErrorCode;

/// The least backlog `--listen-backlog 0` asks for, whatever `net.core.somaxconn` says:
/// a reconnect storm of a few thousand clients must not overflow it.
pub const LISTEN_BACKLOG_MIN: u32 = 1024;
/// The host's cap on every listen backlog (the kernel silently lowers larger requests).
const SOMAXCONN_PATH: &str = "/proc/sys/net/core/somaxconn";
/// Connections taken from the listen queue in one pass: a storm of thousands is taken
/// over a few passes, between which the connections already open are served.
const ACCEPTS_PER_PASS_MAX: usize = 512;
/// After `accept` fails it is tried again this often, until it works or would block.
const ACCEPT_RETRY_MS: u64 = 100;

/// The backlog to ask for (`--listen-backlog`, 0 = the host's cap but at least
/// [`LISTEN_BACKLOG_MIN`]) and, when the host will grant less, a warning saying why.
/// Read once at start.
pub fn listen_backlog(configured: u32) -> (u32, Option<String>) {
    let somaxconn = std::fs::read_to_string(SOMAXCONN_PATH)
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok());
    let wanted = match configured {
        0 => somaxconn.unwrap_or(0).max(LISTEN_BACKLOG_MIN),
        n => n,
    };
    let warning = somaxconn.filter(|&cap| cap < wanted).map(|cap| {
        format!(
            "listen backlog {wanted} is capped by net.core.somaxconn {cap}: a reconnect \
             storm of more than {cap} clients will wait on SYN retries; raise it with \
             sysctl -w net.core.somaxconn={wanted}"
        )
    });
    (wanted, warning)
}

/// Binds a non-blocking listener on `addr` with `backlog`, with `SO_REUSEADDR` as mio
/// sets it (a restarted broker binds its port while old connections sit in TIME_WAIT).
pub fn bind(addr: SocketAddr, backlog: u32) -> io::Result<mio::net::TcpListener> {
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let flags = SocketFlags::CLOEXEC | SocketFlags::NONBLOCK;
    let socket = rustix::net::socket_with(family, SocketType::STREAM, flags, None)?;
    rustix::net::sockopt::set_socket_reuseaddr(&socket, true)?;
    rustix::net::bind(&socket, &addr)?;
    let backlog = i32::try_from(backlog).unwrap_or(i32::MAX);
    rustix::net::listen(&socket, backlog)?;
    let listener = std::net::TcpListener::from(socket);
    Ok(mio::net::TcpListener::from_std(listener))
}

impl Reactor {
    /// Takes queued connections: until the queue is empty, [`ACCEPTS_PER_PASS_MAX`] were
    /// taken (the rest next pass), or `accept` fails (again in [`ACCEPT_RETRY_MS`]).
    pub(super) fn accept(&mut self, now: Now) {
        self.accept_again_at_ms = None;
        for _ in 0..ACCEPTS_PER_PASS_MAX {
            let Some(listener) = &self.listener else {
                return;
            };
            match listener.accept() {
                Ok((stream, peer)) => {
                    if self.accept_failures > 0 {
                        log::info!("accept works again after {} failures", self.accept_failures);
                        self.accept_failures = 0;
                    }
                    self.open_conn(stream, peer, now);
                }
                Err(e) if would_block(&e) => return,
                Err(e) if interrupted(&e) => {}
                Err(e) => {
                    // EMFILE and friends: logged when they start, not on every retry.
                    if self.accept_failures == 0 {
                        log::warn!(
                            "accept failed: {e}; retrying every {ACCEPT_RETRY_MS} ms, queued \
                             connections wait"
                        );
                    }
                    self.accept_failures += 1;
                    self.accept_again_at_ms = Some(now.mono_ms + ACCEPT_RETRY_MS);
                    return;
                }
            }
        }
        self.accept_again_at_ms = Some(now.mono_ms);
    }

    /// Registers an accepted connection, or refuses it over `--max-connections`.
    fn open_conn(&mut self, mut stream: TcpStream, peer: SocketAddr, now: Now) {
        if self.conns.len() >= self.config.max_connections {
            self.counters.refused_connection_limit += 1;
            let mut out = Vec::new();
            crate::wire::ops::encode_err(
                &mut out,
                ErrorCode::ConnectionLimit,
                Op::Connect as u8,
                "the broker's --max-connections is reached",
            );
            // Best effort on a fresh socket: the few bytes fit its send buffer.
            let _ = stream.write(&out);
            log::info!(
                "refused {peer}: connection limit {} reached",
                self.config.max_connections
            );
            return;
        }
        let _ = stream.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        let token = Token(key + CONN_TOKEN_BASE);
        if let Err(e) = self.poll.registry().register(
            &mut stream,
            token,
            Interest::READABLE | Interest::WRITABLE,
        ) {
            log::warn!("cannot register {peer}: {e}");
            return;
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        entry.insert(Conn::new(stream, peer, serial, now.mono_ms));
        self.counters.accepted += 1;
        log::debug!("conn {serial} open from {peer}");
        self.schedule_timer(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_backlog_is_the_hosts_cap_but_at_least_the_minimum() {
        let (backlog, _) = listen_backlog(0);
        assert!(backlog >= LISTEN_BACKLOG_MIN);
        assert_eq!(listen_backlog(7).0, 7);
    }

    #[test]
    fn a_listener_bound_here_accepts() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 64).unwrap();
        let addr = listener.local_addr().unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let started = std::time::Instant::now();
        loop {
            match listener.accept() {
                Ok(_) => break,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    assert!(started.elapsed().as_secs() < 5, "never accepted");
                    std::thread::yield_now();
                }
                Err(e) => panic!("accept: {e}"),
            }
        }
    }
}
