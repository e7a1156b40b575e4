//! The child-process protocol: the runner re-executes its own binary as
//! `xtc ci child --device D --seed S`, writes the group's case names to its
//! stdin (one a line), and reads [`Event`]s back from its stdout, one JSON
//! object a line after the [`PREFIX`] (any other stdout line, e.g. a stray
//! print of library code, is ignored). The child's stderr is kept as the
//! group's log.
//!
//! The child reports `Start` before a case runs and `End` after it; a case
//! with a `Start` and no `End` when the child dies is `Crash`, or `Timeout`
//! when the runner killed it. A child that exits 0 has run every case it was
//! going to: the names it never started are `Missing`. A child that exits
//! [`EXIT_RESPAWN`] stopped on purpose after a case (device lost): its other
//! cases continue in a fresh child, as after a crash.

use std::io::{BufRead, Write};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Mutex;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use super::case::{CaseError, Ctx, DeviceId, Outcome, Record};
use super::registry;
use super::status::Status;
use xtc_model::vulkan::ops::Variant;

/// Marks the protocol's lines on the child's stdout.
pub const PREFIX: &str = "@xtc-ci ";

/// Exit status of a child that stopped on purpose (device lost) and wants
/// its remaining cases run in a fresh child.
pub const EXIT_RESPAWN: i32 = 75;

/// One message from the child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Event {
    /// The device the child opened (sent once, when a case first opens it).
    Device(DeviceId),
    /// A case is about to run.
    Start {
        /// Its name.
        case: String,
    },
    /// A case ended.
    End {
        /// Its name.
        case: String,
        /// `Pass`, `Fail`, `Skip`, `Crash` (device lost) or
        /// `UnexpectedImprovement`.
        status: Status,
        /// Why; figures.
        message: String,
        /// Seconds the body ran.
        duration_s: f64,
        /// A figure or tokens for the runner's baselines.
        record: Option<Record>,
    },
}

impl Event {
    /// The event as one protocol line (with [`PREFIX`], no newline).
    pub fn to_line(&self) -> String {
        let json = serde_json::to_string(self).expect("events serialize");
        format!("{PREFIX}{json}")
    }

    /// Parses a protocol line; `None` for any other line.
    pub fn from_line(line: &str) -> Option<Event> {
        serde_json::from_str(line.strip_prefix(PREFIX)?.trim_end()).ok()
    }
}

/// The last panic's message and location, captured by the child's panic
/// hook so a panicking case reports where it failed.
static PANIC_NOTE: Mutex<Option<String>> = Mutex::new(None);

