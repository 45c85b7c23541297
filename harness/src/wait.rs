//! Waiting with limits: a whole-test deadline, and polling a condition until it holds.

use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `test` with a whole-test deadline; panics when `limit` is exceeded.
pub async fn deadline<F: Future<Output = ()>>(limit: Duration, test: F) {
    if tokio::time::timeout(limit, test).await.is_err() {
        panic!("test exceeded its deadline of {limit:?}");
    }
}

/// Polls `probe` every 20 ms until it returns `Some`, or panics after `limit` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
