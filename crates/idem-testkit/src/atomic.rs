//! The atomic-mode conformance suite: the checks every store whose atomic
//! mode commits a business mutation together with the record's completion
//! (SQLite, PostgreSQL) must pass.
//!
//! A store's tests implement [`AtomicHarness`] (a fresh store with a
//! business table `transfers`, one atomic call that follows a [`Plan`],
//! a row count, and a way to make completions fail) and run every check
//! with one line in a module of their own:
//!
//! ```ignore
//! mod atomic_mode {
//!     idem_testkit::atomic_conformance_tests!(super::MyHarness);
//! }
//! ```
//!
//! The checks:
//!
//! - [`commits_both_or_neither`]: a commit stores the row and the completed
//!   record together; a failing mutation writes nothing and leaves the
//!   record in progress under the caller's fence; a stale fence never runs
//!   the mutation.
//! - [`a_failing_completion_commits_nothing`]: when the completion itself
//!   fails after the mutation ran, the caller gets the error and the row is
//!   not committed, while the calls run beside it (in the same batch, on
//!   the same connection) commit.
//! - [`crash_before_commit_executes_once_on_retry`] and
//!   [`crash_after_commit_replays_on_retry`]: a child process (the macro's
//!   ignored `crash_child` test, started by [`crate::crash`]) is killed
//!   with SIGKILL inside the transaction or just after its commit; the
//!   retry after the lease then executes once, or replays.

use std::ffi::{OsStr, OsString};
use std::future::Future;
use std::pin::Pin;

use idem_core::{
    Atomic, Claim, Completion, Fence, Key, Operation, RecordId, Scope, Settled, Status, Store,
    StoreError, Timestamp,
};

use crate::{LEASE, TTL, crash, request, response, runtime, t0, unique_id};

/// What a harness's atomic call does. Every plan first inserts one row for
/// the record's key into the business table `transfers`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Completes with a 201 whose resource id is the new row's id, and
    /// answers `Atomic::Committed(row id)`.
    Transfer,
    /// Then fails the mutation with a database error (a statement that
    /// cannot run), so that the store answers `Atomic::Failed`.
    FailAfterInsert,
    /// Then completes with resource id [`REFUSED_RESOURCE_ID`], which the
    /// store refuses once [`AtomicHarness::refuse_completions`] ran.
    RefusedCompletion,
    /// Then calls [`crash::say_ready`] and never returns: the crash test
    /// kills the process there, inside the transaction.
    HangBeforeCommit,
}

/// The resource id whose completion [`AtomicHarness::refuse_completions`]
/// makes the store refuse.
pub const REFUSED_RESOURCE_ID: &str = "boom";

/// The database error message of a refused completion; the caller's error
/// must contain it.
pub const REFUSAL: &str = "completion refused";

/// What the suite sees of an atomic call: the business row's id when it
/// committed, the mutation's error as text when it failed.
pub type Outcome = Result<Atomic<String, String>, StoreError>;

/// One store call of [`AtomicHarness::run_together`]; it keeps its own
/// answer.
pub type Call<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// What the atomic-mode suite needs from a store's tests.
///
/// A harness is a place for a store (a file, a schema) with the store's
/// tables and a business table `transfers (idem_key, ...)`; dropping it
/// removes the place, except in a crash child, which does not own it.
pub trait AtomicHarness: Sized {
    /// The store under test.
    type Store: Store;

    /// A fresh place with the business table, or `None` (after saying why)
    /// when the backend is not there and the tests skip.
    fn prepare() -> impl Future<Output = Option<Self>>;

