//! The metadata state machine: streams, topics, their partitions' groups and shards, and client
//! sessions. Its log is the metadata VSR group (group 0, on shard 0, `persisted`): every change is
//! a [`MetaCommand`] carried as the value of a one-record batch, and the [`Catalog`] is what
//! applying the committed log in op order yields. Restart replays the log.
//!
//! It owns the command encoding, the validation of a command against the catalog and the
//! deterministic apply (group ids and shards assigned from the catalog alone, times from the
//! prepare header). It must never read a clock, touch storage or a socket, or depend on anything
//! but the catalog and the command: two replicas applying the same log must agree byte for byte.

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_engine::protocol::consumer::Membership;
use shoal_engine::protocol::{
    CreateTopic, ErrorCode, PartitionInfo, ProtocolError, Reader, StreamInfo, TopicInfo, Writer,
    validate_name,
};
use shoal_engine::superblock::{
    Durability, GroupConfig, SEGMENT_SIZE_BYTES_MAX, SEGMENT_SIZE_BYTES_MIN,
};
use shoal_engine::wire::HEADER_SIZE;

use crate::config::TopicDefaults;

/// The metadata group's id.
pub const METADATA_GROUP: u64 = 0;
/// Partitions a topic may have at most.
pub const PARTITIONS_PER_TOPIC_MAX: u32 = 1024;
/// Streams a node may hold at most.
pub const STREAMS_MAX: usize = 4096;
/// Topics a stream may hold at most.
pub const TOPICS_PER_STREAM_MAX: usize = 4096;
/// Consumer groups a topic may have at most.
pub const CONSUMER_GROUPS_PER_TOPIC_MAX: usize = 1024;
/// Members a consumer group may have at most.
pub const GROUP_MEMBERS_MAX: usize = 1024;

/// A change to the catalog, as stored in the metadata log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetaCommand {
    /// Registers a client session; the session id is the command's op.
    RegisterSession,
    /// Creates a stream.
    CreateStream {
        /// Its name.
        name: String,
    },
    /// Deletes a stream and its topics.
    DeleteStream {
        /// Its name.
        name: String,
    },
    /// Creates a topic with settings already resolved against the defaults.
    CreateTopic {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// The resolved settings.
        settings: TopicSettings,
    },
    /// Deletes a topic.
    DeleteTopic {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
    },
    /// Puts a consumer group's next assignment in force (the coordinator on shard 0 proposes
    /// one after every join, leave or session timeout).
    Rebalance {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// The group.
        group: String,
        /// The group's generation after this one: one more than the one in force.
        generation: u64,
        /// Every member, ascending by id, and its share.
        members: Vec<GroupMemberAssignment>,
    },
}

/// One member's part of an assignment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupMemberAssignment {
    /// The member id.
    pub member: String,
    /// Its session timeout (kept so a restarted coordinator can time it out).
    pub session_timeout_ms: u32,
    /// Its partitions, ascending.
    pub partitions: Vec<u32>,
}

/// A consumer group's assignment in force.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ConsumerGroup {
    /// Raised by every rebalance; never reused, so a member of an old generation is refused.
    pub generation: u64,
    /// Every member, ascending by id.
    pub members: Vec<GroupMemberAssignment>,
}

impl ConsumerGroup {
    /// A member's part.
    pub fn member(&self, member: &str) -> Option<&GroupMemberAssignment> {
        self.members.iter().find(|m| m.member == member)
    }
}

/// A topic's settings, fixed at creation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopicSettings {
    /// Partitions.
    pub partitions: u32,
    /// Durability mode.
    pub durability: Durability,
    /// Size-based retention per partition (0: unbounded).
    pub retention_bytes: u64,
    /// Age-based retention (0: unbounded).
    pub retention_ms: u64,
    /// Segment roll size.
    pub segment_size_bytes: u64,
    /// Largest batch accepted.
    pub message_size_bytes_max: u64,
}

