//! The quantized kernels (`kernels/qmatmul.wgsl`, `rope_tab`) against their
//! CPU references (`decode::qops`), in both forms: the CPU-device form
//! (weights in the weight image, x through the uniform window, chunked) and
//! the GPU form (weights in the storage buffer, workgroup tiles), on the
//! default device (lavapipe in CI; with `CI` set a missing device fails).

mod vk_support;

use xtc::decode::model::gguf::GgmlType;
use xtc::decode::model::quant::{self, QMatrix};
use xtc::decode::ops::{Ops, Rope, Variant};
use xtc::decode::qops::{
    QEmbed, QMatmul, RopeTable, reference_embed, reference_matmul, reference_rope, rope_table,
};
use xtc::decode::qweights::{QTensor, TexelStream};
use xtc::vk::{
    BindingSet, Buffer, CommandPool, Device, Kernels, Location, StorageImage, TexelFormat,
};

const TYPES: [GgmlType; 5] = [
    GgmlType::Q4_1,
    GgmlType::Q4_0,
    GgmlType::Q8_0,
    GgmlType::F16,
    GgmlType::F32,
];

/// The kernel ABI's buffers (host-visible) with a texel stream in the
/// weight image and at the start of the weights buffer (f32 data after it).
struct QRig {
    ops: Ops,
    pool: CommandPool,
    set: BindingSet,
    bufs: Vec<Buffer>,
    _img: StorageImage,
    kernels: Kernels,
    /// Element offset of the f32 area in the weights buffer.
    f32_base: usize,
}

impl QRig {
    fn new(dev: &Device, s: &TexelStream, f32s: &[f32], act: usize, variant: Variant) -> QRig {
        let kernels = Kernels::new(dev).unwrap();
        let ops = Ops::new(&kernels, variant).unwrap();
        let stream = s.bytes();
        let f32_base = stream.len() / 4;
        let mut w = Buffer::new(
            dev,
            (stream.len() + f32s.len() * 4).max(16) as u64,
            Location::Readback,
            "weights",
        )
        .unwrap();
        if !stream.is_empty() {
            w.write(0, stream).unwrap();
        }
        if !f32s.is_empty() {
            w.write(stream.len() as u64, f32s).unwrap();
        }
        let mut bufs = vec![w];
        for n in [act, 4, 4096, 64] {
            bufs.push(Buffer::new(dev, (n * 4) as u64, Location::Readback, "rig").unwrap());
        }
        let rows = (s.texels().max(1) as u32).div_ceil(4096);
        let mut img =
            StorageImage::with_format(dev, TexelFormat::Rgba32U, [4096, rows, 1], "w").unwrap();
        img.upload(stream).unwrap();
        let refs: Vec<&Buffer> = bufs.iter().collect();
        let set = BindingSet::with_images(&kernels, &refs, None, Some(&img)).unwrap();
        QRig {
            ops,
            pool: CommandPool::new(dev).unwrap(),
            set,
            bufs,
            _img: img,
            kernels,
            f32_base,
        }
    }

    fn write<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) {
        self.bufs[i].write((off * 4) as u64, data).unwrap();
    }

    fn read(&self, off: usize, n: usize) -> Vec<f32> {
        let mut v = vec![0f32; n];
        self.bufs[1].read((off * 4) as u64, &mut v).unwrap();
        v
    }

    fn run(&mut self, f: impl FnOnce(&Ops, &mut xtc::vk::Recorder<'_>)) {
        self.pool.reset().unwrap();
        let mut rec = self.pool.record(&self.kernels, &self.set).unwrap();
        f(&self.ops, &mut rec);
        rec.host_barrier();
        let cmd = rec.finish().unwrap();
        let sub = self.pool.submit(vec![cmd]).unwrap();
        vk_support::wait_readable(sub.fence_fd());
        assert_eq!(xtc::vk::validation_errors(), 0, "Vulkan validation errors");
    }
}

fn rand(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
}

/// Largest difference relative to the reference's scale.
fn rel_err(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(1f32, |a, v| a.max(v.abs()));
    vk_support::max_abs_diff(got, want) / scale
}

