//! Physical-device discovery and choice, and the logical [`Device`].
//!
//! # Safety
//! This file calls the Vulkan API through `ash`. The invariants every `unsafe`
//! block relies on: the `ash::Entry` outlives the instance, the instance
//! outlives every physical-device query and the device, create-info structs
//! (and the arrays they point to) live across the call that reads them, and
//! `Inner`'s `Drop` destroys children before parents after the queue is idle.
#![allow(unsafe_code)]

use std::ffi::{CStr, CString, c_void};
use std::mem::ManuallyDrop;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ash::{ext, khr, vk};
use gpu_allocator::vulkan::{Allocator, AllocatorCreateDesc};

use super::pipeline_cache::{CacheKey, CacheState, PipelineCache};
use super::queue::QueueState;
use super::{VkError, VkResult, call};

mod mask;
mod options;
mod validation;

pub use mask::Mask;
pub use options::DeviceOptions;
use validation::*;
pub use validation::{
    Validation, fail_process_on_validation_errors, last_validation_error, validation_errors,
};

/// Kind of physical device, in preference order for [`Selector::Auto`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum DeviceKind {
    /// A discrete GPU (preferred).
    Discrete,
    /// An integrated GPU.
    Integrated,
    /// A virtual GPU.
    Virtual,
    /// A CPU implementation (Mesa's lavapipe).
    Cpu,
    /// Anything else.
    Other,
}

impl DeviceKind {
    fn from_vk(t: vk::PhysicalDeviceType) -> DeviceKind {
        match t {
            vk::PhysicalDeviceType::DISCRETE_GPU => DeviceKind::Discrete,
            vk::PhysicalDeviceType::INTEGRATED_GPU => DeviceKind::Integrated,
            vk::PhysicalDeviceType::VIRTUAL_GPU => DeviceKind::Virtual,
            vk::PhysicalDeviceType::CPU => DeviceKind::Cpu,
            _ => DeviceKind::Other,
        }
    }
}

/// The DRM render node of a physical device, from `VK_EXT_physical_device_drm`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RenderNode {
    /// Character-device major number.
    pub major: i64,
    /// Character-device minor number.
    pub minor: i64,
    /// `/dev/dri/renderD<minor>` (the kernel's naming).
    pub path: PathBuf,
}

/// What discovery learned about one physical device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PhysicalDeviceInfo {
    /// Position in `vkEnumeratePhysicalDevices` order ([`Selector::Index`]).
    pub index: usize,
    /// `deviceName` (e.g. `llvmpipe (LLVM 15.0.6, 256 bits)`).
    pub name: String,
    /// Device type.
    pub kind: DeviceKind,
    /// PCI vendor id.
    pub vendor_id: u32,
    /// PCI device id.
    pub device_id: u32,
    /// Vulkan version the driver supports, (major, minor, patch).
    pub api_version: (u32, u32, u32),
    /// The driver: `driverName` and `driverInfo` of
    /// `VkPhysicalDeviceDriverProperties` (Vulkan 1.2), e.g. `llvmpipe Mesa
    /// 22.3.6 (LLVM 15.0.6)`; empty for a driver below 1.2. With `name`, the
    /// key of a device's baselines (`xtc ci`).
    pub driver: String,
    /// `driverVersion` (vendor-specific encoding).
    pub driver_version: u32,
    /// Render node, where the driver has `VK_EXT_physical_device_drm`.
    pub render_node: Option<RenderNode>,
    /// Whether fences can be exported as `SYNC_FD` (`VK_KHR_external_fence_fd`).
    pub sync_fd_export: bool,
    /// Whether timeline semaphores are supported (required).
    pub timeline_semaphore: bool,
    /// Queue family with compute, if any (required).
    pub compute_family: Option<u32>,
}

impl PhysicalDeviceInfo {
    fn usable(&self) -> bool {
        self.timeline_semaphore && self.compute_family.is_some()
    }

