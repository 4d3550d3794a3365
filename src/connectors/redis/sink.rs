//! `redis` sink: appends every message to a Redis stream with `XADD`.
//!
//! The stream is `stream`, or the payload's top-level field `stream_field`
//! when set (a message without it goes to `stream`, or is rejected when no
//! `stream` is set). Each entry holds the payload under `payload_field` and,
//! with `include_metadata`, the message's Iggy id, offset, partition,
//! timestamp and origin topic; `max_len` trims the stream with
//! `MAXLEN ~ N` on every append.
//!
//! Delivery: one pipeline of `XADD`s per batch, and `Ok` once Redis answered
//! every one of them (an entry is then as durable as the server's
//! persistence makes it: AOF with `appendfsync always` for no loss on a
//! server crash). A connection error or timeout, `LOADING`, `BUSY`, `OOM`,
//! `READONLY`, `TRYAGAIN` or `MASTERDOWN` fails the batch as transient (the
//! engine writes it again); `NOAUTH`, `WRONGPASS` and `NOPERM` are fatal; any
//! other error answers one `XADD` (a key holding another type: `WRONGTYPE`)
//! and rejects that message by index for `on_error`.
//!
//! Not idempotent: Redis gives each entry a new id, so a batch written again
//! (a transient failure after Redis took part of it, a crash before the
//! offsets were committed) appends those entries again. Explicit entry ids
//! would make Redis refuse a replay, but stream ids must grow, and neither
//! Iggy message ids (random) nor offsets (per partition, several partitions
//! and topics may feed one stream) do: a reordered id would be refused as a
//! duplicate and lost. Readers deduplicate by the entry's `iggy_id` field.

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use serde::Deserialize;
use tracing::warn;

