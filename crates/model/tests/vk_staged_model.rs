//! SmolLM2-135M-Instruct on a device whose buffers the host may not map
//! (forced staging, `xtc_vk::DeviceOptions::force_staging`): the weights (tens
//! of MB) go up through staging buffers as on a discrete GPU, and a short
//! greedy generation gives the same tokens as on the same device without
//! forcing, in both kernel forms, under core + synchronization validation
//! with no error. Needs the model file and a Vulkan device (lavapipe in CI);
//! with `CI` set a missing one fails.

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::text::chat;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions};
use xtc_model::vulkan::ops::Variant;
use xtc_model::{BatchPlan, KvGeometry, SeqWork};
use xtc_vk::{Device, DeviceOptions, Selector, Validation};

/// The lavapipe form's run: the ChatML question, 8 tokens.
const CPU_RUN: Run = Run {
    chat: true,
    text: "What is the capital of France?",
    tokens: 8,
};
/// The GPU form's run, kept short (that form is slow on lavapipe: about a
/// minute per run for the ChatML prompt and 8 tokens on a loaded 2-core
/// machine): a 5-token plain prompt, 3 tokens.
const GPU_RUN: Run = Run {
    chat: false,
    text: "The capital of France is",
    tokens: 3,
};

struct Run {
    chat: bool,
    text: &'static str,
    tokens: usize,
}

fn open(force_staging: bool) -> Device {
    let opts = DeviceOptions {
        validation: (Validation::Sync, true),
        force_staging,
        ..DeviceOptions::default()
    };
    Device::open_options(&Selector::Auto, &opts)
        .expect("validation requested: the layer must be installed (.ci/ensure-deps.sh)")
}

/// `run.tokens` greedy tokens for `run`'s prompt on `dev` in `variant`.
fn generate(dev: &Device, variant: Variant, run: &Run) -> Vec<u32> {
    let (m, t) = model_support::model().expect("checked by the caller");
    let opts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks: 4,
        },
        max_tokens: 64,
        max_seqs: 1,
        max_context: 64,
        keep_logits: false,
        variant: Some(variant),
    };
    let mut gpu = GpuLlama::new(dev, m, opts).unwrap();
    let mut next = match run.chat {
        true => chat::user_prompt(t, run.text).unwrap(),
        false => t.encode(run.text),
    };
    let (mut pos, mut out) = (0, vec![]);
    while out.len() < run.tokens {
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                tokens: next.clone(),
                start_pos: pos,
                block_table: vec![0, 1, 2, 3],
                sample: true,
            }],
        };
        let f = gpu.submit(&plan).unwrap();
        let tok = gpu.finish(f).unwrap()[0];
        pos += next.len();
        out.push(tok);
        next = vec![tok];
    }
    out
}

#[test]
fn forced_staging_generates_the_same_greedy_tokens_in_both_forms() {
    if model_support::model().is_none() || vk_support::device().is_none() {
        return;
    }
    let mapped = open(false);
    let staged = open(true);
    assert!(staged.force_staging() && !mapped.force_staging());
    let (_, t) = model_support::model().unwrap();
    for (variant, run) in [(Variant::Cpu, CPU_RUN), (Variant::Gpu, GPU_RUN)] {
        let t0 = std::time::Instant::now();
        let want = generate(&mapped, variant, &run);
        let t1 = std::time::Instant::now();
        let got = generate(&staged, variant, &run);
        eprintln!(
            "{variant:?} form: mapped {:.1} s, staged {:.1} s",
            (t1 - t0).as_secs_f64(),
            t1.elapsed().as_secs_f64()
        );
        assert_eq!(
            got, want,
            "{variant:?} form: forced staging changed the tokens"
        );
        let text = t.decode(&got);
        eprintln!("{variant:?} form, staged: {text:?}");
        assert!(text.contains("Paris"), "{variant:?} form: {text:?}");
    }
    assert_eq!(
        xtc_vk::validation_errors(),
        0,
        "the last: {}",
        xtc_vk::last_validation_error().unwrap_or_default()
    );
}
