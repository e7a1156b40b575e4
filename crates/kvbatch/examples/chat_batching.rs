//! KV-cache continuous batching of a real chat model, step by step.
//!
//! Run with `cargo run --release --example chat_batching` (needs the model
//! file: `scripts/fetch-model.sh`). The mechanics of `kv_batching`, on
//! SmolLM2-135M-Instruct (Q4_1 GGUF) and the CPU reference: four chat
//! questions arrive at different iterations as ChatML prompts. Each request's
//! *charge* is the KV-cache blocks its prompt and longest answer may need; it
//! is *admitted* (FCFS) only when that fits in what the cache has left, so
//! the third question waits until the first answers free their blocks.
//! Every iteration packs the *ready vector* into ONE plan under a token
//! budget: a decode row per decoding member first, then chunks of prompts
//! still being prefilled (a 30-token prompt takes two iterations at a budget
//! of 16). The model runs the plan over its paged KV cache, reading each
//! member's history through its *block table*; a member leaves DONE at
//! `<|im_end|>` or its output limit and its blocks return to the cache at
//! once.
//!
//! At the end every answer is printed as text and checked against decoding
//! that question alone on the contiguous (unpaged) forward pass: batching
//! changes when a token is computed, never which token.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use xtc_kvbatch::kv::KvLedger;
use xtc_kvbatch::seq::{self, DecodeSeq, Outcome, RequestSpec};
use xtc_model::Model;
use xtc_model::adapters::CpuModel;
use xtc_model::cpu::llama::{Chunk, Llama, Logits};
use xtc_model::text::bpe::Bpe;
use xtc_model::text::chat::user_prompt;
use xtc_model::text::sampling::argmax;
use xtc_model::{KvGeometry, find_model};

const BLOCK_SIZE: usize = 16;
const KV_BLOCKS: usize = 10;
const TOKEN_BUDGET: usize = 16;
const MAX_ANSWER: usize = 24;

/// (arrival iteration, question)
const QUESTIONS: [(usize, &str); 4] = [
    (0, "What is the capital of France?"),
    (0, "Name three primary colours."),
    (1, "What is the largest planet in the solar system?"),
    (3, "How many days are in a week?"),
];

/// Runs the example.
///
/// # Errors
/// As [`run`].
pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    run().map(|_| ())
}

