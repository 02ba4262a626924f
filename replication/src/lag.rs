//! Per-backup lag as the primary sees it (DESIGN.md §4 "Lag", after Kafka's KAFKA-1546), and the
//! group status snapshot a replica reports.
//!
//! It owns, for the primary of a view, the tick at which each of its newest prepares became its
//! head, and per backup the highest op acknowledged and the last tick the backup was *caught up*:
//! had acknowledged the op that was the head at that moment. An acknowledgement of op `a` proves
//! the backup caught up at every moment the head was at most `a`, that is until op `a + 1` was
//! prepared (or until now, when `a` is the head), so a healthy backup under pipelined load, whose
//! acknowledgements always trail the head by a round trip, is never flagged however small the
//! batches. It also owns the plain status types ([`GroupStatus`], [`ReplicaProgress`],
//! [`ReplicaState`]).
//!
//! It never reads a clock (ticks are passed in) and decides nothing in the protocol: a backup
//! flagged lagging or dead still counts in every quorum; the flags are for status, metrics and
//! operators.

use std::collections::BTreeMap;

use crate::config::ReplicaConfig;
use crate::replica::{ReplicaCounters, Status};

/// A member of the group as its primary sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReplicaState {
    /// The primary itself (always in sync).
    Primary,
    /// Caught up within `replica_lag_ticks_max` and heard from within it.
    InSync,
    /// Heard from, but not caught up for longer than `replica_lag_ticks_max`.
    Lagging,
    /// Nothing heard from it for longer than `replica_lag_ticks_max`.
    Dead,
}

/// One member's progress, as the primary of the view sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicaProgress {
    /// The member's index in the group.
    pub replica: u8,
    /// The highest op it acknowledged in this view (0 before its first acknowledgement); for the
    /// primary itself, its durable head.
    pub acknowledged_op: u64,
    /// Ticks since it was last caught up (0 for the primary). The node layer's driver turns ticks
    /// into milliseconds (`TICK_MS` in production).
    pub lag_ticks: u64,
    /// Ticks since anything was heard from it (0 for the primary).
    pub silent_ticks: u64,
    /// What those figures make it.
    pub state: ReplicaState,
}

/// A replica's view of its group, for status pages and metrics.
///
/// Only the primary of a normal view knows its backups' progress; any other replica reports its
/// own view, status, commit point and head with `replicas` empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GroupStatus {
    /// The group.
    pub group: u64,
    /// The reporting replica's index.
    pub replica: u8,
    /// Its view.
    pub view: u32,
    /// Its status.
    pub status: Status,
    /// Whether it is the primary of its view, serving.
    pub primary: bool,
    /// The highest op it applied.
    pub commit: u64,
    /// Its head op.
    pub head: u64,
    /// Every member's progress, by index (the reporter's own included), when the reporter is the
    /// serving primary; empty otherwise.
    pub replicas: Vec<ReplicaProgress>,
}

impl GroupStatus {
    /// The in-sync set: the primary and every backup neither lagging nor dead, ascending. Empty
    /// when the reporter is not the serving primary.
    pub fn in_sync(&self) -> Vec<u8> {
        self.replicas
            .iter()
            .filter(|p| matches!(p.state, ReplicaState::Primary | ReplicaState::InSync))
            .map(|p| p.replica)
            .collect()
    }

    /// The progress of member `replica`, when the reporter knows it.
    pub fn progress(&self, replica: u8) -> Option<&ReplicaProgress> {
        self.replicas.iter().find(|p| p.replica == replica)
    }
}

