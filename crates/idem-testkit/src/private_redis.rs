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

/// A port nobody listens on right now.
///
/// # Panics
/// If no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}
