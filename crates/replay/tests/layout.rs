//! The import rule of `xtc-replay` (`src/lib.rs`): the benchmark drives a
//! model only through the join of `xtc_model` (and the iteration cost
//! model it calibrates, `xtc_model::cost`), never Vulkan, the accelerator
//! nodes or the NPU dispatch layer, and never the HTTP server.

use std::path::Path;

use xtc_testkit::layout::{check, check_items};

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn the_benchmark_imports_no_device_and_no_server() {
    check(&src(), &["vk", "accel", "dispatch", "serve"]);
}

#[test]
fn the_benchmark_reaches_a_model_only_through_the_join() {
    let allowed = [
        "Model",
        "Completion",
        "BatchPlan",
        "SeqWork",
        "Config",
        "DeviceError",
        "cost",
    ];
    check_items(&src(), "xtc_model", &allowed);
}
