//! `accel`: render/accel node discovery and fences.
//!
//! - [`probe`] / [`probe_in`] list `/dev/dri/renderD*` and `/dev/accel/accel*`
//!   with driver, PCI address and ids, NUMA node and local CPUs (the
//!   `xtc_accel_probe` of `xtc_batch(3)`, used by B-160's placement helper).
//!   Every path is resolved under an injectable root ([`node::Rooted`]), so the
//!   fixture trees in `devices/` stand in for real hosts.
//! - [`SyncFile`]: an owned sync_file fd (wait, poll readiness, merge, info);
//!   an "already signalled" export (fd -1) is a signalled fence, not an error.
//! - [`EventFence`]: an eventfd fence for drivers that cannot export sync_file
//!   (lavapipe, the emulated NPU).
//!
//! # Defined answers for bad sysfs
//! The probe never panics and never fails because one node is odd. A field it
//! cannot establish is `None` and [`Device::notes`] says why:
//!
//! | `device/numa_node`             | `numa_node` | note                                   |
//! |--------------------------------|-------------|----------------------------------------|
//! | `1` (node 1 online)            | `Some(1)`   | —                                      |
//! | `-1`                           | `None`      | `numa_node: -1 (no NUMA affinity)`     |
//! | missing                        | `None`      | `numa_node: missing`                   |
//! | empty                          | `None`      | `numa_node: empty`                     |
//! | garbage                        | `None`      | `numa_node: unparsable "..."`          |
//! | beyond the online nodes        | `None`      | `numa_node: 7 is not an online node (online: 0-1)` |
//! | symlink loop                   | `None`      | `numa_node: unreadable: ... (os error 40)` |
//! | a FIFO, device node or directory | `None`    | `numa_node: unreadable: not a regular file` |
//!
//! A node that cannot be opened (missing under `/dev`, permission denied, a
//! plain file in a fixture) keeps its sysfs facts and carries the reason in
//! [`Device::open_error`]. The driver name comes from `DRM_IOCTL_VERSION`
//! (through the `drm` crate) when the node opens, else from the sysfs
//! `device/driver` link, else from `device/uevent`'s `DRIVER=`
//! ([`Device::driver_source`] says which).

pub mod event_fence;
pub mod node;
pub mod sync_file;
mod sys;
pub mod sysfs;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use event_fence::EventFence;
pub use node::NodeKind;
pub use sync_file::{FenceError, FenceInfo, FenceStatus, SyncFile, SyncFileInfo};

use node::{Opened, Rooted};
use sysfs::{NumaNode, ParseError};

/// PCI facts of a device on the PCI bus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PciInfo {
    /// Bus address `DDDD:BB:SS.F` (e.g. `0000:65:00.0`).
    pub address: String,
    /// Vendor id (`device/vendor`, e.g. 0x10de NVIDIA), when readable.
    pub vendor_id: Option<u16>,
    /// Device id (`device/device`), when readable.
    pub device_id: Option<u16>,
}

/// Where [`Device::driver`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DriverSource {
    /// `DRM_IOCTL_VERSION` on the open node.
    Ioctl,
    /// The sysfs `device/driver` symlink's target name.
    SysfsLink,
    /// `DRIVER=` in `device/uevent`.
    Uevent,
}

