//! The case registry's types: a [`Case`] (stable dotted name, suite, group,
//! body), what a body returns ([`Outcome`], [`CaseError`], [`Record`]), and
//! the per-child context it runs in ([`Ctx`]: the device, opened once per
//! child and shared by the group's cases, and the case's seed).

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::status::Status;
use xtc_model::vulkan::ops::Variant;
use xtc_vk::{Device, Kernels, Selector};

/// The suites of `xtc ci run --suite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Suite {
    /// Every kernel of `kernels/` against the CPU reference.
    Kernels,
    /// Completion fds: sync_file export, the eventfd bridge, loop wake, fd leaks.
    Fence,
    /// Sync and async batch groups driving device work.
    Batch,
    /// The batched-publish scheduler on the emulated NPU.
    Dispatch,
    /// Whole-model greedy decode: golden tokens, Vulkan vs CPU reference.
    Decode,
    /// Latency and throughput figures against a per-device baseline.
    Perf,
    /// The runner's own test cases (crash, hang, flake, ...): hidden, never
    /// part of `all`.
    Selftest,
}

impl Suite {
    /// The suites `--suite all` runs (every one but [`Suite::Selftest`]).
    pub const ALL: [Suite; 6] = [
        Suite::Kernels,
        Suite::Fence,
        Suite::Batch,
        Suite::Dispatch,
        Suite::Decode,
        Suite::Perf,
    ];

    /// The suite's name: the second component of its cases' names.
    pub fn name(self) -> &'static str {
        match self {
            Suite::Kernels => "kernels",
            Suite::Fence => "fence",
            Suite::Batch => "batch",
            Suite::Dispatch => "dispatch",
            Suite::Decode => "decode",
            Suite::Perf => "perf",
            Suite::Selftest => "selftest",
        }
    }
}

/// A figure or token list a case hands to the runner, which compares it
/// with the baseline of this device (`--perf-baseline`, `--golden`) or, with
/// `--write-baseline`, stores it there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Record {
    /// A perf figure (median after warm-up).
    Perf(Measure),
    /// Greedy tokens of a decode case.
    Golden(Vec<u32>),
}

/// One perf figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measure {
    /// The figure, in `unit`.
    pub value: f64,
    /// Unit (`us`, `ms`, `GFLOP/s`).
    pub unit: String,
    /// `true` for throughputs (GFLOP/s), `false` for latencies.
    pub higher_is_better: bool,
}

/// What a case body returns when it ran to the end.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    /// `Pass`, `Fail`, `Skip` (or `UnexpectedImprovement`).
    pub status: Status,
    /// Why (empty for a plain pass); figures for perf cases.
    pub message: String,
    /// A figure or token list for the runner to compare or store.
    pub record: Option<Record>,
    /// Test-only ([`Suite::Selftest`]): the child exits with this status
    /// after reporting the case.
    pub(crate) then_exit: Option<i32>,
}

impl Outcome {
    /// A pass.
    pub fn pass() -> Outcome {
        Outcome::with(Status::Pass, String::new())
    }

    /// A pass with a note (figures, what was checked).
    pub fn pass_with(message: impl Into<String>) -> Outcome {
        Outcome::with(Status::Pass, message.into())
    }

    /// A failed check.
    pub fn fail(message: impl Into<String>) -> Outcome {
        Outcome::with(Status::Fail, message.into())
    }

    /// Cannot run here (never "the check did not hold").
    pub fn skip(message: impl Into<String>) -> Outcome {
        Outcome::with(Status::Skip, message.into())
    }

    /// A pass carrying `record` for the runner to compare with the baseline.
    pub fn record(record: Record, message: impl Into<String>) -> Outcome {
        Outcome {
            record: Some(record),
            ..Outcome::with(Status::Pass, message.into())
        }
    }

    fn with(status: Status, message: String) -> Outcome {
        Outcome {
            status,
            message,
            record: None,
            then_exit: None,
        }
    }
}

/// Why a case body stopped early. Any error converts into `Fail` through
/// `?` (its `Display` text is the message), so bodies read like tests.
#[derive(Debug)]
pub enum CaseError {
    /// A check failed or a call returned an error.
    Fail(String),
    /// The case cannot run here (no device outside CI, a feature the device
    /// lacks, the crate built without `sched-policy`).
    Skip(String),
    /// The device is gone (`VK_ERROR_DEVICE_LOST`): the case is `Crash` and
    /// the rest of its group continues in a fresh child.
    DeviceLost(String),
}

