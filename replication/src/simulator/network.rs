//! The simulated network of the cluster simulator: a seeded packet network between endpoints
//! `0..endpoints` (the simulator numbers replicas first, then clients; this module does not care).
//!
//! It owns every packet in flight, the up/down state of every directed link, the fault rates
//! ([`NetworkConfig`]), its own PRNG and the counters ([`NetworkStats`]). It must never read a
//! clock, spawn a thread, perform I/O or iterate a hash map: time is a tick the caller passes in,
//! randomness comes only from the [`Rng`] seeded by the caller, and every collection is ordered,
//! so the same seed and the same calls give the same deliveries bit for bit.
//!
//! Packet model. [`Network::send`] decides a packet's fate at send time, in this order: a link
//! that is down drops it (`dropped_link_down`); otherwise it is lost with probability
//! `loss_per_million`, or the link's own loss rate if higher ([`Network::set_link_loss`], a
//! throttled link) (`lost`); a surviving packet gets a second copy with probability
//! `duplicate_per_million` (`duplicated`). Each copy then needs room on its directed link — at
//! most `link_packets_max` packets in flight per link, or the copy is dropped
//! (`dropped_link_full`) — and draws its own one-way delay, uniform in
//! `delay_ticks_min..=delay_ticks_max`, plus, with probability `reorder_per_million`, an extra
//! delay uniform in `1..=reorder_delay_ticks_max` (`reordered`), so that later packets overtake it.
//! With `delay_ticks_min == delay_ticks_max` and no reordering a link is FIFO; with a range of
//! delays, packets on one link may overtake each other without being counted as reordered.
//!
//! [`Network::deliver`] hands out every packet due at or before the given tick, ordered by due
//! tick and then by the sequence number assigned at send time. A packet whose link went down while
//! it was in flight is dropped when it falls due, if the link is still down then
//! (`dropped_link_down`); a link that goes down and comes back up before the packet is due loses
//! nothing. [`Network::drop_endpoint_inbound`] models a crashed process: packets in flight to it
//! are gone; packets it sent before crashing still arrive.
//!
//! Every fault is reversible: [`Network::heal`] brings every link up and clears every link's own
//! loss rate, [`Network::set_config`]
//! changes the rates (the simulator switches to [`NetworkConfig::reliable`] when its fault phase
//! ends). Links are never cut from an endpoint to itself by the partition helpers.
//!
//! Accounting: at every point
//! `sent + duplicated == delivered + lost + dropped_link_down + dropped_link_full +
//! dropped_endpoint_inbound + in_flight`.

use std::collections::BTreeMap;

use shoal_engine::rng::Rng;

/// The denominator of every `_per_million` probability.
const PER_MILLION: u32 = 1_000_000;

/// The per-link bound of [`NetworkConfig::reliable`]: large enough that a healthy simulated
/// cluster never fills a link, small enough to bound memory.
const RELIABLE_LINK_PACKETS_MAX: usize = 4096;

/// Fault rates and limits of a simulated network.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetworkConfig {
    /// The least one-way latency of a packet, in ticks.
    pub delay_ticks_min: u64,
    /// The greatest one-way latency of a packet, in ticks (before any reordering delay).
    /// At least `delay_ticks_min`.
    pub delay_ticks_max: u64,
    /// A sent packet is lost with probability `loss_per_million / 1_000_000`.
    pub loss_per_million: u32,
    /// A packet that is not lost is delivered twice, each copy with its own delay, with
    /// probability `duplicate_per_million / 1_000_000`.
    pub duplicate_per_million: u32,
    /// Each copy is held back by an extra `1..=reorder_delay_ticks_max` ticks with probability
    /// `reorder_per_million / 1_000_000`, so that packets sent after it overtake it.
    pub reorder_per_million: u32,
    /// The greatest extra delay of a reordered packet, in ticks; 0 disables reordering.
    pub reorder_delay_ticks_max: u64,
    /// The most packets in flight on one directed link; a packet that finds its link full is
    /// dropped and counted in [`NetworkStats::dropped_link_full`].
    pub link_packets_max: usize,
}

impl NetworkConfig {
    /// A network that loses, duplicates and reorders nothing: every packet arrives one tick after
    /// it was sent, so each link is FIFO.
    #[must_use]
    pub fn reliable() -> Self {
        Self {
            delay_ticks_min: 1,
            delay_ticks_max: 1,
            loss_per_million: 0,
            duplicate_per_million: 0,
            reorder_per_million: 0,
            reorder_delay_ticks_max: 0,
            link_packets_max: RELIABLE_LINK_PACKETS_MAX,
        }
    }

