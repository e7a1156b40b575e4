//! The calibration of a device's iteration cost (`xtc calibrate`): the
//! linear model [`IterationCost`] of `xtc_model::cost` fitted to timed
//! plans.
//!
//!
//! An iteration of [`BatchPlan`] costs, to first order,
//!
//! ```text
//! cost = fixed + per_row * rows + per_position * positions_read
//! ```
//!
//! - `fixed`: the launch overhead (recording, submission, the fence, the
//!   kernels' own fixed work), paid however few rows the plan has;
//! - `per_row`: each token row's share of the matrix products (prefill and
//!   decode rows alike: both are rows of the packed `M`);
//! - `per_position`: each KV-cache position attention reads, summed over the
//!   rows ([`positions_read`]: a decode row at position `p` reads `p + 1`).
//!
//! [`calibrate`](fn@calibrate) runs a small designed set of plans ([`design`]: decode
//! iterations of 1 to 32 rows over 0 to ~1500 cached positions, and a few
//! prefill chunks) on a [`Model`], times each (launch to finish, the wall
//! time the serving loop waits), and fits the three coefficients by least
//! squares over the per-point medians, weighing each by `1 / time²` (timing
//! noise grows with the iteration: relative residuals keep the small,
//! fixed-cost-dominated points from being swamped; [`fit_weighted`]), with
//! R² and every point's residual. [`CostFile`] is the JSON a calibration writes and
//! `xtc decode --device toy --toy-cost FILE` replays: the toy model then
//! sleeps for [`IterationCost::of_plan`] per iteration, so batching
//! policies can be compared at the real model's cost curve without spending
//! the CPU.
//!
//! The design varies rows and cached positions independently, so the two
//! slopes are identifiable; every sequence of a point shares the blocks of
//! its cached prefix (their contents do not change the cost) and owns the
//! block it writes, so the KV cache stays small ([`DesignPoint::blocks`]).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use xtc_model::cost::{IterationCost, MAX_ITERATION, positions_read};
use xtc_model::{BatchPlan, DeviceError, Model, SeqWork};

/// The shape of one iteration of a calibration design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PointKind {
    /// `rows` sequences, one decode token each, every one after `cached`
    /// positions.
    Decode,
    /// One sequence's prefill chunk of `rows` tokens after `cached` positions.
    Prefill,
}

/// One iteration shape of a design.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesignPoint {
    /// Decode rows of many sequences, or one prefill chunk.
    pub kind: PointKind,
    /// Token rows (>= 1).
    pub rows: usize,
    /// Positions already in the KV cache before the iteration, per sequence.
    pub cached: usize,
}

impl DesignPoint {
    /// Sequences in the plan.
    pub fn seqs(&self) -> usize {
        match self.kind {
            PointKind::Decode => self.rows,
            PointKind::Prefill => 1,
        }
    }

    /// Positions a sequence reaches: `cached + 1` (decode) or `cached + rows`.
    pub fn context(&self) -> usize {
        self.cached + self.rows / self.seqs()
    }

    /// KV blocks of `block_size` positions the plan needs: the shared
    /// prefix's, then each sequence's own for the rows it writes.
    pub fn blocks(&self, block_size: usize) -> usize {
        let bs = block_size.max(1);
        let shared = self.cached / bs;
        let own = self.context().div_ceil(bs) - shared;
        shared + own * self.seqs()
    }

    /// The plan of this point over blocks of `block_size` positions, token
    /// ids below `vocab_size` (see the module doc for the block layout).
    pub fn plan(&self, block_size: usize, vocab_size: usize) -> BatchPlan {
        let bs = block_size.max(1);
        let shared = self.cached / bs;
        let own = self.context().div_ceil(bs) - shared;
        let per_seq = self.rows / self.seqs();
        let seqs = (0..self.seqs())
            .map(|i| {
                let mut table: Vec<u32> = (0..shared as u32).collect();
                table.extend((0..own).map(|b| (shared + i * own + b) as u32));
                SeqWork {
                    tokens: (0..per_seq)
                        .map(|t| ((i * 7919 + t * 104_729 + 1) % vocab_size.max(1)) as u32)
                        .collect(),
                    start_pos: self.cached,
                    block_table: table,
                    sample: true,
                }
            })
            .collect();
        BatchPlan { seqs }
    }
}

