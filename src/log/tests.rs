//! Tests of the partition log against real files in temporary directories.

use super::segment::{decode_index, index_path, segment_path, INDEX_UNWRITTEN_BYTES_MAX};
use super::*;
use proptest::prelude::*;
use std::fs::{self, OpenOptions};
use tempfile::TempDir;

const ENOSPC: i32 = 28;
const EIO: i32 = 5;

fn cfg(segment_size_bytes: u64) -> LogConfig {
    LogConfig {
        segment_size_bytes,
        retention_size_bytes: 0,
        retention_age_ms: 0,
    }
}

/// Deterministic value of varying size for `sequence`.
fn value_for(sequence: u64) -> Vec<u8> {
    format!("v{sequence}:")
        .repeat((sequence % 7 + 1) as usize)
        .into_bytes()
}

fn append_value(log: &mut PartitionLog, ts: u64, value: &[u8]) -> u64 {
    let rec = RecordView {
        sequence: log.next_sequence(),
        timestamp_ms: ts,
        producer_id: 42,
        producer_seq: ts,
        flags: 1,
        key: b"key",
        value,
    };
    log.append(&rec).unwrap()
}

/// Appends sequences `from..from+n` with `value_for`, flushing every `batch` records.
fn append_range(log: &mut PartitionLog, n: u64, batch: u64) {
    for k in 0..n {
        let seq = log.next_sequence();
        assert_eq!(append_value(log, seq * 1000, &value_for(seq)), seq);
        log.check_invariants();
        if (k + 1) % batch == 0 {
            log.flush().unwrap();
            log.check_invariants();
        }
    }
    log.flush().unwrap();
    log.check_invariants();
}

fn collect(
    log: &mut PartitionLog,
    from: u64,
    max_records: usize,
    max_bytes: usize,
) -> (Vec<(u64, Vec<u8>)>, ReadOutcome) {
    let mut out = Vec::new();
    let outcome = log
        .read(from, max_records, max_bytes, |r| {
            out.push((r.sequence, r.value.to_vec()))
        })
        .unwrap();
    (out, outcome)
}

/// Asserts the log holds exactly sequences `first..=last`, each with `value_for`.
fn assert_holds(log: &mut PartitionLog, first: u64, last: u64) {
    let (got, outcome) = collect(log, first, usize::MAX, usize::MAX);
    let want: Vec<(u64, Vec<u8>)> = (first..=last).map(|s| (s, value_for(s))).collect();
    assert_eq!(got, want);
    assert_eq!(outcome.next_sequence, last + 1);
    assert_eq!(log.written_sequence(), last);
    assert_eq!(log.next_sequence(), last + 1);
}

fn log_files(dir: &Path) -> Vec<u64> {
    let mut v: Vec<u64> = fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let (stem, ext) = name.split_once('.')?;
            (ext == "log").then(|| stem.parse().unwrap())
        })
        .collect();
    v.sort_unstable();
    v
}

/// 30 records in segments of 300 bytes (at least 3 segments), then opened once more:
/// opening makes every segment durable and puts the recovery point in the last one.
fn durable_segments(dir: &Path) -> Vec<u64> {
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 30, 1);
    drop(log);
    drop(open(dir, cfg(300)).0);
    let segs = log_files(dir);
    assert!(segs.len() >= 3);
    segs
}

fn open(dir: &Path, config: LogConfig) -> (PartitionLog, RecoveryReport) {
    PartitionLog::open(&FsStorage::shared(), dir, config).unwrap()
}

#[test]
fn new_log_starts_at_one_and_hides_unflushed_records() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join("topic-0");
    let (mut log, report) = open(&dir, cfg(4096));
    assert!(report.is_clean());
    assert_eq!(
        (
            log.first_sequence(),
            log.next_sequence(),
            log.written_sequence()
        ),
        (1, 1, 0)
    );
    assert_eq!(append_value(&mut log, 1, b"a"), 1);
    assert_eq!(append_value(&mut log, 2, b"b"), 2);
    assert_eq!(log.next_sequence(), 3);
    assert!(log.pending_bytes() > 0);
    let (got, _) = collect(&mut log, 1, 10, 1 << 20);
    assert!(got.is_empty(), "nothing is visible before flush");
    assert!(log.read_one(1).unwrap().is_none());
    log.flush().unwrap();
    assert_eq!((log.pending_bytes(), log.written_sequence()), (0, 2));
    assert_eq!(log.read_one(2).unwrap().unwrap().value, b"b");
    let (got, outcome) = collect(&mut log, 0, 10, 1 << 20);
    assert_eq!(
        (got.len(), outcome.skipped),
        (2, 0),
        "sequence 0 never existed"
    );
}

#[test]
fn round_trip_across_rolls_ranges_and_limits() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(300));
    append_range(&mut log, 60, 7);
    assert!(log.stats().segments >= 5, "stats: {:?}", log.stats());
    assert_eq!(log_files(tmp.path()).len() as u32, log.stats().segments);
    assert_holds(&mut log, 1, 60);

    // Ranges start anywhere, including mid-segment.
    let (got, outcome) = collect(&mut log, 17, 9, usize::MAX);
    assert_eq!(
        got.iter().map(|r| r.0).collect::<Vec<_>>(),
        (17..26).collect::<Vec<_>>()
    );
    assert_eq!(
        (outcome.records, outcome.next_sequence, outcome.skipped),
        (9, 26, 0)
    );

    // max_bytes counts key + value; stops before the record that would pass it.
    let two = 3 + value_for(5).len() + 3 + value_for(6).len();
    let (got, outcome) = collect(&mut log, 5, 100, two);
    assert_eq!(got.len(), 2);
    assert_eq!(outcome.bytes, two);
    // One record is always delivered, even when alone it is over max_bytes.
    let (got, outcome) = collect(&mut log, 5, 100, 0);
    assert_eq!((got.len(), outcome.next_sequence), (1, 6));
    let (got, _) = collect(&mut log, 5, 0, usize::MAX);
    assert!(got.is_empty(), "max_records 0 reads nothing");
    // Past the end: nothing, and next_sequence stays where it was asked.
    let (got, outcome) = collect(&mut log, 61, 10, usize::MAX);
    assert!(got.is_empty());
    assert_eq!(outcome.next_sequence, 61);

    let r = log.read_one(33).unwrap().unwrap();
    assert_eq!(
        (r.sequence, r.key, r.value, r.flags),
        (33, &b"key"[..], &value_for(33)[..], 1)
    );
    assert_eq!(
        (r.timestamp_ms, r.producer_id, r.producer_seq),
        (33_000, 42, 33_000)
    );
    assert!(log.read_one(0).unwrap().is_none());
    assert!(log.read_one(61).unwrap().is_none());
}

