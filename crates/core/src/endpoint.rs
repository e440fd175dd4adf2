//! The inference routes kvgate proxies: what a request's body looks like, where it goes,
//! and under which label its metrics and decisions are kept.

/// An inference route kvgate proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Chat,
    Completions,
    Generate,
}

impl Endpoint {
    /// Every route, in [`Endpoint::index`] order.
    pub const ALL: [Endpoint; 3] = [Endpoint::Chat, Endpoint::Completions, Endpoint::Generate];

    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
        }
    }

    /// 0, 1, 2 in the order above: where the route's series are kept.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The route whose path is `path`.
    pub fn from_path(path: &str) -> Option<Endpoint> {
        Endpoint::ALL.into_iter().find(|e| e.path() == path)
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn paths_and_indices_round_trip() {
        for (i, e) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(e.index(), i);
            assert_eq!(Endpoint::from_path(e.path()), Some(e));
        }
        assert_eq!(Endpoint::from_path("/v1/embeddings"), None);
    }
}
