//! Per-connection protocol state: the CONNECT gate, the one dispatch of requests, and
//! the response slots.
//!
//! A frame is admitted by the check order of `man/mortarmq.7` (before CONNECT only
//! CONNECT, PING and ERR; reserved ops; server-only ops; the payload), decoded into a
//! [`Request`], and [`dispatch`]ed: one `match`, each arm one handler.
//!
//! A client may pipeline; every request gets exactly one response, in request order. A
//! response that is ready while nothing older waits is encoded straight into the output
//! buffer; otherwise it takes a slot in [`Slots`] and goes out when every older slot has
//! been answered. A PULL's answer waits there as deliveries, not bytes, and is encoded
//! from the log when its turn comes; what waits counts against the connection's output
//! cap and the memory budget all the same ([`Slots::parked_bytes`]). Pushes (MSG,
//! NOTICE) never take a slot.
//!
//! Depends on `wire` and on `broker` (the handlers the dispatch calls).

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};

use crate::broker::{Broker, ConnRef, Handled, Now, PullAnswer};
use crate::wire::frame::{classify_op, OpClass};
use crate::wire::limits::{MAX_FRAME_LEN_BYTES, PREAUTH_FRAME_LEN_MAX_BYTES, WIRE_VERSION};
use crate::wire::ops::{Connect, ErrFrame};
use crate::wire::{ErrorCode, NotARequest, Op, Request, Response};

/// What to do with a complete frame (length and op 0x00/0xFF were already checked by
/// the splitter).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit<'a> {
    /// Dispatch it.
    Request(Request<'a>),
    /// A client's ERR: log it, never answer it.
    Ignore(ErrFrame<'a>),
    /// Answer with this error (keep or close per the registry's After column).
    Refuse(ErrorCode, String),
}

#[derive(Debug)]
pub struct Session {
    pub peer: SocketAddr,
    connected: bool,
}

impl Session {
    pub fn new(peer: SocketAddr) -> Session {
        Session {
            peer,
            connected: false,
        }
    }

    pub fn is_connected(&self) -> bool {
        self.connected
    }

    /// The cap on `length` in force: small until CONNECT succeeds.
    pub fn frame_len_max(&self) -> u32 {
        if self.connected {
            MAX_FRAME_LEN_BYTES
        } else {
            PREAUTH_FRAME_LEN_MAX_BYTES
        }
    }

    pub fn admit<'a>(&self, op_byte: u8, payload: &'a [u8]) -> Admit<'a> {
        let refuse = |code, why: &str| Admit::Refuse(code, why.to_string());
        let class = classify_op(op_byte);
        if !self.connected && !matches!(class, OpClass::Known(Op::Connect | Op::Ping | Op::Err)) {
            return refuse(ErrorCode::NotConnected, "send CONNECT first");
        }
        let op = match class {
            OpClass::Illegal => {
                return refuse(ErrorCode::IllegalOp, "op 0x00 and 0xFF are illegal")
            }
            OpClass::Reserved => return refuse(ErrorCode::UnknownOp, "op is reserved in wire v1"),
            OpClass::Known(op) => op,
        };
        match Request::decode(op, payload) {
            Ok(request) => Admit::Request(request),
            Err(NotARequest::ClientErr(err)) => Admit::Ignore(err),
            Err(NotARequest::ServerOnly(_)) => refuse(
                ErrorCode::UnexpectedOp,
                "OK, MSG and NOTICE are sent by the server only",
            ),
            Err(NotARequest::Malformed(e)) => {
                Admit::Refuse(ErrorCode::MalformedPayload, e.to_string())
            }
        }
    }

    /// CONNECT: the protocol version, then the token (`None`: every token is accepted).
    pub fn connect(
        &mut self,
        c: &Connect<'_>,
        tokens: Option<&[Vec<u8>]>,
        conn: ConnRef,
    ) -> Response {
        let op = Op::Connect as u8;
        if self.connected {
            return Response::err(
                ErrorCode::AlreadyConnected,
                op,
                "this session is already connected",
            );
        }
        if c.protocol_version != WIRE_VERSION {
            return Response::err(
                ErrorCode::UnsupportedVersion,
                op,
                format!(
                    "protocol_version {} is not {WIRE_VERSION}",
                    c.protocol_version
                ),
            );
        }
        if tokens.is_some_and(|tokens| !token_matches(tokens, c.token)) {
            // The token itself is never logged.
            log::warn!(
                "conn {} from {}: token not accepted",
                conn.serial,
                self.peer
            );
            return Response::err(ErrorCode::AuthFailed, op, "token not accepted");
        }
        self.connected = true;
        Response::ok(Op::Connect)
    }
}

