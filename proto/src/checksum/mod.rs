//! CRC-32C arithmetic, so the produce path reads each byte once: a request body's checksum,
//! once verified, yields its batch's checksum, the batch's Kafka CRC and the stored prepare's
//! body checksum without another pass over the batch.
//!
//! CRC-32C is affine over GF(2): `crc(A ‖ B) = shift(crc(A), |B|) ⊕ crc(B)`, where `shift` is
//! linear and costs O(log |B|), independent of the bytes (`crc32c::crc32c_combine`). This module
//! only derives checksums from others it is given; it never decides whether one is trusted —
//! the caller derives only from checksums it has verified.

mod wide;

/// The CRC-32C of `bytes` (one pass), for crates that compute the checksum the others derive
/// from. Long inputs take the wide path where the CPU has it ([`wide`]).
#[must_use]
pub fn crc32c(bytes: &[u8]) -> u32 {
    wide::crc32c_append(0, bytes)
}

/// The CRC-32C of `bytes` continued from `crc`, the finished checksum of what came before
/// (as `crc32c::crc32c_append`).
#[must_use]
pub fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    wide::crc32c_append(crc, bytes)
}

/// The CRC-32C of `whole[prefix.len()..]`, from the CRC-32C of `whole` and its first bytes
/// `prefix`: one pass over the prefix instead of one over the suffix.
#[must_use]
pub fn suffix(crc_whole: u32, prefix: &[u8], suffix_len: usize) -> u32 {
    crc_whole ^ shift(crc32c(prefix), suffix_len)
}

/// The CRC-32C of `A ‖ B` from the CRC-32C of each and the length of `B`.
#[must_use]
pub fn concat(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    Shift::new(len_b).concat(crc_a, crc_b)
}

/// [`concat`] for one length of `B`, with its power of x computed once: for callers that
/// concatenate many checksums whose second parts have the same length (a producer's batches
/// often do), where computing the power each time shows in a profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shift {
    len_bytes: usize,
    power: u32,
}

impl Shift {
    /// The shift over `len_bytes` bytes.
    #[must_use]
    pub fn new(len_bytes: usize) -> Self {
        Self { len_bytes, power: power_of(len_bytes) }
    }

    /// The length it shifts over.
    #[must_use]
    pub fn len_bytes(&self) -> usize {
        self.len_bytes
    }

    /// The CRC-32C of `A ‖ B` from the CRC-32C of each, `B` being [`Shift::len_bytes`] long.
    #[must_use]
    pub fn concat(&self, crc_a: u32, crc_b: u32) -> u32 {
        multiply(self.power, crc_a) ^ crc_b
    }
}

/// CRC-32C's polynomial, bit-reflected (bit 31 is x⁰).
const POLYNOMIAL: u32 = 0x82F6_3B78;

/// `x^(2^k) mod P` for k = 0..67: the powers `shift` multiplies together (a byte count of up
/// to 64 bits is up to 2^67 bits).
const X_POW_2K: [u32; 67] = {
    let mut table = [0u32; 67];
    table[0] = 1 << 30; // x¹
    let mut k = 1;
    while k < 67 {
        table[k] = multiply(table[k - 1], table[k - 1]);
        k += 1;
    }
    table
};

/// `crc · x^(8·len) mod P`: what appending `len` bytes does to a checksum's contribution. About
/// 64 multiplications of 32 steps for any `len` (the `crc32c` crate's own combine squares a
/// 32 × 32 matrix per bit of `len`, which costs as much as checksumming a large batch).
fn shift(crc: u32, len: usize) -> u32 {
    multiply(power_of(len), crc)
}

/// `x^(8·len) mod P`.
fn power_of(len: usize) -> u32 {
    x_pow_scaled(len as u64, 3) // a byte is x⁸ = x^(2³)
}

/// `x^(n · 2^shift) mod P`: the product of `x^(2^(k + shift))` over the set bits `k` of `n`.
const fn x_pow_scaled(n: u64, shift: usize) -> u32 {
    let mut power: u32 = 1 << 31; // x⁰
    let mut rest = n;
    let mut k = shift;
    while rest != 0 {
        if rest & 1 != 0 {
            power = multiply(X_POW_2K[k], power);
        }
        rest >>= 1;
        k += 1;
    }
    power
}

/// `a · b mod P` in the bit-reflected representation.
const fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit: u32 = 1 << 31;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        b = if b & 1 != 0 { (b >> 1) ^ POLYNOMIAL } else { b >> 1 };
        bit >>= 1;
    }
    product
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 131 + 7) as u8).collect()
    }

    #[test]
    fn a_suffix_checksum_derived_from_the_whole_equals_one_computed_directly() {
        let whole = bytes(10_000);
        for split in [0, 1, 21, 61, 4096, 9_999, 10_000] {
            let crc_whole = crc32c::crc32c(&whole);
            let derived = suffix(crc_whole, &whole[..split], whole.len() - split);
            assert_eq!(derived, crc32c::crc32c(&whole[split..]), "split at {split}");
        }
    }

    #[test]
    fn concatenated_checksums_equal_the_checksum_of_the_concatenation() {
        let whole = bytes(5_000);
        for split in [0, 1, 16, 256, 5_000] {
            let (a, b) = whole.split_at(split);
            let crc = concat(crc32c::crc32c(a), crc32c::crc32c(b), b.len());
            assert_eq!(crc, crc32c::crc32c(&whole), "split at {split}");
        }
    }

    #[test]
    fn concatenation_agrees_with_the_crc32c_crates_combine_at_any_length() {
        // An empty B has CRC 0, whatever else a caller might pass.
        assert_eq!(concat(0xDEAD_BEEF, 0, 0), crc32c::crc32c_combine(0xDEAD_BEEF, 0, 0));
        for len in [1usize, 7, 8, 255, 4096, 1 << 20, (1 << 32) + 5, usize::MAX >> 3] {
            for (a, b) in [(0u32, 0u32), (0xDEAD_BEEF, 0x1234_5678), (u32::MAX, 1)] {
                assert_eq!(concat(a, b, len), crc32c::crc32c_combine(a, b, len), "len {len}");
            }
        }
    }

    #[test]
    fn a_shift_computed_once_concatenates_as_concat_does() {
        for len in [0usize, 1, 255, 16_128, 1 << 20, usize::MAX >> 3] {
            let shift = Shift::new(len);
            assert_eq!(shift.len_bytes(), len);
            for (a, b) in [(0u32, 0u32), (0xDEAD_BEEF, 0x1234_5678), (u32::MAX, 1)] {
                assert_eq!(shift.concat(a, b), concat(a, b, len), "len {len}");
            }
        }
    }

    #[test]
    fn a_damaged_suffix_does_not_match_the_derived_checksum() {
        let whole = bytes(1_000);
        let derived = suffix(crc32c::crc32c(&whole), &whole[..100], 900);
        let mut damaged = whole[100..].to_vec();
        damaged[450] ^= 1;
        assert_ne!(derived, crc32c::crc32c(&damaged));
    }
}
