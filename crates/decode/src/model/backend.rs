//! The implementations of [`Model`], the trait the serving side drives: one
//! forward pass of a [`BatchPlan`] per iteration.
//!
//! [`Model::launch`] starts the forward pass of one plan (the whole ready
//! vector in one command buffer on a GPU) and returns its [`Completion`]:
//! [`VulkanModel`] its submission's fence (a shared owner of the sync_file or
//! eventfd, readable when the device finishes), [`CpuModel`] and
//! [`ToyModel`] host work for the blocking pool (so the loop's other
//! processes — arrivals, cancels — keep running meanwhile).
//! [`Model::finish`] then returns the greedy next token of every sequence
//! whose `sample` flag is set, in plan order.
//!
//! [`ToyModel`] is a device-free stand-in whose "forward pass" hashes each
//! sequence's whole history read back through its block table, so any block
//! table or position mistake of the job changes its tokens; tests compare it
//! with [`toy_reference`]. Given an [`IterationCost`] ([`ToyModel::with_cost`])
//! it also takes as long as a device would: it sleeps on the pool thread
//! until `fixed + per_row * rows` has passed since the iteration started, so
//! batching policies can be compared at a device's cost curve without its
//! CPU use (`xtc decode --device toy --toy-cost`).

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::gpu::{GpuModel, GpuOptions, InFlight};
use super::reference::{self, CpuKvCache};
use super::{BatchPlan, Config, KvGeometry, Weights};
use crate::{Completion, DeviceError, Model};

type Outcome = Option<Result<Vec<u32>, DeviceError>>;

/// A host model's state and the result slot of its launched plan, shared
/// with the closure that computes it on a pool thread (also the GGUF CPU
/// model's, `llama_backend`).
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
            .unwrap_or_else(|| Err(DeviceError("finish before the launched plan ran".into())))
    }
}

/// Locks a mutex, ignoring poisoning (a panicked step left no partial result).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A modeled cost of one iteration: `fixed + per_row * token rows` (the
/// shape of a device's cost curve: a launch overhead, then a cost per row).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IterationCost {
    /// Cost of an iteration however few rows it has.
    pub fixed: Duration,
    /// Cost of each token row (prefill or decode).
    pub per_row: Duration,
}

impl IterationCost {
    /// No modeled cost (the toy model's own, microseconds).
    pub const NONE: IterationCost = IterationCost {
        fixed: Duration::ZERO,
        per_row: Duration::ZERO,
    };

    /// Lavapipe's measured curve for the tiny synthetic model on the
    /// 2-core development machine (`docs/arch/decode.md`): about 1.8 ms per
    /// iteration plus 0.09 ms per token row.
    pub const LAVAPIPE_TINY: IterationCost = IterationCost {
        fixed: Duration::from_micros(1800),
        per_row: Duration::from_micros(90),
    };

    /// The cost of an iteration of `rows` token rows.
    pub fn of(&self, rows: usize) -> Duration {
        self.fixed + self.per_row * u32::try_from(rows).unwrap_or(u32::MAX)
    }
}

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
            .ok_or_else(|| DeviceError(format!("position {pos} beyond the block table")))?;
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
            format!(
                "toy model (no device; modeled iteration {} us + {} us per token row)",
                c.fixed.as_micros(),
                c.per_row.as_micros()
            )
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
        let due = self.cost.of(plan.n_tokens());
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
/// As [`reference::forward`] (a prompt token out of the vocabulary, or
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
        let logits = reference::forward(w, &mut cache, &plan)?;
        let t = reference::argmax(&logits[0]);
        out.push(t);
        tokens = vec![t];
    }
    Ok(out)
}

/// The CPU reference's weights and host paged KV cache.
struct CpuState {
    weights: Weights,
    cache: CpuKvCache,
}

impl CpuState {
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let logits = reference::forward(&self.weights, &mut self.cache, plan)
            .map_err(|e| DeviceError(format!("CPU reference: {e}")))?;
        Ok(logits.iter().map(|l| reference::argmax(l)).collect())
    }
}

/// The CPU reference forward pass ([`reference::forward`]) over a host
/// paged KV cache, computed off the loop ([`Completion::Host`]).
pub struct CpuModel {
    config: Config,
    host: HostCompute<CpuState>,
}

impl std::fmt::Debug for CpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuModel")
            .field("config", &self.config)
            .finish()
    }
}

impl CpuModel {
    /// The model with a zeroed KV cache of `kv`'s shape.
    pub fn new(weights: Weights, kv: KvGeometry) -> Self {
        let cache = CpuKvCache::new(&weights.config, kv);
        CpuModel {
            config: weights.config,
            host: HostCompute::new(CpuState { weights, cache }),
        }
    }
}

impl Model for CpuModel {
    fn config(&self) -> Config {
        self.config
    }

    fn describe(&self) -> String {
        "CPU reference (no Vulkan)".into()
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        Ok(self.host.launch(plan, CpuState::step))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        self.host.finish()
    }
}

/// The model on a Vulkan device ([`GpuModel`]): `launch` records and submits
/// ONE command buffer for the plan and completes with its fence fd (owned).
pub struct VulkanModel {
    gpu: GpuModel,
    in_flight: FenceSlot,
}

impl std::fmt::Debug for VulkanModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VulkanModel")
            .field("device", &self.gpu.device().info().name)
            .field("in_flight", &self.in_flight.is_some())
            .finish()
    }
}

impl VulkanModel {
    /// Uploads `weights` to `dev` with a KV cache of `kv`'s shape and room for
    /// `max_tokens` rows of `max_seqs` sequences per iteration.
    ///
    /// # Errors
    /// As [`GpuModel::new`], with its message.
    pub fn new(
        dev: &xtc_vk::Device,
        weights: &Weights,
        kv: KvGeometry,
        max_tokens: usize,
        max_seqs: usize,
    ) -> Result<Self, DeviceError> {
        let opts = GpuOptions {
            kv,
            max_tokens,
            max_seqs,
            ..GpuOptions::default()
        };
        let gpu = GpuModel::new(dev, weights, opts)
            .map_err(|e| DeviceError(format!("cannot load the model on the device: {e}")))?;
        Ok(VulkanModel {
            gpu,
            in_flight: FenceSlot::default(),
        })
    }
}

impl Model for VulkanModel {
    fn config(&self) -> Config {
        *self.gpu.config()
    }

    fn describe(&self) -> String {
        let info = self.gpu.device().info();
        format!("{} ({:?}, Vulkan)", info.name, info.kind)
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        self.in_flight.launch(self.gpu.submit(plan))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        let f = self.in_flight.take()?;
        self.gpu
            .finish(f)
            .map_err(|e| DeviceError(format!("finish: {e}")))
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
        let f = submitted.map_err(|e| DeviceError(format!("submit: {e}")))?;
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
            .ok_or_else(|| DeviceError("finish without a launched plan".into()))
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