#[test]
fn a_record_larger_than_a_segment_gets_a_segment_of_its_own() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(200));
    append_value(&mut log, 1, b"small");
    let big = vec![7u8; 1000];
    append_value(&mut log, 2, &big);
    append_value(&mut log, 3, b"after");
    log.flush().unwrap();
    assert_eq!(log_files(tmp.path()), vec![1, 2, 3]);
    assert_eq!(log.read_one(2).unwrap().unwrap().value, &big[..]);
    let len2 = fs::metadata(segment_path(tmp.path(), 2)).unwrap().len();
    assert_eq!(
        len2,
        (SEGMENT_HEADER_BYTES + RECORD_OVERHEAD_BYTES + 3 + 1000) as u64
    );
    drop(log);
    let (mut log, report) = open(tmp.path(), cfg(200));
    assert!(report.is_clean());
    assert_eq!(log.next_sequence(), 4);
    assert_eq!(log.read_one(2).unwrap().unwrap().value, &big[..]);
}

#[test]
fn reads_see_records_flushed_after_the_active_segment_was_mapped() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(1 << 20));
    append_range(&mut log, 3, 1);
    assert_holds(&mut log, 1, 3); // maps the active segment
    append_range(&mut log, 400, 50);
    assert_holds(&mut log, 1, 403); // must remap it
}

#[test]
fn a_reader_at_the_tail_remaps_the_active_segment_a_few_times_not_after_every_flush() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(1 << 20));
    // A new map is made before the old one goes, so a remap always changes the address.
    let (mut remaps, mut previous) = (0, std::ptr::null());
    for _ in 0..500 {
        append_range(&mut log, 1, 1);
        let last = log.segment_sequence;
        let value = log.read_one(last).unwrap().expect("flushed").value.to_vec();
        assert_eq!(value, value_for(last));
        let seg = log.segments.last().unwrap();
        let map = seg.log_map.as_deref().unwrap().as_ptr();
        remaps += usize::from(map != previous);
        previous = map;
        assert!(
            seg.log_bytes().len() as u64 == seg.len_bytes,
            "cut at the flushed end"
        );
    }
    // About 40 KiB in one segment: one map of 64 KiB.
    assert!(remaps <= 2, "{remaps} maps for 500 flushes");
    assert_holds(&mut log, 1, 500);
}

#[test]
fn reopen_after_clean_close_keeps_everything() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(256));
    append_range(&mut log, 40, 3);
    append_value(&mut log, 0, b"never flushed");
    let segments = log.stats().segments;
    drop(log);
    let (mut log, report) = open(tmp.path(), cfg(256));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.indexes_rebuilt, 0);
    assert_eq!((report.first_sequence, report.next_sequence), (1, 41));
    assert_eq!(log.stats().segments, segments);
    assert_eq!(log.synced_sequence(), 40, "open syncs what it keeps");
    assert_holds(&mut log, 1, 40);
    append_range(&mut log, 5, 2);
    drop(log);
    let (mut log, _) = open(tmp.path(), cfg(256));
    assert_holds(&mut log, 1, 45);
}

/// The active segment's index entries wait in memory: reads find them there, a page of
/// them or a sync job writes them, and a crash before that costs only a rebuild.
#[test]
fn index_entries_wait_in_memory_until_a_page_of_them_or_a_sync() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let idx_entries = || fs::metadata(index_path(dir, 1)).unwrap().len() / 4;
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 10, 1);
    assert_eq!(idx_entries(), 0, "ten flushes, no index write");
    assert_holds(&mut log, 1, 10);
    let job = log.take_sync_job().expect("records to sync");
    assert_eq!(
        idx_entries(),
        10,
        "the point's index sync covers every entry"
    );
    job.run().unwrap();
    log.sync_done(job.upto_sequence);

    let page = INDEX_UNWRITTEN_BYTES_MAX as u64 / 4;
    append_range(&mut log, page + 5, page + 5);
    assert_eq!(
        idx_entries(),
        10 + page + 5,
        "a full page is written with its flush"
    );
    append_range(&mut log, 7, 7);
    assert_eq!(idx_entries(), 10 + page + 5);
    assert_holds(&mut log, 1, page + 22);

    std::mem::forget(log); // a crash: the unwritten entries are gone, the records are not
    let (mut log, report) = open(dir, cfg(1 << 20));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.indexes_rebuilt, 1);
    assert_eq!(idx_entries(), page + 22);
    assert_holds(&mut log, 1, page + 22);
}

#[test]
fn missing_short_or_garbage_indexes_are_rebuilt() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 50, 4);
    drop(log);
    let segs = log_files(dir);
    assert!(segs.len() >= 5);
    let last = *segs.last().unwrap();

    // Missing (closed and last), truncated, torn mid-entry, garbage, stale-longer.
    fs::remove_file(index_path(dir, segs[0])).unwrap();
    fs::remove_file(index_path(dir, last)).unwrap();
    let idx1 = index_path(dir, segs[1]);
    let bytes = fs::read(&idx1).unwrap();
    fs::write(&idx1, &bytes[..4]).unwrap();
    let idx2 = index_path(dir, segs[2]);
    let bytes = fs::read(&idx2).unwrap();
    fs::write(&idx2, &bytes[..bytes.len() - 1]).unwrap();
    let idx3 = index_path(dir, segs[3]);
    let n = fs::read(&idx3).unwrap().len();
    let garbage: Vec<u8> = (0..n)
        .map(|i| (i as u8).wrapping_mul(151).wrapping_add(7))
        .collect();
    fs::write(&idx3, garbage).unwrap();
    let idx4 = index_path(dir, segs[4]);
    let mut bytes = fs::read(&idx4).unwrap();
    bytes.extend_from_slice(&u32::MAX.to_be_bytes());
    fs::write(&idx4, bytes).unwrap();

    let (mut log, report) = open(dir, cfg(300));
    assert!(
        report.is_clean(),
        "index damage is not data loss: {report:?}"
    );
    assert_eq!(report.indexes_rebuilt, 6, "{report:?}");
    assert_holds(&mut log, 1, 50);
    for s in 1..=50 {
        assert_eq!(log.read_one(s).unwrap().unwrap().value, &value_for(s)[..]);
    }
    drop(log);
    assert!(check_partition(&FsStorage, dir, None).unwrap().is_clean());
    let (_, report) = open(dir, cfg(300));
    assert_eq!(
        report.indexes_rebuilt, 0,
        "rebuilt indexes are trusted next time"
    );
}

