//! The HTTP side: axum 0.8 routes on a small tokio runtime, each connection
//! served by hyper's HTTP/1 connection (a header read timeout for clients
//! that send nothing, a body read timeout for those that stop halfway, a cap
//! on open connections). JSON parsing and tokenization run on tokio's
//! blocking pool, so a large prompt never holds an HTTP worker. Handlers reach the engine
//! only through [`EngineHandle`] (`submit_mt` / `cancel_mt`).
//!
//! # Routes
//! - `POST /v1/completions`, `POST /v1/chat/completions`: OpenAI's shapes,
//!   JSON or SSE (`stream: true`); see [`super::api`] for the fields.
//! - `GET /v1/models`: the one served model; `GET /v1/models/{id}` it alone
//!   (by the served name or an alias), else 404 `model_not_found`.
//! - `GET /health`: 503 while loading or draining, then 200 `{"status":"ok"}`.
//! - `GET /metrics`: OpenMetrics text (`xtc:` names).
//! - `POST /tokenize` (`{prompt}` or `{messages}`, `add_special_tokens`,
//!   `return_token_strs`) → `{count, max_model_len, tokens, token_strs}`;
//!   `POST /detokenize` (`{tokens}`) → `{prompt}`: vLLM's shapes.
//!
//! # Status codes
//! 400 for bad input (malformed JSON, wrong types, a body that is not UTF-8,
//! unsupported values, token ids outside the vocabulary) and
//! `context_length_exceeded` (prompt + `max_tokens` past the context or the
//! KV cache: refused before any work); 404 unknown route or model; 408 a
//! body not complete within `--body-timeout`; 413 a body over `--max-body`
//! (both close the connection); 429 with `Retry-After` when the admission ring is
//! full (seconds for the requests ahead to drain through the active slots at
//! the recent mean request time, 1 to 60); 503 with `Retry-After` while
//! loading or draining; 500 only for an engine failure.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::api::{self, ApiError, Kind, Parsed, PromptIn};
use crate::engine::{Delta, EngineHandle, GenRequest, Outcome, Refused, Ticket};
use crate::metrics::ServeMetrics;
use xtc_model::text::bpe::Bpe;
use xtc_model::text::chat::{self, Message};

/// Server state: loading the model.
pub const LOADING: u8 = 0;
/// Server state: serving.
pub const READY: u8 = 1;
/// Server state: draining after SIGTERM/SIGINT (new requests get 503).
pub const DRAINING: u8 = 2;

/// HTTP settings (the `xtc serve` options of the same names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpOpts {
    /// `max_tokens` of a request that gives none.
    pub default_max_tokens: usize,
    /// Largest request body, bytes (413 beyond).
    pub max_body: usize,
    /// Time a connection has to send a request's headers.
    pub header_timeout: Duration,
    /// Time a request has to send its whole body once its headers are in
    /// (408 and the connection closed beyond: a body that never ends must
    /// not hold a connection slot forever).
    pub body_timeout: Duration,
    /// SSE comment interval while a stream has nothing to send.
    pub keepalive: Duration,
    /// Open connections at most (more wait in the listen backlog).
    pub max_connections: usize,
}

/// What every handler shares.
#[derive(Debug)]
pub struct App {
    /// [`LOADING`], [`READY`] or [`DRAINING`].
    pub state: AtomicU8,
    /// The engine, once loaded.
    pub engine: OnceLock<Arc<EngineHandle>>,
    /// The model's tokenizer.
    pub tok: Arc<Bpe>,
    /// The model name `/v1/models` lists and requests may name.
    pub model_name: String,
    /// Other names a request's `model` may use (the GGUF file's name).
    pub aliases: Vec<String>,
    /// Front-end metrics.
    pub metrics: Arc<ServeMetrics>,
    /// HTTP settings.
    pub opts: HttpOpts,
    /// Responses whose body is still being sent.
    pub active: AtomicUsize,
    created: u64,
    ids: AtomicU64,
    /// A random prefix of this process's response ids, so ids do not repeat
    /// across restarts or replicas (`cmpl-<prefix>-<n>`).
    id_prefix: String,
}

