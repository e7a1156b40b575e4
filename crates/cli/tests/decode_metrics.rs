//! `xtc decode --metrics-out` and `--metrics-addr`: the Prometheus metrics
//! (OpenMetrics text) parsed by a real parser (`openmetrics-parser`), their
//! names, types and buckets as vLLM's, their values against the JSON report
//! of the same run, and `/metrics` scraped with a real HTTP client (`ureq`)
//! while a run is in progress.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use openmetrics_parser::{MetricsExposition, OpenMetricsType, OpenMetricsValue};
use serde_json::Value;

type Exposition = MetricsExposition<OpenMetricsType, OpenMetricsValue>;

fn parse(text: &str) -> Exposition {
    openmetrics_parser::openmetrics::parse_openmetrics(text)
        .unwrap_or_else(|e| panic!("not valid OpenMetrics text: {e:?}\n{text}"))
}

/// The value of the sample of `name` with `labels` (label values in the
/// family's label order): a gauge or counter's number, a histogram's count.
fn value(x: &Exposition, name: &str, labels: &[&str]) -> f64 {
    let f = x
        .families
        .get(name)
        .unwrap_or_else(|| panic!("no family {name}"));
    let labels: Vec<String> = labels.iter().map(|s| s.to_string()).collect();
    let s = f
        .get_sample_by_label_values(&labels)
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"));
    match &s.value {
        OpenMetricsValue::Gauge(n) | OpenMetricsValue::Unknown(n) => n.as_f64(),
        OpenMetricsValue::Counter(c) => c.value.as_f64(),
        OpenMetricsValue::Histogram(h) => h.count.unwrap() as f64,
        other => panic!("{name}: {other:?}"),
    }
}

/// A histogram's bucket bounds (without `+Inf`).
fn buckets(x: &Exposition, name: &str) -> Vec<f64> {
    let f = &x.families[name];
    let s = f.iter_samples().next().unwrap();
    let OpenMetricsValue::Histogram(h) = &s.value else {
        panic!("{name} is no histogram")
    };
    h.buckets
        .iter()
        .map(|b| b.upper_bound)
        .filter(|b| b.is_finite())
        .collect()
}

fn xtc(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let argv = ["xtc", "decode"].iter().chain(args).copied();
    let code = xtc_cli::run(argv, &mut out);
    (code, String::from_utf8(out).unwrap())
}

#[test]
fn metrics_out_is_openmetrics_with_vllm_names_and_agrees_with_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("metrics.txt");
    let (code, out) = xtc(&[
        "--device",
        "toy",
        "--time-scale",
        "10000",
        "--requests",
        "40",
        "--kv-blocks",
        "30",
        "--block-size",
        "1",
        "--json",
        "--metrics-out",
        p.to_str().unwrap(),
    ]);
    assert_eq!(code, 3, "some requests are rejected");
    let r: Value = serde_json::from_str(&out).unwrap();
    let text = std::fs::read_to_string(&p).unwrap();
    let x = parse(&text);
    use OpenMetricsType::{Counter, Gauge, Histogram};
    for (name, ty) in [
        ("xtc:num_requests_running", Gauge),
        ("xtc:num_requests_waiting", Gauge),
        ("xtc:kv_cache_usage_perc", Gauge),
        ("xtc:prompt_tokens", Counter),
        ("xtc:generation_tokens", Counter),
        ("xtc:request_success", Counter),
        ("xtc:request_rejected", Counter),
        ("xtc:iteration_tokens_total", Histogram),
        ("xtc:time_to_first_token_seconds", Histogram),
        ("xtc:inter_token_latency_seconds", Histogram),
        ("xtc:request_time_per_output_token_seconds", Histogram),
        ("xtc:e2e_request_latency_seconds", Histogram),
        ("xtc:request_queue_time_seconds", Histogram),
        ("xtc:batch_queued", Gauge),
        ("xtc:batch_ready", Gauge),
        ("xtc:batch_blocked", Gauge),
        ("xtc:batch_reserved_units", Gauge),
        ("xtc:batch_iterations", Counter),
        ("xtc:batch_completed", Counter),
        ("xtc:batch_cancelled", Counter),
        ("xtc:batch_failed", Counter),
        ("xtc:batch_rejections", Counter),
        ("xtc:batch_mean_ready_vector", Gauge),
        ("xtc:batch_offloads", Counter),
        ("xtc:batch_offload_timeouts", Counter),
        ("xtc:batch_offload_errors", Counter),
        ("xtc:batch_mt_queued", Counter),
        ("xtc:batch_mt_rejections", Counter),
    ] {
        let f = x.families.get(name).unwrap_or_else(|| panic!("no {name}"));
        assert_eq!(f.family_type, ty, "{name}");
    }
    // vLLM's buckets.
    assert_eq!(
        buckets(&x, "xtc:time_to_first_token_seconds")[..4],
        [0.001, 0.005, 0.01, 0.02]
    );
    assert_eq!(buckets(&x, "xtc:inter_token_latency_seconds").len(), 19);
    assert_eq!(
        buckets(&x, "xtc:iteration_tokens_total"),
        [
            1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0,
            16384.0
        ]
    );
    // The same run as the report.
    let n = |v: &Value| v.as_u64().unwrap() as f64;
    let completed = n(&r["requests"]["completed"]);
    assert_eq!(
        value(&x, "xtc:prompt_tokens", &[]),
        n(&r["tokens"]["prompt"])
    );
    assert_eq!(
        value(&x, "xtc:generation_tokens", &[]),
        n(&r["tokens"]["generated"])
    );
    assert_eq!(value(&x, "xtc:request_success", &["length"]), completed);
    assert_eq!(
        value(&x, "xtc:request_rejected", &["kv-blocks"]),
        n(&r["requests"]["rejected_by_reason"]["kv-blocks"])
    );
    assert_eq!(value(&x, "xtc:request_rejected", &["seq-len"]), 0.0);
    for h in [
        "xtc:time_to_first_token_seconds",
        "xtc:e2e_request_latency_seconds",
        "xtc:request_queue_time_seconds",
    ] {
        assert_eq!(value(&x, h, &[]), completed, "{h}");
    }
    assert_eq!(
        value(&x, "xtc:request_time_per_output_token_seconds", &[]),
        n(&r["latency"]["tpot"]["count"])
    );
    assert_eq!(
        value(&x, "xtc:inter_token_latency_seconds", &[]),
        n(&r["latency"]["itl"]["count"])
    );
    let iterations = n(&r["iterations"]["count"]);
    assert_eq!(value(&x, "xtc:iteration_tokens_total", &[]), iterations);
    assert_eq!(value(&x, "xtc:batch_iterations", &[]), iterations);
    assert_eq!(value(&x, "xtc:batch_offloads", &[]), iterations);
    assert_eq!(value(&x, "xtc:batch_completed", &[]), completed);
    let mean = value(&x, "xtc:batch_mean_ready_vector", &[]);
    let want = r["iterations"]["mean_ready_members"].as_f64().unwrap();
    assert!((mean - want).abs() < 1e-9, "{mean} vs {want}");
    // After the last completion nothing runs, waits or holds the cache.
    for g in [
        "xtc:num_requests_running",
        "xtc:num_requests_waiting",
        "xtc:kv_cache_usage_perc",
        "xtc:batch_reserved_units",
    ] {
        assert_eq!(value(&x, g, &[]), 0.0, "{g}");
    }
}