    /// The vendor's name for [`vendor_id`](Self::vendor_id): a PCI vendor
    /// (NVIDIA, AMD, Intel, ARM, Qualcomm, Imagination, Apple, Microsoft) or
    /// a Khronos vendor id (Mesa, ...); `None` when unknown.
    pub fn vendor_name(&self) -> Option<&'static str> {
        Some(match self.vendor_id {
            0x10de => "NVIDIA",
            0x1002 | 0x1022 => "AMD",
            0x8086 => "Intel",
            0x13b5 => "ARM",
            0x5143 => "Qualcomm",
            0x1010 => "Imagination Technologies",
            0x106b => "Apple",
            0x1414 => "Microsoft",
            0x10005 => "Mesa",
            0x10001 => "Vivante",
            0x10002 => "VeriSilicon",
            0x10003 => "Kazan",
            0x10004 => "Codeplay",
            0x10006 => "PoCL",
            0x10007 => "MoltenVK",
            _ => return None,
        })
    }

    /// [`driver_version`](Self::driver_version) decoded by the vendor's
    /// convention: NVIDIA `10.8.8.6` bits, Intel on Windows is not a case
    /// here (Linux drivers use Vulkan's `major.minor.patch` packing, as Mesa
    /// does).
    pub fn driver_version_string(&self) -> String {
        let v = self.driver_version;
        if self.vendor_id == 0x10de {
            format!(
                "{}.{}.{}.{}",
                v >> 22,
                (v >> 14) & 0xff,
                (v >> 6) & 0xff,
                v & 0x3f
            )
        } else {
            format!(
                "{}.{}.{}",
                vk::api_version_major(v),
                vk::api_version_minor(v),
                vk::api_version_patch(v)
            )
        }
    }
}

/// Which physical device [`Device::open`] takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// The best usable one: discrete > integrated > virtual > CPU, then index.
    Auto,
    /// By [`PhysicalDeviceInfo::index`].
    Index(usize),
    /// The first whose name contains this text (case-insensitive).
    Name(String),
    /// The one whose render node is this path (or the same device number).
    RenderNode(PathBuf),
}

impl std::str::FromStr for Selector {
    type Err = VkError;
    /// `auto` or empty, a decimal index, a path starting with `/`, else a name.
    fn from_str(s: &str) -> VkResult<Selector> {
        Ok(match s.trim() {
            "" | "auto" => Selector::Auto,
            t if t.starts_with('/') => Selector::RenderNode(PathBuf::from(t)),
            t => match t.parse::<usize>() {
                Ok(i) => Selector::Index(i),
                Err(_) => Selector::Name(t.to_owned()),
            },
        })
    }
}

impl Selector {
    /// Picks one of `devs` (only usable ones count).
    ///
    /// # Errors
    /// [`VkError::NoDevice`] when none is usable, [`VkError::NoMatch`] when the
    /// selector matches no usable device.
    pub fn choose<'a>(&self, devs: &'a [PhysicalDeviceInfo]) -> VkResult<&'a PhysicalDeviceInfo> {
        let mut usable = devs.iter().filter(|d| d.usable()).peekable();
        if usable.peek().is_none() {
            return Err(VkError::NoDevice);
        }
        let found = match self {
            Selector::Auto => usable.min_by_key(|d| (d.kind, d.index)),
            Selector::Index(i) => usable.find(|d| d.index == *i),
            Selector::Name(n) => {
                let n = n.to_lowercase();
                usable.find(|d| d.name.to_lowercase().contains(&n))
            }
            Selector::RenderNode(p) => {
                let rdev = device_number(p);
                usable.find(|d| {
                    d.render_node
                        .as_ref()
                        .is_some_and(|r| r.path == *p || rdev == Some((r.major, r.minor)))
                })
            }
        };
        found.ok_or_else(|| VkError::NoMatch(format!("{self:?}")))
    }
}

/// (major, minor) of a character device path, if it exists.
fn device_number(p: &Path) -> Option<(i64, i64)> {
    let st = rustix::fs::stat(p).ok()?;
    let (ma, mi) = (rustix::fs::major(st.st_rdev), rustix::fs::minor(st.st_rdev));
    Some((ma.into(), mi.into()))
}

fn load_entry() -> VkResult<ash::Entry> {
    // SAFETY: loading libvulkan runs its initialisers; the Vulkan loader is
    // designed to be loaded this way and the Entry keeps the library open.
    unsafe { ash::Entry::load() }.map_err(|e| VkError::Loader(e.to_string()))
}

struct Instance {
    entry: ash::Entry,
    instance: ash::Instance,
    debug: Option<(ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)>,
    /// The validation that runs (`Off` when `debug` is `None`).
    level: Validation,
}

