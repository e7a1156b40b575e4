//! Reclaim watermark (D-08..D-13) under virtual time: a tiny task window
//! with a scope kept open. Without the pressure handshake the orchestrator
//! stalls until the backstop; with it an acknowledged publication arrives
//! about 10 ms into the stall. Deadlock verdicts come only from acked heads.
//! (The same handshake proof under `rt::Sim`: `dispatch_sim.rs`.)

mod dispatch_support;

use dispatch_support::{MS, WINDOW, open_scope_graph};
use xtc::Error;
use xtc_dispatch::{
    DeviceProfile, Graph, RunOpts, RunReport, Scheduler, Shape, StallEnd, StepOpts, TaskSpec,
};

fn run(g: &Graph, handshake: bool, seed: u64) -> RunReport {
    let s = Scheduler::new(DeviceProfile::small()).unwrap();
    let opts = RunOpts {
        window: Some(WINDOW),
        handshake,
        ..RunOpts::default()
    };
    let so = StepOpts {
        tick_ns: 1_000,
        max_steps: 2_000_000,
        ..StepOpts::seeded(seed)
    };
    s.run_stepped(g, opts, so).expect("no hang")
}

#[test]
fn without_handshake_the_orchestrator_stalls_until_the_backstop() {
    let r = run(&open_scope_graph(), false, 1);
    assert!(r.fault.is_none() && r.outputs_exact());
    let st = r
        .stalls
        .iter()
        .find(|s| s.task == WINDOW)
        .expect("task 8 stalled");
    assert_eq!(st.how, StallEnd::Backstop);
    assert!(st.end_ns - st.start_ns >= 100 * MS, "{st:?}");
}

#[test]
fn with_handshake_an_acked_publication_arrives_about_10ms_into_the_stall() {
    for seed in 0..3 {
        let r = run(&open_scope_graph(), true, seed);
        assert!(r.fault.is_none() && r.outputs_exact());
        let st = r
            .stalls
            .iter()
            .find(|s| s.task == WINDOW)
            .expect("task 8 stalled");
        assert_eq!(st.how, StallEnd::Acked, "{st:?}");
        let waited = st.end_ns - st.start_ns;
        assert!((10 * MS..11 * MS).contains(&waited), "{st:?}");
        assert!(r.stalls.iter().all(|s| s.how != StallEnd::Backstop));
        // D-08: batched publication, far fewer publications than advances.
        let (publications, advances) = r.watermark;
        assert_eq!(advances, 50);
        assert!(publications < advances / 2, "{publications}/{advances}");
    }
}

/// A scope larger than the window: a real deadlock.
fn scope_over_window() -> Graph {
    let mut g = Graph::new();
    g.open_scope();
    for _ in 0..WINDOW + 2 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(2_000));
    }
    g.close_scope();
    g
}

#[test]
fn deadlock_verdict_only_from_an_acknowledged_head() {
    // The published head (0) equals the scope's first task from the start of
    // the stall, but it is unacknowledged: no verdict until the ack at ~10 ms.
    let r = run(&scope_over_window(), true, 2);
    assert_eq!(r.fault, Some(Error::Range));
    assert_eq!(r.verdicts, 1);
    assert!(r.end_ns >= 10 * MS && r.end_ns < 20 * MS, "{}", r.end_ns);
    // Without the handshake there is never an acked head: no structural
    // verdict, only the backstop.
    let r = run(&scope_over_window(), false, 2);
    assert_eq!(r.fault, Some(Error::Range));
    assert_eq!(r.verdicts, 0);
    assert!(r.end_ns >= 100 * MS, "{}", r.end_ns);
}
