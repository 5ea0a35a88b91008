//! The topic registry: names, paired ids, partition counts, and its durable file.
//!
//! Pair k (0-based) owns source id 2k+1 and `.dlq` twin id 2k+2. New pairs take the
//! lowest pair never used; only when all 32767 have been used are freed pairs reused,
//! lowest first (`man/mortarmq.7`, DECLARE).
//!
//! The registry file (`<data-dir>/registry`, written with `log::meta::write_atomic`,
//! so it is CRC-checked and replaced atomically) is text, one fact per line:
//!
//! ```text
//! mortar-registry 1
//! next_unused_pair <k>
//! topic <pair k> <partition_count> <source name>
//! ```
//!
//! Each topic directory also holds a topic file (`<topic dir>/topic`, written the same
//! way when the topic is created) naming its topic, because directory names carry only a
//! CRC of the name: without it a lost registry could not be rebuilt
//! ([`RegistryRebuild`], `mortarctl check --repair`). The twin's file names the twin.
//!
//! ```text
//! mortar-topic 1
//! name <topic name>
//! partitions <partition_count>
//! ```

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::path::{Path, PathBuf};

use crate::log::meta;
use crate::log::storage::create_dir_durable;
use crate::log::Storage;
use crate::wire::limits::{MAX_TOPIC_LEN_BYTES, TOPIC_PAIRS_MAX};
use crate::wire::ErrorCode;

pub use crate::wire::DLQ_SUFFIX;
const REGISTRY_MAGIC: &str = "mortar-registry 1";
/// The topic file in every topic directory.
pub const TOPIC_FILE: &str = "topic";
const TOPIC_MAGIC: &str = "mortar-topic 1";
/// A rebuilt registry names a pair whose directories hold no topic file (written before
/// topic files existed) `recovered-<source topic id>`.
pub const RECOVERED_NAME_PREFIX: &str = "recovered-";
/// Hex digits of the name CRC in a topic directory's name.
const DIR_CRC_HEX_DIGITS: usize = 8;

/// One registered pair: the source topic and its twin share the partition count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicPair {
    pub pair: u16,
    pub name: String,
    pub partition_count: u16,
}

impl TopicPair {
    pub fn source_id(&self) -> u16 {
        source_id(self.pair)
    }
    pub fn twin_id(&self) -> u16 {
        crate::wire::dlq_twin_id(source_id(self.pair))
    }
    pub fn twin_name(&self) -> String {
        format!("{}{DLQ_SUFFIX}", self.name)
    }

    /// The name of the source, or of its dead-letter twin.
    pub fn name_of(&self, twin: bool) -> String {
        if twin {
            self.twin_name()
        } else {
            self.name.clone()
        }
    }

    /// The source and the twin: (topic id, name).
    pub fn topics(&self) -> [(u16, String); 2] {
        [
            (self.source_id(), self.name.clone()),
            (self.twin_id(), self.twin_name()),
        ]
    }
}

/// A topic's directory under `<data-dir>/topics`: `<topic_id>-<crc32 of its name, 8 hex
/// digits>`. Not the name itself: a 255-byte name (plus `.dlq`) does not fit a file name
/// (NAME_MAX).
pub fn topic_dir(topics_dir: &Path, topic_id: u16, name: &str) -> PathBuf {
    topics_dir.join(format!(
        "{topic_id}-{:08x}",
        crc32fast::hash(name.as_bytes())
    ))
}

/// The topic id and name CRC of a directory named by [`topic_dir`].
fn parse_topic_dir(file_name: &str) -> Option<(u16, u32)> {
    let (id, crc) = file_name.split_once('-')?;
    let canonical = |t: &str, ok: fn(&u8) -> bool| !t.is_empty() && t.bytes().all(|b| ok(&b));
    if !canonical(id, u8::is_ascii_digit) || id.starts_with('0') {
        return None;
    }
    let lower_hex = |b: &u8| b.is_ascii_digit() || (b'a'..=b'f').contains(b);
    if crc.len() != DIR_CRC_HEX_DIGITS || !canonical(crc, lower_hex) {
        return None;
    }
    Some((id.parse().ok()?, u32::from_str_radix(crc, 16).ok()?))
}

