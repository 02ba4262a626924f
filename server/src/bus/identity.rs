//! What one side of a bus connection states in its handshake, and the comparison that refuses a
//! peer of another cluster, shard layout or node list by name.
//!
//! Pure values and checks: no socket is touched here.

use shoal_proto::wire::{HANDSHAKE_FLAG_FORMED, Handshake, HandshakeRefused, Header};

/// A shard's identity on the bus.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusIdentity {
    /// The cluster id.
    pub cluster: u64,
    /// This node's index.
    pub node: u8,
    /// The cluster's founding nodes (`[cluster] nodes`, identical on every node): a peer that
    /// states another count was started with another node list.
    pub founders: u8,
    /// Member slots: every node index, founding or added later, is below it.
    pub slots: u8,
    /// This shard's index (a connection joins the same shard on both nodes).
    pub shard: u32,
    /// Shards per node (the same on every node).
    pub shard_count: u32,
    /// Random per process start: a peer tells a restart from a reconnect by it.
    pub incarnation: u64,
}

impl BusIdentity {
    /// The handshake header this side sends, saying whether this node holds the cluster's state
    /// (`formed`) or is still deciding whether the cluster is new.
    pub fn handshake(&self, formed: bool) -> Header {
        let fields = Handshake {
            shard: self.shard,
            shard_count: self.shard_count,
            node_count: self.founders,
            flags: if formed { HANDSHAKE_FLAG_FORMED } else { 0 },
            incarnation: self.incarnation,
        };
        Header::handshake(self.cluster, self.node, fields)
    }

    /// The refusal this side sends, with its own identity and `reason`.
    pub fn refusal(&self, reason: &str) -> (Header, Vec<u8>) {
        let fields = HandshakeRefused {
            shard: self.shard,
            shard_count: self.shard_count,
            node_count: self.founders,
        };
        let reason = reason.as_bytes()
            [..reason.len().min(shoal_proto::wire::HANDSHAKE_REASON_BYTES_MAX)]
            .to_vec();
        (Header::handshake_refused(self.cluster, self.node, fields, &reason), reason)
    }

    /// Checks a peer's handshake `header`, expected from node `expected` (`None`: any node
    /// that dials this one, which must have a lower index). Returns who the peer is, or why it is
    /// refused, naming both values.
    pub fn check(&self, header: &Header, expected: Option<u8>) -> Result<Peer, String> {
        let Some(theirs) = header.as_handshake() else {
            return Err(format!("the first frame is a {:?}, not a Handshake", header.command));
        };
        if header.cluster != self.cluster {
            return Err(format!(
                "cluster id {} is not this node's {}",
                header.cluster, self.cluster
            ));
        }
        if theirs.node_count != self.founders {
            return Err(format!(
                "a cluster founded by {} nodes is not this node's {}",
                theirs.node_count, self.founders
            ));
        }
        if theirs.shard_count != self.shard_count {
            return Err(format!(
                "shard count {} is not this node's {}",
                theirs.shard_count, self.shard_count
            ));
        }
        if theirs.shard != self.shard {
            return Err(format!("shard {} is not this port's shard {}", theirs.shard, self.shard));
        }
        let node = header.replica;
        match expected {
            Some(expected) if node != expected => {
                return Err(format!("node {node} answered where node {expected} was expected"));
            }
            None if node >= self.node || node >= self.slots => {
                return Err(format!(
                    "node {node} may not dial node {} (the lower index dials the higher)",
                    self.node
                ));
            }
            _ => {}
        }
        Ok(Peer {
            node,
            incarnation: theirs.incarnation,
            formed: theirs.flags & HANDSHAKE_FLAG_FORMED != 0,
        })
    }
}

/// A peer as its handshake states it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    pub node: u8,
    pub incarnation: u64,
    /// It holds the cluster's state (see [`BusIdentity::handshake`]).
    pub formed: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity(node: u8) -> BusIdentity {
        BusIdentity {
            cluster: 7,
            node,
            founders: 3,
            slots: 32,
            shard: 1,
            shard_count: 2,
            incarnation: 9,
        }
    }

    #[test]
    fn a_matching_handshake_is_accepted_with_its_node() {
        let header = identity(0).handshake(true);
        let peer = Peer { node: 0, incarnation: 9, formed: true };
        assert_eq!(identity(2).check(&header, None), Ok(peer));
        let deciding = Peer { node: 1, incarnation: 9, formed: false };
        assert_eq!(identity(2).check(&identity(1).handshake(false), Some(1)), Ok(deciding));
    }

    #[test]
    fn every_mismatch_is_refused_naming_both_values() {
        let ours = identity(2);
        let cases = [
            (BusIdentity { cluster: 8, ..identity(0) }, "cluster id 8 is not this node's 7"),
            (BusIdentity { founders: 5, ..identity(0) }, "a cluster founded by 5 nodes is not"),
            (BusIdentity { shard_count: 4, ..identity(0) }, "shard count 4 is not this node's 2"),
            (BusIdentity { shard: 0, ..identity(0) }, "shard 0 is not this port's shard 1"),
        ];
        for (theirs, reason) in cases {
            let error = ours.check(&theirs.handshake(true), None).unwrap_err();
            assert!(error.starts_with(reason), "{error}");
        }
        let higher = ours.check(&identity(2).handshake(true), None).unwrap_err();
        assert!(higher.contains("may not dial"), "{higher}");
        let wrong = identity(0).check(&identity(2).handshake(true), Some(1)).unwrap_err();
        assert!(wrong.contains("node 2 answered where node 1"), "{wrong}");
    }
}
