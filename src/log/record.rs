//! One record's bytes: encoding into the write buffer, and checked decoding from a mapped
//! segment or a recovery read buffer.
//!
//! This room knows the record layout and nothing else: no files, no sequences beyond the one
//! stored in the record. It depends on std and crc32fast only.
//!
//! # Record layout (all integers big-endian)
//!
//! ```text
//! offset      width  field          meaning
//! ----------  -----  -------------  ------------------------------------------------------
//! 0           4      length  u32    bytes after this field: 44 + key_len + value_len
//! 4           4      crc     u32    crc32 (crc32fast, IEEE) of bytes [8, 4 + length)
//! 8           8      sequence u64   partition sequence, contiguous from the segment's first
//! 16          8      timestamp_ms   broker receive time, ms since the Unix epoch
//! 24          8      producer_id    0 = no idempotence
//! 32          8      producer_seq   producer's own counter (0 when producer_id is 0)
//! 40          2      flags   u16    opaque to the log
//! 42          2      key_len u16
//! 44          k      key
//! 44+k        4      value_len u32
//! 48+k        v      value
//! ----------  -----  -------------  ------------------------------------------------------
//! total = 48 + k + v bytes            (RECORD_OVERHEAD_BYTES = 48)
//! ```
//!
//! The CRC covers everything after itself, so a flipped or torn byte anywhere in the record
//! except the length field is caught by the CRC. The length field is not under the CRC; it
//! is cross-checked instead: it must equal `44 + key_len + value_len`, both of which are
//! under the CRC, so a damaged length either runs past the end of the file (torn), or
//! makes the CRC run over the wrong range, or disagrees with the checked lengths.

use std::fmt;

/// Width of the leading length field.
pub const RECORD_LENGTH_BYTES: usize = 4;
/// Width of the CRC field that follows the length.
pub const RECORD_CRC_BYTES: usize = 4;
/// Bytes from the start of a record up to and including `key_len`.
pub const RECORD_HEADER_BYTES: usize = 44;
/// Fixed bytes of a record: header plus the `value_len` field.
pub const RECORD_OVERHEAD_BYTES: usize = RECORD_HEADER_BYTES + 4;
/// Largest key: `key_len` is a u16.
pub const RECORD_KEY_BYTES_MAX: usize = u16::MAX as usize;
/// Largest value the log accepts. At least the wire's MAX_VALUE_LEN (16 MiB - 1 KiB); the
/// log does not name the wire module, so it keeps its own, slightly larger, limit.
pub const RECORD_VALUE_BYTES_MAX: usize = 16 * 1024 * 1024;
/// Largest encoded record; recovery rejects a length field above this before allocating.
pub const RECORD_BYTES_MAX: usize =
    RECORD_OVERHEAD_BYTES + RECORD_KEY_BYTES_MAX + RECORD_VALUE_BYTES_MAX;
/// Smallest value the length field can hold (empty key, empty value).
pub const RECORD_LENGTH_FIELD_MIN: usize = RECORD_OVERHEAD_BYTES - RECORD_LENGTH_BYTES;

const _: () = assert!(RECORD_HEADER_BYTES == 4 + 4 + 8 * 4 + 2 + 2);
const _: () = assert!(RECORD_BYTES_MAX <= u32::MAX as usize);

/// One record's fields: what appends take and [`encode`] writes, and what reads hand out
/// (then `key` and `value` borrow from the segment's memory map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    pub sequence: u64,
    pub timestamp_ms: u64,
    pub producer_id: u64,
    pub producer_seq: u64,
    pub flags: u16,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Encoded size of a record with this key and value.
pub fn encoded_len(key_len: usize, value_len: usize) -> usize {
    RECORD_OVERHEAD_BYTES + key_len + value_len
}

