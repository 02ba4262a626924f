//! Each decoder against requests the codec crate encodes (as clients would), version by
//! version, and against hostile bytes.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{self, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;

use super::*;
use crate::error::DecodeError;
use crate::read::Reader;

fn encoded<M: Encodable>(message: &M, version: i16) -> Reader {
    let mut out = BytesMut::new();
    message.encode(&mut out, version).unwrap();
    Reader::new(out.freeze())
}

#[test]
fn metadata_requests_of_every_version_decode_as_sent() {
    for version in 0..=12 {
        let topic = |name: &str| {
            messages::metadata_request::MetadataRequestTopic::default()
                .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
        };
        let sent = messages::MetadataRequest::default()
            .with_topics(Some(vec![topic("orders"), topic("payments")]))
            .with_allow_auto_topic_creation(version < 4);
        let mut reader = encoded(&sent, version);
        let got = MetadataRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        let names: Vec<_> = got.topics.unwrap().into_iter().map(|t| t.name.unwrap()).collect();
        assert_eq!(names, ["orders", "payments"], "v{version}");
        assert_eq!(got.allow_auto_topic_creation, version < 4, "v{version}");
        // "Every topic": null from v1, and an empty list in v0.
        let all = messages::MetadataRequest::default().with_topics(if version == 0 {
            Some(Vec::new())
        } else {
            None
        });
        let got = MetadataRequest::decode(&mut encoded(&all, version), version).unwrap();
        assert_eq!(got.topics, None, "v{version}");
    }
}

#[test]
fn produce_requests_of_every_version_decode_as_sent_with_the_records_as_slices() {
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    for version in 3..=10 {
        let partition = |index, records: &'static [u8]| {
            PartitionProduceData::default()
                .with_index(index)
                .with_records(Some(Bytes::from_static(records)))
        };
        let sent = messages::ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(30_000)
            .with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_static_str("orders")))
                    .with_partition_data(vec![partition(0, b"batch zero"), partition(2, b"two")]),
            ]);
        let mut reader = encoded(&sent, version);
        let got = ProduceRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        assert_eq!((got.acks, got.timeout_ms, got.transactional_id), (-1, 30_000, None));
        assert_eq!(got.topics.len(), 1);
        assert_eq!(got.topics[0].name, "orders");
        let partitions: Vec<(i32, Option<Bytes>)> =
            got.topics[0].partitions.iter().map(|p| (p.index, p.records.clone())).collect();
        let expected =
            [(0, Some(Bytes::from_static(b"batch zero"))), (2, Some(Bytes::from_static(b"two")))];
        assert_eq!(partitions, expected, "v{version}");
    }
}

#[test]
fn list_offsets_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    for version in 1..=6 {
        let partition = |index, timestamp| {
            ListOffsetsPartition::default().with_partition_index(index).with_timestamp(timestamp)
        };
        let sent = messages::ListOffsetsRequest::default().with_topics(vec![
            ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_static_str("orders")))
                .with_partitions(vec![partition(0, -1), partition(3, 1_700_000_000_000)]),
        ]);
        let mut reader = encoded(&sent, version);
        let got = ListOffsetsRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        assert_eq!(got.topics[0].name, "orders");
        let asked: Vec<(i32, i64)> =
            got.topics[0].partitions.iter().map(|p| (p.index, p.timestamp)).collect();
        assert_eq!(asked, [(0, -1), (3, 1_700_000_000_000)], "v{version}");
    }
}

#[test]
fn fetch_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
    for version in 4..=16 {
        let partition = |index, offset| {
            FetchPartition::default()
                .with_partition(index)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)
        };
        let topic = FetchTopic::default().with_partitions(vec![partition(0, 5), partition(2, 9)]);
        let topic = if version >= 13 {
            topic.with_topic_id(crate::Uuid::from_bytes([7; 16]))
        } else {
            topic.with_topic(TopicName(StrBytes::from_static_str("orders")))
        };
        let mut sent = messages::FetchRequest::default()
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(50 << 20)
            .with_topics(vec![topic]);
        if version >= 7 {
            let forgotten = ForgottenTopic::default().with_partitions(vec![1]);
            let forgotten = if version >= 13 {
                forgotten.with_topic_id(crate::Uuid::from_bytes([8; 16]))
            } else {
                forgotten.with_topic(TopicName(StrBytes::from_static_str("old")))
            };
            sent = sent.with_forgotten_topics_data(vec![forgotten]);
        }
        if version <= 14 {
            sent = sent.with_replica_id(kafka_protocol::messages::BrokerId(-1));
        }
        let mut reader = encoded(&sent, version);
        let got = FetchRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        assert_eq!((got.max_wait_ms, got.min_bytes, got.max_bytes), (500, 1, 50 << 20));
        let topic = &got.topics[0];
        if version >= 13 {
            assert_eq!((topic.name.as_deref(), topic.topic_id), (None, [7; 16]));
        } else {
            assert_eq!(topic.name.as_deref(), Some("orders"));
        }
        let asked: Vec<(i32, i64, i32)> = topic
            .partitions
            .iter()
            .map(|p| (p.index, p.fetch_offset, p.partition_max_bytes))
            .collect();
        assert_eq!(asked, [(0, 5, 1 << 20), (2, 9, 1 << 20)], "v{version}");
    }
}

