//! The topic registry as the broker runs it: DECLARE (create, look up, delete a pair)
//! and the registry file every mutation waits for before it is answered
//! (`man/mortarmq.7`, DECLARE: "Registry mutations are durable before the OK").
//!
//! Mutations bump `version`; one write of the whole registry is in flight at a time and
//! answers every DECLARE up to the version it wrote. A failed write fails the DECLAREs
//! waiting on it, and the next mutation writes the whole registry again.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log::{meta, Storage, SEGMENT_HEADER_BYTES};
use crate::wire::ops::{Declare, DeclareResult};
use crate::wire::{DeclareCreated, DeclareFlags, ErrorCode, Op, Response};

use super::jobs::{DurableJob, OpenedLogs, Work};
use super::topics::{topic_dir, valid_name, Registry, TopicPair, DLQ_SUFFIX};
use super::{Broker, ConnRef, Effect, Handled, Now};

/// The registry file in the data directory.
pub const REGISTRY_FILE: &str = "registry";

/// A DECLARE that arrived while a topic's files were being created: DECLAREs that change
/// the registry run one at a time, so a creation never races a delete of the same pair.
struct QueuedDeclare {
    conn: ConnRef,
    slot: u64,
    topic: Vec<u8>,
    partition_count: u16,
    flags: DeclareFlags,
}

/// The topic whose files the fsync pool is creating, and the DECLARE that asked for it
/// (none on a cluster node applying another node's DECLARE).
pub(super) struct Creating {
    pair: TopicPair,
    reply: Option<(ConnRef, u64)>,
}

/// A DECLARE answered once the registry version it changed (or saw) is durable.
struct RegistryWaiter {
    conn: ConnRef,
    slot: u64,
    version: u64,
    response: Response,
}

pub struct TopicRegistry {
    storage: Arc<dyn Storage>,
    registry: Registry,
    path: PathBuf,
    topics_dir: PathBuf,
    /// Mutations made, and how many of them are on disk.
    version: u64,
    durable: u64,
    write_in_flight: bool,
    /// Directories of deleted pairs are being removed (DELETEs wait for it).
    removing: bool,
    waiters: VecDeque<RegistryWaiter>,
    /// Directories of deleted pairs, removed once the registry without them is durable.
    doomed_dirs: Vec<PathBuf>,
    pub(super) creating: Option<Creating>,
    queued: VecDeque<QueuedDeclare>,
    /// Pairs whose files exist but whose registry version is not yet durable, with that
    /// version: nobody may PUB to or SUB on them yet (a crash would delete their files).
    unwritten: BTreeMap<u16, u64>,
    /// No registry write before this (after a failure: the disk may be full).
    retry_after_ms: u64,
    /// Pairs deleted at a journal LSN no checkpoint has passed yet: a restart would
    /// replay their old records, so they are not reused until one has.
    freed_uncheckpointed: BTreeMap<u16, u64>,
}

/// After a failed registry write the next one waits this long, so a full disk is not
/// hammered with a write every reactor pass.
pub const REGISTRY_RETRY_MS: u64 = 1_000;

fn io_code(e: &io::Error) -> ErrorCode {
    if crate::log::is_no_space_io(e) {
        ErrorCode::StorageFull
    } else {
        ErrorCode::InternalError
    }
}

