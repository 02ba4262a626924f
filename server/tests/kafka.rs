//! The Kafka listener end to end on the real binary: ApiVersions (including a version from the
//! future, answered as KIP-511 says), Metadata at old and new versions naming the node as the
//! partitions' leader, and hostile frames — each closes its own connection and nothing else.
//! Requests are encoded and responses decoded by the `kafka-protocol` crate's client side, as a
//! Kafka client library would; the hostile frames are written by hand.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, CreatePartitionsRequest,
    CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, DescribeClusterRequest, DescribeClusterResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, DescribeGroupsRequest, DescribeGroupsResponse, FetchRequest,
    FetchResponse, FindCoordinatorRequest, FindCoordinatorResponse, GroupId, HeartbeatRequest,
    HeartbeatResponse, InitProducerIdRequest, InitProducerIdResponse, JoinGroupRequest,
    JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse, ListGroupsRequest,
    ListGroupsResponse, ListOffsetsRequest, ListOffsetsResponse, MetadataRequest, MetadataResponse,
    OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest, OffsetFetchResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, ProduceRequest, ProduceResponse,
    RequestHeader, SyncGroupRequest, SyncGroupResponse, TopicName, TransactionalId,
    metadata_request::MetadataRequestTopic,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use shoal_proto::Durability;
use shoal_proto::protocol::FetchFrom;

use common::{Raw, ShoalProcess, metrics_page};

/// A blocking Kafka connection; every read is bounded by a 30 s timeout.
struct Kafka {
    stream: TcpStream,
    correlation_id: i32,
}

impl Kafka {
    fn connect(server: &ShoalProcess) -> Kafka {
        let stream = TcpStream::connect(server.kafka().expect("the Kafka listener is on")).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        Kafka { stream, correlation_id: 0 }
    }

    /// Sends a request of `key` at `version` and returns the response body after checking the
    /// correlation id (response header v0, or v1 when `flexible_response`).
    fn call<R: Encodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &R,
        flexible_response: bool,
    ) -> Bytes {
        self.send(key, version, request);
        let mut response = self.receive().expect("a response");
        assert_eq!(response.get_i32(), self.correlation_id);
        if flexible_response {
            assert_eq!(response.get_u8(), 0, "no tagged fields in the response header");
        }
        response
    }

    /// Sends a request of `key` at `version` under the next correlation id.
    fn send<R: Encodable + HeaderVersion>(&mut self, key: ApiKey, version: i16, request: &R) {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("shoal-test")));
        let mut body = BytesMut::new();
        header.encode(&mut body, R::header_version(version)).unwrap();
        request.encode(&mut body, version).unwrap();
        self.send_frame(&body);
    }

    fn send_frame(&mut self, body: &[u8]) {
        let mut frame = Vec::with_capacity(body.len() + 4);
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(body);
        self.stream.write_all(&frame).unwrap();
    }

    /// One response frame; `None` once the server closed the connection.
    fn receive(&mut self) -> Option<Bytes> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).ok()?;
        let mut body = vec![0u8; i32::from_be_bytes(size) as usize];
        self.stream.read_exact(&mut body).ok()?;
        Some(Bytes::from(body))
    }

    /// Whether the server closed the connection (EOF, or a reset, within the read timeout).
    fn closed(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

fn metadata(kafka: &mut Kafka, version: i16, topics: Option<&[&str]>) -> MetadataResponse {
    let topics = topics.map(|names| {
        names
            .iter()
            .map(|name| {
                MetadataRequestTopic::default()
                    .with_name(Some(TopicName(StrBytes::from_string(name.to_string()))))
            })
            .collect()
    });
    let request = MetadataRequest::default().with_topics(topics);
    let mut body = kafka.call(ApiKey::Metadata, version, &request, version >= 9);
    MetadataResponse::decode(&mut body, version).unwrap()
}

/// A server of `shards` shards whose Kafka stream holds `orders` of `partitions`
/// partitions, and a native connection to it.
fn server_with_orders(
    dir: &std::path::Path,
    shards: u32,
    partitions: u32,
    durability: Durability,
) -> (ShoalProcess, Raw) {
    let server = common::start(dir, shards);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("kafka").ok();
    raw.create_topic("kafka", "orders", partitions, durability).ok();
    (server, raw)
}

/// A Produce of one batch per (topic, partition), `acks` as given; `None` for acks 0.
fn produce(
    kafka: &mut Kafka,
    version: i16,
    acks: i16,
    batches: &[(&str, i32, Bytes)],
) -> Option<ProduceResponse> {
    let topics = batches
        .iter()
        .map(|(topic, partition, batch)| {
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![
                    PartitionProduceData::default()
                        .with_index(*partition)
                        .with_records(Some(batch.clone())),
                ])
        })
        .collect();
    let request =
        ProduceRequest::default().with_acks(acks).with_timeout_ms(30_000).with_topic_data(topics);
    if acks == 0 {
        kafka.send(ApiKey::Produce, version, &request);
        return None;
    }
    let mut body = kafka.call(ApiKey::Produce, version, &request, version >= 9);
    Some(ProduceResponse::decode(&mut body, version).unwrap())
}

/// (error code, base offset) of each partition answered, in order.
fn produced(response: &ProduceResponse) -> Vec<(i16, i64)> {
    response
        .responses
        .iter()
        .flat_map(|topic| topic.partition_responses.iter())
        .map(|p| (p.error_code, p.base_offset))
        .collect()
}

#[test]
fn produce_stores_each_batch_as_sent_and_answers_in_kafkas_codes() {
    let dir = tempfile::tempdir().unwrap();
    let (server, mut raw) = server_with_orders(dir.path(), 2, 2, Durability::Persisted);
    let mut kafka = Kafka::connect(&server);
    let batch = |values: &[&[u8]]| Bytes::from(common::batch(values));
    // A message set of the old format (magic 1), as a client that believes the broker old
    // sends: offset, size, CRC, magic 1, attributes, timestamp, key, value.
    let mut old = Vec::new();
    old.put_i64(0);
    old.put_i32(4 + 1 + 1 + 8 + 4 + 4 + 1);
    old.put_u32(0);
    old.put_u8(1);
    old.put_u8(0);
    old.put_i64(0);
    old.put_i32(-1);
    old.put_i32(1);
    old.put_u8(b'v');
    let old_format = Bytes::from(old);
    // Every served version, flexible and not: offsets follow on.
    let mut next = 0;
    for version in 3..=10 {
        let response = produce(&mut kafka, version, -1, &[("orders", 1, batch(&[b"a", b"b"]))]);
        assert_eq!(produced(&response.unwrap()), [(0, next)], "v{version}");
        next += 2;
    }
    // acks=1 waits for the commit too; acks=0 gets no answer, and the next request's answer
    // is the next frame on the connection.
    let response = produce(&mut kafka, 9, 1, &[("orders", 0, batch(&[b"one"]))]);
    assert_eq!(produced(&response.unwrap()), [(0, 0)]);
    assert!(produce(&mut kafka, 9, 0, &[("orders", 0, batch(&[b"fire", b"forget"]))]).is_none());
    assert_eq!(metadata(&mut kafka, 9, Some(&["orders"])).topics.len(), 1);
    // Refusals, each for its own partition; the connection stays open.
    let mut corrupt = common::batch(&[b"x"]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    // Over the topic's bound (60 KiB in the small profile), under the frame bound.
    let huge = batch(&[&vec![b'h'; 100 << 10]]);
    let response = produce(
        &mut kafka,
        9,
        -1,
        &[
            ("orders", 0, Bytes::from(corrupt)),
            ("missing", 0, batch(&[b"x"])),
            ("orders", 7, batch(&[b"x"])),
            ("orders", 0, huge),
            ("orders", 0, Bytes::from_static(b"not a batch")),
            ("orders", 0, old_format),
        ],
    );
    let errors: Vec<i16> = produced(&response.unwrap()).iter().map(|(e, _)| *e).collect();
    assert_eq!(errors, [2, 3, 3, 10, 2, 43]);
    // Per API: requests, the one answered with errors, and the time to answer each.
    let page = metrics_page(server.metrics().unwrap()).unwrap();
    assert_eq!(summed(&page, "shoal_kafka_requests_total", "produce"), 11);
    assert_eq!(summed(&page, "shoal_kafka_request_errors_total", "produce"), 1);
    assert_eq!(summed(&page, "shoal_kafka_request_latency_seconds_count", "produce"), 11);
    // Kafka frames count as network bytes as native ones do: a Metadata request and its
    // answer, nothing else on the wire meanwhile.
    let bytes = |page: &str, metric: &str| -> u64 {
        page.lines()
            .filter(|line| line.starts_with(metric))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
            .sum()
    };
    let received = bytes(&page, "shoal_network_received_bytes_total");
    let sent = bytes(&page, "shoal_network_sent_bytes_total");
    metadata(&mut kafka, 12, None);
    let page = metrics_page(server.metrics().unwrap()).unwrap();
    assert!(bytes(&page, "shoal_network_received_bytes_total") >= received + 20, "{page}");
    assert!(bytes(&page, "shoal_network_sent_bytes_total") >= sent + 20, "{page}");
    // What was acknowledged is there, as sent, read back over the native protocol.
    let (_, records) = raw.fetch("kafka", "orders", 1, FetchFrom::Offset(0), 100);
    assert_eq!(records.len(), 16);
    assert_eq!(records[15], (15, b"b".to_vec()));
    let (_, records) = raw.fetch("kafka", "orders", 0, FetchFrom::Offset(0), 100);
    let values: Vec<&[u8]> = records.iter().map(|(_, v)| v.as_slice()).collect();
    assert_eq!(values, [&b"one"[..], b"fire", b"forget"]);
}

/// (error code, offset) for each (topic, timestamp) asked, partition 0 each.
fn list_offsets(kafka: &mut Kafka, version: i16, asked: &[(&str, i64)]) -> Vec<(i16, i64)> {
    let topics = asked
        .iter()
        .map(|(topic, timestamp)| {
            ListOffsetsTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![ListOffsetsPartition::default().with_timestamp(*timestamp)])
        })
        .collect();
    let request = ListOffsetsRequest::default().with_topics(topics);
    let mut body = kafka.call(ApiKey::ListOffsets, version, &request, version >= 6);
    let response = ListOffsetsResponse::decode(&mut body, version).unwrap();
    response
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter())
        .map(|p| (p.error_code, p.offset))
        .collect()
}

