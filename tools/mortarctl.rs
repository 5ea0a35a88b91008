//! `mortarctl`: the MortarMQ operator CLI (see `man/mortarctl.1`).
//!
//! Read path: `stats`, `topics list`, `groups list`, `groups describe` fetch the broker's
//! admin `/stats` JSON over a hand-rolled HTTP/1.1 GET and print aligned tables, or the
//! JSON itself with `--json`. Write path: `pub` and `sub` go through the client library
//! ([`mortarmq::client::Producer`], [`mortarmq::client::Consumer`]), so they resend and
//! rejoin across broker restarts like any application; `topics create`, `topics delete`
//! and `ping` send their one frame through the frame-level [`mortarmq::client::Client`].
//!
//! Exit status: 0 success, 1 an error from the broker (printed with its registry name and
//! what the client should do) or from the connection, 2 a usage error.

use std::collections::VecDeque;
use std::io::{self, BufRead, IsTerminal, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use getopts::{Matches, Options, ParsingStyle};
use mortarmq::admin::Unit;
use mortarmq::broker::registry::REGISTRY_FILE;
use mortarmq::broker::topics::{valid_name, Registry, RegistryRebuild};
use mortarmq::broker::{DataDirLock, TOPICS_DIR};
use mortarmq::client::{
    Client, ClientError, Consumer, Error as ApiError, Message, Producer, Record, SendHandle,
};
use mortarmq::config::{format_duration, parse_duration};
use mortarmq::log::{meta, FsStorage};
use mortarmq::wire::limits::WIRE_VERSION;
use mortarmq::wire::ops::Connect;
use mortarmq::wire::{DeclareCreated, DeclareFlags, Durability, ErrorCode, Frame, StartPolicy};
use serde_json::Value;

const EXIT_ERROR: u8 = 1;
const EXIT_USAGE: u8 = 2;
const BROKER_DEFAULT: &str = "127.0.0.1:7411";
const ADMIN_DEFAULT: &str = "127.0.0.1:7412";
/// Used when the flag of the same meaning is absent (flags win).
const ENV_BROKER: &str = "MORTAR_BROKER";
const ENV_ADMIN: &str = "MORTAR_ADMIN";
const ENV_TOKEN: &str = "MORTAR_TOKEN";
const ENV_TOKEN_FILE: &str = "MORTAR_TOKEN_FILE";
/// `--timeout` unless given: the client library's own default.
const TIMEOUT_DEFAULT: Duration = mortarmq::client::DEFAULT_TIMEOUT;
/// PUBs sent and not yet answered, at most.
const PUB_WINDOW: usize = 64;
const STDIN_BUFFER_BYTES: usize = 64 * 1024;
/// `stats` also shows byte counts from this size up in KiB, MiB or GiB.
const HUMAN_BYTES_MIN: u64 = 1024;
/// Most records a bounded `sub --count` asks credit for at once (the broker's default).
const SUB_CREDIT_MAX: u64 = 256;
/// How often the `pub` progress line is redrawn, and how long `pub` runs before it shows.
const PROGRESS_EVERY: Duration = Duration::from_millis(250);
const PROGRESS_AFTER: Duration = Duration::from_secs(1);
/// `check --repair` keeps an unreadable registry under this name before replacing it.
const DAMAGED_REGISTRY_FILE: &str = "registry.damaged";

enum Failure {
    /// Exit 2: the command line is wrong. The text says how.
    Usage(String),
    /// Exit 1: the broker or the connection failed.
    Runtime(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        Failure::Runtime(e.to_string())
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Failure::Runtime(e.to_string())
    }
}

type Outcome = Result<(), Failure>;

fn usage_err<T>(text: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Usage(text.into()))
}

fn runtime_err<T>(text: impl Into<String>) -> Result<T, Failure> {
    Err(Failure::Runtime(text.into()))
}

/// Which connection options a subcommand takes.
#[derive(Clone, Copy, PartialEq)]
enum Via {
    Admin,
    Wire,
    /// Reads files only: no broker needed (and none should be writing them).
    Offline,
}

struct Command {
    words: &'static [&'static str],
    /// Positional arguments and flags, for the synopsis.
    synopsis: &'static str,
    about: &'static str,
    via: Via,
    options: fn(&mut Options),
    /// Number of positional arguments after the command words.
    positional: usize,
    run: fn(&Ctx) -> Outcome,
}

fn no_options(_: &mut Options) {}

fn json_option(o: &mut Options) {
    o.optflag("", "json", "print the JSON document instead of a table");
}

const COMMANDS: &[Command] = &[
    Command {
        words: &["stats"],
        synopsis: "[--json]",
        about: "Show the broker's statistics (admin /stats).",
        via: Via::Admin,
        options: json_option,
        positional: 0,
        run: cmd_stats,
    },
    Command {
        words: &["topics", "list"],
        synopsis: "[--json]",
        about: "List topics and their dead-letter twins with sizes (admin /stats).",
        via: Via::Admin,
        options: json_option,
        positional: 0,
        run: cmd_topics_list,
    },
    Command {
        words: &["topics", "create"],
        synopsis: "NAME --partitions N",
        about: "Create topic NAME (and its NAME.dlq twin) with N partitions.",
        via: Via::Wire,
        options: |o| {
            o.reqopt(
                "",
                "partitions",
                "partition count (1 to the broker's max)",
                "N",
            );
        },
        positional: 1,
        run: cmd_topics_create,
    },
    Command {
        words: &["topics", "delete"],
        synopsis: "NAME [--if-unused]",
        about: "Delete topic NAME and its NAME.dlq twin, with every record in them.",
        via: Via::Wire,
        options: |o| {
            o.optflag(
                "",
                "if-unused",
                "refuse (TOPIC_IN_USE) while it has subscribers",
            );
        },
        positional: 1,
        run: cmd_topics_delete,
    },
    Command {
        words: &["groups", "list"],
        synopsis: "[--json]",
        about: "List consumer groups with members, lag and outstanding deliveries.",
        via: Via::Admin,
        options: json_option,
        positional: 0,
        run: cmd_groups_list,
    },
    Command {
        words: &["groups", "describe"],
        synopsis: "GROUP [--topic TOPIC] [--json]",
        about: "Show a group's members and, per partition, owner, position and lag.",
        via: Via::Admin,
        options: |o| {
            json_option(o);
            o.optopt("", "topic", "only the group on this topic", "TOPIC");
        },
        positional: 1,
        run: cmd_groups_describe,
    },
    Command {
        words: &["pub"],
        synopsis: "TOPIC [--value V] [--key K] [--partition P] [--durability written|fsync]",
        about: "Publish --value V, or one record per line of standard input.",
        via: Via::Wire,
        options: |o| {
            o.optopt(
                "",
                "value",
                "publish this one value; stdin is not read",
                "V",
            );
            o.optopt("", "key", "record key (also picks the partition)", "K");
            o.optopt(
                "",
                "partition",
                "partition (default: hash of the key, or 0)",
                "P",
            );
            o.optopt("", "durability", "wait for: written or fsync", "LEVEL");
        },
        positional: 1,
        run: cmd_pub,
    },
    Command {
        words: &["sub"],
        synopsis: "TOPIC --group G [--from earliest|latest] [--count N] [--meta]",
        about: "Consume as a member of group G: print each record's value and ACK it.",
        via: Via::Wire,
        options: |o| {
            o.reqopt("", "group", "consumer group name", "G");
            o.optopt(
                "",
                "from",
                "start without a committed position: earliest|latest",
                "POS",
            );
            o.optopt(
                "",
                "count",
                "exit after N records (default: run until killed)",
                "N",
            );
            o.optflag(
                "",
                "meta",
                "print partition, sequence, attempt, key, value (tabs)",
            );
        },
        positional: 1,
        run: cmd_sub,
    },
    Command {
        words: &["check"],
        synopsis: "DATA_DIR [--repair] [--json]",
        about: "Verify a stopped broker's data offline with start-up recovery as a dry \
                run: every record and index; prints what recovery would change.",
        via: Via::Offline,
        options: |o| {
            o.optflag(
                "",
                "repair",
                "make the changes start-up recovery would (shown by a check without it), \
                 each changed file backed up first",
            );
            json_option(o);
        },
        positional: 1,
        run: cmd_check,
    },
    Command {
        words: &["ping"],
        synopsis: "",
        about: "Connect, authenticate and PING the broker; print the round trip.",
        via: Via::Wire,
        options: no_options,
        positional: 0,
        run: cmd_ping,
    },
];

