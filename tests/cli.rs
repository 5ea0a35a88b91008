//! The operator surface (issue 6): `mortarctl` run as a process against a real broker,
//! its exit codes, and the man pages against what the binaries print.

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::mortarctl;
use common::mortard::Mortard;
use common::wait;
use mortarmq::wire::errors::{After, Retry};
use mortarmq::wire::{DeclareFlags, Durability, ErrorCode, Op};

/// Longest a single `mortarctl` run may take before the test fails.
const RUN_TIMEOUT: Duration = Duration::from_secs(30);

const SUBCOMMANDS: &[&[&str]] = &[
    &["stats"],
    &["cluster", "status"],
    &["cluster", "id"],
    &["topics", "list"],
    &["topics", "create"],
    &["topics", "delete"],
    &["groups", "list"],
    &["groups", "describe"],
    &["pub"],
    &["sub"],
    &["check"],
    &["ping"],
    &["peek"],
    &["tail"],
    &["dlq", "list"],
    &["dlq", "replay"],
];

fn man_page(name: &str) -> String {
    let path = format!("{}/man/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Runs `mortarctl` with `args` and `stdin`, killing it after RUN_TIMEOUT.
fn run(args: &[&str], stdin: &str) -> Output {
    run_env(args, stdin, &[])
}

/// `run` with these environment variables set (and no other MORTAR_ ones).
fn run_env(args: &[&str], stdin: &str, env: &[(&str, &str)]) -> Output {
    let mut cmd = mortarctl::command();
    cmd.envs(env.iter().copied()).args(args);
    mortarctl::run_to_end(cmd, stdin.as_bytes(), RUN_TIMEOUT)
        .unwrap_or_else(|out| panic!("mortarctl {args:?} did not finish: {}", text(&out.stderr)))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `mortarctl --broker B --admin A args…`.
fn ctl(broker: &Mortard, args: &[&str], stdin: &str) -> Output {
    let addr = broker.addr.to_string();
    let admin = broker.admin.expect("admin listener").to_string();
    let mut all = vec!["--broker", addr.as_str(), "--admin", admin.as_str()];
    all.extend_from_slice(args);
    run(&all, stdin)
}

/// Runs and expects exit 0; returns stdout.
fn ok(broker: &Mortard, args: &[&str], stdin: &str) -> String {
    let out = ctl(broker, args, stdin);
    assert_eq!(
        out.status.code(),
        Some(0),
        "mortarctl {args:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

#[test]
fn every_subcommand_against_a_real_broker() {
    let broker = Mortard::start(&[]);

    let pong = ok(&broker, &["ping"], "");
    assert!(pong.starts_with("pong from "), "{pong}");

    let created = ok(
        &broker,
        &["topics", "create", "orders", "--partitions", "1"],
        "",
    );
    assert!(created.contains("created topic orders"), "{created}");
    let again = ok(
        &broker,
        &["topics", "create", "orders", "--partitions", "1"],
        "",
    );
    assert!(again.contains("already exists"), "{again}");
    let list = ok(&broker, &["topics", "list"], "");
    let header = list.lines().next().unwrap();
    assert!(
        header.starts_with("TOPIC") && header.contains("PARTITIONS"),
        "{list}"
    );
    let row = list
        .lines()
        .find(|l| l.starts_with("orders "))
        .expect("orders row");
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        [
            "orders",
            "1",
            "1",
            "0",
            row.split_whitespace().nth(4).unwrap(),
            "1",
            "source"
        ]
    );
    assert!(list.lines().any(|l| l.starts_with("orders.dlq ")), "{list}");

    // A broker error: the registry name and the advice, exit 1.
    let conflict = ctl(
        &broker,
        &["topics", "create", "orders", "--partitions", "3"],
        "",
    );
    assert_eq!(conflict.status.code(), Some(1));
    let err = text(&conflict.stderr);
    assert!(err.contains("TOPIC_CONFIG_CONFLICT"), "{err}");
    assert!(
        err.contains("\nhint: the topic exists with another partition count"),
        "{err}"
    );
    let unknown = ctl(&broker, &["pub", "nope", "--value", "x"], "");
    assert_eq!(unknown.status.code(), Some(1));
    assert!(text(&unknown.stderr).contains("UNKNOWN_TOPIC"));

    let published = ok(&broker, &["pub", "orders"], "first\nsecond\nthird\n");
    assert_eq!(published.trim(), "published 3 records to orders");
    let got = ok(
        &broker,
        &["sub", "orders", "--group", "billing", "--count", "3"],
        "",
    );
    assert_eq!(got, "first\nsecond\nthird\n");
    let one = ok(
        &broker,
        &[
            "pub",
            "orders",
            "--value",
            "fourth",
            "--durability",
            "fsync",
        ],
        "",
    );
    assert!(one.contains("sequence 4 (fsynced)"), "{one}");
    let meta = ok(
        &broker,
        &[
            "sub", "orders", "--group", "billing", "--count", "1", "--meta",
        ],
        "",
    );
    assert_eq!(meta, "0\t4\t1\t\tfourth\n");

    let stats = ok(&broker, &["stats", "--json"], "");
    let stats: serde_json::Value = serde_json::from_str(&stats).expect("stats --json is JSON");
    assert_eq!(stats["topics"][0]["name"], "orders");
    assert_eq!(stats["topics"][0]["partitions"][0]["last_sequence"], 4);
    let table = ok(&broker, &["stats"], "");
    assert!(table.contains("\n  records appended   4\n"), "{table}");
    let topics: serde_json::Value =
        serde_json::from_str(&ok(&broker, &["topics", "list", "--json"], "")).unwrap();
    assert_eq!(topics.as_array().unwrap().len(), 2);

    let groups = ok(&broker, &["groups", "list"], "");
    let row = groups
        .lines()
        .find(|l| l.starts_with("billing "))
        .expect("billing row");
    // GROUP TOPIC MEMBERS PARTITIONS LAG OUTSTANDING: the member left, nothing is behind.
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["billing", "orders", "0", "1", "0", "0"]
    );
    let described = ok(&broker, &["groups", "describe", "billing"], "");
    assert!(
        described.contains("group billing  topic orders"),
        "{described}"
    );
    assert!(described.contains("COMMITTED"), "{described}");
    let json = ok(&broker, &["groups", "describe", "billing", "--json"], "");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(json[0]["partitions"][0]["committed"], 4);
    let missing = ctl(&broker, &["groups", "describe", "nobody"], "");
    assert_eq!(missing.status.code(), Some(1));

    let deleted = ok(&broker, &["topics", "delete", "orders", "--if-unused"], "");
    assert!(deleted.contains("deleted topic orders"), "{deleted}");
    assert!(!ok(&broker, &["topics", "list"], "").contains("orders"));
}

#[test]
fn sub_spreads_over_partitions_and_keys_pick_one() {
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "keyed", "--partitions", "4"],
        "",
    );
    let lines: String = (0..200).map(|i| format!("v{i}\n")).collect();
    ok(&broker, &["pub", "keyed", "--key", "user-7"], &lines);
    ok(&broker, &["pub", "keyed", "--partition", "3"], "p3\n");
    let got = ok(
        &broker,
        &["sub", "keyed", "--group", "g", "--count", "201", "--meta"],
        "",
    );
    let parts: BTreeSet<&str> = got
        .lines()
        .filter(|l| l.contains("\tuser-7\t"))
        .map(|l| l.split('\t').next().unwrap())
        .collect();
    assert_eq!(parts.len(), 1, "one key, one partition: {parts:?}");
    assert!(got
        .lines()
        .any(|l| l.starts_with("3\t") && l.ends_with("\tp3")));
    let values: Vec<&str> = got
        .lines()
        .filter(|l| l.contains("\tuser-7\t"))
        .map(|l| l.rsplit('\t').next().unwrap())
        .collect();
    let want: Vec<String> = (0..200).map(|i| format!("v{i}")).collect();
    assert_eq!(values, want, "one partition keeps publish order");
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        &[][..],
        &["bogus"],
        &["topics"],
        &["topics", "create", "x"],
        &["topics", "create", "x", "--partitions", "many"],
        &["topics", "create"],
        &["pub"],
        &["pub", "t", "--durability", "replicated"],
        &["sub", "t"],
        &["sub", "t", "--group", "g", "--from", "middle"],
        &["ping", "extra"],
        &["stats", "--no-such-flag"],
        &["ping", "--token", "a", "--token-file", "b"],
        // Names the broker would refuse, refused before connecting.
        &["pub", "a b", "--value", "x"],
        &["topics", "create", "a/b", "--partitions", "1"],
        &["topics", "delete", ""],
        &["sub", "t!", "--group", "g"],
        &["sub", "t", "--group", "g h"],
        &["ping", "--timeout", "5"],
        &["ping", "--timeout", "0s"],
        &["stats", "--timeout", "soon"],
        &["stats", "--admin", "https://127.0.0.1:7412"],
        &["stats", "--admin", "http://127.0.0.1:7412/stats"],
        &["stats", "--admin", "127.0.0.1"],
    ] {
        let out = run(args, "");
        assert_eq!(out.status.code(), Some(2), "mortarctl {args:?}");
        assert!(text(&out.stderr).starts_with("mortarctl: "), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}

#[test]
fn connection_errors_exit_1() {
    // Port 1 on loopback: nothing listens there.
    let out = run(&["--broker", "127.0.0.1:1", "ping"], "");
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("\nhint: nothing listens there: is mortard running"),
        "{err}"
    );
    assert!(err.contains("--broker, else MORTAR_BROKER"), "{err}");
    let out = run(&["stats", "--admin", "127.0.0.1:1"], "");
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("--admin, else MORTAR_ADMIN"));
}

