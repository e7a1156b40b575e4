//! The persistent chain (`chain_r1`, `crates/model/src/vulkan/chain.rs`)
//! against the dispatched iteration: SmolLM2 on the CPU form gives the same
//! tokens and logits bit for bit whether runs of one-row dispatch groups are
//! recorded as chains or as dispatches, over a prompt's chunked prefill (not
//! chained: more than one row) and a long decode, with a second member that
//! joins and leaves; a one-member iteration is a few dispatch groups
//! instead of 154; chains split where llvmpipe's loop budget needs it; and a chain with
//! more workgroups than the device runs at once aborts, the model reruns the
//! iteration as dispatches and, after three aborts, leaves the chain off; and
//! the split attention agrees with the unsplit one to rounding. Needs the model file
//! and lavapipe (CI installs both).

mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::text::bpe::Bpe;
use xtc_model::vulkan::llama::{GpuLlama, GpuLlamaOptions, GroupTimes};
use xtc_model::vulkan::ops::Variant;
use xtc_model::vulkan::qops8::{Activations, DotForm};
use xtc_model::{BatchPlan, KvGeometry, SeqWork};

const BLOCK: usize = 16;
const BLOCKS_PER: usize = 16;

fn options() -> GpuLlamaOptions {
    GpuLlamaOptions {
        kv: KvGeometry {
            block_size: BLOCK,
            n_blocks: 2 * BLOCKS_PER,
        },
        max_tokens: 64,
        max_seqs: 2,
        max_context: BLOCK * BLOCKS_PER,
        keep_logits: true,
        variant: Some(Variant::Cpu),
    }
}

fn table(i: usize) -> Vec<u32> {
    (0..BLOCKS_PER).map(|b| (2 * b + i) as u32).collect()
}

/// One test at a time: a chain's workgroups share lavapipe's threads with
/// whatever else the process dispatches, so another test's chain or
/// dispatches would make this one's grid barriers wait (the probe could give
/// up on a busy device).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

type Models = (
    std::sync::MutexGuard<'static, ()>,
    GpuLlama,
    GpuLlama,
    &'static Bpe,
);

/// Both models, or `None` (skipped outside CI) without the model or lavapipe.
fn models() -> Option<Models> {
    models_with(Activations::F32)
}

/// As [`models`], both with activations `acts`.
fn models_with(acts: Activations) -> Option<Models> {
    let guard = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (m, t) = model_support::model()?;
    let dev = vk_support::device()?;
    if dev.info().kind != xtc_vk::DeviceKind::Cpu {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but the device is not lavapipe"
        );
        eprintln!("skipping: the chain is for CPU devices");
        return None;
    }
    let mut chained = GpuLlama::with_activations(&dev, m, options(), acts).unwrap();
    let mut apart = GpuLlama::with_activations(&dev, m, options(), acts).unwrap();
    apart.set_chain(false);
    // The probe passes on a quiet lavapipe; on a machine busy with other
    // work it may not (a timing, not a fault): the chain as the probe would
    // have set it, so these tests run it either way.
    // The model with the chain off too: its plan follows the device (the
    // int8 chain's iterations), not the switch.
    let n = xtc_model::vulkan::chain::workgroups(&dev).expect("a CPU device");
    for m in [&mut chained, &mut apart] {
        if m.chain_workgroups().is_none() {
            eprintln!("the chain's probe missed its bound (a busy machine?): forcing the chain");
            m.force_chain_workgroups(n);
        }
    }
    Some((guard, chained, apart, t))
}

/// No validation-layer message so far in this process (the layer runs
/// where `XTC_VK_VALIDATION` asks for it; CI runs these tests with
/// synchronization validation).
fn no_validation_errors() {
    assert_eq!(
        xtc_vk::validation_errors(),
        0,
        "the last: {}",
        xtc_vk::last_validation_error().unwrap_or_default()
    );
}

/// Greedy tokens and logits of one iteration of `m`.
fn run(m: &mut GpuLlama, plan: &BatchPlan) -> (Vec<u32>, Vec<Vec<f32>>) {
    let f = m.submit(plan).unwrap();
    m.finish_with_logits(f).unwrap()
}

fn same_bits(a: &[Vec<f32>], b: &[Vec<f32>]) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits()))
}

fn decode(tokens: Vec<u32>, start_pos: usize, member: usize) -> SeqWork {
    SeqWork {
        tokens,
        start_pos,
        block_table: table(member),
        sample: true,
    }
}

