//! The consume plane's limits and timers, and their defaults (the `--help` and
//! `man/mortard.8` defaults of the Consume flags come from here).

const MS_PER_DAY: u64 = 24 * 3600 * 1000;

/// Operator-tunable limits and timers of the consume plane. Defaults are the spec's
/// where it names one (session 30 s, revoke 10 s, ack-wait 30 s, 5 attempts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumeConfig {
    /// `--session-timeout`: a member with no op on its subscription for this long leaves.
    pub session_timeout_ms: u64,
    /// `--revoke-timeout`: a REVOKE not CONTROL_ACKed by then is treated as acked, and an
    /// ASSIGN not CONTROL_ACKed by then is taken back.
    pub revoke_timeout_ms: u64,
    /// `--ack-wait`: a delivery not settled (or PROGRESSed) by then expires.
    pub ack_wait_ms: u64,
    /// `--nack-delay`: a NACK(RETRY)ed record is redelivered after this long.
    pub nack_delay_ms: u64,
    /// `--max-attempts`: a record failing at this attempt is dead-lettered. 0 acts as 1.
    pub max_attempts: u16,
    /// `--max-credit-count`: per-subscription cap on the credit window's count.
    pub max_credit_count: u16,
    /// `--max-credit-size`: per-subscription cap on the credit window's bytes.
    pub max_credit_bytes: u32,
    /// `--max-subscriptions`: open (live) subscriptions one connection may hold; beyond →
    /// 0x0025.
    pub max_subscriptions_per_conn: usize,
    /// `--max-groups`: groups the broker holds; a SUB creating one more → 0x2005.
    pub max_groups: usize,
    /// `--max-members-per-group`: members one group holds; one more → 0x2005.
    pub max_members_per_group: usize,
    /// `--group-ttl`: a group without members for this long is removed, its committed
    /// positions with it, so that group names an attacker made up cannot hold every
    /// `--max-groups` slot until a restart.
    pub group_ttl_ms: u64,
}

impl Default for ConsumeConfig {
    fn default() -> Self {
        ConsumeConfig {
            session_timeout_ms: 30_000,
            revoke_timeout_ms: 10_000,
            ack_wait_ms: 30_000,
            // The spec names the flag but no default; one second keeps a poison
            // record from spinning while still retrying promptly.
            nack_delay_ms: 1_000,
            max_attempts: 5,
            max_credit_count: u16::MAX,
            max_credit_bytes: 16 * 1024 * 1024,
            max_subscriptions_per_conn: 64,
            max_groups: 1024,
            max_members_per_group: 256,
            // Kafka's offsets.retention.minutes: a consumer down over a long weekend
            // still finds its position, and a name nobody uses frees its slot in a week.
            group_ttl_ms: 7 * MS_PER_DAY,
        }
    }
}
