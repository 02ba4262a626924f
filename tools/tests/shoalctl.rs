//! `shoalctl` as a user runs it, against the real `shoal` binary: streams and topics are created
//! and listed, 100 stdin lines produced to one partition come back acknowledged with dense
//! offsets and are consumed exactly, `topic describe` and `status` report the log end, a
//! follower sees messages produced after it started, and bad arguments and unknown streams get
//! their exit codes (2 with a usage error; 1 naming the server's error code).
//!
//! Every child process runs under a deadline and is killed past it; the server is killed when
//! its guard drops.

use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use shoal_proto::protocol::partition_for_key;
use shoal_testkit::ShoalProcess;

/// How long any child process may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// Starts the real server on a fresh directory and waits (bounded) for its readiness line.
fn start(dir: &Path) -> ShoalProcess {
    let shoalctl = Path::new(env!("CARGO_BIN_EXE_shoalctl"));
    let binary = shoal_testkit::shoal_binary_beside(shoalctl).unwrap_or_else(|e| panic!("{e}"));
    let mut command = ShoalProcess::command(&binary, dir);
    command.args(["--shards", "2", "--profile", "small", "--cpus", "none"]);
    ShoalProcess::start(command, DEADLINE).unwrap_or_else(|error| panic!("{error}"))
}

/// A `shoalctl` child with its stdin, stdout and stderr piped.
fn spawn_shoalctl(server: Option<&ShoalProcess>, args: &[&str]) -> Child {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shoalctl"));
    if let Some(server) = server {
        command.args(["--server", server.native()]);
    }
    command
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("shoalctl runs")
}

/// Waits for a child under the deadline, killing it past it.
fn output_within(mut child: Child, stdin: &[u8]) -> Output {
    let mut input = child.stdin.take().expect("piped stdin");
    let stdin = stdin.to_vec();
    std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
        // Dropping `input` closes stdin: the end of the messages.
    });
    shoal_testkit::output_within(child, DEADLINE, "shoalctl")
}

/// Runs `shoalctl --server ADDRESS ARGS` with `stdin`.
fn shoalctl(server: &ShoalProcess, args: &[&str], stdin: &[u8]) -> Output {
    output_within(spawn_shoalctl(Some(server), args), stdin)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Asserts success and returns stdout.
fn ok(output: Output) -> String {
    assert!(
        output.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        stdout(&output),
        stderr(&output)
    );
    stdout(&output)
}

/// Parses `PARTITION OFFSET` lines.
fn acks(text: &str) -> Vec<(u32, u64)> {
    text.lines()
        .map(|line| {
            let (partition, offset) = line.split_once(' ').unwrap_or_else(|| panic!("{line:?}"));
            (partition.parse().unwrap(), offset.parse().unwrap())
        })
        .collect()
}

#[test]
fn bad_arguments_exit_2_with_a_usage_error() {
    for args in [
        &[][..],
        &["frobnicate"],
        &["stream"],
        &["topic", "create", "s", "t", "--partitions", "two", "--durability", "persisted"],
        &["consume", "s", "t", "--partition", "0"],
        &["consume", "s", "t", "--partition", "0", "--from", "middle"],
        &["stream", "list", "--bogus", "1"],
    ] {
        let output = output_within(spawn_shoalctl(None, args), b"");
        assert_eq!(output.status.code(), Some(2), "{args:?}: {}", stderr(&output));
        let text = stderr(&output);
        // No command at all gets the help; anything else an error that points to it.
        let usage_error = text.starts_with("error: ") && text.contains("'--help'");
        assert!(usage_error || text.contains("Usage: shoalctl"), "{args:?}: {text}");
        assert!(output.stdout.is_empty(), "{args:?}");
    }
    let help = output_within(spawn_shoalctl(None, &["--help"]), b"");
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("Usage: shoalctl"));
}

