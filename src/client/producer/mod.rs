//! The producer: its public face ([`Producer`], [`SendHandle`], [`Receipt`]) is here;
//! what happens to each record in `pipeline.rs`, the encoded records in flight in
//! `outbox.rs`, a handle's outcome in `slot.rs`.

mod outbox;
mod pipeline;
mod slot;

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::wire::limits::{DEDUP_WINDOW_SEQS, MAX_KEY_LEN_BYTES, MAX_VALUE_LEN_BYTES};
use crate::wire::ops::{Frame, Message, Pub};
use crate::wire::{Durability, PubFlags};

use super::brokers::{self, Brokers, Route};
use super::conn::{Conn, DEFAULT_TIMEOUT};
use super::error::{Error, Result};
use super::topics::{self, partition_for_key, TopicInfo};

/// How long a record is retried (and the broker looked for after a connection loss)
/// before its handle fails.
pub const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(30);
/// Records sent and not yet answered, at most (the broker's dedup window bounds it).
pub const DEFAULT_MAX_IN_FLIGHT_RECORDS: usize = 256;

/// What the broker answered a publish.
///
/// ```no_run
/// use mortarmq::client::{Durability, Producer};
///
/// let mut producer = Producer::connect("127.0.0.1:7411")?;
/// let r = producer.publish("orders", "k", "v", Durability::Fsynced)?;
/// assert_eq!(r.durability, Durability::Fsynced);
/// if r.deduplicated {
///     println!("a resend: the broker already had it at {}", r.sequence);
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Receipt {
    pub partition: u16,
    /// The record's sequence in its partition (the first record is 1).
    pub sequence: u64,
    /// How far the record was taken when the broker answered.
    pub durability: Durability,
    /// The broker's leader epoch (replication; 0 on a single broker).
    pub leader_epoch: u64,
    /// The partition's highest committed sequence when it answered.
    pub commit_seq: u64,
    /// The record was a resend the broker had already appended: this is the original.
    pub deduplicated: bool,
}

/// The outcome of one [`Producer::send`], filled in when the broker answers (during a
/// later `send`, [`Producer::flush`] or [`Producer::wait`]). Cloneable and `Send`, so
/// another thread may watch it.
///
/// ```no_run
/// use mortarmq::client::Producer;
///
/// let mut producer = Producer::connect("127.0.0.1:7411")?;
/// let handles: Vec<_> = (0..100)
///     .map(|i| producer.send("orders", b"", format!("line {i}"), None))
///     .collect::<Result<_, _>>()?;
/// producer.flush()?;
/// let last = handles[99].result().expect("answered after flush")?;
/// println!("line 99 is at sequence {}", last.sequence);
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct SendHandle {
    slot: Arc<Slot>,
}

use slot::Slot;

impl SendHandle {
    /// Whether the broker has answered (or the record failed for good).
    pub fn is_done(&self) -> bool {
        self.slot.is_done()
    }

    /// The receipt or the error, once done.
    pub fn result(&self) -> Option<Result<Receipt>> {
        self.slot.get()
    }

    fn settle(self, outcome: Result<Receipt>) -> Arc<Slot> {
        self.slot.set(outcome);
        self.slot
    }
}

/// One record to publish, for [`Producer::send_record`]: a topic and a value, and
/// optionally a key, a partition and a durability.
///
/// ```no_run
/// use mortarmq::client::{Durability, Producer, Record};
///
/// let mut producer = Producer::connect("127.0.0.1:7411")?;
/// let record = Record::new("orders", b"{\"total\": 12}")
///     .key(b"customer-42")
///     .partition(3)
///     .durability(Durability::Fsynced);
/// let receipt = producer.publish_record(record)?;
/// assert_eq!(receipt.partition, 3);
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    pub topic: &'a str,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// `None`: the key's partition ([`partition_for_key`]), or 0 without a key.
    pub partition: Option<u16>,
    /// `None`: the producer's default ([`ProducerBuilder::durability`]).
    pub durability: Option<Durability>,
}

impl<'a> Record<'a> {
    pub fn new(topic: &'a str, value: &'a [u8]) -> Record<'a> {
        Record {
            topic,
            key: b"",
            value,
            partition: None,
            durability: None,
        }
    }

    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = key;
        self
    }

    pub fn partition(mut self, partition: u16) -> Self {
        self.partition = Some(partition);
        self
    }

    pub fn durability(mut self, durability: Durability) -> Self {
        self.durability = Some(durability);
        self
    }
}