pub fn partition_dir(topics_dir: &Path, topic_id: u16, name: &str, index: u16) -> PathBuf {
    topic_dir(topics_dir, topic_id, name).join(index.to_string())
}

pub fn source_id(pair: u16) -> u16 {
    pair * 2 + 1
}

/// Which pair a topic id belongs to, and whether it names the twin.
pub fn pair_of(topic_id: u16) -> Option<(u16, bool)> {
    if topic_id == 0 {
        return None;
    }
    Some(((topic_id - 1) / 2, topic_id.is_multiple_of(2)))
}

/// Topic names are 1–255 bytes of `[A-Za-z0-9._-]` (`man/mortarmq.7`, 0x2001).
pub fn valid_name(name: &[u8]) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOPIC_LEN_BYTES
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

#[derive(Debug, Default)]
pub struct Registry {
    by_pair: super::idhash::IdMap<u16, TopicPair>,
    by_name: HashMap<String, u16>,
    next_unused_pair: u16,
    /// Pairs used once and deleted since; reused only when no pair is left unused.
    freed: BTreeSet<u16>,
}

impl Registry {
    pub fn lookup(&self, name: &str) -> Option<&TopicPair> {
        self.by_name.get(name).and_then(|p| self.by_pair.get(p))
    }

    pub fn by_topic_id(&self, topic_id: u16) -> Option<(&TopicPair, bool)> {
        let (pair, twin) = pair_of(topic_id)?;
        self.by_pair.get(&pair).map(|t| (t, twin))
    }

    pub fn pairs(&self) -> impl Iterator<Item = &TopicPair> {
        self.by_pair.values()
    }

    pub fn len(&self) -> usize {
        self.by_pair.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_pair.is_empty()
    }

    /// Registers a new pair; the caller has checked the name is free and valid.
    pub fn create(&mut self, name: &str, partition_count: u16) -> Result<TopicPair, ErrorCode> {
        self.create_avoiding(name, partition_count, &BTreeMap::<u16, ()>::new())
    }

    /// [`create`](Self::create), never reusing a freed pair in `avoid`.
    pub fn create_avoiding<T>(
        &mut self,
        name: &str,
        partition_count: u16,
        avoid: &BTreeMap<u16, T>,
    ) -> Result<TopicPair, ErrorCode> {
        let pair = if self.next_unused_pair < TOPIC_PAIRS_MAX {
            self.next_unused_pair += 1;
            self.next_unused_pair - 1
        } else {
            let reusable = self.freed.iter().find(|p| !avoid.contains_key(p));
            let pair = *reusable.ok_or(ErrorCode::TopicRegistryFull)?;
            self.freed.remove(&pair);
            pair
        };
        Ok(self.insert(pair, name, partition_count))
    }

    /// Names `pair` in both maps; the caller chose a free pair.
    fn insert(&mut self, pair: u16, name: &str, partition_count: u16) -> TopicPair {
        let topic = TopicPair {
            pair,
            name: name.to_string(),
            partition_count,
        };
        self.by_name.insert(topic.name.clone(), pair);
        self.by_pair.insert(pair, topic.clone());
        topic
    }

    /// The pair [`create_avoiding`](Self::create_avoiding) would take now, without
    /// taking it: a cluster's leader names it in the REGISTRY entry every node applies
    /// with [`create_at`](Self::create_at).
    pub fn next_pair<T>(&self, avoid: &BTreeMap<u16, T>) -> Result<u16, ErrorCode> {
        if self.next_unused_pair < TOPIC_PAIRS_MAX {
            return Ok(self.next_unused_pair);
        }
        let reusable = self.freed.iter().find(|p| !avoid.contains_key(p));
        reusable.copied().ok_or(ErrorCode::TopicRegistryFull)
    }

