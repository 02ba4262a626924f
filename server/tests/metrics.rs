//! The metrics endpoint and the log of the real `shoal` binary, as a Prometheus server and an
//! operator meet them: every page parses under a strict text-format parser (one `# HELP` and
//! `# TYPE` per family before its samples, no interleaved families, no duplicate series, escaped
//! label values, cumulative histogram buckets ending in `+Inf` equal to `_count`) and its values
//! match what a client did; a `[shard.N]` override shows in that shard's configuration gauge;
//! retention's deletions show; bad HTTP gets its status while native clients and later scrapes
//! are served; and the log level follows `SHOAL_LOG`.
//!
//! Every server runs on ephemeral ports and a temp directory and is killed by its guard if a test
//! fails; every socket read is bounded by a timeout.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{OutputWithin, Raw, ShoalProcess, start, start_command, terminate};
use shoal_proto::Durability;
use shoal_proto::protocol::{ErrorCode, FetchFrom, Operation};

/// How long any single HTTP exchange may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

#[test]
fn the_page_parses_and_counts_what_was_produced() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Replicated).ok();
    const REQUESTS: u64 = 20;
    const MESSAGES: usize = 5;
    let values: Vec<&[u8]> = vec![b"hello"; MESSAGES];
    for _ in 0..REQUESTS {
        client.produce("s", "t", 0, &values);
    }
    let (_, fetched) = client.fetch("s", "t", 0, FetchFrom::First, 1000);
    assert_eq!(fetched.len() as u64, REQUESTS * MESSAGES as u64);
    let missing = Raw::produce_body("s", "nope", 0, &values);
    assert_eq!(client.call(Operation::Produce, &missing).error(), ErrorCode::TopicNotFound);

    let page = scrape(&server);
    let partition = [("stream", "s"), ("topic", "t"), ("partition", "0")];
    let messages = (REQUESTS * MESSAGES as u64) as f64;
    assert_eq!(page.value("shoal_partition_next_offset", &partition), messages);
    assert_eq!(page.value("shoal_partition_committed_offset", &partition), messages);
    assert_eq!(page.value("shoal_partition_first_offset", &partition), 0.0);
    assert!(page.value("shoal_partition_commit_op", &partition) >= REQUESTS as f64);
    assert!(page.value("shoal_partition_segments", &partition) >= 1.0);
    assert!(page.value("shoal_partition_size_bytes", &partition) > 0.0);
    assert_eq!(page.value("shoal_partition_failed", &partition), 0.0);
    // A group of one replica: its primary is its whole in-sync set, never behind itself.
    assert_eq!(page.value("shoal_group_in_sync_replicas", &partition), 1.0);
    let primary = [("stream", "s"), ("topic", "t"), ("partition", "0"), ("replica", "0")];
    assert_eq!(page.value("shoal_group_replica_lag_ms", &primary), 0.0);

    let shard = [("shard", "0")];
    let produce = [("shard", "0"), ("operation", "produce")];
    assert!(page.value("shoal_requests_total", &produce) >= (REQUESTS + 1) as f64);
    assert!(page.value("shoal_requests_total", &[("operation", "hello")]) >= 1.0);
    assert!(page.value("shoal_requests_total", &[("operation", "fetch")]) >= 1.0);
    assert!(page.value("shoal_request_errors_total", &[("code", "topic_not_found")]) >= 1.0);
    assert_eq!(page.value("shoal_request_errors_total", &[("code", "invalid_frame")]), 0.0);
    assert!(page.value("shoal_network_received_bytes_total", &shard) > 0.0);
    assert!(page.value("shoal_network_sent_bytes_total", &shard) > 0.0);
    assert!(page.value("shoal_connections_open", &shard) >= 1.0, "the client is connected");
    assert!(page.value("shoal_connections_accepted_total", &shard) >= 1.0);
    assert!(page.value("shoal_produce_latency_seconds_count", &shard) >= REQUESTS as f64);
    assert!(page.value("shoal_produce_latency_seconds_sum", &shard) > 0.0);
    assert!(page.value("shoal_fetch_latency_seconds_count", &shard) >= 1.0);
    assert!(page.value("shoal_flush_cycles_total", &shard) > 0.0);
    assert!(page.value("shoal_superblock_writes_total", &shard) > 0.0);
    assert!(page.value("shoal_segment_written_bytes_total", &shard) > 0.0);
    assert!(page.value("shoal_ring_memory_bytes", &shard) > 0.0);
    assert!(page.value("shoal_io_rounds_total", &shard) > 0.0);
    assert!(page.value("shoal_allocations_total", &shard) > 0.0);
    assert_eq!(page.value("shoal_shard_scrape_ok", &shard), 1.0);
    assert_eq!(page.value("shoal_shard_config_ring_budget_bytes", &shard), (8 << 20) as f64);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn a_shard_override_shows_in_that_shards_config_gauge() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shoal.toml");
    std::fs::write(
        &file,
        "[shard.1]\nring_budget_bytes = 16777216\nflush_cycles_in_flight_max = 3\n\
         uring_entries = 512\ndirect_io = false\nflush_delay_us_max = 200\n",
    )
    .unwrap();
    let mut command = common::command(&dir.path().join("data"), 2);
    command.arg("--config").arg(&file);
    let mut server = start_command(command);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 2, Durability::Persisted).ok();
    client.produce("s", "t", 0, &[b"a", b"b"]);
    client.produce("s", "t", 1, &[b"c"]);

    let page = scrape(&server);
    let gauge = |key: &str, shard: &str| {
        page.value(&format!("shoal_shard_config_{key}"), &[("shard", shard)])
    };
    assert_eq!(gauge("ring_budget_bytes", "0"), (8 << 20) as f64, "the small profile's");
    assert_eq!(gauge("ring_budget_bytes", "1"), (16 << 20) as f64, "[shard.1]'s");
    assert_eq!(gauge("flush_cycles_in_flight_max", "0"), 2.0);
    assert_eq!(gauge("flush_cycles_in_flight_max", "1"), 3.0);
    assert_eq!(gauge("chunks_max", "0"), gauge("chunks_max", "1"), "not overridden");
    // The server's own tuning keys, beside the engine's.
    assert_eq!((gauge("uring_entries", "0"), gauge("uring_entries", "1")), (256.0, 512.0));
    assert_eq!((gauge("direct_io", "0"), gauge("direct_io", "1")), (1.0, 0.0));
    assert_eq!((gauge("flush_delay_us_max", "0"), gauge("flush_delay_us_max", "1")), (0.0, 200.0));
    assert_eq!(gauge("sqpoll_idle_ms", "1"), 0.0);
    for shard in ["0", "1"] {
        assert_eq!(page.value("shoal_shard_scrape_ok", &[("shard", shard)]), 1.0);
    }
    // Each partition is one series, on the shard the catalog placed it on.
    for (partition, count) in [("0", 2.0), ("1", 1.0)] {
        let labels = [("stream", "s"), ("topic", "t"), ("partition", partition)];
        assert_eq!(page.value("shoal_partition_next_offset", &labels), count);
    }
    assert_eq!(terminate(&mut server), 0);
}

