//! What the mqtt source and sink share: where the broker is, how to log in,
//! the first connect (which tells a login the broker refuses from a broker
//! that is down), and the one place that knows the two protocol versions
//! apart. A lost connection is never reconnected here: the connectors report
//! it and the engine opens fresh ones.
//!
//! MQTT 3.1.1 (`rumqttc`'s v4 API) or MQTT 5 (its `v5` API), chosen by
//! `protocol_version`, over TCP or TLS (rustls, `mqtts://`). Both connectors
//! talk to [`Client`] and [`EventLoop`], enums over the two clients, and see
//! one [`Event`] type: the delivery contract, the acking bookkeeping and the
//! payload / topic mapping are written once.

#[cfg(feature = "mqtt-sink")]
pub mod sink;
#[cfg(feature = "mqtt-source")]
pub mod source;

use std::borrow::Cow;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::FutureExt;
use rumqttc::v5::mqttbytes::v5 as packet5;
use rumqttc::{
    ConnectReturnCode, MqttOptions, Outgoing, Packet, QoS, SubscribeFilter, TlsConfiguration,
    Transport, v5,
};
use secrecy::{ExposeSecret, SecretString};
use tokio::task::JoinHandle;

use crate::connectors::kit::tls::{TlsClient, TlsOptions};
use crate::connectors::{ConnectorError, PluginConfigError};

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

/// The connection fields both connectors take (each config declares them,
/// since a flattened struct cannot deny unknown fields).
#[derive(Debug, Clone)]
pub struct MqttConnection {
    pub url: String,
    pub protocol_version: String,
    pub client_id: Option<String>,
    pub username: Option<String>,
    pub password: Option<SecretString>,
    pub keep_alive: Duration,
    pub connect_timeout: Duration,
    pub max_packet_size: usize,
    pub tls_files: TlsOptions,
    /// The TLS config of the last [`client`](Self::client), to tell a
    /// refused certificate from a broker that is down.
    pub tls: Option<TlsClient>,
}

/// Declares the connection fields inside a connector's config struct.
macro_rules! connection_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            /// The broker, `mqtt://host:port` (or `tcp://`; port 1883 when left
            /// out), or over TLS `mqtts://host:port` (or `ssl://`; port 8883).
            #[serde(default = "crate::connectors::mqtt::default_url")]
            pub url: String,
            /// The MQTT version spoken: `"3.1.1"` (the default) or `"5"`.
            #[serde(default = "crate::connectors::mqtt::default_protocol_version")]
            pub protocol_version: String,
            /// The MQTT client id (default `iggy-connect-source-<key>` /
            /// `iggy-connect-sink-<key>`). The source's persistent session is
            /// kept under it: two instances must not share it.
            #[serde(default)]
            pub client_id: Option<String>,
            /// User name (with `password`).
            #[serde(default)]
            pub username: Option<String>,
            /// The user's password; a secret.
            #[serde(default)]
            #[schemars(with = "Option<String>")]
            pub password: Option<secrecy::SecretString>,
            /// The MQTT keep-alive: a ping when the connection is idle this long.
            #[serde(
                default = "crate::connectors::mqtt::default_keep_alive",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub keep_alive: std::time::Duration,
            /// How long connecting may take before it counts as failed (and is retried).
            #[serde(
                default = "crate::connectors::mqtt::default_connect_timeout",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub connect_timeout: std::time::Duration,
            /// The largest MQTT packet sent or accepted, in bytes (a message's
            /// topic and payload plus a few bytes).
            #[serde(default = "crate::connectors::mqtt::default_max_packet_size")]
            pub max_packet_size: usize,
            /// PEM file of the CA certificates to trust with `mqtts://`
            /// (default: the system's).
            #[serde(default)]
            pub ca_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate, for mutual TLS.
            #[serde(default)]
            pub cert_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate's private key.
            #[serde(default)]
            pub key_file: Option<std::path::PathBuf>,
            /// Verify the broker's certificate and name (on by default).
            #[serde(default = "crate::connectors::mqtt::default_true")]
            pub tls_verify: bool,
            $($body)*
        }

        impl $name {
            pub fn connection(&self) -> crate::connectors::mqtt::MqttConnection {
                crate::connectors::mqtt::MqttConnection {
                    url: self.url.clone(),
                    protocol_version: self.protocol_version.clone(),
                    client_id: self.client_id.clone(),
                    username: self.username.clone(),
                    password: self.password.clone(),
                    keep_alive: self.keep_alive,
                    connect_timeout: self.connect_timeout,
                    max_packet_size: self.max_packet_size,
                    tls_files: crate::connectors::kit::tls::TlsOptions {
                        ca_file: self.ca_file.clone(),
                        cert_file: self.cert_file.clone(),
                        key_file: self.key_file.clone(),
                        verify: self.tls_verify,
                    },
                    tls: None,
                }
            }
        }
    };
}
pub(crate) use connection_fields;

