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

use serde_json::{Value, json};

mod serve_http_support;

use serve_http_support::*;

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
    // The engine may publish the gauge a moment after the last reply.
    s.wait_metric("xtc:kv_blocks_used", 0.0);
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
    // Before min_tokens a stop string does not end the answer (vLLM's rule):
    // with min_tokens = max_tokens the whole text comes back.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "The capital of France is", "max_tokens": 8, "stop": [stop],
                "ignore_eos": true, "min_tokens": 8}),
    );
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], text, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{v}");
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
    // Too long: refused before any work, as context_length_exceeded
    // (counted as refused; no token generated, no KV block taken).
    let refused = "xtc:http_refused_total{reason=\"context_length_exceeded\"}";
    for body in [
        json!({"prompt": "a", "max_tokens": 1_000_000_000_000u64}),
        json!({"prompt": "word ".repeat(600), "max_tokens": 1}),
        json!({"prompt": "a", "max_tokens": 600}),
    ] {
        let (n0, g0) = (
            s.metric_or_zero(refused),
            s.metric("xtc:generation_tokens_total"),
        );
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        assert_eq!(r.error().2.as_deref(), Some("context_length_exceeded"));
        assert_eq!(s.metric(refused), n0 + 1.0, "refused up front");
        assert_eq!(s.metric("xtc:generation_tokens_total"), g0, "no work");
        assert_eq!(s.metric("xtc:kv_blocks_used"), 0.0, "no block");
    }
    // A prompt that fits with max_tokens 1 but not with the server's default
    // (8 here): the refusal says the client sent no max_tokens.
    let prompt = "word ".repeat(508);
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": prompt, "max_tokens": 1}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let r = s.post("/v1/completions", &json!({"prompt": prompt}));
    assert_eq!(r.status, 400, "{}", r.text());
    assert_eq!(r.error().2.as_deref(), Some("context_length_exceeded"));
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("--default-max-tokens 8"), "{msg}");
    // A body over --max-body (64 KiB here): 413.
    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(100_000));
    let r = s.post_raw("/v1/completions", big.as_bytes());
    assert_eq!(r.status, 413, "{}", r.text());
    r.error();
    // vLLM's stop extensions are refused, not ignored (their off values pass).
    for (body, field) in [
        (
            json!({"prompt": "a", "max_tokens": 1, "stop_token_ids": [30]}),
            "stop_token_ids",
        ),
        (
            json!({"prompt": "a", "max_tokens": 1, "include_stop_str_in_output": true}),
            "include_stop_str_in_output",
        ),
    ] {
        let r = s.post("/v1/completions", &body);
        assert_eq!(r.status, 400, "{}", r.text());
        let (_, param, code) = r.error();
        assert_eq!(
            (param.as_deref(), code.as_deref()),
            (Some(field), Some("not_supported"))
        );
    }
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 1, "stop_token_ids": [],
                "include_stop_str_in_output": false}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    // Response ids carry this process's random prefix: cmpl-<12 hex>-<n>.
    let id = r.json()["id"].as_str().unwrap().to_string();
    let parts: Vec<&str> = id.split('-').collect();
    assert_eq!(parts.len(), 3, "{id}");
    assert_eq!(parts[0], "cmpl");
    assert!(
        parts[1].len() == 12 && parts[1].chars().all(|c| c.is_ascii_hexdigit()),
        "{id}"
    );
    // One model by id (the official client's models.retrieve).
    let r = s.get("/v1/models/smollm2-135m-instruct");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["id"], "smollm2-135m-instruct");
    assert_eq!(r.json()["object"], "model");
    let r = s.get("/v1/models/gpt-4");
    assert_eq!(
        (r.status, r.error().2.as_deref()),
        (404, Some("model_not_found"))
    );
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