#[test]
fn help_on_every_subcommand_exits_0() {
    let top = run(&["--help"], "");
    assert_eq!(top.status.code(), Some(0));
    for words in SUBCOMMANDS {
        assert!(text(&top.stdout).contains(&words.join(" ")), "{words:?}");
        let mut args = words.to_vec();
        args.push("--help");
        let out = run(&args, "");
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        let help = text(&out.stdout);
        assert!(help.starts_with(&format!("Usage: mortarctl {}", words.join(" "))));
    }
}

/// Every `--flag` in `text` (roff `\-` read as `-`).
fn flags_in(text: &str) -> BTreeSet<String> {
    let text = text.replace("\\-", "-");
    let mut flags = BTreeSet::new();
    for (at, _) in text.match_indices("--") {
        let rest = &text[at + 2..];
        let end = rest
            .find(|c: char| !(c.is_ascii_lowercase() || c == '-'))
            .unwrap_or(rest.len());
        if end > 0 {
            flags.insert(format!("--{}", &rest[..end]));
        }
    }
    flags
}

#[test]
fn mortard_help_and_man_page_name_the_same_flags() {
    let out = Command::new(env!("CARGO_BIN_EXE_mortard"))
        .arg("--help")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let mut help = flags_in(&text(&out.stdout));
    // --help and --version are the man page's; the help text names neither.
    help.extend(["--help".to_string(), "--version".to_string()]);
    let man = flags_in(&man_page("mortard.8"));
    let undocumented: Vec<_> = help.difference(&man).collect();
    let unknown: Vec<_> = man.difference(&help).collect();
    assert!(
        undocumented.is_empty(),
        "--help flags missing from mortard.8: {undocumented:?}"
    );
    assert!(
        unknown.is_empty(),
        "mortard.8 flags that --help does not print: {unknown:?}"
    );
}

