//! `rabbitmq` source: consumes one RabbitMQ queue (AMQP 0-9-1) with manual
//! acknowledgements and acknowledges a batch only in `commit`, that is once
//! Iggy acknowledged it and the engine saved the state: one `basic.ack` with
//! `multiple` up to the batch's last delivery tag.
//!
//! The queue holds the position: what was delivered and never acknowledged
//! (Iggy refusing it until the engine gives up, a stop, a crash, a lost
//! connection) goes back to the queue and is delivered again (duplicates,
//! never loss). The prefetch (`basic.qos`) is twice `batch_size`: one batch in
//! flight and the next one arriving. A batch still uncommitted at `close` is
//! handed back with `basic.nack` (requeue), so it is delivered again at once
//! and in order.
//!
//! Cancel-safe: delivered messages wait in the consumer's buffer until a poll
//! takes them, and a poll takes them without awaiting anything, so a poll
//! dropped while it waits loses nothing and acknowledges nothing.
//!
//! Iggy ids: a message whose AMQP `message_id` is a decimal u128 or a UUID
//! keeps it as its Iggy id (what the rabbitmq sink sets); any other
//! `message_id` is hashed with the queue name. Both survive a redelivery, so
//! Iggy's deduplication can drop the copy. A message without `message_id`
//! gets a new id from Iggy: RabbitMQ's delivery tags and redelivered flag are
//! per channel and per delivery, so nothing else identifies a message across
//! redeliveries.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use amqprs::channel::{
    BasicAckArguments, BasicConsumeArguments, BasicNackArguments, BasicQosArguments, Channel,
    ConsumerMessage, QueueBindArguments, QueueDeclareArguments,
};
use amqprs::{FieldTable, FieldValue};
use async_trait::async_trait;
use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::mpsc::UnboundedReceiver;

use crate::connectors::kit::row_id::hash_id;
use crate::connectors::rabbitmq::{AmqpConnection, Session, check_short, connection_fields};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry,
    parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Headers, Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "rabbitmq",
    feature: "rabbitmq-source",
    description: "consumes a RabbitMQ queue with manual acks, acked on commit",
    secret_fields: &["password", "uri"],
    sample_config: "uri = \"amqps://iggy:secret@rabbitmq.example/shop\"\nusername = \"iggy\"\npassword = \"secret\"\nqueue = \"orders\"\ndeclare_queue = true\nbatch_size = 500\nbindings = [{ exchange = \"shop\", routing_key = \"orders.#\" }]\n",
    config_schema: schema_of::<RabbitmqSourceConfig>,
    build: |config| Ok(Box::new(RabbitmqSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

connection_fields! {
    /// What to consume.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct RabbitmqSourceConfig {
        /// The queue to consume (required).
        #[serde(default)]
        pub queue: String,
        /// Declare the queue on open (durable, not exclusive, not auto-delete)
        /// when it is missing; otherwise it must exist.
        #[serde(default)]
        pub declare_queue: bool,
        /// Bindings made on open, each `{ exchange, routing_key }` (the
        /// exchange must exist).
        #[serde(default)]
        pub bindings: Vec<Binding>,
        /// Most messages per batch; the prefetch is twice this (at most 65535).
        #[serde(default = "default_batch_size")]
        pub batch_size: usize,
        /// The consumer tag (default `iggy-connect-<key>`).
        #[serde(default)]
        pub consumer_tag: Option<String>,
    }
}

/// One binding of the queue.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The exchange to bind the queue to.
    pub exchange: String,
    /// The binding key (a topic exchange's pattern, such as `orders.#`).
    #[serde(default)]
    pub routing_key: String,
}

fn default_batch_size() -> usize {
    500
}

/// How often a poll waiting for messages looks at the connection.
const LIVENESS: Duration = Duration::from_millis(500);

/// The consuming channel.
struct Reader {
    session: Session,
    generation: u64,
    messages: UnboundedReceiver<ConsumerMessage>,
}

/// The batch polled and not committed: its last delivery tag on the channel
/// of `generation`.
struct Staged {
    channel: Channel,
    generation: u64,
    last_tag: u64,
}

pub struct RabbitmqSource {
    config: RabbitmqSourceConfig,
    connection: AmqpConnection,
    key: String,
    reader: tokio::sync::Mutex<Option<Reader>>,
    generations: AtomicU64,
    staged: Mutex<Option<Staged>>,
}

