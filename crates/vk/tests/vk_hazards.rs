//! Regression tests of the hazards and misuses the Khronos validation layer
//! found (synchronization validation on): each runs the path that raised
//! one on a device opened WITH validation, whatever `XTC_VK_VALIDATION`
//! says, and asserts the layer reported nothing. Each failed before its fix.
//!
//! Needs the layer (`.ci/ensure-deps.sh` installs `vulkan-validationlayers`).

mod vk_support;

use xtc_vk::{Device, Selector, StorageImage, TexelFormat, Validation};

/// The default device under core + synchronization validation, or `None`
/// (outside CI) on a machine with no Vulkan.
fn validated() -> Option<Device> {
    vk_support::device()?;
    Some(
        Device::open_with(&Selector::Auto, Validation::Sync)
            .expect("validation requested: the layer must be installed (.ci/ensure-deps.sh)"),
    )
}

/// Asserts the layer reported no error since `before`.
fn assert_clean(before: u64, what: &str) {
    let n = xtc_vk::validation_errors() - before;
    assert_eq!(
        n,
        0,
        "{what}: {n} validation error(s), the last: {}",
        xtc_vk::last_validation_error().unwrap_or_default()
    );
}

/// `StorageImage::upload` moved the image from `UNDEFINED` to `GENERAL`
/// with a barrier whose second scope was compute work only, then wrote it
/// with a transfer (`vkCmdCopyBufferToImage`): SYNC-HAZARD-WRITE-AFTER-WRITE
/// between the layout transition and the copy (the weight images of every
/// GGUF model on a CPU device, so `xtc generate` raised it). A second upload
/// of the same image also orders its transition after the earlier copies.
#[test]
fn image_upload_orders_the_layout_transition_before_the_copy() {
    let Some(dev) = validated() else {
        return;
    };
    let before = xtc_vk::validation_errors();
    // Three rows of 64 texels per layer, two layers; 16 MiB pieces: one piece.
    let mut img = StorageImage::with_format(&dev, TexelFormat::Rgba32U, [64, 3, 2], "w").unwrap();
    let data: Vec<u8> = (0..64 * 3 * 2 * 16).map(|i| i as u8).collect();
    img.upload(&data).unwrap();
    img.upload(&data[..64 * 16]).unwrap();
    assert_clean(before, "two uploads");
    // 300 rows of 64 KiB: two pieces, two submissions.
    let mut big =
        StorageImage::with_format(&dev, TexelFormat::Rgba32U, [4096, 150, 2], "big").unwrap();
    big.upload(&vec![1u8; 4096 * 300 * 16]).unwrap();
    assert_clean(before, "an upload in two pieces");
}