impl TopicRegistry {
    /// Reads the registry file of `data_dir`, and whether one was read. A brand-new data
    /// directory (no registry, nothing under `topics/`) gets an empty registry written
    /// now, so that from its first DECLARE on a missing registry means a lost one. A
    /// missing registry beside topic directories, or an unreadable one, refuses the start:
    /// without the registry every topic directory would look deleted.
    pub(super) fn load(
        storage: Arc<dyn Storage>,
        data_dir: &Path,
    ) -> Result<(TopicRegistry, bool), String> {
        let path = data_dir.join(REGISTRY_FILE);
        let topics_dir = data_dir.join(super::TOPICS_DIR);
        let refuse = |what: String| {
            format!(
                "{what}: refusing to start; run 'mortarctl check --repair {}' to rebuild \
                 the registry from the topic directories",
                data_dir.display()
            )
        };
        let unreadable = |why: String| {
            refuse(format!(
                "the topic registry {} is unreadable ({why})",
                path.display()
            ))
        };
        let (registry, read) = match meta::read_checked(&*storage, &path) {
            Ok(Some(bytes)) => (Registry::decode(&bytes).map_err(unreadable)?, true),
            Ok(None) => {
                let entries = storage
                    .list_dir(&topics_dir)
                    .map_err(|e| format!("{}: {e}", topics_dir.display()))?
                    .len();
                if entries > 0 {
                    return Err(refuse(format!(
                        "the topic registry {} is missing but {} holds {entries} entries",
                        path.display(),
                        topics_dir.display()
                    )));
                }
                let empty = Registry::default();
                meta::write_atomic(&*storage, &path, &empty.encode())
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                (empty, false)
            }
            Err(e) => {
                // A damaged file's message starts with its path, already named.
                let why = e.to_string();
                let prefix = format!("{}: ", path.display());
                return Err(unreadable(why.strip_prefix(&prefix).unwrap_or(&why).into()));
            }
        };
        let topics = TopicRegistry {
            storage,
            registry,
            path,
            topics_dir,
            version: 0,
            durable: 0,
            write_in_flight: false,
            removing: false,
            waiters: VecDeque::new(),
            doomed_dirs: Vec::new(),
            creating: None,
            queued: VecDeque::new(),
            unwritten: BTreeMap::new(),
            retry_after_ms: 0,
            freed_uncheckpointed: BTreeMap::new(),
        };
        Ok((topics, read))
    }

