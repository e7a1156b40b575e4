//! SmolLM2-135M-Instruct (Q4_1 GGUF) on the Vulkan device ([`GpuLlama`])
//! against the CPU reference ([`Llama::forward`]): the ChatML answer, and
//! identical greedy tokens for 16 prompts x 48 tokens, in both kernel forms,
//! with members joining and leaving and prefill in chunks, final logits
//! within tolerance. Needs
//! the model file and a Vulkan device (lavapipe in CI); with `CI` set a
//! missing one fails.

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::cpu::llama::{Chunk, Llama, Logits, Sequence, gguf_from_weights};
use xtc_model::format::gguf::{GgmlType, Gguf};
use xtc_model::text::chat;
use xtc_model::text::sampling::argmax;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaError, GpuLlamaOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};

const BLOCK: usize = 16;
/// KV blocks per member (positions 0..BLOCKS_PER * BLOCK).
const BLOCKS_PER: usize = 8;

fn options(members: usize) -> GpuLlamaOptions {
    options_in(members, None)
}

fn options_in(members: usize, variant: Option<Variant>) -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: members * BLOCKS_PER,
        },
        max_tokens: 128,
        max_seqs: members,
        max_context: BLOCK * BLOCKS_PER,
        keep_logits: true,
        variant,
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
        let f = gpu.submit(&plan).unwrap();
        // The completion fd (B-066) becomes readable; then the token is there.
        vk_support::wait_readable(f.fence_fd());
        let tok = gpu.finish(f).unwrap()[0];
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

/// The CPU form (the one lavapipe picks) against the reference.
#[test]
fn vulkan_and_cpu_reference_agree_on_16_prompts_x_48_tokens() {
    let Some((_, t)) = model_support::model() else {
        return;
    };
    let prompts = PROMPTS.map(|p| (p.to_owned(), chat::user_prompt(t, p).unwrap()));
    agree(Variant::Cpu, &prompts, GEN, CHUNK);
}

/// The GPU form (workgroup memory and barriers: what a GPU runs) against
/// the reference on the same schedule (issue 21: the form a GPU would run,
/// end to end on the real model). On lavapipe the GPU-form products run
/// about 100x slower than the CPU form's (a barrier switches between a
/// workgroup's fibers): 407 s on the quiet 2-core machine (2026-12-04,
/// worst logit difference 1.1e-4 over 57 iterations), the longest test of
/// the suite, run in CI because nothing else runs this form at the model's
/// full size with members joining and leaving.
#[test]
fn vulkan_gpu_form_and_cpu_reference_agree_on_16_prompts_x_48_tokens() {
    let Some((_, t)) = model_support::model() else {
        return;
    };
    let prompts = PROMPTS.map(|p| (p.to_owned(), chat::user_prompt(t, p).unwrap()));
    agree(Variant::Gpu, &prompts, GEN, CHUNK);
}

