//! `nats` source: reads a NATS JetStream stream through a durable pull
//! consumer and acknowledges each message only in `commit`, that is once Iggy
//! acknowledged the batch and the engine saved the state.
//!
//! The consumer's explicit acks are the position: a batch that is never
//! committed (Iggy refusing it until the engine gives up, a stop, a crash) is
//! redelivered by JetStream once `ack_wait` has passed, so it is produced
//! again (duplicates, never loss). `max_ack_pending` is twice `batch_size`
//! (one batch in flight, and room for one a cancelled poll left unacked).
//! A batch still uncommitted at `close` is handed back with a NAK, so it is
//! redelivered at once. Each record's Iggy id is derived from the stream name and the message's
//! stream sequence, so a redelivered message keeps its id.
//!
//! `mode = "core"` subscribes with plain NATS instead: at most once (core
//! NATS keeps nothing, so what arrives while Iggy refuses or the process is
//! down is lost); no state.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::AckKind;
use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, Consumer, DeliverPolicy};
use async_nats::jetstream::context::GetStreamErrorKind;
use async_nats::jetstream::message::Acker;
use async_nats::{Client, Subscriber};
use async_trait::async_trait;
use futures::future::join_all;
use futures::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};

use crate::connectors::nats::connection_fields;
use crate::connectors::{
    BatchPolicy, ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch,
    SourceEntry, decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Headers, Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "nats",
    feature: "nats-source",
    description: "reads NATS JetStream through a durable pull consumer, acked on commit (or core NATS, at most once)",
    secret_fields: &["password", "token"],
    sample_config: "url = \"nats://127.0.0.1:4222\"\nstream = \"ORDERS\"\nsubject = \"orders.>\"\ndurable_name = \"iggy-connect\"\nbatch_size = 500\nack_wait = \"30s\"\nusername = \"iggy\"\npassword = \"secret\"\ntoken = \"secret-token\"\n",
    config_schema: schema_of::<NatsSourceConfig>,
    build: |config| Ok(Box::new(NatsSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// How long the engine waits before polling again after the server answered
/// a waiting pull at once without messages (it is restarting).
const INSTANT_ANSWER_PAUSE: Duration = Duration::from_millis(50);

connection_fields! {
    /// What to read.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct NatsSourceConfig {
        /// `jetstream` (a durable consumer, at-least-once) or `core` (a plain
        /// subscription, at most once: messages arriving while Iggy refuses
        /// them or the process is down are lost).
        #[serde(default)]
        pub mode: Mode,
        /// The JetStream stream to read (required with `jetstream`; it must exist).
        #[serde(default)]
        pub stream: Option<String>,
        /// `jetstream`: only messages of this subject (wildcards allowed);
        /// `core`: the subject to subscribe to (required).
        #[serde(default)]
        pub subject: Option<String>,
        /// `jetstream`: the durable consumer's name, created when missing
        /// (default `iggy-connect-<key>`); its acks are the position.
        #[serde(default)]
        pub durable_name: Option<String>,
        /// `jetstream`: where a newly created consumer starts: `all`, `new` or `last`.
        #[serde(default)]
        pub deliver_policy: StartFrom,
        /// `core`: a queue group, so several instances share the subject.
        #[serde(default)]
        pub queue_group: Option<String>,
        /// Most messages per batch (and per pull request).
        #[serde(default = "default_batch_size")]
        pub batch_size: usize,
        /// How long a pull waits for the first message before asking again.
        #[serde(default = "default_max_wait", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub max_wait: Duration,
        /// `jetstream`: how long a delivered message may stay unacknowledged
        /// before JetStream redelivers it (for a consumer this source creates).
        #[serde(default = "default_ack_wait", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub ack_wait: Duration,
    }
}

/// How the source reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// A JetStream durable pull consumer, acked on commit (at-least-once).
    #[default]
    Jetstream,
    /// A core NATS subscription (at most once).
    Core,
}

/// Where a new JetStream consumer starts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum StartFrom {
    /// Every message the stream holds.
    #[default]
    All,
    /// Only messages stored after the consumer is created.
    New,
    /// The last message, then what follows.
    Last,
}

