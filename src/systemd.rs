//! Readiness notification for systemd's `Type=notify` (sd_notify(3)): one datagram to the
//! socket named by `$NOTIFY_SOCKET`, a path or, starting with `@`, an abstract name.
//!
//! Written with std's `UnixDatagram` rather than the `sd-notify` crate: its 0.5.0 connects
//! the variable as a path, so the abstract names sd_notify(3) allows would fail
//! (docs/DECISIONS.md).

use std::io;
use std::os::unix::net::UnixDatagram;

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_SOCKET_ENV: &str = "NOTIFY_SOCKET";

/// What the broker tells the service manager.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    /// The listeners are bound and recovery is done: clients may come.
    Ready,
    /// Draining after SIGTERM/SIGINT.
    Stopping,
}

impl State {
    fn message(self) -> &'static [u8] {
        match self {
            State::Ready => b"READY=1\n",
            State::Stopping => b"STOPPING=1\n",
        }
    }
}

/// Sends `state` to `$NOTIFY_SOCKET`; does nothing when it is unset (not under systemd,
/// or not `Type=notify`).
pub fn notify(state: State) -> io::Result<()> {
    let Some(name) = std::env::var_os(NOTIFY_SOCKET_ENV) else {
        return Ok(());
    };
    use std::os::unix::ffi::OsStrExt;
    let socket = UnixDatagram::unbound()?;
    let name = name.as_bytes();
    match name.strip_prefix(b"@") {
        Some(abstract_name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(abstract_name)?;
            socket.connect_addr(&addr)?;
        }
        None => socket.connect(std::ffi::OsStr::from_bytes(name))?,
    }
    socket.send(state.message()).map(|_| ())
}