fn connection_options(o: &mut Options, via: Via) {
    match via {
        Via::Admin => {
            o.optopt(
                "",
                "admin",
                &format!("admin HTTP address, HOST:PORT or http://HOST:PORT/ (${ENV_ADMIN})"),
                "ADDR",
            );
        }
        Via::Wire => {
            o.optopt(
                "",
                "broker",
                &format!("broker address (${ENV_BROKER}, else {BROKER_DEFAULT})"),
                "ADDR",
            );
            o.optopt(
                "",
                "token",
                &format!("CONNECT token (${ENV_TOKEN})"),
                "TOKEN",
            );
            o.optopt(
                "",
                "token-file",
                &format!("read the CONNECT token from PATH (${ENV_TOKEN_FILE})"),
                "PATH",
            );
        }
        Via::Offline => {}
    }
    if via != Via::Offline {
        o.optopt(
            "",
            "timeout",
            "limit on connecting and on each wait for an answer (10s)",
            "DURATION",
        );
    }
    o.optflag("h", "help", "print this help and exit");
}

fn global_options() -> Options {
    let mut o = Options::new();
    connection_options(&mut o, Via::Admin);
    o.optopt("", "broker", "", "ADDR");
    o.optopt("", "token", "", "TOKEN");
    o.optopt("", "token-file", "", "PATH");
    o.optopt("", "timeout", "", "DURATION");
    o.optflag("V", "version", "");
    o.parsing_style(ParsingStyle::StopAtFirstFree);
    o
}

fn main_help() -> String {
    let mut s = String::from(
        "Usage: mortarctl [CONNECTION OPTIONS] COMMAND [ARGS] [OPTIONS]\n\n\
         Operator CLI for the MortarMQ broker (mortard). Commands:\n\n",
    );
    let width = COMMANDS
        .iter()
        .map(|c| c.words.join(" ").len())
        .max()
        .unwrap_or(0);
    for c in COMMANDS {
        s.push_str(&format!("  {:<width$}  {}\n", c.words.join(" "), c.about));
    }
    s.push_str(&format!(
        "\nConnection options (before or after the command; each flag wins over its\n\
         environment variable):\n\
         \x20 --admin ADDR        admin HTTP address, HOST:PORT or http://HOST:PORT/\n\
         \x20                     ($MORTAR_ADMIN; default {ADMIN_DEFAULT} only while the broker\n\
         \x20                     address is the default too); read commands\n\
         \x20 --broker ADDR       broker address ($MORTAR_BROKER, else {BROKER_DEFAULT});\n\
         \x20                     write commands\n\
         \x20 --token TOKEN       CONNECT token ($MORTAR_TOKEN; default empty)\n\
         \x20 --token-file PATH   read the CONNECT token from the first line of PATH\n\
         \x20                     ($MORTAR_TOKEN_FILE)\n\
         \x20 --timeout DURATION  limit on connecting and on each wait for an answer\n\
         \x20                     (default 10s; units ms, s, m, h, d)\n\n\
         `mortarctl COMMAND --help` describes a command. Exit status: 0 success,\n\
         1 error from the broker or the connection, 2 usage error. See mortarctl(1).\n"
    ));
    s
}

fn command_help(c: &Command) -> String {
    let mut o = Options::new();
    (c.options)(&mut o);
    connection_options(&mut o, c.via);
    let brief = format!(
        "Usage: mortarctl {} {}\n\n{}",
        c.words.join(" "),
        c.synopsis,
        c.about
    );
    o.usage(&brief)
}

/// Connection settings, from the options given before and after the command.
struct Ctx {
    /// Resolved for admin commands only (empty otherwise): see [`admin_address`].
    admin: String,
    broker: String,
    token: Vec<u8>,
    timeout: Duration,
    matches: Matches,
}

impl Ctx {
    fn positional(&self, i: usize) -> &str {
        &self.matches.free[i]
    }

    /// The TOPIC argument, checked as the broker checks names, so that a bad one is a
    /// usage error (exit 2) before anything is sent.
    fn topic(&self) -> Result<&str, Failure> {
        let topic = self.positional(0);
        check_name("TOPIC", "topic", topic)?;
        Ok(topic)
    }

    /// The frame-level client, dialled here so that connecting, each write and each
    /// answer (CONNECT's first) are bounded by `--timeout`.
    fn connect(&self) -> Result<Client, Failure> {
        let io_failure = |e| Failure::Runtime(format!("broker {}: {}", self.broker, self.io(&e)));
        let stream = dial(&self.broker, self.timeout).map_err(io_failure)?;
        stream
            .set_read_timeout(Some(self.timeout))
            .and_then(|()| stream.set_write_timeout(Some(self.timeout)))
            .map_err(io_failure)?;
        let mut c = Client::from_stream(stream)?;
        c.request(&Frame::Connect(Connect {
            protocol_version: WIRE_VERSION,
            client_flags: 0,
            token: &self.token,
            reserved: 0,
        }))
        .map_err(|e| self.client_failure(e))?;
        Ok(c)
    }

    fn client_failure(&self, e: ClientError) -> Failure {
        match e {
            ClientError::Io(io) => {
                Failure::Runtime(format!("broker {}: {}", self.broker, self.io(&io)))
            }
            other => other.into(),
        }
    }