fn default_batch_size() -> usize {
    500
}

fn default_max_wait() -> Duration {
    Duration::from_millis(500)
}

fn default_ack_wait() -> Duration {
    Duration::from_secs(30)
}

/// What the source saves (informational: the consumer's acks are the
/// position). A state that cannot be decoded still stops the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NatsSourceState {
    /// The highest stream sequence committed.
    pub stream_sequence: u64,
}

enum Reader {
    Jetstream {
        consumer: Box<Consumer<PullConfig>>,
        stream: String,
    },
    Core(tokio::sync::Mutex<Subscriber>),
}

/// The pull request being read and what it delivered so far.
struct Pulling {
    step: Step,
    request: Option<async_nats::jetstream::consumer::pull::Batch>,
    received: Vec<async_nats::jetstream::Message>,
    started: Instant,
}

#[derive(Debug, Clone, Copy)]
enum Step {
    /// Ask for what is there now.
    Fetch,
    /// Nothing was: wait up to `max_wait` for one message.
    Wait,
    /// One came: add what is there right after it.
    TopUp,
}

struct Staged {
    ackers: Vec<Acker>,
    stream_sequence: u64,
}

pub struct NatsSource {
    config: NatsSourceConfig,
    key: String,
    client: Option<Client>,
    reader: Option<Reader>,
    pulling: tokio::sync::Mutex<Pulling>,
    staged: Mutex<Option<Staged>>,
    committed: Mutex<NatsSourceState>,
}

impl NatsSource {
    pub fn new(config: NatsSourceConfig) -> Result<Self, PluginConfigError> {
        config.connection().check()?;
        if config.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        match config.mode {
            Mode::Jetstream if config.stream.as_deref().is_none_or(str::is_empty) => {
                return Err(PluginConfigError::new(
                    "stream",
                    "expected the JetStream stream to read (or mode = \"core\")",
                ));
            }
            Mode::Core if config.subject.as_deref().is_none_or(str::is_empty) => {
                return Err(PluginConfigError::new(
                    "subject",
                    "expected the subject to subscribe to",
                ));
            }
            _ => {}
        }
        Ok(Self {
            config,
            key: String::new(),
            client: None,
            reader: None,
            pulling: tokio::sync::Mutex::new(Pulling {
                step: Step::Fetch,
                request: None,
                received: Vec::new(),
                started: Instant::now(),
            }),
            staged: Mutex::new(None),
            committed: Mutex::new(NatsSourceState::default()),
        })
    }

    fn durable_name(&self) -> String {
        match &self.config.durable_name {
            Some(name) if !name.is_empty() => name.clone(),
            _ if self.key.is_empty() => "iggy-connect".into(),
            _ => format!("iggy-connect-{}", self.key),
        }
    }

    async fn open_jetstream(&self, client: &Client) -> Result<Reader, ConnectorError> {
        let stream_name = self.config.stream.clone().unwrap_or_default();
        let jetstream = async_nats::jetstream::new(client.clone());
        let stream = jetstream.get_stream(&stream_name).await.map_err(|error| {
            match error.kind() {
                GetStreamErrorKind::JetStream(inner) if inner.code() == 404 => {
                    ConnectorError::fatal(format!(
                        "plugin_config.stream: JetStream has no stream {stream_name:?}; create it \
                         or fix the name"
                    ))
                }
                GetStreamErrorKind::InvalidStreamName => ConnectorError::fatal(format!(
                    "plugin_config.stream: {stream_name:?} is not a valid stream name"
                )),
                _ => {
                    ConnectorError::transient(format!("JetStream stream {stream_name:?}: {error}"))
                }
            }
        })?;
        let durable = self.durable_name();
        let batch = i64::try_from(self.config.batch_size).unwrap_or(i64::MAX);
        let config = PullConfig {
            durable_name: Some(durable.clone()),
            ack_policy: AckPolicy::Explicit,
            ack_wait: self.config.ack_wait,
            max_ack_pending: batch.saturating_mul(2),
            filter_subject: self.config.subject.clone().unwrap_or_default(),
            deliver_policy: match self.config.deliver_policy {
                StartFrom::All => DeliverPolicy::All,
                StartFrom::New => DeliverPolicy::New,
                StartFrom::Last => DeliverPolicy::Last,
            },
            ..Default::default()
        };
        let consumer = stream
            .get_or_create_consumer(&durable, config)
            .await
            .map_err(|error| {
                ConnectorError::transient(format!(
                    "JetStream consumer {durable:?} on stream {stream_name:?}: {error}"
                ))
            })?;
        Ok(Reader::Jetstream {
            consumer: Box::new(consumer),
            stream: stream_name,
        })
    }

