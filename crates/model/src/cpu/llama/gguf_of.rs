//! A GGUF llama file from llama2.c-order f32 weights ([`gguf_from_weights`]):
//! how tests and the CI suites run the synthetic model through the GGUF
//! model's code.

use crate::Weights;
use crate::format::gguf::{GgmlType, GgufWriter, Value};
use crate::format::quant;

/// A GGUF llama file holding `w` (llama2.c-order f32 weights) with its
/// matrices in `ty`, RoPE base `rope_base`, epsilon 1e-5; untied
/// (`output.weight` is `w.wcls`) unless `tied`, which writes no
/// `output.weight` (the LM head is then the embedding table). No tokenizer
/// keys. For tests and tools: a small model without the real file.
///
/// # Panics
/// If `w`'s dims are not multiples of 32 (the block formats need it for
/// quantized types).
pub fn gguf_from_weights(w: &Weights, ty: GgmlType, rope_base: f32, tied: bool) -> GgufWriter {
    let c = &w.config;
    let (l, d, kv, h, v) = (c.n_layers, c.dim, c.kv_dim(), c.hidden_dim, c.vocab_size);
    let u = |x: usize| Value::U32(x as u32);
    let mut g = GgufWriter::new();
    g.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", u(l))
        .kv("llama.context_length", u(c.seq_len))
        .kv("llama.embedding_length", u(d))
        .kv("llama.feed_forward_length", u(h))
        .kv("llama.attention.head_count", u(c.n_heads))
        .kv("llama.attention.head_count_kv", u(c.n_kv_heads))
        .kv("llama.rope.freq_base", Value::F32(rope_base))
        .kv("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5))
        .kv("llama.vocab_size", u(v));
    let f32s = |x: &[f32]| quant::quantize(GgmlType::F32, x);
    let mat = |g: &mut GgufWriter, name: &str, x: &[f32], rows: usize, cols: usize| {
        g.tensor(
            name,
            &[cols as u64, rows as u64],
            ty,
            quant::quantize(ty, x),
        );
    };
    mat(&mut g, "token_embd.weight", &w.token_embedding, v, d);
    for i in 0..l {
        let n = |s: &str| format!("blk.{i}.{s}.weight");
        g.tensor(
            &n("attn_norm"),
            &[d as u64],
            GgmlType::F32,
            f32s(&w.rms_att[i * d..(i + 1) * d]),
        );
        mat(
            &mut g,
            &n("attn_q"),
            &w.wq[i * d * d..(i + 1) * d * d],
            d,
            d,
        );
        mat(
            &mut g,
            &n("attn_k"),
            &w.wk[i * kv * d..(i + 1) * kv * d],
            kv,
            d,
        );
        mat(
            &mut g,
            &n("attn_v"),
            &w.wv[i * kv * d..(i + 1) * kv * d],
            kv,
            d,
        );
        mat(
            &mut g,
            &n("attn_output"),
            &w.wo[i * d * d..(i + 1) * d * d],
            d,
            d,
        );
        g.tensor(
            &n("ffn_norm"),
            &[d as u64],
            GgmlType::F32,
            f32s(&w.rms_ffn[i * d..(i + 1) * d]),
        );
        mat(
            &mut g,
            &n("ffn_gate"),
            &w.w1[i * h * d..(i + 1) * h * d],
            h,
            d,
        );
        mat(
            &mut g,
            &n("ffn_up"),
            &w.w3[i * h * d..(i + 1) * h * d],
            h,
            d,
        );
        mat(
            &mut g,
            &n("ffn_down"),
            &w.w2[i * d * h..(i + 1) * d * h],
            d,
            h,
        );
    }
    g.tensor(
        "output_norm.weight",
        &[d as u64],
        GgmlType::F32,
        f32s(&w.rms_final),
    );
    if !tied {
        mat(&mut g, "output.weight", &w.wcls, v, d);
    }
    g
}
