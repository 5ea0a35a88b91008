//! `mortarctl check` (issue 17, finding 2 and 8) run as a process on a stopped broker's
//! data: it plans exactly what start-up recovery does, changes nothing without
//! `--repair`, backs up every file it changes, and names partitions by topic.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::consume::consume_all;
use common::mortard::Mortard;
use mortarmq::wire::{DeclareFlags, Durability};

const RECORDS: u64 = 5;

fn value(i: u64) -> Vec<u8> {
    format!("record-{i}-").repeat(4).into_bytes()
}

fn check(args: &[&str]) -> Output {
    // check reads files and exits; it has no network to wait on.
    Command::new(env!("CARGO_BIN_EXE_mortarctl"))
        .arg("check")
        .args(args)
        .output()
        .expect("run mortarctl")
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every file under `dir` with the CRC of its bytes, but the lock (a repair takes it,
/// which writes its pid).
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, u32> {
    let mut files = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != "lock") {
                files.insert(p.clone(), crc32fast::hash(&std::fs::read(&p).unwrap()));
            }
        }
    }
    files
}

/// A broker with `RECORDS` fsynced records in topic `name`, stopped; and the segment.
fn setup(name: &str) -> (Mortard, u16, PathBuf) {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let topic = c.declare(name, 1, DeclareFlags::empty()).unwrap().topic_id;
    for i in 1..=RECORDS {
        c.publish_value(topic, 0, &value(i), Some(Durability::Fsynced))
            .unwrap();
    }
    drop(c);
    broker.terminate();
    let segment = broker
        .data_dir()
        .join("topics")
        .join(format!("{topic}-{:08x}", crc32fast::hash(name.as_bytes())))
        .join("0")
        .join("00000000000000000001.log");
    (broker, topic, segment)
}

#[test]
fn a_flipped_byte_in_record_1_is_kept_as_recovery_keeps_it_and_nothing_changes() {
    let (mut broker, topic, segment) = setup("flip");
    let mut bytes = std::fs::read(&segment).unwrap();
    // Inside record 1's value: 16 header bytes, then the record.
    bytes[16 + 40] ^= 0x5A;
    std::fs::write(&segment, &bytes).unwrap();
    let data = broker.data_dir();
    let before = snapshot(&data);

    let dry = check(&[data.to_str().unwrap()]);
    assert_eq!(dry.status.code(), Some(1), "{}", out(&dry));
    let text = out(&dry);
    assert!(
        text.contains("would keep damaged record at seq 1"),
        "{text}"
    );
    assert!(text.contains("topic flip partition 0 (dir "), "{text}");
    assert!(!text.contains("truncate"), "nothing to cut: {text}");
    assert_eq!(snapshot(&data), before, "a dry run changes no byte");

    let repair = check(&[data.to_str().unwrap(), "--repair"]);
    assert_eq!(repair.status.code(), Some(0), "{}", out(&repair));
    let text = out(&repair);
    assert!(text.contains("kept damaged record at seq 1"), "{text}");
    assert!(!text.contains("truncated"), "{text}");
    // Recovery changes nothing here, so neither does the repair, and it backs up nothing.
    assert_eq!(snapshot(&data), before, "records 2-5 kept byte for byte");

    broker.restart();
    let got = consume_all(&mut broker.client(), topic);
    let want: Vec<(u64, Vec<u8>)> = (2..=RECORDS).map(|i| (i, value(i))).collect();
    assert_eq!(got, want, "records 2-5 served, record 1 skipped");
    assert_eq!(broker.corrupt_records(), 1, "record 1 reported corrupt");
}

/// Tears the tail past the recovery point with `tear`, then checks and repairs it.
/// `tear` returns the length the segment must be cut to and the records left.
fn torn_tail_is_planned_backed_up_and_truncated(name: &str, tear: fn(&mut Vec<u8>) -> (u64, u64)) {
    let (mut broker, topic, segment) = setup(name);
    let mut bytes = std::fs::read(&segment).unwrap();
    let (whole, kept) = tear(&mut bytes);
    std::fs::write(&segment, &bytes).unwrap();
    let lost = bytes.len() as u64 - whole;
    let data = broker.data_dir();
    let before = snapshot(&data);

    let dry = check(&[data.to_str().unwrap()]);
    assert_eq!(dry.status.code(), Some(1), "{}", out(&dry));
    let text = out(&dry);
    let would = format!("topic {name} partition 0 (dir ");
    assert!(text.contains(&would), "{text}");
    assert!(
        text.contains(&format!(
            "would truncate {lost} bytes of {}",
            segment.display()
        )),
        "{text}"
    );
    assert_eq!(snapshot(&data), before, "a dry run changes no byte");

    let repair = check(&[data.to_str().unwrap(), "--repair"]);
    assert_eq!(repair.status.code(), Some(0), "{}", out(&repair));
    let text = out(&repair);
    assert!(text.contains(&format!("truncated {lost} bytes")), "{text}");
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), whole);
    let backup_root = std::fs::read_dir(&data)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("check-backup-")
        })
        .expect("a backup directory");
    let backup = backup_root.join(segment.strip_prefix(&data).unwrap());
    assert!(
        text.contains(&format!("backed up {}", segment.display())),
        "{text}"
    );
    assert_eq!(
        std::fs::read(&backup).unwrap(),
        bytes,
        "the backup is the original"
    );

    let again = check(&[data.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(0), "{}", out(&again));
    broker.restart();
    let got = consume_all(&mut broker.client(), topic);
    let want: Vec<(u64, Vec<u8>)> = (1..=kept).map(|i| (i, value(i))).collect();
    assert_eq!(got, want);
}

#[test]
fn garbage_after_the_last_record_is_reported_then_truncated_with_a_backup() {
    torn_tail_is_planned_backed_up_and_truncated("garbage", |bytes| {
        let whole = bytes.len() as u64;
        bytes.extend_from_slice(b"garbagegarbage");
        (whole, RECORDS)
    });
}

#[test]
fn a_last_record_cut_in_half_is_reported_then_truncated_with_a_backup() {
    torn_tail_is_planned_backed_up_and_truncated("halved", |bytes| {
        // Each record is the same size: the last one starts one record before the end.
        let record = (bytes.len() - 16) / RECORDS as usize;
        let start = bytes.len() - record;
        bytes.truncate(start + record / 2);
        (start as u64, RECORDS - 1)
    });
}