#[test]
fn chained_iterations_give_the_same_logits_bit_for_bit_in_a_few_groups_instead_of_154() {
    let Some((_one, mut chained, mut apart, t)) = models() else {
        return;
    };
    let layers = chained.config().n_layers;
    let workgroups = chained.chain_workgroups().expect("models() sets the chain");
    let prompt = t.encode("The three primary colors are");
    // Member 0: the prompt in chunks of 4 rows, then decode.
    let (mut pos, last) = prefill_in_chunks(&mut chained, &mut apart, &prompt);
    // Timed once: the chained iteration's groups.
    let (next, atimes, ctimes) = profile_both(&mut chained, &mut apart, last, pos);
    assert_eq!(atimes.len(), 5 * layers + 4, "dispatched: {atimes:?}");
    // qembed, the chains, then the sampled rows' norm, LM head and argmax:
    // every layer's groups in chains (two at this position on two threads:
    // chain::WORK_BUDGET).
    assert_chained_profile(&ctimes, &["qembed"], 3);
    pos += 1;
    // Decode 60 positions; member 1 joins for positions 20..30 (two rows:
    // `chain_r2`), alone again after.
    let (last, pos) = decode_with_a_joiner(&mut chained, &mut apart, t, (next, pos), 60, 20..30);
    until_a_chain_completes(&mut chained, &mut apart, workgroups, last, pos);
}

/// Member 0's `prompt` in chunks of 4 rows on both models, tokens and
/// logits compared bit for bit; returns the next position and the greedy
/// token after the prompt.
fn prefill_in_chunks(chained: &mut GpuLlama, apart: &mut GpuLlama, prompt: &[u32]) -> (usize, u32) {
    let (mut pos, mut last) = (0, 0);
    while pos < prompt.len() {
        let end = (pos + 4).min(prompt.len());
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                sample: end == prompt.len(),
                ..decode(prompt[pos..end].to_vec(), pos, 0)
            }],
        };
        let (a, al) = run(apart, &plan);
        let (c, cl) = run(chained, &plan);
        assert_eq!(a, c);
        assert!(same_bits(&al, &cl), "prefill at {pos}: logits differ");
        if let Some(&x) = c.first() {
            last = x;
        }
        pos = end;
    }
    (pos, last)
}

/// `steps` decode steps of member 0 from `(last, pos)` on both models, with
/// member 1 (a prompt of its own, one token a step) joining for the steps
/// in `join`; tokens and logits compared bit for bit. Returns member 0's
/// last token and next position.
fn decode_with_a_joiner(
    chained: &mut GpuLlama,
    apart: &mut GpuLlama,
    t: &Bpe,
    (mut last, mut pos): (u32, usize),
    steps: usize,
    join: std::ops::Range<usize>,
) -> (u32, usize) {
    let mut other = (t.encode("Name a planet."), 0usize, 0u32);
    for i in 0..steps {
        let mut seqs = vec![decode(vec![last], pos, 0)];
        if join.contains(&i) {
            let (p, at, l) = &other;
            let toks = if *at < p.len() {
                vec![p[*at]]
            } else {
                vec![*l]
            };
            seqs.push(decode(toks, *at, 1));
        }
        let plan = BatchPlan { seqs };
        let (a, al) = run(apart, &plan);
        let (c, cl) = run(chained, &plan);
        assert_eq!(a, c, "decode {i}: tokens");
        assert!(same_bits(&al, &cl), "decode {i}: logits differ");
        if plan.seqs.len() == 2 {
            other.1 += 1;
            other.2 = c[1];
        }
        last = c[0];
        pos += 1;
    }
    (last, pos)
}

/// A chained one-member iteration's groups: `head`, then 1 to `max_chains`
/// chains, then the sampled rows' norm, LM head and argmax.
fn assert_chained_profile(times: &[(&str, f64)], head: &[&str], max_chains: usize) {
    let labels: Vec<&str> = times.iter().map(|(l, _)| *l).collect();
    let chains = labels.len().saturating_sub(head.len() + 3);
    assert!((1..=max_chains).contains(&chains), "{labels:?}");
    assert_eq!(labels[..head.len()], *head, "{labels:?}");
    let end = head.len() + chains;
    assert!(
        labels[head.len()..end]
            .iter()
            .all(|l| *l == "persistent chain"),
        "{labels:?}"
    );
    assert_eq!(
        labels[end..],
        [
            "rmsnorm (sampled rows)",
            "qmm LM head (+argmax partials)",
            "argmax_part"
        ],
        "{labels:?}"
    );
}

/// One decode step of member 0 (`last` at `pos`) profiled on both models;
/// returns the (same) greedy token and both profiles.
fn profile_both(
    chained: &mut GpuLlama,
    apart: &mut GpuLlama,
    last: u32,
    pos: usize,
) -> (u32, GroupTimes, GroupTimes) {
    let plan = BatchPlan {
        seqs: vec![decode(vec![last], pos, 0)],
    };
    let (at, atimes) = apart.profile(&plan).unwrap();
    let (ct, ctimes) = chained.profile(&plan).unwrap();
    assert_eq!(at, ct);
    (ct[0], atimes, ctimes)
}

