//! Small device helpers shared by the `vk_*` tests and the `xtc ci` suites
//! (one implementation of each check, used by both).

pub use xtc_vk::support::{open_fds, poll_readable};
use xtc_vk::{CommandPool, VkResult};

/// One empty fence round trip on `pool`: reset, record an empty command
/// buffer, submit it, and wait in poll(2) for its completion fd. Returns the
/// submission's timeline value (B-066: every iteration is one submission).
///
/// # Errors
/// As [`CommandPool::submit`]; `Inval` when the fd never became readable.
pub fn empty_round_trip(pool: &mut CommandPool) -> VkResult<u64> {
    pool.reset()?;
    let cmd = pool.record_plain()?.finish()?;
    let sub = pool.submit(vec![cmd])?;
    if !poll_readable(sub.fence_fd(), None)? {
        return Err(xtc_vk::VkError::Inval("completion fd not readable".into()));
    }
    Ok(sub.value())
}