pub fn default_protocol_version() -> String {
    "3.1.1".into()
}

pub fn default_true() -> bool {
    true
}

pub fn default_url() -> String {
    "mqtt://127.0.0.1:1883".into()
}

pub fn default_keep_alive() -> Duration {
    Duration::from_secs(30)
}

pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

pub fn default_max_packet_size() -> usize {
    1024 * 1024
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

/// How a connector's session is set up.
#[derive(Debug, Clone, Copy, Default)]
pub struct Session {
    /// Start clean (MQTT 3.1.1 clean session, MQTT 5 clean start).
    pub clean: bool,
    /// PUBACKs sent by the connector, not by the client on receipt.
    pub manual_acks: bool,
    /// MQTT 5: how long the broker keeps the session after a disconnect, in
    /// seconds (`None`: 0, it ends with the connection).
    pub expiry: Option<u32>,
    /// MQTT 5: how many unacknowledged QoS 1 messages the broker may send
    /// (its Receive Maximum; `None`: the protocol's 65535).
    pub receive_maximum: Option<u16>,
    /// How many unacknowledged publishes the client may have out.
    pub inflight: Option<u16>,
}

/// Where the broker is, from `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub tls: bool,
}

impl MqttConnection {
    /// Checks what can be checked without a broker (reading the TLS files).
    pub fn check(&self) -> Result<Endpoint, PluginConfigError> {
        self.protocol()?;
        if self.username.is_none() && self.password.is_some() {
            return Err(PluginConfigError::new(
                "username",
                "a password needs its username",
            ));
        }
        if self.client_id.as_deref() == Some("") {
            return Err(PluginConfigError::new(
                "client_id",
                "expected a client id, found \"\" (leave it out for the default)",
            ));
        }
        if self.keep_alive < Duration::from_secs(1) {
            return Err(PluginConfigError::new(
                "keep_alive",
                "expected at least 1s (MQTT counts it in seconds)",
            ));
        }
        if self.max_packet_size < 64 || u32::try_from(self.max_packet_size).is_err() {
            return Err(PluginConfigError::new(
                "max_packet_size",
                "expected at least 64 bytes and at most 4294967295",
            ));
        }
        let endpoint = parse_url(&self.url)?;
        if !endpoint.tls && self.tls_files.any_file() {
            return Err(PluginConfigError::new(
                "url",
                format!(
                    "{:?} is plain TCP, but ca_file, cert_file or key_file is set; use \
                     mqtts://host:port",
                    self.url
                ),
            ));
        }
        if endpoint.tls {
            self.tls_files.client()?;
        }
        Ok(endpoint)
    }

    pub fn protocol(&self) -> Result<Protocol, PluginConfigError> {
        Protocol::parse(&self.protocol_version)
    }

    /// The client and its event loop, not connected yet.
    pub fn client(
        &mut self,
        client_id: &str,
        session: Session,
        capacity: usize,
    ) -> Result<(Client, EventLoop), ConnectorError> {
        let invalid =
            |error: PluginConfigError| ConnectorError::fatal(format!("plugin_config.{error}"));
        let Endpoint { host, port, tls } = self.check().map_err(invalid)?;
        self.tls = if tls {
            Some(self.tls_files.client().map_err(invalid)?)
        } else {
            None
        };
        let transport = match &self.tls {
            Some(tls) => Transport::Tls(TlsConfiguration::Rustls(tls.config.clone())),
            None => Transport::Tcp,
        };
        let login = self.username.as_ref().map(|username| {
            let password = self
                .password
                .as_ref()
                .map(|password| password.expose_secret().to_owned())
                .unwrap_or_default();
            (username.clone(), password)
        });
        let timeout = self.connect_timeout.as_secs().max(1);
        match self.protocol().map_err(invalid)? {
            Protocol::V311 => {
                let mut options = MqttOptions::new(client_id, host, port);
                options
                    .set_keep_alive(self.keep_alive)
                    .set_max_packet_size(self.max_packet_size, self.max_packet_size)
                    .set_clean_session(session.clean)
                    .set_manual_acks(session.manual_acks)
                    .set_transport(transport);
                if let Some(inflight) = session.inflight {
                    options.set_inflight(inflight);
                }
                if let Some((username, password)) = login {
                    options.set_credentials(username, password);
                }
                let (client, mut eventloop) = rumqttc::AsyncClient::new(options, capacity);
                eventloop.network_options.set_connection_timeout(timeout);
                Ok((Client::V4(client), EventLoop::V4(Box::new(eventloop))))
            }
            Protocol::V5 => {
                let mut options = v5::MqttOptions::new(client_id, host, port);
                options
                    .set_keep_alive(self.keep_alive)
                    .set_max_packet_size(u32::try_from(self.max_packet_size).ok())
                    .set_clean_start(session.clean)
                    .set_manual_acks(session.manual_acks)
                    .set_session_expiry_interval(session.expiry)
                    .set_receive_maximum(session.receive_maximum)
                    .set_connection_timeout(timeout)
                    .set_transport(transport);
                if let Some(inflight) = session.inflight {
                    options.set_outgoing_inflight_upper_limit(inflight);
                }
                if let Some((username, password)) = login {
                    options.set_credentials(username, password);
                }
                let (client, eventloop) = v5::AsyncClient::new(options, capacity);
                Ok((Client::V5(client), EventLoop::V5(Box::new(eventloop))))
            }
        }
    }