    /// An I/O error's text; a timeout's names `--timeout`, since a peer that accepts and
    /// never answers (the admin port given as the broker, say) is the usual cause.
    fn io(&self, e: &io::Error) -> String {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
                "no answer within --timeout {} (is this the right address?)",
                format_duration(self.timeout)
            ),
            _ => e.to_string(),
        }
    }

    /// A producer for `pub`: idempotent, PUB_WINDOW records in flight.
    fn producer(&self, durability: Option<Durability>) -> Result<Producer, Failure> {
        Producer::builder(self.broker.as_str())
            .token(&self.token)
            .durability(durability)
            .max_in_flight(PUB_WINDOW)
            .timeout(self.timeout)
            .connect()
            .map_err(|e| self.connect_failure(e))
    }

    /// A consumer for `sub`, with a window of `credit` records (0: the broker's); `pull`
    /// for a bounded `sub`, which must not be sent records it will not take.
    fn consumer(&self, credit: u16, pull: bool) -> Result<Consumer, Failure> {
        Consumer::builder(self.broker.as_str())
            .token(&self.token)
            .credit(credit, 0)
            .pull(pull)
            .timeout(self.timeout)
            .connect()
            .map_err(|e| self.connect_failure(e))
    }

    fn connect_failure(&self, e: ApiError) -> Failure {
        match e {
            ApiError::Io(io) => {
                Failure::Runtime(format!("broker {}: {}", self.broker, self.io(&io)))
            }
            ApiError::Timeout(what) => Failure::Runtime(format!(
                "broker {}: timeout: {what} (--timeout {})",
                self.broker,
                format_duration(self.timeout)
            )),
            other => other.into(),
        }
    }

    fn get(&self, path: &str) -> Result<String, Failure> {
        http_get(&self.admin, path, self.timeout).map_err(|e| match e {
            HttpError::Io(e) => Failure::Runtime(format!("admin {}: {}", self.admin, self.io(&e))),
            HttpError::Answer(text) => Failure::Runtime(text),
        })
    }

    fn stats(&self) -> Result<Value, Failure> {
        let body = self.get("/stats")?;
        serde_json::from_str(&body)
            .or_else(|e| runtime_err(format!("admin {}/stats: not JSON: {e}", self.admin)))
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(text)) => {
            eprintln!("mortarctl: {text}");
            ExitCode::from(EXIT_USAGE)
        }
        Err(Failure::Runtime(text)) => {
            eprintln!("mortarctl: {text}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}

fn run(args: &[String]) -> Outcome {
    let global = global_options()
        .parse(args)
        .or_else(|e| usage_err(format!("{e}\nTry 'mortarctl --help'.")))?;
    if global.opt_present("help") {
        print!("{}", main_help());
        return Ok(());
    }
    if global.opt_present("version") {
        println!("mortarctl {} (wire v1)", env!("CARGO_PKG_VERSION"));
        return Ok(());
    }
    let rest = &global.free;
    let Some(first) = rest.first() else {
        return usage_err(format!("a command is required\n\n{}", main_help()));
    };
    let command = COMMANDS.iter().find(|c| {
        c.words.len() <= rest.len() && c.words.iter().zip(rest).all(|(w, a)| *w == a.as_str())
    });
    let Some(command) = command else {
        let known: Vec<String> = COMMANDS
            .iter()
            .filter(|c| c.words[0] == first.as_str())
            .map(|c| c.words.join(" "))
            .collect();
        return if known.is_empty() {
            usage_err(format!(
                "unknown command '{first}'\nTry 'mortarctl --help'."
            ))
        } else {
            usage_err(format!(
                "'{first}' needs a subcommand: {}",
                known.join(", ")
            ))
        };
    };
    let mut opts = Options::new();
    (command.options)(&mut opts);
    connection_options(&mut opts, command.via);
    let name = command.words.join(" ");
    // `--help` wins over missing required options.
    if rest[command.words.len()..]
        .iter()
        .take_while(|a| *a != "--")
        .any(|a| a == "--help" || a == "-h")
    {
        print!("{}", command_help(command));
        return Ok(());
    }
    let m = opts
        .parse(&rest[command.words.len()..])
        .or_else(|e| usage_err(format!("{name}: {e}\nTry 'mortarctl {name} --help'.")))?;
    if m.free.len() != command.positional {
        let synopsis = format!("mortarctl {name} {}", command.synopsis);
        return usage_err(match m.free.get(command.positional) {
            Some(extra) => format!("{name}: unexpected argument '{extra}'\nUsage: {synopsis}"),
            None => format!("{name}: missing argument\nUsage: {synopsis}"),
        });
    }
    // Only the options of the command's path are defined on `m` (getopts panics otherwise).
    let pick = |flag: &str| {
        let defined = match command.via {
            Via::Admin => flag == "admin" || flag == "timeout",
            Via::Wire => flag != "admin",
            Via::Offline => false,
        };
        defined
            .then(|| m.opt_str(flag))
            .flatten()
            .or_else(|| global.opt_str(flag))
    };
    let broker = pick("broker").or_else(|| env_var(ENV_BROKER));
    let admin = match command.via {
        Via::Admin => admin_address(&name, pick("admin"), broker.as_deref())?,
        Via::Wire | Via::Offline => String::new(),
    };
    let ctx = Ctx {
        admin,
        broker: broker.unwrap_or_else(|| BROKER_DEFAULT.to_string()),
        token: token(pick("token"), pick("token-file"))?,
        timeout: timeout(pick("timeout"))?,
        matches: m,
    };
    (command.run)(&ctx)
}

/// Topic and group names are 1-255 bytes of `[A-Za-z0-9._-]` (mortarmq(7), DECLARE, SUB).
fn check_name(what: &str, kind: &str, name: &str) -> Outcome {
    if valid_name(name.as_bytes()) {
        return Ok(());
    }
    usage_err(format!(
        "{what}: '{name}' is not a valid {kind} name (1-255 characters of A-Z a-z 0-9 . _ -)"
    ))
}

/// A variable set and not empty (an empty one is taken as unset, as shells make it easy
/// to export one by mistake).
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// `--token`/`--token-file`, else `MORTAR_TOKEN`/`MORTAR_TOKEN_FILE`, else empty. A flag
/// wins over both variables, so a script's environment cannot override the command line.
fn token(flag: Option<String>, file_flag: Option<String>) -> Result<Vec<u8>, Failure> {
    let (token, file, what) = match (flag, file_flag) {
        (None, None) => (
            env_var(ENV_TOKEN),
            env_var(ENV_TOKEN_FILE),
            format!("{ENV_TOKEN} and {ENV_TOKEN_FILE}"),
        ),
        (t, f) => (t, f, "--token and --token-file".to_string()),
    };
    match (token, file) {
        (Some(_), Some(_)) => usage_err(format!("{what} exclude each other")),
        (Some(t), None) => Ok(t.into_bytes()),
        (None, Some(path)) => read_token_file(&path),
        (None, None) => Ok(Vec::new()),
    }
}

/// `--timeout`, a duration with a unit as mortard's flags take (`500ms`, `10s`).
fn timeout(flag: Option<String>) -> Result<Duration, Failure> {
    let Some(text) = flag else {
        return Ok(TIMEOUT_DEFAULT);
    };
    match parse_duration(&text) {
        Ok(d) if d.is_zero() => usage_err("--timeout: 0s would fail every request"),
        Ok(d) => Ok(d),
        Err(why) => usage_err(format!("--timeout: {why}")),
    }
}

/// The admin address: `--admin`, else `MORTAR_ADMIN`, else the local default, but only
/// while the broker address is the default too. Given another broker, the local admin
/// port may well be a different broker's, whose topics would be shown as if they were
/// the named one's; the broker's address says nothing about its admin listener's.
fn admin_address(
    command: &str,
    flag: Option<String>,
    broker: Option<&str>,
) -> Result<String, Failure> {
    let (text, source) = match (flag, env_var(ENV_ADMIN)) {
        (Some(a), _) => (a, "--admin"),
        (None, Some(a)) => (a, ENV_ADMIN),
        (None, None) => {
            return match broker {
                None => Ok(ADMIN_DEFAULT.to_string()),
                Some(b) => usage_err(format!(
                    "{command} needs --admin or {ENV_ADMIN} (the broker's admin listener, \
                     mortard --admin-listen): the broker is {b}, so the local default \
                     {ADMIN_DEFAULT} may be another broker's"
                )),
            };
        }
    };
    admin_host_port(&text).or_else(|why| usage_err(format!("{source}: {why}")))
}

/// `HOST:PORT`, `http://HOST:PORT` or `http://HOST:PORT/` → `HOST:PORT`; anything else
/// is refused rather than connected to, as the listener serves plain HTTP at its root.
fn admin_host_port(text: &str) -> Result<String, String> {
    let addr = match text.split_once("://") {
        None => text,
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => {
            rest.strip_suffix('/').unwrap_or(rest)
        }
        Some((scheme, _)) => {
            return Err(format!(
                "'{text}': the admin listener speaks plain http://, not {scheme}://"
            ))
        }
    };
    if addr.contains('/') {
        return Err(format!(
            "'{text}' has a path; give HOST:PORT or http://HOST:PORT/"
        ));
    }
    let valid = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok());
    if !valid {
        return Err(format!("'{text}' is not HOST:PORT or http://HOST:PORT/"));
    }
    Ok(addr.to_string())
}

/// The token is the first line of the file, without its line ending.
fn read_token_file(path: &str) -> Result<Vec<u8>, Failure> {
    let text = std::fs::read(path).or_else(|e| runtime_err(format!("--token-file {path}: {e}")))?;
    let line = text.split(|b| *b == b'\n').next().unwrap_or_default();
    Ok(line.strip_suffix(b"\r").unwrap_or(line).to_vec())
}

// ---- admin HTTP ----

/// Connects to the first of `addr`'s addresses that answers within `timeout`.
fn dial(addr: &str, timeout: Duration) -> io::Result<TcpStream> {
    let mut last = io::Error::new(io::ErrorKind::InvalidInput, "resolves to no address");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

enum HttpError {
    /// Connecting, writing or reading failed (the caller words timeouts).
    Io(io::Error),
    /// The whole message.
    Answer(String),
}

/// A minimal HTTP/1.1 GET with `Connection: close`; the body of a 200 answer. `timeout`
/// bounds the connect, the write and each read.
fn http_get(admin: &str, path: &str, timeout: Duration) -> Result<String, HttpError> {
    let mut s = dial(admin, timeout).map_err(HttpError::Io)?;
    s.set_read_timeout(Some(timeout))
        .and_then(|()| s.set_write_timeout(Some(timeout)))
        .map_err(HttpError::Io)?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {admin}\r\nAccept: application/json\r\n\
         Connection: close\r\n\r\n"
    )
    .map_err(HttpError::Io)?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(HttpError::Io)?;
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        let text = format!("admin {admin}{path}: truncated HTTP answer");
        return Err(HttpError::Answer(text));
    };
    let status = head.split(' ').nth(1).unwrap_or("?");
    let chunked = head.lines().any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    if status != "200" {
        let text = format!("admin {admin}{path}: HTTP {status}: {}", body.trim());
        return Err(HttpError::Answer(text));
    }
    Ok(body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16);
        match size {
            Ok(n) if n > 0 && rest.len() >= n => {
                out.push_str(&rest[..n]);
                body = rest[n..].strip_prefix("\r\n").unwrap_or(&rest[n..]);
            }
            _ => break,
        }
    }
    out
}

