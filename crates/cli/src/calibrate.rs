//! `xtc calibrate`: measures the GGUF model's iteration cost on a device
//! (fixed, per token row, per KV position read) over a small designed set
//! of iterations, fits it by least squares ([`xtc_model::cost`]),
//! prints the points, the fit, R² and the residuals, and writes the JSON
//! that `xtc decode --device toy --toy-cost FILE` replays.
//!
//! Exit status: 0 done; 1 the model, the device or the output failed, or
//! the design could not be fitted; 2 a usage error.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use xtc_model::KvGeometry;
use xtc_model::open::{Limits, open};
use xtc_replay::calibrate::{
    self, COST_FORMAT, COST_VERSION, CostCoefficients, CostFile, DesignPoint,
};

use super::generate::{Failure, load, open_device};
use crate::out_file::OutFile;

/// Arguments of `xtc calibrate`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
The model: cost = fixed + per_row x token rows + per_position x KV positions read,
where a token row at position p reads p + 1 positions (attention). Every decode
point runs ROWS sequences of one token each after CACHED positions; every prefill
point one chunk of ROWS tokens (after the smallest and the median CACHED). Each
point is timed launch to finish (the wall time the serving loop waits), REPEATS
times round robin; the fit is over the points' medians.

Exit status: 0 done; 1 model, device, output or fit failed; 2 usage error.

Example (about a minute on lavapipe, 2 cores), then the toy replays the fit:
  xtc calibrate --output smollm2-lavapipe.json
  xtc decode --device toy --model ~/.cache/xtc/SmolLM2-135M-Instruct.Q4_1.gguf \\
      --toy-cost smollm2-lavapipe.json --sweep")]
pub struct CalibrateArgs {
    /// GGUF model file (default: the fetched SmolLM2-135M-Instruct in the cache directory).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// `auto` (the default: the first Vulkan device, a GPU if present, else lavapipe; the CPU
    /// reference when no Vulkan device opens), `cpu` (the CPU reference, no Vulkan), or a Vulkan
    /// device index, part of its name or its render node (`xtc probe` lists them).
    #[arg(long, value_name = "DEV", default_value = "auto", value_parser = crate::device::parse)]
    pub device: crate::device::DeviceArg,
    /// Decode rows (sequences of one token) of the design, comma-separated, each >= 1.
    #[arg(long, value_name = "LIST", default_value = "1,2,4,8,16,32", value_parser = counts(1))]
    pub rows: Counts,
    /// Cached positions before the iteration, comma-separated (at least two distinct
    /// values; each below the positions a sequence may hold on the device).
    #[arg(long, value_name = "LIST", default_value = "0,500,1000,1500", value_parser = counts(0))]
    pub cached: Counts,
    /// Prefill chunk lengths of the design, comma-separated (`none` for none).
    #[arg(long, value_name = "LIST", default_value = "8,32", value_parser = counts_or_none)]
    pub prefill_rows: Counts,
    /// Timed repetitions of every point (>= 1); a point's figure is their median.
    #[arg(long, value_name = "N", default_value_t = 3,
          value_parser = crate::decode::args::count(1, 1000))]
    pub repeats: usize,
    /// KV positions per block of the plans (>= 1).
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = crate::decode::args::count(1, 4096))]
    pub block_size: usize,
    /// Write the calibration as JSON (what `xtc decode --toy-cost FILE` reads).
    #[arg(long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Print the calibration as JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// A parsed list of whole numbers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts(pub Vec<usize>);

/// The clap value parser of a comma-separated list of whole numbers `>= lo`
/// (at most 65536 each), sorted, without repeats.
fn counts(lo: usize) -> impl Fn(&str) -> Result<Counts, String> + Clone + Send + Sync {
    move |s: &str| {
        let one = crate::decode::args::count(lo, 65536);
        let mut v = Vec::new();
        for part in s.split(',') {
            v.push(one(part).map_err(|e| format!("{:?} {e}", part.trim()))?);
        }
        v.sort_unstable();
        v.dedup();
        Ok(Counts(v))
    }
}

