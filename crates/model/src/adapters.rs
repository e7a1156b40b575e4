//! The implementations of [`Model`], the trait the serving side drives: one
//! forward pass of a [`BatchPlan`] per iteration. ONE adapter per device
//! kind, generic over the model it drives:
//!
//! - [`CpuModel`] over a [`HostForward`]: the f32 reference ([`F32Host`],
//!   [`CpuModel::new`]) or the GGUF reference's paged forward pass
//!   ([`LlamaHost`], [`CpuModel::llama`]). [`Model::launch`] returns host
//!   work for the blocking pool ([`Completion::Host`]), so the loop's other
//!   processes (arrivals, cancels) keep running meanwhile.
//! - [`VulkanModel`] over a [`DeviceForward`]: the f32 [`GpuModel`]
//!   ([`VulkanModel::new`]) or the GGUF [`GpuLlama`] ([`VulkanModel::llama`]).
//!   `launch` records and submits ONE command buffer for the whole plan and
//!   completes with its fence fd (a shared owner of the submission, B-066).
//! - [`ToyModel`], below.
//!
//! [`Model::finish`] then returns the greedy next token of every sequence
//! whose `sample` flag is set, in plan order (the lowest id among equal
//! maxima, as [`argmax`]). `crates/replay/tests/decode_llama.rs` checks the
//! two GGUF adapters agree token for token with each other and with the
//! contiguous reference; `crates/replay/tests/decode_models.rs` the f32 ones
//! against [`reference_greedy`].
//!
//! [`ToyModel`] is a device-free stand-in whose "forward pass" hashes each
//! sequence's whole history read back through its block table, so any block
//! table or position mistake of the job changes its tokens; tests compare it
//! with [`toy_reference`]. Given an [`IterationCost`] ([`ToyModel::with_cost`])
//! it also takes as long as a device would: it sleeps on the pool thread
//! until the plan's modeled cost ([`IterationCost::of_plan`]: fixed, per
//! row, per KV position read) has passed since the iteration started, so
//! batching policies can be compared at a device's cost curve without its
//! CPU use (`xtc decode --device toy --toy-cost`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use super::cpu::f32_model::{self, CpuKvCache};
use super::cpu::llama::{Llama, PagedKv};
use super::text::sampling::argmax;
use super::vulkan::InFlight;
use super::vulkan::f32_model::{GpuModel, GpuOptions};
use super::vulkan::llama::{GpuLlama, GpuLlamaError, GpuLlamaOptions};
use super::vulkan::qops8::DotForm;
use super::{BatchPlan, Config, KvGeometry, Weights};
use crate::{Completion, DeviceError, Model};

type Outcome = Option<Result<Vec<u32>, DeviceError>>;

/// A host model's state and the result slot of its launched plan, shared
/// with the closure that computes it on a pool thread.
pub(super) struct HostCompute<S> {
    state: Arc<Mutex<S>>,
    result: Arc<Mutex<Outcome>>,
}

impl<S: Send + 'static> HostCompute<S> {
    pub(super) fn new(state: S) -> Self {
        HostCompute {
            state: Arc::new(Mutex::new(state)),
            result: Arc::new(Mutex::new(None)),
        }
    }

    /// The closure that runs `step` on `plan` and stores its result.
    pub(super) fn launch(
        &self,
        plan: &BatchPlan,
        step: fn(&mut S, &BatchPlan) -> Result<Vec<u32>, DeviceError>,
    ) -> Completion {
        let (state, result, plan) = (self.state.clone(), self.result.clone(), plan.clone());
        *lock(&self.result) = None;
        Completion::Host(Box::new(move || {
            let r = step(&mut lock(&state), &plan);
            *lock(&result) = Some(r);
        }))
    }

    pub(super) fn finish(&self) -> Result<Vec<u32>, DeviceError> {
        lock(&self.result)
            .take()
            .unwrap_or_else(|| Err(DeviceError::failed("finish before the launched plan ran")))
    }
}

/// Locks a mutex, ignoring poisoning (a panicked step left no partial result).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub use super::cost::IterationCost;

/// The toy model's state: one token id per KV position.
struct ToyState {
    vocab_size: usize,
    block_size: usize,
    cost: IterationCost,
    /// `n_blocks * block_size` slots.
    slots: Vec<u32>,
}

/// Device-free test model over a paged token store (see the module doc).
pub struct ToyModel {
    config: Config,
    host: HostCompute<ToyState>,
}

impl std::fmt::Debug for ToyModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToyModel")
            .field("config", &self.config)
            .finish()
    }
}