impl RabbitmqSource {
    pub fn new(config: RabbitmqSourceConfig) -> Result<Self, PluginConfigError> {
        let connection = config.connection()?;
        connection.check()?;
        if config.queue.is_empty() {
            return Err(PluginConfigError::new(
                "queue",
                "expected the queue to consume",
            ));
        }
        check_short("queue", &config.queue)?;
        if !(1..=32_767).contains(&config.batch_size) {
            return Err(PluginConfigError::new(
                "batch_size",
                "expected 1 to 32767 (the prefetch, twice this, is an AMQP short)",
            ));
        }
        for binding in &config.bindings {
            check_short("bindings", &binding.exchange)?;
            check_short("bindings", &binding.routing_key)?;
            if binding.exchange.is_empty() {
                return Err(PluginConfigError::new(
                    "bindings",
                    "expected an exchange to bind to (the default exchange takes no bindings)",
                ));
            }
        }
        if let Some(tag) = &config.consumer_tag {
            check_short("consumer_tag", tag)?;
        }
        Ok(Self {
            config,
            connection,
            key: String::new(),
            reader: tokio::sync::Mutex::new(None),
            generations: AtomicU64::new(0),
            staged: Mutex::new(None),
        })
    }

    fn consumer_tag(&self) -> String {
        match &self.config.consumer_tag {
            Some(tag) if !tag.is_empty() => tag.clone(),
            _ if self.key.is_empty() => "iggy-connect".into(),
            _ => format!("iggy-connect-{}", self.key),
        }
    }

    /// Connects, declares and binds what the config asks for, and consumes.
    async fn subscribe(&self) -> Result<Reader, ConnectorError> {
        let name = format!("iggy-connect source {}", self.key);
        let session = self.connection.open(&name).await?;
        let queue = &self.config.queue;
        let declare = if self.config.declare_queue {
            QueueDeclareArguments::durable_client_named(queue).finish()
        } else {
            QueueDeclareArguments::new(queue).passive(true).finish()
        };
        session
            .channel
            .queue_declare(declare)
            .await
            .map_err(|error| {
                session.error("queue", &format!("declaring queue {queue:?}"), error)
            })?;
        for binding in &self.config.bindings {
            session
                .channel
                .queue_bind(QueueBindArguments::new(
                    queue,
                    &binding.exchange,
                    &binding.routing_key,
                ))
                .await
                .map_err(|error| {
                    session.error(
                        "bindings",
                        &format!("binding {queue:?} to exchange {:?}", binding.exchange),
                        error,
                    )
                })?;
        }
        let prefetch = u16::try_from(self.config.batch_size * 2).unwrap_or(u16::MAX);
        session
            .channel
            .basic_qos(BasicQosArguments::new(0, prefetch, false))
            .await
            .map_err(|error| session.error("batch_size", "basic.qos", error))?;
        let (_, messages) = session
            .channel
            .basic_consume_rx(
                BasicConsumeArguments::new(queue, &self.consumer_tag())
                    .manual_ack(true)
                    .finish(),
            )
            .await
            .map_err(|error| session.error("queue", &format!("consuming {queue:?}"), error))?;
        Ok(Reader {
            session,
            generation: self.generations.fetch_add(1, Ordering::Relaxed) + 1,
            messages,
        })
    }

    /// Waits for the first message, then takes what else was delivered, up to
    /// a batch. Cancel-safe: messages are taken off the consumer's buffer only
    /// after the last await.
    async fn receive(&self) -> Result<(Vec<ConsumerMessage>, Channel, u64), ConnectorError> {
        let mut guard = self.reader.lock().await;
        if guard
            .as_ref()
            .is_none_or(|reader| !reader.session.is_open())
        {
            // Never opened, or the connection is lost: the broker puts back
            // what the old channel delivered and nobody acknowledged.
            if let Some(old) = guard.take() {
                old.session.close().await;
            }
            *guard = Some(self.subscribe().await?);
        }
        let Some(reader) = guard.as_mut() else {
            return Err(ConnectorError::transient(
                "the rabbitmq source has no channel",
            ));
        };
        let first = loop {
            match tokio::time::timeout(LIVENESS, reader.messages.recv()).await {
                Ok(Some(message)) => break message,
                Ok(None) => {
                    let error = reader
                        .session
                        .error("queue", "consuming", "the consumer ended");
                    guard.take();
                    return Err(error);
                }
                Err(_) if !reader.session.is_open() || reader.session.closed().is_some() => {
                    let error =
                        reader
                            .session
                            .error("queue", "consuming", "the connection is lost");
                    guard.take();
                    return Err(error);
                }
                Err(_) => {}
            }
        };
        let mut messages = vec![first];
        while messages.len() < self.config.batch_size {
            match reader.messages.try_recv() {
                Ok(message) => messages.push(message),
                Err(_) => break,
            }
        }
        Ok((messages, reader.session.channel.clone(), reader.generation))
    }

