//! The classic group protocol as two or three members live it: ids, joins, the leader's
//! assignment, rebalances on arrival, departure and session expiry, and who may commit.

use super::*;

/// Waiters are numbers: the test reads which request each answer is for.
type Groups = KafkaGroups<u32>;

fn groups() -> Groups {
    KafkaGroups::new("p".into(), 0)
}

fn join(member: &str, protocols: &[&str]) -> Join {
    Join {
        group: "g".into(),
        member_id: member.into(),
        client_id: "client".into(),
        session_timeout_ms: 10_000,
        rebalance_timeout_ms: 30_000,
        protocol_type: "consumer".into(),
        protocols: protocols
            .iter()
            .map(|name| (name.to_string(), Bytes::from(format!("meta-{name}"))))
            .collect(),
        require_known_member_id: true,
    }
}

fn joined(answers: Vec<(u32, GroupAnswer)>) -> Vec<(u32, JoinAnswer)> {
    answers
        .into_iter()
        .map(|(w, a)| match a {
            GroupAnswer::Join(join) => (w, join),
            other => panic!("not a join answer: {other:?}"),
        })
        .collect()
}

fn synced(answers: Vec<(u32, GroupAnswer)>) -> Vec<(u32, SyncAnswer)> {
    answers
        .into_iter()
        .map(|(w, a)| match a {
            GroupAnswer::Sync(sync) => (w, sync),
            other => panic!("not a sync answer: {other:?}"),
        })
        .collect()
}

fn sync(
    member: &str,
    generation: i32,
    protocol_type: Option<String>,
    protocol_name: Option<String>,
    assignments: Vec<(String, Bytes)>,
) -> Sync {
    Sync {
        group: "g".into(),
        member_id: member.into(),
        generation,
        protocol_type,
        protocol_name,
        assignments,
    }
}

/// A new member's two-step join (v4+): its id, then the join itself. Returns the id; the
/// join's answer stays in `groups` when it has to wait.
fn first_join(groups: &mut Groups, waiter: u32, now_ms: i64) -> String {
    groups.join(join("", &["range"]), now_ms, waiter);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 1);
    let (_, answer) = &answers[0];
    assert_eq!(answer.error, Some(ResponseError::MemberIdRequired));
    assert!(answer.member_id.starts_with("client-p-"), "{}", answer.member_id);
    let id = answer.member_id.clone();
    groups.join(join(&id, &["range"]), now_ms, waiter);
    id
}

#[test]
fn one_member_joins_leads_and_gets_its_own_assignment() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 1);
    let (waiter, answer) = &answers[0];
    assert_eq!(*waiter, 1);
    assert_eq!(answer.error, None);
    assert_eq!(answer.generation, 1);
    assert_eq!(answer.leader, a);
    assert_eq!(answer.protocol_name.as_deref(), Some("range"));
    assert_eq!(answer.members, vec![(a.clone(), Bytes::from("meta-range"))]);

    groups.sync(
        sync(&a, 1, Some("consumer".into()), Some("range".into()), vec![(a.clone(), "A".into())]),
        0,
        2,
    );
    let answers = synced(groups.take_answers());
    assert_eq!(
        answers,
        vec![(
            2,
            SyncAnswer {
                error: None,
                protocol_type: Some("consumer".into()),
                protocol_name: Some("range".into()),
                assignment: Bytes::from("A"),
            }
        )]
    );
    assert_eq!(groups.heartbeat("g", &a, 1, 5_000), None);
    assert_eq!(groups.check_commit("g", &a, 1), None);
    assert_eq!(groups.describe("g").unwrap().state, GroupState::Stable);
}

#[test]
fn a_second_member_makes_the_first_rejoin_and_both_get_the_leaders_assignment() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    groups.sync(sync(&a, 1, None, None, vec![(a.clone(), "all".into())]), 0, 2);
    groups.take_answers();

    let b = first_join(&mut groups, 3, 100);
    assert!(groups.take_answers().is_empty(), "b waits for a to rejoin");
    assert_eq!(groups.heartbeat("g", &a, 1, 200), Some(ResponseError::RebalanceInProgress));
    // A commit during the rebalance, under the old generation, is still a's (Kafka lets a
    // member commit as its partitions are revoked).
    assert_eq!(groups.check_commit("g", &a, 1), None);
    groups.join(join(&a, &["range"]), 300, 4);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 2);
    for (_, answer) in &answers {
        assert_eq!(answer.generation, 2);
        assert_eq!(answer.leader, a, "the leader stays the leader");
    }
    let leader = answers.iter().find(|(w, _)| *w == 4).unwrap();
    assert_eq!(leader.1.members.len(), 2);
    let follower = answers.iter().find(|(w, _)| *w == 3).unwrap();
    assert!(follower.1.members.is_empty());
    assert_eq!(groups.check_commit("g", &a, 2), Some(ResponseError::RebalanceInProgress));

    // The follower syncs first and waits; the leader's sync answers both.
    groups.sync(sync(&b, 2, None, None, Vec::new()), 400, 5);
    assert!(groups.take_answers().is_empty());
    groups.sync(
        sync(&a, 2, None, None, vec![(a.clone(), "p0".into()), (b.clone(), "p1".into())]),
        400,
        6,
    );
    let mut answers = synced(groups.take_answers());
    answers.sort_by_key(|(w, _)| *w);
    assert_eq!(answers[0].0, 5);
    assert_eq!(answers[0].1.assignment, Bytes::from("p1"));
    assert_eq!(answers[1].0, 6);
    assert_eq!(answers[1].1.assignment, Bytes::from("p0"));
    assert_eq!(groups.check_commit("g", &b, 2), None);
    assert_eq!(groups.check_commit("g", &b, 1), Some(ResponseError::IllegalGeneration));
}

