//! A fenced receiver: a small HTTP/1.1 service on a free loopback port that does what the
//! README's recipe ("Receiving fenced requests") says a service called by jobs should do. It
//! keeps the highest `Leasehold-Token` per job and answers `409` to a lower one, applies each
//! `Idempotency-Key` once, and records every request it got, so a test can judge what a
//! zombie's late request did.
//!
//! Paths: `/charge` (the payment-provider stub: applies the charge named by its
//! `Idempotency-Key`), `/hold` (the same, but the first such request is held until
//! [`Receiver::release`]: a request in flight across a hand-over), `/hang`
//! (reads the request and never answers), `/big?N` (answers N bytes), `/redirect?URL` (a `302`
//! to URL), anything else: `200` with
//! the token headers echoed. [`Receiver::start_tls`] serves the same over HTTPS with a
//! certificate from [`crate::TestCa`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;

/// One request as the receiver got it.
#[derive(Clone, Debug)]
pub struct Received {
    /// `GET`, `POST`, …
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Header names lower-case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: Vec<u8>,
    /// The status it was answered with (0: not answered).
    pub status: u16,
}

impl Received {
    /// The first value of header `name` (lower-case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    /// How many times header `name` came.
    pub fn count(&self, name: &str) -> usize {
        self.headers.iter().filter(|(k, _)| k == name).count()
    }

    /// The `Leasehold-Token` as a number.
    pub fn token(&self) -> Option<u64> {
        self.header("leasehold-token").and_then(|t| t.parse().ok())
    }
}

#[derive(Default)]
struct State {
    connections: usize,
    received: Vec<Received>,
    highest: BTreeMap<String, u64>,
    /// Applied charges: idempotency key → the token that applied it.
    applied: BTreeMap<String, u64>,
    released: bool,
    /// A `/hold` request has been held (only the first one is).
    hold_taken: bool,
    waiting: usize,
}

