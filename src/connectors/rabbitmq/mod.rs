//! What the rabbitmq source and sink share: where the broker is, how to log
//! in, TLS (AMQPS, with rustls), one connection with one channel whose broker-side events (publisher
//! confirms, returns, a close with its reason) are collected, and how AMQP
//! reply codes map onto the delivery contract.

#[cfg(feature = "rabbitmq-sink")]
pub mod sink;
#[cfg(feature = "rabbitmq-source")]
pub mod source;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use amqprs::callbacks::{ChannelCallback, ConnectionCallback};
use amqprs::channel::Channel;
use amqprs::connection::{Connection, OpenConnectionArguments};
use amqprs::tls::TlsAdaptor;
use amqprs::{Ack, BasicProperties, Cancel, Close, CloseChannel, Nack, Return};
use async_trait::async_trait;
use rustls::pki_types::ServerName;
use secrecy::{ExposeSecret, SecretString};
use tokio::sync::mpsc;

use crate::connectors::kit::tls::{TlsClient, TlsOptions};
use crate::connectors::{ConnectorError, PluginConfigError};

type AmqpResult<T> = Result<T, amqprs::error::Error>;

/// The connection fields both connectors take.
#[derive(Debug, Clone)]
pub struct AmqpConnection {
    pub host: String,
    pub port: Option<u16>,
    pub virtual_host: String,
    pub username: String,
    pub password: SecretString,
    pub connect_timeout: Duration,
    pub heartbeat: Duration,
    pub tls: bool,
    pub tls_files: TlsOptions,
    pub tls_server_name: Option<String>,
}

/// Declares the connection fields inside a connector's config struct (each
/// config declares them, since a flattened struct cannot deny unknown fields).
macro_rules! connection_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            /// A whole AMQP URI, `amqp://user:password@host:port/vhost` or
            /// `amqps://...` (what CloudAMQP or Amazon MQ hand out); a secret.
            /// It gives the host, port, virtual host and (when it has them) the
            /// user and password, and `amqps` turns TLS on; the TLS file fields
            /// still apply. Setting `host`, `port` or `virtual_host` beside it
            /// is an error.
            #[serde(default)]
            #[schemars(with = "Option<String>")]
            pub uri: Option<secrecy::SecretString>,
            /// The broker's host name or address.
            #[serde(default = "crate::connectors::rabbitmq::default_host")]
            pub host: String,
            /// The broker's AMQP port (default 5672, or 5671 with TLS).
            #[serde(default)]
            pub port: Option<u16>,
            /// The virtual host to open.
            #[serde(default = "crate::connectors::rabbitmq::default_virtual_host")]
            pub virtual_host: String,
            /// User name (SASL PLAIN).
            #[serde(default = "crate::connectors::rabbitmq::default_username")]
            pub username: String,
            /// The user's password; a secret.
            #[serde(default = "crate::connectors::rabbitmq::default_password")]
            #[schemars(with = "String")]
            pub password: secrecy::SecretString,
            /// How long connecting and logging in may take before it counts as
            /// failed (and is retried).
            #[serde(
                default = "crate::connectors::rabbitmq::default_connect_timeout",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub connect_timeout: std::time::Duration,
            /// The AMQP heartbeat asked for (whole seconds; `0s` turns it off),
            /// so a dead connection is noticed.
            #[serde(
                default = "crate::connectors::rabbitmq::default_heartbeat",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub heartbeat: std::time::Duration,
            /// Speak TLS (AMQPS) to the broker; on by itself when `ca_file`
            /// or `cert_file` is set.
            #[serde(default)]
            pub tls: bool,
            /// PEM file of the CA certificates to trust (default: the system's).
            #[serde(default)]
            pub ca_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate, for mutual TLS.
            #[serde(default)]
            pub cert_file: Option<std::path::PathBuf>,
            /// PEM file of the client certificate's private key.
            #[serde(default)]
            pub key_file: Option<std::path::PathBuf>,
            /// Verify the broker's certificate and name (on by default).
            #[serde(default = "crate::connectors::rabbitmq::default_true")]
            pub tls_verify: bool,
            /// The name the broker's certificate must hold (default: `host`).
            #[serde(default)]
            pub tls_server_name: Option<String>,
            $($body)*
        }

        impl $name {
            /// The connection the fields (and `uri`, when set) describe.
            pub fn connection(
                &self,
            ) -> Result<crate::connectors::rabbitmq::AmqpConnection, crate::connectors::PluginConfigError> {
                let fields = crate::connectors::rabbitmq::AmqpConnection {
                    host: self.host.clone(),
                    port: self.port,
                    virtual_host: self.virtual_host.clone(),
                    username: self.username.clone(),
                    password: self.password.clone(),
                    connect_timeout: self.connect_timeout,
                    heartbeat: self.heartbeat,
                    tls: self.tls,
                    tls_files: crate::connectors::kit::tls::TlsOptions {
                        ca_file: self.ca_file.clone(),
                        cert_file: self.cert_file.clone(),
                        key_file: self.key_file.clone(),
                        verify: self.tls_verify,
                    },
                    tls_server_name: self.tls_server_name.clone(),
                };
                match &self.uri {
                    None => Ok(fields),
                    Some(uri) => fields.with_uri(secrecy::ExposeSecret::expose_secret(uri)),
                }
            }
        }
    };
}
pub(crate) use connection_fields;

