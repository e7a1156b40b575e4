//! The KV cache held in the kernel ABI's storage image (`GpuOptions::kv_image`,
//! the `KvImage` layout, kernels `kv_append_img` and `attention_img`), the
//! default for the CPU forms on lavapipe, against the KV buffer it replaces:
//! the same logits bit for bit over prefill chunks and decode tokens of
//! sequences with scattered block tables, joining and leaving the vector; and
//! the shapes it refuses.

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc::Error;
use xtc_model::vulkan::f32_model::{GpuModel, GpuOptions};
use xtc_model::vulkan::ops::{KvImage, Variant};
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};

const GEO: KvGeometry = KvGeometry {
    block_size: 8,
    n_blocks: 96,
};

fn model(dev: &xtc_vk::Device, w: &Weights, kv_image: bool) -> GpuModel {
    let opts = GpuOptions {
        kv: GEO,
        max_tokens: 64,
        max_seqs: 8,
        keep_logits: true,
        variant: Some(Variant::Cpu),
        kv_image: Some(kv_image),
    };
    GpuModel::new(dev, w, opts).unwrap()
}

/// Block tables that interleave and run backwards, so positions of one
/// sequence are far apart in the cache.
fn table(seq: u32) -> Vec<u32> {
    (0..30).map(|i| 95 - (i * 3 + seq)).collect()
}

#[test]
fn image_and_buffer_caches_give_the_same_logits_bit_for_bit() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(Config::tiny(), 21);
    let mut img = model(&dev, &w, true);
    let mut buf = model(&dev, &w, false);
    assert!(img.kv_in_image() && !buf.kv_in_image());
    let (w_bytes, kv_bytes) = img.memory_bytes();
    assert_eq!(w_bytes, buf.memory_bytes().0);
    assert_eq!(
        kv_bytes,
        buf.memory_bytes().1,
        "the same cache size either way"
    );

    let prompt =
        |s: u32, n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 31 + s * 7) % 512).collect() };
    let work = |s: u32, tokens: Vec<u32>, start_pos: usize, sample: bool| SeqWork {
        tokens,
        start_pos,
        block_table: table(s),
        sample,
    };
    // Iteration plans: a chunked prefill (seq 0: 21 tokens in 13 + 8), a
    // second sequence joining with its whole prompt while seq 0 decodes, a
    // third joining later, seq 1 leaving; positions cross block boundaries.
    let mut pos = [0usize; 3];
    let mut next = [0u32; 3];
    let mut plans: Vec<Vec<(u32, Vec<u32>, bool)>> = vec![
        vec![(0, prompt(0, 13), false)],
        vec![(0, prompt(0, 21)[13..].to_vec(), true)],
        vec![(0, vec![], true), (1, prompt(1, 17), true)],
    ];
    for step in 0..12 {
        let mut p = vec![(0, vec![], true), (1, vec![], true)];
        if step == 3 {
            p.push((2, prompt(2, 9), true));
        } else if step > 3 {
            p.push((2, vec![], true));
        }
        if step > 8 {
            p.remove(1); // seq 1 leaves
        }
        plans.push(p);
    }
    for (it, p) in plans.into_iter().enumerate() {
        let seqs: Vec<SeqWork> = p
            .iter()
            .map(|(s, toks, sample)| {
                let s = *s as usize;
                let tokens = if toks.is_empty() {
                    vec![next[s]]
                } else {
                    toks.clone()
                };
                work(s as u32, tokens, pos[s], *sample)
            })
            .collect();
        let plan = BatchPlan { seqs };
        let (ta, la) = {
            let f = img.submit(&plan).unwrap();
            vk_support::wait_readable(f.fence_fd());
            img.finish_with_logits(f).unwrap()
        };
        let (tb, lb) = {
            let f = buf.submit(&plan).unwrap();
            vk_support::wait_readable(f.fence_fd());
            buf.finish_with_logits(f).unwrap()
        };
        assert_eq!(ta, tb, "iteration {it}: tokens");
        for (a, b) in la.iter().zip(&lb) {
            assert!(
                a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "iteration {it}: logits differ by {}",
                vk_support::max_abs_diff(a, b)
            );
        }
        let mut sampled = ta.iter();
        for (s, w) in p.iter().zip(&plan.seqs) {
            let s = s.0 as usize;
            pos[s] += w.tokens.len();
            if w.sample {
                next[s] = *sampled.next().unwrap();
            }
        }
    }
}