/// An error is a device loss when a Vulkan call of this process returned
/// `VK_ERROR_DEVICE_LOST` (`vk::device_lost`, set where the result code is
/// mapped to `VkError::Lost`), whatever type carried it up here; its text is
/// never inspected.
impl<E: fmt::Display> From<E> for CaseError {
    fn from(e: E) -> CaseError {
        if xtc_vk::device_lost() {
            CaseError::DeviceLost(e.to_string())
        } else {
            CaseError::Fail(e.to_string())
        }
    }
}

/// A failed check: `ensure(cond, || message)?`.
///
/// # Errors
/// [`CaseError::Fail`] with the message when `cond` is false.
pub fn ensure(cond: bool, message: impl FnOnce() -> String) -> Result<(), CaseError> {
    if cond {
        Ok(())
    } else {
        Err(CaseError::Fail(message()))
    }
}

/// What a case body returns.
pub type CaseResult = Result<Outcome, CaseError>;

/// A case body. Runs in a child process, on the child's main thread.
pub type CaseFn = Arc<dyn Fn(&mut Ctx) -> CaseResult + Send + Sync>;

/// One registered case.
#[derive(Clone)]
pub struct Case {
    /// Stable dotted name, `xtc.<suite>.<...>` (the key of baselines,
    /// `--include`, `--skips` and `--flakes`).
    pub name: String,
    /// Its suite.
    pub suite: Suite,
    /// Cases of one group run in one child process, in registry order (so
    /// they share its device and compiled kernels).
    pub group: String,
    /// Runs alone, after every other group, one child at a time (perf).
    pub exclusive: bool,
    /// The kernel form the case pins (its name says it: `.gpu.` / `.cpu.`),
    /// or `None` when it runs the form of `--kernels`
    /// ([`Ctx::kernel_form`]); `xtc ci run --kernels F` leaves out the cases
    /// pinned to the other form.
    pub form: Option<Variant>,
    /// The body.
    pub run: CaseFn,
}

impl fmt::Debug for Case {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Case")
            .field("name", &self.name)
            .field("group", &self.group)
            .finish_non_exhaustive()
    }
}

impl Case {
    /// A case named `name` in `suite`, in the group named after the first
    /// three components of its name (`xtc.kernels.matmul`).
    ///
    /// # Panics
    /// If `name` does not start with `xtc.<suite>.`.
    pub fn new(
        suite: Suite,
        name: impl Into<String>,
        run: impl Fn(&mut Ctx) -> CaseResult + Send + Sync + 'static,
    ) -> Case {
        let name = name.into();
        let prefix = format!("xtc.{}.", suite.name());
        assert!(
            name.starts_with(&prefix) && name.len() > prefix.len(),
            "case {name:?} outside {prefix}"
        );
        let group = name.split('.').take(3).collect::<Vec<_>>().join(".");
        Case {
            name,
            suite,
            group,
            exclusive: suite == Suite::Perf,
            form: None,
            run: Arc::new(run),
        }
    }

    /// The same case pinned to kernel form `form` ([`Case::form`]).
    pub fn in_form(mut self, form: Variant) -> Case {
        self.form = Some(form);
        self
    }

    /// The same case in group `group` instead.
    pub fn in_group(mut self, group: impl Into<String>) -> Case {
        self.group = group.into();
        self
    }
}

/// The device a child opened, as the runner keys baselines by it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceId {
    /// `deviceName`.
    pub name: String,
    /// `driverName driverInfo`.
    pub driver: String,
}

impl DeviceId {
    /// The baseline key: `name | driver`.
    pub fn key(&self) -> String {
        format!("{} | {}", self.name, self.driver)
    }
}

/// The context of one child process: the device (opened on first use and
/// kept for the child's later cases), its compiled kernels, and the seed of
/// the case running now.
pub struct Ctx {
    selector: String,
    ci: bool,
    seed: u64,
    case_seed: u64,
    /// The device, or why it did not open and whether that is because the
    /// machine has no Vulkan ([`xtc_vk::VkError::is_absent`]).
    device: Option<Result<Device, (String, bool)>>,
    kernels: Option<Arc<Kernels>>,
    form: Option<Variant>,
    timeout: Option<std::time::Duration>,
    pub(crate) opened: Option<DeviceId>,
}

