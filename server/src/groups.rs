//! The consumer group coordinator (shard 0): who is in each group right now, whose session has
//! run out, and the assignment the group should move to next.
//!
//! Membership is soft state, kept in memory and rebuilt from the catalog after a restart (every
//! member of the assignment in force gets a fresh session); assignments are hard state: each
//! rebalance is a `MetaCommand::Rebalance` in the metadata log, so generations are durable,
//! never reused, and every shard checks offset commits against the published catalog. It never
//! reads a clock (times are passed in), never proposes anything itself (it says what is due)
//! and never touches storage or sockets.

use std::collections::BTreeMap;

use shoal_proto::protocol::ErrorCode;
use shoal_proto::protocol::consumer::{Assignment, GroupRef};

use crate::metadata::{
    Catalog, ConsumerGroup, GROUP_MEMBERS_MAX, GroupMemberAssignment, MetaCommand,
};

/// Session timeouts a member may ask for, in milliseconds.
pub const SESSION_TIMEOUT_MS_MIN: u32 = 100;
/// See [`SESSION_TIMEOUT_MS_MIN`].
pub const SESSION_TIMEOUT_MS_MAX: u32 = 300_000;
/// Joins one group may have waiting for their assignment.
pub const JOINS_WAITING_MAX: usize = GROUP_MEMBERS_MAX;

struct Member {
    session_timeout_ms: u32,
    last_heard_ms: i64,
}

struct Members<W> {
    members: BTreeMap<String, Member>,
    /// The generation a proposed rebalance will bring, while it is in flight.
    proposed: Option<u64>,
    /// Joins answered once an assignment that includes their member is in force.
    joins: Vec<(String, W)>,
}

impl<W> Default for Members<W> {
    fn default() -> Self {
        Members { members: BTreeMap::new(), proposed: None, joins: Vec::new() }
    }
}

/// Every group's live membership. `W` is what a waiting join is answered through.
pub struct Coordinator<W> {
    groups: BTreeMap<GroupRef, Members<W>>,
    /// Member ids are this prefix (unique per start) and a counter.
    member_prefix: String,
    next_member: u64,
}

type Refusal = (ErrorCode, String);

impl<W> Coordinator<W> {
    /// A coordinator whose member ids start with `member_prefix` (which must differ between
    /// starts, so an id from before a restart is never handed out again).
    pub fn new(member_prefix: String) -> Self {
        Coordinator { groups: BTreeMap::new(), member_prefix, next_member: 1 }
    }

    /// After a restart: every member of every assignment in force is alive, with a fresh
    /// session, until it fails to heartbeat in time.
    pub fn seed(&mut self, catalog: &Catalog, now_ms: i64) {
        for (stream_name, stream) in &catalog.streams {
            for (topic_name, topic) in &stream.topics {
                for (name, group) in &topic.consumer_groups {
                    let key = GroupRef {
                        stream: stream_name.clone(),
                        topic: topic_name.clone(),
                        group: name.clone(),
                    };
                    let entry = self.groups.entry(key).or_default();
                    for member in &group.members {
                        entry.members.insert(
                            member.member.clone(),
                            Member {
                                session_timeout_ms: member.session_timeout_ms,
                                last_heard_ms: now_ms,
                            },
                        );
                    }
                }
            }
        }
    }

    /// Adds (or refreshes) a member; returns its id. Its join then waits for an assignment
    /// that includes it ([`Coordinator::wait_for_assignment`]).
    pub fn join(
        &mut self,
        group: &GroupRef,
        member: &str,
        session_timeout_ms: u32,
        now_ms: i64,
    ) -> Result<String, Refusal> {
        if !(SESSION_TIMEOUT_MS_MIN..=SESSION_TIMEOUT_MS_MAX).contains(&session_timeout_ms) {
            return Err((
                ErrorCode::InvalidArgument,
                format!(
                    "session_timeout_ms {session_timeout_ms}: use {SESSION_TIMEOUT_MS_MIN} to \
                     {SESSION_TIMEOUT_MS_MAX}"
                ),
            ));
        }
        let members = self.groups.get(group).map(|g| &g.members);
        let id = if member.is_empty() {
            if members.is_some_and(|m| m.len() >= GROUP_MEMBERS_MAX) {
                return Err((
                    ErrorCode::LimitReached,
                    format!("a consumer group has at most {GROUP_MEMBERS_MAX} members"),
                ));
            }
            let id = format!("{}-{}", self.member_prefix, self.next_member);
            self.next_member += 1;
            id
        } else if members.is_some_and(|m| m.contains_key(member)) {
            member.to_string()
        } else {
            // Refused before any entry is made: an unknown name must not leave an empty group
            // behind.
            return Err((ErrorCode::UnknownMember, format!("no member {member}: join as new")));
        };
        let entry = self.groups.entry(group.clone()).or_default();
        if entry.joins.len() >= JOINS_WAITING_MAX {
            return Err((ErrorCode::Busy, "too many joins waiting for this group".into()));
        }
        entry.members.insert(id.clone(), Member { session_timeout_ms, last_heard_ms: now_ms });
        Ok(id)
    }

