//! The int8-activation products against today's f32-activation ones, at
//! SmolLM2-135M's shapes, side by side on the default Vulkan device (the CPU
//! form, lavapipe here): per shape and row count M, the f32 form
//! (`qmm_<ty>_r<R>`), the int8 form with `OpSDot` (`quant_q81` then
//! `qmm8_<ty>_r<R>`, the quantizer's time included), its `_poly` twin and
//! the packed pairs (`swar`: `qmm8_q41_r<R>_swar` for Q4_1, the Q8_0 LM head
//! as `int8` where the device has `OpSDot`, else as `poly`), as
//! microseconds, GOP/s (2 x multiply-adds), GB/s (weight bytes in their block
//! format) and the ratio of f32 time to int8 time (above 1: int8 is faster).
//! Each figure is the fastest of several interleaved runs (the machine is
//! shared). The int8 outputs are checked against the f32 form's: the largest
//! difference relative to the output's RMS is printed (quantizing x to 8 bits
//! costs about 0.5%).
//! `cargo bench --bench qmatmul8`; `XTC_BENCH_QUICK=1` for fewer runs.

use std::time::Instant;

use xtc_model::format::gguf::GgmlType;
use xtc_model::format::quant::{self, QMatrix};
use xtc_model::vulkan::ops::{Op, Variant, Windowed};
use xtc_model::vulkan::qops::QMatmul;
use xtc_model::vulkan::qops8::{DotForm, QMatmul8, QuantizeQ81, q81_len};
use xtc_model::vulkan::qweights::TexelStream;
use xtc_vk::{
    BindingSet, Buffer, CommandPool, Device, Kernel, Kernels, Location, Selector, StorageImage,
    TexelFormat,
};

/// One dispatch: kernel, push constants (every op here is a [`QMatmul`]),
/// grid, window offsets.
type Dispatch = (Kernel, QMatmul, [u32; 3], [u64; 2]);

fn chunks<O: Op>(kernels: &Kernels, ws: Vec<Windowed<O>>, push: fn(O) -> QMatmul) -> Vec<Dispatch> {
    ws.into_iter()
        .map(|w| {
            (
                kernels.get(w.kernel).unwrap(),
                push(w.push),
                w.grid,
                w.offsets,
            )
        })
        .collect()
}

