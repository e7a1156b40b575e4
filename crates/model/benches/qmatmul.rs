//! The quantized products at SmolLM2-135M's shapes, every form side by side:
//! GFLOP/s (2 x multiply-adds) and GB/s (weight bytes in their block format)
//! per dispatch group on the default Vulkan device (lavapipe here).
//!
//! Forms: the CPU-device form with 1, 2, 4 or 8 token rows per invocation
//! (`qmm_<ty>_r<R>`, weights in the weight image, x through the uniform
//! window), and the GPU form (`qmm_<ty>_gpu`, 4 rows x 4 outputs a
//! workgroup; from 5 rows `qmm_<ty>_gpu8`, 8 rows; and where
//! `qops::gpu_mm_applies` the tiled `qmm_<ty>_gpu_mm`, 32 x 64; weights
//! in the storage buffer). Each figure is the fastest of several interleaved runs
//! (the build machine is shared: other tenants' slices only add time).
//! `XTC_QMM_ROWS=1,3,8` sets the token rows M measured (default 1, 8, 32).
//! `XTC_QMM_FORMS=name_rR,...` adds experimental entry points to the
//! comparison, `XTC_QMM_NO_GPU=1` leaves out the (slow on lavapipe) GPU form.
//! `cargo bench --bench qmatmul`; `XTC_BENCH_QUICK=1` for fewer runs.

use std::time::Instant;

use xtc_model::format::gguf::GgmlType;
use xtc_model::format::quant::{self, QMatrix};
use xtc_model::vulkan::ops::{Op, Variant};
use xtc_model::vulkan::qops::QMatmul;
use xtc_model::vulkan::qweights::TexelStream;
use xtc_vk::{
    BindingSet, Buffer, CommandPool, Device, DeviceKind, Kernels, Location, Selector, StorageImage,
    TexelFormat,
};

