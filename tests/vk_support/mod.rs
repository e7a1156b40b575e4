//! Shared helpers of the `vk_*` tests.
#![allow(dead_code)]

use xtc::vk::{Device, Selector};

/// The default Vulkan device (lavapipe in CI), or `None` (test skipped) when
/// there is none and `CI` is unset. With `CI` set a missing device fails.
pub fn device() -> Option<Device> {
    match Device::open(&Selector::Auto) {
        Ok(d) => Some(d),
        Err(e) if std::env::var_os("CI").is_none() => {
            eprintln!("skipping: no Vulkan device ({e}); set CI=1 to make this a failure");
            None
        }
        Err(e) => panic!("CI is set but no Vulkan device opened: {e}"),
    }
}

/// Open fds of this process (entries of /proc/self/fd).
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Largest absolute difference between two equally long slices.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Blocks in poll(2) until `fd` is readable; asserts POLLIN.
pub fn wait_readable(fd: std::os::fd::BorrowedFd<'_>) {
    use rustix::event::{PollFd, PollFlags, poll};
    let mut fds = [PollFd::new(&fd, PollFlags::IN)];
    loop {
        match poll(&mut fds, None) {
            Ok(_) => break,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => panic!("poll: {e}"),
        }
    }
    assert!(
        fds[0].revents().contains(PollFlags::IN),
        "fence fd readable"
    );
}

/// A bench for single kernels: the five kernel-ABI buffers in host-visible
/// memory (0 weights f32, 1 activations f32, 2 KV cache f32, 3 metadata u32,
/// 4 tokens u32), one binding set and a command pool.
pub struct Rig {
    pub ops: xtc::decode::model::ops::Ops,
    pool: xtc::vk::CommandPool,
    set: xtc::vk::BindingSet,
    pub bufs: Vec<xtc::vk::Buffer>,
    kernels: xtc::vk::Kernels,
}

impl Rig {
    /// Buffers of `elems[i]` 4-byte elements each; the device's kernel variant.
    pub fn new(dev: &Device, elems: [usize; 5]) -> Rig {
        Rig::with_variant(
            dev,
            elems,
            xtc::decode::model::ops::Variant::for_device(dev),
        )
    }

    /// As [`Rig::new`] with the given kernel variant.
    pub fn with_variant(
        dev: &Device,
        elems: [usize; 5],
        variant: xtc::decode::model::ops::Variant,
    ) -> Rig {
        use xtc::vk::{Buffer, Location};
        let kernels = xtc::vk::Kernels::new(dev).unwrap();
        let ops = xtc::decode::model::ops::Ops::new(&kernels, variant).unwrap();
        let bufs: Vec<Buffer> = elems
            .iter()
            .map(|&n| Buffer::new(dev, (n.max(1) * 4) as u64, Location::Readback, "rig").unwrap())
            .collect();
        let refs: Vec<&Buffer> = bufs.iter().collect();
        let set = xtc::vk::BindingSet::new(&kernels, &refs).unwrap();
        let pool = xtc::vk::CommandPool::new(dev).unwrap();
        Rig {
            ops,
            pool,
            set,
            bufs,
            kernels,
        }
    }

    /// The uniform windows of the rig's binding set (over buffers 0 and 1).
    pub fn windows(&self) -> [xtc::vk::Window; xtc::vk::WINDOWS as usize] {
        self.set.windows()
    }

    /// Writes `data` at element `off` of buffer `i`.
    pub fn write<T: bytemuck::Pod>(&mut self, i: usize, off: usize, data: &[T]) {
        self.bufs[i].write((off * 4) as u64, data).unwrap();
    }

    /// Reads `n` elements at element `off` of buffer `i`.
    pub fn read<T: bytemuck::Pod + Default + Clone>(
        &self,
        i: usize,
        off: usize,
        n: usize,
    ) -> Vec<T> {
        let mut v = vec![T::default(); n];
        self.bufs[i].read((off * 4) as u64, &mut v).unwrap();
        v
    }

    /// Records `f` into one command buffer, submits it and waits for its fence
    /// fd; asserts the validation layer (on in debug builds) reported nothing.
    pub fn run(
        &mut self,
        f: impl FnOnce(&xtc::decode::model::ops::Ops, &mut xtc::vk::Recorder<'_>),
    ) {
        self.pool.reset().unwrap();
        let mut rec = self.pool.record(&self.kernels, &self.set).unwrap();
        f(&self.ops, &mut rec);
        rec.host_barrier();
        let cmd = rec.finish().unwrap();
        let sub = self.pool.submit(vec![cmd]).unwrap();
        wait_readable(sub.fence_fd());
        assert_eq!(xtc::vk::validation_errors(), 0, "Vulkan validation errors");
    }
}

/// `n` seeded uniform values in `[-1, 1)`.
pub fn rand_vec(rng: &mut fastrand::Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.f32() * 2.0 - 1.0).collect()
}