/// The answer to the first failed CONNECT from an address goes out at once; each later
/// one (within [`AUTH_FAILURES_FORGET_MS`]) waits this much longer than the one before...
pub const AUTH_FAILURE_DELAY_STEP_MS: u64 = 100;
/// ...up to this: a guesser gets at most one answer per 5 s per connection slot, while a
/// client with a mistyped token still hears why within seconds.
pub const AUTH_FAILURE_DELAY_MAX_MS: u64 = 5_000;
/// Addresses whose failures are remembered. Past it, new addresses share one count (see
/// [`AuthFailures`]), so neither memory nor the delay can be walked around with more
/// addresses.
pub const AUTH_FAILURE_ADDRESSES_MAX: usize = 4096;
/// An address with no failed CONNECT for this long is forgotten (its next failure is
/// answered at once again).
pub const AUTH_FAILURES_FORGET_MS: u64 = 10 * 60 * 1000;

const _: () = assert!(AUTH_FAILURE_DELAY_STEP_MS <= AUTH_FAILURE_DELAY_MAX_MS);

#[derive(Debug, Clone, Copy, Default)]
struct Failures {
    count: u64,
    last_ms: u64,
}

impl Failures {
    /// Counts one more failure at `now_ms`; returns how long its answer waits.
    fn add(&mut self, now_ms: u64) -> u64 {
        if now_ms.saturating_sub(self.last_ms) > AUTH_FAILURES_FORGET_MS {
            self.count = 0;
        }
        let delay = self
            .count
            .saturating_mul(AUTH_FAILURE_DELAY_STEP_MS)
            .min(AUTH_FAILURE_DELAY_MAX_MS);
        self.count += 1;
        self.last_ms = now_ms;
        delay
    }
}

/// Failed CONNECTs per peer address, so that guessing tokens gets slower with every
/// guess. Pure bookkeeping: the reactor holds the answer back by the delay returned (it
/// never sleeps). An IPv6 peer counts by its /64, which one host usually owns whole; an
/// IPv4-mapped address counts as the IPv4 address. Once [`AUTH_FAILURE_ADDRESSES_MAX`]
/// addresses are tracked, failures from any other address go to one shared count, which
/// fails closed: those guessers slow each other down.
#[derive(Debug, Default)]
pub struct AuthFailures {
    by_address: HashMap<IpAddr, Failures>,
    overflow: Failures,
}

impl AuthFailures {
    /// Counts a failed CONNECT from `ip`; returns how many ms its answer must wait.
    pub fn failed(&mut self, ip: IpAddr, now_ms: u64) -> u64 {
        let key = address_key(ip);
        if let Some(f) = self.by_address.get_mut(&key) {
            return f.add(now_ms);
        }
        if self.by_address.len() >= AUTH_FAILURE_ADDRESSES_MAX {
            return self.overflow.add(now_ms);
        }
        self.by_address.entry(key).or_default().add(now_ms)
    }

    /// Forgets addresses idle for [`AUTH_FAILURES_FORGET_MS`] (housekeeping, once a
    /// second; bounded by [`AUTH_FAILURE_ADDRESSES_MAX`]).
    pub fn expire(&mut self, now_ms: u64) {
        self.by_address
            .retain(|_, f| now_ms.saturating_sub(f.last_ms) <= AUTH_FAILURES_FORGET_MS);
    }

    /// Addresses tracked one by one.
    pub fn addresses(&self) -> usize {
        self.by_address.len()
    }
}

/// The address failures are counted under.
fn address_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !u128::from(u64::MAX))),
        },
    }
}

