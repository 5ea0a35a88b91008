//! Durable publish over real TCP (issue 4): DECLARE and the topic registry, PUB
//! validation and results, idempotent producers, segments, retention, a torn tail
//! across the process boundary and the data-size cap. Each test starts its own
//! `mortard` on a free port with its own data directory.

mod common;

use std::fmt::Debug;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::mortard::Mortard;
use common::wait::wait_until;
use mortarmq::client::{Client, ClientError};
use mortarmq::log::{FsStorage, LogConfig, PartitionLog, SEGMENT_HEADER_BYTES};
use mortarmq::wire::limits::{MAX_FRAME_LEN_BYTES, MAX_VALUE_LEN_BYTES};
use mortarmq::wire::ops::{Frame, Pub, PubResult};
use mortarmq::wire::{
    DeclareCreated, DeclareFlags, Durability, ErrorCode, PubFlags, PubResultFlags,
};

/// The 0x0012 message names the expected seq like this.
const EXPECTED: &str = "expected ";

// ---- helpers ----------------------------------------------------------------------

/// The broker error code of a failed request; panics on success or a non-broker error.
#[track_caller]
fn err_code<T: Debug>(r: Result<T, ClientError>) -> ErrorCode {
    match r {
        Ok(v) => panic!("expected an ERR, got {v:?}"),
        Err(e) => e
            .code()
            .unwrap_or_else(|| panic!("expected a registered broker error, got {e}")),
    }
}

/// The broker error code and message of a failed request.
#[track_caller]
fn err_message<T: Debug>(r: Result<T, ClientError>) -> (ErrorCode, String) {
    match r {
        Ok(v) => panic!("expected an ERR, got {v:?}"),
        Err(ClientError::Broker { code, message, .. }) => (
            ErrorCode::from_code(code).unwrap_or_else(|| panic!("unregistered 0x{code:04X}")),
            message,
        ),
        Err(e) => panic!("expected a broker error, got {e}"),
    }
}

#[track_caller]
fn expect_err<T: Debug>(r: Result<T, ClientError>, want: ErrorCode) {
    assert_eq!(err_code(r), want);
}

/// An idempotent (or, with producer_id 0, plain) PUB.
fn pub_idem(
    c: &mut Client,
    topic: u16,
    partition: u16,
    producer_id: u64,
    producer_seq: u64,
    durability: Option<Durability>,
    value: &[u8],
) -> Result<PubResult, ClientError> {
    c.publish(&Pub {
        topic_id: topic,
        partition,
        producer_id,
        producer_seq,
        flags: PubFlags::requesting(durability),
        key: b"",
        value,
    })
}

fn topic_dir(broker: &Mortard, topic_id: u16, name: &str) -> PathBuf {
    broker.data_dir().join("topics").join(format!(
        "{topic_id}-{:08x}",
        crc32fast::hash(name.as_bytes())
    ))
}

/// The `*.log` segment files of a partition directory, sorted by name (= first sequence).
fn segment_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    v.sort();
    v
}

/// Waits until the segment files of a partition directory hold `records_bytes` of records.
/// Small records wait in memory for their segment write once the journal has them, until
/// housekeeping (about once a second) writes them (`docs/STORAGE.md`, "Writes and
/// durability"); a test that damages a segment after a kill needs them there.
fn wait_for_segment_writes(dir: &Path, records_bytes: u64) {
    let held = || -> u64 {
        let files = segment_files(dir);
        let lens = files
            .iter()
            .map(|p| std::fs::metadata(p).map_or(0, |m| m.len()));
        lens.map(|len| len.saturating_sub(SEGMENT_HEADER_BYTES as u64))
            .sum()
    };
    let what = format!("{records_bytes} bytes of records in {}", dir.display());
    wait_until(&what, Duration::from_secs(10), || held() == records_bytes);
}

fn first_sequence_of(segment: &Path) -> u64 {
    segment
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("segment name {}", segment.display()))
}

/// A value of `len` bytes that names its index, so misplaced records are visible.
fn value_of(i: u64, len: usize) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    let fill = b'a' + (i % 26) as u8;
    v.resize(len, fill);
    v
}

/// Pipelines `values` as FSYNC PUBs to (topic, partition) and returns the results in order.
fn publish_burst(c: &mut Client, topic: u16, partition: u16, values: &[Vec<u8>]) -> Vec<PubResult> {
    for v in values {
        c.queue(&Frame::Pub(Pub {
            topic_id: topic,
            partition,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            value: v,
            ..Pub::default()
        }));
    }
    c.flush().unwrap();
    values
        .iter()
        .map(|_| c.recv_reply().unwrap().typed::<PubResult>().unwrap())
        .collect()
}

/// Reads a stopped broker's partition from disk: (sequence, producer_id, producer_seq, value).
fn read_partition(dir: &Path, segment_size_bytes: u64) -> Vec<(u64, u64, u64, Vec<u8>)> {
    let config = LogConfig {
        segment_size_bytes,
        ..LogConfig::default()
    };
    let (mut log, report) =
        PartitionLog::open(&FsStorage::shared(), dir, config).expect("open partition");
    assert!(report.is_clean(), "recovery after a clean stop: {report:?}");
    let mut out = Vec::new();
    let mut next = 1;
    loop {
        let got = log
            .read(next, 1024, usize::MAX, |r| {
                out.push((r.sequence, r.producer_id, r.producer_seq, r.value.to_vec()))
            })
            .expect("read");
        if got.records == 0 {
            break;
        }
        next = got.next_sequence;
    }
    out
}

// ---- DECLARE ----------------------------------------------------------------------

