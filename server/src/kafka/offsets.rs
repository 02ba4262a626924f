//! Kafka consumer offsets: OffsetCommit (checked by the group coordinator, then stored through
//! each partition's own log as a native group's offset: a one-record control batch, replicated
//! and as durable as the topic), OffsetFetch (each partition's stored offset, from its shard's
//! table) and OffsetForLeaderEpoch.
//!
//! A Kafka group `G`'s offsets are the native consumer group `G`'s in each partition, so
//! `shoalctl` shows them. A commit that changes nothing a consumer would read from (the same
//! offset, or one that only moves past earlier offset commits) stores nothing, and a stored
//! offset with only offset commits after it reads as the end of the log: an idle group writes
//! nothing and its lag reaches 0. The commit's metadata string is not stored (OffsetFetch
//! answers it empty).
//!
//! OffsetForLeaderEpoch: a Kafka consumer asks it after a leader change, to learn whether the
//! log it read was truncated. Consumers read only committed data, which no view change
//! truncates, so the answer for any epoch up to the current view is that epoch with the
//! committed end: a consumer's position is never past it, and nothing is ever reset.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use shoal_kafka::kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use shoal_kafka::kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use shoal_kafka::kafka_protocol::messages::{
    GroupId, OffsetCommitResponse, OffsetFetchResponse, OffsetForLeaderEpochResponse, TopicName,
};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::{
    LATEST_TIMESTAMP, OffsetCommitRequest, OffsetFetchGroup, OffsetFetchRequest,
    OffsetForLeaderEpochRequest,
};
use shoal_proto::protocol::consumer::{
    ConsumerId, Membership, OffsetCommitRecord, OffsetKey, PartitionRef, StoreOffset,
    decode_stored_offset,
};
use shoal_proto::protocol::{Operation, validate_name};

use super::Connection;
use super::errors::kafka_error;
use super::groups::checked;
use crate::shard::{Body, KafkaGroupRequest, Outcome, Work};

/// Whose offsets a Kafka group's are: the native group of that name. Kafka allows any group id;
/// Shoal's stored names follow the stream and topic name rule, so others are INVALID_GROUP_ID.
fn consumer(group: &str) -> Result<ConsumerId, ResponseError> {
    validate_name(group).map_err(|_| ResponseError::InvalidGroupId)?;
    Ok(ConsumerId::group(group))
}

/// The OffsetCommit response: the coordinator's check first, then each partition's commit,
/// all sent before any answer is awaited; those whose primary is another node go there.
pub(super) async fn commit(
    connection: &mut Connection,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let allowed = match consumer(&request.group_id) {
        Err(error) => Err(error),
        Ok(consumer) => {
            let ask = KafkaGroupRequest::CheckCommit {
                group: request.group_id.clone(),
                member: request.member_id.clone(),
                generation: request.generation_id_or_member_epoch,
            };
            match checked(connection.ask_coordinator(ask).await) {
                Some(error) => Err(error),
                None => Ok(consumer),
            }
        }
    };
    let partitions: Vec<(&str, i32, i64)> = request
        .topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.as_str(), p.index, p.committed_offset)))
        .collect();
    let mut waiting = Vec::with_capacity(partitions.len());
    for &(topic, index, offset) in &partitions {
        waiting.push(match &allowed {
            Err(error) => Err(*error),
            Ok(consumer) => connection.store_offset(topic, index, consumer, offset).await,
        });
    }
    let stream = connection.context.config.kafka.stream.clone();
    let redirect = |slot: usize| {
        let (topic, index, offset) = partitions[slot];
        let consumer = allowed.as_ref().expect("only an allowed commit reaches a shard");
        let store = StoreOffset {
            partition: partition_ref(&stream, topic, index),
            consumer: consumer.clone(),
            // A Kafka group has no native members: the coordinator checked the commit.
            membership: Membership::default(),
            offset: u64::try_from(offset).expect("checked before it was sent"),
        };
        (Operation::StoreOffset, store.encode())
    };
    let mut errors = connection.local_or_forwarded(waiting, redirect).await.into_iter().map(
        |answer| match answer {
            Err(error) => Some(error),
            Ok(Outcome { error, .. }) => kafka_error(error),
        },
    );
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for partition in topic.partitions {
            let error = errors.next().expect("one per partition");
            partitions.push(
                OffsetCommitResponsePartition::default()
                    .with_partition_index(partition.index)
                    .with_error_code(error.map_or(0, |e| e.code())),
            );
        }
        topics.push(
            OffsetCommitResponseTopic::default()
                .with_name(TopicName(StrBytes::from_string(topic.name)))
                .with_partitions(partitions),
        );
    }
    OffsetCommitResponse::default().with_topics(topics)
}

