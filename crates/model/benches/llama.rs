//! SmolLM2-135M-Instruct (Q4_1 GGUF) on the default Vulkan device
//! (lavapipe here) and on the CPU reference: prompt processing (pp512), one
//! stream (tg128) and 8/16/32 members decoding together (32-token prompts,
//! 64 generated, aggregate tokens/s), and where one iteration's time goes on
//! the device (device timestamps per kernel group, with each product's
//! GFLOP/s and GB/s at the model's shapes, and the groups per token).
//!
//! No peer figures are built in: llama.cpp's are measured beside these by
//! the peer harness (`scripts/peers/llama-cpp.sh`), which passes them in
//! through `XTC_PEER_JSON` (a JSON file: `{"label": .., "pp512": ..,
//! "tg128": .., "agg": {"8": .., "16": .., "32": ..}}`); only then does the
//! table print a ratio. `XTC_ROOFLINE_JSON` (written by `--bench roofline`)
//! adds each product's fraction of the machine's peaks to the profile (`%FMA`,
//! `%triad`), and of the device's own f32 ceiling (`%dev`) where it measured one.
//! `XTC_BENCH_JSON=PATH` writes this bench's figures as JSON.
//! `XTC_BENCH_SIDES=vulkan,cpu` (the default) picks the sides measured.
//!
//! `cargo bench --bench llama` (prints a table; needs the model file, see
//! `scripts/fetch-model.sh`, and a Vulkan device for the Vulkan side; skips
//! with a line without them, or fails when `CI` is set).
//! `XTC_BENCH_KERNELS=gpu|cpu` forces the Vulkan side's kernel form (default:
//! the device's, by capability and the barrier probe), so the GPU form's
//! profile can be read on lavapipe too; `XTC_BENCH_ONLY=profile` measures
//! only the per-group profile (the GPU form's rates take minutes there);
//! `XTC_BENCH_ONLY=acts` only the int8-against-f32 lines (with
//! `XTC_ACTIVATIONS=int8` or `auto`).
//! `XTC_BENCH_QUICK=1` runs shorter loops. `XTC_FUSE_ROPE_KV=0` records the
//! q|k|v product and `rope_kv_img` apart (`GpuLlama::set_fuse_rope_kv`), for
//! the fused op's side-by-side figure; `XTC_FUSE_QUANT=0` gives every int8
//! product input its own quantizer (`GpuLlama::set_fuse_quantizers`), the
//! same for the quantized outputs of the residual adds.

use std::collections::BTreeMap;
use std::time::Instant;

use serde_json::{Value, json};
use xtc_model::cpu::llama::{Chunk, Llama, Logits};
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::vulkan::qops8::Activations;
use xtc_model::{BatchPlan, KvGeometry, SeqWork, find_model};
use xtc_vk::{Device, DeviceKind, Selector};

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
        "qmm norm.q|k|v" | "qmm norm.q|k|v, rope_kv" => q41(960.0, 576.0),
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

/// The machine's peaks (`--bench roofline`'s JSON), when passed in.
struct Roof {
    triad_gbs: f64,
    f32_gflops: f64,
    /// The device's own f32 multiply-add ceiling (`peak_f32`), where the
    /// roofline bench opened one.
    device_f32_gflops: Option<f64>,
}

fn read_json(var: &str) -> Option<Value> {
    let p = std::env::var_os(var)?;
    match std::fs::read_to_string(&p).map(|t| serde_json::from_str::<Value>(&t)) {
        Ok(Ok(v)) => Some(v),
        Ok(Err(e)) => panic!("{var}={}: not JSON: {e}", p.to_string_lossy()),
        Err(e) => panic!("{var}={}: {e}", p.to_string_lossy()),
    }
}

fn roofline() -> Option<Roof> {
    let v = read_json("XTC_ROOFLINE_JSON")?;
    Some(Roof {
        triad_gbs: v["triad_gbs"].as_f64()?,
        f32_gflops: v["f32_fma_gflops"].as_f64()?,
        device_f32_gflops: v["device"]["f32_gflops"].as_f64(),
    })
}

