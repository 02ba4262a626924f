//! Shard 0's Kafka group coordinator at work: it runs where the native coordinator runs (the
//! metadata group's serving primary, caught up) and starts and stops with it, so FindCoordinator
//! names one node for every Kafka group, a cluster-wide namespace. Requests update
//! `crate::kafka_groups::KafkaGroups`; its answers, due now or once a rebalance completes, go
//! back through each request's reply slot.
//!
//! Each completed rebalance is proposed to the metadata log (`MetaCommand::StoreKafkaGroup`)
//! without anyone waiting for it, and a coordinator that starts takes the stored groups up (see
//! `kafka_groups`); offsets go through the partitions' logs (`offsets`). A coordinator that
//! stops answers every waiting request NOT_COORDINATOR, so the members find the new one.

use shoal_proto::wire::HEADER_SIZE;

use super::metadata::MetaWaiter;
use super::state::ShardState;
use super::thread::now_ms;
use super::work::{KafkaGroupReply, KafkaGroupReplySender, KafkaGroupRequest};
use crate::kafka_groups::KafkaGroups;
use crate::metadata::MetaCommand;

/// Room a metadata record needs besides its command: the prepare header, and the batch framing
/// around its one record.
const STORE_FRAMING_BYTES: usize = HEADER_SIZE + 1024;

impl ShardState {
    /// Serves a Kafka group request, if this node coordinates.
    pub(super) fn kafka_group_request(
        &mut self,
        request: KafkaGroupRequest,
        reply: KafkaGroupReplySender,
    ) {
        self.sync_coordinator();
        let Some(metadata) = self.metadata.as_mut().filter(|m| m.coordinating) else {
            let _ = reply.send(KafkaGroupReply::NotCoordinator);
            return;
        };
        let groups = &mut metadata.kafka_groups;
        let now = now_ms();
        match request {
            KafkaGroupRequest::Join(join) => groups.join(join, now, reply),
            KafkaGroupRequest::Sync(sync) => groups.sync(sync, now, reply),
            KafkaGroupRequest::Heartbeat { group, member, generation } => {
                let checked = groups.heartbeat(&group, &member, generation, now);
                let _ = reply.send(KafkaGroupReply::Checked(checked));
            }
            KafkaGroupRequest::Leave { group, members } => {
                let left = groups.leave(&group, &members, now);
                let _ = reply.send(KafkaGroupReply::Left(left));
            }
            KafkaGroupRequest::CheckCommit { group, member, generation } => {
                let checked = groups.check_commit(&group, &member, generation);
                let _ = reply.send(KafkaGroupReply::Checked(checked));
            }
            KafkaGroupRequest::Describe { groups: names } => {
                let described = names.iter().map(|name| groups.describe(name)).collect();
                let _ = reply.send(KafkaGroupReply::Described(described));
            }
            KafkaGroupRequest::List => {
                let _ = reply.send(KafkaGroupReply::Listed(groups.list()));
            }
        }
        self.send_kafka_group_answers();
    }

    /// Time passing for the Kafka groups: expired sessions, rebalance deadlines.
    pub(super) fn tick_kafka_groups(&mut self) {
        if let Some(metadata) = self.metadata.as_mut().filter(|m| m.coordinating) {
            metadata.kafka_groups.tick(now_ms());
            self.send_kafka_group_answers();
        }
    }

    fn send_kafka_group_answers(&mut self) {
        let record_bytes_max = self.node.shard_config().record_size_bytes_max;
        let Some(metadata) = self.metadata.as_mut() else { return };
        for (slot, answer) in metadata.kafka_groups.take_answers() {
            // A requester that gave up (its connection closed) is no error.
            let _ = slot.send(KafkaGroupReply::Answer(answer));
        }
        for stored in metadata.kafka_groups.take_stores() {
            let group = stored.group.clone();
            let command = MetaCommand::StoreKafkaGroup(stored);
            let size = command.encode().len();
            if size + STORE_FRAMING_BYTES > record_bytes_max {
                // Kept in memory only, as before stores: after a failover its members rejoin.
                tracing::warn!(
                    group,
                    size,
                    record_bytes_max,
                    "a Kafka group's state is too large to store; its members rejoin after a \
                     coordinator change"
                );
                continue;
            }
            let Some(metadata) = self.metadata.as_mut() else { return };
            let client = metadata.next_internal_request();
            self.propose_metadata(client, command, MetaWaiter::Nobody);
        }
    }
}

/// Starts (`Some(prefix)`: member ids' unique prefix) or stops the Kafka groups beside the
/// native coordinator; a stop answers every waiting request NOT_COORDINATOR.
pub(super) fn restart_kafka_groups(
    groups: &mut KafkaGroups<KafkaGroupReplySender>,
    start: Option<String>,
    initial_rebalance_delay_ms: u32,
) {
    for slot in groups.drain_waiters() {
        let _ = slot.send(KafkaGroupReply::NotCoordinator);
    }
    if let Some(prefix) = start {
        *groups = KafkaGroups::new(prefix, initial_rebalance_delay_ms);
    }
}
