//! The store fault suite (issue 36): a real server misbehaving under a
//! store, seen from two gateways.
//!
//! Each scenario opens two stores on one namespace of the server: gateway
//! `a` through a [`FaultProxy`], gateway `b` straight to the server (a
//! second instance whose network is fine). Both are [`Caller`]s sharing
//! one [`Ledger`], and every scenario ends on the suite's invariants:
//!
//! - no key executes twice ([`Ledger::assert_none_twice`], and each key's
//!   execution count);
//! - no completed record is lost: every acknowledged answer is replayed
//!   afterwards (durable stores, and every store that did not restart);
//! - no request waits past its deadline ([`Caller::call`] fails the test
//!   when a call returns more than [`SLACK`](crate::fault_caller::SLACK)
//!   after [`DEADLINE`]).
//!
//! A store crate runs the network scenarios in one line, with an
//! [`IsolatedBackend`] whose `open` sets short timeouts:
//!
//! ```ignore
//! idem_testkit::store_fault_tests!(ShortTimeouts);
//! ```
//!
//! [`black_hole_then_heal`] is called on its own (it finds a bug in some
//! stores), and the crash scenarios are in
//! [`store_crashes`](crate::store_crashes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::{Claim, ClaimRequest, StoreError};

use crate::IsolatedBackend;
use crate::backend::unique_name;
use crate::fault_caller::{Caller, Ledger, Outcome};
use crate::fault_proxy::{Fault, FaultProxy};
use crate::fixtures::{LEASE, request, t0, unique_id};
use crate::guard::CleanupOnDrop;

/// The callers' deadline for one store call: what idem-http's
/// `store_timeout` is to the layer. A store's own timeouts should be
/// shorter (the test backends set them so).
pub const DEADLINE: Duration = Duration::from_secs(1);

/// How long a store may take to work again once the network heals.
pub const RECOVERY: Duration = Duration::from_secs(10);

/// Where in a call's round trip the network fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Hit {
    /// The request waits in a frozen network past the caller's deadline,
    /// then reaches the store late.
    Freeze,
    /// The request waits in a frozen network, then its connection is
    /// reset: the store never sees it.
    ResetBefore,
    /// The request reaches the store and commits; its answer is held past
    /// the deadline (the freeze comes after the request).
    HoldAnswer,
    /// The request reaches the store and commits; then the connection is
    /// reset and the answer is lost.
    DropAnswer,
}

impl Hit {
    /// Whether the store applied the request before the caller failed.
    fn committed(self) -> bool {
        matches!(self, Hit::HoldAnswer | Hit::DropAnswer)
    }
}

/// Two gateways on one namespace, `a` through the proxy.
struct Pair<S> {
    proxy: FaultProxy,
    a: Caller<S>,
    b: Caller<S>,
    ledger: Arc<Ledger>,
    _cleanup: CleanupOnDrop,
}

async fn pair<B: IsolatedBackend>(url: &str) -> Pair<B::Store> {
    let proxy = FaultProxy::to_url(url).await;
    let name = unique_name("faults");
    // `b` first: it creates the namespace.
    let b = B::open(url, &name).await;
    let cleanup = B::cleanup(&b);
    let a = B::open(&proxy.url(url), &name).await;
    let ledger = Arc::new(Ledger::default());
    let pair = Pair {
        a: Caller::new("a", a, DEADLINE, ledger.clone()),
        b: Caller::new("b", b, DEADLINE, ledger.clone()),
        proxy,
        ledger,
        _cleanup: cleanup,
    };
    // Connections open and statements prepared before any fault.
    let warm = unique_id("warm-up-00000001");
    let out = pair.a.request(&request(&warm, "{}", t0())).await;
    assert!(matches!(out, Outcome::Executed { .. }), "warm-up: {out:?}");
    pair
}

impl<S: idem_core::Store> Pair<S> {
    /// Runs `call` (a's) under `hit` and returns what it answered; the
    /// fault is still on afterwards, until [`Pair::heal`].
    async fn hit<T>(
        &self,
        hit: Hit,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let proxy = &self.proxy;
        match hit {
            Hit::Freeze => {
                proxy.set(Fault::Freeze);
                let answer = call.await;
                proxy.wait_request_held().await;
                answer
            }
            Hit::ResetBefore => {
                proxy.set(Fault::Freeze);
                let (answer, ()) = tokio::join!(call, async {
                    proxy.wait_request_held().await;
                    proxy.reset().await;
                });
                answer
            }
            Hit::HoldAnswer => {
                proxy.set(Fault::HoldReplies);
                let answer = call.await;
                proxy
                    .wait_until("an answer held in the proxy", |t| t.read_down > t.sent_down)
                    .await;
                answer
            }
            Hit::DropAnswer => {
                proxy.set(Fault::DropReplies);
                let answer = call.await;
                assert!(proxy.traffic().dropped > 0, "no answer was dropped");
                answer
            }
        }
    }

