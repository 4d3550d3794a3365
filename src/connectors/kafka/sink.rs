//! `kafka` sink: produces each Iggy message as a Kafka record with an
//! idempotent producer (`enable.idempotence=true`, `acks=all`) and reports
//! a batch written only from the delivery reports of its records.
//!
//! A write enqueues the batch's records and waits for every delivery report:
//! records the brokers acknowledged are durable, a record refused for good
//! (too large, an invalid or unauthorized topic) is rejected with librdkafka's
//! reason and goes through `on_error`, and anything else (a full local queue,
//! a broker down past `delivery_timeout`) fails the rest transiently: the
//! engine writes those again and commits the Iggy offset only up to the
//! highest contiguous durable record. A record written again after a
//! transient failure may reach Kafka twice (at-least-once); every record
//! carries the Iggy message id in the `iggy_id` header so consumers can drop
//! the copy. A producer librdkafka declares failed for good (fenced, say)
//! answers `Disconnected`: the engine opens the sink again with a new one.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use serde::Deserialize;

use crate::connectors::kafka::{Logging, blocking, classify, client_fields, is_fatal};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "kafka",
    feature: "kafka-sink",
    description: "produces to Kafka with an idempotent producer, acked from delivery reports",
    secret_fields: &["sasl_password"],
    sample_config: "bootstrap_servers = \"localhost:9092\"\ntopic = \"iggy-{stream}-{topic}\"\nkey = \"header:kafka_key\"\ncompression = \"zstd\"\nsasl_mechanism = \"SCRAM-SHA-512\"\nsasl_username = \"iggy\"\nsasl_password = \"secret\"\n",
    config_schema: schema_of::<KafkaSinkConfig>,
    build: |config| Ok(Box::new(KafkaSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

client_fields! {
    /// Where and how to produce.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct KafkaSinkConfig {
        /// The Kafka topic to write to (required); `{stream}` and `{topic}`
        /// are replaced by the Iggy stream and topic the message came from.
        #[serde(default)]
        pub topic: String,
        /// A header of the message naming its Kafka topic; wins over
        /// `topic_field` and `topic` when present.
        #[serde(default)]
        pub topic_header: Option<String>,
        /// A top-level field of a JSON payload naming its Kafka topic; wins
        /// over `topic` when present.
        #[serde(default)]
        pub topic_field: Option<String>,
        /// The record key: `id` (the Iggy message id, as decimal text),
        /// `none`, `header:<name>` (a header's value) or `field:<name>` (a
        /// top-level field of a JSON payload); a message without the header
        /// or field gets no key.
        #[serde(default)]
        #[schemars(with = "String")]
        pub key: KeySource,
        /// Copy the Iggy message's user headers into Kafka headers.
        #[serde(default = "crate::connectors::kafka::default_true")]
        pub include_headers: bool,
        /// Compression of record batches: `none`, `gzip`, `snappy`, `lz4` or `zstd`.
        #[serde(default)]
        pub compression: Compression,
        /// How long the producer waits to fill a record batch (`linger.ms`).
        #[serde(default = "default_linger", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub linger: Duration,
        /// Most bytes in one record batch (`batch.size`).
        #[serde(default = "default_batch_bytes")]
        pub batch_bytes: usize,
        /// How long a record may take to be acknowledged, retries included
        /// (`message.timeout.ms`); past it the write fails transiently and
        /// the engine writes the record again.
        #[serde(default = "default_delivery_timeout", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub delivery_timeout: Duration,
    }
}

/// Where a record's key comes from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum KeySource {
    #[default]
    Id,
    None,
    Header(String),
    Field(String),
}

impl std::str::FromStr for KeySource {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.split_once(':') {
            None if text == "id" => Ok(Self::Id),
            None if text == "none" => Ok(Self::None),
            Some(("header", name)) if !name.is_empty() => Ok(Self::Header(name.to_owned())),
            Some(("field", name)) if !name.is_empty() => Ok(Self::Field(name.to_owned())),
            _ => Err(format!(
                "expected `id`, `none`, `header:<name>` or `field:<name>`, not {text:?}"
            )),
        }
    }
}

impl TryFrom<String> for KeySource {
    type Error = String;

    fn try_from(text: String) -> Result<Self, Self::Error> {
        text.parse()
    }
}

/// Record batch compression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

