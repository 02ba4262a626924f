//! Kafka's classic consumer groups, as the coordinator on the metadata group's primary keeps them:
//! members join with the assignment protocols they support, the coordinator waits for every
//! known member to rejoin (or for the rebalance timeout), raises the generation, picks a protocol
//! and a leader, and hands the leader everyone's metadata; the leader computes the assignment
//! and sends it with its SyncGroup, and every member gets its own share.
//!
//! The group lives in memory on the coordinating node, and each completed rebalance (the
//! leader's assignment in) is handed out as a [`StoredGroup`] for the metadata log, as Kafka
//! writes it to `__consumer_offsets`; a coordinator that starts loads the stored groups, so after
//! a failover their members go on heartbeating and committing under the same generation. The
//! store is not waited for: a coordinator lost before it commits leaves the previous
//! generation, whose members are told to rejoin (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID). Member
//! ids carry a prefix unique to each coordinator start, so an id is never handed out twice.
//! Offsets are elsewhere: in the partitions' logs. A group with no member and no pending id is
//! forgotten, and a stored one is stored again with no members (its offsets stay).
//!
//! It never reads a clock (times are passed in), never touches storage or sockets, and never
//! decides what an offset commit stores: it only says whether a member may commit.

use std::collections::BTreeMap;

use bytes::Bytes;
use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_proto::protocol::{ProtocolError, Reader, Writer, validate_name};

/// Session timeouts a member may ask for, in milliseconds (Kafka's broker defaults allow 6 s to
/// 30 min; Shoal allows shorter sessions for tests and quick failure detection).
pub const SESSION_TIMEOUT_MS_MIN: i32 = 100;
/// See [`SESSION_TIMEOUT_MS_MIN`].
pub const SESSION_TIMEOUT_MS_MAX: i32 = 1_800_000;
/// Members one group may have (joined or holding an id from MEMBER_ID_REQUIRED).
pub const GROUP_MEMBERS_MAX: usize = 1_000;
/// Groups the coordinator keeps at once (groups with members; empty ones are forgotten).
pub const GROUPS_MAX: usize = 10_000;
/// The client id's share of a member id: Kafka's ids are `client.id-UUID`, and tools show them.
const MEMBER_CLIENT_ID_LEN_MAX: usize = 64;
/// What every group's members may hold in all (their ids, protocol metadata and assignments):
/// each JoinGroup and SyncGroup is bounded by the frame bound, and this bounds their sum.
pub const HELD_BYTES_MAX: usize = 256 << 20;

/// Where a group is in its rebalance cycle (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// No member: offsets only.
    Empty,
    /// Waiting for members to (re)join.
    PreparingRebalance,
    /// Joined: waiting for the leader's assignment.
    CompletingRebalance,
    /// Every member has its assignment.
    Stable,
}

impl GroupState {
    /// The name Kafka's DescribeGroups and ListGroups use.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A group as the metadata log keeps it: its state after a completed rebalance, or (no members)
/// its end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredGroup {
    pub group: String,
    pub generation: i32,
    pub protocol_type: String,
    pub protocol: String,
    pub leader: String,
    pub members: Vec<StoredMember>,
}

/// One member of a [`StoredGroup`]: its metadata for the group's protocol and its assignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMember {
    pub id: String,
    pub client_id: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// The longest string a stored group carries besides its id (a Kafka string's bound).
const STORED_TEXT_LEN_MAX: usize = i16::MAX as usize;
/// The smallest stored member: two empty strings, two timeouts, two empty byte strings.
const STORED_MEMBER_SIZE_MIN: usize = 2 + 2 + 4 + 4 + 4 + 4;

impl StoredGroup {
    /// Appends its bytes (docs/storage-format.md, "Metadata commands").
    pub fn write(&self, w: &mut Writer) {
        w.str(&self.group).u32(self.generation as u32);
        w.str(&self.protocol_type).str(&self.protocol).str(&self.leader);
        w.u32(self.members.len() as u32);
        for member in &self.members {
            w.str(&member.id).str(&member.client_id);
            w.u32(member.session_timeout_ms as u32).u32(member.rebalance_timeout_ms as u32);
            w.bytes(&member.metadata).bytes(&member.assignment);
        }
    }

