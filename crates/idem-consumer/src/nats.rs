//! The NATS JetStream adapter (feature `nats`, on [`async_nats`]): a
//! JetStream delivery as a [`Message`], and an [`Action`] as its
//! acknowledgement.
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use async_nats::jetstream::{self, consumer::{AckPolicy, pull}};
//! use futures_util::StreamExt;
//! use idem_consumer::{Consumer, Failure, KeySource, nats};
//! use idem_core::{MemoryStore, Scope};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let js = jetstream::new(async_nats::connect("nats://127.0.0.1:4222").await?);
//! let stream = js.get_stream("TRANSFERS").await?;
//! // A durable pull consumer with explicit acks; an unacknowledged delivery
//! // comes back after the ack wait.
//! let deliveries = stream
//!     .get_or_create_consumer("apply-transfer", pull::Config {
//!         durable_name: Some("apply-transfer".into()),
//!         ack_policy: AckPolicy::Explicit,
//!         ack_wait: Duration::from_secs(30),
//!         ..Default::default()
//!     })
//!     .await?;
//! let consumer = Consumer::new(
//!     Arc::new(MemoryStore::new()),
//!     Scope::from_tenant(b"payments"),
//!     "apply-transfer",
//!     KeySource::JsonPointer("/transfer_id".into()),
//! );
//! let mut messages = deliveries.messages().await?;
//! while let Some(delivery) = messages.next().await {
//!     let delivery = delivery?;
//!     let outcome = consumer
//!         .process(&nats::message(&delivery), |_claim| async {
//!             // Apply the transfer here.
//!             Ok::<_, Failure<std::io::Error>>(b"applied".to_vec())
//!         })
//!         .await;
//!     let action = match &outcome {
//!         Ok(processed) => processed.action(),
//!         Err(e) => e.action(),
//!     };
//!     nats::settle(&delivery, action).await?;
//! }
//! # Ok(()) }
//! ```
//!
//! # What it maps
//!
//! [`message`] reads what the producer published, never JetStream's own
//! bookkeeping (stream and consumer sequences, the delivery count), which
//! differ between two deliveries of one intent:
//!
//! | [`Message`] | NATS |
//! |---|---|
//! | `id` | the `Nats-Msg-Id` header, when it is there exactly once |
//! | `headers` | every header value, under its name as published (a name given several values gives several pairs) |
//! | `content_type` | the `Content-Type` header (its name compared without regard to case), when it has exactly one value |
//! | `payload` | the payload |
//!
//! async-nats holds header values as strings, so every header it delivers
//! is passed on. A message whose header block is not UTF-8 (which only a
//! producer on another client can publish) never reaches [`message`]:
//! async-nats drops its connection on it, losing the other deliveries of
//! that pull too, and the server delivers it again after every ack wait.
//! Only the durable's `max_deliver` ends that (see below).
//!
//! **`Nats-Msg-Id` and JetStream's duplicate window.** A stream drops a
//! second publish whose `Nats-Msg-Id` it saw within its duplicate window
//! (two minutes by default): such a duplicate never reaches the consumer.
//! That covers a producer's retried publish inside the window, not a
//! redelivery (the consumer's ack lost, the consumer killed after its
//! effect), a publish retried later, or one intent published twice under
//! two ids. Those reach the consumer, and the record is what keeps the
//! effect to one: key it by what names the intent
//! ([`KeySource::JsonPointer`](crate::KeySource::JsonPointer) such as
//! `/transfer_id`, or [`KeySource::MessageId`](crate::KeySource::MessageId)
//! when the producer's `Nats-Msg-Id` is the intent's id).
//!
//! # How each action settles
//!
//! - [`Action::Ack`]: `+ACK`, sent as a request: [`settle`] returns once
//!   the server confirmed it (async-nats' `double_ack_with`), so `Ok`
//!   means the server has the acknowledgement, and an error means it may
//!   not (the message may come back, and the record acknowledges it as a
//!   duplicate). The confirmation costs one round trip to the server per
//!   message: about 0.15 ms on a loopback connection, next to the few
//!   milliseconds of a store's commit per message in atomic mode. A caller
//!   that wants the unconfirmed ack sends `delivery.ack()` itself; nothing
//!   else changes, since a lost ack only brings a duplicate.
//! - [`Action::Redeliver`]: `-NAK`, with `after` as its delay when given
//!   (`-NAK {"delay": ...}`): the server delivers the message again, to
//!   this consumer or another of the same durable, after the delay, or at
//!   once without one. Confirmed like the ack.
//! - [`Action::Reject`]: `+TERM`: the server stops delivering the message
//!   and counts it as settled. JetStream has no dead-letter stream; it
//!   publishes a `$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.<stream>.<consumer>`
//!   advisory with the stream sequence, which a dead-letter process can
//!   subscribe to and read the message by. Confirmed like the ack.
//!
//! # The broker settings it needs
//!
//! - **A durable pull consumer with explicit acks** (`ack_policy:
//!   Explicit`): every message is settled by [`settle`] on its own. With
//!   `AckPolicy::None` the server forgets a message as it sends it, and a
//!   consumer that dies mid-effect loses it; with `All`, one ack settles
//!   the messages before it, which may still be in flight.
//! - **An ack wait** (`ack_wait`, 30 s by default): a delivery that is not
//!   settled within it (a consumer killed, a lost ack) is delivered again.
//!   The record answers that redelivery: an effect that committed before
//!   the ack was lost is acknowledged as
//!   [`Processed::Duplicate`](crate::Processed::Duplicate), not applied
//!   again (in atomic mode). A redelivery that comes while another
//!   consumer's claim runs waits in process for that consumer
//!   ([`Consumer::wait_in_flight`](crate::Consumer::wait_in_flight), the
//!   lease by default: then it takes over), without using up a delivery;
//!   past that wait it is `-NAK`ed with a delay of at most
//!   [`IN_FLIGHT_RECHECK`](crate::IN_FLIGHT_RECHECK). A failed effect or a
//!   store that is down is `-NAK`ed with
//!   [`REDELIVERY_DELAY`](crate::REDELIVERY_DELAY): each counts one
//!   delivery.
//! - **`max_deliver`**: poison messages the adapter sees do not need it
//!   (the record rejects them, and `+TERM` stops their redelivery on the
//!   first try). A message async-nats cannot read (above) does: with the
//!   default (-1, unlimited) it comes back after every ack wait, forever,
//!   and drops the consumer's connection each time. A bounded
//!   `max_deliver` ends it with a
//!   `$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>`
//!   advisory, but the server drops every message that reaches it,
//!   whatever the reason (a store down for that many redelivery delays), and the
//!   messages that shared a pull with the unreadable one used up a
//!   delivery too: bound it generously, pull one message at a time when
//!   it is low, and have a process read those advisories.
//! - `max_ack_pending` (1,000 by default) bounds the deliveries a durable
//!   has out unsettled, and so how much work a crash sends back; a message
//!   negatively acknowledged with a delay keeps its place in it until it is
//!   delivered again.

