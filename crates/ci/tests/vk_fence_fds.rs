//! B-066 (vk side): 100,000 record + submit + fence-fd wake iterations keep
//! the process's fd count flat. Alone in its own test binary, so no other test
//! opens or closes fds in the process while it counts.

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_ci::support::empty_round_trip;
use xtc_vk::CommandPool;

/// 100,000 record + submit + fence-fd wake iterations leave the process's fd
/// count where it started (B-066: no fd leak per iteration).
#[test]
fn hundred_thousand_fence_iterations_keep_fd_count_flat() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut pool = CommandPool::new(&dev).unwrap();
    // The same round trip as `xtc ci`'s xtc.fence.no_fd_leak_10k.
    let run = |pool: &mut CommandPool| empty_round_trip(pool).unwrap();
    for _ in 0..100 {
        run(&mut pool);
    }
    dev.sync_waiter();
    let before = vk_support::fd_count();
    let first = run(&mut pool);
    let mut last = first;
    for _ in 1..100_000 {
        last = run(&mut pool);
    }
    dev.sync_waiter();
    assert_eq!(last - first, 99_999, "every iteration was a submission");
    assert_eq!(vk_support::fd_count(), before, "fd count is flat");
}