    /// Reads one, every count and length bounded by the bytes present.
    pub fn read(r: &mut Reader<'_>) -> Result<StoredGroup, ProtocolError> {
        let group = r.name("kafka group")?;
        let generation = r.u32("generation")? as i32;
        let protocol_type = r.str("protocol type", STORED_TEXT_LEN_MAX)?;
        let protocol = r.str("protocol", STORED_TEXT_LEN_MAX)?;
        let leader = r.str("leader", STORED_TEXT_LEN_MAX)?;
        let count = r.count("members", STORED_MEMBER_SIZE_MIN)?;
        let mut members = Vec::with_capacity(count);
        for _ in 0..count {
            let id = r.str("member id", STORED_TEXT_LEN_MAX)?;
            let client_id = r.str("client id", STORED_TEXT_LEN_MAX)?;
            let session_timeout_ms = r.u32("session timeout")? as i32;
            let rebalance_timeout_ms = r.u32("rebalance timeout")? as i32;
            let metadata = Bytes::copy_from_slice(r.bytes("metadata", r.remaining())?);
            let assignment = Bytes::copy_from_slice(r.bytes("assignment", r.remaining())?);
            members.push(StoredMember {
                id,
                client_id,
                session_timeout_ms,
                rebalance_timeout_ms,
                metadata,
                assignment,
            });
        }
        Ok(StoredGroup { group, generation, protocol_type, protocol, leader, members })
    }
}

/// A JoinGroup, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct Join {
    pub group: String,
    /// Empty for a new member.
    pub member_id: String,
    /// The client's id (part of a new member id).
    pub client_id: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// Assignment protocols in the member's order of preference, with its metadata for each.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member first gets its id with MEMBER_ID_REQUIRED, then joins with it.
    pub require_known_member_id: bool,
}

/// A SyncGroup, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct Sync {
    pub group: String,
    pub member_id: String,
    pub generation: i32,
    /// v5+: what the member believes the group's protocol type and protocol are.
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    /// The leader's: each member's assignment.
    pub assignments: Vec<(String, Bytes)>,
}

/// A JoinGroup's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinAnswer {
    pub error: Option<ResponseError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// For the leader only: every member and its metadata for the chosen protocol.
    pub members: Vec<(String, Bytes)>,
}

impl JoinAnswer {
    /// A refusal (`member_id` is what the member should use next: its id, a new one, or empty).
    pub fn refused(error: ResponseError, member_id: String) -> JoinAnswer {
        JoinAnswer {
            error: Some(error),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id,
            members: Vec::new(),
        }
    }
}

/// A SyncGroup's answer: the member's assignment (empty on an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncAnswer {
    pub error: Option<ResponseError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncAnswer {
    fn refused(error: ResponseError) -> SyncAnswer {
        SyncAnswer {
            error: Some(error),
            protocol_type: None,
            protocol_name: None,
            assignment: Bytes::new(),
        }
    }
}

/// What a waiting request is answered with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupAnswer {
    Join(JoinAnswer),
    Sync(SyncAnswer),
}

/// One member, for DescribeGroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberDescription {
    pub member_id: String,
    pub client_id: String,
    /// Its metadata for the chosen protocol.
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group, for DescribeGroups and ListGroups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

impl<W> Member<W> {
    /// Its metadata for `protocol` (empty if it does not support it).
    fn metadata_for(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, b)| b.clone())
            .unwrap_or_default()
    }

    /// What the member holds, counted against [`HELD_BYTES_MAX`].
    fn bytes(&self, id: &str) -> usize {
        let protocols: usize = self.protocols.iter().map(|(n, m)| n.len() + m.len()).sum();
        id.len() + self.client_id.len() + protocols + self.assignment.len()
    }
}

struct Member<W> {
    client_id: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<(String, Bytes)>,
    last_heard_ms: i64,
    /// Its JoinGroup, waiting for the rebalance to complete.
    join: Option<W>,
    /// Its SyncGroup, waiting for the leader's assignment.
    sync: Option<W>,
    assignment: Bytes,
}

