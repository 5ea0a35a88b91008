//! The write half of a consumer's connection, shared by the thread that polls, the
//! [`Message`](super::Message)s it handed out (their ACKs and NACKs) and the heartbeat
//! thread.
//!
//! Answers come strictly in request order, so every write appends, under one lock, both
//! the frame and what its answer will be ([`Owed`]); the polling thread, the only
//! reader, pops that list as answers arrive.

use std::collections::VecDeque;
use std::io::Write;
use std::net::TcpStream;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wire::ops::{Frame, Heartbeat, SubResult};
use crate::wire::HeartbeatState;

/// Queued ACKs and NACKs are written once this many bytes wait, even while the
/// application keeps polling messages that were already read.
const SETTLE_BATCH_BYTES: usize = 16 * 1024;

/// The request an answer still owed belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Owed {
    Ack,
    Nack,
    ControlAck,
    Heartbeat,
    Pull,
    Credit,
}

/// One connection's worth of shared state; replaced as a whole on a rejoin.
pub(super) struct LinkState {
    stream: Option<TcpStream>,
    out: Vec<u8>,
    owed: VecDeque<Owed>,
    /// One per connection: a Message of an older one settles nothing.
    pub gen: u64,
    /// A write failed, or the member was expelled: the poller joins again.
    pub broken: bool,
    last_send: Instant,
    /// What a HEARTBEAT names, once subscribed.
    member: Option<SubResult>,
    pub assignment_epoch: u32,
}

pub(super) struct Link {
    state: Mutex<LinkState>,
}

impl Link {
    pub fn new() -> Link {
        Link {
            state: Mutex::new(LinkState {
                stream: None,
                out: Vec::new(),
                owed: VecDeque::new(),
                gen: 0,
                broken: false,
                last_send: Instant::now(),
                member: None,
                assignment_epoch: 0,
            }),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, LinkState> {
        // A panic in a rebalance callback must not take the ACK path down with it.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl LinkState {
    /// A new connection for the member `member`: what was owed on the old one is moot.
    pub fn install(&mut self, stream: TcpStream, member: SubResult) -> u64 {
        self.stream = Some(stream);
        self.out.clear();
        self.owed.clear();
        self.gen += 1;
        self.broken = false;
        self.last_send = Instant::now();
        self.member = Some(member);
        self.assignment_epoch = member.assignment_epoch;
        self.gen
    }

    pub fn disconnect(&mut self) {
        self.stream = None;
        self.out.clear();
        self.owed.clear();
        self.member = None;
    }

    pub fn alive(&self) -> bool {
        self.stream.is_some() && !self.broken
    }

    /// Queues one request (of connection `gen`, when given) and writes the queue unless
    /// `batch`. `false`: that connection is gone, nothing was queued.
    pub fn request(
        &mut self,
        frame: &Frame<'_>,
        owed: Owed,
        gen: Option<u64>,
        batch: bool,
    ) -> bool {
        if !self.alive() || gen.is_some_and(|g| g != self.gen) {
            return false;
        }
        frame.encode(&mut self.out);
        self.owed.push_back(owed);
        if !batch || self.out.len() >= SETTLE_BATCH_BYTES {
            self.write_out();
        }
        true
    }

    /// Writes what is queued; a failure marks the link broken.
    pub fn write_out(&mut self) {
        if self.out.is_empty() {
            return;
        }
        if let Some(stream) = self.stream.as_mut() {
            if stream.write_all(&self.out).is_err() {
                self.broken = true;
            }
            self.last_send = Instant::now();
        }
        self.out.clear();
    }

    pub fn pop_owed(&mut self) -> Option<Owed> {
        self.owed.pop_front()
    }

    /// Answers still owed, a PULL's aside (it may wait on the broker by design).
    pub fn owed_settles(&self) -> usize {
        self.owed.iter().filter(|o| **o != Owed::Pull).count()
    }

    pub fn owes_anything(&self) -> bool {
        !self.owed.is_empty()
    }

    pub fn heartbeat(&mut self, state: HeartbeatState) -> bool {
        let Some(m) = self.member else {
            return false;
        };
        let hb = Frame::Heartbeat(Heartbeat {
            subscription_id: m.subscription_id,
            member_id: m.member_id,
            membership_epoch: m.membership_epoch,
            assignment_epoch: self.assignment_epoch,
            state: state.as_code(),
        });
        self.request(&hb, Owed::Heartbeat, None, false)
    }
}

/// The heartbeat thread: while the application is busy between polls it keeps the
/// member in its group (HEARTBEAT after a quiet `interval`) and writes the ACKs it
/// queued. It only writes; it ends when the returned sender is dropped.
pub(super) fn spawn_heartbeat(
    link: Arc<Link>,
    interval: Duration,
) -> std::io::Result<(Sender<()>, JoinHandle<()>)> {
    let (stop, stopped) = mpsc::channel::<()>();
    let tick = interval / 3;
    let thread = std::thread::Builder::new()
        .name("mortarmq-heartbeat".into())
        .spawn(move || loop {
            match stopped.recv_timeout(tick) {
                Err(RecvTimeoutError::Timeout) => {}
                _ => return,
            }
            let mut s = link.lock();
            if !s.alive() {
                continue;
            }
            if s.last_send.elapsed() >= interval {
                s.heartbeat(HeartbeatState::Active);
            } else {
                s.write_out();
            }
        })?;
    Ok((stop, thread))
}
