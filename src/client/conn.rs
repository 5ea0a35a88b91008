//! One TCP connection of a [`Producer`](super::Producer) or a
//! [`Consumer`](super::Consumer): CONNECT, a write buffer sent in one syscall, and
//! frames decoded in place from one reused read buffer, so the hot paths allocate
//! nothing per frame. Messages handed out share the read buffer ([`Bytes`]); while they
//! live, reading goes on in a fresh one.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::frame::split_frame;
use crate::wire::limits::{FRAME_HEADER_BYTES, MAX_FRAME_LEN_BYTES, OP_BYTES, WIRE_VERSION};
use crate::wire::ops::{Connect, ErrFrame, Frame, Message, OkFrame};
use crate::wire::Op;

use super::brokers::Brokers;
use super::bytes::Bytes;
use super::error::{Error, Result};

/// How long connecting, and each answer a client waits for, may take unless its
/// builder says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bytes asked of the socket per read; the buffer grows for a larger frame.
const READ_CHUNK_BYTES: usize = 256 * 1024;
/// A read buffer grown past this for a large frame is given back once it empties.
const READ_BUFFER_KEEP_BYTES: usize = 4 * READ_CHUNK_BYTES;
/// Read buffers kept after messages shared them, to be read into again once those
/// messages are gone: a consumer that settles what it took soon reads into the buffer
/// before last, instead of allocating and zeroing a new one for every read.
const RETIRED_BUFFERS_MAX: usize = 2;
/// The shortest read timeout set: `set_read_timeout` refuses zero, and a read at a
/// passed deadline should still take what is already readable.
const READ_WAIT_MIN: Duration = Duration::from_millis(1);
/// Longer waits are made of reads of this length, so the socket's timeout is not set
/// again (a syscall) for every read of a busy connection.
const READ_TICK: Duration = Duration::from_millis(200);

/// A complete frame in the read buffer: its op and where its payload lies. Valid until
/// the next read from the socket.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FrameAt {
    pub op: Op,
    start: usize,
    end: usize,
}

pub(crate) struct Conn {
    stream: TcpStream,
    /// Shared with the [`Bytes`] of messages handed out.
    buf: Arc<Vec<u8>>,
    /// Earlier read buffers that messages still shared when reading moved on.
    retired: Vec<Arc<Vec<u8>>>,
    start: usize,
    end: usize,
    /// Frames queued for the next [`Conn::write_out`].
    pub out: Vec<u8>,
    read_timeout: Option<Duration>,
    /// When bytes were last written: the broker closes a connection idle for its
    /// idle timeout.
    pub last_send: Instant,
}

/// Connects to the first of `addrs` that answers within `timeout`. When a name gave
/// several addresses, the error names the last one tried.
fn dial(addrs: &[SocketAddr], timeout: Duration) -> Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no broker address");
    for addr in addrs {
        match TcpStream::connect_timeout(addr, timeout) {
            Ok(s) => return Ok(s),
            Err(e) if addrs.len() == 1 => last = e,
            Err(e) => last = io::Error::new(e.kind(), format!("{addr}: {e}")),
        }
    }
    Err(last.into())
}

impl Conn {
    /// Opens a connection and authenticates with `token`; `timeout` bounds the connect,
    /// each write and the CONNECT's answer.
    pub fn open(addrs: &[SocketAddr], token: &[u8], timeout: Duration) -> Result<Conn> {
        let stream = dial(addrs, timeout)?;
        stream.set_nodelay(true)?;
        stream.set_write_timeout(Some(timeout))?;
        let mut c = Conn {
            stream,
            buf: Arc::new(vec![0; READ_CHUNK_BYTES]),
            retired: Vec::new(),
            start: 0,
            end: 0,
            out: Vec::new(),
            read_timeout: None,
            last_send: Instant::now(),
        };
        let connect = Frame::Connect(Connect {
            protocol_version: WIRE_VERSION,
            client_flags: 0,
            token,
            reserved: 0,
        });
        c.request(&connect, Instant::now() + timeout, &mut |_, _| {})?;
        Ok(c)
    }

    /// [`Conn::open`] to the first of `brokers`' addresses, in its order, that
    /// answers; `brokers` is told which one did.
    pub fn open_to(brokers: &mut Brokers, token: &[u8], timeout: Duration) -> Result<Conn> {
        let c = Conn::open(&brokers.order(), token, timeout)?;
        brokers.connected(c.stream.peer_addr().ok());
        Ok(c)
    }

    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    pub fn payload(&self, f: FrameAt) -> &[u8] {
        &self.buf[f.start..f.end]
    }

