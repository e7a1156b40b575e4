//! `xtc.decode.*`: whole-model greedy decode on the device, for each model
//! of [`MODELS`] (the seeded synthetic model) and for the real GGUF model
//! (SmolLM2-135M-Instruct Q4_1 on `GpuLlama`: `super::smollm`, the same
//! three kinds of cases):
//!
//! Every case runs once per kernel form, the form in its name
//! (`<model>.<form>.*`, `<form>` `cpu` or `gpu`; [`Variant::name`]):
//!
//! - `<model>.golden.p<i>`: the greedy tokens of prompt `i` (prefill, then
//!   one token per iteration) on this device; the runner compares them with
//!   the golden tokens stored for this device (`--golden`), or stores them
//!   (`--write-baseline`).
//! - `<model>.reference.p<i>`: Vulkan against the CPU reference
//!   ([`f32_model::forward`]) along the device's own tokens: logits within
//!   NMSE [`LOGITS_NMSE`] at every step, and every device token the
//!   reference's greedy choice up to a near-tie
//!   ([`f32_model::greedy_agrees`], gap [`TIE`]).
//! - `<model>.batched`: every prompt in one ready vector (one plan per
//!   iteration for all sequences) gives each sequence the tokens it gets
//!   alone.

use crate::case::{Case, CaseError, Ctx, Outcome, Record, Suite, ensure};
use crate::check;
use xtc_model::cpu::f32_model::{self, CpuKvCache};
use xtc_model::vulkan::f32_model::{GpuModel, GpuOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{BatchPlan, Config, KvGeometry, SeqWork, Weights};

/// Largest NMSE of the device's logits against the reference's.
pub const LOGITS_NMSE: f64 = 1e-8;
/// Logit gap under which two tokens are a near-tie.
pub const TIE: f32 = 1e-4;

/// A model the decode suite runs.
pub struct ModelEntry {
    /// Case-name component (`xtc.decode.<name>.*`).
    pub name: &'static str,
    /// Loads the weights (`CaseError::Skip` when the model file is absent
    /// outside CI).
    pub load: fn(&Ctx) -> Result<Weights, CaseError>,
    /// Prompts, as token ids.
    pub prompts: &'static [&'static [u32]],
    /// Greedy tokens generated per prompt.
    pub n_tokens: usize,
}

/// The models of the suite.
pub const MODELS: &[ModelEntry] = &[ModelEntry {
    name: "synthetic",
    load: synthetic,
    prompts: &[
        &[1],
        &[5, 17, 42, 9, 311, 7, 88],
        &[
            200, 201, 202, 203, 204, 205, 206, 207, 208, 209, 210, 211, 212, 213, 214, 215, 216,
            217, 218, 219,
        ],
    ],
    n_tokens: 24,
}];

/// `Config::tiny()` with seed 1: the model of `xtc decode --synthetic` (and
/// `--device toy`); `xtc decode`'s default is the GGUF model.
fn synthetic(_: &Ctx) -> Result<Weights, CaseError> {
    Ok(Weights::synthetic(Config::tiny(), 1))
}

/// Registers the suite's cases: every model's once per kernel form
/// (`xtc.decode.<model>.<form>.*`, `<form>` `cpu` or `gpu`).
pub fn cases(v: &mut Vec<Case>) {
    for (mi, m) in MODELS.iter().enumerate() {
        for form in [Variant::Cpu, Variant::Gpu] {
            let (name, f) = (m.name, form.name());
            for (pi, _) in m.prompts.iter().enumerate() {
                v.push(
                    Case::new(
                        Suite::Decode,
                        format!("xtc.decode.{name}.{f}.golden.p{pi}"),
                        move |ctx| golden(ctx, &MODELS[mi], form, pi),
                    )
                    .in_form(form),
                );
                v.push(
                    Case::new(
                        Suite::Decode,
                        format!("xtc.decode.{name}.{f}.reference.p{pi}"),
                        move |ctx| against_reference(ctx, &MODELS[mi], form, pi),
                    )
                    .in_form(form),
                );
            }
            v.push(
                Case::new(
                    Suite::Decode,
                    format!("xtc.decode.{name}.{f}.batched"),
                    move |ctx| batched(ctx, &MODELS[mi], form),
                )
                .in_form(form),
            );
        }
    }
    // The real model (SmolLM2 on GpuLlama): its own module.
    super::smollm::decode_cases(v);
}

const BLOCK: usize = 16;

fn geometry(m: &ModelEntry) -> KvGeometry {
    let longest = m.prompts.iter().map(|p| p.len()).max().unwrap_or(0) + m.n_tokens;
    KvGeometry {
        block_size: BLOCK,
        n_blocks: longest.div_ceil(BLOCK) * m.prompts.len(),
    }
}

