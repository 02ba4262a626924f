//! The real `shoal` binary's configuration, driven as an operator would: a config file, `SHOAL_*`
//! variables and flags resolve in that order (checked through `--print-config`, which must start
//! nothing and create no data directory); an invalid setting exits 2 naming its key, and a
//! command-line mistake exits 2 naming the flag, before any data directory exists; `completions`
//! prints a script; `configs/i4i.4xlarge.toml` loads; and `configs/test.toml` starts a
//! server.
//!
//! Every child runs with an emptied environment (so a `SHOAL_*` variable of the machine running
//! the tests cannot change the outcome) and under a deadline.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use common::OutputWithin;

/// `shoal` with no environment but the `SHOAL_*` variables given.
fn shoal(env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shoal"));
    command.env_clear().envs(env.iter().copied()).stdin(Stdio::null());
    command
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// The value of `key` in the section `[section]` (`""`: the top level) of printed TOML.
fn printed<'a>(toml: &'a str, section: &str, key: &str) -> Option<&'a str> {
    let mut current = "";
    for line in toml.lines() {
        if let Some(name) = line.strip_prefix('[').and_then(|rest| rest.strip_suffix(']')) {
            current = name;
        } else if current == section
            && let Some((name, value)) = line.split_once(" = ")
            && name == key
        {
            return Some(value);
        }
    }
    None
}

#[test]
fn print_config_resolves_file_then_environment_then_flags_and_touches_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let file = dir.path().join("shoal.toml");
    std::fs::write(
        &file,
        format!(
            "data_dir = {:?}\nshards = 2\ncpus = \"none\"\nprofile = \"small\"\n\
             [network]\nconnections_max = 10\nrequests_in_flight_max = 11\n\
             [topic_defaults]\npartitions = 3\n\
             [shard]\nchunks_max = 12\n[shard.1]\nchunks_max = 13\n",
            data_dir.to_str().unwrap()
        ),
    )
    .unwrap();
    let env = [("SHOAL_SHARDS", "3"), ("SHOAL_NETWORK_CONNECTIONS_MAX", "20")];
    let output = shoal(&env)
        .arg("--config")
        .arg(&file)
        .args(["--shards", "4", "--print-config"])
        .output_within();
    assert!(output.status.success(), "{output:?}");
    let toml = stdout(&output);
    assert_eq!(printed(&toml, "", "shards"), Some("4"), "the flag over the variable: {toml}");
    assert_eq!(
        printed(&toml, "network", "connections_max"),
        Some("20"),
        "the variable over the file"
    );
    assert_eq!(printed(&toml, "network", "requests_in_flight_max"), Some("11"), "the file");
    assert_eq!(printed(&toml, "network", "shard_inbox_max"), Some("4096"), "the default");
    assert_eq!(printed(&toml, "topic_defaults", "partitions"), Some("3"));
    assert_eq!(printed(&toml, "topic_defaults", "message_size_bytes_max"), Some("61440"), "small");
    assert_eq!(printed(&toml, "shard", "chunks_max"), Some("12"));
    assert_eq!(printed(&toml, "shard.1", "chunks_max"), Some("13"));
    assert_eq!(printed(&toml, "", "cpus"), Some("\"none\""));
    assert!(!data_dir.exists(), "--print-config created the data directory");

    // What it prints is a config file that resolves to the same configuration.
    let again = dir.path().join("printed.toml");
    std::fs::write(&again, &toml).unwrap();
    let output = shoal(&[]).arg("--config").arg(&again).arg("--print-config").output_within();
    assert!(output.status.success(), "{output:?}");
    assert_eq!(stdout(&output), toml);
    assert!(!data_dir.exists());
}

/// One way to get the configuration wrong, and the key the error must name.
struct Case<'a> {
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    key: &'a str,
}

#[test]
fn an_invalid_setting_exits_2_naming_its_key_and_creates_no_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "[topic_defaults]\nsegment_size_bytes = 1000\n").unwrap();
    let bad_file = ["--config", file.to_str().unwrap()];
    // A CPU the process may not run on: refused when serving, though --print-config shows it.
    let cpu_file = dir.path().join("cpu.toml");
    std::fs::write(&cpu_file, "[shard.0]\ncpu = 4000\n").unwrap();
    let cpu_file = ["--config", cpu_file.to_str().unwrap()];
    let cases = [
        Case { args: &bad_file, env: &[], key: "topic_defaults.segment_size_bytes" },
        Case { args: &cpu_file, env: &[], key: "shard.0.cpu" },
        Case {
            args: &[],
            env: &[("SHOAL_NETWORK_CONNECTIONS_MAX", "0")],
            key: "SHOAL_NETWORK_CONNECTIONS_MAX",
        },
        Case {
            args: &[],
            env: &[("SHOAL_NETWORK_CONECTIONS_MAX", "5")],
            key: "SHOAL_NETWORK_CONECTIONS_MAX",
        },
        Case { args: &["--shards", "0"], env: &[], key: "--shards" },
        Case { args: &["--config", "/nonexistent/shoal.toml"], env: &[], key: "--config" },
    ];
    for Case { args, env, key } in cases {
        let output = shoal(env)
            .arg("--data-dir")
            .arg(&data_dir)
            .args(["--listen", "127.0.0.1:0", "--cpus", "none", "--profile", "small"])
            .args(args)
            .output_within();
        let stderr = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?} {env:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("shoal: config: {key}: ")),
            "{args:?} {env:?}: {stderr}"
        );
        assert!(stdout(&output).is_empty(), "{args:?}: no readiness line");
        assert!(!data_dir.exists(), "{args:?} {env:?} created the data directory");
    }
}

