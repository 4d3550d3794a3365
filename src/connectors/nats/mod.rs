//! What the nats source and sink share: where the server is, how to log in,
//! TLS, and which connect failures no retry can fix.

#[cfg(feature = "nats-sink")]
pub mod sink;
#[cfg(feature = "nats-source")]
pub mod source;

use std::path::PathBuf;
use std::time::Duration;

use async_nats::{ConnectErrorKind, ConnectOptions};
use secrecy::{ExposeSecret, SecretString};

use crate::connectors::{ConnectorError, PluginConfigError};

/// The connection fields both connectors take (each config declares them,
/// since a flattened struct cannot deny unknown fields).
#[derive(Debug, Clone)]
pub struct NatsConnection {
    pub url: String,
    pub username: Option<String>,
    pub password: Option<SecretString>,
    pub token: Option<SecretString>,
    pub tls: bool,
    pub tls_ca_file: Option<PathBuf>,
    pub connect_timeout: Duration,
}

/// Declares the connection fields inside a connector's config struct.
macro_rules! connection_fields {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($body:tt)* }) => {
        $(#[$meta])*
        $vis struct $name {
            /// The server, `nats://host:port` (several: comma-separated; the
            /// client fails over between them).
            #[serde(default = "crate::connectors::nats::default_url")]
            pub url: String,
            /// User name (with `password`).
            #[serde(default)]
            pub username: Option<String>,
            /// The user's password; a secret.
            #[serde(default)]
            #[schemars(with = "Option<String>")]
            pub password: Option<secrecy::SecretString>,
            /// An authentication token; a secret. Wins over username and password.
            #[serde(default)]
            #[schemars(with = "Option<String>")]
            pub token: Option<secrecy::SecretString>,
            /// Require TLS to the server.
            #[serde(default)]
            pub tls: bool,
            /// PEM file of the CA that signed the server's certificate (implies `tls`).
            #[serde(default)]
            pub tls_ca_file: Option<std::path::PathBuf>,
            /// How long connecting may take before it counts as failed (and is retried).
            #[serde(
                default = "crate::connectors::nats::default_connect_timeout",
                with = "crate::config::duration"
            )]
            #[schemars(with = "crate::config::duration::Text")]
            pub connect_timeout: std::time::Duration,
            $($body)*
        }

        impl $name {
            pub fn connection(&self) -> crate::connectors::nats::NatsConnection {
                crate::connectors::nats::NatsConnection {
                    url: self.url.clone(),
                    username: self.username.clone(),
                    password: self.password.clone(),
                    token: self.token.clone(),
                    tls: self.tls,
                    tls_ca_file: self.tls_ca_file.clone(),
                    connect_timeout: self.connect_timeout,
                }
            }
        }
    };
}
pub(crate) use connection_fields;

pub fn default_url() -> String {
    "nats://127.0.0.1:4222".into()
}

pub fn default_connect_timeout() -> Duration {
    Duration::from_secs(5)
}

impl NatsConnection {
    /// Checks what can be checked without a server.
    pub fn check(&self) -> Result<(), PluginConfigError> {
        if self.url.trim().is_empty() {
            return Err(PluginConfigError::new(
                "url",
                "expected a server such as nats://127.0.0.1:4222",
            ));
        }
        match (&self.username, &self.password) {
            (Some(_), None) => Err(PluginConfigError::new(
                "password",
                "username and password go together",
            )),
            (None, Some(_)) => Err(PluginConfigError::new(
                "username",
                "username and password go together",
            )),
            _ => Ok(()),
        }
    }

    /// Connects, naming `name` to the server. The client reconnects on its
    /// own after a connection is lost; what was in flight then fails and the
    /// engine retries it.
    pub async fn connect(&self, name: &str) -> Result<async_nats::Client, ConnectorError> {
        crate::connectors::kit::crypto::ensure_default_provider();
        let mut options = ConnectOptions::new()
            .name(name)
            .connection_timeout(self.connect_timeout)
            .reconnect_delay_callback(|attempts| {
                Duration::from_millis((attempts as u64 * 100).min(2_000))
            });
        // A token, when set, wins over username and password.
        if let Some(token) = &self.token {
            options = options.token(token.expose_secret().to_owned());
        } else if let (Some(username), Some(password)) = (&self.username, &self.password) {
            options =
                options.user_and_password(username.clone(), password.expose_secret().to_owned());
        }
        if self.tls || self.tls_ca_file.is_some() {
            options = options.require_tls(true);
        }
        if let Some(ca_file) = &self.tls_ca_file {
            options = options.add_root_certificates(ca_file.clone());
        }
        let servers: Vec<&str> = self.url.split(',').map(str::trim).collect();
        options
            .connect(servers.as_slice())
            .await
            .map_err(|error| match error.kind() {
                ConnectErrorKind::Authentication | ConnectErrorKind::AuthorizationViolation => {
                    ConnectorError::fatal(format!(
                        "nats server {}: {error}; check plugin_config.username/password or token",
                        self.url
                    ))
                }
                ConnectErrorKind::ServerParse => ConnectorError::fatal(format!(
                    "plugin_config.url: {error}; expected nats://host:port"
                )),
                ConnectErrorKind::Tls => ConnectorError::fatal(format!(
                    "nats server {}: {error}; check plugin_config.tls_ca_file",
                    self.url
                )),
                // A certificate rustls refused comes back as an I/O error;
                // retrying cannot change it.
                ConnectErrorKind::Io
                    if crate::connectors::kit::tls::refused_their_certificate(
                        &error.to_string(),
                    ) =>
                {
                    ConnectorError::fatal(format!(
                        "plugin_config.tls_ca_file: nats server {}: {error}; set tls_ca_file to \
                         the CA that signed the server's certificate",
                        self.url
                    ))
                }
                _ => ConnectorError::transient(format!("nats server {}: {error}", self.url)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> NatsConnection {
        NatsConnection {
            url: default_url(),
            username: None,
            password: None,
            token: None,
            tls: false,
            tls_ca_file: None,
            connect_timeout: default_connect_timeout(),
        }
    }

    #[test]
    fn given_half_of_a_login_when_checked_should_name_the_missing_half() {
        connection().check().unwrap();
        let half = NatsConnection {
            username: Some("u".into()),
            ..connection()
        };
        assert_eq!(half.check().unwrap_err().field, "password");
        let other_half = NatsConnection {
            password: Some("p".into()),
            ..connection()
        };
        assert_eq!(other_half.check().unwrap_err().field, "username");
    }
}
