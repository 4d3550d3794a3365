//! `rabbitmq` sink: publishes each message to a RabbitMQ exchange (AMQP
//! 0-9-1) on a channel in confirm mode, and reports a batch written only when
//! the broker confirmed every message of it (`basic.ack`: the message is in
//! every queue it was routed to, on disk for a durable queue when it is
//! persistent).
//!
//! The routing key is fixed, may name the Iggy stream and topic (`{stream}`,
//! `{topic}`), or comes from a field of a JSON payload. Messages are
//! published `mandatory` (by default): one that no queue takes comes back
//! (`basic.return`) and is rejected by its index, so it goes through
//! `on_error` instead of vanishing. A `basic.nack`, a confirm that does not
//! come within `confirm_timeout`, or a lost connection fail the batch as
//! transient (the engine publishes it again on a new channel).
//!
//! Not idempotent: AMQP has no deduplication, so a batch published again
//! (after a transient failure the broker had taken part of, or a crash before
//! the offsets were committed) reaches the queues again. Every message carries
//! `message_id` = its Iggy message id, so consumers can drop the copies (the
//! rabbitmq source turns it back into the same Iggy id).

use std::time::{Duration, Instant};

use amqprs::channel::{BasicPublishArguments, ConfirmSelectArguments, ExchangeDeclareArguments};
use amqprs::{BasicProperties, ByteArray, FieldTable, FieldValue, LongStr, ShortStr};
use async_trait::async_trait;
use serde::Deserialize;

