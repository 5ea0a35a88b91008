//! Big-endian field readers and writers shared by every op's decoder and encoder.

/// A payload was shorter than its fields: `need` bytes were wanted at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    pub offset: usize,
    pub need: usize,
}

/// Reads fields in order from a payload, borrowing byte fields from it (no copy).
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    pub fn position(&self) -> usize {
        self.pos
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub fn bytes(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.remaining() < n {
            return Err(Short {
                offset: self.pos,
                need: n,
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], Short> {
        let b = self.bytes(N)?;
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.array::<1>()?[0])
    }
    pub fn u16(&mut self) -> Result<u16, Short> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    pub fn u32(&mut self) -> Result<u32, Short> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    pub fn u64(&mut self) -> Result<u64, Short> {
        Ok(u64::from_be_bytes(self.array()?))
    }
    pub fn bits<T: WireBits>(&mut self) -> Result<T, Short> {
        T::read(self)
    }
}

/// Appends big-endian fields to a buffer the caller owns (so hot paths reuse it).
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_bytes(&mut self, v: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_be_bytes());
    }
    fn put_bytes(&mut self, v: &[u8]) {
        self.extend_from_slice(v);
    }
}

/// A typed flag set carried in a fixed-width field (the `vocab` bitflags types).
pub trait WireBits: Sized {
    fn read(r: &mut Reader<'_>) -> Result<Self, Short>;
    fn write(&self, out: &mut Vec<u8>);
}

macro_rules! wire_bits {
    ($($ty:ty: $bits:ident, $put:ident;)*) => {$(
        impl WireBits for $ty {
            fn read(r: &mut Reader<'_>) -> Result<Self, Short> {
                Ok(<$ty>::from_bits_retain(r.$bits()?))
            }
            fn write(&self, out: &mut Vec<u8>) {
                out.$put(self.bits())
            }
        }

        impl From<$ty> for u64 {
            fn from(flags: $ty) -> u64 {
                u64::from(flags.bits())
            }
        }
    )*};
}

use super::vocab::{AckFlags, DeclareFlags, MsgFlags, PubFlags, PubResultFlags, SubFlags};

wire_bits! {
    DeclareFlags: u16, put_u16;
    PubFlags: u16, put_u16;
    PubResultFlags: u8, put_u8;
    SubFlags: u16, put_u16;
    AckFlags: u16, put_u16;
    MsgFlags: u16, put_u16;
}