    /// Keeps a joined member's `waiter` until an assignment includes the member.
    pub fn wait_for_assignment(&mut self, group: &GroupRef, member: String, waiter: W) {
        self.groups.entry(group.clone()).or_default().joins.push((member, waiter));
    }

    /// Keeps a member alive.
    pub fn heartbeat(
        &mut self,
        group: &GroupRef,
        member: &str,
        now_ms: i64,
    ) -> Result<(), Refusal> {
        match self.groups.get_mut(group).and_then(|g| g.members.get_mut(member)) {
            Some(entry) => {
                entry.last_heard_ms = now_ms;
                Ok(())
            }
            None => Err(unknown(group, member)),
        }
    }

    /// Removes a member at its request (with its join, if that still waits).
    pub fn leave(&mut self, group: &GroupRef, member: &str) -> Result<(), Refusal> {
        let Some(entry) = self.groups.get_mut(group) else { return Err(unknown(group, member)) };
        if entry.members.remove(member).is_none() {
            return Err(unknown(group, member));
        }
        entry.joins.retain(|(waiting, _)| waiting != member);
        Ok(())
    }

    /// Removes every member whose session ran out, with any join of theirs still waiting (its
    /// requester is gone or timing out); returns how many.
    pub fn expire(&mut self, now_ms: i64) -> usize {
        let mut expired = 0;
        for entry in self.groups.values_mut() {
            let before = entry.members.len();
            entry
                .members
                .retain(|_, m| now_ms - m.last_heard_ms <= i64::from(m.session_timeout_ms));
            expired += before - entry.members.len();
            let members = &entry.members;
            entry.joins.retain(|(member, _)| members.contains_key(member));
        }
        expired
    }

    /// The rebalances due: for every group whose live members differ from the assignment in
    /// force, with none in flight, the next assignment (partitions dealt round-robin over the
    /// members in id order). Each is marked in flight until [`Coordinator::settled`].
    pub fn rebalances_due(&mut self, catalog: &Catalog) -> Vec<(GroupRef, MetaCommand)> {
        let mut due = Vec::new();
        for (key, entry) in &mut self.groups {
            if entry.proposed.is_some() {
                continue;
            }
            let Ok(topic) = catalog.topic(&key.stream, &key.topic) else { continue };
            let current = topic.consumer_groups.get(&key.group);
            let in_force: Vec<&str> = current
                .map_or(Vec::new(), |g| g.members.iter().map(|m| m.member.as_str()).collect());
            let live: Vec<&str> = entry.members.keys().map(String::as_str).collect();
            // Partitions added to the topic since the assignment was made need owners too.
            let assigned: usize =
                current.map_or(0, |g| g.members.iter().map(|m| m.partitions.len()).sum());
            let covered = live.is_empty() || assigned == topic.partitions.len();
            if live == in_force && (current.is_some() || live.is_empty()) && covered {
                continue;
            }
            let mut members: Vec<GroupMemberAssignment> = entry
                .members
                .iter()
                .map(|(id, m)| GroupMemberAssignment {
                    member: id.clone(),
                    session_timeout_ms: m.session_timeout_ms,
                    partitions: Vec::new(),
                })
                .collect();
            if !members.is_empty() {
                let count = members.len();
                for partition in 0..topic.partitions.len() as u32 {
                    members[partition as usize % count].partitions.push(partition);
                }
            }
            let generation = current.map_or(0, |g| g.generation) + 1;
            entry.proposed = Some(generation);
            due.push((
                key.clone(),
                MetaCommand::Rebalance {
                    stream: key.stream.clone(),
                    topic: key.topic.clone(),
                    group: key.group.clone(),
                    generation,
                    members,
                },
            ));
        }
        due
    }

