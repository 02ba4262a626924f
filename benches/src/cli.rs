//! `shoal-bench`'s command line: the grammar as clap derive types, the value parsers (clap
//! names the flag in a bad value's error), and how help and usage errors are printed. Bad
//! arguments are a usage error (exit status 2), never a panic.
//!
//! It owns the modes, their options and the defaults laid under them (`run::Options`). It never
//! connects or measures; the binary runs what [`parse`] returns.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::error::ErrorKind;
use clap::{Args, Parser, Subcommand};
use shoal_client::{Durability, FetchFrom};

use crate::replay::Form;
use crate::run::{Connect, Mode, Options, Placement};
use crate::schedule::Rate;

/// What the command line asked for.
#[derive(Debug)]
pub enum Parsed {
    /// `produce`, `consume`, `e2e` or `mixed`: a run.
    Run(Box<Run>),
    /// `compare A.json B.json`: two reports side by side.
    Compare(PathBuf, PathBuf),
    /// `loopback`: the TCP round trip a run's latency is judged against.
    Loopback(Loopback),
    /// `replay`: a `persisted` form's disk I/O alone, the engine's yardstick.
    Replay(Replay),
}

/// A run and where its reports go.
#[derive(Debug)]
pub struct Run {
    /// The run.
    pub options: Options,
    /// Where to write the JSON report.
    pub json: Option<PathBuf>,
    /// Where to write the HTML report.
    pub html: Option<PathBuf>,
}

/// Parses the arguments (the program name first). Help comes back as an error of kind
/// `DisplayHelp`; `clap::Error::exit` prints either with its exit status (0 or 2).
pub fn parse(
    args: impl IntoIterator<Item = impl Into<OsString> + Clone>,
) -> Result<Parsed, clap::Error> {
    let mut command = <Cli as clap::CommandFactory>::command();
    let mut matches = command.try_get_matches_from_mut(args)?;
    let cli = <Cli as clap::FromArgMatches>::from_arg_matches_mut(&mut matches)
        .map_err(|error| error.format(&mut command))?;
    let (mode, run) = match cli.command {
        Command::Produce(run) => (Mode::Produce, run),
        Command::Consume(run) => (Mode::Consume, run),
        Command::E2e(run) => (Mode::EndToEnd, run),
        Command::Mixed(run) => (Mode::Mixed, run),
        Command::Compare { a, b } => return Ok(Parsed::Compare(a, b)),
        Command::Loopback(loopback) => return Ok(Parsed::Loopback(loopback)),
        Command::Replay(replay) => return Ok(Parsed::Replay(replay)),
    };
    let run = run.into_run(mode);
    if mode == Mode::EndToEnd && run.options.message_bytes.0 < 8 {
        let e2e = command.find_subcommand_mut("e2e").expect("e2e is a mode");
        return Err(e2e.error(
            ErrorKind::ValueValidation,
            "--message-size: e2e stamps 8 bytes into every message; use at least 8",
        ));
    }
    Ok(Parsed::Run(Box::new(run)))
}

#[derive(Debug, Parser)]
#[command(
    max_term_width = 100,
    name = "shoal-bench",
    about = "Shoal's load tool: drives a running (or spawned) server through the client library \
             and reports throughput and latency.",
    after_help = "Exit status: 0 success, 1 the run failed, 2 bad arguments.",
    // A flag given twice counts as given last, as it always did.
    args_override_self = true
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// N producer threads send batches; reports throughput and produce→ack latency per batch
    /// (from each send's intended time when --rate is given)
    Produce(RunArgs),
    /// N consumer threads read their partitions from --from; reports throughput and poll
    /// latency
    Consume(RunArgs),
    /// Producers and consumers at once; reports end-to-end latency per message (consumed −
    /// produced, from a send-time stamp in each message of at least 8 bytes)
    E2e(RunArgs),
    /// --producers and --consumers at once on the same partitions (their ratio is the mix);
    /// reports the producers' throughput and latency and the consumers' beside them
    Mixed(RunArgs),
    /// Two --json reports side by side, with B / A ratios
    Compare {
        /// The first report (A)
        #[arg(value_name = "A.json")]
        a: PathBuf,
        /// The second report (B)
        #[arg(value_name = "B.json")]
        b: PathBuf,
    },
    /// TCP round trips of a BYTES request and a small reply between two threads (the same-size
    /// round trip a benchmark's latency is judged against); one JSON line
    Loopback(Loopback),
    /// The writes and the sync one `persisted` form of the engine issues per acknowledged round
    /// (direct: one partition's 64 KiB append; journal: a 64 x 16 KiB cycle), replayed alone
    /// into pre-written files under --dir; one JSON line
    Replay(Replay),
}

