//! Around the CONNECT gate: failed CONNECTs answered later and later, and client ERR
//! frames logged briefly.
//!
//! Both are reachable before a peer has shown a token, so neither may cost the broker
//! more than a peer's bytes: a refused CONNECT's answer waits on a timer (the reactor
//! never sleeps), and a client's ERR makes at most a few short log lines.

use std::cmp::{Ordering, Reverse};

use super::conn::{CloseReason, ConnState};
use super::{Reactor, CLOSE_FLUSH_MS};
use crate::broker::Now;
use crate::session::Answer;
use crate::wire::ops::ErrFrame;
use crate::wire::Response;

/// A client ERR frame is logged in one line of at most this many bytes (its message is
/// cut to fit): a 60 KiB ERR must not make a 60 KiB log line.
pub const ERR_LOG_LINE_BYTES_MAX: usize = 200;
/// At most this many client ERR frames are logged per connection per window...
pub const ERR_LOGS_PER_WINDOW_MAX: u32 = 5;
/// ...of this long; the others are counted and the count is logged with the next line.
pub const ERR_LOG_WINDOW_MS: u64 = 60_000;

/// A refused CONNECT's answer, held back until `due_ms`.
pub struct DelayedAnswer {
    pub due_ms: u64,
    key: usize,
    serial: u64,
    slot: u64,
    response: Response,
}

// Ordered by due time only (the serial breaks ties), for the reactor's min-heap.
impl Ord for DelayedAnswer {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.due_ms, self.serial).cmp(&(other.due_ms, other.serial))
    }
}

impl PartialOrd for DelayedAnswer {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for DelayedAnswer {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for DelayedAnswer {}

impl Reactor {
    /// A CONNECT with a token not accepted: answered at once the first time from an
    /// address, later and later after that. The connection reads nothing more while
    /// it waits (AUTH_FAILED closes it anyway), so a pipelined guess behind this one
    /// is never tried.
    pub(super) fn refuse_connect(&mut self, key: usize, response: Response, now: Now) {
        let conn = &mut self.conns[key];
        let delay_ms = self
            .auth_failures
            .failed(conn.session.peer.ip(), now.mono_ms);
        if delay_ms == 0 {
            return self.answer(key, response);
        }
        log::info!(
            "conn {} from {}: token not accepted; answering in {delay_ms} ms (failed \
             CONNECTs from one address are answered later and later)",
            conn.serial,
            conn.session.peer
        );
        let slot = conn.slots.wait();
        conn.state = ConnState::Flushing(CloseReason::AuthFailed);
        conn.close_deadline_ms = now.mono_ms + delay_ms + CLOSE_FLUSH_MS;
        let serial = conn.serial;
        self.schedule_timer(key);
        self.delayed.push(Reverse(DelayedAnswer {
            due_ms: now.mono_ms + delay_ms,
            key,
            serial,
            slot,
            response,
        }));
    }

    /// Sends the held-back answers that are due; each connection closes once its
    /// answer is written.
    pub(super) fn answer_delayed(&mut self, now: Now) {
        while self
            .delayed
            .peek()
            .is_some_and(|d| d.0.due_ms <= now.mono_ms)
        {
            let Some(Reverse(d)) = self.delayed.pop() else {
                break;
            };
            let Some(conn) = self.conns.get_mut(d.key) else {
                continue;
            };
            if conn.serial != d.serial || matches!(conn.state, ConnState::Closed(_)) {
                continue;
            }
            if let Some(code) = d.response.error_code() {
                *self.counters.errors_sent.entry(code.code()).or_default() += 1;
            }
            self.counters.frames_out_answers += 1;
            let broker = &mut self.broker;
            let mut msgs = 0;
            let mut encode_pull =
                |a: &_, out: &mut Vec<u8>| msgs += broker.encode_pull_answer(a, out);
            let answer = Answer::Response(d.response);
            conn.slots
                .fill(d.slot, answer, &mut conn.output, &mut encode_pull);
            // Answers queued behind this one go out with it, a PULL's MSGs among them.
            self.counters.msgs_out += msgs;
            self.queue_flush(d.key);
        }
    }

    /// Logs a client's ERR frame (never answered): one short line, at most
    /// [`ERR_LOGS_PER_WINDOW_MAX`] per connection per [`ERR_LOG_WINDOW_MS`].
    pub(super) fn log_client_err(&mut self, key: usize, err: &ErrFrame<'_>, now: Now) {
        let conn = &mut self.conns[key];
        if now.mono_ms >= conn.err_log_window_ms + ERR_LOG_WINDOW_MS {
            conn.err_log_window_ms = now.mono_ms;
            conn.err_logs = 0;
        }
        if conn.err_logs >= ERR_LOGS_PER_WINDOW_MAX {
            conn.err_logs_dropped += 1;
            return;
        }
        conn.err_logs += 1;
        let line = err_log_line(conn.serial, err, conn.err_logs_dropped);
        conn.err_logs_dropped = 0;
        log::info!("{line}");
    }
}

/// `conn N sent ERR 0xCCCC for op 0xOO: "message"`, cut to [`ERR_LOG_LINE_BYTES_MAX`]
/// bytes; the message is shown escaped (it is the peer's bytes, not ours).
fn err_log_line(serial: u64, err: &ErrFrame<'_>, dropped: u64) -> String {
    let not_logged = match dropped {
        0 => String::new(),
        n => format!(" ({n} earlier ERR frames not logged)"),
    };
    let head = format!(
        "conn {serial} sent ERR 0x{:04X} for op 0x{:02X}{not_logged}: \"",
        err.code, err.request_op
    );
    let room = ERR_LOG_LINE_BYTES_MAX.saturating_sub(head.len() + "\"...".len());
    // The escaped form is never shorter than the bytes it shows, so `room` bytes of the
    // message are enough to fill the line; the rest is never looked at.
    let sample = &err.message[..err.message.len().min(room)];
    let mut message: String = String::from_utf8_lossy(sample).escape_debug().collect();
    let cut = message.len() > room || sample.len() < err.message.len();
    if message.len() > room {
        let mut end = room;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
    }
    format!("{head}{message}\"{}", if cut { "..." } else { "" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn err_log_lines_are_short_whatever_the_message() {
        let long = vec![b'\n'; 60 * 1024];
        for message in [&b"disk on fire"[..], &long, "é".repeat(500).as_bytes(), b""] {
            let err = ErrFrame {
                code: 0x000E,
                request_op: 3,
                message,
            };
            let line = err_log_line(7, &err, 12);
            assert!(line.len() <= ERR_LOG_LINE_BYTES_MAX, "{} bytes", line.len());
            assert!(line.starts_with("conn 7 sent ERR 0x000E for op 0x03 (12 earlier"));
        }
        let short = ErrFrame {
            code: 1,
            request_op: 0,
            message: b"disk on fire",
        };
        assert_eq!(
            err_log_line(1, &short, 0),
            "conn 1 sent ERR 0x0001 for op 0x00: \"disk on fire\""
        );
    }
}
