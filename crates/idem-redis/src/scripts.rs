//! What the store keeps in Redis and the code that runs there: the names of
//! its keys, and the Lua scripts (in `lua/`), one per operation, each run
//! atomically by the server.

use idem_core::{Key, Operation, RecordId, Scope};
use redis::{Cmd, ToRedisArgs};

/// The scripts. Sent by SHA (`EVALSHA`); after a `SCRIPT FLUSH` or a server
/// restart the first call gets `NOSCRIPT` and the script is loaded again
/// (see `Connection::run`).
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    pub(crate) claim: LuaScript,
    pub(crate) complete: LuaScript,
    pub(crate) release: LuaScript,
    pub(crate) extend: LuaScript,
    pub(crate) get: LuaScript,
    pub(crate) purge: LuaScript,
    pub(crate) stale: LuaScript,
    pub(crate) find: LuaScript,
    pub(crate) epoch: LuaScript,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            claim: LuaScript::new(include_str!("lua/claim.lua")),
            complete: LuaScript::new(include_str!("lua/complete.lua")),
            release: LuaScript::new(include_str!("lua/release.lua")),
            extend: LuaScript::new(include_str!("lua/extend.lua")),
            get: LuaScript::new(include_str!("lua/get.lua")),
            purge: LuaScript::new(include_str!("lua/purge.lua")),
            stale: LuaScript::new(include_str!("lua/stale.lua")),
            find: LuaScript::new(include_str!("lua/find.lua")),
            epoch: LuaScript::new(include_str!("lua/epoch.lua")),
        }
    }
}

/// One script: its source and its SHA-1 (what `EVALSHA` names it by).
#[derive(Debug, Clone)]
pub(crate) struct LuaScript {
    hash: String,
    source: &'static str,
}

impl LuaScript {
    fn new(source: &'static str) -> LuaScript {
        LuaScript {
            hash: redis::Script::new(source).get_hash().to_owned(),
            source,
        }
    }

    /// A call of the script, to which keys and arguments are added.
    pub(crate) fn call(&self) -> ScriptCall<'_> {
        ScriptCall {
            script: self,
            keys: Vec::new(),
            args: Vec::new(),
        }
    }
}

/// A call of a script with its keys (`KEYS`) and arguments (`ARGV`). Built
/// here rather than with the driver's own script type so that the call
/// can share a pipeline (and so a connection) with a `WAIT`.
#[derive(Debug)]
pub(crate) struct ScriptCall<'s> {
    script: &'s LuaScript,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl ScriptCall<'_> {
    /// Adds a key.
    pub(crate) fn key(mut self, key: impl ToRedisArgs) -> Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Adds an argument.
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// `EVALSHA hash numkeys keys... args...`.
    pub(crate) fn command(&self) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.script.hash)
            .arg(self.keys.len())
            .arg(&self.keys)
            .arg(&self.args);
        cmd
    }

    /// `SCRIPT LOAD source`, for a server that answered `NOSCRIPT`.
    pub(crate) fn load_command(&self) -> Cmd {
        let mut cmd = redis::cmd("SCRIPT");
        cmd.arg("LOAD").arg(self.script.source);
        cmd
    }

    /// The first key: where a cluster runs the call.
    pub(crate) fn first_key(&self) -> &[u8] {
        self.keys.first().map_or(&[], Vec::as_slice)
    }
}

/// How many buckets a cluster store spreads its records over. Each bucket
/// is one hash tag (`PREFIX:{B}`), so one slot: a record, its fence, its
/// `(scope, key)` index and its bucket's in-progress index always share a
/// slot, and one script can touch them all. Part of the key layout: a
/// store reading another bucket count would not find its records.
pub(crate) const BUCKETS: u16 = 1024;

/// How keys are laid out: on one server, or spread over a cluster's slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One server: one fence counter and one in-progress index for the
    /// prefix (`PREFIX:fence`, `PREFIX:in-progress`).
    Single,
    /// Redis Cluster: every key under a bucket's hash tag (`PREFIX:{B}:...`),
    /// a fence per record, an in-progress index per bucket.
    Cluster,
}

