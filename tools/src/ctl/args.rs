//! `shoalctl`'s command line: the usage text and the parser from arguments to a [`Cli`].
//!
//! It owns the grammar (commands, positional arguments, options and their value syntax) and
//! every usage error's wording. It never connects, reads stdin or prints: a usage error is
//! returned to `main`, which prints it with the usage text and exits 2.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;

use shoal_client::{Durability, FetchFrom};

/// The usage text, printed with `--help` and after every usage error.
pub const USAGE: &str =
    "usage: shoalctl [--server HOST:PORT[,HOST:PORT...]] [--json] [--timeout-ms MS] COMMAND

Administers a Shoal server and produces or consumes messages over the native protocol.

commands:
  stream create NAME
  stream list
  stream delete NAME
  topic create STREAM TOPIC --partitions N --durability replicated|persisted
               [--retention-bytes B] [--retention-ms MS] [--segment-size-bytes B]
               [--message-size-bytes-max B]
  topic list STREAM
  topic describe STREAM TOPIC
  topic delete STREAM TOPIC
  produce STREAM TOPIC [--partition P] [--key K]
      one message per stdin line (the value); prints `PARTITION OFFSET` for each message as
      soon as it is acknowledged. Without --partition or --key the server balances.
  consume STREAM TOPIC --partition P --from first|last|OFFSET|time:MS [--count N] [--follow]
               [--format value|offset|json]
      one message per line; stops at the log end (or after N messages) unless --follow.
  consume STREAM TOPIC --group G [--count N] [--follow] [--format value|offset|json]
      as a member of consumer group G: its share of the partitions, from the group's stored
      offsets (the first message where none is stored), each offset stored once its messages
      are printed (at-least-once); leaves the group at the end. --format offset prints
      PARTITION, OFFSET and VALUE.
  status
      shards, partitions per shard, disk usage and per-partition offsets.

options:
  --server ADDRS    server address(es), tried in turn (default 127.0.0.1:7070)
  --json            print JSON instead of text
  --timeout-ms MS   longest wait for one reply (default 10000)
  -h, --help        print this help

exit status: 0 success, 1 error (the server's error code is printed), 2 usage error";

/// A parsed command line.
#[derive(Clone, Debug, PartialEq)]
pub struct Cli {
    /// Server addresses, tried in turn.
    pub servers: Vec<String>,
    /// JSON output.
    pub json: bool,
    /// Longest wait for one reply.
    pub timeout_ms: u64,
    /// What to do.
    pub command: Command,
}

/// A `shoalctl` command with its arguments.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// `stream create NAME`
    StreamCreate { name: String },
    /// `stream list`
    StreamList,
    /// `stream delete NAME`
    StreamDelete { name: String },
    /// `topic create ...`
    TopicCreate {
        stream: String,
        topic: String,
        partitions: u32,
        durability: Durability,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
        segment_size_bytes: Option<u64>,
        message_size_bytes_max: Option<u64>,
    },
    /// `topic list STREAM`
    TopicList { stream: String },
    /// `topic describe STREAM TOPIC`
    TopicDescribe { stream: String, topic: String },
    /// `topic delete STREAM TOPIC`
    TopicDelete { stream: String, topic: String },
    /// `produce STREAM TOPIC [--partition P] [--key K]`
    Produce { stream: String, topic: String, partition: Option<u32>, key: Option<String> },
    /// `consume ...`
    Consume(Consume),
    /// `status`
    Status,
}

/// What `consume` was asked for (run by `commands`).
#[derive(Clone, Debug, PartialEq)]
pub struct Consume {
    pub stream: String,
    pub topic: String,
    /// Consume as a member of this consumer group (then `partition` and `from` are unused).
    pub group: Option<String>,
    pub partition: u32,
    pub from: FetchFrom,
    pub count: Option<u64>,
    pub follow: bool,
    pub format: Format,
}

