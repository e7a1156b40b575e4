//! `XTC_ACTIVATIONS` through the binary on the real model and the Vulkan
//! device (lavapipe): `auto` runs the activations probe once, stores its
//! ratio under `$XDG_CACHE_HOME/xtc/activations-probe/`, and follows it (the
//! banner names `int8 activations` at or above 1.1, nothing below); a
//! stored ratio is used without measuring again; `int8` always takes int8
//! activations; an unknown value is refused with the variable and its
//! values named. Needs the model file and Vulkan; with `CI` set a missing
//! one fails.

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::path::{Path, PathBuf};
use std::process::Command;

/// `xtc decode` of 2 requests at once of `model` on the default device,
/// with `acts` as `XTC_ACTIVATIONS` and `cache` as `XDG_CACHE_HOME` (the
/// model is named, the cache no longer holding it): (exit code, stderr).
fn decode(model: &Path, acts: &str, cache: &Path) -> (i32, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .arg("decode")
        .arg("--model")
        .arg(model)
        .args([
            "--requests",
            "2",
            "--time-scale",
            "100000",
            "--device",
            "auto",
        ])
        .env("XTC_ACTIVATIONS", acts)
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("run xtc");
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// The one file in `dir` (the probe's cache), or a panic naming what is
/// there.
fn only_file(dir: &Path) -> PathBuf {
    let files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files.into_iter().next().unwrap()
}

#[test]
fn auto_measures_once_stores_the_ratio_and_follows_it() {
    let Some(model) = model_support::model_path() else {
        return;
    };
    if vk_support::device().is_none() {
        return;
    }
    let cache = std::env::temp_dir().join(format!("xtc-activations-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cache);
    std::fs::create_dir_all(&cache).unwrap();
    // First run: measured and stored.
    let (code, err) = decode(&model, "auto", &cache);
    assert_eq!(code, 0, "{err}");
    let file = only_file(&cache.join("xtc").join("activations-probe"));
    let name = file.file_name().unwrap().to_string_lossy().into_owned();
    // `<device key>-<kernel form>-<dot form>`.
    assert!(
        ["-cpu-", "-gpu-"].iter().any(|f| name.contains(f))
            && ["-native", "-poly", "-swar"]
                .iter()
                .any(|d| name.ends_with(d)),
        "{name}"
    );
    // The ratio's line, then `busy_load_per_cpu=` where the machine was busy
    // while it measured (the next process measures again).
    let text = std::fs::read_to_string(&file).unwrap();
    let ratio: f64 = text
        .lines()
        .next()
        .unwrap_or_default()
        .strip_prefix("f32_over_int8=")
        .unwrap_or_else(|| panic!("{text:?}"))
        .parse()
        .unwrap();
    assert!(ratio.is_finite() && ratio > 0.0, "{ratio}");
    assert_eq!(
        err.contains("int8 activations"),
        ratio >= 1.1,
        "{ratio}: {err}"
    );
    // A stored ratio decides without measuring: both ways.
    for (stored, int8) in [("5.0", true), ("0.5", false)] {
        std::fs::write(&file, format!("f32_over_int8={stored}\n")).unwrap();
        let (code, err) = decode(&model, "auto", &cache);
        assert_eq!(code, 0, "{err}");
        assert_eq!(err.contains("int8 activations"), int8, "{stored}: {err}");
        assert_eq!(
            std::fs::read_to_string(&file).unwrap(),
            format!("f32_over_int8={stored}\n"),
            "not measured again"
        );
    }
    // A ratio stored as measured on a busy machine: used by nobody else,
    // measured again (and stored again) by the next process.
    let planted = "f32_over_int8=5.0\nbusy_load_per_cpu=3.00\n";
    std::fs::write(&file, planted).unwrap();
    let (code, err) = decode(&model, "auto", &cache);
    assert_eq!(code, 0, "{err}");
    let again = std::fs::read_to_string(&file).unwrap();
    assert_ne!(again, planted, "measured again");
    assert!(again.starts_with("f32_over_int8="), "{again:?}");
    // `int8` does not ask the probe; `f32` never takes int8.
    let (code, err) = decode(&model, "int8", &cache);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("int8 activations"), "{err}");
    let (code, err) = decode(&model, "f32", &cache);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("int8"), "{err}");
    // An unknown value: refused, naming the variable and its values.
    let (code, err) = decode(&model, "int4", &cache);
    assert_ne!(code, 0, "{err}");
    assert!(
        err.contains("XTC_ACTIVATIONS") && err.contains("auto") && err.contains("int4"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&cache);
}
