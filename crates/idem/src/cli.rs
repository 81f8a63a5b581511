//! The command line as typed: flags, environment variables, subcommands.
//! Nothing here is validated beyond its syntax; see `config` for that.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::logging::LogFormat;

#[derive(Debug, Parser)]
#[command(
    name = "idem",
    version,
    about = "Safe retries for mutations: an idempotency gateway, a fault-injection demo, and record tools."
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// What to log: a level (error, warn, info, debug, trace, off) or a
    /// filter such as warn,idem_http=debug. Wins over RUST_LOG
    /// [default: RUST_LOG, else info]. Logs go to stderr.
    #[arg(long, global = true, value_name = "LEVEL_OR_FILTER")]
    pub(crate) log_level: Option<String>,
    /// How logs are written: text lines, or one JSON object per line.
    #[arg(
        long,
        global = true,
        env = "IDEM_LOG_FORMAT",
        value_enum,
        default_value_t = LogFormat::Text
    )]
    pub(crate) log_format: LogFormat,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run the gateway in front of an HTTP service.
    Serve(Box<ServeArgs>),
    /// Check the gateway's settings without starting it, and print the effective ones.
    ///
    /// Flags, environment and the --config file are checked together, as
    /// idem serve checks them, without binding a port, opening the store
    /// or contacting the upstream. Exit 0 when valid; otherwise one line
    /// per problem on stderr, exit 2.
    #[command(after_long_help = CHECK_CONFIG_HELP)]
    CheckConfig(Box<ServeArgs>),
    /// Run the whole system under injected faults and check one effect per intent.
    Demo(DemoArgs),
    /// Inspect or purge idempotency records.
    #[command(subcommand)]
    Records(RecordsCommand),
    /// Check any HTTP API's Idempotency-Key behaviour from the outside.
    ///
    /// Sends at most --max-requests requests with fresh random keys to one
    /// mutating endpoint and reports each check: pass, fail, n/a or could
    /// not tell, with the requests sent and the answers (credentials
    /// redacted). Exit 0 when every required check passes, 1 otherwise, 2
    /// on a usage error. It performs real mutations: point it at staging.
    #[command(after_long_help = PROBE_HELP)]
    Probe(Box<ProbeArgs>),
}

const PROBE_HELP: &str = "\
How executions are told apart:
  --id-pointer /id            a resource id in each successful answer
  Location                    used when no --id-pointer is given
  --effect-url URL --effect-pointer /count
                              a count read with GET before and after
  Without any of them, checks that must tell a replay from a second
  execution say 'could not tell' (a required check that cannot tell fails
  the run).

Failures: --failing-body makes the operation answer a deterministic 4xx,
--transient-body a 5xx or 429; without them those checks are n/a.

Checks (skip any with --skip NAME): key-required, retry-replays-response,
replay-marked*, key-bound-to-body, key-bound-to-path, key-bound-to-query,
key-scoped-to-credential, big-number-precision,
reformatted-json-not-executed-twice, concurrent-duplicates-execute-once,
in-flight-duplicate-conflicts*, deterministic-failure-replayed,
transient-failure-not-stored, expiry-advertised*, problem-details*
(* advisory: reported, never fails the run).";

