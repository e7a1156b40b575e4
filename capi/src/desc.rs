//! Sized, versioned descriptors: the Linux `copy_struct_from_user` /
//! `copy_struct_to_user` convention (B-006, B-061, B-104, B-180, B-181).
//!
//! Every options and statistics descriptor starts with `uint32_t size;
//! uint32_t version;`. The application sets `size = sizeof(descriptor)` as
//! its header declared it and `version = XTC_BATCH_VERSION`. The library
//! checks, in this order:
//!
//! 1. NULL descriptor: `XTC_E_INVAL`;
//! 2. `size` below the descriptor's first layout (`SIZE_VER0`) or above
//!    `XTC_DESC_SIZE_MAX`: `XTC_E_INVAL` (B-180 "descriptor size");
//! 3. `version != XTC_BATCH_VERSION`: `XTC_E_VERSION` (B-181);
//! 4. input descriptors only: `size` larger than the library's layout
//!    (a newer header) is accepted only if every byte past the library's
//!    layout is zero; otherwise `XTC_E_INVAL` (what Linux answers with
//!    `E2BIG`: a field this library does not know was set).
//!
//! An older, smaller input descriptor (from `SIZE_VER0` up) is accepted and
//! the fields it lacks read as zero. An output descriptor gets the fields
//! that fit in its `size` (the bytes past the library's layout are zeroed);
//! its `size` and `version` are left as the application wrote them.

use std::mem::{MaybeUninit, size_of};
use std::ptr;

use xtc::Error;

use crate::codes::{XTC_BATCH_VERSION, XTC_DESC_SIZE_MAX};

/// A `#[repr(C)]` descriptor beginning with `uint32_t size; uint32_t version;`.
///
/// # Safety
/// The implementor is `#[repr(C)]`, starts with two `u32` fields (size,
/// version), `SIZE_VER0 >= 8`, and every bit pattern in which the bytes past
/// any accepted size are zero is a valid value: its fields are integers,
/// raw pointers or `Option`s of function pointers, and every field that
/// starts before `SIZE_VER0` ends by it (so only integer fields can be cut
/// by a `size` between `SIZE_VER0` and the full layout).
pub(crate) unsafe trait Descriptor: Sized {
    /// Size of the first layout: the smallest `size` accepted.
    const SIZE_VER0: usize;
}

/// Reads `size` and `version` and checks them (steps 1..3 of the module doc);
/// returns `size`.
///
/// # Safety
/// `p` is NULL or points to a readable, aligned descriptor header.
unsafe fn header<T: Descriptor>(p: *const T) -> Result<usize, Error> {
    if p.is_null() {
        return Err(Error::Inval);
    }
    let words = p.cast::<u32>();
    // SAFETY: p is non-NULL, aligned for T (hence for u32) and starts with a
    // readable u32 `size` (the caller's contract).
    let size = unsafe { ptr::read(words) };
    if (size as usize) < T::SIZE_VER0 || size > XTC_DESC_SIZE_MAX {
        return Err(Error::Inval);
    }
    // SAFETY: size >= SIZE_VER0 >= 8 says the second u32 (`version`) is part
    // of the application's object.
    let version = unsafe { ptr::read(words.add(1)) };
    if version != XTC_BATCH_VERSION {
        return Err(Error::Version);
    }
    Ok(size as usize)
}

/// Copies an input descriptor into a library-sized value (module doc).
///
/// # Errors
/// `Inval` (NULL, size, nonzero unknown tail) or `Version`.
///
/// # Safety
/// `p` is NULL or points to a descriptor of at least its own `size` bytes.
pub(crate) unsafe fn read_in<T: Descriptor>(p: *const T) -> Result<T, Error> {
    // SAFETY: forwarded caller contract.
    let size = unsafe { header(p)? };
    let ours = size_of::<T>();
    let bytes = p.cast::<u8>();
    if size > ours {
        // SAFETY: the application declared `size` readable bytes at p.
        let tail = unsafe { std::slice::from_raw_parts(bytes.add(ours), size - ours) };
        if tail.iter().any(|&b| b != 0) {
            return Err(Error::Inval);
        }
    }
    let mut v = MaybeUninit::<T>::zeroed();
    // SAFETY: min(size, ours) bytes are readable at p and writable in v; the
    // two do not overlap (v is a local).
    unsafe { ptr::copy_nonoverlapping(bytes, v.as_mut_ptr().cast::<u8>(), size.min(ours)) };
    // SAFETY: zero bytes and copied prefixes are valid for every field of a
    // `Descriptor` (its Safety section).
    Ok(unsafe { v.assume_init() })
}

