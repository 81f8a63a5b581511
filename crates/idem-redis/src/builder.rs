//! Options for connecting a store, and connecting it.

use std::time::Duration;

use idem_core::{StoreError, StoreErrorKind};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ConnectionInfo, IntoConnectionInfo};

use crate::connection::Connections;
use crate::error::redis_error;
use crate::replica_wait::ReplicaWait;
use crate::scripts::{Keys, Layout, Scripts};
use crate::store::RedisStore;

/// Options for connecting a store.
///
/// # URLs
///
/// - One server: `redis://[USER:PASSWORD@]HOST[:PORT][/DB]`, or
///   `rediss://` for TLS.
/// - A cluster: `redis-cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]`,
///   or `rediss-cluster://` for TLS: one or more nodes to learn the
///   cluster from (the rest are found through them). A cluster has only
///   database 0, so no path.
/// - Either may end with `?wait_replicas=N[&wait_timeout_ms=T]`, as
///   [`wait_for_replicas`](Self::wait_for_replicas).
#[derive(Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
    /// Trusted CA certificates (PEM) instead of the system's roots.
    ca_pem: Option<Vec<u8>>,
    /// Set by [`wait_for_replicas`](Self::wait_for_replicas); wins over
    /// the URL's.
    replicas: Option<ReplicaWait>,
}

/// Where the store connects, as read from its URL.
enum Target {
    Single(Box<ConnectionInfo>),
    Cluster(Vec<ConnectionInfo>),
}

/// The default of `wait_timeout_ms`.
const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// Without the URL, which may hold a password.
impl std::fmt::Debug for RedisStoreBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStoreBuilder")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field("ca_pem", &self.ca_pem.is_some())
            .field("replicas", &self.replicas)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Options for connecting to `url`: one server (`redis://host:port/db`,
    /// `rediss://` for TLS) or a cluster (`redis-cluster://host:port[,host:port...]`,
    /// `rediss-cluster://` for TLS); see [`RedisStoreBuilder`].
    pub fn builder(url: impl Into<String>) -> RedisStoreBuilder {
        RedisStoreBuilder::new(url.into())
    }

    /// Connects with the default options.
    ///
    /// # Errors
    /// As [`RedisStoreBuilder::connect`].
    pub async fn connect(url: &str) -> Result<RedisStore, StoreError> {
        RedisStore::builder(url).connect().await
    }
}