#[test]
fn list_offsets_answers_earliest_latest_and_the_first_batch_appended_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = server_with_orders(dir.path(), 1, 1, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    for version in 1..=7 {
        let empty = list_offsets(&mut kafka, version, &[("orders", -2), ("orders", -1)]);
        assert_eq!(empty, [(0, 0), (0, 0)], "v{version}");
    }
    assert_eq!(list_offsets(&mut kafka, 7, &[("orders", -3)]), [(0, -1)], "no record yet");
    let batch = |values: &[&[u8]]| Bytes::from(common::batch(values));
    produce(&mut kafka, 9, -1, &[("orders", 0, batch(&[b"a1", b"a2"]))]);
    // A time after the first batch's append and at or before the second's.
    let between = common::now_ms() + 1;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while common::now_ms() <= between {
        assert!(std::time::Instant::now() < deadline, "the clock stands still");
        std::hint::spin_loop();
    }
    produce(&mut kafka, 9, -1, &[("orders", 0, batch(&[b"b1", b"b2", b"b3"]))]);
    let later = common::now_ms() + 60_000;
    for version in 1..=7 {
        let asked = [("orders", -2), ("orders", -1), ("orders", between), ("orders", later)];
        let answers = list_offsets(&mut kafka, version, &asked);
        assert_eq!(answers, [(0, 0), (0, 5), (0, 2), (0, -1)], "v{version}");
    }
    // The largest timestamp (v7): the newest record's (its batch's timestamps rise). An
    // unknown topic, and a query of a later version (-4, v9), each with its error.
    assert_eq!(list_offsets(&mut kafka, 7, &[("orders", -3)]), [(0, 4)]);
    let answers = list_offsets(&mut kafka, 7, &[("missing", -1), ("orders", -4)]);
    assert_eq!(answers, [(3, -1), (42, -1)]);
}

/// A Fetch of partition 0 of `orders` (by name, or by `id` from v13) from `offset`.
fn fetch(
    kafka: &mut Kafka,
    version: i16,
    id: shoal_kafka::Uuid,
    offset: i64,
    max_wait_ms: i32,
) -> FetchResponse {
    let partition =
        FetchPartition::default().with_fetch_offset(offset).with_partition_max_bytes(1 << 20);
    let topic = FetchTopic::default().with_partitions(vec![partition]);
    let topic = if version >= 13 {
        topic.with_topic_id(id)
    } else {
        topic.with_topic(TopicName(StrBytes::from_static_str("orders")))
    };
    let mut request = FetchRequest::default()
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(50 << 20)
        .with_topics(vec![topic]);
    if version <= 14 {
        request = request.with_replica_id(kafka_protocol::messages::BrokerId(-1));
    }
    let mut body = kafka.call(ApiKey::Fetch, version, &request, version >= 12);
    FetchResponse::decode(&mut body, version).unwrap()
}

/// (error, high watermark, the values of the records at or past `from`, with offsets).
fn fetched(response: &FetchResponse, from: u64) -> (i16, i64, Vec<(u64, Vec<u8>)>) {
    let partition = &response.responses[0].partitions[0];
    let mut values = Vec::new();
    let mut rest: &[u8] = partition.records.as_deref().unwrap_or_default();
    while !rest.is_empty() {
        let header = shoal_proto::batch::BatchHeader::parse(rest).expect("a batch");
        let size = header.total_size();
        for record in shoal_proto::batch::records(&rest[..size]).expect("records") {
            let record = record.expect("a record");
            let offset = header.base_offset() as u64 + record.offset_delta as u64;
            if offset >= from {
                values.push((offset, record.value.unwrap_or_default().to_vec()));
            }
        }
        rest = &rest[size..];
    }
    (partition.error_code, partition.high_watermark, values)
}

#[test]
fn fetch_returns_what_was_produced_waits_for_more_and_refuses_offsets_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = server_with_orders(dir.path(), 2, 1, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let id = metadata(&mut kafka, 12, None).topics[0].topic_id;
    let batch = |values: &[&[u8]]| Bytes::from(common::batch(values));
    produce(&mut kafka, 9, -1, &[("orders", 0, batch(&[b"a", b"b"]))]);
    produce(&mut kafka, 9, -1, &[("orders", 0, batch(&[b"c"]))]);
    let all = vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (2, b"c".to_vec())];
    for version in 4..=16 {
        let (error, high_watermark, values) = fetched(&fetch(&mut kafka, version, id, 0, 0), 0);
        assert_eq!((error, high_watermark), (0, 3), "v{version}");
        assert_eq!(values, all, "v{version}");
        // From the middle of the first batch: the whole batch comes, the client skips.
        let (_, _, values) = fetched(&fetch(&mut kafka, version, id, 1, 0), 1);
        assert_eq!(values, all[1..], "v{version}");
    }
    // At the end: nothing, after the wait (or at once without one).
    let (error, _, values) = fetched(&fetch(&mut kafka, 12, id, 3, 50), 3);
    assert_eq!((error, values.len()), (0, 0));
    // Past the end: out of range.
    assert_eq!(fetched(&fetch(&mut kafka, 12, id, 1000, 0), 0).0, 1);
    // A fetch waiting at the end is answered when a batch arrives.
    let waiting = std::thread::spawn({
        let mut kafka = Kafka::connect(&server);
        move || fetched(&fetch(&mut kafka, 12, id, 3, 20_000), 3)
    });
    // The waiting fetch may not be parked yet; either way it must see the batch.
    produce(&mut kafka, 9, -1, &[("orders", 0, batch(&[b"d"]))]);
    let (error, high_watermark, values) = waiting.join().unwrap();
    assert_eq!((error, high_watermark, values), (0, 4, vec![(3, b"d".to_vec())]));
}