// ---- tables ----

/// Columns aligned; a column whose cells are all numbers is right-aligned.
fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let cols = header.len();
    let mut width: Vec<usize> = header.iter().map(|h| h.len()).collect();
    let mut numeric = vec![!rows.is_empty(); cols];
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            width[i] = width[i].max(cell.chars().count());
            numeric[i] &= cell.parse::<f64>().is_ok() || cell == "-";
        }
    }
    let mut out = String::new();
    let header: Vec<String> = header.iter().map(|h| h.to_string()).collect();
    for row in std::iter::once(&header).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = width[i] - cell.chars().count();
            if numeric[i] {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn u64_of(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or(0)
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or("")
}

fn array_of<'a>(v: &'a Value, key: &str) -> &'a [Value] {
    v[key].as_array().map_or(&[], Vec::as_slice)
}

fn print_json(v: &Value) {
    println!("{v}");
}

/// `1536` → `1.5 KiB`.
fn human_bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut x = n as f64;
    let mut unit = 0;
    while x >= 1024.0 && unit + 1 < units.len() {
        x /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", units[unit])
    }
}

/// One `section.key  value` row per figure of the metrics table that `/stats` shows for
/// the whole broker, in document order; per-label objects give a row per label, and
/// topics and groups are counted (`topics list` and `groups list` show them).
fn stats_rows(stats: &Value) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = Vec::new();
    for metric in mortarmq::admin::in_stats_order() {
        let path = metric.path.unwrap_or_default();
        if let Some((list, _)) = path.split_once("[]") {
            if !rows.iter().any(|r| r[0] == list) {
                rows.push(vec![
                    list.to_string(),
                    array_of(stats, list).len().to_string(),
                ]);
            }
            continue;
        }
        match stats.pointer(&format!("/{}", path.replace('.', "/"))) {
            Some(Value::Object(by_label)) => rows.extend(
                by_label
                    .iter()
                    .map(|(label, v)| vec![format!("{path}.{label}"), stat_cell(metric.unit, v)]),
            ),
            Some(v) => rows.push(vec![path.to_string(), stat_cell(metric.unit, v)]),
            // A broker older than this mortarctl: nothing to show.
            None => {}
        }
    }
    rows
}

