//! Capacity under an SLO (`xtc decode --sweep`): how the serving literature
//! compares batching policies (vLLM's paper, Orca, DistServe), instead of
//! throughput at one arrival rate, where every policy that keeps up is bound
//! by the arrivals.
//!
//! Each policy runs the same workload at each request rate (a `--time-scale`
//! of the trace's arrival clock). A [`SweepPoint`] keeps what that run
//! reports: throughput, normalized latency (mean end-to-end / output
//! tokens), TTFT and TPOT p99, SLO attainment and goodput. A policy's
//! **capacity** ([`capacity`]) is the highest rate up to which its SLO
//! attainment stays at or above the target (90%, DistServe's): going up the
//! rates, the last one before the first miss. On a grid of rates that is
//! only as fine as the grid (a ratio of two capacities on a grid of
//! doublings is a power of two), so a sweep can **refine** each knee
//! ([`knee_bracket`], [`refine_rate`]): bisect, geometrically, between the
//! last rate a policy sustains and the first it does not, running only that
//! policy at the midpoint, a chosen number of times (`xtc decode --refine`;
//! vLLM's and DistServe's capacity searches do the same). Every refinement
//! point lies inside its policy's bracket, so [`capacity`] over all points
//! is the refined capacity. [`Sweep`] puts the points, the
//! capacities and the capacity ratios (continuous / static, continuous /
//! one-at-a-time) together, renders them as a table or CSV, and
//! [`Sweep::plot_svg`] draws normalized latency and attainment against the
//! request rate, one line per policy (`plotters`, SVG backend).

use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{Report, SCHEMA_VERSION, XTC_VERSION, slo_bounds};
use crate::run_config::RunConfig;
use xtc_kvbatch::latency::Slo;

/// The share of requests that must meet the SLO at a rate the policy
/// sustains (DistServe's 90%).
pub const ATTAINMENT_TARGET: f64 = 0.9;

/// One policy at one rate.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SweepPoint {
    /// `continuous`, `static` or `one-at-a-time`.
    pub mode: &'static str,
    /// Speed-up of the trace's arrival clock.
    pub time_scale: f64,
    /// Offered load: requests / their arrival span, per second.
    pub request_rate_per_s: f64,
    /// Wall time of the run, s.
    pub duration_s: f64,
    /// Requests completed.
    pub completed: usize,
    /// Completed requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
    /// Mean end-to-end latency / output tokens over completed requests, ms.
    pub normalized_latency_ms_per_token: f64,
    /// 99th percentile of the time to first token, ms.
    pub ttft_p99_ms: f64,
    /// 99th percentile of the time per output token, ms.
    pub tpot_p99_ms: f64,
    /// Mean ready-vector members per iteration.
    pub mean_ready_members: f64,
    /// Share of the requests that met the SLO (0 to 1).
    pub attainment: f64,
    /// Requests that met the SLO, per second.
    pub goodput_requests_per_s: f64,
    /// A knee refinement's run ([`refine_rate`]): only this policy ran at
    /// this rate.
    pub refined: bool,
}

impl SweepPoint {
    /// The point of `report`, a run at `time_scale` offering
    /// `request_rate_per_s`. A report without an SLO counts as attainment 0.
    pub fn of(report: &Report, time_scale: f64, request_rate_per_s: f64) -> Self {
        let slo = report.slo.as_ref();
        SweepPoint {
            mode: report.mode,
            time_scale,
            request_rate_per_s,
            duration_s: report.duration_s,
            completed: report.requests.completed,
            requests_per_s: report.throughput.requests_per_s,
            output_tokens_per_s: report.throughput.output_tokens_per_s,
            normalized_latency_ms_per_token: report.normalized_latency_ms_per_token,
            ttft_p99_ms: report.latency.ttft.p99_ms,
            tpot_p99_ms: report.latency.tpot.p99_ms,
            mean_ready_members: report.iterations.mean_ready_members,
            attainment: slo.map_or(0.0, |s| s.attainment),
            goodput_requests_per_s: slo.map_or(0.0, |s| s.goodput_requests_per_s),
            refined: false,
        }
    }
}

/// `(rate, attainment)` pairs of one policy → its capacity: going up the
/// rates, the last rate whose attainment is at least `target` before the
/// first that is not (`None`: missed already at the lowest rate).
pub fn capacity(points: &[(f64, f64)], target: f64) -> Option<f64> {
    let mut sorted = points.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    sorted
        .iter()
        .take_while(|(_, att)| *att >= target)
        .last()
        .map(|(rate, _)| *rate)
}

