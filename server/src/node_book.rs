//! The cluster's address book (`docs/cluster.md`, "Adding and removing nodes"): the founding
//! nodes are `[cluster] nodes`, the same on every node and never changed; the nodes added since,
//! and the nodes being removed, are the catalog's, so every node learns them from the metadata
//! log. This module owns the book's records, the rules for adding and removing a node, and the
//! choice of where a replica goes: the `r` active nodes a new partition is placed on, and the
//! node that takes a leaving node's replica.
//!
//! Pure values, applied deterministically: it never reads the node's own configuration beyond
//! what a caller hands it (the founding list is identical everywhere), a clock or a socket.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use shoal_proto::protocol::{NODE_ADDRESS_BYTES_MAX, ProtocolError, Reader, Writer};
use shoal_proto::wire::Membership;

use crate::config::{ClusterConfig, ClusterNode, NODES_MAX};

/// Bytes of one rack name at most (as `[cluster] nodes` allows).
const RACK_BYTES_MAX: usize = 64;

/// The nodes the catalog knows beyond the founding ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeBook {
    /// Nodes added after the cluster formed, by index (every one at or past the founders).
    pub added: BTreeMap<u8, ClusterNode>,
    /// Nodes being removed, a bit per index: nothing new is placed there, and every replica
    /// they hold (and their seat in the metadata group) moves to the other nodes.
    pub leaving: u32,
}

impl NodeBook {
    /// Every node of the cluster, a bit per index: the `founders` and the added ones.
    pub fn known(&self, founders: u8) -> u32 {
        let founding = Membership::first(founders, founders).voters;
        self.added.keys().fold(founding, |bits, &node| bits | (1 << node))
    }

    /// Every node this node can name: the cluster's, and itself (an added node knows itself
    /// before its catalog does).
    pub fn known_by(&self, cluster: &ClusterConfig) -> u32 {
        self.known(cluster.founders()) | (1 << cluster.node)
    }

    /// The nodes new replicas may go to: every known node but the leaving ones.
    pub fn active(&self, founders: u8) -> u32 {
        self.known(founders) & !self.leaving
    }

    /// Node `node`'s entry: from the founding list or this node's own configuration (an added
    /// node knows itself before its catalog does), else from the book.
    pub fn entry<'a>(&'a self, cluster: &'a ClusterConfig, node: u8) -> Option<&'a ClusterNode> {
        cluster.entry(node).or_else(|| self.added.get(&node))
    }

    /// Node `node`'s native client address.
    pub fn client_address(&self, cluster: &ClusterConfig, node: u8) -> Option<SocketAddr> {
        self.entry(cluster, node).map(|entry| entry.client)
    }

    /// Node `node`'s advertised Kafka address.
    pub fn kafka_address(&self, cluster: &ClusterConfig, node: u8) -> Option<SocketAddr> {
        self.entry(cluster, node).and_then(|entry| entry.kafka)
    }

    /// Node `node`'s bus address for shard `shard` (its base port plus the shard).
    pub fn bus_address(&self, cluster: &ClusterConfig, node: u8, shard: u32) -> Option<SocketAddr> {
        self.entry(cluster, node)?.bus_address(shard)
    }

    /// Whether node `node` may be added with `address` to a cluster founded by `founders`.
    pub fn check_add(&self, node: u8, address: &ClusterNode, founders: u8) -> Result<(), String> {
        if usize::from(node) >= NODES_MAX {
            return Err(format!(
                "node {node}: a cluster's nodes are numbered 0 to {}",
                NODES_MAX - 1
            ));
        }
        if node < founders {
            return Err(format!("node {node} is one of the {founders} founding nodes"));
        }
        if self.added.contains_key(&node) {
            return Err(format!(
                "node {node} is in the cluster already: a new node takes a new index"
            ));
        }
        if address.bus.port() == 0 || address.client.port() == 0 {
            return Err("port 0: peers and clients must know the node's ports".into());
        }
        if let Some((other, _)) = self
            .added
            .iter()
            .find(|(_, other)| other.bus == address.bus || other.client == address.client)
        {
            return Err(format!("node {other} has that bus or client address"));
        }
        Ok(())
    }

