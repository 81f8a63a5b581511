//! Plain TCP: the step every other one builds on.

use std::io;

use tokio::net::TcpStream;

use crate::accept::{Accept, Accepted, Connecting};
use crate::stall::StallGuard;

/// Plain TCP, with the gateway's per-socket settings: `TCP_NODELAY`
/// (answers go out as hyper writes them, not held back for more), and a
/// [`StallGuard`] with the
/// [`stall_timeout`](crate::ConnectionLimits::stall_timeout) around the
/// socket.
///
/// The gateway's default step; [`RustlsAcceptor::new`](crate::RustlsAcceptor::new)
/// puts TLS over it. Setting it up never waits and never fails (a socket
/// that refuses `TCP_NODELAY` is served without it).
#[derive(Debug, Clone, Copy)]
pub struct TcpAcceptor {
    nodelay: bool,
}

impl TcpAcceptor {
    /// Plain TCP with `TCP_NODELAY`.
    pub fn new() -> TcpAcceptor {
        TcpAcceptor { nodelay: true }
    }

    /// Whether `TCP_NODELAY` is set on every socket (default `true`).
    pub fn nodelay(mut self, nodelay: bool) -> TcpAcceptor {
        self.nodelay = nodelay;
        self
    }
}

impl Default for TcpAcceptor {
    /// [`TcpAcceptor::new`].
    fn default() -> TcpAcceptor {
        TcpAcceptor::new()
    }
}

impl Accept for TcpAcceptor {
    type Io = StallGuard<TcpStream>;

    async fn accept(
        &self,
        stream: TcpStream,
        conn: &Connecting,
    ) -> io::Result<Accepted<StallGuard<TcpStream>>> {
        if self.nodelay {
            // Only a socket already gone refuses it; serving it finds out.
            let _ = stream.set_nodelay(true);
        }
        Ok(Accepted::new(StallGuard::new(
            stream,
            conn.limits().stall_timeout,
        )))
    }

    fn is_tls(&self) -> bool {
        false
    }
}
