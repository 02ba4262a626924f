//! The node layer's own tests, on one node over the simulated disk: repair rationing, the
//! bounds on peers' reads and held messages, flush cycles overlapping rounds and checkpoints,
//! a full disk, packets refused, and producer snapshots at restart.

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use shoal_engine::shard::ShardConfig;
use shoal_engine::storage::sim::{Sim, SimConfig, SimStorage};
use shoal_engine::superblock::GroupConfig;
use shoal_proto::wire::{CommitEntry, HEADER_SIZE};

use super::{Clock, Node, NodeConfig, RequestRefused, SavedProducers, Transport};
use crate::codec::{self, CodecLimits, DecodeError};
use crate::config::{Membership, ReplicaConfig};
use crate::message::{Message, ReplyResult, Request};

#[derive(Default)]
struct Sent(Vec<(u8, Bytes)>);

impl Transport for Sent {
    fn send(&mut self, to: u8, packet: Bytes) {
        self.0.push((to, packet));
    }
}

struct Zero;

impl Clock for Zero {
    fn now_ms(&self) -> i64 {
        0
    }
}

fn node(sim: &Sim, held_messages_max: usize) -> Node<SimStorage, Sent, Zero> {
    let config =
        NodeConfig { held_messages_max, ..NodeConfig::new(0, ReplicaConfig::new(1, 0, 3, 0)) };
    let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
    let open = Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
    let (mut node, _) = sim.block_on(open).unwrap();
    // Group 1: the primary of view 0 is node 1, so node 0 is a backup that will vote.
    sim.block_on(node.create_group(1, small_group())).unwrap();
    node
}

/// The tests' partition group: 1 MiB segments, records of at most 4 KiB.
fn small_group() -> GroupConfig {
    GroupConfig {
        segment_size_bytes: 1 << 20,
        record_size_bytes_max: 4096,
        ..GroupConfig::default()
    }
}

/// DESIGN.md §4 ("repair is rationed so it never starves client traffic"): five groups of a
/// backup node learn at once that they are far behind. The node lets at most
/// `repair_rounds_per_tick_max` of them start a round per tick and keeps at most
/// `repair_rounds_in_flight_max` rounds in flight; each round goes to one peer; the groups
/// still waiting get their turn once rounds time out.
#[test]
fn repair_rounds_are_rationed_per_tick_and_in_flight() {
    let sim = Sim::new(2, SimConfig::default());
    let mut node = node(&sim, 64);
    node.config.repair_rounds_per_tick_max = 2;
    node.config.repair_rounds_in_flight_max = 3;
    five_groups_behind(&sim, &mut node);
    let limits = CodecLimits {
        message_size_bytes_max: 1 << 20,
        view_headers_max: 128,
        commit_entries_max: 8,
    };
    let mut rounds_per_tick = Vec::new();
    let mut rounds_of: BTreeMap<u64, usize> = BTreeMap::new();
    for tick in 0..8 {
        node.transport.0.clear();
        node.on_tick();
        let mut asked: BTreeMap<u64, u8> = BTreeMap::new();
        for (to, packet) in &node.transport.0 {
            let (_, messages) =
                codec::decode(node.config.replica.cluster, packet, &limits).unwrap();
            for (group, message) in messages {
                if matches!(message, Message::RequestPrepare { .. }) {
                    let previous = asked.insert(group, *to);
                    assert!(previous.is_none_or(|p| p == *to), "a round asks one peer");
                    // The first round asks the primary; one that brought nothing makes the
                    // next ask the other peer.
                    let primary = (group % 3) as u8;
                    let first = rounds_of.get(&group).is_none_or(|&n| n == 0);
                    let expected = if first { primary } else { 3 - primary };
                    assert_eq!(*to, expected, "tick {tick} group {group}");
                }
            }
        }
        for group in asked.keys() {
            *rounds_of.entry(*group).or_default() += 1;
        }
        rounds_per_tick.push(asked.len());
    }
    // 2 on the first tick, 1 more (3 in flight), none until rounds time out after the
    // repair interval (5 ticks), then the next groups' turn.
    assert_eq!(&rounds_per_tick[..5], &[2, 1, 0, 0, 0], "{rounds_per_tick:?}");
    assert!(rounds_per_tick[5..].iter().sum::<usize>() >= 2, "{rounds_per_tick:?}");
    let counters = node.counters();
    assert!(counters.repair_rounds_deferred >= 3, "{counters:?}");
}

/// Node 0 as a backup of five groups (those whose primary in view 0, `g mod 3`, is another
/// node) that learn their primaries committed 50 ops they lack.
fn five_groups_behind(sim: &Sim, node: &mut Node<SimStorage, Sent, Zero>) {
    let groups = [1, 2, 4, 5, 7];
    for g in groups.into_iter().skip(1) {
        sim.block_on(node.create_group(g, small_group())).unwrap();
    }
    for primary in [1u8, 2] {
        let entries: Vec<CommitEntry> = groups
            .into_iter()
            .filter(|g| g % 3 == u64::from(primary))
            .map(|group| CommitEntry { group, commit: 50, commit_checksum: 0, view: 0 })
            .collect();
        let packet = codec::encode_commits(node.config.replica.cluster, primary, &entries);
        node.on_packet(primary, &packet).unwrap();
    }
}

