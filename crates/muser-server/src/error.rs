//! OpenAI-shaped errors: `{"error": {"message", "type", "code", "param"}}` with the HTTP status
//! that goes with them. Every refusal of the server is one of these, never a panic or a hang.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// OpenAI's error type: "invalid_request_error", "authentication_error", ...
    pub kind: &'static str,
    /// A machine-readable code: "context_length_exceeded", "model_not_found", ...
    pub code: Option<&'static str>,
    /// The request field at fault.
    pub param: Option<String>,
    /// More fields of the error object (n_prompt_tokens and n_ctx for a context overflow),
    /// boxed: an order-keeping map would make every `Result<_, ApiError>` large.
    pub extra: Box<Map<String, Value>>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            code: None,
            param: None,
            extra: Box::default(),
        }
    }

    /// 400, invalid_request_error.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 about one field of the request.
    pub fn param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::bad_request(message).with_param(param)
    }

    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    pub fn with_param(mut self, param: &str) -> ApiError {
        self.param = Some(param.to_string());
        self
    }

    pub fn with(mut self, key: &str, value: impl Into<Value>) -> ApiError {
        self.extra.insert(key.to_string(), value.into());
        self
    }

    /// 503 with a reason: the model is loading, or every slot and queue place is taken.
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            message,
        )
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The `{"error": ...}` object (also sent as the last event of a failed stream).
    pub fn body(&self) -> Value {
        let mut e = Map::new();
        e.insert("message".into(), self.message.clone().into());
        e.insert("type".into(), self.kind.into());
        e.insert("code".into(), self.code.map_or(Value::Null, Value::from));
        e.insert(
            "param".into(),
            self.param.clone().map_or(Value::Null, Value::from),
        );
        e.extend(self.extra.as_ref().clone());
        json!({ "error": e })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.status)
    }
}
