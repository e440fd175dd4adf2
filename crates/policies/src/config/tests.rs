use super::*;

/// Validating `cfg` fails naming `key`, or passes when `key` is `None`.
fn check(cfg: PolicyConfig, key: Option<&str>) {
    match (cfg.validate(), key) {
        (Ok(()), None) => {}
        (Err(ConfigError::Invalid { key: k, .. }), Some(expect)) => assert_eq!(k, expect),
        (other, _) => panic!("expected {key:?}, got {other:?}"),
    }
}

#[test]
fn defaults_are_valid_and_kinds_round_trip() {
    check(PolicyConfig::default(), None);
    for k in PolicyKind::ALL {
        assert_eq!(k.name().parse::<PolicyKind>(), Ok(k));
        check(PolicyConfig::with_kind(k), None);
    }
    assert!(matches!(
        "fastest".parse::<PolicyKind>(),
        Err(ConfigError::UnknownPolicy(_))
    ));
}

// Over 120 lines: one table of bad values, a row each.
#[test]
fn bad_values_name_their_key() {
    let d = PolicyConfig::default;
    check(
        PolicyConfig {
            cache_threshold: 1.5,
            ..d()
        },
        Some("cache_threshold"),
    );
    check(
        PolicyConfig {
            cache_threshold: f64::NAN,
            ..d()
        },
        Some("cache_threshold"),
    );
    check(
        PolicyConfig {
            balance_rel_threshold: 0.9,
            ..d()
        },
        Some("balance_rel_threshold"),
    );
    check(
        PolicyConfig {
            balance_token_usage_threshold: Some(0.0),
            ..d()
        },
        Some("balance_token_usage_threshold"),
    );
    check(
        PolicyConfig {
            overload_token_usage_threshold: Some(1.2),
            ..d()
        },
        Some("overload_token_usage_threshold"),
    );
    check(
        PolicyConfig {
            overload_token_usage_threshold: Some(1.0),
            ..d()
        },
        None,
    );
    check(
        PolicyConfig {
            max_tree_size: 0,
            ..d()
        },
        Some("max_tree_size"),
    );
    check(
        PolicyConfig {
            block_size: 0,
            ..d()
        },
        Some("block_size"),
    );
    check(
        PolicyConfig {
            cache_ttl: Duration::from_millis(500),
            ..d()
        },
        Some("cache_ttl_secs"),
    );
    check(
        PolicyConfig {
            cache_boundaries: vec![0, 16],
            ..d()
        },
        Some("cache_boundaries"),
    );
    check(
        PolicyConfig {
            cache_boundaries: vec![64, 16],
            ..d()
        },
        Some("cache_boundaries"),
    );
    check(
        PolicyConfig {
            cache_boundaries: vec![16, 16],
            ..d()
        },
        Some("cache_boundaries"),
    );
    check(
        PolicyConfig {
            least_load_default_throughput: 0.0,
            ..d()
        },
        Some("least_load_default_throughput"),
    );
    check(
        PolicyConfig {
            default_prefill_throughput: f64::INFINITY,
            ..d()
        },
        Some("default_prefill_throughput"),
    );
    check(
        PolicyConfig {
            bytes_per_token: -1.0,
            ..d()
        },
        Some("bytes_per_token"),
    );
    check(
        PolicyConfig {
            kv_pressure_weight: -0.1,
            ..d()
        },
        Some("kv_pressure_weight"),
    );
    check(
        PolicyConfig {
            mean_prefill_tokens: 0,
            ..d()
        },
        Some("mean_prefill_tokens"),
    );
    check(
        PolicyConfig {
            prefix_token_count: 0,
            ..d()
        },
        Some("prefix_token_count"),
    );
    check(
        PolicyConfig {
            prefix_hash_load_factor: 0.5,
            ..d()
        },
        Some("prefix_hash_load_factor"),
    );
}

#[test]
fn s48_applicable_boundaries() {
    let c = PolicyConfig {
        cache_boundaries: vec![16, 32, 64],
        ..PolicyConfig::default()
    };
    assert_eq!(c.applicable_boundaries(40), &[16, 32]);
    assert_eq!(c.applicable_boundaries(64), &[16, 32, 64]);
    assert!(c.applicable_boundaries(15).is_empty());
    assert!(
        PolicyConfig::default()
            .applicable_boundaries(1000)
            .is_empty()
    );
}

fn from_json(s: &str) -> Result<PolicyConfig, serde_json::Error> {
    serde_json::from_str(s)
}

#[test]
fn wire_form() {
    let c = from_json(
        r#"{"kind":"cache_aware","cache_mode":"threshold","cache_match_threshold":0.4,
            "spill_abs_threshold":8,"eviction_interval_secs":0,"cache_ttl_secs":2.5,
            "least_load_max_waiting_requests":0,"least_load_kv_pressure_weight":0.3,
            "cache_index":"hash","power_of_two_load_metric":"least_requests"}"#,
    )
    .unwrap();
    assert_eq!(c.kind, PolicyKind::CacheAware);
    assert_eq!(c.cache_mode, CacheMode::Threshold);
    assert_eq!((c.cache_threshold, c.balance_abs_threshold), (0.4, 8));
    assert_eq!(c.eviction_interval, None);
    assert_eq!(c.cache_ttl, Duration::from_millis(2500));
    assert_eq!(c.least_load_max_waiting_requests, None);
    assert_eq!(c.kv_pressure_weight, 0.3);
    assert_eq!(c.cache_index, CacheIndex::Hash);
    assert_eq!(c.power_of_two_load_metric, LoadMetric::LeastRequests);
    let c = from_json(r#"{"chars_per_token":3.5}"#).unwrap();
    assert_eq!(c.bytes_per_token, 3.5);
    let c =
        from_json(r#"{"least_load_max_waiting_requests":48,"eviction_interval_secs":30}"#).unwrap();
    assert_eq!(c.least_load_max_waiting_requests, Some(48));
    assert_eq!(c.eviction_interval, Some(Duration::from_secs(30)));
    assert!(
        from_json(r#"{"cache_treshold":0.4}"#)
            .unwrap_err()
            .to_string()
            .contains("cache_treshold")
    );
    // Round trip.
    let d = PolicyConfig::default();
    assert_eq!(from_json(&serde_json::to_string(&d).unwrap()).unwrap(), d);
}
