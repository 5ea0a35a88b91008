//! The answer to one request, before it is bytes: OK (empty or with a typed result), ERR,
//! or the frames of a PULL. Exactly one per request, in request order (`man/mortarmq.7`).
//!
//! The session keeps responses in request order; most are encoded straight into the
//! connection's output buffer, so the common ones are small values, not `Vec`s.

use super::ops::{
    encode_err, encode_ok_empty, encode_ok_with, CreditResult, DeclareResult, PubResult, SubResult,
};
use super::{ErrorCode, Op};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
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

impl Response {
    pub fn err(code: ErrorCode, request_op: u8, message: impl Into<String>) -> Response {
        Response::Err {
            code,
            request_op,
            message: message.into(),
        }
    }

    /// ERR with the registry's "client should" advice as its text.
    pub fn err_advice(code: ErrorCode, op: Op) -> Response {
        Response::err(code, op as u8, code.client_should())
    }

    /// OK with an empty result.
    pub fn ok(op: Op) -> Response {
        Response::Ok {
            request_op: op as u8,
        }
    }

    pub fn encode(&self, out: &mut Vec<u8>) {
        match self {
            Response::Ok { request_op } => encode_ok_empty(out, *request_op),
            Response::Err {
                code,
                request_op,
                message,
            } => encode_err(out, *code, *request_op, message),
            Response::Declare(r) => encode_ok_with(out, r),
            Response::Pub(r) => encode_ok_with(out, r),
            Response::Sub(r) => encode_ok_with(out, r),
            Response::Credit(r) => encode_ok_with(out, r),
            Response::Frames(bytes) => out.extend_from_slice(bytes),
        }
    }

    /// The error a response carries, for metrics and for closing after it.
    pub fn error_code(&self) -> Option<ErrorCode> {
        match self {
            Response::Err { code, .. } => Some(*code),
            _ => None,
        }
    }
}
