//! The connection a store talks through: one server's multiplexed
//! connection, or a cluster's (one multiplexed connection per node, each
//! command sent to the master of its first key's slot); and the slot that
//! holds it, which replaces it when it stops answering.
//!
//! # Why the store replaces connections itself
//!
//! The driver reconnects when a connection drops (a reset, a closed
//! socket), but a server that vanishes without a word (a failover to
//! another machine, a partition that outlives the sockets: packets
//! dropped, no reset) leaves a connection that only times out: the driver
//! sends every later command on it again (redis 1.8 treats a response
//! timeout as `RetryImmediately`, on one server and on a cluster alike),
//! until TCP gives up on the socket, minutes later. So a call that times
//! out, or fails with an I/O error, replaces the connection it used: the
//! next calls go over a new one (on one server, a `ConnectionManager` that
//! connects on its first command; on a cluster, a connection built in the
//! background while the old one still serves). Calls in flight on the old
//! connection finish or time out on it; it closes when the last is done.
//! Only the first failure of a connection replaces it. Nothing is added
//! to a call that succeeds: a look at the slot, no round trip.
//!
//! A call that its caller abandons (a deadline shorter than the store's
//! own timeout) replaces nothing: it says nothing about the connection,
//! which other calls share. Keep the store's timeout under the caller's.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

use crate::scripts::ScriptCall;

/// The store's connection, shared by its clones, and what it takes to
/// open another. [`get`](Self::get) the current one for each operation.
#[derive(Clone)]
pub(crate) struct Connections(Arc<Slot>);

struct Slot {
    current: RwLock<Current>,
    opener: Opener,
}

/// The connection in use, and how many replaced it before.
struct Current {
    generation: u64,
    link: Link,
}

/// How a new connection is opened.
enum Opener {
    Single {
        client: redis::Client,
        config: ConnectionManagerConfig,
    },
    Cluster {
        client: ClusterClient,
        /// A new cluster connection is being built.
        opening: AtomicBool,
    },
}

#[derive(Clone)]
enum Link {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Connections {
    /// One server, through `manager`, which `client` and `config` opened.
    pub(crate) fn single(
        manager: ConnectionManager,
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Connections {
        Connections::new(Link::Single(manager), Opener::Single { client, config })
    }

    /// A cluster, through `conn`, which `client` opened.
    pub(crate) fn cluster(conn: ClusterConnection, client: ClusterClient) -> Connections {
        Connections::new(
            Link::Cluster(conn),
            Opener::Cluster {
                client,
                opening: AtomicBool::new(false),
            },
        )
    }

    fn new(link: Link, opener: Opener) -> Connections {
        Connections(Arc::new(Slot {
            current: RwLock::new(Current {
                generation: 0,
                link,
            }),
            opener,
        }))
    }

    /// The connection in use now, for one operation.
    pub(crate) fn get(&self) -> Connection {
        let current = self
            .0
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        Connection {
            link: current.link.clone(),
            generation: current.generation,
            slot: Arc::clone(&self.0),
        }
    }
}

impl Slot {
    /// Called with each result of connection `generation`: a timeout or an
    /// I/O error replaces it, if it is still the one in use.
    fn watch<T>(self: &Arc<Slot>, generation: u64, result: &RedisResult<T>) {
        if let Err(e) = result
            && stopped_answering(e)
        {
            self.replace(generation);
        }
    }

    fn replace(self: &Arc<Slot>, generation: u64) {
        if self.generation() != generation {
            return; // replaced already
        }
        match &self.opener {
            Opener::Single { client, config } => {
                // Connects on its first command, so nothing waits here.
                let Ok(manager) =
                    ConnectionManager::new_lazy_with_config(client.clone(), config.clone())
                else {
                    return;
                };
                self.install(generation, Link::Single(manager));
            }
            Opener::Cluster { client, opening } => {
                if opening.swap(true, Ordering::AcqRel) {
                    return;
                }
                let (slot, client) = (Arc::clone(self), client.clone());
                tokio::spawn(async move {
                    // On failure the old connection stays, and its next
                    // timeout tries again.
                    if let Ok(conn) = client.get_async_connection().await {
                        slot.install(generation, Link::Cluster(conn));
                    }
                    if let Opener::Cluster { opening, .. } = &slot.opener {
                        opening.store(false, Ordering::Release);
                    }
                });
            }
        }
    }