    /// A checkpoint at `lsn` is durable: pairs deleted below it may be reused.
    pub(super) fn checkpointed(&mut self, lsn: u64) {
        self.freed_uncheckpointed
            .retain(|_, deleted_at| *deleted_at > lsn);
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The pair of `topic_id` if clients may use it: its files exist and the registry
    /// naming it is durable (`man/mortarmq.7`, DECLARE).
    pub fn usable(&self, topic_id: u16) -> Option<&TopicPair> {
        let (pair, _) = self.registry.by_topic_id(topic_id)?;
        let creating = self
            .creating
            .as_ref()
            .is_some_and(|c| c.pair.pair == pair.pair);
        (!creating && !self.unwritten.contains_key(&pair.pair)).then_some(pair)
    }

    fn job(&self, work: Work) -> DurableJob {
        DurableJob {
            storage: Arc::clone(&self.storage),
            work,
        }
    }

    /// Answers now if registry `version` is durable, else when it is.
    fn answer_at(&mut self, version: u64, conn: ConnRef, slot: u64, response: Response) -> Handled {
        if self.durable >= version {
            return Handled::Answer(response);
        }
        self.waiters.push_back(RegistryWaiter {
            conn,
            slot,
            version,
            response,
        });
        Handled::Wait
    }

    /// The write of the whole registry, when a mutation is not yet on disk and no write
    /// runs.
    /// Every registry change is durable and no topic's files are being made or removed:
    /// what the registry file says is what was applied.
    pub(super) fn settled(&self) -> bool {
        !self.write_in_flight
            && !self.removing
            && self.creating.is_none()
            && self.durable >= self.version
    }

    pub(super) fn take_write_job(&mut self, now_ms: u64) -> Option<DurableJob> {
        // One at a time; none while directories are removed (a later write would answer
        // DELETEs before their directories are gone) nor while a topic's files are made
        // (the registry must not name a pair whose creation may still fail).
        if self.write_in_flight
            || self.removing
            || self.creating.is_some()
            || self.durable >= self.version
            || now_ms < self.retry_after_ms
        {
            return None;
        }
        self.write_in_flight = true;
        Some(self.job(Work::WriteRegistry {
            version: self.version,
            path: self.path.clone(),
            bytes: self.registry.encode(),
        }))
    }

    /// A registry write finished: its DECLAREs are answered, or, when it dropped deleted
    /// pairs, the removal of their directories is returned (no durable registry names
    /// them now) and the DECLAREs are answered when it is done.
    pub(super) fn write_done(
        &mut self,
        version: u64,
        result: &io::Result<()>,
        now_ms: u64,
        effects: &mut Vec<Effect>,
    ) -> Option<DurableJob> {
        self.write_in_flight = false;
        if let Err(e) = result {
            self.retry_after_ms = now_ms + REGISTRY_RETRY_MS;
            log::error!("writing the topic registry failed: {e}");
            let code = io_code(e);
            for w in self.waiters.drain(..) {
                effects.push(Effect::Answer {
                    conn: w.conn,
                    slot: w.slot,
                    response: Response::err(
                        code,
                        Op::Declare as u8,
                        format!("registry write failed: {e}"),
                    ),
                });
            }
            // The next write (after REGISTRY_RETRY_MS) is of the whole registry again.
            return None;
        }
        self.durable = version;
        self.unwritten.retain(|_, v| *v > version);
        if self.doomed_dirs.is_empty() {
            self.answer_durable(version, effects);
            return None;
        }
        // A DELETE is answered once its directories are gone too.
        self.removing = true;
        let dirs = std::mem::take(&mut self.doomed_dirs);
        Some(self.job(Work::RemoveDirectories { version, dirs }))
    }

    /// The directories of the pairs deleted up to `version` are gone (or could not be
    /// removed, which start-up retries): their DELETEs are answered.
    pub(super) fn directories_removed(&mut self, version: u64, effects: &mut Vec<Effect>) {
        self.removing = false;
        self.answer_durable(version, effects);
    }

    /// Answers every DECLARE that waited for a version up to `version` (they wait for
    /// different versions, so not only at the front).
    fn answer_durable(&mut self, version: u64, effects: &mut Vec<Effect>) {
        let (ready, waiting) = std::mem::take(&mut self.waiters)
            .into_iter()
            .partition(|w| w.version <= version);
        self.waiters = waiting;
        for w in Vec::<RegistryWaiter>::from(ready) {
            effects.push(Effect::Answer {
                conn: w.conn,
                slot: w.slot,
                response: w.response,
            });
        }
    }

    /// `registry_in_flight`: a cluster's REGISTRY proposal is out, which DECLAREs queue
    /// behind as they do behind a creation.
    pub(super) fn check_invariants(&self, registry_in_flight: bool) {
        assert!(self.durable <= self.version);
        assert!(self
            .unwritten
            .values()
            .all(|&v| v > self.durable && v <= self.version));
        assert!(
            self.creating.is_some() || registry_in_flight || self.queued.is_empty(),
            "queued behind nothing"
        );
        for w in &self.waiters {
            assert!(
                w.version > self.durable || self.removing,
                "a durable waiter was not answered"
            );
        }
    }
}

pub(super) fn declare_err(code: ErrorCode, message: String) -> Handled {
    Handled::Answer(Response::err(code, Op::Declare as u8, message))
}

pub(super) fn declared(pair: &TopicPair, created: DeclareCreated) -> Response {
    Response::Declare(DeclareResult {
        topic_id: pair.source_id(),
        partition_count: pair.partition_count,
        created: created.as_code(),
    })
}

/// The topic name of a DECLARE, or its refusal: a valid name, and not a twin's.
fn declared_name<'a>(d: &Declare<'a>) -> Result<&'a str, Handled> {
    if !valid_name(d.topic) {
        return Err(declare_err(
            ErrorCode::InvalidTopicName,
            "topic names are 1-255 bytes of [A-Za-z0-9._-]".into(),
        ));
    }
    // valid_name admits only ASCII, so this cannot fail.
    let name = std::str::from_utf8(d.topic).unwrap_or_default();
    if name.ends_with(DLQ_SUFFIX) {
        return Err(declare_err(
            ErrorCode::MutationNotPackable,
            format!("'{name}' is a dead-letter twin: address its source topic"),
        ));
    }
    Ok(name)
}

