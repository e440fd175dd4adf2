//! `--kv-events-config`: the KV-event publisher settings engines were started with, for
//! workers whose `/server_info` advertises none (vLLM has no `/server_info`; older SGLang
//! builds do not advertise). The same JSON the engines take (`--kv-events-config` of SGLang
//! and vLLM: `endpoint`, `replay_endpoint`, `topic`, `publisher`; other keys ignored), plus
//! `block_size` and `dp_size` when the worker does not report them. It becomes the worker's
//! `kv_events` descriptor, so the subscription is the same as for an advertised one.

use serde::Deserialize;
use serde_json::{Value, json};

use super::WorkerRecord;

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

/// `tcp://host:port` to its host and port (`*` and IPv6 in brackets kept as given).
fn endpoint(s: &str) -> Result<(String, u16), String> {
    let rest = s
        .strip_prefix("tcp://")
        .ok_or_else(|| format!("'{s}': only tcp:// endpoints are supported"))?;
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| format!("'{s}': no port"))?;
    let port = port
        .parse::<u16>()
        .map_err(|_| format!("'{s}': the port is not a number below 65536"))?;
    Ok((host.trim_matches(['[', ']']).to_owned(), port))
}

impl EventsConfig {
    pub fn parse(json: &str) -> Result<EventsConfig, String> {
        let raw: Raw = serde_json::from_str(json).map_err(|e| e.to_string())?;
        let publisher = raw.publisher.unwrap_or_else(|| "zmq".into());
        if publisher != "zmq" {
            return Err(format!("publisher '{publisher}': only zmq is supported"));
        }
        let (host, port) = endpoint(&raw.endpoint)?;
        let replay_port = raw
            .replay_endpoint
            .as_deref()
            .map(|r| endpoint(r).map(|(_, p)| p))
            .transpose()?;
        if raw.block_size == Some(0) || raw.dp_size == Some(0) {
            return Err("block_size and dp_size must be at least 1".into());
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

    /// The `kv_events` descriptor for `rec`: the worker's own page and data-parallel sizes
    /// where it reported them and the config does not say. Without a block size the
    /// engine's first stored blocks tell it.
    pub fn descriptor(&self, rec: &WorkerRecord) -> Value {
        let mut d = json!({
            "publisher": self.publisher,
            "endpoint_host": self.host,
            "endpoint_port_base": self.port,
            "topic": self.topic,
            "block_size": self.block_size.map(u64::from).or(rec.page_size),
            "dp_size": self.dp_size.map(u64::from).or(rec.dp_size).unwrap_or(1),
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
            let e = EventsConfig::parse(bad).expect_err(bad);
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
