//! One validation function per section of the settings: the upstream, the
//! listeners, the store, the default policy, the limits, and the key and
//! scope headers. Each runs every check of its section, records each
//! problem, and gives back what it could read (a setting refused is
//! `None`). The configuration is assembled from them only once every
//! section has run, so one refused setting never hides the next.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use http::{HeaderName, header};
use idem_core::{KeyPolicy, MigrationLockWaits, Policy, Takeover};

use super::file::FileConfig;
use super::problems::Problems;
use super::values::{
    MAX_THREADS, address, bounded_count, bounded_duration, bounded_size, header_name, opt_duration,
    opt_takeover, policy, upstream_url,
};
use crate::cli::ServeArgs;
use crate::tls::{CaFile, ServerTls};
use idem_gateway::{Http2Limits, UpstreamProtocol};
use idem_stores::StoreUrl;

/// Where each setting comes from: its flag (or environment variable)
/// over the file.
pub(super) struct Sources<'a> {
    pub(super) args: &'a ServeArgs,
    pub(super) file: &'a FileConfig,
}

fn pick<T: Clone>(flag: &Option<T>, file: &Option<T>) -> Option<T> {
    flag.clone().or_else(|| file.clone())
}

/// `--upstream` and how it is reached.
pub(super) struct Upstream {
    pub(super) url: Option<http::Uri>,
    pub(super) ca: Option<PathBuf>,
    pub(super) tls: Option<Option<rustls::ClientConfig>>,
    pub(super) timeout: Option<Duration>,
    pub(super) idle_timeout: Option<Duration>,
    pub(super) protocol: Option<UpstreamProtocol>,
}

pub(super) fn upstream(s: &Sources<'_>, p: &mut Problems) -> Upstream {
    let (args, file) = (s.args, s.file);
    let url = match pick(&args.upstream, &file.upstream) {
        None => {
            p.add("--upstream (or IDEM_UPSTREAM, or `upstream` in the config file) is required");
            None
        }
        Some(text) => p.check(upstream_url(&text)),
    };
    let ca = pick(&args.upstream_ca, &file.upstream_ca);
    let tls = match &url {
        Some(u) if u.scheme_str() == Some("https") => {
            let read = ca
                .as_deref()
                .and_then(|path| p.check(CaFile::read(path).context("--upstream-ca")));
            match (&ca, read) {
                (Some(_), None) => None,
                (_, read) => p
                    .check(crate::tls::upstream_client(read.as_ref()).context("--upstream"))
                    .map(Some),
            }
        }
        Some(_) if ca.is_some() => {
            p.add("--upstream-ca is for an https:// upstream; --upstream is http://");
            None
        }
        _ => Some(None),
    };
    let timeout = p.check(bounded_duration(
        pick(&args.upstream_timeout, &file.upstream_timeout).as_ref(),
        "upstream-timeout",
        Duration::from_secs(25),
        Duration::from_millis(1),
        Duration::from_secs(3600),
    ));
    let idle_timeout = p.check(bounded_duration(
        pick(&args.upstream_idle_timeout, &file.upstream_idle_timeout).as_ref(),
        "upstream-idle-timeout",
        Duration::from_secs(60),
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ));
    let protocol = p.check(upstream_protocol(
        pick(&args.upstream_protocol, &file.upstream_protocol),
        url.as_ref().and_then(http::Uri::scheme_str),
    ));
    Upstream {
        url,
        ca,
        tls,
        timeout,
        idle_timeout,
        protocol,
    }
}

/// The client listener (and its TLS) and the admin listener.
pub(super) struct Listeners {
    pub(super) listen: Option<String>,
    pub(super) admin_listen: Option<String>,
    pub(super) tls: Option<Option<ServerTls>>,
}