    /// Registers `name` as the pair a cluster's leader chose; `None` when that pair is in
    /// use (every node then refuses the entry alike).
    pub fn create_at(&mut self, pair: u16, name: &str, partition_count: u16) -> Option<TopicPair> {
        if pair >= TOPIC_PAIRS_MAX || self.by_pair.contains_key(&pair) {
            return None;
        }
        if pair >= self.next_unused_pair {
            // Pairs jumped over stay reusable, as if used and deleted.
            self.freed.extend(self.next_unused_pair..pair);
            self.next_unused_pair = pair + 1;
        } else {
            self.freed.remove(&pair);
        }
        Some(self.insert(pair, name, partition_count))
    }

    pub fn delete(&mut self, pair: u16) -> Option<TopicPair> {
        let topic = self.by_pair.remove(&pair)?;
        self.by_name.remove(&topic.name);
        self.freed.insert(pair);
        Some(topic)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = format!(
            "{REGISTRY_MAGIC}\nnext_unused_pair {}\n",
            self.next_unused_pair
        );
        let mut pairs: Vec<_> = self.by_pair.values().collect();
        pairs.sort_by_key(|t| t.pair);
        for t in pairs {
            out.push_str(&format!(
                "topic {} {} {}\n",
                t.pair, t.partition_count, t.name
            ));
        }
        out.into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<Registry, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("registry is not UTF-8: {e}"))?;
        let mut lines = text.lines();
        if lines.next() != Some(REGISTRY_MAGIC) {
            return Err("registry has an unknown header".into());
        }
        let mut reg = Registry::default();
        for line in lines {
            let words: Vec<&str> = line.split(' ').collect();
            match words.as_slice() {
                ["next_unused_pair", n] => {
                    reg.next_unused_pair = n.parse().map_err(|_| format!("bad line: {line}"))?
                }
                ["topic", pair, count, name] => {
                    let pair: u16 = pair.parse().map_err(|_| format!("bad line: {line}"))?;
                    let partition_count = count.parse().map_err(|_| format!("bad line: {line}"))?;
                    if !valid_name(name.as_bytes()) || pair >= TOPIC_PAIRS_MAX {
                        return Err(format!("bad line: {line}"));
                    }
                    let t = TopicPair {
                        pair,
                        name: name.to_string(),
                        partition_count,
                    };
                    reg.by_name.insert(t.name.clone(), pair);
                    reg.by_pair.insert(pair, t);
                }
                _ => return Err(format!("bad line: {line}")),
            }
        }
        reg.freed = (0..reg.next_unused_pair)
            .filter(|p| !reg.by_pair.contains_key(p))
            .collect();
        Ok(reg)
    }
}

/// What a topic file holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicFile {
    pub name: String,
    pub partition_count: u16,
}

impl TopicFile {
    pub fn encode(&self) -> Vec<u8> {
        format!(
            "{TOPIC_MAGIC}\nname {}\npartitions {}\n",
            self.name, self.partition_count
        )
        .into_bytes()
    }

    pub fn decode(bytes: &[u8]) -> Result<TopicFile, String> {
        let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
        let mut lines = text.lines();
        if lines.next() != Some(TOPIC_MAGIC) {
            return Err("unknown header".into());
        }
        let (mut name, mut partition_count) = (None, None);
        for line in lines {
            match line.split_once(' ') {
                // A twin's name is its source's plus ".dlq": it may be longer than a name.
                Some(("name", n))
                    if valid_name(n.strip_suffix(DLQ_SUFFIX).unwrap_or(n).as_bytes()) =>
                {
                    name = Some(n.to_string())
                }
                Some(("partitions", n)) => partition_count = n.parse().ok(),
                _ => return Err(format!("bad line: {line}")),
            }
        }
        match (name, partition_count) {
            (Some(name), Some(partition_count)) if partition_count > 0 => Ok(TopicFile {
                name,
                partition_count,
            }),
            _ => Err("no name or no partition count".into()),
        }
    }
}

