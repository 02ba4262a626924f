//! Shoal's command-line tools and the Rust client library they share.
//!
//! `shoal-inspect` (the data-directory verifier) lives here now; `shoalctl`, `shoal-sim` and the
//! client library arrive with the issues that build them.