pub fn default_host() -> String {
    "127.0.0.1".into()
}

pub fn default_port() -> u16 {
    5672
}

/// The AMQPS port.
pub fn default_tls_port() -> u16 {
    5671
}

pub fn default_true() -> bool {
    true
}

pub fn default_virtual_host() -> String {
    "/".into()
}

pub fn default_username() -> String {
    "guest".into()
}

pub fn default_password() -> SecretString {
    SecretString::from("guest")
}

pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

pub fn default_heartbeat() -> Duration {
    Duration::from_secs(30)
}

/// The longest AMQP short string (names, routing keys, header names).
pub const SHORT_STR: usize = 255;

/// Checks that `value` of `field` fits an AMQP short string.
pub fn check_short(field: &str, value: &str) -> Result<(), PluginConfigError> {
    if value.len() > SHORT_STR {
        return Err(PluginConfigError::new(
            field,
            format!("expected at most {SHORT_STR} bytes, found {}", value.len()),
        ));
    }
    Ok(())
}

/// What the broker said on the channel, in order.
#[derive(Debug)]
pub enum Event {
    /// Publisher confirm: the messages up to `tag` (or only `tag`) are taken.
    Ack { tag: u64, multiple: bool },
    /// The broker could not take the messages up to `tag` (or only `tag`).
    Nack { tag: u64, multiple: bool },
    /// A `mandatory` message no queue took (`basic.return`); it precedes the
    /// message's ack.
    Returned {
        message_id: Option<String>,
        code: u16,
        text: String,
    },
}

/// A connection with one open channel, and what the broker told it.
pub struct Session {
    connection: Connection,
    pub channel: Channel,
    pub events: mpsc::UnboundedReceiver<Event>,
    closed: Arc<Mutex<Option<(u16, String)>>>,
}

/// Forwards the broker's channel and connection events to the session.
#[derive(Clone)]
struct Callback {
    events: mpsc::UnboundedSender<Event>,
    closed: Arc<Mutex<Option<(u16, String)>>>,
}

impl Callback {
    fn record(&self, code: u16, text: &str) {
        let mut closed = self
            .closed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        closed.get_or_insert_with(|| (code, text.to_owned()));
    }
}

#[async_trait]
impl ConnectionCallback for Callback {
    async fn close(&mut self, _connection: &Connection, close: Close) -> AmqpResult<()> {
        self.record(close.reply_code(), close.reply_text());
        Ok(())
    }

    async fn blocked(&mut self, _connection: &Connection, reason: String) {
        tracing::warn!(%reason, "the RabbitMQ broker blocks publishing (resource alarm)");
    }

    async fn unblocked(&mut self, _connection: &Connection) {}

    async fn secret_updated(&mut self, _connection: &Connection) {}
}

#[async_trait]
impl ChannelCallback for Callback {
    async fn close(&mut self, _channel: &Channel, close: CloseChannel) -> AmqpResult<()> {
        self.record(close.reply_code(), close.reply_text());
        Ok(())
    }

    async fn cancel(&mut self, _channel: &Channel, cancel: Cancel) -> AmqpResult<()> {
        // The queue was deleted or its node went away: the consumer is gone.
        // Transient: consuming again fails for good (404) if the queue is gone.
        self.record(
            0,
            &format!("the broker cancelled consumer {}", cancel.consumer_tag()),
        );
        Ok(())
    }

    async fn flow(&mut self, _channel: &Channel, active: bool) -> AmqpResult<bool> {
        Ok(active)
    }

