//! The replica state machine driven in memory: perfect storage that completes every write at
//! once, a network that delivers in order unless a link is cut. These tests pin the protocol's
//! main paths (VR Revisited §4 normal operation, §4.2 view change, §4.3 recovery, and
//! DESIGN.md §4's deviations) before the simulator adds faults.

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};
use shoal_proto::batch::BatchBuilder;
use shoal_proto::wire::Header;
use shoal_replication::{
    HandOverRefused, Membership, Message, Persisted, RecoveredLog, Replica, ReplicaConfig,
    ReplyResult, Request, Status, Write,
};

/// A replica's durable state.
#[derive(Default, Clone)]
struct Disk {
    view: u32,
    log_view: u32,
    log_view_head_op: Option<u64>,
    log: BTreeMap<u64, (Header, Bytes)>,
}

struct Cluster {
    config: ReplicaConfig,
    replicas: Vec<Option<Replica>>,
    disks: Vec<Disk>,
    queue: VecDeque<(u8, u8, Message)>,
    /// Directed links that are down: (from, to).
    cut: Vec<(u8, u8)>,
    replies: Vec<(u64, ReplyResult)>,
    committed: Vec<Vec<u32>>,
    next_request: u64,
    /// `Commit` messages (heartbeats) sent, per sender.
    commits_sent: Vec<u64>,
}

impl Cluster {
    fn new(n: u8) -> Cluster {
        let mut config = ReplicaConfig::new(7, 3, n, 0);
        config.stamp_batches = false;
        let replicas = (0..n)
            .map(|r| Some(Replica::new(ReplicaConfig { replica: r, ..config }, 42)))
            .collect();
        Cluster {
            config,
            replicas,
            disks: vec![Disk::default(); usize::from(n)],
            queue: VecDeque::new(),
            cut: Vec::new(),
            replies: Vec::new(),
            committed: vec![Vec::new(); usize::from(n)],
            next_request: 1,
            commits_sent: vec![0; usize::from(n)],
        }
    }

    fn primary(&self) -> Option<u8> {
        let mut primaries = self
            .replicas
            .iter()
            .flatten()
            .filter(|r| r.is_primary())
            .map(|r| (r.view(), r.config().replica))
            .collect::<Vec<_>>();
        primaries.sort();
        primaries.last().map(|(_, r)| *r)
    }

    fn request(&mut self, to: u8) -> u64 {
        let body = BytesMut::from(&format!("batch {}", self.next_request).into_bytes()[..]);
        self.send(to, body)
    }

    /// Sends an idempotent producer's batch (producer 77, `epoch`, one record at `sequence`)
    /// under a new request number, as a client resending after a lost reply would.
    fn produce(&mut self, to: u8, epoch: i16, sequence: i32) -> u64 {
        let mut batch = BatchBuilder::new(1).producer(77, epoch, sequence);
        batch.push(1, None, Some(format!("record {sequence}").as_bytes()), &[]);
        self.send(to, BytesMut::from(&batch.build()[..]))
    }

    fn reply(&self, request: u64) -> Option<&ReplyResult> {
        self.replies.iter().find(|(r, _)| *r == request).map(|(_, result)| result)
    }

    fn send(&mut self, to: u8, body: BytesMut) -> u64 {
        let request = self.next_request;
        self.next_request += 1;
        let body_checksum = shoal_proto::checksum::crc32c(&body);
        let replica = self.replicas[usize::from(to)].as_mut().expect("up");
        replica.on_client_request(Request {
            client: 1,
            session: 1,
            request,
            body,
            body_checksum,
            record_count: 1,
            first_timestamp_ms: 0,
            max_timestamp_ms: 0,
            append_time_ms: 0,
        });
        self.drain(to);
        request
    }