/// `idem probe`'s flags, raw: validated by `probe::Settings::from_args`.
#[derive(Debug, Args)]
pub(crate) struct ProbeArgs {
    /// The mutation's URL (http:// or https://).
    #[arg(long)]
    pub(crate) url: String,
    /// The method.
    #[arg(long, default_value = "POST")]
    pub(crate) method: String,
    /// A body the operation accepts: JSON, or @FILE.
    #[arg(long)]
    pub(crate) body: String,
    /// A header sent on every request, 'Name: value' (repeatable).
    #[arg(long = "header", value_name = "'NAME: VALUE'")]
    pub(crate) headers: Vec<String>,
    /// The caller's credential, 'Header: value' (redacted in every output;
    /// the environment keeps it out of the process list).
    #[arg(
        long,
        value_name = "'NAME: VALUE'",
        env = "IDEM_PROBE_CREDENTIAL",
        hide_env_values = true
    )]
    pub(crate) credential: Option<String>,
    /// Another tenant's credential, for key-scoped-to-credential.
    #[arg(
        long,
        value_name = "'NAME: VALUE'",
        env = "IDEM_PROBE_SECOND_CREDENTIAL",
        hide_env_values = true
    )]
    pub(crate) second_credential: Option<String>,
    /// The key header's name.
    #[arg(long, default_value = "Idempotency-Key")]
    pub(crate) key_header: String,
    /// Another URL that accepts the same body, for key-bound-to-path
    /// [default: the URL with /idem-probe-other appended].
    #[arg(long)]
    pub(crate) other_url: Option<String>,
    /// Another body the operation accepts, for key-bound-to-body and its
    /// control (JSON or @FILE) [default: the body with a field
    /// idem_probe_variant added]. Give one that changes a field the API
    /// fingerprints when it refuses unknown fields or fingerprints chosen
    /// fields only.
    #[arg(long)]
    pub(crate) other_body: Option<String>,
    /// Another query the operation accepts, in place of the URL's, for
    /// key-bound-to-query [default: the URL's query with idem_probe=other
    /// added].
    #[arg(long)]
    pub(crate) other_query: Option<String>,
    /// PEM certificates an https:// target must chain to (only these)
    /// [default: the system's roots].
    #[arg(long, value_name = "FILE")]
    pub(crate) ca_cert: Option<std::path::PathBuf>,
    /// JSON pointer to a resource id in successful answers.
    #[arg(long)]
    pub(crate) id_pointer: Option<String>,
    /// A URL (GET) whose answer holds a count of executions.
    #[arg(long)]
    pub(crate) effect_url: Option<String>,
    /// JSON pointer to the count in --effect-url's answer (empty: the whole body).
    #[arg(long, default_value = "")]
    pub(crate) effect_pointer: String,
    /// A body the operation refuses with a deterministic 4xx: JSON, or @FILE.
    #[arg(long)]
    pub(crate) failing_body: Option<String>,
    /// A body the operation fails with a transient 5xx or 429: JSON, or @FILE.
    #[arg(long)]
    pub(crate) transient_body: Option<String>,
    /// Requests to the target at most.
    #[arg(long, default_value_t = 40)]
    pub(crate) max_requests: u32,
    /// Concurrent requests at most (and the N of the concurrency check).
    #[arg(long, default_value_t = 4)]
    pub(crate) concurrency: u32,
    /// Pause between checks.
    #[arg(long, default_value = "100ms")]
    pub(crate) pause: String,
    /// Timeout of each request.
    #[arg(long, default_value = "10s")]
    pub(crate) timeout: String,
    /// A check not to run (repeatable).
    #[arg(long = "skip", value_name = "NAME")]
    pub(crate) skip: Vec<String>,
    /// Report format.
    #[arg(long, value_enum, default_value_t = ProbeFormat::Text)]
    pub(crate) format: ProbeFormat,
}

/// `idem probe --format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum ProbeFormat {
    /// One line per check, colour on a terminal.
    Text,
    /// The complete report.
    Json,
    /// JUnit XML, for CI.
    Junit,
}