/// One render or accel node as the probe found it.
///
/// Paths are logical: `dev_path` is where the node lives on the probed system
/// (`/dev/dri/renderD128`), whatever root the probe read it under.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Device {
    /// Short label: `renderD128`, `accel0`.
    pub name: String,
    /// Render or accel node.
    pub kind: NodeKind,
    /// Device node path (`/dev/dri/renderD128`, `/dev/accel/accel0`).
    pub dev_path: PathBuf,
    /// Kernel driver name (`nvidia`, `i915`, `amdgpu`, `intel_vpu`), if known.
    pub driver: Option<String>,
    /// PCI address and ids; `None` for a device not on PCI (platform bus).
    pub pci: Option<PciInfo>,
    /// NUMA node from `device/numa_node`, only when it names an online node
    /// (B-161); `None` for -1 and every bad value (see the module table).
    pub numa_node: Option<u32>,
    /// CPUs local to the device (`device/local_cpulist`, else the cpulist of
    /// its NUMA node), sorted.
    pub local_cpus: Option<Vec<u32>>,
    /// Why the node could not be opened (`missing: ...`, `permission denied:
    /// ...`, `not a character device: ...`); `None` when it opened.
    pub open_error: Option<String>,
    /// Where `driver` came from.
    #[serde(default)]
    pub driver_source: Option<DriverSource>,
    /// Diagnostics for fields left `None` (bad or missing sysfs content).
    #[serde(default)]
    pub notes: Vec<String>,
}

/// NUMA layout of the probed host (`sys/devices/system/node`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostNuma {
    /// Online nodes (`node/online`); `None` when the host exposes no NUMA
    /// information (a kernel without NUMA, many VMs) or it is unreadable.
    pub online: Option<Vec<u32>>,
    /// CPUs of each node (`nodeN/cpulist`) that could be read.
    pub node_cpus: BTreeMap<u32, Vec<u32>>,
}

impl HostNuma {
    /// Reads the host's node layout under `root`. Never fails: unreadable or
    /// malformed files leave the corresponding parts empty.
    pub fn read(root: &Path) -> HostNuma {
        let fs = Rooted::new(root);
        let base = "sys/devices/system/node";
        let online = fs
            .read_attr(format!("{base}/online"))
            .ok()
            .flatten()
            .and_then(|t| sysfs::parse_cpulist(&t).ok())
            .filter(|v| !v.is_empty());
        let mut node_cpus = BTreeMap::new();
        for name in fs.list_dir(base).unwrap_or_default() {
            let Ok(n) = sysfs::parse_node_dir(&name) else {
                continue;
            };
            let text = fs.read_attr(format!("{base}/{name}/cpulist"));
            if let Some(cpus) = text
                .ok()
                .flatten()
                .and_then(|t| sysfs::parse_cpulist(&t).ok())
            {
                node_cpus.insert(n, cpus);
            }
        }
        HostNuma { online, node_cpus }
    }

    /// Number of NUMA nodes online; 1 when the host gives no NUMA information.
    pub fn n_nodes(&self) -> usize {
        self.online.as_ref().map_or(1, |v| v.len().max(1))
    }

    /// Checks a parsed `numa_node` against the online nodes.
    ///
    /// # Errors
    /// [`NumaError::NoAffinity`] for `-1`, [`NumaError::Offline`] for a node
    /// that is not online (when the host lists its online nodes).
    pub fn check(&self, node: NumaNode) -> Result<u32, NumaError> {
        match (node, &self.online) {
            (NumaNode::NoNode, _) => Err(NumaError::NoAffinity),
            (NumaNode::Node(n), Some(online)) if !online.contains(&n) => Err(NumaError::Offline {
                node: n,
                online: online.clone(),
            }),
            (NumaNode::Node(n), _) => Ok(n),
        }
    }
}

/// Why a node has no usable `numa_node` (its text becomes one of the
/// device's [`Device::notes`]; the placement then falls back to loop 0,
/// B-163).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NumaError {
    /// The attribute is absent.
    #[error("numa_node: missing")]
    Missing,
    /// The attribute exists but could not be read; carries the I/O error's text.
    #[error("numa_node: unreadable: {0}")]
    Unreadable(String),
    /// The attribute does not parse ([`ParseError::Empty`] included).
    #[error("numa_node: {0}")]
    Parse(ParseError),
    /// `-1`: the device has no NUMA affinity.
    #[error("numa_node: -1 (no NUMA affinity)")]
    NoAffinity,
    /// A node number the host does not list as online.
    #[error("numa_node: {node} is not an online node (online: {list})", list = sysfs::format_cpulist(.online))]
    Offline {
        /// The node the attribute names.
        node: u32,
        /// The host's online nodes.
        online: Vec<u32>,
    },
}

