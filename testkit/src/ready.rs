//! The server's readiness line: `{"ready":true,"native":"ADDR","metrics":"ADDR","kafka":"ADDR",
//! "shards":["ADDR",...]}` (the metrics and kafka fields absent when that listener is off, the shards field
//! without per-shard listeners), the one line `shoal` prints on stdout once recovery is done and
//! its listeners are bound. Reading it is bounded by a deadline.
//!
//! It owns only parsing and reading that line; it never signals or reaps the process.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;
use std::sync::mpsc;
use std::time::Duration;

/// What the server's readiness line announces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// The native protocol address.
    pub native: String,
    /// The metrics endpoint's address (`None`: the endpoint is off).
    pub metrics: Option<String>,
    /// The Kafka listener's address (`None`: the listener is off).
    pub kafka: Option<String>,
    /// Each shard's own listener, by shard (empty: `[network] shard_listen` is off).
    pub shards: Vec<String>,
}

/// The first line of `stdout` (`""` if it closed first), or `None` if none came within
/// `deadline`. The reading thread ends when the line comes or the pipe closes.
pub(crate) fn first_line_within(stdout: ChildStdout, deadline: Duration) -> Option<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    rx.recv_timeout(deadline).ok()
}

/// The addresses of a readiness line, or `None` if it is not one.
pub(crate) fn parse_ready(line: &str) -> Option<Ready> {
    let value: serde_json::Value = serde_json::from_str(line.trim()).ok()?;
    if value["ready"] != serde_json::Value::Bool(true) {
        return None;
    }
    let native = value["native"].as_str()?.to_string();
    let optional = |field: &serde_json::Value| match field {
        serde_json::Value::Null => Some(None),
        other => Some(Some(other.as_str()?.to_string())),
    };
    let metrics = optional(&value["metrics"])?;
    let kafka = optional(&value["kafka"])?;
    let shards = match &value["shards"] {
        serde_json::Value::Null => Vec::new(),
        other => other
            .as_array()?
            .iter()
            .map(|address| address.as_str().map(str::to_string))
            .collect::<Option<Vec<String>>>()?,
    };
    Some(Ready { native, metrics, kafka, shards })
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
            Some(Ready {
                native: native.clone(),
                metrics: metrics.clone(),
                kafka: None,
                shards: Vec::new()
            })
        );
        let native_only = parse_ready("{\"ready\":true,\"native\":\"127.0.0.1:1\"}");
        let expected =
            Ready { native: native.clone(), metrics: None, kafka: None, shards: Vec::new() };
        assert_eq!(native_only, Some(expected));
        let with_shards = parse_ready(
            "{\"ready\":true,\"native\":\"127.0.0.1:1\",\"metrics\":\"127.0.0.1:2\",\
             \"kafka\":\"127.0.0.1:5\",\"shards\":[\"127.0.0.1:3\",\"127.0.0.1:4\"]}",
        );
        let shards = vec!["127.0.0.1:3".to_string(), "127.0.0.1:4".to_string()];
        let kafka = Some("127.0.0.1:5".to_string());
        assert_eq!(with_shards, Some(Ready { native, metrics, kafka, shards }));
        assert_eq!(parse_ready("{\"ready\":true,\"native\":\"a\",\"shards\":[1]}"), None);
        for bad in ["", "ready", "{\"ready\":false,\"native\":\"a\"}", "{\"ready\":true}"] {
            assert_eq!(parse_ready(bad), None, "{bad:?}");
        }
    }
}