    /// What a crash child needs, as environment variables, to find this
    /// place again with [`from_crash_env`](Self::from_crash_env).
    fn crash_env(&self) -> Vec<(&'static str, OsString)>;

    /// The place named by [`crash_env`](Self::crash_env), in the crash
    /// child. Panics when the variables are missing.
    fn from_crash_env() -> impl Future<Output = Self>;

    /// Opens a store on this place, as a starting process would.
    fn connect(&self) -> impl Future<Output = Self::Store>;

    /// Runs the store's atomic mode for `id` under `fence`, with the
    /// mutation that `plan` describes.
    fn complete_atomically(
        &self,
        store: &Self::Store,
        id: &RecordId,
        fence: Fence,
        plan: Plan,
    ) -> impl Future<Output = Outcome>;

    /// Runs the store's atomic mode in one commit for `req` (claim,
    /// mutation and completion together), with the mutation that `plan`
    /// describes.
    fn claim_and_complete_atomically(
        &self,
        store: &Self::Store,
        req: &idem_core::ClaimRequest,
        plan: Plan,
    ) -> impl Future<Output = Result<idem_core::ClaimedAtomically<String, String>, StoreError>>;

    /// How many business rows `key` has, read outside the store.
    fn rows(&self, key: &str) -> impl Future<Output = i64>;

    /// Makes the store fail every completion with resource id
    /// [`REFUSED_RESOURCE_ID`] with a database error saying [`REFUSAL`]
    /// (a trigger on the records table).
    fn refuse_completions(&self) -> impl Future<Output = ()>;

    /// Runs `calls` the way the store would handle them if they arrived
    /// together: a store that batches writes puts them in one batch. The
    /// default runs them one after another.
    fn run_together<'a>(
        &'a self,
        store: &'a Self::Store,
        calls: Vec<Call<'a>>,
    ) -> impl Future<Output = ()> + 'a {
        let _ = store;
        async move {
            for call in calls {
                call.await;
            }
        }
    }
}

/// Generates the atomic-mode suite's tests for the [`AtomicHarness`]
/// `$harness`: one `#[test]` per check, the crash tests, and their ignored
/// child `crash_child`. Invoke it once per module: the crash tests find
/// their child by this module's path.
#[macro_export]
macro_rules! atomic_conformance_tests {
    ($harness:ty) => {
        #[test]
        fn commits_both_or_neither() {
            $crate::atomic::commits_both_or_neither::<$harness>();
        }

        #[test]
        fn a_failing_completion_commits_nothing() {
            $crate::atomic::a_failing_completion_commits_nothing::<$harness>();
        }

        /// The child half of the crash tests.
        #[test]
        #[ignore = "child process of the crash tests; run by them"]
        fn crash_child() {
            $crate::atomic::crash_child::<$harness>();
        }

        #[test]
        fn crash_before_commit_executes_once_on_retry() {
            $crate::atomic::crash_before_commit_executes_once_on_retry::<$harness>(
                &$crate::atomic::test_path(module_path!(), "crash_child"),
            );
        }

        #[test]
        fn crash_inside_one_commit_leaves_nothing() {
            $crate::atomic::crash_inside_one_commit_leaves_nothing::<$harness>(
                &$crate::atomic::test_path(module_path!(), "crash_child"),
            );
        }

        #[test]
        fn one_commit_claims_run_once() {
            $crate::atomic::one_commit_claims_run_once::<$harness>();
        }

        #[test]
        fn crash_after_commit_replays_on_retry() {
            $crate::atomic::crash_after_commit_replays_on_retry::<$harness>(
                &$crate::atomic::test_path(module_path!(), "crash_child"),
            );
        }
    };
}

/// The name the test harness knows test `test` of module `module_path` by
/// (the module path without the crate's name).
#[doc(hidden)]
pub fn test_path(module_path: &str, test: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, module)) => format!("{module}::{test}"),
        None => test.to_owned(),
    }
}

async fn acquire<S: Store>(store: &S, id: &RecordId, now: Timestamp) -> Fence {
    match store.claim(&request(id, "{}", now)).await {
        Ok(Claim::Acquired(lease)) => lease.fence,
        other => panic!("{id:?}: expected Acquired, got {other:?}"),
    }
}