/// A value as JSON shows it, byte counts also in KiB/MiB/GiB.
fn stat_cell(unit: Unit, v: &Value) -> String {
    let mut cell = v.as_str().map_or_else(|| v.to_string(), str::to_string);
    if let (Unit::Bytes, Some(n)) = (unit, v.as_u64().filter(|n| *n >= HUMAN_BYTES_MIN)) {
        cell = format!("{cell} ({})", human_bytes(n));
    }
    cell
}

// ---- read path ----

/// `check DATA_DIR`: the registry, then every partition directory under
/// `DATA_DIR/topics/*/`, each through start-up recovery as a dry run (with `--repair`,
/// then for real, after backing up every file it changes).
fn cmd_check(ctx: &Ctx) -> Outcome {
    let data_dir = std::path::PathBuf::from(&ctx.matches.free[0]);
    let repair = ctx.matches.opt_present("repair");
    let json = ctx.matches.opt_present("json");
    let topics = data_dir.join(TOPICS_DIR);
    std::fs::metadata(&topics).or_else(|e| runtime_err(format!("{}: {e}", topics.display())))?;
    // A repair writes, so it needs the directory to itself; a plain check only reads,
    // so a live broker is worth a warning, not a refusal.
    let _lock = if repair {
        Some(DataDirLock::acquire(&data_dir).map_err(Failure::Runtime)?)
    } else {
        if let Some(held) = DataDirLock::holder(&data_dir) {
            eprintln!("mortarctl: warning: {held}; what it is writing may show as torn");
        }
        None
    };
    let mut problems = check_registry(&data_dir, repair, json)?;
    let names = partition_names(&data_dir);
    let mut backups = CheckBackups::new(&data_dir, json);
    let mut rows = Vec::new();
    let mut docs = Vec::new();
    for (dir, name) in &names {
        let backup: Option<mortarmq::log::Backup<'_>> = match repair {
            true => Some(&mut |path| backups.save(path)),
            false => None,
        };
        let report = mortarmq::log::check_partition(&FsStorage, dir, backup)
            .or_else(|e| runtime_err(format!("{name}: {e}")))?;
        problems += report.problems.len();
        print_check_lines(name, &report, (repair, json));
        rows.push(check_row(name, &report));
        docs.push(check_json(name, &report));
    }
    if json {
        print_json(&serde_json::Value::Array(docs));
    } else {
        let header = ["PARTITION", "SEGMENTS", "RECORDS", "SEQUENCES", "RESULT"];
        print!("{}", table(&header, &rows));
    }
    if problems > 0 && !repair {
        return runtime_err(format!(
            "{problems} problems found, nothing changed; --repair makes the changes listed \
             (after backing up each file) and rebuilds a missing or unreadable registry"
        ));
    }
    Ok(())
}

/// Every partition directory under `DATA_DIR/topics/`, sorted, with the name an operator
/// knows it by: `topic NAME partition P (dir ID-CRC/P)`. Names come from the registry,
/// or when it is unreadable from the topic directories as a rebuild would register them.
fn partition_names(data_dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let topics = data_dir.join(TOPICS_DIR);
    let registry = match meta::read_checked(&FsStorage, &data_dir.join(REGISTRY_FILE)) {
        Ok(Some(bytes)) => Registry::decode(&bytes).ok(),
        _ => None,
    }
    .or_else(|| {
        RegistryRebuild::scan(&FsStorage, &topics)
            .ok()
            .map(|r| r.registry)
    });
    let mut known = std::collections::HashMap::new();
    for pair in registry.iter().flat_map(|r| r.pairs()) {
        for (id, name) in pair.topics() {
            known.insert(
                mortarmq::broker::topics::topic_dir(&topics, id, &name),
                name,
            );
        }
    }
    let mut dirs = Vec::new();
    for topic in std::fs::read_dir(&topics).into_iter().flatten().flatten() {
        let Ok(parts) = std::fs::read_dir(topic.path()) else {
            continue;
        };
        for part in parts.flatten().map(|p| p.path()).filter(|p| p.is_dir()) {
            let rel = part
                .strip_prefix(&topics)
                .unwrap_or(&part)
                .display()
                .to_string();
            let index = part
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            let name = match known.get(&topic.path()) {
                Some(t) => format!("topic {t} partition {index} (dir {rel})"),
                None => format!("unregistered dir {rel}"),
            };
            dirs.push((part, name));
        }
    }
    dirs.sort();
    dirs
}

/// Backups taken by `check --repair`: every file is copied, before its first change,
/// to the same path under `DATA_DIR/check-backup-UNIXTIME/`, and each copy is named on
/// a line of its own (standard error under `--json`).
struct CheckBackups {
    data_dir: std::path::PathBuf,
    dir: std::path::PathBuf,
    json: bool,
}

impl CheckBackups {
    fn new(data_dir: &std::path::Path, json: bool) -> CheckBackups {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        CheckBackups {
            data_dir: data_dir.to_path_buf(),
            dir: data_dir.join(format!("check-backup-{now}")),
            json,
        }
    }

    fn save(&mut self, path: &std::path::Path) -> io::Result<()> {
        let rel = path.strip_prefix(&self.data_dir).unwrap_or(path);
        let to = self.dir.join(rel);
        std::fs::create_dir_all(to.parent().unwrap_or(&self.dir))?;
        std::fs::copy(path, &to)?;
        // The copy must be on disk before the original changes.
        std::fs::File::open(&to)?.sync_all()?;
        let line = format!("backed up {} to {}", path.display(), to.display());
        match self.json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        }
        Ok(())
    }
}

/// One line per change and per damaged record: what a repair would do, or did.
fn print_check_lines(name: &str, report: &mortarmq::log::CheckReport, (done, json): (bool, bool)) {
    use mortarmq::log::ChangeKind;
    let (would, keep) = match done {
        true => ("", "kept"),
        false => ("would ", "would keep"),
    };
    let mut lines = Vec::new();
    for d in &report.plan.damaged {
        lines.push(format!(
            "{name}: {keep} damaged record at seq {} ({} byte {}: {}); consumers skip it",
            d.sequence,
            d.path.display(),
            d.position,
            d.reason
        ));
    }
    for c in &report.plan.changes {
        let file = c.path.display();
        lines.push(match (c.what, done) {
            (ChangeKind::Truncate { to, bytes }, false) => {
                format!("{name}: would truncate {bytes} bytes of {file} (at byte {to})")
            }
            (ChangeKind::Truncate { to, bytes }, true) => {
                format!("{name}: truncated {bytes} bytes of {file} (at byte {to})")
            }
            (ChangeKind::Reset { bytes }, _) => {
                format!("{name}: {would}reset {file} (bad header; {bytes} bytes)")
            }
            (ChangeKind::Remove { bytes }, false) => {
                format!("{name}: would remove {file} ({bytes} bytes)")
            }
            (ChangeKind::Remove { bytes }, true) => {
                format!("{name}: removed {file} ({bytes} bytes)")
            }
            (ChangeKind::RewriteIndex, _) => format!("{name}: {would}rewrite index {file}"),
        });
    }
    for line in lines {
        match json {
            true => eprintln!("{line}"),
            false => println!("{line}"),
        }
    }
}

