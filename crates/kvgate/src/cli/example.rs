//! The example config file, `kvgate.example.toml`: every key with its default, each flag's
//! key under its help line, rendered from `GatewayConfig::default()` and the flags' table,
//! so the file cannot drift from the code (a test compares them).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use kvgate_gateway::GatewayConfig;
use serde_json::Value;

use super::flags::{self, Kind};

/// A default as TOML: `None` when it is unset (the line is then left commented out).
fn toml_value(v: &Value) -> Option<String> {
    match v {
        Value::Null => None,
        // JSON's scalars and arrays of scalars are TOML's too (strings included: TOML's
        // basic strings take JSON's escapes).
        Value::Array(a) if a.iter().all(|x| !x.is_object() && !x.is_null()) => Some(v.to_string()),
        Value::Object(_) | Value::Array(_) => None,
        other => Some(other.to_string()),
    }
}

fn line(out: &mut String, key: &str, v: Option<&Value>) {
    match v.and_then(toml_value) {
        Some(text) => {
            let _ = writeln!(out, "{key} = {text}");
        }
        None => {
            let _ = writeln!(out, "# {key} = (unset: off)");
        }
    }
}

/// A key of a table, with its flag and help when it has one.
type Key<'a> = (&'a str, Option<(&'a str, &'a str)>);

/// The file's text.
pub(crate) fn example_toml() -> String {
    let defaults = serde_json::to_value(GatewayConfig::default()).unwrap_or_default();
    // Keys by table ("" is the top level), each with its flag and help when it has one.
    let mut tables: BTreeMap<&str, Vec<Key<'_>>> = BTreeMap::new();
    for (flag, key, kind, help) in flags::all() {
        let (table, name) = key.split_once('.').unwrap_or(("", key));
        let keys = tables.entry(table).or_default();
        // A flag without a key, or a second spelling of a key (`--retry-*-ms`), adds no line.
        if key.is_empty() || matches!(kind, Kind::Millis) || keys.iter().any(|(k, _)| *k == name) {
            continue;
        }
        keys.push((name, Some((*flag, *help))));
    }
    let mut out = String::from(
        "# kvgate's configuration with every key at its default (`kvgate --print-example-config`).\n\
         # Flags override variables (KVGATE_<KEY>, KVGATE_POLICY__<KEY>), which override this file.\n",
    );
    for (table, keys) in &mut tables {
        let section = if table.is_empty() {
            defaults.as_object()
        } else {
            defaults.get(*table).and_then(Value::as_object)
        };
        // Keys without a flag, at the end of their table.
        if let Some(section) = section {
            for (name, v) in section {
                // A section's table is nested; an empty map (a table keyed by the user,
                // such as `kv_events_configs`) is a key of its own.
                let nested = table.is_empty() && v.as_object().is_some_and(|o| !o.is_empty());
                if !nested && !keys.iter().any(|(k, _)| k == name) {
                    keys.push((name.as_str(), None));
                }
            }
        }
        if !table.is_empty() {
            let _ = writeln!(out, "\n[{table}]");
        }
        for (name, flag) in keys.iter() {
            match flag {
                Some((f, help)) => {
                    let _ = writeln!(out, "\n# --{f}: {help}");
                }
                None => {
                    let _ = writeln!(out, "\n# (no flag)");
                }
            }
            line(&mut out, name, section.and_then(|s| s.get(*name)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo_file() -> std::path::PathBuf {
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kvgate.example.toml")
    }

    #[test]
    fn the_checked_in_example_is_the_generated_one() {
        let want = example_toml();
        let have = std::fs::read_to_string(repo_file()).unwrap_or_default();
        assert!(
            have == want,
            "kvgate.example.toml is stale: cargo run -p kvgate -- --print-example-config > kvgate.example.toml"
        );
    }

    #[test]
    fn the_example_loads_as_the_defaults() {
        let f = tempfile::Builder::new().suffix(".toml").tempfile().unwrap();
        std::fs::write(f.path(), example_toml()).unwrap();
        let env = std::collections::HashMap::new();
        let loaded = GatewayConfig::load(Some(f.path()), &env, vec![]).unwrap();
        assert_eq!(loaded, GatewayConfig::default());
    }
}
