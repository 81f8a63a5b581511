//! The RabbitMQ adapter (feature `rabbitmq`, on [`lapin`]): an AMQP 0-9-1
//! delivery as a [`Message`], and an [`Action`] as its acknowledgement.
//!
//! ```no_run
//! use std::sync::Arc;
//! use futures_util::StreamExt;
//! use idem_consumer::{Consumer, Failure, KeySource, rabbitmq};
//! use idem_core::{MemoryStore, Scope};
//! use lapin::options::{BasicConsumeOptions, BasicQosOptions};
//! use lapin::types::FieldTable;
//! use lapin::{Connection, ConnectionProperties};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let amqp = Connection::connect("amqp://127.0.0.1:5672/%2f", ConnectionProperties::default()).await?;
//! let channel = amqp.create_channel().await?;
//! // Manual acks (no_ack = false, the default) and a bounded prefetch.
//! channel.basic_qos(32, BasicQosOptions::default()).await?;
//! let mut deliveries = channel
//!     .basic_consume("transfers".into(), "".into(), BasicConsumeOptions::default(), FieldTable::default())
//!     .await?;
//! let consumer = Consumer::new(
//!     Arc::new(MemoryStore::new()),
//!     Scope::from_tenant(b"payments"),
//!     "apply-transfer",
//!     KeySource::JsonPointer("/transfer_id".into()),
//! );
//! while let Some(delivery) = deliveries.next().await {
//!     let delivery = delivery?;
//!     let outcome = consumer
//!         .process(&rabbitmq::message(&delivery), |_claim| async {
//!             // Apply the transfer here.
//!             Ok::<_, Failure<std::io::Error>>(b"applied".to_vec())
//!         })
//!         .await;
//!     let action = match &outcome {
//!         Ok(processed) => processed.action(),
//!         Err(e) => e.action(),
//!     };
//!     rabbitmq::settle(&delivery, action).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # What it maps
//!
//! [`message`] reads the delivery's properties, never the broker's own
//! bookkeeping (delivery tag, `redelivered` flag), which differ between two
//! deliveries of one intent:
//!
//! | [`Message`] | AMQP |
//! |---|---|
//! | `id` | the `message-id` property, as the producer set it |
//! | `headers` | the `headers` table's entries whose value is a short or long string (UTF-8); entries of other types (numbers, booleans, tables, arrays, byte arrays) and long strings that are not UTF-8 are left out |
//! | `content_type` | the `content-type` property |
//! | `payload` | the body |
//!
//! A header left out is missing for [`KeySource::Header`](crate::KeySource::Header):
//! such a message is rejected, never applied unkeyed.
//!
//! # How each action settles
//!
//! - [`Action::Ack`]: `basic.ack` of this delivery alone.
//! - [`Action::Redeliver`]: after `after` (AMQP 0-9-1 has no per-message
//!   delay, so `settle` holds the delivery that long, keeping its prefetch
//!   slot), `basic.nack` with `requeue = true`: the message goes back to
//!   its queue with `redelivered` set, and the broker may hand it to this
//!   consumer or another. So a failing message comes back at most once a
//!   [`REDELIVERY_DELAY`](crate::REDELIVERY_DELAY), not in a hot loop; a
//!   message another consumer holds is waited for in process first
//!   ([`Consumer::wait_in_flight`](crate::Consumer::wait_in_flight)). Each
//!   requeue counts against a quorum queue's `x-delivery-limit`: size it
//!   for the retries you want, or route failures through a retry queue
//!   whose message TTL dead-letters them back.
//! - [`Action::Reject`]: `basic.reject` with `requeue = false`. The broker
//!   drops the message, or moves it to the queue's dead-letter exchange
//!   when the queue has one (`x-dead-letter-exchange`): it is never
//!   delivered to this queue again.
//!
//! # The broker settings it needs
//!
//! - **Manual acknowledgements**: consume with `no_ack = false`
//!   ([`BasicConsumeOptions`](lapin::options::BasicConsumeOptions)'s
//!   default). With automatic acks the broker forgets a message as it
//!   sends it, and a consumer that dies mid-effect loses it.
//! - **A prefetch** (`basic.qos`, for instance 32): the bound on
//!   unacknowledged deliveries per consumer, and so on how much work a
//!   crash sends back and how fast requeued messages return.
//! - **Redelivery is by channel**: when a consumer's channel or connection
//!   closes (a crash, a lost connection, `channel.close`), the broker
//!   requeues every delivery it had not acknowledged, marked
//!   `redelivered`. The record answers that redelivery: an effect that
//!   committed before the ack was lost is acknowledged as
//!   [`Processed::Duplicate`](crate::Processed::Duplicate), not applied
//!   again (in atomic mode).
//! - The consumer's lease ([`Policy`](idem_core::Policy)) should outlast
//!   the effect, and RabbitMQ's `consumer_timeout` (30 minutes by default)
//!   should outlast the lease: the broker closes the channel of a consumer
//!   that holds a delivery unacknowledged past it.
//! - A dead-letter exchange on the queue keeps the rejected messages (no
//!   key, a key reused with another payload) for inspection; without one
//!   they are dropped.

