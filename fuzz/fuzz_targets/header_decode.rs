//! Feeds arbitrary bytes to the wire header decoder. Decoding must never panic, and whatever
//! decodes must re-encode to the same bytes and accept or reject its body without panicking.
//!
//! Random bytes almost never carry a valid header checksum, so each input is also tried once more
//! with the checksum re-sealed; that is what lets the fuzzer reach the version, command, reserved
//! and size checks.

#![no_main]

use libfuzzer_sys::fuzz_target;
use shoal_engine::wire::{HEADER_SIZE, Header, checksum_header};

fuzz_target!(|data: &[u8]| {
    check(data);

    if let Some(prefix) = data.first_chunk::<HEADER_SIZE>() {
        let mut message = data.to_vec();
        let checksum = checksum_header(prefix);
        message[..4].copy_from_slice(&checksum.to_le_bytes());
        check(&message);
    }
});

fn check(data: &[u8]) {
    let Ok(header) = Header::decode_prefix(data) else {
        return;
    };
    assert_eq!(header.encode()[..], data[..HEADER_SIZE]);
    let body = &data[HEADER_SIZE..];
    if header.verify_body(body).is_ok() {
        assert_eq!(body.len(), header.body_size());
    }
}
