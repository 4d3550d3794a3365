//! What the mqtt source and sink share: the one place that knows the two
//! protocol versions apart. Where the broker is, how to log in and the first
//! connect are in [`connection`]. A lost connection is never reconnected
//! here: the connectors report it and the engine opens fresh ones.
//!
//! MQTT 3.1.1 (`rumqttc`'s v4 API) or MQTT 5 (its `v5` API), chosen by
//! `protocol_version`. Both connectors talk to [`Client`] and [`EventLoop`],
//! enums over the two clients, and see one [`Event`] type: the delivery
//! contract, the acking bookkeeping and the payload / topic mapping are
//! written once.

pub mod connection;
#[cfg(feature = "mqtt-sink")]
pub mod sink;
#[cfg(feature = "mqtt-source")]
pub mod source;

pub(crate) use connection::connection_fields;
pub use connection::{
    Endpoint, MqttConnection, Scheme, Session, default_connect_timeout, default_keep_alive,
    default_max_packet_size, default_protocol_version, default_true, default_url,
};

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use rumqttc::v5::mqttbytes::v5 as packet5;
use rumqttc::{Outgoing, Packet, QoS, SubscribeFilter, v5};
use tokio::task::JoinHandle;

use crate::connectors::PluginConfigError;

/// The MQTT protocol version a connector speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Protocol {
    #[default]
    V311,
    V5,
}

impl Protocol {
    /// `protocol_version` as written in a config.
    pub fn parse(text: &str) -> Result<Self, PluginConfigError> {
        match text.trim() {
            "3.1.1" => Ok(Self::V311),
            "5" | "5.0" => Ok(Self::V5),
            other => Err(PluginConfigError::new(
                "protocol_version",
                format!("expected \"3.1.1\" or \"5\", found {other:?}"),
            )),
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::V311 => "MQTT 3.1.1",
            Self::V5 => "MQTT 5",
        })
    }
}

/// QoS as written in a config: 0 (at most once) or 1 (at least once).
pub fn qos_of(field: &str, qos: u8) -> Result<QoS, PluginConfigError> {
    match qos {
        0 => Ok(QoS::AtMostOnce),
        1 => Ok(QoS::AtLeastOnce),
        other => Err(PluginConfigError::new(
            field,
            format!("expected 0 (at most once) or 1 (at least once), found {other}"),
        )),
    }
}

/// The client of either version.
#[derive(Clone)]
pub enum Client {
    V4(rumqttc::AsyncClient),
    V5(v5::AsyncClient),
}

/// The event loop of either version.
pub enum EventLoop {
    V4(Box<rumqttc::EventLoop>),
    V5(Box<v5::EventLoop>),
}

/// Why the connection failed.
#[derive(Debug)]
pub enum ConnectionError {
    V4(rumqttc::ConnectionError),
    V5(v5::ConnectionError),
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::V4(error) => error.fmt(f),
            Self::V5(error) => error.fmt(f),
        }
    }
}

impl ConnectionError {
    /// Every client handle is gone: the loop has nothing left to do.
    pub fn is_requests_done(&self) -> bool {
        matches!(
            self,
            Self::V4(rumqttc::ConnectionError::RequestsDone)
                | Self::V5(v5::ConnectionError::RequestsDone)
        )
    }
}

/// What the event loop reports, the same for both versions.
#[derive(Debug)]
pub enum Event {
    /// The broker accepted the connection.
    ConnAck {
        session_present: bool,
    },
    /// A message came.
    Publish(Incoming),
    /// The answer to a subscribe: for each filter, whether it was refused.
    SubAck(Vec<bool>),
    /// The client sent a publish with this packet id (0: QoS 0).
    Sent(u16),
    /// The broker acknowledged the publish `pkid`; `Err` when it refused it
    /// (MQTT 5 reason codes).
    PubAck {
        pkid: u16,
        outcome: Result<(), PubAckRefusal>,
    },
    /// The client sent its DISCONNECT.
    Disconnected,
    Other,
}

/// A PUBACK with a failure reason code (MQTT 5), and what it means for the
/// message: `retryable` publishes it again, otherwise it can never be
/// written (rejected).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PubAckRefusal {
    pub retryable: bool,
    pub reason: String,
}

