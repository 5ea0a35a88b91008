//! What the broker answers a request with, before it is bytes.
//!
//! The session keeps answers in request order; most are encoded straight into the
//! connection's output buffer, so the common answers are small values, not `Vec`s.

use crate::wire::ops::{
    encode_err, encode_ok_empty, encode_ok_with, CreditResult, DeclareResult, PubResult, SubResult,
};
use crate::wire::ErrorCode;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// OK with an empty result.
    Ok {
        request_op: u8,
    },
    Err {
        code: ErrorCode,
        request_op: u8,
        message: String,
    },
    Declare(DeclareResult),
    Pub(PubResult),
    Sub(SubResult),
    Credit(CreditResult),
    /// Already-encoded frames (a PULL's MSG×N then OK).
    Frames(Vec<u8>),
}

impl Answer {
    pub fn err(code: ErrorCode, request_op: u8, message: impl Into<String>) -> Answer {
        Answer::Err {
            code,
            request_op,
            message: message.into(),
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Answer::Ok { request_op } => encode_ok_empty(out, *request_op),
            Answer::Err {
                code,
                request_op,
                message,
            } => encode_err(out, *code, *request_op, message),
            Answer::Declare(r) => encode_ok_with(out, r),
            Answer::Pub(r) => encode_ok_with(out, r),
            Answer::Sub(r) => encode_ok_with(out, r),
            Answer::Credit(r) => encode_ok_with(out, r),
            Answer::Frames(bytes) => out.extend_from_slice(bytes),
        }
    }

    /// The error an answer carries, for metrics and for closing after it.
    pub fn error_code(&self) -> Option<ErrorCode> {
        match self {
            Answer::Err { code, .. } => Some(*code),
            _ => None,
        }
    }
}