/// The keys of one store, all under its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    layout: Layout,
    fence: String,
    in_progress: String,
    epoch: String,
}

impl Keys {
    pub(crate) fn new(prefix: String, layout: Layout) -> Keys {
        Keys {
            fence: format!("{prefix}:fence"),
            in_progress: format!("{prefix}:in-progress"),
            epoch: format!("{prefix}:epoch"),
            prefix,
            layout,
        }
    }

    /// The prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The layout.
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// What every key of `scope` and `key` starts with: the prefix, and on
    /// a cluster the bucket's hash tag.
    fn head(&self, scope: &Scope, key: &Key) -> String {
        match self.layout {
            Layout::Single => self.prefix.clone(),
            Layout::Cluster => format!("{}:{{{}}}", self.prefix, bucket(scope, key)),
        }
    }

    /// The fence counter of a record: one per prefix on one server
    /// (`PREFIX:fence`), one per record on a cluster
    /// (`PREFIX:{B}:f:LEN:SCOPE:LEN:OPERATION:KEY`, kept as long as the
    /// record's keys).
    pub(crate) fn fence(&self, id: &RecordId) -> String {
        match self.layout {
            Layout::Single => self.fence.clone(),
            Layout::Cluster => self.named(id, "f"),
        }
    }

    /// The in-progress index (a sorted set of record keys by lease end)
    /// that holds `scope` and `key`'s records: the prefix's on one server,
    /// the bucket's on a cluster.
    pub(crate) fn in_progress(&self, scope: &Scope, key: &Key) -> String {
        match self.layout {
            Layout::Single => self.in_progress.clone(),
            Layout::Cluster => format!("{}:in-progress", self.head(scope, key)),
        }
    }

    /// Every in-progress index: one on one server, one per bucket on a
    /// cluster.
    pub(crate) fn in_progress_indexes(&self) -> Vec<String> {
        match self.layout {
            Layout::Single => vec![self.in_progress.clone()],
            Layout::Cluster => (0..BUCKETS)
                .map(|b| format!("{}:{{{b}}}:in-progress", self.prefix))
                .collect(),
        }
    }

    /// A record's hash (`HEAD:r:LEN:SCOPE:LEN:OPERATION:KEY`). Lengths make
    /// it unambiguous whatever characters the scope and operation hold.
    pub(crate) fn record(&self, id: &RecordId) -> String {
        self.named(id, "r")
    }

    /// `HEAD:KIND:LEN:SCOPE:LEN:OPERATION:KEY`.
    fn named(&self, id: &RecordId, kind: &str) -> String {
        let (s, o) = (id.scope.as_str(), id.operation.as_str());
        format!(
            "{}:{kind}:{}:{s}:{}:{o}:{}",
            self.head(&id.scope, &id.key),
            s.len(),
            o.len(),
            id.key.as_str()
        )
    }

    /// The record key of `scope` and `key` around its operation part: the
    /// head (`HEAD:r:LEN:SCOPE:`) and the tail (`:KEY`), from which
    /// `find.lua` builds each record key in the index.
    pub(crate) fn record_around_operation(&self, scope: &Scope, key: &Key) -> (String, String) {
        let s = scope.as_str();
        (
            format!("{}:r:{}:{s}:", self.head(scope, key), s.len()),
            format!(":{}", key.as_str()),
        )
    }

    /// The index of `scope`'s records with `key`, whatever their operation
    /// (`HEAD:k:LEN:SCOPE:KEY`, a sorted set: operation by `created_at`).
    pub(crate) fn key_index(&self, scope: &Scope, key: &Key) -> String {
        let s = scope.as_str();
        format!(
            "{}:k:{}:{s}:{}",
            self.head(scope, key),
            s.len(),
            key.as_str()
        )
    }

