//! A request's sequence state and the packing of one iteration's work.
//!
//! Each member of the decode group carries a [`DecodeSeq`] as its request
//! value: its prompt, the tokens generated so far, how many positions are in
//! the KV cache, its KV account (charge and block table, changed only by the
//! [`KvLedger`]) and its timing. Every iteration [`pack`]
//! turns the ready vector into ONE [`BatchPlan`] under a token budget: first
//! one decode token per decoding member, then chunked prefill of prompts with
//! what is left of the budget (FCFS, ready-vector order). [`apply`] folds the
//! device's sampled tokens back into the members and says which are DONE.
//!
//! Positions: the token at position `i` of a sequence is `prompt[i]` for
//! `i < prompt.len()`, else `generated[i - prompt.len()]`. Prefill writes
//! positions `0..prompt.len()` and samples the first generated token; each
//! decode step writes the latest generated token and samples the next, so a
//! request of `p` prompt and `n` output tokens writes `p + n - 1` positions.

use std::time::{Duration, Instant};

use crate::kv::{KvAccount, KvError, KvLedger};
use xtc_model::{BatchPlan, SeqWork};

/// One request of a workload: what the arrival process submits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// Index of the request in the workload (trace row order).
    pub id: usize,
    /// Arrival time relative to the start of the run.
    pub arrival: Duration,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Tokens to generate (>= 1).
    pub output_tokens: usize,
    /// The client cancels the request once it has received this many
    /// generated tokens (`--cancel-rate`; 0 = before the first).
    pub cancel_after: Option<usize>,
}

/// This iteration's share of a member, set by [`pack`], read by [`apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Work {
    /// Token rows run for this member.
    pub n_tokens: usize,
    /// Whether a next token is sampled (last prefill chunk or a decode step).
    pub sample: bool,
}

/// Timestamps of one request (wall clock, `CLOCK_MONOTONIC`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// When the arrival process submitted it.
    pub arrived: Instant,
    /// When it was first in a ready vector (admission).
    pub admitted: Option<Instant>,
    /// When its first generated token was collected.
    pub first_token: Option<Instant>,
    /// When its latest generated token was collected.
    pub last_token: Option<Instant>,
    /// When it left the group (done, cancelled or failed).
    pub finished: Option<Instant>,
    /// Gaps between consecutive generated tokens (inter-token latency).
    pub token_gaps: Vec<Duration>,
}

/// The request value of a decode-group member: one sequence's state.
/// Not `Clone`: it owns its KV account.
#[derive(Debug)]
pub struct DecodeSeq {
    /// Request index (from [`RequestSpec::id`]).
    pub id: usize,
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Tokens to generate at most (the trace's output length).
    pub max_output: usize,
    /// A token that ends the sequence early (EOS of a real model).
    pub stop_token: Option<u32>,
    /// Tokens generated so far (greedy).
    pub generated: Vec<u32>,
    /// Positions already in the KV cache.
    pub pos: usize,
    /// Its share of the KV cache: the charge in blocks reserved at admission
    /// and the block table (ids in position order), both kept by the ledger.
    pub kv: KvAccount,
    /// Cancelled by its client after this many generated tokens, if set.
    pub cancel_after: Option<usize>,
    /// This iteration's work (`None` when the member got no share).
    pub scheduled: Option<Work>,
    /// Timestamps.
    pub timing: Timing,
}

/// The old name of [`DecodeSeq`] (it collided with `model::llama::Sequence`),
/// kept while the `xtc decode` command still names it; use [`DecodeSeq`].
#[doc(hidden)]
pub type Sequence = DecodeSeq;

impl DecodeSeq {
    /// A fresh sequence for `spec`, arrived at `now`, with its KV account
    /// ([`KvLedger::account`] of its prompt and output).
    pub fn new(spec: &RequestSpec, kv: KvAccount, stop_token: Option<u32>, now: Instant) -> Self {
        DecodeSeq {
            id: spec.id,
            prompt: spec.prompt.clone(),
            max_output: spec.output_tokens,
            stop_token,
            generated: Vec::new(),
            pos: 0,
            kv,
            cancel_after: spec.cancel_after,
            scheduled: None,
            timing: Timing {
                arrived: now,
                admitted: None,
                first_token: None,
                last_token: None,
                finished: None,
                token_gaps: Vec::new(),
            },
        }
    }

    /// Positions this sequence may write: `prompt + max_output - 1`.
    pub fn max_positions(&self) -> usize {
        self.prompt.len() + self.max_output - 1
    }

    /// Still prefilling its prompt.
    pub fn is_prefill(&self) -> bool {
        self.pos < self.prompt.len()
    }

    /// Generated all its tokens, or its stop token.
    pub fn is_done(&self) -> bool {
        self.generated.len() >= self.max_output
            || (self.stop_token.is_some() && self.generated.last() == self.stop_token.as_ref())
    }

    /// The token at position `i` (prompt, then generated tokens).
    pub fn token_at(&self, i: usize) -> u32 {
        match i.checked_sub(self.prompt.len()) {
            None => self.prompt[i],
            Some(g) => self.generated[g],
        }
    }

