//! What a client may ask: the decoded client-to-server ops, one variant each.
//!
//! ERR goes both ways but is never answered, and OK, MSG and NOTICE are the server's, so
//! none of them is a request: [`Request::decode`] says which of those it met instead of
//! decoding it, and the session logs the ERR or refuses the others (`man/mortarmq.7`,
//! check order).

use super::ops::{
    Ack, Connect, ControlAck, Credit, Declare, ErrFrame, Heartbeat, Message, Nack, Pub, Pull, Sub,
};
use super::{DecodeError, Op};

/// One decoded request. The broker's single dispatch matches on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request<'a> {
    Connect(Connect<'a>),
    Ping,
    Declare(Declare<'a>),
    Pub(Pub<'a>),
    Sub(Sub<'a>),
    Ack(Ack),
    Nack(Nack),
    Pull(Pull),
    Heartbeat(Heartbeat),
    ControlAck(ControlAck),
    Credit(Credit),
}

/// Why a known op is not decoded as a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotARequest<'a> {
    /// The payload is shorter than its fields: MALFORMED_PAYLOAD.
    Malformed(DecodeError),
    /// A client's ERR: logged, never answered.
    ClientErr(ErrFrame<'a>),
    /// OK, MSG or NOTICE: only the server sends them (UNEXPECTED_OP).
    ServerOnly(Op),
}

impl From<DecodeError> for NotARequest<'_> {
    fn from(e: DecodeError) -> Self {
        NotARequest::Malformed(e)
    }
}

impl<'a> Request<'a> {
    /// The codec's one `match op` for requests.
    pub fn decode(op: Op, payload: &'a [u8]) -> Result<Request<'a>, NotARequest<'a>> {
        Ok(match op {
            Op::Connect => Request::Connect(Message::decode(payload)?),
            Op::Ping => Request::Ping,
            Op::Declare => Request::Declare(Message::decode(payload)?),
            Op::Pub => Request::Pub(Message::decode(payload)?),
            Op::Sub => Request::Sub(Message::decode(payload)?),
            Op::Ack => Request::Ack(Message::decode(payload)?),
            Op::Nack => Request::Nack(Message::decode(payload)?),
            Op::Pull => Request::Pull(Message::decode(payload)?),
            Op::Heartbeat => Request::Heartbeat(Message::decode(payload)?),
            Op::ControlAck => Request::ControlAck(Message::decode(payload)?),
            Op::Credit => Request::Credit(Message::decode(payload)?),
            Op::Err => return Err(NotARequest::ClientErr(Message::decode(payload)?)),
            Op::Ok | Op::Msg | Op::Notice => return Err(NotARequest::ServerOnly(op)),
        })
    }

    pub fn op(&self) -> Op {
        match self {
            Request::Connect(_) => Op::Connect,
            Request::Ping => Op::Ping,
            Request::Declare(_) => Op::Declare,
            Request::Pub(_) => Op::Pub,
            Request::Sub(_) => Op::Sub,
            Request::Ack(_) => Op::Ack,
            Request::Nack(_) => Op::Nack,
            Request::Pull(_) => Op::Pull,
            Request::Heartbeat(_) => Op::Heartbeat,
            Request::ControlAck(_) => Op::ControlAck,
            Request::Credit(_) => Op::Credit,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ops::Frame;

    #[test]
    fn every_client_op_decodes_and_server_ops_are_named() {
        for op in Op::ALL {
            let mut bytes = Vec::new();
            let frame = match op {
                Op::Msg => Frame::Msg(Default::default()),
                Op::Notice => Frame::Notice(Default::default()),
                Op::Ok => Frame::Ok(Default::default()),
                _ => {
                    // A zeroed payload of ample length decodes as every request op.
                    let payload = [0u8; 64];
                    let decoded = Request::decode(op, &payload);
                    match op {
                        Op::Err => assert!(matches!(decoded, Err(NotARequest::ClientErr(_)))),
                        _ => assert_eq!(decoded.unwrap().op(), op),
                    }
                    continue;
                }
            };
            frame.encode(&mut bytes);
            assert_eq!(
                Request::decode(op, &bytes[5..]),
                Err(NotARequest::ServerOnly(op))
            );
        }
        assert!(matches!(
            Request::decode(Op::Pub, &[0, 1]),
            Err(NotARequest::Malformed(_))
        ));
    }
}
