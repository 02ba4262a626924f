//! The ListOffsets answer: the earliest offset still held, the latest (the end of the committed
//! log, Kafka's high watermark), or the offset at a time, each read from the owning shard by a
//! fetch of at most one batch — the same reads a native consumer's `first`, `last` and
//! `timestamp` starts make, so both protocols agree on every offset.
//!
//! A time is looked up as a native fetch by time is: the first batch *appended* at or after it
//! (Shoal's time index is by append time; Kafka's by the records' own timestamps, which a
//! producer may set to anything). The answer is that batch's base offset and first timestamp;
//! no batch that late gives offset −1, as in Kafka.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use shoal_kafka::kafka_protocol::messages::{ListOffsetsResponse, TopicName};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::{
    EARLIEST_TIMESTAMP, LATEST_TIMESTAMP, ListOffsetsRequest, MAX_TIMESTAMP,
};
use shoal_proto::batch::BatchHeader;
use shoal_proto::protocol::{FetchFrom, FetchReply};

use super::Connection;
use super::errors::kafka_error;
use crate::shard::{Body, FetchArgs, Outcome, Work};

/// Every asked partition's offset, one shard round trip each.
pub(super) async fn answer(
    connection: &Connection,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for asked in topic.partitions {
            let answer = ListOffsetsPartitionResponse::default()
                .with_partition_index(asked.index)
                .with_timestamp(-1)
                .with_offset(-1);
            let answer = match connection.offset_at(&topic.name, asked.index, asked.timestamp).await
            {
                Ok((offset, timestamp, epoch)) => {
                    answer.with_offset(offset).with_timestamp(timestamp).with_leader_epoch(epoch)
                }
                Err(error) => answer.with_error_code(error.code()),
            };
            partitions.push(answer);
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(TopicName(StrBytes::from_string(topic.name)))
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

impl Connection {
    /// (offset, timestamp, leader epoch) for `timestamp` in one partition.
    pub(super) async fn offset_at(
        &self,
        topic: &str,
        index: i32,
        timestamp: i64,
    ) -> Result<(i64, i64, i32), ResponseError> {
        let (_, place, partition) = self.find_partition(topic, index)?;
        let from = match timestamp {
            LATEST_TIMESTAMP | EARLIEST_TIMESTAMP | MAX_TIMESTAMP => FetchFrom::Last,
            at if at >= 0 => FetchFrom::Timestamp(at),
            // -4, -5 (KIP-1005, v9+) and anything else: not served.
            _ => return Err(ResponseError::InvalidRequest),
        };
        let args = FetchArgs { partition, from, bytes_max: 1, count_max: 1, wait_ms_max: 0 };
        let (reply, answer) = flume::bounded(1);
        self.send(place.shard, Work::Fetch { group: place.group, args, reply }).await?;
        let parts = match answer.recv_async().await {
            Ok(Outcome { error: 0, body: Body::Parts(parts) }) => parts,
            Ok(Outcome { error, .. }) => {
                return Err(kafka_error(error).unwrap_or(ResponseError::UnknownServerError));
            }
            Err(_) => return Err(ResponseError::NotLeaderOrFollower),
        };
        let (reply, _) = parts
            .first()
            .and_then(|prefix| FetchReply::decode(prefix).ok())
            .ok_or(ResponseError::UnknownServerError)?;
        // No leader epoch is promised here: -1 tells the client not to check it.
        let epoch = -1;
        Ok(match timestamp {
            LATEST_TIMESTAMP => (reply.next_offset as i64, -1, epoch),
            EARLIEST_TIMESTAMP => (reply.first_offset as i64, -1, epoch),
            // The newest batch's largest timestamp, with its last offset: Kafka's answer
            // whenever record timestamps do not go back across batches (always with append
            // time). An empty partition has none: -1.
            MAX_TIMESTAMP => match parts.get(1).and_then(|batch| BatchHeader::parse(batch).ok()) {
                Some(batch) => (
                    batch.base_offset() + i64::from(batch.last_offset_delta()),
                    batch.max_timestamp(),
                    epoch,
                ),
                None => (-1, -1, epoch),
            },
            // A batch the log start (DeleteRecords) cut through answers from the log start.
            _ => match parts.get(1).and_then(|batch| BatchHeader::parse(batch).ok()) {
                Some(batch) => {
                    let offset = batch.base_offset().max(reply.first_offset as i64);
                    (offset, batch.base_timestamp(), epoch)
                }
                None => (-1, -1, epoch),
            },
        })
    }
}