    /// A proposed rebalance of `group` was refused for good (a bound or check of the catalog:
    /// the topic's groups): it is no longer in flight, and every waiting join of a member
    /// without a part in the assignment in force is dropped with its member (it never got in),
    /// its waiter returned to hear the refusal. So a refusal that comes from the new members alone leaves
    /// nothing due; anything else still due is proposed again later.
    pub fn refused(&mut self, group: &GroupRef, in_force: Option<&ConsumerGroup>) -> Vec<W> {
        let Some(entry) = self.groups.get_mut(group) else { return Vec::new() };
        entry.proposed = None;
        let mut refused = Vec::new();
        let mut index = 0;
        while index < entry.joins.len() {
            if in_force.is_some_and(|g| g.member(&entry.joins[index].0).is_some()) {
                index += 1;
                continue;
            }
            let (member, waiter) = entry.joins.swap_remove(index);
            entry.members.remove(&member);
            refused.push(waiter);
        }
        if entry.members.is_empty()
            && entry.joins.is_empty()
            && in_force.is_none_or(|g| g.members.is_empty())
        {
            self.groups.remove(group);
        }
        refused
    }

    /// A proposed rebalance of `group` committed (`in_force` is then the group's assignment) or
    /// failed (`None`). Returns the joins it answers (see [`Coordinator::answer_joins`]).
    pub fn settled(
        &mut self,
        group: &GroupRef,
        in_force: Option<&ConsumerGroup>,
    ) -> Vec<(W, Assignment)> {
        let Some(entry) = self.groups.get_mut(group) else { return Vec::new() };
        entry.proposed = None;
        match in_force {
            Some(in_force) => self.answer_joins(group, in_force),
            None => Vec::new(),
        }
    }

    /// With no rebalance in flight: each waiting join whose member is in the assignment in
    /// force, with its part (a member rejoining an unchanged group is answered at once). Joins
    /// of members not in it keep waiting for the next assignment.
    pub fn answer_joins(
        &mut self,
        group: &GroupRef,
        in_force: &ConsumerGroup,
    ) -> Vec<(W, Assignment)> {
        let Some(entry) = self.groups.get_mut(group) else { return Vec::new() };
        if entry.proposed.is_some() {
            return Vec::new();
        }
        let mut answered = Vec::new();
        let mut index = 0;
        while index < entry.joins.len() {
            match in_force.member(&entry.joins[index].0) {
                Some(part) => {
                    let (member, waiter) = entry.joins.swap_remove(index);
                    let assignment = Assignment {
                        member,
                        generation: in_force.generation,
                        partitions: part.partitions.clone(),
                    };
                    answered.push((waiter, assignment));
                }
                None => index += 1,
            }
        }
        if entry.members.is_empty() && entry.joins.is_empty() && in_force.members.is_empty() {
            self.groups.remove(group);
        }
        answered
    }

    /// Drops every waiting join (at shutdown), returning the waiters.
    pub fn drain_joins(&mut self) -> Vec<W> {
        self.groups.values_mut().flat_map(|g| g.joins.drain(..).map(|(_, w)| w)).collect()
    }
}

fn unknown(group: &GroupRef, member: &str) -> Refusal {
    (
        ErrorCode::UnknownMember,
        format!(
            "group {} of {}/{} has no member {member}: join again",
            group.group, group.stream, group.topic
        ),
    )
}