use async_nats::jetstream::AckKind;

use crate::{Action, BrokerError, Message};

/// The header JetStream reads a producer's message id from.
const MESSAGE_ID: &str = "Nats-Msg-Id";
/// The header a producer names its payload's media type in.
const CONTENT_TYPE: &str = "Content-Type";

/// The broker-neutral message of `delivery`: its `Nats-Msg-Id`, its
/// headers, its `Content-Type` and its payload (see the module docs).
pub fn message(delivery: &async_nats::jetstream::Message) -> Message {
    from_core(&delivery.message)
}

/// [`message`] of the core NATS message a JetStream delivery wraps.
fn from_core(core: &async_nats::Message) -> Message {
    let mut headers: Vec<(String, String)> = core
        .headers
        .iter()
        .flat_map(|map| map.iter())
        .flat_map(|(name, values)| {
            let name: &str = name.as_ref();
            values
                .iter()
                .map(move |value| (name.to_owned(), value.as_str().to_owned()))
        })
        .collect();
    // The header map's order is a hash's: sort by name (stably, so one
    // name's values keep their order) for a message that is the same on
    // every delivery.
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    let id = only_value(&headers, |name| name == MESSAGE_ID);
    let content_type = only_value(&headers, |name| name.eq_ignore_ascii_case(CONTENT_TYPE));
    Message {
        id,
        headers,
        content_type,
        payload: core.payload.clone(),
    }
}

/// The value of the header `wanted` picks, if exactly one header is
/// picked: two ids (or two content types) on one message name neither.
fn only_value(headers: &[(String, String)], wanted: impl Fn(&str) -> bool) -> Option<String> {
    let mut values = headers.iter().filter(|(name, _)| wanted(name));
    match (values.next(), values.next()) {
        (Some((_, value)), None) => Some(value.clone()),
        _ => None,
    }
}

