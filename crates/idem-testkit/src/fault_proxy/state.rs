//! What the proxy and its connections share: the fault in force, the
//! traffic counts, the reset generation.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;

/// What the proxy does with the traffic. The default is [`Fault::Pass`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Fault {
    /// Forward both ways at once.
    #[default]
    Pass,
    /// Forward both ways, each chunk after waiting this long.
    Delay(Duration),
    /// Forward nothing either way. Sockets stay open and bytes wait (in the
    /// proxy or the kernel); they flow again, in order, when the fault
    /// ends. New connections are accepted and wait too. A network blip, a
    /// stalled server, a long fsync.
    Freeze,
    /// Forward requests, hold answers: [`Fault::Freeze`] one way. A
    /// request reaches the server and commits; its answer waits until the
    /// fault ends.
    HoldReplies,
    /// Forward requests; the first answer on each connection is thrown
    /// away and the connection is reset on both sides: the write
    /// committed, its answer is lost ("drop after the request reached the
    /// store").
    DropReplies,
    /// Accept connections and never forward nor answer: the bytes of every
    /// connection open now or accepted meanwhile are read and thrown away,
    /// and those connections stay dead after the fault ends (until
    /// [`FaultProxy::reset`](super::FaultProxy::reset) or their client closes them). Connections
    /// accepted after the fault ends work. A server that vanished without
    /// a word: a failover to another machine, a partition that outlives
    /// the sockets.
    BlackHole,
}

/// What went through the proxy since it started. `up` is client to
/// server, `down` server to client.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Traffic {
    /// Client connections accepted.
    pub accepted: u64,
    /// Client connections open now.
    pub open: u64,
    /// Bytes read from clients.
    pub read_up: u64,
    /// Bytes written to the server.
    pub sent_up: u64,
    /// Bytes read from the server.
    pub read_down: u64,
    /// Bytes written to clients.
    pub sent_down: u64,
    /// Bytes read and thrown away ([`Fault::DropReplies`],
    /// [`Fault::BlackHole`]).
    pub dropped: u64,
    /// Connections reset by the proxy (both sides count as one).
    pub resets: u64,
}

#[derive(Debug)]
pub(super) struct Shared {
    pub(super) upstream: SocketAddr,
    pub(super) fault: watch::Sender<Fault>,
    pub(super) traffic: watch::Sender<Traffic>,
    /// Bumped by [`FaultProxy::reset`](super::FaultProxy::reset): connections open before reset.
    pub(super) generation: watch::Sender<u64>,
    /// Each connection's task and the generation it started in.
    pub(super) conns: Mutex<Vec<(u64, JoinHandle<()>)>>,
}

/// Counts the connection as closed when dropped (also when aborted).
pub(super) struct Open(pub(super) Arc<Shared>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.traffic.send_modify(|t| t.open -= 1);
    }
}
