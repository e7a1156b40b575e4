//! Real-text prompts for a workload: each request's prompt becomes a window
//! of a token corpus (a public-domain text tokenized with the model's
//! tokenizer by the caller), of the request's scaled prompt length, at a
//! seeded offset; the windows wrap around the corpus's end. `xtc decode`
//! uses it for GGUF models, whose prompts are English text rather than
//! random ids.
//!
//! Only the prompt tokens change: arrivals, lengths and cancellations stay
//! those [`crate::job::workload`] drew from the same seed.

use crate::job::Workload;

/// Seed salt of the window offsets (so they differ from the draws of the
/// workload's own seed).
const SALT: u64 = 0x7e47_5769_6e64_6f77;

/// Replaces every prompt of `wl` by a window of `corpus` of the same length
/// (`wl`'s prompt lengths are kept), the windows starting at distinct seeded
/// offsets while the corpus has room for them (each request gets its own
/// text), wrapping around the corpus's end.
///
/// # Errors
/// [`EmptyCorpus`] when the corpus has no tokens (nothing to cut prompts
/// from).
pub fn text_windows(wl: &mut Workload, corpus: &[u32], seed: u64) -> Result<(), EmptyCorpus> {
    if corpus.is_empty() {
        return Err(EmptyCorpus);
    }
    let mut rng = fastrand::Rng::with_seed(seed ^ SALT);
    let mut used = std::collections::HashSet::new();
    for r in &mut wl.requests {
        let mut start = rng.usize(0..corpus.len());
        // Distinct offsets while there are offsets left (a few redraws).
        for _ in 0..8 {
            if used.len() >= corpus.len() || used.insert(start) {
                break;
            }
            start = rng.usize(0..corpus.len());
        }
        let n = r.prompt.len();
        r.prompt = corpus.iter().copied().cycle().skip(start).take(n).collect();
    }
    Ok(())
}

/// A prompt corpus without tokens ([`text_windows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the prompt text has no tokens")]
pub struct EmptyCorpus;

/// The text of [`EmptyCorpus`], for callers whose own errors are still
/// strings (the `xtc decode` command).
impl From<EmptyCorpus> for String {
    fn from(e: EmptyCorpus) -> String {
        e.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job;
    use crate::trace::{Scaling, Trace, TraceRequest};
    use std::time::Duration;

    fn wl(lengths: &[usize]) -> Workload {
        let t = Trace {
            requests: lengths
                .iter()
                .map(|&n| TraceRequest {
                    arrival: Duration::ZERO,
                    prompt_tokens: n,
                    output_tokens: 2,
                })
                .collect(),
        };
        job::workload(&t, lengths.len(), &Scaling::IDENTITY, 1000, 7, 0.5)
    }

    #[test]
    fn prompts_are_windows_of_the_corpus_keeping_everything_else() {
        let corpus: Vec<u32> = (100..200).collect();
        let before = wl(&[5, 30, 1, 250]);
        let mut after = before.clone();
        text_windows(&mut after, &corpus, 7).unwrap();
        let mut starts = vec![];
        for (a, b) in after.requests.iter().zip(&before.requests) {
            assert_eq!(a.prompt.len(), b.prompt.len());
            assert_eq!(
                (a.id, a.arrival, a.output_tokens, a.cancel_after),
                (b.id, b.arrival, b.output_tokens, b.cancel_after)
            );
            // Consecutive corpus tokens, wrapping at the end.
            for w in a.prompt.windows(2) {
                assert_eq!(w[1], if w[0] == 199 { 100 } else { w[0] + 1 });
            }
            starts.push(a.prompt[0]);
        }
        starts.sort_unstable();
        starts.dedup();
        assert_eq!(starts.len(), 4, "each request its own window");
        let mut again = before.clone();
        text_windows(&mut again, &corpus, 7).unwrap();
        assert_eq!(again, after, "seeded");
        let mut other = before;
        text_windows(&mut other, &corpus, 8).unwrap();
        assert_ne!(other, after);
        assert!(text_windows(&mut other, &[], 1).is_err());
    }
}
