//! The catalog on every shard: shard 0 publishes each new catalog to all shards, and each shard
//! installs it by creating the partition groups it places here (with this shard's segment age)
//! and giving their replicas the topic's own lag bound, if it has one, and the primary the
//! leader balancer preferred, if it chose one.
//!
//! A shard creates partition groups only from a catalog (`deletion` deletes the ones it lets
//! go), and never installs a catalog older than the one it has.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shoal_engine::superblock::GroupConfig;
use shoal_proto::protocol::ErrorCode;
use shoal_replication::{Status, TICK_MS};

use super::state::ShardState;
use super::work::{Outcome, Work, redirect};
use crate::metadata::Catalog;
use crate::offsets::PartitionOffsets;

impl ShardState {
    /// Publishes `catalog` to every shard (this one included, through its inbox).
    pub(super) fn publish(&mut self, catalog: Arc<Catalog>) {
        self.published.publish(Arc::clone(&catalog));
        for inbox in self.mesh.iter() {
            // Never block a shard's loop on a full inbox (its own could deadlock it): a shard
            // that misses this update installs the published catalog when a request names a
            // group it does not hold yet (`ensure_group`), or with the next update.
            let _ = inbox.try_send(Work::Catalog(Arc::clone(&catalog)));
        }
    }

    /// Installs a catalog: creates every partition group it places here that does not exist.
    pub(super) async fn install(&mut self, catalog: Arc<Catalog>) {
        if catalog.applied_op < self.catalog.applied_op {
            return;
        }
        // Shard 0 may have learned the node's rejoin floor since this shard last created a group.
        self.node.set_rejoin_floor(self.rejoin_floor.load(Ordering::SeqCst));
        let mut created = Vec::new();
        let mut joined = Vec::new();
        let mut replica_settings = BTreeMap::new();
        let node = self.config.cluster.node;
        for (place, settings) in catalog.groups_on(self.index, node) {
            let group = place.group;
            // The topic's own lag bound, if it has one (its replicas, new or recovered, take it).
            let lag_ms = settings.replica_lag_time_max_ms;
            let lag_ticks = (lag_ms > 0).then(|| (lag_ms / TICK_MS).max(1));
            // The node's map of groups, asked per group: a list of them searched per group made
            // installing 10,000 partitions cost 10,000² comparisons. Nothing is created before
            // the loop ends, so the answer is the one from before it.
            if self.node.replica(group).is_some() {
                self.node.set_replica_lag_ticks(group, lag_ticks);
                self.node.set_preferred_primary(group, place.preferred);
                continue;
            }
            // The roll age is this shard's choice, not the topic's (docs/configuration.md, "Per-
            // shard topic defaults"); the superblock slot keeps it for the partition's life.
            // Its replicas take their members from here for the group's life (a change of
            // members later is an op in the group's own log); a node a move brings in joins
            // as a learner.
            let config = GroupConfig {
                segment_age_ms_max: self.tuning.segment_age_ms_max,
                members: place.created_members().to_word(),
                ..settings.group_config()
            };
            if place.is_joined_by(node) {
                joined.push((group, config));
            } else {
                created.push((group, config));
            }
            replica_settings.insert(group, (lag_ticks, place.preferred));
        }
        // A topic's partitions come together: one superblock write makes them all durable.
        for (batch, joining) in [(created, false), (joined, true)] {
            let made = if joining {
                self.node.join_groups(&batch).await
            } else {
                self.node.create_groups(&batch).await
            };
            if let Err(error) = made {
                tracing::error!(shard = self.index, groups = batch.len(), %error, "cannot create groups");
                continue;
            }
            for (group, _) in batch {
                let (lag_ticks, preferred) =
                    replica_settings.get(&group).copied().unwrap_or_default();
                self.node.set_replica_lag_ticks(group, lag_ticks);
                self.node.set_preferred_primary(group, preferred);
                self.committed_end.insert(group, 0);
                // A new log holds no data.
                self.offsets.insert(group, PartitionOffsets::for_new_log());
                // Nothing may be deleted before a snapshot covers it.
                self.node.set_retention_floor(group, 0);
            }
        }
        // Nodes added since the cluster formed: this shard's bus dials them (or takes their
        // calls) from now on.
        for (&added, entry) in &catalog.nodes.added {
            if self.bus_addresses.get(added).is_none()
                && let Some(address) =
                    catalog.nodes.bus_address(&self.config.cluster, added, self.index)
            {
                tracing::info!(node = added, bus = %entry.bus, "a node was added to the cluster");
                self.bus_addresses.learn(added, address);
            }
        }
        self.catalog = catalog;
    }

    /// A request may reach this shard before the catalog that placed its group here does (when
    /// shard 0 found this inbox full), or after creating the group failed (a full disk had no
    /// room for its directory): install the published catalog, which creates what is missing.
    ///
    /// A partition this node does not hold is answered `NotPrimary` naming its home (its view-0
    /// primary, a node that holds it), which knows its primary; one a move removed this node
    /// from, naming the primary its last configuration names: the refusal is returned (a
    /// removed replica never takes a write, which would wait for a pipeline that never opens).
    #[must_use = "a refusal is the request's answer"]
    pub(super) async fn ensure_group(&mut self, group: u64) -> Option<Outcome> {
        if self.node.has_log(group) {
            let replica = self.node.replica(group)?;
            return (replica.status() == Status::Removed).then(|| redirect(replica)).flatten();
        }
        let mut latest = Arc::clone(&self.catalog);
        self.published.refresh(&mut latest);
        self.install(latest).await;
        let node = self.config.cluster.node;
        let Some(place) = self.catalog.place_of(group) else {
            // The newest catalog: no topic places the group any more.
            let gone = "the partition's topic was deleted";
            return (group < self.catalog.next_group)
                .then(|| Outcome::error(ErrorCode::TopicNotFound, gone));
        };
        if place.is_held_by(node) {
            return None;
        }
        let primary = place.preferred_primary(self.config.cluster.founders());
        Some(Outcome::not_primary(0, primary))
    }
}