/// `replay`'s options.
#[derive(Args, Clone, Debug, PartialEq)]
pub struct Replay {
    /// direct or journal
    #[arg(long, value_name = "FORM", value_parser = replay_form)]
    pub form: Form,
    /// Where the replay's files go (removed after)
    #[arg(long, value_name = "DIR")]
    pub dir: PathBuf,
    /// Seconds replayed
    #[arg(long, value_name = "SECS", default_value = "10", value_parser = seconds)]
    pub seconds: Duration,
    /// Data bytes per file, written over and over
    #[arg(long, value_name = "BYTES", default_value = "67108864", value_parser = at_least_one)]
    pub wrap_bytes: usize,
    /// Rounds in flight at once, each with its own sync (journal form; 1 for direct)
    #[arg(long, value_name = "N", default_value = "1", value_parser = clap::value_parser!(u64).range(1..=8))]
    pub in_flight: u64,
    /// Files the journal form's segment writes go to, one per round in turn (64: the layout of
    /// 64 groups under retention)
    #[arg(long, value_name = "N", default_value = "1", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub segment_files: u64,
    /// Rounds between the journal form's checkpoints (sync every segment file, then the
    /// superblock's copies one by one); 0 for none
    #[arg(long, value_name = "N", default_value = "0")]
    pub checkpoint_rounds: u64,
}

/// `loopback`'s options.
#[derive(Args, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Loopback {
    /// Request size in bytes
    #[arg(long, value_name = "BYTES", default_value = "1048576", value_parser = at_least_one)]
    pub size: usize,
    /// Round trips measured
    #[arg(long, value_name = "N", default_value = "2000", value_parser = at_least_one)]
    pub samples: usize,
    /// CPUs of the server and the client thread (default: not pinned)
    #[arg(long, value_name = "SERVER,CLIENT", value_parser = cpu_pair)]
    pub cpus: Option<(usize, usize)>,
}

