//! The broker daemon's session rules over real TCP (issue 3): golden transcripts,
//! the CONNECT gate, framing errors, timeouts, pipelining, backpressure, connection
//! limits and signals. Each test starts its own `mortard` on a free port.

mod common;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::golden::{self, Kind, Step};
use common::mortard::Mortard;
use mortarmq::client::{Client, ClientError};
use mortarmq::wire::limits::MAX_FRAME_LEN_BYTES;
use mortarmq::wire::ops::{Frame, Op, Ping};
use mortarmq::wire::{ControlResult, DeclareFlags, Durability, ErrorCode, PubFlags};

/// Reads one whole frame (header + body) from a raw socket.
fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4];
    s.read_exact(&mut buf)?;
    let len = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
    buf.resize(4 + len, 0);
    s.read_exact(&mut buf[4..])?;
    Ok(buf)
}

/// Waits until the peer closes; fails if any byte arrives first or `within` passes.
fn expect_silent_close(s: &mut TcpStream, within: Duration) -> Result<Duration, String> {
    let start = Instant::now();
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    match s.read(&mut b) {
        Ok(0) => Ok(start.elapsed()),
        Ok(n) => Err(format!(
            "{n} bytes arrived before the close: {:02x?}",
            &b[..n]
        )),
        Err(e) if e.kind() == ErrorKind::ConnectionReset => Ok(start.elapsed()),
        Err(e) => Err(format!("no close within {within:?}: {e}")),
    }
}

fn err_fields(frame: &[u8]) -> (u16, u8) {
    assert_eq!(
        frame[4],
        Op::Err as u8,
        "expected ERR, got {:02x?}",
        &frame[..frame.len().min(16)]
    );
    (u16::from_be_bytes([frame[5], frame[6]]), frame[7])
}

fn replay(name: &str, t: &golden::Golden) {
    let flags: Vec<&str> = t.flags.iter().map(String::as_str).collect();
    let broker = Mortard::start(&flags);
    let mut s = broker.raw();
    for step in &t.steps {
        match step {
            Step::Send(file) => s.write_all(&golden::load(file).bytes).unwrap(),
            Step::SendHex(bytes) => s.write_all(bytes).unwrap(),
            Step::Recv(file) => {
                let want = golden::load(file);
                let got =
                    read_frame(&mut s).unwrap_or_else(|e| panic!("{name}: @recv {file}: {e}"));
                if want.bytes[4] == Op::Err as u8 {
                    assert_eq!(
                        err_fields(&got),
                        err_fields(&want.bytes),
                        "{name}: @recv {file}"
                    );
                } else {
                    assert_eq!(got, want.bytes, "{name}: @recv {file}");
                }
            }
            Step::ExpectClose => {
                expect_silent_close(&mut s, Duration::from_secs(5))
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            Step::ExpectNoCloseBefore(d) => {
                s.set_read_timeout(Some(*d)).unwrap();
                let mut b = [0u8; 1];
                match s.read(&mut b) {
                    Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                    other => panic!("{name}: connection not quiet for {d:?}: {other:?}"),
                }
            }
            Step::ExpectCloseWithin(d) => {
                expect_silent_close(&mut s, *d).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

#[test]
fn golden_transcripts_replay_over_tcp() {
    let transcripts: Vec<_> = golden::load_all()
        .into_iter()
        .filter(|(_, g)| g.kind == Kind::Transcript)
        .collect();
    assert!(transcripts.len() >= 9, "transcripts missing");
    for (name, t) in &transcripts {
        replay(name, t);
    }
}

fn connected_raw(broker: &Mortard) -> TcpStream {
    let mut s = broker.raw();
    s.write_all(&golden::load("connect_empty_token").bytes)
        .unwrap();
    assert_eq!(
        read_frame(&mut s).unwrap(),
        golden::load("ok_connect").bytes
    );
    s
}

#[test]
fn connect_checks_version_and_token() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, "s3cret\nother\n").unwrap();
    let broker = Mortard::start(&["--token-file", token_file.to_str().unwrap()]);

    // The golden CONNECT carries the token "s3cret".
    let mut s = broker.raw();
    s.write_all(&golden::load("connect").bytes).unwrap();
    assert_eq!(
        read_frame(&mut s).unwrap(),
        golden::load("ok_connect").bytes
    );

    let mut bad = broker.raw();
    bad.write_all(&golden::load("connect_empty_token").bytes)
        .unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut bad).unwrap()),
        (ErrorCode::AuthFailed.code(), 1)
    );
    expect_silent_close(&mut bad, Duration::from_secs(5)).unwrap();

    let mut old = broker.raw();
    let mut v2 = golden::load("connect").bytes;
    v2[5] = 2; // protocol_version
    old.write_all(&v2).unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut old).unwrap()),
        (ErrorCode::UnsupportedVersion.code(), 1)
    );
    expect_silent_close(&mut old, Duration::from_secs(5)).unwrap();
    assert!(
        !broker.log_text().contains("s3cret"),
        "tokens are never logged"
    );
    // The file was created 0644: readable by others, which the broker warns about.
    assert!(
        broker.log_text().contains("readable by group or others"),
        "no warning"
    );
}

