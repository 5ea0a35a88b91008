//! What a person at a terminal should do about a broker error: the one table of
//! mortarctl's hints, keyed by the registry code (`man/mortarmq.7`, ERRORS). The
//! registry's own "client should" column is advice for protocol clients ("DECLARE the
//! topic"); mortarctl already did what it says (resends, backoff, rejoins) before an
//! error reaches the operator, who needs a command or a flag instead.

use std::sync::OnceLock;

use mortarmq::client::{ClientError, Error as ApiError};
use mortarmq::wire::ErrorCode;

/// Stands for the topic in a hint; replaced by the command's TOPIC argument when it
/// has one.
const TOPIC: &str = "{topic}";

/// The command's TOPIC argument, noted when it was checked ([`crate::Ctx::topic`]).
static TOPIC_ARG: OnceLock<String> = OnceLock::new();
/// Where the CONNECT token came from (`--token`, `MORTAR_TOKEN_FILE /path`, …); unset
/// when none was given.
static TOKEN_FROM: OnceLock<String> = OnceLock::new();

pub(crate) fn note_topic(topic: &str) {
    let _ = TOPIC_ARG.set(topic.to_string());
}

pub(crate) fn note_token_source(source: String) {
    let _ = TOKEN_FROM.set(source);
}

/// Where to give the token, for AUTH_FAILED.
const TOKEN_FLAGS: &str = "give the broker's token with --token TOKEN, --token-file PATH, \
                           or the variable MORTAR_TOKEN (or MORTAR_TOKEN_FILE)";

/// A mortarctl that follows the protocol never gets these: a bug, or a broker of
/// another version.
const DISAGREE: &str = "mortarctl's protocol and the broker's differ: make sure both \
                        are the same release (mortarctl --version, mortard \
                        --version), and report it if they are";

/// The hint for each registry code: what the operator can do, in mortarctl's and
/// mortard's own commands and flags.
pub(crate) fn hint(code: ErrorCode) -> &'static str {
    use ErrorCode::*;
    match code {
        InvalidFrameLength | IllegalOp | MalformedPayload | UnexpectedOp | NotConnected
        | AlreadyConnected | SequenceOutOfOrder | InvalidProducer | UnknownSubscription
        | OwnershipFenced | UnknownDelivery | InvalidSubscription | TooManySubscriptions
        | UnknownNotice => DISAGREE,
        UnknownOp | UnsupportedVersion => {
            "the broker is of another release: use the same release of both (compare \
             mortarctl --version with mortard --version)"
        }
        AuthFailed => TOKEN_FLAGS,
        UnknownTopic => {
            "create it: mortarctl topics create {topic} --partitions N \
             (mortarctl topics list shows the topics there are)"
        }
        UnknownPartition => {
            "the topic has fewer partitions (mortarctl topics list): give a --partition \
             below its count"
        }
        InternalError => "the broker failed: its log says why (journalctl -u mortard)",
        NotLeader => {
            "this node does not lead the cluster: give --broker the leader's address named \
             above (pub and sub follow it themselves)"
        }
        ShuttingDown
        | LeaderUnknown
        | StaleLeaderEpoch
        | NotEnoughReplicas
        | NotEnoughReplicasAfterAppend
        | ReplicationTimeout
        | ReplicaNotInSync
        | LogTruncated
        | SnapshotInProgress
        | PeerUnreachable
        | ElectionTimeout => {
            "the broker is not ready to take this now: run the command again once \
             mortarctl ping answers"
        }
        ValueTooLarge => "the value is larger than a record may be: split it",
        KeyTooLarge => "shorten --key (at most 255 bytes)",
        InvalidArgument => "check the command's arguments: mortarctl COMMAND --help",
        StaleEpoch | UnknownMember => {
            "the group was rebalancing: run the command again (mortarctl groups describe \
             GROUP shows the group)"
        }
        InvalidTopicName | InvalidGroupName => "names are 1-255 characters of A-Z a-z 0-9 . _ -",
        TopicConfigConflict => {
            "the topic exists with another partition count (mortarctl topics list); give \
             that count, or delete it first: mortarctl topics delete {topic}"
        }
        TopicRegistryFull => {
            "the broker holds as many topics as it can: delete unused ones with \
             mortarctl topics delete NAME"
        }
        GroupLimitReached => {
            "the broker's mortard --max-groups is reached: raise it, or let unused groups \
             expire (mortard --group-ttl)"
        }
        TopicInUse => {
            "consumers are subscribed (mortarctl groups list): stop them first, or \
             delete without --if-unused"
        }
        MutationNotPackable => {
            "a .dlq topic comes and goes with its source: create or delete the source \
             topic instead"
        }
        Backpressure | MemoryLimit => {
            "the broker is overloaded: run the command again later; mortarctl stats \
             shows its load"
        }
        QuotaExceeded => "a quota is used up: run the command again after the period named",
        StorageFull => {
            "the broker's data reached mortard --max-data-size or its disk is full: \
             delete unused topics (mortarctl topics delete NAME), shorten \
             --retention-size/--retention-age, or raise --max-data-size"
        }
        CreditLimit => "ask for fewer records at once: a smaller sub --count",
        ConnectionLimit => {
            "the broker has mortard --max-connections open: run the command again later, \
             or raise the limit"
        }
        DurabilityUnavailable => "ask for what this broker offers: --durability written|fsync",
    }
}

