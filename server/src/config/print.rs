//! The effective configuration as others see it: a config file (`--print-config`) that loads
//! back to the same configuration, the JSON the admin command returns, and each shard's
//! settings by key name for the metrics endpoint's gauges.
//!
//! Output only: nothing here reads or checks a setting.

use shoal_engine::superblock::Durability;

use super::keys::{
    IntKey, METADATA_KEYS, NETWORK_KEYS, STORAGE_KEYS, TOPIC_KEYS, TUNING_KEYS, is_bool_key,
};
use super::model::{Config, ShardSettings};

impl Config {
    /// The effective configuration as JSON (the admin command returns it): every key resolved,
    /// one object per shard (no `[shard]`/`[shard.N]` inheritance left to work out).
    pub fn to_json(&self) -> serde_json::Value {
        let mut network = serde_json::Map::new();
        for key in &NETWORK_KEYS {
            network.insert(key.name.into(), (key.get)(&self.network).into());
        }
        network.insert("shard_listen".into(), self.network.shard_listen_text().into());
        let mut topic_defaults = serde_json::Map::new();
        for key in &TOPIC_KEYS {
            topic_defaults.insert(key.name.into(), (key.get)(&self.topic_defaults).into());
            if key.name == "partitions" {
                topic_defaults.insert(
                    "durability".into(),
                    durability_name(self.topic_defaults.durability).into(),
                );
            }
        }
        let mut metadata = serde_json::Map::new();
        for key in &METADATA_KEYS {
            metadata.insert(key.name.into(), (key.get)(&self.metadata).into());
        }
        let shard: Vec<serde_json::Value> = self
            .shard
            .iter()
            .enumerate()
            .map(|(index, settings)| {
                let mut object = serde_json::Map::new();
                object.insert("index".into(), index.into());
                object.insert("cpu".into(), settings.cpu.into());
                object.insert("sqpoll_cpu".into(), settings.tuning.sqpoll_cpu.into());
                let json = |name: &str, value: u64| -> serde_json::Value {
                    if is_bool_key(name) { (value != 0).into() } else { value.into() }
                };
                for key in &STORAGE_KEYS {
                    object.insert(key.name.into(), json(key.name, (key.get)(&settings.storage)));
                }
                for key in &TUNING_KEYS {
                    object.insert(key.name.into(), json(key.name, (key.get)(&settings.tuning)));
                }
                object.into()
            })
            .collect();
        serde_json::json!({
            "data_dir": self.data_dir.to_string_lossy(),
            "native_listen": self.native_listen.to_string(),
            "shards": self.shards,
            "profile": self.profile.as_str(),
            "network": network,
            "metrics": { "listen": self.metrics.listen_text() },
            "log": { "level": self.log.level },
            "metadata": metadata,
            "topic_defaults": topic_defaults,
            "shard": shard,
        })
    }

    /// The effective configuration as a config file (`shoal --print-config`): loaded back as-is
    /// it resolves to this configuration again. `[shard]` holds shard 0's storage settings and
    /// each `[shard.N]` only what differs from them.
    pub fn to_toml(&self) -> String {
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line("# The effective shoal configuration (shoal --print-config).".into());
        line(format!("data_dir = {}", quoted(&self.data_dir.to_string_lossy())));
        line(format!("native_listen = {}", quoted(&self.native_listen.to_string())));
        line(format!("shards = {}", self.shards));
        line(format!("profile = {}", quoted(self.profile.as_str())));
        // A list when every shard is pinned; otherwise "none" plus a `cpu` per pinned shard, so
        // that loading the output back never falls into the default placement.
        let all_pinned: Option<Vec<String>> =
            self.shard.iter().map(|s| s.cpu.map(|cpu| cpu.to_string())).collect();
        let cpus = all_pinned.as_ref().map_or_else(|| "none".to_string(), |list| list.join(","));
        line(format!("cpus = {}", quoted(&cpus)));
        line(String::new());
        line("[network]".into());
        for key in &NETWORK_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.network)));
        }
        line(format!("shard_listen = {}", quoted(&self.network.shard_listen_text())));
        line(String::new());
        line("[metrics]".into());
        line(format!("listen = {}", quoted(&self.metrics.listen_text())));
        line(String::new());
        line("[log]".into());
        line(format!("level = {}", quoted(&self.log.level)));
        line(String::new());
        line("[metadata]".into());
        for key in &METADATA_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.metadata)));
        }
        line(String::new());
        line("[topic_defaults]".into());
        for key in &TOPIC_KEYS {
            line(format!("{} = {}", key.name, (key.get)(&self.topic_defaults)));
            if key.name == "partitions" {
                line(format!(
                    "durability = {}",
                    quoted(durability_name(self.topic_defaults.durability))
                ));
            }
        }
        let Some(first) = self.shard.first() else {
            return out;
        };
        line(String::new());
        line("[shard]".into());
        for key in &STORAGE_KEYS {
            line(format!("{} = {}", key.name, key_text(key, &first.storage)));
        }
        for key in &TUNING_KEYS {
            line(format!("{} = {}", key.name, key_text(key, &first.tuning)));
        }
        for (index, settings) in self.shard.iter().enumerate() {
            let mut lines = Vec::new();
            if all_pinned.is_none()
                && let Some(cpu) = settings.cpu
            {
                lines.push(format!("cpu = {cpu}"));
            }
            if let Some(cpu) = settings.tuning.sqpoll_cpu {
                lines.push(format!("sqpoll_cpu = {cpu}"));
            }
            for key in &STORAGE_KEYS {
                if (key.get)(&settings.storage) != (key.get)(&first.storage) {
                    lines.push(format!("{} = {}", key.name, key_text(key, &settings.storage)));
                }
            }
            for key in &TUNING_KEYS {
                if (key.get)(&settings.tuning) != (key.get)(&first.tuning) {
                    lines.push(format!("{} = {}", key.name, key_text(key, &settings.tuning)));
                }
            }
            if !lines.is_empty() {
                line(String::new());
                line(format!("[shard.{index}]"));
                lines.into_iter().for_each(&mut line);
            }
        }
        out
    }
}

/// A shard's settings by their `[shard]` key names, in the tables' order — the engine's storage
/// settings, then the server's tuning (the boolean keys as 0 or 1) — so the metrics endpoint can
/// show each as a gauge and a `[shard.N]` override can be seen at work.
pub fn shard_settings(settings: &ShardSettings) -> impl Iterator<Item = (&'static str, u64)> + '_ {
    let storage = STORAGE_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.storage)));
    storage.chain(TUNING_KEYS.iter().map(move |key| (key.name, (key.get)(&settings.tuning))))
}

/// A TOML string, quoted and escaped.
fn quoted(text: &str) -> String {
    toml::Value::String(text.to_string()).to_string()
}

fn durability_name(durability: Durability) -> &'static str {
    match durability {
        Durability::Replicated => "replicated",
        Durability::Persisted => "persisted",
    }
}

/// A shard key's value as written in a config file.
fn key_text<T>(key: &IntKey<T>, settings: &T) -> String {
    let value = (key.get)(settings);
    if is_bool_key(key.name) { (value != 0).to_string() } else { value.to_string() }
}
