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
/// `max_tokens`, stopping at any id in `stop_ids` or when the sequence
/// fills the stream's context. `on_token(id)` sees each generated id as it
/// comes and returns whether to go on.
///
/// # Errors
/// [`StreamError::Forward`] for an empty prompt, a token outside the
/// vocabulary or a prompt longer than the context
/// ([`ForwardError::ContextFull`], refused before any position is
/// computed); [`StreamError::Device`] for a device failure.
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
    // Refused up front: a prompt past the context would otherwise prefill
    // every chunk that fits (minutes for thousands of positions) first.
    if prompt.len() > stream.context() {
        return Err(ForwardError::ContextFull {
            chunk: 0,
            len: 0,
            adding: prompt.len(),
            max: stream.context(),
        }
        .into());
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::sampling::SamplingParams;

    /// A stream of `context` positions over a 4-token vocabulary that counts
    /// the positions it was asked to compute (token 1 is always greedy).
    struct Counting {
        context: usize,
        len: usize,
        computed: usize,
    }

    impl Stream for Counting {
        fn len(&self) -> usize {
            self.len
        }
        fn context(&self) -> usize {
            self.context
        }
        fn vocab_size(&self) -> usize {
            4
        }
        fn forward(&mut self, tokens: &[u32], _want: Logits) -> Result<Vec<f32>, StreamError> {
            if self.len + tokens.len() > self.context {
                return Err(ForwardError::ContextFull {
                    chunk: 0,
                    len: self.len,
                    adding: tokens.len(),
                    max: self.context,
                }
                .into());
            }
            self.len += tokens.len();
            self.computed += tokens.len();
            Ok(vec![0.0, 1.0, 0.0, 0.0])
        }
        fn reset(&mut self) {
            self.len = 0;
        }
        fn device(&self) -> String {
            "counting".into()
        }
    }

    fn greedy() -> Sampler {
        Sampler::new(SamplingParams::default()).unwrap()
    }

    /// Issue 22: a 9,010-token prompt on an 8,192-position model prefilled
    /// 8,192 positions (about 90 s on the CPU reference) before failing. A
    /// prompt past the context is now refused before any position runs.
    #[test]
    fn a_prompt_past_the_context_is_refused_before_any_prefill() {
        let mut s = Counting {
            context: 8192,
            len: 0,
            computed: 0,
        };
        let prompt = vec![2u32; 9010];
        let e = generate_on(&mut s, &prompt, 256, &[], &mut greedy(), |_| true).unwrap_err();
        assert_eq!(
            e,
            StreamError::Forward(ForwardError::ContextFull {
                chunk: 0,
                len: 0,
                adding: 9010,
                max: 8192
            })
        );
        assert_eq!(s.computed, 0, "no position was computed");
    }

    /// A prompt that fits runs, and generation stops when the context is
    /// full (the command checks prompt + `max_tokens` itself).
    #[test]
    fn a_prompt_that_fits_runs_up_to_the_context() {
        let mut s = Counting {
            context: 600,
            len: 0,
            computed: 0,
        };
        let prompt = vec![2u32; 590];
        let stats = generate_on(&mut s, &prompt, 256, &[], &mut greedy(), |_| true).unwrap();
        assert_eq!(stats.stop, StopReason::ContextFull);
        assert_eq!(s.computed, 600);
        assert_eq!(stats.generated_tokens, 11, "600 - 590 positions + 1");
    }
}
