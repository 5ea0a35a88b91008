//! Purge: every flushed record of a partition goes, its sequences are never given again.
//!
//! The active segment is sealed and a new, empty one starts at the next sequence (as a
//! roll makes it); the older segments leave memory at once, so nothing reads them
//! again. Their files are unlinked by [`PurgeFiles::run`] on an fsync worker, in an
//! order that a crash at any point cannot turn into reused sequences:
//!
//! 1. fdatasync the new segment and its index, then fsync the directory: the new
//!    segment, whose name carries the next sequence, is on disk before anything goes;
//! 2. unlink the old segments oldest first, `.log` before `.idx` (as retention does);
//! 3. fsync the directory: the purge is durable, and only then is it answered.
//!
//! A crash before 3 may bring some old segments back: recovery finds them contiguous
//! with the new one (oldest first means only a prefix can be gone), and the records
//! reappear, which is what an unanswered purge may do. Records still pending in the
//! write buffer are not purged: they flush into the new segment.

use std::io;
use std::path::PathBuf;
use std::sync::Arc;

use super::storage::{FileRef, Storage};
use super::{PartitionLog, StorageError};

/// The file work of one partition's purge, for an fsync worker.
#[derive(Debug)]
pub struct PurgeFiles {
    storage: Arc<dyn Storage>,
    dir: PathBuf,
    /// The new segment's `.log` and `.idx`, synced before anything is unlinked.
    new_files: Vec<FileRef>,
    /// The old segments' files, oldest first, each `.log` before its `.idx`.
    remove: Vec<PathBuf>,
    /// Records dropped, for the report.
    pub records: u64,
    pub bytes: u64,
}

impl PurgeFiles {
    /// Steps 1 to 3 of the module doc. Blocks: an fsync worker's job.
    pub fn run(&self) -> io::Result<()> {
        for f in &self.new_files {
            f.sync_data()?;
        }
        self.storage.sync_dir(&self.dir)?;
        for path in &self.remove {
            match self.storage.remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        self.storage.sync_dir(&self.dir)
    }
}

impl PartitionLog {
    /// The purge's file job failed: the old segments' files may still be on disk, and
    /// this log no longer lists them. Removing any newer segment now (a purge, retention)
    /// would leave them before a gap, where recovery cuts the log; so the log refuses
    /// writes, purges and retention until a restart reads the directory again.
    pub fn purge_failed(&mut self, err: &io::Error) {
        log::error!(
            "{}: removing purged segments failed; partition refuses writes until restart: \
             {err}",
            self.dir.display()
        );
        if self.poisoned.is_none() {
            self.poisoned = Some(format!("removing purged segments failed: {err}"));
        }
    }

    /// Drops every flushed record: the first sequence becomes the next one. Returns the
    /// files to sync and unlink ([`PurgeFiles::run`]), or `None` when nothing was kept.
    pub fn purge(&mut self) -> Result<Option<PurgeFiles>, StorageError> {
        self.purge_below(u64::MAX)
    }

