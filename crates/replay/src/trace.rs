//! Request traces in the Azure LLM inference trace schema.
//!
//! A trace is a CSV file with the header `TIMESTAMP,ContextTokens,GeneratedTokens`
//! (the schema of the Azure LLM inference traces 2023 and 2024): one row per
//! request, its invocation time, its prompt length and the number of tokens it
//! decodes. `xtc decode` replays the arrivals (relative to the first row,
//! optionally sped up) and the length distribution.
//!
//! `TIMESTAMP` is either a civil time `YYYY-MM-DD HH:MM:SS[.fffffffff]` (UTC,
//! the 2023 form), optionally with a zone suffix `Z`, `+HH:MM`, `-HHMM` or
//! `+HH` (the 2024 form `2024-05-10 00:00:00.009930+00:00`), or plain seconds
//! (`12.5`). Rows must be in time order: a row earlier than the row before it
//! is an error naming its line (the trace is not re-sorted behind the user's
//! back).
//!
//! The default workload is a slice of the conversation trace embedded in the
//! binary ([`embedded`]), licensed CC-BY-4.0: see `crates/replay/src/TRACE_LICENSE.md`
//! for the attribution that travels with it.

use std::path::Path;
use std::time::Duration;

/// The first 1,500 requests of `AzureLLMInferenceTrace_conv.csv` (CC-BY-4.0,
/// attribution in `crates/replay/src/TRACE_LICENSE.md`).
pub const EMBEDDED_CSV: &str = include_str!("azure_conv_slice.csv");

/// Name under which [`embedded`] reports the built-in slice.
pub const EMBEDDED_NAME: &str = "AzureLLMInferenceTrace_conv.csv (first 1,500 rows, embedded)";

/// The columns a trace must have, in any order (extra columns are ignored).
pub const COLUMNS: [&str; 3] = ["TIMESTAMP", "ContextTokens", "GeneratedTokens"];

/// One request of a trace, before scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    /// Arrival time relative to the trace's first row (zero for the first row).
    pub arrival: Duration,
    /// Prompt length in tokens (`ContextTokens`).
    pub prompt_tokens: usize,
    /// Tokens to decode (`GeneratedTokens`).
    pub output_tokens: usize,
}

/// A parsed trace: its requests in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Requests in file order, arrivals non-decreasing ([`parse`] refuses
    /// out-of-order rows).
    pub requests: Vec<TraceRequest>,
}

/// Why a trace could not be read. Every row error names its 1-based line in
/// the file (the header is line 1).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {msg}")]
    Io {
        /// Path given by the user.
        path: String,
        /// The OS error.
        msg: String,
    },
    /// The header lacks one of [`COLUMNS`].
    #[error(
        "trace header lacks column `{column}` (expected TIMESTAMP,ContextTokens,GeneratedTokens)"
    )]
    MissingColumn {
        /// The missing column's name.
        column: &'static str,
    },
    /// A row could not be parsed.
    #[error("trace line {line}: {msg}")]
    Row {
        /// 1-based line number in the file.
        line: u64,
        /// What is wrong with the row.
        msg: String,
    },
    /// The trace has a header but no request rows (or no header at all).
    #[error("trace has no requests")]
    Empty,
}

/// How a trace is turned into a workload for a device.
///
/// `time_scale` is a speed-up: an arrival `t` after the first row is replayed
/// at `t / time_scale`. Prompt and output lengths are divided by their
/// divisors (rounding up, never below 1) and then clamped to the maxima, so a
/// CPU device (lavapipe) sees the trace's shape at a size it can run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaling {
    /// Speed-up of the arrival clock (> 0; 1.0 replays in real time).
    pub time_scale: f64,
    /// Divisor of `ContextTokens` (>= 1).
    pub prompt_div: usize,
    /// Divisor of `GeneratedTokens` (>= 1).
    pub output_div: usize,
    /// Upper bound of a scaled prompt, in tokens (>= 1).
    pub max_prompt: usize,
    /// Upper bound of a scaled output, in tokens (>= 1).
    pub max_output: usize,
}

