//! Without the `sched-policy` feature (`--enable-sched-policy` off) every
//! `xtc_batch_*` call returns `XTC_E_NOSYS` before looking at its arguments,
//! and `xtc_batch_loop_for_device` still writes 0 (B-005, B-159). The runtime
//! and accelerator calls stay available. Run with
//! `cargo test -p xtc-capi --no-default-features --test capi_nosys`.
#![cfg(not(feature = "sched-policy"))]

use std::ptr::{null, null_mut};

use xtc_capi::status::{XTC_E_NOSYS, XTC_OK};
use xtc_capi::*;

#[test]
fn every_batch_call_is_nosys() {
    let mut lp: *mut xtc_loop_t = null_mut();
    // SAFETY: a valid out pointer.
    let rc = unsafe { xtc_loop_new(&mut lp) };
    assert_eq!(rc, XTC_OK, "runtime calls stay");
    let mut g: *mut xtc_batch_t = null_mut();
    let mut h = 0u64;
    let mut st = xtc_batch_stats_t::default();
    let mut ast = xtc_batch_async_stats_t::default();
    let mut r: *mut xtc_batch_router_t = null_mut();
    let mut idx = 7;
    // SAFETY: every pointer is NULL or valid; a disabled build reads none.
    unsafe {
        assert_eq!(xtc_batch_create(lp, null(), &mut g), XTC_E_NOSYS);
        assert_eq!(xtc_batch_create_async(lp, null(), &mut g), XTC_E_NOSYS);
        assert_eq!(
            xtc_batch_submit(null_mut(), null_mut(), 1, &mut h),
            XTC_E_NOSYS
        );
        assert_eq!(
            xtc_batch_submit_mt(null_mut(), null_mut(), 1, &mut h),
            XTC_E_NOSYS
        );
        assert_eq!(xtc_batch_cancel(null_mut(), 1), XTC_E_NOSYS);
        assert_eq!(xtc_batch_cancel_mt(null_mut(), 1), XTC_E_NOSYS);
        assert_eq!(xtc_batch_resume(null_mut(), 1), XTC_E_NOSYS);
        assert_eq!(xtc_batch_resume_mt(null_mut(), 1), XTC_E_NOSYS);
        assert_eq!(xtc_batch_close(null_mut(), CloseModeArg(0)), XTC_E_NOSYS);
        assert_eq!(xtc_batch_destroy(null_mut()), XTC_E_NOSYS);
        assert_eq!(xtc_batch_get_stats(null_mut(), &mut st), XTC_E_NOSYS);
        assert_eq!(xtc_batch_get_async_stats(null_mut(), &mut ast), XTC_E_NOSYS);
        assert_eq!(xtc_batch_router_create(null_mut(), 1, &mut r), XTC_E_NOSYS);
        assert_eq!(
            xtc_batch_loop_for_device(null_mut(), null(), &mut idx),
            XTC_E_NOSYS
        );
        assert_eq!(idx, 0, "the disabled helper still writes 0 (B-159)");
        assert!(xtc_batch_route(null_mut(), 3).is_null());
        assert!(g.is_null() && r.is_null() && h == 0, "nothing written");
        assert_eq!(xtc_loop_fini(lp), XTC_OK);
    }
}
