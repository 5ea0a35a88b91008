//! The broker as a state machine, without sockets: requests in, answers and effects
//! out, durable I/O through a fake job sink whose jobs the test runs (or fails) when
//! it chooses. This is where group commit, sticky fsync failure and dedup waiting are
//! pinned down.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::fsync::{Completion, Job as _};
use crate::log::simdisk::{FaultRates, SimDisk};
use crate::wire::ops::{Declare, Pub, PubResult};
use crate::wire::{DeclareFlags, PubFlags, PubResultFlags};

/// Holds submitted jobs until the test runs them.
#[derive(Clone, Default)]
pub(super) struct HeldJobs(Rc<RefCell<Vec<DurableJob>>>);

impl JobSink for HeldJobs {
    fn submit(&self, job: DurableJob) {
        self.0.borrow_mut().push(job);
    }
}

impl HeldJobs {
    fn len(&self) -> usize {
        self.0.borrow().len()
    }

    /// Runs every held job; the ones `fail` picks report an I/O error instead.
    fn run(&self, broker: &mut Broker, fail: impl Fn(usize) -> bool) {
        let jobs: Vec<_> = self.0.borrow_mut().drain(..).collect();
        for (i, mut job) in jobs.into_iter().enumerate() {
            let result = if fail(i) {
                Err(io::Error::other("injected EIO"))
            } else {
                job.run()
            };
            let done = Completion {
                job,
                result,
                elapsed: Duration::from_micros(50),
            };
            broker.job_done(done, Now::default());
            broker.check_invariants();
        }
    }
}

pub(super) const CONN: ConnRef = ConnRef { id: 1, serial: 1 };

pub(super) fn open(dir: &std::path::Path) -> (Broker, HeldJobs) {
    open_on(dir, crate::log::FsStorage::shared(), 0)
}

fn open_on(
    dir: &std::path::Path,
    storage: Arc<dyn crate::log::Storage>,
    max_data_bytes: u64,
) -> (Broker, HeldJobs) {
    let jobs = HeldJobs::default();
    let config = BrokerConfig {
        data_dir: dir.to_path_buf(),
        max_partitions: 8,
        producer_ttl_ms: 60_000,
        max_data_bytes,
        ..BrokerConfig::default()
    };
    let (broker, _) =
        Broker::open(config, storage, Box::new(jobs.clone()), Now::default()).unwrap();
    (broker, jobs)
}

/// A broker whose partitions have `log`'s segments and retention; producers live long.
fn open_logged(dir: &std::path::Path, log: crate::log::LogConfig) -> (Broker, HeldJobs) {
    let jobs = HeldJobs::default();
    let config = BrokerConfig {
        data_dir: dir.to_path_buf(),
        max_partitions: 8,
        producer_ttl_ms: LONG_PRODUCER_TTL_MS,
        log,
        ..BrokerConfig::default()
    };
    let storage = crate::log::FsStorage::shared();
    let (broker, _) =
        Broker::open(config, storage, Box::new(jobs.clone()), Now::default()).unwrap();
    (broker, jobs)
}

/// Longer than any test's clock runs.
const LONG_PRODUCER_TTL_MS: u64 = 3_600_000;

fn answers(broker: &mut Broker) -> Vec<(u64, Response)> {
    broker.check_invariants();
    let mut effects = Vec::new();
    broker.drain_effects(&mut effects);
    effects
        .into_iter()
        .filter_map(|e| match e {
            Effect::Answer { slot, response, .. } => Some((slot, response)),
            _ => None,
        })
        .collect()
}

/// DECLAREs `name` and completes its registry write; returns the topic id.
pub(super) fn declare(broker: &mut Broker, jobs: &HeldJobs, name: &str, partitions: u16) -> u16 {
    let d = Declare {
        topic: name.as_bytes(),
        partition_count: partitions,
        flags: DeclareFlags::empty(),
    };
    assert!(matches!(
        broker.declare(CONN, 0, &d, Now::default()),
        Handled::Wait
    ));
    settle(broker, jobs);
    match answers(broker).pop() {
        Some((_, Response::Declare(r))) => r.topic_id,
        other => panic!("declare answered {other:?}"),
    }
}

