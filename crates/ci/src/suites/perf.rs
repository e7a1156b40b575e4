//! `xtc.perf.*`: figures, each the median after a warm-up (the perf groups
//! run alone, after every other group). Without `--perf-baseline` they are
//! report-only (`Pass` with the figure); with it, a figure beyond
//! `--perf-tolerance` on the slow side is `Fail` and on the fast side
//! `UnexpectedImprovement`, compared with the entry of this device and
//! driver.
//!
//! - `submit_wake`: one empty command buffer submitted and its completion
//!   fd woken through poll(2), µs.
//! - `kernel.<form>.<shape>`: a kernel's throughput, GFLOP/s (8 dispatches
//!   per command buffer, as llama.cpp's test-backend-ops repeats an op).
//! - `decode_iter.b<N>`: one decode iteration of the synthetic model with N
//!   members (one token each, after a 16-token prefill), ms.
//! - `decode_iter_smollm2.b<N>`: the same for the real model
//!   (SmolLM2-135M-Instruct Q4_1 on `GpuLlama`; `super::smollm`), ms.

use std::time::{Duration, Instant};

use crate::case::{Case, CaseError, Ctx, Measure, Outcome, Record, Suite};
use crate::rig::Rig;
use crate::support::empty_round_trip;
use xtc_model::vulkan::f32_model::{GpuModel, GpuOptions};
use xtc_model::vulkan::ops::{Matmul, Variant};
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};
use xtc_vk::CommandPool;

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    let s = Suite::Perf;
    v.push(Case::new(s, "xtc.perf.submit_wake", submit_wake));
    for (m, n, k) in [(32, 576, 576), (32, 1536, 576)] {
        v.push(Case::new(
            s,
            format!("xtc.perf.kernel.matmul_f32_win.m{m}_n{n}_k{k}"),
            move |ctx| matmul(ctx, m, n, k),
        ));
    }
    for b in [1usize, 8, 32] {
        v.push(Case::new(
            s,
            format!("xtc.perf.decode_iter.b{b}"),
            move |ctx| decode_iter(ctx, b),
        ));
    }
    // The real model's decode iteration (GpuLlama), 1/8/32 members.
    super::smollm::perf_cases(v);
}

/// Median of `runs` timings of `f` after `warm` untimed calls.
fn median(
    warm: usize,
    runs: usize,
    mut f: impl FnMut() -> Result<(), CaseError>,
) -> Result<Duration, CaseError> {
    for _ in 0..warm {
        f()?;
    }
    let mut t = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        f()?;
        t.push(t0.elapsed());
    }
    t.sort_unstable();
    Ok(t[t.len() / 2])
}

fn figure(value: f64, unit: &str, higher_is_better: bool, note: String) -> Outcome {
    Outcome::record(
        Record::Perf(Measure {
            value,
            unit: unit.into(),
            higher_is_better,
        }),
        note,
    )
}

fn submit_wake(ctx: &mut Ctx) -> Result<Outcome, CaseError> {
    let dev = ctx.device()?;
    let mut pool = CommandPool::new(&dev)?;
    let d = median(50, 500, || {
        empty_round_trip(&mut pool)?;
        Ok(())
    })?;
    let us = d.as_secs_f64() * 1e6;
    Ok(figure(
        us,
        "us",
        false,
        format!("{us:.1} us (median of 500)"),
    ))
}

fn matmul(ctx: &mut Ctx, m: usize, n: usize, k: usize) -> Result<Outcome, CaseError> {
    const REPEAT: usize = 8;
    let kernels = ctx.kernels()?;
    let mut rng = ctx.rng();
    let mut rig = Rig::new(kernels, [n * k, m * k + m * n, 1, 1, 1], Variant::Cpu)?;
    let x: Vec<f32> = (0..m * k).map(|_| rng.f32() - 0.5).collect();
    let w: Vec<f32> = (0..n * k).map(|_| rng.f32() - 0.5).collect();
    rig.write(0, 0, &w)?;
    rig.write(1, 0, &x)?;
    let op = Matmul::plain(m as u32, n as u32, k as u32, 0, 0, (m * k) as u32, false);
    let d = median(3, 15, || {
        rig.run(|ops, rec| -> Result<(), CaseError> {
            for _ in 0..REPEAT {
                ops.run(rec, &op)?;
                rec.barrier();
            }
            Ok(())
        })?;
        Ok(())
    })?;
    let flops = 2.0 * (m * n * k * REPEAT) as f64;
    let gflops = flops / d.as_secs_f64() / 1e9;
    Ok(figure(
        gflops,
        "GFLOP/s",
        true,
        format!("{gflops:.2} GFLOP/s ({REPEAT} products per command buffer, median of 15)"),
    ))
}

fn decode_iter(ctx: &mut Ctx, members: usize) -> Result<Outcome, CaseError> {
    const PROMPT: usize = 16;
    let dev = ctx.device()?;
    let w = Weights::synthetic(Config::tiny(), 1);
    let per_seq = 8; // blocks of 16: 128 positions
    let opts = GpuOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks: per_seq * members,
        },
        max_tokens: (members * PROMPT).max(64),
        max_seqs: members,
        ..GpuOptions::default()
    };
    let mut gpu = GpuModel::new(&dev, &w, opts)?;
    let table = |i: usize| ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect::<Vec<_>>();
    let prefill = BatchPlan {
        seqs: (0..members)
            .map(|i| SeqWork {
                tokens: (0..PROMPT as u32)
                    .map(|t| (t * 7 + i as u32) % 512)
                    .collect(),
                start_pos: 0,
                block_table: table(i),
                sample: true,
            })
            .collect(),
    };
    let mut toks = gpu.step(&prefill)?;
    let mut pos = PROMPT;
    let d = median(5, 25, || {
        let plan = BatchPlan {
            seqs: (0..members)
                .map(|i| SeqWork {
                    tokens: vec![toks[i]],
                    start_pos: pos,
                    block_table: table(i),
                    sample: true,
                })
                .collect(),
        };
        toks = gpu.step(&plan)?;
        pos += 1;
        Ok(())
    })?;
    let ms = d.as_secs_f64() * 1e3;
    Ok(figure(
        ms,
        "ms",
        false,
        format!("{ms:.3} ms per iteration of {members} members (median of 25)"),
    ))
}