struct Group<W> {
    state: GroupState,
    generation: i32,
    protocol_type: String,
    /// The protocol chosen at the last completed join.
    protocol: Option<String>,
    leader: Option<String>,
    members: BTreeMap<String, Member<W>>,
    /// Ids handed out with MEMBER_ID_REQUIRED, until when they may be used to join.
    pending: BTreeMap<String, i64>,
    /// A rebalance completes by this time, with whoever rejoined.
    rebalance_deadline_ms: i64,
    /// ... and not before this one (a new group waits for more members to arrive).
    rebalance_not_before_ms: i64,
    /// What its members held when last counted (`KafkaGroups::recount`).
    bytes: usize,
    /// A generation of it was handed out to be stored (so its end must be stored too).
    stored: bool,
}

impl<W> Group<W> {
    fn new(protocol_type: String) -> Self {
        Group {
            state: GroupState::Empty,
            generation: 0,
            protocol_type,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            rebalance_deadline_ms: 0,
            rebalance_not_before_ms: 0,
            bytes: 0,
            stored: false,
        }
    }

    /// The group as the metadata log keeps it (a Stable group's, or with no members its end).
    fn to_stored(&self, name: &str) -> StoredGroup {
        let protocol = self.protocol.clone().unwrap_or_default();
        let members = self
            .members
            .iter()
            .map(|(id, m)| StoredMember {
                id: id.clone(),
                client_id: m.client_id.clone(),
                session_timeout_ms: m.session_timeout_ms,
                rebalance_timeout_ms: m.rebalance_timeout_ms,
                metadata: m.metadata_for(&protocol),
                assignment: m.assignment.clone(),
            })
            .collect();
        StoredGroup {
            group: name.to_string(),
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol,
            leader: self.leader.clone().unwrap_or_default(),
            members,
        }
    }

    /// The protocol every member supports that most members prefer (ties: the name first in
    /// order), as Kafka's vote picks it.
    fn select_protocol(&self) -> Option<String> {
        let mut candidates: Vec<&str> =
            self.members.values().next()?.protocols.iter().map(|(n, _)| n.as_str()).collect();
        candidates.retain(|name| {
            self.members.values().all(|m| m.protocols.iter().any(|(n, _)| n == name))
        });
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for member in self.members.values() {
            if let Some((name, _)) =
                member.protocols.iter().find(|(n, _)| candidates.contains(&n.as_str()))
            {
                *votes.entry(name.as_str()).or_default() += 1;
            }
        }
        let best = votes.values().copied().max()?;
        votes.into_iter().find(|&(_, count)| count == best).map(|(name, _)| name.to_string())
    }

    /// Whether a member with `protocols` could join: the group's protocol type, and at least
    /// one protocol every current member supports too.
    fn accepts(&self, protocol_type: &str, protocols: &[(String, Bytes)], member: &str) -> bool {
        if protocols.is_empty() || protocol_type.is_empty() {
            return false;
        }
        let others: Vec<&Member<W>> =
            self.members.iter().filter(|(id, _)| id.as_str() != member).map(|(_, m)| m).collect();
        if others.is_empty() {
            return true;
        }
        self.protocol_type == protocol_type
            && protocols
                .iter()
                .any(|(name, _)| others.iter().all(|m| m.protocols.iter().any(|(n, _)| n == name)))
    }
}

/// Every Kafka group the coordinator keeps. `W` is what a waiting JoinGroup or SyncGroup is
/// answered through; answers due are collected in [`KafkaGroups::take_answers`].
pub struct KafkaGroups<W> {
    groups: BTreeMap<String, Group<W>>,
    /// Member ids are a client id, this prefix (unique per coordinator start) and a counter.
    member_prefix: String,
    next_member: u64,
    /// How long a new group waits for more members before its first generation.
    initial_rebalance_delay_ms: i64,
    answers: Vec<(W, GroupAnswer)>,
    /// Groups to store in the metadata log, in order.
    stores: Vec<StoredGroup>,
    /// What every group's members hold, and its bound.
    held_bytes: usize,
    held_bytes_max: usize,
}

impl<W> KafkaGroups<W> {
    /// A coordinator whose member ids carry `member_prefix` (different on every start).
    pub fn new(member_prefix: String, initial_rebalance_delay_ms: u32) -> Self {
        KafkaGroups {
            groups: BTreeMap::new(),
            member_prefix,
            next_member: 1,
            initial_rebalance_delay_ms: i64::from(initial_rebalance_delay_ms),
            answers: Vec::new(),
            stores: Vec::new(),
            held_bytes: 0,
            held_bytes_max: HELD_BYTES_MAX,
        }
    }

