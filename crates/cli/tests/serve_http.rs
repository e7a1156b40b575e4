//! `xtc serve` over HTTP on 127.0.0.1 and a random port, driven by a plain
//! HTTP/1.1 client (raw sockets, so bad bytes, silent connections and
//! disconnects mid-stream are real): completions and chat, JSON and SSE,
//! errors, cancellation on disconnect (KV blocks back, counted by phase in
//! /metrics), backpressure (429), greedy output alone vs batched, SIGTERM
//! drain.
//!
//! The tests need the GGUF model (scripts/fetch-model.sh): without it they
//! skip, except when `CI` is set, where they fail. Most servers run on the
//! CPU reference (it starts in a second; lavapipe uploads first); the
//! batched-greedy test runs on the default device (lavapipe in CI).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// Whether the model is installed; panics in CI when it is not.
fn have_model() -> bool {
    match xtc_decode::model::find_model(None) {
        Ok(_) => true,
        Err(e) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI must have the model (scripts/fetch-model.sh): {e}"
            );
            eprintln!("skipped: no model ({e}); run scripts/fetch-model.sh");
            false
        }
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    /// Starts `xtc serve --port 0 ARGS` and waits until /health is 200.
    fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_xtc"))
            .args(["serve", "--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("xtc serve starts");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let addr = loop {
            line.clear();
            assert!(
                out.read_line(&mut line).unwrap() > 0,
                "xtc serve exited early"
            );
            if let Some(rest) = line.trim().strip_prefix("xtc serve: listening on http://") {
                break rest.parse().unwrap();
            }
        };
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let s = Server { child, addr };
        let t0 = Instant::now();
        loop {
            if let Ok(r) = s.try_get("/health")
                && r.status == 200
            {
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(120),
                "the server never got ready"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    fn try_get(&self, path: &str) -> std::io::Result<Resp> {
        request(self.addr, "GET", path, b"")
    }

    fn get(&self, path: &str) -> Resp {
        self.try_get(path).unwrap()
    }

    fn post(&self, path: &str, body: &Value) -> Resp {
        request(self.addr, "POST", path, body.to_string().as_bytes()).unwrap()
    }

    fn post_raw(&self, path: &str, body: &[u8]) -> Resp {
        request(self.addr, "POST", path, body).unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        text.lines()
            .find_map(|l| {
                let (n, v) = l.rsplit_once(' ')?;
                (n == name).then(|| v.parse().unwrap())
            })
            .unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// Waits until `metric(name) == want` (panics after 5 s).
    fn wait_metric(&self, name: &str, want: f64) {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if v == want {
                return;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "{name} = {v}, want {want}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    fn wait_exit(&mut self, limit: Duration) -> i32 {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st.code().unwrap_or(-1);
            }
            assert!(t0.elapsed() < limit, "xtc serve did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug)]
struct Resp {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Resp {
    fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The OpenAI error body's fields, checking its shape.
    fn error(&self) -> (String, Option<String>, Option<String>) {
        let v = self.json();
        let e = &v["error"];
        assert!(e["message"].is_string() && e["type"].is_string(), "{v}");
        (
            e["type"].as_str().unwrap().to_string(),
            e["param"].as_str().map(str::to_string),
            e["code"].as_str().map(str::to_string),
        )
    }
}

fn send_head(s: &mut TcpStream, method: &str, path: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)
}

/// Reads a response head: status and headers.
fn read_head(r: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let l = line.trim_end();
        if l.is_empty() {
            return Ok((status, headers));
        }
        let (n, v) = l.split_once(':').unwrap();
        headers.push((n.trim().to_lowercase(), v.trim().to_string()));
    }
}

/// Reads one chunk of a chunked body (`None` at the last chunk).
fn read_chunk(r: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    let n = usize::from_str_radix(line.trim(), 16).map_err(std::io::Error::other)?;
    let mut buf = vec![0; n + 2];
    r.read_exact(&mut buf)?;
    buf.truncate(n);
    Ok((n > 0).then_some(buf))
}

fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> std::io::Result<Resp> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    send_head(&mut s, method, path, body)?;
    let mut r = BufReader::new(s);
    let (status, headers) = read_head(&mut r)?;
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let mut body = Vec::new();
    if chunked {
        while let Some(c) = read_chunk(&mut r)? {
            body.extend(c);
        }
    } else {
        r.read_to_end(&mut body)?;
    }
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// An SSE response read event by event.
struct Sse {
    r: BufReader<TcpStream>,
    status: u16,
    buf: String,
}

impl Sse {
    fn open(addr: SocketAddr, path: &str, body: &Value) -> Sse {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        send_head(&mut s, "POST", path, body.to_string().as_bytes()).unwrap();
        let mut r = BufReader::new(s);
        let (status, headers) = read_head(&mut r).unwrap();
        if status == 200 {
            assert!(
                headers
                    .iter()
                    .any(|(n, v)| n == "content-type" && v.starts_with("text/event-stream")),
                "{headers:?}"
            );
        }
        Sse {
            r,
            status,
            buf: String::new(),
        }
    }

    /// The next `data:` payload (comments skipped); `None` at the end.
    fn next(&mut self) -> Option<String> {
        loop {
            if let Some(i) = self.buf.find("\n\n") {
                let ev: String = self.buf.drain(..i + 2).collect();
                let data: Vec<&str> = ev
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect();
                if data.is_empty() {
                    continue; // a keep-alive comment
                }
                return Some(data.join("\n"));
            }
            let c = read_chunk(&mut self.r).ok()??;
            self.buf.push_str(std::str::from_utf8(&c).unwrap());
        }
    }

    /// Every payload up to the end.
    fn all(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// The server for read-only checks: the CPU reference, small sizes.
fn small_server() -> Server {
    Server::start(&[
        "--device",
        "cpu",
        "--context",
        "512",
        "--max-active",
        "4",
        "--default-max-tokens",
        "8",
        "--max-body",
        "65536",
    ])
}

/// The read-only checks share one server (one start, sequential checks).
#[test]
fn one_server_answers_openai_requests() {
    if !have_model() {
        return;
    }
    let s = small_server();
    completion_and_chat_answer_in_openai_shapes(&s);
    streams_end_with_usage_then_done(&s);
    stop_strings_end_the_answer_across_tokens(&s);
    sampling_is_seeded_and_min_tokens_holds_eos_back(&s);
    split_utf8_characters_are_held_back(&s);
    bad_input_gets_a_clear_400_and_the_server_keeps_serving(&s);
    assert_eq!(s.metric("xtc:kv_blocks_used"), 0.0, "nothing leaked");
    assert_eq!(s.metric("xtc:request_cancelled_total"), 0.0);
}

fn completion_and_chat_answer_in_openai_shapes(s: &Server) {
    let r = s.post(
        "/v1/completions",
        &json!({"model": "smollm2-135m-instruct", "prompt": "The capital of France is", "max_tokens": 6, "user": "u1"}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(text.contains("Paris"), "{text:?}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["total_tokens"], 11);
    let t = &v["xtc_timings"];
    assert!(t["ttft_ms"].as_f64().unwrap() > 0.0);
    assert!(t["e2e_ms"].as_f64().unwrap() >= t["ttft_ms"].as_f64().unwrap());
    assert!(r.header("x-ttft-ms").is_some() && r.header("x-queue-time-ms").is_some());

    // Token-id prompts give the same answer as the text they spell.
    let ids = s
        .post("/tokenize", &json!({"prompt": "The capital of France is"}))
        .json();
    assert_eq!(ids["count"], 5);
    assert_eq!(ids["max_model_len"], 512);
    let r2 = s.post(
        "/v1/completions",
        &json!({"prompt": ids["tokens"], "max_tokens": 6}),
    );
    assert_eq!(r2.json()["choices"][0]["text"], text);
    let d = s
        .post("/detokenize", &json!({"tokens": ids["tokens"]}))
        .json();
    assert_eq!(d["prompt"], "The capital of France is");

    // Chat: ChatML template, ends at <|im_end|> (finish_reason stop) with no
    // special token in the text; the default max_tokens (8 here) applies.
    let r = s.post(
        "/v1/chat/completions",
        &json!({"messages": [{"role": "system", "content": "You are a helpful assistant."},
                             {"role": "user", "content": [{"type": "text", "text": "What is the capital of France?"}]}],
                "max_tokens": 40}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    let msg = &v["choices"][0]["message"];
    assert_eq!(msg["role"], "assistant");
    let content = msg["content"].as_str().unwrap();
    assert!(
        content.contains("Paris") && !content.contains("<|"),
        "{content:?}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "Once upon a time", "ignore_eos": true}),
    );
    assert_eq!(
        r.json()["usage"]["completion_tokens"],
        8,
        "the documented default"
    );

    let m = s.get("/v1/models").json();
    assert_eq!(m["data"][0]["id"], "smollm2-135m-instruct");
    assert_eq!(s.get("/health").json()["status"], "ok");
}

fn streams_end_with_usage_then_done(s: &Server) {
    let body = json!({"prompt": "The capital of France is", "max_tokens": 6, "stream": true,
                      "stream_options": {"include_usage": true}});
    let ev = Sse::open(s.addr, "/v1/completions", &body).all();
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 6);
    let fin = &chunks[chunks.len() - 2];
    assert_eq!(fin["choices"][0]["finish_reason"], "length");
    assert!(fin["xtc_timings"]["ttft_ms"].as_f64().unwrap() > 0.0);
    let text: String = chunks[..chunks.len() - 1]
        .iter()
        .map(|c| c["choices"][0]["text"].as_str().unwrap())
        .collect();
    for c in &chunks[..chunks.len() - 1] {
        assert!(c["usage"].is_null(), "usage only in the last chunk: {c}");
    }
    let whole = s.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 6}),
    );
    assert_eq!(text, whole.json()["choices"][0]["text"], "streamed = whole");

    // Chat: the role first, no usage unless asked.
    let body =
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": true});
    let ev = Sse::open(s.addr, "/v1/chat/completions", &body).all();
    let first: Value = serde_json::from_str(&ev[0]).unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(ev.last().unwrap(), "[DONE]");
    assert!(ev.iter().all(|e| !e.contains("\"usage\"")), "{ev:?}");
}

fn stop_strings_end_the_answer_across_tokens(s: &Server) {
    let base = s.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 8, "ignore_eos": true}),
    );
    let text = base.json()["choices"][0]["text"]
        .as_str()
        .unwrap()
        .to_string();
    // A stop string made of the end of one token and the start of the next.
    let at = text.find("Paris").expect("greedy says Paris");
    let stop = &text[at + 2..at + 6]; // "ris." or so: spans token boundaries
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 8, "stop": [stop], "ignore_eos": true}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], text[..at + 2], "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["stop_reason"], stop);
    // The same through a stream: no byte of the stop string is sent.
    let body = json!({"prompt": "The capital of France is", "max_tokens": 8, "stop": stop,
                      "stream": true, "ignore_eos": true});
    let ev = Sse::open(s.addr, "/v1/completions", &body).all();
    let streamed: String = ev
        .iter()
        .filter(|e| *e != "[DONE]")
        .map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(streamed, text[..at + 2]);
}

fn sampling_is_seeded_and_min_tokens_holds_eos_back(s: &Server) {
    let body = json!({"prompt": "Once upon a time", "max_tokens": 12, "temperature": 1.0,
                      "top_p": 0.9, "top_k": 40, "min_p": 0.01, "seed": 7});
    let a = s.post("/v1/completions", &body).json();
    let b = s.post("/v1/completions", &body).json();
    assert_eq!(
        a["choices"][0]["text"], b["choices"][0]["text"],
        "same seed, same text"
    );
    // Chat answers end at <|im_end|> early; min_tokens forbids that.
    let body = json!({"messages": [{"role": "user", "content": "Say yes."}], "max_tokens": 30});
    let short = s.post("/v1/chat/completions", &body).json();
    let n = short["usage"]["completion_tokens"].as_u64().unwrap();
    assert!(n < 30, "{short}");
    let body = json!({"messages": [{"role": "user", "content": "Say yes."}],
                      "max_tokens": 30, "min_tokens": n + 5});
    let long = s.post("/v1/chat/completions", &body).json();
    assert!(
        long["usage"]["completion_tokens"].as_u64().unwrap() >= n + 5,
        "{long}"
    );
}

fn split_utf8_characters_are_held_back(s: &Server) {
    // An emoji is several byte tokens: no chunk may carry half of it.
    let ids = s.post("/tokenize", &json!({"prompt": "🦀🦀🦀"})).json();
    let toks = ids["tokens"].as_array().unwrap();
    assert!(toks.len() > 3, "the emoji split across tokens: {ids}");
    // The model answers crabs with crabs: each one arrives whole, in one
    // chunk, though its tokens came one by one (fewer text chunks than tokens).
    let body = json!({"prompt": "Crabs: 🦀🦀", "max_tokens": 12, "stream": true, "ignore_eos": true,
                      "stream_options": {"include_usage": true}});
    let ev = Sse::open(s.addr, "/v1/completions", &body).all();
    let mut pieces = Vec::new();
    let mut tokens = 0;
    for e in ev.iter().filter(|e| *e != "[DONE]") {
        let v: Value = serde_json::from_str(e).unwrap();
        if let Some(t) = v["choices"][0]["text"].as_str()
            && !t.is_empty()
        {
            pieces.push(t.to_string());
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = n;
        }
    }
    let text: String = pieces.concat();
    // (A character cut by max_tokens ends the text as U+FFFD, as vLLM's;
    // none may appear before the end.)
    let body_pieces = &pieces[..pieces.len() - 1];
    assert!(text.contains('🦀'), "{pieces:?}");
    assert!(
        body_pieces.iter().all(|p| !p.contains('\u{fffd}')),
        "{pieces:?}"
    );
    assert!(pieces.iter().any(|p| p == "🦀"), "{pieces:?}");
    assert!(
        pieces.len() < tokens as usize,
        "{pieces:?} from {tokens} tokens"
    );
    let d = s.post("/detokenize", &json!({"tokens": toks})).json();
    assert_eq!(d["prompt"], "🦀🦀🦀");
}

fn bad_input_gets_a_clear_400_and_the_server_keeps_serving(s: &Server) {
    let cases: Vec<(&[u8], &str, Option<&str>)> = vec![
        (b"{\"prompt\": ", "invalid_request_error", None),
        (b"[1, 2]", "invalid_request_error", None),
        (
            b"{\"prompt\": \"a\", \"max_tokens\": \"ten\"}",
            "invalid_request_error",
            Some("max_tokens"),
        ),
        (b"{\"prompt\": 5}", "invalid_request_error", Some("prompt")),
        (
            b"{\"prompt\": \"a\", \"stream\": \"yes\"}",
            "invalid_request_error",
            Some("stream"),
        ),
        (b"{\"prompt\": \"\xff\xfe\"}", "invalid_request_error", None),
        (
            b"{\"prompt\": [1, 99999999]}",
            "invalid_request_error",
            Some("prompt"),
        ),
        (
            b"{\"prompt\": [1, -1]}",
            "invalid_request_error",
            Some("prompt"),
        ),
        (b"{\"prompt\": \"a\", \"n\": 2}", "not_supported", Some("n")),
        (
            b"{\"prompt\": \"a\", \"logprobs\": 3}",
            "not_supported",
            Some("logprobs"),
        ),
        (
            b"{\"prompt\": \"a\", \"echo\": true}",
            "not_supported",
            Some("echo"),
        ),
        (
            b"{\"prompt\": \"a\", \"temperature\": -0.5}",
            "invalid_request_error",
            Some("temperature"),
        ),
        (
            b"{\"prompt\": \"a\", \"top_p\": 0}",
            "invalid_request_error",
            Some("top_p"),
        ),
        (
            b"{\"prompt\": \"a\", \"model\": 3}",
            "invalid_request_error",
            Some("model"),
        ),
        (
            b"{\"prompt\": [\"a\", \"b\"]}",
            "not_supported",
            Some("prompt"),
        ),
    ];
    for (body, kind, param) in cases {
        let r = s.post_raw("/v1/completions", body);
        assert_eq!(
            r.status,
            400,
            "{}: {}",
            String::from_utf8_lossy(body),
            r.text()
        );
        let (k, p, _) = r.error();
        assert_eq!((k.as_str(), p.as_deref()), (kind, param), "{}", r.text());
    }
    let chat_cases = [
        json!({"messages": "hi"}),
        json!({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "function"}]}),
        json!({"messages": [{"role": "user", "content": "a"}], "response_format": {"type": "json_object"}}),
        json!({"messages": [{"role": "wizard", "content": "a"}]}),
    ];
    for body in chat_cases {
        let r = s.post("/v1/chat/completions", &body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        r.error();
    }
    // Unknown fields are ignored.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 1, "frobnicate": {}}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Too long: refused before any work, as context_length_exceeded.
    for body in [
        json!({"prompt": "a", "max_tokens": 1_000_000_000_000u64}),
        json!({"prompt": "word ".repeat(600), "max_tokens": 1}),
        json!({"prompt": "a", "max_tokens": 600}),
    ] {
        let t0 = Instant::now();
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.error().2.as_deref(), Some("context_length_exceeded"));
        assert!(t0.elapsed() < Duration::from_secs(2), "refused up front");
    }
    // A body over --max-body (64 KiB here): 413.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(100_000));
    let r = s.post_raw("/v1/completions", big.as_bytes());
    assert_eq!(r.status, 413, "{}", r.text());
    r.error();
    // Unknown route and model.
    assert_eq!(s.get("/v2/nothing").status, 404);
    let r = s.get("/v1/completions");
    assert_eq!(r.status, 405);
    r.error();
    let r = s.post("/v1/completions", &json!({"prompt": "a", "model": "gpt-4"}));
    assert_eq!(
        (r.status, r.error().2.as_deref()),
        (404, Some("model_not_found"))
    );
    // Still serving, nothing leaked.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200);
}

#[test]
fn a_disconnect_cancels_in_every_phase_and_returns_the_blocks() {
    if !have_model() {
        return;
    }
    let s = Server::start(&[
        "--device",
        "cpu",
        "--context",
        "512",
        "--max-active",
        "1",
        "--keepalive-ms",
        "100",
        "--token-budget",
        "8",
    ]);
    let long = json!({"prompt": "Once upon a time", "max_tokens": 400, "stream": true, "ignore_eos": true});
    // Decode: read a few chunks, then hang up.
    let mut a = Sse::open(s.addr, "/v1/completions", &long);
    assert_eq!(a.status, 200);
    for _ in 0..3 {
        a.next().unwrap();
    }
    assert!(s.metric("xtc:kv_blocks_used") > 0.0);
    // Queued: with one slot taken, a second request waits; hang up on it.
    let b = Sse::open(s.addr, "/v1/completions", &long);
    assert_eq!(b.status, 200);
    std::thread::sleep(Duration::from_millis(200));
    drop(b);
    s.wait_metric(
        "xtc:request_cancelled_by_phase_total{phase=\"queued\"}",
        1.0,
    );
    drop(a);
    s.wait_metric(
        "xtc:request_cancelled_by_phase_total{phase=\"decode\"}",
        1.0,
    );
    s.wait_metric("xtc:kv_blocks_used", 0.0);
    // Non-streaming: the client sends its request and goes away.
    let mut c = TcpStream::connect(s.addr).unwrap();
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": true}).to_string();
    send_head(&mut c, "POST", "/v1/completions", body.as_bytes()).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(s.metric("xtc:kv_blocks_used") > 0.0, "it runs");
    drop(c);
    s.wait_metric(
        "xtc:request_cancelled_by_phase_total{phase=\"decode\"}",
        2.0,
    );
    s.wait_metric("xtc:kv_blocks_used", 0.0);
    assert_eq!(s.metric("xtc:client_disconnects_total"), 3.0);
    assert_eq!(s.metric("xtc:request_cancelled_total"), 3.0);
    // Prefill: a long prompt (8 rows an iteration: many iterations), hung
    // up on before its first token.
    let prompt: Vec<u32> = (0..480).map(|i| 1000 + i).collect();
    let p = json!({"prompt": prompt, "max_tokens": 5, "stream": true});
    let d = Sse::open(s.addr, "/v1/completions", &p);
    let t0 = Instant::now();
    while s.metric("xtc:kv_blocks_used") == 0.0 {
        assert!(t0.elapsed() < Duration::from_secs(5), "admitted");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    drop(d);
    s.wait_metric(
        "xtc:request_cancelled_by_phase_total{phase=\"prefill\"}",
        1.0,
    );
    s.wait_metric("xtc:kv_blocks_used", 0.0);
    assert_eq!(s.metric("xtc:request_cancelled_total"), 4.0);
    // The server still answers.
    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 200);
}

#[test]
fn silent_connections_time_out_and_excess_load_gets_429() {
    if !have_model() {
        return;
    }
    let s = Server::start(&[
        "--device",
        "cpu",
        "--context",
        "256",
        "--max-active",
        "2",
        "--max-queued",
        "8",
        "--header-timeout",
        "1",
    ]);
    // A connection that sends nothing is closed after the header timeout.
    let mut idle = TcpStream::connect(s.addr).unwrap();
    idle.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 64];
    let n = idle.read(&mut buf).unwrap_or(0);
    let waited = t0.elapsed();
    assert!(
        n == 0 || String::from_utf8_lossy(&buf[..n]).contains("408"),
        "closed"
    );
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    // 1,000 connections at once, each asking for a completion.
    let body = json!({"prompt": "Hi", "max_tokens": 3, "ignore_eos": true}).to_string();
    let mut socks = Vec::new();
    for _ in 0..1000 {
        let mut c = TcpStream::connect(s.addr).unwrap();
        send_head(&mut c, "POST", "/v1/completions", body.as_bytes()).unwrap();
        socks.push(c);
    }
    let (mut ok, mut busy, mut retry_after) = (0, 0, 0);
    for c in socks {
        c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
        let mut r = BufReader::new(c);
        let (status, headers) = read_head(&mut r).unwrap();
        match status {
            200 => ok += 1,
            429 => {
                busy += 1;
                retry_after += headers.iter().any(|(n, _)| n == "retry-after") as usize;
            }
            other => panic!("status {other}"),
        }
    }
    assert_eq!(ok + busy, 1000);
    assert!(ok >= 2 && busy > 0, "ok {ok}, 429 {busy}");
    assert_eq!(retry_after, busy, "every 429 says when to retry");
    assert!(ok <= 1000 - busy);
    assert_eq!(
        s.metric("xtc:http_refused_total{reason=\"busy\"}"),
        busy as f64
    );
    s.wait_metric("xtc:kv_blocks_used", 0.0);
    assert_eq!(s.get("/health").status, 200);
    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 200, "still serving");
}