/// The hint for a refused connection: where the address came from.
pub(crate) fn refused(via: crate::Via) -> &'static str {
    match via {
        crate::Via::Admin => {
            "\nhint: nothing listens there: is mortard running, with this --admin-listen? \
             (the address is --admin, else MORTAR_ADMIN)"
        }
        _ => {
            "\nhint: nothing listens there: is mortard running, with this --listen? (the \
             address is --broker, else MORTAR_BROKER, else 127.0.0.1:7411)"
        }
    }
}

/// `NAME (0x…): message`, and the hint on a line of its own, the topic named.
pub(crate) fn broker_error(code: ErrorCode, message: &str) -> (String, String) {
    let what = if message.is_empty() {
        code.to_string()
    } else {
        format!("{code}: {message}")
    };
    let topic = TOPIC_ARG.get().map_or("TOPIC", String::as_str);
    let mut hint = hint(code).replace(TOPIC, topic);
    if code == ErrorCode::AuthFailed {
        hint = match TOKEN_FROM.get() {
            None => format!("the broker wants a token and none was given: {hint}"),
            Some(from) => format!(
                "the token from {from} is not one of the broker's (mortard --token-file): \
                 {hint}"
            ),
        };
    }
    (what, format!("\nhint: {hint}"))
}

/// An error of the client library: a broker error with its hint, else its own text.
pub(crate) fn api_error(e: &ApiError) -> (String, String) {
    match e {
        ApiError::Broker { code, message, .. } => broker_error(*code, message),
        other => (other.to_string(), String::new()),
    }
}

/// An error of the frame-level client, as [`api_error`].
pub(crate) fn client_error(e: &ClientError) -> (String, String) {
    match (e, e.code()) {
        (ClientError::Broker { message, .. }, Some(code)) => broker_error(code, message),
        _ => (e.to_string(), String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Words of the protocol an operator does not type: hints name commands instead.
    const PROTOCOL_WORDS: &[&str] = &[
        "DECLARE",
        "CONNECT",
        "PUB ",
        "SUB ",
        "ACK",
        "PULL",
        "HEARTBEAT",
        "NOTICE",
        "producer_seq",
        "client",
    ];

    fn every_code() -> impl Iterator<Item = ErrorCode> {
        (0..=u16::MAX).filter_map(ErrorCode::from_code)
    }

    #[test]
    fn every_code_has_an_operators_hint() {
        assert_eq!(every_code().count(), 51);
        for code in every_code() {
            let hint = hint(code);
            assert!(!hint.is_empty(), "{code}");
            for word in PROTOCOL_WORDS {
                assert!(!hint.contains(word), "{code}: {hint}");
            }
        }
    }

    /// Each `mortarctl WORDS` a hint names is a command of [`crate::COMMANDS`] (or
    /// `--version`, or COMMAND as a placeholder).
    #[test]
    fn hints_name_real_commands() {
        for code in every_code() {
            let hint = hint(code);
            for (at, _) in hint.match_indices("mortarctl ") {
                let rest: Vec<&str> = hint[at + 10..]
                    .split_whitespace()
                    .map(|w| w.trim_end_matches([',', ')', ';', ':']))
                    .collect();
                let known = rest[0] == "--version"
                    || rest[0] == "COMMAND"
                    || crate::COMMANDS
                        .iter()
                        .any(|c| c.words.iter().zip(&rest).all(|(w, r)| r == w));
                assert!(known, "{code}: {hint}");
            }
        }
    }

    #[test]
    fn the_topic_is_named_and_auth_says_where_the_token_goes() {
        note_topic("logs");
        let (what, hint) = broker_error(ErrorCode::UnknownTopic, "no topic 'logs'");
        assert_eq!(what, "UNKNOWN_TOPIC (0x0008): no topic 'logs'");
        assert_eq!(
            hint,
            "\nhint: create it: mortarctl topics create logs --partitions N (mortarctl \
             topics list shows the topics there are)"
        );
        let (_, hint) = broker_error(ErrorCode::AuthFailed, "");
        assert!(
            hint.starts_with("\nhint: the broker wants a token and none was given"),
            "{hint}"
        );
        for flag in ["--token ", "--token-file ", "MORTAR_TOKEN "] {
            assert!(hint.contains(flag), "{hint}");
        }
    }
}