impl Scaling {
    /// No scaling at all: real-time arrivals, lengths as in the trace.
    pub const IDENTITY: Scaling = Scaling {
        time_scale: 1.0,
        prompt_div: 1,
        output_div: 1,
        max_prompt: usize::MAX,
        max_output: usize::MAX,
    };

    /// Applies the scaling to one request. Never panics: an arrival the
    /// speed-up cannot map to a `Duration` of at most [`MAX_ARRIVAL`] (a tiny,
    /// zero, negative or NaN `time_scale`) saturates at [`MAX_ARRIVAL`];
    /// [`Scaling::check_arrivals`] turns that into an error for the user.
    pub fn apply(&self, r: &TraceRequest) -> TraceRequest {
        let scale = |n: usize, div: usize, max: usize| n.div_ceil(div.max(1)).clamp(1, max.max(1));
        TraceRequest {
            arrival: self.arrival(r.arrival).unwrap_or(MAX_ARRIVAL),
            prompt_tokens: scale(r.prompt_tokens, self.prompt_div, self.max_prompt),
            output_tokens: scale(r.output_tokens, self.output_div, self.max_output),
        }
    }
}

impl Scaling {
    /// `arrival / time_scale`, or `None` when that is no `Duration` of at
    /// most [`MAX_ARRIVAL`].
    fn arrival(&self, arrival: Duration) -> Option<Duration> {
        if arrival.is_zero() {
            return Some(Duration::ZERO);
        }
        Duration::try_from_secs_f64(arrival.as_secs_f64() / self.time_scale)
            .ok()
            .filter(|d| *d <= MAX_ARRIVAL)
    }

    /// Checks that every arrival of `requests` still fits the clock once
    /// sped up by `time_scale`.
    ///
    /// # Errors
    /// [`ArrivalError`] naming the time scale and the latest arrival, which
    /// does not fit.
    pub fn check_arrivals(&self, requests: &[TraceRequest]) -> Result<(), ArrivalError> {
        let Some(last) = requests.iter().map(|r| r.arrival).max() else {
            return Ok(());
        };
        match self.arrival(last) {
            Some(_) => Ok(()),
            None => Err(ArrivalError {
                time_scale: self.time_scale,
                last,
            }),
        }
    }
}

/// A trace whose latest arrival, sped up by the time scale, falls past the
/// clock of a run ([`MAX_ARRIVAL`]): the caller picks a larger time scale.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "--time-scale {time_scale:?}: the arrival {:.3} s after the first row would be replayed \
     {:.3e} s after the start, past the {} s (about 584 years) a run's clock holds; \
     use a larger --time-scale",
    last.as_secs_f64(),
    last.as_secs_f64() / time_scale,
    MAX_ARRIVAL.as_secs()
)]
pub struct ArrivalError {
    /// The speed-up asked for.
    pub time_scale: f64,
    /// The latest arrival after the first row, unscaled.
    pub last: Duration,
}

/// The text of an [`ArrivalError`], for callers whose own errors are still
/// strings (the `xtc decode` command).
impl From<ArrivalError> for String {
    fn from(e: ArrivalError) -> String {
        e.to_string()
    }
}

/// Why a `TIMESTAMP` field does not parse ([`parse_timestamp`]); carries
/// the field's text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimestampError {
    /// Neither a date and time nor a number.
    #[error("TIMESTAMP `{0}` is not YYYY-MM-DD HH:MM:SS[.fffffff][+HH:MM] or a number of seconds")]
    Malformed(String),
    /// Digits and dots that are no number of seconds (`.`, `1.2.3`, too large).
    #[error("TIMESTAMP `{0}` is not a number of seconds")]
    NotSeconds(String),
}