/// What a dispatched request needs besides itself.
pub struct Call<'b> {
    pub conn: ConnRef,
    /// The slot its response takes if it has to wait.
    pub slot: u64,
    pub now: Now,
    /// CONNECT tokens (`--token-file`); `None`: every token is accepted.
    pub tokens: Option<&'b [Vec<u8>]>,
    /// What the connection's output can still take before `--max-output-size`: a PULL
    /// answered at once is cut to fit.
    pub output_room_bytes: u64,
}

/// The one dispatch of client requests: each op to its handler.
pub fn dispatch(
    session: &mut Session,
    broker: &mut Broker,
    call: Call<'_>,
    r: Request<'_>,
) -> Handled {
    let Call {
        conn,
        slot,
        now,
        tokens,
        output_room_bytes,
    } = call;
    // A cluster node that is not the leader turns the request away (the role gate of
    // `docs/REPLICATION.md` §7.1); a single node admits everything.
    if let Err((code, text)) = broker.admit(r.op(), now) {
        return Handled::Answer(Response::err(code, r.op() as u8, text));
    }
    match r {
        Request::Connect(c) => Handled::Answer(session.connect(&c, tokens, conn)),
        Request::Ping => Handled::Answer(Response::ok(Op::Ping)),
        Request::Declare(d) => broker.declare(conn, slot, &d, now),
        Request::Pub(p) => broker.publish(conn, slot, &p, now),
        Request::Sub(s) => broker.subscribe(conn, &s, now),
        Request::Ack(a) => broker.ack(conn, &a, now),
        Request::Nack(n) => broker.nack(conn, &n, now),
        Request::Pull(p) => broker.pull(conn, slot, &p, now, &|_| output_room_bytes),
        Request::Heartbeat(h) => broker.heartbeat(conn, &h, now),
        Request::ControlAck(c) => broker.control_ack(conn, &c, now),
        Request::Credit(c) => broker.credit(conn, &c, now),
    }
}

/// The tokens of a `--token-file`: one per line, surrounding whitespace (spaces, tabs,
/// a CR before the LF) not part of it; blank lines and lines whose first non-blank byte
/// is `#` are skipped, so a token cannot start with `#`. An operator's comment or a
/// trailing space must never become a token that lets someone in.
pub fn parse_token_file(text: &[u8]) -> Vec<Vec<u8>> {
    text.split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .filter(|line| !line.is_empty() && !line.starts_with(b"#"))
        .map(<[u8]>::to_vec)
        .collect()
}

/// Tokens compared without an early exit, so the time taken does not tell an
/// attacker how much of a guess was right. The length still shows through the loop
/// count over the longer input; tokens are secrets of fixed format in practice.
pub fn token_matches(tokens: &[Vec<u8>], offered: &[u8]) -> bool {
    let mut any = 0u8;
    for token in tokens {
        any |= constant_time_eq(token, offered) as u8;
    }
    any == 1
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let n = a.len().max(b.len());
    let mut diff = (a.len() ^ b.len()) as u64;
    for i in 0..n {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= u64::from(x ^ y);
    }
    diff == 0
}

/// An answer ready in its slot: OK or ERR, or a PULL's answer that the broker encodes
/// from the log when the slot reaches the head.
#[derive(Debug)]
pub enum Answer {
    Response(Response),
    Pull(PullAnswer),
}

impl Answer {
    /// What it will add to the output (at most, for a PULL's answer).
    fn bytes(&self) -> usize {
        match self {
            Answer::Response(r) => r.encoded_len(),
            Answer::Pull(a) => a.bytes,
        }
    }
}

/// Encodes a PULL's answer into a connection's output (the broker reads the records).
pub type EncodePull<'a> = &'a mut dyn FnMut(&PullAnswer, &mut Vec<u8>);

enum Slot {
    Waiting,
    Ready(Answer),
}

/// The response slots of one connection, oldest first. Slot ids count queued slots
/// only: `head_id` is the id of the oldest, so an id maps to `queue[id - head_id]`.
#[derive(Default)]
pub struct Slots {
    head_id: u64,
    queue: VecDeque<Slot>,
    /// Bytes of the answers ready behind a waiting slot.
    parked_bytes: usize,
}

impl Slots {
    /// The id a request handled now would get if its answer has to wait.
    pub fn next_id(&self) -> u64 {
        self.head_id + self.queue.len() as u64
    }