/// The designed set of iterations: decode points at every `rows` ×
/// `cached`, then prefill chunks of each of `prefill_rows` after the
/// smallest and the median of `cached` (none if `prefill_rows` is empty).
pub fn design(rows: &[usize], cached: &[usize], prefill_rows: &[usize]) -> Vec<DesignPoint> {
    let mut v = Vec::new();
    for &c in cached {
        for &r in rows {
            v.push(DesignPoint {
                kind: PointKind::Decode,
                rows: r,
                cached: c,
            });
        }
    }
    let mut sorted = cached.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let prefill_at: Vec<usize> = match sorted.as_slice() {
        [] => vec![],
        [c] => vec![*c],
        s => vec![s[0], s[s.len() / 2]],
    };
    for &c in &prefill_at {
        for &r in prefill_rows {
            v.push(DesignPoint {
                kind: PointKind::Prefill,
                rows: r,
                cached: c,
            });
        }
    }
    v
}

/// The default design's decode rows.
pub const DEFAULT_ROWS: [usize; 6] = [1, 2, 4, 8, 16, 32];
/// The default design's cached positions (up to a CPU device's context,
/// [`CPU_DEVICE_CONTEXT`](xtc_model::open::CPU_DEVICE_CONTEXT)).
pub const DEFAULT_CACHED: [usize; 4] = [0, 500, 1000, 1500];
/// The default design's prefill chunks.
pub const DEFAULT_PREFILL_ROWS: [usize; 2] = [8, 32];

/// One observation's regressors: `[1, rows, positions_read]`.
pub fn regressors(plan: &BatchPlan) -> [f64; 3] {
    [1.0, plan.n_tokens() as f64, positions_read(plan) as f64]
}

/// An ordinary least-squares fit of `y = b0 + b1 x1 + b2 x2`.
#[derive(Debug, Clone, PartialEq)]
pub struct LinearFit {
    /// `[b0, b1, b2]`, in `y`'s unit per regressor unit.
    pub coef: [f64; 3],
    /// Coefficient of determination (`None` when every `y` is equal).
    pub r_squared: Option<f64>,
    /// `y - fitted`, in input order.
    pub residuals: Vec<f64>,
}

/// Why [`fit`] failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    /// Fewer observations than coefficients.
    #[error("{points} observation(s): a fit of 3 coefficients needs at least 3")]
    TooFewPoints {
        /// Observations given.
        points: usize,
    },
    /// An observation or regressor is NaN or infinite.
    #[error("observation {index} is not a finite number")]
    NotFinite {
        /// Its index.
        index: usize,
    },
    /// The regressors do not vary independently (e.g. one row count only, or
    /// positions proportional to rows): the coefficients are not identifiable.
    #[error(
        "the design is degenerate: rows and positions read must vary independently \
         (use at least two row counts and two cached-position counts)"
    )]
    Degenerate,
}

/// Fits `y[i] ≈ x[i] · coef` by ordinary least squares (the normal
/// equations, columns scaled to unit norm, Gaussian elimination with partial
/// pivoting).
///
/// # Errors
/// [`FitError`]: too few points, a non-finite value, a degenerate design.
pub fn fit(x: &[[f64; 3]], y: &[f64]) -> Result<LinearFit, FitError> {
    fit_weighted(x, y, &vec![1.0; y.len()])
}