/// Profiles `reps` decode iterations of all members; prints the table and
/// returns it as JSON.
fn profile(gpu: &mut GpuLlama, ms: &mut [Member], reps: usize, roof: Option<&Roof>) -> Value {
    let n = ms.len();
    // Per group, the fastest of `reps` iterations (a shared machine's
    // preemptions only ever add time).
    let mut best: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
    let mut order: Vec<&'static str> = vec![];
    let mut groups = 0;
    let mut fastest_group = f64::INFINITY;
    for _ in 0..reps {
        let (toks, times) = gpu.profile(&decode_plan(ms)).unwrap();
        for (m, t) in ms.iter_mut().zip(toks) {
            m.pos += 1;
            m.last = t;
        }
        groups = times.len();
        let mut this: BTreeMap<&'static str, (f64, usize)> = BTreeMap::new();
        for (l, ns) in times {
            if !order.contains(&l) {
                order.push(l);
            }
            fastest_group = fastest_group.min(ns);
            let e = this.entry(l).or_insert((0.0, 0));
            e.0 += ns;
            e.1 += 1;
        }
        for (l, v) in this {
            let e = best.entry(l).or_insert(v);
            e.0 = e.0.min(v.0);
        }
    }
    // The same iteration unprofiled, on the wall clock (fastest of `reps`).
    let mut wall = f64::INFINITY;
    for _ in 0..reps {
        wall = wall.min(decode(gpu, ms, 1));
    }
    let sum = best;
    let total: f64 = sum.values().map(|v| v.0).sum();
    println!(
        "\none iteration, {n} member(s) decoding at position {} (device timestamps, fastest of {reps} per group): {:.2} ms; wall {:.2} ms",
        ms[0].pos,
        total / 1e6,
        wall * 1e3
    );
    let host_per_group = (wall * 1e9 - total).max(0.0) / groups.max(1) as f64;
    println!(
        "{groups} timed groups (barrier-separated dispatch groups) per iteration; fastest group {:.1} us (a ceiling on the fixed cost of one); wall minus device time {:.1} us per group",
        fastest_group / 1e3,
        host_per_group / 1e3
    );
    // Every group takes at least the fastest one's time, so the groups
    // alone bound an iteration from below, whatever the kernels do.
    let floor_ms = groups as f64 * fastest_group / 1e6;
    // A persistent chain is one group holding many: the bound then says little.
    let chained = sum.keys().any(|l| *l == "persistent chain");
    println!(
        "dispatch groups alone: {groups} x {:.1} us = {floor_ms:.2} ms an iteration, at most {:.1} tokens/s at {n} member(s){}",
        fastest_group / 1e3,
        n as f64 * 1e3 / floor_ms,
        if chained {
            " (persistent chains count as one group each: a loose bound)"
        } else {
            ""
        }
    );
    let frac_hdr = match roof {
        Some(r) if r.device_f32_gflops.is_some() => {
            format!(" {:>7} {:>7} {:>7}", "%FMA", "%triad", "%dev")
        }
        Some(_) => format!(" {:>7} {:>7}", "%FMA", "%triad"),
        None => String::new(),
    };
    println!(
        "{:<32} {:>6} {:>9} {:>6} {:>9} {:>8}{frac_hdr}",
        "group", "count", "ms", "share", "GFLOP/s", "GB/s"
    );
    let mut rows = vec![];
    for l in order {
        let (ns, count) = sum[l];
        let rates = macs(l, n, n).map(|(m, b)| {
            let s = ns / count as f64 / 1e9;
            (2.0 * m / s / 1e9, b / s / 1e9)
        });
        let (gf, gb, fr) = match (rates, roof) {
            (Some((f, b)), Some(r)) => (
                format!("{f:.2}"),
                format!("{b:.2}"),
                format!(
                    " {:>6.1}% {:>6.1}%{}",
                    100.0 * f / r.f32_gflops,
                    100.0 * b / r.triad_gbs,
                    r.device_f32_gflops
                        .map_or(String::new(), |d| format!(" {:>6.1}%", 100.0 * f / d))
                ),
            ),
            (Some((f, b)), None) => (format!("{f:.2}"), format!("{b:.2}"), String::new()),
            (None, _) => (String::new(), String::new(), String::new()),
        };
        println!(
            "{:<32} {:>6} {:>9.3} {:>5.1}% {:>9} {:>8}{fr}",
            l,
            count,
            ns / 1e6,
            100.0 * ns / total,
            gf,
            gb
        );
        rows.push(json!({
            "group": l, "count": count, "ms": ns / 1e6,
            "gflops": rates.map(|r| r.0), "gbs": rates.map(|r| r.1),
        }));
    }
    json!({
        "members": n, "device_ms": total / 1e6, "wall_ms": wall * 1e3,
        "groups_per_iteration": groups, "fastest_group_us": fastest_group / 1e3,
        "wall_minus_device_us_per_group": host_per_group / 1e3,
        "groups_floor_ms": floor_ms, "groups_ceiling_tokens_per_s": n as f64 * 1e3 / floor_ms,
        "chained": chained, "groups": rows,
    })
}