const SERVE_HELP: &str = "\
Idempotency-Key policy:
  Which requests:  POST and PATCH need an Idempotency-Key header by default
                   (400 without one); other methods pass through. [[route]]
                   rules in --config change this per method and path.
  Header name:     Idempotency-Key, or the one --key-header names (then only
                   that header is read; Idempotency-Key is forwarded as any
                   other header). Responses keep Idempotency-Key-Expires and
                   Idempotent-Replayed whatever the name.
  The key:         an RFC 8941 string (\"...\") or a bare value, 16 to 255
                   printable ASCII characters (--min-key-len), never the
                   request's credential and never a JWT. One key names one
                   intent: send it unchanged on every retry.
  Scope:           keys are per credential (a hash of Authorization), or per
                   --tenant-header / --scope-header value (raw bytes hashed;
                   missing, repeated or empty: 400). Callers never see each
                   other's keys. A token refresh changes the Authorization
                   scope: use --scope-header behind an auth proxy to keep it.
  Fingerprint:     the method, the actual path, the query string and the
                   body (JSON compared by value, numbers exactly).
  What is kept:    the first response for --ttl (24h by default): its status,
                   body and allowlisted headers (Content-Type, Location, ETag,
                   ...; never Set-Cookie). 2xx/3xx and 4xx other than
                   408/409/425/429 are replayed with Idempotent-Replayed: true.
                   The upstream's own 5xx, 408 and 429 release the key: a
                   retry is forwarded again. If the upstream cannot be
                   reached, nothing was sent and the key is released too.
  Unknown outcome: if the upstream times out (504) or the connection fails
                   after the request was sent (502), or the gateway stops
                   mid-request, the key stays held until its lease ends
                   (409 until then): the upstream may still commit.
  Duplicates:      a retry while the first is running gets 409 with
                   Retry-After, or with --wait waits for the first and
                   replays it. The same key with a different body gets 422.
  Expiry:          every keyed response carries Idempotency-Key-Expires; after
                   it the key is forgotten and a retry would be forwarded again.
  Store down:      503 with Retry-After; nothing is forwarded without a claim.
  Crash window:    if the gateway dies after forwarding and before storing
                   the answer, a retry after the lease is not forwarded
                   again by default (--takeover hold): it gets 500
                   outcome-unresolved until an operator runs idem records
                   release (or the key expires). --takeover announce forwards
                   it with Idem-Takeover: <key>; reexecute forwards it as new.
  Store stalls:    an answer whose record the store did not take is held in
                   memory and its completion retried until stored; retries
                   here replay it. Running requests renew their lease.
  Exactly once:    the gateway forwards the key header unchanged (a client
                   cannot strip it with Connection) so the upstream can
                   deduplicate too; only the library's atomic mode, inside
                   the service, makes effects exactly once.

Read your own record: GET /_idem/records/KEY with the same credential (or
scope headers); add ?method=POST&path=/transfers/7 to pick one operation
when the key was used on several. Records of the anonymous scope are not
served there unless --anonymous-reads.
Admin listener: /metrics (Prometheus), /healthz, /readyz.
Check the settings first without starting: idem check-config (same flags).
Exit codes: 0 stopped cleanly; 1 runtime failure (store unreachable, port
in use); 2 usage or configuration error.";

const CHECK_CONFIG_HELP: &str = "\
Takes the same flags and environment variables as idem serve. Checks
everything idem serve checks before it starts: every setting's syntax and
bounds, the store URL's form, the routes, and how the settings fit together
(the lease against the timeouts). It does not bind the listen addresses,
open the store or contact the upstream: a setting can pass here and still
fail at start (a port in use, a store that is down).

Valid: the effective settings on stdout, in the config file's format
(passwords in the store and upstream URLs shown as ***), exit 0. Invalid:
one line per problem on stderr, each naming its setting, exit 2.";

#[derive(Debug, Default, Args)]
#[command(after_long_help = SERVE_HELP)]
pub(crate) struct ServeArgs {
    /// The service to protect, e.g. http://127.0.0.1:3000.
    #[arg(long, env = "IDEM_UPSTREAM", hide_env_values = true)]
    pub(crate) upstream: Option<String>,
    /// Trust only the CA certificates in this PEM file for an https://
    /// upstream, instead of the system's roots.
    #[arg(long, env = "IDEM_UPSTREAM_CA", value_name = "FILE")]
    pub(crate) upstream_ca: Option<PathBuf>,
    /// Address to accept requests on [default: 127.0.0.1:8080].
    #[arg(long, env = "IDEM_LISTEN")]
    pub(crate) listen: Option<String>,
    /// Serve HTTPS: the certificate chain (PEM) of the listener. With
    /// --tls-key.
    #[arg(long, env = "IDEM_TLS_CERT", value_name = "FILE")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, env = "IDEM_TLS_KEY", value_name = "FILE")]
    pub(crate) tls_key: Option<PathBuf>,
    /// Address for /metrics, /healthz, /readyz [default: 127.0.0.1:9090].
    #[arg(long, env = "IDEM_ADMIN_LISTEN")]
    pub(crate) admin_listen: Option<String>,
    /// memory:, sqlite:PATH, postgres://..., redis://..., rediss://... [default: sqlite:idem.db].
    #[arg(long, env = "IDEM_STORE", hide_env_values = true)]
    pub(crate) store: Option<String>,
    /// Trust only the CA certificates in this PEM file for a PostgreSQL
    /// (sslmode=verify-ca or verify-full) or rediss:// store, instead of
    /// the system's roots.
    #[arg(long, env = "IDEM_STORE_CA", value_name = "FILE")]
    pub(crate) store_ca: Option<PathBuf>,
    /// A TOML file with these settings and [[route]] rules.
    #[arg(long, env = "IDEM_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    /// How long records are kept, e.g. 24h [default: 24h].
    #[arg(long, env = "IDEM_TTL")]
    pub(crate) ttl: Option<String>,
    /// How long a forwarded request holds its key before another may take
    /// over [default: 30s]. Keep it above --upstream-timeout.
    #[arg(long, env = "IDEM_LEASE")]
    pub(crate) lease: Option<String>,
    /// Wait mode: a duplicate waits up to this long for the first and
    /// replays it, instead of getting 409 at once.
    #[arg(long, env = "IDEM_WAIT")]
    pub(crate) wait: Option<String>,
    /// What a retry does once an earlier attempt's lease ended with no
    /// outcome stored (a gateway died after forwarding): `hold` (answer
    /// `outcome-unresolved` until an operator resolves the key with `idem
    /// records release`), `announce` (forward again with `Idem-Takeover:
    /// <key>`), or `reexecute` [default: hold].
    #[arg(long, env = "IDEM_TAKEOVER")]
    pub(crate) takeover: Option<String>,
    /// Largest request body, e.g. 1MiB [default: 1MiB].
    #[arg(long, env = "IDEM_MAX_BODY")]
    pub(crate) max_body: Option<String>,
    /// Shortest key accepted [default: 16].
    #[arg(long, env = "IDEM_MIN_KEY_LEN")]
    pub(crate) min_key_len: Option<usize>,
    /// The request header that carries the key, for an API whose clients
    /// already send theirs under another name, e.g. X-Request-Key
    /// [default: Idempotency-Key]. Not a hop-by-hop header, Authorization,
    /// or a scope header.
    #[arg(long, env = "IDEM_KEY_HEADER", value_name = "NAME")]
    pub(crate) key_header: Option<String>,
    /// Scope keys by this header (a tenant set by a trusted proxy) instead
    /// of by Authorization. Missing, repeated or empty: 400.
    #[arg(long, env = "IDEM_TENANT_HEADER")]
    pub(crate) tenant_header: Option<String>,
    /// Scope keys by this header (a stable principal, such as a user id,
    /// set by a trusted auth proxy), so a retry after a token refresh finds
    /// its record. With --tenant-header, both together name the scope.
    #[arg(long, env = "IDEM_SCOPE_HEADER")]
    pub(crate) scope_header: Option<String>,
    /// Refuse keyed requests without a credential (401) instead of putting
    /// them all in one shared anonymous scope.
    #[arg(long, env = "IDEM_REQUIRE_SCOPE")]
    pub(crate) require_scope: bool,
    /// Serve the anonymous scope's records on the read path (anyone without
    /// a credential could read them). Off by default.
    #[arg(long, env = "IDEM_ANONYMOUS_READS")]
    pub(crate) anonymous_reads: bool,
    /// Keep the client's Forwarded and X-Forwarded-* headers and append to
    /// them; only when a trusted proxy is the gateway's only client. By
    /// default they are replaced by the gateway's own.
    #[arg(long, env = "IDEM_TRUST_FORWARDED")]
    pub(crate) trust_forwarded: bool,
    /// Start even when the store's own settings lose records (Redis
    /// without appendonly, PostgreSQL with fsync off, ...): a store that
    /// forgets a completed intent lets its next retry execute again. By
    /// default `idem serve` refuses such a store (exit 2). The memory store
    /// is never refused.
    #[arg(long, env = "IDEM_ACCEPT_VOLATILE_STORE")]
    pub(crate) accept_volatile_store: bool,
    /// Largest upstream response stored for replay [default: 8MiB]. Larger
    /// answers still reach the client; a retry is told to read the record.
    #[arg(long, env = "IDEM_MAX_RESPONSE")]
    pub(crate) max_response: Option<String>,
    /// Memory for records replayed before, so that a key retried again is
    /// answered without the store [default: 16MiB; 0 turns it off]. Safe
    /// with gateways sharing a store: a finished record never changes
    /// until it expires.
    #[arg(long, env = "IDEM_REPLAY_CACHE")]
    pub(crate) replay_cache: Option<String>,
    /// How long a client may take to send its request headers; also how
    /// long an idle connection is kept [default: 10s].
    #[arg(long, env = "IDEM_HEADER_TIMEOUT")]
    pub(crate) header_timeout: Option<String>,
    /// How long a keyed request's body may take to arrive, and how long a
    /// client may stop reading an answer before its connection is closed
    /// [default: 30s].
    #[arg(long, env = "IDEM_BODY_TIMEOUT")]
    pub(crate) body_timeout: Option<String>,
    /// Most client connections open at once; more wait to be accepted
    /// [default: 1024].
    #[arg(long, env = "IDEM_MAX_CONNECTIONS")]
    pub(crate) max_connections: Option<usize>,
    /// Threads that serve client connections, each with its own event
    /// loop and upstream connection pool [default: one per CPU].
    #[arg(long, env = "IDEM_THREADS")]
    pub(crate) threads: Option<usize>,
    /// Deadline of each store call; past it the request gets 503
    /// [default: 2s]. --upstream-timeout plus this must stay below every
    /// lease.
    #[arg(long, env = "IDEM_STORE_TIMEOUT")]
    pub(crate) store_timeout: Option<String>,
    /// How long a PostgreSQL or MySQL schema migration at start-up waits
    /// for a table's lock at each of its 3 tries; claims to the store
    /// queue behind it meanwhile, and after the last try the start fails
    /// [default: 1s; MySQL rounds up to whole seconds].
    #[arg(long, env = "IDEM_STORE_MIGRATION_LOCK_WAIT")]
    pub(crate) store_migration_lock_wait: Option<String>,
    /// How long to wait for the upstream's answer [default: 25s].
    #[arg(long, env = "IDEM_UPSTREAM_TIMEOUT")]
    pub(crate) upstream_timeout: Option<String>,
    /// How long an upstream connection may stay idle and still be used
    /// [default: 60s]. Keep it below the upstream's own keep-alive
    /// timeout, or a request can meet a connection the upstream is
    /// closing (502, key held).
    #[arg(long, env = "IDEM_UPSTREAM_IDLE_TIMEOUT")]
    pub(crate) upstream_idle_timeout: Option<String>,
    /// The HTTP version spoken to the upstream: http1, h2 (HTTP/2 over
    /// TLS), h2c (HTTP/2 in clear text, prior knowledge) or auto (ALPN
    /// picks for https://; HTTP/1.1 for http://) [default: http1].
    #[arg(long, env = "IDEM_UPSTREAM_PROTOCOL")]
    pub(crate) upstream_protocol: Option<String>,
    /// Serve HTTP/1.1 only: no h2 in the TLS listener's ALPN, no h2c on
    /// the plain one.
    #[arg(long, env = "IDEM_NO_HTTP2")]
    pub(crate) no_http2: bool,
    /// HTTP/2 streams a client connection may have open at once; also
    /// the executions its requests may have running, reset streams
    /// included [default: 100].
    #[arg(long, env = "IDEM_H2_MAX_STREAMS")]
    pub(crate) h2_max_streams: Option<usize>,
    /// Largest HTTP/2 header list a request may send [default: 16KiB].
    #[arg(long, env = "IDEM_H2_MAX_HEADER_LIST")]
    pub(crate) h2_max_header_list: Option<String>,
    /// HTTP/2 flow-control window of a stream [default: 1MiB].
    #[arg(long, env = "IDEM_H2_STREAM_WINDOW")]
    pub(crate) h2_stream_window: Option<String>,
    /// HTTP/2 flow-control window of a connection [default: 2MiB].
    #[arg(long, env = "IDEM_H2_CONNECTION_WINDOW")]
    pub(crate) h2_connection_window: Option<String>,
    /// How often an idle HTTP/2 connection is pinged; 0 never
    /// [default: 30s].
    #[arg(long, env = "IDEM_H2_KEEPALIVE_INTERVAL")]
    pub(crate) h2_keepalive_interval: Option<String>,
    /// How long an HTTP/2 ping may go unanswered before the connection
    /// is closed [default: 10s].
    #[arg(long, env = "IDEM_H2_KEEPALIVE_TIMEOUT")]
    pub(crate) h2_keepalive_timeout: Option<String>,
    /// How long an HTTP/2 connection may have no request open before it
    /// is closed [default: 60s].
    #[arg(long, env = "IDEM_H2_IDLE_TIMEOUT")]
    pub(crate) h2_idle_timeout: Option<String>,
    /// HTTP/2 streams a client may reset before the gateway takes them
    /// up, past which its connection is closed: the rapid-reset defence
    /// [default: 20].
    #[arg(long, env = "IDEM_H2_MAX_RESETS")]
    pub(crate) h2_max_resets: Option<usize>,
    /// How long running requests may finish after SIGTERM [default: 30s].
    #[arg(long, env = "IDEM_SHUTDOWN_GRACE")]
    pub(crate) shutdown_grace: Option<String>,
    /// How often expired records are purged [default: 60s].
    #[arg(long, env = "IDEM_SWEEP_INTERVAL")]
    pub(crate) sweep_interval: Option<String>,
}

#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 32, value_parser = at_least_one)]
    pub(crate) clients: usize,
    /// Logical transfers to make.
    #[arg(long, default_value_t = 3000, value_parser = at_least_one)]
    pub(crate) intents: usize,
    /// Store for the ledger: sqlite:PATH or postgres://... [default: SQLite in a temporary directory].
    #[arg(long)]
    pub(crate) store: Option<String>,
    /// Share of first attempts whose answer is lost after the commit.
    #[arg(long, default_value_t = 0.2, value_parser = share)]
    pub(crate) drop_rate: f64,
    /// Share of attempts refused with 503 before reaching the ledger.
    #[arg(long, default_value_t = 0.1, value_parser = share)]
    pub(crate) fail_rate: f64,
    /// Share of first attempts answered after the client's timeout.
    #[arg(long, default_value_t = 0.02, value_parser = share)]
    pub(crate) slow_rate: f64,
    /// Share of intents sent twice at once.
    #[arg(long, default_value_t = 0.1, value_parser = share)]
    pub(crate) duplicate_rate: f64,
    /// Share of intents whose key is then reused with a changed body.
    #[arg(long, default_value_t = 0.02, value_parser = share)]
    pub(crate) reuse_rate: f64,
    /// Seed for the fault choices.
    #[arg(long, default_value_t = 42)]
    pub(crate) seed: u64,
    /// Feed the ledger from a message broker instead of HTTP:
    /// nats://HOST:PORT (JetStream) or amqp://USER:PASS@HOST:PORT/VHOST
    /// (RabbitMQ). The consumer runs in a child process killed with
    /// SIGKILL --kills times mid-stream.
    #[arg(long, value_name = "URL")]
    pub(crate) broker: Option<String>,
    /// With --broker: instead of the demo, measure messages per second
    /// through one consumer, without idem and with its atomic mode
    /// (--intents messages per row; bench/consumer.sh).
    #[arg(long, requires = "broker")]
    pub(crate) bench: bool,
    /// With --broker: how many consumer processes are killed.
    #[arg(long, default_value_t = 5)]
    pub(crate) kills: u32,
    /// With --broker: run as a consumer child of this stream or queue.
    #[arg(long, hide = true, requires = "broker")]
    pub(crate) consumer: Option<String>,
    /// With --consumer: where to stop and wait to be killed.
    #[arg(long, hide = true, requires = "consumer")]
    pub(crate) consumer_pause: Option<String>,
    /// Also freeze the layer's record store for 1.5 s (at a quarter of the
    /// intents) and close and reopen it (at 60%), with the store's epoch
    /// watched: the invariants must still hold and no loss be noticed.
    #[arg(long, conflicts_with = "broker")]
    pub(crate) store_faults: bool,
}