/// Fits `y[i] ≈ x[i] · coef` by weighted least squares: minimizes
/// `Σ w[i] (y[i] - x[i] · coef)²`. [`calibrate`] weighs each point by
/// `1 / y²` (relative residuals), since timing noise grows with the
/// iteration. R² and the residuals are of the unweighted `y`.
///
/// # Errors
/// [`FitError`]: too few points, a non-finite value or weight (weights
/// must be > 0), a degenerate design.
pub fn fit_weighted(x: &[[f64; 3]], y: &[f64], w: &[f64]) -> Result<LinearFit, FitError> {
    let n = x.len().min(y.len()).min(w.len());
    if n < 3 {
        return Err(FitError::TooFewPoints { points: n });
    }
    let bad = |i: usize| {
        let weight_ok = w[i].is_finite() && w[i] > 0.0;
        !y[i].is_finite() || !weight_ok || x[i].iter().any(|v| !v.is_finite())
    };
    if let Some(index) = (0..n).find(|&i| bad(i)) {
        return Err(FitError::NotFinite { index });
    }
    let sw: Vec<f64> = w[..n].iter().map(|v| v.sqrt()).collect();
    let (x0, y0) = (x, y);
    let x: Vec<[f64; 3]> = (0..n).map(|i| x0[i].map(|v| v * sw[i])).collect();
    let y: Vec<f64> = (0..n).map(|i| y0[i] * sw[i]).collect();
    let norm: Vec<f64> = (0..3)
        .map(|j| (0..n).map(|i| x[i][j] * x[i][j]).sum::<f64>().sqrt())
        .collect();
    if norm.contains(&0.0) {
        return Err(FitError::Degenerate);
    }
    // Normal equations of the scaled columns: A c = b.
    let mut a = [[0.0f64; 4]; 3];
    for (j, row) in a.iter_mut().enumerate() {
        for (k, cell) in row.iter_mut().take(3).enumerate() {
            *cell = (0..n).map(|i| x[i][j] * x[i][k]).sum::<f64>() / (norm[j] * norm[k]);
        }
        row[3] = (0..n).map(|i| x[i][j] * y[i]).sum::<f64>() / norm[j];
    }
    for col in 0..3 {
        let piv = (col..3)
            .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
            .unwrap_or(col);
        // Unit-norm columns: a pivot this small means collinear columns.
        if a[piv][col].abs() < 1e-10 {
            return Err(FitError::Degenerate);
        }
        a.swap(col, piv);
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (v, p) in row.iter_mut().zip(pivot_row).skip(col) {
                    *v -= f * p;
                }
            }
        }
    }
    let coef = [0, 1, 2].map(|j| a[j][3] / a[j][j] / norm[j]);
    let fitted = |i: usize| (0..3).map(|j| x0[i][j] * coef[j]).sum::<f64>();
    let residuals: Vec<f64> = (0..n).map(|i| y0[i] - fitted(i)).collect();
    let mean = y0[..n].iter().sum::<f64>() / n as f64;
    let ss_tot: f64 = y0[..n].iter().map(|v| (v - mean).powi(2)).sum();
    let ss_res: f64 = residuals.iter().map(|r| r * r).sum();
    let r_squared = (ss_tot > 0.0).then(|| 1.0 - ss_res / ss_tot);
    Ok(LinearFit {
        coef,
        r_squared,
        residuals,
    })
}

/// One design point as measured and fitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MeasuredPoint {
    /// The iteration's shape.
    #[serde(flatten)]
    pub point: DesignPoint,
    /// KV positions attention read ([`positions_read`]).
    pub positions_read: u64,
    /// Median wall time of its repetitions, launch to finish, µs.
    pub measured_us: f64,
    /// Every repetition's wall time, µs, in the order run.
    pub samples_us: Vec<f64>,
    /// What the fit predicts, µs.
    pub fitted_us: f64,
    /// `measured - fitted`, µs.
    pub residual_us: f64,
}

