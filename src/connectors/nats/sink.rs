//! `nats` sink: publishes each message to NATS JetStream and reports a batch
//! written only when JetStream acknowledged every message of it (the PubAck:
//! the message is stored in a stream).
//!
//! Every message carries `Nats-Msg-Id` = its Iggy message id, so a batch the
//! engine writes again (after a transient failure, a restart) is dropped by
//! the stream's duplicate window instead of stored twice; the id must then be
//! unique among the messages that reach one stream within that window (Iggy
//! mints unique ids unless the producer sets its own). The subject is fixed,
//! may name the Iggy stream and topic (`{stream}`, `{topic}`), or comes from a
//! field of a JSON payload.

use std::str::FromStr;
use std::sync::OnceLock;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::header::HeaderName;
use async_nats::jetstream::context::{
    Context, ContextBuilder, GetStreamByNameErrorKind, PublishErrorKind,
};
use async_nats::jetstream::message::PublishMessage;
use async_nats::jetstream::stream::Config as StreamConfig;
use async_trait::async_trait;
use futures::future::join_all;
use serde::Deserialize;

use crate::connectors::nats::connection_fields;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "nats",
    feature: "nats-sink",
    description: "publishes to NATS JetStream, durable at the PubAck, deduplicated by Nats-Msg-Id",
    secret_fields: &["password", "token"],
    sample_config: "url = \"nats://127.0.0.1:4222\"\nsubject = \"iggy.{stream}.{topic}\"\nstream = \"IGGY\"\nstream_subjects = [\"iggy.>\"]\nusername = \"iggy\"\npassword = \"secret\"\ntoken = \"secret-token\"\n",
    config_schema: schema_of::<NatsSinkConfig>,
    build: |config| Ok(Box::new(NatsSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

connection_fields! {
    /// Where to publish.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct NatsSinkConfig {
        /// The subject to publish to; `{stream}` and `{topic}` are replaced by
        /// the Iggy stream and topic the message came from. Required unless
        /// every message names its subject in `subject_field`.
        #[serde(default)]
        pub subject: Option<String>,
        /// A top-level field of a JSON payload holding the subject; it wins
        /// over `subject`. A message without it (and no `subject`) is rejected
        /// and goes through `on_error`.
        #[serde(default)]
        pub subject_field: Option<String>,
        /// The JetStream stream that must capture the subjects. When set it is
        /// created on open if missing, capturing `stream_subjects`; when unset
        /// some stream must already capture every subject published to.
        #[serde(default)]
        pub stream: Option<String>,
        /// The subjects a created `stream` captures (default: `subject`, which
        /// must then have no `{...}` placeholder).
        #[serde(default)]
        pub stream_subjects: Vec<String>,
        /// The duplicate window of a created `stream`: a message whose
        /// `Nats-Msg-Id` was stored within it is dropped.
        #[serde(default = "default_duplicate_window", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub duplicate_window: Duration,
        /// Copy the Iggy message's user headers into NATS headers (values as text).
        #[serde(default = "default_true")]
        pub include_headers: bool,
        /// How long to wait for each PubAck before the batch counts as failed
        /// (and is retried).
        #[serde(default = "default_ack_timeout", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub ack_timeout: Duration,
    }
}

fn default_true() -> bool {
    true
}

fn default_ack_timeout() -> Duration {
    Duration::from_secs(5)
}

fn default_duplicate_window() -> Duration {
    Duration::from_secs(120)
}

/// Publishes awaiting acknowledgements, at most this many at once.
const ACKS_IN_FLIGHT: usize = 1024;

/// JetStream's "message size exceeds maximum allowed": that message can never
/// be stored.
const MESSAGE_TOO_LARGE: u64 = 10054;

pub struct NatsSink {
    config: NatsSinkConfig,
    name: String,
    jetstream: OnceLock<Context>,
}

impl NatsSink {
    pub fn new(config: NatsSinkConfig) -> Result<Self, PluginConfigError> {
        config.connection().check()?;
        match (&config.subject, &config.subject_field) {
            (None, None) => {
                return Err(PluginConfigError::new(
                    "subject",
                    "expected a subject to publish to (or subject_field naming a payload field)",
                ));
            }
            (Some(subject), _) if subject.trim().is_empty() => {
                return Err(PluginConfigError::new(
                    "subject",
                    "expected a subject, found \"\"",
                ));
            }
            _ => {}
        }
        if let Some(stream) = &config.stream {
            if stream.is_empty() || stream.contains(['.', '*', '>', ' ']) {
                return Err(PluginConfigError::new(
                    "stream",
                    format!(
                        "expected a JetStream stream name (no '.', '*', '>' or spaces), found {stream:?}"
                    ),
                ));
            }
            if config.stream_subjects.is_empty()
                && config
                    .subject
                    .as_deref()
                    .is_none_or(|subject| subject.contains('{'))
            {
                return Err(PluginConfigError::new(
                    "stream_subjects",
                    "a created stream needs the subjects it captures: set stream_subjects \
                     (subject has a placeholder or is unset)",
                ));
            }
        }
        Ok(Self {
            config,
            name: "iggy-connect nats sink".into(),
            jetstream: OnceLock::new(),
        })
    }

    fn subject(&self, topic: &TopicRef, message: &SinkMessage) -> Result<String, String> {
        if let Some(field) = &self.config.subject_field {
            if let Some(subject) = message.payload.text_field(field) {
                return Ok(subject);
            }
            if self.config.subject.is_none() {
                return Err(format!(
                    "the payload has no string field {field:?} to take the subject from"
                ));
            }
        }
        Ok(topic.fill(self.config.subject.as_deref().unwrap_or_default()))
    }

    fn publish_message(&self, message: &SinkMessage) -> PublishMessage {
        let mut headers = HeaderMap::new();
        if self.config.include_headers {
            for (key, value) in &message.headers {
                let value = value.to_string();
                // NATS headers are text lines: a name or value that cannot be
                // one is left out rather than corrupting the message.
                if let Ok(name) = HeaderName::from_str(key)
                    && !value.contains(['\r', '\n'])
                {
                    headers.insert(name, value);
                }
            }
        }
        PublishMessage::build()
            .payload(message.payload.to_bytes())
            .headers(headers)
            .message_id(message.id.to_string())
    }

    async fn ensure_stream(&self, jetstream: &Context) -> Result<(), ConnectorError> {
        let Some(stream) = &self.config.stream else {
            return Ok(());
        };
        let subjects = if self.config.stream_subjects.is_empty() {
            self.config.subject.iter().cloned().collect()
        } else {
            self.config.stream_subjects.clone()
        };
        jetstream
            .get_or_create_stream(StreamConfig {
                name: stream.clone(),
                subjects,
                duplicate_window: self.config.duplicate_window,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(|error| {
                ConnectorError::transient(format!(
                    "plugin_config.stream: cannot find or create JetStream stream {stream:?}: {error}"
                ))
            })
    }
}

/// What one publish's failure means for its message.
enum Outcome {
    Rejected(String),
    Transient(String),
}

fn classify(error: &async_nats::jetstream::context::PublishError) -> Outcome {
    match error.kind() {
        PublishErrorKind::MaxPayloadExceeded => Outcome::Rejected(error.to_string()),
        PublishErrorKind::StreamNotFound => Outcome::Transient(format!(
            "{error}: no JetStream stream captures the subject (create one, or set \
             plugin_config.stream and stream_subjects)"
        )),
        PublishErrorKind::Other => {
            let code = std::error::Error::source(error)
                .and_then(|source| source.downcast_ref::<async_nats::jetstream::Error>())
                .map(|error| error.error_code().0);
            match code {
                Some(MESSAGE_TOO_LARGE) => Outcome::Rejected(error.to_string()),
                _ => Outcome::Transient(error.to_string()),
            }
        }
        _ => Outcome::Transient(error.to_string()),
    }
}

#[async_trait]
impl Sink for NatsSink {
    fn attach(&mut self, context: ConnectorContext) {
        if !context.key.is_empty() {
            self.name = format!("iggy-connect sink {}", context.key);
        }
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let client = self.config.connection().connect(&self.name).await?;
        let jetstream = ContextBuilder::new()
            .timeout(self.config.ack_timeout)
            .max_ack_inflight(ACKS_IN_FLIGHT)
            .build(client);
        self.ensure_stream(&jetstream).await?;
        // A fixed subject with no stream capturing it can never be written:
        // say so now rather than retrying every batch.
        if self.config.subject_field.is_none()
            && let Some(subject) = self.config.subject.as_deref().filter(|s| !s.contains('{'))
        {
            match jetstream.stream_by_subject(subject).await {
                Ok(_) => {}
                Err(error) if error.kind() == GetStreamByNameErrorKind::NotFound => {
                    return Err(ConnectorError::fatal(format!(
                        "plugin_config.subject: no JetStream stream captures {subject:?}; \
                         create one, or set plugin_config.stream (and stream_subjects) to have it created"
                    )));
                }
                Err(error) if error.kind() == GetStreamByNameErrorKind::InvalidSubject => {
                    return Err(ConnectorError::fatal(format!(
                        "plugin_config.subject: {subject:?} is not a valid NATS subject"
                    )));
                }
                Err(error) => return Err(ConnectorError::transient(error.to_string())),
            }
        }
        let _ = self.jetstream.set(jetstream);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let jetstream = self
            .jetstream
            .get()
            .ok_or_else(|| SinkError::fatal("the nats sink was written before open"))?;
        let mut rejected = Vec::new();
        let mut transient = None;
        let mut start = 0;
        while start < messages.len() {
            let end = (start + ACKS_IN_FLIGHT).min(messages.len());
            let mut acks = Vec::with_capacity(end - start);
            for (index, message) in messages.iter().enumerate().take(end).skip(start) {
                let subject = match self.subject(topic, message) {
                    Ok(subject) => subject,
                    Err(reason) => {
                        rejected.push(Rejection { index, reason });
                        continue;
                    }
                };
                match jetstream
                    .send_publish(subject, self.publish_message(message))
                    .await
                {
                    Ok(ack) => acks.push((index, ack)),
                    Err(error) => match classify(&error) {
                        Outcome::Rejected(reason) => rejected.push(Rejection { index, reason }),
                        Outcome::Transient(reason) => {
                            transient = Some(reason);
                            break;
                        }
                    },
                }
            }
            let acked = join_all(
                acks.into_iter()
                    .map(|(index, ack)| async move { (index, ack.await) }),
            )
            .await;
            for (index, result) in acked {
                if let Err(error) = result {
                    match classify(&error) {
                        Outcome::Rejected(reason) => rejected.push(Rejection { index, reason }),
                        Outcome::Transient(reason) => transient = Some(reason),
                    }
                }
            }
            if let Some(reason) = transient {
                // What was acknowledged is stored; the retry's copies of it
                // are dropped by the duplicate window.
                return Err(SinkError::transient(format!("nats publish: {reason}")));
            }
            start = end;
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            rejected.sort_by_key(|rejection| rejection.index);
            Err(SinkError::Rejected(rejected))
        }
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(jetstream) = self.jetstream.take() {
            let _ = jetstream.client().flush().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<NatsSink, PluginConfigError> {
        NatsSink::new(parse_plugin_config(&config)?)
    }

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 7,
            offset: 0,
            partition_id: 1,
            timestamp: 0,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload,
        }
    }

    #[test]
    fn given_no_subject_when_built_should_name_the_field() {
        assert_eq!(build(json!({})).err().unwrap().field, "subject");
        assert_eq!(
            build(json!({"subject": "a.{topic}", "stream": "S"}))
                .err()
                .unwrap()
                .field,
            "stream_subjects"
        );
        assert_eq!(
            build(json!({"subject": "a", "stream": "a.b"}))
                .err()
                .unwrap()
                .field,
            "stream"
        );
    }

    #[test]
    fn given_a_template_or_field_when_routed_should_pick_the_subject() {
        let topic = TopicRef {
            stream: "shop".into(),
            topic: "orders".into(),
        };
        let sink =
            build(json!({"subject": "iggy.{stream}.{topic}", "subject_field": "to"})).unwrap();
        assert_eq!(
            sink.subject(&topic, &message(Payload::Json(json!({"to": "x.y"})))),
            Ok("x.y".into())
        );
        assert_eq!(
            sink.subject(&topic, &message(Payload::Raw("z".into()))),
            Ok("iggy.shop.orders".into())
        );
        let only_field = build(json!({"subject_field": "to"})).unwrap();
        assert!(
            only_field
                .subject(&topic, &message(Payload::JsonBytes("{\"other\":1}".into())))
                .is_err()
        );
    }
}