/// A member's part of the assignment in force (empty, with the generation, while it waits to
/// be included).
pub fn assignment_of(catalog: &Catalog, group: &GroupRef, member: &str) -> Assignment {
    let current = catalog
        .topic(&group.stream, &group.topic)
        .ok()
        .and_then(|topic| topic.consumer_groups.get(&group.group));
    Assignment {
        member: member.to_string(),
        generation: current.map_or(0, |g| g.generation),
        partitions: current
            .and_then(|g| g.member(member))
            .map_or(Vec::new(), |part| part.partitions.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::{MetaCommand, TopicSettings};
    use shoal_proto::Durability;

    fn catalog(partitions: u32) -> Catalog {
        let mut catalog = Catalog::new(1, 100);
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let settings = TopicSettings {
            partitions,
            durability: Durability::Replicated,
            retention_bytes: 0,
            retention_ms: 0,
            segment_size_bytes: 1 << 20,
            message_size_bytes_max: 1000,
            replica_lag_time_max_ms: 0,
            replication_factor: 0,
        };
        let create =
            MetaCommand::CreateTopic { stream: "s".into(), topic: "t".into(), settings, nodes: 1 };
        catalog.apply(2, 0, &create).unwrap();
        catalog
    }

    fn group() -> GroupRef {
        GroupRef { stream: "s".into(), topic: "t".into(), group: "g".into() }
    }

    /// Joins and waits, as the shard does.
    fn joined(
        coordinator: &mut Coordinator<u32>,
        member: &str,
        timeout_ms: u32,
        now_ms: i64,
        waiter: u32,
    ) -> String {
        let id = coordinator.join(&group(), member, timeout_ms, now_ms).unwrap();
        coordinator.wait_for_assignment(&group(), id.clone(), waiter);
        id
    }

    /// Proposes what is due and applies it, returning the answered joins.
    fn settle(coordinator: &mut Coordinator<u32>, catalog: &mut Catalog) -> Vec<(u32, Assignment)> {
        let mut answered = Vec::new();
        for (key, command) in coordinator.rebalances_due(catalog) {
            catalog.apply(catalog.applied_op + 1, 0, &command).unwrap();
            let in_force =
                catalog.topic("s", "t").unwrap().consumer_groups.get(&key.group).cloned();
            answered.extend(coordinator.settled(&key, in_force.as_ref()));
        }
        answered
    }

    /// Partitions added to the topic (CreatePartitions) are dealt out in a new generation.
    #[test]
    fn a_grown_topic_is_rebalanced_over_its_new_partitions() {
        let mut catalog = catalog(2);
        let mut coordinator = Coordinator::new("boot".into());
        let a = joined(&mut coordinator, "", 1000, 0, 1);
        assert_eq!(settle(&mut coordinator, &mut catalog)[0].1.partitions, [0, 1]);
        let grow = MetaCommand::AddPartitions {
            stream: "s".into(),
            topic: "t".into(),
            partitions: 3,
            nodes: 1,
        };
        catalog.apply(catalog.applied_op + 1, 0, &grow).unwrap();
        let due = coordinator.rebalances_due(&catalog);
        assert_eq!(due.len(), 1);
        let MetaCommand::Rebalance { generation, members, .. } = &due[0].1 else {
            panic!("{due:?}")
        };
        assert_eq!((*generation, members[0].member.as_str()), (2, a.as_str()));
        assert_eq!(members[0].partitions, [0, 1, 2]);
    }

    #[test]
    fn joins_are_answered_with_their_share_and_every_change_raises_the_generation() {
        let mut catalog = catalog(5);
        let mut coordinator = Coordinator::new("boot".into());
        let a = joined(&mut coordinator, "", 1000, 0, 1);
        let b = joined(&mut coordinator, "", 1000, 0, 2);
        let c = joined(&mut coordinator, "", 1000, 0, 3);
        let mut answered = settle(&mut coordinator, &mut catalog);
        answered.sort_by_key(|(waiter, _)| *waiter);
        let shares: Vec<(String, u64, Vec<u32>)> =
            answered.into_iter().map(|(_, a)| (a.member, a.generation, a.partitions)).collect();
        assert_eq!(
            shares,
            [(a.clone(), 1, vec![0, 3]), (b.clone(), 1, vec![1, 4]), (c.clone(), 1, vec![2])]
        );
        assert!(settle(&mut coordinator, &mut catalog).is_empty(), "nothing changed");
        joined(&mut coordinator, &a, 1000, 0, 7);
        assert!(coordinator.rebalances_due(&catalog).is_empty(), "a rejoin changes nothing");
        let in_force = catalog.topic("s", "t").unwrap().consumer_groups["g"].clone();
        let rejoined = coordinator.answer_joins(&group(), &in_force);
        assert_eq!(rejoined.len(), 1);
        assert_eq!((rejoined[0].0, rejoined[0].1.generation), (7, 1));

        coordinator.leave(&group(), &b).unwrap();
        settle(&mut coordinator, &mut catalog);
        assert_eq!(assignment_of(&catalog, &group(), &a).partitions, [0, 2, 4]);
        assert_eq!(assignment_of(&catalog, &group(), &a).generation, 2);
        assert_eq!(assignment_of(&catalog, &group(), &b).partitions, Vec::<u32>::new());

        // c stops heartbeating; a keeps on.
        coordinator.heartbeat(&group(), &a, 900).unwrap();
        assert_eq!(coordinator.expire(1_500), 1);
        assert_eq!(
            coordinator.heartbeat(&group(), &c, 1_500).unwrap_err().0,
            ErrorCode::UnknownMember
        );
        settle(&mut coordinator, &mut catalog);
        let only = assignment_of(&catalog, &group(), &a);
        assert_eq!((only.generation, only.partitions), (3, vec![0, 1, 2, 3, 4]));
    }

    /// A refused rebalance hands back the joins of members not in the assignment in force, and
    /// drops those members: nothing is due again (the shard once proposed the same rebalance
    /// from inside the refusal, for ever). A join naming an unknown member leaves no group
    /// behind.
    #[test]
    fn a_refused_rebalance_answers_its_new_members_and_leaves_nothing_due() {
        let mut catalog = catalog(2);
        let mut coordinator = Coordinator::new("boot".into());
        let a = joined(&mut coordinator, "", 1000, 0, 1);
        assert_eq!(settle(&mut coordinator, &mut catalog).len(), 1);
        joined(&mut coordinator, "", 1000, 0, 2);
        assert_eq!(coordinator.rebalances_due(&catalog).len(), 1);
        let in_force = catalog.topic("s", "t").unwrap().consumer_groups.get("g").cloned();
        assert_eq!(coordinator.refused(&group(), in_force.as_ref()), vec![2]);
        assert!(coordinator.rebalances_due(&catalog).is_empty(), "the refused member is gone");
        coordinator.heartbeat(&group(), &a, 10).unwrap();
        let other = GroupRef { group: "other".into(), ..group() };
        let unknown = coordinator.join(&other, "nobody", 1000, 0).unwrap_err();
        assert_eq!(unknown.0, ErrorCode::UnknownMember);
        assert!(!coordinator.groups.contains_key(&other), "no entry for an unknown member");
    }

    #[test]
    fn one_rebalance_is_in_flight_at_a_time_and_a_restart_keeps_members_alive_until_they_time_out()
    {
        let mut catalog = catalog(2);
        let mut coordinator = Coordinator::new("boot1".into());
        let a = joined(&mut coordinator, "", 1000, 0, 1);
        let due = coordinator.rebalances_due(&catalog);
        assert_eq!(due.len(), 1);
        joined(&mut coordinator, "", 1000, 0, 2);
        assert!(coordinator.rebalances_due(&catalog).is_empty(), "one in flight");
        // The first fails to commit: the next proposal covers both members.
        coordinator.settled(&group(), None);
        assert_eq!(settle(&mut coordinator, &mut catalog).len(), 2);

        let mut restarted: Coordinator<u32> = Coordinator::new("boot2".into());
        restarted.seed(&catalog, 10_000);
        assert!(restarted.rebalances_due(&catalog).is_empty(), "the members in force are alive");
        restarted.heartbeat(&group(), &a, 10_500).unwrap();
        assert_eq!(restarted.expire(11_200), 1);
        settle(&mut restarted, &mut catalog);
        assert_eq!(assignment_of(&catalog, &group(), &a).partitions, [0, 1]);
        let fresh = joined(&mut restarted, "", 1000, 11_300, 9);
        assert!(fresh.starts_with("boot2-"), "ids never repeat across starts: {fresh}");
    }

    #[test]
    fn bounds_are_enforced() {
        let mut coordinator: Coordinator<u32> = Coordinator::new("b".into());
        assert_eq!(coordinator.join(&group(), "", 1, 0).unwrap_err().0, ErrorCode::InvalidArgument);
        assert_eq!(
            coordinator.join(&group(), "nobody", 1000, 0).unwrap_err().0,
            ErrorCode::UnknownMember
        );
        for waiter in 0..GROUP_MEMBERS_MAX as u32 {
            joined(&mut coordinator, "", 1000, 0, waiter);
        }
        assert_eq!(coordinator.join(&group(), "", 1000, 0).unwrap_err().0, ErrorCode::LimitReached);
        // Members whose joins were never answered and who never heartbeat take their joins
        // with them, so the bound frees up.
        assert_eq!(coordinator.expire(5_000), GROUP_MEMBERS_MAX);
        assert!(coordinator.drain_joins().is_empty());
    }
}