/// What a PUBACK's reason code means: success (0x00, and 0x10 no matching
/// subscribers: the broker took it), retryable (0x80 unspecified, 0x83
/// implementation specific, 0x91 packet id in use, 0x97 quota exceeded) or
/// refused for good (0x87 not authorized, 0x90 topic name invalid, 0x99
/// payload format invalid).
pub fn puback_outcome(reason: packet5::PubAckReason) -> Result<(), PubAckRefusal> {
    use packet5::PubAckReason as Reason;
    let (retryable, what) = match reason {
        Reason::Success | Reason::NoMatchingSubscribers => return Ok(()),
        Reason::UnspecifiedError => (true, "0x80 unspecified error"),
        Reason::ImplementationSpecificError => (true, "0x83 implementation specific error"),
        Reason::PacketIdentifierInUse => (true, "0x91 packet identifier in use"),
        Reason::QuotaExceeded => (true, "0x97 quota exceeded"),
        Reason::NotAuthorized => (
            false,
            "0x87 not authorized (the broker's ACL denies the topic)",
        ),
        Reason::TopicNameInvalid => (false, "0x90 topic name invalid"),
        Reason::PayloadFormatInvalid => (false, "0x99 payload format invalid"),
    };
    Err(PubAckRefusal {
        retryable,
        reason: format!("the broker refused the publish: {what}"),
    })
}

/// A message received, of either version (kept whole: acknowledging it
/// needs it).
#[derive(Debug, Clone)]
pub enum Incoming {
    V4(rumqttc::Publish),
    V5(packet5::Publish),
}

impl Incoming {
    pub fn topic(&self) -> Cow<'_, str> {
        match self {
            Self::V4(publish) => Cow::Borrowed(&publish.topic),
            Self::V5(publish) => String::from_utf8_lossy(&publish.topic),
        }
    }

    pub fn payload(&self) -> Bytes {
        match self {
            Self::V4(publish) => publish.payload.clone(),
            Self::V5(publish) => publish.payload.clone(),
        }
    }

    /// QoS 1 or 2: the broker waits for an acknowledgement.
    pub fn needs_ack(&self) -> bool {
        match self {
            Self::V4(publish) => publish.qos != QoS::AtMostOnce,
            Self::V5(publish) => publish.qos != v5::mqttbytes::QoS::AtMostOnce,
        }
    }

    pub fn retain(&self) -> bool {
        match self {
            Self::V4(publish) => publish.retain,
            Self::V5(publish) => publish.retain,
        }
    }

    pub fn dup(&self) -> bool {
        match self {
            Self::V4(publish) => publish.dup,
            Self::V5(publish) => publish.dup,
        }
    }

    /// MQTT 5 user properties, in the order sent.
    pub fn user_properties(&self) -> &[(String, String)] {
        match self {
            Self::V5(packet5::Publish {
                properties: Some(properties),
                ..
            }) => &properties.user_properties,
            _ => &[],
        }
    }

    /// MQTT 5 content type.
    pub fn content_type(&self) -> Option<&str> {
        match self {
            Self::V5(packet5::Publish {
                properties: Some(properties),
                ..
            }) => properties.content_type.as_deref(),
            _ => None,
        }
    }
}

/// A message to publish.
#[derive(Debug, Clone)]
pub struct Message {
    pub topic: String,
    pub payload: Bytes,
    pub qos: QoS,
    pub retain: bool,
    /// Sent as MQTT 5 user properties; dropped on MQTT 3.1.1.
    pub user_properties: Vec<(String, String)>,
}

fn qos5(qos: QoS) -> v5::mqttbytes::QoS {
    match qos {
        QoS::AtMostOnce => v5::mqttbytes::QoS::AtMostOnce,
        QoS::AtLeastOnce => v5::mqttbytes::QoS::AtLeastOnce,
        QoS::ExactlyOnce => v5::mqttbytes::QoS::ExactlyOnce,
    }
}

impl Message {
    fn v4(&self) -> rumqttc::Publish {
        let mut publish = rumqttc::Publish::from_bytes(&self.topic, self.qos, self.payload.clone());
        publish.retain = self.retain;
        publish
    }

    fn properties(&self) -> Option<packet5::PublishProperties> {
        (!self.user_properties.is_empty()).then(|| packet5::PublishProperties {
            user_properties: self.user_properties.clone(),
            ..packet5::PublishProperties::default()
        })
    }

    /// The size of the PUBLISH packet as `protocol` sends it, packet id
    /// and properties included.
    pub fn size(&self, protocol: Protocol) -> usize {
        match protocol {
            Protocol::V311 => {
                let mut publish = self.v4();
                publish.pkid = 1;
                publish.size()
            }
            Protocol::V5 => {
                let mut publish = packet5::Publish::new(
                    self.topic.as_str(),
                    qos5(self.qos),
                    self.payload.clone(),
                    self.properties(),
                );
                publish.retain = self.retain;
                publish.pkid = 1;
                publish.size()
            }
        }
    }
}

