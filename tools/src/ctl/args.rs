//! `shoalctl`'s command line: the grammar as clap derive types, with the help text and the value
//! parsers (clap names the flag in a bad value's error).
//!
//! It owns the commands, their positional arguments, options and value syntax. It never
//! connects, reads stdin or prints: `main` parses through clap, which prints help or a usage
//! error and exits with status 0 or 2.

use clap::{Args, Parser, Subcommand, ValueEnum};
use clap_complete::Shell;
use shoal_client::{Durability, FetchFrom};

/// The heading of the options every command takes, apart from each command's own.
const GLOBAL: &str = "Global options";

/// The prose after the options of `shoalctl --help`.
const AFTER_HELP: &str =
    "exit status: 0 success, 1 error (the server's error code is printed), 2 usage error";

/// A parsed command line.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(
    max_term_width = 100,
    name = "shoalctl",
    about = "Administers a Shoal server and produces or consumes messages over the native protocol.",
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// Server address(es), tried in turn
    // `::std::vec::Vec`: one value holding the whole list, not one value per occurrence.
    #[arg(
        long = "server",
        value_name = "HOST:PORT[,HOST:PORT...]",
        default_value = "127.0.0.1:7070",
        value_parser = servers,
        global = true,
        help_heading = GLOBAL
    )]
    pub servers: ::std::vec::Vec<String>,
    /// Print JSON instead of text
    #[arg(long, global = true, help_heading = GLOBAL)]
    pub json: bool,
    /// Longest wait for one reply (0 counts as 1)
    #[arg(
        long,
        value_name = "MS",
        default_value = "10000",
        value_parser = timeout_ms,
        global = true,
        help_heading = GLOBAL
    )]
    pub timeout_ms: u64,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A `shoalctl` command with its arguments.
#[derive(Clone, Debug, PartialEq, Subcommand)]
pub enum Command {
    /// Creates, lists or deletes streams
    #[command(subcommand)]
    Stream(Stream),
    /// Creates, lists, describes or deletes a stream's topics
    #[command(subcommand)]
    Topic(Topic),
    /// Produces one message per stdin line (the value)
    ///
    /// Produces one message per stdin line (the value); prints `PARTITION OFFSET` for each
    /// message as soon as it is acknowledged. Without --partition or --key the server balances.
    Produce {
        /// The stream
        stream: String,
        /// The topic
        topic: String,
        /// The partition every message goes to
        #[arg(long, value_name = "P")]
        partition: Option<u32>,
        /// The key of every message (Kafka's partitioner picks the partition from it)
        #[arg(long, value_name = "K")]
        key: Option<String>,
    },
    /// Prints one partition's messages, or a consumer group member's share, one per line
    ///
    /// Prints messages one per line; stops at the log end (or after --count messages) unless
    /// --follow.
    ///
    /// With --partition P --from ...: the messages of partition P from that position.
    ///
    /// With --group G: as a member of consumer group G, its share of the partitions, from the
    /// group's stored offsets (the first message where none is stored), each offset stored
    /// once its messages are printed (at-least-once); leaves the group at the end. --format
    /// offset then prints PARTITION, OFFSET and VALUE.
    Consume(Consume),
    /// Prints the server's shards, partitions per shard, disk usage and per-partition offsets
    Status,
    /// Moves partitions between a cluster's nodes, and shows the moves in progress
    #[command(subcommand)]
    Cluster(Cluster),
    /// Prints a shell completion script for shoalctl
    ///
    /// Prints a shell completion script for shoalctl, e.g. `shoalctl completions bash >
    /// /etc/bash_completion.d/shoalctl` or `shoalctl completions fish >
    /// ~/.config/fish/completions/shoalctl.fish`.
    Completions {
        /// The shell the script is for
        shell: Shell,
    },
}

/// `shoalctl stream ...`
#[derive(Clone, Debug, PartialEq, Subcommand)]
pub enum Stream {
    /// Creates a stream
    Create {
        /// The stream's name
        name: String,
    },
    /// Lists the streams
    List,
    /// Deletes a stream
    Delete {
        /// The stream's name
        name: String,
    },
}

