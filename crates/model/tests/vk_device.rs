//! The Vulkan device layer on lavapipe (or a real GPU): discovery, choice,
//! buffers, submission and the completion fence fd (B-066).

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use std::os::fd::AsRawFd;

use xtc_vk::{Buffer, CommandPool, DeviceKind, FenceKind, Location, Selector};

#[test]
fn enumerate_lists_a_usable_device_and_auto_prefers_real_gpus() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let all = xtc_vk::enumerate().unwrap();
    assert!(
        all.iter()
            .any(|d| d.index == dev.info().index && d.name == dev.info().name)
    );
    let best = all
        .iter()
        .filter(|d| d.timeline_semaphore && d.compute_family.is_some())
        .map(|d| d.kind)
        .min();
    assert_eq!(Some(dev.info().kind), best, "Auto takes the best kind");
    assert!(dev.info().kind <= DeviceKind::Cpu);
}

#[test]
fn selectors_by_index_name_and_render_node() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let all = xtc_vk::enumerate().unwrap();
    let me = dev.info();
    assert_eq!(
        Selector::Index(me.index).choose(&all).unwrap().index,
        me.index
    );
    let name = me.name.split_whitespace().next().unwrap().to_uppercase();
    assert_eq!(Selector::Name(name).choose(&all).unwrap().name, me.name);
    assert!(matches!(
        Selector::Index(999).choose(&all),
        Err(xtc_vk::VkError::NoMatch(_))
    ));
    assert!(matches!(
        Selector::Name("no such gpu".into()).choose(&all),
        Err(xtc_vk::VkError::NoMatch(_))
    ));
    let bad = Selector::RenderNode("/dev/dri/renderD999".into()).choose(&all);
    assert!(matches!(bad, Err(xtc_vk::VkError::NoMatch(_))));
    if let Some(rn) = &me.render_node {
        assert_eq!(
            Selector::RenderNode(rn.path.clone())
                .choose(&all)
                .unwrap()
                .index,
            me.index
        );
    }
    let e: xtc::Error = xtc_vk::Device::open(&Selector::Index(999))
        .unwrap_err()
        .into();
    assert_eq!(e, xtc::Error::Inval);
}

#[test]
fn selector_parses_index_name_path() {
    assert_eq!("".parse::<Selector>().unwrap(), Selector::Auto);
    assert_eq!("2".parse::<Selector>().unwrap(), Selector::Index(2));
    assert_eq!(
        "llvmpipe".parse::<Selector>().unwrap(),
        Selector::Name("llvmpipe".into())
    );
    assert_eq!(
        "/dev/dri/renderD128".parse::<Selector>().unwrap(),
        Selector::RenderNode("/dev/dri/renderD128".into())
    );
}

#[test]
fn buffers_round_trip_direct_and_staged_and_reject_bad_ranges() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut a = Buffer::new(&dev, 64, Location::Upload, "a").unwrap();
    a.write(8, &[1u32, 2, 3]).unwrap();
    let mut out = [0u32; 3];
    a.read(8, &mut out).unwrap();
    assert_eq!(out, [1, 2, 3]);
    assert!(a.write(60, &[1u32, 2]).is_err());
    assert!(a.read(u64::MAX, &mut out).is_err());
    assert!(Buffer::new(&dev, 0, Location::Device, "zero").is_err());
    let mut b = Buffer::new(&dev, 16, Location::Readback, "b").unwrap();
    b.upload_staged(4, &[7.5f32, -1.0]).unwrap();
    let mut f = [0f32; 2];
    b.read(4, &mut f).unwrap();
    assert_eq!(f, [7.5, -1.0]);
    assert!(b.upload_staged(12, &[1f32, 2.0]).is_err());
}

#[test]
fn copy_then_fence_fd_becomes_readable() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let mut src = Buffer::new(&dev, 16, Location::Upload, "src").unwrap();
    let dst = Buffer::new(&dev, 16, Location::Readback, "dst").unwrap();
    src.write(0, &[9u32, 8, 7, 6]).unwrap();
    let mut pool = CommandPool::new(&dev).unwrap();
    let mut rec = pool.record_plain().unwrap();
    assert!(rec.copy(&src, 8, &dst, 0, 16).is_err(), "range outside src");
    assert!(rec.copy(&src, 0, &dst, 0, 0).is_err(), "empty copy");
    rec.copy(&src, 0, &dst, 0, 16).unwrap();
    rec.host_barrier();
    let cmd = rec.finish().unwrap();
    let sub = pool.submit(vec![cmd]).unwrap();
    assert_eq!(sub.kind(), dev.fence_kind());
    assert!(sub.fence_fd().as_raw_fd() >= 0);
    vk_support::wait_readable(sub.fence_fd());
    assert!(sub.is_complete().unwrap());
    let mut out = [0u32; 4];
    dst.read(0, &mut out).unwrap();
    assert_eq!(out, [9, 8, 7, 6]);
    assert_eq!(xtc_vk::validation_errors(), 0);
}

#[test]
fn lavapipe_uses_the_eventfd_waiter() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    if dev.info().kind == DeviceKind::Cpu {
        assert_eq!(
            dev.fence_kind(),
            FenceKind::EventFd,
            "lavapipe cannot export SYNC_FD"
        );
    }
}

