//! [`Executor`]: N loops, each on its own carrier thread, and the NUMA
//! [`Topology`] the carriers record.
//!
//! Carriers start in [`Executor::new`]: each creates its loop (a `Loop` is
//! `!Send`, so it is born on its carrier), reads the CPU it runs on (`getcpu`)
//! and records that CPU's node from the topology, then waits for commands.
//! [`Executor::setup`] runs a closure on a loop and returns when it is done, so
//! setup is serialized against execution; [`Executor::run`] (which consumes the
//! executor, so no setup can follow) runs every loop until its processes end
//! and joins the carriers.

use super::event_loop::Loop;
use crate::{Error, Result};
use crossbeam_channel as cb;
use std::path::Path;
use std::thread::JoinHandle;

/// NUMA topology: the CPUs of each node.
///
/// Read from sysfs (`<root>/nodeN/cpulist`, root normally
/// `/sys/devices/system/node`) or built synthetically for tests, optionally
/// with a fixed CPU that carriers report instead of calling `getcpu`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Topology {
    nodes: Vec<(u32, Vec<usize>)>,
    fixed_cpu: Option<usize>,
    pin: bool,
}

impl Topology {
    /// The host's topology from `/sys/devices/system/node`; an empty topology
    /// (no known node) when sysfs has none.
    pub fn host() -> Topology {
        Topology::from_sysfs(Path::new("/sys/devices/system/node")).unwrap_or_default()
    }

    /// Reads `root/nodeN/cpulist` for every `nodeN` directory under `root`.
    ///
    /// # Errors
    /// `Inval` when `root` cannot be read or a cpulist is malformed.
    pub fn from_sysfs(root: &Path) -> Result<Topology> {
        let mut nodes = Vec::new();
        for entry in std::fs::read_dir(root).map_err(|_| Error::Inval)? {
            let entry = entry.map_err(|_| Error::Inval)?;
            let name = entry.file_name();
            let Some(id) = name
                .to_str()
                .and_then(|n| n.strip_prefix("node"))
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            // Bounded, non-blocking read and bounded parse: a FIFO or a
            // garbage range (`0-18446744073709551615`) is `Inval`, never a
            // hang or an unbounded allocation.
            let list = super::sysfs::read_attr_file(&entry.path().join("cpulist"))
                .ok()
                .flatten()
                .ok_or(Error::Inval)?;
            nodes.push((id, parse_cpulist(&list)?));
        }
        nodes.sort();
        Ok(Topology {
            nodes,
            fixed_cpu: None,
            pin: false,
        })
    }

    /// A synthetic topology: `(node id, cpus)` pairs.
    pub fn synthetic(nodes: Vec<(u32, Vec<usize>)>) -> Topology {
        Topology {
            nodes,
            fixed_cpu: None,
            pin: false,
        }
    }

    /// Carriers report `cpu` instead of the CPU `getcpu` gives (tests).
    pub fn with_fixed_cpu(mut self, cpu: usize) -> Topology {
        self.fixed_cpu = Some(cpu);
        self
    }

    /// Carriers pin themselves (best effort) to the CPUs of node
    /// `loop index % n_nodes` before recording their node.
    pub fn with_pinning(mut self) -> Topology {
        self.pin = true;
        self
    }

    /// Pins the calling thread to the CPUs of the `idx % n_nodes`-th node;
    /// a refusal (e.g. CPUs outside this process's cgroup) leaves it unpinned.
    fn pin_carrier(&self, idx: usize) {
        if !self.pin || self.nodes.is_empty() {
            return;
        }
        let cpus = &self.nodes[idx % self.nodes.len()].1;
        let mut set = rustix::thread::CpuSet::new();
        cpus.iter()
            .filter(|c| **c < rustix::thread::CpuSet::MAX_CPU)
            .for_each(|c| set.set(*c));
        if set.count() > 0 {
            let _ = rustix::thread::sched_setaffinity(None, &set);
        }
    }

