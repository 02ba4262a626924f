//! The partition balancer (`docs/cluster.md`, "The balancer"), like Redpanda's partition
//! balancer: the one move that brings the active nodes' replica counts closer, while they
//! differ by more than one. Each move is an ordinary `Move` of one partition, so it runs (and
//! can be cancelled) as any operator's move does; the balancer waits for every move in progress
//! to end before it picks the next, so it never has more than one in flight and never competes
//! with an operator's or a node removal's.
//!
//! Primaries follow, like Redpanda's leader balancer: a group's home is one of its voters chosen
//! by its id (placement spreads them), and a primary that led away hands back once the home is
//! in sync. Moves can leave the homes uneven, so once the replica counts are even the balancer
//! evens out the *preferred primaries* (the home, or the voter it preferred instead): while the
//! active nodes' counts differ by more than one, it prefers a partition's voter on the node with
//! the fewest over one on the node with the most. The group's primary hands it over there once
//! that voter is in sync, as it hands back home.
//!
//! A pure function of the catalog: it never proposes anything itself (shard 0 of the metadata
//! primary does, `shard::moves`), and two nodes asking of the same catalog get the same move.

use shoal_proto::protocol::MoveAction;

use crate::metadata::{Catalog, PartitionPlace};

/// One balancing move: a partition and the voters it moves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BalancingMove {
    pub stream: String,
    pub topic: String,
    pub partition: u32,
    pub action: MoveAction,
}

/// The next balancing move on a cluster founded by `founders` nodes, if any: `None` while a
/// move is in progress, with fewer than two active nodes, or once every active node holds
/// within one replica of every other. Otherwise one replica of the partition (first in catalog
/// order) that the most loaded node holds and the least loaded does not moves from the one to
/// the other (ties: the lowest index).
pub fn next_move(catalog: &Catalog, founders: u8) -> Option<BalancingMove> {
    if catalog.places().any(|place| !place.target.is_empty()) {
        return None;
    }
    let active = catalog.nodes.active(founders);
    if active.count_ones() < 2 {
        return None;
    }
    // No move is in progress: every partition is where its members are.
    let load = catalog.replica_load();
    let nodes = || (0..32u8).filter(|&n| active & (1 << n) != 0);
    let most = nodes().max_by_key(|&n| (load[usize::from(n)], u8::MAX - n))?;
    let least = nodes().min_by_key(|&n| (load[usize::from(n)], n))?;
    if load[usize::from(most)] <= load[usize::from(least)] + 1 {
        return None;
    }
    for (stream_name, stream) in &catalog.streams {
        for (topic_name, topic) in &stream.topics {
            for (partition, place) in topic.partitions.iter().enumerate() {
                let voters = place.members.voters;
                if place.members.is_member(most) && !place.members.is_member(least) {
                    return Some(BalancingMove {
                        stream: stream_name.clone(),
                        topic: topic_name.clone(),
                        partition: partition as u32,
                        action: MoveAction::Start { voters: voters & !(1 << most) | (1 << least) },
                    });
                }
            }
        }
    }
    None
}

