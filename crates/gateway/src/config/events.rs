//! `--kv-events-config`: the KV-event publisher settings engines were started with, for
//! workers whose `/server_info` advertises none (vLLM has no `/server_info`; older SGLang
//! builds do not advertise). The same JSON the engines take (`--kv-events-config` of SGLang
//! and vLLM: `endpoint`, `replay_endpoint`, `topic`, `publisher`; other keys ignored), plus
//! `block_size` and `dp_size` when the worker does not report them. It becomes the worker's
//! `kv_events` descriptor, so the subscription is the same as for an advertised one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use thiserror::Error;

use super::ConfigError;
use super::section::{Section, invalid};

/// The KV-event subscriptions and the chain index they feed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventsSection {
    /// Blocks the KV-event chain index holds, over every worker and rank, before it
    /// evicts the oldest chain ends (about 170 bytes each).
    pub kv_events_max_blocks: usize,
    /// The KV-event publisher settings the engines were started with (the JSON of their
    /// own `--kv-events-config`: `endpoint`, `replay_endpoint`, `topic`; plus `block_size`
    /// and `dp_size` when the workers do not report them), for workers whose
    /// `/server_info` advertises no `kv_events` (vLLM has none). The endpoint's wildcard
    /// host is each worker's own host.
    pub kv_events_config: Option<String>,
    /// Per worker URL, that worker's own `kv_events_config` JSON (config file only:
    /// `[kv_events_configs]`, `"http://10.0.0.1:8000" = '{"endpoint": "tcp://*:5557"}'`),
    /// for engines on one host with different event ports; before the shared one.
    pub kv_events_configs: std::collections::BTreeMap<String, String>,
    /// The models' Hugging Face tokenizers (a directory with `tokenizer.json`, or the file),
    /// for text requests to workers that publish KV events: one path for every model, and
    /// `MODEL=PATH` for a model of its own (see [`TokenizerPaths`]); a model without one
    /// uses each worker's `tokenizer_path` from `/server_info` or `/model_info` when that is
    /// a local path.
    pub tokenizer_path: TokenizerPaths,
    /// A rank that sends no KV event for this long has its publisher asked (a replay
    /// request; without replay, the engine's reported load is looked at): no answer, or
    /// silence while the engine works, shows its events as stalled.
    #[serde(rename = "kv_events_silence_secs", with = "kvgate_core::secs")]
    pub kv_events_silence: Duration,
}

/// Tokenizers by model: `default` for any model not named in `per_model`. Read from one
/// entry (a string: a path, or `MODEL=PATH`; `KVGATE_TOKENIZER_PATH` is one), a list of
/// entries (the flag's form: `--tokenizer-path /models/llama Qwen/Qwen3-8B=/models/qwen`),
/// or a table (`[tokenizer_path]`, `"*"` for the default).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerPaths {
    pub default: Option<PathBuf>,
    pub per_model: BTreeMap<String, PathBuf>,
}

impl TokenizerPaths {
    /// One path for every model.
    pub fn all(path: impl Into<PathBuf>) -> TokenizerPaths {
        TokenizerPaths {
            default: Some(path.into()),
            per_model: BTreeMap::new(),
        }
    }

    /// The configured tokenizer of `model`: its own, else the default.
    pub fn for_model(&self, model: &str) -> Option<&Path> {
        (self.per_model.get(model))
            .or(self.default.as_ref())
            .map(PathBuf::as_path)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.per_model.is_empty()
    }

