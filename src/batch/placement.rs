//! Placement helper: which executor loop should own the group that drives a
//! device (`xtc_batch_loop_for_device`, B-156..B-167).
//!
//! Advisory glue, not a scheduler (B-156): it answers once, at create time;
//! a group stays on the loop it was created on and is never migrated (B-157).
//! The consumer creates its groups on the loops it picks (B-158).
//!
//! The answer is a pure function of three facts ([`place`]):
//! - the device's NUMA node, read by `accel::probe` from static sysfs
//!   (`sys/class/drm/<name>/device/numa_node` or
//!   `sys/class/accel/<name>/device/numa_node`, B-161), `None` for -1 and
//!   every bad value;
//! - the node each loop's carrier recorded;
//! - how many NUMA nodes the host has online.
//!
//! It picks the lowest-numbered loop whose carrier is on the device's node,
//! and loop 0 whenever that cannot be decided (B-163): device node unknown,
//! no loop recorded a node, single-node host, or no loop on that node. The
//! index is always in `[0, n_loops)` (B-162, B-165).
//!
//! Beyond the manual page (B-164 says "before the executor has run, always
//! loop 0"): `rt::Executor` carriers record their node when the executor is
//! *created*, so placement already works at create time, which is when
//! groups are created.
//!
//! Determinism (B-167): nothing here reads a clock, a random source or the
//! CPU the caller runs on; the inputs are fixed when the executor and the
//! probe are made, so calling it under `rt::Sim` is safe. It is a one-shot
//! helper, not for a per-iteration hot path.

use crate::accel::{self, Device};
use crate::{Error, Result};

/// What placement needs to know about an executor's loops. Implemented by
/// `rt::Executor`; tests implement it over fixture topologies.
pub trait LoopNodes {
    /// Number of loops (`xtc_exec_n_loops`).
    fn n_loops(&self) -> usize;
    /// NUMA node loop `idx`'s carrier recorded; `None` when unknown.
    fn loop_node(&self, idx: usize) -> Option<u32>;
    /// NUMA nodes online on the host; 1 (or 0) when it has no NUMA information.
    fn host_nodes(&self) -> usize;
}

/// The loop for a device on `device_node`, given each loop's recorded node
/// and the host's node count (the rules in the module doc). Returns 0 for an
/// empty `loop_nodes`, and 0 in a build without `sched-policy` (B-159: the
/// disabled helper still writes 0).
pub fn place(device_node: Option<u32>, loop_nodes: &[Option<u32>], host_nodes: usize) -> usize {
    if !cfg!(feature = "sched-policy") || host_nodes <= 1 {
        return 0;
    }
    let Some(node) = device_node else {
        return 0;
    };
    loop_nodes
        .iter()
        .position(|&n| n == Some(node))
        .unwrap_or(0)
}

/// [`loop_for_device`] over any [`LoopNodes`] (fixture topologies in tests).
///
/// # Errors
/// As [`loop_for_device`].
pub fn loop_for(loops: &dyn LoopNodes, dev: &Device) -> Result<usize> {
    if !cfg!(feature = "sched-policy") {
        return Err(Error::Nosys);
    }
    let named = accel::node::parse_node_name(&dev.name).is_some_and(|(kind, _)| kind == dev.kind);
    let n = loops.n_loops();
    if !named || n == 0 {
        return Err(Error::Inval);
    }
    let nodes: Vec<Option<u32>> = (0..n).map(|i| loops.loop_node(i)).collect();
    Ok(place(dev.numa_node, &nodes, loops.host_nodes()))
}

#[cfg(all(test, feature = "sched-policy"))]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_loop_on_the_device_node() {
        let loops = [Some(0), Some(1), Some(0), Some(1)];
        assert_eq!(place(Some(1), &loops, 2), 1);
        assert_eq!(place(Some(0), &loops, 2), 0);
        assert_eq!(place(Some(1), &[None, Some(0), Some(1)], 2), 2);
    }

    #[test]
    fn falls_back_to_loop_zero() {
        let loops = [Some(0), Some(1)];
        assert_eq!(place(None, &loops, 2), 0, "unknown device node");
        assert_eq!(
            place(Some(1), &[None, None], 2),
            0,
            "no loop recorded a node"
        );
        assert_eq!(place(Some(1), &loops, 1), 0, "single-node host");
        assert_eq!(
            place(Some(1), &loops, 0),
            0,
            "host without NUMA information"
        );
        assert_eq!(place(Some(3), &loops, 4), 0, "no loop on the device's node");
        assert_eq!(place(Some(1), &[], 2), 0, "no loops");
    }
}
