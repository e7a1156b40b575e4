//! `xtc serve`: the OpenAI-compatible HTTP server (see [`xtc_serve`]).
//!
//! Model and device defaults as `xtc generate`: the fetched
//! SmolLM2-135M-Instruct GGUF, the Vulkan device if one opens (a GPU, else
//! lavapipe), else the CPU reference.
//!
//! Exit status: 0 after a SIGTERM/SIGINT drain; 1 the model or device could
//! not be loaded, the address could not be bound, or the engine failed;
//! 2 a usage error.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::generate;
use xtc_model::KvGeometry;
use xtc_model::open::{ModelSpec, Target};
use xtc_serve::backend::Backend;
use xtc_serve::engine::EngineOpts;
use xtc_serve::http::HttpOpts;
use xtc_serve::{ServeConfig, run as serve_run};

/// The name `/v1/models` lists by default.
pub const MODEL_NAME: &str = "smollm2-135m-instruct";

/// Arguments of `xtc serve`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Endpoints: POST /v1/completions, POST /v1/chat/completions (OpenAI; \"stream\": true \
for server-sent events), GET /v1/models and /v1/models/{id}, GET /health (503 while loading or \
draining), GET /metrics (Prometheus, xtc: names), POST /tokenize, POST /detokenize \
(vLLM's shapes).

Requests: max_tokens defaults to --default-max-tokens; temperature 0 (greedy) \
unless given; top_p, top_k, min_p, seed, stop, stream_options.include_usage, \
ignore_eos, min_tokens (neither EOS nor a stop string ends an answer before \
it) are honoured; n > 1, logprobs, echo, tools, stop_token_ids, \
include_stop_str_in_output and response_format other than text are refused \
(400 naming the field). Chat messages are rendered as ChatML without the \
model template's default system message (send a system message to get one). \
A body over --max-body is refused (413) before it is read; one not complete \
within --body-timeout of its headers gets 408 and the connection closes. A request \
whose prompt + max_tokens cannot fit the context or the KV cache is refused at \
once (400 context_length_exceeded); when --max-queued requests already wait, a \
new one gets 429 with Retry-After. A client that disconnects is cancelled at \
once, wherever its request is.

SIGTERM or SIGINT drains: new requests get 503, requests in flight finish, \
then xtc serve exits 0; a second signal cancels what is left.

Examples:
  xtc serve --port 8000
  curl -s localhost:8000/v1/completions -H 'content-type: application/json' \\
    -d '{\"prompt\": \"The capital of France is\", \"max_tokens\": 16}'
  curl -sN localhost:8000/v1/chat/completions -H 'content-type: application/json' \\
    -d '{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"stream\": true}'")]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, value_name = "IP", default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port to listen on (0: any free port; the bound address is printed).
    #[arg(long, value_name = "N", default_value_t = 8000)]
    pub port: u16,
    /// GGUF model file (default: the fetched SmolLM2-135M-Instruct in the cache directory).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// `auto` (the default: the first Vulkan device, a GPU if present, else lavapipe; the CPU
    /// reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan), or a Vulkan
    /// device index, part of its name or its render node (`xtc probe` lists them).
    #[arg(long, value_name = "DEV", default_value = "auto", value_parser = crate::device::parse)]
    pub device: crate::device::DeviceArg,
    /// The model name /v1/models lists (requests may also use the file name).
    #[arg(long, value_name = "NAME", default_value = MODEL_NAME)]
    pub served_model_name: String,
    /// Requests decoded together at most.
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub max_active: usize,
    /// Requests accepted but not yet admitted at most; beyond, 429.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub max_queued: usize,
    /// Positions per sequence (prompt + output) at most (default: the
    /// model's; 1536 at most on a CPU-kind Vulkan device).
    #[arg(long, value_name = "N")]
    pub context: Option<usize>,
    /// KV-cache blocks (default: enough for --max-active full contexts).
    #[arg(long, value_name = "N")]
    pub kv_blocks: Option<usize>,
    /// Positions per KV block.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub block_size: usize,
    /// Token rows per iteration at most (decode rows plus prefill chunks).
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub token_budget: usize,
    /// max_tokens of a request that gives none.
    #[arg(long, value_name = "N", default_value_t = 256)]
    pub default_max_tokens: usize,
    /// Largest request body in bytes (413 beyond).
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub max_body: usize,
    /// Seconds a connection has to send its request headers.
    #[arg(long, value_name = "S", default_value_t = 10.0)]
    pub header_timeout: f64,
    /// Seconds a request has to send its whole body once its headers are in
    /// (408 and the connection closed beyond).
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub body_timeout: f64,
    /// Milliseconds between SSE keep-alive comments while a stream waits.
    #[arg(long, value_name = "MS", default_value_t = 1000)]
    pub keepalive_ms: u64,
    /// Open connections at most (more wait in the listen backlog).
    #[arg(long, value_name = "N", default_value_t = 4096)]
    pub max_connections: usize,
    /// Pieces of text a stream buffers for a slow client; a client that
    /// falls this far behind (its connection's buffers full too: a 16 KiB
    /// send buffer, at most 16 queued writes) is cancelled.
    #[arg(long, value_name = "N", default_value_t = 1024)]
    pub stream_buffer: usize,
    /// Worker threads of the HTTP runtime.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub http_workers: usize,
    /// Threads of the CPU reference (default: one per core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
}

