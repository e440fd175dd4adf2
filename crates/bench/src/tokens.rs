//! The engines' own token ids for a run's chats and answers, so the ideal and the token
//! prompts use exactly what the engines compute.

use std::path::Path;

use kvgate_engine_sim::Tokenizer;
use kvgate_tokenize::{ModelTokenizer, TokenizeError};
use serde_json::json;

use crate::ideal::render_chat;
use crate::workload::Message;

/// How the engines of a run tokenize: the simulator's stand-in, or a model's tokenizer
/// and chat template (`SimConfig::tokenizer_path`).
#[derive(Debug)]
pub enum EngineTokens {
    Stand(Tokenizer),
    Model(Box<ModelTokenizer>),
}

/// A chat or answer the engines' tokenizer could not encode.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("the model tokenizer: {0}")]
    Tokenize(#[from] TokenizeError),
    #[error("the chat body: {0}")]
    Json(#[from] serde_json::Error),
}

impl EngineTokens {
    /// The engines' tokenizer: the model's at `path` when given, else `stand`.
    pub fn load(stand: Tokenizer, path: Option<&Path>) -> Result<EngineTokens, EncodeError> {
        Ok(match path {
            Some(p) => EngineTokens::Model(Box::new(ModelTokenizer::from_path(p)?)),
            None => EngineTokens::Stand(stand),
        })
    }

    /// A chat's prompt ids, rendered and encoded as the engines do it.
    pub fn chat(&self, messages: &[Message]) -> Result<Vec<u32>, EncodeError> {
        match self {
            EngineTokens::Stand(t) => Ok(t.encode(&render_chat(messages))),
            EngineTokens::Model(t) => {
                let body = serde_json::to_vec(&json!({ "messages": messages }))?;
                Ok(t.chat_ids(&body)?)
            }
        }
    }

    /// An answer's ids: the simulator generates words that encode back to the ids it
    /// generated, with either tokenizer.
    pub fn answer(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        match self {
            EngineTokens::Stand(t) => Ok(t.encode(text)),
            EngineTokens::Model(t) => Ok(t.encode(text, false)?),
        }
    }
}
