//! What a lookup reports.

/// How much of a key each tenant already holds.
#[derive(Debug, Clone, PartialEq)]
pub struct PrefixMatch<T> {
    /// Length of the key as given, before page truncation.
    pub input_len: usize,
    /// The deepest match of any tenant, in units (whole pages on a paged tree).
    pub matched_len: usize,
    /// Every tenant holding at least one unit of the key, with the units it holds:
    /// deepest first, ties by ascending tenant.
    pub per_tenant: Vec<(T, usize)>,
    /// Recent traffic along the matched path, shallowest first: for each node, the units
    /// from the key's start to the node's end (the match's end on a partly matched edge),
    /// and how many lookups entered that node, a count that halves every
    /// [`traffic_half_life`](crate::TreeConfig::traffic_half_life) lookups. Only
    /// [`observe`](crate::RadixTree::observe) and
    /// [`match_and_insert`](crate::RadixTree::match_and_insert) count, and a restored tree
    /// starts from zero. When an edge is split, the lookups that ended inside it are taken
    /// to have ended before the split.
    pub traffic: Vec<(usize, f32)>,
    /// All counted lookups, decayed the same way: `traffic_at(n) / traffic_total` is the
    /// share of recent lookups whose key began with the first `n` units of this one.
    pub traffic_total: f32,
    /// With a `since` ([`peek_since`](crate::RadixTree::peek_since),
    /// [`observe_for_insert`](crate::RadixTree::observe_for_insert)): each tenant's units counting only
    /// entries recorded or touched at or after the time given, deepest first; empty
    /// otherwise. What a tenant was routed lately, whatever else it is known to hold.
    pub recent: Vec<(T, usize)>,
}

impl<T: Copy + Eq> PrefixMatch<T> {
    /// A match of nothing.
    pub fn empty(input_len: usize) -> Self {
        Self {
            input_len,
            matched_len: 0,
            per_tenant: Vec::new(),
            traffic: Vec::new(),
            traffic_total: 0.0,
            recent: Vec::new(),
        }
    }

    /// Recent lookups whose key began with the first `units` units of this key (as
    /// matched): the total for 0, the count of the node holding unit `units - 1`, and 0
    /// past the matched path.
    pub fn traffic_at(&self, units: usize) -> f32 {
        if units == 0 {
            return self.traffic_total;
        }
        self.traffic
            .iter()
            .find(|(end, _)| *end >= units)
            .map_or(0.0, |(_, c)| *c)
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