    async fn publish_ack(&mut self, _channel: &Channel, ack: Ack) {
        let _ = self.events.send(Event::Ack {
            tag: ack.delivery_tag(),
            multiple: ack.mutiple(),
        });
    }

    async fn publish_nack(&mut self, _channel: &Channel, nack: Nack) {
        let _ = self.events.send(Event::Nack {
            tag: nack.delivery_tag(),
            multiple: nack.multiple(),
        });
    }

    async fn publish_return(
        &mut self,
        _channel: &Channel,
        ret: Return,
        properties: BasicProperties,
        _content: Vec<u8>,
    ) {
        let _ = self.events.send(Event::Returned {
            message_id: properties.message_id().cloned(),
            code: ret.reply_code(),
            text: ret.reply_text().clone(),
        });
    }
}

impl AmqpConnection {
    /// These fields with what an AMQP URI gives (RabbitMQ's URI spec: user,
    /// password and virtual host percent-decoded; no path is the default
    /// virtual host "/"). Errors name `uri` and never repeat it (it holds the
    /// password).
    pub fn with_uri(mut self, uri: &str) -> Result<Self, PluginConfigError> {
        let bad = |what: &str| {
            PluginConfigError::new(
                "uri",
                format!("expected amqp://user:password@host:port/vhost or amqps://...: {what}"),
            )
        };
        if self.host != default_host()
            || self.port.is_some()
            || self.virtual_host != default_virtual_host()
        {
            return Err(PluginConfigError::new(
                "uri",
                "gives the host, port and virtual host: leave `host`, `port` and `virtual_host` out beside it",
            ));
        }
        let parsed = url::Url::parse(uri).map_err(|error| bad(&error.to_string()))?;
        self.tls |= match parsed.scheme() {
            "amqp" => false,
            "amqps" => true,
            other => return Err(bad(&format!("the scheme is \"{other}\""))),
        };
        if parsed.query().is_some() || parsed.fragment().is_some() {
            return Err(bad(
                "query parameters are not read (use the heartbeat and connect_timeout fields)",
            ));
        }
        let decode = |text: &str| {
            percent_encoding::percent_decode_str(text)
                .decode_utf8()
                .map(|decoded| decoded.into_owned())
                .map_err(|_| bad("a part is not UTF-8 once percent-decoded"))
        };
        self.host = match parsed.host() {
            Some(url::Host::Ipv6(address)) => address.to_string(),
            Some(host) => host.to_string(),
            None => return Err(bad("no host")),
        };
        self.port = parsed.port();
        if let Some(path) = parsed.path().strip_prefix('/')
            && !path.is_empty()
        {
            self.virtual_host = decode(path)?;
        }
        if !parsed.username().is_empty() {
            self.username = decode(parsed.username())?;
        }
        if let Some(password) = parsed.password() {
            self.password = SecretString::from(decode(password)?);
        }
        Ok(self)
    }

    /// Checks what can be checked without a broker.
    pub fn check(&self) -> Result<(), PluginConfigError> {
        if self.host.trim().is_empty() {
            return Err(PluginConfigError::new(
                "host",
                "expected the broker's host, such as 127.0.0.1",
            ));
        }
        if self.port == Some(0) {
            return Err(PluginConfigError::new(
                "port",
                "expected a port, such as 5672",
            ));
        }
        check_short("virtual_host", &self.virtual_host)?;
        if self.username.is_empty() {
            return Err(PluginConfigError::new("username", "expected a user name"));
        }
        if self.heartbeat.as_secs() > u64::from(u16::MAX) {
            return Err(PluginConfigError::new(
                "heartbeat",
                "expected at most 65535 seconds",
            ));
        }
        if let Some(name) = &self.tls_server_name
            && ServerName::try_from(name.as_str()).is_err()
        {
            return Err(PluginConfigError::new(
                "tls_server_name",
                format!("{name:?} is not a host name or address"),
            ));
        }
        // Reads the files, so a missing or wrong one is a config error.
        self.tls_client()?;
        Ok(())
    }

