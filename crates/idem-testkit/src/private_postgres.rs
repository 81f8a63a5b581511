//! A PostgreSQL server of a test's own: `initdb` in a temporary directory,
//! `pg_ctl start` on a free port, `pg_ctl -m immediate stop` as a crash,
//! and a restart on the same data directory (which replays the WAL).
//!
//! As root it runs the server as the `postgres` user (PostgreSQL refuses
//! root), through `runuser`. See [`private_server`](crate::private_server)
//! for when it skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

use crate::private_redis::free_port;
use crate::private_server::{PrivateServer, find_binary, is_root, tail, unavailable, user_ids};

/// A private PostgreSQL, stopped at once (immediate mode) when dropped.
#[derive(Debug)]
pub struct PrivatePostgres {
    dir: TempDir,
    bin: PathBuf,
    port: u16,
    /// Run the tools as `postgres` (we are root).
    as_postgres: bool,
    running: bool,
}

impl PrivatePostgres {
    /// Creates a cluster (trust authentication, user `postgres`) and
    /// starts it. `None` after printing why when `initdb` or `pg_ctl` is
    /// missing (a panic under CI).
    ///
    /// # Panics
    /// If the tools are there but fail, with their output.
    pub fn start() -> Option<PrivatePostgres> {
        const WHAT: &str = "private PostgreSQL";
        let Some(bin) = bindir() else {
            return unavailable(
                WHAT,
                "initdb and pg_ctl not found (PATH, /usr/lib/postgresql/*/bin)",
            );
        };
        let dir = tempfile::Builder::new()
            .prefix("idem-pg-")
            .tempdir()
            .unwrap_or_else(|e| panic!("{WHAT}: temporary directory: {e}"));
        let as_postgres = is_root();
        if as_postgres {
            let Some((uid, gid)) = user_ids("postgres") else {
                return unavailable(WHAT, "running as root and there is no postgres user");
            };
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("{WHAT}: chown the data directory: {e}"));
        }
        let server = PrivatePostgres {
            port: free_port(),
            dir,
            bin,
            as_postgres,
            running: false,
        };
        let data = server.data();
        let out = server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
        );
        assert!(
            out.status.success(),
            "{WHAT}: initdb failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut server = server;
        server.restart();
        Some(server)
    }

    fn data(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    /// Runs one of the server's tools, as `postgres` when we are root.
    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let tool = self.bin.join(tool);
        let mut command = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&tool);
            c
        } else {
            Command::new(&tool)
        };
        command
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .unwrap_or_else(|e| panic!("private PostgreSQL: cannot run {}: {e}", tool.display()))
    }

    fn pg_ctl_stop(&mut self, mode: &str) -> Output {
        self.running = false;
        self.run("pg_ctl", &["-D", &self.data(), "-m", mode, "-w", "stop"])
    }
}

impl PrivateServer for PrivatePostgres {
    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl -m immediate stop`: every server process quits at once,
    /// without a checkpoint; the next start recovers from the WAL.
    fn crash(&mut self) {
        let out = self.pg_ctl_stop("immediate");
        assert!(
            out.status.success(),
            "private PostgreSQL: pg_ctl stop failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
    }

    /// `pg_ctl start -w` on the same data directory and port.
    fn restart(&mut self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=60",
            self.port,
            self.dir.path().display()
        );
        let log = self.log().display().to_string();
        let out = self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data(),
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "-o",
                &options,
                "start",
            ],
        );
        assert!(
            out.status.success(),
            "private PostgreSQL: pg_ctl start failed: {}\n{}",
            String::from_utf8_lossy(&out.stderr),
            tail(&self.log())
        );
        self.running = true;
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if self.running {
            let _ = self.pg_ctl_stop("immediate");
        }
    }
}

/// Where `initdb` and `pg_ctl` are: `PATH`, else the newest
/// `/usr/lib/postgresql/*/bin` (Debian's layout).
fn bindir() -> Option<PathBuf> {
    if let Some(initdb) = find_binary(&["initdb"], &[])
        && let Some(dir) = initdb.parent()
        && dir.join("pg_ctl").is_file()
    {
        return Some(dir.to_owned());
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|e| {
            let version = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            has_tools(&bin).then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

fn has_tools(bin: &Path) -> bool {
    bin.join("initdb").is_file() && bin.join("pg_ctl").is_file()
}
