//! The Produce answer: each partition's record batch checked as the native path checks it
//! (size bound, framing, CRC-32C, attributes), handed to the shard that owns the partition as
//! the same write a native produce is, and answered once its group replies — committed, or why
//! not, in Kafka's codes.
//!
//! Idempotent producers need nothing more: the batch header carries the producer id, epoch and
//! sequence, and the partition's primary deduplicates by them (docs/protocol.md, "Idempotent
//! produce"). `acks` 1 and −1 both wait for the commit (a quorum, durably for `persisted`
//! topics): Shoal acknowledges nothing before, so `acks=1` is as strong as `all` here. `acks`
//! 0 gets no response, as in Kafka. A partition's answer never waits on another's: they are
//! sent to their shards together and collected after.

use bytes::{Bytes, BytesMut};
use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, TopicProduceResponse,
};
use shoal_kafka::kafka_protocol::messages::{ProduceResponse, TopicName};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::ProduceRequest;
use shoal_proto::batch::{self, BatchLimits};
use shoal_proto::checksum;
use shoal_proto::protocol::Operation;
use shoal_replication::Request;

use super::Connection;
use super::errors::kafka_error;
use crate::shard::{Body, Outcome, Work, now_ms};

/// The byte position of the magic byte in a batch of any message format (after the base offset,
/// the length and a 4-byte field: the CRC before v2, the partition leader epoch from v2).
const MAGIC_POS: usize = 16;

/// Where one partition's answer will come from.
enum Pending {
    /// Answered already (refused before it reached a shard).
    Refused(ResponseError),
    /// The owning shard's answer.
    Sent(flume::Receiver<Outcome>),
}

/// Sends every partition's batch to its shard and, unless `acks` is 0, returns the response
/// once every partition is answered.
pub(super) async fn answer(
    connection: &mut Connection,
    request: ProduceRequest,
) -> Option<ProduceResponse> {
    let mut sent = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let pending = if request.transactional_id.is_some() {
                // Transactions are not served (no transactional API is advertised either).
                Pending::Refused(ResponseError::TransactionalIdAuthorizationFailed)
            } else {
                match connection.send_batch(&topic.name, partition.index, partition.records).await {
                    Ok(answer) => Pending::Sent(answer),
                    Err(error) => Pending::Refused(error),
                }
            };
            partitions.push((partition.index, pending));
        }
        sent.push((topic.name, partitions));
    }
    if request.acks == 0 {
        return None;
    }
    let mut responses = Vec::with_capacity(sent.len());
    for (name, partitions) in sent {
        let mut answers = Vec::with_capacity(partitions.len());
        for (index, pending) in partitions {
            let answer = PartitionProduceResponse::default().with_index(index);
            let answer = match pending {
                Pending::Refused(error) => {
                    answer.with_error_code(error.code()).with_base_offset(-1)
                }
                Pending::Sent(reply) => match reply.recv_async().await {
                    Ok(Outcome { error: 0, body: Body::Produce(produced) }) => {
                        answer.with_base_offset(produced.base_offset as i64)
                    }
                    Ok(Outcome { error, body }) => {
                        let error = kafka_error(error).unwrap_or(ResponseError::UnknownServerError);
                        let text = match body {
                            Body::Encoded(text) => String::from_utf8(text).ok(),
                            _ => None,
                        };
                        answer
                            .with_error_code(error.code())
                            .with_base_offset(-1)
                            .with_error_message(text.map(StrBytes::from_string))
                    }
                    // The shard stopped with the write unanswered.
                    Err(_) => answer
                        .with_error_code(ResponseError::NotLeaderOrFollower.code())
                        .with_base_offset(-1),
                },
            };
            // No log-append-time topics: the producer's CreateTime stands.
            answers.push(answer.with_log_append_time_ms(-1).with_log_start_offset(-1));
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(TopicName(StrBytes::from_string(name)))
                .with_partition_responses(answers),
        );
    }
    Some(ProduceResponse::default().with_responses(responses))
}

impl Connection {
    /// Checks one partition's batch and sends it to the owning shard as a write; the receiver
    /// gets the shard's answer.
    async fn send_batch(
        &mut self,
        topic: &str,
        index: i32,
        records: Option<Bytes>,
    ) -> Result<flume::Receiver<Outcome>, ResponseError> {
        let (entry, place, partition) = self.find_partition(topic, index)?;
        let size_max = entry.settings.message_size_bytes_max;
        let records = records.ok_or(ResponseError::CorruptMessage)?;
        // The magic byte sits at the same place in every message format: a client that chose
        // an old format (magic 0 or 1, before RecordBatch v2) is told so, not that it is corrupt.
        if records.get(MAGIC_POS).is_some_and(|&magic| magic < 2) {
            return Err(ResponseError::UnsupportedForMessageFormat);
        }
        if records.len() as u64 > size_max {
            return Err(ResponseError::MessageTooLarge);
        }
        let limits = BatchLimits {
            batch_size_bytes_max: size_max.min(u64::from(u32::MAX)) as u32,
            ..BatchLimits::default()
        };
        // One batch per partition per request, as Kafka's producers send: more than one fails
        // the framing check (its declared length is not the whole field).
        let crc = checksum::crc32c(&records);
        let checked = batch::validate_checksummed(&records, &limits, crc).map_err(|error| {
            tracing::debug!(topic, partition, %error, "Kafka produce: batch refused");
            ResponseError::CorruptMessage
        })?;
        let fields = self.next_request(Operation::Produce);
        let request = Request {
            client: fields.client,
            session: fields.session,
            request: fields.request,
            // The replica stamps the base offset in place, so the batch leaves the frame.
            body: BytesMut::from(&records[..]),
            body_checksum: crc,
            record_count: checked.record_count(),
            first_timestamp_ms: checked.base_timestamp(),
            max_timestamp_ms: checked.max_timestamp(),
            append_time_ms: now_ms(),
        };
        let (reply, answer) = flume::bounded(1);
        let work = Work::Produce { group: place.group, partition, request, reply };
        self.send(place.shard, work).await?;
        Ok(answer)
    }
}
