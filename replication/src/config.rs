//! The replica's settings: group membership, pipeline and header bounds, and every timer, in
//! ticks (one tick is 10 ms in production; the driver decides).
//!
//! This module owns defaults and validation only; it never reads the environment or a file.

pub use shoal_proto::wire::Membership;

/// Milliseconds per tick in production.
pub const TICK_MS: u64 = 10;

/// A view number's low bits count the views of one configuration epoch and its high bits name
/// the epoch, so every member entering epoch `e` enters the same first view, and views stay
/// ordered across epochs (storage judges dead prepares by view).
pub const EPOCH_VIEW_BITS: u32 = 20;

/// The last epoch a view number can name: a group changes its configuration at most this often.
pub const EPOCH_MAX: u32 = u32::MAX >> EPOCH_VIEW_BITS;

/// The configuration epoch `view` belongs to.
pub fn epoch_of(view: u32) -> u32 {
    view >> EPOCH_VIEW_BITS
}

/// The first view of `epoch`.
pub fn first_view_of(epoch: u32) -> u32 {
    epoch << EPOCH_VIEW_BITS
}

/// One replica's settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaConfig {
    /// Cluster id every message and prepare carries.
    pub cluster: u64,
    /// The VSR group.
    pub group: u64,
    /// Member slots of the group (at most 32): every member index, in any epoch, is below it.
    pub replica_count: u8,
    /// The members in epoch 0: voters, and *learners* (DESIGN.md §8), which take prepares,
    /// commit and repair like backups, but whose acknowledgements never count in a quorum, who
    /// never vote or lead a view, and who cannot make the primary leave its view. A replica
    /// keeps its current epoch's members here: a configuration change replaces them.
    pub members: Membership,
    /// This replica's index in the group.
    pub replica: u8,
    /// Uncommitted prepares the primary keeps in flight at most.
    pub pipeline_prepares_max: u64,
    /// Headers a DoViewChange or StartView carries at most (≥ the pipeline).
    pub view_headers_max: usize,
    /// The primary broadcasts its commit point (the heartbeat) this often.
    pub commit_interval_ticks: u64,
    /// The heartbeat's interval instead, while the group is settled: nothing in flight, and
    /// every peer has acknowledged the head and the commit point it now carries. Ten
    /// heartbeats a second for each of 10,000 idle groups were most of an idle cluster's CPU;
    /// a settled group's heartbeat only proves the primary alive, which a few heartbeats per
    /// `heartbeat_timeout_ticks` do. Equal to `commit_interval_ticks`, groups never slow down.
    pub idle_heartbeat_interval_ticks: u64,
    /// A backup that hears nothing from its primary this long votes for a view change (a
    /// random extra of up to half of it spreads the votes out).
    pub heartbeat_timeout_ticks: u64,
    /// A view change that has not started its view after this long moves to the next view.
    pub view_change_timeout_ticks: u64,
    /// A received vote counts this long after it arrived (voters repeat theirs every commit
    /// interval, so a withdrawn vote fades).
    pub vote_ttl_ticks: u64,
    /// First retransmission delay of an unacknowledged prepare; doubles per retry.
    pub prepare_retry_ticks_min: u64,
    /// Longest retransmission delay.
    pub prepare_retry_ticks_max: u64,
    /// A replica missing prepares asks again this often.
    pub repair_interval_ticks: u64,
    /// Prepares one repair round asks for at most.
    pub repair_prepares_max: usize,
    /// Bytes of prepares one repair round asks for at most, by the sizes its headers state (at
    /// least one prepare is always asked): the peer answering must be able to queue the whole
    /// round, or what it drops is asked again at the round's deadline.
    pub repair_bytes_max: u64,
    /// A restarted replica probes for a StartView this often.
    pub start_view_probe_interval_ticks: u64,
    /// Unanswered probes after which a restarted replica starts a view change itself.
    pub start_view_probes_max: u32,
    /// The primary flags a backup *lagging* once it has not been caught up (acknowledged the
    /// head of some moment) for longer than this, and *dead* once it has sent nothing for longer
    /// than this (DESIGN.md §4, Kafka's `replica.lag.time.max.ms`).
    pub replica_lag_ticks_max: u64,
    /// A primary handing its group over (`Replica::hand_over`) refuses new requests until the
    /// target has acknowledged its head and everything is committed, then leaves its view for
    /// the target's; a target that has not caught up within this bound is given up on and the
    /// primary serves on.
    pub hand_over_ticks_max: u64,
    /// Stamp each request's batch with its base offset and the view (partition groups do).
    pub stamp_batches: bool,
    /// Let a view start although an op may be faulty on every replica that could hold it,
    /// treating such ops as lost (Kafka's unclean leader election). Off by default.
    pub unclean_recovery: bool,
    /// Idempotent producers a group remembers at most (DESIGN.md §4); a new one beyond evicts
    /// the least recently appending.
    pub producers_max: usize,
    /// A producer with no append for this long (by prepares' append times) is forgotten:
    /// Kafka's `transactional.id.expiration.ms` default, one day.
    pub producer_expiration_ms: i64,
    /// A state transfer's pieces are at most this big (one `StateChunk` message's body).
    pub state_chunk_bytes_max: usize,
    /// The driver keeps a state machine of its own for the group (a metadata catalog, consumer
    /// offsets): a state this replica serves to a peer's transfer then carries that machine's
    /// state beside the producer table, asked of the driver with `Committed::StateWanted`.
    /// Off, the replica serves at once with an empty driver part.
    pub transfers_carry_driver_state: bool,
}

