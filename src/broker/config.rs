//! What the broker is told at start, and its defaults (the `--help` and `man/mortard.8`
//! defaults of the Storage and Publish flags come from here, the log's and the consume
//! plane's from their own `Default`s).

use std::path::PathBuf;

use crate::consume::ConsumeConfig;
use crate::log::journal::JOURNAL_FILE_BYTES_DEFAULT;
use crate::log::LogConfig;
use crate::wire::Durability;

const MS_PER_DAY: u64 = 24 * 3600 * 1000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    /// `--data-dir`: the log, the topic registry and the group positions.
    pub data_dir: PathBuf,
    /// What a PUB asking for the default durability waits for (`--durability`).
    pub durability: Durability,
    pub log: LogConfig,
    /// `--max-partitions`: the largest partition count a DECLARE may ask for.
    pub max_partitions: u16,
    /// `--producer-ttl`: an idle producer's dedup state is forgotten after this.
    pub producer_ttl_ms: u64,
    /// `--max-producers`: idempotent producers one partition remembers;
    /// a new one past it evicts the one idle longest.
    pub max_producers_per_partition: usize,
    /// `--max-data-size`: cap on the bytes of all segments (0 = none): above it PUB gets
    /// STORAGE_FULL.
    pub max_data_bytes: u64,
    pub consume: ConsumeConfig,
    /// Committed positions are persisted at least this often (`--commit-interval`).
    pub commit_interval_ms: u64,
    /// `--journal-file-size`: a journal file is closed past this size, and a checkpoint
    /// (every segment synced, old journal files removed) is taken each time the journal
    /// grows this much.
    pub journal_file_bytes: u64,
}

impl Default for BrokerConfig {
    fn default() -> Self {
        BrokerConfig {
            data_dir: PathBuf::from("./mortar-data"),
            durability: Durability::Fsynced,
            log: LogConfig::default(),
            max_partitions: 64,
            producer_ttl_ms: 7 * MS_PER_DAY,
            // Far more writers than one partition of a small host sees at once, so only
            // producers long gone are evicted; at most 16 MiB of windows per partition.
            max_producers_per_partition: 1024,
            max_data_bytes: 0,
            consume: ConsumeConfig::default(),
            commit_interval_ms: 1_000,
            journal_file_bytes: JOURNAL_FILE_BYTES_DEFAULT,
        }
    }
}
