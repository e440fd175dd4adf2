//! The `kvgate` binary's flags: one table, each flag mapped onto one config key. Help
//! lines name the key, the environment variable and the default, read from
//! `GatewayConfig::default()`, so they cannot drift from the code.

use std::path::PathBuf;

use kvgate_gateway::{GatewayConfig, Overrides};

mod example;
mod flags;

pub(crate) use example::example_toml;

use flags::Kind;

/// The environment variable of a config key: `policy.kind` is `KVGATE_POLICY__KIND`.
pub(crate) fn env_var(key: &str) -> String {
    format!("KVGATE_{}", key.replace('.', "__").to_ascii_uppercase())
}

/// A default as the help shows it: strings bare, lists space-separated, unset as `off`.
fn shown(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null | Value::Bool(false) => "off".to_owned(),
        Value::Bool(true) => "on".to_owned(),
        Value::String(s) => s.clone(),
        Value::Array(a) if a.is_empty() => "none".to_owned(),
        Value::Array(a) => a.iter().map(shown).collect::<Vec<_>>().join(","),
        other => other.to_string(),
    }
}

/// The whole command: `--config` and every flag of the table.
pub(crate) fn command() -> clap::Command {
    let defaults = serde_json::to_value(GatewayConfig::default()).unwrap_or_default();
    let flags = flags::all().map(|(flag, key, kind, help)| {
        let found = key.split('.').try_fold(&defaults, |v, k| v.get(k));
        let default = match (kind, found) {
            (Kind::Millis, Some(v)) => v
                .as_f64()
                .map_or_else(|| shown(v), |s| format!("{}", (s * 1000.0).round())),
            (_, v) => v.map_or_else(|| "off".to_owned(), shown),
        };
        let help = if key.is_empty() {
            (*help).to_owned()
        } else {
            format!(
                "{help} [default: {default}] [key: {key}] [env: {}]",
                env_var(key)
            )
        };
        let arg = clap::Arg::new(*flag).long(*flag).help(help);
        match kind {
            Kind::Int => arg.value_parser(clap::value_parser!(u64)),
            Kind::Float => arg.value_parser(clap::value_parser!(f64)),
            Kind::Text => arg.value_parser(clap::value_parser!(String)),
            Kind::Texts => arg.value_parser(clap::value_parser!(String)).num_args(1..),
            Kind::Ints => arg
                .value_parser(clap::value_parser!(u64))
                .num_args(1..)
                .value_delimiter(','),
            Kind::Switch => arg.action(clap::ArgAction::SetTrue),
            Kind::Repeated => arg
                .value_parser(clap::value_parser!(String))
                .action(clap::ArgAction::Append),
            Kind::OneOf(values) => {
                arg.value_parser(clap::builder::PossibleValuesParser::new(values.iter()))
            }
            Kind::Millis => arg.value_parser(clap::value_parser!(u64)),
            Kind::Accepted(_) => arg.action(clap::ArgAction::SetTrue),
            Kind::AcceptedValue(_) => arg.value_parser(clap::value_parser!(String)),
        }
    });
    clap::Command::new("kvgate")
        .version(env!("CARGO_PKG_VERSION"))
        .about("A cache-aware gateway for LLM inference engines (SGLang, vLLM, OpenAI-compatible).")
        .arg(
            clap::Arg::new("config")
                .long("config")
                .env("KVGATE_CONFIG")
                .hide_env_values(true)
                .value_parser(clap::value_parser!(PathBuf))
                .help("TOML config file; flags override the environment, which overrides the file"),
        )
        .arg(
            clap::Arg::new("print-example-config")
                .long("print-example-config")
                .action(clap::ArgAction::SetTrue)
                .help("Print a config file with every key at its default, and exit"),
        )
        .args(flags)
}

