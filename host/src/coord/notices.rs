//! Notices over pub/sub: a job's release channel wakes its followers' electors at once (a
//! graceful hand-over costs a round trip, not a lease expiry), its notice channel wakes its
//! runner, and the work channel wakes task workers. One listener per host subscribes to every
//! job with patterns; a lost subscription only delays (followers fall back to lease expiry,
//! runners and workers to their polls).

use std::time::Duration;

use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;
use tracing::warn;

pub use crate::store::notice::{Notice, NoticeFor, ReleaseNotices};

/// Subscribes to every job's release and notice channels and wakes what is registered for the
/// channel in `jobs` on each message, until `stop` is cancelled. Reconnects after a lost
/// connection (meanwhile followers fall back to lease expiry, runners to their poll), to the
/// next of `clients` (a cluster's seed nodes: a subscription on any node of a cluster hears
/// every `PUBLISH`).
pub async fn listen_for_releases(
    clients: crate::store::PubSubSource,
    jobs: ReleaseNotices,
    stop: CancellationToken,
) {
    let mut warned = false;
    let mut next = 0;
    while !stop.is_cancelled() {
        let attempt = next;
        next += 1;
        let listen = async {
            let client = clients.client(attempt, Duration::from_secs(5)).await?;
            let mut pubsub = client.get_async_pubsub().await?;
            // One pattern for every job, so jobs added later need no new subscription.
            pubsub
                .psubscribe(crate::store::keys::RELEASED_PATTERN)
                .await?;
            pubsub
                .psubscribe(crate::store::keys::NOTICE_PATTERN)
                .await?;
            pubsub.psubscribe(crate::store::keys::WORK_PATTERN).await?;
            warned = false;
            let mut messages = pubsub.on_message();
            while let Some(msg) = messages.next().await {
                let notice = jobs
                    .lock()
                    .expect("release notices")
                    .get(msg.get_channel_name())
                    .cloned();
                if let Some(n) = notice {
                    if let Some(payload) = &n.payload
                        && let Ok(text) = msg.get_payload::<String>()
                    {
                        *payload.lock().expect("notice payload") = text;
                    }
                    n.wake.notify_one();
                }
            }
            Ok::<_, redis::RedisError>(())
        };
        tokio::select! {
            r = listen => {
                if !warned {
                    warn!("release notices interrupted ({}); followers fall back to lease expiry until reconnected",
                        r.err().map(|e| e.to_string()).unwrap_or_else(|| "connection closed".into()));
                    warned = true;
                }
            }
            _ = stop.cancelled() => return,
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            _ = stop.cancelled() => return,
        }
    }
}