/// Why the probe as a whole failed (one bad node never fails it).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    /// The root is not a readable directory.
    #[error("probe root {path:?} is not a directory")]
    Root {
        /// The root given.
        path: PathBuf,
    },
    /// A node directory (`dev/dri`, `sys/class/drm`, ...) exists but cannot be listed.
    #[error("cannot {op} {path:?}: {source}")]
    Io {
        /// What was being done (`list`).
        op: &'static str,
        /// The path, relative to the root.
        path: PathBuf,
        /// The I/O error.
        source: io::Error,
    },
}

impl From<ProbeError> for crate::Error {
    fn from(e: ProbeError) -> crate::Error {
        match e {
            ProbeError::Root { .. } => crate::Error::Inval,
            ProbeError::Io { .. } => crate::Error::Internal,
        }
    }
}

/// Probes the live system (root `/`). See [`probe_in`].
///
/// # Errors
/// As [`probe_in`].
pub fn probe() -> Result<Vec<Device>, ProbeError> {
    probe_in(Path::new("/"))
}

/// Lists the render and accel nodes of the system rooted at `root`: every
/// `renderD*`/`accel*` name under `dev/dri`, `dev/accel`, `sys/class/drm` or
/// `sys/class/accel`, sorted by kind then number. An empty list is a normal
/// answer (no accelerator).
///
/// # Errors
/// [`ProbeError::Root`] when `root` is not a directory; [`ProbeError::Io`]
/// when one of those four directories exists but cannot be listed.
pub fn probe_in(root: &Path) -> Result<Vec<Device>, ProbeError> {
    if !root.is_dir() {
        return Err(ProbeError::Root {
            path: root.to_path_buf(),
        });
    }
    let fs = Rooted::new(root);
    let host = HostNuma::read(root);
    let mut nodes = Vec::new();
    for kind in [NodeKind::Render, NodeKind::Accel] {
        for dir in [kind.dev_dir(), kind.class_dir()] {
            let names = fs.list_dir(dir).map_err(|source| ProbeError::Io {
                op: "list",
                path: dir.into(),
                source,
            })?;
            nodes.extend(
                names
                    .iter()
                    .filter_map(|n| node::parse_node_name(n))
                    .filter(|&(k, _)| k == kind),
            );
        }
    }
    nodes.sort_unstable();
    nodes.dedup();
    Ok(nodes
        .into_iter()
        .map(|(kind, n)| probe_node(&fs, &host, kind, n))
        .collect())
}

fn probe_node(fs: &Rooted, host: &HostNuma, kind: NodeKind, number: u32) -> Device {
    let name = format!("{}{number}", kind.prefix());
    let sys = format!("{}/{name}/device", kind.class_dir());
    let mut dev = Device {
        dev_path: PathBuf::from(format!("/{}/{name}", kind.dev_dir())),
        name,
        kind,
        driver: None,
        pci: None,
        numa_node: None,
        local_cpus: None,
        open_error: None,
        driver_source: None,
        notes: Vec::new(),
    };
    let uevent = fs
        .read_attr(format!("{sys}/uevent"))
        .ok()
        .flatten()
        .map(|t| sysfs::parse_uevent(&t))
        .unwrap_or_default();
    dev.numa_node = read_numa(fs, host, &sys)
        .map_err(|n| dev.notes.push(n.to_string()))
        .ok();
    dev.pci = read_pci(fs, &sys, &uevent);
    dev.local_cpus = read_local_cpus(fs, host, &sys, dev.numa_node);
    fill_driver(fs, &sys, &uevent, &mut dev);
    dev
}

fn read_numa(fs: &Rooted, host: &HostNuma, sys: &str) -> Result<u32, NumaError> {
    let text = match fs.read_attr(format!("{sys}/numa_node")) {
        Ok(Some(t)) => t,
        Ok(None) => return Err(NumaError::Missing),
        Err(e) => return Err(NumaError::Unreadable(e.to_string())),
    };
    host.check(sysfs::parse_numa_node(&text).map_err(NumaError::Parse)?)
}

