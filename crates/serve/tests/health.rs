//! `GET /health` while the model loads, deterministically: the server runs
//! in this process through `xtc_serve::run` with a `build` closure (the
//! model's load on the engine thread) that holds until the test has seen
//! the loading answers (503 with `Retry-After` for `/health` and for a
//! completion), then loads the real model; `/health` turns 200 and a
//! completion is answered. (503 while draining is tested through the
//! binary: `crates/cli/tests/serve_http_load.rs`.) Needs the GGUF model
//! (scripts/fetch-model.sh); with `CI` set a missing one fails.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use xtc_model::KvGeometry;
use xtc_model::cpu::llama::Llama;
use xtc_model::find_model;
use xtc_model::text::bpe::Bpe;
use xtc_serve::backend::Backend;
use xtc_serve::engine::EngineOpts;
use xtc_serve::http::HttpOpts;
use xtc_serve::{ServeConfig, run};

/// One HTTP/1.1 exchange (`connection: close`): status, head, body.
fn exchange(addr: SocketAddr, method: &str, path: &str, body: &str) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    (status, head.to_ascii_lowercase(), rest.to_string())
}

#[test]
fn health_answers_503_while_the_model_loads_then_200() {
    let path = match find_model(None) {
        Ok(p) => p,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must have the model: {e}"
            );
            eprintln!("skipped: no model ({e}); run scripts/fetch-model.sh");
            return;
        }
    };
    let model = Arc::new(Llama::load(&path).unwrap());
    let tok = Arc::new(Bpe::from_gguf(model.gguf()).unwrap());
    let kv = KvGeometry {
        block_size: 16,
        n_blocks: 64,
    };
    let cfg = ServeConfig {
        addr: "127.0.0.1:0".parse().unwrap(),
        workers: 1,
        model_name: "m".into(),
        aliases: Vec::new(),
        http: HttpOpts {
            default_max_tokens: 4,
            max_body: 1 << 16,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            keepalive: Duration::from_secs(1),
            max_connections: 64,
        },
        engine: EngineOpts {
            max_active: 2,
            max_queued: 8,
            kv_blocks: kv.n_blocks,
            block_size: kv.block_size,
            token_budget: 64,
            context: 256,
            stream_buffer: 64,
        },
    };
    let (addr_tx, addr_rx) = mpsc::channel();
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (loading_tx, loading_rx) = mpsc::channel::<()>();
    // The server runs until the process ends (no signal is sent: this test
    // binary holds no other test).
    std::thread::spawn(move || {
        let build = move || {
            let _ = loading_tx.send(());
            // Held until the test has seen the loading answers.
            let _ = go_rx.recv();
            Ok(Backend::cpu(model, kv, "m.gguf"))
        };
        let r = run(cfg, tok, build, move |a| {
            let _ = addr_tx.send(a);
        });
        panic!("the server stopped: {r:?}");
    });
    let addr: SocketAddr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    loading_rx.recv_timeout(Duration::from_secs(60)).unwrap();
    // Loading: 503 with Retry-After, for /health and for work.
    let (status, head, body) = exchange(addr, "GET", "/health", "");
    assert_eq!(status, 503, "{body}");
    assert!(head.contains("\r\nretry-after: "), "{head}");
    assert!(body.contains("the model is loading"), "{body}");
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 2}"#,
    );
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("\"unavailable_error\""), "{body}");
    // Loaded: 200, and work is answered.
    go_tx.send(()).unwrap();
    let t0 = Instant::now();
    loop {
        let (status, _, body) = exchange(addr, "GET", "/health", "");
        if status == 200 {
            assert_eq!(body, r#"{"status":"ok"}"#);
            break;
        }
        assert_eq!(status, 503, "{body}");
        assert!(t0.elapsed() < Duration::from_secs(60), "never ready");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _, body) = exchange(
        addr,
        "POST",
        "/v1/completions",
        r#"{"prompt": "Hi", "max_tokens": 2}"#,
    );
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"completion_tokens\":2"), "{body}");
}
