//! A test server: its URL from the environment, and names for what the
//! tests create on it.

/// The URL of a test backend from the environment variable `var`.
///
/// Absent or empty: `None`, after printing why the tests skip, so that
/// `cargo test` passes on a machine with only Rust. Under CI (`CI` set)
/// an absent URL panics instead: CI may not skip.
pub fn backend_url(var: &str, what: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{var} must be set under CI: the {what} tests may not skip there")
        }
        _ => {
            eprintln!("skipped: {var} is not set (no {what} to test against)");
            None
        }
    }
}

/// A name no other test, run or process uses (for schemas, streams,
/// queues and scopes on servers that outlive a test run).
pub fn unique_name(tag: &str) -> String {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "idem_test_{tag}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
}
