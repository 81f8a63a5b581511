//! A MariaDB server of a test's own: `mariadb-install-db` into a temporary
//! directory, `mariadbd` on a free port with its socket, pid file and log
//! there, SIGKILL as a crash, and a restart on the same data directory
//! (InnoDB recovers from its redo log). User `root` without a password.
//!
//! MySQL's `mysqld` and `mysql_install_db` are used when MariaDB's names
//! are missing. As root, the server runs as root (`--user=root`). See
//! [`private_server`](crate::private_server) for when it skips.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use tempfile::TempDir;

use crate::private_redis::free_port;
use crate::private_server::{PrivateServer, find_binary, is_root, unavailable, wait_accepting};

const WHAT: &str = "private MariaDB";

/// A private `mariadbd`, killed when dropped.
#[derive(Debug)]
pub struct PrivateMariadb {
    dir: TempDir,
    server: PathBuf,
    port: u16,
    child: Option<Child>,
}

impl PrivateMariadb {
    /// Creates a data directory and starts the server on it. `None` after
    /// printing why when the binaries are missing (a panic under CI).
    ///
    /// # Panics
    /// If the binaries are there but fail, with their output.
    pub fn start() -> Option<PrivateMariadb> {
        let sbin = ["/usr/sbin", "/usr/local/sbin", "/usr/local/mysql/bin"];
        let Some(server) = find_binary(&["mariadbd", "mysqld"], &sbin) else {
            return unavailable(WHAT, "mariadbd (or mysqld) not found");
        };
        let Some(install) = find_binary(&["mariadb-install-db", "mysql_install_db"], &sbin) else {
            return unavailable(WHAT, "mariadb-install-db (or mysql_install_db) not found");
        };
        let dir = tempfile::Builder::new()
            .prefix("idem-mariadb-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{WHAT}: temporary directory: {e}"));
        let mut command = Command::new(&install);
        command.args([
            "--no-defaults",
            &format!("--datadir={}", dir.path().join("data").display()),
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
        ]);
        if is_root() {
            command.arg("--user=root");
        }
        let out = command
            .output()
            .unwrap_or_else(|e| panic!("{WHAT}: cannot run {}: {e}", install.display()));
        assert!(
            out.status.success(),
            "{WHAT}: {} failed: {}{}",
            install.display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut db = PrivateMariadb {
            dir,
            server,
            port: free_port(),
            child: None,
        };
        db.restart();
        Some(db)
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }
}

impl PrivateServer for PrivateMariadb {
    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }

    /// SIGKILL: no shutdown, no flush of InnoDB's buffer pool.
    fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn restart(&mut self) {
        let path = |name: &str| self.dir.path().join(name).display().to_string();
        let mut command = Command::new(&self.server);
        command
            .args([
                "--no-defaults".to_owned(),
                format!("--datadir={}", path("data")),
                format!("--port={}", self.port),
                "--bind-address=127.0.0.1".to_owned(),
                format!("--socket={}", path("mysqld.sock")),
                format!("--pid-file={}", path("mysqld.pid")),
                format!("--log-error={}", path("error.log")),
                "--skip-log-bin".to_owned(),
                "--innodb-buffer-pool-size=32M".to_owned(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() {
            command.arg("--user=root");
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{WHAT}: cannot run {}: {e}", self.server.display()));
        wait_accepting(self.port, Some(&mut child), &self.log(), WHAT);
        self.child = Some(child);
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        self.crash();
    }
}