/// A server whose `[kafka] fetch_bytes_max` is [`FETCH_BOUND`], with a Kafka topic `orders` of
/// `partitions` partitions, each of `with_data` holding `batches` batches of two 10,000-byte
/// records (about 20 KB each).
fn fetch_bound_server(
    dir: &std::path::Path,
    partitions: u32,
    with_data: std::ops::Range<i32>,
    batches: usize,
) -> (ShoalProcess, Kafka) {
    let mut command = common::command(dir, 1);
    command.env("SHOAL_KAFKA_FETCH_BYTES_MAX", FETCH_BOUND.to_string());
    let server = common::start_command(command);
    let mut raw = Raw::connect(server.native(), 1);
    raw.create_stream("kafka").ok();
    raw.create_topic("kafka", "orders", partitions, Durability::Replicated).ok();
    let mut kafka = Kafka::connect(&server);
    let value = vec![b'v'; 10_000];
    for _ in 0..batches {
        let batch = Bytes::from(common::batch(&[&value, &value]));
        let all: Vec<(&str, i32, Bytes)> =
            with_data.clone().map(|index| ("orders", index, batch.clone())).collect();
        produce(&mut kafka, 9, -1, &all);
    }
    (server, kafka)
}

const FETCH_BOUND: usize = 64 << 10;
/// About one batch of [`fetch_bound_server`]'s, in bytes.
const ONE_BATCH: usize = 20_100;

/// A Fetch v12 of `orders` from offset 0 of each partition of `indexes`, in that order, asking
/// for everything (`max_bytes` and every `partition_max_bytes` at `i32::MAX`): each answered
/// partition's (index, error, high watermark, bytes of batches).
fn fetch_everything(kafka: &mut Kafka, indexes: &[i32]) -> Vec<(i32, i16, i64, usize)> {
    let partitions = indexes
        .iter()
        .map(|&index| {
            FetchPartition::default()
                .with_partition(index)
                .with_fetch_offset(0)
                .with_partition_max_bytes(i32::MAX)
        })
        .collect();
    let topic = FetchTopic::default()
        .with_topic(TopicName(StrBytes::from_static_str("orders")))
        .with_partitions(partitions);
    let request = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_bytes(i32::MAX)
        .with_topics(vec![topic]);
    let mut body = kafka.call(ApiKey::Fetch, 12, &request, true);
    let response = FetchResponse::decode(&mut body, 12).unwrap();
    response.responses[0]
        .partitions
        .iter()
        .map(|p| {
            let size = p.records.as_ref().map_or(0, Bytes::len);
            (p.partition_index, p.error_code, p.high_watermark, size)
        })
        .collect()
}

/// A Fetch that asks for everything and names one partition 2,000 times: each partition is
/// read and answered once, and the batches stay within `[kafka] fetch_bytes_max` plus the
/// first batch past it. Before the bound, such repeats multiplied one partition's data in the
/// response until it passed 2 GiB, and the encoder's panic took the shard down.
#[test]
fn a_fetch_is_bounded_by_fetch_bytes_max_and_answers_a_repeated_partition_once() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut kafka) = fetch_bound_server(dir.path(), 2, 0..2, 30);
    let mut indexes = vec![0; 2_000];
    indexes.push(1);
    let answered = fetch_everything(&mut kafka, &indexes);
    let ids: Vec<(i32, i16)> = answered.iter().map(|a| (a.0, a.1)).collect();
    assert_eq!(ids, [(0, 0), (1, 0)], "each partition once");
    let sizes: Vec<usize> = answered.iter().map(|a| a.3).collect();
    assert!(sizes[0] > 0 && sizes[0] <= FETCH_BOUND + ONE_BATCH, "partition 0: {sizes:?}");
    assert!(sizes.iter().sum::<usize>() <= FETCH_BOUND + ONE_BATCH, "the response: {sizes:?}");
    // The connection and the server go on serving.
    assert_eq!(fetched(&fetch(&mut kafka, 12, shoal_kafka::Uuid::nil(), 0, 0), 0).0, 0);
}

/// A Fetch's partitions are read in request order within the response's budget, as Kafka's
/// broker reads them: partitions with nothing leave the budget to the next, the first with
/// data fills it, and the ones after it get their offsets but no batches.
#[test]
fn a_fetch_gives_its_budget_to_the_partitions_with_data_in_request_order() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut kafka) = fetch_bound_server(dir.path(), 4, 2..4, 30);
    let answered = fetch_everything(&mut kafka, &[0, 1, 2, 3]);
    assert_eq!(answered[..2], [(0, 0, 0, 0), (1, 0, 0, 0)], "{answered:?}");
    let (index, error, high_watermark, size) = answered[2];
    assert_eq!((index, error, high_watermark), (2, 0, 60));
    assert!(size + ONE_BATCH > FETCH_BOUND && size <= FETCH_BOUND + ONE_BATCH, "{answered:?}");
    assert_eq!(answered[3], (3, 0, 60, 0), "past the budget: offsets only");
}

/// A Fetch makes at most 16 waves of reads: when the partitions before hold nothing, the
/// last wave shares what is left of the budget among the rest (each gets its first batch at
/// least), instead of one more wave per partition.
#[test]
fn a_fetch_after_fifteen_empty_partitions_shares_its_budget_among_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, mut kafka) = fetch_bound_server(dir.path(), 20, 15..20, 3);
    let indexes: Vec<i32> = (0..20).collect();
    let batches: Vec<usize> =
        fetch_everything(&mut kafka, &indexes).iter().map(|a| a.3 / 20_000).collect();
    // Partitions 15 to 19 share 64 KiB: each reads its first batch, and the response keeps
    // whole batches while the bound lasts (the first may pass it).
    assert_eq!(batches[..15], [0; 15], "{batches:?}");
    assert_eq!(batches[15..], [1, 1, 1, 0, 0], "{batches:?}");
}

/// Metadata, DescribeGroups and OffsetFetch (v8, without topics) each answer a name repeated
/// in one request once: repeats would each carry the whole answer again (every partition,
/// every member's metadata, every partition's offset), so a small request could ask for an
/// answer of gigabytes.
#[test]
fn a_name_repeated_in_one_request_is_answered_once() {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestGroup;
    let dir = tempfile::tempdir().unwrap();
    let (server, _) = server_with_orders(dir.path(), 1, 3, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let listed = metadata(&mut kafka, 12, Some(&["orders"; 50]));
    assert_eq!(listed.topics.len(), 1);
    assert_eq!(listed.topics[0].partitions.len(), 3);
    let request = DescribeGroupsRequest::default().with_groups(vec![group_id(); 50]);
    let described: DescribeGroupsResponse =
        exchange(&mut kafka, ApiKey::DescribeGroups, 5, &request, true);
    assert_eq!(described.groups.len(), 1);
    let every = OffsetFetchRequestGroup::default().with_group_id(group_id()).with_topics(None);
    let request = OffsetFetchRequest::default().with_groups(vec![every; 50]);
    let fetched: OffsetFetchResponse = exchange(&mut kafka, ApiKey::OffsetFetch, 8, &request, true);
    assert_eq!(fetched.groups.len(), 1);
}

fn init_producer_id(kafka: &mut Kafka, version: i16, transactional: bool) -> (i16, i64, i16) {
    let id = transactional.then(|| TransactionalId(StrBytes::from_static_str("tx")));
    let request = InitProducerIdRequest::default()
        .with_transactional_id(id)
        .with_transaction_timeout_ms(60_000);
    let mut body = kafka.call(ApiKey::InitProducerId, version, &request, version >= 2);
    let response = InitProducerIdResponse::decode(&mut body, version).unwrap();
    (response.error_code, response.producer_id.0, response.producer_epoch)
}

#[test]
fn init_producer_id_gives_each_producer_its_own_id_and_its_batches_are_deduplicated() {
    let dir = tempfile::tempdir().unwrap();
    let (server, mut raw) = server_with_orders(dir.path(), 2, 1, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let mut ids = Vec::new();
    for version in 0..=4 {
        let (error, id, epoch) = init_producer_id(&mut kafka, version, false);
        assert_eq!((error, epoch), (0, 0), "v{version}");
        assert!(id >= 0);
        ids.push(id);
    }
    ids.dedup();
    assert_eq!(ids.len(), 5, "a new id each time: {ids:?}");
    assert_eq!(init_producer_id(&mut kafka, 4, true), (53, -1, -1), "no transactions yet");
    // An idempotent batch sent twice (a retry) is stored once and answered alike; a gap in
    // the sequence is refused.
    let id = ids[4];
    let batch = |sequence: i32, values: &[&[u8]]| {
        let mut builder =
            shoal_proto::batch::BatchBuilder::new(common::now_ms()).producer(id, 0, sequence);
        for value in values {
            builder.push(common::now_ms(), None, Some(value), &[]);
        }
        builder.build()
    };
    let first = produce(&mut kafka, 9, -1, &[("orders", 0, batch(0, &[b"a", b"b"]))]);
    let retry = produce(&mut kafka, 9, -1, &[("orders", 0, batch(0, &[b"a", b"b"]))]);
    assert_eq!(produced(&first.unwrap()), [(0, 0)]);
    assert_eq!(produced(&retry.unwrap()), [(0, 0)], "the duplicate gets the original offset");
    let gap = produce(&mut kafka, 9, -1, &[("orders", 0, batch(5, &[b"c"]))]);
    assert_eq!(produced(&gap.unwrap())[0].0, 45);
    let next = produce(&mut kafka, 9, -1, &[("orders", 0, batch(2, &[b"c"]))]);
    assert_eq!(produced(&next.unwrap()), [(0, 2)]);
    let (_, records) = raw.fetch("kafka", "orders", 0, FetchFrom::Offset(0), 100);
    assert_eq!(records.len(), 3, "stored once: {records:?}");
}

#[test]
fn api_versions_lists_what_is_served_and_answers_a_future_version_at_v0() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(dir.path(), 2);
    let mut kafka = Kafka::connect(&server);
    for version in [0, 3, 4] {
        let request = ApiVersionsRequest::default()
            .with_client_software_name(StrBytes::from_static_str("shoal-test"))
            .with_client_software_version(StrBytes::from_static_str("1"));
        // ApiVersions responses always have header v0 (KIP-511).
        let mut body = kafka.call(ApiKey::ApiVersions, version, &request, false);
        let response = ApiVersionsResponse::decode(&mut body, version).unwrap();
        assert_eq!(response.error_code, 0);
        let metadata = response.api_keys.iter().find(|k| k.api_key == ApiKey::Metadata as i16);
        assert_eq!(metadata.map(|k| (k.min_version, k.max_version)), Some((0, 12)));
        let advertised: Vec<i16> = response.api_keys.iter().map(|k| k.api_key).collect();
        let served: Vec<i16> = shoal_kafka::SERVED.iter().map(|s| s.key as i16).collect();
        assert_eq!(advertised, served, "v{version}: exactly the served table");
    }
    // A version from the future: UNSUPPORTED_VERSION in a v0 body, with the table to downgrade
    // to, and the connection stays open.
    // (The codec knows no v99, so the frame is written by hand: a v4 body under a v99 header.)
    let mut body = BytesMut::new();
    body.put_i16(ApiKey::ApiVersions as i16);
    body.put_i16(99);
    body.put_i32(77);
    body.put_i16(-1);
    body.put_u8(0);
    ApiVersionsRequest::default().encode(&mut body, 4).unwrap();
    kafka.send_frame(&body);
    let mut body = kafka.receive().expect("a response");
    assert_eq!(body.get_i32(), 77, "header v0: the correlation id alone");
    let response = ApiVersionsResponse::decode(&mut body, 0).unwrap();
    assert_eq!(response.error_code, 35);
    assert!(response.api_keys.iter().any(|k| k.api_key == ApiKey::ApiVersions as i16));
    let mut body = kafka.call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default(), false);
    assert_eq!(ApiVersionsResponse::decode(&mut body, 3).unwrap().error_code, 0);
}

