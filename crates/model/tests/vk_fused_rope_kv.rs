//! The q|k|v product with RoPE and the KV append fused into its stores
//! (`QMatmulRopeKv`, entry points `qmm_<ty>_r<R>_rkv`; with int8
//! activations `QMatmul8RopeKv`, `qmm8_q41_r<R>_swar_rkv`) against the two
//! ops it replaces (the product, a barrier, `rope_kv_img`): SmolLM2 on the
//! CPU form gives the same tokens and logits bit for bit over chunked prefill
//! and decode of members with scattered block tables that join and leave,
//! with one dispatch group per layer fewer; and the op refuses what is not
//! that pair. Needs the model file and a Vulkan device with the CPU form
//! (lavapipe in CI).

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions};
use xtc_model::vulkan::ops::{Op, Rope, Variant};
use xtc_model::vulkan::qops::{QMatmul, QMatmulRopeKv, RopeKv, RopeTable};
use xtc_model::vulkan::qops8::{Activations, DotForm};
use xtc_model::vulkan::qweights::{KernelType, QTensor};
use xtc_model::{BatchPlan, KvGeometry, SeqWork};

const BLOCK: usize = 16;
const MEMBERS: usize = 4;
const BLOCKS_PER: usize = 6;

fn options() -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: MEMBERS * BLOCKS_PER,
        },
        max_tokens: 64,
        max_seqs: MEMBERS,
        max_context: BLOCK * BLOCKS_PER,
        keep_logits: true,
        variant: Some(Variant::Cpu),
    }
}

/// Member i's blocks: every MEMBERS-th block, backwards (scattered, interleaved).
fn table(i: usize) -> Vec<u32> {
    (0..BLOCKS_PER)
        .rev()
        .map(|b| (b * MEMBERS + i) as u32)
        .collect()
}

#[test]
fn fused_and_apart_give_the_same_logits_bit_for_bit_with_a_group_fewer_per_layer() {
    fused_against_apart(Activations::F32);
}

/// The same with int8 activations (the packed pairs' `_rkv` twins).
#[test]
fn int8_fused_and_apart_give_the_same_logits_bit_for_bit_with_a_group_fewer_per_layer() {
    fused_against_apart(Activations::Int8);
}

fn fused_against_apart(acts: Activations) {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    if !xtc_model::vulkan::form::cpu_form_supported(&dev) {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the device has no CPU form"
        );
        eprintln!("skipping: the device has no CPU form");
        return;
    }
    let mut fused = GpuLlama::with_activations(&dev, m, options(), acts).unwrap();
    let mut apart = GpuLlama::with_activations(&dev, m, options(), acts).unwrap();
    apart.set_fuse_rope_kv(false);
    // The dispatch groups compared below are the products' own: the
    // persistent chain (which would hold some of them) off on both.
    fused.set_chain(false);
    apart.set_chain(false);
    if acts == Activations::Int8 {
        assert!(
            matches!(fused.int8_dot(), Some(DotForm::Swar { .. })),
            "the CPU form's int8 products are the packed pairs: {:?}",
            fused.int8_dot()
        );
    }
    let layers = m.config().shape.n_layers;

    let prompts = [
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Why is the sky blue? Answer in two sentences.",
        "Name three primary colors.",
    ];
    let prompts: Vec<Vec<u32>> = prompts.iter().map(|p| t.encode(p)).collect();
    // (fed prompt tokens, position, last token) per member; member i joins at
    // iteration 2 i, prompts go in chunks of 5, member 1 leaves after 8
    // iterations of its own.
    let mut fed = [0usize; MEMBERS];
    let mut pos = [0usize; MEMBERS];
    let mut last = [0u32; MEMBERS];
    let mut iters = [0usize; MEMBERS];
    let mut checked_groups = false;
    for it in 0..14 {
        let mut seqs = vec![];
        let mut who = vec![];
        for i in 0..MEMBERS {
            if it < 2 * i || (i == 1 && iters[i] >= 8) {
                continue;
            }
            let tokens = if fed[i] < prompts[i].len() {
                let end = (fed[i] + 5).min(prompts[i].len());
                let c = prompts[i][fed[i]..end].to_vec();
                fed[i] = end;
                c
            } else {
                vec![last[i]]
            };
            let n = tokens.len();
            seqs.push(SeqWork {
                tokens,
                start_pos: pos[i],
                block_table: table(i),
                sample: fed[i] == prompts[i].len(),
            });
            who.push((i, n));
        }
        let plan = BatchPlan { seqs };
        if !checked_groups {
            // Timed once: the labels say which ops ran, fused or apart.
            let (ft, ftimes) = fused.profile(&plan).unwrap();
            let (at, atimes) = apart.profile(&plan).unwrap();
            assert_eq!(ft, at, "iteration {it}: tokens");
            assert_eq!(
                atimes.len(),
                ftimes.len() + layers,
                "a group fewer per layer"
            );
            let count = |v: &[(&str, f64)], l: &str| v.iter().filter(|(x, _)| *x == l).count();
            assert_eq!(count(&ftimes, "qmm norm.q|k|v, rope_kv"), layers);
            assert_eq!(count(&ftimes, "rope_kv"), 0);
            assert_eq!(count(&atimes, "rope_kv"), layers);
            checked_groups = true;
            // profile() advanced both models like any iteration.
            advance(&who, &ft, &plan, &mut pos, &mut last, &mut iters);
            continue;
        }
        let f = fused.submit(&plan).unwrap();
        let (ft, fl) = fused.finish_with_logits(f).unwrap();
        let a = apart.submit(&plan).unwrap();
        let (at, al) = apart.finish_with_logits(a).unwrap();
        assert_eq!(ft, at, "iteration {it}: tokens");
        assert_eq!(fl.len(), al.len());
        for (r, (x, y)) in fl.iter().zip(&al).enumerate() {
            let same = x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same, "iteration {it}, sampled row {r}: logits differ");
        }
        advance(&who, &ft, &plan, &mut pos, &mut last, &mut iters);
    }
    assert!(iters.iter().all(|&n| n > 0), "every member ran: {iters:?}");
}

