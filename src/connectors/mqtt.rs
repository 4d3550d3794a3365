//! What the mqtt source and sink share: where the broker is, how to log in,
//! the first connect (which tells a login the broker refuses from a broker
//! that is down) and the reconnect pacing of the event loop afterwards.
//!
//! MQTT 3.1.1 over plain TCP through `rumqttc` (no TLS in this build).

use std::time::Duration;

use rumqttc::{
    AsyncClient, ConnAck, ConnectReturnCode, ConnectionError, Event, EventLoop, MqttOptions,
    Packet, QoS,
};
use secrecy::{ExposeSecret, SecretString};
use tokio::task::JoinHandle;

use crate::connectors::kit::backoff::Backoff;
use crate::connectors::{ConnectorError, PluginConfigError};

/// The connection fields both connectors take (each config declares them,
/// since a flattened struct cannot deny unknown fields).
#[derive(Debug, Clone)]
pub struct MqttConnection {
    pub url: String,
    pub client_id: Option<String>,
    pub username: Option<String>,
    pub password: Option<SecretString>,
    pub keep_alive: Duration,
    pub connect_timeout: Duration,
    pub max_packet_size: usize,
}

/// Declares the connection fields inside a connector's config struct.
macro_rules! connection_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            /// The broker, `mqtt://host:port` (or `tcp://`; port 1883 when left out).
            #[serde(default = "crate::connectors::mqtt::default_url")]
            pub url: String,
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
            $($body)*
        }

        impl $name {
            pub fn connection(&self) -> crate::connectors::mqtt::MqttConnection {
                crate::connectors::mqtt::MqttConnection {
                    url: self.url.clone(),
                    client_id: self.client_id.clone(),
                    username: self.username.clone(),
                    password: self.password.clone(),
                    keep_alive: self.keep_alive,
                    connect_timeout: self.connect_timeout,
                    max_packet_size: self.max_packet_size,
                }
            }
        }
    };
}
pub(crate) use connection_fields;

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

/// The pace of reconnects after a lost connection.
pub const RECONNECT: Backoff = Backoff {
    initial: Duration::from_millis(100),
    max: Duration::from_secs(2),
    multiplier: 2.0,
};

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

impl MqttConnection {
    /// Checks what can be checked without a broker; returns host and port.
    pub fn check(&self) -> Result<(String, u16), PluginConfigError> {
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
        if self.max_packet_size < 64 {
            return Err(PluginConfigError::new(
                "max_packet_size",
                "expected at least 64 bytes",
            ));
        }
        parse_url(&self.url)
    }

    /// The client and its event loop, not connected yet; `session` sets the
    /// session options (clean session, manual acks).
    pub fn client(
        &self,
        client_id: &str,
        session: impl FnOnce(&mut MqttOptions),
        capacity: usize,
    ) -> Result<(AsyncClient, EventLoop), ConnectorError> {
        let (host, port) = self
            .check()
            .map_err(|error| ConnectorError::fatal(format!("plugin_config.{error}")))?;
        let mut options = MqttOptions::new(client_id, host, port);
        options
            .set_keep_alive(self.keep_alive)
            .set_max_packet_size(self.max_packet_size, self.max_packet_size);
        if let Some(username) = &self.username {
            let password = self
                .password
                .as_ref()
                .map(|password| password.expose_secret().to_owned())
                .unwrap_or_default();
            options.set_credentials(username.clone(), password);
        }
        session(&mut options);
        let (client, mut eventloop) = AsyncClient::new(options, capacity);
        eventloop
            .network_options
            .set_connection_timeout(self.connect_timeout.as_secs().max(1));
        Ok((client, eventloop))
    }

    /// Drives `eventloop` until the broker accepted the connection.
    pub async fn connect(&self, eventloop: &mut EventLoop) -> Result<ConnAck, ConnectorError> {
        let bound = self.connect_timeout + Duration::from_secs(1);
        loop {
            match tokio::time::timeout(bound, eventloop.poll()).await {
                Ok(Ok(Event::Incoming(Packet::ConnAck(connack)))) => return Ok(connack),
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
        match error {
            ConnectionError::ConnectionRefused(
                ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized,
            ) => ConnectorError::fatal(format!(
                "mqtt broker {}: the login was refused ({error}); check plugin_config.username \
                 and plugin_config.password",
                self.url
            )),
            ConnectionError::ConnectionRefused(ConnectReturnCode::BadClientId) => {
                ConnectorError::fatal(format!(
                    "mqtt broker {}: the client id was refused; check plugin_config.client_id",
                    self.url
                ))
            }
            ConnectionError::ConnectionRefused(ConnectReturnCode::RefusedProtocolVersion) => {
                ConnectorError::fatal(format!(
                    "mqtt broker {}: it does not speak MQTT 3.1.1; check plugin_config.url",
                    self.url
                ))
            }
            _ => ConnectorError::transient(format!("mqtt broker {}: {error}", self.url)),
        }
    }
}

/// A connected client and the task driving its event loop; dropped, the
/// task stops too.
pub struct Driven {
    pub client: AsyncClient,
    task: JoinHandle<()>,
}

impl Driven {
    pub fn spawn(client: AsyncClient, drive: impl Future<Output = ()> + Send + 'static) -> Self {
        Self {
            client,
            task: tokio::spawn(drive),
        }
    }

    /// Disconnects (after what was handed to the client before, such as
    /// PUBACKs) and waits up to `bound` for the task to end.
    pub async fn close(mut self, bound: Duration) {
        let _ = self.client.try_disconnect();
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
fn parse_url(url: &str) -> Result<(String, u16), PluginConfigError> {
    let expected = "expected mqtt://host:port";
    let rest = match url.trim().split_once("://") {
        Some(("mqtt" | "tcp", rest)) => rest,
        Some(("mqtts" | "ssl" | "tls" | "ws" | "wss", _)) => {
            return Err(PluginConfigError::new(
                "url",
                format!("{url:?}: this build speaks plain TCP only; {expected}"),
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
        None => 1883,
    };
    if host.is_empty() {
        return Err(PluginConfigError::new(
            "url",
            format!("{url:?}: no host; {expected}"),
        ));
    }
    Ok((host.to_owned(), port))
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
            client_id: None,
            username: None,
            password: None,
            keep_alive: default_keep_alive(),
            connect_timeout: default_connect_timeout(),
            max_packet_size: default_max_packet_size(),
        }
    }

    #[test]
    fn given_urls_when_checked_should_split_host_and_port_or_name_the_field() {
        assert_eq!(
            connection("mqtt://127.0.0.1:1884").check().unwrap(),
            ("127.0.0.1".into(), 1884)
        );
        assert_eq!(
            connection("tcp://broker").check().unwrap(),
            ("broker".into(), 1883)
        );
        assert_eq!(
            connection("mqtt://[::1]:1885").check().unwrap(),
            ("::1".into(), 1885)
        );
        assert_eq!(
            connection("mqtt://[::1]").check().unwrap(),
            ("::1".into(), 1883)
        );
        for bad in [
            "",
            "broker:1883",
            "http://x",
            "mqtts://x:8883",
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
    fn given_topics_when_checked_should_refuse_wildcards_and_empty() {
        assert!(check_topic("a/b").is_ok());
        assert!(check_topic("").is_err());
        assert!(check_topic("a/+").is_err());
        assert!(check_topic("a/#").is_err());
    }
}