    /// Nodes in the topology.
    pub fn n_nodes(&self) -> usize {
        self.nodes.len()
    }

    /// The node whose cpulist holds `cpu`.
    pub fn node_of_cpu(&self, cpu: usize) -> Option<u32> {
        self.nodes
            .iter()
            .find(|(_, cpus)| cpus.contains(&cpu))
            .map(|(id, _)| *id)
    }

    /// The CPUs of node `node`.
    pub fn cpus_of(&self, node: u32) -> Option<&[usize]> {
        self.nodes
            .iter()
            .find(|(id, _)| *id == node)
            .map(|(_, c)| c.as_slice())
    }

    /// The node of the CPU the calling thread runs on.
    fn node_of_this_thread(&self) -> Option<u32> {
        let cpu = self.fixed_cpu.unwrap_or_else(rustix::thread::sched_getcpu);
        self.node_of_cpu(cpu)
    }
}

/// Parses a sysfs cpulist (`"0-3,8,10-11"`, possibly empty).
///
/// # Errors
/// `Inval` when malformed, a range is reversed, or an id is at or beyond
/// [`super::sysfs::MAX_LIST_ID`] (the bounded parser the device probe shares,
/// so a garbage range cannot make it allocate without bound).
pub(crate) fn parse_cpulist(s: &str) -> Result<Vec<usize>> {
    super::sysfs::parse_cpulist(s)
        .map(|ids| ids.into_iter().map(|c| c as usize).collect())
        .map_err(|_| Error::Inval)
}

type SetupFn = Box<dyn FnOnce(&Loop) + Send + 'static>;

enum Cmd {
    Setup(SetupFn, cb::Sender<()>),
    Run,
}

struct Carrier {
    cmds: cb::Sender<Cmd>,
    node: Option<u32>,
    thread: JoinHandle<Result<()>>,
}

/// N loops on N carrier threads (`xtc_exec_t`).
pub struct Executor {
    carriers: Vec<Carrier>,
    topo: Topology,
}

impl std::fmt::Debug for Executor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Executor")
            .field("n_loops", &self.n_loops())
            .field(
                "nodes",
                &self.carriers.iter().map(|c| c.node).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Executor {
    /// Starts `n_loops` carriers on the host topology.
    ///
    /// # Errors
    /// `Inval` for 0 loops; `Internal` when a thread or a loop cannot be created.
    pub fn new(n_loops: usize) -> Result<Executor> {
        Executor::with_topology(n_loops, Topology::host())
    }

    /// Starts `n_loops` carriers that record their node from `topo`.
    ///
    /// # Errors
    /// As [`Executor::new`].
    pub fn with_topology(n_loops: usize, topo: Topology) -> Result<Executor> {
        if n_loops == 0 {
            return Err(Error::Inval);
        }
        let mut carriers = Vec::with_capacity(n_loops);
        for i in 0..n_loops {
            carriers.push(start_carrier(i, topo.clone())?);
        }
        Ok(Executor { carriers, topo })
    }

    /// Number of loops (`xtc_exec_n_loops`).
    pub fn n_loops(&self) -> usize {
        self.carriers.len()
    }

    /// The NUMA node loop `idx`'s carrier recorded when it started (`None`:
    /// unknown, or `idx` out of range).
    pub fn loop_node(&self, idx: usize) -> Option<u32> {
        self.carriers.get(idx).and_then(|c| c.node)
    }

    /// NUMA nodes in the executor's topology (0 when sysfs shows none).
    pub fn host_nodes(&self) -> usize {
        self.topo.n_nodes()
    }

    /// Runs `f` on loop `idx`'s carrier, with that loop, and waits for it:
    /// setup before the loop's first run, serialized against execution.
    ///
    /// # Errors
    /// `Inval` for `idx` out of range; `Internal` if `f` panicked (the carrier is lost).
    pub fn setup<F: FnOnce(&Loop) + Send + 'static>(&self, idx: usize, f: F) -> Result<()> {
        let carrier = self.carriers.get(idx).ok_or(Error::Inval)?;
        let (ack_tx, ack_rx) = cb::bounded(1);
        carrier
            .cmds
            .send(Cmd::Setup(Box::new(f), ack_tx))
            .map_err(|_| Error::Internal)?;
        ack_rx.recv().map_err(|_| Error::Internal)
    }

    /// Runs every loop until its processes end (each [`Loop::run`]s on its
    /// carrier), then joins the carriers.
    ///
    /// # Errors
    /// The first loop's error; `Internal` if a carrier panicked.
    pub fn run(self) -> Result<()> {
        for c in &self.carriers {
            // A carrier that is gone reports through its join below.
            let _ = c.cmds.send(Cmd::Run);
        }
        let mut first = Ok(());
        for c in self.carriers {
            let res = c.thread.join().unwrap_or(Err(Error::Internal));
            if first.is_ok() {
                first = res;
            }
        }
        first
    }
}