    /// Ends the fault; what a freeze held reaches the store before this
    /// returns.
    async fn heal(&self, hit: Hit) {
        let held = self.proxy.traffic().read_up;
        self.proxy.set(Fault::Pass);
        if hit == Hit::Freeze {
            self.proxy
                .wait_until("the held requests forwarded", |t| t.sent_up >= held)
                .await;
        }
    }
}

fn expect_refused<T: std::fmt::Debug>(what: &str, answer: Result<T, StoreError>) {
    match answer {
        // Shown with --nocapture: which bound ended the call, the store's
        // own timeout or the caller's deadline.
        Err(e) => eprintln!("{what} refused: {e}"),
        Ok(answer) => panic!("{what}: the call should have failed, got {answer:?}"),
    }
}

pub(crate) fn replayed(what: &str, out: Outcome) -> idem_core::StoredResponse {
    match out {
        Outcome::Replayed(r) => r,
        other => panic!("{what}: expected a replay, got {other:?}"),
    }
}

/// The claim fails under `hit`: `a` does not execute. While the fault
/// lasts, `b`'s request executes if the store never saw `a`'s claim and
/// is in flight if it did (a claim committed whose answer was lost is
/// never followed by a fresh acquisition beside it). After the fault, `a`'s
/// retry is replayed, or in flight until the lease ends and then a
/// takeover, which is the key's one execution.
pub async fn fault_during_claim<B: IsolatedBackend>(url: &str, hit: Hit) {
    let p = pair::<B>(url).await;
    let id = unique_id("claim-fault-0001");
    let req = request(&id, "{}", t0());
    expect_refused("a's claim", p.hit(hit, p.a.claim(&req)).await);

    let during = p.b.request(&req).await;
    match (hit.committed(), &during) {
        (true, Outcome::InFlight) => {}
        (
            false,
            Outcome::Executed {
                takeover: false, ..
            },
        ) => {}
        _ => panic!("{hit:?}: b's request during the fault: {during:?}"),
    }
    p.heal(hit).await;

    let retry = p.a.request(&req).await;
    if hit.committed() {
        assert!(matches!(retry, Outcome::InFlight), "{hit:?}: {retry:?}");
        let later = request(&id, "{}", t0() + LEASE + Duration::from_secs(1));
        let took = p.a.request(&later).await;
        assert!(
            matches!(took, Outcome::Executed { takeover: true, .. }),
            "{hit:?}: after the lease: {took:?}"
        );
    } else {
        let answer = replayed("a's retry", retry);
        assert_eq!(Some(answer), p.ledger.stored(&id));
    }
    assert_eq!(p.ledger.executions(&id), 1);
    p.ledger.assert_none_twice();
    let stored = p.ledger.stored(&id);
    assert_eq!(Some(replayed("b", p.b.request(&req).await)), stored);
}

/// `a` executed; its completion fails under `hit`. `b` meanwhile is
/// answered from the record (a replay if the completion committed, in
/// flight if not), never runs it; `a`'s pending completion is stored once
/// the fault ends (or found stored), and both replay it.
pub async fn fault_during_completion<B: IsolatedBackend>(url: &str, hit: Hit) {
    let p = pair::<B>(url).await;
    let id = unique_id("completion-fault-0001");
    let req = request(&id, "{}", t0());
    let lease = match p.a.claim(&req).await {
        Ok(Claim::Acquired(lease)) => lease,
        other => panic!("a's claim: {other:?}"),
    };
    let answer = p.ledger.execute(&id, "a");
    let completion = p.a.complete(&id, lease.fence, answer.clone(), req.now);
    expect_refused("a's completion", p.hit(hit, completion).await);

    let during = p.b.request(&req).await;
    match (hit.committed(), during) {
        (true, Outcome::Replayed(r)) => assert_eq!(r, answer),
        (false, Outcome::InFlight) => {}
        (_, other) => panic!("{hit:?}: b's request during the fault: {other:?}"),
    }
    p.heal(hit).await;

    p.a.store_completion(&id, lease.fence, &answer, req.now)
        .await;
    assert_eq!(replayed("a", p.a.request(&req).await), answer);
    assert_eq!(replayed("b", p.b.request(&req).await), answer);
    assert_eq!(p.ledger.executions(&id), 1);
    p.ledger.assert_none_twice();
}

