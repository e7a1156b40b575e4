//! The Khronos validation layer, when asked for, really runs and really
//! counts: a command buffer with a deliberate write-after-write hazard (two
//! copies into one range with no barrier between them) must be reported by
//! synchronization validation and counted by `xtc_vk::validation_errors()`.
//!
//! Alone in its test binary: the error it provokes is counted process-wide,
//! and every other Vulkan test asserts that count stays 0.
//!
//! Needs the layer (`.ci/ensure-deps.sh` installs `vulkan-validationlayers`):
//! without it `Device::open_with` fails, and so does this test.

mod vk_support;

use xtc_vk::{Buffer, CommandPool, Location, Selector, Validation};

#[test]
fn synchronization_validation_reports_and_counts_a_write_after_write() {
    // Skips (outside CI) only on a machine with no Vulkan at all.
    if vk_support::device().is_none() {
        return;
    }
    let dev = xtc_vk::Device::open_with(&Selector::Auto, Validation::Sync)
        .expect("validation requested: the layer must be installed (.ci/ensure-deps.sh)");
    assert_eq!(dev.validation_level(), Validation::Sync);
    let mut src = Buffer::new(&dev, 256, Location::Upload, "src").unwrap();
    src.write(0, &[7u32; 64]).unwrap();
    let dst = Buffer::new(&dev, 256, Location::Readback, "dst").unwrap();
    let before = xtc_vk::validation_errors();
    let mut pool = CommandPool::new(&dev).unwrap();
    let mut rec = pool.record_plain().unwrap();
    rec.copy(&src, 0, &dst, 0, 256).unwrap();
    // No barrier: the second copy's writes race the first's.
    rec.copy(&src, 0, &dst, 0, 256).unwrap();
    rec.host_barrier();
    let done = rec.finish().unwrap();
    pool.submit(vec![done]).unwrap().wait(None).unwrap();
    let after = xtc_vk::validation_errors();
    assert!(after > before, "the hazard went unreported");
    let last = xtc_vk::last_validation_error().unwrap();
    assert!(last.contains("SYNC-HAZARD-WRITE-AFTER-WRITE"), "{last}");
}