fn start_carrier(idx: usize, topo: Topology) -> Result<Carrier> {
    let (cmd_tx, cmd_rx) = cb::unbounded::<Cmd>();
    let (init_tx, init_rx) = cb::bounded::<Result<Option<u32>>>(1);
    let thread = std::thread::Builder::new()
        .name(format!("xtc-loop-{idx}"))
        .spawn(move || carrier_main(idx, &topo, &cmd_rx, &init_tx))
        .map_err(|_| Error::Internal)?;
    let node = init_rx.recv().map_err(|_| Error::Internal)??;
    Ok(Carrier {
        cmds: cmd_tx,
        node,
        thread,
    })
}

fn carrier_main(
    idx: usize,
    topo: &Topology,
    cmds: &cb::Receiver<Cmd>,
    init: &cb::Sender<Result<Option<u32>>>,
) -> Result<()> {
    let lp = match Loop::new() {
        Ok(lp) => lp,
        Err(e) => {
            let _ = init.send(Err(e));
            return Err(e);
        }
    };
    topo.pin_carrier(idx);
    let _ = init.send(Ok(topo.node_of_this_thread()));
    while let Ok(cmd) = cmds.recv() {
        match cmd {
            Cmd::Setup(f, ack) => {
                f(&lp);
                let _ = ack.send(());
            }
            Cmd::Run => return lp.run(),
        }
    }
    // Executor dropped without run: the loop (and its processes) drop here.
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulist_parses_ranges_and_singles() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n").unwrap(),
            vec![0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<usize>::new());
        assert_eq!(parse_cpulist("3-1").unwrap_err(), Error::Inval);
        assert_eq!(parse_cpulist("a").unwrap_err(), Error::Inval);
    }

    /// A garbage cpulist in an injected topology root is `Inval`, never an
    /// unbounded allocation (before the fix `0-18446744073709551615` panicked
    /// with "capacity overflow" and `0-4000000000` tried to allocate 32 GB),
    /// and a FIFO where a cpulist belongs is refused, never a blocking open.
    #[test]
    fn from_sysfs_refuses_huge_lists_and_non_files() {
        let t = tempfile::tempdir().unwrap();
        let node0 = t.path().join("node0");
        std::fs::create_dir(&node0).unwrap();
        for huge in ["0-18446744073709551615", "0-4000000000", "70000"] {
            std::fs::write(node0.join("cpulist"), huge).unwrap();
            assert_eq!(Topology::from_sysfs(t.path()), Err(Error::Inval), "{huge}");
        }
        std::fs::write(node0.join("cpulist"), "0-3\n").unwrap();
        let topo = Topology::from_sysfs(t.path()).unwrap();
        assert_eq!(topo.cpus_of(0), Some(&[0, 1, 2, 3][..]));
        std::fs::remove_file(node0.join("cpulist")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            node0.join("cpulist"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert_eq!(Topology::from_sysfs(t.path()), Err(Error::Inval));
    }
}
