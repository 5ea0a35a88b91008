//! Peer frames (`docs/REPLICATION.md` §5.6): `length u32 | kind u8 | body`, big-endian,
//! where `length` counts the kind byte and the body (not itself).
//!
//! ```text
//! HELLO body (kind 1), the first frame of every outbound link
//! 0   4  magic         "MMQP"
//! 4   2  version u16   HELLO_VERSION
//! 6   8  cluster u64   cluster_id() of the sorted --peers
//! 14  1  from u8       the dialling node
//! 15  1  to u8         the node dialled
//! 16  8  last_index    the sender's last raft index when it dialled
//! 24  8  last_term     the term of that entry
//! 32  2  client_len    then the advertised client address, text (`host:port`)
//! ..  2  admin_len     then the admin address, text; 0 bytes = no admin listener
//! ..  8  cluster_uid   version 2 only: the cluster's own id (`--cluster-id`, kept in
//!                      the data directory); a node without one sends version 1
//!
//! RAFT body (kind 2): raft's protobuf encoding of `eraftpb::Message`, nothing else.
//!
//! INSTALL body (kind 3): a snapshot's chunk request, chunk or refusal, opaque here
//! (laid out in `broker::replica::install`).
//! ```

use std::fmt;
use std::net::SocketAddr;

use protobuf::Message as _;
use raft::eraftpb::Message;

/// Largest `length` a peer may send or be sent: raft's appends carry at most 1 MiB of
/// entries (`max_size_per_msg`), so 2 MiB leaves room for headers and one big entry. A
/// bigger length closes the link: it is a bug or an attack, never a message to wait for.
pub const FRAME_BYTES_MAX: usize = 2 * 1024 * 1024;
/// The length prefix.
pub const LENGTH_BYTES: usize = 4;
/// Version of the HELLO layout above without the cluster's own id, which nodes from
/// before it speak; a peer with an unknown version is refused.
pub const HELLO_VERSION: u16 = 1;
/// The layout with `cluster_uid`: sent by a node that has a cluster id.
pub const HELLO_VERSION_UID: u16 = 2;
/// HELLO's first bytes: not a MortarMQ peer otherwise (a client dialling the wrong port).
pub const HELLO_MAGIC: &[u8; 4] = b"MMQP";
/// HELLO's fixed part, before the two addresses.
const HELLO_FIXED_BYTES: usize = 32;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Hello = 1,
    Raft = 2,
    Install = 3,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        match b {
            1 => Some(FrameKind::Hello),
            2 => Some(FrameKind::Raft),
            3 => Some(FrameKind::Install),
            _ => None,
        }
    }
}

/// What a node says about itself when it dials another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub cluster_id: u64,
    pub from: u8,
    pub to: u8,
    pub last_index: u64,
    pub last_term: u64,
    /// The sender's advertised client address: what a NOT_LEADER answer names.
    pub client_addr: SocketAddr,
    /// The sender's admin HTTP address, for `mortarctl cluster status`.
    pub admin_addr: Option<SocketAddr>,
    /// The cluster's own id, which `cluster_id` (a digest of `--peers`) cannot tell
    /// apart from another cluster made on the same `--peers`; `None`: version 1.
    pub cluster_uid: Option<u64>,
}

/// Why bytes from a peer are not a frame this node accepts; the link is closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// `length` past [`FRAME_BYTES_MAX`], or 0 (no kind byte).
    BadLength(usize),
    UnknownKind(u8),
    BadHello(&'static str),
    BadRaft(String),
}

impl fmt::Display for FrameError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FrameError::BadLength(n) => {
                write!(f, "frame length {n} outside 1..={FRAME_BYTES_MAX}")
            }
            FrameError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            FrameError::BadHello(why) => write!(f, "bad HELLO: {why}"),
            FrameError::BadRaft(why) => write!(f, "bad RAFT frame: {why}"),
        }
    }
}

/// The cluster id: two CRC-32s (crc32fast, already a dependency; no CRC-64 crate is)
/// of the canonical `--peers` text `1=ADDR,2=ADDR,...` sorted by id, the second seeded
/// with the first. Nodes started with different `--peers` lists never link up.
pub fn cluster_id(nodes: &[(u8, SocketAddr)]) -> u64 {
    let mut sorted = nodes.to_vec();
    sorted.sort_by_key(|n| n.0);
    let text: Vec<String> = sorted.iter().map(|(id, a)| format!("{id}={a}")).collect();
    let text = text.join(",");
    let high = crc32fast::hash(text.as_bytes());
    let mut second = crc32fast::Hasher::new_with_initial(high);
    second.update(text.as_bytes());
    (u64::from(high) << 32) | u64::from(second.finalize())
}

/// Appends a whole frame's length and kind; the caller appends `body_len` bytes.
fn put_header(out: &mut Vec<u8>, kind: FrameKind, body_len: usize) {
    out.extend_from_slice(&((body_len + 1) as u32).to_be_bytes());
    out.push(kind as u8);
}

