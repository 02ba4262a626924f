//! Feeds arbitrary bytes to the wire header decoder and the replica body decoders. Decoding must
//! never panic; whatever decodes must re-encode to the same bytes and accept or reject its body
//! without panicking, and a replica body that decodes must re-encode to the same bytes too.
//!
//! Random bytes almost never carry a valid header checksum, so each input is also tried once more
//! with the checksum re-sealed; that is what lets the fuzzer reach the version, command, reserved
//! and size checks. When the re-sealed header fails only because `size` disagrees with its count
//! fields, it is tried a third time with that size, to reach the body decoders. The body
//! decoders also see the input's tail directly, with a count taken from the input, so that
//! their own length, limit, flag and ordering checks are fuzzed without a valid outer header.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_proto::wire::{
    Fields, HEADER_SIZE, Header, HeaderError, checksum_header, decode_commit_entries,
    decode_view_headers, encode_commit_entries, encode_view_headers,
};

/// Limits as the replica would pass them; small enough that a hostile count cannot allocate much.
const VIEW_HEADERS_MAX: usize = 128;
const COMMIT_ENTRIES_MAX: usize = 4096;

/// Offset of the `size` field in the common prefix (see docs/storage-format.md).
const OFF_SIZE: usize = 16;

fuzz_target!(|data: &[u8]| {
    check(data);

    if let Some(prefix) = data.first_chunk::<HEADER_SIZE>() {
        let mut message = data.to_vec();
        reseal(&mut message, prefix);
        check(&message);

        let prefix: [u8; HEADER_SIZE] = message[..HEADER_SIZE].try_into().unwrap();
        if let Err(HeaderError::SizeInconsistent { expected, .. }) = Header::decode(&prefix)
            && let Ok(size) = u32::try_from(expected)
        {
            message[OFF_SIZE..OFF_SIZE + 4].copy_from_slice(&size.to_le_bytes());
            let prefix: [u8; HEADER_SIZE] = message[..HEADER_SIZE].try_into().unwrap();
            reseal(&mut message, &prefix);
            check(&message);
        }
    }

    if let Some((count, rest)) = data.split_first_chunk::<4>() {
        let count = u32::from_le_bytes(*count);
        for with_flags in [false, true] {
            if let Ok((headers, flags)) =
                decode_view_headers(rest, count, with_flags, VIEW_HEADERS_MAX)
            {
                let flags = with_flags.then_some(&flags[..]);
                assert_eq!(encode_view_headers(&headers, flags), rest);
            }
        }
    }
});

fn reseal(message: &mut [u8], prefix: &[u8; HEADER_SIZE]) {
    let checksum = checksum_header(prefix);
    message[..4].copy_from_slice(&checksum.to_le_bytes());
}

fn check(data: &[u8]) {
    let Ok(header) = Header::decode_prefix(data) else {
        return;
    };
    assert_eq!(header.encode()[..], data[..HEADER_SIZE]);
    let body = &data[HEADER_SIZE..];
    // Replica bodies are decoded whether or not the body checksum matches: their decoders must
    // stand on their own against any bytes.
    match header.fields {
        Fields::Commit(_) => {
            if let Ok(entries) = decode_commit_entries(&header, body, COMMIT_ENTRIES_MAX) {
                assert_eq!(encode_commit_entries(&entries), body);
            }
        }
        Fields::DoViewChange(dvc) => {
            if let Ok((headers, flags)) =
                decode_view_headers(body, dvc.header_count, true, VIEW_HEADERS_MAX)
            {
                assert_eq!(encode_view_headers(&headers, Some(&flags)), body);
            }
        }
        Fields::StartView(start_view) => {
            if let Ok((headers, _)) =
                decode_view_headers(body, start_view.header_count, false, VIEW_HEADERS_MAX)
            {
                assert_eq!(encode_view_headers(&headers, None), body);
            }
        }
        _ => {}
    }
    if header.verify_body(body).is_ok() {
        assert_eq!(body.len(), header.body_size());
    }
}