    /// Handles a replica's ready: writes complete at once, then every message leaves.
    fn drain(&mut self, index: u8) {
        let i = usize::from(index);
        let Some(replica) = self.replicas[i].as_mut() else { return };
        let ready = replica.take_ready();
        let mut persisted = Vec::new();
        for write in ready.writes {
            let disk = &mut self.disks[i];
            match write {
                Write::Append { header, body } => {
                    let op = header.as_prepare().unwrap().op;
                    disk.log.insert(op, (header, body));
                    persisted.push(Persisted::Appended { op });
                }
                Write::Views { view, log_view, log_view_head_op } => {
                    assert!(view >= disk.view && log_view >= disk.log_view, "views regress");
                    disk.view = view;
                    disk.log_view = log_view;
                    disk.log_view_head_op = log_view_head_op;
                    persisted.push(Persisted::Views { view, log_view });
                }
                Write::Truncate { op, .. } => {
                    disk.log.retain(|&o, _| o <= op);
                    persisted.push(Persisted::Truncated { op });
                }
                Write::Install { header, body, state } => {
                    disk.log.clear();
                    disk.log.insert(state.op, (header, body));
                    persisted.push(Persisted::Installed { op: state.op });
                }
            }
        }
        for envelope in ready.messages.into_iter().chain(ready.persisted_messages) {
            if matches!(envelope.message, Message::Commit { .. }) {
                self.commits_sent[usize::from(envelope.from)] += 1;
            }
            self.queue.push_back((envelope.from, envelope.to, envelope.message));
        }
        for read in ready.reads {
            if let Some((header, body)) = self.disks[i].log.get(&read.op)
                && read.checksum.is_none_or(|c| c == header.checksum_header)
            {
                let message = Message::Prepare { header: *header, body: body.clone() };
                self.queue.push_back((index, read.to, message));
            }
        }
        for committed in ready.committed {
            let header = committed.header().expect("no transfers without storage");
            self.committed[i].push(header.checksum_header);
        }
        for reply in ready.replies {
            self.replies.push((reply.request, reply.result));
        }
        if !persisted.is_empty() {
            let replica = self.replicas[i].as_mut().expect("up");
            for p in persisted {
                replica.on_persisted(p);
            }
            self.drain(index);
        }
    }

    fn deliver_all(&mut self) {
        for _ in 0..100_000 {
            let Some((from, to, message)) = self.queue.pop_front() else { return };
            if self.cut.contains(&(from, to)) {
                continue;
            }
            let Some(replica) = self.replicas[usize::from(to)].as_mut() else { continue };
            replica.on_message(from, message);
            self.drain(to);
        }
        panic!("livelock: the message queue never drained");
    }

    /// Delivers queued messages one at a time until `done` holds; false when the queue ran dry
    /// first.
    fn deliver_until(&mut self, done: impl Fn(&Cluster) -> bool) -> bool {
        while !done(self) {
            let Some((from, to, message)) = self.queue.pop_front() else { return false };
            if self.cut.contains(&(from, to)) {
                continue;
            }
            let Some(replica) = self.replicas[usize::from(to)].as_mut() else { continue };
            replica.on_message(from, message);
            self.drain(to);
        }
        true
    }

    fn tick(&mut self, ticks: u64) {
        for _ in 0..ticks {
            for i in 0..self.replicas.len() {
                if let Some(replica) = self.replicas[i].as_mut() {
                    replica.on_tick();
                    self.drain(i as u8);
                }
            }
            self.deliver_all();
        }
    }

    fn crash(&mut self, index: u8) {
        self.replicas[usize::from(index)] = None;
    }

    fn restart(&mut self, index: u8) {
        let disk = &self.disks[usize::from(index)];
        let headers = disk.log.values().map(|(h, _)| *h).collect::<Vec<_>>();
        let keep = headers.len().saturating_sub(self.config.view_headers_max);
        let recovered = RecoveredLog {
            view: disk.view,
            log_view: disk.log_view,
            headers: headers[keep..].to_vec(),
            faulty_from: None,
            commit_min: 0,
            log_view_head_op: disk.log_view_head_op,
        };
        let config = ReplicaConfig { replica: index, ..self.config };
        self.replicas[usize::from(index)] = Some(Replica::recover(config, recovered, 9));
    }

    fn committed_reply(&self, request: u64) -> Option<u64> {
        self.replies.iter().find_map(|(r, result)| match result {
            ReplyResult::Committed { op, .. } if *r == request => Some(*op),
            _ => None,
        })
    }

    /// Every replica's applied sequence is a prefix of the longest one.
    fn check_committed_prefixes(&self) {
        let longest = self.committed.iter().max_by_key(|c| c.len()).unwrap();
        for committed in &self.committed {
            assert_eq!(committed[..], longest[..committed.len()], "committed logs diverge");
        }
    }

    fn replica(&self, index: u8) -> &Replica {
        self.replicas[usize::from(index)].as_ref().expect("up")
    }

    fn replica_mut(&mut self, index: u8) -> &mut Replica {
        self.replicas[usize::from(index)].as_mut().expect("up")
    }
}

#[test]
fn a_single_replica_commits_each_request_once_durable() {
    let mut cluster = Cluster::new(1);
    for _ in 0..5 {
        let request = cluster.request(0);
        assert!(cluster.committed_reply(request).is_some());
    }
    assert_eq!(cluster.replica(0).commit(), 5);
}

#[test]
fn three_replicas_commit_on_a_quorum_and_agree() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().expect("view 0 has a primary");
    let mut requests = Vec::new();
    for _ in 0..10 {
        requests.push(cluster.request(primary));
        cluster.deliver_all();
    }
    cluster.tick(20);
    for (i, request) in requests.iter().enumerate() {
        assert_eq!(cluster.committed_reply(*request), Some(i as u64 + 1));
    }
    for r in 0..3 {
        assert_eq!(cluster.replica(r).commit(), 10, "replica {r} learns the commit point");
    }
    cluster.check_committed_prefixes();
}

