//! The demo's NATS JetStream side: a stream with one subject, a durable
//! pull consumer with explicit acks and a short ack wait, settled by
//! `idem_consumer::nats`.

use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer::PullConsumer};
use futures_util::StreamExt;

use super::shared::{Broker, Delivery};

/// How long JetStream waits for an ack before redelivering: short, so
/// the killed consumers' messages come back soon.
const ACK_WAIT: Duration = Duration::from_secs(2);

pub(crate) struct Nats {
    context: jetstream::Context,
    stream: String,
    subject: String,
    consumer: PullConsumer,
}

impl Delivery for jetstream::Message {
    fn message(&self) -> idem_consumer::Message {
        idem_consumer::nats::message(self)
    }

    async fn settle(
        &self,
        action: idem_consumer::Action,
    ) -> Result<(), idem_consumer::BrokerError> {
        idem_consumer::nats::settle(self, action).await
    }
}

impl Broker for Nats {
    type Delivery = jetstream::Message;

    async fn open(url: &str, name: &str, create: bool) -> anyhow::Result<Nats> {
        let client = async_nats::connect(url)
            .await
            .context("cannot reach NATS")?;
        let context = jetstream::new(client);
        let subject = format!("{name}.transfers");
        let stream = if create {
            context
                .create_stream(jetstream::stream::Config {
                    name: name.to_owned(),
                    subjects: vec![subject.clone()],
                    ..Default::default()
                })
                .await
                .with_context(|| format!("cannot create stream {name}"))?
        } else {
            context
                .get_stream(name)
                .await
                .with_context(|| format!("no stream {name}"))?
        };
        let consumer: PullConsumer = if create {
            stream
                .create_consumer(jetstream::consumer::pull::Config {
                    durable_name: Some(name.to_owned()),
                    ack_policy: jetstream::consumer::AckPolicy::Explicit,
                    ack_wait: ACK_WAIT,
                    max_ack_pending: 4096,
                    ..Default::default()
                })
                .await
                .context("cannot create the consumer")?
        } else {
            stream
                .get_consumer(name)
                .await
                .map_err(|e| anyhow::anyhow!("no durable consumer {name}: {e}"))?
        };
        Ok(Nats {
            context,
            stream: name.to_owned(),
            subject,
            consumer,
        })
    }

    async fn publish_all(&self, payloads: Vec<Vec<u8>>) -> anyhow::Result<()> {
        // No Nats-Msg-Id: JetStream would drop the duplicates itself, and
        // the demo's point is that idem does.
        for flight in payloads.chunks(256) {
            let mut acks = Vec::with_capacity(flight.len());
            for payload in flight {
                let mut headers = async_nats::HeaderMap::new();
                headers.insert("Content-Type", "application/json");
                acks.push(
                    self.context
                        .publish_with_headers(self.subject.clone(), headers, payload.clone().into())
                        .await
                        .context("publish")?,
                );
            }
            for ack in acks {
                ack.await.context("publish ack")?;
            }
        }
        Ok(())
    }

    async fn unsettled(&self) -> anyhow::Result<u64> {
        let info = self.consumer.get_info().await.context("consumer status")?;
        Ok(info.num_pending + u64::try_from(info.num_ack_pending).unwrap_or(u64::MAX))
    }

    async fn next_batch(&mut self, max: usize) -> anyhow::Result<Vec<jetstream::Message>> {
        let mut messages = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| anyhow::anyhow!("fetch: {e}"))?;
        let mut batch = Vec::new();
        while let Some(m) = messages.next().await {
            batch.push(m.map_err(|e| anyhow::anyhow!("message: {e}"))?);
        }
        Ok(batch)
    }

    async fn delete(self) -> anyhow::Result<()> {
        self.context
            .delete_stream(&self.stream)
            .await
            .context("cannot delete the stream")?;
        Ok(())
    }
}