    /// `bytes`, a part of a payload this connection returned, as a shared window on the
    /// read buffer.
    pub fn share(&self, bytes: &[u8]) -> Bytes {
        if bytes.is_empty() {
            return Bytes::default();
        }
        let start = bytes.as_ptr() as usize - self.buf.as_ptr() as usize;
        Bytes::shared(&self.buf, start, start + bytes.len())
    }

    /// Writes every queued frame.
    pub fn write_out(&mut self) -> Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out)?;
            self.out.clear();
            self.last_send = Instant::now();
        }
        Ok(())
    }

    /// Writes `bytes` now (frames kept outside the connection's queue).
    pub fn write_bytes(&mut self, bytes: &[u8]) -> Result<()> {
        self.stream.write_all(bytes)?;
        self.last_send = Instant::now();
        Ok(())
    }

    /// The next complete frame already read, consumed; `None` when more bytes are needed.
    pub fn buffered(&mut self) -> Result<Option<FrameAt>> {
        match split_frame(&self.buf[self.start..self.end], MAX_FRAME_LEN_BYTES) {
            Ok(Some(raw)) => {
                let op = Op::from_u8(raw.op).ok_or_else(|| {
                    Error::Protocol(format!("op 0x{:02X} from the broker", raw.op))
                })?;
                let start = self.start + FRAME_HEADER_BYTES + OP_BYTES;
                self.start += raw.total_bytes;
                Ok(Some(FrameAt {
                    op,
                    start,
                    end: self.start,
                }))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(Error::Protocol(format!("from the broker: {e}"))),
        }
    }

    /// Whether a complete frame is buffered (no read needed for the next one).
    pub fn has_frame(&self) -> bool {
        matches!(
            split_frame(&self.buf[self.start..self.end], MAX_FRAME_LEN_BYTES),
            Ok(Some(_)) | Err(_)
        )
    }

    /// Reads what arrives within `wait` (at most a [`READ_TICK`]): `false` when nothing
    /// did. The broker closing the connection is an error.
    fn read_some(&mut self, wait: Duration) -> Result<bool> {
        self.make_room();
        let wait = if wait >= READ_TICK {
            READ_TICK
        } else {
            wait.max(READ_WAIT_MIN)
        };
        if self.read_timeout != Some(wait) {
            self.stream.set_read_timeout(Some(wait))?;
            self.read_timeout = Some(wait);
        }
        let buf = Arc::get_mut(&mut self.buf).expect("made room: not shared");
        match self.stream.read(&mut buf[self.end..]) {
            Ok(0) => Err(Error::io(
                io::ErrorKind::UnexpectedEof,
                "the broker closed the connection",
            )),
            Ok(n) => {
                self.end += n;
                Ok(true)
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                Ok(false)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(true),
            Err(e) => Err(e.into()),
        }
    }

    /// The read buffer, this connection's alone, with at least half a chunk free after
    /// `end`: compacted or grown in place, or a fresh one while messages share it.
    fn make_room(&mut self) {
        let live = self.end - self.start;
        if Arc::get_mut(&mut self.buf).is_none() {
            self.move_to_unshared_buffer(live);
        }
        let buf = Arc::get_mut(&mut self.buf).expect("not shared");
        if live == 0 {
            (self.start, self.end) = (0, 0);
            if buf.len() > READ_BUFFER_KEEP_BYTES {
                buf.truncate(READ_CHUNK_BYTES);
                buf.shrink_to_fit();
            }
        } else if buf.len() - self.end < READ_CHUNK_BYTES / 2 {
            buf.copy_within(self.start..self.end, 0);
            (self.start, self.end) = (0, live);
        }
        if buf.len() - self.end < READ_CHUNK_BYTES / 2 {
            buf.resize(self.end + READ_CHUNK_BYTES, 0);
        }
    }

    /// Moves the `live` unread bytes to a buffer no message shares: a retired one whose
    /// messages are all gone, else a new one; the shared one is retired.
    fn move_to_unshared_buffer(&mut self, live: usize) {
        let free = self.retired.iter().position(|b| Arc::strong_count(b) == 1);
        let next = match free {
            Some(i) => self.retired.swap_remove(i),
            None => Arc::new(Vec::new()),
        };
        let old = std::mem::replace(&mut self.buf, next);
        let buf = Arc::get_mut(&mut self.buf).expect("retired buffers are never handed out");
        if buf.len() < live + READ_CHUNK_BYTES {
            buf.resize(live + READ_CHUNK_BYTES, 0);
        }
        buf[..live].copy_from_slice(&old[self.start..self.end]);
        (self.start, self.end) = (0, live);
        if self.retired.len() < RETIRED_BUFFERS_MAX && old.len() <= READ_BUFFER_KEEP_BYTES {
            self.retired.push(old);
        }
    }

    /// The next frame, writing what is queued first and reading as needed; `None` once
    /// `deadline` has passed without one. `wait_max` caps each read (a caller that
    /// reads with no deadline still wakes to look at other things).
    pub fn next_frame(&mut self, deadline: Instant, wait_max: Duration) -> Result<Option<FrameAt>> {
        loop {
            if let Some(f) = self.buffered()? {
                return Ok(Some(f));
            }
            self.write_out()?;
            let now = Instant::now();
            let wait = deadline.saturating_duration_since(now).min(wait_max);
            if !self.read_some(wait)? && Instant::now() >= deadline {
                return Ok(None);
            }
        }
    }

    /// Sends `frame` on a connection with nothing else in flight and returns its OK's
    /// result bytes, handing MSG and NOTICE frames that arrive first to `on_push`.
    pub fn request(
        &mut self,
        frame: &Frame<'_>,
        deadline: Instant,
        on_push: &mut dyn FnMut(Op, &[u8]),
    ) -> Result<Vec<u8>> {
        frame.encode(&mut self.out);
        let op = frame.op();
        loop {
            let Some(f) = self.next_frame(deadline, Duration::MAX)? else {
                return Err(Error::Timeout(format!("no answer to {}", op.name())));
            };
            if matches!(f.op, Op::Msg | Op::Notice) {
                on_push(f.op, self.payload(f));
                continue;
            }
            return answer_to(op, f.op, self.payload(f)).map(<[u8]>::to_vec);
        }
    }
}

/// The result bytes of the OK answering `op`, or the error its ERR carries.
pub(crate) fn answer_to(op: Op, got: Op, payload: &[u8]) -> Result<&[u8]> {
    let malformed = |e: crate::wire::DecodeError| Error::Protocol(e.to_string());
    match got {
        Op::Ok => {
            let ok = OkFrame::decode(payload).map_err(malformed)?;
            if ok.request_op != op as u8 {
                return Err(Error::Protocol(format!(
                    "an OK for op 0x{:02X} while waiting for the answer to {}",
                    ok.request_op,
                    op.name()
                )));
            }
            Ok(ok.result)
        }
        Op::Err => {
            let e = ErrFrame::decode(payload).map_err(malformed)?;
            Err(Error::from_err(e.code, e.request_op, e.message))
        }
        other => Err(Error::Protocol(format!(
            "{} while waiting for the answer to {}",
            other.name(),
            op.name()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn conn() -> Conn {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        Conn {
            stream: TcpStream::connect(listener.local_addr().unwrap()).unwrap(),
            buf: Arc::new(vec![0; READ_CHUNK_BYTES]),
            retired: Vec::new(),
            start: 0,
            end: 0,
            out: Vec::new(),
            read_timeout: None,
            last_send: Instant::now(),
        }
    }

    #[test]
    fn reading_goes_back_to_a_buffer_once_the_messages_sharing_it_are_gone() {
        let mut c = conn();
        let first = Arc::as_ptr(&c.buf);
        Arc::get_mut(&mut c.buf).unwrap()[..3].copy_from_slice(b"abc");
        (c.start, c.end) = (1, 3);
        let message = Arc::clone(&c.buf); // a message handed out shares the buffer
        c.make_room();
        assert_ne!(
            Arc::as_ptr(&c.buf),
            first,
            "reads go to another buffer meanwhile"
        );
        assert_eq!(
            &c.buf[c.start..c.end],
            b"bc",
            "the unread bytes move with them"
        );
        drop(message);
        let second = Arc::as_ptr(&c.buf);
        let message = Arc::clone(&c.buf);
        c.make_room();
        assert!(
            c.retired.iter().any(|b| Arc::as_ptr(b) == second),
            "the second one is kept for later"
        );
        assert_eq!(
            Arc::as_ptr(&c.buf),
            first,
            "the first one is free again: reused"
        );
        assert_eq!(&c.buf[c.start..c.end], b"bc");
        drop(message);
        assert!(c.retired.len() <= RETIRED_BUFFERS_MAX);
    }
}