fn model(
    ctx: &mut Ctx,
    m: &ModelEntry,
    form: Variant,
    keep_logits: bool,
) -> Result<(Weights, GpuModel), CaseError> {
    let w = (m.load)(ctx)?;
    let dev = ctx.device()?;
    let opts = GpuOptions {
        kv: geometry(m),
        max_tokens: m.prompts.iter().map(|p| p.len()).sum::<usize>().max(8),
        max_seqs: m.prompts.len(),
        keep_logits,
        variant: Some(form),
        ..GpuOptions::default()
    };
    let gpu = GpuModel::new(&dev, &w, opts)?;
    Ok((w, gpu))
}

/// Sequence `i`'s block table: its own run of blocks.
fn table(m: &ModelEntry, i: usize) -> Vec<u32> {
    let per = geometry(m).n_blocks / m.prompts.len();
    ((i * per) as u32..((i + 1) * per) as u32).collect()
}

fn seq(m: &ModelEntry, i: usize, tokens: Vec<u32>, start_pos: usize) -> SeqWork {
    SeqWork {
        tokens,
        start_pos,
        block_table: table(m, i),
        sample: true,
    }
}

/// Greedy tokens of every listed prompt, run together in one ready vector.
fn greedy(gpu: &mut GpuModel, m: &ModelEntry, which: &[usize]) -> Result<Vec<Vec<u32>>, CaseError> {
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); which.len()];
    let mut pos: Vec<usize> = which.iter().map(|&i| m.prompts[i].len()).collect();
    let plan = BatchPlan {
        seqs: which
            .iter()
            .map(|&i| seq(m, i, m.prompts[i].to_vec(), 0))
            .collect(),
    };
    let mut toks = gpu.step(&plan)?;
    for _ in 0..m.n_tokens {
        for (o, &t) in out.iter_mut().zip(&toks) {
            o.push(t);
        }
        if out[0].len() == m.n_tokens {
            break;
        }
        let plan = BatchPlan {
            seqs: which
                .iter()
                .enumerate()
                .map(|(j, &i)| seq(m, i, vec![toks[j]], pos[j]))
                .collect(),
        };
        toks = gpu.step(&plan)?;
        pos.iter_mut().for_each(|p| *p += 1);
    }
    Ok(out)
}

fn golden(ctx: &mut Ctx, m: &ModelEntry, form: Variant, p: usize) -> Result<Outcome, CaseError> {
    let (_, mut gpu) = model(ctx, m, form, false)?;
    let toks = greedy(&mut gpu, m, &[p])?.remove(0);
    let n = toks.len();
    Ok(Outcome::record(
        Record::Golden(toks),
        format!("{n} greedy tokens"),
    ))
}

fn against_reference(
    ctx: &mut Ctx,
    m: &ModelEntry,
    form: Variant,
    p: usize,
) -> Result<Outcome, CaseError> {
    let (w, mut gpu) = model(ctx, m, form, true)?;
    let mut cache = CpuKvCache::new(&w.config, geometry(m));
    let mut plan = BatchPlan {
        seqs: vec![seq(m, p, m.prompts[p].to_vec(), 0)],
    };
    let mut worst = 0f64;
    let mut ties = 0;
    for (step, pos) in (0..m.n_tokens).zip(m.prompts[p].len()..) {
        let want = f32_model::forward(&w, &mut cache, &plan)?;
        let f = gpu.submit(&plan)?;
        let (toks, logits) = gpu.finish_with_logits(f)?;
        ensure(
            toks.len() == 1 && logits.len() == 1 && want.len() == 1,
            || {
                format!(
                    "step {step}: {} tokens, {} logits rows",
                    toks.len(),
                    logits.len()
                )
            },
        )?;
        let e = check::close(
            &format!("step {step} logits"),
            &logits[0],
            &want[0],
            LOGITS_NMSE,
        )?;
        worst = worst.max(e);
        let tok = toks[0];
        if let Err(gap) = f32_model::greedy_agrees(tok, &want[0], TIE) {
            return Err(CaseError::Fail(format!(
                "step {step}: device token {tok}, reference {} (logit gap {gap})",
                f32_model::argmax(&want[0])
            )));
        }
        if tok != f32_model::argmax(&want[0]) {
            ties += 1;
        }
        plan = BatchPlan {
            seqs: vec![seq(m, p, vec![tok], pos)],
        };
    }
    Ok(Outcome::pass_with(format!(
        "{} steps, logits NMSE <= {worst:.2e}, {ties} near-ties",
        m.n_tokens
    )))
}

fn batched(ctx: &mut Ctx, m: &ModelEntry, form: Variant) -> Result<Outcome, CaseError> {
    let (_, mut gpu) = model(ctx, m, form, false)?;
    let all: Vec<usize> = (0..m.prompts.len()).collect();
    let together = greedy(&mut gpu, m, &all)?;
    for (i, toks) in together.iter().enumerate() {
        let alone = greedy(&mut gpu, m, &[i])?.remove(0);
        check::exact(&format!("prompt {i} batched vs alone"), toks, &alone)?;
    }
    Ok(Outcome::pass_with(format!(
        "{} sequences in one vector: the tokens each gets alone",
        m.prompts.len()
    )))
}
