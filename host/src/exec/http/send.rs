//! The sender every guest request goes through ([`HttpHooks`], wasmtime-wasi-http's hooks):
//! the term and the grant checked, the name resolved and its addresses checked by the host,
//! the token headers set, every wait bounded by the job's timeout and by the term.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt as _;
use tokio::net::TcpStream;
use tracing::warn;
use wasmtime_wasi_http::io::TokioIo;
use wasmtime_wasi_http::{
    DEFAULT_FORBIDDEN_HEADERS, Error, ForbiddenHeaderFilter, RequestOptions, WasiBody,
    WasiHttpHooks,
};

use super::{Destination, JOB_HEADER, JobHttp, PERIOD_HEADER, Scheme, TOKEN_HEADER, addr};
use crate::coord::term::Term;

/// Whether `name` is one of the host's own headers, which a guest may not touch.
fn ours(name: &HeaderName) -> bool {
    [JOB_HEADER, PERIOD_HEADER, TOKEN_HEADER].contains(&name.as_str())
}

/// The hooks of one store: what its requests are sent for, or nothing (`describe()`).
pub struct HttpHooks {
    ctx: Option<Arc<Sender>>,
}

/// One step's (or task's) requests: the job, its period, its term and what it is granted.
struct Sender {
    job: String,
    period: String,
    term: Term,
    http: JobHttp,
}

impl HttpHooks {
    /// Hooks that refuse every request (a store without a step: `describe()`).
    pub fn refuse_all() -> Self {
        HttpHooks { ctx: None }
    }

    /// Hooks for `job`'s step (or task) of `period` in `term`, granted `http`.
    pub fn for_step(job: &str, period: &str, term: Term, http: JobHttp) -> Self {
        HttpHooks {
            ctx: Some(Arc::new(Sender {
                job: job.to_string(),
                period: period.to_string(),
                term,
                http,
            })),
        }
    }

    /// Sends one request with a whole body through the same grant, term, address and header
    /// rules as a guest's, and reads the whole response: its status and body. For the host's own
    /// callers (the demo's scene, the outbound benchmark); `headers` may not name the host's.
    pub async fn send_whole(
        &self,
        method: http::Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
    ) -> Result<(u16, Bytes), Error> {
        let Some(ctx) = &self.ctx else {
            return Err(Error::HttpRequestDenied);
        };
        let mut req = http::Request::builder().method(method).uri(url);
        for (name, text) in headers {
            let name = HeaderName::try_from(*name).map_err(|_| Error::HttpRequestDenied)?;
            if ours(&name) {
                return Err(Error::HttpRequestDenied);
            }
            req = req.header(name, value(text)?);
        }
        let body = http_body_util::Full::new(Bytes::from(body))
            .map_err(|never| match never {})
            .boxed_unsync();
        let req = req.body(body).map_err(|_| Error::HttpRequestUriInvalid)?;
        let (response, _io) = ctx.send(req).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes();
        Ok((status, body))
    }
}

type Sent = Result<
    (
        http::Response<WasiBody>,
        Box<dyn Future<Output = Result<(), Error>> + Send>,
    ),
    Error,
>;

impl WasiHttpHooks for HttpHooks {
    fn forbidden_header_filter(&mut self) -> ForbiddenHeaderFilter {
        Arc::new(|name| DEFAULT_FORBIDDEN_HEADERS.contains(name) || ours(name))
    }

    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        _options: Option<RequestOptions>,
        _fut: Box<dyn Future<Output = Result<(), Error>> + Send>,
    ) -> Box<dyn Future<Output = Sent> + Send> {
        let ctx = self.ctx.clone();
        Box::new(async move {
            let Some(ctx) = ctx else {
                warn!("http request refused: describe() may not send requests");
                return Err(Error::HttpRequestDenied);
            };
            // The guest's own timeouts (request options) are not honoured above the job's.
            ctx.send(request).await
        })
    }
}

impl Sender {
    fn refuse(&self, dest: &str, why: &str) -> Error {
        warn!(job = %self.job, period = %self.period, token = self.term.token(), destination = dest, "http request refused: {why}");
        Error::HttpRequestDenied
    }