/// The primary's lag bookkeeping for one view (see the module documentation).
#[derive(Clone, Debug)]
pub(crate) struct LagTracker {
    own: u8,
    lag_ticks_max: u64,
    /// Op → the tick it became the head, for the newest `head_ticks_max` ops prepared in this
    /// view; an acknowledgement below them earns no credit (the backup is that far behind).
    head_ticks: BTreeMap<u64, u64>,
    /// As many ops as the log keeps headers for above the commit point: an acknowledgement of an
    /// op older than that cannot be checked against the log anyway.
    head_ticks_max: usize,
    acknowledged_op: Vec<u64>,
    caught_up_tick: Vec<u64>,
    states: Vec<ReplicaState>,
    /// Per backup, the tick since which it has been in sync without a break, counted from the
    /// first acknowledgement of this view that found it in sync and caught up (the grace every
    /// backup gets when a view starts proves nothing); `None` while it is not in sync, before
    /// that acknowledgement, and after a hand-over to it was given up.
    in_sync_since_tick: Vec<Option<u64>>,
}

impl LagTracker {
    pub(crate) fn new(config: &ReplicaConfig) -> LagTracker {
        let n = usize::from(config.replica_count);
        let mut tracker = LagTracker {
            own: config.replica,
            lag_ticks_max: config.replica_lag_ticks_max,
            head_ticks: BTreeMap::new(),
            head_ticks_max: 2 * config.view_headers_max,
            acknowledged_op: vec![0; n],
            caught_up_tick: vec![0; n],
            states: vec![ReplicaState::InSync; n],
            in_sync_since_tick: vec![None; n],
        };
        tracker.start_view(0);
        tracker
    }

    /// The bound changed (see `Replica::set_replica_lag_ticks_max`).
    pub(crate) fn set_lag_ticks_max(&mut self, ticks: u64) {
        self.lag_ticks_max = ticks;
    }

    /// This replica starts serving a view as its primary at `tick`: every backup gets a fresh
    /// bound to catch up in (as the failure detector gets a fresh heartbeat timeout), and nothing
    /// acknowledged or prepared in an older view counts.
    pub(crate) fn start_view(&mut self, tick: u64) {
        self.head_ticks.clear();
        self.acknowledged_op.fill(0);
        self.caught_up_tick.fill(tick);
        self.states.fill(ReplicaState::InSync);
        self.states[usize::from(self.own)] = ReplicaState::Primary;
        self.in_sync_since_tick.fill(None);
    }

    /// The primary prepared `op` at `tick`: it is the head from now on.
    pub(crate) fn prepared(&mut self, op: u64, tick: u64) {
        self.head_ticks.insert(op, tick);
        while self.head_ticks.len() > self.head_ticks_max {
            self.head_ticks.pop_first();
        }
    }

    /// Backup `from` acknowledged `op` (checked against the log: the same prepare) at `tick`,
    /// while the primary's head is `head`.
    pub(crate) fn acknowledged(&mut self, from: u8, op: u64, head: u64, tick: u64) {
        let from = usize::from(from);
        self.acknowledged_op[from] = self.acknowledged_op[from].max(op);
        // Canary (DESIGN.md §7): the naive definition, caught up only when acknowledging the head
        // now, which flags a healthy backup under pipelined load.
        #[cfg(feature = "canary-lag-naive")]
        let caught_up_until = (op >= head).then_some(tick);
        // Caught up at every moment the head was at most `op`: until `op + 1` was prepared.
        #[cfg(not(feature = "canary-lag-naive"))]
        let caught_up_until =
            if op >= head { Some(tick) } else { self.head_ticks.get(&(op + 1)).copied() };
        if let Some(until) = caught_up_until {
            self.caught_up_tick[from] = self.caught_up_tick[from].max(until);
            if self.states[from] == ReplicaState::InSync {
                self.in_sync_since_tick[from].get_or_insert(tick);
            }
        }
    }

