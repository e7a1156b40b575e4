//! `xtc decode`'s model: which one serves the trace, its prompts, and the
//! sample completions printed after the report.
//!
//! - By default the GGUF model (SmolLM2-135M-Instruct Q4_1, found as `xtc
//!   generate` finds it: `--model PATH.gguf`, else the fetch script's cache
//!   path; a missing file is an error naming `scripts/fetch-model.sh`). Its
//!   prompts are real English text: windows of [`PROMPT_TEXT`] tokenized
//!   with the model's own tokenizer, one window per request at a seeded
//!   offset, of the request's scaled prompt length
//!   ([`xtc_replay::prompts`]). Its end-of-sequence token is
//!   ignored: every request runs to the trace's (scaled) output length, so
//!   the workload is the trace's whatever the model says.
//! - `--model PATH` naming a llama2.c checkpoint (anything without the GGUF
//!   magic) runs it as before: random prompt ids, greedy decode stopping at
//!   its EOS, samples as text with `--tokenizer`.
//! - `--synthetic` (and `--device toy` without `--model`) runs the seeded
//!   synthetic model ([`Config::tiny`]) with random prompt ids: the engine's
//!   own tests and measurements, and the toy device, need no model file.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::args::DecodeArgs;
use xtc_model::cpu::llama::Llama;
use xtc_model::format::checkpoint;
use xtc_model::format::gguf::MAGIC;
use xtc_model::format::tokenizer::{self, Tokenizer};
use xtc_model::open::{Limits, ModelSpec, OpenError, Target, open};
use xtc_model::text::bpe::{Bpe, TextStream};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{Config, KvGeometry, Weights, find_model};
use xtc_replay::job::{self, JobOpts, RunOutput, SharedModel, Status, Workload};
use xtc_replay::prompts;
use xtc_replay::trace::{Scaling, Trace};

/// The prompt text of GGUF models: chapters 1 to 12 of *Pride and Prejudice*
/// (public domain; provenance in `data/pride_and_prejudice_ch1-12.PROVENANCE.md`).
pub const PROMPT_TEXT: &str = include_str!("../../../../data/pride_and_prejudice_ch1-12.txt");

/// How the banner names [`PROMPT_TEXT`].
pub const PROMPT_TEXT_NAME: &str = "Pride and Prejudice ch. 1-12 (public domain)";

/// Requests replayed by default with a GGUF model on a CPU device (lavapipe
/// or the CPU reference): about two minutes on a 2-core machine. GPUs, and
/// the synthetic model, replay [`super::args::DEFAULT_REQUESTS`].
pub const CPU_MODEL_REQUESTS: usize = 128;

/// Positions per sequence of a GGUF model on a CPU-kind Vulkan device in
/// `xtc decode`: below the kernel's limit
/// ([`xtc_model::open::CPU_DEVICE_CONTEXT`]), so the default
/// workload's requests stay short there.
pub const CPU_DEVICE_CONTEXT: usize = 1024;

/// Sample completions printed after the report.
pub const SAMPLES: usize = 3;

/// The GGUF model of a run, its tokenizer and its prompt corpus.
pub struct GgufSource {
    /// The model (shared with the CPU reference's pool work).
    pub model: Arc<Llama>,
    /// Its tokenizer.
    pub tok: Bpe,
    /// The file.
    pub path: PathBuf,
    /// [`PROMPT_TEXT`] in the model's tokens.
    pub corpus: Vec<u32>,
}

/// The model `xtc decode` runs (see the module doc).
pub enum Source {
    /// The seeded synthetic model.
    Synthetic(Weights),
    /// A llama2.c checkpoint (and its `tokenizer.bin`, if given).
    Checkpoint(Weights, Option<Tokenizer>),
    /// A GGUF model.
    Gguf(Box<GgufSource>),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Synthetic(w) => write!(f, "Synthetic({:?})", w.config),
            Source::Checkpoint(w, _) => write!(f, "Checkpoint({:?})", w.config),
            Source::Gguf(g) => write!(f, "Gguf({})", g.path.display()),
        }
    }
}

/// A request's completion as text.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Sample {
    /// Request id.
    pub id: usize,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// The end of the prompt as text (its last 60 characters at most).
    pub prompt_tail: String,
    /// Generated tokens.
    pub generated_tokens: usize,
    /// The generated tokens as text.
    pub completion: String,
}

