use proptest::prelude::*;

use super::*;

/// The run byte by byte: the model every path must agree with (its own test of a stop, so
/// a broken `special` cannot pass by agreeing with itself).
fn reference(b: &[u8]) -> Option<(&str, usize)> {
    let end = b
        .iter()
        .position(|&x| x == b'"' || x == b'\\' || x < 0x20)?;
    if b[end] < 0x20 {
        return None;
    }
    Some((std::str::from_utf8(&b[..end]).ok()?, end))
}

#[test]
fn the_stop_bytes_are_the_quote_the_backslash_and_the_controls() {
    for x in 0..=u8::MAX {
        let stop = x == b'"' || x == b'\\' || x < 0x20;
        assert_eq!(special(x), stop, "byte {x:#04x}");
        assert_eq!(special_folded(x), stop, "byte {x:#04x}");
        for k in 0..8 {
            let mut w = [b'a'; 8];
            w[k] = x;
            let s = stops(u64::from_le_bytes(w));
            let first = (s != 0).then(|| s.trailing_zeros() as usize / 8);
            assert_eq!(first, stop.then_some(k), "byte {x:#04x} at {k} of a word");
        }
    }
}

/// Every path this CPU can take, by name.
#[cfg_attr(
    target_arch = "x86_64",
    expect(unsafe_code, reason = "each target-feature copy, after the CPU check")
)]
fn paths(b: &[u8]) -> Vec<(&'static str, Option<(usize, bool)>)> {
    let found = |(end, or): (usize, u8)| {
        let stop = b.get(end).copied();
        stop.filter(|&s| s >= 0x20).map(|_| {
            let run = &b[..end];
            let utf8 = if or < 0x80 {
                assert!(run.is_ascii(), "or {or:#x} but not ASCII");
                true
            } else {
                std::str::from_utf8(run).is_ok()
            };
            (end, utf8)
        })
    };
    let mut out = vec![
        ("plain_run", plain_run(b).map(|(_, e)| (e, true))),
        ("narrow", narrow(b).map(|(_, e)| (e, true))),
        ("blocks", found(scan_blocks(b))),
        (
            "head, then blocks",
            found(match head(b) {
                Ok(x) => x,
                Err((n, or)) => {
                    let (k, o) = scan_blocks(&b[n..]);
                    (n + k, or | o)
                }
            }),
        ),
    ];
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: checked just above.
            out.push(("avx2", found(unsafe { wide::avx2(b) })));
        }
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: checked just above.
            out.push(("avx512", found(unsafe { wide::avx512(b) })));
        }
    }
    // A run that is not UTF-8 is no run.
    for (_, r) in &mut out {
        *r = r.filter(|&(_, utf8)| utf8);
    }
    out
}

fn agree(b: &[u8]) {
    let want = reference(b).map(|(_, e)| (e, true));
    for (name, got) in paths(b) {
        assert_eq!(got, want, "{name} on {} bytes", b.len());
    }
    if let (Some((text, _)), Some((want, _))) = (plain_run(b), reference(b)) {
        assert_eq!(text, want);
    }
}

#[test]
fn each_stop_is_found_in_every_block_position() {
    // A quote at the end, so a control character missed is a run found, not no run.
    let mut base = b"the quick brown fox ".repeat(40);
    base.push(b'"');
    for at in [0, 1, 7, 8, 9, 63, 64, 65, 127, 128, 129, 255, 256, 700, 799] {
        for stop in [b'"', b'\\', 0, b'\n', 0x1f] {
            let mut b = base.clone();
            b[at] = stop;
            agree(&b);
        }
    }
    // No stop at all, at lengths around the block.
    for n in [0, 1, 15, 16, 17, 127, 128, 129, 800] {
        agree(&base[..n]);
    }
}

#[test]
fn non_ascii_before_the_stop_is_checked_as_utf8() {
    let base = b"the quick brown fox ".repeat(40);
    // In a full block before the stop's block, and in the stop's own block.
    // In the head's words (the stop's own word too) and in the wide loop's blocks.
    for (bad_at, stop_at) in [(3, 6), (10, 60), (10, 500), (300, 310), (498, 500)] {
        let mut b = base.clone();
        b[stop_at] = b'"';
        b[bad_at] = 0xff;
        assert_eq!(plain_run(&b), None, "0xff at {bad_at}, quote at {stop_at}");
        agree(&b);
        // Valid UTF-8 there instead is read as text.
        b[bad_at..bad_at + 2].copy_from_slice("é".as_bytes());
        let (text, end) = plain_run(&b).expect("valid UTF-8");
        assert_eq!(end, stop_at);
        assert!(text.contains('é'));
        agree(&b);
    }
    // Non-ASCII after the stop is not the run's, in the stop's own word or further on.
    for (stop_at, bad_at) in [(5, 6), (5, 7), (200, 300)] {
        let mut b = base.clone();
        b[stop_at] = b'"';
        b[bad_at] = 0xff;
        assert_eq!(plain_run(&b).map(|(_, e)| e), Some(stop_at));
    }
}

proptest! {
    #[test]
    fn every_path_agrees_with_the_byte_by_byte_run(
        fill in prop::collection::vec(prop_oneof![
            16 => (0x20u8..0x7f).prop_map(|x| vec![x]),
            2 => Just("é".as_bytes().to_vec()),
            2 => Just("中😀".as_bytes().to_vec()),
            1 => (0x80u8..=0xff).prop_map(|x| vec![x]),
            1 => Just(b"\"".to_vec()),
            1 => Just(b"\\".to_vec()),
            1 => (0u8..0x20).prop_map(|x| vec![x]),
        ], 0..700),
        plain_head in 0usize..600,
    ) {
        // A long stop-free head, then the mix, so stops land in every block position.
        let mut b = vec![b'a'; plain_head];
        b.extend(fill.concat());
        agree(&b);
    }
}