/// The figures of one side, measured by `f(what)` as (tokens, wall s, CPU s).
struct Table {
    peer: Option<Value>,
    /// Whether this side's rows print the CPU-time estimate: the CPU
    /// reference and a CPU Vulkan device (lavapipe), whose work is this
    /// process's CPU time; not a GPU, where that time is the host's share
    /// only (and under the clock's 10 ms resolution, gave absurd rates).
    estimate: std::cell::Cell<bool>,
}

impl Table {
    fn header(&self, side: &str, estimate: bool) {
        self.estimate.set(estimate);
        println!(
            "\n{side}: rates on the wall clock (this machine is shared: read them as lower bounds)"
        );
        if estimate {
            println!(
                "and, in brackets, from this process's CPU time spread over 2 cores (a quiet-machine estimate)"
            );
        } else {
            println!(
                "(a GPU: this process's CPU time is the host's share, not the work, so no CPU-time estimate)"
            );
        }
        match &self.peer {
            Some(p) => println!(
                "{:<36} {:>18} {:>10} {:>16}   (peer: {})",
                "figure",
                "xtc",
                "peer",
                "ratio",
                p["label"].as_str().unwrap_or("llama.cpp")
            ),
            None => println!(
                "{:<36} {:>18}   (no peer figures: run scripts/peers/llama-cpp.sh for ratios)",
                "figure", "xtc"
            ),
        }
    }

    /// The peer's figure for `key` (`aggN` reads `agg.N`), if given.
    fn peer_figure(&self, key: &str) -> Option<f64> {
        self.peer.as_ref().and_then(|p| {
            if let Some(n) = key.strip_prefix("agg") {
                p["agg"][n].as_f64()
            } else {
                p[key].as_f64()
            }
        })
    }