    fn generation(&self) -> u64 {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .generation
    }

    /// Puts `link` in place of connection `generation`, unless another
    /// replaced it already.
    fn install(&self, generation: u64, link: Link) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        if current.generation == generation {
            *current = Current {
                generation: generation.wrapping_add(1),
                link,
            };
        }
    }
}

/// Whether `e` says the connection may be dead: a timeout, or an I/O
/// error (a dropped connection the driver replaces by itself too; the
/// rest it would retry on the same socket).
fn stopped_answering(e: &RedisError) -> bool {
    e.is_timeout() || e.is_io_error()
}

/// The connection of one operation: one server or a cluster. A timeout or
/// an I/O error on it replaces the store's connection (see the module
/// docs).
#[derive(Clone)]
pub(crate) struct Connection {
    link: Link,
    generation: u64,
    slot: Arc<Slot>,
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let (slot, generation) = (&self.slot, self.generation);
        let sent = match &mut self.link {
            Link::Single(c) => c.req_packed_command(cmd),
            Link::Cluster(c) => c.req_packed_command(cmd),
        };
        Box::pin(async move {
            let result = sent.await;
            slot.watch(generation, &result);
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let (slot, generation) = (&self.slot, self.generation);
        let sent = match &mut self.link {
            Link::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Link::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        };
        Box::pin(async move {
            let result = sent.await;
            slot.watch(generation, &result);
            result
        })
    }

    fn get_db(&self) -> i64 {
        match &self.link {
            Link::Single(c) => c.get_db(),
            Link::Cluster(c) => c.get_db(),
        }
    }
}

/// The slots one master serves: inclusive ranges.
pub(crate) type SlotRanges = Vec<(u16, u16)>;

/// Where a command that names no key goes: the one server, or the master
/// that serves a slot.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Node {
    Only,
    MasterOf(Route),
}

impl Connection {
    /// Sends `cmd` (which names no key) to `node`.
    async fn send_to(&mut self, node: Node, cmd: Cmd) -> RedisResult<Value> {
        match (&mut self.link, node) {
            (Link::Cluster(c), Node::MasterOf(route)) => {
                let result = c
                    .route_command(
                        cmd,
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                    )
                    .await;
                self.slot.watch(self.generation, &result);
                result
            }
            _ => cmd.query_async(self).await,
        }
    }

