//! The Khronos validation layer: which level `XTC_VK_VALIDATION` asks for
//! (`Validation`), whether the layer can give it, the debug messenger's
//! callback that prints and counts every error-severity message, and the
//! exit check that fails a process that saw one.
//!
//! # Safety
//! The callback is called by the layer with a valid `callback_data` for the
//! duration of the call; `atexit`/`_exit` are the C library's.
#![allow(unsafe_code)]

use super::*;

pub(super) const VALIDATION: &CStr = c"VK_LAYER_KHRONOS_validation";

/// Validation-layer errors reported since process start (all devices).
pub(super) static VALIDATION_ERRORS: AtomicU64 = AtomicU64::new(0);

/// The most recent validation error's text (for reports such as `xtc ci`'s).
pub(super) static LAST_VALIDATION_ERROR: Mutex<Option<String>> = Mutex::new(None);

/// Validation errors printed in full; later ones print their first line,
/// cut to [`SHORT_MESSAGE`] characters.
pub(super) const FULL_MESSAGES: u64 = 20;
pub(super) const SHORT_MESSAGE: usize = 240;

/// Whether the exit check ends the process with status 1 after errors.
pub(super) static FAIL_PROCESS: AtomicBool = AtomicBool::new(true);

/// Number of validation-layer errors reported so far in this process (0 when
/// validation is off). Tests assert it stays 0, `xtc ci` fails a case during
/// which it grew, and a process that opened a device under validation exits
/// with status 1 when it is not 0 at the end (see
/// [`fail_process_on_validation_errors`]).
pub fn validation_errors() -> u64 {
    VALIDATION_ERRORS.load(Ordering::Relaxed)
}

/// Whether a process that opened a device under validation and saw a
/// validation error ends with exit status 1, whatever status it meant to
/// end with (default: yes). Set once the first such device opens, as an
/// `atexit` handler: so every test binary, example and `xtc` command that
/// misused Vulkan fails, even where no assertion looks at the count. Turn it
/// off where errors are judged otherwise: `xtc ci`'s children (a case during
/// which one was reported fails) and a test that provokes one on purpose.
pub fn fail_process_on_validation_errors(on: bool) {
    FAIL_PROCESS.store(on, Ordering::Relaxed);
}

unsafe extern "C" {
    /// C's `atexit(3)`: `f` runs at `exit` (also after `main` returns).
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
    /// `_exit(2)`: ends the process now, with `status`.
    fn _exit(status: std::ffi::c_int) -> !;
}

/// The exit check: status 1 when validation errors were reported.
extern "C" fn exit_check() {
    let n = validation_errors();
    if n == 0 || !FAIL_PROCESS.load(Ordering::Relaxed) {
        return;
    }
    let last = last_validation_error().unwrap_or_default();
    let last: String = last.chars().take(SHORT_MESSAGE).collect();
    eprintln!(
        "vulkan validation: {n} error(s) in this process (printed as they came; the last: {last}): exit status 1"
    );
    // SAFETY: `_exit` is async-signal-safe and may be called from an atexit
    // handler; Rust's runtime flushed stdout before `exit` ran the handlers,
    // and stderr is unbuffered.
    unsafe { _exit(1) }
}

/// Registers [`exit_check`] once per process.
pub(super) fn arm_exit_check() {
    static ARMED: std::sync::Once = std::sync::Once::new();
    ARMED.call_once(|| {
        // SAFETY: `exit_check` is a plain `extern "C" fn()` valid for the
        // program's lifetime; registering it has no other precondition. A
        // failed registration (nonzero) only loses the check: the counts and
        // the tests' assertions remain.
        let _ = unsafe { atexit(exit_check) };
    });
}

/// The text of the most recent validation error of this process, if any.
pub fn last_validation_error() -> Option<String> {
    LAST_VALIDATION_ERROR
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
}

/// What the Khronos validation layer checks, from `XTC_VK_VALIDATION`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Validation {
    /// No layer (`0`; the default of release builds).
    Off,
    /// Core validation only (`core`).
    Core,
    /// Core and synchronization validation (`1` or `sync`; the default of
    /// debug builds, when the layer is installed).
    Sync,
    /// As [`Validation::Sync`], plus GPU-assisted validation: out-of-bounds
    /// accesses in shaders (`gpu`; slow).
    GpuAssisted,
}

