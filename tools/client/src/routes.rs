//! Where the client believes each request should go, sans-IO.
//!
//! [`Routes`] owns what the client has learned about the cluster: its nodes and their client
//! addresses (from a version 3 `Hello`), the node leading the metadata group (where admin and
//! consumer group requests go), and each partition's primary (from `DescribeTopic` and from every
//! `NotPrimary` answer). A belief is only a guess: the server refuses a request it does not lead
//! and names the node that does, and the client learns from that. A node the client could not
//! reach loses every belief naming it, so the next request goes to any node and learns anew.
//!
//! It performs no I/O and never decides to retry (the client does). Everything in it is bounded
//! by what servers said: at most [`CLUSTER_NODES_MAX`] nodes, one primary per partition the
//! client asked about.

use std::collections::HashMap;

use shoal_proto::protocol::{
    CLUSTER_NODES_MAX, HelloReply, NODE_UNKNOWN, PartitionPrimary, TOPIC_PARTITIONS_MAX,
};

/// What a request is about, which decides where it goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route<'a> {
    /// Any node (the client's current connection): status, or a request whose partition the
    /// client cannot know (balanced or keyed produce through `Client::produce`).
    Any,
    /// The metadata group's primary: admin requests, sessions, consumer groups.
    Metadata,
    /// A partition's primary: produce, fetch, poll and offsets.
    Partition {
        /// The stream.
        stream: &'a str,
        /// The topic.
        topic: &'a str,
        /// The partition.
        partition: u32,
    },
}

/// The client's beliefs about the cluster. See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Routes {
    /// Each node's client address, by index; empty until a version 3 `Hello` named them.
    nodes: Vec<Option<String>>,
    /// The node believed to lead the metadata group.
    metadata: Option<u8>,
    /// Per stream and topic, the node believed to lead each partition ([`NODE_UNKNOWN`]: no
    /// belief).
    partitions: HashMap<String, HashMap<String, Vec<u8>>>,
}

impl Routes {
    /// Takes the cluster's nodes from a `Hello` result (version 3; older ones name none) that
    /// came over a connection to `reached`. An unspecified IP in an advertised address means the
    /// host the client reached.
    pub(crate) fn learn_nodes(&mut self, hello: &HelloReply, reached: &str) {
        if hello.nodes.is_empty() {
            return;
        }
        let count = hello.nodes.iter().map(|n| usize::from(n.node) + 1).max().unwrap_or(0);
        self.nodes = vec![None; count.min(CLUSTER_NODES_MAX)];
        for node in &hello.nodes {
            if let Some(slot) = self.nodes.get_mut(usize::from(node.node)) {
                *slot = Some(resolve(&node.address, reached));
            }
        }
    }

    /// Whether requests are routed: the cluster has more than one node. A one-node cluster's
    /// requests all go over the client's current connection, whichever address it reached.
    pub(crate) fn is_cluster(&self) -> bool {
        self.nodes.len() > 1
    }

    /// Node `node`'s client address, if known.
    pub(crate) fn address(&self, node: u8) -> Option<&str> {
        self.nodes.get(usize::from(node))?.as_deref()
    }

    /// The node believed to lead what `route` is about.
    pub(crate) fn primary(&self, route: &Route<'_>) -> Option<u8> {
        if !self.is_cluster() {
            return None;
        }
        let node = match *route {
            Route::Any => None,
            Route::Metadata => self.metadata,
            Route::Partition { stream, topic, partition } => self
                .partitions
                .get(stream)?
                .get(topic)?
                .get(partition as usize)
                .copied()
                .filter(|&node| node != NODE_UNKNOWN),
        };
        node.filter(|&node| self.address(node).is_some())
    }

    /// A server said `primary` leads what `route` is about.
    pub(crate) fn learn(&mut self, route: &Route<'_>, primary: u8) {
        let known = (primary != NODE_UNKNOWN).then_some(primary);
        match *route {
            Route::Any => {}
            Route::Metadata => self.metadata = known,
            // Decoders refuse partitions past any topic's bound; a belief about one is dropped
            // here too, since the table is indexed by partition.
            Route::Partition { partition, .. } if partition >= TOPIC_PARTITIONS_MAX => {}
            Route::Partition { stream, topic, partition } => {
                let topics = self.partitions.entry(stream.to_string()).or_default();
                let primaries = topics.entry(topic.to_string()).or_default();
                let index = partition as usize;
                if primaries.len() <= index {
                    primaries.resize(index + 1, NODE_UNKNOWN);
                }
                primaries[index] = primary;
            }
        }
    }

    /// A `DescribeTopic` result named each partition's primary (`primaries[i]` for partition
    /// `partitions[i]`).
    pub(crate) fn learn_topic(
        &mut self,
        stream: &str,
        topic: &str,
        partitions: impl Iterator<Item = u32>,
        primaries: &[PartitionPrimary],
    ) {
        for (partition, primary) in partitions.zip(primaries) {
            self.learn(&Route::Partition { stream, topic, partition }, primary.primary);
        }
    }