#[test]
fn a_private_token_file_draws_no_warning() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("tokens");
    std::fs::write(&token_file, "s3cret\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let broker = Mortard::start(&["--token-file", token_file.to_str().unwrap()]);
    Client::connect(broker.addr, b"s3cret")
        .unwrap()
        .ping()
        .unwrap();
    assert!(!broker.log_text().contains("readable by group or others"));
}

#[test]
fn framing_errors_follow_the_registry() {
    let broker = Mortard::start(&[]);
    // Illegal ops close; the body is never needed.
    for op in [0x00u8, 0xFF] {
        let mut s = connected_raw(&broker);
        s.write_all(&[0, 0, 0, 1, op]).unwrap();
        assert_eq!(
            err_fields(&read_frame(&mut s).unwrap()),
            (ErrorCode::IllegalOp.code(), op)
        );
        expect_silent_close(&mut s, Duration::from_secs(5)).unwrap();
    }
    // A malformed payload keeps the connection.
    let mut s = connected_raw(&broker);
    s.write_all(&golden::load("declare_short").bytes).unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut s).unwrap()),
        (ErrorCode::MalformedPayload.code(), Op::Declare as u8)
    );
    s.write_all(&golden::load("ping").bytes).unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), golden::load("ok_ping").bytes);
    // A client's ERR is never answered: the next answer is the PING's.
    s.write_all(&golden::load("err_from_client").bytes).unwrap();
    s.write_all(&golden::load("ping").bytes).unwrap();
    assert_eq!(read_frame(&mut s).unwrap(), golden::load("ok_ping").bytes);
    // Server-only MSG and NOTICE from a client close.
    for file in ["msg", "notice_assign"] {
        let mut s = connected_raw(&broker);
        let bytes = golden::load(file).bytes;
        s.write_all(&bytes).unwrap();
        assert_eq!(
            err_fields(&read_frame(&mut s).unwrap()),
            (ErrorCode::UnexpectedOp.code(), bytes[4])
        );
        expect_silent_close(&mut s, Duration::from_secs(5)).unwrap();
    }
}

