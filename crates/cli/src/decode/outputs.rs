//! What a run leaves besides its report: the metrics of each run and the
//! `/metrics` server ([`Observe`]), and the output files `--trace-out`,
//! `--requests-out` and `--metrics-out` (`Outputs`), checked before the run
//! and written after it.

use std::rc::Rc;

use xtc_kvbatch::metrics::{self, DecodeMetrics};
use xtc_replay::job::{RunOutput, Workload};
use xtc_replay::report::{chrome_trace, request_records};
use xtc_replay::run_config::RunConfig;

use super::args::DecodeArgs;
use crate::metrics_server::MetricsServer;
use crate::out_file::OutFile;

/// What watches the runs: the metrics of the run in progress (kept when
/// `--metrics-out` or `--metrics-addr` asks for them) and the `/metrics`
/// server.
pub struct Observe {
    keep: bool,
    max_len: usize,
    server: Option<MetricsServer>,
    /// The metrics of each run so far, in order.
    pub runs: Vec<Rc<DecodeMetrics>>,
}

impl Observe {
    /// Starts the `/metrics` server of `--metrics-addr` (its address on
    /// stderr); `max_len` bounds the token-count histograms.
    ///
    /// # Errors
    /// The address cannot be bound.
    pub fn start(args: &DecodeArgs, max_len: usize) -> Result<Self, String> {
        // Before the first run the server shows the families at zero.
        let server = args
            .metrics_addr
            .map(|a| MetricsServer::start(a, DecodeMetrics::new(max_len).registry()))
            .transpose()
            .map_err(|e| e.to_string())?;
        if let Some(s) = &server {
            eprintln!(
                "xtc decode: serving metrics on http://{}/metrics while the run lasts",
                s.addr()
            );
        }
        Ok(Observe {
            keep: args.metrics_out.is_some() || server.is_some(),
            max_len,
            server,
            runs: Vec::new(),
        })
    }

    /// Fresh metrics for the next run (served from now on), if kept.
    pub fn next_run(&mut self) -> Option<Rc<DecodeMetrics>> {
        if !self.keep {
            return None;
        }
        let m = Rc::new(DecodeMetrics::new(self.max_len));
        if let Some(s) = &self.server {
            s.show(m.registry());
        }
        self.runs.push(m.clone());
        Some(m)
    }

    /// Stops the server: the runs are over.
    pub fn finish(&mut self) {
        if let Some(s) = self.server.take() {
            s.stop();
        }
    }
}

/// The output files of a run (`--trace-out`, `--requests-out`,
/// `--metrics-out`), checked before the run and written after it.
pub(crate) struct Outputs {
    trace: Option<OutFile>,
    requests: Option<OutFile>,
    metrics: Option<OutFile>,
}

impl Outputs {
    pub(crate) fn prepare(args: &DecodeArgs) -> Result<Self, String> {
        let inputs = [
            ("--model", args.model.as_deref()),
            ("--trace", args.trace.as_deref()),
            ("--tokenizer", args.tokenizer.as_deref()),
        ];
        Ok(Outputs {
            trace: OutFile::prepare_opt("--trace-out", args.trace_out.as_deref(), &inputs)?,
            requests: OutFile::prepare_opt(
                "--requests-out",
                args.requests_out.as_deref(),
                &inputs,
            )?,
            metrics: OutFile::prepare_opt("--metrics-out", args.metrics_out.as_deref(), &inputs)?,
        })
    }

    /// Writes each output of `out`, whose metrics are `m` (after the report
    /// was printed).
    pub(crate) fn write(
        self,
        out: &RunOutput,
        wl: &Workload,
        config: &RunConfig,
        m: Option<&DecodeMetrics>,
    ) -> Result<(), String> {
        if let (Some(f), Some(m)) = (self.metrics, m) {
            f.write(metrics::encode(&m.registry()).as_bytes())?;
        }
        if let Some(t) = self.trace {
            let text = serde_json::to_vec(&chrome_trace(out, wl)).map_err(|e| e.to_string())?;
            t.write(&text)?;
        }
        if let Some(r) = self.requests {
            let mut text = Vec::new();
            for rec in request_records(out, wl, &config.slo) {
                serde_json::to_writer(&mut text, &rec).map_err(|e| e.to_string())?;
                text.push(b'\n');
            }
            r.write(&text)?;
        }
        Ok(())
    }
}