#[test]
fn a_flipped_byte_in_a_closed_segment_is_reported_as_corrupt_on_read() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    // Only segments before the recovery point may skip the full read.
    let segs = durable_segments(dir);
    let positions = decode_index(&fs::read(index_path(dir, segs[0])).unwrap()).entries;
    assert!(
        positions.len() >= 2,
        "record 1 must not be the segment's last"
    );
    let path = segment_path(dir, segs[0]);
    let mut bytes = fs::read(&path).unwrap();
    let at = positions[0] as usize + RECORD_OVERHEAD_BYTES + 3 + 1; // inside value 1
    bytes[at] ^= 0x01;
    fs::write(&path, &bytes).unwrap();

    // The cheap open-time check reads only each closed segment's last record.
    let (mut log, report) = open(dir, cfg(300));
    assert!(report.is_clean());
    let err = log.read(1, 10, usize::MAX, |_| {}).unwrap_err();
    match &err {
        StorageError::Corrupt {
            path: p,
            position,
            reason,
        } => {
            assert_eq!((p, *position), (&path, positions[0] as u64));
            assert!(reason.contains("crc"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(matches!(log.read_one(1), Err(StorageError::Corrupt { .. })));
    // Everything else still reads.
    assert_eq!(log.read_one(2).unwrap().unwrap().value, &value_for(2)[..]);
    let (got, _) = collect(&mut log, 2, usize::MAX, usize::MAX);
    assert_eq!(got.len(), 29);
    drop(log);

    let check = check_partition(&FsStorage, dir, None).unwrap();
    // As recovery would: the bad record is kept in place and nothing is to change.
    assert_eq!(check.problems.len(), 1, "{:?}", check.problems);
    assert_eq!(check.problems[0].path, path);
    assert_eq!(check.problems[0].position, positions[0] as u64);
    assert!(check.plan.changes.is_empty(), "{:?}", check.plan);
}

/// Writes records 1..=n (n >= `n_min`, chosen so the last segment holds at least three
/// records and there is a closed segment before it) and returns (n, last segment path, its
/// bytes, its index bytes, position of record n in it).
fn torn_tail_fixture(dir: &Path, n_min: u64) -> (u64, PathBuf, Vec<u8>, Vec<u8>, u64) {
    let (mut log, _) = open(dir, cfg(600));
    loop {
        append_range(&mut log, 1, 1);
        let n = log.written_sequence();
        if n >= n_min && log.segments.len() >= 2 && log.segments.last().unwrap().record_count >= 3 {
            break;
        }
    }
    let n = log.written_sequence();
    drop(log);
    let last = *log_files(dir).last().unwrap();
    let path = segment_path(dir, last);
    let idx = fs::read(index_path(dir, last)).unwrap();
    let last_pos = *decode_index(&idx).entries.last().unwrap() as u64;
    (n, path.clone(), fs::read(&path).unwrap(), idx, last_pos)
}

#[test]
fn a_torn_last_record_is_truncated_at_every_cut_point() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (n, path, bytes, idx, last_pos) = torn_tail_fixture(dir, 20);
    let idx_path = path.with_extension("idx");
    for cut in last_pos..bytes.len() as u64 {
        fs::write(&path, &bytes[..cut as usize]).unwrap();
        fs::write(&idx_path, &idx).unwrap();
        let (mut log, report) = open(dir, cfg(600));
        assert_eq!(log.next_sequence(), n, "cut at {cut}");
        assert_holds(&mut log, 1, n - 1);
        assert_eq!(fs::metadata(&path).unwrap().len(), last_pos);
        if cut > last_pos {
            assert_eq!(report.truncated_bytes, cut - last_pos, "cut at {cut}");
            assert_eq!(report.truncated_at, Some((path.clone(), last_pos)));
            assert_eq!(report.lost_from_sequence, Some(n));
        } else {
            assert!(
                report.is_clean(),
                "a cut at a record boundary loses nothing"
            );
        }
    }
    // After the truncation the log goes on from n, and that survives a reopen.
    let (mut log, _) = open(dir, cfg(600));
    assert_eq!(append_value(&mut log, n * 1000, &value_for(n)), n);
    log.flush().unwrap();
    drop(log);
    let (mut log, report) = open(dir, cfg(600));
    assert!(report.is_clean());
    assert_holds(&mut log, 1, n);
}

#[test]
fn a_flipped_byte_anywhere_in_the_last_record_truncates_it() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (n, path, bytes, idx, last_pos) = torn_tail_fixture(dir, 12);
    let idx_path = path.with_extension("idx");
    for at in last_pos as usize..bytes.len() {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        fs::write(&path, &bad).unwrap();
        fs::write(&idx_path, &idx).unwrap();
        let (mut log, report) = open(dir, cfg(600));
        assert_eq!(log.next_sequence(), n, "flip at {at}");
        assert_eq!(
            report.truncated_at,
            Some((path.clone(), last_pos)),
            "flip at {at}"
        );
        assert_holds(&mut log, 1, n - 1);
    }
}

#[test]
fn garbage_after_the_last_record_and_an_empty_new_segment_are_handled() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(600));
    append_range(&mut log, 10, 1);
    drop(log);
    // Zeros after the tail: what a file system may leave after a crash.
    let last = *log_files(dir).last().unwrap();
    let path = segment_path(dir, last);
    let len = fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len + 100).unwrap();
    drop(f);
    let (mut log, report) = open(dir, cfg(600));
    assert_eq!(report.truncated_bytes, 100);
    assert_holds(&mut log, 1, 10);
    drop(log);
    // A crash right after creating the next segment leaves it empty.
    fs::write(segment_path(dir, 11), b"").unwrap();
    let (mut log, report) = open(dir, cfg(600));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(log.stats().segments as usize, log_files(dir).len());
    assert_holds(&mut log, 1, 10);
    append_range(&mut log, 3, 1);
    assert_holds(&mut log, 1, 13);
    drop(log);
    let (mut log, _) = open(dir, cfg(600));
    assert_holds(&mut log, 1, 13);
}

