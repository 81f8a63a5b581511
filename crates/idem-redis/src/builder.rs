//! Options for connecting a store, and connecting it.

use std::time::Duration;

use idem_core::{StoreError, StoreErrorKind};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::RedisStore;
use crate::error::redis_error;
use crate::scripts::{Keys, Scripts};

/// Options for connecting a store.
#[derive(Debug, Clone)]
pub struct RedisStoreBuilder {
    url: String,
    prefix: String,
    timeout: Duration,
}

impl RedisStoreBuilder {
    /// The default options for `url`.
    pub(crate) fn new(url: String) -> RedisStoreBuilder {
        RedisStoreBuilder {
            url,
            prefix: "idem".into(),
            timeout: Duration::from_secs(2),
        }
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

    /// Checks the URL as [`connect`](Self::connect) reads it, without
    /// connecting (for configuration checks).
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a URL the driver cannot read. The
    /// message names what is wrong, never the URL.
    pub fn check(&self) -> Result<(), StoreError> {
        self.client().map(drop)
    }

    fn client(&self) -> Result<redis::Client, StoreError> {
        redis::Client::open(self.url.as_str()).map_err(|e| {
            StoreError::new(StoreErrorKind::Setup, "redis store: invalid URL").with_source(e)
        })
    }

    /// Connects.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] for a bad URL; [`StoreErrorKind::Unavailable`]
    /// when the server does not answer.
    pub async fn connect(self) -> Result<RedisStore, StoreError> {
        let client = self.client()?;
        let config = ConnectionManagerConfig::new()
            .set_response_timeout(Some(self.timeout))
            .set_connection_timeout(Some(self.timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(500));
        let conn = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| redis_error("connecting", e))?;
        Ok(RedisStore {
            conn,
            keys: Keys::new(self.prefix),
            scripts: Scripts::new(),
        })
    }
}