use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicNackOptions, BasicRejectOptions};
use lapin::types::AMQPValue;

use crate::{Action, BrokerError, Message};

/// The broker-neutral message of `delivery`: its `message-id`, its string
/// headers, its `content-type` and its body (see the module docs for what
/// is left out).
pub fn message(delivery: &Delivery) -> Message {
    let properties = &delivery.properties;
    let headers = properties
        .headers()
        .as_ref()
        .map(|table| {
            table
                .into_iter()
                .filter_map(|(name, value)| {
                    let value = match value {
                        AMQPValue::LongString(s) => std::str::from_utf8(s.as_bytes()).ok()?,
                        AMQPValue::ShortString(s) => s.as_str(),
                        _ => return None,
                    };
                    Some((name.as_str().to_owned(), value.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default();
    Message {
        id: properties
            .message_id()
            .as_ref()
            .map(|id| id.as_str().to_owned()),
        headers,
        content_type: properties
            .content_type()
            .as_ref()
            .map(|t| t.as_str().to_owned()),
        payload: delivery.data.clone().into(),
    }
}

/// Settles `delivery` as `action` says: [`Action::Ack`] acknowledges it,
/// [`Action::Redeliver`] requeues it after `after` (`basic.nack`, `requeue =
/// true`; the delivery is held meanwhile, see the module docs), [`Action::Reject`]
/// drops it or dead-letters it (`basic.reject`, `requeue = false`).
///
/// # Errors
/// [`BrokerError`] when the broker call failed, or when the delivery could
/// not be settled at all: its channel is closed (the broker has requeued
/// it already, and the record answers the redelivery), or it was settled
/// before.
pub async fn settle(delivery: &Delivery, action: Action) -> Result<(), BrokerError> {
    let acker = &delivery.acker;
    let (what, settled) = match action {
        Action::Ack => ("basic.ack", acker.ack(BasicAckOptions::default()).await),
        Action::Redeliver { after } => {
            // AMQP 0-9-1 has no per-message delay: the delivery is held
            // (keeping its prefetch slot) for `after`, so a failing message
            // does not cycle hot through the queue and its delivery limit.
            if let Some(after) = after {
                tokio::time::sleep(after).await;
            }
            (
                "basic.nack",
                acker
                    .nack(BasicNackOptions {
                        multiple: false,
                        requeue: true,
                    })
                    .await,
            )
        }
        Action::Reject => (
            "basic.reject",
            acker.reject(BasicRejectOptions { requeue: false }).await,
        ),
    };
    match settled {
        Ok(true) => Ok(()),
        Ok(false) => Err(BrokerError::new(
            what,
            "the delivery's channel is closed, or the delivery was settled before",
        )),
        Err(e) => Err(BrokerError::new(what, e)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use lapin::BasicProperties;
    use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};

    use super::*;

    fn delivery(properties: BasicProperties) -> Delivery {
        let mut d = Delivery::mock(7, "".into(), "transfers".into(), true, b"{}".to_vec());
        d.properties = properties;
        d
    }

    #[test]
    fn maps_the_producers_properties_and_string_headers() {
        let mut headers = FieldTable::default();
        headers.insert("transfer-id".into(), AMQPValue::LongString("t-1".into()));
        headers.insert("origin".into(), AMQPValue::ShortString("bank-a".into()));
        headers.insert("attempt".into(), AMQPValue::LongInt(3));
        headers.insert("flag".into(), AMQPValue::Boolean(true));
        headers.insert(
            "binary".into(),
            AMQPValue::LongString(LongString::from(vec![0xff, 0xfe])),
        );
        let d = delivery(
            BasicProperties::default()
                .with_message_id(ShortString::from("msg-1"))
                .with_content_type(ShortString::from("application/json"))
                .with_headers(headers),
        );
        let m = message(&d);
        assert_eq!(m.id.as_deref(), Some("msg-1"));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(&m.payload[..], b"{}");
        let mut got = m.headers.clone();
        got.sort();
        assert_eq!(
            got,
            vec![
                ("origin".to_owned(), "bank-a".to_owned()),
                ("transfer-id".to_owned(), "t-1".to_owned())
            ]
        );
        // The delivery's own bookkeeping is not the message's identity.
        let bare = message(&delivery(BasicProperties::default()));
        assert_eq!(bare.id, None);
        assert_eq!(bare.content_type, None);
        assert!(bare.headers.is_empty());
    }

    #[tokio::test]
    async fn a_delivery_settles_once() {
        let d = delivery(BasicProperties::default());
        settle(&d, Action::Ack).await.unwrap();
        let twice = settle(&d, Action::Reject).await.unwrap_err();
        assert!(twice.to_string().starts_with("basic.reject:"), "{twice}");
    }
}
