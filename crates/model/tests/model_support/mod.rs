//! Shared helpers of the tests that need the real model file
//! (SmolLM2-135M-Instruct Q4_1, fetched by `scripts/fetch-model.sh`).
#![allow(dead_code)]

use std::path::PathBuf;
use std::sync::OnceLock;

use xtc_model::cpu::llama::Llama;
use xtc_model::text::bpe::Bpe;
use xtc_model::{FETCH_SCRIPT, find_model};

/// The model's path (the library's one lookup, `find_model(None)`), or
/// `None` (the test skips, saying so) when it is missing and `CI` is unset.
/// With `CI` set a missing file fails the test, naming the fetch script.
pub fn model_path() -> Option<PathBuf> {
    match find_model(None) {
        Ok(p) => Some(p),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: {e}; set CI=1 to make this a failure");
            None
        }
        Err(e) => panic!("CI is set but the model is missing: {e} (run {FETCH_SCRIPT})"),
    }
}

/// The loaded model and tokenizer, shared by the tests of one binary.
pub fn model() -> Option<&'static (Llama, Bpe)> {
    static MODEL: OnceLock<Option<(Llama, Bpe)>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            let path = model_path()?;
            let m = Llama::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let t = Bpe::from_gguf(m.gguf()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            Some((m, t))
        })
        .as_ref()
}
