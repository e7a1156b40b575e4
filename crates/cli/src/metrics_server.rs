//! `xtc decode --metrics-addr`: serves `GET /metrics` (the OpenMetrics text
//! of the run in progress) from a `tiny_http` server on its own threads while
//! the run lasts. No async runtime: the run's loop never waits on it, and
//! the metrics it reads are atomics.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use prometheus_client::registry::Registry;

use xtc_kvbatch::metrics::{CONTENT_TYPE, encode};

/// The registry the server shows: the run in progress, or before the first
/// run the registry given to [`MetricsServer::start`] (every family at zero:
/// a scrape never sees an exposition without families, which strict
/// OpenMetrics parsers reject).
type Current = Arc<Mutex<Arc<Registry>>>;

/// Why a `/metrics` server did not start; its message names the option
/// (`--metrics-addr ADDR: ...`).
#[derive(Debug)]
pub enum MetricsServerError {
    /// The address cannot be bound (in use, not local, no permission).
    Listen {
        /// The address asked for.
        addr: SocketAddr,
        /// What the listener said.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The bound listener is not an IP socket.
    NotIp(SocketAddr),
    /// The server's thread did not start.
    Thread {
        /// The address asked for.
        addr: SocketAddr,
        /// The spawn's error.
        source: std::io::Error,
    },
}

impl std::fmt::Display for MetricsServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Listen { addr, source } => {
                write!(f, "--metrics-addr {addr}: cannot listen: {source}")
            }
            Self::NotIp(addr) => write!(f, "--metrics-addr {addr}: not an IP socket"),
            Self::Thread { addr, source } => {
                write!(
                    f,
                    "--metrics-addr {addr}: cannot start its thread: {source}"
                )
            }
        }
    }
}

impl std::error::Error for MetricsServerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Listen { source, .. } => Some(source.as_ref()),
            Self::NotIp(_) => None,
            Self::Thread { source, .. } => Some(source),
        }
    }
}

/// A running `/metrics` server (see the module doc); stopped by
/// [`MetricsServer::stop`] or when dropped.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    current: Current,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for MetricsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetricsServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

impl MetricsServer {
    /// Listens on `addr` (port 0: any free port; [`MetricsServer::addr`]
    /// says which) and shows `initial` until [`MetricsServer::show`] is
    /// called (give it the families of a run, at zero).
    ///
    /// # Errors
    /// [`MetricsServerError`]: the address cannot be bound (in use, not
    /// local, no permission), or the server's thread did not start.
    pub fn start(addr: SocketAddr, initial: Arc<Registry>) -> Result<Self, MetricsServerError> {
        let server = tiny_http::Server::http(addr)
            .map_err(|source| MetricsServerError::Listen { addr, source })?;
        let bound = server
            .server_addr()
            .to_ip()
            .ok_or(MetricsServerError::NotIp(addr))?;
        let server = Arc::new(server);
        let current: Current = Arc::new(Mutex::new(initial));
        let stopping = Arc::new(AtomicBool::new(false));
        let (s, c, st) = (server.clone(), current.clone(), stopping.clone());
        let thread = std::thread::Builder::new()
            .name("xtc-metrics".into())
            .spawn(move || serve(&s, &c, &st))
            .map_err(|source| MetricsServerError::Thread { addr, source })?;
        Ok(MetricsServer {
            server,
            addr: bound,
            current,
            stopping,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Shows `registry` from now on (the next run's metrics).
    pub fn show(&self, registry: Arc<Registry>) {
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = registry;
    }

    /// Stops serving: requests in progress finish, new connections are
    /// refused.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stopping.store(true, Ordering::Release);
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn serve(server: &tiny_http::Server, current: &Current, stopping: &AtomicBool) {
    loop {
        // `recv` fails once `unblock` was called, or on a failed accept.
        let req = match server.recv() {
            Ok(req) => req,
            Err(_) if stopping.load(Ordering::Acquire) => return,
            Err(_) => {
                // A failed accept (out of fds, ...): do not spin on it.
                std::thread::sleep(std::time::Duration::from_millis(10));
                continue;
            }
        };
        let path = req.url().split('?').next().unwrap_or("");
        let resp = match (req.method(), path) {
            (tiny_http::Method::Get, "/metrics") => {
                let reg = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let body = encode(&reg);
                let ct = tiny_http::Header::from_bytes("Content-Type", CONTENT_TYPE)
                    .expect("a valid header");
                tiny_http::Response::from_string(body).with_header(ct)
            }
            (tiny_http::Method::Get, _) => {
                tiny_http::Response::from_string("not found: metrics are at /metrics\n")
                    .with_status_code(404)
            }
            _ => tiny_http::Response::from_string("only GET is served\n").with_status_code(405),
        };
        let _ = req.respond(resp); // a client that went away: nothing to do
    }
}
