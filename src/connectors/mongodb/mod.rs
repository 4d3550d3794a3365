//! What the `mongodb` sink and source share: how they build their client and
//! which driver errors are worth retrying.

#[cfg(feature = "mongodb-sink")]
pub mod sink;
#[cfg(feature = "mongodb-source")]
pub mod source;

use std::time::Duration;

use mongodb::error::{
    Error, ErrorKind, RETRYABLE_ERROR, RETRYABLE_WRITE_ERROR, SYSTEM_OVERLOADED_ERROR,
};
use mongodb::options::ClientOptions;
use mongodb::{Client, bson::doc};
use secrecy::{ExposeSecret, SecretString};

use crate::connectors::PluginConfigError;

/// The server's code for a duplicate key on a unique index.
pub(crate) const DUPLICATE_KEY: i32 = 11000;

/// Server codes that say "try again later": network and shutdown states,
/// elections, timeouts, a server that is not (or no longer) the primary. The
/// driver's own list of retryable write codes, plus exceeded time limits.
const TRANSIENT_CODES: &[i32] = &[
    6, 7, 50, 89, 91, 133, 134, 189, 262, 9001, 10107, 11600, 11602, 13435, 13436,
];

/// Server codes that mean the credentials do not open the database.
const AUTH_CODES: &[i32] = &[13, 18];

/// Checks a `connection_uri` without connecting: a `mongodb://` or
/// `mongodb+srv://` URI.
pub(crate) fn check_connection_uri(uri: &SecretString) -> Result<(), PluginConfigError> {
    let text = uri.expose_secret();
    if text.starts_with("mongodb://") || text.starts_with("mongodb+srv://") {
        Ok(())
    } else {
        Err(PluginConfigError::new(
            "connection_uri",
            "expected a mongodb:// or mongodb+srv:// URI",
        ))
    }
}

/// A client that connects on first use. `server_selection_timeout` bounds how
/// long an operation waits for a reachable server before it fails (transiently).
pub(crate) async fn client(
    uri: &SecretString,
    max_pool_size: Option<u32>,
    server_selection_timeout: Duration,
    app_name: &str,
) -> Result<Client, Error> {
    let mut options = ClientOptions::parse(uri.expose_secret()).await?;
    if max_pool_size.is_some() {
        options.max_pool_size = max_pool_size;
    }
    options.server_selection_timeout = Some(server_selection_timeout);
    options.connect_timeout = Some(server_selection_timeout);
    options.app_name.get_or_insert_with(|| app_name.to_owned());
    Client::with_options(options)
}

/// Pings `database`: `Ok` when the server answers and the credentials work.
pub(crate) async fn ping(client: &Client, database: &str) -> Result<(), Error> {
    client
        .database(database)
        .run_command(doc! { "ping": 1 })
        .await
        .map(drop)
}

/// Whether an operation that failed with `error` may succeed if tried again:
/// the driver's retry labels, network, pool and server-selection errors, and
/// the server's "try again" codes. Duplicate keys, bad credentials and
/// refused documents are not.
pub(crate) fn is_transient(error: &Error) -> bool {
    if [
        RETRYABLE_WRITE_ERROR,
        RETRYABLE_ERROR,
        SYSTEM_OVERLOADED_ERROR,
    ]
    .iter()
    .any(|label| error.contains_label(label))
    {
        return true;
    }
    match error.kind.as_ref() {
        ErrorKind::Io(_)
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::ServerSelection { .. }
        | ErrorKind::DnsResolve { .. } => true,
        ErrorKind::Command(command) => is_transient_code(command.code),
        ErrorKind::InsertMany(insert) => insert.write_concern_error.is_some(),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(_)) => true,
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(write)) => {
            is_transient_code(write.code)
        }
        _ => false,
    }
}

/// Whether the server refused the credentials (or the user's rights).
pub(crate) fn is_auth_error(error: &Error) -> bool {
    match error.kind.as_ref() {
        ErrorKind::Authentication { .. } => true,
        ErrorKind::Command(command) => AUTH_CODES.contains(&command.code),
        _ => false,
    }
}

pub(crate) fn is_transient_code(code: i32) -> bool {
    TRANSIENT_CODES.contains(&code)
}

/// A driver error as users read it: the server's code name and message when
/// the server answered, the driver's text otherwise.
pub(crate) fn describe(error: &Error) -> String {
    match error.kind.as_ref() {
        ErrorKind::Command(command) => format!(
            "{} (code {} {})",
            command.message, command.code, command.code_name
        ),
        _ => error.to_string(),
    }
}
