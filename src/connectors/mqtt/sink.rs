//! `mqtt` sink: publishes each message to an MQTT 3.1.1 or 5 broker with
//! QoS 1 and reports a batch written only when the broker acknowledged every
//! message of it (the PUBACK).
//!
//! The topic is fixed, may name the Iggy stream and topic (`{stream}`,
//! `{topic}`), or comes from a field of a JSON payload. A message whose topic
//! is not a valid MQTT topic, or that does not fit `max_packet_size`, is
//! rejected (before anything of the batch is sent) and goes through
//! `on_error`. PUBACKs missing after `ack_timeout`, or a connection lost
//! meanwhile, fail the batch as transient and the engine publishes it again.
//!
//! Not idempotent: MQTT has no message id a broker deduplicates by, so a batch
//! published again (after a transient failure, a crash before the offsets
//! were committed) reaches subscribers again. `qos = 0` publishes at most
//! once: a batch counts as written once it is on the wire. How durable a
//! PUBACK is depends on the broker (mosquitto writes its store to disk only
//! every `autosave_interval`).
//!
//! MQTT 5 (`protocol_version = "5"`): the same, plus a PUBACK's reason code
//! decides. 0x00 success and 0x10 no matching subscribers count as written;
//! 0x87 not authorized (an ACL denying the topic), 0x90 topic name invalid and
//! 0x99 payload format invalid reject that message by index (through
//! `on_error`; the rest of the batch, already published, is published again
//! with the engine's retry); 0x80 unspecified, 0x83 implementation specific,
//! 0x91 packet id in use and 0x97 quota exceeded fail the batch as transient
//! (retried with backoff). No PUBACK code is fatal; a refused login is, as on
//! 3.1.1. Each Iggy header becomes a user property (its value as text),
//! counted in `max_packet_size`.
//!
//! rumqttc numbers the packets itself: a background task drives the
//! connection and pairs each publish, in the order sent, with the packet id
//! it got and then with its PUBACK. After a lost connection nothing is sent
//! again by the client (a clean session); the engine's retry does that.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::join_all;
use rumqttc::QoS;
use serde::Deserialize;
use tokio::sync::oneshot;
use tracing::warn;