/// `(rate, attainment)` pairs of one policy → the bracket of its knee:
/// `(capacity, the first rate above it)`, the last sustained rate and the
/// first missed one after it. `None` when there is no such pair: the policy
/// met every rate (its capacity is open above) or missed the lowest (open
/// below).
pub fn knee_bracket(points: &[(f64, f64)], target: f64) -> Option<(f64, f64)> {
    let cap = capacity(points, target)?;
    let above = points
        .iter()
        .map(|(rate, _)| *rate)
        .filter(|rate| *rate > cap)
        .min_by(f64::total_cmp)?;
    Some((cap, above))
}

/// The rate a knee refinement runs next inside the bracket `(met, missed)`:
/// their geometric mean (rates are swept on a log scale), rounded to 3
/// significant digits so tables stay readable. `None` when the bracket is
/// already that narrow (rounding lands on an end) or not a bracket
/// (`met >= missed`, or a rate not positive and finite).
///
/// # Example
/// ```
/// use xtc_replay::sweep::refine_rate;
/// assert_eq!(refine_rate(2.0, 4.0), Some(2.83));
/// assert_eq!(refine_rate(2.83, 4.0), Some(3.36));
/// assert_eq!(refine_rate(1.0, 1.001), None);
/// ```
pub fn refine_rate(met: f64, missed: f64) -> Option<f64> {
    if !(met.is_finite() && missed.is_finite() && met > 0.0 && met < missed) {
        return None;
    }
    let mid = (met * missed).sqrt();
    let scale = 10f64.powi(2 - mid.log10().floor() as i32);
    let mid = (mid * scale).round() / scale;
    (mid > met && mid < missed).then_some(mid)
}

/// A capacity ratio as the tables print it: 3 significant digits (2
/// decimals from 1 up), so a small ratio does not round to `0.00x`.
fn ratio_number(r: f64) -> String {
    if !r.is_finite() || r <= 0.0 {
        return format!("{r}x");
    }
    let decimals = (2 - r.log10().floor() as i32).clamp(2, 12) as usize;
    format!("{r:.decimals$}x")
}

/// One policy's capacity.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModeCapacity {
    /// `continuous`, `static` or `one-at-a-time`.
    pub mode: &'static str,
    /// The highest time scale it sustains (`null`: not even the lowest).
    pub capacity_time_scale: Option<f64>,
    /// The request rate at that time scale, per second (`null` as above).
    pub capacity_request_rate_per_s: Option<f64>,
    /// It met the target at every rate swept: the capacity is at least this.
    pub met_at_every_rate: bool,
    /// The first rate above the capacity, which it missed: the capacity
    /// lies in `[capacity_time_scale, first_missed_time_scale)` (`null`
    /// when it met every rate, or missed the lowest: the lowest is then the
    /// bound above).
    pub first_missed_time_scale: Option<f64>,
}

/// A whole sweep (see the module doc; `docs/decode-report.md` documents the
/// JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Sweep {
    /// [`SCHEMA_VERSION`].
    pub schema_version: u32,
    /// [`XTC_VERSION`].
    pub xtc_version: &'static str,
    /// The configuration (its `time_scale` is the lowest rate swept).
    pub config: RunConfig,
    /// The SLO attainment is measured against.
    pub slo: Slo,
    /// Attainment a sustained rate needs (0 to 1).
    pub attainment_target: f64,
    /// The time scales run, ascending (the grid's and the refinements').
    pub time_scales: Vec<f64>,
    /// Every policy at every rate of the grid, and the knee refinements'
    /// runs (one policy each, `refined`), by rate then policy.
    pub points: Vec<SweepPoint>,
    /// Each policy's capacity.
    pub capacity: Vec<ModeCapacity>,
    /// Capacity of continuous / static batching (`null` when either
    /// sustains no rate swept; a lower bound when continuous met every rate,
    /// an upper bound when static did, bounded neither way when both did).
    pub capacity_ratio_continuous_vs_static: Option<f64>,
    /// Capacity of continuous batching / one request at a time (as above).
    pub capacity_ratio_continuous_vs_one_at_a_time: Option<f64>,
    /// Wall time of the whole sweep, s.
    pub sweep_duration_s: f64,
}

/// The policies in the order a sweep runs and shows them.
pub const MODES: [&str; 3] = ["continuous", "static", "one-at-a-time"];