impl ToyModel {
    /// A toy model over a cache of `n_blocks` blocks of `block_size` positions.
    pub fn new(vocab_size: usize, n_blocks: usize, block_size: usize) -> Self {
        let config = Config {
            dim: 8,
            hidden_dim: 8,
            n_layers: 1,
            n_heads: 1,
            n_kv_heads: 1,
            vocab_size,
            seq_len: n_blocks * block_size,
        };
        let state = ToyState {
            vocab_size,
            block_size,
            cost: IterationCost::NONE,
            slots: vec![u32::MAX; n_blocks * block_size],
        };
        ToyModel {
            config,
            host: HostCompute::new(state),
        }
    }
}

impl ToyModel {
    /// The same model, each iteration taking at least `cost` (see the
    /// module doc).
    pub fn with_cost(self, cost: IterationCost) -> Self {
        lock(&self.host.state).cost = cost;
        self
    }

    /// Its modeled iteration cost.
    pub fn cost(&self) -> IterationCost {
        lock(&self.host.state).cost
    }
}

impl ToyState {
    fn slot(&self, table: &[u32], pos: usize) -> Result<usize, DeviceError> {
        let block = table
            .get(pos / self.block_size)
            .ok_or_else(|| DeviceError::failed(format!("position {pos} beyond the block table")))?;
        Ok(*block as usize * self.block_size + pos % self.block_size)
    }
}

/// FNV-1a step over one u32.
fn fnv(h: u64, x: u32) -> u64 {
    x.to_le_bytes()
        .iter()
        .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// The toy model's next token after `history` (what [`ToyModel`] computes
/// from its paged store).
pub fn toy_next(history: impl IntoIterator<Item = u32>, vocab_size: usize) -> u32 {
    let h = history.into_iter().fold(FNV_OFFSET, fnv);
    (h % vocab_size as u64) as u32
}

/// Greedy decode of one request alone with the toy model: `n` tokens after `prompt`.
pub fn toy_reference(prompt: &[u32], n: usize, vocab_size: usize) -> Vec<u32> {
    let mut seq = prompt.to_vec();
    for _ in 0..n {
        let t = toy_next(seq.iter().copied(), vocab_size);
        seq.push(t);
    }
    seq.split_off(prompt.len())
}

impl Model for ToyModel {
    fn config(&self) -> Config {
        self.config
    }

    fn describe(&self) -> String {
        let c = self.cost();
        if c == IterationCost::NONE {
            "toy model (no device)".into()
        } else {
            format!("toy model (no device; modeled iteration {})", c.describe())
        }
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        Ok(self.host.launch(plan, ToyState::step))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        self.host.finish()
    }
}

impl ToyState {
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let t0 = Instant::now();
        let out = self.compute(plan)?;
        let due = self.cost.of_plan(plan);
        // On the pool thread: the loop goes on meanwhile, as with a device.
        let left = due.saturating_sub(t0.elapsed());
        if !left.is_zero() {
            std::thread::sleep(left);
        }
        Ok(out)
    }

    fn compute(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let mut out = Vec::new();
        for s in &plan.seqs {
            for (i, &t) in s.tokens.iter().enumerate() {
                let slot = self.slot(&s.block_table, s.start_pos + i)?;
                self.slots[slot] = t;
            }
            if s.sample {
                let last = s.start_pos + s.tokens.len();
                let hist: Result<Vec<u32>, _> = (0..last)
                    .map(|p| self.slot(&s.block_table, p).map(|i| self.slots[i]))
                    .collect();
                out.push(toy_next(hist?, self.vocab_size));
            }
        }
        Ok(out)
    }
}

/// Greedy decode of one request alone with the CPU reference: the whole
/// prompt in one plan, then one token per plan, `n` tokens in all (the
/// oracle the batched job is checked against).
///
/// # Errors
/// As [`f32_model::forward`] (a prompt token out of the vocabulary, or
/// `prompt + n - 1` positions above `seq_len`).
pub fn reference_greedy(w: &Weights, prompt: &[u32], n: usize) -> xtc::Result<Vec<u32>> {
    let positions = prompt.len() + n;
    let kv = KvGeometry {
        block_size: positions,
        n_blocks: 1,
    };
    let mut cache = CpuKvCache::new(&w.config, kv);
    let mut out: Vec<u32> = Vec::with_capacity(n);
    let mut pos = 0;
    let mut tokens = prompt.to_vec();
    while out.len() < n {
        let plan = BatchPlan {
            seqs: vec![super::SeqWork {
                tokens: std::mem::take(&mut tokens),
                start_pos: pos,
                block_table: vec![0],
                sample: true,
            }],
        };
        pos += plan.n_tokens();
        let logits = f32_model::forward(w, &mut cache, &plan)?;
        let t = f32_model::argmax(&logits[0]);
        out.push(t);
        tokens = vec![t];
    }
    Ok(out)
}

