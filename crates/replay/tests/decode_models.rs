//! The decode job on real models: every request's tokens equal the CPU
//! reference's greedy decode of that request alone, on the CPU reference
//! model and on the default Vulkan device (lavapipe), with chunked prefill and
//! members joining and leaving mid-run; a llama2.c checkpoint written to disk
//! decodes the same as the weights it was written from.

use std::time::Duration;

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_kvbatch::seq::RequestSpec;
use xtc_model::Model;
use xtc_model::adapters::{CpuModel, VulkanModel, reference_greedy};
use xtc_model::format::checkpoint;
use xtc_model::{Config, KvGeometry, Weights};
use xtc_replay::job::{self, JobOpts, Mode, RunOutput, Status, Workload};

const SMALL: Config = Config {
    dim: 32,
    hidden_dim: 64,
    n_layers: 2,
    n_heads: 4,
    n_kv_heads: 2,
    vocab_size: 64,
    seq_len: 64,
};

fn opts(mode: Mode) -> JobOpts {
    JobOpts {
        mode,
        max_active: 3,
        kv_blocks: 16,
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

/// Six requests, all arriving at once (so admission order, and thus which
/// members join and leave when, is deterministic), prompts longer than the
/// token budget; three members at most, so later requests join mid-run.
fn workload() -> Workload {
    let shapes = [(11, 6), (3, 9), (17, 2), (5, 5), (1, 8), (9, 4)];
    let requests = shapes
        .iter()
        .enumerate()
        .map(|(id, &(p, o))| RequestSpec {
            id,
            arrival: Duration::ZERO,
            prompt: (0..p).map(|i| ((7 * i + 3 * id + 1) % 64) as u32).collect(),
            output_tokens: o,
            cancel_after: None,
        })
        .collect();
    Workload { requests }
}

fn check(w: &Weights, wl: &Workload, out: &RunOutput) {
    assert_eq!(out.finished.len(), wl.requests.len());
    for f in &out.finished {
        let r = wl.requests.iter().find(|r| r.id == f.seq.id).unwrap();
        assert_eq!(f.status, Status::Done);
        let want = reference_greedy(w, &r.prompt, r.output_tokens).unwrap();
        assert_eq!(f.seq.generated, want, "request {}", r.id);
    }
    assert_eq!(out.kv_leaked, 0);
    // chunked prefill and joins/leaves really happened
    assert!(
        out.iterations
            .iter()
            .any(|i| i.prefill_tokens > 0 && i.decode_tokens > 0)
    );
    // a member left while others continued, and a later one joined them
    let first_left = out
        .finished
        .iter()
        .filter_map(|f| f.seq.timing.finished)
        .min()
        .unwrap();
    let last_left = out
        .finished
        .iter()
        .filter_map(|f| f.seq.timing.finished)
        .max()
        .unwrap();
    assert!(first_left < last_left);
    assert!(
        out.finished
            .iter()
            .any(|f| f.seq.timing.admitted.unwrap() > first_left)
    );
}

fn run(model: impl Model + 'static, o: &JobOpts) -> RunOutput {
    xtc_replay::run(&job::shared(model), &workload(), o, Box::new(|_| {})).unwrap()
}

#[test]
fn cpu_reference_model_batched_equals_each_request_alone() {
    let w = Weights::synthetic(SMALL, 11);
    for mode in [Mode::Continuous, Mode::Static] {
        let o = opts(mode);
        let m = CpuModel::new(w.clone(), geometry(&o));
        check(&w, &workload(), &run(m, &o));
    }
}

#[test]
fn checkpoint_on_disk_decodes_like_its_weights() {
    let w = Weights::synthetic(SMALL, 5);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("small.bin");
    let mut bytes = Vec::new();
    checkpoint::write(&w, false, &mut bytes).unwrap();
    std::fs::write(&path, bytes).unwrap();
    let loaded = checkpoint::load(&path).unwrap();
    let o = opts(Mode::Continuous);
    let m = CpuModel::new(loaded, geometry(&o));
    check(&w, &workload(), &run(m, &o));
}

#[test]
fn vulkan_model_batched_equals_cpu_reference_alone() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(SMALL, 11);
    let o = opts(Mode::Continuous);
    let m = VulkanModel::new(&dev, &w, geometry(&o), o.token_budget, o.max_active).unwrap();
    check(&w, &workload(), &run(m, &o));
}

/// Requests 1 and 3 are cancelled by their clients after 2 and 0 tokens:
/// they end cancelled having run at most one more iteration (their blocks
/// were freed then: nothing leaks), with a prefix of their reference tokens;
/// the others are untouched.
fn check_cancelled(w: &Weights, model: impl Model + 'static) {
    let mut wl = workload();
    wl.requests[1].cancel_after = Some(2);
    wl.requests[3].cancel_after = Some(0);
    let o = opts(Mode::Continuous);
    let out = xtc_replay::run(&job::shared(model), &wl, &o, Box::new(|_| {})).unwrap();
    assert_eq!(out.kv_leaked, 0);
    for f in &out.finished {
        let r = &wl.requests[f.seq.id];
        let want = reference_greedy(w, &r.prompt, r.output_tokens).unwrap();
        let got = &f.seq.generated;
        assert_eq!(got[..], want[..got.len()], "request {}", r.id);
        match r.cancel_after {
            Some(k) => {
                assert_eq!(f.status, Status::Cancelled, "request {}", r.id);
                assert!(got.len() <= k + 1, "request {}: {} tokens", r.id, got.len());
            }
            None => assert_eq!(f.status, Status::Done),
        }
    }
}

#[test]
fn cancelled_members_leave_within_one_iteration_cpu() {
    let w = Weights::synthetic(SMALL, 11);
    check_cancelled(
        &w,
        CpuModel::new(w.clone(), geometry(&opts(Mode::Continuous))),
    );
}

#[test]
fn cancelled_members_leave_within_one_iteration_vulkan() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let w = Weights::synthetic(SMALL, 11);
    let o = opts(Mode::Continuous);
    let m = VulkanModel::new(&dev, &w, geometry(&o), o.token_budget, o.max_active).unwrap();
    check_cancelled(&w, m);
}