    /// Prints one row; returns its JSON.
    fn row(&self, name: &str, key: &str, tokens: f64, wall: f64, cpu: f64) -> Value {
        let r = tokens / wall;
        if !self.estimate.get() {
            let theirs = self.peer_figure(key);
            match theirs {
                Some(t) => println!(
                    "{:<36} {:>7.1} [      -] {:>10.1} {:>6.2}x",
                    name,
                    r,
                    t,
                    r / t
                ),
                None => println!("{:<36} {:>7.1} [      -]", name, r),
            }
            return json!({"key": key, "tokens_per_s": r, "cpu_estimate_tokens_per_s": null, "peer": theirs});
        }
        let e = tokens / (cpu / 2.0).max(1e-9);
        let theirs = self.peer_figure(key);
        match theirs {
            Some(t) => println!(
                "{:<36} {:>7.1} [{:>7.1}] {:>10.1} {:>6.2}x [{:>5.2}x]",
                name,
                r,
                e,
                t,
                r / t,
                e / t
            ),
            None => println!("{:<36} {:>7.1} [{:>7.1}]", name, r, e),
        }
        json!({"key": key, "tokens_per_s": r, "cpu_estimate_tokens_per_s": e, "peer": theirs})
    }
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in v.iter().enumerate() {
        if x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// The CPU reference (`Llama::forward`, rayon's pool: one thread per core).
fn cpu_side(model: &Llama, t: &Table, quick: bool, prompt: &dyn Fn(usize) -> Vec<u32>) -> Value {
    t.header("CPU reference (Llama::forward)", true);
    let mut rows = vec![];
    let mut seq = model.new_sequence();
    let p512 = prompt(512);
    let (_, w, c) = timed(|| {
        model
            .forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &p512,
                logits: Logits::Last,
            }])
            .unwrap()
    });
    rows.push(t.row("pp512 tokens/s", "pp512", 512.0, w, c));
    let tg_n = if quick { 32 } else { 128 };
    let mut seq = model.new_sequence();
    let first = model
        .forward(&mut [Chunk {
            seq: &mut seq,
            tokens: &prompt(1),
            logits: Logits::Last,
        }])
        .unwrap();
    let mut last = argmax(&first[0]);
    let (_, w, c) = timed(|| {
        for _ in 0..tg_n {
            let out = model
                .forward(&mut [Chunk {
                    seq: &mut seq,
                    tokens: &[last],
                    logits: Logits::Last,
                }])
                .unwrap();
            last = argmax(&out[0]);
        }
    });
    rows.push(t.row("one stream tg128 tokens/s", "tg128", tg_n as f64, w, c));
    let generated = if quick { 16 } else { 64 };
    for n in [8usize, 16, 32] {
        let mut seqs: Vec<_> = (0..n).map(|_| model.new_sequence()).collect();
        let p32: Vec<Vec<u32>> = (0..n).map(|i| prompt(32 + i)[i..].to_vec()).collect();
        let mut chunks: Vec<Chunk> = seqs
            .iter_mut()
            .zip(&p32)
            .map(|(seq, p)| Chunk {
                seq,
                tokens: p,
                logits: Logits::Last,
            })
            .collect();
        let out = model.forward(&mut chunks).unwrap();
        let mut lasts: Vec<[u32; 1]> = out.iter().map(|l| [argmax(l)]).collect();
        let (_, w, c) = timed(|| {
            for _ in 0..generated {
                let mut chunks: Vec<Chunk> = seqs
                    .iter_mut()
                    .zip(&lasts)
                    .map(|(seq, t)| Chunk {
                        seq,
                        tokens: t,
                        logits: Logits::Last,
                    })
                    .collect();
                let out = model.forward(&mut chunks).unwrap();
                for (l, o) in lasts.iter_mut().zip(out) {
                    l[0] = argmax(&o);
                }
            }
        });
        rows.push(t.row(
            &format!("{n} streams, aggregate tg tokens/s"),
            &format!("agg{n}"),
            (n * generated) as f64,
            w,
            c,
        ));
    }
    json!({"side": "cpu-reference", "rows": rows})
}