#[test]
fn a_command_line_mistake_exits_2_naming_the_flag_and_creates_no_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    for (args, named) in [
        (&["--frobnicate"][..], "'--frobnicate'"),
        (&["--shards"][..], "'--shards <N>'"),
        (&["serve"][..], "'serve'"),
    ] {
        let output = shoal(&[]).arg("--data-dir").arg(&data_dir).args(args).output_within();
        let stderr = stderr(&output);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.starts_with("error: ") && stderr.contains(named), "{args:?}: {stderr}");
        assert!(stderr.contains("try '--help'"), "{args:?}: {stderr}");
        assert!(stdout(&output).is_empty(), "{args:?}: no readiness line");
        assert!(!data_dir.exists(), "{args:?} created the data directory");
    }
}

#[test]
fn completions_print_a_script_for_the_shell() {
    for (shell, marker) in
        [("bash", "_shoal()"), ("zsh", "#compdef shoal"), ("fish", "complete -c shoal")]
    {
        let output = shoal(&[]).args(["completions", shell]).output_within();
        assert!(output.status.success(), "{shell}: {output:?}");
        let script = stdout(&output);
        assert!(script.contains(marker) && script.contains("print-config"), "{shell}: {script}");
    }
}

#[test]
fn help_prints_the_usage_and_exits_0() {
    let output = shoal(&[]).arg("--help").output_within();
    assert!(output.status.success(), "{output:?}");
    let usage = stdout(&output);
    for flag in
        ["--config", "--data-dir", "--listen", "--shards", "--cpus", "--profile", "--print-config"]
    {
        assert!(usage.contains(flag), "usage lacks {flag}: {usage}");
    }
}

#[test]
fn the_i4i_profile_loads_and_prints_as_shipped_and_unpinned() {
    // --print-config pins nothing and touches no disk, so the 16-CPU profile loads on any box;
    // --cpus none is how a smaller machine would run it.
    for extra in [&[][..], &["--cpus", "none"][..]] {
        let output = shoal(&[])
            .arg("--config")
            .arg(repo_file("configs/i4i.4xlarge.toml"))
            .args(extra)
            .arg("--print-config")
            .output_within();
        assert!(output.status.success(), "{extra:?}: {}", stderr(&output));
        let toml = stdout(&output);
        assert_eq!(printed(&toml, "", "shards"), Some("14"));
        assert_eq!(printed(&toml, "network", "shard_listen"), Some("\"0.0.0.0:7100\""));
        assert_eq!(printed(&toml, "shard", "uring_entries"), Some("1024"));
        assert_eq!(printed(&toml, "shard", "sqpoll_idle_ms"), Some("0"));
        assert_eq!(printed(&toml, "shard", "ring_budget_bytes"), Some("2147483648"));
    }
}

#[test]
fn the_test_config_starts_a_server_that_stops_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = shoal(&[]);
    command.arg("--config").arg(repo_file("configs/test.toml")).arg("--data-dir").arg(dir.path());
    command.stderr(Stdio::null());
    let mut server = common::start_command(command);
    assert!(server.native().starts_with("127.0.0.1:"), "{}", server.native());
    assert!(!server.native().ends_with(":0"), "port 0 became a real port: {}", server.native());
    assert!(dir.path().join("shard-0").exists(), "one shard");
    assert!(!dir.path().join("shard-1").exists(), "one shard only");
    assert_eq!(common::terminate(&mut server), 0, "graceful shutdown");
}

/// `[metadata] segment_size_bytes` at its least (1 MiB) starts on shards whose records may be
/// larger than that: the metadata group's records are bounded by its segment too.
#[test]
fn the_smallest_metadata_segment_starts_beside_larger_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = common::command(dir.path(), 1);
    command
        .env("SHOAL_METADATA_SEGMENT_SIZE_BYTES", "1048576")
        .env("SHOAL_SHARD_RECORD_SIZE_BYTES_MAX", "1048832")
        .env("SHOAL_SHARD_CHUNK_SIZE_BYTES", "2097152")
        .env("SHOAL_SHARD_RING_BYTES_MAX", "2097152");
    let mut server = common::start_command(command);
    let mut client = common::Raw::connect(server.native(), 1);
    client.create_stream("s").ok();
    assert_eq!(common::terminate(&mut server), 0, "graceful shutdown");
}

/// The native and Kafka listeners are shared by the shards (SO_REUSEPORT), which the kernel
/// would grant a second server on the same port too: a fixed port anyone listens on stops the
/// start instead, naming it.
#[test]
fn a_second_server_on_a_taken_port_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut first = common::start(&dir.path().join("first"), 1);
    let native = first.native().to_string();
    let kafka = first.kafka().expect("a Kafka listener").to_string();
    for (flag, taken) in [("--listen", &native), ("--kafka-listen", &kafka)] {
        let mut listeners = vec![
            ("--listen", "127.0.0.1:0"),
            ("--kafka-listen", "127.0.0.1:0"),
            ("--metrics-listen", "127.0.0.1:0"),
        ];
        listeners.iter_mut().filter(|(name, _)| *name == flag).for_each(|l| l.1 = taken);
        let mut command = shoal(&[]);
        command.arg("--data-dir").arg(dir.path().join("second"));
        for (name, address) in listeners {
            command.args([name, address]);
        }
        let output = command.args(["--profile", "small", "--cpus", "none"]).output_within();
        let said = format!("{}{}", stdout(&output), stderr(&output));
        assert_eq!(output.status.code(), Some(1), "{flag} {taken}: {said}");
        assert!(said.contains(&format!("on {taken}")), "{flag} {taken}: {said}");
        assert!(!said.contains("\"ready\""), "{flag} {taken}: {said}");
    }
    assert_eq!(common::terminate(&mut first), 0);
}