impl TopicSettings {
    /// Resolves a create request against the defaults and checks every bound; the error names
    /// the argument. `record_size_bytes_max` is the shards' largest record (header + batch).
    pub fn resolve(
        request: &CreateTopic,
        defaults: &TopicDefaults,
        record_size_bytes_max: usize,
    ) -> Result<TopicSettings, (ErrorCode, String)> {
        let settings = TopicSettings {
            partitions: if request.partitions == 0 {
                defaults.partitions
            } else {
                request.partitions
            },
            durability: request.durability.unwrap_or(defaults.durability),
            retention_bytes: request.retention_bytes.unwrap_or(defaults.retention_bytes),
            retention_ms: request.retention_ms.unwrap_or(defaults.retention_ms),
            segment_size_bytes: request.segment_size_bytes.unwrap_or(defaults.segment_size_bytes),
            message_size_bytes_max: request
                .message_size_bytes_max
                .unwrap_or(u64::from(defaults.message_size_bytes_max)),
        };
        let invalid = |reason: String| Err((ErrorCode::InvalidArgument, reason));
        if !(1..=PARTITIONS_PER_TOPIC_MAX).contains(&settings.partitions) {
            return invalid(format!(
                "partitions {}: use 1 to {PARTITIONS_PER_TOPIC_MAX}",
                settings.partitions
            ));
        }
        if !(SEGMENT_SIZE_BYTES_MIN..=SEGMENT_SIZE_BYTES_MAX).contains(&settings.segment_size_bytes)
        {
            return invalid(format!(
                "segment_size_bytes {}: use {SEGMENT_SIZE_BYTES_MIN} to {SEGMENT_SIZE_BYTES_MAX}",
                settings.segment_size_bytes
            ));
        }
        let message_max = (record_size_bytes_max.saturating_sub(HEADER_SIZE)) as u64;
        if settings.message_size_bytes_max == 0 || settings.message_size_bytes_max > message_max {
            return invalid(format!(
                "message_size_bytes_max {}: use 1 to {message_max} (the shards' record limit)",
                settings.message_size_bytes_max
            ));
        }
        Ok(settings)
    }

    /// The engine settings of each of the topic's partition groups.
    pub fn group_config(&self) -> GroupConfig {
        GroupConfig {
            durability: self.durability,
            segment_size_bytes: self.segment_size_bytes,
            retention_bytes: self.retention_bytes,
            retention_ms: self.retention_ms,
            record_size_bytes_max: (self.message_size_bytes_max as usize + HEADER_SIZE) as u32,
            ..GroupConfig::default()
        }
    }
}

const TAG_REGISTER_SESSION: u8 = 1;
const TAG_CREATE_STREAM: u8 = 2;
const TAG_DELETE_STREAM: u8 = 3;
const TAG_CREATE_TOPIC: u8 = 4;
const TAG_DELETE_TOPIC: u8 = 5;
const TAG_REBALANCE: u8 = 6;