/// On a machine busy with other work every chain so far may have aborted
/// (its barrier's polling bound is a timing; three aborts leave the chain
/// off): forces it on again (`workgroups` wide) and decodes member 0 on
/// from `last` at `pos`, still bit for bit, until one completes (within
/// the context of 256 positions); then asserts one did, and that the
/// validation layer said nothing.
fn until_a_chain_completes(
    chained: &mut GpuLlama,
    apart: &mut GpuLlama,
    workgroups: u32,
    mut last: u32,
    mut pos: usize,
) {
    while chained.chain_stats().0 == 0 && pos + 1 < BLOCK * BLOCKS_PER {
        if chained.chain_workgroups().is_none() {
            chained.force_chain_workgroups(workgroups);
        }
        let plan = BatchPlan {
            seqs: vec![decode(vec![last], pos, 0)],
        };
        let (a, al) = run(apart, &plan);
        let (c, cl) = run(chained, &plan);
        assert_eq!(a, c, "decode at {pos}: tokens");
        assert!(same_bits(&al, &cl), "decode at {pos}: logits differ");
        last = c[0];
        pos += 1;
    }
    let (completed, aborted) = chained.chain_stats();
    assert!(
        completed > 0,
        "chained iterations ran ({completed} completed, {aborted} aborted and rerun)"
    );
    no_validation_errors();
}

/// int8 activations (the packed pairs, lavapipe's int8 form): iterations
/// of at most 4 rows chain as the f32 ones do (`qmm8_q41_r<T>_swar*` and
/// `attention_img_q81` as chain kinds, the blocks of x after the other
/// inputs' first rows), with the dispatched iteration's tokens and logits
/// bit for bit: a prompt in 4-row chunks (`chain_r4`), decode steps alone
/// (`chain_r1`) and with a second member (`chain_r2`); a one-member
/// iteration is qembed, the first layer's quantizer, a few chains, then
/// the sampled rows' norm, LM head and argmax.
#[test]
fn int8_iterations_chain_with_the_dispatched_bits() {
    let Some((_one, mut chained, mut apart, t)) = models_with(Activations::Int8) else {
        return;
    };
    assert!(
        matches!(chained.int8_dot(), Some(DotForm::Swar { .. })),
        "lavapipe's int8 form is the packed pairs: {:?}",
        chained.int8_dot()
    );
    let workgroups = chained.chain_workgroups().expect("models() sets the chain");
    let prompt = t.encode("The three primary colors are");
    let (mut pos, last) = prefill_in_chunks(&mut chained, &mut apart, &prompt);
    let (next, atimes, ctimes) = profile_both(&mut chained, &mut apart, last, pos);
    assert!(
        ctimes.len() < atimes.len() / 10,
        "chained {ctimes:?}, dispatched {} groups",
        atimes.len()
    );
    // The first layer's quantizer, then the chains; the LM head runs the
    // f32 product (no quantizer of the sampled rows).
    assert_chained_profile(&ctimes, &["qembed", "quant_q81"], 4);
    pos += 1;
    let (last, pos) = decode_with_a_joiner(&mut chained, &mut apart, t, (next, pos), 24, 8..16);
    until_a_chain_completes(&mut chained, &mut apart, workgroups, last, pos);
}

/// Member 0 of both models prefilled with 200 prompt tokens in chunks of
/// 50 (about 200 cached positions, where each unsplit attention step costs
/// 33 loop turns a position); returns the next position and the second
/// model's greedy token.
fn prefill_200(t: &Bpe, models: [&mut GpuLlama; 2]) -> (usize, u32) {
    let prompt: Vec<u32> = t.encode("Once upon a time, in a land far away,").repeat(20);
    let prompt = &prompt[..200];
    let (mut pos, mut last) = (0, 0);
    let [a, b] = models;
    for chunk in prompt.chunks(50) {
        let plan = BatchPlan {
            seqs: vec![SeqWork {
                sample: pos + chunk.len() == prompt.len(),
                ..decode(chunk.to_vec(), pos, 0)
            }],
        };
        run(a, &plan);
        if let Some(&x) = run(b, &plan).0.first() {
            last = x;
        }
        pos += chunk.len();
    }
    (pos, last)
}

