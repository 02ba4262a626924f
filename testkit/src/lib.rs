//! Runs Shoal's real binaries for the end-to-end tests (`server`, `tools`, `benches`) and for the
//! load tool's `--spawn-server`: [`ShoalProcess`], the one way to start a `shoal` server (spawn,
//! wait for its readiness line, signal, kill, restart), [`ShoalCluster`] (several of them forming
//! one cluster on loopback), [`output_within`] for a child that is expected to exit, and
//! [`metrics_page`] to read a server's Prometheus page.
//!
//! Every wait here is bounded by a deadline, and nothing is global: each process is started from
//! its caller's command line (ephemeral ports, its own data directory), so tests stay parallel-safe
//! and several servers can run side by side. It never speaks the server's native protocol.

mod cluster;
mod process;
mod ready;
mod scrape;
mod wait;

pub use cluster::{ClusterPlan, ShoalCluster, node_log};
pub use process::{ProcessError, ShoalProcess, shoal_binary_beside};
pub use scrape::metrics_page;
pub use wait::output_within;