#[test]
fn a_member_that_leaves_or_goes_silent_is_rebalanced_away() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    let b = first_join(&mut groups, 2, 0);
    groups.join(join(&a, &["range"]), 0, 3);
    groups.take_answers();
    groups.sync(sync(&a, 2, None, None, Vec::new()), 0, 4);
    groups.sync(sync(&b, 2, None, None, Vec::new()), 0, 5);
    assert_eq!(groups.take_answers().len(), 2);

    // b leaves: a is told to rejoin, and rejoins alone into generation 3.
    assert_eq!(groups.leave("g", std::slice::from_ref(&b), 100), vec![None]);
    assert_eq!(groups.heartbeat("g", &a, 2, 100), Some(ResponseError::RebalanceInProgress));
    groups.join(join(&a, &["range"]), 100, 6);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].1.generation, 3);
    assert_eq!(groups.heartbeat("g", &b, 3, 100), Some(ResponseError::UnknownMemberId));
    groups.sync(sync(&a, 3, None, None, Vec::new()), 100, 7);
    groups.take_answers();

    // a falls silent: one session later it is gone and the group is forgotten (empty), so a
    // commit outside group management is allowed again and a's is not.
    groups.tick(100 + 10_000);
    assert!(groups.describe("g").is_some(), "a session is not over at its last millisecond");
    groups.tick(100 + 10_001);
    assert_eq!(groups.describe("g"), None);
    assert_eq!(groups.check_commit("g", "", -1), None);
    assert_eq!(groups.check_commit("g", &a, 3), Some(ResponseError::IllegalGeneration));
}

#[test]
fn a_member_that_does_not_rejoin_in_time_is_dropped_from_the_new_generation() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    groups.sync(sync(&a, 1, None, None, Vec::new()), 0, 2);
    groups.take_answers();
    let _b = first_join(&mut groups, 3, 1_000);
    // a keeps heartbeating (each says "rejoin") but never rejoins: the rebalance completes at
    // its deadline, the longest rebalance timeout, with b alone.
    for now in (2_000..31_000).step_by(2_000) {
        assert_eq!(groups.heartbeat("g", &a, 1, now), Some(ResponseError::RebalanceInProgress));
        groups.tick(now);
        assert!(groups.take_answers().is_empty(), "at {now}");
    }
    groups.tick(31_000);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].0, 3);
    assert_eq!(answers[0].1.generation, 2);
    assert_eq!(groups.heartbeat("g", &a, 1, 31_000), Some(ResponseError::UnknownMemberId));
}

#[test]
fn a_new_group_waits_the_initial_delay_for_more_members() {
    let mut groups: Groups = KafkaGroups::new("p".into(), 3_000);
    let _a = first_join(&mut groups, 1, 0);
    let _b = first_join(&mut groups, 2, 1_000);
    groups.tick(2_999);
    assert!(groups.take_answers().is_empty());
    groups.tick(3_000);
    let answers = joined(groups.take_answers());
    assert_eq!(answers.len(), 2, "both in the first generation");
    assert!(answers.iter().all(|(_, a)| a.generation == 1));
}

#[test]
fn protocols_are_chosen_by_vote_among_those_every_member_supports() {
    let mut groups = groups();
    let mut j = join("", &["cooperative-sticky", "range"]);
    j.require_known_member_id = false;
    groups.join(j.clone(), 0, 1);
    let a = joined(groups.take_answers())[0].1.member_id.clone();
    groups.sync(sync(&a, 1, None, None, Vec::new()), 0, 2);
    groups.take_answers();
    // b supports only range: range is the one both support.
    let mut jb = join("", &["range"]);
    jb.require_known_member_id = false;
    groups.join(jb, 0, 3);
    groups.join(join(&a, &["cooperative-sticky", "range"]), 0, 4);
    let answers = joined(groups.take_answers());
    assert!(answers.iter().all(|(_, a)| a.protocol_name.as_deref() == Some("range")));
    // c shares nothing with them.
    let mut jc = join("", &["roundrobin"]);
    jc.require_known_member_id = false;
    groups.join(jc, 0, 5);
    let answers = joined(groups.take_answers());
    assert_eq!(answers[0].1.error, Some(ResponseError::InconsistentGroupProtocol));
}

