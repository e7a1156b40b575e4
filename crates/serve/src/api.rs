//! The OpenAI request bodies `xtc serve` reads and the errors it answers.
//!
//! Requests are read field by field from the JSON value, so every mistake
//! names its field (`param`) and is a 400, never a 500 (the official client
//! retries 5xx). Unknown fields are ignored (clients send many); a known
//! field with a value xtc does not support (`n > 1`, `logprobs`, `echo`,
//! `tools`, `response_format` other than text, ...) is a 400
//! `not_supported` naming the field, never silently ignored.
//!
//! # Fields read, and their defaults
//! | field | default | accepted |
//! | --- | --- | --- |
//! | `prompt` (completions) | required | a string (special tokens such as `<|im_start|>` parsed), a list of token ids, or a list of one of either |
//! | `messages` (chat) | required | `[{role, content}]`, `role` in `system`, `developer`, `user`, `assistant`; `content` a string or a list of `{type: "text", text}` parts; rendered as ChatML without the model template's default system message (`chat::chatml`; send a system message to get one) |
//! | `max_tokens` (chat also `max_completion_tokens`) | the server's `--default-max-tokens` (256) | integer >= 1; prompt + max_tokens must fit the context and the KV cache |
//! | `temperature` | 0 (greedy) | number >= 0 |
//! | `top_p` | 1 | number in (0, 1] |
//! | `top_k` | 0 (off; -1 also off) | integer >= -1 |
//! | `min_p` | 0 | number in [0, 1] |
//! | `seed` | random per request | integer |
//! | `stop` | none | a string or a list of up to 16 strings |
//! | `stream` | false | boolean |
//! | `stream_options.include_usage` | false | boolean (needs `stream`) |
//! | `ignore_eos` | false | boolean |
//! | `min_tokens` | 0 | integer in 0..=max_tokens; neither EOS nor a stop string ends the answer before it (as vLLM) |
//! | `user`, `model` | — | strings (`model`: the served name, or absent) |
//! | `stop_token_ids`, `include_stop_str_in_output` | — | only their off values (`[]`, `false`); others 400 `not_supported` |

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use xtc_model::text::sampling::SamplingParams;

/// An OpenAI-shaped error answer: `{"error": {"message", "type", "param",
/// "code"}}` with its status (and `Retry-After` for 429 and 503).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// What went wrong, for a person.
    pub message: String,
    /// `invalid_request_error`, `not_supported`, `server_error`, ...
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code (`context_length_exceeded`, ...).
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
    /// Answer with `Connection: close` (the request could not be read to
    /// its end, so the connection cannot carry another).
    pub close: bool,
}

impl ApiError {
    /// 400 `invalid_request_error` about `param`.
    pub fn invalid(param: Option<&str>, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: param.map(str::to_string),
            code: None,
            retry_after: None,
            close: false,
        }
    }

    /// 400 `not_supported`: `param` has a value xtc does not support.
    pub fn unsupported(param: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            kind: "not_supported",
            code: Some("not_supported"),
            ..ApiError::invalid(Some(param), message)
        }
    }

    /// 400 `context_length_exceeded`.
    pub fn context(message: impl Into<String>) -> ApiError {
        ApiError {
            code: Some("context_length_exceeded"),
            ..ApiError::invalid(Some("max_tokens"), message)
        }
    }

    /// `status` with `kind`, `message`, `Retry-After: retry_after`.
    pub fn status(
        status: StatusCode,
        kind: &'static str,
        message: impl Into<String>,
        retry_after: Option<u64>,
    ) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after,
            close: false,
        }
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            let h = r.headers_mut();
            h.insert("retry-after", HeaderValue::from(s));
            h.insert("x-should-retry", HeaderValue::from_static("true"));
        }
        if self.close {
            r.headers_mut()
                .insert("connection", HeaderValue::from_static("close"));
        }
        r
    }
}

/// Which endpoint a generation request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `POST /v1/completions`.
    Completion,
    /// `POST /v1/chat/completions`.
    Chat,
}

/// A chat message, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (`developer` reads as `system`).
    pub role: String,
    /// The text.
    pub content: String,
}

/// The prompt, as read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptIn {
    /// Text to tokenize (special tokens parsed).
    Text(String),
    /// Token ids as given (checked against the vocabulary later).
    Ids(Vec<u64>),
    /// Chat messages for the template.
    Messages(Vec<ChatMessage>),
}

