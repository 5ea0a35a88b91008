//! Golden-vector tests: the hand-written vectors of `golden/` against `src/wire`.
//!
//! One test per vector kind; each checks every file of its kind and reports all
//! failing files in one panic. Transcripts are only checked for well-formedness here
//! (the broker tests replay them over TCP).

mod common;

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::sync::OnceLock;

use common::golden::{self, describe_bytes, Expected, Golden, Kind, Step};
use mortarmq::wire::frame::{classify_op, declared_length, split_frame, OpClass};
use mortarmq::wire::limits::{MAX_FRAME_LEN_BYTES, PREAUTH_FRAME_LEN_MAX_BYTES};
use mortarmq::wire::ops::{
    CreditResult, DeclareResult, Field, Frame, OkFrame, OkResult, Op, PubResult, SubResult,
};
use mortarmq::wire::ErrorCode;

const CONTRACT: &str = "golden vectors are the contract: the codec, src/client, tools/ and man pages change together with golden/";

/// Every vector, parsed once for all tests of this file.
fn all() -> &'static [(String, Golden)] {
    static ALL: OnceLock<Vec<(String, Golden)>> = OnceLock::new();
    ALL.get_or_init(golden::load_all)
}

fn of_kind(kind: Kind) -> impl Iterator<Item = (&'static str, &'static Golden)> {
    all()
        .iter()
        .filter(move |(_, g)| g.kind == kind)
        .map(|(n, g)| (n.as_str(), g))
}

/// The panic message for a list of failures (one entry per failing file or field).
fn failure_report(what: &str, checked: usize, failures: &[String]) -> String {
    format!(
        "{} of {checked} golden {what} failed:\n  - {}\n{CONTRACT}",
        failures.len(),
        failures.join("\n  - ")
    )
}

/// Runs `check` on every vector of `kind`; panics once, listing every failure.
fn check_all(kind: Kind, what: &str, check: impl Fn(&str, &Golden) -> Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    for (name, g) in of_kind(kind) {
        checked += 1;
        failures.extend(check(name, g));
    }
    assert!(
        checked > 0,
        "no golden {what} found in {}",
        golden::golden_dir().display()
    );
    if !failures.is_empty() {
        panic!("{}", failure_report(what, checked, &failures));
    }
}

fn cap(g: &Golden) -> u32 {
    if g.preauth {
        PREAUTH_FRAME_LEN_MAX_BYTES
    } else {
        MAX_FRAME_LEN_BYTES
    }
}

fn describe_field(f: &Field<'_>) -> String {
    match f {
        Field::Int(v) => format!("{v} (0x{v:x})"),
        Field::Bytes(b) => describe_bytes(b),
        Field::List(l) => format!("{l:?}"),
    }
}

fn same(expected: &Expected, actual: &Field<'_>) -> bool {
    match (expected, actual) {
        (Expected::Int(e), Field::Int(a)) => e == a,
        (Expected::Bytes(e), Field::Bytes(a)) => e.as_slice() == *a,
        (Expected::List(e), Field::List(a)) => e == a,
        _ => false,
    }
}

fn is_empty_field(f: &Field<'_>) -> bool {
    match f {
        Field::Bytes(b) => b.is_empty(),
        Field::List(l) => l.is_empty(),
        Field::Int(_) => false,
    }
}

/// Compares the file's field comments with the codec's fields: names in order, then
/// values. An empty byte field (or list) has no byte line in a vector (README), so a
/// codec field that is empty and absent from the file is accepted; its `*_len` is
/// still compared.
fn compare_fields(
    file: &str,
    prefix: &str,
    expected: &[(&str, &Expected)],
    actual: &[(&'static str, Field<'_>)],
    errs: &mut Vec<String>,
) {
    let (mut i, mut j) = (0, 0);
    while i < expected.len() || j < actual.len() {
        match (expected.get(i), actual.get(j)) {
            (Some((en, ev)), Some((an, av))) if en == an => {
                if !same(ev, av) {
                    errs.push(format!(
                        "{file}: field `{prefix}{en}`: expected {ev} (file), actual {} (codec)",
                        describe_field(av)
                    ));
                }
                i += 1;
                j += 1;
            }
            (_, Some((an, av)))
                if is_empty_field(av) && !expected[i..].iter().any(|(en, _)| en == an) =>
            {
                j += 1;
            }
            (Some((en, ev)), None) => {
                errs.push(format!(
                    "{file}: field `{prefix}{en}`: expected {ev} (file), actual: the codec decodes no such field"
                ));
                i += 1;
            }
            (None, Some((an, av))) => {
                errs.push(format!(
                    "{file}: field `{prefix}{an}`: expected no such field (the file has no comment for it), actual {} (codec)",
                    describe_field(av)
                ));
                j += 1;
            }
            (Some((en, _)), Some((an, _))) => {
                let names_e: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
                let names_a: Vec<&str> = actual.iter().map(|(n, _)| *n).collect();
                errs.push(format!(
                    "{file}: field #{i} `{prefix}{en}` (file) vs `{prefix}{an}` (codec): field names and order differ: \
                     expected {names_e:?}, actual {names_a:?}"
                ));
                return;
            }
            (None, None) => unreachable!(),
        }
    }
}