/// The byte ration (`repair_bytes_per_tick_max`): each round is charged what it asks for (50
/// ops whose headers are unknown, counted as a header each), the credit grows by the rate per
/// tick, and a round starts only while the credit is positive, so the rounds granted follow the
/// rate however many groups want one.
#[test]
fn repair_rounds_are_rationed_by_bytes() {
    let round_bytes = 50 * HEADER_SIZE as u64;
    for (rate, expected) in
        [(round_bytes, vec![1, 1, 1, 1, 1]), (round_bytes / 2, vec![1, 0, 1, 0, 1])]
    {
        let sim = Sim::new(2, SimConfig::default());
        let mut node = node(&sim, 64);
        node.config.repair_rounds_per_tick_max = 8;
        node.config.repair_bytes_per_tick_max = rate;
        five_groups_behind(&sim, &mut node);
        let mut rounds_per_tick = Vec::new();
        for _ in 0..5 {
            let before = node.counters().repair_rounds_granted;
            node.on_tick();
            rounds_per_tick.push(node.counters().repair_rounds_granted - before);
        }
        assert_eq!(rounds_per_tick, expected, "rate {rate} bytes per tick");
        assert!(node.counters().repair_rounds_deferred >= 4);
    }
}

/// Limits everywhere: peers' prepare reads wait in a queue of at most
/// `serve_reads_queued_max`; requests beyond it are dropped (counted), the queued ones are
/// served at the next I/O round, and the queue takes requests again after it.
#[test]
fn peers_prepare_reads_queue_up_to_their_bound() {
    let sim = Sim::new(5, SimConfig::default());
    let mut node = node(&sim, 64);
    node.config.serve_reads_queued_max = 4;
    node.config.replica.stamp_batches = false;
    // Group 3: node 0 is the primary of view 0.
    sim.block_on(node.create_group(3, small_group())).unwrap();
    for number in 1..=10 {
        node.on_client_request(3, request(number, 100)).unwrap();
    }
    sim.block_on(node.run_io());
    let cluster = node.config.replica.cluster;
    let checksum = node.replica(3).unwrap().header(10).unwrap().checksum_header;
    let ok = Message::PrepareOk { view: 0, op: 10, commit: 0, prepare_checksum: checksum };
    node.on_packet(1, &codec::encode(cluster, 1, 3, &ok)).unwrap();
    assert_eq!(node.replica(3).unwrap().commit(), 10, "committed: bodies leave memory");
    sim.block_on(node.run_io());
    node.transport.0.clear();
    for op in 1..=10 {
        let ask = Message::RequestPrepare { view: 0, op, checksum: None };
        node.on_packet(1, &codec::encode(cluster, 1, 3, &ask)).unwrap();
    }
    assert_eq!(node.reads.len(), 4, "the queue holds its bound");
    assert_eq!(node.counters().serve_reads_dropped, 6);
    sim.block_on(node.run_io());
    assert_eq!(served_to(&mut node, 1), vec![1, 2, 3, 4], "the queued reads, in order");
    assert!(node.reads.is_empty());
    let ask = Message::RequestPrepare { view: 0, op: 9, checksum: None };
    node.on_packet(1, &codec::encode(cluster, 1, 3, &ask)).unwrap();
    assert_eq!(node.reads.len(), 1, "room again after the round");
}

/// The ops of the prepares node `node` sent to peer `to` since the last call.
fn served_to(node: &mut Node<SimStorage, Sent, Zero>, to: u8) -> Vec<u64> {
    let cluster = node.config.replica.cluster;
    let limits = CodecLimits {
        message_size_bytes_max: 1 << 20,
        view_headers_max: 128,
        commit_entries_max: 8,
    };
    std::mem::take(&mut node.transport.0)
        .iter()
        .filter(|(peer, _)| *peer == to)
        .flat_map(|(_, packet)| codec::decode(cluster, packet, &limits).unwrap().1)
        .filter_map(|(_, message)| match message {
            Message::Prepare { header, .. } => header.as_prepare().map(|p| p.op),
            _ => None,
        })
        .collect()
}

