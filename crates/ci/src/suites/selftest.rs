//! `xtc.selftest.*`: the runner's own test cases, each misbehaving in one
//! way on purpose (hidden: never part of `--suite all`; run by
//! `crates/cli/tests/ci_runner.rs` with `--suite selftest`).
//!
//! - `crash.abort` aborts the child (`Crash`), `crash.after` then passes in
//!   a fresh child;
//! - `hang.sleep` never returns (`Timeout` under a short `--timeout`),
//!   `hang.after` then passes;
//! - `flaky.first_run` fails the first time it runs in a run and passes the
//!   second (`Flake`): it keeps a marker file in `XTC_CI_SELFTEST_DIR`;
//! - `fail.always` fails (`Fail`, or `ExpectedFail` with a baseline);
//! - `pass.always` passes (`UnexpectedImprovement` when a baseline lists
//!   it as failing);
//! - `stop.early` passes, then its child exits 0 without running the rest
//!   of its group: `stop.missing` is `Missing`;
//! - `panic.assert` panics (`Fail`, with the panic's message and place);
//! - `record.perf` reports a fixed figure (100 us) and `record.golden` fixed
//!   tokens (`[1, 2, 3]`), judged against `--perf-baseline` / `--golden`
//!   under the key of "no device" ([`crate::runner::NO_DEVICE`]).

use std::time::Duration;

use crate::case::{Case, CaseError, Measure, Outcome, Record, Suite};

/// Registers the suite's cases.
pub fn cases(v: &mut Vec<Case>) {
    let s = Suite::Selftest;
    v.push(Case::new(s, "xtc.selftest.crash.abort", |_| {
        std::process::abort()
    }));
    v.push(Case::new(s, "xtc.selftest.crash.after", |_| {
        Ok(Outcome::pass())
    }));
    v.push(Case::new(s, "xtc.selftest.hang.sleep", |_| {
        loop {
            std::thread::sleep(Duration::from_secs(3600));
        }
    }));
    v.push(Case::new(s, "xtc.selftest.hang.after", |_| {
        Ok(Outcome::pass())
    }));
    v.push(Case::new(s, "xtc.selftest.flaky.first_run", |_| {
        let dir = std::env::var_os("XTC_CI_SELFTEST_DIR")
            .ok_or_else(|| CaseError::Fail("XTC_CI_SELFTEST_DIR is not set".into()))?;
        let marker = std::path::Path::new(&dir).join("flaky.first_run");
        if marker.exists() {
            Ok(Outcome::pass())
        } else {
            std::fs::write(&marker, b"ran once\n")?;
            Ok(Outcome::fail("fails on its first run"))
        }
    }));
    v.push(Case::new(s, "xtc.selftest.fail.always", |_| {
        Ok(Outcome::fail("fails on purpose"))
    }));
    v.push(Case::new(s, "xtc.selftest.pass.always", |_| {
        Ok(Outcome::pass())
    }));
    v.push(Case::new(s, "xtc.selftest.stop.early", |_| {
        Ok(Outcome {
            then_exit: Some(0),
            ..Outcome::pass()
        })
    }));
    v.push(Case::new(s, "xtc.selftest.stop.missing", |_| {
        Ok(Outcome::pass())
    }));
    v.push(Case::new(s, "xtc.selftest.panic.assert", |_| {
        let answer = 41;
        assert_eq!(answer, 42, "the answer");
        Ok(Outcome::pass())
    }));
    v.push(Case::new(s, "xtc.selftest.record.perf", |_| {
        let m = Measure {
            value: 100.0,
            unit: "us".into(),
            higher_is_better: false,
        };
        Ok(Outcome::record(Record::Perf(m), "100 us"))
    }));
    v.push(Case::new(s, "xtc.selftest.record.golden", |_| {
        Ok(Outcome::record(Record::Golden(vec![1, 2, 3]), "3 tokens"))
    }));
}
