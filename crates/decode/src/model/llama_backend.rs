//! A GGUF llama model (SmolLM2-135M-Instruct for `xtc decode`) as a
//! [`Model`], the trait the serving side drives, both ways:
//!
//! - [`LlamaVulkanModel`]: over [`GpuLlama`]. `launch` records and submits
//!   ONE command buffer for the whole plan ([`GpuLlama::submit`]) and
//!   completes with its fence fd (a shared owner of the submission, B-066);
//!   `finish` returns the greedy token of each sampling sequence, chosen on
//!   the device.
//! - [`LlamaCpuModel`]: over the CPU reference's paged forward pass
//!   ([`Llama::forward_paged`]) with a host [`PagedKv`], run as host work on
//!   the blocking pool ([`Completion::Host`]) so the loop's other processes
//!   (arrivals, cancels) keep running; its products use rayon's pool.
//!
//! Both address their KV cache through the plan's block tables, which the
//! serving side's ledger owns, and pick the greedy token as
//! [`sampling::argmax`](super::sampling::argmax) does (the lowest id among
//! equal maxima). `crates/decode/tests/decode_llama.rs` checks that they agree token for
//! token with each other and with the contiguous reference
//! ([`Llama::forward`]) on a served workload.

use std::sync::Arc;

use super::backend::{FenceSlot, HostCompute};
use super::gpu_llama::{GpuLlama, GpuLlamaOptions};
use super::llama::{Llama, PagedKv};
use super::sampling::argmax;
use super::{BatchPlan, Config, KvGeometry};
use crate::{Completion, DeviceError, Model};

/// The CPU model's state: the weights (shared) and the paged KV cache.
struct CpuLlamaState {
    model: Arc<Llama>,
    kv: PagedKv,
}

impl CpuLlamaState {
    fn step(&mut self, plan: &BatchPlan) -> Result<Vec<u32>, DeviceError> {
        let logits = self
            .model
            .forward_paged(&mut self.kv, plan)
            .map_err(|e| DeviceError(format!("CPU reference: {e}")))?;
        Ok(logits.iter().map(|l| argmax(l)).collect())
    }
}

/// The GGUF model on the CPU reference over a paged KV cache, computed off
/// the loop ([`Completion::Host`]).
pub struct LlamaCpuModel {
    config: Config,
    name: String,
    host: HostCompute<CpuLlamaState>,
}

impl std::fmt::Debug for LlamaCpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaCpuModel")
            .field("config", &self.config)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

impl LlamaCpuModel {
    /// The model with a zeroed paged KV cache of `kv`'s shape (`n_blocks *
    /// block_size * n_layers * kv_dim * 8` bytes: 46 KB a position for
    /// SmolLM2-135M); `name` is what [`Model::describe`] calls it.
    pub fn new(model: Arc<Llama>, kv: KvGeometry, name: &str) -> Self {
        let kv = model.new_paged_kv(kv);
        LlamaCpuModel {
            config: model.config().shape,
            name: name.to_string(),
            host: HostCompute::new(CpuLlamaState { model, kv }),
        }
    }
}

impl Model for LlamaCpuModel {
    fn config(&self) -> Config {
        self.config
    }

    fn describe(&self) -> String {
        format!("CPU reference (no Vulkan), {}", self.name)
    }

    fn launch(&mut self, plan: &BatchPlan) -> Result<Completion, DeviceError> {
        Ok(self.host.launch(plan, CpuLlamaState::step))
    }

    fn finish(&mut self) -> Result<Vec<u32>, DeviceError> {
        self.host.finish()
    }
}

/// The GGUF model on a Vulkan device ([`GpuLlama`]): `launch` submits ONE
/// command buffer for the plan and completes with its fence fd (owned).
pub struct LlamaVulkanModel {
    gpu: GpuLlama,
    name: String,
    in_flight: FenceSlot,
}

impl std::fmt::Debug for LlamaVulkanModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlamaVulkanModel")
            .field("device", &self.gpu.device().info().name)
            .field("name", &self.name)
            .field("in_flight", &self.in_flight.is_some())
            .finish()
    }
}

impl LlamaVulkanModel {
    /// Uploads `model` to `dev` with `opts` (KV-cache geometry, most token
    /// rows and sequences per plan, positions per sequence); `name` is what
    /// [`Model::describe`] calls it.
    ///
    /// # Errors
    /// As [`GpuLlama::new`], with its message (bad options, out of device
    /// memory, a tensor the kernels cannot read).
    pub fn new(
        dev: &xtc_vk::Device,
        model: &Llama,
        opts: GpuLlamaOptions,
        name: &str,
    ) -> Result<Self, DeviceError> {
        let gpu = GpuLlama::new(dev, model, opts)
            .map_err(|e| DeviceError(format!("cannot load the model on the device: {e}")))?;
        Ok(LlamaVulkanModel {
            gpu,
            name: name.to_string(),
            in_flight: FenceSlot::default(),
        })
    }

    /// The model on the device.
    pub fn gpu(&self) -> &GpuLlama {
        &self.gpu
    }
}

impl Model for LlamaVulkanModel {
    fn config(&self) -> Config {
        *self.gpu.config()
    }

    fn describe(&self) -> String {
        let info = self.gpu.device().info();
        format!("{} ({:?}, Vulkan), {}", info.name, info.kind, self.name)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SeqWork;
    use crate::model::gguf::{GgmlType, Gguf};
    use crate::model::llama::{Chunk, Logits, gguf_from_weights};
    use crate::model::{Config as Shape, Weights};

    #[test]
    fn cpu_model_runs_plans_on_the_pool_and_reports_bad_plans() {
        let w = Weights::synthetic(Shape::tiny(), 3);
        let g = gguf_from_weights(&w, GgmlType::Q8_0, 10000.0, true);
        let model = Arc::new(Llama::from_gguf(Gguf::from_bytes(g.to_bytes()).unwrap()).unwrap());
        let geo = KvGeometry {
            block_size: 4,
            n_blocks: 8,
        };
        let mut m = LlamaCpuModel::new(model.clone(), geo, "tiny");
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