/// Limits everywhere: disk reads for peers run beside the shard's loop, at most
/// `serve_reads_in_flight_max` at once, each reading one run of consecutive ops a peer asked
/// for up to `serve_read_bytes_max` (at least one prepare, whatever its size); the rest of a
/// run is read next, so every op asked for is served, in order.
#[test]
fn peers_disk_reads_stay_within_their_bounds() {
    let sim = Sim::new(6, SimConfig::default());
    let mut node = node(&sim, 64);
    node.config.replica.stamp_batches = false;
    // Group 3: node 0 is the primary of view 0.
    sim.block_on(node.create_group(3, small_group())).unwrap();
    // Past the small profile's 1 MiB prepare ring, so the first ops are on disk only; node 1
    // acknowledges each batch, so the pipeline keeps moving.
    let cluster = node.config.replica.cluster;
    for batch in 0..20 {
        for number in batch * 20 + 1..=batch * 20 + 20 {
            node.on_client_request(3, request(number, 3000)).unwrap();
        }
        sim.block_on(node.run_io());
        let op = batch * 20 + 20;
        let checksum = node.replica(3).unwrap().header(op).unwrap().checksum_header;
        let ok = Message::PrepareOk { view: 0, op, commit: 0, prepare_checksum: checksum };
        node.on_packet(1, &codec::encode(cluster, 1, 3, &ok)).unwrap();
        sim.block_on(node.run_io());
    }
    assert_eq!(node.replica(3).unwrap().commit(), 400);
    served_to(&mut node, 1);
    let ask = |node: &mut Node<SimStorage, Sent, Zero>, from: u8, ops: &[u64]| {
        for &op in ops {
            let ask = Message::RequestPrepare { view: 0, op, checksum: None };
            node.on_packet(from, &codec::encode(cluster, from, 3, &ask)).unwrap();
        }
    };
    // Two of these prepares (3,000-byte bodies and their headers) fill a read.
    node.config.serve_reads_in_flight_max = 1;
    node.config.serve_read_bytes_max = 2 * (3000 + HEADER_SIZE);
    ask(&mut node, 1, &[1, 2, 3, 4, 5]);
    node.serve_reads();
    assert_eq!(node.peer_reads_in_flight(), 1, "one read in flight at most");
    assert!(node.reads.is_empty(), "the run is one read; what it does not reach is read next");
    sim.block_on(node.run_io());
    assert_eq!(served_to(&mut node, 1), vec![1, 2, 3, 4, 5]);
    assert_eq!(node.counters().prepares_served_from_disk, 5);
    assert_eq!(node.counters().serve_disk_reads, 3, "runs of two, two and one");
    // Two peers' runs are two reads, both in flight under a bound of two.
    node.config.serve_reads_in_flight_max = 2;
    ask(&mut node, 1, &[10, 11]);
    ask(&mut node, 2, &[10, 11]);
    node.serve_reads();
    assert_eq!(node.peer_reads_in_flight(), 2);
    assert!(node.reads.is_empty());
    sim.block_on(node.run_io());
    assert_eq!(served_to(&mut node, 1), vec![10, 11]);
    // A bound below one prepare still reads one per read.
    node.config.serve_read_bytes_max = 1;
    ask(&mut node, 1, &[7, 8]);
    sim.block_on(node.run_io());
    assert_eq!(served_to(&mut node, 1), vec![7, 8]);
    assert_eq!(node.counters().serve_disk_reads, 3 + 2 + 2);
    assert_eq!(node.peer_reads_in_flight(), 0);
}

/// A vote reveals a view that is not durable until the node's I/O round: the node holds the
/// StartViewChange messages back, within `held_messages_max`, and sends them once durable.
#[test]
fn messages_wait_for_durability_within_their_bound() {
    let sim = Sim::new(1, SimConfig::default());
    let mut node = node(&sim, 1);
    for _ in 0..300 {
        node.on_tick();
    }
    assert!(node.transport.0.is_empty(), "nothing revealing the vote left before it is durable");
    let counters = node.counters();
    assert!(counters.messages_held >= 2 && counters.held_dropped >= 1, "{counters:?}");
    assert_eq!(node.held.len(), 1, "the bound holds");
    sim.block_on(node.run_io());
    assert!(!node.transport.0.is_empty(), "released once the view is durable");
    assert!(node.held.is_empty());
}

/// A node of one with a `replicated` group 1 (single-replica groups, so writes commit
/// at once).
fn single_node(sim: &Sim) -> Node<SimStorage, Sent, Zero> {
    single_node_with_segments(sim, 64 << 20)
}