impl Client {
    /// Sends the PUBACK of `message`.
    pub async fn ack(&self, message: &Incoming) -> Result<(), String> {
        match (self, message) {
            (Self::V4(client), Incoming::V4(publish)) => {
                client.ack(publish).await.map_err(|error| error.to_string())
            }
            (Self::V5(client), Incoming::V5(publish)) => {
                client.ack(publish).await.map_err(|error| error.to_string())
            }
            _ => Err("a message of the other protocol version".into()),
        }
    }

    /// Subscribes to each filter with `qos`, waiting for room in the queue
    /// (`wait`) or not.
    pub async fn subscribe(&self, filters: &[String], qos: QoS, wait: bool) -> Result<(), String> {
        match self {
            Self::V4(client) => {
                let filters: Vec<SubscribeFilter> = filters
                    .iter()
                    .map(|filter| SubscribeFilter::new(filter.clone(), qos))
                    .collect();
                if wait {
                    client.subscribe_many(filters).await
                } else {
                    client.try_subscribe_many(filters)
                }
                .map_err(|error| error.to_string())
            }
            Self::V5(client) => {
                let filters: Vec<packet5::Filter> = filters
                    .iter()
                    .map(|filter| packet5::Filter::new(filter.clone(), qos5(qos)))
                    .collect();
                if wait {
                    client.subscribe_many(filters).await
                } else {
                    client.try_subscribe_many(filters)
                }
                .map_err(|error| error.to_string())
            }
        }
    }

    /// Hands `message` to the client without waiting; `false` when its
    /// queue is closed or full.
    pub fn try_publish(&self, message: Message) -> bool {
        match self {
            Self::V4(client) => matches!(
                client
                    .publish_bytes(message.topic, message.qos, message.retain, message.payload)
                    .now_or_never(),
                Some(Ok(()))
            ),
            Self::V5(client) => {
                let properties = message.properties().unwrap_or_default();
                client
                    .try_publish_with_properties(
                        message.topic,
                        qos5(message.qos),
                        message.retain,
                        message.payload,
                        properties,
                    )
                    .is_ok()
            }
        }
    }

    pub fn try_disconnect(&self) {
        let _ = match self {
            Self::V4(client) => client.try_disconnect().map_err(drop),
            Self::V5(client) => client.try_disconnect().map_err(drop),
        };
    }
}

fn event4(event: rumqttc::Event) -> Event {
    match event {
        rumqttc::Event::Incoming(Packet::ConnAck(connack)) => Event::ConnAck {
            session_present: connack.session_present,
        },
        rumqttc::Event::Incoming(Packet::Publish(publish)) => Event::Publish(Incoming::V4(publish)),
        rumqttc::Event::Incoming(Packet::SubAck(suback)) => Event::SubAck(
            suback
                .return_codes
                .iter()
                .map(|code| matches!(code, rumqttc::SubscribeReasonCode::Failure))
                .collect(),
        ),
        rumqttc::Event::Incoming(Packet::PubAck(puback)) => Event::PubAck {
            pkid: puback.pkid,
            outcome: Ok(()),
        },
        rumqttc::Event::Outgoing(Outgoing::Publish(pkid)) => Event::Sent(pkid),
        rumqttc::Event::Outgoing(Outgoing::Disconnect) => Event::Disconnected,
        _ => Event::Other,
    }
}

fn event5(event: v5::Event) -> Event {
    use packet5::Packet as Packet5;
    match event {
        v5::Event::Incoming(Packet5::ConnAck(connack)) => Event::ConnAck {
            session_present: connack.session_present,
        },
        v5::Event::Incoming(Packet5::Publish(publish)) => Event::Publish(Incoming::V5(publish)),
        v5::Event::Incoming(Packet5::SubAck(suback)) => Event::SubAck(
            suback
                .return_codes
                .iter()
                .map(|code| !matches!(code, packet5::SubscribeReasonCode::Success(_)))
                .collect(),
        ),
        v5::Event::Incoming(Packet5::PubAck(puback)) => Event::PubAck {
            pkid: puback.pkid,
            outcome: puback_outcome(puback.reason),
        },
        v5::Event::Outgoing(Outgoing::Publish(pkid)) => Event::Sent(pkid),
        v5::Event::Outgoing(Outgoing::Disconnect) => Event::Disconnected,
        _ => Event::Other,
    }
}

impl EventLoop {
    pub async fn poll(&mut self) -> Result<Event, ConnectionError> {
        match self {
            Self::V4(eventloop) => eventloop
                .poll()
                .await
                .map(event4)
                .map_err(ConnectionError::V4),
            Self::V5(eventloop) => eventloop
                .poll()
                .await
                .map(event5)
                .map_err(ConnectionError::V5),
        }
    }