impl Broker {
    /// DECLARE: create, look up (PASSIVE) or delete (DELETE, IF_UNUSED) a topic pair.
    pub fn declare(&mut self, conn: ConnRef, slot: u64, d: &Declare<'_>, now: Now) -> Handled {
        let name = match declared_name(d) {
            Ok(name) => name,
            Err(refused) => return refused,
        };
        if self.registry_busy() {
            self.topics.queued.push_back(QueuedDeclare {
                conn,
                slot,
                topic: d.topic.to_vec(),
                partition_count: d.partition_count,
                flags: d.flags,
            });
            return Handled::Wait;
        }
        let existing = self.topics.registry.lookup(name).cloned();
        if d.flags.contains(DeclareFlags::DELETE) {
            return match existing {
                Some(pair) => self.delete_topic(conn, slot, &pair, d.flags, now),
                None => declare_err(ErrorCode::UnknownTopic, format!("no topic '{name}'")),
            };
        }
        if let Some(pair) = existing {
            let any_count = d.flags.contains(DeclareFlags::PASSIVE) && d.partition_count == 0;
            if d.partition_count != pair.partition_count && !any_count {
                return declare_err(
                    ErrorCode::TopicConfigConflict,
                    format!(
                        "topic '{name}' exists with {} partitions",
                        pair.partition_count
                    ),
                );
            }
            // A topic whose registry write is not yet durable is confirmed to nobody
            // before it is.
            let version = self.topics.unwritten.get(&pair.pair).copied().unwrap_or(0);
            let response = declared(&pair, DeclareCreated::IdempotentOk);
            return self.topics.answer_at(version, conn, slot, response);
        }
        if d.flags.contains(DeclareFlags::PASSIVE) {
            return declare_err(ErrorCode::UnknownTopic, format!("no topic '{name}'"));
        }
        self.create_topic(conn, slot, name, d.partition_count, now)
    }

    /// Registers the pair and hands the making of its files to the fsync pool; the
    /// DECLARE is answered once they exist and the registry naming the pair is durable.
    fn create_topic(
        &mut self,
        conn: ConnRef,
        slot: u64,
        name: &str,
        partition_count: u16,
        now: Now,
    ) -> Handled {
        if partition_count == 0 || partition_count > self.config.max_partitions {
            let max = self.config.max_partitions;
            return declare_err(
                ErrorCode::InvalidArgument,
                format!("partition_count must be 1..={max}"),
            );
        }
        // Each partition of the source and the twin starts with a segment header.
        let new_bytes = 2 * u64::from(partition_count) * SEGMENT_HEADER_BYTES as u64;
        if let Some(cap) = self.partitions.over_data_cap(new_bytes) {
            return declare_err(
                ErrorCode::StorageFull,
                format!("data directory cap of {cap} bytes reached"),
            );
        }
        if self.cluster.is_some() {
            return self.propose_declare(conn, slot, name, partition_count, now);
        }
        let topics = &mut self.topics;
        let avoid = &topics.freed_uncheckpointed;
        let pair = match topics
            .registry
            .create_avoiding(name, partition_count, avoid)
        {
            Ok(pair) => pair,
            Err(code) => return declare_err(code, "all 32767 topic pairs are in use".into()),
        };
        self.start_creation(pair, Some((conn, slot)));
        Handled::Wait
    }

    /// Hands the making of a registered pair's files to the fsync pool; `reply` is
    /// answered once they exist and the registry naming the pair is durable.
    pub(super) fn start_creation(&mut self, pair: TopicPair, reply: Option<(ConnRef, u64)>) {
        let job = self.partitions.create_job(&pair);
        self.topics.creating = Some(Creating { pair, reply });
        self.sink.submit(job);
    }

    /// The pair `create_avoiding` would take now (a cluster's leader proposes it).
    pub(super) fn next_pair(&self) -> Result<u16, ErrorCode> {
        let topics = &self.topics;
        topics.registry.next_pair(&topics.freed_uncheckpointed)
    }

    /// A cluster node applies a DECLARE the leader made: the pair as the leader chose it.
    /// `None` when that pair is in use, alike on every node.
    pub(super) fn register_at(&mut self, pair: u16, name: &str, count: u16) -> Option<TopicPair> {
        self.topics.registry.create_at(pair, name, count)
    }

    /// Answers `reply` now if registry `version` is durable, else when it is.
    pub(super) fn answer_registry_at(&mut self, version: u64, reply: (ConnRef, u64), r: Response) {
        let (conn, slot) = reply;
        if let Handled::Answer(response) = self.topics.answer_at(version, conn, slot, r) {
            self.effects.push(Effect::Answer {
                conn,
                slot,
                response,
            });
        }
    }

    /// The registry version a pair's DECLARE is durable at (0: already).
    pub(super) fn pair_version(&self, pair: u16) -> u64 {
        self.topics.unwritten.get(&pair).copied().unwrap_or(0)
    }

    /// DECLAREs that change the registry run one at a time: while a pair's files are made,
    /// or (in a cluster) while a REGISTRY entry is proposed and not applied.
    fn registry_busy(&self) -> bool {
        self.topics.creating.is_some() || self.registry_in_flight()
    }

