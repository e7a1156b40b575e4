//! Batched doorbell publication on the emulated NPU: the D-14 figures.
//!
//! ```text
//! cargo run --example npu_dispatch -- [--reps N] [--trace out.json]
//! ```
//!
//! Prints, for per-task vs cross-task publication on the a2a3-like profile
//! (alternating A/B runs of the same decode-like graph): store fences and
//! doorbell stores per pop, median publish span (first to last doorbell store
//! of a multi-task pop) and median first-to-last core start span. Then the
//! sync_start stress scene (drain count, retries, stop-the-world time) and
//! the reclaim watermark (publications per advance, stall ends). `--trace`
//! writes the cross-task run's core swimlanes as Chrome trace / Perfetto JSON.
//! Last, an async batch group whose `NpuStep` runs each ready vector as one
//! NPU graph (`Exec::Future` resolved by the device thread).

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;

use clap::Parser;
use xtc::batch::{AsyncOpts, CloseMode, Group};
use xtc::rt::Loop;
use xtc_dispatch::scenarios::{decode_waves, sync_start_stress};
use xtc_dispatch::{
    DeviceProfile, Graph, NpuDevice, NpuStep, NpuWork, PublishMode, RunOpts, Scheduler, Shape,
    StepOpts, Summary, TaskSpec, chrome_trace,
};

#[derive(Parser)]
struct Args {
    /// A/B repetitions of the publication comparison.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Write the swimlane of the last cross-task run here.
    #[arg(long)]
    trace: Option<std::path::PathBuf>,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v[v.len() / 2]
}

fn publication(args: &Args) -> xtc::Result<()> {
    // One scheduler thread owns all 24 clusters, so a pop can carry up to 24
    // single-block AIC tasks (the qwen3 out_proj case) on this 2-core host.
    let prof = DeviceProfile {
        sched_threads: 1,
        ..DeviceProfile::a2a3()
    };
    let s = Scheduler::new(prof)?;
    let g = decode_waves(20, 24, 30_000);
    let mut res: [Vec<Summary>; 2] = [Vec::new(), Vec::new()];
    let mut last = None;
    for rep in 0..args.reps {
        // ABBA order: per-task first on even reps, cross-task first on odd.
        let order = if rep % 2 == 0 { [0, 1] } else { [1, 0] };
        for i in order {
            let mode = [PublishMode::PerTask, PublishMode::CrossTask][i];
            let r = s.run_threads(
                &g,
                RunOpts {
                    publish: mode,
                    ..RunOpts::default()
                },
            )?;
            assert!(r.outputs_exact() && r.fault.is_none());
            res[i].push(r.summary.clone());
            if i == 1 {
                last = Some(r);
            }
        }
    }
    println!(
        "publication (a2a3 profile, 1 scheduler thread, {} A/B reps):",
        args.reps
    );
    println!(
        "mode        fences/pop  doorbells/pop  multi-task pops  publish span ns  start span ns"
    );
    let mut spans = [0u64; 2];
    for (i, name) in ["per-task", "cross-task"].iter().enumerate() {
        let v = &res[i];
        let ps = median(v.iter().map(|s| s.median_publish_span_ns).collect());
        let ss = median(v.iter().map(|s| s.median_start_span_ns).collect());
        spans[i] = ps;
        println!(
            "{name:<11} {:>10.2}  {:>13.2}  {:>15}  {ps:>15}  {ss:>13}",
            v[0].fences_per_pop, v[0].doorbells_per_pop, v[0].multi_task_pops
        );
    }
    println!(
        "publish span ratio per-task/cross-task: {:.1}x",
        spans[0] as f64 / spans[1].max(1) as f64
    );
    if let (Some(path), Some(r)) = (&args.trace, last) {
        std::fs::write(path, chrome_trace(&r.events)).map_err(|_| xtc::Error::Inval)?;
        println!("swimlane: {} events -> {}", r.events.len(), path.display());
    }
    Ok(())
}

