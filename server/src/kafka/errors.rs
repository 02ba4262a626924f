//! Shoal's error codes as Kafka's, for the answers of the Kafka listener. Retriable stays
//! retriable: a client library retries exactly what it would retry against Kafka.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_proto::protocol::ErrorCode;

/// The Kafka error for a Shoal error code (`None`: success).
pub(super) fn kafka_error(code: u32) -> Option<ResponseError> {
    if code == 0 {
        return None;
    }
    Some(match ErrorCode::from_u32(code) {
        Some(ErrorCode::TooLarge) => ResponseError::MessageTooLarge,
        Some(ErrorCode::InvalidBatch) => ResponseError::CorruptMessage,
        Some(
            ErrorCode::StreamNotFound | ErrorCode::TopicNotFound | ErrorCode::PartitionNotFound,
        ) => ResponseError::UnknownTopicOrPartition,
        // The client refreshes its metadata and finds the partition's new leader (or this node
        // again, once it is back).
        Some(ErrorCode::NotPrimary | ErrorCode::ShuttingDown) => ResponseError::NotLeaderOrFollower,
        // Never entered the log: retried as a timeout is.
        Some(ErrorCode::TransientNotAccepted | ErrorCode::Busy | ErrorCode::LimitReached) => {
            ResponseError::RequestTimedOut
        }
        // May or may not have committed: Kafka's "written, not enough replicas" (retriable; an
        // idempotent retry is deduplicated).
        Some(ErrorCode::TransientNotCommitted) => ResponseError::NotEnoughReplicasAfterAppend,
        Some(ErrorCode::StorageFull | ErrorCode::PartitionFailed) => {
            ResponseError::KafkaStorageError
        }
        Some(ErrorCode::OutOfOrderSequence) => ResponseError::OutOfOrderSequenceNumber,
        Some(ErrorCode::UnknownProducer) => ResponseError::UnknownProducerId,
        Some(ErrorCode::ProducerFenced) => ResponseError::InvalidProducerEpoch,
        Some(ErrorCode::InvalidRequest | ErrorCode::InvalidArgument) => {
            ResponseError::InvalidRequest
        }
        _ => ResponseError::UnknownServerError,
    })
}