/// Why one trace row does not parse (the message of [`TraceError::Row`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RowError {
    #[error("missing field {0}")]
    MissingField(&'static str),
    #[error(transparent)]
    Timestamp(#[from] TimestampError),
    #[error("{column} `{text}` is not a non-negative integer")]
    NotACount { column: &'static str, text: String },
    #[error("ContextTokens is 0 (a request needs at least one prompt token)")]
    NoPrompt,
    #[error("GeneratedTokens is 0 (a request decodes at least one token)")]
    NoOutput,
}

/// The latest arrival a trace (and a scaled replay of it) can hold: `u64::MAX`
/// nanoseconds after the first row, about 584 years.
pub const MAX_ARRIVAL: Duration = Duration::from_nanos(u64::MAX);

/// The embedded slice of the Azure conversation trace.
pub fn embedded() -> Trace {
    parse(EMBEDDED_CSV).expect("the embedded trace slice parses")
}

/// Reads and parses a trace file.
///
/// # Errors
/// [`TraceError::Io`] when the file cannot be read, [`TraceError::Row`]
/// naming the line of the first byte that is not UTF-8, otherwise as [`parse`].
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::Io {
        path: path.display().to_string(),
        msg: e.to_string(),
    })?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        let bad = e.valid_up_to();
        let line = bytes[..bad].iter().filter(|&&b| b == b'\n').count() as u64 + 1;
        TraceError::Row {
            line,
            msg: format!("byte {bad} of the file is not UTF-8 text"),
        }
    })?;
    parse(text)
}

/// Parses trace CSV text (header + rows; `\n` or `\r\n` line ends).
///
/// # Errors
/// [`TraceError::MissingColumn`] for a header without the three columns,
/// [`TraceError::Row`] naming the first malformed row's line (bad timestamp,
/// a timestamp earlier than the previous row's, non-integer or negative
/// length, zero output, wrong field count), and
/// [`TraceError::Empty`] when there is no request row.
pub fn parse(text: &str) -> Result<Trace, TraceError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let headers = rdr.headers().map_err(|e| row_error(1, &e))?.clone();
    if headers.is_empty() || (headers.len() == 1 && headers[0].is_empty()) {
        return Err(TraceError::Empty);
    }
    let idx = column_indices(&headers)?;
    let mut first_ns: Option<i128> = None;
    let mut prev_ns = i128::MIN;
    let mut requests = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| {
            let line = e.position().map_or(0, |p| p.line());
            row_error(line, &e)
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        let (ts, prompt, output) = parse_row(&rec, idx).map_err(|e| TraceError::Row {
            line,
            msg: e.to_string(),
        })?;
        if ts < prev_ns {
            return Err(TraceError::Row {
                line,
                msg: "TIMESTAMP is earlier than the previous row's (rows must be in time order)"
                    .into(),
            });
        }
        prev_ns = ts;
        let t0 = *first_ns.get_or_insert(ts);
        let rel = u64::try_from(ts - t0).map_err(|_| TraceError::Row {
            line,
            msg: "TIMESTAMP is too far after the first row's".into(),
        })?;
        requests.push(TraceRequest {
            arrival: Duration::from_nanos(rel),
            prompt_tokens: prompt,
            output_tokens: output,
        });
    }
    if requests.is_empty() {
        return Err(TraceError::Empty);
    }
    Ok(Trace { requests })
}

fn row_error(line: u64, e: &csv::Error) -> TraceError {
    TraceError::Row {
        line,
        msg: e.to_string(),
    }
}

fn column_indices(headers: &csv::StringRecord) -> Result<[usize; 3], TraceError> {
    let mut idx = [0; 3];
    for (slot, column) in idx.iter_mut().zip(COLUMNS) {
        *slot = headers
            .iter()
            .position(|h| h.trim_start_matches('\u{feff}') == column)
            .ok_or(TraceError::MissingColumn { column })?;
    }
    Ok(idx)
}