/// Passes and job runs until no job is left (a creation, then its registry write).
pub(super) fn settle(broker: &mut Broker, jobs: &HeldJobs) {
    loop {
        broker.end_pass(Now::default(), &unlimited_room);
        if jobs.len() == 0 {
            return;
        }
        jobs.run(broker, |_| false);
    }
}

fn publish(
    broker: &mut Broker,
    slot: u64,
    topic_id: u16,
    partition: u16,
    producer: (u64, u64),
) -> Handled {
    publish_value(broker, slot, (topic_id, partition), producer, b"v")
}

fn publish_value(
    broker: &mut Broker,
    slot: u64,
    (topic_id, partition): PartitionKey,
    producer: (u64, u64),
    value: &[u8],
) -> Handled {
    let p = Pub {
        topic_id,
        partition,
        producer_id: producer.0,
        producer_seq: producer.1,
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        value,
        ..Pub::default()
    };
    broker.publish(CONN, slot, &p, Now::default())
}

/// A value that fills a partition's staged bytes alone: its flush writes the segment
/// before the journal takes it (`PartitionLog::flush_with`).
fn segment_filling_value() -> Vec<u8> {
    vec![b'v'; crate::log::STAGED_BYTES_MAX]
}

fn pub_result(a: &Response) -> PubResult {
    match a {
        Response::Pub(r) => *r,
        other => panic!("expected a PUB result, got {other:?}"),
    }
}

#[test]
fn fsync_answers_wait_for_the_sync_and_group_commit_batches_them() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open(dir.path());
    let topic = declare(&mut broker, &jobs, "t", 1);
    for slot in 0..3 {
        assert!(matches!(
            publish(&mut broker, slot, topic, 0, (0, 0)),
            Handled::Wait
        ));
    }
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(jobs.len(), 1, "one fdatasync for the three");
    assert!(
        answers(&mut broker).is_empty(),
        "nothing is answered before the sync"
    );
    // Two more arrive while that sync runs: they start a second one at once...
    for slot in 3..5 {
        publish(&mut broker, slot, topic, 0, (0, 0));
    }
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(jobs.len(), 2, "a second sync may run beside the first");
    // ...but a third batch waits: at most JOURNAL_SYNCS_IN_FLIGHT_MAX run.
    publish(&mut broker, 5, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(jobs.len(), 2);
    jobs.run(&mut broker, |_| false);
    let done = answers(&mut broker);
    assert_eq!(
        done.iter().map(|(s, _)| *s).collect::<Vec<_>>(),
        vec![0, 1, 2, 3, 4]
    );
    assert!(done.iter().all(|(_, a)| pub_result(a).durability == 2));
    assert_eq!(pub_result(&done[4].1).commit_seq, 5);
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(
        jobs.len(),
        1,
        "the pass after the completions starts the waiting sync"
    );
    jobs.run(&mut broker, |_| false);
    assert_eq!(
        answers(&mut broker)
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>(),
        vec![5]
    );
    assert_eq!(broker.counters.fsyncs, 3);
    assert_eq!(
        broker.counters.fsync_records, 6,
        "each record counted in one batch"
    );
}