    /// Re-evaluates every backup at `tick` (`last_heard_tick` per member, from the primary's
    /// failure detector), counting transitions.
    pub(crate) fn update(
        &mut self,
        tick: u64,
        members: u32,
        last_heard_tick: &[u64],
        counters: &mut ReplicaCounters,
    ) {
        let own = usize::from(self.own);
        let slots = self.states.iter_mut().zip(&self.caught_up_tick).zip(last_heard_tick);
        for (replica, ((state, &caught_up_tick), &heard_tick)) in slots.enumerate() {
            // A slot of no member (a node that holds none of this group) is neither lagging
            // nor dead: it is not there to count.
            if replica == own || members & (1 << replica) == 0 {
                continue;
            }
            let now = state_at(self.lag_ticks_max, tick, heard_tick, caught_up_tick);
            if now != ReplicaState::InSync {
                self.in_sync_since_tick[replica] = None;
            }
            let before = std::mem::replace(state, now);
            match (before, now) {
                // From in sync, or from dead: one that answers again lags until it caught up.
                (b, ReplicaState::Lagging) if b != ReplicaState::Lagging => {
                    counters.backups_lagging += 1;
                }
                (b, ReplicaState::Dead) if b != ReplicaState::Dead => counters.backups_dead += 1,
                (b, ReplicaState::InSync) if b != ReplicaState::InSync => {
                    counters.backups_back_in_sync += 1;
                }
                _ => {}
            }
        }
    }

    /// The first of the next ticks after `tick` (1: the next) at which [`LagTracker::update`]
    /// would change some backup's state, were no backup heard from in between; `u64::MAX`
    /// when none would. Silence and lag only grow until then, so a state changes only where
    /// one of them passes `lag_ticks_max`.
    pub(crate) fn ticks_until_change(
        &self,
        tick: u64,
        members: u32,
        last_heard_tick: &[u64],
    ) -> u64 {
        let own = usize::from(self.own);
        let slots = self.states.iter().zip(&self.caught_up_tick).zip(last_heard_tick);
        let mut first = u64::MAX;
        for (replica, ((&state, &caught_up_tick), &heard_tick)) in slots.enumerate() {
            if replica == own || members & (1 << replica) == 0 {
                continue;
            }
            let passes = |since: u64| (since + self.lag_ticks_max + 1).saturating_sub(tick);
            let mut candidates = [1, passes(heard_tick), passes(caught_up_tick)];
            candidates.sort_unstable();
            let changes = |ticks: &&u64| {
                **ticks >= 1
                    && state_at(self.lag_ticks_max, tick + **ticks, heard_tick, caught_up_tick)
                        != state
            };
            if let Some(&change) = candidates.iter().find(changes) {
                first = first.min(change);
            }
        }
        first
    }

    /// How long backup `replica` has been in sync without a break at `tick`, by the evidence of
    /// its acknowledgements in this view (see `in_sync_since_tick`); `None` when it is not, or
    /// has not proven it yet.
    pub(crate) fn in_sync_ticks(&self, replica: u8, tick: u64) -> Option<u64> {
        let since = self.in_sync_since_tick.get(usize::from(replica)).copied().flatten()?;
        Some(tick.saturating_sub(since))
    }

    /// Backup `replica` failed to catch up when asked to (a hand-over to it was given up): its
    /// run in sync starts again from its next acknowledgement.
    pub(crate) fn forget_in_sync(&mut self, replica: u8) {
        if let Some(since) = self.in_sync_since_tick.get_mut(usize::from(replica)) {
            *since = None;
        }
    }

    /// Every member's progress at `tick`; `own_durable_op` is the primary's durable head.
    pub(crate) fn progress(
        &self,
        tick: u64,
        last_heard_tick: &[u64],
        own_durable_op: u64,
    ) -> Vec<ReplicaProgress> {
        (0..self.states.len())
            .map(|index| {
                let replica = index as u8;
                if replica == self.own {
                    return ReplicaProgress {
                        replica,
                        acknowledged_op: own_durable_op,
                        lag_ticks: 0,
                        silent_ticks: 0,
                        state: ReplicaState::Primary,
                    };
                }
                ReplicaProgress {
                    replica,
                    acknowledged_op: self.acknowledged_op[index],
                    lag_ticks: tick.saturating_sub(self.caught_up_tick[index]),
                    silent_ticks: tick.saturating_sub(last_heard_tick[index]),
                    state: self.states[index],
                }
            })
            .collect()
    }
}