#[test]
fn a_sequence_gap_between_segments_cuts_the_log_there() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 30, 1);
    drop(log);
    let segs = log_files(dir);
    let victim = segs[segs.len() - 2];
    fs::remove_file(segment_path(dir, victim)).unwrap(); // leaves a gap and an orphan .idx
    let (mut log, report) = open(dir, cfg(300));
    assert_eq!(report.segments_removed, 1);
    assert_eq!(report.orphan_indexes_removed, 1);
    assert_eq!(report.lost_from_sequence, Some(victim));
    assert_holds(&mut log, 1, victim - 1);
    assert_eq!(log_files(dir).len(), segs.len() - 2);
}

#[test]
fn a_bad_record_in_a_closed_segment_with_a_missing_index_cuts_everything_after() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 30, 1);
    drop(log);
    let segs = log_files(dir);
    let positions = decode_index(&fs::read(index_path(dir, segs[1])).unwrap()).entries;
    let path = segment_path(dir, segs[1]);
    let mut bytes = fs::read(&path).unwrap();
    bytes[positions[1] as usize + 20] ^= 0xFF;
    fs::write(&path, bytes).unwrap();
    fs::remove_file(index_path(dir, segs[1])).unwrap();
    let (mut log, report) = open(dir, cfg(300));
    let bad_seq = segs[1] + 1;
    assert_eq!(report.truncated_at, Some((path, positions[1] as u64)));
    assert_eq!(report.segments_removed as usize, segs.len() - 2);
    assert_holds(&mut log, 1, bad_seq - 1);
}

#[test]
fn retention_by_size_deletes_only_whole_closed_segments() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let mut config = cfg(300);
    config.retention_size_bytes = 1000;
    let (mut log, _) = open(dir, config);
    append_range(&mut log, 80, 5);
    let before = log.stats();
    let report = log.enforce_retention(0, u64::MAX).unwrap();
    let after = log.stats();
    assert!(report.segments_deleted > 0);
    assert_eq!(after.segments, before.segments - report.segments_deleted);
    assert_eq!(before.bytes - after.bytes, report.bytes_deleted);
    assert!(after.bytes <= 1000 || after.segments == 1, "{after:?}");
    assert_eq!(report.first_sequence, after.first_sequence);
    assert_eq!(
        log_files(dir)[0],
        after.first_sequence,
        "first retained segment starts it"
    );
    assert!(after.first_sequence > 1);
    // A reader below the new start skips ahead and is told how far.
    let first = after.first_sequence;
    let (got, outcome) = collect(&mut log, 1, 3, usize::MAX);
    assert_eq!(outcome.skipped, first - 1);
    assert_eq!(got[0], (first, value_for(first)));
    assert_holds(&mut log, first, 80);
    // Nothing left to do; then a tiny limit keeps only the active segment.
    assert_eq!(
        log.enforce_retention(0, u64::MAX).unwrap().segments_deleted,
        0
    );
    let mut log2 = {
        drop(log);
        config.retention_size_bytes = 1;
        open(dir, config).0
    };
    log2.enforce_retention(0, u64::MAX).unwrap();
    assert_eq!(log2.stats().segments, 1);
    let active_first = log2.first_sequence();
    assert_holds(&mut log2, active_first, 80);
    drop(log2);
    let (mut log, report) = open(dir, config);
    assert!(report.is_clean());
    assert_eq!(log.first_sequence(), active_first);
    assert_holds(&mut log, active_first, 80);
}

#[test]
fn retention_deletes_no_segment_holding_a_record_past_what_the_caller_saved() {
    let tmp = TempDir::new().unwrap();
    let mut config = cfg(300);
    config.retention_size_bytes = 1;
    let (mut log, _) = open(tmp.path(), config);
    append_range(&mut log, 80, 5);
    let second = log_files(tmp.path())[1];
    // The first segment ends at `second - 1`: saved one short of it, it stays.
    let report = log.enforce_retention(0, second - 2).unwrap();
    assert_eq!((report.segments_deleted, report.waits_for_save), (0, true));
    assert_eq!(log.first_sequence(), 1);
    let report = log.enforce_retention(0, second - 1).unwrap();
    assert_eq!(report.segments_deleted, 1, "only the segment saved through");
    assert!(report.waits_for_save, "the next one is due too");
    assert_eq!(log.first_sequence(), second);
    let report = log.enforce_retention(0, u64::MAX).unwrap();
    assert!(!report.waits_for_save);
    assert_eq!(log.stats().segments, 1);
}

#[test]
fn retention_by_age_uses_each_segments_newest_record() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let mut config = cfg(300);
    config.retention_age_ms = 10_000;
    let (mut log, _) = open(dir, config);
    append_range(&mut log, 60, 1); // record s has timestamp s * 1000
    drop(log);
    let (mut log, _) = open(dir, config); // timestamps must come from disk too
    let now = 60_000;
    let report = log.enforce_retention(now, u64::MAX).unwrap();
    assert!(report.segments_deleted > 0);
    let first = log.first_sequence();
    // The deleted segment before `first` ended at first - 1, which was too old; the first
    // kept segment's newest record is young enough.
    assert!(now - (first - 1) * 1000 > 10_000);
    let seg0_last = log.segments[0].end_sequence() - 1;
    assert!(now - seg0_last * 1000 <= 10_000);
    // Far in the future: everything closed goes, the active segment stays.
    log.enforce_retention(u64::MAX, u64::MAX).unwrap();
    assert_eq!(log.stats().segments, 1);
    assert!(log.written_sequence() == 60);
}

