//! Spreading client connections over the serving threads.
//!
//! Every serving thread accepts from the one listening socket, and the
//! kernel gives a connection to whichever thread asks first: under load a
//! burst of connections (a client pool opening, a load balancer
//! reconnecting) lands mostly on one thread, and a connection never moves
//! (docs/benchmarks-history.md, "Connections spread over the serving
//! threads": one thread did 2.8 times the other's work). So the thread
//! that accepts a connection serves it itself unless it already holds two
//! or more connections more than the least loaded thread; then it hands the
//! socket to that thread, which registers it with its own event loop. The
//! slack saves handing over connections that come and go. Load is counted
//! in open connections: a connection's cost over its life is not known
//! when it opens, and the count is what an operator sees
//! (`idem_gateway_connections{thread}`). A thread that has not yet taken
//! [`MAX_WAITING`] connections handed to it (it is busy with a long poll,
//! say) is handed no more, and one that stopped serving none at all: a
//! connection waiting in an inbox is not being served.
//!
//! Not a scheduler: a connection stays where it was placed, however busy
//! it turns out to be.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

/// Connections handed to a thread and not yet taken by it, past which it
/// is handed no more.
const MAX_WAITING: usize = 4;

/// What every serving thread holds and waits for, and the way to hand
/// each one a connection.
struct Threads {
    /// Open connections, those on their way to the thread included.
    open: Box<[AtomicUsize]>,
    /// Connections handed to the thread that it has not taken yet.
    waiting: Box<[AtomicUsize]>,
    /// Set once a hand-over found the thread's inbox closed.
    stopped: Box<[AtomicBool]>,
    gauges: Box<[metrics::Gauge]>,
    inboxes: Box<[UnboundedSender<Handed>]>,
}

impl Threads {
    fn opened(&self, thread: usize) {
        self.open[thread].fetch_add(1, Ordering::Relaxed);
        self.gauges[thread].increment(1.0);
    }

    fn closed(&self, thread: usize) {
        self.open[thread].fetch_sub(1, Ordering::Relaxed);
        self.gauges[thread].decrement(1.0);
    }
}

/// A connection's hold on its thread: its connection-limit permit and its
/// place in that thread's count, both given back when it is dropped (when
/// the connection ends).
pub(crate) struct Slot {
    _permit: OwnedSemaphorePermit,
    threads: Arc<Threads>,
    thread: usize,
}

impl Slot {
    fn new(permit: OwnedSemaphorePermit, threads: &Arc<Threads>, thread: usize) -> Slot {
        threads.opened(thread);
        Slot {
            _permit: permit,
            threads: threads.clone(),
            thread,
        }
    }

    fn move_to(&mut self, thread: usize) {
        self.threads.closed(self.thread);
        self.threads.opened(thread);
        self.thread = thread;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.threads.closed(self.thread);
    }
}

/// A connection on its way to another thread: out of the accepting
/// thread's event loop, not yet in the other's.
pub(crate) struct Handed {
    stream: std::net::TcpStream,
    peer: SocketAddr,
    slot: Slot,
}

/// A connection to serve on this thread.
pub(crate) struct Placed {
    pub(crate) stream: TcpStream,
    pub(crate) peer: SocketAddr,
    pub(crate) slot: Slot,
}

/// One serving thread's end of the spread: where its accepted connections
/// go, and the connections other threads hand it.
pub(crate) struct Spread {
    thread: usize,
    threads: Arc<Threads>,
    inbox: UnboundedReceiver<Handed>,
}

/// One [`Spread`] for each of `count` serving threads. The inboxes are
/// unbounded, but every connection in one holds a connection-limit
/// permit: together they hold no more than the limit.
pub(crate) fn spread(count: usize) -> Vec<Spread> {
    let (inboxes, receivers): (Vec<_>, Vec<_>) = (0..count).map(|_| unbounded_channel()).unzip();
    let threads = Arc::new(Threads {
        open: (0..count).map(|_| AtomicUsize::new(0)).collect(),
        waiting: (0..count).map(|_| AtomicUsize::new(0)).collect(),
        stopped: (0..count).map(|_| AtomicBool::new(false)).collect(),
        gauges: (0..count)
            .map(|i| metrics::gauge!("idem_gateway_connections", "thread" => i.to_string()))
            .collect(),
        inboxes: inboxes.into_boxed_slice(),
    });
    receivers
        .into_iter()
        .enumerate()
        .map(|(thread, inbox)| Spread {
            thread,
            threads: threads.clone(),
            inbox,
        })
        .collect()
}

