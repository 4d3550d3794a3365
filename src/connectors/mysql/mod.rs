//! What the `mysql` source and sink share: how they open their pool, quote
//! names, and which server errors are worth retrying. Works with MySQL and
//! MariaDB alike (sqlx's `mysql` driver speaks to both).

#[cfg(feature = "mysql-sink")]
pub mod sink;
#[cfg(feature = "mysql-source")]
pub mod source;

use std::str::FromStr;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use sqlx::ConnectOptions;
use sqlx::mysql::{MySqlConnectOptions, MySqlDatabaseError, MySqlPool, MySqlPoolOptions};

use crate::connectors::PluginConfigError;
use crate::connectors::kit::sql;

/// Checks a `connection_string` without connecting: a `mysql://` or
/// `mariadb://` URL that parses.
pub(crate) fn check_connection_string(
    connection_string: &SecretString,
) -> Result<(), PluginConfigError> {
    connect_options(connection_string).map(drop)
}

/// The connect options of a `mysql://` (or `mariadb://`) URL.
pub(crate) fn connect_options(
    connection_string: &SecretString,
) -> Result<MySqlConnectOptions, PluginConfigError> {
    let text = connection_string.expose_secret();
    let (scheme, rest) = text.split_once("://").unwrap_or_default();
    if !matches!(scheme, "mysql" | "mariadb") {
        return Err(PluginConfigError::new(
            "connection_string",
            "expected a mysql:// or mariadb:// URL (mysql://user:password@host:3306/database)",
        ));
    }
    MySqlConnectOptions::from_str(&format!("mysql://{rest}"))
        .map_err(|error| PluginConfigError::new("connection_string", error.to_string()))
}

/// A pool that connects on first use, so a database that is down at start
/// only delays the first batch. Sessions run in UTC, so `TIMESTAMP` values
/// read and written mean the same instant whatever the server's zone.
pub(crate) fn lazy_pool(
    options: MySqlConnectOptions,
    max_connections: u32,
    acquire_timeout: Duration,
) -> MySqlPool {
    MySqlPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(options.timezone(Some("+00:00".to_owned())))
}

/// `` `name` ``, with embedded backticks doubled.
pub(crate) fn quote_identifier(name: &str) -> Result<String, String> {
    if name.is_empty() {
        return Err("expected a non-empty identifier".into());
    }
    if name.contains('\0') {
        return Err(format!("identifier {name:?} contains a NUL byte"));
    }
    Ok(format!("`{}`", name.replace('`', "``")))
}

/// `database.table` or `table`, each part quoted. MySQL keeps the case of
/// names (whether it compares them case-sensitively depends on the server's
/// `lower_case_table_names`).
pub fn quote_qualified(name: &str) -> Result<String, String> {
    let parts: Vec<&str> = name.trim().split('.').collect();
    if parts.len() > 2 {
        return Err(format!(
            "expected \"table\" or \"database.table\", found \"{name}\""
        ));
    }
    let quoted = parts
        .iter()
        .map(|part| quote_identifier(part))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(quoted.join("."))
}

/// The server's error number, when the error came from the server.
pub(crate) fn error_number(error: &sqlx::Error) -> Option<u16> {
    match error {
        sqlx::Error::Database(database) => database
            .try_downcast_ref::<MySqlDatabaseError>()
            .map(MySqlDatabaseError::number),
        _ => None,
    }
}

/// A server error as users read it: the message with its error number.
pub(crate) fn describe(error: &sqlx::Error) -> String {
    match error {
        sqlx::Error::Database(database) => match error_number(error) {
            Some(number) => format!("{} (error {number})", database.message()),
            None => database.message().to_owned(),
        },
        sqlx::Error::Io(io) => io.to_string(),
        other => other.to_string(),
    }
}

/// Replaces a pool timeout by why connecting fails (sqlx's pool retries its
/// connection attempts silently), named with the server's host and port.
pub(crate) async fn with_connect_cause(pool: &MySqlPool, error: sqlx::Error) -> sqlx::Error {
    let options = pool.connect_options();
    sql::with_connect_cause(
        error,
        || format!("{}:{}", options.get_host(), options.get_port()),
        || options.connect(),
        describe,
    )
    .await
}

/// Errors worth retrying: the connection, the server's availability
/// (shutdown, too many connections, read-only during a failover), conflicts
/// a retry resolves (deadlock, lock wait timeout), interrupted statements,
/// and a table that vanished mid-run (renamed by a migration).
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database) => {
            error_number(error).is_some_and(is_transient_number)
                || database.code().is_some_and(|code| code.starts_with("08"))
        }
        other => sql::is_transient_client(other),
    }
}

/// MySQL and MariaDB error numbers a retry can get past.
pub(crate) fn is_transient_number(number: u16) -> bool {
    matches!(
        number,
        // ER_CON_COUNT_ERROR, ER_SERVER_SHUTDOWN, ER_NO_SUCH_TABLE
        1040 | 1053 | 1146
        // ER_LOCK_WAIT_TIMEOUT, ER_LOCK_DEADLOCK, ER_QUERY_INTERRUPTED
        | 1205 | 1213 | 1317
        // ER_OPTION_PREVENTS_STATEMENT (--read-only), ER_READ_ONLY_MODE
        | 1290 | 1836
        // ER_NET_READ_ERROR and friends: a broken packet exchange
        | 1158
            ..=1161
        // MariaDB: ER_CONNECTION_KILLED, ER_STATEMENT_TIMEOUT; MySQL 8:
        // ER_QUERY_TIMEOUT; both: an idle connection closed by the server
        | 1927 | 1969 | 3024 | 4031
        // client-side: CR_SERVER_GONE_ERROR, CR_SERVER_LOST
        | 2006 | 2013
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_connection_strings_when_checked_should_take_mysql_and_mariadb_urls_only() {
        for good in ["mysql://u:p@localhost:3306/db", "mariadb://localhost/db"] {
            assert!(
                check_connection_string(&SecretString::from(good)).is_ok(),
                "{good}"
            );
        }
        for bad in [
            "postgres://u@localhost/db",
            "localhost:3306",
            "mysql://u@h:port/db",
        ] {
            let error = check_connection_string(&SecretString::from(bad)).unwrap_err();
            assert_eq!(error.field, "connection_string", "{bad}");
        }
    }

    #[test]
    fn given_names_when_quoted_should_double_backticks_and_split_the_database() {
        assert_eq!(quote_identifier("a`b").unwrap(), "`a``b`");
        assert_eq!(quote_qualified("shop.Orders").unwrap(), "`shop`.`Orders`");
        for bad in ["", "a..b", "a.b.c"] {
            assert!(quote_qualified(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn given_server_error_numbers_when_classified_should_retry_only_what_can_pass() {
        for transient in [1205, 1213, 1040, 1053, 2006, 2013, 1927, 1146] {
            assert!(is_transient_number(transient), "{transient}");
        }
        // access denied, unknown database, duplicate key, bad value, syntax
        for fatal in [1045, 1049, 1062, 1366, 1064] {
            assert!(!is_transient_number(fatal), "{fatal}");
        }
        assert!(is_transient(&sqlx::Error::PoolTimedOut));
        assert!(!is_transient(&sqlx::Error::RowNotFound));
    }
}
