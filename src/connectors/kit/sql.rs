//! What the SQL connectors (sources, sinks and state stores) share whatever
//! the driver: explaining a pool timeout by its cause, the error kinds every
//! driver retries, and how a sink lays out a message's payload.

use std::future::Future;
use std::time::Duration;

use tracing::warn;

use crate::connectors::ConnectorError;
use crate::message::Payload;

/// How long `open` waits for the database before leaving the checks to the
/// first poll or write.
pub const OPEN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How long one direct connection attempt may take when a pool timeout is
/// explained by it.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// Connections in a SQL connector's pool, by default.
pub fn default_max_connections() -> u32 {
    10
}

pub fn default_true() -> bool {
    true
}

/// How long a SQL sink's write waits for a pooled connection, by default.
pub fn default_acquire_timeout() -> Duration {
    Duration::from_secs(10)
}

/// Replaces a pool timeout by why connecting fails: sqlx's pool retries its
/// connection attempts silently and reports only that it timed out, so one
/// direct attempt (`connect`, to `target`, `host:port`) finds the cause
/// (`connection refused`, a bad password). Other errors pass unchanged, and
/// so does a timeout while the server accepts connections (the pool is busy).
pub(crate) async fn with_connect_cause<C, F>(
    error: sqlx::Error,
    target: impl FnOnce() -> String,
    connect: impl FnOnce() -> F,
    describe: fn(&sqlx::Error) -> String,
) -> sqlx::Error
where
    F: Future<Output = Result<C, sqlx::Error>>,
{
    if !matches!(error, sqlx::Error::PoolTimedOut) {
        return error;
    }
    let target = target();
    let io = |kind: std::io::ErrorKind, cause: String| {
        sqlx::Error::Io(std::io::Error::new(
            kind,
            format!("cannot connect to {target}: {cause}"),
        ))
    };
    match tokio::time::timeout(PROBE_TIMEOUT, connect()).await {
        Ok(Ok(connection)) => {
            drop(connection);
            error
        }
        Ok(Err(sqlx::Error::Io(cause))) => io(cause.kind(), cause.to_string()),
        Ok(Err(cause @ sqlx::Error::Database(_))) => cause,
        Ok(Err(cause)) => io(std::io::ErrorKind::Other, describe(&cause)),
        Err(_) => io(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {PROBE_TIMEOUT:?}"),
        ),
    }
}

/// Fails `open` fast on what a retry cannot fix (bad credentials, a missing
/// table or column) while the database is up; if it is not, `retries` (the
/// polls or writes) retry until it is. `check` looks at the database;
/// `unreachable` runs when it took too long: the cause as text, or the fatal
/// error it is. `who` names the connector in the warning.
pub async fn check_on_open<E, U>(
    who: &str,
    retries: &str,
    check: impl Future<Output = Result<(), E>>,
    unreachable: impl FnOnce() -> U,
) -> Result<(), ConnectorError>
where
    ConnectorError: From<E>,
    U: Future<Output = Result<String, ConnectorError>>,
{
    let error = match tokio::time::timeout(OPEN_CHECK_TIMEOUT, check).await {
        Ok(Ok(())) => return Ok(()),
        Ok(Err(error)) => {
            let error = ConnectorError::from(error);
            if !error.is_transient() {
                return Err(error);
            }
            error.to_string()
        }
        Err(_) => unreachable().await?,
    };
    warn!(%error, "{who} cannot reach the database yet; {retries} will retry");
    Ok(())
}

/// Whether a client-side error (not one the server answered, which each
/// driver classifies itself) is worth retrying: the connection, TLS, the wire
/// protocol, a pool timeout, a crashed worker.
pub(crate) fn is_transient_client(error: &sqlx::Error) -> bool {
    matches!(
        error,
        sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::Protocol(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::WorkerCrashed
    )
}

/// Appends `payload`'s bytes to `buffer` as a sink's payload column stores
/// them; `text_column` says the column holds text (so raw bytes must be
/// UTF-8), `format` names the column's `payload_format` in the refusal.
/// On a refusal the buffer is as it was.
pub fn append_payload(
    buffer: &mut Vec<u8>,
    payload: &Payload,
    text_column: bool,
    format: &str,
) -> Result<(), String> {
    let start = buffer.len();
    match payload {
        Payload::Json(value) => serde_json::to_writer(&mut *buffer, value).map_err(|error| {
            buffer.truncate(start);
            format!("payload cannot be serialized as JSON: {error}")
        }),
        // Valid JSON, hence UTF-8: fits every payload format as is.
        Payload::JsonBytes(bytes) => {
            buffer.extend_from_slice(bytes);
            Ok(())
        }
        Payload::Text(text) => {
            buffer.extend_from_slice(text.as_bytes());
            Ok(())
        }
        Payload::Raw(bytes) if text_column && std::str::from_utf8(bytes).is_err() => Err(format!(
            "payload is not UTF-8, so it cannot be stored with payload_format = \"{format}\""
        )),
        Payload::Raw(bytes) => {
            buffer.extend_from_slice(bytes);
            Ok(())
        }
    }
}