/// Writes `value`'s fields after the header into an output descriptor, as
/// many bytes as its `size` holds; bytes past the library's layout are zeroed.
///
/// # Errors
/// `Inval` (NULL, size) or `Version`; nothing is written then.
///
/// # Safety
/// `p` is NULL or points to a writable descriptor of at least its own `size`
/// bytes.
pub(crate) unsafe fn write_out<T: Descriptor>(p: *mut T, value: &T) -> Result<(), Error> {
    // SAFETY: forwarded caller contract.
    let size = unsafe { header(p.cast_const())? };
    let ours = size_of::<T>();
    const HDR: usize = 8;
    let dst = p.cast::<u8>();
    let src = ptr::from_ref(value).cast::<u8>();
    // SAFETY: bytes HDR..min(size, ours) are inside both objects (size >= 8);
    // the application's descriptor is not the library's local `value`.
    unsafe { ptr::copy_nonoverlapping(src.add(HDR), dst.add(HDR), size.min(ours) - HDR) };
    if size > ours {
        // SAFETY: the application declared `size` writable bytes at p.
        unsafe { ptr::write_bytes(dst.add(ours), 0, size - ours) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[repr(C)]
    #[derive(Debug, Default, Clone, Copy, PartialEq)]
    struct D {
        size: u32,
        version: u32,
        a: u64,
        b: u64, // added in the second layout
    }

    // SAFETY: repr(C), header first, integer fields, VER0 ends after `a`.
    unsafe impl Descriptor for D {
        const SIZE_VER0: usize = 16;
    }

    #[repr(C)]
    struct Big {
        d: D,
        extra: [u8; 8],
    }

    fn d(size: u32, version: u32) -> D {
        D {
            size,
            version,
            a: 7,
            b: 9,
        }
    }

    #[test]
    fn input_checks_size_then_version_then_tail() {
        // SAFETY: x is a whole D; every size used below is at most size_of::<D>().
        let read = |x: &D| unsafe { read_in(ptr::from_ref(x)) };
        // SAFETY: NULL is allowed.
        assert_eq!(unsafe { read_in::<D>(ptr::null()) }, Err(Error::Inval));
        assert_eq!(read(&d(24, 1)), Ok(d(24, 1)));
        assert_eq!(read(&d(15, 1)), Err(Error::Inval), "below VER0");
        assert_eq!(read(&d(0, 1)), Err(Error::Inval));
        assert_eq!(read(&d(15, 2)), Err(Error::Inval), "size before version");
        assert_eq!(read(&d(24, 0)), Err(Error::Version));
        assert_eq!(read(&d(24, 2)), Err(Error::Version));
        let old = read(&d(16, 1)).unwrap();
        assert_eq!((old.a, old.b), (7, 0), "the field an old layout lacks is 0");
        let mut big = Big {
            d: d(32, 1),
            extra: [0; 8],
        };
        // SAFETY: a Big is a D followed by 8 bytes; its sizes stay within it
        // or are refused before the tail is read (4097).
        let rb = |x: &Big| unsafe { read_in(ptr::from_ref(x).cast::<D>()) };
        assert_eq!(rb(&big), Ok(d(32, 1)), "a zero tail is accepted");
        big.extra[7] = 1;
        assert_eq!(rb(&big), Err(Error::Inval), "a nonzero tail is refused");
        big.d.size = 4097;
        assert_eq!(rb(&big), Err(Error::Inval), "above XTC_DESC_SIZE_MAX");
    }

    #[test]
    fn output_fills_what_fits_and_zeroes_the_unknown_tail() {
        let v = d(0, 0);
        let mut out = D {
            size: 16,
            version: 1,
            a: 0,
            b: 55,
        };
        // SAFETY: out is a whole, writable D declaring 16 bytes.
        unsafe { write_out(&mut out, &v) }.unwrap();
        assert_eq!((out.size, out.version, out.a, out.b), (16, 1, 7, 55));
        let mut big = Big {
            d: D {
                size: 32,
                version: 1,
                ..D::default()
            },
            extra: [3; 8],
        };
        // SAFETY: big.d starts a writable Big of the 32 bytes it declares.
        unsafe { write_out(&mut big.d, &v) }.unwrap();
        assert_eq!((big.d.a, big.d.b, big.extra), (7, 9, [0; 8]));
        let mut bad = D {
            size: 24,
            version: 3,
            ..D::default()
        };
        // SAFETY: bad is a whole, writable D.
        assert_eq!(unsafe { write_out(&mut bad, &v) }, Err(Error::Version));
        assert_eq!(bad.a, 0, "nothing written on error");
    }
}