    /// Whether the connection speaks TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls || self.tls_files.any_file()
    }

    /// The port connected to.
    pub fn port(&self) -> u16 {
        match self.port {
            Some(port) => port,
            None if self.uses_tls() => default_tls_port(),
            None => default_port(),
        }
    }

    /// The TLS config, `None` without TLS.
    fn tls_client(&self) -> Result<Option<TlsClient>, PluginConfigError> {
        if !self.uses_tls() {
            return Ok(None);
        }
        self.tls_files.client().map(Some)
    }

    /// The field naming the host the broker's certificate must be valid for.
    fn server_name_field(&self) -> &'static str {
        match self.tls_server_name {
            Some(_) => "tls_server_name",
            None => "host",
        }
    }

    fn address(&self) -> String {
        let scheme = if self.uses_tls() { "amqps" } else { "amqp" };
        format!(
            "{scheme}://{}:{} (virtual host {:?})",
            self.host,
            self.port(),
            self.virtual_host
        )
    }

    /// Opens a connection named `name` and one channel on it, once (the
    /// engine retries a transient failure).
    ///
    /// RabbitMQ answers bad credentials by closing (or resetting) the socket
    /// right after the login (this client cannot ask for the explicit
    /// refusal), and it only listens once it has booted: a login cut off is
    /// taken as refused credentials, which is fatal, while a broker that is
    /// down or starting refuses the TCP connection, which is transient.
    pub async fn open(&self, name: &str) -> Result<Session, ConnectorError> {
        let tls = self
            .tls_client()
            .map_err(|error| ConnectorError::fatal(format!("plugin_config.{error}")))?;
        let opening = match self.connect(name, tls.as_ref()).await {
            Ok(session) => return Ok(session),
            Err(opening) => opening,
        };
        let Some(tls) = tls else {
            return Err(opening.into_error(self));
        };
        let refused = match &opening {
            Opening::CutOff(text) | Opening::Failed(text) => {
                tls.refusal(self.server_name_field(), &self.address(), text)
            }
            Opening::Refused(_) => None,
        };
        if let Some(refused) = refused {
            return Err(refused);
        }
        // A broker refusing our certificate (TLS 1.3 checks it after the
        // handshake) resets the connection as one refusing the login does.
        if matches!(opening, Opening::CutOff(_)) && !self.speaks_amqp_over(&tls).await {
            let fix = match self.tls_files.cert_file {
                Some(_) => "it does not trust cert_file; use a certificate its CA signed",
                None => "it wants a client certificate; set cert_file and key_file",
            };
            return Err(ConnectorError::fatal(format!(
                "plugin_config.cert_file: RabbitMQ at {} closed the TLS connection before \
                 speaking AMQP: {fix}",
                self.address()
            )));
        }
        Err(opening.into_error(self))
    }

    /// Whether the broker answers the AMQP protocol header over TLS with its
    /// `connection.start` (a frame of type 1), before any login.
    async fn speaks_amqp_over(&self, tls: &TlsClient) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let name = self.tls_server_name.as_ref().unwrap_or(&self.host).clone();
        let Ok(server_name) = ServerName::try_from(name) else {
            return false;
        };
        let answer = async {
            let stream = tokio::net::TcpStream::connect((self.host.as_str(), self.port())).await?;
            let mut stream = tokio_rustls::TlsConnector::from(tls.config.clone())
                .connect(server_name, stream)
                .await?;
            stream.write_all(b"AMQP\x00\x00\x09\x01").await?;
            stream.flush().await?;
            stream.read_u8().await
        };
        matches!(
            tokio::time::timeout(self.connect_timeout, answer).await,
            Ok(Ok(1))
        )
    }

    async fn connect(&self, name: &str, tls: Option<&TlsClient>) -> Result<Session, Opening> {
        let mut arguments = OpenConnectionArguments::new(
            &self.host,
            self.port(),
            &self.username,
            self.password.expose_secret(),
        );
        arguments
            .virtual_host(&self.virtual_host)
            .connection_name(name)
            .heartbeat(u16::try_from(self.heartbeat.as_secs()).unwrap_or(u16::MAX));
        if let Some(tls) = tls {
            let domain = self.tls_server_name.as_ref().unwrap_or(&self.host).clone();
            let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
            arguments.tls_adaptor(TlsAdaptor::new(connector, domain));
        }
        let connection = tokio::time::timeout(self.connect_timeout, Connection::open(&arguments))
            .await
            .map_err(|_| Opening::Failed(format!("no answer within {:?}", self.connect_timeout)))?
            .map_err(|error| match error {
                amqprs::error::Error::NetworkError(text)
                    if text.contains("peer shutdown") || text.contains("reset by peer") =>
                {
                    Opening::CutOff(text)
                }
                amqprs::error::Error::ConnectionOpenError(text) => Opening::Refused(text),
                other => Opening::Failed(other.to_string()),
            })?;
        let (sender, events) = mpsc::unbounded_channel();
        let callback = Callback {
            events: sender,
            closed: Arc::new(Mutex::new(None)),
        };
        let closed = callback.closed.clone();
        let failed = |error: amqprs::error::Error| Opening::Failed(error.to_string());
        connection
            .register_callback(callback.clone())
            .await
            .map_err(failed)?;
        let channel = tokio::time::timeout(self.connect_timeout, connection.open_channel(None))
            .await
            .map_err(|_| Opening::Failed("opening a channel timed out".into()))?
            .map_err(failed)?;
        channel.register_callback(callback).await.map_err(failed)?;
        Ok(Session {
            connection,
            channel,
            events,
            closed,
        })
    }
}