/// The next preferred-primary change on a cluster founded by `founders` nodes, if any: `None`
/// while a move is in progress or replica counts are uneven ([`next_move`] goes first), with
/// fewer than two active nodes, or once every active node is the preferred primary of within one
/// partition of every other (partitions with one voter are where they are and count for
/// nobody). Otherwise the first partition (catalog order) whose preferred primary is on the
/// node with the most and that has a voter on the node with the fewest: (its group, that node).
pub fn next_primary(catalog: &Catalog, founders: u8) -> Option<(u64, u8)> {
    if catalog.places().any(|place| !place.target.is_empty())
        || next_move(catalog, founders).is_some()
    {
        return None;
    }
    let active = catalog.nodes.active(founders);
    if active.count_ones() < 2 {
        return None;
    }
    let shared = |place: &&PartitionPlace| place.members.voter_count() > 1;
    let mut led = [0u32; 32];
    for place in catalog.places().filter(shared) {
        led[usize::from(place.preferred_primary(founders))] += 1;
    }
    let nodes = || (0..32u8).filter(|&n| active & (1 << n) != 0);
    let most = nodes().max_by_key(|&n| (led[usize::from(n)], u8::MAX - n))?;
    let least = nodes().min_by_key(|&n| (led[usize::from(n)], n))?;
    if led[usize::from(most)] <= led[usize::from(least)] + 1 {
        return None;
    }
    catalog
        .places()
        .filter(shared)
        .find(|place| place.preferred_primary(founders) == most && place.members.is_voter(least))
        .map(|place| (place.group, least))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterNode;
    use crate::metadata::tests::settings;
    use crate::metadata::{MetaCommand, MetaState, TopicSettings};
    use shoal_proto::protocol::ErrorCode;

    /// A catalog of three founding nodes holding topic `s/t` (`partitions` partitions of
    /// `factor` replicas each), to which node 3 is then added; returns it and its last op.
    fn three_nodes_then_a_fourth(factor: u8, partitions: u32) -> (MetaState, u64) {
        let mut state = MetaState::new(1, 100, 8);
        let catalog = &mut state.catalog;
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let create = MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            settings: TopicSettings { replication_factor: factor, ..settings(partitions) },
            nodes: 3,
        };
        catalog.apply(2, 0, &create).unwrap();
        assert_eq!(next_move(catalog, 3), None, "even over three nodes");
        assert_eq!(next_primary(catalog, 3), None, "homes spread over three nodes");
        let address = ClusterNode {
            bus: "10.0.0.4:7200".parse().unwrap(),
            client: "10.0.0.4:7070".parse().unwrap(),
            kafka: None,
            rack: None,
        };
        catalog.apply(3, 0, &MetaCommand::AddNode { node: 3, address, founders: 3 }).unwrap();
        (state, 3)
    }

    /// Applies a move's `action` to partition `partition` of `s/t` as op `op + 1`.
    fn apply_move(catalog: &mut Catalog, op: &mut u64, partition: u32, action: MoveAction) {
        *op += 1;
        let (stream, topic) = ("s".to_string(), "t".to_string());
        let command = MetaCommand::Move { stream, topic, partition, action, nodes: 3 };
        catalog.apply(*op, 0, &command).unwrap();
    }

    /// Three nodes holding six one-replica partitions, two each; node 3 is added: the balancer
    /// moves one partition at a time onto it (waiting while one is moving) until every node
    /// holds within one of every other, and then proposes nothing.
    #[test]
    fn the_balancer_evens_replica_counts_one_move_at_a_time() {
        let (mut state, mut op) = three_nodes_then_a_fourth(1, 6);
        let catalog = &mut state.catalog;
        let mut moves = 0;
        while let Some(BalancingMove { partition, action, .. }) = next_move(catalog, 3) {
            let MoveAction::Start { voters } = action else { panic!("{action:?}") };
            assert_eq!(voters, 1 << 3, "onto the new node");
            apply_move(catalog, &mut op, partition, action);
            assert_eq!(next_move(catalog, 3), None, "one move at a time");
            apply_move(catalog, &mut op, partition, MoveAction::Done { voters });
            moves += 1;
        }
        assert_eq!(moves, 1, "2, 2, 2, 0 becomes 1, 2, 2, 1");
        let load = &catalog.replica_load()[..4];
        assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= 1, "{load:?}");
        assert_eq!(next_primary(catalog, 3), None, "one voter each: nothing to hand over");
    }

    /// Twelve three-replica partitions placed over three nodes; node 3 is added and given
    /// replicas by the balancer's moves, which leave it the home of too few. Once the replica
    /// counts are even, the preferred primaries are evened out one change at a time, each to a
    /// voter, and then nothing more is proposed. A snapshot keeps the preferences; a preference
    /// for a non-voter is refused, and a move that takes the preferred node off the voters
    /// clears it.
    #[test]
    fn the_balancer_evens_preferred_primaries_once_replicas_are_even() {
        let (mut state, mut op) = three_nodes_then_a_fourth(3, 12);
        let catalog = &mut state.catalog;
        while let Some(BalancingMove { partition, action, .. }) = next_move(catalog, 3) {
            let MoveAction::Start { voters } = action else { panic!("{action:?}") };
            apply_move(catalog, &mut op, partition, action);
            apply_move(catalog, &mut op, partition, MoveAction::Done { voters });
        }
        let mut changes = 0;
        while let Some((group, node)) = next_primary(catalog, 3) {
            let place = catalog.place_of(group).unwrap();
            assert!(place.members.is_voter(node), "only a voter is preferred");
            op += 1;
            let prefer = MetaCommand::PreferPrimary { group, node: Some(node) };
            assert_eq!(MetaCommand::decode(&prefer.encode()), Ok(prefer.clone()));
            catalog.apply(op, 0, &prefer).unwrap();
            changes += 1;
            assert!(changes <= 12, "the changes converge");
        }
        assert!(changes > 0, "node 3 led nothing after the moves");
        let mut led = [0u32; 4];
        for place in catalog.places() {
            led[usize::from(place.preferred_primary(3))] += 1;
        }
        assert!(led.iter().max().unwrap() - led.iter().min().unwrap() <= 1, "{led:?}");
        let restored = MetaState::decode_snapshot(&state.encode_snapshot(), 1, 100, 8).unwrap();
        assert_eq!(restored.catalog, state.catalog, "a snapshot keeps the preferences");

        let catalog = &mut state.catalog;
        let (group, node) = catalog
            .places()
            .find_map(|p| p.preferred.map(|node| (p.group, node)))
            .expect("a preference");
        let outsider = (0..4).find(|&n| !catalog.place_of(group).unwrap().members.is_voter(n));
        let refused = MetaCommand::PreferPrimary { group, node: outsider };
        assert_eq!(catalog.check(&refused).unwrap_err().0, ErrorCode::InvalidArgument);
        let partition = catalog
            .partition_infos()
            .into_iter()
            .find_map(|(_, _, info)| (info.group == group).then_some(info.partition))
            .unwrap();
        let members = catalog.place_of(group).unwrap().members.voters;
        let voters = members & !(1 << node) | 1 << outsider.unwrap();
        apply_move(catalog, &mut op, partition, MoveAction::Start { voters });
        apply_move(catalog, &mut op, partition, MoveAction::Done { voters });
        assert_eq!(catalog.place_of(group).unwrap().preferred, None);
    }
}