/// A commit stores the business row and the completed record together; a
/// failing mutation writes nothing and the record stays the caller's; a
/// stale fence never runs the mutation.
pub fn commits_both_or_neither<H: AtomicHarness>() {
    runtime().block_on(async {
        let Some(h) = H::prepare().await else { return };
        let store = h.connect().await;

        // Commit: row and completed record together.
        let id = unique_id("atomic-commit-001");
        let fence = acquire(&store, &id, t0()).await;
        let out = h
            .complete_atomically(&store, &id, fence, Plan::Transfer)
            .await
            .unwrap();
        let Atomic::Committed(row) = out else {
            panic!("expected commit, got {out:?}")
        };
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!(rec.status, Status::Completed);
        assert_eq!(rec.resource_id, Some(row));
        assert_eq!(h.rows(id.key.as_str()).await, 1);

        // The mutation fails: nothing is written and the record stays ours.
        let id = unique_id("atomic-failure-01");
        let fence = acquire(&store, &id, t0()).await;
        let out = h
            .complete_atomically(&store, &id, fence, Plan::FailAfterInsert)
            .await
            .unwrap();
        assert!(matches!(out, Atomic::Failed(_)), "{out:?}");
        assert_eq!(h.rows(id.key.as_str()).await, 0);
        let rec = store.get(&id, t0()).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.fence), (Status::InProgress, fence));

        // A stale fence: the mutation is never run.
        acquire(&store, &id, t0() + LEASE).await;
        let out = h
            .complete_atomically(&store, &id, fence, Plan::Transfer)
            .await
            .unwrap();
        assert!(matches!(out, Atomic::StaleFence), "{out:?}");
        assert_eq!(h.rows(id.key.as_str()).await, 0);
    });
}

/// The completion fails after the mutation ran (a trigger refuses it): the
/// caller gets the error, the mutation is not committed and the record is
/// still the caller's, while an atomic call and a plain completion run
/// together with it commit.
pub fn a_failing_completion_commits_nothing<H: AtomicHarness>() {
    runtime().block_on(async {
        let Some(h) = H::prepare().await else { return };
        h.refuse_completions().await;
        let store = h.connect().await;
        let ids = ["fail-bad-000001", "fail-good-00001", "fail-plain-0001"].map(unique_id);
        let mut fences = Vec::new();
        for id in &ids {
            fences.push(acquire(&store, id, t0()).await);
        }
        let (bad, good, plain) = (&ids[0], &ids[1], &ids[2]);

        let (mut refused, mut committed, mut completed) = (None, None, None);
        h.run_together(
            &store,
            vec![
                Box::pin(async {
                    let plan = Plan::RefusedCompletion;
                    refused = Some(h.complete_atomically(&store, bad, fences[0], plan).await);
                }),
                Box::pin(async {
                    let plan = Plan::Transfer;
                    committed = Some(h.complete_atomically(&store, good, fences[1], plan).await);
                }),
                Box::pin(async {
                    let done = Completion::completed(response(200, "plain"));
                    completed = Some(store.complete(plain, fences[2], done, t0()).await);
                }),
            ],
        )
        .await;

        let err = match refused.expect("the refused call ran") {
            Err(e) => e,
            Ok(out) => panic!("a refused completion answered {out:?}"),
        };
        assert!(format!("{err:?}").contains(REFUSAL), "{err:?}");
        let out = committed.expect("the atomic call ran").unwrap();
        assert!(matches!(out, Atomic::Committed(_)), "{out:?}");
        let settled = completed.expect("the completion ran").unwrap();
        assert_eq!(settled, Settled::Applied);

        assert_eq!(
            h.rows(bad.key.as_str()).await,
            0,
            "the mutation was rolled back"
        );
        let rec = store.get(bad, t0()).await.unwrap().unwrap();
        assert_eq!((rec.status, rec.fence), (Status::InProgress, fences[0]));
        assert_eq!(h.rows(good.key.as_str()).await, 1);
        for id in [good, plain] {
            let rec = store.get(id, t0()).await.unwrap().unwrap();
            assert_eq!(rec.status, Status::Completed);
        }

        // In one commit, a refused completion leaves nothing, the claim
        // included, and whatever connection or writer it used serves the
        // calls after it.
        use idem_core::ClaimedAtomically::Ran;
        let id = unique_id("fail-one-commit1");
        let req = request(&id, "{}", t0());
        let err = match h
            .claim_and_complete_atomically(&store, &req, Plan::RefusedCompletion)
            .await
        {
            Err(e) => e,
            Ok(out) => panic!("a refused completion in one commit answered {out:?}"),
        };
        assert!(format!("{err:?}").contains(REFUSAL), "{err:?}");
        assert_eq!(
            h.rows(id.key.as_str()).await,
            0,
            "the mutation was rolled back"
        );
        assert!(
            store.get(&id, t0()).await.unwrap().is_none(),
            "the claim too"
        );
        for i in 0..24 {
            let id = if i == 0 {
                id.clone()
            } else {
                unique_id(&format!("fail-one-after{i:02}"))
            };
            let out = h
                .claim_and_complete_atomically(&store, &request(&id, "{}", t0()), Plan::Transfer)
                .await
                .unwrap();
            assert!(matches!(out, Ran(Atomic::Committed(_))), "{i}: {out:?}");
            assert_eq!(h.rows(id.key.as_str()).await, 1, "{i}");
        }
    });
}

