//! Forming a cluster, or rejoining one, from an empty data directory (DESIGN.md §8): shard 0 of
//! a node whose directory holds no metadata group cannot tell on its own whether the cluster is
//! new or whether it lost a disk its peers still count on. It asks the peers: every bus
//! handshake says whether its sender holds the cluster's state (`formed`).
//!
//! - Every peer says "not formed": nobody holds anything, the cluster is new. The node forms it:
//!   the metadata group starts normal in view 0, as every other node's does.
//! - Some peer says "formed": the node rejoins. Whatever it acknowledged before is lost, so it must
//!   never lead view 0 of a group that has moved on, nor vouch for any op: every group that may
//!   have existed before (those below the *rejoin floor*) starts `Recovering` with an empty log
//!   and waits for a peer's StartView (`replication`'s `NodeConfig::rejoin_floor`). The floor is
//!   unknown (everything) until the metadata group is normal again and the catalog has applied
//!   every op its StartView held; it is then the catalog's next group id: groups created after
//!   that are new to every node and start as usual. A node that votes in no group then (a node
//!   added to the cluster, holding nothing yet) needs no floor at all: it never acknowledged
//!   anything a quorum counted.
//! - Until every peer has answered, it waits (a new cluster forms only with every node up).
//!
//! - The floor is needed only until each group below it has been brought back: once the replica
//!   has been normal in a view after the rejoin, the ops it may have forgotten are settled by
//!   that view, and everything it acknowledged since is on its disk. A floor kept longer would
//!   keep its replicas out of every later view change after a restart (they wait for a
//!   StartView), which a group missing another node needs them for. So once every shard has
//!   seen every group below the floor normal (or removed), shard 0 records `formed` again.
//!
//! What was decided is kept in the data directory's `formation` file (written whole and synced
//! before anything it allows happens): `formed`, `rejoining`, or `rejoined FLOOR`. `main` reads it
//! before any shard opens, so a node restarted in the middle of a rejoin keeps waiting for its
//! peers. This module never creates partition groups (the catalog does) and never decides for a
//! node that has its state.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::atomic::Ordering;

use shoal_proto::checksum;
use shoal_replication::Status;

use super::state::ShardState;
use crate::metadata::METADATA_GROUP;

/// How often a shard checks whether its groups below the rejoin floor are back (a scan of its
/// groups): once a second.
const SETTLE_CHECK_TICKS: u64 = 100;

/// The file in the data directory that records how the node joined its cluster: its words, then
/// the CRC-32C of them (`crc32c:` and eight hex digits), since a damaged rejoin floor would
/// let replicas that may have forgotten acknowledgements vote.
pub const FORMATION_FILE: &str = "formation";

/// The longest `formation` file read: its words are a few dozen bytes.
const FILE_BYTES_MAX: u64 = 256;

/// What starts the checksum word of the `formation` file.
const CHECKSUM_PREFIX: &str = "crc32c:";

/// Where shard 0 stands in forming or rejoining its cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Formation {
    /// The node holds the cluster's state (or is a one-node cluster).
    Formed,
    /// An empty data directory, waiting for every peer's handshake.
    Deciding,
    /// Rejoined: waiting for the metadata group to be normal (`None`) and then for the catalog
    /// to apply every op up to the head it was brought back with (`Some(op)`).
    Rejoining { head_op: Option<u64> },
}

/// What the `formation` file of `data_dir` says: `None` when there is none; otherwise whether the
/// node holds the cluster's state (always, once the file exists) and its rejoin floor (0: it
/// formed the cluster; `u64::MAX`: a rejoin whose floor is not known yet).
pub fn read(data_dir: &Path) -> Result<Option<u64>, String> {
    let path = data_dir.join(FORMATION_FILE);
    let mut text = String::new();
    let opened = std::fs::File::open(&path);
    let read = opened.and_then(|file| file.take(FILE_BYTES_MAX + 1).read_to_string(&mut text));
    match read {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(format!("cannot read {}: {error}", path.display())),
    }
    if text.len() as u64 > FILE_BYTES_MAX {
        return Err(format!("{}: longer than {FILE_BYTES_MAX} bytes", path.display()));
    }
    let mut words: Vec<&str> = text.split_whitespace().collect();
    // The checksum of the words before it (files written before it had none: taken as they are).
    if let Some(sum) = words.last().and_then(|word| word.strip_prefix(CHECKSUM_PREFIX)) {
        words.pop();
        let expected = format!("{:08x}", checksum::crc32c(words.join(" ").as_bytes()));
        if sum != expected {
            return Err(format!(
                "{}: {text:?} fails its checksum (damaged): refusing to guess the rejoin floor",
                path.display()
            ));
        }
    }
    match words.as_slice() {
        ["formed"] => Ok(Some(0)),
        ["rejoining"] => Ok(Some(u64::MAX)),
        ["rejoined", floor] => floor
            .parse()
            .map(Some)
            .map_err(|_| format!("{}: {floor:?} is not a group id", path.display())),
        _ => Err(format!(
            "{}: {text:?} is not \"formed\", \"rejoining\" or \"rejoined GROUP\"",
            path.display()
        )),
    }
}

