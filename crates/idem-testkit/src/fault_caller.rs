//! The caller of the store fault tests: a "gateway" that uses a [`Store`]
//! the way idem-http does, and a ledger of what ran, against which the
//! tests check their invariants.
//!
//! [`Caller`] bounds every store call by its deadline (idem-http's
//! `store_timeout`), fails closed on any store error (the request is not
//! executed), executes only on [`Claim::Acquired`], and keeps a completion
//! the store did not take pending, retrying it until it is stored (the
//! layer's pending completion). The [`Ledger`] counts executions per key
//! across every caller of a test, so "no key executes twice" is one
//! assertion, and remembers which completions the store acknowledged, so
//! "no completed record is lost" is another.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use idem_core::{
    Claim, ClaimRequest, Completion, Fence, Record, RecordId, Settled, Status, Store, StoreError,
    StoreErrorKind, StoredResponse, Timestamp,
};
use tokio::sync::watch;

use crate::fixtures::response;

/// How much later than its deadline a call may return (a loaded machine,
/// the timer's granularity) before the test fails.
pub const SLACK: Duration = Duration::from_millis(500);

/// How long a pending completion is retried before the test fails.
pub const PENDING_BUDGET: Duration = Duration::from_secs(30);

/// What a request came to.
#[derive(Debug)]
pub enum Outcome {
    /// The caller executed (it held the key) and stored the answer.
    Executed {
        /// The answer it stored.
        response: StoredResponse,
        /// Whether its claim took over an abandoned one.
        takeover: bool,
    },
    /// The store answered with the stored response.
    Replayed(StoredResponse),
    /// Another execution holds the key (409).
    InFlight,
    /// The store failed or did not answer in time: nothing ran (503).
    Refused(StoreError),
}

/// Executions and acknowledged completions per key, shared by every
/// caller of a test.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: Mutex<HashMap<RecordId, Entry>>,
    executions: watch::Sender<usize>,
}

#[derive(Debug, Default)]
struct Entry {
    executions: u32,
    stored: Option<StoredResponse>,
}

impl Ledger {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordId, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Runs the operation of `id` once more (the side effect a duplicate
    /// would repeat) and returns its answer, which names the execution.
    pub fn execute(&self, id: &RecordId, by: &str) -> StoredResponse {
        let n = {
            let mut entries = self.lock();
            let entry = entries.entry(id.clone()).or_default();
            entry.executions += 1;
            entry.executions
        };
        self.executions.send_modify(|e| *e += 1);
        response(201, &format!("{by}-execution-{n}-{}", id.key.as_str()))
    }

    /// How many times `id` was executed.
    pub fn executions(&self, id: &RecordId) -> u32 {
        self.lock().get(id).map_or(0, |e| e.executions)
    }

    /// The answer the store acknowledged for `id`, if any.
    pub fn stored(&self, id: &RecordId) -> Option<StoredResponse> {
        self.lock().get(id).and_then(|e| e.stored.clone())
    }

    /// Every key whose completion the store acknowledged.
    pub fn acknowledged(&self) -> Vec<RecordId> {
        self.lock()
            .iter()
            .filter(|(_, e)| e.stored.is_some())
            .map(|(id, _)| id.clone())
            .collect()
    }

    fn acknowledge(&self, id: &RecordId, response: StoredResponse) {
        self.lock().entry(id.clone()).or_default().stored = Some(response);
    }

    /// Waits until `n` executions happened in all.
    ///
    /// # Panics
    /// After 30 s.
    pub async fn wait_executions(&self, n: usize) {
        let mut rx = self.executions.subscribe();
        let waited = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|e| *e >= n)).await;
        assert!(
            matches!(waited, Ok(Ok(_))),
            "waited 30 s for {n} executions"
        );
    }

    /// The invariant: no key executed more than once.
    ///
    /// # Panics
    /// Naming the keys that did.
    pub fn assert_none_twice(&self) {
        let twice: Vec<String> = self
            .lock()
            .iter()
            .filter(|(_, e)| e.executions > 1)
            .map(|(id, e)| format!("{} ({} times)", id.key.as_str(), e.executions))
            .collect();
        assert!(twice.is_empty(), "keys executed more than once: {twice:?}");
    }
}

/// One gateway: a store used as idem-http uses it, under a deadline.
#[derive(Debug)]
pub struct Caller<S> {
    name: &'static str,
    store: S,
    deadline: Duration,
    ledger: std::sync::Arc<Ledger>,
}