/// A settled group (nothing in flight, both backups holding the head and the commit point)
/// heartbeats every idle interval instead of every commit interval, and its backups never time
/// out; a write brings the commit interval back at once, so the backups learn the new commit
/// point within one; a backup that stops answering keeps the group unsettled.
#[test]
fn a_settled_group_heartbeats_at_the_idle_interval_until_the_next_write() {
    let mut cluster = Cluster::new(3);
    let config = cluster.config;
    assert!(config.idle_heartbeat_interval_ticks >= 2 * config.commit_interval_ticks);
    let primary = cluster.primary().unwrap();
    let p = usize::from(primary);
    let request = cluster.request(primary);
    cluster.deliver_all();
    assert_eq!(cluster.committed_reply(request), Some(1));
    // A few commit intervals settle it: the backups learn the commit point and acknowledge it.
    cluster.tick(5 * config.commit_interval_ticks);
    let window = 20 * config.idle_heartbeat_interval_ticks;
    // The primary's heartbeats per backup over `window` ticks must come every `interval`.
    let beats_every = |cluster: &mut Cluster, interval: u64, case: &str| {
        let before = cluster.commits_sent[p];
        cluster.tick(window);
        let heartbeats = (cluster.commits_sent[p] - before) / 2;
        let expected = window / interval;
        assert!(
            (expected - 1..=expected + 1).contains(&heartbeats),
            "{heartbeats} heartbeats per backup in {window} ticks {case}"
        );
    };
    beats_every(&mut cluster, config.idle_heartbeat_interval_ticks, "of a settled group");
    // Across many heartbeat timeouts, no backup moved on.
    cluster.tick(10 * config.heartbeat_timeout_ticks);
    assert_eq!(cluster.primary(), Some(primary));
    for r in 0..3 {
        assert_eq!(cluster.replica(r).view(), 0, "replica {r} stayed in view 0");
    }
    // A write just after an idle heartbeat: its commit point reaches the backups within one
    // commit interval, not at the next idle heartbeat.
    let sent = cluster.commits_sent[p];
    for _ in 0..config.idle_heartbeat_interval_ticks {
        if cluster.commits_sent[p] > sent {
            break;
        }
        cluster.tick(1);
    }
    assert!(cluster.commits_sent[p] > sent, "an idle heartbeat within its interval");
    let request = cluster.request(primary);
    cluster.deliver_all();
    assert_eq!(cluster.committed_reply(request), Some(2));
    cluster.tick(config.commit_interval_ticks);
    for r in 0..3 {
        assert_eq!(cluster.replica(r).commit(), 2, "replica {r} learns the new commit point");
    }
    // A backup cut off never acknowledges the next op: the group stays unsettled and keeps
    // the commit interval.
    let cut = (primary + 1) % 3;
    cluster.cut = vec![(primary, cut), (cut, primary)];
    let request = cluster.request(primary);
    cluster.deliver_all();
    assert_eq!(cluster.committed_reply(request), Some(3));
    beats_every(&mut cluster, config.commit_interval_ticks, "with a backup cut off");
}

#[test]
fn a_backup_refuses_writes_naming_the_primary() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().unwrap();
    let backup = (primary + 1) % 3;
    let request = cluster.request(backup);
    let reply = cluster.replies.iter().find(|(r, _)| *r == request).unwrap();
    assert_eq!(reply.1, ReplyResult::NotPrimary { view: 0, primary });
}

/// VR Revisited §4.2: the backups notice the primary's silence, change view, and the new
/// primary keeps every committed op.
#[test]
fn a_dead_primary_is_replaced_and_committed_ops_survive() {
    for n in [3, 5] {
        let mut cluster = Cluster::new(n);
        let old = cluster.primary().unwrap();
        for _ in 0..4 {
            cluster.request(old);
            cluster.deliver_all();
        }
        cluster.crash(old);
        cluster.tick(600);
        let new = cluster.primary().expect("a new primary");
        assert_ne!(new, old);
        assert!(cluster.replica(new).view() > 0);
        assert!(cluster.replica(new).commit() >= 4, "committed ops kept");
        let request = cluster.request(new);
        cluster.tick(20);
        assert!(cluster.committed_reply(request).is_some(), "n = {n}: the new view serves");
        cluster.check_committed_prefixes();
        assert!(
            cluster.replicas.iter().flatten().map(|r| r.counters().views_started).sum::<u64>() >= 1
        );
    }
}

