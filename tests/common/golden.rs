//! Parser for the hand-written golden vectors in `golden/*.hex` (format: `golden/README.md`).
//!
//! This module only parses: it knows nothing of the codec, so the codec can never
//! "agree with itself" through it. The test files (`tests/golden.rs`, the broker
//! transcript tests, …) compare what it returns with `src/wire`.
//!
//! A file that does not follow the format makes [`parse`] panic with
//! `golden/<file>:<line>: <reason>`.

// Shared by several test crates, each of which uses only part of it.
#![allow(dead_code)]

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

/// What a vector is (`@kind`; `frame` when absent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A complete frame: split, decode to the commented fields, re-encode byte for byte.
    Frame,
    /// Bytes the splitter, op classification or decoder must refuse with `@expect`.
    Reject,
    /// A prefix of a frame: the splitter must ask for more bytes.
    Partial,
    /// A broker conversation replayed over TCP (steps only, no byte lines).
    Transcript,
}

/// A field comment's value (`# name = value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// `33`, `0x0021`.
    Int(u64),
    /// `"k1"`, `hex:feed01`, `repeat(0x00, 16777210)`.
    Bytes(Vec<u8>),
    /// `[1, 2]`.
    List(Vec<u64>),
}

/// One line of a transcript.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// `@send <file>`: write that golden file's bytes exactly as listed.
    Send(String),
    /// `@send-hex <hex bytes>`.
    SendHex(Vec<u8>),
    /// `@recv <file>`: the next frame must match that golden file (README, Transcript semantics).
    Recv(String),
    /// `@expect-close`.
    ExpectClose,
    /// `@expect-no-close-before <duration>`.
    ExpectNoCloseBefore(Duration),
    /// `@expect-close-within <duration>`.
    ExpectCloseWithin(Duration),
}

/// One parsed golden file.
#[derive(Debug, Clone)]
pub struct Golden {
    pub kind: Kind,
    /// Every byte line, in order (`repeat` lines expanded), the unknown tail included.
    pub bytes: Vec<u8>,
    /// The field comments in file order, `length`/`op`/`result.*` included,
    /// `unknown_tail` excluded (it is not a field).
    pub fields: Vec<(String, Expected)>,
    /// Parallel to `fields`: the bytes of `bytes` each field's lines cover (a field
    /// spanning several lines names itself on the first one only).
    pub field_spans: Vec<Range<usize>>,
    /// `@expect CODE_NAME` (reject files).
    pub expect: Option<String>,
    /// `@result OP` (DECLARE, PUB, SUB or CREDIT).
    pub result_op: Option<String>,
    /// `@tail N`: the last N bytes are an unknown tail (0 when absent).
    pub tail: usize,
    /// `@preauth`: the splitter is in the pre-CONNECT state.
    pub preauth: bool,
    /// Transcript steps, in order.
    pub steps: Vec<Step>,
    /// `@flags` words for the broker started for a transcript, in order.
    pub flags: Vec<String>,
}

impl Golden {
    /// The value of the first field comment called `name`.
    pub fn field(&self, name: &str) -> Option<&Expected> {
        self.fields.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The `length` field of the header as the bytes say (not the comment).
    pub fn declared_length(&self) -> Option<u32> {
        let header: [u8; 4] = self.bytes.get(..4)?.try_into().ok()?;
        Some(u32::from_be_bytes(header))
    }
}

/// `CARGO_MANIFEST_DIR/golden`.
pub fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// `case` → `case.hex`; a name already ending in `.hex` is kept.
pub fn file_name(name: &str) -> String {
    if name.ends_with(".hex") {
        name.to_string()
    } else {
        format!("{name}.hex")
    }
}

/// Loads `golden/<name>.hex` (`name` with or without `.hex`). Panics when the file is
/// missing or does not parse.
pub fn load(name: &str) -> Golden {
    let file = file_name(name);
    let path = golden_dir().join(&file);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("golden/{file}: cannot read {}: {e}", path.display()));
    parse(&file, &text)
}

/// Every `golden/*.hex`, sorted by name; the names are the case names (no `.hex`).
pub fn load_all() -> Vec<(String, Golden)> {
    let dir = golden_dir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| {
            entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
                .file_name()
                .into_string()
                .unwrap_or_else(|n| panic!("non-UTF-8 file name in {}: {n:?}", dir.display()))
        })
        .filter_map(|n| n.strip_suffix(".hex").map(str::to_string))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "no *.hex file in {}", dir.display());
    names
        .into_iter()
        .map(|n| {
            let g = load(&n);
            (n, g)
        })
        .collect()
}

