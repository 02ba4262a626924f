//! The metadata state machine: streams, topics, their partitions' groups and shards, client
//! sessions and the client table that deduplicates admin requests. Its log is the metadata VSR
//! group (group 0, on shard 0, `persisted`): every change is a [`MetaCommand`] carried as the
//! value of a one-record batch, and the [`MetaState`] (the [`Catalog`] plus the client table) is
//! what applying the committed log in op order yields. Restart restores the newest snapshot
//! ([`MetaState::encode_snapshot`], saved by the shard every `metadata.snapshot_interval_ops`
//! ops) and replays the log past it.
//!
//! It owns the command encoding, the validation of a command against the catalog, the client
//! table's use (which requests execute, which are answered with a kept reply), the deterministic
//! apply (group ids and shards assigned from the catalog alone, times from the prepare header)
//! and the snapshot bytes. It must never read a clock, touch storage or a socket, or depend on
//! anything but the state and the op: two replicas applying the same log must agree byte for
//! byte, and so must a replay from a snapshot and a replay from the first op.

use std::collections::BTreeMap;
use std::sync::Arc;

use shoal_engine::superblock::{
    Durability, GroupConfig, SEGMENT_SIZE_BYTES_MAX, SEGMENT_SIZE_BYTES_MIN,
};
use shoal_proto::protocol::consumer::Membership;
use shoal_proto::protocol::{
    CreateTopic, ErrorCode, MoveAction, MovePartition, PartitionInfo, ProtocolError, Reader,
    StreamInfo, TopicInfo, Writer, validate_name,
};
use shoal_proto::wire::{HEADER_SIZE, Membership as GroupMembers};
use shoal_replication::{ClientCheck, ClientLimits, ClientTable};

use crate::config::{ClusterConfig, ClusterNode, NODES_MAX, TopicDefaults};
use crate::kafka_groups::{GROUPS_MAX as KAFKA_GROUPS_MAX, StoredGroup};
use crate::node_book::{NodeBook, read_node, replacement_for, voters_for, write_node};

