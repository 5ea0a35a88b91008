//! The answer to one request, before it is bytes: OK (empty or with a typed result) or
//! ERR. Exactly one per request, in request order (`man/mortarmq.7`). A PULL's answer
//! (MSG×N then OK) is not one of these: the broker encodes it from the log straight into
//! the connection's output.
//!
//! The session keeps responses in request order; most are encoded straight into the
//! connection's output buffer, so the common ones are small values, not `Vec`s.

use super::ops::{
    encode_err, encode_ok_empty, encode_ok_with, err_message_sent, CreditResult, DeclareResult,
    OkResult, PubResult, SubResult, ERR_FRAME_FIXED_BYTES, OK_EMPTY_FRAME_BYTES,
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
        }
    }

    /// Bytes [`Response::encode`] appends: what an answer waiting behind an earlier one
    /// counts against the connection's output cap and the memory budget.
    pub fn encoded_len(&self) -> usize {
        match self {
            Response::Ok { .. } => OK_EMPTY_FRAME_BYTES,
            Response::Err { message, .. } => {
                ERR_FRAME_FIXED_BYTES + err_message_sent(message).len()
            }
            Response::Declare(_) => OK_EMPTY_FRAME_BYTES + DeclareResult::ENCODED_BYTES,
            Response::Pub(_) => OK_EMPTY_FRAME_BYTES + PubResult::ENCODED_BYTES,
            Response::Sub(_) => OK_EMPTY_FRAME_BYTES + SubResult::ENCODED_BYTES,
            Response::Credit(_) => OK_EMPTY_FRAME_BYTES + CreditResult::ENCODED_BYTES,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ErrorCode;

    #[test]
    fn encoded_len_is_what_encode_appends() {
        let long = "é".repeat(400);
        let responses = [
            Response::ok(Op::Ping),
            Response::err(ErrorCode::InvalidArgument, 3, "short"),
            Response::err(ErrorCode::InvalidArgument, 3, long),
            Response::Declare(DeclareResult::default()),
            Response::Pub(PubResult::default()),
            Response::Sub(SubResult::default()),
            Response::Credit(CreditResult::default()),
        ];
        for r in responses {
            let mut out = Vec::new();
            r.encode(&mut out);
            assert_eq!(out.len(), r.encoded_len(), "{r:?}");
        }
    }
}