    fn record(&self, message: ConsumerMessage) -> SourceRecord {
        let mut headers = Headers::new();
        let mut id = None;
        let mut origin_timestamp = None;
        if let Some(properties) = &message.basic_properties {
            if let Some(table) = properties.headers() {
                copy_headers(table, &mut headers);
            }
            id = properties
                .message_id()
                .and_then(|message_id| iggy_id(&self.config.queue, message_id));
            origin_timestamp = properties
                .timestamp()
                .filter(|seconds| *seconds > 0)
                .and_then(|seconds| seconds.checked_mul(1_000_000));
        }
        if let Some(deliver) = &message.deliver {
            push_header(
                &mut headers,
                "amqp_routing_key",
                HeaderValue::String(deliver.routing_key().as_str().into()),
            );
            push_header(
                &mut headers,
                "amqp_exchange",
                HeaderValue::String(deliver.exchange().as_str().into()),
            );
        }
        SourceRecord {
            id,
            stream_index: 0,
            headers,
            payload: Payload::Raw(Bytes::from(message.content.unwrap_or_default())),
            partition: None,
            origin_timestamp,
        }
    }

    fn lock_staged(&self) -> std::sync::MutexGuard<'_, Option<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The Iggy id of a message with AMQP `message_id`: the number or UUID it
/// holds, else its hash with the queue name.
fn iggy_id(queue: &str, message_id: &str) -> Option<u128> {
    let text = message_id.trim();
    if text.is_empty() {
        return None;
    }
    if let Ok(number) = text.parse::<u128>() {
        return Some(number);
    }
    if let Ok(uuid) = uuid::Uuid::parse_str(text) {
        return Some(uuid.as_u128());
    }
    Some(hash_id(&[queue, text]))
}

/// AMQP headers as Iggy headers: text, booleans, integers, floats and bytes
/// as themselves, anything else (tables, arrays, decimals) as its text; a
/// value Iggy cannot carry (empty, over 255 bytes) is left out.
fn copy_headers(table: &FieldTable, headers: &mut Headers) {
    let mut entries: Vec<_> = table.as_ref().iter().collect();
    entries.sort_by(|(left, _), (right, _)| left.as_ref().cmp(right.as_ref()));
    for (name, value) in entries {
        let value = match value {
            FieldValue::S(text) => HeaderValue::String(text.as_ref().as_str().into()),
            FieldValue::t(flag) => HeaderValue::Bool(*flag),
            FieldValue::b(number) => HeaderValue::Int(i64::from(*number)),
            FieldValue::B(number) => HeaderValue::UInt(u64::from(*number)),
            FieldValue::s(number) => HeaderValue::Int(i64::from(*number)),
            FieldValue::u(number) => HeaderValue::UInt(u64::from(*number)),
            FieldValue::I(number) => HeaderValue::Int(i64::from(*number)),
            FieldValue::i(number) => HeaderValue::UInt(u64::from(*number)),
            FieldValue::l(number) => HeaderValue::Int(*number),
            FieldValue::T(stamp) => HeaderValue::UInt(*stamp),
            FieldValue::f(number) => HeaderValue::Float(f64::from(*number)),
            FieldValue::d(number) => HeaderValue::Float(*number),
            FieldValue::x(bytes) => HeaderValue::Raw(Bytes::from(Vec::<u8>::from(bytes.clone()))),
            other => HeaderValue::String(other.to_string().into()),
        };
        push_header(headers, name.as_ref(), value);
    }
}

/// Adds a header Iggy can carry: a name, and text or bytes of 1 to 255 bytes
/// (an empty value, such as the default exchange's name, is left out).
fn push_header(headers: &mut Headers, name: &str, value: HeaderValue) {
    let length = match &value {
        HeaderValue::String(text) => text.len(),
        HeaderValue::Raw(bytes) => bytes.len(),
        _ => 1,
    };
    if !name.is_empty() && (1..=255).contains(&length) {
        headers.push((name.into(), value));
    }
}

#[async_trait]
impl Source for RabbitmqSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    /// Stateless: the queue's acknowledgements are the position, so a stored
    /// state (of any shape) is ignored.
    async fn open(&mut self, _state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let reader = self.subscribe().await?;
        *self.reader.get_mut() = Some(reader);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let (messages, channel, generation) = self.receive().await?;
        let last_tag = messages
            .iter()
            .filter_map(|message| {
                message
                    .deliver
                    .as_ref()
                    .map(|deliver| deliver.delivery_tag())
            })
            .max()
            .unwrap_or(0);
        let records = messages
            .into_iter()
            .map(|message| self.record(message))
            .collect();
        *self.lock_staged() = Some(Staged {
            channel,
            generation,
            last_tag,
        });
        Ok(SourceBatch {
            records,
            state: None,
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(staged) = self.lock_staged().take() else {
            return Ok(());
        };
        let current = self.generations.load(Ordering::Relaxed);
        if staged.generation != current || !staged.channel.is_open() {
            // The channel that delivered the batch is gone, and with it the
            // broker's record of the delivery: it delivers the batch again.
            // A tag acknowledged on another channel would be another message.
            tracing::warn!(
                connector_key = %self.key,
                "the RabbitMQ channel closed before the batch was acknowledged; the broker delivers it again"
            );
            return Ok(());
        }
        if let Err(error) = staged
            .channel
            .basic_ack(BasicAckArguments::new(staged.last_tag, true))
            .await
        {
            tracing::warn!(
                connector_key = %self.key,
                %error,
                "acknowledging to RabbitMQ failed; the broker delivers the batch again"
            );
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        let staged = self.lock_staged().take();
        if let Some(reader) = self.reader.get_mut().take() {
            if let Some(staged) = staged
                && staged.generation == reader.generation
            {
                // Requeued now and in order, rather than when the channel closes.
                let _ = staged
                    .channel
                    .basic_nack(BasicNackArguments::new(staged.last_tag, true, true))
                    .await;
            }
            reader.session.close().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<RabbitmqSource, PluginConfigError> {
        RabbitmqSource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_a_bad_field_when_built_should_name_it() {
        assert_eq!(build(json!({})).err().unwrap().field, "queue");
        assert_eq!(
            build(json!({"queue": "q", "batch_size": 0}))
                .err()
                .unwrap()
                .field,
            "batch_size"
        );
        assert_eq!(
            build(json!({"queue": "q", "batch_size": 40_000}))
                .err()
                .unwrap()
                .field,
            "batch_size"
        );
        assert_eq!(
            build(json!({"queue": "q", "bindings": [{"exchange": ""}]}))
                .err()
                .unwrap()
                .field,
            "bindings"
        );
        assert_eq!(
            build(json!({"queue": "q", "host": ""}))
                .err()
                .unwrap()
                .field,
            "host"
        );
        assert!(build(json!({"queue": "q", "nope": 1})).is_err());
    }

    #[test]
    fn given_a_message_id_when_identified_should_keep_numbers_and_uuids_and_hash_the_rest() {
        assert_eq!(iggy_id("q", "42"), Some(42));
        let uuid = uuid::Uuid::from_u128(7 << 100);
        assert_eq!(iggy_id("q", &uuid.to_string()), Some(7 << 100));
        let hashed = iggy_id("q", "order-1").unwrap();
        assert_eq!(iggy_id("q", "order-1"), Some(hashed));
        assert_ne!(iggy_id("other", "order-1"), Some(hashed));
        assert_eq!(iggy_id("q", " "), None);
    }

    #[test]
    fn given_amqp_headers_when_copied_should_keep_their_kinds_and_drop_what_iggy_cannot_carry() {
        let mut table = FieldTable::new();
        table.insert(
            "text".try_into().unwrap(),
            FieldValue::S("a".try_into().unwrap()),
        );
        table.insert("flag".try_into().unwrap(), FieldValue::t(true));
        table.insert("count".try_into().unwrap(), FieldValue::I(-3));
        table.insert(
            "empty".try_into().unwrap(),
            FieldValue::S("".try_into().unwrap()),
        );
        table.insert(
            "long".try_into().unwrap(),
            FieldValue::S("x".repeat(300).try_into().unwrap()),
        );
        let mut headers = Headers::new();
        copy_headers(&table, &mut headers);
        assert_eq!(
            headers,
            vec![
                ("count".into(), HeaderValue::Int(-3)),
                ("flag".into(), HeaderValue::Bool(true)),
                ("text".into(), HeaderValue::String("a".into())),
            ]
        );
    }

    #[test]
    fn given_no_consumer_tag_when_attached_should_derive_it_from_the_key() {
        let mut source = build(json!({"queue": "q"})).unwrap();
        assert_eq!(source.consumer_tag(), "iggy-connect");
        source.attach(ConnectorContext {
            key: "orders".into(),
            ..ConnectorContext::default()
        });
        assert_eq!(source.consumer_tag(), "iggy-connect-orders");
    }
}
