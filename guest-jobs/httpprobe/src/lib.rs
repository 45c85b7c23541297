//! Test fixture: sends the requests in `/data/plan.txt` through `wasi:http` (the bindings any
//! Rust HTTP client on wasm32-wasip2 uses), one line per operation, and records each outcome
//! under `result/<period>/<line>` in its store.
//!
//! Lines (blank lines and `#` comments skipped):
//!
//! * `get URL`, `post URL BODY` — a request; `BODY` may use `{period}`;
//! * `follow URL` — a `GET` whose redirects (3xx with `Location`) are followed, up to five
//!   hops, as an HTTP client does: each hop is a new request the host checks; a failed hop is
//!   reported as `err hop N: WHAT`;
//! * `header NAME VALUE` — a header for the next request (its outcome: whether the host let
//!   the guest set it);
//! * `mark KEY` — writes `mark/KEY` (fenced) so a test knows how far the step got;
//! * `hold MS` — spins for MS milliseconds (a test freezes the host meanwhile), or until
//!   `/data/release` exists.
//!
//! Outcomes: `ok STATUS BODY` (the body's first 200 bytes), `ok set`, or `err WHAT`, where
//! `WHAT` is the `wasi:http` error code as Rust prints it (`HttpRequestDenied`, …).

use leasehold_guest::prelude::*;
use wasip2::http::outgoing_handler;
use wasip2::http::types::{Fields, Method, OutgoingBody, OutgoingRequest, Scheme};
use wasip2::io::streams::StreamError;

struct HttpProbe;

/// One request: the status and body, or what went wrong.
fn send(
    method: Method,
    url: &str,
    body: &[u8],
    headers: &[(String, String)],
) -> Result<(u16, Option<String>, Vec<u8>), String> {
    let (scheme, rest) = match url.split_once("://") {
        Some(("http", r)) => (Scheme::Http, r),
        Some(("https", r)) => (Scheme::Https, r),
        _ => return Err(format!("not a URL: {url}")),
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => (&rest[..at], &rest[at..]),
        None => (rest, "/"),
    };
    let fields = Fields::new();
    for (k, v) in headers {
        fields
            .append(k, v.as_bytes())
            .map_err(|e| format!("header {k}: {e:?}"))?;
    }
    let req = OutgoingRequest::new(fields);
    req.set_method(&method).map_err(|()| "method")?;
    req.set_scheme(Some(&scheme)).map_err(|()| "scheme")?;
    req.set_authority(Some(authority))
        .map_err(|()| "authority")?;
    req.set_path_with_query(Some(path)).map_err(|()| "path")?;
    let out = req.body().map_err(|()| "body")?;
    let future = outgoing_handler::handle(req, None).map_err(|e| format!("{e:?}"))?;
    {
        let stream = out.write().map_err(|()| "body stream")?;
        for chunk in body.chunks(4096) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| format!("writing the body: {e:?}"))?;
        }
    }
    OutgoingBody::finish(out, None).map_err(|e| format!("{e:?}"))?;
    future.subscribe().block();
    let response = future
        .get()
        .expect("ready")
        .expect("once")
        .map_err(|e| format!("{e:?}"))?;
    let status = response.status();
    let location = response
        .headers()
        .get("location")
        .first()
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let incoming = response.consume().map_err(|()| "consume")?;
    let stream = incoming.stream().map_err(|()| "stream")?;
    let mut got = Vec::new();
    loop {
        match stream.blocking_read(64 * 1024) {
            Ok(chunk) => got.extend_from_slice(&chunk),
            Err(StreamError::Closed) => break,
            Err(StreamError::LastOperationFailed(e)) => {
                return Err(match wasip2::http::types::http_error_code(&e) {
                    Some(code) => format!("{code:?}"),
                    None => e.to_debug_string(),
                });
            }
        }
    }
    Ok((status, location, got))
}

/// `ok STATUS BODY` with the body's first 200 bytes.
fn shown(status: u16, body: &[u8]) -> String {
    let shown = &body[..body.len().min(200)];
    format!("ok {status} {}", String::from_utf8_lossy(shown))
}

impl Guest for HttpProbe {
    fn describe() -> JobSpec {
        spec("httpprobe").schedule("0 0 0 1 1 *").build()
    }

    fn run_step(
        _term: &Term,
        run: RunInfo,
        _step: u32,
        _state: Option<Vec<u8>>,
    ) -> Result<StepOutcome, JobError> {
        let plan = std::fs::read_to_string("/data/plan.txt")
            .map_err(|e| JobError::Failed(format!("cannot read /data/plan.txt: {e}")))?;
        let mut headers: Vec<(String, String)> = Vec::new();
        for (n, line) in plan.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (op, rest) = line.split_once(' ').unwrap_or((line, ""));
            let outcome: Result<String, String> = match op {
                "get" | "post" => {
                    let (url, body) = rest.split_once(' ').unwrap_or((rest, ""));
                    let body = body.replace("{period}", &run.period);
                    let method = if op == "get" {
                        Method::Get
                    } else {
                        Method::Post
                    };
                    send(method, url, body.as_bytes(), &std::mem::take(&mut headers))
                        .map(|(status, _, body)| shown(status, &body))
                }
                "follow" => {
                    let mut url = rest.to_string();
                    let mut outcome = Err("more than five redirects".to_string());
                    for hop in 1..=5 {
                        match send(Method::Get, &url, b"", &std::mem::take(&mut headers)) {
                            Err(e) => {
                                outcome = Err(format!("hop {hop}: {e}"));
                                break;
                            }
                            Ok((status, Some(next), _)) if (300..400).contains(&status) => {
                                url = next;
                            }
                            Ok((status, _, body)) => {
                                outcome = Ok(shown(status, &body));
                                break;
                            }
                        }
                    }
                    outcome
                }
                "header" => {
                    let (name, value) = rest.split_once(' ').unwrap_or((rest, ""));
                    // Whether the host lets the guest set it: the same check a request makes.
                    let check = Fields::new();
                    match check.append(name, value.as_bytes()) {
                        Ok(()) => {
                            headers.push((name.to_string(), value.to_string()));
                            Ok("ok set".into())
                        }
                        Err(e) => Err(format!("{e:?}")),
                    }
                }
                "mark" => {
                    leasehold_guest::store::write(&format!("mark/{rest}"), b"1")?;
                    Ok("ok marked".into())
                }
                "hold" => {
                    let until = std::time::Instant::now()
                        + std::time::Duration::from_millis(rest.parse().expect("hold MS"));
                    while std::time::Instant::now() < until
                        && !std::path::Path::new("/data/release").exists()
                    {
                        std::hint::spin_loop();
                    }
                    Ok("ok held".into())
                }
                other => panic!("unknown operation {other:?}"),
            };
            let text = match outcome {
                Ok(t) => t,
                Err(e) => format!("err {e}"),
            };
            leasehold_guest::store::write(
                &format!("result/{}/{:03}", run.period, n + 1),
                text.as_bytes(),
            )?;
        }
        Ok(StepOutcome::Done)
    }
}

leasehold_guest::export!(HttpProbe);
