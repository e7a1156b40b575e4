//! The crate's examples run as tests (each file's `main`, included here):
//! an example that stops working fails CI instead of misleading a reader.
//! `chat_batching` needs the model file (with `CI` set a missing one fails).

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;

#[path = "../examples/kv_batching.rs"]
mod kv_batching;

// Its `main` (the binary's entry) wraps `run`, which the test calls.
#[allow(dead_code)]
#[path = "../examples/chat_batching.rs"]
mod chat_batching;

#[test]
fn kv_batching_runs() {
    kv_batching::main().unwrap();
}
/// The batched answers equal decoding each question alone (the example
/// asserts it) and the first one is the model's known answer.
#[test]
fn chat_batching_answers_as_each_question_alone() {
    let Some((_, tok)) = model_support::model() else {
        return;
    };
    let answers = chat_batching::run().unwrap();
    assert_eq!(answers.len(), 4);
    let eos = tok.eos();
    let first: Vec<u32> = answers[0].iter().copied().filter(|&t| t != eos).collect();
    assert_eq!(tok.decode(&first), "The capital of France is Paris.");
    assert!(answers.iter().all(|a| !a.is_empty() && a.len() <= 24));
}