/// The files under `dir` whose name ends with `suffix`, at any depth.
fn files_ending(dir: &std::path::Path, suffix: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            found.extend(files_ending(&path, suffix));
        } else if path.to_string_lossy().ends_with(suffix) {
            found.push(path);
        }
    }
    found
}

/// Without recycling, every segment retention deletes is retired (renamed out of the log) and
/// then removed by a task of the shard, off its loop: none is left behind for long.
#[test]
fn segments_retention_retires_are_removed_off_the_loop() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command.env("SHOAL_SHARD_RECYCLE_SEGMENTS", "false");
    let mut server = common::start_command(command);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_retained_topic("s", "t", 1, Durability::Replicated).ok();
    let value = vec![7u8; 50 << 10];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for _ in 0..20 {
            client.produce("s", "t", 0, &[&value[..]]);
        }
        let deleted =
            scrape(&server).value("shoal_retention_deleted_segments_total", &[("shard", "0")]);
        let left = files_ending(dir.path(), ".retired");
        if deleted >= 3.0 && left.is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{deleted} segments deleted, retired ones left: {left:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn retention_deletes_old_segments_in_the_background_and_the_page_shows_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_retained_topic("s", "t", 1, Durability::Replicated).ok();
    // 4 MiB in 50 KiB messages: four 1 MiB segments and more, several checkpoints.
    let value = vec![7u8; 50 << 10];
    for _ in 0..84 {
        client.produce("s", "t", 0, &[&value[..]]);
    }
    let partition = [("stream", "s"), ("topic", "t"), ("partition", "0")];
    // Retention runs every second in the background; wait for its first deletion (bounded).
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = scrape(&server);
        // A retired segment's file becomes the partition's spare once no roll is taking one.
        if page.value("shoal_retention_deleted_segments_total", &[("shard", "0")]) > 0.0
            && page.value("shoal_retention_recycled_segments_total", &[("shard", "0")]) >= 1.0
        {
            break page;
        }
        assert!(Instant::now() < deadline, "no segment deleted and recycled within 30 s");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(page.value("shoal_retention_deleted_bytes_total", &[("shard", "0")]) >= 1e6);
    assert!(page.value("shoal_partition_first_offset", &partition) > 0.0);
    assert_eq!(page.value("shoal_partition_next_offset", &partition), 84.0);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn bad_http_gets_its_status_and_the_server_keeps_serving() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let metrics = server.metrics().expect("a metrics address").to_string();
    let cases: [(&[u8], u16); 6] = [
        (b"\x00\x01\x02 hello\r\n\r\n", 400),
        (b"GET /metrics HTTP/9.9\r\n\r\n", 400),
        (b"GET /metrics HTTP/1.1\r\nNo-Colon\r\n\r\n", 400),
        (b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n", 404),
        (b"DELETE /metrics HTTP/1.1\r\nHost: x\r\n\r\n", 405),
        (b"POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc", 405),
    ];
    for (request, status) in cases {
        let response = http(&metrics, request);
        assert_eq!(response.status, status, "{:?}", String::from_utf8_lossy(request));
        if status == 405 {
            assert_eq!(response.header("allow"), Some("GET, HEAD"));
        }
    }
    let mut oversized = b"GET /metrics HTTP/1.1\r\nX-Padding: ".to_vec();
    oversized.resize(20 << 10, b'a');
    assert_eq!(http(&metrics, &oversized).status, 431);
    // A client that connects and leaves at once is nobody's problem.
    drop(TcpStream::connect(&metrics).unwrap());
    let head = http(&metrics, b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(head.status, 200);
    assert!(head.body.is_empty(), "HEAD has no body");
    assert!(head.header("content-length").unwrap().parse::<usize>().unwrap() > 0);

    // The native protocol and later scrapes are served as before.
    let mut client = Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    client.create_topic("s", "t", 1, Durability::Replicated).ok();
    client.produce("s", "t", 0, &[b"still here"]);
    let page = scrape(&server);
    let responses =
        |code: &str| page.value("shoal_metrics_http_responses_total", &[("code", code)]);
    assert_eq!(responses("400"), 3.0);
    assert_eq!(responses("404"), 1.0);
    assert_eq!(responses("405"), 2.0);
    assert_eq!(responses("431"), 1.0);
    assert_eq!(responses("200"), 1.0, "the HEAD request");
    let partition = [("stream", "s"), ("topic", "t"), ("partition", "0")];
    assert_eq!(page.value("shoal_partition_next_offset", &partition), 1.0);
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn a_silent_client_gets_408_and_holds_up_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = start(dir.path(), 1);
    let metrics = server.metrics().expect("a metrics address").to_string();
    // Half a request head, then silence: its deadline (5 s) runs while others are served.
    let mut silent = connect(&metrics);
    silent.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").unwrap();
    let started = Instant::now();
    let page = scrape(&server);
    assert_eq!(page.value("shoal_shard_scrape_ok", &[("shard", "0")]), 1.0);
    let response = read_response(&mut silent);
    assert_eq!(response.status, 408);
    assert!(started.elapsed() >= Duration::from_secs(4), "answered before its deadline");
    assert_eq!(terminate(&mut server), 0);
}

#[test]
fn the_log_level_follows_shoal_log() {
    let run = |log: Option<&str>| {
        let dir = tempfile::tempdir().unwrap();
        let mut command = common::command(&dir.path().join("data"), 1);
        command.env_remove("SHOAL_LOG");
        if let Some(log) = log {
            command.env("SHOAL_LOG", log);
        }
        let stderr = dir.path().join("stderr.log");
        command.stderr(File::create(&stderr).expect("log file"));
        let mut server = start_command(command);
        assert!(server.metrics().is_some());
        assert_eq!(terminate(&mut server), 0);
        std::fs::read_to_string(&stderr).expect("UTF-8 log")
    };
    let info = run(None);
    assert!(info.contains(" INFO shoal: ready native="), "{info}");
    assert!(info.contains("recovered"), "{info}");
    let warn = run(Some("warn"));
    assert!(!warn.contains(" INFO "), "SHOAL_LOG=warn still logged info: {warn}");
    let directives = run(Some("warn,shoal=info"));
    assert!(directives.contains(" INFO shoal: ready"), "{directives}");
}

#[test]
fn a_taken_metrics_port_stops_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = taken.local_addr().unwrap().to_string();
    let output =
        common::command(dir.path(), 1).args(["--metrics-listen", &address]).output_within();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "no readiness line");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(&format!("cannot listen for metrics on {address}")), "{stderr}");
    // Off: no endpoint, and the readiness line has no metrics field.
    let mut command = common::command(dir.path(), 1);
    command.args(["--metrics-listen", "off"]);
    let mut server = start_command(command);
    assert_eq!(server.metrics(), None);
    assert_eq!(terminate(&mut server), 0);
}

