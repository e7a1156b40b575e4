//! int8 activations only where an iteration has the rows for them
//! (`GpuLlama::set_int8_min_rows`): a model built with int8 activations runs
//! an iteration of fewer rows with the f32 products, the same dispatch
//! groups and the same logits bit for bit as a model built with f32
//! activations, and an iteration of enough rows with the quantizers; the
//! defaults (1 row for `Int8`, the probe's rows for `Auto`). Needs the model
//! file and a Vulkan device (lavapipe in CI).

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::vulkan::act_probe;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions};
use xtc_model::vulkan::qops8::Activations;
use xtc_model::{BatchPlan, KvGeometry, SeqWork};

const BLOCK: usize = 16;
const BLOCKS_PER: usize = 4;

fn options() -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: 2 * BLOCKS_PER,
        },
        max_tokens: 32,
        max_seqs: 2,
        max_context: BLOCK * BLOCKS_PER,
        keep_logits: true,
        variant: None,
    }
}

fn seq(tokens: Vec<u32>, start_pos: usize, member: u32) -> SeqWork {
    SeqWork {
        tokens,
        start_pos,
        block_table: (0..BLOCKS_PER as u32)
            .map(|b| member * BLOCKS_PER as u32 + b)
            .collect(),
        sample: true,
    }
}

fn count(times: &[(&str, f64)], label: &str) -> usize {
    times.iter().filter(|(l, _)| *l == label).count()
}

