//! The configuration's tests: every key resolved through every layer, every error naming its
//! key, the shipped config files, and the printed configuration loading back as itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::error::ErrorKind;
use clap_complete::Shell;
use shoal_engine::shard::ShardConfig;
use shoal_engine::superblock::{SEGMENT_SIZE_BYTES_MAX, SEGMENT_SIZE_BYTES_MIN};

use super::args::FLAGS;
use super::keys::{
    CLUSTER_KEYS, KAFKA_KEYS, METADATA_KEYS, NETWORK_KEYS, REPLICATION_KEYS, SERVER_KEYS,
    STORAGE_KEYS, Scope, TOPIC_KEYS, TUNING_KEYS, is_bool_key, key_words,
};
use super::*;

/// A machine with 4 CPUs, so defaults do not depend on where the tests run.
fn host() -> Host {
    Host { parallelism: 4, core_ids: vec![0, 1, 2, 3] }
}

/// Resolves a file's text, then `env`, then the command line `flags`, on [`host`].
fn resolve_with(file: &str, env: &[(&str, &str)], flags: &[&str]) -> Result<Resolved, ConfigError> {
    let args = parse_args(flags).unwrap_or_else(|error| panic!("{flags:?}: {error}"));
    let mut layers = Layers::default();
    layers.file(Path::new("test.toml"), file)?;
    layers.env(env.iter().map(|(name, value)| (name.to_string(), value.to_string())))?;
    for (flag, value) in &args.settings {
        layers.flag(flag, value)?;
    }
    layers.resolve(&host())
}

fn resolve(file: &str, env: &[(&str, &str)], flags: &[&str]) -> Config {
    resolve_with(file, env, flags).unwrap_or_else(|error| panic!("{error}")).config
}

/// The one check of every error test: resolving fails, naming `key`, with `reason` in the
/// reason.
fn check_error(file: &str, env: &[(&str, &str)], flags: &[&str], key: &str, reason: &str) {
    match resolve_with(file, env, flags) {
        Ok(_) => panic!("{file:?} {env:?} {flags:?} resolved; expected an error about {key}"),
        Err(error) => {
            assert_eq!(error.key, key, "{file:?} {env:?} {flags:?}: {error}");
            assert!(error.reason.contains(reason), "{key}: {:?} lacks {reason:?}", error.reason);
        }
    }
}

fn all_keys() -> Vec<(Scope, &'static str)> {
    let mut keys: Vec<(Scope, &'static str)> =
        SERVER_KEYS.iter().map(|&name| (Scope::Server, name)).collect();
    keys.extend(CLUSTER_KEYS.iter().map(|key| (Scope::Cluster, key.name)));
    keys.push((Scope::Cluster, "nodes"));
    keys.push((Scope::Cluster, "added_node"));
    keys.extend(NETWORK_KEYS.iter().map(|key| (Scope::Network, key.name)));
    keys.push((Scope::Network, "shard_listen"));
    keys.push((Scope::Metrics, "listen"));
    keys.extend(KAFKA_KEYS.iter().map(|&name| (Scope::Kafka, name)));
    keys.push((Scope::Log, "level"));
    keys.extend(METADATA_KEYS.iter().map(|key| (Scope::Metadata, key.name)));
    keys.extend(REPLICATION_KEYS.iter().map(|key| (Scope::Replication, key.name)));
    keys.push((Scope::TopicDefaults, "durability"));
    keys.extend(TOPIC_KEYS.iter().map(|key| (Scope::TopicDefaults, key.name)));
    keys.extend(STORAGE_KEYS.iter().map(|key| (Scope::Shard, key.name)));
    keys.extend(TUNING_KEYS.iter().map(|key| (Scope::Shard, key.name)));
    keys
}

fn env_name(scope: Scope, name: &str) -> String {
    let section = match scope {
        Scope::Server => "",
        Scope::Cluster => "CLUSTER_",
        Scope::Network => "NETWORK_",
        Scope::Metrics => "METRICS_",
        Scope::Kafka => "KAFKA_",
        Scope::Log => return "SHOAL_LOG".to_string(),
        Scope::Metadata => "METADATA_",
        Scope::Replication => "REPLICATION_",
        Scope::TopicDefaults => "TOPIC_DEFAULTS_",
        Scope::Shard | Scope::ShardN(_) => "SHARD_",
    };
    format!("SHOAL_{section}{}", name.to_ascii_uppercase())
}

#[test]
fn nothing_given_resolves_to_the_defaults() {
    let config = resolve("", &[], &[]);
    let mut expected = Config::defaults(4, false);
    for (index, settings) in expected.shard.iter_mut().enumerate() {
        settings.cpu = Some(index);
    }
    assert_eq!(config.to_json(), expected.to_json());
    assert_eq!(config.shards, 4, "one shard per available CPU");
    assert_eq!(config.data_dir, PathBuf::from("shoal-data"));
    assert_eq!(config.native_listen.to_string(), "127.0.0.1:7070");
    assert_eq!(config.profile, Profile::Default);
    let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
    assert_eq!(cpus, [Some(0), Some(1), Some(2), Some(3)], "shard i on the i-th CPU");
    for (index, settings) in config.shard.iter().enumerate() {
        assert_eq!(settings.storage.shard, index as u32);
        assert_eq!(settings.storage.shard_count, 4);
        assert_eq!(settings.storage.journal_size_bytes, ShardConfig::default().journal_size_bytes);
    }
}

#[test]
fn single_node_toml_as_shipped_is_exactly_the_defaults() {
    let text = include_str!("../../../configs/single-node.toml");
    assert_eq!(resolve(text, &[], &[]).to_json(), resolve("", &[], &[]).to_json());
}

#[test]
fn single_node_toml_and_the_docs_cover_every_key() {
    let file = include_str!("../../../configs/single-node.toml");
    let docs = include_str!("../../../docs/configuration.md");
    for (scope, name) in all_keys() {
        let dotted = scope.dotted(name);
        assert!(
            file.lines()
                .any(|line| line.trim_start_matches("# ").starts_with(&format!("{name} = "))),
            "configs/single-node.toml lacks {dotted}"
        );
        assert!(docs.contains(&format!("`{name}`")), "docs/configuration.md lacks {dotted}");
    }
    assert!(docs.contains("`cpu`"), "docs/configuration.md lacks [shard.N] cpu");
    assert!(docs.contains("`added_node`"), "docs/configuration.md lacks [cluster] added_node");
    assert!(docs.contains("`sqpoll_cpu`"), "docs/configuration.md lacks [shard.N] sqpoll_cpu");
    assert!(file.contains("# sqpoll_cpu = "), "configs/single-node.toml lacks sqpoll_cpu");
}

#[test]
fn test_toml_is_one_unpinned_small_shard_on_a_free_port() {
    let config = resolve(include_str!("../../../configs/test.toml"), &[], &[]);
    assert_eq!(config.shards, 1);
    assert_eq!(config.shard[0].cpu, None);
    assert_eq!(config.profile, Profile::Small);
    assert_eq!(config.shard[0].storage.journal_size_bytes, ShardConfig::small().journal_size_bytes);
    assert_eq!(config.topic_defaults.message_size_bytes_max, 60 << 10);
    assert_eq!(config.native_listen.port(), 0);
}

#[test]
fn later_layers_win_key_by_key() {
    let file =
        "shards = 2\ncpus = \"none\"\n[network]\nconnections_max = 10\nshard_inbox_max = 11\n";
    assert_eq!(resolve(file, &[], &[]).shards, 2, "the file over the default");
    let env = [("SHOAL_SHARDS", "3"), ("SHOAL_NETWORK_CONNECTIONS_MAX", "20")];
    let config = resolve(file, &env, &[]);
    assert_eq!(config.shards, 3, "the environment over the file");
    assert_eq!(config.network.connections_max, 20);
    assert_eq!(config.network.shard_inbox_max, 11, "keys the environment leaves keep the file's");
    let config = resolve(file, &env, &["--shards", "5", "--shards=6"]);
    assert_eq!(config.shards, 6, "flags over the environment; the last flag wins");
    assert_eq!(config.network.connections_max, 20);
    let config = resolve("", &[("SHOAL_CPUS", "none")], &["--cpus", "0,1,2,3"]);
    assert_eq!(config.shard[3].cpu, Some(3));
    let config = resolve("", &[], &["--cpus", "none", "--cpus", "3,2,1,0"]);
    assert_eq!(config.shard[0].cpu, Some(3));
}

#[test]
fn shard_n_overrides_shard_and_beats_the_environment_for_its_shard() {
    let file = "shards = 3\n[shard]\nring_bytes_max = 2000000\nchunks_max = 7\n\
                [shard.1]\nring_bytes_max = 3000000\ncpu = 2\n";
    let config = resolve(file, &[("SHOAL_SHARD_RING_BYTES_MAX", "4000000")], &[]);
    let ring: Vec<usize> = config.shard.iter().map(|s| s.storage.ring.bytes_max).collect();
    assert_eq!(ring, [4_000_000, 3_000_000, 4_000_000], "env replaces [shard], not [shard.1]");
    assert!(config.shard.iter().all(|s| s.storage.chunks_max == 7));
    assert!(config.shard.iter().all(|s| s.storage.ring.entries_max == 65_536));
    let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
    assert_eq!(cpus, [None, Some(2), None], "a [shard.N] cpu turns the default placement off");
    let config = resolve(file, &[], &["--cpus", "0,1,3"]);
    let cpus: Vec<Option<usize>> = config.shard.iter().map(|s| s.cpu).collect();
    assert_eq!(cpus, [Some(0), Some(2), Some(3)], "[shard.1] cpu beats cpus");
}

#[test]
fn a_shard_n_past_the_shard_count_is_refused() {
    check_error("shards = 2\n[shard.2]\nchunks_max = 3\n", &[], &[], "shard.2", "no shard 2");
    check_error("[shard.4]\n", &[], &[], "shard.4", "0 to 3");
    check_error("[shard.1]\n", &[], &["--shards", "1"], "shard.1", "shards is 1");
    check_error("[shard.01]\n", &[], &[], "shard.01", "unknown key");
    assert_eq!(resolve("[shard.3]\n", &[], &[]).shards, 4, "the last shard is in range");
}

#[test]
fn unknown_keys_are_refused_by_name() {
    // (file, key named)
    let in_the_file = [
        ("sharts = 2\n", "sharts"),
        ("[server]\nlisten = \"127.0.0.1:1\"\n", "server.listen"),
        ("[network]\nconections_max = 5\n", "network.conections_max"),
        ("[netwrok]\nconnections_max = 5\n", "netwrok"),
        ("[topic_defaults]\nsegment_bytes = 5\n", "topic_defaults.segment_bytes"),
        ("[shard.0]\nring_bytes = 5\n", "shard.0.ring_bytes"),
    ];
    for (file, key) in in_the_file {
        check_error(file, &[], &[], key, "unknown key");
    }
    // Misspelt, lower-case, and per-shard (which only the file has).
    for var in ["SHOAL_NETWORK_CONECTIONS_MAX", "SHOAL_shards", "SHOAL_SHARD_0_CPU"] {
        check_error("", &[(var, "5")], &[], var, "unknown SHOAL_ variable");
    }
    check_error("[shard]\ncpu = 1\n", &[], &[], "shard.cpu", "per shard");
}

#[test]
fn command_line_mistakes_are_usage_errors_naming_the_flag() {
    // (command line, clap's kind of error, what its message names)
    let mistakes: &[(&[&str], ErrorKind, &str)] = &[
        (&["--shard", "5"], ErrorKind::UnknownArgument, "'--shard'"),
        (&["shards"], ErrorKind::InvalidSubcommand, "'shards'"),
        (&["--data-dir"], ErrorKind::InvalidValue, "'--data-dir <DIR>'"),
        (&["--print-config=yes"], ErrorKind::TooManyValues, "'--print-config'"),
        (&["completions", "tcsh"], ErrorKind::InvalidValue, "'tcsh'"),
    ];
    for &(flags, kind, named) in mistakes {
        let error = parse_args(flags).expect_err(&format!("{flags:?} parsed"));
        assert_eq!((error.kind(), error.exit_code()), (kind, 2), "{flags:?}: {error}");
        assert!(error.to_string().contains(named), "{flags:?}: {error}");
    }
    let help = parse_args(["--help"]).expect_err("--help is answered by clap");
    assert_eq!((help.kind(), help.exit_code()), (ErrorKind::DisplayHelp, 0));
    let help = help.to_string();
    for flag in FLAGS.iter().map(|flag| flag.name).chain(["--config", "--print-config"]) {
        assert!(help.contains(flag), "--help lacks {flag}: {help}");
    }
}

#[test]
fn setting_flags_keep_every_value_in_command_line_order() {
    let args = parse_args(["--shards", "5", "--data-dir=-d", "--print-config", "--shards=6"])
        .unwrap_or_else(|error| panic!("{error}"));
    let expected = [("--shards", "5"), ("--data-dir", "-d"), ("--shards", "6")];
    let settings: Vec<(&str, &str)> =
        args.settings.iter().map(|(flag, value)| (*flag, value.as_str())).collect();
    assert_eq!(settings, expected);
    assert!(args.print_config && args.config_file.is_none() && args.completions.is_none());
    // An earlier value is still checked, though the later one would win.
    check_error("", &[], &["--shards", "0", "--shards", "5"], "--shards", "outside 1..=256");
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        let args = parse_args(["completions", &shell.to_string()]).expect("a shell");
        assert_eq!(args.completions, Some(shell));
        let script = String::from_utf8(completion_script(shell)).expect("a script is text");
        assert!(script.contains("metrics-listen"), "{shell}: {script}");
    }
}

