//! `xtc decode` on the real model (SmolLM2-135M-Instruct Q4_1, its default)
//! through the binary: real-text prompts, the banner's model line (EOS
//! ignored), three sample completions in the report and in `--json`, every
//! request running to its trace output length, and the options as on the
//! synthetic model (`--compare`, `--cancel-rate`, `--trace-out`,
//! `--token-budget`, `--max-active`, the default `--kv-blocks` from the real
//! model's KV geometry), on the CPU reference and on the Vulkan device
//! (lavapipe), and `--sweep`'s defaults for the model on a CPU device.
//! Needs the model file (and Vulkan for the default device); with `CI` set
//! a missing one fails.

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::process::Command;

fn xtc(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("decode")
        .args(args)
        .output()
        .expect("run xtc");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A short burst: 6 requests arriving at once.
const SHORT: [&str; 4] = ["--requests", "6", "--time-scale", "100000"];

#[test]
fn the_default_model_serves_real_text_and_prints_samples_on_both_devices() {
    if model_support::model_path().is_none() {
        return;
    }
    let vulkan = vk_support::device().is_some();
    for device in ["cpu", "auto"] {
        if device == "auto" && !vulkan {
            continue;
        }
        let (code, out, err) = xtc(&[&SHORT[..], &["--device", device]].concat());
        assert_eq!(code, 0, "--device {device}: {err}");
        assert!(
            err.contains("SmolLM2-135M-Instruct")
                && err.contains("Pride and Prejudice")
                && err.contains("EOS ignored")
                && err.contains("lengths: prompts /32"),
            "--device {device}: {err}"
        );
        if device == "auto" {
            assert!(err.contains("Vulkan"), "{err}");
        }
        assert!(out.contains("requests        6 (6 done"), "{out}");
        assert!(out.contains("sample completions"), "{out}");
        assert_eq!(out.matches("  request ").count(), 3, "{out}");
    }
    // JSON: the samples as text; every request ran to its output length
    // (EOS ignored), so the generated count is the scaled trace's.
    let (code, out, err) = xtc(&[&SHORT[..], &["--device", "cpu", "--json"]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let samples = v["samples"].as_array().unwrap();
    assert_eq!(samples.len(), 3);
    for s in samples {
        assert!(!s["completion"].as_str().unwrap().is_empty(), "{s}");
        assert!(s["generated_tokens"].as_u64().unwrap() >= 1);
    }
    let (_, out_syn, _) = xtc(&[&SHORT[..], &["--device", "toy", "--json"]].concat());
    let syn: serde_json::Value = serde_json::from_str(&out_syn).unwrap();
    assert_eq!(
        v["tokens"]["generated"], syn["tokens"]["generated"],
        "the same scaled lengths as the toy run: EOS never ends a request early"
    );
    assert_eq!(syn["samples"].as_array().unwrap().len(), 0);
}

#[test]
fn options_work_on_the_real_model() {
    if model_support::model_path().is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.json");
    let t = trace.to_str().unwrap();
    let (code, out, err) = xtc(&[
        &SHORT[..],
        &[
            "--device",
            "cpu",
            "--compare",
            "--cancel-rate",
            "0.5",
            "--token-budget",
            "9",
            "--max-active",
            "3",
            "--trace-out",
            t,
        ],
    ]
    .concat());
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("continuous vs one-at-a-time") && out.contains("sample completions"),
        "{out}"
    );
    // The default KV cache: max-active 3 requests of the longest scaled
    // length, in blocks of 16 (the banner names it).
    assert!(
        err.contains("max-active 3, KV cache") && err.contains("token budget 9"),
        "{err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(v["traceEvents"].as_array().unwrap().len() > 6, "{v}");
    // --kv-blocks too small for a request: rejected, exit 3.
    let (code, _, err) = xtc(&[&SHORT[..], &["--device", "cpu", "--kv-blocks", "2"]].concat());
    assert_eq!(code, 3, "{err}");
}

#[test]
fn model_flags_are_checked() {
    let (code, _, err) = xtc(&["--synthetic", "--model", "x.gguf"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--synthetic") && err.contains("--model"),
        "{err}"
    );
    let (code, _, err) = xtc(&["--model", "/nonexistent/m.gguf", "--device", "cpu"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("/nonexistent/m.gguf") && err.contains("scripts/fetch-model.sh"),
        "{err}"
    );
    if let Some(p) = model_support::model_path() {
        let (code, _, err) = xtc(&[
            "--model",
            p.to_str().unwrap(),
            "--tokenizer",
            "tok.bin",
            "--device",
            "cpu",
        ]);
        assert_eq!(code, 1, "{err}");
        assert!(err.contains("GGUF model carries its own"), "{err}");
    }
}

/// `--sweep` alone on the GGUF model over a CPU device (here the toy
/// replaying a cost, which uses the model's lengths) takes the model's
/// defaults (`MODEL_CPU_SWEEP`): 24 requests, TTFT <= 10 s, TPOT <= 500 ms
/// and 48 token rows an iteration, the largest budget whose calibrated
/// iteration stays well within that TPOT on lavapipe; `--token-budget`,
/// `--requests` and the SLO flags override them.
#[test]
fn a_sweep_of_the_model_on_a_cpu_device_takes_the_models_defaults() {
    let Some(p) = model_support::model_path() else {
        return;
    };
    let base = [
        "--device",
        "toy",
        "--model",
        p.to_str().unwrap(),
        "--toy-cost",
        "0,0",
        "--sweep",
        "100000",
        "--json",
    ];
    let given = [
        "--token-budget",
        "20",
        "--requests",
        "5",
        "--slo-ttft",
        "3000",
        "--slo-tpot",
        "200",
    ];
    for (extra, (requests, budget, ttft, tpot)) in [
        (&[][..], (24, 48, 10_000.0, 500.0)),
        (&given[..], (5, 20, 3_000.0, 200.0)),
    ] {
        let (code, out, err) = xtc(&[&base[..], extra].concat());
        assert_eq!(code, 0, "{extra:?}: {err}");
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let c = &v["config"];
        assert_eq!(c["requests"], requests, "{extra:?}: {c}");
        assert_eq!(c["token_budget_tokens"], budget, "{extra:?}: {c}");
        assert_eq!(c["slo"]["ttft_ms"], ttft, "{extra:?}: {c}");
        assert_eq!(c["slo"]["tpot_ms"], tpot, "{extra:?}: {c}");
    }
}
