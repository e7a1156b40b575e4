//! `xtc-serve`: `xtc serve`, an OpenAI-compatible HTTP server over the
//! batch engine.
//!
//! # Architecture
//! ```text
//!  tokio runtime (1-2 workers)                  engine thread: one xtc loop
//!  ---------------------------                  ---------------------------
//!  hyper HTTP/1 connections -> axum routes      async batch group (driver)
//!  parse + check (api), tokenize / ChatML        KV ledger (charge = blocks of
//!  EngineHandle::submit ---- submit_mt ------->    prompt + max_tokens), FCFS
//!     Again -> 429 / 503, too long -> 400        one packed plan per iteration
//!  Ticket: bounded channel of Deltas <--------   collect: sample, detokenize,
//!          reply future (Outcome)   <--------      stop strings, try_send
//!          CancelGuard (drop) ----- cancel_mt -> complete: free KV, set reply
//! ```
//! - [`engine`]: the engine thread ([`engine::Engine`]) and the HTTP side's
//!   only way in ([`engine::EngineHandle`]: `submit_mt`, `cancel_mt`). No
//!   lock is shared with the driver; no tokio type enters `batch` or `rt`.
//! - [`backend`]: the model the engine drives (Vulkan or the CPU reference),
//!   with the sampled rows' logits when a request samples on the host.
//! - [`text`]: incremental detokenization (split UTF-8 held back) and stop
//!   strings matched across token boundaries.
//! - [`api`]: request fields, their defaults and checks; OpenAI errors.
//! - [`http`]: routes, SSE, the accept loop.
//! - [`hf_tokenizer`]: the tokenizer as a Hugging Face directory (`xtc
//!   tokenizer export`), for load clients.
//! - [`metrics`]: the front end's metrics (cancellations by phase, refusals).
//! - [`run`]: the whole server: listen, load, serve, drain on SIGTERM.
//!
//! # Shutdown
//! SIGTERM or SIGINT: `/health` and new requests answer 503, the group is
//! closed with DRAIN, requests in flight finish and their streams end, then
//! the process exits 0. A second signal closes with CANCEL (streams in
//! flight end with an error event). Once every request has ended, bodies
//! still unsent (a client that stopped reading) get [`FLUSH_GRACE`], none
//! after a second signal.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod backend;
pub mod engine;
pub mod hf_tokenizer;
pub mod http;
pub mod metrics;
pub mod text;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use backend::{Backend, BackendError};
use engine::{Engine, EngineError, EngineOpts};
use http::{App, HttpOpts};
use metrics::ServeMetrics;
use xtc::batch::CloseMode;
use xtc_model::text::bpe::Bpe;

/// How long a drain waits, once every request has ended, for response
/// bodies still being sent (a client that stopped reading may never take
/// its last bytes); a second signal does not wait.
pub const FLUSH_GRACE: Duration = Duration::from_secs(10);

/// `SO_SNDBUF` of every connection, bytes (Linux doubles it for its own
/// bookkeeping and turns its autotuning off): how much of a stream the
/// kernel holds for a client that stopped reading, so that such a client
/// is cancelled after a bounded number of tokens (the engine module's doc
/// lists every buffer on the way). On loopback a 16 KiB send buffer took
/// 33 KB (some 176 SSE events of 190 bytes) from a writer whose reader had
/// stopped, where the autotuned default took 3 MB (15,700 events); it is
/// far more than a token stream's rate needs.
pub const SEND_BUFFER_BYTES: u32 = 16 * 1024;

/// The listening socket: `SO_REUSEADDR` (as `TcpListener::bind`), the send
/// buffer [`SEND_BUFFER_BYTES`] (accepted connections inherit it), a
/// backlog of 1,024.
fn listen(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let sock = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    sock.set_reuseaddr(true)?;
    sock.set_send_buffer_size(SEND_BUFFER_BYTES)?;
    sock.bind(addr)?;
    sock.listen(1024)
}

/// Everything [`run`] needs besides the model.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Address to listen on (port 0: any free port).
    pub addr: SocketAddr,
    /// Worker threads of the HTTP runtime (1 or 2 is plenty).
    pub workers: usize,
    /// The model name `/v1/models` lists.
    pub model_name: String,
    /// Other names requests may use for it.
    pub aliases: Vec<String>,
    /// HTTP settings.
    pub http: HttpOpts,
    /// Engine sizes.
    pub engine: EngineOpts,
}