impl Sweep {
    /// The sweep of `points` measured under `config` (its SLO).
    pub fn new(config: RunConfig, mut points: Vec<SweepPoint>, sweep_duration_s: f64) -> Self {
        let order = |m: &str| MODES.iter().position(|x| *x == m).unwrap_or(MODES.len());
        points.sort_by(|a, b| {
            a.time_scale
                .total_cmp(&b.time_scale)
                .then(order(a.mode).cmp(&order(b.mode)))
        });
        let mut time_scales: Vec<f64> = points.iter().map(|p| p.time_scale).collect();
        time_scales.sort_by(f64::total_cmp);
        time_scales.dedup();
        let capacity: Vec<ModeCapacity> = MODES
            .iter()
            .map(|&mode| {
                let mine: Vec<&SweepPoint> = points.iter().filter(|p| p.mode == mode).collect();
                let pairs: Vec<(f64, f64)> =
                    mine.iter().map(|p| (p.time_scale, p.attainment)).collect();
                let cap = capacity(&pairs, ATTAINMENT_TARGET);
                let bracket = knee_bracket(&pairs, ATTAINMENT_TARGET);
                let rate = cap.and_then(|c| {
                    mine.iter()
                        .find(|p| p.time_scale == c)
                        .map(|p| p.request_rate_per_s)
                });
                ModeCapacity {
                    mode,
                    capacity_time_scale: cap,
                    capacity_request_rate_per_s: rate,
                    met_at_every_rate: !mine.is_empty()
                        && mine.iter().all(|p| p.attainment >= ATTAINMENT_TARGET),
                    first_missed_time_scale: bracket.map(|(_, missed)| missed),
                }
            })
            .collect();
        let ratio = |a: usize, b: usize| -> Option<f64> {
            Some(capacity[a].capacity_time_scale? / capacity[b].capacity_time_scale?)
        };
        Sweep {
            schema_version: SCHEMA_VERSION,
            xtc_version: XTC_VERSION,
            slo: config.slo,
            config,
            attainment_target: ATTAINMENT_TARGET,
            time_scales,
            capacity_ratio_continuous_vs_static: ratio(0, 1),
            capacity_ratio_continuous_vs_one_at_a_time: ratio(0, 2),
            capacity,
            points,
            sweep_duration_s,
        }
    }

    /// The range the capacity ratio of policy `a` over policy `b` (indices
    /// into [`MODES`]) lies in, given both knees' brackets: `(a's capacity
    /// / b's first missed rate, a's first missed rate / b's capacity)`.
    /// `None` unless both knees lie inside the rates run.
    pub fn ratio_bracket(&self, a: usize, b: usize) -> Option<(f64, f64)> {
        let (ca, cb) = (self.capacity.get(a)?, self.capacity.get(b)?);
        Some((
            ca.capacity_time_scale? / cb.first_missed_time_scale?,
            ca.first_missed_time_scale? / cb.capacity_time_scale?,
        ))
    }

    /// How the capacity ratio of continuous batching over policy `b` (an
    /// index into [`MODES`]) reads in the tables: the value with what bounds
    /// it (a lower bound when continuous batching met every rate, an upper
    /// one when `b` did, unknown when both did, n/a naming the policy that
    /// sustains no rate), and, when both knees lie inside the rates run, the
    /// range the knees' brackets allow. Bold in markdown (`md`).
    fn ratio_words(&self, b: usize, md: bool) -> String {
        let (Some(c), Some(o)) = (self.capacity.first(), self.capacity.get(b)) else {
            return "n/a".to_string();
        };
        let bold = |t: String| if md { format!("**{t}**") } else { t };
        match (c.capacity_time_scale, o.capacity_time_scale) {
            (None, _) => format!("n/a ({} sustains no rate swept)", c.mode),
            (_, None) => format!("n/a ({} sustains no rate swept)", o.mode),
            (Some(_), Some(_)) if c.met_at_every_rate && o.met_at_every_rate => {
                "unknown (both met every rate swept: sweep higher rates)".to_string()
            }
            (Some(x), Some(y)) if c.met_at_every_rate => format!(
                "{} (a lower bound: {} met every rate)",
                bold(format!(">= {}", ratio_number(x / y))),
                c.mode
            ),
            (Some(x), Some(y)) if o.met_at_every_rate => format!(
                "{} (an upper bound: {} met every rate)",
                bold(format!("<= {}", ratio_number(x / y))),
                o.mode
            ),
            (Some(x), Some(y)) => {
                let range = self.ratio_bracket(0, b).map_or(String::new(), |(lo, hi)| {
                    format!(
                        " (from the knees' brackets: {} to {})",
                        ratio_number(lo),
                        ratio_number(hi)
                    )
                });
                format!("{}{range}", bold(ratio_number(x / y)))
            }
        }
    }