fn vulkan_side(
    dev: &Device,
    model: &Llama,
    t: &Table,
    quick: bool,
    prompt: &dyn Fn(usize) -> Vec<u32>,
) -> Value {
    let max_tokens = 256;
    let variant = match std::env::var("XTC_BENCH_KERNELS").as_deref() {
        Ok("gpu") => Some(Variant::Gpu),
        Ok("cpu") => Some(Variant::Cpu),
        Ok(other) if !other.is_empty() => {
            panic!("XTC_BENCH_KERNELS={other:?}: expected gpu or cpu")
        }
        _ => None,
    };
    // The GPU form holds the KV cache in one storage buffer: on a device
    // whose range is smaller (lavapipe: 128 MiB) it gets what fits.
    let c = &model.config().shape;
    let block_bytes = (2 * c.n_layers * BLOCK * c.kv_dim() * 4) as u64;
    let n_blocks = match variant {
        Some(Variant::Gpu) => 256.min(dev.max_storage_buffer_range() / block_bytes) as usize,
        _ => 256,
    };
    let opts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks,
        },
        max_tokens,
        max_seqs: 32,
        max_context: 1024,
        keep_logits: false,
        variant,
    };
    let only = std::env::var("XTC_BENCH_ONLY").unwrap_or_default();
    let (profile_only, acts_only) = (only == "profile", only == "acts");
    let t0 = Instant::now();
    let mut gpu = GpuLlama::new(dev, model, opts).unwrap();
    if std::env::var("XTC_FUSE_ROPE_KV").is_ok_and(|v| v == "0") {
        gpu.set_fuse_rope_kv(false);
    }
    if std::env::var("XTC_FUSE_QUANT").is_ok_and(|v| v == "0") {
        gpu.set_fuse_quantizers(false);
    }
    let (w, f, kv) = gpu.memory_bytes();
    println!(
        "\ndevice: {} ({:?} forms); load {:.2} s; device memory: quantized weights {:.1} MB, f32 {:.1} MB, KV cache {:.1} MB",
        dev.info().name,
        gpu.variant(),
        t0.elapsed().as_secs_f64(),
        w as f64 / 1e6,
        f as f64 / 1e6,
        kv as f64 / 1e6
    );
    t.header(
        &format!("Vulkan ({})", dev.info().name),
        dev.info().kind == DeviceKind::Cpu,
    );
    let mut rows = vec![];
    if !profile_only && !acts_only {
        rates(&mut gpu, t, quick, prompt, max_tokens, &mut rows);
    }
    let roof = roofline();
    let mut profiles = vec![];
    let sizes: &[usize] = if acts_only { &[] } else { &[1, 8, 32] };
    for &n in sizes {
        // Room for the prompt, the profiled and the timed iterations.
        let mut ms = members(n, 4);
        prefill(&mut gpu, &mut ms, &prompt(32), max_tokens);
        profiles.push(profile(
            &mut gpu,
            &mut ms,
            if quick { 3 } else { 5 },
            roof.as_ref(),
        ));
    }
    let mut chain = vec![];
    if gpu.chain_workgroups().is_some() && !acts_only {
        let reps = if quick { 8 } else { 16 };
        for pos in [32usize, 256] {
            let mut ms = members(1, 24);
            prefill(&mut gpu, &mut ms, &prompt(pos), max_tokens);
            chain.push(chain_ab(&mut gpu, &mut ms, reps, pos));
        }
    }
    let mut split = vec![];
    if dev.info().kind == DeviceKind::Cpu && !acts_only {
        let reps = if quick { 8 } else { 16 };
        // Up to 960 cached positions (max_context 1024): 64 blocks of 16
        // (24 for 256 positions and 16 decode steps).
        for (n, pos) in [(1usize, 32usize), (1, 256), (1, 960), (4, 256), (8, 256)] {
            let mut ms = members(n, if pos > 300 { 64 } else { 24 });
            prefill(&mut gpu, &mut ms, &prompt(pos), max_tokens);
            split.push(split_ab(&mut gpu, &mut ms, reps, pos));
        }
    }
    let (mut fusion, mut acts) = (vec![], vec![]);
    if gpu.int8_dot().is_some() {
        let reps = if quick { 8 } else { 16 };
        let sizes: &[usize] = if acts_only { &[] } else { &[8, 32] };
        for &n in sizes {
            let mut ms = members(n, 4);
            prefill(&mut gpu, &mut ms, &prompt(32), max_tokens);
            fusion.push(fusion_ab(&mut gpu, &mut ms, reps));
        }
        // The same decode iterations with f32 activations, side by side.
        let mut f32m = GpuLlama::with_activations(dev, model, opts, Activations::F32).unwrap();
        gpu.set_int8_min_rows(1);
        for n in [1usize, 4, 8, 16, 32] {
            acts.push(activations_ab(
                &mut gpu,
                &mut f32m,
                n,
                reps,
                &prompt(32),
                max_tokens,
            ));
        }
    }
    json!({"side": "vulkan", "device": dev.info().name, "rows": rows, "profiles": profiles,
           "chain_vs_dispatched": chain, "split_vs_unsplit_attention": split,
           "int8_quantizers_fused_vs_apart": fusion, "int8_vs_f32": acts})
}

