//! The protocol's vocabulary: every flag set, kind, reason, mode and durability level of
//! wire v0, each defined once and typed (`man/mortarmq.7` lists the same values), and how
//! a topic's dead-letter twin is named and numbered.
//!
//! Flag sets are `bitflags` types and appear typed in the decoded messages: reserved bits
//! are kept as received (receivers ignore them, the codec re-encodes them unchanged).
//! One-byte enums stay raw `u8` fields in the messages, because a reserved value must
//! still decode (it is answered with INVALID_ARGUMENT or INVALID_SUBSCRIPTION, not
//! MALFORMED_PAYLOAD); [`from_code`](NackReason::from_code) turns them into these types
//! and returns `None` for a reserved value.

/// A one-byte protocol enum with its wire values and spec names. `from_code` is the only
/// way in from the wire, `as_code` the only way out.
macro_rules! code_enum {
    ($(#[$meta:meta])* pub enum $name:ident {
        $( $(#[$vmeta:meta])* $variant:ident = $code:literal, $spec:literal; )*
    }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        #[repr(u8)]
        pub enum $name {
            $( $(#[$vmeta])* $variant = $code, )*
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL: &'static [$name] = &[ $( $name::$variant, )* ];

            /// The value for a wire code; `None` for a reserved code.
            pub fn from_code(code: u8) -> Option<$name> {
                match code {
                    $( $code => Some($name::$variant), )*
                    _ => None,
                }
            }

            pub fn as_code(self) -> u8 {
                self as u8
            }

            /// The spec's name, e.g. `REJECT`.
            pub fn name(self) -> &'static str {
                match self { $( $name::$variant => $spec, )* }
            }
        }
    };
}

code_enum! {
    /// How far a record has been taken: what a PUB asks for (flags bits 0–1, where 0 asks
    /// for the broker's `--durability`) and what its OK reports as reached.
    pub enum Durability {
        /// In the segment file (page cache); a power cut may lose it.
        Written = 1, "WRITTEN";
        /// Covered by a completed fdatasync.
        Fsynced = 2, "FSYNCED";
        /// On a majority of a cluster's nodes (single node: DURABILITY_UNAVAILABLE).
        Replicated = 3, "REPLICATED";
    }
}

impl Durability {
    /// The spelling of `mortard --durability` and `mortarctl pub --durability`.
    pub fn flag_name(self) -> &'static str {
        match self {
            Durability::Written => "written",
            Durability::Fsynced => "fsync",
            Durability::Replicated => "replicated",
        }
    }

    pub fn from_flag_name(name: &str) -> Option<Durability> {
        Durability::ALL
            .iter()
            .copied()
            .find(|d| d.flag_name() == name)
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.flag_name())
    }
}

code_enum! {
    /// DECLARE result `created`.
    pub enum DeclareCreated {
        Created = 0, "CREATED";
        /// Exists with the same partition count, or a PASSIVE hit.
        IdempotentOk = 1, "IDEMPOTENT_OK";
        Deleted = 2, "DELETED";
    }
}

code_enum! {
    /// SUB `start_policy`: where a group starts on a partition it has no position for.
    pub enum StartPolicy {
        Earliest = 0, "EARLIEST";
        Latest = 1, "LATEST";
    }
}

code_enum! {
    /// NACK `reason`. 2 is reserved and 3 (SLOW) is reserved and not implemented.
    pub enum NackReason {
        /// Redeliver after `--nack-delay`, attempt + 1.
        Retry = 0, "RETRY";
        /// Dead-letter now.
        Reject = 1, "REJECT";
    }
}

code_enum! {
    /// NOTICE `kind` (and CONTROL_ACK `notice_kind`).
    pub enum NoticeKind {
        Assign = 0, "ASSIGN";
        Revoke = 1, "REVOKE";
    }
}

code_enum! {
    /// CONTROL_ACK `result`; STALE and ERROR both mean "refused".
    pub enum ControlResult {
        Ok = 0, "OK";
        Stale = 1, "STALE";
        Error = 2, "ERROR";
    }
}

code_enum! {
    /// HEARTBEAT `state`.
    pub enum HeartbeatState {
        Active = 0, "ACTIVE";
        Leave = 1, "LEAVE";
    }
}

code_enum! {
    /// CREDIT `mode`.
    pub enum CreditMode {
        /// A 0 count or 0 bytes leaves that dimension unchanged.
        Set = 0, "SET";
        /// 0 adds nothing.
        Add = 1, "ADD";
    }
}

code_enum! {
    /// Origin trailer `reason`: why a record was dead-lettered.
    pub enum OriginReason {
        /// NACK REJECT.
        Rejected = 0, "REJECTED";
        /// It failed at `--max-attempts`.
        MaxAttempts = 1, "MAX_ATTEMPTS";
    }
}

bitflags::bitflags! {
    /// DECLARE `flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct DeclareFlags: u16 {
        const DELETE = 0x0001;
        /// With DELETE: refuse while the pair has subscriptions (TOPIC_IN_USE).
        const IF_UNUSED = 0x0002;
        /// Look up, never create; `partition_count` 0 means "any".
        const PASSIVE = 0x0004;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// PUB `flags`: bits 0–1 are the requested [`Durability`] (0 = the broker's default).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PubFlags: u16 {
        const DURABILITY = 0x0003;
        const _ = !0;
    }
}