    /// Waits for messages and returns up to a batch: what is there now, or
    /// else the first to arrive with what came right after it. `None` when
    /// the server answered the wait at once without messages (it is
    /// restarting): the engine pauses before the next poll, so it does not
    /// spin. Cancel-safe: the request being read and what it delivered so
    /// far are kept in `pulling`, so a dropped poll is resumed by the next
    /// one, in order.
    async fn pull(
        &self,
        consumer: &Consumer<PullConfig>,
    ) -> Result<Option<Vec<async_nats::jetstream::Message>>, ConnectorError> {
        let batch = self.config.batch_size;
        let mut pulling = self.pulling.lock().await;
        loop {
            if pulling.request.is_none() {
                let started = Instant::now();
                let (count, wait) = match pulling.step {
                    Step::Fetch => (batch, false),
                    Step::Wait => (1, true),
                    Step::TopUp => (batch - pulling.received.len(), false),
                };
                let request = if wait {
                    consumer
                        .batch()
                        .max_messages(count)
                        .expires(self.config.max_wait)
                        .messages()
                        .await
                } else {
                    consumer.fetch().max_messages(count).messages().await
                };
                pulling.request = Some(request.map_err(|error| {
                    ConnectorError::transient(format!("JetStream pull: {error}"))
                })?);
                pulling.started = started;
            }
            let bound = self.config.max_wait * 2 + Duration::from_secs(1);
            let next = match pulling.request.as_mut() {
                Some(request) => tokio::time::timeout(bound, request.next()).await,
                None => continue,
            };
            match next {
                Ok(Some(Ok(message))) => {
                    pulling.received.push(message);
                    continue;
                }
                Ok(None) => pulling.request = None,
                // A request sent while the connection was down is never
                // answered; an error ends the request. What it delivered is
                // kept; what it did not is redelivered after `ack_wait`.
                Ok(Some(Err(error))) => {
                    pulling.request = None;
                    return Err(ConnectorError::transient(format!(
                        "JetStream pull: {error}"
                    )));
                }
                Err(_) => {
                    pulling.request = None;
                    return Err(ConnectorError::transient(
                        "JetStream pull: no answer (reconnecting?)",
                    ));
                }
            }
            let received = pulling.received.len();
            pulling.step = match pulling.step {
                Step::Fetch | Step::TopUp if received > 0 => {
                    pulling.step = Step::Fetch;
                    return Ok(Some(std::mem::take(&mut pulling.received)));
                }
                Step::Fetch => Step::Wait,
                Step::Wait if received > 0 && received < batch => Step::TopUp,
                Step::Wait if received > 0 => {
                    pulling.step = Step::Fetch;
                    return Ok(Some(std::mem::take(&mut pulling.received)));
                }
                Step::Wait if pulling.started.elapsed() < Duration::from_millis(10) => {
                    pulling.step = Step::Fetch;
                    return Ok(None);
                }
                Step::Wait => Step::Fetch,
                Step::TopUp => Step::Fetch,
            };
        }
    }