#[test]
fn a_sync_finishing_first_covers_what_was_written_before_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open(dir.path());
    let topic = declare(&mut broker, &jobs, "t", 1);
    publish(&mut broker, 0, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    publish(&mut broker, 1, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    // Complete the second job first: both records are durable.
    let mut held: Vec<_> = jobs.0.borrow_mut().drain(..).collect();
    held.reverse();
    jobs.0.borrow_mut().extend(held);
    jobs.run(&mut broker, |_| false);
    let done = answers(&mut broker);
    assert_eq!(done.len(), 2);
    assert!(done.iter().all(|(_, a)| pub_result(a).durability == 2));
}

#[test]
fn a_failed_journal_fdatasync_acknowledges_nothing_it_covered_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open(dir.path());
    let topic = declare(&mut broker, &jobs, "t", 2);
    publish(&mut broker, 0, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| false);
    assert_eq!(pub_result(&answers(&mut broker)[0].1).sequence, 1);

    publish(&mut broker, 1, topic, 0, (0, 0));
    publish(&mut broker, 2, topic, 1, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(jobs.len(), 1, "one journal sync for both partitions");
    jobs.run(&mut broker, |_| true);
    let got = answers(&mut broker);
    assert_eq!(got.len(), 2);
    assert!(
        got.iter()
            .all(|(_, a)| a.error_code() == Some(ErrorCode::InternalError)),
        "never acknowledged: {got:?}"
    );
    // No retry-and-pretend: the kernel may have dropped the journal's dirty pages, so
    // nothing written from now on could be made durable.
    for (slot, partition) in [(3, 0), (4, 1)] {
        let why = "a write was taken after the journal failed";
        assert_refused(&mut broker, slot, (topic, partition), why);
    }
    assert_eq!(broker.counters.fsync_failures, 1);
    // Reads of what was durable still work.
    let part = broker.partitions.get_mut((topic, 0)).unwrap();
    assert_eq!(part.log.read_one(1).unwrap().unwrap().value, b"v");
}

/// A PUB to `partition` of `topic` must be refused INTERNAL_ERROR, not taken: `why`.
fn assert_refused(broker: &mut Broker, slot: u64, (topic, partition): PartitionKey, why: &str) {
    match publish(broker, slot, topic, partition, (0, 0)) {
        Handled::Answer(a) => assert_eq!(a.error_code(), Some(ErrorCode::InternalError)),
        Handled::Wait => panic!("{why}"),
    }
}

/// A broker whose topic `t` of `partitions` holds one acknowledged record per partition
/// (slot = partition), and the job of the checkpoint then asked for.
fn a_checkpoint_taken(
    dir: &std::path::Path,
    partitions: u16,
) -> (Broker, HeldJobs, u16, DurableJob) {
    let (mut broker, jobs) = open(dir);
    let topic = declare(&mut broker, &jobs, "t", partitions);
    for p in 0..partitions {
        publish(&mut broker, u64::from(p), topic, p, (0, 0));
    }
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| false);
    assert_eq!(answers(&mut broker).len(), usize::from(partitions));
    broker.partitions.request_checkpoint();
    broker.end_pass(Now::default(), &unlimited_room);
    let checkpoint = jobs.0.borrow_mut().pop().expect("a checkpoint");
    (broker, jobs, topic, checkpoint)
}

/// Runs checkpoint `job` with the segment sync of `key` failed (EIO) and reports it.
fn fail_checkpoint_sync(broker: &mut Broker, mut job: DurableJob, key: PartitionKey) {
    crate::fsync::Job::run(&mut job).unwrap();
    let Work::Checkpoint { syncs, .. } = &mut job.work else {
        panic!("expected a checkpoint, got {job:?}");
    };
    let failing = syncs.iter_mut().find(|s| s.key == key).unwrap();
    failing.result = Some(Err(io::Error::other("injected EIO")));
    let done = Completion {
        job,
        result: Err(io::Error::other("injected EIO")),
        elapsed: Duration::from_micros(50),
    };
    broker.job_done(done, Now::default());
    broker.check_invariants();
}

/// Partition 0 of a fresh topic `t` holds one record the journal's sync acknowledged,
/// staged for its segment write.
fn a_staged_record(dir: &std::path::Path) -> (Broker, HeldJobs, u16) {
    let (mut broker, jobs) = open(dir);
    let topic = declare(&mut broker, &jobs, "t", 1);
    publish(&mut broker, 1, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| false);
    assert_eq!(pub_result(&answers(&mut broker)[0].1).sequence, 1);
    let log = &broker.partition(topic, 0).unwrap().log;
    assert_eq!(log.staged().0, 1, "acknowledged before its segment write");
    (broker, jobs, topic)
}

#[test]
fn a_checkpoint_writes_the_staged_records_before_it_syncs_their_segments() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs, topic) = a_staged_record(dir.path());
    broker.partitions.request_checkpoint();
    broker.end_pass(Now::default(), &unlimited_room);
    let checkpoint = jobs.0.borrow_mut().pop().expect("a checkpoint");
    let Work::Checkpoint { syncs, .. } = &checkpoint.work else {
        panic!("expected a checkpoint, got {checkpoint:?}");
    };
    let sync = syncs
        .iter()
        .find(|s| s.key == (topic, 0))
        .expect("its sync");
    assert_eq!(
        sync.sync.upto_sequence, 1,
        "the sync covers the staged record"
    );
    assert_eq!(broker.partition(topic, 0).unwrap().log.staged(), (0, 0));
}