#[test]
fn mortarctl_man_page_documents_every_subcommand_and_flag() {
    let man = man_page("mortarctl.1");
    let plain = man
        .replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fR", "");
    let documented = flags_in(&man);
    for words in SUBCOMMANDS {
        assert!(
            plain.contains(&format!(".SS {}", words.join(" "))),
            "mortarctl.1 lacks a section for {words:?}"
        );
        let mut args = words.to_vec();
        args.push("--help");
        let help = text(&run(&args, "").stdout);
        for flag in flags_in(&help) {
            assert!(
                documented.contains(&flag),
                "mortarctl.1 lacks {flag} ({words:?})"
            );
        }
    }
    let top = text(&run(&["--help"], "").stdout);
    for flag in flags_in(&top) {
        assert!(documented.contains(&flag), "mortarctl.1 lacks {flag}");
    }
    assert!(man.contains("mortarmq (7)") || man.contains(".BR mortarmq (7)"));
}

/// The cells of the tbl row starting with `hex`: text blocks (`T{`…`T}`) and break
/// points (`\:`) removed.
fn table_row(man: &str, hex: &str) -> Option<Vec<String>> {
    let at = man.find(&format!("\n{hex}\t"))? + 1;
    let rest = &man[at..];
    let end = rest[1..]
        .find("\n0x")
        .map(|e| e + 1)
        .into_iter()
        .chain(rest.find("\n.TE"))
        .min()?;
    let cells = rest[..end]
        .split('\t')
        .map(|c| {
            let c = c.trim();
            let c = c.strip_prefix("T{").unwrap_or(c);
            let c = c.strip_suffix("T}").unwrap_or(c);
            c.trim().replace('\n', " ").replace("\\:", "")
        })
        .collect();
    Some(cells)
}

#[test]
fn protocol_man_page_carries_the_whole_error_registry() {
    let man = man_page("mortarmq.7");
    assert_eq!(ErrorCode::ALL.len(), 51);
    for code in ErrorCode::ALL {
        let hex = format!("0x{:04X}", code.code());
        let cells = table_row(&man, &hex)
            .unwrap_or_else(|| panic!("mortarmq.7 has no table row for {hex}"));
        let after = match code.after() {
            After::Close => "close",
            After::Keep => "keep",
        };
        let retry = match code.retry() {
            Retry::No => "no",
            Retry::Backoff => "backoff",
            Retry::Idempotent => "idempotent",
        };
        let want = [
            hex.as_str(),
            code.name(),
            after,
            code.client_should(),
            retry,
        ];
        assert_eq!(cells, want, "mortarmq.7 row for {hex}");
    }
    // 9 core + 6 extension ops, each with its code.
    for op in Op::ALL {
        let heading = format!(".BR {} \" 0x{:02X}, ", op.name(), op as u8);
        assert!(man.contains(&heading), "mortarmq.7 lacks {heading}");
    }
}

#[test]
fn tokens_from_the_command_line_or_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    let broker = Mortard::start(&["--token-file", tokens.to_str().unwrap()]);
    let refused = ctl(&broker, &["ping"], "");
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("AUTH_FAILED"),
        "{}",
        text(&refused.stderr)
    );
    ok(&broker, &["ping", "--token", "s3cret"], "");
    ok(
        &broker,
        &["ping", "--token-file", tokens.to_str().unwrap()],
        "",
    );
    // The read path needs no token.
    ok(&broker, &["topics", "list"], "");
}

