//! The real `shoal` binary, started as a user would: it announces readiness on one stdout line
//! once recovery is done and the listener is bound, accepts TCP connections, refuses a second
//! server on its data directory, refuses a changed shard count, and shuts down cleanly (exit 0)
//! on SIGTERM, after which it starts again on the same directory.

mod common;

use std::net::TcpStream;

use common::{OutputWithin, command, restart, start, start_command, terminate};

#[test]
fn starts_serves_refuses_a_second_server_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 2);
    TcpStream::connect(server.native()).expect("the native listener accepts");
    let second = command(dir.path(), 2).output_within();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("is locked"), "{second:?}");
    assert_eq!(terminate(&mut server), 0, "graceful shutdown exits 0");
    restart(&mut server);
    assert_eq!(terminate(&mut server), 0, "restarts on its own directory");
}

#[test]
fn a_changed_shard_count_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(terminate(&mut start(dir.path(), 1)), 0);
    let output = command(dir.path(), 2).output_within();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("shard count"), "{stderr}");
    assert!(!dir.path().join("shard-1").exists(), "nothing created for the refused shard");
}

#[test]
fn shards_pin_to_the_cpus_given_and_a_wrong_cpu_list_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut pinned = command(dir.path(), 1);
    pinned.args(["--cpus", "0"]);
    let output = command(dir.path(), 2).args(["--cpus", "0"]).output_within();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--cpus names 1 CPUs for 2 shards"), "{stderr}");
    let mut server = start_command(pinned);
    assert_eq!(terminate(&mut server), 0, "pinned to CPU 0 it starts and stops");
}
