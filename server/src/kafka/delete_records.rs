//! DeleteRecords: each partition's log start moves up to the offset asked (−1: the high
//! watermark) through a control record in the partition's own log, so every replica moves it
//! at the same point and a restart or a new primary keeps it. Records below it are gone to
//! consumers at once — a Fetch below it is OFFSET_OUT_OF_RANGE, ListOffsets' earliest is the new
//! start — while their disk space goes with the topic's retention. Served by each partition's
//! leader, where clients send it; this module never reads or writes a log itself.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use shoal_kafka::kafka_protocol::messages::{DeleteRecordsResponse, TopicName};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::{DeleteRecordsRequest, HIGH_WATERMARK};
use shoal_proto::protocol::{ErrorCode, Operation};

use super::Connection;
use super::errors::kafka_error;
use crate::shard::{Body, Outcome, Work};

/// The DeleteRecords response: every partition's request sent before any answer is awaited.
pub(super) async fn answer(
    connection: &mut Connection,
    request: DeleteRecordsRequest,
) -> DeleteRecordsResponse {
    let mut waiting = Vec::new();
    for topic in &request.topics {
        for partition in &topic.partitions {
            waiting.push(
                connection.delete_below(&topic.name, partition.index, partition.offset).await,
            );
        }
    }
    let mut waiting = waiting.into_iter();
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let answer = match waiting.next().expect("one per partition") {
                Err(error) => Err(error),
                Ok(answer) => match answer.recv_async().await {
                    Ok(Outcome { error: 0, body: Body::Encoded(body) }) => body
                        .as_slice()
                        .try_into()
                        .map(|bytes| u64::from_le_bytes(bytes) as i64)
                        .map_err(|_| ResponseError::UnknownServerError),
                    Ok(Outcome { error, .. }) if error == ErrorCode::InvalidArgument as u32 => {
                        Err(ResponseError::OffsetOutOfRange)
                    }
                    Ok(Outcome { error, .. }) => {
                        Err(kafka_error(error).unwrap_or(ResponseError::UnknownServerError))
                    }
                    Err(_) => Err(ResponseError::NotLeaderOrFollower),
                },
            };
            let result =
                DeleteRecordsPartitionResult::default().with_partition_index(partition.index);
            partitions.push(match answer {
                Ok(low_watermark) => result.with_low_watermark(low_watermark),
                Err(error) => result.with_low_watermark(-1).with_error_code(error.code()),
            });
        }
        topics.push(
            DeleteRecordsTopicResult::default()
                .with_name(TopicName(StrBytes::from_string(topic.name)))
                .with_partitions(partitions),
        );
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

impl Connection {
    /// Sends one partition's new log start to its shard; the answer (the log start, u64 LE)
    /// comes on the receiver.
    async fn delete_below(
        &mut self,
        topic: &str,
        index: i32,
        offset: i64,
    ) -> Result<flume::Receiver<Outcome>, ResponseError> {
        let (_, place, _) = self.find_partition(topic, index)?;
        let offset = match offset {
            HIGH_WATERMARK => None,
            offset => Some(u64::try_from(offset).map_err(|_| ResponseError::OffsetOutOfRange)?),
        };
        // A write of this connection's, as a produce is.
        let client = self.next_request(Operation::Produce);
        let (reply, answer) = flume::bounded(1);
        self.send(place.shard, Work::DeleteRecords { group: place.group, client, offset, reply })
            .await?;
        Ok(answer)
    }
}
