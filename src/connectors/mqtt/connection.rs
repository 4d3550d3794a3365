//! Where the broker is and how to reach it: the connection fields both mqtt
//! connectors declare, the url (`mqtt://`, `mqtts://`, `ws://`, `wss://`),
//! the TLS files, the login, the client of either protocol version built
//! from them, and the first connect, which tells a login or certificate the
//! broker refuses (fatal, naming the field) from a broker that is down
//! (transient).
//!
//! MQTT over WebSocket is rumqttc's own transport (its `websocket` feature):
//! the `mqtt` subprotocol on the url's path, TLS from the same rustls config
//! as `mqtts://`.

use std::time::Duration;

use rumqttc::{ConnectReturnCode, MqttOptions, TlsConfiguration, Transport, v5};
use secrecy::{ExposeSecret, SecretString};

use super::{Client, ConnectionError, Event, EventLoop, Protocol};
use crate::connectors::kit::tls::{TlsClient, TlsOptions};
use crate::connectors::{ConnectorError, PluginConfigError};

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
            /// out), over TLS `mqtts://host:port` (or `ssl://`; port 8883), or
            /// over WebSocket `ws://host:port/path` (port 80) or, with TLS,
            /// `wss://host:port/path` (port 443).
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
            /// PEM file of the CA certificates to trust with `mqtts://` or
            /// `wss://` (default: the system's).
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

/// How the connection is carried, from `url`'s scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// `mqtt://`, `tcp://`.
    Tcp,
    /// `mqtts://`, `ssl://`, `tls://`.
    Tls,
    /// `ws://`: MQTT over WebSocket.
    Ws,
    /// `wss://`: MQTT over WebSocket over TLS.
    Wss,
}

impl Scheme {
    pub fn tls(self) -> bool {
        matches!(self, Self::Tls | Self::Wss)
    }
}