impl App {
    /// Shared state for a server of `model_name` (state [`LOADING`]).
    pub fn new(
        tok: Arc<Bpe>,
        model_name: String,
        aliases: Vec<String>,
        metrics: Arc<ServeMetrics>,
        opts: HttpOpts,
    ) -> App {
        App {
            state: AtomicU8::new(LOADING),
            engine: OnceLock::new(),
            tok,
            model_name,
            aliases,
            metrics,
            opts,
            active: AtomicUsize::new(0),
            created: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            ids: AtomicU64::new(1),
            id_prefix: format!("{:012x}", fastrand::u64(..) >> 16),
        }
    }

    /// Whether `model` names the served model (its name or an alias).
    fn serves(&self, model: &str) -> bool {
        model == self.model_name || self.aliases.iter().any(|a| a == model)
    }

    fn engine(&self) -> Result<&Arc<EngineHandle>, ApiError> {
        match (self.state.load(Ordering::SeqCst), self.engine.get()) {
            (READY, Some(e)) => Ok(e),
            (DRAINING, _) => Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "the server is shutting down",
                Some(5),
            )),
            _ => Err(ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                "the model is loading",
                Some(1),
            )),
        }
    }
}

/// The routes (see the module doc).
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(app)
}

async fn not_found() -> ApiError {
    ApiError::status(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route (POST /v1/completions, POST /v1/chat/completions, GET /v1/models[/{id}], \
         GET /health, GET /metrics, POST /tokenize, POST /detokenize)",
        None,
    )
}

async fn method_not_allowed() -> ApiError {
    ApiError::status(
        StatusCode::METHOD_NOT_ALLOWED,
        "invalid_request_error",
        "this route does not take that method (generation and tokenization are POST, \
         /v1/models, /health and /metrics are GET)",
        None,
    )
}

/// A request's whole body, read within `--body-timeout` of its headers.
///
/// - A `Content-Length` over `--max-body`: 413 without keeping the body.
///   What arrives of it within the timeout, up to 8 times the limit, is read
///   and dropped first, so the client (which may write all of it before
///   reading) gets the answer and not a reset; a longer one is not waited
///   for. The connection then closes (hyper would otherwise drain the rest,
///   however long, to reuse it).
/// - A body without a length that grows past the limit: 413, connection
///   closed.
/// - Not complete within the timeout: 408, connection closed (a body that
///   never ends must not hold a connection slot forever).
/// - The connection fails: 400.
async fn read_body(app: &App, headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let limit = app.opts.max_body;
    let too_large = || ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        close: true,
        ..ApiError::invalid(
            None,
            format!("the request body is larger than the server accepts ({limit} bytes)"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(n) = declared
        && n > limit as u64
    {
        let cap = limit.saturating_mul(8);
        if n <= cap as u64 {
            let _ =
                tokio::time::timeout(app.opts.body_timeout, axum::body::to_bytes(body, cap)).await;
        }
        return Err(too_large());
    }
    match tokio::time::timeout(app.opts.body_timeout, axum::body::to_bytes(body, limit)).await {
        Ok(Ok(b)) => Ok(b),
        Ok(Err(e)) => {
            // `to_bytes` reports its limit as a length-limit error somewhere
            // in the source chain.
            let mut src: Option<&(dyn std::error::Error + 'static)> = Some(&e);
            while let Some(c) = src {
                if c.is::<http_body_util::LengthLimitError>() {
                    return Err(too_large());
                }
                src = c.source();
            }
            Err(ApiError::invalid(
                None,
                format!("cannot read the request body: {e}"),
            ))
        }
        Err(_) => Err(ApiError {
            status: StatusCode::REQUEST_TIMEOUT,
            close: true,
            ..ApiError::invalid(
                None,
                format!(
                    "the request body did not arrive within {} s of its headers \
                     (--body-timeout)",
                    app.opts.body_timeout.as_secs_f64()
                ),
            )
        }),
    }
}

/// The JSON value of a body, or the 400 that says why not.
fn json_body(bytes: &[u8]) -> Result<Value, ApiError> {
    if std::str::from_utf8(bytes).is_err() {
        return Err(ApiError::invalid(None, "the request body is not UTF-8"));
    }
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid(None, format!("the request body is not valid JSON: {e}")))
}

/// Runs `f` (JSON parsing, tokenization: up to half a second for a 1 MB
/// prompt) on tokio's blocking pool, so the HTTP workers keep reading other
/// connections and draining streams meanwhile.
async fn off_workers<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| {
        Err(ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("the request's parsing failed: {e}"),
            None,
        ))
    })
}

