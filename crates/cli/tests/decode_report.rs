//! The `xtc decode` report as data: every field of a real JSON report and of
//! a `--requests-out` record is documented in `docs/decode-report.md` and
//! every documented field is in a real one; the configuration says what
//! produced the run; the per-request records agree with the report; SLO
//! attainment and goodput follow their definitions.

use std::collections::BTreeSet;
use std::path::Path;

use serde_json::Value;

#[path = "../../model/tests/model_support/mod.rs"]
mod model_support;

fn xtc(args: &[&str]) -> (i32, String) {
    let mut out = Vec::new();
    let argv = ["xtc", "decode"].iter().chain(args).copied();
    let code = xtc_cli::run(argv, &mut out);
    (code, String::from_utf8(out).unwrap())
}

/// Fast flags: the toy model, a burst of arrivals.
const FAST: [&str; 4] = ["--device", "toy", "--time-scale", "10000"];

/// The field paths of one `## heading` section's table in the schema page:
/// `a.b`, `a[].c`; `latency.*.x` expands to each latency; `a`, `b` cells
/// list several.
fn documented(section: &str) -> BTreeSet<String> {
    let page = std::fs::read_to_string(
        Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")).join("docs/decode-report.md"),
    )
    .unwrap();
    let start = page
        .find(&format!("\n## {section}"))
        .unwrap_or_else(|| panic!("no section {section}"));
    let body = &page[start + 4..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let mut out = BTreeSet::new();
    for line in body.lines().filter(|l| l.starts_with("| `")) {
        let cell = line.split('|').nth(1).unwrap();
        for name in cell.split(',').map(|c| c.trim().trim_matches('`')) {
            if let Some(rest) = name.strip_prefix("latency.*.") {
                for l in ["queue", "ttft", "tpot", "itl", "e2e"] {
                    out.insert(format!("latency.{l}.{rest}"));
                }
            } else {
                out.insert(name.to_string());
            }
        }
    }
    out
}

/// Every path in `v`: objects give `a`, `a.b`; arrays give `a[]` and their
/// first element's fields as `a[].c`.
fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                paths(x, &p, out);
            }
        }
        Value::Array(a) => {
            if let Some(first) = a.first() {
                paths(first, &format!("{prefix}[]"), out);
            }
        }
        _ => {}
    }
}

fn assert_same(doc: &BTreeSet<String>, real: &BTreeSet<String>, what: &str) {
    let undocumented: Vec<_> = real.difference(doc).collect();
    let missing: Vec<_> = doc.difference(real).collect();
    assert!(
        undocumented.is_empty() && missing.is_empty(),
        "{what}: undocumented fields {undocumented:?}; documented but absent {missing:?}"
    );
}

/// A run with rejections and an SLO, so every optional part is present.
fn full_run(extra: &[&str]) -> (i32, Value) {
    let (code, out) = xtc(&[
        &FAST[..],
        &[
            "--requests",
            "40",
            "--kv-blocks",
            "30",
            "--block-size",
            "1",
            "--slo-ttft",
            "1000",
            "--slo-tpot",
            "100",
            "--json",
        ],
        extra,
    ]
    .concat());
    (code, serde_json::from_str(&out).unwrap())
}

