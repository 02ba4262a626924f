//! `shoal-bench`, the load tool users judge Shoal with.
//!
//! Today it has the `produce` mode: N producer actors, each a pinned thread with its own
//! io_uring runtime and connection, pipelining one prepared batch on an open-loop schedule;
//! produce→ack latency from each send's *intended* time into HDR histograms pooled across
//! actors; a JSON report. It drives a running (or spawned) server through the client library
//! in `tools/client` and never reaches into the server's internals.
//!
//! Modules: `schedule` (the open-loop schedule and rate limits, on times passed in), `stats`
//! (histograms and per-second series), `producer` (one actor), `run` (a whole `produce` run and
//! its report), `server` (`--spawn-server`), `environment` (machine facts), `cli` (arguments).

pub mod cli;
pub mod environment;
pub mod producer;
pub mod run;
pub mod schedule;
pub mod server;
pub mod stats;
