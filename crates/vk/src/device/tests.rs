//! Unit tests of device discovery, selection and validation levels.

use super::*;

fn dev(index: usize, name: &str, kind: DeviceKind, minor: Option<i64>) -> PhysicalDeviceInfo {
    PhysicalDeviceInfo {
        index,
        name: name.into(),
        kind,
        vendor_id: 0,
        device_id: 0,
        api_version: (1, 3, 0),
        driver: String::new(),
        driver_version: 0,
        render_node: minor.map(|m| RenderNode {
            major: 226,
            minor: m,
            path: PathBuf::from(format!("/dev/dri/renderD{m}")),
        }),
        sync_fd_export: false,
        timeline_semaphore: true,
        compute_family: Some(0),
    }
}

#[test]
fn auto_prefers_discrete_then_integrated_then_virtual_then_cpu() {
    let mut all = vec![
        dev(0, "llvmpipe", DeviceKind::Cpu, None),
        dev(1, "virgl", DeviceKind::Virtual, Some(130)),
        dev(2, "igpu", DeviceKind::Integrated, Some(129)),
        dev(3, "dgpu", DeviceKind::Discrete, Some(128)),
    ];
    assert_eq!(Selector::Auto.choose(&all).unwrap().index, 3);
    all[3].compute_family = None; // unusable devices are skipped
    assert_eq!(Selector::Auto.choose(&all).unwrap().index, 2);
    all.truncate(2);
    assert_eq!(Selector::Auto.choose(&all).unwrap().index, 1);
    all.truncate(1);
    assert_eq!(Selector::Auto.choose(&all).unwrap().name, "llvmpipe");
}

#[test]
fn selectors_match_index_name_and_render_node_or_fail() {
    let all = [
        dev(0, "llvmpipe (LLVM 15)", DeviceKind::Cpu, None),
        dev(1, "AMD Radeon", DeviceKind::Discrete, Some(129)),
    ];
    assert_eq!(Selector::Index(0).choose(&all).unwrap().index, 0);
    assert_eq!(
        Selector::Name("radeon".into()).choose(&all).unwrap().index,
        1
    );
    let node = Selector::RenderNode("/dev/dri/renderD129".into());
    assert_eq!(node.choose(&all).unwrap().index, 1);
    let missing = Selector::RenderNode("/dev/dri/renderD128".into());
    assert!(matches!(missing.choose(&all), Err(VkError::NoMatch(_))));
    assert!(matches!(
        Selector::Index(2).choose(&all),
        Err(VkError::NoMatch(_))
    ));
    let e: xtc::Error = Selector::Index(2).choose(&all).unwrap_err().into();
    assert_eq!(e, xtc::Error::Inval);
}

#[test]
fn no_usable_device_is_nosys() {
    let mut d = dev(0, "old", DeviceKind::Discrete, None);
    d.timeline_semaphore = false;
    let err = Selector::Auto.choose(&[d]).unwrap_err();
    assert!(matches!(err, VkError::NoDevice));
    assert_eq!(xtc::Error::from(err), xtc::Error::Nosys);
    let e: xtc::Error = Selector::Auto.choose(&[]).unwrap_err().into();
    assert_eq!(e, xtc::Error::Nosys);
}
