//! The simulation's PRNG: one seeded generator decides every choice the simulated disk makes.
//!
//! It owns a 64-bit state and nothing else. It must never be seeded from anything but the seed
//! it is given (no clock, no OS entropy), or a failing seed would stop reproducing.

/// A small seeded PRNG (SplitMix64): fast, with a 64-bit state that is trivially reproducible.
/// Not for cryptography; for simulation choices only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimRng {
    state: u64,
}

impl SimRng {
    /// A generator whose whole future output is decided by `seed`.
    #[must_use]
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// The next 64 uniformly distributed bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`. Multiply-shift, so biased by at most `n / 2^64`: irrelevant here.
    ///
    /// # Panics
    /// If `n` is zero.
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0, "SimRng::below(0)");
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// True with probability `numerator / denominator`.
    ///
    /// # Panics
    /// If `denominator` is zero.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}
