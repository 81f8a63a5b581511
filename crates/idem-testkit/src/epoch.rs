//! Checks of a store's epoch (`idem_core::EpochWatch`) that need more than
//! the conformance suite's one store: what the store does when its epoch
//! row is deleted or set back by hand, and two instances advancing it at
//! once. Each store's tests pass the raw statements.

use std::future::Future;
use std::sync::Arc;

use idem_core::{EpochMark, EpochWatch, LossCause, Store};

/// Advances `store`'s epoch, which has one place, `store`, and shows the
/// mark to `watch`: the causes of the losses it noticed.
async fn check<S: Store + ?Sized>(
    store: &S,
    watch: &mut EpochWatch,
    candidate: &str,
) -> Vec<LossCause> {
    let marks = store.advance_epoch(candidate).await.unwrap();
    assert_eq!(marks.len(), 1, "{marks:?}");
    assert_eq!(marks[0].place, "store");
    watch.observe(&marks).into_iter().map(|l| l.cause).collect()
}

/// The epoch's row deleted (`empty`, as an emptied store) is reported
/// [`LossCause::Emptied`], and the new epoch goes on from there; its
/// counter set to 1 (`set_back`, as a restored backup or a replica that
/// was behind) is reported [`LossCause::RolledBack`].
pub async fn hand_made_losses_are_seen<S, E, EF, B, BF>(store: &S, empty: E, set_back: B)
where
    S: Store + ?Sized,
    E: FnOnce() -> EF,
    EF: Future<Output = ()>,
    B: FnOnce() -> BF,
    BF: Future<Output = ()>,
{
    let mut watch = EpochWatch::new();
    assert!(check(store, &mut watch, "first").await.is_empty());
    assert!(check(store, &mut watch, "second").await.is_empty());
    empty().await;
    assert_eq!(
        check(store, &mut watch, "third").await,
        [LossCause::Emptied]
    );
    assert!(check(store, &mut watch, "fourth").await.is_empty());
    let marks = store.advance_epoch("fifth").await.unwrap();
    assert_eq!(marks, [EpochMark::new("store", "third", 3, false)]);
    assert!(watch.observe(&marks).is_empty());
    // Seen at 3; set back to 1, the next advance reads 2.
    set_back().await;
    assert_eq!(
        check(store, &mut watch, "sixth").await,
        [LossCause::RolledBack { seen: 3, read: 2 }]
    );
    assert!(check(store, &mut watch, "seventh").await.is_empty());
}

/// Two instances of one store (`a` and `b`: two pools on one schema or
/// database), 32 first advances at once between them: exactly one writes
/// the epoch, all read it, and each gets a counter of its own.
pub async fn concurrent_first_advances_write_one_epoch<S: Store>(a: Arc<S>, b: Arc<S>) {
    let calls: Vec<_> = (0..32)
        .map(|i| {
            let store = if i % 2 == 0 { a.clone() } else { b.clone() };
            tokio::spawn(async move { store.advance_epoch(&format!("c-{i}")).await })
        })
        .collect();
    let mut marks = Vec::new();
    for call in calls {
        marks.extend(call.await.unwrap().unwrap());
    }
    let created: Vec<_> = marks.iter().filter(|m| m.created).collect();
    assert_eq!(created.len(), 1, "{marks:?}");
    let first = &created[0].epoch;
    assert!(marks.iter().all(|m| &m.epoch == first), "{marks:?}");
    assert_eq!(created[0].counter, 1);
    let mut counters: Vec<u64> = marks.iter().map(|m| m.counter).collect();
    counters.sort_unstable();
    assert_eq!(counters, (1..=32).collect::<Vec<_>>());
}
