//! The consumer: a member of a consumer group (`man/mortarmq.7`, CONSUMER GROUPS). Its
//! public face ([`Consumer`], [`Message`], [`Rebalance`]) is here; the group protocol in
//! `member.rs`, the connection's shared write half and the heartbeat thread in
//! `link.rs`.

mod link;
mod member;

use std::collections::{BTreeMap, VecDeque};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::mpsc::Sender;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::wire::ops::{Ack, CreditResult, DeliveryRef, Frame, Nack, Notice, SubResult};
use crate::wire::{AckFlags, NackReason, OriginReason, StartPolicy};

use super::brokers::{Brokers, Route};
use super::bytes::Bytes;
use super::conn::{Conn, DEFAULT_TIMEOUT};
use super::error::{Error, Result};
use super::producer::resolve_addrs;
use super::topics::TopicInfo;
use link::{Link, Owed};

/// A HEARTBEAT goes after this much quiet: a tenth of the broker's default 30 s
/// `--session-timeout`.
pub const DEFAULT_HEARTBEAT_INTERVAL: Duration = Duration::from_secs(3);
/// How long `poll` keeps trying to join again after a lost connection.
pub const DEFAULT_RECONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A rebalance, as the consumer's callback sees it: before the broker is told, so the
/// application can finish or commit its work for the partition first.
///
/// ```no_run
/// use std::collections::BTreeMap;
/// use std::sync::{Arc, Mutex};
/// use mortarmq::client::{Consumer, Rebalance, StartPolicy};
///
/// // Work done per partition, to commit before a partition moves on.
/// let done: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::default();
/// let on_rebalance = {
///     let done = done.clone();
///     move |r: Rebalance| match r {
///         Rebalance::Assigned(p) => println!("partition {p} is ours"),
///         Rebalance::Revoked(p) | Rebalance::Lost(p) => {
///             let n = done.lock().unwrap().remove(&p).unwrap_or(0);
///             println!("commit {n} records of partition {p}");
///         }
///     }
/// };
/// let mut consumer = Consumer::builder("127.0.0.1:7411")
///     .on_rebalance(on_rebalance)
///     .connect()?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// for m in &mut consumer {
///     let m = m?;
///     *done.lock().unwrap().entry(m.partition).or_default() += 1;
///     m.ack();
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Rebalance {
    /// This member now owns the partition; its messages follow.
    Assigned(u16),
    /// The broker takes the partition back; messages of it not yet settled go to the
    /// next owner, and their ACKs will be fenced.
    Revoked(u16),
    /// The connection was lost (or the member expelled): the partition is no longer
    /// this member's, and nobody was asked.
    Lost(u16),
}

/// Where a dead letter came from: the MSG's origin trailer, with the source topic's
/// name when it is the consumer's (`orders` for a consumer of `orders.dlq`).
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Consumer, OriginReason, StartPolicy};
///
/// let mut dead = Consumer::connect("127.0.0.1:7411")?;
/// dead.subscribe("replayer", "orders.dlq", StartPolicy::Earliest)?;
/// while let Some(m) = dead.poll(Some(Duration::from_secs(1)))? {
///     if let Some(o) = &m.origin {
///         let why = match o.reason {
///             Some(OriginReason::Rejected) => "rejected",
///             Some(OriginReason::MaxAttempts) => "out of attempts",
///             None => "for a reason this client does not know",
///         };
///         let (p, s, n) = (o.partition, o.sequence, o.attempts);
///         println!("{:?} {p}/{s} dead {why} after {n} attempts", o.topic);
///     }
///     m.ack();
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterOrigin {
    pub topic_id: u16,
    pub topic: Option<Arc<str>>,
    pub partition: u16,
    pub sequence: u64,
    /// Deliveries made before it was dead-lettered.
    pub attempts: u16,
    /// `None`: a reason code this client does not know.
    pub reason: Option<OriginReason>,
}

