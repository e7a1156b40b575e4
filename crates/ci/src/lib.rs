//! `ci`: the device-in-the-loop CI runner behind `xtc ci run` (issue 15).
//!
//! Built as the runners of the field work: Mesa's deqp-runner (cases in
//! groups inside child processes, `Crash`/`Timeout`/`Missing` told apart, a
//! group with an unexpected result rerun once to tell flakes, skip and flake
//! regex lists, a `name,Status` baseline whose matches are `ExpectedFail`,
//! `results.csv` / `failures.csv`, `--fraction`) and llama.cpp's
//! test-backend-ops (every kernel against a CPU reference on seeded random
//! inputs, normalized mean squared error under a per-kernel threshold, NaN
//! and Inf checks, sentinels around outputs, a perf mode reporting GFLOP/s).
//!
//! # Pieces
//! - [`status`]: [`Status`] (`Pass`, `Fail`, `Skip`, `Crash`, `Timeout`,
//!   `Missing`, `Flake`, `KnownFlake`, `ExpectedFail`,
//!   `UnexpectedImprovement`), [`Status::with_baseline`], [`Counts`] and the
//!   exit statuses (0 as expected, 1 regression, 2 only improvements, 3 the
//!   run could not start).
//! - [`case`]: a [`Case`] is a stable dotted name (`xtc.<suite>.<...>`), a
//!   [`Suite`], a group (the first three name components unless set) and a
//!   body `Fn(&mut Ctx) -> Result<Outcome, CaseError>`. The [`Ctx`] opens
//!   the `--device` once per child and compiles the kernels once; each case
//!   gets its own seed (the run seed mixed with its name). A body returns an
//!   [`Outcome`] (`Pass`/`Fail`/`Skip`, optionally a [`Record`]: a perf
//!   [`Measure`] or golden tokens); any error converts into `Fail` with `?`;
//!   `VK_ERROR_DEVICE_LOST` makes the case `Crash` and moves the rest of the
//!   group to a fresh child.
//! - [`registry`]: every suite's cases in one list, and the selection of a
//!   run (`--suite`, `--include`, `--skips`, `--fraction`).
//! - [`protocol`]: the child side (`xtc ci child`): case names in on stdin,
//!   `Start`/`End`/`Device` events out on stdout.
//! - [`runner`]: the parent side: children, `--jobs` groups at once (the
//!   exclusive perf groups alone, after the rest), `--timeout`, crash and
//!   missing bookkeeping, records against `--perf-baseline` / `--golden`,
//!   the rerun, `--flakes` and `--baseline`.
//! - [`baseline`]: the baseline files; [`output`]: `results.csv`,
//!   `failures.csv`, `junit.xml`, `perf.json`, `golden.json`, `logs/`, the
//!   summary table and the closing line.
//! - [`rig`]: [`Rig`], the single-kernel bench shared with the `vk_*` tests;
//!   [`check`]: the comparisons of the kernels suite (NMSE, exact, NaN/Inf,
//!   guard regions).
//! - [`suites`]: the cases. `kernels` (every entry point of `kernels/*.wgsl`
//!   through `decode::model::vulkan::ops` / `qops`, against `decode::model::cpu::f32_model`
//!   / the `qops` references; a unit test fails when a kernel has no case),
//!   `fence`, `batch`, `dispatch`, `decode` (the synthetic model and
//!   SmolLM2), `perf`, and the hidden `selftest` (a crash, a hang, a flake, a failure,
//!   a pass listed as failing, a child that stops early) that the runner's
//!   own tests (`crates/cli/tests/ci_runner.rs`) run.
//!
//! # Adding cases
//! Each suite module has a `cases(&mut Vec<Case>)` function; a case is one
//! [`Case::new`] call there. The tables are built so the coming work is a
//! few lines each:
//! - **A quantized kernel** (`qmm_*`, `qembed_*`, `argmax_part`, `rope_*`):
//!   `suites::kernels::qkernels` (a child of the kernels suite) holds
//!   their table: one line per shape and form, each naming the entry point
//!   it must dispatch, against `decode::model::vulkan::qops`' references with the
//!   activation and KV buffers guarded; the unit test
//!   `every_kernel_entry_point_has_a_case` fails as soon as an entry point is
//!   in `kernels/` without a case. Names follow
//!   `xtc.kernels.<op>.<type>_<form>.<shape>`, e.g.
//!   `xtc.kernels.qmm.q4_1_r4.m9_n576_k1536`, `xtc.kernels.qembed.q8_0_img.v49152_d576_r9`.
//! - **The real model's golden tokens** (SmolLM2-135M Q4_1): `suites::smollm`
//!   (registered from `suites::decode::cases`): the golden, Vulkan-vs-reference
//!   and batched cases of three ChatML prompts, once per kernel form
//!   (`xtc.decode.smollm2_135m_q4_1.cpu.golden.p0`, `...gpu.golden.p0`, ...;
//!   `xtc ci run --kernels gpu|cpu` runs one form's; the model file absent
//!   is `Skip` outside CI, `Fail` in CI); `xtc ci run --write-baseline
//!   --golden F` records its tokens for the device. More f32 models are one
//!   entry in `suites::decode::MODELS`.
//! - **A perf figure**: a case in `suites::perf` returning
//!   `Outcome::record(Record::Perf(Measure { .. }), note)`; the runner
//!   compares it with `--perf-baseline` (keyed by device and driver) and
//!   `--write-baseline` stores it.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod baseline;
pub mod case;
pub mod check;
pub mod file_error;
pub mod output;
pub mod protocol;
pub mod registry;
pub mod rig;
pub mod runner;
pub mod status;
pub mod suites;
pub mod support;

pub use case::{
    Case, CaseError, CaseFn, CaseResult, Ctx, DeviceId, Measure, Outcome, Record, Suite, case_seed,
    ensure,
};
pub use file_error::FileError;
pub use rig::Rig;
pub use status::{Counts, Status};
