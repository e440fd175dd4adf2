//! The one place route errors become HTTP answers.

use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::json;

use crate::vocab::VocabError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum ApiError {
    /// The client sent something the engine refuses; retrying the same body cannot help.
    #[error("{0}")]
    BadRequest(String),
    /// No such route (or not in this flavour).
    #[error("Not Found")]
    NotFound,
    /// The engine stopped while the request was in flight; another engine may serve it.
    #[error("the engine stopped before the request finished")]
    Unavailable,
    /// A `previous_response_id` this engine does not hold (another engine's, or lost in a
    /// restart): vLLM's 404.
    #[error("Response with id '{0}' not found.")]
    UnknownResponse(String),
    /// A model (or adapter) the engine does not serve: vLLM's 404.
    #[error("The model `{0}` does not exist.")]
    UnknownModel(String),
}

/// A prompt the model's tokenizer refuses is the client's: SGLang answers it as a 400.
impl From<VocabError> for ApiError {
    fn from(e: VocabError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound | ApiError::UnknownResponse(_) | ApiError::UnknownModel(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code()).json(self.body())
    }
}

impl ApiError {
    /// The JSON body: `{"error": {"message", "type", "code"}}` (SGLang's `/generate` answers
    /// `{"error": {"message"}}`; its OpenAI routes a flat `{"object": "error", ...}`: this one
    /// shape stands for both, the message being SGLang's).
    pub(crate) fn body(&self) -> serde_json::Value {
        match self {
            // FastAPI's shape, which is what SGLang and vLLM answer for unknown routes.
            ApiError::NotFound => json!({"detail": "Not Found"}),
            _ => json!({"error": {
                "message": self.to_string(),
                "type": match self {
                    ApiError::BadRequest(_) => "BadRequestError",
                    ApiError::UnknownResponse(_) => "invalid_request_error",
                    ApiError::UnknownModel(_) => "NotFoundError",
                    _ => "ServiceUnavailableError",
                },
                "code": self.status_code().as_u16(),
            }}),
        }
    }
}