#[test]
fn greedy_output_is_the_same_alone_and_batched() {
    if !have_model() {
        return;
    }
    // The default device (lavapipe in CI; the CPU reference without Vulkan).
    let s = Server::start(&[
        "--context",
        "256",
        "--max-active",
        "8",
        "--kv-blocks",
        "128",
    ]);
    let prompts = [
        "The capital of France is",
        "Once upon a time",
        "def fibonacci(n):",
        "My favourite colour is",
        "1, 2, 3, 4,",
        "The quick brown fox",
    ];
    let one = |p: &str| {
        let r = s.post(
            "/v1/completions",
            &json!({"prompt": p, "max_tokens": 16, "ignore_eos": true}),
        );
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["choices"][0]["text"].as_str().unwrap().to_string()
    };
    let alone: Vec<String> = prompts.iter().map(|p| one(p)).collect();
    let batched: Vec<String> = std::thread::scope(|sc| {
        let hs: Vec<_> = prompts.iter().map(|p| sc.spawn(move || one(p))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(alone, batched);
    let mean = s.metric("xtc:batch_max_ready_vector");
    assert!(
        mean >= 2.0,
        "the requests ran together (max ready vector {mean})"
    );
}

#[test]
fn sigterm_drains_streams_in_flight_and_exits_0() {
    if !have_model() {
        return;
    }
    let mut s = Server::start(&["--device", "cpu", "--context", "256", "--max-active", "2"]);
    let body =
        json!({"prompt": "Once upon a time", "max_tokens": 30, "stream": true, "ignore_eos": true});
    let mut a = Sse::open(s.addr, "/v1/completions", &body);
    a.next().unwrap();
    s.signal("-TERM");
    std::thread::sleep(Duration::from_millis(100));
    let h = s.get("/health");
    assert_eq!(h.status, 503);
    assert!(h.header("retry-after").is_some());
    let r = s.post("/v1/completions", &json!({"prompt": "Hi", "max_tokens": 2}));
    assert_eq!(r.status, 503);
    let rest = a.all();
    assert_eq!(rest.last().map(String::as_str), Some("[DONE]"));
    let fin: Value = serde_json::from_str(&rest[rest.len() - 2]).unwrap();
    assert_eq!(
        fin["choices"][0]["finish_reason"], "length",
        "the stream finished"
    );
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}

#[test]
fn a_second_signal_cancels_what_is_left() {
    if !have_model() {
        return;
    }
    let mut s = Server::start(&["--device", "cpu", "--context", "512", "--max-active", "2"]);
    let body = json!({"prompt": "Once upon a time", "max_tokens": 480, "stream": true, "ignore_eos": true});
    let mut a = Sse::open(s.addr, "/v1/completions", &body);
    a.next().unwrap();
    s.signal("-TERM");
    std::thread::sleep(Duration::from_millis(200));
    s.signal("-INT");
    let rest = a.all();
    let last = rest.last().unwrap();
    assert!(
        last.contains("\"error\""),
        "an error event, not a fake finish: {rest:?}"
    );
    assert!(
        rest.iter().all(|e| !e.contains("finish_reason\":\"")),
        "{rest:?}"
    );
    assert_eq!(s.wait_exit(Duration::from_secs(10)), 0);
}
