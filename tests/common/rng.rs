//! xorshift64*: enough randomness for kill points and fuzzed choices, no dependency.
//! Seeds come from `MORTAR_CRASH_SEED` when set, so a failing run can be replayed.
#![allow(dead_code)]

pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.max(1))
    }

    /// `MORTAR_CRASH_SEED`, or the clock; printed so the run can be replayed.
    pub fn seed_from_env() -> u64 {
        let seed = std::env::var("MORTAR_CRASH_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        println!("MORTAR_CRASH_SEED={seed}");
        seed
    }

    pub fn from_env() -> Rng {
        Rng::new(Rng::seed_from_env())
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}
