//! `accel::probe_in` over the fixture trees in `devices/` (each checked
//! against its `expect.json`) and over temporary trees with bad sysfs
//! content: every case gives a defined answer, never a panic.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use serde_json::Value;
use xtc::accel::{self, Device, DriverSource, NodeKind, ProbeError, sysfs};

fn devices_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("devices")
}

fn fixtures() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(devices_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expect.json").is_file())
        .collect();
    v.sort();
    v
}

fn expect(dir: &Path) -> Value {
    serde_json::from_str(&fs::read_to_string(dir.join("expect.json")).unwrap()).unwrap()
}

/// A probed device in `expect.json`'s compact form (hex ids, cpulist text).
fn compact(d: &Device) -> Value {
    let mut v = serde_json::to_value(d).unwrap();
    if let Some(pci) = &d.pci {
        let hex = |id: Option<u16>| id.map(|i| format!("0x{i:04x}"));
        v["pci"]["vendor_id"] = serde_json::json!(hex(pci.vendor_id));
        v["pci"]["device_id"] = serde_json::json!(hex(pci.device_id));
    }
    v["local_cpus"] = serde_json::json!(d.local_cpus.as_deref().map(sysfs::format_cpulist));
    v
}

#[test]
fn every_fixture_matches_its_expect_json() {
    let all = fixtures();
    assert!(all.len() >= 7, "fixture trees missing: {all:?}");
    for dir in all {
        let want = expect(&dir);
        let got = accel::probe_in(&dir).unwrap();
        let got: Vec<Value> = got.iter().map(compact).collect();
        assert_eq!(
            Value::Array(got),
            want["devices"],
            "fixture {}",
            dir.display()
        );
        let host = accel::HostNuma::read(&dir);
        let online = host.online.as_deref().map(sysfs::format_cpulist);
        assert_eq!(
            serde_json::json!(online),
            want["online_nodes"],
            "fixture {}",
            dir.display()
        );
    }
}

#[test]
fn nvidia_on_node_one_of_two() {
    let devs = accel::probe_in(&devices_dir().join("nvidia-2node")).unwrap();
    assert_eq!(devs.len(), 1, "card1 must not be listed");
    let d = &devs[0];
    assert_eq!((d.name.as_str(), d.kind), ("renderD128", NodeKind::Render));
    assert_eq!(d.numa_node, Some(1));
    assert_eq!(d.driver.as_deref(), Some("nvidia"));
    assert_eq!(d.driver_source, Some(DriverSource::SysfsLink));
    let pci = d.pci.as_ref().unwrap();
    assert_eq!(
        (pci.address.as_str(), pci.vendor_id, pci.device_id),
        ("0000:41:00.0", Some(0x10de), Some(0x2330))
    );
    assert_eq!(
        accel::device_numa_node(&devices_dir().join("nvidia-2node"), d),
        Some(1)
    );
    assert_eq!(
        accel::HostNuma::read(&devices_dir().join("nvidia-2node")).n_nodes(),
        2
    );
}

#[test]
fn accel_node_and_non_pci_and_vm() {
    let npu = accel::probe_in(&devices_dir().join("npu-accel")).unwrap();
    assert_eq!(npu.len(), 1);
    assert_eq!(
        (npu[0].name.as_str(), npu[0].kind),
        ("accel0", NodeKind::Accel)
    );
    assert_eq!(npu[0].dev_path, Path::new("/dev/accel/accel0"));
    assert_eq!(npu[0].numa_node, None);
    let soc = accel::probe_in(&devices_dir().join("platform-gpu")).unwrap();
    assert_eq!(soc[0].pci, None, "a platform-bus GPU has no PCI facts");
    assert_eq!(soc[0].driver.as_deref(), Some("panthor"));
    let vm = devices_dir().join("vm-nonuma");
    assert_eq!(accel::HostNuma::read(&vm).online, None);
    assert_eq!(accel::HostNuma::read(&vm).n_nodes(), 1);
    let vdev = accel::probe_in(&vm).unwrap();
    assert_eq!(vdev[0].driver.as_deref(), Some("virtio_gpu"));
    assert_eq!(
        vdev[0].pci.as_ref().unwrap().address,
        "0000:00:02.0",
        "PCI parent of virtio0"
    );
}

