//! The frame-level client: one TCP connection, frames in and frames out, nothing done
//! for the caller (no retries, no group handshake). For tests that must send exact or
//! hostile frames and tools that exercise the protocol itself; applications use
//! [`Producer`](super::Producer) and [`Consumer`](super::Consumer).
//!
//! Requests are answered in order, so a caller may pipeline with [`Client::send`] and
//! collect with [`Client::recv_reply`]. Pushes (MSG, NOTICE) that arrive while waiting
//! for a reply are kept for [`Client::next_push`].

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::wire::frame::split_frame;
use crate::wire::limits::{MAX_FRAME_LEN_BYTES, WIRE_VERSION};
use crate::wire::ops::*;
use crate::wire::{AckFlags, DeclareFlags, Durability, ErrorCode, NackReason, PubFlags};

/// Bytes asked of the socket per read.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What a frame-level [`Client`] call fails with: the broker's ERR as received (any
/// code, registered or not, for tests of hostile inputs), or the connection.
///
/// ```no_run
/// use mortarmq::client::{Client, ClientError};
/// use mortarmq::wire::{DeclareFlags, ErrorCode};
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// match c.declare("orders.dlq", 1, DeclareFlags::empty()) {
///     Err(e @ ClientError::Broker { .. }) => {
///         assert_eq!(e.code(), Some(ErrorCode::MutationNotPackable))
///     }
///     other => panic!("{other:?}"),
/// }
/// # Ok::<(), ClientError>(())
/// ```
#[derive(Debug)]
pub enum ClientError {
    Io(io::Error),
    /// The broker answered with ERR.
    Broker {
        code: u16,
        request_op: u8,
        message: String,
    },
    /// The broker sent something the protocol does not allow here.
    Protocol(String),
}

impl ClientError {
    /// The registry entry of a broker error.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Broker { code, .. } => ErrorCode::from_code(*code),
            _ => None,
        }
    }
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientError::Io(e) => write!(f, "connection: {e}"),
            ClientError::Broker { code, message, .. } => match ErrorCode::from_code(*code) {
                Some(c) => write!(f, "{c}: {message} (client should: {})", c.client_should()),
                None => write!(f, "unregistered error 0x{code:04X}: {message}"),
            },
            ClientError::Protocol(m) => write!(f, "protocol: {m}"),
        }
    }
}

impl std::error::Error for ClientError {}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        ClientError::Io(e)
    }
}

pub type Result<T> = std::result::Result<T, ClientError>;

/// One received frame, owning its payload.
///
/// ```no_run
/// use mortarmq::client::Client;
/// use mortarmq::wire::ops::{Frame, Ping};
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// c.send(&Frame::Ping(Ping {}))?;
/// let frame = c.read_frame()?;
/// assert!(matches!(frame.decode()?, Frame::Ok(_)));
/// # Ok::<(), mortarmq::client::ClientError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnedFrame {
    pub op: u8,
    pub payload: Vec<u8>,
}

impl OwnedFrame {
    pub fn decode(&self) -> Result<Frame<'_>> {
        let op = Op::from_u8(self.op)
            .ok_or_else(|| ClientError::Protocol(format!("op 0x{:02X}", self.op)))?;
        Frame::decode(op, &self.payload).map_err(|e| ClientError::Protocol(e.to_string()))
    }
}

/// A MSG with owned bytes, as [`Client::next_push`] returns it.
///
/// ```no_run
/// use mortarmq::client::{Client, Push};
/// use mortarmq::wire::AckFlags;
/// use mortarmq::wire::ops::Frame;
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// // … SUB, CONTROL_ACK the ASSIGN …
/// if let Push::Msg(d) = c.next_push()? {
///     c.request(&Frame::Ack(d.ack(AckFlags::empty())))?;
/// }
/// # Ok::<(), mortarmq::client::ClientError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub subscription_id: u16,
    pub topic_id: u16,
    pub partition: u16,
    pub sequence: u64,
    pub delivery_id: u64,
    pub attempt: u16,
    pub ownership_epoch: u64,
    pub producer_id: u64,
    pub producer_seq: u64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub origin: Option<Origin>,
}

impl From<&Msg<'_>> for Delivery {
    fn from(m: &Msg<'_>) -> Self {
        Delivery {
            subscription_id: m.subscription_id,
            topic_id: m.topic_id,
            partition: m.partition,
            sequence: m.sequence,
            delivery_id: m.delivery_id,
            attempt: m.attempt,
            ownership_epoch: m.ownership_epoch,
            producer_id: m.producer_id,
            producer_seq: m.producer_seq,
            key: m.key.to_vec(),
            value: m.value.to_vec(),
            origin: m.origin,
        }
    }
}

