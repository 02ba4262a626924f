//! Consuming end to end, on the real binary: long-poll fetches woken by the commit of new data,
//! their bounds and the committed end they report; stored offsets across restarts; consumer
//! groups rebalancing as members leave and die, refusing stale generations; polling from the
//! stored offset with auto-commit.

mod common;

use std::time::{Duration, Instant};

use common::{Raw, ShoalProcess, decode_fetch, metrics_page, restart, start, start_command};
use shoal_engine::shard::{group_dir, shard_dir};
use shoal_proto::Durability;
use shoal_proto::protocol::consumer::{
    Assignment, ConsumerId, GroupMember, GroupRef, JoinGroup, Membership, OffsetKey, PartitionRef,
    Poll, StoreOffset, decode_stored_offset,
};
use shoal_proto::protocol::{
    ErrorCode, Fetch, FetchFrom, Operation, decode_describe, encode_topic_name,
};

/// Longer than any test should need, shorter than the harness's 30 s read timeout: a parked
/// fetch that is not woken comes back empty after this, and the test fails on it.
const WAIT_MS: u32 = 20_000;

fn fetch_body(from: FetchFrom, wait_ms_max: u32) -> Vec<u8> {
    Fetch {
        stream: "s".into(),
        topic: "t".into(),
        partition: 0,
        from,
        bytes_max: 1 << 20,
        count_max: 100,
        wait_ms_max,
    }
    .encode()
}

#[test]
fn a_long_poll_is_answered_by_the_commit_of_new_data_not_by_its_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut admin = Raw::connect(server.native(), 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Persisted).ok();
    admin.produce("s", "t", 0, &[b"old"]);

    // A fetch at the end of the partition, then a write pipelined behind it on the same
    // connection: the shard takes them in order, so the fetch is parked before the write exists.
    let mut consumer = Raw::connect(server.native(), 2);
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::Offset(1), WAIT_MS));
    consumer.send(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"new", b"newer"]));
    let (reply, records) = decode_fetch(consumer.receive().ok());
    assert_eq!(records, [(1, b"new".to_vec()), (2, b"newer".to_vec())]);
    assert_eq!(reply.next_offset, 3, "the committed end");
    consumer.receive().ok();

    let (_, last) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Last, 0)).ok());
    // The batch holding the last committed message (the client skips what precedes it).
    assert_eq!(last.last(), Some(&(2, b"newer".to_vec())));

    // A wait that runs out answers with nothing; no wait answers at once.
    let (reply, records) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Offset(3), 50)).ok());
    assert!(records.is_empty());
    assert_eq!(reply.next_offset, 3);
    let (_, records) =
        decode_fetch(consumer.call(Operation::Fetch, &fetch_body(FetchFrom::Offset(3), 0)).ok());
    assert!(records.is_empty());
}

#[test]
fn long_polls_are_bounded_per_request_and_per_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_NETWORK_FETCH_PARKED_MAX", "1");
    command.env("SHOAL_NETWORK_FETCH_WAIT_MS_MAX", "25000");
    let server = start_command(command);
    let mut admin = Raw::connect(server.native(), 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 1, Durability::Replicated).ok();

    let mut consumer = Raw::connect(server.native(), 2);
    let too_long = consumer.call(Operation::Fetch, &fetch_body(FetchFrom::First, 25_001));
    assert_eq!(too_long.error(), ErrorCode::InvalidArgument);

    // Everything pipelined on one connection reaches the shard in order: the first wait takes
    // the shard's only place, the second is answered at once (its reply queued behind the
    // first's), and only then does the write arrive and wake the first.
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::First, WAIT_MS));
    consumer.send(Operation::Fetch, &fetch_body(FetchFrom::First, WAIT_MS));
    consumer.send(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"a"]));
    let (_, first) = decode_fetch(consumer.receive().ok());
    assert_eq!(first, [(0, b"a".to_vec())]);
    let (reply, second) = decode_fetch(consumer.receive().ok());
    assert!(second.is_empty(), "beyond fetch_parked_max a fetch does not wait");
    assert_eq!(reply.next_offset, 0, "it was answered before the write committed");
    consumer.receive().ok();
}

fn partition(index: u32) -> PartitionRef {
    PartitionRef { stream: "s".into(), topic: "t".into(), partition: index }
}

fn store(consumer: ConsumerId, membership: Membership, index: u32, offset: u64) -> Vec<u8> {
    StoreOffset { partition: partition(index), consumer, membership, offset }.encode()
}

