//! Each decoder against requests the codec crate encodes (as clients would), version by
//! version, and against hostile bytes.

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{self, GroupId, TopicName};
use kafka_protocol::protocol::{Encodable, StrBytes};
use proptest::prelude::*;

use super::*;
use crate::error::DecodeError;
use crate::read::Reader;

fn encoded<M: Encodable>(message: &M, version: i16) -> Reader {
    Reader::new(frame(message, version))
}

/// The body the codec crate encodes for `message` at `version`.
fn frame<M: Encodable>(message: &M, version: i16) -> Bytes {
    let mut out = BytesMut::new();
    message.encode(&mut out, version).unwrap();
    out.freeze()
}

/// `frame` decoded at `version` with nothing left over; every shorter prefix of it is refused
/// (an error, not a panic, and never a request read from part of the frame).
fn decoded_whole<T: std::fmt::Debug>(
    frame: &Bytes,
    version: i16,
    decode: fn(&mut Reader, i16) -> Result<T, DecodeError>,
) -> T {
    for len in 0..frame.len() {
        let got = decode(&mut Reader::new(frame.slice(..len)), version);
        assert!(got.is_err(), "v{version}: {len} of {} bytes read as {got:?}", frame.len());
    }
    let mut reader = Reader::new(frame.clone());
    let got = decode(&mut reader, version).unwrap();
    assert_eq!(reader.remaining(), 0, "v{version}");
    got
}

/// A count in the classic form (an i32 array count; as an i16 string length, `0x7fff`) far
/// larger than any frame.
const HUGE: &[u8] = &[0x7f, 0xff, 0xff, 0xff];
/// The compact form: a 5-byte varint near `u32::MAX`.
const HUGE_COMPACT: &[u8] = &[0xff, 0xff, 0xff, 0xff, 0x0f];

/// A frame of `parts` one after the other.
fn body(parts: &[&[u8]]) -> Reader {
    Reader::new(Bytes::from(parts.concat()))
}

/// Refused for its count before anything is allocated.
fn too_many<T: std::fmt::Debug>(got: Result<T, DecodeError>) {
    assert!(matches!(got, Err(DecodeError::TooMany { .. })), "{got:?}");
}

/// Refused for a count or length the frame does not hold.
fn truncated<T: std::fmt::Debug>(got: Result<T, DecodeError>) {
    assert!(matches!(got, Err(DecodeError::Truncated { .. })), "{got:?}");
}

/// Whether `bytes` lies inside `frame` (handed out as a slice, not copied).
fn is_slice_of(bytes: &Bytes, frame: &Bytes) -> bool {
    frame.as_ptr_range().contains(&bytes.as_ptr())
}