/// What [`calibrate`] measured and fitted.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// The fit, µs: `[fixed, per row, per position read]` (a coefficient
    /// may come out negative when its term is below the noise).
    pub coef_us: [f64; 3],
    /// R² of the fit over the points' medians.
    pub r_squared: Option<f64>,
    /// Root mean square of the residuals, µs.
    pub rms_residual_us: f64,
    /// Every point, in design order.
    pub points: Vec<MeasuredPoint>,
}

/// Why [`calibrate`] failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrateError {
    /// The model refused or failed a plan of the design.
    #[error("iteration of {rows} row(s) after {cached} cached positions: {source}")]
    Device {
        /// The point's rows.
        rows: usize,
        /// The point's cached positions.
        cached: usize,
        /// The model's error.
        #[source]
        source: DeviceError,
    },
    /// The measurements could not be fitted.
    #[error(transparent)]
    Fit(#[from] FitError),
    /// `repeats` was 0 or the design empty.
    #[error("nothing to measure: {0}")]
    Empty(&'static str),
}

/// Runs `points` on `model` `repeats` times each (round robin, so a change
/// of machine load spreads over every point; after one warm-up iteration of
/// the first and the largest point), times each launch-to-finish, and fits
/// the medians ([`fit_weighted`], by relative residuals). `progress(done, total)` is called after every iteration.
/// The model's KV cache must hold [`DesignPoint::blocks`] blocks of
/// `block_size` for every point, its limits the points' rows and contexts.
///
/// # Errors
/// [`CalibrateError`]: a plan the model fails, a degenerate design.
pub fn calibrate(
    model: &mut dyn Model,
    points: &[DesignPoint],
    block_size: usize,
    repeats: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Calibration, CalibrateError> {
    if repeats == 0 {
        return Err(CalibrateError::Empty("0 repeats"));
    }
    let Some(largest) = points.iter().max_by_key(|p| p.rows * (p.cached + 1)) else {
        return Err(CalibrateError::Empty("an empty design"));
    };
    let vocab = model.config().vocab_size;
    let plans: Vec<BatchPlan> = points.iter().map(|p| p.plan(block_size, vocab)).collect();
    let run = |model: &mut dyn Model, p: &DesignPoint, plan: &BatchPlan| {
        let err = |source| CalibrateError::Device {
            rows: p.rows,
            cached: p.cached,
            source,
        };
        let t0 = Instant::now();
        model.launch(plan).map_err(err)?.wait_here();
        model.finish().map_err(err)?;
        Ok::<f64, CalibrateError>(t0.elapsed().as_secs_f64() * 1e6)
    };
    for p in [&points[0], largest] {
        run(model, p, &p.plan(block_size, vocab))?;
    }
    let mut samples = vec![Vec::with_capacity(repeats); points.len()];
    let total = repeats * points.len();
    for rep in 0..repeats {
        for (i, (p, plan)) in points.iter().zip(&plans).enumerate() {
            samples[i].push(run(model, p, plan)?);
            progress(rep * points.len() + i + 1, total);
        }
    }
    let medians: Vec<f64> = samples.iter().map(|s| median(s)).collect();
    let x: Vec<[f64; 3]> = plans.iter().map(regressors).collect();
    let weights: Vec<f64> = medians.iter().map(|m| 1.0 / m.max(1e-3).powi(2)).collect();
    let f = fit_weighted(&x, &medians, &weights)?;
    let rms = (f.residuals.iter().map(|r| r * r).sum::<f64>() / f.residuals.len() as f64).sqrt();
    let points = points
        .iter()
        .zip(&plans)
        .zip(samples)
        .enumerate()
        .map(|(i, ((p, plan), s))| MeasuredPoint {
            point: *p,
            positions_read: positions_read(plan),
            measured_us: medians[i],
            samples_us: s,
            fitted_us: medians[i] - f.residuals[i],
            residual_us: f.residuals[i],
        })
        .collect();
    Ok(Calibration {
        coef_us: f.coef,
        r_squared: f.r_squared,
        rms_residual_us: rms,
        points,
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// The `format` field of a [`CostFile`].
pub const COST_FORMAT: &str = "xtc-iteration-cost";
/// The `version` of the [`CostFile`] layout this build writes and reads.
pub const COST_VERSION: u32 = 1;

/// The fitted coefficients of a [`CostFile`], µs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CostCoefficients {
    /// Fixed cost per iteration, µs.
    pub fixed_us: f64,
    /// Cost per token row, µs.
    pub per_row_us: f64,
    /// Cost per KV position read, µs.
    pub per_position_us: f64,
}

/// A calibration as `xtc calibrate --output` writes it (JSON; documented
/// field by field in `docs/decode-report.md`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CostFile {
    /// [`COST_FORMAT`].
    pub format: String,
    /// [`COST_VERSION`].
    pub version: u32,
    /// The model measured (its file name and description).
    pub model: String,
    /// The device it ran on.
    pub device: String,
    /// The CPU of the machine (`/proc/cpuinfo`'s model name), if known.
    pub cpu: Option<String>,
    /// The 1-minute load average when the calibration ended, if known.
    pub load_average_1m: Option<f64>,
    /// When the calibration ended, seconds since the Unix epoch.
    pub measured_at_unix_s: u64,
    /// KV positions per block of the plans.
    pub block_size: usize,
    /// Repetitions per point (the point's figure is their median).
    pub repeats: usize,
    /// The fit.
    pub cost: CostCoefficients,
    /// R² of the fit (`null` when every point took the same time).
    pub r_squared: Option<f64>,
    /// Root mean square of the residuals, µs.
    pub rms_residual_us: f64,
    /// Every design point.
    pub points: Vec<MeasuredPoint>,
}

/// Why a [`CostFile`] could not be read.
#[derive(Debug, thiserror::Error)]
pub enum CostFileError {
    /// The file could not be read.
    #[error("cannot read the cost file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Not JSON, or a field missing or of the wrong type.
    #[error(
        "{path}: not an iteration-cost file (write one with `xtc calibrate --output FILE`): {source}"
    )]
    Json {
        /// The file.
        path: PathBuf,
        /// serde_json's message (line and column).
        #[source]
        source: serde_json::Error,
    },
    /// JSON of another format or version.
    #[error(
        "{path}: format {format:?} version {version}, expected {COST_FORMAT:?} version {COST_VERSION}"
    )]
    Format {
        /// The file.
        path: PathBuf,
        /// Its `format`.
        format: String,
        /// Its `version`.
        version: u32,
    },
    /// A coefficient that is not a finite number of at most an hour.
    #[error(
        "{path}: cost.{field} = {value:e} is not a finite number of microseconds up to an hour"
    )]
    Coefficient {
        /// The file.
        path: PathBuf,
        /// The field.
        field: &'static str,
        /// Its value.
        value: f64,
    },
}

