//! CRC-32C of long inputs by carry-less multiplication: four 512-bit accumulators take 256
//! bytes a round and are moved forward with `VPCLMULQDQ`, then folded into 16 bytes that the
//! `crc32c` crate finishes. On this project's machines a 64 KiB body takes about a quarter of
//! the time of the CRC-32C instruction alone, and every batch is checksummed at least once on
//! its way in (docs/benchmarks.md, "A wider CRC-32C").
//!
//! It owns only the arithmetic. It must give exactly what `crc32c::crc32c_append` gives for
//! every input, and it runs only where the CPU reports the instructions it is compiled for
//! (checked at run time); everywhere else the `crc32c` crate does the whole input.
//!
//! Why folding works: a 128-bit lane of message bits, read as a polynomial `A = L·x⁶⁴ + H`,
//! contributes `A·x^d` to the remainder of a message `d` bits longer. Replacing `x^(d+64)` and
//! `x^d` by their remainders mod P keeps the checksum and the lane at 128 bits, so a lane moves
//! `d` bits forward with two 64 × 64 carry-less products and is added to the lane found there.
//! What is left at the end is 16 bytes with the same remainder as everything folded into them.

#[cfg(target_arch = "x86_64")]
use super::x_pow_scaled;

/// Shorter inputs go to the `crc32c` crate whole: the wide path's setup and its final folds
/// cost about what the instruction takes for this many bytes.
#[cfg(target_arch = "x86_64")]
const WIDE_MIN_BYTES: usize = 512;

/// The CRC-32C of `bytes` continued from `crc` (a finished checksum, as `crc32c_append`
/// takes it).
pub(super) fn crc32c_append(crc: u32, bytes: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if bytes.len() >= WIDE_MIN_BYTES && x86::available() {
        // SAFETY: `available` saw the CPU report every feature `fold` is compiled with.
        return unsafe { x86::fold(crc, bytes) };
    }
    crc32c::crc32c_append(crc, bytes)
}

/// `x^n mod P`, bit-reflected (bit 31 is x⁰).
#[cfg(target_arch = "x86_64")]
const fn x_pow(n: u64) -> u32 {
    x_pow_scaled(n, 0)
}