/// Where the crash test kills its child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CrashPoint {
    /// Inside the transaction, after the mutation.
    BeforeCommit,
    /// Just after the commit.
    AfterCommit,
    /// Inside a one-commit transaction (claim, mutation, no commit yet).
    InsideOneTransaction,
}

impl CrashPoint {
    fn as_str(self) -> &'static str {
        match self {
            CrashPoint::BeforeCommit => "before-commit",
            CrashPoint::AfterCommit => "after-commit",
            CrashPoint::InsideOneTransaction => "inside-one-transaction",
        }
    }
}

/// The crash child's record key, chosen by the parent.
const KEY_VAR: &str = "IDEM_CRASH_KEY";
/// The crash child's [`CrashPoint`].
const POINT_VAR: &str = "IDEM_CRASH_MODE";

/// The record both halves of a crash test agree on (its place is its own).
fn crash_id(key: &str) -> RecordId {
    RecordId::new(
        Scope::from_raw("crash-test"),
        Operation::new("POST", "/transfers"),
        Key::new(key).unwrap_or_else(|e| panic!("crash key {key:?}: {e}")),
    )
}

/// The child half of the crash tests: claims, runs the transfer, says
/// [`crash::READY`] at the point its parent chose (inside the transaction,
/// or after the commit) and waits to be killed.
///
/// # Panics
/// When run by hand, without the variables its parent sets.
pub fn crash_child<H: AtomicHarness>() {
    let (Ok(key), Ok(point)) = (std::env::var(KEY_VAR), std::env::var(POINT_VAR)) else {
        panic!("crash_child needs {KEY_VAR} and {POINT_VAR}: the crash tests run it");
    };
    runtime().block_on(async {
        let h = H::from_crash_env().await;
        let store = h.connect().await;
        let id = crash_id(&key);
        if point == CrashPoint::InsideOneTransaction.as_str() {
            // Says ready from inside the mutation, and never returns.
            let out = h
                .claim_and_complete_atomically(
                    &store,
                    &request(&id, "{}", t0()),
                    Plan::HangBeforeCommit,
                )
                .await;
            panic!("the one-commit mutation returned: {out:?}");
        }
        let fence = acquire(&store, &id, t0()).await;
        let plan = if point == CrashPoint::BeforeCommit.as_str() {
            Plan::HangBeforeCommit
        } else {
            Plan::Transfer
        };
        let out = h
            .complete_atomically(&store, &id, fence, plan)
            .await
            .unwrap();
        assert!(matches!(out, Atomic::Committed(_)), "{out:?}");
        crash::say_ready();
        std::future::pending::<()>().await;
    });
}

/// SIGKILL inside the transaction, after the mutation: nothing of it is
/// left, and the retry after the lease takes the record over and executes
/// once. `child` is the test path of the harness's `crash_child`.
pub fn crash_before_commit_executes_once_on_retry<H: AtomicHarness>(child: &str) {
    crash_test::<H>(child, CrashPoint::BeforeCommit);
}

/// SIGKILL inside a one-commit transaction (the claim and the mutation
/// made, nothing committed): nothing is left, the claim included, so the
/// retry acquires at once (no lease to wait for) and executes once.
pub fn crash_inside_one_commit_leaves_nothing<H: AtomicHarness>(child: &str) {
    crash_test::<H>(child, CrashPoint::InsideOneTransaction);
}

