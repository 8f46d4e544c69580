//! Errors the server answers with, in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.
//! Every way a request can be refused is one variant here, so the HTTP status, the error type and the
//! wording live in one place.

use serde_json::json;

/// A request the server refuses, or could not finish.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("the request body is not valid UTF-8 (at byte {0}); send JSON encoded as UTF-8")]
    InvalidUtf8(usize),
    #[error("the request body is not valid JSON: {0}")]
    InvalidJson(String),
    #[error("{message}")]
    InvalidParam { param: &'static str, message: String },
    #[error(
        "This model's maximum context length is {ctx} tokens. However, you requested {} tokens \
         ({prompt} in the messages, {completion} in the completion). Please reduce the length of the \
         messages or completion.",
        prompt + completion
    )]
    ContextLength { ctx: usize, prompt: usize, completion: usize },
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot read the request body: {0}")]
    Body(String),
    #[error("no route for {method} {path}; the engine serves POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET and DELETE /v1/responses/{{id}}, POST /api/chat, GET /v1/models, POST /tokenize, POST /detokenize, POST /apply-template and GET /health")]
    NotFound { method: String, path: String },
    #[error("{method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("the engine is busy: {in_flight} requests in flight (limit {limit}); retry later")]
    Busy { in_flight: usize, limit: usize },
    #[error("the engine failed: {0}")]
    Engine(String),
    #[error("Previous response with id '{0}' not found.")]
    ResponseNotFound(String),
    /// `GET`/`DELETE /v1/responses/{id}` of an id this engine does not hold.
    #[error("Response with id '{0}' not found.")]
    StoredResponseNotFound(String),
}

impl ApiError {
    /// A bad value for `param`.
    pub fn param(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::InvalidParam { param, message: message.into() }
    }

    pub fn status(&self) -> http::StatusCode {
        use http::StatusCode as S;
        match self {
            ApiError::NotFound { .. } | ApiError::ResponseNotFound(_) | ApiError::StoredResponseNotFound(_) => S::NOT_FOUND,
            ApiError::MethodNotAllowed { .. } => S::METHOD_NOT_ALLOWED,
            ApiError::TooLarge { .. } => S::PAYLOAD_TOO_LARGE,
            ApiError::Busy { .. } => S::TOO_MANY_REQUESTS,
            ApiError::Engine(_) => S::INTERNAL_SERVER_ERROR,
            _ => S::BAD_REQUEST,
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            ApiError::NotFound { .. } | ApiError::StoredResponseNotFound(_) => "not_found_error",
            ApiError::Busy { .. } => "rate_limit_error",
            ApiError::Engine(_) => "server_error",
            _ => "invalid_request_error",
        }
    }

    fn param_name(&self) -> Option<&'static str> {
        match self {
            ApiError::InvalidParam { param, .. } => Some(param),
            ApiError::ContextLength { .. } => Some("messages"),
            ApiError::ResponseNotFound(_) => Some("previous_response_id"),
            _ => None,
        }
    }

    fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::ContextLength { .. } => Some("context_length_exceeded"),
            ApiError::InvalidJson(_) | ApiError::InvalidUtf8(_) => Some("invalid_json"),
            ApiError::InvalidParam { .. } => Some("invalid_value"),
            ApiError::ResponseNotFound(_) => Some("previous_response_not_found"),
            _ => None,
        }
    }

    /// The JSON body of the error.
    pub fn body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.to_string(),
            "type": self.kind(),
            "param": self.param_name(),
            "code": self.code(),
        }})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_error_uses_vllms_words() {
        let e = ApiError::ContextLength { ctx: 8192, prompt: 9000, completion: 16 };
        assert_eq!(e.status(), 400);
        let body = e.body();
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("This model's maximum context length is 8192 tokens. However, you requested 9016 tokens (9000 in the messages, 16 in the completion)."), "{message}");
        assert_eq!(body["error"]["code"], "context_length_exceeded");
    }
}