/// Appends one record to `buf`. The caller has checked the key and value limits.
pub fn encode(buf: &mut Vec<u8>, f: &RecordView<'_>) {
    debug_assert!(f.key.len() <= RECORD_KEY_BYTES_MAX);
    debug_assert!(f.value.len() <= RECORD_VALUE_BYTES_MAX);
    let total = encoded_len(f.key.len(), f.value.len());
    let start = buf.len();
    buf.reserve(total);
    buf.extend_from_slice(&((total - RECORD_LENGTH_BYTES) as u32).to_be_bytes());
    buf.extend_from_slice(&[0; RECORD_CRC_BYTES]); // patched below, once the body exists
    buf.extend_from_slice(&f.sequence.to_be_bytes());
    buf.extend_from_slice(&f.timestamp_ms.to_be_bytes());
    buf.extend_from_slice(&f.producer_id.to_be_bytes());
    buf.extend_from_slice(&f.producer_seq.to_be_bytes());
    buf.extend_from_slice(&f.flags.to_be_bytes());
    buf.extend_from_slice(&(f.key.len() as u16).to_be_bytes());
    buf.extend_from_slice(f.key);
    buf.extend_from_slice(&(f.value.len() as u32).to_be_bytes());
    buf.extend_from_slice(f.value);
    debug_assert_eq!(buf.len() - start, total);
    let crc_at = start + RECORD_LENGTH_BYTES;
    let crc = crc32fast::hash(&buf[crc_at + RECORD_CRC_BYTES..]);
    buf[crc_at..crc_at + RECORD_CRC_BYTES].copy_from_slice(&crc.to_be_bytes());
}

/// Why bytes do not hold a good record. `Torn` means the bytes end before the record
/// does: the normal shape of a crash mid-write. `Invalid` means the bytes are there but
/// wrong: bit rot, a foreign file, or a torn write the file system filled with zeros.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    Torn { needed: usize, available: usize },
    Invalid(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::Torn { needed, available } => {
                write!(f, "torn record: needs {needed} bytes, {available} present")
            }
            DecodeError::Invalid(reason) => f.write_str(reason),
        }
    }
}

fn be_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}

fn be_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Reads only the length field and checks it is in range: lets recovery size its read
/// before allocating (a garbage length must not make it allocate 4 GiB).
pub fn total_len_from_prefix(prefix: [u8; RECORD_LENGTH_BYTES]) -> Result<usize, DecodeError> {
    let length = u32::from_be_bytes(prefix) as usize;
    if length < RECORD_LENGTH_FIELD_MIN {
        return Err(DecodeError::Invalid(format!(
            "length field {length} below the minimum {RECORD_LENGTH_FIELD_MIN}"
        )));
    }
    let total = length + RECORD_LENGTH_BYTES;
    if total > RECORD_BYTES_MAX {
        return Err(DecodeError::Invalid(format!(
            "length field {length} above RECORD_BYTES_MAX {RECORD_BYTES_MAX}"
        )));
    }
    Ok(total)
}

/// Decodes the record at the start of `bytes` (which may continue past it) and checks its
/// length, CRC, inner lengths and, when given, its sequence. Returns the record, its key
/// and value borrowed from `bytes`, and its encoded size (where the next record starts).
/// Never panics on any input.
pub fn decode(
    bytes: &[u8],
    expected_sequence: Option<u64>,
) -> Result<(RecordView<'_>, usize), DecodeError> {
    decode_checking(bytes, expected_sequence, Crc::Check)
}

/// Whether [`decode_checking`] computes the CRC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Crc {
    Check,
    /// These very bytes passed the check moments ago (`PartitionLog::read_one_in_pass`):
    /// every other check is still made.
    CheckedBefore,
}

