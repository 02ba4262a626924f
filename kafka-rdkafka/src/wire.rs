//! A Kafka producer without a client library, for `shoal-kafka-bench --client wire`: it sends
//! what librdkafka sends under the bench's settings — idempotent RecordBatch v2 batches filled
//! up to `message.max.bytes` (10⁶ bytes), Produce v9 with acks=all, at most 5 requests in flight
//! on one connection (librdkafka's bound under idempotence) — from one frame per partition
//! built once and re-sequenced (base sequence and CRC-32C) per send. So the listener's cost is
//! measured apart from the client library's: on a two-core machine librdkafka's broker thread
//! takes most of a core.
//!
//! It speaks to one broker (the bootstrap address), which must lead every partition it writes:
//! the bench's one-node server.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::ops::Range;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    ApiKey, InitProducerIdRequest, InitProducerIdResponse, ProduceRequest, ProduceResponse,
    RequestHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, StrBytes};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::checksum::crc32c;

/// Largest batch, as librdkafka fills them: its `message.max.bytes` default.
pub const BATCH_BYTES_MAX: usize = 1_000_000;
/// Requests in flight on the connection: librdkafka's bound with idempotence.
pub const IN_FLIGHT_MAX: usize = 5;
/// Produce version sent (librdkafka 2.x's for these settings).
const PRODUCE_VERSION: i16 = 9;
/// A response frame read at most (a Produce response is a few dozen bytes).
const RESPONSE_BYTES_MAX: usize = 1 << 20;
/// RecordBatch v2 byte positions: the CRC, the first byte it covers, the base sequence.
const CRC_AT: usize = 17;
const CRC_FROM: usize = 21;
const BASE_SEQUENCE_AT: usize = 53;

/// One acknowledged batch: when it was sent and answered (ns since the run's start) and its
/// messages.
#[derive(Debug, Clone, Copy)]
pub struct Acked {
    pub sent_ns: u64,
    pub acked_ns: u64,
    pub messages: u32,
}

/// What one producer saw.
#[derive(Debug, Default)]
pub struct WireRun {
    pub acked: Vec<Acked>,
    /// Batches refused (any error code), and the first refusal.
    pub errors: u64,
    pub first_error: Option<String>,
    /// Messages per batch.
    pub batch_messages: u32,
    /// Bytes per batch.
    pub batch_bytes: usize,
    /// Batches acknowledged, in or out of the window.
    pub batches_acked: u64,
}

/// One Kafka connection: requests out, responses in, in order.
struct Connection {
    stream: TcpStream,
    correlation_id: i32,
}

impl Connection {
    fn connect(address: &str) -> Result<Connection, String> {
        let stream = TcpStream::connect(address).map_err(|e| format!("{address}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        stream.set_read_timeout(Some(Duration::from_secs(30))).map_err(|e| e.to_string())?;
        Ok(Connection { stream, correlation_id: 0 })
    }

    /// The frame of `request` at `version` under the next correlation id.
    fn frame<R: Encodable + HeaderVersion>(
        &mut self,
        key: ApiKey,
        version: i16,
        request: &R,
    ) -> BytesMut {
        self.correlation_id += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation_id)
            .with_client_id(Some(StrBytes::from_static_str("shoal-kafka-bench-wire")));
        let mut frame = BytesMut::new();
        frame.extend_from_slice(&[0; 4]);
        header.encode(&mut frame, R::header_version(version)).expect("a valid header");
        request.encode(&mut frame, version).expect("a valid request");
        let size = (frame.len() - 4) as i32;
        frame[..4].copy_from_slice(&size.to_be_bytes());
        frame
    }

    /// The next response's body after its header (v0, or v1 when `flexible`).
    fn receive(&mut self, flexible: bool) -> Result<(i32, Bytes), String> {
        self.receive_up_to(flexible, RESPONSE_BYTES_MAX)
    }

    /// [`Connection::receive`] of a frame of at most `bytes_max` bytes.
    fn receive_up_to(&mut self, flexible: bool, bytes_max: usize) -> Result<(i32, Bytes), String> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).map_err(|e| format!("reading a response: {e}"))?;
        let size = i32::from_be_bytes(size);
        let size = usize::try_from(size)
            .ok()
            .filter(|&s| (4 + usize::from(flexible)..=bytes_max).contains(&s))
            .ok_or_else(|| format!("a response of {size} bytes"))?;
        let mut body = vec![0u8; size];
        self.stream.read_exact(&mut body).map_err(|e| format!("reading a response: {e}"))?;
        let correlation_id = i32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
        // A flexible header's tagged fields: none are sent (one zero byte).
        let skip = 4 + usize::from(flexible);
        Ok((correlation_id, Bytes::from(body).slice(skip..)))
    }
}

