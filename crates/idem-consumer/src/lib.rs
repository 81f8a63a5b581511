//! Idempotent message consumers: one effect per message from brokers that
//! deliver at least once.
//!
//! A broker redelivers a message its consumer applied but did not
//! acknowledge (a crash, a lost ack), and a producer that retries a publish
//! sends it twice. idem treats each message as one intent: its key (the
//! producer's message id, a header, or a field of the payload, as the
//! caller chooses with [`KeySource`]) names the intent, the payload's
//! fingerprint binds it, and the same records, leases and fences as the
//! HTTP layer make the effect run once:
//!
//! - a new key is claimed, the effect runs, and its result is stored;
//! - a duplicate (same key, same payload) is acknowledged with the stored
//!   result, without running the effect ([`Processed::Duplicate`]);
//! - the same key with another payload is refused
//!   ([`ConsumeError::KeyReused`], [`Action::Reject`]);
//! - a transient failure releases the claim and asks for redelivery; a
//!   permanent one is stored and acknowledged ([`Failure`]);
//! - a message another consumer is processing is redelivered after that
//!   consumer's lease ([`ConsumeError::InFlight`]).
//!
//! **Atomic mode** ([`Consumer::process_atomically`]) commits the effect
//! and the record in one transaction of the store's database (SQLite,
//! PostgreSQL): a crash between the effect and the acknowledgement leaves
//! either both or neither, so a redelivery never applies a message twice.
//! Plain mode ([`Consumer::process`]) cannot close that window for effects
//! outside the store.
//!
//! Batches ([`process_batch`]) settle each message on its own record: one
//! failure does not redo the others, and the [`BatchReport`] says which
//! deliveries to redeliver.
//!
//! It is not a broker client: the adapters for NATS JetStream and RabbitMQ
//! map deliveries to [`Message`] and [`Action`] to acks.
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use idem_consumer::{Consumer, Failure, KeySource, Message, Processed};
//! use idem_core::{MemoryStore, Scope};
//!
//! # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
//! let consumer = Consumer::new(
//!     Arc::new(MemoryStore::new()),
//!     Scope::from_tenant(b"payments"),
//!     "apply-transfer",
//!     KeySource::JsonPointer("/transfer_id".into()),
//! );
//! let message = Message::new(r#"{"transfer_id": "t-1", "amount": 100}"#)
//!     .with_content_type("application/json");
//! let apply = |_: &_| async { Ok::<_, Failure<std::io::Error>>(b"applied".to_vec()) };
//! assert!(matches!(consumer.process(&message, apply).await, Ok(Processed::Applied(_))));
//! // Delivered again: acknowledged with the stored result, not applied.
//! let again = consumer.process(&message, |_: &_| async { unreachable!() }).await;
//! assert!(matches!(again, Ok::<_, idem_consumer::ConsumeError<std::io::Error>>(Processed::Duplicate(r)) if r == b"applied"));
//! # });
//! ```

mod batch;
mod broker;
mod consumer;
mod message;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;

pub use batch::{BatchReport, process_batch};
pub use broker::BrokerError;
pub use consumer::{
    APPLIED, Action, Claimed, ConsumeError, Consumer, Failure, IN_FLIGHT_RECHECK, Processed,
    REDELIVERY_DELAY, REFUSED, applied, refused,
};
pub use message::{KeySource, Message, MissingKey};

/// The README's examples, compiled and run by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
