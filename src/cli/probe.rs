//! `xtc probe`: list render and accel nodes with driver, PCI address, NUMA
//! node, local CPUs, and the executor loop each would be placed on
//! (`batch::place`, B-160..B-165).
//!
//! `--sysfs-root DIR` probes a fixture tree (`devices/<name>`) instead of `/`;
//! `--json` prints one JSON object ([`ProbeReport`]) for machines. Exit
//! status 0 when the probe ran (finding no node is a normal answer), 1 when
//! it could not (bad root).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use crate::accel::{self, Device, HostNuma, ProbeError, sysfs::format_cpulist};
use crate::batch::place;

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
}

/// Where the loops' NUMA nodes in a report come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LoopNodesSource {
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
    /// The root probed (`/` or `--sysfs-root`).
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
    let loop_nodes = round_robin(&host, loops);
    let devices = devices
        .into_iter()
        .map(|device| {
            let loop_idx = place(device.numa_node, &loop_nodes, host.n_nodes());
            DeviceReport { device, loop_idx }
        })
        .collect();
    Ok(ProbeReport {
        root,
        host_nodes: host.n_nodes(),
        online_nodes: host.online.clone(),
        loops,
        loop_nodes,
        loop_nodes_source: LoopNodesSource::RoundRobinModel,
        devices,
    })
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
        serde_json::to_writer_pretty(&mut *out, &rep)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
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
        return Ok(());
    }
    writeln!(
        out,
        "{:<11} {:<6} {:<11} {:<13} {:<9} {:<4} {:<14} {:<4} STATUS",
        "NODE", "KIND", "DRIVER", "PCI", "ID", "NUMA", "CPUS", "LOOP"
    )?;
    for d in &rep.devices {
        write_device(d, out)?;
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