impl<S: Store> Caller<S> {
    /// A caller named `name` (it shows in the answers it executes) whose
    /// every store call is bounded by `deadline`.
    pub fn new(
        name: &'static str,
        store: S,
        deadline: Duration,
        ledger: std::sync::Arc<Ledger>,
    ) -> Caller<S> {
        Caller {
            name,
            store,
            deadline,
            ledger,
        }
    }

    /// The store.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// One store call under the deadline: its answer, or `Unavailable`
    /// when the deadline passes first.
    ///
    /// # Panics
    /// If the call returns more than [`SLACK`] after its deadline (the
    /// invariant "no request waits past its deadlines").
    pub async fn call<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let start = Instant::now();
        let answer = match tokio::time::timeout(self.deadline, call).await {
            Ok(answer) => answer,
            Err(_) => Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("{what}: no answer within the caller's deadline"),
            )),
        };
        let took = start.elapsed();
        assert!(
            took <= self.deadline + SLACK,
            "{}: {what} took {took:?}, past its deadline of {:?}",
            self.name,
            self.deadline
        );
        answer
    }

    /// [`Store::claim`] under the deadline.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, StoreError> {
        self.call("claim", self.store.claim(req)).await
    }

    /// [`Store::complete`] under the deadline.
    pub async fn complete(
        &self,
        id: &RecordId,
        fence: Fence,
        response: StoredResponse,
        now: Timestamp,
    ) -> Result<Settled, StoreError> {
        let completion = Completion::completed(response);
        self.call("complete", self.store.complete(id, fence, completion, now))
            .await
    }

    /// [`Store::get`] under the deadline.
    pub async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        self.call("get", self.store.get(id, now)).await
    }

    /// [`Store::purge_expired`] under the deadline.
    pub async fn purge(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.call("purge", self.store.purge_expired(now, limit))
            .await
    }

    /// A request as idem-http runs one: claim; execute only when
    /// acquired, then store the answer until the store takes it.
    ///
    /// # Panics
    /// On a mismatch (the tests use one body per key), or when a pending
    /// completion fails (see [`Caller::store_completion`]).
    pub async fn request(&self, req: &ClaimRequest) -> Outcome {
        match self.claim(req).await {
            Err(e) => Outcome::Refused(e),
            Ok(Claim::Acquired(lease)) => {
                let response = self.ledger.execute(&req.id, self.name);
                self.store_completion(&req.id, lease.fence, &response, req.now)
                    .await;
                Outcome::Executed {
                    response,
                    takeover: lease.takeover,
                }
            }
            Ok(Claim::Replay(record)) => Outcome::Replayed(
                record
                    .response
                    .unwrap_or_else(|| panic!("a replay without a response")),
            ),
            Ok(Claim::InFlight { .. }) => Outcome::InFlight,
            Ok(Claim::Mismatch { .. }) => panic!("{}: unexpected mismatch", self.name),
        }
    }

    /// Stores the answer of the execution holding `fence`, retrying until
    /// the store takes it (idem-http's pending completion). A retry that
    /// finds the fence stale reads the record: it must hold this very
    /// answer (an earlier attempt was stored and its acknowledgement
    /// lost).
    ///
    /// # Panics
    /// When the record holds another answer or another state (another
    /// execution took the key: a duplicate), or after
    /// [`PENDING_BUDGET`].
    pub async fn store_completion(
        &self,
        id: &RecordId,
        fence: Fence,
        response: &StoredResponse,
        now: Timestamp,
    ) {
        let give_up = Instant::now() + PENDING_BUDGET;
        loop {
            match self.complete(id, fence, response.clone(), now).await {
                Ok(Settled::Applied) => break,
                Ok(Settled::StaleFence) => {
                    let record = loop {
                        if let Ok(record) = self.get(id, now).await {
                            break record;
                        }
                        assert!(Instant::now() < give_up, "{}: no read", self.name);
                        tokio::time::sleep(Duration::from_millis(25)).await;
                    };
                    let record = record
                        .unwrap_or_else(|| panic!("{}: the completed record is gone", self.name));
                    assert_eq!(
                        record.status,
                        Status::Completed,
                        "{}: {record:?}",
                        self.name
                    );
                    assert_eq!(
                        record.response.as_ref(),
                        Some(response),
                        "{}: another execution's answer is stored",
                        self.name
                    );
                    break;
                }
                Err(e) => {
                    assert!(
                        Instant::now() < give_up,
                        "{}: a completion never stored: {e}",
                        self.name
                    );
                    // Backoff before the next attempt.
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
            }
        }
        self.ledger.acknowledge(id, response.clone());
    }
}