    /// Whether node `node` may start leaving (its replicas going to `replacement`, or spread
    /// over the other active nodes) on a cluster founded by `founders`.
    pub fn check_remove(
        &self,
        node: u8,
        replacement: Option<u8>,
        founders: u8,
    ) -> Result<(), String> {
        let active = self.active(founders);
        let is_active = |n: u8| usize::from(n) < NODES_MAX && active & (1 << n) != 0;
        if !is_active(node) {
            return Err(format!("node {node} is not an active node of the cluster"));
        }
        if let Some(replacement) = replacement
            && (replacement == node || !is_active(replacement))
        {
            return Err(format!(
                "node {replacement} cannot take node {node}'s place: name another active node"
            ));
        }
        if active & !(1 << node) == 0 {
            return Err(format!("node {node} is the last active node"));
        }
        Ok(())
    }

    /// Appends the book to a snapshot: the added nodes, then the leaving bits.
    pub fn write(&self, w: &mut Writer) {
        w.u32(self.added.len() as u32);
        for (node, entry) in &self.added {
            w.u8(*node);
            write_node(w, entry);
        }
        w.u32(self.leaving);
    }

    /// Reads a book [`NodeBook::write`] wrote; every count and text bounded before use.
    pub fn read(r: &mut Reader<'_>) -> Result<NodeBook, ProtocolError> {
        let mut added = BTreeMap::new();
        // The smallest entry: an index and four empty texts.
        for _ in 0..r.count("added nodes", 1 + 2 * 4)? {
            let node = r.u8("node")?;
            if usize::from(node) >= NODES_MAX {
                return Err(invalid(
                    "node",
                    format!("{node}: nodes are numbered below {NODES_MAX}"),
                ));
            }
            added.insert(node, read_node(r)?);
        }
        let leaving = r.u32("leaving")?;
        Ok(NodeBook { added, leaving })
    }
}

/// Writes one node's addresses as texts (a metadata command's or a snapshot's).
pub fn write_node(w: &mut Writer, entry: &ClusterNode) {
    w.str(&entry.bus.to_string()).str(&entry.client.to_string());
    w.str(&entry.kafka.map(|k| k.to_string()).unwrap_or_default());
    w.str(entry.rack.as_deref().unwrap_or_default());
}

/// Reads what [`write_node`] wrote.
pub fn read_node(r: &mut Reader<'_>) -> Result<ClusterNode, ProtocolError> {
    let bus = parse_address("bus", &r.str("bus", NODE_ADDRESS_BYTES_MAX)?)?;
    let client = parse_address("client", &r.str("client", NODE_ADDRESS_BYTES_MAX)?)?;
    let kafka = r.str("kafka", NODE_ADDRESS_BYTES_MAX)?;
    let kafka = if kafka.is_empty() { None } else { Some(parse_address("kafka", &kafka)?) };
    let rack = r.str("rack", RACK_BYTES_MAX)?;
    let rack = (!rack.is_empty()).then_some(rack);
    Ok(ClusterNode { bus, client, kafka, rack })
}

/// An address text, or an error naming `field`.
pub fn parse_address(field: &'static str, text: &str) -> Result<SocketAddr, ProtocolError> {
    text.parse().map_err(|_| invalid(field, format!("{text:?} is not IP:PORT")))
}

fn invalid(field: &'static str, reason: String) -> ProtocolError {
    ProtocolError::Invalid { field, reason }
}

/// The voters of a new group `group` with `factor` replicas over the `active` nodes: `factor`
/// consecutive active nodes (in index order, wrapping) from the `group mod n`-th of the n
/// active ones, so consecutive groups spread their replicas, and their homes, evenly. On a
/// cluster that never changed (nodes 0 to n-1 active) this is `factor` nodes from `group mod n`.
pub fn voters_for(group: u64, factor: u8, active: u32) -> u32 {
    let count = active.count_ones();
    assert!(u32::from(factor) <= count, "replication factor {factor} on {count} active nodes");
    let nth = |i: u64| {
        let index = ((group + i) % u64::from(count)) as usize;
        (0..32u8).filter(|&n| active & (1 << n) != 0).nth(index).expect("below the count")
    };
    (0..u64::from(factor)).fold(0, |voters, i| voters | (1 << nth(i)))
}