/// The two 64-bit multipliers that move a 128-bit lane `distance_bits` forward: for its
/// first (low) and its second (high) half, `x^(d+63)` and `x^(d−1)` mod P as reflected 64-bit
/// polynomials. One power of x less than the lane's shift, because a carry-less product of two
/// reflected 64-bit values lands one bit short of the reflected 128-bit product.
#[cfg(target_arch = "x86_64")]
const fn fold_multipliers(distance_bits: u64) -> (u64, u64) {
    ((x_pow(distance_bits + 63) as u64) << 32, (x_pow(distance_bits - 1) as u64) << 32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::{
        __m128i, __m512i, _mm_clmulepi64_si128, _mm_set_epi64x, _mm_storeu_si128, _mm_xor_si128,
        _mm512_broadcast_i32x4, _mm512_clmulepi64_epi128, _mm512_extracti32x4_epi32,
        _mm512_loadu_si512, _mm512_set_epi64, _mm512_ternarylogic_epi64, _mm512_xor_si512,
    };

    use super::fold_multipliers;

    const ROUND_BYTES: usize = 256;
    const BLOCK_BYTES: usize = 64;
    // Constants, so that their powers of x are sure to be computed at compile time.
    const BY_ROUND: (u64, u64) = fold_multipliers(8 * ROUND_BYTES as u64);
    const BY_BLOCK: (u64, u64) = fold_multipliers(8 * BLOCK_BYTES as u64);
    const BY_THREE_LANES: (u64, u64) = fold_multipliers(384);
    const BY_TWO_LANES: (u64, u64) = fold_multipliers(256);
    const BY_ONE_LANE: (u64, u64) = fold_multipliers(128);

    /// Whether this CPU has what [`fold`] is compiled with (the answer is cached by `std`).
    pub(super) fn available() -> bool {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("vpclmulqdq")
            && std::is_x86_feature_detected!("pclmulqdq")
    }

    /// # Safety
    /// The CPU must have AVX-512F, VPCLMULQDQ and PCLMULQDQ ([`available`]).
    #[target_feature(enable = "avx512f,vpclmulqdq,pclmulqdq")]
    pub(super) unsafe fn fold(crc: u32, bytes: &[u8]) -> u32 {
        assert!(bytes.len() >= ROUND_BYTES);
        let load = |offset: usize| {
            let block = &bytes[offset..offset + BLOCK_BYTES];
            // SAFETY: the slice above is 64 bytes long, and the load takes any alignment.
            unsafe { _mm512_loadu_si512(block.as_ptr().cast()) }
        };
        let by_round = lanes(BY_ROUND);
        let by_block = lanes(BY_BLOCK);
        // A checksum continued from `crc` is the raw remainder of the message whose first 32
        // bits are xored with the running (inverted) state.
        let state = _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, i64::from(!crc));
        let mut accumulators =
            [_mm512_xor_si512(load(0), state), load(BLOCK_BYTES), load(128), load(192)];
        let mut offset = ROUND_BYTES;
        while offset + ROUND_BYTES <= bytes.len() {
            for (i, accumulator) in accumulators.iter_mut().enumerate() {
                *accumulator = fold_512(*accumulator, by_round, load(offset + i * BLOCK_BYTES));
            }
            offset += ROUND_BYTES;
        }
        let [first, second, third, fourth] = accumulators;
        let mut last = fold_512(first, by_block, second);
        last = fold_512(last, by_block, third);
        last = fold_512(last, by_block, fourth);
        while offset + BLOCK_BYTES <= bytes.len() {
            last = fold_512(last, by_block, load(offset));
            offset += BLOCK_BYTES;
        }
        let folded = _mm_xor_si128(
            _mm_xor_si128(
                fold_128(_mm512_extracti32x4_epi32::<0>(last), BY_THREE_LANES),
                fold_128(_mm512_extracti32x4_epi32::<1>(last), BY_TWO_LANES),
            ),
            _mm_xor_si128(
                fold_128(_mm512_extracti32x4_epi32::<2>(last), BY_ONE_LANE),
                _mm512_extracti32x4_epi32::<3>(last),
            ),
        );
        let mut remainder = [0u8; 16];
        // SAFETY: `remainder` is 16 bytes, and the store takes any alignment.
        unsafe { _mm_storeu_si128(remainder.as_mut_ptr().cast(), folded) };
        // The raw remainder of the 16 bytes from a zero state is that of everything folded
        // into them; a finished checksum from `u32::MAX` is its inverse, as `append` expects.
        let through_folded = crc32c::crc32c_append(u32::MAX, &remainder);
        crc32c::crc32c_append(through_folded, &bytes[offset..])
    }

    /// The multipliers in every 128-bit lane: the low half's in each lane's first 64 bits.
    #[target_feature(enable = "avx512f")]
    fn lanes((low, high): (u64, u64)) -> __m512i {
        _mm512_broadcast_i32x4(pair(low, high))
    }

    #[target_feature(enable = "avx512f")]
    fn pair(low: u64, high: u64) -> __m128i {
        _mm_set_epi64x(high as i64, low as i64)
    }

    /// Each lane of `accumulator` moved forward by the distance `multipliers` were made for,
    /// added to `next`.
    #[target_feature(enable = "avx512f,vpclmulqdq")]
    fn fold_512(accumulator: __m512i, multipliers: __m512i, next: __m512i) -> __m512i {
        let low = _mm512_clmulepi64_epi128::<0x00>(accumulator, multipliers);
        let high = _mm512_clmulepi64_epi128::<0x11>(accumulator, multipliers);
        // 0x96 is the truth table of a ^ b ^ c.
        _mm512_ternarylogic_epi64::<0x96>(low, high, next)
    }

    #[target_feature(enable = "avx512f,pclmulqdq")]
    fn fold_128(lane: __m128i, (low, high): (u64, u64)) -> __m128i {
        let multipliers = pair(low, high);
        _mm_xor_si128(
            _mm_clmulepi64_si128::<0x00>(lane, multipliers),
            _mm_clmulepi64_si128::<0x11>(lane, multipliers),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(len: usize, seed: u64) -> Vec<u8> {
        let mut state = seed | 1;
        (0..len)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect()
    }

    #[test]
    fn the_wide_path_agrees_with_the_crc32c_crate_at_every_length_and_start() {
        let data = bytes(4096 + 64, 7);
        for start in [0, 1, 3, 8, 63] {
            for len in 0..=4096 {
                let slice = &data[start..start + len];
                for crc in [0, u32::MAX, 0xDEAD_BEEF] {
                    assert_eq!(
                        crc32c_append(crc, slice),
                        crc32c::crc32c_append(crc, slice),
                        "start {start}, len {len}, crc {crc:#x}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_wide_path_agrees_with_the_crc32c_crate_on_large_inputs() {
        for (len, seed) in [(65_536, 1), (65_536 + 300, 2), (1 << 20, 3), ((1 << 20) + 4095, 4)] {
            let data = bytes(len, seed);
            assert_eq!(crc32c_append(0, &data), crc32c::crc32c(&data), "len {len}");
        }
    }

    #[test]
    fn the_fold_itself_agrees_with_the_crc32c_crate_where_the_cpu_has_it() {
        // The tests above go through the run-time check; this one calls the fold directly, so
        // that on this project's machines (which have the instructions) the wide arithmetic is
        // what is compared, whatever the dispatch does. Elsewhere the fold cannot run at all.
        #[cfg(target_arch = "x86_64")]
        if x86::available() {
            let data = bytes(70_000, 11);
            for len in [256, 257, 319, 320, 511, 512, 4096, 65_536, 70_000] {
                for crc in [0, u32::MAX, 0x1234_5678] {
                    // SAFETY: `available` saw the features `fold` is compiled with.
                    let wide = unsafe { x86::fold(crc, &data[..len]) };
                    assert_eq!(wide, crc32c::crc32c_append(crc, &data[..len]), "len {len}");
                }
            }
        } else {
            eprintln!("no AVX-512 VPCLMULQDQ here: only the crc32c crate's path was checked");
        }
    }

    #[test]
    fn a_flipped_bit_anywhere_changes_the_wide_checksum() {
        let data = bytes(1024, 9);
        let crc = crc32c_append(0, &data);
        for bit in (0..data.len() * 8).step_by(37) {
            let mut damaged = data.clone();
            damaged[bit / 8] ^= 1 << (bit % 8);
            assert_ne!(crc32c_append(0, &damaged), crc, "bit {bit}");
        }
    }
}