impl RedisStoreBuilder {
    /// The default options for `url`.
    pub(crate) fn new(url: String) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url,
            prefix: "idem".into(),
            timeout: Duration::from_secs(2),
            ca_pem: None,
            replicas: None,
        }
    }

    /// Answer only after `replicas` replicas acknowledged each write
    /// (Redis `WAIT` after every claim that took a key, every replay,
    /// every completion, every release and every lease extension, on the
    /// same connection), waiting at most `timeout` for them; when fewer
    /// acknowledge in time the operation fails closed (`Unavailable`),
    /// though the write stands on the master. Without it (the default) the
    /// store answers as soon as the master has the write, and a failover
    /// in the next moments can lose it. `replicas` 0 turns it off.
    /// `timeout` must be shorter than [`timeout`](Self::timeout).
    pub fn wait_for_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replicas = Some(ReplicaWait { replicas, timeout });
        self
    }

    /// The prefix of every key this store writes. Default `idem`.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long one operation, or one connection attempt, may take before
    /// it fails with `Unavailable`. Default 2 s.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Trust only these CA certificates (PEM, one or more) for a
    /// `rediss://` server, instead of the system's roots: for a server
    /// whose certificate a private CA signed. The server's certificate is
    /// always checked, name included (no `#insecure`). Refused with a
    /// plain `redis://` URL, where it would be ignored.
    ///
    /// The driver takes the process's default rustls `CryptoProvider`:
    /// install one at start (`rustls::crypto::ring::default_provider()
    /// .install_default()`); without it a `rediss://` store is refused.
    pub fn ca_pem(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.ca_pem = Some(pem.into());
        self
    }

    /// Checks the URL as [`connect`](Self::connect) reads it, without
    /// connecting (for configuration checks).
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a URL the driver cannot read. The
    /// message names what is wrong, never the URL.
    pub fn check(&self) -> Result<(), StoreError> {
        self.parts().map(drop)
    }

    /// What [`connect`](Self::connect) uses: the target, checked for TLS
    /// and prefix, and the replica wait.
    fn parts(&self) -> Result<(Target, Option<ReplicaWait>), StoreError> {
        let (target, from_url) = parse_url(&self.url)?;
        let replicas = self.replicas.or(from_url).filter(|w| w.replicas > 0);
        if let Some(w) = replicas
            && (w.timeout.is_zero() || w.timeout >= self.timeout)
        {
            return Err(setup(
                "redis store: the replica wait must be above zero and shorter than the operation timeout",
            ));
        }
        let infos = match &target {
            Target::Single(info) => std::slice::from_ref(info.as_ref()),
            Target::Cluster(nodes) => nodes.as_slice(),
        };
        for info in infos {
            self.check_tls(info)?;
        }
        if matches!(target, Target::Cluster(_)) && self.prefix.contains(['{', '}']) {
            // The prefix comes before each key's hash tag: a brace in it
            // would move the tag and split a record's keys across slots.
            return Err(setup(
                "redis store: a cluster store's prefix may not hold '{' or '}'",
            ));
        }
        if let Some(pem) = &self.ca_pem
            && !holds_a_certificate(pem)
        {
            // The driver reads the PEM only when it connects; a file
            // without a certificate is a configuration error now.
            return Err(setup("redis store: the CA file holds no certificate"));
        }
        Ok((target, replicas))
    }

    fn check_tls(&self, info: &ConnectionInfo) -> Result<(), StoreError> {
        if let redis::ConnectionAddr::TcpTls { insecure: true, .. } = info.addr() {
            // `rediss://...#insecure` turns certificate checks off.
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: #insecure is refused: the server's certificate is always checked",
            ));
        }
        let tls = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        if tls && rustls::crypto::CryptoProvider::get_default().is_none() {
            // The driver builds its TLS configuration from the process's
            // default provider; without one it would panic on connect. A
            // library does not choose the process's provider for it.
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: rediss:// needs a rustls CryptoProvider installed for the process, e.g. rustls::crypto::ring::default_provider().install_default() at start",
            ));
        }
        if !tls && self.ca_pem.is_some() {
            return Err(StoreError::new(
                StoreErrorKind::Setup,
                "redis store: a CA certificate is for a rediss:// URL; this one is not encrypted",
            ));
        }
        Ok(())
    }

    fn certificates(&self) -> Option<redis::TlsCertificates> {
        self.ca_pem.as_ref().map(|pem| redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem.clone()),
        })
    }

    /// Connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL; [`StoreErrorKind::Unavailable`]
    /// when the server does not answer.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let (target, replicas) = self.parts()?;
        let cannot_use_ca = |e| setup("redis store: cannot use the CA certificates").with_source(e);
        let (conn, layout) = match target {
            Target::Single(info) => {
                let client = match self.certificates() {
                    None => redis::Client::open(*info),
                    Some(certs) => redis::Client::build_with_tls(*info, certs),
                }
                .map_err(cannot_use_ca)?;
                let config = ConnectionManagerConfig::new()
                    .set_response_timeout(Some(self.timeout))
                    .set_connection_timeout(Some(self.timeout))
                    .set_number_of_retries(1)
                    .set_max_delay(Duration::from_millis(500));
                let conn = ConnectionManager::new_with_config(client.clone(), config.clone())
                    .await
                    .map_err(|e| redis_error("connecting", e))?;
                (Connections::single(conn, client, config), Layout::Single)
            }
            Target::Cluster(nodes) => {
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes)
                    .connection_timeout(self.timeout)
                    .response_timeout(self.timeout)
                    // Redirections (MOVED, ASK) and a failover in progress
                    // are retried within the operation's time, no longer.
                    .overall_response_timeout(Some(self.timeout))
                    .retries(3);
                if let Some(certs) = self.certificates() {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(cannot_use_ca)?;
                let conn = client
                    .get_async_connection()
                    .await
                    .map_err(|e| redis_error("connecting to the cluster", e))?;
                (Connections::cluster(conn, client), Layout::Cluster)
            }
        };
        if replicas.is_some() {
            conn.get()
                .check_wait_commands().await.map_err(|e| match e.kind() {
                redis::ErrorKind::Server(_) | redis::ErrorKind::UnexpectedReturnType => {
                    StoreError::new(
                        StoreErrorKind::Setup,
                        "redis store: the server refuses a command the replica wait needs (CLIENT ID, INFO server, WAIT)",
                    )
                    .with_source(e)
                }
                _ => redis_error("checking the replica wait", e),
            })?;
        }
        Ok(RedisStore {
            conn,
            keys: Keys::new(self.prefix, layout),
            scripts: Scripts::new(),
            replicas,
        })
    }
}

