//! The partition balancer (`docs/cluster.md`, "The balancer"), like Redpanda's partition
//! balancer: the one move that brings the active nodes' replica counts closer, while they
//! differ by more than one. Each move is an ordinary `Move` of one partition, so it runs (and
//! can be cancelled) as any operator's move does; the balancer waits for every move in progress
//! to end before it picks the next, so it never has more than one in flight and never competes
//! with an operator's or a node removal's.
//!
//! Primaries follow: a group's home is one of its voters chosen by its id (placement spreads
//! them), and a primary that led away from home hands back once the home is in sync.
//!
//! A pure function of the catalog: it never proposes anything itself (shard 0 of the metadata
//! primary does, `shard::moves`), and two nodes asking of the same catalog get the same move.

use shoal_proto::protocol::MoveAction;

use crate::metadata::Catalog;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ClusterNode;
    use crate::metadata::tests::settings;
    use crate::metadata::{MetaCommand, MetaState, TopicSettings};

    /// Three nodes holding six one-replica partitions, two each; node 3 is added: the balancer
    /// moves one partition at a time onto it (waiting while one is moving) until every node
    /// holds within one of every other, and then proposes nothing.
    #[test]
    fn the_balancer_evens_replica_counts_one_move_at_a_time() {
        let mut state = MetaState::new(1, 100, 8);
        let catalog = &mut state.catalog;
        catalog.apply(1, 0, &MetaCommand::CreateStream { name: "s".into() }).unwrap();
        let create = MetaCommand::CreateTopic {
            stream: "s".into(),
            topic: "t".into(),
            settings: TopicSettings { replication_factor: 1, ..settings(6) },
            nodes: 3,
        };
        catalog.apply(2, 0, &create).unwrap();
        assert_eq!(next_move(catalog, 3), None, "two partitions each");
        let address = ClusterNode {
            bus: "10.0.0.4:7200".parse().unwrap(),
            client: "10.0.0.4:7070".parse().unwrap(),
            kafka: None,
            rack: None,
        };
        catalog.apply(3, 0, &MetaCommand::AddNode { node: 3, address, founders: 3 }).unwrap();
        let mut op = 3;
        let mut moves = 0;
        while let Some(next) = next_move(catalog, 3) {
            let BalancingMove { stream, topic, partition, action } = next;
            let MoveAction::Start { voters } = action else { panic!("{action:?}") };
            assert_eq!(voters, 1 << 3, "onto the new node");
            let start = MetaCommand::Move {
                stream: stream.clone(),
                topic: topic.clone(),
                partition,
                action,
                nodes: 3,
            };
            op += 1;
            catalog.apply(op, 0, &start).unwrap();
            assert_eq!(next_move(catalog, 3), None, "one move at a time");
            let done = MoveAction::Done { voters };
            op += 1;
            catalog
                .apply(
                    op,
                    0,
                    &MetaCommand::Move { stream, topic, partition, action: done, nodes: 3 },
                )
                .unwrap();
            moves += 1;
        }
        assert_eq!(moves, 1, "2, 2, 2, 0 becomes 1, 2, 2, 1");
        let load = &catalog.replica_load()[..4];
        assert!(load.iter().max().unwrap() - load.iter().min().unwrap() <= 1, "{load:?}");
    }
}