/// `variant` against the CPU reference: every member's `n_gen` greedy tokens
/// identical, prompts prefilled `chunk` tokens at a time, two members
/// joining per iteration, each leaving when done; final logits within
/// tolerance; no validation error.
fn agree(variant: Variant, prompts: &[(String, Vec<u32>)], n_gen: usize, chunk: usize) {
    let Some((m, _)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let n = prompts.len();
    let started = std::time::Instant::now();
    let mut gpu = GpuLlama::new(&dev, m, options_in(n, Some(variant))).unwrap();
    assert_eq!(gpu.variant(), variant);
    let mut members: Vec<Member> = prompts
        .iter()
        .enumerate()
        .map(|(i, (_, p))| Member {
            prompt: p.clone(),
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
    while members.iter().any(|s| s.out.len() < n_gen) {
        let active: Vec<usize> = (0..n)
            .filter(|&i| members[i].join_at <= it && members[i].out.len() < n_gen)
            .collect();
        let mut plan = BatchPlan::default();
        let mut work = vec![];
        for &i in &active {
            let s = &members[i];
            let (tokens, sample) = if s.fed < s.prompt.len() {
                let end = (s.fed + chunk).min(s.prompt.len());
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
                "{variant:?} form, member {i} ({:?}) token {}: Vulkan {} vs CPU {} (logits differ by up to {err})",
                prompts[*i].0,
                mem.out.len(),
                gpu_toks[k],
                want
            );
            mem.out.push(want);
            k += 1;
        }
        it += 1;
    }
    eprintln!(
        "{variant:?} form: worst logit difference {worst} at {worst_at} over {it} iterations ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    assert_eq!(xtc_vk::validation_errors(), 0);
    assert!(worst < 2e-3, "worst logit difference {worst} at {worst_at}");
    for s in &members {
        assert_eq!(s.out.len(), n_gen);
    }
}

/// A small synthetic model (no file needed) through both kernel forms: the
/// CPU-device form (weight image, windows, KV image) and the GPU form
/// (storage buffers, workgroup tiles, KV buffer), tied and untied heads,
/// against the CPU reference: greedy tokens and logits.
#[test]
fn tiny_models_agree_with_the_reference_in_both_forms() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(Config::tiny(), 21);
    for (ty, tied) in [
        (GgmlType::Q4_1, true),
        (GgmlType::Q8_0, false),
        (GgmlType::F16, true),
    ] {
        let g = gguf_from_weights(&w, ty, 10000.0, tied);
        let model = Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap();
        for variant in [Variant::Cpu, Variant::Gpu] {
            let opts = GpuLlamaOptions {
                kv: KvGeometry {
                    block_size: 8,
                    n_blocks: 16,
                },
                max_tokens: 32,
                max_seqs: 2,
                max_context: 64,
                keep_logits: true,
                variant: Some(variant),
            };
            let mut gpu = GpuLlama::new(&dev, &model, opts).unwrap();
            assert_eq!(gpu.variant(), variant);
            let mut seqs = [model.new_sequence(), model.new_sequence()];
            let tables = [vec![3u32, 9, 1, 12], vec![0u32, 15, 7, 4]];
            let mut next = [vec![5u32, 77, 300, 2, 9, 11, 400, 1, 8], vec![42u32, 43]];
            for step in 0..6 {
                let plan = BatchPlan {
                    seqs: (0..2)
                        .map(|i| SeqWork {
                            tokens: next[i].clone(),
                            start_pos: seqs[i].len(),
                            block_table: tables[i].clone(),
                            sample: true,
                        })
                        .collect(),
                };
                let f = gpu.submit(&plan).unwrap();
                let (toks, logits) = gpu.finish_with_logits(f).unwrap();
                let [a, b] = &mut seqs;
                let mut chunks = [
                    Chunk {
                        seq: a,
                        tokens: &next[0],
                        logits: Logits::Last,
                    },
                    Chunk {
                        seq: b,
                        tokens: &next[1],
                        logits: Logits::Last,
                    },
                ];
                let cpu = model.forward(&mut chunks).unwrap();
                for i in 0..2 {
                    let err = vk_support::max_abs_diff(&logits[i], &cpu[i]);
                    assert!(
                        err < 1e-3,
                        "{ty} {variant:?} step {step} seq {i}: logits differ by {err}"
                    );
                    assert_eq!(
                        toks[i],
                        argmax(&cpu[i]),
                        "{ty} {variant:?} step {step} seq {i}"
                    );
                    next[i] = vec![toks[i]];
                }
            }
        }
    }
}

#[test]
fn bad_plans_and_options_are_refused() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(Config::tiny(), 22);
    let model = Llama::from_gguf(
        Gguf::from_bytes(gguf_from_weights(&w, GgmlType::Q4_1, 10000.0, true).to_bytes()).unwrap(),
    )
    .unwrap();
    let opts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: 8,
            n_blocks: 4,
        },
        max_tokens: 8,
        max_seqs: 1,
        max_context: 32,
        keep_logits: false,
        variant: None,
    };
    for (bad, option) in [
        (
            GpuLlamaOptions {
                max_context: 257,
                ..opts
            },
            "max_context",
        ),
        (
            GpuLlamaOptions {
                max_tokens: 0,
                ..opts
            },
            "max_tokens/max_seqs",
        ),
        (
            GpuLlamaOptions {
                kv: KvGeometry {
                    block_size: 0,
                    n_blocks: 4,
                },
                ..opts
            },
            "kv",
        ),
    ] {
        match GpuLlama::new(&dev, &model, bad) {
            Err(GpuLlamaError::Options { option: o, .. }) => assert_eq!(o, option),
            other => panic!("{option}: {other:?}"),
        }
    }
    let mut gpu = GpuLlama::new(&dev, &model, opts).unwrap();
    let seq = |tokens: Vec<u32>, start_pos: usize, block_table: Vec<u32>| BatchPlan {
        seqs: vec![SeqWork {
            tokens,
            start_pos,
            block_table,
            sample: true,
        }],
    };
    let e = |r: xtc::Result<InFlightAlias>| r.map(|_| ()).unwrap_err();
    assert_eq!(e(gpu.submit(&BatchPlan::default())), xtc::Error::Inval);
    assert_eq!(
        e(gpu.submit(&seq(vec![512], 0, vec![0]))),
        xtc::Error::Inval,
        "token past the vocabulary"
    );
    assert_eq!(
        e(gpu.submit(&seq(vec![1], 0, vec![4]))),
        xtc::Error::Inval,
        "block past the cache"
    );
    assert_eq!(
        e(gpu.submit(&seq(vec![1], 32, vec![0, 1, 2, 3, 0]))),
        xtc::Error::Inval,
        "position past max_context"
    );
    assert_eq!(
        e(gpu.submit(&seq(vec![1; 9], 0, vec![0, 1]))),
        xtc::Error::Range,
        "more rows than max_tokens"
    );
    // A stale InFlight is refused; the model keeps working.
    let old = gpu.submit(&seq(vec![1], 0, vec![0])).unwrap();
    let new = gpu.submit(&seq(vec![2], 1, vec![0])).unwrap();
    assert_eq!(gpu.finish(old).unwrap_err(), xtc::Error::Inval);
    assert_eq!(gpu.finish(new).unwrap().len(), 1);
}

type InFlightAlias = xtc_model::vulkan::InFlight;