#[test]
fn small_iterations_run_the_f32_products_and_large_ones_the_int8_products() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut int8 = GpuLlama::with_activations(&dev, m, options(), Activations::Int8).unwrap();
    assert!(int8.int8_dot().is_some(), "an int8 model");
    assert_eq!(int8.int8_min_rows(), 1, "Int8: every iteration by default");
    int8.set_int8_min_rows(0);
    assert_eq!(int8.int8_min_rows(), 1, "0 reads as every iteration");
    int8.set_int8_min_rows(4);
    let mut f32m = GpuLlama::with_activations(&dev, m, options(), Activations::F32).unwrap();
    assert!(f32m.int8_dot().is_none());
    // Both without the persistent chain: whether a model runs it is its
    // probe's timing at load, which a busy machine can make one model miss
    // and not the other (a clean-clone CI run did); the groups compared
    // below are the dispatched ones (`vk_chain` covers the chain).
    int8.set_chain(false);
    f32m.set_chain(false);
    // The rows policy alone (the int8 chain's small iterations are
    // `vk_chain`'s).
    int8.set_int8_chain(false);

    let prompt = t.encode("The capital of France is");
    assert!(prompt.len() >= 4, "{prompt:?}");
    // 3 rows (below 4): the f32 products, the f32 model's groups.
    let first = BatchPlan {
        seqs: vec![seq(prompt[..3].to_vec(), 0, 0)],
    };
    let (a, at) = int8.profile(&first).unwrap();
    let (b, bt) = f32m.profile(&first).unwrap();
    assert_eq!(a, b, "tokens of the 3-row iteration");
    assert_eq!(count(&at, "quant_q81"), 0, "no quantizer below 4 rows");
    let labels = |v: &[(&'static str, f64)]| v.iter().map(|(l, _)| *l).collect::<Vec<_>>();
    assert_eq!(labels(&at), labels(&bt), "the f32 model's dispatch groups");
    // One decode row: the same logits bit for bit.
    let second = BatchPlan {
        seqs: vec![seq(vec![a[0]], 3, 0)],
    };
    let f = int8.submit(&second).unwrap();
    let (a2, al) = int8.finish_with_logits(f).unwrap();
    let f = f32m.submit(&second).unwrap();
    let (b2, bl) = f32m.finish_with_logits(f).unwrap();
    assert_eq!(a2, b2);
    let same = al[0]
        .iter()
        .zip(&bl[0])
        .all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(
        same,
        "a 1-row iteration's logits differ from the f32 model's"
    );
    // 1 + the whole prompt's rows (at least 5): the quantizers run, one per
    // product input (four a layer, and the LM head's).
    let third = BatchPlan {
        seqs: vec![seq(vec![a2[0]], 4, 0), seq(prompt.clone(), 0, 1)],
    };
    let (_, at) = int8.profile(&third).unwrap();
    let (_, bt) = f32m.profile(&third).unwrap();
    // Layer 0's x and the LM head's input: the residual adds quantize the
    // new x, the attention its output (`fused_quantizers_...` below) and the
    // GLU products h as half blocks themselves.
    assert_eq!(
        count(&at, "quant_q81"),
        2,
        "the quantizers at {} rows",
        1 + prompt.len(),
    );
    assert_eq!(count(&bt, "quant_q81"), 0);
}

/// The residual-add products' quantized outputs
/// (`QMatmul8::with_quantized_out`) and the attention's
/// (`AttentionImageQ81`) write the blocks `quant_q81` would: an int8 model
/// with them and one without give the same tokens and logits bit for bit,
/// over a prefill of 31 rows and 2 sequences (the `down` product's input
/// rows then split over two windows, so the second chunk quantizes rows
/// from `m_base` 28) and decode rows after it, with three dispatch groups a
/// layer fewer.
#[test]
fn fused_quantizers_give_the_same_logits_bit_for_bit_with_three_groups_fewer_a_layer() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut fused = GpuLlama::with_activations(&dev, m, options(), Activations::Int8).unwrap();
    fused.set_half_blocks(false);
    let mut apart = GpuLlama::with_activations(&dev, m, options(), Activations::Int8).unwrap();
    apart.set_fuse_quantizers(false);
    // Dispatched groups compared (the int8 chain's are `vk_chain`'s).
    for g in [&mut fused, &mut apart] {
        g.set_int8_chain(false);
        g.set_chain(false);
    }
    let layers = m.config().shape.n_layers;
    let mut prompt = t.encode(
        "It is a truth universally acknowledged, that a single man in possession of a good \
         fortune, must be in want of a wife. However little known the feelings or views",
    );
    assert!(prompt.len() >= 31, "{} prompt tokens", prompt.len());
    prompt.truncate(31);
    let plans = [
        BatchPlan {
            seqs: vec![
                seq(prompt[..7].to_vec(), 0, 0),
                seq(prompt[7..].to_vec(), 0, 1),
            ],
        },
        BatchPlan {
            seqs: vec![seq(vec![prompt[7]], 7, 0), seq(vec![prompt[3]], 24, 1)],
        },
    ];
    for (i, plan) in plans.iter().enumerate() {
        let (_, ft) = fused.profile(plan).unwrap();
        let (_, at) = apart.profile(plan).unwrap();
        assert_eq!(count(&ft, "quant_q81"), layers + 2, "plan {i}, fused");
        assert_eq!(count(&at, "quant_q81"), 4 * layers + 1, "plan {i}, apart");
        assert_eq!(at.len() - ft.len(), 3 * layers - 1, "plan {i}: groups");
    }
    // The same plans again (the KV cache rewritten with the same values),
    // now with the logits.
    for (i, plan) in plans.iter().enumerate() {
        let f = fused.submit(plan).unwrap();
        let (ft, fl) = fused.finish_with_logits(f).unwrap();
        let f = apart.submit(plan).unwrap();
        let (at, al) = apart.finish_with_logits(f).unwrap();
        assert_eq!(ft, at, "plan {i}: tokens");
        for (s, (x, y)) in fl.iter().zip(&al).enumerate() {
            let differ = x
                .iter()
                .zip(y)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count();
            assert_eq!(differ, 0, "plan {i}, sequence {s}: {differ} logits differ");
        }
    }
}

/// `Auto` waits for the rows its probe measured, whatever it chose.
#[test]
fn auto_takes_int8_from_the_probes_rows() {
    let Some((m, _)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let g = GpuLlama::with_activations(&dev, m, options(), Activations::Auto).unwrap();
    assert_eq!(g.int8_min_rows(), act_probe::ROWS);
}