/// PCI facts: the nearest PCI device at or above the node's `device` (a
/// virtio-gpu node's device is `virtio0`, whose parent is the PCI function),
/// else `PCI_SLOT_NAME` from the uevent.
fn read_pci(fs: &Rooted, sys: &str, uevent: &sysfs::Uevent) -> Option<PciInfo> {
    let id = |dir: &Path, attr: &str| {
        let text = fs.read_attr(dir.join(attr)).ok().flatten()?;
        sysfs::parse_hex_id(&text).ok()
    };
    if let Some((dir, address)) = pci_ancestor(fs, sys) {
        return Some(PciInfo {
            address: address.to_string(),
            vendor_id: id(&dir, "vendor"),
            device_id: id(&dir, "device"),
        });
    }
    let address = sysfs::parse_pci_address(uevent.pci_slot.as_deref()?).ok()?;
    Some(PciInfo {
        address: address.to_string(),
        vendor_id: uevent.pci_id.map(|p| p.0),
        device_id: uevent.pci_id.map(|p| p.1),
    })
}

/// The resolved device directory or its nearest ancestor named like a PCI
/// address, as a root-relative path.
fn pci_ancestor(fs: &Rooted, sys: &str) -> Option<(PathBuf, sysfs::PciAddress)> {
    let resolved = fs.resolve(sys).ok()?;
    let rel = resolved.strip_prefix(fs.root()).ok()?;
    rel.ancestors().find_map(|dir| {
        let name = dir.file_name()?.to_str()?;
        sysfs::parse_pci_address(name)
            .ok()
            .map(|a| (dir.to_path_buf(), a))
    })
}

fn read_local_cpus(fs: &Rooted, host: &HostNuma, sys: &str, node: Option<u32>) -> Option<Vec<u32>> {
    let local = fs
        .read_attr(format!("{sys}/local_cpulist"))
        .ok()
        .flatten()
        .and_then(|t| sysfs::parse_cpulist(&t).ok())
        .filter(|v| !v.is_empty());
    local.or_else(|| host.node_cpus.get(&node?).cloned())
}

fn fill_driver(fs: &Rooted, sys: &str, uevent: &sysfs::Uevent, dev: &mut Device) {
    match node::open_node(fs, &dev.dev_path, dev.kind) {
        Opened::Node(file) => match file.driver_name() {
            Ok(name) => {
                dev.driver = Some(name);
                dev.driver_source = Some(DriverSource::Ioctl);
                return;
            }
            Err(e) => dev.notes.push(format!("DRM_IOCTL_VERSION failed: {e}")),
        },
        Opened::Failed(why) => dev.open_error = Some(why),
    }
    if let Ok(Some(name)) = fs.link_name(format!("{sys}/driver")) {
        dev.driver = Some(name);
        dev.driver_source = Some(DriverSource::SysfsLink);
    } else if let Some(name) = &uevent.driver {
        dev.driver = Some(name.clone());
        dev.driver_source = Some(DriverSource::Uevent);
    }
}

/// Re-reads `dev`'s NUMA node from static sysfs under `root` (B-161):
/// `sys/class/drm/<name>/device/numa_node` for a render node,
/// `sys/class/accel/<name>/device/numa_node` for an accel node. `None` when
/// the name is no node label of `dev.kind`, the value is -1, unreadable,
/// malformed, or not an online node. Touches no clock or random source, so it
/// is safe under `rt::Sim` (B-167); it does file I/O, so keep it off hot paths.
pub fn device_numa_node(root: &Path, dev: &Device) -> Option<u32> {
    let (kind, _) = node::parse_node_name(&dev.name).filter(|&(k, _)| k == dev.kind)?;
    let sys = format!("{}/{}/device", kind.class_dir(), dev.name);
    read_numa(&Rooted::new(root), &HostNuma::read(root), &sys).ok()
}