#[test]
fn thread_safety_of_public_types() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<xtc_vk::Device>();
    send_sync::<xtc_vk::Submission>();
    send_sync::<xtc_vk::EventFence>();
    send_sync::<xtc_vk::Kernels>();
    send_sync::<xtc_vk::Buffer>();
    send::<xtc_vk::CommandPool>();
    send::<xtc_model::vulkan::f32_model::GpuModel>();
    send::<xtc_model::vulkan::InFlight>();
}

#[test]
fn objects_of_another_device_are_rejected() {
    let Some(a) = vk_support::device() else {
        return;
    };
    let b = xtc_vk::Device::open(&Selector::Index(a.info().index)).unwrap();
    assert!(!a.same(&b) && a.same(&a.clone()));
    let kernels_b = xtc_vk::Kernels::new(&b).unwrap();
    let bufs_a: Vec<Buffer> = (0..xtc_vk::BINDINGS)
        .map(|_| Buffer::new(&a, 16, Location::Upload, "a").unwrap())
        .collect();
    let refs: Vec<&Buffer> = bufs_a.iter().collect();
    assert!(
        xtc_vk::BindingSet::new(&kernels_b, &refs).is_err(),
        "buffers of device a, kernels of b"
    );
    let kernels_a = xtc_vk::Kernels::new(&a).unwrap();
    let set_a = xtc_vk::BindingSet::new(&kernels_a, &refs).unwrap();
    assert!(
        xtc_vk::BindingSet::new(&kernels_a, &refs[..2]).is_err(),
        "wrong binding count"
    );
    let mut pool_b = CommandPool::new(&b).unwrap();
    assert!(pool_b.record(&kernels_a, &set_a).is_err());
    let mut pool_a = CommandPool::new(&a).unwrap();
    let mut rec = pool_a.record(&kernels_a, &set_a).unwrap();
    let foreign = kernels_b.get("embed").unwrap();
    assert!(
        rec.dispatch(foreign, &[0u32; 5], [1, 1, 1]).is_err(),
        "kernel of device b"
    );
    let own = kernels_a.get("embed").unwrap();
    assert!(
        rec.dispatch(own, &[[0u32; 32], [0u32; 32]], [1, 1, 1])
            .is_err(),
        "256 push-constant bytes (PUSH_BYTES is 128)"
    );
    assert!(
        rec.dispatch(own, &[0u32; 5], [0, 1, 1]).is_err(),
        "empty grid"
    );
    let buf_b = Buffer::new(&b, 16, Location::Upload, "b").unwrap();
    assert!(
        rec.copy(&bufs_a[0], 0, &buf_b, 0, 4).is_err(),
        "copy across devices"
    );
    assert!(kernels_a.get("no_such_kernel").is_err());
    rec.finish().unwrap();
}

/// The KV cache is cleared on the device (`vkCmdFillBuffer`), with no host
/// buffer of its size: `Buffer::zeroed` gives zeros even over memory a
/// previous buffer left dirty, and `Recorder::fill` writes its word over
/// exactly its range and refuses ranges it cannot fill.
#[test]
fn buffers_are_filled_and_zeroed_on_the_device() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    let n = 1 << 16;
    for _ in 0..2 {
        let mut dirty = Buffer::new(&dev, n * 4, Location::Readback, "dirty").unwrap();
        dirty.write(0, &vec![0xffff_ffffu32; n as usize]).unwrap();
        drop(dirty);
        let z = Buffer::zeroed(&dev, n * 4, Location::Readback, "zeroed").unwrap();
        let mut out = vec![1u32; n as usize];
        z.read(0, &mut out).unwrap();
        assert!(out.iter().all(|&w| w == 0), "a word is not zero");
    }
    assert!(Buffer::zeroed(&dev, 6, Location::Device, "odd").is_err());
    let dst = Buffer::new(&dev, 64, Location::Readback, "dst").unwrap();
    let mut pool = CommandPool::new(&dev).unwrap();
    let mut rec = pool.record_plain().unwrap();
    rec.fill(&dst, 0, 64, 0).unwrap();
    rec.barrier();
    rec.fill(&dst, 16, 32, 0xdead_beef).unwrap();
    assert!(rec.fill(&dst, 2, 8, 1).is_err(), "unaligned offset");
    assert!(rec.fill(&dst, 0, 6, 1).is_err(), "unaligned length");
    assert!(rec.fill(&dst, 48, 32, 1).is_err(), "past the end");
    assert!(rec.fill(&dst, 0, 0, 1).is_err(), "empty");
    rec.host_barrier();
    let cmd = rec.finish().unwrap();
    pool.submit(vec![cmd]).unwrap().wait(None).unwrap();
    let mut out = [7u32; 16];
    dst.read(0, &mut out).unwrap();
    let want: Vec<u32> = (0..16)
        .map(|i| if (4..12).contains(&i) { 0xdead_beef } else { 0 })
        .collect();
    assert_eq!(out.to_vec(), want);
    assert_eq!(xtc_vk::validation_errors(), 0);
}