impl Delivery {
    pub fn delivery_ref(&self) -> DeliveryRef {
        DeliveryRef {
            subscription_id: self.subscription_id,
            topic_id: self.topic_id,
            partition: self.partition,
            sequence: self.sequence,
            delivery_id: self.delivery_id,
            ownership_epoch: self.ownership_epoch,
        }
    }

    /// The ACK that settles this delivery (with PROGRESS it only extends the deadline).
    pub fn ack(&self, flags: AckFlags) -> Ack {
        self.delivery_ref().ack(flags)
    }

    pub fn nack(&self, reason: NackReason) -> Nack {
        self.delivery_ref().nack(reason)
    }
}

/// Something the broker pushed without a request.
///
/// ```no_run
/// use mortarmq::client::{Client, Push};
/// use mortarmq::wire::ControlResult;
/// use mortarmq::wire::ops::{ControlAck, Frame};
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// match c.next_push()? {
///     Push::Notice(n) => {
///         c.request(&Frame::ControlAck(ControlAck::answering(&n, ControlResult::Ok)))?;
///     }
///     Push::Msg(d) => println!("partition {} sequence {}", d.partition, d.sequence),
/// }
/// # Ok::<(), mortarmq::client::ClientError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Push {
    Msg(Delivery),
    Notice(Notice),
}

/// The answer to a request: OK's request_op and result bytes.
///
/// ```no_run
/// use mortarmq::client::Client;
/// use mortarmq::wire::ops::{Declare, DeclareResult, Frame};
/// use mortarmq::wire::DeclareFlags;
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// let declare = Declare { topic: b"orders", partition_count: 0, flags: DeclareFlags::PASSIVE };
/// let reply = c.request(&Frame::Declare(declare))?;
/// let found: DeclareResult = reply.typed()?;
/// println!("orders is topic {}", found.topic_id);
/// # Ok::<(), mortarmq::client::ClientError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub request_op: u8,
    pub result: Vec<u8>,
}

impl Reply {
    pub fn typed<R: OkResult>(&self) -> Result<R> {
        R::decode_result(&self.result).map_err(|e| ClientError::Protocol(e.to_string()))
    }
}

/// One connection that sends and receives frames as they are: no retries, no group
/// handshake. For tests and tools; applications use [`Producer`](super::Producer) and
/// [`Consumer`](super::Consumer).
///
/// ```no_run
/// use mortarmq::client::Client;
/// use mortarmq::wire::{DeclareFlags, Durability};
///
/// let mut c = Client::connect("127.0.0.1:7411", b"")?;
/// let topic = c.declare("orders", 1, DeclareFlags::empty())?.topic_id;
/// let r = c.publish_value(topic, 0, b"raw", Some(Durability::Written))?;
/// println!("sequence {}", r.sequence);
/// # Ok::<(), mortarmq::client::ClientError>(())
/// ```
pub struct Client {
    stream: TcpStream,
    input: Vec<u8>,
    output: Vec<u8>,
    pushes: VecDeque<Push>,
}

impl Client {
    /// Opens a TCP connection without sending CONNECT.
    pub fn open(addr: impl ToSocketAddrs) -> Result<Client> {
        Client::from_stream(TcpStream::connect(addr)?)
    }

    /// Wraps a stream the caller connected itself (with a connect timeout, say) without
    /// sending CONNECT.
    pub fn from_stream(stream: TcpStream) -> Result<Client> {
        stream.set_nodelay(true)?;
        Ok(Client {
            stream,
            input: Vec::new(),
            output: Vec::new(),
            pushes: VecDeque::new(),
        })
    }

