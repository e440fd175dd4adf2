//! What a lookup reports.

/// How much of a key each tenant already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch<T> {
    /// Length of the key as given, before page truncation.
    pub input_len: usize,
    /// The deepest match of any tenant, in units (whole pages on a paged tree).
    pub matched_len: usize,
    /// Every tenant holding at least one unit of the key, with the units it holds:
    /// deepest first, ties by ascending tenant.
    pub per_tenant: Vec<(T, usize)>,
}

impl<T: Copy + Eq> PrefixMatch<T> {
    /// A match of nothing.
    pub fn empty(input_len: usize) -> Self {
        Self {
            input_len,
            matched_len: 0,
            per_tenant: Vec::new(),
        }
    }

    /// `matched_len / input_len`, 0 for an empty input.
    pub fn rate(&self) -> f64 {
        if self.input_len == 0 {
            0.0
        } else {
            self.matched_len as f64 / self.input_len as f64
        }
    }

    /// Units that `tenant` holds, 0 if none.
    pub fn matched_by(&self, tenant: T) -> usize {
        self.per_tenant
            .iter()
            .find(|(t, _)| *t == tenant)
            .map_or(0, |(_, n)| *n)
    }

    /// The tenants at the deepest match, ascending.
    pub fn deepest(&self) -> impl Iterator<Item = T> + '_ {
        self.per_tenant
            .iter()
            .take_while(|(_, n)| *n == self.matched_len && *n > 0)
            .map(|(t, _)| *t)
    }
}
