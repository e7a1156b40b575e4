//! The model the server's engine drives: the GGUF model on a Vulkan device
//! (lavapipe or a GPU) or on the CPU reference, one packed [`BatchPlan`] at
//! a time. Unlike [`xtc_model::Model`] (greedy tokens only), a launch
//! may ask for the logits of the sampled rows, so requests that sample with
//! a temperature (or must not end before `min_tokens`) are sampled on the
//! host with their own seeded [`Sampler`](xtc_model::text::sampling::Sampler).
//!
//! The launch becomes the batch engine's [`Exec`] here: a Vulkan fence
//! (`Exec::Fence`, the submission's fd) or CPU work on the blocking pool
//! (`Exec::Blocking`), so the engine's loop keeps draining the admission
//! ring (cancels included) while the model runs.

use std::os::fd::AsFd;
use std::rc::Rc;
use std::sync::{Arc, Mutex, PoisonError};

use xtc::batch::Exec;
use xtc_model::BatchPlan;
use xtc_model::KvGeometry;
use xtc_model::cpu::llama::{Llama, PagedKv};
use xtc_model::text::sampling::argmax;
use xtc_model::vulkan::InFlight;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions};

/// A model failure (its message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendError {
    /// The model could not be put on the device.
    #[error("cannot load the model on the device: {0}")]
    Load(String),
    /// The plan could not be launched.
    #[error("launch: {0}")]
    Launch(String),
    /// The launched plan failed, or no plan was in flight.
    #[error("finish: {0}")]
    Finish(String),
}

/// What a finished plan gives: per sampled sequence (plan order), the
/// greedy token and, if the launch asked, the logits (`[vocab_size]` each).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows {
    /// Greedy next token of each sampled sequence.
    pub tokens: Vec<u32>,
    /// Logits of each sampled sequence, when asked for.
    pub logits: Option<Vec<Vec<f32>>>,
}

type CpuResult = Option<Result<Vec<Vec<f32>>, String>>;

/// The CPU reference over a paged KV cache.
struct Cpu {
    state: Arc<Mutex<(Arc<Llama>, PagedKv)>>,
    result: Arc<Mutex<CpuResult>>,
    launched: bool,
}

/// The GGUF model on a Vulkan device.
struct Vulkan {
    gpu: GpuLlama,
    in_flight: Option<(InFlight, bool)>,
}

/// The engine's model (see the module doc).
pub struct Backend {
    inner: Inner,
    name: String,
}

enum Inner {
    Cpu(Cpu),
    Vulkan(Box<Vulkan>),
}

impl std::fmt::Debug for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Backend {
    /// The CPU reference with a zeroed paged KV cache of `kv`'s shape.
    pub fn cpu(model: Arc<Llama>, kv: KvGeometry, name: &str) -> Backend {
        let cache = model.new_paged_kv(kv);
        Backend {
            inner: Inner::Cpu(Cpu {
                state: Arc::new(Mutex::new((model, cache))),
                result: Arc::new(Mutex::new(None)),
                launched: false,
            }),
            name: format!("CPU reference (no Vulkan), {name}"),
        }
    }

    /// `model` uploaded to `dev` with a KV cache of `kv`'s shape, plans of
    /// at most `max_rows` token rows and `max_seqs` sequences, sequences of
    /// at most `context` positions; the sampled rows' logits are kept.
    ///
    /// # Errors
    /// [`BackendError::Load`]: bad options, out of device memory.
    pub fn vulkan(
        dev: &xtc_vk::Device,
        model: &Llama,
        kv: KvGeometry,
        max_rows: usize,
        max_seqs: usize,
        context: usize,
        name: &str,
    ) -> Result<Backend, BackendError> {
        let opts = GpuLlamaOptions {
            kv,
            max_tokens: max_rows,
            max_seqs,
            max_context: context,
            keep_logits: true,
            variant: None,
        };
        let gpu = GpuLlama::new(dev, model, opts).map_err(|e| BackendError::Load(e.to_string()))?;
        let info = dev.info();
        Ok(Backend {
            name: format!("{} ({:?}, Vulkan), {name}", info.name, info.kind),
            inner: Inner::Vulkan(Box::new(Vulkan {
                gpu,
                in_flight: None,
            })),
        })
    }

    /// One line naming the device and model.
    pub fn describe(&self) -> String {
        self.name.clone()
    }

    /// Starts `plan`; `logits`: also keep the sampled rows' logits. Returns
    /// how the engine waits for it.
    ///
    /// # Errors
    /// [`BackendError::Launch`]; nothing is in flight then.
    pub fn launch(&mut self, plan: &BatchPlan, logits: bool) -> Result<Exec, BackendError> {
        match &mut self.inner {
            Inner::Cpu(c) => {
                let (state, result, plan) = (c.state.clone(), c.result.clone(), plan.clone());
                *lock(&c.result) = None;
                c.launched = true;
                Ok(Exec::Blocking(Box::new(move || {
                    let mut st = lock(&state);
                    let (model, kv) = &mut *st;
                    let r = model.forward_paged(kv, &plan).map_err(|e| e.to_string());
                    *lock(&result) = Some(r);
                    Ok(())
                })))
            }
            Inner::Vulkan(v) => {
                let f = v
                    .gpu
                    .submit(plan)
                    .map_err(|e| BackendError::Launch(e.to_string()))?;
                let fence: Rc<dyn AsFd> = f.fence();
                v.in_flight = Some((f, logits));
                Ok(Exec::Fence(fence))
            }
        }
    }

    /// The launched plan's rows (waits for the device if it is not done:
    /// called after a timeout or an abort too, since the device may still
    /// own the plan's buffers).
    ///
    /// # Errors
    /// [`BackendError::Finish`]: the model failed, or no plan was launched.
    pub fn finish(&mut self) -> Result<Rows, BackendError> {
        match &mut self.inner {
            Inner::Cpu(c) => {
                if !std::mem::take(&mut c.launched) {
                    return Err(BackendError::Finish("no plan in flight".into()));
                }
                let r = lock(&c.result)
                    .take()
                    .unwrap_or_else(|| Err("the launched plan never ran".into()))
                    .map_err(BackendError::Finish)?;
                Ok(Rows {
                    tokens: r.iter().map(|l| argmax(l)).collect(),
                    logits: Some(r),
                })
            }
            Inner::Vulkan(v) => {
                let (f, logits) = v
                    .in_flight
                    .take()
                    .ok_or_else(|| BackendError::Finish("no plan in flight".into()))?;
                if logits {
                    let (tokens, l) = v
                        .gpu
                        .finish_with_logits(f)
                        .map_err(|e| BackendError::Finish(e.to_string()))?;
                    Ok(Rows {
                        tokens,
                        logits: Some(l),
                    })
                } else {
                    let tokens = v
                        .gpu
                        .finish(f)
                        .map_err(|e| BackendError::Finish(e.to_string()))?;
                    Ok(Rows {
                        tokens,
                        logits: None,
                    })
                }
            }
        }
    }
}
