//! KV-cache continuous batching, step by step.
//!
//! Run with `cargo run --example kv_batching`. Four requests arrive at
//! different iterations. Each has a *charge*: the KV-cache blocks its prompt
//! and output may need. A request is *admitted* (FCFS) only when its charge
//! fits in what the cache has left, so a member can never run out of blocks.
//! Every iteration packs the *ready vector* into ONE plan under a token
//! budget: one decode token per decoding member first, then chunks of the
//! prompts still being prefilled. The device (here the toy model, whose next
//! token is a hash of the sequence read back through its *block table*) runs
//! the plan; members leave DONE at their output length and their blocks go
//! back to the cache at once, so waiting requests join mid-run. One type keeps
//! the books: the KV ledger charges, admits, grows and frees.
//!
//! At the end every request's tokens are checked against decoding it alone.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use xtc_kvbatch::kv::KvLedger;
use xtc_kvbatch::seq::{self, DecodeSeq, Outcome, RequestSpec};
use xtc_model::Model;
use xtc_model::adapters::{ToyModel, toy_reference};

const VOCAB: usize = 1000;
const BLOCK_SIZE: usize = 4;
const KV_BLOCKS: usize = 10;
const TOKEN_BUDGET: usize = 6;

/// (arrival iteration, prompt length, output length)
const REQUESTS: [(usize, usize, usize); 4] = [(0, 9, 3), (0, 3, 6), (1, 5, 2), (2, 12, 4)];

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut kv = KvLedger::new(KV_BLOCKS, BLOCK_SIZE)?;
    let mut model = ToyModel::new(VOCAB, KV_BLOCKS, BLOCK_SIZE);
    let specs: Vec<RequestSpec> = REQUESTS
        .iter()
        .enumerate()
        .map(|(id, &(_, p, o))| RequestSpec {
            id,
            arrival: Duration::ZERO,
            prompt: (0..p as u32).map(|t| 10 * id as u32 + t).collect(),
            output_tokens: o,
            cancel_after: None,
        })
        .collect();
    let mut waiting: VecDeque<DecodeSeq> = VecDeque::new();
    let mut active: Vec<DecodeSeq> = Vec::new();
    let mut finished = Vec::new();
    println!(
        "KV cache: {KV_BLOCKS} blocks x {BLOCK_SIZE} positions; token budget {TOKEN_BUDGET}\n"
    );
    for iter in 0.. {
        // 1. arrivals: a request's charge covers its prompt and output
        for (spec, &(at, _, _)) in specs.iter().zip(&REQUESTS) {
            if at == iter {
                let account = kv.account(spec.prompt.len(), spec.output_tokens);
                println!(
                    "iter {iter}: request {} arrives, charge {} blocks",
                    spec.id,
                    account.charge()
                );
                waiting.push_back(DecodeSeq::new(spec, account, None, Instant::now()));
            }
        }
        // 2. FCFS admission while the charge fits in the cache
        while let Some(s) = waiting.front() {
            if !kv.fits(&s.kv) {
                println!(
                    "iter {iter}: request {} waits (needs {} blocks, {} free)",
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
        if active.is_empty() && waiting.is_empty() && iter > 2 {
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
                    "r{} {kind} pos {}..{} blocks {:?}",
                    s.id,
                    w.start_pos,
                    w.start_pos + w.tokens.len(),
                    w.block_table
                )
            })
            .collect();
        println!(
            "iter {iter}: ready vector of {} -> {} rows: {}",
            members.len(),
            plan.n_tokens(),
            shares.join("; ")
        );
        // 4. the device runs it; sampled tokens come back in plan order
        // (host models hand back their compute: wait_here runs it here)
        model.launch(&plan)?.wait_here();
        let tokens = model.finish()?;
        let outcomes = seq::apply(&mut members, &tokens, Instant::now())?;
        // 5. DONE members leave and free their blocks
        for (mut s, o) in std::mem::take(&mut active).into_iter().zip(outcomes) {
            if o == Outcome::Done {
                kv.free(&mut s.kv)?;
                println!(
                    "iter {iter}: request {} DONE with {:?}; {} blocks in use",
                    s.id,
                    s.generated,
                    kv.used()
                );
                finished.push(s);
            } else {
                active.push(s);
            }
        }
    }
    for s in &finished {
        assert_eq!(s.generated, toy_reference(&s.prompt, s.max_output, VOCAB));
    }
    println!(
        "\nevery request decoded exactly as it would alone; KV peak {} of {KV_BLOCKS} blocks",
        kv.peak_used()
    );
    Ok(())
}