#[test]
fn housekeeping_writes_staged_records_that_no_later_flush_pushed_out() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, _jobs, topic) = a_staged_record(dir.path());
    broker.housekeeping(Now::default());
    assert_eq!(broker.partition(topic, 0).unwrap().log.staged(), (0, 0));
}

#[test]
fn a_failed_segment_sync_at_a_checkpoint_poisons_only_its_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, _jobs, topic, job) = a_checkpoint_taken(dir.path(), 2);
    fail_checkpoint_sync(&mut broker, job, (topic, 0));
    let why = "a poisoned partition accepted a write";
    assert_refused(&mut broker, 2, (topic, 0), why);
    assert!(matches!(
        publish(&mut broker, 3, topic, 1, (0, 0)),
        Handled::Wait
    ));
    assert_eq!(
        broker.counters.checkpoints, 0,
        "not written after a failure"
    );
}

/// An operator purge of topic `t` as `ticket`; its file job is left held.
fn purge_t(broker: &mut Broker, ticket: u64) -> Result<(), manage::ManageError> {
    let purge = manage::Change::Purge { topic: "t".into() };
    broker.change(ticket, &purge, Now::default())?;
    broker.end_pass(Now::default(), &unlimited_room);
    Ok(())
}

#[test]
fn a_failed_purge_job_keeps_the_partition_from_removing_newer_segments_until_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs, topic, checkpoint) = a_checkpoint_taken(dir.path(), 1);
    drop(checkpoint);
    purge_t(&mut broker, 1).unwrap();
    jobs.run(&mut broker, |_| true);
    let done = broker.take_manage_done();
    assert!(matches!(&done[..], [(1, Err(_))]), "{done:?}");
    // The old segment's files may still be on disk: a newer segment removed in front of
    // them would leave a gap that recovery cuts the log at, and every record after it.
    assert_refused(
        &mut broker,
        2,
        (topic, 0),
        "a write after a failed purge job",
    );
    assert!(
        purge_t(&mut broker, 2).is_err(),
        "a second purge over the leftovers"
    );
    drop(broker);
    let (mut broker, jobs) = open(dir.path());
    let part = broker.partition(topic, 0).unwrap();
    assert_eq!(
        part.log.first_sequence(),
        1,
        "the records come back, contiguous"
    );
    assert!(matches!(
        publish(&mut broker, 3, topic, 0, (0, 0)),
        Handled::Wait
    ));
    settle(&mut broker, &jobs);
    let answered = answers(&mut broker);
    assert_eq!(pub_result(&answered[0].1).sequence, 2, "{answered:?}");
}

#[test]
fn a_pub_waiting_when_a_checkpoint_fails_is_answered_once_the_journal_covers_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs, topic, checkpoint) = a_checkpoint_taken(dir.path(), 1);
    // A PUB written while the checkpoint runs: its journal sync is taken, not yet run.
    assert!(matches!(
        publish(&mut broker, 1, topic, 0, (0, 0)),
        Handled::Wait
    ));
    broker.end_pass(Now::default(), &unlimited_room);
    assert_eq!(jobs.len(), 1, "the PUB's journal sync");
    // The checkpoint's segment sync fails: the partition takes no more writes...
    fail_checkpoint_sync(&mut broker, checkpoint, (topic, 0));
    // ...but the record it took is in the journal, whose sync makes it durable.
    jobs.run(&mut broker, |_| false);
    let got = answers(&mut broker);
    assert_eq!(got.len(), 1, "the waiting PUB is answered: {got:?}");
    assert_eq!(got[0].1.error_code(), None, "{got:?}");
    assert_eq!(pub_result(&got[0].1).sequence, 2);
    let why = "a poisoned partition accepted a write";
    assert_refused(&mut broker, 2, (topic, 0), why);
}

