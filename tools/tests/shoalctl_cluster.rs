//! `shoalctl` against three real `shoal` processes forming a cluster, given one node's address
//! only: admin commands reach the metadata group's primary (redirected), `produce` sends each
//! partition's lines to that partition's primary, `consume` reads them back from it, and
//! `status` shows every node and each group's view, primary and replica states.
//!
//! Every child process runs under a deadline and is killed past it; the cluster is killed when
//! it drops. Nothing sleeps for synchronisation: a command the cluster refuses while it still
//! elects its primaries is run again, bounded.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use shoal_testkit::{ClusterPlan, ShoalCluster};

/// How long any child process, or the cluster's start, may take.
const DEADLINE: Duration = Duration::from_secs(60);

fn start_cluster(root: &Path) -> ShoalCluster {
    let shoalctl = Path::new(env!("CARGO_BIN_EXE_shoalctl"));
    let binary = shoal_testkit::shoal_binary_beside(shoalctl).unwrap_or_else(|e| panic!("{e}"));
    let plan = ClusterPlan::small(binary, root, 3, DEADLINE);
    ShoalCluster::start(plan).unwrap_or_else(|error| panic!("{error}"))
}

/// Runs `shoalctl --server SEED ARGS` with `stdin`, under the deadline.
fn shoalctl(seed: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shoalctl"))
        .args(["--server", seed])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoalctl runs");
    let mut input = child.stdin.take().expect("piped stdin");
    let stdin = stdin.to_vec();
    std::thread::spawn(move || {
        use std::io::Write;
        let _ = input.write_all(&stdin);
    });
    shoal_testkit::output_within(child, DEADLINE, "shoalctl")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs an admin command until it succeeds, or fails with `done_already` (a retry of a create
/// that took effect), within the deadline: a cluster answers `TransientNotAccepted` while it
/// still elects the metadata group's primary.
fn admin(seed: &str, args: &[&str], done_already: &str) {
    let started = Instant::now();
    loop {
        let output = shoalctl(seed, args, b"");
        let stderr = text(&output.stderr);
        if output.status.success() || stderr.contains(done_already) {
            return;
        }
        assert!(started.elapsed() < DEADLINE, "{args:?}: {stderr}");
        std::thread::yield_now();
    }
}

#[test]
fn shoalctl_given_one_node_of_a_cluster_follows_the_primaries() {
    let root = tempfile::tempdir().unwrap();
    let cluster = start_cluster(root.path());
    let seed = cluster.clients[2].as_str();
    admin(seed, &["stream", "create", "s"], "StreamExists");
    let create = ["topic", "create", "s", "t", "--partitions", "3", "--durability", "persisted"];
    admin(seed, &create, "TopicExists");

    let lines: Vec<String> = (0..60).map(|n| format!("line-{n}")).collect();
    let produced = shoalctl(seed, &["produce", "s", "t"], lines.join("\n").as_bytes());
    assert!(produced.status.success(), "{}", text(&produced.stderr));
    let acks: Vec<(u32, u64)> = text(&produced.stdout)
        .lines()
        .map(|line| {
            let (partition, offset) = line.split_once(' ').expect("PARTITION OFFSET");
            (partition.parse().unwrap(), offset.parse().unwrap())
        })
        .collect();
    assert_eq!(acks.len(), lines.len(), "every line acknowledged");

    // Each partition, read from its primary, holds its lines in the order they were sent.
    for partition in 0..3u32 {
        let expected: Vec<&str> = acks
            .iter()
            .zip(&lines)
            .filter(|((p, _), _)| *p == partition)
            .map(|(_, line)| line.as_str())
            .collect();
        let count = expected.len().to_string();
        let p = partition.to_string();
        let args = ["consume", "s", "t", "--partition", &p, "--from", "first", "--count", &count];
        let consumed = shoalctl(seed, &args, b"");
        assert!(consumed.status.success(), "{}", text(&consumed.stderr));
        assert_eq!(text(&consumed.stdout).lines().collect::<Vec<_>>(), expected);
    }

    let status = text(&shoalctl(seed, &["status"], b"").stdout);
    assert_eq!(status.lines().filter(|l| l.trim_end().ends_with(" up")).count(), 3, "{status}");
    let metadata = status.lines().find(|l| l.contains("metadata")).expect(&status);
    assert!(metadata.contains("primary"), "the metadata primary reports its replicas: {status}");
    for partition in 0..3 {
        let name = format!("s/t/{partition}");
        let row = status.lines().find(|l| l.contains(&name)).unwrap_or_else(|| panic!("{status}"));
        assert!(row.contains("0:normal 1:normal 2:normal"), "{status}");
    }
}

/// `cluster add-node` records a node and prints how to start it; once started it shows in
/// `cluster status` as an added node and a learner of the metadata group; `cluster remove-node`
/// takes it out again, and with nothing placed on it the table shows it removed.
#[test]
fn shoalctl_adds_a_node_and_removes_it() {
    let root = tempfile::tempdir().unwrap();
    let mut cluster = start_cluster(root.path());
    let seed = cluster.clients[0].clone();
    let node = cluster.reserve_node().unwrap_or_else(|error| panic!("{error}"));
    let index = usize::from(node);
    let (bus, client) = (cluster.buses[index].clone(), cluster.clients[index].clone());
    let added = shoalctl(&seed, &["cluster", "add-node", "--bus", &bus, "--client", &client], b"");
    assert!(added.status.success(), "{}", text(&added.stderr));
    assert!(text(&added.stdout).contains("added node 3: start it with --cluster-node 3"));
    cluster.start_added(node).unwrap_or_else(|error| panic!("{error}"));

    let row_of = |wanted: &[&str]| {
        let started = Instant::now();
        loop {
            let status = text(&shoalctl(&seed, &["cluster", "status"], b"").stdout);
            let row = status.lines().find(|line| line.starts_with("3 ")).map(str::to_string);
            if row.as_ref().is_some_and(|row| wanted.iter().all(|word| row.contains(word))) {
                return;
            }
            assert!(started.elapsed() < DEADLINE, "no {wanted:?} row for node 3: {status}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    row_of(&["added", "up", "learner"]);
    // The metadata group's primary moved when node 3 joined it (a new epoch): a first try may
    // be redirected, and a retry of one that took effect finds node 3 leaving already.
    admin(&seed, &["cluster", "remove-node", "3"], "is not an active node");
    row_of(&["removed", "none", " 0"]);
}