impl MetaCommand {
    /// The command's bytes (the record value in the metadata log).
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        match self {
            MetaCommand::RegisterSession => {
                w.u8(TAG_REGISTER_SESSION);
            }
            MetaCommand::CreateStream { name } => {
                w.u8(TAG_CREATE_STREAM).str(name);
            }
            MetaCommand::DeleteStream { name } => {
                w.u8(TAG_DELETE_STREAM).str(name);
            }
            MetaCommand::CreateTopic { stream, topic, settings } => {
                let durability = match settings.durability {
                    Durability::Replicated => 1,
                    Durability::Persisted => 2,
                };
                w.u8(TAG_CREATE_TOPIC).str(stream).str(topic).u32(settings.partitions);
                w.u8(durability).u64(settings.retention_bytes).u64(settings.retention_ms);
                w.u64(settings.segment_size_bytes).u64(settings.message_size_bytes_max);
            }
            MetaCommand::DeleteTopic { stream, topic } => {
                w.u8(TAG_DELETE_TOPIC).str(stream).str(topic);
            }
            MetaCommand::Rebalance { stream, topic, group, generation, members } => {
                w.u8(TAG_REBALANCE).str(stream).str(topic).str(group).u64(*generation);
                w.u32(members.len() as u32);
                for member in members {
                    w.str(&member.member).u32(member.session_timeout_ms);
                    w.u32(member.partitions.len() as u32);
                    for partition in &member.partitions {
                        w.u32(*partition);
                    }
                }
            }
        }
        w.finish()
    }

    /// Decodes a command from the metadata log.
    pub fn decode(bytes: &[u8]) -> Result<MetaCommand, ProtocolError> {
        let mut r = Reader::new(bytes);
        let command = match r.u8("tag")? {
            TAG_REGISTER_SESSION => MetaCommand::RegisterSession,
            TAG_CREATE_STREAM => MetaCommand::CreateStream { name: r.name("stream")? },
            TAG_DELETE_STREAM => MetaCommand::DeleteStream { name: r.name("stream")? },
            TAG_CREATE_TOPIC => {
                let stream = r.name("stream")?;
                let topic = r.name("topic")?;
                let partitions = r.u32("partitions")?;
                let durability = match r.u8("durability")? {
                    1 => Durability::Replicated,
                    2 => Durability::Persisted,
                    other => {
                        return Err(ProtocolError::Invalid {
                            field: "durability",
                            reason: format!("{other}"),
                        });
                    }
                };
                let settings = TopicSettings {
                    partitions,
                    durability,
                    retention_bytes: r.u64("retention_bytes")?,
                    retention_ms: r.u64("retention_ms")?,
                    segment_size_bytes: r.u64("segment_size_bytes")?,
                    message_size_bytes_max: r.u64("message_size_bytes_max")?,
                };
                MetaCommand::CreateTopic { stream, topic, settings }
            }
            TAG_DELETE_TOPIC => {
                MetaCommand::DeleteTopic { stream: r.name("stream")?, topic: r.name("topic")? }
            }
            TAG_REBALANCE => {
                let stream = r.name("stream")?;
                let topic = r.name("topic")?;
                let group = r.name("group")?;
                let generation = r.u64("generation")?;
                let count = r.count("members", 2 + 4 + 4)?;
                let mut members = Vec::with_capacity(count);
                for _ in 0..count {
                    let member = r.name("member")?;
                    let session_timeout_ms = r.u32("session_timeout_ms")?;
                    let partitions = r.count("partitions", 4)?;
                    let partitions =
                        (0..partitions).map(|_| r.u32("partition")).collect::<Result<_, _>>()?;
                    members.push(GroupMemberAssignment { member, session_timeout_ms, partitions });
                }
                MetaCommand::Rebalance { stream, topic, group, generation, members }
            }
            other => {
                return Err(ProtocolError::Invalid { field: "tag", reason: format!("{other}") });
            }
        };
        r.end()?;
        Ok(command)
    }
}

/// One partition's place: its group and owning shard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionPlace {
    /// The VSR group.
    pub group: u64,
    /// The shard that owns it.
    pub shard: u32,
}

/// A topic in the catalog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topic {
    /// Settings fixed at creation.
    pub settings: TopicSettings,
    /// Partition `i` is `partitions[i]`.
    pub partitions: Vec<PartitionPlace>,
    /// Creation time (the creating prepare's append time).
    pub created_ms: i64,
    /// Its consumer groups by name.
    pub consumer_groups: BTreeMap<String, ConsumerGroup>,
}

/// A stream in the catalog.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Stream {
    /// Its topics by name.
    pub topics: BTreeMap<String, Topic>,
    /// Creation time.
    pub created_ms: i64,
}

/// What the metadata log says exists. Cloned into an `Arc` after each change and shared with
/// every shard, which only reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Catalog {
    /// The op of the last command applied.
    pub applied_op: u64,
    /// Shards on the node (partitions are placed over them).
    pub shards: u32,
    /// Streams by name.
    pub streams: BTreeMap<String, Stream>,
    /// The next partition group id (group 0 is the metadata).
    pub next_group: u64,
    /// Groups placed on each shard, deleted topics' groups included: the engine keeps a deleted
    /// partition's group until group deletion arrives, so it still counts against the bound.
    pub groups_per_shard: Vec<u32>,
    /// Groups each shard may hold (its superblock's bound; shard 0 also holds the metadata).
    pub groups_per_shard_max: u32,
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A session was registered.
    Session(u64),
    /// The change is made.
    Done,
}

