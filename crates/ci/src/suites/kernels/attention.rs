//! The KV append and attention cases of `xtc.kernels`: a mixed ready vector
//! over scattered block tables, in the buffer, lane and image forms.

use super::{Bench, NMSE_REDUCE, Spec, ok, rand_vec, spec};
use crate::case::{CaseError, CaseResult, Ctx, ensure};
use crate::check;
use xtc_model::cpu::f32_model::{self, CpuKvCache};
use xtc_model::vulkan::ops::{
    Attention, AttentionImage, AttentionImageQ81, AttentionImageSplit, KvAppend, KvAppendImage,
    KvImage, Op, Variant, pack_metadata,
};
use xtc_model::vulkan::qops8::{Q81_WORDS, q81_len, reference_quantize_q81};
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork};

// ---------------------------------------------------------------- KV append + attention

/// Where the KV cache lives and which attention form reads it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum AttForm {
    /// KV append only (buffer); the cache compared exactly.
    AppendOnly,
    /// `attention` (GPU form, KV buffer).
    Gpu,
    /// `attention_lane` (CPU form, KV buffer).
    Lane,
    /// `kv_append_img` + `attention_img` (CPU form, KV image).
    Image,
    /// `kv_append_img` + `attention_img_q81` (the image form that also
    /// quantizes its output for the int8 products).
    ImageQ81,
    /// `kv_append_img` + `attention_img_split` (the image form with each
    /// (row, head)'s positions split over 8 lanes).
    ImageSplit,
}