impl Instance {
    /// An instance with `validation` (when available; an error when it is
    /// `required` and not).
    fn new(validation: Validation, required: bool) -> VkResult<Instance> {
        let entry = load_entry()?;
        let level = available_validation(&entry, validation, required)?;
        let validation = level != Validation::Off;
        let app = vk::ApplicationInfo::default()
            .application_name(c"xtc")
            .api_version(vk::API_VERSION_1_2);
        let layers = if validation {
            vec![VALIDATION.as_ptr()]
        } else {
            vec![]
        };
        let mut exts = if validation {
            vec![ext::debug_utils::NAME.as_ptr()]
        } else {
            vec![]
        };
        let features = level.features();
        if !features.is_empty() {
            exts.push(ext::validation_features::NAME.as_ptr());
        }
        let mut chosen = vk::ValidationFeaturesEXT::default().enabled_validation_features(features);
        let mut info = vk::InstanceCreateInfo::default()
            .application_info(&app)
            .enabled_layer_names(&layers)
            .enabled_extension_names(&exts);
        if !features.is_empty() {
            info = info.push_next(&mut chosen);
        }
        // SAFETY: `info`, the arrays it points to and its chain (`chosen`,
        // whose extension is enabled above) live across the call.
        let instance =
            unsafe { entry.create_instance(&info, None) }.map_err(call("vkCreateInstance"))?;
        let mut me = Instance {
            entry,
            instance,
            debug: None,
            level,
        };
        if validation {
            me.debug = Some(me.messenger()?);
            arm_exit_check();
        }
        Ok(me)
    }

    fn messenger(&self) -> VkResult<(ext::debug_utils::Instance, vk::DebugUtilsMessengerEXT)> {
        let du = ext::debug_utils::Instance::new(&self.entry, &self.instance);
        let info = vk::DebugUtilsMessengerCreateInfoEXT::default()
            .message_severity(
                vk::DebugUtilsMessageSeverityFlagsEXT::ERROR
                    | vk::DebugUtilsMessageSeverityFlagsEXT::WARNING,
            )
            .message_type(
                vk::DebugUtilsMessageTypeFlagsEXT::VALIDATION
                    | vk::DebugUtilsMessageTypeFlagsEXT::GENERAL,
            )
            .pfn_user_callback(Some(on_validation_message));
        // SAFETY: the instance was created with VK_EXT_debug_utils enabled; the
        // callback is a plain function valid for the program's lifetime.
        let m = unsafe { du.create_debug_utils_messenger(&info, None) }
            .map_err(call("vkCreateDebugUtilsMessengerEXT"))?;
        Ok((du, m))
    }

    fn describe_all(&self) -> VkResult<Vec<(vk::PhysicalDevice, PhysicalDeviceInfo)>> {
        // SAFETY: the instance is valid.
        let pds = unsafe { self.instance.enumerate_physical_devices() }
            .map_err(call("vkEnumeratePhysicalDevices"))?;
        Ok(pds
            .into_iter()
            .enumerate()
            .map(|(i, pd)| (pd, self.describe(i, pd)))
            .collect())
    }

    fn describe(&self, index: usize, pd: vk::PhysicalDevice) -> PhysicalDeviceInfo {
        let inst = &self.instance;
        // SAFETY: `pd` came from this instance; the queries only fill outputs.
        let (exts, props, families) = unsafe {
            (
                inst.enumerate_device_extension_properties(pd)
                    .unwrap_or_default(),
                inst.get_physical_device_properties(pd),
                inst.get_physical_device_queue_family_properties(pd),
            )
        };
        let has = |n: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(n));
        let render_node = if has(ext::physical_device_drm::NAME) {
            self.drm_node(pd)
        } else {
            None
        };
        let compute_family = families
            .iter()
            .position(|f| f.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .map(|i| i as u32);
        let v = props.api_version;
        let driver = if vk::api_version_minor(v) >= 2 || vk::api_version_major(v) > 1 {
            self.driver(pd)
        } else {
            String::new()
        };
        PhysicalDeviceInfo {
            index,
            name: props
                .device_name_as_c_str()
                .map(|c| c.to_string_lossy().into_owned())
                .unwrap_or_default(),
            kind: DeviceKind::from_vk(props.device_type),
            vendor_id: props.vendor_id,
            device_id: props.device_id,
            api_version: (
                vk::api_version_major(v),
                vk::api_version_minor(v),
                vk::api_version_patch(v),
            ),
            driver,
            driver_version: props.driver_version,
            render_node,
            sync_fd_export: has(khr::external_fence_fd::NAME) && self.fence_exports_sync_fd(pd),
            timeline_semaphore: self.has_timeline(pd),
            compute_family,
        }
    }