// --- An HTTP client and a strict text-format parser --------------------------------------------

fn connect(address: &str) -> TcpStream {
    let stream = TcpStream::connect(address).expect("the metrics endpoint accepts");
    stream.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
    stream.set_write_timeout(Some(HTTP_TIMEOUT)).unwrap();
    stream
}

struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

/// Sends `request` on a new connection and reads the response to the server's close.
fn http(address: &str, request: &[u8]) -> Response {
    let mut stream = connect(address);
    // The server may answer (and stop reading) before an oversized request is all written.
    let _ = stream.write_all(request);
    read_response(&mut stream)
}

fn read_response(stream: &mut TcpStream) -> Response {
    let mut bytes = Vec::new();
    stream.read_to_end(&mut bytes).expect("the response, then the close");
    let end = bytes.windows(4).position(|w| w == b"\r\n\r\n").expect("a response head") + 4;
    let head = std::str::from_utf8(&bytes[..end]).expect("an ASCII head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap();
    let mut parts = status_line.splitn(3, ' ');
    assert_eq!(parts.next(), Some("HTTP/1.1"), "{status_line}");
    let status = parts.next().unwrap().parse().expect("a status code");
    let headers: Vec<(String, String)> = lines
        .filter(|line| !line.is_empty())
        .map(|line| {
            let (name, value) = line.split_once(':').expect("name: value");
            (name.to_string(), value.trim().to_string())
        })
        .collect();
    let response = Response { status, headers, body: bytes[end..].to_vec() };
    assert_eq!(response.header("connection"), Some("close"));
    response
}

/// `GET /metrics`: a 200 in the text format that parses strictly.
fn scrape(server: &ShoalProcess) -> Exposition {
    let metrics = server.metrics().expect("a metrics address");
    let response = http(metrics, b"GET /metrics HTTP/1.1\r\nHost: shoal\r\n\r\n");
    assert_eq!(response.status, 200);
    let content_type = response.header("content-type").expect("a content type");
    assert!(content_type.starts_with("text/plain; version=0.0.4"), "{content_type}");
    let length: usize = response.header("content-length").unwrap().parse().unwrap();
    assert_eq!(length, response.body.len());
    let text = String::from_utf8(response.body).expect("UTF-8");
    parse(&text).unwrap_or_else(|error| panic!("not the text format: {error}\n{text}"))
}

#[derive(Debug, PartialEq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

struct Family {
    kind: Option<Kind>,
    help: Option<String>,
    samples: Vec<Sample>,
}

struct Exposition {
    families: BTreeMap<String, Family>,
}

impl Exposition {
    /// The value of the one sample named `name` whose labels include `labels`.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let found: Vec<f64> = self
            .families
            .values()
            .flat_map(|family| &family.samples)
            .filter(|sample| sample.name == name)
            .filter(|sample| {
                labels.iter().all(|(k, v)| sample.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|sample| sample.value)
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {found:?}");
        found[0]
    }
}

/// Parses the Prometheus text format 0.0.4 strictly, and checks what a scraper relies on.
fn parse(text: &str) -> Result<Exposition, String> {
    let text = text.strip_suffix('\n').ok_or("the page does not end with a newline")?;
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut series = BTreeSet::new();
    for (number, line) in text.split('\n').enumerate() {
        let at = |message: String| format!("line {}: {message}: {line:?}", number + 1);
        if line.is_empty() {
            return Err(at("empty line".into()));
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.trim_start().splitn(3, ' ');
            let keyword = words.next().unwrap_or("");
            if keyword != "HELP" && keyword != "TYPE" {
                continue; // a plain comment
            }
            let name = words.next().ok_or_else(|| at("no metric name".into()))?;
            check_name(name).map_err(&at)?;
            let rest = words.next().unwrap_or("");
            if current.as_deref() != Some(name) {
                if families.contains_key(name) {
                    return Err(at(format!("family {name} appears twice")));
                }
                families.insert(
                    name.to_string(),
                    Family { kind: None, help: None, samples: Vec::new() },
                );
                current = Some(name.to_string());
            }
            let family = families.get_mut(name).unwrap();
            if !family.samples.is_empty() {
                return Err(at("HELP or TYPE after the family's samples".into()));
            }
            if keyword == "HELP" {
                if family.help.is_some() {
                    return Err(at("a second HELP".into()));
                }
                family.help = Some(unescape(rest, false).map_err(&at)?);
            } else {
                if family.kind.is_some() {
                    return Err(at("a second TYPE".into()));
                }
                family.kind = Some(match rest {
                    "counter" => Kind::Counter,
                    "gauge" => Kind::Gauge,
                    "histogram" => Kind::Histogram,
                    "summary" => Kind::Summary,
                    "untyped" => Kind::Untyped,
                    other => return Err(at(format!("unknown type {other:?}"))),
                });
            }
            continue;
        }
        let sample = parse_sample(line).map_err(&at)?;
        let family_name = current.clone().ok_or_else(|| at("a sample before any TYPE".into()))?;
        let family = families.get_mut(&family_name).unwrap();
        let allowed = match family.kind {
            Some(Kind::Histogram) => ["_bucket", "_sum", "_count"]
                .iter()
                .any(|suffix| sample.name == format!("{family_name}{suffix}")),
            Some(_) => sample.name == family_name,
            None => false,
        };
        if !allowed {
            return Err(at(format!("not a sample of the family {family_name} being written")));
        }
        if !series.insert((sample.name.clone(), sample.labels.clone())) {
            return Err(at("a duplicate series".into()));
        }
        family.samples.push(sample);
    }
    for (name, family) in &families {
        if family.help.as_deref().is_none_or(str::is_empty) {
            return Err(format!("{name} has no HELP"));
        }
        match family.kind {
            None => return Err(format!("{name} has no TYPE")),
            Some(Kind::Counter) if !name.ends_with("_total") => {
                return Err(format!("counter {name} does not end in _total"));
            }
            Some(Kind::Histogram) => check_histogram(name, &family.samples)?,
            _ => {}
        }
    }
    Ok(Exposition { families })
}

fn check_name(name: &str) -> Result<(), String> {
    let mut bytes = name.bytes();
    let first_ok = bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':');
    if first_ok && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':') {
        Ok(())
    } else {
        Err(format!("{name:?} is not a metric name"))
    }
}