fn get(client: &mut Raw, consumer: &ConsumerId, index: u32) -> Option<u64> {
    let key = OffsetKey { partition: partition(index), consumer: consumer.clone() };
    decode_stored_offset(client.call(Operation::GetOffset, &key.encode()).ok()).unwrap()
}

#[test]
fn stored_offsets_survive_a_clean_restart_and_a_kill_and_deletes_stick() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 2, Durability::Persisted).ok();
    client.produce("s", "t", 0, &[b"a", b"b"]);
    let (alice, bob) = (ConsumerId::consumer("alice"), ConsumerId::consumer("bob"));
    assert_eq!(get(&mut client, &alice, 0), None);
    client.call(Operation::StoreOffset, &store(alice.clone(), Membership::default(), 0, 1)).ok();
    client.call(Operation::StoreOffset, &store(bob.clone(), Membership::default(), 1, 40)).ok();
    assert_eq!((get(&mut client, &alice, 0), get(&mut client, &bob, 1)), (Some(1), Some(40)));
    assert_eq!(get(&mut client, &alice, 1), None, "offsets are per partition");
    // The commits sit in the partition's log between the data, and consumers skip them.
    client.produce("s", "t", 0, &[b"c"]);
    let (_, records) = client.fetch("s", "t", 0, FetchFrom::First, 100);
    let values: Vec<&[u8]> = records.iter().map(|(_, v)| v.as_slice()).collect();
    assert_eq!(values, [&b"a"[..], b"b", b"c"]);
    // A standalone consumer names no membership.
    let membership = Membership { member: "m".into(), generation: 1 };
    let refused = client.call(Operation::StoreOffset, &store(alice.clone(), membership, 0, 2));
    assert_eq!(refused.error(), ErrorCode::InvalidArgument);

    // A clean stop snapshots the offsets; the start after it loads the snapshot.
    assert_eq!(common::terminate(&mut server), 0);
    common::restart(&mut server);
    let mut client = Raw::connect(server.native(), 1);
    assert_eq!((get(&mut client, &alice, 0), get(&mut client, &bob, 1)), (Some(1), Some(40)));
    // Commits after the snapshot, then a kill: the start after it replays them from the log.
    client.call(Operation::StoreOffset, &store(alice.clone(), Membership::default(), 0, 3)).ok();
    let key = OffsetKey { partition: partition(1), consumer: bob.clone() };
    client.call(Operation::DeleteOffset, &key.encode()).ok();
    server.kill_9();
    common::restart(&mut server);
    let mut client = Raw::connect(server.native(), 1);
    assert_eq!((get(&mut client, &alice, 0), get(&mut client, &bob, 1)), (Some(3), None));
}

/// DESIGN.md §6, a damaged file: once retention removed the log a partition's state snapshot
/// covered, the snapshot is all that holds its older offset commits (and producers). Damaged,
/// the partition refuses service with the reason, rather than answer offsets rebuilt from what
/// is left (a consumer would start over, or skip). A partition whose log still holds all its
/// commits rebuilds them from the log, as before.
#[test]
fn a_damaged_state_snapshot_stops_its_partition_once_retention_removed_what_it_covered() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_retained_topic("s", "t", 2, Durability::Persisted).ok();
    let alice = ConsumerId::consumer("alice");
    for index in [0, 1] {
        client.call(Operation::StoreOffset, &store(alice.clone(), Membership::default(), index, 7));
    }
    // Partition 0 is written until retention deletes the segment holding the commit (retention
    // waits for a snapshot that covers it); partition 1 keeps its log whole.
    let describe = |client: &mut Raw| {
        let body = client.call(Operation::DescribeTopic, &encode_topic_name("s", "t"));
        decode_describe(body.ok()).unwrap().1
    };
    let value = vec![b'r'; 50_000];
    let body = Raw::produce_body("s", "t", 0, &[&value]);
    let mut produced = 0;
    let started = Instant::now();
    while describe(&mut client)[0].first_offset == 0 {
        assert!(started.elapsed() < Duration::from_secs(60), "retention never deleted a segment");
        if produced < 100 {
            client.call(Operation::Produce, &body).ok();
            produced += 1;
        } else {
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let partitions = describe(&mut client);
    assert_eq!(common::terminate(&mut server), 0);
    for partition in &partitions {
        let group = group_dir(&shard_dir(dir.path(), partition.shard), partition.group);
        let path = group.join(shoal_engine::state::STATE_FILE);
        let mut bytes = std::fs::read(&path).expect("a state snapshot");
        let last = bytes.len() - 1;
        bytes[last] ^= 0x5a;
        std::fs::write(&path, &bytes).unwrap();
    }

    restart(&mut server);
    let mut client = Raw::connect(server.native(), 1);
    assert_eq!(get(&mut client, &alice, 1), Some(7), "rebuilt from partition 1's whole log");
    let key = OffsetKey { partition: partition(0), consumer: alice.clone() };
    let refused = client.call(Operation::GetOffset, &key.encode());
    assert_eq!(refused.error(), ErrorCode::PartitionFailed);
    let why = String::from_utf8_lossy(&refused.body).into_owned();
    assert!(why.contains("state snapshot is unusable"), "{why}");
    let refused = client.call(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"v"]));
    assert_eq!(refused.error(), ErrorCode::PartitionFailed);
    client.produce("s", "t", 1, &[b"v"]);
    assert_eq!(common::terminate(&mut server), 0);
}

