//! A shard's thread from start to stop: pins it to its CPU, builds its io_uring runtime, binds
//! its listeners, opens (recovering) its node, brings every group back to normal and waits for
//! the first catalog, then hands over to the loop (`event_loop`) until the stop flag is set;
//! finally writes the replies it owes and closes its storage cleanly.
//!
//! It reports to `main` through the spec's `bound` and `ready` channels. The wall clock the node
//! layer is given (`now_ms`) lives here, since that layer never reads one itself. Work items go
//! to the loop's `handle`; this code only refuses those arriving while the shard stops.

use std::cell::Cell;
use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use monoio::net::{ListenerOpts, TcpListener};
use monoio::task::JoinHandle;
use shoal_engine::shard::{ShardConfig, group_dir, shard_dir};
use shoal_engine::state;
use shoal_engine::storage::BLOCK_SIZE_BYTES;
use shoal_engine::storage::uring::UringStorage;
use shoal_proto::wire::Membership;
use shoal_replication::{Clock, Node, NodeConfig, ReplicaConfig, SavedProducers, Status, TICK_MS};

use super::state::ShardState;
use super::work::{Mesh, Work, refuse};
use crate::bus::{self, BusAddresses, BusCounters, BusIdentity, BusSpec, BusTransport};
use crate::config::{ClusterConfig, Config, NODES_MAX, ShardTuning};
use crate::connection;
use crate::metadata::{METADATA_GROUP, Published};
use crate::metrics;
use crate::offsets::PartitionOffsets;

/// How long a stopping shard waits for its connections to write the replies they owe.
const SHUTDOWN_REPLIES_TIME_MAX: Duration = Duration::from_secs(2);

/// Ticks a recovering shard may take to bring every group back to normal before it gives up.
const RECOVERY_TICKS_MAX: u32 = 10_000;

/// What a shard thread needs to start.
pub struct ShardSpec {
    pub index: u32,
    /// The whole node's configuration; this shard's part is `config.shard[index]`.
    pub config: Arc<Config>,
    /// Where to listen: the configured address for shard 0, the address shard 0 bound for the
    /// others (so a configured port 0 becomes one shared port).
    pub listen: SocketAddr,
    /// Where to accept Kafka clients, chosen as `listen` is; `None`: no Kafka listener.
    pub kafka_listen: Option<SocketAddr>,
    pub stop: Arc<AtomicBool>,
    /// The bound native and Kafka listener addresses (or why binding failed).
    pub bound: Sender<Result<(SocketAddr, Option<SocketAddr>), String>>,
    /// This shard's own listener (`[network] shard_listen`), bound by `main` before any shard
    /// starts, so that every shard can name every shard's address from its first `Hello`.
    pub own_listener: Option<std::net::TcpListener>,
    /// Every shard's own listener address, by shard (empty: none).
    pub shard_addresses: Arc<Vec<String>>,
    /// What recovery found (or why it failed).
    pub ready: Sender<Result<String, String>>,
    /// This shard's inbox.
    pub inbox: flume::Receiver<Work>,
    /// Every shard's inbox, this one's included.
    pub mesh: Mesh,
    /// The catalog shard 0 publishes.
    pub published: Arc<Published>,
    /// Open connections on the whole node.
    pub connections: Arc<AtomicUsize>,
    /// Shard 0 only: the bound metrics listener, served on this shard's runtime.
    pub metrics_listener: Option<std::net::TcpListener>,
    /// Random per process start (the bus handshake carries it).
    pub incarnation: u64,
    /// Whether the node holds its cluster's state (shard 0 sets it once the cluster is formed
    /// or rejoined); every shard's bus handshake says so.
    pub formed: Arc<AtomicBool>,
    /// The node's rejoin floor, shared by its shards (`formation`).
    pub rejoin_floor: Arc<AtomicU64>,
    /// Shards whose every group below the rejoin floor has been brought back since the rejoin
    /// (`formation`): once all have, the floor is lifted.
    pub rejoin_settled: Arc<AtomicUsize>,
}