fn main() {
    let dev = match Device::open(&Selector::Auto) {
        Ok(d) => d,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!(
                "qmatmul bench skipped: no Vulkan device ({e}) (set CI=1 to make this a failure)"
            );
            return;
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    };
    let quick = std::env::var_os("XTC_BENCH_QUICK").is_some();
    let cpu_device = dev.info().kind == DeviceKind::Cpu;
    let kernels = Kernels::new(&dev).unwrap();
    let mut rng = fastrand::Rng::with_seed(5);
    // Token rows M of each product (`XTC_QMM_ROWS=1,3,8`; at most 32, the
    // activations uploaded).
    let ms: Vec<usize> = match std::env::var("XTC_QMM_ROWS") {
        Ok(v) => v
            .split(',')
            .map(|r| match r.trim().parse::<usize>() {
                Ok(m) if (1..=32).contains(&m) => m,
                _ => panic!("XTC_QMM_ROWS: {r:?} is not a row count from 1 to 32"),
            })
            .collect(),
        Err(_) => vec![1, 8, 32],
    };
    // (type, N, K, what) at the model's shapes.
    let shapes = [
        (GgmlType::Q4_1, 576, 576, "attn_q / attn_output"),
        (GgmlType::Q4_1, 192, 576, "attn_k / attn_v"),
        (GgmlType::Q4_1, 1536, 576, "ffn_gate / ffn_up"),
        (GgmlType::Q4_1, 576, 1536, "ffn_down"),
        (GgmlType::Q8_0, 49152, 576, "LM head (tied embedding)"),
    ];
    println!("device: {}", dev.info().name);
    println!(
        "{:<26} {:>6} {:>5} {:>3} {:>12} {:>10} {:>9} {:>7}",
        "matrix", "N", "K", "M", "form", "us", "GFLOP/s", "GB/s"
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
        let mut wbuf = Buffer::new(&dev, s.bytes().len() as u64, Location::Device, "w").unwrap();
        wbuf.upload(0, s.bytes()).unwrap();
        let mut act = Buffer::new(&dev, 8 << 20, Location::Device, "act").unwrap();
        let xs: Vec<f32> = (0..32 * k).map(|_| rng.f32() - 0.5).collect();
        act.upload(0, &xs).unwrap();
        let dummy: Vec<Buffer> = (0..3)
            .map(|_| Buffer::new(&dev, 65536, Location::Device, "d").unwrap())
            .collect();
        let bufs = [&wbuf, &act, &dummy[0], &dummy[1], &dummy[2]];
        let set = BindingSet::with_images(&kernels, &bufs, None, Some(&img)).unwrap();
        let win = set.windows();
        let mut pool = CommandPool::new(&dev).unwrap();
        for &m in &ms {
            let op = QMatmul::plain(&t, m as u32, 0, (32 * k) as u32, false);
            let chunks = op.windowed(Variant::Cpu, &win).unwrap();
            // (form, dispatches: kernel, push, grid, window offsets)
            let mut forms = vec![];
            let exp: Vec<(String, u32)> = std::env::var("XTC_QMM_FORMS")
                .ok()
                .map(|v| {
                    v.split(',')
                        .map(|f| {
                            (
                                f.to_string(),
                                f.rsplit('r').next().unwrap().parse().unwrap(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            let named: Vec<(String, u32)> = [1u32, 2, 4, 8]
                .iter()
                .map(|&tile| (format!("qmm_{}_r{tile}", t.ty.name()), tile))
                .chain(exp.into_iter().filter(|(f, _)| f.contains(t.ty.name())))
                .collect();
            for (name, tile) in named {
                if tile > 1 && tile as usize > m {
                    continue;
                }
                let kern = kernels.get(&name).unwrap();
                let ds: Vec<_> = chunks
                    .iter()
                    .map(|c| {
                        (
                            kern,
                            c.push,
                            [c.push.m.div_ceil(tile), c.grid[1], 1],
                            c.offsets,
                        )
                    })
                    .collect();
                forms.push((name.trim_start_matches("qmm_").to_string(), ds, f64::MAX));
            }
            // The GPU form's entry points: `qmm_<ty>_gpu` (4 rows x 4
            // outputs a workgroup), from 5 rows `qmm_<ty>_gpu8` (8 rows),
            // and the tiled `qmm_<ty>_gpu_mm` where `QMatmul::dispatch`
            // picks it (`gpu_mm_applies`), so its thresholds can be re-read.
            let four = format!("qmm_{}_gpu", t.ty.name());
            let eight = format!("qmm_{}_gpu8", t.ty.name());
            let (gpu_name, grid) = op.dispatch(Variant::Gpu);
            if std::env::var_os("XTC_QMM_NO_GPU").is_none() {
                let k4 = kernels.get(&four).unwrap();
                let g4 = [n.div_ceil(4) as u32, m.div_ceil(4) as u32, 1];
                forms.push(("gpu".to_string(), vec![(k4, op, g4, [0, 0])], f64::MAX));
                if m > 4 {
                    let k8 = kernels.get(&eight).unwrap();
                    let g8 = [n.div_ceil(4) as u32, m.div_ceil(8) as u32, 1];
                    forms.push(("gpu8".to_string(), vec![(k8, op, g8, [0, 0])], f64::MAX));
                }
                if gpu_name != four && gpu_name != eight {
                    let kern = kernels.get(gpu_name).unwrap();
                    forms.push((
                        "gpu_mm".to_string(),
                        vec![(kern, op, grid, [0, 0])],
                        f64::MAX,
                    ));
                }
            }
            let reps = if m == 1 { 20 } else { 5 };
            let rounds = if quick { 2 } else { 4 };
            for _ in 0..rounds {
                for f in forms.iter_mut() {
                    // The GPU form (barriers) is slow on lavapipe: one rep
                    // there; on a GPU as many as the others, times 10 (a
                    // dispatch takes microseconds, the submit tens of them).
                    let reps = match (f.0.starts_with("gpu"), cpu_device) {
                        (true, true) => 1,
                        (_, false) => reps * 10,
                        _ => reps,
                    };
                    pool.reset().unwrap();
                    let mut rec = pool.record(&kernels, &set).unwrap();
                    for _ in 0..reps {
                        for (kern, push, grid, offs) in &f.1 {
                            rec.dispatch_windowed(*kern, push, *grid, *offs).unwrap();
                        }
                        rec.barrier();
                    }
                    let cmd = rec.finish().unwrap();
                    let t0 = Instant::now();
                    pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
                    f.2 = f.2.min(t0.elapsed().as_secs_f64() / reps as f64);
                }
            }
            let wbytes = s.bytes().len() as f64;
            for (form, _, secs) in &forms {
                println!(
                    "{:<26} {:>6} {:>5} {:>3} {:>12} {:>10.1} {:>9.2} {:>7.2}",
                    what,
                    n,
                    k,
                    m,
                    form,
                    secs * 1e6,
                    2.0 * (n * k * m) as f64 / secs / 1e9,
                    wbytes / secs / 1e9
                );
            }
        }
    }
}