/// `shoalctl cluster ...`
#[derive(Clone, Debug, PartialEq, Subcommand)]
pub enum Cluster {
    /// Moves a partition's replicas to other nodes (as many as it has now)
    ///
    /// Moves a partition's replicas to the nodes --to names, as many as it has now: the new
    /// nodes join as learners, the voters switch once they are in sync, the leaving nodes are
    /// dropped. Returns once the move is recorded; `shoalctl cluster status` shows its progress.
    MovePartition {
        /// The stream
        stream: String,
        /// The topic
        topic: String,
        /// The partition
        partition: u32,
        /// The nodes to hold the partition, by index (e.g. 1,2,3)
        #[arg(long, value_name = "NODES", value_delimiter = ',', required = true,
              value_parser = clap::value_parser!(u8).range(0..32))]
        to: Vec<u8>,
    },
    /// Cancels a partition's move in progress: back to the nodes it came from
    CancelMove {
        /// The stream
        stream: String,
        /// The topic
        topic: String,
        /// The partition
        partition: u32,
    },
    /// Shows every node and the moves in progress, with the bytes each new node holds
    Status,
    /// Adds a node to the cluster's address book
    ///
    /// Records where the new node's peers (--bus, the base port of its shards' bus ports) and
    /// clients (--client, --kafka) reach it, and prints its index. Start it with the founding
    /// nodes' --cluster-nodes, --cluster-node set to that index and --cluster-added-node naming
    /// the same addresses. It joins the metadata group as a learner and holds no partition until
    /// moves bring some (move-partition, replace-node).
    AddNode {
        /// The node's bus base address (IP:PORT)
        #[arg(long, value_name = "IP:PORT")]
        bus: String,
        /// The node's native client address (IP:PORT)
        #[arg(long, value_name = "IP:PORT")]
        client: String,
        /// The Kafka address it advertises (IP:PORT)
        #[arg(long, value_name = "IP:PORT")]
        kafka: Option<String>,
        /// Its rack
        #[arg(long)]
        rack: Option<String>,
        /// Its index (default: the lowest free one)
        #[arg(long, value_parser = clap::value_parser!(u8).range(0..32))]
        node: Option<u8>,
    },
    /// Removes a node: every partition it holds moves to the other nodes
    ///
    /// Each partition on the node moves to the active node holding the fewest replicas (as
    /// move-partition does it); its seat in the metadata group goes to another node. Nothing
    /// new is placed on it from now on. `cluster status` shows the moves; once none is left,
    /// the node holds nothing and can be stopped.
    RemoveNode {
        /// The node's index
        #[arg(value_parser = clap::value_parser!(u8).range(0..32))]
        node: u8,
    },
    /// Replaces a node with another: every partition it holds moves to the new one
    ///
    /// As remove-node, with every replica going to NEW (a node added with add-node, e.g. the
    /// machine that replaces a failed one, started with an empty disk and a new index).
    ReplaceNode {
        /// The node leaving
        #[arg(value_parser = clap::value_parser!(u8).range(0..32))]
        old: u8,
        /// The node taking its place
        #[arg(value_parser = clap::value_parser!(u8).range(0..32))]
        new: u8,
    },
}

/// `shoalctl topic ...`
#[derive(Clone, Debug, PartialEq, Subcommand)]
pub enum Topic {
    /// Creates a topic in a stream
    Create {
        /// The stream
        stream: String,
        /// The topic's name
        topic: String,
        /// Partitions of the topic
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
        /// Durability of the topic's partitions: replicated or persisted
        #[arg(long, value_name = "replicated|persisted")]
        durability: Durability,
        /// Size-based retention in bytes per partition (0: unbounded)
        #[arg(long, value_name = "B")]
        retention_bytes: Option<u64>,
        /// Age-based retention (0: unbounded)
        #[arg(long, value_name = "MS")]
        retention_ms: Option<u64>,
        /// Segment roll size
        #[arg(long, value_name = "B")]
        segment_size_bytes: Option<u64>,
        /// Largest batch accepted
        #[arg(long, value_name = "B")]
        message_size_bytes_max: Option<u64>,
        /// The topic's own lag bound for its replicas (default: the cluster's
        /// [replication] replica_lag_time_max_ms)
        #[arg(long, value_name = "MS")]
        replica_lag_time_max_ms: Option<u64>,
        /// Nodes that hold each partition (default: three, or every node of a smaller cluster)
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=32))]
        replication_factor: Option<u8>,
    },
    /// Lists a stream's topics
    List {
        /// The stream
        stream: String,
    },
    /// Prints a topic's settings and each partition's offsets
    Describe {
        /// The stream
        stream: String,
        /// The topic
        topic: String,
    },
    /// Deletes a topic
    Delete {
        /// The stream
        stream: String,
        /// The topic
        topic: String,
    },
}

