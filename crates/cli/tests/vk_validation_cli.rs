//! `XTC_VK_VALIDATION` through the `xtc` binary: a value it does not know is
//! an error naming the variable, and validation asked for without the layer
//! installed fails instead of running unvalidated. The variable is set for the
//! child alone. Needs the layer (`.ci/ensure-deps.sh` installs
//! `vulkan-validationlayers`).

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

#[test]
fn a_bad_xtc_vk_validation_value_is_an_error() {
    if vk_support::device().is_none() {
        return;
    }
    // Through the binary, where the variable is set for the child alone.
    let err = decode_fails_with(&[("XTC_VK_VALIDATION", "yes please".as_ref())]);
    assert!(err.contains("XTC_VK_VALIDATION"), "{err}");
}

#[test]
fn validation_requested_without_the_layer_fails_instead_of_running_without() {
    if vk_support::device().is_none() {
        return;
    }
    // An empty layer search path hides the installed layer from the loader.
    let empty = tempfile::tempdir().unwrap();
    let err = decode_fails_with(&[
        ("XTC_VK_VALIDATION", "1".as_ref()),
        ("VK_LAYER_PATH", empty.path().as_os_str()),
    ]);
    assert!(err.contains("not installed"), "{err}");
}

/// Runs a one-request `xtc decode` of the synthetic model on the default
/// Vulkan device with `env` added; asserts it exits 1 and returns its stderr.
fn decode_fails_with(env: &[(&str, &std::ffi::OsStr)]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args([
            "decode",
            "--synthetic",
            "--requests",
            "1",
            "--time-scale",
            "10000",
        ])
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{err}");
    err
}
