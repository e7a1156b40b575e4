//! One sequence of a GGUF model on a device, fed chunk by chunk: what `xtc
//! generate` (a prefill, then one token at a time) and `xtc perplexity`
//! (windows scored token by token) run on, whether the device is the CPU
//! reference or a Vulkan device.
//!
//! - [`CpuStream`]: [`Llama::forward`] over one contiguous [`Sequence`].
//! - [`VulkanStream`]: [`GpuLlama`] with one sequence's block table; a
//!   chunk is one plan (split into plans of at most
//!   [`VulkanStream::new`]'s `max_rows` token rows, `logit_rows` when every
//!   row's logits are wanted). Logits of every row
//!   ([`Logits::All`]) are asked for by giving each token its own entry of
//!   the plan with the same block table (each samples; the KV writes of all
//!   rows land before any row's attention, so each row sees the rows before
//!   it), with the logits copied back.
//!
//! Both give the same greedy tokens on the real model (`crates/cli/tests/model_cli.rs`
//! runs the Paris prompt on both) and logits within the Vulkan model's
//! tolerance (`crates/model/tests/vk_llama.rs`).

use super::cpu::llama::{Chunk, ForwardError, Llama, Logits, Sequence};
use super::cpu::math::neg_log_softmax;
use super::vulkan::llama::{GpuLlama, GpuLlamaError, GpuLlamaOptions};
use super::vulkan::ops::Variant;
use super::vulkan::qops8::Activations;
use super::{BatchPlan, KvGeometry, SeqWork};

/// Why a stream's forward pass failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    /// Refused before running (empty chunk, token outside the vocabulary,
    /// past the context length): nothing changed.
    #[error(transparent)]
    Forward(#[from] ForwardError),
    /// The device failed.
    #[error("device: {0}")]
    Device(String),
}

/// One sequence on a device (see the module doc).
pub trait Stream {
    /// Positions cached.
    fn len(&self) -> usize;
    /// Whether nothing is cached.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Positions the sequence may hold.
    fn context(&self) -> usize;
    /// Vocabulary size (the length of a logits row).
    fn vocab_size(&self) -> usize;
    /// Runs `tokens` at the next positions and returns the logits `want`
    /// asks for: empty ([`Logits::None`]), `[vocab]` after the last token
    /// ([`Logits::Last`]) or `[tokens, vocab]` ([`Logits::All`]).
    ///
    /// # Errors
    /// [`StreamError::Forward`] for an empty chunk, a token outside the
    /// vocabulary or a chunk past [`Stream::context`] (nothing ran);
    /// [`StreamError::Device`] for a device failure.
    fn forward(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, StreamError>;
    /// Forgets every position (the stream starts a fresh sequence).
    fn reset(&mut self);
    /// The device, in words (for messages and `--json`).
    fn device(&self) -> String;
}

/// A stream on the CPU reference.
#[derive(Debug)]
pub struct CpuStream<'m> {
    model: &'m Llama,
    seq: Sequence,
}

impl<'m> CpuStream<'m> {
    /// An empty sequence of `model`.
    pub fn new(model: &'m Llama) -> Self {
        CpuStream {
            model,
            seq: model.new_sequence(),
        }
    }

    /// The sequence's KV cache.
    pub fn into_sequence(self) -> Sequence {
        self.seq
    }
}

impl Stream for CpuStream<'_> {
    fn len(&self) -> usize {
        self.seq.len()
    }
    fn context(&self) -> usize {
        self.model.config().shape.seq_len
    }
    fn vocab_size(&self) -> usize {
        self.model.config().shape.vocab_size
    }
    fn forward(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, StreamError> {
        Ok(self
            .model
            .forward(&mut [Chunk {
                seq: &mut self.seq,
                tokens,
                logits: want,
            }])?
            .remove(0))
    }
    fn reset(&mut self) {
        self.seq.truncate(0);
    }
    fn device(&self) -> String {
        "CPU reference".into()
    }
}

