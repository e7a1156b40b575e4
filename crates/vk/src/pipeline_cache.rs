//! The persisted `VkPipelineCache`: one per [`Device`](crate::Device), read
//! when the device opens and written back after [`Kernels`](crate::Kernels)
//! built its pipelines, so a second process (every `xtc ci` child, every
//! command) does not compile the ~100 kernels again where the driver caches.
//!
//! The file is `<dir>/<deviceUUID>-<driverVersion>.bin` (hex), where `<dir>`
//! is [`DeviceOptions::pipeline_cache`](crate::DeviceOptions::pipeline_cache)
//! (by default `${XDG_CACHE_HOME:-$HOME/.cache}/xtc/pipelines`), holding
//! exactly what `vkGetPipelineCacheData` returned. Before the driver sees a
//! file, its header is checked as the Vulkan specification lays it out
//! (`VkPipelineCacheHeaderVersionOne`, least significant byte first: header
//! size 32, header version 1, vendor id, device id, `pipelineCacheUUID`)
//! against this device. A file that is short, corrupt, of another device or
//! driver, unreadable, or that the driver refuses is ignored with a warning
//! on stderr and replaced at the next save: never a failure. Writes go to a
//! temporary file in the same directory, then `rename(2)` over the old one,
//! so concurrent processes never see half a file.
//!
//! # Safety
//! Raw Vulkan calls on the owning device's cache: the cache is created once
//! at open, is internally synchronized (created without
//! `EXTERNALLY_SYNCHRONIZED`), and is destroyed in the device's `Drop`, after
//! every pipeline made with it.
#![allow(unsafe_code)]

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ash::vk;

use crate::{VkResult, call};

/// Bytes of `VkPipelineCacheHeaderVersionOne`.
pub const HEADER_BYTES: usize = 32;

/// What the device's identity says a pipeline cache file must carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheKey {
    /// PCI vendor id (`VkPhysicalDeviceProperties::vendorID`).
    pub vendor_id: u32,
    /// Device id (`deviceID`).
    pub device_id: u32,
    /// `pipelineCacheUUID`: changes with the driver's compiler.
    pub pipeline_cache_uuid: [u8; 16],
    /// `deviceUUID` of `VkPhysicalDeviceIDProperties` (names the file).
    pub device_uuid: [u8; 16],
    /// `driverVersion` (names the file).
    pub driver_version: u32,
}

impl CacheKey {
    /// The file name of this device's cache: `<deviceUUID>-<driverVersion>.bin`
    /// in lowercase hex.
    pub fn file_name(&self) -> String {
        format!("{}-{:08x}.bin", hex(&self.device_uuid), self.driver_version)
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Why a pipeline cache file was not used.
#[derive(Debug, thiserror::Error)]
pub enum CacheRejected {
    /// Shorter than the header.
    #[error("{0} bytes, shorter than the {HEADER_BYTES}-byte header")]
    Short(usize),
    /// `headerSize` is not 32.
    #[error("header size {0}, expected {HEADER_BYTES}")]
    HeaderSize(u32),
    /// `headerVersion` is not `VK_PIPELINE_CACHE_HEADER_VERSION_ONE`.
    #[error("header version {0}, expected 1 (VK_PIPELINE_CACHE_HEADER_VERSION_ONE)")]
    Version(u32),
    /// Made on a device of another vendor or model.
    #[error(
        "vendor/device id {found_vendor:#x}/{found_device:#x}, this device is {vendor:#x}/{device:#x}"
    )]
    Device {
        /// The file's vendor id.
        found_vendor: u32,
        /// The file's device id.
        found_device: u32,
        /// This device's vendor id.
        vendor: u32,
        /// This device's device id.
        device: u32,
    },
    /// Made by another driver build (`pipelineCacheUUID` differs).
    #[error("pipelineCacheUUID {found}, this driver's is {expected}")]
    Uuid {
        /// The file's, in hex.
        found: String,
        /// This driver's, in hex.
        expected: String,
    },
    /// The file could not be read.
    #[error("unreadable: {0}")]
    Read(std::io::Error),
    /// The driver refused the data (`vkCreatePipelineCache`).
    #[error("the driver refused it: {0}")]
    Driver(vk::Result),
}

