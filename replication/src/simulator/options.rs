//! What a run simulates: the options a seed runs with ([`SimOptions`]), the durability [`Mode`]
//! that decides which crashes are within the fault model, and the [`FaultProfile`] of
//! probabilities the fault phase draws from.
//!
//! It owns configuration only: it never touches a cluster, and it draws from a seed's PRNG only
//! in [`FaultProfile::swarm`], whose order of draws is part of every seed's trace.

use shoal_engine::rng::Rng;

use super::network::NetworkConfig;
use crate::config::ReplicaConfig;
use crate::node::NodeConfig;

/// Which durability the groups of a run use; decides which crashes are within the fault model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every group `persisted`: any crashes, any number at once.
    Persisted,
    /// Every group `replicated`: at most f replicas down (or not yet caught up) at once.
    Replicated,
    /// Odd groups `persisted`, even groups `replicated` (the stricter crash rule applies).
    Mixed,
}

/// Fault probabilities and durations of a run (per tick unless named otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultProfile {
    /// The network's delay, loss, duplication and reordering during the fault phase.
    pub network: NetworkConfig,
    /// Chance per tick per node that it crashes.
    pub crash_per_million: u32,
    /// Chance that a crash is a power loss rather than a process crash.
    pub power_loss_percent: u32,
    /// Chance that a crash strikes in the middle of an I/O round.
    pub crash_during_io_percent: u32,
    /// A crashed node restarts after up to this many ticks.
    pub restart_ticks_max: u64,
    /// Chance per tick of a new partition (isolation, symmetric split or one-way cut).
    pub partition_per_million: u32,
    /// A partition heals after up to this many ticks.
    pub partition_ticks_max: u64,
    /// Chance per tick per node that it pauses.
    pub pause_per_million: u32,
    /// A pause lasts up to this many ticks.
    pub pause_ticks_max: u64,
    /// Chance that a crashed node's disk has a bit flipped at rest in one of its newest durable
    /// records before it restarts (within the budget: at most f replicas per op, see
    /// [`Cluster::corrupt_op`](super::Cluster::corrupt_op)).
    pub corrupt_on_restart_percent: u32,
    /// During the fault phase every read fails with EIO with probability `1 / read_error_one_in`
    /// (0: never).
    pub read_error_one_in: u64,
    /// Chance per tick that one node's disk fills up (its capacity drops to what it uses plus a
    /// little), while no other's is full.
    pub disk_full_per_million: u32,
    /// A full disk is freed after up to this many ticks.
    pub disk_full_ticks_max: u64,
    /// Chance per tick per node of a controlled shutdown: it hands every group it leads to a
    /// peer in sync, then stops cleanly (after at most `SHUTDOWN_TICKS_MAX`), and restarts
    /// after up to `restart_ticks_max` ticks, as in a rolling restart.
    pub shutdown_per_million: u32,
}

impl FaultProfile {
    /// No faults at all.
    pub fn none() -> FaultProfile {
        FaultProfile {
            network: NetworkConfig::reliable(),
            crash_per_million: 0,
            power_loss_percent: 0,
            crash_during_io_percent: 0,
            restart_ticks_max: 1,
            partition_per_million: 0,
            partition_ticks_max: 1,
            pause_per_million: 0,
            pause_ticks_max: 1,
            corrupt_on_restart_percent: 0,
            read_error_one_in: 0,
            disk_full_per_million: 0,
            disk_full_ticks_max: 1,
            shutdown_per_million: 0,
        }
    }

    /// Swarm testing: probabilities drawn per seed, each fault sometimes absent, sometimes
    /// frequent. (The controlled shutdowns' rate is drawn from a PRNG of its own, seeded from a
    /// copy of `rng`, so adding them moved no earlier draw of any seed.)
    pub fn swarm(rng: &mut Rng) -> FaultProfile {
        let mut side = Rng::new(rng.clone().next_u64() ^ SHUTDOWN_SEED_SALT);
        let shutdown_per_million = if side.chance(1, 3) { 0 } else { side.below(200) as u32 + 1 };
        let mut rate =
            |max: u32| if rng.chance(1, 4) { 0 } else { rng.below(u64::from(max)) as u32 + 1 };
        let crash_per_million = rate(400);
        let partition_per_million = rate(600);
        let pause_per_million = rate(300);
        FaultProfile {
            network: NetworkConfig::swarm(rng),
            crash_per_million,
            power_loss_percent: rng.below(101) as u32,
            crash_during_io_percent: rng.below(101) as u32,
            restart_ticks_max: 50 + rng.below(1_500),
            partition_per_million,
            partition_ticks_max: 50 + rng.below(2_000),
            pause_per_million,
            pause_ticks_max: 10 + rng.below(500),
            corrupt_on_restart_percent: if rng.chance(1, 4) {
                0
            } else {
                20 + rng.below(81) as u32
            },
            read_error_one_in: if rng.chance(1, 2) { 0 } else { 200 + rng.below(5_000) },
            disk_full_per_million: if rng.chance(1, 3) { 0 } else { rng.below(300) as u32 + 1 },
            // Long enough that a full node's writes often outrun the space it had ready (the
            // engine then refuses appends, `storage_full_rounds`), not just stop the step ahead.
            disk_full_ticks_max: 50 + rng.below(3_000),
            shutdown_per_million,
        }
    }
}

