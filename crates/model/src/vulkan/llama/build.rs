//! How [`super::GpuLlama::new`] builds the model, one step each:
//! [`validate`] the options and pick the kernel form, [`repack`] the
//! weights into the texel stream (and the f32 vectors), [`upload`] them
//! (an image on CPU devices, the weights buffer on GPUs), [`allocate`] the
//! KV cache, activations, metadata and readback buffers, and [`bind`] them.

use crate::cpu::llama::Llama;
use crate::format::gguf::Gguf;
use crate::format::llama_config::LlamaConfig;
use crate::format::quant::{self, QMatrix};
use crate::vulkan::chain;
use crate::vulkan::form;
use crate::vulkan::ops::{Attention, AttentionImage, KvImage, Variant};
use crate::vulkan::qops::{argmax_groups, rope_table};
use crate::vulkan::qops8::Q81_WORDS;
use crate::vulkan::qweights::{QTensor, TexelStream};
use crate::vulkan::{ActOffsets, u32_of};
use crate::{Config, ModelError};
use xtc_vk::{BindingSet, Buffer, Device, Kernels, Location, StorageImage, TexelFormat};

use super::options::{GpuLlamaError, GpuLlamaOptions};

type Result<T> = std::result::Result<T, GpuLlamaError>;

/// Width of the weight image in texels (a power of two: the kernels address
/// texel `i` at `(i & 4095, (i >> 12) & 16383, i >> 26)`).
const IMAGE_WIDTH: u32 = 4096;
/// Rows of the weight image per layer (the kernels' `(i >> 12) & 16383`).
const IMAGE_ROWS: u32 = 16384;

/// A projection: one stacked tensor (one dispatch, split outputs; for
/// gate|up the rows interleaved for the fused SwiGLU), or its parts when
/// their formats differ (one dispatch each; gate and up then go through the
/// `swiglu` kernel).
#[derive(Debug, Clone)]
pub(super) enum Proj {
    /// One stacked tensor.
    Stacked(QTensor),
    /// Its parts, one dispatch each.
    Parts(Vec<QTensor>),
}

/// One layer's weights: offsets of its norms in the f32 weights, its
/// projections in the texel stream.
#[derive(Debug, Clone)]
pub(super) struct LayerW {
    pub(super) attn_norm: u32,
    pub(super) ffn_norm: u32,
    pub(super) qkv: Proj,
    pub(super) wo: QTensor,
    pub(super) w13: Proj,
    pub(super) w2: QTensor,
}

fn matrix<'a>(g: &'a Gguf, name: &str) -> Result<QMatrix<'a>> {
    let info = g.tensor(name).map_err(ModelError::Gguf)?;
    let (cols, rows) = (
        info.dims[0] as usize,
        info.dims.get(1).copied().unwrap_or(1) as usize,
    );
    QMatrix::new(info.ty, rows, cols, g.tensor_data(info)).map_err(|e| GpuLlamaError::Options {
        option: "model",
        why: format!("tensor {name}: {e}"),
    })
}

fn norm(g: &Gguf, name: &str, out: &mut Vec<f32>) -> Result<u32> {
    let info = g.tensor(name).map_err(ModelError::Gguf)?;
    let at = out.len();
    out.resize(at + info.n_elements() as usize, 0.0);
    quant::dequantize(info.ty, g.tensor_data(info), &mut out[at..]);
    u32::try_from(at).map_err(|_| GpuLlamaError::Range)
}

