//! Placement helper and keyed router (B-156..B-171) against the fixture
//! topologies in `devices/` (each `expect.json` lists placement cases).
//!
//! Built without `sched-policy` only `disabled_build_is_nosys` runs.
#![cfg_attr(not(feature = "sched-policy"), allow(dead_code, unused_imports))]

use std::cell::Cell;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value;
use xtc::Error;
use xtc::accel::{self, HostNuma};
use xtc::batch::{LoopNodes, Router, loop_for, place};

fn devices_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("devices")
}

/// A fixture's host (node count from its sysfs) with given loop nodes.
struct FixtureLoops {
    nodes: Vec<Option<u32>>,
    host_nodes: usize,
}

impl LoopNodes for FixtureLoops {
    fn n_loops(&self) -> usize {
        self.nodes.len()
    }
    fn loop_node(&self, idx: usize) -> Option<u32> {
        self.nodes.get(idx).copied().flatten()
    }
    fn host_nodes(&self) -> usize {
        self.host_nodes
    }
}

fn fixture_cases(dir: &Path) -> Vec<(Vec<Option<u32>>, Value)> {
    let e: Value =
        serde_json::from_str(&fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap();
    e["placement"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let nodes = c["loop_nodes"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_u64().map(|n| n as u32))
                .collect();
            (nodes, c["expect"].clone())
        })
        .collect()
}

/// B-160, B-162, B-163, B-165: every fixture's placement cases.
#[cfg(feature = "sched-policy")]
#[test]
fn fixtures_place_devices_on_their_node_loop() {
    let mut checked = 0;
    for entry in fs::read_dir(devices_dir()).unwrap() {
        let dir = entry.unwrap().path();
        if !dir.join("expect.json").is_file() {
            continue;
        }
        let devs = accel::probe_in(&dir).unwrap();
        let host_nodes = HostNuma::read(&dir).n_nodes();
        for (nodes, want) in fixture_cases(&dir) {
            let loops = FixtureLoops {
                nodes: nodes.clone(),
                host_nodes,
            };
            for dev in &devs {
                let idx = loop_for(&loops, dev).unwrap();
                assert_eq!(
                    Some(idx as u64),
                    want[&dev.name].as_u64(),
                    "{} {} loops {nodes:?}",
                    dir.display(),
                    dev.name
                );
                assert!(idx < nodes.len(), "B-165: index in range");
                checked += 1;
            }
        }
    }
    assert!(checked >= 20, "only {checked} placement cases ran");
}

/// B-163: loop 0 whenever the answer cannot be decided.
#[cfg(feature = "sched-policy")]
#[test]
fn loop_zero_fallbacks() {
    let dir = devices_dir().join("nvidia-2node");
    let gpu = accel::probe_in(&dir).unwrap().remove(0);
    assert_eq!(gpu.numa_node, Some(1));
    let on = |nodes: Vec<Option<u32>>, host_nodes| {
        loop_for(&FixtureLoops { nodes, host_nodes }, &gpu).unwrap()
    };
    assert_eq!(on(vec![Some(0), Some(1)], 2), 1);
    assert_eq!(on(vec![None, None], 2), 0, "no loop recorded a node");
    assert_eq!(on(vec![Some(1), Some(1)], 1), 0, "single-node host");
    let mut unknown = gpu.clone();
    unknown.numa_node = None;
    assert_eq!(
        loop_for(
            &FixtureLoops {
                nodes: vec![Some(0), Some(1)],
                host_nodes: 2
            },
            &unknown
        ),
        Ok(0)
    );
}

/// B-166: the Rust forms of a NULL argument.
#[cfg(feature = "sched-policy")]
#[test]
fn missing_arguments_are_inval() {
    let gpu = accel::probe_in(&devices_dir().join("nvidia-2node"))
        .unwrap()
        .remove(0);
    let none = FixtureLoops {
        nodes: vec![],
        host_nodes: 2,
    };
    assert_eq!(
        loop_for(&none, &gpu),
        Err(Error::Inval),
        "executor without loops"
    );
    let two = FixtureLoops {
        nodes: vec![Some(0), Some(1)],
        host_nodes: 2,
    };
    let mut nameless = gpu.clone();
    nameless.name.clear();
    assert_eq!(
        loop_for(&two, &nameless),
        Err(Error::Inval),
        "device without a name"
    );
    let mut wrong = gpu;
    wrong.name = "accel0".into();
    assert_eq!(
        loop_for(&two, &wrong),
        Err(Error::Inval),
        "name of the other kind"
    );
}