struct Case {
    ty: GgmlType,
    bytes: Vec<u8>,
    rows: usize,
    cols: usize,
}

impl Case {
    fn new(rng: &mut fastrand::Rng, ty: GgmlType, rows: usize, cols: usize) -> Case {
        Case {
            ty,
            bytes: quant::quantize(ty, &rand(rng, rows * cols)),
            rows,
            cols,
        }
    }
    fn matrix(&self) -> QMatrix<'_> {
        QMatrix::new(self.ty, self.rows, self.cols, &self.bytes).unwrap()
    }
}

const X_OFF: usize = 64;

/// Runs `op` (x at `X_OFF`, y after it) and returns y `[m, n]`.
fn product(rig: &mut QRig, op: QMatmul, x: &[f32]) -> Vec<f32> {
    rig.write(1, X_OFF, x);
    let y_off = op.y_off as usize;
    rig.write(1, y_off, &vec![0f32; (op.m * op.n) as usize]);
    rig.run(|ops, rec| ops.run(rec, &op).unwrap());
    rig.read(y_off, (op.m * op.n) as usize)
}

#[test]
fn quantized_products_match_the_reference_in_both_forms() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(11);
    // (rows N, cols K, token rows M): a multiple-of-64 N, a ragged N (20: the
    // last invocations compute a clamped copy and store nothing), and
    // K = 1536, where a 64 KiB window holds 10 rows so M = 23 takes three
    // windowed dispatches.
    let shapes = [(20, 96, [1, 2, 3, 5]), (64, 576, [1, 4, 9, 9]), (8, 1536, [1, 2, 23, 23])];
    for (rows, cols, ms) in shapes {
        let cases: Vec<Case> = TYPES.iter().map(|&t| Case::new(&mut rng, t, rows, cols)).collect();
        let mut s = TexelStream::new();
        let ts: Vec<QTensor> = cases.iter().map(|c| s.push(&c.matrix()).unwrap()).collect();
        for variant in [Variant::Cpu, Variant::Gpu] {
            let mut rig = QRig::new(&dev, &s, &[], X_OFF + 32 * cols + 64 * rows + 4096, variant);
            for (c, t) in cases.iter().zip(&ts) {
                for m in ms {
                    let x = rand(&mut rng, m * cols);
                    let y_off = (X_OFF + m * cols).next_multiple_of(4);
                    let got = product(&mut rig, QMatmul::plain(t, m as u32, X_OFF as u32, y_off as u32, false), &x);
                    let want = reference_matmul(&c.matrix(), &x, m);
                    let err = rel_err(&got, &want);
                    assert!(err < 1e-5, "{:?} {} [{rows}x{cols}] m={m}: relative error {err}", variant, c.ty);
                }
            }
        }
    }
}

#[test]
fn split_outputs_and_the_residual_add() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(12);
    let (cols, ns) = (64usize, [16usize, 8, 8]);
    let parts: Vec<Case> = ns.iter().map(|&n| Case::new(&mut rng, GgmlType::Q4_1, n, cols)).collect();
    let mut s = TexelStream::new();
    let mats: Vec<QMatrix> = parts.iter().map(Case::matrix).collect();
    let t = s.push_stacked(&mats).unwrap();
    for variant in [Variant::Cpu, Variant::Gpu] {
        let mut rig = QRig::new(&dev, &s, &[], 8192, variant);
        let m = 3;
        let x = rand(&mut rng, m * cols);
        rig.write(1, X_OFF, &x);
        let ys = [1024u32, 2048, 3072];
        let base = rand(&mut rng, m * 16);
        rig.write(1, 4096, &base);
        let split = QMatmul::split(&t, m as u32, X_OFF as u32, [16, 8, 8], ys);
        // The residual add over the first 16 rows of the stacked matrix (part 0).
        let acc = QMatmul {
            n: 16,
            n1: 16,
            ..QMatmul::plain(&t, m as u32, X_OFF as u32, 4096, true)
        };
        rig.run(|ops, rec| {
            ops.run(rec, &split).unwrap();
            ops.run(rec, &acc).unwrap();
        });
        for (i, (p, &y)) in mats.iter().zip(&ys).enumerate() {
            let want = reference_matmul(p, &x, m);
            let got = rig.read(y as usize, want.len());
            assert!(rel_err(&got, &want) < 1e-5, "{variant:?} part {i}");
        }
        let prod = reference_matmul(&mats[0], &x, m);
        let want: Vec<f32> = base.iter().zip(&prod).map(|(a, b)| a + b).collect();
        assert!(rel_err(&rig.read(4096, want.len()), &want) < 1e-5, "{variant:?} accumulate");
    }
}

