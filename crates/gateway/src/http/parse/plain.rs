//! A JSON string's plain run: its bytes up to the next quote or backslash, which must hold
//! no raw control character and must be UTF-8.
//!
//! A long prompt is one plain run, so this is where the fast path reads most of a body.
//! Where the CPU has AVX-512BW or AVX2, one loop over 128-byte blocks finds the run's end,
//! tests for control characters and ors the bytes together: a run whose or is below 0x80 is
//! ASCII, so UTF-8 with no further read. Elsewhere the run takes three reads (`memchr2` for
//! its end, its least byte for control characters, simdutf8 for UTF-8), which is also
//! where a wide run with non-ASCII bytes goes for its UTF-8 check.

/// Bytes per block of the wide loop: wide enough for the compiler to unroll the vector
/// compares, short enough that the block holding a short string's end is cheap to redo.
const BLOCK: usize = 128;

/// The run at the start of `b` as text, and the index of the quote or backslash that ends
/// it. `None` when neither comes, a control character comes first, or the run is not UTF-8.
pub(super) fn plain_run(b: &[u8]) -> Option<(&str, usize)> {
    #[cfg(target_arch = "x86_64")]
    if let Some((end, or)) = wide::scan(b) {
        // Past the end, or a control character: not a plain run.
        if *b.get(end)? < 0x20 {
            return None;
        }
        let run = &b[..end];
        if or < 0x80 {
            // SAFETY: the bytes of `run` or together to below 0x80.
            #[allow(unsafe_code)]
            return Some((unsafe { ascii_str(run) }, end));
        }
        return Some((simdutf8::basic::from_utf8(run).ok()?, end));
    }
    narrow(b)
}

/// The three-read run, for CPUs without the wide loop.
fn narrow(b: &[u8]) -> Option<(&str, usize)> {
    let end = memchr::memchr2(b'"', b'\\', b)?;
    let run = &b[..end];
    // The least byte vectorises to one `pminub` per 16 bytes.
    if run.iter().copied().min().is_some_and(|m| m < 0x20) {
        return None;
    }
    Some((simdutf8::basic::from_utf8(run).ok()?, end))
}

/// Text of a run the wide loop found to be ASCII; reading it again to prove that would be
/// the pass the loop saves.
///
/// # Safety
/// Every byte of `run` is below 0x80.
#[allow(unsafe_code)]
unsafe fn ascii_str(run: &[u8]) -> &str {
    debug_assert!(run.is_ascii());
    // SAFETY: ASCII is UTF-8, and the caller vouches that `run` is ASCII.
    unsafe { std::str::from_utf8_unchecked(run) }
}

/// Ends a plain run.
#[inline(always)]
fn special(x: u8) -> bool {
    (x == b'"') | (x == b'\\') | (x < 0x20)
}

/// Index of the first special byte (`b.len()` when none) and the or of the bytes before
/// it. Written for the compiler to vectorise, inlined into each `target_feature` copy.
#[inline(always)]
fn scan_blocks(b: &[u8]) -> (usize, u8) {
    let (blocks, _) = b.as_chunks::<BLOCK>();
    // Or-ed lane by lane, folded once at the end: a fold per block would be a chain of
    // shuffles on every block.
    let mut lanes = [0u8; BLOCK];
    let mut i = 0;
    for block in blocks {
        let mut hit = false;
        for &x in block {
            hit |= special(x);
        }
        if hit {
            break;
        }
        for (l, &x) in lanes.iter_mut().zip(block) {
            *l |= x;
        }
        i += BLOCK;
    }
    let mut or = lanes.iter().fold(0, |a, &x| a | x);
    while let Some(&x) = b.get(i) {
        if special(x) {
            break;
        }
        or |= x;
        i += 1;
    }
    (i, or)
}

#[cfg(target_arch = "x86_64")]
mod wide {
    use super::scan_blocks;

    /// [`scan_blocks`] at the widest vectors the CPU has, or `None` below AVX2 (where the
    /// compiler's SSE2 code is slower than the three reads).
    #[allow(unsafe_code)]
    pub(super) fn scan(b: &[u8]) -> Option<(usize, u8)> {
        if std::arch::is_x86_feature_detected!("avx512bw") {
            // SAFETY: the CPU has AVX-512BW, checked just above.
            return Some(unsafe { avx512(b) });
        }
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            return Some(unsafe { avx2(b) });
        }
        None
    }

    #[target_feature(enable = "avx512bw")]
    pub(super) fn avx512(b: &[u8]) -> (usize, u8) {
        scan_blocks(b)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn avx2(b: &[u8]) -> (usize, u8) {
        scan_blocks(b)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The run byte by byte: the model every path must agree with.
    fn reference(b: &[u8]) -> Option<(&str, usize)> {
        let end = b.iter().position(|&x| special(x))?;
        if b[end] < 0x20 {
            return None;
        }
        Some((std::str::from_utf8(&b[..end]).ok()?, end))
    }

    /// Every path this CPU can take, by name.
    #[allow(unsafe_code)]
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
        let base = b"the quick brown fox ".repeat(40);
        for at in [0, 1, 63, 64, 127, 128, 129, 255, 256, 700, 799] {
            for stop in [b'"', b'\\', 0, b'\n', 0x1f] {
                let mut b = base.clone();
                b[at] = stop;
                agree(&b);
            }
        }
        // No stop at all, at lengths around the block.
        for n in [0, 1, 127, 128, 129, 800] {
            agree(&base[..n]);
        }
    }

    #[test]
    fn non_ascii_before_the_stop_is_checked_as_utf8() {
        let base = b"the quick brown fox ".repeat(40);
        // In a full block before the stop's block, and in the stop's own block.
        for (bad_at, stop_at) in [(10, 500), (300, 310), (498, 500)] {
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
        // Non-ASCII after the stop is not the run's.
        let mut b = base.clone();
        b[200] = b'"';
        b[300] = 0xff;
        assert_eq!(plain_run(&b).map(|(_, e)| e), Some(200));
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
}