/// The options of a run; `None` keeps `run::Options`'s default, which the help text names.
#[derive(Args, Debug)]
struct RunArgs {
    /// Server address(es), comma-separated (default 127.0.0.1:7070)
    // `::std::vec::Vec`: one value holding the whole list, not one value per occurrence.
    #[arg(long, value_name = "ADDRS", value_parser = servers)]
    server: Option<::std::vec::Vec<String>>,
    /// Start a local shoal with this config for the run, stop it after
    #[arg(long, value_name = "CONFIG")]
    spawn_server: Option<PathBuf>,
    /// Start a local cluster of N nodes for the run (with --spawn-server's config, if given;
    /// each node's shards pinned in turn over the machine's CPUs), stop it after
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=9))]
    spawn_cluster: Option<u8>,
    /// Producer actors, one thread and connection each (default 1)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    producers: Option<usize>,
    /// Consumer actors (consume, e2e, mixed; default 1)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    consumers: Option<usize>,
    /// Where consumers start in consume (default first)
    #[arg(long, value_name = "first|last|OFFSET", value_parser = fetch_from)]
    from: Option<FetchFrom>,
    /// Consumers join consumer group NAME of their topic and poll their share of its partitions
    /// from the group's stored offsets, auto-committing (a new group starts at the first
    /// message)
    #[arg(long, value_name = "NAME")]
    group: Option<String>,
    /// Bytes per poll at most (default 1048576)
    #[arg(long, value_name = "B")]
    fetch_bytes: Option<u32>,
    /// Messages per poll at most (default 10000)
    #[arg(long, value_name = "N")]
    fetch_count: Option<u32>,
    /// Streams the producers spread over (default 1)
    #[arg(long, value_name = "N")]
    streams: Option<usize>,
    /// Topics per stream (default 1)
    #[arg(long, value_name = "N")]
    topics: Option<usize>,
    /// Partitions per topic (default: the producers per topic)
    #[arg(long, value_name = "N")]
    partitions: Option<u32>,
    /// pinned (a partition per producer), balanced or keyed (default pinned)
    #[arg(long, value_name = "P", value_parser = placement)]
    placement: Option<Placement>,
    /// any: every actor connects to the server address (the kernel spreads connections over
    /// the shards; requests for another shard's partition are forwarded) or owner: to the own
    /// listener of the shard owning its partition (needs [network] shard_listen; default any)
    #[arg(long, value_name = "C", value_parser = connect)]
    connect: Option<Connect>,
    /// Message payload bytes (default 1000)
    #[arg(long, value_name = "B|MIN..MAX", value_parser = message_size)]
    message_size: Option<(usize, usize)>,
    /// Messages per produce request (default 1000)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    messages_per_batch: Option<usize>,
    /// Measured seconds after warm-up (default 10)
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    duration: Option<Duration>,
    /// Stop after N messages in all (default: no limit)
    #[arg(long, value_name = "N")]
    messages: Option<u64>,
    /// Open-loop rate over all producers: e.g. 200MB/s or 50000msg/s
    #[arg(long, value_name = "R", value_parser = Rate::parse)]
    rate: Option<Rate>,
    /// replicated or persisted, for the topics created (default replicated)
    #[arg(long, value_name = "D")]
    durability: Option<Durability>,
    /// Size-based retention per partition of the topics created, in bytes (default: the
    /// server's); a run that writes more than the disk holds needs it
    #[arg(long, value_name = "B")]
    retention_bytes: Option<u64>,
    /// Batches in flight per producer (default 8)
    #[arg(long, value_name = "N", value_parser = at_least_one)]
    in_flight: Option<usize>,
    /// Seconds sent but not measured first (default 1)
    #[arg(long, value_name = "SECS", value_parser = seconds)]
    warmup: Option<Duration>,
    /// CPUs of the actor threads, producers first (default: not pinned)
    #[arg(long, value_name = "LIST", value_parser = cpus)]
    cpus: Option<::std::vec::Vec<usize>>,
    /// Stream names are NAME-0, NAME-1, ... (default bench)
    #[arg(long, value_name = "NAME")]
    stream_prefix: Option<String>,
    /// Write the full report as JSON
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write a self-contained report page with charts (opens offline)
    #[arg(long, value_name = "FILE")]
    html: Option<PathBuf>,
    /// No progress line
    #[arg(long)]
    quiet: bool,
}