fn check_row(name: &str, r: &mortarmq::log::CheckReport) -> Vec<String> {
    let damaged = r.plan.damaged.len();
    let lost = r.plan.truncated_bytes;
    let verdict = match (&r.repaired, r.plan.changes.is_empty()) {
        (_, true) if damaged == 0 => "ok".to_string(),
        (_, true) => format!("{damaged} damaged records kept"),
        (Some(done), false) => format!(
            "repaired: {} bytes truncated, {damaged} damaged records kept",
            done.truncated_bytes
        ),
        (None, false) => format!(
            "{} changes to make ({lost} bytes to truncate), {damaged} damaged records",
            r.plan.changes.len()
        ),
    };
    vec![
        name.to_string(),
        r.segments.to_string(),
        r.records.to_string(),
        format!("{}..{}", r.first_sequence, r.next_sequence),
        verdict,
    ]
}

fn check_json(name: &str, r: &mortarmq::log::CheckReport) -> serde_json::Value {
    serde_json::json!({
        "partition": name,
        "segments": r.segments,
        "records": r.records,
        "first_sequence": r.first_sequence,
        "next_sequence": r.next_sequence,
        "problems": r.problems.iter().map(|p| serde_json::json!({
            "path": p.path.display().to_string(),
            "position": p.position,
            "reason": p.reason,
        })).collect::<Vec<_>>(),
        "damaged_records": r.plan.damaged.iter().map(|d| serde_json::json!({
            "path": d.path.display().to_string(),
            "position": d.position,
            "sequence": d.sequence,
            "reason": d.reason,
        })).collect::<Vec<_>>(),
        "truncate_bytes": r.plan.truncated_bytes,
        "repaired": r.repaired.as_ref().map(|x| x.truncated_bytes),
    })
}

/// The registry of `data_dir`: readable, or rebuilt from the topic directories (with
/// `--repair`; without it the rebuild is only shown). Returns the problems left. Its
/// lines go to standard error when standard output carries JSON.
fn check_registry(data_dir: &std::path::Path, repair: bool, json: bool) -> Result<usize, Failure> {
    let say = |line: String| match json {
        true => eprintln!("registry: {line}"),
        false => println!("registry: {line}"),
    };
    let path = data_dir.join(REGISTRY_FILE);
    let damage = match meta::read_checked(&FsStorage, &path) {
        Ok(Some(bytes)) => match Registry::decode(&bytes) {
            Ok(_) => return Ok(0),
            Err(e) => Some(e),
        },
        Ok(None) => None,
        // A damaged file's message starts with its path, which the line names anyway.
        Err(e) => Some(e.to_string().replace(&format!("{}: ", path.display()), "")),
    };
    let rebuild = RegistryRebuild::scan(&FsStorage, &data_dir.join(TOPICS_DIR))
        .or_else(|e| runtime_err(format!("cannot rebuild the registry: {e}")))?;
    if damage.is_none() && rebuild.pairs.is_empty() && rebuild.ignored.is_empty() {
        // A data directory no broker has used yet.
        return Ok(0);
    }
    say(match &damage {
        Some(why) => format!("{} is unreadable: {why}", path.display()),
        None => format!("{} is missing", path.display()),
    });
    for p in &rebuild.pairs {
        let t = &p.pair;
        say(format!(
            "{} '{}' (ids {} and {}, {} partitions){}",
            if repair {
                "registered"
            } else {
                "would register"
            },
            t.name,
            t.source_id(),
            t.twin_id(),
            t.partition_count,
            match p.placeholder {
                true => " under a placeholder name: no topic file names it",
                false => "",
            }
        ));
        for note in &p.notes {
            say(format!("  {note}"));
        }
    }
    for entry in &rebuild.ignored {
        say(format!(
            "left out {entry} (mortard deletes what the registry does not name)"
        ));
    }
    if !repair {
        return Ok(1);
    }
    if damage.is_some() {
        let kept = data_dir.join(DAMAGED_REGISTRY_FILE);
        std::fs::copy(&path, &kept)
            .or_else(|e| runtime_err(format!("cannot keep {}: {e}", kept.display())))?;
        say(format!(
            "kept the unreadable registry as {}",
            kept.display()
        ));
    }
    rebuild
        .apply(&FsStorage, &path)
        .or_else(|e| runtime_err(format!("cannot rebuild the registry: {e}")))?;
    say(format!(
        "rebuilt {} with {} topic pairs",
        path.display(),
        rebuild.pairs.len()
    ));
    Ok(0)
}

fn cmd_stats(ctx: &Ctx) -> Outcome {
    if ctx.matches.opt_present("json") {
        let body = ctx.get("/stats")?;
        println!("{}", body.trim_end());
        return Ok(());
    }
    let stats = ctx.stats()?;
    print!("{}", table(&["STAT", "VALUE"], &stats_rows(&stats)));
    Ok(())
}