fn main() {
    let dev = match Device::open(&Selector::Auto) {
        Ok(d) => d,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!("qmatmul8 bench skipped: no Vulkan device ({e}) (set CI=1 to fail instead)");
            return;
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    };
    let quick = std::env::var_os("XTC_BENCH_QUICK").is_some();
    let t0 = Instant::now();
    let kernels = Kernels::with_int8(&dev).unwrap();
    let build = t0.elapsed();
    let int8 = kernels
        .names()
        .filter(|n| n.starts_with("qmm8_") || n.starts_with("quant_q81"))
        .count();
    println!(
        "Kernels::with_int8: {} pipelines ({int8} of them int8) in {:.0} ms",
        kernels.names().count(),
        build.as_secs_f64() * 1e3
    );
    let native = dev.integer_dot_product();
    let mut rng = fastrand::Rng::with_seed(7);
    let shapes = [
        (GgmlType::Q4_1, 576, 576, "attn_q / attn_output"),
        (GgmlType::Q4_1, 1536, 576, "ffn_gate / ffn_up"),
        (GgmlType::Q4_1, 576, 1536, "ffn_down"),
        (GgmlType::Q8_0, 49152, 576, "LM head"),
    ];
    println!(
        "device: {} (integer dot product enabled: {native})",
        dev.info().name
    );
    println!(
        "{:<22} {:>6} {:>5} {:>3} {:>6} {:>9} {:>8} {:>7} {:>7} {:>9}",
        "matrix", "N", "K", "M", "form", "us", "GOP/s", "GB/s", "f32/x", "max|d|/rms"
    );
    for (ty, n, k, what) in shapes {
        let w: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
        let bytes = quant::quantize(ty, &w);
        let mat = QMatrix::new(ty, n, k, &bytes).unwrap();
        let mut s = TexelStream::new();
        let t = s.push(&mat).unwrap();
        let rows = (s.texels() as u32).div_ceil(4096);
        let mut img =
            StorageImage::with_format(&dev, TexelFormat::Rgba32U, [4096, rows, 1], "w").unwrap();
        img.upload(s.bytes()).unwrap();
        let wbuf = Buffer::new(&dev, 4096, Location::Device, "w").unwrap();
        // x [32, k] at 0, blocks at xq, y at y0 (f32) and y1 (int8).
        let xq = (32 * k) as u32;
        let y0 = xq + q81_len(32, k as u32);
        let y1 = y0 + (32 * n) as u32;
        let total = u64::from(y1) * 4 + 32 * n as u64 * 4;
        let mut act = Buffer::new(&dev, total, Location::Readback, "act").unwrap();
        let xs: Vec<f32> = (0..32 * k).map(|_| rng.f32() - 0.5).collect();
        act.upload(0, &xs).unwrap();
        let dummy: Vec<Buffer> = (0..3)
            .map(|_| Buffer::new(&dev, 65536, Location::Device, "d").unwrap())
            .collect();
        let bufs = [&wbuf, &act, &dummy[0], &dummy[1], &dummy[2]];
        let set = BindingSet::with_images(&kernels, &bufs, None, Some(&img)).unwrap();
        let win = set.windows();
        let mut pool = CommandPool::new(&dev).unwrap();
        for m in [1u32, 8, 32] {
            let f32_op = QMatmul::plain(&t, m, 0, y0, false);
            let i8_op = QMatmul::plain(&t, m, 0, y1, false);
            let quant = QuantizeQ81::new(m, k as u32, 0, xq, u32::MAX);
            let qd = chunks(&kernels, quant.windowed(Variant::Cpu, &win).unwrap(), |o| {
                o.0
            });
            let mut forms: Vec<(&str, Vec<Vec<Dispatch>>, f64)> = vec![(
                "f32",
                vec![chunks(
                    &kernels,
                    f32_op.windowed(Variant::Cpu, &win).unwrap(),
                    |o| o,
                )],
                f64::MAX,
            )];
            let dots = [
                (DotForm::Native, "int8"),
                (DotForm::Poly, "poly"),
                (DotForm::Swar { native }, "swar"),
            ];
            for (form, label) in dots {
                if form == DotForm::Native && !native {
                    continue;
                }
                let op8 = QMatmul8::new(i8_op, xq, form).unwrap();
                let prod = chunks(&kernels, op8.windowed(Variant::Cpu, &win).unwrap(), |o| o.0);
                forms.push((label, vec![qd.clone(), prod], f64::MAX));
            }
            let reps = if m == 1 { 20 } else { 5 };
            for _ in 0..(if quick { 2 } else { 4 }) {
                for f in forms.iter_mut() {
                    pool.reset().unwrap();
                    let mut rec = pool.record(&kernels, &set).unwrap();
                    for _ in 0..reps {
                        for stage in &f.1 {
                            for (kern, push, grid, offs) in stage {
                                rec.dispatch_windowed(*kern, push, *grid, *offs).unwrap();
                            }
                            rec.barrier();
                        }
                    }
                    rec.host_barrier();
                    let cmd = rec.finish().unwrap();
                    let t0 = Instant::now();
                    pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
                    f.2 = f.2.min(t0.elapsed().as_secs_f64() / reps as f64);
                }
            }
            // Each int8 form once more, alone: its y against the f32 form's.
            let mut a = vec![0f32; m as usize * n];
            act.read(u64::from(y0) * 4, &mut a).unwrap();
            let rms = (a.iter().map(|v| v * v).sum::<f32>() / a.len() as f32).sqrt();
            let mut errs = vec![0f32; forms.len()];
            for (f, e) in forms.iter().zip(errs.iter_mut()).skip(1) {
                pool.reset().unwrap();
                let mut rec = pool.record(&kernels, &set).unwrap();
                rec.fill(&act, u64::from(y1) * 4, u64::from(m) * n as u64 * 4, 0)
                    .unwrap();
                rec.barrier();
                for stage in &f.1 {
                    for (kern, push, grid, offs) in stage {
                        rec.dispatch_windowed(*kern, push, *grid, *offs).unwrap();
                    }
                    rec.barrier();
                }
                rec.host_barrier();
                let cmd = rec.finish().unwrap();
                pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
                let mut b = vec![0f32; m as usize * n];
                act.read(u64::from(y1) * 4, &mut b).unwrap();
                *e = a
                    .iter()
                    .zip(&b)
                    .fold(0f32, |e, (x, y)| e.max((x - y).abs()))
                    / rms;
            }
            let f32_secs = forms[0].2;
            let wbytes = s.bytes().len() as f64;
            for ((form, _, secs), err) in forms.iter().zip(&errs) {
                let e = if *form == "f32" {
                    String::new()
                } else {
                    format!("{err:.4}")
                };
                println!(
                    "{:<22} {:>6} {:>5} {:>3} {:>6} {:>9.1} {:>8.2} {:>7.2} {:>7.2} {:>9}",
                    what,
                    n,
                    k,
                    m,
                    form,
                    secs * 1e6,
                    2.0 * (n * k) as f64 * f64::from(m) / secs / 1e9,
                    wbytes / secs / 1e9,
                    f32_secs / secs,
                    e
                );
            }
        }
    }
}
