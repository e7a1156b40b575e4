//! `xtc probe`: list render and accel nodes with driver, PCI address, NUMA
//! node, local CPUs, and the executor loop each would be placed on
//! (`batch::place`, B-160..B-165), then the Vulkan-visible devices.
//!
//! On the live system the loops' nodes are those a real `rt::Executor`'s
//! carriers record; with `--sysfs-root DIR` (a fixture tree such as
//! `devices/<name>`, probed instead of `/`) they are modelled round-robin over
//! the tree's online nodes.
//! `--json` prints one JSON object ([`ProbeReport`]) for machines. Exit
//! status 0 when the probe ran (finding no node is a normal answer), 1 when
//! it could not (bad root).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use xtc::accel::{self, Device, HostNuma, ProbeError, sysfs::format_cpulist};
use xtc::batch::place;
use xtc::rt::Executor;

/// Arguments of `xtc probe`.
#[derive(Debug, Clone, Args)]
pub struct ProbeArgs {
    /// Number of executor loops to place the devices on.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub loops: u32,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Probe the tree under DIR (e.g. `devices/nvidia-2node`) instead of `/`.
    #[arg(long, value_name = "DIR")]
    pub sysfs_root: Option<PathBuf>,
    /// Skip listing Vulkan-visible devices (always skipped with --sysfs-root).
    #[arg(long)]
    pub no_vulkan: bool,
}

/// Where the loops' NUMA nodes in a report come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopNodesSource {
    /// Recorded by the carriers of a real `rt::Executor` with `--loops`
    /// loops, created for the probe (live system only; carriers are not
    /// pinned, so each records the node it started on).
    Executor,
    /// Carriers spread round-robin over the online nodes (loop `i` on the
    /// `i mod n`-th online node); all unknown on a host without NUMA information.
    RoundRobinModel,
}

/// One device and its placement.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceReport {
    /// What the probe found.
    #[serde(flatten)]
    pub device: Device,
    /// The loop `batch::place` picks for it, in `[0, loops)`.
    pub loop_idx: usize,
}

/// The whole `xtc probe` answer (`--json` prints exactly this).
#[derive(Debug, Clone, Serialize)]
pub struct ProbeReport {
    /// The root probed (`/` or `--sysfs-root`); a path that is not UTF-8 is
    /// written lossily (U+FFFD), so the JSON is always whole.
    #[serde(serialize_with = "lossy_path")]
    pub root: PathBuf,
    /// Online NUMA nodes; `null` when the host gives no NUMA information.
    pub online_nodes: Option<Vec<u32>>,
    /// NUMA nodes counted for placement (1 without NUMA information).
    pub host_nodes: usize,
    /// `--loops`.
    pub loops: usize,
    /// The NUMA node of each loop's carrier.
    pub loop_nodes: Vec<Option<u32>>,
    /// How `loop_nodes` was obtained.
    pub loop_nodes_source: LoopNodesSource,
    /// Render nodes then accel nodes, by number.
    pub devices: Vec<DeviceReport>,
    /// Vulkan-visible physical devices (live probe only): `null` when not
    /// listed, with the reason in `vulkan_note`.
    pub vulkan: Option<Vec<VulkanReport>>,
    /// Why `vulkan` is `null` (skipped, or the loader/instance error).
    pub vulkan_note: Option<String>,
}

/// One Vulkan physical device and the probed node it drives, if any.
#[derive(Debug, Clone, Serialize)]
pub struct VulkanReport {
    /// What `xtc_vk::enumerate` reports.
    #[serde(flatten)]
    pub info: xtc_vk::PhysicalDeviceInfo,
    /// The probed render node with the same path (`VK_EXT_physical_device_drm`).
    pub node: Option<String>,
}

/// Builds the report for `args`.
///
/// # Errors
/// [`ProbeError`] when the root cannot be probed.
pub fn report(args: &ProbeArgs) -> Result<ProbeReport, ProbeError> {
    let root = args
        .sysfs_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/"));
    let devices = accel::probe_in(&root)?;
    let host = HostNuma::read(&root);
    let loops = args.loops as usize;
    let live = args.sysfs_root.is_none();
    let (loop_nodes, source) = match live.then(|| executor_nodes(loops)).flatten() {
        Some(nodes) => (nodes, LoopNodesSource::Executor),
        None => (round_robin(&host, loops), LoopNodesSource::RoundRobinModel),
    };
    let devices: Vec<DeviceReport> = devices
        .into_iter()
        .map(|device| {
            let loop_idx = place(device.numa_node, &loop_nodes, host.n_nodes());
            DeviceReport { device, loop_idx }
        })
        .collect();
    let (vulkan, vulkan_note) = if !live {
        (None, Some("not listed with --sysfs-root".to_string()))
    } else if args.no_vulkan {
        (None, Some("skipped (--no-vulkan)".to_string()))
    } else {
        match xtc_vk::enumerate() {
            Ok(infos) => (Some(vulkan_reports(infos, &devices)), None),
            Err(e) => (None, Some(format!("unavailable: {e}"))),
        }
    };
    Ok(ProbeReport {
        vulkan,
        vulkan_note,
        root,
        host_nodes: host.n_nodes(),
        online_nodes: host.online.clone(),
        loops,
        loop_nodes,
        loop_nodes_source: source,
        devices,
    })
}