/// One delivery of one record. Settle it with exactly one of [`ack`](Self::ack),
/// [`nack_retry`](Self::nack_retry) or [`reject`](Self::reject) (each consumes the
/// message); [`progress`](Self::progress) only extends the broker's ack-wait. Each
/// returns `false`, sending nothing, when the connection it came on is gone: the
/// broker delivers the record again.
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Consumer, StartPolicy};
///
/// let mut consumer = Consumer::connect("127.0.0.1:7411")?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// if let Some(m) = consumer.poll(Some(Duration::from_secs(5)))? {
///     println!("{} {} {} attempt {}", m.topic, m.partition, m.sequence, m.attempt);
///     match std::str::from_utf8(&m.value) {
///         Ok(_) => m.ack(),
///         Err(_) => m.reject(), // to orders.dlq, with an origin
///     };
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub struct Message {
    pub topic: Arc<str>,
    pub partition: u16,
    pub sequence: u64,
    /// 1 for the first delivery.
    pub attempt: u16,
    /// Shared with the read buffer ([`Bytes`]): derefs to `[u8]`.
    pub key: Bytes,
    pub value: Bytes,
    /// Set on a message read from a `.dlq` twin.
    pub origin: Option<DeadLetterOrigin>,
    pub producer_id: u64,
    pub producer_seq: u64,
    link: Arc<Link>,
    gen: u64,
    delivery: DeliveryRef,
}

impl Message {
    /// Settles the delivery: the group's position may move past it.
    pub fn ack(self) -> bool {
        self.settle(&Frame::Ack(self.delivery.ack(AckFlags::empty())), Owed::Ack)
    }

    /// Refuses it for now: delivered again (attempt + 1) after the broker's
    /// `--nack-delay`, and dead-lettered once it fails its last attempt.
    pub fn nack_retry(self) -> bool {
        self.nack(NackReason::Retry)
    }

    /// Dead-letters it now: to the topic's `.dlq` twin, with an origin.
    pub fn reject(self) -> bool {
        self.nack(NackReason::Reject)
    }

    /// Still working on it: restarts its ack-wait without settling it. Sent at once.
    pub fn progress(&self) -> bool {
        let ack: Ack = self.delivery.ack(AckFlags::PROGRESS);
        self.link
            .lock()
            .request(&Frame::Ack(ack), Owed::Ack, Some(self.gen), false)
    }

    fn nack(self, reason: NackReason) -> bool {
        let nack: Nack = self.delivery.nack(reason);
        self.settle(&Frame::Nack(nack), Owed::Nack)
    }

    fn settle(&self, frame: &Frame<'_>, owed: Owed) -> bool {
        self.link.lock().request(frame, owed, Some(self.gen), true)
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("topic", &self.topic)
            .field("partition", &self.partition)
            .field("sequence", &self.sequence)
            .field("attempt", &self.attempt)
            .field("key", &String::from_utf8_lossy(&self.key))
            .field("value_len", &self.value.len())
            .field("origin", &self.origin)
            .finish()
    }
}

/// Counters of what the consumer did behind the caller's back.
///
/// ```no_run
/// use mortarmq::client::{Consumer, StartPolicy};
///
/// let mut consumer = Consumer::connect("127.0.0.1:7411")?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// // … poll for a while …
/// let stats = consumer.stats();
/// println!("{} rejoins, {} stale answers dropped", stats.rejoins, stats.ignored_errors);
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Joins after a lost connection or an expulsion.
    pub rejoins: u64,
    /// Answers dropped as the registry advises (OWNERSHIP_FENCED, UNKNOWN_DELIVERY,
    /// UNKNOWN_NOTICE, a PULL's STALE_EPOCH).
    pub ignored_errors: u64,
}

type RebalanceCallback = Box<dyn FnMut(Rebalance) + Send>;

/// Settings of a [`Consumer`]: [`Consumer::builder`], then [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Consumer, Rebalance};
///
/// let consumer = Consumer::builder("127.0.0.1:7411")
///     .credit(64, 0) // at most 64 unsettled deliveries; 0: the broker's byte window
///     .pull(true)
///     .heartbeat_interval(Duration::from_secs(1))
///     .on_rebalance(|r| if let Rebalance::Revoked(p) = r {
///         println!("commit my work for partition {p} now");
///     })
///     .connect()?;
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub struct ConsumerBuilder {
    addrs: std::result::Result<Vec<SocketAddr>, String>,
    settings: Settings,
    on_rebalance: Option<RebalanceCallback>,
}