#[test]
fn bad_joins_are_refused_with_kafkas_errors() {
    let mut groups = groups();
    let mut bad = join("", &["range"]);
    bad.session_timeout_ms = 10;
    groups.join(bad, 0, 1);
    let mut unknown = join("nobody", &["range"]);
    unknown.group = "other".into();
    groups.join(unknown, 0, 2);
    let mut empty = join("", &["range"]);
    empty.group = String::new();
    groups.join(empty, 0, 3);
    let mut none = join("", &[]);
    none.group = "h".into();
    groups.join(none, 0, 4);
    // Outside the name rule: its offsets could never be stored under it.
    for (waiter, name) in [(5, "billing app"), (6, &"g".repeat(250)[..]), (7, "..")] {
        let mut unnamed = join("", &["range"]);
        unnamed.group = name.into();
        groups.join(unnamed, 0, waiter);
    }
    let errors: Vec<_> =
        joined(groups.take_answers()).into_iter().map(|(w, a)| (w, a.error)).collect();
    assert_eq!(
        errors,
        vec![
            (1, Some(ResponseError::InvalidSessionTimeout)),
            (2, Some(ResponseError::UnknownMemberId)),
            (3, Some(ResponseError::InvalidGroupId)),
            (4, Some(ResponseError::InconsistentGroupProtocol)),
            (5, Some(ResponseError::InvalidGroupId)),
            (6, Some(ResponseError::InvalidGroupId)),
            (7, Some(ResponseError::InvalidGroupId)),
        ]
    );
    assert!(groups.list().is_empty(), "refusals leave no group behind");
    assert_eq!(groups.check_commit("g", "x", 3), Some(ResponseError::IllegalGeneration));
}

#[test]
fn a_group_holds_at_most_its_member_bound() {
    let mut groups = groups();
    for waiter in 0..GROUP_MEMBERS_MAX as u32 {
        groups.join(join("", &["range"]), 0, waiter);
    }
    let answers = joined(groups.take_answers());
    assert!(answers.iter().all(|(_, a)| a.error == Some(ResponseError::MemberIdRequired)));
    groups.join(join("", &["range"]), 0, 9_999);
    let answers = joined(groups.take_answers());
    assert_eq!(answers[0].1.error, Some(ResponseError::GroupMaxSizeReached));
    // Ids handed out and never used expire after a session.
    groups.tick(10_001);
    assert!(groups.list().is_empty());
}

#[test]
fn a_stopping_coordinator_hands_back_every_waiter() {
    let mut groups = groups();
    let _a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    let _b = first_join(&mut groups, 2, 0);
    let waiters = groups.drain_waiters();
    assert_eq!(waiters, vec![2]);
    assert!(groups.list().is_empty());
}

/// What members hold is bounded as a whole: a join that would pass the bound is refused,
/// and what leaving members held is free again.
#[test]
fn members_hold_at_most_the_byte_bound() {
    // One member of `join("", ["range"])` holds its id, its client id, "range" and its
    // metadata: find that size, then allow exactly two such members.
    let mut probe = groups();
    let a = first_join(&mut probe, 1, 0);
    let one = a.len() + "client".len() + "range".len() + "meta-range".len();
    let mut groups = groups().with_held_bytes_max(2 * one);
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    let b = first_join(&mut groups, 2, 0);
    groups.join(join(&a, &["range"]), 0, 3);
    assert_eq!(joined(groups.take_answers()).len(), 2, "two fit");
    groups.join(join("", &["range"]), 0, 4);
    let third = joined(groups.take_answers()).remove(0).1;
    assert_eq!(third.error, Some(ResponseError::MemberIdRequired));
    groups.join(join(&third.member_id, &["range"]), 0, 5);
    let refused = joined(groups.take_answers());
    assert_eq!(refused[0].1.error, Some(ResponseError::GroupMaxSizeReached), "{refused:?}");
    // b leaves: a third member fits again.
    assert_eq!(groups.leave("g", std::slice::from_ref(&b), 0), vec![None]);
    groups.join(join("", &["range"]), 0, 6);
    let id = joined(groups.take_answers()).remove(0).1.member_id;
    groups.join(join(&id, &["range"]), 0, 7);
    groups.join(join(&a, &["range"]), 0, 8);
    let answers = joined(groups.take_answers());
    assert!(answers.iter().all(|(_, answer)| answer.error.is_none()), "{answers:?}");
}