#[test]
fn metadata_names_the_kafka_stream_topics_with_this_node_leading_every_partition() {
    let dir = tempfile::tempdir().unwrap();
    let (server, mut raw) = server_with_orders(dir.path(), 2, 3, Durability::Replicated);
    raw.create_stream("other").ok();
    raw.create_topic("other", "hidden", 1, Durability::Replicated).ok();
    let mut kafka = Kafka::connect(&server);
    let reached = server.kafka().unwrap().to_string();
    let mut ids = Vec::new();
    for version in 0..=12 {
        let response = metadata(&mut kafka, version, None);
        assert_eq!(response.brokers.len(), 1, "v{version}");
        let broker = &response.brokers[0];
        assert_eq!(format!("{}:{}", broker.host.as_str(), broker.port), reached);
        assert_eq!(response.topics.len(), 1, "v{version}: only the kafka stream's topics");
        let topic = &response.topics[0];
        assert_eq!(topic.error_code, 0);
        assert_eq!(topic.name.as_ref().map(|n| n.0.as_str()), Some("orders"));
        assert_eq!(topic.partitions.len(), 3);
        for (index, partition) in topic.partitions.iter().enumerate() {
            assert_eq!(partition.partition_index, index as i32);
            assert_eq!(partition.leader_id.0, 0);
            assert_eq!(partition.replica_nodes.iter().map(|n| n.0).collect::<Vec<_>>(), [0]);
        }
        if version >= 10 {
            assert!(!topic.topic_id.is_nil());
            ids.push(topic.topic_id);
        }
    }
    assert!(ids.windows(2).all(|pair| pair[0] == pair[1]), "one stable topic id");
    // A topic that does not exist is named with its error; the others are still answered.
    let response = metadata(&mut kafka, 9, Some(&["orders", "missing"]));
    let errors: Vec<i16> = response.topics.iter().map(|t| t.error_code).collect();
    assert_eq!(errors, [0, 3]);
}

/// Each hostile frame closes its own connection; a client on another connection is served
/// throughout, and the closes are counted.
#[test]
fn hostile_frames_close_their_connection_only() {
    let dir = tempfile::tempdir().unwrap();
    let server = common::start(dir.path(), 1);
    let mut bystander = Kafka::connect(&server);
    assert!(metadata(&mut bystander, 4, None).topics.is_empty());

    let mut frames: Vec<(&str, Vec<u8>)> = Vec::new();
    // A size far over the frame bound (nothing of it is read or allocated).
    frames.push(("a huge length", 0x7fff_fff0i32.to_be_bytes().to_vec()));
    frames.push(("a negative length", (-5i32).to_be_bytes().to_vec()));
    // A frame too short for a header.
    frames.push(("a truncated header", [0, 0, 0, 3, 0, 3, 0].to_vec()));
    // Metadata v1 announcing two billion topics in a few bytes.
    let mut body = Vec::new();
    body.put_i16(ApiKey::Metadata as i16);
    body.put_i16(1);
    body.put_i32(7);
    body.put_i16(-1);
    body.put_i32(i32::MAX);
    body.extend_from_slice(&[0, 1, b'a']);
    frames.push(("a count of two billion", framed(&body)));
    // An API key nobody knows, and a Fetch at a version not served.
    for key in [1000i16, 1] {
        let mut body = Vec::new();
        body.put_i16(key);
        body.put_i16(3);
        body.put_i32(1);
        body.put_i16(-1);
        frames.push(("an API not served", framed(&body)));
    }
    // Random bytes after a plausible size.
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let random: Vec<u8> = (0..64)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    frames.push(("random bytes", framed(&random)));

    for (what, bytes) in &frames {
        let mut hostile = Kafka::connect(&server);
        hostile.stream.write_all(bytes).unwrap();
        assert!(hostile.closed(), "{what}: the connection is closed");
        assert!(metadata(&mut bystander, 9, None).topics.is_empty(), "after {what}");
    }
    let page = metrics_page(server.metrics().unwrap()).unwrap();
    let closed: u64 = page
        .lines()
        .filter(|line| line.starts_with("shoal_kafka_connections_closed_total{"))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    // The truncated header and random bytes may also read as a frame cut short; every other
    // frame is refused for what it is.
    assert!(closed >= frames.len() as u64 - 2, "{closed} closes counted\n{page}");
    assert!(page.contains("shoal_kafka_requests_total{shard=\"0\",api=\"metadata\"} "), "{page}");
    // Requests whose header named an API and that were refused count as errors of it: the
    // unknown key, the Fetch at a version not served, the Metadata of two billion topics.
    for api in ["other", "fetch", "metadata"] {
        assert_eq!(summed(&page, "shoal_kafka_request_errors_total", api), 1, "{api}\n{page}");
    }
}