/// The node that takes a leaving replica of a group whose voters will be `voters`: the
/// `preferred` one when it is a candidate, otherwise the candidate holding the fewest replicas
/// (`load`, by node), then the lowest index. Candidates are the `active` nodes not among the
/// voters. `None`: no node can.
pub fn replacement_for(
    voters: u32,
    active: u32,
    load: &[u32; 32],
    preferred: Option<u8>,
) -> Option<u8> {
    let candidates = active & !voters;
    if let Some(node) = preferred.filter(|&n| n < 32 && candidates & (1 << n) != 0) {
        return Some(node);
    }
    (0..32u8).filter(|&n| candidates & (1 << n) != 0).min_by_key(|&n| (load[usize::from(n)], n))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(port: u16) -> ClusterNode {
        ClusterNode {
            bus: format!("127.0.0.1:{port}").parse().unwrap(),
            client: format!("127.0.0.1:{}", port + 1).parse().unwrap(),
            kafka: None,
            rack: Some("r2".into()),
        }
    }

    #[test]
    fn placement_on_an_unchanged_cluster_is_consecutive_nodes_from_the_group() {
        assert_eq!(voters_for(4, 3, Membership::first(3, 3).voters), 0b111);
        assert_eq!(voters_for(4, 1, Membership::first(3, 3).voters), 0b010);
        assert_eq!(voters_for(5, 2, Membership::first(3, 3).voters), 0b101);
        // Node 0 leaving, node 3 added: the active ones are 1, 2 and 3.
        let active = 0b1110;
        assert_eq!(voters_for(3, 1, active), 0b0010);
        assert_eq!(voters_for(5, 2, active), 0b1010);
        assert_eq!(voters_for(0, 3, active), 0b1110);
    }

    #[test]
    fn a_leaving_replica_goes_to_the_preferred_node_or_the_least_loaded() {
        let mut load = [0u32; 32];
        load[3] = 5;
        load[4] = 1;
        let active = 0b11110;
        assert_eq!(replacement_for(0b0110, active, &load, None), Some(4));
        assert_eq!(replacement_for(0b0110, active, &load, Some(3)), Some(3));
        // The preferred node holds the group already: the least loaded other one.
        assert_eq!(replacement_for(0b1110, active, &load, Some(3)), Some(4));
        assert_eq!(replacement_for(0b11110, active, &load, None), None);
    }

    #[test]
    fn adding_and_removing_follow_the_rules() {
        let mut book = NodeBook::default();
        assert!(book.check_add(1, &node(7000), 3).unwrap_err().contains("founding"));
        assert!(book.check_add(32, &node(7000), 3).is_err());
        book.check_add(3, &node(7000), 3).unwrap();
        book.added.insert(3, node(7000));
        assert!(book.check_add(3, &node(7100), 3).unwrap_err().contains("already"));
        assert!(book.check_add(4, &node(7000), 3).unwrap_err().contains("node 3 has"));
        assert_eq!(book.known(3), 0b1111);

        book.check_remove(0, Some(3), 3).unwrap();
        assert!(book.check_remove(0, Some(0), 3).is_err());
        assert!(book.check_remove(5, None, 3).is_err());
        book.leaving = 0b0001;
        assert_eq!(book.active(3), 0b1110);
        assert!(book.check_remove(0, None, 3).unwrap_err().contains("not an active"));
        assert!(book.check_remove(1, Some(0), 3).is_err(), "a leaving node takes nothing");
        let alone = NodeBook { leaving: 0b110, ..NodeBook::default() };
        assert!(alone.check_remove(0, None, 3).unwrap_err().contains("last"));
    }

    #[test]
    fn a_book_round_trips_and_hostile_bytes_are_refused() {
        let mut book = NodeBook::default();
        book.added.insert(3, node(7000));
        book.added
            .insert(5, ClusterNode { kafka: Some("[::1]:9092".parse().unwrap()), ..node(7200) });
        book.leaving = 0b1001;
        let mut w = Writer::new();
        book.write(&mut w);
        let bytes = w.finish();
        let mut r = Reader::new(&bytes);
        assert_eq!(NodeBook::read(&mut r), Ok(book));
        r.end().unwrap();
        for cut in 0..bytes.len() {
            assert!(NodeBook::read(&mut Reader::new(&bytes[..cut])).is_err(), "cut at {cut}");
        }
        let mut w = Writer::new();
        w.u32(1).u8(40);
        write_node(&mut w, &node(7000));
        w.u32(0);
        assert!(NodeBook::read(&mut Reader::new(&w.finish())).is_err(), "node 40");
    }
}
