//! EXPERIMENT: times the quantized product entry points on the model's shapes
//! (best of several runs, interleaved, since the build machine is shared).
use std::time::Instant;
use xtc::decode::model::gguf::GgmlType;
use xtc::decode::model::quant::{self, QMatrix};
use xtc::decode::qops::QMatmul;
use xtc::decode::qweights::TexelStream;
use xtc::vk::*;

fn main() {
    let dev = Device::open(&Selector::Auto).unwrap();
    let kernels = Kernels::new(&dev).unwrap();
    let mut rng = fastrand::Rng::with_seed(5);
    let filter = std::env::var("ONLY").ok();
    let shapes: Vec<(GgmlType, usize, usize)> = vec![(GgmlType::Q4_1, 3072, 576), (GgmlType::Q8_0, 3072, 576), (GgmlType::Q4_1, 49152, 576), (GgmlType::Q8_0, 49152, 576)];
    let ms = [1usize, 8, 32];
    let tiles: Vec<u32> = std::env::var("TILES").ok().map(|t| t.split(',').map(|v| v.parse().unwrap()).collect()).unwrap_or(vec![1, 2, 4, 8]);
    for (ty, n, k) in shapes {
        let x: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
        let bytes = quant::quantize(ty, &x);
        let m = QMatrix::new(ty, n, k, &bytes).unwrap();
        let mut s = TexelStream::new();
        let t = s.push(&m).unwrap();
        let rows = (s.texels() as u32).div_ceil(4096);
        let mut img = StorageImage::with_format(&dev, TexelFormat::Rgba32U, [4096, rows, 1], "w").unwrap();
        img.upload(s.bytes()).unwrap();
        let mut act = Buffer::new(&dev, 8 << 20, Location::Device, "act").unwrap();
        let xs: Vec<f32> = (0..32 * k).map(|_| rng.f32() - 0.5).collect();
        act.upload(0, &xs).unwrap();
        let dummy: Vec<Buffer> = (0..4).map(|_| Buffer::new(&dev, 65536, Location::Device, "d").unwrap()).collect();
        let bufs = [&dummy[0], &act, &dummy[1], &dummy[2], &dummy[3]];
        let set = BindingSet::with_images(&kernels, &bufs, None, Some(&img)).unwrap();
        let win = set.windows();
        for &mm in &ms {
            let op = QMatmul::plain(&t, mm as u32, 0, (32 * k) as u32, false);
            let chunks = xtc::decode::ops::Op::windowed(&op, xtc::decode::ops::Variant::Cpu, &win).unwrap();
            let mut results = vec![];
            for &tile in &tiles {
                if tile < 100 && tile as usize > mm.max(1) && tile > 1 { continue; }
                let name = if tile >= 100 { ["xa_q80_r4", "xb_q41_r4", "xc_q41_r4"][tile as usize - 100].to_string() } else { format!("qmm_{}_r{}", t.ty.name(), tile) };
                if tile >= 100 && !name.contains(t.ty.name()) { continue; }
                let tile = if tile >= 100 { 4 } else { tile };
                if filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) { continue; }
                let kern = kernels.get(&name).unwrap();
                results.push((name, kern, tile, f64::MAX));
            }
            let mut pool = CommandPool::new(&dev).unwrap();
            let reps = if mm == 1 { 40 } else { 10 };
            for _round in 0..4 {
                for r in results.iter_mut() {
                    pool.reset().unwrap();
                    let mut rec = pool.record(&kernels, &set).unwrap();
                    for _ in 0..reps {
                        for c in &chunks {
                            let grid = [c.push.m.div_ceil(r.2), c.grid[1], 1];
                            rec.dispatch_windowed(r.1, &c.push, grid, c.offsets).unwrap();
                        }
                        rec.barrier();
                    }
                    let cmd = rec.finish().unwrap();
                    let t0 = Instant::now();
                    pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
                    r.3 = r.3.min(t0.elapsed().as_secs_f64() / reps as f64);
                }
            }
            for r in &results {
                let flops = 2.0 * (n * k * mm) as f64;
                println!("{ty} N={n:5} K={k:5} M={mm:2} {:12}: {:9.1} us {:7.2} GFLOP/s", r.0, r.3 * 1e6, flops / r.3 / 1e9);
            }
        }
    }
}
