//! The inference routes kvgate proxies: what a request's body looks like, where it goes,
//! and under which label its metrics and decisions are kept.

/// An inference route kvgate proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    Chat,
    Completions,
    Generate,
    /// OpenAI's Responses API.
    Responses,
    /// Anthropic's Messages API, as vLLM and SGLang serve it.
    Messages,
    Embeddings,
    Rerank,
    /// `/rerank`, the path vLLM and SGLang also serve rerank on.
    RerankRoot,
    Score,
    Classify,
    Tokenize,
    Detokenize,
    /// `/v1/audio/transcriptions`: a multipart upload.
    Transcriptions,
    /// Any other path under `/v1/`, with `--passthrough-unknown-routes`: forwarded to the
    /// request's own path.
    Other,
}

/// How a route's body is read for routing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyShape {
    /// `messages`, rendered with their roles.
    Chat,
    /// `prompt`: text, texts or token ids.
    Completion,
    /// SGLang's `text` or `input_ids`.
    Generate,
    /// `instructions` and `input`, text or message items.
    Responses,
    /// `system` and `messages`.
    Messages,
    /// A JSON object whose `model` and `stream` are read; no prompt (routed by load).
    Json,
    /// `multipart/form-data`: its `model` and `stream` fields are read; no prompt.
    Multipart,
    /// Whatever comes: a JSON object's `model` and `stream` when it is one, else nothing.
    Any,
}

impl Endpoint {
    /// Every route, in [`Endpoint::index`] order.
    pub const ALL: [Endpoint; 14] = [
        Endpoint::Chat,
        Endpoint::Completions,
        Endpoint::Generate,
        Endpoint::Responses,
        Endpoint::Messages,
        Endpoint::Embeddings,
        Endpoint::Rerank,
        Endpoint::RerankRoot,
        Endpoint::Score,
        Endpoint::Classify,
        Endpoint::Tokenize,
        Endpoint::Detokenize,
        Endpoint::Transcriptions,
        Endpoint::Other,
    ];

    /// The route's path; [`Endpoint::Other`]'s is `/v1/*`, its label (it is forwarded to
    /// the request's own path).
    pub const fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
            Endpoint::Responses => "/v1/responses",
            Endpoint::Messages => "/v1/messages",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::RerankRoot => "/rerank",
            Endpoint::Score => "/v1/score",
            Endpoint::Classify => "/v1/classify",
            Endpoint::Tokenize => "/v1/tokenize",
            Endpoint::Detokenize => "/v1/detokenize",
            Endpoint::Transcriptions => "/v1/audio/transcriptions",
            Endpoint::Other => "/v1/*",
        }
    }

    /// How the route's body is read.
    pub const fn shape(self) -> BodyShape {
        match self {
            Endpoint::Chat => BodyShape::Chat,
            Endpoint::Completions => BodyShape::Completion,
            Endpoint::Generate => BodyShape::Generate,
            Endpoint::Responses => BodyShape::Responses,
            Endpoint::Messages => BodyShape::Messages,
            Endpoint::Transcriptions => BodyShape::Multipart,
            Endpoint::Other => BodyShape::Any,
            Endpoint::Embeddings
            | Endpoint::Rerank
            | Endpoint::RerankRoot
            | Endpoint::Score
            | Endpoint::Classify
            | Endpoint::Tokenize
            | Endpoint::Detokenize => BodyShape::Json,
        }
    }

    /// Whether the route carries a prompt that routing matches against the caches.
    pub const fn has_prompt(self) -> bool {
        matches!(
            self.shape(),
            BodyShape::Chat
                | BodyShape::Completion
                | BodyShape::Generate
                | BodyShape::Responses
                | BodyShape::Messages
        )
    }

    /// Whether a finished event stream on this route ends with `data: [DONE]` (the
    /// OpenAI completion streams and SGLang's `/generate`). Responses and Messages end
    /// with their own last event; their end is the body's framing.
    pub const fn ends_with_done(self) -> bool {
        matches!(
            self,
            Endpoint::Chat | Endpoint::Completions | Endpoint::Generate
        )
    }

    /// Where the route's series are kept: its place in [`Endpoint::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// The route whose path is `path` ([`Endpoint::Other`] is no path's).
    pub fn from_path(path: &str) -> Option<Endpoint> {
        Endpoint::ALL
            .into_iter()
            .find(|e| *e != Endpoint::Other && e.path() == path)
    }
}

#[cfg(test)]
mod tests {
    use super::{BodyShape, Endpoint};

    #[test]
    fn paths_and_indices_round_trip() {
        for (i, e) in Endpoint::ALL.into_iter().enumerate() {
            assert_eq!(e.index(), i);
            if e != Endpoint::Other {
                assert_eq!(Endpoint::from_path(e.path()), Some(e));
            }
        }
        assert_eq!(
            Endpoint::from_path("/v1/embeddings"),
            Some(Endpoint::Embeddings)
        );
        assert_eq!(Endpoint::from_path("/v1/*"), None);
        assert_eq!(Endpoint::from_path("/v1/unknown"), None);
    }

    #[test]
    fn prompts_are_read_where_routes_carry_one() {
        let with: Vec<Endpoint> = Endpoint::ALL
            .into_iter()
            .filter(|e| e.has_prompt())
            .collect();
        assert_eq!(
            with,
            [
                Endpoint::Chat,
                Endpoint::Completions,
                Endpoint::Generate,
                Endpoint::Responses,
                Endpoint::Messages
            ]
        );
        assert_eq!(Endpoint::Transcriptions.shape(), BodyShape::Multipart);
        assert!(!Endpoint::Responses.ends_with_done());
        assert!(Endpoint::Generate.ends_with_done());
    }
}