#[test]
fn check_verifies_a_stopped_brokers_data_and_repairs_a_torn_tail() {
    let mut broker = Mortard::start(&["--segment-size", "4KiB"]);
    let mut c = broker.client();
    let topic = c
        .declare("checked", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..40u32 {
        c.publish_value(
            topic,
            0,
            format!("value-{i:03}-").repeat(10).as_bytes(),
            Some(Durability::Fsynced),
        )
        .unwrap();
    }
    drop(c);
    broker.terminate();
    let data = broker.data_dir();
    let data = data.to_str().unwrap();
    let clean = run(&["check", data], "");
    assert_eq!(clean.status.code(), Some(0), "{}", text(&clean.stderr));
    assert!(
        text(&clean.stdout).contains("ok"),
        "{}",
        text(&clean.stdout)
    );

    // Tear the last record of the last segment, as a crash mid-write would.
    let part = broker
        .data_dir()
        .join("topics")
        .join(format!("{topic}-{:08x}", crc32fast::hash(b"checked")))
        .join("0");
    let mut segments: Vec<_> = std::fs::read_dir(&part)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let last = segments.last().unwrap();
    let len = std::fs::metadata(last).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(last)
        .unwrap()
        .set_len(len - 3)
        .unwrap();

    let torn = run(&["check", data], "");
    assert_eq!(torn.status.code(), Some(1), "problems exit 1");
    assert!(!text(&torn.stderr).is_empty(), "each problem is printed");
    let repaired = run(&["check", data, "--repair"], "");
    assert_eq!(
        repaired.status.code(),
        Some(0),
        "{}",
        text(&repaired.stderr)
    );
    assert!(
        text(&repaired.stdout).contains("repaired"),
        "{}",
        text(&repaired.stdout)
    );
    let json = run(&["check", data, "--json"], "");
    assert_eq!(json.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert!(doc
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["problems"].as_array().unwrap().is_empty()));
    let usage = run(&["check"], "");
    assert_eq!(usage.status.code(), Some(2));
}

/// Records stored in `topic` (the sum of its partitions' last sequences), from `/stats`.
fn stored(broker: &Mortard, topic: &str) -> u64 {
    let (_, body) = broker.http("GET", "/stats");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    stats["topics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == topic)
        .flat_map(|t| t["partitions"].as_array().unwrap().clone())
        .map(|p| p["last_sequence"].as_u64().unwrap())
        .sum()
}

#[test]
fn pub_carries_its_records_across_a_broker_restart() {
    // `pub` is an idempotent producer: what was in flight when the broker stopped is
    // resent to the next one, each record stored once.
    let mut broker = Mortard::start_on_fixed_port(&[]);
    ok(
        &broker,
        &["topics", "create", "restarted", "--partitions", "2"],
        "",
    );
    let addr = broker.addr.to_string();
    let mut child = spawn_ctl(&["--broker", &addr, "pub", "restarted", "--key", "k"]);
    let mut input = child.stdin.take().unwrap();
    let lines = |from: u32| -> String { (from..from + 100).map(|i| format!("v{i}\n")).collect() };
    input.write_all(lines(0).as_bytes()).unwrap();
    input.flush().unwrap();
    let deadline = Instant::now() + RUN_TIMEOUT;
    while stored(&broker, "restarted") < 100 {
        assert!(
            Instant::now() < deadline,
            "the first 100 records were not stored"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    broker.restart();
    input.write_all(lines(100).as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "published 200 records to restarted"
    );
    assert_eq!(stored(&broker, "restarted"), 200, "each record once");
    let got = ok(
        &broker,
        &["sub", "restarted", "--group", "g", "--count", "200"],
        "",
    );
    let want: String = (0..200).map(|i| format!("v{i}\n")).collect();
    assert_eq!(got, want, "one key, one partition, in order");
}

#[test]
fn sub_reads_a_dead_letter_twin() {
    // The twin is addressed through its source (a DECLARE of its name is refused).
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "jobs", "--partitions", "1"],
        "",
    );
    ok(
        &broker,
        &["pub", "jobs", "--key", "j1", "--value", "bad"],
        "",
    );
    let mut c = mortarmq::client::Consumer::connect(broker.addr).unwrap();
    c.subscribe("workers", "jobs", mortarmq::client::StartPolicy::Earliest)
        .unwrap();
    let m = c.poll(Some(RUN_TIMEOUT)).unwrap().expect("the record");
    assert!(m.reject());
    c.close().unwrap();
    let dead = ok(
        &broker,
        &[
            "sub", "jobs.dlq", "--group", "ops", "--count", "1", "--meta",
        ],
        "",
    );
    assert_eq!(dead, "0\t1\t1\tj1\tbad\n");
}

#[test]
fn sub_goes_on_after_a_broker_restart() {
    let mut broker = Mortard::start_on_fixed_port(&["--commit-interval", "100ms"]);
    ok(
        &broker,
        &["topics", "create", "steady", "--partitions", "1"],
        "",
    );
    ok(&broker, &["pub", "steady"], "v0\nv1\nv2\nv3\nv4\n");
    let addr = broker.addr.to_string();
    let args = [
        "--broker", &addr, "sub", "steady", "--group", "g", "--count", "10",
    ];
    let mut child = spawn_ctl(&args);
    let lines = lines_of(&mut child);
    let mut got: Vec<String> = (0..5)
        .map(|_| lines.recv_timeout(RUN_TIMEOUT).expect("a line"))
        .collect();
    // Once the five are committed, a SIGTERM keeps them committed.
    wait_until("the five to be committed", || {
        stat(&broker, "/groups/0/partitions/0/committed") == 5
    });
    broker.restart();
    ok(&broker, &["pub", "steady"], "v5\nv6\nv7\nv8\nv9\n");
    got.extend((0..5).map(|_| lines.recv_timeout(RUN_TIMEOUT).expect("a line")));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let want: Vec<String> = (0..10).map(|i| format!("v{i}")).collect();
    assert_eq!(got, want);
}

#[test]
fn environment_gives_addresses_and_token_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    let broker = Mortard::start(&["--token-file", tokens.to_str().unwrap()]);
    let addr = broker.addr.to_string();
    let admin = broker.admin.expect("admin listener").to_string();
    let env = [
        ("MORTAR_BROKER", addr.as_str()),
        ("MORTAR_ADMIN", admin.as_str()),
        ("MORTAR_TOKEN", "s3cret"),
    ];
    let code = |args: &[&str], env: &[(&str, &str)]| run_env(args, "", env).status.code();
    assert_eq!(code(&["ping"], &env), Some(0));
    assert_eq!(
        code(&["topics", "create", "t", "--partitions", "1"], &env),
        Some(0)
    );
    assert_eq!(code(&["topics", "list"], &env), Some(0));
    // Each flag wins over its variable.
    let refused = run_env(&["ping", "--token", "wrong"], "", &env);
    assert_eq!(refused.status.code(), Some(1));
    assert!(text(&refused.stderr).contains("AUTH_FAILED"));
    assert_eq!(code(&["ping", "--broker", "127.0.0.1:1"], &env), Some(1));
    assert_eq!(code(&["stats", "--admin", "127.0.0.1:1"], &env), Some(1));
    // MORTAR_TOKEN_FILE mirrors --token-file; given both variables, mortarctl refuses.
    let file_env = [env[0], ("MORTAR_TOKEN_FILE", tokens.to_str().unwrap())];
    assert_eq!(code(&["ping"], &file_env), Some(0));
    let both = [env[0], env[2], file_env[1]];
    assert_eq!(code(&["ping"], &both), Some(2));
    assert_eq!(code(&["ping", "--token", "s3cret"], &both), Some(0));
}

#[test]
fn a_broker_named_without_its_admin_listener_is_a_usage_error() {
    let broker = Mortard::start(&[]);
    let addr = broker.addr.to_string();
    for (args, env) in [
        (&["--broker", addr.as_str(), "stats"][..], &[][..]),
        (&["groups", "list"], &[("MORTAR_BROKER", addr.as_str())][..]),
    ] {
        let out = run_env(args, "", env);
        assert_eq!(out.status.code(), Some(2), "{args:?} {env:?}");
        let err = text(&out.stderr);
        assert!(err.contains("needs --admin or MORTAR_ADMIN"), "{err}");
    }
    // Write commands need no admin address.
    let out = run_env(&["--broker", addr.as_str(), "ping"], "", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn admin_address_may_be_an_http_url() {
    let broker = Mortard::start(&[]);
    let admin = broker.admin.expect("admin listener");
    for given in [
        admin.to_string(),
        format!("http://{admin}"),
        format!("http://{admin}/"),
    ] {
        let out = run(&["stats", "--admin", &given, "--json"], "");
        assert_eq!(out.status.code(), Some(0), "{given}: {}", text(&out.stderr));
        let env = [("MORTAR_ADMIN", given.as_str())];
        assert_eq!(
            run_env(&["topics", "list"], "", &env).status.code(),
            Some(0)
        );
    }
    for given in [format!("https://{admin}"), format!("http://{admin}/stats")] {
        let out = run(&["stats", "--admin", &given], "");
        assert_eq!(out.status.code(), Some(2), "{given}");
        assert!(text(&out.stderr).contains(&given), "{}", text(&out.stderr));
    }
}

/// A peer that accepts and never answers: every command gives up after `--timeout`,
/// naming it. Without a timeout each of these hung for as long as the peer stayed.
#[test]
fn every_command_gives_up_after_its_timeout() {
    // The kernel completes connections into the backlog, so nobody needs to accept.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent = silent.local_addr().unwrap().to_string();
    let broker = Mortard::start(&[]);
    // The mistake from issue 17: the admin port given as the broker's.
    let admin = broker.admin.expect("admin listener").to_string();
    let limit = Duration::from_secs(8);
    for (args, peer) in [
        (&["ping"][..], &silent),
        (&["ping"], &admin),
        (&["topics", "create", "t", "--partitions", "1"], &silent),
        (&["topics", "delete", "t"], &admin),
        (&["pub", "t", "--value", "v"], &silent),
        (&["sub", "t", "--group", "g"], &admin),
        (&["stats"], &silent),
        (&["groups", "list"], &silent),
    ] {
        let flag = if args[0] == "stats" || args[0] == "groups" {
            "--admin"
        } else {
            "--broker"
        };
        let mut all = vec![flag, peer.as_str(), "--timeout", "1s"];
        all.extend_from_slice(args);
        let started = Instant::now();
        let out = run(&all, "");
        let took = started.elapsed();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {err}");
        assert!(took < limit, "{all:?} took {took:?}");
        assert!(err.contains("timeout"), "{all:?}: {err}");
    }
}

/// `sub --count N` takes N records and no more: what it leaves is delivered later as a
/// first attempt, not handed back as a redelivery. Each run leaves the most records
/// waiting in its partitions (3 partitions, 40 records), so an over-wide window shows.
#[test]
fn sub_count_takes_no_more_than_count() {
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "few", "--partitions", "3"],
        "",
    );
    let lines: String = (0..40).map(|i| format!("r{i}\n")).collect();
    ok(&broker, &["pub", "few"], &lines);
    let mut seen = BTreeSet::new();
    for count in ["1", "5", "14", "20"] {
        let args = ["sub", "few", "--group", "g", "--count", count, "--meta"];
        let got = ok(&broker, &args, "");
        assert_eq!(got.lines().count().to_string(), count, "{got}");
        for line in got.lines() {
            let cells: Vec<&str> = line.split('\t').collect();
            assert_eq!(cells[2], "1", "a redelivery after --count {count}: {line}");
            assert!(seen.insert(cells[4].to_string()), "twice: {line}");
        }
    }
    assert_eq!(seen.len(), 40);
}

/// Records arriving while a bounded `sub` runs: after taking one of its 3, it must ask
/// for no more than the 2 it still wants, although 5 are waiting by then.
#[test]
fn sub_count_narrows_its_window_as_it_goes() {
    let broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "trickle", "--partitions", "1"],
        "",
    );
    let addr = broker.addr.to_string();
    let args = [
        "--broker", &addr, "sub", "trickle", "--group", "g", "--count", "3",
    ];
    let mut child = spawn_ctl(&args);
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    ok(&broker, &["pub", "trickle", "--value", "first"], "");
    let mut line = String::new();
    use std::io::BufRead;
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "first\n");
    ok(&broker, &["pub", "trickle"], "a\nb\nc\nd\ne\n");
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let rest = ok(
        &broker,
        &["sub", "trickle", "--group", "g", "--count", "3", "--meta"],
        "",
    );
    let attempts: Vec<&str> = rest
        .lines()
        .map(|l| l.split('\t').nth(2).unwrap())
        .collect();
    assert_eq!(attempts, ["1", "1", "1"], "{rest}");
}