    /// The per-rate table, the capacities and the ratios.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "SLO {}; a rate is sustained when at least {:.0}% of requests meet it",
            slo_bounds(self.slo.ttft_ms, self.slo.tpot_ms),
            self.attainment_target * 100.0
        );
        let _ = writeln!(
            s,
            "{:>6} {:>9}  {:<14} {:>9} {:>11} {:>11} {:>11} {:>8} {:>8}",
            "rate",
            "req/s",
            "mode",
            "tokens/s",
            "norm ms/tok",
            "TTFT p99 ms",
            "TPOT p99 ms",
            "ready",
            "SLO met"
        );
        for p in &self.points {
            let _ = writeln!(
                s,
                "{:>5}x {:>9.2}  {:<14} {:>9.1} {:>11.2} {:>11.1} {:>11.1} {:>8.1} {:>7.1}%{}",
                p.time_scale,
                p.request_rate_per_s,
                p.mode,
                p.output_tokens_per_s,
                p.normalized_latency_ms_per_token,
                p.ttft_p99_ms,
                p.tpot_p99_ms,
                p.mean_ready_members,
                p.attainment * 100.0,
                if p.refined { " *" } else { "" }
            );
        }
        if self.points.iter().any(|p| p.refined) {
            let _ = writeln!(
                s,
                "* a knee refinement's run (--refine): only that policy ran at that rate"
            );
        }
        let _ = writeln!(
            s,
            "\n{:<14} {:>20} {:>18}",
            "mode", "capacity (rate)", "capacity (req/s)"
        );
        let lowest = self.time_scales.first().copied().unwrap_or(0.0);
        for c in &self.capacity {
            let (rate, rps) = match (c.capacity_time_scale, c.capacity_request_rate_per_s) {
                (Some(t), Some(r)) if c.met_at_every_rate => {
                    (format!(">= {t}x"), format!(">= {r:.2}"))
                }
                (Some(t), Some(r)) => match c.first_missed_time_scale {
                    Some(m) => (format!("{t}x (missed {m}x)"), format!("{r:.2}")),
                    None => (format!("{t}x"), format!("{r:.2}")),
                },
                _ => (format!("< {lowest}x"), "-".to_string()),
            };
            let _ = writeln!(s, "{:<14} {rate:>20} {rps:>18}", c.mode);
        }
        let _ = writeln!(
            s,
            "capacity ratio: continuous / static {}, continuous / one-at-a-time {}",
            self.ratio_words(1, false),
            self.ratio_words(2, false)
        );
        let _ = writeln!(
            s,
            "(sweep of {} runs in {:.1} s)",
            self.points.len(),
            self.sweep_duration_s
        );
        s
    }

    /// The sweep as markdown, ready to paste into a README: the SLO, each
    /// policy's capacity with its figures at that rate (generated tokens/s,
    /// TTFT and TPOT p99, mean ready members), the SLO attainment of every
    /// policy at every rate, and the capacity ratios. A capacity met at
    /// every rate reads `>= R`; one missed at the lowest rate `< R`.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let lowest = self.time_scales.first().copied().unwrap_or(0.0);
        let _ = writeln!(
            s,
            "SLO {}; a rate is sustained when at least {:.0}% of requests meet it.\n",
            slo_bounds(self.slo.ttft_ms, self.slo.tpot_ms),
            self.attainment_target * 100.0
        );
        let _ = writeln!(
            s,
            "| policy | capacity (time scale) | capacity (requests/s) | generated tokens/s there | \
             TTFT p99 there | TPOT p99 there | mean ready members there |"
        );
        let _ = writeln!(s, "| --- | ---: | ---: | ---: | ---: | ---: | ---: |");
        for c in &self.capacity {
            let at = c.capacity_time_scale.and_then(|t| {
                self.points
                    .iter()
                    .find(|p| p.mode == c.mode && p.time_scale == t)
            });
            let (scale, rps) = match (c.capacity_time_scale, c.capacity_request_rate_per_s) {
                (Some(t), Some(r)) if c.met_at_every_rate => {
                    (format!(">= {t}x (met at every rate)"), format!(">= {r:.2}"))
                }
                (Some(t), Some(r)) => match c.first_missed_time_scale {
                    Some(m) => (format!("{t}x (missed {m}x)"), format!("{r:.2}")),
                    None => (format!("{t}x"), format!("{r:.2}")),
                },
                _ => (format!("< {lowest}x"), "-".to_string()),
            };
            let fig = |f: &dyn Fn(&SweepPoint) -> String| at.map_or("-".to_string(), f);
            let _ = writeln!(
                s,
                "| {} | {scale} | {rps} | {} | {} | {} | {} |",
                c.mode,
                fig(&|p| format!("{:.1}", p.output_tokens_per_s)),
                fig(&|p| format!("{:.0} ms", p.ttft_p99_ms)),
                fig(&|p| format!("{:.0} ms", p.tpot_p99_ms)),
                fig(&|p| format!("{:.1}", p.mean_ready_members)),
            );
        }
        let _ = writeln!(
            s,
            "\n| time scale | requests/s | {} |",
            MODES
                .iter()
                .map(|m| format!("{m}: SLO met, tokens/s"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(s, "| ---: | ---: |{}", " ---: |".repeat(MODES.len()));
        for &t in &self.time_scales {
            let at: Vec<&SweepPoint> = self.points.iter().filter(|p| p.time_scale == t).collect();
            let rps = at.first().map_or(0.0, |p| p.request_rate_per_s);
            let cells: Vec<String> = MODES
                .iter()
                .map(|m| {
                    at.iter().find(|p| p.mode == *m).map_or("-".into(), |p| {
                        // Floored, so a miss (89.6%) never reads as 90%.
                        let pct = (p.attainment * 100.0 + 1e-9).floor();
                        format!("{pct:.0}%, {:.1}", p.output_tokens_per_s)
                    })
                })
                .collect();
            let refined = if at.iter().any(|p| p.refined) {
                " (refinement)"
            } else {
                ""
            };
            let _ = writeln!(s, "| {t}x{refined} | {rps:.2} | {} |", cells.join(" | "));
        }
        let _ = writeln!(
            s,
            "\nCapacity ratio: continuous / static {}, continuous / one at a time {}.",
            self.ratio_words(1, true),
            self.ratio_words(2, true)
        );
        let h = &self.config.host;
        let _ = writeln!(
            s,
            "Measured on {} ({} logical CPUs; load average {} at the start) with {}; \
             {} runs in {:.0} s.",
            h.cpu.as_deref().unwrap_or("an unknown CPU"),
            h.logical_cpus,
            h.load_average_1m
                .map_or("unknown".to_string(), |l| format!("{l:.2}")),
            self.config.model.description,
            self.points.len(),
            self.sweep_duration_s
        );
        s
    }

    /// The points as CSV: a header, then one row per policy and rate.
    ///
    /// # Errors
    /// [`SweepOutputError::Csv`] with the CSV writer's message (it writes to
    /// memory: none in practice).
    pub fn csv(&self) -> Result<String, SweepOutputError> {
        let csv = |e: &dyn std::fmt::Display| SweepOutputError::Csv(e.to_string());
        let mut w = csv::Writer::from_writer(Vec::new());
        for p in &self.points {
            w.serialize(p).map_err(|e| csv(&e))?;
        }
        let bytes = w.into_inner().map_err(|e| csv(&e))?;
        String::from_utf8(bytes).map_err(|e| csv(&e))
    }

    /// Normalized latency (left) and SLO attainment (right) against the
    /// request rate, one line per policy, as an SVG document.
    ///
    /// # Errors
    /// [`SweepOutputError::Plot`] with the plotting library's message.
    pub fn plot_svg(&self) -> Result<String, SweepOutputError> {
        plot::svg(self).map_err(|e| SweepOutputError::Plot(e.to_string()))
    }
}

/// Why a sweep's CSV or plot could not be produced; carries the library's
/// message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SweepOutputError {
    /// The CSV writer failed ([`Sweep::csv`]).
    #[error("{0}")]
    Csv(String),
    /// The plotting library failed ([`Sweep::plot_svg`]).
    #[error("plotting the sweep: {0}")]
    Plot(String),
}