impl CostFile {
    /// Reads and checks a cost file (format, version, finite coefficients).
    ///
    /// # Errors
    /// [`CostFileError`], naming the file and what is wrong.
    pub fn load(path: &Path) -> Result<CostFile, CostFileError> {
        let text = std::fs::read_to_string(path).map_err(|source| CostFileError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let f: CostFile = serde_json::from_str(&text).map_err(|source| CostFileError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        if f.format != COST_FORMAT || f.version != COST_VERSION {
            return Err(CostFileError::Format {
                path: path.to_path_buf(),
                format: f.format,
                version: f.version,
            });
        }
        let c = f.cost;
        for (field, value) in [
            ("fixed_us", c.fixed_us),
            ("per_row_us", c.per_row_us),
            ("per_position_us", c.per_position_us),
        ] {
            if !value.is_finite() || value.abs() > MAX_ITERATION.as_secs_f64() * 1e6 {
                return Err(CostFileError::Coefficient {
                    path: path.to_path_buf(),
                    field,
                    value,
                });
            }
        }
        Ok(f)
    }

    /// The cost the toy model replays: the fit's coefficients, a negative
    /// one (a term below the measurement noise) taken as 0.
    pub fn iteration_cost(&self) -> IterationCost {
        let d = |us: f64| Duration::from_secs_f64(us.max(0.0) / 1e6);
        IterationCost {
            fixed: d(self.cost.fixed_us),
            per_row: d(self.cost.per_row_us),
            per_position: d(self.cost.per_position_us),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batching_gain_is_rows_per_second_against_one_row_iterations() {
        let c = |f: u64, r: u64| IterationCost {
            fixed: Duration::from_micros(f),
            per_row: Duration::from_micros(r),
            per_position: Duration::from_micros(7),
        };
        // 14 ms + 6 ms a row: 1 row 20 ms, 32 rows 206 ms (32 rows in
        // 206 ms against 1 in 20: 3.11x); the limit is 1 + 14/6.
        let lavapipe = c(14_000, 6_000);
        assert_eq!(lavapipe.batching_gain(1), Some(1.0));
        let g = lavapipe.batching_gain(32).unwrap();
        assert!((g - 32.0 * 20.0 / 206.0).abs() < 1e-9, "{g}");
        assert!(lavapipe.batching_gain(1 << 20).unwrap() < 1.0 + 14.0 / 6.0);
        // All fixed: rows come free, the gain is the batch size.
        assert_eq!(c(3_500, 0).batching_gain(32), Some(32.0));
        // All per row: nothing to gain.
        assert_eq!(c(0, 6_000).batching_gain(32), Some(1.0));
        assert_eq!(lavapipe.batching_gain(0), None);
        assert_eq!(c(0, 0).batching_gain(8), None);
    }

    #[test]
    fn positions_read_counts_every_row_s_attention() {
        let p = DesignPoint {
            kind: PointKind::Prefill,
            rows: 4,
            cached: 10,
        };
        // Rows at 10..14 read 11 + 12 + 13 + 14.
        assert_eq!(positions_read(&p.plan(16, 100)), 50);
        let d = DesignPoint {
            kind: PointKind::Decode,
            rows: 3,
            cached: 7,
        };
        assert_eq!(positions_read(&d.plan(16, 100)), 24);
    }

    #[test]
    fn design_plans_share_the_prefix_and_own_the_written_block() {
        let p = DesignPoint {
            kind: PointKind::Decode,
            rows: 3,
            cached: 40,
        };
        let plan = p.plan(16, 100);
        assert_eq!(p.blocks(16), 2 + 3);
        assert_eq!(plan.seqs[0].block_table, [0, 1, 2]);
        assert_eq!(plan.seqs[2].block_table, [0, 1, 4]);
        let q = DesignPoint {
            kind: PointKind::Prefill,
            rows: 32,
            cached: 0,
        };
        assert_eq!(q.blocks(16), 2);
        assert_eq!(q.plan(16, 100).seqs[0].block_table, [0, 1]);
        assert_eq!(q.plan(16, 100).n_tokens(), 32);
        let used = |pl: &BatchPlan| pl.seqs.iter().flat_map(|s| s.block_table.clone()).max();
        assert_eq!(used(&plan), Some(p.blocks(16) as u32 - 1));
    }

    /// A synthetic cost with known coefficients and a small deterministic
    /// disturbance: the fit recovers them, R² near 1, residuals small.
    #[test]
    fn fit_recovers_known_coefficients() {
        let (b0, b1, b2) = (3000.0, 23_000.0, 0.35);
        let pts = design(&DEFAULT_ROWS, &DEFAULT_CACHED, &DEFAULT_PREFILL_ROWS);
        let x: Vec<[f64; 3]> = pts.iter().map(|p| regressors(&p.plan(16, 49152))).collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, r)| b0 + b1 * r[1] + b2 * r[2] + if i % 2 == 0 { 50.0 } else { -50.0 })
            .collect();
        let f = fit(&x, &y).unwrap();
        assert!((f.coef[0] - b0).abs() < 60.0, "{:?}", f.coef);
        assert!((f.coef[1] - b1).abs() / b1 < 1e-3, "{:?}", f.coef);
        assert!((f.coef[2] - b2).abs() / b2 < 1e-2, "{:?}", f.coef);
        assert!(f.r_squared.unwrap() > 0.9999, "{:?}", f.r_squared);
        assert!(
            f.residuals.iter().all(|r| r.abs() < 110.0),
            "{:?}",
            f.residuals
        );
        // Exact data: exact coefficients.
        let exact: Vec<f64> = x.iter().map(|r| b0 + b1 * r[1] + b2 * r[2]).collect();
        let e = fit(&x, &exact).unwrap();
        for (got, want) in e.coef.iter().zip([b0, b1, b2]) {
            assert!((got - want).abs() <= want * 1e-9, "{:?}", e.coef);
        }
        assert_eq!(e.r_squared.map(|r| (r * 1e9).round()), Some(1e9));
    }

    /// Proportional noise (±5% of each point): the relative-residual fit
    /// still finds the small fixed cost the large points would swamp.
    #[test]
    fn weighted_fit_keeps_the_fixed_cost_under_proportional_noise() {
        let (b0, b1, b2) = (40_000.0, 21_000.0, 20.0);
        let pts = design(&DEFAULT_ROWS, &DEFAULT_CACHED, &DEFAULT_PREFILL_ROWS);
        let x: Vec<[f64; 3]> = pts.iter().map(|p| regressors(&p.plan(16, 49152))).collect();
        let y: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, r)| (b0 + b1 * r[1] + b2 * r[2]) * if i % 2 == 0 { 1.05 } else { 0.95 })
            .collect();
        let w: Vec<f64> = y.iter().map(|v| 1.0 / (v * v)).collect();
        let f = fit_weighted(&x, &y, &w).unwrap();
        assert!((f.coef[0] - b0).abs() / b0 < 0.15, "{:?}", f.coef);
        assert!((f.coef[1] - b1).abs() / b1 < 0.1, "{:?}", f.coef);
        assert!((f.coef[2] - b2).abs() / b2 < 0.15, "{:?}", f.coef);
        assert_eq!(
            fit_weighted(&x, &y, &vec![0.0; y.len()]),
            Err(FitError::NotFinite { index: 0 })
        );
    }