    /// Drives `eventloop` until the broker accepted the connection; tells
    /// whether the broker still had the session.
    pub async fn connect(&self, eventloop: &mut EventLoop) -> Result<bool, ConnectorError> {
        let bound = self.connect_timeout + Duration::from_secs(1);
        loop {
            match tokio::time::timeout(bound, eventloop.poll()).await {
                Ok(Ok(Event::ConnAck { session_present })) => return Ok(session_present),
                Ok(Ok(_)) => continue,
                Ok(Err(error)) => return Err(self.classify(&error)),
                Err(_) => {
                    return Err(ConnectorError::transient(format!(
                        "mqtt broker {}: no answer within {:?}",
                        self.url, self.connect_timeout
                    )));
                }
            }
        }
    }

    /// A refused login or client id is fatal and names the field; anything
    /// else (the broker down, a connection lost) is transient.
    pub fn classify(&self, error: &ConnectionError) -> ConnectorError {
        use v5::mqttbytes::v5::ConnectReturnCode as Code5;
        if let Some(tls) = &self.tls
            && let Some(refused) = tls.refusal("url", &self.url, &error.to_string())
        {
            return refused;
        }
        let refused = match error {
            ConnectionError::V4(rumqttc::ConnectionError::ConnectionRefused(code)) => match code {
                ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized => {
                    Some(Refused::Login)
                }
                ConnectReturnCode::BadClientId => Some(Refused::ClientId),
                ConnectReturnCode::RefusedProtocolVersion => Some(Refused::Version),
                _ => None,
            },
            ConnectionError::V5(v5::ConnectionError::ConnectionRefused(code)) => match code {
                Code5::BadUserNamePassword | Code5::NotAuthorized | Code5::Banned => {
                    Some(Refused::Login)
                }
                Code5::BadClientId | Code5::ClientIdentifierNotValid => Some(Refused::ClientId),
                Code5::RefusedProtocolVersion | Code5::UnsupportedProtocolVersion => {
                    Some(Refused::Version)
                }
                _ => None,
            },
            _ => None,
        };
        let url = &self.url;
        match refused {
            Some(Refused::Login) => ConnectorError::fatal(format!(
                "mqtt broker {url}: the login was refused ({error}); check plugin_config.username \
                 and plugin_config.password"
            )),
            Some(Refused::ClientId) => ConnectorError::fatal(format!(
                "mqtt broker {url}: the client id was refused; check plugin_config.client_id"
            )),
            Some(Refused::Version) => ConnectorError::fatal(format!(
                "mqtt broker {url}: it does not speak {}; check plugin_config.protocol_version \
                 and plugin_config.url",
                self.protocol().unwrap_or_default()
            )),
            None => ConnectorError::transient(format!("mqtt broker {url}: {error}")),
        }
    }
}

