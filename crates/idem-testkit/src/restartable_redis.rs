//! A `redis-server` of a test's own that keeps its data directory across
//! a crash (SIGKILL) and a restart on the same port: with the append-only
//! file fsynced on every write ([`RestartableRedis::with_aof`]), or with
//! nothing persisted ([`RestartableRedis::in_memory`], which comes back
//! empty). See [`private_server`](crate::private_server) for when it skips;
//! [`private_redis`](crate::private_redis) has the simpler one-shot server.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use crate::private_redis::free_port;
use crate::private_server::{PrivateServer, find_binary, unavailable, wait_accepting};

const WHAT: &str = "private redis-server";

/// A private `redis-server`, killed when dropped.
#[derive(Debug)]
pub struct RestartableRedis {
    dir: TempDir,
    server: PathBuf,
    port: u16,
    durable: bool,
    child: Option<Child>,
}

impl RestartableRedis {
    /// One with `appendonly yes` and `appendfsync always`: every write is
    /// in the append-only file, fsynced, before Redis answers; a restart
    /// loads it. `None` after printing why when `redis-server` is missing
    /// (a panic under CI).
    pub fn with_aof() -> Option<RestartableRedis> {
        RestartableRedis::start(true)
    }

    /// One that keeps nothing (`appendonly no`, no snapshots): a restart
    /// comes back empty.
    pub fn in_memory() -> Option<RestartableRedis> {
        RestartableRedis::start(false)
    }

    fn start(durable: bool) -> Option<RestartableRedis> {
        let Some(server) = find_binary(&["redis-server"], &["/usr/sbin", "/usr/local/bin"]) else {
            return unavailable(WHAT, "redis-server not found");
        };
        let dir = tempfile::Builder::new()
            .prefix("idem-redis-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{WHAT}: temporary directory: {e}"));
        let mut redis = RestartableRedis {
            dir,
            server,
            port: free_port(),
            durable,
            child: None,
        };
        redis.restart();
        Some(redis)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }
}

impl PrivateServer for RestartableRedis {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL.
    fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn restart(&mut self) {
        let (appendonly, fsync) = if self.durable {
            ("yes", "always")
        } else {
            ("no", "everysec")
        };
        let mut child = Command::new(&self.server)
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", appendonly, "--appendfsync", fsync])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{WHAT}: cannot run {}: {e}", self.server.display()));
        wait_accepting(self.port, Some(&mut child), &self.log(), WHAT);
        self.child = Some(child);
    }
}

impl Drop for RestartableRedis {
    fn drop(&mut self) {
        self.crash();
    }
}
