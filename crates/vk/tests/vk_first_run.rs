//! The paths a GPU runs on its first run and lavapipe otherwise would not:
//! device-local memory the host cannot map (forced staging, every upload and
//! readback through staging buffers, at real sizes) and the persisted
//! `VkPipelineCache` (fresh, loaded by a second open, a corrupt or foreign
//! file ignored). Every device here runs under core + synchronization
//! validation and must report no error.

mod vk_support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use xtc_vk::pipeline_cache::{CacheRejected, CacheState, HEADER_BYTES};
use xtc_vk::{
    Buffer, Device, DeviceOptions, Kernels, Location, STAGING_PIECE, Selector, Validation,
};

/// Options with validation on (required) and nothing else.
fn validated() -> DeviceOptions {
    DeviceOptions {
        validation: (Validation::Sync, true),
        ..DeviceOptions::default()
    }
}

fn open(opts: &DeviceOptions) -> Device {
    Device::open_options(&Selector::Auto, opts)
        .expect("validation requested: the layer must be installed (.ci/ensure-deps.sh)")
}

fn assert_clean(what: &str) {
    assert_eq!(
        xtc_vk::validation_errors(),
        0,
        "{what}: the last: {}",
        xtc_vk::last_validation_error().unwrap_or_default()
    );
}

/// A fresh, empty directory for one test's cache files.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("xtc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The one cache file in `dir`.
fn cache_file(dir: &Path) -> PathBuf {
    let files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "one cache file (no temporary left): {files:?}"
    );
    files[0].clone()
}

