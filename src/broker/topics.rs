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

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use crate::wire::limits::{MAX_TOPIC_LEN_BYTES, TOPIC_PAIRS_MAX};
use crate::wire::ErrorCode;

/// Suffix of a source topic's dead-letter twin.
pub const DLQ_SUFFIX: &str = ".dlq";
const REGISTRY_MAGIC: &str = "mortar-registry 1";

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
        source_id(self.pair) + 1
    }
    pub fn twin_name(&self) -> String {
        format!("{}{DLQ_SUFFIX}", self.name)
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
        let pair = if self.next_unused_pair < TOPIC_PAIRS_MAX {
            self.next_unused_pair += 1;
            self.next_unused_pair - 1
        } else {
            self.freed.pop_first().ok_or(ErrorCode::TopicRegistryFull)?
        };
        let topic = TopicPair {
            pair,
            name: name.to_string(),
            partition_count,
        };
        self.by_name.insert(topic.name.clone(), pair);
        self.by_pair.insert(pair, topic.clone());
        Ok(topic)
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
