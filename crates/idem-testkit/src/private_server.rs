//! Store servers of a test's own, to crash and restart: the common part.
//!
//! [`PrivatePostgres`](crate::private_postgres::PrivatePostgres),
//! [`PrivateMariadb`](crate::private_mariadb::PrivateMariadb) and
//! [`RestartableRedis`](crate::restartable_redis::RestartableRedis) each
//! run one server from this machine's binaries, on a free port of
//! 127.0.0.1, with its data in a temporary directory removed afterwards.
//! They never touch the shared services on the standard ports.
//!
//! When the binaries are missing, `start` prints why and answers `None`,
//! so `cargo test` passes on a machine with only Rust; under CI (`CI`
//! set) it panics instead, as [`backend_url`](crate::backend_url) does:
//! CI may not skip. Binaries that are there but fail always panic.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// A server a test can crash and restart.
pub trait PrivateServer: Send + 'static {
    /// Its URL (user, port and database included).
    fn url(&self) -> String;

    /// Kills it as a crash would (no shutdown, no checkpoint, no flush of
    /// what the server itself buffers) and returns once it is gone.
    fn crash(&mut self);

    /// Starts it again on the same data and port, and returns once it
    /// accepts connections.
    fn restart(&mut self);
}

/// `None` after printing why the test skips, or a panic under CI.
pub(crate) fn unavailable<T>(what: &str, why: &str) -> Option<T> {
    if std::env::var_os("CI").is_some() {
        panic!("{what}: {why}; under CI the private-server tests may not skip");
    }
    eprintln!("skipped: {what}: {why}");
    None
}

/// The first of `names` found on `PATH` or in one of `dirs`.
pub(crate) fn find_binary(names: &[&str], dirs: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut places: Vec<PathBuf> = std::env::split_paths(&path).collect();
    places.extend(dirs.iter().map(PathBuf::from));
    names.iter().find_map(|name| {
        places
            .iter()
            .map(|dir| dir.join(name))
            .find(|p| p.is_file())
    })
}

/// Whether this process runs as root (the owner of `/proc/self` is the
/// effective user).
pub(crate) fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// The uid and gid of `user`, from `/etc/passwd`.
pub(crate) fn user_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == user).then_some(())?;
        let _password = fields.next()?;
        Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
    })
}

/// Waits until something accepts connections on 127.0.0.1:`port`.
///
/// # Panics
/// If `child` exits first, or after 60 s; with the tail of `log`.
pub(crate) fn wait_accepting(port: u16, mut child: Option<&mut Child>, log: &Path, what: &str) {
    let start = Instant::now();
    loop {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Some(child) = child.as_mut()
            && let Ok(Some(status)) = child.try_wait()
        {
            panic!(
                "{what} exited ({status}) before accepting connections:\n{}",
                tail(log)
            );
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what} did not accept connections in 60 s:\n{}",
            tail(log)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The last lines of a log file, for a panic message.
pub(crate) fn tail(log: &Path) -> String {
    let mut text = String::new();
    let _ = std::fs::File::open(log).and_then(|mut f| f.read_to_string(&mut text));
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