/// How `consume` prints a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The value alone.
    Value,
    /// `OFFSET<TAB>VALUE`.
    Offset,
    /// One JSON object per message.
    Json,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// Run a command.
    Run(Cli),
    /// Print the usage text and exit 0.
    Help,
}

/// A command line that does not parse; `main` prints it with [`USAGE`] and exits 2.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

impl fmt::Display for UsageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn usage<T>(message: impl Into<String>) -> Result<T, UsageError> {
    Err(UsageError(message.into()))
}

/// Options that take no value.
const FLAGS: [&str; 3] = ["--json", "--follow", "--help"];
/// Options every command accepts.
const GLOBAL: [&str; 3] = ["--server", "--json", "--timeout-ms"];

/// Parses `shoalctl`'s arguments (without the program name).
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Parsed, UsageError> {
    let mut positional = Vec::new();
    let mut options: BTreeMap<String, String> = BTreeMap::new();
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let Some(arg) = arg.to_str().map(str::to_string) else {
            return usage(format!("argument {arg:?} is not UTF-8"));
        };
        if arg == "-h" || arg == "--help" {
            return Ok(Parsed::Help);
        }
        if arg == "--" {
            for rest in args.by_ref() {
                match rest.into_string() {
                    Ok(rest) => positional.push(rest),
                    Err(rest) => return usage(format!("argument {rest:?} is not UTF-8")),
                }
            }
            break;
        }
        if !arg.starts_with("--") || arg.len() == 2 {
            if arg.starts_with('-') && arg.len() > 1 && arg.parse::<i64>().is_err() {
                return usage(format!("unknown option {arg}"));
            }
            positional.push(arg);
            continue;
        }
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => (arg, None),
        };
        let value = if FLAGS.contains(&name.as_str()) {
            if inline_value.is_some() {
                return usage(format!("{name} takes no value"));
            }
            String::new()
        } else if let Some(value) = inline_value {
            value
        } else {
            match args.next().map(OsString::into_string) {
                Some(Ok(value)) => value,
                Some(Err(value)) => return usage(format!("{name} value {value:?} is not UTF-8")),
                None => return usage(format!("{name} needs a value")),
            }
        };
        if options.insert(name.clone(), value).is_some() {
            return usage(format!("{name} given twice"));
        }
    }

    let servers = match options.get("--server") {
        Some(list) => {
            let servers: Vec<String> = list
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            if servers.is_empty() {
                return usage("--server needs at least one HOST:PORT");
            }
            servers
        }
        None => vec!["127.0.0.1:7070".to_string()],
    };
    let timeout_ms = match options.get("--timeout-ms") {
        Some(value) => number::<u64>("--timeout-ms", value)?.max(1),
        None => 10_000,
    };
    let json = options.contains_key("--json");

    let words: Vec<&str> = positional.iter().map(String::as_str).collect();
    let (command, allowed): (Command, &[&str]) = match words.as_slice() {
        [] => return usage("no command given"),
        ["stream", "create", name] => (Command::StreamCreate { name: name.to_string() }, &[]),
        ["stream", "list"] => (Command::StreamList, &[]),
        ["stream", "delete", name] => (Command::StreamDelete { name: name.to_string() }, &[]),
        ["topic", "create", stream, topic] => {
            let partitions = match options.get("--partitions") {
                Some(value) => number::<u32>("--partitions", value)?,
                None => return usage("topic create needs --partitions N"),
            };
            if partitions == 0 {
                return usage("--partitions must be at least 1");
            }
            let durability: Durability = match options.get("--durability") {
                Some(name) => {
                    name.parse().map_err(|error| UsageError(format!("--durability: {error}")))?
                }
                None => return usage("topic create needs --durability replicated|persisted"),
            };
            let optional = |name: &str| -> Result<Option<u64>, UsageError> {
                options.get(name).map(|value| number::<u64>(name, value)).transpose()
            };
            (
                Command::TopicCreate {
                    stream: stream.to_string(),
                    topic: topic.to_string(),
                    partitions,
                    durability,
                    retention_bytes: optional("--retention-bytes")?,
                    retention_ms: optional("--retention-ms")?,
                    segment_size_bytes: optional("--segment-size-bytes")?,
                    message_size_bytes_max: optional("--message-size-bytes-max")?,
                },
                &[
                    "--partitions",
                    "--durability",
                    "--retention-bytes",
                    "--retention-ms",
                    "--segment-size-bytes",
                    "--message-size-bytes-max",
                ],
            )
        }
        ["topic", "list", stream] => (Command::TopicList { stream: stream.to_string() }, &[]),
        ["topic", "describe", stream, topic] => {
            (Command::TopicDescribe { stream: stream.to_string(), topic: topic.to_string() }, &[])
        }
        ["topic", "delete", stream, topic] => {
            (Command::TopicDelete { stream: stream.to_string(), topic: topic.to_string() }, &[])
        }
        ["produce", stream, topic] => (
            Command::Produce {
                stream: stream.to_string(),
                topic: topic.to_string(),
                partition: options
                    .get("--partition")
                    .map(|value| number::<u32>("--partition", value))
                    .transpose()?,
                key: options.get("--key").cloned(),
            },
            &["--partition", "--key"],
        ),
        ["consume", stream, topic] => {
            let group = options.get("--group").cloned();
            let (partition, from) =
                match (&group, options.get("--partition"), options.get("--from")) {
                    (Some(_), None, None) => (0, FetchFrom::First),
                    (Some(_), _, _) => {
                        return usage(
                            "consume --group takes its partitions and offsets from the group",
                        );
                    }
                    (None, Some(partition), Some(from)) => {
                        (number::<u32>("--partition", partition)?, parse_from(from)?)
                    }
                    (None, None, _) => return usage("consume needs --partition P (or --group G)"),
                    (None, _, None) => {
                        return usage("consume needs --from first|last|OFFSET|time:MS");
                    }
                };
            let format = match options.get("--format").map(String::as_str) {
                Some("value") => Format::Value,
                Some("offset") => Format::Offset,
                Some("json") => Format::Json,
                Some(other) => {
                    return usage(format!("--format {other:?}: use value, offset or json"));
                }
                None if json => Format::Json,
                None => Format::Value,
            };
            (
                Command::Consume(Consume {
                    stream: stream.to_string(),
                    topic: topic.to_string(),
                    group,
                    partition,
                    from,
                    count: options
                        .get("--count")
                        .map(|value| number::<u64>("--count", value))
                        .transpose()?,
                    follow: options.contains_key("--follow"),
                    format,
                }),
                &["--partition", "--from", "--group", "--count", "--follow", "--format"],
            )
        }
        ["status"] => (Command::Status, &[]),
        [command @ ("stream" | "topic"), rest @ ..] => {
            return usage(match rest.first() {
                None => format!("`{command}` needs a subcommand"),
                Some(sub) => format!("`{command} {sub}` with these arguments is not a command"),
            });
        }
        [command @ ("produce" | "consume"), ..] => {
            return usage(format!("`{command}` takes STREAM TOPIC"));
        }
        ["status", ..] => return usage("`status` takes no arguments"),
        [other, ..] => return usage(format!("unknown command {other:?}")),
    };
    if let Some(unknown) = options
        .keys()
        .find(|name| !GLOBAL.contains(&name.as_str()) && !allowed.contains(&name.as_str()))
    {
        return usage(format!("{unknown} is not an option of `{}`", command_name(&command)));
    }
    Ok(Parsed::Run(Cli { servers, json, timeout_ms, command }))
}

