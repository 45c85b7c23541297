//! Waiting with limits: a whole-test deadline, and polling a condition until it holds. Every
//! wait of the tests, the benchmarks and the demo goes through [`poll_until`].

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

/// Runs `test` with a whole-test deadline; panics when `limit` is exceeded.
pub async fn deadline<F: Future<Output = ()>>(limit: Duration, test: F) {
    if tokio::time::timeout(limit, test).await.is_err() {
        panic!("test exceeded its deadline of {limit:?}");
    }
}

/// A condition did not hold within its limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimedOut {
    /// What was waited for.
    pub what: String,
    /// The limit.
    pub after: Duration,
}

impl fmt::Display for TimedOut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "timed out after {:?} waiting for {}",
            self.after, self.what
        )
    }
}

impl std::error::Error for TimedOut {}

/// Polls `probe` every `every` until it returns `Some`, or gives up after `limit`.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    limit: Duration,
    every: Duration,
    mut probe: F,
) -> Result<T, TimedOut>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = probe().await {
            return Ok(v);
        }
        if start.elapsed() > limit {
            return Err(TimedOut {
                what: what.to_string(),
                after: limit,
            });
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `probe` every 20 ms until it returns `Some`, or panics after `limit` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_until(what, limit, Duration::from_millis(20), probe)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}