/// A backup's state at `tick`, by when it was last heard from and last caught up.
fn state_at(lag_ticks_max: u64, tick: u64, heard_tick: u64, caught_up_tick: u64) -> ReplicaState {
    if tick.saturating_sub(heard_tick) > lag_ticks_max {
        ReplicaState::Dead
    } else if tick.saturating_sub(caught_up_tick) > lag_ticks_max {
        ReplicaState::Lagging
    } else {
        ReplicaState::InSync
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> (LagTracker, Vec<u64>, ReplicaCounters) {
        let mut config = ReplicaConfig::new(1, 0, 3, 0);
        config.replica_lag_ticks_max = 100;
        (LagTracker::new(&config), vec![0; 3], ReplicaCounters::default())
    }

    fn states(tracker: &LagTracker, tick: u64, heard: &[u64]) -> Vec<ReplicaState> {
        tracker.progress(tick, heard, 0).iter().map(|p| p.state).collect()
    }

    /// `ticks_until_change` names the first tick at which `update` changes a backup's state,
    /// as updating tick by tick finds it: from every mix of in sync, lagging and dead, with
    /// the backups last heard from and caught up at different ticks.
    #[test]
    fn the_next_state_change_is_where_ticking_finds_it() {
        let members = 0b111;
        for (heard_1, caught_up_1, heard_2, caught_up_2) in [
            (0, 0, 0, 0),
            (90, 40, 10, 10),
            (150, 0, 30, 150),
            (0, 0, 150, 120),
            (150, 150, 149, 60),
        ] {
            let (mut lag, mut heard, mut counters) = tracker();
            heard[1] = heard_1;
            heard[2] = heard_2;
            lag.caught_up_tick[1] = caught_up_1;
            lag.caught_up_tick[2] = caught_up_2;
            let tick = 160;
            lag.update(tick, members, &heard, &mut counters);
            let expected = (1..=400)
                .find(|&ticks| {
                    let mut ticking = lag.clone();
                    ticking.update(tick + ticks, members, &heard, &mut counters);
                    ticking.states != lag.states
                })
                .unwrap_or(u64::MAX);
            let case = format!("{heard:?} {:?}", lag.caught_up_tick);
            assert_eq!(lag.ticks_until_change(tick, members, &heard), expected, "{case}");
        }
    }

    #[test]
    fn an_acknowledgement_trailing_the_head_counts_until_the_next_op_was_prepared() {
        let (mut lag, mut heard, mut counters) = tracker();
        // One op per tick; backup 1 acknowledges each op two ticks later, never the head.
        for tick in 1..=1_000 {
            lag.prepared(tick, tick);
            if tick > 2 {
                heard[1] = tick;
                lag.acknowledged(1, tick - 2, tick, tick);
            }
            lag.update(tick, u32::MAX, &heard, &mut counters);
        }
        let progress = lag.progress(1_000, &heard, 1_000);
        assert_eq!(progress[1].state, ReplicaState::InSync);
        assert_eq!(progress[1].acknowledged_op, 998);
        // Caught up until op 999 became the head, at tick 999.
        assert_eq!(progress[1].lag_ticks, 1);
        // Backup 2 never answered.
        assert_eq!(progress[2].state, ReplicaState::Dead);
        assert_eq!((counters.backups_lagging, counters.backups_dead), (0, 1));
    }

    #[test]
    fn heard_but_behind_is_lagging_and_catching_up_rejoins() {
        let (mut lag, mut heard, mut counters) = tracker();
        for tick in 1..=300 {
            lag.prepared(tick, tick);
            heard[1] = tick;
            // Stuck at op 5, which became the head at tick 5: caught up until tick 6.
            lag.acknowledged(1, 5, tick, tick);
            lag.update(tick, u32::MAX, &heard, &mut counters);
            let expected = if tick > 106 { ReplicaState::Lagging } else { ReplicaState::InSync };
            assert_eq!(states(&lag, tick, &heard)[1], expected, "tick {tick}");
        }
        lag.acknowledged(1, 300, 300, 300);
        lag.update(300, u32::MAX, &heard, &mut counters);
        assert_eq!(states(&lag, 300, &heard)[1], ReplicaState::InSync);
        assert_eq!((counters.backups_lagging, counters.backups_back_in_sync), (1, 1));
    }

    #[test]
    fn a_dead_backup_that_answers_again_lags_until_it_caught_up() {
        let (mut lag, mut heard, mut counters) = tracker();
        for tick in 1..=300 {
            lag.prepared(tick, tick);
            if tick <= 10 {
                heard[1] = tick;
                lag.acknowledged(1, tick, tick, tick);
            }
            lag.update(tick, u32::MAX, &heard, &mut counters);
        }
        assert_eq!(states(&lag, 300, &heard)[1], ReplicaState::Dead);
        // It answers again, far behind: heard, not caught up.
        heard[1] = 301;
        lag.acknowledged(1, 50, 300, 301);
        lag.update(301, u32::MAX, &heard, &mut counters);
        assert_eq!(states(&lag, 301, &heard)[1], ReplicaState::Lagging);
        lag.acknowledged(1, 300, 300, 302);
        heard[1] = 302;
        lag.update(302, u32::MAX, &heard, &mut counters);
        assert_eq!(states(&lag, 302, &heard)[1], ReplicaState::InSync);
        // Backup 2, never heard from, was flagged dead too.
        let flagged = (counters.backups_dead, counters.backups_lagging);
        assert_eq!((flagged, counters.backups_back_in_sync), ((2, 1), 1));
    }

    #[test]
    fn an_acknowledgement_older_than_the_kept_head_ticks_earns_no_credit() {
        let (mut lag, heard, _) = tracker();
        let kept = lag.head_ticks_max as u64;
        for op in 1..=kept + 10 {
            lag.prepared(op, 1_000 + op);
        }
        lag.acknowledged(1, 3, kept + 10, 2_000);
        assert_eq!(lag.progress(2_000, &heard, 0)[1].lag_ticks, 2_000);
        assert_eq!(lag.progress(2_000, &heard, 0)[1].acknowledged_op, 3);
    }

    #[test]
    fn a_backup_is_in_sync_by_evidence_from_its_first_acknowledgement_until_it_lags() {
        let (mut lag, mut heard, mut counters) = tracker();
        lag.start_view(10);
        // The grace of a fresh view proves nothing.
        assert_eq!(lag.in_sync_ticks(1, 50), None);
        lag.prepared(1, 20);
        heard[1] = 30;
        lag.acknowledged(1, 1, 1, 30);
        lag.update(30, u32::MAX, &heard, &mut counters);
        assert_eq!(lag.in_sync_ticks(1, 80), Some(50));
        // Silent for longer than the bound: dead, and the run is over.
        lag.update(200, u32::MAX, &heard, &mut counters);
        assert_eq!(lag.in_sync_ticks(1, 200), None);
        heard[1] = 210;
        lag.acknowledged(1, 1, 1, 210);
        lag.update(210, u32::MAX, &heard, &mut counters);
        // Back in sync from this update; the run starts at the next acknowledgement.
        assert_eq!(lag.in_sync_ticks(1, 210), None);
        lag.acknowledged(1, 1, 1, 220);
        assert_eq!(lag.in_sync_ticks(1, 230), Some(10));
        lag.forget_in_sync(1);
        assert_eq!(lag.in_sync_ticks(1, 230), None);
        assert_eq!(lag.in_sync_ticks(2, 230), None);
    }

    #[test]
    fn the_in_sync_set_is_the_primary_and_the_backups_in_sync() {
        let status = GroupStatus {
            group: 1,
            replica: 0,
            view: 3,
            status: Status::Normal,
            primary: true,
            commit: 7,
            head: 9,
            replicas: [ReplicaState::Primary, ReplicaState::Dead, ReplicaState::InSync]
                .into_iter()
                .enumerate()
                .map(|(index, state)| ReplicaProgress {
                    replica: index as u8,
                    acknowledged_op: 0,
                    lag_ticks: 0,
                    silent_ticks: 0,
                    state,
                })
                .collect(),
        };
        assert_eq!(status.in_sync(), vec![0, 2]);
        assert_eq!(status.progress(1).map(|p| p.state), Some(ReplicaState::Dead));
    }
}