/// Largest `repeat` count accepted (4 × MAX_FRAME_LEN): a typo cannot allocate gigabytes.
const REPEAT_MAX: usize = 64 << 20;

/// Parses the text of one golden file; `file` names it in panic messages.
pub fn parse(file: &str, text: &str) -> Golden {
    Parser::new(file).run(text)
}

#[derive(Default)]
struct Seen {
    kind: Option<usize>,
    expect: Option<usize>,
    direction: Option<usize>,
    result: Option<usize>,
    tail: Option<usize>,
    preauth: Option<usize>,
    first_step: Option<usize>,
    first_flags: Option<usize>,
    first_byte_line: Option<usize>,
}

struct Parser<'f> {
    file: &'f str,
    line: usize,
    kind: Option<Kind>,
    g: Golden,
    seen: Seen,
    /// `(line, span, value)` of the `# unknown_tail = …` byte line.
    unknown_tail: Option<(usize, Range<usize>, Expected)>,
}

impl<'f> Parser<'f> {
    fn new(file: &'f str) -> Self {
        Parser {
            file,
            line: 0,
            kind: None,
            g: Golden {
                kind: Kind::Frame,
                bytes: Vec::new(),
                fields: Vec::new(),
                field_spans: Vec::new(),
                expect: None,
                result_op: None,
                tail: 0,
                preauth: false,
                steps: Vec::new(),
                flags: Vec::new(),
            },
            seen: Seen::default(),
            unknown_tail: None,
        }
    }

    fn fail_at(&self, line: usize, msg: impl fmt::Display) -> ! {
        panic!("golden/{}:{}: {}", self.file, line, msg)
    }

    fn fail(&self, msg: impl fmt::Display) -> ! {
        self.fail_at(self.line, msg)
    }

