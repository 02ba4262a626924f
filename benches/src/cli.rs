//! `shoal-bench`'s arguments: parsing and the usage text. Bad arguments are an error naming the
//! flag, never a panic.

use std::path::PathBuf;
use std::time::Duration;

use shoal_client::Durability;

use crate::run::{Placement, ProduceOptions};
use crate::schedule::Rate;

/// The usage text.
pub const USAGE: &str = "\
usage: shoal-bench produce [options]

Sends batches to a Shoal server from N producer threads and reports throughput and
produce→ack latency (measured from each send's intended time when --rate is given).

options:
  --server ADDRS             server address(es), comma-separated (default 127.0.0.1:7070)
  --spawn-server CONFIG      start a local shoal with this config for the run, stop it after
  --producers N              producer actors, one thread and connection each (default 1)
  --streams N                streams the producers spread over (default 1)
  --topics N                 topics per stream (default 1)
  --partitions N             partitions per topic (default: the producers per topic)
  --placement P              pinned (a partition per producer), balanced or keyed (default pinned)
  --message-size B|MIN..MAX  message payload bytes (default 1000)
  --messages-per-batch N     messages per produce request (default 1000)
  --duration SECS            measured seconds after warm-up (default 10)
  --messages N               stop after N messages in all (default: no limit)
  --rate R                   open-loop rate over all producers: e.g. 200MB/s or 50000msg/s
  --durability D             replicated or persisted, for the topics created (default replicated)
  --in-flight N              batches in flight per producer (default 8)
  --warmup SECS              seconds sent but not measured first (default 1)
  --cpus LIST                CPUs of the producer threads, comma-separated (default: not pinned)
  --stream-prefix NAME       stream names are NAME-0, NAME-1, ... (default bench)
  --json FILE                write the full report as JSON
  --quiet                    no progress line

Exit status: 0 success, 1 the run failed, 2 bad arguments.
";

/// What the command line asked for.
#[derive(Debug)]
pub struct Command {
    /// The run.
    pub produce: ProduceOptions,
    /// Where to write the JSON report.
    pub json: Option<PathBuf>,
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
    match words.next().map(String::as_str) {
        Some("produce") => {}
        Some("-h" | "--help") | None => return Ok(None),
        Some(other) => return Err(format!("unknown mode {other:?} (this build has: produce)")),
    }
    let mut options = ProduceOptions::default();
    let mut json = None;
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
                options.durability = match value.as_str() {
                    "replicated" => Durability::Replicated,
                    "persisted" => Durability::Persisted,
                    other => return Err(format!("--durability {other}: replicated or persisted")),
                }
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
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if options.producers == 0 || options.messages_per_batch == 0 || options.in_flight_max == 0 {
        return Err("--producers, --messages-per-batch and --in-flight must be at least 1".into());
    }
    Ok(Some(Command { produce: options, json }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<String> {
        text.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn cli_parses_a_full_produce_command() {
        let command = parse(&words(
            "produce --producers 2 --message-size 100..200 --rate 50MB/s --durability persisted \
             --cpus 1,0 --json out.json --placement keyed --quiet",
        ))
        .unwrap()
        .unwrap();
        assert_eq!(command.produce.producers, 2);
        assert_eq!(command.produce.message_bytes, (100, 200));
        assert_eq!(command.produce.rate, Some(Rate::MegabytesPerSecond(50.0)));
        assert_eq!(command.produce.durability, Durability::Persisted);
        assert_eq!(command.produce.cpus, [1, 0]);
        assert_eq!(command.produce.placement, Placement::Keyed);
        assert!(!command.produce.progress);
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
        ] {
            let error = parse(&words(text)).unwrap_err();
            assert!(error.contains(flag), "{text}: {error}");
        }
        assert!(parse(&words("--help")).unwrap().is_none());
    }
}
