use proptest::prelude::*;

use super::{Sample, parse_prometheus};
use crate::error::ParseError;

fn sample(name: &str, labels: &[(&str, &str)], value: f64, ts: Option<i64>) -> Sample {
    Sample {
        name: name.into(),
        labels: labels
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        value,
        timestamp_ms: ts,
    }
}

fn check(text: &str, want: &[Sample]) {
    assert_eq!(parse_prometheus(text).unwrap(), want, "{text}");
}

fn check_err(text: &str, line: usize) {
    match parse_prometheus(text) {
        Err(ParseError::Prometheus { line: l, .. }) => assert_eq!(l, line, "{text}"),
        other => panic!("{text}: {other:?}"),
    }
}

#[test]
fn samples_labels_comments() {
    check(
        "# HELP sglang:num_running_reqs The number of running requests.\n\
         # TYPE sglang:num_running_reqs gauge\n\
         sglang:num_running_reqs{model_name=\"m\",dp_rank=\"1\"} 3.0\n\
         \n\
         up 1\n\
         # a free comment\n\
         empty{} 0\n\
         trailing{a=\"x\",} 2 1700000000000\n\
         spaced { a = \"x\" , b=\"y\" }\t7\r\n",
        &[
            sample(
                "sglang:num_running_reqs",
                &[("model_name", "m"), ("dp_rank", "1")],
                3.0,
                None,
            ),
            sample("up", &[], 1.0, None),
            sample("empty", &[], 0.0, None),
            sample("trailing", &[("a", "x")], 2.0, Some(1_700_000_000_000)),
            sample("spaced", &[("a", "x"), ("b", "y")], 7.0, None),
        ],
    );
}

#[test]
fn escapes_and_special_values() {
    let got = parse_prometheus(
        "a{path=\"C:\\\\x\",q=\"say \\\"hi\\\"\",nl=\"1\\n2\",odd=\"\\t\",brace=\"}{,=\"} +Inf\n\
         b -Inf\n\
         c NaN -5\n\
         d 1.5e+06\n\
         e -0.25\n",
    )
    .unwrap();
    assert_eq!(
        got[0].labels,
        vec![
            ("path".to_owned(), "C:\\x".to_owned()),
            ("q".to_owned(), "say \"hi\"".to_owned()),
            ("nl".to_owned(), "1\n2".to_owned()),
            ("odd".to_owned(), "\\t".to_owned()),
            ("brace".to_owned(), "}{,=".to_owned()),
        ]
    );
    assert_eq!(got[0].value, f64::INFINITY);
    assert_eq!(got[1].value, f64::NEG_INFINITY);
    assert!(got[2].value.is_nan());
    assert_eq!(got[2].timestamp_ms, Some(-5));
    assert_eq!(got[3].value, 1.5e6);
    assert_eq!(got[4].value, -0.25);
    assert_eq!(got[0].label("q"), Some("say \"hi\""));
    assert_eq!(got[0].label("missing"), None);
}

#[test]
fn malformed_lines_name_their_number() {
    check_err("ok 1\n9bad 1\n", 2);
    check_err("a{b=\"c\" 1\n", 1);
    check_err("a{b=\"c} 1\n", 1);
    check_err("a{b=c} 1\n", 1);
    check_err("a{=\"c\"} 1\n", 1);
    check_err("a{b\"c\"} 1\n", 1);
    check_err("a{b=\"c\" d=\"e\"} 1\n", 1);
    check_err("a\n", 1);
    check_err("a one\n", 1);
    check_err("a 1 2.5\n", 1);
    check_err("a 1 2 3\n", 1);
    check_err("{a=\"b\"} 1\n", 1);
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

proptest! {
    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _ = parse_prometheus(&text);
    }

    #[test]
    fn near_miss_text_never_panics(text in "[a-z_:{}=\",\\\\ \\t\\n0-9.+#-]{0,80}") {
        let _ = parse_prometheus(&text);
    }

    /// What a well-behaved exporter writes reads back as the same samples.
    #[test]
    fn written_samples_read_back(
        samples in proptest::collection::vec(
            (
                "[a-zA-Z_:][a-zA-Z0-9_:]{0,12}",
                proptest::collection::vec(("[a-zA-Z_][a-zA-Z0-9_]{0,8}", any::<String>()), 0..4),
                any::<f64>().prop_filter("finite", |v| v.is_finite()),
                proptest::option::of(any::<i64>()),
            ),
            0..8,
        )
    ) {
        let mut text = String::from("# TYPE x gauge\n");
        for (name, labels, value, ts) in &samples {
            text.push_str(name);
            if !labels.is_empty() {
                let body: Vec<String> =
                    labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
                text.push_str(&format!("{{{}}}", body.join(",")));
            }
            text.push_str(&format!(" {value}"));
            if let Some(ts) = ts {
                text.push_str(&format!(" {ts}"));
            }
            text.push('\n');
        }
        let got = parse_prometheus(&text).unwrap();
        let want: Vec<Sample> = samples
            .into_iter()
            .map(|(name, labels, value, timestamp_ms)| Sample { name, labels, value, timestamp_ms })
            .collect();
        prop_assert_eq!(got, want);
    }
}

