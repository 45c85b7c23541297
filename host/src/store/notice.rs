//! What a host registers to be woken by its store's notices, whichever the store: the wake-up
//! and last payload of each channel ([`Notice`]), by the Redis channel's name
//! ([`ReleaseNotices`]), and whom a notice is for ([`NoticeFor`]). The Redis listener is
//! `crate::coord::notices`; the etcd one `store/etcd/notices.rs`.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::Notify;

/// Notices by channel: each job's release channel (`lh:{job}:released`, waking its elector) and
/// notice channel (`lh:{job}:notify`, waking its runner); jobs come and go while the listener
/// runs.
pub type ReleaseNotices = Arc<std::sync::Mutex<HashMap<String, Notice>>>;

/// What a message on one channel does: wake `wake`, and keep the message's payload in
/// `payload` when there is one (a release notice names the owner that released).
#[derive(Clone)]
pub struct Notice {
    /// Woken (`notify_one`) on each message.
    pub wake: Arc<Notify>,
    /// The last message's payload.
    pub payload: Option<Arc<std::sync::Mutex<String>>>,
}

impl Notice {
    /// A notice that only wakes.
    pub fn wake(wake: Arc<Notify>) -> Self {
        Notice {
            wake,
            payload: None,
        }
    }

    /// A notice that wakes and keeps the last payload (a job's release channel).
    pub fn with_payload() -> Self {
        Notice {
            wake: Arc::new(Notify::new()),
            payload: Some(Arc::default()),
        }
    }
}

/// Whom a notice about a job is for, besides its followers (who hear its release): its runner
/// (an operator's request, a pause, a member's ask: the job's notice channel, `lh:{job}:notify`)
/// or its task workers (tasks queued: the work channel, `lh:{job}:work`). A store's listener
/// wakes what [`ReleaseNotices`] registers under that channel's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeFor {
    /// The job's runner.
    Runner,
    /// The job's task workers.
    Workers,
}

impl NoticeFor {
    /// The channel the host's notices are registered under for `keys`' job.
    pub fn channel(self, keys: &super::keys::JobKeys) -> String {
        match self {
            NoticeFor::Runner => keys.notice_channel(),
            NoticeFor::Workers => keys.work_channel(),
        }
    }
}
