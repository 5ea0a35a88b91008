//! What the broker is told at start (built from the flags by `config`).

use std::path::PathBuf;

use crate::consume::ConsumeConfig;
use crate::log::LogConfig;
use crate::wire::Durability;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    pub data_dir: PathBuf,
    /// What a PUB asking for the default durability waits for (`--durability`).
    pub durability: Durability,
    pub log: LogConfig,
    pub max_partitions: u16,
    pub producer_ttl_ms: u64,
    /// Cap on the bytes of all segments (0 = none): above it PUB gets STORAGE_FULL.
    pub max_data_bytes: u64,
    pub consume: ConsumeConfig,
    /// Committed positions are persisted at least this often (`--commit-interval`).
    pub commit_interval_ms: u64,
}
