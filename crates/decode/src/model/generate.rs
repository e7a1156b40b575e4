//! One stream's generation loop on a device ([`Stream`]: the CPU reference
//! or a Vulkan device): prefill the prompt,
//! then decode token by token until EOS, the token limit or the context
//! length, handing each token to the caller as it comes; with timings.
//!
//! Prefill runs the prompt in chunks of [`PREFILL_CHUNK`] tokens (all rows
//! of a chunk share one pass over the weights); its last logits give the
//! first generated token. Each later token is one decode step (one forward
//! pass of one row). EOS ends the stream and is reported to the caller but
//! counted as generated.

use std::time::{Duration, Instant};

use super::cpu::llama::{ForwardError, Llama, Logits, Sequence};
use super::stream::{CpuStream, Stream, StreamError};
use super::text::sampling::Sampler;

/// Prompt tokens run per prefill pass.
pub const PREFILL_CHUNK: usize = 256;

/// Why generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The model produced an end-of-sequence token.
    Eos,
    /// `max_tokens` were generated.
    MaxTokens,
    /// The sequence reached the model's context length.
    ContextFull,
    /// The caller's callback asked to stop.
    Caller,
}

/// What a generation did and how long it took.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GenerateStats {
    /// Prompt tokens prefilled.
    pub prompt_tokens: usize,
    /// Tokens generated (an EOS included).
    pub generated_tokens: usize,
    /// Decode steps run (forward passes of one token).
    pub decode_steps: usize,
    /// Prefill time, through the first token's sampling.
    #[serde(serialize_with = "secs")]
    pub prefill: Duration,
    /// Time of the decode steps (and their sampling).
    #[serde(serialize_with = "secs")]
    pub decode: Duration,
    /// Why it stopped.
    pub stop: StopReason,
}

fn secs<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

impl GenerateStats {
    /// Prompt tokens per second of prefill.
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prefill.as_secs_f64()
    }
    /// Decode steps per second: one stream's generation speed.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_steps as f64 / self.decode.as_secs_f64()
    }
}

/// Generates after `prompt` on a fresh sequence of the CPU reference (as
/// [`generate_on`] over a [`CpuStream`]); returns the sequence's KV cache too.
///
/// # Errors
/// [`ForwardError`] for an empty prompt, a token outside the vocabulary or a
/// prompt longer than the context.
pub fn generate(
    model: &Llama,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    sampler: &mut Sampler,
    on_token: impl FnMut(u32) -> bool,
) -> Result<(Sequence, GenerateStats), ForwardError> {
    let mut stream = CpuStream::new(model);
    match generate_on(&mut stream, prompt, max_tokens, stop_ids, sampler, on_token) {
        Ok(stats) => Ok((stream.into_sequence(), stats)),
        Err(StreamError::Forward(e)) => Err(e),
        // The CPU stream fails only before running.
        Err(StreamError::Device(m)) => unreachable!("CPU stream: {m}"),
    }
}

/// Generates after `prompt` on `stream` (reset first): at most
/// `max_tokens`, stopping at any id in `stop_ids`. `on_token(id)` sees each
/// generated id as it comes and returns whether to go on.
///
/// # Errors
/// [`StreamError::Forward`] for an empty prompt, a token outside the
/// vocabulary or a prompt longer than the context;
/// [`StreamError::Device`] for a device failure.
pub fn generate_on(
    stream: &mut dyn Stream,
    prompt: &[u32],
    max_tokens: usize,
    stop_ids: &[u32],
    sampler: &mut Sampler,
    mut on_token: impl FnMut(u32) -> bool,
) -> Result<GenerateStats, StreamError> {
    stream.reset();
    let t0 = Instant::now();
    if prompt.is_empty() {
        return Err(ForwardError::Empty { chunk: 0 }.into());
    }
    let mut logits = Vec::new();
    let n_chunks = prompt.len().div_ceil(PREFILL_CHUNK);
    for (i, part) in prompt.chunks(PREFILL_CHUNK).enumerate() {
        let want = if i + 1 == n_chunks {
            Logits::Last
        } else {
            Logits::None
        };
        logits = stream.forward(part, want)?;
    }
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        generated_tokens: 0,
        decode_steps: 0,
        prefill: Duration::ZERO,
        decode: Duration::ZERO,
        stop: StopReason::MaxTokens,
    };
    let ctx = stream.context();
    let mut t_decode = None;
    loop {
        if stats.generated_tokens >= max_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        let id = sampler.sample(&logits);
        stats.generated_tokens += 1;
        if t_decode.is_none() {
            stats.prefill = t0.elapsed();
            t_decode = Some(Instant::now());
        }
        let go_on = on_token(id);
        if stop_ids.contains(&id) {
            stats.stop = StopReason::Eos;
            break;
        }
        if !go_on {
            stats.stop = StopReason::Caller;
            break;
        }
        if stats.generated_tokens >= max_tokens {
            stats.stop = StopReason::MaxTokens;
            break;
        }
        if stream.len() >= ctx {
            stats.stop = StopReason::ContextFull;
            break;
        }
        logits = stream.forward(&[id], Logits::Last)?;
        stats.decode_steps += 1;
    }
    match t_decode {
        Some(t) => stats.decode = t.elapsed(),
        None => stats.prefill = t0.elapsed(),
    }
    Ok(stats)
}
