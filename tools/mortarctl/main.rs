//! `mortarctl`: the MortarMQ operator CLI (see `man/mortarctl.1`).
//!
//! Read path: `stats`, `topics list`, `groups list`, `groups describe` fetch the broker's
//! admin `/stats` JSON over a hand-rolled HTTP/1.1 GET and print aligned tables, or the
//! JSON itself with `--json`. Write path: `pub` and `sub` go through the client library
//! ([`mortarmq::client::Producer`], [`mortarmq::client::Consumer`]), so they resend and
//! rejoin across broker restarts like any application; `topics create`, `topics delete`
//! and `ping` send their one frame through the frame-level [`mortarmq::client::Client`].
//! Admin changes (`topics purge`, `groups delete|reset`) and `topics describe` use the
//! admin listener's `/topics` and `/groups` routes (`manage.rs`), the token as Bearer.
//!
//! Exit status: 0 success, 1 an error from the broker (printed with its registry name and
//! a hint for the operator, `hints.rs`) or from the connection, 2 a usage error.

use std::io;
use std::process::ExitCode;
use std::time::Duration;

use getopts::{Matches, Options, ParsingStyle};
use mortarmq::broker::topics::valid_name;
use mortarmq::client::{
    resolve_brokers, Client, ClientError, Consumer, Error as ApiError, Producer,
};
use mortarmq::config::{format_duration, parse_duration};
use mortarmq::wire::limits::WIRE_VERSION;
use mortarmq::wire::ops::Connect;
use mortarmq::wire::{Durability, Frame};
use serde_json::Value;

mod check;
mod cluster;
mod hints;
mod http;
mod inspect;
mod manage;
mod records;
mod wire_cmds;

use check::cmd_check;
use cluster::cmd_cluster_status;
use http::{dial, http_get, HttpError};
use inspect::{cmd_groups_describe, cmd_groups_list, cmd_stats, cmd_topics_list};
use manage::{cmd_groups_delete, cmd_groups_reset, cmd_topics_describe, cmd_topics_purge};
use wire_cmds::{cmd_ping, cmd_pub, cmd_sub, cmd_topics_create, cmd_topics_delete};

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