/// Decode iterations of all of `ms` with a switch of `gpu` on and off
/// (`set`), alternating, `reps` of each, the switch left on: (medians of on,
/// off; fastest of on, off) in ms of wall time.
fn alternate(
    gpu: &mut GpuLlama,
    ms: &mut [Member],
    reps: usize,
    set: fn(&mut GpuLlama, bool),
) -> (f64, f64, f64, f64) {
    let (mut on, mut off) = (vec![], vec![]);
    for _ in 0..reps {
        set(gpu, true);
        on.push(decode(gpu, ms, 1) * 1e3);
        set(gpu, false);
        off.push(decode(gpu, ms, 1) * 1e3);
    }
    set(gpu, true);
    on.sort_by(f64::total_cmp);
    off.sort_by(f64::total_cmp);
    (on[on.len() / 2], off[off.len() / 2], on[0], off[0])
}

/// One member decoding after a `pos`-token prompt, its iterations with the
/// persistent chain (`GpuLlama::set_chain`) and without, alternating, `reps`
/// of each; prints both sides' median and fastest wall time and the ratio
/// of the medians (dispatched / chained: above 1 the chain is faster).
fn chain_ab(gpu: &mut GpuLlama, ms: &mut [Member], reps: usize, pos: usize) -> Value {
    let (mon, moff, on0, off0) = alternate(gpu, ms, reps, GpuLlama::set_chain);
    println!(
        "1 member at position {pos}, one decode iteration (wall, median / fastest of {reps}, alternating): persistent chain {mon:.2} / {:.2} ms, dispatched {moff:.2} / {:.2} ms: dispatched / chained {:.3}x",
        on0,
        off0,
        moff / mon
    );
    json!({"members": 1, "position": pos, "chained_median_ms": mon, "dispatched_median_ms": moff,
           "chained_min_ms": on0, "dispatched_min_ms": off0, "ratio": moff / mon})
}

/// `n` members decoding after a `pos`-token prompt, their iterations with the
/// split attention (`GpuLlama::set_split_attention`) and without,
/// alternating, `reps` of each; prints both sides' median and fastest wall
/// time and the ratio of the medians (unsplit / split: above 1 the split is
/// faster).
fn split_ab(gpu: &mut GpuLlama, ms: &mut [Member], reps: usize, pos: usize) -> Value {
    let (mon, moff, on0, off0) = alternate(gpu, ms, reps, GpuLlama::set_split_attention);
    println!(
        "{} member(s) at position {pos}, one decode iteration (wall, median / fastest of {reps}, alternating): attention split {mon:.2} / {on0:.2} ms, unsplit {moff:.2} / {off0:.2} ms: unsplit / split {:.3}x",
        ms.len(),
        moff / mon
    );
    json!({"members": ms.len(), "position": pos, "split_median_ms": mon, "unsplit_median_ms": moff,
           "split_min_ms": on0, "unsplit_min_ms": off0, "ratio": moff / mon})
}

/// Decode iterations of `n` members on the int8 model `int8` (int8 at every
/// row count) and the f32 model `f32m`, alternating, `reps` of each (after
/// one prompt of each member on both); prints both medians and their ratio
/// (f32 / int8: above 1 int8 is faster).
fn activations_ab(
    int8: &mut GpuLlama,
    f32m: &mut GpuLlama,
    n: usize,
    reps: usize,
    prompt: &[u32],
    max_tokens: usize,
) -> Value {
    let (mut a, mut b) = (members(n, 4), members(n, 4));
    prefill(int8, &mut a, prompt, max_tokens);
    prefill(f32m, &mut b, prompt, max_tokens);
    let (mut on, mut off) = (vec![], vec![]);
    for _ in 0..reps {
        on.push(decode(int8, &mut a, 1) * 1e3);
        off.push(decode(f32m, &mut b, 1) * 1e3);
    }
    on.sort_by(f64::total_cmp);
    off.sort_by(f64::total_cmp);
    let (mi, mf) = (on[reps / 2], off[reps / 2]);
    println!(
        "{n:>2} member(s), one decode iteration (wall, median / fastest of {reps}, alternating): int8 {mi:.2} / {:.2} ms, f32 {mf:.2} / {:.2} ms: f32 / int8 {:.3}x",
        on[0],
        off[0],
        mf / mi
    );
    json!({"members": n, "int8_median_ms": mi, "f32_median_ms": mf,
           "int8_min_ms": on[0], "f32_min_ms": off[0], "ratio": mf / mi})
}