/// Replaces the `formation` file of `data_dir` with `text`, durably: a temporary file, synced,
/// renamed into place, and the directory synced. A one-time step of a node's life, so it runs on
/// the shard's thread with plain blocking calls.
fn write(data_dir: &Path, text: &str) -> std::io::Result<()> {
    let temporary = data_dir.join(format!("{FORMATION_FILE}.new"));
    let mut file = std::fs::File::create(&temporary)?;
    let sum = checksum::crc32c(text.as_bytes());
    file.write_all(format!("{text} {CHECKSUM_PREFIX}{sum:08x}\n").as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, data_dir.join(FORMATION_FILE))?;
    std::fs::File::open(data_dir)?.sync_all()
}

impl ShardState {
    /// Shard 0, once per tick until formed: decides between forming and rejoining as the
    /// peers' handshakes allow, and follows a rejoin until its floor is known.
    pub(super) async fn advance_formation(&mut self) {
        match self.formation {
            Formation::Formed => self.lift_rejoin_floor(),
            Formation::Deciding => self.decide_formation().await,
            Formation::Rejoining { head_op } => self.follow_rejoin(head_op),
        }
    }

    async fn decide_formation(&mut self) {
        let own = self.node.node_index();
        let founders = self.config.cluster.founders();
        // A new cluster is its founding nodes; a node added later only ever joins one.
        let peers: Vec<Option<bool>> = (0..self.bus.peers.len() as u8)
            .filter(|&peer| {
                peer != own && (peer < founders || self.bus.peers[usize::from(peer)].known.get())
            })
            .map(|peer| self.bus.peers[peer as usize].formed.get())
            .collect();
        // Canary: the fresh-disk rule broken, a node with an empty directory forms a new cluster
        // at once, whatever its peers hold.
        let canary = cfg!(feature = "canary-fresh-disk-normal");
        let rejoin = peers.contains(&Some(true)) && !canary;
        let all_new = own < founders && peers.iter().all(|formed| *formed == Some(false));
        if !rejoin && !all_new && !canary {
            return;
        }
        let data_dir = self.config.data_dir.clone();
        let (text, floor) = if rejoin { ("rejoining", u64::MAX) } else { ("formed", 0) };
        if let Err(error) = write(&data_dir, text) {
            tracing::error!(%error, "cannot record how this node joins its cluster: retrying");
            return;
        }
        self.rejoin_floor.store(floor, Ordering::SeqCst);
        self.node.set_rejoin_floor(floor);
        if let Err(error) = self.create_metadata_group().await {
            tracing::error!(%error, "cannot create the metadata group: retrying");
            return;
        }
        self.formed.store(true, Ordering::SeqCst);
        if rejoin {
            tracing::warn!(
                "this node's data directory is empty but its cluster exists: it rejoins, \
                 recovering every group from its peers"
            );
            self.formation = Formation::Rejoining { head_op: None };
        } else {
            tracing::info!("every node's data directory is empty: this node forms the cluster");
            self.formation = Formation::Formed;
        }
    }