enum Failure {
    /// Exit 2: the command line is wrong. The text says how.
    Usage(String),
    /// Exit 1: the broker or the connection failed.
    Runtime(String),
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Self {
        let (what, hint) = hints::client_error(&e);
        Failure::Runtime(what + &hint)
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        let (what, hint) = hints::api_error(&e);
        Failure::Runtime(what + &hint)
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
    /// Reads over admin HTTP, writes through the broker (`dlq replay`).
    AdminAndWire,
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
        words: &["cluster", "status"],
        synopsis: "[--json]",
        about: "Show every cluster node's role, term, leader, commit and applied index and \
                links, each as that node sees it (admin /stats); fails when no node knows \
                a leader.",
        via: Via::Admin,
        options: json_option,
        positional: 0,
        run: cmd_cluster_status,
    },
    Command {
        words: &["cluster", "id"],
        synopsis: "",
        about: "Print a new random cluster id for every node's --cluster-id (16 hex \
                digits, from the system's random source).",
        via: Via::Offline,
        options: no_options,
        positional: 0,
        run: cluster::cmd_cluster_id,
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
    // Admin writes (manage.rs): they send the token as `Authorization: Bearer`.
    Command {
        words: &["topics", "describe"],
        synopsis: "TOPIC [--json]",
        about: "Show a topic's partitions, retention and groups with their lag.",
        via: Via::Admin,
        options: json_option,
        positional: 1,
        run: cmd_topics_describe,
    },
    Command {
        words: &["topics", "purge"],
        synopsis: "TOPIC",
        about: "Drop every record of TOPIC (or of TOPIC.dlq); sequences go on.",
        via: Via::Admin,
        options: no_options,
        positional: 1,
        run: cmd_topics_purge,
    },
    Command {
        words: &["groups", "delete"],
        synopsis: "GROUP --topic TOPIC",
        about: "Delete a group without members, and its positions.",
        via: Via::Admin,
        options: manage::group_options,
        positional: 1,
        run: cmd_groups_delete,
    },
    Command {
        words: &["groups", "reset"],
        synopsis: "GROUP --topic TOPIC --to WHERE [--partition P] [--json]",
        about: "Move a group's positions: earliest, latest, sequence:N or time:T.",
        via: Via::Admin,
        options: manage::reset_options,
        positional: 1,
        run: cmd_groups_reset,
    },
    Command {
        words: &["pub"],
        synopsis: "TOPIC [--value V] [--key K] [--partition P] [--durability written|fsync] \
                   [--keepalive DURATION]",
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
            o.optopt(
                "",
                "keepalive",
                "PING after this long without a record (30s; under the broker's \
                 --idle-timeout)",
                "DURATION",
            );
        },
        positional: 1,
        run: cmd_pub,
    },
    Command {
        words: &["sub"],
        synopsis: "TOPIC --group G [--from earliest|latest] [--count N] [--meta] \
                   [--reconnect-timeout DURATION]",
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
            o.optopt(
                "",
                "reconnect-timeout",
                "give up when the broker stays away this long \
                 (default: never; with --count, 30s)",
                "DURATION",
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
        words: &["peek"],
        synopsis: "TOPIC [--partition P] [--from SEQ|--from-time TIME] [--max N] [--meta|--json]",
        about: "Print records of TOPIC (or TOPIC.dlq) without consuming: no group, no ACK.",
        via: Via::Admin,
        options: records::peek_options,
        positional: 1,
        run: records::cmd_peek,
    },
    Command {
        words: &["tail"],
        synopsis: "TOPIC [-f] [-n N] [--partition P] [--poll DURATION] [--meta|--json]",
        about: "Print the last records of TOPIC; with -f, go on as they arrive (no group).",
        via: Via::Admin,
        options: records::tail_options,
        positional: 1,
        run: records::cmd_tail,
    },
    Command {
        words: &["dlq", "list"],
        synopsis: "TOPIC [--partition P] [--from SEQ|--from-time TIME] [--max N] [--json]",
        about: "List the dead letters in TOPIC.dlq with their origins (read-only).",
        via: Via::Admin,
        options: records::dlq_list_options,
        positional: 1,
        run: records::cmd_dlq_list,
    },
    Command {
        words: &["dlq", "replay"],
        synopsis: "TOPIC [--partition P] [--from SEQ|--from-time TIME] [--max N] \
                   [--durability written|fsync]",
        about: "Publish TOPIC.dlq's dead letters again where they came from (not removed).",
        via: Via::AdminAndWire,
        options: records::dlq_replay_options,
        positional: 1,
        run: records::cmd_dlq_replay,
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
    if matches!(via, Via::Admin | Via::AdminAndWire) {
        o.optopt(
            "",
            "admin",
            &format!("admin HTTP address, HOST:PORT or http://HOST:PORT/ (${ENV_ADMIN})"),
            "ADDR",
        );
    }
    match via {
        Via::Offline => {}
        Via::Admin => token_options(o, "the broker's token, for changes"),
        Via::Wire | Via::AdminAndWire => {
            o.optopt(
                "",
                "broker",
                &format!(
                    "broker address, or a cluster's nodes comma-separated \
                     (${ENV_BROKER}, else {BROKER_DEFAULT})"
                ),
                "ADDR[,ADDR...]",
            );
            token_options(o, "CONNECT token");
        }
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

fn token_options(o: &mut Options, what: &str) {
    o.optopt("", "token", &format!("{what} (${ENV_TOKEN})"), "TOKEN");
    let from_file = format!("read the token from PATH's first line (${ENV_TOKEN_FILE})");
    o.optopt("", "token-file", &from_file, "PATH");
}

fn global_options() -> Options {
    let mut o = Options::new();
    connection_options(&mut o, Via::Admin);
    o.optopt("", "broker", "", "ADDR");
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
         \x20                     write commands; a cluster's nodes comma-separated\n\
         \x20                     (pub and sub follow the leader)\n\
         \x20 --token TOKEN       CONNECT token, and the admin token of changes\n\
         \x20                     ($MORTAR_TOKEN; default empty)\n\
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
        hints::note_topic(topic);
        Ok(topic)
    }

    /// The TOPIC argument of a command that also takes a dead-letter twin's name
    /// (`NAME.dlq`), checked as [`Ctx::topic`] checks it.
    fn topic_or_twin(&self) -> Result<&str, Failure> {
        let topic = self.positional(0);
        check_topic_or_twin("TOPIC", topic)?;
        hints::note_topic(topic);
        Ok(topic)
    }

    /// The frame-level client, dialled here so that connecting, each write and each
    /// answer (CONNECT's first) are bounded by `--timeout`.
    fn connect(&self) -> Result<Client, Failure> {
        let io_failure = |e| {
            Failure::Runtime(format!(
                "broker {}: {}",
                self.broker,
                self.io(&e, Via::Wire)
            ))
        };
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
            ClientError::Io(io) => Failure::Runtime(format!(
                "broker {}: {}",
                self.broker,
                self.io(&io, Via::Wire)
            )),
            other => other.into(),
        }
    }

    /// An I/O error's text; a timeout's names `--timeout`, since a peer that accepts and
    /// never answers (the admin port given as the broker, say) is the usual cause.
    fn io(&self, e: &io::Error, via: Via) -> String {
        match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => format!(
                "no answer within --timeout {} (is this the right address?)",
                format_duration(self.timeout)
            ),
            io::ErrorKind::ConnectionRefused => format!("{e}{}", hints::refused(via)),
            _ => e.to_string(),
        }
    }

    /// A producer for `pub`: idempotent, PUB_WINDOW records in flight.
    fn producer(
        &self,
        durability: Option<Durability>,
        keepalive: Duration,
    ) -> Result<Producer, Failure> {
        Producer::builder(&self.brokers()?[..])
            .token(&self.token)
            .durability(durability)
            .max_in_flight(PUB_WINDOW)
            .keepalive(keepalive)
            .timeout(self.timeout)
            .connect()
            .map_err(|e| self.connect_failure(e))
    }

    /// A consumer for `sub`, with a window of `credit` records (0: the broker's); `pull`
    /// for a bounded `sub`, which must not be sent records it will not take.
    fn consumer(
        &self,
        credit: u16,
        pull: bool,
        reconnect_timeout: Option<Duration>,
    ) -> Result<Consumer, Failure> {
        Consumer::builder(&self.brokers()?[..])
            .token(&self.token)
            .credit(credit, 0)
            .pull(pull)
            .reconnect_timeout(reconnect_timeout)
            .timeout(self.timeout)
            .connect()
            .map_err(|e| self.connect_failure(e))
    }

    /// `--broker`'s addresses: a cluster's nodes may be listed, comma-separated; the
    /// client follows NOT_LEADER from any of them and tries the others when one fails.
    fn brokers(&self) -> Result<Vec<std::net::SocketAddr>, Failure> {
        resolve_brokers(&self.broker).map_err(|e| self.connect_failure(e))
    }

    fn connect_failure(&self, e: ApiError) -> Failure {
        match e {
            ApiError::Io(io) => Failure::Runtime(format!(
                "broker {}: {}",
                self.broker,
                self.io(&io, Via::Wire)
            )),
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
            HttpError::Io(e) => {
                Failure::Runtime(format!("admin {}: {}", self.admin, self.io(&e, Via::Admin)))
            }
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
            Via::Admin => flag != "broker",
            Via::Wire => flag != "admin",
            Via::AdminAndWire => true,
            Via::Offline => false,
        };
        defined
            .then(|| m.opt_str(flag))
            .flatten()
            .or_else(|| global.opt_str(flag))
    };
    let broker = pick("broker").or_else(|| env_var(ENV_BROKER));
    let admin = match command.via {
        Via::Admin | Via::AdminAndWire => admin_address(&name, pick("admin"), broker.as_deref())?,
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

/// A topic's name or its twin's (`NAME.dlq`: the source name is what must be valid).
fn check_topic_or_twin(what: &str, name: &str) -> Outcome {
    let source = name
        .strip_suffix(mortarmq::wire::DLQ_SUFFIX)
        .unwrap_or(name);
    check_name(what, "topic", source)
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
    let (env, flags) = (what.starts_with("MORTAR"), ["--token", "--token-file"]);
    let [from_token, from_file] = if env {
        [ENV_TOKEN, ENV_TOKEN_FILE]
    } else {
        flags
    };
    match (token, file) {
        (Some(_), Some(_)) => usage_err(format!("{what} exclude each other")),
        (Some(t), None) => {
            hints::note_token_source(from_token.to_string());
            Ok(t.into_bytes())
        }
        (None, Some(path)) => {
            hints::note_token_source(format!("{from_file} {path}"));
            read_token_file(&path)
        }
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
