//! [`DeviceOptions`]: how [`Device::open_options`](super::Device::open_options)
//! opens a device beyond the selector (validation, forced staging, the
//! pipeline cache's directory), and the environment variables that set them
//! for [`Device::open`](super::Device::open).

use std::path::PathBuf;

use super::{Mask, Validation};
use crate::{VkError, VkResult};

/// Options of [`Device::open_options`](super::Device::open_options).
/// [`DeviceOptions::from_env`] reads them from the environment, which is
/// what [`Device::open`](super::Device::open) does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceOptions {
    /// The validation level, and whether a missing layer is an error
    /// (`true`) or a silent fallback to [`Validation::Off`] (`false`).
    pub validation: (Validation, bool),
    /// Refuse host-visible memory for [`Location::Device`](crate::Location::Device)
    /// buffers, so every upload and readback of them goes through a staging
    /// buffer as on a discrete GPU (see [`Device::force_staging`](super::Device::force_staging)).
    pub force_staging: bool,
    /// The directory of the persisted `VkPipelineCache` (one file per device
    /// UUID and driver version, see [`crate::pipeline_cache`]); `None`: no
    /// cache is read or written.
    pub pipeline_cache: Option<PathBuf>,
    /// Capabilities hidden (`XTC_VK_MASK`, [`Mask::from_env`]).
    pub mask: Mask,
}

impl Default for DeviceOptions {
    /// No validation, no forced staging, no pipeline cache.
    fn default() -> Self {
        DeviceOptions {
            validation: (Validation::Off, false),
            force_staging: false,
            pipeline_cache: None,
            mask: Mask::default(),
        }
    }
}

impl DeviceOptions {
    /// The options the environment asks for:
    /// - `XTC_VK_VALIDATION`: [`Validation::from_env`];
    /// - `XTC_VK_FORCE_STAGING`: `1` forces staging, `0` or unset does not;
    /// - `XTC_VK_PIPELINE_CACHE`: `0` turns the pipeline cache off, an
    ///   absolute path puts it in that directory; unset, it lives in
    ///   `${XDG_CACHE_HOME:-$HOME/.cache}/xtc/pipelines` (off when neither
    ///   variable is set).
    ///
    /// # Errors
    /// [`VkError::Validation`] for a bad `XTC_VK_VALIDATION`; [`VkError::Inval`]
    /// for an `XTC_VK_FORCE_STAGING` other than `0`/`1` or an
    /// `XTC_VK_PIPELINE_CACHE` that is neither `0` nor an absolute path.
    pub fn from_env() -> VkResult<DeviceOptions> {
        DeviceOptions::from_env_but_validation(Validation::from_env()?)
    }

    /// As [`from_env`](Self::from_env), with `validation` instead of what
    /// `XTC_VK_VALIDATION` says (which is not read).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env), less the validation variable's.
    pub fn from_env_but_validation(validation: (Validation, bool)) -> VkResult<DeviceOptions> {
        let var = |k: &str| std::env::var_os(k).map(|v| v.to_string_lossy().into_owned());
        Ok(DeviceOptions {
            validation,
            force_staging: parse_force_staging(var("XTC_VK_FORCE_STAGING").as_deref())?,
            pipeline_cache: parse_pipeline_cache(
                var("XTC_VK_PIPELINE_CACHE").as_deref(),
                var("XDG_CACHE_HOME").as_deref(),
                var("HOME").as_deref(),
            )?,
            mask: Mask::from_env()?,
        })
    }
}

/// `XTC_VK_FORCE_STAGING`'s value: `1` on, `0` or unset off.
pub(crate) fn parse_force_staging(v: Option<&str>) -> VkResult<bool> {
    match v.map(str::trim) {
        None | Some("0") | Some("") => Ok(false),
        Some("1") => Ok(true),
        Some(other) => Err(VkError::Inval(format!(
            "XTC_VK_FORCE_STAGING={other:?}: expected 0 or 1"
        ))),
    }
}

/// The pipeline cache directory from `XTC_VK_PIPELINE_CACHE`, `XDG_CACHE_HOME`
/// and `HOME` (the XDG base directory rule: an empty or relative
/// `XDG_CACHE_HOME` is ignored).
pub(crate) fn parse_pipeline_cache(
    explicit: Option<&str>,
    xdg_cache_home: Option<&str>,
    home: Option<&str>,
) -> VkResult<Option<PathBuf>> {
    match explicit.map(str::trim) {
        Some("0") | Some("off") => return Ok(None),
        Some(p) if p.starts_with('/') => return Ok(Some(PathBuf::from(p))),
        Some(other) => {
            return Err(VkError::Inval(format!(
                "XTC_VK_PIPELINE_CACHE={other:?}: expected 0 (off) or an absolute directory"
            )));
        }
        None => {}
    }
    let base = match (xdg_cache_home, home) {
        (Some(x), _) if x.starts_with('/') => PathBuf::from(x),
        (_, Some(h)) if h.starts_with('/') => PathBuf::from(h).join(".cache"),
        _ => return Ok(None),
    };
    Ok(Some(base.join("xtc").join("pipelines")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn force_staging_takes_0_and_1_only() {
        assert!(!parse_force_staging(None).unwrap());
        assert!(!parse_force_staging(Some("0")).unwrap());
        assert!(parse_force_staging(Some("1")).unwrap());
        let e = parse_force_staging(Some("yes")).unwrap_err();
        assert!(e.to_string().contains("XTC_VK_FORCE_STAGING"), "{e}");
    }

    #[test]
    fn pipeline_cache_dir_follows_xdg_then_home() {
        let p = |e, x, h| parse_pipeline_cache(e, x, h).unwrap();
        let xdg = PathBuf::from("/x/xtc/pipelines");
        assert_eq!(p(None, Some("/x"), Some("/h")), Some(xdg));
        let home = PathBuf::from("/h/.cache/xtc/pipelines");
        assert_eq!(p(None, Some("relative"), Some("/h")), Some(home.clone()));
        assert_eq!(p(None, None, Some("/h")), Some(home));
        assert_eq!(p(None, None, None), None);
        assert_eq!(p(Some("0"), Some("/x"), Some("/h")), None);
        assert_eq!(p(Some("/c"), None, None), Some(PathBuf::from("/c")));
        assert!(parse_pipeline_cache(Some("rel"), None, None).is_err());
    }
}
