//! The kernel form follows what the device supports and measures
//! (`xtc_model::vulkan::form`): on lavapipe with its subgroups
//! masked (`Mask::SUBGROUPS`, as `XTC_VK_MASK=subgroups` does) only the
//! entry points that use no subgroup operation are built, SmolLM2 runs in
//! the GPU form under validation with no error and answers as the CPU
//! reference does, and asking for the CPU form there is a clear error; the
//! barrier probe and the device-ceiling kernels compute what the host does.
//! Needs a Vulkan device (lavapipe in CI) and, for the model case, the
//! model file; with `CI` set a missing one fails.

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::cpu::llama::{Chunk, Logits};
use xtc_model::text::sampling::argmax;
use xtc_model::vulkan::form;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaError, GpuLlamaOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{BatchPlan, KvGeometry, SeqWork};
use xtc_vk::kernels::{INT8, INTEGER_DOT, KERNELS};
use xtc_vk::{Device, Kernels, Mask, Selector, VkError, subgroup_ops_of};

fn masked() -> Option<Device> {
    vk_support::device()?;
    Some(Device::open_with_mask(&Selector::Auto, Mask::SUBGROUPS).unwrap())
}

#[test]
fn masked_subgroups_build_only_the_entry_points_that_need_none() {
    let Some(dev) = masked() else {
        return;
    };
    assert_eq!(dev.mask(), Mask::SUBGROUPS);
    assert_eq!(dev.subgroup_size(), None);
    assert!(dev.subgroup_operations().is_empty());
    assert!(!form::cpu_form_supported(&dev));
    assert_eq!(Variant::for_device(&dev).unwrap(), Variant::Gpu);
    let k = Kernels::new(&dev).unwrap();
    let built: Vec<&str> = k.names().collect();
    // `Kernels::new` leaves out the int8-activation entry points
    // (`Kernels::with_int8` builds them).
    let (needing, free): (Vec<_>, Vec<_>) = KERNELS
        .iter()
        .map(|(n, _)| *n)
        .filter(|n| !INT8.contains(n))
        .partition(|n| !subgroup_ops_of(n).is_empty());
    // The CPU-form products use subgroups; the GPU-form ones do not.
    assert!(needing.contains(&"qmm_q41_r4") && free.contains(&"qmm_q41_gpu"));
    assert_eq!(built, free, "exactly the entry points without subgroups");
    match k.get("qmm_q41_r4") {
        Err(VkError::Unsupported { kernel, needs, has }) => {
            assert_eq!(kernel, "qmm_q41_r4");
            assert!(!needs.is_empty() && has.is_empty());
        }
        other => panic!("{other:?}"),
    }
    // With int8 asked for, the masked device adds exactly the int8 entry
    // points that use no subgroup operation (and no `OpSDot` where the
    // device has no integer dot products).
    let k8 = Kernels::with_int8(&dev).unwrap();
    let added: Vec<&str> = k8.names().filter(|n| !built.contains(n)).collect();
    let want: Vec<&str> = INT8
        .iter()
        .copied()
        .filter(|n| subgroup_ops_of(n).is_empty())
        .filter(|n| dev.integer_dot_product() || !INTEGER_DOT.contains(n))
        .collect();
    let mut added_sorted = added.clone();
    added_sorted.sort_unstable();
    let mut want_sorted = want.clone();
    want_sorted.sort_unstable();
    assert_eq!(added_sorted, want_sorted);
    assert!(added.contains(&"qmm8_q41_gpu_poly"), "{added:?}");
    // Unmasked, the same device builds every entry point but the int8 ones.
    let dev = vk_support::device().unwrap();
    if dev.subgroup_size().is_some_and(|s| s >= 8) {
        assert_eq!(
            Kernels::new(&dev).unwrap().names().count(),
            KERNELS.len() - INT8.len()
        );
    }
    assert_eq!(xtc_vk::validation_errors(), 0);
}

fn options(variant: Option<Variant>) -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks: 8,
        },
        max_tokens: 64,
        max_seqs: 1,
        max_context: 128,
        keep_logits: false,
        variant,
    }
}