fn join(client: &mut Raw, member: &str, session_timeout_ms: u32) -> Assignment {
    let group = GroupRef { stream: "s".into(), topic: "t".into(), group: "g".into() };
    let join = JoinGroup { group, member: member.into(), session_timeout_ms };
    Assignment::decode(client.call(Operation::JoinGroup, &join.encode()).ok()).unwrap()
}

fn member(name: &str) -> Vec<u8> {
    let group = GroupRef { stream: "s".into(), topic: "t".into(), group: "g".into() };
    GroupMember { group, member: name.into() }.encode()
}

fn heartbeat(client: &mut Raw, name: &str) -> Assignment {
    Assignment::decode(client.call(Operation::Heartbeat, &member(name)).ok()).unwrap()
}

/// Heartbeats `name` until its assignment satisfies `done` (bounded by a deadline).
fn heartbeat_until(client: &mut Raw, name: &str, done: impl Fn(&Assignment) -> bool) -> Assignment {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let assignment = heartbeat(client, name);
        if done(&assignment) {
            return assignment;
        }
        assert!(Instant::now() < deadline, "no rebalance in time: {assignment:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_group_of_three_rebalances_when_one_leaves_and_when_one_dies_and_stale_commits_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut admin = Raw::connect(server.native(), 1);
    admin.create_stream("s").ok();
    admin.create_topic("s", "t", 6, Durability::Replicated).ok();
    let mut clients: Vec<Raw> = (0..3).map(|i| Raw::connect(server.native(), 10 + i)).collect();
    let names: Vec<String> =
        clients.iter_mut().map(|client| join(client, "", 1_000).member).collect();
    // Everyone takes the newest assignment: the partitions, dealt over three, cover the topic.
    let parts: Vec<Assignment> = clients
        .iter_mut()
        .zip(&names)
        .map(|(client, name)| heartbeat_until(client, name, |a| a.partitions.len() == 2))
        .collect();
    let generation = parts[0].generation;
    assert!(parts.iter().all(|a| a.generation == generation));
    let mut all: Vec<u32> = parts.iter().flat_map(|a| a.partitions.clone()).collect();
    all.sort_unstable();
    assert_eq!(all, [0, 1, 2, 3, 4, 5]);

    // Commits: under the generation in force for an own partition only.
    let group = ConsumerId::group("g");
    let own = parts[0].partitions[0];
    let other = parts[1].partitions[0];
    let current = Membership { member: names[0].clone(), generation };
    let stale = Membership { member: names[0].clone(), generation: generation - 1 };
    clients[0].call(Operation::StoreOffset, &store(group.clone(), current.clone(), own, 5)).ok();
    let refused = clients[0].call(Operation::StoreOffset, &store(group.clone(), stale, own, 6));
    assert_eq!(refused.error(), ErrorCode::StaleGeneration);
    let refused = clients[0].call(Operation::StoreOffset, &store(group.clone(), current, other, 6));
    assert_eq!(refused.error(), ErrorCode::NotAssigned);
    let delete = OffsetKey { partition: partition(own), consumer: group.clone() };
    assert_eq!(
        clients[0].call(Operation::DeleteOffset, &delete.encode()).error(),
        ErrorCode::InvalidRequest
    );

    // One leaves: the other two share its partitions in a new generation.
    clients[1].call(Operation::LeaveGroup, &member(&names[1])).ok();
    let after_leave = heartbeat_until(&mut clients[0], &names[0], |a| a.partitions.len() == 3);
    assert!(after_leave.generation > generation);
    let third =
        heartbeat_until(&mut clients[2], &names[2], |a| a.generation == after_leave.generation);
    assert_eq!(third.partitions.len(), 3);
    let gone = clients[1].call(Operation::Heartbeat, &member(&names[1]));
    assert_eq!(gone.error(), ErrorCode::UnknownMember);
    // The member that was declared gone cannot commit: its generation is over.
    let old = Membership { member: names[1].clone(), generation };
    let refused = clients[1]
        .call(Operation::StoreOffset, &store(group.clone(), old, parts[1].partitions[0], 1));
    assert_eq!(refused.error(), ErrorCode::StaleGeneration);

    // One dies (stops heartbeating): after its session it is dropped and the survivor takes all.
    let survivor = heartbeat_until(&mut clients[0], &names[0], |a| a.partitions.len() == 6);
    assert!(survivor.generation > after_leave.generation);
    let dead = Membership { member: names[2].clone(), generation: after_leave.generation };
    let refused = clients[2]
        .call(Operation::StoreOffset, &store(group.clone(), dead, third.partitions[0], 1));
    assert_eq!(refused.error(), ErrorCode::StaleGeneration);
    assert_eq!(get(&mut admin, &group, own), Some(5));

    // A commit from outside group management (no member, generation 0) is refused while the
    // group has a member, and taken once it has none (Kafka's generation -1 rule).
    let outside = || store(group.clone(), Membership::default(), own, 9);
    assert_eq!(admin.call(Operation::StoreOffset, &outside()).error(), ErrorCode::StaleGeneration);
    clients[0].call(Operation::LeaveGroup, &member(&names[0])).ok();
    // The generation without members is proposed after the leave is answered.
    let deadline = Instant::now() + Duration::from_secs(20);
    while admin.call(Operation::StoreOffset, &outside()).reply.error != 0 {
        assert!(Instant::now() < deadline, "the empty group never took the commit");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(get(&mut admin, &group, own), Some(9));
}

/// A poll whose consumer has no offset, over a log that starts with thousands of offset
/// commits (each a control record) and then one message, one record at a time: it skips
/// them all and returns the message. The skip once called the read again from inside its
/// answer, a stack frame per control record, and this overflowed the shard thread's stack and
/// took the server down.
#[test]
fn a_poll_skips_thousands_of_offset_commits_one_record_at_a_time() {
    const COMMITS: u64 = 20_000;
    const WINDOW: u64 = 200;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Replicated).ok();
    let writer = ConsumerId::consumer("writer");
    for window in 0..COMMITS / WINDOW {
        for offset in 0..WINDOW {
            let body = store(writer.clone(), Membership::default(), 0, window * WINDOW + offset);
            client.send(Operation::StoreOffset, &body);
        }
        for _ in 0..WINDOW {
            client.receive().ok();
        }
    }
    client.produce("s", "t", 0, &[b"after the commits"]);
    let poll = Poll {
        partition: partition(0),
        consumer: ConsumerId::consumer("reader"),
        membership: Membership::default(),
        bytes_max: 1,
        count_max: 1,
        wait_ms_max: 0,
        auto_commit: false,
    };
    let answer = client.call(Operation::Poll, &poll.encode());
    let (_, records) = decode_fetch(&answer.ok()[8..]);
    // Every store but the first (offset 0, which a consumer without one reads already) wrote
    // a control record.
    assert_eq!(records, vec![(COMMITS - 1, b"after the commits".to_vec())]);
}

/// A join that would make a topic's consumer groups pass their bound (1,024) is refused with
/// the catalog's reason, the server goes on, and so do the groups it has. The refused
/// rebalance's answer once proposed the same rebalance again at once, which was refused again,
/// until the metadata shard's stack overflowed and the process died.
#[test]
fn a_join_past_the_topics_bound_on_groups_is_refused_and_the_server_goes_on() {
    const GROUPS_MAX: usize = 1024;
    const WINDOW: usize = 64;
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Replicated).ok();
    let join = |index: usize| {
        let group = GroupRef { stream: "s".into(), topic: "t".into(), group: format!("g{index}") };
        JoinGroup { group, member: String::new(), session_timeout_ms: 60_000 }.encode()
    };
    for window in 0..GROUPS_MAX / WINDOW {
        for index in window * WINDOW..(window + 1) * WINDOW {
            client.send(Operation::JoinGroup, &join(index));
        }
        for _ in 0..WINDOW {
            client.receive().ok();
        }
    }
    let refused = client.call(Operation::JoinGroup, &join(GROUPS_MAX));
    assert_eq!(
        refused.error(),
        ErrorCode::LimitReached,
        "{:?}",
        String::from_utf8_lossy(&refused.body)
    );
    // The server is alive, and an existing group still takes a member.
    let again = client.call(Operation::JoinGroup, &join(0));
    assert!(Assignment::decode(again.ok()).is_ok());
}