/// The file field whose bytes hold `offset`, for re-encoding mismatches.
fn field_at(g: &Golden, offset: usize) -> &str {
    g.field_spans
        .iter()
        .position(|s| s.contains(&offset))
        .map(|k| g.fields[k].0.as_str())
        .unwrap_or("unknown_tail")
}

fn hex_window(b: &[u8], at: usize) -> String {
    let end = (at + 8).min(b.len());
    if at >= b.len() {
        return "end of frame".to_string();
    }
    b[at..end]
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn check_result<R: OkResult>(
    file: &str,
    label: &str,
    g: &Golden,
    ok: &OkFrame<'_>,
    errs: &mut Vec<String>,
) {
    if ok.request_op != R::REQUEST_OP as u8 {
        errs.push(format!(
            "{file}: field `request_op`: @result {label} needs 0x{:02x}, actual 0x{:02x}",
            R::REQUEST_OP as u8,
            ok.request_op
        ));
    }
    let typed = match R::decode_result(ok.result) {
        Ok(r) => r,
        Err(e) => {
            errs.push(format!(
                "{file}: field `result`: expected a {label} result, actual: decode_result refused it: {e}"
            ));
            return;
        }
    };
    let expected: Vec<(&str, &Expected)> = g
        .fields
        .iter()
        .filter_map(|(n, v)| n.strip_prefix("result.").map(|n| (n, v)))
        .collect();
    if expected.is_empty() {
        errs.push(format!(
            "{file}: @result {label} but no `result.*` field comment"
        ));
    }
    compare_fields(file, "result.", &expected, &typed.result_fields(), errs);
    let mut again = Vec::new();
    typed.encode_result(&mut again);
    if again != ok.result {
        errs.push(format!(
            "{file}: field `result`: expected {} (file), actual {} (typed {label} result re-encoded)",
            describe_bytes(ok.result),
            describe_bytes(&again)
        ));
    }
}

/// `@kind frame`: split, classify, decode, compare fields, check `result.*`, re-encode.
fn check_frame(name: &str, g: &Golden) -> Vec<String> {
    let file = format!("golden/{name}.hex");
    let mut errs = Vec::new();
    let raw = match split_frame(&g.bytes, cap(g)) {
        Ok(Some(raw)) => raw,
        Ok(None) => {
            return vec![format!(
                "{file}: expected a complete frame, actual: split_frame asks for more than the file's {} bytes",
                g.bytes.len()
            )]
        }
        Err(e) => {
            return vec![format!(
                "{file}: expected a complete frame, actual: split_frame refused it with {} ({e})",
                e.code().name()
            )]
        }
    };
    if raw.total_bytes != g.bytes.len() {
        errs.push(format!(
            "{file}: field `length`: the frame occupies {} bytes, the file holds {}",
            raw.total_bytes,
            g.bytes.len()
        ));
    }
    let header_length = (raw.total_bytes - 4) as u64;
    for (field, actual) in [("length", header_length), ("op", u64::from(raw.op))] {
        match g.field(field) {
            Some(Expected::Int(v)) if *v == actual => {}
            Some(other) => errs.push(format!(
                "{file}: field `{field}`: expected {other} (file), actual {actual} (0x{actual:x}) (frame header)"
            )),
            None => errs.push(format!("{file}: field `{field}`: no `# {field} = …` comment")),
        }
    }
    let op = match classify_op(raw.op) {
        OpClass::Known(op) => op,
        other => {
            errs.push(format!(
                "{file}: field `op`: expected a known op, actual 0x{:02x} is {other:?}",
                raw.op
            ));
            return errs;
        }
    };
    let frame = match Frame::decode(op, raw.payload) {
        Ok(f) => f,
        Err(e) => {
            errs.push(format!(
                "{file}: expected a valid {} frame, actual: Frame::decode refused it (MALFORMED_PAYLOAD): {e}",
                op.name()
            ));
            return errs;
        }
    };

    let expected: Vec<(&str, &Expected)> = g
        .fields
        .iter()
        .filter(|(n, _)| n != "length" && n != "op" && !n.starts_with("result."))
        .map(|(n, v)| (n.as_str(), v))
        .collect();
    let mut actual = frame.fields();
    if g.result_op.is_some() {
        // `result` is checked field by field through its typed decoding below.
        actual.retain(|(n, _)| *n != "result");
    }
    compare_fields(&file, "", &expected, &actual, &mut errs);

    if let Some(label) = g.result_op.as_deref() {
        match &frame {
            Frame::Ok(ok) => match label {
                "DECLARE" => check_result::<DeclareResult>(&file, label, g, ok, &mut errs),
                "PUB" => check_result::<PubResult>(&file, label, g, ok, &mut errs),
                "SUB" => check_result::<SubResult>(&file, label, g, ok, &mut errs),
                "CREDIT" => check_result::<CreditResult>(&file, label, g, ok, &mut errs),
                other => errs.push(format!(
                    "{file}: @result {other}: no typed result of that name"
                )),
            },
            other => errs.push(format!(
                "{file}: @result {label} on a {} frame (only OK frames carry a result)",
                other.op().name()
            )),
        }
    }

    // Re-encode: the file minus the unknown tail, with `length` reduced by the tail.
    let want: Cow<[u8]> = if g.tail == 0 {
        Cow::Borrowed(&g.bytes)
    } else if g.tail + 5 > g.bytes.len() {
        errs.push(format!(
            "{file}: @tail {} is longer than the payload",
            g.tail
        ));
        return errs;
    } else {
        let mut v = g.bytes[..g.bytes.len() - g.tail].to_vec();
        let reduced = (v.len() - 4) as u32;
        v[..4].copy_from_slice(&reduced.to_be_bytes());
        Cow::Owned(v)
    };
    let mut encoded = Vec::with_capacity(want.len());
    frame.encode(&mut encoded);
    if encoded != *want {
        let at = want
            .iter()
            .zip(&encoded)
            .position(|(w, e)| w != e)
            .unwrap_or(want.len().min(encoded.len()));
        errs.push(format!(
            "{file}: field `{}`: re-encoding differs at byte {at}: expected {} (file{}), actual {} (Frame::encode); \
             expected {} bytes, actual {}",
            field_at(g, at),
            hex_window(&want, at),
            if g.tail > 0 { " minus its tail" } else { "" },
            hex_window(&encoded, at),
            want.len(),
            encoded.len()
        ));
    }
    errs
}

/// What the splitter, op classification and decoder make of `bytes`: the registry
/// name of the refusal, or a description of the acceptance.
fn refusal(bytes: &[u8], cap: u32) -> Result<&'static str, String> {
    match split_frame(bytes, cap) {
        Err(e) => Ok(e.code().name()),
        Ok(None) => Err("split_frame asks for more bytes (Ok(None))".to_string()),
        Ok(Some(raw)) => match classify_op(raw.op) {
            OpClass::Illegal => Ok(ErrorCode::IllegalOp.name()),
            OpClass::Reserved => Ok(ErrorCode::UnknownOp.name()),
            OpClass::Known(op) => match Frame::decode(op, raw.payload) {
                Err(_) => Ok(ErrorCode::MalformedPayload.name()),
                Ok(_) => Err(format!("Frame::decode accepts it as a {} frame", op.name())),
            },
        },
    }
}

