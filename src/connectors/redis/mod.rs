//! What the redis source and sink share: one multiplexed connection, opened
//! again after a transport error, and how Redis errors map onto the delivery
//! contract.

#[cfg(feature = "redis-sink")]
pub mod sink;
#[cfg(feature = "redis-source")]
pub mod source;

use std::path::{Path, PathBuf};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, ErrorKind, RedisError, ServerErrorKind, TlsCertificates,
};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use secrecy::{ExposeSecret, SecretString};

use crate::connectors::kit::tls::{self, TlsOptions};
use crate::connectors::{ConnectorError, PluginConfigError};

/// A connection to one Redis server, opened on first use and again after a
/// transport error (a restarted server, a dropped socket).
pub struct Connection {
    client: redis::Client,
    settings: AsyncConnectionConfig,
    current: tokio::sync::Mutex<Option<MultiplexedConnection>>,
    /// The CA file a `rediss://` server's certificate must be signed by
    /// (`None`: the system's CAs).
    ca_file: Option<PathBuf>,
}

impl Connection {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`, `rediss://` for
    /// TLS) and reads the TLS files; `response_timeout` bounds every command
    /// (a blocking read adds its own block time to it).
    pub fn new(
        url: &SecretString,
        tls: &TlsOptions,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, PluginConfigError> {
        crate::connectors::kit::crypto::ensure_default_provider();
        let url_error = |error: RedisError| {
            PluginConfigError::new(
                "url",
                format!(
                    "expected redis://[user:password@]host:port[/db] or rediss://...: {}",
                    error.detail().unwrap_or(error.category())
                ),
            )
        };
        let client = if tls.any_file() {
            let certificates = certificates(url, tls)?;
            redis::Client::build_with_tls(url.expose_secret(), certificates).map_err(url_error)?
        } else {
            redis::Client::open(url.expose_secret()).map_err(url_error)?
        };
        let settings = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        Ok(Self {
            client,
            settings,
            current: tokio::sync::Mutex::new(None),
            ca_file: tls.ca_file.clone(),
        })
    }

    /// What a failed connect means when a certificate is to blame: fatal,
    /// naming the field to fix (retrying cannot change a certificate).
    /// rustls's refusals reach us as the text of an I/O error.
    pub fn tls_refusal(&self, error: &RedisError) -> Option<ConnectorError> {
        let text = error.to_string();
        if tls::refused_their_certificate(&text) {
            let trusted = match &self.ca_file {
                Some(path) => format!("the CA in {}", path.display()),
                None => "the system's CAs".to_owned(),
            };
            return Some(ConnectorError::fatal(format!(
                "plugin_config.ca_file: the redis server's TLS certificate was refused against \
                 {trusted} ({text}); set ca_file to the CA that signed it"
            )));
        }
        tls::refused_our_certificate(&text).then(|| {
            ConnectorError::fatal(format!(
                "plugin_config.cert_file: the redis server refused the TLS handshake \
                 ({text}); it wants a client certificate (cert_file and key_file) signed \
                 by a CA it trusts"
            ))
        })
    }

    /// The open connection, or a new one.
    pub async fn get(&self) -> Result<MultiplexedConnection, RedisError> {
        let mut current = self.current.lock().await;
        if let Some(connection) = current.as_ref() {
            return Ok(connection.clone());
        }
        let connection = self
            .client
            .get_multiplexed_async_connection_with_config(&self.settings)
            .await?;
        *current = Some(connection.clone());
        Ok(connection)
    }

    /// Forgets the connection after `error` when it is a transport error, so
    /// the next [`get`](Self::get) opens a new one.
    pub async fn forget_after(&self, error: &RedisError) {
        if matches!(classify(error), Class::Transient) && is_transport(error) {
            self.current.lock().await.take();
        }
    }

    /// A connection for the pub/sub mode (a connection of its own).
    #[cfg(feature = "redis-source")]
    pub async fn pubsub(&self) -> Result<redis::aio::PubSub, RedisError> {
        self.client.get_async_pubsub().await
    }

    /// Runs one command, forgetting the connection after a transport error.
    pub async fn query<T: redis::FromRedisValue>(
        &self,
        command: &redis::Cmd,
    ) -> Result<T, RedisError> {
        let mut connection = self.get().await?;
        let answer = command.query_async(&mut connection).await;
        if let Err(error) = &answer {
            self.forget_after(error).await;
        }
        answer
    }
}

/// A connector's `ca_file`, `cert_file` and `key_file` (the check of the
/// server's certificate cannot be turned off).
pub fn tls_files(
    ca_file: &Option<PathBuf>,
    cert_file: &Option<PathBuf>,
    key_file: &Option<PathBuf>,
) -> TlsOptions {
    TlsOptions {
        ca_file: ca_file.clone(),
        cert_file: cert_file.clone(),
        key_file: key_file.clone(),
        verify: true,
    }
}

/// The TLS files as the redis client takes them, each checked here so a
/// bad one is named by its field.
fn certificates(
    url: &SecretString,
    tls: &TlsOptions,
) -> Result<TlsCertificates, PluginConfigError> {
    tls.check()?;
    if !url.expose_secret().starts_with("rediss://") {
        return Err(PluginConfigError::new(
            "url",
            "expected a rediss:// url: ca_file, cert_file and key_file are for TLS",
        ));
    }
    let root_cert = tls
        .ca_file
        .as_deref()
        .map(|path| certificate_file("ca_file", path))
        .transpose()?;
    let client_tls = match (&tls.cert_file, &tls.key_file) {
        (Some(cert_file), Some(key_file)) => {
            let client_key = read("key_file", key_file)?;
            PrivateKeyDer::from_pem_slice(&client_key).map_err(|error| {
                file_error("key_file", key_file, format!("no private key: {error}"))
            })?;
            Some(ClientTlsConfig {
                client_cert: certificate_file("cert_file", cert_file)?,
                client_key,
            })
        }
        _ => None,
    };
    Ok(TlsCertificates {
        client_tls,
        root_cert,
    })
}

/// A PEM file holding at least one certificate, as read.
fn certificate_file(field: &str, path: &Path) -> Result<Vec<u8>, PluginConfigError> {
    let pem = read(field, path)?;
    let certificates = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| file_error(field, path, format!("not a PEM certificate: {error}")))?;
    if certificates.is_empty() {
        return Err(file_error(field, path, "holds no certificate".into()));
    }
    Ok(pem)
}