    /// Unanswered requests (for backpressure).
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Bytes of answers that are ready but wait behind an older unanswered request:
    /// output the connection already owes, though not yet encoded.
    pub fn parked_bytes(&self) -> usize {
        self.parked_bytes
    }

    /// Answers the newest request now: straight to `out` unless an older one waits.
    pub fn answer_now(&mut self, response: Response, out: &mut Vec<u8>) {
        if self.queue.is_empty() {
            response.encode(out);
        } else {
            self.park(Answer::Response(response));
        }
    }

    fn park(&mut self, answer: Answer) {
        self.parked_bytes += answer.bytes();
        self.queue.push_back(Slot::Ready(answer));
    }

    /// Reserves the slot `next_id()` for an answer that comes later.
    pub fn wait(&mut self) -> u64 {
        self.queue.push_back(Slot::Waiting);
        self.next_id() - 1
    }

    /// Fills a waiting slot, then writes every answer that is now at the head (a PULL's
    /// through `encode_pull`). Returns false if the slot is unknown (already answered:
    /// a broker bug).
    pub fn fill(
        &mut self,
        id: u64,
        answer: Answer,
        out: &mut Vec<u8>,
        encode_pull: EncodePull<'_>,
    ) -> bool {
        let Some(index) = id.checked_sub(self.head_id) else {
            return false;
        };
        match self.queue.get_mut(index as usize) {
            Some(slot @ Slot::Waiting) => {
                self.parked_bytes += answer.bytes();
                *slot = Slot::Ready(answer);
            }
            _ => return false,
        }
        while let Some(Slot::Ready(_)) = self.queue.front() {
            let Some(Slot::Ready(answer)) = self.queue.pop_front() else {
                break;
            };
            self.parked_bytes -= answer.bytes();
            match answer {
                Answer::Response(response) => response.encode(out),
                Answer::Pull(pull) => encode_pull(&pull, out),
            }
            self.head_id += 1;
        }
        if self.queue.is_empty() && self.queue.capacity() > SLOTS_IDLE_CAPACITY_MAX {
            self.queue = VecDeque::new();
        }
        true
    }

    /// Slots are answered in order: the oldest is never one already answered, and
    /// `parked_bytes` is what the ready ones hold.
    pub fn check_invariants(&self) {
        assert!(
            !matches!(self.queue.front(), Some(Slot::Ready(_))),
            "a ready response waits at the head of the slots"
        );
        let parked: usize = (self.queue.iter())
            .map(|s| match s {
                Slot::Ready(a) => a.bytes(),
                Slot::Waiting => 0,
            })
            .sum();
        assert_eq!(
            parked, self.parked_bytes,
            "parked bytes are the ready answers'"
        );
    }
}

