//! `xtc_accel_dev_t` and the probe (`xtc_accel_probe`, `xtc_accel_probe_in`):
//! the render and accel nodes `xtc_batch_loop_for_device` places (B-160,
//! B-161), from [`xtc::accel::probe`].

use std::ffi::{CStr, c_char};
use std::os::raw::c_int;
use std::path::Path;

use xtc::Error;
use xtc::accel::{self, Device, NodeKind};

use crate::boundary::call;
use crate::codes::xtc_accel_kind;
use crate::rt::put;

/// Bytes of `xtc_accel_dev_t.name` and `.driver`, NUL included.
pub const XTC_ACCEL_NAME_MAX: usize = 32;

/// One render or accel node as the probe found it.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct xtc_accel_dev_t {
    /// Short label, NUL-terminated: `renderD128`, `accel0` (B-161).
    pub name: [c_char; XTC_ACCEL_NAME_MAX],
    /// Kernel driver name (`i915`, `amdgpu`, `nvidia`, `intel_vpu`),
    /// NUL-terminated and cut to 31 bytes; empty when unknown.
    pub driver: [c_char; XTC_ACCEL_NAME_MAX],
    /// `XTC_ACCEL_RENDER` or `XTC_ACCEL_ACCEL`.
    pub kind: c_int,
    /// NUMA node from `device/numa_node` when it names an online node; -1
    /// for -1, missing, unreadable or bad values.
    pub numa_node: c_int,
}

/// The text before the first NUL of a fixed field; `None` without a NUL or
/// for bytes that are not UTF-8.
pub(crate) fn c_str(field: &[c_char; XTC_ACCEL_NAME_MAX]) -> Option<&str> {
    // SAFETY: c_char and u8 have the same size and alignment; the slice
    // covers exactly the array.
    let bytes = unsafe { std::slice::from_raw_parts(field.as_ptr().cast::<u8>(), field.len()) };
    CStr::from_bytes_until_nul(bytes).ok()?.to_str().ok()
}

/// The node kind of a `kind` value.
pub(crate) fn kind_of(k: c_int) -> Option<NodeKind> {
    match k {
        k if k == xtc_accel_kind::XTC_ACCEL_RENDER as c_int => Some(NodeKind::Render),
        k if k == xtc_accel_kind::XTC_ACCEL_ACCEL as c_int => Some(NodeKind::Accel),
        _ => None,
    }
}

fn fill(dst: &mut [c_char; XTC_ACCEL_NAME_MAX], s: &str) {
    *dst = [0; XTC_ACCEL_NAME_MAX];
    let n = s.len().min(XTC_ACCEL_NAME_MAX - 1);
    for (d, b) in dst.iter_mut().zip(&s.as_bytes()[..n]) {
        *d = *b as c_char;
    }
}

fn dev_of(d: &Device) -> xtc_accel_dev_t {
    let mut out = xtc_accel_dev_t {
        name: [0; XTC_ACCEL_NAME_MAX],
        driver: [0; XTC_ACCEL_NAME_MAX],
        kind: match d.kind {
            NodeKind::Render => xtc_accel_kind::XTC_ACCEL_RENDER as c_int,
            NodeKind::Accel => xtc_accel_kind::XTC_ACCEL_ACCEL as c_int,
        },
        numa_node: d
            .numa_node
            .and_then(|n| c_int::try_from(n).ok())
            .unwrap_or(-1),
    };
    fill(&mut out.name, &d.name);
    fill(&mut out.driver, d.driver.as_deref().unwrap_or(""));
    out
}

/// Writes up to `cap` devices and the number found.
///
/// # Safety
/// `devs` is NULL (then `cap` must be 0) or writable for `cap` devices;
/// `out_n` is NULL or writable.
unsafe fn deliver(
    found: Vec<Device>,
    devs: *mut xtc_accel_dev_t,
    cap: usize,
    out_n: *mut usize,
) -> Result<(), Error> {
    if out_n.is_null() || (devs.is_null() && cap > 0) {
        return Err(Error::Inval);
    }
    for (i, d) in found.iter().take(cap).enumerate() {
        // SAFETY: i < cap elements are writable at devs (caller contract).
        unsafe { devs.add(i).write(dev_of(d)) };
    }
    // SAFETY: checked non-NULL; caller contract.
    unsafe { put(out_n, found.len()) }
}

/// `xtc_accel_probe`: lists the host's render (`/dev/dri/renderD*`) and accel
/// (`/dev/accel/accel*`) nodes in name order. Writes the first `cap` of them
/// to `devs` and the number found to `*out_n` (which may exceed `cap`: call
/// with `cap == 0` and `devs == NULL` to count). A host without such nodes
/// has 0; a node with odd sysfs content is still listed (`numa_node` -1).
///
/// Returns `XTC_OK`; `XTC_E_INVAL` for a NULL `out_n`, or NULL `devs` with
/// `cap > 0`; `XTC_E_INTERNAL` when the device directories cannot be read.
///
/// # Safety
/// `devs` is NULL or writable for `cap` devices; `out_n` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_accel_probe(
    devs: *mut xtc_accel_dev_t,
    cap: usize,
    out_n: *mut usize,
) -> c_int {
    call(|| {
        let found = accel::probe()?;
        // SAFETY: caller contract.
        unsafe { deliver(found, devs, cap, out_n) }
    })
}

/// `xtc_accel_probe_in`: as `xtc_accel_probe`, reading `dev/` and `sys/`
/// under `root` (a fixture tree such as one of the repository's `devices/` trees).
///
/// Returns as `xtc_accel_probe`, plus `XTC_E_INVAL` for a NULL `root` or one
/// that is not UTF-8.
///
/// # Safety
/// `root` is NULL or a NUL-terminated string; as `xtc_accel_probe` otherwise.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn xtc_accel_probe_in(
    root: *const c_char,
    devs: *mut xtc_accel_dev_t,
    cap: usize,
    out_n: *mut usize,
) -> c_int {
    call(|| {
        if root.is_null() {
            return Err(Error::Inval);
        }
        // SAFETY: a NUL-terminated string (caller contract).
        let root = unsafe { CStr::from_ptr(root) }
            .to_str()
            .map_err(|_| Error::Inval)?;
        let found = accel::probe_in(Path::new(root))?;
        // SAFETY: caller contract.
        unsafe { deliver(found, devs, cap, out_n) }
    })
}