/// DESIGN.md §4: a backup that cannot hear the primary (but is heard) votes alone; the other
/// backup never joins on receipt, so the healthy primary stays.
#[test]
fn a_one_way_partitioned_backup_cannot_depose_a_healthy_primary() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().unwrap();
    let deaf = (primary + 1) % 3;
    cluster.cut.push((primary, deaf));
    cluster.tick(800);
    assert!(cluster.replica(deaf).counters().votes_cast > 0, "the deaf backup voted");
    assert_eq!(cluster.primary(), Some(primary));
    assert_eq!(cluster.replica(primary).view(), 0);
    let request = cluster.request(primary);
    cluster.tick(10);
    assert!(cluster.committed_reply(request).is_some());
}

/// VR Revisited §4.3, DESIGN.md §4 Restart: a restarted replica stays out until a StartView
/// from the current primary, then catches up.
#[test]
fn a_restarted_backup_rejoins_through_start_view() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().unwrap();
    let backup = (primary + 1) % 3;
    for _ in 0..3 {
        cluster.request(primary);
        cluster.deliver_all();
    }
    cluster.crash(backup);
    for _ in 0..3 {
        cluster.request(primary);
        cluster.deliver_all();
    }
    cluster.restart(backup);
    assert_eq!(cluster.replica(backup).status(), Status::Recovering);
    cluster.tick(100);
    assert_eq!(cluster.replica(backup).status(), Status::Normal);
    assert_eq!(cluster.replica(backup).commit(), 6, "caught up by repair");
    assert_eq!(cluster.primary(), Some(primary), "no view change was needed");
}

/// DESIGN.md §4 Restart: when every replica restarts at once nobody answers the probes; they
/// fall back to a view change offering their logs, and nothing committed is lost.
#[test]
fn all_replicas_restarting_at_once_come_back_with_their_log() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().unwrap();
    let mut requests = Vec::new();
    for _ in 0..5 {
        requests.push(cluster.request(primary));
        cluster.deliver_all();
    }
    for r in 0..3 {
        cluster.crash(r);
    }
    for r in 0..3 {
        cluster.restart(r);
    }
    cluster.tick(1_000);
    let new = cluster.primary().expect("the cluster comes back");
    assert!(cluster.replica(new).commit() >= 5);
    assert!(
        cluster.replicas.iter().flatten().map(|r| r.counters().recovery_view_changes).sum::<u64>()
            > 0
    );
    let request = cluster.request(new);
    cluster.tick(20);
    assert_eq!(cluster.committed_reply(request), Some(6));
}

/// Cuts the primary's messages to every backup (no acknowledgement reaches it until
/// `cluster.cut` is cleared); returns the primary.
fn cut_off_primary(cluster: &mut Cluster) -> u8 {
    let primary = cluster.primary().unwrap();
    for backup in 0..3 {
        if backup != primary {
            cluster.cut.push((primary, backup));
        }
    }
    primary
}

/// The pipeline bound (`pipeline_prepares_max`): with no backup acknowledging, the primary takes
/// exactly that many requests, refuses the next with TransientNotAccepted (never entered the
/// log), and commits them all once the backups are back.
#[test]
fn the_primary_pipeline_is_bounded_and_refuses_beyond_it() {
    let mut cluster = Cluster::new(3);
    let primary = cut_off_primary(&mut cluster);
    let bound = cluster.config.pipeline_prepares_max;
    let accepted: Vec<u64> = (0..bound).map(|_| cluster.request(primary)).collect();
    let refused = cluster.request(primary);
    assert!(cluster.replies.iter().all(|(r, _)| *r == refused), "only the extra one answered");
    assert_eq!(cluster.replies, vec![(refused, ReplyResult::TransientNotAccepted)]);
    assert_eq!(cluster.replica(primary).op(), bound);
    cluster.cut.clear();
    cluster.tick(50);
    for request in accepted {
        assert!(cluster.committed_reply(request).is_some(), "request {request} commits");
    }
}