    /// `driverName driverInfo` of a Vulkan 1.2 device.
    fn driver(&self, pd: vk::PhysicalDevice) -> String {
        let mut drv = vk::PhysicalDeviceDriverProperties::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut drv);
        // SAFETY: a core 1.2 query on a device of API version 1.2 or later;
        // `p2` chains `drv`, both live here.
        unsafe { self.instance.get_physical_device_properties2(pd, &mut p2) };
        let text = |c: Result<&CStr, _>| c.map(|c| c.to_string_lossy().into_owned());
        let name = text(drv.driver_name_as_c_str()).unwrap_or_default();
        let info = text(drv.driver_info_as_c_str()).unwrap_or_default();
        format!("{name} {info}").trim().to_owned()
    }

    fn drm_node(&self, pd: vk::PhysicalDevice) -> Option<RenderNode> {
        let mut drm = vk::PhysicalDeviceDrmPropertiesEXT::default();
        let mut p2 = vk::PhysicalDeviceProperties2::default().push_next(&mut drm);
        // SAFETY: the extension is present; `p2` chains `drm`, both live here.
        unsafe { self.instance.get_physical_device_properties2(pd, &mut p2) };
        (drm.has_render == vk::TRUE).then(|| RenderNode {
            major: drm.render_major,
            minor: drm.render_minor,
            path: PathBuf::from(format!("/dev/dri/renderD{}", drm.render_minor)),
        })
    }

    fn fence_exports_sync_fd(&self, pd: vk::PhysicalDevice) -> bool {
        let info = vk::PhysicalDeviceExternalFenceInfo::default()
            .handle_type(vk::ExternalFenceHandleTypeFlags::SYNC_FD);
        let mut props = vk::ExternalFenceProperties::default();
        // SAFETY: a Vulkan 1.1 core query filling `props`.
        unsafe {
            self.instance
                .get_physical_device_external_fence_properties(pd, &info, &mut props)
        };
        props
            .external_fence_features
            .contains(vk::ExternalFenceFeatureFlags::EXPORTABLE)
    }

    fn has_timeline(&self, pd: vk::PhysicalDevice) -> bool {
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut f12);
        // SAFETY: core 1.1 query; the chain lives here.
        unsafe { self.instance.get_physical_device_features2(pd, &mut f2) };
        f12.timeline_semaphore == vk::TRUE
    }

    /// Whether `pd` offers `VK_KHR_shader_integer_dot_product` with the
    /// `shaderIntegerDotProduct` feature (the packed 4x8-bit dot products
    /// of the int8 kernels, SPIR-V `OpSDot`).
    fn has_integer_dot(&self, pd: vk::PhysicalDevice) -> bool {
        // SAFETY: `pd` belongs to this instance; the query only fills its output.
        let exts = unsafe {
            self.instance
                .enumerate_device_extension_properties(pd)
                .unwrap_or_default()
        };
        let name = khr::shader_integer_dot_product::NAME;
        let listed = exts
            .iter()
            .any(|e| e.extension_name_as_c_str().is_ok_and(|n| n == name));
        if !listed {
            return false;
        }
        let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default();
        let mut f2 = vk::PhysicalDeviceFeatures2::default().push_next(&mut dot);
        // SAFETY: core 1.1 query; the chain lives here.
        unsafe { self.instance.get_physical_device_features2(pd, &mut f2) };
        dot.shader_integer_dot_product == vk::TRUE
    }
}

impl Drop for Instance {
    fn drop(&mut self) {
        // SAFETY: every child object (device, messenger) is destroyed before
        // this runs (Inner drops the device first); nothing uses them after.
        unsafe {
            if let Some((du, m)) = self.debug.take() {
                du.destroy_debug_utils_messenger(m, None);
            }
            self.instance.destroy_instance(None);
        }
    }
}

/// Lists the physical devices (a short-lived instance, no validation).
///
/// # Errors
/// [`VkError::Loader`] without a Vulkan loader; a failed instance creation.
pub fn enumerate() -> VkResult<Vec<PhysicalDeviceInfo>> {
    let inst = Instance::new(Validation::Off, false)?;
    Ok(inst.describe_all()?.into_iter().map(|(_, d)| d).collect())
}

/// A logical device with one compute queue. Cheap to clone (shared); `Send +
/// Sync`. Submissions go through [`Device::submit`] (see [`super::queue`]).
#[derive(Clone)]
pub struct Device(pub(crate) Arc<Inner>);