use crate::connectors::rabbitmq::{
    AmqpConnection, Event, SHORT_STR, Session, check_short, connection_fields,
};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Payload, SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "rabbitmq",
    feature: "rabbitmq-sink",
    description: "publishes to a RabbitMQ exchange with publisher confirms, persistent and mandatory",
    secret_fields: &["password", "uri"],
    sample_config: "uri = \"amqps://iggy:secret@rabbitmq.example/shop\"\nusername = \"iggy\"\npassword = \"secret\"\nexchange = \"orders\"\nexchange_type = \"topic\"\nrouting_key = \"iggy.{stream}.{topic}\"\n",
    config_schema: schema_of::<RabbitmqSinkConfig>,
    build: |config| Ok(Box::new(RabbitmqSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

connection_fields! {
    /// Where to publish.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct RabbitmqSinkConfig {
        /// The exchange to publish to; `""` is the default exchange, which
        /// routes a message to the queue named by its routing key.
        #[serde(default)]
        pub exchange: String,
        /// When set, the exchange is declared (durable) on open with this type
        /// (`direct`, `topic`, `fanout`, `headers`, ...); when unset it must exist.
        #[serde(default)]
        pub exchange_type: Option<String>,
        /// The routing key; `{stream}` and `{topic}` are replaced by the Iggy
        /// stream and topic the message came from.
        #[serde(default)]
        pub routing_key: Option<String>,
        /// A top-level field of a JSON payload holding the routing key; it wins
        /// over `routing_key`. A message without it (and no `routing_key`) is
        /// rejected and goes through `on_error`.
        #[serde(default)]
        pub routing_key_field: Option<String>,
        /// Publish `mandatory`: a message no queue takes is returned by the
        /// broker and rejected (`on_error`). Off, such a message is dropped by
        /// the broker and counts as written.
        #[serde(default = "default_true")]
        pub mandatory: bool,
        /// Publish with delivery mode 2 (persistent), so a durable queue keeps
        /// the message across a broker restart.
        #[serde(default = "default_true")]
        pub persistent: bool,
        /// Copy the Iggy message's user headers into AMQP headers.
        #[serde(default = "default_true")]
        pub include_headers: bool,
        /// How long to wait for the broker to confirm a batch before it counts
        /// as failed (and is published again).
        #[serde(default = "default_confirm_timeout", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub confirm_timeout: Duration,
    }
}

fn default_true() -> bool {
    true
}

fn default_confirm_timeout() -> Duration {
    Duration::from_secs(10)
}

/// A channel in confirm mode and how many messages it published.
struct Publisher {
    session: Session,
    published: u64,
}

pub struct RabbitmqSink {
    config: RabbitmqSinkConfig,
    connection: AmqpConnection,
    name: String,
    publisher: tokio::sync::Mutex<Option<Publisher>>,
}

impl RabbitmqSink {
    pub fn new(config: RabbitmqSinkConfig) -> Result<Self, PluginConfigError> {
        let connection = config.connection()?;
        connection.check()?;
        check_short("exchange", &config.exchange)?;
        if let Some(routing_key) = &config.routing_key {
            check_short("routing_key", routing_key)?;
        }
        if config.exchange.is_empty() && config.exchange_type.is_some() {
            return Err(PluginConfigError::new(
                "exchange",
                "exchange_type declares an exchange: name it (the default exchange \"\" cannot be declared)",
            ));
        }
        if config.exchange.is_empty()
            && config.routing_key.as_deref().is_none_or(str::is_empty)
            && config.routing_key_field.is_none()
        {
            return Err(PluginConfigError::new(
                "routing_key",
                "the default exchange routes by routing key (a queue name): set routing_key \
                 or routing_key_field, or name an exchange",
            ));
        }
        if let Some(kind) = &config.exchange_type
            && kind.trim().is_empty()
        {
            return Err(PluginConfigError::new(
                "exchange_type",
                "expected an exchange type such as direct, topic, fanout or headers",
            ));
        }
        Ok(Self {
            config,
            connection,
            name: "iggy-connect rabbitmq sink".into(),
            publisher: tokio::sync::Mutex::new(None),
        })
    }

    fn routing_key(&self, topic: &TopicRef, message: &SinkMessage) -> Result<String, String> {
        let key = match (&self.config.routing_key_field, &self.config.routing_key) {
            (Some(field), fallback) => match message.payload.text_field(field) {
                Some(key) => key,
                None => match fallback {
                    Some(template) => expand(template, topic),
                    None => {
                        return Err(format!(
                            "the payload has no string field {field:?} to take the routing key from"
                        ));
                    }
                },
            },
            (None, Some(template)) => expand(template, topic),
            (None, None) => String::new(),
        };
        if key.len() > SHORT_STR {
            return Err(format!(
                "the routing key is {} bytes long; AMQP allows {SHORT_STR}",
                key.len()
            ));
        }
        Ok(key)
    }

    fn properties(&self, message: &SinkMessage) -> BasicProperties {
        let mut properties = BasicProperties::default();
        properties
            .with_message_id(&message.id.to_string())
            .with_timestamp(message.timestamp / 1_000_000);
        if self.config.persistent {
            properties.with_persistence(true);
        }
        match message.payload {
            Payload::Json(_) | Payload::JsonBytes(_) => {
                properties.with_content_type("application/json");
            }
            Payload::Text(_) => {
                properties.with_content_type("text/plain");
            }
            Payload::Raw(_) => {}
        }
        if self.config.include_headers && !message.headers.is_empty() {
            let mut table = FieldTable::new();
            for (name, value) in &message.headers {
                // A name AMQP cannot carry is left out rather than failing the message.
                if let (Ok(name), Some(value)) =
                    (ShortStr::try_from(name.as_str()), field_value(value))
                {
                    table.insert(name, value);
                }
            }
            properties.with_headers(table);
        }
        properties.finish()
    }

    async fn connect(&self) -> Result<Publisher, ConnectorError> {
        let session = self.connection.open(&self.name).await?;
        session
            .channel
            .confirm_select(ConfirmSelectArguments::new(false))
            .await
            .map_err(|error| session.error("exchange", "confirm.select", error))?;
        let exchange = &self.config.exchange;
        if !exchange.is_empty() {
            // Declared with its type, or checked (passive) so a missing
            // exchange is reported now, naming the field.
            let arguments = match &self.config.exchange_type {
                Some(kind) => ExchangeDeclareArguments::new(exchange, kind)
                    .durable(true)
                    .finish(),
                None => ExchangeDeclareArguments::new(exchange, "direct")
                    .passive(true)
                    .finish(),
            };
            session
                .channel
                .exchange_declare(arguments)
                .await
                .map_err(|error| {
                    session.error(
                        "exchange",
                        &format!("declaring exchange {exchange:?}"),
                        error,
                    )
                })?;
        }
        Ok(Publisher {
            session,
            published: 0,
        })
    }

    /// Publishes `messages` and waits for every confirm. Returns the
    /// rejections (unroutable messages, messages without a routing key).
    async fn publish(
        &self,
        publisher: &mut Publisher,
        topic: &TopicRef,
        messages: &[SinkMessage],
    ) -> Result<Vec<Rejection>, SinkError> {
        let mut rejected = Vec::new();
        // The index of the message published with delivery tag `first + n`.
        let first = publisher.published + 1;
        let mut published: Vec<usize> = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let routing_key = match self.routing_key(topic, message) {
                Ok(key) => key,
                Err(reason) => {
                    rejected.push(Rejection { index, reason });
                    continue;
                }
            };
            let arguments = BasicPublishArguments::new(&self.config.exchange, &routing_key)
                .mandatory(self.config.mandatory)
                .finish();
            publisher
                .session
                .channel
                .basic_publish(
                    self.properties(message),
                    message.payload.to_bytes().to_vec(),
                    arguments,
                )
                .await
                .map_err(|error| {
                    sink_error(publisher.session.error("exchange", "basic.publish", error))
                })?;
            publisher.published += 1;
            published.push(index);
        }
        let mut confirmed = vec![false; published.len()];
        let mut returned = vec![false; published.len()];
        let mut waiting = published.len();
        let mut nacked = 0;
        let deadline = Instant::now() + self.config.confirm_timeout;
        while waiting > 0 {
            let slice = (Instant::now() + Duration::from_millis(200)).min(deadline);
            let event = match tokio::time::timeout_at(slice.into(), publisher.session.events.recv())
                .await
            {
                Ok(Some(event)) => event,
                Ok(None) => return Err(SinkError::transient("the RabbitMQ channel is gone")),
                Err(_) => {
                    if let Some((code, text)) = publisher.session.closed() {
                        return Err(sink_error(crate::connectors::rabbitmq::classify(
                            "exchange",
                            "publishing",
                            code,
                            &text,
                        )));
                    }
                    if Instant::now() >= deadline {
                        return Err(SinkError::transient(format!(
                            "RabbitMQ confirmed {} of {} messages within {:?}",
                            published.len() - waiting,
                            published.len(),
                            self.config.confirm_timeout
                        )));
                    }
                    continue;
                }
            };
            let (tag, multiple, nack) = match event {
                Event::Ack { tag, multiple } => (tag, multiple, false),
                Event::Nack { tag, multiple } => (tag, multiple, true),
                Event::Returned {
                    message_id,
                    code,
                    text,
                } => {
                    // The first message of this batch with that id not yet
                    // returned (ids are unique unless a producer repeats them).
                    let slot = (0..published.len()).find(|&slot| {
                        !returned[slot]
                            && message_id.as_deref()
                                == Some(messages[published[slot]].id.to_string().as_str())
                    });
                    if let Some(slot) = slot {
                        returned[slot] = true;
                        rejected.push(Rejection {
                            index: published[slot],
                            reason: format!(
                                "RabbitMQ returned the message: {code} {text} (no queue is bound to \
                                 exchange {:?} with its routing key)",
                                self.config.exchange
                            ),
                        });
                    }
                    continue;
                }
            };
            let slots = if multiple {
                0..tag.saturating_sub(first - 1).min(published.len() as u64)
            } else if tag >= first && tag - first < published.len() as u64 {
                tag - first..tag - first + 1
            } else {
                0..0
            };
            for slot in slots {
                let slot = slot as usize;
                if !confirmed[slot] {
                    confirmed[slot] = true;
                    waiting -= 1;
                    if nack {
                        nacked += 1;
                    }
                }
            }
        }
        if nacked > 0 {
            return Err(SinkError::transient(format!(
                "RabbitMQ could not take {nacked} of {} messages (basic.nack)",
                published.len()
            )));
        }
        rejected.sort_by_key(|rejection| rejection.index);
        Ok(rejected)
    }
}

