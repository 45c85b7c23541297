//! Outbound HTTP through the host (`wasi:http`), one whole request and one whole response.
//!
//! The host sends a request only to a destination the job is granted (the sidecar's
//! `[http] allow`, capped by the host's `--http-allow`), only while the term's local deadline
//! has not passed, and adds the job, the period and the term's token as headers the guest cannot
//! set (`leasehold-job`, `leasehold-period`, `leasehold-token`): a receiver that keeps the highest
//! token per job answers a replaced leader `409 Conflict` ([`Response::is_stale_term`]).
//!
//! ```no_run
//! use leasehold_guest::http;
//! use leasehold_guest::prelude::*;
//!
//! fn charge(customer: &str, period: &str) -> Result<(), JobError> {
//!     let key = format!("{period}/{customer}");
//!     let got = http::send("POST", "https://pay.example/charge", &[("idempotency-key", &key)], b"{}")?;
//!     if got.is_stale_term() {
//!         return Err(JobError::LostLeadership);
//!     }
//!     Ok(())
//! }
//! ```
//!
//! Any Rust HTTP client built on `wasi:http` works the same way; this is the smallest one.

use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

use crate::JobError;

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The headers, names in lower case, in the order received.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of header `name` (any case), as text.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    /// A 2xx status.
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// `409 Conflict`: what a fenced receiver answers a term older than one it has seen.
    pub fn is_stale_term(&self) -> bool {
        self.status == 409
    }

    /// The body as text (invalid UTF-8 replaced).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Why a request got no response.
#[derive(Debug, Clone)]
pub enum HttpError {
    /// The request could not be built: not an `http://` or `https://` URL, a method or header
    /// the host refused (the token headers are the host's), and so on.
    Invalid(String),
    /// The host or the network answered with a `wasi:http` error: `HttpRequestDenied` for a
    /// destination not granted, an address the host forbids, the term's deadline passed or the
    /// term ended; a DNS, connect, TLS or timeout error; a response over the host's size cap.
    Transport(ErrorCode),
}

impl std::fmt::Display for HttpError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HttpError::Invalid(what) => write!(f, "invalid request: {what}"),
            HttpError::Transport(code) => write!(f, "request failed: {code:?}"),
        }
    }
}

impl std::error::Error for HttpError {}

/// A request that got no response fails the step (it is retried by the job's policy); a job
/// that can tell a lost term from a failure checks `term.ensure_leader()` first.
impl From<HttpError> for JobError {
    fn from(e: HttpError) -> Self {
        JobError::Failed(e.to_string())
    }
}

/// Sends one request and reads the whole response. `method` is `GET`, `POST`, `PUT`,
/// `PATCH`, `DELETE`, `HEAD` or `OPTIONS`; `url` is `http://` or `https://` with an authority
/// and an optional path and query. Redirects are not followed (a 3xx is returned as it is).
pub fn send(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, HttpError> {
    let invalid = |what: &str| HttpError::Invalid(what.to_string());
    let method = match method.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "PATCH" => Method::Patch,
        "DELETE" => Method::Delete,
        "HEAD" => Method::Head,
        "OPTIONS" => Method::Options,
        other => return Err(HttpError::Invalid(format!("method {other}"))),
    };
    let (scheme, rest) = match url.split_once("://") {
        Some(("http", r)) => (Scheme::Http, r),
        Some(("https", r)) => (Scheme::Https, r),
        _ => return Err(HttpError::Invalid(format!("not an http(s) URL: {url}"))),
    };
    let (authority, path) = match rest.find(['/', '?']) {
        Some(at) if rest[at..].starts_with('?') => (&rest[..at], format!("/{}", &rest[at..])),
        Some(at) => (&rest[..at], rest[at..].to_string()),
        None => (rest, "/".to_string()),
    };
    if authority.is_empty() {
        return Err(HttpError::Invalid(format!("no host in {url}")));
    }
    let fields = Fields::new();
    for (name, value) in headers {
        fields
            .append(name, value.as_bytes())
            .map_err(|e| HttpError::Invalid(format!("header {name}: {e:?}")))?;
    }
    let request = OutgoingRequest::new(fields);
    request
        .set_method(&method)
        .map_err(|()| invalid("method"))?;
    request
        .set_scheme(Some(&scheme))
        .map_err(|()| invalid("scheme"))?;
    request
        .set_authority(Some(authority))
        .map_err(|()| invalid("authority"))?;
    request
        .set_path_with_query(Some(&path))
        .map_err(|()| invalid("path"))?;
    let out = request.body().map_err(|()| invalid("body"))?;
    let pending = outgoing_handler::handle(request, None).map_err(HttpError::Transport)?;
    {
        let stream = out.write().map_err(|()| invalid("body stream"))?;
        for chunk in body.chunks(4096) {
            if let Err(e) = stream.blocking_write_and_flush(chunk) {
                // The host refused or cut the request: its reason is the response's.
                drop(stream);
                drop(out);
                return Err(response_error(pending).unwrap_or_else(|| stream_error(e)));
            }
        }
    }
    OutgoingBody::finish(out, None).map_err(HttpError::Transport)?;
    pending.subscribe().block();
    let response = pending
        .get()
        .ok_or_else(|| invalid("no response after it was ready"))?
        .map_err(|()| invalid("response taken twice"))?
        .map_err(HttpError::Transport)?;
    let status = response.status();
    let headers = response
        .headers()
        .entries()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .collect();
    let incoming = response.consume().map_err(|()| invalid("consume"))?;
    let mut got = Vec::new();
    {
        let stream = incoming.stream().map_err(|()| invalid("stream"))?;
        loop {
            match stream.blocking_read(64 * 1024) {
                Ok(chunk) => got.extend_from_slice(&chunk),
                Err(StreamError::Closed) => break,
                Err(e) => return Err(stream_error(e)),
            }
        }
    }
    Ok(Response {
        status,
        headers,
        body: got,
    })
}

/// The error a failed request's pending response holds, once it is ready.
fn response_error(pending: outgoing_handler::FutureIncomingResponse) -> Option<HttpError> {
    pending.subscribe().block();
    match pending.get()? {
        Ok(Err(code)) => Some(HttpError::Transport(code)),
        _ => None,
    }
}

fn stream_error(e: StreamError) -> HttpError {
    match e {
        StreamError::Closed => HttpError::Invalid("the stream closed early".into()),
        StreamError::LastOperationFailed(e) => match wasip2::http::types::http_error_code(&e) {
            Some(code) => HttpError::Transport(code),
            None => HttpError::Invalid(e.to_debug_string()),
        },
    }
}
