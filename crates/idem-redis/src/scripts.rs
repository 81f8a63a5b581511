//! What the store keeps in Redis and the code that runs there: the names of
//! its keys, and the Lua scripts (in `lua/`), one per operation, each run
//! atomically by the server.

use idem_core::{Key, Operation, RecordId, Scope};
use redis::Script;

/// The scripts. Sent by SHA (`EVALSHA`); after a `SCRIPT FLUSH` or a server
/// restart the first call gets `NOSCRIPT` and the script is loaded again.
#[derive(Clone)]
pub(crate) struct Scripts {
    pub(crate) claim: Script,
    pub(crate) complete: Script,
    pub(crate) release: Script,
    pub(crate) get: Script,
    pub(crate) purge: Script,
    pub(crate) stale: Script,
    pub(crate) find: Script,
}

impl Scripts {
    pub(crate) fn new() -> Scripts {
        Scripts {
            claim: Script::new(include_str!("lua/claim.lua")),
            complete: Script::new(include_str!("lua/complete.lua")),
            release: Script::new(include_str!("lua/release.lua")),
            get: Script::new(include_str!("lua/get.lua")),
            purge: Script::new(include_str!("lua/purge.lua")),
            stale: Script::new(include_str!("lua/stale.lua")),
            find: Script::new(include_str!("lua/find.lua")),
        }
    }
}

/// The keys of one store, all under its prefix.
#[derive(Debug, Clone)]
pub(crate) struct Keys {
    prefix: String,
    fence: String,
    in_progress: String,
}

impl Keys {
    pub(crate) fn new(prefix: String) -> Keys {
        Keys {
            fence: format!("{prefix}:fence"),
            in_progress: format!("{prefix}:in-progress"),
            prefix,
        }
    }

    /// The prefix.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The fence counter (`PREFIX:fence`).
    pub(crate) fn fence(&self) -> &str {
        &self.fence
    }

    /// The in-progress index, a sorted set of record keys by lease end
    /// (`PREFIX:in-progress`).
    pub(crate) fn in_progress(&self) -> &str {
        &self.in_progress
    }

    /// A record's hash (`PREFIX:r:LEN:SCOPE:LEN:OPERATION:KEY`). Lengths make
    /// it unambiguous whatever characters the scope and operation hold.
    pub(crate) fn record(&self, id: &RecordId) -> String {
        let (s, o) = (id.scope.as_str(), id.operation.as_str());
        format!(
            "{}:r:{}:{s}:{}:{o}:{}",
            self.prefix,
            s.len(),
            o.len(),
            id.key.as_str()
        )
    }

    /// The record key of `scope` and `key` around its operation part: the
    /// head (`PREFIX:r:LEN:SCOPE:`) and the tail (`:KEY`), from which
    /// `find.lua` builds each record key in the index.
    pub(crate) fn record_around_operation(&self, scope: &Scope, key: &Key) -> (String, String) {
        let s = scope.as_str();
        (
            format!("{}:r:{}:{s}:", self.prefix, s.len()),
            format!(":{}", key.as_str()),
        )
    }

    /// The index of `scope`'s records with `key`, whatever their operation
    /// (`PREFIX:k:LEN:SCOPE:KEY`, a sorted set: operation by `created_at`).
    pub(crate) fn key_index(&self, scope: &Scope, key: &Key) -> String {
        let s = scope.as_str();
        format!("{}:k:{}:{s}:{}", self.prefix, s.len(), key.as_str())
    }

    /// The record id a record key names; `None` if it is not one of ours.
    pub(crate) fn id_of(&self, record_key: &str) -> Option<RecordId> {
        let rest = record_key.strip_prefix(&self.prefix)?.strip_prefix(":r:")?;
        let (scope_len, rest) = rest.split_once(':')?;
        let scope_len: usize = scope_len.parse().ok()?;
        let scope = rest.get(..scope_len)?;
        let rest = rest.get(scope_len..)?.strip_prefix(':')?;
        let (op_len, rest) = rest.split_once(':')?;
        let op_len: usize = op_len.parse().ok()?;
        let op = rest.get(..op_len)?;
        let key = rest.get(op_len..)?.strip_prefix(':')?;
        Some(RecordId::new(
            Scope::from_raw(scope),
            Operation::from_raw(op),
            Key::new(key).ok()?,
        ))
    }

    /// A `SCAN` pattern for every record.
    pub(crate) fn every_record(&self) -> String {
        format!("{}:r:*", self.prefix)
    }

    /// A `SCAN` pattern for every key of the store.
    pub(crate) fn every_key(&self) -> String {
        format!("{}:*", self.prefix)
    }
}