fn expand(template: &str, topic: &TopicRef) -> String {
    template
        .replace("{stream}", &topic.stream)
        .replace("{topic}", &topic.topic)
}

fn field_value(value: &HeaderValue) -> Option<FieldValue> {
    Some(match value {
        HeaderValue::String(text) => FieldValue::S(LongStr::try_from(text.as_str()).ok()?),
        HeaderValue::Bool(flag) => FieldValue::t(*flag),
        HeaderValue::Int(number) => FieldValue::l(*number),
        HeaderValue::UInt(number) => match i64::try_from(*number) {
            Ok(number) => FieldValue::l(number),
            Err(_) => FieldValue::S(LongStr::try_from(number.to_string()).ok()?),
        },
        HeaderValue::Float(number) => FieldValue::d(*number),
        HeaderValue::Raw(bytes) => FieldValue::x(ByteArray::try_from(bytes.to_vec()).ok()?),
    })
}

fn sink_error(error: ConnectorError) -> SinkError {
    if error.is_transient() {
        SinkError::transient(error)
    } else {
        SinkError::fatal(error)
    }
}

#[async_trait]
impl Sink for RabbitmqSink {
    fn attach(&mut self, context: ConnectorContext) {
        if !context.key.is_empty() {
            self.name = format!("iggy-connect sink {}", context.key);
        }
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let publisher = self.connect().await?;
        *self.publisher.get_mut() = Some(publisher);
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let mut guard = self.publisher.lock().await;
        let mut publisher = match guard.take() {
            Some(publisher) if publisher.session.is_open() => publisher,
            // Never opened, or the connection was lost: a new one (what the
            // old channel had not confirmed is published again).
            _ => self.connect().await.map_err(sink_error)?,
        };
        let outcome = self.publish(&mut publisher, topic, messages).await;
        match outcome {
            Ok(rejected) => {
                *guard = Some(publisher);
                if rejected.is_empty() {
                    Ok(())
                } else {
                    Err(SinkError::Rejected(rejected))
                }
            }
            // A failed batch leaves confirms and returns of its own behind:
            // the retry starts on a new channel so none is taken for its.
            Err(error) => {
                publisher.session.close().await;
                Err(error)
            }
        }
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(publisher) = self.publisher.get_mut().take() {
            publisher.session.close().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<RabbitmqSink, PluginConfigError> {
        RabbitmqSink::new(parse_plugin_config(&config)?)
    }

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 7,
            offset: 0,
            partition_id: 1,
            timestamp: 1_700_000_000_000_000,
            origin_timestamp: 0,
            checksum: 0,
            headers: vec![("trace".into(), HeaderValue::String("t-1".into()))],
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "shop".into(),
            topic: "orders".into(),
        }
    }

