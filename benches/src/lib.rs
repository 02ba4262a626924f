//! `shoal-bench`, the load tool users judge Shoal with.
//!
//! Modes: `produce` (N producer actors, each a pinned thread with its own io_uring runtime and
//! connection, pipelining one prepared batch on an open-loop schedule; produce→ack latency from
//! each send's *intended* time), `consume` (N consumer actors polling their partitions; poll
//! latency), `e2e` (both at once; end-to-end latency per message from a send-time stamp), `mixed`
//! (producers and consumers in a ratio). HDR histograms pooled across actors; a JSON report and
//! a self-contained HTML page with inline SVG charts; `compare` puts two reports side by side. It drives a running (or spawned) server through the client library
//! in `tools/client` and never reaches into the server's internals.
//!
//! Modules: `actor` (pinning, runtime and tally every actor thread shares), `compare` (two
//! reports side by side), `html` (the report page), `loopback` (the
//! same-size TCP round trip latency is judged against), `replay` (a `persisted` form's disk I/O
//! alone, the engine's yardstick), `schedule` (the open-loop schedule and rate limits, on times passed in), `stats`
//! (histograms and per-second series), `producer` and `consumer` (one actor each), `run` (a
//! whole run and its report), `server` (`--spawn-server`), `environment` (machine facts), `cli` (arguments).

pub mod actor;
pub mod cli;
pub mod compare;
pub mod consumer;
pub mod environment;
pub mod html;
pub mod loopback;
pub mod producer;
pub mod replay;
pub mod run;
pub mod schedule;
pub mod server;
pub mod stats;