impl RunArgs {
    /// The run in `mode`: every option given laid over `Options::default()`.
    fn into_run(self, mode: Mode) -> Run {
        let mut options = Options { mode, ..Options::default() };
        options.seeds = self.server.unwrap_or(options.seeds);
        options.spawn_server = self.spawn_server;
        options.spawn_cluster = self.spawn_cluster;
        options.producers = self.producers.unwrap_or(options.producers);
        options.consumers = self.consumers.unwrap_or(options.consumers);
        options.from = self.from.unwrap_or(options.from);
        options.group = self.group;
        options.fetch_bytes_max = self.fetch_bytes.unwrap_or(options.fetch_bytes_max);
        options.fetch_count_max = self.fetch_count.unwrap_or(options.fetch_count_max);
        options.streams = self.streams.unwrap_or(options.streams);
        options.topics = self.topics.unwrap_or(options.topics);
        options.partitions = self.partitions.unwrap_or(options.partitions);
        options.placement = self.placement.unwrap_or(options.placement);
        options.connect = self.connect.unwrap_or(options.connect);
        options.message_bytes = self.message_size.unwrap_or(options.message_bytes);
        options.messages_per_batch = self.messages_per_batch.unwrap_or(options.messages_per_batch);
        options.duration = self.duration.unwrap_or(options.duration);
        options.messages = self.messages.unwrap_or(options.messages);
        options.rate = self.rate;
        options.durability = self.durability.unwrap_or(options.durability);
        options.retention_bytes = self.retention_bytes;
        options.in_flight_max = self.in_flight.unwrap_or(options.in_flight_max);
        options.warmup = self.warmup.unwrap_or(options.warmup);
        options.cpus = self.cpus.unwrap_or(options.cpus);
        options.stream_prefix = self.stream_prefix.unwrap_or(options.stream_prefix);
        options.progress = !self.quiet;
        Run { options, json: self.json, html: self.html }
    }
}

fn whole<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value.parse().map_err(|_| "not a whole number".to_string())
}

fn at_least_one(value: &str) -> Result<usize, String> {
    match whole(value)? {
        0 => Err("must be at least 1".into()),
        n => Ok(n),
    }
}

fn seconds(value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| "a number of seconds".into())
}

fn servers(list: &str) -> Result<Vec<String>, String> {
    Ok(list.split(',').map(str::to_string).collect())
}

fn fetch_from(value: &str) -> Result<FetchFrom, String> {
    match value {
        "first" => Ok(FetchFrom::First),
        "last" => Ok(FetchFrom::Last),
        offset => whole(offset).map(FetchFrom::Offset),
    }
}

fn placement(value: &str) -> Result<Placement, String> {
    match value {
        "pinned" => Ok(Placement::Pinned),
        "balanced" => Ok(Placement::Balanced),
        "keyed" => Ok(Placement::Keyed),
        _ => Err("pinned, balanced or keyed".into()),
    }
}

fn connect(value: &str) -> Result<Connect, String> {
    match value {
        "any" => Ok(Connect::Any),
        "owner" => Ok(Connect::Owner),
        _ => Err("any or owner".into()),
    }
}

fn message_size(value: &str) -> Result<(usize, usize), String> {
    let (low, high) = match value.split_once("..") {
        Some((low, high)) => (whole(low)?, whole(high)?),
        None => {
            let size = whole(value)?;
            (size, size)
        }
    };
    if low > high {
        return Err("MIN above MAX".into());
    }
    Ok((low, high))
}

fn cpus(list: &str) -> Result<Vec<usize>, String> {
    list.split(',').map(|cpu| whole(cpu.trim())).collect()
}

fn replay_form(value: &str) -> Result<Form, String> {
    Form::parse(value).ok_or_else(|| "direct or journal".into())
}