async fn health(State(app): State<Arc<App>>) -> Response {
    match app.engine() {
        Ok(_) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The one model object `/v1/models` lists.
fn model_object(app: &App) -> Value {
    json!({
        "id": app.model_name,
        "object": "model",
        "created": app.created,
        "owned_by": "xtc",
        "max_model_len": app.engine.get().map(|e| e.opts().context),
    })
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&app)]})).into_response()
}

/// `GET /v1/models/{id}` (the official client's `models.retrieve`): the
/// model object for the served name or an alias, else 404
/// `model_not_found`.
async fn model(State(app): State<Arc<App>>, Path(id): Path<String>) -> Response {
    if app.serves(&id) {
        return axum::Json(model_object(&app)).into_response();
    }
    model_not_found(&app, &id).into_response()
}

/// 404 `model_not_found` for a `model` this server does not serve.
fn model_not_found(app: &App, m: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        code: Some("model_not_found"),
        ..ApiError::invalid(
            Some("model"),
            format!(
                "the model '{m}' does not exist; this server serves '{}'",
                app.model_name
            ),
        )
    }
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    let reg = app.engine.get().map(|e| e.registry.clone());
    let text = app.metrics.exposition(reg.as_deref());
    (
        [(header::CONTENT_TYPE, xtc_kvbatch::metrics::CONTENT_TYPE)],
        text,
    )
        .into_response()
}

fn check_ids(tok: &Bpe, ids: &[u64], param: &str) -> Result<Vec<u32>, ApiError> {
    let vocab = tok.vocab_size() as u64;
    ids.iter()
        .map(|&i| {
            if i < vocab {
                Ok(i as u32)
            } else {
                Err(ApiError::invalid(
                    Some(param),
                    format!("token id {i} is outside the vocabulary (0..{vocab})"),
                ))
            }
        })
        .collect()
}

fn chat_ids(tok: &Bpe, msgs: &[api::ChatMessage], gen_prompt: bool) -> Result<Vec<u32>, ApiError> {
    let m: Vec<Message<'_>> = msgs
        .iter()
        .map(|m| Message {
            role: &m.role,
            content: &m.content,
        })
        .collect();
    chat::chatml(tok, &m, gen_prompt).map_err(|e| {
        ApiError::status(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            format!("the model has no chat template: {e}"),
            None,
        )
    })
}