/// The wall clock, read only here, outside the node layer.
pub(super) struct WallClock;

impl Clock for WallClock {
    fn now_ms(&self) -> i64 {
        now_ms()
    }
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

pub(super) type ShardNode = Node<UringStorage, BusTransport, WallClock>;

/// Runs the shard until the stop flag is set, then shuts its storage down cleanly.
pub fn run(spec: ShardSpec) -> Result<(), String> {
    let settings = &spec.config.shard[spec.index as usize];
    if let Some(cpu) = settings.cpu
        && !core_affinity::set_for_current(core_affinity::CoreId { id: cpu })
    {
        let message = format!("shard {}: cannot pin to CPU {cpu}", spec.index);
        let _ = spec.bound.send(Err(message.clone()));
        return Err(message);
    }
    let mut runtime = match build_runtime(&settings.tuning) {
        Ok(runtime) => runtime,
        Err(error) => {
            let message = format!(
                "shard {}: cannot build its io_uring runtime ({} entries, SQPOLL {}): {error}",
                spec.index,
                settings.tuning.uring_entries,
                match (settings.tuning.sqpoll_idle_ms, settings.tuning.sqpoll_cpu) {
                    (0, _) => "off".to_string(),
                    (idle, cpu) => format!("idle {idle} ms on CPU {cpu:?}"),
                }
            );
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    runtime.block_on(serve(spec))
}

type ShardRuntime = monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>>;

/// The shard's monoio runtime on the io_uring driver with the ring its tuning asks for. Never
/// falls back to epoll: a shard without io_uring would be a different, untested server.
fn build_runtime(tuning: &ShardTuning) -> std::io::Result<ShardRuntime> {
    let mut ring = io_uring::IoUring::builder();
    if tuning.sqpoll_idle_ms > 0 {
        // The kernel thread polls the submission queue, so submitting costs no system call
        // while it is awake; it sleeps after the idle time and the next submit wakes it (monoio
        // submits through io-uring's `submit`, which sets IORING_ENTER_SQ_WAKEUP when needed).
        ring.setup_sqpoll(tuning.sqpoll_idle_ms);
        // Bound to its own CPU: an unbound polling thread inherits the shard thread's affinity
        // (seen on kernel 6.18) and would spin on the shard's CPU. The config refuses SQPOLL
        // without one, so this is always set here.
        if let Some(cpu) = tuning.sqpoll_cpu {
            ring.setup_sqpoll_cpu(u32::try_from(cpu).unwrap_or(u32::MAX));
        }
    }
    monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
        .enable_timer()
        .with_entries(tuning.uring_entries)
        .uring_builder(ring)
        .build()
}

/// The storage backend the shard's tuning asks for: direct I/O where the filesystem allows it,
/// or buffered everywhere.
fn storage_for(tuning: &ShardTuning) -> UringStorage {
    if tuning.direct_io { UringStorage::new() } else { UringStorage::buffered() }
}

/// The shard's life on its runtime: its listeners, recovery and start-up, serving until the stop
/// flag is set, then the replies it owes and a clean shutdown of its storage.
async fn serve(mut spec: ShardSpec) -> Result<(), String> {
    let (listener, own_listener, kafka_listener) = bind(&mut spec)?;
    let started = Instant::now();
    let index = spec.index;
    let dir = shard_dir(&spec.config.data_dir, index);
    // The bus runs before recovery, so a restarting node hears its peers' StartView.
    let bus_spec = bus_spec(&spec);
    let bus_addresses = bus_spec.addresses.clone();
    let (transport, bus_counters) = match bus::start(bus_spec) {
        Ok(started) => started,
        Err(message) => {
            let _ = spec.ready.send(Err(message.clone()));
            return Err(message);
        }
    };
    let bus = (bus_counters, bus_addresses);
    let (mut state, groups_recovered) = open(&spec, &dir, transport, bus).await?;
    let mut early = Vec::new();
    if let Err(error) = state.start(&spec.inbox, &spec.stop, &mut early).await {
        let message = format!("shard {index}: start-up of {} failed: {error}", dir.display());
        let _ = spec.ready.send(Err(message.clone()));
        return Err(message);
    }
    let _ = spec.ready.send(Ok(state.recovered(groups_recovered, started, &dir)));

    let replies_owed = Rc::new(Cell::new(0));
    let (accepting, accepting_own, accepting_kafka) =
        accept(&spec, &state, &replies_owed, listener, own_listener, kafka_listener);
    if let Some(listener) = spec.metrics_listener.take() {
        let exporter = metrics::Exporter {
            config: Arc::clone(&spec.config),
            mesh: Arc::clone(&spec.mesh),
            published: Arc::clone(&spec.published),
        };
        monoio::spawn(crate::http::serve(listener, exporter, Arc::clone(&spec.stop)));
    }

    for work in early {
        state.handle(work).await;
    }
    state.serve(&spec.inbox, &spec.stop).await;
    write_replies_owed(&spec.inbox, &replies_owed).await;
    drop(accepting);
    drop(accepting_own);
    drop(accepting_kafka);
    state.node.close().await.map_err(|e| format!("shard {index}: shutdown: {e}"))
}

/// The listeners a shard accepts on: the shared native one, its own (if any) and the shared Kafka
/// one (if any).
type Listeners = (TcpListener, Option<TcpListener>, Option<TcpListener>);

/// Binds the shared listeners and takes the shard's own one over, then tells `main` the bound
/// addresses (or why binding failed).
fn bind(spec: &mut ShardSpec) -> Result<Listeners, String> {
    let opts = ListenerOpts::new().reuse_port(true);
    let listener = match TcpListener::bind_with_config(spec.listen, &opts) {
        Ok(listener) => listener,
        Err(error) => {
            let message = format!("cannot listen on {}: {error}", spec.listen);
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    // The shard's own listener is advertised (readiness line, Hello) as soon as main bound it,
    // so a shard that cannot serve it must not start.
    let own_listener = match spec.own_listener.take().map(TcpListener::from_std).transpose() {
        Ok(own) => own,
        Err(error) => {
            let message = format!("shard {}: cannot serve its own listener: {error}", spec.index);
            let _ = spec.bound.send(Err(message.clone()));
            return Err(message);
        }
    };
    let kafka_listener =
        match spec.kafka_listen.map(|at| (at, TcpListener::bind_with_config(at, &opts))) {
            None => None,
            Some((_, Ok(listener))) => Some(listener),
            Some((at, Err(error))) => {
                let message = format!("cannot listen for Kafka clients on {at}: {error}");
                let _ = spec.bound.send(Err(message.clone()));
                return Err(message);
            }
        };
    let address = listener.local_addr().map_err(|e| e.to_string())?;
    let kafka_address = kafka_listener
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()
        .map_err(|e| e.to_string())?;
    let _ = spec.bound.send(Ok((address, kafka_address)));
    Ok((listener, own_listener, kafka_listener))
}

/// The bus of shard `spec.index`: this node's identity and every node's bus port for the shard.
fn bus_spec(spec: &ShardSpec) -> BusSpec {
    let cluster = &spec.config.cluster;
    let slots = member_slots(cluster);
    let addresses = BusAddresses::new(slots);
    // The founding nodes and this one; the shard adds the others as its catalog names them.
    for node in (0..cluster.founders()).chain([cluster.node]) {
        if let Some(address) = cluster.bus_address(node, spec.index) {
            addresses.learn(node, address);
        }
    }
    BusSpec {
        identity: BusIdentity {
            cluster: cluster.id,
            node: cluster.node,
            founders: cluster.founders(),
            slots,
            shard: spec.index,
            shard_count: spec.config.shards,
            incarnation: spec.incarnation,
        },
        addresses,
        queue_packets_max: spec.config.network.bus_queue_packets_max,
        queue_bytes_max: spec.config.network.bus_queue_bytes_max,
        frame_size_bytes_max: message_size_bytes_max(spec),
        inbox: spec.mesh[spec.index as usize].clone(),
        stop: Arc::clone(&spec.stop),
        formed: Arc::clone(&spec.formed),
    }
}

/// Member slots of every group: the most nodes a cluster can ever hold (32, the members word's
/// width), or 1 for a one-node cluster without `[cluster] nodes`, which cannot grow.
pub(crate) fn member_slots(cluster: &ClusterConfig) -> u8 {
    if cluster.nodes.is_empty() { 1 } else { NODES_MAX as u8 }
}

/// The largest replica message: a prepare of the largest record, or a view change's headers.
fn message_size_bytes_max(spec: &ShardSpec) -> usize {
    spec.config.shard[spec.index as usize].storage.record_size_bytes_max + (64 << 10)
}

/// The ready-space budget `[shard] ready_budget_bytes = 0` stands for: a 64th of the file
/// system holding `dir` (the data directory) shared by the node's shards, between 64 MiB and
/// 4 GiB per shard (a 3.75 TB NVMe with 14 shards: 4 GiB each), so idle partitions never hold
/// disk and the writing ones together hold under 2% of it. 1 GiB when the file system cannot be
/// asked.
fn auto_ready_budget_bytes(dir: &Path, shards: u32) -> u64 {
    const MIN: u64 = 64 << 20;
    const MAX: u64 = 4 << 30;
    let disk_bytes = match file_system_bytes(dir) {
        Ok(bytes) => bytes,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot size the ready-space budget \
                for the data directory's file system: 1 GiB per shard (set [shard] \
                ready_budget_bytes)");
            return 1 << 30;
        }
    };
    let share = disk_bytes / 64 / u64::from(shards.max(1));
    let budget = share.clamp(MIN, MAX);
    budget - budget % BLOCK_SIZE_BYTES as u64
}

/// The size of the file system holding `dir` (`statvfs`).
fn file_system_bytes(dir: &Path) -> std::io::Result<u64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    // SAFETY: `statvfs` is plain data, for which all zeros is a valid value.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a valid C string and `stat` a writable `statvfs` the call fills in.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(stat.f_blocks.saturating_mul(stat.f_frsize))
}

/// The batch cache `[shard] batch_cache_bytes = 0` stands for: an eighth of the machine's
/// memory shared by the node's shards, between 64 MiB and 16 GiB per shard (24 GiB with 2
/// shards: 1.5 GiB each). Direct I/O leaves the page cache out, so this is what serves consumers
/// behind the rings from memory; the rest of the memory stays for write buffers and rings.
/// 1 GiB when the memory size cannot be asked.
fn auto_batch_cache_bytes(shards: u32) -> usize {
    const MIN: u64 = 64 << 20;
    const MAX: u64 = 16 << 30;
    // SAFETY: `sysconf` only reads system configuration.
    let (pages, page_bytes) =
        unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || page_bytes <= 0 {
        return 1 << 30;
    }
    let memory_bytes = (pages as u64).saturating_mul(page_bytes as u64);
    (memory_bytes / 8 / u64::from(shards.max(1))).clamp(MIN, MAX) as usize
}

/// Shard `index`'s engine configuration, with the sizes `0` stands for worked out on this
/// machine. The budget is sized from the data directory's file system: the directory exists
/// (`main` locked it) before any shard opens, while a new shard's own directory does not yet,
/// and asking about that one fell back to 1 GiB, too little to recycle a 1 GiB segment.
fn storage_config(config: &Config, index: u32) -> ShardConfig {
    let cluster = &config.cluster;
    let mut shard_config = ShardConfig {
        cluster: cluster.id,
        node: u64::from(cluster.node),
        ..config.shard[index as usize].storage.clone()
    };
    if shard_config.ready_budget_bytes == 0 {
        shard_config.ready_budget_bytes = auto_ready_budget_bytes(&config.data_dir, config.shards);
    }
    if shard_config.batch_cache_bytes == 0 {
        shard_config.batch_cache_bytes = auto_batch_cache_bytes(config.shards);
    }
    shard_config
}

/// Opens (recovering) the shard's node in `dir` and the loop's state around it, and says how
/// many groups recovery found; tells `main` why when it cannot.
async fn open(
    spec: &ShardSpec,
    dir: &Path,
    transport: BusTransport,
    bus: (Rc<BusCounters>, BusAddresses),
) -> Result<(ShardState, usize), String> {
    let index = spec.index;
    let cluster = &spec.config.cluster;
    let shard_config = storage_config(&spec.config, index);
    // Every node index the cluster may ever have is a member slot; the groups created without
    // members of their own (the metadata group, partitions placed before replication factors)
    // have the founding nodes as voters.
    let mut replica = ReplicaConfig::new(cluster.id, 0, member_slots(cluster), cluster.node);
    let founders = cluster.founders();
    replica.members = Membership::first(founders, founders);
    let timers = &spec.config.replication;
    let ticks = |ms: u64| (ms / TICK_MS).max(1);
    replica.commit_interval_ticks = ticks(timers.commit_interval_ms);
    replica.idle_heartbeat_interval_ticks = ticks(timers.idle_heartbeat_interval_ms_resolved());
    // Voters repeat their votes every commit interval: a vote counts for three of them.
    replica.vote_ttl_ticks = 3 * replica.commit_interval_ticks;
    replica.heartbeat_timeout_ticks = ticks(timers.heartbeat_timeout_ms);
    replica.view_change_timeout_ticks = ticks(timers.view_change_timeout_ms);
    replica.start_view_probe_interval_ticks = ticks(timers.start_view_probe_interval_ms);
    replica.replica_lag_ticks_max = ticks(timers.replica_lag_time_max_ms);
    replica.repair_prepares_max = timers.repair_prepares_max as usize;
    replica.repair_bytes_max = timers.repair_bytes_max;
    // A transfer carries the shard's machine state (consumer offsets, the metadata snapshot)
    // beside the producer table: `transfer` serves and installs it.
    replica.transfers_carry_driver_state = true;
    if member_slots(cluster) == 1 {
        // A group of one has nobody to ask for a StartView: probing would only delay its return.
        replica.start_view_probes_max = 0;
    }
    let node_config = NodeConfig {
        message_size_bytes_max: message_size_bytes_max(spec),
        rejoin_floor: spec.rejoin_floor.load(Ordering::SeqCst),
        repair_rounds_per_tick_max: timers.repair_rounds_per_tick_max as usize,
        repair_rounds_in_flight_max: timers.repair_rounds_in_flight_max as usize,
        repair_bytes_per_tick_max: match timers.repair_bytes_per_second_max {
            0 => 0,
            rate => (rate * TICK_MS / 1000).max(1),
        },
        serve_reads_in_flight_max: timers.serve_reads_in_flight_max as usize,
        serve_read_bytes_max: timers.serve_read_bytes_max as usize,
        primary_return_ticks: match timers.primary_return_ms {
            0 => 0,
            ms => ticks(ms),
        },
        ..NodeConfig::new(cluster.node, replica)
    };
    let seed = u64::from(index) ^ now_ms() as u64;
    let tuning = spec.config.shard[index as usize].tuning;
    let storage = storage_for(&tuning);
    // Each partition's producer table comes back from its state snapshot (the section after
    // its consumer offsets) plus the log past it; the node layer replays the log.
    let load_producers = {
        let (storage, dir) = (storage.clone(), dir.to_path_buf());
        async move |group: u64| {
            // The metadata group's `state` file is the metadata snapshot, and its log holds no
            // idempotent batches.
            if group == METADATA_GROUP {
                return SavedProducers::NotKept;
            }
            let loaded = state::load(&storage, &group_dir(&dir, group)).await;
            SavedProducers::from_load(loaded, |saved| {
                let (_, producers) = PartitionOffsets::decode_snapshot(&saved.bytes)?;
                Ok(producers.map(<[u8]>::to_vec))
            })
        }
    };
    let open = Node::open_with_producer_snapshots(
        storage.clone(),
        dir,
        shard_config,
        node_config,
        transport,
        WallClock,
        seed,
        load_producers,
    );
    let (node, report) = match open.await {
        Ok(opened) => opened,
        Err(error) => {
            let message = format!("shard {index}: recovery of {} failed: {error}", dir.display());
            let _ = spec.ready.send(Err(message.clone()));
            return Err(message);
        }
    };
    Ok((ShardState::new(spec, node, seed, storage, tuning, bus), report.groups.len()))
}

/// Starts accepting connections on the shard's listeners, a task each.
fn accept(
    spec: &ShardSpec,
    state: &ShardState,
    replies_owed: &Rc<Cell<usize>>,
    listener: TcpListener,
    own_listener: Option<TcpListener>,
    kafka_listener: Option<TcpListener>,
) -> (JoinHandle<()>, Option<JoinHandle<()>>, Option<JoinHandle<()>>) {
    let acceptor = Rc::new(connection::Acceptor {
        shard: spec.index,
        shard_addresses: Arc::clone(&spec.shard_addresses),
        replies_owed: Rc::clone(replies_owed),
        config: Arc::clone(&spec.config),
        mesh: Arc::clone(&spec.mesh),
        published: Arc::clone(&spec.published),
        connections: Arc::clone(&spec.connections),
        stop: Arc::clone(&spec.stop),
        metrics: Rc::clone(&state.metrics),
    });
    let accepting = monoio::spawn(connection::Acceptor::run(Rc::clone(&acceptor), listener));
    let accepting_own =
        own_listener.map(|own| monoio::spawn(connection::Acceptor::run(Rc::clone(&acceptor), own)));
    let accepting_kafka =
        kafka_listener.map(|kafka| monoio::spawn(crate::kafka::accept(acceptor, kafka)));
    (accepting, accepting_own, accepting_kafka)
}

/// Lets the connections write the replies of what was finished (bounded): new requests are
/// refused with ShuttingDown by the readers, and work still arriving is refused here.
async fn write_replies_owed(inbox: &flume::Receiver<Work>, replies_owed: &Cell<usize>) {
    let deadline = Instant::now() + SHUTDOWN_REPLIES_TIME_MAX;
    while replies_owed.get() > 0 && Instant::now() < deadline {
        while let Ok(work) = inbox.try_recv() {
            refuse(work);
        }
        monoio::time::sleep(Duration::from_millis(1)).await;
    }
}

impl ShardState {
    /// Brings every recovered group back to normal, and the catalog up: shard 0 creates or
    /// replays the metadata group and publishes; the others wait for its first catalog (work
    /// arriving meanwhile is kept in `early`).
    async fn start(
        &mut self,
        inbox: &flume::Receiver<Work>,
        stop: &AtomicBool,
        early: &mut Vec<Work>,
    ) -> Result<(), String> {
        // The op and offset the metadata replay ended at.
        let recovered_end = if self.index == 0 { self.open_metadata().await? } else { (0, 0) };
        let mut ticks = 0;
        // A group of one comes back by itself within a few ticks; a replicated one needs its
        // peers, which may not be up yet, so a cluster's node serves (and answers NotPrimary or
        // TransientNotAccepted) while its groups catch up.
        let clustered = !self.config.cluster.nodes.is_empty();
        while !clustered && !self.all_normal() {
            ticks += 1;
            if ticks > RECOVERY_TICKS_MAX || stop.load(Ordering::SeqCst) {
                return Err(format!("groups not back to normal after {RECOVERY_TICKS_MAX} ticks"));
            }
            self.node.on_tick();
            // Recovery's rounds skip the flush gate: nothing waits to join them, and the loop
            // here does not sleep until the gate's deadline.
            self.round(false).await;
        }
        self.recover_committed_ends().await;
        self.recover_offsets().await;
        let applied = self.metadata.as_ref().map(|m| m.state.catalog.applied_op);
        if applied == Some(recovered_end.0) {
            // Replaces an unusable snapshot now, or one the replay found far behind (ops applied
            // since, on the way back to normal, made their own saves).
            self.save_metadata_snapshot(recovered_end.1);
        }
        if let Some(metadata) = &self.metadata {
            self.publish(Arc::new(metadata.state.catalog.clone()));
        }
        // Shard 0 sent its own catalog to its inbox too; every shard now waits for it.
        loop {
            if stop.load(Ordering::SeqCst) {
                return Err("stopped during start-up".into());
            }
            let work = monoio::select! {
                work = inbox.recv_async() => work,
                _ = monoio::time::sleep(Duration::from_millis(TICK_MS)) => continue,
            };
            match work {
                Ok(Work::Catalog(catalog)) => {
                    self.install(catalog).await;
                    return Ok(());
                }
                Ok(Work::Packet { from, packet }) => {
                    let _ = self.node.on_packet(from, &packet);
                }
                Ok(other) => early.push(other),
                Err(_) => return Err("every inbox sender is gone".into()),
            }
        }
    }

    /// Learns where each recovered group's committed log ends: the replica restarts knowing its
    /// commit op, and the offset after that op is in the op's prepare.
    async fn recover_committed_ends(&mut self) {
        for group in self.node.group_ids() {
            if self.committed_end.contains_key(&group) {
                continue;
            }
            let Some(commit) = self.node.replica(group).map(|r| r.commit()) else { continue };
            if !self.node.has_log(group) {
                continue;
            }
            let end = if commit == 0 {
                0
            } else {
                match self.node.read_op(group, commit).await {
                    Ok(Some(prepare)) => prepare.end_offset(),
                    // A failed or damaged group serves no reads; nothing of it is visible.
                    _ => 0,
                }
            };
            self.committed_end.insert(group, end);
        }
    }

    /// The readiness line's report of what recovery found, `started` when the shard did.
    fn recovered(&self, groups: usize, started: Instant, dir: &Path) -> String {
        let failed: Vec<String> = self
            .node
            .group_ids()
            .into_iter()
            .filter_map(|g| self.node.group_failure(g).map(|why| format!("group {g}: {why}")))
            .collect();
        format!(
            "shard {}: recovered {} groups ({} stopped{}{}) in {:?} from {}",
            self.index,
            groups,
            failed.len(),
            if failed.is_empty() { "" } else { ": " },
            failed.join("; "),
            started.elapsed(),
            dir.display()
        )
    }

    fn all_normal(&self) -> bool {
        self.node.group_ids().into_iter().all(|group| {
            self.node.group_failure(group).is_some()
                || self.node.replica(group).is_some_and(|r| r.status() == Status::Normal)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A new data directory has no shard directories when its shards open: the budget comes
    /// from the file system holding the data directory, not the 1 GiB fallback for a path that
    /// cannot be asked.
    #[test]
    fn a_new_data_directory_sizes_the_ready_budget_for_its_disk() {
        let data_dir = tempfile::tempdir().expect("temporary directory");
        let mut config = Config::defaults(2, false);
        config.data_dir = data_dir.path().to_path_buf();
        assert!(!shard_dir(&config.data_dir, 0).exists());
        let expected = auto_ready_budget_bytes(data_dir.path(), 2);
        // The bug this guards against: the shard's own directory cannot be asked yet.
        assert!(file_system_bytes(&shard_dir(&config.data_dir, 0)).is_err());
        let disk_bytes = file_system_bytes(data_dir.path()).expect("the data directory's size");
        let share = (disk_bytes / 64 / 2).clamp(64 << 20, 4 << 30);
        assert_eq!(expected, share - share % BLOCK_SIZE_BYTES as u64);
        for index in 0..2 {
            let resolved = storage_config(&config, index);
            assert_eq!(resolved.ready_budget_bytes, expected, "shard {index}");
            assert_ne!(resolved.batch_cache_bytes, 0, "shard {index}");
        }
        // An explicit budget stays as configured.
        config.shard[1].storage.ready_budget_bytes = 8 << 20;
        assert_eq!(storage_config(&config, 1).ready_budget_bytes, 8 << 20);
    }
}
