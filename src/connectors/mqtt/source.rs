//! `mqtt` source: subscribes to MQTT topic filters with QoS 1 in a persistent
//! session (clean session off, a fixed client id) and sends each message's
//! PUBACK only in `commit`, that is once Iggy acknowledged the batch and the
//! engine saved the state.
//!
//! The broker keeps what was delivered and not acknowledged in the session
//! and sends it again (with DUP set) when the client id connects next: after a
//! stop, a crash or a lost connection the uncommitted batch comes again
//! (duplicates, never loss). A background task drives the connection (keep
//! alive) and queues what arrives; a lost connection ends it, and `poll`
//! then says so (`Disconnected`) so the engine opens a fresh source; `poll` takes from that queue
//! without waiting in between, so a dropped poll loses nothing. How much the
//! broker sends before it waits for PUBACKs is its own setting (mosquitto's
//! `max_inflight_messages`, 20 by default), which bounds a batch.
//!
//! Ids: MQTT messages have none that survives a redelivery (the packet id is
//! per connection and reused), so records get the engine's fresh id and a
//! redelivered message is a new Iggy message with the header `mqtt_dup`.
//! A packet id means something only on the connection it came on: a batch
//! received on a lost connection is delivered but not acknowledged (the
//! broker sends it again), and acknowledgements go out in the order the messages came,
//! as MQTT 3.1.1 (4.6) asks.
//!
//! MQTT 5 (`protocol_version = "5"`) keeps the same contract: clean start
//! off and a session expiry interval (`session_expiry`, 7 days by default)
//! so the session outlives a restart or an outage of the connector up to
//! then, manual PUBACKs in `commit`, and a Receive Maximum of twice
//! `batch_size` bounding what the broker sends ahead. Its user properties
//! become headers of the same name (key and value of 1 to 255 bytes; the
//! source's own `mqtt_*` headers win; a repeated name keeps its last value),
//! its content type the header `mqtt_content_type`.
//!
//! `qos = 0` subscribes at most once instead: a clean session, no
//! acknowledgements; what arrives while Iggy refuses or the process is down
//! is lost.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use rumqttc::QoS;
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tracing::{debug, warn};