/// A trace of `n` requests `gap_s` seconds apart.
fn spaced_trace(dir: &std::path::Path, n: usize, gap_s: u64) -> std::path::PathBuf {
    let p = dir.join("spaced.csv");
    let mut s = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..n {
        s += &format!("{},64,40\n", i as u64 * gap_s);
    }
    std::fs::write(&p, s).unwrap();
    p
}

#[test]
fn metrics_addr_serves_metrics_while_the_run_lasts() {
    let dir = tempfile::tempdir().unwrap();
    // Eight requests 1 s apart: the run lasts about 7 s of replay.
    let t = spaced_trace(dir.path(), 8, 1);
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["decode", "--device", "toy", "--time-scale", "1", "--trace"])
        .arg(&t)
        .args(["--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut url = None;
    let mut line = String::new();
    while err.read_line(&mut line).unwrap() > 0 {
        if let Some(rest) = line.split("serving metrics on ").nth(1) {
            url = Some(rest.split_whitespace().next().unwrap().to_string());
            break;
        }
        line.clear();
    }
    let url = url.expect("the command prints where it serves the metrics");
    // Scrape until a scrape shows the run under way (the first request is
    // decoded at once; later ones arrive a second apart).
    let mut seen = None;
    let t0 = std::time::Instant::now();
    while t0.elapsed() < std::time::Duration::from_secs(60) {
        let mut resp = ureq::get(&url)
            .call()
            .expect("the server answers during the run");
        let ct = resp
            .headers()
            .get("content-type")
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
        let body = resp.body_mut().read_to_string().unwrap();
        let x = parse(&body);
        if value(&x, "xtc:batch_iterations", &[]) > 0.0 {
            seen = Some(x);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let x = seen.expect("a scrape during the run saw iterations");
    assert!(value(&x, "xtc:generation_tokens", &[]) > 0.0);
    assert!(value(&x, "xtc:time_to_first_token_seconds", &[]) >= 1.0);
    // Only /metrics is served.
    let other = url.replace("/metrics", "/other");
    match ureq::get(&other).call() {
        Err(ureq::Error::StatusCode(404)) => {}
        r => panic!("{other}: {r:?}"),
    }
    let status = child.wait().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(status.success(), "{rest}");
    // The run is over: so is the server.
    assert!(
        ureq::get(&url).call().is_err(),
        "still serving after the run"
    );
}

/// Regression: a scrape before the first run used to get a bare `# EOF`,
/// which the parser rejects (a clean-clone CI run scraped during the model
/// load and failed). The server now shows the run's families at zero.
#[test]
fn a_scrape_before_the_first_run_sees_the_families_at_zero() {
    use xtc_cli::metrics_server::MetricsServer;
    use xtc_kvbatch::metrics::DecodeMetrics;
    let initial = DecodeMetrics::new(64).registry();
    let server = MetricsServer::start("127.0.0.1:0".parse().unwrap(), initial).unwrap();
    let url = format!("http://{}/metrics", server.addr());
    let body = ureq::get(&url)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let x = parse(&body);
    assert_eq!(value(&x, "xtc:batch_iterations", &[]), 0.0);
    assert_eq!(value(&x, "xtc:generation_tokens", &[]), 0.0);
    assert_eq!(value(&x, "xtc:time_to_first_token_seconds", &[]), 0.0);
    // A run's registry replaces it.
    let run = DecodeMetrics::new(64);
    server.show(run.registry());
    let again = ureq::get(&url)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    parse(&again);
    server.stop();
}

#[test]
fn a_bad_metrics_addr_is_a_usage_error_and_a_taken_one_fails_before_the_run() {
    assert_eq!(xtc(&["--device", "toy", "--metrics-addr", "nowhere"]).0, 2);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let o = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args([
            "decode",
            "--device",
            "toy",
            "--requests",
            "3",
            "--metrics-addr",
            &addr,
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--metrics-addr") && err.contains("cannot listen"),
        "{err}"
    );
}