fn cpu_pair(value: &str) -> Result<(usize, usize), String> {
    match value.split_once(',').map(|(a, b)| (a.parse(), b.parse())) {
        Some((Ok(server), Ok(client))) => Ok((server, client)),
        _ => Err("two CPU numbers, SERVER,CLIENT".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<Parsed, clap::Error> {
        parse(["shoal-bench"].into_iter().chain(text.split_whitespace()))
    }

    fn options(text: &str) -> Run {
        match run(text) {
            Ok(Parsed::Run(run)) => *run,
            other => panic!("{text}: {other:?}"),
        }
    }

    #[test]
    fn cli_parses_a_full_produce_command() {
        let command = options(
            "produce --producers 2 --message-size 100..200 --rate 50MB/s --durability persisted \
             --cpus 1,0 --json out.json --placement keyed --connect owner --quiet",
        );
        assert_eq!(command.options.producers, 2);
        assert_eq!(command.options.message_bytes, (100, 200));
        assert_eq!(command.options.rate, Some(Rate::MegabytesPerSecond(50.0)));
        assert_eq!(command.options.durability, Durability::Persisted);
        assert_eq!(command.options.cpus, [1, 0]);
        assert_eq!(command.options.placement, Placement::Keyed);
        assert_eq!(command.options.connect, Connect::Owner);
        assert!(!command.options.progress);
        assert_eq!(command.json, Some(PathBuf::from("out.json")));
        // What is not given keeps the run's default; a flag given twice counts as given last.
        let defaults = Options::default();
        let command = options("mixed --server a:1,b:2 --duration 0.5 --streams 2 --streams 3");
        assert_eq!(command.options.mode, Mode::Mixed);
        assert_eq!(command.options.seeds, ["a:1", "b:2"]);
        assert_eq!(command.options.duration, Duration::from_millis(500));
        assert_eq!(command.options.streams, 3);
        assert_eq!(command.options.producers, defaults.producers);
        assert_eq!(command.options.message_bytes, defaults.message_bytes);
        assert!(command.options.progress);
    }

    #[test]
    fn cli_parses_compare_and_loopback() {
        match run("compare a.json b.json") {
            Ok(Parsed::Compare(a, b)) => {
                assert_eq!((a, b), (PathBuf::from("a.json"), PathBuf::from("b.json")));
            }
            other => panic!("{other:?}"),
        }
        match run("loopback --size 4096 --cpus 2,3") {
            Ok(Parsed::Loopback(loopback)) => {
                assert_eq!(loopback, Loopback { size: 4096, samples: 2000, cpus: Some((2, 3)) })
            }
            other => panic!("{other:?}"),
        }
        assert!(run("compare a.json").is_err());
        assert!(run("loopback --size 0").is_err());
        assert!(run("loopback --cpus 1").is_err());
        match run("replay --form journal --dir /tmp/x --seconds 2 --in-flight 3") {
            Ok(Parsed::Replay(replay)) => assert_eq!(
                replay,
                Replay {
                    form: Form::Journal,
                    dir: "/tmp/x".into(),
                    seconds: Duration::from_secs(2),
                    wrap_bytes: 64 << 20,
                    in_flight: 3,
                    segment_files: 1,
                    checkpoint_rounds: 0,
                }
            ),
            other => panic!("{other:?}"),
        }
        match run("replay --form journal --dir /tmp/x --segment-files 64 --checkpoint-rounds 128") {
            Ok(Parsed::Replay(replay)) => {
                assert_eq!((replay.segment_files, replay.checkpoint_rounds), (64, 128))
            }
            other => panic!("{other:?}"),
        }
        assert!(run("replay --form journal --dir /tmp/x --segment-files 0").is_err());
        assert!(run("replay --form filesystem --dir /tmp/x").is_err());
        assert!(run("replay --form journal --dir /tmp/x --in-flight 9").is_err());
    }

    #[test]
    fn cli_bad_arguments_name_the_flag() {
        for (text, flag) in [
            ("produce --producers x", "--producers"),
            ("produce --producers 0", "--producers"),
            ("produce --message-size 9..3", "--message-size"),
            ("produce --rate fast", "--rate"),
            ("produce --durability maybe", "--durability"),
            ("produce --duration", "--duration"),
            ("produce --bogus 1", "--bogus"),
            ("consume-all", "consume-all"),
            ("consume --from nowhere", "--from"),
            ("produce --connect nearest", "--connect"),
        ] {
            let error = run(text).unwrap_err().to_string();
            assert!(error.contains(flag), "{text}: {error}");
        }
        assert_eq!(run("--help").unwrap_err().kind(), ErrorKind::DisplayHelp);
        let e2e = run("e2e --message-size 4").unwrap_err().to_string();
        assert!(e2e.contains("--message-size"), "{e2e}");
        let consume = options("consume --consumers 3 --from 42");
        assert_eq!(consume.options.mode, Mode::Consume);
        assert_eq!(consume.options.from, FetchFrom::Offset(42));
    }
}