#[test]
fn sync_jobs_cover_written_files_and_failures_poison() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    assert!(log.take_sync_job().is_none(), "nothing flushed yet");
    append_range(&mut log, 2, 2);
    let job = log.take_sync_job().unwrap();
    assert_eq!((job.files.len(), job.upto_sequence), (1, 2));
    assert!(job.sync_dir.is_none(), "open already synced the directory");
    assert!(
        log.take_sync_job().is_none(),
        "nothing new since the last job"
    );
    job.run().unwrap();
    log.sync_done(job.upto_sequence);
    assert_eq!(log.synced_sequence(), 2);

    // Flush across rolls: every file written since, and the directory.
    append_range(&mut log, 12, 12);
    assert!(log.stats().segments >= 3);
    let job = log.take_sync_job().unwrap();
    assert!(job.files.len() >= 3, "{job:?}");
    assert_eq!(job.sync_dir.as_deref(), Some(dir));
    assert_eq!(job.upto_sequence, 14);
    // Work happens on another thread, as in the broker.
    let upto = std::thread::spawn(move || job.run().map(|()| job.upto_sequence))
        .join()
        .unwrap()
        .unwrap();
    log.sync_done(upto);
    assert_eq!(log.synced_sequence(), 14);

    // A later failure is sticky.
    append_range(&mut log, 1, 1);
    let _job = log.take_sync_job().unwrap();
    log.sync_failed(&io::Error::from_raw_os_error(EIO));
    assert!(log.is_poisoned());
    let rec = RecordView {
        sequence: 0,
        timestamp_ms: 0,
        producer_id: 0,
        producer_seq: 0,
        flags: 0,
        key: b"",
        value: b"",
    };
    let err = log.append(&rec).unwrap_err();
    assert!(matches!(err, StorageError::Poisoned { .. }));
    assert!(err.to_string().contains("restart required"), "{err}");
    assert!(matches!(log.flush(), Err(StorageError::Poisoned { .. })));
    assert!(log.take_sync_job().is_none());
    assert_eq!(log.synced_sequence(), 14);
    assert!(log.stats().poisoned);
    assert_holds(&mut log, 1, 15); // reads still work
}

#[test]
fn no_space_during_flush_undoes_the_whole_batch() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 5, 5);
    let files_before = log_files(dir);
    let stats_before = log.stats();
    let last_before = *files_before.last().unwrap();
    let len_before = fs::metadata(segment_path(dir, last_before)).unwrap().len();

    // Fail on the first write, half written; then on a write after a roll.
    for writes_ok in [0, 1, 2, 3, 4] {
        for _ in 0..12 {
            let seq = log.next_sequence();
            append_value(&mut log, seq, &value_for(seq));
        }
        log.fail_write_after(writes_ok, ENOSPC);
        let err = log.flush().unwrap_err();
        assert!(err.is_no_space(), "{err:?}");
        assert_eq!(
            log.next_sequence(),
            6,
            "appends since the last flush are dropped"
        );
        assert_eq!(log.pending_bytes(), 0);
        assert!(!log.is_poisoned());
        assert_eq!(log.stats(), stats_before);
        assert_eq!(log_files(dir), files_before);
        assert_eq!(
            fs::metadata(segment_path(dir, last_before)).unwrap().len(),
            len_before
        );
        let idx_len = fs::metadata(index_path(dir, last_before)).unwrap().len();
        let in_file = log.segments.last().unwrap().index_file_bytes();
        assert_eq!(idx_len, in_file as u64, "the index file is cut back too");
        assert_holds(&mut log, 1, 5);
    }
    log.fail_write_after(0, EIO);
    append_value(&mut log, 6, &value_for(6));
    let err = log.flush().unwrap_err();
    assert!(
        matches!(err, StorageError::Io { .. }) && !err.is_no_space(),
        "{err:?}"
    );

    // The disk has room again: the same sequences are handed out and stick.
    append_range(&mut log, 20, 20);
    assert_holds(&mut log, 1, 25);
    drop(log);
    let (mut log, report) = open(dir, cfg(300));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(report.indexes_rebuilt, 0);
    assert_holds(&mut log, 1, 25);
}

#[test]
fn scan_headers_walks_every_record_from_a_start() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(500));
    for s in 1..=2500u64 {
        let rec = RecordView {
            sequence: s,
            timestamp_ms: s,
            producer_id: s % 3,
            producer_seq: s / 3,
            flags: 0,
            key: b"",
            value: b"x",
        };
        log.append(&rec).unwrap();
    }
    log.flush().unwrap();
    let mut seen = Vec::new();
    log.scan_headers(1200, |s, ts, pid, pseq| seen.push((s, ts, pid, pseq)))
        .unwrap();
    let want: Vec<_> = (1200..=2500u64).map(|s| (s, s, s % 3, s / 3)).collect();
    assert_eq!(seen, want);
    assert!(
        log.mapped_segments <= MAPPED_SEGMENTS_MAX,
        "old maps are dropped"
    );
}

#[test]
fn oversized_records_and_bad_config_are_refused() {
    let tmp = TempDir::new().unwrap();
    assert!(matches!(
        PartitionLog::open(&FsStorage::shared(), tmp.path(), cfg(0)),
        Err(StorageError::InvalidConfig { .. })
    ));
    assert!(
        PartitionLog::open(&FsStorage::shared(), tmp.path(), cfg(SEGMENT_BYTES_MAX + 1)).is_err()
    );
    let (mut log, _) = open(tmp.path(), cfg(1024));
    let key = vec![0u8; RECORD_KEY_BYTES_MAX + 1];
    let rec = RecordView {
        sequence: 0,
        timestamp_ms: 0,
        producer_id: 0,
        producer_seq: 0,
        flags: 0,
        key: &key,
        value: b"",
    };
    assert!(matches!(
        log.append(&rec),
        Err(StorageError::RecordTooLarge { .. })
    ));
    assert_eq!((log.next_sequence(), log.pending_bytes()), (1, 0));
}