enum Refused {
    Login,
    ClientId,
    Version,
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

/// `mqtt://host[:port]` or `tcp://host[:port]` into host and port.
fn parse_url(url: &str) -> Result<Endpoint, PluginConfigError> {
    let expected = "expected mqtt://host:port or mqtts://host:port";
    let (rest, tls) = match url.trim().split_once("://") {
        Some(("mqtt" | "tcp", rest)) => (rest, false),
        Some(("mqtts" | "ssl" | "tls", rest)) => (rest, true),
        Some(("ws" | "wss", _)) => {
            return Err(PluginConfigError::new(
                "url",
                format!("{url:?}: MQTT over WebSocket is not in this build; {expected}"),
            ));
        }
        _ => {
            return Err(PluginConfigError::new(
                "url",
                format!("{url:?}: {expected}"),
            ));
        }
    };
    let rest = rest.trim_end_matches('/');
    if rest.is_empty() || rest.contains(['/', '@', '?']) {
        return Err(PluginConfigError::new(
            "url",
            format!("{url:?}: {expected} (credentials go in username and password)"),
        ));
    }
    let bad_port = || PluginConfigError::new("url", format!("{url:?}: bad port; {expected}"));
    let (host, port) = match rest.strip_prefix('[') {
        // [v6 address] or [v6 address]:port
        Some(bracketed) => match bracketed.split_once(']') {
            Some((host, "")) => (host, None),
            Some((host, port)) => (host, Some(port.strip_prefix(':').ok_or_else(bad_port)?)),
            None => return Err(bad_port()),
        },
        None => match rest.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (rest, None),
        },
    };
    let port = match port {
        Some(port) => port.parse::<u16>().map_err(|_| bad_port())?,
        None if tls => 8883,
        None => 1883,
    };
    if host.is_empty() {
        return Err(PluginConfigError::new(
            "url",
            format!("{url:?}: no host; {expected}"),
        ));
    }
    Ok(Endpoint {
        host: host.to_owned(),
        port,
        tls,
    })
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

    fn connection(url: &str) -> MqttConnection {
        MqttConnection {
            url: url.into(),
            protocol_version: default_protocol_version(),
            client_id: None,
            username: None,
            password: None,
            keep_alive: default_keep_alive(),
            connect_timeout: default_connect_timeout(),
            max_packet_size: default_max_packet_size(),
            tls_files: TlsOptions {
                ca_file: None,
                cert_file: None,
                key_file: None,
                verify: true,
            },
            tls: None,
        }
    }

    fn endpoint(host: &str, port: u16, tls: bool) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
            tls,
        }
    }

    #[test]
    fn given_urls_when_checked_should_split_host_and_port_or_name_the_field() {
        assert_eq!(
            connection("mqtt://127.0.0.1:1884").check().unwrap(),
            endpoint("127.0.0.1", 1884, false)
        );
        assert_eq!(
            connection("tcp://broker").check().unwrap(),
            endpoint("broker", 1883, false)
        );
        assert_eq!(
            connection("mqtt://[::1]:1885").check().unwrap(),
            endpoint("::1", 1885, false)
        );
        assert_eq!(
            connection("mqtt://[::1]").check().unwrap(),
            endpoint("::1", 1883, false)
        );
        assert_eq!(
            connection("mqtts://broker").check().unwrap(),
            endpoint("broker", 8883, true)
        );
        assert_eq!(
            connection("ssl://broker:18883").check().unwrap(),
            endpoint("broker", 18883, true)
        );
        for bad in [
            "",
            "broker:1883",
            "http://x",
            "ws://x:8080/mqtt",
            "mqtt://u:p@x",
            "mqtt://x:port",
        ] {
            assert_eq!(connection(bad).check().unwrap_err().field, "url", "{bad}");
        }
        let half = MqttConnection {
            password: Some("p".into()),
            ..connection("mqtt://x")
        };
        assert_eq!(half.check().unwrap_err().field, "username");
    }

    #[test]
    fn given_tls_files_when_checked_should_need_mqtts_and_readable_files() {
        let mut plain = connection("mqtt://x");
        plain.tls_files.ca_file = Some("ca.pem".into());
        assert_eq!(plain.check().unwrap_err().field, "url");
        let mut missing = connection("mqtts://x");
        missing.tls_files.ca_file = Some("/nonexistent/ca.pem".into());
        let error = missing.check().unwrap_err();
        assert_eq!(error.field, "ca_file");
        assert!(error.message.contains("/nonexistent/ca.pem"), "{error}");
    }

    #[test]
    fn given_protocol_versions_when_checked_should_accept_311_and_5_only() {
        let versioned = |version: &str| MqttConnection {
            protocol_version: version.into(),
            ..connection("mqtt://x")
        };
        assert_eq!(versioned("3.1.1").protocol().unwrap(), Protocol::V311);
        assert_eq!(versioned("5").protocol().unwrap(), Protocol::V5);
        for bad in ["3", "4", "5.1", "v5", ""] {
            let error = versioned(bad).check().unwrap_err();
            assert_eq!(error.field, "protocol_version", "{bad}");
            assert!(
                error.message.contains("\"3.1.1\" or \"5\""),
                "{}",
                error.message
            );
        }
    }

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