fn default_linger() -> Duration {
    Duration::from_millis(5)
}

fn default_batch_bytes() -> usize {
    1_000_000
}

fn default_delivery_timeout() -> Duration {
    Duration::from_secs(30)
}

pub struct KafkaSink {
    config: KafkaSinkConfig,
    key: String,
    producer: Option<Arc<FutureProducer<Logging>>>,
}

impl KafkaSink {
    pub fn new(config: KafkaSinkConfig) -> Result<Self, PluginConfigError> {
        if config.topic.is_empty() {
            return Err(PluginConfigError::new(
                "topic",
                "expected the Kafka topic to write to",
            ));
        }
        let sink = Self {
            config,
            key: String::new(),
            producer: None,
        };
        sink.client_config()?;
        Ok(sink)
    }

    fn client_config(&self) -> Result<rdkafka::ClientConfig, PluginConfigError> {
        let millis = |duration: Duration| duration.as_millis().to_string();
        let settings = [
            ("enable.idempotence", "true".to_owned()),
            ("acks", "all".to_owned()),
            (
                "compression.codec",
                self.config.compression.as_str().to_owned(),
            ),
            ("linger.ms", millis(self.config.linger)),
            ("batch.size", self.config.batch_bytes.to_string()),
            ("message.timeout.ms", millis(self.config.delivery_timeout)),
        ];
        self.config.client().config(&self.key, &settings)
    }

    fn producer(&self) -> Result<&FutureProducer<Logging>, SinkError> {
        self.producer
            .as_deref()
            .ok_or_else(|| SinkError::transient("the kafka sink is not open"))
    }

    /// The Kafka topic of a message: its header, its payload field, or the
    /// configured topic.
    fn topic(&self, origin: &TopicRef, message: &SinkMessage) -> String {
        let from_header = self
            .config
            .topic_header
            .as_deref()
            .and_then(|name| header(message, name))
            .map(|value| value.to_string());
        from_header
            .or_else(|| {
                let field = self.config.topic_field.as_deref()?;
                message.payload.text_field(field)
            })
            .filter(|topic| !topic.is_empty())
            .unwrap_or_else(|| origin.fill(&self.config.topic))
    }

    fn record_key(&self, message: &SinkMessage) -> Option<Vec<u8>> {
        match &self.config.key {
            KeySource::Id => Some(message.id.to_string().into_bytes()),
            KeySource::None => None,
            KeySource::Header(name) => header(message, name).map(|value| match value {
                HeaderValue::Raw(bytes) => bytes.to_vec(),
                other => other.to_string().into_bytes(),
            }),
            KeySource::Field(name) => message.payload.text_field(name).map(String::into_bytes),
        }
    }

    fn headers(&self, message: &SinkMessage) -> OwnedHeaders {
        let count = if self.config.include_headers {
            message.headers.len()
        } else {
            0
        };
        let mut headers = OwnedHeaders::new_with_capacity(count + 1);
        let id = message.id.to_string();
        headers = headers.insert(Header {
            key: "iggy_id",
            value: Some(id.as_bytes()),
        });
        if self.config.include_headers {
            for (name, value) in &message.headers {
                let bytes = match value {
                    HeaderValue::Raw(bytes) => bytes.to_vec(),
                    other => other.to_string().into_bytes(),
                };
                headers = headers.insert(Header {
                    key: name.as_str(),
                    value: Some(&bytes),
                });
            }
        }
        headers
    }

    /// Enqueues the batch's records until one cannot be: returns each
    /// enqueued record's delivery report with its index.
    fn enqueue(
        &self,
        producer: &FutureProducer<Logging>,
        origin: &TopicRef,
        messages: &[SinkMessage],
        outcome: &mut Outcome,
    ) -> Vec<(usize, DeliveryFuture)> {
        let mut pending = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            let topic = self.topic(origin, message);
            let key = self.record_key(message);
            let payload = message.payload.to_bytes();
            let mut record = FutureRecord::to(&topic)
                .payload(payload.as_ref())
                .headers(self.headers(message));
            if let Some(key) = &key {
                record = record.key(key.as_slice());
            }
            if let Ok(millis) = i64::try_from(message.origin_timestamp / 1000)
                && millis > 0
            {
                record = record.timestamp(millis);
            }
            match producer.send_result(record) {
                Ok(delivery) => pending.push((index, delivery)),
                Err((error, _)) => {
                    outcome.fail(failure(&error), [index]);
                    if outcome.stopped() {
                        break;
                    }
                }
            }
        }
        pending
    }
}

