//! EXPERIMENT: times the forms in kernels/qexp.wgsl on the model's shapes.
use std::time::Instant;
use xtc::vk::*;

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct P { m: u32, n: u32, k: u32, x_off: u32, qs_off: u32, sc_off: u32, y_off: u32, accumulate: u32 }

fn f16(x: f32) -> u16 { half_bits(x) }
fn half_bits(x: f32) -> u16 {
    // round to nearest (test data only)
    let b = x.to_bits(); let s = ((b >> 16) & 0x8000) as u16;
    let e = ((b >> 23) & 0xff) as i32 - 127 + 15; let m = (b >> 13) & 0x3ff;
    if e <= 0 { return s; } s | ((e as u16) << 10) | m as u16
}
fn h2f(h: u16) -> f32 { let s = (h as u32 & 0x8000) << 16; let e = (h >> 10) & 31; let m = (h & 0x3ff) as u32;
    if e == 0 { return f32::from_bits(s); } f32::from_bits(s | ((e as u32 - 15 + 127) << 23) | (m << 13)) }

fn main() {
    let dev = Device::open(&Selector::Auto).unwrap();
    let kernels = Kernels::new(&dev).unwrap();
    let mut rng = fastrand::Rng::with_seed(5);
    let shapes = [(576usize, 576usize), (1536, 576), (576, 1536), (192, 576)];
    for &(n, k) in &shapes {
        let nb = k / 32;
        // qs texels then scale texels
        let mut tex: Vec<u32> = vec![];
        let mut qs = vec![0u8; n * nb * 16];
        rng.fill(&mut qs);
        let dm: Vec<(u16, u16)> = (0..n * nb).map(|_| (f16(rng.f32() * 0.02), f16(rng.f32() * -0.1))).collect();
        tex.extend(qs.chunks(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
        let sc_off = (tex.len() / 4) as u32;
        for g in 0..n / 4 { for b in 0..nb { for r in 0..4 { let (d, m) = dm[(4 * g + r) * nb + b]; tex.push(d as u32 | (m as u32) << 16); } } }
        let texels = tex.len() / 4;
        let h = texels.div_ceil(4096) as u32;
        let mut img = StorageImage::with_format(&dev, TexelFormat::Rgba32U, [4096, h, 1], "w").unwrap();
        img.upload(bytemuck::cast_slice(&tex)).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.f32() - 0.5).collect();
        let mut act = Buffer::new(&dev, 4 << 20, Location::Device, "act").unwrap();
        act.upload(0, &x).unwrap();
        let dummy: Vec<Buffer> = (0..4).map(|_| Buffer::new(&dev, 65536, Location::Device, "d").unwrap()).collect();
        let bufs = [&dummy[0], &act, &dummy[1], &dummy[2], &dummy[3]];
        let set = BindingSet::with_images(&kernels, &bufs, None, Some(&img)).unwrap();
        let out = Buffer::new(&dev, (n * 4 * 32) as u64, Location::Readback, "out").unwrap();
        // reference
        let mut want = vec![0f64; n];
        for r in 0..n { for b in 0..nb { let (d, m) = dm[r * nb + b]; let (d, m) = (h2f(d) as f64, h2f(m) as f64);
            for j in 0..16 { let byte = qs[(r * nb + b) * 16 + j];
                want[r] += (d * (byte & 15) as f64 + m) * x[b * 32 + j] as f64 + (d * (byte >> 4) as f64 + m) * x[b * 32 + j + 16] as f64; } } }
        let y_off = 65536u32;
        let push = P { m: 1, n: n as u32, k: k as u32, x_off: 0, qs_off: 0, sc_off, y_off, accumulate: 0 };
        let variants: Vec<(&str, u32, u32)> = vec![("qexp_xwin", 1, 4), ("qexp_xsg", 1, 4), ("qt_r1c4", 1, 4), ("qt_r2c4", 2, 4), ("qt_r4c4", 4, 4), ("qt_r4c2", 4, 2), ("qt_r8c2", 8, 2), ("qt_r8c1", 8, 1), ("qt_r2c2", 2, 2)];
        let only: Option<String> = std::env::var("ONLY").ok();
        for &m in &[1usize, 8, 32] {
        let xm: Vec<f32> = (0..m).flat_map(|_| x.iter().copied()).collect();
        act.upload(0, &xm).unwrap();
        for &(name, rr, cc) in &variants {
            if only.as_ref().is_some_and(|o| !name.contains(o.as_str())) { continue; }
            if name.starts_with("qexp") && m > 1 { continue; }
            let kern = kernels.get(name).unwrap();
            let mut pool = CommandPool::new(&dev).unwrap();
            let per = ((16384 / k) / rr as usize * rr as usize).min(m).max(1);
            let reps = 100;
            let mut best = f64::MAX;
            for it in 0..3 {
                pool.reset().unwrap();
                let mut rec = pool.record(&kernels, &set).unwrap();
                for _ in 0..if it == 0 { 1 } else { reps } {
                    let mut r = 0;
                    while r < m {
                        let cnt = per.min(m - r);
                        let pu = P { m: cnt as u32, y_off: y_off + (r * n) as u32, ..push };
                        let grid = [(n as u32 / cc).div_ceil(16), (cnt as u32).div_ceil(rr), 1];
                        rec.dispatch_windowed(kern, &pu, grid, [0, (r * k * 4) as u64]).unwrap();
                        r += cnt;
                    }
                    rec.barrier();
                }
                rec.copy(&act, y_off as u64 * 4, &out, 0, (n * m) as u64 * 4).unwrap();
                rec.host_barrier();
                let cmd = rec.finish().unwrap();
                let t = Instant::now();
                pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
                let dt = t.elapsed().as_secs_f64() / reps as f64;
                if it == 0 {
                    let mut got = vec![0f32; n * m]; out.read(0, &mut got).unwrap();
                    let err = got.iter().enumerate().map(|(i, g)| (*g as f64 - want[i % n]).abs()).fold(0.0, f64::max);
                    if err > 1e-3 { println!("{name} {n}x{k}: WRONG max err {err} {:?} {:?}", &got[..4], &want[..4]); }
                } else { best = best.min(dt); }
            }
            let flops = 2.0 * (n * k * m) as f64;
            let bytes = n as f64 * k as f64 * 20.0 / 32.0;
            println!("{name:12} M={m:2} N={n:5} K={k:5}: {:8.1} us  {:6.2} GFLOP/s {:6.2} GB/s", best * 1e6, flops / best / 1e9, bytes / best / 1e9);
        }
        }
    }
}