/// What `consume` was asked for (run by `commands`).
#[derive(Args, Clone, Debug, PartialEq)]
pub struct Consume {
    /// The stream
    pub stream: String,
    /// The topic
    pub topic: String,
    /// Consume as a member of this consumer group (instead of --partition and --from)
    #[arg(long, value_name = "G", conflicts_with_all = ["partition", "from"])]
    pub group: Option<String>,
    /// The partition to read
    #[arg(long, value_name = "P", required_unless_present = "group")]
    pub partition: Option<u32>,
    /// Where to start
    #[arg(
        long,
        value_name = "first|last|OFFSET|time:MS",
        required_unless_present = "group",
        value_parser = fetch_from
    )]
    pub from: Option<FetchFrom>,
    /// Stop after N messages
    #[arg(long, value_name = "N")]
    pub count: Option<u64>,
    /// Wait for new messages at the log end instead of stopping
    #[arg(long)]
    pub follow: bool,
    /// How each message is printed (default: json with --json, else value)
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// `--json`, which picks the default format.
    #[arg(from_global)]
    pub json: bool,
}

impl Consume {
    /// How each message is printed: `--format`, else JSON with `--json`, else the value alone.
    pub fn format(&self) -> Format {
        match self.format {
            Some(format) => format,
            None if self.json => Format::Json,
            None => Format::Value,
        }
    }
}

/// How `consume` prints a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The value alone
    Value,
    /// OFFSET<TAB>VALUE (in a group: PARTITION<TAB>OFFSET<TAB>VALUE)
    Offset,
    /// One JSON object per message
    Json,
}

fn servers(list: &str) -> Result<Vec<String>, String> {
    let servers: Vec<String> =
        list.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect();
    if servers.is_empty() {
        return Err("needs at least one HOST:PORT".into());
    }
    Ok(servers)
}

fn timeout_ms(value: &str) -> Result<u64, String> {
    value.parse::<u64>().map(|ms| ms.max(1)).map_err(|_| "not a valid number".into())
}