/// B-167: the answer depends only on its inputs (no clock, RNG or CPU):
/// repeated calls agree, and the pure function needs no executor at all.
#[cfg(feature = "sched-policy")]
#[test]
fn placement_is_a_pure_function() {
    let nodes = [Some(0), Some(1), Some(0), Some(1)];
    let first = place(Some(1), &nodes, 2);
    assert!((0..1000).all(|_| place(Some(1), &nodes, 2) == first));
    assert_eq!(first, 1);
}

/// B-159: without `sched-policy` the helpers are `Nosys` and placement reports 0.
#[cfg(not(feature = "sched-policy"))]
#[test]
fn disabled_build_is_nosys() {
    let gpu = accel::probe_in(&devices_dir().join("nvidia-2node"))
        .unwrap()
        .remove(0);
    let two = FixtureLoops {
        nodes: vec![Some(0), Some(1)],
        host_nodes: 2,
    };
    assert_eq!(loop_for(&two, &gpu), Err(Error::Nosys));
    assert_eq!(place(Some(1), &[Some(0), Some(1)], 2), 0);
    assert_eq!(Router::new(vec![1]).unwrap_err(), Error::Nosys);
}

/// B-168, B-169: `groups[key % n]`, stable.
#[cfg(feature = "sched-policy")]
#[test]
fn router_routes_by_modulo_stably() {
    let r = Router::new(vec!["g0", "g1", "g2"]).unwrap();
    assert_eq!(r.len(), 3);
    for key in [0u64, 1, 2, 3, 4, 5, 299, u64::MAX] {
        assert_eq!(*r.route(key), ["g0", "g1", "g2"][(key % 3) as usize]);
        assert_eq!(r.route(key), r.route(key), "same key, same group");
        assert_eq!(r.shard(key), (key % 3) as usize);
    }
    let again = Router::new(vec!["g0", "g1", "g2"]).unwrap();
    assert!(
        (0..1000u64).all(|k| r.route(k) == again.route(k)),
        "same list, same mapping"
    );
    let one = Router::new(vec!["only"]).unwrap();
    assert!((0..100u64).all(|k| *one.route(k) == "only"));
}

/// B-171: `new` rejects an empty list.
#[cfg(feature = "sched-policy")]
#[test]
fn router_rejects_no_groups() {
    assert_eq!(Router::<u8>::new(vec![]).unwrap_err(), Error::Inval);
}

/// A stand-in group that counts how often it is touched and dropped.
struct Shard<'a> {
    touched: Cell<u32>,
    drops: &'a Cell<u32>,
}

impl Drop for Shard<'_> {
    fn drop(&mut self) {
        self.drops.set(self.drops.get() + 1);
    }
}

/// B-169, B-170, B-171: the router borrows, never submits or couples, and
/// dropping it frees no group.
#[cfg(feature = "sched-policy")]
#[test]
fn router_borrows_and_frees_only_itself() {
    let drops = Cell::new(0);
    let groups: Vec<Shard> = (0..4)
        .map(|_| Shard {
            touched: Cell::new(0),
            drops: &drops,
        })
        .collect();
    {
        let r = Router::new(groups.iter().collect::<Vec<&Shard>>()).unwrap();
        for key in 0..40u64 {
            let g = r.route(key);
            g.touched.set(g.touched.get() + 1); // the caller submits, not the router
        }
    }
    assert_eq!(drops.get(), 0, "dropping the router freed a group");
    assert!(
        groups.iter().all(|g| g.touched.get() == 10),
        "each shard saw only its own keys"
    );
    let owned = Router::new(groups).unwrap();
    let back = owned.into_groups();
    assert_eq!(
        (back.len(), drops.get()),
        (4, 0),
        "into_groups hands every group back"
    );
    drop(back);
    assert_eq!(drops.get(), 4);
}
