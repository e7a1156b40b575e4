//! The CPU reference's own checks: against the f32 llama2.c reference, batched
//! against alone, paged against contiguous, quantized against dequantized.

use super::*;
use crate::cpu::f32_model::{self, CpuKvCache};
use crate::{Config, SeqWork, Weights};

fn tiny(ty: GgmlType, tied: bool) -> (Weights, Llama) {
    let w = Weights::synthetic(Config::tiny(), 7);
    let g = gguf_from_weights(&w, ty, 10000.0, tied);
    (
        w,
        Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap(),
    )
}

/// The GGUF model in F32 against the independent llama2.c-order
/// reference (`crate::cpu::f32_model`, rope base 10000) on the same weights.
#[test]
fn f32_model_matches_the_llama2c_reference() {
    let (w, model) = tiny(GgmlType::F32, false);
    assert!(!model.config().tied_output);
    let geo = KvGeometry {
        block_size: 8,
        n_blocks: 4,
    };
    let mut cache = CpuKvCache::new(&w.config, geo);
    let bt = [0u32, 1, 2, 3];
    let mut seq = model.new_sequence();
    for (pos, &t) in [3u32, 77, 500, 9, 9, 140].iter().enumerate() {
        let want = f32_model::forward_token(&w, &mut cache, &bt, t, pos);
        let got = model
            .forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &[t],
                logits: Logits::Last,
            }])
            .unwrap()
            .remove(0);
        let err = want
            .iter()
            .zip(&got)
            .fold(0f32, |a, (p, q)| a.max((p - q).abs()));
        let scale = want.iter().fold(0f32, |a, p| a.max(p.abs()));
        assert!(
            err <= 1e-4 * scale.max(1.0),
            "pos {pos}: max error {err} (logit scale {scale})"
        );
    }
}

#[test]
fn batched_chunked_and_alone_are_bit_identical() {
    let (_, model) = tiny(GgmlType::Q4_1, true);
    let prompts: [&[u32]; 3] = [&[1, 2, 3, 4, 5], &[9, 8], &[400, 401, 402]];
    // Alone, token by token.
    let mut alone = vec![];
    for p in prompts {
        let mut seq = model.new_sequence();
        let mut last = vec![];
        for t in p {
            last = model
                .forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &[*t],
                    logits: Logits::Last,
                }])
                .unwrap()
                .remove(0);
        }
        alone.push(last);
    }
    // Together, each prompt as one chunk.
    let mut seqs: Vec<Sequence> = prompts.iter().map(|_| model.new_sequence()).collect();
    let mut chunks: Vec<Chunk> = seqs
        .iter_mut()
        .zip(prompts)
        .map(|(seq, tokens)| Chunk {
            seq,
            tokens,
            logits: Logits::Last,
        })
        .collect();
    let together = model.forward(&mut chunks).unwrap();
    let bits = |v: &Vec<f32>| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (a, b) in alone.iter().zip(&together) {
        assert_eq!(bits(a), bits(b));
    }
    assert!(seqs.iter().zip(prompts).all(|(s, p)| s.len() == p.len()));
}

/// The paged pass over a mixed schedule (members joining and leaving,
/// prompts in chunks of 3 beside decode rows, scattered block tables
/// interleaved in the cache) gives every sequence the bits of the
/// contiguous pass, and the same greedy tokens.
#[test]
fn paged_and_contiguous_passes_are_bit_identical() {
    let (_, model) = tiny(GgmlType::Q4_1, true);
    let geo = KvGeometry {
        block_size: 4,
        n_blocks: 40,
    };
    let mut paged = model.new_paged_kv(geo);
    let prompts: [&[u32]; 4] = [
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
        &[9, 8],
        &[400, 401, 402, 403, 404],
        &[7],
    ];
    let join = [0, 0, 2, 3];
    let n_gen = [6, 9, 4, 5];
    let tables: Vec<Vec<u32>> = (0..4)
        .map(|i| (0..10).rev().map(|j| (j * 4 + i) as u32).collect())
        .collect();
    let mut seqs: Vec<Sequence> = (0..4).map(|_| model.new_sequence()).collect();
    let mut fed = [0usize; 4];
    let mut out: Vec<Vec<u32>> = vec![vec![]; 4];
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let mut it = 0;
    let mut mixed = false;
    while (0..4).any(|i| out[i].len() < n_gen[i]) {
        let active: Vec<usize> = (0..4)
            .filter(|&i| join[i] <= it && out[i].len() < n_gen[i])
            .collect();
        let work: Vec<(usize, Vec<u32>, bool)> = active
            .iter()
            .map(|&i| {
                if fed[i] < prompts[i].len() {
                    let end = (fed[i] + 3).min(prompts[i].len());
                    (i, prompts[i][fed[i]..end].to_vec(), end == prompts[i].len())
                } else {
                    (i, vec![*out[i].last().unwrap()], true)
                }
            })
            .collect();
        mixed |= work.iter().any(|w| w.1.len() > 1) && work.iter().any(|w| w.1.len() == 1);
        let plan = BatchPlan {
            seqs: work
                .iter()
                .map(|(i, t, sample)| SeqWork {
                    tokens: t.clone(),
                    start_pos: seqs[*i].len(),
                    block_table: tables[*i].clone(),
                    sample: *sample,
                })
                .collect(),
        };
        let got = model.forward_paged(&mut paged, &plan).unwrap();
        let mut k = 0;
        for (i, t, sample) in &work {
            let want = model
                .forward(&mut [Chunk {
                    seq: &mut seqs[*i],
                    tokens: t,
                    logits: if *sample { Logits::Last } else { Logits::None },
                }])
                .unwrap()
                .remove(0);
            if *sample {
                assert_eq!(bits(&got[k]), bits(&want), "iteration {it}, sequence {i}");
                out[*i].push(crate::text::sampling::argmax(&want));
                k += 1;
            }
            if fed[*i] < prompts[*i].len() {
                fed[*i] += t.len();
            }
        }
        assert_eq!(k, got.len());
        it += 1;
    }
    assert!(mixed, "the schedule mixes prefill chunks and decode rows");
}

