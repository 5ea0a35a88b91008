//! Finding a record by time: the first sequence stamped at or after a given moment, for
//! reads that start at a time (`from_time=` of the admin records endpoint).
//!
//! There is no time index on disk: the record index already reaches any sequence in one
//! step, and records are stamped with the broker's receive time as they are appended, so
//! timestamps rise with sequences and a binary search over the sequences finds the
//! moment in about log2(records) reads (at most 64), each one record, CRC-checked.

use super::{PartitionLog, StorageError};

impl PartitionLog {
    /// The first flushed sequence whose timestamp is `time_ms` or later, or
    /// `written_sequence() + 1` when every record is older. Timestamps are taken to rise
    /// with sequences (the broker's receive time); after the wall clock was set back, the
    /// answer is a record at or after `time_ms` but perhaps not the first. A damaged or
    /// unreadable-as-corrupt record counts as older, so the search steps past it.
    pub fn first_sequence_at_time(&mut self, time_ms: u64) -> Result<u64, StorageError> {
        let (mut low, mut high) = (self.first_sequence(), self.written_sequence() + 1);
        while low < high {
            let mid = low + (high - low) / 2;
            let at_or_after = match self.read_one(mid) {
                Ok(Some(r)) => r.timestamp_ms >= time_ms,
                Ok(None) | Err(StorageError::Corrupt { .. }) => false,
                Err(e) => return Err(e),
            };
            if at_or_after {
                high = mid;
            } else {
                low = mid + 1;
            }
        }
        Ok(low)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FsStorage, LogConfig, RecordView};
    use super::*;

    /// Records 1..=n stamped 10, 20, ... (two equal stamps at 5 and 6), in segments of
    /// 300 bytes so that the search crosses segments; every third flush is separate.
    fn log_with(dir: &std::path::Path, n: u64) -> PartitionLog {
        let config = LogConfig {
            segment_size_bytes: 300,
            retention_size_bytes: 0,
            retention_age_ms: 0,
        };
        let (mut log, _) = PartitionLog::open(&FsStorage::shared(), dir, config).unwrap();
        for s in 1..=n {
            let stamp = if s == 6 { 50 } else { s * 10 };
            let rec = RecordView {
                sequence: s,
                timestamp_ms: stamp,
                producer_id: 0,
                producer_seq: 0,
                flags: 0,
                key: b"",
                value: b"a value of some length",
            };
            log.append(&rec).unwrap();
            if s % 3 == 0 {
                log.flush().unwrap();
            }
        }
        log.flush().unwrap();
        log
    }

    #[test]
    fn the_first_record_at_or_after_a_time() {
        let tmp = tempfile::TempDir::new().unwrap();
        let mut log = log_with(tmp.path(), 40);
        assert!(log.stats().segments >= 3, "{:?}", log.stats());
        let at = |log: &mut PartitionLog, t| log.first_sequence_at_time(t).unwrap();
        assert_eq!(at(&mut log, 0), 1);
        assert_eq!(at(&mut log, 10), 1);
        assert_eq!(at(&mut log, 11), 2);
        assert_eq!(at(&mut log, 50), 5, "the first of two equal stamps");
        assert_eq!(at(&mut log, 51), 7);
        assert_eq!(at(&mut log, 400), 40);
        assert_eq!(at(&mut log, 401), 41, "all older: one past the end");
        let tmp = tempfile::TempDir::new().unwrap();
        let mut empty = log_with(tmp.path(), 0);
        assert_eq!(at(&mut empty, 5), 1);
    }
}