impl Connection {
    /// Sends one partition's offset commit to its shard; the answer comes on the receiver.
    async fn store_offset(
        &mut self,
        topic: &str,
        index: i32,
        consumer: &ConsumerId,
        offset: i64,
    ) -> Result<flume::Receiver<Outcome>, ResponseError> {
        let (_, place, _) = self.find_partition(topic, index)?;
        let offset = u64::try_from(offset).map_err(|_| ResponseError::InvalidCommitOffsetSize)?;
        let client = self.next_request(Operation::StoreOffset);
        let record = OffsetCommitRecord { consumer: consumer.clone(), offset: Some(offset) };
        let (reply, answer) = flume::bounded(1);
        self.send(place.shard, Work::StoreOffset { group: place.group, client, record, reply })
            .await?;
        Ok(answer)
    }

    /// Asks one partition's shard for `consumer`'s stored offset; the answer comes on the
    /// receiver.
    async fn ask_offset(
        &self,
        topic: &str,
        index: i32,
        consumer: &ConsumerId,
    ) -> Result<flume::Receiver<Outcome>, ResponseError> {
        let (_, place, _) = self.find_partition(topic, index)?;
        let (reply, answer) = flume::bounded(1);
        let work = Work::GetOffset { group: place.group, consumer: consumer.clone(), reply };
        self.send(place.shard, work).await?;
        Ok(answer)
    }

    /// Each partition's stored offset for `consumer` (`None`: none stored), asked of every
    /// shard before any answer is awaited; those whose primary is another node go there.
    async fn stored_offsets(
        &mut self,
        partitions: &[(&str, i32)],
        consumer: &ConsumerId,
    ) -> Vec<Result<Option<u64>, ResponseError>> {
        let mut waiting = Vec::with_capacity(partitions.len());
        for &(topic, index) in partitions {
            waiting.push(self.ask_offset(topic, index, consumer).await);
        }
        let stream = self.context.config.kafka.stream.clone();
        let redirect = |slot: usize| {
            let (topic, index) = partitions[slot];
            let key = OffsetKey {
                partition: partition_ref(&stream, topic, index),
                consumer: consumer.clone(),
            };
            (Operation::GetOffset, key.encode())
        };
        let decoded =
            |body: &[u8]| decode_stored_offset(body).map_err(|_| ResponseError::UnknownServerError);
        self.local_or_forwarded(waiting, redirect)
            .await
            .into_iter()
            .map(|answer| match answer {
                Err(error) => Err(error),
                Ok(Outcome { error: 0, body: Body::Encoded(body) }) => decoded(&body),
                Ok(Outcome { error, .. }) => {
                    Err(kafka_error(error).unwrap_or(ResponseError::UnknownServerError))
                }
            })
            .collect()
    }
}

/// Partition `index` of Kafka topic `topic` (in the Kafka stream `stream`) as the native
/// protocol names it.
fn partition_ref(stream: &str, topic: &str, index: i32) -> PartitionRef {
    PartitionRef {
        stream: stream.to_owned(),
        topic: topic.to_owned(),
        partition: u32::try_from(index).expect("a partition found in the catalog"),
    }
}

/// One partition's answer: (index, offset or -1, error).
type FetchedOffset = (i32, i64, Option<ResponseError>);

/// One group's topics and their offsets in the response types of v1–7 (`$topic`,
/// `$partition`) or v8+: the same fields under two names, with no trait in common.
macro_rules! offset_topics {
    ($topic:ident, $partition:ident, $topics:expr) => {
        $topics
            .into_iter()
            .map(|(name, partitions): (String, Vec<FetchedOffset>)| {
                let partitions = partitions
                    .into_iter()
                    .map(|(index, offset, error)| {
                        $partition::default()
                            .with_partition_index(index)
                            .with_committed_offset(offset)
                            .with_committed_leader_epoch(-1)
                            .with_metadata(Some(StrBytes::default()))
                            .with_error_code(error.map_or(0, |e| e.code()))
                    })
                    .collect();
                $topic::default()
                    .with_name(TopicName(StrBytes::from_string(name)))
                    .with_partitions(partitions)
            })
            .collect()
    };
}