fn single_node_with_segments(sim: &Sim, segment_size_bytes: u64) -> Node<SimStorage, Sent, Zero> {
    let replica = ReplicaConfig { stamp_batches: false, ..ReplicaConfig::new(1, 0, 1, 0) };
    let config = NodeConfig { held_messages_max: 64, ..NodeConfig::new(0, replica) };
    let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
    let open = Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
    let (mut node, _) = sim.block_on(open).unwrap();
    let group = GroupConfig {
        durability: shoal_proto::Durability::Replicated,
        segment_size_bytes,
        record_size_bytes_max: 64 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(node.create_group(1, group)).unwrap();
    node
}

fn request(number: u64, body_bytes: usize) -> Request {
    Request {
        client: 1,
        session: 1,
        request: number,
        body: bytes::BytesMut::from(&vec![7u8; body_bytes][..]),
        body_checksum: shoal_proto::checksum::crc32c(&vec![7u8; body_bytes]),
        record_count: 1,
        first_timestamp_ms: 0,
        max_timestamp_ms: 0,
        append_time_ms: 0,
    }
}

/// A checkpoint's segment sync stays off the reply path: while it is held in flight, every
/// round still acknowledges its writes, and the checkpoint lands in a later round once
/// the sync completes.
#[test]
fn rounds_acknowledge_writes_while_a_checkpoint_sync_is_in_flight() {
    let sim = Sim::new(4, SimConfig::default());
    let mut node = single_node(&sim);
    sim.set_syncs_held(true);
    let mut number = 0;
    let mut write_and_acknowledge = |node: &mut Node<SimStorage, Sent, Zero>| {
        number += 1;
        node.on_client_request(1, request(number, 32 << 10)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
    };
    // The small profile checkpoints every 1 MiB: 32 KiB writes reach it within 40.
    for _ in 0..40 {
        write_and_acknowledge(&mut node);
        if node.checkpoint.is_some() {
            break;
        }
    }
    assert!(node.checkpoint.is_some(), "a checkpoint started");
    for _ in 0..40 {
        write_and_acknowledge(&mut node);
    }
    assert!(node.checkpoint.is_some(), "its sync is still held");
    assert_eq!(node.store.counters().checkpoints, 0);
    sim.set_syncs_held(false);
    for _ in 0..40 {
        write_and_acknowledge(&mut node);
        if node.store.counters().checkpoints > 0 {
            break;
        }
    }
    assert!(node.store.counters().checkpoints > 0, "the checkpoint landed once released");
    sim.block_on(node.close()).unwrap();
}

/// A segment roll's syncs (the rolled segment, its index, the directory) belong to the
/// checkpoint job: writes that cross rolls are acknowledged while every sync is held.
#[test]
fn rounds_acknowledge_writes_across_segment_rolls_while_syncs_are_held() {
    let sim = Sim::new(6, SimConfig::default());
    let mut node = single_node_with_segments(&sim, 1 << 20);
    sim.set_syncs_held(true);
    // 96 × 32 KiB = 3 MiB: at least two rolls of 1 MiB segments.
    for number in 1..=96 {
        node.on_client_request(1, request(number, 32 << 10)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
    }
    let log = node.store.group(1).unwrap();
    assert!(log.segment_count() >= 3, "the writes rolled segments");
    assert!(log.open_file_count() >= 2, "rolled segments stay open until settled");
    assert_eq!(node.store.counters().segment_syncs, 0, "no sync completed");
    sim.set_syncs_held(false);
    for number in 97..=200 {
        node.on_client_request(1, request(number, 32 << 10)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(node.take_replies().len(), 1, "request {number} answered in its round");
        if node.store.group(1).unwrap().open_file_count() == 1 {
            break;
        }
    }
    assert_eq!(node.store.group(1).unwrap().open_file_count(), 1, "rolled segments settled");
    assert!(node.store.counters().segment_syncs >= 2, "each rolled segment was synced");
    sim.block_on(node.close()).unwrap();
}

/// Rounds overlap their flushes: a write applied while a cycle is in flight waits for
/// the next cycle, and is acknowledged only once that one finishes.
#[test]
fn a_write_applied_during_a_flush_is_acknowledged_only_after_its_own_cycle() {
    let sim = Sim::new(5, SimConfig::default());
    let mut node = single_node(&sim);
    node.on_client_request(1, request(1, 1000)).unwrap();
    sim.block_on(node.start_io());
    assert!(node.io_in_flight(), "the first cycle runs on after the round");
    assert!(node.take_replies().is_empty(), "nothing is acknowledged before its write");
    node.on_client_request(1, request(2, 1000)).unwrap();
    sim.block_on(node.start_io());
    let mut acknowledged = Vec::new();
    for _ in 0..8 {
        if !node.io_in_flight() {
            break;
        }
        sim.block_on(node.wait_io());
        let replies: Vec<u64> = node.take_replies().iter().map(|(_, r)| r.request).collect();
        if acknowledged.is_empty() && !replies.is_empty() {
            assert_eq!(replies, vec![1], "the first cycle carried request 1 only");
        }
        acknowledged.extend(replies);
    }
    assert_eq!(acknowledged, vec![1, 2], "request 2 was acknowledged by the second cycle");
    assert_eq!(node.store.counters().flushes, 2, "one cycle each");
}

/// A second `replicated` group on a single node.
fn add_group(sim: &Sim, node: &mut Node<SimStorage, Sent, Zero>, group: u64) {
    let config = GroupConfig {
        durability: shoal_proto::Durability::Replicated,
        segment_size_bytes: 64 << 20,
        record_size_bytes_max: 64 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(node.create_group(group, config)).unwrap();
}

fn replied(node: &mut Node<SimStorage, Sent, Zero>) -> Vec<(u64, u64)> {
    let replies = node.take_replies();
    assert!(replies.iter().all(|(_, r)| matches!(r.result, ReplyResult::Committed { .. })));
    replies.into_iter().map(|(group, reply)| (group, reply.request)).collect()
}

/// Disk full is clean and retryable (DESIGN.md §3): once the space made ready ahead of a
/// group's tail runs out and no more can be reserved, its requests are refused with the
/// typed `StorageFull` before they reach the replica; the group is not stopped, its reads
/// and the other groups' writes (into their own ready space) go on, and once space is
/// freed a tick's retry lets writes through again, with no reopen.
#[test]
fn a_full_disk_refuses_requests_as_storage_full_until_a_tick_finds_room() {
    let sim = Sim::new(3, SimConfig::default());
    let mut node = single_node(&sim);
    add_group(&sim, &mut node, 2);
    for (number, group) in [(1, 1), (2, 2)] {
        node.on_client_request(group, request(number, 1000)).unwrap();
        sim.block_on(node.run_io());
    }
    assert_eq!(replied(&mut node), vec![(1, 1), (2, 2)]);
    sim.set_capacity_bytes(sim.used_bytes());
    let mut accepted = 0;
    let refusal = loop {
        match node.on_client_request(1, request(100 + accepted, 32 << 10)) {
            Ok(()) => accepted += 1,
            Err(refusal) => break refusal,
        }
        sim.block_on(node.run_io());
        assert!(accepted < 100, "a full disk must refuse");
    };
    assert_eq!(refusal, RequestRefused::StorageFull { group: 1 });
    assert!(node.is_storage_full(1) && !node.is_storage_full(2));
    // What was taken fit the space already ready: every one of them is acknowledged.
    assert_eq!(replied(&mut node).len() as u64, accepted);
    for _ in 0..5 {
        node.on_tick();
        sim.block_on(node.run_io());
        assert!(node.on_client_request(1, request(900, 1000)).is_err(), "still full");
    }
    assert!(node.group_failure(1).is_none(), "{:?}", node.group_failure(1));
    assert!(node.counters().storage_full_refusals >= 6);
    // Group 2 writes into the space made ready for it earlier.
    node.on_client_request(2, request(3, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(2, 3)]);
    // Reads go on.
    let log = node.store_mut().group_mut(1).unwrap();
    assert_eq!(sim.block_on(log.read_offset(0, usize::MAX)).unwrap().len() as u64, accepted + 1);
    // Space is freed: the next tick's retry finds it, and writes resume by themselves.
    sim.set_capacity_bytes(u64::MAX);
    node.on_tick();
    sim.block_on(node.run_io());
    assert!(!node.is_storage_full(1));
    node.on_client_request(1, request(901, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, 901)]);
}

/// A group that fails (a write error: fail-stop) answers the requests its pipeline holds
/// with "outcome unknown" at once: its stopped replica takes no more input, and they waited for
/// good, holding their clients and connections.
#[test]
fn a_failed_group_answers_its_pipelined_requests_as_outcome_unknown() {
    let sim = Sim::new(9, SimConfig::default());
    let mut node = single_node(&sim);
    node.on_client_request(1, request(1, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, 1)]);
    let segment =
        shoal_engine::shard::group_dir(Path::new("/d"), 1).join(shoal_engine::segment::log_name(0));
    sim.fail_next_write(&segment);
    node.on_client_request(1, request(2, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert!(node.group_failure(1).is_some(), "the write error stops the group");
    let replies = node.take_replies();
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!(replies[0].1.request, 2);
    assert!(matches!(replies[0].1.result, ReplyResult::TransientNotCommitted));
}

/// A write-chunk pool held by views outside the engine (a consumer's reply still being sent)
/// makes appends wait, not fail: the group keeps serving, its writes resume in order once the
/// views are dropped. The group used to stop (fail-stop) after the append's retries.
#[test]
fn appends_wait_while_readers_hold_every_write_chunk() {
    let sim = Sim::new(5, SimConfig::default());
    let replica = ReplicaConfig { stamp_batches: false, ..ReplicaConfig::new(1, 0, 1, 0) };
    let config = NodeConfig { held_messages_max: 64, ..NodeConfig::new(0, replica) };
    let shard = ShardConfig { cluster: 1, chunks_max: 4, ..ShardConfig::small() };
    let open = Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
    let (mut node, _) = sim.block_on(open).unwrap();
    add_group(&sim, &mut node, 1);
    // A reader keeps every written prepare, as views of the chunks they were written from.
    let mut held = Vec::new();
    let mut acknowledged = 0;
    let mut number = 0;
    while node.counters().appends_waiting_rounds == 0 {
        number += 1;
        assert!(number < 200, "a pool of 1 MiB never ran dry");
        node.on_client_request(1, request(number, 32 << 10)).unwrap();
        sim.block_on(node.run_io());
        acknowledged += replied(&mut node).len();
        let log = node.store_mut().group_mut(1).unwrap();
        if let Ok(Some(prepare)) = sim.block_on(log.read_op(log.head_op())) {
            held.push(prepare);
        }
        assert!(node.group_failure(1).is_none(), "{:?}", node.group_failure(1));
    }
    assert_eq!(acknowledged as u64, number - 1, "the last append waits");
    for _ in 0..3 {
        node.on_tick();
        sim.block_on(node.run_io());
        assert!(replied(&mut node).is_empty(), "still waiting");
        assert!(node.group_failure(1).is_none(), "{:?}", node.group_failure(1));
    }
    held.clear();
    node.on_tick();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, number)], "the waiting append went through");
    node.on_client_request(1, request(number + 1, 32 << 10)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, number + 1)]);
}

