//! The `http` row: an outbound request from a guest through the host (the benchjob's `get URL`
//! mode: the SDK's `http::send` over `wasi:http`, the host's grant and address checks, its own
//! resolution and connection, the token headers) against the same request sent by native Rust
//! (hyper, a new loopback connection each, as the host opens one per request). In process,
//! against the harness's fenced receiver, which closes every connection after its answer.

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use leasehold::exec::http::{Destination, HttpAsk, HttpCaps, Outbound};
use leasehold::exec::runtime::{Runtime, StepOutcome};
use leasehold::exec::spec::HostLimits;
use leasehold_harness::{Receiver, RedisServer, TempDir};
use wasmtime_wasi_http::io::TokioIo;

use super::{Row, ctx_clone, row, run_info, step_context, summary};

/// The guest's requests per step (benchjob's `REQUESTS`).
const REQUESTS: usize = 200;
/// Steps (and native rounds of as many requests), interleaved.
const TRIALS: usize = 10;

pub(super) async fn outbound(guests: &Path, rows: &mut Vec<Row>) {
    eprintln!("outbound HTTP");
    let receiver = Receiver::start().await;
    let url = receiver.url();
    let dest = Destination::parse(&url).unwrap();
    // The receiver is on loopback, which a host reaches only when told it may.
    let runtime = Runtime::new(HostLimits::default())
        .unwrap()
        .with_outbound(Outbound::new(HttpCaps {
            allow: vec![dest.clone()],
            private: true,
            ..HttpCaps::default()
        }));
    let mut job = runtime
        .load(&guests.join("benchjob.wasm"))
        .await
        .expect("benchjob loads");
    job.spec.http = HttpAsk {
        allow: vec![dest],
        ..HttpAsk::default()
    };
    let redis = RedisServer::start().await;
    let (ctx, _term) = step_context(&redis, "benchjob").await;
    let data = TempDir::new("bench-http");
    std::fs::write(data.join("mode"), format!("get {url}/ping")).unwrap();
    let (mut guest, mut native) = (Vec::new(), Vec::new());
    for _ in 0..TRIALS {
        let t = Instant::now();
        let out = runtime
            .run_step(
                &job,
                ctx_clone(&ctx, Some(data.path().to_path_buf())),
                &run_info("http"),
                0,
                None,
            )
            .await;
        assert!(matches!(out, Ok(StepOutcome::Done)), "{out:?}");
        guest.push(t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64);
        let t = Instant::now();
        for _ in 0..REQUESTS {
            native_get(receiver.port).await;
        }
        native.push(t.elapsed().as_secs_f64() * 1e6 / REQUESTS as f64);
    }
    assert_eq!(
        receiver.received().len(),
        2 * TRIALS * REQUESTS,
        "every request reached the receiver"
    );
    let (_, g_med, g_p99) = summary(&mut guest);
    let (_, n_med, n_p99) = summary(&mut native);
    let overhead = g_med - n_med;
    rows.push(row(
        "outbound HTTP request from a guest through the host (new loopback connection each)",
        format!("median {g_med:.0} / p99 {g_p99:.0} µs per request ({overhead:.0} µs over native)"),
        &format!("native Rust (hyper), the same request: median {n_med:.0} / p99 {n_p99:.0} µs"),
        "≤ 1 ms over native",
        Some(overhead <= 1000.0),
    ));
}

/// One `GET /ping` on a new connection, as the host sends one.
async fn native_get(port: u16) {
    let stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    stream.set_nodelay(true).unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    let driver = tokio::spawn(conn);
    let request = http::Request::get("/ping")
        .header(http::header::HOST, format!("127.0.0.1:{port}"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    response.into_body().collect().await.unwrap();
    driver.abort();
}