    /// Runs a script call. A server that does not know the script
    /// (`NOSCRIPT`: flushed, restarted, or a replica promoted since) is
    /// given it, and the call runs again.
    pub(crate) async fn run<T: FromRedisValue>(&mut self, call: &ScriptCall<'_>) -> RedisResult<T> {
        match call.command().query_async(self).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.load(call).await?;
                call.command().query_async(self).await
            }
            answered => answered,
        }
    }

    /// Runs a script call, then `WAIT replicas timeout` on the same
    /// server: the call's reply and how many replicas acknowledged every
    /// write of the call's connection so far. `WAIT` counts the writes of
    /// its own connection only, and the driver may send a request again on
    /// another connection when one drops (on a cluster, even to another
    /// node; on one server, the address may have moved to a promoted
    /// replica), so each goes in a pipeline with the connection's identity
    /// (see [`identity`]): when they differ the count says nothing about
    /// the call, and 0 is returned. Two requests rather than one pipeline
    /// for both: concurrent calls' writes then reach the server before the
    /// first `WAIT`, which covers them all. A call the driver sent twice
    /// answers its repeat: the scripts answer a repeated claim with no
    /// claim (in flight) and a repeated completion with a write of their
    /// own (see `complete.lua`), so the count still covers what the answer
    /// stands for.
    pub(crate) async fn run_then_wait<T: FromRedisValue>(
        &mut self,
        call: &ScriptCall<'_>,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<(T, i64)> {
        let mut written = redis::pipe();
        written.add_command(call.command());
        with_identity(&mut written);
        let millis = u64::try_from(timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let mut wait = redis::pipe();
        wait.cmd("WAIT").arg(replicas).arg(millis);
        with_identity(&mut wait);

        let node = self.node_of(call.first_key());
        let writer = match self.send_pipeline(node, &written).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.load(call).await?;
                self.send_pipeline(node, &written).await?
            }
            answered => answered?,
        };
        let waiter = self.send_pipeline(node, &wait).await?;
        let (reply, writer) = identity(writer)?;
        let (acked, waiter) = identity(waiter)?;
        let acked: i64 = redis::from_redis_value(acked)?;
        Ok((
            redis::from_redis_value(reply)?,
            if waiter == writer { acked } else { 0 },
        ))
    }

    /// Checks that the server answers what
    /// [`run_then_wait`](Self::run_then_wait) needs (an ACL or a managed
    /// service may refuse `CLIENT`, `INFO` or `WAIT`), so that a refusal
    /// shows at connect time, not after a claim was written.
    pub(crate) async fn check_wait_commands(&mut self) -> RedisResult<()> {
        let mut probe = redis::pipe();
        probe.cmd("WAIT").arg(0).arg(1);
        with_identity(&mut probe);
        let node = match self.link {
            Link::Single(_) => Node::Only,
            Link::Cluster(_) => Node::MasterOf(Route::new(0, SlotAddr::Master)),
        };
        identity(self.send_pipeline(node, &probe).await?).map(drop)
    }

    /// Sends `pipeline` to `node`, all of it over one connection.
    async fn send_pipeline(&mut self, node: Node, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
        match (&mut self.link, node) {
            (Link::Cluster(c), Node::MasterOf(route)) => {
                // Answered as values, errors among them: made errors here,
                // as `query_async` makes them.
                let result = c
                    .route_pipeline(
                        pipeline.clone(),
                        0,
                        pipeline.len(),
                        SingleNodeRoutingInfo::SpecificNode(route),
                    )
                    .await;
                self.slot.watch(self.generation, &result);
                result?.into_iter().map(Value::extract_error).collect()
            }
            _ => pipeline.query_async(self).await,
        }
    }

    /// The server that holds `key`.
    fn node_of(&self, key: &[u8]) -> Node {
        match self.link {
            Link::Single(_) => Node::Only,
            Link::Cluster(_) => Node::MasterOf(Route::with_key(key, SlotAddr::Master)),
        }
    }

    /// Gives the server that runs `call` its script.
    async fn load(&mut self, call: &ScriptCall<'_>) -> RedisResult<()> {
        let node = self.node_of(call.first_key());
        self.send_to(node, call.load_command()).await.map(drop)
    }

    /// Every master: the one server, or one slot of each master of the
    /// cluster (from `CLUSTER SLOTS`), for commands that must reach them
    /// all (`SCAN`).
    pub(crate) async fn masters(&mut self) -> RedisResult<Vec<Node>> {
        let Link::Cluster(_) = self.link else {
            return Ok(vec![Node::Only]);
        };
        Ok(self
            .cluster_slots()
            .await?
            .into_iter()
            .filter_map(|ranges| ranges.first().map(|(start, _)| *start))
            .map(|slot| Node::MasterOf(Route::new(slot, SlotAddr::Master)))
            .collect())
    }

    /// The slot ranges (inclusive) of each master of the cluster, from
    /// `CLUSTER SLOTS`, masters in the order it first names them, each
    /// one's ranges in slot order. Empty on one server.
    pub(crate) async fn shards(&mut self) -> RedisResult<Vec<SlotRanges>> {
        let Link::Cluster(_) = self.link else {
            return Ok(Vec::new());
        };
        let mut shards = self.cluster_slots().await?;
        for ranges in &mut shards {
            ranges.sort_unstable();
        }
        Ok(shards)
    }

    /// `CLUSTER SLOTS`, grouped by master (named by its node id, or by its
    /// address from a server too old to give ids): each master's ranges
    /// in the order the reply names them, masters in the order of their
    /// first range.
    async fn cluster_slots(&mut self) -> RedisResult<Vec<SlotRanges>> {
        let slots: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(self).await?;
        let mut seen: Vec<(Vec<u8>, SlotRanges)> = Vec::new();
        for range in &slots {
            // [start, end, [host, port, id, ...], replicas...]
            let Value::Array(parts) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
                (parts.first(), parts.get(1), parts.get(2))
            else {
                continue;
            };
            let id = match (master.get(2), master.first(), master.get(1)) {
                (Some(Value::BulkString(id)), _, _) => id.clone(),
                (_, Some(Value::BulkString(host)), Some(Value::Int(port))) => {
                    let mut id = host.clone();
                    id.extend_from_slice(&port.to_le_bytes());
                    id
                }
                _ => continue,
            };
            let (Ok(start), Ok(end)) = (u16::try_from(*start), u16::try_from(*end)) else {
                continue;
            };
            match seen.iter_mut().find(|(known, _)| *known == id) {
                Some((_, ranges)) => ranges.push((start, end)),
                None => seen.push((id, vec![(start, end)])),
            }
        }
        Ok(seen.into_iter().map(|(_, ranges)| ranges).collect())
    }

    /// `CONFIG GET name` on `node`: the value, or `None` when the server
    /// has no such setting.
    pub(crate) async fn config_get(
        &mut self,
        node: Node,
        name: &str,
    ) -> RedisResult<Option<String>> {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("GET").arg(name);
        let value = self.send_to(node, cmd).await?;
        let map: std::collections::HashMap<String, String> = redis::from_redis_value(value)?;
        Ok(map.get(name).cloned())
    }

    /// A `SCAN` of every master for keys matching `pattern`, read a page
    /// at a time with [`Scan::next_page`].
    pub(crate) async fn scan(&mut self, pattern: String) -> RedisResult<Scan> {
        let mut nodes = self.masters().await?;
        nodes.reverse();
        Ok(Scan {
            nodes,
            cursor: 0,
            pattern,
        })
    }
}