pub(super) fn listeners(s: &Sources<'_>, p: &mut Problems) -> Listeners {
    let (args, file) = (s.args, s.file);
    let listen = p.check(address(
        pick(&args.listen, &file.listen),
        "listen",
        "127.0.0.1:8080",
    ));
    let admin_listen = p.check(address(
        pick(&args.admin_listen, &file.admin_listen),
        "admin-listen",
        "127.0.0.1:9090",
    ));
    // Port 0 is a new port each time, so two of them never clash.
    if let (Some(a), Some(b)) = (&listen, &admin_listen)
        && a == b
        && !a.ends_with(":0")
    {
        p.add(format!(
            "--listen and --admin-listen are the same address {a}"
        ));
    }
    let tls = match (
        pick(&args.tls_cert, &file.tls_cert),
        pick(&args.tls_key, &file.tls_key),
    ) {
        (Some(cert), Some(key)) => p.check(ServerTls::read(&cert, &key)).map(Some),
        (None, None) => Some(None),
        _ => {
            p.add("--tls-cert and --tls-key go together: give both, or neither");
            None
        }
    };
    Listeners {
        listen,
        admin_listen,
        tls,
    }
}

/// `--store`, its CA, and how long a call to it may take.
pub(super) struct Store {
    pub(super) url: Option<StoreUrl>,
    pub(super) ca: Option<Option<CaFile>>,
    pub(super) timeout: Option<Duration>,
    pub(super) migration_locks: Option<MigrationLockWaits>,
}

pub(super) fn store(s: &Sources<'_>, p: &mut Problems) -> Store {
    let (args, file) = (s.args, s.file);
    let url = p.check(
        pick(&args.store, &file.store)
            .as_deref()
            .unwrap_or("sqlite:idem.db")
            .parse::<StoreUrl>()
            .context("--store"),
    );
    let ca = match pick(&args.store_ca, &file.store_ca) {
        None => Some(None),
        Some(path) => {
            let read = p.check(CaFile::read(&path).context("--store-ca"));
            match &url {
                Some(url) if !url.speaks_tls() => {
                    p.add(format!(
                        "--store-ca is for a PostgreSQL or Redis store; --store is {url}"
                    ));
                    None
                }
                Some(url) => match read {
                    Some(ca) => p
                        .check(url.check_ca(ca.pem()).context("--store-ca"))
                        .map(|()| Some(ca)),
                    None => None,
                },
                None => None,
            }
        }
    };
    let timeout = p.check(bounded_duration(
        pick(&args.store_timeout, &file.store_timeout).as_ref(),
        "store-timeout",
        Duration::from_secs(2),
        Duration::from_millis(10),
        Duration::from_secs(60),
    ));
    let migration_lock_wait = pick(
        &args.store_migration_lock_wait,
        &file.store_migration_lock_wait,
    );
    let migration_locks = match (&url, &migration_lock_wait) {
        (Some(url), Some(_)) if !url.migrates_a_server_schema() => {
            p.add(format!(
                "--store-migration-lock-wait is for a PostgreSQL or MySQL store; --store is {url}"
            ));
            None
        }
        _ => p
            .check(bounded_duration(
                migration_lock_wait.as_ref(),
                "store-migration-lock-wait",
                MigrationLockWaits::default().wait(),
                Duration::from_millis(10),
                Duration::from_secs(60),
            ))
            .map(|wait| MigrationLockWaits::new(wait, MigrationLockWaits::default().tries())),
    };
    Store {
        url,
        ca,
        timeout,
        migration_locks,
    }
}

/// `--ttl`, `--lease` and `--wait`: the default policy, and the parts a
/// route inherits.
pub(super) struct DefaultPolicy {
    pub(super) ttl: Option<Duration>,
    pub(super) lease: Option<Duration>,
    pub(super) wait: Option<Option<Duration>>,
    pub(super) takeover: Option<Takeover>,
    pub(super) policy: Option<Policy>,
}