/// Polls `done` until it holds; fails the test after RUN_TIMEOUT.
fn wait_until(what: &str, ready: impl FnMut() -> bool) {
    wait::wait_until(what, RUN_TIMEOUT, ready);
}

/// A figure of the broker's `/stats`, by JSON pointer (`/connections/accepted`).
fn stat(broker: &Mortard, pointer: &str) -> u64 {
    let (_, body) = broker.http("GET", "/stats");
    let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
    stats.pointer(pointer).and_then(|v| v.as_u64()).unwrap()
}

/// The value of one `/metrics` sample, named with its labels as the text shows it.
fn metric(broker: &Mortard, sample: &str) -> u64 {
    let (_, body) = broker.http("GET", "/metrics");
    let line = body
        .lines()
        .find(|l| l.split_once(' ').is_some_and(|(name, _)| name == sample))
        .unwrap_or_else(|| panic!("no sample {sample} in /metrics"));
    line.rsplit(' ').next().unwrap().parse().unwrap()
}

/// `mortarctl ARGS` left running with its standard streams piped to the test.
fn spawn_ctl(args: &[&str]) -> std::process::Child {
    let mut cmd = mortarctl::command();
    cmd.args(args);
    mortarctl::spawn(cmd)
}

/// The lines a running `mortarctl` prints, as they come (read on a thread of their own).
fn lines_of(child: &mut std::process::Child) -> std::sync::mpsc::Receiver<String> {
    let stdout = child.stdout.take().expect("piped");
    let (tx, lines) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stdout).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    lines
}