    /// The fsync pool made (or failed to make) the files of the topic being created.
    pub(super) fn topic_created(&mut self, opened: OpenedLogs, result: &io::Result<()>, now: Now) {
        let Some(Creating { pair, reply }) = self.topics.creating.take() else {
            return;
        };
        let response = match result {
            Ok(()) => {
                self.partitions.install(opened);
                log::info!(
                    "created topic '{}' id {} with {} partitions",
                    pair.name,
                    pair.source_id(),
                    pair.partition_count
                );
                let topics = &mut self.topics;
                topics.version += 1;
                topics.unwritten.insert(pair.pair, topics.version);
                if let Some((conn, slot)) = reply {
                    topics.waiters.push_back(RegistryWaiter {
                        conn,
                        slot,
                        version: topics.version,
                        response: declared(&pair, DeclareCreated::Created),
                    });
                }
                None
            }
            Err(e) => {
                // What was made stays as an orphan directory; start-up removes it.
                log::error!("cannot create topic '{}': {e}", pair.name);
                self.topics.registry.delete(pair.pair);
                if self.cluster.is_some() {
                    // A committed DECLARE: every other node has the topic. Applying on
                    // without it would skip its records here, and this node could lead
                    // with a registry of its own; it stops, and a restart applies the
                    // DECLARE again.
                    self.cluster_failed(format!("creating topic '{}': {e}", pair.name));
                }
                let code = if crate::log::is_no_space_io(e) {
                    ErrorCode::StorageFull
                } else {
                    ErrorCode::InternalError
                };
                let message = format!("cannot create topic files: {e}");
                Some(Response::err(code, Op::Declare as u8, message))
            }
        };
        if let (Some(response), Some((conn, slot))) = (response, reply) {
            self.effects.push(Effect::Answer {
                conn,
                slot,
                response,
            });
        }
        self.run_queued_declares(now);
        self.creation_done(now);
    }

    /// DECLAREs that waited for a creation, in order, until one starts another.
    pub(super) fn run_queued_declares(&mut self, now: Now) {
        while !self.registry_busy() {
            let Some(q) = self.topics.queued.pop_front() else {
                return;
            };
            let d = Declare {
                topic: &q.topic,
                partition_count: q.partition_count,
                flags: q.flags,
            };
            if let Handled::Answer(response) = self.declare(q.conn, q.slot, &d, now) {
                self.effects.push(Effect::Answer {
                    conn: q.conn,
                    slot: q.slot,
                    response,
                });
            }
        }
    }

    fn delete_topic(
        &mut self,
        conn: ConnRef,
        slot: u64,
        pair: &TopicPair,
        flags: DeclareFlags,
        now: Now,
    ) -> Handled {
        if flags.contains(DeclareFlags::IF_UNUSED) && self.consume.topic_in_use(pair) {
            return declare_err(
                ErrorCode::TopicInUse,
                format!("topic '{}' has live subscriptions", pair.name),
            );
        }
        if self.cluster.is_some() {
            return self.propose_delete(conn, slot, pair, now);
        }
        self.delete_pair(pair, now);
        let response = declared(pair, DeclareCreated::Deleted);
        let version = self.topics.version;
        self.topics.answer_at(version, conn, slot, response)
    }

    /// Forgets a pair: its partitions, its registry entry, its directories once the
    /// registry without it is durable, its groups.
    pub(super) fn delete_pair(&mut self, pair: &TopicPair, now: Now) {
        self.partitions.remove_pair(pair, &mut self.effects);
        let topics = &mut self.topics;
        topics.registry.delete(pair.pair);
        topics
            .freed_uncheckpointed
            .insert(pair.pair, self.partitions.journal_written_lsn());
        self.partitions.request_checkpoint();
        topics.unwritten.remove(&pair.pair);
        topics.version += 1;
        for (topic_id, name) in pair.topics() {
            let dir = topic_dir(&topics.topics_dir, topic_id, &name);
            topics.doomed_dirs.push(dir);
        }
        log::info!("deleted topic '{}' id {}", pair.name, pair.source_id());
        self.consume.topic_deleted(pair, now);
        self.collect_consume_effects(now);
    }

    /// The registry version every mutation so far is durable at.
    pub(super) fn registry_version(&self) -> u64 {
        self.topics.version
    }
}