#[test]
fn check_partition_finds_and_repairs_a_torn_tail() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(300));
    append_range(&mut log, 25, 1);
    drop(log);
    let clean = check_partition(&FsStorage, dir, None).unwrap();
    assert!(clean.is_clean(), "{clean:?}");
    assert_eq!(
        (clean.records, clean.first_sequence, clean.next_sequence),
        (25, 1, 26)
    );
    assert!(clean.repaired.is_none());

    let last = *log_files(dir).last().unwrap();
    let path = segment_path(dir, last);
    let len = fs::metadata(&path).unwrap().len();
    let f = OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(len - 3).unwrap();
    drop(f);
    let found = check_partition(&FsStorage, dir, None).unwrap();
    assert!(!found.is_clean());
    assert_eq!(found.next_sequence, 25);
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        len - 3,
        "check alone changes nothing"
    );
    let mut backed_up = Vec::new();
    let mut backup = |p: &Path| {
        backed_up.push(p.to_path_buf());
        Ok(())
    };
    let repaired = check_partition(&FsStorage, dir, Some(&mut backup)).unwrap();
    assert_eq!(backed_up, vec![path.clone(), index_path(dir, last)]);
    let r = repaired.repaired.expect("repair ran");
    assert_eq!(r.lost_from_sequence, Some(25));
    assert!(check_partition(&FsStorage, dir, None).unwrap().is_clean());
    let (mut log, report) = open(dir, cfg(300));
    assert!(report.is_clean());
    assert_holds(&mut log, 1, 24);
}

#[derive(Debug, Clone)]
enum Op {
    Append { count: u8, value_len: u16 },
    Flush,
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u8..20, 0u16..300).prop_map(|(count, value_len)| Op::Append { count, value_len }),
        3 => Just(Op::Flush),
        1 => Just(Op::Reopen),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Whatever the batches, segment size and reopen points, every flushed record is
    /// there after a reopen and unflushed ones are gone.
    #[test]
    fn flushed_records_survive_reopens(
        segment_size in 64u64..2048,
        ops in proptest::collection::vec(op(), 1..40),
    ) {
        let tmp = TempDir::new().unwrap();
        let config = cfg(segment_size);
        let mut log = open(tmp.path(), config).0;
        let mut flushed: Vec<Vec<u8>> = Vec::new();
        let mut pending: Vec<Vec<u8>> = Vec::new();
        for op in ops {
            match op {
                Op::Append { count, value_len } => {
                    for k in 0..count {
                        let fill = (flushed.len() + pending.len()) as u8 ^ k;
                        let value = vec![fill; value_len as usize];
                        let seq = append_value(&mut log, 0, &value);
                        prop_assert_eq!(seq, (flushed.len() + pending.len() + 1) as u64);
                        pending.push(value);
                    }
                }
                Op::Flush => {
                    log.flush().unwrap();
                    flushed.append(&mut pending);
                }
                Op::Reopen => {
                    drop(log);
                    pending.clear();
                    let (l, report) = open(tmp.path(), config);
                    prop_assert!(report.is_clean(), "{:?}", report);
                    log = l;
                }
            }
            prop_assert_eq!(log.written_sequence(), flushed.len() as u64);
        }
        drop(log);
        let mut log = open(tmp.path(), config).0;
        prop_assert_eq!(log.next_sequence(), flushed.len() as u64 + 1);
        let mut got = Vec::new();
        log.read(1, usize::MAX, usize::MAX, |r| got.push(r.value.to_vec())).unwrap();
        prop_assert_eq!(got, flushed);
        prop_assert!(check_partition(&FsStorage, tmp.path(), None).unwrap().is_clean());
    }
}

/// Two syncs in flight across a roll: the second covers only the new segment, so its
/// completion must not mark the old segment's records synced (durability hole 1).
#[test]
fn the_synced_watermark_moves_only_over_a_completed_prefix_of_sync_jobs() {
    let tmp = TempDir::new().unwrap();
    let (mut log, _) = open(tmp.path(), cfg(300));
    // One record per job until a record rolls: then job A covers the old segment and
    // job B only the new one.
    append_range(&mut log, 1, 1);
    let (a, b) = loop {
        let a = log.take_sync_job().unwrap();
        let segments_before = log.stats().segments;
        append_range(&mut log, 1, 1);
        if log.stats().segments > segments_before {
            break (a, log.take_sync_job().unwrap());
        }
        log.sync_done(a.upto_sequence);
    };
    let synced_before = log.synced_sequence();
    assert!(
        b.files
            .iter()
            .all(|f| !a.files.iter().any(|g| Arc::ptr_eq(f, g))),
        "the second job covers only the new segment"
    );
    log.sync_done(b.upto_sequence);
    log.check_invariants();
    assert_eq!(
        log.synced_sequence(),
        synced_before,
        "the first job has not completed"
    );
    log.sync_done(a.upto_sequence);
    log.check_invariants();
    assert_eq!(log.synced_sequence(), b.upto_sequence);

    // A later success does not survive an earlier failure.
    append_range(&mut log, 1, 1);
    let c = log.take_sync_job().unwrap();
    append_range(&mut log, 1, 1);
    let d = log.take_sync_job().unwrap();
    log.sync_done(d.upto_sequence);
    log.sync_failed(&io::Error::from_raw_os_error(EIO));
    log.sync_done(c.upto_sequence);
    log.check_invariants();
    assert_eq!(
        log.synced_sequence(),
        b.upto_sequence,
        "nothing past the failure"
    );
}

#[test]
fn damage_below_the_recovery_point_is_kept_and_damage_above_it_is_cut() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 20, 1);
    drop(log);
    // Opening makes all 20 durable and moves the recovery point past them; 21..=30 are
    // then written and never synced.
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 10, 1);
    drop(log);
    let point = checkpoint::read(&FsStorage, dir).unwrap();
    assert_eq!((point.segment_first, point.records), (1, 20));
    let positions = decode_index(&fs::read(index_path(dir, 1)).unwrap()).entries;
    let path = segment_path(dir, 1);
    let mut bytes = fs::read(&path).unwrap();
    for sequence in [5, 25] {
        bytes[positions[sequence - 1] as usize + RECORD_OVERHEAD_BYTES + 4] ^= 0x01;
    }
    fs::write(&path, &bytes).unwrap();

    let (mut log, report) = open(dir, cfg(1 << 20));
    // Below the point nothing is read at open: record 5 shows up when read.
    assert_eq!(report.damaged_records_kept, 0);
    assert_eq!(
        report.truncated_at,
        Some((path.clone(), u64::from(positions[24])))
    );
    assert_eq!(report.lost_from_sequence, Some(25));
    assert_eq!(log.written_sequence(), 24);
    assert!(matches!(log.read_one(5), Err(StorageError::Corrupt { .. })));
    assert_holds(&mut log, 6, 24);
    let mut seen = Vec::new();
    let damaged = log.scan_headers(1, |s, _, _, _| seen.push(s)).unwrap();
    assert_eq!(damaged, 1);
    assert_eq!(seen, (1..=24).filter(|&s| s != 5).collect::<Vec<_>>());
    drop(log);
    // A repair reads every record: it finds record 5 and keeps it, and what follows.
    let mut backup = |_: &Path| Ok(());
    let check = check_partition(&FsStorage, dir, Some(&mut backup)).unwrap();
    assert_eq!(check.problems[0].position, u64::from(positions[4]));
    assert_eq!(check.plan.damaged_records_kept, 1);
    assert!(check.plan.is_clean(), "{:?}", check.plan);
    let (mut log, _) = open(dir, cfg(1 << 20));
    assert_holds(&mut log, 6, 24);
}