/// A flush that failed is cut back and the cut is synced with the next journal sync, so
/// that a power cut cannot bring the refused record back at a sequence a later record
/// took. When that sync fails, the later record must not be acknowledged.
#[test]
fn a_record_after_an_undo_whose_sync_failed_is_never_acknowledged() {
    let dir = std::path::Path::new("/data");
    let disk = SimDisk::seeded(5);
    let (mut broker, jobs) = open_on(dir, Arc::new(disk.clone()), 0);
    let topic = declare(&mut broker, &jobs, "t", 1);
    publish(&mut broker, 0, topic, 0, (0, 0));
    settle(&mut broker, &jobs);
    assert_eq!(answers(&mut broker)[0].1.error_code(), None);
    // The next record's segment write hits a full disk: refused, its write cut back.
    disk.set_faults(FaultRates {
        write_enospc: 1_000_000,
        ..FaultRates::default()
    });
    publish_value(&mut broker, 1, (topic, 0), (0, 0), &segment_filling_value());
    broker.end_pass(Now::default(), &unlimited_room);
    let refused = answers(&mut broker);
    assert_eq!(refused[0].1.error_code(), Some(ErrorCode::StorageFull));
    disk.set_faults(FaultRates::default());
    // A record takes the same sequence; its journal sync also syncs the cut, which fails.
    publish(&mut broker, 2, topic, 0, (0, 0));
    broker.end_pass(Now::default(), &unlimited_room);
    let mut job = jobs.0.borrow_mut().pop().expect("a journal sync");
    crate::fsync::Job::run(&mut job).unwrap();
    let Work::SyncJournal { undone, .. } = &mut job.work else {
        panic!("expected a journal sync, got {job:?}");
    };
    assert_eq!(undone.len(), 1, "the cut goes with this sync");
    undone[0].result = Some(Err(io::Error::other("injected EIO")));
    let elapsed = Duration::from_micros(50);
    let done = Completion {
        job,
        result: Ok(()),
        elapsed,
    };
    broker.job_done(done, Now::default());
    settle(&mut broker, &jobs);
    let got = answers(&mut broker);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        got[0].1.error_code(),
        Some(ErrorCode::InternalError),
        "acknowledged at a sequence the refused record may come back at: {got:?}"
    );
}

#[test]
fn a_duplicate_waits_for_its_original_to_be_durable() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open(dir.path());
    let topic = declare(&mut broker, &jobs, "t", 1);
    publish(&mut broker, 0, topic, 0, (9, 1));
    // The retry arrives before the original's fsync finished: it must not be answered
    // FSYNCED early.
    assert!(matches!(
        publish(&mut broker, 1, topic, 0, (9, 1)),
        Handled::Wait
    ));
    broker.end_pass(Now::default(), &unlimited_room);
    assert!(answers(&mut broker).is_empty());
    jobs.run(&mut broker, |_| false);
    let got = answers(&mut broker);
    assert_eq!(got.len(), 2);
    let (original, duplicate) = (pub_result(&got[0].1), pub_result(&got[1].1));
    assert_eq!(
        (original.sequence, original.result_flags),
        (1, PubResultFlags::empty())
    );
    assert_eq!(
        (duplicate.sequence, duplicate.result_flags),
        (1, PubResultFlags::DEDUPLICATED)
    );
    assert_eq!(
        broker.partition(topic, 0).unwrap().log.next_sequence(),
        2,
        "nothing appended"
    );
}

/// Small segments, and retention that wants all but the active one gone.
fn retention_of_all_but_the_active_segment() -> crate::log::LogConfig {
    crate::log::LogConfig {
        segment_size_bytes: 256,
        retention_size_bytes: 1,
        ..crate::log::LogConfig::default()
    }
}

/// Producer 7's record at sequence 1, then anonymous ones up to sequence 40.
fn a_producer_then_records(broker: &mut Broker, jobs: &HeldJobs, topic: u16) {
    publish(broker, 1, topic, 0, (7, 1));
    for slot in 2..=40 {
        publish(broker, slot, topic, 0, (0, 0));
    }
    settle(broker, jobs);
    answers(broker);
}

/// The same, over more than two segments.
fn a_producer_then_segments(broker: &mut Broker, jobs: &HeldJobs, topic: u16) {
    a_producer_then_records(broker, jobs, topic);
    let part = broker.partitions.get_mut((topic, 0)).unwrap();
    part.log.write_staged().unwrap();
    assert!(part.log.stats().segments > 2);
}

/// After a restart (no clean shutdown), producer 7 resending its record 1 is told it
/// is a duplicate of sequence 1: the broker still knows it.
fn assert_producer_7_known_after_a_restart(dir: &std::path::Path, topic: u16) {
    let (mut broker, jobs) = open_logged(dir, retention_of_all_but_the_active_segment());
    let resend = match publish(&mut broker, 100, topic, 0, (7, 1)) {
        Handled::Answer(answer) => answer,
        Handled::Wait => {
            settle(&mut broker, &jobs);
            answers(&mut broker).remove(0).1
        }
    };
    let resend = pub_result(&resend);
    assert_eq!(
        (resend.sequence, resend.result_flags),
        (1, PubResultFlags::DEDUPLICATED),
        "the resend was appended again"
    );
}

