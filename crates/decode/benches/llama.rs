//! SmolLM2-135M-Instruct (Q4_1 GGUF) on the default Vulkan device
//! (lavapipe here): the figures side by side with llama.cpp's on the
//! same file and machine kind, as ratios, and where one iteration's time
//! goes (device timestamps per kernel group, with each product's GFLOP/s and
//! GB/s at the model's shapes).
//!
//! `cargo bench --bench llama` (prints a table; needs the model file, see
//! `scripts/fetch-model.sh`, and a Vulkan device; skips with a line without
//! them, or fails when `CI` is set). `XTC_BENCH_QUICK=1` runs shorter loops.

use std::collections::BTreeMap;
use std::time::Instant;

use xtc_decode::model::cpu::llama::Llama;
use xtc_decode::model::vulkan::llama::{GpuLlama, GpuLlamaOptions};
use xtc_decode::model::{BatchPlan, KvGeometry, SeqWork, find_model};
use xtc_vk::{Device, Selector};

/// llama.cpp on the same GGUF and machine kind (the figures).
const LLAMA_CPU_TG1: f64 = 116.0;
const LLAMA_CPU_AGG: [(usize, f64); 3] = [(8, 236.0), (16, 262.0), (32, 253.0)];
const LLAMA_VK_PP512: f64 = 10.0;
const LLAMA_VK_TG128: f64 = 2.1;

const BLOCK: usize = 16;

