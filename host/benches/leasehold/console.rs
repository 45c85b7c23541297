//! The operator console at scale: the overview's time and weight with 1,000 and 10,000 jobs.

use std::path::Path;
use std::time::{Duration, Instant};

use leasehold_harness::{RedisServer, TempDir, http};

use super::scale::{jobs_dir, owners, patient, start_host};
use super::{Row, row, summary};

/// Requests timed per figure.
const REQUESTS: usize = 20;

/// Times `GET path` on `addr` `REQUESTS` times (ms, as the client on loopback sees it: one
/// connection each), after one untimed request; and the body's size of the last.
async fn timed(addr: &str, path: &str) -> (Vec<f64>, usize) {
    let size = |body: &serde_json::Value| body.as_str().map_or(0, str::len);
    let (code, _) = http(addr, "GET", path, None).await;
    assert_eq!(code, 200, "{path}");
    let mut v = Vec::with_capacity(REQUESTS);
    let mut bytes = 0;
    for _ in 0..REQUESTS {
        let t = Instant::now();
        let (code, body) = http(addr, "GET", path, None).await;
        v.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(code, 200, "{path}");
        bytes = size(&body);
    }
    (v, bytes)
}

/// One host serving `n` jobs (one component, a sidecar name each), every one led: the
/// overview's first page, a name filter, and the leadership page; the page's weight.
pub(crate) async fn console(guests: &Path, rows: &mut Vec<Row>) {
    for (n, target_ms) in [(1_000usize, 100.0), (10_000, 500.0)] {
        eprintln!("console: {n} jobs on one host");
        let redis = RedisServer::start().await;
        let dir = TempDir::new("bench-console");
        let (jobs, cache) = jobs_dir(guests, &dir, n);
        let host = start_host(&redis, &jobs, &cache, 0);
        let addr = host.http_addr(Duration::from_secs(120)).await;
        super::wait_async("every job led", Duration::from_secs(600), || async {
            let ready = http(&addr, "GET", "/readyz", None).await.0 == 200;
            (ready && owners(&mut patient(&redis).await).await.len() == n).then_some(())
        })
        .await;
        let (mut page, html) = timed(&addr, "/ui").await;
        let (min, med, p99) = summary(&mut page);
        rows.push(row(
            &format!(
                "console overview, {n} jobs: GET /ui (the first page of 50), {REQUESTS} requests"
            ),
            format!("min {min:.1} / median {med:.1} / p99 {p99:.1} ms"),
            "-",
            &format!("< {target_ms:.0} ms"),
            Some(p99 < target_ms),
        ));
        let (mut filtered, _) = timed(&addr, &format!("/ui?q=bench-{:05}", n - 1)).await;
        let (_, fmed, fp99) = summary(&mut filtered);
        let (mut lead, _) = timed(&addr, "/ui/leadership").await;
        let (_, lmed, lp99) = summary(&mut lead);
        rows.push(row(
            &format!("console, {n} jobs: a name filter (one match) and the leadership page"),
            format!("filter median {fmed:.1} / p99 {fp99:.1} ms · leadership median {lmed:.1} / p99 {lp99:.1} ms"),
            "-",
            &format!("< {target_ms:.0} ms"),
            Some(fp99 < target_ms && lp99 < target_ms),
        ));
        if n == 1_000 {
            let (_, css) = timed(&addr, "/ui/assets/console.css").await;
            let (_, js) = timed(&addr, "/ui/assets/console.js").await;
            rows.push(row(
                "console overview page weight (HTML of 50 jobs + CSS + JS, uncompressed, no other request)",
                format!("{:.1} KiB + {:.1} KiB + {:.1} KiB", html as f64 / 1024.0, css as f64 / 1024.0, js as f64 / 1024.0),
                "-",
                "-",
                None,
            ));
        }
        drop(host);
    }
}