#[test]
fn variables_other_programs_own_are_left_alone() {
    let env = [
        ("SHOAL_BENCH_DIR", "/nowhere"),
        ("SHOAL_SIM_SEEDS", "9"),
        ("PATH", "/bin"),
        ("HOME", "/root"),
    ];
    assert_eq!(resolve("", &env, &[]).to_json(), resolve("", &[], &[]).to_json());
}

#[test]
fn every_validation_error_names_its_key() {
    // (file, key named, part of the reason)
    let in_the_file: &[(&str, &str, &str)] = &[
        // Each key's own bounds and type.
        (
            "[topic_defaults]\nsegment_size_bytes = 1000\n",
            "topic_defaults.segment_size_bytes",
            "outside 1048576..=4294967296",
        ),
        ("shards = \"two\"\n", "shards", "expected an integer, found a string"),
        ("[server]\nshards = 1.5\n", "server.shards", "expected an integer, found a float"),
        ("[topic_defaults]\nretention_ms = -1\n", "topic_defaults.retention_ms", "negative"),
        ("native_listen = \"localhost\"\n", "native_listen", "not an IP address and port"),
        ("native_listen = 7070\n", "native_listen", "expected a string"),
        ("data_dir = \"\"\n", "data_dir", "must not be empty"),
        ("profile = \"huge\"\n", "profile", "use \"default\" or \"small\""),
        (
            "[topic_defaults]\ndurability = \"fast\"\n",
            "topic_defaults.durability",
            "use replicated or persisted",
        ),
        ("cpus = \"0,one\"\n", "cpus", "comma-separated CPU list"),
        ("cpus = \"0,1\"\n", "cpus", "cpus names 2 CPUs for 4 shards"),
        ("[shard.0]\ncpu = 70000\n", "shard.0.cpu", "outside 0..=65535"),
        ("shards = 2\ncpus = \"1,1\"\n", "cpus", "shards 0 and 1 would both be pinned"),
        (
            "shards = 2\n[shard.0]\ncpu = 1\n[shard.1]\ncpu = 1\n",
            "shard.1.cpu",
            "shards 0 and 1 would both",
        ),
        ("[shard]\nchunks_max = 0\n", "shard.chunks_max", "outside 1..="),
        // Rules between keys: the key the user set is named.
        ("[shard]\nchunk_size_bytes = 8192\n", "shard.chunk_size_bytes", "must hold record_size"),
        (
            "[shard.1]\nrecord_size_bytes_max = 5000000\n",
            "shard.1.record_size_bytes_max",
            "must hold record_size",
        ),
        (
            "[shard]\njournal_size_bytes = 1048577\n",
            "shard.journal_size_bytes",
            "not a multiple of the 4096",
        ),
        (
            "[shard]\njournal_size_bytes = 1048576\n",
            "shard.journal_size_bytes",
            "two of the largest records",
        ),
        (
            "[shard]\nready_ahead_bytes = 5000\n",
            "shard.ready_ahead_bytes",
            "not a multiple of the 4096",
        ),
        (
            "[shard]\nring_bytes_max = 1000\n",
            "shard.ring_bytes_max",
            "must hold the largest record",
        ),
        ("[shard]\nring_budget_bytes = 1048576\n", "shard.ring_budget_bytes", "one full ring"),
        (
            "[topic_defaults]\nmessage_size_bytes_max = 2097152\n",
            "topic_defaults.message_size_bytes_max",
            "must fit shard 0's record",
        ),
        (
            "profile = \"small\"\n[shard.2]\nrecord_size_bytes_max = 4096\n",
            "shard.2.record_size_bytes_max",
            "must fit shard 2's",
        ),
        (
            "[topic_defaults]\nsegment_size_bytes = 1048576\n",
            "topic_defaults.segment_size_bytes",
            "must fit a segment",
        ),
        (
            "[network]\nframe_size_bytes_max = 4096\n",
            "network.frame_size_bytes_max",
            "must carry the largest message",
        ),
        ("[kafka]\nlisten = \"0.0.0.0:7070\"\n", "kafka.listen", "would share a port"),
        (
            "[metrics]\nlisten = \"127.0.0.1:9092\"\n[kafka]\nlisten = \"0.0.0.0:9092\"\n",
            "kafka.listen",
            "would share a port",
        ),
        ("[topic_defaults]\npartitions = 20000\n", "topic_defaults.partitions", "past the bound"),
        // The file's shape.
        ("shards = 2\n[server]\nshards = 3\n", "server.shards", "set it once"),
        ("network = 5\n", "network", "must be a table"),
        ("[shard]\n0 = 5\n", "shard.0", "must be a table"),
        ("shards = 2\nshards = 3\n", "test.toml", "line 2"),
        ("[network\n", "test.toml", "not a valid TOML file: line 1"),
    ];
    for &(file, key, reason) in in_the_file {
        check_error(file, &[], &[], key, reason);
    }
    // (variable, value, part of the reason); the variable is the key named.
    let in_the_environment: &[(&str, &str, &str)] = &[
        ("SHOAL_NETWORK_CONNECTIONS_MAX", "0", "outside 1..="),
        ("SHOAL_SHARDS", "x", "not a non-negative decimal integer"),
        ("SHOAL_SHARDS", "", "not a non-negative decimal integer"),
        ("SHOAL_PROFILE", "Small", "use \"default\""),
        ("SHOAL_TOPIC_DEFAULTS_DURABILITY", "", "use replicated or persisted"),
        ("SHOAL_SHARD_READY_AHEAD_BYTES", "5000", "not a multiple"),
        ("SHOAL_CPUS", "0,1", "SHOAL_CPUS names 2 CPUs for 4 shards"),
    ];
    for &(var, value, reason) in in_the_environment {
        check_error("", &[(var, value)], &[], var, reason);
    }
    // (command line, key named, part of the reason)
    let on_the_command_line: &[(&[&str], &str, &str)] = &[
        (&["--shards", "0"], "--shards", "outside 1..=256"),
        (&["--shards=257"], "--shards", "outside 1..=256"),
        (&["--listen", "1.2.3.4"], "--listen", "not an IP address and port"),
        (&["--shards", "2", "--cpus", "0"], "--cpus", "--cpus names 1 CPUs for 2 shards"),
        (&["--profile", "tiny"], "--profile", "use \"default\" or \"small\""),
    ];
    for &(flags, key, reason) in on_the_command_line {
        check_error("", &[], flags, key, reason);
    }
}

#[test]
fn each_integer_key_is_refused_just_past_its_bounds_and_taken_at_them() {
    for (scope, name) in all_keys() {
        let Some((_, min, max)) = scope
            .int_key(name)
            .or_else(|| (name == "shards").then_some((name, 1, u64::from(SHARDS_MAX))))
        else {
            continue;
        };
        let var = env_name(scope, name);
        let past = [min.checked_sub(1), max.checked_add(1)];
        for value in past.into_iter().flatten() {
            let value = value.to_string();
            check_error("", &[(var.as_str(), value.as_str())], &[], &var, "outside");
        }
        // At a bound a key may still break a rule with another key, but never its own.
        for value in [min, max] {
            let value = value.to_string();
            if let Err(error) = resolve_with("", &[(var.as_str(), value.as_str())], &[]) {
                assert!(!error.reason.contains("outside"), "{var}={value}: {error}");
            }
        }
    }
}