/// A share, from 0 to 1 (the demo's fault rates). Refused here, with the
/// other usage errors, rather than once the demo has started.
fn share(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err("must be a number between 0 and 1".into()),
    }
}

/// A count of at least one.
fn at_least_one(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err("must be a whole number, at least 1".into()),
    }
}

/// Where `idem records` finds the records.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// The store URL.
    #[arg(long, env = "IDEM_STORE", hide_env_values = true)]
    pub(crate) store: String,
    /// Trust only the CA certificates in this PEM file for a PostgreSQL or
    /// rediss:// store, as `idem serve --store-ca`.
    #[arg(long, env = "IDEM_STORE_CA", value_name = "FILE")]
    pub(crate) store_ca: Option<PathBuf>,
}

/// Which record `idem records get` or `release` means: the key, the
/// caller's scope, and (optionally) the operation.
#[derive(Debug, Args)]
pub(crate) struct RecordTarget {
    /// The key, as the client sent it in its key header (bare, or as a
    /// quoted sf-string: both name the same key).
    pub(crate) key: String,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// The tenant (as --tenant-header would give it). Give it twice,
    /// tenant then principal, for a gateway that has both
    /// --tenant-header and --scope-header.
    #[arg(long, conflicts_with = "credential_stdin")]
    pub(crate) tenant: Vec<String>,
    /// Read the full Authorization value the client used from standard
    /// input (one line). Or set it in IDEM_CREDENTIAL. Never on the
    /// command line, where other users and shell history see it.
    #[arg(long)]
    pub(crate) credential_stdin: bool,
    /// Refused: a credential in the arguments is visible to other users
    /// and kept in shell history. Use IDEM_CREDENTIAL or
    /// --credential-stdin.
    #[arg(long, hide = true, num_args = 0..=1, value_name = "REFUSED")]
    pub(crate) credential: Option<Option<String>>,
    /// The operation's method (upper-cased: `post` is POST).
    #[arg(long, default_value = "POST")]
    pub(crate) method: String,
    /// The operation's path (or route pattern). Without it or --config,
    /// the newest record with this key in the scope is shown.
    #[arg(long)]
    pub(crate) path: Option<String>,
    /// The gateway's TOML config, whose routes name the operations.
    #[arg(long, env = "IDEM_CONFIG")]
    pub(crate) config: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RecordsCommand {
    /// Show a record.
    Get(RecordTarget),
    /// Release a record whose outcome is unresolved (in progress, its lease
    /// over: a gateway died after forwarding, and the route holds such keys
    /// for an operator): once you know the operation did not take effect,
    /// this lets the next request with the key execute it. Refused once the
    /// record is finished, and while its lease is live unless --force.
    Release {
        #[command(flatten)]
        target: RecordTarget,
        /// Release even while the lease is live. A held key that its
        /// client keeps retrying gets a new lease with each retry (each is
        /// a takeover that runs nothing), so its lease may never be seen
        /// over; make sure no execution of it is running.
        #[arg(long)]
        force: bool,
    },
    /// List stale records: in progress with their lease over (an executor
    /// or gateway died mid-request). A running gateway releases them
    /// where the route's takeover policy is `reexecute`.
    Stale {
        #[command(flatten)]
        store: StoreArgs,
        /// At most this many.
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Delete expired records, in batches.
    Purge {
        #[command(flatten)]
        store: StoreArgs,
        /// Delete records that expired at least this long ago, e.g. 1h [default: 0s].
        #[arg(long)]
        older_than: Option<String>,
    },
}
