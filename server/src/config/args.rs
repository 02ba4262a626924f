//! The command line: [`parse_args`] has clap split it into [`Args`] — `--config`,
//! `--print-config`, the setting flags in the order given, or `completions SHELL` — and clap
//! answers `--help` and usage errors (an unknown flag, a missing value) with its generated text.
//!
//! clap only parses: a setting flag's value is checked later, when `layers` applies it as the
//! last layer through the same key code as the file and the environment; this code never checks
//! a value itself and never reads a file or the environment.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Arg, ArgAction, ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use clap_complete::Shell;

use super::keys::Scope;

/// What the command line asked for.
#[derive(Debug)]
pub struct Args {
    /// `--config FILE`.
    pub config_file: Option<PathBuf>,
    /// `--print-config`: print the effective configuration and exit.
    pub print_config: bool,
    /// `completions SHELL`: print the shell's completion script and exit.
    pub completions: Option<Shell>,
    /// The setting flags in the order given, as (flag, value); a repeated flag: the last wins.
    pub settings: Vec<(&'static str, String)>,
}

/// A flag that sets a key: its name, its value's placeholder and help line in `--help`, and the
/// key it sets.
pub(super) struct Flag {
    /// `--shards`: the flag, and the key an error about its value names.
    pub(super) name: &'static str,
    value_name: &'static str,
    help: &'static str,
    pub(super) scope: Scope,
    pub(super) key: &'static str,
}

/// The flags that set a key, in `--help`'s order.
pub(super) const FLAGS: [Flag; 12] = [
    Flag {
        name: "--data-dir",
        value_name: "DIR",
        help: "Data directory (default ./shoal-data), created if missing, locked while served",
        scope: Scope::Server,
        key: "data_dir",
    },
    Flag {
        name: "--listen",
        value_name: "ADDR",
        help: "Native protocol address (default 127.0.0.1:7070, or this node's client address in \
               --cluster-nodes; port 0 picks a free port)",
        scope: Scope::Server,
        key: "native_listen",
    },
    Flag {
        name: "--shards",
        value_name: "N",
        help: "Shards, one thread each, 1 to 256 (default: one per available CPU); a data \
               directory keeps the shard count it was created with",
        scope: Scope::Server,
        key: "shards",
    },
    Flag {
        name: "--cpus",
        value_name: "LIST",
        help: "CPU of each shard thread, comma-separated (one per shard), or none (no pinning); \
               default: shard i on the i-th available CPU when there are enough",
        scope: Scope::Server,
        key: "cpus",
    },
    Flag {
        name: "--profile",
        value_name: "P",
        help: "Storage sizes: default (production) or small (tests: small journal and rings)",
        scope: Scope::Server,
        key: "profile",
    },
    Flag {
        name: "--cluster-id",
        value_name: "ID",
        help: "Cluster id, 1 or more, the same on every node (default 1)",
        scope: Scope::Cluster,
        key: "id",
    },
    Flag {
        name: "--cluster-node",
        value_name: "N",
        help: "This node's index: in --cluster-nodes, or past them for a node added later with \
               --cluster-added-node (default 0)",
        scope: Scope::Cluster,
        key: "node",
    },
    Flag {
        name: "--cluster-nodes",
        value_name: "NODES",
        help: "The cluster's founding nodes in index order, the same on every node and never \
               changed: nodes separated by ';', each bus=ADDR,client=ADDR[,kafka=ADDR][,rack=NAME] \
               (shard s's replica bus on the bus port + s); default: none, a one-node cluster",
        scope: Scope::Cluster,
        key: "nodes",
    },
    Flag {
        name: "--cluster-added-node",
        value_name: "NODE",
        help: "This node's own addresses when it was added to a running cluster (shoalctl \
               cluster add-node; --cluster-node past --cluster-nodes): one node as in \
               --cluster-nodes, bus=ADDR,client=ADDR[,kafka=ADDR][,rack=NAME]; default: none, a \
               founding node",
        scope: Scope::Cluster,
        key: "added_node",
    },
    Flag {
        name: "--metrics-listen",
        value_name: "ADDR",
        help: "Prometheus endpoint, GET /metrics on shard 0 (default 127.0.0.1:9464; port 0 \
               picks a free port; off: none)",
        scope: Scope::Metrics,
        key: "listen",
    },
    Flag {
        name: "--kafka-listen",
        value_name: "ADDR",
        help: "Kafka protocol listener, on every shard (default 127.0.0.1:9092; port 0 picks a \
               free port; off: none)",
        scope: Scope::Kafka,
        key: "listen",
    },
    Flag {
        name: "--log-level",
        value_name: "LEVEL",
        help: "Stderr log filter: off, error, warn, info (default), debug or trace, or \
               directives such as warn,shoal_server::shard=debug (also SHOAL_LOG)",
        scope: Scope::Log,
        key: "level",
    },
];

/// What `--help` says after the flags: how settings resolve, the readiness line, shutdown.
const AFTER_HELP: &str = "\
Settings resolve in this order, later winning: built-in defaults, the config file, SHOAL_* \
environment variables (SHOAL_<KEY> or SHOAL_<SECTION>_<KEY>, e.g. SHOAL_SHARDS, \
SHOAL_NETWORK_CONNECTIONS_MAX), flags; docs/configuration.md lists every key. An invalid setting \
prints \"shoal: config: KEY: REASON\" and exits 2.

Prints one JSON line once recovery is done and the listeners are bound:
  {\"ready\":true,\"native\":\"ADDR\",\"metrics\":\"ADDR\",\"kafka\":\"ADDR\",\"shards\":[\"ADDR\",...]}
(no metrics or kafka field when that listener is off; shards, each shard's own listener, only with \
[network] shard_listen). SIGINT or SIGTERM shuts down gracefully (in a cluster, first hands \
the groups this node leads to peers in sync, for at most three view-change timeouts; then \
flush, checkpoint, clean-shutdown flag, exit 0); a second signal exits at once.";

/// Starts the shards of one node on a data directory and serves until SIGINT or SIGTERM.
#[derive(Debug, Parser)]
#[command(
    name = "shoal",
    after_help = AFTER_HELP,
    args_override_self = true,
    disable_help_subcommand = true
)]
struct Cli {
    /// TOML config file (configs/single-node.toml lists every key and its default)
    #[arg(long, value_name = "FILE", allow_hyphen_values = true)]
    config: Option<PathBuf>,
    #[command(flatten)]
    settings: Settings,
    /// Print the effective configuration as TOML and exit (starts nothing, touches no data
    /// directory)
    #[arg(long)]
    print_config: bool,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print a completion script for shoal (e.g. shoal completions bash >
    /// /etc/bash_completion.d/shoal)
    Completions {
        /// The shell
        shell: Shell,
    },
}

/// The setting flags, in the order given. They come from [`FLAGS`] (so a flag has one name,
/// which `layers` maps to its key) rather than from derived fields. Each keeps every occurrence,
/// so every value given goes through its key's checks, in command-line order, the last one
/// winning, as before clap: an invalid earlier value is still an error.
#[derive(Debug)]
struct Settings(Vec<(&'static str, String)>);

impl clap::Args for Settings {
    fn augment_args(command: clap::Command) -> clap::Command {
        command.args(FLAGS.iter().map(|flag| {
            Arg::new(flag.name)
                .long(flag.name.trim_start_matches('-'))
                .value_name(flag.value_name)
                .help(flag.help)
                .action(ArgAction::Append)
                .value_parser(clap::value_parser!(String))
                // A value may start with '-' (a data directory, say), as before clap.
                .allow_hyphen_values(true)
        }))
    }

    fn augment_args_for_update(command: clap::Command) -> clap::Command {
        Self::augment_args(command)
    }
}

impl FromArgMatches for Settings {
    fn from_arg_matches(matches: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for flag in &FLAGS {
            let (Some(at), Some(values)) =
                (matches.indices_of(flag.name), matches.get_many::<String>(flag.name))
            else {
                continue;
            };
            given.extend(at.zip(values).map(|(at, value)| (at, flag.name, value.clone())));
        }
        given.sort_unstable_by_key(|&(at, _, _)| at);
        Ok(Settings(given.into_iter().map(|(_, flag, value)| (flag, value)).collect()))
    }

    fn update_from_arg_matches(&mut self, matches: &ArgMatches) -> Result<(), clap::Error> {
        *self = Settings::from_arg_matches(matches)?;
        Ok(())
    }
}

/// Splits the command line (without the program name) into [`Args`]. Takes `--flag VALUE` and
/// `--flag=VALUE`; values are checked later, by [`Layers::flag`](crate::config::Layers::flag).
/// `Err`: `--help` (clap's error of kind `DisplayHelp`: print it to stdout and exit 0) or a usage
/// error naming the flag (print it to stderr and exit 2); `clap::Error::print` and `exit_code`
/// do both.
pub fn parse_args<I>(words: I) -> Result<Args, clap::Error>
where
    I: IntoIterator,
    I::Item: Into<OsString>,
{
    let words = std::iter::once(OsString::from("shoal")).chain(words.into_iter().map(Into::into));
    let cli = Cli::try_parse_from(words)?;
    Ok(Args {
        config_file: cli.config,
        print_config: cli.print_config,
        completions: cli.command.map(|Command::Completions { shell }| shell),
        settings: cli.settings.0,
    })
}

/// `shell`'s completion script for `shoal`.
pub fn completion_script(shell: Shell) -> Vec<u8> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "shoal", &mut script);
    script
}
