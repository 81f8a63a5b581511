//! One setting's value: parsed from its text, defaulted, and checked
//! against its bounds. Each error names the flag it belongs to.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, bail};
use http::HeaderName;
use idem_core::{Concurrency, Policy, Takeover};

use crate::units::{duration, size};

pub(super) fn policy(
    ttl: Duration,
    lease: Duration,
    wait: Option<Duration>,
    takeover: Takeover,
    what: &str,
) -> anyhow::Result<Policy> {
    let mut b = Policy::builder().ttl(ttl).lease(lease).takeover(takeover);
    if let Some(limit) = wait {
        b = b.concurrency(Concurrency::Wait { limit });
    }
    b.build().with_context(|| format!("{what}: invalid policy"))
}

/// A takeover policy by name (`--takeover`, a route's `takeover`).
pub(super) fn opt_takeover(v: Option<&String>, what: &str) -> anyhow::Result<Option<Takeover>> {
    v.map(|name| {
        Takeover::from_name(name).ok_or_else(|| {
            anyhow::anyhow!("{what} must be \"hold\", \"announce\" or \"reexecute\", not {name:?}")
        })
    })
    .transpose()
}

pub(super) fn opt_duration(v: Option<&String>, name: &str) -> anyhow::Result<Option<Duration>> {
    v.map(|t| duration(t).with_context(|| format!("--{name}")))
        .transpose()
}

/// A duration setting: parsed, defaulted, and checked against its bounds.
pub(super) fn bounded_duration(
    v: Option<&String>,
    name: &str,
    default: Duration,
    min: Duration,
    max: Duration,
) -> anyhow::Result<Duration> {
    let d = opt_duration(v, name)?.unwrap_or(default);
    if d < min || d > max {
        bail!("--{name} must be between {min:?} and {max:?}, not {d:?}");
    }
    Ok(d)
}

/// The largest body or response size accepted in the configuration.
pub(super) const MAX_SIZE: usize = 256 << 20;

/// A size setting: parsed, defaulted, at most [`MAX_SIZE`].
pub(super) fn bounded_size(
    v: Option<&String>,
    name: &str,
    default: usize,
) -> anyhow::Result<usize> {
    let n = v
        .map(|t| size(t))
        .transpose()
        .with_context(|| format!("--{name}"))?
        .unwrap_or(default);
    if n > MAX_SIZE {
        bail!("--{name} must be at most 256MiB, not {n} bytes");
    }
    Ok(n)
}

/// The most serving threads: each new connection wakes every thread's
/// event loop (they share the listening socket).
pub(super) const MAX_THREADS: usize = 256;

/// A count setting: defaulted, within `min..=max`.
pub(super) fn bounded_count(
    v: Option<usize>,
    name: &str,
    default: usize,
    min: usize,
    max: usize,
) -> anyhow::Result<usize> {
    let n = v.unwrap_or(default);
    if !(min..=max).contains(&n) {
        bail!("--{name} must be between {min} and {max}, not {n}");
    }
    Ok(n)
}

pub(super) fn header_name(v: Option<String>, flag: &str) -> anyhow::Result<Option<HeaderName>> {
    v.map(|h| {
        HeaderName::try_from(h.as_str())
            .with_context(|| format!("--{flag} {h:?} is not a header name"))
    })
    .transpose()
}

/// A listen address: `host:port`, the host an IP address or a name that
/// binding resolves. Checked without binding.
pub(super) fn address(v: Option<String>, name: &str, default: &str) -> anyhow::Result<String> {
    let a = v.unwrap_or_else(|| default.to_owned());
    if a.parse::<SocketAddr>().is_ok() {
        return Ok(a);
    }
    match a.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty() && !host.contains(':') && port.parse::<u16>().is_ok() =>
        {
            Ok(a)
        }
        _ => bail!("--{name} must be host:port, such as 127.0.0.1:8080, not {a:?}"),
    }
}

/// `--upstream`: an http:// or https:// URL with a host.
/// Never echoes the text whole: an upstream URL may carry a password.
pub(super) fn upstream_url(text: &str) -> anyhow::Result<http::Uri> {
    let shown = || idem_stores::redact(text);
    let Ok(upstream) = text.parse::<http::Uri>() else {
        bail!("--upstream {} is not a URL", shown());
    };
    if !matches!(upstream.scheme_str(), Some("http" | "https")) || upstream.authority().is_none() {
        bail!(
            "--upstream must be an http:// or https:// URL with a host, not {}",
            shown()
        );
    }
    if upstream
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        bail!(
            "--upstream must not carry user information ({}): the gateway never sends it, and it would reach the logs",
            shown()
        );
    }
    Ok(upstream)
}
