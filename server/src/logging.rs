//! The server's structured log: `tracing` events (message plus fields such as `shard`, `group`,
//! `error`) written as text lines to stderr, filtered by the configured `[log] level`
//! (`SHOAL_LOG`, `--log-level`).
//!
//! It owns installing the global subscriber, once, at start-up; it never decides what is logged
//! (the modules do) and never writes to stdout, which carries only the readiness line.

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// Installs the stderr log with `filter` (a directive list [`crate::config::log_filter`] has
/// checked). Call once, before the first thread starts; a second call changes nothing.
pub fn init(filter: &str) -> Result<(), String> {
    let targets: Targets =
        filter.parse().map_err(|error| format!("log filter {filter:?}: {error}"))?;
    let format = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_thread_names(false);
    tracing_subscriber::registry()
        .with(format)
        .with(targets)
        .try_init()
        .map_err(|error| format!("installing the log: {error}"))
}
