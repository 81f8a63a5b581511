//! A small filesystem of a test's own, to fill up or make read-only: a
//! `tmpfs` mounted on a temporary directory (root only), unmounted when
//! dropped.
//!
//! When it cannot be mounted (not root, no `mount`), [`Tmpfs::mount`]
//! prints why and answers `None`; under CI (`CI` set) it panics instead,
//! as every private server does (see
//! [`private_server`](crate::private_server)).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use crate::private_server::unavailable;

/// A mounted `tmpfs`.
#[derive(Debug)]
pub struct Tmpfs {
    dir: TempDir,
}

impl Tmpfs {
    /// Mounts a `tmpfs` of `size` bytes. `None` after printing why when it
    /// cannot (a panic under CI).
    pub fn mount(size: u64) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix("idem-tmpfs-")
            .tempdir()
            .unwrap_or_else(|e| panic!("tmpfs: temporary directory: {e}"));
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output();
        match out {
            Ok(out) if out.status.success() => Some(Tmpfs { dir }),
            Ok(out) => unavailable(
                "a small tmpfs",
                &format!(
                    "mount failed (root needed): {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ),
            Err(e) => unavailable("a small tmpfs", &format!("cannot run mount: {e}")),
        }
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    fn filler(&self) -> PathBuf {
        self.path().join("filler")
    }

    /// Writes a file until the filesystem is full (the write fails with
    /// "no space"), and answers how many bytes it took.
    ///
    /// # Panics
    /// If a write fails for another reason.
    pub fn fill(&self) -> u64 {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.filler())
            .unwrap_or_else(|e| panic!("tmpfs: filler: {e}"));
        let chunk = vec![0xa5u8; 4096];
        let mut written = 0;
        loop {
            match file.write(&chunk) {
                Ok(0) => return written,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => return written, // ENOSPC
                Err(e) => panic!("tmpfs: filling: {e}"),
            }
        }
    }

    /// Deletes what [`fill`](Self::fill) wrote.
    pub fn free(&self) {
        let _ = std::fs::remove_file(self.filler());
    }

    /// Remounts it read-only.
    ///
    /// # Panics
    /// If the kernel refuses: a file on it is still open for writing.
    pub fn remount_read_only(&self) {
        self.remount("ro");
    }

    /// Remounts it read-write.
    ///
    /// # Panics
    /// If the kernel refuses.
    pub fn remount_read_write(&self) {
        self.remount("rw");
    }

    fn remount(&self, mode: &str) {
        let out = Command::new("mount")
            .args(["-o", &format!("remount,{mode}")])
            .arg(self.path())
            .output()
            .unwrap_or_else(|e| panic!("tmpfs: cannot run mount: {e}"));
        assert!(
            out.status.success(),
            "tmpfs: remount {mode}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazy: the mount goes once nothing uses it any more.
        let _ = Command::new("umount").arg("-l").arg(self.path()).output();
    }
}