/// A write the replica took before the engine knew the disk was full waits for space — in
/// order, with the group's later writes — while other groups' writes are applied and
/// acknowledged; once space is freed every waiting write is acknowledged, in order.
#[test]
fn writes_waiting_for_space_hold_back_only_their_own_group() {
    let sim = Sim::new(7, SimConfig::default());
    let mut node = single_node(&sim);
    add_group(&sim, &mut node, 2);
    node.on_client_request(2, request(1, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(2, 1)]);
    sim.set_capacity_bytes(sim.used_bytes());
    // A burst larger than the space group 1 has ready (256 KiB in the small profile), taken
    // before any flush could find the disk full.
    for number in 10..22 {
        node.on_client_request(1, request(number, 32 << 10)).unwrap();
    }
    sim.block_on(node.start_io());
    // Taken while that cycle runs: the engine does not know yet.
    node.on_client_request(1, request(22, 32 << 10)).unwrap();
    node.on_client_request(2, request(2, 1000)).unwrap();
    while node.io_in_flight() {
        sim.block_on(node.wait_io());
    }
    assert!(node.is_storage_full(1));
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(2, 2)], "group 2 is not held back");
    assert!(node.counters().storage_full_rounds > 0, "group 1's last write waits");
    assert!(matches!(
        node.on_client_request(1, request(23, 1000)),
        Err(RequestRefused::StorageFull { group: 1 })
    ));
    for _ in 0..3 {
        node.on_tick();
        sim.block_on(node.run_io());
    }
    assert!(node.take_replies().is_empty(), "nothing acknowledged without room");
    sim.set_capacity_bytes(u64::MAX);
    for _ in 0..4 {
        node.on_tick();
        sim.block_on(node.run_io());
    }
    let expected: Vec<(u64, u64)> = (10..23).map(|number| (1, number)).collect();
    assert_eq!(replied(&mut node), expected, "in order, once there is room");
    assert!(node.group_failure(1).is_none());
    sim.block_on(node.close()).unwrap();
}

