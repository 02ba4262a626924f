//! `shoal-bench`, the load tool, and its benchmark suite.
//!
//! Not built yet: the `shoal-bench` issue fills this crate. It will drive a running server over
//! the client library in `tools/` and never reach into the server's internals.
