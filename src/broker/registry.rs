//! The topic registry as the broker runs it: DECLARE (create, look up, delete a pair)
//! and the registry file every mutation waits for before it is answered
//! (`man/mortarmq.7`, DECLARE: "Registry mutations are durable before the OK").
//!
//! Mutations bump `version`; one write of the whole registry is in flight at a time and
//! answers every DECLARE up to the version it wrote. A failed write fails the DECLAREs
//! waiting on it, and the next mutation writes the whole registry again.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

use crate::log::meta;
use crate::wire::ops::{Declare, DeclareResult};
use crate::wire::{DeclareCreated, DeclareFlags, ErrorCode, Op, Response};

use super::jobs::DurableJob;
use super::topics::{topic_dir, valid_name, Registry, TopicPair, DLQ_SUFFIX};
use super::{Broker, ConnRef, Effect, Handled, Now};

/// The registry file in the data directory.
pub const REGISTRY_FILE: &str = "registry";

/// A DECLARE answered once the registry version it changed (or saw) is durable.
struct RegistryWaiter {
    conn: ConnRef,
    slot: u64,
    version: u64,
    response: Response,
}

pub struct TopicRegistry {
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
}

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
    pub(super) fn load(data_dir: &Path) -> Result<(TopicRegistry, bool), String> {
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
        let (registry, read) = match meta::read_checked(&path) {
            Ok(Some(bytes)) => (Registry::decode(&bytes).map_err(unreadable)?, true),
            Ok(None) => {
                let entries = std::fs::read_dir(&topics_dir)
                    .map_err(|e| format!("{}: {e}", topics_dir.display()))?
                    .count();
                if entries > 0 {
                    return Err(refuse(format!(
                        "the topic registry {} is missing but {} holds {entries} entries",
                        path.display(),
                        topics_dir.display()
                    )));
                }
                let empty = Registry::default();
                meta::write_atomic(&path, &empty.encode())
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
            registry,
            path,
            topics_dir,
            version: 0,
            durable: 0,
            write_in_flight: false,
            removing: false,
            waiters: VecDeque::new(),
            doomed_dirs: Vec::new(),
        };
        Ok((topics, read))
    }

    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Answers now if every mutation so far is durable, else when it is.
    fn answer_when_durable(&mut self, conn: ConnRef, slot: u64, response: Response) -> Handled {
        if self.durable >= self.version {
            return Handled::Answer(response);
        }
        self.waiters.push_back(RegistryWaiter {
            conn,
            slot,
            version: self.version,
            response,
        });
        Handled::Wait
    }

    /// The write of the whole registry, when a mutation is not yet on disk and no write
    /// runs.
    pub(super) fn take_write_job(&mut self) -> Option<DurableJob> {
        // One at a time, and none while directories are removed: a later write would
        // answer DELETEs before their directories are gone.
        if self.write_in_flight || self.removing || self.durable >= self.version {
            return None;
        }
        self.write_in_flight = true;
        Some(DurableJob::WriteRegistry {
            version: self.version,
            path: self.path.clone(),
            bytes: self.registry.encode(),
        })
    }

    /// A registry write finished: its DECLAREs are answered, or, when it dropped deleted
    /// pairs, the removal of their directories is returned (no durable registry names
    /// them now) and the DECLAREs are answered when it is done.
    pub(super) fn write_done(
        &mut self,
        version: u64,
        result: &io::Result<()>,
        effects: &mut Vec<Effect>,
    ) -> Option<DurableJob> {
        self.write_in_flight = false;
        if let Err(e) = result {
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
            // The next mutation retries the write with the whole registry.
            self.durable = self.version.saturating_sub(1);
            return None;
        }
        self.durable = version;
        if self.doomed_dirs.is_empty() {
            self.answer_durable(version, effects);
            return None;
        }
        // A DELETE is answered once its directories are gone too.
        self.removing = true;
        Some(DurableJob::RemoveDirectories {
            version,
            dirs: std::mem::take(&mut self.doomed_dirs),
        })
    }

    /// The directories of the pairs deleted up to `version` are gone (or could not be
    /// removed, which start-up retries): their DELETEs are answered.
    pub(super) fn directories_removed(&mut self, version: u64, effects: &mut Vec<Effect>) {
        self.removing = false;
        self.answer_durable(version, effects);
    }

    fn answer_durable(&mut self, version: u64, effects: &mut Vec<Effect>) {
        while self.waiters.front().is_some_and(|w| w.version <= version) {
            let w = self.waiters.pop_front().expect("front exists");
            effects.push(Effect::Answer {
                conn: w.conn,
                slot: w.slot,
                response: w.response,
            });
        }
    }

    pub(super) fn check_invariants(&self) {
        assert!(self.durable <= self.version);
        let mut last = 0;
        for w in &self.waiters {
            assert!(
                w.version > self.durable || self.removing,
                "a durable waiter was not answered"
            );
            assert!(w.version >= last, "waiters in version order");
            last = w.version;
        }
    }
}

fn declare_err(code: ErrorCode, message: String) -> Handled {
    Handled::Answer(Response::err(code, Op::Declare as u8, message))
}

fn declared(pair: &TopicPair, created: DeclareCreated) -> Response {
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
            // A topic created by a DECLARE still waiting for its registry write must not
            // be confirmed to anyone before that write is durable.
            let response = declared(&pair, DeclareCreated::IdempotentOk);
            return self.topics.answer_when_durable(conn, slot, response);
        }
        if d.flags.contains(DeclareFlags::PASSIVE) {
            return declare_err(ErrorCode::UnknownTopic, format!("no topic '{name}'"));
        }
        self.create_topic(conn, slot, name, d.partition_count, now)
    }

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
        let pair = match self.topics.registry.create(name, partition_count) {
            Ok(pair) => pair,
            Err(code) => return declare_err(code, "all 32767 topic pairs are in use".into()),
        };
        if let Err(e) = super::topics::write_topic_files(&self.topics.topics_dir, &pair) {
            self.topics.registry.delete(pair.pair);
            return declare_err(io_code(&e), format!("cannot create topic files: {e}"));
        }
        for (topic_id, topic_name) in pair.topics() {
            for index in 0..pair.partition_count {
                let opened =
                    self.partitions
                        .open((topic_id, index), &topic_name, now, &mut self.counters);
                if let Err(e) = opened {
                    log::error!("cannot create topic '{name}': {e}");
                    self.partitions.remove_pair(&pair, &mut self.effects);
                    self.topics.registry.delete(pair.pair);
                    let code = if e.is_no_space() {
                        ErrorCode::StorageFull
                    } else {
                        ErrorCode::InternalError
                    };
                    return declare_err(code, format!("cannot create topic files: {e}"));
                }
            }
        }
        log::info!(
            "created topic '{name}' id {} with {partition_count} partitions",
            pair.source_id()
        );
        self.topics.version += 1;
        let response = declared(&pair, DeclareCreated::Created);
        self.topics.answer_when_durable(conn, slot, response)
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
        self.partitions.remove_pair(pair, &mut self.effects);
        let topics = &mut self.topics;
        topics.registry.delete(pair.pair);
        topics.version += 1;
        for (topic_id, name) in pair.topics() {
            let dir = topic_dir(&topics.topics_dir, topic_id, &name);
            topics.doomed_dirs.push(dir);
        }
        log::info!("deleted topic '{}' id {}", pair.name, pair.source_id());
        self.consume.topic_deleted(pair, now);
        self.collect_consume_effects(now);
        let response = declared(pair, DeclareCreated::Deleted);
        self.topics.answer_when_durable(conn, slot, response)
    }
}