    /// Learns the rejoin floor: the head op the metadata group came back with, then the
    /// catalog's next group id once it has applied that op.
    fn follow_rejoin(&mut self, head_op: Option<u64>) {
        let Some(replica) = self.node.replica(METADATA_GROUP) else { return };
        let Some(head_op) = head_op else {
            if replica.status() == Status::Normal {
                self.formation = Formation::Rejoining { head_op: Some(replica.op()) };
            }
            return;
        };
        let Some(metadata) = &self.metadata else { return };
        let catalog = &metadata.state.catalog;
        if catalog.applied_op < head_op {
            return;
        }
        // A node that votes nowhere — a node added to the cluster, holding nothing yet but as a
        // learner — never acknowledged anything a quorum counted: it needs no floor, and its
        // groups restart as anyone's do (a floor would keep its restarted replicas out of view
        // changes, which a group missing another node needs them for).
        let (own, founders) = (self.config.cluster.node, self.config.cluster.founders());
        let votes = replica.config().members.voters & (1 << own) != 0
            || catalog.places().any(|place| {
                let voters = place.members.voters | place.target.voters;
                voters & (1 << own) != 0 || (place.members.is_empty() && own < founders)
            });
        let floor = if votes { catalog.next_group } else { 0 };
        let text = if votes { format!("rejoined {floor}") } else { "formed".to_string() };
        if let Err(error) = write(&self.config.data_dir, &text) {
            tracing::error!(%error, "cannot record the rejoin floor: retrying");
            return;
        }
        self.rejoin_floor.store(floor, Ordering::SeqCst);
        self.node.set_rejoin_floor(floor);
        if votes {
            tracing::info!(floor, "rejoined the cluster: groups from {floor} on start as new");
        } else {
            tracing::info!("joined the cluster voting nowhere: no group needs a rejoin floor");
        }
        self.formation = Formation::Formed;
    }

    /// Every shard, every [`SETTLE_CHECK_TICKS`] while the node has a rejoin floor: counts the
    /// shard settled once every group below the floor that it holds, or the newest catalog
    /// places on it, is normal (brought back by a StartView) or removed.
    pub(super) fn settle_rejoin(&mut self, tick: u64) {
        let floor = self.rejoin_floor.load(Ordering::SeqCst);
        if self.rejoin_settled_here || floor == 0 || floor == u64::MAX {
            return;
        }
        if !tick.is_multiple_of(SETTLE_CHECK_TICKS) {
            return;
        }
        // Only with the newest catalog installed: every group placed here exists by then (the
        // floor was set once shard 0 had applied the catalog it came back with).
        let mut latest = std::sync::Arc::clone(&self.catalog);
        self.published.refresh(&mut latest);
        if latest.applied_op != self.catalog.applied_op {
            return;
        }
        let node = self.config.cluster.node;
        let placed = self.catalog.groups_on(self.index, node);
        let held = self.node.group_ids();
        let groups = held.iter().copied().chain(placed.iter().map(|(place, _)| place.group));
        let settled = groups.filter(|&group| group < floor).all(|group| {
            self.node
                .replica(group)
                .is_some_and(|replica| matches!(replica.status(), Status::Normal | Status::Removed))
        });
        if settled {
            self.rejoin_settled_here = true;
            self.rejoin_settled.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Shard 0, once every shard has settled: records `formed`, lifting the floor.
    fn lift_rejoin_floor(&mut self) {
        let floor = self.rejoin_floor.load(Ordering::SeqCst);
        if floor == 0 || floor == u64::MAX {
            return;
        }
        if self.rejoin_settled.load(Ordering::SeqCst) < self.config.shards as usize {
            return;
        }
        if let Err(error) = write(&self.config.data_dir, "formed") {
            tracing::error!(%error, "cannot lift the rejoin floor: retrying");
            return;
        }
        self.rejoin_floor.store(0, Ordering::SeqCst);
        self.node.set_rejoin_floor(0);
        tracing::info!(floor, "every group this node held before it rejoined is back: no floor");
    }
}

#[cfg(test)]
mod tests {
    use super::{FORMATION_FILE, read, write};

    /// What is written reads back; a damaged word fails the checksum instead of moving the
    /// floor; a file from before the checksum reads as it is; a huge file is refused.
    #[test]
    fn the_formation_file_reads_back_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FORMATION_FILE);
        assert_eq!(read(dir.path()), Ok(None));
        write(dir.path(), "rejoined 42").unwrap();
        assert_eq!(read(dir.path()), Ok(Some(42)));
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("42", "40")).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("checksum"));
        std::fs::write(&path, "rejoined 7\n").unwrap();
        assert_eq!(read(dir.path()), Ok(Some(7)));
        write(dir.path(), "formed").unwrap();
        assert_eq!(read(dir.path()), Ok(Some(0)));
        std::fs::write(&path, vec![b' '; 10_000]).unwrap();
        assert!(read(dir.path()).unwrap_err().contains("longer than"));
    }
}