/// The policy, with its lease checked against the deadlines it must
/// cover: the forwarded request and the completion that stores its
/// answer. A lease that ends first lets a retry be forwarded beside the
/// first execution.
pub(super) fn default_policy(
    s: &Sources<'_>,
    upstream_timeout: Option<Duration>,
    store_timeout: Option<Duration>,
    p: &mut Problems,
) -> DefaultPolicy {
    let (args, file) = (s.args, s.file);
    let ttl = p
        .check(opt_duration(pick(&args.ttl, &file.ttl).as_ref(), "ttl"))
        .map(|d| d.unwrap_or(Duration::from_secs(86_400)));
    let lease = p
        .check(opt_duration(
            pick(&args.lease, &file.lease).as_ref(),
            "lease",
        ))
        .map(|d| d.unwrap_or(Duration::from_secs(30)));
    let wait = p.check(opt_duration(pick(&args.wait, &file.wait).as_ref(), "wait"));
    let takeover = p
        .check(opt_takeover(
            pick(&args.takeover, &file.takeover).as_ref(),
            "--takeover",
        ))
        .map(Option::unwrap_or_default);
    if let (Some(upstream_timeout), Some(store_timeout), Some(lease)) =
        (upstream_timeout, store_timeout, lease)
        && upstream_timeout + store_timeout >= lease
    {
        p.add(format!(
            "--upstream-timeout ({upstream_timeout:?}) plus --store-timeout ({store_timeout:?}) must be shorter than --lease ({lease:?}): a request still running when its lease ends could be forwarded twice"
        ));
    }
    let policy = match (ttl, lease, wait, takeover) {
        (Some(ttl), Some(lease), Some(wait), Some(takeover)) => {
            p.check(policy(ttl, lease, wait, takeover, "--ttl/--lease/--wait"))
        }
        _ => None,
    };
    DefaultPolicy {
        ttl,
        lease,
        wait,
        takeover,
        policy,
    }
}

/// Sizes, counts and the client-side deadlines.
pub(super) struct Limits {
    pub(super) max_body: Option<usize>,
    pub(super) replay_cache: Option<usize>,
    pub(super) max_response: Option<usize>,
    pub(super) max_connections: Option<usize>,
    pub(super) threads: Option<usize>,
    pub(super) header_timeout: Option<Duration>,
    pub(super) body_timeout: Option<Duration>,
    pub(super) shutdown_grace: Option<Duration>,
    pub(super) sweep_interval: Option<Duration>,
}

pub(super) fn limits(s: &Sources<'_>, p: &mut Problems) -> Limits {
    let (args, file) = (s.args, s.file);
    let size = |p: &mut Problems, flag: &Option<String>, text: &Option<String>, name, default| {
        p.check(bounded_size(pick(flag, text).as_ref(), name, default))
    };
    let max_body = size(p, &args.max_body, &file.max_body, "max-body", 1 << 20);
    let replay_cache = size(
        p,
        &args.replay_cache,
        &file.replay_cache,
        "replay-cache",
        idem_http::DEFAULT_REPLAY_CACHE,
    );
    let max_response = size(
        p,
        &args.max_response,
        &file.max_response,
        "max-response",
        8 << 20,
    );
    let max_connections = p.check(bounded_count(
        args.max_connections.or(file.max_connections),
        "max-connections",
        1024,
        1,
        1_000_000,
    ));
    let threads = p.check(bounded_count(
        args.threads.or(file.threads),
        "threads",
        std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_THREADS)),
        1,
        MAX_THREADS,
    ));
    let deadline = |p: &mut Problems,
                    flag: &Option<String>,
                    text: &Option<String>,
                    name,
                    default,
                    min,
                    max| {
        p.check(bounded_duration(
            pick(flag, text).as_ref(),
            name,
            default,
            min,
            max,
        ))
    };
    let header_timeout = deadline(
        p,
        &args.header_timeout,
        &file.header_timeout,
        "header-timeout",
        Duration::from_secs(10),
        Duration::from_millis(100),
        Duration::from_secs(300),
    );
    let body_timeout = deadline(
        p,
        &args.body_timeout,
        &file.body_timeout,
        "body-timeout",
        Duration::from_secs(30),
        Duration::from_millis(100),
        Duration::from_secs(600),
    );
    let shutdown_grace = deadline(
        p,
        &args.shutdown_grace,
        &file.shutdown_grace,
        "shutdown-grace",
        Duration::from_secs(30),
        Duration::ZERO,
        Duration::from_secs(3600),
    );
    let sweep_interval = deadline(
        p,
        &args.sweep_interval,
        &file.sweep_interval,
        "sweep-interval",
        Duration::from_secs(60),
        Duration::from_millis(100),
        Duration::from_secs(86_400),
    );
    Limits {
        max_body,
        replay_cache,
        max_response,
        max_connections,
        threads,
        header_timeout,
        body_timeout,
        shutdown_grace,
        sweep_interval,
    }
}