/// A message's header by name.
fn header<'a>(message: &'a SinkMessage, name: &str) -> Option<&'a HeaderValue> {
    message
        .headers
        .iter()
        .find(|(key, _)| key == name)
        .map(|(_, value)| value)
}

/// How a record's failure maps onto the contract: refused for good when
/// sending it again cannot help, fatal when the producer cannot go on,
/// transient otherwise (a full queue is back-pressure, a broker down or a
/// timeout is an outage).
fn failure(error: &KafkaError) -> Failure {
    let reason = error.to_string();
    match error.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageSizeTooLarge
            | RDKafkaErrorCode::InvalidMessageSize
            | RDKafkaErrorCode::MessageBatchTooLarge
            | RDKafkaErrorCode::InvalidMessage
            | RDKafkaErrorCode::InvalidRecord
            | RDKafkaErrorCode::InvalidTopic
            | RDKafkaErrorCode::TopicAuthorizationFailed
            | RDKafkaErrorCode::PolicyViolation,
        ) => Failure::Refused(reason),
        _ if is_fatal(error) => Failure::Fatal(reason),
        _ => Failure::Transient {
            reason,
            retry_after: None,
        },
    }
}

/// A write's answer once the producer hit a fatal error: what is durable or
/// refused stays so, the rest is `Disconnected` (the engine opens the sink
/// again, with a new producer).
fn disconnected(result: Result<(), SinkError>, reason: &str) -> Result<(), SinkError> {
    let lost = || SinkError::disconnected(format!("the kafka producer failed for good: {reason}"));
    match result {
        Ok(()) => Ok(()),
        Err(SinkError::Partial(partial)) => Err(SinkError::partial(
            partial.durable,
            partial.rejected,
            match partial.rest {
                rest @ SinkError::Rejected(_) => rest,
                _ => lost(),
            },
        )),
        Err(SinkError::Rejected(rejected)) => Err(SinkError::Rejected(rejected)),
        Err(_) => Err(lost()),
    }
}

/// Whether the broker no longer takes this producer's records (its id or
/// epoch is stale): only a new producer can go on.
fn producer_lost(error: &KafkaError) -> bool {
    matches!(
        error.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::ProducerFenced
                | RDKafkaErrorCode::InvalidProducerEpoch
                | RDKafkaErrorCode::UnknownProducerId
                | RDKafkaErrorCode::OutOfOrderSequenceNumber
                | RDKafkaErrorCode::InvalidProducerIdMapping
        )
    )
}