    fn run(mut self, text: &str) -> Golden {
        for (i, raw) in text.lines().enumerate() {
            self.line = i + 1;
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                // Comments, including comment-only field notes such as
                // `# key = "" (empty field: no bytes)`, which parsers ignore.
                continue;
            }
            match line.strip_prefix('@') {
                Some(directive) => self.directive(directive),
                None => self.byte_line(line),
            }
        }
        self.finish()
    }

    fn once(&self, slot: Option<usize>, name: &str) -> Option<usize> {
        if let Some(first) = slot {
            self.fail(format_args!("duplicate @{name} (first on line {first})"));
        }
        Some(self.line)
    }

    fn directive(&mut self, d: &str) {
        let (name, arg) = match d.split_once(char::is_whitespace) {
            Some((n, a)) => (n, a.trim()),
            None => (d, ""),
        };
        let no_arg = |p: &Self| {
            if !arg.is_empty() {
                p.fail(format_args!("@{name} takes no argument, got {arg:?}"));
            }
        };
        let need_arg = |p: &Self| {
            if arg.is_empty() {
                p.fail(format_args!("@{name} needs an argument"));
            }
        };
        match name {
            "kind" => {
                self.seen.kind = self.once(self.seen.kind, name);
                self.kind = Some(match arg {
                    "frame" => Kind::Frame,
                    "reject" => Kind::Reject,
                    "partial" => Kind::Partial,
                    "transcript" => Kind::Transcript,
                    _ => self.fail(format_args!(
                        "@kind must be frame, reject, partial or transcript, got {arg:?}"
                    )),
                });
            }
            "expect" => {
                self.seen.expect = self.once(self.seen.expect, name);
                need_arg(self);
                if !arg
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
                {
                    self.fail(format_args!(
                        "@expect needs a registry name such as INVALID_FRAME_LENGTH, got {arg:?}"
                    ));
                }
                self.g.expect = Some(arg.to_string());
            }
            "direction" => {
                self.seen.direction = self.once(self.seen.direction, name);
                if arg != "C->S" && arg != "S->C" {
                    self.fail(format_args!("@direction must be C->S or S->C, got {arg:?}"));
                }
            }
            "result" => {
                self.seen.result = self.once(self.seen.result, name);
                if !matches!(arg, "DECLARE" | "PUB" | "SUB" | "CREDIT") {
                    self.fail(format_args!(
                        "@result must be DECLARE, PUB, SUB or CREDIT, got {arg:?}"
                    ));
                }
                self.g.result_op = Some(arg.to_string());
            }
            "tail" => {
                self.seen.tail = self.once(self.seen.tail, name);
                match parse_decimal(arg) {
                    Some(n) if n > 0 => self.g.tail = n as usize,
                    _ => self.fail(format_args!("@tail needs a byte count > 0, got {arg:?}")),
                }
            }
            "preauth" => {
                self.seen.preauth = self.once(self.seen.preauth, name);
                no_arg(self);
                self.g.preauth = true;
            }
            "send" | "recv" => {
                need_arg(self);
                if arg.contains(char::is_whitespace) || arg.contains('/') || !arg.ends_with(".hex")
                {
                    self.fail(format_args!(
                        "@{name} needs one file of this directory ending in .hex, got {arg:?}"
                    ));
                }
                let step = if name == "send" {
                    Step::Send(arg.to_string())
                } else {
                    Step::Recv(arg.to_string())
                };
                self.step(step);
            }
            "send-hex" => {
                need_arg(self);
                let mut bytes = Vec::new();
                if let Err(e) = push_hex_pairs(arg, &mut bytes) {
                    self.fail(format_args!("@send-hex: {e}"));
                }
                self.step(Step::SendHex(bytes));
            }
            "expect-close" => {
                no_arg(self);
                self.step(Step::ExpectClose);
            }
            "expect-no-close-before" | "expect-close-within" => {
                let Some(d) = parse_duration(arg) else {
                    self.fail(format_args!(
                        "@{name} needs a duration <n>ms or <n>s, got {arg:?}"
                    ));
                };
                self.step(if name == "expect-close-within" {
                    Step::ExpectCloseWithin(d)
                } else {
                    Step::ExpectNoCloseBefore(d)
                });
            }
            "flags" => {
                need_arg(self);
                self.seen.first_flags.get_or_insert(self.line);
                self.g
                    .flags
                    .extend(arg.split_whitespace().map(str::to_string));
            }
            _ => self.fail(format_args!("unknown directive @{name}")),
        }
    }

    fn step(&mut self, step: Step) {
        self.seen.first_step.get_or_insert(self.line);
        self.g.steps.push(step);
    }

    fn byte_line(&mut self, line: &str) {
        self.seen.first_byte_line.get_or_insert(self.line);
        if let Some((tail_line, _, _)) = &self.unknown_tail {
            self.fail(format_args!(
                "byte line after the unknown_tail line {tail_line} (the tail is the last byte line)"
            ));
        }
        let (data, comment) = match line.split_once('#') {
            Some((d, c)) => (d.trim(), Some(c.trim())),
            None => (line, None),
        };
        let start = self.g.bytes.len();
        let result = match data.strip_prefix("repeat") {
            Some(rest) if rest.starts_with(char::is_whitespace) => {
                push_repeat_line(rest, &mut self.g.bytes)
            }
            _ => push_hex_pairs(data, &mut self.g.bytes),
        };
        if let Err(e) = result {
            self.fail(e);
        }
        let span = start..self.g.bytes.len();
        match comment {
            None => {
                // Continuation of the field named on an earlier line.
                match self.g.field_spans.last_mut() {
                    Some(last) => last.end = span.end,
                    None => self.fail("byte line without a field comment before any named field"),
                }
            }
            Some(c) => {
                let Some((name, value)) = c.split_once('=') else {
                    self.fail(format_args!(
                        "the comment of a byte line must be `name = value`, got {c:?}"
                    ));
                };
                let name = name.trim();
                let valid_name = !name.is_empty()
                    && name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.');
                if !valid_name {
                    self.fail(format_args!("bad field name {name:?}"));
                }
                let value = parse_value(value.trim())
                    .unwrap_or_else(|e| self.fail(format_args!("field `{name}`: {e}")));
                if name == "unknown_tail" {
                    self.unknown_tail = Some((self.line, span, value));
                } else {
                    self.g.fields.push((name.to_string(), value));
                    self.g.field_spans.push(span);
                }
            }
        }
    }

    fn finish(mut self) -> Golden {
        let kind = self.kind.unwrap_or(Kind::Frame);
        self.g.kind = kind;
        let s = &self.seen;
        let at = |line: Option<usize>, msg: &str| {
            if let Some(line) = line {
                self.fail_at(line, msg);
            }
        };
        let kind_line = s.kind.unwrap_or(1);
        if kind == Kind::Transcript {
            at(s.first_byte_line, "a transcript has no byte lines");
            at(s.expect, "@expect only goes with @kind reject");
            at(s.result, "@result only goes with @kind frame");
            at(s.tail, "@tail only goes with @kind frame");
            at(s.preauth, "@preauth does not go with @kind transcript");
            if self.g.steps.is_empty() {
                self.fail_at(kind_line, "a transcript needs at least one step");
            }
        } else {
            at(
                s.first_step,
                "transcript steps only go with @kind transcript",
            );
            at(s.first_flags, "@flags only goes with @kind transcript");
            if self.g.bytes.is_empty() {
                self.fail_at(kind_line, "no byte lines");
            }
        }
        match (kind, s.expect) {
            (Kind::Reject, None) => self.fail_at(kind_line, "@kind reject needs @expect CODE_NAME"),
            (Kind::Reject, Some(_)) => {}
            (_, line) => at(line, "@expect only goes with @kind reject"),
        }
        if kind != Kind::Frame {
            at(s.result, "@result only goes with @kind frame");
            at(s.tail, "@tail only goes with @kind frame");
        }
        match (&self.unknown_tail, self.g.tail) {
            (None, 0) => {}
            (None, n) => at(
                s.tail,
                &format!("@tail {n} without a `# unknown_tail = hex:...` byte line"),
            ),
            (Some((line, _, _)), 0) => self.fail_at(*line, "unknown_tail without @tail N"),
            (Some((line, span, value)), n) => {
                if span.len() != n {
                    self.fail_at(
                        *line,
                        format_args!(
                            "@tail {n} but the unknown_tail line has {} bytes",
                            span.len()
                        ),
                    );
                }
                if *value != Expected::Bytes(self.g.bytes[span.clone()].to_vec()) {
                    self.fail_at(
                        *line,
                        "the unknown_tail comment does not match the bytes of its line",
                    );
                }
            }
        }
        self.g
    }
}