/// One forward pass of a plan on the host, the greedy token of each sampling
/// sequence out: what a [`CpuModel`] runs on the blocking pool. One per CPU
/// reference: [`F32Host`] (the f32 model) and [`LlamaHost`] (the GGUF model).
pub trait HostForward: Send + 'static {
    /// Runs `plan` and returns the sampled tokens, in plan order.
    ///
    /// # Errors
    /// The reference's refusal of the plan, as a [`DeviceError`].
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError>;
}

/// The f32 CPU reference's weights and host paged KV cache
/// ([`f32_model::forward`]).
pub struct F32Host {
    weights: Weights,
    cache: CpuKvCache,
}

impl HostForward for F32Host {
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let logits = f32_model::forward(&self.weights, &mut self.cache, plan)
            .map_err(|e| DeviceError::failed(format!("CPU reference: {e}")))?;
        Ok(logits.iter().map(|l| f32_model::argmax(l)).collect())
    }
}

/// The GGUF CPU reference's weights (shared) and paged KV cache
/// ([`Llama::forward_paged`]); its products use rayon's pool.
pub struct LlamaHost {
    model: Arc<Llama>,
    kv: PagedKv,
}

impl HostForward for LlamaHost {
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let logits = self
            .model
            .forward_paged(&mut self.kv, plan)
            .map_err(|e| DeviceError::failed(format!("CPU reference: {e}")))?;
        Ok(logits.iter().map(|l| argmax(l)).collect())
    }
}

/// A CPU reference ([`HostForward`]) as a [`Model`]: each plan's forward
/// pass is host work for the blocking pool ([`Completion::Host`]), so the
/// loop's other processes (arrivals, cancels) keep running meanwhile.
pub struct CpuModel<F> {
    config: Config,
    name: String,
    host: HostCompute<F>,
}

impl<F> std::fmt::Debug for CpuModel<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuModel")
            .field("config", &self.config)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl CpuModel<F32Host> {
    /// The f32 reference ([`f32_model::forward`]) with a zeroed KV cache of
    /// `kv`'s shape.
    pub fn new(weights: Weights, kv: KvGeometry) -> Self {
        let cache = CpuKvCache::new(&weights.config, kv);
        CpuModel {
            config: weights.config,
            name: String::new(),
            host: HostCompute::new(F32Host { weights, cache }),
        }
    }
}

impl CpuModel<LlamaHost> {
    /// The GGUF model's reference with a zeroed paged KV cache of `kv`'s
    /// shape (`n_blocks * block_size * n_layers * kv_dim * 8` bytes: 46 KB a
    /// position for SmolLM2-135M); `name` is what [`Model::describe`] calls
    /// it.
    pub fn llama(model: Arc<Llama>, kv: KvGeometry, name: &str) -> Self {
        let kv = model.new_paged_kv(kv);
        CpuModel {
            config: model.config().shape,
            name: name.to_string(),
            host: HostCompute::new(LlamaHost { model, kv }),
        }
    }
}

impl<F: HostForward> Model for CpuModel<F> {
    fn config(&self) -> Config {
        self.config
    }

    fn describe(&self) -> String {
        if self.name.is_empty() {
            "CPU reference (no Vulkan)".into()
        } else {
            format!("CPU reference (no Vulkan), {}", self.name)
        }
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        Ok(self.host.launch(plan, F::step))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        self.host.finish()
    }
}

/// A model on a Vulkan device, as a [`VulkanModel`] drives it: ONE command
/// buffer per plan, completed by a fence. [`GpuModel`] (f32) and
/// [`GpuLlama`] (GGUF).
pub trait DeviceForward {
    /// The model's shape.
    fn shape(&self) -> Config;
    /// The device it runs on.
    fn device(&self) -> &xtc_vk::Device;
    /// Records and submits `plan`.
    ///
    /// # Errors
    /// The model's refusal of the plan, or a device failure.
    fn submit(&mut self, plan: &BatchPlan) -> xtc::Result<InFlight>;
    /// Waits for `f` and returns its sampled tokens.
    ///
    /// # Errors
    /// Not the latest submission, or a device failure.
    fn finish(&mut self, f: InFlight) -> xtc::Result<Vec<u32>>;
    /// What the description adds after the device (e.g. `int8
    /// activations (OpSDot)`), or `None`.
    fn notes(&self) -> Option<String> {
        None
    }
}

