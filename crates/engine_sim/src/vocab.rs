//! An engine's tokens: the stand-in [`Tokenizer`] of the config, or, with `tokenizer_path`,
//! a model's own Hugging Face tokenizer and chat template (through `kvgate-tokenize`, as
//! SGLang renders and encodes with transformers), so a gateway holding the same files can
//! compute the very ids the engine caches and publishes in its KV events.

use std::io;
use std::sync::Arc;

use kvgate_tokenize::{ModelTokenizer, TokenizeError};

use crate::Tokenizer;
use crate::config::SimConfig;

/// Words a model tokenizer's engine generates, kept when each is one token on its own
/// and their concatenation re-encodes to the same ids.
const WORDS: [&str; 24] = [
    " the", " of", " and", " to", " in", " a", " is", " it", " for", " on", " as", " by", " be",
    " at", " or", " an", " if", " we", " so", " no", " do", " up", " this", " that",
];

/// Why a model's tokenizer could not turn a request into tokens. Both come from the request
/// (its text, or a chat its template refuses), so the same body fails again.
#[derive(Debug, thiserror::Error)]
pub(crate) enum VocabError {
    /// A text prompt did not encode.
    #[error(transparent)]
    Encode(TokenizeError),
    /// The chat template refused the body, or its rendering did not encode.
    #[error(transparent)]
    Chat(TokenizeError),
}

#[derive(Debug)]
pub(crate) enum Vocab {
    Stand(Tokenizer),
    Model {
        tok: Arc<ModelTokenizer>,
        words: Vec<(u32, &'static str)>,
    },
}

impl Vocab {
    pub(crate) fn load(cfg: &SimConfig) -> io::Result<Vocab> {
        let Some(path) = &cfg.tokenizer_path else {
            return Ok(Vocab::Stand(cfg.tokenizer));
        };
        let tok = ModelTokenizer::from_path(path)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let mut words = Vec::new();
        for w in WORDS {
            if let Ok(ids) = tok.encode(w, false)
                && let [id] = ids[..]
            {
                words.push((id, w));
            }
        }
        let all: String = words.iter().map(|(_, w)| *w).collect();
        let ids: Vec<u32> = words.iter().map(|(id, _)| *id).collect();
        if words.len() < 4 || tok.encode(&all, false).ok() != Some(ids) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{}: fewer than 4 common words are one token each, or they do not \
                     re-encode alone; the simulator cannot generate with this tokenizer",
                    path.display()
                ),
            ));
        }
        Ok(Vocab::Model {
            tok: Arc::new(tok),
            words,
        })
    }

    /// A text prompt's tokens (`/generate` `text`, `/v1/completions` `prompt`): with the
    /// special tokens the tokenizer adds, as `tokenizer.encode(text)`.
    pub(crate) fn encode(&self, text: &str) -> Result<Vec<u32>, VocabError> {
        match self {
            Vocab::Stand(kind) => Ok(kind.encode(text)),
            Vocab::Model { tok, .. } => tok.encode(text, true).map_err(VocabError::Encode),
        }
    }

    /// A chat body's tokens, through the model's chat template; `None` for the stand-in
    /// tokenizers, which render the chat themselves.
    pub(crate) fn chat(&self, body: &[u8]) -> Option<Result<Vec<u32>, VocabError>> {
        match self {
            Vocab::Stand(_) => None,
            Vocab::Model { tok, .. } => Some(tok.chat_ids(body).map_err(VocabError::Chat)),
        }
    }

    pub(crate) fn generated_len(&self) -> usize {
        match self {
            Vocab::Stand(kind) => kind.generated_len(),
            Vocab::Model { words, .. } => words.len(),
        }
    }

    /// The `i`-th generated token (modulo [`Self::generated_len`]) and its text.
    pub(crate) fn generated(&self, i: usize) -> (u32, &'static str) {
        match self {
            Vocab::Stand(kind) => kind.generated(i),
            Vocab::Model { words, .. } => words[i % words.len()],
        }
    }
}
