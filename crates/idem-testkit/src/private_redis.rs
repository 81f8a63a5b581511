//! Test support: a private `redis-server` on its own port, for tests
//! that stop and restart Redis.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A `redis-server` child process on 127.0.0.1, killed on drop.
#[derive(Debug)]
pub struct PrivateRedis {
    child: Child,
    port: u16,
    scheme: &'static str,
}

impl PrivateRedis {
    /// Starts one on `port` with nothing persisted. `None` (after printing
    /// why) if `redis-server` cannot be run here.
    pub fn start(port: u16) -> Option<PrivateRedis> {
        PrivateRedis::spawn(port, "redis", &["--port", &port.to_string()])
    }

    /// Starts one that speaks only TLS on `port`, with the certificate and
    /// key in the PEM files given (clients are not asked for certificates).
    /// Its URL is `rediss://`. `None` (after printing why) if
    /// `redis-server` cannot be run here.
    pub fn start_tls(port: u16, cert: &Path, key: &Path, ca: &Path) -> Option<PrivateRedis> {
        let path = |p: &Path| p.display().to_string();
        PrivateRedis::spawn(
            port,
            "rediss",
            &[
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--tls-cert-file",
                &path(cert),
                "--tls-key-file",
                &path(key),
                "--tls-ca-cert-file",
                &path(ca),
                "--tls-auth-clients",
                "no",
            ],
        )
    }

    fn spawn(port: u16, scheme: &'static str, listen: &[&str]) -> Option<PrivateRedis> {
        let child = Command::new("redis-server")
            .args(listen)
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn();
        match child {
            Ok(child) => Some(PrivateRedis {
                child,
                port,
                scheme,
            }),
            Err(e) => {
                eprintln!("skipped: cannot start redis-server ({e})");
                None
            }
        }
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// Waits (up to 5 s) until it accepts connections.
    ///
    /// # Panics
    /// If it never does.
    pub fn wait_ready(&self) {
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("private redis-server did not start");
    }

    /// Stops it (SIGKILL) and waits for it to go.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port nobody listens on right now, and that this process has not
/// handed out before.
///
/// Taken from 10000-21999, below the kernel's range for outgoing
/// connections (32768 up here), so no client socket's source port takes it
/// between this call and the server binding it; and never the same port
/// twice in one process, so two tests running side by side cannot be given
/// one port (the kernel's `bind(0)` can hand a just-closed port out again,
/// and once gave a cluster test's node port to a plain Redis of another
/// test). A Redis Cluster node's bus port (port + 10000) falls below that
/// range too.
///
/// # Panics
/// If no port in the range can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 10_000;
    const COUNT: u32 = 12_000;
    // Starts at a place of its own per process, in case two test processes
    // ever run at once.
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % COUNT,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..COUNT {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % COUNT;
        let Ok(port) = u16::try_from(FIRST + offset) else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in {FIRST}..{}", FIRST + COUNT)
}
