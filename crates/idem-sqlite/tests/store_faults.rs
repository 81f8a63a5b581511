//! The store fault suite's SQLite part (issue 36): the store on a full
//! filesystem and on a read-only one, each a small `tmpfs` of the test's
//! own (root only: the tests skip elsewhere, and fail under CI). The
//! suite's invariants hold: nothing executes twice, no acknowledged
//! completion is lost (the store is reopened to check), and no call waits
//! past its deadline.
#![allow(clippy::unwrap_used)] // a test crate: a panic is a failed assertion

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use idem_core::{Claim, ClaimRequest, StoreErrorKind};
use idem_sqlite::SqliteStore;
use idem_testkit::fault_caller::{Caller, Ledger, Outcome};
use idem_testkit::store_faults::DEADLINE;
use idem_testkit::tmpfs::Tmpfs;
use idem_testkit::{request, t0, unique_id};

fn open(path: &Path) -> SqliteStore {
    SqliteStore::builder(path)
        .write_timeout(Duration::from_millis(800))
        .open()
        .unwrap()
}

fn requests(tag: &str, n: usize) -> Vec<ClaimRequest> {
    (0..n)
        .map(|i| request(&unique_id(&format!("{tag}-{i:04}")), "{}", t0()))
        .collect()
}

/// Every request of `reqs` replays the answer the ledger says was stored.
async fn all_replayed(caller: &Caller<SqliteStore>, ledger: &Ledger, reqs: &[ClaimRequest]) {
    for req in reqs {
        match caller.request(req).await {
            Outcome::Replayed(answer) => assert_eq!(Some(answer), ledger.stored(&req.id)),
            other => panic!("{}: {other:?}", req.id.key.as_str()),
        }
    }
}

/// The filesystem fills up between a claim and its completion: the
/// completion fails (`Unavailable`, within its deadline) and a retry of
/// the key meanwhile is refused or in flight, never executed; a new key is refused
/// and not executed. Once there is space again the pending completion is
/// stored, the refused key executes once, and after a reopen every
/// acknowledged answer is there.
#[test]
fn a_full_disk_refuses_writes_and_loses_nothing() {
    let Some(fs) = Tmpfs::mount(2 << 20) else {
        return;
    };
    let path = fs.path().join("idem.db");
    idem_testkit::runtime().block_on(async {
        let ledger = Arc::new(Ledger::default());
        let a = Caller::new("a", open(&path), DEADLINE, ledger.clone());
        let before = requests("disk-before", 5);
        for req in &before {
            let out = a.request(req).await;
            assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
        }
        let pending = request(&unique_id("disk-pending-0001"), "{}", t0());
        let Ok(Claim::Acquired(lease)) = a.claim(&pending).await else {
            panic!("claim before the disk fills");
        };

        let filled = fs.fill();
        eprintln!("filled the tmpfs with {filled} bytes");
        let answer = ledger.execute(&pending.id, "a");
        let err = a
            .complete(&pending.id, lease.fence, answer.clone(), t0())
            .await
            .unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Unavailable, "{err}");
        // A claim is a write here too (the writer commits each batch), so
        // the retry is refused or in flight: never executed.
        let out = a.request(&pending).await;
        assert!(
            matches!(out, Outcome::InFlight | Outcome::Refused(_)),
            "{out:?}"
        );
        let refused = request(&unique_id("disk-refused-0001"), "{}", t0());
        let out = a.request(&refused).await;
        assert!(matches!(out, Outcome::Refused(_)), "{out:?}");
        assert_eq!(ledger.executions(&refused.id), 0);

        fs.free();
        a.store_completion(&pending.id, lease.fence, &answer, t0())
            .await;
        let out = a.request(&refused).await;
        assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
        drop(a);

        let reopened = Caller::new("reopened", open(&path), DEADLINE, ledger.clone());
        let all: Vec<ClaimRequest> = before.into_iter().chain([pending, refused]).collect();
        all_replayed(&reopened, &ledger, &all).await;
        ledger.assert_none_twice();
    });
}

/// The store's file on a filesystem remounted read-only (what Linux does
/// to a filesystem after an I/O error), then a file made read-only by its
/// mode: opening is refused (`Setup`, naming the cause), so nothing can
/// run against it. Writable again, the store opens with every record, and
/// a new key executes once.
#[test]
fn a_read_only_file_is_refused_and_keeps_its_records() {
    use std::os::unix::fs::PermissionsExt;
    let Some(fs) = Tmpfs::mount(4 << 20) else {
        return;
    };
    let path = fs.path().join("idem.db");
    idem_testkit::runtime().block_on(async {
        let ledger = Arc::new(Ledger::default());
        let a = Caller::new("a", open(&path), DEADLINE, ledger.clone());
        let before = requests("read-only-before", 4);
        for req in &before {
            let out = a.request(req).await;
            assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
        }
        // Dropping the store joins its writer: the file is closed.
        drop(a);

        fs.remount_read_only();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Setup, "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
        fs.remount_read_write();

        let writable = std::fs::metadata(&path).unwrap().permissions();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)).unwrap();
        let err = SqliteStore::open(&path).unwrap_err();
        assert_eq!(err.kind(), StoreErrorKind::Setup, "{err}");
        assert!(err.to_string().contains("read-only"), "{err}");
        std::fs::set_permissions(&path, writable).unwrap();

        let b = Caller::new("b", open(&path), DEADLINE, ledger.clone());
        all_replayed(&b, &ledger, &before).await;
        let new = request(&unique_id("read-only-after-01"), "{}", t0());
        let out = b.request(&new).await;
        assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
        ledger.assert_none_twice();
    });
}