/// The config file's path, and the flags given, as config-key overrides.
pub(crate) fn parse(m: &clap::ArgMatches) -> (Option<PathBuf>, Overrides) {
    let mut o: Overrides = Vec::new();
    for (flag, key, kind, _) in flags::all() {
        let v: Option<config::Value> = match kind {
            Kind::Int => m.get_one::<u64>(flag).map(|v| (*v).into()),
            Kind::Float => m.get_one::<f64>(flag).map(|v| (*v).into()),
            Kind::Text | Kind::OneOf(_) => m.get_one::<String>(flag).map(|v| v.clone().into()),
            Kind::Texts => m
                .get_many::<String>(flag)
                .map(|vs| vs.cloned().collect::<Vec<String>>().into()),
            Kind::Ints => m
                .get_many::<u64>(flag)
                .map(|vs| vs.copied().collect::<Vec<u64>>().into()),
            Kind::Switch => m.get_flag(flag).then(|| true.into()),
            Kind::Repeated => m
                .get_many::<String>(flag)
                .map(|vs| vs.cloned().collect::<Vec<String>>().into()),
            Kind::Millis => m.get_one::<u64>(flag).map(|v| (*v as f64 / 1000.0).into()),
            Kind::Accepted(_) | Kind::AcceptedValue(_) => None,
        };
        if let Some(v) = v {
            o.push(((*key).to_owned(), v));
        }
    }
    (m.get_one::<PathBuf>("config").cloned(), o)
}

/// The first of `args` that is a reference-gateway flag kvgate has no equivalent for, as
/// the one-line error that names it and what to use instead.
pub(crate) fn no_equivalent<S: AsRef<str>>(args: &[S]) -> Option<String> {
    args.iter().find_map(|a| {
        let name = a.as_ref().strip_prefix("--")?;
        let name = name.split_once('=').map_or(name, |(n, _)| n);
        let (_, instead) = flags::NO_EQUIVALENT.iter().find(|(f, _)| *f == name)?;
        Some(format!("--{name} has no kvgate equivalent: {instead}"))
    })
}