    /// Drops the segments whose records all lie below `below`, the active one too once
    /// every record it holds is below (it is sealed, and a new one starts at the next
    /// sequence): [`PartitionLog::purge`] with a bound. A cluster node applies a purge
    /// entry with it (`broker::replica::admin`): `below` is where the log ended when the
    /// entry was applied first, so applying it again after a restart, with the records
    /// of later entries held, drops the same segments and no later record. A segment
    /// that holds records on both sides of `below` is kept whole.
    pub fn purge_below(&mut self, below: u64) -> Result<Option<PurgeFiles>, StorageError> {
        self.check_poisoned()?;
        // Staged records are flushed ones too: they go with the rest.
        self.write_staged()?;
        if self.first_sequence() > self.segment_sequence || self.first_sequence() >= below {
            return Ok(None);
        }
        if self.active().record_count > 0 && self.segment_sequence < below {
            self.seal_active_index()?;
            self.flush_roll()?;
        }
        let last = self.segments.len() - 1;
        let keep = (0..last)
            .find(|&i| self.segments[i + 1].first_sequence > below)
            .unwrap_or(last);
        if keep == 0 {
            return Ok(None);
        }
        let old: Vec<_> = self.segments.drain(..keep).collect();
        let mut remove = Vec::with_capacity(2 * old.len());
        let (mut records, mut bytes) = (0, 0);
        for seg in old {
            if seg.is_mapped() {
                self.mapped_segments -= 1;
            }
            records += seg.record_count;
            bytes += seg.len_bytes;
            remove.push(seg.log_path.clone());
            remove.push(seg.idx_path.clone());
        }
        let active = self.active();
        let w = active
            .writer
            .as_ref()
            .expect("the active segment has a writer");
        log::info!(
            "{}: purged {records} records ({bytes} bytes); the log starts at sequence {}",
            self.dir.display(),
            active.first_sequence
        );
        Ok(Some(PurgeFiles {
            storage: Arc::clone(&self.storage),
            dir: self.dir.clone(),
            new_files: vec![Arc::clone(&w.log), Arc::clone(&w.idx)],
            remove,
            records,
            bytes,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::super::{FsStorage, LogConfig, RecordView};
    use super::*;

    fn append(log: &mut PartitionLog, n: u64) {
        for i in 0..n {
            let seq = log.next_sequence();
            let value = i.to_be_bytes();
            let rec = RecordView {
                sequence: seq,
                timestamp_ms: 1_000 + seq,
                producer_id: 0,
                producer_seq: 0,
                flags: 0,
                key: b"",
                value: &value,
            };
            log.append(&rec).unwrap();
        }
        log.flush().unwrap();
    }

    #[test]
    fn a_purge_keeps_sequences_going_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FsStorage::shared();
        let config = LogConfig {
            segment_size_bytes: 200,
            ..LogConfig::default()
        };
        let (mut log, _) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        append(&mut log, 10);
        assert!(log.stats().segments > 1, "several segments to remove");
        let files = log.purge().unwrap().expect("records to purge");
        assert_eq!(files.records, 10);
        log.check_invariants();
        assert_eq!((log.first_sequence(), log.next_sequence()), (11, 11));
        assert_eq!(log.stats().segments, 1);
        assert!(
            log.read_one(5).unwrap().is_none(),
            "purged records are gone"
        );
        files.run().unwrap();
        assert!(log.purge().unwrap().is_none(), "nothing left to purge");
        append(&mut log, 2);
        assert_eq!(log.read_one(12).unwrap().unwrap().sequence, 12);
        drop(log);
        let (mut log, report) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        assert!(report.is_clean(), "{report:?}");
        assert_eq!((log.first_sequence(), log.next_sequence()), (11, 13));
        assert!(log.read_one(10).unwrap().is_none());
        let names = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(names, 3, "one segment, its index, the recovery point");
    }

    #[test]
    fn a_crash_before_the_unlinks_brings_the_records_back_without_reusing_sequences() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FsStorage::shared();
        let config = LogConfig::default();
        let (mut log, _) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        append(&mut log, 4);
        let files = log.purge().unwrap().unwrap();
        // The worker never ran (the process died): the old segment is still on disk.
        drop(files);
        drop(log);
        let (log, _) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        assert_eq!((log.first_sequence(), log.next_sequence()), (1, 5));
    }

    #[test]
    fn a_purge_below_a_bound_applied_again_drops_the_same_records_and_no_later_one() {
        let dir = tempfile::tempdir().unwrap();
        let storage = FsStorage::shared();
        let config = LogConfig::default();
        let (mut log, _) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        append(&mut log, 4);
        let files = log.purge_below(5).unwrap().expect("records to purge");
        assert_eq!(files.records, 4);
        assert_eq!((log.first_sequence(), log.next_sequence()), (5, 5));
        append(&mut log, 2);
        // The unlinks never ran: the old segment comes back beside the new records.
        drop(files);
        drop(log);
        let (mut log, _) = PartitionLog::open(&storage, dir.path(), config).unwrap();
        assert_eq!((log.first_sequence(), log.next_sequence()), (1, 7));
        let files = log.purge_below(5).unwrap().expect("the old segment again");
        assert_eq!(files.records, 4);
        assert_eq!((log.first_sequence(), log.next_sequence()), (5, 7));
        assert_eq!(log.read_one(6).unwrap().unwrap().sequence, 6, "kept");
        assert!(log.purge_below(5).unwrap().is_none(), "nothing below 5");
        log.check_invariants();
    }
}