impl PubFlags {
    /// The flags asking for `durability`; `None` asks for the broker's default.
    pub fn requesting(durability: Option<Durability>) -> PubFlags {
        PubFlags::from_bits_retain(durability.map_or(0, |d| u16::from(d.as_code())))
    }

    /// The requested durability; `None` means the broker's default (bits 0).
    pub fn durability(self) -> Option<Durability> {
        Durability::from_code((self & PubFlags::DURABILITY).bits() as u8)
    }
}

bitflags::bitflags! {
    /// PUB result `result_flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct PubResultFlags: u8 {
        /// The PUB repeated an earlier (producer_id, producer_seq): nothing was appended.
        const DEDUPLICATED = 0x01;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// SUB `flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct SubFlags: u16 {
        /// No pushed MSG: messages only through PULL.
        const PULL_MODE = 0x0001;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// ACK `flags`.
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct AckFlags: u16 {
        /// Extend the delivery's deadline; does not settle it or return credit.
        const PROGRESS = 0x0001;
        const _ = !0;
    }
}

bitflags::bitflags! {
    /// MSG `flags`: the broker's delivery flags (not the PUB's).
    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
    pub struct MsgFlags: u16 {
        /// The origin trailer follows `value` (a dead letter).
        const ORIGIN = 0x0001;
        const _ = !0;
    }
}

/// Suffix of a source topic's dead-letter twin: `orders` → `orders.dlq` (`man/mortarmq.7`,
/// DECLARE). A DECLARE of a twin's name is refused (MUTATION_NOT_PACKABLE).
pub const DLQ_SUFFIX: &str = ".dlq";

/// The topic id of the dead-letter twin of the source topic `source_topic_id`: always
/// the next id (`man/mortarmq.7`, DECLARE), so a client addresses the twin through its
/// source.
pub fn dlq_twin_id(source_topic_id: u16) -> u16 {
    source_topic_id + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enums_round_trip_and_reserved_codes_are_none() {
        for &d in Durability::ALL {
            assert_eq!(Durability::from_code(d.as_code()), Some(d));
            assert_eq!(Durability::from_flag_name(d.flag_name()), Some(d));
        }
        assert_eq!(Durability::from_code(0), None, "0 is DEFAULT, not a level");
        assert_eq!(NackReason::from_code(2), None);
        assert_eq!(NackReason::from_code(3), None, "SLOW is reserved");
        assert_eq!(StartPolicy::from_code(2), None);
        assert_eq!(ControlResult::ALL.len(), 3);
        assert!(Durability::Written < Durability::Fsynced);
    }

    #[test]
    fn pub_flags_carry_the_durability_and_keep_reserved_bits() {
        let f = PubFlags::requesting(Some(Durability::Fsynced));
        assert_eq!(f.bits(), 2);
        assert_eq!(f.durability(), Some(Durability::Fsynced));
        assert_eq!(PubFlags::requesting(None).durability(), None);
        let with_reserved = PubFlags::from_bits_retain(0x8001);
        assert_eq!(with_reserved.durability(), Some(Durability::Written));
        assert_eq!(with_reserved.bits(), 0x8001);
    }
}
