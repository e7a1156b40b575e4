//! The crate's examples run as tests (each file's `main`, included here):
//! an example that stops working fails CI instead of misleading a reader.

#[path = "../examples/npu_dispatch.rs"]
mod npu_dispatch;

#[test]
fn npu_dispatch_runs() {
    npu_dispatch::main().unwrap();
}
