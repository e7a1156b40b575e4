//! The comparisons of the kernels suite (after llama.cpp's test-backend-ops):
//! normalized mean squared error under a per-kernel threshold, NaN/Inf
//! agreement, exact equality for exact ops, and guard regions that must come
//! back untouched.

use std::fmt::Debug;

use super::case::CaseError;

/// Normalized mean squared error `sum (got - want)^2 / sum want^2` (in f64;
/// the plain squared error when `want` is all zeros).
///
/// # Panics
/// If the slices differ in length.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "nmse of slices of different lengths");
    let (mut err, mut norm) = (0f64, 0f64);
    for (&g, &w) in got.iter().zip(want) {
        let d = f64::from(g) - f64::from(w);
        err += d * d;
        norm += f64::from(w) * f64::from(w);
    }
    if norm == 0.0 { err } else { err / norm }
}

/// NaN and Inf must agree element for element: a NaN where the reference has
/// none (or none where it has one), or an infinity of another sign or where
/// the reference is finite, fails naming the first index.
///
/// # Errors
/// [`CaseError::Fail`] naming `what`, the index and both values.
pub fn finite_like(what: &str, got: &[f32], want: &[f32]) -> Result<(), CaseError> {
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let bad = if g.is_nan() || w.is_nan() {
            g.is_nan() != w.is_nan()
        } else if g.is_infinite() || w.is_infinite() {
            g != w
        } else {
            false
        };
        if bad {
            return Err(CaseError::Fail(format!(
                "{what}: NaN/Inf mismatch at index {i}: device {g}, reference {w}"
            )));
        }
    }
    Ok(())
}

/// `got` agrees with `want`: the same length, NaN/Inf alike
/// ([`finite_like`]) and [`nmse`] at most `max_nmse`. Returns the NMSE.
///
/// # Errors
/// [`CaseError::Fail`] naming `what`, the NMSE, the threshold and the
/// largest absolute difference with its index.
pub fn close(what: &str, got: &[f32], want: &[f32], max_nmse: f64) -> Result<f64, CaseError> {
    if got.len() != want.len() {
        return Err(CaseError::Fail(format!(
            "{what}: {} values from the device, {} from the reference",
            got.len(),
            want.len()
        )));
    }
    finite_like(what, got, want)?;
    let finite: (Vec<f32>, Vec<f32>) = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g.is_finite() && w.is_finite())
        .map(|(g, w)| (*g, *w))
        .unzip();
    let e = nmse(&finite.0, &finite.1);
    if e.is_nan() || e > max_nmse {
        let (i, d) = got
            .iter()
            .zip(want)
            .map(|(g, w)| (g - w).abs())
            .enumerate()
            .fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
        return Err(CaseError::Fail(format!(
            "{what}: NMSE {e:.3e} > {max_nmse:.0e} (largest difference {d:.3e} at index {i}: device {}, reference {})",
            got[i], want[i]
        )));
    }
    Ok(e)
}

/// `got == want` element for element (gathers, copies, argmax).
///
/// # Errors
/// [`CaseError::Fail`] naming `what` and the first differing index.
pub fn exact<T: PartialEq + Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), CaseError> {
    if got.len() != want.len() {
        return Err(CaseError::Fail(format!(
            "{what}: {} values from the device, {} expected",
            got.len(),
            want.len()
        )));
    }
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(CaseError::Fail(format!(
            "{what}: not exact at index {i}: device {:?}, expected {:?} ({} of {} differ)",
            got[i],
            want[i],
            got.iter().zip(want).filter(|(g, w)| g != w).count(),
            got.len()
        ))),
    }
}

/// f32 bit patterns equal (exact ops over floats: NaN payloads and -0 count).
///
/// # Errors
/// As [`exact`].
pub fn bits(what: &str, got: &[f32], want: &[f32]) -> Result<(), CaseError> {
    let g: Vec<u32> = got.iter().map(|v| v.to_bits()).collect();
    let w: Vec<u32> = want.iter().map(|v| v.to_bits()).collect();
    exact(what, &g, &w)
}

