//! A fast hasher for maps keyed by ids the broker assigns itself (topic ids, partition
//! indexes, job ids, connection ids). SipHash, std's default, resists collision attacks
//! on keys an attacker picks; these keys are picked by the broker, and SipHash on the
//! publish path cost about 13% of the broker's instructions per PUB (callgrind, see
//! docs/BENCHMARKS.md). Maps keyed by client-chosen values (producer ids, names) keep
//! SipHash.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Multiply-rotate mixing (the Fx hash of rustc): one multiply per word.
#[derive(Default, Clone, Copy)]
pub struct IdHasher(u64);

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl IdHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(SEED);
    }
}

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }
    fn write_u16(&mut self, n: u16) {
        self.add(u64::from(n));
    }
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// A `HashMap` for broker-assigned keys.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_spread() {
        let mut m: IdMap<(u16, u16), u32> = IdMap::default();
        for t in 1..200u16 {
            for p in 0..64u16 {
                m.insert((t, p), u32::from(t) * 64 + u32::from(p));
            }
        }
        assert_eq!(m.len(), 199 * 64);
        assert_eq!(m[&(7, 3)], 7 * 64 + 3);
    }
}