/// Network input never panics a replica (DESIGN.md §6): well-checksummed messages with arbitrary
/// views, ops, commit points, nonces, flags and header subsets, from any peer, in any state.
#[test]
fn arbitrary_peer_messages_never_panic_a_replica() {
    let mut rng = shoal_engine::rng::Rng::new(99);
    for round in 0..20 {
        let mut cluster = Cluster::new(3);
        let primary = cluster.primary().unwrap();
        for _ in 0..(5 + round) {
            cluster.request(primary);
            cluster.deliver_all();
        }
        let headers: Vec<Header> =
            cluster.disks[usize::from(primary)].log.values().map(|(header, _)| *header).collect();
        for _ in 0..300 {
            let to = rng.below(3) as u8;
            let from = rng.below(4) as u8;
            let view = rng.below(6) as u32;
            let op = rng.below(40);
            let start = rng.below(headers.len() as u64) as usize;
            let end = start + rng.below((headers.len() - start) as u64 + 1) as usize;
            let slice = headers[start..end].to_vec();
            let flags = slice.iter().map(|_| rng.below(4) as u8).collect();
            let message = match rng.below(8) {
                0 => Message::PrepareOk {
                    view,
                    op,
                    commit: op,
                    prepare_checksum: rng.next_u64() as u32,
                },
                1 => Message::Commit { view, commit: op, commit_checksum: rng.next_u64() as u32 },
                2 => Message::StartViewChange { view, membership: Membership::first(3, 3) },
                3 => Message::DoViewChange {
                    view,
                    log_view: rng.below(6) as u32,
                    op,
                    commit: rng.below(40),
                    faulty_from: rng.chance(1, 2).then(|| rng.below(40)),
                    log_complete: rng.chance(1, 2),
                    log_view_head_op: rng.chance(1, 2).then(|| rng.below(40)),
                    headers: slice,
                    flags,
                },
                4 => Message::StartView {
                    view,
                    op,
                    commit: rng.below(40),
                    nonce: rng.below(3),
                    headers: slice,
                    membership: if rng.chance(1, 2) {
                        Membership::first(3, 3)
                    } else {
                        Membership {
                            voters: rng.next_u64() as u32,
                            learners: rng.next_u64() as u32,
                        }
                    },
                },
                5 => Message::RequestStartView { view, nonce: rng.next_u64() },
                6 => Message::RequestPrepare {
                    view,
                    op,
                    checksum: rng.chance(1, 2).then(|| rng.next_u64() as u32),
                },
                _ => {
                    let Some((header, body)) =
                        cluster.disks[usize::from(primary)].log.get(&(op + 1)).cloned()
                    else {
                        continue;
                    };
                    Message::Prepare { header, body }
                }
            };
            if let Some(replica) = cluster.replicas[usize::from(to)].as_mut() {
                replica.on_message(from, message);
                if rng.chance(1, 8) {
                    replica.on_tick();
                }
            }
            cluster.drain(to);
        }
        cluster.tick(400);
        cluster.check_committed_prefixes();
    }
}

/// A view change before any write starts the next view (every DoViewChange carries no header).
#[test]
fn a_view_change_before_any_write_starts_the_next_view() {
    for n in [3, 5] {
        let mut cluster = Cluster::new(n);
        let old = cluster.primary().unwrap();
        cluster.crash(old);
        cluster.tick(600);
        let new = cluster.primary().expect("a new primary");
        assert_ne!(new, old);
        assert_eq!(cluster.replica(new).op(), 0);
        let request = cluster.request(new);
        cluster.tick(20);
        assert_eq!(cluster.committed_reply(request), Some(1));
    }
}

// --- Hand-over (DESIGN.md §8) ------------------------------------------------------------------

/// DESIGN.md §8 (a deliberate view change) with VR Revisited §4.2: the primary hands the group
/// to a backup two views ahead. It refuses new requests until the target has acknowledged its
/// head, then votes for the target's view; the other replicas join on their primary's vote and
/// the target starts the view from the merged logs, holding every body already — all on
/// messages alone, without a single tick, so no timeout is involved. Nothing committed is lost,
/// and the new primary serves at once.
#[test]
fn a_hand_over_moves_the_group_to_its_target_on_messages_alone() {
    for n in [3, 5] {
        let mut cluster = Cluster::new(n);
        let old = cluster.primary().unwrap();
        for _ in 0..4 {
            cluster.request(old);
            cluster.deliver_all();
        }
        let target = (old + 2) % n;
        assert_eq!(
            cluster.replica_mut(old).hand_over(old),
            Err(HandOverRefused::NotAPeer { to: old })
        );
        assert_eq!(cluster.replica_mut(old).hand_over(n), Err(HandOverRefused::NotAPeer { to: n }));
        assert_eq!(cluster.replica_mut(target).hand_over(old), Err(HandOverRefused::NotPrimary));
        let view = cluster.replica_mut(old).hand_over(target).expect("the primary hands over");
        assert_eq!(view, 2, "n = {n}: the first view the target leads");
        assert_eq!(cluster.config.primary_of(view), target);
        cluster.drain(old);
        // The target's acknowledgement is still on its way: nothing new enters the log.
        let refused = cluster.request(old);
        assert_eq!(cluster.reply(refused), Some(&ReplyResult::TransientNotAccepted));
        cluster.deliver_all();
        assert_eq!(cluster.primary(), Some(target), "n = {n}");
        let new = cluster.replica(target);
        assert_eq!((new.view(), new.commit()), (view, 4), "n = {n}");
        assert_eq!(new.counters().bodies_fetched_for_view, 0, "n = {n}");
        let counters = cluster.replica(old).counters();
        assert_eq!((counters.hand_overs_begun, counters.hand_overs_done), (1, 1), "n = {n}");
        for r in (0..n).filter(|&r| r != old) {
            assert_eq!(cluster.replica(r).counters().abdications_joined, 1, "n = {n} r = {r}");
        }
        let request = cluster.request(target);
        cluster.tick(20);
        assert_eq!(cluster.committed_reply(request), Some(5), "n = {n}: the new view serves");
        cluster.check_committed_prefixes();
    }
}