use crate::connectors::mqtt::{
    Client, Driven, Event, EventLoop, Message, MqttConnection, Protocol, PubAckRefusal, Session,
    check_topic, connection_fields, qos_of,
};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "mqtt",
    feature: "mqtt-sink",
    description: "publishes to an MQTT 3.1.1 or 5 broker with QoS 1, durable at the PUBACK (not idempotent)",
    secret_fields: &["password"],
    sample_config: "url = \"mqtt://127.0.0.1:1883\"\nprotocol_version = \"5\"\ntopic = \"iggy/{stream}/{topic}\"\nqos = 1\nretain = false\nusername = \"iggy\"\npassword = \"secret\"\n",
    config_schema: schema_of::<MqttSinkConfig>,
    build: |config| Ok(Box::new(MqttSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

connection_fields! {
    /// Where to publish.
    #[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    pub struct MqttSinkConfig {
        /// The topic to publish to; `{stream}` and `{topic}` are replaced by
        /// the Iggy stream and topic the message came from. Required unless
        /// every message names its topic in `topic_field`.
        #[serde(default)]
        pub topic: Option<String>,
        /// A top-level field of a JSON payload holding the topic; it wins
        /// over `topic`. A message without it (and no `topic`) is rejected and
        /// goes through `on_error`.
        #[serde(default)]
        pub topic_field: Option<String>,
        /// 1: at least once (a batch is written when every PUBACK came); 0: at
        /// most once (written once sent, nothing confirmed).
        #[serde(default = "default_qos")]
        pub qos: u8,
        /// Publish with the retain flag: the broker keeps the last message of
        /// each topic for subscribers that come later.
        #[serde(default)]
        pub retain: bool,
        /// How long to wait for a batch's PUBACKs before it counts as failed
        /// (and is published again).
        #[serde(default = "default_ack_timeout", with = "crate::config::duration")]
        #[schemars(with = "crate::config::duration::Text")]
        pub ack_timeout: Duration,
    }
}

fn default_qos() -> u8 {
    1
}

fn default_ack_timeout() -> Duration {
    Duration::from_secs(5)
}

/// Publishes sent before their PUBACKs are awaited (and the client's window
/// of unacknowledged ones); the request queue holds twice as many.
const CHUNK: usize = 512;

/// Settles one publish: `Err` says why it is not known to be written (a
/// lost connection is retryable).
type Ticket = oneshot::Sender<Outcome>;
type Outcome = Result<(), PubAckRefusal>;

fn retryable(reason: &str) -> PubAckRefusal {
    PubAckRefusal {
        retryable: true,
        reason: reason.to_owned(),
    }
}

/// What the event loop task and `write` share.
#[derive(Default)]
struct Shared {
    tracker: Mutex<Tracker>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Tracker> {
        self.tracker
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[derive(Default)]
struct Tracker {
    /// The connection is gone, and why: writes say so, and the engine opens
    /// a fresh sink (rule O2).
    gone: Option<String>,
    /// Why the sink cannot go on (the broker refused it for good).
    fatal: Option<String>,
    /// Handed to the client, waiting for their packet ids, in order.
    queued: VecDeque<Ticket>,
    /// Sent, waiting for their PUBACK.
    unacked: HashMap<u16, Ticket>,
}

impl Tracker {
    /// The next publish the client sent got `pkid` (0: QoS 0, done once sent).
    fn sent(&mut self, pkid: u16) {
        let Some(ticket) = self.queued.pop_front() else {
            return;
        };
        if pkid == 0 {
            let _ = ticket.send(Ok(()));
        } else if let Some(stale) = self.unacked.insert(pkid, ticket) {
            let _ = stale.send(Err(retryable(&format!(
                "packet id {pkid} reused before its PUBACK"
            ))));
        }
    }

    fn acked(&mut self, pkid: u16, outcome: Outcome) {
        if let Some(ticket) = self.unacked.remove(&pkid) {
            let _ = ticket.send(outcome);
        }
    }

    /// The connection is gone: nothing waiting is known to be written.
    fn lost(&mut self, reason: &str) {
        self.gone.get_or_insert_with(|| reason.to_owned());
        for ticket in self
            .queued
            .drain(..)
            .chain(self.unacked.drain().map(|(_, ticket)| ticket))
        {
            let _ = ticket.send(Err(retryable(reason)));
        }
    }
}

pub struct MqttSink {
    config: MqttSinkConfig,
    qos: QoS,
    protocol: Protocol,
    client_id: String,
    shared: Arc<Shared>,
    driven: Option<Driven>,
    /// One write at a time: publishes are paired with their packet ids in order.
    writing: tokio::sync::Mutex<()>,
}

impl MqttSink {
    pub fn new(config: MqttSinkConfig) -> Result<Self, PluginConfigError> {
        config.connection().check()?;
        let protocol = config.connection().protocol()?;
        let qos = qos_of("qos", config.qos)?;
        match (&config.topic, &config.topic_field) {
            (None, None) => {
                return Err(PluginConfigError::new(
                    "topic",
                    "expected a topic to publish to (or topic_field naming a payload field)",
                ));
            }
            (Some(topic), _) => {
                let filled = TopicRef {
                    stream: "s".into(),
                    topic: "t".into(),
                }
                .fill(topic);
                check_topic(&filled).map_err(|reason| PluginConfigError::new("topic", reason))?;
            }
            (None, Some(field)) if field.is_empty() => {
                return Err(PluginConfigError::new(
                    "topic_field",
                    "expected a field name",
                ));
            }
            _ => {}
        }
        Ok(Self {
            config,
            qos,
            protocol,
            client_id: "iggy-connect-sink".into(),
            shared: Arc::new(Shared::default()),
            driven: None,
            writing: tokio::sync::Mutex::new(()),
        })
    }

    fn topic(&self, topic: &TopicRef, message: &SinkMessage) -> Result<String, String> {
        let chosen = match &self.config.topic_field {
            Some(field) => match (message.payload.text_field(field), &self.config.topic) {
                (Some(chosen), _) => chosen,
                (None, Some(template)) => topic.fill(template),
                (None, None) => {
                    return Err(format!(
                        "the payload has no string field {field:?} to take the topic from"
                    ));
                }
            },
            None => topic.fill(self.config.topic.as_deref().unwrap_or_default()),
        };
        check_topic(&chosen)?;
        Ok(chosen)
    }

    /// Each message as the publish it becomes, or every message the broker
    /// could never take.
    fn prepare(
        &self,
        topic: &TopicRef,
        messages: &[SinkMessage],
    ) -> Result<Vec<Message>, Vec<Rejection>> {
        let mut publishes = Vec::with_capacity(messages.len());
        let mut rejected = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let chosen = match self.topic(topic, message) {
                Ok(chosen) => chosen,
                Err(reason) => {
                    rejected.push(Rejection { index, reason });
                    continue;
                }
            };
            let user_properties = match self.protocol {
                Protocol::V5 => message
                    .headers
                    .iter()
                    .map(|(key, value)| (key.to_string(), value.to_string()))
                    .collect(),
                Protocol::V311 => Vec::new(),
            };
            let publish = Message {
                topic: chosen,
                payload: message.payload.to_bytes(),
                qos: self.qos,
                retain: self.config.retain,
                user_properties,
            };
            let size = publish.size(self.protocol);
            if size > self.config.max_packet_size {
                rejected.push(Rejection {
                    index,
                    reason: format!(
                        "the MQTT packet would be {size} bytes, over max_packet_size {}",
                        self.config.max_packet_size
                    ),
                });
                continue;
            }
            publishes.push(publish);
        }
        if rejected.is_empty() {
            Ok(publishes)
        } else {
            Err(rejected)
        }
    }

    /// Hands `chunk` to the client, a ticket for each in `settled`; fails
    /// once the connection is gone.
    fn hand_over(
        &self,
        client: &Client,
        chunk: Vec<Message>,
        settled: &mut Vec<oneshot::Receiver<Outcome>>,
    ) -> Result<(), SinkError> {
        let mut tracker = self.shared.lock();
        if let Some(reason) = &tracker.fatal {
            return Err(SinkError::fatal(reason.clone()));
        }
        if let Some(reason) = &tracker.gone {
            return Err(SinkError::disconnected(reason.clone()));
        }
        // Under the lock, so the event loop task pairs packet ids with these
        // tickets in this order.
        for publish in chunk {
            let (ticket, outcome) = oneshot::channel();
            tracker.queued.push_back(ticket);
            // The queue has room for a chunk, so this never waits.
            if !client.try_publish(publish) {
                tracker.queued.pop_back();
                return Err(SinkError::transient(
                    "mqtt publish: the client's queue is closed or full",
                ));
            }
            settled.push(outcome);
        }
        Ok(())
    }

    /// Hands `chunk` (the messages from index `first` on) to the client and
    /// waits until each is written; adds those the broker refused for good
    /// to `rejected`.
    async fn publish(
        &self,
        client: &Client,
        chunk: Vec<Message>,
        first: usize,
        rejected: &mut Vec<Rejection>,
    ) -> Result<(), SinkError> {
        let mut settled = Vec::with_capacity(chunk.len());
        let deadline = tokio::time::Instant::now() + self.config.ack_timeout;
        self.hand_over(client, chunk, &mut settled)?;
        let outcomes = tokio::time::timeout_at(deadline, join_all(settled))
            .await
            .map_err(|_| {
                SinkError::transient(format!(
                    "mqtt publish: no PUBACK within ack_timeout ({:?})",
                    self.config.ack_timeout
                ))
            })?;
        for (index, outcome) in (first..).zip(outcomes) {
            match outcome {
                Ok(Ok(())) => {}
                Ok(Err(refusal)) if refusal.retryable => {
                    return Err(self.unsettled(&refusal.reason));
                }
                Ok(Err(refusal)) => rejected.push(Rejection {
                    index,
                    reason: refusal.reason,
                }),
                Err(_) => return Err(self.unsettled("the connection closed")),
            }
        }
        Ok(())
    }

    /// A publish that did not settle: the connection is gone (the engine
    /// opens a fresh sink) or, on a live one, a retryable refusal.
    fn unsettled(&self, reason: &str) -> SinkError {
        match &self.shared.lock().gone {
            Some(gone) => SinkError::disconnected(gone.clone()),
            None => SinkError::transient(format!("mqtt publish: {reason}")),
        }
    }
}

/// Drives the connection until the client disconnects or is dropped, or the
/// connection is lost, pairing publishes with packet ids and PUBACKs. A lost
/// connection fails every publish waiting on it and ends the drive: writes
/// then report it, and the engine opens a fresh sink (rule O2).
async fn drive(mut eventloop: EventLoop, connection: MqttConnection, shared: Arc<Shared>) {
    loop {
        match eventloop.poll().await {
            Ok(Event::Sent(pkid)) => shared.lock().sent(pkid),
            Ok(Event::PubAck { pkid, outcome }) => shared.lock().acked(pkid, outcome),
            Ok(Event::Disconnected) => {
                shared.lock().lost("the sink is closing");
                return;
            }
            Err(error) if error.is_requests_done() => {
                shared.lock().lost("the sink is closing");
                return;
            }
            Ok(_) => {}
            Err(error) => {
                let classified = connection.classify(&error);
                let mut tracker = shared.lock();
                tracker.lost(&classified.to_string());
                if !classified.is_transient() {
                    tracker.fatal.get_or_insert(classified.to_string());
                }
                warn!(%error, "mqtt sink: connection lost");
                return;
            }
        }
    }
}

#[async_trait]
impl Sink for MqttSink {
    fn attach(&mut self, context: ConnectorContext) {
        if !context.key.is_empty() {
            self.client_id = format!("iggy-connect-sink-{}", context.key);
        }
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let mut connection = self.config.connection();
        let client_id = self
            .config
            .client_id
            .clone()
            .unwrap_or_else(|| self.client_id.clone());
        let session = Session {
            clean: true,
            inflight: Some(CHUNK as u16),
            ..Session::default()
        };
        let (client, mut eventloop) = connection.client(&client_id, session, 2 * CHUNK)?;
        connection.connect(&mut eventloop).await?;
        let driving = drive(eventloop, connection, self.shared.clone());
        self.driven = Some(Driven::spawn(client, driving));
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = &self
            .driven
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the mqtt sink was written before open"))?
            .client;
        // Refused messages are named before anything is sent, so the
        // engine's retry of the rest publishes nothing twice.
        let mut publishes = self.prepare(topic, messages).map_err(SinkError::Rejected)?;
        let _writing = self.writing.lock().await;
        let (mut first, mut rejected) = (0, Vec::new());
        while !publishes.is_empty() {
            let rest = publishes.split_off(publishes.len().min(CHUNK));
            let count = publishes.len();
            self.publish(client, publishes, first, &mut rejected)
                .await?;
            first += count;
            publishes = rest;
        }
        if rejected.is_empty() {
            Ok(())
        } else {
            Err(SinkError::Rejected(rejected))
        }
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(driven) = self.driven.take() {
            driven.close(self.config.connect_timeout).await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<MqttSink, PluginConfigError> {
        MqttSink::new(parse_plugin_config(&config)?)
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

    fn topic() -> TopicRef {
        TopicRef {
            stream: "shop".into(),
            topic: "orders".into(),
        }
    }

    #[test]
    fn given_a_bad_field_when_built_should_name_it() {
        assert_eq!(build(json!({})).err().unwrap().field, "topic");
        assert_eq!(build(json!({"topic": "a/#"})).err().unwrap().field, "topic");
        assert_eq!(
            build(json!({"topic": "a", "qos": 2})).err().unwrap().field,
            "qos"
        );
        assert_eq!(
            build(json!({"topic_field": ""})).err().unwrap().field,
            "topic_field"
        );
        assert_eq!(
            build(json!({"topic": "a", "url": "mqtt://x:y"}))
                .err()
                .unwrap()
                .field,
            "url"
        );
    }

    #[test]
    fn given_a_template_or_field_when_routed_should_pick_the_topic() {
        let sink = build(json!({"topic": "iggy/{stream}/{topic}", "topic_field": "to"})).unwrap();
        assert_eq!(
            sink.topic(&topic(), &message(Payload::Json(json!({"to": "x/y"})))),
            Ok("x/y".into())
        );
        assert_eq!(
            sink.topic(&topic(), &message(Payload::Raw("z".into()))),
            Ok("iggy/shop/orders".into())
        );
        assert!(
            sink.topic(&topic(), &message(Payload::Json(json!({"to": "x/#"}))))
                .is_err()
        );
        let only_field = build(json!({"topic_field": "to"})).unwrap();
        assert!(
            only_field
                .topic(
                    &topic(),
                    &message(Payload::JsonBytes("{\"other\":1}".into()))
                )
                .is_err()
        );
    }

    #[test]
    fn given_a_batch_with_refused_messages_when_prepared_should_name_each_and_send_none() {
        let sink =
            build(json!({"topic": "t", "topic_field": "to", "max_packet_size": 100})).unwrap();
        let batch = vec![
            message(Payload::Raw("ok".into())),
            message(Payload::Raw(vec![b'x'; 200].into())),
            message(Payload::Json(json!({"to": "a/+"}))),
        ];
        let rejected = sink.prepare(&topic(), &batch).unwrap_err();
        let indexes: Vec<usize> = rejected.iter().map(|rejection| rejection.index).collect();
        assert_eq!(indexes, vec![1, 2]);
        assert!(
            rejected[0].reason.contains("max_packet_size"),
            "{}",
            rejected[0].reason
        );
        assert_eq!(sink.prepare(&topic(), &batch[..1]).unwrap().len(), 1);
    }

    #[test]
    fn given_packet_ids_when_tracked_should_settle_in_order_and_fail_all_on_loss() {
        let mut tracker = Tracker::default();
        let mut outcomes = Vec::new();
        for _ in 0..3 {
            let (ticket, outcome) = oneshot::channel();
            tracker.queued.push_back(ticket);
            outcomes.push(outcome);
        }
        tracker.sent(5);
        tracker.sent(0);
        tracker.acked(5, Ok(()));
        tracker.sent(6);
        tracker.lost("gone");
        assert_eq!(outcomes[0].try_recv().unwrap(), Ok(()));
        assert_eq!(outcomes[1].try_recv().unwrap(), Ok(()));
        assert_eq!(outcomes[2].try_recv().unwrap(), Err(retryable("gone")));
        assert_eq!(tracker.gone.as_deref(), Some("gone"));
    }
}