#[test]
fn missing_node_under_dev_is_reported_not_fatal() {
    let devs = accel::probe_in(&devices_dir().join("intel-igpu")).unwrap();
    assert_eq!(
        devs[0].open_error.as_deref(),
        Some("missing: /dev/dri/renderD128")
    );
    assert_eq!(devs[0].driver.as_deref(), Some("i915"));
    assert_eq!(
        devs[0].local_cpus.as_deref(),
        Some(&[0, 1, 2, 3, 4, 5, 6, 7][..])
    );
}

/// A one-node-device tree whose `device/numa_node` is written by `numa`.
fn tree_with_numa(numa: impl FnOnce(&Path)) -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    let dev = r.join("sys/devices/pci0000:00/0000:00:02.0");
    fs::create_dir_all(dev.join("drm/renderD128")).unwrap();
    fs::create_dir_all(r.join("sys/class/drm")).unwrap();
    fs::create_dir_all(r.join("sys/devices/system/node")).unwrap();
    fs::write(r.join("sys/devices/system/node/online"), "0-1\n").unwrap();
    symlink("../../../0000:00:02.0", dev.join("drm/renderD128/device")).unwrap();
    symlink(
        "../../devices/pci0000:00/0000:00:02.0/drm/renderD128",
        r.join("sys/class/drm/renderD128"),
    )
    .unwrap();
    numa(&dev);
    t
}

fn probe_numa(numa: impl FnOnce(&Path)) -> (Option<u32>, Vec<String>) {
    let t = tree_with_numa(numa);
    let devs = accel::probe_in(t.path()).unwrap();
    assert_eq!(devs.len(), 1);
    assert_eq!(
        accel::device_numa_node(t.path(), &devs[0]),
        devs[0].numa_node
    );
    (devs[0].numa_node, devs[0].notes.clone())
}

#[test]
fn bad_numa_node_content_has_defined_answers() {
    let write = |text: &'static str| move |d: &Path| fs::write(d.join("numa_node"), text).unwrap();
    assert_eq!(probe_numa(write("1\n")), (Some(1), vec![]));
    assert_eq!(
        probe_numa(|_| ()),
        (None, vec!["numa_node: missing".to_string()])
    );
    assert_eq!(
        probe_numa(write("-1\n")).1,
        ["numa_node: -1 (no NUMA affinity)"]
    );
    assert_eq!(probe_numa(write("")).1, ["numa_node: empty"]);
    assert_eq!(probe_numa(write("\n")).1, ["numa_node: empty"]);
    assert_eq!(probe_numa(write("x1")).1, ["numa_node: unparsable \"x1\""]);
    assert_eq!(
        probe_numa(write("2\n")).1,
        ["numa_node: 2 is not an online node (online: 0-1)"]
    );
    assert_eq!(
        probe_numa(write("-7")).1,
        ["numa_node: out of range \"-7\""]
    );
    let (n, notes) = probe_numa(|d| symlink("numa_node", d.join("numa_node")).unwrap());
    assert_eq!(n, None);
    assert!(notes[0].contains("os error 40"), "{notes:?}");
    let (n, notes) = probe_numa(|d| fs::create_dir(d.join("numa_node")).unwrap());
    assert_eq!(n, None);
    assert!(notes[0].starts_with("numa_node: unreadable"), "{notes:?}");
    let (n, notes) = probe_numa(|d| fs::write(d.join("numa_node"), [0xff, 0xfe, b'1']).unwrap());
    assert_eq!(n, None);
    assert!(notes[0].contains("not UTF-8"), "{notes:?}");
}

/// A node name the kernel never writes (`renderD0128`: a leading zero) is
/// ignored like `card0`, never reported under its canonical name: before the
/// fix the probe listed `renderD128` as "missing" (the name it rebuilt) and
/// read the sysfs facts of a directory that does not exist.
#[test]
fn non_canonical_node_names_are_ignored() {
    let t = tempfile::tempdir().unwrap();
    let r = t.path();
    for dir in ["dev/dri", "dev/accel"] {
        fs::create_dir_all(r.join(dir)).unwrap();
    }
    for name in ["renderD0128", "renderD00129"] {
        fs::write(r.join("dev/dri").join(name), "").unwrap();
        fs::create_dir_all(r.join("sys/class/drm").join(name).join("device")).unwrap();
    }
    fs::write(r.join("dev/accel/accel00"), "").unwrap();
    assert_eq!(accel::probe_in(r).unwrap(), vec![]);
    assert_eq!(accel::node::parse_node_name("renderD0128"), None);
    assert_eq!(accel::node::parse_node_name("accel01"), None);
    assert_eq!(
        accel::node::parse_node_name("accel0"),
        Some((NodeKind::Accel, 0))
    );
}