fn stack(s: &mut TexelStream, names: &[String], parts: &[QMatrix<'_>]) -> Result<Proj> {
    let repack = |tensor: &str, err| GpuLlamaError::Repack {
        tensor: tensor.into(),
        err,
    };
    if parts.iter().all(|p| p.ty() == parts[0].ty()) {
        return s
            .push_stacked(parts)
            .map(Proj::Stacked)
            .map_err(|e| repack(&names.join("|"), e));
    }
    let mut out = vec![];
    for (n, p) in names.iter().zip(parts) {
        out.push(s.push(p).map_err(|e| repack(n, e))?);
    }
    Ok(Proj::Parts(out))
}

/// Checks `opts` against the model and the device; returns the shape the
/// device runs (`seq_len` is `max_context`) and the kernel form.
///
/// # Errors
/// [`GpuLlamaError::Options`] for zero sizes, a `max_context` above the
/// model's, or the CPU form asked of a device without subgroups of 8;
/// [`GpuLlamaError::Vk`] when the form probe fails.
pub(super) fn validate(
    dev: &Device,
    lc: &LlamaConfig,
    opts: &GpuLlamaOptions,
) -> Result<(Config, Variant)> {
    let bad = |option, why: &str| GpuLlamaError::Options {
        option,
        why: why.into(),
    };
    if opts.max_tokens == 0 || opts.max_seqs == 0 {
        return Err(bad("max_tokens/max_seqs", "must be at least 1"));
    }
    if opts.kv.block_size == 0 || opts.kv.n_blocks == 0 {
        return Err(bad("kv", "block size and block count must be at least 1"));
    }
    if opts.max_context == 0 || opts.max_context > lc.shape.seq_len {
        return Err(bad(
            "max_context",
            &format!("{} is not in 1..={}", opts.max_context, lc.shape.seq_len),
        ));
    }
    let shape = Config {
        seq_len: opts.max_context,
        ..lc.shape
    };
    // The CPU form hands x around subgroups of at least 8 lanes
    // (`subgroupBroadcast` from lanes 0..7) and reduces with
    // `subgroupAdd` / `Max` / `Min`, reads the weights from a 4096 x 16384
    // image and the KV cache from an image within the attention loop budget;
    // without them the GPU form runs (`form::choose`).
    let subgroups = form::cpu_form_supported(dev);
    let fits = cpu_form_fits(dev, &shape, opts);
    let variant = match opts.variant {
        Some(v) => v,
        None => form::choose(dev, subgroups && fits)?,
    };
    if variant == Variant::Cpu && !subgroups {
        let why = if dev.mask().subgroups {
            "masked (XTC_VK_MASK=subgroups)".to_owned()
        } else {
            format!("{:?} lanes", dev.subgroup_size())
        };
        return Err(bad(
            "variant",
            &format!(
                "the CPU form of the kernels needs subgroups of at least 8 lanes with basic, ballot and arithmetic operations; this device's are {why} (use the GPU form: --kernels gpu)"
            ),
        ));
    }
    Ok((shape, variant))
}

/// Whether the CPU form can take `shape` and `opts` on `dev`: the weight
/// image's 16384 rows and a KV image within the device's limits whose
/// attention fits the loop budget ([`AttentionImage::fits`]).
fn cpu_form_fits(dev: &Device, shape: &Config, opts: &GpuLlamaOptions) -> bool {
    dev.image_limits().0 >= IMAGE_ROWS && kv_image(dev, shape, opts).is_some()
}

/// The KV image layout of `shape` over `opts.kv`, when the device's limits
/// hold it and the image attention runs `opts.max_context` positions.
fn kv_image(dev: &Device, shape: &Config, opts: &GpuLlamaOptions) -> Option<KvImage> {
    let hs = shape.head_size();
    KvImage::new(shape, opts.kv, dev.image_limits()).filter(|_| {
        let probe = Attention {
            head_size: hs as u32,
            kv_dim: shape.kv_dim() as u32,
            max_pos: opts.max_context as u32 - 1,
            ..bytemuck::Zeroable::zeroed()
        };
        AttentionImage(probe).fits()
    })
}

/// The weights repacked for the kernels: the texel stream of the matrices
/// and the f32 vectors (norms, the RoPE table), with where each lies.
pub(super) struct Repacked {
    stream: TexelStream,
    f32s: Vec<f32>,
    pub(super) layers: Vec<LayerW>,
    pub(super) embed: QTensor,
    pub(super) head: QTensor,
    pub(super) out_norm: u32,
    pub(super) rope_tab: u32,
}

/// Repacks `model`'s matrices into the texel stream (their block formats
/// kept) and decodes its norms, and the RoPE table for `opts.max_context`.
///
/// # Errors
/// [`GpuLlamaError::Repack`] for a matrix whose rows are not a multiple of
/// 4; [`GpuLlamaError::Range`] when offsets overflow 32 bits; a missing
/// tensor.
pub(super) fn repack(model: &Llama, shape: &Config, opts: &GpuLlamaOptions) -> Result<Repacked> {
    let lc = model.config();
    let g = model.gguf();
    let hs = shape.head_size();
    let mut s = TexelStream::new();
    let mut f32s: Vec<f32> = vec![];
    let mut layers = Vec::with_capacity(shape.n_layers);
    for i in 0..shape.n_layers {
        let n = |t: &str| format!("blk.{i}.{t}.weight");
        let qkv_names = [n("attn_q"), n("attn_k"), n("attn_v")];
        let qkv: Vec<QMatrix> = qkv_names
            .iter()
            .map(|t| matrix(g, t))
            .collect::<Result<_>>()?;
        let w13_names = [n("ffn_gate"), n("ffn_up")];
        let w13: Vec<QMatrix> = w13_names
            .iter()
            .map(|t| matrix(g, t))
            .collect::<Result<_>>()?;
        let single = |s: &mut TexelStream, t: &str| {
            s.push(&matrix(g, t)?).map_err(|err| GpuLlamaError::Repack {
                tensor: t.into(),
                err,
            })
        };
        let qkv = stack(&mut s, &qkv_names, &qkv)?;
        let wo = single(&mut s, &n("attn_output"))?;
        let w13 = match w13[0].ty() == w13[1].ty() {
            true => Proj::Stacked(s.push_interleaved(&w13[0], &w13[1]).map_err(|err| {
                GpuLlamaError::Repack {
                    tensor: w13_names.join("|"),
                    err,
                }
            })?),
            false => stack(&mut s, &w13_names, &w13)?,
        };
        let w2 = single(&mut s, &n("ffn_down"))?;
        layers.push(LayerW {
            attn_norm: norm(g, &n("attn_norm"), &mut f32s)?,
            ffn_norm: norm(g, &n("ffn_norm"), &mut f32s)?,
            qkv,
            wo,
            w13,
            w2,
        });
    }
    let embed_m = matrix(g, "token_embd.weight")?;
    let embed = s.push(&embed_m).map_err(|err| GpuLlamaError::Repack {
        tensor: "token_embd.weight".into(),
        err,
    })?;
    let head = if lc.tied_output {
        embed
    } else {
        s.push(&matrix(g, "output.weight")?)
            .map_err(|err| GpuLlamaError::Repack {
                tensor: "output.weight".into(),
                err,
            })?
    };
    let out_norm = norm(g, "output_norm.weight", &mut f32s)?;
    let rope_tab = u32::try_from(f32s.len()).map_err(|_| GpuLlamaError::Range)?;
    f32s.extend(rope_table(lc.rope_base, hs, opts.max_context));
    Ok(Repacked {
        stream: s,
        f32s,
        layers,
        embed,
        head,
        out_norm,
        rope_tab,
    })
}

/// The weights on the device.
pub(super) struct Uploaded {
    /// The f32 weights (and on GPUs the texel stream before them).
    pub(super) wbuf: Buffer,
    /// The texel stream as an image (CPU devices).
    pub(super) wimg: Option<StorageImage>,
    /// Bytes of the texel stream.
    pub(super) weight_bytes: u64,
}

/// Uploads `w` where `variant` reads it: the stream into an image (CPU
/// devices) or the start of the weights buffer (GPUs; the f32 weights then
/// follow it, and `w`'s f32 offsets are shifted past the stream).
///
/// # Errors
/// [`GpuLlamaError::Range`] when offsets overflow 32 bits; device errors.
pub(super) fn upload(dev: &Device, variant: Variant, w: &mut Repacked) -> Result<Uploaded> {
    let (s, f32s) = (&w.stream, &w.f32s);
    let stream_bytes = s.bytes().len() as u64;
    let (wbuf, wimg, f32_base) = match variant {
        Variant::Cpu => {
            let texels = s.texels().max(1) as u64;
            let per_layer = u64::from(IMAGE_WIDTH) * u64::from(IMAGE_ROWS);
            let layers =
                u32::try_from(texels.div_ceil(per_layer)).map_err(|_| GpuLlamaError::Range)?;
            let rows = if layers > 1 {
                IMAGE_ROWS
            } else {
                texels.div_ceil(u64::from(IMAGE_WIDTH)) as u32
            };
            let mut img = StorageImage::with_format(
                dev,
                TexelFormat::Rgba32U,
                [IMAGE_WIDTH, rows, layers],
                "weights (texel stream)",
            )?;
            img.upload(s.bytes())?;
            let mut buf = Buffer::new(
                dev,
                (f32s.len() * 4) as u64,
                Location::Device,
                "weights f32",
            )?;
            buf.upload(0, f32s)?;
            (buf, Some(img), 0u32)
        }
        Variant::Gpu => {
            let base = u32::try_from(stream_bytes / 4).map_err(|_| GpuLlamaError::Range)?;
            let total = stream_bytes + (f32s.len() * 4) as u64;
            let mut buf = Buffer::new(dev, total, Location::Device, "weights")?;
            buf.upload(0, s.bytes())?;
            buf.upload(stream_bytes, f32s)?;
            (buf, None, base)
        }
    };
    let shift = |o: u32| o.checked_add(f32_base).ok_or(GpuLlamaError::Range);
    for l in &mut w.layers {
        l.attn_norm = shift(l.attn_norm)?;
        l.ffn_norm = shift(l.ffn_norm)?;
    }
    w.out_norm = shift(w.out_norm)?;
    w.rope_tab = shift(w.rope_tab)?;
    Ok(Uploaded {
        wbuf,
        wimg,
        weight_bytes: stream_bytes,
    })
}

/// The buffers one iteration works in.
pub(super) struct Buffers {
    pub(super) act: Buffer,
    pub(super) kv: Buffer,
    pub(super) kv_image: Option<(StorageImage, bool)>,
    pub(super) meta: Buffer,
    pub(super) tokens: Buffer,
    pub(super) logits: Option<Buffer>,
    pub(super) a: ActOffsets,
    pub(super) part_off: u32,
    /// With `int8`, the quantized activations' offsets: the blocks of the
    /// attention output and the gated FFN activations (`quant_q81`'s output,
    /// sized for `max_tokens` rows of the widest product input), and the
    /// blocks of the residual stream x (`max_tokens` rows of `dim`), which
    /// the residual-add products write as they add
    /// ([`QMatmul8::with_quantized_out`](crate::vulkan::qops8::QMatmul8::with_quantized_out))
    /// while they read the first.
    pub(super) xq_off: Option<(u32, u32)>,
    pub(super) kv_layer: u32,
    pub(super) meta_len: usize,
}

/// Allocates the KV cache (an image where the attention form's loop budget
/// allows, on CPU devices), the activations with the LM head's argmax
/// partials, the metadata, the sampled tokens and (with `keep_logits`)
/// the logits readback; with `int8`, room for the quantized activations.
///
/// # Errors
/// [`GpuLlamaError::Options`] for a `max_context` the CPU-device attention
/// cannot run; [`GpuLlamaError::Range`] when sizes overflow 32-bit offsets;
/// device errors.
pub(super) fn allocate(
    dev: &Device,
    shape: &Config,
    opts: &GpuLlamaOptions,
    variant: Variant,
    int8: bool,
) -> Result<Buffers> {
    let hs = shape.head_size();
    let image = kv_image(dev, shape, opts);
    if variant == Variant::Cpu && image.is_none() {
        return Err(GpuLlamaError::Options {
            option: "max_context",
            why: format!(
                "{} positions at head size {hs} exceed what the CPU-device attention runs (or the KV image limits)",
                opts.max_context
            ),
        });
    }
    let image = image.filter(|_| variant == Variant::Cpu);
    let a =
        ActOffsets::new(shape, opts.max_tokens, opts.max_seqs).map_err(|_| GpuLlamaError::Range)?;
    let mul = |a: u64, b: u64| a.checked_mul(b).ok_or(GpuLlamaError::Range);
    let kv_layer = mul(
        mul(opts.kv.n_blocks as u64, opts.kv.block_size as u64)?,
        shape.kv_dim() as u64,
    )?;
    let kv_len = mul(2 * shape.n_layers as u64, kv_layer)?;
    u32_of(kv_len).map_err(|_| GpuLlamaError::Range)?;
    let per_seq = shape.seq_len.div_ceil(opts.kv.block_size) as u64 + 1;
    // Row records, block tables, the sampled rows' list, then room for the
    // persistent chains' programs (at most every dispatch group of an
    // iteration: six a layer and a few more; at least the load-time probe's
    // steps, which it writes from word 0).
    let chain_words = mul(
        (6 * shape.n_layers as u64 + 8).max(u64::from(chain::PROBE_STEPS)),
        u64::from(xtc_vk::kernels::CHAIN_STEP_WORDS),
    )?;
    let meta_len = mul(4, opts.max_tokens as u64)?
        .checked_add(mul(opts.max_seqs as u64, per_seq)?)
        .and_then(|n| n.checked_add(opts.max_seqs as u64 + chain_words))
        .ok_or(GpuLlamaError::Range)?;
    let part_off = u32::try_from(a.len).map_err(|_| GpuLlamaError::Range)?;
    let parts = mul(
        mul(
            opts.max_seqs as u64,
            u64::from(argmax_groups(shape.vocab_size as u32, variant)),
        )?,
        2,
    )?;
    let mut act_len = a.len.checked_add(parts).ok_or(GpuLlamaError::Range)?;
    let xq_off = match int8 {
        true => {
            let at = act_len.next_multiple_of(4);
            let widest = shape.dim.max(shape.hidden_dim) as u64;
            let rows = mul(opts.max_tokens as u64, widest / 32)?;
            let x_at = at
                .checked_add(mul(rows, u64::from(Q81_WORDS))?)
                .ok_or(GpuLlamaError::Range)?;
            let x_rows = mul(opts.max_tokens as u64, shape.dim as u64 / 32)?;
            act_len = x_at
                .checked_add(mul(x_rows, u64::from(Q81_WORDS))?)
                .ok_or(GpuLlamaError::Range)?;
            let off = |v: u64| u32::try_from(v).map_err(|_| GpuLlamaError::Range);
            Some((off(at)?, off(x_at)?))
        }
        false => None,
    };
    u32::try_from(act_len).map_err(|_| GpuLlamaError::Range)?;
    let act = Buffer::new(dev, mul(act_len, 4)?, Location::Device, "activations")?;
    let (kv, kv_image) = match image {
        Some(img) => {
            let [w, h, l] = img.extent;
            let store = StorageImage::new(dev, w, h, l, "kv cache")?;
            (
                Buffer::new(dev, 4, Location::Device, "kv placeholder")?,
                Some((store, false)),
            )
        }
        None => (
            Buffer::zeroed(dev, kv_len * 4, Location::Device, "kv cache")?,
            None,
        ),
    };
    let meta = Buffer::new(dev, meta_len * 4, Location::Upload, "metadata")?;
    // The sampled tokens, then each persistent chain's counter and abort
    // flag (`chain::MAX_CHAINS` pairs).
    let tokens = Buffer::new(
        dev,
        mul(opts.max_seqs as u64 + 2 * u64::from(chain::MAX_CHAINS), 4)?,
        Location::Readback,
        "tokens",
    )?;
    let logits = match opts.keep_logits {
        true => Some(Buffer::new(
            dev,
            mul(mul(opts.max_seqs as u64, shape.vocab_size as u64)?, 4)?,
            Location::Readback,
            "logits",
        )?),
        false => None,
    };
    Ok(Buffers {
        act,
        kv,
        kv_image,
        meta,
        tokens,
        logits,
        a,
        part_off,
        xq_off,
        kv_layer: u32_of(kv_layer).map_err(|_| GpuLlamaError::Range)?,
        meta_len: meta_len as usize,
    })
}

/// Binds the weights and buffers to the kernels' descriptor set.
///
/// # Errors
/// [`GpuLlamaError::StorageRange`] for a buffer beyond the device's storage
/// buffer range; device errors.
pub(super) fn bind(
    dev: &Device,
    kernels: &Kernels,
    up: &Uploaded,
    b: &Buffers,
) -> Result<BindingSet> {
    let bound = [&up.wbuf, &b.act, &b.kv, &b.meta, &b.tokens];
    let names = ["weights", "activations", "KV cache", "metadata", "tokens"];
    let max = dev.max_storage_buffer_range();
    if let Some((x, buffer)) = bound.iter().zip(names).find(|(x, _)| x.size() > max) {
        return Err(GpuLlamaError::StorageRange {
            buffer,
            bytes: x.size(),
            max,
        });
    }
    Ok(BindingSet::with_images(
        kernels,
        &bound,
        b.kv_image.as_ref().map(|(i, _)| i),
        up.wimg.as_ref(),
    )?)
}