    #[test]
    fn given_a_config_that_cannot_route_when_built_should_name_the_field() {
        assert_eq!(build(json!({})).err().unwrap().field, "routing_key");
        assert_eq!(
            build(json!({"exchange_type": "topic", "routing_key": "k"}))
                .err()
                .unwrap()
                .field,
            "exchange"
        );
        assert_eq!(
            build(json!({"exchange": "x".repeat(256)}))
                .err()
                .unwrap()
                .field,
            "exchange"
        );
        assert_eq!(
            build(json!({"exchange": "x", "exchange_type": " "}))
                .err()
                .unwrap()
                .field,
            "exchange_type"
        );
        assert_eq!(
            build(json!({"exchange": "x", "port": 0}))
                .err()
                .unwrap()
                .field,
            "port"
        );
        build(json!({"exchange": "fanout-out"})).unwrap();
        build(json!({"routing_key_field": "queue"})).unwrap();
    }

    #[test]
    fn given_a_routing_key_source_when_routed_should_take_the_field_then_the_template() {
        let sink = build(json!({
            "exchange": "x",
            "routing_key": "iggy.{stream}.{topic}",
            "routing_key_field": "to",
        }))
        .unwrap();
        let routed = message(Payload::Json(json!({"to": "eu.orders"})));
        assert_eq!(sink.routing_key(&topic(), &routed).unwrap(), "eu.orders");
        let unrouted = message(Payload::JsonBytes(bytes::Bytes::from_static(b"{\"n\":1}")));
        assert_eq!(
            sink.routing_key(&topic(), &unrouted).unwrap(),
            "iggy.shop.orders"
        );

        let field_only = build(json!({"routing_key_field": "to"})).unwrap();
        let reason = field_only.routing_key(&topic(), &unrouted).unwrap_err();
        assert!(reason.contains("\"to\""), "{reason}");
        let long = message(Payload::Json(json!({"to": "k".repeat(300)})));
        assert!(field_only.routing_key(&topic(), &long).is_err());
    }

    #[test]
    fn given_a_message_when_published_should_carry_its_id_persistence_and_headers() {
        let sink = build(json!({"routing_key": "q"})).unwrap();
        let properties = sink.properties(&message(Payload::Json(json!({}))));
        assert_eq!(properties.message_id().map(String::as_str), Some("7"));
        assert_eq!(properties.delivery_mode(), Some(2));
        assert_eq!(properties.timestamp(), Some(1_700_000_000));
        let headers = properties.headers().unwrap();
        assert!(matches!(
            headers.get(&"trace".try_into().unwrap()),
            Some(FieldValue::S(value)) if value.as_ref() == "t-1"
        ));
        let transient =
            build(json!({"routing_key": "q", "persistent": false, "include_headers": false}))
                .unwrap()
                .properties(&message(Payload::Raw(bytes::Bytes::new())));
        assert_eq!(transient.delivery_mode(), None);
        assert!(transient.headers().is_none());
    }
}