impl ReplicaConfig {
    /// Production defaults for replica `replica` of a `replica_count`-member group.
    pub fn new(cluster: u64, group: u64, replica_count: u8, replica: u8) -> ReplicaConfig {
        ReplicaConfig {
            cluster,
            group,
            replica_count,
            members: Membership::first(replica_count, replica_count),
            replica,
            pipeline_prepares_max: 32,
            view_headers_max: 128,
            commit_interval_ticks: 100 / TICK_MS,
            idle_heartbeat_interval_ticks: 250 / TICK_MS,
            heartbeat_timeout_ticks: 1_000 / TICK_MS,
            view_change_timeout_ticks: 2_000 / TICK_MS,
            vote_ttl_ticks: 300 / TICK_MS,
            prepare_retry_ticks_min: 50 / TICK_MS,
            prepare_retry_ticks_max: 1_000 / TICK_MS,
            repair_interval_ticks: 50 / TICK_MS,
            repair_prepares_max: 128,
            repair_bytes_max: 8 << 20,
            start_view_probe_interval_ticks: 200 / TICK_MS,
            start_view_probes_max: 5,
            replica_lag_ticks_max: 10_000 / TICK_MS,
            hand_over_ticks_max: 500 / TICK_MS,
            stamp_batches: true,
            // Canary (DESIGN.md §7): restart uncleanly unless told otherwise.
            unclean_recovery: cfg!(feature = "canary-unclean-by-default"),
            producers_max: 1024,
            producer_expiration_ms: 24 * 60 * 60 * 1_000,
            state_chunk_bytes_max: 64 << 10,
            transfers_carry_driver_state: false,
        }
    }

    /// Voters that make a quorum: a majority of the voters.
    pub fn quorum(&self) -> usize {
        self.voter_count() / 2 + 1
    }

    /// How many members vote.
    pub fn voter_count(&self) -> usize {
        self.members.voter_count() as usize
    }

    /// Nacks that prove an op was never committed: v − q + 1, of v voters.
    pub fn nack_quorum(&self) -> usize {
        self.voter_count() - self.quorum() + 1
    }

    /// Whether member `replica` is a voter (not a learner, not outside the group).
    pub fn is_voter(&self, replica: u8) -> bool {
        self.members.is_voter(replica)
    }

    /// The primary of `view`: the `(view + group) mod v`-th of the v voters, ascending.
    pub fn primary_of(&self, view: u32) -> u8 {
        let index = (u64::from(view) + self.group) % self.voter_count() as u64;
        self.members.voter_indices().nth(index as usize).expect("index below the voter count")
    }

    /// The group's home: the primary of view 0, where placement put its leadership and where a
    /// deliberate view change brings it back once it is caught up (DESIGN.md §8).
    pub fn home(&self) -> u8 {
        self.primary_of(0)
    }