/// Counters of what the producer did for its records.
///
/// ```no_run
/// use mortarmq::client::Producer;
///
/// let mut producer = Producer::connect("127.0.0.1:7411")?;
/// producer.publish("orders", "", "v", None)?;
/// let stats = producer.stats();
/// println!("{} reconnects, {} records resent", stats.reconnects, stats.resent);
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProducerStats {
    /// Connections replaced after a loss.
    pub reconnects: u64,
    /// Records sent again (after an ERR or a connection loss).
    pub resent: u64,
}

/// Settings of a [`Producer`]: [`Producer::builder`], then [`connect`](Self::connect).
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Durability, Producer};
///
/// let producer = Producer::builder("127.0.0.1:7411")
///     .token("s3cret")
///     .durability(Durability::Written)
///     .declare(4) // create missing topics with 4 partitions
///     .max_in_flight(64)
///     .retry_timeout(Duration::from_secs(60))
///     .connect()?;
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct ProducerBuilder {
    addrs: std::result::Result<Vec<SocketAddr>, String>,
    settings: Settings,
}

#[derive(Debug, Clone)]
struct Settings {
    token: Vec<u8>,
    timeout: Duration,
    retry_timeout: Duration,
    durability: Option<Durability>,
    idempotent: bool,
    declare: Option<u16>,
    max_in_flight: usize,
    keepalive: Duration,
}

impl ProducerBuilder {
    /// The CONNECT token (default: empty).
    pub fn token(mut self, token: impl AsRef<[u8]>) -> Self {
        self.settings.token = token.as_ref().to_vec();
        self
    }

    /// How long connecting and each answer may take ([`DEFAULT_TIMEOUT`]); a broker
    /// silent for longer is taken as gone, and the records are resent elsewhere.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.settings.timeout = timeout;
        self
    }

    /// How long a record is retried before it fails ([`DEFAULT_RETRY_TIMEOUT`]).
    pub fn retry_timeout(mut self, timeout: Duration) -> Self {
        self.settings.retry_timeout = timeout;
        self
    }

    /// The durability publishes ask for when they name none (default `None`: the
    /// broker's `--durability`).
    pub fn durability(mut self, durability: impl Into<Option<Durability>>) -> Self {
        self.settings.durability = durability.into();
        self
    }

    /// `false` sends producer_id 0: a resend could then be appended twice, so records
    /// whose outcome a lost connection made unknown fail instead of being resent.
    pub fn idempotent(mut self, idempotent: bool) -> Self {
        self.settings.idempotent = idempotent;
        self
    }

    /// Create a topic that does not exist with `partitions` partitions on first use
    /// (default: a missing topic is an UNKNOWN_TOPIC error).
    pub fn declare(mut self, partitions: u16) -> Self {
        self.settings.declare = Some(partitions);
        self
    }

    /// Records sent and not yet answered, at most ([`DEFAULT_MAX_IN_FLIGHT_RECORDS`],
    /// 1 to 1024: a resend must stay within the broker's dedup window).
    pub fn max_in_flight(mut self, records: usize) -> Self {
        self.settings.max_in_flight = records;
        self
    }

    /// After this long without sending, the producer PINGs before its next record and
    /// from [`keep_alive`](Producer::keep_alive) (default: the protocol's 30 s keepalive,
    /// which the broker's default 45 s `--idle-timeout` allows). A broker with a shorter
    /// `--idle-timeout` wants a shorter one; else it closes a quiet connection, and the
    /// producer connects again when it next has something to send.
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.settings.keepalive = interval;
        self
    }

    /// Connects and authenticates.
    pub fn connect(self) -> Result<Producer> {
        let addrs = self.addrs.map_err(Error::InvalidInput)?;
        let max = self.settings.max_in_flight;
        if !(1..=DEDUP_WINDOW_SEQS as usize).contains(&max) {
            return Err(Error::InvalidInput(format!(
                "max_in_flight {max}: 1 to {DEDUP_WINDOW_SEQS}"
            )));
        }
        let mut brokers = Brokers::new(addrs);
        let conn = Conn::open_to(&mut brokers, &self.settings.token, self.settings.timeout)?;
        let idempotent = self.settings.idempotent;
        Ok(Producer {
            brokers,
            settings: self.settings,
            conn: Some(conn),
            topics: HashMap::default(),
            last_topic: (String::new(), TopicInfo::default()),
            spare_slots: VecDeque::new(),
            outbox: outbox::Outbox::default(),
            now: Instant::now(),
            inflight: VecDeque::new(),
            retry: Vec::new(),
            must_drain: false,
            reroute: None,
            next_seq: Vec::new(),
            producer_id: if idempotent { new_producer_id() } else { 0 },
            order: 0,
            unreported: None,
            stats: ProducerStats::default(),
            closed: false,
        })
    }
}