/// The key header and its policy, and the scope headers.
pub(super) struct Keys {
    pub(super) policy: Option<KeyPolicy>,
    pub(super) key_header: Option<HeaderName>,
    pub(super) tenant_header: Option<Option<HeaderName>>,
    pub(super) scope_header: Option<Option<HeaderName>>,
}

pub(super) fn keys(s: &Sources<'_>, p: &mut Problems) -> Keys {
    let (args, file) = (s.args, s.file);
    let min_key_len = p.check(bounded_count(
        args.min_key_len.or(file.min_key_len),
        "min-key-len",
        16,
        1,
        255,
    ));
    let tenant_header = p.check(header_name(
        pick(&args.tenant_header, &file.tenant_header),
        "tenant-header",
    ));
    let scope_header = p.check(header_name(
        pick(&args.scope_header, &file.scope_header),
        "scope-header",
    ));
    let named: Vec<(&str, HeaderName)> = [
        ("tenant-header", tenant_header.clone().flatten()),
        ("scope-header", scope_header.clone().flatten()),
    ]
    .into_iter()
    .filter_map(|(flag, h)| Some((flag, h?)))
    .collect();
    if let [(_, a), (_, b)] = &named[..]
        && a == b
    {
        p.add(format!(
            "--tenant-header and --scope-header name the same header {a}"
        ));
    }
    let key_header = p.check(key_header(pick(&args.key_header, &file.key_header), &named));
    Keys {
        policy: min_key_len.map(|n| KeyPolicy::default().min_len(n)),
        key_header,
        tenant_header,
        scope_header,
    }
}

/// Headers that describe the body: a key there would not name an
/// intent.
const BODY_HEADERS: [HeaderName; 3] = [
    header::CONTENT_TYPE,
    header::CONTENT_LENGTH,
    header::CONTENT_ENCODING,
];

/// `--key-header`: a header name that reaches the upstream unchanged and
/// is nothing else: not hop-by-hop, not Authorization, not one the gateway
/// writes, not a scope header.
fn key_header(
    v: Option<String>,
    scope_headers: &[(&str, HeaderName)],
) -> anyhow::Result<HeaderName> {
    let name = match header_name(v, "key-header")? {
        Some(name) => name,
        None => idem_http::IDEMPOTENCY_KEY,
    };
    if name == header::AUTHORIZATION {
        bail!("--key-header cannot be Authorization: a key must never be the credential");
    }
    if idem_gateway::rewritten_on_the_way(&name) || BODY_HEADERS.contains(&name) {
        bail!(
            "--key-header {name} is a header the gateway strips (hop-by-hop) or rewrites, or one that describes the body; name one of your own, such as X-Request-Key"
        );
    }
    if let Some((flag, _)) = scope_headers.iter().find(|(_, h)| *h == name) {
        bail!("--key-header and --{flag} both name {name}: a key cannot be its own scope");
    }
    Ok(name)
}