/// Positions per KV block of a [`VulkanStream`].
const BLOCK: usize = 16;

/// A stream on a Vulkan device ([`GpuLlama`] holding one sequence).
#[derive(Debug)]
pub struct VulkanStream {
    gpu: GpuLlama,
    pos: usize,
    table: Vec<u32>,
    max_rows: usize,
    logit_rows: usize,
    vocab: usize,
}

impl VulkanStream {
    /// Uploads `model` to `dev` for one sequence of at most `context`
    /// positions, running at most `max_rows` token rows per plan and
    /// bringing back at most `logit_rows` logits rows per plan (a
    /// [`Logits::All`] chunk runs in plans of that many rows; `[logit_rows,
    /// vocab]` f32 of readback memory), in the kernel form `variant`
    /// (`None`: the device's own).
    ///
    /// # Errors
    /// As [`GpuLlama::new`] (a `context` above the model's, or above what
    /// the CPU-device attention runs; device memory; a form the device
    /// cannot run).
    pub fn new(
        dev: &xtc_vk::Device,
        model: &Llama,
        context: usize,
        max_rows: usize,
        logit_rows: usize,
        variant: Option<Variant>,
    ) -> Result<Self, GpuLlamaError> {
        let acts = Activations::from_env().map_err(|e| GpuLlamaError::Options {
            option: "activations",
            why: e.to_string(),
        })?;
        VulkanStream::with_activations(dev, model, context, max_rows, logit_rows, variant, acts)
    }

    /// As [`new`](Self::new), with the products' activations given instead
    /// of read from `XTC_ACTIVATIONS` ([`Activations::from_env`]).
    ///
    /// # Errors
    /// As [`new`](Self::new).
    pub fn with_activations(
        dev: &xtc_vk::Device,
        model: &Llama,
        context: usize,
        max_rows: usize,
        logit_rows: usize,
        variant: Option<Variant>,
        acts: Activations,
    ) -> Result<Self, GpuLlamaError> {
        let blocks = context.div_ceil(BLOCK).max(1);
        let max_rows = max_rows.max(1);
        let logit_rows = logit_rows.clamp(1, max_rows);
        let opts = GpuLlamaOptions {
            kv: KvGeometry {
                block_size: BLOCK,
                n_blocks: blocks,
            },
            max_tokens: max_rows,
            max_seqs: logit_rows,
            max_context: context,
            keep_logits: true,
            variant,
        };
        let gpu = GpuLlama::with_activations(dev, model, opts, acts)?;
        Ok(VulkanStream {
            gpu,
            pos: 0,
            table: (0..blocks as u32).collect(),
            max_rows,
            logit_rows,
            vocab: model.config().shape.vocab_size,
        })
    }

    /// The model on the device.
    pub fn gpu(&self) -> &GpuLlama {
        &self.gpu
    }

    fn run(&mut self, plan: &BatchPlan) -> Result<Vec<Vec<f32>>, StreamError> {
        let dev = |e: xtc::Error| StreamError::Device(e.to_string());
        let f = self.gpu.submit(plan).map_err(dev)?;
        let (_, logits) = self.gpu.finish_with_logits(f).map_err(dev)?;
        Ok(logits)
    }
}