/// A label value (`quotes`) or help text with its escapes resolved.
fn unescape(text: &str, quotes: bool) -> Result<String, String> {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('\\') => out.push('\\'),
                Some('n') => out.push('\n'),
                Some('"') if quotes => out.push('"'),
                other => return Err(format!("bad escape \\{other:?}")),
            },
            '"' if quotes => return Err("an unescaped quote".into()),
            '\n' => return Err("a raw newline".into()),
            c => out.push(c),
        }
    }
    Ok(out)
}

fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    check_name(name)?;
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(inside) = rest.strip_prefix('{') {
        let mut text = inside;
        loop {
            if let Some(after) = text.strip_prefix('}') {
                rest = after;
                break;
            }
            let eq = text.find('=').ok_or("a label without =")?;
            let label = &text[..eq];
            let valid = label.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
                && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                && !label.starts_with("__");
            if !valid {
                return Err(format!("{label:?} is not a label name"));
            }
            let value_text = text[eq + 1..].strip_prefix('"').ok_or("a label value not quoted")?;
            // The closing quote is the first one not escaped.
            let mut end = None;
            let mut escaped = false;
            for (index, c) in value_text.char_indices() {
                match c {
                    '\\' if !escaped => escaped = true,
                    '"' if !escaped => {
                        end = Some(index);
                        break;
                    }
                    _ => escaped = false,
                }
            }
            let end = end.ok_or("an unterminated label value")?;
            let value = unescape(&value_text[..end], true)?;
            if labels.insert(label.to_string(), value).is_some() {
                return Err(format!("label {label} twice"));
            }
            text = &value_text[end + 1..];
            if let Some(after) = text.strip_prefix(',') {
                if after.starts_with('}') {
                    return Err("a trailing comma".into());
                }
                text = after;
            } else if !text.starts_with('}') {
                return Err("labels not separated by a comma".into());
            }
        }
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut words = rest.split(' ');
    let value = words.next().ok_or("no value")?;
    if let Some(timestamp) = words.next() {
        timestamp.parse::<i64>().map_err(|_| format!("bad timestamp {timestamp:?}"))?;
    }
    if words.next().is_some() {
        return Err("text after the timestamp".into());
    }
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        number if number.bytes().all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) => {
            number.parse().map_err(|_| format!("bad value {number:?}"))?
        }
        other => return Err(format!("bad value {other:?}")),
    };
    Ok(Sample { name: name.to_string(), labels, value })
}

