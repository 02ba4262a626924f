//! `shoalctl`: the admin and produce/consume command-line tool.
//!
//! `args` holds the command line's grammar as clap types (clap parses it and prints help or a
//! usage error); `commands` runs a parsed `Cli` against the server through
//! `shoal_client` and prints the result. This module maps outcomes to exit codes: 0 success, 1
//! an error (a server error prints as `shoalctl: CODE: text`), 2 a usage error. It never panics
//! on server output.

mod args;
mod commands;

use std::ffi::OsString;
use std::process::ExitCode;

pub use args::{Cli, Command, Consume, Format, Stream, Topic};
pub use commands::{NodeStatus, groups_text, status_text};

/// Exit status of a command that succeeded.
pub const EXIT_OK: u8 = 0;
/// Exit status of a command that failed (server error, I/O, timeout).
pub const EXIT_ERROR: u8 = 1;

/// Runs `shoalctl` with `args` (the program name first).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = <Cli as clap::Parser>::parse_from(args);
    // A completion script needs no io_uring runtime (which a sandbox may refuse).
    if let Command::Completions { shell } = cli.command {
        return exit_status(commands::completions(shell));
    }
    let runtime = match shoal_client::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("shoalctl: cannot start an io_uring runtime: {error}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let mut runtime = runtime;
    exit_status(runtime.block_on(commands::run(cli)))
}

/// Prints a failure and gives the exit status of an outcome.
fn exit_status(outcome: Result<(), commands::Failure>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(failure) => {
            eprintln!("shoalctl: {failure}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