#[test]
fn poll_continues_from_the_stored_offset_and_auto_commit_moves_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Persisted).ok();
    client.produce("s", "t", 0, &[b"a", b"b", b"c"]);
    let poll = |auto_commit: bool, wait_ms_max: u32| {
        Poll {
            partition: partition(0),
            consumer: ConsumerId::consumer("c"),
            membership: Membership::default(),
            bytes_max: 1 << 20,
            count_max: 100,
            wait_ms_max,
            auto_commit,
        }
        .encode()
    };
    let polled = |answer: &[u8]| {
        let start = u64::from_le_bytes(answer[..8].try_into().unwrap());
        let (_, records) = decode_fetch(&answer[8..]);
        let values: Vec<Vec<u8>> =
            records.into_iter().filter(|(o, _)| *o >= start).map(|(_, v)| v).collect();
        (start, values)
    };
    // Without a commit, the same messages again.
    for _ in 0..2 {
        let (start, values) = polled(client.call(Operation::Poll, &poll(false, 0)).ok());
        assert_eq!((start, values.len()), (0, 3));
    }
    // Mid-batch: the stored offset is honoured inside the first batch.
    client
        .call(
            Operation::StoreOffset,
            &store(ConsumerId::consumer("c"), Membership::default(), 0, 1),
        )
        .ok();
    let (start, values) = polled(client.call(Operation::Poll, &poll(true, 0)).ok());
    assert_eq!((start, values), (1, vec![b"b".to_vec(), b"c".to_vec()]));
    let consumer = ConsumerId::consumer("c");
    // Auto-commit stored the end of what was returned: the data (0..3) and the store above's
    // control record (3); its own record (4) then lies past it, and an offset with only
    // offset commits after it reads as the end, 5: the consumer has no lag.
    assert_eq!(get(&mut client, &consumer, 0), Some(5), "auto-commit stored the end");
    // At the end: a waiting poll is woken by the next write (pipelined behind it, so it waits
    // first), and continues after the offset commit the last poll wrote.
    client.send(Operation::Poll, &poll(true, WAIT_MS));
    client.send(Operation::Produce, &Raw::produce_body("s", "t", 0, &[b"d"]));
    let (_, values) = polled(client.receive().ok());
    assert_eq!(values, [b"d".to_vec()]);
    client.receive().ok();
}