#[test]
fn a_packet_from_another_cluster_or_sender_is_refused_and_counted() {
    let sim = Sim::new(2, SimConfig::default());
    let mut node = node(&sim, 8);
    let vote = Message::StartViewChange { view: 1, membership: Membership::first(3, 3) };
    let foreign = codec::encode(2, 1, 1, &vote);
    assert!(matches!(node.on_packet(1, &foreign), Err(DecodeError::Invalid("cluster"))));
    let spoofed = codec::encode(1, 2, 1, &vote);
    assert!(matches!(node.on_packet(1, &spoofed), Err(DecodeError::Invalid("sender"))));
    let unknown = codec::encode(1, 1, 99, &vote);
    assert!(node.on_packet(1, &unknown).is_ok());
    let counters = node.counters();
    assert_eq!((counters.packets_rejected, counters.messages_unknown_group), (2, 1));
}

/// DESIGN.md §8: a node that rejoined its cluster with an empty disk never leads, nor votes in,
/// a group it may have held before: such a group (below the rejoin floor) starts `Recovering`
/// knowing nothing and never starts a view change of its own, however long its probes go
/// unanswered; a group created after the floor starts normal in view 0 as usual.
#[test]
fn groups_below_the_rejoin_floor_start_recovering_and_wait_for_the_cluster() {
    use crate::replica::Status;
    let sim = Sim::new(5, SimConfig::default());
    let mut node = node(&sim, 64);
    node.set_rejoin_floor(10);
    // Group 3's primary in view 0 is node 0, this one: a fresh group would lead at once.
    sim.block_on(node.create_group(3, small_group())).unwrap();
    sim.block_on(node.create_group(12, small_group())).unwrap();
    assert_eq!(node.replica(3).unwrap().status(), Status::Recovering);
    assert!(!node.replica(3).unwrap().is_primary());
    assert_eq!(node.replica(12).unwrap().status(), Status::Normal);
    for _ in 0..10_000 {
        node.on_tick();
    }
    let replica = node.replica(3).unwrap();
    assert_eq!((replica.status(), replica.view()), (Status::Recovering, 0), "it never moved");
    assert_eq!(replica.counters().votes_cast, 0);
    let probes = node
        .transport
        .0
        .iter()
        .filter_map(|(_, packet)| shoal_proto::wire::Header::decode_prefix(packet).ok())
        .filter(|header| header.command == shoal_proto::wire::Command::RequestStartView)
        .filter(|header| header.as_request_start_view().is_some_and(|f| f.group == 3))
        .count();
    assert!(probes > 10, "it kept probing for a StartView ({probes} probes)");
}

/// A group created with members of its own (a topic's replication factor) runs its replica with
/// them, also after a restart from its superblock slot; a stored set this cluster cannot have
/// (a member beyond its nodes) stops the group with a reason instead of starting a replica on it.
#[test]
fn a_group_created_with_its_own_members_keeps_them_across_restarts() {
    let sim = Sim::new(6, SimConfig::default());
    let mut node = node(&sim, 64);
    // Node 0 and node 2 of three: the group's only voters; node 0 leads view 0 of group 4.
    let members = Membership { voters: 0b101, learners: 0 };
    let own = GroupConfig { members: members.to_word(), ..small_group() };
    sim.block_on(node.create_group(4, own)).unwrap();
    let beyond = Membership { voters: 0b1001, learners: 0 };
    let foreign = GroupConfig { members: beyond.to_word(), ..small_group() };
    sim.block_on(node.create_group(5, foreign)).unwrap();
    let check = |node: &Node<SimStorage, Sent, Zero>| {
        let replica = node.replica(4).unwrap();
        assert_eq!(replica.config().members, members);
        assert_eq!(replica.config().home(), 0);
        assert_eq!(node.replica(1).unwrap().config().members, Membership::first(3, 3));
        let failure = node.group_failure(5).expect("group 5 is stopped");
        assert!(failure.contains("members"), "{failure}");
    };
    check(&node);
    sim.block_on(node.close()).unwrap();
    let config = NodeConfig::new(0, ReplicaConfig::new(1, 0, 3, 0));
    let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
    let open = Node::open(sim.storage(), Path::new("/d"), shard, config, Sent::default(), Zero, 3);
    let (node, _) = sim.block_on(open).unwrap();
    check(&node);
}

