//! Structured property tests of the answer's framing: heads built from permutations of
//! `Content-Length`, `Transfer-Encoding` and `Connection`, and chunked bodies with every
//! kind of size line, each read whole and in arbitrary splits. No input panics, and no
//! answer is framed two ways: a head either has exactly one framing or leaves nothing to
//! reuse. `PROPTEST_CASES` sets the number of cases (256 by default; the long run is in
//! docs/benchmarks.md).

use proptest::prelude::*;

use super::chunked::decode_all;
use super::head::{Framing, parse_head};

/// A header line of the framing family, as a peer might send it.
fn framing_header() -> impl Strategy<Value = String> {
    let cl = prop_oneof![
        (0u64..100_000).prop_map(|n| n.to_string()),
        Just("+5".to_owned()),
        Just("-1".to_owned()),
        Just(" 7 ".to_owned()),
        Just("".to_owned()),
        Just("1,1".to_owned()),
        Just("99999999999999999999999".to_owned()),
    ];
    let te = prop_oneof![
        Just("chunked"),
        Just("Chunked"),
        Just("gzip"),
        Just("gzip, chunked"),
        Just("chunked, gzip"),
        Just("identity"),
        Just(" chunked "),
        Just(""),
    ];
    let conn = prop_oneof![
        Just("close"),
        Just("keep-alive"),
        Just("Close"),
        Just("upgrade")
    ];
    prop_oneof![
        cl.prop_map(|v| format!("Content-Length: {v}")),
        te.prop_map(|v| format!("Transfer-Encoding: {v}")),
        conn.prop_map(|v| format!("Connection: {v}")),
        Just("X-Other: 1".to_owned()),
    ]
}

fn head() -> impl Strategy<Value = String> {
    (
        prop_oneof![Just("HTTP/1.1"), Just("HTTP/1.0")],
        prop_oneof![
            Just(200u16),
            Just(204),
            Just(304),
            Just(100),
            Just(502),
            Just(101)
        ],
        prop::collection::vec(framing_header(), 0..5),
    )
        .prop_map(|(v, s, hs)| {
            let mut h = format!("{v} {s} X\r\n");
            for l in hs {
                h.push_str(&l);
                h.push_str("\r\n");
            }
            h.push_str("\r\n");
            h
        })
}

/// What a head says about its framing, read independently of the parser.
fn lengths(head: &str) -> Vec<&str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .map(|(_, v)| v.trim())
        .collect()
}

fn codings(head: &str) -> Vec<&str> {
    head.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(n, _)| n.eq_ignore_ascii_case("transfer-encoding"))
        .map(|(_, v)| v)
        .collect()
}

/// A chunk-size line in any of the spellings a peer may use, right or wrong.
fn size_line(len: usize) -> impl Strategy<Value = (String, bool)> {
    let hex = format!("{len:x}");
    let upper = hex.to_ascii_uppercase();
    prop_oneof![
        Just((format!("{hex}\r\n"), true)),
        Just((format!("{upper}\r\n"), true)),
        Just((format!("000{hex}\r\n"), true)),
        Just((format!("{hex};name=value\r\n"), true)),
        Just((format!("{hex} ;ext\r\n"), true)),
        Just((format!("{hex}\n"), false)),
        Just((format!("{hex};ext\n"), false)),
        Just((format!("x{hex}\r\n"), false)),
        Just((format!("{hex}\r\r\n"), false)),
    ]
}

fn chunked_body() -> impl Strategy<Value = (Vec<u8>, Vec<u8>, bool)> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 1..64), 0..6)
        .prop_flat_map(|parts| {
            let lines: Vec<_> = parts.iter().map(|p| size_line(p.len())).collect();
            (Just(parts), lines, any::<bool>())
        })
        .prop_map(|(parts, lines, bare_lf_end)| {
            let mut wire = Vec::new();
            let mut valid = true;
            for (p, (line, ok)) in parts.iter().zip(lines) {
                wire.extend_from_slice(line.as_bytes());
                wire.extend_from_slice(p);
                wire.extend_from_slice(b"\r\n");
                valid &= ok;
            }
            if bare_lf_end {
                wire.extend_from_slice(b"0\n\n");
                valid = false;
            } else {
                wire.extend_from_slice(b"0\r\nx-t: 1\r\n\r\n");
            }
            (wire, parts.concat(), valid)
        })
}

proptest! {
    #[test]
    fn a_head_is_framed_one_way_or_not_reused(h in head(), extra in prop::collection::vec(any::<u8>(), 0..8)) {
        let mut wire = h.clone().into_bytes();
        wire.extend_from_slice(&extra);
        let Ok(Some(parsed)) = parse_head(&wire) else {
            return Ok(());
        };
        prop_assert_eq!(parsed.len, h.len());
        let cls = lengths(&h);
        let tes = codings(&h);
        let chunked_last = tes
            .last()
            .and_then(|v| v.rsplit(',').next())
            .is_some_and(|c| c.trim().eq_ignore_ascii_case("chunked"));
        let status = parsed.status.as_u16();
        if (100..200).contains(&status) || status == 204 || status == 304 {
            prop_assert_eq!(parsed.framing, Framing::Length { left: 0, want: 0 });
        } else if chunked_last {
            prop_assert!(matches!(parsed.framing, Framing::Chunked(_)));
        } else if !tes.is_empty() || cls.is_empty() {
            // A coding other than chunked last, or no length: the body runs to the close.
            prop_assert_eq!(parsed.framing, Framing::UntilClose);
            prop_assert!(!parsed.keep_alive);
        } else {
            let n: u64 = cls[0].parse().map_err(|_| TestCaseError::fail("length accepted unparsed"))?;
            prop_assert!(cls.iter().all(|c| c.parse::<u64>() == Ok(n)), "conflicting lengths accepted");
            prop_assert_eq!(parsed.framing, Framing::Length { left: n, want: n });
        }
        // A coded body beside a length, or in HTTP/1.0, leaves the framing in doubt.
        if !tes.is_empty() && (!cls.is_empty() || h.starts_with("HTTP/1.0")) {
            prop_assert!(!parsed.keep_alive);
        }
    }

    #[test]
    fn chunked_bodies_decode_the_same_in_any_split_and_bare_lf_is_refused(
        (wire, data, valid) in chunked_body(),
        cuts in prop::collection::vec(any::<usize>(), 0..10),
    ) {
        let whole = decode_all(&wire, &[]);
        let split = decode_all(&wire, &cuts);
        match (&whole, &split) {
            (Ok(a), Ok(b)) => {
                prop_assert_eq!(a, b);
                prop_assert!(valid, "an invalid body decoded: {:?}", String::from_utf8_lossy(&wire));
                prop_assert_eq!(&a.0, &data);
                prop_assert!(a.1);
            }
            (Err(_), Err(_)) => prop_assert!(!valid, "a valid body refused"),
            _ => prop_assert!(false, "whole and split disagree: {:?} {:?}", whole, split),
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_framing(bytes in prop::collection::vec(any::<u8>(), 0..1024), cuts in prop::collection::vec(any::<usize>(), 0..6)) {
        let _ = decode_all(&bytes, &cuts);
        let _ = parse_head(&bytes);
        let mut h = b"HTTP/1.1 200 OK\r\n".to_vec();
        h.extend_from_slice(&bytes);
        let _ = parse_head(&h);
    }
}