    /// A hostile network whose character is drawn from `rng` (swarm testing: each seed gets its
    /// own mix). Each probability is zero for about a third of seeds and otherwise up to a
    /// ceiling: loss up to 20%, duplication up to 10%, reordering up to 20% with extra delays up
    /// to 100 ticks. Delays lie within `1..=55` ticks; a quarter of seeds get small links (8 to 64
    /// packets) so that the link bound is exercised too.
    #[must_use]
    pub fn swarm(rng: &mut Rng) -> Self {
        let delay_ticks_min = 1 + rng.below(5);
        let delay_ticks_max = delay_ticks_min + rng.below(51);
        let loss_per_million = swarm_per_million(rng, 200_000);
        let duplicate_per_million = swarm_per_million(rng, 100_000);
        let reorder_per_million = swarm_per_million(rng, 200_000);
        let reorder_delay_ticks_max = 1 + rng.below(100);
        let link_packets_max = if rng.chance(1, 4) {
            8 + usize::try_from(rng.below(57)).expect("below 57 fits in usize")
        } else {
            RELIABLE_LINK_PACKETS_MAX
        };
        Self {
            delay_ticks_min,
            delay_ticks_max,
            loss_per_million,
            duplicate_per_million,
            reorder_per_million,
            reorder_delay_ticks_max,
            link_packets_max,
        }
    }

    /// Panics with the offending field if the configuration is inconsistent (a caller bug).
    fn assert_valid(&self) {
        assert!(
            self.delay_ticks_min <= self.delay_ticks_max,
            "NetworkConfig: delay_ticks_min {} > delay_ticks_max {}",
            self.delay_ticks_min,
            self.delay_ticks_max
        );
        for (name, value) in [
            ("loss_per_million", self.loss_per_million),
            ("duplicate_per_million", self.duplicate_per_million),
            ("reorder_per_million", self.reorder_per_million),
        ] {
            assert!(value <= PER_MILLION, "NetworkConfig: {name} {value} > {PER_MILLION}");
        }
    }
}

/// What the network has done so far. At every point, `sent + duplicated == delivered + lost +
/// dropped_link_down + dropped_link_full + dropped_endpoint_inbound + in_flight`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Calls to [`Network::send`].
    pub sent: u64,
    /// Packets (copies included) handed out by [`Network::deliver`].
    pub delivered: u64,
    /// Packets lost at send time by the `loss_per_million` draw.
    pub lost: u64,
    /// Second copies created by the `duplicate_per_million` draw.
    pub duplicated: u64,
    /// Copies given an extra reordering delay.
    pub reordered: u64,
    /// Packets dropped because their link was down, at send time or when they fell due.
    pub dropped_link_down: u64,
    /// Copies dropped at send time because their link already held `link_packets_max` packets.
    pub dropped_link_full: u64,
    /// Packets in flight to an endpoint when [`Network::drop_endpoint_inbound`] was called on it.
    pub dropped_endpoint_inbound: u64,
    /// Packets (copies included) currently in flight.
    pub in_flight: u64,
}

/// A packet handed to its destination by [`Network::deliver`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Delivery<P> {
    /// The endpoint that sent the packet.
    pub from: usize,
    /// The endpoint the packet is for.
    pub to: usize,
    /// The packet as it was sent.
    pub packet: P,
}

/// A deterministic packet network between endpoints `0..endpoints`; see the module documentation
/// for the packet model. Every method asserts that the endpoint indices it gets are in range.
#[derive(Debug)]
pub struct Network<P> {
    endpoints: usize,
    config: NetworkConfig,
    rng: Rng,
    /// Packets in flight keyed by (due tick, sequence number): the delivery order.
    in_flight: BTreeMap<(u64, u64), Delivery<P>>,
    /// The next sequence number to assign; unique per copy, so keys never collide.
    sequence_next: u64,
    /// Per directed link (`from * endpoints + to`): whether it carries packets.
    links_up: Vec<bool>,
    /// Per directed link: packets in flight on it, at most `config.link_packets_max` after a send.
    link_packets: Vec<usize>,
    /// Per directed link: its own loss rate, applied when higher than `config.loss_per_million`.
    link_loss_per_million: Vec<u32>,
    stats: NetworkStats,
}

impl<P: Clone> Network<P> {
    /// A network between `endpoints` endpoints with every link up, nothing in flight, the given
    /// rates, and a PRNG seeded with `seed`.
    ///
    /// # Panics
    /// If `config` is inconsistent (`delay_ticks_min > delay_ticks_max`, or a probability above
    /// one million per million), or `endpoints²` overflows `usize`.
    #[must_use]
    pub fn new(endpoints: usize, config: NetworkConfig, seed: u64) -> Self {
        config.assert_valid();
        let links = endpoints.checked_mul(endpoints).expect("Network: endpoints² overflows usize");
        Self {
            endpoints,
            config,
            rng: Rng::new(seed),
            in_flight: BTreeMap::new(),
            sequence_next: 0,
            links_up: vec![true; links],
            link_packets: vec![0; links],
            link_loss_per_million: vec![0; links],
            stats: NetworkStats::default(),
        }
    }