fn usage(msg: String) -> i32 {
    eprintln!("xtc serve: {msg}");
    2
}

/// Runs `xtc serve` (see the module doc); returns the exit status.
pub fn run(args: &ServeArgs, out: &mut dyn Write) -> i32 {
    for (name, v) in [
        ("--max-active", args.max_active),
        ("--max-queued", args.max_queued),
        ("--block-size", args.block_size),
        ("--token-budget", args.token_budget),
        ("--default-max-tokens", args.default_max_tokens),
        ("--stream-buffer", args.stream_buffer),
        ("--http-workers", args.http_workers),
        ("--max-connections", args.max_connections),
    ] {
        if v == 0 {
            return usage(format!("{name} 0: must be at least 1"));
        }
    }
    for (name, v) in [
        ("--header-timeout", args.header_timeout),
        ("--body-timeout", args.body_timeout),
    ] {
        if !(v.is_finite() && v > 0.0 && v < 1e9) {
            return usage(format!("{name} {v}: must be a positive number of seconds"));
        }
    }
    if let Err(f) = generate::check_options(&args.device, args.threads) {
        return usage(f.msg);
    }
    if let Some(n) = args.threads {
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global();
    }
    let (spec, tok, path, _pool) = match generate::load(args.model.as_deref(), &args.device, None) {
        Ok(x) => x,
        Err(f) => {
            eprintln!("xtc serve: {}", f.msg);
            return f.code;
        }
    };
    let ModelSpec::Gguf { model, .. } = spec else {
        eprintln!("xtc serve: the model is not a GGUF model");
        return 1;
    };
    let target = match generate::open_device(&args.device, "xtc serve") {
        Ok(r) => r,
        Err(f) => {
            eprintln!("xtc serve: {}", f.msg);
            return f.code;
        }
    };
    let seq_len = model.config().shape.seq_len;
    let cap = target.context(seq_len);
    let context = match args.context {
        Some(0) => return usage("--context 0: must be at least 1".into()),
        Some(c) if c > cap => {
            return usage(format!(
                "--context {c}: this model and device run at most {cap} positions"
            ));
        }
        Some(c) => c,
        None => cap,
    };
    let per_req = context.div_ceil(args.block_size);
    let kv_blocks = args
        .kv_blocks
        .unwrap_or(per_req.saturating_mul(args.max_active));
    if kv_blocks == 0 || u32::try_from(kv_blocks).is_err() {
        return usage(format!("--kv-blocks {kv_blocks}: must be in 1..2^32"));
    }
    let file = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let stem = file.strip_suffix(".gguf").unwrap_or(&file).to_string();
    let engine = EngineOpts {
        max_active: args.max_active,
        max_queued: args.max_queued,
        kv_blocks,
        block_size: args.block_size,
        token_budget: args.token_budget.max(args.max_active),
        context,
        stream_buffer: args.stream_buffer,
    };
    let cfg = ServeConfig {
        addr: SocketAddr::new(args.host, args.port),
        workers: args.http_workers,
        model_name: args.served_model_name.clone(),
        aliases: vec![file.clone(), stem],
        http: HttpOpts {
            default_max_tokens: args.default_max_tokens,
            max_body: args.max_body,
            header_timeout: Duration::from_secs_f64(args.header_timeout),
            body_timeout: Duration::from_secs_f64(args.body_timeout),
            keepalive: Duration::from_millis(args.keepalive_ms.max(10)),
            max_connections: args.max_connections,
        },
        engine,
    };
    let kv = KvGeometry {
        block_size: args.block_size,
        n_blocks: kv_blocks,
    };
    let build = move || match target {
        // `--device toy` is refused by `check_options` (a usage error).
        Target::Cpu | Target::Toy(_) => Ok(Backend::cpu(model, kv, &file)),
        Target::Vulkan(dev) => Backend::vulkan(
            &dev,
            &model,
            kv,
            engine.token_budget,
            engine.max_active,
            context,
            &file,
        ),
    };
    let banner = format!(
        "xtc serve: {} on {}; max-active {}, max-queued {}, KV cache {} blocks x {} positions, \
         context {}, token budget {}",
        args.served_model_name,
        path.display(),
        engine.max_active,
        engine.max_queued,
        kv_blocks,
        args.block_size,
        context,
        engine.token_budget
    );
    let r = serve_run(cfg, Arc::new(tok), build, |addr| {
        let _ = writeln!(out, "{banner}");
        let _ = writeln!(out, "xtc serve: listening on http://{addr}");
        let _ = out.flush();
    });
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xtc serve: {e}");
            1
        }
    }
}
