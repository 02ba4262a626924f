//! How Shoal's command-line tools print what clap does not turn into a command line: help on
//! stdout with exit status 0, a usage error on stderr with exit status 2 that ends with the
//! usage of the command, headed `usage:` in help and errors alike, as the hand-written parsers
//! before clap printed it (scripts and tests look for that word).
//!
//! It owns only that presentation; each tool's grammar lives with the tool. It never exits the
//! process: `main` returns the status.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{Command, Parser};

/// Clap's help layout with the usage line headed `usage:`.
const HELP_TEMPLATE: &str =
    "{before-help}{about-with-newline}\nusage: {usage}\n\n{all-args}{after-help}";

/// `command` and its subcommands, every one with [`HELP_TEMPLATE`] and wrapped at the
/// terminal's width, 100 columns at most.
fn usage_headed(command: Command) -> Command {
    command.help_template(HELP_TEMPLATE).max_term_width(100).mut_subcommands(usage_headed)
}

/// Parses `args` (the program name first) into `T`. Help comes back as an error of kind
/// `DisplayHelp`.
pub fn try_parse<T: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<T, clap::Error> {
    let mut command = usage_headed(T::command());
    let mut matches = command.try_get_matches_from_mut(args)?;
    T::from_arg_matches_mut(&mut matches).map_err(|error| error.format(&mut command))
}

/// [`try_parse`], printing help or the usage error; `Err` holds the exit status.
pub fn parse<T: Parser>(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<T, ExitCode> {
    try_parse(args).map_err(print::<T>)
}

/// A usage error that clap cannot see (a rule across flags), worded `message`.
pub fn error<T: Parser>(kind: ErrorKind, message: impl std::fmt::Display) -> clap::Error {
    usage_headed(T::command()).error(kind, message)
}

/// Prints help or a usage error of `T`'s command line and returns its exit status.
pub fn print<T: Parser>(mut error: clap::Error) -> ExitCode {
    if !error.use_stderr() {
        // A closed stdout (`--help | head`) is not worth a second error.
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    // A bad value carries no usage of its own: name the tool's.
    if error.get(ContextKind::Usage).is_none() {
        let usage = usage_headed(T::command()).render_usage();
        error.insert(ContextKind::Usage, ContextValue::StyledStr(usage));
    }
    eprint!("{}", error.render().to_string().replacen("\n\nUsage: ", "\n\nusage: ", 1));
    ExitCode::from(2)
}