    /// Sends `packet` from `from` to `to` at `now_tick`, deciding at once whether it is dropped
    /// (link down, loss, link full), duplicated, and when each copy falls due (see the module
    /// documentation). Ticks should not go backwards; a packet due before an earlier `deliver`
    /// tick is simply handed out by the next [`Network::deliver`].
    pub fn send(&mut self, now_tick: u64, from: usize, to: usize, packet: P) {
        let link = self.link_index(from, to);
        self.stats.sent += 1;
        if !self.links_up[link] {
            self.stats.dropped_link_down += 1;
            return;
        }
        // One draw whatever the link's own rate, so a run without throttled links draws what it
        // always did.
        let loss_per_million = self.config.loss_per_million.max(self.link_loss_per_million[link]);
        if self.rng.chance(u64::from(loss_per_million), u64::from(PER_MILLION)) {
            self.stats.lost += 1;
            return;
        }
        if self.rng.chance(u64::from(self.config.duplicate_per_million), u64::from(PER_MILLION)) {
            self.stats.duplicated += 1;
            self.enqueue(now_tick, link, Delivery { from, to, packet: packet.clone() });
        }
        self.enqueue(now_tick, link, Delivery { from, to, packet });
    }

    /// The tick at which the earliest packet in flight falls due, for jumping virtual time; `None`
    /// when nothing is in flight. A packet on a link that is down at that tick is dropped rather
    /// than delivered, so `deliver` at this tick may return nothing.
    #[must_use]
    pub fn next_delivery_tick(&self) -> Option<u64> {
        self.in_flight.first_key_value().map(|(&(due_tick, _), _)| due_tick)
    }

    /// Every packet due at or before `now_tick`, in order of due tick and then of sequence number
    /// (send order, a duplicate's two copies in draw order). Packets whose link is down now are
    /// dropped instead.
    pub fn deliver(&mut self, now_tick: u64) -> Vec<Delivery<P>> {
        let mut deliveries = Vec::new();
        while let Some(entry) = self.in_flight.first_entry() {
            if entry.key().0 > now_tick {
                break;
            }
            let delivery = entry.remove();
            let link = self.link_index(delivery.from, delivery.to);
            self.link_packets[link] -= 1;
            self.stats.in_flight -= 1;
            if self.links_up[link] {
                self.stats.delivered += 1;
                deliveries.push(delivery);
            } else {
                self.stats.dropped_link_down += 1;
            }
        }
        deliveries
    }

    /// Brings the one-way link `from → to` up or down. Packets already in flight on it stay in
    /// flight; they are dropped only if the link is down when they fall due.
    pub fn set_link(&mut self, from: usize, to: usize, up: bool) {
        let link = self.link_index(from, to);
        self.links_up[link] = up;
    }

    /// Gives the one-way link `from → to` its own loss rate (a throttled link), applied to packets
    /// sent from now on when higher than the configured `loss_per_million`; 0 clears it.
    ///
    /// # Panics
    /// If `loss_per_million` exceeds one million (a caller bug).
    pub fn set_link_loss(&mut self, from: usize, to: usize, loss_per_million: u32) {
        assert!(loss_per_million <= PER_MILLION, "link loss {loss_per_million} > {PER_MILLION}");
        let link = self.link_index(from, to);
        self.link_loss_per_million[link] = loss_per_million;
    }

    /// Whether the one-way link `from → to` is up.
    #[must_use]
    pub fn link_up(&self, from: usize, to: usize) -> bool {
        self.links_up[self.link_index(from, to)]
    }

    /// Cuts every link between `endpoint` and every other endpoint, both directions.
    pub fn isolate(&mut self, endpoint: usize) {
        self.set_links_of(endpoint, false);
    }

    /// Brings up every link between `endpoint` and every other endpoint, both directions: undoes
    /// [`Network::isolate`], and any partition as far as it involves `endpoint`.
    pub fn reconnect(&mut self, endpoint: usize) {
        self.set_links_of(endpoint, true);
    }

    /// A symmetric partition: cuts every link between an endpoint of `side_a` and an endpoint of
    /// `side_b`, both directions. Endpoints in neither set keep their links; existing cuts stay.
    pub fn partition(&mut self, side_a: &[usize], side_b: &[usize]) {
        self.partition_one_way(side_a, side_b);
        self.partition_one_way(side_b, side_a);
    }

    /// A one-way partition: cuts every link from an endpoint of `from_side` to an endpoint of
    /// `to_side`; the reverse direction keeps working.
    pub fn partition_one_way(&mut self, from_side: &[usize], to_side: &[usize]) {
        for &from in from_side {
            for &to in to_side {
                if from != to {
                    self.set_link(from, to, false);
                }
            }
        }
    }

    /// Brings every link up and clears every link's own loss rate. The configured fault rates
    /// are left as they are: to end a fault phase, call this and then
    /// `set_config(NetworkConfig::reliable())`.
    pub fn heal(&mut self) {
        self.links_up.fill(true);
        self.link_loss_per_million.fill(0);
    }

    /// Replaces the fault rates for packets sent from now on; packets in flight keep their due
    /// ticks. If `link_packets_max` shrinks below what a link holds, nothing is dropped, but
    /// that link takes no packet until it drains below the new bound.
    ///
    /// # Panics
    /// If `config` is inconsistent, as in [`Network::new`].
    pub fn set_config(&mut self, config: NetworkConfig) {
        config.assert_valid();
        self.config = config;
    }