fn mkfifo(p: &Path) {
    use rustix::fs::{CWD, FileType, Mode, mknodat};
    mknodat(CWD, p, FileType::Fifo, Mode::from_raw_mode(0o600), 0).unwrap();
}

/// A FIFO where sysfs has an attribute (no writer: opening it for reading
/// blocks) gives a defined answer, never a hang: sysfs attributes are regular
/// files, so anything else is unreadable. Before the fix the probe blocked
/// forever in `open(2)` on the first FIFO.
#[test]
fn fifo_attributes_are_unreadable_not_a_hang() {
    let t = tree_with_numa(|d| {
        for attr in ["numa_node", "uevent", "local_cpulist", "vendor", "device"] {
            mkfifo(&d.join(attr));
        }
    });
    let online = t.path().join("sys/devices/system/node/online");
    fs::remove_file(&online).unwrap();
    mkfifo(&online);
    let devs = accel::probe_in(t.path()).unwrap();
    assert_eq!(devs.len(), 1);
    let d = &devs[0];
    assert_eq!((d.numa_node, &d.local_cpus), (None, &None));
    assert_eq!(
        d.notes,
        ["numa_node: unreadable: not a regular file"],
        "{d:?}"
    );
    let pci = d.pci.as_ref().expect("the PCI address comes from the path");
    assert_eq!((pci.vendor_id, pci.device_id), (None, None));
    assert_eq!(accel::device_numa_node(t.path(), d), None);
}

#[test]
fn random_garbage_never_panics() {
    let mut rng = fastrand::Rng::with_seed(0x5eed);
    for _ in 0..64 {
        let len = rng.usize(0..40);
        let bytes: Vec<u8> = (0..len).map(|_| rng.u8(..)).collect();
        let t = tree_with_numa(|d| {
            fs::write(d.join("numa_node"), &bytes).unwrap();
            fs::write(d.join("local_cpulist"), &bytes).unwrap();
            fs::write(d.join("vendor"), &bytes).unwrap();
            fs::write(d.join("uevent"), &bytes).unwrap();
        });
        fs::write(t.path().join("sys/devices/system/node/online"), &bytes).unwrap();
        let devs = accel::probe_in(t.path()).unwrap();
        assert_eq!(devs.len(), 1);
        if let Some(n) = devs[0].numa_node {
            assert!(n < sysfs::MAX_LIST_ID, "seeded bytes {bytes:?}");
        }
    }
}

#[test]
fn bad_roots_are_clear_errors() {
    let t = tempfile::tempdir().unwrap();
    let file = t.path().join("f");
    fs::write(&file, "").unwrap();
    assert!(matches!(
        accel::probe_in(&file),
        Err(ProbeError::Root { .. })
    ));
    assert!(matches!(
        accel::probe_in(&t.path().join("nope")),
        Err(ProbeError::Root { .. })
    ));
    fs::create_dir(t.path().join("dev")).unwrap();
    fs::write(t.path().join("dev/dri"), "").unwrap();
    let e = accel::probe_in(t.path()).unwrap_err();
    assert!(matches!(e, ProbeError::Io { .. }), "{e}");
    assert_eq!(xtc::Error::from(e), xtc::Error::Internal);
    assert_eq!(
        accel::probe_in(&t.path().join("dev")).unwrap(),
        vec![],
        "empty root, no node"
    );
}

#[test]
fn device_numa_node_rejects_foreign_names() {
    let root = devices_dir().join("nvidia-2node");
    let mut d = accel::probe_in(&root).unwrap().remove(0);
    d.name = "../../../etc".into();
    assert_eq!(accel::device_numa_node(&root, &d), None);
    d.name = "accel0".into();
    assert_eq!(
        accel::device_numa_node(&root, &d),
        None,
        "name of the other kind"
    );
}

#[test]
fn live_probe_smoke() {
    let devs = accel::probe().expect("probing / must not fail");
    for d in &devs {
        assert!(accel::node::parse_node_name(&d.name).is_some(), "{d:?}");
    }
    if devs.is_empty() {
        println!("live probe: no render or accel node on this machine");
    }
}