/// The metadata group's id.
pub const METADATA_GROUP: u64 = 0;
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
        /// The topics' partition groups leave the per-shard placement count (nodes delete
        /// them). False in records written before nodes could delete groups, whose replay must
        /// keep counting them as it did.
        frees_groups: bool,
    },
    /// Creates a topic with settings already resolved against the defaults.
    CreateTopic {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// The resolved settings.
        settings: TopicSettings,
        /// The cluster's node count as the proposing primary knew it: placement spreads the
        /// partitions' view-0 primaries over this many nodes, so where they go is in the log,
        /// never in a replaying node's own configuration. 1 in records written before clusters.
        nodes: u8,
    },
    /// Deletes a topic.
    DeleteTopic {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// As for [`MetaCommand::DeleteStream`].
        frees_groups: bool,
    },
    /// Grows a topic to `partitions` partitions (Kafka's CreatePartitions); existing partitions
    /// and their data stay where they are.
    AddPartitions {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// The new partition count, above the current one.
        partitions: u32,
        /// The node count as the proposing primary knew it (placement, as for `CreateTopic`).
        nodes: u8,
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
    /// A Kafka group's state after a completed rebalance, or (no members) its end: what a
    /// Kafka group coordinator that starts takes up (`crate::kafka_groups`). It changes nothing
    /// in the catalog.
    StoreKafkaGroup(StoredGroup),
    /// Starts, cancels or ends a partition's move (`docs/cluster.md`, "Moving partitions").
    Move {
        /// The stream.
        stream: String,
        /// The topic.
        topic: String,
        /// The partition.
        partition: u32,
        /// What to do.
        action: MoveAction,
        /// The founding node count as the proposing primary knew it (with the catalog's book,
        /// it says which nodes are active: a move's nodes must be).
        nodes: u8,
    },
    /// Adds node `node` to the cluster's address book (`docs/cluster.md`, "Adding and removing
    /// nodes"): its peers dial it, and it joins the metadata group as a learner.
    AddNode {
        /// Its index (past the founding nodes, not in use).
        node: u8,
        /// Where its peers and clients reach it.
        address: ClusterNode,
        /// The founding node count as the proposing primary knew it.
        founders: u8,
    },
    /// Starts removing node `node`: nothing new is placed there, and every partition it holds
    /// starts a move to `replacement` (or to the active node holding the fewest replicas).
    RemoveNode {
        /// The node leaving.
        node: u8,
        /// The node taking its replicas, if one was named (`replace-node`).
        replacement: Option<u8>,
        /// The founding node count as the proposing primary knew it.
        founders: u8,
    },
    /// Makes voter `node` the partition's preferred primary (the leader balancer's change):
    /// its primary hands the group over once that node is in sync, and hands it back there
    /// after a failover. `None`: its home again.
    PreferPrimary {
        /// The partition's group.
        group: u64,
        /// One of its voters, or none.
        node: Option<u8>,
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
    /// The topic's own `replica_lag_time_max_ms` for its partitions' replicas (0: the
    /// cluster's `[replication]` value). Not in `encode_settings`: the create command and the
    /// snapshot carry it after the other settings, so records written before it read as 0.
    pub replica_lag_time_max_ms: u64,
    /// Nodes holding each partition (0: every node, as for topics created before the
    /// setting). Carried after the lag bound, like it.
    pub replication_factor: u8,
}

/// A topic's replication factor when its creator names none (capped by the node count), as
/// Redpanda's and most Kafka deployments' `default.replication.factor`.
pub const REPLICATION_FACTOR_DEFAULT: u8 = 3;

/// The bounds of a topic's `replica_lag_time_max_ms` (0 aside), as of the `[replication]` key.
pub const REPLICA_LAG_TIME_MS_RANGE: std::ops::RangeInclusive<u64> = 10..=3_600_000;

impl TopicSettings {
    /// What a topic created with no setting of its own has: the `[topic_defaults]` (and no lag
    /// bound of its own: the cluster's).
    pub fn from_defaults(defaults: &TopicDefaults) -> TopicSettings {
        TopicSettings {
            partitions: defaults.partitions,
            durability: defaults.durability,
            retention_bytes: defaults.retention_bytes,
            retention_ms: defaults.retention_ms,
            segment_size_bytes: defaults.segment_size_bytes,
            message_size_bytes_max: u64::from(defaults.message_size_bytes_max),
            replica_lag_time_max_ms: 0,
            replication_factor: 0,
        }
    }

    /// Resolves a create request against the defaults and checks every bound; the error names
    /// the argument. `record_size_bytes_max` is the shards' largest record (header + batch);
    /// `partitions_max` is `[metadata] topic_partitions_max`; `nodes` the cluster's node count,
    /// which bounds the replication factor (by default three, or every node of a smaller
    /// cluster).
    pub fn resolve(
        request: &CreateTopic,
        defaults: &TopicDefaults,
        record_size_bytes_max: usize,
        partitions_max: u32,
        nodes: u8,
    ) -> Result<TopicSettings, (ErrorCode, String)> {
        let defaults = TopicSettings::from_defaults(defaults);
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
                .unwrap_or(defaults.message_size_bytes_max),
            replica_lag_time_max_ms: request
                .replica_lag_time_max_ms
                .unwrap_or(defaults.replica_lag_time_max_ms),
            replication_factor: request
                .replication_factor
                .unwrap_or(REPLICATION_FACTOR_DEFAULT.min(nodes)),
        };
        let invalid = |reason: String| Err((ErrorCode::InvalidArgument, reason));
        if !(1..=partitions_max).contains(&settings.partitions) {
            return invalid(format!(
                "partitions {}: use 1 to {partitions_max} ([metadata] topic_partitions_max)",
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
        let lag_ms = settings.replica_lag_time_max_ms;
        if lag_ms != 0 && !REPLICA_LAG_TIME_MS_RANGE.contains(&lag_ms) {
            return invalid(format!(
                "replica_lag_time_max_ms {lag_ms}: use {} to {} (or none: the cluster's)",
                REPLICA_LAG_TIME_MS_RANGE.start(),
                REPLICA_LAG_TIME_MS_RANGE.end()
            ));
        }
        if !(1..=nodes).contains(&settings.replication_factor) {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "replication_factor {}: use 1 to {nodes}, the cluster's node count",
                    settings.replication_factor
                ),
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
const TAG_ADD_PARTITIONS: u8 = 7;
const TAG_STORE_KAFKA_GROUP: u8 = 8;
const TAG_MOVE: u8 = 9;
const TAG_ADD_NODE: u8 = 10;
const TAG_REMOVE_NODE: u8 = 11;
/// `DeleteStream` and `DeleteTopic` that free their groups' places (tags 3 and 5 do not).
const TAG_DELETE_STREAM_FREEING: u8 = 12;
const TAG_DELETE_TOPIC_FREEING: u8 = 13;
const TAG_PREFER_PRIMARY: u8 = 14;

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
            MetaCommand::DeleteStream { name, frees_groups } => {
                w.u8(if *frees_groups { TAG_DELETE_STREAM_FREEING } else { TAG_DELETE_STREAM });
                w.str(name);
            }
            MetaCommand::CreateTopic { stream, topic, settings, nodes } => {
                w.u8(TAG_CREATE_TOPIC).str(stream).str(topic);
                encode_settings(&mut w, settings);
                w.u8(*nodes).u64(settings.replica_lag_time_max_ms).u8(settings.replication_factor);
            }
            MetaCommand::DeleteTopic { stream, topic, frees_groups } => {
                w.u8(if *frees_groups { TAG_DELETE_TOPIC_FREEING } else { TAG_DELETE_TOPIC });
                w.str(stream).str(topic);
            }
            MetaCommand::AddPartitions { stream, topic, partitions, nodes } => {
                w.u8(TAG_ADD_PARTITIONS).str(stream).str(topic).u32(*partitions).u8(*nodes);
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
            MetaCommand::StoreKafkaGroup(group) => {
                w.u8(TAG_STORE_KAFKA_GROUP);
                group.write(&mut w);
            }
            MetaCommand::Move { stream, topic, partition, action, nodes } => {
                let body = MovePartition {
                    stream: stream.clone(),
                    topic: topic.clone(),
                    partition: *partition,
                    action: *action,
                };
                w.u8(TAG_MOVE).u8(*nodes).bytes(&body.encode());
            }
            MetaCommand::AddNode { node, address, founders } => {
                w.u8(TAG_ADD_NODE).u8(*node).u8(*founders);
                write_node(&mut w, address);
            }
            MetaCommand::RemoveNode { node, replacement, founders } => {
                w.u8(TAG_REMOVE_NODE).u8(*node).u8(replacement.unwrap_or(u8::MAX)).u8(*founders);
            }
            MetaCommand::PreferPrimary { group, node } => {
                w.u8(TAG_PREFER_PRIMARY).u64(*group).u8(node.unwrap_or(u8::MAX));
            }
        }
        w.finish()
    }

    /// Decodes a command from the metadata log.
    pub fn decode(bytes: &[u8]) -> Result<MetaCommand, ProtocolError> {
        let mut r = Reader::new(bytes);
        let tag = r.u8("tag")?;
        let command = match tag {
            TAG_REGISTER_SESSION => MetaCommand::RegisterSession,
            TAG_CREATE_STREAM => MetaCommand::CreateStream { name: r.name("stream")? },
            TAG_DELETE_STREAM | TAG_DELETE_STREAM_FREEING => MetaCommand::DeleteStream {
                name: r.name("stream")?,
                frees_groups: tag == TAG_DELETE_STREAM_FREEING,
            },
            TAG_CREATE_TOPIC => {
                let stream = r.name("stream")?;
                let topic = r.name("topic")?;
                let mut settings = decode_settings(&mut r)?;
                // Records written before clusters end at the settings: a one-node cluster's;
                // those written before per-topic lag bounds end at the node count.
                let nodes = if r.remaining() > 0 { r.u8("nodes")? } else { 1 };
                settings.replica_lag_time_max_ms =
                    if r.remaining() > 0 { r.u64("replica_lag_time_max_ms")? } else { 0 };
                // Records written before replication factors: every node holds the topic.
                settings.replication_factor =
                    if r.remaining() > 0 { r.u8("replication_factor")? } else { 0 };
                if !(1..=NODES_MAX).contains(&usize::from(nodes)) {
                    return Err(ProtocolError::Invalid {
                        field: "nodes",
                        reason: format!("{nodes}: a cluster has 1 to {NODES_MAX} nodes"),
                    });
                }
                // Nodes added since the cluster formed count too: the catalog checks the
                // factor against the active nodes when the record applies.
                if usize::from(settings.replication_factor) > NODES_MAX {
                    return Err(ProtocolError::Invalid {
                        field: "replication_factor",
                        reason: format!("{}: at most {NODES_MAX}", settings.replication_factor),
                    });
                }
                MetaCommand::CreateTopic { stream, topic, settings, nodes }
            }
            TAG_DELETE_TOPIC | TAG_DELETE_TOPIC_FREEING => MetaCommand::DeleteTopic {
                stream: r.name("stream")?,
                topic: r.name("topic")?,
                frees_groups: tag == TAG_DELETE_TOPIC_FREEING,
            },
            TAG_ADD_PARTITIONS => {
                let stream = r.name("stream")?;
                let topic = r.name("topic")?;
                let partitions = r.u32("partitions")?;
                let nodes = r.u8("nodes")?;
                if !(1..=NODES_MAX).contains(&usize::from(nodes)) {
                    return Err(ProtocolError::Invalid {
                        field: "nodes",
                        reason: format!("{nodes}: a cluster has 1 to {NODES_MAX} nodes"),
                    });
                }
                MetaCommand::AddPartitions { stream, topic, partitions, nodes }
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
            TAG_STORE_KAFKA_GROUP => MetaCommand::StoreKafkaGroup(StoredGroup::read(&mut r)?),
            TAG_MOVE => {
                let nodes = r.u8("nodes")?;
                if !(1..=NODES_MAX).contains(&usize::from(nodes)) {
                    return Err(ProtocolError::Invalid {
                        field: "nodes",
                        reason: format!("{nodes}: a cluster has 1 to {NODES_MAX} nodes"),
                    });
                }
                // Two names and three fixed fields.
                let body = MovePartition::decode(r.bytes("move", 1024)?)?;
                let MovePartition { stream, topic, partition, action } = body;
                MetaCommand::Move { stream, topic, partition, action, nodes }
            }
            TAG_ADD_NODE => {
                let node = r.u8("node")?;
                let founders = founders(&mut r)?;
                MetaCommand::AddNode { node, founders, address: read_node(&mut r)? }
            }
            TAG_REMOVE_NODE => {
                let node = r.u8("node")?;
                let replacement = r.u8("replacement")?;
                let replacement = (replacement != u8::MAX).then_some(replacement);
                MetaCommand::RemoveNode { node, replacement, founders: founders(&mut r)? }
            }
            TAG_PREFER_PRIMARY => {
                let group = r.u64("group")?;
                let node = r.u8("node")?;
                MetaCommand::PreferPrimary { group, node: (node != u8::MAX).then_some(node) }
            }
            other => {
                return Err(ProtocolError::Invalid { field: "tag", reason: format!("{other}") });
            }
        };
        r.end()?;
        Ok(command)
    }
}

/// A command's founding node count, within 1 to [`NODES_MAX`].
fn founders(r: &mut Reader<'_>) -> Result<u8, ProtocolError> {
    let founders = r.u8("founders")?;
    if !(1..=NODES_MAX).contains(&usize::from(founders)) {
        return Err(ProtocolError::Invalid {
            field: "founders",
            reason: format!("{founders}: a cluster has 1 to {NODES_MAX} nodes"),
        });
    }
    Ok(founders)
}

/// One partition's place: its group, owning shard and the nodes holding it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PartitionPlace {
    /// The VSR group.
    pub group: u64,
    /// The shard that owns it (the same index on every node holding it).
    pub shard: u32,
    /// The nodes holding the group when it was created, as its replicas' members (voters
    /// only); empty: every node of the cluster (partitions placed before replication factors).
    /// A finished move replaces them with its target.
    pub members: GroupMembers,
    /// A move in progress: the voters the partition's group is being taken to (its primary
    /// does it, one configuration change at a time); empty: no move.
    pub target: GroupMembers,
    /// The voter the leader balancer prefers as the partition's primary over its home (see
    /// [`PartitionPlace::preferred_primary`]); cleared by a move that takes it off the voters.
    pub preferred: Option<u8>,
}

impl PartitionPlace {
    /// The nodes holding the partition as its members, ascending, on a cluster of `nodes` nodes
    /// (every node for a partition placed before replication factors).
    pub fn replicas(&self, nodes: u8) -> Vec<u8> {
        if self.members.is_empty() {
            return (0..nodes).collect();
        }
        self.members.member_indices().collect()
    }

    /// The members the partition has, or the ones its move in progress takes it to.
    pub fn destined(&self) -> GroupMembers {
        if self.target.is_empty() { self.members } else { self.target }
    }

    /// Whether node `node` holds the partition: a member, or a target of its move.
    pub fn is_held_by(&self, node: u8) -> bool {
        self.members.is_empty() || self.members.is_member(node) || self.target.is_member(node)
    }

    /// Whether node `node` holds the partition only as a target of its move: it joins the
    /// group as a learner.
    pub fn is_joined_by(&self, node: u8) -> bool {
        !self.members.is_empty() && !self.members.is_member(node) && self.target.is_member(node)
    }

    /// The members a node creating the group records for it: its members, and the move's
    /// new nodes as learners. A joining node starts with these, learns the group's current
    /// configuration from its primary, and never votes before a change makes it a voter.
    pub fn created_members(&self) -> GroupMembers {
        GroupMembers {
            voters: self.members.voters,
            learners: self.members.learners | (self.target.voters & !self.members.voters),
        }
    }

    /// Where the partition's primary belongs on a cluster of `nodes` founding nodes: the voter
    /// the leader balancer preferred, while it is one, else the home. A primary elsewhere hands
    /// the group over to it once it is in sync.
    pub fn preferred_primary(&self, nodes: u8) -> u8 {
        match self.preferred {
            Some(node) if self.members.is_voter(node) => node,
            _ => self.home(nodes),
        }
    }

    /// The partition's home on a cluster of `nodes` nodes: its view-0 primary (DESIGN.md §8),
    /// the `group mod v`-th of its v voters, ascending, as the replicas choose it.
    pub fn home(&self, nodes: u8) -> u8 {
        if self.members.is_empty() {
            return (self.group % u64::from(nodes.max(1))) as u8;
        }
        let voters = u64::from(self.members.voter_count());
        let index = (self.group % voters) as usize;
        self.members.voter_indices().nth(index).expect("the index is below the voter count")
    }

    /// The members of `group` for a replication factor of `factor` over the `active` nodes
    /// ([`voters_for`]: consecutive groups spread their replicas, and by
    /// [`PartitionPlace::home`] their primaries, evenly). Empty (every node) for a factor of 0.
    pub fn members_for(group: u64, factor: u8, active: u32) -> GroupMembers {
        GroupMembers { voters: voters_for(group, factor, active), learners: 0 }
    }
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

impl Topic {
    /// Whether consumer group `group` of this topic has members now.
    pub fn group_has_members(&self, group: &str) -> bool {
        self.consumer_groups.get(group).is_some_and(|g| !g.members.is_empty())
    }
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
    /// Groups placed on each shard. A deleted topic's groups leave the count (the nodes delete
    /// them), except where a deletion recorded before nodes could delete groups is replayed:
    /// those stay counted, so an old log replays to the same places.
    pub groups_per_shard: Vec<u32>,
    /// Groups each shard may hold (its superblock's bound; shard 0 also holds the metadata).
    pub groups_per_shard_max: u32,
    /// The nodes added since the cluster formed, and those leaving.
    pub nodes: NodeBook,
}

/// The placement of new partitions over shards (DESIGN.md §8), from the catalog alone.
#[derive(Clone, Debug)]
struct Placement {
    /// Node slots up to the highest known node.
    nodes: u8,
    /// More than one node is active: homes are spread.
    spread: bool,
    groups_per_shard: Vec<u32>,
    groups_per_shard_max: u32,
    /// Per (shard, node), at `shard * nodes + node`: live groups on the shard whose home (view-0
    /// primary) is the node.
    homes: Vec<u32>,
}

impl Placement {
    /// The shard for a group whose home is node `home`, counted as placed there: among the
    /// shards with room, the one where the home leads the fewest groups, then the one holding the fewest
    /// groups, then the lowest index. So each node's view-0 primaries spread evenly over its
    /// shards, and as the nodes lead groups in turn (`g mod nodes`), every (node, shard) pair
    /// leads within one of every other. With one node there is nothing to spread: the fewest
    /// groups held decides alone, as it did before clusters, so a single node's log replays to
    /// the same places. `None`: every shard is full.
    fn place(&mut self, home: u8) -> Option<u32> {
        let nodes = usize::from(self.nodes);
        let home = usize::from(home) % nodes;
        let led = |shard: usize| if self.spread { self.homes[shard * nodes + home] } else { 0 };
        let shard = (0..self.groups_per_shard.len())
            .filter(|&shard| self.groups_per_shard[shard] < self.groups_per_shard_max)
            .min_by_key(|&shard| (led(shard), self.groups_per_shard[shard], shard))?;
        self.groups_per_shard[shard] += 1;
        self.homes[shard * nodes + home] += 1;
        Some(shard as u32)
    }
}

/// What applying a command produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A session was registered.
    Session(u64),
    /// A node was added: its index.
    Node(u8),
    /// The change is made.
    Done,
}

impl Catalog {
    /// An empty catalog of a one-node cluster for `shards` shards of `groups_per_shard_max`
    /// groups each.
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
            nodes: NodeBook::default(),
        }
    }

    /// Checks whether `command` would apply, without changing anything (the server checks before
    /// proposing, so most refusals never enter the log; apply checks again because commands
    /// proposed together may conflict).
    pub fn check(&self, command: &MetaCommand) -> Result<(), (ErrorCode, String)> {
        match command {
            // The metadata state, not the catalog, keeps Kafka groups (`MetaState::apply`).
            MetaCommand::RegisterSession | MetaCommand::StoreKafkaGroup(_) => Ok(()),
            MetaCommand::Move { stream, topic, partition, action, nodes } => {
                let (_, place) = self.partition(stream, topic, *partition)?;
                check_move(&place, *action, self.nodes.active(*nodes))
                    .map_err(|reason| (ErrorCode::InvalidArgument, reason))
            }
            MetaCommand::AddNode { node, address, founders } => self
                .nodes
                .check_add(*node, address, *founders)
                .map_err(|reason| (ErrorCode::InvalidArgument, reason)),
            MetaCommand::RemoveNode { node, replacement, founders } => {
                let refused = |reason| (ErrorCode::InvalidArgument, reason);
                self.nodes.check_remove(*node, *replacement, *founders).map_err(refused)?;
                self.replacements(*node, *replacement, *founders).map(|_| ()).map_err(refused)
            }
            MetaCommand::PreferPrimary { group, node } => {
                let Some(place) = self.place_of(*group) else {
                    return Err((
                        ErrorCode::PartitionNotFound,
                        format!("no partition is group {group}"),
                    ));
                };
                match node {
                    Some(node) if !place.members.is_voter(*node) => Err((
                        ErrorCode::InvalidArgument,
                        format!("node {node} is not a voter of group {group}"),
                    )),
                    _ => Ok(()),
                }
            }
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
            MetaCommand::DeleteStream { name, .. } => self.stream(name).map(|_| ()),
            MetaCommand::CreateTopic { stream, topic, settings, nodes } => {
                check_name(topic)?;
                let active = self.nodes.active(*nodes).count_ones();
                if u32::from(settings.replication_factor) > active {
                    return Err((
                        ErrorCode::InvalidArgument,
                        format!(
                            "replication_factor {}: more than the {active} active nodes",
                            settings.replication_factor
                        ),
                    ));
                }
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
                self.check_room(*nodes, settings.partitions)
            }
            MetaCommand::DeleteTopic { stream, topic, .. } => self.topic(stream, topic).map(|_| ()),
            MetaCommand::AddPartitions { stream, topic, partitions, nodes } => {
                let entry = self.topic(stream, topic)?;
                let current = entry.partitions.len() as u32;
                let factor = entry.settings.replication_factor;
                let active = self.nodes.active(*nodes).count_ones();
                if u32::from(factor) > active {
                    return Err((
                        ErrorCode::InvalidArgument,
                        format!(
                            "{stream}/{topic} has {factor} replicas: more than the {active} \
                             active nodes"
                        ),
                    ));
                }
                if *partitions <= current {
                    return Err((
                        ErrorCode::InvalidArgument,
                        format!("{stream}/{topic} has {current} partitions: ask for more"),
                    ));
                }
                self.check_room(*nodes, partitions - current)
            }
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

    /// Places `count` new partition groups on a cluster founded by `nodes` nodes (room checked
    /// already) and counts them on their shards.
    fn place_new(&mut self, nodes: u8, factor: u8, count: u32) -> Vec<PartitionPlace> {
        let mut placement = self.placement(nodes);
        let active = self.nodes.active(nodes);
        let mut places = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let group = self.next_group;
            let members = PartitionPlace::members_for(group, factor, active);
            let target = GroupMembers::default();
            let home =
                PartitionPlace { group, shard: 0, members, target, preferred: None }.home(nodes);
            let shard = placement.place(home).expect("checked");
            self.groups_per_shard[shard as usize] += 1;
            places.push(PartitionPlace { group, shard, members, target, preferred: None });
            self.next_group += 1;
        }
        places
    }

    /// Whether `partitions` new partition groups, placed for `nodes` nodes, fit on the shards.
    fn check_room(&self, nodes: u8, partitions: u32) -> Result<(), (ErrorCode, String)> {
        let mut placement = self.placement(nodes);
        for _ in 0..partitions {
            // The home only orders shards with room; whether one has room is all asked here.
            if placement.place(0).is_none() {
                return Err((
                    ErrorCode::LimitReached,
                    format!(
                        "every shard holds its {} partitions already",
                        self.groups_per_shard_max
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Counts `op` as applied without changing anything (an op whose command is not executed:
    /// unreadable, or a duplicate the client table answers).
    pub fn skip(&mut self, op: u64) {
        self.applied_op = self.applied_op.max(op);
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
            MetaCommand::DeleteStream { name, frees_groups } => {
                let stream = self.streams.remove(name).expect("checked");
                if *frees_groups {
                    for topic in stream.topics.values() {
                        self.free_groups(topic);
                    }
                }
            }
            MetaCommand::CreateTopic { stream, topic, settings, nodes } => {
                let factor = settings.replication_factor;
                let partitions = self.place_new(*nodes, factor, settings.partitions);
                let entry = Topic {
                    settings: *settings,
                    partitions,
                    created_ms: append_time_ms,
                    consumer_groups: BTreeMap::new(),
                };
                let stream = self.streams.get_mut(stream).expect("checked");
                stream.topics.insert(topic.clone(), entry);
            }
            MetaCommand::DeleteTopic { stream, topic, frees_groups } => {
                let entry = self.streams.get_mut(stream).expect("checked");
                let topic = entry.topics.remove(topic).expect("checked");
                if *frees_groups {
                    self.free_groups(&topic);
                }
            }
            MetaCommand::AddPartitions { stream, topic, partitions, nodes } => {
                let entry = self.topic(stream, topic).expect("checked");
                let current = entry.partitions.len() as u32;
                let factor = entry.settings.replication_factor;
                let added = self.place_new(*nodes, factor, partitions - current);
                let entry = self.streams.get_mut(stream).expect("checked");
                let entry = entry.topics.get_mut(topic).expect("checked");
                entry.partitions.extend(added);
                entry.settings.partitions = *partitions;
            }
            MetaCommand::Rebalance { stream, topic, group, generation, members } => {
                let entry = self.streams.get_mut(stream).expect("checked");
                let entry = entry.topics.get_mut(topic).expect("checked");
                let group = entry.consumer_groups.entry(group.clone()).or_default();
                group.generation = *generation;
                group.members = members.clone();
            }
            MetaCommand::StoreKafkaGroup(_) => {}
            MetaCommand::Move { stream, topic, partition, action, .. } => {
                let entry = self.streams.get_mut(stream).expect("checked");
                let entry = entry.topics.get_mut(topic).expect("checked");
                let place = &mut entry.partitions[*partition as usize];
                match *action {
                    MoveAction::Start { voters } => {
                        place.target = GroupMembers { voters, learners: 0 };
                    }
                    MoveAction::Cancel => place.target = place.members,
                    MoveAction::Done { voters } => {
                        place.members = GroupMembers { voters, learners: 0 };
                        place.target = GroupMembers::default();
                        if place.preferred.is_some_and(|node| !place.members.is_voter(node)) {
                            place.preferred = None;
                        }
                    }
                }
            }
            MetaCommand::AddNode { node, address, .. } => {
                self.nodes.added.insert(*node, address.clone());
                return Ok(Applied::Node(*node));
            }
            MetaCommand::RemoveNode { node, replacement, founders } => {
                let moves = self.replacements(*node, *replacement, *founders).expect("checked");
                self.nodes.leaving |= 1 << node;
                let mut moves = moves.into_iter();
                for stream in self.streams.values_mut() {
                    for topic in stream.topics.values_mut() {
                        for place in &mut topic.partitions {
                            if let Some(&(group, voters)) = moves.as_slice().first()
                                && group == place.group
                            {
                                place.target = GroupMembers { voters, learners: 0 };
                                moves.next();
                            }
                        }
                    }
                }
            }
            MetaCommand::PreferPrimary { group, node } => {
                let place = self.place_of_mut(*group).expect("checked");
                place.preferred = *node;
            }
        }
        Ok(Applied::Done)
    }

    /// The moves removing node `node` starts, in catalog order: each partition whose voters
    /// (its move's target, if it is moving) include the node gets a target with the node
    /// replaced by `replacement` or the active node holding the fewest replicas. Refused when
    /// a partition has no node to go to (too few other active nodes for its replicas) or was
    /// placed on every node before replication factors (it has no voters of its own to move).
    fn replacements(
        &self,
        node: u8,
        replacement: Option<u8>,
        founders: u8,
    ) -> Result<Vec<(u64, u32)>, String> {
        let active = self.nodes.active(founders) & !(1 << node);
        let mut load = self.replica_load();
        let mut moves = Vec::new();
        for place in self.places() {
            if place.members.is_empty() {
                return Err(format!(
                    "partition group {} was placed on every node before replication factors: \
                     it cannot move off node {node}",
                    place.group
                ));
            }
            let voters = place.destined().voters;
            if voters & (1 << node) == 0 {
                continue;
            }
            let staying = voters & !(1 << node);
            let Some(to) = replacement_for(staying, active, &load, replacement) else {
                return Err(format!(
                    "partition group {} has {} replicas and no other active node can take \
                     node {node}'s",
                    place.group,
                    voters.count_ones()
                ));
            };
            load[usize::from(to)] += 1;
            moves.push((place.group, staying | (1 << to)));
        }
        Ok(moves)
    }

    /// Where the next partitions of a cluster of `nodes` nodes go (see [`Placement::place`]):
    /// the groups each shard holds, and per (node, shard) pair the live groups whose home the
    /// node is (the metadata group's among them).
    fn placement(&self, founders: u8) -> Placement {
        let known = self.nodes.known(founders);
        let count = (32 - known.leading_zeros()) as u8;
        let nodes = usize::from(count);
        let mut homes = vec![0; nodes * self.shards as usize];
        let mut count_home = |place: &PartitionPlace| {
            let node = usize::from(place.home(founders));
            // A home past the node count (a cluster that shrank) leads nothing here.
            if node < nodes {
                homes[place.shard as usize * nodes + node] += 1;
            }
        };
        let metadata = PartitionPlace {
            group: METADATA_GROUP,
            shard: 0,
            members: GroupMembers::default(),
            target: GroupMembers::default(),
            preferred: None,
        };
        count_home(&metadata);
        for stream in self.streams.values() {
            for topic in stream.topics.values() {
                topic.partitions.iter().for_each(&mut count_home);
            }
        }
        Placement {
            nodes: count,
            spread: self.nodes.active(founders).count_ones() > 1,
            groups_per_shard: self.groups_per_shard.clone(),
            groups_per_shard_max: self.groups_per_shard_max,
            homes,
        }
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
    /// generation and give the member that partition. A generation newer than this node has
    /// applied is answered `TransientNotAccepted` (retry: the node's catalog catches up).
    pub fn check_member(
        &self,
        stream: &str,
        topic: &str,
        group: &str,
        membership: &Membership,
        partition: u32,
    ) -> Result<(), (ErrorCode, String)> {
        let entry = self.topic(stream, topic)?;
        // A node applies the metadata log a commit interval or so after the metadata primary
        // answered the join: a generation newer than this node's is one it has yet to apply,
        // not one the member should drop.
        let applied = entry.consumer_groups.get(group).map_or(0, |g| g.generation);
        if membership.generation > applied {
            return Err((
                ErrorCode::TransientNotAccepted,
                format!(
                    "this node has applied group {group} up to generation {applied}, not {} \
                     yet: retry",
                    membership.generation
                ),
            ));
        }
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

    /// Every partition placed on `shard` that node `node` holds, with its topic's settings.
    pub fn groups_on(&self, shard: u32, node: u8) -> Vec<(PartitionPlace, &TopicSettings)> {
        let mut groups = Vec::new();
        for stream in self.streams.values() {
            for topic in stream.topics.values() {
                let here = topic.partitions.iter().filter(|p| p.shard == shard);
                for place in here.filter(|p| p.is_held_by(node)) {
                    groups.push((*place, &topic.settings));
                }
            }
        }
        groups
    }

    /// Every partition's place, of every topic.
    pub fn places(&self) -> impl Iterator<Item = &PartitionPlace> {
        self.streams
            .values()
            .flat_map(|stream| stream.topics.values())
            .flat_map(|topic| topic.partitions.iter())
    }

    /// Replicas per node, counting each partition where it is going (see
    /// [`PartitionPlace::destined`]).
    pub fn replica_load(&self) -> [u32; 32] {
        let mut load = [0u32; 32];
        for place in self.places() {
            for node in place.destined().member_indices() {
                load[usize::from(node)] += 1;
            }
        }
        load
    }

    /// The active nodes' count on `cluster` (its founding nodes, the added ones, less the
    /// leaving ones): what bounds a new topic's replication factor.
    pub fn active_node_count(&self, cluster: &ClusterConfig) -> u8 {
        self.nodes.active(cluster.founders()).count_ones() as u8
    }
    /// Takes a deleted topic's partition groups out of the per-shard placement count: every
    /// node holding them deletes them (`shard/deletion.rs`).
    fn free_groups(&mut self, topic: &Topic) {
        for place in &topic.partitions {
            let count = &mut self.groups_per_shard[place.shard as usize];
            *count = count.saturating_sub(1);
        }
    }

    /// The place of partition group `group` (a linear search: for the rare request that
    /// reaches a node not holding its group).
    pub fn place_of(&self, group: u64) -> Option<PartitionPlace> {
        self.places().find(|place| place.group == group).copied()
    }

    fn place_of_mut(&mut self, group: u64) -> Option<&mut PartitionPlace> {
        self.streams
            .values_mut()
            .flat_map(|stream| stream.topics.values_mut())
            .flat_map(|topic| topic.partitions.iter_mut())
            .find(|place| place.group == group)
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

    /// `topic`'s partitions in order, with zeroed offsets (the owning shards fill them in).
    pub fn topic_partition_infos(topic: &Topic) -> impl Iterator<Item = PartitionInfo> + '_ {
        topic.partitions.iter().enumerate().map(|(index, place)| PartitionInfo {
            partition: index as u32,
            shard: place.shard,
            group: place.group,
            first_offset: 0,
            next_offset: 0,
            size_bytes: 0,
        })
    }

    /// Every partition of every topic, in name order, with zeroed offsets (the owning shards fill
    /// them in).
    pub fn partition_infos(&self) -> Vec<(String, String, PartitionInfo)> {
        let mut all = Vec::new();
        for (stream_name, stream) in &self.streams {
            for (topic_name, topic) in &stream.topics {
                for info in Catalog::topic_partition_infos(topic) {
                    all.push((stream_name.clone(), topic_name.clone(), info));
                }
            }
        }
        all
    }
}

/// The largest reply the client table keeps per session: a metadata reply is a session id, an
/// empty success or an error's text, which [`MetaReply::bounded`] cuts to fit.
pub const META_REPLY_BYTES_MAX: usize = 1024;

/// Snapshot format version (`docs/storage-format.md`, "Metadata snapshot"): 2 adds each
/// topic's `replica_lag_time_max_ms` after its settings; 3 the stored Kafka groups after the
/// client table; 4 each topic's replication factor after its lag bound and each partition's
/// members after its shard; 5 the node book (added and leaving nodes) at the end. Versions 1
/// to 4 are still read (as 0, as no Kafka group, as every node, and as no node added).
const SNAPSHOT_VERSION: u16 = 6;

/// The answer to one metadata request, as its client gets it and the client table keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaReply {
    /// `0` or an [`ErrorCode`].
    pub error: u32,
    /// The result, or the error's text.
    pub body: Vec<u8>,
}

impl MetaReply {
    /// A success.
    pub fn ok(body: Vec<u8>) -> MetaReply {
        MetaReply { error: 0, body }
    }

    /// An error, its text cut (at a character boundary) so the encoded reply fits the client
    /// table's bound: replicas cut identically, so their tables agree.
    pub fn error(code: ErrorCode, text: &str) -> MetaReply {
        let mut end = text.len().min(META_REPLY_BYTES_MAX - 4);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        MetaReply { error: code as u32, body: text.as_bytes()[..end].to_vec() }
    }

    /// The bytes the client table keeps: `error u32` (little-endian), then the body.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.body.len());
        out.extend_from_slice(&self.error.to_le_bytes());
        out.extend_from_slice(&self.body);
        out
    }

    /// A reply the client table kept (`None`: fewer than 4 bytes, which `encode` never writes).
    pub fn decode(bytes: &[u8]) -> Option<MetaReply> {
        let error = u32::from_le_bytes(bytes.get(..4)?.try_into().ok()?);
        Some(MetaReply { error, body: bytes[4..].to_vec() })
    }
}

/// The metadata state machine's whole state: the catalog every shard reads, and the client
/// table only shard 0 consults (kept apart so publishing a catalog never copies the table).
///
/// A request from a registered session (`session != 0`) goes through the client table: checked
/// before it is proposed ([`MetaState::admit`]: a duplicate is answered at once) and again when
/// it commits ([`MetaState::apply`]: the log may hold a retry twice; the second copy executes
/// nothing and answers with the first one's reply). Requests of session 0 (a client that never
/// registered, and the coordinator's own rebalances) are executed as they come.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaState {
    /// What exists.
    pub catalog: Catalog,
    /// Per session, its newest admin request and that request's reply.
    pub clients: ClientTable,
    /// The Kafka groups stored (`MetaCommand::StoreKafkaGroup`), by id: only the coordinator
    /// reads them, so they are not in the catalog every shard is handed.
    pub kafka_groups: BTreeMap<String, StoredGroup>,
}

impl MetaState {
    /// An empty state (see [`Catalog::new`]) whose client table keeps `sessions_max` sessions.
    pub fn new(shards: u32, groups_per_shard_max: u32, sessions_max: usize) -> MetaState {
        MetaState {
            catalog: Catalog::new(shards, groups_per_shard_max),
            clients: ClientTable::new(client_limits(sessions_max)),
            kafka_groups: BTreeMap::new(),
        }
    }

    /// Keeps a Kafka group's stored state: a group with no members is gone; a new one beyond
    /// the coordinator's bound on groups is not kept (it never hands out more).
    fn store_kafka_group(&mut self, stored: &StoredGroup) {
        if stored.members.is_empty() {
            self.kafka_groups.remove(&stored.group);
        } else if self.kafka_groups.len() < KAFKA_GROUPS_MAX
            || self.kafka_groups.contains_key(&stored.group)
        {
            self.kafka_groups.insert(stored.group.clone(), stored.clone());
        }
    }

    /// Whether a request may be proposed: `Err` is its answer without entering the log (the
    /// original reply of a duplicate, or a refusal).
    pub fn admit(
        &self,
        session: u64,
        request: u64,
        command: &MetaCommand,
    ) -> Result<(), MetaReply> {
        if session != 0 {
            self.client_check(session, request)?;
        }
        self.catalog.check(command).map_err(|(code, text)| MetaReply::error(code, &text))
    }

    /// Applies the committed op `op` (appended at `append_time_ms`, proposed for `session`'s
    /// request `request`) carrying `command` (`None`: the op's body is not a command) and
    /// returns the reply its client gets. Deterministic: the same log gives the same state and
    /// replies on every replica and on every replay.
    pub fn apply(
        &mut self,
        op: u64,
        append_time_ms: i64,
        session: u64,
        request: u64,
        command: Option<&MetaCommand>,
    ) -> MetaReply {
        let Some(command) = command else {
            // A committed op that is not a command cannot come from this server; skipping it
            // keeps the op sequence, refusing would stop metadata for good.
            self.catalog.skip(op);
            return MetaReply::error(
                ErrorCode::InvalidRequest,
                &format!("metadata op {op} is not a command"),
            );
        };
        if session != 0
            && let Err(answer) = self.client_check(session, request)
        {
            self.catalog.skip(op);
            return answer;
        }
        if let MetaCommand::StoreKafkaGroup(stored) = command {
            self.store_kafka_group(stored);
        }
        let reply = match self.catalog.apply(op, append_time_ms, command) {
            Ok(Applied::Session(id)) => {
                self.clients.register(id, op);
                MetaReply::ok(shoal_proto::protocol::encode_session(id))
            }
            Ok(Applied::Done) => MetaReply::ok(Vec::new()),
            Ok(Applied::Node(node)) => MetaReply::ok(vec![node]),
            Err((code, text)) => MetaReply::error(code, &text),
        };
        if session != 0 {
            // Checked new just above, and `MetaReply` keeps within the bound: this cannot fail.
            let recorded = self.clients.apply(session, request, op, &reply.encode());
            debug_assert!(recorded.is_ok(), "{recorded:?}");
        }
        reply
    }

    /// The client table's verdict as an answer: `Ok` for a new request.
    fn client_check(&self, session: u64, request: u64) -> Result<(), MetaReply> {
        match self.clients.check(session, request) {
            ClientCheck::New => Ok(()),
            ClientCheck::Duplicate(kept) => Err(MetaReply::decode(kept).unwrap_or_else(|| {
                MetaReply::error(ErrorCode::InvalidRequest, "the kept reply is unreadable")
            })),
            ClientCheck::Stale { newest } => Err(MetaReply::error(
                ErrorCode::InvalidRequest,
                &format!(
                    "request {request} of session {session} is older than its newest admin \
                     request {newest}; its reply is no longer kept"
                ),
            )),
            ClientCheck::UnknownSession => Err(MetaReply::error(
                ErrorCode::SessionExpired,
                &format!("session {session} is unknown or expired: register again"),
            )),
        }
    }

    /// The snapshot bytes (`docs/storage-format.md`, "Metadata snapshot").
    pub fn encode_snapshot(&self) -> Vec<u8> {
        self.encode_snapshot_as(SNAPSHOT_VERSION)
    }

    /// The snapshot bytes in the layout of `version` (4 to the current one; tests write the
    /// older layouts to check they are still read). What an older layout cannot hold is left
    /// out: the node book before 5, the preferred primaries before 6.
    fn encode_snapshot_as(&self, version: u16) -> Vec<u8> {
        assert!((4..=SNAPSHOT_VERSION).contains(&version), "snapshot version {version}");
        let c = &self.catalog;
        let mut w = Writer::new();
        w.u16(version).u64(c.applied_op).u32(c.shards).u64(c.next_group);
        w.u32(c.groups_per_shard.len() as u32);
        for count in &c.groups_per_shard {
            w.u32(*count);
        }
        w.u32(c.streams.len() as u32);
        for (name, stream) in &c.streams {
            w.str(name).i64(stream.created_ms).u32(stream.topics.len() as u32);
            for (name, topic) in &stream.topics {
                w.str(name).i64(topic.created_ms);
                encode_settings(&mut w, &topic.settings);
                w.u64(topic.settings.replica_lag_time_max_ms).u8(topic.settings.replication_factor);
                w.u32(topic.partitions.len() as u32);
                for place in &topic.partitions {
                    w.u64(place.group).u32(place.shard).u64(place.members.to_word());
                    w.u64(place.target.to_word());
                    if version >= 6 {
                        w.u8(place.preferred.unwrap_or(u8::MAX));
                    }
                }
                w.u32(topic.consumer_groups.len() as u32);
                for (name, group) in &topic.consumer_groups {
                    w.str(name).u64(group.generation).u32(group.members.len() as u32);
                    for member in &group.members {
                        w.str(&member.member).u32(member.session_timeout_ms);
                        w.u32(member.partitions.len() as u32);
                        for partition in &member.partitions {
                            w.u32(*partition);
                        }
                    }
                }
            }
        }
        w.bytes(&self.clients.encode());
        w.u32(self.kafka_groups.len() as u32);
        for group in self.kafka_groups.values() {
            group.write(&mut w);
        }
        if version >= 5 {
            c.nodes.write(&mut w);
        }
        w.finish()
    }

    /// A state from snapshot bytes, for a node of `shards` shards of `groups_per_shard_max`
    /// groups keeping `sessions_max` sessions. Hostile-input safe: every count is bounded by the bytes present before
    /// anything is allocated, every name by the name rule, and every partition's shard by
    /// `shards`.
    pub fn decode_snapshot(
        bytes: &[u8],
        shards: u32,
        groups_per_shard_max: u32,
        sessions_max: usize,
    ) -> Result<MetaState, ProtocolError> {
        let invalid = |field, reason: String| ProtocolError::Invalid { field, reason };
        let mut r = Reader::new(bytes);
        let version = r.u16("version")?;
        if !(1..=SNAPSHOT_VERSION).contains(&version) {
            return Err(invalid("version", format!("{version}, this build reads 1 to 5")));
        }
        let applied_op = r.u64("applied_op")?;
        let snapshot_shards = r.u32("shards")?;
        if snapshot_shards != shards {
            return Err(invalid("shards", format!("{snapshot_shards}, the node has {shards}")));
        }
        let next_group = r.u64("next_group")?;
        let count = r.count("groups_per_shard", 4)?;
        if count != shards as usize {
            return Err(invalid("groups_per_shard", format!("{count} counts for {shards} shards")));
        }
        let groups_per_shard = (0..count).map(|_| r.u32("groups")).collect::<Result<_, _>>()?;
        let mut streams = BTreeMap::new();
        // The smallest stream: an empty name, created_ms and a topic count.
        for _ in 0..r.count("streams", 2 + 8 + 4)? {
            let name = r.name("stream")?;
            let created_ms = r.i64("created_ms")?;
            let mut topics = BTreeMap::new();
            // The smallest topic: name, created_ms, settings and two counts.
            for _ in 0..r.count("topics", 2 + 8 + SETTINGS_SIZE + 4 + 4)? {
                let topic_name = r.name("topic")?;
                let topic_created_ms = r.i64("created_ms")?;
                let mut settings = decode_settings(&mut r)?;
                if version >= 2 {
                    settings.replica_lag_time_max_ms = r.u64("replica_lag_time_max_ms")?;
                }
                let with_members = version >= 4;
                if with_members {
                    settings.replication_factor = r.u8("replication_factor")?;
                }
                let with_preferred = version >= 6;
                let place_size = match (with_members, with_preferred) {
                    (true, true) => 8 + 4 + 8 + 8 + 1,
                    (true, false) => 8 + 4 + 8 + 8,
                    _ => 8 + 4,
                };
                let partitions = (0..r.count("partitions", place_size)?)
                    .map(|_| {
                        let group = r.u64("group")?;
                        let shard = r.u32("shard")?;
                        if shard >= shards {
                            return Err(invalid("shard", format!("{shard} of {shards}")));
                        }
                        let (members, target) = if with_members {
                            let members = GroupMembers::from_word(r.u64("members")?);
                            (members, GroupMembers::from_word(r.u64("target")?))
                        } else {
                            (GroupMembers::default(), GroupMembers::default())
                        };
                        for set in [members, target] {
                            if set.voters & set.learners != 0 {
                                return Err(invalid("members", format!("{set:?} overlap")));
                            }
                        }
                        let preferred = if with_preferred { r.u8("preferred")? } else { u8::MAX };
                        let preferred = (preferred != u8::MAX).then_some(preferred);
                        Ok(PartitionPlace { group, shard, members, target, preferred })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let mut consumer_groups = BTreeMap::new();
                for _ in 0..r.count("consumer_groups", 2 + 8 + 4)? {
                    let group_name = r.name("group")?;
                    let generation = r.u64("generation")?;
                    let members = (0..r.count("members", 2 + 4 + 4)?)
                        .map(|_| {
                            let member = r.name("member")?;
                            let session_timeout_ms = r.u32("session_timeout_ms")?;
                            let partitions = (0..r.count("partitions", 4)?)
                                .map(|_| r.u32("partition"))
                                .collect::<Result<_, _>>()?;
                            Ok(GroupMemberAssignment { member, session_timeout_ms, partitions })
                        })
                        .collect::<Result<Vec<_>, ProtocolError>>()?;
                    consumer_groups.insert(group_name, ConsumerGroup { generation, members });
                }
                let topic =
                    Topic { settings, partitions, created_ms: topic_created_ms, consumer_groups };
                topics.insert(topic_name, topic);
            }
            streams.insert(name, Stream { topics, created_ms });
        }
        let clients = r.bytes("clients", bytes.len())?;
        let clients = ClientTable::decode(clients, client_limits(sessions_max))
            .map_err(|e| invalid("clients", e.0))?;
        let mut kafka_groups = BTreeMap::new();
        if version >= 3 {
            // The smallest stored group: an id, a generation, three strings, a member count.
            for _ in 0..r.count("kafka groups", 2 + 4 + 2 + 2 + 2 + 4)? {
                let group = StoredGroup::read(&mut r)?;
                kafka_groups.insert(group.group.clone(), group);
            }
        }
        let nodes = if version >= 5 { NodeBook::read(&mut r)? } else { NodeBook::default() };
        r.end()?;
        let catalog = Catalog {
            applied_op,
            shards,
            streams,
            next_group,
            groups_per_shard,
            // The node's bound now, as a full replay would use.
            groups_per_shard_max,
            nodes,
        };
        Ok(MetaState { catalog, clients, kafka_groups })
    }
}

/// The client table's bounds on a node keeping `sessions_max` sessions.
fn client_limits(sessions_max: usize) -> ClientLimits {
    ClientLimits { sessions_max, reply_bytes_max: META_REPLY_BYTES_MAX }
}

/// Encoded topic settings: partitions, durability, retention bytes and ms, segment size,
/// message size.
const SETTINGS_SIZE: usize = 4 + 1 + 8 + 8 + 8 + 8;

fn encode_settings(w: &mut Writer, settings: &TopicSettings) {
    let durability = match settings.durability {
        Durability::Replicated => 1,
        Durability::Persisted => 2,
    };
    w.u32(settings.partitions).u8(durability).u64(settings.retention_bytes);
    w.u64(settings.retention_ms).u64(settings.segment_size_bytes);
    w.u64(settings.message_size_bytes_max);
}

fn decode_settings(r: &mut Reader<'_>) -> Result<TopicSettings, ProtocolError> {
    let partitions = r.u32("partitions")?;
    let durability = match r.u8("durability")? {
        1 => Durability::Replicated,
        2 => Durability::Persisted,
        other => {
            return Err(ProtocolError::Invalid { field: "durability", reason: format!("{other}") });
        }
    };
    Ok(TopicSettings {
        partitions,
        durability,
        retention_bytes: r.u64("retention_bytes")?,
        retention_ms: r.u64("retention_ms")?,
        segment_size_bytes: r.u64("segment_size_bytes")?,
        message_size_bytes_max: r.u64("message_size_bytes_max")?,
        replica_lag_time_max_ms: 0,
        replication_factor: 0,
    })
}

/// Whether `action` applies to a partition placed as `place` on a cluster whose `active` nodes
/// (a bit per index) may receive replicas.
fn check_move(place: &PartitionPlace, action: MoveAction, active: u32) -> Result<(), String> {
    if place.members.is_empty() {
        return Err("the partition was placed on every node before replication factors: it \
                    has nowhere to move"
            .into());
    }
    let moving = !place.target.is_empty();
    match action {
        MoveAction::Start { voters } => {
            if moving {
                return Err("a move of the partition is in progress: cancel it first".into());
            }
            // A node the partition holds already may stay although it is leaving.
            let outside = voters & !(active | place.members.voters);
            if outside != 0 {
                let nodes: Vec<u32> = (0..32).filter(|n| outside & (1 << n) != 0).collect();
                return Err(format!("nodes {nodes:?} are not active nodes of the cluster"));
            }
            let count = place.members.voter_count();
            if voters.count_ones() != count {
                return Err(format!(
                    "the partition has {count} replicas: name {count} nodes, not {}",
                    voters.count_ones()
                ));
            }
            if voters == place.members.voters {
                return Err("the partition is on those nodes already".into());
            }
            Ok(())
        }
        MoveAction::Cancel if moving => Ok(()),
        MoveAction::Cancel => Err("no move of the partition is in progress".into()),
        MoveAction::Done { voters } if moving && voters == place.target.voters => Ok(()),
        MoveAction::Done { .. } => Err("not the move in progress (it ended or changed)".into()),
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

    /// The newest catalog (for the rare answer that needs it outside a shard's loop, such as a
    /// node's address).
    pub fn latest(&self) -> Arc<Catalog> {
        Arc::clone(&self.catalog.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Refreshes `cached` if a newer catalog was published.
    pub fn refresh(&self, cached: &mut Arc<Catalog>) {
        if self.version.load(std::sync::atomic::Ordering::Acquire) != cached.applied_op {
            *cached = Arc::clone(&self.catalog.lock().unwrap_or_else(|e| e.into_inner()));
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Test settings: `persisted`, 8 MiB segments, every node holding each partition.
    pub(crate) fn settings(partitions: u32) -> TopicSettings {
        TopicSettings {
            partitions,
            durability: Durability::Persisted,
            retention_bytes: 0,
            retention_ms: 0,
            segment_size_bytes: 8 << 20,
            message_size_bytes_max: 1 << 16,
            replica_lag_time_max_ms: 0,
            replication_factor: 0,
        }
    }

    /// Creating topic `topic` of stream "s" with `partitions` partitions, placed for `nodes`.
    fn create_topic(topic: &str, partitions: u32, nodes: u8) -> MetaCommand {
        MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: topic.into(),
            settings: settings(partitions),
            nodes,
        }
    }

    /// Generation 1 of group "g" of s/t: member "m" alone, assigned `partitions`.
    fn rebalance_to_m(partitions: Vec<u32>) -> MetaCommand {
        MetaCommand::Rebalance {
            stream: "s".into(),
            topic: "t".into(),
            group: "g".into(),
            generation: 1,
            members: vec![GroupMemberAssignment {
                member: "m".into(),
                session_timeout_ms: 1_000,
                partitions,
            }],
        }
    }

    /// The catalog's bounds, each at its bound: the 4,096th stream, the 4,096th topic of a
    /// stream and the 1,024th consumer group of a topic are taken, one more of each is refused
    /// with `LimitReached`.
    #[test]
    fn the_catalog_takes_streams_topics_and_groups_up_to_their_bounds() {
        let refused = |catalog: &Catalog, command: &MetaCommand| {
            let (code, _) = catalog.check(command).unwrap_err();
            assert_eq!(code, ErrorCode::LimitReached);
        };
        let mut catalog = Catalog::new(1, 100_000);
        let mut op = 0;
        for index in 0..STREAMS_MAX {
            op += 1;
            let create = MetaCommand::CreateStream { name: format!("s{index}") };
            catalog.apply(op, 0, &create).unwrap();
        }
        refused(&catalog, &MetaCommand::CreateStream { name: "one-more".into() });

        let mut catalog = Catalog::new(1, 100_000);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let mut op = 1;
        for index in 0..TOPICS_PER_STREAM_MAX {
            op += 1;
            catalog.apply(op, 0, &create_topic(&format!("t{index}"), 1, 1)).unwrap();
        }
        refused(&catalog, &create_topic("one-more", 1, 1));

        let mut catalog = Catalog::new(1, 100_000);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        catalog.apply(2, 0, &create_topic("t", 1, 1)).unwrap();
        let rebalance = |group: String| MetaCommand::Rebalance {
            stream: "s".into(),
            topic: "t".into(),
            group,
            generation: 1,
            members: Vec::new(),
        };
        let mut op = 2;
        for index in 0..CONSUMER_GROUPS_PER_TOPIC_MAX {
            op += 1;
            catalog.apply(op, 0, &rebalance(format!("g{index}"))).unwrap();
        }
        refused(&catalog, &rebalance("one-more".into()));
    }

    /// Per (node, shard) pair, the live groups whose view-0 primary the node is.
    fn homes_per_pair(catalog: &Catalog, nodes: u8) -> Vec<u32> {
        let placement = catalog.placement(nodes);
        placement.homes
    }

    /// DESIGN.md §8 ("every (node, shard) pair leads about as many groups as every other in
    /// view 0"): for 1, 3 and 5 nodes and 1, 2, 3, 4 and 8 shards, topics of mixed partition
    /// counts (the metadata group among the groups) leave every pair leading within one of every
    /// other after each topic, and the shards holding within one group of each other.
    #[test]
    fn metadata_placement_spreads_view_zero_primaries_over_nodes_and_shards() {
        let partition_counts = [1, 3, 7, 2, 16, 5, 1, 12, 4, 9, 6, 1, 2, 33, 8];
        for nodes in [1u8, 3, 5] {
            for shards in [1u32, 2, 3, 4, 8] {
                let mut catalog = Catalog::new(shards, 10_000);
                catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
                for (index, &partitions) in partition_counts.iter().enumerate() {
                    let create = create_topic(&format!("t{index}"), partitions, nodes);
                    catalog.apply(index as u64 + 2, 0, &create).unwrap();
                    let homes = homes_per_pair(&catalog, nodes);
                    let (low, high) = (homes.iter().min().unwrap(), homes.iter().max().unwrap());
                    assert!(
                        high - low <= 1,
                        "{nodes} nodes, {shards} shards, topic {index}: {homes:?}"
                    );
                    let held = &catalog.groups_per_shard;
                    let (low, high) = (held.iter().min().unwrap(), held.iter().max().unwrap());
                    assert!(
                        high - low <= 1,
                        "{nodes} nodes, {shards} shards, topic {index}: {held:?}"
                    );
                }
                // Every group's home and shard as the catalog records them: the pairs' counts
                // come from the recorded places, not from the placement's own bookkeeping.
                let mut recorded = vec![0u32; usize::from(nodes) * shards as usize];
                recorded[0] += 1;
                for place in catalog.streams["s"].topics.values().flat_map(|t| &t.partitions) {
                    let node = (place.group % u64::from(nodes)) as usize;
                    recorded[place.shard as usize * usize::from(nodes) + node] += 1;
                }
                assert_eq!(recorded, homes_per_pair(&catalog, nodes));
            }
        }
    }

    /// A single node places exactly as before clusters (the fewest groups held, deleted
    /// topics' groups included, the lowest index among equals), so an old log replays to the
    /// same places; and a snapshot keeps the places it recorded whatever the node count.
    #[test]
    fn metadata_placement_of_one_node_is_the_old_rule_and_snapshots_keep_places() {
        let mut catalog = Catalog::new(3, 100);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let create = |topic: &str, partitions| create_topic(topic, partitions, 1);
        catalog.apply(2, 0, &create("a", 4)).unwrap();
        // A deletion recorded before nodes deleted groups: topic a's groups stay counted.
        let old_delete =
            MetaCommand::DeleteTopic { stream: "s".into(), topic: "a".into(), frees_groups: false };
        catalog.apply(3, 0, &old_delete).unwrap();
        catalog.apply(4, 0, &create("b", 4)).unwrap();
        let shards: Vec<u32> =
            catalog.topic("s", "b").unwrap().partitions.iter().map(|p| p.shard).collect();
        // Held before: [1 + 1, 2, 1] (the metadata group on shard 0, topic a's groups kept).
        assert_eq!(shards, [2, 0, 1, 2]);
        let mut state = MetaState::new(3, 100, 8);
        state.catalog = catalog.clone();
        let bytes = state.encode_snapshot();
        let restored = MetaState::decode_snapshot(&bytes, 3, 100, 8).unwrap();
        assert_eq!(restored.catalog, catalog);
    }

    /// A node whose catalog is behind the metadata primary's says so (retry) instead of
    /// telling a member that just joined to join again.
    #[test]
    fn a_generation_this_node_has_not_applied_yet_is_retried_not_refused() {
        let mut catalog = Catalog::new(1, 100);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let create = create_topic("t", 1, 1);
        catalog.apply(2, 0, &create).unwrap();
        let member = |generation| Membership { member: "m".into(), generation };
        let code = |catalog: &Catalog, generation| {
            catalog.check_member("s", "t", "g", &member(generation), 0).err().map(|e| e.0)
        };
        assert_eq!(code(&catalog, 1), Some(ErrorCode::TransientNotAccepted));
        assert_eq!(code(&catalog, 0), Some(ErrorCode::UnknownMember));
        catalog.apply(3, 0, &rebalance_to_m(vec![0])).unwrap();
        assert_eq!(code(&catalog, 1), None);
        assert_eq!(code(&catalog, 2), Some(ErrorCode::TransientNotAccepted));
        assert_eq!(code(&catalog, 0), Some(ErrorCode::StaleGeneration));
    }

    #[test]
    fn metadata_commands_round_trip() {
        let commands = [
            MetaCommand::RegisterSession,
            MetaCommand::CreateStream { name: "s".into() },
            MetaCommand::DeleteStream { name: "s".into(), frees_groups: false },
            MetaCommand::DeleteStream { name: "s".into(), frees_groups: true },
            create_topic("t", 3, 3),
            MetaCommand::DeleteTopic { stream: "s".into(), topic: "t".into(), frees_groups: false },
            delete_topic("t"),
            add_partitions(5),
            MetaCommand::StoreKafkaGroup(kafka_group("g", 3)),
            MetaCommand::StoreKafkaGroup(kafka_group("g", 0)),
        ];
        for command in commands {
            assert_eq!(MetaCommand::decode(&command.encode()), Ok(command));
        }
        assert!(MetaCommand::decode(&[9]).is_err());
        assert!(MetaCommand::decode(&[]).is_err());
    }

    fn add_partitions(partitions: u32) -> MetaCommand {
        MetaCommand::AddPartitions { stream: "s".into(), topic: "t".into(), partitions, nodes: 1 }
    }

    /// A topic grows: its partitions keep their groups, new ones get new groups on the shards
    /// with room; a count that does not grow is refused, and so is one past the shards' room.
    #[test]
    fn add_partitions_grows_a_topic_with_new_groups() {
        let mut catalog = Catalog::new(2, 6);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        catalog.apply(2, 0, &create_topic("t", 2, 1)).unwrap();
        let before = catalog.topic("s", "t").unwrap().partitions.clone();
        catalog.apply(3, 0, &add_partitions(5)).unwrap();
        let topic = catalog.topic("s", "t").unwrap();
        assert_eq!((topic.partitions.len(), topic.settings.partitions), (5, 5));
        assert_eq!(topic.partitions[..2], before[..]);
        let groups: Vec<u64> = topic.partitions.iter().map(|p| p.group).collect();
        assert_eq!(groups, [1, 2, 3, 4, 5]);
        // Five partition groups and the metadata group.
        assert_eq!(catalog.groups_per_shard.iter().sum::<u32>(), 6);
        assert_eq!(
            catalog.apply(4, 0, &add_partitions(5)).unwrap_err().0,
            ErrorCode::InvalidArgument
        );
        let full = catalog.apply(5, 0, &add_partitions(50)).unwrap_err();
        assert_eq!(full.0, ErrorCode::LimitReached, "{full:?}");
    }

    /// Placement is in the log: a topic created in a cluster names the node count it was
    /// placed for, a record written before clusters (no count) is a one-node cluster's, and a
    /// count no cluster can have is refused.
    #[test]
    fn create_topic_records_carry_the_node_count_their_placement_used() {
        let create = |nodes| create_topic("t", 2, nodes);
        let bytes = create(3).encode();
        // The node count, then the topic's lag bound (u64) and replication factor (u8).
        let nodes_at = bytes.len() - 10;
        let before_clusters = &bytes[..nodes_at];
        assert_eq!(MetaCommand::decode(before_clusters), Ok(create(1)));
        for refused in [0, NODES_MAX as u8 + 1] {
            let mut bytes = bytes.clone();
            bytes[nodes_at] = refused;
            assert!(MetaCommand::decode(&bytes).is_err(), "{refused} nodes");
        }
        // The same log applies to the same places whatever the applying node's configuration.
        let apply = || {
            let mut catalog = Catalog::new(2, 100);
            catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
            catalog.apply(2, 0, &MetaCommand::decode(&bytes).unwrap()).unwrap();
            catalog
        };
        assert_eq!(apply(), apply());
        let places = |nodes| {
            let mut catalog = Catalog::new(3, 100);
            catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
            let create = create_topic("t", 3, nodes);
            catalog.apply(2, 0, &create).unwrap();
            let partitions = &catalog.topic("s", "t").unwrap().partitions;
            partitions.iter().map(|p| p.shard).collect::<Vec<_>>()
        };
        // One node: the fewest groups held (shard 0 holds the metadata group). Three: group 3's
        // home is node 0, which leads the metadata group on shard 0, so it goes elsewhere.
        assert_eq!(places(1), [1, 2, 0]);
        assert_eq!(places(3), [1, 2, 1]);
    }

    #[test]
    fn metadata_apply_places_partitions_over_shards_deterministically() {
        let mut a = Catalog::new(2, 4);
        let create_stream = MetaCommand::CreateStream { name: "s".into() };
        assert_eq!(a.apply(1, 10, &create_stream), Ok(Applied::Done));
        let create = create_topic("t", 3, 1);
        assert_eq!(a.apply(2, 11, &create), Ok(Applied::Done));
        let topic = a.topic("s", "t").unwrap();
        // Shard 0 holds the metadata group, so the first partition goes to shard 1.
        let shards: Vec<u32> = topic.partitions.iter().map(|p| p.shard).collect();
        assert_eq!(shards, [1, 0, 1]);
        let groups: Vec<u64> = topic.partitions.iter().map(|p| p.group).collect();
        assert_eq!(groups, [1, 2, 3]);
        assert_eq!(a.groups_on(1, 0).len(), 2);

        // Replaying the same log gives the same catalog.
        let mut b = Catalog::new(2, 4);
        b.apply(1, 10, &create_stream).unwrap();
        b.apply(2, 11, &create).unwrap();
        assert_eq!(a, b);

        assert_eq!(a.apply(3, 12, &create).unwrap_err().0, ErrorCode::TopicExists);
        assert_eq!(a.apply(4, 13, &MetaCommand::RegisterSession), Ok(Applied::Session(4)));
        let unknown =
            MetaCommand::DeleteTopic { stream: "x".into(), topic: "t".into(), frees_groups: true };
        assert_eq!(a.apply(5, 14, &unknown).unwrap_err().0, ErrorCode::StreamNotFound);
        assert_eq!(a.applied_op, 5);
    }

    /// A log of (session, request, command) as the shard proposes them.
    fn sample_log() -> Vec<(u64, u64, MetaCommand)> {
        let create = create_topic("t", 2, 1);
        vec![
            (0, 1, MetaCommand::RegisterSession),
            (1, 5, MetaCommand::CreateStream { name: "s".into() }),
            (1, 6, create.clone()),
            // The retry of request 6 entered the log too (say, after a view change).
            (1, 6, create.clone()),
            (0, 1, MetaCommand::RegisterSession),
            (0, 2, rebalance_to_m(vec![0, 1])),
            (5, 1, MetaCommand::CreateStream { name: "other".into() }),
            // A new request number re-executes, and is refused.
            (1, 7, create),
            (0, 3, MetaCommand::StoreKafkaGroup(kafka_group("billing", 2))),
            (0, 4, MetaCommand::StoreKafkaGroup(kafka_group("audit", 1))),
            // The end of a group: it is no longer kept.
            (0, 5, MetaCommand::StoreKafkaGroup(kafka_group("audit", 0))),
        ]
    }

    /// A stored Kafka group of `members` members.
    fn kafka_group(group: &str, members: usize) -> StoredGroup {
        StoredGroup {
            group: group.into(),
            generation: 4,
            protocol_type: "consumer".into(),
            protocol: "range".into(),
            leader: "m-0".into(),
            members: (0..members)
                .map(|i| crate::kafka_groups::StoredMember {
                    id: format!("m-{i}"),
                    client_id: "app".into(),
                    session_timeout_ms: 10_000,
                    rebalance_timeout_ms: 30_000,
                    metadata: bytes::Bytes::from(vec![i as u8; 3]),
                    assignment: bytes::Bytes::from(format!("share {i}")),
                })
                .collect(),
        }
    }

    /// Stored Kafka groups are kept by the metadata state (not the catalog), the end of one
    /// removes it, and a snapshot carries them.
    #[test]
    fn metadata_keeps_the_stored_kafka_groups() {
        let mut state = MetaState::new(2, 16, 8);
        apply_all(&mut state, &sample_log(), 0);
        let kept: Vec<&String> = state.kafka_groups.keys().collect();
        assert_eq!(kept, ["billing"]);
        assert_eq!(state.kafka_groups["billing"], kafka_group("billing", 2));
        let restored = MetaState::decode_snapshot(&state.encode_snapshot(), 2, 16, 8).unwrap();
        assert_eq!(restored.kafka_groups, state.kafka_groups);
    }

    fn apply_all(
        state: &mut MetaState,
        log: &[(u64, u64, MetaCommand)],
        from: usize,
    ) -> Vec<MetaReply> {
        log.iter()
            .enumerate()
            .skip(from)
            .map(|(i, (session, request, command))| {
                state.apply(i as u64 + 1, 100 + i as i64, *session, *request, Some(command))
            })
            .collect()
    }

    #[test]
    fn metadata_retried_request_gets_its_original_reply_and_executes_once() {
        let log = sample_log();
        let mut state = MetaState::new(2, 16, 8);
        let replies = apply_all(&mut state, &log, 0);
        assert_eq!(replies[0], MetaReply::ok(shoal_proto::protocol::encode_session(1)));
        assert_eq!(replies[2], MetaReply::ok(Vec::new()));
        assert_eq!(replies[3], replies[2], "the retry in the log gets the original reply");
        assert_eq!(state.catalog.next_group, 3, "the topic's 2 partitions were placed once");
        assert_eq!(replies[7].error, ErrorCode::TopicExists as u32);
        assert_eq!(replies[6], MetaReply::ok(Vec::new()), "session 5 was registered at op 5");

        // Before proposing: a duplicate is answered from the table, a newer number is checked
        // against the catalog, an older one is stale, an unknown session must register again.
        let create = &log[2].2;
        assert_eq!(state.admit(1, 7, create), Err(replies[7].clone()));
        assert_eq!(state.admit(1, 8, create).unwrap_err().error, ErrorCode::TopicExists as u32);
        assert_eq!(state.admit(1, 6, create).unwrap_err().error, ErrorCode::InvalidRequest as u32);
        let expired = state.admit(99, 1, create).unwrap_err();
        assert_eq!(expired.error, ErrorCode::SessionExpired as u32);
        // And the same at apply, for copies that reached the log anyway.
        let stale = state.apply(9, 0, 1, 6, Some(create));
        assert_eq!(stale.error, ErrorCode::InvalidRequest as u32);
        assert_eq!(state.apply(10, 0, 99, 1, Some(create)).error, ErrorCode::SessionExpired as u32);
        assert_eq!(state.apply(11, 0, 1, 9, None).error, ErrorCode::InvalidRequest as u32);
        assert_eq!(state.catalog.applied_op, 11, "skipped ops still count as applied");
    }

    #[test]
    fn metadata_sessions_beyond_the_bound_expire_least_recent_first() {
        let mut state = MetaState::new(1, 8, 2);
        for op in 1..=2 {
            state.apply(op, 0, 0, op, Some(&MetaCommand::RegisterSession));
        }
        // Session 1 acts, so session 2 is the least recently used when session 4 registers.
        let stream = MetaCommand::CreateStream { name: "s".into() };
        assert_eq!(state.apply(3, 0, 1, 1, Some(&stream)), MetaReply::ok(Vec::new()));
        state.apply(4, 0, 0, 9, Some(&MetaCommand::RegisterSession));
        let other = MetaCommand::CreateStream { name: "x".into() };
        assert_eq!(state.admit(2, 1, &other).unwrap_err().error, ErrorCode::SessionExpired as u32);
        assert_eq!(state.admit(1, 2, &other), Ok(()));
        assert_eq!(state.admit(4, 1, &other), Ok(()));
    }

    #[test]
    fn metadata_reply_text_is_cut_to_the_client_table_bound() {
        let long = "é".repeat(META_REPLY_BYTES_MAX);
        let reply = MetaReply::error(ErrorCode::InvalidName, &long);
        assert!(reply.encode().len() <= META_REPLY_BYTES_MAX);
        assert!(std::str::from_utf8(&reply.body).is_ok(), "cut at a character boundary");
        assert_eq!(MetaReply::decode(&reply.encode()), Some(reply));
        assert_eq!(MetaReply::decode(&[1, 2]), None);
    }

    #[test]
    fn metadata_snapshot_restores_what_a_full_replay_builds() {
        let log = sample_log();
        let mut full = MetaState::new(2, 16, 8);
        let replies = apply_all(&mut full, &log, 0);
        for cut in 0..=log.len() {
            let mut head = MetaState::new(2, 16, 8);
            apply_all(&mut head, &log[..cut], 0);
            let bytes = head.encode_snapshot();
            let mut restored = MetaState::decode_snapshot(&bytes, 2, 16, 8).unwrap();
            assert_eq!(restored, head, "cut {cut}");
            let tail = apply_all(&mut restored, &log, cut);
            assert_eq!(tail, replies[cut..], "cut {cut}");
            assert_eq!(restored, full, "cut {cut}");
        }
    }

    #[test]
    fn metadata_snapshot_refuses_damage() {
        let mut state = MetaState::new(2, 16, 8);
        apply_all(&mut state, &sample_log(), 0);
        let bytes = state.encode_snapshot();
        for len in 0..bytes.len() {
            assert!(MetaState::decode_snapshot(&bytes[..len], 2, 16, 8).is_err(), "cut at {len}");
        }
        // Flipped bytes either fail to decode or decode to something; never a panic (the file
        // checksum catches damage before this decoder sees it).
        for at in 0..bytes.len() {
            let mut flipped = bytes.clone();
            flipped[at] ^= 0xff;
            let _ = MetaState::decode_snapshot(&flipped, 2, 16, 8);
        }
        let error = MetaState::decode_snapshot(&bytes, 3, 16, 8).unwrap_err();
        assert!(error.to_string().contains("shards"), "{error}");
    }

    #[test]
    fn metadata_partition_bound_is_enforced() {
        let mut catalog = Catalog::new(2, 3);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        // 6 slots, one taken by the metadata group: 5 partitions fit, a sixth does not.
        let create = |topic: &str, partitions| create_topic(topic, partitions, 1);
        assert_eq!(catalog.check(&create("big", 6)).unwrap_err().0, ErrorCode::LimitReached);
        assert_eq!(catalog.apply(2, 0, &create("fits", 5)), Ok(Applied::Done));
        assert_eq!(catalog.apply(3, 0, &create("more", 1)).unwrap_err().0, ErrorCode::LimitReached);
        // A record from before nodes deleted groups keeps counting them, as its replay did.
        let old_record = MetaCommand::DeleteTopic {
            stream: "s".into(),
            topic: "fits".into(),
            frees_groups: false,
        };
        let mut replayed = catalog.clone();
        replayed.apply(4, 0, &old_record).unwrap();
        assert_eq!(replayed.check(&create("again", 1)).unwrap_err().0, ErrorCode::LimitReached);
        // Deleting a topic frees its places: the nodes delete its groups.
        catalog.apply(4, 0, &delete_topic("fits")).unwrap();
        assert_eq!(catalog.groups_per_shard, vec![1, 0]);
        assert_eq!(catalog.apply(5, 0, &create("again", 5)), Ok(Applied::Done));
        // And so does deleting its stream.
        let delete_stream = MetaCommand::DeleteStream { name: "s".into(), frees_groups: true };
        catalog.apply(6, 0, &delete_stream).unwrap();
        assert_eq!(catalog.groups_per_shard, vec![1, 0]);
    }

    fn delete_topic(topic: &str) -> MetaCommand {
        MetaCommand::DeleteTopic { stream: "s".into(), topic: topic.into(), frees_groups: true }
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
        let error = TopicSettings::resolve(&request, &defaults, 1 << 21, 10_000, 1).unwrap_err();
        assert_eq!(error.0, ErrorCode::InvalidArgument);
        assert!(error.1.contains("segment_size_bytes"), "{}", error.1);
        let request = CreateTopic { segment_size_bytes: None, ..request };
        let resolved = TopicSettings::resolve(&request, &defaults, 2 << 20, 10_000, 1).unwrap();
        assert_eq!(resolved.partitions, defaults.partitions);
        let too_big = CreateTopic { message_size_bytes_max: Some(4 << 20), ..request.clone() };
        assert!(TopicSettings::resolve(&too_big, &defaults, 2 << 20, 10_000, 1).is_err());
        // The partition bound, at it and past it.
        let at_bound = CreateTopic { partitions: 10_000, ..request.clone() };
        assert!(TopicSettings::resolve(&at_bound, &defaults, 2 << 20, 10_000, 1).is_ok());
        let past = CreateTopic { partitions: 10_001, ..request.clone() };
        let (code, reason) =
            TopicSettings::resolve(&past, &defaults, 2 << 20, 10_000, 1).unwrap_err();
        assert_eq!(code, ErrorCode::InvalidArgument);
        assert!(reason.contains("topic_partitions_max"), "{reason}");
        // A topic's own lag bound: none means the cluster's; at its bounds; past them refused.
        assert_eq!(resolved.replica_lag_time_max_ms, 0);
        for (lag_ms, accepted) in [(10, true), (3_600_000, true), (9, false), (3_600_001, false)] {
            let request = CreateTopic { replica_lag_time_max_ms: Some(lag_ms), ..request.clone() };
            let resolved = TopicSettings::resolve(&request, &defaults, 2 << 20, 10_000, 1);
            assert_eq!(resolved.is_ok(), accepted, "{lag_ms}");
            if let Err((_, reason)) = resolved {
                assert!(reason.contains("replica_lag_time_max_ms"), "{reason}");
            }
        }
    }

    /// A topic's lag bound survives the metadata log and the snapshot; a create record or a
    /// version 1 snapshot written before it reads as "the cluster's" (0).
    #[test]
    fn metadata_a_topic_lag_bound_survives_the_log_and_the_snapshot() {
        let settings = TopicSettings { replica_lag_time_max_ms: 5_000, ..settings(2) };
        let create =
            MetaCommand::CreateTopic { stream: "s".into(), topic: "t".into(), settings, nodes: 3 };
        let bytes = create.encode();
        assert_eq!(MetaCommand::decode(&bytes).unwrap(), create);
        // The record as written before the bound existed: it ends at the node count.
        let MetaCommand::CreateTopic { settings: old, .. } =
            MetaCommand::decode(&bytes[..bytes.len() - 9]).unwrap()
        else {
            panic!("a topic creation")
        };
        assert_eq!(old, TopicSettings { replica_lag_time_max_ms: 0, ..settings });

        let mut state = MetaState::new(1, 100, 8);
        state.catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        state.catalog.apply(2, 0, &create).unwrap();
        state.catalog.applied_op = 2;
        let snapshot = state.encode_snapshot();
        let restored = MetaState::decode_snapshot(&snapshot, 1, 100, 8).unwrap();
        assert_eq!(restored.catalog, state.catalog);
        // Versions 4 and 5: without the node book at the end (no node added, none leaving),
        // without preferred primaries (every partition prefers its home).
        for version in [4, 5] {
            let snapshot = state.encode_snapshot_as(version);
            let restored = MetaState::decode_snapshot(&snapshot, 1, 100, 8).unwrap();
            assert_eq!(restored.catalog, state.catalog);
        }
        let snapshot = state.encode_snapshot_as(4);
        let restored = MetaState::decode_snapshot(&snapshot, 1, 100, 8).unwrap();
        let lag = |state: &MetaState| {
            state.catalog.topic("s", "t").unwrap().settings.replica_lag_time_max_ms
        };
        assert_eq!(lag(&restored), 5_000);
        let mut topic_lag = Writer::new();
        topic_lag.u64(5_000);
        let lag_bytes = topic_lag.finish();
        let lag_at = snapshot
            .windows(lag_bytes.len())
            .position(|window| window == lag_bytes.as_slice())
            .expect("the bound is in the snapshot");
        // Version 3: without the replication factor after the bound and each partition's
        // members and move target (u64 each) after its group and shard.
        let snapshot = {
            let after_factor = lag_at + 8 + 1;
            let mut bytes = snapshot[..lag_at + 8].to_vec();
            bytes.extend_from_slice(&snapshot[after_factor..after_factor + 4]);
            let mut at = after_factor + 4;
            for _ in 0..2 {
                bytes.extend_from_slice(&snapshot[at..at + 12]);
                at += 12 + 16;
            }
            bytes.extend_from_slice(&snapshot[at..]);
            bytes[..2].copy_from_slice(&3u16.to_le_bytes());
            bytes
        };
        let restored = MetaState::decode_snapshot(&snapshot, 1, 100, 8).unwrap();
        assert_eq!(lag(&restored), 5_000);
        let topic = restored.catalog.topic("s", "t").unwrap();
        assert_eq!(topic.settings.replication_factor, 0, "every node, as before the factor");
        assert!(topic.partitions.iter().all(|place| place.members.is_empty()));
        // Version 2: the same bytes without the (empty) Kafka groups at the end.
        let version_2 = {
            let mut bytes = snapshot[..snapshot.len() - 4].to_vec();
            bytes[..2].copy_from_slice(&2u16.to_le_bytes());
            bytes
        };
        let restored = MetaState::decode_snapshot(&version_2, 1, 100, 8).unwrap();
        assert_eq!((lag(&restored), restored.kafka_groups.len()), (5_000, 0));
        // Version 1: without the bound after the topic's settings as well.
        let version_1 = {
            let at = lag_at;
            let mut bytes = [&snapshot[..at], &snapshot[at + 8..snapshot.len() - 4]].concat();
            bytes[..2].copy_from_slice(&1u16.to_le_bytes());
            bytes
        };
        assert_eq!(lag(&MetaState::decode_snapshot(&version_1, 1, 100, 8).unwrap()), 0);
    }

    /// A topic's replication factor places each partition on that many nodes, spreading
    /// replicas and homes (view-0 primaries) evenly; each node creates only what it holds; the
    /// factor and the members survive the log and the snapshot; a factor beyond the node count
    /// is refused wherever it comes from.
    #[test]
    fn a_replication_factor_places_each_partition_on_that_many_nodes() {
        let defaults = TopicDefaults::default();
        let request = |factor| CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            partitions: 1,
            replication_factor: factor,
            ..CreateTopic::default()
        };
        let resolve = |factor, nodes| {
            TopicSettings::resolve(&request(factor), &defaults, 2 << 20, 10_000, nodes)
                .map(|settings| settings.replication_factor)
        };
        assert_eq!(resolve(None, 1), Ok(1), "the default, capped by a smaller cluster");
        assert_eq!(resolve(None, 5), Ok(REPLICATION_FACTOR_DEFAULT));
        assert_eq!(resolve(Some(5), 5), Ok(5));
        for (factor, nodes) in [(0, 3), (4, 3)] {
            let (code, reason) = resolve(Some(factor), nodes).unwrap_err();
            assert_eq!(code, ErrorCode::InvalidArgument);
            assert!(reason.contains("replication_factor"), "{reason}");
        }

        let nodes = 5;
        let settings = TopicSettings { replication_factor: 3, ..settings(20) };
        let create =
            MetaCommand::CreateTopic { stream: "s".into(), topic: "t".into(), settings, nodes };
        assert_eq!(MetaCommand::decode(&create.encode()), Ok(create.clone()));
        let mut state = MetaState::new(2, 100, 8);
        state.catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        state.catalog.apply(2, 0, &create).unwrap();
        let places = state.catalog.topic("s", "t").unwrap().partitions.clone();
        let mut held = [0; 5];
        let mut homes = [0; 5];
        for place in &places {
            assert_eq!(place.members.voter_count(), 3, "{place:?}");
            assert_eq!(place.members.learners, 0);
            let home = place.home(nodes);
            assert!(place.is_held_by(home), "the home holds the partition: {place:?}");
            homes[usize::from(home)] += 1;
            for node in place.members.member_indices() {
                held[usize::from(node)] += 1;
            }
        }
        assert_eq!(held, [12; 5], "20 partitions × 3 replicas over 5 nodes");
        assert!(homes.iter().all(|&led| (3..=5).contains(&led)), "homes spread: {homes:?}");
        for node in 0..nodes {
            let on_node: usize =
                (0..2).map(|shard| state.catalog.groups_on(shard, node).len()).sum();
            assert_eq!(on_node, 12, "node {node} creates only the groups it holds");
        }
        let group = places[7].group;
        assert_eq!(state.catalog.place_of(group), Some(places[7]));

        let restored = MetaState::decode_snapshot(&state.encode_snapshot(), 2, 100, 8).unwrap();
        assert_eq!(restored.catalog, state.catalog);

        // More replicas than the active nodes: refused when applied (a record may name more than
        // the founding nodes once nodes were added; one past 32 is refused when decoded).
        let over = TopicSettings { replication_factor: 4, ..settings };
        let refused = MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: "u".into(),
            settings: over,
            nodes: 3,
        };
        assert_eq!(MetaCommand::decode(&refused.encode()), Ok(refused.clone()));
        let (code, _) = state.catalog.apply(3, 0, &refused).unwrap_err();
        assert_eq!(code, ErrorCode::InvalidArgument);
        let add = MetaCommand::AddPartitions {
            stream: "s".into(),
            topic: "t".into(),
            partitions: 21,
            nodes: 2,
        };
        assert_eq!(state.catalog.apply(4, 0, &add).unwrap_err().0, ErrorCode::InvalidArgument);
    }

    /// A move is recorded in the catalog: started (its target: the nodes then hold the
    /// partition, the new ones joining as learners), cancelled (back to its members), done
    /// (the target becomes the members); each refusal names why; the snapshot keeps it.
    #[test]
    fn a_move_starts_cancels_and_ends_in_the_catalog() {
        let nodes = 4;
        let settings = TopicSettings { replication_factor: 2, ..settings(1) };
        let create =
            MetaCommand::CreateTopic { stream: "s".into(), topic: "t".into(), settings, nodes };
        let mut state = MetaState::new(1, 100, 8);
        state.catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        state.catalog.apply(2, 0, &create).unwrap();
        let place = |state: &MetaState| state.catalog.topic("s", "t").unwrap().partitions[0];
        let members = place(&state).members;
        assert_eq!(members.voter_count(), 2);
        let elsewhere = !members.voters & 0b1111;
        let command = |action| MetaCommand::Move {
            stream: "s".into(),
            topic: "t".into(),
            partition: 0,
            action,
            nodes,
        };
        let mut op = 2;
        let mut apply = |state: &mut MetaState, action| {
            op += 1;
            let command = command(action);
            assert_eq!(MetaCommand::decode(&command.encode()), Ok(command.clone()));
            state.catalog.apply(op, 0, &command).map(drop).map_err(|(_, reason)| reason)
        };
        for (voters, why) in [
            (members.voters, "already"),
            (0b1_0000, "nodes"),
            (elsewhere & elsewhere.wrapping_neg(), "replicas"),
        ] {
            let refused = apply(&mut state, MoveAction::Start { voters }).unwrap_err();
            assert!(refused.contains(why), "{refused}");
        }
        assert!(apply(&mut state, MoveAction::Cancel).unwrap_err().contains("no move"));
        apply(&mut state, MoveAction::Start { voters: elsewhere }).unwrap();
        let moving = place(&state);
        assert_eq!(moving.target.voters, elsewhere);
        for node in 0..nodes {
            assert!(moving.is_held_by(node), "node {node} holds or joins it");
            assert_eq!(moving.is_joined_by(node), elsewhere & (1 << node) != 0);
        }
        assert_eq!(
            moving.created_members(),
            GroupMembers { voters: members.voters, learners: elsewhere }
        );
        let restored = MetaState::decode_snapshot(&state.encode_snapshot(), 1, 100, 8).unwrap();
        assert_eq!(restored.catalog, state.catalog);
        assert!(
            apply(&mut state, MoveAction::Start { voters: elsewhere })
                .unwrap_err()
                .contains("progress")
        );
        assert!(apply(&mut state, MoveAction::Done { voters: members.voters }).is_err());

        apply(&mut state, MoveAction::Cancel).unwrap();
        assert_eq!(place(&state).target, members, "a cancel moves it back");
        apply(&mut state, MoveAction::Done { voters: members.voters }).unwrap();
        assert_eq!(
            (place(&state).members, place(&state).target),
            (members, GroupMembers::default())
        );

        apply(&mut state, MoveAction::Start { voters: elsewhere }).unwrap();
        apply(&mut state, MoveAction::Done { voters: elsewhere }).unwrap();
        let moved = place(&state);
        assert_eq!(moved.members, GroupMembers { voters: elsewhere, learners: 0 });
        assert!(moved.target.is_empty());
        assert!(!moved.is_held_by(members.voter_indices().next().unwrap()));
    }

    /// Adding a node puts it in the book (kept by the log and the snapshot) and in the
    /// placement of new partitions; removing one starts a move of every partition it holds to
    /// the named replacement or the least loaded active node, and nothing new lands on it.
    #[test]
    fn nodes_are_added_and_removed_through_the_log() {
        let address = |port: u16| ClusterNode {
            bus: format!("10.0.0.9:{port}").parse().unwrap(),
            client: format!("10.0.0.9:{}", port + 1).parse().unwrap(),
            kafka: None,
            rack: None,
        };
        let founders = 3;
        let mut state = MetaState::new(1, 100, 8);
        state.catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let settings = TopicSettings { replication_factor: 3, ..settings(3) };
        let create = |topic: &str| MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: topic.into(),
            settings,
            nodes: founders,
        };
        state.catalog.apply(2, 0, &create("t")).unwrap();

        let add = MetaCommand::AddNode { node: 3, address: address(7000), founders };
        assert_eq!(MetaCommand::decode(&add.encode()), Ok(add.clone()));
        assert_eq!(state.catalog.apply(3, 0, &add), Ok(Applied::Node(3)));
        assert!(state.catalog.apply(4, 0, &add).is_err(), "node 3 is there already");
        assert_eq!(state.catalog.nodes.known(founders), 0b1111);

        // Four active nodes: a new topic's partitions use node 3 too.
        state.catalog.apply(5, 0, &create("u")).unwrap();
        let on_3 = state.catalog.topic("s", "u").unwrap().partitions.iter();
        assert!(on_3.filter(|p| p.members.is_member(3)).count() > 0);

        // Node 0 leaves, replaced by node 3: each partition of "t" (on 0, 1 and 2) moves to
        // 1, 2 and 3; "u"'s partitions without node 0 stay.
        let remove = MetaCommand::RemoveNode { node: 0, replacement: Some(3), founders };
        assert_eq!(MetaCommand::decode(&remove.encode()), Ok(remove.clone()));
        state.catalog.apply(6, 0, &remove).unwrap();
        assert_eq!(state.catalog.nodes.leaving, 0b0001);
        for place in &state.catalog.topic("s", "t").unwrap().partitions {
            assert_eq!(place.target.voters, 0b1110, "{place:?}");
        }
        for place in &state.catalog.topic("s", "u").unwrap().partitions {
            let moving = place.members.is_member(0);
            assert_eq!(!place.target.is_empty(), moving, "{place:?}");
            assert!(!place.target.is_member(0), "{place:?}");
        }
        assert!(state.catalog.apply(7, 0, &remove).is_err(), "node 0 is leaving already");
        // Nothing new lands on a leaving node, and three replicas still fit on nodes 1 to 3.
        state.catalog.apply(8, 0, &create("v")).unwrap();
        let new = &state.catalog.topic("s", "v").unwrap().partitions;
        assert!(new.iter().all(|p| !p.members.is_member(0)), "{new:?}");
        // Removing a second node would leave two nodes for three replicas.
        let too_many = MetaCommand::RemoveNode { node: 1, replacement: None, founders };
        let (code, reason) = state.catalog.check(&too_many).unwrap_err();
        assert_eq!(code, ErrorCode::InvalidArgument);
        assert!(reason.contains("no other active node"), "{reason}");

        state.catalog.applied_op = 8;
        let restored = MetaState::decode_snapshot(&state.encode_snapshot(), 1, 100, 8).unwrap();
        assert_eq!(restored.catalog, state.catalog);
    }
}