pub(super) fn attention_cases(v: &mut Vec<Spec>) {
    // (heads, kv heads, head size, block size)
    let shapes: &[(AttForm, usize, usize, usize, usize)] = &[
        (AttForm::AppendOnly, 4, 2, 32, 16),
        (AttForm::AppendOnly, 3, 1, 6, 4),
        (AttForm::AppendOnly, 9, 3, 64, 16),
        (AttForm::Gpu, 4, 2, 32, 16),
        (AttForm::Gpu, 3, 1, 6, 4),
        (AttForm::Gpu, 2, 2, 130, 5),
        (AttForm::Gpu, 9, 3, 64, 16),
        (AttForm::Lane, 4, 2, 32, 16),
        (AttForm::Lane, 3, 1, 6, 4),
        (AttForm::Lane, 9, 3, 64, 16),
        (AttForm::Image, 4, 2, 32, 16),
        (AttForm::Image, 1, 1, 4, 3),
        (AttForm::Image, 9, 3, 64, 16),
        (AttForm::ImageQ81, 4, 2, 32, 16),
        (AttForm::ImageQ81, 9, 3, 64, 16),
        (AttForm::ImageSplit, 4, 2, 32, 16),
        (AttForm::ImageSplit, 1, 1, 4, 3),
        (AttForm::ImageSplit, 9, 3, 64, 16),
    ];
    for &(form, h, kv, hs, bs) in shapes {
        let (op, fname, entries): (&str, &str, &[&'static str]) = match form {
            AttForm::AppendOnly => ("kv_append", "f32", &["kv_append"]),
            AttForm::Gpu => ("attention", "f32", &["kv_append", "attention"]),
            AttForm::Lane => ("attention", "f32_lane", &["kv_append", "attention_lane"]),
            AttForm::Image => ("attention", "f32_img", &["kv_append_img", "attention_img"]),
            AttForm::ImageQ81 => (
                "attention",
                "f32_img_q81",
                &["kv_append_img", "attention_img_q81"],
            ),
            AttForm::ImageSplit => (
                "attention",
                "f32_img_split",
                &["kv_append_img", "attention_img_split"],
            ),
        };
        v.push(spec(
            format!("xtc.kernels.{op}.{fname}.h{h}_kv{kv}_hs{hs}_bs{bs}"),
            entries,
            move |ctx| attention(ctx, form, (h, kv, hs), bs, false),
        ));
    }
    // Past 2,048 cached positions at SmolLM2's head shapes, in both forms:
    // the GPU form's `attention`, and the CPU form's op, which past the
    // lane loop budget dispatches `attention_direct` (`Attention::dispatch`).
    for (form, fname, entry) in [
        (AttForm::Gpu, "f32", "attention"),
        (AttForm::Lane, "f32_cpu_form", "attention_direct"),
    ] {
        v.push(spec(
            format!("xtc.kernels.attention.{fname}.h9_kv3_hs64_bs16.long"),
            &["kv_append", entry],
            move |ctx| attention(ctx, form, (9, 3, 64), 16, true),
        ));
    }
}

/// A ready vector mixing decode tokens after 0, 1, 70 and 129 cached
/// positions with prefill chunks of 9 and 20 tokens, over block tables in
/// scattered (descending) order: KV append of every row, then attention of
/// every (row, head) over positions `0..=pos`. `long`: instead decode
/// tokens after 2,100 and 3,000 cached positions and a chunk of 5 after
/// 2,047 (attention over more than 2,048 positions).
fn attention(
    ctx: &mut Ctx,
    form: AttForm,
    heads: (usize, usize, usize),
    bs: usize,
    long: bool,
) -> CaseResult {
    let (n_heads, n_kv, hs) = heads;
    let mut rng = ctx.rng();
    let c = Config {
        dim: n_heads * hs,
        hidden_dim: 8,
        n_layers: 2,
        n_heads,
        n_kv_heads: n_kv,
        vocab_size: 16,
        seq_len: if long { 4096 } else { 256 },
    };
    let (dim, kvd) = (c.dim, c.kv_dim());
    let shape: &[(usize, usize)] = if long {
        &[(2100, 1), (2047, 5), (3000, 1)]
    } else {
        &[(70, 1), (0, 9), (1, 1), (13, 20), (0, 1), (129, 3)]
    };
    let geo = KvGeometry {
        block_size: bs,
        n_blocks: shape
            .iter()
            .map(|(c, n)| (c + n).div_ceil(bs))
            .sum::<usize>()
            + 40,
    };
    let mut next_block = 0u32;
    let seqs: Vec<SeqWork> = shape
        .iter()
        .map(|&(cached, n)| {
            let blocks = (cached + n).div_ceil(bs) as u32;
            let bt: Vec<u32> = (next_block..next_block + blocks).rev().collect();
            next_block += blocks;
            SeqWork {
                tokens: vec![0; n],
                start_pos: cached,
                block_table: bt,
                sample: true,
            }
        })
        .collect();
    let plan = BatchPlan { seqs };
    plan.validate(&c, geo)?;
    let layer = 1usize;
    let mut cache = CpuKvCache::new(&c, geo);
    // The cached positions: random K and V, appended on the device too (by
    // a first submission of their own for the image, written for buffers).
    let mut pre_k = Vec::new();
    let mut pre_v = Vec::new();
    for s in &plan.seqs {
        for p in 0..s.start_pos {
            let (k, v) = (rand_vec(&mut rng, kvd, 1.0), rand_vec(&mut rng, kvd, 1.0));
            cache.append(layer, &s.block_table, p, &k, &v);
            pre_k.extend_from_slice(&k);
            pre_v.extend_from_slice(&v);
        }
    }
    let rows = plan.n_tokens();
    let q = rand_vec(&mut rng, rows * dim, 1.0);
    let k = rand_vec(&mut rng, rows * kvd, 1.0);
    let v = rand_vec(&mut rng, rows * kvd, 1.0);
    let mut md = vec![];
    pack_metadata(&plan, bs, &mut md);
    let (kc, vc) = cache.raw();
    let (kc, vc) = (kc.to_vec(), vc.to_vec());
    let image = matches!(
        form,
        AttForm::Image | AttForm::ImageQ81 | AttForm::ImageSplit
    );
    let variant = if form == AttForm::Gpu {
        Variant::Gpu
    } else {
        Variant::Cpu
    };
    // Activations: q, k, v, out; the cached rows' k, v (image only); the
    // output's Q8_1 blocks (`ImageQ81`, at a multiple of 4).
    let pre_rows = pre_k.len() / kvd;
    let blocks_len = q81_len(rows as u32, dim as u32) as usize;
    let act = rows * (2 * dim + 2 * kvd) + 2 * pre_rows * kvd + blocks_len + 4;
    let kv_elems = if image { 1 } else { kc.len() * 2 };
    let pre_plan = BatchPlan {
        seqs: plan
            .seqs
            .iter()
            .filter(|s| s.start_pos > 0)
            .map(|s| SeqWork {
                tokens: vec![0; s.start_pos],
                start_pos: 0,
                block_table: s.block_table.clone(),
                sample: false,
            })
            .collect(),
    };
    let mut pre_md = vec![];
    pack_metadata(&pre_plan, bs, &mut pre_md);
    let md_elems = md.len().max(pre_md.len());
    let elems = [1, act, kv_elems, md_elems, 1];
    let mut b = if image {
        let limits = ctx.device()?.image_limits();
        let img = KvImage::new(&c, geo, limits)
            .ok_or_else(|| CaseError::Fail("the image form refuses this shape".into()))?;
        Bench::build(ctx, elems, variant, Some(img.extent))?
    } else {
        Bench::new(ctx, elems, variant)?
    };
    let (q_at, k_at, v_at, out_at) = (0, rows * dim, rows * (dim + kvd), rows * (dim + 2 * kvd));
    let pre_at = rows * (2 * dim + 2 * kvd);
    b.put(1, q_at, &q)?;
    b.put(1, k_at, &k)?;
    b.put(1, v_at, &v)?;
    let layer_len = geo.n_blocks * bs * kvd;
    let r = rows as u32;
    let (kc_off, vc_off) = if image {
        (layer as u32, (c.n_layers + layer) as u32)
    } else {
        b.put(2, 0, &kc)?;
        b.put(2, kc.len(), &vc)?;
        // The whole cache may be written: exactness is checked below.
        b.output(2, 0, kc.len() * 2);
        (
            b.at(2, layer * layer_len),
            b.at(2, (c.n_layers + layer) * layer_len),
        )
    };
    let append = KvAppend {
        n_rows: r,
        kv_dim: kvd as u32,
        block_size: bs as u32,
        rows_off: b.at(3, 0),
        k_off: b.at(1, k_at),
        v_off: b.at(1, v_at),
        kc_off,
        vc_off,
    };
    let att = Attention {
        n_rows: r,
        n_heads: n_heads as u32,
        n_kv_heads: n_kv as u32,
        head_size: hs as u32,
        block_size: bs as u32,
        rows_off: b.at(3, 0),
        q_off: b.at(1, q_at),
        out_off: b.at(1, out_at),
        kc_off,
        vc_off,
        kv_dim: kvd as u32,
        dim: dim as u32,
        max_pos: plan
            .seqs
            .iter()
            .map(|s| s.start_pos + s.tokens.len() - 1)
            .max()
            .unwrap_or(0) as u32,
    };
    // `ImageQ81`: the output's blocks as the device wrote them.
    let mut blocks: Option<Vec<u32>> = None;
    if image {
        // First submission: the cached positions into the image.
        b.put(1, pre_at, &pre_k)?;
        b.put(1, pre_at + pre_rows * kvd, &pre_v)?;
        b.put(3, 0, &pre_md)?;
        let pre = KvAppendImage(KvAppend {
            n_rows: pre_rows as u32,
            k_off: b.at(1, pre_at),
            v_off: b.at(1, pre_at + pre_rows * kvd),
            ..append
        });
        b.expect(&pre, "kv_append_img")?;
        b.run(|ops, rec| Ok(ops.run(rec, &pre)?))?;
        let img_att = AttentionImage(att);
        ensure(img_att.fits(), || {
            "attention_img does not fit this shape".into()
        })?;
        b.put(3, 0, &md)?;
        b.output(1, out_at, rows * dim);
        let app = KvAppendImage(append);
        if form == AttForm::ImageQ81 {
            let after = pre_at + 2 * pre_rows * kvd;
            let blocks_at = after + (4 - b.at(1, after) as usize % 4) % 4;
            let q81 = AttentionImageQ81 {
                att,
                q_out: b.at(1, blocks_at),
            };
            ensure(q81.fits(), || {
                "attention_img_q81 does not fit this shape".into()
            })?;
            b.output(1, blocks_at, blocks_len);
            after_append(&mut b, &app, &q81, "attention_img_q81")?;
            blocks = Some(b.get::<u32>(1, blocks_at, blocks_len)?);
        } else if form == AttForm::ImageSplit {
            // Every (row, head) of the ready vector as its own workgroup,
            // whatever the count (the model picks this form for few pairs).
            after_append(
                &mut b,
                &app,
                &AttentionImageSplit(att),
                "attention_img_split",
            )?;
        } else {
            after_append(&mut b, &app, &img_att, "attention_img")?;
        }
    } else {
        b.put(3, 0, &md)?;
        b.expect(&append, "kv_append")?;
        if form != AttForm::AppendOnly {
            b.expect(
                &att,
                match (form, long) {
                    (AttForm::Gpu, _) => "attention",
                    (_, true) => "attention_direct",
                    _ => "attention_lane",
                },
            )?;
            b.output(1, out_at, rows * dim);
        }
        b.run(|ops, rec| {
            ops.run(rec, &append)?;
            if form != AttForm::AppendOnly {
                rec.barrier();
                ops.run(rec, &att)?;
            }
            Ok(())
        })?;
    }
    // Reference: append row by row, then attend each row over 0..=pos.
    let mut row = 0;
    for s in &plan.seqs {
        for i in 0..s.tokens.len() {
            cache.append(
                layer,
                &s.block_table,
                s.start_pos + i,
                &k[(row + i) * kvd..][..kvd],
                &v[(row + i) * kvd..][..kvd],
            );
        }
        row += s.tokens.len();
    }
    if !image {
        let (kc, vc) = cache.raw();
        check::bits("K cache after the append", &b.get(2, 0, kc.len())?, kc)?;
        check::bits(
            "V cache after the append",
            &b.get(2, kc.len(), vc.len())?,
            vc,
        )?;
    }
    if form == AttForm::AppendOnly {
        return ok(format!("{rows} rows appended exactly"));
    }
    let mut want = vec![0f32; rows * dim];
    let mut row = 0;
    for s in &plan.seqs {
        for i in 0..s.tokens.len() {
            f32_model::attention(
                &mut want[(row + i) * dim..][..dim],
                &q[(row + i) * dim..][..dim],
                &cache,
                &c,
                layer,
                &s.block_table,
                s.start_pos + i,
            );
        }
        row += s.tokens.len();
    }
    let got = b.get(1, out_at, rows * dim)?;
    let e = check::close("attention output", &got, &want, NMSE_REDUCE)?;
    if let Some(blocks) = blocks {
        // The blocks are `quant_q81`'s of the output the device wrote: codes,
        // d and d * sum bit for bit; the sum of squares (summed in another
        // order, read by no product) within rounding.
        let mut want_q = Vec::with_capacity(blocks.len());
        for row in got.chunks_exact(dim) {
            want_q.extend(reference_quantize_q81(row, None));
        }
        for (i, (g, w)) in blocks
            .chunks_exact(Q81_WORDS as usize)
            .zip(want_q.chunks_exact(Q81_WORDS as usize))
            .enumerate()
        {
            ensure(g[..10] == w[..10] && g[11] == w[11], || {
                format!("block {i} of the quantized output: {g:?} against {w:?}")
            })?;
            let (gs, ws) = (f32::from_bits(g[10]), f32::from_bits(w[10]));
            ensure((gs - ws).abs() <= 1e-5 * ws.abs().max(1e-30), || {
                format!("block {i}'s sum of squares: {gs} against {ws}")
            })?;
        }
        return ok(format!(
            "{rows} rows, NMSE {e:.2e}, {} blocks exact",
            blocks.len() / Q81_WORDS as usize
        ));
    }
    ok(format!("{rows} rows, NMSE {e:.2e}"))
}

/// `op` (which must dispatch `entry`) after `app`, the rows' KV append into
/// the image, a barrier between, in one command buffer.
fn after_append<O: Op>(
    b: &mut Bench,
    app: &KvAppendImage,
    op: &O,
    entry: &str,
) -> Result<(), CaseError> {
    b.expect(op, entry)?;
    b.run(|ops, rec| {
        ops.run(rec, app)?;
        rec.barrier();
        ops.run(rec, op)?;
        Ok(())
    })
}