#[derive(Debug, Clone)]
struct Settings {
    token: Vec<u8>,
    timeout: Duration,
    reconnect_timeout: Option<Duration>,
    heartbeat_interval: Duration,
    credit_count: u16,
    credit_bytes: u32,
    pull: bool,
}

impl ConsumerBuilder {
    /// The CONNECT token (default: empty).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.settings.token = token.as_ref().to_vec();
        self
    }

    /// How long connecting and each awaited answer may take ([`DEFAULT_TIMEOUT`]).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// How long `poll` tries to join again after a loss ([`DEFAULT_RECONNECT_TIMEOUT`];
    /// `None`: for ever).
    pub fn reconnect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.settings.reconnect_timeout = timeout;
        self
    }

    /// Quiet time after which the helper thread sends HEARTBEAT
    /// ([`DEFAULT_HEARTBEAT_INTERVAL`]); keep it well under the broker's
    /// `--session-timeout`.
    pub fn heartbeat_interval(mut self, interval: Duration) -> Self {
        self.settings.heartbeat_interval = interval.max(Duration::from_millis(3));
        self
    }

    /// The window of unsettled deliveries: records and bytes (0: the broker's default,
    /// 256 records and 2 MiB).
    pub fn credit(mut self, records: u16, bytes: u32) -> Self {
        self.settings.credit_count = records;
        self.settings.credit_bytes = bytes;
        self
    }

    /// Ask for messages with PULL instead of having them pushed.
    pub fn pull(mut self, pull: bool) -> Self {
        self.settings.pull = pull;
        self
    }

    /// Called from [`Consumer::poll`] on every assignment change of this member, before
    /// the broker is told (see [`Rebalance`]).
    pub fn on_rebalance(mut self, callback: impl FnMut(Rebalance) + Send + 'static) -> Self {
        self.on_rebalance = Some(Box::new(callback));
        self
    }

    /// Connects and authenticates; [`Consumer::subscribe`] joins a group.
    pub fn connect(self) -> Result<Consumer> {
        let addrs = self.addrs.map_err(Error::InvalidInput)?;
        let mut brokers = Brokers::new(addrs);
        let conn = Conn::open_to(&mut brokers, &self.settings.token, self.settings.timeout)?;
        let link = Arc::new(Link::new());
        let heartbeat = link::spawn_heartbeat(link.clone(), self.settings.heartbeat_interval)?;
        Ok(Consumer {
            brokers,
            reroute: None,
            settings: self.settings,
            on_rebalance: self.on_rebalance,
            link,
            conn: Some(conn),
            gen: 0,
            sub: None,
            member: None,
            held: BTreeMap::new(),
            ready: VecDeque::new(),
            notices: VecDeque::new(),
            errors: VecDeque::new(),
            pulling: false,
            credit_answer: None,
            heartbeat: Some(heartbeat),
            closed: false,
            stats: ConsumerStats::default(),
        })
    }
}

/// What `subscribe` asked for, kept to join again.
struct Subscription {
    group: Vec<u8>,
    topic: Arc<str>,
    start: StartPolicy,
    /// The source's name for a `.dlq` twin, to name dead letters' origins.
    source: Option<Arc<str>>,
    resolved: Option<TopicInfo>,
}