#[test]
fn declare_creates_pairs_with_odd_source_and_even_twin_ids() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let a = c.declare("orders", 3, DeclareFlags::empty()).unwrap();
    assert_eq!(
        (a.topic_id, a.partition_count, a.created),
        (1, 3, DeclareCreated::Created.as_code())
    );
    let b = c.declare("logs.v2_x-y", 1, DeclareFlags::empty()).unwrap();
    assert_eq!(
        (b.topic_id, b.partition_count, b.created),
        (3, 1, DeclareCreated::Created.as_code())
    );
    // The twins exist with the source's partition count, on disk and on the wire.
    for index in 0..3 {
        assert!(topic_dir(&broker, 1, "orders")
            .join(index.to_string())
            .is_dir());
        assert!(topic_dir(&broker, 2, "orders.dlq")
            .join(index.to_string())
            .is_dir());
    }
    assert!(topic_dir(&broker, 4, "logs.v2_x-y.dlq").join("0").is_dir());
    assert_eq!(
        c.publish_value(2, 2, b"dead", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    expect_err(
        c.publish_value(2, 3, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownPartition,
    );
    expect_err(
        c.publish_value(5, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
}

#[test]
fn declare_is_idempotent_with_the_same_count_and_conflicts_with_another() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    assert_eq!(
        c.declare("t", 2, DeclareFlags::empty()).unwrap().created,
        DeclareCreated::Created.as_code()
    );
    let again = c.declare("t", 2, DeclareFlags::empty()).unwrap();
    assert_eq!(
        (again.topic_id, again.partition_count, again.created),
        (1, 2, DeclareCreated::IdempotentOk.as_code())
    );
    let (code, message) = err_message(c.declare("t", 3, DeclareFlags::empty()));
    assert_eq!(code, ErrorCode::TopicConfigConflict);
    assert!(message.contains('2'), "names the existing count: {message}");
    // The conflict changed nothing, and a second connection sees the same pair.
    let mut other = broker.client();
    let seen = other.declare("t", 2, DeclareFlags::empty()).unwrap();
    assert_eq!(
        (seen.topic_id, seen.created),
        (1, DeclareCreated::IdempotentOk.as_code())
    );
}

#[test]
fn declare_passive_looks_up_and_never_creates() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    c.declare("p", 3, DeclareFlags::empty()).unwrap();
    // partition_count 0 = any.
    let hit = c.declare("p", 0, DeclareFlags::PASSIVE).unwrap();
    assert_eq!(
        (hit.topic_id, hit.partition_count, hit.created),
        (1, 3, DeclareCreated::IdempotentOk.as_code())
    );
    let exact = c.declare("p", 3, DeclareFlags::PASSIVE).unwrap();
    assert_eq!(
        (exact.partition_count, exact.created),
        (3, DeclareCreated::IdempotentOk.as_code())
    );
    // A non-zero wrong count is a conflict, not a hit.
    expect_err(
        c.declare("p", 2, DeclareFlags::PASSIVE),
        ErrorCode::TopicConfigConflict,
    );
    // A miss creates nothing.
    expect_err(
        c.declare("missing", 0, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.declare("missing", 4, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.declare("missing", 0, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    assert!(!topic_dir(&broker, 3, "missing").exists());
    // The next pair is still pair 1: the misses took no id.
    assert_eq!(
        c.declare("next", 1, DeclareFlags::empty())
            .unwrap()
            .topic_id,
        3
    );
}

#[test]
fn declare_delete_removes_the_pair() {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let id = c
        .declare("gone", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    c.publish_value(id, 1, b"v", Some(Durability::Fsynced))
        .unwrap();
    c.publish_value(id + 1, 0, b"d", Some(Durability::Fsynced))
        .unwrap();
    let keep = c
        .declare("kept", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    // DeclareFlags::DELETE ignores partition_count.
    let del = c.declare("gone", 0, DeclareFlags::DELETE).unwrap();
    assert_eq!(
        (del.topic_id, del.partition_count, del.created),
        (id, 2, DeclareCreated::Deleted.as_code())
    );
    expect_err(
        c.publish_value(id, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.publish_value(id + 1, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.declare("gone", 0, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.declare("gone", 0, DeclareFlags::DELETE),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.declare("never", 1, DeclareFlags::DELETE),
        ErrorCode::UnknownTopic,
    );
    // The twin is deleted only through its source.
    expect_err(
        c.declare("kept.dlq", 0, DeclareFlags::DELETE),
        ErrorCode::MutationNotPackable,
    );
    // The directories go once the registry without them is durable (before the OK).
    assert!(!topic_dir(&broker, id, "gone").exists(), "source dir left");
    assert!(
        !topic_dir(&broker, id + 1, "gone.dlq").exists(),
        "twin dir left"
    );
    assert!(topic_dir(&broker, keep, "kept").is_dir());
    broker.restart();
    let mut c = broker.client();
    expect_err(
        c.declare("gone", 0, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    assert!(
        !topic_dir(&broker, id, "gone").exists(),
        "source dir back after restart"
    );
    assert!(!topic_dir(&broker, id + 1, "gone.dlq").exists());
    assert_eq!(
        c.declare("kept", 0, DeclareFlags::PASSIVE)
            .unwrap()
            .topic_id,
        keep
    );
    // Recreating the name is a new pair with fresh sequences.
    let again = c.declare("gone", 1, DeclareFlags::empty()).unwrap();
    assert_eq!(again.created, DeclareCreated::Created.as_code());
    assert_eq!(again.topic_id, 5, "a never-used pair, not the freed one");
    assert_eq!(
        c.publish_value(5, 0, b"new", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
}

#[test]
fn declare_refuses_bad_names() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let long = "a".repeat(256);
    for name in [
        "",
        long.as_str(),
        "a b",
        "a/b",
        "../x",
        "é",
        "tab\t",
        "a:b",
        "a*",
    ] {
        for flags in [
            DeclareFlags::empty(),
            DeclareFlags::PASSIVE,
            DeclareFlags::DELETE,
        ] {
            assert_eq!(
                err_code(c.declare(name, 1, flags)),
                ErrorCode::InvalidTopicName,
                "name {name:?} flags {flags:?}"
            );
        }
    }
    // Not UTF-8 at all.
    let raw = c.request(&Frame::Declare(mortarmq::wire::ops::Declare {
        topic: &[0xFF, 0xFE],
        partition_count: 1,
        flags: DeclareFlags::empty(),
    }));
    expect_err(raw, ErrorCode::InvalidTopicName);
    for name in ["x.dlq", ".dlq", "a.b.dlq"] {
        for flags in [
            DeclareFlags::empty(),
            DeclareFlags::PASSIVE,
            DeclareFlags::DELETE,
        ] {
            assert_eq!(
                err_code(c.declare(name, 1, flags)),
                ErrorCode::MutationNotPackable,
                "name {name:?} flags {flags:?}"
            );
        }
    }
    // Every accepted character, and names that merely contain "dlq".
    for name in ["AZaz09._-", "dlq", "x.dlq2", "x-dlq", ".", "-"] {
        assert_eq!(
            c.declare(name, 1, DeclareFlags::empty()).unwrap().created,
            DeclareCreated::Created.as_code(),
            "{name}"
        );
    }
    c.ping().unwrap();
}

#[test]
fn declare_accepts_a_255_byte_name() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let name = "n".repeat(255);
    let r = c
        .declare(&name, 1, DeclareFlags::empty())
        .unwrap_or_else(|e| panic!("255-byte name: {e}"));
    assert_eq!(r.created, DeclareCreated::Created.as_code());
    assert_eq!(
        c.publish_value(r.topic_id, 0, b"v", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
}

#[test]
fn declare_checks_partition_count_against_max_partitions() {
    let broker = Mortard::start(&["--max-partitions", "4"]);
    let mut c = broker.client();
    expect_err(
        c.declare("zero", 0, DeclareFlags::empty()),
        ErrorCode::InvalidArgument,
    );
    expect_err(
        c.declare("five", 5, DeclareFlags::empty()),
        ErrorCode::InvalidArgument,
    );
    expect_err(
        c.declare("big", u16::MAX, DeclareFlags::empty()),
        ErrorCode::InvalidArgument,
    );
    let four = c.declare("four", 4, DeclareFlags::empty()).unwrap();
    assert_eq!(
        (four.topic_id, four.partition_count),
        (1, 4),
        "refusals took no id"
    );
    assert_eq!(
        c.publish_value(1, 3, b"v", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    expect_err(
        c.publish_value(1, 4, b"v", Some(Durability::Fsynced)),
        ErrorCode::UnknownPartition,
    );
}

#[test]
fn deleted_pair_ids_are_not_reused_while_unused_pairs_remain() {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    assert_eq!(
        c.declare("a", 1, DeclareFlags::empty()).unwrap().topic_id,
        1
    );
    assert_eq!(
        c.declare("b", 1, DeclareFlags::empty()).unwrap().topic_id,
        3
    );
    assert_eq!(
        c.declare("a", 0, DeclareFlags::DELETE).unwrap().created,
        DeclareCreated::Deleted.as_code()
    );
    assert_eq!(
        c.declare("c", 1, DeclareFlags::empty()).unwrap().topic_id,
        5
    );
    assert_eq!(
        c.declare("a", 1, DeclareFlags::empty()).unwrap().topic_id,
        7,
        "same name, new pair"
    );
    assert_eq!(
        c.declare("b", 0, DeclareFlags::DELETE).unwrap().created,
        DeclareCreated::Deleted.as_code()
    );
    // The registry remembers which pairs were ever used across a restart.
    broker.restart();
    let mut c = broker.client();
    assert_eq!(
        c.declare("d", 1, DeclareFlags::empty()).unwrap().topic_id,
        9
    );
    expect_err(
        c.publish_value(1, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.publish_value(3, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
}

#[test]
fn topics_survive_a_clean_restart() {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    c.declare("one", 1, DeclareFlags::empty()).unwrap();
    c.declare("three", 3, DeclareFlags::empty()).unwrap();
    c.publish_value(3, 2, b"x", Some(Durability::Fsynced))
        .unwrap();
    drop(c);
    let status = broker.terminate();
    assert!(status.success(), "{status:?}");
    broker.restart();
    let mut c = broker.client();
    let one = c.declare("one", 0, DeclareFlags::PASSIVE).unwrap();
    assert_eq!((one.topic_id, one.partition_count), (1, 1));
    let three = c.declare("three", 0, DeclareFlags::PASSIVE).unwrap();
    assert_eq!((three.topic_id, three.partition_count), (3, 3));
    assert_eq!(
        c.declare("three", 3, DeclareFlags::empty())
            .unwrap()
            .created,
        DeclareCreated::IdempotentOk.as_code()
    );
    expect_err(
        c.declare("three", 2, DeclareFlags::empty()),
        ErrorCode::TopicConfigConflict,
    );
    assert_eq!(
        c.publish_value(3, 2, b"y", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        2
    );
    assert_eq!(
        c.publish_value(4, 2, b"y", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    assert_eq!(
        c.declare("four", 1, DeclareFlags::empty())
            .unwrap()
            .topic_id,
        5
    );
}

#[test]
fn the_registry_is_durable_before_the_declare_ok() {
    let mut broker = Mortard::start(&[]);
    for round in 0..3u16 {
        let name = format!("k{round}");
        let mut c = broker.client();
        let r = c.declare(&name, round + 1, DeclareFlags::empty()).unwrap();
        assert_eq!(r.created, DeclareCreated::Created.as_code());
        // No grace: SIGKILL the moment the OK is in.
        broker.restart_after_kill9();
        let mut c = broker.client();
        let hit = c
            .declare(&name, 0, DeclareFlags::PASSIVE)
            .unwrap_or_else(|e| panic!("topic {name} lost by SIGKILL after its OK: {e}"));
        assert_eq!((hit.topic_id, hit.partition_count), (r.topic_id, round + 1));
    }
    // A DeclareFlags::DELETE acknowledged before a SIGKILL stays deleted.
    let mut c = broker.client();
    assert_eq!(
        c.declare("k1", 0, DeclareFlags::DELETE).unwrap().created,
        DeclareCreated::Deleted.as_code()
    );
    broker.restart_after_kill9();
    let mut c = broker.client();
    expect_err(
        c.declare("k1", 0, DeclareFlags::PASSIVE),
        ErrorCode::UnknownTopic,
    );
    assert!(!topic_dir(&broker, 3, "k1").exists());
    assert_eq!(
        c.declare("k2", 0, DeclareFlags::PASSIVE).unwrap().topic_id,
        5
    );
}

// ---- PUB validation ---------------------------------------------------------------

#[test]
fn pub_validation_errors_keep_the_connection() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("v", 2, DeclareFlags::empty()).unwrap().topic_id;
    expect_err(
        c.publish_value(99, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.publish_value(0, 0, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownTopic,
    );
    expect_err(
        c.publish_value(t, 2, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownPartition,
    );
    expect_err(
        c.publish_value(t, u16::MAX, b"x", None),
        ErrorCode::UnknownPartition,
    );
    let key = [b'k'; 256];
    let long_key = c.publish(&Pub {
        topic_id: t,
        key: &key,
        value: b"x",
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        ..Pub::default()
    });
    expect_err(long_key, ErrorCode::KeyTooLarge);
    let ok_key = c.publish(&Pub {
        topic_id: t,
        key: &key[..255],
        value: b"x",
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        ..Pub::default()
    });
    assert_eq!(ok_key.unwrap().sequence, 1, "a 255-byte key is fine");
    expect_err(
        pub_idem(&mut c, t, 0, 0, 1, Some(Durability::Fsynced), b"x"),
        ErrorCode::InvalidProducer,
    );
    expect_err(
        pub_idem(&mut c, t, 0, 5, 0, Some(Durability::Fsynced), b"x"),
        ErrorCode::InvalidProducer,
    );
    let (code, message) = err_message(c.publish_value(t, 0, b"x", Some(Durability::Replicated)));
    assert_eq!(code, ErrorCode::DurabilityUnavailable);
    assert!(!message.is_empty());
    // Nothing refused was appended.
    assert_eq!(
        c.publish_value(t, 0, b"y", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        2
    );
    assert_eq!(
        c.publish_value(t, 1, b"y", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    c.ping().unwrap();
}

#[test]
fn pub_refuses_a_value_one_byte_over_max_value_len() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("big", 1, DeclareFlags::empty()).unwrap().topic_id;
    let over = vec![0x5Au8; MAX_VALUE_LEN_BYTES as usize + 1];
    // op + topic + partition + producer_id + producer_seq + flags + key_len + value_len.
    let frame_len = 1 + 2 + 2 + 8 + 8 + 2 + 2 + 4 + over.len();
    assert!(
        frame_len <= MAX_FRAME_LEN_BYTES as usize,
        "the frame itself is legal"
    );
    let (code, message) = err_message(c.publish_value(t, 0, &over, Some(Durability::Fsynced)));
    assert_eq!(code, ErrorCode::ValueTooLarge);
    assert!(message.contains(&over.len().to_string()), "{message}");
    // The connection is intact and nothing was appended.
    c.ping().unwrap();
    let max = &over[..MAX_VALUE_LEN_BYTES as usize];
    let r = c
        .publish_value(t, 0, max, Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(
        (r.sequence, r.durability),
        (1, 2),
        "exactly MAX_VALUE_LEN is accepted"
    );
    assert_eq!(
        c.publish_value(t, 0, b"small", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        2
    );
}

#[test]
fn pub_to_the_dlq_twin_is_allowed() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("src", 2, DeclareFlags::empty()).unwrap().topic_id;
    let twin = t + 1;
    assert_eq!(
        c.publish_value(twin, 1, b"replay", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    assert_eq!(
        c.publish_value(twin, 1, b"replay", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        2
    );
    // Its sequences are its own.
    assert_eq!(
        c.publish_value(t, 1, b"src", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    let idem = pub_idem(&mut c, twin, 0, 11, 1, Some(Durability::Fsynced), b"i").unwrap();
    assert_eq!(idem.sequence, 1);
    let dup = pub_idem(&mut c, twin, 0, 11, 1, Some(Durability::Fsynced), b"i").unwrap();
    assert_eq!(
        (dup.sequence, dup.result_flags.bits() & 1),
        (1, PubResultFlags::DEDUPLICATED.bits())
    );
    expect_err(
        c.publish_value(twin, 2, b"x", Some(Durability::Fsynced)),
        ErrorCode::UnknownPartition,
    );
}

// ---- PUB results ------------------------------------------------------------------

#[test]
fn sequences_start_at_1_and_are_contiguous_per_partition() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("seq", 3, DeclareFlags::empty()).unwrap().topic_id;
    let mut next = [1u64; 3];
    // Interleave partitions in a fixed but uneven pattern, mixing the durabilities.
    for i in 0..60u64 {
        let partition = ((i * 7) % 5 % 3) as u16;
        let flags = [Some(Durability::Fsynced), Some(Durability::Written), None][(i % 3) as usize];
        let r = c
            .publish_value(t, partition, &value_of(i, 20), flags)
            .unwrap();
        assert_eq!(
            r.sequence, next[partition as usize],
            "PUB {i} to {partition}"
        );
        next[partition as usize] += 1;
    }
    assert!(
        next.iter().all(|&n| n > 10),
        "every partition was used: {next:?}"
    );
    // Pipelined too: answers in request order, sequences contiguous.
    let values: Vec<Vec<u8>> = (0..200).map(|i| value_of(i, 50)).collect();
    let results = publish_burst(&mut c, t, 1, &values);
    for (i, r) in results.iter().enumerate() {
        assert_eq!(r.sequence, next[1] + i as u64);
    }
}

#[test]
fn durability_and_commit_seq_follow_the_request() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("dur", 1, DeclareFlags::empty()).unwrap().topic_id;
    for i in 0..20 {
        let r = c
            .publish_value(t, 0, b"f", Some(Durability::Fsynced))
            .unwrap();
        assert_eq!(r.durability, 2, "FSYNC answer {i}");
        assert!(r.commit_seq >= r.sequence, "{r:?}");
        let d = c.publish_value(t, 0, b"d", None).unwrap();
        assert_eq!(d.durability, 2, "DEFAULT with --durability fsync (default)");
        assert!(d.commit_seq >= d.sequence, "{d:?}");
        let w = c
            .publish_value(t, 0, b"w", Some(Durability::Written))
            .unwrap();
        assert!(w.durability >= 1 && w.durability <= 2, "{w:?}");
        assert!(w.commit_seq <= w.sequence, "nothing above it exists: {w:?}");
        assert_eq!(w.result_flags.bits(), 0);
    }
    // A WRITTEN PUB is answered at the write; a FSYNC one after it covers both.
    let w = c
        .publish_value(t, 0, b"w", Some(Durability::Written))
        .unwrap();
    let f = c
        .publish_value(t, 0, b"f", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(f.sequence, w.sequence + 1);
    assert!(f.commit_seq >= f.sequence);
}

#[test]
fn durability_written_flag_makes_default_answer_at_written() {
    let broker = Mortard::start(&["--durability", "written"]);
    let mut c = broker.client();
    let t = c.declare("w", 1, DeclareFlags::empty()).unwrap().topic_id;
    for i in 1..=20u64 {
        let d = c.publish_value(t, 0, b"d", None).unwrap();
        assert_eq!(d.sequence, 2 * i - 1);
        // Answered in the pass that wrote it, before any fdatasync covering it returned.
        assert_eq!(d.durability, 1, "DEFAULT under --durability written: {d:?}");
        assert!(d.commit_seq < d.sequence, "{d:?}");
        // An explicit FSYNC still waits for the disk.
        let f = c
            .publish_value(t, 0, b"f", Some(Durability::Fsynced))
            .unwrap();
        assert_eq!((f.sequence, f.durability), (2 * i, 2));
        assert!(f.commit_seq >= f.sequence);
    }
}

#[test]
fn leader_epoch_counts_starts_of_the_data_directory() {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("e", 1, DeclareFlags::empty()).unwrap().topic_id;
    let r = c
        .publish_value(t, 0, b"1", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!((r.sequence, r.leader_epoch), (1, 1));
    let r = c
        .publish_value(t, 0, b"2", Some(Durability::Written))
        .unwrap();
    assert_eq!(r.leader_epoch, 1);
    drop(c);
    broker.restart();
    let mut c = broker.client();
    let r = c
        .publish_value(t, 0, b"3", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!((r.sequence, r.leader_epoch), (3, 2));
    drop(c);
    broker.restart_after_kill9();
    let mut c = broker.client();
    let r = c
        .publish_value(t, 0, b"4", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!((r.sequence, r.leader_epoch), (4, 3));
    let dup = pub_idem(&mut c, t, 0, 1, 1, Some(Durability::Fsynced), b"5").unwrap();
    assert_eq!(dup.leader_epoch, 3);
}

// ---- idempotent producers ---------------------------------------------------------

#[test]
fn idempotent_producer_duplicates_append_nothing() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c
        .declare("idem", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let pid = 0xABCD;
    let r1 = pub_idem(&mut c, t, 0, pid, 1, Some(Durability::Fsynced), b"a").unwrap();
    let r2 = pub_idem(&mut c, t, 0, pid, 2, Some(Durability::Fsynced), b"b").unwrap();
    assert_eq!((r1.sequence, r2.sequence), (1, 2));
    assert_eq!(r1.result_flags.bits() | r2.result_flags.bits(), 0);
    for flags in [Some(Durability::Fsynced), Some(Durability::Written), None] {
        let dup = pub_idem(&mut c, t, 0, pid, 2, flags, b"b").unwrap();
        assert_eq!(dup.sequence, 2, "the original's sequence");
        assert!(dup.result_flags.contains(PubResultFlags::DEDUPLICATED));
        let old = pub_idem(&mut c, t, 0, pid, 1, flags, b"a").unwrap();
        assert_eq!((old.sequence, old.result_flags.bits() & 1), (1, 1));
    }
    // Nothing was appended by the duplicates: the next fresh PUB is sequence 3.
    let r3 = pub_idem(&mut c, t, 0, pid, 3, Some(Durability::Fsynced), b"c").unwrap();
    assert_eq!((r3.sequence, r3.result_flags.bits()), (3, 0));
    assert_eq!(
        c.publish_value(t, 0, b"plain", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        4
    );
    // Producer state is per partition: seq 1 is new on partition 1.
    let p1 = pub_idem(&mut c, t, 1, pid, 1, Some(Durability::Fsynced), b"a").unwrap();
    assert_eq!((p1.sequence, p1.result_flags.bits()), (1, 0));
    // And per producer: another id with the same seqs is not a duplicate.
    let other = pub_idem(&mut c, t, 0, pid + 1, 3, Some(Durability::Fsynced), b"o").unwrap();
    assert_eq!((other.sequence, other.result_flags.bits()), (5, 0));
    // A duplicate pipelined right behind its original waits for it, then answers.
    c.queue(&Frame::Pub(Pub {
        topic_id: t,
        producer_id: pid,
        producer_seq: 4,
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        value: b"d",
        ..Pub::default()
    }));
    c.queue(&Frame::Pub(Pub {
        topic_id: t,
        producer_id: pid,
        producer_seq: 4,
        flags: PubFlags::requesting(Some(Durability::Fsynced)),
        value: b"d",
        ..Pub::default()
    }));
    c.flush().unwrap();
    let a: PubResult = c.recv_reply().unwrap().typed().unwrap();
    let b: PubResult = c.recv_reply().unwrap().typed().unwrap();
    assert_eq!((a.sequence, a.result_flags.bits()), (6, 0));
    assert_eq!((b.sequence, b.result_flags.bits(), b.durability), (6, 1, 2));
    assert!(b.commit_seq >= 6);
    assert_eq!(
        c.publish_value(t, 0, b"plain", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        7
    );
}

#[test]
fn idempotent_producer_seq_must_not_skip_ahead() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c
        .declare("skip", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for s in 1..=3 {
        pub_idem(&mut c, t, 0, 7, s, Some(Durability::Fsynced), b"x").unwrap();
    }
    for bad in [5, 4 + 1024, u64::MAX] {
        let (code, message) = err_message(pub_idem(
            &mut c,
            t,
            0,
            7,
            bad,
            Some(Durability::Fsynced),
            b"x",
        ));
        assert_eq!(code, ErrorCode::SequenceOutOfOrder, "seq {bad}");
        assert!(
            message.contains(&format!("{EXPECTED}4")),
            "names the expected seq: {message}"
        );
    }
    // The refusals changed nothing.
    let r = pub_idem(&mut c, t, 0, 7, 4, Some(Durability::Fsynced), b"x").unwrap();
    assert_eq!((r.sequence, r.result_flags.bits()), (4, 0));
    // A producer the partition does not know may start anywhere >= 1.
    let start = pub_idem(&mut c, t, 0, 8, 1_000_000, Some(Durability::Fsynced), b"n").unwrap();
    assert_eq!((start.sequence, start.result_flags.bits()), (5, 0));
    let next = pub_idem(&mut c, t, 0, 8, 1_000_001, Some(Durability::Fsynced), b"n").unwrap();
    assert_eq!(next.sequence, 6);
    let (code, message) = err_message(pub_idem(
        &mut c,
        t,
        0,
        8,
        1,
        Some(Durability::Fsynced),
        b"n",
    ));
    assert_eq!(
        code,
        ErrorCode::SequenceOutOfOrder,
        "below its first seq: {message}"
    );
    assert!(message.contains(&format!("{EXPECTED}1000002")), "{message}");
}

#[test]
fn idempotent_duplicates_older_than_the_window_are_refused() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c
        .declare("window", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    const LAST: u64 = 1100;
    for s in 1..=LAST {
        c.queue(&Frame::Pub(Pub {
            topic_id: t,
            producer_id: 3,
            producer_seq: s,
            flags: PubFlags::requesting(Some(Durability::Written)),
            value: b"w",
            ..Pub::default()
        }));
    }
    c.flush().unwrap();
    for s in 1..=LAST {
        let r: PubResult = c.recv_reply().unwrap().typed().unwrap();
        assert_eq!((r.sequence, r.result_flags.bits()), (s, 0));
    }
    // The window holds the last 1024 seqs: LAST-1023 ..= LAST.
    let edge = LAST - 1023;
    let dup = pub_idem(&mut c, t, 0, 3, edge, Some(Durability::Fsynced), b"w").unwrap();
    assert_eq!((dup.sequence, dup.result_flags.bits()), (edge, 1));
    assert_eq!(dup.durability, 2, "answered once the original is FSYNCED");
    for old in [edge - 1, 1] {
        let (code, message) = err_message(pub_idem(
            &mut c,
            t,
            0,
            3,
            old,
            Some(Durability::Fsynced),
            b"w",
        ));
        assert_eq!(code, ErrorCode::SequenceOutOfOrder, "seq {old}: {message}");
        assert!(
            message.contains(&format!("{EXPECTED}{}", LAST + 1)),
            "{message}"
        );
    }
    let r = pub_idem(&mut c, t, 0, 3, LAST + 1, Some(Durability::Fsynced), b"w").unwrap();
    assert_eq!((r.sequence, r.result_flags.bits()), (LAST + 1, 0));
}

#[test]
fn idle_producers_expire_after_producer_ttl() {
    let mut broker = Mortard::start(&["--producer-ttl", "1s"]);
    let mut c = broker.client();
    let t = c.declare("ttl", 1, DeclareFlags::empty()).unwrap().topic_id;
    for s in 1..=3 {
        pub_idem(&mut c, t, 0, 5, s, Some(Durability::Fsynced), b"x").unwrap();
    }
    // Right away, seq 10 skips ahead. Refused PUBs do not count as activity, so once the
    // producer has been idle for the TTL (housekeeping runs each second) it is forgotten
    // and may start again anywhere.
    let started = Instant::now();
    let r = loop {
        match pub_idem(&mut c, t, 0, 5, 10, Some(Durability::Fsynced), b"y") {
            Ok(r) => break r,
            Err(e) => {
                assert_eq!(e.code(), Some(ErrorCode::SequenceOutOfOrder), "{e}");
                assert!(started.elapsed() < Duration::from_secs(5), "never expired");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "expired too early"
    );
    assert_eq!((r.sequence, r.result_flags.bits()), (4, 0));
    // Records older than the TTL do not rebuild producer state at start either.
    drop(c);
    std::thread::sleep(Duration::from_millis(1100));
    broker.restart();
    let mut c = broker.client();
    let r = pub_idem(&mut c, t, 0, 5, 3, Some(Durability::Fsynced), b"z").unwrap();
    assert_eq!(
        (r.sequence, r.result_flags.bits()),
        (5, 0),
        "stale producer state was rebuilt"
    );
}

fn dedup_survives_restart(kill: bool) {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c
        .declare("survive", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for s in 1..=5 {
        pub_idem(
            &mut c,
            t,
            1,
            42,
            s,
            Some(Durability::Fsynced),
            &value_of(s, 10),
        )
        .unwrap();
        pub_idem(&mut c, t, 0, 43, 100 + s, Some(Durability::Fsynced), b"x").unwrap();
        c.publish_value(t, 1, b"plain", Some(Durability::Fsynced))
            .unwrap();
    }
    drop(c);
    if kill {
        broker.restart_after_kill9();
    } else {
        broker.restart();
    }
    let mut c = broker.client();
    // Producer 42's records on partition 1 were sequences 1, 3, 5, 7, 9.
    for s in 1..=5 {
        let dup = pub_idem(
            &mut c,
            t,
            1,
            42,
            s,
            Some(Durability::Fsynced),
            &value_of(s, 10),
        )
        .unwrap();
        assert_eq!(
            (dup.sequence, dup.result_flags.bits()),
            (2 * s - 1, 1),
            "seq {s}"
        );
    }
    let dup = pub_idem(&mut c, t, 0, 43, 105, Some(Durability::Fsynced), b"x").unwrap();
    assert_eq!((dup.sequence, dup.result_flags.bits()), (5, 1));
    let (code, message) = err_message(pub_idem(
        &mut c,
        t,
        1,
        42,
        7,
        Some(Durability::Fsynced),
        b"x",
    ));
    assert_eq!(code, ErrorCode::SequenceOutOfOrder);
    assert!(message.contains(&format!("{EXPECTED}6")), "{message}");
    let next = pub_idem(&mut c, t, 1, 42, 6, Some(Durability::Fsynced), b"x").unwrap();
    assert_eq!((next.sequence, next.result_flags.bits()), (11, 0));
    let next = pub_idem(&mut c, t, 0, 43, 106, Some(Durability::Fsynced), b"x").unwrap();
    assert_eq!((next.sequence, next.result_flags.bits()), (6, 0));
}

#[test]
fn dedup_state_survives_a_sigterm_restart() {
    dedup_survives_restart(false);
}

#[test]
fn dedup_state_is_rebuilt_from_the_log_after_sigkill() {
    dedup_survives_restart(true);
}

// ---- segments, retention, torn tails, the data cap --------------------------------

#[test]
fn segments_roll_and_sequences_continue_after_restart() {
    const SEGMENT: u64 = 64 * 1024;
    const N: u64 = 400;
    let mut broker = Mortard::start(&["--segment-size", "64KiB"]);
    let mut c = broker.client();
    let t = c
        .declare("roll", 2, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let values: Vec<Vec<u8>> = (1..=N).map(|i| value_of(i, 1000)).collect();
    for (i, r) in publish_burst(&mut c, t, 0, &values).iter().enumerate() {
        assert_eq!(r.sequence, i as u64 + 1);
    }
    let dir = topic_dir(&broker, t, "roll").join("0");
    let segments = segment_files(&dir);
    // ~1048 bytes per record: 62 per 64 KiB segment, so 400 records take 7 segments.
    assert!(segments.len() >= 6, "segments: {segments:?}");
    assert_eq!(first_sequence_of(&segments[0]), 1);
    for s in &segments {
        assert!(
            std::fs::metadata(s).unwrap().len() <= SEGMENT,
            "{} too big",
            s.display()
        );
        assert!(
            s.with_extension("idx").is_file(),
            "{} has no index",
            s.display()
        );
    }
    assert_eq!(
        segment_files(&topic_dir(&broker, t, "roll").join("1")).len(),
        1
    );
    drop(c);
    broker.restart();
    let mut c = broker.client();
    assert_eq!(
        c.publish_value(t, 0, b"after", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        N + 1
    );
    assert_eq!(
        c.publish_value(t, 1, b"after", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        1
    );
    drop(c);
    assert!(broker.terminate().success());
    // Read back from disk: every record, in order, with its bytes.
    let records = read_partition(&dir, SEGMENT);
    assert_eq!(records.len() as u64, N + 1);
    for (i, (sequence, _, _, value)) in records.iter().enumerate() {
        assert_eq!(*sequence, i as u64 + 1);
        if (i as u64) < N {
            assert_eq!(value, &values[i], "record {sequence}");
        }
    }
    assert_eq!(records[N as usize].3, b"after");
    // Segment names are their first sequences (also in their headers), and each one
    // starts where the previous one's index says it ended.
    // A closed segment's index ends in an 8-byte seal (docs/STORAGE.md).
    let mut first = 1;
    let segments = segment_files(&dir);
    for (i, s) in segments.iter().enumerate() {
        assert_eq!(first_sequence_of(s), first, "{}", s.display());
        let header = std::fs::read(s).unwrap();
        assert_eq!(&header[..4], b"MMQL");
        assert_eq!(u64::from_be_bytes(header[8..16].try_into().unwrap()), first);
        let seal = if i + 1 < segments.len() { 8 } else { 0 };
        first += (std::fs::metadata(s.with_extension("idx")).unwrap().len() - seal) / 4;
    }
    assert_eq!(first, N + 2);
}

#[test]
fn records_larger_than_a_segment_and_multi_roll_batches_survive_sigkill() {
    const SEGMENT: u64 = 4096;
    let mut broker = Mortard::start(&["--segment-size", "4KiB"]);
    let mut c = broker.client();
    let t = c
        .declare("huge", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    // Sizes around the segment size: each big one gets a segment of its own, and one
    // pipelined batch (one flush) crosses many rolls.
    let sizes = [
        10_000, 100, 4096, 4000, 1, 3000, 3000, 20_000, 50, 4048, 4049, 0, 700,
    ];
    let mut values: Vec<Vec<u8>> = Vec::new();
    for round in 0..3u64 {
        let batch: Vec<Vec<u8>> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| value_of(round * 100 + i as u64, n))
            .collect();
        let base = values.len() as u64;
        for (i, r) in publish_burst(&mut c, t, 0, &batch).iter().enumerate() {
            assert_eq!(r.sequence, base + i as u64 + 1);
        }
        values.extend(batch);
    }
    drop(c);
    broker.restart_after_kill9();
    let mut c = broker.client();
    let n = values.len() as u64;
    assert_eq!(
        c.publish_value(t, 0, b"next", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        n + 1
    );
    drop(c);
    assert!(broker.terminate().success());
    let dir = topic_dir(&broker, t, "huge").join("0");
    let segments = segment_files(&dir);
    assert!(segments.len() >= 12, "{} segments", segments.len());
    let records = read_partition(&dir, SEGMENT);
    assert_eq!(records.len() as u64, n + 1);
    for (i, v) in values.iter().enumerate() {
        assert_eq!(
            (records[i].0, &records[i].3),
            (i as u64 + 1, v),
            "record {}",
            i + 1
        );
    }
}

#[test]
fn retention_deletes_old_segments_while_sequences_continue() {
    const N: u64 = 1024;
    let broker = Mortard::start(&["--segment-size", "64KiB", "--retention-size", "128KiB"]);
    let mut c = broker.client();
    let t = c.declare("ret", 1, DeclareFlags::empty()).unwrap().topic_id;
    let dir = topic_dir(&broker, t, "ret").join("0");
    let values: Vec<Vec<u8>> = (1..=N).map(|i| value_of(i, 1000)).collect();
    for chunk in values.chunks(128) {
        publish_burst(&mut c, t, 0, chunk);
    }
    // Housekeeping runs about once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    let segments = loop {
        let segments = segment_files(&dir);
        let bytes: u64 = segments
            .iter()
            .map(|s| std::fs::metadata(s).unwrap().len())
            .sum();
        if bytes <= 128 * 1024 + 64 * 1024 || Instant::now() >= deadline {
            break segments;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let bytes: u64 = segments
        .iter()
        .map(|s| std::fs::metadata(s).unwrap().len())
        .sum();
    assert!(
        segments.len() <= 3,
        "retention kept {} segments ({bytes} bytes)",
        segments.len()
    );
    assert!(bytes <= 128 * 1024 + 64 * 1024, "{bytes} bytes kept");
    let oldest = first_sequence_of(&segments[0]);
    assert!(oldest > 800, "oldest kept sequence {oldest}");
    // Index files went with their segments.
    let idx = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "idx"))
        .count();
    assert_eq!(idx, segments.len());
    assert_eq!(
        c.publish_value(t, 0, b"next", Some(Durability::Fsynced))
            .unwrap()
            .sequence,
        N + 1
    );
    assert!(broker.log_text().contains("retention deleted"));
}

#[test]
fn a_torn_last_record_is_cut_at_restart_and_given_back_by_the_journal() {
    const N: u64 = 25;
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c
        .declare("torn", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 1..=N {
        let r = pub_idem(
            &mut c,
            t,
            0,
            9,
            i,
            Some(Durability::Fsynced),
            &value_of(i, 200),
        )
        .unwrap();
        assert_eq!((r.sequence, r.durability), (i, 2));
    }
    drop(c);
    let dir = topic_dir(&broker, t, "torn").join("0");
    wait_for_segment_writes(&dir, N * 248);
    broker.kill9();
    let last = segment_files(&dir).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let file = std::fs::OpenOptions::new().write(true).open(&last).unwrap();
    file.set_len(len - 5).unwrap();
    file.sync_all().unwrap();
    drop(file);
    broker.restart();
    let mut c = broker.client();
    // The journal made record N durable: the segment's torn tail is cut, and the record
    // comes back from the journal, so its producer seq is a duplicate.
    let r = pub_idem(
        &mut c,
        t,
        0,
        9,
        N,
        Some(Durability::Fsynced),
        &value_of(N, 200),
    )
    .unwrap();
    assert_eq!(
        (r.sequence, r.result_flags.bits()),
        (N, 1),
        "record {N} given back by the journal"
    );
    // The torn record was 48 + 200 bytes; 5 were cut, so 243 remained to truncate.
    let log = broker.log_text();
    assert!(
        log.contains(&format!(
            "recovery truncated 243 bytes of topic {t} partition 0"
        )),
        "the truncation is logged:\n{log}"
    );
    assert!(log.contains("1 records given back"), "{log}");
    drop(c);
    assert!(broker.terminate().success());
    let records = read_partition(&dir, 64 * 1024 * 1024);
    assert_eq!(records.len() as u64, N);
    for (i, (sequence, pid, pseq, value)) in records.iter().enumerate() {
        let i = i as u64 + 1;
        assert_eq!((*sequence, *pid, *pseq), (i, 9, i));
        assert_eq!(value, &value_of(i, 200));
    }
}

fn publish_then_kill(broker: &mut Mortard, n: u64) -> u16 {
    let mut c = broker.client();
    let t = c.declare("bad", 1, DeclareFlags::empty()).unwrap().topic_id;
    for i in 1..=n {
        let r = pub_idem(
            &mut c,
            t,
            0,
            9,
            i,
            Some(Durability::Fsynced),
            &value_of(i, 200),
        )
        .unwrap();
        assert_eq!(r.sequence, i);
    }
    wait_for_segment_writes(&topic_dir(broker, t, "bad").join("0"), n * 248);
    broker.kill9();
    t
}

#[test]
fn a_crc_failure_in_the_unindexed_tail_is_cut_and_given_back_by_the_journal() {
    const N: u64 = 30;
    const BAD: u64 = 28;
    let mut broker = Mortard::start(&[]);
    let t = publish_then_kill(&mut broker, N);
    let dir = topic_dir(&broker, t, "bad").join("0");
    let seg = segment_files(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    assert_eq!(bytes.len() as u64, 16 + N * 248);
    // A damaged record past the recovery point, where the index does not reach yet
    // (the index is written after the records, and synced only at checkpoints).
    bytes[(16 + (BAD - 1) * 248 + 100) as usize] ^= 0x40;
    std::fs::write(&seg, &bytes).unwrap();
    let idx = seg.with_extension("idx");
    let f = std::fs::OpenOptions::new().write(true).open(&idx).unwrap();
    f.set_len((BAD - 2) * 4).unwrap();
    drop(f);
    broker.restart();
    let mut c = broker.client();
    for seq in [BAD - 1, BAD, N] {
        let dup = pub_idem(&mut c, t, 0, 9, seq, Some(Durability::Fsynced), b"?").unwrap();
        assert_eq!((dup.sequence, dup.result_flags.bits()), (seq, 1), "{seq}");
    }
    let cut = (N - BAD + 1) * 248;
    let log = broker.log_text();
    assert!(
        log.contains(&format!(
            "recovery truncated {cut} bytes of topic {t} partition 0"
        )),
        "the truncation is logged"
    );
    assert!(
        log.contains(&format!("{} records given back", N - BAD + 1)),
        "{log}"
    );
    drop(c);
    assert!(broker.terminate().success());
    let records = read_partition(&dir, 64 * 1024 * 1024);
    assert_eq!(records.len() as u64, N);
    assert_eq!(
        records[BAD as usize - 1].3,
        value_of(BAD, 200),
        "intact again"
    );
}

#[test]
fn a_flipped_byte_in_an_old_record_does_not_stop_the_broker() {
    const N: u64 = 30;
    // 16 records of 248 bytes to a segment: record 5 is in a closed one.
    let mut broker = Mortard::start(&["--segment-size", "4KiB"]);
    let mut c = broker.client();
    let other = c
        .declare("other", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    drop(c);
    let t = publish_then_kill(&mut broker, N);
    // A start syncs every segment, checkpoints the journal and puts the recovery point
    // in the last segment: the closed ones are durable data now, not a torn tail.
    broker.restart_after_kill9();
    broker.kill9();
    let seg = segment_files(&topic_dir(&broker, t, "bad").join("0")).remove(0);
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[(16 + 4 * 248 + 100) as usize] ^= 0x40; // record 5 of 30
    std::fs::write(&seg, &bytes).unwrap();
    // STORAGE.md: "A flipped byte in the middle of a closed segment is not seen at open;
    // it is reported on read". One damaged record must not take every topic down, nor
    // the records after it.
    broker.restart_after_kill9();
    let mut c = broker.client();
    let r = c
        .publish_value(other, 0, b"fine", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(r.sequence, 1);
    let dup = pub_idem(&mut c, t, 0, 9, N, Some(Durability::Fsynced), b"?").unwrap();
    assert_eq!(
        (dup.sequence, dup.result_flags.bits()),
        (N, 1),
        "record {N} kept"
    );
    assert!(broker.log_text().contains("corrupt record"));
}

#[test]
fn a_lost_or_short_index_is_rebuilt_after_sigkill() {
    const N: u64 = 40;
    for damage in ["remove", "truncate", "garbage"] {
        let mut broker = Mortard::start(&["--segment-size", "4KiB"]);
        let t = publish_then_kill(&mut broker, N);
        let dir = topic_dir(&broker, t, "bad").join("0");
        let segments = segment_files(&dir);
        assert!(segments.len() >= 3, "{segments:?}");
        // Damage the index of a closed segment and of the active one.
        for seg in [&segments[0], segments.last().unwrap()] {
            let idx = seg.with_extension("idx");
            match damage {
                "remove" => std::fs::remove_file(&idx).unwrap(),
                "truncate" => {
                    let len = std::fs::metadata(&idx).unwrap().len();
                    let f = std::fs::OpenOptions::new().write(true).open(&idx).unwrap();
                    f.set_len(len / 2).unwrap();
                }
                _ => {
                    let len = std::fs::metadata(&idx).unwrap().len() as usize;
                    std::fs::write(&idx, vec![0xA5; len]).unwrap();
                }
            }
        }
        broker.restart();
        let mut c = broker.client();
        let dup = pub_idem(&mut c, t, 0, 9, 1, Some(Durability::Fsynced), b"?").unwrap();
        assert_eq!((dup.sequence, dup.result_flags.bits()), (1, 1), "{damage}");
        let r = pub_idem(&mut c, t, 0, 9, N + 1, Some(Durability::Fsynced), b"n").unwrap();
        assert_eq!((r.sequence, r.result_flags.bits()), (N + 1, 0), "{damage}");
        drop(c);
        assert!(broker.terminate().success());
        let records = read_partition(&dir, 4096);
        assert_eq!(records.len() as u64, N + 1, "{damage}");
        for (i, r) in records.iter().take(N as usize).enumerate() {
            assert_eq!(r.3, value_of(i as u64 + 1, 200), "{damage}: record {}", r.0);
        }
    }
}

#[test]
fn a_segment_left_empty_or_torn_by_a_crash_after_a_roll_is_recovered() {
    const N: u64 = 40;
    // (name of the extra segment, its content): the crash came right after a roll, so
    // the next segment exists with no bytes, a torn header, or (a foreign file) a first
    // sequence that does not continue the log.
    let cases: [(u64, &[u8]); 3] = [(N + 1, b""), (N + 1, b"MMQL\0\x01"), (N + 5, b"")];
    for (first, content) in cases {
        let mut broker = Mortard::start(&["--segment-size", "4KiB"]);
        let t = publish_then_kill(&mut broker, N);
        let dir = topic_dir(&broker, t, "bad").join("0");
        let extra = dir.join(format!("{first:020}.log"));
        let mut bytes = content.to_vec();
        if first != N + 1 {
            bytes = b"MMQL\0\x01\0\0".to_vec();
            bytes.extend_from_slice(&first.to_be_bytes());
        }
        std::fs::write(&extra, &bytes).unwrap();
        std::fs::write(extra.with_extension("idx"), []).unwrap();
        broker.restart();
        let mut c = broker.client();
        let r = pub_idem(&mut c, t, 0, 9, N + 1, Some(Durability::Fsynced), b"n").unwrap();
        assert_eq!(
            (r.sequence, r.result_flags.bits()),
            (N + 1, 0),
            "segment {first} {content:?}"
        );
        drop(c);
        assert!(broker.terminate().success());
        let records = read_partition(&dir, 4096);
        let seqs: Vec<u64> = records.iter().map(|r| r.0).collect();
        assert_eq!(
            seqs,
            (1..=N + 1).collect::<Vec<_>>(),
            "segment {first} {content:?}"
        );
    }
}

#[test]
fn storage_full_refuses_pubs_and_keeps_the_connection() {
    let broker = Mortard::start(&["--max-data-size", "256KiB", "--segment-size", "64KiB"]);
    let mut c = broker.client();
    let t = c
        .declare("full", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let value = vec![7u8; 1024];
    let mut accepted = 0u64;
    let refused = loop {
        match c.publish_value(t, 0, &value, Some(Durability::Fsynced)) {
            Ok(r) => {
                accepted += 1;
                assert_eq!(r.sequence, accepted);
                assert!(accepted < 1000, "no STORAGE_FULL after {accepted} KiB");
            }
            Err(e) => break e,
        }
    };
    assert_eq!(refused.code(), Some(ErrorCode::StorageFull), "{refused}");
    // 1072 bytes per record: the cap is reached near 256 KiB of segments, not before.
    assert!(
        (200..=250).contains(&accepted),
        "{accepted} records accepted"
    );
    c.ping().unwrap();
    expect_err(
        c.publish_value(t, 0, &value, Some(Durability::Fsynced)),
        ErrorCode::StorageFull,
    );
    let mut other = broker.client();
    other.ping().unwrap();
    expect_err(
        other.publish_value(t, 0, &value, Some(Durability::Written)),
        ErrorCode::StorageFull,
    );
    // Refused records took no sequence.
    let on_disk: u64 = segment_files(&topic_dir(&broker, t, "full").join("0"))
        .iter()
        .map(|s| std::fs::metadata(s).unwrap().len())
        .sum();
    assert!(on_disk <= 256 * 1024, "{on_disk} bytes on disk");
}

#[test]
fn a_refused_pub_between_good_ones_takes_no_sequence() {
    // Pipelined: errors answered in order among waiting PUBs.
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let t = c.declare("mix", 1, DeclareFlags::empty()).unwrap().topic_id;
    let big_key = [0u8; 300];
    let frames = [
        Pub {
            topic_id: t,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            value: b"1",
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            flags: PubFlags::requesting(Some(Durability::Replicated)),
            value: b"x",
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            key: &big_key,
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            partition: 1,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            flags: PubFlags::requesting(Some(Durability::Written)),
            value: b"2",
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            producer_id: 1,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            ..Pub::default()
        },
        Pub {
            topic_id: t,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            value: b"3",
            ..Pub::default()
        },
    ];
    for f in &frames {
        c.queue(&Frame::Pub(f.clone()));
    }
    c.flush().unwrap();
    let mut got = Vec::new();
    for _ in &frames {
        got.push(match c.recv_reply() {
            Ok(r) => Ok(r.typed::<PubResult>().unwrap().sequence),
            Err(e) => Err(e.code().unwrap()),
        });
    }
    assert_eq!(
        got,
        vec![
            Ok(1),
            Err(ErrorCode::DurabilityUnavailable),
            Err(ErrorCode::KeyTooLarge),
            Err(ErrorCode::UnknownPartition),
            Ok(2),
            Err(ErrorCode::InvalidProducer),
            Ok(3),
        ]
    );
}