/// `@kind reject`: refused with exactly `@expect`.
fn check_reject(name: &str, g: &Golden) -> Vec<String> {
    let file = format!("golden/{name}.hex");
    let mut errs = Vec::new();
    let expect = g.expect.as_deref().unwrap_or_default();
    if !ErrorCode::ALL.iter().any(|c| c.name() == expect) {
        errs.push(format!("{file}: @expect {expect} is not a registry name"));
    }
    match refusal(&g.bytes, cap(g)) {
        Ok(code) if code == expect => {}
        Ok(code) => errs.push(format!(
            "{file}: field `@expect`: expected {expect}, actual {code}"
        )),
        Err(accepted) => errs.push(format!(
            "{file}: field `@expect`: expected {expect}, actual: not refused, {accepted}"
        )),
    }
    let declared = declared_length(&g.bytes);
    if expect == ErrorCode::InvalidFrameLength.name() {
        // Refused from the 4 header bytes alone, before any body is buffered.
        let header = &g.bytes[..g.bytes.len().min(4)];
        if refusal(header, cap(g)) != Ok(expect) {
            errs.push(format!(
                "{file}: field `length`: expected {expect} from the header alone, actual {:?}",
                refusal(header, cap(g))
            ));
        }
    } else if declared.map(|l| l as usize + 4) != Some(g.bytes.len()) {
        // README: in other reject files the frame boundary is intact.
        errs.push(format!(
            "{file}: field `length`: expected {} (the file's {} bytes minus 4), actual {declared:?}",
            g.bytes.len().saturating_sub(4),
            g.bytes.len()
        ));
    }
    errs
}

