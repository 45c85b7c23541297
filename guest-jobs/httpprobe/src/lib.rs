//! Test fixture: sends the requests in `/data/plan.txt` through `wasi:http` (with the SDK's
//! `http::send`, over the bindings any Rust HTTP client on wasm32-wasip2 uses), one line per
//! operation, and records each outcome under `result/<period>/<line>` in its store.
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

use leasehold_guest::http::{self, HttpError};
use leasehold_guest::prelude::*;
use wasip2::http::types::Fields;

struct HttpProbe;

/// One request through the SDK's [`http::send`]: the status, the `Location` header and the
/// body, or what went wrong (a `wasi:http` error code as Rust prints it).
fn send(
    method: &str,
    url: &str,
    body: &[u8],
    headers: &[(String, String)],
) -> Result<(u16, Option<String>, Vec<u8>), String> {
    let headers: Vec<(&str, &str)> = headers
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    match http::send(method, url, &headers, body) {
        Ok(got) => Ok((got.status, got.header("location"), got.body)),
        Err(HttpError::Transport(code)) => Err(format!("{code:?}")),
        Err(HttpError::Invalid(what)) => Err(what),
    }
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

    fn databases() -> Vec<String> {
        Vec::new()
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
                    let method = if op == "get" { "GET" } else { "POST" };
                    send(method, url, body.as_bytes(), &std::mem::take(&mut headers))
                        .map(|(status, _, body)| shown(status, &body))
                }
                "follow" => {
                    let mut url = rest.to_string();
                    let mut outcome = Err("more than five redirects".to_string());
                    for hop in 1..=5 {
                        match send("GET", &url, b"", &std::mem::take(&mut headers)) {
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