#[test]
fn streams_topics_produce_consume_describe_and_status_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());

    ok(shoalctl(&server, &["stream", "create", "orders"], b""));
    let listed = ok(shoalctl(&server, &["stream", "list"], b""));
    assert!(listed.lines().any(|line| line.starts_with("orders ")), "{listed}");
    let listed: serde_json::Value =
        serde_json::from_str(&ok(shoalctl(&server, &["--json", "stream", "list"], b""))).unwrap();
    assert_eq!(listed[0]["name"], "orders", "{listed}");

    let create =
        ["topic", "create", "orders", "events", "--partitions", "2", "--durability", "persisted"];
    ok(shoalctl(&server, &create, b""));
    let topics = ok(shoalctl(&server, &["topic", "list", "orders"], b""));
    assert!(topics.lines().any(|line| line.starts_with("events ")), "{topics}");

    // 100 lines to partition 0: each acknowledged on its own line, offsets dense from 0.
    let lines: String = (0..100).map(|i| format!("line-{i}\n")).collect();
    let produced = ok(shoalctl(
        &server,
        &["produce", "orders", "events", "--partition", "0"],
        lines.as_bytes(),
    ));
    assert_eq!(acks(&produced), (0..100).map(|i| (0, i)).collect::<Vec<_>>(), "{produced}");

    // They come back exactly, with their offsets.
    let consumed = ok(shoalctl(
        &server,
        &[
            "consume",
            "orders",
            "events",
            "--partition",
            "0",
            "--from",
            "first",
            "--count",
            "100",
            "--format",
            "offset",
        ],
        b"",
    ));
    let expected: String = (0..100).map(|i| format!("{i}\tline-{i}\n")).collect();
    assert_eq!(consumed, expected);
    let middle = ok(shoalctl(
        &server,
        &["consume", "orders", "events", "--partition", "0", "--from", "50", "--count", "5"],
        b"",
    ));
    assert_eq!(middle, "line-50\nline-51\nline-52\nline-53\nline-54\n");
    // Without --count (and without --follow) it stops at the log end.
    let all = ok(shoalctl(
        &server,
        &["consume", "orders", "events", "--partition", "0", "--from", "first"],
        b"",
    ));
    assert_eq!(all, lines);
    let last = ok(shoalctl(
        &server,
        &["consume", "orders", "events", "--partition", "0", "--from", "last"],
        b"",
    ));
    assert_eq!(last, "line-99\n");

    let described =
        ok(shoalctl(&server, &["--json", "topic", "describe", "orders", "events"], b""));
    let described: serde_json::Value = serde_json::from_str(&described).unwrap();
    assert_eq!(described["partitions"][0]["next_offset"], 100, "{described}");
    assert_eq!(described["partitions"][1]["next_offset"], 0, "{described}");
    let text = ok(shoalctl(&server, &["topic", "describe", "orders", "events"], b""));
    assert!(
        text.lines().any(|l| l.split_whitespace().nth(4) == Some("100")),
        "partition 0's NEXT_OFFSET column shows 100: {text}"
    );

    // The status document parses and names the partition's log end.
    let status = ok(shoalctl(&server, &["status", "--json"], b""));
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert!(status["shards"].as_u64().is_some(), "{status}");
    let partitions = status["partitions"].as_array().expect("a partition list");
    assert!(
        partitions.iter().any(|p| p["stream"] == "orders"
            && p["topic"] == "events"
            && p["partition"] == 0
            && p["next_offset"] == 100),
        "{status}"
    );
    let human = ok(shoalctl(&server, &["status"], b""));
    assert!(human.contains("shards: 2"), "{human}");

    // A follower started on the empty partition 1 sees what is produced after it started.
    let follower = spawn_shoalctl(
        Some(&server),
        &[
            "consume",
            "orders",
            "events",
            "--partition",
            "1",
            "--from",
            "first",
            "--follow",
            "--count",
            "3",
            "--format",
            "offset",
        ],
    );
    std::thread::sleep(Duration::from_millis(300));
    let late =
        ok(shoalctl(&server, &["produce", "orders", "events", "--partition", "1"], b"a\nb\nc\n"));
    assert_eq!(acks(&late), [(1, 0), (1, 1), (1, 2)]);
    assert_eq!(stdout(&output_within(follower, b"")), "0\ta\n1\tb\n2\tc\n");

    // A key picks Kafka's partition for it; no key and no partition lets the server balance.
    let key_partition = partition_for_key(b"customer-7", 2);
    let by_key =
        ok(shoalctl(&server, &["produce", "orders", "events", "--key", "customer-7"], b"k1\nk2\n"));
    assert!(acks(&by_key).iter().all(|(p, _)| *p == key_partition), "{by_key}");
    assert_eq!(acks(&by_key).len(), 2);
    let balanced = ok(shoalctl(&server, &["produce", "orders", "events"], b"x\ny\nz\n"));
    assert_eq!(acks(&balanced).len(), 3, "{balanced}");

    // An unknown stream: exit 1, the server's error code on stderr.
    let missing = shoalctl(&server, &["topic", "list", "no-such-stream"], b"");
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).starts_with("shoalctl: StreamNotFound"), "{}", stderr(&missing));
    let missing = shoalctl(&server, &["produce", "no-such-stream", "t"], b"x\n");
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("StreamNotFound"), "{}", stderr(&missing));
    assert!(missing.stdout.is_empty());

    ok(shoalctl(&server, &["topic", "delete", "orders", "events"], b""));
    ok(shoalctl(&server, &["stream", "delete", "orders"], b""));
}

#[test]
fn an_unreachable_server_is_an_error_not_a_hang() {
    let output = output_within(
        spawn_shoalctl(
            None,
            &["--server", "127.0.0.1:1", "--timeout-ms", "2000", "stream", "list"],
        ),
        b"",
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(stderr(&output).contains("127.0.0.1:1"), "{}", stderr(&output));
}

#[test]
fn a_group_member_consumes_its_share_from_the_stored_offsets_and_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path());
    ok(shoalctl(&server, &["stream", "create", "s"], b""));
    let create = ["topic", "create", "s", "t", "--partitions", "2", "--durability", "persisted"];
    ok(shoalctl(&server, &create, b""));
    ok(shoalctl(&server, &["produce", "s", "t", "--partition", "0"], b"a\nb\n"));
    ok(shoalctl(&server, &["produce", "s", "t", "--partition", "1"], b"c\n"));
    let consume = ["consume", "s", "t", "--group", "g", "--format", "offset"];
    // The only member gets both partitions and reads each from the start.
    let first = ok(shoalctl(&server, &consume, b""));
    assert_eq!(first, "0\t0\ta\n0\t1\tb\n1\t0\tc\n");
    // It stored where it stopped and left: the next member goes on from there.
    ok(shoalctl(&server, &["produce", "s", "t", "--partition", "1"], b"d\n"));
    let second = ok(shoalctl(&server, &consume, b""));
    assert_eq!(second, "1\t2\td\n", "the group's offset commit sits at offset 1");
    assert_eq!(ok(shoalctl(&server, &consume, b"")), "", "nothing new");
}
