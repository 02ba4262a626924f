//! Feeds arbitrary bytes to the Kafka listener's decoders: the request header, then the body of
//! whatever served API and version the header names. Decoding must never panic and never
//! allocate by a count the input only announces (the fuzzer's memory limit catches that). Each
//! input is also tried under every served key and version, so that the body decoders see
//! arbitrary bytes without the fuzzer having to find a header first.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use shoal_kafka::request::Request;
use shoal_kafka::{Reader, RequestHeader, SERVED};

fuzz_target!(|data: &[u8]| {
    let frame = Bytes::copy_from_slice(data);
    let mut reader = Reader::new(frame.clone());
    if let Ok(header) = RequestHeader::decode(&mut reader) {
        let _ = Request::decode(&header, &mut reader);
    }
    for served in SERVED {
        for version in served.min_version..=served.max_version {
            let header = RequestHeader {
                api_key: served.key as i16,
                api_version: version,
                correlation_id: 0,
                client_id: None,
            };
            let _ = Request::decode(&header, &mut Reader::new(frame.clone()));
        }
    }
});