/// Writes the topic files of both topics of `pair`, creating their directories.
/// Blocking: fsyncs each file, its directory and `topics_dir`.
pub fn write_topic_files(
    storage: &dyn Storage,
    topics_dir: &Path,
    pair: &TopicPair,
) -> io::Result<()> {
    for (topic_id, name) in pair.topics() {
        let dir = topic_dir(topics_dir, topic_id, &name);
        // A synced topic file is lost all the same if its directory's entry is not.
        create_dir_durable(storage, &dir)?;
        let file = TopicFile {
            name,
            partition_count: pair.partition_count,
        };
        meta::write_atomic(storage, &dir.join(TOPIC_FILE), &file.encode())?;
    }
    // Renamed directories (a repair) are durable once their parent is synced.
    storage.sync_dir(topics_dir)
}

/// Writes the topic files of `pair` when one is missing (directories made before topic
/// files existed), so that a registry lost later is rebuilt with the real names.
/// Returns whether it wrote.
pub fn write_missing_topic_files(
    storage: &dyn Storage,
    topics_dir: &Path,
    pair: &TopicPair,
) -> io::Result<bool> {
    let present = pair.topics().iter().all(|(id, name)| {
        let file = topic_dir(topics_dir, *id, name).join(TOPIC_FILE);
        storage.file_len(&file).is_ok()
    });
    if !present {
        write_topic_files(storage, topics_dir, pair)?;
    }
    Ok(!present)
}

/// A pair as [`RegistryRebuild`] recovers it.
#[derive(Debug)]
pub struct RecoveredPair {
    pub pair: TopicPair,
    /// No topic file named it: its name is `recovered-<source topic id>`.
    pub placeholder: bool,
    /// Its directories as they are named now: (topic id, path).
    found: Vec<(u16, PathBuf)>,
    /// What the operator should know about it.
    pub notes: Vec<String>,
}

/// A registry rebuilt from the topic directories (`mortarctl check --repair`): pair k
/// from directories `2k+1-…` and `2k+2-…`, its partition count from their numbered
/// subdirectories, its name from their topic files.
#[derive(Debug)]
pub struct RegistryRebuild {
    topics_dir: PathBuf,
    pub registry: Registry,
    pub pairs: Vec<RecoveredPair>,
    /// Entries of the topics directory left out of the registry, and why.
    pub ignored: Vec<String>,
}

/// A topic directory found: its path and the name CRC its name carries.
type FoundDir = (PathBuf, u32);

impl RegistryRebuild {
    /// Reads `topics_dir` and plans the registry; writes nothing. Fails on an I/O error
    /// (a directory left out would be deleted at the next start) and when two directories
    /// claim one topic id or two pairs one name: only the operator can tell which is meant.
    pub fn scan(storage: &dyn Storage, topics_dir: &Path) -> Result<RegistryRebuild, String> {
        let (dirs, mut ignored) = list_topic_dirs(storage, topics_dir)?;
        let mut by_pair: BTreeMap<u16, [Option<FoundDir>; 2]> = BTreeMap::new();
        for (id, dir) in dirs {
            let (pair, twin) = pair_of(id).expect("listed topic ids are at least 1");
            by_pair.entry(pair).or_default()[usize::from(twin)] = Some(dir);
        }
        let mut registry = Registry {
            next_unused_pair: by_pair.keys().next_back().map_or(0, |last| last + 1),
            ..Registry::default()
        };
        let mut pairs = Vec::new();
        for (pair, dirs) in by_pair {
            let Some(recovered) = recover_pair(storage, pair, dirs, &mut ignored)? else {
                continue;
            };
            let t = &recovered.pair;
            if registry.by_name.insert(t.name.clone(), pair).is_some() {
                return Err(format!(
                    "two topic pairs are named '{}' (the second is id {}): move the one \
                     that is not wanted out of {} and run again",
                    t.name,
                    t.source_id(),
                    topics_dir.display()
                ));
            }
            registry.by_pair.insert(pair, t.clone());
            pairs.push(recovered);
        }
        registry.freed = (0..registry.next_unused_pair)
            .filter(|p| !registry.by_pair.contains_key(p))
            .collect();
        Ok(RegistryRebuild {
            topics_dir: topics_dir.to_path_buf(),
            registry,
            pairs,
            ignored,
        })
    }