/// A fetch reply far larger than the socket buffers goes out in many partial writes of its
/// parts (the prefix and the stored batches, written from where they lie, not copied into one
/// body): it must arrive whole, in order, under its checksum (`Raw` verifies it).
#[test]
fn a_fetch_reply_larger_than_the_socket_buffers_arrives_whole_and_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "big", 1, Durability::Replicated).ok();
    let value = |batch: usize, record: usize| vec![(batch * 4 + record) as u8; 12_000];
    for batch in 0..128 {
        let values: Vec<Vec<u8>> = (0..4).map(|record| value(batch, record)).collect();
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        client.produce("s", "big", 0, &refs);
    }
    let mut reader = Raw::connect(server.native(), 2);
    // A receive buffer far smaller than a reply keeps the server's sends short.
    let small: libc::c_int = 64 << 10;
    // SAFETY: a valid socket and an int option of the size given.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&reader.stream),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0);
    let mut records = Vec::new();
    let mut largest_reply = 0;
    while records.len() < 512 {
        let fetch = Fetch {
            stream: "s".into(),
            topic: "big".into(),
            partition: 0,
            from: FetchFrom::Offset(records.len() as u64),
            bytes_max: 16 << 20,
            count_max: 1_000,
            wait_ms_max: 0,
        };
        let answer = reader.call(Operation::Fetch, &fetch.encode());
        largest_reply = largest_reply.max(answer.body.len());
        let (_, found) = decode_fetch(answer.ok());
        assert!(!found.is_empty(), "a fetch from {} found nothing", records.len());
        records.extend(found);
    }
    assert!(largest_reply > 1 << 20, "the largest reply was {largest_reply} bytes");
    assert_eq!(records.len(), 512);
    for (index, (offset, bytes)) in records.iter().enumerate() {
        assert_eq!(*offset, index as u64);
        assert_eq!(bytes, &value(index / 4, index % 4), "record {index}");
    }
}