/// Whether the file at `path` starts with the GGUF magic.
fn is_gguf(path: &Path) -> Result<bool, String> {
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut magic = [0u8; 4];
    match f.read_exact(&mut magic) {
        Ok(()) => Ok(magic == MAGIC),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

impl Source {
    /// The model the arguments name (see the module doc).
    ///
    /// # Errors
    /// A missing GGUF model (naming the fetch script), an unreadable or
    /// malformed file, a tokenizer that does not fit the model.
    pub fn load(args: &DecodeArgs, device: &Target) -> Result<Source, String> {
        let toy = matches!(device, Target::Toy(_));
        if args.synthetic || (toy && args.model.is_none()) {
            return Ok(Source::Synthetic(Weights::synthetic(
                Config::tiny(),
                args.seed,
            )));
        }
        // A missing file goes to the GGUF lookup, whose error names the
        // fetch script.
        if let Some(p) = &args.model
            && p.exists()
            && !is_gguf(p)?
        {
            let w = checkpoint::load(p).map_err(|e| {
                format!(
                    "{}: not a GGUF file (no GGUF magic), and not a llama2.c checkpoint: {e}",
                    p.display()
                )
            })?;
            let tok = args
                .tokenizer
                .as_ref()
                .map(|t| Tokenizer::load(t, w.config.vocab_size).map_err(|e| e.to_string()))
                .transpose()?;
            return Ok(Source::Checkpoint(w, tok));
        }
        if args.tokenizer.is_some() {
            return Err(
                "--tokenizer is for llama2.c checkpoints; a GGUF model carries its own".into(),
            );
        }
        let path = find_model(args.model.as_deref()).map_err(|e| e.to_string())?;
        let model = Llama::load(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let tok = Bpe::from_gguf(model.gguf()).map_err(|e| format!("{}: {e}", path.display()))?;
        if tok.vocab_size() != model.config().shape.vocab_size {
            return Err(format!(
                "{}: the tokenizer has {} tokens, the model {}",
                path.display(),
                tok.vocab_size(),
                model.config().shape.vocab_size
            ));
        }
        let corpus = tok.encode(PROMPT_TEXT);
        Ok(Source::Gguf(Box::new(GgufSource {
            model: Arc::new(model),
            tok,
            path,
            corpus,
        })))
    }

    /// The model's shape as the run sees it: a GGUF model's positions per
    /// sequence are capped at [`CPU_DEVICE_CONTEXT`] on CPU-kind Vulkan
    /// devices (the scaling then keeps every request within them).
    pub fn config(&self, device: &Target) -> Config {
        match self {
            Source::Synthetic(w) | Source::Checkpoint(w, _) => w.config,
            Source::Gguf(g) => {
                let mut c = g.model.config().shape;
                if device.is_cpu_device() {
                    c.seq_len = device.context(c.seq_len).min(CPU_DEVICE_CONTEXT);
                }
                c
            }
        }
    }

    /// f32-sized elements of weights a Vulkan device holds (for the memory check).
    pub fn weight_elems(&self) -> u128 {
        match self {
            Source::Synthetic(w) | Source::Checkpoint(w, _) => {
                w.tensors().iter().map(|(_, t)| t.len() as u128).sum()
            }
            Source::Gguf(g) => std::fs::metadata(&g.path).map_or(0, |m| u128::from(m.len()) / 4),
        }
    }

    /// Weight elements (the GGUF file's tensors, or the f32 weights).
    pub fn parameters(&self) -> u64 {
        match self {
            Source::Synthetic(w) | Source::Checkpoint(w, _) => super::config::parameters(w),
            Source::Gguf(g) => g
                .model
                .gguf()
                .tensors()
                .iter()
                .map(|t| t.n_elements())
                .sum(),
        }
    }

    /// Bytes of the weights (4 per element of f32 weights; the GGUF file's
    /// tensor data, in its block formats).
    pub fn weight_bytes(&self) -> u64 {
        match self {
            Source::Synthetic(_) | Source::Checkpoint(..) => self.parameters() * 4,
            Source::Gguf(g) => g.model.gguf().tensors().iter().map(|t| t.size).sum(),
        }
    }

    /// The model file, if any.
    pub fn path(&self) -> Option<String> {
        match self {
            Source::Synthetic(_) => None,
            Source::Checkpoint(..) => None,
            Source::Gguf(g) => Some(g.path.display().to_string()),
        }
    }

    /// Requests replayed without `--requests` on this device.
    pub fn default_requests(&self, is_cpu: bool) -> usize {
        match self {
            Source::Gguf(_) if is_cpu => CPU_MODEL_REQUESTS,
            _ => super::args::DEFAULT_REQUESTS,
        }
    }

    /// The token that ends a request early: a checkpoint's EOS; none for a
    /// GGUF model (EOS ignored for the workload's fidelity: every request
    /// runs to its trace output length) or the synthetic model.
    pub fn stop_token(&self) -> Option<u32> {
        match self {
            Source::Checkpoint(..) => Some(tokenizer::EOS),
            _ => None,
        }
    }

    /// The workload of the first `n` trace rows: lengths and arrivals
    /// through `scaling`, cancellations at `cancel_rate`; prompts are
    /// windows of the prompt text for a GGUF model, seeded random ids
    /// otherwise.
    ///
    /// # Errors
    /// A prompt text without tokens.
    pub fn workload(
        &self,
        trace: &Trace,
        n: usize,
        scaling: &Scaling,
        config: &Config,
        seed: u64,
        cancel_rate: f64,
    ) -> Result<Workload, String> {
        let mut wl = job::workload(trace, n, scaling, config.vocab_size, seed, cancel_rate);
        if let Source::Gguf(g) = self {
            prompts::text_windows(&mut wl, &g.corpus, seed)?;
        }
        Ok(wl)
    }

    /// The banner's line about the model file and its prompts.
    pub fn banner_line(&self) -> String {
        match self {
            Source::Synthetic(_) => {
                "model file: none (--synthetic: seeded weights, random prompt ids)".into()
            }
            Source::Checkpoint(..) => {
                "model file: a llama2.c checkpoint; random prompt ids, greedy decode stops at EOS"
                    .into()
            }
            Source::Gguf(g) => format!(
                "model file: {}; prompts: windows of {PROMPT_TEXT_NAME}, {} tokens; \
                 EOS ignored (every request runs to its trace output length)",
                g.path.file_name().map_or_else(
                    || g.path.display().to_string(),
                    |n| n.to_string_lossy().into()
                ),
                g.corpus.len()
            ),
        }
    }

    /// The default KV cache, fitted to a GPU: a GGUF model's KV cache is one
    /// storage buffer there (`[2 * n_layers][n_blocks][block_size][kv_dim]`
    /// f32), so without `--kv-blocks` the derived block count is capped at
    /// what `maxStorageBufferRange` holds (the full trace's longest requests
    /// times `--max-active` would not fit); admission then charges each
    /// request its own blocks. Unchanged otherwise, and in the CPU kernel
    /// form (`kernels`, or the device's own form for `None`), whose KV cache
    /// is an image.
    pub fn fit_kv(
        &self,
        device: &Target,
        config: &Config,
        opts: JobOpts,
        explicit: bool,
        kernels: Option<Variant>,
    ) -> JobOpts {
        let (Source::Gguf(_), Target::Vulkan(dev)) = (self, device) else {
            return opts;
        };
        // A probe failure leaves the cap on: the model's own error follows.
        let form = kernels.unwrap_or_else(|| Variant::for_device(dev).unwrap_or(Variant::Gpu));
        if explicit || form == Variant::Cpu {
            return opts;
        }
        let per_block = 2 * config.n_layers * opts.block_size.max(1) * config.kv_dim() * 4;
        let fit = (dev.max_storage_buffer_range() / per_block.max(1) as u64) as usize;
        JobOpts {
            kv_blocks: opts.kv_blocks.min(fit.max(1)),
            ..opts
        }
    }

    /// The model as the front door takes it.
    pub fn spec(&self) -> ModelSpec {
        match self {
            Source::Synthetic(w) | Source::Checkpoint(w, _) => ModelSpec::F32(Box::new(w.clone())),
            Source::Gguf(g) => ModelSpec::Gguf {
                model: g.model.clone(),
                name: g.path.file_name().map_or_else(
                    || g.path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                ),
            },
        }
    }

    /// Opens the model on `device` ([`xtc_model::open::open`]) with a KV
    /// cache and buffers for `opts`, in the kernel form `kernels` on a
    /// Vulkan device (`None`: the device's own, `--kernels auto`); `config`
    /// is [`Source::config`] for the device.
    ///
    /// # Errors
    /// As [`xtc_model::open::open`].
    pub fn model(
        &self,
        device: &Target,
        opts: &JobOpts,
        config: &Config,
        kernels: Option<Variant>,
    ) -> Result<SharedModel, OpenError> {
        let limits = Limits {
            kv: KvGeometry {
                block_size: opts.block_size,
                n_blocks: opts.kv_blocks,
            },
            max_tokens: opts.token_budget,
            max_seqs: opts.max_active.max(1),
            max_context: config.seq_len,
            kernels,
        };
        Ok(job::shared(open(&self.spec(), device, limits)?))
    }

    /// Up to [`SAMPLES`] completions as text (the lowest request ids that
    /// generated tokens); none for the synthetic model or a checkpoint
    /// without `--tokenizer`.
    pub fn samples(&self, out: &RunOutput) -> Vec<Sample> {
        let mut done: Vec<_> = out
            .finished
            .iter()
            .filter(|f| !f.seq.generated.is_empty() && !matches!(f.status, Status::Failed(_)))
            .collect();
        done.sort_by_key(|f| f.seq.id);
        let text = |ids: &[u32], prev: Option<u32>| -> Option<String> {
            match self {
                Source::Synthetic(_) | Source::Checkpoint(_, None) => None,
                Source::Checkpoint(_, Some(t)) => {
                    Some(t.decode(prev.unwrap_or(tokenizer::BOS), ids))
                }
                Source::Gguf(g) => {
                    let mut s = TextStream::new();
                    let mut text = String::new();
                    for &id in ids {
                        text += &s.push(g.tok.token_bytes(id));
                    }
                    Some(text + &s.finish())
                }
            }
        };
        done.iter()
            .take(SAMPLES)
            .filter_map(|f| {
                let seq = &f.seq;
                let completion = text(&seq.generated, seq.prompt.last().copied())?;
                let prompt = text(&seq.prompt, None).unwrap_or_default();
                let chars: Vec<char> = prompt.chars().collect();
                let tail: String = chars[chars.len().saturating_sub(60)..].iter().collect();
                Some(Sample {
                    id: seq.id,
                    prompt_tokens: seq.prompt.len(),
                    prompt_tail: tail,
                    generated_tokens: seq.generated.len(),
                    completion,
                })
            })
            .collect()
    }
}