use crate::connectors::mqtt::{
    Client, Driven, Event, EventLoop, Incoming, MqttConnection, Protocol, Session,
    connection_fields, qos_of,
};
use crate::connectors::{
    BatchPolicy, ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch,
    SourceEntry, decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Headers, Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "mqtt",
    feature: "mqtt-source",
    description: "subscribes to MQTT 3.1.1 or 5 topics with QoS 1 in a persistent session, PUBACK on commit",
    secret_fields: &["password"],
    sample_config: "url = \"mqtt://127.0.0.1:1883\"\nprotocol_version = \"5\"\nsession_expiry = \"7days\"\ntopics = [\"sensors/#\"]\nclient_id = \"iggy-connect-sensors\"\nqos = 1\nbatch_size = 500\nusername = \"iggy\"\npassword = \"secret\"\n",
    config_schema: schema_of::<MqttSourceConfig>,
    build: |config| Ok(Box::new(MqttSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

connection_fields! {
    /// What to subscribe to.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct MqttSourceConfig {
        /// The topic filters to subscribe to (`+` and `#` wildcards allowed).
        /// Subscribed on every start; a filter removed from the list stays
        /// in the broker's session until the session is dropped.
        #[serde(default)]
        pub topics: Vec<String>,
        /// 1: at least once (a persistent session, PUBACK on commit); 0: at
        /// most once (a clean session, nothing kept while Iggy refuses or the
        /// process is down).
        #[serde(default = "default_qos")]
        pub qos: u8,
        /// Most messages per batch.
        #[serde(default = "default_batch_size")]
        pub batch_size: usize,
        /// How long a poll that has messages waits for more before it hands
        /// over a batch smaller than `batch_size`.
        #[serde(default = "default_linger", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub linger: Duration,
        /// MQTT 5 only: how long the broker keeps the session (and what it
        /// holds for it) after the source disconnected, default 7 days. What
        /// arrives after that while the source is down is lost. (An MQTT
        /// 3.1.1 persistent session has no expiry of its own.)
        #[serde(default = "default_session_expiry", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub session_expiry: Duration,
    }
}

fn default_session_expiry() -> Duration {
    Duration::from_secs(7 * 24 * 3600)
}

fn default_qos() -> u8 {
    1
}

fn default_batch_size() -> usize {
    500
}

fn default_linger() -> Duration {
    Duration::from_millis(5)
}

/// What the source saves (informational: the broker's session is the
/// position). A state that cannot be decoded still stops the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MqttSourceState {
    /// Messages committed (acknowledged) so far.
    pub committed: u64,
}

/// Requests waiting for the event loop, at most (PUBACKs of one batch).
const REQUESTS: usize = 1024;

/// What the event loop task and the source share.
#[derive(Default)]
struct Shared {
    inbox: Mutex<Inbox>,
    arrived: Notify,
}

#[derive(Default)]
struct Inbox {
    received: VecDeque<Received>,
    /// Counts the connections accepted: a packet id is valid only on its own.
    connection: u64,
    /// Why the source cannot go on (a subscription refused).
    fatal: Option<String>,
    /// The connection is gone: once what it delivered is taken, `poll`
    /// says so and the engine opens a fresh source (rule O2).
    lost: Option<String>,
}

struct Received {
    connection: u64,
    message: Incoming,
}

struct Staged {
    connection: u64,
    /// The QoS 1 messages of the batch, in the order they came.
    publishes: Vec<Incoming>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inbox> {
        self.inbox
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn receive(&self, message: Incoming) {
        let mut inbox = self.lock();
        let connection = inbox.connection;
        inbox.received.push_back(Received {
            connection,
            message,
        });
        drop(inbox);
        self.arrived.notify_one();
    }

    fn connected(&self) {
        self.lock().connection += 1;
    }

    fn fail(&self, reason: String) {
        self.lock().fatal.get_or_insert(reason);
        self.arrived.notify_one();
    }

    fn lose(&self, reason: String) {
        self.lock().lost.get_or_insert(reason);
        self.arrived.notify_one();
    }
}

pub struct MqttSource {
    config: MqttSourceConfig,
    qos: QoS,
    key: String,
    shared: Arc<Shared>,
    driven: Option<Driven>,
    staged: Mutex<Option<Staged>>,
    committed: Mutex<MqttSourceState>,
}

impl MqttSource {
    pub fn new(config: MqttSourceConfig) -> Result<Self, PluginConfigError> {
        config.connection().check()?;
        let protocol = config.connection().protocol()?;
        let qos = qos_of("qos", config.qos)?;
        if protocol == Protocol::V5
            && qos != QoS::AtMostOnce
            && (config.session_expiry < Duration::from_secs(1)
                || u32::try_from(config.session_expiry.as_secs()).is_err())
        {
            return Err(PluginConfigError::new(
                "session_expiry",
                "expected at least 1s (a session that ends with the connection keeps nothing \
                 for a restart) and at most 4294967295s",
            ));
        }
        if config.topics.is_empty() {
            return Err(PluginConfigError::new(
                "topics",
                "expected at least one topic filter, such as [\"sensors/#\"]",
            ));
        }
        if let Some(bad) = config
            .topics
            .iter()
            .find(|filter| !rumqttc::valid_filter(filter))
        {
            return Err(PluginConfigError::new(
                "topics",
                format!("{bad:?} is not a valid MQTT topic filter"),
            ));
        }
        if config.batch_size == 0 {
            return Err(PluginConfigError::new("batch_size", "expected at least 1"));
        }
        Ok(Self {
            config,
            qos,
            key: String::new(),
            shared: Arc::new(Shared::default()),
            driven: None,
            staged: Mutex::new(None),
            committed: Mutex::new(MqttSourceState::default()),
        })
    }

    fn client_id(&self) -> String {
        match &self.config.client_id {
            Some(id) => id.clone(),
            None if self.key.is_empty() => "iggy-connect-source".into(),
            None => format!("iggy-connect-source-{}", self.key),
        }
    }

    /// Subscribes and waits for the broker's answer; what arrives meanwhile
    /// (a resumed session's messages) is queued.
    async fn subscribe(
        &self,
        client: &Client,
        eventloop: &mut EventLoop,
        connection: &MqttConnection,
    ) -> Result<(), ConnectorError> {
        client
            .subscribe(&self.config.topics, self.qos, true)
            .await
            .map_err(|error| ConnectorError::transient(format!("mqtt subscribe: {error}")))?;
        let bound = connection.connect_timeout + Duration::from_secs(1);
        loop {
            let event = tokio::time::timeout(bound, eventloop.poll())
                .await
                .map_err(|_| ConnectorError::transient("mqtt subscribe: no SUBACK in time"))?
                .map_err(|error| connection.classify(&error))?;
            match event {
                Event::Publish(message) => self.shared.receive(message),
                Event::SubAck(refusals) => {
                    return match refused(&self.config.topics, &refusals) {
                        Some(reason) => Err(ConnectorError::fatal(reason)),
                        None => Ok(()),
                    };
                }
                _ => {}
            }
        }
    }

    fn lock_staged(&self) -> MutexGuard<'_, Option<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_committed(&self) -> MutexGuard<'_, MqttSourceState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn batch(&self, received: Vec<Received>) -> Result<SourceBatch, ConnectorError> {
        let connection = self.shared.lock().connection;
        let mut records = Vec::with_capacity(received.len());
        let mut publishes = Vec::new();
        for Received {
            connection: came_on,
            message,
        } in received
        {
            records.push(record(&message));
            // One from an earlier connection is not acknowledged: its packet
            // id may name another message now, and the broker sends it again.
            if message.needs_ack() && came_on == connection {
                publishes.push(message);
            }
        }
        if self.qos == QoS::AtMostOnce {
            return Ok(SourceBatch {
                records,
                state: None,
                finished: false,
                next_poll: None,
            });
        }
        let state = MqttSourceState {
            committed: self.lock_committed().committed + records.len() as u64,
        };
        let mut staged = self.lock_staged();
        match staged.as_mut() {
            Some(staged) if staged.connection == connection => staged.publishes.extend(publishes),
            _ => {
                *staged = Some(Staged {
                    connection,
                    publishes,
                })
            }
        }
        Ok(SourceBatch {
            records,
            state: Some(encode_state(&state)?),
            finished: false,
            next_poll: None,
        })
    }
}

/// Why a SUBACK refused some filter, if it did (`refusals`: per filter).
fn refused(topics: &[String], refusals: &[bool]) -> Option<String> {
    let refused: Vec<&String> = topics
        .iter()
        .zip(refusals)
        .filter(|(_, refused)| **refused)
        .map(|(topic, _)| topic)
        .collect();
    (!refused.is_empty()).then(|| {
        format!(
            "plugin_config.topics: the broker refused the subscription to {refused:?} (not \
             allowed for this user, or not a filter it accepts)"
        )
    })
}

/// The headers the source sets itself.
const OWN_HEADERS: [&str; 4] = ["mqtt_topic", "mqtt_retain", "mqtt_dup", "mqtt_content_type"];

/// The message as a record: its payload, its topic as header `mqtt_topic`,
/// `mqtt_retain` / `mqtt_dup` when those flags are set, and (MQTT 5) its
/// user properties and content type.
fn record(message: &Incoming) -> SourceRecord {
    let fits = |text: &str| (1..=255).contains(&text.len());
    let mut headers: Headers = message
        .user_properties()
        .iter()
        .filter(|(name, value)| fits(name) && fits(value) && !OWN_HEADERS.contains(&name.as_str()))
        .map(|(name, value)| (name.into(), HeaderValue::String(value.into())))
        .collect();
    headers.push((
        "mqtt_topic".into(),
        HeaderValue::String(message.topic().into()),
    ));
    if message.retain() {
        headers.push(("mqtt_retain".into(), HeaderValue::Bool(true)));
    }
    if message.dup() {
        headers.push(("mqtt_dup".into(), HeaderValue::Bool(true)));
    }
    if let Some(content_type) = message.content_type().filter(|text| fits(text)) {
        headers.push(("mqtt_content_type".into(), content_type.into()));
    }
    SourceRecord {
        id: None,
        stream_index: 0,
        headers,
        payload: Payload::Raw(message.payload()),
        partition: None,
        origin_timestamp: None,
    }
}

/// Drives the connection until the client disconnects or is dropped, or
/// the connection is lost: queues what arrives. A lost connection is not
/// reconnected here: the engine opens a fresh source, whose session the
/// broker kept (what was not acknowledged comes again).
async fn drive(
    mut eventloop: EventLoop,
    connection: MqttConnection,
    topics: Vec<String>,
    shared: Arc<Shared>,
) {
    loop {
        match eventloop.poll().await {
            Ok(Event::Publish(message)) => shared.receive(message),
            Ok(Event::SubAck(refusals)) => {
                if let Some(reason) = refused(&topics, &refusals) {
                    shared.fail(reason);
                }
            }
            Ok(Event::Disconnected) => return,
            Ok(_) => {}
            Err(error) if error.is_requests_done() => return,
            Err(error) => {
                // Messages read just before the loss are still queued in the
                // client: they came on the connection that is gone.
                for message in eventloop.take_received() {
                    shared.receive(message);
                }
                let classified = connection.classify(&error);
                if classified.is_transient() {
                    warn!(%error, "mqtt source: connection lost");
                    shared.lose(classified.to_string());
                } else {
                    shared.fail(classified.to_string());
                }
                return;
            }
        }
    }
}

#[async_trait]
impl Source for MqttSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    fn batch_policy(&self) -> BatchPolicy {
        match self.qos {
            // The session keeps what is not acknowledged: giving up loses nothing.
            QoS::AtLeastOnce | QoS::ExactlyOnce => BatchPolicy::default(),
            // A clean session keeps nothing: retry for as long as it takes.
            QoS::AtMostOnce => BatchPolicy::never_stop(),
        }
    }

    /// A PUBACK deletes the broker's copy.
    fn destructive(&self) -> bool {
        self.qos != QoS::AtMostOnce
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(state) = state
            && self.qos != QoS::AtMostOnce
        {
            *self.lock_committed() = decode_state(state)?;
        }
        let mut connection = self.config.connection();
        let persistent = self.qos != QoS::AtMostOnce;
        let session = Session {
            clean: !persistent,
            manual_acks: persistent,
            expiry: persistent
                .then(|| u32::try_from(self.config.session_expiry.as_secs()).unwrap_or(u32::MAX)),
            receive_maximum: Some(
                u16::try_from(self.config.batch_size.saturating_mul(2)).unwrap_or(u16::MAX),
            ),
            inflight: None,
        };
        let (client, mut eventloop) = connection.client(&self.client_id(), session, REQUESTS)?;
        connection.connect(&mut eventloop).await?;
        self.shared.connected();
        // Every start subscribes, so a changed `topics` takes effect (the
        // broker then sends the retained messages of those topics again).
        self.subscribe(&client, &mut eventloop, &connection).await?;
        let driving = drive(
            eventloop,
            connection,
            self.config.topics.clone(),
            self.shared.clone(),
        );
        self.driven = Some(Driven::spawn(client, driving));
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        // Cancel-safe: messages leave the queue only right before the return.
        let mut first_seen: Option<Instant> = None;
        loop {
            let arrived = self.shared.arrived.notified();
            {
                let mut inbox = self.shared.lock();
                if let Some(reason) = &inbox.fatal {
                    return Err(ConnectorError::fatal(reason.clone()));
                }
                let ready = inbox.received.len();
                if ready == 0
                    && let Some(reason) = &inbox.lost
                {
                    return Err(ConnectorError::disconnected(reason.clone()));
                }
                let lingered = first_seen.is_some_and(|seen| seen.elapsed() >= self.config.linger)
                    || self.config.linger.is_zero();
                let lingered = lingered || inbox.lost.is_some();
                if ready >= self.config.batch_size || (ready > 0 && lingered) {
                    let taken: Vec<Received> = inbox
                        .received
                        .drain(..ready.min(self.config.batch_size))
                        .collect();
                    drop(inbox);
                    return self.batch(taken);
                }
                if ready > 0 {
                    first_seen.get_or_insert_with(Instant::now);
                }
            }
            match first_seen {
                Some(seen) => {
                    let until = tokio::time::Instant::from_std(seen + self.config.linger);
                    let _ = tokio::time::timeout_at(until, arrived).await;
                }
                None => arrived.await,
            }
        }
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(staged) = self.lock_staged().take() else {
            return Ok(());
        };
        let (current, lost) = {
            let inbox = self.shared.lock();
            (inbox.connection, inbox.lost.is_some())
        };
        let count = staged.publishes.len() as u64;
        if staged.connection != current || lost {
            debug!("mqtt source: a batch from a lost connection is not acknowledged");
        } else if let Some(driven) = &self.driven {
            // Never acknowledged twice: after a failure here the broker sends
            // the rest again on the next connection.
            for publish in &staged.publishes {
                driven
                    .client
                    .ack(publish)
                    .await
                    .map_err(|error| ConnectorError::transient(format!("mqtt PUBACK: {error}")))?;
            }
        }
        self.lock_committed().committed += count;
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        // An uncommitted batch is not acknowledged: the broker keeps it in
        // the session and sends it again on the next connection.
        self.lock_staged().take();
        if let Some(driven) = self.driven.take() {
            driven.close(self.config.connect_timeout).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<MqttSource, PluginConfigError> {
        MqttSource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_a_bad_field_when_built_should_name_it() {
        assert_eq!(build(json!({})).err().unwrap().field, "topics");
        assert_eq!(
            build(json!({"topics": ["a/#/b"]})).err().unwrap().field,
            "topics"
        );
        assert_eq!(
            build(json!({"topics": ["a"], "qos": 2}))
                .err()
                .unwrap()
                .field,
            "qos"
        );
        assert_eq!(
            build(json!({"topics": ["a"], "batch_size": 0}))
                .err()
                .unwrap()
                .field,
            "batch_size"
        );
        assert_eq!(
            build(json!({"topics": ["a"], "url": "http://x/mqtt"}))
                .err()
                .unwrap()
                .field,
            "url"
        );
        assert!(build(json!({"topics": ["a"], "url": "wss://x/mqtt"})).is_ok());
        assert!(build(json!({"topics": ["a/+", "b/#"]})).is_ok());
        assert_eq!(
            build(json!({"topics": ["a"], "protocol_version": "4"}))
                .err()
                .unwrap()
                .field,
            "protocol_version"
        );
        assert_eq!(
            build(json!({"topics": ["a"], "protocol_version": "5", "session_expiry": "0s"}))
                .err()
                .unwrap()
                .field,
            "session_expiry"
        );
        assert!(build(json!({"topics": ["a"], "protocol_version": "5"})).is_ok());
    }

    #[test]
    fn given_no_client_id_when_attached_should_derive_it_from_the_key() {
        let mut source = build(json!({"topics": ["a"]})).unwrap();
        assert_eq!(source.client_id(), "iggy-connect-source");
        source.attach(ConnectorContext {
            key: "sensors".into(),
            ..ConnectorContext::default()
        });
        assert_eq!(source.client_id(), "iggy-connect-source-sensors");
    }

    #[test]
    fn given_a_suback_when_a_filter_is_refused_should_name_it() {
        let topics = vec!["a".to_owned(), "b".to_owned()];
        assert!(refused(&topics, &[false, false]).is_none());
        let reason = refused(&topics, &[false, true]).unwrap();
        assert!(
            reason.contains("plugin_config.topics") && reason.contains("\"b\""),
            "{reason}"
        );
    }
}