/// A generation request as read and checked (ranges only; lengths are
/// checked against the model once tokenized).
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// The endpoint.
    pub kind: Kind,
    /// `model`, if given.
    pub model: Option<String>,
    /// The prompt.
    pub prompt: PromptIn,
    /// `max_tokens`, if given.
    pub max_tokens: Option<u64>,
    /// Sampling (the seed is `seed` or 0 until the server picks one).
    pub sampling: SamplingParams,
    /// `seed`, if given.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `stream`.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// `ignore_eos`.
    pub ignore_eos: bool,
    /// `min_tokens`.
    pub min_tokens: u64,
    /// `user`, if given.
    pub user: Option<String>,
}

fn type_error(field: &str, want: &str, v: &Value) -> ApiError {
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    ApiError::invalid(Some(field), format!("'{field}' must be {want}, not {got}"))
}

/// The field's value unless absent or null.
fn field<'a>(o: &'a Map<String, Value>, name: &str) -> Option<&'a Value> {
    o.get(name).filter(|v| !v.is_null())
}

fn opt_bool(o: &Map<String, Value>, name: &str) -> Result<Option<bool>, ApiError> {
    field(o, name)
        .map(|v| v.as_bool().ok_or_else(|| type_error(name, "a boolean", v)))
        .transpose()
}

fn opt_f32(o: &Map<String, Value>, name: &str) -> Result<Option<f32>, ApiError> {
    field(o, name)
        .map(|v| {
            v.as_f64()
                .map(|x| x as f32)
                .ok_or_else(|| type_error(name, "a number", v))
        })
        .transpose()
}

fn opt_int(o: &Map<String, Value>, name: &str) -> Result<Option<i128>, ApiError> {
    field(o, name)
        .map(|v| match v {
            Value::Number(n) => n
                .as_i64()
                .map(i128::from)
                .or_else(|| n.as_u64().map(i128::from))
                .or_else(|| {
                    // 1e12 and 5.0 are integers written as floats.
                    n.as_f64()
                        .filter(|f| f.fract() == 0.0 && f.abs() < 1e30)
                        .map(|f| f as i128)
                })
                .ok_or_else(|| type_error(name, "an integer", v)),
            _ => Err(type_error(name, "an integer", v)),
        })
        .transpose()
}

fn opt_str<'a>(o: &'a Map<String, Value>, name: &str) -> Result<Option<&'a str>, ApiError> {
    field(o, name)
        .map(|v| v.as_str().ok_or_else(|| type_error(name, "a string", v)))
        .transpose()
}

/// Refuses fields xtc knows but does not support, when set to anything but
/// their no-op value.
fn refuse_unsupported(o: &Map<String, Value>, kind: Kind) -> Result<(), ApiError> {
    if let Some(n) = opt_int(o, "n")?
        && n != 1
    {
        return Err(ApiError::unsupported(
            "n",
            format!("n = {n}: xtc serve returns one choice per request (n must be 1)"),
        ));
    }
    if let Some(b) = opt_int(o, "best_of")?
        && b != 1
    {
        return Err(ApiError::unsupported("best_of", "best_of must be 1"));
    }
    let off = |v: &Value| matches!(v, Value::Bool(false)) || v.as_f64() == Some(0.0);
    if let Some(v) = field(o, "logprobs")
        && !off(v)
    {
        return Err(ApiError::unsupported(
            "logprobs",
            "logprobs are not supported",
        ));
    }
    if let Some(v) = field(o, "top_logprobs")
        && !off(v)
    {
        return Err(ApiError::unsupported(
            "top_logprobs",
            "top_logprobs are not supported",
        ));
    }
    // vLLM's stop extensions: not implemented, so refused rather than
    // silently ignored (an answer that runs past its stop is a wrong result
    // nobody sees). Their off values pass.
    if let Some(v) = field(o, "stop_token_ids")
        && !matches!(v, Value::Array(a) if a.is_empty())
    {
        return Err(ApiError::unsupported(
            "stop_token_ids",
            "stop_token_ids are not supported (use 'stop' strings)",
        ));
    }
    if opt_bool(o, "include_stop_str_in_output")? == Some(true) {
        return Err(ApiError::unsupported(
            "include_stop_str_in_output",
            "include_stop_str_in_output is not supported (the stop string is never part of the text)",
        ));
    }
    if opt_bool(o, "echo")? == Some(true) {
        return Err(ApiError::unsupported("echo", "echo is not supported"));
    }
    if let Some(s) = opt_str(o, "suffix")?
        && !s.is_empty()
    {
        return Err(ApiError::unsupported("suffix", "suffix is not supported"));
    }
    for name in ["tools", "functions"] {
        if let Some(v) = field(o, name)
            && v.as_array().is_none_or(|a| !a.is_empty())
        {
            return Err(ApiError::unsupported(
                name,
                format!("{name}: tool calling is not supported"),
            ));
        }
    }
    for name in ["tool_choice", "function_call"] {
        if let Some(v) = field(o, name)
            && v.as_str() != Some("none")
        {
            return Err(ApiError::unsupported(
                name,
                format!("{name}: tool calling is not supported"),
            ));
        }
    }
    if let Some(v) = field(o, "response_format") {
        let text = v.get("type").and_then(Value::as_str) == Some("text");
        if !text {
            return Err(ApiError::unsupported(
                "response_format",
                "response_format: only {\"type\": \"text\"} is supported",
            ));
        }
    }
    if let Some(v) = field(o, "logit_bias")
        && v.as_object().is_none_or(|m| !m.is_empty())
    {
        return Err(ApiError::unsupported(
            "logit_bias",
            "logit_bias is not supported",
        ));
    }
    for name in ["presence_penalty", "frequency_penalty"] {
        if let Some(p) = opt_f32(o, name)?
            && p != 0.0
        {
            return Err(ApiError::unsupported(
                name,
                format!("{name} is not supported (must be 0)"),
            ));
        }
    }
    if let Some(p) = opt_f32(o, "repetition_penalty")?
        && p != 1.0
    {
        return Err(ApiError::unsupported(
            "repetition_penalty",
            "repetition_penalty is not supported (must be 1)",
        ));
    }
    let _ = kind;
    Ok(())
}