/// Appends whitespace-separated tokens of hex pairs (`00 0a`, `000a`) to `out`.
fn push_hex_pairs(data: &str, out: &mut Vec<u8>) -> Result<(), String> {
    for token in data.split_whitespace() {
        decode_hex(token, out).map_err(|e| format!("bad hex {token:?}: {e}"))?;
    }
    Ok(())
}

/// `0xAB N` (after `repeat`): N copies of 0xAB, appended without per-byte work.
fn push_repeat_line(rest: &str, out: &mut Vec<u8>) -> Result<(), String> {
    let words: Vec<&str> = rest.split_whitespace().collect();
    let [byte, count] = words[..] else {
        return Err(format!(
            "a repeat line is `repeat 0xAB N`, got `repeat{rest}`"
        ));
    };
    let (byte, count) = parse_repeat_args(byte, count)?;
    let chunk = [byte; 4096];
    out.reserve(count);
    let mut left = count;
    while left > 0 {
        let n = left.min(chunk.len());
        out.extend_from_slice(&chunk[..n]);
        left -= n;
    }
    Ok(())
}

fn parse_repeat_args(byte: &str, count: &str) -> Result<(u8, usize), String> {
    let byte = parse_int(byte.trim())
        .and_then(|b| u8::try_from(b).ok())
        .ok_or_else(|| format!("repeat needs a byte such as 0xAB, got {byte:?}"))?;
    let count = parse_int(count.trim())
        .map(|n| n as usize)
        .filter(|&n| n <= REPEAT_MAX)
        .ok_or_else(|| format!("repeat needs a count up to {REPEAT_MAX}, got {count:?}"))?;
    Ok((byte, count))
}

fn decode_hex(s: &str, out: &mut Vec<u8>) -> Result<(), String> {
    if !s.len().is_multiple_of(2) {
        return Err("odd number of hex digits".to_string());
    }
    for pair in s.as_bytes().chunks_exact(2) {
        let digit = |c: u8| {
            (c as char)
                .to_digit(16)
                .ok_or_else(|| format!("{:?} is not a hex digit", c as char))
        };
        out.push((digit(pair[0])? * 16 + digit(pair[1])?) as u8);
    }
    Ok(())
}

fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// `123` or `0x7b` / `0X7B`.
fn parse_int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
            u64::from_str_radix(hex, 16).ok()
        }
        Some(_) => None,
        None => parse_decimal(s),
    }
}

/// `300ms` or `3s`.
fn parse_duration(s: &str) -> Option<Duration> {
    if let Some(ms) = s.strip_suffix("ms") {
        return parse_decimal(ms).map(Duration::from_millis);
    }
    parse_decimal(s.strip_suffix('s')?).map(Duration::from_secs)
}

/// The value of a field comment (README: decimal, 0x hex, "quoted", hex:…, […], repeat(…)).
fn parse_value(v: &str) -> Result<Expected, String> {
    if let Some(rest) = v.strip_prefix('"') {
        let Some(inner) = rest.strip_suffix('"') else {
            return Err(format!("unterminated string {v:?}"));
        };
        let mut out = Vec::with_capacity(inner.len());
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            let c = match c {
                '\\' => match chars.next() {
                    Some(e @ ('"' | '\\')) => e,
                    other => return Err(format!("unsupported escape \\{other:?} in {v:?}")),
                },
                '"' => return Err(format!("unescaped quote inside {v:?}")),
                c => c,
            };
            if !c.is_ascii() {
                return Err(format!("non-ASCII character {c:?} in {v:?} (use hex:)"));
            }
            out.push(c as u8);
        }
        return Ok(Expected::Bytes(out));
    }
    if let Some(hex) = v.strip_prefix("hex:") {
        let mut out = Vec::with_capacity(hex.len() / 2);
        decode_hex(hex, &mut out).map_err(|e| format!("bad {v:?}: {e}"))?;
        return Ok(Expected::Bytes(out));
    }
    if let Some(inner) = v.strip_prefix('[') {
        let Some(inner) = inner.strip_suffix(']') else {
            return Err(format!("unterminated list {v:?}"));
        };
        if inner.trim().is_empty() {
            return Ok(Expected::List(Vec::new()));
        }
        return inner
            .split(',')
            .map(|e| parse_int(e.trim()).ok_or_else(|| format!("bad list entry {e:?} in {v:?}")))
            .collect::<Result<_, _>>()
            .map(Expected::List);
    }
    if let Some(args) = v.strip_prefix("repeat(") {
        let inner = args
            .strip_suffix(')')
            .ok_or_else(|| format!("unterminated {v:?}"))?;
        let Some((byte, count)) = inner.split_once(',') else {
            return Err(format!("repeat(0xAB, N) needs two arguments, got {v:?}"));
        };
        let (byte, count) = parse_repeat_args(byte, count)?;
        return Ok(Expected::Bytes(vec![byte; count]));
    }
    parse_int(v).map(Expected::Int).ok_or_else(|| {
        format!("{v:?} is not a decimal, 0x, \"quoted\", hex:, [list] or repeat(0xAB, N) value")
    })
}

/// A short, readable rendering of bytes for failure messages: `"k1"` for printable
/// ASCII, `repeat(0x00, N)` for a run of one byte, else `hex:…` (cut after 32 bytes).
pub fn describe_bytes(b: &[u8]) -> String {
    const SHOWN: usize = 32;
    if b.len() > 1 && b.iter().all(|&x| x == b[0]) && b.len() > SHOWN {
        return format!("repeat(0x{:02x}, {})", b[0], b.len());
    }
    if !b.is_empty() && b.len() <= 64 && b.iter().all(|&x| (0x20..0x7f).contains(&x)) {
        return format!("{:?} ({} bytes)", String::from_utf8_lossy(b), b.len());
    }
    let hex: String = b.iter().take(SHOWN).map(|x| format!("{x:02x}")).collect();
    if b.len() > SHOWN {
        format!("hex:{hex}… ({} bytes)", b.len())
    } else {
        format!("hex:{hex} ({} bytes)", b.len())
    }
}

impl fmt::Display for Expected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expected::Int(v) => write!(f, "{v} (0x{v:x})"),
            Expected::Bytes(b) => f.write_str(&describe_bytes(b)),
            Expected::List(l) => write!(f, "{l:?}"),
        }
    }
}