/// Where the broker is, from `url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
    pub scheme: Scheme,
    /// The WebSocket url's path and query (`/mqtt`), empty otherwise.
    pub path: String,
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
        if !endpoint.scheme.tls() && self.tls_files.any_file() {
            return Err(PluginConfigError::new(
                "url",
                format!(
                    "{:?} is without TLS, but ca_file, cert_file or key_file is set; use \
                     mqtts://host:port or wss://host:port/path",
                    self.url
                ),
            ));
        }
        if endpoint.scheme.tls() {
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
        let Endpoint {
            host, port, scheme, ..
        } = self.check().map_err(invalid)?;
        self.tls = if scheme.tls() {
            Some(self.tls_files.client().map_err(invalid)?)
        } else {
            None
        };
        let rustls = || {
            let tls = self.tls.as_ref().expect("a TLS scheme has its config");
            TlsConfiguration::Rustls(tls.config.clone())
        };
        let transport = match scheme {
            Scheme::Tcp => Transport::Tcp,
            Scheme::Tls => Transport::Tls(rustls()),
            Scheme::Ws => Transport::Ws,
            Scheme::Wss => Transport::Wss(rustls()),
        };
        // Over WebSocket rumqttc takes the whole url as the host (and the
        // port from it).
        let host = match scheme {
            Scheme::Ws | Scheme::Wss => self.url.trim().to_owned(),
            Scheme::Tcp | Scheme::Tls => host,
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
            ConnectionError::V4(rumqttc::ConnectionError::Websocket(answer)) => {
                websocket_refused(&answer.to_string())
            }
            ConnectionError::V5(v5::ConnectionError::Websocket(answer)) => {
                websocket_refused(&answer.to_string())
            }
            ConnectionError::V4(rumqttc::ConnectionError::ResponseValidation(_))
            | ConnectionError::V5(v5::ConnectionError::ResponseValidation(_)) => {
                Some(Refused::NotMqtt)
            }
            _ => None,
        };
        let url = &self.url;
        match refused {
            Some(Refused::Http(status)) => ConnectorError::fatal(format!(
                "mqtt broker {url}: the WebSocket handshake was answered {status}; check \
                 plugin_config.url (its path) and plugin_config.username"
            )),
            Some(Refused::NotMqtt) => ConnectorError::fatal(format!(
                "mqtt broker {url}: the WebSocket server did not accept the \"mqtt\" \
                 subprotocol ({error}); check plugin_config.url"
            )),
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
    /// The WebSocket upgrade answered with an HTTP client error.
    Http(String),
    /// A WebSocket server, but not an MQTT one.
    NotMqtt,
}

/// A WebSocket upgrade answered with a 4xx status (a wrong path, a login
/// refused by a gateway) will be answered so again: fatal. 408 and 429, like
/// 5xx (a proxy without its backend), are worth retrying.
fn websocket_refused(error: &str) -> Option<Refused> {
    // tungstenite's `Error::Http`: "HTTP error: 404 Not Found".
    let status = error.strip_prefix("HTTP error: ")?;
    let code: u16 = status.get(..3)?.parse().ok()?;
    ((400..500).contains(&code) && code != 408 && code != 429)
        .then(|| Refused::Http(status.to_owned()))
}

/// `mqtt://host[:port]`, `mqtts://host[:port]` (and their aliases) or
/// `ws[s]://host[:port][/path]` into host, port and path.
fn parse_url(url: &str) -> Result<Endpoint, PluginConfigError> {
    let expected = "expected mqtt://host:port, mqtts://host:port, ws://host:port/path or \
                    wss://host:port/path";
    let (scheme, rest) = match url.trim().split_once("://") {
        Some(("mqtt" | "tcp", rest)) => (Scheme::Tcp, rest),
        Some(("mqtts" | "ssl" | "tls", rest)) => (Scheme::Tls, rest),
        Some(("ws", rest)) => (Scheme::Ws, rest),
        Some(("wss", rest)) => (Scheme::Wss, rest),
        _ => {
            return Err(PluginConfigError::new(
                "url",
                format!("{url:?}: {expected}"),
            ));
        }
    };
    let (rest, path) = match scheme {
        Scheme::Ws | Scheme::Wss => match rest.find(['/', '?']) {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, ""),
        },
        Scheme::Tcp | Scheme::Tls => (rest, ""),
    };
    if path.contains(['#', ' ']) {
        return Err(PluginConfigError::new(
            "url",
            format!("{url:?}: a WebSocket path without fragment or spaces; {expected}"),
        ));
    }
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
    let port = match (port, scheme) {
        (Some(port), _) => port.parse::<u16>().map_err(|_| bad_port())?,
        (None, Scheme::Tcp) => 1883,
        (None, Scheme::Tls) => 8883,
        (None, Scheme::Ws) => 80,
        (None, Scheme::Wss) => 443,
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
        scheme,
        path: path.to_owned(),
    })
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

    fn endpoint(host: &str, port: u16, scheme: Scheme, path: &str) -> Endpoint {
        Endpoint {
            host: host.into(),
            port,
            scheme,
            path: path.into(),
        }
    }

    #[test]
    fn given_urls_when_checked_should_split_host_and_port_or_name_the_field() {
        use Scheme::{Tcp, Tls, Ws, Wss};
        for (url, expected) in [
            (
                "mqtt://127.0.0.1:1884",
                endpoint("127.0.0.1", 1884, Tcp, ""),
            ),
            ("tcp://broker", endpoint("broker", 1883, Tcp, "")),
            ("mqtt://[::1]:1885", endpoint("::1", 1885, Tcp, "")),
            ("mqtt://[::1]", endpoint("::1", 1883, Tcp, "")),
            ("mqtts://broker", endpoint("broker", 8883, Tls, "")),
            ("ssl://broker:18883", endpoint("broker", 18883, Tls, "")),
            ("ws://x:8080/mqtt", endpoint("x", 8080, Ws, "/mqtt")),
            ("ws://x", endpoint("x", 80, Ws, "")),
            ("ws://[::1]:9001/", endpoint("::1", 9001, Ws, "/")),
            ("wss://x/mqtt?a=b", endpoint("x", 443, Wss, "/mqtt?a=b")),
            ("wss://x:8884/mqtt", endpoint("x", 8884, Wss, "/mqtt")),
        ] {
            assert_eq!(connection(url).check().unwrap(), expected, "{url}");
        }
        for bad in [
            "",
            "broker:1883",
            "http://x",
            "mqtt://x/path",
            "ws://u:p@x/mqtt",
            "ws://x:port/mqtt",
            "wss:///mqtt",
            "ws://x/mqtt#part",
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
    fn given_websocket_answers_when_classified_should_refuse_client_errors_only() {
        assert!(matches!(
            websocket_refused("HTTP error: 404 Not Found"),
            Some(Refused::Http(status)) if status == "404 Not Found"
        ));
        assert!(websocket_refused("HTTP error: 401 Unauthorized").is_some());
        for transient in [
            "HTTP error: 502 Bad Gateway",
            "HTTP error: 429 Too Many Requests",
            "HTTP error: 408 Request Timeout",
            "IO error: connection reset by peer",
        ] {
            assert!(websocket_refused(transient).is_none(), "{transient}");
        }
    }

    #[test]
    fn given_tls_files_when_checked_should_need_mqtts_and_readable_files() {
        for plain in ["mqtt://x", "ws://x/mqtt"] {
            let mut plain = connection(plain);
            plain.tls_files.ca_file = Some("ca.pem".into());
            assert_eq!(plain.check().unwrap_err().field, "url");
        }
        let mut missing = connection("wss://x/mqtt");
        missing.tls_files.ca_file = Some("/nonexistent/ca.pem".into());
        assert_eq!(missing.check().unwrap_err().field, "ca_file");
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
}