fn ids(field: &str, a: &[Value]) -> Result<Vec<u64>, ApiError> {
    a.iter()
        .map(|v| {
            v.as_u64().ok_or_else(|| {
                ApiError::invalid(
                    Some(field),
                    format!("'{field}' token ids must be integers >= 0, got {v}"),
                )
            })
        })
        .collect()
}

fn read_prompt(o: &Map<String, Value>) -> Result<PromptIn, ApiError> {
    let Some(v) = field(o, "prompt") else {
        return Err(ApiError::invalid(Some("prompt"), "'prompt' is required"));
    };
    let p = match v {
        Value::String(s) => PromptIn::Text(s.clone()),
        Value::Array(a) if a.iter().all(Value::is_number) => PromptIn::Ids(ids("prompt", a)?),
        Value::Array(a) if a.len() == 1 => match &a[0] {
            Value::String(s) => PromptIn::Text(s.clone()),
            Value::Array(inner) => PromptIn::Ids(ids("prompt", inner)?),
            other => {
                return Err(type_error(
                    "prompt",
                    "a string or a list of token ids",
                    other,
                ));
            }
        },
        Value::Array(_) => {
            return Err(ApiError::unsupported(
                "prompt",
                "a batch of several prompts is not supported: send one prompt per request",
            ));
        }
        other => {
            return Err(type_error(
                "prompt",
                "a string or a list of token ids",
                other,
            ));
        }
    };
    let empty = match &p {
        PromptIn::Text(s) => s.is_empty(),
        PromptIn::Ids(i) => i.is_empty(),
        PromptIn::Messages(m) => m.is_empty(),
    };
    if empty {
        return Err(ApiError::invalid(Some("prompt"), "'prompt' is empty"));
    }
    Ok(p)
}

fn read_content(i: usize, v: &Value) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut s = String::new();
            for p in parts {
                match (
                    p.get("type").and_then(Value::as_str),
                    p.get("text").and_then(Value::as_str),
                ) {
                    (Some("text"), Some(t)) => s.push_str(t),
                    _ => {
                        return Err(ApiError::unsupported(
                            &param,
                            format!(
                                "{param}: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported"
                            ),
                        ));
                    }
                }
            }
            Ok(s)
        }
        other => Err(type_error(
            &param,
            "a string or a list of text parts",
            other,
        )),
    }
}