    /// The work this member wants with `budget` token rows left: a prefill
    /// chunk of up to `budget` prompt tokens, or one decode token.
    pub fn want(&self, budget: usize) -> Option<Work> {
        if budget == 0 || self.is_done() {
            return None;
        }
        if self.is_prefill() {
            let n = (self.prompt.len() - self.pos).min(budget);
            return Some(Work {
                n_tokens: n,
                sample: self.pos + n == self.prompt.len(),
            });
        }
        Some(Work {
            n_tokens: 1,
            sample: true,
        })
    }
}

/// Packs the ready vector's work into one plan under `token_budget` rows.
///
/// Decoding members get one row each first (ready-vector order), then
/// prefilling members get chunks of what is left. Each scheduled member's
/// block table grows through the ledger to cover its new positions (blocks
/// its admitted charge reserved). Members left without a share have
/// `scheduled == None`. The plan lists scheduled members in ready-vector
/// order.
///
/// # Errors
/// [`KvError`] when the ledger cannot cover a member (not admitted, or its
/// charge was wrong).
pub fn pack(
    members: &mut [&mut DecodeSeq],
    token_budget: usize,
    kv: &mut KvLedger,
    now: Instant,
) -> Result<BatchPlan, KvError> {
    let mut left = token_budget;
    for pass_prefill in [false, true] {
        for s in members.iter_mut() {
            if pass_prefill == s.is_prefill() {
                s.scheduled = s.want(left);
                left -= s.scheduled.map_or(0, |w| w.n_tokens);
            }
        }
    }
    let mut plan = BatchPlan::default();
    for s in members.iter_mut() {
        let Some(w) = s.scheduled else { continue };
        kv.grow(&mut s.kv, s.pos + w.n_tokens)?;
        s.timing.admitted.get_or_insert(now);
        plan.seqs.push(SeqWork {
            tokens: (s.pos..s.pos + w.n_tokens).map(|i| s.token_at(i)).collect(),
            start_pos: s.pos,
            block_table: s.kv.table().to_vec(),
            sample: w.sample,
        });
    }
    Ok(plan)
}

/// `(prefill rows, decode rows)` of the members' scheduled work (call
/// between [`pack`] and [`apply`]).
pub fn scheduled_rows(members: &[&mut DecodeSeq]) -> (usize, usize) {
    members.iter().fold((0, 0), |(p, d), s| match s.scheduled {
        Some(w) if s.is_prefill() => (p + w.n_tokens, d),
        Some(w) => (p, d + w.n_tokens),
        None => (p, d),
    })
}

/// Whether `s`'s client wants it cancelled now (it has received the tokens
/// after which it cancels, and the sequence is not already done).
pub fn cancel_due(s: &DecodeSeq) -> bool {
    !s.is_done() && s.cancel_after.is_some_and(|k| s.generated.len() >= k)
}

/// What [`apply`] decided for a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Stays in the group for another iteration.
    Continue,
    /// Generated its last token: leaves the group DONE.
    Done,
}

/// Error of [`apply`]: the device returned a different number of tokens
/// than the plan sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("device returned {got} tokens for {want} sampled sequences")]
pub struct TokenCountMismatch {
    /// Sampled sequences in the plan.
    pub want: usize,
    /// Tokens returned.
    pub got: usize,
}

/// Folds one iteration's sampled `tokens` (plan order) into the members
/// [`pack`] scheduled, advancing positions and timing; returns each member's
/// outcome (ready-vector order).
///
/// # Errors
/// [`TokenCountMismatch`] (nothing is changed then).
pub fn apply(
    members: &mut [&mut DecodeSeq],
    tokens: &[u32],
    now: Instant,
) -> Result<Vec<Outcome>, TokenCountMismatch> {
    let want = members
        .iter()
        .filter(|s| s.scheduled.is_some_and(|w| w.sample))
        .count();
    if want != tokens.len() {
        return Err(TokenCountMismatch {
            want,
            got: tokens.len(),
        });
    }
    let mut next = tokens.iter();
    let outcomes = members
        .iter_mut()
        .map(|s| {
            if let Some(w) = s.scheduled.take() {
                s.pos += w.n_tokens;
                if w.sample {
                    push_token(s, *next.next().expect("counted above"), now);
                }
            }
            if s.is_done() {
                Outcome::Done
            } else {
                Outcome::Continue
            }
        })
        .collect();
    Ok(outcomes)
}

