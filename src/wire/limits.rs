//! Protocol limits of wire v0, each named after the spec with its unit last.
//!
//! The protocol fixes these (`man/mortarmq.7`, FRAME FORMAT); neither broker nor client may raise
//! them. Broker-side operational limits (connections, buffers) live in `config` and
//! the reactor, not here.

/// Bytes of the `u32_be length` prefix that starts every frame.
pub const FRAME_HEADER_BYTES: usize = 4;
/// Bytes of the op code that follows the length.
pub const OP_BYTES: usize = 1;
/// Cap on `length` (op byte + payload). 16 MiB.
pub const MAX_FRAME_LEN_BYTES: u32 = 16 * 1024 * 1024;
/// Cap on a PUB/MSG value: 16 MiB − 1 KiB, leaving room for the fields, a key of
/// MAX_KEY_LEN and trailers, so that a maximal value always fits in a frame.
pub const MAX_VALUE_LEN_BYTES: u32 = MAX_FRAME_LEN_BYTES - 1024;
/// Cap on a PUB/MSG key (UTF-8 not enforced).
pub const MAX_KEY_LEN_BYTES: usize = 255;
/// Cap on a topic name.
pub const MAX_TOPIC_LEN_BYTES: usize = 255;
/// Cap on a consumer-group name (`man/mortarmq.7`, SUB: same shape as topic names).
pub const MAX_GROUP_LEN_BYTES: usize = 255;
/// Cap on an ERR frame's diagnostic text.
pub const MAX_ERR_MESSAGE_BYTES: usize = 512;
/// Cap on an OK frame's result: the frame cap less op, request_op and result_len.
pub const MAX_OK_RESULT_LEN_BYTES: u32 = MAX_FRAME_LEN_BYTES - 6;
/// Until CONNECT succeeds a frame may be at most this long (`man/mortarmq.7`, FRAME FORMAT), so an
/// unauthenticated peer cannot make the broker buffer 16 MiB.
pub const PREAUTH_FRAME_LEN_MAX_BYTES: u32 = 64 * 1024;
/// First field of CONNECT.
pub const WIRE_VERSION: u8 = 1;
/// The keepalive period of the protocol.
pub const KEEPALIVE_MS: u64 = 30_000;
/// Without a complete frame for 1.5 × keepalive the server closes the connection.
pub const IDLE_TIMEOUT_MS: u64 = KEEPALIVE_MS * 3 / 2;
/// A frame begun but not completed within this time closes the connection.
pub const HALF_FRAME_TIMEOUT_MS: u64 = 10_000;
/// Idempotent producers: how many of a producer's latest seqs are remembered.
pub const DEDUP_WINDOW_SEQS: u64 = 1024;
/// Topic pairs the registry can hold: 0xFFFF slots, one odd + one even per pair.
pub const TOPIC_PAIRS_MAX: u16 = 32767;
/// SUB.partition must be this in v0: the coordinator assigns partitions.
pub const SUB_PARTITION_ANY: u16 = 0xFFFF;
/// SUB `credit_count` 0 means this window (`man/mortarmq.7`, SUB): records.
pub const DEFAULT_CREDIT_COUNT: u16 = 256;
/// SUB `credit_bytes` 0 means this window: 2 MiB.
pub const DEFAULT_CREDIT_BYTES: u32 = 2 * 1024 * 1024;

const _: () =
    assert!(MAX_VALUE_LEN_BYTES as usize + MAX_KEY_LEN_BYTES + 64 < MAX_FRAME_LEN_BYTES as usize);
const _: () = assert!(MAX_OK_RESULT_LEN_BYTES + 6 == MAX_FRAME_LEN_BYTES);
const _: () = assert!(PREAUTH_FRAME_LEN_MAX_BYTES < MAX_FRAME_LEN_BYTES);
const _: () = assert!(IDLE_TIMEOUT_MS == 45_000);