/// Reads chat `messages` (also for `POST /tokenize`).
///
/// # Errors
/// 400 naming the message at fault.
pub fn read_messages(v: Option<&Value>) -> Result<Vec<ChatMessage>, ApiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Err(ApiError::invalid(
            Some("messages"),
            "'messages' is required",
        ));
    };
    let Some(a) = v.as_array() else {
        return Err(type_error("messages", "a list of messages", v));
    };
    if a.is_empty() {
        return Err(ApiError::invalid(Some("messages"), "'messages' is empty"));
    }
    a.iter()
        .enumerate()
        .map(|(i, m)| {
            let Some(o) = m.as_object() else {
                return Err(type_error(&format!("messages[{i}]"), "an object", m));
            };
            let role = match o.get("role").and_then(Value::as_str) {
                Some("developer") => "system",
                Some(r @ ("system" | "user" | "assistant")) => r,
                Some(r) => {
                    return Err(ApiError::unsupported(
                        &format!("messages[{i}].role"),
                        format!("role '{r}' is not supported (system, developer, user, assistant)"),
                    ));
                }
                None => {
                    return Err(ApiError::invalid(
                        Some(&format!("messages[{i}].role")),
                        "each message needs a string 'role'",
                    ));
                }
            };
            Ok(ChatMessage {
                role: role.to_string(),
                content: read_content(i, o.get("content").unwrap_or(&Value::Null))?,
            })
        })
        .collect()
}

fn read_stop(o: &Map<String, Value>) -> Result<Vec<String>, ApiError> {
    match field(o, "stop") {
        None => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) if a.len() <= 16 => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| type_error("stop", "a string or a list of strings", v))
            })
            .collect(),
        Some(Value::Array(_)) => Err(ApiError::invalid(
            Some("stop"),
            "'stop' takes at most 16 strings",
        )),
        Some(v) => Err(type_error("stop", "a string or a list of strings", v)),
    }
}