/// DESIGN.md §4 ("a sent DoViewChange binds": the replica never serves below that view), the
/// rule a hand-over relies on: the old primary has handed over, and the target's messages then
/// reach nobody. A write sent to the old primary must not commit in the old view: if it did
/// (with the third replica's acknowledgement), the third — not yet told it committed — would
/// later install the new view's log without it, and the new view would commit another op at
/// its place. Whatever the links do afterwards, every replica ends with the same committed log.
///
/// `canary-handover-unsafe` (the old primary sends the target its log and keeps serving) commits
/// the write in view 0: committed logs diverge at op 4.
#[test]
fn the_old_primary_commits_nothing_once_it_handed_over() {
    let mut cluster = Cluster::new(3);
    let (old, target, third) = (0, 1, 2);
    assert_eq!(cluster.primary(), Some(old));
    for _ in 0..3 {
        cluster.request(old);
        cluster.deliver_all();
    }
    cluster.tick(10);
    cluster.replica_mut(old).hand_over(target).expect("the primary hands over");
    cluster.drain(old);
    assert!(cluster.deliver_until(|c| c.replica(old).counters().hand_overs_done > 0));
    cluster.cut = vec![(target, old), (target, third)];
    cluster.deliver_all();
    let late = cluster.request(old);
    cluster.deliver_all();
    // The third replica now hears the target, not the old primary.
    cluster.cut = vec![(old, third)];
    cluster.tick(400);
    let primary = cluster.primary().expect("a view serves");
    let after = cluster.request(primary);
    cluster.tick(400);
    cluster.cut.clear();
    cluster.tick(600);
    cluster.check_committed_prefixes();
    assert!(cluster.committed_reply(after).is_some(), "the later write never committed");
    let committed = cluster.committed_reply(late);
    assert_eq!(committed, None, "the old primary committed a write after handing over");
    for r in 0..3 {
        assert_eq!(cluster.replica(r).status(), Status::Normal, "replica {r}");
    }
}

// --- Idempotent produce (DESIGN.md §4) ----------------------------------------------------------

/// A retried batch that already committed is answered with its original op and offset and
/// never enters the log again; a gap, an unknown producer's non-zero sequence and an older
/// epoch are refused before the log.
#[test]
fn a_committed_duplicate_gets_its_original_offsets_and_bad_sequences_are_refused() {
    let mut cluster = Cluster::new(3);
    let primary = cluster.primary().unwrap();
    let first = cluster.produce(primary, 0, 0);
    cluster.tick(5);
    let second = cluster.produce(primary, 0, 1);
    cluster.tick(5);
    assert_eq!(cluster.committed_reply(first), Some(1));
    assert_eq!(cluster.committed_reply(second), Some(2));
    let retry = cluster.produce(primary, 0, 0);
    assert_eq!(cluster.reply(retry), Some(&ReplyResult::Committed { op: 1, base_offset: 0 }));
    let gap = cluster.produce(primary, 0, 3);
    assert_eq!(cluster.reply(gap), Some(&ReplyResult::OutOfOrderSequence));
    let mut stranger = BatchBuilder::new(1).producer(78, 0, 5);
    stranger.push(1, None, Some(b"x"), &[]);
    let unknown = cluster.send(primary, BytesMut::from(&stranger.build()[..]));
    assert_eq!(cluster.reply(unknown), Some(&ReplyResult::UnknownProducer));
    let bumped = cluster.produce(primary, 1, 0);
    cluster.tick(5);
    assert_eq!(cluster.committed_reply(bumped), Some(3));
    let fenced = cluster.produce(primary, 0, 2);
    assert_eq!(cluster.reply(fenced), Some(&ReplyResult::ProducerFenced));
    assert_eq!(cluster.replica(primary).op(), 3, "nothing refused or duplicated took an op");
    assert_eq!(cluster.replica(primary).counters().duplicates, 1);
    for r in 0..3 {
        assert_eq!(cluster.replica(r).producers().len(), 1, "replica {r} applied the batches");
    }
}

/// A retry of a batch still in the pipeline takes no op: it gets the original op's reply when
/// that op commits.
#[test]
fn a_duplicate_still_in_the_pipeline_gets_the_original_ops_reply() {
    let mut cluster = Cluster::new(3);
    let primary = cut_off_primary(&mut cluster);
    let original = cluster.produce(primary, 0, 0);
    let retry = cluster.produce(primary, 0, 0);
    assert_eq!(cluster.replica(primary).op(), 1, "the retry took no op");
    assert!(cluster.replies.is_empty(), "neither is answered before the op commits");
    // The next sequence follows the uncommitted batch.
    let next = cluster.produce(primary, 0, 1);
    assert_eq!(cluster.replica(primary).op(), 2);
    cluster.cut.clear();
    cluster.tick(50);
    let committed = ReplyResult::Committed { op: 1, base_offset: 0 };
    assert_eq!(cluster.reply(original), Some(&committed));
    assert_eq!(cluster.reply(retry), Some(&committed));
    assert_eq!(cluster.committed_reply(next), Some(2));
}