#[test]
fn a_damaged_length_in_a_durable_segment_is_stepped_over_by_the_index() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let segs = durable_segments(dir);
    let idx_path = index_path(dir, segs[0]);
    let mut idx = fs::read(&idx_path).unwrap();
    let positions = decode_index(&idx).entries;
    assert!(positions.len() >= 3);
    // Record 2's length is garbage, and the seal no longer checks out, so the segment
    // is read record by record: only the index can say where record 3 starts.
    let path = segment_path(dir, segs[0]);
    let mut bytes = fs::read(&path).unwrap();
    let at = positions[1] as usize;
    bytes[at..at + 4].copy_from_slice(&[0xFF; 4]);
    fs::write(&path, &bytes).unwrap();
    let last = idx.len() - 1;
    idx[last] ^= 0x01;
    fs::write(&idx_path, &idx).unwrap();
    let (mut log, report) = open(dir, cfg(300));
    assert_eq!(report.damaged_records_kept, 1, "{report:?}");
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(log.written_sequence(), 30);
    assert!(log.read_one(2).is_err());
    assert_holds(&mut log, 3, 30);
}

#[test]
fn a_sync_job_moves_the_recovery_point_only_when_no_other_runs() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 3, 3);
    let first = log.take_sync_job().unwrap();
    let point = first
        .point
        .as_ref()
        .map(|p| p.point)
        .expect("alone: it moves the point");
    assert_eq!((point.segment_first, point.records), (1, 3));
    append_range(&mut log, 2, 2);
    let second = log.take_sync_job().unwrap();
    assert!(
        second.point.is_none(),
        "it cannot vouch for the first job's files"
    );
    second.run().unwrap();
    log.sync_done(second.upto_sequence);
    log.check_invariants();
    assert_eq!(
        checkpoint::read(&FsStorage, dir).unwrap().records,
        0,
        "not yet"
    );
    first.run().unwrap();
    log.sync_done(first.upto_sequence);
    log.check_invariants();
    assert_eq!(checkpoint::read(&FsStorage, dir), Some(point));
}

/// Flips a byte inside the value of the record at `position` of segment `first`.
fn flip_value_byte(dir: &Path, first: u64, position: u32) {
    let path = segment_path(dir, first);
    let mut bytes = fs::read(&path).unwrap();
    bytes[position as usize + RECORD_OVERHEAD_BYTES + 1] ^= 0x01;
    fs::write(&path, &bytes).unwrap();
}

#[test]
fn a_damaged_last_record_of_a_closed_segment_is_kept_and_so_is_every_later_segment() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let segs = durable_segments(dir);
    let positions = decode_index(&fs::read(index_path(dir, segs[0])).unwrap()).entries;
    let last = segs[0] + positions.len() as u64 - 1;
    flip_value_byte(dir, segs[0], *positions.last().unwrap());
    // The check plans what start-up does: nothing to cut, one record kept damaged.
    let check = check_partition(&FsStorage, dir, None).unwrap();
    assert!(check.plan.changes.is_empty(), "{:?}", check.plan);
    assert_eq!(check.plan.damaged[0].sequence, last);
    let (mut log, report) = open(dir, cfg(300));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(log_files(dir), segs, "no later segment removed");
    assert!(log.read_one(last).is_err());
    assert_holds(&mut log, last + 1, 30);
}

#[test]
fn a_damaged_last_durable_record_is_kept_by_check_as_by_start_up() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 5, 1);
    drop(log);
    drop(open(dir, cfg(1 << 20)).0);
    let positions = decode_index(&fs::read(index_path(dir, 1)).unwrap()).entries;
    flip_value_byte(dir, 1, positions[4]);
    let check = check_partition(&FsStorage, dir, None).unwrap();
    assert!(check.plan.changes.is_empty(), "{:?}", check.plan);
    assert_eq!(check.plan.damaged.len(), 1);
    assert_eq!((check.records, check.next_sequence), (5, 6));
    let (mut log, report) = open(dir, cfg(1 << 20));
    assert!(report.is_clean(), "{report:?}");
    assert_eq!(log.written_sequence(), 5);
    assert!(log.read_one(5).is_err());
    for s in 1..=4 {
        assert_eq!(log.read_one(s).unwrap().unwrap().value, &value_for(s)[..]);
    }
}

/// `read_one_in_pass` computes a record's CRC on its first read in a pass only
/// (docs/DECISIONS.md, "One CRC check per delivery"): a record not read yet in the pass,
/// or read in an earlier pass, is checked, so damage is caught there.
/// Flips a byte inside the value (after the key "key") of the record at `position` of
/// segment 1, in place: only the CRC can tell.
fn flip_in_value(dir: &Path, position: u32) {
    use std::os::unix::fs::FileExt;
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(segment_path(dir, 1));
    let file = file.unwrap();
    let at = u64::from(position) + (RECORD_OVERHEAD_BYTES + 3 + 1) as u64;
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, at).unwrap();
    file.write_all_at(&[byte[0] ^ 0x01], at).unwrap();
}

