//! CRC-32C arithmetic, so the produce path reads each byte once: a request body's checksum,
//! once verified, yields its batch's checksum, the batch's Kafka CRC and the stored prepare's
//! body checksum without another pass over the batch.
//!
//! CRC-32C is affine over GF(2): `crc(A ‖ B) = shift(crc(A), |B|) ⊕ crc(B)`, where `shift` is
//! linear and costs O(log |B|), independent of the bytes (`crc32c::crc32c_combine`). This module
//! only derives checksums from others it is given; it never decides whether one is trusted —
//! the caller derives only from checksums it has verified.

/// The CRC-32C of `bytes` (one pass), for crates that compute the checksum the others derive
/// from.
#[must_use]
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}

/// The CRC-32C of `whole[prefix.len()..]`, from the CRC-32C of `whole` and its first bytes
/// `prefix`: one pass over the prefix instead of one over the suffix.
#[must_use]
pub fn suffix(crc_whole: u32, prefix: &[u8], suffix_len: usize) -> u32 {
    crc_whole ^ crc32c::crc32c_combine(crc32c::crc32c(prefix), 0, suffix_len)
}

/// The CRC-32C of `A ‖ B` from the CRC-32C of each and the length of `B`.
#[must_use]
pub fn concat(crc_a: u32, crc_b: u32, len_b: usize) -> u32 {
    crc32c::crc32c_combine(crc_a, crc_b, len_b)
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
    fn a_damaged_suffix_does_not_match_the_derived_checksum() {
        let whole = bytes(1_000);
        let derived = suffix(crc32c::crc32c(&whole), &whole[..100], 900);
        let mut damaged = whole[100..].to_vec();
        damaged[450] ^= 1;
        assert_ne!(derived, crc32c::crc32c(&damaged));
    }
}
