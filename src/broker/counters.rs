//! The broker's counters (read by the admin room through reactor snapshots) and the
//! bucket bounds of its histograms.

/// Upper bounds (µs) of the fsync latency histogram buckets; a last bucket is +Inf.
pub const FSYNC_LATENCY_BUCKETS_US: [u64; 12] = [
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 1_000_000,
];
/// Upper bounds of the records-per-fsync histogram buckets; a last bucket is +Inf.
pub const FSYNC_BATCH_BUCKETS: [u64; 11] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024];

/// Index of the histogram bucket `value` falls in (the last index is +Inf).
pub fn bucket_of(bounds: &[u64], value: u64) -> usize {
    bounds
        .iter()
        .position(|&b| value <= b)
        .unwrap_or(bounds.len())
}

/// Counters the broker keeps; the admin room reads copies of them.
#[derive(Debug, Default, Clone)]
pub struct BrokerCounters {
    pub pubs: u64,
    pub pubs_deduplicated: u64,
    pub pubs_non_idempotent: u64,
    pub records_appended: u64,
    pub fsyncs: u64,
    pub fsync_records: u64,
    pub fsync_failures: u64,
    pub fsync_micros_total: u64,
    /// The longest fdatasync since start.
    pub fsync_micros_max: u64,
    /// fdatasync latency histogram: counts per bucket of [`FSYNC_LATENCY_BUCKETS_US`].
    pub fsync_latency: [u64; FSYNC_LATENCY_BUCKETS_US.len() + 1],
    /// Records covered per fdatasync: counts per bucket of [`FSYNC_BATCH_BUCKETS`].
    pub fsync_batch: [u64; FSYNC_BATCH_BUCKETS.len() + 1],
    pub recovery_truncations: u64,
    pub recovery_truncated_bytes: u64,
    pub producers_expired: u64,
    /// Idempotent producers forgotten past `--max-producers`.
    pub producers_evicted: u64,
    pub dead_letters_appended: u64,
    /// Corrupt records met (start-up scans and reads).
    pub corrupt_records_found: u64,
    /// Records the journal gave back to partitions that lost them (start-up).
    pub journal_records_replayed: u64,
    /// Journal entries that could not be replayed: their partition ends before them.
    pub journal_replay_gaps: u64,
    /// Checkpoints completed: every segment synced, old journal files let go.
    pub checkpoints: u64,
}