/// Writes batches of at most `batch_bytes_max` bytes ([`BATCH_BYTES_MAX`] as librdkafka) to
/// `partitions` of `topic` at `address` round-robin, as fast as 5 requests in flight allow,
/// until `window.end` (ns since `start`); batches answered within `window` are counted.
pub fn run(
    address: &str,
    topic: &str,
    partitions: &[i32],
    message_size: usize,
    batch_bytes_max: usize,
    start: Instant,
    window: Range<u64>,
) -> Result<WireRun, String> {
    let mut connection = Connection::connect(address)?;
    let init = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(kafka_protocol::messages::ProducerId(-1))
        .with_producer_epoch(-1);
    let frame = connection.frame(ApiKey::InitProducerId, 4, &init);
    connection.stream.write_all(&frame).map_err(|e| format!("InitProducerId: {e}"))?;
    let (_, mut body) = connection.receive(true)?;
    let granted = InitProducerIdResponse::decode(&mut body, 4).map_err(|e| e.to_string())?;
    if granted.error_code != 0 {
        return Err(format!("InitProducerId refused: error {}", granted.error_code));
    }
    let (producer_id, epoch) = (granted.producer_id.0, granted.producer_epoch);

    // The batch: as many messages as fit in `batch_bytes_max` (at least one).
    let payload: Vec<u8> = (0..message_size).map(|i| b'a' + (i % 26) as u8).collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    let mut builder = BatchBuilder::new(now_ms).producer(producer_id, epoch, 0);
    loop {
        builder.push(now_ms, None, Some(&payload), &[]);
        if builder.encoded_size() > batch_bytes_max {
            break;
        }
    }
    // One message too many was pushed: build again without it.
    let messages = (builder.len() - 1).max(1);
    let mut builder = BatchBuilder::new(now_ms).producer(producer_id, epoch, 0);
    for _ in 0..messages {
        builder.push(now_ms, None, Some(&payload), &[]);
    }
    let batch = builder.build();

    // One frame per partition, each with its batch's place in it.
    let mut frames: Vec<(BytesMut, usize)> = Vec::with_capacity(partitions.len());
    for &partition in partitions {
        let request =
            ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![
                TopicProduceData::default()
                    .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partition_data(vec![
                        PartitionProduceData::default()
                            .with_index(partition)
                            .with_records(Some(batch.clone())),
                    ]),
            ]);
        let frame = connection.frame(ApiKey::Produce, PRODUCE_VERSION, &request);
        // After the batch: the partition's, the topic's and the request's (empty) tagged fields.
        let at = frame.len() - 3 - batch.len();
        assert_eq!(&frame[at..at + batch.len()], &batch[..], "the batch's place in the frame");
        frames.push((frame, at));
    }

    let mut run =
        WireRun { batch_messages: messages as u32, batch_bytes: batch.len(), ..WireRun::default() };
    let mut sequences = vec![0i32; partitions.len()];
    let mut in_flight: std::collections::VecDeque<(i32, u64)> = std::collections::VecDeque::new();
    let mut next = 0usize;
    let mut correlation_id = connection.correlation_id;
    loop {
        let now = start.elapsed().as_nanos() as u64;
        let sending = now < window.end;
        if sending && in_flight.len() < IN_FLIGHT_MAX {
            let slot = next % partitions.len();
            next += 1;
            let (frame, at) = &mut frames[slot];
            correlation_id += 1;
            frame[8..12].copy_from_slice(&correlation_id.to_be_bytes());
            let batch = &mut frame[*at..*at + batch.len()];
            batch[BASE_SEQUENCE_AT..BASE_SEQUENCE_AT + 4]
                .copy_from_slice(&sequences[slot].to_be_bytes());
            let crc = crc32c(&batch[CRC_FROM..]);
            batch[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
            sequences[slot] = sequences[slot].wrapping_add(messages as i32) & i32::MAX;
            connection.stream.write_all(frame).map_err(|e| format!("Produce: {e}"))?;
            in_flight.push_back((correlation_id, now));
            continue;
        }
        let Some((expected, sent_ns)) = in_flight.pop_front() else { break };
        let (answered, mut body) = connection.receive(true)?;
        if answered != expected {
            return Err(format!("response to {answered}, not {expected}"));
        }
        let response =
            ProduceResponse::decode(&mut body, PRODUCE_VERSION).map_err(|e| e.to_string())?;
        let error = response
            .responses
            .iter()
            .flat_map(|t| &t.partition_responses)
            .map(|p| p.error_code)
            .find(|&code| code != 0);
        let acked_ns = start.elapsed().as_nanos() as u64;
        match error {
            Some(code) => {
                run.errors += 1;
                run.first_error.get_or_insert_with(|| format!("Produce error {code}"));
            }
            None => {
                run.batches_acked += 1;
                if window.contains(&acked_ns) {
                    run.acked.push(Acked { sent_ns, acked_ns, messages: messages as u32 });
                }
            }
        }
    }
    Ok(run)
}

