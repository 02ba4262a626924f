//! The real `shoal` binary, started as a user would: it announces readiness on one stdout line
//! once recovery is done and the listener is bound, accepts TCP connections, refuses a second
//! server on its data directory, refuses a changed shard count, and shuts down cleanly (exit 0)
//! on SIGTERM, after which it starts again on the same directory.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running server, killed if the test ends early.
struct Server {
    child: Option<Child>,
    address: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn command(dir: &Path, shards: u32) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shoal"));
    command.args(["--data-dir"]).arg(dir).args([
        "--listen",
        "127.0.0.1:0",
        "--shards",
        &shards.to_string(),
        "--profile",
        "small",
        "--cpus",
        "none",
    ]);
    command
}

/// `Command::output` bounded by a deadline: a server that should refuse to start but hangs
/// fails the test instead of stalling it.
trait OutputWithin {
    fn output_within(&mut self) -> std::process::Output;
}

impl OutputWithin for Command {
    fn output_within(&mut self) -> std::process::Output {
        let child = self.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("runs");
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(output) => output.expect("output"),
            Err(_) => {
                // SAFETY: kill takes a pid and a signal number; no memory is involved.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                panic!("shoal did not exit within 60 s");
            }
        }
    }
}

fn start(dir: &Path, shards: u32) -> Server {
    start_command(command(dir, shards))
}

/// Starts `command` and waits (at most 60 s) for its readiness line.
fn start_command(mut command: Command) -> Server {
    let mut child =
        command.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("shoal starts");
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(Duration::from_secs(60)).expect("a readiness line within 60 s");
    let address = line
        .trim()
        .strip_prefix("{\"ready\":true,\"native\":\"")
        .and_then(|rest| rest.strip_suffix("\"}"))
        .unwrap_or_else(|| panic!("not a readiness line: {line:?}"))
        .to_string();
    Server { child: Some(child), address }
}

fn terminate(mut server: Server) -> i32 {
    let mut child = server.child.take().expect("running");
    // SAFETY: kill takes a pid and a signal number; no memory is involved.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(Duration::from_secs(60)).expect("exits within 60 s").unwrap();
    status.code().expect("exited, not killed")
}

#[test]
fn starts_serves_refuses_a_second_server_and_stops_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 2);
    TcpStream::connect(&server.address).expect("the native listener accepts");
    let second = command(dir.path(), 2).output_within();
    assert!(!second.status.success());
    assert!(String::from_utf8_lossy(&second.stderr).contains("is locked"), "{second:?}");
    assert_eq!(terminate(server), 0, "graceful shutdown exits 0");
    let again = start(dir.path(), 2);
    assert_eq!(terminate(again), 0, "restarts on its own directory");
}

#[test]
fn a_changed_shard_count_is_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(terminate(start(dir.path(), 1)), 0);
    let output = command(dir.path(), 2).output_within();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("shard count"), "{stderr}");
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
    let server = start_command(pinned);
    assert_eq!(terminate(server), 0, "pinned to CPU 0 it starts and stops");
}
