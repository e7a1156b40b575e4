//! Choosing the next token from logits: greedy by default, or temperature,
//! top-k, top-p and min-p sampling with a per-request seed.
//!
//! Greedy ([`SamplingParams::greedy`], temperature 0) takes the largest
//! logit, the lowest id among equal maxima (as `reference::argmax`); NaN
//! logits are never chosen unless all are. Otherwise, in this order (as
//! Hugging Face `generate` applies them):
//! 1. logits divided by the temperature, softmax (max-subtracted, f64);
//! 2. top-k: only the `k` most probable ids (ties broken by lower id; 0 = off);
//! 3. top-p: the smallest prefix of ids by falling probability whose mass
//!    reaches `p` (1 = off);
//! 4. min-p: ids whose probability is below `min_p` times the largest are
//!    dropped (0 = off);
//! 5. one id drawn from the rest, renormalised, with the sampler's seeded
//!    generator (`fastrand`, never unseeded): same seed, same logits, same ids.

/// Sampling settings of one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SamplingParams {
    /// Temperature; 0 is greedy. Finite, `>= 0`.
    pub temperature: f32,
    /// Keep the `top_k` most probable ids; 0 keeps all.
    pub top_k: usize,
    /// Nucleus mass in `(0, 1]`; 1 keeps all.
    pub top_p: f32,
    /// Relative floor in `[0, 1]`; 0 keeps all.
    pub min_p: f32,
    /// Seed of the request's generator.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams::greedy()
    }
}

/// A sampling setting out of range (naming the option).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name} = {value}: {why}")]
pub struct SamplingError {
    /// The setting (`temperature`, `top_p`, `min_p`).
    pub name: &'static str,
    /// Its value.
    pub value: f32,
    /// The range it must be in.
    pub why: &'static str,
}

impl SamplingParams {
    /// Greedy decoding (temperature 0).
    pub const fn greedy() -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 0,
        }
    }

    /// Checks the ranges.
    ///
    /// # Errors
    /// [`SamplingError`] for a temperature that is negative or not finite, a
    /// `top_p` outside `(0, 1]`, a `min_p` outside `[0, 1]`.
    pub fn validate(&self) -> Result<(), SamplingError> {
        let err = |name, value, why| Err(SamplingError { name, value, why });
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return err(
                "temperature",
                self.temperature,
                "must be a finite number >= 0",
            );
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return err("top_p", self.top_p, "must be in (0, 1]");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return err("min_p", self.min_p, "must be in [0, 1]");
        }
        Ok(())
    }
}

/// A request's sampler: its settings and seeded generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: fastrand::Rng,
}

impl Sampler {
    /// A sampler for `params`.
    ///
    /// # Errors
    /// As [`SamplingParams::validate`].
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        Ok(Sampler {
            params,
            rng: fastrand::Rng::with_seed(params.seed),
        })
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token id from `logits` (`[vocab]`, non-empty).
    ///
    /// # Panics
    /// If `logits` is empty.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        assert!(!logits.is_empty(), "sample: no logits");
        let p = &self.params;
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let max = logits
            .iter()
            .copied()
            .filter(|v| !v.is_nan())
            .fold(f32::NEG_INFINITY, f32::max);
        if max == f32::NEG_INFINITY {
            return argmax(logits);
        }
        let t = f64::from(p.temperature);
        // (id, probability) of every id with a finite weight, most probable first.
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, ((f64::from(v) - f64::from(max)) / t).exp()))
            .filter(|(_, w)| *w > 0.0)
            .collect();
        c.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            c.truncate(p.top_k);
        }
        let total: f64 = c.iter().map(|x| x.1).sum();
        if p.top_p < 1.0 {
            let mut mass = 0.0;
            let keep = c
                .iter()
                .position(|x| {
                    mass += x.1 / total;
                    mass >= f64::from(p.top_p)
                })
                .map_or(c.len(), |i| i + 1);
            c.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = c[0].1 * f64::from(p.min_p);
            c.retain(|x| x.1 >= floor);
        }
        let total: f64 = c.iter().map(|x| x.1).sum();
        let mut r = self.rng.f64() * total;
        for &(id, w) in &c {
            if r < w {
                return id;
            }
            r -= w;
        }
        c.last().expect("the most probable id always stays").0
    }
}