/// Positions and last tokens after an iteration (tokens come for sampled
/// members, in plan order).
fn advance(
    who: &[(usize, usize)],
    toks: &[u32],
    plan: &BatchPlan,
    pos: &mut [usize; MEMBERS],
    last: &mut [u32; MEMBERS],
    iters: &mut [usize; MEMBERS],
) {
    let mut next = toks.iter();
    for (s, &(i, n)) in plan.seqs.iter().zip(who) {
        pos[i] += n;
        iters[i] += 1;
        if s.sample {
            last[i] = *next.next().expect("a token per sampled member");
        }
    }
}

/// A stacked q|k|v product and its RoPE + KV append at SmolLM2's shapes.
fn pair(ty: KernelType, image: u32) -> (QMatmul, RopeKv) {
    let w = QTensor {
        ty,
        rows: 960,
        cols: 576,
        qs_off: 0,
        sc_off: 0,
    };
    let split = QMatmul::split(&w, 3, 0, [576, 192, 192], [4096, 8192, 12288]);
    let rk = RopeKv {
        rope: RopeTable {
            rope: Rope {
                n_rows: 3,
                dim: 576,
                kv_dim: 192,
                head_size: 64,
                rows_off: 0,
                q_off: 4096,
                k_off: 8192,
            },
            tab_off: 1024,
        },
        v_off: 12288,
        block_size: 16,
        kc_off: 2,
        vc_off: 32,
        image,
    };
    (split, rk)
}

#[test]
fn the_fused_op_takes_only_the_pair_it_replaces() {
    let (split, rk) = pair(KernelType::Q41, 1);
    let f = QMatmulRopeKv::new(split, &rk).expect("the pair fuses");
    // The KV image's layers replace the k and v outputs; the rest is kept.
    assert_eq!((f.0.y2_off, f.0.y3_off), (2, 32));
    assert_eq!(
        (f.0.rope_tab, f.0.head_size, f.0.block_size),
        (1024, 64, 16)
    );
    assert_eq!((f.0.y_off, f.0.n1, f.0.n2, f.0.m), (4096, 576, 192, 3));
    assert!(QMatmulRopeKv::new(pair(KernelType::Q80, 1).0, &pair(KernelType::Q80, 1).1).is_some());
    // Refused: the KV buffer, other weight formats, other offsets or shapes,
    // a residual add, an unaligned table or head.
    assert!(QMatmulRopeKv::new(split, &pair(KernelType::Q41, 0).1).is_none());
    assert!(QMatmulRopeKv::new(pair(KernelType::F16, 1).0, &rk).is_none());
    let moved = RopeKv { v_off: 12289, ..rk };
    assert!(QMatmulRopeKv::new(split, &moved).is_none());
    let mut rows = rk;
    rows.rope.rope.n_rows = 4;
    assert!(QMatmulRopeKv::new(split, &rows).is_none());
    let add = QMatmul {
        mode: split.mode | 1,
        ..split
    };
    assert!(QMatmulRopeKv::new(add, &rk).is_none());
    let mut tab = rk;
    tab.rope.tab_off = 1026;
    assert!(QMatmulRopeKv::new(split, &tab).is_none());
    let mut head = rk;
    head.rope.rope.head_size = 66;
    assert!(QMatmulRopeKv::new(split, &head).is_none());
    // Without the windowed CPU form there is no kernel to run it.
    assert_eq!(f.dispatch(Variant::Gpu).0, QMatmulRopeKv::KERNEL);
    assert!(!QMatmulRopeKv::KERNEL.starts_with("qmm_q"));
}
