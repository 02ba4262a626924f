//! The Metadata answer: the cluster's brokers (one per node, at its Kafka address) and the
//! Kafka topics — the topics of the `[kafka] stream` — with each partition's leader.
//!
//! A partition's leader is the node its group's primary is on, as this node's replica sees it,
//! and the leader epoch is the group's VSR view: both move exactly when Kafka's would, on a
//! change of primary. Every node holds a replica of every group, so every node is in each
//! partition's replica and in-sync lists. A topic's id is derived from the cluster id and the
//! group of its partition 0, which is never reused, so it is stable across restarts and differs
//! for a topic deleted and created again.

use shoal_kafka::kafka_protocol::error::ResponseError;
use shoal_kafka::kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use shoal_kafka::kafka_protocol::messages::{BrokerId, MetadataResponse, TopicName};
use shoal_kafka::kafka_protocol::protocol::StrBytes;
use shoal_kafka::request::MetadataRequest;
use shoal_proto::protocol::{NODE_UNKNOWN, PartitionInfo};

use super::Connection;
use crate::connection::partition_stats;
use crate::metadata::{Catalog, Topic};

/// One topic the answer names: found, or with the error to answer for it.
struct Asked<'a> {
    name: Option<String>,
    /// The id the client asked by (only for an unknown one; a found topic's is derived).
    id: [u8; 16],
    topic: Result<&'a Topic, ResponseError>,
}

/// The Metadata response to `request`.
pub(super) async fn answer(connection: &Connection, request: &MetadataRequest) -> MetadataResponse {
    let config = &connection.context.config;
    let mut asked: Vec<Asked> = Vec::new();
    match &request.topics {
        None => {
            for (name, topic) in connection.kafka_topics() {
                asked.push(Asked { name: Some(name.clone()), id: [0; 16], topic: Ok(topic) });
            }
        }
        Some(topics) => {
            // A topic named twice is answered once (Kafka keeps the names in a set): each
            // repeat would list every partition again.
            let mut seen = std::collections::HashSet::new();
            for wanted in topics {
                if !seen.insert((wanted.name.clone(), wanted.topic_id)) {
                    continue;
                }
                match connection.find_topic(wanted.name.as_deref(), &wanted.topic_id) {
                    Ok((name, topic)) => {
                        asked.push(Asked { name: Some(name), id: [0; 16], topic: Ok(topic) })
                    }
                    Err(error) => asked.push(Asked {
                        name: wanted.name.clone(),
                        id: wanted.topic_id,
                        topic: Err(error),
                    }),
                }
            }
        }
    }

    // Every asked partition's primary and view, one inbox round trip per owning shard.
    let mut infos: Vec<PartitionInfo> = asked
        .iter()
        .filter_map(|asked| asked.topic.ok())
        .flat_map(Catalog::topic_partition_infos)
        .collect();
    let primaries = partition_stats(&connection.context.mesh, &mut infos).await;
    let mut primaries = primaries.into_iter();

    let nodes = config.cluster.founders();
    let mut topics = Vec::with_capacity(asked.len());
    for Asked { name, id, topic } in asked {
        let name = name.map(|name| TopicName(StrBytes::from_string(name)));
        let entry = match topic {
            Err(error) => MetadataResponseTopic::default()
                .with_error_code(error.code())
                .with_name(name)
                .with_topic_id(uuid(id)),
            Ok(topic) => {
                let partitions = (0..topic.partitions.len())
                    .map(|index| {
                        let primary = primaries.next().expect("one primary per partition");
                        let (leader, error) = if primary.primary == NODE_UNKNOWN {
                            (-1, ResponseError::LeaderNotAvailable.code())
                        } else {
                            (i32::from(primary.primary), 0)
                        };
                        let place = &topic.partitions[index];
                        let replicas: Vec<BrokerId> =
                            place.replicas(nodes).into_iter().map(|n| BrokerId(n.into())).collect();
                        MetadataResponsePartition::default()
                            .with_error_code(error)
                            .with_partition_index(index as i32)
                            .with_leader_id(BrokerId(leader))
                            .with_leader_epoch(i32::try_from(primary.view).unwrap_or(i32::MAX))
                            .with_replica_nodes(replicas.clone())
                            .with_isr_nodes(replicas)
                    })
                    .collect();
                MetadataResponseTopic::default()
                    .with_name(name)
                    .with_topic_id(uuid(connection.topic_id(topic)))
                    .with_partitions(partitions)
            }
        };
        topics.push(entry);
    }

    // The controller (where CreateTopics and DeleteTopics go) is the metadata primary.
    let controller = connection.coordinator().await.map_or(-1, |(node, _, _)| node);
    MetadataResponse::default()
        .with_brokers(brokers(connection))
        .with_cluster_id(Some(StrBytes::from_string(connection.cluster_id())))
        .with_controller_id(BrokerId(controller))
        .with_topics(topics)
}

/// One broker per node with a Kafka address (`Connection::broker_addresses`).
fn brokers(connection: &Connection) -> Vec<MetadataResponseBroker> {
    connection
        .broker_addresses()
        .into_iter()
        .map(|(node, address, rack)| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(i32::from(node)))
                .with_host(StrBytes::from_string(address.ip().to_string()))
                .with_port(i32::from(address.port()))
                .with_rack(rack.map(StrBytes::from_string))
        })
        .collect()
}

fn uuid(bytes: [u8; 16]) -> shoal_kafka::Uuid {
    shoal_kafka::Uuid::from_bytes(bytes)
}
