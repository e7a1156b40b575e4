//! The import rule of `xtc-kvbatch` (`src/lib.rs`): the serving core never
//! names Vulkan, the accelerator nodes, the NPU dispatch layer or the crates
//! above it, and reaches a model only through the join of `xtc_model`
//! (`Model`, `Completion`, `BatchPlan`, `SeqWork`, `Config`,
//! `DeviceError`), never the model's internals.

use std::path::Path;

use xtc_testkit::layout::{check, check_items};

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_serving_core_imports_no_device_and_nothing_above_it() {
    check(&src(), &["vk", "accel", "dispatch", "replay", "serve"]);
}

#[test]
fn the_serving_core_reaches_a_model_only_through_the_join() {
    let join = [
        "Model",
        "Completion",
        "BatchPlan",
        "SeqWork",
        "Config",
        "DeviceError",
    ];
    check_items(&src(), "xtc_model", &join);
}
