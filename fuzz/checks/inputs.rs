//! Runs the committed inputs of a fuzz target through its check, for the
//! crates' `tests/fuzz_regressions.rs` (not part of the fuzz targets).
//!
//! `fuzz/regressions/<target>/` holds every input that ever failed a check
//! (a crash, a failed assertion, a timeout), as its exact bytes;
//! `fuzz/corpus/<target>/` the seeds. Files whose names start with `.`
//! (`.gitkeep`) are skipped.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

/// `fuzz/<kind>/<target>/`, found from the crate's directory.
fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz")
        .join(kind)
        .join(target)
}

/// The files of `fuzz/<kind>/<target>/`, by name; the directory must exist,
/// so a misspelt target cannot pass with nothing run.
pub(crate) fn files(kind: &str, target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = dir(kind, target);
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        let (path, name) = (entry.path(), entry.file_name());
        let name = name.to_string_lossy().into_owned();
        if path.is_file() && !name.starts_with('.') {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            files.push((name, bytes));
        }
    }
    files.sort();
    files
}

/// Runs `check` on every file of `fuzz/<kind>/<target>/` and fails naming
/// each file whose check panicked. Returns how many files ran.
pub(crate) fn run_all(kind: &str, target: &str, check: fn(&[u8])) -> usize {
    let files = files(kind, target);
    let failed: Vec<&str> = files
        .iter()
        .filter(|(_, bytes)| catch_unwind(AssertUnwindSafe(|| check(bytes))).is_err())
        .map(|(name, _)| name.as_str())
        .collect();
    assert!(
        failed.is_empty(),
        "fuzz/{kind}/{target}/: {failed:?} failed the check (its panic is printed above)"
    );
    files.len()
}