/// Per label set (but `le`): buckets in rising `le` order with non-decreasing counts, the last at
/// `+Inf` and equal to `_count`, and a `_sum`.
fn check_histogram(name: &str, samples: &[Sample]) -> Result<(), String> {
    let mut buckets: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
    let mut counts = BTreeMap::new();
    let mut sums = BTreeSet::new();
    for sample in samples {
        let mut labels = sample.labels.clone();
        if sample.name.ends_with("_bucket") {
            let le = labels.remove("le").ok_or_else(|| format!("{name}: a bucket without le"))?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().map_err(|_| le)? };
            buckets.entry(labels).or_default().push((le, sample.value));
        } else if sample.name.ends_with("_count") {
            counts.insert(labels, sample.value);
        } else {
            sums.insert(labels);
        }
    }
    if buckets.is_empty() && counts.is_empty() {
        return Ok(()); // a family with no series (no shard answered)
    }
    for (labels, list) in &buckets {
        if !list.windows(2).all(|pair| pair[0].0 < pair[1].0 && pair[0].1 <= pair[1].1) {
            return Err(format!("{name} {labels:?}: buckets not rising and cumulative"));
        }
        let (le, last) = *list.last().unwrap();
        if le != f64::INFINITY {
            return Err(format!("{name} {labels:?}: the last bucket is not +Inf"));
        }
        if counts.get(labels) != Some(&last) {
            return Err(format!(
                "{name} {labels:?}: +Inf is {last}, _count {:?}",
                counts.get(labels)
            ));
        }
        if !sums.contains(labels) {
            return Err(format!("{name} {labels:?}: no _sum"));
        }
    }
    if counts.len() != buckets.len() || sums.len() != buckets.len() {
        return Err(format!("{name}: _count or _sum without buckets"));
    }
    Ok(())
}