#[test]
fn retention_waits_for_a_producer_snapshot_so_a_restart_still_deduplicates_a_resend() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open_logged(dir.path(), retention_of_all_but_the_active_segment());
    let topic = declare(&mut broker, &jobs, "t", 1);
    a_producer_then_segments(&mut broker, &jobs, topic);
    let first = |b: &Broker| b.partition(topic, 0).unwrap().log.first_sequence();
    let at = |mono_ms| Now {
        mono_ms,
        wall_ms: mono_ms,
    };
    // Retention asks for the snapshot it waits for at once, not at the interval…
    broker.housekeeping(at(1_000));
    let unsaved = "deleted before a durable snapshot holds producer 7";
    assert_eq!(first(&broker), 1, "{unsaved}");
    assert_eq!(jobs.len(), 1, "no snapshot asked for");
    jobs.run(&mut broker, |_| true);
    // …but after a failed write only at the interval (one warning a minute).
    broker.housekeeping(at(2_000));
    assert_eq!(first(&broker), 1, "{unsaved}");
    assert_eq!(jobs.len(), 0, "asked again before the interval");
    let interval = producers::PRODUCER_SNAPSHOT_INTERVAL_MS;
    broker.housekeeping(at(interval));
    assert_eq!((first(&broker), jobs.len()), (1, 1), "{unsaved}");
    jobs.run(&mut broker, |_| false);
    broker.housekeeping(at(interval + 1_000));
    assert!(first(&broker) > 1, "retention never ran");
    drop(broker);
    assert_producer_7_known_after_a_restart(dir.path(), topic);
}

#[test]
fn a_purge_saves_the_producers_of_the_records_it_removes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open_logged(dir.path(), crate::log::LogConfig::default());
    let topic = declare(&mut broker, &jobs, "t", 1);
    a_producer_then_records(&mut broker, &jobs, topic);
    purge_t(&mut broker, 1).unwrap();
    jobs.run(&mut broker, |_| false);
    let done = broker.take_manage_done();
    assert!(matches!(&done[..], [(1, Ok(_))]), "{done:?}");
    assert_eq!(broker.partition(topic, 0).unwrap().log.first_sequence(), 41);
    drop(broker);
    assert_producer_7_known_after_a_restart(dir.path(), topic);
}

#[test]
fn a_failed_registry_write_fails_the_declare_and_is_retried_by_the_next_one() {
    let dir = tempfile::tempdir().unwrap();
    let (mut broker, jobs) = open(dir.path());
    let d = Declare {
        topic: b"a",
        partition_count: 1,
        flags: DeclareFlags::empty(),
    };
    broker.declare(CONN, 0, &d, Now::default());
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| false); // the topic's files
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| true); // the registry write fails
    assert_eq!(
        answers(&mut broker)[0].1.error_code(),
        Some(ErrorCode::InternalError)
    );
    let topic_a = broker.registry().lookup("a").unwrap().source_id();
    let p = publish(&mut broker, 1, topic_a, 0, (0, 0));
    assert!(
        matches!(p, Handled::Answer(ref r) if r.error_code() == Some(ErrorCode::UnknownTopic)),
        "no PUB to a topic whose registry entry is not durable"
    );
    let d2 = Declare {
        topic: b"b",
        partition_count: 1,
        flags: DeclareFlags::empty(),
    };
    broker.declare(CONN, 2, &d2, Now::default());
    broker.end_pass(Now::default(), &unlimited_room);
    jobs.run(&mut broker, |_| false); // b's files
    let later = Now {
        mono_ms: registry::REGISTRY_RETRY_MS,
        wall_ms: 0,
    };
    broker.end_pass(later, &unlimited_room);
    jobs.run(&mut broker, |_| false); // the write that names both
    assert!(matches!(answers(&mut broker)[0].1, Response::Declare(_)));
    let on_disk = meta::read_checked(
        &crate::log::FsStorage,
        &dir.path().join(registry::REGISTRY_FILE),
    )
    .unwrap()
    .unwrap();
    let registry = Registry::decode(&on_disk).unwrap();
    assert!(registry.lookup("a").is_some() && registry.lookup("b").is_some());
}