/// The purge fails under `hit`. Live records are untouched meanwhile (a
/// completed one replays, one in progress stays in flight); once the fault
/// ends the purge finishes, deleting only the expired records.
pub async fn fault_during_purge<B: IsolatedBackend>(url: &str, hit: Hit) {
    let p = pair::<B>(url).await;
    let short = |key: &str| ClaimRequest {
        ttl: Duration::from_secs(1),
        ..request(&unique_id(key), "{}", t0())
    };
    let expired: Vec<ClaimRequest> = (0..3)
        .map(|i| short(&format!("purge-old-{i:04}")))
        .collect();
    for req in &expired {
        let out = p.b.request(req).await;
        assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
    }
    let live = request(&unique_id("purge-live-0001"), "{}", t0());
    let out = p.b.request(&live).await;
    assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
    let running = request(&unique_id("purge-running-01"), "{}", t0());
    assert!(matches!(p.b.claim(&running).await, Ok(Claim::Acquired(_))));

    // Past the short records' life, within the lease and the others' life.
    let later = t0() + Duration::from_secs(10);
    let at = |req: &ClaimRequest| ClaimRequest {
        now: later,
        ..req.clone()
    };
    expect_refused("a's purge", p.hit(hit, p.a.purge(later, 100)).await);

    let stored = p.ledger.stored(&live.id);
    assert_eq!(
        Some(replayed("live", p.b.request(&at(&live)).await)),
        stored
    );
    let out = p.b.request(&at(&running)).await;
    assert!(matches!(out, Outcome::InFlight), "{out:?}");
    p.heal(hit).await;

    let mut rounds = 0;
    while p.a.purge(later, 2).await.unwrap_or(2) == 2 {
        rounds += 1;
        assert!(rounds < 50, "the purge never finished");
    }
    for req in &expired {
        // Gone from the store, not only expired: read at a time it lived.
        let record = p.b.get(&req.id, req.now).await.unwrap();
        assert_eq!(record, None, "an expired record survived the purge");
    }
    assert_eq!(
        Some(replayed("live", p.b.request(&at(&live)).await)),
        stored
    );
    let out = p.b.request(&at(&running)).await;
    assert!(matches!(out, Outcome::InFlight), "{out:?}");
    for req in expired.iter().chain([&live]) {
        assert_eq!(p.ledger.executions(&req.id), 1);
    }
}

/// The server vanishes behind `a`'s open connections (a black hole, as
/// after a failover to another machine), then the network heals for new
/// connections while the old ones stay dead. `a`'s calls fail within their
/// deadline throughout, `b` works, and `a` works again within
/// [`RECOVERY`]: a store must not keep using connections that no longer
/// answer.
pub async fn black_hole_then_heal<B: IsolatedBackend>(url: &str) {
    let p = pair::<B>(url).await;
    let id = unique_id("black-hole-0001");
    let req = request(&id, "{}", t0());
    p.proxy.set(Fault::BlackHole);
    expect_refused("a's claim", p.a.claim(&req).await);
    let out = p.b.request(&req).await;
    assert!(matches!(out, Outcome::Executed { .. }), "{out:?}");
    p.proxy.set(Fault::Pass);

    let start = Instant::now();
    let answer = loop {
        match p.a.request(&req).await {
            Outcome::Replayed(answer) => break answer,
            Outcome::Refused(e) => assert!(
                start.elapsed() < RECOVERY,
                "the store did not recover in {RECOVERY:?} after the network healed: {e}"
            ),
            other => panic!("{other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(Some(answer), p.ledger.stored(&id));
    assert_eq!(p.ledger.executions(&id), 1);
}

/// One `#[test]` per fault during the claim, the completion and the purge
/// ([`fault_during_claim`](crate::store_faults::fault_during_claim) and
/// the others) for the [`IsolatedBackend`] `$backend`, against its server
/// (each test skips outside CI when the server's URL is not set, and fails
/// under CI). [`black_hole_then_heal`](crate::store_faults::black_hole_then_heal)
/// and the crash scenarios are called by each store's tests.
#[macro_export]
macro_rules! store_fault_tests {
    ($backend:ty) => {
        $crate::store_fault_tests!(@each $backend;
            claim_frozen => fault_during_claim(Freeze),
            claim_reset_before_the_store => fault_during_claim(ResetBefore),
            claim_answer_held => fault_during_claim(HoldAnswer),
            claim_answer_lost => fault_during_claim(DropAnswer),
            completion_frozen => fault_during_completion(Freeze),
            completion_reset_before_the_store => fault_during_completion(ResetBefore),
            completion_answer_held => fault_during_completion(HoldAnswer),
            completion_answer_lost => fault_during_completion(DropAnswer),
            purge_frozen => fault_during_purge(Freeze),
            purge_reset_before_the_store => fault_during_purge(ResetBefore),
            purge_answer_held => fault_during_purge(HoldAnswer),
            purge_answer_lost => fault_during_purge(DropAnswer),
        );
    };
    (@each $backend:ty; $($name:ident => $scenario:ident($hit:ident)),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                let Some(url) = <$backend as $crate::IsolatedBackend>::url() else { return };
                $crate::runtime().block_on($crate::store_faults::$scenario::<$backend>(
                    &url,
                    $crate::store_faults::Hit::$hit,
                ));
            }
        )*
    };
}