/// Retries of a batch in the pipeline wait for its op at most four at a time
/// (`DUPLICATES_WAITING_MAX`): the fifth is answered `TransientNotAccepted` at once, and the four
/// get the original op's reply when it commits.
#[test]
fn at_most_four_retries_of_a_batch_in_the_pipeline_wait_for_its_op() {
    let mut cluster = Cluster::new(3);
    let primary = cut_off_primary(&mut cluster);
    let original = cluster.produce(primary, 0, 0);
    let waiting: Vec<_> = (0..4).map(|_| cluster.produce(primary, 0, 0)).collect();
    assert!(cluster.replies.is_empty(), "the original and four retries wait");
    let fifth = cluster.produce(primary, 0, 0);
    assert_eq!(cluster.reply(fifth), Some(&ReplyResult::TransientNotAccepted));
    assert_eq!(cluster.replica(primary).op(), 1, "no retry took an op");
    cluster.cut.clear();
    cluster.tick(50);
    let committed = ReplyResult::Committed { op: 1, base_offset: 0 };
    for request in std::iter::once(original).chain(waiting) {
        assert_eq!(cluster.reply(request), Some(&committed));
    }
}

/// VR Revisited §4.2 with DESIGN.md §4: every replica applies committed batches to its table,
/// and a new primary lays its uncommitted log over it, so a retry sent to the new primary —
/// of a batch the old one committed, or of one it only prepared — is not applied twice.
#[test]
fn a_retry_after_a_view_change_is_not_applied_twice() {
    let mut cluster = Cluster::new(3);
    let old = cluster.primary().unwrap();
    let committed = cluster.produce(old, 0, 0);
    cluster.tick(5);
    assert_eq!(cluster.committed_reply(committed), Some(1));
    // The second batch reaches the backups, but the old primary dies before it hears them.
    let prepared = cluster.produce(old, 0, 1);
    cluster.crash(old);
    cluster.tick(600);
    let new = cluster.primary().expect("a new primary");
    assert_ne!(new, old);
    let retry_committed = cluster.produce(new, 0, 0);
    let retry_prepared = cluster.produce(new, 0, 1);
    cluster.tick(20);
    assert_eq!(
        cluster.reply(retry_committed),
        Some(&ReplyResult::Committed { op: 1, base_offset: 0 })
    );
    assert_eq!(cluster.committed_reply(retry_prepared), Some(2));
    assert!(cluster.reply(prepared).is_none_or(|r| *r == ReplyResult::TransientNotCommitted));
    assert_eq!(cluster.replica(new).op(), 2, "neither retry took an op");
    let next = cluster.produce(new, 0, 2);
    cluster.tick(20);
    assert_eq!(cluster.committed_reply(next), Some(3));
    cluster.check_committed_prefixes();
}

/// DESIGN.md §4 "rebuilt from the log": a restarted replica handed the table and the
/// uncommitted ops' fields by its driver still recognises a retry after it becomes primary.
#[test]
fn a_restarted_replica_with_its_rebuilt_table_recognises_retries() {
    let mut cluster = Cluster::new(1);
    let first = cluster.produce(0, 0, 0);
    assert_eq!(cluster.committed_reply(first), Some(1));
    let table = cluster.replica(0).producers().clone();
    cluster.crash(0);
    cluster.restart(0);
    cluster.replicas[0].as_mut().unwrap().recover_producers(table, &[]);
    cluster.tick(200);
    assert!(cluster.replica(0).is_primary());
    let retry = cluster.produce(0, 0, 0);
    assert_eq!(cluster.reply(retry), Some(&ReplyResult::Committed { op: 1, base_offset: 0 }));
    let next = cluster.produce(0, 0, 1);
    assert_eq!(cluster.committed_reply(next), Some(2));
}

// --- Merging: an older view's op found on a replica of a lower log view ------------------------

/// A prepare of `view` at `op` continuing `parent`, as group 3 of cluster 7 logs it.
fn logged_prepare(view: u32, op: u64, parent: u32) -> Header {
    let fields = shoal_proto::wire::Prepare {
        group: 3,
        op,
        commit: op - 1,
        parent,
        base_offset: op - 1,
        record_count: 1,
        ..Default::default()
    };
    Header::prepare(7, view, 0, fields, format!("op {op} of view {view}").as_bytes())
}

