//! Capabilities a device is made to look as if it lacked ([`Mask`]), from
//! `XTC_VK_MASK`: a way to run, on the device at hand, the paths a device
//! without them takes (lavapipe has subgroups; some GPUs' compute stages and
//! llvmpipe without AVX have none of the size the CPU-form kernels need).
//!
//! `XTC_VK_MASK` is a comma-separated list; it takes `subgroups` (the
//! compute stage reports no subgroup operations: [`Device::subgroup_size`]
//! is `None`, [`Device::subgroup_operations`] is empty, and
//! [`crate::Kernels::new`] builds no entry point that uses subgroup
//! operations). Unset or empty: nothing masked. It sits next to
//! `XTC_VK_VALIDATION` and is read by the same [`Device::open`].
//!
//! [`Device::subgroup_size`]: super::Device::subgroup_size
//! [`Device::subgroup_operations`]: super::Device::subgroup_operations
//! [`Device::open`]: super::Device::open

use crate::{VkError, VkResult};

/// Capabilities hidden from the code above the device (see the module
/// documentation). `Mask::default()` hides nothing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Mask {
    /// The compute stage reports no subgroup operations.
    pub subgroups: bool,
}

impl Mask {
    /// Hides the subgroup operations of the compute stage.
    pub const SUBGROUPS: Mask = Mask { subgroups: true };

    /// What `XTC_VK_MASK` asks for (unset: nothing).
    ///
    /// # Errors
    /// [`VkError::Mask`] for a word other than `subgroups`.
    pub fn from_env() -> VkResult<Mask> {
        match std::env::var("XTC_VK_MASK") {
            Err(_) => Ok(Mask::default()),
            Ok(v) => Mask::parse(&v),
        }
    }

    /// Parses a comma-separated list (`""`: nothing; `"subgroups"`).
    ///
    /// ```
    /// use xtc_vk::Mask;
    /// assert_eq!(Mask::parse("").unwrap(), Mask::default());
    /// assert_eq!(Mask::parse(" subgroups ").unwrap(), Mask::SUBGROUPS);
    /// assert!(Mask::parse("subgroup").is_err());
    /// ```
    ///
    /// # Errors
    /// [`VkError::Mask`] for a word other than `subgroups`, naming it.
    pub fn parse(v: &str) -> VkResult<Mask> {
        let mut m = Mask::default();
        for word in v.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "subgroups" => m.subgroups = true,
                other => {
                    return Err(VkError::Mask(format!(
                        "XTC_VK_MASK: {other:?} is not a capability that can be masked (expected: subgroups)"
                    )));
                }
            }
        }
        Ok(m)
    }
}
