//! The decode job against the device-free toy model: every request's tokens
//! equal its greedy decode run alone, with members joining and leaving
//! mid-run, under every admission policy; rejection and cancellation.

use std::time::Duration;

use xtc_kvbatch::seq::RequestSpec;
use xtc_model::adapters::{ToyModel, toy_reference};
use xtc_replay::job::{self, JobOpts, Mode, RunOutput, Status, Workload};
use xtc_replay::report::Report;

const VOCAB: usize = 97;

fn spec(id: usize, arrival_ms: u64, prompt: usize, out: usize) -> RequestSpec {
    RequestSpec {
        id,
        arrival: Duration::from_millis(arrival_ms),
        prompt: (0..prompt)
            .map(|i| ((i * 7 + id * 13) % VOCAB) as u32)
            .collect(),
        output_tokens: out,
        cancel_after: None,
    }
}

fn opts(mode: Mode) -> JobOpts {
    JobOpts {
        mode,
        max_active: 4,
        kv_blocks: 24,
        block_size: 4,
        token_budget: 9,
        stop_token: None,
    }
}

fn run(wl: &Workload, o: &JobOpts) -> RunOutput {
    let m = job::shared(ToyModel::new(VOCAB, o.kv_blocks, o.block_size));
    xtc_replay::run(&m, wl, o, Box::new(|_| {})).unwrap()
}

/// Staggered arrivals and mixed lengths: members join while others decode.
fn mixed() -> Workload {
    let shapes = [
        (13, 5),
        (2, 9),
        (7, 1),
        (20, 3),
        (1, 12),
        (9, 9),
        (5, 4),
        (16, 2),
    ];
    let requests = shapes
        .iter()
        .enumerate()
        .map(|(i, &(p, o))| spec(i, (i as u64 % 3) * 5, p, o))
        .collect();
    Workload { requests }
}

fn assert_matches_reference(wl: &Workload, out: &RunOutput) {
    assert_eq!(out.finished.len(), wl.requests.len());
    for f in &out.finished {
        let r = &wl.requests.iter().find(|r| r.id == f.seq.id).unwrap();
        assert_eq!(f.status, Status::Done, "request {}", r.id);
        let want = toy_reference(&r.prompt, r.output_tokens, VOCAB);
        assert_eq!(f.seq.generated, want, "request {}", r.id);
    }
    assert_eq!(out.kv_leaked, 0);
}

#[test]
fn every_policy_reproduces_each_request_alone() {
    let wl = mixed();
    for mode in [Mode::Continuous, Mode::Static, Mode::OneAtATime] {
        let out = run(&wl, &opts(mode));
        assert_matches_reference(&wl, &out);
        let max_ready = out.iterations.iter().map(|i| i.ready).max().unwrap();
        match mode {
            Mode::OneAtATime => assert_eq!(max_ready, 1),
            _ => assert!(max_ready > 1, "{mode:?} never batched"),
        }
        assert!(
            out.iterations
                .iter()
                .all(|i| i.prefill_tokens + i.decode_tokens <= 9)
        );
    }
}

#[test]
fn members_join_and_leave_mid_run() {
    let wl = mixed();
    let out = run(&wl, &opts(Mode::Continuous));
    // some iteration mixes prefill rows with decode rows: a member joined
    // while others were decoding
    assert!(
        out.iterations
            .iter()
            .any(|i| i.prefill_tokens > 0 && i.decode_tokens > 0)
    );
    // the ready vector shrinks and grows again
    let sizes: Vec<usize> = out.iterations.iter().map(|i| i.ready).collect();
    assert!(sizes.windows(2).any(|w| w[1] < w[0]));
    assert!(sizes.windows(2).any(|w| w[1] > w[0]));
}

#[test]
fn kv_capacity_bounds_admission() {
    let wl = mixed();
    let mut o = opts(Mode::Continuous);
    o.kv_blocks = 8; // 32 positions: at most a couple of members at once
    o.max_active = 8;
    let out = run(&wl, &o);
    assert_matches_reference(&wl, &out);
    assert!(out.kv_peak <= 8);
    assert!(out.iterations.iter().all(|i| i.kv_used <= 8));
}

#[test]
fn request_that_can_never_fit_is_rejected_with_a_message() {
    let mut wl = mixed();
    wl.requests.push(spec(99, 0, 200, 10));
    let out = run(&wl, &opts(Mode::Continuous));
    assert_eq!(out.rejected.len(), 1);
    let msg = &out.rejected[0].reason;
    assert!(
        msg.contains("request 99") && msg.contains("53 KV blocks") && msg.contains("24 blocks"),
        "{msg}"
    );
    assert_eq!(out.finished.len(), wl.requests.len() - 1);
    let report = Report::from_run(&out, wl.requests.len());
    assert_eq!(report.requests.rejected, 1);
    assert!(report.render().contains("request 99 rejected"));
}

#[test]
fn cancelled_requests_free_their_blocks_and_others_are_unaffected() {
    let mut wl = mixed();
    // a long request whose client cancels after 2 tokens, while others run
    let mut long = spec(50, 0, 3, 60);
    long.cancel_after = Some(2);
    wl.requests.insert(0, long);
    let mut o = opts(Mode::Continuous);
    o.kv_blocks = 40;
    let out = run(&wl, &o);
    let cancelled: Vec<_> = out
        .finished
        .iter()
        .filter(|f| f.status == Status::Cancelled)
        .collect();
    assert_eq!(cancelled.len(), 1);
    // cancelled after 2 tokens: at most one more iteration ran before its
    // blocks were freed, and what it generated is the reference's prefix
    let got = &cancelled[0].seq.generated;
    assert!((2..=3).contains(&got.len()), "{got:?}");
    let long = wl.requests.iter().find(|r| r.id == 50).unwrap();
    assert_eq!(got[..], toy_reference(&long.prompt, 60, VOCAB)[..got.len()]);
    assert_eq!(out.kv_leaked, 0);
    for f in out.finished.iter().filter(|f| f.status == Status::Done) {
        let r = wl.requests.iter().find(|r| r.id == f.seq.id).unwrap();
        assert_eq!(
            f.seq.generated,
            toy_reference(&r.prompt, r.output_tokens, VOCAB)
        );
    }
}

#[test]
fn bad_options_are_errors() {
    let wl = mixed();
    let mut o = opts(Mode::Continuous);
    o.token_budget = 0;
    let m = job::shared(ToyModel::new(VOCAB, 24, 4));
    let e = xtc_replay::run(&m, &wl, &o, Box::new(|_| {})).unwrap_err();
    assert!(e.to_string().contains("--token-budget"), "{e}");
}

#[test]
fn local_driver_agrees_with_the_group_driver() {
    let wl = mixed();
    for mode in [Mode::Continuous, Mode::Static, Mode::OneAtATime] {
        let o = opts(mode);
        let mut m = ToyModel::new(VOCAB, o.kv_blocks, o.block_size);
        let out = xtc_replay::local::run(&mut m, &wl, &o, &mut |_| {}).unwrap();
        assert_matches_reference(&wl, &out);
        let mut a: Vec<_> = out
            .finished
            .iter()
            .map(|f| (f.seq.id, f.seq.generated.clone()))
            .collect();
        let group = run(&wl, &o);
        let mut b: Vec<_> = group
            .finished
            .iter()
            .map(|f| (f.seq.id, f.seq.generated.clone()))
            .collect();
        a.sort();
        b.sort();
        assert_eq!(a, b, "{mode:?}");
    }
}
