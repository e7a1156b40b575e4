//! `decode::model::vulkan::f32_model::GpuModel` on lavapipe against the CPU reference
//! (`decode::model::cpu::f32_model`): greedy tokens, teacher-forced logits at every step,
//! and members joining/leaving the ready vector without disturbing others.
//!
//! Tolerance: logits (magnitude up to ~8 for the synthetic model) agree within
//! `TOL` = 1e-4 absolute (observed: under 5e-6); the GPU's reduction order
//! differs from the CPU's.

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::cpu::f32_model::{self, CpuKvCache};
use xtc_model::vulkan::f32_model::{GpuModel, GpuOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};
use xtc_vk::Device;

const TOL: f32 = 1e-4;
const GEO: KvGeometry = KvGeometry {
    block_size: 16,
    n_blocks: 64,
};

fn opts(keep_logits: bool) -> GpuOptions {
    GpuOptions {
        kv: GEO,
        max_tokens: 64,
        max_seqs: 8,
        keep_logits,
        variant: None,
        kv_image: None,
    }
}

fn seq(tokens: Vec<u32>, start_pos: usize, first_block: u32, sample: bool) -> SeqWork {
    SeqWork {
        tokens,
        start_pos,
        block_table: (first_block..first_block + 16).collect(),
        sample,
    }
}

/// The GPU's greedy token is the reference's, or the two are a near-tie in the
/// reference logits.
fn assert_greedy_agrees(gpu_tok: u32, ref_logits: &[f32]) {
    if let Err(gap) = f32_model::greedy_agrees(gpu_tok, ref_logits, TOL) {
        let want = f32_model::argmax(ref_logits);
        panic!("gpu token {gpu_tok} vs reference {want} (gap {gap})");
    }
}

/// Runs `plan` on both and checks logits and tokens; returns the GPU tokens.
fn both(gpu: &mut GpuModel, w: &Weights, cache: &mut CpuKvCache, plan: &BatchPlan) -> Vec<u32> {
    let want = f32_model::forward(w, cache, plan).unwrap();
    let f = gpu.submit(plan).unwrap();
    vk_support::wait_readable(f.fence_fd());
    let (toks, logits) = gpu.finish_with_logits(f).unwrap();
    assert_eq!(toks.len(), want.len());
    for ((t, got), want) in toks.iter().zip(&logits).zip(&want) {
        let diff = vk_support::max_abs_diff(got, want);
        assert!(diff <= TOL, "logits differ by {diff}");
        assert_greedy_agrees(*t, want);
    }
    toks
}

fn setup(dev: &Device, seed: u64) -> (Weights, GpuModel, CpuKvCache) {
    let w = Weights::synthetic(Config::tiny(), seed);
    let gpu = GpuModel::new(dev, &w, opts(true)).unwrap();
    let cache = CpuKvCache::new(&w.config, GEO);
    (w, gpu, cache)
}

#[test]
fn mixed_ready_vector_matches_reference_greedy_tokens() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let (w, mut gpu, mut cache) = setup(&dev, 1);
    // Iteration 1: A prefills 7 tokens and samples; B prefills a 20-token chunk
    // without sampling; C prefills 1 token.
    let plan = BatchPlan {
        seqs: vec![
            seq((1..8).collect(), 0, 0, true),
            seq((100..120).collect(), 0, 16, false),
            seq(vec![300], 0, 32, true),
        ],
    };
    let t1 = both(&mut gpu, &w, &mut cache, &plan);
    assert_eq!(t1.len(), 2);
    // Iteration 2: A decodes, B finishes its prompt (5 more tokens), C decodes.
    let plan = BatchPlan {
        seqs: vec![
            seq(vec![t1[0]], 7, 0, true),
            seq((120..125).collect(), 20, 16, true),
            seq(vec![t1[1]], 1, 32, true),
        ],
    };
    let mut toks = both(&mut gpu, &w, &mut cache, &plan);
    let mut pos = [8usize, 25, 2];
    // Iterations 3..8: all three decode, feeding back the GPU's tokens.
    for _ in 0..6 {
        let seqs = (0..3)
            .map(|i| seq(vec![toks[i]], pos[i], 16 * i as u32, true))
            .collect();
        toks = both(&mut gpu, &w, &mut cache, &BatchPlan { seqs });
        pos.iter_mut().for_each(|p| *p += 1);
    }
    assert_eq!(xtc_vk::validation_errors(), 0);
}

