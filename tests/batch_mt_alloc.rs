//! B-110: the three mt calls allocate nothing (they claim a preallocated
//! record, stamp a handle, push onto the ring). A counting global allocator
//! counts this thread's allocations across the calls, refusals included.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use xtc::batch::{AsyncOpts, AsyncStep, CloseMode, Exec, ExecStatus, Group, Item, StepResult};
use xtc::rt::Loop;

struct Counting;

thread_local! {
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counter is a const-initialised
// thread-local `Cell`, which itself never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocs() -> u64 {
    ALLOCS.with(Cell::get)
}

struct Nop;

impl AsyncStep<u64> for Nop {
    async fn submit(&mut self, _: &mut [Item<'_, u64>]) -> xtc::Result<Exec> {
        Ok(Exec::Inline)
    }
    async fn collect(
        &mut self,
        _: &mut [Item<'_, u64>],
        results: &mut [StepResult],
        _: ExecStatus,
    ) -> xtc::Result<()> {
        results.fill(StepResult::Done);
        Ok(())
    }
}

#[test]
fn submit_cancel_resume_mt_allocate_nothing() {
    let lp = Loop::new().unwrap();
    let opts = AsyncOpts {
        capacity: 4,
        max_active: 4,
        resource_capacity: 4,
        mt_queue_cap: 64,
        ..AsyncOpts::default()
    };
    let g = Group::create_async(&lp, opts, Nop, |_, _, _| {}).unwrap();
    let remote = g.remote().unwrap();
    let mut handles = Vec::with_capacity(64);
    let before = allocs();
    for i in 0..64 {
        handles.push(remote.submit(i, 1).unwrap());
    }
    let refused = remote.submit(64, 1).unwrap_err(); // pool exhausted: Again
    for h in &handles {
        remote.cancel(*h).unwrap();
    }
    let control_refused = remote.resume(handles[0]).unwrap_err();
    let after = allocs();
    assert_eq!(after - before, 0, "mt calls allocated");
    assert_eq!(
        (refused.error, control_refused),
        (xtc::Error::Again, xtc::Error::Again)
    );
    assert_eq!(g.async_stats().mt_rejections, 2);
    drop(handles);
    g.close(CloseMode::Drain).unwrap();
    lp.run().unwrap();
    assert_eq!(g.stats().cancelled, 64);
    g.destroy().unwrap();
}
