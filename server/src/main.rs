//! The `shoal` server binary: configuration, shards, the network listeners, the native protocol
//! and the metadata state machine.
//!
//! Not built yet: the thread-per-core server issue fills this crate. Until then the binary only
//! says so and exits with a failure status, so nobody mistakes it for a server.

fn main() -> std::process::ExitCode {
    eprintln!("shoal: the server is not built yet (see the thread-per-core server issue)");
    std::process::ExitCode::FAILURE
}