    /// Renames the directories of placeholder-named pairs to match their names, writes
    /// every pair's topic files, then the registry at `registry_path`. The registry goes
    /// last, so a repair cut short by a crash can simply be run again.
    pub fn apply(&self, storage: &dyn Storage, registry_path: &Path) -> io::Result<()> {
        for recovered in &self.pairs {
            let pair = &recovered.pair;
            for (topic_id, path) in &recovered.found {
                let name = pair.name_of(*topic_id != pair.source_id());
                let wanted = topic_dir(&self.topics_dir, *topic_id, &name);
                if *path != wanted {
                    storage.rename(path, &wanted)?;
                }
            }
            // Also syncs the topics directory, which makes the renames durable.
            write_topic_files(storage, &self.topics_dir, pair)?;
        }
        meta::write_atomic(storage, registry_path, &self.registry.encode())
    }
}

/// The topic directories under `topics_dir` by topic id, and the other entries.
fn list_topic_dirs(
    storage: &dyn Storage,
    topics_dir: &Path,
) -> Result<(BTreeMap<u16, FoundDir>, Vec<String>), String> {
    let fail = |e: io::Error| format!("{}: {e}", topics_dir.display());
    let mut dirs = BTreeMap::new();
    let mut ignored = Vec::new();
    for entry in storage.list_dir(topics_dir).map_err(fail)? {
        let path = topics_dir.join(&entry);
        let parsed = parse_topic_dir(&entry)
            .filter(|(id, _)| pair_of(*id).is_some_and(|(pair, _)| pair < TOPIC_PAIRS_MAX));
        let Some((id, crc)) = parsed.filter(|_| storage.is_dir(&path)) else {
            ignored.push(format!("{}: not a topic directory", path.display()));
            continue;
        };
        if let Some((other, _)) = dirs.insert(id, (path.clone(), crc)) {
            return Err(format!(
                "{} and {} both hold topic id {id}: move the one that is not wanted out of \
                 {} and run again",
                other.display(),
                path.display(),
                topics_dir.display()
            ));
        }
    }
    Ok((dirs, ignored))
}

/// Pair `pair` from its source and twin directories (either may be missing); `None`
/// when they hold neither a partition nor a topic file, so there is nothing to keep.
fn recover_pair(
    storage: &dyn Storage,
    pair: u16,
    dirs: [Option<FoundDir>; 2],
    ignored: &mut Vec<String>,
) -> Result<Option<RecoveredPair>, String> {
    let mut found_count = 0;
    for (path, _) in dirs.iter().flatten() {
        found_count = found_count.max(partitions_in(storage, path)?);
    }
    let mut notes = Vec::new();
    let (name, recorded) = match named_by_topic_file(storage, &dirs)? {
        Ok(file) => (Some(file.name), file.partition_count),
        Err(why) => {
            notes.extend(why);
            (None, 0)
        }
    };
    let partition_count = recorded.max(found_count);
    if recorded != 0 && recorded != found_count {
        notes.push(format!(
            "its topic file records {recorded} partitions, its directories hold \
             {found_count}: registered with {partition_count}"
        ));
    }
    let found: Vec<(u16, PathBuf)> = (source_id(pair)..)
        .zip(dirs)
        .filter_map(|(id, dir)| Some((id, dir?.0)))
        .collect();
    if partition_count == 0 {
        for (_, path) in &found {
            ignored.push(format!(
                "{}: no partition and no topic file",
                path.display()
            ));
        }
        return Ok(None);
    }
    let placeholder = name.is_none();
    let name = name.unwrap_or_else(|| format!("{RECOVERED_NAME_PREFIX}{}", source_id(pair)));
    Ok(Some(RecoveredPair {
        pair: TopicPair {
            pair,
            name,
            partition_count,
        },
        placeholder,
        found,
        notes,
    }))
}