fn text(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn group(name: &str) -> GroupId {
    GroupId(text(name))
}

fn topic_name(name: &str) -> TopicName {
    TopicName(text(name))
}

/// An unknown tagged field a newer client might send, for flexible versions to skip.
fn tag() -> Bytes {
    Bytes::from_static(b"future field")
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
    for version in 1..=7 {
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

#[test]
fn find_coordinator_requests_of_every_version_decode_as_sent() {
    for version in 0..=6 {
        let mut sent = messages::FindCoordinatorRequest::default();
        let mut sent_keys = vec!["orders-app".to_string()];
        if version <= 3 {
            sent = sent.with_key(text("orders-app"));
        } else {
            sent_keys.push("billing".to_string());
            sent = sent.with_coordinator_keys(sent_keys.iter().map(|key| text(key)).collect());
        }
        if version >= 1 {
            sent = sent.with_key_type(TRANSACTION_KEY_TYPE);
        }
        if version >= 3 {
            sent = sent.with_unknown_tagged_field(9, tag());
        }
        let got = decoded_whole(&frame(&sent, version), version, FindCoordinatorRequest::decode);
        let key_type = if version >= 1 { TRANSACTION_KEY_TYPE } else { GROUP_KEY_TYPE };
        assert_eq!(got, FindCoordinatorRequest { key_type, keys: sent_keys }, "v{version}");
    }
    // A v4+ batch may be empty.
    for version in 4..=6 {
        let sent = messages::FindCoordinatorRequest::default();
        let got = decoded_whole(&frame(&sent, version), version, FindCoordinatorRequest::decode);
        assert_eq!(got, FindCoordinatorRequest { key_type: GROUP_KEY_TYPE, keys: Vec::new() });
    }
}

#[test]
fn join_group_requests_of_every_version_decode_as_sent_with_the_metadata_as_slices() {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    for version in 0..=7 {
        for instance in [None, Some("consumer-host-1")] {
            if instance.is_some() && version < 5 {
                continue;
            }
            let flexible = version >= 6;
            let protocol = |name: &str, metadata: &'static [u8]| {
                let protocol = JoinGroupRequestProtocol::default()
                    .with_name(text(name))
                    .with_metadata(Bytes::from_static(metadata));
                if flexible { protocol.with_unknown_tagged_field(3, tag()) } else { protocol }
            };
            let mut sent = messages::JoinGroupRequest::default()
                .with_group_id(group("orders-app"))
                .with_session_timeout_ms(45_000)
                .with_rebalance_timeout_ms(if version >= 1 { 300_000 } else { 0 })
                .with_member_id(text(if instance.is_some() { "" } else { "member-7" }))
                .with_group_instance_id(instance.map(text))
                .with_protocol_type(text("consumer"))
                .with_protocols(vec![
                    protocol("cooperative-sticky", b"\x00\x03subscription"),
                    protocol("range", b""),
                ]);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let frame = frame(&sent, version);
            let got = decoded_whole(&frame, version, JoinGroupRequest::decode);
            let expected = JoinGroupRequest {
                group_id: "orders-app".to_string(),
                session_timeout_ms: 45_000,
                // v0 has no rebalance timeout: the session timeout stands for it.
                rebalance_timeout_ms: if version >= 1 { 300_000 } else { 45_000 },
                member_id: if instance.is_some() { "" } else { "member-7" }.to_string(),
                group_instance_id: instance.map(str::to_string),
                protocol_type: "consumer".to_string(),
                protocols: vec![
                    JoinGroupProtocol {
                        name: "cooperative-sticky".to_string(),
                        metadata: Bytes::from_static(b"\x00\x03subscription"),
                    },
                    JoinGroupProtocol { name: "range".to_string(), metadata: Bytes::new() },
                ],
            };
            assert_eq!(got, expected, "v{version}");
            assert!(is_slice_of(&got.protocols[0].metadata, &frame), "v{version}");
        }
    }
}

#[test]
fn sync_group_requests_of_every_version_decode_as_sent_with_the_assignments_as_slices() {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    for version in 0..=5 {
        for (instance, protocol) in [(None, None), (Some("consumer-host-1"), Some("range"))] {
            if (instance.is_some() && version < 3) || (protocol.is_some() && version < 5) {
                continue;
            }
            let flexible = version >= 4;
            let assignment = |member: &str, assignment: &'static [u8]| {
                let assignment = SyncGroupRequestAssignment::default()
                    .with_member_id(text(member))
                    .with_assignment(Bytes::from_static(assignment));
                if flexible { assignment.with_unknown_tagged_field(1, tag()) } else { assignment }
            };
            let mut sent = messages::SyncGroupRequest::default()
                .with_group_id(group("orders-app"))
                .with_generation_id(12)
                .with_member_id(text("member-7"))
                .with_group_instance_id(instance.map(text))
                .with_protocol_type(protocol.map(|_| text("consumer")))
                .with_protocol_name(protocol.map(text))
                .with_assignments(vec![
                    assignment("member-7", b"\x00\x01partitions"),
                    assignment("member-8", b""),
                ]);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let frame = frame(&sent, version);
            let got = decoded_whole(&frame, version, SyncGroupRequest::decode);
            let expected = SyncGroupRequest {
                group_id: "orders-app".to_string(),
                generation_id: 12,
                member_id: "member-7".to_string(),
                group_instance_id: instance.map(str::to_string),
                protocol_type: protocol.map(|_| "consumer".to_string()),
                protocol_name: protocol.map(str::to_string),
                assignments: vec![
                    SyncGroupAssignment {
                        member_id: "member-7".to_string(),
                        assignment: Bytes::from_static(b"\x00\x01partitions"),
                    },
                    SyncGroupAssignment {
                        member_id: "member-8".to_string(),
                        assignment: Bytes::new(),
                    },
                ],
            };
            assert_eq!(got, expected, "v{version}");
            assert!(is_slice_of(&got.assignments[0].assignment, &frame), "v{version}");
        }
        // A follower sends no assignments.
        let sent = messages::SyncGroupRequest::default()
            .with_group_id(group("orders-app"))
            .with_member_id(text("member-8"));
        let got = decoded_whole(&frame(&sent, version), version, SyncGroupRequest::decode);
        assert!(got.assignments.is_empty(), "v{version}");
    }
}

#[test]
fn heartbeat_requests_of_every_version_decode_as_sent() {
    for version in 0..=4 {
        for instance in [None, Some("consumer-host-1")] {
            if instance.is_some() && version < 3 {
                continue;
            }
            let mut sent = messages::HeartbeatRequest::default()
                .with_group_id(group("orders-app"))
                .with_generation_id(12)
                .with_member_id(text("member-7"))
                .with_group_instance_id(instance.map(text));
            if version >= 4 {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got = decoded_whole(&frame(&sent, version), version, HeartbeatRequest::decode);
            let expected = HeartbeatRequest {
                group_id: "orders-app".to_string(),
                generation_id: 12,
                member_id: "member-7".to_string(),
                group_instance_id: instance.map(str::to_string),
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn leave_group_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    for version in 0..=5 {
        let flexible = version >= 4;
        let mut sent = messages::LeaveGroupRequest::default().with_group_id(group("orders-app"));
        let expected_members = if version <= 2 {
            sent = sent.with_member_id(text("member-7"));
            vec![LeavingMember { member_id: "member-7".to_string(), group_instance_id: None }]
        } else {
            let member = |member: &str, instance: Option<&str>| {
                let member = MemberIdentity::default()
                    .with_member_id(text(member))
                    .with_group_instance_id(instance.map(text))
                    .with_reason((version >= 5).then(|| text("the consumer is closing")));
                if flexible { member.with_unknown_tagged_field(2, tag()) } else { member }
            };
            sent = sent
                .with_members(vec![member("member-7", None), member("", Some("consumer-host-1"))]);
            vec![
                LeavingMember { member_id: "member-7".to_string(), group_instance_id: None },
                LeavingMember {
                    member_id: String::new(),
                    group_instance_id: Some("consumer-host-1".to_string()),
                },
            ]
        };
        if flexible {
            sent = sent.with_unknown_tagged_field(0, tag());
        }
        let got = decoded_whole(&frame(&sent, version), version, LeaveGroupRequest::decode);
        let expected =
            LeaveGroupRequest { group_id: "orders-app".to_string(), members: expected_members };
        assert_eq!(got, expected, "v{version}");
    }
}

#[test]
fn offset_commit_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    for version in 2..=9 {
        for instance in [None, Some("consumer-host-1")] {
            if instance.is_some() && version < 7 {
                continue;
            }
            let flexible = version >= 8;
            let partition = |index, offset, metadata: Option<&str>| {
                let partition = OffsetCommitRequestPartition::default()
                    .with_partition_index(index)
                    .with_committed_offset(offset)
                    .with_committed_leader_epoch(if version >= 6 { 4 } else { -1 })
                    .with_committed_metadata(metadata.map(text));
                if flexible { partition.with_unknown_tagged_field(1, tag()) } else { partition }
            };
            let topic = |name: &str, partitions| {
                let topic = OffsetCommitRequestTopic::default()
                    .with_name(topic_name(name))
                    .with_partitions(partitions);
                if flexible { topic.with_unknown_tagged_field(1, tag()) } else { topic }
            };
            let mut sent = messages::OffsetCommitRequest::default()
                .with_group_id(group("orders-app"))
                .with_generation_id_or_member_epoch(12)
                .with_member_id(text("member-7"))
                .with_group_instance_id(instance.map(text))
                .with_retention_time_ms(if version <= 4 { 86_400_000 } else { -1 })
                .with_topics(vec![
                    topic(
                        "orders",
                        vec![partition(0, 1_000, Some("checkpoint 3")), partition(5, 0, None)],
                    ),
                    topic("payments", vec![partition(1, 42, Some(""))]),
                ]);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got = decoded_whole(&frame(&sent, version), version, OffsetCommitRequest::decode);
            // Before v6 no epoch is sent, and it reads as unknown.
            let committed_leader_epoch = if version >= 6 { 4 } else { -1 };
            let partition =
                |index, committed_offset, metadata: Option<&str>| OffsetCommitPartition {
                    index,
                    committed_offset,
                    committed_leader_epoch,
                    committed_metadata: metadata.map(str::to_string),
                };
            let expected = OffsetCommitRequest {
                group_id: "orders-app".to_string(),
                generation_id_or_member_epoch: 12,
                member_id: "member-7".to_string(),
                group_instance_id: instance.map(str::to_string),
                topics: vec![
                    OffsetCommitTopic {
                        name: "orders".to_string(),
                        partitions: vec![
                            partition(0, 1_000, Some("checkpoint 3")),
                            partition(5, 0, None),
                        ],
                    },
                    OffsetCommitTopic {
                        name: "payments".to_string(),
                        partitions: vec![partition(1, 42, Some(""))],
                    },
                ],
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn offset_fetch_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    let expected_topics = || {
        vec![
            OffsetFetchTopic { name: "orders".to_string(), partitions: vec![0, 1, 5] },
            OffsetFetchTopic { name: "payments".to_string(), partitions: Vec::new() },
        ]
    };
    for version in 1..=7 {
        let flexible = version >= 6;
        let topic = |name: &str, partitions: Vec<i32>| {
            let topic = OffsetFetchRequestTopic::default()
                .with_name(topic_name(name))
                .with_partition_indexes(partitions);
            if flexible { topic.with_unknown_tagged_field(1, tag()) } else { topic }
        };
        // Named topics, and (v2+) every topic.
        let named = Some(vec![topic("orders", vec![0, 1, 5]), topic("payments", Vec::new())]);
        for (topics, expected) in [(named, Some(expected_topics())), (None, None)] {
            if topics.is_none() && version < 2 {
                continue;
            }
            let mut sent = messages::OffsetFetchRequest::default()
                .with_group_id(group("orders-app"))
                .with_topics(topics)
                .with_require_stable(version >= 7);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got = decoded_whole(&frame(&sent, version), version, OffsetFetchRequest::decode);
            let expected = OffsetFetchRequest {
                groups: vec![OffsetFetchGroup {
                    group_id: "orders-app".to_string(),
                    topics: expected,
                }],
                require_stable: version >= 7,
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
    for version in 8..=9 {
        let topic = |name: &str, partitions: Vec<i32>| {
            OffsetFetchRequestTopics::default()
                .with_name(topic_name(name))
                .with_partition_indexes(partitions)
                .with_unknown_tagged_field(1, tag())
        };
        let group = |id: &str, topics| {
            let group = OffsetFetchRequestGroup::default()
                .with_group_id(group(id))
                .with_topics(topics)
                .with_unknown_tagged_field(1, tag());
            if version >= 9 {
                group.with_member_id(Some(text("member-7"))).with_member_epoch(3)
            } else {
                group
            }
        };
        let sent = messages::OffsetFetchRequest::default()
            .with_groups(vec![
                group(
                    "orders-app",
                    Some(vec![topic("orders", vec![0, 1, 5]), topic("payments", Vec::new())]),
                ),
                group("billing", None),
                group("empty", Some(Vec::new())),
            ])
            .with_require_stable(true)
            .with_unknown_tagged_field(0, tag());
        let got = decoded_whole(&frame(&sent, version), version, OffsetFetchRequest::decode);
        let expected = OffsetFetchRequest {
            groups: vec![
                OffsetFetchGroup {
                    group_id: "orders-app".to_string(),
                    topics: Some(expected_topics()),
                },
                OffsetFetchGroup { group_id: "billing".to_string(), topics: None },
                OffsetFetchGroup { group_id: "empty".to_string(), topics: Some(Vec::new()) },
            ],
            require_stable: true,
        };
        assert_eq!(got, expected, "v{version}");
    }
}

/// "Every topic" (a null list) came with v2: in v1 it is refused, not read as every topic.
#[test]
fn a_null_offset_fetch_topic_list_is_refused_in_v1() {
    let sent = messages::OffsetFetchRequest::default()
        .with_group_id(group("orders-app"))
        .with_topics(None);
    let error = OffsetFetchRequest::decode(&mut encoded(&sent, 1), 1).unwrap_err();
    assert!(matches!(error, DecodeError::Invalid { what: "offset fetch topics", .. }), "{error}");
}

#[test]
fn offset_for_leader_epoch_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    for version in 2..=4 {
        let flexible = version >= 4;
        let partition = |index, current, epoch| {
            let partition = OffsetForLeaderPartition::default()
                .with_partition(index)
                .with_current_leader_epoch(current)
                .with_leader_epoch(epoch);
            if flexible { partition.with_unknown_tagged_field(1, tag()) } else { partition }
        };
        let topic = OffsetForLeaderTopic::default()
            .with_topic(topic_name("orders"))
            .with_partitions(vec![partition(0, 7, 6), partition(3, -1, 2)]);
        let topic = if flexible { topic.with_unknown_tagged_field(1, tag()) } else { topic };
        let mut sent = messages::OffsetForLeaderEpochRequest::default().with_topics(vec![topic]);
        if version >= 3 {
            sent = sent.with_replica_id(kafka_protocol::messages::BrokerId(CONSUMER_REPLICA_ID));
        }
        if flexible {
            sent = sent.with_unknown_tagged_field(0, tag());
        }
        let got =
            decoded_whole(&frame(&sent, version), version, OffsetForLeaderEpochRequest::decode);
        let partition = |index, current_leader_epoch, leader_epoch| OffsetForLeaderEpochPartition {
            index,
            current_leader_epoch,
            leader_epoch,
        };
        let expected = OffsetForLeaderEpochRequest {
            replica_id: if version >= 3 { CONSUMER_REPLICA_ID } else { DEBUGGING_REPLICA_ID },
            topics: vec![OffsetForLeaderEpochTopic {
                name: "orders".to_string(),
                partitions: vec![partition(0, 7, 6), partition(3, -1, 2)],
            }],
        };
        assert_eq!(got, expected, "v{version}");
    }
}

/// `Request::decode` hands each new API's body to its own decoder.
#[test]
fn group_and_offset_requests_dispatch_to_their_decoders() {
    use kafka_protocol::messages::ApiKey;
    let cases: Vec<(ApiKey, i16, Bytes)> = vec![
        (ApiKey::FindCoordinator, 6, frame(&messages::FindCoordinatorRequest::default(), 6)),
        (ApiKey::JoinGroup, 7, frame(&messages::JoinGroupRequest::default(), 7)),
        (ApiKey::SyncGroup, 5, frame(&messages::SyncGroupRequest::default(), 5)),
        (ApiKey::Heartbeat, 4, frame(&messages::HeartbeatRequest::default(), 4)),
        (ApiKey::LeaveGroup, 5, frame(&messages::LeaveGroupRequest::default(), 5)),
        (ApiKey::OffsetCommit, 9, frame(&messages::OffsetCommitRequest::default(), 9)),
        (ApiKey::OffsetFetch, 9, frame(&messages::OffsetFetchRequest::default(), 9)),
        (ApiKey::OffsetFetch, 1, frame(&messages::OffsetFetchRequest::default(), 1)),
        (
            ApiKey::OffsetForLeaderEpoch,
            4,
            frame(&messages::OffsetForLeaderEpochRequest::default(), 4),
        ),
    ];
    for (key, version, body) in cases {
        let header = crate::RequestHeader {
            api_key: key as i16,
            api_version: version,
            correlation_id: 1,
            client_id: None,
        };
        let mut reader = Reader::new(body);
        let request = Request::decode(&header, &mut reader).unwrap().unwrap();
        assert_eq!(reader.remaining(), 0, "{key:?} v{version}");
        let matches = match key {
            ApiKey::FindCoordinator => matches!(request, Request::FindCoordinator(_)),
            ApiKey::JoinGroup => matches!(request, Request::JoinGroup(_)),
            ApiKey::SyncGroup => matches!(request, Request::SyncGroup(_)),
            ApiKey::Heartbeat => matches!(request, Request::Heartbeat(_)),
            ApiKey::LeaveGroup => matches!(request, Request::LeaveGroup(_)),
            ApiKey::OffsetCommit => matches!(request, Request::OffsetCommit(_)),
            ApiKey::OffsetFetch => matches!(request, Request::OffsetFetch(_)),
            ApiKey::OffsetForLeaderEpoch => matches!(request, Request::OffsetForLeaderEpoch(_)),
            _ => false,
        };
        assert!(matches, "{key:?} v{version}: {request:?}");
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

/// Each group and offset decoder refuses an array count over its bound, or over the bytes
/// left, before sizing anything by it, in the classic and the compact (flexible) forms.
#[test]
fn group_and_offset_decoders_refuse_counts_larger_than_the_frame() {
    const GROUP: &[u8] = &[0, 1, b'g'];
    const EMPTY: &[u8] = &[0, 0];
    const I32: &[u8] = &[0, 0, 0, 1];
    const I64: &[u8] = &[0, 0, 0, 0, 0, 0, 0, 1];

    // FindCoordinator v4+: key type, then the keys.
    too_many(FindCoordinatorRequest::decode(&mut body(&[&[0], HUGE_COMPACT]), 4));
    truncated(FindCoordinatorRequest::decode(&mut body(&[&[0], &[101], &[0; 20]]), 6));
    // A key longer than the frame.
    truncated(FindCoordinatorRequest::decode(&mut body(&[&[0x7f, 0xff], b"g"]), 0));

    // JoinGroup: group, session timeout, (v1+) rebalance timeout, member, protocol type,
    // protocols.
    let join = |count: &[u8], rest: &[u8]| body(&[GROUP, I32, I32, EMPTY, EMPTY, count, rest]);
    too_many(JoinGroupRequest::decode(&mut join(HUGE, &[]), 1));
    too_many(JoinGroupRequest::decode(&mut join(&[0, 0, 0, 65], &[0; 400]), 1));
    truncated(JoinGroupRequest::decode(&mut join(&[0, 0, 0, 64], &[0; 20]), 1));
    // One protocol whose metadata announces two gigabytes.
    truncated(JoinGroupRequest::decode(
        &mut join(&[0, 0, 0, 1], &[&[0, 1, b'r'], HUGE].concat()),
        1,
    ));
    // v6: compact strings, and a (null) instance id before the protocol type.
    let mut join = body(&[&[2, b'g'], I32, I32, &[1], &[0], &[1], HUGE_COMPACT]);
    too_many(JoinGroupRequest::decode(&mut join, 6));

    // SyncGroup: group, generation, member, assignments.
    too_many(SyncGroupRequest::decode(&mut body(&[GROUP, I32, GROUP, HUGE]), 0));
    let one_huge_assignment = [&[0, 0, 0, 1][..], GROUP, HUGE].concat();
    truncated(SyncGroupRequest::decode(&mut body(&[GROUP, I32, GROUP, &one_huge_assignment]), 0));
    // v5: instance id, protocol type and name (null), then the compact assignments.
    let mut sync = body(&[&[2, b'g'], I32, &[2, b'm'], &[0], &[0], &[0], HUGE_COMPACT]);
    too_many(SyncGroupRequest::decode(&mut sync, 5));

    // Heartbeat has no array: a member id longer than the frame.
    truncated(HeartbeatRequest::decode(&mut body(&[GROUP, I32, &[0x7f, 0xff], b"m"]), 0));
    truncated(HeartbeatRequest::decode(&mut body(&[&[2, b'g'], I32, HUGE_COMPACT]), 4));

    // LeaveGroup v3+: group, members.
    too_many(LeaveGroupRequest::decode(&mut body(&[GROUP, HUGE]), 3));
    too_many(LeaveGroupRequest::decode(&mut body(&[&[2, b'g'], HUGE_COMPACT]), 5));
    truncated(LeaveGroupRequest::decode(&mut body(&[GROUP, &[0, 0, 0, 100], &[0; 30]]), 3));

    // OffsetCommit v2: group, generation, member, retention, topics (of name, partitions).
    let commit = |topics: &[u8]| body(&[GROUP, I32, EMPTY, I64, topics]);
    too_many(OffsetCommitRequest::decode(&mut commit(HUGE), 2));
    let one_topic = [&[0, 0, 0, 1][..], &[0, 1, b't'], HUGE].concat();
    too_many(OffsetCommitRequest::decode(&mut commit(&one_topic), 2));
    let many_partitions = [&[0, 0, 0, 1][..], &[0, 1, b't'], &[0, 0, 0x10, 0], &[0; 64]].concat();
    truncated(OffsetCommitRequest::decode(&mut commit(&many_partitions), 2));
    let mut commit = body(&[&[2, b'g'], I32, &[1], &[0], HUGE_COMPACT]);
    too_many(OffsetCommitRequest::decode(&mut commit, 9));

    // OffsetFetch v1–7: group, topics (of name, partition indexes); v8+: groups.
    too_many(OffsetFetchRequest::decode(&mut body(&[GROUP, HUGE]), 1));
    let one_topic = [&[0, 0, 0, 1][..], &[0, 1, b't'], HUGE].concat();
    too_many(OffsetFetchRequest::decode(&mut body(&[GROUP, &one_topic]), 2));
    let many_partitions = [&[0, 0, 0, 1][..], &[0, 1, b't'], &[0, 0, 0, 100], &[0; 64]].concat();
    truncated(OffsetFetchRequest::decode(&mut body(&[GROUP, &many_partitions]), 3));
    too_many(OffsetFetchRequest::decode(&mut body(&[&[2, b'g'], HUGE_COMPACT]), 7));
    too_many(OffsetFetchRequest::decode(&mut body(&[HUGE_COMPACT]), 8));
    truncated(OffsetFetchRequest::decode(&mut body(&[&[101], &[0; 20]]), 9));
    // One v9 group (null member, epoch) whose topics announce too many.
    too_many(OffsetFetchRequest::decode(
        &mut body(&[&[2], &[2, b'g'], &[0], I32, HUGE_COMPACT]),
        9,
    ));

    // OffsetForLeaderEpoch: (v3+) replica id, topics (of name, partitions).
    too_many(OffsetForLeaderEpochRequest::decode(&mut body(&[HUGE]), 2));
    too_many(OffsetForLeaderEpochRequest::decode(&mut body(&[I32, HUGE]), 3));
    too_many(OffsetForLeaderEpochRequest::decode(&mut body(&[I32, HUGE_COMPACT]), 4));
    let many_partitions = [&[0, 0, 0, 1][..], &[0, 1, b't'], &[0, 0, 0x10, 0], &[0; 64]].concat();
    truncated(OffsetForLeaderEpochRequest::decode(&mut body(&[&many_partitions]), 2));
}

#[test]
fn create_partitions_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::create_partitions_request::{
        CreatePartitionsAssignment, CreatePartitionsTopic as Sent,
    };
    for version in 0..=3 {
        let assignment = |brokers: &[i32]| {
            CreatePartitionsAssignment::default()
                .with_broker_ids(brokers.iter().map(|&b| BrokerId(b)).collect())
        };
        let sent = messages::CreatePartitionsRequest::default()
            .with_topics(vec![
                Sent::default()
                    .with_name(topic_name("orders"))
                    .with_count(6)
                    .with_assignments(None),
                Sent::default()
                    .with_name(topic_name("payments"))
                    .with_count(3)
                    .with_assignments(Some(vec![assignment(&[0, 1]), assignment(&[2])])),
            ])
            .with_timeout_ms(15_000)
            .with_validate_only(version == 1);
        let got = decoded_whole(&frame(&sent, version), version, CreatePartitionsRequest::decode);
        assert_eq!(
            got,
            CreatePartitionsRequest {
                topics: vec![
                    CreatePartitionsTopic { name: "orders".into(), count: 6, assignments: None },
                    CreatePartitionsTopic {
                        name: "payments".into(),
                        count: 3,
                        assignments: Some(vec![vec![0, 1], vec![2]]),
                    },
                ],
                timeout_ms: 15_000,
                validate_only: version == 1,
            },
            "v{version}"
        );
    }
}

#[test]
fn create_topics_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::BrokerId;
    use kafka_protocol::messages::create_topics_request::{
        CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
    };
    for version in 2..=7 {
        for validate_only in [false, true] {
            let flexible = version >= 5;
            let config = |name: &str, value: Option<&str>| {
                let config = CreatableTopicConfig::default()
                    .with_name(text(name))
                    .with_value(value.map(text));
                if flexible { config.with_unknown_tagged_field(1, tag()) } else { config }
            };
            let assignment = |partition, brokers: &[i32]| {
                let assignment = CreatableReplicaAssignment::default()
                    .with_partition_index(partition)
                    .with_broker_ids(brokers.iter().copied().map(BrokerId).collect());
                if flexible { assignment.with_unknown_tagged_field(1, tag()) } else { assignment }
            };
            let topic = |name: &str, partitions, replication, assignments, configs| {
                let topic = CreatableTopic::default()
                    .with_name(topic_name(name))
                    .with_num_partitions(partitions)
                    .with_replication_factor(replication)
                    .with_assignments(assignments)
                    .with_configs(configs);
                if flexible { topic.with_unknown_tagged_field(1, tag()) } else { topic }
            };
            let mut sent = messages::CreateTopicsRequest::default()
                .with_topics(vec![
                    topic(
                        "orders",
                        3,
                        1,
                        Vec::new(),
                        vec![
                            config("cleanup.policy", Some("compact")),
                            config("retention.ms", None),
                            config("segment.bytes", Some("")),
                        ],
                    ),
                    // Manual assignments, with the counts left to them.
                    topic(
                        "payments",
                        -1,
                        -1,
                        vec![assignment(0, &[1, 2]), assignment(1, &[2]), assignment(2, &[])],
                        Vec::new(),
                    ),
                ])
                .with_timeout_ms(30_000)
                .with_validate_only(validate_only);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got = decoded_whole(&frame(&sent, version), version, CreateTopicsRequest::decode);
            let config = |name: &str, value: Option<&str>| CreateTopicConfig {
                name: name.to_string(),
                value: value.map(str::to_string),
            };
            let expected = CreateTopicsRequest {
                topics: vec![
                    CreateTopic {
                        name: "orders".to_string(),
                        num_partitions: 3,
                        replication_factor: 1,
                        assignments: Vec::new(),
                        configs: vec![
                            config("cleanup.policy", Some("compact")),
                            config("retention.ms", None),
                            config("segment.bytes", Some("")),
                        ],
                    },
                    CreateTopic {
                        name: "payments".to_string(),
                        num_partitions: -1,
                        replication_factor: -1,
                        assignments: vec![(0, vec![1, 2]), (1, vec![2]), (2, Vec::new())],
                        configs: Vec::new(),
                    },
                ],
                timeout_ms: 30_000,
                validate_only,
            };
            assert_eq!(got, expected, "v{version}");
        }
        // No topics at all.
        let sent = messages::CreateTopicsRequest::default().with_timeout_ms(5);
        let got = decoded_whole(&frame(&sent, version), version, CreateTopicsRequest::decode);
        let expected =
            CreateTopicsRequest { topics: Vec::new(), timeout_ms: 5, validate_only: false };
        assert_eq!(got, expected, "v{version}");
    }
}

#[test]
fn delete_topics_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    for version in 1..=6 {
        let flexible = version >= 4;
        let mut sent = messages::DeleteTopicsRequest::default().with_timeout_ms(15_000);
        let expected_topics = if version <= 5 {
            sent = sent.with_topic_names(vec![topic_name("orders"), topic_name("payments")]);
            // By name, with no id.
            vec![
                DeleteTopic { name: Some("orders".to_string()), topic_id: [0; 16] },
                DeleteTopic { name: Some("payments".to_string()), topic_id: [0; 16] },
            ]
        } else {
            let topic = |name: Option<&str>, id: [u8; 16]| {
                DeleteTopicState::default()
                    .with_name(name.map(topic_name))
                    .with_topic_id(crate::Uuid::from_bytes(id))
                    .with_unknown_tagged_field(1, tag())
            };
            sent = sent.with_topics(vec![
                topic(Some("orders"), [0; 16]),
                topic(None, [7; 16]),
                topic(Some("payments"), [8; 16]),
            ]);
            vec![
                DeleteTopic { name: Some("orders".to_string()), topic_id: [0; 16] },
                DeleteTopic { name: None, topic_id: [7; 16] },
                DeleteTopic { name: Some("payments".to_string()), topic_id: [8; 16] },
            ]
        };
        if flexible {
            sent = sent.with_unknown_tagged_field(0, tag());
        }
        let got = decoded_whole(&frame(&sent, version), version, DeleteTopicsRequest::decode);
        let expected = DeleteTopicsRequest { topics: expected_topics, timeout_ms: 15_000 };
        assert_eq!(got, expected, "v{version}");
        // An empty list.
        let sent = messages::DeleteTopicsRequest::default().with_timeout_ms(1);
        let got = decoded_whole(&frame(&sent, version), version, DeleteTopicsRequest::decode);
        assert_eq!(got, DeleteTopicsRequest { topics: Vec::new(), timeout_ms: 1 }, "v{version}");
    }
}

#[test]
fn describe_configs_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource as Sent;
    for version in 1..=4 {
        for include_synonyms in [false, true] {
            let flexible = version >= 4;
            // Documentation only from v3, asked for along with the synonyms.
            let include_documentation = version >= 3 && include_synonyms;
            let resource = |resource_type, name: &str, keys: Option<&[&str]>| {
                let resource = Sent::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(text(name))
                    .with_configuration_keys(
                        keys.map(|keys| keys.iter().map(|k| text(k)).collect()),
                    );
                if flexible { resource.with_unknown_tagged_field(1, tag()) } else { resource }
            };
            let mut sent = messages::DescribeConfigsRequest::default()
                .with_resources(vec![
                    resource(TOPIC_RESOURCE_TYPE, "orders", None),
                    resource(
                        BROKER_RESOURCE_TYPE,
                        "1",
                        Some(&["log.retention.ms", "min.insync.replicas"]),
                    ),
                    resource(TOPIC_RESOURCE_TYPE, "payments", Some(&[])),
                ])
                .with_include_synonyms(include_synonyms)
                .with_include_documentation(include_documentation);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got =
                decoded_whole(&frame(&sent, version), version, DescribeConfigsRequest::decode);
            let resource =
                |resource_type, name: &str, keys: Option<&[&str]>| DescribeConfigsResource {
                    resource_type,
                    resource_name: name.to_string(),
                    configuration_keys: keys
                        .map(|keys| keys.iter().map(|key| key.to_string()).collect()),
                };
            let expected = DescribeConfigsRequest {
                resources: vec![
                    resource(TOPIC_RESOURCE_TYPE, "orders", None),
                    resource(
                        BROKER_RESOURCE_TYPE,
                        "1",
                        Some(&["log.retention.ms", "min.insync.replicas"]),
                    ),
                    resource(TOPIC_RESOURCE_TYPE, "payments", Some(&[])),
                ],
                include_synonyms,
                include_documentation,
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn describe_groups_requests_of_every_version_decode_as_sent() {
    for version in 0..=5 {
        for groups in [vec!["orders-app", "billing"], Vec::new()] {
            let flexible = version >= 5;
            let mut sent = messages::DescribeGroupsRequest::default()
                .with_groups(groups.iter().map(|id| group(id)).collect())
                .with_include_authorized_operations(version >= 3);
            if flexible {
                sent = sent.with_unknown_tagged_field(0, tag());
            }
            let got = decoded_whole(&frame(&sent, version), version, DescribeGroupsRequest::decode);
            let expected = DescribeGroupsRequest {
                groups: groups.iter().map(|id| id.to_string()).collect(),
                // Not sent before v3, and read as not asked for.
                include_authorized_operations: version >= 3,
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn list_groups_requests_of_every_version_decode_as_sent() {
    for version in 0..=5 {
        let states = if version >= 4 { vec!["Stable", "PreparingRebalance"] } else { Vec::new() };
        let types = if version >= 5 { vec!["classic"] } else { Vec::new() };
        let filtered = messages::ListGroupsRequest::default()
            .with_states_filter(states.iter().map(|state| text(state)).collect())
            .with_types_filter(types.iter().map(|kind| text(kind)).collect());
        for (sent, states, types) in [
            (filtered, states, types),
            (messages::ListGroupsRequest::default(), Vec::new(), Vec::new()),
        ] {
            let sent = if version >= 3 { sent.with_unknown_tagged_field(0, tag()) } else { sent };
            let frame = frame(&sent, version);
            // v0–2 have an empty body.
            assert_eq!(frame.is_empty(), version <= 2, "v{version}");
            let got = decoded_whole(&frame, version, ListGroupsRequest::decode);
            let expected = ListGroupsRequest {
                states_filter: states.iter().map(|state| state.to_string()).collect(),
                types_filter: types.iter().map(|kind| kind.to_string()).collect(),
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn describe_cluster_requests_of_every_version_decode_as_sent() {
    for version in 0..=1 {
        for include in [false, true] {
            let sent = messages::DescribeClusterRequest::default()
                .with_include_cluster_authorized_operations(include)
                .with_endpoint_type(if version >= 1 {
                    CONTROLLERS_ENDPOINT_TYPE
                } else {
                    BROKERS_ENDPOINT_TYPE
                })
                .with_unknown_tagged_field(0, tag());
            let got =
                decoded_whole(&frame(&sent, version), version, DescribeClusterRequest::decode);
            let expected = DescribeClusterRequest {
                include_cluster_authorized_operations: include,
                // v0 has no endpoint type: it asks for the brokers.
                endpoint_type: if version >= 1 {
                    CONTROLLERS_ENDPOINT_TYPE
                } else {
                    BROKERS_ENDPOINT_TYPE
                },
            };
            assert_eq!(got, expected, "v{version}");
        }
    }
}

#[test]
fn delete_records_requests_of_every_version_decode_as_sent() {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition as Partition, DeleteRecordsTopic as Topic,
    };
    for version in 0..=2 {
        let flexible = version >= 2;
        let partition = |index, offset| {
            let partition = Partition::default().with_partition_index(index).with_offset(offset);
            if flexible { partition.with_unknown_tagged_field(1, tag()) } else { partition }
        };
        let topic = Topic::default()
            .with_name(topic_name("orders"))
            .with_partitions(vec![partition(0, 7), partition(2, HIGH_WATERMARK)]);
        let topic = if flexible { topic.with_unknown_tagged_field(1, tag()) } else { topic };
        let mut sent =
            messages::DeleteRecordsRequest::default().with_topics(vec![topic]).with_timeout_ms(900);
        if flexible {
            sent = sent.with_unknown_tagged_field(0, tag());
        }
        let got = decoded_whole(&frame(&sent, version), version, DeleteRecordsRequest::decode);
        let expected = DeleteRecordsRequest {
            topics: vec![DeleteRecordsTopic {
                name: "orders".to_string(),
                partitions: vec![
                    DeleteRecordsPartition { index: 0, offset: 7 },
                    DeleteRecordsPartition { index: 2, offset: HIGH_WATERMARK },
                ],
            }],
            timeout_ms: 900,
        };
        assert_eq!(got, expected, "v{version}");
    }
}

/// `Request::decode` hands each administration API's body to its own decoder.
#[test]
fn admin_requests_dispatch_to_their_decoders() {
    use kafka_protocol::messages::ApiKey;
    let cases: Vec<(ApiKey, i16, Bytes)> = vec![
        (ApiKey::CreateTopics, 2, frame(&messages::CreateTopicsRequest::default(), 2)),
        (ApiKey::CreateTopics, 7, frame(&messages::CreateTopicsRequest::default(), 7)),
        (ApiKey::DeleteTopics, 1, frame(&messages::DeleteTopicsRequest::default(), 1)),
        (ApiKey::DeleteTopics, 6, frame(&messages::DeleteTopicsRequest::default(), 6)),
        (ApiKey::DescribeConfigs, 1, frame(&messages::DescribeConfigsRequest::default(), 1)),
        (ApiKey::DescribeConfigs, 4, frame(&messages::DescribeConfigsRequest::default(), 4)),
        (ApiKey::DescribeGroups, 0, frame(&messages::DescribeGroupsRequest::default(), 0)),
        (ApiKey::DescribeGroups, 5, frame(&messages::DescribeGroupsRequest::default(), 5)),
        (ApiKey::ListGroups, 0, frame(&messages::ListGroupsRequest::default(), 0)),
        (ApiKey::ListGroups, 5, frame(&messages::ListGroupsRequest::default(), 5)),
        (ApiKey::DescribeCluster, 0, frame(&messages::DescribeClusterRequest::default(), 0)),
        (ApiKey::DescribeCluster, 1, frame(&messages::DescribeClusterRequest::default(), 1)),
        (ApiKey::DeleteRecords, 0, frame(&messages::DeleteRecordsRequest::default(), 0)),
        (ApiKey::DeleteRecords, 2, frame(&messages::DeleteRecordsRequest::default(), 2)),
    ];
    for (key, version, body) in cases {
        let header = crate::RequestHeader {
            api_key: key as i16,
            api_version: version,
            correlation_id: 1,
            client_id: None,
        };
        let mut reader = Reader::new(body);
        let request = Request::decode(&header, &mut reader).unwrap().unwrap();
        assert_eq!(reader.remaining(), 0, "{key:?} v{version}");
        let matches = match key {
            ApiKey::CreateTopics => matches!(request, Request::CreateTopics(_)),
            ApiKey::DeleteTopics => matches!(request, Request::DeleteTopics(_)),
            ApiKey::DescribeConfigs => matches!(request, Request::DescribeConfigs(_)),
            ApiKey::DescribeGroups => matches!(request, Request::DescribeGroups(_)),
            ApiKey::ListGroups => matches!(request, Request::ListGroups(_)),
            ApiKey::DescribeCluster => matches!(request, Request::DescribeCluster(_)),
            ApiKey::DeleteRecords => matches!(request, Request::DeleteRecords(_)),
            _ => false,
        };
        assert!(matches, "{key:?} v{version}: {request:?}");
    }
    // DescribeGroups v6 and DescribeCluster v2, which the codec knows, are not served.
    for (key, version) in [(ApiKey::DescribeGroups, 6), (ApiKey::DescribeCluster, 2)] {
        let header = crate::RequestHeader {
            api_key: key as i16,
            api_version: version,
            correlation_id: 1,
            client_id: None,
        };
        assert!(Request::decode(&header, &mut Reader::new(Bytes::new())).is_none(), "{key:?}");
    }
}

/// Each administration decoder refuses an array count over its bound, or over the bytes left,
/// before sizing anything by it, in the classic and the compact (flexible) forms.
#[test]
fn admin_decoders_refuse_counts_larger_than_the_frame() {
    const ONE: &[u8] = &[0, 0, 0, 1];
    const NONE: &[u8] = &[0, 0, 0, 0];
    const NAME: &[u8] = &[0, 1, b't'];
    const I16: &[u8] = &[0, 1];
    const I32: &[u8] = &[0, 0, 0, 1];

    // CreateTopics v2: topics (of name, partitions, replication, assignments (of partition,
    // broker ids), configs).
    too_many(CreateTopicsRequest::decode(&mut body(&[HUGE]), 2));
    too_many(CreateTopicsRequest::decode(&mut body(&[&[0, 0, 0x27, 0x11], &[0; 64]]), 2));
    truncated(CreateTopicsRequest::decode(&mut body(&[&[0, 0, 0x27, 0x10], &[0; 64]]), 2));
    too_many(CreateTopicsRequest::decode(&mut body(&[ONE, NAME, I32, I16, HUGE]), 2));
    too_many(CreateTopicsRequest::decode(&mut body(&[ONE, NAME, I32, I16, ONE, I32, HUGE]), 2));
    // 1,001 broker ids; then 1,000 in too few bytes.
    let brokers = |count: &[u8]| body(&[ONE, NAME, I32, I16, ONE, I32, count, &[0; 400]]);
    too_many(CreateTopicsRequest::decode(&mut brokers(&[0, 0, 0x03, 0xe9]), 2));
    truncated(CreateTopicsRequest::decode(&mut brokers(&[0, 0, 0x03, 0xe8]), 2));
    too_many(CreateTopicsRequest::decode(&mut body(&[ONE, NAME, I32, I16, NONE, HUGE]), 2));
    let configs = |count: &[u8]| body(&[ONE, NAME, I32, I16, NONE, count, &[0; 400]]);
    too_many(CreateTopicsRequest::decode(&mut configs(&[0, 0, 0x03, 0xe9]), 2));
    truncated(CreateTopicsRequest::decode(&mut configs(&[0, 0, 0x03, 0xe8]), 2));
    // v5: compact arrays.
    too_many(CreateTopicsRequest::decode(&mut body(&[HUGE_COMPACT]), 5));
    too_many(CreateTopicsRequest::decode(
        &mut body(&[&[2], &[2, b't'], I32, I16, HUGE_COMPACT]),
        7,
    ));
    let mut assignment = body(&[&[2], &[2, b't'], I32, I16, &[2], I32, HUGE_COMPACT]);
    too_many(CreateTopicsRequest::decode(&mut assignment, 7));
    // A config value longer than the frame.
    let mut value = body(&[ONE, NAME, I32, I16, NONE, ONE, NAME, &[0x7f, 0xff], b"v"]);
    truncated(CreateTopicsRequest::decode(&mut value, 4));

    // DeleteTopics: names (v1–5) or topics of name and id (v6).
    too_many(DeleteTopicsRequest::decode(&mut body(&[HUGE]), 1));
    truncated(DeleteTopicsRequest::decode(&mut body(&[&[0, 0, 0, 100], &[0; 30]]), 3));
    too_many(DeleteTopicsRequest::decode(&mut body(&[HUGE_COMPACT]), 4));
    too_many(DeleteTopicsRequest::decode(&mut body(&[HUGE_COMPACT]), 6));
    // Ten topics of at least 18 bytes each in 100 bytes.
    truncated(DeleteTopicsRequest::decode(&mut body(&[&[11], &[0; 100]]), 6));

    // DescribeConfigs: resources (of type, name, keys), synonyms, (v3+) documentation.
    too_many(DescribeConfigsRequest::decode(&mut body(&[HUGE]), 1));
    too_many(DescribeConfigsRequest::decode(&mut body(&[ONE, &[2], NAME, HUGE]), 1));
    let keys = |count: &[u8]| body(&[ONE, &[2], NAME, count, &[0; 400]]);
    too_many(DescribeConfigsRequest::decode(&mut keys(&[0, 0, 0x03, 0xe9]), 3));
    truncated(DescribeConfigsRequest::decode(&mut keys(&[0, 0, 0x03, 0xe8]), 3));
    too_many(DescribeConfigsRequest::decode(&mut body(&[HUGE_COMPACT]), 4));
    too_many(DescribeConfigsRequest::decode(&mut body(&[&[2], &[2], &[2, b't'], HUGE_COMPACT]), 4));

    // DescribeGroups: group ids.
    too_many(DescribeGroupsRequest::decode(&mut body(&[HUGE]), 0));
    truncated(DescribeGroupsRequest::decode(&mut body(&[&[0, 0, 0, 100], &[0; 30]]), 3));
    too_many(DescribeGroupsRequest::decode(&mut body(&[HUGE_COMPACT]), 5));
    // A group id longer than the frame.
    truncated(DescribeGroupsRequest::decode(&mut body(&[ONE, &[0x7f, 0xff], b"g"]), 0));

    // ListGroups: (v4+) states, (v5+) types.
    too_many(ListGroupsRequest::decode(&mut body(&[HUGE_COMPACT]), 4));
    too_many(ListGroupsRequest::decode(&mut body(&[&[102], &[0; 200]]), 4));
    truncated(ListGroupsRequest::decode(&mut body(&[&[101], &[0; 50]]), 4));
    too_many(ListGroupsRequest::decode(&mut body(&[&[1], HUGE_COMPACT]), 5));

    // DescribeCluster has no array: a tagged field longer than the frame.
    truncated(DescribeClusterRequest::decode(&mut body(&[&[0, 1], &[1, 0], HUGE_COMPACT]), 1));

    // DeleteRecords: topics, then each topic's partitions (12 bytes each).
    too_many(DeleteRecordsRequest::decode(&mut body(&[HUGE]), 0));
    too_many(DeleteRecordsRequest::decode(&mut body(&[HUGE_COMPACT]), 2));
    truncated(DeleteRecordsRequest::decode(&mut body(&[ONE, NAME, &[0, 0, 0, 10], &[0; 100]]), 1));
    too_many(DeleteRecordsRequest::decode(&mut body(&[ONE, NAME, HUGE]), 1));
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
        let _ = FindCoordinatorRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(6));
        let _ = JoinGroupRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(7));
        let _ = SyncGroupRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(5));
        let _ = HeartbeatRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(4));
        let _ = LeaveGroupRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(5));
        let _ = OffsetCommitRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(2, 9));
        let _ = OffsetFetchRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(1, 9));
        let _ = OffsetForLeaderEpochRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(2, 4));
        let _ = CreateTopicsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(2, 7));
        let _ = CreatePartitionsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(3));
        let _ = DeleteTopicsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(1, 6));
        let _ = DescribeConfigsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.clamp(1, 4));
        let _ = DescribeGroupsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(5));
        let _ = ListGroupsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(5));
        let _ = DescribeClusterRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(1));
        let _ = DeleteRecordsRequest::decode(&mut Reader::new(Bytes::from(bytes.clone())), version.min(2));
        let mut reader = Reader::new(Bytes::from(bytes));
        if let Ok(header) = crate::RequestHeader::decode(&mut reader) {
            let _ = Request::decode(&header, &mut reader);
        }
    }
}
