//! The data directory as a whole (issue 12, holes 3 and 4): a missing or unreadable
//! registry never deletes data and `mortarctl check --repair` rebuilds it from the topic
//! directories; `DATA_DIR/lock` keeps a second broker, or a repair, off a live directory.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::mortarctl;
use common::mortard::Mortard;
use mortarmq::wire::{DeclareFlags, Durability};

/// How long a `mortard` that should refuse to start, or a `mortarctl`, may run.
const RUN_TIMEOUT: Duration = Duration::from_secs(20);

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `program` to its end, killing it after RUN_TIMEOUT (a `mortard` that should
/// have refused is then still serving: `None`).
fn run_to_end(cmd: Command) -> Option<Output> {
    mortarctl::run_to_end(cmd, b"", RUN_TIMEOUT).ok()
}

/// Starts `mortard` on `data_dir`, expecting it to refuse: its exit status and stderr.
fn refused_start(data_dir: &Path) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortard"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .arg("--data-dir")
        .arg(data_dir);
    let out = run_to_end(cmd).expect("mortard started and served instead of refusing");
    (out.status.code(), text(&out.stderr))
}

fn mortarctl(args: &[&str]) -> Output {
    let mut cmd = mortarctl::command();
    cmd.args(args);
    run_to_end(cmd).unwrap_or_else(|| panic!("mortarctl {args:?} did not finish"))
}

/// Every file under `dir` with its contents, but the lock (which records the pid of
/// whoever took it last): what a refused start must leave alone.
fn tree(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path != dir.join("lock") {
                out.insert(path.clone(), std::fs::read(&path).unwrap());
            }
        }
    }
    out
}

fn topic_dir(data: &Path, topic_id: u16, name: &str) -> PathBuf {
    data.join("topics").join(format!(
        "{topic_id}-{:08x}",
        crc32fast::hash(name.as_bytes())
    ))
}

/// A stopped broker with `orders` (id 1, 2 partitions, 3 FSYNCED records in
/// partition 0) and `logs` (id 3, 1 partition, 1 record).
fn stopped_broker_with_two_topics() -> Mortard {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let orders = c.declare("orders", 2, DeclareFlags::empty()).unwrap();
    let logs = c.declare("logs", 1, DeclareFlags::empty()).unwrap();
    assert_eq!((orders.topic_id, logs.topic_id), (1, 3));
    for v in [&b"a"[..], b"b", b"c"] {
        c.publish_value(1, 0, v, Some(Durability::Fsynced)).unwrap();
    }
    c.publish_value(3, 0, b"l", Some(Durability::Fsynced))
        .unwrap();
    drop(c);
    assert!(broker.terminate().success());
    broker
}

/// After a restart, `name` is id `topic_id` with `partitions`, and its partition 0 goes on
/// at `next_sequence`: its log was kept.
fn assert_serves(broker: &Mortard, name: &str, topic_id: u16, partitions: u16, next: u64) {
    let mut c = broker.client();
    let found = c.declare(name, 0, DeclareFlags::PASSIVE).unwrap();
    assert_eq!(
        (found.topic_id, found.partition_count),
        (topic_id, partitions),
        "{name}"
    );
    let r = c
        .publish_value(topic_id, 0, b"after", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(r.sequence, next, "{name} partition 0 kept its records");
}

#[test]
fn a_missing_registry_refuses_the_start_and_check_repair_rebuilds_it() {
    let mut broker = stopped_broker_with_two_topics();
    let data = broker.data_dir();
    let data_arg = data.to_str().unwrap();
    std::fs::remove_file(data.join("registry")).unwrap();
    let before = tree(&data);

    let (status, err) = refused_start(&data);
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("registry"), "{err}");
    assert!(
        err.contains(&format!("mortarctl check --repair {data_arg}")),
        "{err}"
    );
    assert_eq!(
        tree(&data),
        before,
        "a refused start changes nothing: no topic directory deleted, epoch not bumped"
    );

    // Without --repair the rebuild is shown, not done.
    let shown = mortarctl(&["check", data_arg]);
    assert_eq!(shown.status.code(), Some(1));
    let out = text(&shown.stdout);
    assert!(out.contains("is missing"), "{out}");
    assert!(
        out.contains("would register 'orders' (ids 1 and 2, 2 partitions)"),
        "{out}"
    );
    assert_eq!(tree(&data), before);

    let repaired = mortarctl(&["check", "--repair", data_arg]);
    let out = text(&repaired.stdout);
    assert_eq!(
        repaired.status.code(),
        Some(0),
        "{out}{}",
        text(&repaired.stderr)
    );
    assert!(
        out.contains("registered 'orders' (ids 1 and 2, 2 partitions)"),
        "{out}"
    );
    assert!(
        out.contains("registered 'logs' (ids 3 and 4, 1 partitions)"),
        "{out}"
    );
    assert!(!out.contains("placeholder"), "{out}");

    broker.restart();
    assert_serves(&broker, "orders", 1, 2, 4);
    assert_serves(&broker, "logs", 3, 1, 2);
    // The rebuilt registry remembers the pairs used: the next topic takes pair 2.
    let next = broker
        .client()
        .declare("new", 1, DeclareFlags::empty())
        .unwrap();
    assert_eq!(next.topic_id, 5);
}