/// DECLARE on a full disk answers STORAGE_FULL (it used to match an error text and say
/// INTERNAL_ERROR), and a new topic counts against `--max-data-size`.
#[test]
fn declare_on_a_full_disk_or_over_the_data_cap_is_storage_full() {
    let dir = std::path::Path::new("/data");
    let on_sim = |disk: &SimDisk, cap| open_on(dir, Arc::new(disk.clone()), cap);
    let storage_full = |h: &Handled| match h {
        Handled::Answer(r) => r.error_code() == Some(ErrorCode::StorageFull),
        Handled::Wait => false,
    };
    let declare_frame = |topic| Declare {
        topic,
        partition_count: 2,
        flags: DeclareFlags::empty(),
    };

    // Two partitions of source and twin start with 4 segment headers of 16 bytes.
    let (mut broker, jobs) = on_sim(&SimDisk::seeded(1), 100);
    declare(&mut broker, &jobs, "fits", 2);
    let refused = broker.declare(CONN, 1, &declare_frame(b"over"), Now::default());
    assert!(storage_full(&refused), "over --max-data-size");

    let disk = SimDisk::seeded(2);
    let (mut broker, jobs) = on_sim(&disk, 0);
    disk.set_faults(FaultRates {
        write_enospc: 1_000_000,
        ..FaultRates::default()
    });
    let d = declare_frame(b"x");
    assert!(matches!(
        broker.declare(CONN, 2, &d, Now::default()),
        Handled::Wait
    ));
    settle(&mut broker, &jobs);
    assert_eq!(
        answers(&mut broker)[0].1.error_code(),
        Some(ErrorCode::StorageFull),
        "ENOSPC while making the topic's files"
    );
    assert!(
        broker.registry().lookup("x").is_none(),
        "the pair is given back"
    );
}

/// Every effect queued so far.
fn effects(broker: &mut Broker) -> Vec<Effect> {
    broker.check_invariants();
    let mut out = Vec::new();
    broker.drain_effects(&mut out);
    out
}

/// Joins group `g` on `topic` and accepts its ASSIGNs; returns the SUB result.
fn join(broker: &mut Broker, topic: u16) -> crate::wire::ops::SubResult {
    use crate::wire::ops::{ControlAck, Sub};
    let sub = Sub {
        group: b"g",
        topic_id: topic,
        partition: crate::wire::limits::SUB_PARTITION_ANY,
        ..Sub::default()
    };
    let Handled::Answer(Response::Sub(joined)) = broker.subscribe(CONN, &sub, Now::default())
    else {
        panic!("SUB refused");
    };
    broker.end_pass(Now::default(), &unlimited_room);
    for e in effects(broker) {
        if let Effect::Notice { notice, .. } = e {
            let ca = ControlAck::answering(&notice, crate::wire::ControlResult::Ok);
            broker.control_ack(CONN, &ca, Now::default());
        }
    }
    joined
}

/// A dead letter whose twin write fails is appended again by housekeeping, not left
/// waiting for a sequence another record will take (durability hole 6).
#[test]
fn a_dead_letter_whose_twin_flush_failed_is_appended_again() {
    let disk = SimDisk::seeded(3);
    let (mut broker, jobs) = open_on(std::path::Path::new("/data"), Arc::new(disk.clone()), 0);
    let topic = declare(&mut broker, &jobs, "t", 1);
    // Records large enough that the twin's flush writes its segment at once.
    for slot in 0..2 {
        publish_value(
            &mut broker,
            slot,
            (topic, 0),
            (0, 0),
            &segment_filling_value(),
        );
    }
    settle(&mut broker, &jobs);
    join(&mut broker, topic);
    broker.end_pass(Now::default(), &unlimited_room);
    let deliveries: Vec<_> = effects(&mut broker)
        .into_iter()
        .filter_map(|e| match e {
            Effect::Deliver { delivery, .. } => Some(delivery),
            _ => None,
        })
        .collect();
    assert_eq!(deliveries.len(), 2);
    let reject = |b: &mut Broker, d: &crate::consume::Delivery| {
        let nack = d.reference.nack(crate::wire::NackReason::Reject);
        b.nack(CONN, &nack, Now::default());
    };
    reject(&mut broker, &deliveries[0]);
    disk.set_faults(FaultRates {
        write_eio: 1_000_000,
        ..FaultRates::default()
    });
    broker.end_pass(Now::default(), &unlimited_room); // the twin's flush fails
    disk.set_faults(FaultRates::default());
    reject(&mut broker, &deliveries[1]); // would take twin sequence 1 again
    settle(&mut broker, &jobs);
    broker.housekeeping(Now::default());
    settle(&mut broker, &jobs);
    let twin = broker.partition(topic + 1, 0).unwrap();
    assert_eq!(
        twin.log.durable_sequence(),
        2,
        "both dead letters in the twin"
    );
    let committed: Vec<u64> = broker
        .coordinator()
        .positions()
        .iter()
        .map(|p| p.committed)
        .collect();
    assert_eq!(committed, vec![2], "both settled, none lost");
}

