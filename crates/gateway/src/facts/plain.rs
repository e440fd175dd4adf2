//! A JSON string's plain run: its bytes up to the next quote or backslash, which must hold
//! no raw control character and must be UTF-8.
//!
//! A long prompt is one plain run, so this is where the fast path reads most of a body.
//! The first 64 bytes are read a word at a time (most runs of code or chat text end there,
//! at an escape). Past them, where the CPU has AVX-512BW or AVX2, one loop over 128-byte
//! blocks finds the run's end, tests for control characters and ors the bytes together.
//! A run whose bytes or to below 0x80 is ASCII, so UTF-8 with no further read; other runs
//! get simdutf8. On CPUs without the wide loop a long run takes three reads (`memchr2` for
//! its end, its least byte for control characters, simdutf8 for UTF-8).

/// Bytes per block of the wide loop: wide enough for the compiler to unroll the vector
/// compares, short enough that the block holding a short string's end is cheap to redo.
const BLOCK: usize = 128;
/// Bytes per step where a block holds the stop.
const SUB: usize = 16;

/// The run at the start of `b` as text, and the index of the quote or backslash that ends
/// it. `None` when neither comes, a control character comes first, or the run is not UTF-8.
pub(super) fn plain_run(b: &[u8]) -> Option<(&str, usize)> {
    let (end, or) = match head(b) {
        Ok(found) => found,
        Err((n, or)) => match wide_scan(&b[n..]) {
            Some((k, o)) => (n + k, or | o),
            None => return narrow(b),
        },
    };
    // Past the end, or a control character: not a plain run.
    if *b.get(end)? < 0x20 {
        return None;
    }
    let run = &b[..end];
    if or < 0x80 {
        // SAFETY: the bytes of `run` or together to below 0x80.
        #[expect(unsafe_code, reason = "the ASCII run is the scan's proof of UTF-8")]
        return Some((unsafe { ascii_str(run) }, end));
    }
    Some((simdutf8::basic::from_utf8(run).ok()?, end))
}

/// [`scan_blocks`] where the CPU has the wide loop.
#[cfg(target_arch = "x86_64")]
fn wide_scan(b: &[u8]) -> Option<(usize, u8)> {
    wide::scan(b)
}

/// No wide loop elsewhere.
#[cfg(not(target_arch = "x86_64"))]
fn wide_scan(_: &[u8]) -> Option<(usize, u8)> {
    None
}

/// Bytes a run is read 8 at a time before the wide loop takes over: code and chat text stop
/// at an escape every line, and the wide loop's setup costs more than such a short run.
const HEAD: usize = 64;
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The stop bytes of `w` (quote, backslash, control character) as their top bits. Only the
/// lowest is exact (a borrow can flag a byte above a true stop), which is the one used.
fn stops(w: u64) -> u64 {
    // Bytes below n; the quote is found with the controls, as in `special_folded`.
    let below = |v: u64, n: u64| v.wrapping_sub(ONES * n) & !v & HIGHS;
    below(w ^ (ONES * u64::from(b'\\')), 1) | below(w ^ (ONES * 0x02), 0x21)
}

/// 0x80 when a byte of `or` has its top bit set, else 0.
fn high(or: u64) -> u8 {
    if or & HIGHS == 0 { 0 } else { 0x80 }
}

/// The first `HEAD` bytes of `b`, a word at a time: `Ok` with the first stop's index
/// (`b.len()` when `b` ends first) and whether a byte before it is above 0x7f, or `Err`
/// with the bytes read and the same flag when the run goes on past them.
fn head(b: &[u8]) -> Result<(usize, u8), (usize, u8)> {
    let part = &b[..b.len().min(HEAD)];
    let (words, rest) = part.as_chunks::<8>();
    let mut or = 0u64;
    for (j, w) in words.iter().enumerate() {
        let w = u64::from_le_bytes(*w);
        let s = stops(w);
        if s != 0 {
            let k = s.trailing_zeros() as usize / 8;
            // The k bytes before the stop are the word's low 8k bits (k is at most 7).
            or |= w & ((1u64 << (8 * k)) - 1);
            return Ok((8 * j + k, high(or)));
        }
        or |= w;
    }
    let mut i = 8 * words.len();
    for &x in rest {
        if special(x) {
            return Ok((i, high(or)));
        }
        or |= u64::from(x);
        i += 1;
    }
    if b.len() > HEAD {
        Err((i, high(or)))
    } else {
        Ok((i, high(or)))
    }
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
#[expect(
    unsafe_code,
    reason = "a second read to prove UTF-8 is the pass this saves"
)]
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

/// [`special`] in two compares: flipping bit 1 maps the quote (0x22) to 0x20 and
/// 0x00..=0x1f onto itself. Faster in the 16-byte steps (parse bench, code: -5 to -10 %);
/// the wide loop keeps three, as its loads bound it and the flip cost it 3 % on ASCII.
#[inline(always)]
fn special_folded(x: u8) -> bool {
    ((x ^ 0x02) <= 0x20) | (x == b'\\')
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
    // The block holding the stop (or a tail shorter than a block), 16 bytes at a time: a
    // prompt with an escape every line stops in most blocks.
    let (subs, _) = b[i..].as_chunks::<SUB>();
    for sub in subs {
        let (mut hit, mut all) = (false, 0u8);
        for &x in sub {
            hit |= special_folded(x);
            all |= x;
        }
        if hit {
            break;
        }
        or |= all;
        i += SUB;
    }
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
    #[expect(unsafe_code, reason = "target-feature calls, after the CPU check")]
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
mod tests;