#[test]
fn oversized_frames_are_refused_before_their_body() {
    let broker = Mortard::start(&[]);
    // Before CONNECT, more than 64 KiB is refused from the header alone.
    let mut s = broker.raw();
    s.write_all(&golden::load("preauth_too_long").bytes)
        .unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut s).unwrap()),
        (ErrorCode::InvalidFrameLength.code(), 0)
    );
    expect_silent_close(&mut s, Duration::from_secs(5)).unwrap();
    // After CONNECT, MAX_FRAME_LEN + 1.
    let mut s = connected_raw(&broker);
    s.write_all(&golden::load("length_max_plus_one").bytes)
        .unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut s).unwrap()),
        (ErrorCode::InvalidFrameLength.code(), 0)
    );
    expect_silent_close(&mut s, Duration::from_secs(5)).unwrap();
    let rss_before = broker.rss_bytes();
    // 200 anonymous peers each announcing 16 MiB: nothing is buffered for them.
    let mut peers = Vec::new();
    for _ in 0..200 {
        let mut s = broker.raw();
        s.write_all(&MAX_FRAME_LEN_BYTES.to_be_bytes()).unwrap();
        s.write_all(&[Op::Pub as u8]).unwrap();
        peers.push(s);
    }
    for s in &mut peers {
        assert_eq!(
            err_fields(&read_frame(s).unwrap()).0,
            ErrorCode::InvalidFrameLength.code()
        );
    }
    let grown = broker.rss_bytes().saturating_sub(rss_before);
    println!("RSS growth after 200 x 16 MiB pre-auth headers: {grown} bytes");
    assert!(grown < 8 * 1024 * 1024, "RSS grew by {grown} bytes");
}

#[test]
fn a_frame_of_exactly_max_frame_len_is_read_whole() {
    let broker = Mortard::start(&[]);
    let mut s = connected_raw(&broker);
    // frame_exactly_max is an OK frame: a valid 16 MiB frame the broker must read
    // entirely, then refuse as UNEXPECTED_OP (a server-only op).
    let bytes = golden::load("frame_exactly_max").bytes;
    assert_eq!(bytes.len(), 4 + MAX_FRAME_LEN_BYTES as usize);
    s.write_all(&bytes).unwrap();
    assert_eq!(
        err_fields(&read_frame(&mut s).unwrap()),
        (ErrorCode::UnexpectedOp.code(), Op::Ok as u8)
    );
}

#[test]
fn idle_and_half_frame_timeouts_close_silently() {
    // Far apart, so a loaded machine cannot blur which timeout closed what.
    let broker = Mortard::start(&["--idle-timeout", "1200ms", "--half-frame-timeout", "200ms"]);
    let mut idle = connected_raw(&broker);
    let took = expect_silent_close(&mut idle, Duration::from_secs(5)).unwrap();
    assert!(took >= Duration::from_millis(1100), "closed after {took:?}");
    // A half frame is closed by the shorter half-frame timeout.
    let mut half = connected_raw(&broker);
    half.write_all(&golden::load("half_frame").bytes).unwrap();
    let took = expect_silent_close(&mut half, Duration::from_secs(5)).unwrap();
    assert!(
        took < Duration::from_millis(900),
        "half-frame close took {took:?}"
    );
    // Traffic keeps a connection alive past the idle timeout.
    let mut busy = connected_raw(&broker);
    for _ in 0..8 {
        std::thread::sleep(Duration::from_millis(250));
        busy.write_all(&golden::load("ping").bytes).unwrap();
        assert_eq!(
            read_frame(&mut busy).unwrap(),
            golden::load("ok_ping").bytes
        );
    }
}