pub(crate) struct Inner {
    pub(crate) device: ash::Device,
    pub(crate) info: PhysicalDeviceInfo,
    pub(crate) family: u32,
    pub(crate) queue: QueueState,
    pub(crate) allocator: Mutex<ManuallyDrop<Allocator>>,
    pub(crate) fence_fd: Option<khr::external_fence_fd::Device>,
    pub(crate) limits: vk::PhysicalDeviceLimits,
    /// `(subgroupSize, the subgroup operations of the compute stage)` from
    /// `VkPhysicalDeviceSubgroupProperties` (empty operations when the
    /// compute stage has none, or they are masked).
    pub(crate) subgroup: (u32, vk::SubgroupFeatureFlags),
    /// What `XTC_VK_MASK` (or [`Device::open_with_mask`]) hides.
    pub(crate) mask: Mask,
    /// `timestampValidBits` of the compute queue family (0: no timestamps).
    pub(crate) timestamp_bits: u32,
    /// [`DeviceOptions::force_staging`].
    pub(crate) force_staging: bool,
    /// Memory types that are device-local and not host-visible (bit `i`:
    /// type `i`); 0 on a device whose memory is all host-visible (lavapipe).
    pub(crate) device_only_types: u32,
    /// The persisted pipeline cache ([`super::pipeline_cache`]).
    pub(crate) pipeline_cache: PipelineCache,
    /// `VK_KHR_shader_integer_dot_product` with `shaderIntegerDotProduct`
    /// is enabled on this device (SPIR-V `OpSDot` / `OpUDot` allowed).
    pub(crate) integer_dot: bool,
    instance: ManuallyDrop<Instance>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("info", &self.0.info)
            .finish_non_exhaustive()
    }
}

impl Device {
    /// Opens the device `sel` picks, with one compute queue, timeline
    /// semaphores and (where supported) `VK_KHR_external_fence_fd`. The
    /// Khronos validation layer runs as [`Validation::from_env`] says: core
    /// and synchronization validation in debug builds when installed;
    /// `XTC_VK_VALIDATION` (`0`, `1`/`sync`, `core`, `gpu`) chooses, and then
    /// a missing layer is an error. `XTC_VK_MASK` ([`Mask::from_env`], e.g.
    /// `subgroups`) hides capabilities the device has, to test the paths of
    /// a device without them.
    ///
    /// # Errors
    /// [`VkError::Loader`] / [`VkError::NoDevice`] (no Vulkan here),
    /// [`VkError::NoMatch`] (selector), [`VkError::Validation`] (validation
    /// requested and not installed, or a bad `XTC_VK_VALIDATION`),
    /// [`VkError::Mask`] (a bad `XTC_VK_MASK`), [`VkError::Inval`] (a bad
    /// `XTC_VK_FORCE_STAGING` or `XTC_VK_PIPELINE_CACHE`), a failed
    /// `vkCreateDevice`.
    ///
    /// The other variables of [`DeviceOptions::from_env`] apply too
    /// (`XTC_VK_FORCE_STAGING`, `XTC_VK_PIPELINE_CACHE`, `XTC_VK_MASK`).
    pub fn open(sel: &Selector) -> VkResult<Device> {
        Device::open_options(sel, &DeviceOptions::from_env()?)
    }

    /// As [`open`](Self::open), hiding what `mask` says whatever
    /// `XTC_VK_MASK` says (tests of the paths of a device without a
    /// capability, e.g. [`Mask::SUBGROUPS`]).
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub fn open_with_mask(sel: &Selector, mask: Mask) -> VkResult<Device> {
        let opts = DeviceOptions {
            mask,
            ..DeviceOptions::from_env()?
        };
        Device::open_options(sel, &opts)
    }

    /// As [`open`](Self::open), with `validation` whatever `XTC_VK_VALIDATION`
    /// says (tests that must run under the layer).
    ///
    /// # Errors
    /// As [`open`](Self::open); [`VkError::Validation`] when `validation` is
    /// not [`Validation::Off`] and the layer is not installed.
    pub fn open_with(sel: &Selector, validation: Validation) -> VkResult<Device> {
        let opts = DeviceOptions::from_env_but_validation((validation, true))?;
        Device::open_options(sel, &opts)
    }