/// Reads a generation request body (already parsed as JSON).
///
/// # Errors
/// 400 naming the field: wrong types, out-of-range values, unsupported
/// features.
pub fn parse(kind: Kind, v: &Value) -> Result<Parsed, ApiError> {
    let Some(o) = v.as_object() else {
        return Err(ApiError::invalid(
            None,
            "the request body must be a JSON object",
        ));
    };
    refuse_unsupported(o, kind)?;
    let prompt = match kind {
        Kind::Completion => read_prompt(o)?,
        Kind::Chat => PromptIn::Messages(read_messages(o.get("messages"))?),
    };
    let mut max_tokens = opt_int(o, "max_tokens")?;
    if kind == Kind::Chat
        && let Some(m) = opt_int(o, "max_completion_tokens")?
    {
        max_tokens = Some(m);
    }
    let max_tokens = match max_tokens {
        Some(m) if m < 1 => {
            return Err(ApiError::invalid(
                Some("max_tokens"),
                format!("'max_tokens' must be at least 1, got {m}"),
            ));
        }
        Some(m) => Some(u64::try_from(m).unwrap_or(u64::MAX)),
        None => None,
    };
    let mut sampling = SamplingParams::greedy();
    if let Some(t) = opt_f32(o, "temperature")? {
        sampling.temperature = t;
    }
    if let Some(p) = opt_f32(o, "top_p")? {
        sampling.top_p = p;
    }
    if let Some(p) = opt_f32(o, "min_p")? {
        sampling.min_p = p;
    }
    if let Some(k) = opt_int(o, "top_k")? {
        sampling.top_k = match k {
            -1 | 0 => 0,
            k if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
            k => {
                return Err(ApiError::invalid(
                    Some("top_k"),
                    format!("'top_k' must be -1, 0 (off) or positive, got {k}"),
                ));
            }
        };
    }
    if let Err(e) = sampling.validate() {
        return Err(ApiError::invalid(Some(e.name), e.to_string()));
    }
    let seed = opt_int(o, "seed")?.map(|s| s as u64); // negative seeds wrap, as i64 bits
    let stream = opt_bool(o, "stream")?.unwrap_or(false);
    let include_usage = match field(o, "stream_options") {
        None => false,
        Some(_) if !stream => {
            return Err(ApiError::invalid(
                Some("stream_options"),
                "'stream_options' is only allowed with 'stream': true",
            ));
        }
        Some(Value::Object(so)) => opt_bool(so, "include_usage")
            .map_err(|_| {
                ApiError::invalid(
                    Some("stream_options.include_usage"),
                    "'stream_options.include_usage' must be a boolean",
                )
            })?
            .unwrap_or(false),
        Some(v) => return Err(type_error("stream_options", "an object", v)),
    };
    let min_tokens = match opt_int(o, "min_tokens")? {
        None => 0,
        Some(m) if m < 0 => {
            return Err(ApiError::invalid(
                Some("min_tokens"),
                "'min_tokens' must be >= 0",
            ));
        }
        Some(m) => u64::try_from(m).unwrap_or(u64::MAX),
    };
    if let Some(m) = max_tokens
        && min_tokens > m
    {
        return Err(ApiError::invalid(
            Some("min_tokens"),
            format!("'min_tokens' ({min_tokens}) must not exceed 'max_tokens' ({m})"),
        ));
    }
    Ok(Parsed {
        kind,
        model: opt_str(o, "model")?.map(str::to_string),
        prompt,
        max_tokens,
        sampling,
        seed,
        stop: read_stop(o)?,
        stream,
        include_usage,
        ignore_eos: opt_bool(o, "ignore_eos")?.unwrap_or(false),
        min_tokens,
        user: opt_str(o, "user")?.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(kind: Kind, body: Value) -> ApiError {
        parse(kind, &body).unwrap_err()
    }

    #[test]
    fn fields_are_read_with_their_defaults() {
        let p = parse(Kind::Completion, &json!({"prompt": "hi", "foo": 1})).unwrap();
        assert_eq!(p.prompt, PromptIn::Text("hi".into()));
        assert_eq!(p.max_tokens, None);
        assert_eq!(p.sampling, SamplingParams::greedy());
        assert!(!p.stream && !p.include_usage && !p.ignore_eos);
        let p = parse(
            Kind::Completion,
            &json!({"prompt": [[1, 2, 3]], "max_tokens": 5, "temperature": 0.5, "top_k": -1,
                    "stop": "x", "stream": true, "stream_options": {"include_usage": true},
                    "n": 1, "logprobs": null, "seed": -1}),
        )
        .unwrap();
        assert_eq!(p.prompt, PromptIn::Ids(vec![1, 2, 3]));
        assert_eq!(p.max_tokens, Some(5));
        assert_eq!(p.stop, vec!["x".to_string()]);
        assert!(p.include_usage);
        assert_eq!(p.seed, Some(u64::MAX));
    }

    #[test]
    fn mistakes_name_their_field() {
        let e = err(Kind::Completion, json!({"prompt": "a", "max_tokens": "5"}));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        let e = err(Kind::Completion, json!({"prompt": "a", "n": 2}));
        assert_eq!((e.param.as_deref(), e.kind), (Some("n"), "not_supported"));
        let e = err(Kind::Completion, json!({"prompt": "a", "logprobs": 1}));
        assert_eq!(e.param.as_deref(), Some("logprobs"));
        let e = err(
            Kind::Chat,
            json!({"messages": [{"role": "user", "content": "a"}], "tools": [{}]}),
        );
        assert_eq!(e.param.as_deref(), Some("tools"));
        let e = err(Kind::Chat, json!({"messages": [], "max_tokens": 3}));
        assert_eq!(e.param.as_deref(), Some("messages"));
        let e = err(Kind::Completion, json!({"prompt": [1, -2]}));
        assert_eq!(e.param.as_deref(), Some("prompt"));
        let e = err(Kind::Completion, json!({"prompt": "a", "temperature": -1}));
        assert_eq!(e.param.as_deref(), Some("temperature"));
        let e = err(
            Kind::Completion,
            json!({"prompt": "a", "stream_options": {}}),
        );
        assert_eq!(e.param.as_deref(), Some("stream_options"));
        let e = err(Kind::Completion, json!({"prompt": "a", "max_tokens": 0}));
        assert_eq!(e.param.as_deref(), Some("max_tokens"));
        let e = err(
            Kind::Completion,
            json!({"prompt": "a", "response_format": {"type": "json_object"}}),
        );
        assert_eq!(e.param.as_deref(), Some("response_format"));
        let e = err(Kind::Completion, json!([1]));
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn huge_max_tokens_reads_without_overflow() {
        let p = parse(
            Kind::Completion,
            &json!({"prompt": "a", "max_tokens": 1e12}),
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(1_000_000_000_000));
        let p = parse(
            Kind::Completion,
            &json!({"prompt": "a", "max_tokens": u64::MAX}),
        )
        .unwrap();
        assert_eq!(p.max_tokens, Some(u64::MAX));
    }
}
