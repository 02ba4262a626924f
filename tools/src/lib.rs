//! Shoal's command-line tools.
//!
//! `shoal-inspect` (the data-directory verifier) and `shoal-sim` (the simulator CLI) are thin
//! binaries; `shoalctl`'s argument parsing and commands live in [`ctl`]. The client library is
//! the `shoal-client` crate (`tools/client`).

pub mod ctl;