/// The metric `name` summed over the shards of the page.
fn metric_sum(server: &ShoalProcess, name: &str) -> f64 {
    let page = metrics_page(server.metrics().expect("metrics")).expect("a page");
    page.lines()
        .filter(|line| line.split(['{', ' ']).next() == Some(name))
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A backlog far beyond the partition's ring (1 MiB in the small profile) is read back in
/// order and whole: first from the batch cache that the ring's evictions filled, then, after a
/// restart left the cache empty, from the disk — where each miss caches the rest of its read
/// window, so the fetch after it is a hit, and read-ahead runs ahead of the reader.
#[test]
fn a_backlog_behind_the_ring_is_read_back_from_the_batch_cache_and_by_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "backlog", 1, Durability::Replicated).ok();
    let value = |index: usize| format!("message {index:06} ").repeat(1_000).into_bytes();
    const MESSAGES: usize = 400;
    for index in 0..MESSAGES {
        client.produce("s", "backlog", 0, &[&value(index)]);
    }
    let read_all = |server: &ShoalProcess| {
        let mut reader = Raw::connect(server.native(), 2);
        let mut records = Vec::new();
        for _ in 0..MESSAGES {
            if records.len() == MESSAGES {
                break;
            }
            let fetch = Fetch {
                stream: "s".into(),
                topic: "backlog".into(),
                partition: 0,
                from: FetchFrom::Offset(records.len() as u64),
                bytes_max: 16 << 10,
                count_max: 1_000,
                wait_ms_max: 0,
            };
            let (_, found) = decode_fetch(reader.call(Operation::Fetch, &fetch.encode()).ok());
            assert!(!found.is_empty(), "a fetch from {} found nothing", records.len());
            records.extend(found);
        }
        assert_eq!(records.len(), MESSAGES);
        for (index, (offset, bytes)) in records.iter().enumerate() {
            assert_eq!(*offset, index as u64);
            assert_eq!(bytes, &value(index), "message {index}");
        }
    };
    read_all(&server);
    assert!(metric_sum(&server, "shoal_batch_cache_hits_total") > 0.0);
    assert!(metric_sum(&server, "shoal_batch_cache_bytes") > 0.0);
    restart(&mut server);
    read_all(&server);
    assert!(metric_sum(&server, "shoal_batch_cache_misses_total") >= 1.0);
    assert!(metric_sum(&server, "shoal_batch_cache_hits_total") >= 1.0);
    assert!(metric_sum(&server, "shoal_read_ahead_reads_total") >= 1.0);
}

/// A start after `kill -9` replays each partition's log (its consumer offsets, its producers'
/// batches, its replica's newest headers), and none of that is a consumer's read: the batch
/// cache starts empty, so a node of many partitions neither fills its memory at start nor
/// evicts what consumers will read. The data is all there after.
#[test]
fn a_start_after_a_kill_replays_the_logs_without_filling_the_batch_cache() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 2, Durability::Persisted).ok();
    let value = |index: usize| format!("value {index:05} ").repeat(100).into_bytes();
    const MESSAGES: usize = 200;
    for index in 0..MESSAGES {
        client.produce("s", "t", (index % 2) as u32, &[&value(index)]);
    }
    server.kill_9();
    restart(&mut server);
    assert_eq!(metric_sum(&server, "shoal_batch_cache_bytes"), 0.0, "the start cached nothing");
    assert_eq!(metric_sum(&server, "shoal_batch_cache_misses_total"), 0.0, "no consumer read");
    let mut client = Raw::connect(server.native(), 1);
    for partition in 0..2 {
        let (_, records) = client.fetch("s", "t", partition, FetchFrom::First, 1_000);
        let values: Vec<Vec<u8>> = records.into_iter().map(|(_, v)| v).collect();
        let expected: Vec<Vec<u8>> =
            (0..MESSAGES).filter(|i| i % 2 == partition as usize).map(value).collect();
        assert_eq!(values, expected, "partition {partition}");
    }
}