#[test]
fn a_failed_final_sync_is_an_error_for_the_exit_status() {
    let dir = std::path::Path::new("/data");
    let disk = SimDisk::seeded(4);
    let (mut broker, jobs) = open_on(dir, Arc::new(disk.clone()), 0);
    let topic = declare(&mut broker, &jobs, "t", 1);
    let p = Pub {
        topic_id: topic,
        partition: 0,
        flags: PubFlags::requesting(Some(Durability::Written)),
        value: b"v",
        ..Pub::default()
    };
    let synced = |broker: &Broker| broker.partition(topic, 0).unwrap().log.durable_sequence();
    // Appended in the last pass before the signal: the final sync writes and syncs it.
    broker.publish(CONN, 1, &p, Now::default());
    assert!(broker.shutdown_sync(Now::default()).is_ok());
    assert_eq!(synced(&broker), 1);

    broker.publish(CONN, 2, &p, Now::default());
    disk.set_faults(FaultRates {
        sync_eio: 1_000_000,
        ..FaultRates::default()
    });
    let e = broker.shutdown_sync(Now::default()).unwrap_err();
    assert!(e.contains("Input/output error"), "{e}");
    assert_eq!(synced(&broker), 1);
}

/// A checkpoint that failed (a full disk: its write got ENOSPC) is not taken again by
/// the passes its own completion starts, which on a disk that stays full would be a busy
/// loop logging an error each time, but after the next housekeeping.
#[test]
fn a_failed_checkpoint_is_tried_again_at_housekeeping_not_on_every_pass() {
    let dir = tempfile::tempdir().unwrap();
    let jobs = HeldJobs::default();
    let config = BrokerConfig {
        data_dir: dir.path().to_path_buf(),
        journal_file_bytes: crate::log::JOURNAL_FILE_BYTES_MIN,
        ..BrokerConfig::default()
    };
    let storage = crate::log::FsStorage::shared();
    let (mut broker, _) =
        Broker::open(config, storage, Box::new(jobs.clone()), Now::default()).unwrap();
    let topic = declare(&mut broker, &jobs, "t", 1);
    let checkpoint_at = |jobs: &HeldJobs| {
        let held = jobs.0.borrow();
        held.iter()
            .position(|j| matches!(j.work, super::jobs::Work::Checkpoint { .. }))
    };
    let value = [7u8; 1024];
    let mut slot = 0;
    let failing = loop {
        let p = Pub {
            topic_id: topic,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            value: &value,
            ..Pub::default()
        };
        broker.publish(CONN, slot, &p, Now::default());
        slot += 1;
        broker.end_pass(Now::default(), &unlimited_room);
        if let Some(i) = checkpoint_at(&jobs) {
            break i;
        }
        jobs.run(&mut broker, |_| false);
        assert!(slot < 1_000, "no checkpoint after {slot} KiB of journal");
    };
    jobs.run(&mut broker, |i| i == failing);
    for _ in 0..3 {
        broker.end_pass(Now::default(), &unlimited_room);
        assert_eq!(checkpoint_at(&jobs), None, "taken again at once");
        jobs.run(&mut broker, |_| false);
    }
    broker.housekeeping(Now::default());
    broker.end_pass(Now::default(), &unlimited_room);
    assert!(
        checkpoint_at(&jobs).is_some(),
        "tried again after housekeeping"
    );
}
