//! Helpers shared by the end-to-end tests that run Shoal's real binaries (`server`, `tools`,
//! `benches`): waiting for a child within a deadline and reading the server's readiness line.
//!
//! It owns only these waits; it never starts a binary itself (each crate's tests know their own
//! command lines) and is a dev-dependency only.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Output};
use std::sync::mpsc;
use std::time::Duration;

/// Waits for `child` to exit and collects its output; kills it and panics, naming `what`, if it
/// has not exited within `deadline`.
pub fn output_within(child: Child, deadline: Duration, what: &str) -> Output {
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(deadline) {
        Ok(output) => output.expect("output"),
        Err(_) => {
            // SAFETY: kill takes a pid and a signal number; no memory is involved.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{what} did not exit within {deadline:?}");
        }
    }
}

/// Reads the server's readiness line (`{"ready":true,"native":"ADDR"}`) from its `stdout`
/// within `deadline` and returns the native address.
pub fn ready_address(stdout: ChildStdout, deadline: Duration) -> String {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(deadline).expect("a readiness line in time");
    line.trim()
        .strip_prefix("{\"ready\":true,\"native\":\"")
        .and_then(|rest| rest.strip_suffix("\"}"))
        .unwrap_or_else(|| panic!("not a readiness line: {line:?}"))
        .to_string()
}