    /// The fault rates in force.
    #[must_use]
    pub fn config(&self) -> NetworkConfig {
        self.config
    }

    /// Drops every packet in flight to `endpoint`, as when its process crashes; counted in
    /// [`NetworkStats::dropped_endpoint_inbound`]. Packets it sent are unaffected.
    pub fn drop_endpoint_inbound(&mut self, endpoint: usize) {
        assert!(endpoint < self.endpoints, "endpoint {endpoint} >= {}", self.endpoints);
        let endpoints = self.endpoints;
        let mut dropped: u64 = 0;
        let link_packets = &mut self.link_packets;
        self.in_flight.retain(|_, delivery| {
            if delivery.to != endpoint {
                return true;
            }
            link_packets[delivery.from * endpoints + delivery.to] -= 1;
            dropped += 1;
            false
        });
        self.stats.dropped_endpoint_inbound += dropped;
        self.stats.in_flight -= dropped;
    }

    /// The number of endpoints.
    #[must_use]
    pub fn endpoints(&self) -> usize {
        self.endpoints
    }

    /// What the network has done so far.
    #[must_use]
    pub fn stats(&self) -> NetworkStats {
        self.stats
    }

    /// Puts one copy on `link` if there is room, with its drawn delay and maybe a reordering
    /// delay.
    fn enqueue(&mut self, now_tick: u64, link: usize, delivery: Delivery<P>) {
        if self.link_packets[link] >= self.config.link_packets_max {
            self.stats.dropped_link_full += 1;
            return;
        }
        let mut delay_ticks = uniform_inclusive(
            &mut self.rng,
            self.config.delay_ticks_min,
            self.config.delay_ticks_max,
        );
        if self.config.reorder_delay_ticks_max > 0
            && self.rng.chance(u64::from(self.config.reorder_per_million), u64::from(PER_MILLION))
        {
            self.stats.reordered += 1;
            let extra_ticks =
                uniform_inclusive(&mut self.rng, 1, self.config.reorder_delay_ticks_max);
            delay_ticks = delay_ticks.saturating_add(extra_ticks);
        }
        let sequence = self.sequence_next;
        self.sequence_next += 1;
        self.in_flight.insert((now_tick.saturating_add(delay_ticks), sequence), delivery);
        self.link_packets[link] += 1;
        self.stats.in_flight += 1;
    }

    /// Sets every link between `endpoint` and every other endpoint, both directions.
    fn set_links_of(&mut self, endpoint: usize, up: bool) {
        assert!(endpoint < self.endpoints, "endpoint {endpoint} >= {}", self.endpoints);
        for other in (0..self.endpoints).filter(|&other| other != endpoint) {
            self.set_link(endpoint, other, up);
            self.set_link(other, endpoint, up);
        }
    }

    /// The index of the directed link `from → to`.
    ///
    /// # Panics
    /// If either endpoint is out of range (a caller bug).
    fn link_index(&self, from: usize, to: usize) -> usize {
        assert!(from < self.endpoints, "from endpoint {from} >= {}", self.endpoints);
        assert!(to < self.endpoints, "to endpoint {to} >= {}", self.endpoints);
        from * self.endpoints + to
    }
}

/// A swarm-testing probability: zero for about a third of draws, else uniform in `1..=max`.
fn swarm_per_million(rng: &mut Rng, max: u32) -> u32 {
    if rng.chance(1, 3) {
        0
    } else {
        1 + u32::try_from(rng.below(u64::from(max))).expect("below a u32 fits in u32")
    }
}