/// Checks `data`'s `VkPipelineCacheHeaderVersionOne` against `key`.
///
/// # Errors
/// The first field that does not match, as a [`CacheRejected`].
pub fn check_header(data: &[u8], key: &CacheKey) -> Result<(), CacheRejected> {
    if data.len() < HEADER_BYTES {
        return Err(CacheRejected::Short(data.len()));
    }
    let word = |i: usize| u32::from_le_bytes([data[i], data[i + 1], data[i + 2], data[i + 3]]);
    let (size, version, vendor, device) = (word(0), word(4), word(8), word(12));
    if size as usize != HEADER_BYTES {
        return Err(CacheRejected::HeaderSize(size));
    }
    if version != 1 {
        return Err(CacheRejected::Version(version));
    }
    if vendor != key.vendor_id || device != key.device_id {
        return Err(CacheRejected::Device {
            found_vendor: vendor,
            found_device: device,
            vendor: key.vendor_id,
            device: key.device_id,
        });
    }
    if data[16..32] != key.pipeline_cache_uuid {
        return Err(CacheRejected::Uuid {
            found: hex(&data[16..32]),
            expected: hex(&key.pipeline_cache_uuid),
        });
    }
    Ok(())
}

/// What happened to the cache file when the device opened.
#[derive(Debug)]
pub enum CacheState {
    /// No pipeline cache directory (turned off): nothing read or written.
    Off,
    /// No file yet (the first run on this device and driver): an empty cache.
    Fresh,
    /// The file was valid and given to the driver.
    Loaded {
        /// Its size in bytes (header included).
        bytes: usize,
    },
    /// The file was ignored (warned about on stderr); an empty cache instead.
    Ignored(CacheRejected),
}

/// The device's pipeline cache and where it persists.
pub(crate) struct PipelineCache {
    pub(crate) raw: vk::PipelineCache,
    path: Option<PathBuf>,
    pub(crate) state: CacheState,
    /// Hash of the data last read or written (saves only what changed).
    last: Mutex<Option<u64>>,
}

fn hash(data: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

impl PipelineCache {
    /// Creates the device's cache, seeded from `dir`'s file for `key` when
    /// that file is valid.
    pub(crate) fn open(
        d: &ash::Device,
        dir: Option<&Path>,
        key: &CacheKey,
    ) -> VkResult<PipelineCache> {
        let path = dir.map(|d| d.join(key.file_name()));
        let (seed, mut state) = match &path {
            None => (None, CacheState::Off),
            Some(p) => match std::fs::read(p) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, CacheState::Fresh),
                Err(e) => (None, CacheState::Ignored(CacheRejected::Read(e))),
                Ok(data) => match check_header(&data, key) {
                    Ok(()) => {
                        let bytes = data.len();
                        (Some(data), CacheState::Loaded { bytes })
                    }
                    Err(why) => (None, CacheState::Ignored(why)),
                },
            },
        };
        let mut raw = match &seed {
            Some(data) => create(d, data),
            None => create(d, &[]),
        };
        if let (Err(e), Some(_)) = (&raw, &seed) {
            state = CacheState::Ignored(CacheRejected::Driver(*e));
            raw = create(d, &[]);
        }
        let raw = raw.map_err(call("vkCreatePipelineCache"))?;
        if let (CacheState::Ignored(why), Some(p)) = (&state, &path) {
            eprintln!(
                "warning: pipeline cache {} ignored ({why}); pipelines are compiled afresh and the file rewritten",
                p.display()
            );
        }
        let last = seed.as_deref().map(hash);
        Ok(PipelineCache {
            raw,
            path,
            state,
            last: Mutex::new(last),
        })
    }

    /// Writes the cache's data to its file when it changed since it was read
    /// or last written; returns the bytes written (`None`: off or unchanged).
    pub(crate) fn save(&self, d: &ash::Device) -> std::io::Result<Option<usize>> {
        let Some(path) = &self.path else {
            return Ok(None);
        };
        // SAFETY: `raw` is this device's live cache, internally synchronized.
        let data = unsafe { d.get_pipeline_cache_data(self.raw) }
            .map_err(|e| std::io::Error::other(format!("vkGetPipelineCacheData: {e}")))?;
        let h = hash(&data);
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if *last == Some(h) {
            return Ok(None);
        }
        write_atomically(path, &data)?;
        *last = Some(h);
        Ok(Some(data.len()))
    }

    /// Destroys the cache.
    ///
    /// # Safety
    /// No pipeline creation uses it any more (the device is being dropped).
    pub(crate) unsafe fn destroy(&self, d: &ash::Device) {
        // SAFETY: the caller guarantees no use remains.
        unsafe { d.destroy_pipeline_cache(self.raw, None) };
    }
}

