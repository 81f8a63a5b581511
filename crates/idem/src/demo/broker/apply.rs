//! Applying one transfer message: the consumer's effect, in one commit
//! (atomic mode) or two (claim, then transfer).

use idem_consumer::{ConsumeError, Consumer, Failure, Message, Processed};
use idem_core::Atomic;
use idem_ledger::{Ledger, LedgerError, Outcome, TransferRequest};

/// How a message reaches the ledger in atomic mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Commits {
    /// Claim, then the transfer with the completion: two commits.
    Two,
    /// The claim, the transfer and the completion in one commit.
    One,
}

/// One message through the ledger, atomically.
pub(super) async fn apply_one<L: Ledger>(
    consumer: &Consumer,
    ledger: &L,
    message: Message,
    commits: Commits,
) -> Result<Processed, ConsumeError<LedgerError>> {
    let Ok(request) = serde_json::from_slice::<TransferRequest>(&message.payload) else {
        // Not a transfer: refused for good (stored, acknowledged), never
        // redelivered forever.
        return consumer
            .process(&message, |_| async {
                Err(Failure::Permanent(b"not a transfer".to_vec()))
            })
            .await;
    };
    match commits {
        Commits::One => {
            consumer
                .process_in_one_transaction(&message, |claim| {
                    let request = request.clone();
                    async move { ledger.transfer_claiming(&claim, request).await }
                })
                .await
        }
        Commits::Two => {
            consumer
                .process_atomically(&message, |claimed| async move {
                    match ledger
                        .transfer(claimed.id(), claimed.fence(), request)
                        .await
                    {
                        Ok(Outcome::Done(stored)) => Ok(Atomic::Committed(stored.body)),
                        Ok(Outcome::LostLease) => Ok(Atomic::StaleFence),
                        Err(e) => Ok(Atomic::Failed(e)),
                    }
                })
                .await
        }
    }
}