    /// The same with another bound on what the members hold (tests).
    pub fn with_held_bytes_max(mut self, held_bytes_max: usize) -> Self {
        self.held_bytes_max = held_bytes_max;
        self
    }

    /// Counts what `name`'s members hold now into the total (after any change to them).
    fn recount(&mut self, name: &str) {
        let Some(group) = self.groups.get_mut(name) else { return };
        let bytes: usize = group.members.iter().map(|(id, m)| m.bytes(id)).sum();
        self.held_bytes = self.held_bytes - group.bytes + bytes;
        group.bytes = bytes;
    }

    /// Answers due since the last call, each with the waiter to send it through.
    pub fn take_answers(&mut self) -> Vec<(W, GroupAnswer)> {
        std::mem::take(&mut self.answers)
    }

    /// Groups to store since the last call, in the order they changed.
    pub fn take_stores(&mut self) -> Vec<StoredGroup> {
        std::mem::take(&mut self.stores)
    }

    /// Takes up the stored groups (a coordinator that starts): each Stable in its stored
    /// generation, its members' sessions starting `now_ms`. Nothing is stored again.
    pub fn load<'a>(&mut self, stored: impl IntoIterator<Item = &'a StoredGroup>, now_ms: i64) {
        for record in stored {
            if record.members.is_empty() || self.groups.len() >= GROUPS_MAX {
                continue;
            }
            let mut group = Group::new(record.protocol_type.clone());
            group.state = GroupState::Stable;
            group.generation = record.generation;
            group.protocol = Some(record.protocol.clone());
            group.stored = true;
            for member in &record.members {
                group.members.insert(
                    member.id.clone(),
                    Member {
                        client_id: member.client_id.clone(),
                        session_timeout_ms: member.session_timeout_ms,
                        rebalance_timeout_ms: member.rebalance_timeout_ms,
                        protocols: vec![(record.protocol.clone(), member.metadata.clone())],
                        last_heard_ms: now_ms,
                        join: None,
                        sync: None,
                        assignment: member.assignment.clone(),
                    },
                );
            }
            group.leader = Some(record.leader.clone())
                .filter(|leader| group.members.contains_key(leader))
                .or_else(|| group.members.keys().next().cloned());
            self.groups.insert(record.group.clone(), group);
            self.recount(&record.group);
        }
    }

    /// Every waiting request, for a coordinator that stops: the caller answers them.
    pub fn drain_waiters(&mut self) -> Vec<W> {
        let mut waiters: Vec<W> = self.answers.drain(..).map(|(w, _)| w).collect();
        for group in self.groups.values_mut() {
            for member in group.members.values_mut() {
                waiters.extend(member.join.take());
                waiters.extend(member.sync.take());
            }
        }
        self.groups.clear();
        self.stores.clear();
        self.held_bytes = 0;
        waiters
    }

    fn refuse_join(&mut self, waiter: W, error: ResponseError, member_id: String) {
        self.answers.push((waiter, GroupAnswer::Join(JoinAnswer::refused(error, member_id))));
    }

    fn refuse_sync(&mut self, waiter: W, error: ResponseError) {
        self.answers.push((waiter, GroupAnswer::Sync(SyncAnswer::refused(error))));
    }

    fn new_member_id(&mut self, client_id: &str) -> String {
        let client: String = client_id.chars().take(MEMBER_CLIENT_ID_LEN_MAX).collect();
        let id = format!("{client}-{}-{}", self.member_prefix, self.next_member);
        self.next_member += 1;
        id
    }

    /// A JoinGroup: answered at once (refusals, MEMBER_ID_REQUIRED, a known member rejoining a
    /// stable group unchanged) or once the rebalance it starts or joins completes.
    pub fn join(&mut self, join: Join, now_ms: i64, waiter: W) {
        // A group's offsets are a native group's, stored under its name: a group id that could
        // never commit is refused before anyone joins it.
        if validate_name(&join.group).is_err() {
            return self.refuse_join(waiter, ResponseError::InvalidGroupId, join.member_id);
        }
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&join.session_timeout_ms) {
            return self.refuse_join(waiter, ResponseError::InvalidSessionTimeout, join.member_id);
        }
        if !self.groups.contains_key(&join.group) {
            if !join.member_id.is_empty() {
                return self.refuse_join(waiter, ResponseError::UnknownMemberId, join.member_id);
            }
            if self.groups.len() >= GROUPS_MAX {
                return self.refuse_join(
                    waiter,
                    ResponseError::CoordinatorNotAvailable,
                    join.member_id,
                );
            }
        }
        let group = self
            .groups
            .entry(join.group.clone())
            .or_insert_with(|| Group::new(join.protocol_type.clone()));
        if !group.accepts(&join.protocol_type, &join.protocols, &join.member_id) {
            let forget = group.members.is_empty() && group.pending.is_empty();
            if forget {
                self.groups.remove(&join.group);
            }
            return self.refuse_join(
                waiter,
                ResponseError::InconsistentGroupProtocol,
                join.member_id,
            );
        }
        let known = group.members.contains_key(&join.member_id);
        let pending = group.pending.contains_key(&join.member_id);
        if !join.member_id.is_empty() && !known && !pending {
            return self.refuse_join(waiter, ResponseError::UnknownMemberId, join.member_id);
        }
        if !known
            && group.members.len() + group.pending.len() >= GROUP_MEMBERS_MAX + usize::from(pending)
        {
            return self.refuse_join(waiter, ResponseError::GroupMaxSizeReached, join.member_id);
        }
        if join.member_id.is_empty() && join.require_known_member_id {
            let id = self.new_member_id(&join.client_id);
            let group = self.groups.get_mut(&join.group).expect("created above");
            group.pending.insert(id.clone(), now_ms + i64::from(join.session_timeout_ms));
            return self.refuse_join(waiter, ResponseError::MemberIdRequired, id);
        }
        let member_id = if join.member_id.is_empty() {
            self.new_member_id(&join.client_id)
        } else {
            join.member_id
        };
        let delay = self.initial_rebalance_delay_ms;
        let group = self.groups.get_mut(&join.group).expect("created above");
        let protocols: usize = join.protocols.iter().map(|(n, m)| n.len() + m.len()).sum();
        let adding = member_id.len() + join.client_id.len() + protocols;
        let held_now = group.members.get(&member_id).map_or(0, |m| m.bytes(&member_id));
        if self.held_bytes - held_now + adding > self.held_bytes_max {
            group.pending.remove(&member_id);
            self.forget_if_empty(&join.group);
            return self.refuse_join(waiter, ResponseError::GroupMaxSizeReached, member_id);
        }
        group.pending.remove(&member_id);
        if group.members.is_empty() {
            group.protocol_type = join.protocol_type;
        }
        // A known follower rejoining a settled group with nothing changed gets the generation
        // in force at once (Kafka does the same: nothing for the others to redo).
        let unchanged =
            group.members.get(&member_id).is_some_and(|m| m.protocols == join.protocols);
        let settled = matches!(group.state, GroupState::Stable | GroupState::CompletingRebalance);
        let is_leader = group.leader.as_deref() == Some(member_id.as_str());
        let member = group.members.entry(member_id.clone()).or_insert_with(|| Member {
            client_id: join.client_id.clone(),
            session_timeout_ms: join.session_timeout_ms,
            rebalance_timeout_ms: join.rebalance_timeout_ms,
            protocols: Vec::new(),
            last_heard_ms: now_ms,
            join: None,
            sync: None,
            assignment: Bytes::new(),
        });
        member.session_timeout_ms = join.session_timeout_ms;
        member.rebalance_timeout_ms = join.rebalance_timeout_ms.max(join.session_timeout_ms);
        // Copied out of the request's frame: a slice would keep the whole frame alive while
        // the bound counted only the slice.
        member.protocols =
            join.protocols.into_iter().map(|(n, m)| (n, Bytes::copy_from_slice(&m))).collect();
        member.last_heard_ms = now_ms;
        if unchanged && settled && !is_leader {
            let answer = GroupAnswer::Join(JoinAnswer {
                error: None,
                generation: group.generation,
                protocol_type: Some(group.protocol_type.clone()),
                protocol_name: group.protocol.clone(),
                leader: group.leader.clone().unwrap_or_default(),
                member_id,
                members: Vec::new(),
            });
            self.answers.push((waiter, answer));
            self.recount(&join.group);
            return;
        }
        // A second join from one member replaces the first (whose connection gave up on it).
        member.join = Some(waiter);
        if group.state != GroupState::PreparingRebalance {
            prepare_rebalance(group, now_ms, delay, &mut self.answers);
        }
        self.complete_join(&join.group, now_ms);
        self.recount(&join.group);
    }

    /// Completes the rebalance of `group` if it may: every member rejoined (and a new group's
    /// delay passed), or the deadline came (members that did not rejoin are removed).
    fn complete_join(&mut self, name: &str, now_ms: i64) {
        let Some(group) = self.groups.get_mut(name) else { return };
        if group.state != GroupState::PreparingRebalance {
            return;
        }
        let all_joined = group.members.values().all(|m| m.join.is_some());
        let due = now_ms >= group.rebalance_deadline_ms
            || (all_joined && now_ms >= group.rebalance_not_before_ms);
        if !due {
            return;
        }
        group.members.retain(|_, m| m.join.is_some());
        group.generation = group.generation.wrapping_add(1).max(1);
        if group.members.is_empty() {
            group.state = GroupState::Empty;
            group.protocol = None;
            group.leader = None;
            self.forget_if_empty(name);
            return;
        }
        group.protocol = group.select_protocol();
        if group.leader.as_ref().is_none_or(|l| !group.members.contains_key(l)) {
            group.leader = group.members.keys().next().cloned();
        }
        group.state = GroupState::CompletingRebalance;
        let protocol = group.protocol.clone().unwrap_or_default();
        let leader = group.leader.clone().unwrap_or_default();
        let everyone: Vec<(String, Bytes)> = group
            .members
            .iter()
            .map(|(id, m)| {
                let metadata =
                    m.protocols.iter().find(|(n, _)| *n == protocol).map(|(_, b)| b.clone());
                (id.clone(), metadata.unwrap_or_default())
            })
            .collect();
        for (id, member) in group.members.iter_mut() {
            member.assignment = Bytes::new();
            member.last_heard_ms = now_ms;
            let Some(waiter) = member.join.take() else { continue };
            let answer = JoinAnswer {
                error: None,
                generation: group.generation,
                protocol_type: Some(group.protocol_type.clone()),
                protocol_name: Some(protocol.clone()),
                leader: leader.clone(),
                member_id: id.clone(),
                members: if *id == leader { everyone.clone() } else { Vec::new() },
            };
            self.answers.push((waiter, GroupAnswer::Join(answer)));
        }
    }

    /// A SyncGroup: the leader's brings the assignment (answering every member waiting); a
    /// follower's waits for it, or gets its share at once in a stable group.
    pub fn sync(&mut self, sync: Sync, now_ms: i64, waiter: W) {
        let Sync { group: name, member_id, generation, protocol_type, protocol_name, assignments } =
            sync;
        let (name, member_id) = (name.as_str(), member_id.as_str());
        let Some(group) = self.groups.get_mut(name) else {
            return self.refuse_sync(waiter, ResponseError::UnknownMemberId);
        };
        if !group.members.contains_key(member_id) {
            return self.refuse_sync(waiter, ResponseError::UnknownMemberId);
        }
        if generation != group.generation {
            return self.refuse_sync(waiter, ResponseError::IllegalGeneration);
        }
        if protocol_type.is_some_and(|t| t != group.protocol_type)
            || protocol_name.is_some_and(|p| Some(&p) != group.protocol.as_ref())
        {
            return self.refuse_sync(waiter, ResponseError::InconsistentGroupProtocol);
        }
        match group.state {
            GroupState::Empty => self.refuse_sync(waiter, ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => {
                self.refuse_sync(waiter, ResponseError::RebalanceInProgress)
            }
            GroupState::Stable => {
                let member = group.members.get_mut(member_id).expect("checked above");
                member.last_heard_ms = now_ms;
                let answer =
                    sync_answer(&group.protocol_type, &group.protocol, member.assignment.clone());
                self.answers.push((waiter, answer));
            }
            GroupState::CompletingRebalance => {
                let member = group.members.get_mut(member_id).expect("checked above");
                member.last_heard_ms = now_ms;
                member.sync = Some(waiter);
                if group.leader.as_deref() != Some(member_id) {
                    return;
                }
                // The assignments count against the bound as the members' metadata does (a
                // leader's sync over it is refused, and the group rebalances after the timeout).
                let mut assignments: BTreeMap<String, Bytes> = assignments
                    .into_iter()
                    .filter(|(id, _)| group.members.contains_key(id))
                    .map(|(id, assignment)| (id, Bytes::copy_from_slice(&assignment)))
                    .collect();
                let held_now: usize = group.members.values().map(|m| m.assignment.len()).sum();
                let adding: usize = assignments.values().map(Bytes::len).sum();
                if self.held_bytes - held_now + adding > self.held_bytes_max {
                    let member = group.members.get_mut(member_id).expect("checked above");
                    let waiter = member.sync.take().expect("the leader's sync, set above");
                    return self.refuse_sync(waiter, ResponseError::GroupMaxSizeReached);
                }
                group.state = GroupState::Stable;
                for (id, member) in group.members.iter_mut() {
                    member.assignment = assignments.remove(id).unwrap_or_default();
                    if let Some(waiter) = member.sync.take() {
                        let answer = sync_answer(
                            &group.protocol_type,
                            &group.protocol,
                            member.assignment.clone(),
                        );
                        self.answers.push((waiter, answer));
                    }
                }
                group.stored = true;
                self.stores.push(group.to_stored(name));
                self.recount(name);
            }
        }
    }

    /// A Heartbeat: keeps the member alive; REBALANCE_IN_PROGRESS tells it to rejoin.
    pub fn heartbeat(
        &mut self,
        name: &str,
        member_id: &str,
        generation: i32,
        now_ms: i64,
    ) -> Option<ResponseError> {
        let Some(group) = self.groups.get_mut(name) else {
            return Some(ResponseError::UnknownMemberId);
        };
        let Some(member) = group.members.get_mut(member_id) else {
            return Some(ResponseError::UnknownMemberId);
        };
        if generation != group.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        member.last_heard_ms = now_ms;
        match group.state {
            GroupState::Empty => Some(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            GroupState::CompletingRebalance | GroupState::Stable => None,
        }
    }

    /// A LeaveGroup: each member's own answer; the group rebalances without them.
    pub fn leave(
        &mut self,
        name: &str,
        members: &[String],
        now_ms: i64,
    ) -> Vec<Option<ResponseError>> {
        let delay = self.initial_rebalance_delay_ms;
        let Some(group) = self.groups.get_mut(name) else {
            return members.iter().map(|_| Some(ResponseError::UnknownMemberId)).collect();
        };
        let mut left = false;
        let results = members
            .iter()
            .map(|id| match group.members.remove(id) {
                Some(member) => {
                    left = true;
                    for waiter in member.join.into_iter() {
                        let answer =
                            JoinAnswer::refused(ResponseError::UnknownMemberId, id.clone());
                        self.answers.push((waiter, GroupAnswer::Join(answer)));
                    }
                    for waiter in member.sync.into_iter() {
                        let answer = SyncAnswer::refused(ResponseError::UnknownMemberId);
                        self.answers.push((waiter, GroupAnswer::Sync(answer)));
                    }
                    None
                }
                None if group.pending.remove(id).is_some() => None,
                None => Some(ResponseError::UnknownMemberId),
            })
            .collect();
        if left {
            self.membership_changed(name, now_ms, delay);
        }
        self.forget_if_empty(name);
        results
    }

    /// Whether `member_id` of `generation` may commit offsets for `name` (Kafka's rule: a
    /// commit outside group management, generation -1, only while the group has no member).
    pub fn check_commit(
        &self,
        name: &str,
        member_id: &str,
        generation: i32,
    ) -> Option<ResponseError> {
        let Some(group) = self.groups.get(name) else {
            return if generation < 0 { None } else { Some(ResponseError::IllegalGeneration) };
        };
        if generation < 0 && group.members.is_empty() {
            return None;
        }
        if group.state == GroupState::CompletingRebalance {
            return Some(ResponseError::RebalanceInProgress);
        }
        if !group.members.contains_key(member_id) {
            return Some(ResponseError::UnknownMemberId);
        }
        if generation != group.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        None
    }

    /// Time passing: members whose session ran out (and who wait for nothing) leave, ids never
    /// used expire, and rebalances whose deadline came complete.
    pub fn tick(&mut self, now_ms: i64) {
        let delay = self.initial_rebalance_delay_ms;
        let names: Vec<String> = self.groups.keys().cloned().collect();
        for name in names {
            let Some(group) = self.groups.get_mut(&name) else { continue };
            group.pending.retain(|_, until| *until > now_ms);
            let before = group.members.len();
            group.members.retain(|_, m| {
                m.join.is_some()
                    || m.sync.is_some()
                    || now_ms - m.last_heard_ms <= i64::from(m.session_timeout_ms)
            });
            if group.members.len() != before {
                self.membership_changed(&name, now_ms, delay);
            }
            self.complete_join(&name, now_ms);
            self.forget_if_empty(&name);
        }
    }

    /// After members left: a group with members rebalances; an empty one settles as empty.
    fn membership_changed(&mut self, name: &str, now_ms: i64, delay: i64) {
        let Some(group) = self.groups.get_mut(name) else { return };
        if group.leader.as_ref().is_some_and(|l| !group.members.contains_key(l)) {
            group.leader = None;
        }
        if group.members.is_empty() {
            group.state = GroupState::Empty;
            group.protocol = None;
            return;
        }
        if group.state != GroupState::PreparingRebalance {
            prepare_rebalance(group, now_ms, delay, &mut self.answers);
        }
        self.complete_join(name, now_ms);
    }

    fn forget_if_empty(&mut self, name: &str) {
        self.recount(name);
        if self.groups.get(name).is_some_and(|g| g.members.is_empty() && g.pending.is_empty())
            && let Some(group) = self.groups.remove(name)
            && group.stored
        {
            self.stores.push(group.to_stored(name));
        }
    }

    /// A group's state and members (`None`: not kept here, so Empty or unknown).
    pub fn describe(&self, name: &str) -> Option<GroupDescription> {
        let group = self.groups.get(name)?;
        let protocol = group.protocol.clone().unwrap_or_default();
        let members = group
            .members
            .iter()
            .map(|(id, m)| MemberDescription {
                member_id: id.clone(),
                client_id: m.client_id.clone(),
                metadata: m.metadata_for(&protocol),
                assignment: m.assignment.clone(),
            })
            .collect();
        Some(GroupDescription {
            state: group.state,
            protocol_type: group.protocol_type.clone(),
            protocol,
            members,
        })
    }

    /// Every group kept, with its protocol type and state.
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        self.groups
            .iter()
            .map(|(name, g)| (name.clone(), g.protocol_type.clone(), g.state))
            .collect()
    }
}