impl Stream for VulkanStream {
    fn len(&self) -> usize {
        self.pos
    }
    fn context(&self) -> usize {
        self.gpu.config().seq_len
    }
    fn vocab_size(&self) -> usize {
        self.vocab
    }
    fn forward(&mut self, tokens: &[u32], want: Logits) -> Result<Vec<f32>, StreamError> {
        if tokens.is_empty() {
            return Err(ForwardError::Empty { chunk: 0 }.into());
        }
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= self.vocab) {
            return Err(ForwardError::Token {
                chunk: 0,
                token: t,
                vocab: self.vocab,
            }
            .into());
        }
        if self.pos + tokens.len() > self.context() {
            return Err(ForwardError::ContextFull {
                chunk: 0,
                len: self.pos,
                adding: tokens.len(),
                max: self.context(),
            }
            .into());
        }
        let mut out = Vec::new();
        let step = match want {
            Logits::All => self.logit_rows,
            _ => self.max_rows,
        };
        let n_pieces = tokens.len().div_ceil(step);
        for (i, piece) in tokens.chunks(step).enumerate() {
            let seqs = match want {
                Logits::All => piece
                    .iter()
                    .enumerate()
                    .map(|(j, &t)| SeqWork {
                        tokens: vec![t],
                        start_pos: self.pos + j,
                        block_table: self.table.clone(),
                        sample: true,
                    })
                    .collect(),
                _ => vec![SeqWork {
                    tokens: piece.to_vec(),
                    start_pos: self.pos,
                    block_table: self.table.clone(),
                    sample: want == Logits::Last && i + 1 == n_pieces,
                }],
            };
            let logits = self.run(&BatchPlan { seqs })?;
            self.pos += piece.len();
            out.extend(logits.into_iter().flatten());
        }
        Ok(out)
    }
    fn reset(&mut self) {
        // Positions are rewritten before they are read again.
        self.pos = 0;
    }
    fn device(&self) -> String {
        let info = self.gpu.device().info();
        format!("{} ({:?}, Vulkan)", info.name, info.kind)
    }
}

/// Tokens per forward pass when scoring ([`nll`]).
pub const SCORE_STEP: usize = 64;

/// Mean negative log-likelihood of `tokens` on `stream`, in windows of `ctx`
/// tokens (each window a fresh sequence: its first token is context only,
/// every later one is scored given the window before it), [`SCORE_STEP`]
/// tokens per pass. `progress(done, total)` is called after each pass.
///
/// # Errors
/// As [`Stream::forward`] (a token outside the vocabulary, `ctx` above the
/// context length).
pub fn nll(
    stream: &mut dyn Stream,
    tokens: &[u32],
    ctx: usize,
    mut progress: impl FnMut(usize, usize),
) -> Result<Nll, StreamError> {
    let ctx = ctx.max(2);
    let total = tokens.chunks(ctx).map(|w| w.len().saturating_sub(1)).sum();
    let mut nll = Nll {
        tokens: 0,
        sum: 0.0,
    };
    let vocab = stream.vocab_size();
    for window in tokens.chunks(ctx) {
        stream.reset();
        for (si, part) in window.chunks(SCORE_STEP).enumerate() {
            let rows = stream.forward(part, Logits::All)?;
            for (j, row) in rows.chunks_exact(vocab).enumerate() {
                let next = si * SCORE_STEP + j + 1;
                if next < window.len() {
                    nll.sum += neg_log_softmax(row, window[next] as usize);
                    nll.tokens += 1;
                }
            }
            progress(nll.tokens, total);
        }
    }
    Ok(nll)
}

/// A sum of negative log-likelihoods (nats) over scored tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Nll {
    /// Tokens scored.
    pub tokens: usize,
    /// Sum of `-ln p(token | before)`, nats.
    pub sum: f64,
}

impl Nll {
    /// Mean negative log-likelihood per token (nats; NaN with no token).
    pub fn mean(&self) -> f64 {
        self.sum / self.tokens as f64
    }
    /// `exp(mean)`.
    pub fn perplexity(&self) -> f64 {
        self.mean().exp()
    }
}

/// [`nll`] of `model` on the CPU reference ([`CpuStream`]).
///
/// # Errors
/// [`ForwardError`] for a token outside the vocabulary, or `ctx` above
/// the context length ([`ForwardError::ContextFull`]).
pub fn nll_on_cpu(
    model: &Llama,
    tokens: &[u32],
    ctx: usize,
    progress: impl FnMut(usize, usize),
) -> Result<Nll, ForwardError> {
    let mut stream = CpuStream::new(model);
    nll(&mut stream, tokens, ctx, progress).map_err(|e| match e {
        StreamError::Forward(e) => e,
        // The CPU stream fails only before running.
        StreamError::Device(m) => unreachable!("CPU stream: {m}"),
    })
}
