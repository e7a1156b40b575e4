//! SmolLM2-135M-Instruct (Q4_1 GGUF) served as a `decode::Model` both ways:
//! on the CPU reference's paged forward pass (`CpuModel<LlamaHost>`, host work on
//! the blocking pool) and on the Vulkan device (`VulkanModel<GpuLlama>` over
//! `GpuLlama`, completing on a fence fd). A served workload of real-text
//! prompts (members joining and leaving, prompts prefilled in chunks beside
//! other members' decode rows, under a token budget) gives every request the
//! greedy tokens of the contiguous CPU reference (`Llama::forward` of that
//! request alone), on both models, so they agree token for token. Needs the
//! model file and a Vulkan device (lavapipe); with `CI` set a missing one
//! fails.

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use xtc_kvbatch::seq::RequestSpec;
use xtc_model::adapters::{CpuModel, VulkanModel};
use xtc_model::cpu::llama::{Chunk, Llama, Logits};
use xtc_model::text::sampling::argmax;
use xtc_model::vulkan::llama::GpuLlamaOptions;
use xtc_model::{BatchPlan, KvGeometry, SeqWork};
use xtc_model::{Completion, Model};
use xtc_replay::{
    job::{self, JobOpts, Mode, RunOutput, Status, Workload},
    prompts,
};

const TEXT: &str = include_str!("../../../data/pride_and_prejudice_ch1-12.txt");

fn opts(mode: Mode) -> JobOpts {
    JobOpts {
        mode,
        max_active: 3,
        kv_blocks: 24,
        block_size: 4,
        token_budget: 7,
        stop_token: None,
    }
}

fn geometry(o: &JobOpts) -> KvGeometry {
    KvGeometry {
        block_size: o.block_size,
        n_blocks: o.kv_blocks,
    }
}

/// Six requests arriving at once with prompts cut from the text (several
/// longer than the token budget), at most three members: later requests
/// join as earlier ones leave.
fn workload(m: &Llama) -> Workload {
    let shapes = [(11, 6), (3, 9), (17, 2), (5, 5), (1, 8), (9, 4)];
    let mut wl = Workload {
        requests: shapes
            .iter()
            .enumerate()
            .map(|(id, &(p, o))| RequestSpec {
                id,
                arrival: Duration::ZERO,
                prompt: vec![0; p],
                output_tokens: o,
                cancel_after: None,
            })
            .collect(),
    };
    let (_, tok) = model_support::model().expect("loaded");
    let corpus = tok.encode(TEXT);
    assert!(corpus.len() > 20_000, "{} tokens", corpus.len());
    prompts::text_windows(&mut wl, &corpus, 3).unwrap();
    let vocab = m.config().shape.vocab_size as u32;
    assert!(
        wl.requests
            .iter()
            .all(|r| r.prompt.iter().all(|&t| t < vocab))
    );
    wl
}

/// Greedy tokens of one request alone on the contiguous CPU reference.
fn contiguous_greedy(m: &Llama, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut seq = m.new_sequence();
    let mut out = vec![];
    let mut next = prompt.to_vec();
    while out.len() < n {
        let logits = m
            .forward(&mut [Chunk {
                seq: &mut seq,
                tokens: &next,
                logits: Logits::Last,
            }])
            .unwrap()
            .remove(0);
        let t = argmax(&logits);
        out.push(t);
        next = vec![t];
    }
    out
}

fn check(m: &Llama, wl: &Workload, out: &RunOutput, what: &str) -> Vec<Vec<u32>> {
    assert_eq!(out.finished.len(), wl.requests.len(), "{what}");
    assert_eq!(out.kv_leaked, 0, "{what}");
    let mut tokens = vec![vec![]; wl.requests.len()];
    for f in &out.finished {
        let r = &wl.requests[f.seq.id];
        assert_eq!(f.status, Status::Done, "{what}");
        let want = contiguous_greedy(m, &r.prompt, r.output_tokens);
        assert_eq!(f.seq.generated, want, "{what}: request {}", r.id);
        tokens[r.id] = f.seq.generated.clone();
    }
    // Chunked prefill beside decode rows, and joins after a leave, happened.
    assert!(
        out.iterations
            .iter()
            .any(|i| i.prefill_tokens > 0 && i.decode_tokens > 0),
        "{what}"
    );
    let first_left = out
        .finished
        .iter()
        .filter_map(|f| f.seq.timing.finished)
        .min()
        .unwrap();
    assert!(
        out.finished
            .iter()
            .any(|f| f.seq.timing.admitted.unwrap() > first_left),
        "{what}: a request joined after one left"
    );
    tokens
}