fn number<T: std::str::FromStr>(name: &str, value: &str) -> Result<T, UsageError> {
    value.parse().map_err(|_| UsageError(format!("{name} {value:?} is not a valid number")))
}

fn parse_from(value: &str) -> Result<FetchFrom, UsageError> {
    match value {
        "first" => Ok(FetchFrom::First),
        "last" => Ok(FetchFrom::Last),
        _ => {
            if let Some(time) = value.strip_prefix("time:") {
                return number::<i64>("--from time:", time).map(FetchFrom::Timestamp);
            }
            value.parse::<u64>().map(FetchFrom::Offset).map_err(|_| {
                UsageError(format!("--from {value:?}: use first, last, an offset or time:MS"))
            })
        }
    }
}

/// The command's words, for messages.
pub fn command_name(command: &Command) -> &'static str {
    match command {
        Command::StreamCreate { .. } => "stream create",
        Command::StreamList => "stream list",
        Command::StreamDelete { .. } => "stream delete",
        Command::TopicCreate { .. } => "topic create",
        Command::TopicList { .. } => "topic list",
        Command::TopicDescribe { .. } => "topic describe",
        Command::TopicDelete { .. } => "topic delete",
        Command::Produce { .. } => "produce",
        Command::Consume(_) => "consume",
        Command::Status => "status",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &str) -> Result<Parsed, UsageError> {
        parse(args.split_whitespace().map(OsString::from))
    }

    fn command(args: &str) -> Command {
        match run(args) {
            Ok(Parsed::Run(cli)) => cli.command,
            other => panic!("{args}: {other:?}"),
        }
    }

    #[test]
    fn args_parse_every_command() {
        assert_eq!(command("stream create s"), Command::StreamCreate { name: "s".into() });
        assert_eq!(command("stream list"), Command::StreamList);
        assert_eq!(
            command("topic create s t --partitions 2 --durability persisted --retention-ms=5"),
            Command::TopicCreate {
                stream: "s".into(),
                topic: "t".into(),
                partitions: 2,
                durability: Durability::Persisted,
                retention_bytes: None,
                retention_ms: Some(5),
                segment_size_bytes: None,
                message_size_bytes_max: None,
            }
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
        assert_eq!(
            command("--json consume s t --partition 1 --from time:-5 --follow"),
            Command::Consume(Consume {
                stream: "s".into(),
                topic: "t".into(),
                group: None,
                partition: 1,
                from: FetchFrom::Timestamp(-5),
                count: None,
                follow: true,
                format: Format::Json,
            })
        );
        assert_eq!(
            command("consume s t --group g --count 3"),
            Command::Consume(Consume {
                stream: "s".into(),
                topic: "t".into(),
                group: Some("g".into()),
                partition: 0,
                from: FetchFrom::First,
                count: Some(3),
                follow: false,
                format: Format::Value,
            })
        );
        assert!(run("consume s t --group g --partition 1").is_err());
        let Ok(Parsed::Run(cli)) = run("status --server a:1,b:2 --timeout-ms 5") else { panic!() };
        assert_eq!(cli.servers, ["a:1", "b:2"]);
        assert_eq!(cli.timeout_ms, 5);
        assert_eq!(run("topic list s --help"), Ok(Parsed::Help));
    }

    #[test]
    fn args_refuse_bad_command_lines_with_a_reason() {
        for (args, reason) in [
            ("", "no command"),
            ("stream", "needs a subcommand"),
            ("stream make s", "not a command"),
            ("frobnicate", "unknown command"),
            ("topic create s t --durability persisted", "--partitions"),
            ("topic create s t --partitions 0 --durability persisted", "at least 1"),
            ("topic create s t --partitions 2 --durability fast", "replicated or persisted"),
            ("consume s t --from first", "--partition"),
            ("consume s t --partition 0 --from middle", "--from"),
            ("consume s t --partition -1 --from first", "--partition"),
            ("stream list --partition 1", "not an option of `stream list`"),
            ("stream list --json=yes", "takes no value"),
            ("status --timeout-ms", "needs a value"),
            ("status --json --json", "given twice"),
            ("stream list -x", "unknown option"),
        ] {
            match run(args) {
                Err(UsageError(message)) => assert!(message.contains(reason), "{args}: {message}"),
                other => panic!("{args}: {other:?}"),
            }
        }
    }
}
