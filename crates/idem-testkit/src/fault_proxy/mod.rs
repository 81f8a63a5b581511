//! A TCP proxy between a store and its real server that misbehaves on
//! demand: the network faults of the store fault tests (issue 36).
//!
//! ```ignore
//! let proxy = FaultProxy::to_url("postgres://postgres@127.0.0.1:5432/test").await;
//! let store = PostgresStore::connect(&proxy.url("postgres://postgres@127.0.0.1:5432/test")).await?;
//! proxy.set(Fault::HoldReplies); // the next statement commits, its answer waits
//! proxy.reset().await;           // every open connection gets a TCP RST now
//! proxy.set(Fault::Pass);
//! ```
//!
//! The proxy listens on `127.0.0.1` on a free port and opens one upstream
//! connection per accepted client connection. What it does with the bytes
//! is a [`Fault`], changed at run time with [`FaultProxy::set`];
//! [`FaultProxy::reset`] resets every open connection at once. It counts
//! connections and bytes ([`Traffic`]), and a test waits on those counts
//! ([`FaultProxy::wait_until`]), never on a sleep: "the claim's bytes are
//! held in the proxy" is `read_up > sent_up`.
//!
//! Only tokio and safe code: a reset is `SO_LINGER` zero and a close.
//! One upstream address per proxy: a Redis Cluster, whose nodes redirect
//! clients to other addresses, is not proxied by it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

mod connection;
mod state;
mod url;

pub use state::{Fault, Traffic};
pub use url::{rewrite_url, url_target};

use state::Shared;