impl Validation {
    /// What `XTC_VK_VALIDATION` asks for, and whether it is required (set
    /// explicitly: a missing layer is then an error, not a fallback). Unset:
    /// [`Validation::Sync`] where installed in debug builds, else off.
    ///
    /// # Errors
    /// [`VkError::Validation`] for a value other than `0`, `1`, `core`,
    /// `sync` or `gpu`.
    pub fn from_env() -> VkResult<(Validation, bool)> {
        match std::env::var("XTC_VK_VALIDATION") {
            Err(_) if cfg!(debug_assertions) => Ok((Validation::Sync, false)),
            Err(_) => Ok((Validation::Off, false)),
            Ok(v) => Ok((Validation::parse(&v)?, true)),
        }
    }

    fn parse(v: &str) -> VkResult<Validation> {
        Ok(match v.trim() {
            "0" | "off" => Validation::Off,
            "core" => Validation::Core,
            "1" | "sync" => Validation::Sync,
            "gpu" => Validation::GpuAssisted,
            other => {
                return Err(VkError::Validation(format!(
                    "XTC_VK_VALIDATION={other:?}: expected 0, 1, core, sync or gpu"
                )));
            }
        })
    }

    /// The `VkValidationFeatureEnableEXT`s this level adds to core validation.
    pub(super) fn features(self) -> &'static [vk::ValidationFeatureEnableEXT] {
        const SYNC: vk::ValidationFeatureEnableEXT =
            vk::ValidationFeatureEnableEXT::SYNCHRONIZATION_VALIDATION;
        match self {
            Validation::Off | Validation::Core => &[],
            Validation::Sync => &[SYNC],
            Validation::GpuAssisted => &[SYNC, vk::ValidationFeatureEnableEXT::GPU_ASSISTED],
        }
    }
}

/// The validation level to enable: `wanted` when the layer (and, for
/// synchronization or GPU-assisted validation, its `VK_EXT_validation_features`)
/// is installed; otherwise [`Validation::Off`], or an error when `required`.
pub(super) fn available_validation(
    entry: &ash::Entry,
    wanted: Validation,
    required: bool,
) -> VkResult<Validation> {
    if wanted == Validation::Off {
        return Ok(Validation::Off);
    }
    // SAFETY: a global query with no inputs; the entry is loaded.
    let layers = unsafe { entry.enumerate_instance_layer_properties() }.unwrap_or_default();
    let has_layer = layers
        .iter()
        .any(|l| l.layer_name_as_c_str() == Ok(VALIDATION));
    // SAFETY: a global query of the layer's own extensions; the name is a
    // NUL-terminated constant.
    let layer_exts = unsafe { entry.enumerate_instance_extension_properties(Some(VALIDATION)) }
        .unwrap_or_default();
    let has_features = layer_exts
        .iter()
        .any(|e| e.extension_name_as_c_str() == Ok(ext::validation_features::NAME));
    match (has_layer, has_features || wanted == Validation::Core) {
        (true, true) => Ok(wanted),
        _ if !required => Ok(Validation::Off),
        (false, _) => Err(VkError::Validation(format!(
            "validation {wanted:?} requested (XTC_VK_VALIDATION) but the layer \
             {VALIDATION:?} is not installed (Debian: vulkan-validationlayers)"
        ))),
        (true, false) => Err(VkError::Validation(format!(
            "validation {wanted:?} requested (XTC_VK_VALIDATION) but the installed \
             {VALIDATION:?} lacks VK_EXT_validation_features"
        ))),
    }
}

pub(super) unsafe extern "system" fn on_validation_message(
    severity: vk::DebugUtilsMessageSeverityFlagsEXT,
    _types: vk::DebugUtilsMessageTypeFlagsEXT,
    data: *const vk::DebugUtilsMessengerCallbackDataEXT<'_>,
    _user: *mut c_void,
) -> vk::Bool32 {
    if severity.contains(vk::DebugUtilsMessageSeverityFlagsEXT::ERROR) {
        let n = VALIDATION_ERRORS.fetch_add(1, Ordering::Relaxed) + 1;
        // SAFETY: the layer passes a valid callback-data struct whose message is
        // a NUL-terminated string (or null) for the duration of the call.
        let msg = unsafe { data.as_ref().and_then(|d| d.message_as_c_str()) };
        let msg = msg.map(|m| m.to_string_lossy()).unwrap_or_default();
        if n <= FULL_MESSAGES {
            eprintln!("vulkan validation error {n}: {msg}");
        } else {
            let short: String = msg
                .lines()
                .next()
                .unwrap_or("")
                .chars()
                .take(SHORT_MESSAGE)
                .collect();
            eprintln!("vulkan validation error {n}: {short}");
        }
        *LAST_VALIDATION_ERROR
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(msg.into_owned());
    }
    vk::FALSE
}
