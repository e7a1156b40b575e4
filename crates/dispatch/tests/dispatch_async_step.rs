//! The NPU as a batch engine: an async group whose step runs each ready
//! vector as one NPU graph and returns `Exec::Future`, resolved by the
//! device's completion path (real loop, real device thread).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use xtc::Error;
use xtc::batch::{AsyncOpts, CloseMode, Group, Handle};
use xtc::rt::Loop;
use xtc_dispatch::{DeviceProfile, NpuDevice, NpuStep, NpuWork, RunOpts, Shape, TaskSpec};

struct Job {
    task: TaskSpec,
    left: u32,
}

impl NpuWork for Job {
    fn task(&self) -> TaskSpec {
        self.task.clone()
    }
    fn advance(&mut self) -> bool {
        self.left -= 1;
        self.left == 0
    }
}

type Outcome = (Handle, u32, Result<(), Error>);
type Outcomes = Rc<RefCell<Vec<Outcome>>>;

fn run_group(jobs: Vec<Job>, max_active: usize) -> (Vec<Outcome>, Vec<usize>) {
    let prof = DeviceProfile {
        sched_threads: 2,
        ..DeviceProfile::small()
    };
    let dev = Arc::new(NpuDevice::start(prof, RunOpts::default()).unwrap());
    let step = NpuStep::new(dev);
    let runs = step.runs();
    let lp = Loop::new().unwrap();
    let out: Outcomes = Rc::default();
    let o = out.clone();
    let opts = AsyncOpts {
        capacity: jobs.len(),
        max_active,
        resource_capacity: jobs.len() as u64,
        ..AsyncOpts::default()
    };
    let g = Group::create_async(&lp, opts, step, move |h, r: Job, res| {
        o.borrow_mut().push((h, r.left, res))
    })
    .unwrap();
    for j in jobs {
        g.submit(j, 1).map_err(|e| e.error).unwrap();
    }
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    g.destroy().unwrap();
    let runs = runs.lock().unwrap().clone();
    (out.take(), runs)
}

fn jobs() -> Vec<Job> {
    let shapes = [
        TaskSpec::new(Shape::Aiv, 2),
        TaskSpec::new(Shape::Aic, 1),
        TaskSpec::new(Shape::Mix, 3).sync(),
        TaskSpec::new(Shape::Mix, 1),
    ];
    (0..12)
        .map(|i| Job {
            task: shapes[i % 4].clone().lasting(5_000),
            left: 1 + (i as u32 % 3),
        })
        .collect()
}

#[test]
fn ready_vectors_run_as_npu_graphs_and_members_finish_independently() {
    let (out, runs) = run_group(jobs(), 8);
    assert_eq!(out.len(), 12);
    assert!(out.iter().all(|o| o.1 == 0 && o.2.is_ok()), "{out:?}");
    // 1 + 2 + 3 iterations over 12 members = 24 member-iterations, batched
    // into fewer device runs (vectors of up to 8 members).
    assert_eq!(runs.iter().sum::<usize>(), 24);
    assert!(runs.len() < 24 && runs.iter().any(|&n| n > 1), "{runs:?}");
}

#[test]
fn a_faulting_kernel_fails_its_member() {
    let mut js = jobs();
    js[5].task = js[5].task.clone().failing();
    let (out, _) = run_group(js, 1);
    assert_eq!(out.len(), 12);
    let failed: Vec<_> = out.iter().filter(|o| o.2.is_err()).collect();
    assert_eq!(failed.len(), 1, "{out:?}");
    assert_eq!(failed[0].2, Err(Error::Internal));
}