fn read(field: &str, path: &Path) -> Result<Vec<u8>, PluginConfigError> {
    std::fs::read(path).map_err(|error| file_error(field, path, error.to_string()))
}

fn file_error(field: &str, path: &Path, reason: String) -> PluginConfigError {
    PluginConfigError::new(field, format!("{}: {reason}", path.display()))
}

/// What an error from Redis means for the work that met it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// Try the same work again later: the connection, a timeout, a server
    /// loading its data set, out of memory, a replica that cannot take writes.
    Transient,
    /// Retrying cannot help: bad credentials, missing permissions.
    Fatal,
    /// The server refused this command for good (a key of another type).
    Refused,
}

pub fn classify(error: &RedisError) -> Class {
    if is_transport(error) {
        return Class::Transient;
    }
    match error.kind() {
        ErrorKind::AuthenticationFailed
        | ErrorKind::InvalidClientConfig
        | ErrorKind::Server(ServerErrorKind::NoPerm) => return Class::Fatal,
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
            | ServerErrorKind::TryAgain
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::ClusterDown,
        ) => return Class::Transient,
        _ => {}
    }
    match error.code() {
        Some("NOAUTH" | "WRONGPASS" | "NOPERM") => Class::Fatal,
        Some("OOM" | "BUSY" | "LOADING" | "TRYAGAIN" | "MASTERDOWN" | "READONLY") => {
            Class::Transient
        }
        _ => Class::Refused,
    }
}

fn is_transport(error: &RedisError) -> bool {
    error.is_io_error()
        || error.is_connection_refusal()
        || error.is_timeout()
        || error.is_connection_dropped()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_io_error_when_classified_should_be_transient() {
        let error = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(classify(&error), Class::Transient);
    }

    #[test]
    fn given_auth_failure_when_classified_should_be_fatal() {
        let error = RedisError::from((ErrorKind::AuthenticationFailed, "auth"));
        assert_eq!(classify(&error), Class::Fatal);
    }

    fn no_tls() -> TlsOptions {
        tls_files(&None, &None, &None)
    }

    #[test]
    fn given_bad_url_when_built_should_name_the_field() {
        let error = Connection::new(
            &SecretString::from("http://nowhere"),
            &no_tls(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert_eq!(error.field, "url");
    }

    #[test]
    fn given_tls_files_when_built_should_need_rediss_and_name_each_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "").unwrap();
        let build = |url: &str, tls: TlsOptions| {
            Connection::new(
                &SecretString::from(url),
                &tls,
                Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .err()
            .map(|error| error.field)
        };
        let with_ca = |path: &Path| TlsOptions {
            ca_file: Some(path.to_owned()),
            ..no_tls()
        };
        assert_eq!(
            build("redis://127.0.0.1:1", with_ca(&empty)).as_deref(),
            Some("url")
        );
        let missing = dir.path().join("missing.pem");
        assert_eq!(
            build("rediss://127.0.0.1:1", with_ca(&missing)).as_deref(),
            Some("ca_file")
        );
        assert_eq!(
            build("rediss://127.0.0.1:1", with_ca(&empty)).as_deref(),
            Some("ca_file")
        );
        let cert_alone = TlsOptions {
            cert_file: Some(empty.clone()),
            ..no_tls()
        };
        assert_eq!(
            build("rediss://127.0.0.1:1", cert_alone).as_deref(),
            Some("key_file")
        );
        assert_eq!(build("rediss://127.0.0.1:1", no_tls()), None);
    }

    #[test]
    fn given_a_refused_certificate_when_explained_should_be_fatal_naming_the_field() {
        let connection = Connection::new(
            &SecretString::from("rediss://127.0.0.1:1"),
            &no_tls(),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .unwrap();
        let io = |text: &str| RedisError::from(std::io::Error::other(text.to_owned()));
        let refused = connection
            .tls_refusal(&io("invalid peer certificate: UnknownIssuer"))
            .unwrap();
        assert!(!refused.is_transient());
        assert!(
            refused.to_string().contains("plugin_config.ca_file"),
            "{refused}"
        );
        let alert = connection
            .tls_refusal(&io("received fatal alert: CertificateRequired"))
            .unwrap();
        assert!(
            alert.to_string().contains("plugin_config.cert_file"),
            "{alert}"
        );
        assert!(connection.tls_refusal(&io("connection refused")).is_none());
    }
}
