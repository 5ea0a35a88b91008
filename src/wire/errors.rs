//! The v0 error-code registry (`man/mortarmq.7`, ERRORS): 51 codes in four segments.
//!
//! One table, written once in [`registry!`], gives every code its number, its name,
//! what the broker does with the connection after sending it, and what the client
//! should do. Codes are never changed nor reused: 0x000A and 0x000B stay unassigned.

/// What the broker does with the connection after sending the ERR frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// Send the ERR (best effort), then close; nothing after the offending frame runs.
    Close,
    /// The connection stays usable.
    Keep,
}

/// Whether the same request may succeed if the client sends it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// The same request will fail again.
    No,
    /// The same request may succeed later.
    Backoff,
    /// The outcome is unknown: resend with the same producer_id/producer_seq.
    Idempotent,
}

macro_rules! registry {
    ($(
        $variant:ident = $code:literal, $name:literal, $after:ident, $retry:ident,
        $should:literal;
    )*) => {
        /// One registered error code. `as u16` gives the wire value.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum ErrorCode {
            $( $variant = $code, )*
        }

        impl ErrorCode {
            /// Every registered code, in code order.
            pub const ALL: &'static [ErrorCode] = &[ $( ErrorCode::$variant, )* ];

            pub fn from_code(code: u16) -> Option<ErrorCode> {
                match code {
                    $( $code => Some(ErrorCode::$variant), )*
                    _ => None,
                }
            }

            /// The registry name, e.g. `INVALID_FRAME_LENGTH`.
            pub fn name(self) -> &'static str {
                match self { $( ErrorCode::$variant => $name, )* }
            }

            pub fn after(self) -> After {
                match self { $( ErrorCode::$variant => After::$after, )* }
            }

            pub fn retry(self) -> Retry {
                match self { $( ErrorCode::$variant => Retry::$retry, )* }
            }

            /// The registry's "client should" advice, for CLIs and logs.
            pub fn client_should(self) -> &'static str {
                match self { $( ErrorCode::$variant => $should, )* }
            }
        }
    };
}

registry! {
    // 0x0xxx — protocol / session (26)
    InvalidFrameLength = 0x0001, "INVALID_FRAME_LENGTH", Close, No,
        "fix the encoder; never resynchronise";
    IllegalOp = 0x0002, "ILLEGAL_OP", Close, No, "fix the encoder";
    UnknownOp = 0x0003, "UNKNOWN_OP", Keep, No,
        "the broker is older than the client: do not use that op";
    UnsupportedVersion = 0x0004, "UNSUPPORTED_VERSION", Close, No, "reconnect with version 1";
    NotConnected = 0x0005, "NOT_CONNECTED", Close, No, "send CONNECT first";
    AuthFailed = 0x0006, "AUTH_FAILED", Close, No, "fix the credentials; do not loop";
    AlreadyConnected = 0x0007, "ALREADY_CONNECTED", Keep, No, "ignore; the first CONNECT stands";
    UnknownTopic = 0x0008, "UNKNOWN_TOPIC", Keep, No, "DECLARE the topic, or refresh the id";
    UnknownPartition = 0x0009, "UNKNOWN_PARTITION", Keep, No,
        "refresh partition_count with DECLARE(PASSIVE)";
    MalformedPayload = 0x000C, "MALFORMED_PAYLOAD", Keep, No, "fix the encoder";
    UnexpectedOp = 0x000D, "UNEXPECTED_OP", Close, No, "fix the client";
    InternalError = 0x000E, "INTERNAL_ERROR", Keep, Idempotent, "report; retry PUB idempotently";
    ShuttingDown = 0x000F, "SHUTTING_DOWN", Close, Backoff,
        "reconnect later (or to another broker)";
    ValueTooLarge = 0x0010, "VALUE_TOO_LARGE", Keep, No, "split the value";
    KeyTooLarge = 0x0011, "KEY_TOO_LARGE", Keep, No, "shorten the key";
    SequenceOutOfOrder = 0x0012, "SEQUENCE_OUT_OF_ORDER", Keep, No,
        "resend from the expected seq, or start a new producer_id";
    InvalidProducer = 0x0013, "INVALID_PRODUCER", Keep, No, "fix the producer fields";
    InvalidArgument = 0x0014, "INVALID_ARGUMENT", Keep, No, "fix the request";
    UnknownSubscription = 0x0020, "UNKNOWN_SUBSCRIPTION", Keep, No, "SUB again";
    StaleEpoch = 0x0021, "STALE_EPOCH", Keep, Backoff,
        "process pending NOTICEs, then retry with the new epochs";
    OwnershipFenced = 0x0022, "OWNERSHIP_FENCED", Keep, No,
        "drop the message: the new owner gets it";
    UnknownDelivery = 0x0023, "UNKNOWN_DELIVERY", Keep, No,
        "drop it; it was or will be redelivered";
    InvalidSubscription = 0x0024, "INVALID_SUBSCRIPTION", Keep, No, "fix the request";
    TooManySubscriptions = 0x0025, "TOO_MANY_SUBSCRIPTIONS", Keep, No, "use another connection";
    UnknownMember = 0x0026, "UNKNOWN_MEMBER", Keep, No, "SUB again to rejoin";
    UnknownNotice = 0x0027, "UNKNOWN_NOTICE", Keep, No, "ignore";
    // 0x2xxx — metadata (7)
    InvalidTopicName = 0x2001, "INVALID_TOPIC_NAME", Keep, No, "fix the name";
    InvalidGroupName = 0x2002, "INVALID_GROUP_NAME", Keep, No, "fix the name";
    TopicConfigConflict = 0x2003, "TOPIC_CONFIG_CONFLICT", Keep, No, "DECLARE(PASSIVE) to read it";
    TopicRegistryFull = 0x2004, "TOPIC_REGISTRY_FULL", Keep, No, "delete topics";
    GroupLimitReached = 0x2005, "GROUP_LIMIT_REACHED", Keep, Backoff, "alert the operator";
    TopicInUse = 0x2006, "TOPIC_IN_USE", Keep, Backoff,
        "stop consumers first, or delete without IF_UNUSED";
    MutationNotPackable = 0x2007, "MUTATION_NOT_PACKABLE", Keep, No, "address the source topic";
    // 0x4xxx — backpressure / quota (6)
    Backpressure = 0x4001, "BACKPRESSURE", Keep, Backoff,
        "back off (e.g. 10 ms doubling to 1 s), resend";
    QuotaExceeded = 0x4002, "QUOTA_EXCEEDED", Keep, Backoff,
        "back off for the period in the message";
    StorageFull = 0x4003, "STORAGE_FULL", Keep, Backoff, "alert the operator; back off";
    MemoryLimit = 0x4004, "MEMORY_LIMIT", Keep, Backoff, "back off";
    CreditLimit = 0x4005, "CREDIT_LIMIT", Keep, No, "ask for less";
    ConnectionLimit = 0x4006, "CONNECTION_LIMIT", Close, Backoff, "back off and reconnect";
    // 0x6xxx — replication (12)
    NotLeader = 0x6001, "NOT_LEADER", Keep, Backoff, "reconnect to the leader";
    LeaderUnknown = 0x6002, "LEADER_UNKNOWN", Keep, Backoff, "back off, retry";
    StaleLeaderEpoch = 0x6003, "STALE_LEADER_EPOCH", Keep, Backoff, "refresh metadata, retry";
    NotEnoughReplicas = 0x6004, "NOT_ENOUGH_REPLICAS", Keep, Backoff, "back off, retry";
    NotEnoughReplicasAfterAppend = 0x6005, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", Keep, Idempotent,
        "resend with the same producer_seq";
    ReplicationTimeout = 0x6006, "REPLICATION_TIMEOUT", Keep, Idempotent,
        "resend with the same producer_seq";
    ReplicaNotInSync = 0x6007, "REPLICA_NOT_IN_SYNC", Keep, Backoff, "use the leader";
    LogTruncated = 0x6008, "LOG_TRUNCATED", Keep, Idempotent,
        "resend unacknowledged PUBs idempotently";
    SnapshotInProgress = 0x6009, "SNAPSHOT_IN_PROGRESS", Keep, Backoff, "back off";
    PeerUnreachable = 0x600A, "PEER_UNREACHABLE", Keep, Backoff, "back off";
    DurabilityUnavailable = 0x600B, "DURABILITY_UNAVAILABLE", Keep, No,
        "ask for a level the broker offers";
    ElectionTimeout = 0x600C, "ELECTION_TIMEOUT", Keep, Backoff, "back off";
}

