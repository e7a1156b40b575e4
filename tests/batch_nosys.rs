//! Without the `sched-policy` feature (`--enable-sched-policy` off) the batch
//! API returns `Nosys` (B-005): no group can be created, so no other call is
//! reachable. Run with `cargo test --no-default-features --test batch_nosys`.
#![cfg(not(feature = "sched-policy"))]

use xtc::Error;
use xtc::batch::{
    AsyncOpts, AsyncStep, Exec, ExecStatus, Group, Handle, Item, StepResult, SyncOpts, step_fn,
};
use xtc::rt::Sim;

struct Nop;

impl AsyncStep<u32> for Nop {
    async fn submit(&mut self, _: &mut [Item<'_, u32>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }
    async fn collect(
        &mut self,
        _: &mut [Item<'_, u32>],
        _: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        Ok(())
    }
}

#[test]
fn every_entry_point_is_nosys() {
    let sim = Sim::from_env(1);
    let lp = sim.new_loop();
    let complete = |_: Handle, _: u32, _: xtc::Result<()>| {};
    let step = step_fn(|_: &mut [Item<'_, u32>], _: &mut [StepResult]| Ok(()));
    let opts = SyncOpts {
        capacity: 2,
        max_active: 1,
        resource_capacity: 1,
        sched_class: None,
    };
    assert_eq!(
        Group::create(&lp, opts, step, complete).unwrap_err(),
        Error::Nosys
    );
    let opts = AsyncOpts {
        capacity: 2,
        max_active: 1,
        resource_capacity: 1,
        ..AsyncOpts::default()
    };
    assert_eq!(
        Group::create_async(&lp, opts, Nop, complete).unwrap_err(),
        Error::Nosys
    );
    assert_eq!(lp.n_procs(), 0, "nothing published");
}
