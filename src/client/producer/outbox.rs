//! The encoded PUBs of the records in flight, in send order and back to back. A record
//! is encoded once, straight into the bytes the socket is written from, and stays there
//! until its answer, so a resend needs no copy of its own and a send no allocation.

/// The oldest frames' bytes are dropped (the rest moved down) once this many are done
/// with and they are at least half the buffer.
const COMPACT_AFTER_BYTES: usize = 256 * 1024;

#[derive(Default)]
pub(super) struct Outbox {
    bytes: Vec<u8>,
    /// Where the oldest frame in flight starts.
    head: usize,
    /// Written to the socket up to here.
    written: usize,
}

impl Outbox {
    /// Appends a frame with `encode`; returns its length.
    pub fn push(&mut self, encode: impl FnOnce(&mut Vec<u8>)) -> usize {
        let start = self.bytes.len();
        encode(&mut self.bytes);
        self.bytes.len() - start
    }

    /// The bytes not yet written to the socket.
    pub fn unwritten(&self) -> &[u8] {
        &self.bytes[self.written..]
    }

    pub fn mark_written(&mut self) {
        self.written = self.bytes.len();
    }

    /// The oldest frame, `len` bytes long.
    pub fn front(&self, len: usize) -> &[u8] {
        &self.bytes[self.head..self.head + len]
    }

    /// Drops the oldest frame, `len` bytes long, once answered.
    pub fn pop_front(&mut self, len: usize) {
        debug_assert!(
            self.head + len <= self.written,
            "an answer to an unwritten frame"
        );
        self.drop_front(len);
    }

    /// The oldest frame, `len` bytes long, moved out of the box: written or not, as a
    /// lost connection takes every record in flight, including those a failed write
    /// never sent.
    pub fn take_front(&mut self, len: usize) -> Vec<u8> {
        let frame = self.front(len).to_vec();
        self.written = self.written.max(self.head + len);
        self.drop_front(len);
        frame
    }

    fn drop_front(&mut self, len: usize) {
        self.head += len;
        if self.head == self.bytes.len() {
            self.clear();
        } else if self.head >= COMPACT_AFTER_BYTES && self.head * 2 >= self.bytes.len() {
            self.bytes.drain(..self.head);
            self.written -= self.head;
            self.head = 0;
        }
    }

    pub fn clear(&mut self) {
        self.bytes.clear();
        self.head = 0;
        self.written = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_leave_in_order_and_the_buffer_compacts() {
        let mut o = Outbox::default();
        let big = vec![7u8; COMPACT_AFTER_BYTES];
        let a = o.push(|b| b.extend_from_slice(&big));
        let b = o.push(|b| b.extend_from_slice(b"second"));
        assert_eq!(o.unwritten().len(), a + b);
        o.mark_written();
        assert!(o.unwritten().is_empty());
        o.pop_front(a);
        assert_eq!(o.front(b), b"second", "compacted, still there");
        assert_eq!(o.bytes.len(), b);
        let c = o.push(|b| b.extend_from_slice(b"third"));
        assert_eq!(o.unwritten(), b"third");
        o.mark_written();
        o.pop_front(b);
        o.pop_front(c);
        assert!(o.bytes.is_empty());
    }

    #[test]
    fn a_lost_connection_takes_unwritten_frames_too() {
        let mut o = Outbox::default();
        let a = o.push(|b| b.extend_from_slice(b"sent"));
        o.mark_written();
        let b = o.push(|b| b.extend_from_slice(b"queued"));
        assert_eq!(o.take_front(a), b"sent");
        assert_eq!(o.take_front(b), b"queued");
        assert!(o.bytes.is_empty() && o.unwritten().is_empty());
    }
}