/// [`decode`], with the CRC computed or not.
pub(crate) fn decode_checking(
    bytes: &[u8],
    expected_sequence: Option<u64>,
    crc: Crc,
) -> Result<(RecordView<'_>, usize), DecodeError> {
    if bytes.len() < RECORD_LENGTH_BYTES {
        return Err(DecodeError::Torn {
            needed: RECORD_LENGTH_BYTES,
            available: bytes.len(),
        });
    }
    let total = total_len_from_prefix([bytes[0], bytes[1], bytes[2], bytes[3]])?;
    if bytes.len() < total {
        return Err(DecodeError::Torn {
            needed: total,
            available: bytes.len(),
        });
    }
    let rec = &bytes[..total];
    if crc == Crc::Check {
        let stored_crc = be_u32(rec, RECORD_LENGTH_BYTES);
        let actual_crc = crc32fast::hash(&rec[RECORD_LENGTH_BYTES + RECORD_CRC_BYTES..]);
        if stored_crc != actual_crc {
            return Err(DecodeError::Invalid(format!(
                "crc mismatch: stored {stored_crc:#010x}, computed {actual_crc:#010x}"
            )));
        }
    }
    let key_len = be_u16(rec, 42) as usize;
    // value_len sits after the key; the length field bounds it, so check before indexing.
    let value_len_at = RECORD_HEADER_BYTES + key_len;
    if value_len_at + 4 > total {
        return Err(DecodeError::Invalid(format!(
            "key_len {key_len} runs past the record end ({total} bytes)"
        )));
    }
    let value_len = be_u32(rec, value_len_at) as usize;
    if encoded_len(key_len, value_len) != total {
        return Err(DecodeError::Invalid(format!(
            "key_len {key_len} + value_len {value_len} disagree with record length {total}"
        )));
    }
    let sequence = be_u64(rec, 8);
    if let Some(expected) = expected_sequence {
        if sequence != expected {
            return Err(DecodeError::Invalid(format!(
                "sequence {sequence} where {expected} was expected"
            )));
        }
    }
    let view = RecordView {
        sequence,
        timestamp_ms: be_u64(rec, 16),
        producer_id: be_u64(rec, 24),
        producer_seq: be_u64(rec, 32),
        flags: be_u16(rec, 40),
        key: &rec[RECORD_HEADER_BYTES..value_len_at],
        value: &rec[value_len_at + 4..],
    };
    Ok((view, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(buf: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        encode(
            buf,
            &RecordView {
                sequence: 7,
                timestamp_ms: 1_700_000_000_000,
                producer_id: 3,
                producer_seq: 9,
                flags: 0x0102,
                key,
                value,
            },
        );
    }

    #[test]
    fn golden_layout() {
        let mut buf = Vec::new();
        sample(&mut buf, b"k", b"vv");
        assert_eq!(buf.len(), 51);
        assert_eq!(&buf[0..4], &47u32.to_be_bytes()); // length = total - 4
        assert_eq!(&buf[8..16], &7u64.to_be_bytes()); // sequence
        assert_eq!(&buf[40..42], &[0x01, 0x02]); // flags
        assert_eq!(&buf[42..44], &[0, 1]); // key_len
        assert_eq!(buf[44], b'k');
        assert_eq!(&buf[45..49], &2u32.to_be_bytes()); // value_len
        assert_eq!(&buf[49..51], b"vv");
        let crc = crc32fast::hash(&buf[8..]);
        assert_eq!(&buf[4..8], &crc.to_be_bytes());
    }

    #[test]
    fn round_trip_and_every_truncation_and_flip() {
        let mut buf = Vec::new();
        sample(&mut buf, b"key", b"value");
        let (d, total_len) = decode(&buf, Some(7)).unwrap();
        assert_eq!(
            (d.key, d.value, total_len),
            (&b"key"[..], &b"value"[..], buf.len())
        );
        assert!(decode(&buf, Some(8)).is_err());
        for cut in 0..buf.len() {
            assert!(decode(&buf[..cut], None).is_err(), "cut at {cut}");
        }
        for at in 0..buf.len() {
            for bit in 0..8 {
                let mut bad = buf.clone();
                bad[at] ^= 1 << bit;
                assert!(decode(&bad, None).is_err(), "flip at {at} bit {bit}");
            }
        }
    }
}
