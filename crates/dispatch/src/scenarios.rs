//! Task graphs of the proofs and benchmarks (reference §6, §7.5), scaled to a
//! profile's cluster count.

use super::task::{Graph, Shape, TaskSpec};

fn dur(rng: &mut fastrand::Rng) -> u64 {
    rng.u64(2_000..20_000)
}

/// The sync_start stress scenario (D-15): 6 rounds x 9 tasks = 54 tasks.
/// Each round: 4 normal MIX (`block_num = clusters/6`), 2 sync_start MIX
/// (`clusters/2`), 2 sync_start AIV (`clusters/3`), 1 normal AIV
/// (`clusters/6`), interleaved; subtask durations 2..20 µs from `seed`.
pub fn sync_start_stress(clusters: usize, seed: u64) -> Graph {
    let c = clusters as u32;
    let w = |d: u32| (c / d).max(1);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut g = Graph::new();
    for _ in 0..6 {
        let round = [
            TaskSpec::new(Shape::Mix, w(6)),
            TaskSpec::new(Shape::Mix, w(2)).sync(),
            TaskSpec::new(Shape::Mix, w(6)),
            TaskSpec::new(Shape::Aiv, w(3)).sync(),
            TaskSpec::new(Shape::Mix, w(6)),
            TaskSpec::new(Shape::Mix, w(2)).sync(),
            TaskSpec::new(Shape::Mix, w(6)),
            TaskSpec::new(Shape::Aiv, w(3)).sync(),
            TaskSpec::new(Shape::Aiv, w(6)),
        ];
        for t in round {
            let d = dur(&mut rng);
            g.add(t.lasting(d));
        }
    }
    g
}

/// Starvation (spmd_starvation): 3 waves of 6 normal MIX tasks
/// (`block_num = clusters/6`, 20 µs), a sync_start MIX task
/// (`clusters/4 + 1` blocks, more than one thread owns) after wave 1 and
/// another after wave 2. Returns the graph and the sync task ids.
pub fn starvation(clusters: usize) -> (Graph, Vec<usize>) {
    let c = clusters as u32;
    let mut g = Graph::new();
    let mut sync = Vec::new();
    for wave in 0..3 {
        for _ in 0..6 {
            g.add(TaskSpec::new(Shape::Mix, (c / 6).max(1)).lasting(20_000));
        }
        if wave < 2 {
            sync.push(
                g.add(
                    TaskSpec::new(Shape::Mix, (c / 4 + 1).min(c))
                        .sync()
                        .lasting(5_000),
                ),
            );
        }
    }
    (g, sync)
}

/// Retry-ABA scene: task 0 is a long MIX holder block (200 µs), task 1 a short
/// AIV starter, task 2 a sync_start MIX cohort needing every cluster, after
/// the starter, so its drain finds `clusters - 1` free and must retry.
pub fn retry_aba(clusters: usize) -> Graph {
    let mut g = Graph::new();
    g.add(TaskSpec::new(Shape::Mix, 1).lasting(200_000));
    g.add(TaskSpec::new(Shape::Aiv, 1).lasting(5_000));
    g.add(
        TaskSpec::new(Shape::Mix, clusters as u32)
            .sync()
            .after(&[1])
            .lasting(5_000),
    );
    g
}

/// The reclaim scene (D-08..D-13): tasks 0..6 complete (local head 6, below
/// K = 16, so unpublished); the scope opened at task 6 keeps the ring from
/// draining; with a task window of 8 slots, task 8 needs a slot. Without
/// the pressure handshake the orchestrator stalls until the backstop; with
/// it an acknowledged publication ends the stall (`crates/dispatch/tests/dispatch_reclaim.rs`,
/// `xtc.dispatch.reclaim.handshake`).
pub fn open_scope() -> Graph {
    let mut g = Graph::new();
    // Long enough that the orchestrator has submitted 6 and 7 before they
    // complete (otherwise the ring drains and publishes at once).
    for _ in 0..6 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(200_000));
    }
    g.open_scope();
    for _ in 0..4 {
        g.add(TaskSpec::new(Shape::Aiv, 1).lasting(2_000));
    }
    g.close_scope();
    for _ in 0..40 {
        g.add(TaskSpec::new(Shape::Aic, 1).lasting(2_000));
    }
    g
}

/// Decode-like waves for the publication benchmark: `waves` waves of
/// `per_wave` single-block AIC tasks (each wave after the previous one, so
/// every pop returns several ready tasks), plus one MIX task per wave.
pub fn decode_waves(waves: usize, per_wave: usize, dur_ns: u64) -> Graph {
    let mut g = Graph::new();
    let mut prev: Vec<usize> = Vec::new();
    for _ in 0..waves {
        let mut cur = Vec::new();
        for _ in 0..per_wave {
            cur.push(g.add(TaskSpec::new(Shape::Aic, 1).after(&prev).lasting(dur_ns)));
        }
        cur.push(g.add(TaskSpec::new(Shape::Mix, 2).after(&prev).lasting(dur_ns)));
        prev = cur;
    }
    g
}
