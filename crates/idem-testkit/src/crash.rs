//! Crash tests by re-running the test binary as a child process.
//!
//! A crash test names an `#[ignore]`d child test in the same binary. The
//! child does its work and prints [`READY`] at the moment it wants to be
//! killed; the parent waits for that line and sends SIGKILL, then checks
//! what survived.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// The line a child prints when it is ready to be killed.
pub const READY: &str = "IDEM-CHILD-READY";

/// Prints [`READY`] on a line of its own: the child is at the point where
/// its parent should kill it.
pub fn say_ready() {
    println!("{READY}");
}

/// Runs the ignored test `test_path` of the current test binary with `envs`,
/// waits until it prints [`READY`], and kills it with SIGKILL.
///
/// # Panics
/// If the child cannot start or exits without printing [`READY`].
pub fn run_until_ready_then_kill(test_path: &str, envs: &[(&str, &std::ffi::OsStr)]) {
    let exe = std::env::current_exe().unwrap_or_else(|e| panic!("current_exe: {e}"));
    let mut command = Command::new(exe);
    command
        .args([
            "--exact",
            test_path,
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .stdout(Stdio::piped());
    for (k, v) in envs {
        command.env(k, v);
    }
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("spawn child: {e}"));
    let stdout = child
        .stdout
        .take()
        .unwrap_or_else(|| panic!("child stdout"));
    let ready = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .any(|l| l.contains(READY));
    assert!(ready, "the child exited before saying {READY}");
    // `Child::kill` is SIGKILL on Unix: no destructor, no rollback, no flush.
    child.kill().unwrap_or_else(|e| panic!("kill child: {e}"));
    let _ = child.wait();
}