#[test]
fn a_long_context_splits_the_layers_over_chains_within_the_loop_budget() {
    // f32 (the split attention, an eighth of the positions a lane), then
    // int8 (the attention that quantizes its output: every position a lane,
    // and its own loops after them).
    for acts in [Activations::F32, Activations::Int8] {
        let Some((_one, mut chained, mut apart, t)) = models_with(acts) else {
            return;
        };
        // Position about 200: each attention step costs its workgroups 33
        // loop turns a position, so 30 layers need several chains.
        let start = prefill_200(t, [&mut apart, &mut chained]).0;
        let mut last = 0;
        for i in 0..8 {
            let pos = start + i;
            let plan = BatchPlan {
                seqs: vec![decode(vec![last], pos, 0)],
            };
            let (a, al) = run(&mut apart, &plan);
            let (c, cl) = if i == 0 {
                let (c, times) = chained.profile(&plan).unwrap();
                let chains = times
                    .iter()
                    .filter(|(l, _)| *l == "persistent chain")
                    .count();
                assert!(
                    chains >= 3,
                    "{acts:?}: the budget splits the layers: {chains} chain(s)"
                );
                assert!(
                    times.len() < 60,
                    "{acts:?}: still far fewer groups: {}",
                    times.len()
                );
                // profile() keeps no logits: rerun the same plan on both for them.
                (c, None)
            } else {
                let (c, cl) = run(&mut chained, &plan);
                (c, Some(cl))
            };
            assert_eq!(a, c, "{acts:?}: decode {i} at position {pos}: tokens");
            if let Some(cl) = cl {
                assert!(
                    same_bits(&al, &cl),
                    "{acts:?}: decode {i} at position {pos}: logits differ"
                );
            }
            last = c[0];
        }
        no_validation_errors();
    }
}

#[test]
fn a_chain_wider_than_the_device_aborts_the_iteration_reruns_dispatched_and_three_aborts_turn_it_off()
 {
    let Some((_one, mut chained, mut apart, t)) = models() else {
        return;
    };
    // 64 workgroups on lavapipe's few threads: the first ones wait at the
    // first grid barrier for workgroups that cannot start until they end.
    chained.force_chain_workgroups(64);
    let prompt = t.encode("Hello");
    let plan = BatchPlan {
        seqs: vec![decode(prompt[..1].to_vec(), 0, 0)],
    };
    let (a, al) = run(&mut apart, &plan);
    let (c, cl) = run(&mut chained, &plan);
    assert_eq!(a, c);
    assert!(
        same_bits(&al, &cl),
        "the rerun's logits are the dispatched ones"
    );
    assert_eq!(
        chained.chain_stats(),
        (0, 1),
        "one abort, its rerun dispatched"
    );
    assert_eq!(
        chained.chain_workgroups(),
        Some(64),
        "still on after one abort"
    );
    // Two more aborts: then the chain is off.
    let mut pos = 1;
    let mut last = a[0];
    for _ in 0..2 {
        let plan = BatchPlan {
            seqs: vec![decode(vec![last], pos, 0)],
        };
        let (a, al) = run(&mut apart, &plan);
        let (c, cl) = run(&mut chained, &plan);
        assert_eq!(a, c);
        assert!(same_bits(&al, &cl));
        last = c[0];
        pos += 1;
    }
    assert_eq!(chained.chain_stats(), (0, 3));
    assert_eq!(
        chained.chain_workgroups(),
        None,
        "the chain is off after 3 aborts"
    );
    let plan = BatchPlan {
        seqs: vec![decode(vec![last], pos, 0)],
    };
    let (_, times) = chained.profile(&plan).unwrap();
    assert!(times.iter().all(|(l, _)| *l != "persistent chain"));
    no_validation_errors();
}

/// The split attention (`attention_img_split`, positions over the lanes)
/// against the unsplit one at about 200 cached positions, where its cost
/// model picks it for one row: the chained model splits (its chains run the
/// split kind), the other runs every group dispatched with the split off.
/// The logits agree to rounding (another summation order), not bit for bit
/// (which they would if the split had not run), and the greedy tokens are
/// the same.
#[test]
fn the_split_attention_agrees_with_the_unsplit_one_to_rounding() {
    let Some((_one, mut split, mut unsplit, t)) = models() else {
        return;
    };
    unsplit.set_split_attention(false);
    let (mut pos, mut last) = prefill_200(t, [&mut unsplit, &mut split]);
    let mut differing = 0;
    for i in 0..8 {
        let plan = BatchPlan {
            seqs: vec![decode(vec![last], pos, 0)],
        };
        let (a, al) = run(&mut unsplit, &plan);
        let (c, cl) = run(&mut split, &plan);
        assert_eq!(a, c, "decode {i} at position {pos}: tokens");
        let worst = al[0]
            .iter()
            .zip(&cl[0])
            .map(|(x, y)| (x - y).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-3,
            "decode {i} at position {pos}: logits differ by {worst}"
        );
        if !same_bits(&al, &cl) {
            differing += 1;
        }
        last = c[0];
        pos += 1;
    }
    assert!(
        differing > 0,
        "every iteration's logits are the unsplit ones bit for bit: the split did not run"
    );
    no_validation_errors();
}