/// Index of the largest logit: the lowest index among equal maxima; NaN is
/// never chosen unless every value is NaN (then 0).
pub fn argmax(v: &[f32]) -> u32 {
    let mut best: Option<usize> = None;
    for (i, x) in v.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|b| *x > v[b]) {
            best = Some(i);
        }
    }
    best.unwrap_or(0) as u32
}

/// The largest logit minus the second largest (for logits, a difference of
/// log-probabilities in nats): how far from a tie a greedy choice is. NaNs
/// are ignored; fewer than two values give `f32::INFINITY`.
pub fn top2_margin(v: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in v.iter().filter(|x| !x.is_nan()) {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    if b == f32::NEG_INFINITY {
        f32::INFINITY
    } else {
        a - b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top2_margin_is_the_gap_between_the_two_largest() {
        assert_eq!(top2_margin(&[1.0, 4.0, 2.5]), 1.5);
        assert_eq!(top2_margin(&[3.0, 3.0, -1.0]), 0.0);
        assert_eq!(top2_margin(&[f32::NAN, 2.0, 0.5, f32::NAN]), 1.5);
        assert_eq!(top2_margin(&[7.0]), f32::INFINITY);
        assert_eq!(top2_margin(&[]), f32::INFINITY);
    }

    fn params(temperature: f32, top_k: usize, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            seed: 5,
        }
    }

    fn draws(p: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(p).unwrap();
        (0..n).map(|_| s.sample(logits)).collect()
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_skips_nan() {
        let mut s = Sampler::new(SamplingParams::greedy()).unwrap();
        assert_eq!(s.sample(&[1.0, 3.0, 3.0]), 1);
        assert_eq!(s.sample(&[f32::NAN, 0.5, 0.2]), 1);
        assert_eq!(s.sample(&[f32::NAN, f32::NAN]), 0);
    }

    #[test]
    fn filters_keep_what_they_promise() {
        let logits = [2.0, 1.9, 1.0, 0.0, -2.0];
        let seen = |p| {
            draws(p, &logits, 2000)
                .into_iter()
                .collect::<std::collections::BTreeSet<_>>()
        };
        assert_eq!(seen(params(1.0, 2, 1.0, 0.0)), [0, 1].into());
        // p(0) ≈ 0.43, p(1) ≈ 0.39: a 0.5 nucleus needs both.
        assert_eq!(seen(params(1.0, 0, 0.5, 0.0)), [0, 1].into());
        assert_eq!(seen(params(1.0, 0, 0.3, 0.0)), [0].into());
        // min-p 0.3 keeps ids within e^-1.2 of the best: 0, 1, 2 (e^-1 ≈ 0.37).
        assert_eq!(seen(params(1.0, 0, 1.0, 0.3)), [0, 1, 2].into());
        assert_eq!(seen(params(1.0, 0, 1.0, 0.0)).len(), 5);
    }

    #[test]
    fn the_seed_fixes_the_draws() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin()).collect();
        let a = draws(params(0.8, 20, 0.95, 0.01), &logits, 100);
        assert_eq!(a, draws(params(0.8, 20, 0.95, 0.01), &logits, 100));
        let b = draws(
            SamplingParams {
                seed: 6,
                ..params(0.8, 20, 0.95, 0.01)
            },
            &logits,
            100,
        );
        assert_ne!(a, b);
    }

    #[test]
    fn out_of_range_settings_are_refused() {
        assert_eq!(
            Sampler::new(params(-1.0, 0, 1.0, 0.0)).unwrap_err().name,
            "temperature"
        );
        assert_eq!(
            Sampler::new(params(f32::NAN, 0, 1.0, 0.0))
                .unwrap_err()
                .name,
            "temperature"
        );
        assert_eq!(
            Sampler::new(params(1.0, 0, 0.0, 0.0)).unwrap_err().name,
            "top_p"
        );
        assert_eq!(
            Sampler::new(params(1.0, 0, 1.0, 1.5)).unwrap_err().name,
            "min_p"
        );
    }
}