#[test]
fn every_report_field_is_documented_and_every_documented_field_is_reported() {
    let (code, v) = full_run(&[]);
    assert_eq!(code, 3, "some requests are rejected");
    let mut real = BTreeSet::new();
    paths(&v, "", &mut real);
    // Sample completions come from the real model only (the synthetic model
    // has no text): a short real-model run supplies `samples[]`.
    let mut doc = documented("Report");
    if model_support::model_path().is_some() {
        let (code, out) = xtc(&[
            "--device",
            "cpu",
            "--requests",
            "2",
            "--time-scale",
            "100000",
            "--json",
        ]);
        assert_eq!(code, 0, "{out}");
        let m: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["samples"],
            Value::Array(vec![]),
            "the synthetic model has no text"
        );
        assert!(!m["samples"].as_array().unwrap().is_empty(), "{m}");
        let mut with_samples = BTreeSet::new();
        paths(&m, "", &mut with_samples);
        real.extend(
            with_samples
                .into_iter()
                .filter(|p| p.starts_with("samples")),
        );
    } else {
        doc.retain(|p| !p.starts_with("samples["));
    }
    assert_same(&doc, &real, "report");
    // The comparison's own fields, around three reports.
    let (_, out) = xtc(&[&FAST[..], &["--requests", "5", "--compare", "--json"]].concat());
    let c: Value = serde_json::from_str(&out).unwrap();
    let top: BTreeSet<String> = c.as_object().unwrap().keys().cloned().collect();
    let doc: BTreeSet<String> = documented("Comparison").into_iter().collect();
    assert_same(&doc, &top, "comparison");
    assert_eq!(c["continuous"]["schema_version"], 1);
}