/// A DoViewChange for view 5 offering `headers`, all with bodies.
fn offered(log_view: u32, faulty_from: Option<u64>, headers: &[Header]) -> Message {
    Message::DoViewChange {
        view: 5,
        log_view,
        op: headers.last().map_or(0, |h| h.as_prepare().unwrap().op),
        commit: 10,
        faulty_from,
        log_complete: false,
        log_view_head_op: None,
        headers: headers.to_vec(),
        flags: vec![shoal_replication::FLAG_PRESENT; headers.len()],
    }
}

/// DESIGN.md §4 ("if an op can be neither proven dead nor found, the view does not start"): five
/// replicas merge view 5. The new primary (log view 4, restarted, so it cannot refute older
/// ops) and two replicas of log view 3 hold ops 1..=10; a replica of log view 2 also holds op 11,
/// an older view's op nobody can prove dead. When one log-view-3 replica lacks op 11 outright,
/// a committed op 11 would need an acknowledgement from the only replica that holds one (the
/// faulty one, the lower one and the one not heard from cannot make the quorum of three alone):
/// the merge finds op 11 there and starts the view with it. When both log-view-3 replicas
/// are faulty at op 11 they and the silent replica could have committed a different op 11 and
/// lost it, so the merge must wait rather than take the lower replica's op.
#[test]
fn a_merge_takes_an_older_views_op_only_where_its_holder_must_have_acknowledged_it() {
    let mut chain = Vec::new();
    let mut parent = 0;
    for op in 1..=10 {
        let header = logged_prepare(1, op, parent);
        parent = header.checksum_header;
        chain.push(header);
    }
    let older = logged_prepare(2, 11, parent);
    let with_older = [chain.clone(), vec![older]].concat();
    for second_faulty in [false, true] {
        let config = ReplicaConfig::new(7, 3, 5, 3);
        assert_eq!(config.primary_of(5), 3);
        let recovered = RecoveredLog {
            view: 4,
            log_view: 4,
            headers: chain.clone(),
            faulty_from: None,
            commit_min: 10,
            log_view_head_op: None,
        };
        let mut primary = Replica::recover(config, recovered, 9);
        for _ in 0..100_000 {
            if primary.status() == Status::ViewChange {
                break;
            }
            primary.on_tick();
            primary.take_ready();
        }
        assert_eq!((primary.status(), primary.view()), (Status::ViewChange, 5));
        primary.on_message(0, offered(3, Some(11), &chain));
        let second = if second_faulty { Some(11) } else { None };
        primary.on_message(1, offered(3, second, &chain));
        primary.on_message(2, offered(2, None, &with_older));
        let found = primary.counters().older_ops_found;
        if second_faulty {
            assert_eq!(found, 0, "took op 11 that faulty replicas may have committed otherwise");
            assert!(primary.counters().merges_stalled > 0);
            assert_eq!(primary.op(), 10);
        } else {
            assert_eq!(found, 1);
            assert_eq!(primary.op(), 11, "the merged log ends with the found op");
            assert_eq!(primary.header(11), Some(&older));
        }
    }
}

// --- Configuration epochs across a restart ----------------------------------------------------

/// A replica that entered epoch 1 by installing its opening StartView (its view and log view
/// durable in epoch 1) and crashed before the change's body arrived restarts with a log that
/// ends below the change and names no member of epoch 1. The change is committed (by the old
/// voters, who may not be among the new ones), so the restarted replica must not nack it: it
/// reports everything above its head faulty, votes in nothing, and takes its members from the
/// first vote of its epoch.
#[test]
fn a_restart_that_lost_its_epochs_opening_nacks_nothing_above_its_head() {
    let mut headers = Vec::new();
    let mut parent = 0;
    for op in 1..=19 {
        let header = logged_prepare(1, op, parent);
        parent = header.checksum_header;
        headers.push(header);
    }
    let opening = shoal_replication::first_view_of(1);
    let recovered = RecoveredLog {
        view: opening,
        log_view: opening,
        headers,
        log_view_head_op: Some(20),
        ..RecoveredLog::default()
    };
    let config = ReplicaConfig::new(7, 3, 4, 3);
    let mut replica = Replica::recover(config, recovered, 1);
    assert_eq!(replica.epoch(), 1);
    assert_eq!(replica.faulty_from(), Some(20), "the lost change above the head is faulty");
    for _ in 0..2_000 {
        replica.on_tick();
    }
    assert_eq!(replica.counters().votes_cast, 0, "no vote without its epoch's members");
    assert_eq!(replica.status(), Status::Recovering);
    let members = Membership { voters: 0b1110, learners: 0b0001 };
    replica.on_message(1, Message::StartViewChange { view: opening + 1, membership: members });
    assert_eq!(replica.config().members, members, "a vote of its epoch names the members");
}
