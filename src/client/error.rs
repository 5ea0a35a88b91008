//! The one error type of [`Producer`](super::Producer) and [`Consumer`](super::Consumer):
//! a broker's ERR with its registry entry (`man/mortarmq.7`, ERRORS), or a failure on
//! this side of the wire.

use std::io;
use std::sync::Arc;

use crate::wire::errors::Retry;
use crate::wire::ErrorCode;

use super::raw::ClientError;

/// Everything a [`Producer`](super::Producer) or [`Consumer`](super::Consumer) call can
/// fail with.
///
/// A broker error carries its registry code; [`name`](Error::name),
/// [`client_should`](Error::client_should) and [`retry`](Error::retry) read the registry
/// (`src/wire/errors.rs`, the tables of `man/mortarmq.7`) for it, and give the same
/// answers for the client's own failures, so a caller can log or branch on any error
/// alike. The client already did what the registry allows (resends, backoff,
/// reconnects, rejoins) before it returns one.
///
/// ```no_run
/// use mortarmq::client::{Error, ErrorCode, Producer};
///
/// let mut producer = Producer::connect("127.0.0.1:7411")?;
/// match producer.publish("no-such-topic", b"", b"x", None) {
///     Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => {
///         // "UNKNOWN_TOPIC: DECLARE the topic, or refresh the id"
///         eprintln!("{}: {}", e.name(), e.client_should());
///     }
///     Err(e) => return Err(e),
///     Ok(receipt) => println!("stored at {}", receipt.sequence),
/// }
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Error {
    /// The broker answered ERR with this registered code.
    Broker {
        code: ErrorCode,
        /// The op the ERR answers (`Op as u8`).
        request_op: u8,
        /// The broker's diagnostic text (at most 512 bytes).
        message: String,
    },
    /// Connecting, reading or writing failed, and no retry is left (or allowed).
    Io(Arc<io::Error>),
    /// The broker did not answer in time.
    Timeout(String),
    /// The broker sent bytes the protocol does not allow (or an unregistered code).
    Protocol(String),
    /// The call was refused before anything was sent: a key or value too long, a
    /// partition the topic does not have, a closed client.
    InvalidInput(String),
}

/// `Result` with this module's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// The registry code of a broker error; `None` for the client's own failures.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            Error::Broker { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// The registry name (`UNKNOWN_TOPIC`), or the kind of the client's own failure
    /// (`IO`, `TIMEOUT`, `PROTOCOL`, `INVALID_INPUT`).
    pub fn name(&self) -> &'static str {
        match self {
            Error::Broker { code, .. } => code.name(),
            Error::Io(_) => "IO",
            Error::Timeout(_) => "TIMEOUT",
            Error::Protocol(_) => "PROTOCOL",
            Error::InvalidInput(_) => "INVALID_INPUT",
        }
    }

    /// What the caller should do: the registry's "client should" for a broker error.
    pub fn client_should(&self) -> &'static str {
        match self {
            Error::Broker { code, .. } => code.client_should(),
            Error::Io(_) => "check that the broker runs and is reachable, then retry",
            Error::Timeout(_) => "check the broker's load and health, then retry",
            Error::Protocol(_) => "report: client and broker disagree about the protocol",
            Error::InvalidInput(_) => "fix the call",
        }
    }

    /// Whether the same call may succeed later: the registry's retry class for a
    /// broker error; a lost connection or a timeout may pass.
    pub fn retry(&self) -> Retry {
        match self {
            Error::Broker { code, .. } => code.retry(),
            Error::Io(_) | Error::Timeout(_) => Retry::Backoff,
            Error::Protocol(_) | Error::InvalidInput(_) => Retry::No,
        }
    }

    pub fn is_retryable(&self) -> bool {
        self.retry() != Retry::No
    }

    /// Whether the broker closes the connection after this ERR (registry "after").
    pub(crate) fn closes_connection(&self) -> bool {
        self.code().is_some_and(ErrorCode::closes_connection)
    }

    pub(crate) fn io(kind: io::ErrorKind, text: impl Into<String>) -> Error {
        Error::Io(Arc::new(io::Error::new(kind, text.into())))
    }

    /// The ERR frame's fields as an error; an unregistered code is a protocol breach
    /// (v0's registry is closed: codes are never added to it within the version).
    pub(crate) fn from_err(code: u16, request_op: u8, message: &[u8]) -> Error {
        let message = String::from_utf8_lossy(message).into_owned();
        match ErrorCode::from_code(code) {
            Some(code) => Error::Broker {
                code,
                request_op,
                message,
            },
            None => Error::Protocol(format!("unregistered error 0x{code:04X}: {message}")),
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Broker { code, message, .. } if message.is_empty() => {
                write!(f, "{code} (client should: {})", code.client_should())
            }
            Error::Broker { code, message, .. } => {
                write!(
                    f,
                    "{code}: {message} (client should: {})",
                    code.client_should()
                )
            }
            Error::Io(e) => write!(f, "connection: {e}"),
            Error::Timeout(what) => write!(f, "timeout: {what}"),
            Error::Protocol(what) => write!(f, "protocol: {what}"),
            Error::InvalidInput(what) => f.write_str(what),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e.as_ref()),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Self {
        Error::Io(Arc::new(e))
    }
}

impl From<ClientError> for Error {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Io(e) => e.into(),
            ClientError::Broker {
                code,
                request_op,
                message,
            } => Error::from_err(code, request_op, message.as_bytes()),
            ClientError::Protocol(what) => Error::Protocol(what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broker_errors_read_the_registry() {
        let e = Error::from_err(0x0008, 3, b"topic 7");
        assert_eq!(e.code(), Some(ErrorCode::UnknownTopic));
        assert_eq!(e.name(), "UNKNOWN_TOPIC");
        assert_eq!(e.client_should(), "DECLARE the topic, or refresh the id");
        assert!(!e.is_retryable());
        assert_eq!(
            e.to_string(),
            "UNKNOWN_TOPIC (0x0008): topic 7 (client should: DECLARE the topic, or refresh \
             the id)"
        );
        let backpressure = Error::from_err(0x4001, 3, b"");
        assert_eq!(backpressure.retry(), Retry::Backoff);
        assert!(Error::from_err(0x000F, 3, b"").closes_connection());
    }

    #[test]
    fn an_unregistered_code_is_a_protocol_breach() {
        let e = Error::from_err(0x000A, 3, b"retired");
        assert!(matches!(e, Error::Protocol(_)), "{e:?}");
        assert_eq!(e.name(), "PROTOCOL");
    }
}