    /// The first view after `view` whose primary is voter `replica` (within v views).
    pub fn next_view_led_by(&self, view: u32, replica: u8) -> u32 {
        assert!(self.is_voter(replica), "a learner leads no view");
        let n = self.voter_count() as u32;
        (1..=n)
            .map(|ahead| view + ahead)
            .find(|&next| self.primary_of(next) == replica)
            .expect("every voter leads one of n consecutive views")
    }

    /// The producer table's bounds.
    pub fn producer_limits(&self) -> crate::producers::ProducerLimits {
        crate::producers::ProducerLimits {
            producers_max: self.producers_max,
            expiration_ms: self.producer_expiration_ms,
        }
    }

    /// Checks the settings hang together; names the first that does not.
    pub fn validate(&self) -> Result<(), String> {
        if self.replica_count == 0 || self.replica_count > 32 {
            return Err(format!("replica_count {} not in 1..=32", self.replica_count));
        }
        if self.replica >= self.replica_count {
            return Err(format!("replica {} not below replica_count", self.replica));
        }
        let slots = if self.replica_count == 32 { u32::MAX } else { (1 << self.replica_count) - 1 };
        let members = self.members;
        if members.voters == 0
            || members.voters & members.learners != 0
            || members.members() & !slots != 0
        {
            return Err(format!(
                "members {members:?}: voters must be non-empty, disjoint from the learners, and \
                 every member below replica_count"
            ));
        }
        if self.pipeline_prepares_max == 0 {
            return Err("pipeline_prepares_max must be at least 1".into());
        }
        if (self.view_headers_max as u64) < self.pipeline_prepares_max + 1 {
            return Err("view_headers_max must exceed pipeline_prepares_max".into());
        }
        for (name, ticks) in [
            ("commit_interval_ticks", self.commit_interval_ticks),
            ("heartbeat_timeout_ticks", self.heartbeat_timeout_ticks),
            ("view_change_timeout_ticks", self.view_change_timeout_ticks),
            ("vote_ttl_ticks", self.vote_ttl_ticks),
            ("prepare_retry_ticks_min", self.prepare_retry_ticks_min),
            ("repair_interval_ticks", self.repair_interval_ticks),
            ("start_view_probe_interval_ticks", self.start_view_probe_interval_ticks),
            ("hand_over_ticks_max", self.hand_over_ticks_max),
        ] {
            if ticks == 0 {
                return Err(format!("{name} must be at least 1"));
            }
        }
        if self.repair_prepares_max == 0 || self.repair_bytes_max == 0 {
            return Err("repair_prepares_max and repair_bytes_max must be at least 1".into());
        }
        if self.prepare_retry_ticks_max < self.prepare_retry_ticks_min {
            return Err("prepare_retry_ticks_max below prepare_retry_ticks_min".into());
        }
        if self.producers_max == 0 {
            return Err("producers_max must be at least 1".into());
        }
        if self.state_chunk_bytes_max == 0 {
            return Err("state_chunk_bytes_max must be at least 1".into());
        }
        if self.producer_expiration_ms <= 0 {
            return Err("producer_expiration_ms must be positive".into());
        }
        if self.idle_heartbeat_interval_ticks < self.commit_interval_ticks {
            return Err(
                "idle_heartbeat_interval_ticks must be at least commit_interval_ticks".into()
            );
        }
        // A settled group's backups hear from the primary once per idle interval: a timeout
        // within it would depose every idle primary.
        if self.heartbeat_timeout_ticks <= self.idle_heartbeat_interval_ticks {
            return Err("heartbeat_timeout_ticks must exceed idle_heartbeat_interval_ticks".into());
        }
        if self.vote_ttl_ticks <= self.commit_interval_ticks {
            return Err("vote_ttl_ticks must exceed commit_interval_ticks".into());
        }
        // An idle group proves its backups caught up only through their answers to the Commit
        // heartbeat, one per idle interval: a shorter bound would flag every idle backup.
        if self.replica_lag_ticks_max <= self.idle_heartbeat_interval_ticks {
            return Err("replica_lag_ticks_max must exceed idle_heartbeat_interval_ticks".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorums_for_one_three_and_five_replicas() {
        for (n, q, nack) in [(1, 1, 1), (3, 2, 2), (5, 3, 3)] {
            let config = ReplicaConfig::new(1, 0, n, 0);
            assert_eq!((config.quorum(), config.nack_quorum()), (q, nack), "n = {n}");
        }
    }

    #[test]
    fn learners_count_in_no_quorum_and_lead_no_view() {
        let config =
            ReplicaConfig { members: Membership::first(3, 5), ..ReplicaConfig::new(1, 7, 5, 4) };
        assert_eq!((config.quorum(), config.nack_quorum()), (2, 2));
        assert!((0..12).all(|view| config.is_voter(config.primary_of(view))));
        assert!(config.is_voter(2) && !config.is_voter(3) && !config.is_voter(4));
        assert_eq!(config.validate(), Ok(()));
        for members in [
            Membership { voters: 0, learners: 0b11 },
            Membership { voters: 0b11, learners: 0b10 },
            Membership { voters: 0b100011, learners: 0 },
        ] {
            let bad = ReplicaConfig { members, ..config };
            assert!(bad.validate().unwrap_err().contains("members"), "{members:?}");
        }
    }

    #[test]
    fn voters_anywhere_in_the_slots_lead_views_in_turn() {
        let members = Membership { voters: 0b11010, learners: 0b00001 };
        let config = ReplicaConfig { members, ..ReplicaConfig::new(1, 0, 5, 0) };
        assert_eq!(config.validate(), Ok(()));
        assert_eq!([0, 1, 2, 3].map(|v| config.primary_of(v)), [1, 3, 4, 1]);
        assert_eq!(config.next_view_led_by(0, 4), 2);
        assert_eq!(config.next_view_led_by(2, 4), 5);
    }

    #[test]
    fn every_epoch_begins_at_its_own_first_view() {
        assert_eq!(epoch_of(first_view_of(3)), 3);
        assert_eq!(epoch_of(first_view_of(3) - 1), 2);
        assert_eq!(first_view_of(EPOCH_MAX) >> EPOCH_VIEW_BITS, EPOCH_MAX);
        assert_eq!(epoch_of(u32::MAX), EPOCH_MAX);
    }

    #[test]
    fn primaries_rotate_with_view_and_spread_across_groups() {
        let config = ReplicaConfig::new(1, 7, 3, 0);
        assert_eq!([0, 1, 2, 3].map(|v| config.primary_of(v)), [1, 2, 0, 1]);
        let other = ReplicaConfig::new(1, 8, 3, 0);
        assert_ne!(config.primary_of(0), other.primary_of(0));
        assert_eq!(config.home(), 1);
    }

    #[test]
    fn the_next_view_led_by_a_member_is_the_first_after_the_view() {
        for (n, group) in [(1, 0), (3, 7), (5, 2)] {
            let config = ReplicaConfig::new(1, group, n, 0);
            for view in 0..12 {
                for replica in 0..n {
                    let next = config.next_view_led_by(view, replica);
                    assert!(next > view && next <= view + u32::from(n), "n {n} view {view}");
                    assert_eq!(config.primary_of(next), replica);
                    assert!((view + 1..next).all(|w| config.primary_of(w) != replica));
                }
            }
        }
    }

    #[test]
    fn defaults_validate_and_bad_values_are_named() {
        assert_eq!(ReplicaConfig::new(1, 0, 3, 2).validate(), Ok(()));
        let mut config = ReplicaConfig::new(1, 0, 3, 3);
        assert!(config.validate().unwrap_err().contains("replica 3"));
        config.replica = 0;
        config.view_headers_max = 8;
        assert!(config.validate().unwrap_err().contains("view_headers_max"));
        config.view_headers_max = 128;
        config.replica_lag_ticks_max = config.idle_heartbeat_interval_ticks;
        assert!(config.validate().unwrap_err().contains("replica_lag_ticks_max"));
        config.replica_lag_ticks_max = 1_000;
        config.idle_heartbeat_interval_ticks = config.commit_interval_ticks - 1;
        assert!(config.validate().unwrap_err().contains("idle_heartbeat_interval_ticks"));
        config.idle_heartbeat_interval_ticks = config.heartbeat_timeout_ticks;
        assert!(config.validate().unwrap_err().contains("heartbeat_timeout_ticks"));
    }
}