/// `--upstream-protocol`, which must suit the upstream's scheme: `h2`
/// needs TLS (ALPN), `h2c` clear text.
fn upstream_protocol(v: Option<String>, scheme: Option<&str>) -> anyhow::Result<UpstreamProtocol> {
    let protocol = match v.as_deref().map(str::trim) {
        None | Some("http1") => UpstreamProtocol::Http1,
        Some("h2") => UpstreamProtocol::H2,
        Some("h2c") => UpstreamProtocol::H2c,
        Some("auto") => UpstreamProtocol::Auto,
        Some(_) => bail!("--upstream-protocol must be http1, h2, h2c or auto"),
    };
    match (protocol, scheme) {
        (UpstreamProtocol::H2, Some("http")) => {
            bail!("--upstream-protocol h2 is HTTP/2 over TLS: use h2c for an http:// upstream")
        }
        (UpstreamProtocol::H2c, Some("https")) => {
            bail!(
                "--upstream-protocol h2c is HTTP/2 in clear text: use h2 for an https:// upstream"
            )
        }
        _ => Ok(protocol),
    }
}

/// HTTP/2 on client connections: on unless `--no-http2`, with its bounds.
pub(super) fn http2(s: &Sources<'_>, p: &mut Problems) -> Option<Http2Limits> {
    let (args, file) = (s.args, s.file);
    let d = Http2Limits::default();
    let enabled = !args.no_http2 && file.http2.unwrap_or(true);
    let count = |p: &mut Problems, v: Option<usize>, name, default: usize, max| {
        p.check(bounded_count(v, name, default, 1, max))
    };
    let size = |p: &mut Problems,
                flag: &Option<String>,
                text: &Option<String>,
                name,
                default: u32,
                min: u32,
                max: u32| {
        let v = p.check(bounded_size(
            pick(flag, text).as_ref(),
            name,
            default as usize,
        ))?;
        if !(min as usize..=max as usize).contains(&v) {
            p.add(format!("--{name} must be between {min} and {max} bytes"));
            return None;
        }
        u32::try_from(v).ok()
    };
    let streams = count(
        p,
        args.h2_max_streams.or(file.h2_max_streams),
        "h2-max-streams",
        d.max_concurrent_streams as usize,
        10_000,
    );
    let resets = count(
        p,
        args.h2_max_resets.or(file.h2_max_resets),
        "h2-max-resets",
        d.max_pending_resets,
        10_000,
    );
    let header_list = size(
        p,
        &args.h2_max_header_list,
        &file.h2_max_header_list,
        "h2-max-header-list",
        d.max_header_list_size,
        1024,
        1 << 20,
    );
    let stream_window = size(
        p,
        &args.h2_stream_window,
        &file.h2_stream_window,
        "h2-stream-window",
        d.stream_window,
        64 * 1024,
        16 << 20,
    );
    let connection_window = size(
        p,
        &args.h2_connection_window,
        &file.h2_connection_window,
        "h2-connection-window",
        d.connection_window,
        64 * 1024,
        64 << 20,
    );
    let interval = p.check(bounded_duration(
        pick(&args.h2_keepalive_interval, &file.h2_keepalive_interval).as_ref(),
        "h2-keepalive-interval",
        d.keep_alive_interval.unwrap_or(Duration::ZERO),
        Duration::ZERO,
        Duration::from_secs(86_400),
    ));
    let timeout = p.check(bounded_duration(
        pick(&args.h2_keepalive_timeout, &file.h2_keepalive_timeout).as_ref(),
        "h2-keepalive-timeout",
        d.keep_alive_timeout,
        Duration::from_millis(100),
        Duration::from_secs(3600),
    ));
    let idle = p.check(bounded_duration(
        pick(&args.h2_idle_timeout, &file.h2_idle_timeout).as_ref(),
        "h2-idle-timeout",
        d.idle_timeout,
        Duration::from_millis(100),
        Duration::from_secs(86_400),
    ));
    if let (Some(s), Some(c)) = (stream_window, connection_window)
        && c < s
    {
        p.add("--h2-connection-window must be at least --h2-stream-window");
        return None;
    }
    Some(Http2Limits {
        enabled,
        max_concurrent_streams: u32::try_from(streams?).ok()?,
        max_header_list_size: header_list?,
        stream_window: stream_window?,
        connection_window: connection_window?,
        keep_alive_interval: interval.filter(|i| !i.is_zero()),
        keep_alive_timeout: timeout?,
        idle_timeout: idle?,
        max_pending_resets: resets?,
        ..d
    })
}