    fn poll_jetstream(
        &self,
        stream: &str,
        messages: Vec<async_nats::jetstream::Message>,
    ) -> Result<SourceBatch, ConnectorError> {
        let stream_hash = u128::from(crc32fast::hash(stream.as_bytes())) << 64;
        let mut records = Vec::with_capacity(messages.len());
        let mut ackers = Vec::with_capacity(messages.len());
        let mut highest = 0;
        for message in messages {
            let sequence = message
                .info()
                .map(|info| info.stream_sequence)
                .map_err(|error| {
                    ConnectorError::transient(format!(
                        "a JetStream message without its ack subject: {error}"
                    ))
                })?;
            highest = highest.max(sequence);
            let (message, acker) = message.split();
            ackers.push(acker);
            records.push(SourceRecord {
                id: Some(stream_hash | u128::from(sequence)),
                stream_index: 0,
                headers: headers(&message),
                payload: Payload::Raw(message.payload),
                partition: None,
                origin_timestamp: None,
            });
        }
        let mut state = self.lock_committed().clone();
        state.stream_sequence = state.stream_sequence.max(highest);
        *self.lock_staged() = Some(Staged {
            ackers,
            stream_sequence: highest,
        });
        Ok(SourceBatch {
            records,
            state: Some(encode_state(&state)?),
            finished: false,
            next_poll: None,
        })
    }

    async fn poll_core(
        &self,
        subscriber: &tokio::sync::Mutex<Subscriber>,
    ) -> Result<SourceBatch, ConnectorError> {
        let mut subscriber = subscriber.lock().await;
        // Cancel-safe: nothing is taken off the subscription until the first
        // message arrives, and the rest is taken without waiting.
        let first = subscriber
            .next()
            .await
            .ok_or_else(|| ConnectorError::transient("the NATS subscription ended"))?;
        let mut records = vec![core_record(first)];
        while records.len() < self.config.batch_size {
            match subscriber.next().now_or_never() {
                Some(Some(message)) => records.push(core_record(message)),
                _ => break,
            }
        }
        Ok(SourceBatch {
            records,
            state: None,
            finished: false,
            next_poll: None,
        })
    }