async fn tokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let r = off_workers(move || -> Result<Value, ApiError> {
        let v = json_body(&body)?;
        let Some(o) = v.as_object() else {
            return Err(ApiError::invalid(
                None,
                "the request body must be a JSON object",
            ));
        };
        let ids = if o.get("messages").is_some_and(|m| !m.is_null()) {
            let msgs = api::read_messages(o.get("messages"))?;
            let gen_prompt = o
                .get("add_generation_prompt")
                .and_then(Value::as_bool)
                .unwrap_or(true);
            chat_ids(&app.tok, &msgs, gen_prompt)?
        } else {
            match o.get("prompt") {
                Some(Value::String(s)) => app.tok.encode_with_specials(s),
                Some(other) => {
                    return Err(ApiError::invalid(
                        Some("prompt"),
                        format!("'prompt' must be a string, not {other}"),
                    ));
                }
                None => {
                    return Err(ApiError::invalid(
                        Some("prompt"),
                        "'prompt' or 'messages' is required",
                    ));
                }
            }
        };
        let strs = o
            .get("return_token_strs")
            .and_then(Value::as_bool)
            .unwrap_or(false)
            .then(|| {
                ids.iter()
                    .map(|&i| String::from_utf8_lossy(app.tok.token_bytes(i)).into_owned())
                    .collect::<Vec<_>>()
            });
        Ok(json!({
            "count": ids.len(),
            "max_model_len": app.engine.get().map(|e| e.opts().context),
            "tokens": ids,
            "token_strs": strs,
        }))
    })
    .await;
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn detokenize(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    let body = match read_body(&app, &headers, body).await {
        Ok(b) => b,
        Err(e) => return e.into_response(),
    };
    let r = off_workers(move || -> Result<Value, ApiError> {
        let v = json_body(&body)?;
        let ids = match v.get("tokens") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|x| {
                    x.as_u64().ok_or_else(|| {
                        ApiError::invalid(Some("tokens"), "'tokens' must be integers >= 0")
                    })
                })
                .collect::<Result<Vec<u64>, _>>()?,
            _ => {
                return Err(ApiError::invalid(
                    Some("tokens"),
                    "'tokens' (a list of token ids) is required",
                ));
            }
        };
        let ids = check_ids(&app.tok, &ids, "tokens")?;
        Ok(json!({"prompt": app.tok.decode(&ids)}))
    })
    .await;
    match r {
        Ok(v) => axum::Json(v).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, headers, body, Kind::Completion)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn chat_completions(State(app): State<Arc<App>>, headers: HeaderMap, body: Body) -> Response {
    generate(app, headers, body, Kind::Chat)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// How a response's chunks are named.
#[derive(Debug, Clone)]
struct Names {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
}

impl Names {
    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn chunk(&self, choice: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    fn text_choice(&self, text: &str, finish: Option<&str>) -> Value {
        match self.kind {
            Kind::Completion => json!({
                "index": 0, "text": text, "logprobs": null, "finish_reason": finish,
            }),
            Kind::Chat => {
                let delta = if finish.is_some() && text.is_empty() {
                    json!({})
                } else {
                    json!({"content": text})
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
            }
        }
    }
}

fn usage(o: &Outcome) -> Value {
    json!({
        "prompt_tokens": o.prompt_tokens,
        "completion_tokens": o.completion_tokens,
        "total_tokens": o.prompt_tokens + o.completion_tokens,
    })
}

fn refused(app: &App, engine: &EngineHandle, r: Refused) -> ApiError {
    match r {
        Refused::Context { .. } | Refused::KvCache { .. } => {
            app.metrics.refuse("context_length_exceeded");
            ApiError::context(r.to_string())
        }
        Refused::Busy { .. } => {
            app.metrics.refuse("busy");
            let retry = engine.gauges.retry_after_s(engine.opts().max_active);
            ApiError::status(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                r.to_string(),
                Some(retry),
            )
        }
        Refused::Closed => {
            app.metrics.refuse("closed");
            ApiError::status(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable_error",
                r.to_string(),
                Some(5),
            )
        }
    }
}

/// The error event of a stream the engine cancelled because its client
/// stopped reading (the client sees it only if it reads on).
fn stalled_error(app: &App) -> ApiError {
    ApiError {
        code: Some("stream_stalled"),
        ..ApiError::status(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request was cancelled: the client stopped reading the stream and every \
                 buffer to it filled (--stream-buffer {} pieces, then the connection's)",
                app.engine.get().map_or(0, |e| e.opts().stream_buffer)
            ),
            None,
        )
    }
}

fn engine_failed(e: xtc::Error) -> ApiError {
    if e == xtc::Error::Aborted {
        // A client that went away never sees its own cancel: this is the
        // server's (close with CANCEL on a second SIGTERM/SIGINT).
        return ApiError::status(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the request was cancelled: the server is shutting down",
            Some(5),
        );
    }
    ApiError::status(
        StatusCode::INTERNAL_SERVER_ERROR,
        "server_error",
        format!("the engine failed this request: {e}"),
        None,
    )
}

async fn generate(
    app: Arc<App>,
    headers: HeaderMap,
    body: Body,
    kind: Kind,
) -> Result<Response, ApiError> {
    let engine = app.engine()?.clone();
    let body = read_body(&app, &headers, body).await?;
    let a = app.clone();
    let (p, prompt) = off_workers(move || {
        let v = json_body(&body)?;
        let p = api::parse(kind, &v)?;
        if let Some(m) = &p.model
            && !a.serves(m)
        {
            return Err(model_not_found(&a, m));
        }
        let prompt = match &p.prompt {
            PromptIn::Text(s) => a.tok.encode_with_specials(s),
            PromptIn::Ids(ids) => check_ids(&a.tok, ids, "prompt")?,
            PromptIn::Messages(m) => chat_ids(&a.tok, m, true)?,
        };
        if prompt.is_empty() {
            return Err(ApiError::invalid(
                Some("prompt"),
                "the prompt has no tokens",
            ));
        }
        Ok((p, prompt))
    })
    .await?;
    let max_tokens = match p.max_tokens {
        None => app.opts.default_max_tokens,
        Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
    };
    let mut sampling = p.sampling;
    sampling.seed = p.seed.unwrap_or_else(|| fastrand::u64(..));
    let req = GenRequest {
        prompt,
        max_tokens,
        sampling,
        stop: p.stop.clone(),
        ignore_eos: p.ignore_eos,
        min_tokens: usize::try_from(p.min_tokens).unwrap_or(usize::MAX),
        whole: !p.stream,
    };
    let defaulted = p.max_tokens.is_none();
    let ticket = engine.submit(req).map_err(|r| {
        let mut e = refused(&app, &engine, r);
        if defaulted && e.code == Some("context_length_exceeded") {
            // The client sent no max_tokens: say whose it was.
            e.message.push_str(&format!(
                " (max_tokens was not given: the server's default, --default-max-tokens {}, \
                 applied; send a smaller max_tokens)",
                app.opts.default_max_tokens
            ));
        }
        e
    })?;
    let names = Names {
        id: format!(
            "{}-{}-{}",
            match kind {
                Kind::Completion => "cmpl",
                Kind::Chat => "chatcmpl",
            },
            app.id_prefix,
            app.ids.fetch_add(1, Ordering::Relaxed)
        ),
        created: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        model: app.model_name.clone(),
        kind,
    };
    if p.stream {
        Ok(stream_response(app, ticket, names, &p))
    } else {
        whole_response(ticket, names).await
    }
}

/// Non-streaming: the whole answer once the outcome is in. Dropping this
/// future (the client went away) drops the ticket: its guard cancels.
async fn whole_response(mut t: Ticket, names: Names) -> Result<Response, ApiError> {
    let mut text = String::new();
    while let Some(d) = t.deltas.recv().await {
        text.push_str(&d.text);
    }
    let outcome = (&mut t.outcome).await;
    t.guard.disarm();
    // A non-streaming request's deltas are read by this future alone and
    // its channel holds all of them (`GenRequest::whole`), so a stall cancel
    // cannot reach it; kept apart from a shutdown's cancel all the same.
    let o = outcome.map_err(|e| {
        if t.stalled.load(Ordering::SeqCst) {
            ApiError::status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "the request was cancelled: its answer's buffer filled",
                None,
            )
        } else {
            engine_failed(e)
        }
    })?;
    let choice = match names.kind {
        Kind::Completion => json!({
            "index": 0, "text": text, "logprobs": null,
            "finish_reason": o.finish_reason.as_str(), "stop_reason": o.stop,
        }),
        Kind::Chat => json!({
            "index": 0, "message": {"role": "assistant", "content": text}, "logprobs": null,
            "finish_reason": o.finish_reason.as_str(), "stop_reason": o.stop,
        }),
    };
    let body = json!({
        "id": names.id,
        "object": names.object(false),
        "created": names.created,
        "model": names.model,
        "choices": [choice],
        "usage": usage(&o),
        "xtc_timings": o.timings,
    });
    let mut r = axum::Json(body).into_response();
    let h = r.headers_mut();
    let tm = &o.timings;
    for (name, v) in [
        ("x-queue-time-ms", tm.queue_ms),
        ("x-ttft-ms", tm.ttft_ms),
        ("x-decode-time-ms", tm.decode_ms),
        ("x-e2e-time-ms", tm.e2e_ms),
    ] {
        if let Ok(v) = HeaderValue::from_str(&format!("{v:.3}")) {
            h.insert(name, v);
        }
    }
    h.insert(
        "x-completion-tokens",
        HeaderValue::from(o.completion_tokens),
    );
    Ok(r)
}

enum Phase {
    Deltas,
    Outcome,
    Done,
}

/// The SSE body of one streamed request: deltas as chunks, then the final
/// chunk (finish reason, timings), the usage chunk if asked, `[DONE]`; an
/// engine failure ends with an error event instead. Dropped early (client
/// gone) it drops the ticket, whose guard cancels the request.
struct SseBody {
    app: Arc<App>,
    t: Ticket,
    names: Names,
    include_usage: bool,
    phase: Phase,
    out: std::collections::VecDeque<Bytes>,
    keepalive: tokio::time::Interval,
}

fn event(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseBody {
    fn delta(&mut self, d: Delta) {
        if d.text.is_empty() {
            return; // tokens that completed no text (a split character)
        }
        let usage = self.include_usage.then_some(Value::Null);
        let c = self
            .names
            .chunk(self.names.text_choice(&d.text, None), usage);
        self.out.push_back(event(&c));
    }

    fn finish(&mut self, r: xtc::Result<Outcome>) {
        self.t.guard.disarm();
        match r {
            Ok(o) => {
                let usage = self.include_usage.then_some(Value::Null);
                let mut c = self.names.chunk(
                    self.names.text_choice("", Some(o.finish_reason.as_str())),
                    usage,
                );
                c["choices"][0]["stop_reason"] = json!(o.stop);
                c["xtc_timings"] = json!(o.timings);
                self.out.push_back(event(&c));
                if self.include_usage {
                    let mut u = self.names.chunk(Value::Null, Some(usage_of(&o)));
                    u["choices"] = json!([]);
                    self.out.push_back(event(&u));
                }
                self.out.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
            }
            Err(e) => {
                let err = if e == xtc::Error::Aborted && self.t.stalled.load(Ordering::SeqCst) {
                    stalled_error(&self.app)
                } else {
                    engine_failed(e)
                };
                self.out.push_back(event(&err.body()));
            }
        }
    }
}

fn usage_of(o: &Outcome) -> Value {
    usage(o)
}

impl futures_lite::Stream for SseBody {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(b) = this.out.pop_front() {
                this.keepalive.reset();
                return Poll::Ready(Some(Ok(b)));
            }
            let pending = match this.phase {
                Phase::Done => return Poll::Ready(None),
                Phase::Deltas => match this.t.deltas.poll_recv(cx) {
                    Poll::Ready(Some(d)) => {
                        this.delta(d);
                        continue;
                    }
                    Poll::Ready(None) => {
                        this.phase = Phase::Outcome;
                        continue;
                    }
                    Poll::Pending => true,
                },
                Phase::Outcome => match Pin::new(&mut this.t.outcome).poll(cx) {
                    Poll::Ready(r) => {
                        this.finish(r);
                        this.phase = Phase::Done;
                        continue;
                    }
                    Poll::Pending => true,
                },
            };
            if pending && this.keepalive.poll_tick(cx).is_ready() {
                return Poll::Ready(Some(Ok(Bytes::from_static(b": keep-alive\n\n"))));
            }
            return Poll::Pending;
        }
    }
}

impl Drop for SseBody {
    fn drop(&mut self) {
        self.app.active.fetch_sub(1, Ordering::SeqCst);
    }
}

use std::future::Future as _;

fn stream_response(app: Arc<App>, t: Ticket, names: Names, p: &Parsed) -> Response {
    let mut out = std::collections::VecDeque::new();
    if names.kind == Kind::Chat {
        // The first chunk names the role (and sends the head at once).
        let c = names.chunk(
            json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                   "logprobs": null, "finish_reason": null}),
            p.include_usage.then_some(Value::Null),
        );
        out.push_back(event(&c));
    }
    let period = app.opts.keepalive.max(Duration::from_millis(10));
    let mut keepalive = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    keepalive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    app.active.fetch_add(1, Ordering::SeqCst);
    let body = SseBody {
        app,
        t,
        names,
        include_usage: p.include_usage,
        phase: Phase::Deltas,
        out,
        keepalive,
    };
    let mut r = Response::new(Body::from_stream(body));
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    r
}

/// Accepts connections on `listener` until `stop` resolves, serving each
/// with hyper's HTTP/1 (header read timeout, keep-alive) under a cap of
/// `max_connections` open at once.
pub async fn accept_loop(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    mut stop: mpsc::Receiver<()>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    use hyper_util::service::TowerToHyperService;
    let permits = Arc::new(tokio::sync::Semaphore::new(app.opts.max_connections.max(1)));
    let svc = TowerToHyperService::new(router(app.clone()));
    loop {
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
            _ = stop.recv() => return,
        };
        let (sock, _peer): (tokio::net::TcpStream, SocketAddr) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(_) => {
                    // Out of fds or a reset before accept: back off a little.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ = stop.recv() => return,
        };
        let _ = sock.set_nodelay(true);
        let svc = svc.clone();
        let timeout = app.opts.header_timeout;
        tokio::spawn(async move {
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(timeout)
                .keep_alive(true)
                .serve_connection(TokioIo::new(sock), svc);
            let _ = conn.await;
            drop(permit);
        });
    }
}
