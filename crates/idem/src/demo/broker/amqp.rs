//! The demo's RabbitMQ side: a queue on the default exchange, publisher
//! confirms, manual acks with a prefetch, settled by
//! `idem_consumer::rabbitmq`.

use std::time::Duration;

use anyhow::Context;
use futures_util::StreamExt;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, BasicQosOptions, ConfirmSelectOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

use super::shared::{BATCH, Broker, Delivery};

pub(crate) struct Amqp {
    // Kept open: the channel lives as long as its connection.
    _connection: Connection,
    channel: Channel,
    queue: String,
    consumer: Option<lapin::Consumer>,
}

impl Delivery for lapin::message::Delivery {
    fn message(&self) -> idem_consumer::Message {
        idem_consumer::rabbitmq::message(self)
    }

    async fn settle(
        &self,
        action: idem_consumer::Action,
    ) -> Result<(), idem_consumer::BrokerError> {
        idem_consumer::rabbitmq::settle(self, action).await
    }
}

impl Broker for Amqp {
    type Delivery = lapin::message::Delivery;

    async fn open(url: &str, name: &str, create: bool) -> anyhow::Result<Amqp> {
        let connection = Connection::connect(url, ConnectionProperties::default())
            .await
            .context("cannot reach RabbitMQ")?;
        let channel = connection.create_channel().await.context("AMQP channel")?;
        let options = QueueDeclareOptions {
            passive: !create,
            durable: true,
            ..QueueDeclareOptions::default()
        };
        channel
            .queue_declare(name.into(), options, FieldTable::default())
            .await
            .with_context(|| format!("cannot declare queue {name}"))?;
        let consumer = if create {
            channel
                .confirm_select(ConfirmSelectOptions::default())
                .await
                .context("publisher confirms")?;
            None
        } else {
            channel
                .basic_qos(
                    u16::try_from(BATCH).unwrap_or(64),
                    BasicQosOptions::default(),
                )
                .await
                .context("prefetch")?;
            Some(
                channel
                    .basic_consume(
                        name.into(),
                        "idem-demo".into(),
                        BasicConsumeOptions::default(),
                        FieldTable::default(),
                    )
                    .await
                    .context("cannot consume")?,
            )
        };
        Ok(Amqp {
            _connection: connection,
            channel,
            queue: name.to_owned(),
            consumer,
        })
    }

    async fn publish_all(&self, payloads: Vec<Vec<u8>>) -> anyhow::Result<()> {
        for flight in payloads.chunks(256) {
            let mut confirms = Vec::with_capacity(flight.len());
            for payload in flight {
                confirms.push(
                    self.channel
                        .basic_publish(
                            "".into(),
                            self.queue.as_str().into(),
                            BasicPublishOptions::default(),
                            payload,
                            BasicProperties::default()
                                .with_content_type("application/json".into())
                                .with_delivery_mode(2),
                        )
                        .await
                        .context("publish")?,
                );
            }
            for confirm in confirms {
                confirm.await.context("publish confirm")?;
            }
        }
        Ok(())
    }

    async fn unsettled(&self) -> anyhow::Result<u64> {
        // Ready messages only: those a live consumer holds unacknowledged
        // are not counted, so the parent asks again once no consumer runs.
        let options = QueueDeclareOptions {
            passive: true,
            ..QueueDeclareOptions::default()
        };
        let queue = self
            .channel
            .queue_declare(self.queue.as_str().into(), options, FieldTable::default())
            .await
            .context("queue status")?;
        Ok(u64::from(queue.message_count()))
    }

    async fn next_batch(&mut self, max: usize) -> anyhow::Result<Vec<lapin::message::Delivery>> {
        let consumer = self.consumer.as_mut().context("not a consumer")?;
        let mut batch = Vec::new();
        // The first waits up to 500 ms; the rest only while more are ready.
        let mut wait = Duration::from_millis(500);
        while batch.len() < max {
            match tokio::time::timeout(wait, consumer.next()).await {
                Ok(Some(delivery)) => batch.push(delivery.context("delivery")?),
                Ok(None) => anyhow::bail!("the AMQP consumer was cancelled"),
                Err(_) => break,
            }
            wait = Duration::from_millis(5);
        }
        Ok(batch)
    }

    async fn delete(self) -> anyhow::Result<()> {
        self.channel
            .queue_delete(self.queue.as_str().into(), QueueDeleteOptions::default())
            .await
            .context("cannot delete the queue")?;
        Ok(())
    }
}