fn vulkan_reports(
    infos: Vec<xtc_vk::PhysicalDeviceInfo>,
    devices: &[DeviceReport],
) -> Vec<VulkanReport> {
    infos
        .into_iter()
        .map(|info| {
            let path = info.render_node.as_ref().map(|r| r.path.clone());
            let node = devices
                .iter()
                .find(|d| Some(&d.device.dev_path) == path.as_ref())
                .map(|d| d.device.name.clone());
            VulkanReport { info, node }
        })
        .collect()
}

/// The nodes a real executor's carriers record (`None` if it cannot start).
fn executor_nodes(loops: usize) -> Option<Vec<Option<u32>>> {
    let exec = Executor::new(loops).ok()?;
    let nodes = (0..loops).map(|i| exec.loop_node(i)).collect();
    exec.run().ok()?;
    Some(nodes)
}

fn round_robin(host: &HostNuma, loops: usize) -> Vec<Option<u32>> {
    match host.online.as_deref() {
        Some(online) if !online.is_empty() => {
            (0..loops).map(|i| Some(online[i % online.len()])).collect()
        }
        _ => vec![None; loops],
    }
}

/// Runs `xtc probe`, writing the table or JSON to `out`; returns the exit status.
pub fn run(args: &ProbeArgs, out: &mut dyn Write) -> i32 {
    let rep = match report(args) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("xtc probe: {e}");
            return 1;
        }
    };
    let written = if args.json {
        // Serialized whole before anything is written: stdout never holds
        // half a document.
        serde_json::to_string_pretty(&rep)
            .map_err(std::io::Error::from)
            .and_then(|json| writeln!(out, "{json}"))
    } else {
        write_table(&rep, out)
    };
    match written {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("xtc probe: cannot write the report: {e}");
            1
        }
    }
}

fn lossy_path<S: serde::Serializer>(p: &std::path::Path, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&p.to_string_lossy())
}

fn write_table(rep: &ProbeReport, out: &mut dyn Write) -> std::io::Result<()> {
    let online = rep
        .online_nodes
        .as_deref()
        .map_or("none reported".to_string(), format_cpulist);
    writeln!(
        out,
        "root {}: NUMA nodes online: {online}; {} loop(s) on nodes {}",
        rep.root.display(),
        rep.loops,
        loop_nodes_text(&rep.loop_nodes)
    )?;
    if rep.devices.is_empty() {
        let dirs = ["dev/dri", "dev/accel", "sys/class/drm", "sys/class/accel"];
        let shown: Vec<String> = dirs
            .iter()
            .map(|d| rep.root.join(d).display().to_string())
            .collect();
        writeln!(
            out,
            "no render or accel node exists (looked in {})",
            shown.join(", ")
        )?;
        return write_vulkan(rep, out);
    }
    writeln!(
        out,
        "{:<11} {:<6} {:<11} {:<13} {:<9} {:<4} {:<14} {:<4} STATUS",
        "NODE", "KIND", "DRIVER", "PCI", "ID", "NUMA", "CPUS", "LOOP"
    )?;
    for d in &rep.devices {
        write_device(d, out)?;
    }
    write_vulkan(rep, out)
}

fn write_vulkan(rep: &ProbeReport, out: &mut dyn Write) -> std::io::Result<()> {
    let Some(list) = &rep.vulkan else {
        return writeln!(
            out,
            "Vulkan devices: {}",
            rep.vulkan_note.as_deref().unwrap_or("-")
        );
    };
    if list.is_empty() {
        return writeln!(out, "Vulkan devices: none");
    }
    writeln!(out, "Vulkan devices:")?;
    for v in list {
        let i = &v.info;
        let (a, b, c) = i.api_version;
        writeln!(
            out,
            "  {} {:?} {:?} {:04x}:{:04x} Vulkan {a}.{b}.{c} node {} sync_fd export {}",
            i.index,
            i.name,
            i.kind,
            i.vendor_id,
            i.device_id,
            v.node.as_deref().unwrap_or("-"),
            if i.sync_fd_export { "yes" } else { "no" },
        )?;
    }
    Ok(())
}

fn write_device(d: &DeviceReport, out: &mut dyn Write) -> std::io::Result<()> {
    let dev = &d.device;
    let opt = |v: Option<String>| v.unwrap_or_else(|| "-".into());
    let id = dev.pci.as_ref().map(|p| {
        let hex = |v: Option<u16>| v.map_or("????".into(), |v| format!("{v:04x}"));
        format!("{}:{}", hex(p.vendor_id), hex(p.device_id))
    });
    let kind = match dev.kind {
        accel::NodeKind::Render => "render",
        accel::NodeKind::Accel => "accel",
    };
    writeln!(
        out,
        "{:<11} {:<6} {:<11} {:<13} {:<9} {:<4} {:<14} {:<4} {}",
        dev.name,
        kind,
        opt(dev.driver.clone()),
        opt(dev.pci.as_ref().map(|p| p.address.clone())),
        opt(id),
        opt(dev.numa_node.map(|n| n.to_string())),
        opt(dev.local_cpus.as_deref().map(format_cpulist)),
        d.loop_idx,
        dev.open_error.as_deref().unwrap_or("opened"),
    )?;
    for note in &dev.notes {
        writeln!(out, "    note: {note}")?;
    }
    Ok(())
}

fn loop_nodes_text(nodes: &[Option<u32>]) -> String {
    let parts: Vec<String> = nodes
        .iter()
        .map(|n| n.map_or("?".into(), |n| n.to_string()))
        .collect();
    format!("[{}]", parts.join(","))
}
