//! The crate's examples run as tests (each file's `main`, included here):
//! an example that stops working fails CI instead of misleading a reader.

#[path = "../examples/cross_loop.rs"]
mod cross_loop;

#[test]
fn cross_loop_runs() {
    cross_loop::main().unwrap();
}