/// What the flags given without effect say, for the log at start.
pub(crate) fn notes(m: &clap::ArgMatches) -> Vec<&'static str> {
    flags::all()
        .filter_map(|(flag, _, kind, _)| match kind {
            Kind::Accepted(note) if m.get_flag(flag) => Some(*note),
            Kind::AcceptedValue(note) if m.contains_id(flag) => Some(*note),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_maps_onto_a_key_of_the_config() {
        for (flag, key, kind, _) in flags::all() {
            let value: config::Value = match kind {
                Kind::Int => 1u64.into(),
                Kind::Float => 1.0.into(),
                Kind::Text => "x".into(),
                Kind::Texts => vec!["x".to_owned()].into(),
                Kind::Ints => vec![1u64].into(),
                Kind::Switch => true.into(),
                Kind::Repeated => vec!["x".to_owned()].into(),
                Kind::OneOf(values) => values[0].into(),
                Kind::Millis => 1.0.into(),
                Kind::Accepted(_) | Kind::AcceptedValue(_) => continue,
            };
            let env = std::collections::HashMap::new();
            // The value may be refused for itself; the key must not be unknown.
            if let Err(e) = GatewayConfig::load(None, &env, vec![((*key).to_owned(), value)]) {
                assert!(!e.to_string().contains("unknown field"), "--{flag}: {e}");
            }
        }
        assert_eq!(env_var("policy.cache_mode"), "KVGATE_POLICY__CACHE_MODE");
        command().debug_assert();
    }

    #[test]
    fn a_value_out_of_a_list_names_the_flag_and_the_list() {
        let names: Vec<&str> = (kvgate_policies::PolicyKind::ALL.iter())
            .map(|k| k.name())
            .collect();
        assert_eq!(flags::POLICIES, names.as_slice());
        for (flag, key, kind, _) in flags::all() {
            let Kind::OneOf(values) = kind else { continue };
            // Each listed value is one the config takes.
            for v in *values {
                let o = vec![((*key).to_owned(), config::Value::from(*v))];
                let c = GatewayConfig::load(None, &std::collections::HashMap::new(), o);
                assert!(c.is_ok(), "--{flag} {v}: {c:?}");
            }
            let err = load(&[&format!("--{flag}"), "nonsense"], &[]).unwrap_err();
            assert!(err.contains(&format!("--{flag}")), "{err}");
            assert!(values.iter().all(|v| err.contains(v)), "{err}");
        }
        // From a variable or a file the enum's own error lists them too.
        let err = load(&[], &[("KVGATE_POLICY__KIND", "nonsense")]).unwrap_err();
        assert!(
            err.contains("policy.kind") && err.contains("cache_aware, "),
            "{err}"
        );
        assert_eq!(err.matches("nonsense").count(), 1, "{err}");
        // Nothing chained under it for a report to print again.
        let env = [("KVGATE_POLICY__KIND".to_owned(), "nonsense".to_owned())].into();
        let e = GatewayConfig::load(None, &env, vec![]).unwrap_err();
        assert!(std::error::Error::source(&e).is_none(), "{e:?}");
    }

    #[test]
    fn tokenizer_paths_are_given_for_every_model_or_per_model() {
        use std::path::Path;
        let c = load(
            &[
                "--tokenizer-path",
                "/models/base",
                "qwen=/models/qwen",
                "meta-llama/Llama-3=/models/llama",
            ],
            &[],
        )
        .unwrap();
        let t = &c.events.tokenizer_path;
        assert_eq!(t.for_model("qwen"), Some(Path::new("/models/qwen")));
        assert_eq!(t.for_model("other"), Some(Path::new("/models/base")));
        // Hugging Face ids hold a slash; a path starts like one.
        assert_eq!(
            t.for_model("meta-llama/Llama-3"),
            Some(Path::new("/models/llama"))
        );
        let env = load(&[], &[("KVGATE_TOKENIZER_PATH", "qwen=/q")]).unwrap();
        assert_eq!(
            env.events.tokenizer_path.for_model("qwen"),
            Some(Path::new("/q"))
        );
        assert_eq!(env.events.tokenizer_path.for_model("other"), None);
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(
            file.path(),
            "[tokenizer_path]\n\"*\" = \"/d\"\n\"meta-llama/Llama-3\" = \"/l\"\n",
        )
        .unwrap();
        let from_file =
            GatewayConfig::load(Some(file.path()), &std::collections::HashMap::new(), vec![]);
        let from_file = from_file.unwrap();
        let t = &from_file.events.tokenizer_path;
        assert_eq!(t.for_model("meta-llama/Llama-3"), Some(Path::new("/l")));
        assert_eq!(t.for_model("x"), Some(Path::new("/d")));
    }

    #[test]
    fn the_reference_gateways_flags_are_taken_or_named() {
        let c = load(
            &[
                "--retry-initial-backoff-ms",
                "250",
                "--retry-max-backoff-ms",
                "4000",
                "--retry-backoff-multiplier",
                "3",
                "--log-dir",
                "/tmp/kvgate-logs",
                "--dp-aware",
                "--eviction-interval",
                "90",
                "--model-path",
                "/models/m",
                "--backend",
                "vllm",
                "--request-id-headers",
                "x-a",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            (
                c.retry.initial_backoff,
                c.retry.max_backoff,
                c.retry.backoff_multiplier
            ),
            (
                std::time::Duration::from_millis(250),
                std::time::Duration::from_secs(4),
                3.0
            )
        );
        assert_eq!(
            c.log_dir.as_deref(),
            Some(std::path::Path::new("/tmp/kvgate-logs"))
        );
        assert_eq!(c.request_id_headers, vec!["x-a"]);
        assert_eq!(
            (
                c.policy.eviction_interval,
                c.events.tokenizer_path.for_model("any")
            ),
            (
                Some(std::time::Duration::from_secs(90)),
                Some(std::path::Path::new("/models/m"))
            )
        );
        let m = command()
            .try_get_matches_from(["kvgate", "--dp-aware"])
            .unwrap();
        assert!(
            notes(&m)[0].contains("always rank-aware"),
            "{:?}",
            notes(&m)
        );
        assert!(notes(&command().get_matches_from(["kvgate"])).is_empty());
        let err = no_equivalent(&["kvgate", "--policy", "cache_aware", "--pd-disaggregation"]);
        let err = err.unwrap_or_default();
        assert!(
            err.contains("--pd-disaggregation") && err.contains("--worker-urls"),
            "{err}"
        );
        assert!(no_equivalent(&["kvgate", "--worker-startup-timeout-secs=600"]).is_some());
        assert_eq!(no_equivalent(&["kvgate", "--policy", "prefill"]), None);
        // No flag of kvgate's own is listed as missing.
        for (f, _) in flags::NO_EQUIVALENT {
            assert!(flags::all().all(|(own, _, _, _)| own != f), "--{f}");
        }
    }

    fn load(args: &[&str], env: &[(&str, &str)]) -> Result<GatewayConfig, String> {
        let m = command()
            .try_get_matches_from(std::iter::once("kvgate").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        let (_, overrides) = parse(&m);
        let env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        GatewayConfig::load(None, &env, overrides).map_err(|e| e.to_string())
    }

    #[test]
    fn the_retry_and_outlier_limits_take_flags_and_variables() {
        let c = load(
            &[
                "--retry-budget-percent",
                "10",
                "--retry-budget-min-per-sec",
                "1",
                "--cb-consecutive-5xx",
                "3",
                "--first-byte-timeout-secs",
                "60",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(c.retry.budget_percent, 10.0);
        assert_eq!(c.retry.budget_min_per_sec, 1);
        assert_eq!(c.circuit.consecutive_5xx, 3);
        assert_eq!(c.first_byte_timeout, std::time::Duration::from_secs(60));
        let env = [
            ("KVGATE_RETRY_BUDGET_PERCENT", "50"),
            ("KVGATE_CB_CONSECUTIVE_5XX", "7"),
        ];
        let c = load(&[], &env).unwrap();
        assert_eq!(c.retry.budget_percent, 50.0);
        assert_eq!(c.circuit.consecutive_5xx, 7);
        let d = GatewayConfig::default();
        assert_eq!(d.retry.budget_percent, 20.0);
        assert_eq!(d.retry.budget_min_per_sec, 3);
        assert_eq!(d.circuit.consecutive_5xx, 5);
        assert_eq!(d.first_byte_timeout, std::time::Duration::from_secs(300));
        for (flag, value, key) in [
            ("--retry-budget-percent", "150", "retry_budget_percent"),
            ("--cb-consecutive-5xx", "0", "cb_consecutive_5xx"),
            ("--first-byte-timeout-secs", "0", "first_byte_timeout_secs"),
        ] {
            let e = load(&[flag, value], &[]).unwrap_err();
            assert!(e.contains(key), "{flag} {value}: {e}");
        }
    }

    #[test]
    fn service_discovery_takes_the_reference_flags_and_their_variables() {
        let c = load(
            &[
                "--service-discovery",
                "--selector",
                "app=sglang",
                "tier=gpu",
                "--service-discovery-namespace",
                "ml",
                "--service-discovery-port",
                "30000",
            ],
            &[],
        )
        .unwrap();
        let d = &c.discovery;
        assert!(d.service_discovery);
        assert_eq!(d.selector, ["app=sglang", "tier=gpu"]);
        assert_eq!(d.service_discovery_namespace.as_deref(), Some("ml"));
        assert_eq!(d.service_discovery_port, 30000);
        let c = load(
            &[],
            &[
                ("KVGATE_SERVICE_DISCOVERY", "true"),
                ("KVGATE_SELECTOR", "app=vllm role=decode"),
                ("KVGATE_SERVICE_DISCOVERY_PORT", "8080"),
            ],
        )
        .unwrap();
        assert_eq!(c.discovery.selector, ["app=vllm", "role=decode"]);
        assert_eq!(c.discovery.service_discovery_port, 8080);
        assert_eq!(c.discovery.service_discovery_namespace, None);
        assert_eq!(
            GatewayConfig::default().discovery.service_discovery_port,
            8000
        );
        // Refused, naming the key.
        let e = load(&["--service-discovery"], &[]).unwrap_err();
        assert!(e.contains("'selector'"), "{e}");
        let e = load(&["--service-discovery", "--selector", "app"], &[]).unwrap_err();
        assert!(e.contains("'selector'") && e.contains("'app'"), "{e}");
        for (flag, value, key) in [
            ("--service-discovery-port", "0", "service_discovery_port"),
            (
                "--service-discovery-port",
                "70000",
                "service_discovery_port",
            ),
            (
                "--service-discovery-namespace",
                "No_Such",
                "service_discovery_namespace",
            ),
        ] {
            let args = ["--service-discovery", "--selector", "a=b", flag, value];
            let e = load(&args, &[]).unwrap_err();
            assert!(e.contains(key), "{flag} {value}: {e}");
        }
    }
}