/// Partitions in a topic directory: one more than its highest numbered subdirectory.
fn partitions_in(storage: &dyn Storage, dir: &Path) -> Result<u16, String> {
    let fail = |e: io::Error| format!("{}: {e}", dir.display());
    let mut count = 0;
    for entry in storage.list_dir(dir).map_err(fail)? {
        let index = Some(entry.as_str())
            .filter(|n| *n == "0" || !n.starts_with('0'))
            .and_then(|n| n.parse::<u16>().ok());
        // Anything else (the topic file) is no partition.
        if let Some(next) = index
            .and_then(|i| i.checked_add(1))
            .filter(|_| storage.is_dir(&dir.join(&entry)))
        {
            count = count.max(next);
        }
    }
    Ok(count)
}

/// The source name (and recorded partition count) the topic files of a pair's
/// directories give, the source's first. `Err` inside: why none does.
fn named_by_topic_file(
    storage: &dyn Storage,
    dirs: &[Option<FoundDir>; 2],
) -> Result<Result<TopicFile, Vec<String>>, String> {
    let mut why = Vec::new();
    for (twin, found) in [false, true].into_iter().zip(dirs) {
        let Some((dir, crc)) = found else { continue };
        let path = dir.join(TOPIC_FILE);
        let file = match meta::read_checked(storage, &path) {
            Ok(Some(bytes)) => TopicFile::decode(&bytes)
                .map_err(|e| format!("{}: {e}", path.display()))
                .and_then(|file| source_of(file, twin, *crc, &path)),
            Ok(None) => Err(format!("{} has no topic file", dir.display())),
            // Damaged: the name is lost, the data is not.
            Err(e) if e.kind() == io::ErrorKind::InvalidData => Err(e.to_string()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        match file {
            Ok(file) => return Ok(Ok(file)),
            Err(e) => why.push(e),
        }
    }
    Ok(Err(why))
}

/// The source topic a topic file at `path` describes; it counts only when the CRC of the
/// name it holds is the one in its directory's name (`dir_crc`).
fn source_of(file: TopicFile, twin: bool, dir_crc: u32, path: &Path) -> Result<TopicFile, String> {
    let refuse = |why: &str| format!("{} names '{}', {why}", path.display(), file.name);
    if crc32fast::hash(file.name.as_bytes()) != dir_crc {
        return Err(refuse("whose CRC is not its directory's"));
    }
    let source = if twin {
        file.name.strip_suffix(DLQ_SUFFIX)
    } else {
        Some(file.name.as_str())
    };
    match source.filter(|n| valid_name(n.as_bytes()) && !n.ends_with(DLQ_SUFFIX)) {
        Some(name) => Ok(TopicFile {
            name: name.to_string(),
            partition_count: file.partition_count,
        }),
        None if twin => Err(refuse("not a dead-letter twin's name")),
        None => Err(refuse("not a source topic's name")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::FsStorage;
    use std::fs;

    #[test]
    fn pairs_are_odd_source_even_twin_lowest_never_used_first() {
        let mut r = Registry::default();
        let a = r.create("a", 1).unwrap();
        let b = r.create("b", 2).unwrap();
        assert_eq!((a.source_id(), a.twin_id()), (1, 2));
        assert_eq!((b.source_id(), b.twin_id()), (3, 4));
        r.delete(a.pair);
        // A freed pair is not reused while never-used pairs remain.
        assert_eq!(r.create("c", 1).unwrap().source_id(), 5);
        assert_eq!(pair_of(4), Some((1, true)));
        assert_eq!(pair_of(5), Some((2, false)));
        assert_eq!(pair_of(0), None);
    }

    #[test]
    fn freed_pairs_are_reused_lowest_first_only_when_full() {
        let mut r = Registry {
            next_unused_pair: TOPIC_PAIRS_MAX - 1,
            ..Registry::default()
        };
        r.create("last", 1).unwrap();
        assert_eq!(r.create("x", 1), Err(ErrorCode::TopicRegistryFull));
        r.freed.insert(7);
        r.freed.insert(3);
        assert_eq!(r.create("y", 1).unwrap().pair, 3);
    }

    #[test]
    fn registry_file_round_trips() {
        let mut r = Registry::default();
        r.create("orders", 3).unwrap();
        let gone = r.create("tmp", 1).unwrap();
        r.create("logs.v2", 64).unwrap();
        r.delete(gone.pair);
        let back = Registry::decode(&r.encode()).unwrap();
        assert_eq!(back.encode(), r.encode());
        assert_eq!(back.lookup("orders").unwrap().partition_count, 3);
        assert!(back.freed.contains(&gone.pair));
        assert!(Registry::decode(b"garbage").is_err());
    }

    #[test]
    fn names_follow_the_registry_rule() {
        assert!(valid_name(b"orders.v1_a-b"));
        assert!(!valid_name(b""));
        assert!(!valid_name(b"a b"));
        assert!(!valid_name("é".as_bytes()));
        assert!(!valid_name(&[b'a'; 256]));
        assert!(valid_name(&[b'a'; 255]));
    }

    #[test]
    fn topic_files_round_trip_and_refuse_garbage() {
        let file = TopicFile {
            name: "orders.dlq".into(),
            partition_count: 4,
        };
        assert_eq!(
            file.encode(),
            b"mortar-topic 1\nname orders.dlq\npartitions 4\n"
        );
        assert_eq!(TopicFile::decode(&file.encode()).unwrap(), file);
        let twin_of_longest = format!("{}{DLQ_SUFFIX}", "a".repeat(MAX_TOPIC_LEN_BYTES));
        let long = format!("mortar-topic 1\nname {twin_of_longest}\npartitions 1\n");
        assert!(TopicFile::decode(long.as_bytes()).is_ok());
        for bad in [
            &b"mortar-topic 2\nname a\npartitions 1\n"[..],
            b"mortar-topic 1\nname a b\npartitions 1\n",
            b"mortar-topic 1\nname a\npartitions 0\n",
            b"mortar-topic 1\nname a\n",
            b"mortar-topic 1\npartitions 1\n",
            b"mortar-topic 1\nname a\npartitions 1\nextra\n",
        ] {
            assert!(
                TopicFile::decode(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn topic_directory_names_parse_only_in_their_canonical_form() {
        let crc = crc32fast::hash(b"orders");
        let dir = topic_dir(Path::new("t"), 7, "orders");
        let name = dir.file_name().unwrap().to_str().unwrap();
        assert_eq!(parse_topic_dir(name), Some((7, crc)));
        for bad in [
            "07-0000abcd",
            "0-0000abcd",
            "7-0000ABCD",
            "7-abcd",
            "7",
            "x-0000abcd",
        ] {
            assert_eq!(parse_topic_dir(bad), None, "{bad}");
        }
    }

    /// Makes topic directory `id` for `name` with `partitions` numbered subdirectories
    /// and, when `file` is given, a topic file naming it.
    fn make_dir(topics: &Path, id: u16, name: &str, partitions: u16, file: Option<&str>) {
        let dir = topic_dir(topics, id, name);
        for p in 0..partitions {
            fs::create_dir_all(dir.join(p.to_string())).unwrap();
        }
        fs::create_dir_all(&dir).unwrap();
        if let Some(named) = file {
            let f = TopicFile {
                name: named.into(),
                partition_count: partitions.max(1),
            };
            meta::write_atomic(&FsStorage, &dir.join(TOPIC_FILE), &f.encode()).unwrap();
        }
    }

    #[test]
    fn a_registry_is_rebuilt_from_topic_directories() {
        let dir = tempfile::tempdir().unwrap();
        let topics = dir.path().join("topics");
        // Pair 0: both topic files. Pair 2: only the twin's, and the twin has more
        // partitions on disk. Pair 4: none (an older version's directories).
        make_dir(&topics, 1, "orders", 2, Some("orders"));
        make_dir(&topics, 2, "orders.dlq", 2, Some("orders.dlq"));
        make_dir(&topics, 5, "logs", 1, None);
        make_dir(&topics, 6, "logs.dlq", 3, Some("logs.dlq"));
        make_dir(&topics, 9, "old", 1, None);
        make_dir(&topics, 10, "old.dlq", 1, None);
        fs::write(topics.join("stray"), b"x").unwrap();
        let rebuild = RegistryRebuild::scan(&FsStorage, &topics).unwrap();
        let reg = &rebuild.registry;
        assert_eq!(reg.lookup("orders").unwrap().partition_count, 2);
        assert_eq!(reg.lookup("orders").unwrap().pair, 0);
        assert_eq!(reg.lookup("logs").unwrap().partition_count, 3);
        assert_eq!(reg.lookup("recovered-9").unwrap().pair, 4);
        assert_eq!(reg.next_unused_pair, 5);
        assert_eq!(reg.freed, [1, 3].into());
        let placeholders: Vec<_> = rebuild.pairs.iter().filter(|p| p.placeholder).collect();
        assert_eq!(placeholders.len(), 1);
        assert_eq!(
            placeholders[0].notes.len(),
            2,
            "{:?}",
            placeholders[0].notes
        );
        assert_eq!(rebuild.ignored.len(), 1, "{:?}", rebuild.ignored);

        let registry_path = dir.path().join("registry");
        rebuild.apply(&FsStorage, &registry_path).unwrap();
        let written = meta::read_checked(&FsStorage, &registry_path)
            .unwrap()
            .unwrap();
        assert_eq!(Registry::decode(&written).unwrap().encode(), reg.encode());
        let old = reg.lookup("recovered-9").unwrap();
        for (id, name) in old.topics() {
            let file = topic_dir(&topics, id, &name).join(TOPIC_FILE);
            let back = TopicFile::decode(&meta::read_checked(&FsStorage, &file).unwrap().unwrap());
            assert_eq!(back.unwrap().name, name, "renamed, with a topic file");
        }
        assert!(!topic_dir(&topics, 9, "old").exists());
        // Run again, it finds what it wrote: no placeholder is guessed twice.
        let again = RegistryRebuild::scan(&FsStorage, &topics).unwrap();
        assert_eq!(again.registry.encode(), reg.encode());
        assert!(again.pairs.iter().all(|p| !p.placeholder));
    }

    #[test]
    fn a_rebuild_trusts_no_topic_file_whose_name_is_not_its_directorys() {
        let dir = tempfile::tempdir().unwrap();
        let topics = dir.path().join("topics");
        make_dir(&topics, 1, "orders", 1, Some("billing"));
        let rebuild = RegistryRebuild::scan(&FsStorage, &topics).unwrap();
        assert!(rebuild.pairs[0].placeholder);
        assert!(rebuild.pairs[0].notes[0].contains("'billing'"));
    }

    #[test]
    fn a_rebuild_refuses_two_directories_for_one_topic_id() {
        let dir = tempfile::tempdir().unwrap();
        let topics = dir.path().join("topics");
        make_dir(&topics, 1, "orders", 1, Some("orders"));
        make_dir(&topics, 1, "billing", 1, Some("billing"));
        let e = RegistryRebuild::scan(&FsStorage, &topics).unwrap_err();
        assert!(e.contains("both hold topic id 1"), "{e}");
    }

    #[test]
    fn a_directory_with_neither_partition_nor_topic_file_is_left_out() {
        let dir = tempfile::tempdir().unwrap();
        let topics = dir.path().join("topics");
        make_dir(&topics, 3, "empty", 0, None);
        let rebuild = RegistryRebuild::scan(&FsStorage, &topics).unwrap();
        assert!(rebuild.pairs.is_empty());
        assert_eq!(rebuild.ignored.len(), 1);
        assert_eq!(rebuild.registry.next_unused_pair, 2);
    }
}