/// CPU seconds this process has used, all threads (llvmpipe's workers
/// included): `utime + stime` of /proc/self/stat, 10 ms resolution. On a
/// shared machine wall time counts the other tenants' slices too; CPU time
/// counts only the work, so `cpu / 2` estimates the wall time on a quiet
/// 2-core machine (an optimistic one: it assumes both cores busy).
fn cpu_seconds() -> f64 {
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit(')').next().unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// Wall and CPU seconds of `f`.
fn timed<T>(f: impl FnOnce() -> T) -> (T, f64, f64) {
    let (w, c) = (Instant::now(), cpu_seconds());
    let out = f();
    (out, w.elapsed().as_secs_f64(), cpu_seconds() - c)
}

struct Member {
    table: Vec<u32>,
    pos: usize,
    last: u32,
}

fn members(n: usize, blocks_each: usize) -> Vec<Member> {
    (0..n)
        .map(|i| Member {
            table: (0..blocks_each)
                .map(|b| (i * blocks_each + b) as u32)
                .collect(),
            pos: 0,
            last: 0,
        })
        .collect()
}

/// Prefills every member with `prompt` tokens (iterations of at most
/// `max_tokens` rows), returns the seconds taken.
fn prefill(gpu: &mut GpuLlama, ms: &mut [Member], prompt: &[u32], max_tokens: usize) -> f64 {
    let t0 = Instant::now();
    let mut next = 0;
    while next < ms.len() {
        let mut plan = BatchPlan::default();
        let mut rows = 0;
        let mut took = vec![];
        for (i, m) in ms.iter().enumerate().skip(next) {
            let left = prompt.len() - m.pos;
            let n = left.min(max_tokens - rows);
            if n == 0 {
                break;
            }
            plan.seqs.push(SeqWork {
                tokens: prompt[m.pos..m.pos + n].to_vec(),
                start_pos: m.pos,
                block_table: m.table.clone(),
                sample: m.pos + n == prompt.len(),
            });
            rows += n;
            took.push((i, n));
        }
        let toks = gpu.step(&plan).unwrap();
        let mut k = 0;
        for &(i, n) in &took {
            ms[i].pos += n;
            if ms[i].pos == prompt.len() {
                ms[i].last = toks[k];
                k += 1;
                next = next.max(i + 1);
            }
        }
    }
    t0.elapsed().as_secs_f64()
}

fn decode_plan(ms: &[Member]) -> BatchPlan {
    BatchPlan {
        seqs: ms
            .iter()
            .map(|m| SeqWork {
                tokens: vec![m.last],
                start_pos: m.pos,
                block_table: m.table.clone(),
                sample: true,
            })
            .collect(),
    }
}

/// Runs `steps` decode iterations of all members; returns seconds.
fn decode(gpu: &mut GpuLlama, ms: &mut [Member], steps: usize) -> f64 {
    let t0 = Instant::now();
    for _ in 0..steps {
        let toks = gpu.step(&decode_plan(ms)).unwrap();
        for (m, t) in ms.iter_mut().zip(toks) {
            m.pos += 1;
            m.last = t;
        }
    }
    t0.elapsed().as_secs_f64()
}

/// Multiply-adds of one product group at `m` rows (for the profile).
fn macs(label: &str, m: usize, samples: usize) -> Option<(f64, f64)> {
    // (multiply-adds per row, weight bytes) at SmolLM2-135M's shapes.
    let q41 = |n: f64, k: f64| (n * k, n * k * 20.0 / 32.0);
    let (per_row, bytes) = match label {
        "qmm norm.q|k|v" => q41(960.0, 576.0),
        "qmm o (+x)" => q41(576.0, 576.0),
        "qmm norm.gate|up, swiglu" => q41(3072.0, 576.0),
        "qmm down (+x)" => q41(576.0, 1536.0),
        "qmm LM head (+argmax partials)" => (49152.0 * 576.0, 49152.0 * 576.0 * 34.0 / 32.0),
        _ => return None,
    };
    let rows = if label.starts_with("qmm LM head") {
        samples
    } else {
        m
    };
    Some((per_row * rows as f64, bytes))
}

fn profile(gpu: &mut GpuLlama, ms: &mut [Member], reps: usize) {
    let n = ms.len();
    // Per group, the fastest of `reps` iterations (a shared machine's
    // preemptions only ever add time).
    let mut best: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
    let mut order: Vec<&'static str> = vec![];
    for _ in 0..reps {
        let (toks, times) = gpu.profile(&decode_plan(ms)).unwrap();
        for (m, t) in ms.iter_mut().zip(toks) {
            m.pos += 1;
            m.last = t;
        }
        let mut this: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
        for (l, ns) in times {
            if !order.contains(&l) {
                order.push(l);
            }
            let e = this.entry(l).or_insert((0.0, 0));
            e.0 += ns;
            e.1 += 1;
        }
        for (l, v) in this {
            let e = best.entry(l).or_insert(v);
            e.0 = e.0.min(v.0);
        }
    }
    let sum = best;
    let total: f64 = sum.values().map(|v| v.0).sum();
    println!(
        "\none iteration, {n} member(s) decoding at position {} (device timestamps, fastest of {reps} per group): {:.2} ms",
        ms[0].pos,
        total / 1e6
    );
    println!(
        "{:<32} {:>6} {:>9} {:>6} {:>9} {:>8}",
        "group", "count", "ms", "share", "GFLOP/s", "GB/s"
    );
    for l in order {
        let (ns, count) = sum[l];

        let (gf, gb) = match macs(l, n, n) {
            Some((m, b)) => {
                let s = ns / count as f64 / 1e9;
                (
                    format!("{:.2}", 2.0 * m / s / 1e9),
                    format!("{:.2}", b / s / 1e9),
                )
            }
            None => ("".into(), "".into()),
        };
        println!(
            "{:<32} {:>6} {:>9.3} {:>5.1}% {:>9} {:>8}",
            l,
            count,
            ns / 1e6,
            100.0 * ns / total,
            gf,
            gb
        );
    }
}

fn main() {
    let path = match find_model(None) {
        Ok(p) => p,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!("llama bench skipped: {e} (set CI=1 to make this a failure)");
            return;
        }
        Err(e) => panic!("CI is set but the model file is missing: {e}"),
    };
    let dev = match Device::open(&Selector::Auto) {
        Ok(d) => d,
        Err(e) if std::env::var_os("CI").is_none() => {
            println!(
                "llama bench skipped: no Vulkan device ({e}) (set CI=1 to make this a failure)"
            );
            return;
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    };
    let quick = std::env::var_os("XTC_BENCH_QUICK").is_some();
    let model = Llama::load(&path).unwrap();
    let max_tokens = 256;
    let opts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: 256,
        },
        max_tokens,
        max_seqs: 32,
        max_context: 1024,
        keep_logits: false,
        variant: None,
    };
    let t0 = Instant::now();
    let mut gpu = GpuLlama::new(&dev, &model, opts).unwrap();
    let (w, f, kv) = gpu.memory_bytes();
    println!(
        "device: {} ({:?} forms); load {:.2} s; device memory: quantized weights {:.1} MB, f32 {:.1} MB, KV cache {:.1} MB",
        dev.info().name,
        gpu.variant(),
        t0.elapsed().as_secs_f64(),
        w as f64 / 1e6,
        f as f64 / 1e6,
        kv as f64 / 1e6
    );
    let vocab = gpu.config().vocab_size as u32;
    let prompt =
        |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect() };

    // Prompt processing: 512 tokens of one sequence.
    let mut one = members(1, 40);
    let (_, pp, pp_cpu) = timed(|| prefill(&mut gpu, &mut one, &prompt(512), max_tokens));
    // One stream: 128 generated tokens after a one-token prompt (llama.cpp's
    // tg128 starts from an empty context).
    let tg_n = if quick { 32 } else { 128 };
    let mut one = members(1, 40);
    prefill(&mut gpu, &mut one, &prompt(1), max_tokens);
    let (_, tg, tg_cpu) = timed(|| decode(&mut gpu, &mut one, tg_n));

    println!(
        "\nrates: measured on the wall clock (this machine is shared: read them as lower bounds)"
    );
    println!(
        "and, in brackets, from this process's CPU time spread over 2 cores (a quiet-machine estimate)"
    );
    println!(
        "{:<42} {:>18} {:>10} {:>16}",
        "figure", "xtc", "llama.cpp", "ratio"
    );
    let row = |name: &str, tokens: f64, wall: f64, cpu: f64, theirs: f64| {
        let (r, e) = (tokens / wall, tokens / (cpu / 2.0).max(1e-9));
        println!(
            "{:<42} {:>7.1} [{:>7.1}] {:>10.1} {:>6.2}x [{:>5.2}x]",
            name,
            r,
            e,
            theirs,
            r / theirs,
            e / theirs
        );
    };
    row(
        "pp512 tokens/s (its Vulkan backend)",
        512.0,
        pp,
        pp_cpu,
        LLAMA_VK_PP512,
    );
    row(
        "one stream tg tokens/s (its Vulkan backend)",
        tg_n as f64,
        tg,
        tg_cpu,
        LLAMA_VK_TG128,
    );
    row(
        "one stream tg tokens/s (its CPU backend)",
        tg_n as f64,
        tg,
        tg_cpu,
        LLAMA_CPU_TG1,
    );
    let generated = if quick { 16 } else { 64 };
    for (n, cpu) in LLAMA_CPU_AGG {
        let mut ms = members(n, 6);
        prefill(&mut gpu, &mut ms, &prompt(32), max_tokens);
        let (_, dt, dc) = timed(|| decode(&mut gpu, &mut ms, generated));
        row(
            &format!("{n} members, aggregate tg tokens/s (CPU)"),
            (n * generated) as f64,
            dt,
            dc,
            cpu,
        );
    }
    for n in [1usize, 8, 32] {
        let mut ms = members(n, 6);
        prefill(&mut gpu, &mut ms, &prompt(32), max_tokens);
        profile(&mut gpu, &mut ms, if quick { 3 } else { 5 });
    }
}