/// The body of `xtc ci child`: runs the cases named on `input` (one a line)
/// in order in this process (`form`: `--kernels` for the cases that pin no
/// kernel form, [`Ctx::kernel_form`]; `timeout`: the runner's `--timeout`
/// per case, [`Ctx::timeout`]), writing [`Event`]s to `out`. Returns the exit
/// status (0, or [`EXIT_RESPAWN`] after a device loss).
pub fn child_main(
    selector: &str,
    seed: u64,
    form: Option<Variant>,
    timeout: Option<std::time::Duration>,
    input: &mut dyn BufRead,
    out: &mut dyn Write,
) -> i32 {
    let names: Vec<String> = input
        .lines()
        .map_while(Result::ok)
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();
    let all = registry::all_cases();
    // Validation errors fail the case they came in (`with_validation`),
    // not the child's exit status, which the runner reads as a crash.
    xtc_vk::fail_process_on_validation_errors(false);
    let ci = std::env::var_os("CI").is_some();
    let mut ctx = Ctx::new(selector, seed, ci)
        .with_kernel_form(form)
        .with_timeout(timeout);
    let default_hook = panic::take_hook();
    panic::set_hook(Box::new(move |info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => (*s).to_owned(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".into()),
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        *PANIC_NOTE.lock().unwrap_or_else(|p| p.into_inner()) =
            Some(format!("panicked{at}: {msg}"));
        default_hook(info);
    }));
    let mut sent_device = false;
    let emit = |out: &mut dyn Write, e: &Event| {
        // A parent gone away (broken pipe) ends the child at its next write.
        if writeln!(out, "{}", e.to_line())
            .and_then(|_| out.flush())
            .is_err()
        {
            std::process::exit(EXIT_RESPAWN);
        }
    };
    for name in &names {
        // A name this binary does not know is never started: `Missing`.
        let Some(case) = all.iter().find(|c| &c.name == name) else {
            continue;
        };
        emit(out, &Event::Start { case: name.clone() });
        ctx.begin_case(name);
        let t0 = Instant::now();
        let validation_before = xtc_vk::validation_errors();
        let result = panic::catch_unwind(AssertUnwindSafe(|| (case.run)(&mut ctx)));
        let duration_s = t0.elapsed().as_secs_f64();
        if !sent_device && let Some(id) = &ctx.opened {
            emit(out, &Event::Device(id.clone()));
            sent_device = true;
        }
        let (outcome, respawn) = match result {
            Ok(Ok(o)) => (o, false),
            Ok(Err(CaseError::Fail(m))) => (Outcome::fail(m), false),
            Ok(Err(CaseError::Skip(m))) => (Outcome::skip(m), false),
            Ok(Err(CaseError::DeviceLost(m))) => (
                Outcome {
                    status: Status::Crash,
                    ..Outcome::fail(format!("device lost: {m}"))
                },
                true,
            ),
            Err(_) => {
                let note = PANIC_NOTE
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take()
                    .unwrap_or_else(|| "panicked".into());
                (Outcome::fail(note), false)
            }
        };
        let errors = xtc_vk::validation_errors().saturating_sub(validation_before);
        let outcome = with_validation(outcome, errors, xtc_vk::last_validation_error);
        let then_exit = outcome.then_exit;
        emit(
            out,
            &Event::End {
                case: name.clone(),
                status: outcome.status,
                message: outcome.message,
                duration_s,
                record: outcome.record,
            },
        );
        if respawn {
            return EXIT_RESPAWN;
        }
        if let Some(code) = then_exit {
            std::process::exit(code);
        }
    }
    0
}

/// `outcome`, failed when the Vulkan validation layer reported `errors`
/// while the case ran (a case that misused Vulkan does not pass or skip,
/// whatever it checked); the message names the count and the `last` error.
fn with_validation(
    outcome: Outcome,
    errors: u64,
    last: impl FnOnce() -> Option<String>,
) -> Outcome {
    if errors == 0 {
        return outcome;
    }
    let last = last().unwrap_or_default();
    let note = format!("{errors} Vulkan validation error(s), the last: {last}");
    match outcome.status {
        Status::Pass | Status::Skip | Status::UnexpectedImprovement => Outcome {
            status: Status::Fail,
            message: note,
            record: None,
            ..outcome
        },
        _ => Outcome {
            message: format!("{}; {note}", outcome.message),
            ..outcome
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_case_that_raised_validation_errors_fails() {
        let hazard = || Some("SYNC-HAZARD-WRITE-AFTER-WRITE".to_owned());
        let clean = with_validation(Outcome::pass(), 0, hazard);
        assert_eq!(clean.status, Status::Pass);
        for o in [Outcome::pass(), Outcome::skip("no fd export")] {
            let o = with_validation(o, 2, hazard);
            assert_eq!(o.status, Status::Fail);
            assert!(
                o.message.starts_with("2 Vulkan validation error(s)"),
                "{}",
                o.message
            );
            assert!(o.message.contains("SYNC-HAZARD"), "{}", o.message);
        }
        let failed = with_validation(Outcome::fail("NMSE 0.3"), 1, hazard);
        assert_eq!(failed.status, Status::Fail);
        assert!(
            failed.message.starts_with("NMSE 0.3; 1 Vulkan"),
            "{}",
            failed.message
        );
    }

    #[test]
    fn events_round_trip_through_lines() {
        let e = Event::End {
            case: "xtc.selftest.pass".into(),
            status: Status::Pass,
            message: "a \"quoted\"\nline".into(),
            duration_s: 0.25,
            record: Some(Record::Golden(vec![1, 2, 3])),
        };
        let line = e.to_line();
        assert!(!line.contains('\n'));
        assert_eq!(Event::from_line(&line), Some(e));
        assert_eq!(Event::from_line("stray output"), None);
        assert_eq!(Event::from_line("@xtc-ci {broken"), None);
    }
}