    #[test]
    fn degenerate_designs_are_refused() {
        // One cached count: positions = rows * (c + 1), collinear with rows.
        let pts = design(&DEFAULT_ROWS, &[100], &[]);
        let x: Vec<[f64; 3]> = pts.iter().map(|p| regressors(&p.plan(16, 100))).collect();
        let y: Vec<f64> = (0..x.len()).map(|i| i as f64).collect();
        assert_eq!(fit(&x, &y), Err(FitError::Degenerate));
        assert_eq!(
            fit(&x[..2], &y[..2]),
            Err(FitError::TooFewPoints { points: 2 })
        );
        let mut bad = y.clone();
        bad[1] = f64::NAN;
        assert_eq!(fit(&x, &bad), Err(FitError::NotFinite { index: 1 }));
    }

    #[test]
    fn the_cost_of_a_plan_is_the_model_s() {
        let c = IterationCost {
            fixed: Duration::from_micros(1000),
            per_row: Duration::from_micros(20),
            per_position: Duration::from_nanos(500),
        };
        let p = DesignPoint {
            kind: PointKind::Decode,
            rows: 2,
            cached: 99,
        };
        // 1000 + 2 x 20 + 200 x 0.5 us.
        assert_eq!(
            c.of_plan(&p.plan(16, 100)),
            Duration::from_micros(1000 + 40 + 100)
        );
        assert_eq!(c.of(usize::MAX, u64::MAX), MAX_ITERATION);
    }
}