/// `@kind partial`: the splitter asks for more bytes for the file and every prefix of
/// it, and yields exactly one frame once the missing bytes arrive.
fn check_partial(name: &str, g: &Golden) -> Vec<String> {
    let file = format!("golden/{name}.hex");
    let mut errs = Vec::new();
    for cut in 0..=g.bytes.len() {
        let got = split_frame(&g.bytes[..cut], cap(g));
        if got != Ok(None) {
            errs.push(format!(
                "{file}: first {cut} bytes: expected Ok(None) (ask for more), actual {got:?}"
            ));
            return errs;
        }
    }
    match declared_length(&g.bytes) {
        Some(l) if l as usize + 4 > g.bytes.len() => {
            let mut whole = g.bytes.clone();
            whole.resize(l as usize + 4, 0);
            match split_frame(&whole, cap(g)) {
                Ok(Some(raw)) if raw.total_bytes == whole.len() => {}
                got => errs.push(format!(
                    "{file}: field `length`: completed to {} bytes, expected one whole frame, actual {got:?}",
                    whole.len()
                )),
            }
        }
        l => errs.push(format!(
            "{file}: field `length`: expected more than the file's {} bytes after the header, actual {l:?}",
            g.bytes.len().saturating_sub(4)
        )),
    }
    errs
}

/// `@kind transcript`: every file it sends or expects exists, parses and has bytes.
fn check_transcript(name: &str, g: &Golden) -> Vec<String> {
    let file = format!("golden/{name}.hex");
    let by_name: HashMap<&str, &Golden> = all().iter().map(|(n, g)| (n.as_str(), g)).collect();
    let mut errs = Vec::new();
    for step in &g.steps {
        let (verb, target) = match step {
            Step::Send(t) => ("@send", t),
            Step::Recv(t) => ("@recv", t),
            _ => continue,
        };
        let stem = target.strip_suffix(".hex").unwrap_or(target);
        match by_name.get(stem) {
            None => errs.push(format!("{file}: {verb} {target}: no such file in golden/")),
            Some(t) if t.kind == Kind::Transcript => errs.push(format!(
                "{file}: {verb} {target}: that is a transcript, it has no bytes"
            )),
            Some(_) => {
                // Also through the public loader, as the broker tests will.
                let loaded = golden::load(target);
                assert!(!loaded.bytes.is_empty());
            }
        }
    }
    errs
}

#[test]
fn frame_vectors_decode_to_their_fields_and_reencode_byte_for_byte() {
    check_all(Kind::Frame, "frame vectors", check_frame);
}

#[test]
fn reject_vectors_are_refused_with_their_registry_code() {
    check_all(Kind::Reject, "reject vectors", check_reject);
}

#[test]
fn partial_vectors_make_the_splitter_ask_for_more() {
    check_all(Kind::Partial, "partial vectors", check_partial);
}

#[test]
fn transcripts_name_existing_parsable_vectors() {
    check_all(Kind::Transcript, "transcripts", check_transcript);
}