    fn lock_staged(&self) -> std::sync::MutexGuard<'_, Option<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_committed(&self) -> std::sync::MutexGuard<'_, NatsSourceState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn core_record(message: async_nats::Message) -> SourceRecord {
    let headers = headers(&message);
    SourceRecord {
        id: None,
        stream_index: 0,
        headers,
        payload: Payload::Raw(message.payload),
        partition: None,
        origin_timestamp: None,
    }
}

/// The message's NATS headers (the first value of each) and its subject as
/// `nats_subject`.
fn headers(message: &async_nats::Message) -> Headers {
    let mut headers = Headers::new();
    if let Some(map) = &message.headers {
        for (name, values) in map.iter() {
            if let Some(value) = values.first() {
                headers.push((
                    name.to_string().into(),
                    HeaderValue::String(value.as_str().into()),
                ));
            }
        }
    }
    headers.push((
        "nats_subject".into(),
        HeaderValue::String(message.subject.as_str().into()),
    ));
    headers
}

#[async_trait]
impl Source for NatsSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    fn batch_policy(&self) -> BatchPolicy {
        match self.config.mode {
            // JetStream keeps what is not acknowledged: giving up loses nothing.
            Mode::Jetstream => BatchPolicy::default(),
            // A core subscription keeps nothing: giving up would drop what
            // keeps arriving, so retry for as long as it takes.
            Mode::Core => BatchPolicy::never_stop(),
        }
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(state) = state
            && self.config.mode == Mode::Jetstream
        {
            *self.lock_committed() = decode_state(state)?;
        }
        let name = format!("iggy-connect source {}", self.key);
        let client = self.config.connection().connect(&name).await?;
        let reader = match self.config.mode {
            Mode::Jetstream => self.open_jetstream(&client).await?,
            Mode::Core => {
                let subject = self.config.subject.clone().unwrap_or_default();
                let subscribed = match &self.config.queue_group {
                    Some(group) => client.queue_subscribe(subject, group.clone()).await,
                    None => client.subscribe(subject).await,
                };
                Reader::Core(tokio::sync::Mutex::new(subscribed.map_err(|error| {
                    ConnectorError::transient(format!("NATS subscribe: {error}"))
                })?))
            }
        };
        self.client = Some(client);
        self.reader = Some(reader);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        match self.reader.as_ref() {
            Some(Reader::Jetstream { consumer, stream }) => match self.pull(consumer).await? {
                Some(messages) => self.poll_jetstream(stream, messages),
                // Nothing staged: its commit has nothing to acknowledge.
                None => Ok(SourceBatch {
                    next_poll: Some(tokio::time::Instant::now() + INSTANT_ANSWER_PAUSE),
                    ..SourceBatch::default()
                }),
            },
            Some(Reader::Core(subscriber)) => self.poll_core(subscriber).await,
            None => Err(ConnectorError::fatal(
                "the nats source was polled before open",
            )),
        }
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(staged) = self.lock_staged().take() else {
            return Ok(());
        };
        let acked = join_all(staged.ackers.iter().map(|acker| acker.ack())).await;
        let flushed = match &self.client {
            Some(client) => tokio::time::timeout(self.config.connect_timeout, client.flush())
                .await
                .map_err(|_| "timed out".to_owned())
                .and_then(|flushed| flushed.map_err(|error| error.to_string())),
            None => Ok(()),
        };
        if let Some(error) = acked.into_iter().find_map(Result::err) {
            // Acking again is harmless: keep the batch staged for the retry.
            *self.lock_staged() = Some(staged);
            return Err(ConnectorError::transient(format!("JetStream ack: {error}")));
        }
        if let Err(error) = flushed {
            *self.lock_staged() = Some(staged);
            return Err(ConnectorError::transient(format!("JetStream ack: {error}")));
        }
        let mut committed = self.lock_committed();
        committed.stream_sequence = committed.stream_sequence.max(staged.stream_sequence);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        // An uncommitted batch is handed back (NAK) so it is redelivered now,
        // in order, instead of after `ack_wait`.
        let staged = self.lock_staged().take();
        let pulling = self.pulling.get_mut();
        pulling.request = None;
        let received = std::mem::take(&mut pulling.received);
        if staged.is_some() || !received.is_empty() {
            let ackers = staged.iter().flat_map(|staged| staged.ackers.iter());
            join_all(ackers.map(|acker| acker.ack_with(AckKind::Nak(None)))).await;
            join_all(
                received
                    .iter()
                    .map(|message| message.ack_with(AckKind::Nak(None))),
            )
            .await;
            if let Some(client) = &self.client {
                let _ = tokio::time::timeout(self.config.connect_timeout, client.flush()).await;
            }
        }
        self.reader.take();
        if let Some(client) = self.client.take() {
            let _ = client.drain().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<NatsSource, PluginConfigError> {
        NatsSource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_a_mode_without_its_target_when_built_should_name_the_field() {
        assert_eq!(build(json!({})).err().unwrap().field, "stream");
        assert_eq!(
            build(json!({"mode": "core"})).err().unwrap().field,
            "subject"
        );
        assert_eq!(
            build(json!({"stream": "S", "batch_size": 0}))
                .err()
                .unwrap()
                .field,
            "batch_size"
        );
        assert_eq!(build(json!({"mode": "x"})).err().unwrap().field, "mode");
    }

    #[test]
    fn given_no_durable_name_when_opened_should_derive_it_from_the_key() {
        let mut source = build(json!({"stream": "S"})).unwrap();
        assert_eq!(source.durable_name(), "iggy-connect");
        source.attach(ConnectorContext {
            key: "orders".into(),
            ..ConnectorContext::default()
        });
        assert_eq!(source.durable_name(), "iggy-connect-orders");
    }
}