fn cmd_topics_list(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    if ctx.matches.opt_present("json") {
        print_json(&stats["topics"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = array_of(&stats, "topics")
        .iter()
        .map(|t| {
            let parts = array_of(t, "partitions");
            let records: u64 = parts
                .iter()
                .map(|p| {
                    let (first, last) = (u64_of(p, "first_sequence"), u64_of(p, "last_sequence"));
                    if last >= first.max(1) {
                        last - first.max(1) + 1
                    } else {
                        0
                    }
                })
                .sum();
            let bytes: u64 = parts.iter().map(|p| u64_of(p, "bytes")).sum();
            let segments: u64 = parts.iter().map(|p| u64_of(p, "segments")).sum();
            let dlq = t["dlq_twin"].as_bool().unwrap_or(false);
            vec![
                str_of(t, "name").to_string(),
                u64_of(t, "topic_id").to_string(),
                parts.len().to_string(),
                records.to_string(),
                bytes.to_string(),
                segments.to_string(),
                if dlq { "dlq" } else { "source" }.to_string(),
            ]
        })
        .collect();
    let header = [
        "TOPIC",
        "ID",
        "PARTITIONS",
        "RECORDS",
        "BYTES",
        "SEGMENTS",
        "KIND",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}

fn cmd_groups_list(ctx: &Ctx) -> Outcome {
    let stats = ctx.stats()?;
    if ctx.matches.opt_present("json") {
        print_json(&stats["groups"]);
        return Ok(());
    }
    let rows: Vec<Vec<String>> = array_of(&stats, "groups")
        .iter()
        .map(|g| {
            let parts = array_of(g, "partitions");
            let sum = |key: &str| parts.iter().map(|p| u64_of(p, key)).sum::<u64>();
            vec![
                str_of(g, "group").to_string(),
                str_of(g, "topic").to_string(),
                array_of(g, "members").len().to_string(),
                parts.len().to_string(),
                sum("lag").to_string(),
                sum("outstanding").to_string(),
            ]
        })
        .collect();
    let header = [
        "GROUP",
        "TOPIC",
        "MEMBERS",
        "PARTITIONS",
        "LAG",
        "OUTSTANDING",
    ];
    print!("{}", table(&header, &rows));
    Ok(())
}

fn cmd_groups_describe(ctx: &Ctx) -> Outcome {
    let name = ctx.positional(0);
    let topic = ctx.matches.opt_str("topic");
    let stats = ctx.stats()?;
    let found: Vec<&Value> = array_of(&stats, "groups")
        .iter()
        .filter(|g| str_of(g, "group") == name)
        .filter(|g| topic.as_deref().is_none_or(|t| str_of(g, "topic") == t))
        .collect();
    if found.is_empty() {
        let on = topic.map_or(String::new(), |t| format!(" on topic {t}"));
        return runtime_err(format!("no consumer group {name}{on}"));
    }
    if ctx.matches.opt_present("json") {
        print_json(&Value::Array(found.into_iter().cloned().collect()));
        return Ok(());
    }
    for (i, g) in found.iter().enumerate() {
        if i > 0 {
            println!();
        }
        // Group id 0: read back from disk at start, no member has joined since (the
        // broker gives it an id then).
        let group_id = match u64_of(g, "group_id") {
            0 => "restored at start".to_string(),
            id => format!("group id {id}"),
        };
        println!(
            "group {}  topic {}  ({group_id}, topic id {})\n",
            str_of(g, "group"),
            str_of(g, "topic"),
            u64_of(g, "topic_id")
        );
        let members: Vec<Vec<String>> = array_of(g, "members")
            .iter()
            .map(|m| {
                let mode = if m["pull_mode"].as_bool().unwrap_or(false) {
                    "pull"
                } else {
                    "push"
                };
                vec![
                    u64_of(m, "member_id").to_string(),
                    u64_of(m, "subscription_id").to_string(),
                    u64_of(m, "membership_epoch").to_string(),
                    u64_of(m, "assignment_epoch").to_string(),
                    mode.to_string(),
                    format!(
                        "{}/{}",
                        u64_of(m, "credit_count"),
                        u64_of(m, "credit_bytes")
                    ),
                    u64_of(m, "outstanding_count").to_string(),
                ]
            })
            .collect();
        if members.is_empty() {
            println!("no members\n");
        } else {
            let header = [
                "MEMBER",
                "SUBSCRIPTION",
                "MEMBERSHIP_EPOCH",
                "ASSIGNMENT_EPOCH",
                "MODE",
                "CREDIT",
                "OUTSTANDING",
            ];
            println!("{}", table(&header, &members));
        }
        let parts: Vec<Vec<String>> = array_of(g, "partitions")
            .iter()
            .map(|p| {
                let owner = match u64_of(p, "owner") {
                    0 => "-".to_string(),
                    o => o.to_string(),
                };
                vec![
                    u64_of(p, "partition").to_string(),
                    owner,
                    str_of(p, "state").to_string(),
                    u64_of(p, "ownership_epoch").to_string(),
                    u64_of(p, "committed").to_string(),
                    u64_of(p, "lag").to_string(),
                    u64_of(p, "outstanding").to_string(),
                    u64_of(p, "pending_redeliveries").to_string(),
                ]
            })
            .collect();
        let header = [
            "PARTITION",
            "OWNER",
            "STATE",
            "OWNERSHIP_EPOCH",
            "COMMITTED",
            "LAG",
            "OUTSTANDING",
            "REDELIVERIES",
        ];
        print!("{}", table(&header, &parts));
    }
    Ok(())
}

// ---- write path ----

fn parse_num<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, Failure> {
    text.parse()
        .or_else(|_| usage_err(format!("--{flag}: '{text}' is not a valid number")))
}

fn cmd_topics_create(ctx: &Ctx) -> Outcome {
    let name = ctx.topic()?;
    let partitions = ctx.matches.opt_str("partitions").unwrap_or_default();
    let partitions: u16 = parse_num("partitions", &partitions)?;
    let mut c = ctx.connect()?;
    let r = c.declare(name, partitions, DeclareFlags::empty())?;
    let n = r.partition_count;
    if DeclareCreated::from_code(r.created) == Some(DeclareCreated::Created) {
        let id = r.topic_id;
        println!("created topic {name} (id {id}, {n} partitions; dead letters go to {name}.dlq)");
    } else {
        println!(
            "topic {name} already exists (id {}, {n} partitions)",
            r.topic_id
        );
    }
    Ok(())
}

fn cmd_topics_delete(ctx: &Ctx) -> Outcome {
    let name = ctx.topic()?;
    let mut flags = DeclareFlags::DELETE;
    flags.set(
        DeclareFlags::IF_UNUSED,
        ctx.matches.opt_present("if-unused"),
    );
    let mut c = ctx.connect()?;
    c.declare(name, 0, flags)?;
    println!("deleted topic {name} and {name}.dlq");
    Ok(())
}

fn cmd_ping(ctx: &Ctx) -> Outcome {
    let started = Instant::now();
    let mut c = ctx.connect()?;
    let connected = started.elapsed();
    let t = Instant::now();
    c.ping()?;
    println!(
        "pong from {} in {:?} (connect {:?})",
        ctx.broker,
        t.elapsed(),
        connected
    );
    Ok(())
}

/// Redraws one status line on stderr, only when stderr is a terminal.
struct Progress {
    enabled: bool,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(enabled: bool) -> Progress {
        Progress {
            enabled: enabled && io::stderr().is_terminal(),
            started: Instant::now(),
            drawn: None,
        }
    }

    fn update(&mut self, acked: u64) {
        if !self.enabled || self.started.elapsed() < PROGRESS_AFTER {
            return;
        }
        if self.drawn.is_some_and(|d| d.elapsed() < PROGRESS_EVERY) {
            return;
        }
        let rate = acked as f64 / self.started.elapsed().as_secs_f64();
        eprint!("\r\x1b[Kpublished {acked} records, {rate:.0} records/s");
        self.drawn = Some(Instant::now());
    }

    fn finish(&self) {
        if self.drawn.is_some() {
            eprint!("\r\x1b[K");
        }
    }
}

/// The one way a publishing `mortarctl` stops early: the broker's (or the
/// connection's) error, with how far it got.
fn pub_failed(e: ApiError, acked: u64) -> Failure {
    Failure::Runtime(format!("{e} (after {acked} records were published)"))
}

/// What each `pub` record carries besides its value.
struct PubTarget<'a> {
    topic: &'a str,
    key: &'a [u8],
    partition: Option<u16>,
}

impl<'a> PubTarget<'a> {
    fn record(&self, value: &'a [u8]) -> Record<'a> {
        Record {
            topic: self.topic,
            key: self.key,
            value,
            partition: self.partition,
            durability: None,
        }
    }
}

fn cmd_pub(ctx: &Ctx) -> Outcome {
    let m = &ctx.matches;
    let topic = ctx.topic()?;
    let partition = match m.opt_str("partition") {
        Some(p) => Some(parse_num::<u16>("partition", &p)?),
        None => None,
    };
    let durability = match m.opt_str("durability").as_deref() {
        None => None,
        Some(name) => match Durability::from_flag_name(name) {
            Some(d @ (Durability::Written | Durability::Fsynced)) => Some(d),
            _ => return usage_err(format!("--durability: '{name}' is not written|fsync")),
        },
    };
    let mut producer = ctx.producer(durability)?;
    producer
        .topic(topic)
        .map_err(|e| Failure::Runtime(format!("topic {topic}: {e}")))?;
    let key = m.opt_str("key").unwrap_or_default().into_bytes();
    let target = PubTarget {
        topic,
        key: &key,
        partition,
    };
    if let Some(value) = m.opt_str("value") {
        let r = producer
            .publish_record(target.record(value.as_bytes()))
            .map_err(|e| pub_failed(e, 0))?;
        let reached = match r.durability {
            Durability::Written => "written",
            Durability::Fsynced => "fsynced",
            Durability::Replicated => "replicated",
        };
        println!(
            "published to {topic} partition {} at sequence {} ({reached})",
            r.partition, r.sequence
        );
        return producer.close().map_err(|e| pub_failed(e, 1));
    }
    let mut progress = Progress::new(true);
    let sent = pub_lines(&mut producer, &target, &mut progress);
    progress.finish();
    let acked = sent?;
    println!("published {acked} records to {topic}");
    Ok(())
}

/// Records sent by `pub`, counted as their answers come, in order.
struct Tally {
    handles: VecDeque<SendHandle>,
    acked: u64,
}

impl Tally {
    /// Counts the records answered so far; the first failure ends the run.
    fn settle(&mut self, progress: &mut Progress) -> Result<u64, Failure> {
        while let Some(outcome) = self.handles.front().and_then(SendHandle::result) {
            outcome.map_err(|e| pub_failed(e, self.acked))?;
            self.handles.pop_front();
            self.acked += 1;
        }
        progress.update(self.acked);
        Ok(self.acked)
    }
}

/// Publishes one record per line of standard input (PUB_WINDOW in flight); returns
/// how many the broker stored.
fn pub_lines(
    p: &mut Producer,
    target: &PubTarget<'_>,
    progress: &mut Progress,
) -> Result<u64, Failure> {
    let mut input = io::BufReader::with_capacity(STDIN_BUFFER_BYTES, io::stdin().lock());
    let mut line = Vec::new();
    let mut tally = Tally {
        handles: VecDeque::new(),
        acked: 0,
    };
    loop {
        // Send what is queued before a read that could block on a quiet producer.
        if input.buffer().is_empty() {
            p.send_queued();
        }
        line.clear();
        let n = input
            .read_until(b'\n', &mut line)
            .or_else(|e| runtime_err(format!("standard input: {e}")))?;
        if n == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        let sent = p.send_record(target.record(&line));
        tally
            .handles
            .push_back(sent.map_err(|e| pub_failed(e, tally.acked))?);
        tally.settle(progress)?;
    }
    let flushed = p.flush();
    let acked = tally.settle(progress)?;
    flushed.map_err(|e| pub_failed(e, acked))?;
    Ok(acked)
}

fn print_record(out: &mut impl Write, m: &Message, meta: bool) -> io::Result<()> {
    if meta {
        let key = String::from_utf8_lossy(&m.key);
        write!(
            out,
            "{}\t{}\t{}\t{key}\t",
            m.partition, m.sequence, m.attempt
        )?;
    }
    out.write_all(&m.value)?;
    out.write_all(b"\n")?;
    out.flush()
}

/// A bounded `sub` pulls, and the library pulls (with the window as its size) only once
/// every record delivered so far has been handed out: a window no wider than the records
/// still wanted, set before the next poll, keeps the broker from sending more than
/// `--count` in all. Records sent past it would go back to the group as redeliveries,
/// spending an attempt each. 0 left: nothing more is polled.
fn narrow_credit(consumer: &mut Consumer, window: &mut u16, left: u64) -> Outcome {
    if left > 0 && left < u64::from(*window) {
        *window = consumer.set_credit(left as u16, 0)?.granted_count;
    }
    Ok(())
}

fn cmd_sub(ctx: &Ctx) -> Outcome {
    let m = &ctx.matches;
    let topic = ctx.topic()?;
    let group = m.opt_str("group").unwrap_or_default();
    check_name("--group", "group", &group)?;
    let start_policy = match m.opt_str("from").as_deref() {
        None | Some("earliest") => StartPolicy::Earliest,
        Some("latest") => StartPolicy::Latest,
        Some(other) => return usage_err(format!("--from: '{other}' is not earliest|latest")),
    };
    let count = match m.opt_str("count") {
        Some(n) => Some(parse_num::<u64>("count", &n)?),
        None => None,
    };
    let meta = m.opt_present("meta");
    let credit = count.map_or(0, |n| n.clamp(1, SUB_CREDIT_MAX) as u16);
    let mut consumer = ctx.consumer(credit, count.is_some())?;
    consumer
        .subscribe(&group, topic, start_policy)
        .map_err(|e| match e.code() {
            Some(ErrorCode::UnknownTopic) => Failure::Runtime(format!("topic {topic}: {e}")),
            _ => e.into(),
        })?;
    let stdout = io::stdout();
    let mut out = stdout.lock();
    let mut printed = 0u64;
    let mut window = credit;
    while count.is_none_or(|n| printed < n) {
        let Some(m) = consumer.poll(None)? else {
            break;
        };
        match print_record(&mut out, &m, meta) {
            Ok(()) => {}
            // Left unacknowledged: the broker delivers it again to the group.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(e) => return runtime_err(format!("standard output: {e}")),
        }
        m.ack();
        printed += 1;
        if let Some(n) = count {
            narrow_credit(&mut consumer, &mut window, n - printed)?;
        }
    }
    // Answers awaited, then HEARTBEAT LEAVE: the group rebalances now rather than after
    // --session-timeout. Records read past --count go back to the group unacknowledged.
    Ok(consumer.close()?)
}
