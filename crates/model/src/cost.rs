//! The cost of one iteration on a device, as a linear model: what the toy
//! model ([`crate::adapters::ToyModel::with_cost`]) sleeps for, so batching
//! policies can be compared at a device's cost curve without its CPU use.
//! `xtc calibrate` fits it to a real device (`xtc_replay::calibrate`).
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

use std::time::Duration;

use crate::BatchPlan;

/// A modeled cost of one iteration (see the module doc):
/// `fixed + per_row * rows + per_position * positions_read`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IterationCost {
    /// Cost of an iteration however few rows it has.
    pub fixed: Duration,
    /// Cost of each token row (prefill or decode).
    pub per_row: Duration,
    /// Cost of each KV position attention reads ([`positions_read`]).
    pub per_position: Duration,
}

/// Longest iteration cost a model may give (an hour), to keep sleeps sane.
pub const MAX_ITERATION: Duration = Duration::from_secs(3600);

impl IterationCost {
    /// No modeled cost (the toy model's own, microseconds).
    pub const NONE: IterationCost = IterationCost {
        fixed: Duration::ZERO,
        per_row: Duration::ZERO,
        per_position: Duration::ZERO,
    };

    /// A labelled default model, not a calibration: lavapipe's curve for
    /// the tiny *synthetic* model ([`crate::Config::tiny`]) on the
    /// 2-core development machine, a two-point fit (1 and 32 decode rows,
    /// `docs/arch/decode.md`): about 1.8 ms per iteration plus 0.09 ms per
    /// token row, no position term. The GGUF model's curve is two orders of
    /// magnitude steeper: measure it with `xtc calibrate`.
    pub const LAVAPIPE_TINY: IterationCost = IterationCost {
        fixed: Duration::from_micros(1800),
        per_row: Duration::from_micros(90),
        per_position: Duration::ZERO,
    };

    /// The cost of an iteration of `rows` token rows reading `positions` KV
    /// positions, at most [`MAX_ITERATION`].
    pub fn of(&self, rows: usize, positions: u64) -> Duration {
        let n = |x: u64| u32::try_from(x).unwrap_or(u32::MAX);
        let rows = self.per_row.saturating_mul(n(rows as u64));
        // Positions can exceed u32 in a long prefill: multiply in f64.
        let pos = Duration::from_secs_f64(
            (self.per_position.as_secs_f64() * positions as f64).min(MAX_ITERATION.as_secs_f64()),
        );
        self.fixed
            .saturating_add(rows)
            .saturating_add(pos)
            .min(MAX_ITERATION)
    }

    /// The cost of `plan` ([`IterationCost::of`] of its rows and
    /// [`positions_read`]).
    pub fn of_plan(&self, plan: &BatchPlan) -> Duration {
        self.of(plan.n_tokens(), positions_read(plan))
    }

    /// The coefficients in microseconds: `(fixed, per_row, per_position)`.
    pub fn micros(&self) -> (f64, f64, f64) {
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        (us(self.fixed), us(self.per_row), us(self.per_position))
    }

    /// The throughput batching buys on this cost, KV reads aside: token
    /// rows per second of iterations of `rows` rows over those of 1-row
    /// iterations, `rows x (fixed + per_row) / (fixed + rows x per_row)`.
    ///
    /// 1 at `rows` = 1; it grows towards `1 + fixed / per_row` as rows
    /// grow, so a device whose iteration cost is mostly per row (lavapipe:
    /// 14.2 ms + 6.2 ms a row, 3.1x at 32 rows) gains little from batching,
    /// and one whose cost is mostly fixed (a GPU at these shapes) gains up
    /// to the batch size. No policy's sustained throughput can exceed one
    /// row an iteration's by more than this at its largest iteration, which
    /// bounds the throughput continuous batching can buy over one request at
    /// a time (not its capacity under a latency SLO, a queueing measure that
    /// can exceed it).
    /// `None` for `rows` = 0 or a cost with no fixed or per-row time.
    pub fn batching_gain(&self, rows: usize) -> Option<f64> {
        let (f, r, _) = self.micros();
        let n = rows as f64;
        (rows > 0 && f + r > 0.0).then(|| n * (f + r) / (f + n * r))
    }

    /// `1800 us + 90 us/row + 0.000 us/position`, for banners.
    pub fn describe(&self) -> String {
        let (f, r, p) = self.micros();
        format!("{f:.0} us + {r:.0} us per token row + {p:.3} us per KV position read")
    }
}

/// KV positions attention reads in `plan`: for every token row at position
/// `p`, `p + 1` (a prefill chunk of `n` rows from `s` reads `n*s + n(n+1)/2`).
pub fn positions_read(plan: &BatchPlan) -> u64 {
    plan.seqs
        .iter()
        .map(|s| {
            let (n, st) = (s.tokens.len() as u64, s.start_pos as u64);
            n * st + n * (n + 1) / 2
        })
        .sum()
}
