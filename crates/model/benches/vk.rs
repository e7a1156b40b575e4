//! Vulkan / decode benches on the default device (lavapipe on a GPU-less box).
//!
//! - `fence_roundtrip`: record an empty command buffer + `vkQueueSubmit` +
//!   wake on the fence fd (the per-iteration plumbing cost, B-066).
//! - `iteration/{1,8,32}`: one decode iteration of the tiny synthetic model for
//!   N members (one decode token each, 32 cached positions): record + submit +
//!   fence wake + read back, and `submit_cpu/{N}`: the CPU time of recording
//!   and submitting that iteration's ONE command buffer.
//! - `per_member/{8,32}`: the same work as `iteration/N`, but one submit (and
//!   one fence wait) per member: the way this crate does not do it.
//! - `matmul_cpu/{M}`, `matmul_cpu_storage/{M}`, `matmul_gpu/{M}`: FLOP/s of
//!   the batched matmul in its CPU-device forms with the uniform windows
//!   (`matmul_win`, chunked) and with storage-buffer loads only (`matmul8`,
//!   ...), and its workgroup-tiled GPU form, M token rows times a 512x512
//!   weight, 8 dispatches per command buffer (criterion's elements/s =
//!   FLOP/s).
//!
//! Skips (prints a line) when no Vulkan device is present.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use xtc_model::vulkan::f32_model::{GpuModel, GpuOptions};
use xtc_model::vulkan::ops::{Matmul, Ops, Variant};
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};
use xtc_vk::{BindingSet, Buffer, CommandPool, Device, Kernels, Location, Selector};

fn wait_fd(fd: std::os::fd::BorrowedFd<'_>) {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    while rustix::event::poll(&mut fds, None).is_err() {}
}

fn fence_roundtrip(c: &mut Criterion, dev: &Device) {
    let mut pool = CommandPool::new(dev).unwrap();
    c.bench_function("fence_roundtrip", |b| {
        b.iter(|| {
            pool.reset().unwrap();
            let cmd = pool.record_plain().unwrap().finish().unwrap();
            let sub = pool.submit(vec![cmd]).unwrap();
            wait_fd(sub.fence_fd());
        })
    });
}

const CACHED: usize = 32;

fn model(dev: &Device) -> (GpuModel, Vec<SeqWork>) {
    let w = Weights::synthetic(Config::tiny(), 1);
    let opts = GpuOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks: 256,
        },
        max_tokens: 64,
        max_seqs: 32,
        keep_logits: false,
        variant: None,
        kv_image: None,
    };
    let mut gpu = GpuModel::new(dev, &w, opts).unwrap();
    let members: Vec<SeqWork> = (0..32u32)
        .map(|i| SeqWork {
            tokens: vec![i + 1],
            start_pos: CACHED,
            block_table: (i * 4..i * 4 + 4).collect(),
            sample: true,
        })
        .collect();
    // Fill the members' caches: a prefill of CACHED tokens each (in chunks).
    for m in &members {
        let pre = SeqWork {
            tokens: (0..CACHED as u32).collect(),
            start_pos: 0,
            ..m.clone()
        };
        gpu.step(&BatchPlan { seqs: vec![pre] }).unwrap();
    }
    (gpu, members)
}

fn iterations(c: &mut Criterion, dev: &Device) {
    let (mut gpu, members) = model(dev);
    let mut g = c.benchmark_group("decode");
    g.sample_size(20).measurement_time(Duration::from_secs(4));
    for n in [1usize, 8, 32] {
        let plan = BatchPlan {
            seqs: members[..n].to_vec(),
        };
        g.bench_with_input(BenchmarkId::new("iteration", n), &plan, |b, plan| {
            b.iter(|| {
                let f = gpu.submit(plan).unwrap();
                wait_fd(f.fence_fd());
                black_box(gpu.finish(f).unwrap())
            })
        });
        g.bench_with_input(BenchmarkId::new("submit_cpu", n), &plan, |b, plan| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let t = Instant::now();
                    let f = gpu.submit(plan).unwrap();
                    spent += t.elapsed();
                    black_box(gpu.finish(f).unwrap());
                }
                spent
            })
        });
        if n > 1 {
            let singles: Vec<BatchPlan> = plan
                .seqs
                .iter()
                .map(|s| BatchPlan {
                    seqs: vec![s.clone()],
                })
                .collect();
            g.bench_with_input(BenchmarkId::new("per_member", n), &singles, |b, singles| {
                b.iter(|| {
                    for p in singles {
                        let f = gpu.submit(p).unwrap();
                        wait_fd(f.fence_fd());
                        black_box(gpu.finish(f).unwrap());
                    }
                })
            });
        }
    }
    g.finish();
}

fn matmul(c: &mut Criterion, dev: &Device) {
    const N: usize = 512;
    const K: usize = 512;
    const REPS: u64 = 8;
    let kernels = Kernels::new(dev).unwrap();
    let mut w = Buffer::new(dev, (N * K * 4) as u64, Location::Device, "w").unwrap();
    w.upload(0, &vec![0.5f32; N * K]).unwrap();
    let mut act = Buffer::new(dev, (256 * (K + N) * 4) as u64, Location::Device, "act").unwrap();
    act.upload(0, &vec![0.25f32; 256 * K]).unwrap();
    let small: Vec<Buffer> = (0..3)
        .map(|_| Buffer::new(dev, 64, Location::Upload, "unused").unwrap())
        .collect();
    let set = BindingSet::new(&kernels, &[&w, &act, &small[0], &small[1], &small[2]]).unwrap();
    let mut pool = CommandPool::new(dev).unwrap();
    // `matmul_cpu`: the CPU forms with the uniform windows (matmul_win, the
    // default); `matmul_cpu_storage`: storage-buffer loads only (matmul8 and
    // friends); `matmul_gpu`: the workgroup-tiled GPU form.
    let forms = [
        ("matmul_cpu", Variant::Cpu, true),
        ("matmul_cpu_storage", Variant::Cpu, false),
        ("matmul_gpu", Variant::Gpu, false),
    ];
    for (name, variant, windows) in forms {
        let ops = Ops::new(&kernels, variant).unwrap().with_windows(windows);
        let mut g = c.benchmark_group(name);
        g.sample_size(10).measurement_time(Duration::from_secs(3));
        for m in [1usize, 32, 128] {
            g.throughput(Throughput::Elements(2 * (m * N * K) as u64 * REPS));
            g.bench_with_input(BenchmarkId::from_parameter(m), &m, |b, &m| {
                b.iter(|| {
                    pool.reset().unwrap();
                    let mut rec = pool.record(&kernels, &set).unwrap();
                    let op =
                        Matmul::plain(m as u32, N as u32, K as u32, 0, 0, (256 * K) as u32, false);
                    for _ in 0..REPS {
                        ops.run(&mut rec, &op).unwrap();
                    }
                    let cmd = rec.finish().unwrap();
                    let sub = pool.submit(vec![cmd]).unwrap();
                    wait_fd(sub.fence_fd());
                })
            });
        }
        g.finish();
    }
}

fn benches(c: &mut Criterion) {
    let dev = match Device::open(&Selector::Auto) {
        Ok(d) => d,
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!(
                "no Vulkan device ({e}); skipping vk benches (set CI=1 to make this a failure)"
            );
            return;
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    };
    eprintln!(
        "device: {} ({:?}, fence {:?})",
        dev.info().name,
        dev.info().kind,
        dev.fence_kind()
    );
    fence_roundtrip(c, &dev);
    iterations(c, &dev);
    matmul(c, &dev);
}

criterion_group!(vk_benches, benches);
criterion_main!(vk_benches);