#[test]
fn an_unreadable_registry_refuses_the_start_and_the_repair_keeps_a_copy() {
    let mut broker = stopped_broker_with_two_topics();
    let data = broker.data_dir();
    let registry = data.join("registry");
    let mut bytes = std::fs::read(&registry).unwrap();
    bytes[3] ^= 0x20;
    std::fs::write(&registry, &bytes).unwrap();
    let before = tree(&data);

    let (status, err) = refused_start(&data);
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains("is unreadable"), "{err}");
    assert!(err.contains("mortarctl check --repair"), "{err}");
    assert_eq!(tree(&data), before);

    let repaired = mortarctl(&["check", data.to_str().unwrap(), "--repair"]);
    assert_eq!(
        repaired.status.code(),
        Some(0),
        "{}",
        text(&repaired.stderr)
    );
    assert_eq!(
        std::fs::read(data.join("registry.damaged")).unwrap(),
        bytes,
        "the damaged registry is kept for inspection"
    );
    broker.restart();
    assert_serves(&broker, "orders", 1, 2, 4);
}

#[test]
fn topic_directories_without_topic_files_get_them_at_start_or_placeholder_names() {
    let mut broker = stopped_broker_with_two_topics();
    let data = broker.data_dir();
    let files = [
        topic_dir(&data, 1, "orders").join("topic"),
        topic_dir(&data, 2, "orders.dlq").join("topic"),
    ];
    for f in &files {
        assert!(f.is_file(), "created with the topic: {}", f.display());
    }
    // Directories written before topic files existed: start-up writes them.
    for f in &files {
        std::fs::remove_file(f).unwrap();
    }
    broker.restart();
    assert!(files.iter().all(|f| f.is_file()), "rewritten at start");
    assert!(broker.terminate().success());

    // With neither the registry nor the topic files, only a placeholder name is left.
    std::fs::remove_file(data.join("registry")).unwrap();
    for f in &files {
        std::fs::remove_file(f).unwrap();
    }
    let repaired = mortarctl(&["check", data.to_str().unwrap(), "--repair"]);
    let out = text(&repaired.stdout);
    assert_eq!(repaired.status.code(), Some(0), "{out}");
    assert!(
        out.contains(
            "registered 'recovered-1' (ids 1 and 2, 2 partitions) under a placeholder name"
        ),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "{} has no topic file",
            topic_dir(&data, 1, "orders").display()
        )),
        "{out}"
    );
    assert!(
        out.contains("registered 'logs' (ids 3 and 4, 1 partitions)\n"),
        "{out}"
    );
    assert!(
        topic_dir(&data, 1, "recovered-1").join("topic").is_file(),
        "renamed to match its new name, with a topic file"
    );
    broker.restart();
    assert_serves(&broker, "recovered-1", 1, 2, 4);
    assert_serves(&broker, "logs", 3, 1, 2);
}