#[test]
fn the_report_says_what_produced_it() {
    let (_, v) = full_run(&["--seed", "7", "--cancel-rate", "0"]);
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["xtc_version"], env!("CARGO_PKG_VERSION"));
    let c = &v["config"];
    assert_eq!(c["requests"], 40);
    assert_eq!(
        (&c["trace"]["row_start"], &c["trace"]["row_end"]),
        (&0.into(), &40.into())
    );
    assert_eq!(c["trace"]["rows"], 1500);
    assert!(c["trace"]["path"].is_null(), "the embedded slice");
    assert_eq!(c["time_scale"], 10000.0);
    assert_eq!(c["length_scaling"]["prompt_div"], 32);
    assert_eq!(c["length_scaling"]["max_output_tokens"], 128);
    assert_eq!(c["seed"], 7);
    assert_eq!(c["kv_cache"]["blocks"], 30);
    assert_eq!(c["kv_cache"]["block_size_tokens"], 1);
    assert_eq!(c["token_budget_tokens"], 64);
    assert_eq!(c["max_active"], 32);
    assert_eq!(c["device"]["kind"], "none");
    assert_eq!(c["device"]["selector"], "toy");
    assert_eq!(c["slo"]["ttft_ms"], 1000.0);
    // The CPU reference runs the synthetic model: its shape and size.
    let (code, out) = xtc(&[
        "--synthetic",
        "--device",
        "cpu",
        "--time-scale",
        "10000",
        "--requests",
        "2",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let m = &v["config"]["model"];
    assert_eq!(
        (&m["dim"], &m["n_layers"], &m["n_kv_heads"]),
        (&64.into(), &4.into(), &2.into())
    );
    let params = m["parameters"].as_u64().unwrap();
    assert!(params > 100_000, "{m}");
    assert_eq!(m["weight_bytes"].as_u64().unwrap(), 4 * params);
    assert_eq!(v["config"]["device"]["kind"], "cpu");
    assert!(v["config"]["kv_cache"]["bytes"].as_u64().unwrap() > 0);
}

#[test]
fn requests_out_writes_one_documented_record_per_request() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("requests.jsonl");
    let (code, v) = full_run(&["--requests-out", p.to_str().unwrap()]);
    assert_eq!(code, 3);
    let text = std::fs::read_to_string(&p).unwrap();
    let recs: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(recs.len(), 40);
    let ids: Vec<u64> = recs.iter().map(|r| r["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, (0..40).collect::<Vec<_>>());
    let doc = documented("Request record");
    for r in &recs {
        let real: BTreeSet<String> = r.as_object().unwrap().keys().cloned().collect();
        assert_same(&doc, &real, "request record");
    }
    let count = |o: &str| recs.iter().filter(|r| r["outcome"] == o).count() as u64;
    assert_eq!(count("done"), v["requests"]["completed"].as_u64().unwrap());
    assert_eq!(
        count("rejected"),
        v["requests"]["rejected"].as_u64().unwrap()
    );
    let good = recs.iter().filter(|r| r["slo_met"] == true).count() as u64;
    assert_eq!(good, v["slo"]["good_requests"].as_u64().unwrap());
    for r in recs.iter().filter(|r| r["outcome"] == "done") {
        let s = |k: &str| r[k].as_f64().unwrap();
        assert!(s("arrival_s") <= s("admitted_s") && s("admitted_s") <= s("first_token_s"));
        assert!(s("first_token_s") <= s("last_token_s") && s("last_token_s") <= s("finish_s"));
        let ttft = (s("first_token_s") - s("arrival_s")) * 1e3;
        assert!((ttft - s("ttft_ms")).abs() < 1e-6, "{r}");
        let n = r["output_tokens"].as_f64().unwrap();
        if n >= 2.0 {
            let tpot = (s("e2e_ms") - s("ttft_ms")) / (n - 1.0);
            assert!((tpot - s("tpot_ms")).abs() < 1e-6, "{r}");
        }
        assert_eq!(r["output_tokens"], r["max_output_tokens"]);
    }
    for r in recs.iter().filter(|r| r["outcome"] == "rejected") {
        assert!(r["reason"].as_str().unwrap().contains("KV blocks"), "{r}");
        assert_eq!(r["slo_met"], false);
    }
}

#[test]
fn slo_attainment_and_goodput_follow_their_definitions() {
    let run = |ttft: &str, tpot: &str| {
        let (code, out) = xtc(&[
            &FAST[..],
            &[
                "--requests",
                "30",
                "--slo-ttft",
                ttft,
                "--slo-tpot",
                tpot,
                "--json",
            ],
        ]
        .concat());
        assert_eq!(code, 0);
        serde_json::from_str::<Value>(&out).unwrap()
    };
    // Every request meets an SLO of a day; none meets one of a nanosecond.
    let v = run("86400000", "86400000");
    let slo = &v["slo"];
    assert_eq!(
        (&slo["good_requests"], &slo["eligible_requests"]),
        (&30.into(), &30.into())
    );
    assert_eq!(slo["attainment"], 1.0);
    let goodput = slo["goodput_requests_per_s"].as_f64().unwrap();
    let rate = v["throughput"]["requests_per_s"].as_f64().unwrap();
    assert!((goodput - rate).abs() <= 1e-9 * rate, "{goodput} vs {rate}");
    let v = run("0.000001", "86400000");
    assert_eq!(v["slo"]["good_requests"], 0);
    assert_eq!(v["slo"]["attainment"], 0.0);
    // Without an SLO there is no SLO section.
    let (_, out) = xtc(&[&FAST[..], &["--requests", "3", "--json"]].concat());
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["slo"].is_null() && v["config"]["slo"]["ttft_ms"].is_null());
    // A bound must be a positive number of milliseconds (usage: 2).
    for bad in ["0", "-5", "inf", "soon"] {
        assert_eq!(xtc(&["--device", "toy", "--slo-ttft", bad]).0, 2, "{bad}");
    }
}

#[test]
fn the_banner_states_the_scaling_and_the_model_size() {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args([
            "decode",
            "--synthetic",
            "--device",
            "cpu",
            "--time-scale",
            "10000",
            "--requests",
            "2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8(o.stderr).unwrap();
    assert!(
        err.contains("prompts /32 (at most 128 tokens), outputs /4"),
        "{err}"
    );
    assert!(
        err.contains("k parameters, 1.0 MiB of weights") && err.contains("4 layers, dim 64"),
        "{err}"
    );
    // The host, so a figure says on what CPU and under what load.
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert!(
        err.contains(&format!(" ({cpus} logical CPUs), load average ")),
        "{err}"
    );
}

#[test]
fn every_sweep_field_is_documented_and_every_documented_field_is_reported() {
    let (code, out) = xtc(&[
        "--device",
        "toy",
        "--toy-cost",
        "0,0",
        "--requests",
        "4",
        "--sweep",
        "8000",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut real = BTreeSet::new();
    paths(&v, "", &mut real);
    // The configuration is the report's (checked there).
    real.retain(|p| !p.starts_with("config."));
    assert_same(&documented("Sweep"), &real, "sweep");
}