    /// Opens a connection and authenticates with `token`.
    pub fn connect(addr: impl ToSocketAddrs, token: &[u8]) -> Result<Client> {
        let mut c = Client::open(addr)?;
        c.request(&Frame::Connect(Connect {
            protocol_version: WIRE_VERSION,
            client_flags: 0,
            token,
            reserved: 0,
        }))?;
        Ok(c)
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    pub fn set_read_timeout(&self, t: Option<Duration>) -> Result<()> {
        Ok(self.stream.set_read_timeout(t)?)
    }

    /// Queues a frame; [`Client::flush`] writes every queued frame at once.
    pub fn queue(&mut self, frame: &Frame<'_>) {
        frame.encode(&mut self.output);
    }

    /// Takes the queued bytes (to write them from another thread while this one reads).
    pub fn take_queued(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    pub fn flush(&mut self) -> Result<()> {
        self.stream.write_all(&self.output)?;
        self.output.clear();
        Ok(())
    }

    /// Sends one frame now.
    pub fn send(&mut self, frame: &Frame<'_>) -> Result<()> {
        self.queue(frame);
        self.flush()
    }

    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        Ok(self.stream.write_all(bytes)?)
    }

    /// The next frame from the broker, whatever it is.
    pub fn read_frame(&mut self) -> Result<OwnedFrame> {
        loop {
            match split_frame(&self.input, MAX_FRAME_LEN_BYTES) {
                Ok(Some(raw)) => {
                    let frame = OwnedFrame {
                        op: raw.op,
                        payload: raw.payload.to_vec(),
                    };
                    let n = raw.total_bytes;
                    self.input.drain(..n);
                    return Ok(frame);
                }
                Ok(None) => {}
                Err(e) => return Err(ClientError::Protocol(e.to_string())),
            }
            let start = self.input.len();
            self.input.resize(start + READ_CHUNK_BYTES, 0);
            let n = match self.stream.read(&mut self.input[start..]) {
                Ok(n) => n,
                // A signal (the test harness's, a profiler's) is no answer: read again.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                    self.input.truncate(start);
                    continue;
                }
                Err(e) => {
                    self.input.truncate(start);
                    return Err(e.into());
                }
            };
            self.input.truncate(start + n);
            if n == 0 {
                return Err(ClientError::Io(io::ErrorKind::UnexpectedEof.into()));
            }
        }
    }

    /// The next answer (OK or ERR), keeping pushes that arrive first.
    pub fn recv_reply(&mut self) -> Result<Reply> {
        loop {
            let frame = self.read_frame()?;
            match frame.decode()? {
                Frame::Ok(ok) => {
                    return Ok(Reply {
                        request_op: ok.request_op,
                        result: ok.result.to_vec(),
                    });
                }
                Frame::Err(e) => {
                    return Err(ClientError::Broker {
                        code: e.code,
                        request_op: e.request_op,
                        message: String::from_utf8_lossy(e.message).into_owned(),
                    })
                }
                Frame::Msg(m) => self.pushes.push_back(Push::Msg(Delivery::from(&m))),
                Frame::Notice(n) => self.pushes.push_back(Push::Notice(n)),
                other => {
                    return Err(ClientError::Protocol(format!(
                        "unexpected {:?} from broker",
                        other.op()
                    )))
                }
            }
        }
    }

    pub fn request(&mut self, frame: &Frame<'_>) -> Result<Reply> {
        self.send(frame)?;
        self.recv_reply()
    }

    /// The next push, reading the socket if none is kept (use a read timeout to bound it).
    pub fn next_push(&mut self) -> Result<Push> {
        if let Some(p) = self.pushes.pop_front() {
            return Ok(p);
        }
        let frame = self.read_frame()?;
        match frame.decode()? {
            Frame::Msg(m) => Ok(Push::Msg(Delivery::from(&m))),
            Frame::Notice(n) => Ok(Push::Notice(n)),
            other => Err(ClientError::Protocol(format!(
                "unexpected {:?} while waiting for a push",
                other.op()
            ))),
        }
    }

    /// Pushes already received and not yet taken.
    pub fn kept_pushes(&mut self) -> &mut VecDeque<Push> {
        &mut self.pushes
    }

    pub fn ping(&mut self) -> Result<()> {
        self.request(&Frame::Ping(Ping {})).map(|_| ())
    }

    pub fn declare(
        &mut self,
        topic: &str,
        partition_count: u16,
        flags: DeclareFlags,
    ) -> Result<DeclareResult> {
        self.request(&Frame::Declare(Declare {
            topic: topic.as_bytes(),
            partition_count,
            flags,
        }))?
        .typed()
    }

    pub fn publish(&mut self, p: &Pub<'_>) -> Result<PubResult> {
        self.request(&Frame::Pub(p.clone()))?.typed()
    }

    /// A non-idempotent PUB of `value` asking for `durability` (`None`: the broker's
    /// default).
    pub fn publish_value(
        &mut self,
        topic_id: u16,
        partition: u16,
        value: &[u8],
        durability: Option<Durability>,
    ) -> Result<PubResult> {
        self.publish(&Pub {
            topic_id,
            partition,
            flags: PubFlags::requesting(durability),
            value,
            ..Pub::default()
        })
    }
}