/// `tail -f app.log | mortarctl pub logs` with lines `from..to`, a quiet spell that
/// `quiet` ends (it waits for what the broker did meanwhile), then lines `to..2*to`;
/// each record must be stored once, in order. Returns how many connections the
/// broker accepted while `pub` ran.
fn pub_through_a_quiet_spell(broker: &Mortard, pub_flags: &[&str], quiet: impl Fn()) -> u64 {
    ok(
        broker,
        &["topics", "create", "logs", "--partitions", "1"],
        "",
    );
    let addr = broker.addr.to_string();
    let mut args = vec!["--broker", addr.as_str(), "pub", "logs"];
    args.extend_from_slice(pub_flags);
    let accepted = stat(broker, "/connections/accepted");
    let mut child = spawn_ctl(&args);
    let mut input = child.stdin.take().unwrap();
    let lines = |from: u32| -> String { (from..from + 50).map(|i| format!("v{i}\n")).collect() };
    input.write_all(lines(0).as_bytes()).unwrap();
    input.flush().unwrap();
    wait_until("the first 50 records", || stored(broker, "logs") == 50);
    quiet();
    input.write_all(lines(50).as_bytes()).unwrap();
    drop(input);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "published 100 records to logs");
    assert_eq!(stored(broker, "logs"), 100, "each record once");
    let accepted = stat(broker, "/connections/accepted") - accepted;
    let got = ok(
        broker,
        &["sub", "logs", "--group", "g", "--count", "100"],
        "",
    );
    let want: String = (0..100).map(|i| format!("v{i}\n")).collect();
    assert_eq!(got, want);
    accepted
}