/// Deleting a group mid-write (a request applied in this round, not yet flushed): its replica
/// and log go, the other group's write is still acknowledged, and the id can be created again,
/// empty. An unknown group is refused and changes nothing.
#[test]
fn a_deleted_group_goes_with_its_queued_writes_and_its_id_comes_back_empty() {
    let sim = Sim::new(9, SimConfig::default());
    let mut node = single_node(&sim);
    add_group(&sim, &mut node, 2);
    node.on_client_request(1, request(1, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, 1)]);
    node.on_client_request(1, request(2, 1000)).unwrap();
    node.on_client_request(2, request(1, 1000)).unwrap();

    assert!(sim.block_on(node.delete_groups(&[1, 3])).is_err(), "group 3 is unknown");
    assert!(node.has_log(1) && node.replica(1).is_some(), "a refusal changes nothing");
    sim.block_on(node.delete_groups(&[1])).unwrap();
    assert!(!node.has_log(1) && node.replica(1).is_none());
    assert_eq!(node.counters().groups_deleted, 1);
    let dir = Path::new("/d/group-00000000000000000001");
    assert!(!sim.block_on(shoal_engine::storage::Storage::exists(&sim.storage(), dir)).unwrap());
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(2, 1)], "only the other group's write is answered");

    add_group(&sim, &mut node, 1);
    assert_eq!(node.log_stats(1).unwrap().next_offset, 0, "the id comes back empty");
    node.on_client_request(1, request(3, 1000)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), vec![(1, 3)]);
    sim.block_on(node.close()).unwrap();
}

/// Opens the node of `/d` again, with what `saved` says the driver saved of each group.
fn reopen_with(
    sim: &Sim,
    config: NodeConfig,
    saved: &dyn Fn(u64) -> SavedProducers,
) -> Node<SimStorage, Sent, Zero> {
    let shard = ShardConfig { cluster: 1, ..ShardConfig::small() };
    let load = async |group: u64| saved(group);
    let open = Node::open_with_producer_snapshots(
        sim.storage(),
        Path::new("/d"),
        shard,
        config,
        Sent::default(),
        Zero,
        3,
        load,
    );
    sim.block_on(open).unwrap().0
}

/// A producer snapshot past the recovered log's head (a damage cut, or a power loss of a
/// `replicated` group, took committed ops it covers): a replica with peers keeps it, since
/// those ops come back from peers unchanged and re-applying them changes nothing; rebuilt from
/// the log instead, the table would forget producers whose ops retention removed. A group of one
/// recovers uncleanly (the ops may be gone for good) and refuses it.
#[test]
fn a_producer_snapshot_past_the_head_is_kept_unless_recovery_is_unclean() {
    use crate::producers::{ProducerBatch, ProducerTable};
    const PRODUCER: i64 = 7;
    let snapshot = |limits| {
        let mut table = ProducerTable::new(limits);
        let batch = ProducerBatch { producer_id: PRODUCER, epoch: 0, first_seq: 0, last_seq: 0 };
        table.apply(&batch, 50, 0, 0);
        table.encode()
    };
    for peers in [true, false] {
        let sim = Sim::new(11, SimConfig::default());
        let node = if peers { node(&sim, 64) } else { single_node(&sim) };
        let config = node.config;
        let limits = node.replica(1).unwrap().config().producer_limits();
        sim.block_on(node.close()).unwrap();
        let node = reopen_with(&sim, config, &|_| SavedProducers::Saved(snapshot(limits)));
        let table = node.replica(1).unwrap().producers();
        assert_eq!(table.state(PRODUCER, 0).is_some(), peers, "peers: {peers}");
        assert_eq!(node.counters().producer_snapshots_rejected, u64::from(!peers));
    }
}

/// DESIGN.md §6, a damaged or missing file: retention deletes only what a saved snapshot
/// covers, so a group whose snapshot is unusable and whose log retention shortened has lost
/// history only that snapshot held. It restarts stopped, with the reason, instead of serving a
/// producer table (and a driver state) rebuilt from what is left. A group whose log still
/// begins at op 1 is rebuilt from it, and a driver that keeps no snapshot is not second-guessed.
#[test]
fn a_group_whose_snapshot_is_unusable_and_whose_log_retention_shortened_restarts_stopped() {
    let sim = Sim::new(12, SimConfig::default());
    // Group 1 keeps its whole log; group 2 keeps one 1 MiB segment.
    let mut node = single_node_with_segments(&sim, 1 << 20);
    let retained = GroupConfig {
        durability: shoal_proto::Durability::Replicated,
        segment_size_bytes: 1 << 20,
        retention_bytes: 1 << 20,
        record_size_bytes_max: 64 << 10,
        ..GroupConfig::default()
    };
    sim.block_on(node.create_group(2, retained)).unwrap();
    for number in 1..=40 {
        for group in [1, 2] {
            node.on_client_request(group, request(number, 60 << 10)).unwrap();
        }
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node).len(), 2);
    }
    assert!(sim.block_on(node.enforce_retention(0)).unwrap() > 0);
    let first_op = node.store().group(2).unwrap().first_op();
    assert!(first_op > 1, "retention removed group 2's first segments");
    assert_eq!(node.store().group(1).unwrap().first_op(), 1);
    // Past the bound again, for the retention below.
    for number in 41..=80 {
        node.on_client_request(2, request(number, 60 << 10)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node).len(), 1);
    }
    let config = node.config;
    sim.block_on(node.close()).unwrap();

    let reopen = |saved: &dyn Fn(u64) -> SavedProducers| reopen_with(&sim, config, saved);
    let damaged = |_group: u64| SavedProducers::Unavailable("its checksum does not match".into());
    let node = reopen(&damaged);
    assert_eq!(node.group_failure(1), None, "group 1's log holds its whole history");
    let why = node.group_failure(2).expect("group 2 lost history with its snapshot");
    assert!(why.contains("its checksum does not match"), "{why}");
    assert!(why.contains(&format!("begins at op {first_op}")), "{why}");
    // What the stopped group still holds stays: retention deletes none of it.
    let mut node = node;
    node.set_retention_floor(2, u64::MAX);
    sim.block_on(node.enforce_retention(0)).unwrap();
    assert_eq!(node.store().group(2).unwrap().first_op(), first_op);
    sim.block_on(node.close()).unwrap();

    let garbage = |group: u64| match group {
        2 => SavedProducers::Saved(vec![0xff; 16]),
        _ => SavedProducers::NotKept,
    };
    let node = reopen(&garbage);
    assert!(node.group_failure(2).is_some_and(|why| why.contains("does not decode")));
    assert_eq!(node.counters().producer_snapshots_rejected, 1);
    sim.block_on(node.close()).unwrap();

    let node = reopen(&|_| SavedProducers::NotKept);
    assert_eq!((node.group_failure(1), node.group_failure(2)), (None, None));
    sim.block_on(node.close()).unwrap();
}