fn stress() -> xtc::Result<()> {
    let s = Scheduler::new(DeviceProfile::a2a3())?;
    let rounds = 20u64;
    // Head-start sensitivity (reference §7.5): the sync_start exclusion on
    // (shipped) and off (cross-task flush even for sync pops).
    for exclusion in [true, false] {
        let opts = RunOpts {
            sync_exclusion: exclusion,
            ..RunOpts::default()
        };
        let (mut drains, mut retries, mut stw, mut sync_f, mut sync_p) = (0, 0, 0, 0.0, 0);
        let mut stagger = Vec::new();
        for round in 0..rounds {
            let r = s.run_threads(&sync_start_stress(24, round), opts.clone())?;
            assert!(r.outputs_exact() && r.fault.is_none(), "round {round}");
            drains += r.summary.drains;
            retries += r.summary.drain_retries;
            stw += r.summary.stw_ns;
            sync_f += r.summary.fences_per_sync_pop;
            sync_p += r.pops.iter().filter(|p| p.sync).count();
            stagger.push(r.summary.first_dispatch_stagger_ns);
        }
        println!(
            "stress (a2a3, 3 scheduler threads, real threads, {rounds} rounds x 54 tasks, \
             exclusion {exclusion}): drains {drains}, retries {retries}, stop-the-world {} us \
             total, sync pops {sync_p}, mean fences per sync pop {:.2}, median cross-thread \
             first-dispatch stagger {} ns",
            stw / 1000,
            sync_f / rounds as f64,
            median(stagger)
        );
    }
    Ok(())
}

fn watermark() -> xtc::Result<()> {
    let s = Scheduler::new(DeviceProfile::small())?;
    let mut g = Graph::new();
    for _ in 0..6 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(200_000));
    }
    g.open_scope();
    for _ in 0..4 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(2_000));
    }
    g.close_scope();
    for _ in 0..200 {
        g.add(TaskSpec::new(Shape::Aic, 1).lasting(2_000));
    }
    for handshake in [false, true] {
        let opts = RunOpts {
            window: Some(8),
            handshake,
            ..RunOpts::default()
        };
        let so = StepOpts {
            tick_ns: 1_000,
            max_steps: 5_000_000,
            ..StepOpts::seeded(1)
        };
        let r = s
            .run_stepped(&g, opts, so)
            .map_err(|_| xtc::Error::Internal)?;
        let (p, a) = r.watermark;
        let first = r.stalls.iter().find(|s| s.task == 8);
        println!(
            "watermark (window 8, K 16, handshake {handshake}): {p} publications / {a} advances \
             = {:.3} per advance; task-8 stall {:?} ended by {:?}",
            p as f64 / a as f64,
            first.map(|s| std::time::Duration::from_nanos(s.end_ns - s.start_ns)),
            first.map(|s| s.how)
        );
    }
    Ok(())
}

/// A member of the batch-group demo: `left` iterations of one NPU task.
struct Job {
    task: TaskSpec,
    left: u32,
}

impl NpuWork for Job {
    fn task(&self) -> TaskSpec {
        self.task.clone()
    }
    fn advance(&mut self) -> bool {
        self.left -= 1;
        self.left == 0
    }
}

/// The NPU as an async batch engine: each ready vector runs as one graph.
fn group() -> xtc::Result<()> {
    let dev = Arc::new(NpuDevice::start(
        DeviceProfile::small(),
        RunOpts::default(),
    )?);
    let step = NpuStep::new(dev);
    let runs = step.runs();
    let lp = Loop::new()?;
    let done = Rc::new(Cell::new(0));
    let d = done.clone();
    let opts = AsyncOpts {
        capacity: 32,
        max_active: 8,
        resource_capacity: 32,
        ..AsyncOpts::default()
    };
    let g = Group::create_async(&lp, opts, step, move |_h, _r: Job, res: xtc::Result<()>| {
        d.set(d.get() + u32::from(res.is_ok()))
    })?;
    for i in 0..32u32 {
        let shape = [Shape::Aiv, Shape::Aic, Shape::Mix][i as usize % 3];
        let task = TaskSpec::new(shape, 1 + i % 3).lasting(5_000);
        g.submit(
            Job {
                task,
                left: 1 + i % 4,
            },
            1,
        )
        .map_err(|e| e.error)?;
    }
    g.close(CloseMode::Drain)?;
    lp.run()?;
    g.destroy()?;
    let runs = runs.lock().unwrap();
    println!(
        "async group: {} of 32 members done in {} device runs (mean ready vector {:.1})",
        done.get(),
        runs.len(),
        runs.iter().sum::<usize>() as f64 / runs.len() as f64
    );
    Ok(())
}

pub fn main() -> xtc::Result<()> {
    let args = Args::parse();
    publication(&args)?;
    stress()?;
    watermark()?;
    group()
}