/// Why opening a connection failed.
enum Opening {
    /// The broker closed the socket during the login.
    CutOff(String),
    /// The broker refused the connection with a reason (`connection.close`).
    Refused(String),
    Failed(String),
}

impl Opening {
    fn into_error(self, connection: &AmqpConnection) -> ConnectorError {
        let address = connection.address();
        match self {
            Opening::CutOff(text) => ConnectorError::fatal(format!(
                "plugin_config.username/password: RabbitMQ at {address} refused the login of \
                 {:?} ({text}); fix the credentials (or the user's permissions)",
                connection.username
            )),
            Opening::Refused(text) if text.contains("ACCESS_REFUSED") => {
                ConnectorError::fatal(format!(
                    "plugin_config.username/password: RabbitMQ at {address} refused the login: {text}"
                ))
            }
            Opening::Refused(text) if text.contains("NOT_ALLOWED") => {
                ConnectorError::fatal(format!(
                    "plugin_config.virtual_host: RabbitMQ at {address} refused the virtual host \
                     (missing, or the user has no access to it): {text}"
                ))
            }
            Opening::Refused(text) | Opening::Failed(text) => {
                ConnectorError::transient(format!("RabbitMQ at {address}: {text}"))
            }
        }
    }
}

impl Session {
    /// Whether the connection and the channel are still open.
    pub fn is_open(&self) -> bool {
        self.connection.is_open() && self.channel.is_open()
    }

    /// The reply code and text the broker closed the channel or the
    /// connection with, if it did.
    pub fn closed(&self) -> Option<(u16, String)> {
        self.closed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// What `error`, met while doing `action` (about `field` of the config),
    /// means: the broker's reason when it closed the channel decides.
    pub fn error(
        &self,
        field: &str,
        action: &str,
        error: impl std::fmt::Display,
    ) -> ConnectorError {
        match self.closed() {
            Some((code, text)) => classify(field, action, code, &text),
            None => ConnectorError::transient(format!("RabbitMQ {action}: {error}")),
        }
    }

    /// Closes the channel and the connection (the broker requeues what the
    /// channel had delivered and nobody acknowledged).
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.channel.close()).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), self.connection.close()).await;
    }
}