#[test]
fn shapes_the_image_cannot_hold_are_refused_or_keep_the_buffer() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let tiny = Config::tiny();
    let limits = dev.image_limits();
    let geo = KvImage::new(&tiny, GEO, limits).expect("the tiny model fits");
    assert_eq!(
        geo.extent,
        [8 * tiny.kv_dim() as u32 / 4, 96, 2 * tiny.n_layers as u32]
    );
    // kv_dim not a multiple of 4 (head size 6, one KV head).
    let odd = Config {
        dim: 12,
        hidden_dim: 16,
        n_heads: 2,
        n_kv_heads: 1,
        ..tiny
    };
    assert_eq!(odd.kv_dim(), 6);
    assert!(KvImage::new(&odd, GEO, limits).is_none());
    // More blocks than an image side.
    let many = KvGeometry {
        block_size: 8,
        n_blocks: limits.0 as usize + 1,
    };
    assert!(KvImage::new(&tiny, many, limits).is_none());
    // A head wider than the image form's registers (head size 128).
    let wide = Config {
        dim: 256,
        n_heads: 2,
        n_kv_heads: 2,
        ..tiny
    };
    assert!(KvImage::new(&wide, GEO, limits).is_none());

    let w = Weights::synthetic(odd, 3);
    let opts = GpuOptions {
        kv: GEO,
        max_tokens: 16,
        max_seqs: 2,
        variant: Some(Variant::Cpu),
        kv_image: Some(true),
        ..GpuOptions::default()
    };
    assert_eq!(GpuModel::new(&dev, &w, opts).err(), Some(Error::Inval));
    let auto = GpuOptions {
        kv_image: None,
        ..opts
    };
    let mut m = GpuModel::new(&dev, &w, auto).unwrap();
    assert!(!m.kv_in_image(), "the default falls back to the KV buffer");
    let plan = BatchPlan {
        seqs: vec![SeqWork {
            tokens: vec![1, 2, 3],
            start_pos: 0,
            block_table: vec![0],
            sample: true,
        }],
    };
    assert_eq!(m.step(&plan).unwrap().len(), 1);
}

/// A submit that fails after its command buffer began (here: a plan of more
/// token rows than a dispatch grid may have, so the first dispatch is
/// refused) submits nothing, so the image's layout transition recorded in it
/// never ran; the next submit must record it again. It did not: the image was
/// then used in layout `UNDEFINED` as if it were `GENERAL`, which the
/// validation layer reports at the submit (it is on in debug builds when
/// installed, or with `XTC_VK_VALIDATION=1`; lavapipe itself ignores layouts,
/// so without the layer only the logits are checked).
#[test]
fn a_failed_first_submit_leaves_the_image_layout_to_the_next() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let grid_rows = dev.max_compute_work_group_count()[1] as usize;
    // Head size 4 and narrow rows: a plan of grid_rows + 1 rows stays cheap.
    let c = Config {
        dim: 4,
        hidden_dim: 4,
        n_layers: 1,
        n_heads: 1,
        n_kv_heads: 1,
        vocab_size: 8,
        seq_len: 16384,
    };
    let rows = grid_rows + 1;
    let n_seqs = rows.div_ceil(c.seq_len);
    let geo = KvGeometry {
        block_size: 16,
        n_blocks: n_seqs * c.seq_len / 16,
    };
    let w = Weights::synthetic(c, 5);
    let opts = |max_tokens| GpuOptions {
        kv: geo,
        max_tokens,
        max_seqs: n_seqs,
        keep_logits: true,
        variant: Some(Variant::Cpu),
        kv_image: Some(true),
    };
    let mut m = GpuModel::new(&dev, &w, opts(rows)).unwrap();
    let per_seq = c.seq_len / 16;
    let big = BatchPlan {
        seqs: (0..n_seqs)
            .map(|s| {
                let len = (rows - s * c.seq_len).min(c.seq_len);
                SeqWork {
                    tokens: (0..len as u32).map(|t| t % 8).collect(),
                    start_pos: 0,
                    block_table: (0..per_seq as u32)
                        .map(|b| b + (s * per_seq) as u32)
                        .collect(),
                    sample: true,
                }
            })
            .collect(),
    };
    assert_eq!(big.n_tokens(), rows);
    assert!(m.submit(&big).is_err(), "a grid of {rows} rows is refused");
    let small = BatchPlan {
        seqs: vec![SeqWork {
            tokens: vec![1, 2, 3, 4, 5],
            start_pos: 0,
            block_table: vec![3, 1],
            sample: true,
        }],
    };
    let got = {
        let f = m.submit(&small).unwrap();
        m.finish_with_logits(f).unwrap()
    };
    let mut fresh = GpuModel::new(&dev, &w, opts(8)).unwrap();
    let want = {
        let f = fresh.submit(&small).unwrap();
        fresh.finish_with_logits(f).unwrap()
    };
    assert_eq!(got.0, want.0);
    assert_eq!(got.1, want.1);
    assert_eq!(xtc_vk::validation_errors(), 0, "Vulkan validation errors");
}