    /// Opens the device `sel` picks as `opts` say, whatever the environment
    /// says (tests of forced staging, the pipeline cache and masks).
    ///
    /// # Errors
    /// As [`open`](Self::open); `vkCreatePipelineCache` failing on an empty
    /// cache (out of memory). A pipeline cache file that cannot be used is
    /// never an error (see [`crate::pipeline_cache`]).
    pub fn open_options(sel: &Selector, opts: &DeviceOptions) -> VkResult<Device> {
        let (validation, required) = opts.validation;
        let mask = opts.mask;
        let instance = Instance::new(validation, required)?;
        let all = instance.describe_all()?;
        let infos: Vec<_> = all.iter().map(|(_, d)| d.clone()).collect();
        let info = sel.choose(&infos)?.clone();
        let physical = all[info.index].0;
        let family = info.compute_family.ok_or(VkError::NoDevice)?;
        let integer_dot = instance.has_integer_dot(physical);
        let device = create_device(
            &instance.instance,
            physical,
            family,
            info.sync_fd_export,
            integer_dot,
        )?;
        let allocator = new_allocator(&instance.instance, &device, physical);
        let allocator = match allocator {
            Ok(a) => a,
            Err(e) => {
                // SAFETY: the device has no children yet.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        // SAFETY: `physical` belongs to the instance.
        let limits = unsafe { instance.instance.get_physical_device_properties(physical) }.limits;
        let mut sub = vk::PhysicalDeviceSubgroupProperties::default();
        let mut ids = vk::PhysicalDeviceIDProperties::default();
        let mut props = vk::PhysicalDeviceProperties2::default()
            .push_next(&mut sub)
            .push_next(&mut ids);
        // SAFETY: `physical` belongs to the instance (Vulkan 1.2); `props`
        // chains two live structs that outlive the call.
        unsafe {
            instance
                .instance
                .get_physical_device_properties2(physical, &mut props)
        };
        let pipeline_cache_uuid = props.properties.pipeline_cache_uuid;
        let compute = sub.supported_stages.contains(vk::ShaderStageFlags::COMPUTE);
        let subgroup = (
            sub.subgroup_size,
            if compute && !mask.subgroups {
                sub.supported_operations
            } else {
                vk::SubgroupFeatureFlags::empty()
            },
        );
        // SAFETY: `physical` belongs to the instance; the query only fills
        // its output.
        let families = unsafe {
            instance
                .instance
                .get_physical_device_queue_family_properties(physical)
        };
        let timestamp_bits = families
            .get(family as usize)
            .map_or(0, |f| f.timestamp_valid_bits);
        let cache_key = CacheKey {
            vendor_id: info.vendor_id,
            device_id: info.device_id,
            pipeline_cache_uuid,
            device_uuid: ids.device_uuid,
            driver_version: info.driver_version,
        };
        // SAFETY: `physical` belongs to the instance; the query fills its output.
        let mem = unsafe {
            instance
                .instance
                .get_physical_device_memory_properties(physical)
        };
        let device_only_types = device_only_types(&mem);
        let fence_fd = info
            .sync_fd_export
            .then(|| khr::external_fence_fd::Device::new(&instance.instance, &device));
        let cache = PipelineCache::open(&device, opts.pipeline_cache.as_deref(), &cache_key);
        let pipeline_cache = match cache {
            Ok(c) => c,
            Err(e) => {
                drop(allocator);
                // SAFETY: the allocator (the only child) is gone.
                unsafe { device.destroy_device(None) };
                return Err(e);
            }
        };
        let queue = match QueueState::new(&device, family) {
            Ok(q) => q,
            Err(e) => {
                drop(allocator);
                // SAFETY: the allocator is gone, the cache is destroyed before
                // the device and used by nothing; the queue state created
                // nothing that outlives its error.
                unsafe {
                    pipeline_cache.destroy(&device);
                    device.destroy_device(None);
                }
                return Err(e);
            }
        };
        Ok(Device(Arc::new(Inner {
            device,
            info,
            family,
            queue,
            allocator: Mutex::new(ManuallyDrop::new(allocator)),
            fence_fd,
            limits,
            subgroup,
            mask,
            timestamp_bits,
            force_staging: opts.force_staging,
            device_only_types,
            pipeline_cache,
            integer_dot,
            instance: ManuallyDrop::new(instance),
        })))
    }

    /// The physical device this was opened on.
    pub fn info(&self) -> &PhysicalDeviceInfo {
        &self.0.info
    }

    /// A process-unique identity of this logical device (while it lives).
    pub(crate) fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// Whether `self` and `other` are the same logical device.
    pub fn same(&self, other: &Device) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether the validation layer is active on this device.
    pub fn validation(&self) -> bool {
        self.0.instance.level != Validation::Off
    }

    /// What the validation layer checks on this device.
    pub fn validation_level(&self) -> Validation {
        self.0.instance.level
    }

    /// The raw `ash` device (for callers recording their own commands).
    pub fn raw(&self) -> &ash::Device {
        &self.0.device
    }

    /// Queue family index of the compute queue.
    pub fn queue_family(&self) -> u32 {
        self.0.family
    }

    /// `maxStorageBufferRange` in bytes.
    pub fn max_storage_buffer_range(&self) -> u64 {
        self.0.limits.max_storage_buffer_range.into()
    }

    /// `maxComputeWorkGroupCount`: the largest dispatch grid in x, y, z
    /// ([`super::Recorder::dispatch`] refuses larger ones).
    pub fn max_compute_work_group_count(&self) -> [u32; 3] {
        self.0.limits.max_compute_work_group_count
    }

    /// `(maxUniformBufferRange, minUniformBufferOffsetAlignment)` in bytes:
    /// the most a uniform window ([`super::Window`]) may cover, and the
    /// multiple its dynamic offsets must be.
    pub fn uniform_limits(&self) -> (u64, u64) {
        let l = &self.0.limits;
        (
            l.max_uniform_buffer_range.into(),
            l.min_uniform_buffer_offset_alignment.max(1),
        )
    }

    /// The compute stage's subgroup size when it supports the subgroup
    /// operations the quantized kernels' CPU form uses (basic, ballot:
    /// `subgroupBroadcast`, arithmetic: `subgroupAdd` / `Max` / `Min`), else
    /// `None` (also when [`Mask::subgroups`] hides them).
    pub fn subgroup_size(&self) -> Option<u32> {
        let (size, ops) = self.0.subgroup;
        let needed = vk::SubgroupFeatureFlags::BASIC
            | vk::SubgroupFeatureFlags::BALLOT
            | vk::SubgroupFeatureFlags::ARITHMETIC;
        ops.contains(needed).then_some(size)
    }

    /// The subgroup operations (`VkSubgroupFeatureFlags`) the compute stage
    /// supports: `supportedOperations` of `VkPhysicalDeviceSubgroupProperties`
    /// when `supportedStages` includes compute, else empty; empty as well
    /// when [`Mask::subgroups`] hides them. [`super::Kernels::new`] builds an
    /// entry point only when its operations are among these.
    pub fn subgroup_operations(&self) -> vk::SubgroupFeatureFlags {
        self.0.subgroup.1
    }

    /// What this device hides ([`Device::open_with_mask`], `XTC_VK_MASK`).
    pub fn mask(&self) -> Mask {
        self.0.mask
    }

    /// Whether the device runs packed 4x8-bit integer dot products
    /// (`VK_KHR_shader_integer_dot_product` offered with
    /// `shaderIntegerDotProduct`, and enabled at open): the int8 kernels'
    /// `OpSDot` entry points (`qmm8_*` without `_poly`) need it; their
    /// `_poly` twins do not.
    pub fn integer_dot_product(&self) -> bool {
        self.0.integer_dot
    }

    /// Nanoseconds per timestamp tick (`timestampPeriod`), or `None` when
    /// the compute queue cannot write timestamps (its family's
    /// `timestampValidBits` is 0).
    pub fn timestamp_period(&self) -> Option<f64> {
        (self.0.timestamp_bits > 0).then_some(f64::from(self.0.limits.timestamp_period))
    }

    /// `timestampValidBits` of the compute queue family: timestamps count
    /// modulo `2^bits` (36 to 64 where supported, 0 where not).
    pub fn timestamp_valid_bits(&self) -> u32 {
        self.0.timestamp_bits
    }

    /// `(maxImageDimension2D, maxImageArrayLayers)`: the largest
    /// [`super::StorageImage`] side and layer count.
    pub fn image_limits(&self) -> (u32, u32) {
        let l = &self.0.limits;
        (l.max_image_dimension2_d, l.max_image_array_layers)
    }

    /// Whether [`Location::Device`](crate::Location::Device) buffers refuse
    /// host-visible memory ([`DeviceOptions::force_staging`]), so their
    /// uploads ([`Buffer::upload`](crate::Buffer::upload)) and readbacks
    /// ([`Buffer::download`](crate::Buffer::download)) go through staging
    /// buffers and copies on the queue. Where the device has device-local
    /// memory that is not host-visible (a discrete GPU) such buffers get
    /// that memory; where all its memory is host-visible (lavapipe) they get
    /// it anyway but the mapping is hidden, so the same staging paths run.
    pub fn force_staging(&self) -> bool {
        self.0.force_staging
    }

    /// Whether the device has a memory type that is device-local and not
    /// host-visible (what forced staging allocates from, where it exists).
    pub fn has_device_only_memory(&self) -> bool {
        self.0.device_only_types != 0
    }

    /// What happened to the persisted pipeline cache when the device opened
    /// (off, fresh, loaded, or ignored and why).
    pub fn pipeline_cache_state(&self) -> &CacheState {
        &self.0.pipeline_cache.state
    }

    /// Writes the device's pipeline cache to its file if it changed since it
    /// was read or last written ([`Kernels::new`](crate::Kernels::new) calls
    /// it after building its pipelines). Returns the bytes written, `None`
    /// when the cache is off or unchanged.
    ///
    /// # Errors
    /// The I/O error of creating the directory, writing the temporary file
    /// or renaming it (the old file, if any, stays whole).
    pub fn save_pipeline_cache(&self) -> std::io::Result<Option<usize>> {
        self.0.pipeline_cache.save(&self.0.device)
    }

    /// The raw pipeline cache for `vkCreateComputePipelines`.
    pub(crate) fn raw_pipeline_cache(&self) -> vk::PipelineCache {
        self.0.pipeline_cache.raw
    }

    /// Allocates memory from the device's allocator.
    pub(crate) fn allocate(
        &self,
        desc: &gpu_allocator::vulkan::AllocationCreateDesc<'_>,
    ) -> VkResult<gpu_allocator::vulkan::Allocation> {
        self.0
            .allocator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .allocate(desc)
            .map_err(super::map_alloc_err)
    }

    /// Returns memory to the device's allocator.
    pub(crate) fn free(&self, a: gpu_allocator::vulkan::Allocation) {
        let _ = self
            .0
            .allocator
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .free(a);
    }

    /// Waits until the queue is idle.
    ///
    /// # Errors
    /// A failed `vkQueueWaitIdle` (device lost).
    pub fn wait_idle(&self) -> VkResult<()> {
        self.0.queue.wait_idle(&self.0.device)
    }
}

fn create_device(
    inst: &ash::Instance,
    pd: vk::PhysicalDevice,
    family: u32,
    fence_fd: bool,
    integer_dot: bool,
) -> VkResult<ash::Device> {
    let prio = [1.0f32];
    let queues = [vk::DeviceQueueCreateInfo::default()
        .queue_family_index(family)
        .queue_priorities(&prio)];
    let mut exts = vec![];
    if fence_fd {
        exts.push(khr::external_fence_fd::NAME.as_ptr());
    }
    if integer_dot {
        exts.push(khr::shader_integer_dot_product::NAME.as_ptr());
    }
    let mut f12 = vk::PhysicalDeviceVulkan12Features::default().timeline_semaphore(true);
    let mut dot = vk::PhysicalDeviceShaderIntegerDotProductFeatures::default()
        .shader_integer_dot_product(true);
    let mut info = vk::DeviceCreateInfo::default()
        .queue_create_infos(&queues)
        .enabled_extension_names(&exts)
        .push_next(&mut f12);
    if integer_dot {
        info = info.push_next(&mut dot);
    }
    // SAFETY: `pd` belongs to `inst`; `info` and its arrays/chain live across the call.
    unsafe { inst.create_device(pd, &info, None) }.map_err(call("vkCreateDevice"))
}

/// The memory types of `mem` that are device-local and not host-visible.
fn device_only_types(mem: &vk::PhysicalDeviceMemoryProperties) -> u32 {
    let types = &mem.memory_types[..mem.memory_type_count as usize];
    types
        .iter()
        .enumerate()
        .filter(|(_, t)| {
            t.property_flags
                .contains(vk::MemoryPropertyFlags::DEVICE_LOCAL)
                && !t
                    .property_flags
                    .contains(vk::MemoryPropertyFlags::HOST_VISIBLE)
        })
        .fold(0, |bits, (i, _)| bits | (1 << i))
}

fn new_allocator(
    inst: &ash::Instance,
    dev: &ash::Device,
    pd: vk::PhysicalDevice,
) -> VkResult<Allocator> {
    const MB: u64 = 1 << 20;
    Allocator::new(&AllocatorCreateDesc {
        instance: inst.clone(),
        device: dev.clone(),
        physical_device: pd,
        debug_settings: Default::default(),
        buffer_device_address: false,
        allocation_sizes: gpu_allocator::AllocationSizes::new(16 * MB, 16 * MB)
            .with_max_device_memblock_size(256 * MB)
            .with_max_host_memblock_size(64 * MB),
    })
    .map_err(super::map_alloc_err)
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.queue.shutdown(&self.device);
        // SAFETY: every Buffer/Kernels/CommandPool holds an Arc<Inner>, so none
        // is alive here; the queue is idle and the waiter thread has exited.
        // Children go first: queue objects, the allocator, the device, then the
        // instance (whose Drop destroys the messenger).
        unsafe {
            self.queue.destroy(&self.device);
            self.pipeline_cache.destroy(&self.device);
            ManuallyDrop::drop(self.allocator.get_mut().unwrap_or_else(|p| p.into_inner()));
            self.device.destroy_device(None);
            ManuallyDrop::drop(&mut self.instance);
        }
    }
}

/// `CString` of a kernel entry point name.
pub(crate) fn c_name(name: &str) -> VkResult<CString> {
    CString::new(name).map_err(|_| VkError::Inval(format!("entry point name {name:?}")))
}

#[cfg(test)]
mod tests;