/// A number uniform in `low..=high`.
fn uniform_inclusive(rng: &mut Rng, low: u64, high: u64) -> u64 {
    debug_assert!(low <= high);
    match (high - low).checked_add(1) {
        Some(span) => low + rng.below(span),
        None => rng.next_u64(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reliable network with one knob turned, for tests of that knob alone.
    fn config_with(change: impl FnOnce(&mut NetworkConfig)) -> NetworkConfig {
        let mut config = NetworkConfig::reliable();
        change(&mut config);
        config
    }

    /// Checks the accounting identity of [`NetworkStats`] and the per-link counts.
    fn check_accounting<P: Clone>(network: &Network<P>) {
        let stats = network.stats();
        assert_eq!(
            stats.sent + stats.duplicated,
            stats.delivered
                + stats.lost
                + stats.dropped_link_down
                + stats.dropped_link_full
                + stats.dropped_endpoint_inbound
                + stats.in_flight,
            "{stats:?}"
        );
        assert_eq!(stats.in_flight, network.in_flight.len() as u64);
        let mut link_packets = vec![0; network.link_packets.len()];
        for delivery in network.in_flight.values() {
            link_packets[network.link_index(delivery.from, delivery.to)] += 1;
        }
        assert_eq!(link_packets, network.link_packets);
    }

    /// Delivers everything in flight, jumping from due tick to due tick; returns (tick, delivery).
    fn drain<P: Clone>(network: &mut Network<P>) -> Vec<(u64, Delivery<P>)> {
        let mut out = Vec::new();
        while let Some(tick) = network.next_delivery_tick() {
            out.extend(network.deliver(tick).into_iter().map(|delivery| (tick, delivery)));
        }
        check_accounting(network);
        out
    }

    /// A seeded run of swarm traffic with faults, returning every delivery with its tick.
    fn swarm_run(seed: u64) -> (Vec<(u64, Delivery<u64>)>, NetworkStats) {
        let mut rng = Rng::new(seed);
        let config = NetworkConfig::swarm(&mut rng);
        let mut network = Network::new(5, config, seed);
        let mut out = Vec::new();
        for tick in 0..2_000 {
            for _ in 0..rng.below(4) {
                let from = usize::try_from(rng.below(5)).unwrap();
                let to = usize::try_from(rng.below(5)).unwrap();
                network.send(tick, from, to, rng.next_u64());
            }
            if tick % 300 == 100 {
                network.isolate(usize::try_from(rng.below(5)).unwrap());
            }
            if tick % 300 == 200 {
                network.heal();
            }
            out.extend(network.deliver(tick).into_iter().map(|delivery| (tick, delivery)));
        }
        out.extend(drain(&mut network));
        check_accounting(&network);
        (out, network.stats())
    }

    #[test]
    fn same_seed_same_deliveries_other_seed_differs() {
        let (deliveries_a, stats_a) = swarm_run(42);
        let (deliveries_b, stats_b) = swarm_run(42);
        assert!(!deliveries_a.is_empty());
        assert_eq!(deliveries_a, deliveries_b);
        assert_eq!(stats_a, stats_b);
        let (deliveries_c, _) = swarm_run(43);
        assert_ne!(deliveries_a, deliveries_c);
    }

    #[test]
    fn same_seed_same_deliveries_with_fixed_config() {
        // The network's own seed, not only the swarm config, decides the outcome.
        let config = config_with(|config| {
            config.delay_ticks_max = 20;
            config.loss_per_million = 100_000;
            config.duplicate_per_million = 100_000;
            config.reorder_per_million = 100_000;
            config.reorder_delay_ticks_max = 30;
        });
        let run = |seed| {
            let mut network = Network::new(3, config, seed);
            for packet in 0..500_u32 {
                network.send(u64::from(packet), 0, 1 + (packet as usize % 2), packet);
            }
            drain(&mut network)
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn delays_stay_within_bounds_and_reach_both() {
        let config = config_with(|config| {
            config.delay_ticks_min = 3;
            config.delay_ticks_max = 7;
        });
        let mut network = Network::new(2, config, 1);
        let send_tick = 100;
        for packet in 0..1_000_u32 {
            network.send(send_tick, 0, 1, packet);
        }
        let delays: Vec<u64> =
            drain(&mut network).iter().map(|(tick, _)| tick - send_tick).collect();
        assert_eq!(delays.len(), 1_000);
        assert!(delays.iter().all(|delay| (3..=7).contains(delay)), "{delays:?}");
        assert!(delays.contains(&3) && delays.contains(&7));
    }

    #[test]
    fn nothing_is_delivered_before_it_is_due() {
        let config = config_with(|config| {
            config.delay_ticks_min = 5;
            config.delay_ticks_max = 5;
        });
        let mut network = Network::new(2, config, 1);
        network.send(10, 0, 1, "a");
        assert_eq!(network.next_delivery_tick(), Some(15));
        assert!(network.deliver(14).is_empty());
        assert_eq!(network.deliver(15), vec![Delivery { from: 0, to: 1, packet: "a" }]);
        assert_eq!(network.next_delivery_tick(), None);
        check_accounting(&network);
    }

    #[test]
    fn loss_rate_is_roughly_the_configured_one() {
        let config = config_with(|config| config.loss_per_million = 100_000);
        let mut network = Network::new(2, config, 3);
        for packet in 0..100_000_u32 {
            network.send(u64::from(packet), 0, 1, packet);
            network.deliver(u64::from(packet));
        }
        drain(&mut network);
        let stats = network.stats();
        assert!((9_000..=11_000).contains(&stats.lost), "{stats:?}");
        assert_eq!(stats.delivered, 100_000 - stats.lost);
    }

    #[test]
    fn no_loss_loses_nothing_and_full_loss_loses_everything() {
        for (loss_per_million, lost_expected) in [(0, 0), (PER_MILLION, 1_000)] {
            let config = config_with(|config| config.loss_per_million = loss_per_million);
            let mut network = Network::new(2, config, 3);
            for packet in 0..1_000_u32 {
                network.send(0, 0, 1, packet);
            }
            assert_eq!(drain(&mut network).len() as u64, 1_000 - lost_expected);
            assert_eq!(network.stats().lost, lost_expected);
        }
    }

    #[test]
    fn a_throttled_link_loses_at_its_own_rate_until_healed() {
        let mut network = Network::new(3, NetworkConfig::reliable(), 5);
        network.set_link_loss(0, 1, 900_000);
        // Fewer than a link holds, so nothing is dropped for room.
        for packet in 0..3_000_u32 {
            network.send(0, 0, 1, packet);
            network.send(0, 0, 2, packet);
            network.send(0, 1, 0, packet);
        }
        let delivered = drain(&mut network);
        let to = |endpoint| delivered.iter().filter(|(_, d)| d.to == endpoint).count();
        assert!((200..=400).contains(&to(1)), "{}", to(1));
        assert_eq!(
            (to(2), to(0)),
            (3_000, 3_000),
            "other links (the reverse one too) lose nothing"
        );
        network.heal();
        network.send(1, 0, 1, 0);
        assert_eq!(drain(&mut network).len(), 1);
    }

    #[test]
    fn duplicates_are_counted_and_delivered() {
        let config = config_with(|config| {
            config.duplicate_per_million = PER_MILLION;
            config.delay_ticks_max = 10;
        });
        let mut network = Network::new(2, config, 5);
        for packet in 0..100_u32 {
            network.send(0, 0, 1, packet);
        }
        let deliveries = drain(&mut network);
        assert_eq!(network.stats().duplicated, 100);
        assert_eq!(deliveries.len(), 200);
        for packet in 0..100_u32 {
            assert_eq!(deliveries.iter().filter(|(_, d)| d.packet == packet).count(), 2);
        }
        // Each copy draws its own delay: some pairs arrive at different ticks.
        assert!((0..100_u32).any(|packet| {
            let ticks: Vec<u64> = deliveries
                .iter()
                .filter(|(_, d)| d.packet == packet)
                .map(|(tick, _)| *tick)
                .collect();
            ticks[0] != ticks[1]
        }));

        let config = config_with(|config| {
            config.duplicate_per_million = 250_000;
            config.link_packets_max = 20_000;
        });
        let mut network = Network::new(2, config, 5);
        for packet in 0..10_000_u32 {
            network.send(0, 0, 1, packet);
        }
        let duplicated = network.stats().duplicated;
        assert!((2_000..=3_000).contains(&duplicated), "{duplicated}");
        assert_eq!(drain(&mut network).len() as u64, 10_000 + duplicated);
    }

    #[test]
    fn reordering_lets_later_packets_overtake() {
        let config = config_with(|config| {
            config.reorder_per_million = 300_000;
            config.reorder_delay_ticks_max = 20;
        });
        let mut network = Network::new(2, config, 9);
        for packet in 0..200_u64 {
            network.send(packet, 0, 1, packet);
        }
        let order: Vec<u64> = drain(&mut network).into_iter().map(|(_, d)| d.packet).collect();
        assert_eq!(order.len(), 200);
        assert!(order.windows(2).any(|pair| pair[0] > pair[1]), "no packet was overtaken");
        let reordered = network.stats().reordered;
        assert!((30..=90).contains(&reordered), "{reordered}");
    }

    #[test]
    fn fixed_delay_without_reordering_is_fifo() {
        let mut network = Network::new(2, NetworkConfig::reliable(), 9);
        for packet in 0..200_u64 {
            network.send(packet / 3, 0, 1, packet);
        }
        let order: Vec<u64> = drain(&mut network).into_iter().map(|(_, d)| d.packet).collect();
        assert_eq!(order, (0..200).collect::<Vec<_>>());
        assert_eq!(network.stats().reordered, 0);
    }

    #[test]
    fn one_way_partition_blocks_only_one_direction() {
        let mut network = Network::new(3, NetworkConfig::reliable(), 1);
        network.partition_one_way(&[0], &[1, 2]);
        network.send(0, 0, 1, "0→1");
        network.send(0, 0, 2, "0→2");
        network.send(0, 1, 0, "1→0");
        network.send(0, 2, 0, "2→0");
        network.send(0, 1, 2, "1→2");
        let packets: Vec<&str> = drain(&mut network).into_iter().map(|(_, d)| d.packet).collect();
        assert_eq!(packets, ["1→0", "2→0", "1→2"]);
        assert_eq!(network.stats().dropped_link_down, 2);
        assert!(!network.link_up(0, 1) && network.link_up(1, 0));
    }

    #[test]
    fn symmetric_partition_blocks_both_directions_between_the_sides_only() {
        let mut network = Network::<()>::new(4, NetworkConfig::reliable(), 1);
        network.partition(&[0, 1], &[2]);
        for from in 0..4 {
            for to in 0..4 {
                let cut = (from < 2 && to == 2) || (from == 2 && to < 2);
                assert_eq!(network.link_up(from, to), !cut, "{from}→{to}");
            }
        }
    }

    #[test]
    fn isolate_cuts_everything_and_heal_restores_it() {
        let mut network = Network::new(3, NetworkConfig::reliable(), 1);
        network.isolate(1);
        for other in [0, 2] {
            network.send(0, 1, other, "out");
            network.send(0, other, 1, "in");
        }
        network.send(0, 0, 2, "bystanders");
        network.send(0, 1, 1, "self");
        let packets: Vec<&str> = drain(&mut network).into_iter().map(|(_, d)| d.packet).collect();
        assert_eq!(packets, ["bystanders", "self"]);
        assert_eq!(network.stats().dropped_link_down, 4);

        network.heal();
        for other in [0, 2] {
            network.send(10, 1, other, "out");
            network.send(10, other, 1, "in");
        }
        assert_eq!(drain(&mut network).len(), 4);
    }

    #[test]
    fn reconnect_undoes_isolate_for_one_endpoint() {
        let mut network = Network::<()>::new(3, NetworkConfig::reliable(), 1);
        network.isolate(0);
        network.isolate(1);
        network.reconnect(0);
        assert!(network.link_up(0, 2) && network.link_up(2, 0));
        assert!(network.link_up(0, 1) && network.link_up(1, 0));
        assert!(!network.link_up(1, 2) && !network.link_up(2, 1));
    }

    #[test]
    fn full_link_drops_and_counts_at_the_bound() {
        let config = config_with(|config| config.link_packets_max = 4);
        let mut network = Network::new(3, config, 1);
        for packet in 0..4 {
            network.send(0, 0, 1, packet);
        }
        assert_eq!(network.stats().dropped_link_full, 0);
        network.send(0, 0, 1, 4);
        network.send(0, 0, 1, 5);
        assert_eq!(network.stats().dropped_link_full, 2);
        // The bound is per directed link: the reverse link and another link still take packets.
        network.send(0, 1, 0, 100);
        network.send(0, 0, 2, 200);
        assert_eq!(network.stats().dropped_link_full, 2);
        check_accounting(&network);
        let packets: Vec<i32> = network.deliver(1).into_iter().map(|d| d.packet).collect();
        assert_eq!(packets, [0, 1, 2, 3, 100, 200]);
        // Delivered packets make room again.
        network.send(1, 0, 1, 6);
        assert_eq!(network.stats().dropped_link_full, 2);
        assert_eq!(network.deliver(2), vec![Delivery { from: 0, to: 1, packet: 6 }]);
        check_accounting(&network);
    }

    #[test]
    fn duplicate_needs_room_too() {
        let config = config_with(|config| {
            config.link_packets_max = 3;
            config.duplicate_per_million = PER_MILLION;
        });
        let mut network = Network::new(2, config, 1);
        network.send(0, 0, 1, 'a');
        network.send(0, 0, 1, 'b');
        let stats = network.stats();
        assert_eq!((stats.duplicated, stats.dropped_link_full, stats.in_flight), (2, 1, 3));
        check_accounting(&network);
    }

    #[test]
    fn in_flight_packets_on_a_downed_link_are_dropped_at_delivery() {
        let config = config_with(|config| {
            config.delay_ticks_min = 10;
            config.delay_ticks_max = 10;
        });
        let mut network = Network::new(2, config, 1);
        network.send(0, 0, 1, "dropped");
        network.send(0, 1, 0, "other direction");
        network.set_link(0, 1, false);
        assert_eq!(network.next_delivery_tick(), Some(10));
        let packets: Vec<&str> = network.deliver(10).into_iter().map(|d| d.packet).collect();
        assert_eq!(packets, ["other direction"]);
        assert_eq!(network.stats().dropped_link_down, 1);

        // Down and back up before the packet falls due: nothing is lost.
        network.set_link(0, 1, true);
        network.send(20, 0, 1, "survives");
        network.set_link(0, 1, false);
        network.set_link(0, 1, true);
        assert_eq!(network.deliver(30), vec![Delivery { from: 0, to: 1, packet: "survives" }]);
        check_accounting(&network);
    }

    #[test]
    fn drop_endpoint_inbound_drops_only_packets_to_it() {
        let config = config_with(|config| config.delay_ticks_max = 5);
        let mut network = Network::new(3, config, 1);
        for packet in 0..10 {
            network.send(0, 0, 1, ("to 1", packet));
            network.send(0, 2, 1, ("to 1", packet));
            network.send(0, 1, 0, ("from 1", packet));
            network.send(0, 0, 2, ("bystander", packet));
        }
        network.drop_endpoint_inbound(1);
        assert_eq!(network.stats().dropped_endpoint_inbound, 20);
        check_accounting(&network);
        let deliveries = drain(&mut network);
        assert_eq!(deliveries.len(), 20);
        assert!(deliveries.iter().all(|(_, d)| d.to != 1));
        // The endpoint receives again once restarted.
        network.send(100, 0, 1, ("after", 0));
        assert_eq!(drain(&mut network).len(), 1);
    }

    #[test]
    fn set_config_applies_to_later_packets() {
        let mut network = Network::new(2, NetworkConfig::reliable(), 1);
        network.set_config(config_with(|config| config.loss_per_million = PER_MILLION));
        network.send(0, 0, 1, 0);
        assert_eq!(network.stats().lost, 1);
        network.set_config(NetworkConfig::reliable());
        network.send(0, 0, 1, 1);
        assert_eq!(drain(&mut network).len(), 1);
        assert_eq!(network.config(), NetworkConfig::reliable());
    }

    #[test]
    fn shrinking_the_link_bound_drops_nothing_in_flight() {
        let mut network = Network::new(2, NetworkConfig::reliable(), 1);
        for packet in 0..5 {
            network.send(0, 0, 1, packet);
        }
        network.set_config(config_with(|config| config.link_packets_max = 2));
        network.send(0, 0, 1, 5);
        assert_eq!(network.stats().dropped_link_full, 1);
        assert_eq!(drain(&mut network).len(), 5);
    }

    #[test]
    fn extreme_ticks_and_delays_do_not_overflow() {
        let config = NetworkConfig {
            delay_ticks_min: 0,
            delay_ticks_max: u64::MAX,
            loss_per_million: 0,
            duplicate_per_million: PER_MILLION,
            reorder_per_million: PER_MILLION,
            reorder_delay_ticks_max: u64::MAX,
            link_packets_max: 16,
        };
        let mut network = Network::new(2, config, 1);
        for packet in 0..4 {
            network.send(u64::MAX - 1, 0, 1, packet);
        }
        assert_eq!(network.deliver(u64::MAX).len(), 8);
        check_accounting(&network);
    }

    #[test]
    fn swarm_configs_are_valid_and_varied() {
        let mut rng = Rng::new(11);
        let configs: Vec<NetworkConfig> =
            (0..300).map(|_| NetworkConfig::swarm(&mut rng)).collect();
        for config in &configs {
            config.assert_valid();
            assert!(config.delay_ticks_min >= 1 && config.delay_ticks_max <= 55, "{config:?}");
            assert!(config.loss_per_million <= 200_000);
            assert!(config.link_packets_max >= 8);
        }
        assert!(configs.iter().any(|config| config.loss_per_million == 0));
        assert!(configs.iter().any(|config| config.loss_per_million > 150_000));
        assert!(configs.iter().any(|config| config.duplicate_per_million == 0));
        assert!(configs.iter().any(|config| config.reorder_per_million > 0));
        assert!(configs.iter().any(|config| config.link_packets_max < 64));
        assert!(configs.iter().any(|config| config.delay_ticks_max > 40));
    }

    #[test]
    fn random_call_sequences_keep_the_books() {
        // Any call sequence with valid endpoints: no panic, and the accounting always balances.
        for seed in 0..20 {
            let mut rng = Rng::new(seed);
            let config = NetworkConfig::swarm(&mut rng);
            let endpoints = 1 + usize::try_from(rng.below(6)).unwrap();
            let mut network = Network::new(endpoints, config, seed);
            let mut tick = 0;
            let mut link_packets_max = config.link_packets_max;
            let endpoint = |rng: &mut Rng| usize::try_from(rng.below(endpoints as u64)).unwrap();
            for _ in 0..3_000 {
                match rng.below(100) {
                    0..60 => network.send(tick, endpoint(&mut rng), endpoint(&mut rng), tick),
                    60..75 => {
                        let deliveries = network.deliver(tick);
                        assert!(deliveries.iter().all(|d| network.link_up(d.from, d.to)));
                    }
                    75..80 => {
                        let (from, to) = (endpoint(&mut rng), endpoint(&mut rng));
                        network.set_link(from, to, rng.chance(1, 2));
                    }
                    80..82 => network.isolate(endpoint(&mut rng)),
                    82..84 => network.reconnect(endpoint(&mut rng)),
                    84..86 => network.partition(&[endpoint(&mut rng)], &[endpoint(&mut rng)]),
                    86..88 => {
                        network.partition_one_way(&[endpoint(&mut rng)], &[endpoint(&mut rng)]);
                    }
                    88..90 => network.heal(),
                    90..92 => network.drop_endpoint_inbound(endpoint(&mut rng)),
                    92..93 => {
                        let config = NetworkConfig::swarm(&mut rng);
                        link_packets_max = link_packets_max.max(config.link_packets_max);
                        network.set_config(config);
                    }
                    _ => tick += rng.below(20),
                }
                check_accounting(&network);
                assert!(network.link_packets.iter().all(|&packets| packets <= link_packets_max));
            }
            network.heal();
            drain(&mut network);
            assert_eq!(network.stats().in_flight, 0);
        }
    }

    #[test]
    #[should_panic(expected = "to endpoint 2 >= 2")]
    fn out_of_range_endpoint_is_a_caller_bug() {
        let mut network = Network::new(2, NetworkConfig::reliable(), 1);
        network.send(0, 0, 2, ());
    }

    #[test]
    #[should_panic(expected = "delay_ticks_min 5 > delay_ticks_max 4")]
    fn inconsistent_config_is_a_caller_bug() {
        let config = config_with(|config| {
            config.delay_ticks_min = 5;
            config.delay_ticks_max = 4;
        });
        let _network = Network::<()>::new(2, config, 1);
    }
}