/// The running receiver (stops when dropped).
pub struct Receiver {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// `https` for one started by [`Receiver::start_tls`], else `http`.
    scheme: &'static str,
    state: Arc<Mutex<State>>,
    released: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Receiver {
    /// Starts one on a free port.
    pub async fn start() -> Receiver {
        Self::start_with(None).await
    }

    /// Starts one speaking HTTPS only, with `ca`'s server certificate (for `127.0.0.1`).
    pub async fn start_tls(ca: &crate::TestCa) -> Receiver {
        use rustls::pki_types::pem::PemObject as _;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let certs = CertificateDer::pem_file_iter(&ca.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&ca.key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        Self::start_with(Some(tokio_rustls::TlsAcceptor::from(Arc::new(config)))).await
    }

    async fn start_with(tls: Option<tokio_rustls::TlsAcceptor>) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state: Arc<Mutex<State>> = Arc::default();
        let released = Arc::new(tokio::sync::Notify::new());
        let (s, r) = (state.clone(), released.clone());
        let scheme = if tls.is_some() { "https" } else { "http" };
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                s.lock().unwrap().connections += 1;
                let (s, r) = (s.clone(), r.clone());
                match tls.clone() {
                    None => drop(tokio::spawn(serve(conn, s, r))),
                    Some(tls) => drop(tokio::spawn(async move {
                        // A client that refuses the certificate ends here.
                        if let Ok(conn) = tls.accept(conn).await {
                            serve(conn, s, r).await;
                        }
                    })),
                }
            }
        });
        Receiver {
            port,
            scheme,
            state,
            released,
            task,
        }
    }

    /// `http://127.0.0.1:PORT` (`https://…` for one started by [`Receiver::start_tls`]).
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.lock().unwrap().connections
    }

    /// Every request received so far (a held one appears once answered).
    pub fn received(&self) -> Vec<Received> {
        self.state.lock().unwrap().received.clone()
    }

    /// Applied charges: idempotency key → token.
    pub fn applied(&self) -> BTreeMap<String, u64> {
        self.state.lock().unwrap().applied.clone()
    }

    /// The highest token seen for `job`.
    pub fn highest(&self, job: &str) -> Option<u64> {
        self.state.lock().unwrap().highest.get(job).copied()
    }

    /// Lets held requests (`/hold`) be processed, now and from now on.
    pub fn release(&self) {
        self.state.lock().unwrap().released = true;
        self.released.notify_waiters();
    }

    /// How many `/hold` requests are waiting (0 or 1: only the first is held).
    pub fn held(&self) -> usize {
        self.state.lock().unwrap().waiting
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve<C: AsyncRead + AsyncWrite + Unpin>(
    mut conn: C,
    state: Arc<Mutex<State>>,
    released: Arc<tokio::sync::Notify>,
) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at;
        }
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or("");
    let mut parts = first.split(' ');
    let method = parts.next().unwrap_or("").to_string();
    let path = parts.next().unwrap_or("").to_string();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = buf[head_end + 4..].to_vec();
    while body.len() < length {
        match conn.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => body.extend_from_slice(&chunk[..n]),
        }
    }
    let mut got = Received {
        method,
        path: path.clone(),
        headers,
        body,
        status: 0,
    };
    if path == "/hang" {
        // Read, never answer: the sender's timeout must end it.
        let _ = conn.read(&mut chunk).await;
        return;
    }
    let hold = path == "/hold" && {
        let mut s = state.lock().unwrap();
        !std::mem::replace(&mut s.hold_taken, true)
    };
    if hold {
        state.lock().unwrap().waiting += 1;
        loop {
            let wait = released.notified();
            if state.lock().unwrap().released {
                break;
            }
            wait.await;
        }
        state.lock().unwrap().waiting -= 1;
    }
    let mut location = String::new();
    let (status, reply) = if let Some(n) = path.strip_prefix("/big?") {
        (200, vec![b'x'; n.parse().unwrap_or(0)])
    } else if let Some(to) = path.strip_prefix("/redirect?") {
        location = format!("location: {to}\r\n");
        (302, Vec::new())
    } else if path == "/charge" || path == "/hold" {
        charge(&state, &got)
    } else {
        let echo = format!(
            "job={} period={} token={}",
            got.header("leasehold-job").unwrap_or("-"),
            got.header("leasehold-period").unwrap_or("-"),
            got.header("leasehold-token").unwrap_or("-"),
        );
        (200, echo.into_bytes())
    };
    got.status = status;
    state.lock().unwrap().received.push(got);
    let reason = match status {
        200 => "OK",
        302 => "Found",
        400 => "Bad Request",
        409 => "Conflict",
        _ => "Other",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\n{location}content-length: {}\r\nconnection: close\r\n\r\n",
        reply.len()
    )
    .into_bytes();
    out.extend_from_slice(&reply);
    let _ = conn.write_all(&out).await;
    let _ = conn.shutdown().await;
}

/// The recipe: refuse a token below the job's highest, then apply each key once.
fn charge(state: &Mutex<State>, got: &Received) -> (u16, Vec<u8>) {
    let (Some(job), Some(token)) = (got.header("leasehold-job"), got.token()) else {
        return (400, b"no Leasehold-Job or Leasehold-Token".to_vec());
    };
    let Some(key) = got.header("idempotency-key") else {
        return (400, b"no Idempotency-Key".to_vec());
    };
    let mut s = state.lock().unwrap();
    let highest = s.highest.entry(job.to_string()).or_insert(0);
    if token < *highest {
        return (
            409,
            format!("stale token {token}: {job} is at {highest}").into_bytes(),
        );
    }
    *highest = token;
    if let Some(by) = s.applied.get(key) {
        return (200, format!("already charged by token {by}").into_bytes());
    }
    s.applied.insert(key.to_string(), token);
    (200, format!("charged by token {token}").into_bytes())
}