impl Catalog {
    /// An empty catalog for `shards` shards of `groups_per_shard_max` groups each.
    pub fn new(shards: u32, groups_per_shard_max: u32) -> Catalog {
        let mut groups_per_shard = vec![0; shards as usize];
        groups_per_shard[0] = 1;
        Catalog {
            applied_op: 0,
            shards,
            streams: BTreeMap::new(),
            next_group: METADATA_GROUP + 1,
            groups_per_shard,
            groups_per_shard_max,
        }
    }

    /// Checks whether `command` would apply, without changing anything (the server checks before
    /// proposing, so most refusals never enter the log; apply checks again because commands
    /// proposed together may conflict).
    pub fn check(&self, command: &MetaCommand) -> Result<(), (ErrorCode, String)> {
        match command {
            MetaCommand::RegisterSession => Ok(()),
            MetaCommand::CreateStream { name } => {
                check_name(name)?;
                if self.streams.contains_key(name) {
                    return Err((ErrorCode::StreamExists, format!("stream {name} exists")));
                }
                if self.streams.len() >= STREAMS_MAX {
                    return Err((
                        ErrorCode::LimitReached,
                        format!("a node holds at most {STREAMS_MAX} streams"),
                    ));
                }
                Ok(())
            }
            MetaCommand::DeleteStream { name } => self.stream(name).map(|_| ()),
            MetaCommand::CreateTopic { stream, topic, settings } => {
                check_name(topic)?;
                let entry = self.stream(stream)?;
                if entry.topics.contains_key(topic) {
                    return Err((ErrorCode::TopicExists, format!("topic {stream}/{topic} exists")));
                }
                if entry.topics.len() >= TOPICS_PER_STREAM_MAX {
                    return Err((
                        ErrorCode::LimitReached,
                        format!("a stream holds at most {TOPICS_PER_STREAM_MAX} topics"),
                    ));
                }
                let mut counts = self.groups_per_shard.clone();
                for _ in 0..settings.partitions {
                    let shard = self.least_loaded(&counts);
                    if counts[shard] >= self.groups_per_shard_max {
                        return Err((
                            ErrorCode::LimitReached,
                            format!(
                                "every shard holds its {} partitions already",
                                self.groups_per_shard_max
                            ),
                        ));
                    }
                    counts[shard] += 1;
                }
                Ok(())
            }
            MetaCommand::DeleteTopic { stream, topic } => self.topic(stream, topic).map(|_| ()),
            MetaCommand::Rebalance { stream, topic, group, generation, members } => {
                check_name(group)?;
                let entry = self.topic(stream, topic)?;
                let current = entry.consumer_groups.get(group);
                if current.is_none() && entry.consumer_groups.len() >= CONSUMER_GROUPS_PER_TOPIC_MAX
                {
                    return Err((
                        ErrorCode::LimitReached,
                        format!(
                            "a topic has at most {CONSUMER_GROUPS_PER_TOPIC_MAX} consumer groups"
                        ),
                    ));
                }
                let expected = current.map_or(0, |g| g.generation) + 1;
                if *generation != expected {
                    return Err((
                        ErrorCode::StaleGeneration,
                        format!("group {group}: generation {generation} proposed, {expected} next"),
                    ));
                }
                if members.len() > GROUP_MEMBERS_MAX {
                    return Err((
                        ErrorCode::LimitReached,
                        format!("a consumer group has at most {GROUP_MEMBERS_MAX} members"),
                    ));
                }
                let partitions = entry.partitions.len() as u32;
                if members.iter().flat_map(|m| &m.partitions).any(|p| *p >= partitions) {
                    return Err((
                        ErrorCode::PartitionNotFound,
                        format!(
                            "group {group}: an assignment names a partition beyond {partitions}"
                        ),
                    ));
                }
                Ok(())
            }
        }
    }