/// SIGKILL just after the commit: the retry after the lease replays.
/// `child` is the test path of the harness's `crash_child`.
pub fn crash_after_commit_replays_on_retry<H: AtomicHarness>(child: &str) {
    crash_test::<H>(child, CrashPoint::AfterCommit);
}

fn crash_test<H: AtomicHarness>(child: &str, point: CrashPoint) {
    let rt = runtime();
    let Some(h) = rt.block_on(H::prepare()) else {
        return;
    };
    let key = format!("crash-{}-0001", point.as_str());
    let mut env = h.crash_env();
    env.push((KEY_VAR, key.clone().into()));
    env.push((POINT_VAR, point.as_str().into()));
    let env: Vec<(&str, &OsStr)> = env.iter().map(|(k, v)| (*k, v.as_os_str())).collect();
    crash::run_until_ready_then_kill(child, &env);

    rt.block_on(async {
        // The store is opened after the crash, as a restarted process would.
        let store = h.connect().await;
        let id = crash_id(&key);
        if point == CrashPoint::InsideOneTransaction {
            // No lease to wait for: the claim died with the transaction.
            let again = request(&id, "{}", t0());
            assert!(
                store.get(&id, t0()).await.unwrap().is_none(),
                "the killed transaction left its claim"
            );
            assert_eq!(h.rows(&key).await, 0, "the killed transaction left nothing");
            let out = h
                .claim_and_complete_atomically(&store, &again, Plan::Transfer)
                .await
                .unwrap();
            assert!(
                matches!(out, idem_core::ClaimedAtomically::Ran(Atomic::Committed(_))),
                "{out:?}"
            );
            assert_eq!(h.rows(&key).await, 1, "exactly one transfer");
            let replay = h
                .claim_and_complete_atomically(&store, &again, Plan::Transfer)
                .await
                .unwrap();
            assert!(
                matches!(
                    replay,
                    idem_core::ClaimedAtomically::NotAcquired(Claim::Replay(_))
                ),
                "{replay:?}"
            );
            assert_eq!(h.rows(&key).await, 1, "still one transfer");
            return;
        }
        // The retry comes after the lease.
        let retry = request(&id, "{}", t0() + LEASE);
        match (point, store.claim(&retry).await.unwrap()) {
            (CrashPoint::BeforeCommit, Claim::Acquired(lease)) => {
                assert!(lease.takeover);
                assert_eq!(h.rows(&key).await, 0, "the killed transaction left nothing");
                let out = h
                    .complete_atomically(&store, &id, lease.fence, Plan::Transfer)
                    .await
                    .unwrap();
                assert!(matches!(out, Atomic::Committed(_)), "{out:?}");
            }
            (CrashPoint::AfterCommit, Claim::Replay(rec)) => {
                assert_eq!(rec.status, Status::Completed);
            }
            (point, other) => panic!("{point:?}: unexpected claim after the crash: {other:?}"),
        }
        assert_eq!(h.rows(&key).await, 1, "exactly one transfer");
        // And any further retry replays.
        assert!(matches!(
            store.claim(&retry).await.unwrap(),
            Claim::Replay(_)
        ));
    });
}