/// A quiet spell longer than the broker's `--idle-timeout` (here shorter than `pub`'s
/// keepalive): the broker closes the connection, and `pub` connects again for the next
/// line and resends what it does not know the outcome of. It used to abort.
#[test]
fn pub_reconnects_after_the_broker_closes_its_idle_connection() {
    let broker = Mortard::start(&["--idle-timeout", "1s"]);
    let accepted = pub_through_a_quiet_spell(&broker, &[], || {
        wait_until("the idle connection closed", || {
            stat(&broker, "/connections/closed/idle_timeout") == 1
        })
    });
    assert_eq!(accepted, 2, "one reconnect");
}

/// With `--keepalive` under the broker's `--idle-timeout`, `pub` PINGs through a quiet
/// spell of several idle timeouts, on the connection it started with.
#[test]
fn pub_keeps_its_connection_alive_through_a_quiet_spell() {
    let broker = Mortard::start(&["--idle-timeout", "1s"]);
    let pings = r#"mortar_frames_in_total{op="PING"}"#;
    let accepted = pub_through_a_quiet_spell(&broker, &["--keepalive", "150ms"], || {
        // 15 PINGs 150 ms apart: a spell of at least 2.1 s, two idle timeouts.
        wait_until("15 PINGs", || metric(&broker, pings) >= 15);
        assert_eq!(stat(&broker, "/connections/closed/idle_timeout"), 0);
    });
    assert_eq!(accepted, 1, "no reconnect");
    assert_eq!(stat(&broker, "/connections/closed/idle_timeout"), 0);
}

/// `sub` without `--count` (the broker pushes) rejoins its group across a broker
/// restart on the same address and data, prints what is published after it, and keeps
/// running.
#[test]
fn sub_without_count_rejoins_after_a_broker_restart() {
    let mut broker = Mortard::start_on_fixed_port(&["--commit-interval", "100ms"]);
    ok(
        &broker,
        &["topics", "create", "live", "--partitions", "2"],
        "",
    );
    let addr = broker.addr.to_string();
    let mut child = spawn_ctl(&["--broker", &addr, "sub", "live", "--group", "g"]);
    let lines = lines_of(&mut child);
    let take = |n: usize| -> BTreeSet<String> {
        let got: BTreeSet<String> = (0..n)
            .map(|_| lines.recv_timeout(RUN_TIMEOUT).expect("a line"))
            .collect();
        assert_eq!(got.len(), n, "{got:?}");
        got
    };
    let published = |from: u32| -> String { (from..from + 6).map(|i| format!("v{i}\n")).collect() };
    ok(&broker, &["pub", "live"], &published(0));
    let before = take(6);
    wait_until("6 committed", || {
        let (_, body) = broker.http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        let parts = stats["groups"][0]["partitions"].as_array().cloned();
        parts
            .unwrap_or_default()
            .iter()
            .map(|p| p["committed"].as_u64().unwrap())
            .sum::<u64>()
            == 6
    });
    broker.restart();
    ok(&broker, &["pub", "live", "--key", "k"], &published(6));
    let after = take(6);
    let want = |from: u32| (from..from + 6).map(|i| format!("v{i}")).collect();
    assert_eq!((before, after), (want(0), want(6)));
    assert!(child.try_wait().unwrap().is_none(), "sub exited");
    child.kill().unwrap();
    child.wait().unwrap();
}