#[test]
fn the_parser_refuses_what_the_format_forbids() {
    let good = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\\\"\"} 1\n";
    assert!(parse(good).is_ok());
    let bad = [
        "a_total 1\n",
        "# TYPE a_total counter\na_total 1\n",
        "# HELP a_total A.\n# TYPE a_total counter\na_total 1\na_total 2\n",
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\nb 1\na 1\n",
        "# HELP a A.\n# TYPE a gauge\na{x=\"1\",} 1\n",
        "# HELP a A.\n# TYPE a gauge\na{x=\"\\q\"} 1\n",
        "# HELP a A.\n# TYPE a gauge\na 1",
        "# HELP a A.\n# TYPE a counter\na 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\n\
         h_sum 1\nh_count 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n",
    ];
    for text in bad {
        assert!(parse(text).is_err(), "accepted: {text:?}");
    }
}

/// Clients that connect to the metrics port and send nothing get `408` after the head's time
/// bound, and their sockets are closed on the server's side too: a read given up on stays in
/// flight in io_uring and held each socket open until its silent client acted.
#[test]
fn silent_metrics_clients_are_answered_408_and_their_sockets_closed() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(dir.path(), 1);
    let pid = server.pid().expect("running");
    let descriptors = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count();
    let before = descriptors();
    let address = server.metrics().expect("a metrics listener").to_string();
    let mut silent: Vec<TcpStream> =
        (0..8).map(|_| TcpStream::connect(&address).unwrap()).collect();
    for stream in &mut silent {
        stream.set_read_timeout(Some(HTTP_TIMEOUT)).unwrap();
        let mut head = [0u8; 12];
        stream.read_exact(&mut head).unwrap();
        assert_eq!(&head, b"HTTP/1.1 408");
    }
    let deadline = Instant::now() + HTTP_TIMEOUT;
    while descriptors() > before {
        assert!(Instant::now() < deadline, "{} descriptors, {before} before", descriptors());
        std::thread::sleep(Duration::from_millis(50));
    }
}
