//! Options for opening a store, and opening it: the file, the writer
//! thread, the first read connection.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicUsize;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{StoreError, StoreErrorKind};

use crate::schema;
use crate::store::{Inner, SqliteStore};
use crate::synchronous::Synchronous;
use crate::writer::Writer;

/// Options for opening a store.
#[derive(Debug, Clone)]
pub struct SqliteStoreBuilder {
    path: PathBuf,
    synchronous: Synchronous,
    max_batch: usize,
    readers: usize,
    max_queue: usize,
    write_timeout: Duration,
}

impl SqliteStore {
    /// Opens (or creates) a store at `path` with the default options.
    ///
    /// # Errors
    /// As [`SqliteStoreBuilder::open`].
    pub fn open(path: impl AsRef<Path>) -> Result<SqliteStore, StoreError> {
        SqliteStore::builder(path).open()
    }

    /// Options for opening a store at `path`.
    pub fn builder(path: impl AsRef<Path>) -> SqliteStoreBuilder {
        SqliteStoreBuilder::new(path.as_ref())
    }
}

impl SqliteStoreBuilder {
    /// The default options for a store at `path`.
    pub(crate) fn new(path: &Path) -> SqliteStoreBuilder {
        SqliteStoreBuilder {
            path: path.to_owned(),
            synchronous: Synchronous::Full,
            max_batch: 1024,
            readers: 4,
            max_queue: 10_000,
            write_timeout: Duration::from_secs(5),
        }
    }

    /// `synchronous`. Default [`Synchronous::Full`].
    pub fn synchronous(mut self, s: Synchronous) -> Self {
        self.synchronous = s;
        self
    }

    /// The most operations one transaction holds. Default 1024.
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// How many idle read connections are kept. Default 4.
    pub fn readers(mut self, n: usize) -> Self {
        self.readers = n.max(1);
        self
    }

    /// The most write operations waiting for the writer thread (not yet in
    /// a batch). A call that finds the queue full fails at once with
    /// [`StoreErrorKind::Unavailable`] (the HTTP layer answers 503). Default
    /// 10,000.
    pub fn max_queue(mut self, n: usize) -> Self {
        self.max_queue = n.max(1);
        self
    }

    /// How long a write call waits for the writer's answer (time in the
    /// queue plus the batch's transaction and fsync) before failing with
    /// [`StoreErrorKind::Unavailable`]. The operation may still be applied
    /// afterwards: see the crate docs. Default 5 s.
    pub fn write_timeout(mut self, timeout: Duration) -> Self {
        self.write_timeout = timeout;
        self
    }

    /// Opens (or creates) the store and starts its writer thread.
    ///
    /// # Errors
    /// [`StoreErrorKind::Setup`] when the file cannot be opened or created,
    /// is not an idem store, is read-only, or has a newer schema.
    pub fn open(self) -> Result<SqliteStore, StoreError> {
        let conn = schema::open_writer(&self.path, self.synchronous)?;
        let writer = Writer::new(conn, self.max_batch)?;
        // One reader up front proves the file can be read by others.
        let first_reader = schema::open_reader(&self.path)?;
        let (tx, rx) = mpsc::channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let writer_queued = queued.clone();
        let thread = std::thread::Builder::new()
            .name("idem-sqlite-writer".into())
            .spawn(move || writer.run(rx, &writer_queued))
            .map_err(|e| {
                StoreError::new(
                    StoreErrorKind::Setup,
                    "sqlite store: cannot start the writer thread",
                )
                .with_source(e)
            })?;
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                jobs: Some(tx),
                queued,
                max_queue: self.max_queue,
                write_timeout: self.write_timeout,
                thread: Some(thread),
                readers: Mutex::new(vec![first_reader]),
                max_readers: self.readers,
                path: self.path,
                synchronous: self.synchronous,
            }),
        })
    }
}
