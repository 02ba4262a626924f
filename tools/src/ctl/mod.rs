//! `shoalctl`: the admin and produce/consume command-line tool.
//!
//! `args` turns the command line into a `Cli` (or a usage error); `commands` runs it against the
//! server through `shoal_client` and prints the result. This module maps outcomes to exit codes:
//! 0 success, 1 an error (a server error prints as `shoalctl: CODE: text`), 2 a usage error. It
//! never panics on server output.

mod args;
mod commands;

use std::ffi::OsString;
use std::process::ExitCode;

pub use args::{Cli, Command, Format, Parsed, USAGE, UsageError, parse};
pub use commands::status_text;

/// Exit status of a command that succeeded.
pub const EXIT_OK: u8 = 0;
/// Exit status of a command that failed (server error, I/O, timeout).
pub const EXIT_ERROR: u8 = 1;
/// Exit status of a command line that does not parse.
pub const EXIT_USAGE: u8 = 2;

/// Runs `shoalctl` with `args` (without the program name).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match parse(args) {
        Ok(Parsed::Run(cli)) => cli,
        Ok(Parsed::Help) => {
            println!("{USAGE}");
            return ExitCode::from(EXIT_OK);
        }
        Err(error) => {
            eprintln!("shoalctl: {error}\n\n{USAGE}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let runtime = match shoal_client::runtime() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("shoalctl: cannot start an io_uring runtime: {error}");
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let mut runtime = runtime;
    match runtime.block_on(commands::run(cli)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(failure) => {
            eprintln!("shoalctl: {failure}");
            ExitCode::from(EXIT_ERROR)
        }
    }
}