/// The samples of `metric` for `api`, summed over the shards.
fn summed(page: &str, metric: &str, api: &str) -> u64 {
    let label = format!("api=\"{api}\"");
    page.lines()
        .filter(|line| line.starts_with(&format!("{metric}{{")) && line.contains(&label))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

fn framed(body: &[u8]) -> Vec<u8> {
    let mut frame = (body.len() as i32).to_be_bytes().to_vec();
    frame.extend_from_slice(body);
    frame
}

/// Sends `request` at `version` and decodes the response (`flexible`: response header v1).
fn exchange<Q: Encodable + HeaderVersion, A: Decodable>(
    kafka: &mut Kafka,
    key: ApiKey,
    version: i16,
    request: &Q,
    flexible: bool,
) -> A {
    let mut body = kafka.call(key, version, request, flexible);
    A::decode(&mut body, version).unwrap()
}

fn group_id() -> GroupId {
    GroupId(StrBytes::from_static_str("billing"))
}

/// A SyncGroup of `member` in generation 1, with the leader's `assignment` for itself (`None`:
/// a member that only asks for its share).
fn sync_request(member: &str, assignment: Option<&'static [u8]>) -> SyncGroupRequest {
    use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
    let assignments = assignment.map(|assignment| {
        SyncGroupRequestAssignment::default()
            .with_member_id(StrBytes::from_string(member.to_string()))
            .with_assignment(Bytes::from_static(assignment))
    });
    SyncGroupRequest::default()
        .with_group_id(group_id())
        .with_generation_id(1)
        .with_member_id(StrBytes::from_string(member.to_string()))
        .with_assignments(assignments.into_iter().collect())
}

/// A Heartbeat of `member` in `generation`.
fn heartbeat_request(member: &str, generation: i32) -> HeartbeatRequest {
    HeartbeatRequest::default()
        .with_group_id(group_id())
        .with_generation_id(generation)
        .with_member_id(StrBytes::from_string(member.to_string()))
}

/// A JoinGroup of `member` (empty: a new one) into the group, with one protocol, `range`.
fn join_request(member: &str) -> JoinGroupRequest {
    use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
    JoinGroupRequest::default()
        .with_group_id(group_id())
        .with_session_timeout_ms(30_000)
        .with_rebalance_timeout_ms(30_000)
        .with_member_id(StrBytes::from_string(member.to_string()))
        .with_protocol_type(StrBytes::from_static_str("consumer"))
        .with_protocols(vec![
            JoinGroupRequestProtocol::default()
                .with_name(StrBytes::from_static_str("range"))
                .with_metadata(Bytes::from_static(b"subscription")),
        ])
}

fn commit_offsets(
    kafka: &mut Kafka,
    member: &str,
    generation: i32,
    offsets: &[(&str, i32, i64)],
) -> Vec<i16> {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    let topics = offsets
        .iter()
        .map(|&(topic, partition, offset)| {
            OffsetCommitRequestTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(partition)
                        .with_committed_offset(offset),
                ])
        })
        .collect();
    let request = OffsetCommitRequest::default()
        .with_group_id(group_id())
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(StrBytes::from_string(member.to_string()))
        .with_topics(topics);
    let response: OffsetCommitResponse = exchange(kafka, ApiKey::OffsetCommit, 8, &request, true);
    response.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect()
}

/// (partition, offset, error) of `topic` for the group, at OffsetFetch v5 (one group) and v8
/// (groups), which must agree; `None` asks for every partition with an offset.
fn fetch_offsets(kafka: &mut Kafka, partitions: Option<&[i32]>) -> Vec<(i32, i64, i16)> {
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    let name = || TopicName(StrBytes::from_static_str("orders"));
    let v5 =
        OffsetFetchRequest::default().with_group_id(group_id()).with_topics(partitions.map(|p| {
            vec![
                OffsetFetchRequestTopic::default()
                    .with_name(name())
                    .with_partition_indexes(p.to_vec()),
            ]
        }));
    let old: OffsetFetchResponse = exchange(kafka, ApiKey::OffsetFetch, 5, &v5, false);
    let v8 = OffsetFetchRequest::default().with_groups(vec![
        OffsetFetchRequestGroup::default().with_group_id(group_id()).with_topics(partitions.map(
            |p| {
                vec![
                    OffsetFetchRequestTopics::default()
                        .with_name(name())
                        .with_partition_indexes(p.to_vec()),
                ]
            },
        )),
    ]);
    let new: OffsetFetchResponse = exchange(kafka, ApiKey::OffsetFetch, 8, &v8, true);
    let old: Vec<_> = old
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, p.committed_offset, p.error_code))
        .collect();
    let new: Vec<_> = new.groups[0]
        .topics
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| (p.partition_index, p.committed_offset, p.error_code))
        .collect();
    assert_eq!(old, new, "v5 and v8 agree");
    new
}

/// The group's state and member ids (DescribeGroups v5).
fn describe_group(kafka: &mut Kafka) -> (String, Vec<String>) {
    let request = DescribeGroupsRequest::default().with_groups(vec![group_id()]);
    let described: DescribeGroupsResponse =
        exchange(kafka, ApiKey::DescribeGroups, 5, &request, true);
    let group = &described.groups[0];
    assert_eq!(group.error_code, 0);
    let members = group.members.iter().map(|m| m.member_id.to_string()).collect();
    (group.group_state.to_string(), members)
}

/// (group, state) of every group (ListGroups v4, which has states).
fn list_groups(kafka: &mut Kafka) -> Vec<(String, String)> {
    let listed: ListGroupsResponse =
        exchange(kafka, ApiKey::ListGroups, 4, &ListGroupsRequest::default(), true);
    assert_eq!(listed.error_code, 0);
    listed.groups.iter().map(|g| (g.group_id.to_string(), g.group_state.to_string())).collect()
}