use crate::connectors::redis::{Class, Connection, classify, tls_files};
use crate::connectors::{
    ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError, parse_plugin_config,
    schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "redis",
    feature: "redis-sink",
    description: "appends messages to Redis streams (XADD, optional MAXLEN ~)",
    secret_fields: &["url"],
    sample_config: "url = \"redis://:secret@127.0.0.1:6379/0\"\nstream = \"events\"\nmax_len = 1000000\n",
    config_schema: schema_of::<RedisSinkConfig>,
    build: |config| Ok(Box::new(RedisSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// Where and how the sink appends.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RedisSinkConfig {
    /// The server: `redis://[user:password@]host:port[/db]`, `rediss://` for
    /// TLS; a secret (it may hold the password).
    #[schemars(with = "String")]
    pub url: SecretString,
    /// PEM file of the CA certificates a `rediss://` server's certificate
    /// must be signed by (default: the system's).
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// PEM file of the client certificate, for a server that asks for one
    /// (`tls-auth-clients`).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// PEM file of the client certificate's private key.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The stream (key) every message is appended to, or those without
    /// `stream_field`.
    #[serde(default)]
    pub stream: Option<String>,
    /// A top-level field of a JSON payload naming the stream to append the
    /// message to (a string); a message without it goes to `stream`.
    #[serde(default)]
    pub stream_field: Option<String>,
    /// Trim each stream to about this many entries (`MAXLEN ~ N` on every
    /// `XADD`); unset keeps every entry.
    #[serde(default)]
    pub max_len: Option<u64>,
    /// The entry field holding the payload (JSON as text, text, or raw bytes).
    #[serde(default = "default_payload_field")]
    pub payload_field: String,
    /// Add the fields `iggy_id`, `iggy_offset`, `iggy_partition`,
    /// `iggy_timestamp` (microseconds) and `iggy_topic` (`stream/topic`).
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// Add each user header as a field `header.<name>` (its value as text).
    #[serde(default)]
    pub include_headers: bool,
    /// Time to connect to the server.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub connect_timeout: Duration,
    /// Time Redis has to answer a batch's pipeline before it fails as transient.
    #[serde(default = "default_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub timeout: Duration,
}

fn default_payload_field() -> String {
    "payload".into()
}

fn default_true() -> bool {
    true
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

pub struct RedisSink {
    config: RedisSinkConfig,
    connection: Connection,
}

impl RedisSink {
    pub fn new(config: RedisSinkConfig) -> Result<Self, PluginConfigError> {
        if config.stream.is_none() && config.stream_field.is_none() {
            return Err(PluginConfigError::new(
                "stream",
                "expected a stream name (or stream_field, naming a payload field that holds one)",
            ));
        }
        if config.stream.as_deref() == Some("") {
            return Err(PluginConfigError::new(
                "stream",
                "expected a non-empty stream name",
            ));
        }
        if config.payload_field.is_empty() {
            return Err(PluginConfigError::new(
                "payload_field",
                "expected a field name",
            ));
        }
        let connection = Connection::new(
            &config.url,
            &tls_files(&config.ca_file, &config.cert_file, &config.key_file),
            config.connect_timeout,
            config.timeout,
        )?;
        Ok(Self { config, connection })
    }

    /// The stream a message goes to, or why it has none.
    fn stream_of<'a>(&'a self, message: &SinkMessage) -> Result<StreamName<'a>, String> {
        let Some(field) = self.config.stream_field.as_deref() else {
            return Ok(self.fallback());
        };
        let named = match &message.payload {
            Payload::Json(value) => value
                .get(field)
                .map(|value| value.as_str().map(str::to_owned)),
            Payload::JsonBytes(bytes) => serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()
                .and_then(|value| {
                    value
                        .get(field)
                        .map(|value| value.as_str().map(str::to_owned))
                }),
            Payload::Text(_) | Payload::Raw(_) => None,
        };
        match (named, self.config.stream.as_deref()) {
            (Some(Some(name)), _) if !name.is_empty() => Ok(StreamName::Owned(name)),
            (Some(_), _) => Err(format!(
                "stream_field \"{field}\" is not a non-empty string"
            )),
            (None, Some(_)) => Ok(self.fallback()),
            (None, None) => Err(format!(
                "the payload has no field \"{field}\" (stream_field) and no stream is set"
            )),
        }
    }

    fn fallback(&self) -> StreamName<'_> {
        StreamName::Borrowed(self.config.stream.as_deref().unwrap_or_default())
    }

    fn xadd(&self, stream: &str, topic: &TopicRef, message: &SinkMessage) -> redis::Cmd {
        let mut command = redis::cmd("XADD");
        command.arg(stream);
        if let Some(max_len) = self.config.max_len {
            command.arg("MAXLEN").arg("~").arg(max_len);
        }
        command.arg("*");
        command
            .arg(&self.config.payload_field)
            .arg(payload_bytes(&message.payload).as_ref());
        if self.config.include_metadata {
            command
                .arg("iggy_id")
                .arg(message.id.to_string())
                .arg("iggy_offset")
                .arg(message.offset)
                .arg("iggy_partition")
                .arg(message.partition_id)
                .arg("iggy_timestamp")
                .arg(message.timestamp)
                .arg("iggy_topic")
                .arg(topic.to_string());
        }
        if self.config.include_headers {
            for (name, value) in &message.headers {
                command.arg(format!("header.{name}")).arg(value.to_string());
            }
        }
        command
    }
}

enum StreamName<'a> {
    Borrowed(&'a str),
    Owned(String),
}

impl StreamName<'_> {
    fn as_str(&self) -> &str {
        match self {
            StreamName::Borrowed(name) => name,
            StreamName::Owned(name) => name,
        }
    }
}

fn payload_bytes(payload: &Payload) -> std::borrow::Cow<'_, [u8]> {
    match payload {
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => std::borrow::Cow::Borrowed(bytes),
        Payload::Text(text) => std::borrow::Cow::Borrowed(text.as_bytes()),
        Payload::Json(value) => {
            std::borrow::Cow::Owned(serde_json::to_vec(value).unwrap_or_default())
        }
    }
}