#[test]
fn thousands_of_pipelined_requests_are_answered_in_order() {
    let broker = Mortard::start(&[]);
    let mut c = broker.client();
    let topic = c
        .declare("pipes", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    const N: usize = 5000;
    // Interleave PUBs (which wait for fsync) with PINGs (answered at once): the PINGs'
    // answers must still come after the PUBs before them.
    for i in 0..N {
        if i % 3 == 0 {
            c.queue(&Frame::Ping(Ping {}));
        } else {
            let value = format!("v{i}");
            c.queue(&Frame::Pub(mortarmq::wire::ops::Pub {
                topic_id: topic,
                value: value.as_bytes(),
                flags: PubFlags::requesting(Some(Durability::Fsynced)),
                ..Default::default()
            }));
        }
    }
    // The whole burst is written first (the broker's pending-request backpressure
    // must not deadlock it: the socket buffers and the broker keep draining).
    let reader_stream = c.stream().try_clone().unwrap();
    let writer = {
        let bytes = c.take_queued();
        let mut stream = reader_stream;
        std::thread::spawn(move || stream.write_all(&bytes))
    };
    let mut next_seq = 1;
    for i in 0..N {
        let reply = c.recv_reply().unwrap();
        if i % 3 == 0 {
            assert_eq!(reply.request_op, Op::Ping as u8, "answer {i}");
        } else {
            assert_eq!(reply.request_op, Op::Pub as u8, "answer {i}");
            let r: mortarmq::wire::ops::PubResult = reply.typed().unwrap();
            assert_eq!(r.sequence, next_seq);
            next_seq += 1;
        }
    }
    writer.join().unwrap().unwrap();
}

#[test]
fn a_client_that_never_reads_does_not_stall_others_or_grow_memory() {
    let broker = Mortard::start(&["--max-output-size", "20MiB", "--max-memory", "64MiB"]);
    let mut hog = connected_raw(&broker);
    hog.set_write_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let ping = golden::load("ping").bytes;
    let burst: Vec<u8> = ping
        .iter()
        .copied()
        .cycle()
        .take(ping.len() * 100_000)
        .collect();
    let rss_before = broker.rss_bytes();
    // Write PINGs and never read their answers, until the socket refuses more.
    let mut sent = 0usize;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        match hog.write(&burst) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    // A bystander is served promptly meanwhile.
    let mut other = broker.client();
    let t = Instant::now();
    for _ in 0..100 {
        other.ping().unwrap();
    }
    let per_ping = t.elapsed() / 100;
    let grown = broker.rss_bytes().saturating_sub(rss_before);
    println!("never-reading client sent {sent} bytes; bystander ping {per_ping:?}; RSS grew {grown} bytes");
    assert!(per_ping < Duration::from_millis(50));
    assert!(grown < 32 * 1024 * 1024, "RSS grew by {grown}");
    assert!(sent > 0);
}

#[test]
fn connections_over_the_limit_are_refused() {
    let broker = Mortard::start(&["--max-connections", "3"]);
    let held: Vec<Client> = (0..3).map(|_| broker.client()).collect();
    let mut extra = broker.raw();
    let frame = read_frame(&mut extra).unwrap();
    assert_eq!(err_fields(&frame).0, ErrorCode::ConnectionLimit.code());
    expect_silent_close(&mut extra, Duration::from_secs(5)).unwrap();
    drop(held);
    // Capacity returns when clients leave.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match Client::connect(broker.addr, b"") {
            Ok(mut c) => {
                c.ping().unwrap();
                break;
            }
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no capacity after clients left: {e}"),
        }
    }
}