#[test]
fn the_limits_themselves_are_accepted() {
    assert_eq!(resolve("shards = 256\ncpus = \"none\"\n", &[], &[]).shards, 256);
    let small = "profile = \"small\"\n[topic_defaults]\nsegment_size_bytes = 1048576\n";
    assert_eq!(resolve(small, &[], &[]).topic_defaults.segment_size_bytes, SEGMENT_SIZE_BYTES_MIN);
    let largest = "[topic_defaults]\nsegment_size_bytes = 4294967296\n";
    assert_eq!(
        resolve(largest, &[], &[]).topic_defaults.segment_size_bytes,
        SEGMENT_SIZE_BYTES_MAX
    );
    // message_size_bytes_max may use the whole record bound but the header.
    let exact = "[topic_defaults]\nmessage_size_bytes_max = 1048576\n\
                 [shard]\nrecord_size_bytes_max = 1048832\n";
    assert_eq!(resolve(exact, &[], &[]).topic_defaults.message_size_bytes_max, 1 << 20);
    check_error(
        "[topic_defaults]\nmessage_size_bytes_max = 1048577\n",
        &[],
        &[],
        "topic_defaults.message_size_bytes_max",
        "must fit",
    );
    // A chunk of exactly the largest record plus a block.
    let chunk = "[shard]\nchunk_size_bytes = 1052928\n";
    assert_eq!(resolve(chunk, &[], &[]).shard[0].storage.chunk_size_bytes, 1_052_928);
    check_error(
        "[shard]\nchunk_size_bytes = 1052927\n",
        &[],
        &[],
        "shard.chunk_size_bytes",
        "must hold",
    );
}

#[test]
fn too_few_cpus_for_the_default_placement_leaves_shards_unpinned_with_a_warning() {
    let resolved = resolve_with("shards = 5\n", &[], &[]).unwrap();
    assert!(resolved.config.shard.iter().all(|s| s.cpu.is_none()));
    assert_eq!(resolved.warnings, ["5 shards on 4 CPUs: shard threads are not pinned"]);
    assert!(resolve_with("", &[], &[]).unwrap().warnings.is_empty());
}

#[test]
fn printed_config_loads_back_to_the_same_config() {
    let files = [
        "",
        include_str!("../../../configs/test.toml"),
        "data_dir = 'dir \"with\" quotes\\\\'\nshards = 3\n[shard]\nchunks_max = 9\n\
         [shard.1]\ncpu = 7\nring_entries_max = 5\n[shard.2]\nscan_window_bytes = 8192\n",
        "[topic_defaults]\ndurability = \"persisted\"\nretention_ms = 9223372036854775807\n",
        "shards = 2\ncpus = \"3,5\"\n[network]\nshard_listen = \"0.0.0.0:7100\"\n\
         [shard]\nuring_entries = 1024\n[shard.0]\nsqpoll_idle_ms = 20\nsqpoll_cpu = 4\n\
         [shard.1]\ndirect_io = false\nflush_delay_us_max = 300\nsegment_age_ms_max = 0\n",
        include_str!("../../../configs/i4i.4xlarge.toml"),
    ];
    for file in files {
        let config = resolve(file, &[], &[]);
        let printed = config.to_toml();
        let again = resolve(&printed, &[], &[]);
        assert_eq!(again.to_json(), config.to_json(), "{file}\n---\n{printed}");
    }
    let printed = resolve(files[2], &[], &[]).to_toml();
    assert!(printed.contains("cpus = \"none\""), "{printed}");
    assert!(printed.contains("[shard.1]\ncpu = 7\nring_entries_max = 5\n"), "{printed}");
    assert!(!printed.contains("[shard.0]"), "shard 0 is [shard] itself: {printed}");
}

#[test]
fn metrics_listen_and_log_level_resolve_through_every_layer() {
    let config = resolve("", &[], &[]);
    assert_eq!(config.metrics.listen_text(), "127.0.0.1:9464");
    assert_eq!(config.log.level, "info");
    let file = "[metrics]\nlisten = \"127.0.0.1:1\"\n[log]\nlevel = \"warn\"\n";
    let config = resolve(file, &[], &[]);
    assert_eq!(config.metrics.listen_text(), "127.0.0.1:1");
    assert_eq!(config.log.level, "warn");
    let env = [("SHOAL_METRICS_LISTEN", "off"), ("SHOAL_LOG", "DEBUG")];
    let config = resolve(file, &env, &[]);
    assert_eq!(config.metrics.listen, None, "off turns the endpoint off");
    assert_eq!(config.log.level, "debug", "SHOAL_LOG over the file, lower-cased");
    let flags = ["--metrics-listen", "127.0.0.1:0", "--log-level=error,shoal_server=trace"];
    let config = resolve(file, &env, &flags);
    assert_eq!(config.metrics.listen_text(), "127.0.0.1:0");
    assert_eq!(config.log.level, "error,shoal_server=trace");
}

#[test]
fn kafka_listen_and_stream_resolve_through_every_layer_and_from_the_cluster_list() {
    let config = resolve("", &[], &[]);
    assert_eq!(config.kafka.listen_text(), "127.0.0.1:9092");
    assert_eq!(config.kafka.stream, "kafka");
    let file = "[kafka]\nlisten = \"127.0.0.1:1\"\nstream = \"legacy\"\n";
    let config = resolve(file, &[], &[]);
    assert_eq!(
        (config.kafka.listen_text().as_str(), config.kafka.stream.as_str()),
        ("127.0.0.1:1", "legacy")
    );
    let config = resolve(file, &[("SHOAL_KAFKA_LISTEN", "off")], &[]);
    assert_eq!(config.kafka.listen, None, "off turns the listener off");
    let config =
        resolve(file, &[("SHOAL_KAFKA_LISTEN", "off")], &["--kafka-listen", "127.0.0.1:0"]);
    assert_eq!(config.kafka.listen_text(), "127.0.0.1:0");
    // In a cluster the node's own kafka address is the default, and [kafka] listen still wins.
    let nodes = "bus=127.0.0.1:7200,client=127.0.0.1:7070,kafka=127.0.0.1:9093;\
                 bus=127.0.0.1:7210,client=127.0.0.1:7071,kafka=127.0.0.1:9094";
    let env = [("SHOAL_CLUSTER_NODES", nodes), ("SHOAL_CLUSTER_NODE", "1")];
    assert_eq!(resolve("", &env, &[]).kafka.listen_text(), "127.0.0.1:9094");
    assert_eq!(resolve(file, &env, &[]).kafka.listen_text(), "127.0.0.1:1");
}

#[test]
fn a_bad_kafka_listen_or_stream_is_refused_by_name() {
    check_error("[kafka]\nlisten = \"localhost\"\n", &[], &[], "kafka.listen", "or \"off\"");
    check_error("[kafka]\nstream = \"a/b\"\n", &[], &[], "kafka.stream", "not a stream name");
    check_error("", &[("SHOAL_KAFKA_STREAM", "")], &[], "SHOAL_KAFKA_STREAM", "not be empty");
    check_error("[kafka]\nauto = 1\n", &[], &[], "kafka.auto", "unknown key");
}

#[test]
fn a_bad_metrics_listen_or_log_level_is_refused_by_name() {
    check_error("[metrics]\nlisten = \"localhost\"\n", &[], &[], "metrics.listen", "or \"off\"");
    check_error("[metrics]\nport = 1\n", &[], &[], "metrics.port", "unknown key");
    check_error("[log]\nlevel = \"loud\"\n", &[], &[], "log.level", "\"loud\" is not a level");
    check_error("[log]\nlevel = 3\n", &[], &[], "log.level", "expected a string");
    check_error("", &[("SHOAL_LOG", "inf")], &[], "SHOAL_LOG", "is not a level");
    check_error("", &[("SHOAL_LOG_LEVEL", "info")], &[], "SHOAL_LOG_LEVEL", "is SHOAL_LOG");
    check_error("", &[], &["--log-level", "a b=info"], "--log-level", "not a target");
    check_error("", &[], &["--metrics-listen", "9464"], "--metrics-listen", "IP address");
}