/// The OffsetFetch response: v8+ answer per group; v1–7 carry the one group's at the top.
pub(super) async fn fetch(
    connection: &mut Connection,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut groups = Vec::with_capacity(request.groups.len());
    // A group named twice is answered once: each repeat of one without topics would read
    // every Kafka partition again.
    let mut seen = std::collections::HashSet::new();
    for group in request.groups {
        if seen.insert(group.group_id.clone()) {
            groups.push(fetch_group(connection, group).await);
        }
    }
    let response = OffsetFetchResponse::default();
    if version <= 7 {
        let Some((_, topics, error)) = groups.into_iter().next() else { return response };
        // v1 has no group-level error: a partition carries it.
        let code = if version >= 2 { error.map_or(0, |e| e.code()) } else { 0 };
        let topics = offset_topics!(OffsetFetchResponseTopic, OffsetFetchResponsePartition, topics);
        return response.with_error_code(code).with_topics(topics);
    }
    let groups = groups
        .into_iter()
        .map(|(group_id, topics, error)| {
            OffsetFetchResponseGroup::default()
                .with_group_id(GroupId(StrBytes::from_string(group_id)))
                .with_error_code(error.map_or(0, |e| e.code()))
                .with_topics(offset_topics!(
                    OffsetFetchResponseTopics,
                    OffsetFetchResponsePartitions,
                    topics
                ))
        })
        .collect();
    response.with_groups(groups)
}

/// One group's offsets: of the partitions asked, or (no topics named) of every Kafka
/// partition where it has one.
async fn fetch_group(
    connection: &mut Connection,
    group: OffsetFetchGroup,
) -> (String, Vec<(String, Vec<FetchedOffset>)>, Option<ResponseError>) {
    let consumer = match consumer(&group.group_id) {
        Ok(consumer) => consumer,
        Err(error) => return (group.group_id, Vec::new(), Some(error)),
    };
    let every = group.topics.is_none();
    let asked: Vec<(String, Vec<i32>)> = match group.topics {
        Some(topics) => topics.into_iter().map(|t| (t.name, t.partitions)).collect(),
        None => connection
            .kafka_topics()
            .map(|(name, topic)| (name.clone(), (0..topic.partitions.len() as i32).collect()))
            .collect(),
    };
    let partitions: Vec<(&str, i32)> = asked
        .iter()
        .flat_map(|(name, indexes)| indexes.iter().map(move |&index| (name.as_str(), index)))
        .collect();
    let mut offsets = connection.stored_offsets(&partitions, &consumer).await.into_iter();
    let mut topics = Vec::with_capacity(asked.len());
    for (name, indexes) in asked {
        let mut partitions = Vec::with_capacity(indexes.len());
        for index in indexes {
            match offsets.next().expect("one per partition") {
                Ok(Some(offset)) => {
                    partitions.push((index, i64::try_from(offset).unwrap_or(i64::MAX), None))
                }
                Ok(None) if every => {}
                Ok(None) => partitions.push((index, -1, None)),
                Err(error) => partitions.push((index, -1, Some(error))),
            }
        }
        if !(every && partitions.is_empty()) {
            topics.push((name, partitions));
        }
    }
    (group.group_id, topics, None)
}

/// The OffsetForLeaderEpoch response (see the module comment).
pub(super) async fn for_leader_epoch(
    connection: &Connection,
    request: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::with_capacity(request.topics.len());
    for topic in request.topics {
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for asked in topic.partitions {
            let answer = EpochEndOffset::default().with_partition(asked.index);
            let answer = match connection
                .epoch_end(&topic.name, asked.index, asked.current_leader_epoch)
                .await
            {
                Ok((view, end)) => {
                    let epoch = asked.leader_epoch.min(view);
                    answer.with_leader_epoch(epoch).with_end_offset(end)
                }
                Err(error) => {
                    answer.with_error_code(error.code()).with_leader_epoch(-1).with_end_offset(-1)
                }
            };
            partitions.push(answer);
        }
        topics.push(
            OffsetForLeaderTopicResult::default()
                .with_topic(TopicName(StrBytes::from_string(topic.name)))
                .with_partitions(partitions),
        );
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

impl Connection {
    /// A partition's view (its leader epoch) and committed end; a client whose own idea of the
    /// epoch is older is fenced, a newer one is unknown here (yet), as in Kafka.
    async fn epoch_end(
        &self,
        topic: &str,
        index: i32,
        current_epoch: i32,
    ) -> Result<(i32, i64), ResponseError> {
        let (_, place, _) = self.find_partition(topic, index)?;
        let (reply, answer) = flume::bounded(1);
        self.send(place.shard, Work::Stats { groups: vec![place.group], reply }).await?;
        let stats = answer.recv_async().await.map_err(|_| ResponseError::NotLeaderOrFollower)?;
        let view = stats.first().map_or(0, |(_, s)| i32::try_from(s.view).unwrap_or(i32::MAX));
        if current_epoch >= 0 && current_epoch < view {
            return Err(ResponseError::FencedLeaderEpoch);
        }
        if current_epoch > view {
            return Err(ResponseError::UnknownLeaderEpoch);
        }
        let (end, _, _) = self.offset_at(topic, index, LATEST_TIMESTAMP).await?;
        Ok((view, end))
    }
}