/// `sub --reconnect-timeout` bounds the wait for a broker that went away (without it, an
/// unbounded `sub` waits for ever, as the restart test above shows it rejoining).
#[test]
fn sub_gives_up_after_its_reconnect_timeout() {
    let mut broker = Mortard::start(&[]);
    ok(
        &broker,
        &["topics", "create", "gone", "--partitions", "1"],
        "",
    );
    let addr = broker.addr.to_string();
    let args = ["--broker", &addr, "sub", "gone", "--group", "g"];
    let mut child = spawn_ctl(&[&args[..], &["--reconnect-timeout", "1s"]].concat());
    ok(&broker, &["pub", "gone", "--value", "v"], "");
    let mut line = String::new();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::io::BufRead::read_line(&mut stdout, &mut line).unwrap();
    assert_eq!(line, "v\n");
    broker.kill9();
    let mut status = None;
    wait_until("sub to give up", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert_eq!(status.unwrap().code(), Some(1));
}

/// Broker errors name the registry entry and say what to type about it: a command or
/// the flags that give a token, not the registry's advice to protocol clients.
#[test]
fn broker_errors_come_with_a_hint_for_the_operator() {
    let broker = Mortard::start(&[]);
    for args in [
        &["pub", "nope", "--value", "x"][..],
        &["sub", "nope", "--group", "g"],
    ] {
        let out = ctl(&broker, args, "");
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("UNKNOWN_TOPIC (0x0008)"), "{err}");
        assert!(
            err.contains("\nhint: create it: mortarctl topics create nope --partitions N"),
            "{err}"
        );
        assert!(!err.contains("client should"), "{err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "s3cret\n").unwrap();
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "guess\n").unwrap();
    let (tokens, wrong) = (tokens.to_str().unwrap(), wrong.to_str().unwrap());
    let guarded = Mortard::start(&["--token-file", tokens]);
    let addr = guarded.addr.to_string();
    let wrong_file = format!("the token from --token-file {wrong} is not one of the broker's");
    for (args, env, says) in [
        (
            &["ping"][..],
            &[][..],
            "the broker wants a token and none was given",
        ),
        (
            &["ping", "--token", "guess"],
            &[],
            "the token from --token is not one of the broker's",
        ),
        (
            &["ping"],
            &[("MORTAR_TOKEN", "guess")],
            "the token from MORTAR_TOKEN is not one of the broker's",
        ),
        (&["ping", "--token-file", wrong], &[], wrong_file.as_str()),
    ] {
        let mut all = vec!["--broker", addr.as_str()];
        all.extend_from_slice(args);
        let out = run_env(&all, "", env);
        assert_eq!(out.status.code(), Some(1));
        let err = text(&out.stderr);
        assert!(err.contains("AUTH_FAILED (0x0006)"), "{err}");
        assert!(err.contains(&format!("\nhint: {says}")), "{err}");
        for way in ["--token TOKEN", "--token-file PATH", "MORTAR_TOKEN"] {
            assert!(err.contains(way), "{err}");
        }
    }
}

/// The leaves of a JSON document as `/`-separated paths (array elements by index).
fn json_paths(v: &serde_json::Value, at: String, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                json_paths(v, format!("{at}/{k}"), out);
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                json_paths(v, format!("{at}/{i}"), out);
            }
        }
        _ => {
            out.insert(at);
        }
    }
}

/// `stats` groups the figures for a person (human units, fsync percentiles, headroom
/// under `--max-data-size`, groups with their lag); `stats --json` is `/stats` itself.
#[test]
fn stats_shows_sections_in_human_units() {
    let broker = Mortard::start(&["--max-data-size", "64MiB"]);
    ok(&broker, &["topics", "create", "t", "--partitions", "2"], "");
    let lines: String = (0..300).map(|i| format!("line {i}\n")).collect();
    ok(&broker, &["pub", "t", "--durability", "fsync"], &lines);
    ok(&broker, &["sub", "t", "--group", "g", "--count", "100"], "");
    let report = ok(&broker, &["stats"], "");
    let sections: Vec<&str> = report
        .lines()
        .filter(|l| !l.is_empty() && !l.starts_with(' '))
        .collect();
    assert_eq!(
        sections,
        [
            "broker",
            "connections",
            "storage",
            "fsync",
            "publish",
            "delivery",
            "groups"
        ]
    );
    let line = |label: &str| -> String {
        let prefix = format!("  {label}  ");
        let found = report.lines().find(|l| l.starts_with(&prefix));
        let found = found.unwrap_or_else(|| panic!("no {label} line in\n{report}"));
        found[prefix.len()..].trim().to_string()
    };
    let uptime = line("uptime");
    assert!(uptime.ends_with(" ms") || uptime.ends_with('s'), "{uptime}");
    assert!(line("connections").ends_with(" refused since start)"));
    let headroom = line("headroom");
    assert!(
        headroom.contains(" free of --max-data-size 64.0 MiB ("),
        "{headroom}"
    );
    assert!(line("data").contains(" KiB in "), "{report}");
    let latency = line("latency");
    for part in ["p50 <= ", " ms, p99 <= ", " ms, max ", " ms (mean "] {
        assert!(latency.contains(part), "{latency}");
    }
    assert!(line("fsyncs").contains(" 300 records, "), "{report}");
    assert_eq!(line("records appended"), "300");
    let group = line("g");
    let group: Vec<&str> = group.split_whitespace().collect();
    // TOPIC MEMBERS PARTITIONS LAG OUTSTANDING
    assert_eq!(group, ["t", "0", "2", "200", "0"], "{report}");
    let json: serde_json::Value =
        serde_json::from_str(&ok(&broker, &["stats", "--json"], "")).unwrap();
    let (_, body) = broker.http("GET", "/stats");
    let direct: serde_json::Value = serde_json::from_str(&body).unwrap();
    let (mut a, mut b) = (BTreeSet::new(), BTreeSet::new());
    json_paths(&json, String::new(), &mut a);
    json_paths(&direct, String::new(), &mut b);
    assert_eq!(a, b, "stats --json is the /stats document");
    assert_eq!(json["topics"], direct["topics"]);
}
