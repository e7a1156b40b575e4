//! `xtc serve` driven by the official `openai` Python client (`max_retries =
//! 0`): completions and chat, whole and streamed with usage, token-id
//! prompts, seeded sampling, errors raising the client's exception types;
//! and `xtc tokenizer export` checked with the `tokenizers` package against
//! the server's `/tokenize` on 100 strings (data/serve_openai_client.py).
//!
//! Needs the model (scripts/fetch-model.sh) and the client environment
//! (scripts/serve-venv.sh, run by .ci/ensure-deps.sh): without them the test
//! skips, except when `CI` is set, where it fails.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn venv_python() -> Option<PathBuf> {
    let venv = std::env::var_os("XTC_SERVE_VENV")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
            Some(cache.join("xtc/venv-serve"))
        })?;
    let py = venv.join("bin/python");
    py.is_file().then_some(py)
}

#[test]
fn the_openai_client_and_the_exported_tokenizer_agree_with_the_server() {
    let ci = std::env::var_os("CI").is_some();
    if let Err(e) = xtc_model::find_model(None) {
        assert!(!ci, "CI must have the model: {e}");
        eprintln!("skipped: no model ({e})");
        return;
    }
    let Some(py) = venv_python() else {
        assert!(
            !ci,
            "CI must have the client environment: run scripts/serve-venv.sh"
        );
        eprintln!("skipped: no client environment (scripts/serve-venv.sh)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let st = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args(["tokenizer", "export"])
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(st.success());
    let mut child = Command::new(env!("CARGO_BIN_EXE_xtc"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--device",
            "cpu",
        ])
        .args(["--context", "512", "--max-active", "4"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let url = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "xtc serve exited");
        if let Some(a) = line.trim().strip_prefix("xtc serve: listening on ") {
            break a.to_string();
        }
    };
    // Wait for /health (the client would get 503 while the model loads).
    let addr: std::net::SocketAddr = url.trim_start_matches("http://").parse().unwrap();
    let t0 = Instant::now();
    loop {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .unwrap();
        let mut r = String::new();
        let _ = s.read_to_string(&mut r);
        if r.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let res = Command::new(py)
        .arg(format!("{root}/../../data/serve_openai_client.py"))
        .arg(&url)
        .arg(dir.path())
        .arg(format!("{root}/../../data/pride_and_prejudice_ch1-12.txt"))
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let text =
        String::from_utf8_lossy(&res.stdout).to_string() + &String::from_utf8_lossy(&res.stderr);
    assert!(res.status.success(), "{text}");
    assert!(text.contains("ok: openai client conformance"), "{text}");
}