    async fn send(&self, mut req: http::Request<WasiBody>) -> Sent {
        let uri = req.uri().clone();
        let scheme = match uri.scheme_str() {
            Some("http") => Scheme::Http,
            Some("https") => Scheme::Https,
            _ => return Err(self.refuse(&uri.to_string(), "only http and https are supported")),
        };
        let authority = uri.authority().ok_or(Error::HttpRequestUriInvalid)?;
        let dest = Destination::from_authority(scheme, authority.as_str())
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        let shown = dest.to_string();
        if !self.http.allow.contains(&dest) {
            return Err(self.refuse(
                &shown,
                &format!(
                    "{shown} is not granted to job {} (its sidecar's [http] allow, within the host's --http-allow)",
                    self.job
                ),
            ));
        }
        if !self.term.still_leader() {
            return Err(self.refuse(
                &shown,
                "the term has ended: nothing is sent after its deadline",
            ));
        }
        let limit = self.http.limits.timeout;
        // Resolve, check every address, connect: all within the timeout and the term.
        let stream = match self
            .term
            .bound(tokio::time::timeout(limit, self.connect(&dest)))
            .await
        {
            None => return Err(self.refuse(&shown, "the term ended while connecting")),
            Some(Err(_)) => return Err(Error::ConnectionTimeout),
            Some(Ok(s)) => s?,
        };
        let io: Box<dyn Io> = match dest.scheme {
            Scheme::Http => Box::new(stream),
            Scheme::Https => {
                let tls = self.http.tls.clone().map_err(|why| {
                    warn!(job = %self.job, destination = %shown, "https refused: {why}");
                    Error::TlsCertificateError
                })?;
                let name = match dest.host.parse::<std::net::IpAddr>() {
                    Ok(ip) => rustls::pki_types::ServerName::from(ip),
                    Err(_) => rustls::pki_types::ServerName::try_from(dest.host.clone())
                        .map_err(|_| Error::HttpRequestUriInvalid)?,
                };
                let connecting = tokio_rustls::TlsConnector::from(tls).connect(name, stream);
                match self
                    .term
                    .bound(tokio::time::timeout(limit, connecting))
                    .await
                {
                    None => {
                        return Err(self.refuse(&shown, "the term ended during the TLS handshake"));
                    }
                    Some(Err(_)) => return Err(Error::ConnectionTimeout),
                    Some(Ok(Err(e))) => {
                        warn!(job = %self.job, destination = %shown, "TLS with {shown} failed: {e}");
                        return Err(tls_error(&e));
                    }
                    Some(Ok(Ok(s))) => Box::new(s),
                }
            }
        };
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(Error::Hyper)?;
        // The connection is driven by a task of its own, aborted when the response (or this
        // request) is dropped.
        let driver = Abort(tokio::spawn(conn));
        // The host's headers, after the guest's (which cannot name them).
        let headers = req.headers_mut();
        headers.insert(JOB_HEADER, value(&self.job)?);
        headers.insert(PERIOD_HEADER, value(&self.period)?);
        headers.insert(TOKEN_HEADER, value(&self.term.token().to_string())?);
        *req.uri_mut() = http::Uri::builder()
            .path_and_query(uri.path_and_query().map(|p| p.as_str()).unwrap_or("/"))
            .build()
            .map_err(|_| Error::HttpRequestUriInvalid)?;
        // Nothing is sent once the deadline has passed (checked again after connecting).
        if !self.term.still_leader() {
            return Err(self.refuse(
                &shown,
                "the term has ended: nothing is sent after its deadline",
            ));
        }
        // The step can be abandoned at the term's end before this future sees the end itself:
        // the request is dropped in flight then, and the guard says so the same way.
        let mut in_flight = InFlight {
            sender: self,
            dest: &shown,
            answered: false,
        };
        let sent = self
            .term
            .bound(tokio::time::timeout(limit, sender.send_request(req)))
            .await;
        in_flight.answered = true;
        let response = match sent {
            None => {
                return Err(self.refuse(&shown, IN_FLIGHT_CANCELLED));
            }
            Some(Err(_)) => return Err(Error::HttpResponseTimeout),
            Some(Ok(r)) => r.map_err(Error::Hyper)?,
        };
        let max = self.http.limits.max_response;
        if let Some(len) = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok())
            && len > max
        {
            warn!(job = %self.job, destination = %shown, "response of {len} bytes refused: the job's limit is {max}");
            return Err(Error::HttpResponseBodySize(Some(len)));
        }
        let term = self.term.clone();
        let response = response.map(|incoming| {
            Capped {
                inner: incoming,
                left: max,
                max,
                timeout: limit,
                idle: Box::pin(tokio::time::sleep(limit)),
                ended: Box::pin(async move { term.ended().await }),
                _driver: driver,
            }
            .boxed_unsync()
        });
        Ok((response, Box::new(async { Ok(()) })))
    }

    /// Resolves `dest` (unless it is an address), keeps the addresses the host permits, and
    /// connects to the first that answers.
    async fn connect(&self, dest: &Destination) -> Result<TcpStream, Error> {
        let shown = dest.to_string();
        let addrs: Vec<SocketAddr> = match dest.host.parse::<std::net::IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, dest.port)],
            Err(_) => match tokio::net::lookup_host((dest.host.as_str(), dest.port)).await {
                Ok(found) => found.collect(),
                Err(e) => {
                    warn!(job = %self.job, destination = %shown, "http request failed: cannot resolve {}: {e}", dest.host);
                    return Err(Error::DnsError {
                        rcode: Some(e.to_string()),
                        info_code: None,
                    });
                }
            },
        };
        if addrs.is_empty() {
            return Err(Error::DestinationNotFound);
        }
        let mut allowed = Vec::new();
        for a in &addrs {
            match addr::forbidden(a.ip()) {
                Some(why) if !self.http.private => {
                    let _ = self.refuse(
                        &shown,
                        &format!(
                            "{} resolves to {}, {why}, which this host forbids (--http-allow-private allows it)",
                            dest.host,
                            a.ip()
                        ),
                    );
                }
                _ => allowed.push(*a),
            }
        }
        if allowed.is_empty() {
            return Err(Error::DestinationIpProhibited);
        }
        let mut last = None;
        for a in allowed {
            match TcpStream::connect(a).await {
                Ok(s) => {
                    let _ = s.set_nodelay(true);
                    return Ok(s);
                }
                Err(e) => last = Some(e),
            }
        }
        let e = last.expect("at least one address was tried");
        warn!(job = %self.job, destination = %shown, "http request failed: connecting: {e}");
        Err(match e.kind() {
            std::io::ErrorKind::ConnectionRefused => Error::ConnectionRefused,
            _ => Error::DestinationUnavailable,
        })
    }
}