/// Starts a rebalance: members must rejoin (their heartbeats say so) within the longest
/// rebalance timeout among them; members waiting for an assignment are told to rejoin now.
fn prepare_rebalance<W>(
    group: &mut Group<W>,
    now_ms: i64,
    initial_delay_ms: i64,
    answers: &mut Vec<(W, GroupAnswer)>,
) {
    let fresh = group.state == GroupState::Empty;
    group.state = GroupState::PreparingRebalance;
    let timeout = group.members.values().map(|m| m.rebalance_timeout_ms).max().unwrap_or(0);
    group.rebalance_deadline_ms = now_ms + i64::from(timeout);
    group.rebalance_not_before_ms = if fresh { now_ms + initial_delay_ms } else { now_ms };
    for member in group.members.values_mut() {
        if let Some(waiter) = member.sync.take() {
            answers.push((
                waiter,
                GroupAnswer::Sync(SyncAnswer::refused(ResponseError::RebalanceInProgress)),
            ));
        }
    }
}

fn sync_answer(protocol_type: &str, protocol: &Option<String>, assignment: Bytes) -> GroupAnswer {
    GroupAnswer::Sync(SyncAnswer {
        error: None,
        protocol_type: Some(protocol_type.to_string()),
        protocol_name: protocol.clone(),
        assignment,
    })
}

#[cfg(test)]
mod tests;
