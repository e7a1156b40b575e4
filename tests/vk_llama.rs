//! SmolLM2-135M-Instruct (Q4_1 GGUF) on the Vulkan device ([`GpuLlama`])
//! against the CPU reference ([`Llama::forward`]): the ChatML answer, and
//! identical greedy tokens for 16 prompts x 48 tokens with members joining
//! and leaving and prefill in chunks, final logits within tolerance. Needs
//! the model file and a Vulkan device (lavapipe in CI); with `CI` set a
//! missing one fails.

mod model_support;
mod vk_support;

use xtc::decode::model::gpu_llama::{GpuLlama, GpuLlamaOptions};
use xtc::decode::model::llama::{Chunk, Logits, Sequence};
use xtc::decode::model::sampling::argmax;
use xtc::decode::model::{BatchPlan, KvGeometry, SeqWork, chat};

const BLOCK: usize = 16;
/// KV blocks per member (positions 0..BLOCKS_PER * BLOCK).
const BLOCKS_PER: usize = 8;

fn options(members: usize) -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: members * BLOCKS_PER,
        },
        max_tokens: 128,
        max_seqs: members,
        max_context: BLOCK * BLOCKS_PER,
        keep_logits: true,
        variant: None,
    }
}

/// Block table of member `i`: every other block of its share, backwards, so
/// tables are scattered and members interleave in the cache.
fn blocks(i: usize, members: usize) -> Vec<u32> {
    (0..BLOCKS_PER)
        .rev()
        .map(|b| (b * members + i) as u32)
        .collect()
}

#[test]
fn greedy_answer_is_paris_on_vulkan() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut gpu = GpuLlama::new(&dev, m, options(1)).unwrap();
    let (w, f32s, kv) = gpu.memory_bytes();
    assert!(w < 100_000_000, "quantized weights take {w} bytes");
    eprintln!("device memory: weights {w} B, f32 {f32s} B, KV {kv} B");
    let prompt = chat::user_prompt(t, "What is the capital of France?").unwrap();
    let table = blocks(0, 1);
    let mut pos = 0;
    let mut next = prompt.clone();
    let mut out = vec![];
    for _ in 0..32 {
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: next.clone(),
                start_pos: pos,
                block_table: table.clone(),
                sample: true,
            }],
        };
        let tok = gpu.step(&plan).unwrap()[0];
        pos += next.len();
        if tok == t.eos() {
            break;
        }
        out.push(tok);
        next = vec![tok];
    }
    assert_eq!(t.decode(&out), "The capital of France is Paris.");
}

const PROMPTS: [&str; 16] = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "What is 12 times 12?",
    "Who wrote Romeo and Juliet?",
    "Explain photosynthesis in one sentence.",
    "What is the boiling point of water in Celsius?",
    "Give me a synonym for happy.",
    "What planet is known as the Red Planet?",
    "Translate 'good morning' into Spanish.",
    "What is the largest ocean on Earth?",
    "List two uses of a paperclip.",
    "Why is the sky blue?",
    "What does a thermometer measure?",
    "Suggest a name for a pet turtle.",
];

/// Generated tokens per member.
const GEN: usize = 48;
/// Prompt tokens per prefill chunk.
const CHUNK: usize = 7;

struct Member {
    prompt: Vec<u32>,
    fed: usize,
    out: Vec<u32>,
    seq: Sequence,
    table: Vec<u32>,
    join_at: usize,
}

#[test]
fn vulkan_and_cpu_reference_agree_on_16_prompts_x_48_tokens() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let n = PROMPTS.len();
    let mut gpu = GpuLlama::new(&dev, m, options(n)).unwrap();
    let mut members: Vec<Member> = PROMPTS
        .iter()
        .enumerate()
        .map(|(i, p)| Member {
            prompt: chat::user_prompt(t, p).unwrap(),
            fed: 0,
            out: vec![],
            seq: m.new_sequence(),
            table: blocks(i, n),
            // Two members join every iteration; later ones wait.
            join_at: i / 2,
        })
        .collect();
    let (mut worst, mut worst_at) = (0f32, String::new());
    let mut it = 0;
    while members.iter().any(|s| s.out.len() < GEN) {
        let active: Vec<usize> = (0..n)
            .filter(|&i| members[i].join_at <= it && members[i].out.len() < GEN)
            .collect();
        let mut plan = BatchPlan::default();
        let mut work = vec![];
        for &i in &active {
            let s = &members[i];
            let (tokens, sample) = if s.fed < s.prompt.len() {
                let end = (s.fed + CHUNK).min(s.prompt.len());
                (s.prompt[s.fed..end].to_vec(), end == s.prompt.len())
            } else {
                (vec![*s.out.last().unwrap()], true)
            };
            plan.seqs.push(SeqWork {
                tokens: tokens.clone(),
                start_pos: s.seq.len(),
                block_table: s.table.clone(),
                sample,
            });
            work.push((i, tokens, sample));
        }
        let f = gpu.submit(&plan).unwrap();
        let (gpu_toks, gpu_logits) = gpu.finish_with_logits(f).unwrap();
        let mut chunks: Vec<Chunk> = vec![];
        let mut by_index: Vec<&mut Member> = members.iter_mut().collect();
        let mut picked: Vec<&mut Member> = vec![];
        for (i, _, _) in work.iter().rev() {
            picked.push(by_index.remove(*i));
        }
        picked.reverse();
        for (mem, (_, tokens, sample)) in picked.iter_mut().zip(&work) {
            chunks.push(Chunk {
                seq: &mut mem.seq,
                tokens,
                logits: if *sample { Logits::Last } else { Logits::None },
            });
        }
        let cpu = m.forward(&mut chunks).unwrap();
        drop(chunks);
        let mut k = 0;
        for (j, (mem, (i, tokens, sample))) in picked.iter_mut().zip(&work).enumerate() {
            if mem.fed < mem.prompt.len() {
                mem.fed += tokens.len();
            }
            if !*sample {
                continue;
            }
            let want = argmax(&cpu[j]);
            let err = vk_support::max_abs_diff(&gpu_logits[k], &cpu[j]);
            if err > worst {
                worst = err;
                worst_at = format!("member {i} token {}", mem.out.len());
            }
            assert_eq!(
                gpu_toks[k],
                want,
                "member {i} ({:?}) token {}: Vulkan {} vs CPU {} (logits differ by up to {err})",
                PROMPTS[*i],
                mem.out.len(),
                gpu_toks[k],
                want
            );
            mem.out.push(want);
            k += 1;
        }
        it += 1;
    }
    eprintln!("worst logit difference {worst} at {worst_at} over {it} iterations");
    assert!(worst < 2e-3, "worst logit difference {worst} at {worst_at}");
    for s in &members {
        assert_eq!(s.out.len(), GEN);
    }
}
