//! What the redis source and sink share: one multiplexed connection, opened
//! again after a transport error, and how Redis errors map onto the delivery
//! contract.

#[cfg(feature = "redis-sink")]
pub mod sink;
#[cfg(feature = "redis-source")]
pub mod source;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, ErrorKind, RedisError, ServerErrorKind};
use secrecy::{ExposeSecret, SecretString};

use crate::connectors::PluginConfigError;

/// A connection to one Redis server, opened on first use and again after a
/// transport error (a restarted server, a dropped socket).
pub struct Connection {
    client: redis::Client,
    settings: AsyncConnectionConfig,
    current: tokio::sync::Mutex<Option<MultiplexedConnection>>,
}

impl Connection {
    /// Parses `url` (`redis://[user:password@]host:port[/db]`, `rediss://` for
    /// TLS); `response_timeout` bounds every command (a blocking read adds
    /// its own block time to it).
    pub fn new(
        url: &SecretString,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Result<Self, PluginConfigError> {
        crate::connectors::kit::crypto::ensure_default_provider();
        let client = redis::Client::open(url.expose_secret()).map_err(|error| {
            PluginConfigError::new(
                "url",
                format!(
                    "expected redis://[user:password@]host:port[/db] or rediss://...: {}",
                    error.detail().unwrap_or(error.category())
                ),
            )
        })?;
        let settings = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(Some(response_timeout));
        Ok(Self {
            client,
            settings,
            current: tokio::sync::Mutex::new(None),
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

    #[test]
    fn given_bad_url_when_built_should_name_the_field() {
        let error = Connection::new(
            &SecretString::from("http://nowhere"),
            Duration::from_secs(1),
            Duration::from_secs(1),
        )
        .err()
        .unwrap();
        assert_eq!(error.field, "url");
    }
}