/// Settles `delivery` as `action` says, and waits for the server to
/// confirm it: [`Action::Ack`] is `+ACK`, [`Action::Redeliver`] is `-NAK`
/// (with `after` as its delay when given), [`Action::Reject`] is `+TERM`
/// (see the module docs).
///
/// # Errors
/// [`BrokerError`] when the settlement could not be sent (the connection is
/// closed, the delivery is not a JetStream message), or when the server's
/// confirmation did not come within the JetStream context's timeout (5 s
/// by default). The server may then have it or not: the message is
/// delivered again after the ack wait if it does not, and the record
/// answers that redelivery.
pub async fn settle(
    delivery: &async_nats::jetstream::Message,
    action: Action,
) -> Result<(), BrokerError> {
    let (what, kind) = ack_kind(action);
    delivery
        .double_ack_with(kind)
        .await
        .map_err(|e| BrokerError::new(what, e))
}

/// The JetStream acknowledgement of `action`, and its name for errors.
fn ack_kind(action: Action) -> (&'static str, AckKind) {
    match action {
        Action::Ack => ("+ACK", AckKind::Ack),
        Action::Redeliver { after } => ("-NAK", AckKind::Nak(after)),
        Action::Reject => ("+TERM", AckKind::Term),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use async_nats::HeaderMap;
    use bytes::Bytes;

    use super::*;

    fn core(headers: Option<HeaderMap>) -> async_nats::Message {
        async_nats::Message {
            subject: "transfers".into(),
            reply: Some("$JS.ACK.TRANSFERS.apply.1.7.7.0.0".into()),
            payload: Bytes::from_static(br#"{"transfer_id":"t-1"}"#),
            headers,
            status: None,
            description: None,
            length: 0,
        }
    }

    #[test]
    fn maps_the_producers_id_headers_and_content_type() {
        let mut headers = HeaderMap::new();
        headers.insert("Nats-Msg-Id", "msg-1");
        headers.insert("content-type", "application/json");
        headers.append("Transfer-Id", "t-1");
        headers.append("Route", "a");
        headers.append("Route", "b");
        let m = from_core(&core(Some(headers)));
        assert_eq!(m.id.as_deref(), Some("msg-1"));
        assert_eq!(m.content_type.as_deref(), Some("application/json"));
        assert_eq!(&m.payload[..], br#"{"transfer_id":"t-1"}"#);
        let pair = |n: &str, v: &str| (n.to_owned(), v.to_owned());
        assert_eq!(
            m.headers,
            vec![
                pair("Nats-Msg-Id", "msg-1"),
                pair("Route", "a"),
                pair("Route", "b"),
                pair("Transfer-Id", "t-1"),
                pair("content-type", "application/json"),
            ]
        );

        // No headers: no id, no content type (the fingerprint compares
        // bytes).
        let bare = from_core(&core(None));
        assert_eq!(bare.id, None);
        assert_eq!(bare.content_type, None);
        assert!(bare.headers.is_empty());
    }

    #[test]
    fn two_ids_or_two_content_types_name_neither() {
        let mut headers = HeaderMap::new();
        headers.append("Nats-Msg-Id", "msg-1");
        headers.append("Nats-Msg-Id", "msg-2");
        headers.append("Content-Type", "application/json");
        headers.append("CONTENT-TYPE", "text/plain");
        let m = from_core(&core(Some(headers)));
        assert_eq!(m.id, None);
        assert_eq!(m.content_type, None);
        assert_eq!(m.headers.len(), 4);
        // JetStream's header name is matched exactly, as the server does.
        let mut headers = HeaderMap::new();
        headers.insert("nats-msg-id", "msg-3");
        assert_eq!(from_core(&core(Some(headers))).id, None);
    }

    #[test]
    fn each_action_has_its_acknowledgement() {
        let bytes = |a| Bytes::from(ack_kind(a).1);
        assert_eq!(bytes(Action::Ack), "+ACK");
        assert_eq!(bytes(Action::Reject), "+TERM");
        assert_eq!(bytes(Action::Redeliver { after: None }), "-NAK");
        assert_eq!(
            bytes(Action::Redeliver {
                after: Some(Duration::from_millis(1500))
            }),
            r#"-NAK {"delay":1500000000}"#
        );
    }
}
