//! Mapping SQLite failures onto store error kinds.

use std::path::Path;

use idem_core::{StoreError, StoreErrorKind};

/// A failed operation: busy and I/O failures are transient
/// (`Unavailable`), bad stored data is `Corrupt`, the rest `Backend`.
pub(crate) fn sqlite_error(context: &str, e: rusqlite::Error) -> StoreError {
    use rusqlite::ErrorCode as C;
    let kind = match &e {
        rusqlite::Error::SqliteFailure(f, _) => match f.code {
            C::DatabaseBusy
            | C::DatabaseLocked
            | C::SystemIoFailure
            | C::DiskFull
            | C::OutOfMemory => StoreErrorKind::Unavailable,
            C::DatabaseCorrupt | C::NotADatabase => StoreErrorKind::Corrupt,
            _ => StoreErrorKind::Backend,
        },
        rusqlite::Error::InvalidColumnType(..) | rusqlite::Error::FromSqlConversionFailure(..) => {
            StoreErrorKind::Corrupt
        }
        _ => StoreErrorKind::Backend,
    };
    StoreError::new(kind, format!("sqlite store: {context}")).with_source(e)
}

/// A file that cannot be opened as a store, for `reason`: `Setup`, with a
/// message naming the file.
pub(crate) fn setup(path: &Path, reason: &str) -> StoreError {
    StoreError::new(
        StoreErrorKind::Setup,
        format!("{}: {reason}", path.display()),
    )
}

/// SQLite failed while opening the file (doing `what`): `Setup`, with a
/// hint for a file that is not SQLite or is read-only.
pub(crate) fn setup_error(path: &Path, what: &str, e: rusqlite::Error) -> StoreError {
    let hint = match &e {
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::NotADatabase => {
            " (the file is not an SQLite database)"
        }
        rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::ReadOnly => {
            " (the file or its directory is read-only)"
        }
        _ => "",
    };
    setup(path, &format!("{what}{hint}")).with_source(e)
}
