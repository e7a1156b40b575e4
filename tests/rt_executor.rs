//! `rt::Executor`: carriers, NUMA nodes, setup before run, cross-loop messages.

use std::sync::{Arc, Mutex};
use xtc::Error;
use xtc::rt::{self, Executor, Loop, Topology, mailbox};

#[test]
fn carriers_record_numa_node_0_on_this_one_node_host() {
    let host = Topology::host();
    let ex = Executor::new(2).unwrap();
    assert_eq!(ex.n_loops(), 2);
    assert_eq!(ex.host_nodes(), host.n_nodes());
    if host.n_nodes() == 1 {
        assert_eq!(ex.loop_node(0), Some(0));
        assert_eq!(ex.loop_node(1), Some(0));
    } else {
        // Multi-node hosts: each carrier names a node the topology knows.
        for i in 0..2 {
            let node = ex.loop_node(i).unwrap();
            assert!(host.cpus_of(node).is_some());
        }
    }
    assert_eq!(ex.loop_node(2), None);
    ex.run().unwrap();
}

#[test]
fn an_injected_topology_decides_the_recorded_node() {
    let topo = Topology::synthetic(vec![(0, vec![0, 1]), (3, vec![2, 3])]).with_fixed_cpu(2);
    let ex = Executor::with_topology(3, topo).unwrap();
    assert_eq!(ex.host_nodes(), 2);
    assert!((0..3).all(|i| ex.loop_node(i) == Some(3)));
    ex.run().unwrap();
    let unknown = Topology::synthetic(vec![(0, vec![0])]).with_fixed_cpu(9);
    let ex = Executor::with_topology(1, unknown).unwrap();
    assert_eq!(ex.loop_node(0), None);
    ex.run().unwrap();
}

#[test]
fn topology_from_a_sysfs_tree() {
    let dir = tempfile::tempdir().unwrap();
    for (n, list) in [(0, "0-1\n"), (1, "2,4-5\n")] {
        let node = dir.path().join(format!("node{n}"));
        std::fs::create_dir(&node).unwrap();
        std::fs::write(node.join("cpulist"), list).unwrap();
    }
    std::fs::create_dir(dir.path().join("power")).unwrap();
    let t = Topology::from_sysfs(dir.path()).unwrap();
    assert_eq!(t.n_nodes(), 2);
    assert_eq!(t.node_of_cpu(5), Some(1));
    assert_eq!(t.cpus_of(1), Some(&[2usize, 4, 5][..]));
    std::fs::write(dir.path().join("node1/cpulist"), "2-x").unwrap();
    assert_eq!(Topology::from_sysfs(dir.path()).unwrap_err(), Error::Inval);
    assert_eq!(
        Topology::from_sysfs(&dir.path().join("missing")).unwrap_err(),
        Error::Inval
    );
}

#[test]
fn setup_runs_on_the_loop_before_its_first_run() {
    let ex = Executor::new(2).unwrap();
    let seen = Arc::new(Mutex::new(Vec::new()));
    for i in 0..2 {
        let seen = seen.clone();
        ex.setup(i, move |lp: &Loop| {
            seen.lock().unwrap().push((
                i,
                lp.has_run(),
                std::thread::current().name().map(String::from),
            ));
            let seen = seen.clone();
            lp.spawn(async move {
                let lp = Loop::current().unwrap();
                seen.lock().unwrap().push((i + 10, lp.has_run(), None));
            })
            .unwrap();
        })
        .unwrap();
    }
    // setup returns only once the closure ran: its effects are visible now.
    assert_eq!(seen.lock().unwrap().len(), 2);
    assert_eq!(ex.setup(2, |_| {}).unwrap_err(), Error::Inval);
    ex.run().unwrap();
    let mut seen = seen.lock().unwrap().clone();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (0, false, Some("xtc-loop-0".into())),
            (1, false, Some("xtc-loop-1".into())),
            (10, true, None),
            (11, true, None),
        ]
    );
}

#[test]
fn loops_on_different_threads_exchange_messages() {
    let ex = Executor::new(2).unwrap();
    let (to_b, from_a) = mailbox::<u32>();
    let (to_a, from_b) = mailbox::<u32>();
    let result = Arc::new(Mutex::new(None));
    ex.setup(0, move |lp| {
        lp.spawn(async move {
            for i in 0..100 {
                to_b.send(i).unwrap();
                let back = from_b.recv().await.unwrap();
                assert_eq!(back, i * 2);
            }
        })
        .unwrap();
    })
    .unwrap();
    let r = result.clone();
    ex.setup(1, move |lp| {
        lp.spawn(async move {
            let mut n = 0;
            while let Ok(v) = from_a.recv().await {
                to_a.send(v * 2).unwrap();
                n += 1;
                rt::yield_now().await;
            }
            *r.lock().unwrap() = Some(n);
        })
        .unwrap();
    })
    .unwrap();
    ex.run().unwrap();
    assert_eq!(*result.lock().unwrap(), Some(100));
}

#[test]
fn pinned_carriers_run_on_their_nodes_cpus() {
    let host = Topology::host();
    let ex = Executor::with_topology(2, host.clone().with_pinning()).unwrap();
    for i in 0..2 {
        if let Some(node) = ex.loop_node(i) {
            assert!(host.cpus_of(node).is_some());
        }
    }
    if host.n_nodes() == 1 {
        assert_eq!(ex.loop_node(0), Some(0));
    }
    ex.run().unwrap();
}

#[test]
fn zero_loops_is_inval() {
    assert_eq!(Executor::new(0).unwrap_err(), Error::Inval);
}