fn fetch_from(value: &str) -> Result<FetchFrom, String> {
    match value {
        "first" => Ok(FetchFrom::First),
        "last" => Ok(FetchFrom::Last),
        _ => {
            if let Some(time) = value.strip_prefix("time:") {
                return time
                    .parse::<i64>()
                    .map(FetchFrom::Timestamp)
                    .map_err(|_| format!("time:{time:?} is not a valid number"));
            }
            value
                .parse::<u64>()
                .map(FetchFrom::Offset)
                .map_err(|_| "use first, last, an offset or time:MS".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;

    use super::*;

    fn run(args: &str) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["shoalctl"].into_iter().chain(args.split_whitespace()))
    }

    fn command(args: &str) -> Command {
        match run(args) {
            Ok(cli) => cli.command,
            Err(error) => panic!("{args}: {error}"),
        }
    }

    #[test]
    fn args_parse_every_command() {
        assert_eq!(
            command("stream create s"),
            Command::Stream(Stream::Create { name: "s".into() })
        );
        assert_eq!(command("stream list"), Command::Stream(Stream::List));
        assert_eq!(
            command("cluster move-partition s t 2 --to 1,3"),
            Command::Cluster(Cluster::MovePartition {
                stream: "s".into(),
                topic: "t".into(),
                partition: 2,
                to: vec![1, 3],
            })
        );
        assert_eq!(
            command("cluster cancel-move s t 0"),
            Command::Cluster(Cluster::CancelMove {
                stream: "s".into(),
                topic: "t".into(),
                partition: 0
            })
        );
        assert_eq!(command("cluster status"), Command::Cluster(Cluster::Status));
        assert_eq!(
            command("cluster add-node --bus 10.0.0.4:7000 --client 10.0.0.4:8000"),
            Command::Cluster(Cluster::AddNode {
                bus: "10.0.0.4:7000".into(),
                client: "10.0.0.4:8000".into(),
                kafka: None,
                rack: None,
                node: None,
            })
        );
        assert_eq!(
            command("cluster remove-node 0"),
            Command::Cluster(Cluster::RemoveNode { node: 0 })
        );
        assert_eq!(
            command("cluster replace-node 1 4"),
            Command::Cluster(Cluster::ReplaceNode { old: 1, new: 4 })
        );
        assert_eq!(
            command(
                "topic create s t --partitions 2 --durability persisted --retention-ms=5 \
                 --replica-lag-time-max-ms 5000 --replication-factor 3"
            ),
            Command::Topic(Topic::Create {
                stream: "s".into(),
                topic: "t".into(),
                partitions: 2,
                durability: Durability::Persisted,
                retention_bytes: None,
                retention_ms: Some(5),
                segment_size_bytes: None,
                message_size_bytes_max: None,
                replica_lag_time_max_ms: Some(5000),
                replication_factor: Some(3),
            })
        );
        assert_eq!(
            command("produce s t --key k"),
            Command::Produce {
                stream: "s".into(),
                topic: "t".into(),
                partition: None,
                key: Some("k".into())
            }
        );
        let Command::Consume(consume) =
            command("--json consume s t --partition 1 --from time:-5 --follow")
        else {
            panic!("not consume");
        };
        assert_eq!(
            (consume.partition, consume.from, consume.follow, consume.format()),
            (Some(1), Some(FetchFrom::Timestamp(-5)), true, Format::Json)
        );
        let Command::Consume(consume) = command("consume s t --group g --count 3") else {
            panic!("not consume");
        };
        assert_eq!(
            (consume.group.as_deref(), consume.partition, consume.count, consume.format()),
            (Some("g"), None, Some(3), Format::Value)
        );
        let Command::Consume(consume) = command("consume s t --group g --format offset --json")
        else {
            panic!("not consume");
        };
        assert_eq!(consume.format(), Format::Offset);
        assert!(run("consume s t --group g --partition 1").is_err());
        let cli = run("status --server a:1,b:2 --timeout-ms 5").unwrap();
        assert_eq!(cli.servers, ["a:1", "b:2"]);
        assert_eq!(cli.timeout_ms, 5);
        let cli = run("--server a:1 --timeout-ms 0 stream list").unwrap();
        assert_eq!((cli.servers, cli.timeout_ms), (vec!["a:1".to_string()], 1));
        let cli = run("status").unwrap();
        assert_eq!((cli.servers, cli.timeout_ms), (vec!["127.0.0.1:7070".to_string()], 10_000));
        assert_eq!(command("completions zsh"), Command::Completions { shell: Shell::Zsh });
        assert_eq!(run("topic list s --help").unwrap_err().kind(), ErrorKind::DisplayHelp);
    }

    #[test]
    fn args_refuse_bad_command_lines_with_a_reason() {
        for (args, reason) in [
            ("", "Usage: shoalctl"),
            ("stream", "Usage: shoalctl stream"),
            ("stream make s", "unrecognized subcommand 'make'"),
            ("frobnicate", "unrecognized subcommand 'frobnicate'"),
            ("topic create s t --durability persisted", "--partitions"),
            ("topic create s t --partitions 0 --durability persisted", "--partitions"),
            ("topic create s t --partitions 2 --durability fast", "replicated or persisted"),
            ("consume s t --from first", "--partition"),
            ("consume s t --partition 0", "--from"),
            ("consume s t --partition 0 --from middle", "--from"),
            ("consume s t --partition -1 --from first", "-1"),
            ("consume s t --group g --from first", "cannot be used with"),
            ("consume s t --partition 0 --from first --format yaml", "--format"),
            ("stream list --partition 1", "--partition"),
            ("stream list --json=yes", "--json"),
            ("status --timeout-ms", "--timeout-ms"),
            ("status --json --json", "cannot be used multiple times"),
            ("status --server ,", "HOST:PORT"),
            ("stream list -x", "-x"),
            ("completions tcsh", "tcsh"),
        ] {
            match run(args) {
                Err(error) => {
                    let message = error.to_string();
                    assert!(message.contains(reason), "{args}: {message}");
                }
                Ok(cli) => panic!("{args}: {cli:?}"),
            }
        }
    }
}
