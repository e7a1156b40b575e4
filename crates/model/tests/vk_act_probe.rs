//! The activations probe (`xtc_model::vulkan::act_probe`, what
//! `XTC_ACTIVATIONS=auto` resolves by): on the Vulkan device it measures
//! the f32 and the int8 products in each kernel form the device can run
//! (the CPU form where it has subgroups, the GPU form always, and the GPU
//! form again with subgroups masked), checks the int8 outputs against the
//! f32 ones, reports the dot form the device offers, and `resolve` turns
//! `Auto` into exactly the choice its ratio makes. Needs a Vulkan device
//! (lavapipe in CI); with `CI` set a missing one fails.

#[path = "../../vk/tests/vk_support/mod.rs"]
mod vk_support;

use xtc_model::vulkan::act_probe::{self, INT8_RATIO};
use xtc_model::vulkan::form;
use xtc_model::vulkan::ops::Variant;
use xtc_model::vulkan::qops8::{Activations, DotForm};
use xtc_vk::{Device, Mask, Selector};

fn check(dev: &Device, variant: Variant) {
    let p = act_probe::measure(dev, variant).unwrap();
    assert_eq!(p.variant, variant);
    // CPU devices pack Q4_1's products in pairs; elsewhere OpSDot where the
    // device has it.
    let native = dev.integer_dot_product();
    let want_dot = if dev.info().kind == xtc_vk::DeviceKind::Cpu {
        DotForm::Swar { native }
    } else if native {
        DotForm::Native
    } else {
        DotForm::Poly
    };
    assert_eq!(p.dot, want_dot);
    assert!(p.f32.as_nanos() > 0 && p.int8.as_nanos() > 0, "{p:?}");
    assert!(p.ratio().is_finite() && p.ratio() > 0.0, "{p:?}");
    assert_eq!(xtc_vk::validation_errors(), 0, "Vulkan validation errors");
    println!(
        "{} ({variant:?} form, {:?}): f32 {:.1} us, int8 {:.1} us, f32/int8 {:.2}x",
        dev.info().name,
        p.dot,
        p.f32.as_secs_f64() * 1e6,
        p.int8.as_secs_f64() * 1e6,
        p.ratio()
    );
    // `Auto` resolves by the (cached) ratio; every other value is itself.
    let r = act_probe::int8_ratio(dev, variant).unwrap();
    let want = if r >= INT8_RATIO {
        Activations::Int8
    } else {
        Activations::F32
    };
    assert_eq!(Activations::Auto.resolve(dev, variant).unwrap(), want);
    for a in [Activations::F32, Activations::Int8, Activations::Int8Poly] {
        assert_eq!(a.resolve(dev, variant).unwrap(), a);
    }
    assert_eq!(
        Activations::Auto.dot_form(dev),
        None,
        "unresolved Auto is f32"
    );
}

#[test]
fn the_probe_measures_and_checks_both_forms() {
    let Some(dev) = vk_support::device() else {
        return;
    };
    if form::cpu_form_supported(&dev) {
        check(&dev, Variant::Cpu);
    }
    check(&dev, Variant::Gpu);
}

#[test]
fn the_probe_runs_the_gpu_form_without_subgroups() {
    if vk_support::device().is_none() {
        return;
    }
    let dev = Device::open_with_mask(&Selector::Auto, Mask::SUBGROUPS).unwrap();
    assert!(!form::cpu_form_supported(&dev));
    check(&dev, Variant::Gpu);
}