#[test]
fn bad_plans_are_refused_by_the_paged_pass_and_change_nothing() {
    let (_, model) = tiny(GgmlType::Q8_0, false);
    let geo = KvGeometry {
        block_size: 4,
        n_blocks: 3,
    };
    let mut kv = model.new_paged_kv(geo);
    let plan = |tokens: Vec<u32>, start_pos, block_table: Vec<u32>| BatchPlan {
        seqs: vec![
            SeqWork {
                tokens: vec![1],
                start_pos: 0,
                block_table: vec![0],
                sample: true,
            },
            SeqWork {
                tokens,
                start_pos,
                block_table,
                sample: true,
            },
        ],
    };
    let mut run = |p: BatchPlan| model.forward_paged(&mut kv, &p).map(|_| ());
    assert_eq!(
        run(plan(vec![], 0, vec![1])),
        Err(ForwardError::Empty { chunk: 1 })
    );
    assert_eq!(
        run(plan(vec![600], 0, vec![1])),
        Err(ForwardError::Token {
            chunk: 1,
            token: 600,
            vocab: 512
        })
    );
    assert!(matches!(
        run(plan(vec![1, 2], 255, vec![1; 64])),
        Err(ForwardError::ContextFull {
            chunk: 1,
            len: 255,
            adding: 2,
            max: 256
        })
    ));
    let e = run(plan(vec![1, 2, 3], 3, vec![1])).unwrap_err();
    assert_eq!(
        e,
        ForwardError::BlockTable {
            chunk: 1,
            positions: 6,
            blocks: 1,
            block_size: 4
        }
    );
    assert!(e.to_string().contains("need 2 blocks"), "{e}");
    assert_eq!(
        run(plan(vec![1], 4, vec![1, 3])),
        Err(ForwardError::Block {
            chunk: 1,
            block: 3,
            n_blocks: 3
        })
    );
    assert!(
        kv.k.iter().chain(&kv.v).all(|&x| x == 0.0),
        "nothing written"
    );
    let mut foreign = model.new_paged_kv(geo);
    foreign.kv_dim = 1;
    assert_eq!(
        model.forward_paged(&mut foreign, &plan(vec![1], 0, vec![1])),
        Err(ForwardError::ForeignCache)
    );
}

/// A quantized model against the F32 model of its own dequantized
/// weights: the same function, so only rounding order may differ.
#[test]
fn quantized_kernels_compute_the_dequantized_model() {
    let w = Weights::synthetic(Config::tiny(), 7);
    for ty in [
        GgmlType::F16,
        GgmlType::Q8_0,
        GgmlType::Q4_1,
        GgmlType::Q4_0,
    ] {
        let deq = |x: &[f32]| {
            let mut out = vec![0f32; x.len()];
            quant::dequantize(ty, &quant::quantize(ty, x), &mut out);
            out
        };
        let wd = Weights {
            token_embedding: deq(&w.token_embedding),
            wq: deq(&w.wq),
            wk: deq(&w.wk),
            wv: deq(&w.wv),
            wo: deq(&w.wo),
            w1: deq(&w.w1),
            w2: deq(&w.w2),
            w3: deq(&w.w3),
            wcls: deq(&w.wcls),
            ..w.clone()
        };
        let load = |w: &Weights, ty| {
            let g = gguf_from_weights(w, ty, 10000.0, false);
            Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap()
        };
        let run = |m: &Llama| {
            let mut seq = m.new_sequence();
            m.forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &[5, 6, 7, 300],
                logits: Logits::All,
            }])
            .unwrap()
            .remove(0)
        };
        let (a, b) = (run(&load(&wd, GgmlType::F32)), run(&load(&w, ty)));
        let err = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        let scale = a.iter().fold(0f32, |m, p| m.max(p.abs()));
        assert!(
            err <= 1e-4 * scale.max(1.0),
            "{ty}: max logit difference {err} (scale {scale})"
        );
    }
}

#[test]
fn bad_chunks_are_refused_and_change_nothing() {
    let (_, model) = tiny(GgmlType::Q8_0, true);
    let mut seq = model.new_sequence();
    let run = |tokens: &[u32], seq: &mut Sequence| {
        model
            .forward(&mut [Chunk {
                seq,
                tokens,
                logits: Logits::Last,
            }])
            .map(|_| ())
    };
    assert_eq!(run(&[], &mut seq), Err(ForwardError::Empty { chunk: 0 }));
    assert_eq!(
        run(&[1, 512], &mut seq),
        Err(ForwardError::Token {
            chunk: 0,
            token: 512,
            vocab: 512
        })
    );
    let long = vec![1u32; 257];
    assert!(matches!(
        run(&long, &mut seq),
        Err(ForwardError::ContextFull { max: 256, .. })
    ));
    assert_eq!(seq.len(), 0);
    let mut other = Sequence {
        kv_dim: 1,
        ..model.new_sequence()
    };
    assert_eq!(
        run(&[1], &mut other),
        Err(ForwardError::ForeignSequence { chunk: 0 })
    );
}