#[test]
fn a_read_in_pass_checks_a_record_once_per_pass() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_range(&mut log, 6, 6);
    log.write_index_tail().unwrap();
    let positions = decode_index(&fs::read(index_path(dir, 1)).unwrap()).entries;
    let read = |log: &mut PartitionLog, s: u64, pass: u64| {
        log.read_one_in_pass(s, pass)
            .map(|r| r.map(|r| r.value.to_vec()))
    };
    for s in 1..=3 {
        assert_eq!(read(&mut log, s, 1).unwrap(), Some(value_for(s)));
    }
    let crcs = || CRCS_IN_PASS.with(|n| n.get());
    assert_eq!(crcs(), 3);
    for s in 1..=3 {
        assert_eq!(read(&mut log, s, 1).unwrap(), Some(value_for(s)));
    }
    assert_eq!(crcs(), 3, "each record's CRC once in the pass");
    flip_in_value(dir, positions[3]);
    assert!(read(&mut log, 4, 1).is_err(), "not read before in the pass");
    flip_in_value(dir, positions[1]);
    let r = read(&mut log, 2, 1);
    assert!(r.is_ok(), "checked once in this pass: {r:?}");
    assert!(read(&mut log, 2, 2).is_err(), "a new pass checks again");
    assert!(log.read_one(2).is_err());
    // A run is consecutive: 1 then 5 leave 3 unchecked.
    flip_in_value(dir, positions[2]);
    assert_eq!(read(&mut log, 1, 3).unwrap(), Some(value_for(1)));
    assert_eq!(read(&mut log, 5, 3).unwrap(), Some(value_for(5)));
    assert!(
        read(&mut log, 3, 3).is_err(),
        "after a gap, the run starts again"
    );
}

/// Appends sequences `n` records with `value_for` and hands them to a journal through
/// `flush_with`; returns what the journal was given (first sequence, count, bytes).
fn append_journaled(log: &mut PartitionLog, n: u64) -> Option<(u64, u32, usize)> {
    for _ in 0..n {
        let seq = log.next_sequence();
        append_value(log, seq * 1000, &value_for(seq));
    }
    let mut given = None;
    log.flush_with(|first, count, bytes| given = Some((first, count, bytes.len())))
        .unwrap();
    log.check_invariants();
    given
}

fn segment_len(dir: &Path) -> u64 {
    fs::metadata(segment_path(dir, 1)).unwrap().len()
}

#[test]
fn journaled_records_wait_staged_until_a_read_reaches_them() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    let header = segment_len(dir);
    let pending = |log: &mut PartitionLog, n| {
        (0..n).for_each(|_| {
            let seq = log.next_sequence();
            append_value(log, seq * 1000, &value_for(seq));
        });
        log.pending_bytes()
    };
    let bytes = pending(&mut log, 3);
    let mut given = None;
    log.flush_with(|first, count, b| given = Some((first, count, b.len())))
        .unwrap();
    assert_eq!(given, Some((1, 3, bytes)), "the journal takes the records");
    assert_eq!(log.staged(), (3, bytes));
    assert_eq!(log.written_sequence(), 3, "staged records are WRITTEN");
    assert_eq!(segment_len(dir), header, "and not in the segment yet");
    // A read that stops before them leaves them staged.
    assert_eq!(append_journaled(&mut log, 0), None);
    assert!(log.read_one(4).unwrap().is_none());
    assert_eq!(log.staged().0, 3);
    // One that reaches them writes them first.
    assert_eq!(log.read_one(2).unwrap().unwrap().value, value_for(2));
    assert_eq!(log.staged(), (0, 0));
    assert_eq!(segment_len(dir), header + bytes as u64);
    assert_eq!(append_journaled(&mut log, 2), Some((4, 2, log.staged().1)));
    assert_holds(&mut log, 1, 5);
    assert_eq!(log.staged(), (0, 0), "the range read wrote them");
    append_journaled(&mut log, 2);
    let (got, _) = collect(&mut log, 1, 5, usize::MAX);
    assert_eq!(got.len(), 5);
    assert_eq!(
        log.staged().0,
        2,
        "a read that ends before them leaves them"
    );
}

#[test]
fn a_flush_that_fills_the_stage_writes_everything_and_a_failed_write_keeps_the_staged() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    let header = segment_len(dir);
    append_journaled(&mut log, 3);
    let staged = log.staged();
    // A failed write of the staged records alone keeps them, and the files as they were.
    log.fail_write_after(0, ENOSPC);
    assert!(log.write_staged().unwrap_err().is_no_space());
    assert_eq!(log.staged(), staged);
    assert_eq!(segment_len(dir), header);
    assert!(!log.is_poisoned());
    // A record that brings the staged bytes to the limit: everything is written before the
    // journal takes it, and when that fails the journal never sees it.
    let big = vec![b'b'; STAGED_BYTES_MAX];
    append_value(&mut log, 4, &big);
    log.fail_write_after(0, ENOSPC);
    let mut given = None;
    let err = log.flush_with(|first, count, _| given = Some((first, count)));
    assert!(err.unwrap_err().is_no_space());
    assert_eq!(given, None);
    assert_eq!(log.staged(), staged, "the staged records stay");
    assert_eq!(log.next_sequence(), 4, "the new one is dropped");
    log.check_invariants();
    // Room again: the same sequence goes to the journal after the segment holds all four.
    append_value(&mut log, 4, &big);
    log.flush_with(|first, count, _| given = Some((first, count)))
        .unwrap();
    assert_eq!(given, Some((4, 1)));
    assert_eq!(log.staged(), (0, 0));
    assert_eq!(log.stats().bytes, segment_len(dir));
    let (got, _) = collect(&mut log, 1, usize::MAX, usize::MAX);
    assert_eq!(got.len(), 4);
    assert_eq!(got[3], (4, big));
}

#[test]
fn a_closed_log_writes_its_staged_records_and_a_crashed_one_leaves_them_to_the_journal() {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path();
    let (mut log, _) = open(dir, cfg(1 << 20));
    append_journaled(&mut log, 4);
    drop(log);
    let (mut log, report) = open(dir, cfg(1 << 20));
    assert!(report.is_clean(), "{report:?}");
    assert_holds(&mut log, 1, 4);
    append_journaled(&mut log, 3);
    // A crash: nothing runs, so only what the segment held survives; the broker's
    // journal replay gives the rest back (`docs/STORAGE.md`).
    std::mem::forget(log);
    let (mut log, _) = open(dir, cfg(1 << 20));
    assert_holds(&mut log, 1, 4);
}
