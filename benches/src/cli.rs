//! `shoal-bench`'s arguments: parsing and the usage text. Bad arguments are an error naming the
//! flag, never a panic.

use std::path::PathBuf;
use std::time::Duration;

use shoal_client::FetchFrom;

use crate::run::{Connect, Mode, Options, Placement};
use crate::schedule::Rate;

/// The usage text.
pub const USAGE: &str = "\
usage: shoal-bench produce|consume|e2e|mixed [options]
       shoal-bench compare A.json B.json
       shoal-bench loopback --size BYTES [--samples N] [--cpus SERVER,CLIENT]

  produce   N producer threads send batches; reports throughput and produce→ack latency per
            batch (from each send's intended time when --rate is given)
  consume   N consumer threads read their partitions from --from; reports throughput and poll
            latency
  e2e       producers and consumers at once; reports end-to-end latency per message (consumed
            − produced, from a send-time stamp in each message of at least 8 bytes)
  mixed     --producers and --consumers at once on the same partitions (their ratio is the
            mix); reports the producers' throughput and latency and the consumers' beside them
  compare   two --json reports side by side, with B / A ratios
  loopback  TCP round trips of a BYTES request and a small reply between two threads (the
            same-size round trip a benchmark's latency is judged against); one JSON line

options:
  --server ADDRS             server address(es), comma-separated (default 127.0.0.1:7070)
  --spawn-server CONFIG      start a local shoal with this config for the run, stop it after
  --producers N              producer actors, one thread and connection each (default 1)
  --consumers N              consumer actors (consume, e2e, mixed; default 1)
  --from first|last|OFFSET   where consumers start in consume (default first)
  --group NAME               consumers join consumer group NAME of their topic and poll their
                             share of its partitions from the group's stored offsets, auto-
                             committing (a new group starts at the first message)
  --fetch-bytes B            bytes per poll at most (default 1048576)
  --fetch-count N            messages per poll at most (default 10000)
  --streams N                streams the producers spread over (default 1)
  --topics N                 topics per stream (default 1)
  --partitions N             partitions per topic (default: the producers per topic)
  --placement P              pinned (a partition per producer), balanced or keyed (default pinned)
  --connect C                any: every actor connects to the server address (the kernel spreads
                             connections over the shards; requests for another shard's partition
                             are forwarded) or owner: to the own listener of the shard owning its
                             partition (needs [network] shard_listen; default any)
  --message-size B|MIN..MAX  message payload bytes (default 1000)
  --messages-per-batch N     messages per produce request (default 1000)
  --duration SECS            measured seconds after warm-up (default 10)
  --messages N               stop after N messages in all (default: no limit)
  --rate R                   open-loop rate over all producers: e.g. 200MB/s or 50000msg/s
  --durability D             replicated or persisted, for the topics created (default replicated)
  --in-flight N              batches in flight per producer (default 8)
  --warmup SECS              seconds sent but not measured first (default 1)
  --cpus LIST                CPUs of the actor threads, producers first (default: not pinned)
  --stream-prefix NAME       stream names are NAME-0, NAME-1, ... (default bench)
  --json FILE                write the full report as JSON
  --html FILE                write a self-contained report page with charts (opens offline)
  --quiet                    no progress line

Exit status: 0 success, 1 the run failed, 2 bad arguments.
";

/// What the command line asked for.
#[derive(Debug)]
pub struct Command {
    /// The run.
    pub options: Options,
    /// Where to write the JSON report.
    pub json: Option<PathBuf>,
    /// Where to write the HTML report.
    pub html: Option<PathBuf>,
}

fn seconds(flag: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .filter(|v| v.is_finite() && *v >= 0.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| format!("{flag} {value}: a number of seconds"))
}

fn count<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, String> {
    value.parse().map_err(|_| format!("{flag} {value}: a whole number"))
}

/// Parses the arguments after the program name. `Ok(None)`: help was asked for.
pub fn parse(words: &[String]) -> Result<Option<Command>, String> {
    let mut words = words.iter();
    let mode = match words.next().map(String::as_str) {
        Some("produce") => Mode::Produce,
        Some("consume") => Mode::Consume,
        Some("e2e") => Mode::EndToEnd,
        Some("mixed") => Mode::Mixed,
        Some("-h" | "--help") | None => return Ok(None),
        Some(other) => {
            return Err(format!("unknown mode {other:?}: produce, consume, e2e or mixed"));
        }
    };
    let mut options = Options { mode, ..Options::default() };
    let mut json = None;
    let mut html = None;
    while let Some(flag) = words.next() {
        match flag.as_str() {
            "-h" | "--help" => return Ok(None),
            "--quiet" => {
                options.progress = false;
                continue;
            }
            _ => {}
        }
        let value = words.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--server" => options.seeds = value.split(',').map(str::to_string).collect(),
            "--spawn-server" => options.spawn_server = Some(PathBuf::from(value)),
            "--producers" => options.producers = count(flag, value)?,
            "--consumers" => options.consumers = count(flag, value)?,
            "--from" => {
                options.from = match value.as_str() {
                    "first" => FetchFrom::First,
                    "last" => FetchFrom::Last,
                    offset => FetchFrom::Offset(count(flag, offset)?),
                }
            }
            "--group" => options.group = Some(value.clone()),
            "--fetch-bytes" => options.fetch_bytes_max = count(flag, value)?,
            "--fetch-count" => options.fetch_count_max = count(flag, value)?,
            "--streams" => options.streams = count(flag, value)?,
            "--topics" => options.topics = count(flag, value)?,
            "--partitions" => options.partitions = count(flag, value)?,
            "--placement" => {
                options.placement = match value.as_str() {
                    "pinned" => Placement::Pinned,
                    "balanced" => Placement::Balanced,
                    "keyed" => Placement::Keyed,
                    other => return Err(format!("--placement {other}: pinned, balanced or keyed")),
                }
            }
            "--connect" => {
                options.connect = match value.as_str() {
                    "any" => Connect::Any,
                    "owner" => Connect::Owner,
                    other => return Err(format!("--connect {other}: any or owner")),
                }
            }
            "--message-size" => {
                options.message_bytes = match value.split_once("..") {
                    Some((low, high)) => (count(flag, low)?, count(flag, high)?),
                    None => {
                        let size = count(flag, value)?;
                        (size, size)
                    }
                };
                if options.message_bytes.0 > options.message_bytes.1 {
                    return Err(format!("--message-size {value}: MIN above MAX"));
                }
            }
            "--messages-per-batch" => options.messages_per_batch = count(flag, value)?,
            "--duration" => options.duration = seconds(flag, value)?,
            "--messages" => options.messages = count(flag, value)?,
            "--rate" => options.rate = Some(Rate::parse(value)?),
            "--durability" => {
                options.durability =
                    value.parse().map_err(|error| format!("--durability: {error}"))?;
            }
            "--in-flight" => options.in_flight_max = count(flag, value)?,
            "--warmup" => options.warmup = seconds(flag, value)?,
            "--cpus" => {
                options.cpus = value
                    .split(',')
                    .map(|cpu| count(flag, cpu.trim()))
                    .collect::<Result<_, _>>()?;
            }
            "--stream-prefix" => options.stream_prefix = value.clone(),
            "--json" => json = Some(PathBuf::from(value)),
            "--html" => html = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if options.producers == 0
        || options.consumers == 0
        || options.messages_per_batch == 0
        || options.in_flight_max == 0
    {
        return Err(
            "--producers, --consumers, --messages-per-batch and --in-flight must be at least 1"
                .into(),
        );
    }
    if mode == Mode::EndToEnd && options.message_bytes.0 < 8 {
        return Err("--message-size: e2e stamps 8 bytes into every message; use at least 8".into());
    }
    Ok(Some(Command { options, json, html }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_client::Durability;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn cli_parses_a_full_produce_command() {
        let command = parse(&words(
            "produce --producers 2 --message-size 100..200 --rate 50MB/s --durability persisted \
             --cpus 1,0 --json out.json --placement keyed --connect owner --quiet",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(command.options.producers, 2);
        assert_eq!(command.options.message_bytes, (100, 200));
        assert_eq!(command.options.rate, Some(Rate::MegabytesPerSecond(50.0)));
        assert_eq!(command.options.durability, Durability::Persisted);
        assert_eq!(command.options.cpus, [1, 0]);
        assert_eq!(command.options.placement, Placement::Keyed);
        assert_eq!(command.options.connect, Connect::Owner);
        assert!(!command.options.progress);
        assert_eq!(command.json, Some(PathBuf::from("out.json")));
    }

    #[test]
    fn cli_bad_arguments_name_the_flag() {
        for (text, flag) in [
            ("produce --producers x", "--producers"),
            ("produce --message-size 9..3", "--message-size"),
            ("produce --rate fast", "--rate"),
            ("produce --durability maybe", "--durability"),
            ("produce --duration", "--duration"),
            ("produce --bogus 1", "--bogus"),
            ("consume-all", "consume-all"),
            ("consume --from nowhere", "--from"),
            ("produce --connect nearest", "--connect"),
        ] {
            let error = parse(&words(text)).unwrap_err();
            assert!(error.contains(flag), "{text}: {error}");
        }
        assert!(parse(&words("--help")).unwrap().is_none());
        let e2e = parse(&words("e2e --message-size 4")).unwrap_err();
        assert!(e2e.contains("--message-size"), "{e2e}");
        let consume = parse(&words("consume --consumers 3 --from 42")).unwrap().unwrap();
        assert_eq!(consume.options.mode, Mode::Consume);
        assert_eq!(consume.options.from, FetchFrom::Offset(42));
    }
}
