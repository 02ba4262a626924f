//! Shoal's command-line tools.
//!
//! `shoal-inspect` (the data-directory verifier) and `shoal-sim` (the simulator CLI) are thin
//! binaries; `shoalctl`'s command line and commands live in [`ctl`]; [`usage`] prints the
//! three tools' help and usage errors alike. The client library is the `shoal-client` crate
//! (`tools/client`).

pub mod ctl;
pub mod usage;
