//! What the `postgres` source and sink share: how they open their pool and
//! which database errors are worth retrying.

#[cfg(feature = "postgres-sink")]
pub mod sink;
#[cfg(feature = "postgres-source")]
pub mod source;
#[cfg(feature = "postgres-state")]
pub mod state;

use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::ConnectOptions;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};

use crate::connectors::kit::sql;

/// Checks a `connection_string` without connecting: a `postgres://` or
/// `postgresql://` URL that parses (sqlx also takes other schemes and
/// key/value strings, which upstream's connectors never did).
pub fn check_connection_string(
    connection_string: &SecretString,
) -> Result<(), crate::connectors::PluginConfigError> {
    let text = connection_string.expose_secret();
    let scheme = text.split_once("://").map(|(scheme, _)| scheme);
    if !matches!(scheme, Some("postgres" | "postgresql")) {
        return Err(crate::connectors::PluginConfigError::new(
            "connection_string",
            "expected a postgres:// or postgresql:// URL",
        ));
    }
    PgConnectOptions::from_str(text).map(drop).map_err(|error| {
        crate::connectors::PluginConfigError::new("connection_string", error.to_string())
    })
}

/// A pool that connects on first use, so a database that is down at start
/// only delays the first batch. Fails only on a malformed connection string.
pub(crate) fn lazy_pool(
    connection_string: &SecretString,
    max_connections: u32,
    acquire_timeout: Duration,
) -> Result<PgPool, sqlx::Error> {
    let options = PgConnectOptions::from_str(connection_string.expose_secret())?;
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(options))
}

/// A database error as users read it: the server's message with its detail
/// and hint, without the server's source line (`at line 334`) that sqlx adds.
pub(crate) fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(database) => {
            let mut text = database.message().to_owned();
            if let Some(postgres) = database.try_downcast_ref::<sqlx::postgres::PgDatabaseError>() {
                for (label, part) in [("detail", postgres.detail()), ("hint", postgres.hint())] {
                    if let Some(part) = part {
                        text.push_str(&format!(" ({label}: {part})"));
                    }
                }
            }
            text
        }
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Replaces a pool timeout by why connecting fails: sqlx's pool retries its
/// connection attempts silently and reports only that it timed out, so one
/// direct attempt finds the cause (`connection refused`, a bad password),
/// named with the server's host and port. Other errors pass unchanged, and so
/// does a timeout while the server accepts connections (the pool is busy).
pub(crate) async fn with_connect_cause(pool: &PgPool, error: sqlx::Error) -> sqlx::Error {
    let options = pool.connect_options();
    sql::with_connect_cause(
        error,
        || format!("{}:{}", options.get_host(), options.get_port()),
        || options.connect(),
        describe,
    )
    .await
}

/// Errors worth retrying: the connection, the server's availability, conflicts
/// a retry resolves, and a table that vanished mid-run (renamed by a
/// migration): waiting loses nothing, giving up would stop the pipeline.
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database) => database.code().is_some_and(|code| {
            code.starts_with("08")
                || code.starts_with("53")
                || code.starts_with("57P")
                || matches!(&*code, "40001" | "40P01" | "55P03" | "57014" | "42P01")
        }),
        other => sql::is_transient_client(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_connection_level_errors_when_classified_should_be_transient() {
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert!(is_transient(&sqlx::Error::Io(reset)));
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(is_transient(&sqlx::Error::WorkerCrashed));
    }

    #[test]
    fn given_errors_a_retry_cannot_fix_when_classified_should_not_be_transient() {
        assert!(!is_transient(&sqlx::Error::RowNotFound));
        assert!(!is_transient(&sqlx::Error::ColumnNotFound("id".into())));
        assert!(!is_transient(&sqlx::Error::PoolClosed));
    }

    #[test]
    fn given_a_connection_string_of_another_scheme_when_checked_should_name_the_field() {
        for text in [
            "mysql://u@localhost/db",
            "host=localhost dbname=db",
            "postgres:/x",
        ] {
            let error = check_connection_string(&SecretString::from(text)).unwrap_err();
            assert_eq!(error.field, "connection_string", "{text}");
            assert!(
                error.message.contains("postgres://"),
                "{text}: {}",
                error.message
            );
        }
        for text in [
            "postgres://u@localhost/db",
            "postgresql://localhost:5433/db",
        ] {
            assert!(
                check_connection_string(&SecretString::from(text)).is_ok(),
                "{text}"
            );
        }
        let bad_port = SecretString::from("postgres://user@host:notaport/db");
        assert!(check_connection_string(&bad_port).is_err());
    }

    #[tokio::test]
    async fn given_a_refused_port_when_the_pool_times_out_should_name_the_address_and_the_cause() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let url = SecretString::from(format!("postgres://app@127.0.0.1:{port}/app"));
        let pool = lazy_pool(&url, 1, Duration::from_millis(300)).unwrap();
        let error = pool.acquire().await.unwrap_err();
        // What sqlx's pool says by itself.
        assert!(matches!(error, sqlx::Error::PoolTimedOut), "{error}");
        let explained = with_connect_cause(&pool, error).await;
        let text = describe(&explained);
        assert!(
            text.contains(&format!("127.0.0.1:{port}"))
                && text.to_lowercase().contains("connection refused"),
            "{text}"
        );
        assert!(is_transient(&explained));
    }

    #[test]
    fn given_a_malformed_connection_string_when_pooled_should_fail_without_connecting() {
        let bad = SecretString::from("postgres://user@host:notaport/db");
        assert!(lazy_pool(&bad, 1, Duration::from_secs(1)).is_err());
    }
}
