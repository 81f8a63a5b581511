//! Copying the WAL back into the database file on a thread of its own, so
//! that no commit waits behind a checkpoint.
//!
//! SQLite's automatic checkpoint runs inside the commit that crosses its
//! threshold: the writer copies thousands of pages into the database file
//! and syncs it (tens of milliseconds on this machine's disk) while every
//! caller of the store waits. Here the writer's WAL hook only signals this
//! thread once the WAL holds [`Thresholds::soft`] frames, and the thread
//! runs a `PASSIVE` checkpoint on its own connection beside the writer's
//! commits, which WAL allows. Should the WAL still reach
//! [`Thresholds::hard`] frames (the thread cannot keep up), the writer
//! checkpoints inline, as SQLite would have, so the WAL's size stays
//! bounded. Durability does not change: every commit still syncs the WAL,
//! and the checkpoint syncs the database file as the store's
//! `synchronous` setting says before SQLite may reuse the WAL.

use std::ffi::c_int;
use std::path::Path;
use std::sync::mpsc;
use std::thread::JoinHandle;

use idem_core::{StoreError, StoreErrorKind};
use rusqlite::Connection;
use rusqlite::hooks::Wal;

use crate::Synchronous;
use crate::error::setup_error;
use crate::schema;

/// When the WAL's frames are handed to the checkpoint thread, and when the
/// writer checkpoints itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Thresholds {
    pub(crate) soft: c_int,
    pub(crate) hard: c_int,
}

impl Default for Thresholds {
    /// 8,000 pages (32 MiB of 4 KiB pages) as the store's automatic
    /// checkpoint had, and four times that before the writer steps in.
    fn default() -> Self {
        Thresholds {
            soft: 8_000,
            hard: 32_000,
        }
    }
}

/// Starts the checkpoint thread for the store at `path` and hands the
/// writer's connection a WAL hook that signals it. The thread ends when
/// the writer's connection closes (the hook, and with it the signal's
/// sender, goes with it).
pub(crate) fn start(
    path: &Path,
    sync: Synchronous,
    writer: &mut Connection,
    at: Thresholds,
) -> Result<JoinHandle<()>, StoreError> {
    let conn = schema::open_checkpointer(path, sync)?;
    // One pending signal is enough: the checkpoint copies whatever the WAL
    // holds when it runs.
    let (signal, signals) = mpsc::sync_channel::<()>(1);
    writer
        .wal_hook(Some(move |wal: &mut Wal, frames: c_int| {
            if frames >= at.hard {
                // An error here would report the commit that called the hook
                // as failed although it is durable: log it, as SQLite's own
                // automatic checkpoint ignores it.
                if let Err(e) = wal.checkpoint() {
                    tracing::debug!(error = %e, "sqlite store: the writer's own checkpoint failed");
                }
            } else if frames >= at.soft {
                let _ = signal.try_send(());
            }
            Ok(())
        }))
        .map_err(|e| setup_error(path, "cannot set the WAL hook", e))?;
    std::thread::Builder::new()
        .name("idem-sqlite-checkpoint".into())
        .spawn(move || {
            while signals.recv().is_ok() {
                if let Err(e) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
                    tracing::debug!(error = %e, "sqlite store: a checkpoint failed");
                }
            }
        })
        .map_err(|e| {
            StoreError::new(
                StoreErrorKind::Setup,
                "sqlite store: cannot start the checkpoint thread",
            )
            .with_source(e)
        })
}