impl ErrorCode {
    pub fn code(self) -> u16 {
        self as u16
    }

    pub fn closes_connection(self) -> bool {
        self.after() == After::Close
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (0x{:04X})", self.name(), self.code())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_in_segment(segment: u16) -> usize {
        ErrorCode::ALL
            .iter()
            .filter(|c| c.code() & 0xF000 == segment)
            .count()
    }

    #[test]
    fn registry_counts_fifty_one_in_four_segments() {
        assert_eq!(count_in_segment(0x0000), 26);
        assert_eq!(count_in_segment(0x2000), 7);
        assert_eq!(count_in_segment(0x4000), 6);
        assert_eq!(count_in_segment(0x6000), 12);
        assert_eq!(ErrorCode::ALL.len(), 26 + 7 + 6 + 12);
        assert_eq!(ErrorCode::ALL.len(), 51);
    }

    #[test]
    fn retired_and_zero_codes_are_unassigned() {
        assert_eq!(ErrorCode::from_code(0x000A), None);
        assert_eq!(ErrorCode::from_code(0x000B), None);
        assert_eq!(ErrorCode::from_code(0x0000), None);
    }

    #[test]
    fn codes_and_names_are_unique_and_round_trip() {
        let mut names = std::collections::HashSet::new();
        let mut last = 0u16;
        for &c in ErrorCode::ALL {
            assert!(c.code() > last, "ALL must be in code order");
            last = c.code();
            assert_eq!(ErrorCode::from_code(c.code()), Some(c));
            assert!(names.insert(c.name()), "duplicate name {}", c.name());
            assert!(!c.client_should().is_empty());
        }
    }

    #[test]
    fn close_codes_are_exactly_the_registry_close_rows() {
        let close: Vec<u16> = ErrorCode::ALL
            .iter()
            .filter(|c| c.closes_connection())
            .map(|c| c.code())
            .collect();
        assert_eq!(
            close,
            vec![0x0001, 0x0002, 0x0004, 0x0005, 0x0006, 0x000D, 0x000F, 0x4006]
        );
    }
}