#[test]
fn a_brand_new_data_directory_starts_and_gets_an_empty_registry() {
    let mut broker = Mortard::start(&[]);
    // Written at the first start, so that a crash during the first DECLARE leaves a
    // registry beside the new directory instead of none at all.
    assert!(broker.data_dir().join("registry").is_file());
    assert!(broker.terminate().success());
    broker.restart();
    broker.client().ping().unwrap();
}

#[test]
fn a_live_data_directory_is_locked_against_a_second_broker_and_a_repair() {
    let mut broker = Mortard::start(&[]);
    broker
        .client()
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap();
    let data = broker.data_dir();
    let data_arg = data.to_str().unwrap();
    let holder = format!("locked by pid {}", broker.pid());
    let epoch = std::fs::read(data.join("epoch")).unwrap();

    let (status, err) = refused_start(&data);
    assert_eq!(status, Some(1), "{err}");
    assert!(err.contains(&holder), "{err}");
    assert_eq!(
        std::fs::read(data.join("epoch")).unwrap(),
        epoch,
        "a refused start takes no leader epoch"
    );
    broker.client().ping().unwrap();

    let repair = mortarctl(&["check", data_arg, "--repair"]);
    assert_eq!(repair.status.code(), Some(1));
    let err = text(&repair.stderr);
    assert!(err.contains(&holder), "{err}");

    // A plain check only reads: it goes on, with a warning.
    let check = mortarctl(&["check", data_arg]);
    let err = text(&check.stderr);
    assert_eq!(check.status.code(), Some(0), "{err}");
    assert!(err.contains("warning") && err.contains(&holder), "{err}");

    // The lock dies with its holder, however it dies.
    broker.restart_after_kill9();
    let lock = std::fs::read_to_string(data.join("lock")).unwrap();
    assert_eq!(lock.trim(), broker.pid().to_string());
    broker.client().ping().unwrap();
}

/// A single node's data directory started with `--peers` is refused (exit 1) before the
/// lock is taken: no epoch taken, nothing written; and a cluster node's directory
/// started without `--peers` is refused too (their journals differ in format).
#[test]
fn a_data_directory_of_the_other_kind_is_refused_and_left_alone() {
    let mut broker = Mortard::start(&[]);
    broker
        .client()
        .declare("orders", 1, DeclareFlags::empty())
        .unwrap();
    assert!(broker.terminate().success());
    let data = broker.data_dir();
    let before = tree(&data);
    let lock = std::fs::read(data.join("lock")).unwrap();
    assert!(before.contains_key(&data.join("epoch")), "{before:?}");

    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortard"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .args(["--node-id", "2", "--peers"])
        .arg("1=127.0.0.1:1,2=127.0.0.1:2,3=127.0.0.1:3")
        .arg("--data-dir")
        .arg(&data);
    let out = run_to_end(cmd).expect("mortard served with --peers instead of refusing");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is a single node's data directory"), "{err}");
    assert_eq!(tree(&data), before, "no epoch taken, nothing written");
    assert_eq!(
        std::fs::read(data.join("lock")).unwrap(),
        lock,
        "lock untouched"
    );

    // A cluster node's directory (it has raft-state) is refused without --peers.
    let clustered = data.with_file_name("clustered");
    std::fs::create_dir_all(&clustered).unwrap();
    std::fs::write(clustered.join("raft-state"), [0u8; 24]).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mortard"));
    cmd.args(["--listen", "127.0.0.1:0", "--admin-listen", "off"])
        .arg("--data-dir")
        .arg(&clustered);
    let out = run_to_end(cmd).expect("refused");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("is a cluster node's data directory"), "{err}");
    assert_eq!(
        std::fs::read_dir(&clustered).unwrap().count(),
        1,
        "nothing made"
    );

    // The same directory still serves as a single node.
    broker.restart();
    broker.client().ping().unwrap();
}