impl DeviceForward for GpuModel {
    fn shape(&self) -> Config {
        *self.config()
    }
    fn device(&self) -> &xtc_vk::Device {
        GpuModel::device(self)
    }
    fn submit(&mut self, plan: &BatchPlan) -> xtc::Result<InFlight> {
        GpuModel::submit(self, plan)
    }
    fn finish(&mut self, f: InFlight) -> xtc::Result<Vec<u32>> {
        GpuModel::finish(self, f)
    }
}

impl DeviceForward for GpuLlama {
    fn shape(&self) -> Config {
        *self.config()
    }
    fn device(&self) -> &xtc_vk::Device {
        GpuLlama::device(self)
    }
    fn submit(&mut self, plan: &BatchPlan) -> xtc::Result<InFlight> {
        GpuLlama::submit(self, plan)
    }
    fn finish(&mut self, f: InFlight) -> xtc::Result<Vec<u32>> {
        GpuLlama::finish(self, f)
    }
    fn notes(&self) -> Option<String> {
        self.int8_dot().map(|d| match d {
            DotForm::Native => "int8 activations (OpSDot)".to_string(),
            DotForm::Poly => "int8 activations (polyfill)".to_string(),
            DotForm::Swar { .. } => "int8 activations (packed pairs)".to_string(),
        })
    }
}

/// A model on a Vulkan device ([`DeviceForward`]) as a [`Model`]: `launch`
/// records and submits ONE command buffer for the plan and completes with
/// its fence fd (a shared owner of the submission, B-066); `finish` returns
/// the greedy token of each sampling sequence, chosen on the device.
pub struct VulkanModel<G> {
    gpu: G,
    name: String,
    in_flight: FenceSlot,
}

impl<G: DeviceForward> std::fmt::Debug for VulkanModel<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanModel")
            .field("device", &self.gpu.device().info().name)
            .field("name", &self.name)
            .field("in_flight", &self.in_flight.is_some())
            .finish()
    }
}

impl VulkanModel<GpuModel> {
    /// Uploads f32 `weights` to `dev` with a KV cache of `kv`'s shape and
    /// room for `max_tokens` rows of `max_seqs` sequences per iteration.
    ///
    /// # Errors
    /// As [`GpuModel::new`].
    pub fn new(
        dev: &xtc_vk::Device,
        weights: &Weights,
        kv: KvGeometry,
        max_tokens: usize,
        max_seqs: usize,
    ) -> xtc::Result<Self> {
        let opts = GpuOptions {
            kv,
            max_tokens,
            max_seqs,
            ..GpuOptions::default()
        };
        VulkanModel::with_options(dev, weights, opts)
    }

    /// As [`new`](Self::new) with every [`GpuOptions`] (e.g. a forced
    /// kernel form, `GpuOptions::variant`).
    ///
    /// # Errors
    /// As [`GpuModel::new`].
    pub fn with_options(
        dev: &xtc_vk::Device,
        weights: &Weights,
        opts: GpuOptions,
    ) -> xtc::Result<Self> {
        let gpu = GpuModel::new(dev, weights, opts)?;
        Ok(VulkanModel {
            gpu,
            name: String::new(),
            in_flight: FenceSlot::default(),
        })
    }
}

impl VulkanModel<GpuLlama> {
    /// Uploads the GGUF `model` to `dev` with `opts` (KV-cache geometry,
    /// most token rows and sequences per plan, positions per sequence);
    /// `name` is what [`Model::describe`] calls it.
    ///
    /// # Errors
    /// As [`GpuLlama::new`] (bad options, out of device memory, a tensor
    /// the kernels cannot read).
    pub fn llama(
        dev: &xtc_vk::Device,
        model: &Llama,
        opts: GpuLlamaOptions,
        name: &str,
    ) -> Result<Self, GpuLlamaError> {
        let gpu = GpuLlama::new(dev, model, opts)?;
        Ok(VulkanModel {
            gpu,
            name: name.to_string(),
            in_flight: FenceSlot::default(),
        })
    }
}

impl<G> VulkanModel<G> {
    /// The model on the device.
    pub fn gpu(&self) -> &G {
        &self.gpu
    }
}

impl<G: DeviceForward> Model for VulkanModel<G> {
    fn config(&self) -> Config {
        self.gpu.shape()
    }

