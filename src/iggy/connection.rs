//! Connecting to an Iggy server over TCP with the `[iggy]` settings: username and
//! password or a personal access token (also `file:<path>`), optional TLS, and
//! automatic reconnection after a broken connection.

use std::sync::Arc;
use std::time::Duration;

use iggy::prelude::{
    AutoLogin, Client, ClientWrapper, Credentials, IggyClient, IggyDuration, NonZeroIggyDuration,
    TcpClient, TcpClientConfig, TcpClientReconnectionConfig,
};
use secrecy::{ExposeSecret, SecretString};

use crate::config::runtime::{IggyConfig, TopicDurability};
use crate::iggy::BusError;
use crate::iggy::settings::SettingsError;
use crate::iggy::tls::TlsSettings;

const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// Bounds the handshake that explains a failed TLS connect.
const TLS_DIAGNOSIS_TIMEOUT: Duration = Duration::from_secs(5);

/// Everything needed to open connections, resolved once from the config.
#[derive(Clone)]
pub struct ConnectionSettings {
    address: String,
    credentials: CredentialsSource,
    tls: Option<TlsSettings>,
    /// Bounds every request, so a stalled broker turns into an error the engine
    /// can count and retry instead of a send that never returns.
    pub request_timeout: Duration,
    /// How long a sink may go without storing an offset while its topic has
    /// messages past them before it counts as stalled (`[iggy] sink_stall_timeout`).
    pub stall_timeout: Duration,
    /// The durability of the topics producers create (`[iggy] topic_durability`).
    pub topic_durability: TopicDurability,
}

#[derive(Clone)]
enum CredentialsSource {
    Password {
        username: String,
        password: SecretString,
    },
    Token(SecretString),
}

impl ConnectionSettings {
    pub fn from_config(config: &IggyConfig) -> Result<Self, SettingsError> {
        let token = config.token.expose_secret().trim();
        let credentials = if !token.is_empty() {
            CredentialsSource::Token(read_token(token)?)
        } else if config.username.is_empty() || config.password.expose_secret().is_empty() {
            return Err(SettingsError::MissingCredentials);
        } else {
            CredentialsSource::Password {
                username: config.username.clone(),
                password: config.password.clone(),
            }
        };
        Ok(Self {
            address: config.address.clone(),
            credentials,
            tls: TlsSettings::from_config(&config.tls, &config.address)?,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stall_timeout: config.sink_stall_timeout,
            topic_durability: config.topic_durability,
        })
    }

    /// Settings for a plain connection with username and password (tests, benches).
    pub fn password(address: impl Into<String>, username: &str, password: &str) -> Self {
        Self {
            address: address.into(),
            credentials: CredentialsSource::Password {
                username: username.to_owned(),
                password: SecretString::from(password),
            },
            tls: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            stall_timeout: IggyConfig::default().sink_stall_timeout,
            topic_durability: TopicDurability::default(),
        }
    }

    /// Opens and signs in a new connection.
    pub async fn connect(&self) -> Result<Arc<IggyClient>, BusError> {
        let credentials = match &self.credentials {
            CredentialsSource::Password { username, password } => {
                Credentials::UsernamePassword(username.clone(), password.clone())
            }
            CredentialsSource::Token(token) => Credentials::PersonalAccessToken(token.clone()),
        };
        let config = TcpClientConfig {
            server_address: self.address.clone(),
            tls_enabled: self.tls.is_some(),
            tls_domain: self
                .tls
                .as_ref()
                .map(|tls| tls.domain.clone())
                .unwrap_or_default(),
            tls_ca_file: self
                .tls
                .as_ref()
                .map(|tls| tls.ca_file.display().to_string()),
            auto_login: AutoLogin::Enabled(credentials),
            reconnection: TcpClientReconnectionConfig {
                enabled: true,
                // Bounded, so a request during an outage fails within seconds and
                // the engine's own retry (with its NACK accounting) takes over.
                max_retries: Some(1),
                interval: NonZeroIggyDuration::ONE_SECOND,
                reestablish_after: IggyDuration::from(Duration::from_secs(1)),
            },
            nodelay: true,
            ..TcpClientConfig::default()
        };
        let tcp = TcpClient::create(Arc::new(config)).map_err(|error| {
            BusError::Unavailable(format!(
                "invalid connection settings for {}: {error}",
                self.address
            ))
        })?;
        let client = IggyClient::new(ClientWrapper::Tcp(tcp));
        let failure = match tokio::time::timeout(self.request_timeout, client.connect()).await {
            Ok(Ok(())) => return Ok(Arc::new(client)),
            Ok(Err(error)) => format!("cannot connect to Iggy at {}: {error}", self.address),
            Err(_) => format!(
                "connecting to Iggy at {} timed out after {:?}",
                self.address, self.request_timeout
            ),
        };
        drop(client);
        Err(BusError::Unavailable(self.explain(failure).await))
    }

    /// Adds why the TLS handshake fails, when TLS is on and it does.
    async fn explain(&self, failure: String) -> String {
        let Some(tls) = &self.tls else {
            return failure;
        };
        match tls.diagnose(&self.address, TLS_DIAGNOSIS_TIMEOUT).await {
            Some(reason) => format!("{failure}; {reason}"),
            None => failure,
        }
    }
}

/// Reads a token given inline or as `file:<path>` (`~` expanded, trimmed).
fn read_token(token: &str) -> Result<SecretString, SettingsError> {
    let Some(path) = token.strip_prefix("file:") else {
        return Ok(SecretString::from(token));
    };
    let path = match path.strip_prefix("~/") {
        Some(rest) => {
            std::env::var("HOME").map_or_else(|_| path.to_owned(), |home| format!("{home}/{rest}"))
        }
        None => path.to_owned(),
    };
    let content = std::fs::read_to_string(&path).map_err(|error| SettingsError::TokenFile {
        path: path.clone(),
        reason: error.to_string(),
    })?;
    let content = content.trim();
    if content.is_empty() {
        return Err(SettingsError::EmptyTokenFile { path });
    }
    Ok(SecretString::from(content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_token_file_when_read_should_trim_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pat");
        std::fs::write(&path, "  iggypat-abc\n").unwrap();
        let token = read_token(&format!("file:{}", path.display())).unwrap();
        assert_eq!(token.expose_secret(), "iggypat-abc");
    }

    #[test]
    fn given_a_missing_or_empty_token_file_when_read_should_fail_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let error = read_token(&format!("file:{}", missing.display()))
            .err()
            .unwrap();
        assert!(error.to_string().contains("nope"), "{error}");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").unwrap();
        let error = read_token(&format!("file:{}", empty.display()))
            .err()
            .unwrap();
        assert_eq!(
            error,
            SettingsError::EmptyTokenFile {
                path: empty.display().to_string()
            }
        );
    }

    #[test]
    fn given_tls_enabled_without_a_ca_file_when_resolved_should_be_a_config_error() {
        let mut config = IggyConfig::default();
        config.tls.enabled = true;
        assert_eq!(
            ConnectionSettings::from_config(&config).err(),
            Some(SettingsError::MissingTlsCaFile)
        );
    }

    #[test]
    fn given_no_token_and_no_password_when_resolved_should_fail() {
        let config = IggyConfig {
            password: SecretString::from(""),
            ..IggyConfig::default()
        };
        assert_eq!(
            ConnectionSettings::from_config(&config).err(),
            Some(SettingsError::MissingCredentials)
        );
    }
}