/// The text of a [`SweepOutputError`], for callers whose own errors are
/// still strings (the `xtc decode` command).
impl From<SweepOutputError> for String {
    fn from(e: SweepOutputError) -> String {
        e.to_string()
    }
}

mod plot {
    use plotters::prelude::*;

    use super::{MODES, Sweep};

    const COLORS: [RGBColor; 3] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
    ];

    pub(super) fn svg(sw: &Sweep) -> Result<String, Box<dyn std::error::Error>> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, (1200, 480)).into_drawing_area();
            root.fill(&WHITE)?;
            let (left, right) = root.split_horizontally(600);
            let rates: Vec<f64> = sw.points.iter().map(|p| p.request_rate_per_s).collect();
            let lo = rates
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min)
                .max(1e-6);
            let hi = rates.iter().copied().fold(0.0, f64::max).max(lo * 1.01);
            let x_range = (lo / 1.2..hi * 1.2).log_scale();
            let lat: Vec<f64> = sw
                .points
                .iter()
                .map(|p| p.normalized_latency_ms_per_token)
                .filter(|v| *v > 0.0)
                .collect();
            let ylo = lat
                .iter()
                .copied()
                .fold(f64::INFINITY, f64::min)
                .clamp(1e-3, 1.0);
            let yhi = lat.iter().copied().fold(0.0, f64::max).max(ylo * 10.0);
            let mut a = ChartBuilder::on(&left)
                .caption("normalized latency", ("sans-serif", 20))
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x_range.clone(), (ylo / 1.5..yhi * 1.5).log_scale())?;
            a.configure_mesh()
                .x_desc("request rate (requests/s)")
                .y_desc("mean e2e / output tokens (ms)")
                .draw()?;
            let mut b = ChartBuilder::on(&right)
                .caption(
                    format!(
                        "SLO attainment (target {:.0}%)",
                        sw.attainment_target * 100.0
                    ),
                    ("sans-serif", 20),
                )
                .margin(12)
                .x_label_area_size(40)
                .y_label_area_size(60)
                .build_cartesian_2d(x_range, 0.0..1.05)?;
            b.configure_mesh()
                .x_desc("request rate (requests/s)")
                .y_desc("share of requests meeting the SLO")
                .draw()?;
            b.draw_series(LineSeries::new(
                [
                    (lo / 1.2, sw.attainment_target),
                    (hi * 1.2, sw.attainment_target),
                ],
                BLACK.mix(0.4),
            ))?;
            for (mode, color) in MODES.iter().zip(COLORS) {
                let pts: Vec<_> = sw.points.iter().filter(|p| p.mode == *mode).collect();
                let l: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|p| p.normalized_latency_ms_per_token > 0.0)
                    .map(|p| (p.request_rate_per_s, p.normalized_latency_ms_per_token))
                    .collect();
                a.draw_series(LineSeries::new(l.clone(), color.stroke_width(2)))?
                    .label(*mode)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                a.draw_series(l.into_iter().map(|xy| Circle::new(xy, 3, color.filled())))?;
                let t: Vec<(f64, f64)> = pts
                    .iter()
                    .map(|p| (p.request_rate_per_s, p.attainment))
                    .collect();
                b.draw_series(LineSeries::new(t.clone(), color.stroke_width(2)))?
                    .label(*mode)
                    .legend(move |(x, y)| {
                        PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                b.draw_series(t.into_iter().map(|xy| Circle::new(xy, 3, color.filled())))?;
            }
            a.configure_series_labels()
                .position(SeriesLabelPosition::UpperLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
            b.configure_series_labels()
                .position(SeriesLabelPosition::LowerLeft)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
            root.present()?;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_is_the_last_rate_before_the_first_miss() {
        let t = ATTAINMENT_TARGET;
        assert_eq!(
            capacity(&[(4.0, 0.95), (1.0, 1.0), (2.0, 0.9), (8.0, 0.5)], t),
            Some(4.0)
        );
        // A noisy pass above a miss does not count.
        assert_eq!(
            capacity(&[(1.0, 1.0), (2.0, 0.89), (4.0, 0.95)], t),
            Some(1.0)
        );
        assert_eq!(capacity(&[(1.0, 0.2), (2.0, 0.1)], t), None);
        assert_eq!(capacity(&[(1.0, 1.0), (2.0, 1.0)], t), Some(2.0));
        assert_eq!(capacity(&[], t), None);
    }

    fn config() -> RunConfig {
        use crate::run_config::{
            DeviceConfig, HostConfig, KvConfig, LengthScaling, ModelConfig, TraceConfig,
        };
        RunConfig {
            trace: TraceConfig {
                source: "t".into(),
                path: None,
                rows: 4,
                row_start: 0,
                row_end: 4,
            },
            requests: 4,
            time_scale: 1.0,
            length_scaling: LengthScaling::from(&crate::trace::Scaling::IDENTITY),
            seed: 1,
            cancel_rate: 0.0,
            model: ModelConfig::of(&xtc_model::Config::tiny(), "toy".into(), None, 0, 0),
            kv_cache: KvConfig {
                blocks: 1,
                block_size_tokens: 16,
                positions: 16,
                bytes: None,
            },
            token_budget_tokens: 64,
            max_active: 32,
            device: DeviceConfig::named("toy", "toy", "none"),
            host: HostConfig {
                cpu: Some("Test CPU".into()),
                logical_cpus: 2,
                load_average_1m: Some(1.5),
            },
            slo: Slo {
                ttft_ms: Some(1000.0),
                tpot_ms: None,
            },
        }
    }

    fn point(mode: &'static str, time_scale: f64, attainment: f64) -> SweepPoint {
        SweepPoint {
            mode,
            time_scale,
            request_rate_per_s: time_scale / 2.0,
            duration_s: 1.0,
            completed: 4,
            requests_per_s: 1.0,
            output_tokens_per_s: 10.0 * time_scale,
            normalized_latency_ms_per_token: 5.0,
            ttft_p99_ms: 100.0 * time_scale,
            tpot_p99_ms: 50.0,
            mean_ready_members: 2.0,
            attainment,
            goodput_requests_per_s: 1.0,
            refined: false,
        }
    }

    #[test]
    fn a_knee_is_bracketed_by_the_last_met_and_the_first_missed_rate() {
        let t = ATTAINMENT_TARGET;
        assert_eq!(
            knee_bracket(&[(8.0, 0.5), (1.0, 1.0), (2.0, 0.9), (4.0, 0.3)], t),
            Some((2.0, 4.0))
        );
        // A noisy pass above the first miss is not the bracket's upper end.
        assert_eq!(
            knee_bracket(&[(1.0, 1.0), (2.0, 0.5), (4.0, 0.95)], t),
            Some((1.0, 2.0))
        );
        // Open above (met everywhere) or below (missed the lowest): none.
        assert_eq!(knee_bracket(&[(1.0, 1.0), (2.0, 0.95)], t), None);
        assert_eq!(knee_bracket(&[(1.0, 0.5), (2.0, 0.95)], t), None);
        assert_eq!(knee_bracket(&[], t), None);
    }

    #[test]
    fn a_refinement_rate_is_the_rounded_geometric_mean_strictly_inside() {
        assert_eq!(refine_rate(2.0, 4.0), Some(2.83));
        assert_eq!(refine_rate(0.5, 1.0), Some(0.707));
        assert_eq!(refine_rate(16.0, 64.0), Some(32.0));
        assert_eq!(refine_rate(1.0, 50.0), Some(7.07));
        assert_eq!(refine_rate(100.0, 400.0), Some(200.0));
        // Too narrow to split at 3 digits, or not a bracket.
        assert_eq!(refine_rate(1.0, 1.001), None);
        assert_eq!(refine_rate(4.0, 2.0), None);
        assert_eq!(refine_rate(2.0, 2.0), None);
        assert_eq!(refine_rate(0.0, 2.0), None);
        assert_eq!(refine_rate(1.0, f64::INFINITY), None);
        // Repeated bisection narrows the bracket and stays inside it.
        let (mut lo, mut hi) = (1.0, 2.0);
        for i in 0..6 {
            let m = refine_rate(lo, hi).expect("still splittable");
            assert!(lo < m && m < hi);
            if i % 2 == 0 { lo = m } else { hi = m }
        }
        assert!(hi / lo < 1.1, "{lo} {hi}");
    }

    /// Found by an outside check: a ratio against a policy that met every
    /// rate printed as exact (`0.00x`), two open capacities as a lower
    /// bound, and "n/a" blamed the other policy when continuous batching
    /// sustained nothing.
    #[test]
    fn ratio_words_say_what_bounds_each_ratio() {
        let sweep = |att: [[f64; 3]; 3]| {
            let rates = [1.0, 64.0, 256.0];
            let pts = rates
                .iter()
                .zip(att)
                .flat_map(|(&t, a)| MODES.iter().zip(a).map(move |(m, x)| point(m, t, x)))
                .collect();
            Sweep::new(config(), pts, 1.0)
        };
        // Continuous knee at 1x (missed 64x); one at a time met every rate.
        let sw = sweep([[1.0, 1.0, 1.0], [0.5, 1.0, 1.0], [0.5, 0.5, 1.0]]);
        assert_eq!(
            sw.ratio_words(2, false),
            "<= 0.00391x (an upper bound: one-at-a-time met every rate)"
        );
        assert_eq!(
            sw.ratio_words(1, true),
            "**0.0156x** (from the knees' brackets: 0.00391x to 1.00x)"
        );
        // Both met every rate: no ratio can be read.
        let sw = sweep([[1.0; 3], [1.0; 3], [1.0; 3]]);
        assert!(sw.ratio_words(1, false).starts_with("unknown (both met"));
        assert_eq!(sw.capacity_ratio_continuous_vs_static, Some(1.0));
        // Continuous met every rate, static did not.
        let sw = sweep([[1.0; 3], [1.0, 1.0, 0.5], [1.0, 0.2, 0.2]]);
        assert_eq!(
            sw.ratio_words(1, true),
            "**>= 4.00x** (a lower bound: continuous met every rate)"
        );
        assert_eq!(
            sw.ratio_words(2, false),
            ">= 256.00x (a lower bound: continuous met every rate)"
        );
        // Continuous sustains nothing: it is named, not the other policy.
        let sw = sweep([[0.5, 1.0, 1.0], [0.5, 1.0, 1.0], [0.5, 1.0, 1.0]]);
        assert_eq!(
            sw.ratio_words(2, false),
            "n/a (continuous sustains no rate swept)"
        );
        let sw = sweep([[1.0, 0.5, 0.5], [0.5, 0.5, 0.5], [0.5; 3]]);
        assert_eq!(
            sw.ratio_words(1, false),
            "n/a (static sustains no rate swept)"
        );
        // A miss never rounds up to the target in the markdown.
        let sw = sweep([[0.896, 1.0, 1.0], [0.5, 1.0, 1.0], [0.5; 3]]);
        assert!(
            sw.markdown()
                .contains("| 1x | 0.50 | 89%, 10.0 | 100%, 10.0 | 100%, 10.0 |"),
            "{}",
            sw.markdown()
        );
        assert_eq!(ratio_number(1.41), "1.41x");
        assert_eq!(ratio_number(256.0), "256.00x");
        assert_eq!(ratio_number(0.0625), "0.0625x");
    }

    #[test]
    fn refinement_points_move_the_capacity_and_are_marked() {
        let refined = |mode, t, att| SweepPoint {
            refined: true,
            ..point(mode, t, att)
        };
        // Grid 1, 2, 4: continuous knee in (2, 4), static's in (1, 2);
        // refinements (pushed after the grid, as a sweep runs them): 2.83
        // met and 3.36 missed for continuous, 1.41 missed for static.
        let pts = vec![
            point("continuous", 1.0, 1.0),
            point("static", 1.0, 1.0),
            point("one-at-a-time", 1.0, 0.95),
            point("continuous", 2.0, 1.0),
            point("static", 2.0, 0.5),
            point("one-at-a-time", 2.0, 0.1),
            point("continuous", 4.0, 0.4),
            point("static", 4.0, 0.2),
            point("one-at-a-time", 4.0, 0.1),
            refined("continuous", 2.83, 0.92),
            refined("static", 1.41, 0.6),
            refined("continuous", 3.36, 0.7),
        ];
        let sw = Sweep::new(config(), pts, 3.0);
        let cap: Vec<Option<f64>> = sw.capacity.iter().map(|c| c.capacity_time_scale).collect();
        assert_eq!(cap, [Some(2.83), Some(1.0), Some(1.0)]);
        assert_eq!(sw.capacity_ratio_continuous_vs_static, Some(2.83));
        assert_eq!(sw.time_scales, [1.0, 1.41, 2.0, 2.83, 3.36, 4.0]);
        // Sorted by rate, then policy.
        let order: Vec<(f64, &str)> = sw.points.iter().map(|p| (p.time_scale, p.mode)).collect();
        assert_eq!(order[3], (1.41, "static"));
        assert_eq!(order[7], (2.83, "continuous"));
        assert_eq!(order[8], (3.36, "continuous"));
        let text = sw.render();
        assert!(text.contains("* a knee refinement's run"), "{text}");
        assert_eq!(
            text.lines().filter(|l| l.ends_with('*')).count(),
            3,
            "{text}"
        );
        let md = sw.markdown();
        assert!(
            md.contains("| continuous | 2.83x (missed 3.36x) | 1.42 |"),
            "{md}"
        );
        assert!(md.contains("| static | 1x (missed 1.41x) | 0.50 |"), "{md}");
        let missed: Vec<Option<f64>> = sw
            .capacity
            .iter()
            .map(|c| c.first_missed_time_scale)
            .collect();
        assert_eq!(missed, [Some(3.36), Some(1.41), Some(2.0)]);
        // continuous in [2.83, 3.36), static in [1, 1.41).
        let (lo, hi) = sw.ratio_bracket(0, 1).unwrap();
        assert!((lo - 2.83 / 1.41).abs() < 1e-12 && (hi - 3.36).abs() < 1e-12);
        assert!(
            md.contains("**2.83x** (from the knees' brackets: 2.01x to 3.36x)"),
            "{md}"
        );
        assert!(
            md.contains("| 2.83x (refinement) | 1.42 | 92%, 28.3 | - | - |"),
            "{md}"
        );
        assert!(md.contains("continuous / static **2.83x**"), "{md}");
        assert!(text.contains("2.83x (missed 3.36x)"), "{text}");
        // The CSV says which rows are refinements.
        let csv = sw.csv().unwrap();
        assert!(csv.lines().next().unwrap().ends_with(",refined"), "{csv}");
        assert_eq!(csv.lines().filter(|l| l.ends_with(",true")).count(), 3);
    }

    #[test]
    fn markdown_names_each_knee_and_every_rate() {
        let pts = vec![
            point("continuous", 1.0, 1.0),
            point("static", 1.0, 1.0),
            point("one-at-a-time", 1.0, 0.5),
            point("continuous", 2.0, 0.95),
            point("static", 2.0, 0.2),
            point("one-at-a-time", 2.0, 0.1),
        ];
        let md = Sweep::new(config(), pts, 3.0).markdown();
        let lines: Vec<&str> = md.lines().collect();
        assert!(
            md.contains(
                "| continuous | >= 2x (met at every rate) | >= 1.00 | 20.0 | 200 ms | 50 ms | 2.0 |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| static | 1x (missed 2x) | 0.50 | 10.0 | 100 ms | 50 ms | 2.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| one-at-a-time | < 1x | - | - | - | - | - |"),
            "{md}"
        );
        assert!(
            md.contains("| 2x | 1.00 | 95%, 20.0 | 20%, 20.0 | 10%, 20.0 |"),
            "{md}"
        );
        assert!(md.contains("continuous / static **>= 2.00x**"), "{md}");
        assert!(md.contains("one at a time n/a"), "{md}");
        assert!(
            md.contains(
                "Measured on Test CPU (2 logical CPUs; load average 1.50 at the start) with toy"
            ),
            "{md}"
        );
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("| ---")).count(),
            2,
            "{md}"
        );
    }
}