/// A leader's assignments count against the same bound: a sync that would pass it is
/// refused, and nothing of it is kept.
#[test]
fn a_leaders_assignments_past_the_byte_bound_are_refused() {
    let mut probe = groups();
    let a = first_join(&mut probe, 1, 0);
    let one = a.len() + "client".len() + "range".len() + "meta-range".len();
    let mut groups = groups().with_held_bytes_max(one + 100);
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    let big = Bytes::from(vec![b'x'; 101]);
    let leader_sync = |assignment: Bytes| {
        sync(&a, 1, Some("consumer".into()), Some("range".into()), vec![(a.clone(), assignment)])
    };
    groups.sync(leader_sync(big), 0, 2);
    let refused = synced(groups.take_answers());
    assert_eq!(refused.len(), 1);
    assert_eq!(refused[0].1.error, Some(ResponseError::GroupMaxSizeReached));
    assert_eq!(groups.describe("g").unwrap().state, GroupState::CompletingRebalance);
    // Within the bound, the same leader's sync is taken.
    groups.sync(leader_sync(Bytes::from(vec![b'x'; 100])), 0, 3);
    let taken = synced(groups.take_answers());
    assert_eq!(taken[0].1.error, None);
    assert_eq!(taken[0].1.assignment.len(), 100);
}

/// A completed rebalance is handed out to be stored — the members with their metadata for the
/// chosen protocol and their assignments — and the group's end (the last member leaves) too;
/// a coordinator that loads it serves the stored generation as if nothing had happened.
#[test]
fn completed_rebalances_are_stored_and_a_new_coordinator_takes_them_up() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    assert!(groups.take_stores().is_empty(), "nothing before the leader's assignment");
    groups.sync(sync(&a, 1, None, None, vec![(a.clone(), "A".into())]), 0, 2);
    groups.take_answers();
    let stores = groups.take_stores();
    let expected = StoredGroup {
        group: "g".into(),
        generation: 1,
        protocol_type: "consumer".into(),
        protocol: "range".into(),
        leader: a.clone(),
        members: vec![StoredMember {
            id: a.clone(),
            client_id: "client".into(),
            session_timeout_ms: 10_000,
            rebalance_timeout_ms: 30_000,
            metadata: Bytes::from("meta-range"),
            assignment: Bytes::from("A"),
        }],
    };
    assert_eq!(stores, vec![expected.clone()]);
    // Its bytes read back as written, and a cut record is refused.
    let mut w = Writer::new();
    expected.write(&mut w);
    let bytes = w.finish();
    assert_eq!(StoredGroup::read(&mut Reader::new(&bytes)).unwrap(), expected);
    for len in 0..bytes.len() {
        assert!(StoredGroup::read(&mut Reader::new(&bytes[..len])).is_err(), "cut at {len}");
    }

    // Another coordinator (another prefix) loads it: the member goes on in generation 1.
    let mut taken_up = KafkaGroups::<u32>::new("q".into(), 0);
    taken_up.load([&expected], 50_000);
    assert_eq!(taken_up.heartbeat("g", &a, 1, 55_000), None);
    assert_eq!(taken_up.check_commit("g", &a, 1), None);
    assert_eq!(taken_up.check_commit("g", &a, 2), Some(ResponseError::IllegalGeneration));
    assert_eq!(
        taken_up.heartbeat("g", "someone-else", 1, 55_000),
        Some(ResponseError::UnknownMemberId)
    );
    taken_up.sync(sync(&a, 1, None, None, Vec::new()), 55_000, 7);
    assert_eq!(synced(taken_up.take_answers())[0].1.assignment, Bytes::from("A"));
    let described = taken_up.describe("g").unwrap();
    assert_eq!((described.state, described.protocol.as_str()), (GroupState::Stable, "range"));
    assert!(taken_up.take_stores().is_empty(), "loading stores nothing");
    // Its session runs from the load: silent past it, the member is gone, and so is the group,
    // whose end is stored.
    taken_up.tick(55_000 + 10_001);
    assert!(taken_up.list().is_empty());
    let ended = taken_up.take_stores();
    assert_eq!(ended.len(), 1);
    assert_eq!((ended[0].group.as_str(), ended[0].members.len()), ("g", 0));

    // On the first coordinator, the member leaving ends the group the same way.
    assert_eq!(groups.leave("g", std::slice::from_ref(&a), 100), vec![None]);
    let ended = groups.take_stores();
    assert_eq!((ended.len(), ended[0].members.len()), (1, 0));
}

/// A group that never completed a rebalance was never stored, so its end is not either.
#[test]
fn a_group_never_stored_stores_no_end() {
    let mut groups = groups();
    let a = first_join(&mut groups, 1, 0);
    groups.take_answers();
    assert_eq!(groups.leave("g", std::slice::from_ref(&a), 10), vec![None]);
    assert!(groups.take_stores().is_empty());
}
