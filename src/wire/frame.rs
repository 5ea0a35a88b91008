//! The frame splitter: finds complete frames in a byte buffer without copying.
//!
//! ```text
//! offset  width  field
//! 0       4      length   u32 big-endian: op byte + payload (NOT the whole frame)
//! 4       1      op
//! 5       n      payload  n = length - 1
//! ```
//!
//! "Check, then parse, without I/O": [`split_frame`] answers `Ok(None)` while the
//! frame is incomplete (never an error), `Ok(Some(frame))` once all of it is
//! buffered, and `Err` as soon as the header alone proves the frame invalid, before
//! the body is read or buffered (0x0001 and 0x0002 close the connection, `man/mortarmq.7`).

use super::errors::ErrorCode;
use super::limits::{FRAME_HEADER_BYTES, OP_BYTES};
use super::ops::Op;

/// A complete frame borrowed from the read buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawFrame<'a> {
    pub op: u8,
    pub payload: &'a [u8],
    /// Bytes the frame occupies in the buffer, header included.
    pub total_bytes: usize,
}

/// Why a frame header is invalid. Both close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameError {
    /// `length == 0` or `length` above the cap in force (MAX_FRAME_LEN, or the
    /// pre-CONNECT cap).
    InvalidLength { length: u32 },
    /// Op 0x00 or 0xFF.
    IllegalOp { op: u8 },
}

impl FrameError {
    pub fn code(self) -> ErrorCode {
        match self {
            FrameError::InvalidLength { .. } => ErrorCode::InvalidFrameLength,
            FrameError::IllegalOp { .. } => ErrorCode::IllegalOp,
        }
    }

    /// The op byte an ERR frame reports: 0 when no op was read (`man/mortarmq.7`, ERR).
    pub fn request_op(self) -> u8 {
        match self {
            FrameError::InvalidLength { .. } => 0,
            FrameError::IllegalOp { op } => op,
        }
    }
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::InvalidLength { length } => write!(f, "invalid frame length {length}"),
            FrameError::IllegalOp { op } => write!(f, "illegal op 0x{op:02X}"),
        }
    }
}

/// What an op byte means to a receiver (`man/mortarmq.7`, OPERATIONS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpClass {
    Known(Op),
    /// 0x10–0x7F (future business ops) and 0x80–0xFE (admin/internal).
    Reserved,
    /// 0x00 and 0xFF.
    Illegal,
}

pub fn classify_op(op: u8) -> OpClass {
    match op {
        0x00 | 0xFF => OpClass::Illegal,
        _ => match Op::from_u8(op) {
            Some(known) => OpClass::Known(known),
            None => OpClass::Reserved,
        },
    }
}

/// The declared `length` field, once the 4 header bytes are buffered.
pub fn declared_length(buf: &[u8]) -> Option<u32> {
    let header: [u8; FRAME_HEADER_BYTES] = buf.get(..FRAME_HEADER_BYTES)?.try_into().ok()?;
    Some(u32::from_be_bytes(header))
}

/// Splits the first frame off `buf`. `max_frame_len` is the cap on `length` in force
/// for this connection (MAX_FRAME_LEN_BYTES, or PREAUTH_FRAME_LEN_MAX_BYTES before
/// CONNECT). The length is checked before anything else, so an oversized frame is
/// refused before its body is buffered.
pub fn split_frame(buf: &[u8], max_frame_len: u32) -> Result<Option<RawFrame<'_>>, FrameError> {
    let Some(length) = declared_length(buf) else {
        return Ok(None);
    };
    if length == 0 || length > max_frame_len {
        return Err(FrameError::InvalidLength { length });
    }
    let Some(&op) = buf.get(FRAME_HEADER_BYTES) else {
        return Ok(None);
    };
    if classify_op(op) == OpClass::Illegal {
        return Err(FrameError::IllegalOp { op });
    }
    let total_bytes = FRAME_HEADER_BYTES + length as usize;
    if buf.len() < total_bytes {
        return Ok(None);
    }
    Ok(Some(RawFrame {
        op,
        payload: &buf[FRAME_HEADER_BYTES + OP_BYTES..total_bytes],
        total_bytes,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::limits::{MAX_FRAME_LEN_BYTES, PREAUTH_FRAME_LEN_MAX_BYTES};

    #[test]
    fn incomplete_input_is_never_an_error() {
        let frame = [0, 0, 0, 3, 0x07, 0xAA, 0xBB];
        for cut in 0..frame.len() {
            assert_eq!(
                split_frame(&frame[..cut], MAX_FRAME_LEN_BYTES),
                Ok(None),
                "cut {cut}"
            );
        }
        let whole = split_frame(&frame, MAX_FRAME_LEN_BYTES).unwrap().unwrap();
        assert_eq!(whole.op, 0x07);
        assert_eq!(whole.payload, &[0xAA, 0xBB]);
        assert_eq!(whole.total_bytes, 7);
    }

    #[test]
    fn bad_lengths_are_refused_from_the_header_alone() {
        assert_eq!(
            split_frame(&[0, 0, 0, 0], MAX_FRAME_LEN_BYTES),
            Err(FrameError::InvalidLength { length: 0 })
        );
        let over = (MAX_FRAME_LEN_BYTES + 1).to_be_bytes();
        assert_eq!(
            split_frame(&over, MAX_FRAME_LEN_BYTES),
            Err(FrameError::InvalidLength {
                length: MAX_FRAME_LEN_BYTES + 1
            })
        );
        let preauth = (PREAUTH_FRAME_LEN_MAX_BYTES + 1).to_be_bytes();
        assert!(split_frame(&preauth, PREAUTH_FRAME_LEN_MAX_BYTES).is_err());
        assert_eq!(split_frame(&preauth, MAX_FRAME_LEN_BYTES), Ok(None));
    }

    #[test]
    fn illegal_ops_are_refused_before_the_body() {
        assert_eq!(
            split_frame(&[0, 0, 0, 9, 0x00], MAX_FRAME_LEN_BYTES),
            Err(FrameError::IllegalOp { op: 0 })
        );
        assert_eq!(
            split_frame(&[0, 0, 0, 9, 0xFF], MAX_FRAME_LEN_BYTES),
            Err(FrameError::IllegalOp { op: 0xFF })
        );
    }

    #[test]
    fn op_classes_follow_the_seed() {
        assert_eq!(classify_op(0x00), OpClass::Illegal);
        assert_eq!(classify_op(0xFF), OpClass::Illegal);
        for op in 0x01..=0x0F {
            assert!(matches!(classify_op(op), OpClass::Known(_)), "op {op}");
        }
        for op in 0x10..=0xFE {
            assert_eq!(classify_op(op), OpClass::Reserved, "op {op}");
        }
    }
}