fn run(model: impl Model + 'static, wl: &Workload, o: &JobOpts) -> RunOutput {
    xtc_replay::run(&job::shared(model), wl, o, Box::new(|_| {})).unwrap()
}

#[test]
fn served_on_the_cpu_reference_and_on_vulkan_each_request_gets_its_contiguous_greedy_tokens() {
    let Some((m, _)) = model_support::model() else {
        return;
    };
    let path = model_support::model_path().unwrap();
    let shared = Arc::new(Llama::load(&path).unwrap());
    let wl = workload(m);
    let mut cpu_tokens = None;
    for mode in [Mode::Continuous, Mode::Static] {
        let o = opts(mode);
        let cpu = CpuModel::llama(shared.clone(), geometry(&o), "smollm2");
        let out = run(cpu, &wl, &o);
        let t = check(m, &wl, &out, &format!("CPU reference, {}", mode.name()));
        cpu_tokens.get_or_insert(t);
    }
    let Some(dev) = vk_support::device() else {
        return;
    };
    let o = opts(Mode::Continuous);
    let gopts = GpuLlamaOptions {
        kv: geometry(&o),
        max_tokens: o.token_budget,
        max_seqs: o.max_active,
        max_context: 64,
        keep_logits: false,
        variant: None,
    };
    let vk = VulkanModel::llama(&dev, m, gopts, "smollm2").unwrap();
    assert_eq!(vk.config().seq_len, 64);
    let out = run(vk, &wl, &o);
    let vk_tokens = check(m, &wl, &out, "Vulkan");
    assert_eq!(Some(vk_tokens), cpu_tokens, "the two models agree");
}

/// The Vulkan model completes on a fence fd that is readable once the
/// device ran the plan; `finish` then returns the greedy tokens; errors are
/// the model's, with nothing in flight after them.
#[test]
fn vulkan_model_completes_on_a_fence_and_refuses_bad_plans() {
    let Some((m, _)) = model_support::model() else {
        return;
    };
    let Some(dev) = vk_support::device() else {
        return;
    };
    let gopts = GpuLlamaOptions {
        kv: KvGeometry {
            block_size: 16,
            n_blocks: 4,
        },
        max_tokens: 16,
        max_seqs: 2,
        max_context: 64,
        keep_logits: false,
        variant: None,
    };
    let mut vk = VulkanModel::llama(&dev, m, gopts, "smollm2").unwrap();
    assert!(vk.describe().contains("Vulkan"), "{}", vk.describe());
    assert!(vk.finish().is_err(), "no plan in flight");
    let prompt = [504u32, 3458, 314, 260, 3575, 282];
    let plan = BatchPlan {
        seqs: vec![SeqWork {
            tokens: prompt.to_vec(),
            start_pos: 0,
            block_table: vec![2],
            sample: true,
        }],
    };
    let Completion::Fence(fd) = vk.launch(&plan).unwrap() else {
        panic!("the Vulkan model completes on a fence")
    };
    vk_support::wait_readable(fd.as_fd());
    let got = vk.finish().unwrap();
    assert_eq!(got, vec![contiguous_greedy(m, &prompt, 1)[0]]);
    let beyond = BatchPlan {
        seqs: vec![SeqWork {
            tokens: vec![1],
            start_pos: 0,
            block_table: vec![4],
            sample: true,
        }],
    };
    let e = vk.launch(&beyond).unwrap_err();
    assert!(e.message().contains("submit"), "{e}");
    assert!(
        vk.finish().is_err(),
        "nothing in flight after a refused launch"
    );
}