/// Independent of the codec: each field comment describes the bytes of its own lines
/// (integers big-endian over the field's width, lists as u64 entries). Catches a
/// hand-written slip in reject and partial files, which are not decoded field by field.
#[test]
fn field_comments_match_their_own_bytes() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, g) in all() {
        checked += 1;
        for ((field, value), span) in g.fields.iter().zip(&g.field_spans) {
            let bytes = &g.bytes[span.clone()];
            let ok = match value {
                Expected::Int(v) => {
                    (1..=8).contains(&bytes.len())
                        && bytes.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)) == *v
                }
                Expected::Bytes(b) => b.as_slice() == bytes,
                Expected::List(l) => {
                    bytes.len() == l.len() * 8
                        && bytes
                            .chunks_exact(8)
                            .zip(l)
                            .all(|(c, v)| u64::from_be_bytes(c.try_into().unwrap()) == *v)
                }
            };
            if !ok {
                failures.push(format!(
                    "golden/{name}.hex: field `{field}`: expected {value} (comment), actual {} (its bytes)",
                    describe_bytes(bytes)
                ));
            }
        }
    }
    if !failures.is_empty() {
        panic!("{}", failure_report("files", checked, &failures));
    }
}

#[test]
fn every_op_has_a_frame_vector() {
    let covered: BTreeSet<u8> = of_kind(Kind::Frame)
        .filter_map(|(_, g)| g.bytes.get(4).copied())
        .collect();
    let missing: Vec<String> = Op::ALL
        .iter()
        .filter(|op| !covered.contains(&(**op as u8)))
        .map(|op| format!("{} (0x{:02x})", op.name(), *op as u8))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without any `@kind frame` vector: {missing:?}\n{CONTRACT}"
    );
}

#[test]
fn seed_boundary_cases_exist_with_their_kinds_and_lengths() {
    let by_name: HashMap<&str, &Golden> = all().iter().map(|(n, g)| (n.as_str(), g)).collect();
    // (case, kind, declared length where the boundary is the length itself)
    let cases: [(&str, Kind, Option<u32>); 7] = [
        ("length_zero", Kind::Reject, Some(0)),
        (
            "length_max_plus_one",
            Kind::Reject,
            Some(MAX_FRAME_LEN_BYTES + 1),
        ),
        ("frame_exactly_max", Kind::Frame, Some(MAX_FRAME_LEN_BYTES)),
        ("half_frame", Kind::Partial, None),
        ("t_half_frame_timeout", Kind::Transcript, None),
        (
            "preauth_too_long",
            Kind::Reject,
            Some(PREAUTH_FRAME_LEN_MAX_BYTES + 1),
        ),
        (
            "preauth_max_partial",
            Kind::Partial,
            Some(PREAUTH_FRAME_LEN_MAX_BYTES),
        ),
    ];
    let mut failures = Vec::new();
    for (case, kind, length) in cases {
        match by_name.get(case) {
            None => failures.push(format!("golden/{case}.hex: missing")),
            Some(g) if g.kind != kind => failures.push(format!(
                "golden/{case}.hex: @kind: expected {kind:?}, actual {:?}",
                g.kind
            )),
            Some(g) if length.is_some() && g.declared_length() != length => failures.push(format!(
                "golden/{case}.hex: field `length`: expected {length:?}, actual {:?}",
                g.declared_length()
            )),
            Some(_) => {}
        }
    }
    if !failures.is_empty() {
        panic!(
            "{}",
            failure_report("boundary cases", cases.len(), &failures)
        );
    }
}

/// Replaces `from` by `to` on the first line containing `marker`.
fn break_line(text: &str, marker: &str, from: &str, to: &str) -> String {
    let mut done = false;
    let out: Vec<String> = text
        .lines()
        .map(|l| {
            if !done && l.contains(marker) {
                assert!(l.contains(from), "{from:?} not on line {l:?}");
                done = true;
                l.replacen(from, to, 1)
            } else {
                l.to_string()
            }
        })
        .collect();
    assert!(done, "no line contains {marker:?}");
    out.join("\n")
}

fn text_of(case: &str) -> String {
    std::fs::read_to_string(golden::golden_dir().join(golden::file_name(case))).unwrap()
}

