//! The lease runtime: a thread of its own with a single-threaded tokio runtime, on which the
//! electors, the heartbeat and their Redis connection run, so that renewals never wait behind
//! guest execution or step writes (see [`crate::coord::elector`]).

/// A dedicated thread running a single-threaded tokio runtime for the electors.
pub struct LeaseRuntime {
    handle: tokio::runtime::Handle,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LeaseRuntime {
    /// Starts the thread.
    pub fn start() -> std::io::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("leases".into())
            .spawn(move || {
                rt.block_on(async {
                    let _ = stopped.await;
                });
            })?;
        Ok(LeaseRuntime {
            handle,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// The runtime's handle, to spawn electors (and their connection) on.
    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.handle
    }
}

impl Drop for LeaseRuntime {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