/// `--prefill-rows`: [`counts`] of numbers >= 1, or `none`.
fn counts_or_none(s: &str) -> Result<Counts, String> {
    if s.trim() == "none" {
        Ok(Counts(Vec::new()))
    } else {
        counts(1)(s)
    }
}

/// Runs `xtc calibrate`, writing the table (or JSON) to `out`, progress to
/// stderr; returns the exit status.
pub fn run(args: &CalibrateArgs, out: &mut dyn Write) -> i32 {
    match run_inner(args, out) {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("xtc calibrate: error: {}", f.msg);
            f.code
        }
    }
}

fn run_inner(args: &CalibrateArgs, out: &mut dyn Write) -> Result<(), Failure> {
    if args.cached.0.len() < 2 {
        return Err(Failure::usage(
            "--cached needs at least two distinct values: with one, positions read \
             grow with rows alone and the two slopes cannot be told apart",
        ));
    }
    if args.rows.0.len() < 2 {
        return Err(Failure::usage(
            "--rows needs at least two distinct values to fit a cost per row",
        ));
    }
    let output = args
        .output
        .as_deref()
        .map(|p| OutFile::prepare("--output", p, &[("--model", args.model.as_deref())]))
        .transpose()
        .map_err(Failure::error)?;
    // The CPU reference runs on rayon's global pool (one thread per core),
    // as in `xtc decode`.
    let (spec, _tok, path, _pool) = load(args.model.as_deref(), &args.device, None)?;
    let target = open_device(&args.device, "xtc calibrate")?;
    let points = calibrate::design(&args.rows.0, &args.cached.0, &args.prefill_rows.0);
    let context = target.context(spec.shape().seq_len);
    if let Some(p) = points.iter().find(|p| p.context() > context) {
        return Err(Failure::usage(format!(
            "a {} point of {} row(s) after {} cached positions reaches position {}, above \
             the {context} a sequence may hold on this device: lower --cached or --prefill-rows",
            kind_name(p),
            p.rows,
            p.cached,
            p.context()
        )));
    }
    let bs = args.block_size;
    let max = |f: fn(&DesignPoint, usize) -> usize| points.iter().map(|p| f(p, bs)).max();
    let limits = Limits {
        kv: KvGeometry {
            block_size: bs,
            n_blocks: max(|p, bs| p.blocks(bs)).unwrap_or(1),
        },
        max_tokens: max(|p, _| p.rows).unwrap_or(1),
        max_seqs: max(|p, _| p.seqs()).unwrap_or(1),
        max_context: max(|p, _| p.context()).unwrap_or(1),
        kernels: None,
    };
    let mut model = open(&spec, &target, limits).map_err(Failure::error)?;
    let description = model.describe();
    eprintln!(
        "xtc calibrate: {description}: {} points x {} repeats",
        points.len(),
        args.repeats
    );
    let tty = std::io::stderr().is_terminal();
    let mut progress = |done: usize, total: usize| {
        if tty {
            eprint!("\r  {done}/{total} iterations");
        }
    };
    let cal = calibrate::calibrate(model.as_mut(), &points, bs, args.repeats, &mut progress)
        .map_err(Failure::error)?;
    if tty {
        eprintln!();
    }
    let (cpu, _) = crate::decode::config::cpu_model();
    let file = CostFile {
        format: COST_FORMAT.into(),
        version: COST_VERSION,
        model: path.file_name().map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        ),
        device: description,
        cpu: Some(cpu),
        load_average_1m: crate::decode::config::load_average(),
        measured_at_unix_s: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        block_size: bs,
        repeats: args.repeats,
        cost: CostCoefficients {
            fixed_us: cal.coef_us[0],
            per_row_us: cal.coef_us[1],
            per_position_us: cal.coef_us[2],
        },
        r_squared: cal.r_squared,
        rms_residual_us: cal.rms_residual_us,
        points: cal.points,
    };
    let json = serde_json::to_string_pretty(&file).map_err(Failure::error)? + "\n";
    let text = if args.json {
        json.clone()
    } else {
        render(&file)
    };
    out.write_all(text.as_bytes())
        .map_err(|e| Failure::error(format!("cannot write the output: {e}")))?;
    if let Some(o) = output {
        let shown = o.path().display().to_string();
        o.write(json.as_bytes()).map_err(Failure::error)?;
        eprintln!(
            "xtc calibrate: wrote {shown}; replay it with \
             xtc decode --device toy --model {} --toy-cost {shown}",
            path.display()
        );
    }
    Ok(())
}

