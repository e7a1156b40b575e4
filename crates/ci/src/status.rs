//! Case statuses, how a baseline and the flake list turn a raw status into the
//! reported one, and the exit status of a run (the statuses of Mesa's
//! deqp-runner, with `Timeout` and `Missing` kept apart from `Crash`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The status of one case.
///
/// A case itself reports `Pass`, `Fail`, `Skip` or (perf cases)
/// `UnexpectedImprovement`; the runner adds `Crash`, `Timeout` and `Missing`
/// from what it saw of the child process, then `Flake`, `KnownFlake`,
/// `ExpectedFail` and `UnexpectedImprovement` from the rerun, `--flakes` and
/// `--baseline` ([`Status::with_baseline`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Status {
    /// The case ran and every check held.
    Pass,
    /// A check did not hold (the message says which).
    Fail,
    /// The case cannot run here (a feature the device lacks, a missing
    /// input); never used for "the check did not hold".
    Skip,
    /// The child process died while the case ran (signal, abort, device lost).
    Crash,
    /// The case ran past `--timeout` and its child was killed.
    Timeout,
    /// The case never reported: its child stopped before starting it.
    Missing,
    /// The case's status changed when its group was rerun.
    Flake,
    /// A failure of a case that matches `--flakes`.
    KnownFlake,
    /// A failure the baseline lists with the same status.
    ExpectedFail,
    /// Better than expected: a pass the baseline lists as failing, or a perf
    /// figure beyond its tolerance on the good side.
    UnexpectedImprovement,
}

impl Status {
    /// Every status, in report order.
    pub const ALL: [Status; 10] = [
        Status::Pass,
        Status::Fail,
        Status::Skip,
        Status::Crash,
        Status::Timeout,
        Status::Missing,
        Status::Flake,
        Status::KnownFlake,
        Status::ExpectedFail,
        Status::UnexpectedImprovement,
    ];

