//! One proxied connection: the two pumps, and the fault applied to each
//! chunk.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::sync::watch;

use super::state::{Fault, Open, Shared};

/// How a connection ended.
enum End {
    /// A side closed or failed: close the other.
    Closed,
    /// Reset both sides.
    Reset,
}

/// Serves one client connection: waits out a freeze, swallows a black
/// hole, else connects upstream and pumps both ways until a side closes or
/// the proxy resets it.
pub(super) async fn serve(client: TcpStream, shared: Arc<Shared>, mut reset: watch::Receiver<u64>) {
    let _open = Open(shared.clone());
    let mut fault = shared.fault.subscribe();
    // A frozen proxy accepts and waits; a black hole swallows for good.
    loop {
        let now = *fault.borrow_and_update();
        match now {
            Fault::Freeze => {}
            Fault::BlackHole => return swallow(client, &shared, reset).await,
            _ => break,
        }
        tokio::select! {
            _ = fault.changed() => {}
            _ = reset.changed() => return rst(&shared, &client),
        }
    }
    let server = tokio::select! {
        s = TcpStream::connect(shared.upstream) => s,
        _ = reset.changed() => return rst(&shared, &client),
    };
    let Ok(server) = server else {
        // The server refuses: so does the proxy.
        return rst(&shared, &client);
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let swallowed = AtomicBool::new(false);
    let end = tokio::select! {
        e = pump(&mut cr, &mut sw, Direction::Up, &shared, &swallowed) => e,
        e = pump(&mut sr, &mut cw, Direction::Down, &shared, &swallowed) => e,
        _ = reset.changed() => End::Reset,
    };
    let (Ok(client), Ok(server)) = (cr.reunite(cw), sr.reunite(sw)) else {
        return;
    };
    if let End::Reset = end {
        rst(&shared, &client);
        zero_linger(&server);
    }
}

/// A black-holed connection: read and thrown away until reset or closed.
async fn swallow(mut client: TcpStream, shared: &Shared, mut reset: watch::Receiver<u64>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        tokio::select! {
            r = client.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => shared.traffic.send_modify(|t| {
                    t.read_up += n as u64;
                    t.dropped += n as u64;
                }),
            },
            _ = reset.changed() => return rst(shared, &client),
        }
    }
}

/// Sets `SO_LINGER` to zero, so that closing `stream` (when the caller
/// drops it) sends a RST.
fn rst(shared: &Shared, stream: &TcpStream) {
    zero_linger(stream);
    shared.traffic.send_modify(|t| t.resets += 1);
}

/// `SO_LINGER` zero. `set_linger` is deprecated because a non-zero linger
/// blocks the thread on close; zero does not. (`set_zero_linger` needs
/// tokio 1.50, above the workspace's floor.)
#[allow(deprecated)]
fn zero_linger(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Up,
    Down,
}

/// Copies `from` to `to` under the fault in force, chunk by chunk.
async fn pump(
    from: &mut OwnedReadHalf,
    to: &mut OwnedWriteHalf,
    direction: Direction,
    shared: &Shared,
    swallowed: &AtomicBool,
) -> End {
    let mut fault = shared.fault.subscribe();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return End::Closed,
            Ok(n) => n,
        };
        shared.traffic.send_modify(|t| match direction {
            Direction::Up => t.read_up += n as u64,
            Direction::Down => t.read_down += n as u64,
        });
        // Hold the chunk while the fault says so.
        let now = loop {
            let now = *fault.borrow_and_update();
            let held = match now {
                Fault::Freeze => true,
                Fault::HoldReplies => direction == Direction::Down,
                _ => false,
            };
            if !held {
                break now;
            }
            if fault.changed().await.is_err() {
                return End::Closed;
            }
        };
        if now == Fault::BlackHole {
            swallowed.store(true, Ordering::SeqCst);
        }
        if swallowed.load(Ordering::SeqCst) {
            shared.traffic.send_modify(|t| t.dropped += n as u64);
            continue;
        }
        if now == Fault::DropReplies && direction == Direction::Down {
            shared.traffic.send_modify(|t| t.dropped += n as u64);
            return End::Reset;
        }
        if let Fault::Delay(d) = now {
            tokio::time::sleep(d).await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return End::Closed;
        }
        shared.traffic.send_modify(|t| match direction {
            Direction::Up => t.sent_up += n as u64,
            Direction::Down => t.sent_down += n as u64,
        });
    }
}