    /// Applies a committed command at `op`, appended at `append_time_ms`. A command that no
    /// longer applies (a conflicting one committed first) changes nothing and returns its error.
    pub fn apply(
        &mut self,
        op: u64,
        append_time_ms: i64,
        command: &MetaCommand,
    ) -> Result<Applied, (ErrorCode, String)> {
        assert!(op > self.applied_op, "metadata op {op} applied after {}", self.applied_op);
        self.applied_op = op;
        self.check(command)?;
        match command {
            MetaCommand::RegisterSession => return Ok(Applied::Session(op)),
            MetaCommand::CreateStream { name } => {
                let stream = Stream { topics: BTreeMap::new(), created_ms: append_time_ms };
                self.streams.insert(name.clone(), stream);
            }
            MetaCommand::DeleteStream { name } => {
                self.streams.remove(name);
            }
            MetaCommand::CreateTopic { stream, topic, settings } => {
                let mut partitions = Vec::with_capacity(settings.partitions as usize);
                for _ in 0..settings.partitions {
                    let shard = self.least_loaded(&self.groups_per_shard);
                    self.groups_per_shard[shard] += 1;
                    partitions.push(PartitionPlace { group: self.next_group, shard: shard as u32 });
                    self.next_group += 1;
                }
                let entry = Topic {
                    settings: *settings,
                    partitions,
                    created_ms: append_time_ms,
                    consumer_groups: BTreeMap::new(),
                };
                let stream = self.streams.get_mut(stream).expect("checked");
                stream.topics.insert(topic.clone(), entry);
            }
            MetaCommand::DeleteTopic { stream, topic } => {
                self.streams.get_mut(stream).expect("checked").topics.remove(topic);
            }
            MetaCommand::Rebalance { stream, topic, group, generation, members } => {
                let entry = self.streams.get_mut(stream).expect("checked");
                let entry = entry.topics.get_mut(topic).expect("checked");
                let group = entry.consumer_groups.entry(group.clone()).or_default();
                group.generation = *generation;
                group.members = members.clone();
            }
        }
        Ok(Applied::Done)
    }

    /// The shard with the fewest groups (the lowest index among equals), so partitions spread
    /// over shards whatever order topics are created in.
    fn least_loaded(&self, counts: &[u32]) -> usize {
        let mut best = 0;
        for (shard, &count) in counts.iter().enumerate() {
            if count < counts[best] {
                best = shard;
            }
        }
        best
    }

    /// A stream by name.
    pub fn stream(&self, name: &str) -> Result<&Stream, (ErrorCode, String)> {
        self.streams
            .get(name)
            .ok_or_else(|| (ErrorCode::StreamNotFound, format!("no stream {name}")))
    }

    /// A topic by stream and name.
    pub fn topic(&self, stream: &str, topic: &str) -> Result<&Topic, (ErrorCode, String)> {
        self.stream(stream)?
            .topics
            .get(topic)
            .ok_or_else(|| (ErrorCode::TopicNotFound, format!("no topic {stream}/{topic}")))
    }

    /// A partition's place.
    pub fn partition(
        &self,
        stream: &str,
        topic: &str,
        partition: u32,
    ) -> Result<(&Topic, PartitionPlace), (ErrorCode, String)> {
        let entry = self.topic(stream, topic)?;
        match entry.partitions.get(partition as usize) {
            Some(place) => Ok((entry, *place)),
            None => Err((
                ErrorCode::PartitionNotFound,
                format!(
                    "{stream}/{topic} has {} partitions; there is no partition {partition}",
                    entry.partitions.len()
                ),
            )),
        }
    }

    /// Whether `member` of consumer group `group` may commit or poll for `partition` of
    /// `stream/topic` under `generation`: the group's assignment in force must be that
    /// generation and give the member that partition.
    pub fn check_member(
        &self,
        stream: &str,
        topic: &str,
        group: &str,
        membership: &Membership,
        partition: u32,
    ) -> Result<(), (ErrorCode, String)> {
        let entry = self.topic(stream, topic)?;
        let Some(in_force) = entry.consumer_groups.get(group) else {
            return Err((ErrorCode::UnknownMember, format!("group {group} has no members")));
        };
        if membership.generation != in_force.generation {
            return Err((
                ErrorCode::StaleGeneration,
                format!(
                    "group {group} is at generation {}, not {}: take the new assignment",
                    in_force.generation, membership.generation
                ),
            ));
        }
        let Some(part) = in_force.member(&membership.member) else {
            return Err((
                ErrorCode::UnknownMember,
                format!("group {group} has no member {:?}: join again", membership.member),
            ));
        };
        if !part.partitions.contains(&partition) {
            return Err((
                ErrorCode::NotAssigned,
                format!(
                    "partition {partition} is not assigned to {} in generation {}",
                    membership.member, in_force.generation
                ),
            ));
        }
        Ok(())
    }

