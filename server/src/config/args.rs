//! The command line: [`parse_args`] splits it into [`Args`] — `--config`, `--print-config`,
//! `--help` and the setting flags in order. A flag's value is checked later, when `layers`
//! applies it as the last layer; this code never checks a value itself.

use std::path::PathBuf;

use super::error::ConfigError;
use super::keys::Scope;

/// What the command line asked for.
#[derive(Debug, Default)]
pub struct Args {
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--print-config`: print the effective configuration and exit.
    pub print_config: bool,
    /// `--help`.
    pub help: bool,
    /// The setting flags in the order given, as (flag, value); a repeated flag: the last wins.
    pub settings: Vec<(&'static str, String)>,
}

/// The flags that set a key, and the key each sets.
pub(super) const FLAGS: [(&str, Scope, &str); 7] = [
    ("--data-dir", Scope::Server, "data_dir"),
    ("--listen", Scope::Server, "native_listen"),
    ("--shards", Scope::Server, "shards"),
    ("--cpus", Scope::Server, "cpus"),
    ("--profile", Scope::Server, "profile"),
    ("--metrics-listen", Scope::Metrics, "listen"),
    ("--log-level", Scope::Log, "level"),
];

/// Splits the command line (without the program name) into [`Args`]. Takes `--flag VALUE` and
/// `--flag=VALUE`; values are checked later, by [`Layers::flag`](crate::config::Layers::flag).
pub fn parse_args(words: impl IntoIterator<Item = String>) -> Result<Args, ConfigError> {
    let mut args = Args::default();
    let mut words = words.into_iter();
    while let Some(word) = words.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with("--") => (flag.to_string(), Some(value)),
            _ => (word.clone(), None),
        };
        match flag.as_str() {
            "--help" | "-h" | "--print-config" => {
                if inline.is_some() {
                    return Err(ConfigError::new(flag, "takes no value"));
                }
                if flag == "--print-config" {
                    args.print_config = true;
                } else {
                    args.help = true;
                }
            }
            _ => {
                let Some(known) = FLAGS
                    .iter()
                    .map(|&(known, _, _)| known)
                    .chain(["--config"])
                    .find(|&known| known == flag)
                else {
                    let reason = if flag.starts_with('-') {
                        "unknown flag (shoal --help lists them)"
                    } else {
                        "unexpected argument (shoal takes flags only; see shoal --help)"
                    };
                    return Err(ConfigError::new(flag, reason));
                };
                let value = match inline {
                    Some(value) => value.to_string(),
                    None => words.next().ok_or_else(|| ConfigError::new(known, "needs a value"))?,
                };
                if known == "--config" {
                    args.config_file = Some(PathBuf::from(value));
                } else {
                    args.settings.push((known, value));
                }
            }
        }
    }
    Ok(args)
}
