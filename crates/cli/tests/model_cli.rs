//! `xtc generate` and `xtc perplexity` through the binary: the streamed
//! answer on stdout and tokens/s on stderr, `--json`, the perplexity figure,
//! and errors with their exit statuses. Tests that need the model skip
//! without it unless `CI` is set (then they fail).

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::process::{Command, Output};

fn xtc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(args)
        .output()
        .expect("run xtc")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The Paris prompt on both devices: the CPU reference (`--device cpu`)
/// and the Vulkan device `auto` picks (lavapipe in CI).
#[test]
fn generate_answers_paris_greedily_on_both_devices() {
    if model_support::model_path().is_none() {
        return;
    }
    let vulkan = vk_support::device().is_some();
    for (device, names) in [("cpu", "on the CPU reference"), ("auto", "Vulkan")] {
        if device == "auto" && !vulkan {
            continue;
        }
        let o = xtc(&[
            "generate",
            "--device",
            device,
            "What is the capital of France?",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        assert_eq!(text(&o.stdout), "The capital of France is Paris.\n");
        let err = text(&o.stderr);
        assert!(err.contains(names), "--device {device}: {err}");
        assert!(
            err.contains("tokens/s decode") && err.contains("prefill"),
            "{err}"
        );
        assert!(err.contains("stop: Eos"), "{err}");
    }
}

/// SmolLM2 in the GPU kernel form (`--kernels gpu`: workgroup memory and
/// barriers, the form a GPU runs) end to end on the Vulkan device, whatever
/// form that device would pick, answers as the CPU reference does; under
/// validation (`.ci/test`) with no error, or the process exits 1. Slow on
/// lavapipe (about 130 s: a barrier switches between a workgroup's fibers).
#[test]
fn generate_answers_paris_in_the_gpu_kernel_form() {
    if model_support::model_path().is_none() || vk_support::device().is_none() {
        return;
    }
    let o = xtc(&[
        "generate",
        "--kernels",
        "gpu",
        "What is the capital of France?",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "The capital of France is Paris.\n");
    let o = xtc(&["generate", "--kernels", "fast", "hi"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
}

#[test]
fn generate_json_and_raw_agree_with_the_chat_template() {
    if model_support::model_path().is_none() {
        return;
    }
    let o = xtc(&["generate", "--json", "What is the capital of France?"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["text"], "The capital of France is Paris.");
    assert_eq!(v["stats"]["stop"], "eos");
    assert_eq!(v["ids"].as_array().unwrap().last().unwrap(), 2);
    assert!(v["decode_tokens_per_s"].as_f64().unwrap() > 0.0);
    let raw = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n";
    let o = xtc(&["generate", "--json", "--raw", raw]);
    let w: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(w["prompt_ids"], v["prompt_ids"]);
    assert_eq!(w["ids"], v["ids"]);
}

#[test]
fn generate_stops_at_max_tokens_and_samples_reproducibly() {
    if model_support::model_path().is_none() {
        return;
    }
    // One kernel form for both runs: each process measures the form probe
    // anew on a busy machine, and two forms' logits differ in their last
    // bits, which a sampler may turn into different tokens.
    let run = |seed: &str| {
        let o = xtc(&[
            "generate",
            "--kernels",
            "cpu",
            "--json",
            "--max-tokens",
            "6",
            "--temperature",
            "0.9",
            "--top-k",
            "40",
            "--top-p",
            "0.95",
            "--min-p",
            "0.02",
            "--seed",
            seed,
            "Write a poem about the sea.",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let a = run("7");
    assert_eq!(a["stats"]["stop"], "max_tokens");
    assert_eq!(a["ids"].as_array().unwrap().len(), 6);
    assert_eq!(run("7")["ids"], a["ids"]);
}

/// Perplexity in the GPU kernel form within 1e-3 nats of the CPU form, on
/// the shipped text's opening paragraph (its first 200 bytes: the GPU
/// form's products run about 100x slower on lavapipe, so the whole chapter
/// would take tens of minutes), both under validation in `.ci/test`.
#[test]
fn perplexity_in_the_gpu_form_matches_the_cpu_form() {
    if model_support::model_path().is_none() || vk_support::device().is_none() {
        return;
    }
    let chapter = std::fs::read_to_string("../../data/pride_and_prejudice_ch1.txt").unwrap();
    let cut = (0..=200)
        .rev()
        .find(|&i| chapter.is_char_boundary(i))
        .unwrap();
    let dir = std::env::temp_dir().join(format!("xtc-ppl-form-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("opening.txt");
    std::fs::write(&path, &chapter[..cut]).unwrap();
    let nll = |form: &str| {
        let o = xtc(&[
            "perplexity",
            "--json",
            "--kernels",
            form,
            path.to_str().unwrap(),
        ]);
        assert_eq!(o.status.code(), Some(0), "{form}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert!(v["scored"].as_u64().unwrap() > 20, "{v}");
        v["mean_nll"].as_f64().unwrap()
    };
    let (gpu, cpu) = (nll("gpu"), nll("cpu"));
    eprintln!("mean NLL: GPU form {gpu:.6}, CPU form {cpu:.6}");
    assert!((gpu - cpu).abs() < 1e-3, "GPU form {gpu} vs CPU form {cpu}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn perplexity_of_austen_is_far_below_uniform() {
    if model_support::model_path().is_none() {
        return;
    }
    let o = xtc(&[
        "perplexity",
        "--json",
        "../../data/pride_and_prejudice_ch1.txt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let nll = v["mean_nll"].as_f64().unwrap();
    let uniform = v["uniform_nll"].as_f64().unwrap();
    eprintln!(
        "mean NLL {nll:.4} nats/token over {} tokens (uniform {uniform:.4})",
        v["scored"]
    );
    assert!((uniform - 49152f64.ln()).abs() < 1e-9);
    assert!(
        nll < 0.5 * uniform,
        "mean NLL {nll} is not far below a uniform guess {uniform}"
    );
    assert!(nll > 0.5, "mean NLL {nll} is implausibly low");
    assert!(v["scored"].as_u64().unwrap() > 300);
    // The default device is the Vulkan one (lavapipe in CI); the CPU
    // reference scores the same text within the kernels' tolerance.
    if vk_support::device().is_some() {
        assert!(
            v["device"].as_str().unwrap().contains("Vulkan"),
            "{}",
            v["device"]
        );
        let o = xtc(&[
            "perplexity",
            "--json",
            "--device",
            "cpu",
            "../../data/pride_and_prejudice_ch1.txt",
        ]);
        assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
        let c: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(c["device"], "CPU reference");
        let cpu = c["mean_nll"].as_f64().unwrap();
        assert!((cpu - nll).abs() < 1e-3, "CPU {cpu} vs Vulkan {nll}");
    }
    // The text report names the figure too.
    let o = xtc(&[
        "perplexity",
        "--ctx",
        "128",
        "../../data/pride_and_prejudice_ch1.txt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("mean NLL") && text(&o.stdout).contains("4 window(s)"),
        "{}",
        text(&o.stdout)
    );
}

// ---- errors (no model needed) ----------------------------------------

#[test]
fn devices_that_run_no_model_are_usage_errors_and_unknown_ones_errors() {
    for cmd in [
        &["generate", "--device", "toy", "hi"][..],
        &["perplexity", "--device", "", "x.txt"],
    ] {
        let o = xtc(cmd);
        assert_eq!(o.status.code(), Some(2), "{cmd:?}");
        assert!(text(&o.stderr).contains("--device"), "{}", text(&o.stderr));
    }
    if model_support::model_path().is_none() {
        return;
    }
    let o = xtc(&["generate", "--device", "no-such-gpu-name", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("--device no-such-gpu-name") && err.contains("xtc probe"),
        "{err}"
    );
    // Only the words generate takes: `toy` runs no model.
    assert!(
        err.contains("`auto`, `cpu`;") && !err.contains("`toy`"),
        "{err}"
    );
}

#[test]
fn a_missing_model_names_the_fetch_script() {
    let o = xtc(&["generate", "--model", "/nonexistent/model.gguf", "hi"]);
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.contains("/nonexistent/model.gguf") && err.contains("scripts/fetch-model.sh"),
        "{err}"
    );
}

#[test]
fn a_file_that_is_not_gguf_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("not.gguf");
    std::fs::write(&p, b"PK\x03\x04 this is a zip, not a model").unwrap();
    let o = xtc(&["generate", "--model", p.to_str().unwrap(), "hi"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("not a GGUF file"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn bad_option_values_are_usage_errors() {
    for args in [
        &["generate", "--top-p", "0", "hi"][..],
        &["generate", "--temperature", "-1", "hi"],
        &["generate", "--min-p", "2", "hi"],
        &["generate", "--threads", "0", "hi"],
        &["perplexity", "--ctx", "1", "x.txt"],
        &["generate", "--raw", "--system", "s", "hi"],
    ] {
        let o = xtc(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
    }
}

#[test]
fn perplexity_refuses_unreadable_and_non_utf8_files() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("latin1.txt");
    std::fs::write(&p, b"caf\xe9").unwrap();
    let o = xtc(&["perplexity", p.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("not UTF-8"), "{}", text(&o.stderr));
    let o = xtc(&["perplexity", "/nonexistent.txt"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        text(&o.stderr).contains("/nonexistent.txt"),
        "{}",
        text(&o.stderr)
    );
}

/// `xtc generate -` reads the question from standard input (a pipe), with
/// the answer of the same question given as an argument.
#[test]
fn generate_reads_a_dash_prompt_from_stdin() {
    if model_support::model_path().is_none() {
        return;
    }
    use std::io::Write as _;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["generate", "--device", "cpu", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\n")
        .unwrap();
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "The capital of France is Paris.");
}

/// Issue 22: `xtc generate` with a 9,010-token prompt prefilled 8,192
/// positions on the CPU reference (about 90 s) and then failed. A prompt
/// that with `--max-tokens` needs more positions than the context length
/// is now a usage error (exit 2) naming the lengths, before the model runs:
/// no "loaded" line, no prefill figures on stderr (and it takes a second,
/// not minutes).
#[test]
fn a_prompt_past_the_context_is_refused_before_any_prefill() {
    let Some((_, tok)) = model_support::model() else {
        return;
    };
    let run = |device: &str, max_tokens: &str, words: usize| {
        let prompt = " word".repeat(words);
        let n = tok.encode_with_specials(&prompt).len();
        let o = xtc(&[
            "generate",
            "--device",
            device,
            "--raw",
            "--max-tokens",
            max_tokens,
            &prompt,
        ]);
        (o, n)
    };
    // The prompt alone is past the model's 8,192 positions.
    let (o, n) = run("cpu", "256", 9010);
    assert!(n > 8192, "{n} tokens");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let need = n + 255;
    assert!(
        err.contains(&format!(
            "{n} prompt tokens + --max-tokens 256 need {need} positions, but the context \
             length is 8192; shorten the prompt"
        )),
        "{err}"
    );
    assert!(
        !err.contains("loaded in") && !err.contains("prefill"),
        "{err}"
    );
    assert!(o.stdout.is_empty());
    // The prompt fits, prompt + --max-tokens does not: the message says
    // how far to lower --max-tokens.
    let (o, n) = run("cpu", "300", 8000);
    assert!(n < 8192 && n + 299 > 8192, "{n} tokens");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "lower --max-tokens to at most {} or shorten the prompt",
            8192 - n + 1
        )),
        "{err}"
    );
    assert!(
        !err.contains("loaded in") && !err.contains("prefill"),
        "{err}"
    );
    // On lavapipe the device holds 1,536 positions of this model.
    if vk_support::device().is_some_and(|d| d.info().kind == xtc_vk::DeviceKind::Cpu) {
        let (o, n) = run("auto", "256", 2000);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains(&format!("{n} prompt tokens"))
                && err.contains("the context length is 1536 on a CPU-kind Vulkan device"),
            "{err}"
        );
        assert!(!err.contains("loaded in"), "{err}");
    }
}
