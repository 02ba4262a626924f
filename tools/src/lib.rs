//! Shoal's command-line tools.
//!
//! `shoal-inspect` (the data-directory verifier, reading through [`mapped`]) and `shoal-sim` (the
//! simulator CLI) are thin binaries; `shoalctl`'s command line and commands live in [`ctl`]. Every
//! command line is clap's (help on stdout with status 0, usage errors on stderr with status 2).
//! The client library is the `shoal-client` crate (`tools/client`).

pub mod ctl;
pub mod mapped;