/// The damage cuts a node remembers for status are bounded (`DAMAGE_CUTS_KEPT`): past the
/// bound the oldest goes, while the counter keeps counting every cut.
#[test]
fn a_node_remembers_its_newest_damage_cuts_only() {
    let sim = Sim::new(13, SimConfig::default());
    let mut node = node(&sim, 64);
    let groups = super::damage::DAMAGE_CUTS_KEPT as u64 + 1;
    for group in 2..=groups {
        sim.block_on(node.create_group(group, small_group())).unwrap();
    }
    for group in 1..=groups {
        sim.block_on(node.cut_damaged(group)).unwrap();
    }
    let kept: Vec<u64> = node.damage_cuts().map(|cut| cut.group).collect();
    assert_eq!(kept, (2..=groups).collect::<Vec<u64>>(), "the oldest cut went");
    assert_eq!(node.counters().damage_cuts, groups);
    sim.block_on(node.close()).unwrap();
}

/// A node of one lets its idle groups sleep (see the `sleep` module): a tick walks only the
/// groups awake, an input wakes its group with the ticks it slept through, and the replicas
/// end where a node that ticks every group leaves them.
#[test]
fn idle_groups_sleep_and_wake_caught_up() {
    let sleeping_sim = Sim::new(4, SimConfig::default());
    let ticking_sim = Sim::new(4, SimConfig::default());
    let mut sleeping = single_node(&sleeping_sim);
    let mut ticking = single_node(&ticking_sim);
    ticking.config.groups_sleep = false;
    for (sim, node) in [(&sleeping_sim, &mut sleeping), (&ticking_sim, &mut ticking)] {
        add_group(sim, node, 2);
        add_group(sim, node, 3);
    }
    let mut number = 0;
    for idle_ticks in [1, 7, 250] {
        number += 1;
        for (sim, node) in [(&sleeping_sim, &mut sleeping), (&ticking_sim, &mut ticking)] {
            node.on_client_request(2, request(number, 100)).unwrap();
            sim.block_on(node.run_io());
            assert_eq!(replied(node), [(2, number)]);
            for _ in 0..idle_ticks {
                node.on_tick();
            }
        }
        assert!(sleeping.awake.is_empty(), "every group idle sleeps after its tick");
        assert_eq!(ticking.awake.len(), 3);
    }
    // Group 3 slept from its first tick; a request wakes it with all of them.
    for (sim, node) in [(&sleeping_sim, &mut sleeping), (&ticking_sim, &mut ticking)] {
        node.on_client_request(3, request(1, 100)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(node), [(3, 1)]);
    }
    // Group 2 slept through ticks 3..=8 before its third request, group 3 through 2..=258;
    // group 1 sleeps on, uncounted until it wakes.
    assert_eq!(sleeping.counters.ticks_slept, 6 + 257);
    for group in 1..=3 {
        let (asleep, awake) =
            (sleeping.groups[&group].replica.tick(), ticking.groups[&group].replica.tick());
        let behind =
            sleeping.groups[&group].asleep_since_tick.map_or(0, |since| sleeping.ticks - since);
        assert_eq!(asleep + behind, awake, "group {group}");
    }
    assert_eq!(sleeping.groups[&3].replica.tick(), 258);
    sleeping_sim.block_on(sleeping.close()).unwrap();
    ticking_sim.block_on(ticking.close()).unwrap();
}

/// An I/O round reports durable ops to the groups whose logs it made durable, not to every group
/// the shard holds: one write among 200 groups visits one.
#[test]
fn a_round_visits_only_the_groups_it_made_durable() {
    let sim = Sim::new(4, SimConfig::default());
    let mut node = single_node(&sim);
    for group in 2..=200 {
        add_group(&sim, &mut node, group);
    }
    node.on_client_request(1, request(1, 100)).unwrap();
    sim.block_on(node.run_io());
    assert_eq!(replied(&mut node), [(1, 1)]);
    for number in 2..=4 {
        let before = node.counters.durable_groups_visited;
        node.on_client_request(7, request(number, 100)).unwrap();
        sim.block_on(node.run_io());
        assert_eq!(replied(&mut node), [(7, number)]);
        assert_eq!(node.counters.durable_groups_visited - before, 1, "request {number}");
    }
    sim.block_on(node.close()).unwrap();
}
