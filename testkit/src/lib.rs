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
    /// Each shard's own listener, by shard (empty: `[network] shard_listen` is off).
    pub shards: Vec<String>,
}

/// Reads the server's readiness line (`{"ready":true,"native":"ADDR","metrics":"ADDR",
/// "shards":["ADDR",...]}`, the metrics field absent when the endpoint is off, the shards field
/// without per-shard listeners) from its `stdout` within `deadline`.
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
    let shards = match &value["shards"] {
        serde_json::Value::Null => Vec::new(),
        other => other
            .as_array()?
            .iter()
            .map(|address| address.as_str().map(str::to_string))
            .collect::<Option<Vec<String>>>()?,
    };
    Some(Ready { native, metrics, shards })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readiness_lines_parse_with_and_without_the_metrics_address() {
        let both = parse_ready(
            "{\"ready\":true,\"native\":\"127.0.0.1:1\",\"metrics\":\"127.0.0.1:2\"}\n",
        );
        let metrics = Some("127.0.0.1:2".to_string());
        let native = "127.0.0.1:1".to_string();
        assert_eq!(
            both,
            Some(Ready { native: native.clone(), metrics: metrics.clone(), shards: Vec::new() })
        );
        let native_only = parse_ready("{\"ready\":true,\"native\":\"127.0.0.1:1\"}");
        let expected = Ready { native: native.clone(), metrics: None, shards: Vec::new() };
        assert_eq!(native_only, Some(expected));
        let with_shards = parse_ready(
            "{\"ready\":true,\"native\":\"127.0.0.1:1\",\"metrics\":\"127.0.0.1:2\",\
             \"shards\":[\"127.0.0.1:3\",\"127.0.0.1:4\"]}",
        );
        let shards = vec!["127.0.0.1:3".to_string(), "127.0.0.1:4".to_string()];
        assert_eq!(with_shards, Some(Ready { native, metrics, shards }));
        assert_eq!(parse_ready("{\"ready\":true,\"native\":\"a\",\"shards\":[1]}"), None);
        for bad in ["", "ready", "{\"ready\":false,\"native\":\"a\"}", "{\"ready\":true}"] {
            assert_eq!(parse_ready(bad), None, "{bad:?}");
        }
    }
}
