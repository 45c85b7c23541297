//! A fault proxy between one host and Redis: every byte the host and Redis exchange passes
//! through it, and a test can change what happens to them at any time.
//!
//! Faults act like a network, never like a corrupting cable: bytes are delayed or held, never
//! dropped from the middle of a stream. A blackhole holds everything and, when healed, resets
//! the connections that were cut off (TCP would have given up on them).

use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with the bytes it carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fault {
    /// Forward at once.
    None,
    /// Forward after this delay (each direction).
    Latency(Duration),
    /// Hold every byte until the fault changes; then deliver them (hold-then-release).
    Hold,
    /// Cut off: hold every byte; healing resets the connections instead of delivering.
    Blackhole,
    /// Replies lost: forward what clients send, hold what the server answers; healing resets
    /// the connections instead of delivering (a request applied whose answer never came).
    DropReplies,
}

/// A proxy listening on its own port and forwarding to `127.0.0.1:<target>`.
pub(crate) struct FaultProxy {
    /// The port hosts connect to.
    pub port: u16,
    fault: watch::Sender<Fault>,
    target: Arc<AtomicU16>,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts forwarding to `target`.
    pub(crate) async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (fault, _) = watch::channel(Fault::None);
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let target = Arc::new(AtomicU16::new(target));
        let (tx, list, to) = (fault.clone(), conns.clone(), target.clone());
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let port = to.load(Ordering::SeqCst);
                let Ok(server) = TcpStream::connect(("127.0.0.1", port)).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                let up = tokio::spawn(pump(cr, sw, tx.subscribe(), false));
                let down = tokio::spawn(pump(sr, cw, tx.subscribe(), true));
                let mut l = list.lock().unwrap();
                l.retain(|h| !h.is_finished());
                l.push(up);
                l.push(down);
            }
        });
        FaultProxy {
            port,
            fault,
            target,
            conns,
            accept,
        }
    }

    /// `redis://127.0.0.1:<proxy port>`.
    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Changes the fault. Leaving a blackhole (or lost replies) resets every connection it cut
    /// off.
    pub(crate) fn set(&self, fault: Fault) {
        let was = self.fault.send_replace(fault);
        if matches!(was, Fault::Blackhole | Fault::DropReplies) && fault != was {
            self.reset();
        }
    }

    /// Forwards new connections to `target` from now on and resets the open ones: what a
    /// failover behind a virtual address looks like to a client.
    pub(crate) fn retarget(&self, target: u16) {
        self.target.store(target, Ordering::SeqCst);
        self.reset();
    }

    /// Closes every open connection now (requests in flight get no answer); new connections
    /// are accepted as before.
    pub(crate) fn reset(&self) {
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        for h in self.conns.lock().unwrap().drain(..) {
            h.abort();
        }
    }
}

/// Copies `from` to `to` under the current fault; `replies` is the server-to-client direction.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
    replies: bool,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        loop {
            let current = *fault.borrow_and_update();
            match current {
                Fault::None => break,
                Fault::DropReplies if !replies => break,
                Fault::Latency(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Fault::Hold | Fault::Blackhole | Fault::DropReplies => {
                    if fault.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
