//! Keys read a run at a time.

/// A key the tree reads a run at a time, so that it need not be one slice: a long prompt
/// can stay as the pieces of the request that carried it. Slices, arrays and vectors are
/// keys of one run.
pub trait KeyRuns<E> {
    /// Units in the key.
    fn units(&self) -> usize;

    /// The units from `pos` to the end of the run holding it; non-empty for
    /// `pos < units()`.
    fn run(&self, pos: usize) -> &[E];
}

impl<E> KeyRuns<E> for [E] {
    fn units(&self) -> usize {
        self.len()
    }

    fn run(&self, pos: usize) -> &[E] {
        &self[pos..]
    }
}

impl<E, const N: usize> KeyRuns<E> for [E; N] {
    fn units(&self) -> usize {
        N
    }

    fn run(&self, pos: usize) -> &[E] {
        &self[pos..]
    }
}

impl<E> KeyRuns<E> for Vec<E> {
    fn units(&self) -> usize {
        self.len()
    }

    fn run(&self, pos: usize) -> &[E] {
        &self[pos..]
    }
}

/// Units `from..to` of `key`, copied into one vector.
pub(crate) fn copy_units<E: Copy, K: KeyRuns<E> + ?Sized>(
    key: &K,
    from: usize,
    to: usize,
) -> Vec<E> {
    let mut out = Vec::with_capacity(to - from);
    let mut pos = from;
    while pos < to {
        let run = key.run(pos);
        let take = run.len().min(to - pos);
        if take == 0 {
            break;
        }
        out.extend_from_slice(&run[..take]);
        pos += take;
    }
    out
}

/// Length of the common prefix of `edge` and units `pos..len` of `key`.
pub(crate) fn common_prefix_at<E: PartialEq, K: KeyRuns<E> + ?Sized>(
    edge: &[E],
    key: &K,
    pos: usize,
    len: usize,
) -> usize {
    let mut i = 0;
    while i < edge.len() && pos + i < len {
        let run = key.run(pos + i);
        let run = &run[..run.len().min(len - pos - i)];
        let k = common_prefix(&edge[i..], run);
        i += k;
        // Short of the run's end: a unit differs, or the edge ended inside this run.
        if k < run.len() || run.is_empty() {
            break;
        }
    }
    i
}

/// Length of the common prefix: 4 KiB-unit blocks first (slice equality is one SIMD
/// `memcmp` for the primitive unit types, so a long shared prompt is compared at memory
/// speed), then 64, then 16 units at a time, then unit by unit.
pub(crate) fn common_prefix<E: PartialEq>(a: &[E], b: &[E]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    for block in [4096, 64, 16] {
        while i + block <= n && a[i..i + block] == b[i..i + block] {
            i += block;
        }
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}