/// What a broker's close reply code means. Codes are AMQP 0-9-1's.
pub fn classify(field: &str, action: &str, code: u16, text: &str) -> ConnectorError {
    match code {
        // ACCESS_REFUSED: no permission; NOT_FOUND: no such exchange or
        // queue; PRECONDITION_FAILED: declared with other settings;
        // NOT_ALLOWED: the virtual host.
        403 => ConnectorError::fatal(format!(
            "plugin_config.username: RabbitMQ refused {action}: {code} {text}; grant the user \
             the permission"
        )),
        404 | 406 => ConnectorError::fatal(format!(
            "plugin_config.{field}: RabbitMQ refused {action}: {code} {text}; fix the name, \
             declare it, or match its settings"
        )),
        530 => ConnectorError::fatal(format!(
            "plugin_config.virtual_host: RabbitMQ refused {action}: {code} {text}"
        )),
        // CONNECTION_FORCED (a broker stopping), RESOURCE_ERROR, INTERNAL_ERROR, ...
        _ => ConnectorError::transient(format!("RabbitMQ {action}: {code} {text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> AmqpConnection {
        AmqpConnection {
            host: default_host(),
            port: None,
            virtual_host: default_virtual_host(),
            username: default_username(),
            password: default_password(),
            connect_timeout: default_connect_timeout(),
            heartbeat: default_heartbeat(),
            tls: false,
            tls_files: TlsOptions {
                ca_file: None,
                cert_file: None,
                key_file: None,
                verify: true,
            },
            tls_server_name: None,
        }
    }

    #[test]
    fn given_a_bad_connection_field_when_checked_should_name_it() {
        connection().check().unwrap();
        let cases = [
            (
                AmqpConnection {
                    host: " ".into(),
                    ..connection()
                },
                "host",
            ),
            (
                AmqpConnection {
                    port: Some(0),
                    ..connection()
                },
                "port",
            ),
            (
                AmqpConnection {
                    username: String::new(),
                    ..connection()
                },
                "username",
            ),
            (
                AmqpConnection {
                    virtual_host: "v".repeat(256),
                    ..connection()
                },
                "virtual_host",
            ),
            (
                AmqpConnection {
                    heartbeat: Duration::from_secs(70_000),
                    ..connection()
                },
                "heartbeat",
            ),
        ];
        for (bad, field) in cases {
            assert_eq!(bad.check().unwrap_err().field, field);
        }
    }

    #[test]
    fn given_tls_settings_when_checked_should_pick_the_port_and_name_bad_fields() {
        assert_eq!(connection().port(), 5672);
        let tls = AmqpConnection {
            tls: true,
            ..connection()
        };
        assert!(tls.uses_tls());
        assert_eq!(tls.port(), 5671);
        assert_eq!(
            AmqpConnection {
                port: Some(5000),
                ..tls.clone()
            }
            .port(),
            5000
        );
        let mut by_file = connection();
        by_file.tls_files.ca_file = Some("/nonexistent/ca.pem".into());
        assert!(by_file.uses_tls());
        let error = by_file.check().unwrap_err();
        assert_eq!(error.field, "ca_file");
        assert!(error.message.contains("/nonexistent/ca.pem"), "{error}");
        let named = AmqpConnection {
            tls_server_name: Some("not a host!".into()),
            ..tls
        };
        assert_eq!(named.check().unwrap_err().field, "tls_server_name");
    }

    #[test]
    fn given_a_close_code_when_classified_should_say_what_retrying_can_fix() {
        assert!(!classify("queue", "consume", 404, "NOT_FOUND").is_transient());
        assert!(
            classify("queue", "consume", 404, "NOT_FOUND")
                .to_string()
                .contains("plugin_config.queue")
        );
        assert!(!classify("queue", "consume", 403, "ACCESS_REFUSED").is_transient());
        assert!(classify("queue", "consume", 320, "CONNECTION_FORCED").is_transient());
        assert!(classify("queue", "consume", 541, "INTERNAL_ERROR").is_transient());
    }

    #[test]
    fn given_an_amqps_uri_when_applied_should_give_host_port_vhost_login_and_tls() {
        let given = connection()
            .with_uri("amqps://ann%40shop:p%3Ass@broker.example:5999/shop%2Fprod")
            .unwrap();
        assert_eq!(
            (
                given.host.as_str(),
                given.port(),
                given.virtual_host.as_str(),
                given.username.as_str(),
                given.password.expose_secret(),
                given.uses_tls(),
            ),
            (
                "broker.example",
                5999,
                "shop/prod",
                "ann@shop",
                "p:ss",
                true
            )
        );
        // No port: the scheme's; no path: the default virtual host; no login:
        // the fields' user and password.
        let plain = connection().with_uri("amqp://[::1]").unwrap();
        assert_eq!(
            (
                plain.host.as_str(),
                plain.port(),
                plain.virtual_host.as_str(),
                plain.username.as_str()
            ),
            ("::1", 5672, "/", "guest")
        );
        assert!(!plain.uses_tls());
        assert_eq!(connection().with_uri("amqps://h/").unwrap().port(), 5671);
    }

    #[test]
    fn given_a_bad_uri_or_fields_beside_it_when_applied_should_name_uri_without_repeating_it() {
        for (fields, uri, says) in [
            (
                connection(),
                "http://u:secretword@h/",
                "the scheme is \"http\"",
            ),
            (
                connection(),
                "amqp://u:secretword@h/v?heartbeat=10",
                "query parameters",
            ),
            (connection(), "not a uri secretword", "expected amqp://"),
            (
                AmqpConnection {
                    host: "other".into(),
                    ..connection()
                },
                "amqp://u:secretword@h/",
                "leave `host`, `port` and `virtual_host` out",
            ),
        ] {
            let error = fields.with_uri(uri).unwrap_err();
            let text = error.to_string();
            assert!(text.contains("uri") && text.contains(says), "{uri}: {text}");
            assert!(!text.contains("secretword"), "the password leaked: {text}");
        }
    }
}