/// Mixed into a seed for the PRNG of controlled shutdowns, which draws apart from the run's so
/// that its draws move none of the run's.
pub(super) const SHUTDOWN_SEED_SALT: u64 = 0x5d0f_c0de_0000_0001;

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimOptions {
    /// Decides everything.
    pub seed: u64,
    /// Replicas per group (1, 3 or 5), learners included.
    pub replicas: u8,
    /// Of those, the last `learners` are learners in every group (DESIGN.md §8): they take the
    /// log but never count in a quorum or vote. Their nodes may crash outside the fault budget.
    pub learners: u8,
    /// Groups (partitions), all with a replica on every node.
    pub groups: u64,
    /// Clients per group, each with one request outstanding at a time.
    pub clients_per_group: u64,
    /// Ticks of the fault phase.
    pub ticks: u64,
    /// Ticks the liveness phase may take at most.
    pub liveness_ticks: u64,
    /// Requests each client must complete in the liveness phase.
    pub liveness_requests: u64,
    /// The faults; `None` draws a swarm profile from the seed.
    pub faults: Option<FaultProfile>,
    /// The durability mode; `None` draws one from the seed.
    pub mode: Option<Mode>,
    /// Print every replica message of this group to stderr as it is delivered (debugging a
    /// failing seed).
    pub trace_group: Option<u64>,
    /// Every replica's `replica_lag_ticks_max` (the production default unless a test needs a
    /// tighter bound).
    pub replica_lag_ticks_max: u64,
    /// Every replica's `unclean_recovery` (off, as in production, unless a test needs it).
    pub unclean_recovery: bool,
    /// Every replica's `repair_prepares_max`; `None` draws one per seed (half the seeds 1–4,
    /// the others 1–128), so runs exercise both long multi-round repairs and quick ones.
    pub repair_prepares_max: Option<usize>,
    /// Every group's retention by size (0: none); nodes enforce it every
    /// [`RETENTION_INTERVAL_TICKS`](super::RETENTION_INTERVAL_TICKS). The final log check then
    /// starts at each log's first op.
    pub retention_bytes: u64,
    /// Bytes each client message's value is padded to (fewer ops per segment), at most 4,000.
    pub value_size_bytes: usize,
    /// Every node's `primary_return_ticks`: a group led away from its home goes back once the
    /// home has been in sync this long (0: never).
    pub primary_return_ticks: u64,
    /// In a run of two or more groups, the last is an *admin* group: its clients send plain
    /// requests (no idempotent producer fields), so a retry may enter its log twice, and each
    /// node applies its committed ops to a client-table state machine that must execute every
    /// request at most once (`simulator::admin`).
    pub admin_group: bool,
    /// Configuration changes the first client of every partition group makes, beside its
    /// writes (DESIGN.md §8): in turn, a switch that promotes a caught-up learner and demotes
    /// a voter, then dropping the demoted member, then adding it back as a learner. Needs a
    /// learner; the voters stay `voters()` throughout. Every node's crash budget then counts
    /// every node, as any of them may be a voter.
    pub moves: u32,
    /// Every node's `groups_sleep` (on, as in production): the swarm runs seeds with it off too
    /// and requires the same trace.
    pub groups_sleep: bool,
}

impl SimOptions {
    /// Voters per group.
    pub fn voters(&self) -> u8 {
        self.replicas - self.learners
    }

    /// The fault profile this seed draws when `faults` is `None`.
    pub fn drawn_faults(&self) -> FaultProfile {
        FaultProfile::swarm(&mut Rng::new(self.seed))
    }

    /// The CI defaults for `seed`: three replicas, two groups, 20,000 ticks of swarm faults.
    pub fn new(seed: u64) -> SimOptions {
        SimOptions {
            seed,
            replicas: 3,
            learners: 0,
            groups: 2,
            clients_per_group: 2,
            ticks: 20_000,
            liveness_ticks: 10_000,
            liveness_requests: 3,
            faults: None,
            mode: None,
            trace_group: None,
            replica_lag_ticks_max: ReplicaConfig::new(0, 0, 1, 0).replica_lag_ticks_max,
            unclean_recovery: ReplicaConfig::new(0, 0, 1, 0).unclean_recovery,
            repair_prepares_max: None,
            retention_bytes: 0,
            value_size_bytes: 0,
            primary_return_ticks: NodeConfig::new(0, ReplicaConfig::new(0, 0, 1, 0))
                .primary_return_ticks,
            admin_group: true,
            moves: 0,
            groups_sleep: true,
        }
    }
}