fn create(d: &ash::Device, data: &[u8]) -> Result<vk::PipelineCache, vk::Result> {
    let info = vk::PipelineCacheCreateInfo::default().initial_data(data);
    // SAFETY: `info` and `data` live across the call; the data's header was
    // checked against this device (an empty slice makes an empty cache).
    unsafe { d.create_pipeline_cache(&info, None) }
}

/// Writes `data` to `path` through a temporary file in the same directory
/// (created if missing) and `rename(2)`.
fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let tmp = dir.join(format!(".{name}.{}.{nanos}.tmp", std::process::id()));
    let written = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(data)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CacheKey {
        CacheKey {
            vendor_id: 0x10005,
            device_id: 0,
            pipeline_cache_uuid: *b"0123456789abcdef",
            device_uuid: [7; 16],
            driver_version: 0x0040_3006,
        }
    }

    fn header(k: &CacheKey) -> Vec<u8> {
        let mut h = vec![];
        for w in [32u32, 1, k.vendor_id, k.device_id] {
            h.extend_from_slice(&w.to_le_bytes());
        }
        h.extend_from_slice(&k.pipeline_cache_uuid);
        h
    }

    #[test]
    fn header_is_checked_field_by_field() {
        let k = key();
        let good = header(&k);
        check_header(&good, &k).unwrap();
        assert!(matches!(
            check_header(&good[..31], &k),
            Err(CacheRejected::Short(31))
        ));
        let mut bad = good.clone();
        bad[0] = 16;
        assert!(matches!(
            check_header(&bad, &k),
            Err(CacheRejected::HeaderSize(16))
        ));
        let mut bad = good.clone();
        bad[4] = 2;
        assert!(matches!(
            check_header(&bad, &k),
            Err(CacheRejected::Version(2))
        ));
        let mut bad = good.clone();
        bad[12] = 1;
        assert!(matches!(
            check_header(&bad, &k),
            Err(CacheRejected::Device {
                found_device: 1,
                ..
            })
        ));
        let mut bad = good;
        bad[31] ^= 1;
        assert!(matches!(
            check_header(&bad, &k),
            Err(CacheRejected::Uuid { .. })
        ));
    }

    #[test]
    fn file_name_is_device_uuid_and_driver_version() {
        assert_eq!(
            key().file_name(),
            "07070707070707070707070707070707-00403006.bin"
        );
    }

    #[test]
    fn atomic_write_replaces_the_file_and_leaves_no_temporary() {
        let dir = std::env::temp_dir().join(format!("xtc-pc-unit-{}", std::process::id()));
        let path = dir.join("sub").join("x.bin");
        write_atomically(&path, b"one").unwrap();
        write_atomically(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        let left = std::fs::read_dir(path.parent().unwrap()).unwrap().count();
        assert_eq!(left, 1, "only the file itself");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