/// One sequence, teacher-forced: a 9-token prefill, then one token per
/// iteration (31 decode steps over two block boundaries, block_size 16); the
/// logits match the reference at every step. Both kernel forms.
#[test]
fn teacher_forced_logits_match_at_every_step() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    for variant in [Variant::Cpu, Variant::Gpu] {
        let w = Weights::synthetic(Config::tiny(), 7);
        let o = GpuOptions {
            variant: Some(variant),
            ..opts(true)
        };
        let mut gpu = GpuModel::new(&dev, &w, o).unwrap();
        let mut cache = CpuKvCache::new(&w.config, GEO);
        let text: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 512).collect();
        let prefill = BatchPlan {
            seqs: vec![seq(text[..9].to_vec(), 0, 5, true)],
        };
        both(&mut gpu, &w, &mut cache, &prefill);
        for (p, &t) in text.iter().enumerate().skip(9) {
            let plan = BatchPlan {
                seqs: vec![seq(vec![t], p, 5, true)],
            };
            both(&mut gpu, &w, &mut cache, &plan);
        }
    }
}

/// Sequence A's logits at each step, run with `others(step)` beside it.
fn run_member(dev: &Device, others: impl Fn(usize) -> Vec<SeqWork>) -> Vec<Vec<f32>> {
    let w = Weights::synthetic(Config::tiny(), 11);
    let mut gpu = GpuModel::new(dev, &w, opts(true)).unwrap();
    let a_tokens: Vec<u32> = (0..12).map(|i| (i * 53 + 2) % 512).collect();
    let mut out = vec![];
    // Step 0: A prefills 6 tokens; steps 1..=6: A decodes one token each.
    for step in 0..7 {
        let a = match step {
            0 => seq(a_tokens[..6].to_vec(), 0, 0, true),
            s => seq(vec![a_tokens[5 + s]], 5 + s, 0, true),
        };
        let mut seqs = others(step);
        let at = step % (seqs.len() + 1);
        seqs.insert(at, a);
        let plan = BatchPlan { seqs };
        let f = gpu.submit(&plan).unwrap();
        let (_, logits) = gpu.finish_with_logits(f).unwrap();
        let a_index = plan.seqs[..at].iter().filter(|s| s.sample).count();
        out.push(logits[a_index].clone());
    }
    out
}

#[test]
fn member_logits_are_the_same_alone_or_in_a_full_vector() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let alone = run_member(&dev, |_| vec![]);
    // Others join and leave: a prefill chunk, decode tokens of other lengths,
    // a member that does not sample, and a different vector size each step.
    let crowd = run_member(&dev, |step| {
        let mut v = vec![];
        if step % 2 == 0 {
            v.push(seq((0..(3 + step as u32)).collect(), 0, 16, false));
        }
        if step >= 2 {
            v.push(seq(vec![9], step, 32, true));
        }
        if step < 5 {
            v.push(seq(vec![7, 8], 4 * step, 48, true));
        }
        v
    });
    assert_eq!(
        alone, crowd,
        "a member's logits do not depend on the rest of the ready vector"
    );
}