/// What is logged when the term ends with a request in flight.
const IN_FLIGHT_CANCELLED: &str = "the term ended with the request in flight: cancelled";

/// A request waiting for its response. Dropped unanswered after its term ended (the step
/// abandoned before the sender saw the end), it logs the cancellation the sender would have.
struct InFlight<'a> {
    sender: &'a Sender,
    dest: &'a str,
    answered: bool,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if !self.answered && !self.sender.term.still_leader() {
            let _ = self.sender.refuse(self.dest, IN_FLIGHT_CANCELLED);
        }
    }
}

/// A header value from host text (a job name, a period, a token: printable ASCII).
fn value(text: &str) -> Result<HeaderValue, Error> {
    HeaderValue::from_str(text)
        .map_err(|_| Error::InternalError(Some(format!("{text:?} is not a header value"))))
}

/// A TLS failure as wasi:http names it: a certificate that is not trusted (or not for this
/// name), or another failure of the protocol.
fn tls_error(e: &std::io::Error) -> Error {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(_)) => Error::TlsCertificateError,
        Some(rustls::Error::AlertReceived(alert)) => Error::TlsAlertReceived {
            alert_id: Some(u8::from(*alert)),
            alert_message: Some(format!("{alert:?}")),
        },
        _ => Error::TlsProtocolError,
    }
}

/// A stream TLS or plain text runs over.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// Aborts the connection's task when dropped.
struct Abort(tokio::task::JoinHandle<Result<(), hyper::Error>>);

impl Drop for Abort {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// A response body within the job's limits: at most `max` bytes, no gap longer than
/// `timeout` between frames, and ended with an error when the term ends.
struct Capped {
    inner: hyper::body::Incoming,
    left: u64,
    max: u64,
    timeout: Duration,
    idle: Pin<Box<tokio::time::Sleep>>,
    ended: Pin<Box<dyn Future<Output = ()> + Send>>,
    _driver: Abort,
}

impl Body for Capped {
    type Data = Bytes;
    type Error = Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Error>>> {
        if self.ended.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Some(Err(Error::ConnectionTerminated)));
        }
        match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    let n = data.len() as u64;
                    if n > self.left {
                        let max = self.max;
                        return Poll::Ready(Some(Err(Error::HttpResponseBodySize(Some(max + 1)))));
                    }
                    self.left -= n;
                }
                let next = tokio::time::Instant::now() + self.timeout;
                self.idle.as_mut().reset(next);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Error::Hyper(e)))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match self.idle.as_mut().poll(cx) {
                Poll::Ready(()) => Poll::Ready(Some(Err(Error::ConnectionReadTimeout))),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