    /// `MODEL=PATH` (model names may hold `/`, as Hugging Face ids do; `*=PATH` is the
    /// default), else a path for every model: an entry that starts like a path (`/`, `.`,
    /// `~`) or has no `=`.
    fn take(&mut self, entry: &str) {
        let pathlike = entry.starts_with(['/', '.', '~']);
        match entry.split_once('=') {
            Some(("*", path)) => self.default = Some(PathBuf::from(path)),
            Some((model, path)) if !model.is_empty() && !pathlike => {
                self.per_model.insert(model.to_owned(), PathBuf::from(path));
            }
            _ => self.default = Some(PathBuf::from(entry)),
        }
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum GivenPaths {
    One(String),
    Many(Vec<String>),
    Table(BTreeMap<String, PathBuf>),
}

impl<'de> Deserialize<'de> for TokenizerPaths {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let mut out = TokenizerPaths::default();
        match Option::<GivenPaths>::deserialize(d)? {
            None => {}
            // One entry: a path may hold spaces. Several come as a list.
            Some(GivenPaths::One(s)) => out.take(&s),
            Some(GivenPaths::Many(v)) => v.iter().for_each(|e| out.take(e)),
            Some(GivenPaths::Table(t)) => {
                for (model, path) in t {
                    if model == "*" {
                        out.default = Some(path);
                    } else {
                        out.per_model.insert(model, path);
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Serialize for TokenizerPaths {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if self.per_model.is_empty() {
            return self.default.serialize(s);
        }
        let mut t: BTreeMap<&str, &Path> = self
            .per_model
            .iter()
            .map(|(m, p)| (m.as_str(), p.as_path()))
            .collect();
        if let Some(d) = &self.default {
            t.insert("*", d);
        }
        t.serialize(s)
    }
}

impl Default for EventsSection {
    fn default() -> Self {
        EventsSection {
            kv_events_max_blocks: 1_000_000,
            kv_events_config: None,
            kv_events_configs: std::collections::BTreeMap::new(),
            tokenizer_path: TokenizerPaths::default(),
            kv_events_silence: Duration::from_secs(30),
        }
    }
}

impl Section for EventsSection {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.kv_events_max_blocks == 0 {
            return invalid("kv_events_max_blocks", "must be at least 1");
        }
        if self.kv_events_silence.is_zero() {
            return invalid("kv_events_silence_secs", "must be above 0");
        }
        if let Err(e) = self.publisher() {
            return invalid("kv_events_config", e.to_string());
        }
        for (url, json) in &self.kv_events_configs {
            if let Err(e) = kvgate_core::WorkerUrl::parse(url) {
                return invalid("kv_events_configs", format!("{url}: {e}"));
            }
            if let Err(e) = EventsConfig::parse(json) {
                return invalid("kv_events_configs", format!("{url}: {e}"));
            }
        }
        Ok(())
    }
}

impl EventsSection {
    /// The events config given for the worker at `url` (normalised) alone, if any.
    pub fn worker_kv_events_config(&self, url: &str) -> Option<String> {
        self.kv_events_configs.iter().find_map(|(u, json)| {
            let same = kvgate_core::WorkerUrl::parse(u).is_ok_and(|w| w.as_str() == url);
            same.then(|| json.clone())
        })
    }

    /// `kv_events_config`, parsed.
    pub fn publisher(&self) -> Result<Option<EventsConfig>, EventsConfigError> {
        self.kv_events_config
            .as_deref()
            .map(EventsConfig::parse)
            .transpose()
    }
}

/// Why a `--kv-events-config` cannot be used.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EventsConfigError {
    #[error("{0}")]
    Json(String),
    #[error("'{0}': only tcp:// endpoints are supported")]
    NotTcp(String),
    #[error("'{0}': no port")]
    NoPort(String),
    #[error("'{0}': the port is not a number below 65536")]
    BadPort(String),
    #[error("publisher '{0}': only zmq is supported")]
    Publisher(String),
    #[error("block_size and dp_size must be at least 1")]
    ZeroSize,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
struct Raw {
    #[serde(default)]
    publisher: Option<String>,
    endpoint: String,
    #[serde(default)]
    replay_endpoint: Option<String>,
    #[serde(default)]
    topic: String,
    #[serde(default)]
    block_size: Option<u32>,
    #[serde(default)]
    dp_size: Option<u32>,
}

/// Parsed and checked once, at config load.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsConfig {
    publisher: String,
    host: String,
    port: u16,
    replay_port: Option<u16>,
    topic: String,
    block_size: Option<u32>,
    dp_size: Option<u32>,
}

/// `tcp://host:port` to its host and port (`*` kept as given, IPv6 without brackets).
fn endpoint(s: &str) -> Result<(String, u16), EventsConfigError> {
    let p = kvgate_core::split_url(s);
    if p.scheme != Some("tcp") {
        return Err(EventsConfigError::NotTcp(s.to_owned()));
    }
    let port = p
        .port
        .ok_or_else(|| EventsConfigError::NoPort(s.to_owned()))?;
    let port = (port.parse::<u16>()).map_err(|_| EventsConfigError::BadPort(s.to_owned()))?;
    Ok((p.host.trim_matches(['[', ']']).to_owned(), port))
}

impl EventsConfig {
    pub fn parse(json: &str) -> Result<EventsConfig, EventsConfigError> {
        let raw: Raw =
            serde_json::from_str(json).map_err(|e| EventsConfigError::Json(e.to_string()))?;
        let publisher = raw.publisher.unwrap_or_else(|| "zmq".into());
        if publisher != "zmq" {
            return Err(EventsConfigError::Publisher(publisher));
        }
        let (host, port) = endpoint(&raw.endpoint)?;
        let replay_port = raw
            .replay_endpoint
            .as_deref()
            .map(|r| endpoint(r).map(|(_, p)| p))
            .transpose()?;
        if raw.block_size == Some(0) || raw.dp_size == Some(0) {
            return Err(EventsConfigError::ZeroSize);
        }
        Ok(EventsConfig {
            publisher,
            host,
            port,
            replay_port,
            topic: raw.topic,
            block_size: raw.block_size,
            dp_size: raw.dp_size,
        })
    }

    /// The `kv_events` descriptor of a worker that reported `page_size` and `dp_size`:
    /// its own sizes where the config does not say. Without a block size the engine's
    /// first stored blocks tell it.
    pub fn descriptor(&self, page_size: Option<u64>, dp_size: Option<u64>) -> Value {
        let mut d = json!({
            "publisher": self.publisher,
            "endpoint_host": self.host,
            "endpoint_port_base": self.port,
            "topic": self.topic,
            "block_size": self.block_size.map(u64::from).or(page_size),
            "dp_size": self.dp_size.map(u64::from).or(dp_size).unwrap_or(1),
            "source": "config",
        });
        if let Some(p) = self.replay_port {
            d["replay_endpoint_port_base"] = json!(p);
        }
        d
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_engines_own_config_json_is_read_and_bad_ones_say_why() {
        // vLLM's documented form, with keys kvgate does not need.
        let c = EventsConfig::parse(
            r#"{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "tcp://*:5557",
                "replay_endpoint": "tcp://*:5558", "topic": "kv-events", "buffer_steps": 10000}"#,
        );
        let c = c.expect("parses");
        assert_eq!(
            (c.host.as_str(), c.port, c.replay_port),
            ("*", 5557, Some(5558))
        );
        assert_eq!(c.topic, "kv-events");
        for (bad, why) in [
            (r#"{"endpoint": "ipc:///tmp/kv"}"#, "only tcp://"),
            (r#"{"endpoint": "tcp://*"}"#, "no port"),
            (r#"{"endpoint": "tcp://*:99999"}"#, "65536"),
            (
                r#"{"endpoint": "tcp://*:1", "publisher": "nats"}"#,
                "only zmq",
            ),
            (r#"{"topic": "x"}"#, "endpoint"),
            (
                r#"{"endpoint": "tcp://*:1", "block_size": 0}"#,
                "at least 1",
            ),
        ] {
            let e = EventsConfig::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