/// Appends a HELLO frame.
pub fn put_hello(out: &mut Vec<u8>, h: &Hello) {
    let client = h.client_addr.to_string();
    let admin = h.admin_addr.map(|a| a.to_string()).unwrap_or_default();
    let (version, uid_bytes) = match h.cluster_uid {
        Some(_) => (HELLO_VERSION_UID, 8),
        None => (HELLO_VERSION, 0),
    };
    put_header(
        out,
        FrameKind::Hello,
        HELLO_FIXED_BYTES + 4 + client.len() + admin.len() + uid_bytes,
    );
    out.extend_from_slice(HELLO_MAGIC);
    out.extend_from_slice(&version.to_be_bytes());
    out.extend_from_slice(&h.cluster_id.to_be_bytes());
    out.push(h.from);
    out.push(h.to);
    out.extend_from_slice(&h.last_index.to_be_bytes());
    out.extend_from_slice(&h.last_term.to_be_bytes());
    for text in [client, admin] {
        out.extend_from_slice(&(text.len() as u16).to_be_bytes());
        out.extend_from_slice(text.as_bytes());
    }
    if let Some(uid) = h.cluster_uid {
        out.extend_from_slice(&uid.to_be_bytes());
    }
}

/// Bytes a RAFT frame of `msg` takes, length prefix included.
pub fn raft_frame_bytes(msg: &Message) -> usize {
    LENGTH_BYTES + 1 + msg.compute_size() as usize
}

/// Appends a RAFT frame; `msg.compute_size()` must fit [`FRAME_BYTES_MAX`] (checked by
/// the caller through [`raft_frame_bytes`]).
pub fn put_raft(out: &mut Vec<u8>, msg: &Message) -> Result<(), FrameError> {
    let start = out.len();
    put_header(out, FrameKind::Raft, 0);
    if let Err(e) = msg.write_to_vec(out) {
        out.truncate(start);
        return Err(FrameError::BadRaft(e.to_string()));
    }
    let length = (out.len() - start - LENGTH_BYTES) as u32;
    out[start..start + LENGTH_BYTES].copy_from_slice(&length.to_be_bytes());
    Ok(())
}

/// Appends an INSTALL frame (`body.len() + 1` must fit [`FRAME_BYTES_MAX`]).
pub fn put_install(out: &mut Vec<u8>, body: &[u8]) {
    put_header(out, FrameKind::Install, body.len());
    out.extend_from_slice(body);
}

/// A frame split off a buffer: its kind, its body, and the bytes it took.
pub type Split<'a> = (FrameKind, &'a [u8], usize);

/// A complete frame at the start of `buf`: `Ok(Some((kind, body, consumed)))`,
/// `Ok(None)` while incomplete. The length is checked before the body arrives.
pub fn split(buf: &[u8]) -> Result<Option<Split<'_>>, FrameError> {
    let Some(prefix) = buf.get(..LENGTH_BYTES) else {
        return Ok(None);
    };
    let length = u32::from_be_bytes(prefix.try_into().expect("4 bytes")) as usize;
    if length == 0 || length > FRAME_BYTES_MAX {
        return Err(FrameError::BadLength(length));
    }
    let end = LENGTH_BYTES + length;
    let Some(frame) = buf.get(LENGTH_BYTES..end) else {
        return Ok(None);
    };
    let kind = FrameKind::from_u8(frame[0]).ok_or(FrameError::UnknownKind(frame[0]))?;
    Ok(Some((kind, &frame[1..], end)))
}

/// Decodes a RAFT body.
pub fn parse_raft(body: &[u8]) -> Result<Message, FrameError> {
    Message::parse_from_bytes(body).map_err(|e| FrameError::BadRaft(e.to_string()))
}

/// Decodes a HELLO body (magic and version checked; ids and cluster are the caller's).
pub fn parse_hello(body: &[u8]) -> Result<Hello, FrameError> {
    let mut r = Reader(body);
    if r.take(4)? != HELLO_MAGIC {
        return Err(FrameError::BadHello("not MMQP (not a MortarMQ peer)"));
    }
    let version = r.u16()?;
    if version != HELLO_VERSION && version != HELLO_VERSION_UID {
        return Err(FrameError::BadHello("unknown version"));
    }
    let cluster_id = r.u64()?;
    let from = r.take(1)?[0];
    let to = r.take(1)?[0];
    let last_index = r.u64()?;
    let last_term = r.u64()?;
    let client_addr = r.addr()?.ok_or(FrameError::BadHello("no client address"))?;
    let admin_addr = r.addr()?;
    let cluster_uid = match version {
        HELLO_VERSION_UID => Some(r.u64()?),
        _ => None,
    };
    if !r.0.is_empty() {
        return Err(FrameError::BadHello("bytes past the admin address"));
    }
    Ok(Hello {
        cluster_id,
        from,
        to,
        last_index,
        last_term,
        client_addr,
        admin_addr,
        cluster_uid,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.0.len() < n {
            return Err(FrameError::BadHello("too short"));
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u16(&mut self) -> Result<u16, FrameError> {
        Ok(u16::from_be_bytes(
            self.take(2)?.try_into().expect("2 bytes"),
        ))
    }

    fn u64(&mut self) -> Result<u64, FrameError> {
        Ok(u64::from_be_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }

    /// A length-prefixed address; empty = none.
    fn addr(&mut self) -> Result<Option<SocketAddr>, FrameError> {
        let len = self.u16()? as usize;
        if len == 0 {
            return Ok(None);
        }
        let text = std::str::from_utf8(self.take(len)?)
            .map_err(|_| FrameError::BadHello("address not UTF-8"))?;
        let addr = text
            .parse()
            .map_err(|_| FrameError::BadHello("address not IP:PORT"))?;
        Ok(Some(addr))
    }
}