impl Spread {
    /// Places a connection this thread accepted: `Some` to serve here,
    /// `None` once it is handed to the least loaded thread (or, if it
    /// could not be moved, closed).
    pub(crate) fn place(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        permit: OwnedSemaphorePermit,
    ) -> Option<Placed> {
        // A place in the target's inbox is reserved before the count
        // moves, so that threads placing at once cannot overfill it.
        let target = self
            .target()
            .filter(|&t| self.reserve(t))
            .unwrap_or(self.thread);
        let slot = Slot::new(permit, &self.threads, target);
        if target == self.thread {
            return Some(Placed { stream, peer, slot });
        }
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                self.threads.waiting[target].fetch_sub(1, Ordering::Relaxed);
                tracing::warn!(error = %e, "cannot hand a connection to another thread; closed");
                return None;
            }
        };
        let handed = Handed { stream, peer, slot };
        let Err(back) = self.threads.inboxes[target].send(handed) else {
            return None;
        };
        // That thread has stopped serving (shutdown, or it was lost).
        self.threads.waiting[target].fetch_sub(1, Ordering::Relaxed);
        self.threads.stopped[target].store(true, Ordering::Relaxed);
        let mut handed = back.0;
        handed.slot.move_to(self.thread);
        self.register(handed)
    }

    /// The next connection another thread hands this one, registered with
    /// this thread's event loop (`None` if that fails: it is closed).
    /// Waits forever when none comes: the other threads keep the senders.
    pub(crate) async fn handed(&mut self) -> Option<Placed> {
        let handed = self.inbox.recv().await?;
        self.threads.waiting[self.thread].fetch_sub(1, Ordering::Relaxed);
        self.register(handed)
    }

    /// Closes the inbox once this thread stops accepting; connections
    /// still in it (handed over in the same instant) are closed unserved,
    /// like those in the listening socket's backlog.
    pub(crate) fn close(&mut self) {
        self.threads.stopped[self.thread].store(true, Ordering::Relaxed);
        self.inbox.close();
        // Until the channel says no send is still on its way: one that
        // passed the closed check before `close` lands after it, and would
        // otherwise stay in the channel for good (its slot keeps the
        // channel alive).
        loop {
            match self.inbox.try_recv() {
                Ok(_closed) => {
                    self.threads.waiting[self.thread].fetch_sub(1, Ordering::Relaxed);
                }
                Err(TryRecvError::Empty) => std::hint::spin_loop(),
                Err(TryRecvError::Disconnected) => break,
            }
        }
    }

    /// Takes one of `thread`'s [`MAX_WAITING`] inbox places, if one is free.
    fn reserve(&self, thread: usize) -> bool {
        self.threads.waiting[thread]
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |w| {
                (w < MAX_WAITING).then_some(w + 1)
            })
            .is_ok()
    }

    fn register(&self, handed: Handed) -> Option<Placed> {
        let Handed { stream, peer, slot } = handed;
        match TcpStream::from_std(stream) {
            Ok(stream) => Some(Placed { stream, peer, slot }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot register a connection handed over; closed");
                None
            }
        }
    }

    /// Thread `thread`'s open connections.
    #[cfg(test)]
    fn open(&self, thread: usize) -> usize {
        self.threads.open[thread].load(Ordering::Relaxed)
    }

    /// Where a connection this thread accepted should go instead of here:
    /// the least loaded thread that is serving and has fewer than
    /// [`MAX_WAITING`] connections waiting for it, if this thread holds two
    /// or more connections more than it.
    fn target(&self) -> Option<usize> {
        let threads = &self.threads;
        let here = threads.open[self.thread].load(Ordering::Relaxed);
        let candidates = (0..threads.open.len()).filter(|&i| {
            i != self.thread
                && !threads.stopped[i].load(Ordering::Relaxed)
                && threads.waiting[i].load(Ordering::Relaxed) < MAX_WAITING
        });
        match candidates
            .map(|i| (i, threads.open[i].load(Ordering::Relaxed)))
            .min_by_key(|&(_, open)| open)
        {
            Some((least, fewest)) if here > fewest + 1 => Some(least),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Semaphore;

    use super::{MAX_WAITING, Placed, Spread, spread};

    /// A listener, and connections to it accepted and placed by thread 0
    /// of `spreads`; returns the client ends and what thread 0 kept.
    struct Burst {
        listener: TcpListener,
        slots: Arc<Semaphore>,
        clients: Vec<TcpStream>,
    }

    impl Burst {
        async fn new() -> Burst {
            Burst {
                listener: TcpListener::bind("127.0.0.1:0").await.unwrap(),
                slots: Arc::new(Semaphore::new(64)),
                clients: Vec::new(),
            }
        }

        /// One more connection, accepted by thread 0 and placed.
        async fn accept_on_0(&mut self, spreads: &[Spread]) -> Option<Placed> {
            let addr = self.listener.local_addr().unwrap();
            self.clients.push(TcpStream::connect(addr).await.unwrap());
            let (stream, peer) = self.listener.accept().await.unwrap();
            let permit = self.slots.clone().acquire_owned().await.unwrap();
            spreads[0].place(stream, peer, permit)
        }
    }

    async fn next_handed(s: &mut Spread) -> Placed {
        tokio::time::timeout(Duration::from_secs(5), s.handed())
            .await
            .expect("a connection handed over arrives")
            .expect("registered")
    }

    fn waiting(spreads: &[Spread]) -> Vec<usize> {
        let threads = &spreads[0].threads;
        threads
            .waiting
            .iter()
            .map(|w| w.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }

    fn stopped(spreads: &[Spread], thread: usize) -> bool {
        spreads[0].threads.stopped[thread].load(std::sync::atomic::Ordering::Relaxed)
    }

    fn open(spreads: &[Spread]) -> Vec<usize> {
        (0..spreads[0].threads.open.len())
            .map(|i| spreads[0].open(i))
            .collect()
    }

    /// Every connection accepted by thread 0 (the thread that woke first
    /// for a burst), the other threads taking what they are handed: thread
    /// 0 keeps a connection only while it holds at most one more than the
    /// least loaded thread, and each one handed on is registered and
    /// readable on the thread it reaches; closing them counts them off.
    #[tokio::test]
    async fn a_burst_accepted_by_one_thread_is_spread() {
        let mut burst = Burst::new().await;
        let mut spreads = spread(4);
        let mut placed = Vec::new();
        for _ in 0..32 {
            let before = open(&spreads);
            if let Some(kept) = burst.accept_on_0(&spreads).await {
                placed.push(kept);
                continue;
            }
            let to = (1..4)
                .find(|&i| open(&spreads)[i] > before[i])
                .expect("counted on the thread it went to");
            placed.push(next_handed(&mut spreads[to]).await);
        }
        let counts = open(&spreads);
        assert_eq!(counts.iter().sum::<usize>(), 32, "{counts:?}");
        let (most, fewest) = (counts.iter().max().unwrap(), counts.iter().min().unwrap());
        assert!(most - fewest <= 2, "spread: {counts:?}");
        assert!(
            counts[1..].iter().all(|&n| n > MAX_WAITING),
            "each thread took more than its inbox holds at once: {counts:?}"
        );
        assert_eq!(waiting(&spreads), vec![0; 4], "every hand-over taken");
        assert_eq!(burst.slots.available_permits(), 64 - 32, "a permit each");
        for c in &mut burst.clients {
            c.write_all(b"x").await.unwrap();
        }
        for p in &mut placed {
            let mut byte = [0u8; 1];
            p.stream.read_exact(&mut byte).await.unwrap();
            assert_eq!(&byte, b"x");
        }
        drop(placed);
        assert_eq!(open(&spreads).iter().sum::<usize>(), 0);
        assert_eq!(burst.slots.available_permits(), 64);
    }

    /// A thread that takes nothing (stuck in a long poll) is handed no
    /// more than `MAX_WAITING` connections; the accepting thread keeps the
    /// rest. Closing its inbox closes those waiting and gives back their
    /// permits and counts, and a thread whose inbox is closed is handed
    /// nothing more.
    #[tokio::test]
    async fn a_thread_that_takes_nothing_is_handed_little() {
        let mut burst = Burst::new().await;
        let mut spreads = spread(2);
        let mut kept = Vec::new();
        for _ in 0..(2 * MAX_WAITING + 8) {
            kept.extend(burst.accept_on_0(&spreads).await);
        }
        assert_eq!(spreads[0].open(1), MAX_WAITING, "handed, waiting");
        assert_eq!(kept.len(), MAX_WAITING + 8, "kept by thread 0");
        assert_eq!(waiting(&spreads), vec![0, MAX_WAITING]);
        spreads[1].close();
        assert_eq!(open(&spreads), vec![MAX_WAITING + 8, 0]);
        assert_eq!(waiting(&spreads), vec![0, 0]);
        assert!(stopped(&spreads, 1));
        assert_eq!(
            burst.slots.available_permits(),
            64 - (MAX_WAITING + 8),
            "the closed ones' permits are back"
        );
        for _ in 0..6 {
            kept.extend(burst.accept_on_0(&spreads).await);
        }
        assert_eq!(
            kept.len(),
            MAX_WAITING + 14,
            "all kept once thread 1 stopped"
        );
        assert_eq!(open(&spreads)[1], 0);
    }

    /// A thread lost without closing its inbox (a panic drops it): the
    /// hand-over that finds it gone serves the connection where it was
    /// accepted, and the thread is handed nothing after.
    #[tokio::test]
    async fn a_lost_thread_is_not_handed_connections() {
        let mut burst = Burst::new().await;
        let mut spreads = spread(2);
        drop(spreads.pop());
        let mut kept = Vec::new();
        for _ in 0..6 {
            kept.extend(burst.accept_on_0(&spreads).await);
        }
        assert_eq!(kept.len(), 6);
        assert_eq!(open(&spreads), vec![6, 0]);
        assert!(stopped(&spreads, 1), "marked once a hand-over failed");
        assert_eq!(waiting(&spreads), vec![0, 0]);
    }
}