/// What one library-less consumer read.
#[derive(Debug, Default)]
pub struct WireRead {
    /// Records read (control records included: a consumer client skips them itself).
    pub records: u64,
    /// Bytes of the batches read.
    pub batch_bytes: u64,
    /// Fetch requests answered.
    pub fetches: u64,
    /// From the first Fetch sent to the last answer.
    pub elapsed: Duration,
}

/// Bytes one Fetch asks per partition and per response: librdkafka's defaults
/// (`max.partition.fetch.bytes`, `fetch.max.bytes`).
const FETCH_PARTITION_BYTES_MAX: i32 = 1 << 20;
const FETCH_RESPONSE_BYTES_MAX: i32 = 50 << 20;
/// The Fetch version sent (librdkafka 2.x's with topic names).
const FETCH_VERSION: i16 = 12;
/// A Fetch response read at most: the response bound and room for its fields.
const FETCH_RESPONSE_FRAME_MAX: usize = FETCH_RESPONSE_BYTES_MAX as usize + (1 << 20);

/// Reads `partitions` of `topic` at `address` from offset 0 to the end each had when it began
/// (ListOffsets), one Fetch at a time as a consumer does — `max.partition.fetch.bytes` 1 MiB,
/// `fetch.max.bytes` 50 MiB — walking each response's batch headers for the next offsets.
pub fn consume(address: &str, topic: &str, partitions: &[i32]) -> Result<WireRead, String> {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{
        BrokerId, FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse,
    };
    let mut connection = Connection::connect(address)?;
    let name = || TopicName(StrBytes::from_string(topic.to_string()));
    let latest = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
        ListOffsetsTopic::default().with_name(name()).with_partitions(
            partitions
                .iter()
                .map(|&p| {
                    ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1)
                })
                .collect(),
        ),
    ]);
    let frame = connection.frame(ApiKey::ListOffsets, 7, &latest);
    connection.stream.write_all(&frame).map_err(|e| format!("ListOffsets: {e}"))?;
    let (_, mut body) = connection.receive(true)?;
    let ends = ListOffsetsResponse::decode(&mut body, 7).map_err(|e| e.to_string())?;
    let mut goal: Vec<(i32, i64, i64)> = Vec::new(); // (partition, next offset, end)
    for answered in ends.topics.iter().flat_map(|t| &t.partitions) {
        if answered.error_code != 0 {
            return Err(format!("ListOffsets: error {}", answered.error_code));
        }
        goal.push((answered.partition_index, 0, answered.offset));
    }
    let mut read = WireRead::default();
    let started = Instant::now();
    while goal.iter().any(|&(_, next, end)| next < end) {
        let wanted = goal
            .iter()
            .filter(|&&(_, next, end)| next < end)
            .map(|&(partition, next, _)| {
                FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(next)
                    .with_partition_max_bytes(FETCH_PARTITION_BYTES_MAX)
            })
            .collect();
        let request = FetchRequest::default()
            .with_replica_id(BrokerId(-1))
            .with_max_wait_ms(500)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_RESPONSE_BYTES_MAX)
            .with_topics(vec![FetchTopic::default().with_topic(name()).with_partitions(wanted)]);
        let frame = connection.frame(ApiKey::Fetch, FETCH_VERSION, &request);
        connection.stream.write_all(&frame).map_err(|e| format!("Fetch: {e}"))?;
        let (_, mut body) = connection.receive_up_to(true, FETCH_RESPONSE_FRAME_MAX)?;
        let response =
            FetchResponse::decode(&mut body, FETCH_VERSION).map_err(|e| e.to_string())?;
        read.fetches += 1;
        for answered in response.responses.iter().flat_map(|t| &t.partitions) {
            if answered.error_code != 0 {
                return Err(format!("Fetch: error {}", answered.error_code));
            }
            let Some(slot) = goal.iter_mut().find(|(p, _, _)| *p == answered.partition_index)
            else {
                continue;
            };
            let mut rest: &[u8] = answered.records.as_deref().unwrap_or_default();
            while !rest.is_empty() {
                let header = shoal_proto::batch::BatchHeader::parse(rest)
                    .map_err(|e| format!("a fetched batch: {e:?}"))?;
                let size = header.total_size();
                read.records += u64::from(header.record_count());
                read.batch_bytes += size as u64;
                slot.1 = header.base_offset() + i64::from(header.last_offset_delta()) + 1;
                rest = &rest[size.min(rest.len())..];
            }
        }
    }
    read.elapsed = started.elapsed();
    Ok(read)
}