#[test]
fn init_producer_id_requests_of_every_version_decode_as_sent() {
    for version in 0..=4 {
        let sent = messages::InitProducerIdRequest::default()
            .with_transactional_id(None)
            .with_transaction_timeout_ms(60_000)
            .with_producer_id(kafka_protocol::messages::ProducerId(if version >= 3 {
                7
            } else {
                -1
            }))
            .with_producer_epoch(if version >= 3 { 2 } else { -1 });
        let mut reader = encoded(&sent, version);
        let got = InitProducerIdRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        assert_eq!(got.transactional_id, None);
    }
}

#[test]
fn api_versions_requests_of_every_version_decode_as_sent() {
    for version in 0..=4 {
        let sent = messages::ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("librdkafka"))
            .with_client_software_version(StrBytes::from_static_str("2.0.2"));
        let mut reader = encoded(&sent, version);
        let got = ApiVersionsRequest::decode(&mut reader, version).unwrap();
        assert_eq!(reader.remaining(), 0, "v{version}");
        let name = got.client_software_name.as_deref();
        assert_eq!(name, if version >= 3 { Some("librdkafka") } else { None });
    }
}

/// Two billion topics announced in a few bytes are refused before anything is sized by them.
#[test]
fn a_count_larger_than_the_frame_is_refused_before_allocating() {
    let frame = Bytes::from_static(&[0x7f, 0xff, 0xff, 0xff, 0, 1, b'a']);
    let error = MetadataRequest::decode(&mut Reader::new(frame), 1).unwrap_err();
    assert!(matches!(error, DecodeError::TooMany { count: 2_147_483_647, .. }), "{error}");
    // Within the bound but more than the bytes left.
    let frame = Bytes::from_static(&[0, 0, 0x10, 0, 0, 1, b'a']);
    let error = MetadataRequest::decode(&mut Reader::new(frame), 1).unwrap_err();
    assert!(matches!(error, DecodeError::Truncated { .. }), "{error}");
    // The compact form: a 5-byte varint near u32::MAX.
    let frame = Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    let error = MetadataRequest::decode(&mut Reader::new(frame), 9).unwrap_err();
    assert!(matches!(error, DecodeError::TooMany { .. }), "{error}");
}

#[test]
fn varints_over_32_bits_and_bad_utf8_are_refused() {
    let mut reader = Reader::new(Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0x1f]));
    assert!(matches!(reader.uvarint("x"), Err(DecodeError::Invalid { .. })));
    let mut reader = Reader::new(Bytes::from_static(&[0, 2, 0xc3, 0x28]));
    assert!(matches!(reader.string("x", false), Err(DecodeError::Invalid { .. })));
    let mut reader = Reader::new(Bytes::from_static(&[0xff, 0xfe]));
    assert!(matches!(reader.nullable_string("x", false), Err(DecodeError::Invalid { .. })));
}

/// Every served key and version has a decoder (the dispatch never reaches its `unreachable!`),
/// and no other key or version is decoded.
#[test]
fn every_served_version_has_a_decoder_and_nothing_else_does() {
    use kafka_protocol::messages::ApiKey;
    for key in (0..100).filter_map(|key| ApiKey::try_from(key).ok()) {
        for version in -1..20 {
            let header = crate::RequestHeader {
                api_key: key as i16,
                api_version: version,
                correlation_id: 1,
                client_id: None,
            };
            let decoded = Request::decode(&header, &mut Reader::new(Bytes::new()));
            assert_eq!(decoded.is_some(), crate::serves(key, version), "{key:?} v{version}");
        }
    }
}

proptest! {
    /// Any bytes, any version: an error or a request, never a panic.
    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256), version in 0i16..=12) {
        let _ = MetadataRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version);
        let _ = InitProducerIdRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(0, 4));
        let _ = FetchRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(4, 16));
        let _ = ListOffsetsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(1, 6));
        let _ = ProduceRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(3, 10));
        let _ = ApiVersionsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(4));
        let mut reader = Reader::new(Bytes::from(bytes));
        if let Ok(header) = crate::RequestHeader::decode(&mut reader) {
            let _ = Request::decode(&header, &mut reader);
        }
    }
}