#[test]
fn a_filtered_parse_stores_and_checks_only_the_kept_names() {
    let text = "other_metric{a=\"1\"} 5\nbroken line without a value\nsglang:num_running_reqs{dp_rank=\"0\"} 3\n";
    let kept = super::parse_prometheus_where(text, |n| n.starts_with("sglang:")).unwrap();
    assert_eq!(
        kept,
        vec![sample(
            "sglang:num_running_reqs",
            &[("dp_rank", "0")],
            3.0,
            None
        )]
    );
    // Unfiltered, the broken line fails the scrape.
    assert!(parse_prometheus(text).is_err());
    // A kept line must still be well formed.
    assert!(super::parse_prometheus_where("sglang:x{", |_| true).is_err());
}

/// A label value with the escapes the format allows.
fn label_value() -> impl Strategy<Value = (String, String)> {
    prop::collection::vec(
        prop_oneof![
            "[a-zA-Z0-9 _.:/-]".prop_map(|c| (c.clone(), c)),
            Just(("\\\"".to_owned(), "\"".to_owned())),
            Just(("\\\\".to_owned(), "\\".to_owned())),
            Just(("\\n".to_owned(), "\n".to_owned())),
        ],
        0..8,
    )
    .prop_map(|parts| {
        parts
            .into_iter()
            .fold((String::new(), String::new()), |(w, v), (a, b)| {
                (w + &a, v + &b)
            })
    })
}

fn value() -> impl Strategy<Value = (String, f64)> {
    prop_oneof![
        (-1e9f64..1e9).prop_map(|v| (format!("{v}"), v)),
        (0u64..1_000_000).prop_map(|v| (format!("{v}"), v as f64)),
        Just(("+Inf".to_owned(), f64::INFINITY)),
        Just(("-Inf".to_owned(), f64::NEG_INFINITY)),
        (0u32..1000).prop_map(|m| (format!("{m}e-3"), f64::from(m) * 1e-3)),
    ]
}

proptest! {
    /// Expositions as engines write them (comments, blank lines, labels with escapes, any
    /// value, optional timestamps) parse to exactly the samples written.
    #[test]
    fn structured_expositions_parse_to_their_samples(
        lines in prop::collection::vec(
            (
                "[a-z_:][a-z0-9_:]{0,20}",
                prop::collection::vec(("[a-z_][a-z0-9_]{0,8}", label_value()), 0..4),
                value(),
                prop::option::of(0i64..2_000_000_000_000),
                any::<bool>(),
            ),
            0..12,
        )
    ) {
        let mut text = String::new();
        let mut want = Vec::new();
        for (name, labels, (vtext, v), ts, comment) in &lines {
            if *comment {
                text.push_str(&format!("# HELP {name} some help\n# TYPE {name} gauge\n\n"));
            }
            text.push_str(name);
            if !labels.is_empty() {
                let inner: Vec<String> = labels.iter().map(|(k, (w, _))| format!("{k}=\"{w}\"")).collect();
                text.push_str(&format!("{{{}}}", inner.join(",")));
            }
            text.push_str(&format!(" {vtext}"));
            if let Some(t) = ts {
                text.push_str(&format!(" {t}"));
            }
            text.push('\n');
            let lbl: Vec<(&str, &str)> = labels.iter().map(|(k, (_, v))| (k.as_str(), v.as_str())).collect();
            want.push(sample(name, &lbl, *v, *ts));
        }
        let got = parse_prometheus(&text).map_err(|e| TestCaseError::fail(format!("{e}: {text}")))?;
        prop_assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(&want) {
            prop_assert_eq!(&g.name, &w.name);
            prop_assert_eq!(&g.labels, &w.labels);
            prop_assert_eq!(g.timestamp_ms, w.timestamp_ms);
            prop_assert!((g.value - w.value).abs() <= 1e-9 * w.value.abs().max(1.0) || g.value == w.value);
        }
    }
}
