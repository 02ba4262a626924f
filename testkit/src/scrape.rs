//! [`metrics_page`]: one plain `GET /metrics` of a running server's Prometheus endpoint, for the
//! tests that watch a server's figures (the metrics page is HTTP text, not the native protocol).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The metrics page at `address`, by a plain `GET` (its format is checked strictly by the
/// server's `tests/metrics.rs`); `None` when the endpoint cannot be reached or read within 30 s.
pub fn metrics_page(address: &str) -> Option<String> {
    let mut stream = TcpStream::connect(address).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(30))).ok()?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n\r\n").ok()?;
    let mut page = String::new();
    stream.read_to_string(&mut page).ok()?;
    Some(page)
}