    /// Node `node` could not be reached: nothing is believed to lead anywhere on it any more.
    pub(crate) fn forget_node(&mut self, node: u8) {
        if self.metadata == Some(node) {
            self.metadata = None;
        }
        for topics in self.partitions.values_mut() {
            for primaries in topics.values_mut() {
                for primary in primaries.iter_mut().filter(|p| **p == node) {
                    *primary = NODE_UNKNOWN;
                }
            }
        }
    }

    /// Every known node's address, by index.
    pub(crate) fn addresses(&self) -> impl Iterator<Item = &str> {
        self.nodes.iter().flatten().map(String::as_str)
    }

    /// Every known node with its index (a cluster may skip indices).
    pub(crate) fn indexed_addresses(&self) -> impl Iterator<Item = (u8, &str)> {
        let known = self.nodes.iter().enumerate();
        known.filter_map(|(node, address)| Some((node as u8, address.as_deref()?)))
    }
}

/// `advertised` with an unspecified IP (`0.0.0.0`, `::`) replaced by the host of `reached`.
pub(crate) fn resolve(advertised: &str, reached: &str) -> String {
    let Ok(parsed) = advertised.parse::<std::net::SocketAddr>() else {
        return advertised.to_string();
    };
    if !parsed.ip().is_unspecified() {
        return advertised.to_string();
    }
    let host = reached.rsplit_once(':').map_or(reached, |(host, _)| host);
    format!("{host}:{}", parsed.port())
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_proto::protocol::NodeAddress;

    fn hello(nodes: &[&str]) -> HelloReply {
        HelloReply {
            version: 3,
            shards: 1,
            server: "test".into(),
            shard: 0,
            shard_addresses: Vec::new(),
            cluster: 1,
            node: 0,
            nodes: nodes
                .iter()
                .enumerate()
                .map(|(node, address)| NodeAddress {
                    node: node as u8,
                    address: address.to_string(),
                })
                .collect(),
        }
    }

    const PARTITION: Route<'static> = partition(2);

    const fn partition(partition: u32) -> Route<'static> {
        Route::Partition { stream: "s", topic: "t", partition }
    }

    #[test]
    fn routes_learn_nodes_primaries_and_forget_an_unreachable_node() {
        let mut routes = Routes::default();
        assert_eq!(routes.primary(&Route::Metadata), None);
        routes.learn_nodes(&hello(&["10.0.0.1:7000", "0.0.0.0:7001", "10.0.0.3:7002"]), "h:1");
        assert_eq!(routes.address(1), Some("h:7001"), "an unspecified IP is the host reached");
        assert!(routes.is_cluster());
        routes.learn(&Route::Metadata, 2);
        routes.learn(&PARTITION, 1);
        assert_eq!(routes.primary(&Route::Metadata), Some(2));
        assert_eq!(routes.primary(&PARTITION), Some(1));
        assert_eq!(routes.primary(&partition(0)), None);
        assert_eq!(routes.primary(&Route::Any), None);
        // A description names every partition; an unknown primary is no belief.
        let primaries = [
            PartitionPrimary { primary: 0, view: 1 },
            PartitionPrimary { primary: NODE_UNKNOWN, view: 2 },
            PartitionPrimary { primary: 2, view: 3 },
        ];
        routes.learn_topic("s", "t", 0..3, &primaries);
        assert_eq!(routes.primary(&PARTITION), Some(2));
        assert_eq!(routes.primary(&partition(1)), None);
        routes.forget_node(2);
        assert_eq!((routes.primary(&PARTITION), routes.primary(&Route::Metadata)), (None, None));
        assert_eq!(routes.primary(&partition(0)), Some(0));
        // A partition past any topic's is no belief: the table is indexed by partition.
        routes.learn(&partition(u32::MAX), 1);
        assert_eq!(routes.primary(&partition(u32::MAX)), None);
        assert_eq!(routes.partitions["s"]["t"].len(), 3);
    }

    #[test]
    fn routes_of_a_one_node_cluster_or_an_old_server_route_nothing() {
        let mut routes = Routes::default();
        routes.learn_nodes(&hello(&["127.0.0.1:7070"]), "localhost:7070");
        routes.learn(&Route::Metadata, 0);
        assert!(!routes.is_cluster());
        assert_eq!(routes.primary(&Route::Metadata), None, "the current connection serves all");
        // A version 2 Hello names no nodes and leaves what was learned.
        let mut routes = Routes::default();
        routes.learn_nodes(&hello(&["a:1", "b:2"]), "a:1");
        routes.learn_nodes(&HelloReply { version: 2, nodes: Vec::new(), ..hello(&[]) }, "a:1");
        assert_eq!(routes.addresses().count(), 2);
        // A primary the client has no address for is no belief either.
        routes.learn(&Route::Metadata, 7);
        assert_eq!(routes.primary(&Route::Metadata), None);
    }
}
