//! The store's epoch (`idem_core::EpochWatch`): one row of `idem_epoch`
//! for the one place, `store` (the whole file loses data together),
//! advanced by the writer inside its batch transaction.

use idem_core::EpochMark;
use rusqlite::{Connection, OptionalExtension};

/// The store's one place.
const EPOCH_PLACE: &str = "store";

/// Adds one to the counter of the place `?1`, answering its epoch and new
/// counter; no row when the place has no epoch.
const ADVANCE_EPOCH: &str =
    "UPDATE idem_epoch SET counter = counter + 1 WHERE place = ?1 RETURNING epoch, counter";

/// Writes the epoch `?2` of the place `?1`, which has none, with the
/// counter at 1.
const WRITE_EPOCH: &str = "INSERT INTO idem_epoch (place, epoch, counter) VALUES (?1, ?2, 1)";

/// Advances the epoch: adds one to its counter, or, when the place has
/// none, writes `candidate` with the counter at 1. Two statements, atomic
/// all the same: run by the writer inside its batch's transaction (`BEGIN
/// IMMEDIATE`), which holds the file's write lock, so no other writer
/// comes between them, and the answer goes out only after the commit.
pub(crate) fn advance(conn: &Connection, candidate: &str) -> rusqlite::Result<EpochMark> {
    let advanced = conn
        .prepare_cached(ADVANCE_EPOCH)?
        .query_row([EPOCH_PLACE], |r| {
            Ok((r.get::<_, String>(0)?, epoch_counter(r.get(1)?)?))
        })
        .optional()?;
    if let Some((epoch, counter)) = advanced {
        return Ok(EpochMark::new(EPOCH_PLACE, epoch, counter, false));
    }
    conn.prepare_cached(WRITE_EPOCH)?
        .execute(rusqlite::params![EPOCH_PLACE, candidate])?;
    Ok(EpochMark::new(EPOCH_PLACE, candidate, 1, true))
}

/// A stored counter; a negative one (a damaged file) is corrupt.
fn epoch_counter(stored: i64) -> rusqlite::Result<u64> {
    u64::try_from(stored).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(1, rusqlite::types::Type::Integer, Box::new(e))
    })
}