impl Ctx {
    /// A context for `--device selector` and run seed `seed`; `ci`: a missing
    /// device fails device cases instead of skipping them.
    pub fn new(selector: &str, seed: u64, ci: bool) -> Ctx {
        Ctx {
            selector: selector.to_owned(),
            ci,
            seed,
            case_seed: seed,
            device: None,
            kernels: None,
            form: None,
            timeout: None,
            opened: None,
        }
    }

    /// The same context with `--kernels` `form` (`None`: `auto`).
    pub fn with_kernel_form(mut self, form: Option<Variant>) -> Ctx {
        self.form = form;
        self
    }

    /// The same context with the runner's `--timeout` per case (`None`:
    /// unknown, as when a case runs outside `xtc ci`).
    pub fn with_timeout(mut self, timeout: Option<std::time::Duration>) -> Ctx {
        self.timeout = timeout;
        self
    }

    /// The runner's `--timeout` per case, which a case whose cost depends
    /// on the device (the real model's perf cases) measures within; `None`
    /// when not known.
    pub fn timeout(&self) -> Option<std::time::Duration> {
        self.timeout
    }

    /// The kernel form of `--kernels` for the cases that do not pin one
    /// (`None`: `auto`, the device's form by capability and probe).
    pub fn kernel_form(&self) -> Option<Variant> {
        self.form
    }

    /// Sets the seed of the case about to run: the run seed mixed with the
    /// case's name, so filtering or reordering cases never changes one's
    /// inputs.
    pub fn begin_case(&mut self, name: &str) {
        self.case_seed = case_seed(self.seed, name);
    }

    /// The running case's seed.
    pub fn case_seed(&self) -> u64 {
        self.case_seed
    }

    /// A PRNG seeded with [`Ctx::case_seed`].
    pub fn rng(&self) -> fastrand::Rng {
        fastrand::Rng::with_seed(self.case_seed)
    }

    /// Whether `CI` is set (a missing device is a failure, not a skip).
    pub fn ci(&self) -> bool {
        self.ci
    }

    /// The Vulkan device of `--device`, opened on first use.
    ///
    /// # Errors
    /// When the device is not on this machine (no Vulkan, no device the
    /// selector matches): [`CaseError::Skip`], or with `CI` set
    /// [`CaseError::Fail`]; any other reason it cannot be opened (a bad
    /// selector, validation requested and not installed) is
    /// [`CaseError::Fail`].
    pub fn device(&mut self) -> Result<Device, CaseError> {
        let sel = &self.selector;
        let opened = self.device.get_or_insert_with(|| {
            let s: Selector = sel
                .parse()
                .map_err(|e| (format!("--device {sel:?}: {e}"), false))?;
            Device::open(&s).map_err(|e| {
                (
                    format!("the Vulkan device did not open ({e})"),
                    e.is_absent(),
                )
            })
        });
        match opened {
            Ok(d) => {
                if self.opened.is_none() {
                    self.opened = Some(DeviceId {
                        name: d.info().name.clone(),
                        driver: d.info().driver.clone(),
                    });
                }
                Ok(d.clone())
            }
            Err((e, true)) if !self.ci => Err(CaseError::Skip(e.clone())),
            Err((e, true)) => Err(CaseError::Fail(format!("CI is set and {e}"))),
            Err((e, false)) => Err(CaseError::Fail(e.clone())),
        }
    }

    /// The device's kernels (`kernels/*.wgsl`), compiled once per child.
    ///
    /// # Errors
    /// As [`Ctx::device`]; a failed pipeline creation is `Fail`.
    pub fn kernels(&mut self) -> Result<Arc<Kernels>, CaseError> {
        if let Some(k) = &self.kernels {
            return Ok(k.clone());
        }
        let dev = self.device()?;
        let k = Arc::new(Kernels::new(&dev)?);
        self.kernels = Some(k.clone());
        Ok(k)
    }
}

/// The seed of case `name` in a run seeded `seed` (FNV-1a of the name mixed
/// into the run seed).
pub fn case_seed(seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    seed ^ h
}