/// The GPU form is what runs without subgroups: the CPU reference's greedy
/// tokens (" Paris" among them), no validation error; the CPU form is
/// refused by name.
#[test]
fn without_subgroups_smollm2_runs_the_gpu_form_and_the_cpu_form_is_refused() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let Some(dev) = masked() else {
        return;
    };
    match GpuLlama::new(&dev, m, options(Some(Variant::Cpu))) {
        Err(e @ GpuLlamaError::Options { option, .. }) => {
            assert_eq!(option, "variant");
            let msg = e.to_string();
            assert!(
                msg.contains("subgroups") && msg.contains("XTC_VK_MASK") && msg.contains("gpu"),
                "{msg}"
            );
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("the CPU form was built without subgroups"),
    }
    let started = std::time::Instant::now();
    let mut gpu = GpuLlama::new(&dev, m, options(None)).unwrap();
    assert_eq!(gpu.variant(), Variant::Gpu);
    // A raw prompt of a few tokens (the GPU form runs about 100x slower
    // than the CPU form on lavapipe), then greedy tokens, each the CPU
    // reference's choice.
    let (mut next, mut out) = (t.encode("The capital of France is"), vec![]);
    let mut seq = m.new_sequence();
    for _ in 0..3 {
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: next.clone(),
                start_pos: seq.len(),
                block_table: (0..8).collect(),
                sample: true,
            }],
        };
        let tok = gpu.step(&plan).unwrap()[0];
        let want = m
            .forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &next,
                logits: Logits::Last,
            }])
            .unwrap();
        assert_eq!(tok, argmax(&want[0]), "after {:?}", t.decode(&out));
        out.push(tok);
        next = vec![tok];
    }
    eprintln!(
        "GPU form without subgroups: {:?} in {:.1} s",
        t.decode(&out),
        started.elapsed().as_secs_f64()
    );
    assert!(t.decode(&out).contains("Paris"), "{:?}", t.decode(&out));
    assert_eq!(xtc_vk::validation_errors(), 0);
}

/// The barrier probe's kernels compute what the host computes (so its
/// timings are of real work), and its ratio is a positive number that the
/// rule turns into a form; a device whose CPU form is not eligible gets
/// the GPU form without a probe.
#[test]
fn the_barrier_probe_runs_both_kernels_correctly() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let p = form::measure(&dev).unwrap();
    let r = p.ratio();
    eprintln!(
        "barrier probe: {:?} with barriers, {:?} without: ratio {r:.2}",
        p.barrier, p.plain
    );
    assert!(r.is_finite() && r > 0.0);
    assert_eq!(form::choose(&dev, false).unwrap(), Variant::Gpu);
    let cached = form::barrier_ratio(&dev).unwrap();
    let want = if cached >= form::CPU_FORM_RATIO {
        Variant::Cpu
    } else {
        Variant::Gpu
    };
    assert_eq!(form::choose(&dev, true).unwrap(), want);
    assert_eq!(
        form::barrier_ratio(&dev).unwrap(),
        cached,
        "kept for the process"
    );
    assert!(form::cache_key(&dev).len() > 20);
    assert_eq!(xtc_vk::validation_errors(), 0);
}

/// The device-ceiling kernels (`kernels/peak.wgsl`, `peak::measure`) run
/// every step of every invocation as written (their outputs are checked
/// inside `measure`: an early loop exit or a miscompile is an error, not a
/// rate), the rates are finite, and a grid of no workgroups is refused.
#[test]
fn the_peak_kernels_run_every_step() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let p = xtc_model::vulkan::peak::measure(&dev, 4).unwrap();
    eprintln!(
        "peak (4 workgroups): f32 {:.1} GFLOP/s, fma builtin {:.1}, i32 {:.1} GOP/s",
        p.f32_gflops(),
        p.f32_fma_gflops(),
        p.i32_gops()
    );
    assert_eq!(p.groups, 4);
    assert_eq!(
        p.madds(),
        4.0 * 64.0 * 12.0 * 8.0 * f64::from(xtc_model::vulkan::peak::ITERS)
    );
    for r in [p.f32_gflops(), p.f32_fma_gflops(), p.i32_gops()] {
        assert!(r.is_finite() && r > 0.0, "{p:?}");
    }
    match xtc_model::vulkan::peak::measure(&dev, 0) {
        Err(VkError::Inval(m)) => assert!(m.contains("groups"), "{m}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(xtc_vk::validation_errors(), 0);
}

/// In the GPU form the KV cache is one storage buffer: a cache above the
/// device's `maxStorageBufferRange` is refused by name (it was reported as
/// a 32-bit offset overflow when `xtc decode --kernels gpu` first ran on
/// lavapipe, whose range is 128 MiB).
#[test]
fn a_gpu_form_kv_cache_above_the_storage_buffer_range_is_named() {
    let Some((m, _)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let c = m.config().shape;
    let per_block = (2 * c.n_layers * 16 * c.kv_dim() * 4) as u64;
    let n_blocks = (dev.max_storage_buffer_range() / per_block + 1) as usize;
    let opts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks,
        },
        ..options(Some(Variant::Gpu))
    };
    match GpuLlama::new(&dev, m, opts) {
        Err(e @ GpuLlamaError::StorageRange { buffer, bytes, max }) => {
            assert_eq!(buffer, "KV cache");
            assert!(bytes > max && max == dev.max_storage_buffer_range());
            assert!(e.to_string().contains("maxStorageBufferRange"), "{e}");
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a KV buffer of {n_blocks} blocks above the range was built"),
    }
    assert_eq!(xtc_vk::validation_errors(), 0);
}