fn write_error(error: &redis::RedisError) -> SinkError {
    let text = error.to_string();
    match classify(error) {
        Class::Fatal => SinkError::fatal(format!(
            "redis refused the credentials or permissions of plugin_config.url: {text}"
        )),
        Class::Transient | Class::Refused => SinkError::transient(format!("redis: {text}")),
    }
}

#[async_trait]
impl Sink for RedisSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let ping = redis::cmd("PING");
        match self.connection.query::<String>(&ping).await {
            Ok(_) => Ok(()),
            Err(error) => Err(match self.connection.tls_refusal(&error) {
                Some(refused) => refused,
                None if classify(&error) == Class::Fatal => ConnectorError::fatal(format!(
                    "redis refused the credentials of plugin_config.url: {error}"
                )),
                None => ConnectorError::transient(format!("redis: {error}")),
            }),
        }
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let mut pipeline = redis::pipe();
        pipeline.ignore_errors();
        // Index into `messages` of each command of the pipeline.
        let mut sent = Vec::with_capacity(messages.len());
        let mut rejected = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.stream_of(message) {
                Ok(stream) => {
                    pipeline.add_command(self.xadd(stream.as_str(), topic, message));
                    sent.push(index);
                }
                Err(reason) => rejected.push(Rejection { index, reason }),
            }
        }
        if !sent.is_empty() {
            let mut connection = self.connection.get().await.map_err(|e| write_error(&e))?;
            let answers: Vec<redis::RedisResult<redis::Value>> =
                match pipeline.query_async(&mut connection).await {
                    Ok(answers) => answers,
                    Err(error) => {
                        self.connection.forget_after(&error).await;
                        return Err(write_error(&error));
                    }
                };
            if answers.len() != sent.len() {
                return Err(SinkError::transient(format!(
                    "redis answered {} of {} XADDs",
                    answers.len(),
                    sent.len()
                )));
            }
            for (answer, index) in answers.into_iter().zip(sent) {
                let Err(error) = answer else { continue };
                match classify(&error) {
                    Class::Refused => rejected.push(Rejection {
                        index,
                        reason: format!("XADD refused: {error}"),
                    }),
                    // The rest of the batch may be in; writing it again
                    // appends those entries again (see the module doc).
                    Class::Transient | Class::Fatal => return Err(write_error(&error)),
                }
            }
        }
        if rejected.is_empty() {
            return Ok(());
        }
        warn!(
            rejected = rejected.len(),
            "redis refused messages; the rest of the batch is written again"
        );
        rejected.sort_by_key(|rejection| rejection.index);
        Err(SinkError::Rejected(rejected))
    }

    fn accepts_json_bytes(&self) -> bool {
        self.config.stream_field.is_none()
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<RedisSink, PluginConfigError> {
        RedisSink::new(parse_plugin_config(&config)?)
    }

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 7,
            offset: 1,
            partition_id: 1,
            timestamp: 0,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload,
        }
    }

    #[test]
    fn given_no_stream_when_built_should_name_the_field() {
        let error = build(json!({"url": "redis://127.0.0.1:1"})).err().unwrap();
        assert_eq!(error.field, "stream");
    }

    #[test]
    fn given_stream_field_when_resolving_should_fall_back_or_refuse() {
        let sink = build(json!({"url": "redis://127.0.0.1:1", "stream_field": "to"})).unwrap();
        let named = message(Payload::Json(json!({"to": "orders"})));
        assert_eq!(sink.stream_of(&named).unwrap().as_str(), "orders");
        assert!(sink.stream_of(&message(Payload::Json(json!({})))).is_err());
        assert!(
            sink.stream_of(&message(Payload::Json(json!({"to": 3}))))
                .is_err()
        );
        assert!(sink.stream_of(&message(Payload::Text("x".into()))).is_err());
        let sink =
            build(json!({"url": "redis://127.0.0.1:1", "stream_field": "to", "stream": "all"}))
                .unwrap();
        assert_eq!(
            sink.stream_of(&message(Payload::Json(json!({}))))
                .unwrap()
                .as_str(),
            "all"
        );
    }
}