/// A buffer's words before a run, and the element ranges an op may write:
/// everything else must come back bit for bit (guard regions around every
/// output, inputs left alone).
#[derive(Debug, Clone)]
pub struct Guarded {
    /// What the buffer is called in messages.
    pub name: &'static str,
    /// Every word as written before the run.
    pub before: Vec<u32>,
    /// Ranges the op may write, in elements.
    pub writable: Vec<std::ops::Range<usize>>,
}

impl Guarded {
    /// Checks `after` (the whole buffer read back) against the snapshot.
    ///
    /// # Errors
    /// [`CaseError::Fail`] naming the buffer, the first changed element
    /// outside every writable range and where it is (before, after or
    /// between the writable ranges), and how many changed.
    pub fn check(&self, after: &[u32]) -> Result<(), CaseError> {
        let may = |i: usize| self.writable.iter().any(|r| r.contains(&i));
        let changed: Vec<usize> = (0..self.before.len().min(after.len()))
            .filter(|&i| after[i] != self.before[i] && !may(i))
            .collect();
        let Some(&first) = changed.first() else {
            return Ok(());
        };
        let near = self
            .writable
            .iter()
            .map(|r| {
                if first < r.start {
                    (
                        r.start - first,
                        format!("{} before output {r:?}", r.start - first),
                    )
                } else {
                    (
                        first + 1 - r.end,
                        format!("{} after the end of output {r:?}", first + 1 - r.end),
                    )
                }
            })
            .min_by_key(|(d, _)| *d)
            .map(|(_, s)| s)
            .unwrap_or_else(|| "no output declared".into());
        Err(CaseError::Fail(format!(
            "out-of-bounds write: {} buffer element {first} changed (0x{:08x} -> 0x{:08x}), {near}; {} elements outside the outputs changed",
            self.name,
            self.before[first],
            after[first],
            changed.len()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nmse_is_relative_to_the_reference() {
        assert_eq!(nmse(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        let e = nmse(&[1.1, 2.0], &[1.0, 2.0]);
        assert!((e - 0.01 / 5.0).abs() < 1e-9, "{e}");
        assert!(close("x", &[1.0, 2.0], &[1.0, 2.0001], 1e-7).is_ok());
        assert!(close("x", &[1.0, 3.0], &[1.0, 2.0], 1e-7).is_err());
    }

    #[test]
    fn nan_and_inf_must_agree() {
        assert!(close("x", &[f32::NAN], &[1.0], 1.0).is_err());
        assert!(close("x", &[1.0], &[f32::NAN], 1.0).is_err());
        assert!(close("x", &[f32::INFINITY], &[f32::NEG_INFINITY], 1.0).is_err());
        assert!(close("x", &[f32::INFINITY, 1.0], &[f32::INFINITY, 1.0], 1e-9).is_ok());
        assert!(close("x", &[f32::MAX], &[f32::INFINITY], 1.0).is_err());
    }

    #[test]
    fn exact_names_the_first_difference() {
        assert!(exact("t", &[1u32, 2], &[1, 2]).is_ok());
        let Err(CaseError::Fail(m)) = exact("t", &[1u32, 3, 4], &[1, 2, 5]) else {
            panic!("not a failure")
        };
        assert!(m.contains("index 1") && m.contains("2 of 3"), "{m}");
        assert!(bits("b", &[0.0], &[-0.0]).is_err());
    }

    #[test]
    fn guards_catch_writes_outside_the_outputs() {
        let g = Guarded {
            name: "activations",
            before: vec![7; 10],
            writable: std::iter::once(3..6).collect(),
        };
        let mut after = vec![7; 10];
        after[3..6].copy_from_slice(&[1, 2, 3]);
        assert!(g.check(&after).is_ok());
        after[6] = 9;
        let Err(CaseError::Fail(m)) = g.check(&after) else {
            panic!("not caught")
        };
        assert!(
            m.contains("element 6") && m.contains("1 after the end"),
            "{m}"
        );
        after[6] = 7;
        after[1] = 0;
        let Err(CaseError::Fail(m)) = g.check(&after) else {
            panic!("not caught")
        };
        assert!(
            m.contains("element 1") && m.contains("2 before output"),
            "{m}"
        );
    }
}
