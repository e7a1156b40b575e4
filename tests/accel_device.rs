//! Real sync_file path on a machine with an openable render node: a DRM
//! syncobj created signalled and exported as a sync_file
//! (`DRM_IOCTL_SYNCOBJ_HANDLE_TO_FD` with `EXPORT_SYNC_FILE`) goes through
//! `SyncFile::wait`, `info` (`SYNC_IOC_FILE_INFO`) and `merge`
//! (`SYNC_IOC_MERGE`).
//!
//! Without such a node (this build machine: no /dev/dri) the test says so and
//! passes; with `XTC_DEVICE_TESTS=1` (the device runner) a missing node fails.

use std::path::Path;
use std::time::Duration;

use drm::control::Device as _;
use xtc::accel::{self, FenceStatus, NodeKind, SyncFile, node};

fn open_render_node() -> Option<(accel::Device, node::NodeFile)> {
    let root = node::Rooted::new("/");
    for dev in accel::probe().ok()? {
        if dev.kind != NodeKind::Render {
            continue;
        }
        if let node::Opened::Node(f) = node::open_node(&root, &dev.dev_path, dev.kind) {
            return Some((dev, f));
        }
    }
    None
}

#[test]
fn syncobj_sync_file_round_trip() {
    let required = std::env::var_os("XTC_DEVICE_TESTS").is_some();
    let Some((dev, file)) = open_render_node() else {
        assert!(
            !required,
            "XTC_DEVICE_TESTS is set but no render node opens"
        );
        println!(
            "skipped: no openable render node here; the sync_file path is covered on the device runner"
        );
        return;
    };
    println!(
        "using {} ({:?}) on {}",
        dev.name,
        dev.driver,
        Path::new(&dev.dev_path).display()
    );
    assert_eq!(
        file.driver_name().ok().as_deref(),
        dev.driver.as_deref(),
        "probe takes the driver from DRM_IOCTL_VERSION"
    );
    let h = file
        .create_syncobj(true)
        .expect("create a signalled syncobj");
    let fd = file
        .syncobj_to_fd(h, true)
        .expect("export it as a sync_file");
    let a = SyncFile::from_fd(fd);
    assert_eq!(a.wait(Some(Duration::ZERO)), Ok(true));
    let info = a.info().expect("SYNC_IOC_FILE_INFO on a real sync_file");
    assert_eq!(info.status, FenceStatus::Signalled);
    assert!(!info.fences.is_empty());
    let b = SyncFile::from_fd(file.syncobj_to_fd(h, true).unwrap());
    let m = a
        .merge(&b, "merged")
        .expect("SYNC_IOC_MERGE on real sync_files");
    assert_eq!(m.wait(Some(Duration::ZERO)), Ok(true));
    assert_eq!(m.info().unwrap().name, "merged");
    file.destroy_syncobj(h).unwrap();
}