/// The checks can fail: a valid vector with one byte changed is caught, by field.
#[test]
fn a_vector_with_one_byte_changed_fails_the_comparison() {
    // frame: one byte of `value` ("hello" -> "iello"), comment unchanged.
    let text = text_of("pub");
    assert_eq!(
        check_frame("pub", &golden::parse("pub.hex", &text)),
        Vec::<String>::new()
    );
    let broken = break_line(&text, "# value =", "68 65", "69 65");
    let errs = check_frame("pub_broken", &golden::parse("pub_broken.hex", &broken));
    assert!(!errs.is_empty(), "a changed value byte went unnoticed");
    assert!(
        errs.iter()
            .any(|e| e.contains("golden/pub_broken.hex") && e.contains("field `value`")),
        "the failure must name the file and the field: {errs:#?}"
    );
    let report = failure_report("frame vectors", 1, &errs);
    assert!(
        report.contains(CONTRACT) && report.contains("\"hello\""),
        "{report}"
    );

    // typed OK result: result.durability 2 -> 3, comment unchanged.
    let text = text_of("ok_pub");
    let broken = break_line(&text, "# result.durability", "02", "03");
    let errs = check_frame(
        "ok_pub_broken",
        &golden::parse("ok_pub_broken.hex", &broken),
    );
    assert!(
        errs.iter().any(|e| e.contains("field `result.durability`")),
        "{errs:#?}"
    );

    // reject: op 0x00 -> 0x07 makes a valid PING.
    let text = text_of("illegal_op_00");
    assert!(check_reject("illegal_op_00", &golden::parse("x.hex", &text)).is_empty());
    let broken = break_line(&text, "# op =", "00", "07");
    let errs = check_reject("illegal_op_00_broken", &golden::parse("x.hex", &broken));
    assert!(
        errs.iter().any(|e| e.contains("expected ILLEGAL_OP")),
        "{errs:#?}"
    );

    // partial: length 36 -> 13 makes the 17 bytes a complete frame.
    let text = text_of("half_frame");
    assert!(check_partial("half_frame", &golden::parse("x.hex", &text)).is_empty());
    let broken = break_line(&text, "# length =", "00 00 00 24", "00 00 00 0d");
    let errs = check_partial("half_frame_broken", &golden::parse("x.hex", &broken));
    assert!(!errs.is_empty(), "a complete frame passed as partial");
}

/// The parser refuses malformed files with the file name and line number.
#[test]
fn unparsable_files_panic_with_file_and_line() {
    let cases = [
        ("@kind frame\n00 0g # op = 1\n", "bad.hex:2:"),
        ("@kind reject\n00 00 00 00 # length = 0\n", "bad.hex:1:"),
        ("@kind frame\n00 00 00 01 # length = 1\n07 # op = seven\n", "bad.hex:3:"),
        ("# c\n@kind transcript\n@send ping.hex\n@wait 1s\n", "bad.hex:4:"),
        ("@kind transcript\n@expect-close-within 3 s\n", "bad.hex:2:"),
        ("@kind frame\n@tail 2\n00 00 00 03 # length = 3\n07 # op = 7\nfe # unknown_tail = hex:fe\n", "bad.hex:5:"),
    ];
    for (text, want) in cases {
        let err = std::panic::catch_unwind(|| golden::parse("bad.hex", text))
            .expect_err(&format!("parsed: {text:?}"));
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains(want), "{msg:?} should contain {want:?}");
    }
    // And the value forms of the README.
    let g = golden::parse(
        "ok.hex",
        "00 00 00 0b # length = 11\n09 # op = 0x09\n01 02 # a = [1, 0x2]\n41 # b = \"A\"\nff # c = hex:ff\n\
         repeat 0x00 3 # d = repeat(0x00, 3)\n\
         # e = \"\" (empty field: no bytes)\n",
    );
    assert_eq!(g.kind, Kind::Frame);
    assert_eq!(g.bytes.len(), 4 + 1 + 2 + 1 + 1 + 3);
    assert_eq!(g.fields[2], ("a".into(), Expected::List(vec![1, 2])));
    assert_eq!(g.fields[3], ("b".into(), Expected::Bytes(b"A".to_vec())));
    assert_eq!(g.fields[5], ("d".into(), Expected::Bytes(vec![0; 3])));
    assert_eq!(g.field_spans[5], 9..12);
    assert_eq!(g.fields.len(), 6);
}