    fn describe(&self) -> String {
        let info = self.gpu.device().info();
        let notes = self
            .gpu
            .notes()
            .map(|n| format!("; {n}"))
            .unwrap_or_default();
        if self.name.is_empty() {
            format!("{} ({:?}, Vulkan{notes})", info.name, info.kind)
        } else {
            format!(
                "{} ({:?}, Vulkan{notes}), {}",
                info.name, info.kind, self.name
            )
        }
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        self.in_flight.launch(self.gpu.submit(plan))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        let f = self.in_flight.take()?;
        self.gpu
            .finish(f)
            .map_err(|e| DeviceError::failed(format!("finish: {e}")))
    }
}

/// The submission a Vulkan model has in flight between [`Model::launch`] and
/// [`Model::finish`] (at most one: the serving loop finishes a plan before it
/// launches the next).
#[derive(Default)]
pub(crate) struct FenceSlot(Option<InFlight>);

impl FenceSlot {
    /// Keeps the submission `submitted` and completes with its fence: the
    /// completion shares the submission, so its fence fd stays open until
    /// the last clone drops, however long the driver keeps it; no fd is
    /// duplicated.
    ///
    /// # Errors
    /// A failed submission, as `submit: {error}`.
    pub(crate) fn launch<E: std::fmt::Display>(
        &mut self,
        submitted: Result<InFlight, E>,
    ) -> Result<Completion, DeviceError> {
        let f = submitted.map_err(|e| DeviceError::failed(format!("submit: {e}")))?;
        let fence = f.fence();
        self.0 = Some(f);
        Ok(Completion::Fence(fence))
    }

    /// The submission to finish.
    ///
    /// # Errors
    /// `finish without a launched plan` when none is in flight.
    pub(crate) fn take(&mut self) -> Result<InFlight, DeviceError> {
        self.0
            .take()
            .ok_or_else(|| DeviceError::failed("finish without a launched plan"))
    }

    /// Whether a submission is in flight.
    pub(crate) fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqWork;

    #[test]
    fn toy_model_reads_history_through_the_block_table() {
        let mut m = ToyModel::new(50, 4, 2);
        let prompt = [3, 1, 4];
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: prompt.to_vec(),
                start_pos: 0,
                block_table: vec![3, 0],
                sample: true,
            }],
        };
        assert!(m.finish().is_err());
        let Completion::Host(work) = m.launch(&plan).unwrap() else {
            panic!("host models run on the pool")
        };
        work();
        let t = m.finish().unwrap();
        assert_eq!(t, toy_reference(&prompt, 1, 50));
        assert!(m.finish().is_err());
        let short = BatchPlan {
            seqs: vec![SeqWork {
                tokens: vec![1, 2, 3],
                start_pos: 0,
                block_table: vec![0],
                sample: false,
            }],
        };
        let Completion::Host(work) = m.launch(&short).unwrap() else {
            panic!("host models run on the pool")
        };
        work();
        let e = m.finish().unwrap_err();
        assert!(e.message().contains("beyond the block table"), "{e}");
    }
}

#[cfg(test)]
mod llama_tests {
    use super::*;
    use crate::SeqWork;
    use crate::cpu::llama::{Chunk, Logits, gguf_from_weights};
    use crate::format::gguf::{GgmlType, Gguf};
    use crate::{Config as Shape, Weights};

    #[test]
    fn cpu_model_runs_plans_on_the_pool_and_reports_bad_plans() {
        let w = Weights::synthetic(Shape::tiny(), 3);
        let g = gguf_from_weights(&w, GgmlType::Q8_0, 10000.0, true);
        let model = Arc::new(Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap());
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 8,
        };
        let mut m = CpuModel::llama(model.clone(), geo, "tiny");
        assert!(m.describe().contains("tiny"));
        assert!(m.finish().is_err(), "no plan in flight");
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: vec![5, 6, 7, 8, 9],
                start_pos: 0,
                block_table: vec![6, 2],
                sample: true,
            }],
        };
        let Completion::Host(job) = m.launch(&plan).unwrap() else {
            panic!("the CPU model runs on the pool")
        };
        job();
        let mut seq = model.new_sequence();
        let want = model
            .forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &[5, 6, 7, 8, 9],
                logits: Logits::Last,
            }])
            .unwrap()
            .remove(0);
        assert_eq!(m.finish().unwrap(), vec![argmax(&want)]);
        let bad = BatchPlan {
            seqs: vec![SeqWork {
                tokens: vec![1],
                start_pos: 5,
                block_table: vec![6, 9],
                sample: true,
            }],
        };
        m.launch(&bad).unwrap().wait_here();
        let e = m.finish().unwrap_err();
        assert!(
            e.message()
                .contains("block 9 is not below the cache's 8 blocks"),
            "{e}"
        );
    }
}