#[test]
fn embedding_rows_are_the_dequantized_table() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(13);
    let (vocab, dim) = (40, 96);
    let cases: Vec<Case> = TYPES.iter().map(|&t| Case::new(&mut rng, t, vocab, dim)).collect();
    let mut s = TexelStream::new();
    let ts: Vec<QTensor> = cases.iter().map(|c| s.push(&c.matrix()).unwrap()).collect();
    let tokens = [3u32, 39, 0, 17, 17];
    let records: Vec<u32> = tokens.iter().flat_map(|&t| [t, 0, 0, 0]).collect();
    for variant in [Variant::Cpu, Variant::Gpu] {
        let mut rig = QRig::new(&dev, &s, &[], 4096, variant);
        rig.write(3, 0, &records);
        for (c, t) in cases.iter().zip(&ts) {
            let op = QEmbed::new(t, tokens.len() as u32, 0, 256);
            rig.run(|ops, rec| ops.run(rec, &op).unwrap());
            let got = rig.read(256, tokens.len() * dim);
            let want = reference_embed(&c.matrix(), &tokens);
            // d*q (Q8_0, Q4_0 as d*q + m, F16, F32) is one rounding as on the
            // CPU; Q4_1's d*q + m may be fused on the device (one rounding
            // instead of two).
            let tol = match c.ty {
                GgmlType::Q4_1 | GgmlType::Q4_0 => 1e-6,
                _ => 0.0,
            };
            let err = vk_support::max_abs_diff(&got, &want);
            assert!(err <= tol, "{variant:?} {}: {err}", c.ty);
        }
    }
}

#[test]
fn rope_from_the_table_turns_q_and_k_as_the_reference() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut rng = fastrand::Rng::with_seed(14);
    let (hs, heads, kv_heads, positions) = (64usize, 9usize, 3usize, 300usize);
    let table = rope_table(100000.0, hs, positions);
    let s = TexelStream::new();
    let mut rig = QRig::new(&dev, &s, &table, 8192, Variant::Cpu);
    let pos = [0u32, 1, 57, 299];
    let records: Vec<u32> = pos.iter().flat_map(|&p| [0, 0, p, 0]).collect();
    rig.write(3, 0, &records);
    let (d, kvd) = (heads * hs, kv_heads * hs);
    let q = rand(&mut rng, pos.len() * d);
    let k = rand(&mut rng, pos.len() * kvd);
    rig.write(1, 0, &q);
    rig.write(1, 4096, &k);
    let op = RopeTable {
        rope: Rope {
            n_rows: pos.len() as u32,
            dim: d as u32,
            kv_dim: kvd as u32,
            head_size: hs as u32,
            rows_off: 0,
            q_off: 0,
            k_off: 4096,
        },
        tab_off: rig.f32_base as u32,
    };
    rig.run(|ops, rec| ops.run(rec, &op).unwrap());
    let (mut wq, mut wk) = (q.clone(), k.clone());
    for (i, &p) in pos.iter().enumerate() {
        reference_rope(&table, hs, &mut wq[i * d..(i + 1) * d], p as usize);
        reference_rope(&table, hs, &mut wk[i * kvd..(i + 1) * kvd], p as usize);
    }
    assert!(vk_support::max_abs_diff(&rig.read(0, q.len()), &wq) <= 1e-6);
    assert!(vk_support::max_abs_diff(&rig.read(4096, k.len()), &wk) <= 1e-6);
}
