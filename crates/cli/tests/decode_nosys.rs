//! `xtc decode` from a build without the `sched-policy` feature: the batch
//! API answers `Nosys` (B-005), and the command must say that the binary
//! lacks the feature instead of a bare "not supported (XTC_E_NOSYS)". Run
//! with `CARGO_TARGET_DIR=target/nosys cargo test --release
//! --no-default-features --test decode_nosys` (its own target directory, so
//! `target/release/xtc` stays the default build).
#![cfg(not(feature = "sched-policy"))]

#[test]
fn decode_says_the_binary_lacks_sched_policy() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["decode", "--device", "toy", "--requests", "2"])
        .args(["--time-scale", "10000"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("XTC_E_NOSYS"), "{err}");
    assert!(
        err.contains("built without the `sched-policy` feature"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "no report for a run that never ran");
}