/// Resolves an address now; a name that does not resolve fails at `connect`.
pub(crate) fn resolve_addrs(
    addr: impl ToSocketAddrs,
) -> std::result::Result<Vec<SocketAddr>, String> {
    match addr.to_socket_addrs() {
        Ok(a) => Ok(a.collect()),
        Err(e) => Err(format!("broker address: {e}")),
    }
}

/// FNV-1a for the producer's maps: they are keyed by the caller's own topic names and
/// ids, looked up for every record, so SipHash's resistance to crafted keys buys nothing
/// and costs a tenth of a publish.
type Fnv = BuildHasherDefault<FnvHasher>;

struct FnvHasher(u64);

impl Default for FnvHasher {
    fn default() -> Self {
        FnvHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for FnvHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// A non-zero 63-bit id, random enough that two producers never share one (ids with the
/// top bit set are the broker's own, for dead letters).
fn new_producer_id() -> u64 {
    use std::collections::hash_map::RandomState;
    use std::hash::{BuildHasher, Hasher};
    let mut h = RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    h.write_u128(now.map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    (h.finish() >> 1).max(1)
}

/// Publishes records to a broker: pipelined, idempotent by default, and carried
/// through retryable errors, lost connections and broker restarts without losing or
/// doubling one.
///
/// Idempotence (`man/mortarmq.7`, PUB): every record carries this producer's random
/// producer_id and a producer_seq that is the partition's last + 1. The broker answers
/// a resend of a (producer_id, producer_seq) it already appended with the original
/// sequence ([`Receipt::deduplicated`]), so a record whose outcome is unknown (a lost
/// connection, INTERNAL_ERROR) is simply resent with the same pair, after a reconnect if
/// need be. What the error registry marks retryable is retried, backing off; a record
/// refused for good leaves a hole in its partition's producer_seqs, so the records
/// behind it (refused SEQUENCE_OUT_OF_ORDER, not appended) are renumbered and resent in
/// their order. A record still unanswered after the retry timeout fails.
///
/// In a cluster (`man/mortarmq.7`, REPLICATION) the producer follows NOT_LEADER to the
/// leader it names, resending what was in flight there with the same producer_seq, and
/// while no leader can serve (LEADER_UNKNOWN, ELECTION_TIMEOUT, NOT_ENOUGH_REPLICAS, …)
/// backs off (50 ms doubling to 2 s) and tries the other addresses it was given; all
/// within the retry timeout.
///
/// Synchronous: every call runs on the caller's thread, and answers are read while
/// the caller is in a `Producer` method. [`send`](Self::send) writes records in
/// batches and returns at once (it waits only while `max_in_flight` records are
/// unanswered); [`publish`](Self::publish) waits for the record's answer;
/// [`flush`](Self::flush) for all of them. Dropping a producer does not wait: records
/// still unanswered fail; call [`close`](Self::close) (or `flush`) first.
///
/// ```no_run
/// use mortarmq::client::{Durability, Producer};
///
/// let mut producer = Producer::builder("127.0.0.1:7411").declare(4).connect()?;
/// let receipt = producer.publish("orders", "customer-42", "{}", Durability::Fsynced)?;
/// println!("partition {} sequence {}", receipt.partition, receipt.sequence);
/// for i in 0..1000 {
///     producer.send("orders", b"", format!("line {i}"), None)?; // pipelined
/// }
/// producer.close()?; // flushes: every record answered, or the first failure
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
pub struct Producer {
    /// The brokers given and learnt (NOT_LEADER), and which to dial next.
    brokers: Brokers,
    settings: Settings,
    conn: Option<Conn>,
    topics: HashMap<String, TopicInfo, Fnv>,
    /// The topic of the latest record: most records go where the one before went.
    last_topic: (String, TopicInfo),
    /// Handles' slots of settled records, oldest first, reused once their callers
    /// dropped them: a send allocates nothing.
    spare_slots: VecDeque<Arc<Slot>>,
    /// The PUBs of the records in flight.
    outbox: outbox::Outbox,
    /// The time of the latest read, close enough to stamp a record's first send
    /// without a clock read per record.
    now: Instant,
    /// Records written and not yet answered, in the order sent.
    inflight: VecDeque<pipeline::Pending>,
    /// Records to send again, answered with a retryable ERR or lost with a connection.
    retry: Vec<pipeline::Pending>,
    /// A hole appeared: new records wait until the ones in flight are answered.
    must_drain: bool,
    /// A broker's ERR said to go elsewhere (NOT_LEADER, LEADER_UNKNOWN, …): done once
    /// the records in flight on this connection are all answered.
    reroute: Option<Route>,
    /// (topic_id, partition) → producer_seq of the next record.
    /// Indexed by topic_id, then partition: two loads per record, no hashing; topic
    /// ids are small (pairs are numbered from 1).
    next_seq: Vec<Vec<u64>>,
    producer_id: u64,
    order: u64,
    /// The first failure of a record nobody waits for, for the next `flush`.
    unreported: Option<Error>,
    stats: ProducerStats,
    closed: bool,
}

impl Producer {
    /// A producer with the default settings.
    pub fn connect(addr: impl ToSocketAddrs) -> Result<Producer> {
        Producer::builder(addr).connect()
    }

    /// Settings first; [`ProducerBuilder::connect`] connects. Every address `addr`
    /// resolves to is a broker to try: for a cluster, a slice of its nodes' addresses
    /// (see [`resolve_brokers`](super::resolve_brokers)), so that the producer can find
    /// the new leader after the old one is gone.
    pub fn builder(addr: impl ToSocketAddrs) -> ProducerBuilder {
        ProducerBuilder {
            addrs: resolve_addrs(addr),
            settings: Settings {
                token: Vec::new(),
                timeout: DEFAULT_TIMEOUT,
                retry_timeout: DEFAULT_RETRY_TIMEOUT,
                durability: None,
                idempotent: true,
                declare: None,
                max_in_flight: DEFAULT_MAX_IN_FLIGHT_RECORDS,
                keepalive: Duration::from_millis(crate::wire::limits::KEEPALIVE_MS),
            },
        }
    }

    /// Publishes one record and waits for its answer: the receipt, or the error it
    /// failed with after the retries the registry allows. `durability` `None` is the
    /// producer's default.
    pub fn publish(
        &mut self,
        topic: &str,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        durability: impl Into<Option<Durability>>,
    ) -> Result<Receipt> {
        let mut record = Record::new(topic, value.as_ref()).key(key.as_ref());
        record.durability = durability.into();
        self.publish_record(record)
    }

    /// [`publish`](Self::publish) with every choice of a [`Record`].
    pub fn publish_record(&mut self, record: Record<'_>) -> Result<Receipt> {
        let handle = self.enqueue(record, true)?;
        self.wait(&handle)
    }

    /// Queues one record and returns its handle at once (pipelined: see
    /// [`SendHandle`]). Queued records are written in one batch when the batch holds
    /// 256 KiB, when `max_in_flight` records are unanswered, or by
    /// [`send_queued`](Self::send_queued), [`flush`](Self::flush), [`wait`](Self::wait)
    /// or [`publish`](Self::publish): call one of those before a pause.
    pub fn send(
        &mut self,
        topic: &str,
        key: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        durability: impl Into<Option<Durability>>,
    ) -> Result<SendHandle> {
        let mut record = Record::new(topic, value.as_ref()).key(key.as_ref());
        record.durability = durability.into();
        self.send_record(record)
    }

    /// [`send`](Self::send) with every choice of a [`Record`].
    pub fn send_record(&mut self, record: Record<'_>) -> Result<SendHandle> {
        self.enqueue(record, false)
    }

    /// Writes the records queued by [`send`](Self::send) now, without waiting for
    /// their answers (for a caller about to wait for its next record, e.g. on input).
    /// A failed write is not an error here: the records are resent by the next call
    /// that reads.
    pub fn send_queued(&mut self) {
        self.write_queued();
    }

    /// Waits until `handle` is answered and returns its outcome.
    pub fn wait(&mut self, handle: &SendHandle) -> Result<Receipt> {
        let pumped = self.pump(&|_| handle.is_done());
        match handle.result() {
            Some(outcome) => outcome,
            None => Err(pumped.err().unwrap_or_else(|| closed_error("wait"))),
        }
    }

    /// Waits until every record sent so far is answered. `Err` is the first failure
    /// since the last `flush` of a record no [`publish`](Self::publish) waited for;
    /// each handle has its own outcome.
    pub fn flush(&mut self) -> Result<()> {
        let pumped = self.pump(&|p| p.inflight.is_empty() && p.retry.is_empty());
        if let Some(first) = self.unreported.take() {
            return Err(first);
        }
        pumped
    }

    /// For a caller with nothing to send for a while (waiting on its input): waits for
    /// the answers to the records in flight, then PINGs once nothing has been sent for
    /// the [keepalive](ProducerBuilder::keepalive) period, so that the broker's idle
    /// timeout does not close the connection; one it closed all the same is opened
    /// again. Returns how long the caller may wait before it calls again. `Err`: the
    /// broker stayed out of reach for the retry timeout. Records' failures are left to
    /// their handles and the next [`flush`](Self::flush).
    pub fn keep_alive(&mut self) -> Result<Duration> {
        self.pump(&|p| p.conn.is_some() && p.inflight.is_empty() && p.retry.is_empty())?;
        self.probe_if_idle()?;
        let sent = self
            .conn
            .as_ref()
            .map_or_else(Instant::now, |c| c.last_send);
        let due = sent + self.settings.keepalive;
        // At least a millisecond: a caller's wait of 0 would spin.
        Ok(due
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1)))
    }

    /// Flushes, then closes the connection.
    pub fn close(mut self) -> Result<()> {
        let flushed = self.flush();
        self.shut();
        flushed
    }

    /// A topic's id and partition count, looked up once (DECLARE PASSIVE) and created
    /// first when the producer was built with [`declare`](ProducerBuilder::declare). A
    /// `.dlq` name is its source's twin.
    pub fn topic(&mut self, name: &str) -> Result<TopicInfo> {
        if self.last_topic.0 == name {
            return Ok(self.last_topic.1);
        }
        let found = match self.topics.get(name) {
            Some(t) => *t,
            None => {
                let create = self.settings.declare;
                let found = topics::resolve(name, create, &mut |frame| self.call(frame))?;
                self.topics.insert(name.to_string(), found);
                found
            }
        };
        self.last_topic.0.clear();
        self.last_topic.0.push_str(name);
        self.last_topic.1 = found;
        Ok(found)
    }

    /// This producer's id on the wire (0 when not idempotent). It changes when a
    /// record's outcome stays unknown past the retry timeout.
    pub fn producer_id(&self) -> u64 {
        self.producer_id
    }

    pub fn stats(&self) -> ProducerStats {
        self.stats
    }

    fn enqueue(&mut self, record: Record<'_>, awaited: bool) -> Result<SendHandle> {
        if self.closed {
            return Err(closed_error("send"));
        }
        check_lengths(record.key, record.value)?;
        let topic = self.topic(record.topic)?;
        // A partition past the count known here goes to the broker all the same: the
        // topic may have grown, and UNKNOWN_PARTITION refreshes what is known.
        let partition = record
            .partition
            .unwrap_or_else(|| partition_for_key(record.key, topic.partitions));
        self.pump(&Producer::ready_to_write)?;
        self.probe_if_idle()?;
        if self.inflight.is_empty() {
            self.now = Instant::now();
        }
        let flags = PubFlags::requesting(record.durability.or(self.settings.durability));
        let (producer_id, producer_seq) = self.number(topic.id, partition);
        let len = self.outbox.push(|out| {
            Pub {
                topic_id: topic.id,
                partition,
                producer_id,
                producer_seq,
                flags,
                key: record.key,
                value: record.value,
            }
            .encode_frame(out)
        });
        let handle = self.new_handle();
        let pending = pipeline::Pending::new(
            (topic.id, partition),
            (producer_id, producer_seq),
            flags,
            len,
            (handle.clone(), awaited),
            self.now,
        );
        self.admit(pending);
        self.write_if_batch_full();
        Ok(handle)
    }

    /// A fresh handle, in the oldest spare slot nobody holds any more if there is one.
    fn new_handle(&mut self) -> SendHandle {
        if let Some(slot) = self.spare_slots.front_mut().and_then(Arc::get_mut) {
            slot.reset();
            let slot = self.spare_slots.pop_front().expect("looked at");
            return SendHandle { slot };
        }
        SendHandle {
            slot: Arc::default(),
        }
    }

    /// Gives `handle` its outcome and keeps its slot for reuse.
    fn settle(&mut self, handle: SendHandle, outcome: Result<Receipt>) {
        let slot = handle.settle(outcome);
        if self.spare_slots.len() >= self.settings.max_in_flight {
            // Its oldest still held by a caller: let it go with them.
            self.spare_slots.pop_front();
        }
        self.spare_slots.push_back(slot);
    }

    fn ready_to_write(&self) -> bool {
        self.conn.is_some()
            && self.retry.is_empty()
            && !self.must_drain
            && self.inflight.len() < self.settings.max_in_flight
    }

    /// One request on a quiet connection (nothing in flight), retried through
    /// reconnects and backoff errors until the retry timeout.
    fn call(&mut self, frame: &Frame<'_>) -> Result<Vec<u8>> {
        self.pump(&|p| p.conn.is_some() && p.inflight.is_empty() && p.retry.is_empty())?;
        let deadline = Instant::now() + self.settings.retry_timeout;
        let mut backoffs = 0;
        loop {
            if self.conn.is_none() {
                self.reconnect(deadline)?;
            }
            let conn = self.conn.as_mut().expect("connected above");
            let answer_by = Instant::now() + self.settings.timeout;
            let err = match conn.request(frame, answer_by, &mut |_, _| {}) {
                Ok(result) => {
                    self.brokers.served();
                    return Ok(result);
                }
                Err(e) => e,
            };
            let route = brokers::route(&err);
            if err.code().is_none() || err.closes_connection() || route != Route::Stay {
                self.conn = None;
            }
            if !err.is_retryable() || Instant::now() >= deadline {
                return Err(err);
            }
            match route {
                Route::Stay if err.code().is_none() => {
                    self.brokers.move_on();
                    pipeline::backoff(backoffs);
                    backoffs += 1;
                }
                Route::Stay => {
                    pipeline::backoff(backoffs);
                    backoffs += 1;
                }
                Route::Follow(_) => {
                    if let Some(n) = self.brokers.take(&route) {
                        std::thread::sleep(brokers::cluster_backoff(n));
                    }
                }
                Route::MoveOn => {
                    self.brokers.take(&route);
                    std::thread::sleep(brokers::cluster_backoff(backoffs));
                    backoffs += 1;
                }
            }
        }
    }

    /// The broker closes a connection without a frame for its idle timeout: a PING
    /// after a quiet keepalive period keeps it open, or finds out it was closed before
    /// a record is written into a closed socket.
    fn probe_if_idle(&mut self) -> Result<()> {
        let keepalive = self.settings.keepalive;
        let idle = match &self.conn {
            Some(c) => {
                self.inflight.is_empty()
                    && self.outbox.unwritten().is_empty()
                    && c.last_send.elapsed() >= keepalive
            }
            None => false,
        };
        if idle {
            self.call(&Frame::Ping(crate::wire::ops::Ping {}))?;
        }
        Ok(())
    }

    fn shut(&mut self) {
        self.closed = true;
        self.conn = None;
        let left: Vec<_> = self
            .inflight
            .drain(..)
            .chain(self.retry.drain(..))
            .collect();
        for p in left {
            let _ = p.handle.settle(Err(closed_error("answer")));
        }
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        self.shut();
    }
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("brokers", &self.brokers.order())
            .field("producer_id", &self.producer_id)
            .field("connected", &self.conn.is_some())
            .field("in_flight", &self.inflight.len())
            .field("to_resend", &self.retry.len())
            .field("stats", &self.stats)
            .finish()
    }
}

fn closed_error(what: &str) -> Error {
    Error::InvalidInput(format!("{what}: the producer is closed"))
}

fn check_lengths(key: &[u8], value: &[u8]) -> Result<()> {
    if key.len() > MAX_KEY_LEN_BYTES {
        return Err(Error::InvalidInput(format!(
            "key is {} bytes, at most {MAX_KEY_LEN_BYTES}",
            key.len()
        )));
    }
    if value.len() > MAX_VALUE_LEN_BYTES as usize {
        return Err(Error::InvalidInput(format!(
            "value is {} bytes, at most {MAX_VALUE_LEN_BYTES}",
            value.len()
        )));
    }
    Ok(())
}
