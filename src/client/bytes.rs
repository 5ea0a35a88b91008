//! The key and value of a consumed [`Message`](super::Message): a window on the read
//! buffer they arrived in, shared rather than copied.

use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::sync::Arc;

/// Bytes of a message, shared with the buffer the consumer read them into: handing a
/// message out copies and allocates nothing. Derefs to `[u8]` (`&m.value[..4]`,
/// `m.value.len()`, `std::str::from_utf8(&m.value)`), compares with byte strings and
/// vectors, and [`to_vec`](slice::to_vec) copies it out.
///
/// A `Bytes` keeps its whole read buffer (up to a few hundred KiB) alive: copy out what
/// you keep for long, so that a few kept messages do not hold many buffers.
///
/// ```no_run
/// use std::time::Duration;
/// use mortarmq::client::{Consumer, StartPolicy};
///
/// let mut consumer = Consumer::connect("127.0.0.1:7411")?;
/// consumer.subscribe("billing", "orders", StartPolicy::Earliest)?;
/// if let Some(m) = consumer.poll(Some(Duration::from_secs(5)))? {
///     if m.value == b"ping" {
///         println!("a ping of {} bytes", m.value.len());
///     }
///     let kept: Vec<u8> = m.value.to_vec(); // outlives the read buffer's other messages
///     m.ack();
/// }
/// # Ok::<(), mortarmq::client::Error>(())
/// ```
#[derive(Clone, Default)]
pub struct Bytes {
    /// `None` for no bytes, so an empty key costs nothing.
    buf: Option<Arc<Vec<u8>>>,
    start: usize,
    end: usize,
}

impl Bytes {
    /// The window `start..end` of `buf`.
    pub(crate) fn shared(buf: &Arc<Vec<u8>>, start: usize, end: usize) -> Bytes {
        debug_assert!(start <= end && end <= buf.len());
        if start == end {
            return Bytes::default();
        }
        Bytes {
            buf: Some(Arc::clone(buf)),
            start,
            end,
        }
    }
}

impl Deref for Bytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf[self.start..self.end],
            None => &[],
        }
    }
}

impl AsRef<[u8]> for Bytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Bytes> for Vec<u8> {
    fn from(b: Bytes) -> Vec<u8> {
        b.to_vec()
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(v: Vec<u8>) -> Bytes {
        let end = v.len();
        Bytes::shared(&Arc::new(v), 0, end)
    }
}

impl fmt::Debug for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl PartialEq for Bytes {
    fn eq(&self, other: &Bytes) -> bool {
        **self == **other
    }
}

impl Eq for Bytes {}

impl Hash for Bytes {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self).hash(state)
    }
}

impl PartialEq<[u8]> for Bytes {
    fn eq(&self, other: &[u8]) -> bool {
        **self == *other
    }
}

impl PartialEq<&[u8]> for Bytes {
    fn eq(&self, other: &&[u8]) -> bool {
        **self == **other
    }
}

impl<const N: usize> PartialEq<[u8; N]> for Bytes {
    fn eq(&self, other: &[u8; N]) -> bool {
        **self == other[..]
    }
}

impl<const N: usize> PartialEq<&[u8; N]> for Bytes {
    fn eq(&self, other: &&[u8; N]) -> bool {
        **self == other[..]
    }
}

impl PartialEq<Vec<u8>> for Bytes {
    fn eq(&self, other: &Vec<u8>) -> bool {
        **self == other[..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_reads_compares_and_copies_like_its_bytes() {
        let buf = Arc::new(b"keyvalue".to_vec());
        let key = Bytes::shared(&buf, 0, 3);
        let value = Bytes::shared(&buf, 3, 8);
        assert_eq!(key, b"key");
        assert_eq!(value, &b"value"[..]);
        assert_eq!(value, b"value".to_vec());
        assert_eq!(value.to_vec(), b"value");
        assert_eq!(format!("{key:?}"), "[107, 101, 121]");
        let empty = Bytes::shared(&buf, 4, 4);
        assert!(empty.is_empty() && empty.buf.is_none());
        assert_eq!(Bytes::from(b"abc".to_vec()), b"abc");
        drop(buf);
        assert_eq!(&value[..2], b"va", "the window keeps its buffer");
    }
}