/// A drained slot queue keeps at most this many entries' capacity, so a burst of
/// pipelining does not pin memory on an idle connection.
const SLOTS_IDLE_CAPACITY_MAX: usize = 16;

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(op: u8) -> Response {
        Response::Ok { request_op: op }
    }

    fn encoded(answers: &[Response]) -> Vec<u8> {
        let mut out = Vec::new();
        for a in answers {
            a.encode(&mut out);
        }
        out
    }

    fn no_pulls(_: &PullAnswer, _: &mut Vec<u8>) {
        unreachable!("no PULL answers here")
    }

    #[test]
    fn answers_leave_in_request_order_even_when_filled_out_of_order() {
        let mut slots = Slots::default();
        let mut out = Vec::new();
        let a = slots.wait();
        slots.answer_now(ok(7), &mut out);
        let b = slots.wait();
        assert!(out.is_empty(), "nothing passes a waiting slot");
        assert!(slots.fill(b, Answer::Response(ok(3)), &mut out, &mut no_pulls));
        assert!(out.is_empty());
        assert_eq!(slots.parked_bytes(), 2 * ok(3).encoded_len());
        slots.check_invariants();
        assert!(slots.fill(a, Answer::Response(ok(2)), &mut out, &mut no_pulls));
        assert_eq!(out, encoded(&[ok(2), ok(7), ok(3)]));
        assert!(slots.is_empty());
        assert_eq!(slots.parked_bytes(), 0);
        let again = slots.fill(a, Answer::Response(ok(2)), &mut out, &mut no_pulls);
        assert!(!again, "a slot is answered once");
        slots.answer_now(ok(1), &mut out);
        assert_eq!(out, encoded(&[ok(2), ok(7), ok(3), ok(1)]));
    }

    #[test]
    fn a_parked_pull_answer_counts_its_bytes_until_it_is_encoded_in_its_turn() {
        let mut slots = Slots::default();
        let mut out = Vec::new();
        let head = slots.wait();
        let pull = slots.wait();
        let answer = PullAnswer {
            deliveries: Vec::new(),
            bytes: 1_000_000,
        };
        let mut encoded_pulls = 0;
        let mut encode = |a: &PullAnswer, out: &mut Vec<u8>| {
            encoded_pulls += 1;
            out.extend_from_slice(&[0xAB; 3]);
            assert_eq!(a.bytes, 1_000_000);
        };
        assert!(slots.fill(pull, Answer::Pull(answer), &mut out, &mut encode));
        assert!(out.is_empty(), "the PULL waits behind the head");
        assert_eq!(slots.parked_bytes(), 1_000_000);
        slots.check_invariants();
        assert!(slots.fill(head, Answer::Response(ok(7)), &mut out, &mut encode));
        assert_eq!(encoded_pulls, 1);
        assert_eq!(slots.parked_bytes(), 0);
        let mut expected = encoded(&[ok(7)]);
        expected.extend_from_slice(&[0xAB; 3]);
        assert_eq!(
            out, expected,
            "encoded in its turn, straight into the output"
        );
    }

    fn session() -> Session {
        Session::new(SocketAddr::from(([127, 0, 0, 1], 1)))
    }

    const CONN: ConnRef = ConnRef { id: 0, serial: 1 };

    fn connect_frame(version: u8, token: &[u8]) -> Connect<'_> {
        Connect {
            protocol_version: version,
            token,
            ..Connect::default()
        }
    }

    #[test]
    fn the_gate_follows_the_check_order() {
        let fresh = session();
        let zeros = [0u8; 64];
        assert_eq!(fresh.admit(0x07, &[]), Admit::Request(Request::Ping));
        assert!(matches!(
            fresh.admit(0x01, &zeros),
            Admit::Request(Request::Connect(_))
        ));
        assert!(matches!(fresh.admit(0x08, &zeros), Admit::Ignore(_)));
        // Before CONNECT, even a reserved op is NOT_CONNECTED (checked first).
        assert!(matches!(
            fresh.admit(0x10, &[]),
            Admit::Refuse(ErrorCode::NotConnected, _)
        ));
        assert!(matches!(
            fresh.admit(0x03, &zeros),
            Admit::Refuse(ErrorCode::NotConnected, _)
        ));
        let mut on = session();
        assert_eq!(
            on.connect(&connect_frame(1, b""), None, CONN),
            Response::ok(Op::Connect)
        );
        assert!(matches!(
            on.admit(0x10, &[]),
            Admit::Refuse(ErrorCode::UnknownOp, _)
        ));
        assert!(matches!(
            on.admit(0x09, &[]),
            Admit::Refuse(ErrorCode::UnexpectedOp, _)
        ));
        assert!(matches!(
            on.admit(0x0A, &[]),
            Admit::Refuse(ErrorCode::UnexpectedOp, _)
        ));
        assert!(matches!(
            on.admit(0x03, &[0, 1]),
            Admit::Refuse(ErrorCode::MalformedPayload, _)
        ));
        assert!(matches!(
            on.admit(0x03, &zeros),
            Admit::Request(Request::Pub(_))
        ));
        assert_eq!(fresh.frame_len_max(), PREAUTH_FRAME_LEN_MAX_BYTES);
        assert_eq!(on.frame_len_max(), MAX_FRAME_LEN_BYTES);
    }

    #[test]
    fn connect_checks_version_then_token_once() {
        let tokens = [b"s3cret".to_vec()];
        let mut s = session();
        let code = |r: Response| r.error_code();
        assert_eq!(
            code(s.connect(&connect_frame(2, b"s3cret"), Some(&tokens), CONN)),
            Some(ErrorCode::UnsupportedVersion)
        );
        assert_eq!(
            code(s.connect(&connect_frame(1, b"guess"), Some(&tokens), CONN)),
            Some(ErrorCode::AuthFailed)
        );
        assert!(!s.is_connected());
        assert_eq!(
            code(s.connect(&connect_frame(1, b"s3cret"), Some(&tokens), CONN)),
            None
        );
        assert!(s.is_connected());
        assert_eq!(
            code(s.connect(&connect_frame(1, b"s3cret"), Some(&tokens), CONN)),
            Some(ErrorCode::AlreadyConnected)
        );
    }

    #[test]
    fn failed_connects_wait_longer_each_time_up_to_the_cap() {
        let mut f = AuthFailures::default();
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let delays: Vec<u64> = (0..4).map(|_| f.failed(ip, 1_000)).collect();
        assert_eq!(delays, vec![0, 100, 200, 300]);
        for _ in 0..100 {
            f.failed(ip, 1_000);
        }
        assert_eq!(f.failed(ip, 1_000), AUTH_FAILURE_DELAY_MAX_MS);
        // Another address starts afresh; the same one is forgotten after a quiet spell.
        assert_eq!(f.failed("10.0.0.2".parse().unwrap(), 1_000), 0);
        let later = 1_000 + AUTH_FAILURES_FORGET_MS + 1;
        assert_eq!(f.failed(ip, later), 0);
        f.expire(later + AUTH_FAILURES_FORGET_MS);
        assert_eq!(f.addresses(), 1);
    }

    #[test]
    fn ipv6_peers_count_by_their_64_and_mapped_ipv4_as_ipv4() {
        let mut f = AuthFailures::default();
        assert_eq!(f.failed("2001:db8::1".parse().unwrap(), 0), 0);
        assert_eq!(f.failed("2001:db8::ffff:2".parse().unwrap(), 0), 100);
        assert_eq!(f.failed("2001:db8:0:1::1".parse().unwrap(), 0), 0);
        assert_eq!(f.failed("192.0.2.7".parse().unwrap(), 0), 0);
        assert_eq!(f.failed("::ffff:192.0.2.7".parse().unwrap(), 0), 100);
    }

    #[test]
    fn past_the_address_cap_new_addresses_share_one_count() {
        let mut f = AuthFailures::default();
        for i in 0..AUTH_FAILURE_ADDRESSES_MAX as u32 {
            f.failed(IpAddr::from(i.to_be_bytes()), 0);
        }
        let (a, b) = (
            "203.0.113.1".parse().unwrap(),
            "203.0.113.2".parse().unwrap(),
        );
        assert_eq!(f.failed(a, 0), 0);
        assert_eq!(
            f.failed(b, 0),
            100,
            "a fresh address does not get a fresh count"
        );
        assert_eq!(f.addresses(), AUTH_FAILURE_ADDRESSES_MAX);
    }

    #[test]
    fn token_files_skip_comments_and_blank_lines_and_trim_whitespace() {
        let text = b"# deploy tokens\n\n  s3cret  \r\n\t# old: hunter2\nhunter3\t\n \r\nlast";
        let tokens = parse_token_file(text);
        assert_eq!(
            tokens,
            vec![b"s3cret".to_vec(), b"hunter3".to_vec(), b"last".to_vec()]
        );
        assert!(parse_token_file(b"").is_empty());
        assert!(parse_token_file(b"# only a comment\n\n").is_empty());
        // Inner whitespace belongs to the token; bytes need not be UTF-8.
        assert_eq!(parse_token_file(b"a b\xff\n"), vec![b"a b\xff".to_vec()]);
    }

    #[test]
    fn tokens_match_exactly() {
        let tokens = vec![b"s3cret".to_vec(), b"other".to_vec()];
        assert!(token_matches(&tokens, b"s3cret"));
        assert!(token_matches(&tokens, b"other"));
        assert!(!token_matches(&tokens, b"s3cre"));
        assert!(!token_matches(&tokens, b"s3cret!"));
        assert!(!token_matches(&tokens, b""));
        assert!(!token_matches(&[], b"x"));
    }
}
