//! The connection a store talks through: one server's multiplexed
//! connection, or a cluster's (one multiplexed connection per node, each
//! command sent to the master of its first key's slot).

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Cmd, ErrorKind, FromRedisValue, Pipeline, RedisFuture, RedisResult, ServerErrorKind, Value,
};

use crate::scripts::ScriptCall;

/// One server or a cluster. Clones share the connections.
#[derive(Clone)]
pub(crate) enum Connection {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Single(c) => c.req_packed_command(cmd),
            Connection::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Single(c) => c.get_db(),
            Connection::Cluster(c) => c.get_db(),
        }
    }
}

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
        match (self, node) {
            (Connection::Cluster(c), Node::MasterOf(route)) => {
                c.route_command(
                    cmd,
                    RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route)),
                )
                .await
            }
            (c, _) => cmd.query_async(c).await,
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
        let node = match self {
            Connection::Single(_) => Node::Only,
            Connection::Cluster(_) => Node::MasterOf(Route::new(0, SlotAddr::Master)),
        };
        identity(self.send_pipeline(node, &probe).await?).map(drop)
    }

    /// Sends `pipeline` to `node`, all of it over one connection.
    async fn send_pipeline(&mut self, node: Node, pipeline: &Pipeline) -> RedisResult<Vec<Value>> {
        match (self, node) {
            (Connection::Cluster(c), Node::MasterOf(route)) => {
                // Answered as values, errors among them: made errors here,
                // as `query_async` makes them.
                c.route_pipeline(
                    pipeline.clone(),
                    0,
                    pipeline.len(),
                    SingleNodeRoutingInfo::SpecificNode(route),
                )
                .await?
                .into_iter()
                .map(Value::extract_error)
                .collect()
            }
            (c, _) => pipeline.query_async(c).await,
        }
    }

    /// The server that holds `key`.
    fn node_of(&self, key: &[u8]) -> Node {
        match self {
            Connection::Single(_) => Node::Only,
            Connection::Cluster(_) => Node::MasterOf(Route::with_key(key, SlotAddr::Master)),
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
        let Connection::Cluster(_) = self else {
            return Ok(vec![Node::Only]);
        };
        let slots: Vec<Value> = redis::cmd("CLUSTER").arg("SLOTS").query_async(self).await?;
        let mut seen: Vec<(Vec<u8>, u16)> = Vec::new();
        for range in &slots {
            // [start, end, [host, port, id, ...], replicas...]
            let Value::Array(parts) = range else { continue };
            let (Some(Value::Int(start)), Some(Value::Array(master))) =
                (parts.first(), parts.get(2))
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
            let Ok(start) = u16::try_from(*start) else {
                continue;
            };
            if !seen.iter().any(|(known, _)| *known == id) {
                seen.push((id, start));
            }
        }
        Ok(seen
            .into_iter()
            .map(|(_, slot)| Node::MasterOf(Route::new(slot, SlotAddr::Master)))
            .collect())
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