fn push_token(s: &mut DecodeSeq, token: u32, now: Instant) {
    s.generated.push(token);
    let t = &mut s.timing;
    match t.last_token {
        None => t.first_token = Some(now),
        Some(prev) => t.token_gaps.push(now - prev),
    }
    t.last_token = Some(now);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An admitted member of `kv`.
    fn seq(kv: &mut KvLedger, id: usize, prompt: usize, out: usize) -> DecodeSeq {
        let spec = RequestSpec {
            id,
            arrival: Duration::ZERO,
            prompt: (0..prompt as u32).map(|t| t + 100 * id as u32).collect(),
            output_tokens: out,
            cancel_after: None,
        };
        let mut acct = kv.account(prompt, out);
        kv.admit(&mut acct).unwrap();
        DecodeSeq::new(&spec, acct, None, Instant::now())
    }

    #[test]
    fn decodes_first_then_prefill_chunks_fill_the_budget() {
        let mut kv = KvLedger::new(64, 4).unwrap();
        let mut a = seq(&mut kv, 0, 10, 3);
        let mut b = seq(&mut kv, 1, 2, 5);
        let now = Instant::now();
        // iteration 1: budget 6 -> a gets 6 prefill rows, b none
        let plan = pack(&mut [&mut a, &mut b], 6, &mut kv, now).unwrap();
        assert_eq!(plan.n_tokens(), 6);
        assert_eq!(plan.seqs.len(), 1);
        assert!(!plan.seqs[0].sample);
        assert_eq!(a.kv.table().len(), 2);
        assert_eq!(
            apply(&mut [&mut a, &mut b], &[], now).unwrap(),
            [Outcome::Continue; 2]
        );
        // iteration 2: a's last 4 prompt rows (sampled) + b's whole prompt (2)
        let plan = pack(&mut [&mut a, &mut b], 6, &mut kv, now).unwrap();
        assert_eq!(plan.seqs.len(), 2);
        assert_eq!(plan.seqs[0].tokens, vec![6, 7, 8, 9]);
        assert_eq!(plan.seqs[0].start_pos, 6);
        assert!(plan.seqs[0].sample && plan.seqs[1].sample);
        apply(&mut [&mut a, &mut b], &[42, 43], now).unwrap();
        // iteration 3: both decode one token: a feeds 42 at position 10
        let plan = pack(&mut [&mut a, &mut b], 6, &mut kv, now).unwrap();
        assert_eq!(plan.seqs[0].tokens, vec![42]);
        assert_eq!(plan.seqs[0].start_pos, 10);
        assert_eq!(plan.seqs[1].tokens, vec![43]);
        assert_eq!(plan.seqs[1].start_pos, 2);
        let out = apply(&mut [&mut a, &mut b], &[1, 2], now).unwrap();
        assert_eq!(out, [Outcome::Continue; 2]);
        assert_eq!(a.generated, vec![42, 1]);
        assert_eq!(a.timing.token_gaps.len(), 1);
    }

    #[test]
    fn decode_members_come_before_prefill_when_budget_is_short() {
        let mut kv = KvLedger::new(64, 4).unwrap();
        let mut a = seq(&mut kv, 0, 8, 4);
        let mut b = seq(&mut kv, 1, 1, 4);
        let now = Instant::now();
        pack(&mut [&mut b], 1, &mut kv, now).unwrap();
        apply(&mut [&mut b], &[5], now).unwrap();
        // a (prefill) is first in the ready vector, but b's decode row goes first
        let plan = pack(&mut [&mut a, &mut b], 3, &mut kv, now).unwrap();
        assert_eq!(a.scheduled.unwrap().n_tokens, 2);
        assert_eq!(b.scheduled.unwrap().n_tokens, 1);
        assert_eq!(plan.seqs[1].tokens, vec![5]);
        let plan = pack(&mut [&mut a, &mut b], 1, &mut kv, now);
        assert_eq!(plan.unwrap().seqs.len(), 1);
        assert!(a.scheduled.is_none());
    }

    #[test]
    fn done_at_output_length_or_stop_token() {
        let mut kv = KvLedger::new(8, 4).unwrap();
        let mut a = seq(&mut kv, 0, 1, 2);
        let now = Instant::now();
        pack(&mut [&mut a], 4, &mut kv, now).unwrap();
        assert_eq!(
            apply(&mut [&mut a], &[9], now).unwrap(),
            [Outcome::Continue]
        );
        pack(&mut [&mut a], 4, &mut kv, now).unwrap();
        assert_eq!(apply(&mut [&mut a], &[9], now).unwrap(), [Outcome::Done]);
        assert_eq!(a.pos, a.max_positions());
        let mut b = seq(&mut kv, 1, 1, 5);
        b.stop_token = Some(2);
        pack(&mut [&mut b], 4, &mut kv, now).unwrap();
        assert_eq!(apply(&mut [&mut b], &[2], now).unwrap(), [Outcome::Done]);
        assert!(b.want(4).is_none());
    }

    #[test]
    fn token_count_mismatch_is_an_error() {
        let mut kv = KvLedger::new(8, 4).unwrap();
        let mut a = seq(&mut kv, 0, 3, 2);
        let now = Instant::now();
        pack(&mut [&mut a], 4, &mut kv, now).unwrap();
        let e = apply(&mut [&mut a], &[], now).unwrap_err();
        assert_eq!(e, TokenCountMismatch { want: 1, got: 0 });
        assert_eq!(a.pos, 0);
    }
}