/// One member's whole cycle over the wire, at old and flexible versions: the coordinator is
/// this node, a new member gets its id and then the first generation, the leader's assignment
/// comes back from SyncGroup, heartbeats and commits are checked against the generation, and
/// offsets are stored in the partitions and read back.
#[test]
fn a_group_member_joins_syncs_heartbeats_commits_and_leaves() {
    use kafka_protocol::messages::leave_group_request::MemberIdentity;
    use kafka_protocol::messages::offset_for_leader_epoch_request::{
        OffsetForLeaderPartition, OffsetForLeaderTopic,
    };
    let dir = tempfile::tempdir().unwrap();
    let (server, _raw) = server_with_orders(dir.path(), 1, 2, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let port = server.kafka().unwrap().rsplit(':').next().unwrap().parse::<i32>().unwrap();

    for version in [0, 3] {
        let request =
            FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("billing"));
        let found: FindCoordinatorResponse =
            exchange(&mut kafka, ApiKey::FindCoordinator, version, &request, version >= 3);
        assert_eq!((found.error_code, found.node_id.0, found.port), (0, 0, port), "v{version}");
    }
    let request = FindCoordinatorRequest::default()
        .with_coordinator_keys(vec![StrBytes::from_static_str("billing")]);
    let found: FindCoordinatorResponse =
        exchange(&mut kafka, ApiKey::FindCoordinator, 4, &request, true);
    assert_eq!(found.coordinators.len(), 1);
    assert_eq!((found.coordinators[0].error_code, found.coordinators[0].port), (0, port));

    let first: JoinGroupResponse =
        exchange(&mut kafka, ApiKey::JoinGroup, 5, &join_request(""), false);
    assert_eq!(first.error_code, 79, "MEMBER_ID_REQUIRED");
    let member = first.member_id.to_string();
    assert!(member.starts_with("shoal-test-"), "{member}");
    let joined: JoinGroupResponse =
        exchange(&mut kafka, ApiKey::JoinGroup, 7, &join_request(&member), true);
    assert_eq!(joined.error_code, 0);
    assert_eq!((joined.generation_id, joined.leader.as_str()), (1, member.as_str()));
    assert_eq!(joined.protocol_name.as_deref(), Some("range"));
    assert_eq!(joined.members.len(), 1);
    assert_eq!(joined.members[0].metadata, Bytes::from_static(b"subscription"));

    let sync = sync_request(&member, Some(b"orders 0,1"));
    let synced: SyncGroupResponse = exchange(&mut kafka, ApiKey::SyncGroup, 3, &sync, false);
    assert_eq!((synced.error_code, synced.assignment), (0, Bytes::from_static(b"orders 0,1")));
    assert_eq!(describe_group(&mut kafka), ("Stable".into(), vec![member.clone()]));
    assert_eq!(list_groups(&mut kafka), [("billing".to_string(), "Stable".to_string())]);

    let heartbeat = |generation| heartbeat_request(&member, generation);
    let beat: HeartbeatResponse = exchange(&mut kafka, ApiKey::Heartbeat, 4, &heartbeat(1), true);
    assert_eq!(beat.error_code, 0);
    let stale: HeartbeatResponse = exchange(&mut kafka, ApiKey::Heartbeat, 0, &heartbeat(7), false);
    assert_eq!(stale.error_code, 22, "ILLEGAL_GENERATION");

    // Commits: the member's generation only; a commit outside group management (-1) is
    // refused while the group has members; an unknown partition is UNKNOWN_TOPIC_OR_PARTITION.
    assert_eq!(
        commit_offsets(&mut kafka, &member, 1, &[("orders", 0, 5), ("orders", 1, 0)]),
        [0, 0]
    );
    assert_eq!(commit_offsets(&mut kafka, &member, 2, &[("orders", 0, 6)]), [22]);
    assert_eq!(commit_offsets(&mut kafka, "", -1, &[("orders", 0, 6)]), [25]);
    assert_eq!(commit_offsets(&mut kafka, &member, 1, &[("nope", 0, 1), ("orders", 9, 1)]), [3, 3]);
    // Partition 1's 0 reads as 1: only the commit record itself lies past it, so a consumer
    // there has read everything (lag 0).
    assert_eq!(fetch_offsets(&mut kafka, Some(&[0, 1])), [(0, 5, 0), (1, 1, 0)]);

    let leave = LeaveGroupRequest::default().with_group_id(group_id()).with_members(vec![
        MemberIdentity::default().with_member_id(StrBytes::from_string(member.clone())),
    ]);
    let left: LeaveGroupResponse = exchange(&mut kafka, ApiKey::LeaveGroup, 4, &leave, true);
    assert_eq!((left.error_code, left.members.len(), left.members[0].error_code), (0, 1, 0));
    let gone: HeartbeatResponse = exchange(&mut kafka, ApiKey::Heartbeat, 4, &heartbeat(1), true);
    assert_eq!(gone.error_code, 25, "UNKNOWN_MEMBER_ID");
    assert_eq!(describe_group(&mut kafka), ("Dead".into(), Vec::new()), "no member: not kept");
    assert!(list_groups(&mut kafka).is_empty());
    // An empty group takes commits outside group management; "every partition" lists only
    // partitions with an offset.
    assert_eq!(commit_offsets(&mut kafka, "", -1, &[("orders", 1, 3)]), [0]);
    assert_eq!(fetch_offsets(&mut kafka, None), [(0, 5, 0), (1, 3, 0)]);

    // The committed end for the view the partition is in.
    let request = OffsetForLeaderEpochRequest::default().with_topics(vec![
        OffsetForLeaderTopic::default()
            .with_topic(TopicName(StrBytes::from_static_str("orders")))
            .with_partitions(vec![
                OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(0)
                    .with_leader_epoch(0),
                OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(3)
                    .with_leader_epoch(0),
            ]),
    ]);
    let epochs: OffsetForLeaderEpochResponse =
        exchange(&mut kafka, ApiKey::OffsetForLeaderEpoch, 3, &request, false);
    let answers: Vec<_> = epochs.topics[0]
        .partitions
        .iter()
        .map(|p| (p.error_code, p.leader_epoch, p.end_offset))
        .collect();
    // Partition 0 holds one record, the group's commit of offset 5: its committed end is 1.
    assert_eq!(answers, [(0, 0, 1), (75, -1, -1)], "UNKNOWN_LEADER_EPOCH for a future epoch");
}

/// A topic to create: name, partitions, replication factor, configs.
type NewTopic<'a> = (&'a str, i32, i16, &'a [(&'a str, &'a str)]);

fn create_topics(
    kafka: &mut Kafka,
    version: i16,
    topics: &[NewTopic],
    validate_only: bool,
) -> Vec<(i16, i32)> {
    use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
    let topics = topics
        .iter()
        .map(|&(name, partitions, replication, configs)| {
            CreatableTopic::default()
                .with_name(TopicName(StrBytes::from_string(name.to_string())))
                .with_num_partitions(partitions)
                .with_replication_factor(replication)
                .with_configs(
                    configs
                        .iter()
                        .map(|&(key, value)| {
                            CreatableTopicConfig::default()
                                .with_name(StrBytes::from_string(key.to_string()))
                                .with_value(Some(StrBytes::from_string(value.to_string())))
                        })
                        .collect(),
                )
        })
        .collect();
    let request = CreateTopicsRequest::default()
        .with_topics(topics)
        .with_timeout_ms(30_000)
        .with_validate_only(validate_only);
    let response: CreateTopicsResponse =
        exchange(kafka, ApiKey::CreateTopics, version, &request, version >= 5);
    response.topics.iter().map(|t| (t.error_code, t.num_partitions)).collect()
}

/// The admin APIs over the wire: topics created with Kafka configs (and refused for what Shoal
/// does not have), their configs described, deleted by name and by id; the cluster described;
/// and, with `[kafka] auto_create_topics`, a Metadata request creating the topic it names.
#[test]
fn admin_apis_create_describe_and_delete_topics() {
    use kafka_protocol::messages::delete_topics_request::DeleteTopicState;
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    let dir = tempfile::tempdir().unwrap();
    // No Kafka stream yet: the first CreateTopics makes it.
    let server = common::start(dir.path(), 1);
    let mut kafka = Kafka::connect(&server);
    let created = create_topics(
        &mut kafka,
        5,
        &[
            ("events", 2, -1, &[("retention.ms", "60000"), ("shoal.durability", "persisted")]),
            ("compacted", 1, -1, &[("cleanup.policy", "compact")]),
            ("triple", 1, 3, &[]),
            ("empty", 0, -1, &[]),
            ("bad name!", 1, -1, &[]),
            ("odd", 1, -1, &[("min.insync.replicas", "2")]),
        ],
        false,
    );
    assert_eq!(created, [(0, 2), (40, -1), (38, -1), (37, -1), (17, -1), (40, -1)]);
    assert_eq!(create_topics(&mut kafka, 2, &[("events", 1, -1, &[])], false), [(36, -1)]);
    assert_eq!(create_topics(&mut kafka, 7, &[("dry", 3, 1, &[])], true), [(0, 3)]);
    let listed = metadata(&mut kafka, 12, None);
    let names: Vec<_> =
        listed.topics.iter().map(|t| t.name.as_ref().unwrap().to_string()).collect();
    assert_eq!(names, ["events"], "validate_only created nothing");
    assert_eq!(listed.topics[0].partitions.len(), 2);
    assert_eq!(listed.controller_id.0, 0);

    // Grown from 2 to 4 partitions (v3); not shrunk, not to the same count; validate_only
    // changes nothing.
    let grow = |kafka: &mut Kafka, count: i32, validate_only: bool| -> i16 {
        use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
        let request = CreatePartitionsRequest::default()
            .with_topics(vec![
                CreatePartitionsTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str("events")))
                    .with_count(count)
                    .with_assignments(None),
            ])
            .with_timeout_ms(30_000)
            .with_validate_only(validate_only);
        let response: CreatePartitionsResponse =
            exchange(kafka, ApiKey::CreatePartitions, 3, &request, true);
        response.results[0].error_code
    };
    assert_eq!(grow(&mut kafka, 9, true), 0);
    assert_eq!(grow(&mut kafka, 4, false), 0);
    assert_eq!(grow(&mut kafka, 4, false), 37, "INVALID_PARTITIONS");
    assert_eq!(grow(&mut kafka, 1, false), 37);
    let listed = metadata(&mut kafka, 12, None);
    assert_eq!(listed.topics[0].partitions.len(), 4);
    let batch = Bytes::from(common::batch(&[b"to the new partition"]));
    let stored = produce(&mut kafka, 9, -1, &[("events", 3, batch)]).unwrap();
    assert_eq!(produced(&stored), [(0, 0)], "the new partition takes writes");

    let request = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("events")),
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("nope")),
    ]);
    let described: DescribeConfigsResponse =
        exchange(&mut kafka, ApiKey::DescribeConfigs, 4, &request, true);
    let configs: std::collections::BTreeMap<String, (String, i8)> = described.results[0]
        .configs
        .iter()
        .map(|c| (c.name.to_string(), (c.value.as_deref().unwrap().to_string(), c.config_source)))
        .collect();
    assert_eq!(configs.get("retention.ms"), Some(&("60000".into(), 1)), "{described:?}");
    assert_eq!(configs["shoal.durability"], ("persisted".into(), 1));
    assert_eq!(configs["cleanup.policy"], ("delete".into(), 5));
    assert_eq!(described.results[1].error_code, 3);

    let cluster: DescribeClusterResponse =
        exchange(&mut kafka, ApiKey::DescribeCluster, 1, &DescribeClusterRequest::default(), true);
    assert_eq!((cluster.error_code, cluster.controller_id.0, cluster.brokers.len()), (0, 0, 1));
    assert_eq!(
        cluster.brokers[0].port.to_string(),
        server.kafka().unwrap().rsplit(':').next().unwrap()
    );

    // Deleted by id (v6), then unknown by name (v4).
    let id = listed.topics[0].topic_id;
    let request = DeleteTopicsRequest::default()
        .with_topics(vec![DeleteTopicState::default().with_topic_id(id)])
        .with_timeout_ms(30_000);
    let deleted: DeleteTopicsResponse =
        exchange(&mut kafka, ApiKey::DeleteTopics, 6, &request, true);
    assert_eq!(deleted.responses[0].error_code, 0);
    assert_eq!(deleted.responses[0].name.as_ref().map(|n| n.as_str()), Some("events"));
    let request = DeleteTopicsRequest::default()
        .with_topic_names(vec![TopicName(StrBytes::from_static_str("events"))])
        .with_timeout_ms(30_000);
    let again: DeleteTopicsResponse = exchange(&mut kafka, ApiKey::DeleteTopics, 4, &request, true);
    assert_eq!(again.responses[0].error_code, 3);
    assert!(metadata(&mut kafka, 12, None).topics.is_empty());
    drop(kafka);
    drop(server);

    // Auto-creation: off by default (above: unknown stays unknown), on by the config key.
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_KAFKA_AUTO_CREATE_TOPICS", "true");
    let server = common::start_command(command);
    let mut kafka = Kafka::connect(&server);
    let answered = metadata(&mut kafka, 9, Some(&["fresh"]));
    assert_eq!(answered.topics[0].error_code, 0, "created on first use");
    assert_eq!(answered.topics[0].partitions.len(), 1, "the default partition count");
}