/// A `SCAN` in progress over every master, one after the other.
#[derive(Debug)]
pub(crate) struct Scan {
    /// The masters still to scan, the current one last.
    nodes: Vec<Node>,
    cursor: u64,
    pattern: String,
}

impl Scan {
    /// The next page of keys (bounded, so no call blocks a server; it may
    /// be empty), or `None` when every master has been scanned.
    pub(crate) async fn next_page(
        &mut self,
        conn: &mut Connection,
    ) -> RedisResult<Option<Vec<String>>> {
        let Some(&node) = self.nodes.last() else {
            return Ok(None);
        };
        let mut cmd = redis::cmd("SCAN");
        cmd.arg(self.cursor)
            .arg("MATCH")
            .arg(&self.pattern)
            .arg("COUNT")
            .arg(500);
        let reply = conn.send_to(node, cmd).await?;
        let (next, keys): (u64, Vec<String>) = redis::from_redis_value(reply)?;
        self.cursor = next;
        if next == 0 {
            self.nodes.pop();
        }
        Ok(Some(keys))
    }
}

/// Adds the commands that name the connection a pipeline went over:
/// `CLIENT ID` (unique within one server process) and `INFO server` (whose
/// `run_id` differs between processes, restarts included).
fn with_identity(pipeline: &mut Pipeline) {
    pipeline.cmd("CLIENT").arg("ID").cmd("INFO").arg("server");
}

/// Splits the replies of a pipeline that ended with [`with_identity`]'s
/// commands into its first reply and the connection's identity (client
/// id, server `run_id`).
fn identity(mut replies: Vec<Value>) -> RedisResult<(Value, (i64, String))> {
    let malformed = || {
        redis::RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "a pipeline did not answer with its connection's identity",
        ))
    };
    if replies.len() != 3 {
        return Err(malformed());
    }
    let info: String = redis::from_redis_value(replies.remove(2))?;
    let client: i64 = redis::from_redis_value(replies.remove(1))?;
    let run_id = info
        .lines()
        .find_map(|line| line.strip_prefix("run_id:"))
        .map(|id| id.trim().to_owned())
        .filter(|id| !id.is_empty())
        .ok_or_else(malformed)?;
    Ok((replies.remove(0), (client, run_id)))
}