    /// Every partition placed on `shard`, with its engine settings.
    pub fn groups_on(&self, shard: u32) -> Vec<(u64, GroupConfig)> {
        let mut groups = Vec::new();
        for stream in self.streams.values() {
            for topic in stream.topics.values() {
                for place in topic.partitions.iter().filter(|p| p.shard == shard) {
                    groups.push((place.group, topic.settings.group_config()));
                }
            }
        }
        groups
    }

    /// Streams for `ListStreams`.
    pub fn stream_infos(&self) -> Vec<StreamInfo> {
        self.streams
            .iter()
            .map(|(name, stream)| StreamInfo {
                name: name.clone(),
                topic_count: stream.topics.len() as u32,
                created_ms: stream.created_ms,
            })
            .collect()
    }

    /// One topic for `ListTopics` and `DescribeTopic`.
    pub fn topic_info(stream: &str, name: &str, topic: &Topic) -> TopicInfo {
        TopicInfo {
            stream: stream.to_string(),
            name: name.to_string(),
            partitions: topic.partitions.len() as u32,
            durability: topic.settings.durability,
            retention_bytes: topic.settings.retention_bytes,
            retention_ms: topic.settings.retention_ms,
            segment_size_bytes: topic.settings.segment_size_bytes,
            message_size_bytes_max: topic.settings.message_size_bytes_max,
            created_ms: topic.created_ms,
        }
    }

    /// Every partition of every topic, in name order, with zeroed offsets (the owning shards fill
    /// them in).
    pub fn partition_infos(&self) -> Vec<(String, String, PartitionInfo)> {
        let mut all = Vec::new();
        for (stream_name, stream) in &self.streams {
            for (topic_name, topic) in &stream.topics {
                for (index, place) in topic.partitions.iter().enumerate() {
                    all.push((
                        stream_name.clone(),
                        topic_name.clone(),
                        PartitionInfo {
                            partition: index as u32,
                            shard: place.shard,
                            group: place.group,
                            first_offset: 0,
                            next_offset: 0,
                            size_bytes: 0,
                        },
                    ));
                }
            }
        }
        all
    }
}

fn check_name(name: &str) -> Result<(), (ErrorCode, String)> {
    validate_name(name).map_err(|reason| (ErrorCode::InvalidName, format!("{name:?}: {reason}")))
}

/// The catalog every shard reads, published by shard 0 after each applied change.
///
/// Shards keep their own `Arc` and compare versions with one atomic load per request; only a
/// changed catalog takes the lock. Shard 0 publishes before it answers the change's client, so
/// any request that client sends afterwards, on any shard, sees the change.
#[derive(Debug)]
pub struct Published {
    version: std::sync::atomic::AtomicU64,
    catalog: std::sync::Mutex<Arc<Catalog>>,
}

impl Published {
    /// Publishes `catalog` as the first version.
    pub fn new(catalog: Arc<Catalog>) -> Published {
        Published {
            version: std::sync::atomic::AtomicU64::new(catalog.applied_op),
            catalog: std::sync::Mutex::new(catalog),
        }
    }

    /// Replaces the catalog.
    pub fn publish(&self, catalog: Arc<Catalog>) {
        let version = catalog.applied_op;
        *self.catalog.lock().unwrap_or_else(|e| e.into_inner()) = catalog;
        self.version.store(version, std::sync::atomic::Ordering::Release);
    }