/// Runs the example; returns each question's answer as token ids, in
/// question order.
///
/// # Errors
/// A missing or bad model file, or a device error.
pub fn run() -> Result<Vec<Vec<u32>>, Box<dyn std::error::Error>> {
    let path = find_model(None)?;
    let llama = Arc::new(Llama::load(&path)?);
    let tok = Bpe::from_gguf(llama.gguf())?;
    let eos = tok.eos();
    let geometry = KvGeometry {
        block_size: BLOCK_SIZE,
        n_blocks: KV_BLOCKS,
    };
    let mut model = CpuModel::llama(llama.clone(), geometry, "SmolLM2-135M-Instruct");
    let mut kv = KvLedger::new(KV_BLOCKS, BLOCK_SIZE)?;
    let specs = QUESTIONS
        .iter()
        .enumerate()
        .map(|(id, &(_, q))| {
            Ok(RequestSpec {
                id,
                arrival: Duration::ZERO,
                prompt: user_prompt(&tok, q)?,
                output_tokens: MAX_ANSWER,
                cancel_after: None,
            })
        })
        .collect::<Result<Vec<_>, Box<dyn std::error::Error>>>()?;
    println!(
        "{}: KV cache {KV_BLOCKS} blocks x {BLOCK_SIZE} positions; token budget {TOKEN_BUDGET}\n",
        model.describe()
    );
    let (mut waiting, mut active) = (VecDeque::<DecodeSeq>::new(), Vec::<DecodeSeq>::new());
    let mut finished = Vec::new();
    for iter in 0.. {
        // 1. arrivals: a request's charge covers its prompt and longest answer
        for (spec, &(at, q)) in specs.iter().zip(&QUESTIONS) {
            if at == iter {
                let account = kv.account(spec.prompt.len(), spec.output_tokens);
                println!(
                    "iter {iter}: r{} arrives ({} prompt tokens, charge {} blocks): {q:?}",
                    spec.id,
                    spec.prompt.len(),
                    account.charge()
                );
                waiting.push_back(DecodeSeq::new(spec, account, Some(eos), Instant::now()));
            }
        }
        // 2. FCFS admission while the charge fits in the cache
        while let Some(s) = waiting.front() {
            if !kv.fits(&s.kv) {
                println!(
                    "iter {iter}: r{} waits (needs {} blocks, {} unreserved)",
                    s.id,
                    s.kv.charge(),
                    KV_BLOCKS as u64 - kv.reserved()
                );
                break;
            }
            let mut s = waiting.pop_front().expect("front exists");
            kv.admit(&mut s.kv)?;
            active.push(s);
        }
        if active.is_empty() && waiting.is_empty() && iter >= QUESTIONS[3].0 {
            break;
        }
        // 3. one plan for the whole ready vector
        let mut members: Vec<&mut DecodeSeq> = active.iter_mut().collect();
        let plan = seq::pack(&mut members, TOKEN_BUDGET, &mut kv, Instant::now())?;
        let shares: Vec<String> = members
            .iter()
            .filter(|s| s.scheduled.is_some())
            .zip(&plan.seqs)
            .map(|(s, w)| {
                let kind = if s.is_prefill() { "prefill" } else { "decode" };
                format!(
                    "r{} {kind} {}..{}",
                    s.id,
                    w.start_pos,
                    w.start_pos + w.tokens.len()
                )
            })
            .collect();
        println!(
            "iter {iter}: ready vector of {} -> {} rows: {}",
            members.len(),
            plan.n_tokens(),
            shares.join(", ")
        );
        // 4. the model runs the plan; sampled tokens come back in plan order
        // (the CPU model hands back its compute: wait_here runs it here)
        model.launch(&plan)?.wait_here();
        let tokens = model.finish()?;
        let outcomes = seq::apply(&mut members, &tokens, Instant::now())?;
        // 5. DONE members leave and free their blocks
        for (mut s, o) in std::mem::take(&mut active).into_iter().zip(outcomes) {
            if o == Outcome::Done {
                kv.free(&mut s.kv)?;
                println!(
                    "iter {iter}: r{} DONE after {} tokens; {} blocks in use",
                    s.id,
                    s.generated.len(),
                    kv.used()
                );
                finished.push(s);
            } else {
                active.push(s);
            }
        }
    }
    finished.sort_by_key(|s| s.id);
    println!();
    for s in &finished {
        let answer: Vec<u32> = s.generated.iter().copied().filter(|&t| t != eos).collect();
        println!(
            "r{}: {:?} -> {:?}",
            s.id,
            QUESTIONS[s.id].1,
            tok.decode(&answer)
        );
        let alone = greedy_alone(&llama, &s.prompt, MAX_ANSWER, eos)?;
        assert_eq!(
            s.generated, alone,
            "r{} differs from decoding it alone",
            s.id
        );
    }
    println!(
        "\nevery answer is the one the question gets alone; KV peak {} of {KV_BLOCKS} blocks",
        kv.peak_used()
    );
    Ok(finished.into_iter().map(|s| s.generated).collect())
}

/// Greedy tokens of `prompt` alone on the contiguous forward pass: at most
/// `n`, ending after `eos`.
fn greedy_alone(
    m: &Llama,
    prompt: &[u32],
    n: usize,
    eos: u32,
) -> Result<Vec<u32>, Box<dyn std::error::Error>> {
    let mut seq = m.new_sequence();
    let (mut out, mut next) = (Vec::new(), prompt.to_vec());
    while out.len() < n && out.last() != Some(&eos) {
        let logits = m.forward(&mut [Chunk {
            seq: &mut seq,
            tokens: &next,
            logits: Logits::Last,
        }])?;
        let t = argmax(&logits[0]);
        out.push(t);
        next = vec![t];
    }
    Ok(out)
}