/// A body that stops halfway, or never comes, cannot hold a connection:
/// 408 after `--body-timeout` and the connection closes, which frees its
/// `--max-connections` slot; a declared length over `--max-body` is 413
/// (what was sent is read first, so the client gets the answer, not a
/// reset), and one far over it is answered without waiting for the body.
#[test]
fn bodies_that_never_end_time_out_and_oversized_ones_are_refused() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::net::TcpStream;
    use std::time::{Duration, Instant};
    if !have_model() {
        return;
    }
    let s = cpu_server(&[
        "--max-body",
        "1024",
        "--body-timeout",
        "1",
        "--max-connections",
        "2",
    ]);
    let open = |head: &str, body: &[u8]| {
        let mut c = TcpStream::connect(s.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        c.write_all(head.as_bytes()).unwrap();
        c.write_all(body).unwrap();
        c
    };
    let head = |len: u64| {
        format!(
            "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {len}\r\n\r\n"
        )
    };
    // Both connection slots taken by bodies that stop halfway.
    let t0 = Instant::now();
    let stuck: Vec<TcpStream> = (0..2).map(|_| open(&head(50), b"{\"pro")).collect();
    for c in stuck {
        let mut r = BufReader::new(c);
        let (status, headers) = read_head(&mut r).unwrap();
        assert_eq!(status, 408);
        assert!(
            headers
                .iter()
                .any(|(n, v)| n == "connection" && v == "close"),
            "{headers:?}"
        );
        let mut rest = Vec::new();
        r.read_to_end(&mut rest).unwrap(); // EOF: the server closed it
        let v: serde_json::Value = serde_json::from_slice(&rest).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{v}");
    }
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    // The slots are free again.
    assert_eq!(s.get("/health").status, 200);
    // Far over the limit and never sent: answered at once, closed.
    let mut r = BufReader::new(open(&head(99_999_999_999), b""));
    let (status, _) = read_head(&mut r).unwrap();
    assert_eq!(status, 413);
    let mut rest = Vec::new();
    r.read_to_end(&mut rest).unwrap();
    // Over the limit and all sent before reading: the 413 arrives whole.
    let body = vec![b' '; 3000];
    let mut r = BufReader::new(open(&head(body.len() as u64), &body));
    let (status, _) = read_head(&mut r).unwrap();
    assert_eq!(status, 413);
    let mut line = String::new();
    while r.read_line(&mut line).unwrap() > 0 {}
    assert!(line.contains("larger than the server accepts"), "{line}");
    // And a normal request still works.
    let r = s.post(
        "/v1/completions",
        &json!({"prompt": "Hello", "max_tokens": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
}

/// A non-streaming request is read by the server's own future, never by a
/// slow client: however busy the HTTP workers are (here one worker, a
/// one-piece stream buffer and 1 MB prompts being tokenized alongside), it
/// is never cancelled as stalled. It was, answered 503 "the server is
/// shutting down", before its channel held every delta and tokenization
/// moved off the workers.
#[test]
fn non_streaming_requests_are_never_cancelled_as_stalled() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    if !have_model() {
        return;
    }
    let s = cpu_server(&[
        "--stream-buffer",
        "1",
        "--http-workers",
        "1",
        "--max-active",
        "8",
        "--max-body",
        "2000000",
    ]);
    let addr = s.addr;
    let stop = Arc::new(AtomicBool::new(false));
    let load: Vec<_> = (0..2)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let body = serde_json::to_vec(&json!({"prompt": " ".repeat(1_000_000)})).unwrap();
                while !stop.load(Ordering::SeqCst) {
                    let r = request(addr, "POST", "/tokenize", &body).unwrap();
                    assert_eq!(r.status, 200);
                }
            })
        })
        .collect();
    let reqs: Vec<_> = (0..6)
        .map(|i| {
            std::thread::spawn(move || {
                let body = json!({"prompt": format!("Story {i}:"), "max_tokens": 32,
                                  "ignore_eos": true});
                request(
                    addr,
                    "POST",
                    "/v1/completions",
                    &serde_json::to_vec(&body).unwrap(),
                )
                .unwrap()
            })
        })
        .collect();
    for h in reqs {
        let r = h.join().unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.json()["usage"]["completion_tokens"], 32);
    }
    stop.store(true, Ordering::SeqCst);
    for h in load {
        h.join().unwrap();
    }
    assert_eq!(s.metric_or_zero("xtc:stream_stalled_total"), 0.0);
}