fn kind_name(p: &DesignPoint) -> &'static str {
    match p.kind {
        calibrate::PointKind::Decode => "decode",
        calibrate::PointKind::Prefill => "prefill",
    }
}

/// The points, the fit, R² and the residuals as text.
pub fn render(f: &CostFile) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<8} {:>5} {:>7} {:>9} {:>12} {:>10} {:>12}",
        "kind", "rows", "cached", "pos read", "measured ms", "fitted ms", "residual ms"
    );
    for p in &f.points {
        let _ = writeln!(
            s,
            "{:<8} {:>5} {:>7} {:>9} {:>12.2} {:>10.2} {:>+12.2}",
            kind_name(&p.point),
            p.point.rows,
            p.point.cached,
            p.positions_read,
            p.measured_us / 1e3,
            p.fitted_us / 1e3,
            p.residual_us / 1e3
        );
    }
    let c = f.cost;
    let r2 = f.r_squared.map_or("n/a".into(), |r| format!("{r:.4}"));
    let _ = writeln!(
        s,
        "\nfit: {:.3} ms + {:.3} ms per token row + {:.4} us per KV position read \
         (R^2 {r2}, rms residual {:.2} ms, max |residual| {:.2} ms)",
        c.fixed_us / 1e3,
        c.per_row_us / 1e3,
        c.per_position_us,
        f.rms_residual_us / 1e3,
        f.points
            .iter()
            .map(|p| p.residual_us.abs())
            .fold(0.0, f64::max)
            / 1e3
    );
    let gains: Vec<String> = [8, 32, 64]
        .iter()
        .filter_map(|&rows| {
            f.iteration_cost()
                .batching_gain(rows)
                .map(|g| format!("{rows} rows {g:.2}x"))
        })
        .collect();
    if !gains.is_empty() {
        let _ = writeln!(
            s,
            "batching gain (the fit, KV reads aside; token rows/s against 1-row iterations, \
             the most throughput batching can buy on this device): {}",
            gains.join(", ")
        );
    }
    for (name, v) in [
        ("fixed", c.fixed_us),
        ("per-row", c.per_row_us),
        ("per-position", c.per_position_us),
    ] {
        if v < 0.0 {
            let _ = writeln!(
                s,
                "note: the {name} term came out negative (below the noise); \
                 the toy replays it as 0"
            );
        }
    }
    let _ = writeln!(
        s,
        "{}; {} repeats per point; load average {}",
        f.device,
        f.repeats,
        f.load_average_1m
            .map_or("unknown".into(), |l| format!("{l:.2}"))
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cost file of `fixed_us + per_row_us x rows`, no points.
    fn file(fixed_us: f64, per_row_us: f64) -> CostFile {
        serde_json::from_value(serde_json::json!({
            "format": COST_FORMAT, "version": COST_VERSION, "model": "m.gguf",
            "device": "llvmpipe", "cpu": null, "load_average_1m": null,
            "measured_at_unix_s": 0, "block_size": 16, "repeats": 1,
            "cost": {"fixed_us": fixed_us, "per_row_us": per_row_us, "per_position_us": 4.0},
            "r_squared": null, "rms_residual_us": 0.0, "points": []
        }))
        .unwrap()
    }

    #[test]
    fn the_text_gives_the_batching_gain_of_the_fit() {
        // 14 ms + 6 ms a row: 8 rows in 62 ms against 8 x 20 (2.58x), 32 in
        // 206 ms (3.11x), 64 in 398 ms (3.22x).
        let text = render(&file(14_000.0, 6_000.0));
        assert!(
            text.contains("32 rows 3.11x") && text.contains("8 rows 2.58x"),
            "{text}"
        );
        assert!(text.contains("64 rows 3.22x"), "{text}");
        // A fit with no fixed or per-row time has no gain to give.
        assert!(!render(&file(0.0, -5.0)).contains("batching gain"));
    }
}