/// A member of a consumer group: [`subscribe`](Self::subscribe), then
/// [`poll`](Self::poll) or iterate ([`iter`](Self::iter), `for m in &mut consumer`).
///
/// The broker hands partitions out with NOTICE ASSIGN and takes them back with NOTICE
/// REVOKE; each is answered with a CONTROL_ACK echoing its id, kind and epochs, after
/// the application's [`Rebalance`] callback ran, and MSGs of a partition flow only
/// after its ASSIGN is acknowledged. Every MSG carries the ownership_epoch of its
/// partition, echoed in its ACK or NACK, so a settle for a partition that has moved is
/// fenced (OWNERSHIP_FENCED, which the consumer drops: the new owner gets the record).
/// Credit is a window of unsettled deliveries: settling one lets the next flow, so ACKs
/// are written in batches but never held back. In PULL mode the consumer asks with
/// PULL (naming the ownership epochs it holds) instead of being pushed to.
///
/// A member silent longer than the broker's session timeout is expelled, so a helper
/// thread (`mortarmq-heartbeat`, one per consumer) sends HEARTBEAT while the
/// application is busy between polls, and writes its queued ACKs. It only writes; the
/// connection is read only by the thread that calls [`Consumer::poll`]. After a lost
/// connection or an expulsion, `poll` connects and joins again: every partition is
/// [`Rebalance::Lost`], and the broker delivers what was not settled again. In a
/// cluster it joins on the leader: NOT_LEADER (at SUB or later) sends it to the leader
/// named, and while none is known it backs off and tries the other addresses it was
/// given, within the reconnect timeout.
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Consumer, StartPolicy};
///
/// let mut consumer = Consumer::connect("127.0.0.1:7411")?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// while let Some(m) = consumer.poll(Some(Duration::from_secs(2)))? {
///     println!("{} {} {:?}", m.partition, m.sequence, String::from_utf8_lossy(&m.value));
///     m.ack(); // or m.nack_retry(), m.reject() (dead-letter it); m.progress() extends
/// }
/// consumer.close()?; // answers awaited, then HEARTBEAT LEAVE: the group rebalances now
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub struct Consumer {
    /// The brokers given and learnt (NOT_LEADER), and which to dial next.
    brokers: Brokers,
    /// Where the ERR that broke the connection said to go, for the next join.
    reroute: Option<Route>,
    settings: Settings,
    on_rebalance: Option<RebalanceCallback>,
    link: Arc<Link>,
    /// The read half; `None` between a loss and the next join.
    conn: Option<Conn>,
    /// The link's connection generation, stamped on each Message.
    gen: u64,
    sub: Option<Subscription>,
    member: Option<SubResult>,
    /// Partition → ownership epoch, for every partition this member holds.
    held: BTreeMap<u16, u64>,
    ready: VecDeque<Message>,
    notices: VecDeque<Notice>,
    errors: VecDeque<Error>,
    pulling: bool,
    credit_answer: Option<Result<CreditResult>>,
    heartbeat: Option<(Sender<()>, JoinHandle<()>)>,
    closed: bool,
    stats: ConsumerStats,
}