#[test]
fn bad_plans_and_stale_iterations_are_errors() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(Config::tiny(), 2);
    let mut gpu = GpuModel::new(&dev, &w, opts(false)).unwrap();
    let bad_token = BatchPlan {
        seqs: vec![seq(vec![512], 0, 0, true)],
    };
    assert_eq!(gpu.submit(&bad_token).unwrap_err(), xtc::Error::Inval);
    let bad_block = BatchPlan {
        seqs: vec![SeqWork {
            tokens: vec![1],
            start_pos: 0,
            block_table: vec![64],
            sample: true,
        }],
    };
    assert_eq!(gpu.submit(&bad_block).unwrap_err(), xtc::Error::Inval);
    assert_eq!(
        gpu.submit(&BatchPlan::default()).unwrap_err(),
        xtc::Error::Inval
    );
    let too_many = BatchPlan {
        seqs: vec![seq(vec![1; 65], 0, 0, true)],
    };
    assert_eq!(gpu.submit(&too_many).unwrap_err(), xtc::Error::Range);
    let ok = BatchPlan {
        seqs: vec![seq(vec![1, 2], 0, 0, true)],
    };
    let first = gpu.submit(&ok).unwrap();
    let second = gpu
        .submit(&BatchPlan {
            seqs: vec![seq(vec![3], 2, 0, true)],
        })
        .unwrap();
    assert_eq!(
        gpu.finish(first).unwrap_err(),
        xtc::Error::Inval,
        "a stale iteration"
    );
    assert_eq!(gpu.finish(second).unwrap().len(), 1);
    let f = gpu.submit(&ok).unwrap();
    assert_eq!(
        gpu.finish_with_logits(f).unwrap_err(),
        xtc::Error::Inval,
        "keep_logits is off"
    );
}

#[test]
fn mismatched_weights_are_refused() {
    let mut w = Weights::synthetic(Config::tiny(), 3);
    w.wk.pop();
    assert_eq!(w.validate(), Err(xtc::Error::Inval));
    let mut cache = CpuKvCache::new(&w.config, GEO);
    let plan = BatchPlan {
        seqs: vec![seq(vec![1], 0, 0, true)],
    };
    assert_eq!(
        f32_model::forward(&w, &mut cache, &plan),
        Err(xtc::Error::Inval)
    );
    let Some(dev) = vk_support::device() else {
        return;
    };
    assert_eq!(
        GpuModel::new(&dev, &w, opts(false)).unwrap_err(),
        xtc::Error::Inval
    );
}

/// Buffer sizes that overflow are `Range`, never wrapped: before the fix a
/// token budget of 2^62 rows made every `rows * width` activation size wrap
/// to 0 in release builds, so the model loaded with activation buffers too
/// small for the rows a plan may hold (`xtc decode --token-budget
/// 4611686018427387904` ran and reported results: wrong tokens, logits off
/// by ~11), and a ready vector of 2^62 members did the same to the
/// per-member buffers.
#[test]
fn overflowing_buffer_sizes_are_range_errors() {
    let w = Weights::synthetic(Config::tiny(), 5);
    let Some(dev) = vk_support::device() else {
        return;
    };
    for (max_tokens, max_seqs) in [(1usize << 62, 8usize), (64, 1 << 62), (1 << 62, 1 << 62)] {
        let o = GpuOptions {
            max_tokens,
            max_seqs,
            ..opts(false)
        };
        assert_eq!(
            GpuModel::new(&dev, &w, o).map(drop),
            Err(xtc::Error::Range),
            "max_tokens {max_tokens}, max_seqs {max_seqs}"
        );
    }
    let o = GpuOptions {
        max_seqs: 1 << 60,
        ..opts(true)
    };
    assert_eq!(
        GpuModel::new(&dev, &w, o).map(drop),
        Err(xtc::Error::Range),
        "the logits readback of 2^60 members"
    );
    // The command names the option: the buffers are sized by --token-budget too.
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["decode", "--requests", "2", "--time-scale", "1000"])
        .args(["--token-budget", "4611686018427387904"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("--token-budget 4611686018427387904"), "{err}");
    assert!(!err.contains("requests        2"), "it ran:\n{err}");
}