    /// The status's name as written in `results.csv` and baselines.
    pub fn name(self) -> &'static str {
        match self {
            Status::Pass => "Pass",
            Status::Fail => "Fail",
            Status::Skip => "Skip",
            Status::Crash => "Crash",
            Status::Timeout => "Timeout",
            Status::Missing => "Missing",
            Status::Flake => "Flake",
            Status::KnownFlake => "KnownFlake",
            Status::ExpectedFail => "ExpectedFail",
            Status::UnexpectedImprovement => "UnexpectedImprovement",
        }
    }

    /// A raw failure: `Fail`, `Crash`, `Timeout` or `Missing`.
    pub fn is_failure(self) -> bool {
        matches!(
            self,
            Status::Fail | Status::Crash | Status::Timeout | Status::Missing
        )
    }

    /// A regression: a failure that neither the baseline nor the flake list
    /// accounts for. Any regression makes the run exit 1.
    pub fn is_regression(self) -> bool {
        self.is_failure()
    }

    /// Not what the baseline says: a regression or an improvement. These are
    /// the lines of `failures.csv` and the statuses that get a group rerun.
    pub fn is_unexpected(self) -> bool {
        self.is_regression() || self == Status::UnexpectedImprovement
    }

    /// The reported status of a case whose raw status is `self`, given the
    /// status the baseline lists for it (`None`: not listed, i.e. expected to
    /// pass). A listed case that fails the same way is `ExpectedFail`; one that
    /// passes is `UnexpectedImprovement`; one that fails another way keeps its
    /// new status (a regression: the baseline no longer describes it). Skips
    /// and the statuses the runner already resolved are left alone.
    pub fn with_baseline(self, listed: Option<Status>) -> Status {
        match (self, listed) {
            (s, None) => s,
            (Status::Pass, Some(l)) if l.is_failure() => Status::UnexpectedImprovement,
            (s, Some(l)) if s.is_failure() && s == l => Status::ExpectedFail,
            (s, _) => s,
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A status name that is not one of [`Status::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown status {0:?} (expected one of Pass, Fail, Skip, Crash, Timeout, Missing, Flake, KnownFlake, ExpectedFail, UnexpectedImprovement)"
)]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Status, UnknownStatus> {
        Status::ALL
            .into_iter()
            .find(|st| st.name() == s.trim())
            .ok_or_else(|| UnknownStatus(s.trim().to_owned()))
    }
}

/// How many cases ended in each group of statuses, and the exit status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    /// `Pass`.
    pub passed: usize,
    /// Regressions: `Fail`, `Crash`, `Timeout`, `Missing`.
    pub failed: usize,
    /// `Skip`.
    pub skipped: usize,
    /// `Flake` and `KnownFlake`.
    pub flaky: usize,
    /// `ExpectedFail`.
    pub expected_failures: usize,
    /// `UnexpectedImprovement`.
    pub improvements: usize,
}

/// Exit status: every result as expected (flakes and expected failures
/// included).
pub const EXIT_OK: i32 = 0;
/// Exit status: at least one regression (`Fail`, `Crash`, `Timeout`,
/// `Missing` not in the baseline), or `CI` set and no device.
pub const EXIT_REGRESSION: i32 = 1;
/// Exit status: no regression, but improvements (refresh the baseline).
pub const EXIT_IMPROVEMENT: i32 = 2;
/// Exit status: the run could not start (bad option, unreadable baseline,
/// unwritable output folder).
pub const EXIT_USAGE: i32 = 3;

impl Counts {
    /// Counts `statuses`.
    pub fn of(statuses: impl IntoIterator<Item = Status>) -> Counts {
        let mut c = Counts::default();
        for s in statuses {
            match s {
                Status::Pass => c.passed += 1,
                Status::Skip => c.skipped += 1,
                Status::Flake | Status::KnownFlake => c.flaky += 1,
                Status::ExpectedFail => c.expected_failures += 1,
                Status::UnexpectedImprovement => c.improvements += 1,
                Status::Fail | Status::Crash | Status::Timeout | Status::Missing => c.failed += 1,
            }
        }
        c
    }

    /// [`EXIT_REGRESSION`] on any regression, else [`EXIT_IMPROVEMENT`] on
    /// any improvement, else [`EXIT_OK`].
    pub fn exit_code(&self) -> i32 {
        if self.failed > 0 {
            EXIT_REGRESSION
        } else if self.improvements > 0 {
            EXIT_IMPROVEMENT
        } else {
            EXIT_OK
        }
    }

    /// The closing line: `N passed, N failed, N skipped` (the plain form CI
    /// log readers look for; flakes, expected failures and improvements are
    /// on [`Counts::detail_line`]).
    pub fn closing_line(&self) -> String {
        format!(
            "{} passed, {} failed, {} skipped",
            self.passed, self.failed, self.skipped
        )
    }

    /// The statuses counted apart from the closing line.
    pub fn detail_line(&self) -> String {
        format!(
            "{} flaky, {} expected failures, {} unexpected improvements",
            self.flaky, self.expected_failures, self.improvements
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in Status::ALL {
            assert_eq!(s.name().parse::<Status>(), Ok(s));
        }
        assert!("pass".parse::<Status>().is_err());
    }

    #[test]
    fn baseline_turns_failures_into_expected_and_passes_into_improvements() {
        use Status::*;
        assert_eq!(Fail.with_baseline(None), Fail);
        assert_eq!(Fail.with_baseline(Some(Fail)), ExpectedFail);
        assert_eq!(Crash.with_baseline(Some(Crash)), ExpectedFail);
        assert_eq!(Crash.with_baseline(Some(Fail)), Crash);
        assert_eq!(Pass.with_baseline(Some(Fail)), UnexpectedImprovement);
        assert_eq!(Pass.with_baseline(Some(Timeout)), UnexpectedImprovement);
        assert_eq!(Skip.with_baseline(Some(Fail)), Skip);
        assert_eq!(Flake.with_baseline(Some(Fail)), Flake);
    }

    #[test]
    fn exit_codes_rank_regressions_over_improvements() {
        use Status::*;
        assert_eq!(Counts::of([Pass, Skip, Flake, ExpectedFail]).exit_code(), 0);
        assert_eq!(Counts::of([Pass, UnexpectedImprovement]).exit_code(), 2);
        assert_eq!(Counts::of([UnexpectedImprovement, Missing]).exit_code(), 1);
        let c = Counts::of([Pass, Pass, Fail, Skip, KnownFlake, ExpectedFail]);
        assert_eq!(c.closing_line(), "2 passed, 1 failed, 1 skipped");
        assert_eq!(
            c.detail_line(),
            "1 flaky, 1 expected failures, 0 unexpected improvements"
        );
    }
}