fn parse_row(rec: &csv::StringRecord, idx: [usize; 3]) -> Result<(i128, usize, usize), RowError> {
    let field = |i: usize, name: &'static str| rec.get(i).ok_or(RowError::MissingField(name));
    let ts = parse_timestamp(field(idx[0], "TIMESTAMP")?)?;
    let count = |column: &'static str, s: &str| {
        s.parse::<usize>().map_err(|_| RowError::NotACount {
            column,
            text: s.to_owned(),
        })
    };
    let prompt = count("ContextTokens", field(idx[1], "ContextTokens")?)?;
    let output = count("GeneratedTokens", field(idx[2], "GeneratedTokens")?)?;
    if prompt == 0 {
        return Err(RowError::NoPrompt);
    }
    if output == 0 {
        return Err(RowError::NoOutput);
    }
    Ok((ts, prompt, output))
}

/// Parses a trace timestamp into nanoseconds since 1970-01-01 UTC (negative
/// before it): `YYYY-MM-DD HH:MM:SS[.fffffffff]` (UTC) with an optional zone
/// suffix (`Z`, `+HH:MM`, `-HHMM`, `+HH`), or plain non-negative seconds
/// (`12`, `0.25`; digits past nanoseconds are dropped).
///
/// # Errors
/// [`TimestampError::NotSeconds`] for digits and dots that are no number,
/// [`TimestampError::Malformed`] for anything else that is not of the form
/// (including a day its month lacks).
pub fn parse_timestamp(s: &str) -> Result<i128, TimestampError> {
    if s.bytes().all(|b| b.is_ascii_digit() || b == b'.') && !s.is_empty() {
        return parse_seconds(s);
    }
    let bad = || TimestampError::Malformed(s.to_owned());
    let (date, time) = s.split_once([' ', 'T']).ok_or_else(bad)?;
    let (time, offset_s) = split_zone(time).ok_or_else(bad)?;
    let d: Vec<&str> = date.split('-').collect();
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let t: Vec<&str> = hms.split(':').collect();
    if d.len() != 3 || t.len() != 3 || frac.len() > 9 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let num = |x: &str| x.parse::<i64>().map_err(|_| bad());
    let (y, mo, da) = (num(d[0])?, num(d[1])?, num(d[2])?);
    let (h, mi, se) = (num(t[0])?, num(t[1])?, num(t[2])?);
    // Years 0..=9999 (the `YYYY` of the form) keep the day count far from
    // overflow; the day must exist in its month (no 2023-02-30 rolling over).
    if !(0..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || !(1..=days_in_month(y, mo)).contains(&da)
        || !(0..=23).contains(&h)
        || !(0..=59).contains(&mi)
        || !(0..=60).contains(&se)
    {
        return Err(bad());
    }
    let frac_ns = if frac.is_empty() {
        0
    } else {
        num(frac)? * 10i64.pow(9 - frac.len() as u32)
    };
    let secs = days_from_civil(y, mo, da) * 86_400 + h * 3600 + mi * 60 + se - offset_s;
    Ok(i128::from(secs) * 1_000_000_000 + i128::from(frac_ns))
}

/// Plain seconds (`12`, `0.009930`) as nanoseconds.
fn parse_seconds(s: &str) -> Result<i128, TimestampError> {
    let bad = || TimestampError::NotSeconds(s.to_owned());
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if (int.is_empty() && frac.is_empty()) || frac.contains('.') {
        return Err(bad());
    }
    let secs: i128 = if int.is_empty() {
        0
    } else {
        int.parse().map_err(|_| bad())?
    };
    let digits = &frac[..frac.len().min(9)];
    let frac_ns: i128 = if digits.is_empty() {
        0
    } else {
        digits.parse::<i128>().map_err(|_| bad())? * 10i128.pow(9 - digits.len() as u32)
    };
    secs.checked_mul(1_000_000_000)
        .and_then(|n| n.checked_add(frac_ns))
        .ok_or_else(bad)
}

/// Splits a zone suffix off a time of day: `(time, offset east of UTC in
/// seconds)`; `None` for a malformed suffix.
fn split_zone(time: &str) -> Option<(&str, i64)> {
    if let Some(t) = time.strip_suffix(['Z', 'z']) {
        return Some((t, 0));
    }
    let Some(i) = time.find(['+', '-']) else {
        return Some((time, 0));
    };
    let (t, zone) = time.split_at(i);
    let sign = if zone.starts_with('-') { -1 } else { 1 };
    let digits: String = zone[1..].chars().filter(|&c| c != ':').collect();
    if !(digits.len() == 2 || digits.len() == 4) || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let h: i64 = digits[..2].parse().ok()?;
    let m: i64 = if digits.len() == 4 {
        digits[2..].parse().ok()?
    } else {
        0
    };
    if h > 23 || m > 59 {
        return None;
    }
    Some((t, sign * (h * 3600 + m * 60)))
}

/// Days in month `m` (1..=12) of year `y` (proleptic Gregorian).
fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_slice_has_its_rows_and_relative_arrivals() {
        let t = embedded();
        assert_eq!(t.requests.len(), 1500);
        assert_eq!(t.requests[0].arrival, Duration::ZERO);
        assert_eq!(t.requests[0].prompt_tokens, 374);
        assert_eq!(t.requests[0].output_tokens, 44);
        // 18:15:50.9951690 - 18:15:46.6805900
        assert_eq!(t.requests[1].arrival, Duration::from_nanos(4_314_579_000));
    }

    #[test]
    fn timestamps_are_civil_utc() {
        assert_eq!(parse_timestamp("1970-01-01 00:00:00").unwrap(), 0);
        assert_eq!(
            parse_timestamp("2000-03-01 00:00:01.5").unwrap(),
            (951_868_800i128 + 1) * 1_000_000_000 + 500_000_000
        );
        assert!(parse_timestamp("2023-13-01 00:00:00").is_err());
        assert_eq!(
            parse_timestamp("1970-01-01 01:00:00+01:00").unwrap(),
            parse_timestamp("1970-01-01 00:00:00Z").unwrap()
        );
        assert_eq!(
            parse_timestamp("1970-01-01 00:00:00-0130").unwrap(),
            5_400_000_000_000
        );
        assert_eq!(parse_timestamp("2.5").unwrap(), 2_500_000_000);
        assert!(parse_timestamp("1970-01-01 00:00:00+1").is_err());
        assert!(parse_timestamp(".").is_err());
        assert!(parse_timestamp("yesterday").is_err());
    }

    #[test]
    fn scaling_divides_rounds_up_and_clamps() {
        let r = TraceRequest {
            arrival: Duration::from_secs(10),
            prompt_tokens: 100,
            output_tokens: 3,
        };
        let s = Scaling {
            time_scale: 4.0,
            prompt_div: 32,
            output_div: 8,
            max_prompt: 3,
            max_output: 100,
        };
        let o = s.apply(&r);
        assert_eq!(o.arrival, Duration::from_millis(2500));
        assert_eq!(o.prompt_tokens, 3); // ceil(100/32)=4, clamped to 3
        assert_eq!(o.output_tokens, 1); // ceil(3/8)
        assert_eq!(Scaling::IDENTITY.apply(&r), r);
    }

    /// `apply` never panics: an arrival the speed-up cannot map to a
    /// `Duration` (a tiny, zero, negative or NaN `time_scale`) saturates at
    /// the latest arrival a trace can hold (`u64::MAX` ns). Before the fix
    /// `Duration::div_f64` panicked.
    #[test]
    fn scaling_saturates_instead_of_panicking() {
        let r = TraceRequest {
            arrival: Duration::from_secs(10),
            prompt_tokens: 1,
            output_tokens: 1,
        };
        for time_scale in [1e-300, 0.0, -1.0, f64::NAN] {
            let s = Scaling {
                time_scale,
                ..Scaling::IDENTITY
            };
            assert_eq!(s.apply(&r).arrival, MAX_ARRIVAL, "{time_scale}");
        }
        let s = Scaling {
            time_scale: f64::INFINITY,
            ..Scaling::IDENTITY
        };
        assert_eq!(s.apply(&r).arrival, Duration::ZERO);
    }
}