#[test]
fn log_filters_are_checked_and_normalised() {
    assert_eq!(log_filter("INFO"), Ok("info".to_string()));
    assert_eq!(
        log_filter(" warn , shoal_server::shard = Debug "),
        Ok("warn,shoal_server::shard=debug".to_string())
    );
    assert_eq!(log_filter("shoal_server=off"), Ok("shoal_server=off".to_string()));
    for bad in ["", "info,debug", "verbose", "=info", "shoal-server=info", "a=b=c", "info,"] {
        assert!(log_filter(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn shard_tuning_resolves_through_every_layer_with_shard_n_winning() {
    let config = resolve("", &[], &[]);
    assert!(config.shard.iter().all(|s| s.tuning == ShardTuning::default()));
    assert_eq!(config.shard[0].tuning.uring_entries, 256, "what the shards were built with");
    assert_eq!(config.shard[0].tuning.segment_age_ms_max, 7 * 24 * 3600 * 1000);
    let file = "shards = 3\n[shard]\nuring_entries = 512\nflush_delay_us_max = 100\n\
                [shard.1]\nuring_entries = 2048\ndirect_io = false\nsqpoll_idle_ms = 5\n\
                sqpoll_cpu = 3\nsegment_age_ms_max = 3600000\n";
    let env = [("SHOAL_SHARD_URING_ENTRIES", "1024"), ("SHOAL_SHARD_DIRECT_IO", "true")];
    let config = resolve(file, &env, &["--cpus", "0,1,2"]);
    let tuning: Vec<ShardTuning> = config.shard.iter().map(|s| s.tuning).collect();
    let entries: Vec<u32> = tuning.iter().map(|t| t.uring_entries).collect();
    assert_eq!(entries, [1024, 2048, 1024], "env replaces [shard], not [shard.1]");
    let direct: Vec<bool> = tuning.iter().map(|t| t.direct_io).collect();
    assert_eq!(direct, [true, false, true]);
    let sqpoll: Vec<u32> = tuning.iter().map(|t| t.sqpoll_idle_ms).collect();
    assert_eq!(sqpoll, [0, 5, 0]);
    let sqpoll_cpus: Vec<Option<usize>> = tuning.iter().map(|t| t.sqpoll_cpu).collect();
    assert_eq!(sqpoll_cpus, [None, Some(3), None]);
    assert!(tuning.iter().all(|t| t.flush_delay_us_max == 100));
    assert_eq!(tuning[1].segment_age_ms_max, 3_600_000);
    let settings: BTreeMap<&str, u64> = shard_settings(&config.shard[1]).collect();
    assert_eq!(settings["uring_entries"], 2048, "the gauges see the override");
    assert_eq!(settings["direct_io"], 0);
    assert_eq!(settings["ring_bytes_max"], 64 << 20, "storage keys are there too");
    let json = config.to_json();
    assert_eq!(json["shard"][1]["direct_io"], false);
    assert_eq!(json["shard"][0]["uring_entries"], 1024);
}

#[test]
fn recycle_segments_is_a_boolean_storage_key() {
    let config = resolve("", &[], &[]);
    assert!(config.shard.iter().all(|s| s.storage.recycle_segments), "on by default");
    let file = "shards = 2\n[shard.1]\nrecycle_segments = false\n";
    let config = resolve(file, &[], &["--cpus", "none"]);
    let recycle: Vec<bool> = config.shard.iter().map(|s| s.storage.recycle_segments).collect();
    assert_eq!(recycle, [true, false]);
    let settings: BTreeMap<&str, u64> = shard_settings(&config.shard[1]).collect();
    assert_eq!(settings["recycle_segments"], 0);
    assert_eq!(config.to_json()["shard"][1]["recycle_segments"], false);
    assert!(config.to_toml().contains("recycle_segments = true"), "{}", config.to_toml());
    let config = resolve("", &[("SHOAL_SHARD_RECYCLE_SEGMENTS", "false")], &[]);
    assert!(!config.shard[0].storage.recycle_segments);
    check_error("[shard]\nrecycle_segments = 0\n", &[], &[], "shard.recycle_segments", "true");
}

#[test]
fn shard_tuning_is_refused_by_name_when_it_cannot_work() {
    check_error("[shard]\nuring_entries = 300\n", &[], &[], "shard.uring_entries", "power of two");
    check_error("[shard.2]\nuring_entries = 128\n", &[], &[], "shard.2.uring_entries", "256..=");
    check_error("[shard]\ndirect_io = 1\n", &[], &[], "shard.direct_io", "true or false");
    check_error("", &[("SHOAL_SHARD_DIRECT_IO", "yes")], &[], "SHOAL_SHARD_DIRECT_IO", "true");
    check_error(
        "[shard]\nflush_delay_us_max = 100001\n",
        &[],
        &[],
        "shard.flush_delay_us_max",
        "outside 0..=100000",
    );
    // SQPOLL needs a pinned shard (not pinned by "none", nor by a default placement that
    // found too few CPUs) and a CPU of its own for the polling thread.
    let unpinned = "cpus = \"none\"\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 2\n";
    check_error(unpinned, &[], &[], "shard.1.sqpoll_idle_ms", "pin shard 1 first");
    let unpinned = "cpus = \"none\"\n[shard.1]\nsqpoll_idle_ms = 10\n";
    check_error(unpinned, &[], &[], "shard.1.sqpoll_idle_ms", "[shard.1] cpu");
    check_error(
        "shards = 5\n[shard]\nsqpoll_idle_ms = 10\n",
        &[],
        &[],
        "shard.sqpoll_idle_ms",
        "[shard.0] cpu",
    );
    let no_cpu = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\n";
    check_error(no_cpu, &[], &[], "shard.1.sqpoll_idle_ms", "shares the shard's CPU 1");
    let on_a_shard = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 0\n";
    check_error(on_a_shard, &[], &[], "shard.1.sqpoll_cpu", "CPU 0 runs shard 0");
    let shared = "shards = 2\n[shard]\nsqpoll_idle_ms = 10\n\
                  [shard.0]\nsqpoll_cpu = 3\n[shard.1]\nsqpoll_cpu = 3\n";
    check_error(shared, &[], &[], "shard.0.sqpoll_cpu", "already polls shard 1");
    check_error("[shard.0]\nsqpoll_cpu = 3\n", &[], &[], "shard.0.sqpoll_cpu", "SQPOLL is off");
    check_error("[shard]\nsqpoll_cpu = 3\n", &[], &[], "shard.sqpoll_cpu", "per shard");
    let good = "shards = 2\n[shard.1]\nsqpoll_idle_ms = 10\nsqpoll_cpu = 3\n";
    let config = resolve(good, &[], &[]);
    assert_eq!(config.shard[1].tuning.sqpoll_idle_ms, 10);
    assert_eq!(config.shard[1].tuning.sqpoll_cpu, Some(3));
    // Topic settings stay node-wide, with the reason instead of "unknown key".
    for key in ["segment_size_bytes", "durability", "retention_ms", "partitions"] {
        let file = format!("[shard.0]\n{key} = 1\n");
        check_error(&file, &[], &[], &format!("shard.0.{key}"), "[topic_defaults]");
    }
}

#[test]
fn shard_listen_gives_each_shard_its_port_within_the_port_range() {
    let config = resolve("", &[], &[]);
    assert_eq!(config.network.shard_listen, None, "off by default");
    assert_eq!(config.network.shard_listen_address(0), None);
    let config = resolve("[network]\nshard_listen = \"127.0.0.1:7100\"\n", &[], &[]);
    let ports: Vec<u16> =
        (0..4).filter_map(|i| config.network.shard_listen_address(i)).map(|a| a.port()).collect();
    assert_eq!(ports, [7100, 7101, 7102, 7103]);
    let config = resolve("", &[("SHOAL_NETWORK_SHARD_LISTEN", "127.0.0.1:0")], &[]);
    let ports: Vec<u16> =
        (0..4).filter_map(|i| config.network.shard_listen_address(i)).map(|a| a.port()).collect();
    assert_eq!(ports, [0, 0, 0, 0], "port 0: each shard picks a free one");
    let last = "[network]\nshard_listen = \"127.0.0.1:65532\"\n";
    assert_eq!(resolve(last, &[], &[]).network.shard_listen_address(3).unwrap().port(), 65535);
    let past = "[network]\nshard_listen = \"127.0.0.1:65533\"\n";
    check_error(past, &[], &[], "network.shard_listen", "at most 65532");
    let clash = "native_listen = \"0.0.0.0:7102\"\n[network]\nshard_listen = \"127.0.0.1:7100\"\n";
    check_error(clash, &[], &[], "network.shard_listen", "shard 2's own port");
    let bad = [("SHOAL_NETWORK_SHARD_LISTEN", "7100")];
    check_error("", &bad, &[], "SHOAL_NETWORK_SHARD_LISTEN", "or \"off\"");
    let off = resolve("[network]\nshard_listen = \"off\"\n", &[], &[]);
    assert_eq!(off.network.shard_listen_text(), "off");
}

#[test]
fn i4i_profile_parses_validates_and_explains_every_choice() {
    let text = include_str!("../../../configs/i4i.4xlarge.toml");
    // As shipped (its CPU list names CPUs this machine may not have: resolving checks no
    // CPU), and unpinned, as a smaller test box would run it.
    for flags in [&[][..], &["--cpus", "none"][..]] {
        let config = resolve(text, &[], flags);
        assert_eq!(config.shards, 14);
        assert_eq!(config.profile, Profile::Default);
        assert!(config.shard.iter().all(|s| s.tuning.sqpoll_idle_ms == 0), "SQPOLL off");
        assert!(config.network.shard_listen.is_some(), "clients can reach the owner");
    }
    let pinned = resolve(text, &[], &[]);
    let cpus: Vec<Option<usize>> = pinned.shard.iter().map(|s| s.cpu).collect();
    assert!(!cpus.contains(&Some(0)) && !cpus.contains(&Some(8)), "core 0 left to the kernel");
    // Every setting line carries its reason in the comment lines right above it.
    let mut commented = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('#') {
            commented = true;
        } else if line.contains(" = ") {
            assert!(commented, "no reason given for {line:?}");
            commented = false;
        } else if line.is_empty() || line.starts_with('[') {
            commented = false;
        }
    }
}

#[test]
fn json_holds_every_key_of_every_shard() {
    let config = resolve("shards = 2\n[shard.1]\ncpu = 3\n", &[], &[]);
    let json = config.to_json();
    assert_eq!(json["shards"], 2);
    assert_eq!(json["profile"], "default");
    assert_eq!(json["topic_defaults"]["durability"], "replicated");
    assert_eq!(json["network"]["connections_max"], 1024);
    assert_eq!(json["shard"][0]["cpu"], serde_json::Value::Null);
    assert_eq!(json["shard"][1]["cpu"], 3);
    for key in &STORAGE_KEYS {
        let value = &json["shard"][1][key.name];
        assert!(
            value.is_u64()
                || is_bool_key(key.name) && value.is_boolean()
                || key_words(key.name).is_some() && value.is_string(),
            "{}",
            key.name
        );
    }
    for key in &TUNING_KEYS {
        let value = &json["shard"][1][key.name];
        assert!(value.is_u64() || value.is_boolean(), "{}", key.name);
    }
    assert_eq!(json["network"]["shard_listen"], "off");
}

/// Three nodes on loopback, as inline tables: the second without kafka and rack.
const THREE_NODES: &str = "[cluster]\nid = 5\nnodes = [\n\
    { bus = \"127.0.0.1:7200\", client = \"127.0.0.1:7070\", kafka = \"127.0.0.1:9092\", \
      rack = \"a\" },\n\
    { bus = \"127.0.0.1:7210\", client = \"127.0.0.1:7071\" },\n\
    { bus = \"127.0.0.1:7220\", client = \"127.0.0.1:7072\", rack = \"c.1-x_Y\" },\n]\n";

/// A `[cluster]` whose nodes are these inline tables' insides (`bus = "...", client = "..."`).
fn cluster_file(nodes: &[&str]) -> String {
    let nodes: String = nodes.iter().map(|node| format!("  {{ {node} }},\n")).collect();
    format!("[cluster]\nnodes = [\n{nodes}]\n")
}

/// Nodes in the text form `SHOAL_CLUSTER_NODES` and `--cluster-nodes` take.
fn nodes_text(nodes: &[ClusterNode]) -> String {
    nodes.iter().map(ClusterNode::to_string).collect::<Vec<_>>().join(";")
}

fn address(text: &str) -> std::net::SocketAddr {
    text.parse().expect("a test address")
}

#[test]
fn without_cluster_the_node_is_a_one_node_cluster_as_before() {
    let config = resolve("", &[], &[]);
    let cluster = &config.cluster;
    assert_eq!(
        *cluster,
        ClusterConfig {
            id: 1,
            node: 0,
            nodes: Vec::new(),
            added_node: None,
            balancer_interval_ms: 0
        }
    );
    assert_eq!(cluster.founders(), 1);
    assert_eq!(cluster.bus_address(0, 0), None);
    assert_eq!(cluster.entry(0).map(|n| n.client), None);
    assert_eq!(config.native_listen.to_string(), "127.0.0.1:7070", "native_listen unchanged");
    let json = config.to_json();
    let cluster_json =
        serde_json::json!({ "id": 1, "node": 0, "balancer_interval_ms": 0, "nodes": [] });
    assert_eq!(json["cluster"], cluster_json);
    // The same with the keys given at their defaults.
    let explicit = "[cluster]\nid = 1\nnode = 0\nbalancer_interval_ms = 0\nnodes = []\n";
    assert_eq!(resolve(explicit, &[], &[]).to_json(), json);
    assert_eq!(resolve("", &[("SHOAL_CLUSTER_NODES", "")], &[]).to_json(), json);
}

#[test]
fn cluster_nodes_resolve_and_give_each_shard_its_bus_port() {
    let config = resolve(THREE_NODES, &[], &[]);
    let cluster = &config.cluster;
    assert_eq!((cluster.id, cluster.node, cluster.founders()), (5, 0, 3));
    assert_eq!(
        cluster.nodes[0],
        ClusterNode {
            bus: address("127.0.0.1:7200"),
            client: address("127.0.0.1:7070"),
            kafka: Some(address("127.0.0.1:9092")),
            rack: Some("a".to_string()),
        }
    );
    assert_eq!((cluster.nodes[1].kafka, cluster.nodes[1].rack.as_deref()), (None, None));
    assert_eq!(cluster.nodes[2].rack.as_deref(), Some("c.1-x_Y"));
    assert_eq!(cluster.bus_address(1, 0), Some(address("127.0.0.1:7210")));
    assert_eq!(cluster.bus_address(2, 3), Some(address("127.0.0.1:7223")));
    assert_eq!(cluster.bus_address(3, 0), None, "no node 3");
    assert_eq!(cluster.entry(2).map(|n| n.client), Some(address("127.0.0.1:7072")));
    assert_eq!(cluster.entry(3).map(|n| n.client), None);
    // `[[cluster.nodes]]` is the same TOML value.
    let tables = "[cluster]\nid = 5\n\
        [[cluster.nodes]]\nbus = \"127.0.0.1:7200\"\nclient = \"127.0.0.1:7070\"\n\
        kafka = \"127.0.0.1:9092\"\nrack = \"a\"\n\
        [[cluster.nodes]]\nbus = \"127.0.0.1:7210\"\nclient = \"127.0.0.1:7071\"\n\
        [[cluster.nodes]]\nbus = \"127.0.0.1:7220\"\nclient = \"127.0.0.1:7072\"\n\
        rack = \"c.1-x_Y\"\n";
    assert_eq!(resolve(tables, &[], &[]).cluster, *cluster);
    // One node is a cluster too: its client address becomes the listener.
    let one = cluster_file(&["bus = \"127.0.0.1:7200\", client = \"127.0.0.1:7300\""]);
    let config = resolve(&one, &[], &[]);
    assert_eq!(config.cluster.founders(), 1);
    assert_eq!(config.native_listen, address("127.0.0.1:7300"));
}

#[test]
fn cluster_keys_resolve_through_every_layer_flags_beating_env_beating_the_file() {
    let file = resolve(THREE_NODES, &[], &[]).cluster;
    let mut env_nodes = file.nodes.clone();
    env_nodes.truncate(2);
    env_nodes[1].kafka = Some(address("127.0.0.1:9093"));
    let env_text = nodes_text(&env_nodes);
    let env = [
        ("SHOAL_CLUSTER_ID", "6"),
        ("SHOAL_CLUSTER_NODE", "1"),
        ("SHOAL_CLUSTER_NODES", env_text.as_str()),
    ];
    let config = resolve(THREE_NODES, &env, &[]);
    assert_eq!(
        config.cluster,
        ClusterConfig {
            id: 6,
            node: 1,
            nodes: env_nodes.clone(),
            added_node: None,
            balancer_interval_ms: 0
        }
    );
    let only_node = resolve(THREE_NODES, &[("SHOAL_CLUSTER_NODE", "2")], &[]).cluster;
    assert_eq!((only_node.id, only_node.node), (5, 2), "keys the env leaves keep the file's");
    assert_eq!(only_node.nodes, file.nodes);
    let mut flag_nodes = file.nodes.clone();
    flag_nodes.push(ClusterNode {
        bus: address("127.0.0.1:7230"),
        client: address("127.0.0.1:7073"),
        kafka: None,
        rack: Some("d".to_string()),
    });
    let flag_text = nodes_text(&flag_nodes);
    let flags = ["--cluster-id", "7", "--cluster-node=3", "--cluster-nodes", flag_text.as_str()];
    let config = resolve(THREE_NODES, &env, &flags);
    assert_eq!(
        config.cluster,
        ClusterConfig {
            id: 7,
            node: 3,
            nodes: flag_nodes,
            added_node: None,
            balancer_interval_ms: 0
        }
    );
    assert_eq!(config.native_listen, address("127.0.0.1:7073"), "node 3's client address");
    // An empty text is no nodes: a one-node cluster again.
    let config = resolve(THREE_NODES, &[], &["--cluster-nodes", ""]);
    assert_eq!(
        config.cluster,
        ClusterConfig {
            id: 5,
            node: 0,
            nodes: Vec::new(),
            added_node: None,
            balancer_interval_ms: 0
        }
    );
    assert_eq!(config.native_listen, address("127.0.0.1:7070"));
}

#[test]
fn the_nodes_text_form_round_trips() {
    let nodes = vec![
        ClusterNode {
            bus: address("127.0.0.1:7200"),
            client: address("127.0.0.1:7070"),
            kafka: Some(address("127.0.0.1:9092")),
            rack: Some("rack-1.a_b".to_string()),
        },
        ClusterNode {
            bus: address("[::1]:7210"),
            client: address("[::1]:7071"),
            kafka: None,
            rack: None,
        },
        ClusterNode {
            bus: address("10.0.0.3:7200"),
            client: address("10.0.0.3:7070"),
            kafka: None,
            rack: Some("c".to_string()),
        },
    ];
    let text = nodes_text(&nodes);
    assert_eq!(
        text,
        "bus=127.0.0.1:7200,client=127.0.0.1:7070,kafka=127.0.0.1:9092,rack=rack-1.a_b;\
         bus=[::1]:7210,client=[::1]:7071;bus=10.0.0.3:7200,client=10.0.0.3:7070,rack=c"
    );
    assert_eq!(resolve("", &[("SHOAL_CLUSTER_NODES", &text)], &[]).cluster.nodes, nodes);
    assert_eq!(resolve("", &[], &["--cluster-nodes", &text]).cluster.nodes, nodes);
    // Spaces around pairs and keys in any order are the same nodes.
    let loose = " client = 127.0.0.1:7070 , bus=127.0.0.1:7200,rack=rack-1.a_b,\
                 kafka=127.0.0.1:9092 ;\
                 bus=[::1]:7210,client=[::1]:7071; rack=c,bus=10.0.0.3:7200,client=10.0.0.3:7070";
    assert_eq!(resolve("", &[], &["--cluster-nodes", loose]).cluster.nodes, nodes);
}

#[test]
fn native_listen_defaults_to_this_nodes_client_address_unless_set() {
    let env = [("SHOAL_CLUSTER_NODE", "2")];
    let config = resolve(THREE_NODES, &env, &[]);
    assert_eq!(config.native_listen, address("127.0.0.1:7072"));
    let printed = config.to_toml();
    assert!(printed.contains("native_listen = \"127.0.0.1:7072\""), "{printed}");
    assert_eq!(config.to_json()["native_listen"], "127.0.0.1:7072");
    // Set by any layer, it stays what was set.
    let file = format!("native_listen = \"0.0.0.0:7072\"\n{THREE_NODES}");
    assert_eq!(resolve(&file, &env, &[]).native_listen, address("0.0.0.0:7072"));
    let set = [("SHOAL_CLUSTER_NODE", "2"), ("SHOAL_NATIVE_LISTEN", "127.0.0.1:0")];
    assert_eq!(resolve(THREE_NODES, &set, &[]).native_listen.port(), 0);
    let flags = ["--listen", "127.0.0.1:8000"];
    assert_eq!(resolve(THREE_NODES, &env, &flags).native_listen.port(), 8000);
}

#[test]
fn printed_cluster_config_loads_back_to_the_same_config() {
    let tables = cluster_file(&[
        "bus = \"[::1]:7200\", client = \"[::1]:7070\", rack = \"r\"",
        "bus = \"[::1]:7210\", client = \"[::1]:7071\", kafka = \"[::1]:9093\"",
    ]);
    for (file, env) in [(THREE_NODES, "1"), (tables.as_str(), "1"), (THREE_NODES, "0")] {
        let config = resolve(file, &[("SHOAL_CLUSTER_NODE", env)], &[]);
        let printed = config.to_toml();
        let again = resolve(&printed, &[], &[]);
        assert_eq!(again.cluster, config.cluster, "{printed}");
        assert_eq!(again.to_json(), config.to_json(), "{file}\n---\n{printed}");
    }
    let printed = resolve("", &[], &[]).to_toml();
    let cluster = "[cluster]\nid = 1\nnode = 0\nbalancer_interval_ms = 0\nnodes = []\n";
    assert!(printed.contains(cluster), "{printed}");
}

#[test]
fn a_bad_cluster_key_or_node_is_refused_by_name_and_index() {
    let bus = "bus = \"127.0.0.1:7200\"";
    let client = "client = \"127.0.0.1:7070\"";
    let second = "bus = \"127.0.0.1:7210\", client = \"127.0.0.1:7071\"";
    // (file, key named, part of the reason)
    let in_the_file: Vec<(String, &str, &str)> = vec![
        ("[cluster]\nid = 0\n".into(), "cluster.id", "outside 1..="),
        ("[cluster]\nnode = 32\n".into(), "cluster.node", "outside 0..=31"),
        ("[cluster]\nname = \"x\"\n".into(), "cluster.name", "unknown key"),
        ("cluster = 1\n".into(), "cluster", "must be a table"),
        ("[cluster]\nnodes = \"x\"\n".into(), "cluster.nodes", "expected an array of tables"),
        ("[cluster]\nnodes = [1]\n".into(), "cluster.nodes[0]", "expected a table"),
        (cluster_file(&[second, bus]), "cluster.nodes[1]", "missing client"),
        (cluster_file(&[client]), "cluster.nodes[0]", "missing bus"),
        (
            cluster_file(&[second, &format!("{bus}, {client}, zone = \"a\"")]),
            "cluster.nodes[1].zone",
            "unknown key (a node has bus, client, kafka, rack)",
        ),
        (
            cluster_file(&[second, &format!("bus = \"127.0.0.1\", {client}")]),
            "cluster.nodes[1].bus",
            "\"127.0.0.1\" is not an IP address and port",
        ),
        (
            cluster_file(&[&format!("bus = 7200, {client}")]),
            "cluster.nodes[0].bus",
            "expected a string, found a integer",
        ),
        (
            cluster_file(&[&format!("{bus}, {client}, kafka = \"localhost:9092\"")]),
            "cluster.nodes[0].kafka",
            "not an IP address and port",
        ),
        (
            cluster_file(&[&format!("{bus}, {client}, rack = \"rack 1\"")]),
            "cluster.nodes[0].rack",
            "a rack name is 1 to 64",
        ),
        (
            cluster_file(&[&format!("{bus}, {client}, rack = \"\"")]),
            "cluster.nodes[0].rack",
            "a rack name",
        ),
        (
            cluster_file(&[&format!("{bus}, {client}, rack = \"{}\"", "r".repeat(65))]),
            "cluster.nodes[0].rack",
            "a rack name",
        ),
        (
            cluster_file(&[&format!("{bus}, {client}, rack = 1")]),
            "cluster.nodes[0].rack",
            "expected a string",
        ),
    ];
    for (file, key, reason) in &in_the_file {
        check_error(file, &[], &[], key, reason);
    }
    let rack_64 = cluster_file(&[&format!("{bus}, {client}, rack = \"{}\"", "r".repeat(64))]);
    assert_eq!(
        resolve(&rack_64, &[], &[]).cluster.nodes[0].rack.as_ref().map(String::len),
        Some(64)
    );
    // The text form names the variable or the flag, then the node and its key.
    let ok = "bus=127.0.0.1:7200,client=127.0.0.1:7070";
    let in_the_text: &[(&str, &str, &str)] = &[
        ("bus=127.0.0.1:7200", "[0]", "missing client"),
        (&format!("{ok};client=127.0.0.1:7071"), "[1]", "missing bus"),
        (&format!("{ok};"), "[1]", "empty: nodes are separated by ';'"),
        (&format!("{ok};;{ok}"), "[1]", "empty"),
        ("bus,client=127.0.0.1:7070", "[0]", "\"bus\" is not key=value"),
        (&format!("{ok},"), "[0]", "\"\" is not key=value"),
        (&format!("{ok},bus=127.0.0.1:7300"), "[0].bus", "given twice"),
        (&format!("{ok},zone=a"), "[0].zone", "unknown key"),
        (&format!("{ok};bus=127.0.0.1:x,client=127.0.0.1:7071"), "[1].bus", "not an IP"),
        (&format!("{ok},rack=a/b"), "[0].rack", "a rack name"),
    ];
    for &(text, at, reason) in in_the_text {
        let var = "SHOAL_CLUSTER_NODES";
        check_error("", &[(var, text)], &[], &format!("{var}{at}"), reason);
        check_error("", &[], &["--cluster-nodes", text], &format!("--cluster-nodes{at}"), reason);
    }
    check_error("", &[("SHOAL_CLUSTER_ID", "0")], &[], "SHOAL_CLUSTER_ID", "outside 1..=");
    check_error("", &[], &["--cluster-node", "x"], "--cluster-node", "not a non-negative");
    check_error("", &[("SHOAL_CLUSTER_NODE_ID", "1")], &[], "SHOAL_CLUSTER_NODE_ID", "unknown");
}

#[test]
fn cluster_rules_name_the_key_the_user_set() {
    check_error(
        "[cluster]\nnode = 1\n",
        &[],
        &[],
        "cluster.node",
        "nodes is empty, so node must be 0",
    );
    check_error("", &[("SHOAL_CLUSTER_NODE", "2")], &[], "SHOAL_CLUSTER_NODE", "must be 0");
    let past = "node 3 is past the 3 founding nodes: give its addresses in added_node";
    check_error(THREE_NODES, &[], &["--cluster-node", "3"], "--cluster-node", past);
    let env = [("SHOAL_CLUSTER_NODE", "5")];
    check_error(THREE_NODES, &env, &[], "SHOAL_CLUSTER_NODE", "node 5 is past the 3 founding");
    // Up to 32 nodes, one more is refused.
    let many = |count: u16| {
        (0..count)
            .map(|i| format!("bus=127.0.0.1:{},client=127.0.0.1:{}", 10_000 + 10 * i, 7000 + i))
            .collect::<Vec<_>>()
            .join(";")
    };
    let config = resolve("", &[("SHOAL_CLUSTER_NODES", &many(32))], &["--cluster-node", "31"]);
    assert_eq!(config.cluster.founders(), 32);
    check_error(
        "",
        &[("SHOAL_CLUSTER_NODES", &many(33))],
        &[],
        "SHOAL_CLUSTER_NODES",
        "at most 32",
    );
}

#[test]
fn cluster_addresses_must_be_dialable_and_never_collide() {
    let node = |bus: &str, client: &str| format!("bus = \"{bus}\", client = \"{client}\"");
    let first = node("127.0.0.1:7200", "127.0.0.1:7070");
    // (nodes, key named, part of the reason); the host has 4 shards, so 4 bus ports a node.
    let checks: Vec<(Vec<String>, &str, &str)> = vec![
        (vec![first.clone(), node("127.0.0.1:0", "127.0.0.1:7071")], "[1].bus", "port 0"),
        (vec![node("127.0.0.1:7200", "127.0.0.1:0")], "[0].client", "port 0"),
        (
            vec![format!("{first}, kafka = \"127.0.0.1:0\"")],
            "[0].kafka",
            "port 0 picks a free port, which no peer or client could know",
        ),
        (
            vec![node("127.0.0.1:65533", "127.0.0.1:7070")],
            "[0].bus",
            "shard 3 would listen on bus port 65536: with 4 shards the bus base port may be at \
             most 65532",
        ),
        (
            vec![first.clone(), node("127.0.0.1:7203", "127.0.0.1:7071")],
            "[1].bus",
            "bus ports 7203..=7206 overlap node 0's (7200..=7203)",
        ),
        (
            vec![first.clone(), node("0.0.0.0:7198", "127.0.0.1:7071")],
            "[1].bus",
            "overlap node 0's",
        ),
        (
            vec![node("127.0.0.1:7068", "127.0.0.1:7070")],
            "[0].bus",
            "include its own client port 7070",
        ),
        (
            vec![first.clone(), node("127.0.0.1:7210", "127.0.0.1:7201")],
            "[0].bus",
            "include node 1's client port 7201",
        ),
        (
            vec![first.clone(), node("127.0.0.1:7210", "127.0.0.1:7070")],
            "[1].client",
            "127.0.0.1:7070 is node 0's client address too",
        ),
    ];
    for (nodes, at, reason) in &checks {
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        check_error(&cluster_file(&nodes), &[], &[], &format!("cluster.nodes{at}"), reason);
    }
    // The same ports on other IPs, adjacent ranges and the last base port are all fine.
    let fine = [
        vec![first.clone(), node("127.0.0.2:7200", "127.0.0.2:7070")],
        vec![first.clone(), node("127.0.0.1:7204", "127.0.0.1:7071")],
        vec![node("127.0.0.1:65532", "127.0.0.1:7070")],
        vec![node("127.0.0.1:7200", "127.0.0.1:7204")],
    ];
    for nodes in &fine {
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        let config = resolve(&cluster_file(&nodes), &[], &[]);
        assert_eq!(config.cluster.nodes.len(), nodes.len());
    }
    let last = resolve(&cluster_file(&[&node("127.0.0.1:65532", "127.0.0.1:7070")]), &[], &[]);
    assert_eq!(last.cluster.bus_address(0, 3).map(|a| a.port()), Some(65535));
    assert_eq!(last.cluster.bus_address(0, 4), None, "past the port range");
    // Fewer shards, fewer bus ports: the range follows the shard count.
    let file = cluster_file(&[&first, &node("127.0.0.1:7202", "127.0.0.1:7071")]);
    assert_eq!(resolve(&file, &[], &["--shards", "2"]).cluster.nodes.len(), 2);
    check_error(&file, &[], &["--shards", "3"], "cluster.nodes[1].bus", "overlap");
}

/// Node 3's addresses, as an inline table's insides: a node added later to [`THREE_NODES`].
const ADDED_NODE: &str = "bus = \"127.0.0.1:7230\", client = \"127.0.0.1:7073\", \
                          kafka = \"127.0.0.1:9095\", rack = \"d\"";

/// [`ADDED_NODE`] as the resolved node.
fn added_node() -> ClusterNode {
    ClusterNode {
        bus: address("127.0.0.1:7230"),
        client: address("127.0.0.1:7073"),
        kafka: Some(address("127.0.0.1:9095")),
        rack: Some("d".to_string()),
    }
}

/// [`THREE_NODES`] on node `node`, with an `added_node` of these inline table's insides.
fn added_file(node: u8, added: &str) -> String {
    format!("{THREE_NODES}node = {node}\nadded_node = {{ {added} }}\n")
}

#[test]
fn added_node_resolves_through_every_layer_in_the_form_of_one_node() {
    let config = resolve(&added_file(3, ADDED_NODE), &[], &[]);
    let cluster = &config.cluster;
    assert_eq!(cluster.added_node, Some(added_node()));
    assert_eq!(cluster.nodes, resolve(THREE_NODES, &[], &[]).cluster.nodes, "the founders");
    assert_eq!((cluster.node, cluster.founders(), cluster.founders()), (3, 3, 3));
    assert_eq!(cluster.own_node(), Some(&added_node()));
    // `[cluster.added_node]` is the same TOML value.
    let table = format!(
        "{THREE_NODES}node = 3\n[cluster.added_node]\nbus = \"127.0.0.1:7230\"\n\
         client = \"127.0.0.1:7073\"\nkafka = \"127.0.0.1:9095\"\nrack = \"d\"\n"
    );
    assert_eq!(resolve(&table, &[], &[]).cluster, *cluster);
    // The text form of one node, in the environment and on the command line.
    let text = added_node().to_string();
    let env = [("SHOAL_CLUSTER_NODE", "3"), ("SHOAL_CLUSTER_ADDED_NODE", text.as_str())];
    assert_eq!(resolve(THREE_NODES, &env, &[]).cluster, *cluster);
    let flags = ["--cluster-node", "3", "--cluster-added-node", text.as_str()];
    assert_eq!(resolve(THREE_NODES, &[], &flags).cluster, *cluster);
    let loose = " rack=d , client = 127.0.0.1:7073,kafka=127.0.0.1:9095, bus=127.0.0.1:7230 ";
    let flags = ["--cluster-node", "3", "--cluster-added-node", loose];
    assert_eq!(resolve(THREE_NODES, &[], &flags).cluster, *cluster);
    // Later layers win: the flag over the environment over the file.
    let flag_node = ClusterNode {
        bus: address("127.0.0.1:7240"),
        client: address("127.0.0.1:7074"),
        kafka: None,
        rack: None,
    };
    let flag_text = flag_node.to_string();
    let env_text = ClusterNode { rack: None, ..added_node() }.to_string();
    let env = [("SHOAL_CLUSTER_ADDED_NODE", env_text.as_str())];
    let file = added_file(3, ADDED_NODE);
    assert_eq!(resolve(&file, &env, &[]).cluster.added_node.and_then(|node| node.rack), None);
    let flags = ["--cluster-added-node", flag_text.as_str()];
    assert_eq!(resolve(&file, &env, &flags).cluster.added_node, Some(flag_node));
    // An empty text takes back an earlier layer's: node 1 is a founding node again.
    let env = [("SHOAL_CLUSTER_ADDED_NODE", "")];
    let founding = resolve(&file, &env, &["--cluster-node", "1"]).cluster;
    assert_eq!(founding.added_node, None);
    assert_eq!(founding.own_node(), Some(&founding.nodes[1]));
}

#[test]
fn an_added_node_answers_for_its_own_addresses_and_the_founders() {
    let config = resolve(&added_file(3, ADDED_NODE), &[], &[]);
    let cluster = &config.cluster;
    assert_eq!(cluster.bus_address(3, 0), Some(address("127.0.0.1:7230")));
    assert_eq!(cluster.bus_address(3, 3), Some(address("127.0.0.1:7233")));
    assert_eq!(cluster.entry(3).map(|n| n.client), Some(address("127.0.0.1:7073")));
    assert_eq!(cluster.entry(3).and_then(|n| n.kafka), Some(address("127.0.0.1:9095")));
    assert_eq!(cluster.bus_address(1, 2), Some(address("127.0.0.1:7212")));
    assert_eq!(cluster.entry(0).map(|n| n.client), Some(address("127.0.0.1:7070")));
    assert_eq!(cluster.entry(0).and_then(|n| n.kafka), Some(address("127.0.0.1:9092")));
    // Other nodes added later are in the cluster's metadata, not in this configuration.
    assert_eq!(cluster.bus_address(4, 0), None);
    assert_eq!(cluster.entry(4).map(|n| n.client), None);
    assert_eq!(cluster.entry(4).and_then(|n| n.kafka), None);
    // Its listeners default to its own addresses, as a founding node's do.
    assert_eq!(config.native_listen, address("127.0.0.1:7073"));
    assert_eq!(config.kafka.listen, Some(address("127.0.0.1:9095")));
    // The last index a node may have.
    let last = resolve(&added_file(31, ADDED_NODE), &[], &[]).cluster;
    assert_eq!(last.bus_address(31, 1), Some(address("127.0.0.1:7231")));
    assert_eq!(last.own_node(), Some(&added_node()));
    // A founding node's own entry is in nodes; a one-node cluster has none.
    let founding = resolve(THREE_NODES, &[("SHOAL_CLUSTER_NODE", "2")], &[]).cluster;
    assert_eq!(founding.own_node(), Some(&founding.nodes[2]));
    assert_eq!(founding.bus_address(3, 0), None, "no added node here");
    assert_eq!(resolve("", &[], &[]).cluster.own_node(), None);
}

#[test]
fn a_bad_added_node_is_refused_naming_its_key() {
    let file = |added: &str| format!("{THREE_NODES}node = 3\nadded_node = {added}\n");
    let (bus, client) = ("bus = \"127.0.0.1:7230\"", "client = \"127.0.0.1:7073\"");
    // (file, key named, part of the reason)
    let in_the_file: Vec<(String, &str, &str)> = vec![
        (
            file("\"bus=127.0.0.1:7230,client=127.0.0.1:7073\""),
            "cluster.added_node",
            "expected a table ({ bus = \"IP:PORT\", client = \"IP:PORT\" }), found a string",
        ),
        (file(&format!("[{{ {bus}, {client} }}]")), "cluster.added_node", "found a array"),
        (file(&format!("{{ {bus} }}")), "cluster.added_node", "missing client"),
        (file(&format!("{{ {client} }}")), "cluster.added_node", "missing bus"),
        (
            file(&format!("{{ bus = \"127.0.0.1\", {client} }}")),
            "cluster.added_node.bus",
            "\"127.0.0.1\" is not an IP address and port",
        ),
        (
            file(&format!("{{ {bus}, {client}, zone = \"a\" }}")),
            "cluster.added_node.zone",
            "unknown key (a node has bus, client, kafka, rack)",
        ),
        (
            file(&format!("{{ {bus}, {client}, rack = \"rack 1\" }}")),
            "cluster.added_node.rack",
            "a rack name is 1 to 64",
        ),
    ];
    for (file, key, reason) in &in_the_file {
        check_error(file, &[], &[], key, reason);
    }
    // The text form names the variable or the flag, then the node's key.
    let ok = "bus=127.0.0.1:7230,client=127.0.0.1:7073";
    let in_the_text: &[(&str, &str, &str)] = &[
        ("bus=127.0.0.1:7230", "", "missing client"),
        ("bus,client=127.0.0.1:7073", "", "\"bus\" is not key=value (keys: bus, client"),
        (&format!("{ok},"), "", "\"\" is not key=value"),
        (&format!("{ok},bus=127.0.0.1:7240"), ".bus", "given twice"),
        (&format!("{ok},kafka=x"), ".kafka", "\"x\" is not an IP address and port"),
        (&format!("{ok},rack=a/b"), ".rack", "a rack name"),
        (
            &format!("{ok};bus=127.0.0.1:7240,client=127.0.0.1:7074"),
            "",
            "one node only (';' separates the nodes of nodes",
        ),
    ];
    for &(text, at, reason) in in_the_text {
        let var = "SHOAL_CLUSTER_ADDED_NODE";
        check_error(THREE_NODES, &[(var, text)], &[], &format!("{var}{at}"), reason);
        let flag = "--cluster-added-node";
        check_error(THREE_NODES, &[], &[flag, text], &format!("{flag}{at}"), reason);
    }
}

#[test]
fn added_node_is_required_exactly_for_a_node_past_the_founders() {
    let text = added_node().to_string();
    // A one-node cluster has no founders' list to add to, whatever node says.
    let one_node = format!("[cluster]\nadded_node = {{ {ADDED_NODE} }}\n");
    let reason = "nodes is empty: a one-node cluster cannot grow by added_node";
    check_error(&one_node, &[], &[], "cluster.added_node", reason);
    check_error(&one_node, &[], &["--cluster-node", "3"], "cluster.added_node", reason);
    let env = [("SHOAL_CLUSTER_ADDED_NODE", text.as_str())];
    check_error("", &env, &[], "SHOAL_CLUSTER_ADDED_NODE", reason);
    // A founding node has its entry in nodes.
    check_error(
        &added_file(1, ADDED_NODE),
        &[],
        &[],
        "cluster.added_node",
        "node 1 is one of the founding nodes: added_node is for a node added later",
    );
    let flags = ["--cluster-added-node", text.as_str()];
    check_error(THREE_NODES, &[], &flags, "--cluster-added-node", "node 0 is one of the founding");
    // A node past the founders needs its addresses.
    check_error(
        &format!("{THREE_NODES}node = 3\n"),
        &[],
        &[],
        "cluster.node",
        "node 3 is past the 3 founding nodes: give its addresses in added_node",
    );
    let env = [("SHOAL_CLUSTER_ADDED_NODE", "")];
    check_error(&added_file(4, ADDED_NODE), &env, &[], "cluster.node", "node 4 is past the 3");
    // Below NODES_MAX, as any node.
    check_error(&added_file(32, ADDED_NODE), &[], &[], "cluster.node", "outside 0..=31");
    let flags = ["--cluster-node", "32"];
    check_error(&added_file(31, ADDED_NODE), &[], &flags, "--cluster-node", "outside 0..=31");
}

#[test]
fn an_added_nodes_addresses_are_checked_as_a_founding_nodes() {
    let node = |bus: &str, client: &str| format!("bus = \"{bus}\", client = \"{client}\"");
    // THREE_NODES' bus ranges are 7200..=7203, 7210..=7213 and 7220..=7223 (4 shards), its
    // clients 7070 to 7072. (added node, key named after cluster.added_node, part of the reason)
    let checks: Vec<(String, &str, &str)> = vec![
        (node("127.0.0.1:0", "127.0.0.1:7073"), ".bus", "port 0 picks a free port"),
        (node("127.0.0.1:7230", "127.0.0.1:0"), ".client", "port 0"),
        (
            format!("{}, kafka = \"127.0.0.1:0\"", node("127.0.0.1:7230", "127.0.0.1:7073")),
            ".kafka",
            "port 0",
        ),
        (
            node("127.0.0.1:65533", "127.0.0.1:7073"),
            ".bus",
            "shard 3 would listen on bus port 65536: with 4 shards the bus base port may be at \
             most 65532",
        ),
        (
            node("127.0.0.1:7213", "127.0.0.1:7073"),
            ".bus",
            "bus ports 7213..=7216 overlap node 1's (7210..=7213)",
        ),
        (node("0.0.0.0:7222", "127.0.0.1:7073"), ".bus", "overlap node 2's"),
        (
            node("127.0.0.1:7230", "127.0.0.1:7071"),
            ".client",
            "127.0.0.1:7071 is node 1's client address too",
        ),
        (
            node("127.0.0.1:7069", "127.0.0.1:7073"),
            ".bus",
            "bus ports 7069..=7072 include node 0's client port 7070",
        ),
        (
            node("127.0.0.1:7230", "127.0.0.1:7232"),
            ".bus",
            "bus ports 7230..=7233 include its own client port 7232",
        ),
        // The founders' bus ranges are fixed: the added node's client is at fault.
        (
            node("127.0.0.1:7230", "127.0.0.1:7201"),
            ".client",
            "client port 7201 is within node 0's bus ports 7200..=7203",
        ),
    ];
    for (added, at, reason) in &checks {
        let key = format!("cluster.added_node{at}");
        check_error(&added_file(3, added), &[], &[], &key, reason);
    }
    let env = [
        ("SHOAL_CLUSTER_NODE", "3"),
        ("SHOAL_CLUSTER_ADDED_NODE", "bus=127.0.0.1:7230,client=127.0.0.1:7070"),
    ];
    check_error(THREE_NODES, &env, &[], "SHOAL_CLUSTER_ADDED_NODE.client", "node 0's client");
    // The same ports on another IP, and a range just past a founder's, are fine.
    for (bus, client) in
        [("127.0.0.2:7200", "127.0.0.2:7070"), ("127.0.0.1:7224", "127.0.0.1:7073")]
    {
        let config = resolve(&added_file(3, &node(bus, client)), &[], &[]);
        assert_eq!(config.cluster.bus_address(3, 0), Some(address(bus)));
    }
}

#[test]
fn printed_added_node_loads_back_to_the_same_config() {
    let config = resolve(&added_file(3, ADDED_NODE), &[], &[]);
    let printed = config.to_toml();
    let table = "[cluster.added_node]\nbus = \"127.0.0.1:7230\"\nclient = \"127.0.0.1:7073\"\n\
                 kafka = \"127.0.0.1:9095\"\nrack = \"d\"\n";
    assert!(printed.contains(table), "{printed}");
    let again = resolve(&printed, &[], &[]);
    assert_eq!(again.cluster, config.cluster, "{printed}");
    assert_eq!(again.to_json(), config.to_json(), "{printed}");
    assert_eq!(
        config.to_json()["cluster"]["added_node"],
        serde_json::json!({
            "bus": "127.0.0.1:7230",
            "client": "127.0.0.1:7073",
            "kafka": "127.0.0.1:9095",
            "rack": "d",
        })
    );
    // A founding node prints no added_node.
    let founding = resolve(THREE_NODES, &[], &[]);
    assert!(!founding.to_toml().contains("added_node"), "{}", founding.to_toml());
    assert_eq!(founding.to_json()["cluster"].get("added_node"), None);
}

#[test]
fn cluster_3_configs_resolve_agree_and_never_share_a_port() {
    let files = [
        include_str!("../../../configs/cluster-3/node-0.toml"),
        include_str!("../../../configs/cluster-3/node-1.toml"),
        include_str!("../../../configs/cluster-3/node-2.toml"),
    ];
    let configs: Vec<Config> = files.iter().map(|file| resolve(file, &[], &[])).collect();
    let mut listeners: Vec<(String, std::net::SocketAddr)> = Vec::new();
    for (index, config) in configs.iter().enumerate() {
        let cluster = &config.cluster;
        assert_eq!(usize::from(cluster.node), index);
        assert_eq!(
            ClusterConfig { node: 0, ..cluster.clone() },
            ClusterConfig { node: 0, ..configs[0].cluster.clone() },
            "node {index} agrees with node 0 on [cluster] but for node"
        );
        assert_eq!((cluster.id, cluster.founders(), config.shards), (1, 3, 2));
        assert_eq!(config.data_dir, PathBuf::from(format!("data/cluster-3/node-{index}")));
        assert_eq!(config.native_listen, cluster.nodes[index].client, "from [cluster]");
        let node = cluster.node;
        let mut own = vec![("native", config.native_listen)];
        own.extend(config.metrics.listen.map(|address| ("metrics", address)));
        own.extend(
            (0..config.shards)
                .filter_map(|s| config.network.shard_listen_address(s))
                .map(|a| ("shard", a)),
        );
        own.extend((0..config.shards).map(|s| ("bus", cluster.bus_address(node, s).expect("bus"))));
        own.extend(cluster.nodes[index].kafka.map(|address| ("kafka", address)));
        listeners.extend(
            own.into_iter().map(|(what, address)| (format!("node {index} {what}"), address)),
        );
    }
    let mut ports = BTreeMap::new();
    for (what, address) in &listeners {
        assert!(address.ip().is_loopback() && address.port() != 0, "{what}: {address}");
        if let Some(other) = ports.insert(address.port(), what) {
            panic!("{what} and {other} both use port {}", address.port());
        }
    }
    assert_eq!(listeners.len(), 3 * (1 + 1 + 2 + 1), "native, metrics, 2 bus ports, kafka");
}

/// A cluster's view changes and bus have rules a node of one, which has neither, is spared.
#[test]
fn a_cluster_needs_view_changes_longer_than_two_commit_intervals_and_a_bus_queue_of_two_records() {
    let view_change = "[replication]\nview_change_timeout_ms = 150\n";
    let bus_queue = "[network]\nbus_queue_bytes_max = 2097152\n[replication]\n\
                     repair_bytes_max = 524288\nserve_read_bytes_max = 524288\n";
    for file in [view_change, bus_queue] {
        resolve(file, &[], &[]);
    }
    let in_cluster = |file: &str| format!("{THREE_NODES}{file}");
    check_error(
        &in_cluster(view_change),
        &[],
        &[],
        "replication.view_change_timeout_ms",
        "at least twice commit_interval_ms",
    );
    check_error(
        &in_cluster(bus_queue),
        &[],
        &[],
        "network.bus_queue_bytes_max",
        "must hold two of shard",
    );
}

#[test]
fn replication_timers_resolve_and_must_outlast_the_commit_interval() {
    let config = resolve(
        "[replication]\nheartbeat_timeout_ms = 500\n",
        &[("SHOAL_REPLICATION_VIEW_CHANGE_TIMEOUT_MS", "900")],
        &[],
    );
    assert_eq!(config.replication.heartbeat_timeout_ms, 500);
    assert_eq!(config.replication.view_change_timeout_ms, 900);
    assert_eq!(config.replication.commit_interval_ms, 100);
    check_error(
        "[replication]\nheartbeat_timeout_ms = 100\n",
        &[],
        &[],
        "replication.heartbeat_timeout_ms",
        "must be longer than commit_interval_ms (100)",
    );
    check_error(
        "[replication]\ncommit_interval_ms = 20000\n",
        &[],
        &[],
        "replication.commit_interval_ms",
        "heartbeat_timeout_ms (1000) must be longer",
    );
}

#[test]
fn the_idle_heartbeat_interval_defaults_to_a_quarter_of_the_timeout_and_is_bounded() {
    let config = resolve("", &[], &[]);
    assert_eq!(config.replication.idle_heartbeat_interval_ms, 0);
    assert_eq!(config.replication.idle_heartbeat_interval_ms_resolved(), 250);
    let config = resolve("[replication]\nheartbeat_timeout_ms = 200\n", &[], &[]);
    assert_eq!(
        config.replication.idle_heartbeat_interval_ms_resolved(),
        100,
        "the commit interval"
    );
    let config = resolve("[replication]\nheartbeat_timeout_ms = 600000\n", &[], &[]);
    assert_eq!(config.replication.idle_heartbeat_interval_ms_resolved(), 7_500, "the lag bound's");
    let config = resolve(
        "[replication]\nidle_heartbeat_interval_ms = 400\n",
        &[("SHOAL_REPLICATION_HEARTBEAT_TIMEOUT_MS", "2000")],
        &[],
    );
    assert_eq!(config.replication.idle_heartbeat_interval_ms_resolved(), 400);
    check_error(
        "[replication]\nidle_heartbeat_interval_ms = 50\n",
        &[],
        &[],
        "replication.idle_heartbeat_interval_ms",
        "must be at least commit_interval_ms (100)",
    );
    check_error(
        "[replication]\nidle_heartbeat_interval_ms = 1000\n",
        &[],
        &[],
        "replication.idle_heartbeat_interval_ms",
        "heartbeat_timeout_ms (1000) must be longer than the idle heartbeat interval (1000 ms",
    );
    let config = resolve("[replication]\nreplica_lag_time_max_ms = 200\n", &[], &[]);
    assert_eq!(
        config.replication.idle_heartbeat_interval_ms_resolved(),
        100,
        "the commit interval"
    );
    check_error(
        "[replication]\nidle_heartbeat_interval_ms = 300\nreplica_lag_time_max_ms = 300\n",
        &[],
        &[],
        "replication.replica_lag_time_max_ms",
        "must be longer than the idle heartbeat interval (300 ms",
    );
}

#[test]
fn a_repair_round_must_fit_twice_in_a_peer_bus_queue() {
    let config = resolve("[replication]\nrepair_bytes_max = 1048576\n", &[], &[]);
    assert_eq!(config.replication.repair_bytes_max, 1 << 20);
    // At the bound: half the queue.
    let at =
        "[replication]\nrepair_bytes_max = 2097152\n[network]\nbus_queue_bytes_max = 4194304\n";
    assert_eq!(resolve(at, &[], &[]).replication.repair_bytes_max, 2 << 20);
    check_error(
        "[network]\nbus_queue_bytes_max = 4194304\n",
        &[],
        &[],
        // Blamed on the key the file set.
        "network.bus_queue_bytes_max",
        "repair_bytes_max (8388608) must be at most half of bus_queue_bytes_max (4194304)",
    );
    // One disk read served to a peer is bounded alike.
    check_error(
        "[replication]\nrepair_bytes_max = 1048576\nserve_read_bytes_max = 2097153\n\
         [network]\nbus_queue_bytes_max = 4194304\n",
        &[],
        &[],
        "replication.serve_read_bytes_max",
        "serve_read_bytes_max (2097153) must be at most half of bus_queue_bytes_max (4194304)",
    );
}
