//! Group options of the batch integration tests, in one copy: `batch_support`
//! and `batch_adversarial_support` both re-export them.

use std::time::Duration;

use xtc::batch::{AsyncOpts, SyncOpts};

/// Sync options: `capacity` slots, `max_active` members, `units` of resource.
pub fn sync_opts(capacity: usize, max_active: usize, units: u64) -> SyncOpts {
    SyncOpts {
        capacity,
        max_active,
        resource_capacity: units,
        sched_class: None,
    }
}

/// Async options: `capacity` slots, `max_active` members, 100 units of
/// resource, the exec timeout `timeout`, no admission ring.
pub fn async_opts(capacity: usize, max_active: usize, timeout: Option<Duration>) -> AsyncOpts {
    AsyncOpts {
        capacity,
        max_active,
        resource_capacity: 100,
        exec_timeout: timeout,
        sched_class: None,
        mt_queue_cap: 0,
    }
}
