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

/// What the server's readiness line announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The native protocol address.
    pub native: String,
    /// The metrics endpoint's address (`None`: the endpoint is off).
    pub metrics: Option<String>,
}

/// Reads the server's readiness line (`{"ready":true,"native":"ADDR","metrics":"ADDR"}`, the
/// metrics field absent when the endpoint is off) from its `stdout` within `deadline`.
pub fn ready(stdout: ChildStdout, deadline: Duration) -> Ready {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx.recv_timeout(deadline).expect("a readiness line in time");
    parse_ready(&line).unwrap_or_else(|| panic!("not a readiness line: {line:?}"))
}

/// Reads the readiness line like [`ready`] and returns the native address.
pub fn ready_address(stdout: ChildStdout, deadline: Duration) -> String {
    ready(stdout, deadline).native
}

/// The addresses of a readiness line, or `None` if it is not one.
pub fn parse_ready(line: &str) -> Option<Ready> {
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if value["ready"] != serde_json::Value::Bool(true) {
        return None;
    }
    let native = value["native"].as_str()?.to_string();
    let metrics = match &value["metrics"] {
        serde_json::Value::Null => None,
        other => Some(other.as_str()?.to_string()),
    };
    Some(Ready { native, metrics })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_lines_parse_with_and_without_the_metrics_address() {
        let both = parse_ready(
            "{\"ready\":true,\"native\":\"127.0.0.1:1\",\"metrics\":\"127.0.0.1:2\"}\n",
        );
        assert_eq!(
            both,
            Some(Ready { native: "127.0.0.1:1".into(), metrics: Some("127.0.0.1:2".into()) })
        );
        let native_only = parse_ready("{\"ready\":true,\"native\":\"127.0.0.1:1\"}");
        assert_eq!(native_only, Some(Ready { native: "127.0.0.1:1".into(), metrics: None }));
        for bad in ["", "ready", "{\"ready\":false,\"native\":\"a\"}", "{\"ready\":true}"] {
            assert_eq!(parse_ready(bad), None, "{bad:?}");
        }
    }
}