#[async_trait]
impl Sink for KafkaSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let config = self.client_config().map_err(ConnectorError::fatal)?;
        let context = Logging::new(&self.key);
        let logging = context.clone();
        let producer: FutureProducer<Logging> = config
            .create_with_context(context)
            .map_err(|error| classify("creating the kafka producer", error))?;
        let producer = Arc::new(producer);
        let (checking, timeout) = (producer.clone(), self.config.open_timeout);
        blocking("fetching the cluster's metadata", move || {
            checking.client().fetch_metadata(None, timeout).map(drop)
        })
        .await
        .map_err(|error| logging.explain(error))?;
        self.producer = Some(producer);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let producer = self.producer()?;
        let mut outcome = Outcome::default();
        let pending = self.enqueue(producer, topic, messages, &mut outcome);
        let mut lost = None;
        for (index, delivery) in pending {
            match delivery.await {
                Ok(Ok(_)) => outcome.durable([index]),
                Ok(Err((error, _))) => {
                    if producer_lost(&error) {
                        lost.get_or_insert_with(|| error.to_string());
                    }
                    outcome.fail(failure(&error), [index]);
                }
                Err(_) => outcome.fail(
                    Failure::Transient {
                        reason: "the kafka producer dropped the record".into(),
                        retry_after: None,
                    },
                    [index],
                ),
            }
        }
        let fatal = producer
            .client()
            .fatal_error()
            .map(|(code, reason)| format!("{code}: {reason}"));
        match fatal.or(lost) {
            // The producer can send nothing more (fenced after its epoch
            // bump, say): what is not durable waits for a fresh one.
            Some(reason) => disconnected(outcome.into_result(), &reason),
            None => outcome.into_result(),
        }
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(producer) = self.producer.take() {
            // Every write awaited its reports, so nothing of ours is queued;
            // the flush only bounds the wait for librdkafka's own requests.
            let flushed = blocking("closing the kafka producer", move || {
                let flushed = producer.flush(Duration::from_secs(5));
                drop(producer);
                flushed
            })
            .await;
            if let Err(error) = flushed {
                tracing::warn!(connector_key = %self.key, %error, "closing the kafka producer");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Headers, Payload};
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<KafkaSink, PluginConfigError> {
        KafkaSink::new(parse_plugin_config(&config)?)
    }

    fn message(headers: Headers, payload: serde_json::Value) -> SinkMessage {
        SinkMessage {
            id: 42,
            offset: 0,
            partition_id: 1,
            timestamp: 0,
            origin_timestamp: 0,
            checksum: 0,
            headers,
            payload: Payload::Json(payload),
        }
    }

    #[test]
    fn given_a_bad_field_when_built_should_name_it() {
        let field = |config| build(config).err().unwrap().field;
        assert_eq!(field(json!({"bootstrap_servers": "b:9092"})), "topic");
        assert_eq!(
            field(json!({"bootstrap_servers": "b:9092", "topic": "t", "key": "column:x"})),
            "key"
        );
        assert_eq!(
            field(json!({"bootstrap_servers": "b:9092", "topic": "t", "compression": "brotli"})),
            "compression"
        );
        assert_eq!(
            field(json!({"bootstrap_servers": "b:9092", "topic": "t",
                "client_options": {"acks": "some"}})),
            "client_options"
        );
    }

    #[test]
    fn given_every_codec_when_built_should_be_accepted_by_librdkafka() {
        for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
            build(json!({"bootstrap_servers": "b:9092", "topic": "t", "compression": codec}))
                .unwrap_or_else(|error| panic!("{codec}: {error}"));
        }
    }

    #[test]
    fn given_a_topic_header_or_field_when_routed_should_win_over_the_template() {
        let sink = build(
            json!({"bootstrap_servers": "b:9092", "topic": "iggy-{stream}-{topic}",
            "topic_header": "to", "topic_field": "route"}),
        )
        .unwrap();
        let origin = TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        };
        let plain = message(vec![], json!({}));
        assert_eq!(sink.topic(&origin, &plain), "iggy-s-t");
        let by_field = message(vec![], json!({"route": "f"}));
        assert_eq!(sink.topic(&origin, &by_field), "f");
        let by_header = message(vec![("to".into(), "h".into())], json!({"route": "f"}));
        assert_eq!(sink.topic(&origin, &by_header), "h");
    }

    #[test]
    fn given_each_key_source_when_keyed_should_take_the_key_from_it() {
        let keyed = |key: &str| {
            let sink =
                build(json!({"bootstrap_servers": "b:9092", "topic": "t", "key": key})).unwrap();
            let message = message(vec![("k".into(), "from-header".into())], json!({"id": 7}));
            sink.record_key(&message)
                .map(|bytes| String::from_utf8(bytes).unwrap())
        };
        assert_eq!(keyed("id").as_deref(), Some("42"));
        assert_eq!(keyed("none"), None);
        assert_eq!(keyed("header:k").as_deref(), Some("from-header"));
        assert_eq!(keyed("field:id").as_deref(), Some("7"));
        assert_eq!(keyed("header:missing"), None);
    }

    #[test]
    fn given_broker_answers_when_classified_should_refuse_only_what_a_retry_cannot_fix() {
        let code = |code| failure(&KafkaError::MessageProduction(code));
        assert!(matches!(
            code(RDKafkaErrorCode::MessageSizeTooLarge),
            Failure::Refused(_)
        ));
        assert!(matches!(
            code(RDKafkaErrorCode::TopicAuthorizationFailed),
            Failure::Refused(_)
        ));
        assert!(matches!(
            code(RDKafkaErrorCode::QueueFull),
            Failure::Transient { .. }
        ));
        assert!(matches!(
            code(RDKafkaErrorCode::MessageTimedOut),
            Failure::Transient { .. }
        ));
        assert!(matches!(
            code(RDKafkaErrorCode::SaslAuthenticationFailed),
            Failure::Fatal(_)
        ));
    }
}