    /// After a lost connection: the messages read just before the loss and
    /// still queued in the client.
    pub fn take_received(&mut self) -> Vec<Incoming> {
        match self {
            Self::V4(eventloop) => eventloop
                .state
                .events
                .drain(..)
                .filter_map(|event| match event {
                    rumqttc::Event::Incoming(Packet::Publish(publish)) => {
                        Some(Incoming::V4(publish))
                    }
                    _ => None,
                })
                .collect(),
            Self::V5(eventloop) => eventloop
                .state
                .events
                .drain(..)
                .filter_map(|event| match event {
                    v5::Event::Incoming(packet5::Packet::Publish(publish)) => {
                        Some(Incoming::V5(publish))
                    }
                    _ => None,
                })
                .collect(),
        }
    }

    /// After a lost connection: drops what the client kept to send again,
    /// what waits in its queue, and the events of the lost connection still
    /// queued (they would pair the next connection's packet ids wrongly).
    pub fn forget_unsent(&mut self) {
        match self {
            Self::V4(eventloop) => {
                eventloop.clean();
                eventloop.pending.clear();
                eventloop.state.events.clear();
            }
            Self::V5(eventloop) => {
                eventloop.clean();
                eventloop.pending.clear();
                eventloop.state.events.clear();
            }
        }
    }
}

/// A connected client and the task driving its event loop; dropped, the
/// task stops too.
pub struct Driven {
    pub client: Client,
    task: JoinHandle<()>,
}

impl Driven {
    pub fn spawn(client: Client, drive: impl Future<Output = ()> + Send + 'static) -> Self {
        Self {
            client,
            task: tokio::spawn(drive),
        }
    }

    /// Disconnects (after what was handed to the client before, such as
    /// PUBACKs) and waits up to `bound` for the task to end.
    pub async fn close(mut self, bound: Duration) {
        self.client.try_disconnect();
        if tokio::time::timeout(bound, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Drop for Driven {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A valid MQTT topic to publish to: not empty, no wildcards, no NUL, at most
/// 65535 bytes.
pub fn check_topic(topic: &str) -> Result<(), String> {
    if topic.is_empty() {
        return Err("the topic is empty".into());
    }
    if topic.contains(['+', '#', '\0']) {
        return Err(format!("the topic {topic:?} holds a wildcard or NUL"));
    }
    if topic.len() > usize::from(u16::MAX) {
        return Err(format!("the topic is {} bytes, over 65535", topic.len()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_puback_reason_codes_when_classified_should_split_success_retry_and_reject() {
        use packet5::PubAckReason as Reason;
        assert!(puback_outcome(Reason::Success).is_ok());
        assert!(puback_outcome(Reason::NoMatchingSubscribers).is_ok());
        for retry in [
            Reason::UnspecifiedError,
            Reason::ImplementationSpecificError,
            Reason::PacketIdentifierInUse,
            Reason::QuotaExceeded,
        ] {
            assert!(puback_outcome(retry).unwrap_err().retryable, "{retry:?}");
        }
        for reject in [
            Reason::NotAuthorized,
            Reason::TopicNameInvalid,
            Reason::PayloadFormatInvalid,
        ] {
            assert!(!puback_outcome(reject).unwrap_err().retryable, "{reject:?}");
        }
        assert!(
            puback_outcome(Reason::NotAuthorized)
                .unwrap_err()
                .reason
                .contains("0x87")
        );
    }

    #[test]
    fn given_user_properties_when_sized_should_count_them_on_5_only() {
        let mut message = Message {
            topic: "a/b".into(),
            payload: Bytes::from_static(b"payload"),
            qos: QoS::AtLeastOnce,
            retain: false,
            user_properties: Vec::new(),
        };
        let (bare4, bare5) = (message.size(Protocol::V311), message.size(Protocol::V5));
        // 2 + 3 topic + 2 packet id + 7 payload + the fixed header (2);
        // MQTT 5 adds the properties' length byte.
        assert_eq!((bare4, bare5), (16, 17));
        message.user_properties = vec![("key".into(), "value".into())];
        assert_eq!(message.size(Protocol::V311), bare4);
        // 1 id + 2 + 3 + 2 + 5.
        assert_eq!(message.size(Protocol::V5), bare5 + 13);
    }

    #[test]
    fn given_topics_when_checked_should_refuse_wildcards_and_empty() {
        assert!(check_topic("a/b").is_ok());
        assert!(check_topic("").is_err());
        assert!(check_topic("a/+").is_err());
        assert!(check_topic("a/#").is_err());
    }
}