fn setup(message: &'static str) -> StoreError {
    StoreError::new(StoreErrorKind::Setup, message)
}

/// Reads a store URL (see [`RedisStoreBuilder`]). Messages name what is
/// wrong, never the URL, which may hold a password.
fn parse_url(url: &str) -> Result<(Target, Option<ReplicaWait>), StoreError> {
    let invalid = |e| setup("redis store: invalid URL").with_source(e);
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| setup("redis store: invalid URL: no scheme"))?;
    // The user info runs to the last '@', so a raw '@', '?' or '#' in a
    // password is covered; the nodes and the query follow.
    let (user_info, rest) = match rest.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, rest),
    };
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, Some(q)),
        None => (rest, None),
    };
    let (wait, driver_query) = read_query(query)?;
    let node_scheme = match scheme {
        "redis-cluster" => "redis",
        "rediss-cluster" => "rediss",
        _ => {
            let mut url = format!("{scheme}://");
            if let Some(u) = user_info {
                url.push_str(u);
                url.push('@');
            }
            url.push_str(rest);
            if !driver_query.is_empty() {
                url.push('?');
                url.push_str(&driver_query.join("&"));
            }
            let info = url.as_str().into_connection_info().map_err(invalid)?;
            return Ok((Target::Single(Box::new(info)), wait));
        }
    };
    if !driver_query.is_empty() || rest.contains('#') {
        return Err(setup(
            "redis store: a cluster URL takes no options but wait_replicas and wait_timeout_ms",
        ));
    }
    let nodes = rest;
    let nodes = match nodes.split_once('/') {
        None => nodes,
        Some((n, "" | "0")) => n,
        Some(_) => {
            return Err(setup(
                "redis store: a cluster has only database 0: no path after its nodes",
            ));
        }
    };
    let infos = nodes
        .split(',')
        .map(|node| {
            if node.is_empty() || !node.contains(':') {
                return Err(setup(
                    "redis store: each cluster node is HOST:PORT, separated by commas",
                ));
            }
            let url = match user_info {
                Some(u) => format!("{node_scheme}://{u}@{node}"),
                None => format!("{node_scheme}://{node}"),
            };
            url.as_str().into_connection_info().map_err(invalid)
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((Target::Cluster(infos), wait))
}

/// idem's own query parameters (`wait_replicas`, `wait_timeout_ms`), and
/// the rest for the driver.
fn read_query(query: Option<&str>) -> Result<(Option<ReplicaWait>, Vec<&str>), StoreError> {
    let (mut replicas, mut timeout, mut rest) = (None, None, Vec::new());
    let twice = || setup("redis store: wait_replicas and wait_timeout_ms may each be given once");
    for param in query.into_iter().flat_map(|q| q.split('&')) {
        match param.split_once('=') {
            Some(("wait_replicas", n)) => {
                let n = n
                    .parse::<u32>()
                    .map_err(|_| setup("redis store: wait_replicas is a number of replicas"))?;
                if replicas.replace(n).is_some() {
                    return Err(twice());
                }
            }
            Some(("wait_timeout_ms", t)) => {
                let ms = t.parse::<u64>().map_err(|_| {
                    setup("redis store: wait_timeout_ms is a number of milliseconds")
                })?;
                if timeout.replace(Duration::from_millis(ms)).is_some() {
                    return Err(twice());
                }
            }
            _ => rest.push(param),
        }
    }
    let wait = match (replicas, timeout) {
        (Some(replicas), t) => Some(ReplicaWait {
            replicas,
            timeout: t.unwrap_or(DEFAULT_WAIT_TIMEOUT),
        }),
        (None, Some(_)) => {
            return Err(setup("redis store: wait_timeout_ms without wait_replicas"));
        }
        (None, None) => None,
    };
    Ok((wait, rest))
}

/// Whether `pem` holds at least one certificate, and only readable ones.
fn holds_a_certificate(pem: &[u8]) -> bool {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let mut found = false;
    for cert in CertificateDer::pem_slice_iter(pem) {
        if cert.is_err() {
            return false;
        }
        found = true;
    }
    found
}
