//! The real model (SmolLM2-135M-Instruct, Q4_1 GGUF): its config, the
//! tokenizer's test vector, greedy generation and perplexity on the CPU
//! reference. Skips without the file unless `CI` is set (then it fails).

mod model_support;

use xtc::decode::model::chat;
use xtc::decode::model::generate::{StopReason, generate};
use xtc::decode::model::gguf::GgmlType;
use xtc::decode::model::sampling::{Sampler, SamplingParams};

/// The token ids of the ChatML prompt for "What is the capital of France?".
const FRANCE_IDS: [u32; 16] = [
    1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198,
];

#[test]
fn the_config_is_smollm2_135m() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let c = m.config();
    let s = c.shape;
    assert_eq!(
        (
            s.n_layers,
            s.dim,
            s.hidden_dim,
            s.n_heads,
            s.n_kv_heads,
            s.vocab_size,
            s.seq_len
        ),
        (30, 576, 1536, 9, 3, 49152, 8192)
    );
    assert_eq!(c.head_size(), 64);
    assert_eq!(c.rope_base, 100000.0);
    assert!((c.rms_eps - 1e-5).abs() < 1e-9);
    assert!(c.tied_output);
    let mut types = std::collections::HashMap::new();
    for tensor in m.gguf().tensors() {
        *types.entry(tensor.ty).or_insert(0) += 1;
    }
    assert_eq!(types[&GgmlType::Q4_1], 210);
    assert_eq!(types[&GgmlType::F32], 61);
    assert_eq!(types[&GgmlType::Q8_0], 1);
    assert_eq!((t.bos(), t.eos(), t.vocab_size()), (Some(1), 2, 49152));
}

#[test]
fn the_chatml_prompt_is_the_test_vector() {
    let Some((_, t)) = model_support::model() else {
        return;
    };
    let ids = chat::user_prompt(t, "What is the capital of France?").unwrap();
    assert_eq!(ids, FRANCE_IDS);
    let text =
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.encode_with_specials(text), FRANCE_IDS);
    assert_eq!(t.decode(&FRANCE_IDS), text);
}

#[test]
fn greedy_answer_is_paris() {
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let prompt = chat::user_prompt(t, "What is the capital of France?").unwrap();
    let mut sampler = Sampler::new(SamplingParams::greedy()).unwrap();
    let mut ids = vec![];
    let (_, stats) = generate(m, &prompt, 32, &[t.eos()], &mut sampler, |id| {
        ids.push(id);
        true
    })
    .unwrap();
    assert_eq!(stats.stop, StopReason::Eos);
    assert_eq!(ids.last(), Some(&t.eos()));
    assert_eq!(
        t.decode(&ids[..ids.len() - 1]),
        "The capital of France is Paris."
    );
}
