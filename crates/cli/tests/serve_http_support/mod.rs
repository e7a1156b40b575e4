//! The test server and a small HTTP/1 client (plain requests and SSE
//! streams) shared by `serve_http.rs` and `serve_http_load.rs`.
#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Whether the model is installed; panics in CI when it is not.
pub fn have_model() -> bool {
    match xtc_model::find_model(None) {
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

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
}

impl Server {
    /// Starts `xtc serve --port 0 ARGS` and waits until /health is 200.
    pub fn start(args: &[&str]) -> Server {
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

    pub fn try_get(&self, path: &str) -> std::io::Result<Resp> {
        request(self.addr, "GET", path, b"")
    }

    pub fn get(&self, path: &str) -> Resp {
        self.try_get(path).unwrap()
    }

    pub fn post(&self, path: &str, body: &Value) -> Resp {
        request(self.addr, "POST", path, body.to_string().as_bytes()).unwrap()
    }

    pub fn post_raw(&self, path: &str, body: &[u8]) -> Resp {
        request(self.addr, "POST", path, body).unwrap()
    }

    pub fn metric(&self, name: &str) -> f64 {
        let text = self.get("/metrics").text();
        find_metric(&text, name).unwrap_or_else(|| panic!("no metric {name} in:\n{text}"))
    }

    /// As [`metric`](Self::metric), 0 for a labelled series not yet
    /// exposed (a counter's label set appears at its first increment).
    pub fn metric_or_zero(&self, name: &str) -> f64 {
        find_metric(&self.get("/metrics").text(), name).unwrap_or(0.0)
    }

    /// Waits until `metric(name) == want` (panics after 120 s: the cancels
    /// and admissions waited for take milliseconds, but CI machines are
    /// shared and a second server may be decoding on the same cores).
    pub fn wait_metric(&self, name: &str, want: f64) {
        self.wait_metric_for(name, want, Duration::from_secs(120));
    }

    /// Waits until `ok(metric(name))` (panics after 120 s, as
    /// [`wait_metric`](Self::wait_metric)); returns the value.
    pub fn wait_metric_until(&self, name: &str, ok: impl Fn(f64) -> bool) -> f64 {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if ok(v) {
                return v;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "{name} = {v}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits until `metric(name) == want` (panics after `limit`).
    pub fn wait_metric_for(&self, name: &str, want: f64, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let v = self.metric(name);
            if v == want {
                return;
            }
            assert!(t0.elapsed() < limit, "{name} = {v}, want {want}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
    }

    pub fn wait_exit(&mut self, limit: Duration) -> i32 {
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
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn text(&self) -> String {
        String::from_utf8(self.body.clone()).unwrap()
    }
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    /// The OpenAI error body's fields, checking its shape.
    pub fn error(&self) -> (String, Option<String>, Option<String>) {
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

pub fn send_head(s: &mut TcpStream, method: &str, path: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)
}

/// Reads a response head: status and headers.
pub fn read_head(r: &mut impl BufRead) -> std::io::Result<(u16, Vec<(String, String)>)> {
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
pub fn read_chunk(r: &mut impl BufRead) -> std::io::Result<Option<Vec<u8>>> {
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

pub fn request(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> std::io::Result<Resp> {
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
pub struct Sse {
    pub r: BufReader<TcpStream>,
    pub status: u16,
    pub buf: String,
}

impl Sse {
    pub fn open(addr: SocketAddr, path: &str, body: &Value) -> Sse {
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
    pub fn next(&mut self) -> Option<String> {
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
    pub fn all(&mut self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// The server for read-only checks: the CPU reference, small sizes.
/// A server on the CPU reference with a 256-position context and `extra`.
pub fn cpu_server(extra: &[&str]) -> Server {
    let mut args = vec!["--device", "cpu", "--context", "256"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

pub fn small_server() -> Server {
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

/// The value of the sample `name` (with its labels, as exposed) in
/// `text`, if there is one.
fn find_metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse().unwrap())
    })
}