/// A running proxy, stopped (every connection closed) when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl FaultProxy {
    /// A proxy to `upstream`, passing traffic.
    ///
    /// # Panics
    /// If no port can be bound on 127.0.0.1.
    pub async fn start(upstream: SocketAddr) -> FaultProxy {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("fault proxy: bind: {e}"));
        let addr = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("fault proxy: local address: {e}"));
        let shared = Arc::new(Shared {
            upstream,
            fault: watch::Sender::new(Fault::Pass),
            traffic: watch::Sender::new(Traffic::default()),
            generation: watch::Sender::new(0),
            conns: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept_loop(listener, shared.clone()));
        FaultProxy {
            addr,
            shared,
            accept,
        }
    }

    /// A proxy to the server `url` names (`scheme://[user@]host[:port]/...`;
    /// without a port, the scheme's: PostgreSQL 5432, Redis 6379, MySQL
    /// 3306).
    ///
    /// # Panics
    /// If the URL names no host this machine can resolve.
    pub async fn to_url(url: &str) -> FaultProxy {
        let (host, port) =
            url_target(url).unwrap_or_else(|| panic!("fault proxy: no host:port in the URL"));
        let upstream = tokio::net::lookup_host((host.as_str(), port))
            .await
            .ok()
            .and_then(|mut addrs| addrs.next())
            .unwrap_or_else(|| panic!("fault proxy: cannot resolve {host}:{port}"));
        FaultProxy::start(upstream).await
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `url` with its host and port replaced by the proxy's: the same
    /// server, user, database and options, through the proxy.
    ///
    /// # Panics
    /// If the URL has no `scheme://host` part.
    pub fn url(&self, url: &str) -> String {
        rewrite_url(url, self.addr)
            .unwrap_or_else(|| panic!("fault proxy: no host:port in the URL"))
    }

    /// From now on, do `fault` (a held chunk is released, dropped or
    /// forwarded by the new fault at once).
    pub fn set(&self, fault: Fault) {
        self.shared.fault.send_replace(fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        *self.shared.fault.borrow()
    }

    /// Resets every connection open now on both sides (TCP RST, no FIN)
    /// and returns once they are closed. The fault in force stays; clients
    /// that connect afterwards get it.
    pub async fn reset(&self) {
        self.shared.generation.send_modify(|g| *g += 1);
        let now = *self.shared.generation.borrow();
        let older: Vec<JoinHandle<()>> = {
            let mut conns = self
                .shared
                .conns
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let (older, newer) = std::mem::take(&mut *conns)
                .into_iter()
                .partition(|(g, _)| *g < now);
            *conns = newer;
            older.into_iter().map(|(_, h)| h).collect()
        };
        for handle in older {
            let _ = handle.await;
        }
    }

    /// What went through so far.
    pub fn traffic(&self) -> Traffic {
        *self.shared.traffic.borrow()
    }

    /// Waits until `done` holds for the traffic counts and returns them.
    ///
    /// # Panics
    /// After 20 s without it holding, naming `what`: the event never came.
    pub async fn wait_until(&self, what: &str, done: impl FnMut(&Traffic) -> bool) -> Traffic {
        let mut rx = self.shared.traffic.subscribe();
        match tokio::time::timeout(Duration::from_secs(20), rx.wait_for(done)).await {
            Ok(Ok(t)) => *t,
            _ => panic!(
                "fault proxy: waited 20 s for {what}; traffic {:?}",
                self.traffic()
            ),
        }
    }

    /// Waits until the proxy holds request bytes it has not forwarded (a
    /// [`Fault::Freeze`] caught a call), and returns the counts.
    pub async fn wait_request_held(&self) -> Traffic {
        self.wait_until("a request held in the proxy", |t| t.read_up > t.sent_up)
            .await
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        let conns = self
            .shared
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for (_, handle) in conns.iter() {
            handle.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        shared.traffic.send_modify(|t| {
            t.accepted += 1;
            t.open += 1;
        });
        // Under the lock, so that a reset either sees this connection in
        // the list or has bumped the generation before it subscribed.
        let mut conns = shared
            .conns
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let reset = shared.generation.subscribe();
        let generation = *reset.borrow();
        let task = tokio::spawn(connection::serve(client, shared.clone(), reset));
        conns.retain(|(_, h)| !h.is_finished());
        conns.push((generation, task));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// An echo server: what it reads, it writes back.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = listener.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn roundtrip(c: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        c.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        c.read_exact(&mut got).await?;
        Ok(got)
    }

    #[tokio::test]
    async fn each_fault_does_what_it_says() {
        let proxy = FaultProxy::start(echo().await).await;
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut c, b"pass").await.unwrap(), b"pass");

        // Freeze: the bytes wait in the proxy, then flow in order.
        proxy.set(Fault::Freeze);
        c.write_all(b"held").await.unwrap();
        proxy.wait_request_held().await;
        proxy.set(Fault::Pass);
        let mut got = [0u8; 4];
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"held");

        // Hold replies: the request reaches the server, the answer waits.
        proxy.set(Fault::HoldReplies);
        let before = proxy.traffic();
        c.write_all(b"late").await.unwrap();
        proxy
            .wait_until("the echo read back", |t| {
                t.read_down >= before.read_down + 4
            })
            .await;
        assert_eq!(proxy.traffic().sent_down, before.sent_down);
        proxy.set(Fault::Pass);
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"late");

        // Drop replies: the request arrives, the answer is lost, the
        // connection is reset.
        proxy.set(Fault::DropReplies);
        let e = roundtrip(&mut c, b"lost").await.unwrap_err();
        assert!(
            matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::UnexpectedEof
            ),
            "{e:?}"
        );
        assert!(proxy.traffic().dropped >= 4);

        // Reset: every open connection at once, new ones work.
        proxy.set(Fault::Pass);
        let mut a = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut a, b"a").await.unwrap(), b"a");
        proxy.reset().await;
        let mut buf = [0u8; 1];
        let r = a.read(&mut buf).await;
        assert!(
            r.as_ref()
                .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "{r:?}"
        );
        let mut b = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut b, b"b").await.unwrap(), b"b");

        // Black hole: nothing answers, and those connections stay dead.
        proxy.set(Fault::BlackHole);
        let mut d = TcpStream::connect(proxy.addr()).await.unwrap();
        d.write_all(b"void").await.unwrap();
        b.write_all(b"void").await.unwrap();
        proxy
            .wait_until("both swallowed", |t| t.dropped >= 4 + 8)
            .await;
        proxy.set(Fault::Pass);
        let mut e = TcpStream::connect(proxy.addr()).await.unwrap();
        assert_eq!(roundtrip(&mut e, b"e").await.unwrap(), b"e");
        let sent = proxy.traffic().sent_up;
        b.write_all(b"x").await.unwrap();
        proxy
            .wait_until("b's byte swallowed", |t| t.dropped >= 13)
            .await;
        assert_eq!(proxy.traffic().sent_up, sent);

        // Delay: each chunk waits.
        proxy.set(Fault::Delay(Duration::from_millis(50)));
        let start = std::time::Instant::now();
        assert_eq!(roundtrip(&mut e, b"slow").await.unwrap(), b"slow");
        assert!(start.elapsed() >= Duration::from_millis(100));
    }

    #[tokio::test]
    async fn a_refusing_server_is_a_reset() {
        let gone = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        };
        let proxy = FaultProxy::start(gone).await;
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        let mut buf = [0u8; 1];
        let r = c.read(&mut buf).await;
        assert!(r.is_err() || r.is_ok_and(|n| n == 0));
        proxy.wait_until("closed", |t| t.open == 0).await;
    }
}
