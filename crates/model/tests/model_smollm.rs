//! The real model (SmolLM2-135M-Instruct, Q4_1 GGUF): its config, the
//! tokenizer's test vector, greedy generation and perplexity on the CPU
//! reference. Skips without the file unless `CI` is set (then it fails).

mod model_support;

use xtc_model::format::gguf::GgmlType;
use xtc_model::generate::{StopReason, generate};
use xtc_model::text::chat;
use xtc_model::text::sampling::{Sampler, SamplingParams};

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

/// decode(encode(text)) == text over ASCII, UTF-8 of 2, 3 and 4 bytes,
/// whitespace runs, digits, and (with specials parsed) the special tokens.
#[test]
fn encode_decode_round_trips() {
    let Some((_, t)) = model_support::model() else {
        return;
    };
    let ascii: String = (0x20u8..0x7f).map(char::from).collect();
    let texts = [
        ascii.as_str(),
        "Hello, world! It's 2024; isn't it?",
        "  leading spaces,\ttabs\tand\n\nnew lines   \n",
        "naïve café, Ünïcödé — «quotes» … 東京タワー 서울 🚀🦀 𝔘𝔫𝔦",
        "π ≈ 3.14159, e^iπ + 1 = 0, ½ ⅓ ², ٣ ४",
        "fn main() {\n    println!(\"{}\", 1 + 2);\n}\n",
        "",
    ];
    for text in texts {
        let ids = t.encode(text);
        assert_eq!(t.decode(&ids), text, "ids {ids:?}");
        assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
    }
    let special = "<|im_start|>system\nBe brief.<|im_end|>\n<|endoftext|><|im_start|>user\nhi";
    let ids = t.encode_with_specials(special);
    assert_eq!(t.decode(&ids), special);
    assert_eq!(ids.iter().filter(|&&i| i == 1).count(), 2);
    assert!(ids.contains(&0) && ids.contains(&2));
    // Without parsing, the same text is plain characters.
    let plain = t.encode(special);
    assert!(!plain.contains(&1) && !plain.contains(&2));
    assert_eq!(t.decode(&plain), special);
}

#[test]
fn numerals_split_one_by_one_and_uncovered_bytes_drop() {
    let Some((_, t)) = model_support::model() else {
        return;
    };
    let digits = t.encode("2024");
    assert_eq!(digits.len(), 4);
    assert_eq!(t.decode(&digits[..1]), "2");
    // SmolLM2's vocabulary has no token for 21 bytes, 0x04 among them.
    let missing = t.uncovered_bytes();
    assert_eq!(missing.len(), 21);
    assert!(missing.contains(&0x04) && missing.contains(&0xff));
    assert_eq!(t.uncovered_in("a\u{4}b"), [0x04]);
    assert_eq!(t.decode(&t.encode("a\u{4}b")), "ab");
}

/// Two prompts in one forward pass give the bits of each alone (the
/// oracle's contract for batched kernels).
#[test]
fn a_batch_of_prompts_matches_each_alone() {
    use xtc_model::cpu::llama::{Chunk, Logits};
    let Some((m, t)) = model_support::model() else {
        return;
    };
    let a = chat::user_prompt(t, "Name a colour.").unwrap();
    let b = chat::user_prompt(t, "What is 2 + 2?").unwrap();
    let alone = |p: &[u32]| {
        let mut s = m.new_sequence();
        m.forward(&mut [Chunk {
            seq: &mut s,
            tokens: p,
            logits: Logits::Last,
        }])
        .unwrap()
        .remove(0)
    };
    let (la, lb) = (alone(&a), alone(&b));
    let (mut sa, mut sb) = (m.new_sequence(), m.new_sequence());
    let both = m
        .forward(&mut [
            Chunk {
                seq: &mut sa,
                tokens: &a,
                logits: Logits::Last,
            },
            Chunk {
                seq: &mut sb,
                tokens: &b,
                logits: Logits::Last,
            },
        ])
        .unwrap();
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&both[0]), bits(&la));
    assert_eq!(bits(&both[1]), bits(&lb));
}