impl Consumer {
    /// A consumer with the default settings, connected and not yet subscribed.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Consumer> {
        Consumer::builder(addr).connect()
    }

    /// Settings first; [`ConsumerBuilder::connect`] connects. Every address `addr`
    /// resolves to is a broker to try: for a cluster, a slice of its nodes' addresses
    /// (see [`resolve_brokers`](super::resolve_brokers)).
    pub fn builder(addr: impl ToSocketAddrs) -> ConsumerBuilder {
        ConsumerBuilder {
            addrs: resolve_addrs(addr),
            settings: Settings {
                token: Vec::new(),
                timeout: DEFAULT_TIMEOUT,
                reconnect_timeout: Some(DEFAULT_RECONNECT_TIMEOUT),
                heartbeat_interval: DEFAULT_HEARTBEAT_INTERVAL,
                credit_count: 0,
                credit_bytes: 0,
                pull: false,
            },
            on_rebalance: None,
        }
    }

    /// Joins `group` on `topic` (a `.dlq` name reads its source's dead letters).
    /// `start` is where the group begins on a partition it has no committed position
    /// for. One subscription per consumer.
    pub fn subscribe(&mut self, group: &str, topic: &str, start: StartPolicy) -> Result<()> {
        if self.sub.is_some() {
            return Err(Error::InvalidInput(
                "this consumer is already subscribed (one subscription per consumer)".into(),
            ));
        }
        let source = topic.strip_suffix(crate::wire::DLQ_SUFFIX).map(Arc::from);
        self.sub = Some(Subscription {
            group: group.as_bytes().to_vec(),
            topic: Arc::from(topic),
            start,
            source,
            resolved: None,
        });
        let joined = self.join(false);
        if joined.is_err() {
            self.sub = None;
        }
        joined
    }

    /// The next message, or `None` when `timeout` passes without one (`None`: wait for
    /// one). Rebalance callbacks run here, and a lost connection is joined again here.
    pub fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Message>> {
        // Read the clock only when there is nothing to hand out at once.
        let mut deadline = None;
        loop {
            if let Some(e) = self.errors.pop_front() {
                return Err(e);
            }
            if self.closed {
                return Ok(None);
            }
            if !self.notices.is_empty() && self.link.lock().alive() {
                // Before handing out more: a REVOKE takes back the partition's waiting
                // messages, and the broker waits for its answer to move it.
                self.answer_notice();
                continue;
            }
            if let Some(m) = self.ready.pop_front() {
                return Ok(Some(m));
            }
            if self.sub.is_none() {
                return Err(Error::InvalidInput("poll before subscribe".into()));
            }
            if !self.link.lock().alive() {
                self.rejoin()?;
                continue;
            }
            if deadline.is_none() {
                deadline = Some(timeout.map(|t| Instant::now() + t));
            }
            let deadline = deadline.flatten();
            self.pull_if_idle(deadline);
            let got = self.read(deadline);
            if !got && deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    /// An endless iterator of messages ([`poll`](Self::poll) without a timeout); it ends
    /// after yielding an error.
    pub fn iter(&mut self) -> Messages<'_> {
        Messages {
            consumer: self,
            done: false,
        }
    }

    /// Waits until the broker answered every ACK, NACK and CONTROL_ACK sent so far:
    /// `true`, or `false` when the connection was lost first (what was not settled is
    /// delivered again). Messages that arrive meanwhile are kept for `poll`.
    pub fn flush(&mut self, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.errors.pop_front() {
                return Err(e);
            }
            {
                let mut link = self.link.lock();
                link.write_out();
                if !link.alive() {
                    return Ok(false);
                }
                if link.owed_settles() == 0 {
                    return Ok(true);
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout(format!(
                    "answers still owed after {timeout:?}"
                )));
            }
            self.read(Some(deadline));
        }
    }

    /// Resizes the window of unsettled deliveries (CREDIT SET; 0 keeps a dimension)
    /// and returns what the broker granted. CREDIT_LIMIT above the broker's cap.
    pub fn set_credit(&mut self, records: u16, bytes: u32) -> Result<CreditResult> {
        let granted = self.credit_request(records, bytes)?;
        self.settings.credit_count = granted.granted_count;
        self.settings.credit_bytes = granted.granted_bytes;
        Ok(granted)
    }

    /// The partitions this member holds now.
    pub fn assignment(&self) -> Vec<u16> {
        self.held.keys().copied().collect()
    }

    pub fn stats(&self) -> ConsumerStats {
        self.stats
    }

    /// Waits for the answers owed (up to the timeout), leaves the group (HEARTBEAT
    /// LEAVE, so it rebalances at once) and closes the connection. Messages not
    /// settled go to the other members. Dropping a consumer does the same.
    pub fn close(mut self) -> Result<()> {
        self.shut()
    }

    fn shut(&mut self) -> Result<()> {
        if self.closed {
            return Ok(());
        }
        let alive = self.link.lock().alive();
        let flushed = match alive {
            true => self.flush(self.settings.timeout).map(|_| ()),
            false => Ok(()),
        };
        self.closed = true;
        self.leave();
        self.drop_connection();
        if let Some((stop, thread)) = self.heartbeat.take() {
            drop(stop);
            let _ = thread.join();
        }
        flushed
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.shut();
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("brokers", &self.brokers.order())
            .field("topic", &self.sub.as_ref().map(|s| s.topic.clone()))
            .field("member", &self.member.map(|m| m.member_id))
            .field("assignment", &self.assignment())
            .field("ready", &self.ready.len())
            .field("stats", &self.stats)
            .finish()
    }
}

/// [`Consumer::iter`]: `Result<Message>` until the first error.
///
/// ```no_run
/// use mortarmq::client::{Consumer, StartPolicy};
///
/// let mut consumer = Consumer::connect("127.0.0.1:7411")?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// for m in consumer.iter().take(10) {
///     let m = m?; // the iterator ends after an error it yields
///     m.ack();
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub struct Messages<'a> {
    consumer: &'a mut Consumer,
    done: bool,
}

impl Iterator for Messages<'_> {
    type Item = Result<Message>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.consumer.poll(None) {
            Ok(Some(m)) => Some(Ok(m)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl<'a> IntoIterator for &'a mut Consumer {
    type Item = Result<Message>;
    type IntoIter = Messages<'a>;

    fn into_iter(self) -> Messages<'a> {
        self.iter()
    }
}