/// The claim, the mutation and the completion in one commit: a failed
/// mutation leaves nothing, the claim included (the next attempt acquires,
/// never "in flight"); then it commits once; a retry replays and another
/// payload is a mismatch, neither running the mutation; 32 attempts at
/// once (over two store handles, as two instances) run it once.
pub fn one_commit_claims_run_once<H: AtomicHarness>() {
    use idem_core::ClaimedAtomically::{NotAcquired, Ran};
    runtime().block_on(async {
        let Some(h) = H::prepare().await else { return };
        let store = h.connect().await;
        let id = unique_id("one-commit-00001");
        let key = id.key.as_str().to_owned();

        let failed = h
            .claim_and_complete_atomically(&store, &request(&id, "{}", t0()), Plan::FailAfterInsert)
            .await
            .expect("store");
        assert!(matches!(failed, Ran(Atomic::Failed(_))), "{failed:?}");
        assert_eq!(h.rows(&key).await, 0, "the failed mutation's row");
        assert!(
            store.get(&id, t0()).await.expect("get").is_none(),
            "no claim left behind"
        );

        let done = h
            .claim_and_complete_atomically(&store, &request(&id, "{}", t0()), Plan::Transfer)
            .await
            .expect("store");
        assert!(matches!(done, Ran(Atomic::Committed(_))), "{done:?}");
        assert_eq!(h.rows(&key).await, 1);
        let record = store.get(&id, t0()).await.expect("get").expect("a record");
        assert_eq!(record.status, Status::Completed);

        let again = h
            .claim_and_complete_atomically(&store, &request(&id, "{}", t0()), Plan::Transfer)
            .await
            .expect("store");
        assert!(matches!(again, NotAcquired(Claim::Replay(_))), "{again:?}");
        let other = h
            .claim_and_complete_atomically(
                &store,
                &request(&id, r#"{"other":1}"#, t0()),
                Plan::Transfer,
            )
            .await
            .expect("store");
        assert!(
            matches!(other, NotAcquired(Claim::Mismatch { .. })),
            "{other:?}"
        );
        assert_eq!(h.rows(&key).await, 1);
        // Past its expiry the record no longer answers: the key runs anew.
        let reborn = h
            .claim_and_complete_atomically(&store, &request(&id, "{}", t0() + TTL), Plan::Transfer)
            .await
            .expect("store");
        assert!(matches!(reborn, Ran(Atomic::Committed(_))), "{reborn:?}");
        assert_eq!(h.rows(&key).await, 2, "an expired record runs anew");

        // A key claimed by another caller (a plain claim, as a gateway or a
        // two-commit consumer makes) is in flight while its lease runs, and
        // taken over, mutation and all, once it has run out.
        let id = unique_id("one-commit-held1");
        let key = id.key.as_str().to_owned();
        let _held = acquire(&store, &id, t0()).await;
        let busy = h
            .claim_and_complete_atomically(&store, &request(&id, "{}", t0()), Plan::Transfer)
            .await
            .expect("store");
        assert!(
            matches!(busy, NotAcquired(Claim::InFlight { .. })),
            "{busy:?}"
        );
        assert_eq!(h.rows(&key).await, 0);
        let taken = h
            .claim_and_complete_atomically(
                &store,
                &request(&id, "{}", t0() + LEASE),
                Plan::Transfer,
            )
            .await
            .expect("store");
        assert!(matches!(taken, Ran(Atomic::Committed(_))), "{taken:?}");
        assert_eq!(h.rows(&key).await, 1);
        let record = store
            .get(&id, t0() + LEASE)
            .await
            .expect("get")
            .expect("a record");
        assert_eq!(record.status, Status::Completed);

        let second = h.connect().await;
        let id = unique_id("one-commit-00002");
        let key = id.key.as_str().to_owned();
        let req = request(&id, "{}", t0());
        let attempts = (0..32).map(|i| {
            let store = if i % 2 == 0 { &store } else { &second };
            h.claim_and_complete_atomically(store, &req, Plan::Transfer)
        });
        let outcomes = futures_util::future::join_all(attempts).await;
        let committed = outcomes
            .iter()
            .filter(|o| matches!(o, Ok(Ran(Atomic::Committed(_)))))
            .count();
        assert_eq!(committed, 1, "{outcomes:?}");
        assert!(
            outcomes.iter().all(|o| matches!(
                o,
                Ok(Ran(Atomic::Committed(_))
                    | NotAcquired(Claim::Replay(_) | Claim::InFlight { .. }))
            )),
            "{outcomes:?}"
        );
        assert_eq!(h.rows(&key).await, 1, "one row for the key");
    });
}

#[cfg(test)]
mod tests {
    use super::test_path;

    #[test]
    fn the_test_path_drops_the_crate_name() {
        assert_eq!(
            test_path("idem_sqlite::tests::atomic_mode", "crash_child"),
            "tests::atomic_mode::crash_child"
        );
        assert_eq!(test_path("crash", "crash_child"), "crash_child");
    }
}