    /// Refreshes `cached` if a newer catalog was published.
    pub fn refresh(&self, cached: &mut Arc<Catalog>) {
        if self.version.load(std::sync::atomic::Ordering::Acquire) != cached.applied_op {
            *cached = Arc::clone(&self.catalog.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(partitions: u32) -> TopicSettings {
        TopicSettings {
            partitions,
            durability: Durability::Persisted,
            retention_bytes: 0,
            retention_ms: 0,
            segment_size_bytes: 8 << 20,
            message_size_bytes_max: 1 << 16,
        }
    }

    #[test]
    fn metadata_commands_round_trip() {
        let commands = [
            MetaCommand::RegisterSession,
            MetaCommand::CreateStream { name: "s".into() },
            MetaCommand::DeleteStream { name: "s".into() },
            MetaCommand::CreateTopic {
                stream: "s".into(),
                topic: "t".into(),
                settings: settings(3),
            },
            MetaCommand::DeleteTopic { stream: "s".into(), topic: "t".into() },
        ];
        for command in commands {
            assert_eq!(MetaCommand::decode(&command.encode()), Ok(command));
        }
        assert!(MetaCommand::decode(&[9]).is_err());
        assert!(MetaCommand::decode(&[]).is_err());
    }

    #[test]
    fn metadata_apply_places_partitions_over_shards_deterministically() {
        let mut a = Catalog::new(2, 4);
        let create_stream = MetaCommand::CreateStream { name: "s".into() };
        assert_eq!(a.apply(1, 10, &create_stream), Ok(Applied::Done));
        let create = MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            settings: settings(3),
        };
        assert_eq!(a.apply(2, 11, &create), Ok(Applied::Done));
        let topic = a.topic("s", "t").unwrap();
        // Shard 0 holds the metadata group, so the first partition goes to shard 1.
        let shards: Vec<u32> = topic.partitions.iter().map(|p| p.shard).collect();
        assert_eq!(shards, [1, 0, 1]);
        let groups: Vec<u64> = topic.partitions.iter().map(|p| p.group).collect();
        assert_eq!(groups, [1, 2, 3]);
        assert_eq!(a.groups_on(1).len(), 2);

        // Replaying the same log gives the same catalog.
        let mut b = Catalog::new(2, 4);
        b.apply(1, 10, &create_stream).unwrap();
        b.apply(2, 11, &create).unwrap();
        assert_eq!(a, b);

        assert_eq!(a.apply(3, 12, &create).unwrap_err().0, ErrorCode::TopicExists);
        assert_eq!(a.apply(4, 13, &MetaCommand::RegisterSession), Ok(Applied::Session(4)));
        let unknown = MetaCommand::DeleteTopic { stream: "x".into(), topic: "t".into() };
        assert_eq!(a.apply(5, 14, &unknown).unwrap_err().0, ErrorCode::StreamNotFound);
        assert_eq!(a.applied_op, 5);
    }

    #[test]
    fn metadata_partition_bound_is_enforced() {
        let mut catalog = Catalog::new(2, 3);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        // 6 slots, one taken by the metadata group: 5 partitions fit, a sixth does not.
        let create = |topic: &str, partitions| MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: topic.into(),
            settings: settings(partitions),
        };
        assert_eq!(catalog.check(&create("big", 6)).unwrap_err().0, ErrorCode::LimitReached);
        assert_eq!(catalog.apply(2, 0, &create("fits", 5)), Ok(Applied::Done));
        assert_eq!(catalog.apply(3, 0, &create("more", 1)).unwrap_err().0, ErrorCode::LimitReached);
        // Deleting a topic does not free its groups until the engine can delete them.
        catalog
            .apply(4, 0, &MetaCommand::DeleteTopic { stream: "s".into(), topic: "fits".into() })
            .unwrap();
        assert_eq!(catalog.check(&create("again", 1)).unwrap_err().0, ErrorCode::LimitReached);
    }

    #[test]
    fn metadata_names_and_settings_are_checked() {
        let catalog = Catalog::new(1, 8);
        let bad = MetaCommand::CreateStream { name: "no spaces".into() };
        assert_eq!(catalog.check(&bad).unwrap_err().0, ErrorCode::InvalidName);
        let defaults = TopicDefaults::default();
        let request = CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            partitions: 0,
            segment_size_bytes: Some(1),
            ..Default::default()
        };
        let error = TopicSettings::resolve(&request, &defaults, 1 << 21).unwrap_err();
        assert_eq!(error.0, ErrorCode::InvalidArgument);
        assert!(error.1.contains("segment_size_bytes"), "{}", error.1);
        let request = CreateTopic { segment_size_bytes: None, ..request };
        let resolved = TopicSettings::resolve(&request, &defaults, 2 << 20).unwrap();
        assert_eq!(resolved.partitions, defaults.partitions);
        let too_big = CreateTopic { message_size_bytes_max: Some(4 << 20), ..request };
        assert!(TopicSettings::resolve(&too_big, &defaults, 2 << 20).is_err());
    }
}
