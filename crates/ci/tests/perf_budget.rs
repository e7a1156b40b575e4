//! The real model's perf case measures within the runner's `--timeout`
//! (`Ctx::timeout`, passed to `xtc ci child --timeout-ms`): where not even one
//! timed iteration fits in what is left (here a 1 ms timeout) it is a
//! `Skip` that names the iteration's cost and `--timeout`, not a case the
//! runner kills; with room it records the median iteration. Needs the model
//! file (`model_support::model_path`) and a Vulkan device (lavapipe in
//! CI); with `CI` set a missing one fails.

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;
#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::time::Duration;

use xtc_ci::case::{CaseError, Ctx, Record};
use xtc_ci::registry::all_cases;

const CASE: &str = "xtc.perf.decode_iter_smollm2.b1";

fn run(timeout: Duration) -> Result<xtc_ci::case::Outcome, CaseError> {
    let case = all_cases()
        .into_iter()
        .find(|c| c.name == CASE)
        .expect("the case is registered");
    let ci = std::env::var_os("CI").is_some();
    let mut ctx = Ctx::new("auto", 7, ci).with_timeout(Some(timeout));
    ctx.begin_case(CASE);
    (case.run)(&mut ctx)
}

#[test]
fn the_perf_case_skips_when_no_iteration_fits_and_measures_when_one_does() {
    if model_support::model_path().is_none() || vk_support::device().is_none() {
        return;
    }
    match run(Duration::from_millis(1)) {
        Err(CaseError::Skip(why)) => {
            assert!(
                why.contains("one iteration of 1 members took")
                    && why.contains("--timeout 0 s")
                    && why.contains("raise --timeout"),
                "{why}"
            );
        }
        Err(CaseError::Fail(e)) if e.contains("no Vulkan") || e.contains("device") => {
            panic!("{e}")
        }
        other => panic!("expected a Skip, got {other:?}"),
    }
    let out = run(Duration::from_secs(600)).expect("measured");
    match out.record {
        Some(Record::Perf(m)) => {
            assert_eq!(m.unit, "ms");
            assert!(m.value > 0.0 && m.value.is_finite(), "{m:?}");
            assert!(out.message.contains("median of 9"), "{}", out.message);
        }
        other => panic!("expected a perf record, got {other:?}"),
    }
}