/// With int8 activations: decode iterations of all members with the
/// residual adds' quantized outputs (`GpuLlama::set_fuse_quantizers`) and
/// without, alternating, `reps` of each; prints both sides' median and
/// fastest wall time and the ratio of the medians (apart / fused: above 1
/// the fused outputs are faster).
fn fusion_ab(gpu: &mut GpuLlama, ms: &mut [Member], reps: usize) -> Value {
    let (mon, moff, on0, off0) = alternate(gpu, ms, reps, GpuLlama::set_fuse_quantizers);
    println!(
        "int8, {} members, one decode iteration (wall, median / fastest of {reps}, alternating): quantizers fused {mon:.2} / {:.2} ms, apart {moff:.2} / {:.2} ms: apart / fused {:.3}x",
        ms.len(),
        on0,
        off0,
        moff / mon
    );
    json!({"members": ms.len(), "fused_median_ms": mon, "apart_median_ms": moff,
           "fused_min_ms": on0, "apart_min_ms": off0, "ratio": moff / mon})
}

/// The Vulkan side's rates: pp512, one stream and 8/16/32 members (one
/// table row each, pushed to `rows`).
fn rates(
    gpu: &mut GpuLlama,
    t: &Table,
    quick: bool,
    prompt: &dyn Fn(usize) -> Vec<u32>,
    max_tokens: usize,
    rows: &mut Vec<Value>,
) {
    // Prompt processing: 512 tokens of one sequence.
    let mut one = members(1, 40);
    let (_, pp, pp_cpu) = timed(|| prefill(gpu, &mut one, &prompt(512), max_tokens));
    rows.push(t.row("pp512 tokens/s", "pp512", 512.0, pp, pp_cpu));
    // One stream: 128 generated tokens after a one-token prompt (llama.cpp's
    // tg128 starts from an empty context).
    let tg_n = if quick { 32 } else { 128 };
    let mut one = members(1, 40);
    prefill(gpu, &mut one, &prompt(1), max_tokens);
    let (_, tg, tg_cpu) = timed(|| decode(gpu, &mut one, tg_n));
    rows.push(t.row(
        "one stream tg128 tokens/s",
        "tg128",
        tg_n as f64,
        tg,
        tg_cpu,
    ));
    let generated = if quick { 16 } else { 64 };
    for n in [8usize, 16, 32] {
        let mut ms = members(n, 6);
        prefill(gpu, &mut ms, &prompt(32), max_tokens);
        let (_, dt, dc) = timed(|| decode(gpu, &mut ms, generated));
        rows.push(t.row(
            &format!("{n} members, aggregate tg tokens/s"),
            &format!("agg{n}"),
            (n * generated) as f64,
            dt,
            dc,
        ));
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
    let sides = std::env::var("XTC_BENCH_SIDES").unwrap_or_else(|_| "vulkan,cpu".into());
    let want = |s: &str| sides.split(',').any(|x| x.trim() == s);
    let quick = std::env::var_os("XTC_BENCH_QUICK").is_some();
    let t = Table {
        peer: read_json("XTC_PEER_JSON"),
        estimate: std::cell::Cell::new(true),
    };
    let model = Llama::load(&path).unwrap();
    let vocab = model.config().shape.vocab_size as u32;
    let prompt =
        |n: usize| -> Vec<u32> { (0..n as u32).map(|i| (i * 7919 + 13) % vocab).collect() };
    let mut out = vec![];
    if want("vulkan") {
        match Device::open(&Selector::Auto) {
            Ok(dev) => out.push(vulkan_side(&dev, &model, &t, quick, &prompt)),
            Err(e) if std::env::var_os("CI").is_none() => {
                println!(
                    "Vulkan side skipped: no Vulkan device ({e}) (set CI=1 to make this a failure)"
                );
            }
            Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
        }
    }
    if want("cpu") {
        out.push(cpu_side(&model, &t, quick, &prompt));
    }
    if let Some(p) = std::env::var_os("XTC_BENCH_JSON") {
        let v = json!({"quick": quick, "sides": out});
        std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    }
}