/// 40 MiB + 12 bytes (three staging pieces, the last partial) up to a
/// device-local buffer the host may not map, and back, both through staging;
/// the bytes come back equal, also from an offset inside the second piece.
#[test]
fn forced_staging_round_trips_tens_of_megabytes() {
    if vk_support::device().is_none() {
        return;
    }
    let dev = open(&DeviceOptions {
        force_staging: true,
        ..validated()
    });
    assert!(dev.force_staging());
    let n = (40 << 20) / 4 + 3;
    let data: Vec<u32> = (0..n as u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let bytes = (n * 4) as u64;
    assert!(
        bytes > 2 * STAGING_PIECE,
        "the transfer spans several pieces"
    );
    let mut buf = Buffer::new(&dev, bytes, Location::Device, "first-run big").unwrap();
    assert!(!buf.is_mapped(), "forced staging: the host never maps it");
    let e = buf.write(0, &[1u32]).unwrap_err();
    assert!(e.to_string().contains("not host-mapped"), "{e}");
    buf.upload(0, &data).unwrap();
    let mut back = vec![0u32; n];
    buf.download(0, &mut back).unwrap();
    assert!(back == data, "round trip through staging");
    let from = STAGING_PIECE / 4 + 5;
    let mut part = vec![0u32; 1000];
    buf.download(from * 4, &mut part).unwrap();
    assert_eq!(part[..], data[from as usize..from as usize + 1000]);
    assert!(
        buf.download(bytes - 4, &mut [0u32; 2]).is_err(),
        "past the end"
    );
    // Upload and readback buffers stay host-visible: they are the staging.
    let up = Buffer::new(&dev, 64, Location::Upload, "up").unwrap();
    let rb = Buffer::new(&dev, 64, Location::Readback, "rb").unwrap();
    assert!(up.is_mapped() && rb.is_mapped());
    drop((buf, up, rb));
    assert_clean("forced staging");
}

/// Without forcing, lavapipe's device-local memory is mapped and `download`
/// reads it directly: the two paths agree on the same contents.
#[test]
fn mapped_and_staged_downloads_agree() {
    if vk_support::device().is_none() {
        return;
    }
    let dev = open(&validated());
    let data: Vec<f32> = (0..4096).map(|i| i as f32 * 0.5 - 7.0).collect();
    let mut buf = Buffer::new(&dev, 4096 * 4, Location::Device, "agree").unwrap();
    buf.upload_staged(0, &data).unwrap();
    let (mut a, mut b) = (vec![0f32; 4096], vec![0f32; 4096]);
    buf.download(0, &mut a).unwrap();
    buf.download_staged(0, &mut b).unwrap();
    assert_eq!(a, data);
    assert_eq!(b, data);
    drop(buf);
    assert_clean("mapped and staged downloads");
}

/// The first open finds no file (fresh) and `Kernels::new` writes one with a
/// valid header; the second open loads it. Prints pipeline creation cold
/// (no cache) and warm (loaded) and their ratio; asserts no timing.
#[test]
fn a_second_open_reads_the_pipeline_cache() {
    if vk_support::device().is_none() {
        return;
    }
    let dir = scratch("pipeline-cache");
    let opts = DeviceOptions {
        pipeline_cache: Some(dir.clone()),
        ..validated()
    };
    let dev = open(&opts);
    assert!(
        matches!(dev.pipeline_cache_state(), CacheState::Fresh),
        "{:?}",
        dev.pipeline_cache_state()
    );
    let t = Instant::now();
    let k = Kernels::new(&dev).unwrap();
    let cold = t.elapsed();
    let n = k.names().count();
    drop(k);
    drop(dev);
    let file = cache_file(&dir);
    let data = std::fs::read(&file).unwrap();
    assert!(data.len() >= HEADER_BYTES, "{} bytes", data.len());

    let dev = open(&opts);
    match dev.pipeline_cache_state() {
        CacheState::Loaded { bytes } => assert_eq!(*bytes, data.len()),
        other => panic!("second open: {other:?}"),
    }
    let t = Instant::now();
    drop(Kernels::new(&dev).unwrap());
    let warm = t.elapsed();
    let ratio = cold.as_secs_f64() / warm.as_secs_f64().max(1e-9);
    eprintln!(
        "pipeline creation, {n} pipelines: cold {:.1} ms, warm {:.1} ms, cold/warm {ratio:.2}x (cache file {} bytes)",
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        data.len()
    );
    drop(dev);
    assert_clean("pipeline cache");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A corrupt file and a file of another device are ignored (never an
/// error), the pipelines are built, and the file is rewritten valid.
#[test]
fn a_corrupt_or_foreign_pipeline_cache_is_ignored_and_replaced() {
    if vk_support::device().is_none() {
        return;
    }
    let dir = scratch("pipeline-cache-bad");
    let opts = DeviceOptions {
        pipeline_cache: Some(dir.clone()),
        ..validated()
    };
    let dev = open(&opts);
    drop(Kernels::new(&dev).unwrap());
    drop(dev);
    let file = cache_file(&dir);
    let good = std::fs::read(&file).unwrap();

    // Another vendor than this device's: NVIDIA's id on any other device,
    // AMD's on NVIDIA (the first run on an NVIDIA H200 found this case
    // writing the device's own id, which the cache then rightly loaded).
    let own = u32::from_le_bytes(good[8..12].try_into().unwrap());
    let other = if own == 0x10de { 0x1002u32 } else { 0x10de };
    let mut foreign = good.clone();
    foreign[8..12].copy_from_slice(&other.to_le_bytes());
    let garbage = b"not a pipeline cache at all, just text".to_vec();
    let cases: [(&str, Vec<u8>); 3] = [
        ("garbage", garbage),
        ("truncated", good[..HEADER_BYTES - 1].to_vec()),
        ("foreign", foreign),
    ];
    for (what, bytes) in cases {
        std::fs::write(&file, &bytes).unwrap();
        let dev = open(&opts);
        let state = dev.pipeline_cache_state();
        let expected = match what {
            "garbage" => matches!(state, CacheState::Ignored(CacheRejected::HeaderSize(_))),
            "truncated" => matches!(state, CacheState::Ignored(CacheRejected::Short(31))),
            _ => matches!(state, CacheState::Ignored(CacheRejected::Device { .. })),
        };
        assert!(expected, "{what}: {state:?}");
        let k = Kernels::new(&dev).expect("an ignored cache is no failure");
        assert!(k.names().count() > 0);
        drop(k);
        let rewritten = std::fs::read(cache_file(&dir)).unwrap();
        let info = dev.info();
        assert_eq!(
            &rewritten[8..12],
            &info.vendor_id.to_le_bytes(),
            "{what}: rewritten for this device"
        );
        drop(dev);
        let dev = open(&opts);
        assert!(
            matches!(dev.pipeline_cache_state(), CacheState::Loaded { .. }),
            "{what}: then loaded"
        );
    }
    assert_clean("ignored pipeline caches");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// With the cache off nothing is read or written.
#[test]
fn a_disabled_pipeline_cache_touches_no_file() {
    if vk_support::device().is_none() {
        return;
    }
    let dev = open(&validated());
    assert!(matches!(dev.pipeline_cache_state(), CacheState::Off));
    assert_eq!(dev.save_pipeline_cache().unwrap(), None);
    drop(dev);
    assert_clean("cache off");
}

/// A submission held back by a host gate is pending for as long as the gate
/// is closed, deterministically: its completion fd (an eventfd signalled by
/// the waiter thread on lavapipe, a sync_file where the driver exports them)
/// is not readable, and its timeline value not reached; once the host opens
/// the gate the fd becomes readable and the work complete. A sync_file is
/// also asked `SYNC_IOC_FILE_INFO`: active with a fence while pending,
/// signalled after.
#[test]
fn a_gated_submission_fd_is_not_readable_until_the_host_opens_the_gate() {
    if vk_support::device().is_none() {
        return;
    }
    let dev = open(&validated());
    let gate = xtc_vk::HostGate::new(&dev).unwrap();
    let mut pool = xtc_vk::CommandPool::new(&dev).unwrap();
    let mut rec = pool.record_plain().unwrap();
    rec.wait_gate(&gate).unwrap();
    let cmd = rec.finish().unwrap();
    let sub = pool.submit(vec![cmd]).unwrap();
    assert_eq!(sub.kind(), dev.fence_kind(), "a pending export is never -1");
    let sync_file = (sub.kind() == xtc_vk::FenceKind::SyncFile)
        .then(|| xtc::accel::SyncFile::from_fd(sub.fence_fd().try_clone_to_owned().unwrap()));
    for _ in 0..5 {
        let ready = xtc_vk::support::poll_readable(sub.fence_fd(), Some(Duration::from_millis(20)));
        assert!(!ready.unwrap(), "readable while the gate is closed");
        assert!(!sub.is_complete().unwrap());
    }
    if let Some(sf) = &sync_file {
        let info = sf.info().expect("SYNC_IOC_FILE_INFO on an exported fence");
        assert_eq!(info.status, xtc::accel::FenceStatus::Active, "{info:?}");
        assert!(!info.fences.is_empty(), "{info:?}");
    }
    assert!(!gate.is_open().unwrap());
    gate.open().unwrap();
    vk_support::wait_readable(sub.fence_fd());
    assert!(sub.is_complete().unwrap());
    if let Some(sf) = &sync_file {
        assert_eq!(
            sf.info().unwrap().status,
            xtc::accel::FenceStatus::Signalled
        );
    }
    drop((sub, pool, gate));
    assert_clean("gated submission");
}