#[test]
fn sigterm_answers_in_flight_then_shuts_down_cleanly() {
    let mut broker = Mortard::start(&[]);
    let mut c = broker.client();
    let topic = c
        .declare("drain", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    for i in 0..200u32 {
        let v = i.to_be_bytes();
        c.queue(&Frame::Pub(mortarmq::wire::ops::Pub {
            topic_id: topic,
            value: &v,
            flags: PubFlags::requesting(Some(Durability::Fsynced)),
            ..Default::default()
        }));
    }
    c.flush().unwrap();
    // Make sure the broker has read them before it is told to stop.
    let first = c.recv_reply().unwrap();
    assert_eq!(first.request_op, Op::Pub as u8);
    let status = broker.terminate();
    assert!(status.success(), "exit status {status:?}");
    let mut answered = 1;
    loop {
        match c.recv_reply() {
            Ok(r) => {
                assert_eq!(r.request_op, Op::Pub as u8);
                answered += 1;
            }
            Err(ClientError::Broker { code, .. }) => {
                assert_eq!(code, ErrorCode::ShuttingDown.code());
                break;
            }
            Err(e) => panic!("after {answered} answers: {e}"),
        }
    }
    assert_eq!(
        answered, 200,
        "every PUB read before the signal is answered"
    );
    broker.restart();
    let mut c = broker.client();
    let r = c
        .publish_value(topic, 0, b"after", Some(Durability::Fsynced))
        .unwrap();
    assert_eq!(r.sequence, 201, "all 200 acknowledged records survived");
    assert_eq!(r.leader_epoch, 2);
}

#[test]
fn bad_flag_values_exit_with_status_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mortard"))
        .args(["--idle-timeout", "10x"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.contains("--idle-timeout"));
    let help = std::process::Command::new(env!("CARGO_BIN_EXE_mortard"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(String::from_utf8_lossy(&help.stdout).contains("--half-frame-timeout"));
}

#[test]
fn pub_over_the_memory_budget_gets_memory_limit() {
    let broker = Mortard::start(&["--max-memory", "17MiB", "--max-output-size", "17MiB"]);
    let mut c = broker.client();
    let topic = c.declare("mem", 1, DeclareFlags::empty()).unwrap().topic_id;
    // Two peers each send most of a 10 MiB PUB and stop: their buffers hold ~20 MiB.
    let mut holders = Vec::new();
    for _ in 0..2 {
        let mut s = connected_raw(&broker);
        let value = vec![7u8; 10 * 1024 * 1024];
        let mut frame = Vec::new();
        Frame::Pub(mortarmq::wire::ops::Pub {
            topic_id: topic,
            value: &value,
            ..Default::default()
        })
        .encode(&mut frame);
        s.write_all(&frame[..frame.len() - 1]).unwrap();
        holders.push(s);
    }
    // The budget counts bytes that arrived (not what a header announces): wait until the
    // broker has read them.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, body) = broker.http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        let buffered = stats["connections"]["buffered_bytes"].as_u64().unwrap();
        if buffered > 17 * 1024 * 1024 {
            break;
        }
        assert!(Instant::now() < deadline, "buffers hold {buffered} bytes");
        std::thread::sleep(Duration::from_millis(20));
    }
    let err = c
        .publish_value(topic, 0, b"x", Some(Durability::Fsynced))
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::MemoryLimit));
    c.ping().unwrap();
    // Once the holders go, the budget frees up.
    drop(holders);
    let deadline = Instant::now() + Duration::from_secs(5);
    while c
        .publish_value(topic, 0, b"x", Some(Durability::Fsynced))
        .is_err()
    {
        assert!(Instant::now() < deadline, "budget never freed");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_reader_whose_output_passes_the_hard_cap_is_closed_and_counted() {
    let broker = Mortard::start(&["--max-output-size", "17MiB", "--max-memory", "64MiB"]);
    let mut producer = broker.client();
    let topic = producer
        .declare("big", 1, DeclareFlags::empty())
        .unwrap()
        .topic_id;
    let value = vec![1u8; 1024 * 1024];
    for _ in 0..24 {
        producer
            .publish_value(topic, 0, &value, Some(Durability::Written))
            .unwrap();
    }
    // A connection with two subscriptions, each granted 16 MiB of credit, that never
    // reads its socket: each window alone fits the cap, both together do not. (A PULL
    // answer is cut to what the output can still take, so it never passes the cap.)
    let mut hog = broker.client();
    for group in [&b"hog-a"[..], b"hog-b"] {
        hog.request(&Frame::Sub(mortarmq::wire::ops::Sub {
            group,
            topic_id: topic,
            partition: 0xFFFF,
            credit_bytes: 16 * 1024 * 1024,
            ..Default::default()
        }))
        .unwrap();
    }
    // Accept both ASSIGNs so MSGs flow, and read nothing more.
    for _ in 0..2 {
        let mortarmq::client::Push::Notice(notice) = hog.next_push().unwrap() else {
            panic!("a MSG before its ASSIGN was accepted");
        };
        hog.queue(&Frame::ControlAck(
            mortarmq::wire::ops::ControlAck::answering(&notice, ControlResult::Ok),
        ));
    }
    hog.flush().unwrap();
    // The broker closes it once more than 17 MiB wait unsent; others are unaffected.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = broker.http("GET", "/stats");
        let stats: serde_json::Value = serde_json::from_str(&body).unwrap();
        if stats["connections"]["closed"]["output_overflow"].as_u64() == Some(1) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never closed: {}",
            stats["connections"]
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    producer.ping().unwrap();
    println!("RSS after the overflow close: {} bytes", broker.rss_bytes());
}