/// A three-node cluster whose Kafka stream holds `orders`, of 3 partitions.
fn cluster_with_orders(dir: &std::path::Path) -> shoal_testkit::ShoalCluster {
    use common::cluster::{call_anywhere, cluster, create_topic_as};
    use shoal_proto::protocol::{CreateTopic, Operation, encode_stream_name};
    let cluster = cluster(dir);
    let created = call_anywhere(&cluster, 0, Operation::CreateStream, &encode_stream_name("kafka"));
    assert_eq!(created.map(|(code, _)| code), Some(0));
    let orders = CreateTopic {
        stream: "kafka".into(),
        topic: "orders".into(),
        partitions: 3,
        ..CreateTopic::default()
    };
    create_topic_as(&cluster, orders);
    cluster
}

/// The node FindCoordinator on node `asked` names for the group, once it names one (other
/// than `not`).
fn find_coordinator(
    cluster: &shoal_testkit::ShoalCluster,
    asked: usize,
    not: Option<usize>,
) -> usize {
    let deadline = std::time::Instant::now() + common::DEADLINE;
    loop {
        let mut kafka = Kafka::connect(&cluster.nodes[asked]);
        let request =
            FindCoordinatorRequest::default().with_key(StrBytes::from_static_str("billing"));
        let found: FindCoordinatorResponse =
            exchange(&mut kafka, ApiKey::FindCoordinator, 3, &request, true);
        let node = found.node_id.0 as usize;
        if found.error_code == 0 && Some(node) != not {
            return node;
        }
        assert!(std::time::Instant::now() < deadline, "no coordinator: {found:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// On a cluster, a group's offsets are committed and read on its coordinator (the metadata
/// primary) but live in each partition's log, which only the partition's primary writes: the
/// coordinator forwards what its own replicas cannot do, and each offset lands in its
/// partition (read back natively from the partition's primary).
#[test]
fn a_cluster_coordinator_commits_and_reads_offsets_of_partitions_other_nodes_lead() {
    use common::cluster::call_anywhere;
    use shoal_proto::protocol::Operation;
    use shoal_proto::protocol::consumer::{
        ConsumerId, OffsetKey, PartitionRef, decode_stored_offset,
    };
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster_with_orders(dir.path());
    // The coordinator, and every partition's leader as the coordinator sees it (once it has
    // applied the topic and each partition has a primary).
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let coordinator = find_coordinator(&cluster, 0, None);
    let mut kafka = Kafka::connect(&cluster.nodes[coordinator]);
    let leaders = loop {
        let response = metadata(&mut kafka, 12, Some(&["orders"]));
        let leaders: Vec<i32> = response.topics[0]
            .partitions
            .iter()
            .filter(|p| p.error_code == 0)
            .map(|p| p.leader_id.0)
            .collect();
        if leaders.len() == 3 && leaders.iter().all(|&leader| leader >= 0) {
            break leaders;
        }
        assert!(std::time::Instant::now() < deadline, "no leaders: {response:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        leaders.iter().any(|&leader| leader as usize != coordinator),
        "some partition is led elsewhere than the coordinator, node {coordinator}: {leaders:?}"
    );

    // A commit outside group management (the group is empty), retried while a replica is
    // still settling, as a Kafka client retries.
    let offsets = [("orders", 0, 5), ("orders", 1, 6), ("orders", 2, 7)];
    loop {
        let errors = commit_offsets(&mut kafka, "", -1, &offsets);
        if errors == [0, 0, 0] {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "commits refused: {errors:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fetch_offsets(&mut kafka, Some(&[0, 1, 2])), [(0, 5, 0), (1, 6, 0), (2, 7, 0)]);
    assert_eq!(fetch_offsets(&mut kafka, None), [(0, 5, 0), (1, 6, 0), (2, 7, 0)]);

    for (partition, stored) in [(0, 5), (1, 6), (2, 7)] {
        let key = OffsetKey {
            partition: PartitionRef { stream: "kafka".into(), topic: "orders".into(), partition },
            consumer: ConsumerId::group("billing"),
        };
        let (code, body) = call_anywhere(&cluster, 0, Operation::GetOffset, &key.encode())
            .expect("a GetOffset is answered");
        assert_eq!(code, 0, "{}", String::from_utf8_lossy(&body));
        assert_eq!(decode_stored_offset(&body).unwrap(), Some(stored), "partition {partition}");
    }
}

/// (error, low watermark) of each partition of `orders` a DeleteRecords at `version` answers.
fn delete_records(kafka: &mut Kafka, version: i16, asked: &[(i32, i64)]) -> Vec<(i16, i64)> {
    use kafka_protocol::messages::delete_records_request::{
        DeleteRecordsPartition, DeleteRecordsTopic,
    };
    use kafka_protocol::messages::{DeleteRecordsRequest, DeleteRecordsResponse};
    let partitions = asked
        .iter()
        .map(|&(index, offset)| {
            DeleteRecordsPartition::default().with_partition_index(index).with_offset(offset)
        })
        .collect();
    let request = DeleteRecordsRequest::default().with_timeout_ms(30_000).with_topics(vec![
        DeleteRecordsTopic::default()
            .with_name(TopicName(StrBytes::from_static_str("orders")))
            .with_partitions(partitions),
    ]);
    let response: DeleteRecordsResponse =
        exchange(kafka, ApiKey::DeleteRecords, version, &request, version >= 2);
    response.topics[0].partitions.iter().map(|p| (p.error_code, p.low_watermark)).collect()
}

/// DeleteRecords moves the log start: records below it are gone to Fetch and ListOffsets at
/// once, it never moves down, an offset past the end is refused, −1 means the end, and a
/// restart keeps it (it is a record in the partition's log).
#[test]
fn delete_records_moves_the_log_start_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, _) = server_with_orders(dir.path(), 1, 2, Durability::Persisted);
    let mut kafka = Kafka::connect(&server);
    for value in [b"m0", b"m1", b"m2", b"m3", b"m4", b"m5"] {
        let batch = Bytes::from(common::batch(&[value]));
        let answer = produce(&mut kafka, 9, -1, &[("orders", 0, batch)]).unwrap();
        assert_eq!(produced(&answer)[0].0, 0);
    }
    let id = shoal_kafka::Uuid::nil();
    for version in 0..=2 {
        assert_eq!(
            delete_records(&mut kafka, version, &[(0, 2 + i64::from(version))]),
            [(0, 2 + i64::from(version))]
        );
    }
    assert_eq!(delete_records(&mut kafka, 2, &[(0, 1)]), [(0, 4)], "never down");
    assert_eq!(delete_records(&mut kafka, 2, &[(0, 99), (7, 1)]), [(1, -1), (3, -1)]);
    assert_eq!(list_offsets(&mut kafka, 7, &[("orders", -2)]), [(0, 4)]);
    let (error, _, _) = fetched(&fetch(&mut kafka, 12, id, 3, 0), 0);
    assert_eq!(error, 1, "OFFSET_OUT_OF_RANGE below the log start");
    let (error, _, values) = fetched(&fetch(&mut kafka, 12, id, 4, 0), 4);
    assert_eq!(error, 0);
    // m4 and m5, then the three log-start control records (which consumers skip).
    let offsets: Vec<u64> = values.iter().map(|(offset, _)| *offset).collect();
    assert_eq!(offsets, [4, 5, 6, 7, 8]);
    assert_eq!((values[0].1.as_slice(), values[1].1.as_slice()), (&b"m4"[..], &b"m5"[..]));

    // The log start record took offset 6 (and 7, 8 the earlier ones): -1 is the end, 9.
    let end = list_offsets(&mut kafka, 7, &[("orders", -1)])[0].1;
    assert_eq!(delete_records(&mut kafka, 1, &[(0, -1)]), [(0, end)]);
    common::restart(&mut server);
    let mut kafka = Kafka::connect(&server);
    assert_eq!(
        list_offsets(&mut kafka, 7, &[("orders", -2), ("orders", -1)]),
        [(0, end), (0, end + 1)]
    );
}

/// A group's completed rebalance is stored in the metadata log: after `kill -9` and a restart,
/// the coordinator that starts takes it up, and its member goes on heartbeating, committing
/// and syncing under the same id and generation, without rejoining.
#[test]
fn a_stable_group_survives_a_coordinator_restart_without_a_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let (mut server, _raw) = server_with_orders(dir.path(), 1, 2, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let first: JoinGroupResponse =
        exchange(&mut kafka, ApiKey::JoinGroup, 7, &join_request(""), true);
    let member = first.member_id.to_string();
    let joined: JoinGroupResponse =
        exchange(&mut kafka, ApiKey::JoinGroup, 7, &join_request(&member), true);
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    let sync = sync_request(&member, Some(b"orders 0,1"));
    let synced: SyncGroupResponse = exchange(&mut kafka, ApiKey::SyncGroup, 5, &sync, true);
    assert_eq!(synced.error_code, 0);
    // The store is not waited for; a later metadata op committing means it did (one log).
    let created = create_topics(&mut kafka, 7, &[("later", 1, -1, &[])], false);
    assert_eq!(created, [(0, 1)]);

    server.kill_9();
    common::restart(&mut server);
    let mut kafka = Kafka::connect(&server);
    let heartbeat = heartbeat_request(&member, 1);
    let beat: HeartbeatResponse = exchange(&mut kafka, ApiKey::Heartbeat, 4, &heartbeat, true);
    assert_eq!(beat.error_code, 0, "the member is known, in generation 1");
    assert_eq!(commit_offsets(&mut kafka, &member, 1, &[("orders", 0, 3)]), [0]);
    let resynced: SyncGroupResponse =
        exchange(&mut kafka, ApiKey::SyncGroup, 5, &sync_request(&member, None), true);
    assert_eq!((resynced.error_code, resynced.assignment), (0, Bytes::from_static(b"orders 0,1")));
    assert_eq!(describe_group(&mut kafka), ("Stable".into(), vec![member.clone()]));
}

/// A stable group's rebalance is stored in the metadata log, so when its coordinator's node is
/// `kill -9`ed the coordinator on the new metadata primary takes the group up: the member goes
/// on heartbeating and committing under its id and generation, with no rebalance.
#[test]
fn a_stable_group_survives_the_loss_of_its_coordinators_node() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster_with_orders(dir.path());
    let deadline = std::time::Instant::now() + common::DEADLINE;
    let coordinator = find_coordinator(&cluster, 0, None);
    let mut kafka = Kafka::connect(&cluster.nodes[coordinator]);
    // The coordinator starts once its node has caught up: NOT_COORDINATOR until then.
    let member = loop {
        let first: JoinGroupResponse =
            exchange(&mut kafka, ApiKey::JoinGroup, 7, &join_request(""), true);
        if first.error_code == 79 {
            break first.member_id.to_string();
        }
        assert!(std::time::Instant::now() < deadline, "no join: {first:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let joined: JoinGroupResponse =
        exchange(&mut kafka, ApiKey::JoinGroup, 7, &join_request(&member), true);
    assert_eq!((joined.error_code, joined.generation_id), (0, 1));
    let sync = sync_request(&member, Some(b"orders 0,1,2"));
    let synced: SyncGroupResponse = exchange(&mut kafka, ApiKey::SyncGroup, 5, &sync, true);
    assert_eq!(synced.error_code, 0);
    // A later metadata op committed: so did the store before it (one log, a quorum).
    assert_eq!(create_topics(&mut kafka, 7, &[("later", 1, -1, &[])], false), [(0, 1)]);

    cluster.nodes[coordinator].kill_9();
    let survivor = (coordinator + 1) % 3;
    let next = find_coordinator(&cluster, survivor, Some(coordinator));
    let mut kafka = Kafka::connect(&cluster.nodes[next]);
    let heartbeat = heartbeat_request(&member, 1);
    loop {
        let beat: HeartbeatResponse = exchange(&mut kafka, ApiKey::Heartbeat, 4, &heartbeat, true);
        // NOT_COORDINATOR while the new primary catches up; anything else is the answer.
        if beat.error_code != 16 {
            assert_eq!(beat.error_code, 0, "the member is known there, in generation 1");
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the new coordinator never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The dead node led some partitions: until their groups elect a new primary, a commit
    // forwarded there is REQUEST_TIMED_OUT or NOT_LEADER_OR_FOLLOWER, which a client retries.
    loop {
        let errors = commit_offsets(&mut kafka, &member, 1, &[("orders", 2, 4)]);
        if !matches!(errors[..], [6 | 7]) {
            assert_eq!(errors, [0]);
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the commit was never taken: {errors:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(fetch_offsets(&mut kafka, Some(&[2])), [(2, 4, 0)]);
}

/// A log start moved into the middle of a batch: a native consumer whose stored offset lies
/// below it is told its poll starts at the log start, so it skips the deleted records of the
/// batch it gets.
#[test]
fn a_poll_from_below_a_mid_batch_log_start_starts_at_the_log_start() {
    use shoal_proto::protocol::Operation;
    use shoal_proto::protocol::consumer::{
        ConsumerId, Membership, PartitionRef, Poll, StoreOffset,
    };
    let dir = tempfile::tempdir().unwrap();
    let (server, mut raw) = server_with_orders(dir.path(), 1, 1, Durability::Replicated);
    let mut kafka = Kafka::connect(&server);
    let batch = Bytes::from(common::batch(&[b"a", b"b", b"c", b"d"]));
    assert_eq!(produced(&produce(&mut kafka, 9, -1, &[("orders", 0, batch)]).unwrap()), [(0, 0)]);
    let partition = PartitionRef { stream: "kafka".into(), topic: "orders".into(), partition: 0 };
    let consumer = ConsumerId::consumer("c");
    let store = StoreOffset {
        partition: partition.clone(),
        consumer: consumer.clone(),
        membership: Membership::default(),
        offset: 1,
    };
    raw.call(Operation::StoreOffset, &store.encode()).ok();
    assert_eq!(delete_records(&mut kafka, 2, &[(0, 2)]), [(0, 2)]);
    let poll = Poll {
        partition,
        consumer,
        membership: Membership::default(),
        bytes_max: 1 << 20,
        count_max: 100,
        wait_ms_max: 0,
        auto_commit: false,
    };
    let answer = raw.call(Operation::Poll, &poll.encode());
    let body = answer.ok();
    let start = u64::from_le_bytes(body[..8].try_into().unwrap());
    assert_eq!(start, 2, "told to start at the log start, not at its stored offset 1");
    let (_, records) = common::decode_fetch(&body[8..]);
    let values: Vec<Vec<u8>> =
        records.into_iter().filter(|(offset, _)| *offset >= start).map(|(_, v)| v).collect();
    assert_eq!(values, [b"c".to_vec(), b"d".to_vec()]);
}