/// Why the server stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The runtime or the signal handlers could not start.
    #[error("cannot start the HTTP runtime: {0}")]
    Runtime(std::io::Error),
    /// The engine failed to load or to run.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// KV blocks were still allocated when the engine stopped (a bug).
    #[error("{0} KV blocks were still allocated at exit")]
    Leaked(usize),
}

/// Runs `xtc serve`: listens on `cfg.addr` (calling `on_listen` with the
/// bound address), loads the engine (`build` makes the model on the engine
/// thread; `/health` answers 503 meanwhile), serves until SIGTERM/SIGINT,
/// drains (see the module doc) and returns.
///
/// # Errors
/// [`ServeError`]: bind, runtime, engine failures.
pub fn run(
    cfg: ServeConfig,
    tok: Arc<Bpe>,
    build: impl FnOnce() -> Result<Backend, BackendError> + Send + 'static,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cfg.workers.max(1))
        .thread_name("xtc-http")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    rt.block_on(serve(cfg, tok, build, on_listen))
}

async fn serve(
    cfg: ServeConfig,
    tok: Arc<Bpe>,
    build: impl FnOnce() -> Result<Backend, BackendError> + Send + 'static,
    on_listen: impl FnOnce(SocketAddr),
) -> Result<(), ServeError> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(ServeError::Runtime)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServeError::Runtime)?;
    let listener = listen(cfg.addr).map_err(|source| ServeError::Bind {
        addr: cfg.addr,
        source,
    })?;
    let addr = listener.local_addr().map_err(ServeError::Runtime)?;
    let metrics = Arc::new(ServeMetrics::new());
    let app = Arc::new(App::new(
        tok.clone(),
        cfg.model_name.clone(),
        cfg.aliases.clone(),
        metrics.clone(),
        cfg.http.clone(),
    ));
    let (stop_tx, stop_rx) = tokio::sync::mpsc::channel(1);
    let accept = tokio::spawn(http::accept_loop(listener, app.clone(), stop_rx));
    on_listen(addr);
    let opts = cfg.engine;
    let loading = tokio::task::spawn_blocking(move || Engine::start(opts, tok, metrics, build));
    let engine = tokio::select! {
        e = loading => e.map_err(|e| EngineError::Thread(e.to_string()))??,
        _ = term.recv() => return Ok(()),
        _ = int.recv() => return Ok(()),
    };
    let _ = app.engine.set(engine.handle.clone());
    app.state.store(http::READY, Ordering::SeqCst);
    eprintln!("xtc serve: ready: {}", engine.handle.describe);
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    app.state.store(http::DRAINING, Ordering::SeqCst);
    engine.close(CloseMode::Drain);
    eprintln!(
        "xtc serve: draining {} requests (a second SIGTERM/SIGINT cancels them)",
        engine.handle.gauges.outstanding.load(Ordering::SeqCst)
    );
    // Every request ended, then every body sent; a body that cannot be
    // sent (its client stopped reading) is given FLUSH_GRACE, or nothing
    // after a second signal.
    let mut cancelled = false;
    let mut ended_at = None;
    loop {
        let outstanding = engine.handle.gauges.outstanding.load(Ordering::SeqCst);
        let active = app.active.load(Ordering::SeqCst);
        if outstanding == 0 {
            let since = *ended_at.get_or_insert_with(tokio::time::Instant::now);
            if active == 0 || cancelled || since.elapsed() >= FLUSH_GRACE {
                if active > 0 {
                    eprintln!("xtc serve: {active} responses still unsent (clients not reading)");
                }
                break;
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            _ = term.recv() => { engine.close(CloseMode::Cancel); cancelled = true; }
            _ = int.recv() => { engine.close(CloseMode::Cancel); cancelled = true; }
        }
    }
    let _ = stop_tx.send(()).await;
    let _ = accept.await;
    let leaked = tokio::task::spawn_blocking(move || engine.join())
        .await
        .map_err(|e| EngineError::Thread(e.to_string()))??;
    // Let the last bytes of finished streams reach their sockets.
    tokio::time::sleep(Duration::from_millis(50)).await;
    if leaked > 0 {
        return Err(ServeError::Leaked(leaked));
    }
    eprintln!("xtc serve: drained, exiting");
    Ok(())
}