    /// On a cluster, a key's bucket and what follows its hash tag.
    fn split_bucket<'k>(&self, k: &'k str) -> Option<(u16, &'k str)> {
        let rest = k.strip_prefix(&self.prefix)?.strip_prefix(":{")?;
        let (bucket, rest) = rest.split_once('}')?;
        let bucket: u16 = bucket.parse().ok().filter(|b| *b < BUCKETS)?;
        Some((bucket, rest))
    }

    /// The record id a record key names; `None` if it is not one of ours.
    pub(crate) fn id_of(&self, record_key: &str) -> Option<RecordId> {
        let rest = match self.layout {
            Layout::Single => record_key.strip_prefix(&self.prefix)?,
            Layout::Cluster => self.split_bucket(record_key)?.1,
        };
        let rest = rest.strip_prefix(":r:")?;
        let (scope_len, rest) = rest.split_once(':')?;
        let scope_len: usize = scope_len.parse().ok()?;
        let scope = rest.get(..scope_len)?;
        let rest = rest.get(scope_len..)?.strip_prefix(':')?;
        let (op_len, rest) = rest.split_once(':')?;
        let op_len: usize = op_len.parse().ok()?;
        let op = rest.get(..op_len)?;
        let key = rest.get(op_len..)?.strip_prefix(':')?;
        let id = RecordId::new(
            Scope::from_raw(scope),
            Operation::from_raw(op),
            Key::new(key).ok()?,
        );
        // On a cluster the bucket must be the one the id hashes to, or it
        // is not a key this layout wrote.
        (self.record(&id) == record_key).then_some(id)
    }

    /// The store's epoch on one server (`PREFIX:epoch`, a hash: epoch,
    /// counter; see `epoch.lua`). Not a record: no pattern or index of the
    /// records reaches it.
    pub(crate) fn epoch(&self) -> String {
        self.epoch.clone()
    }

    /// On a cluster, the epoch of the master that serves `ranges` (inclusive
    /// slot ranges): `PREFIX:{eN}:epoch`, with the first tag `eN` (N = 0, 1,
    /// ...) whose slot the master serves, so the key lives on that master
    /// and stays the same for as long as it serves those slots (whoever
    /// serves them: a promoted replica has the same key). The tag is not a
    /// bucket's (those are numbers), so no record pattern matches it.
    /// `None` when no tag was found (no slot in `ranges`).
    pub(crate) fn shard_epoch(&self, ranges: &[(u16, u16)]) -> Option<String> {
        crate::epoch::shard_tag(ranges).map(|tag| format!("{}:{{{tag}}}:epoch", self.prefix))
    }

    /// A `SCAN` pattern for every record.
    pub(crate) fn every_record(&self) -> String {
        match self.layout {
            Layout::Single => format!("{}:r:*", glob_escape(&self.prefix)),
            Layout::Cluster => format!("{}:{{*}}:r:*", glob_escape(&self.prefix)),
        }
    }

    /// A `SCAN` pattern for every key of the store.
    pub(crate) fn every_key(&self) -> String {
        format!("{}:*", glob_escape(&self.prefix))
    }
}

/// The bucket of `scope` and `key`: FNV-1a (64 bits) over the scope's
/// length, the scope and the key, modulo [`BUCKETS`]. Fixed, so every
/// instance and every version agrees where a record lives. The operation
/// is left out so that one `(scope, key)` index holds every operation's
/// records.
pub(crate) fn bucket(scope: &Scope, key: &Key) -> u16 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let s = scope.as_str().as_bytes();
    let len = u64::try_from(s.len()).unwrap_or(u64::MAX).to_le_bytes();
    let h = len
        .iter()
        .chain(s)
        .chain(key.as_str().as_bytes())
        .fold(OFFSET, |h, b| (h ^ u64::from(*b)).wrapping_mul(PRIME));
    u16::try_from(h % u64::from(BUCKETS)).unwrap_or(0)
}

/// `s` with the characters `SCAN`'s `MATCH` reads specially escaped, so a
/// prefix matches only itself.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}
