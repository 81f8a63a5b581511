//! Batches: each message of a batch has its own record, so a message that
//! fails does not undo or redo the ones that took effect; the report says
//! which deliveries to acknowledge, redeliver or reject.

use std::future::Future;

use crate::consumer::{Action, ConsumeError, Processed};
use crate::message::Message;

/// What happened to each message of a batch, in the batch's order.
#[derive(Debug)]
pub struct BatchReport<E> {
    /// One outcome per message.
    pub outcomes: Vec<Result<Processed, ConsumeError<E>>>,
}

impl<E> BatchReport<E> {
    /// The positions whose deliveries get `action`'s kind (for
    /// [`Action::Redeliver`], whatever its delay).
    fn positions(&self, wanted: fn(&Action) -> bool) -> Vec<usize> {
        self.outcomes
            .iter()
            .enumerate()
            .filter(|(_, o)| {
                let action = match o {
                    Ok(p) => p.action(),
                    Err(e) => e.action(),
                };
                wanted(&action)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Messages settled (applied now or before, or refused for good).
    pub fn to_ack(&self) -> Vec<usize> {
        self.positions(|a| *a == Action::Ack)
    }

    /// Messages to deliver again: only these; the others took effect.
    pub fn to_redeliver(&self) -> Vec<usize> {
        self.positions(|a| matches!(a, Action::Redeliver { .. }))
    }

    /// Messages never to apply (no key, or a reused key).
    pub fn to_reject(&self) -> Vec<usize> {
        self.positions(|a| *a == Action::Reject)
    }
}

/// Processes `messages` one after another with `process` (a closure that
/// calls [`Consumer::process`](crate::Consumer::process) or
/// [`Consumer::process_atomically`](crate::Consumer::process_atomically)),
/// in order, and reports each outcome. A failure does not stop the batch:
/// the messages after it are independent intents.
pub async fn process_batch<'m, F, Fut, E>(messages: &'m [Message], mut process: F) -> BatchReport<E>
where
    F: FnMut(&'m Message) -> Fut,
    Fut: Future<Output = Result<Processed, ConsumeError<E>>>,
{
    let mut outcomes = Vec::with_capacity(messages.len());
    for message in messages {
        outcomes.push(process(message).await);
    }
    BatchReport { outcomes }
}
