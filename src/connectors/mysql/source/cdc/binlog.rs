//! The row binlog, read as a replica reads it (`COM_BINLOG_DUMP` through
//! `mysql_async`), by a task that hands whole transactions to the source.
//!
//! Every transaction becomes one [`Txn`]: its changes to the captured tables
//! (none for the others, so the position still moves past them) and the
//! position right after its commit event, where a restart resumes. Rows are
//! rendered to JSON in the task, against the columns the catalog gave.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RowsEventData, TableMapEvent};
use mysql_async::prelude::Queryable;
use mysql_async::{BinlogStreamRequest, Conn, Opts, OptsBuilder, SslOpts};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tracing::debug;

use super::render::{ColumnInfo, RenderError, render_row};
use crate::connectors::PluginConfigError;
use crate::connectors::kit::cdc::Operation;
use crate::connectors::mysql::is_transient_number;

/// How often an idle server sends a heartbeat; three missed ones mean the
/// connection is dead.
const HEARTBEAT: Duration = Duration::from_secs(5);
/// Transactions read ahead of the polls.
const READ_AHEAD: usize = 64;

/// A place in the binlog: a file and a byte offset in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Position {
    pub file: String,
    pub position: u64,
}

impl Position {
    pub fn is_known(&self) -> bool {
        !self.file.is_empty()
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}:{}", self.file, self.position)
    }
}

/// A captured table as the binlog names it.
#[derive(Debug, Clone)]
pub struct CapturedTable {
    /// As configured: the records' `table_name`.
    pub name: String,
    pub database: String,
    pub table: String,
    pub columns: Vec<ColumnInfo>,
}

/// One committed transaction.
#[derive(Debug)]
pub struct Txn {
    /// Right after its commit event.
    pub end: Position,
    /// The commit time, seconds since the epoch.
    pub timestamp: u32,
    pub changes: Vec<Change>,
}

/// One row change (or a truncated table).
#[derive(Debug)]
pub struct Change {
    /// Index into the captured tables.
    pub table: usize,
    pub operation: Operation,
    /// Row images rendered as JSON objects.
    pub data: Option<String>,
    pub old_data: Option<String>,
    /// From the position of its rows event and its place in it.
    pub id: u128,
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("reading the binlog from {position}: {source}")]
    Client {
        position: Position,
        #[source]
        source: mysql_async::Error,
    },
    #[error("reading the binlog from {position}: no event or heartbeat for {0:?}", HEARTBEAT * 3)]
    Silent { position: Position },
    #[error("reading the binlog from {position}: the server closed the stream")]
    Closed { position: Position },
    #[error("the binlog reader ended without an error (see the log for a panic); restarting it")]
    Ended,
    #[error("table {table} at binlog {position}: {source}")]
    Render {
        table: String,
        position: Position,
        #[source]
        source: RenderError,
    },
    #[error(
        "table {table} at binlog {position}: the binlog has {found} columns, the table now has {expected}; \
         the table changed after this change was written (set binlog_row_metadata = FULL, or restart the capture with a snapshot)"
    )]
    Shape {
        table: String,
        position: Position,
        found: u64,
        expected: usize,
    },
}

impl ReadError {
    /// Worth reconnecting: a lost connection or a server error that passes.
    /// Access refused, a missing privilege or a purged binlog file are not.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Client {
                source: mysql_async::Error::Server(error),
                ..
            } => is_transient_number(error.code),
            Self::Client { .. } | Self::Silent { .. } | Self::Closed { .. } | Self::Ended => true,
            Self::Render { .. } | Self::Shape { .. } => false,
        }
    }
}

/// The replication connection's options from the source's URL. sqlx's
/// `ssl-mode` (and `ssl-ca`) choose TLS: `required` encrypts,
/// `verify_ca` also checks the certificate, `verify_identity` the host name
/// too; without them (or with `disabled` / `preferred`) the binlog is read
/// in the clear.
pub fn replication_opts(connection_string: &SecretString) -> Result<Opts, PluginConfigError> {
    let text = connection_string.expose_secret();
    let rest = text.split_once("://").map_or(text, |(_, rest)| rest);
    let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
    let invalid = |message: String| PluginConfigError::new("connection_string", message);
    let opts = Opts::from_url(&format!("mysql://{base}"))
        .map_err(|error| invalid(format!("cannot read it for the binlog connection: {error}")))?;
    let mut ssl_mode = String::new();
    let mut ca = None;
    for pair in query.split('&').filter(|pair| !pair.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key.to_ascii_lowercase().replace('_', "-").as_str() {
            "ssl-mode" | "sslmode" => ssl_mode = value.to_ascii_lowercase().replace('-', "_"),
            "ssl-ca" | "sslrootcert" => ca = Some(value.to_owned()),
            _ => {}
        }
    }
    let ssl = match ssl_mode.as_str() {
        "" | "disabled" | "preferred" => None,
        "required" => Some(
            SslOpts::default()
                .with_danger_accept_invalid_certs(true)
                .with_danger_skip_domain_validation(true),
        ),
        "verify_ca" => Some(SslOpts::default().with_danger_skip_domain_validation(true)),
        "verify_identity" => Some(SslOpts::default()),
        other => {
            return Err(invalid(format!(
                "unknown ssl-mode {other:?}; expected disabled, preferred, required, verify_ca or verify_identity"
            )));
        }
    };
    let ssl = ssl.map(|ssl| match ca {
        Some(path) => ssl.with_root_certs(vec![std::path::PathBuf::from(path).into()]),
        None => ssl,
    });
    Ok(OptsBuilder::from_opts(opts)
        .prefer_socket(false)
        .ssl_opts(ssl)
        .into())
}

/// The task reading the binlog, and what it read. Dropping it stops the task.
pub struct Reader {
    receiver: mpsc::Receiver<Result<Txn, ReadError>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Reader {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reader {
    /// Starts reading at `from` (the start of a transaction).
    pub fn spawn(
        opts: Opts,
        server_id: u32,
        from: Position,
        tables: Vec<CapturedTable>,
        operations: Vec<Operation>,
    ) -> Self {
        let (sender, receiver) = mpsc::channel(READ_AHEAD);
        let task = tokio::spawn(async move {
            let mut decoder = Decoder::new(tables, operations, from);
            let result = decoder.run(opts, server_id, &sender).await;
            if let Err(error) = result {
                let _ = sender.send(Err(error)).await;
            }
        });
        Self { receiver, task }
    }

    /// The next transaction; waits for one. After the task's error,
    /// [`ReadError::Ended`] (also what a panicked task leaves). Cancel-safe.
    pub async fn next(&mut self) -> Result<Txn, ReadError> {
        self.receiver.recv().await.unwrap_or(Err(ReadError::Ended))
    }

    /// The next transaction if one is ready.
    pub fn try_next(&mut self) -> Option<Result<Txn, ReadError>> {
        match self.receiver.try_recv() {
            Ok(read) => Some(read),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(Err(ReadError::Ended)),
        }
    }
}

/// The transaction being read.
struct Open {
    changes: Vec<Change>,
}

struct Decoder {
    tables: Vec<CapturedTable>,
    /// (database, table) -> index into `tables`.
    index: HashMap<(String, String), usize>,
    operations: Vec<Operation>,
    /// Where the next unread transaction starts.
    position: Position,
    file_number: u32,
}

impl Decoder {
    fn new(tables: Vec<CapturedTable>, operations: Vec<Operation>, from: Position) -> Self {
        let index = tables
            .iter()
            .enumerate()
            .map(|(index, table)| ((table.database.clone(), table.table.clone()), index))
            .collect();
        let file_number = file_number(&from.file);
        Self {
            tables,
            index,
            operations,
            position: from,
            file_number,
        }
    }

    async fn run(
        &mut self,
        opts: Opts,
        server_id: u32,
        sender: &mpsc::Sender<Result<Txn, ReadError>>,
    ) -> Result<(), ReadError> {
        let client = |position: &Position| {
            let position = position.clone();
            move |source| ReadError::Client { position, source }
        };
        let mut connection = Conn::new(opts).await.map_err(client(&self.position))?;
        // Nanoseconds; the server sends a heartbeat when it has nothing else.
        connection
            .query_drop(format!(
                "SET @master_heartbeat_period = {}",
                HEARTBEAT.as_nanos()
            ))
            .await
            .map_err(client(&self.position))?;
        let file = self.position.file.clone();
        let request = BinlogStreamRequest::new(server_id)
            .with_filename(file.as_bytes())
            .with_pos(self.position.position);
        let mut stream = connection
            .get_binlog_stream(request)
            .await
            .map_err(client(&self.position))?;
        debug!(position = %self.position, server_id, "reading the binlog");
        let mut file = self.position.file.clone();
        let mut open: Option<Open> = None;
        loop {
            let event = match tokio::time::timeout(HEARTBEAT * 3, stream.next()).await {
                Err(_) => {
                    return Err(ReadError::Silent {
                        position: self.position.clone(),
                    });
                }
                Ok(None) => {
                    return Err(ReadError::Closed {
                        position: self.position.clone(),
                    });
                }
                Ok(Some(event)) => event.map_err(client(&self.position))?,
            };
            let header = event.header();
            let data = event.read_data().map_err(|error| ReadError::Client {
                position: self.position.clone(),
                source: error.into(),
            })?;
            let end = |file: &str| Position {
                file: file.to_owned(),
                position: u64::from(header.log_pos()),
            };
            let finished = match data {
                // The rotate sent first names the file asked for; it comes
                // before the format description, so its name may still
                // carry the checksum: the requested name is kept.
                Some(EventData::RotateEvent(_)) if header.log_pos() == 0 && !file.is_empty() => {
                    None
                }
                Some(EventData::RotateEvent(rotate)) => {
                    file = rotate.name().into_owned();
                    if open.is_none() {
                        self.position = Position {
                            file: file.clone(),
                            position: rotate.position(),
                        };
                        self.file_number = file_number(&file);
                    }
                    None
                }
                Some(EventData::QueryEvent(query)) => {
                    let text = query.query();
                    let statement = text.trim();
                    if statement.eq_ignore_ascii_case("BEGIN") {
                        open = Some(Open {
                            changes: Vec::new(),
                        });
                        None
                    } else if statement.eq_ignore_ascii_case("COMMIT")
                        || statement.eq_ignore_ascii_case("ROLLBACK")
                    {
                        open.take().map(|open| open.changes)
                    } else if open.is_some() {
                        None
                    } else {
                        // A statement of its own (DDL): a transaction with at
                        // most a TRUNCATE of a captured table.
                        Some(self.truncate(&query.schema(), statement, &header, &file))
                    }
                }
                Some(EventData::XidEvent(_)) => open.take().map(|open| open.changes),
                Some(EventData::RowsEvent(rows)) => {
                    if let Some(open) = open.as_mut()
                        && let Some(tme) = stream.get_tme(rows.table_id())
                    {
                        self.rows(&rows, tme, &header, &mut open.changes)?;
                    }
                    None
                }
                _ => None,
            };
            if let Some(changes) = finished {
                self.position = end(&file);
                let txn = Txn {
                    end: self.position.clone(),
                    timestamp: header.timestamp(),
                    changes,
                };
                if sender.send(Ok(txn)).await.is_err() {
                    return Ok(());
                }
            }
        }
    }

    fn rows(
        &self,
        rows: &RowsEventData<'_>,
        tme: &TableMapEvent<'_>,
        header: &mysql_async::binlog::events::BinlogEventHeader,
        changes: &mut Vec<Change>,
    ) -> Result<(), ReadError> {
        let key = (
            tme.database_name().into_owned(),
            tme.table_name().into_owned(),
        );
        let Some(&table_index) = self.index.get(&key) else {
            return Ok(());
        };
        let operation = match rows {
            RowsEventData::WriteRowsEventV1(_) | RowsEventData::WriteRowsEvent(_) => {
                Operation::Insert
            }
            RowsEventData::UpdateRowsEventV1(_)
            | RowsEventData::UpdateRowsEvent(_)
            | RowsEventData::PartialUpdateRowsEvent(_) => Operation::Update,
            RowsEventData::DeleteRowsEventV1(_) | RowsEventData::DeleteRowsEvent(_) => {
                Operation::Delete
            }
        };
        if !self.operations.contains(&operation) {
            return Ok(());
        }
        let table = &self.tables[table_index];
        let event_start = u64::from(header.log_pos().saturating_sub(header.event_size()));
        let at = || Position {
            file: self.position.file.clone(),
            position: event_start,
        };
        if tme.columns_count() != table.columns.len() as u64 {
            return Err(ReadError::Shape {
                table: table.name.clone(),
                position: at(),
                found: tme.columns_count(),
                expected: table.columns.len(),
            });
        }
        let render = |row: Option<mysql_async::binlog::row::BinlogRow>| {
            row.map(|row| render_row(&row, &table.columns))
                .transpose()
                .map_err(|source| ReadError::Render {
                    table: table.name.clone(),
                    position: at(),
                    source,
                })
        };
        for (number, row) in rows.rows(tme).enumerate() {
            let (before, after) = row.map_err(|error| ReadError::Client {
                position: at(),
                source: error.into(),
            })?;
            let before = render(before)?;
            let after = render(after)?;
            let (data, old_data) = match operation {
                Operation::Insert => (after, None),
                Operation::Update => (after, before),
                _ => (before.clone(), before),
            };
            changes.push(Change {
                table: table_index,
                operation,
                data,
                old_data,
                id: (u128::from(self.file_number) << 96)
                    | (u128::from(event_start) << 32)
                    | number as u128,
            });
        }
        Ok(())
    }

    /// `TRUNCATE [TABLE] name` of a captured table, as its one change.
    fn truncate(
        &self,
        schema: &str,
        statement: &str,
        header: &mysql_async::binlog::events::BinlogEventHeader,
        file: &str,
    ) -> Vec<Change> {
        if !self.operations.contains(&Operation::Truncate) {
            return Vec::new();
        }
        let Some(target) = truncated_table(statement) else {
            return Vec::new();
        };
        let (database, table) = match target.split_once('.') {
            Some((database, table)) => (database.to_owned(), table.to_owned()),
            None => (schema.to_owned(), target),
        };
        let Some(&table_index) = self.index.get(&(database, table)) else {
            return Vec::new();
        };
        let event_start = u64::from(header.log_pos().saturating_sub(header.event_size()));
        vec![Change {
            table: table_index,
            operation: Operation::Truncate,
            data: None,
            old_data: None,
            id: (u128::from(file_number(file)) << 96) | (u128::from(event_start) << 32),
        }]
    }
}

/// The table a `TRUNCATE [TABLE] name` statement names, backticks removed.
fn truncated_table(statement: &str) -> Option<String> {
    let mut words = statement.split_whitespace();
    if !words.next()?.eq_ignore_ascii_case("TRUNCATE") {
        return None;
    }
    let mut name = words.next()?;
    if name.eq_ignore_ascii_case("TABLE") {
        name = words.next()?;
    }
    let name = name.trim_end_matches(';');
    Some(
        name.split('.')
            .map(|part| part.trim_matches('`').replace("``", "`"))
            .collect::<Vec<_>>()
            .join("."),
    )
}

/// The number a binlog file name ends with (`binlog.000042` -> 42).
fn file_number(file: &str) -> u32 {
    file.rsplit('.')
        .next()
        .and_then(|digits| digits.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn given_a_reader_task_that_panicked_when_read_should_report_it_ended() {
        let (sender, receiver) = mpsc::channel(1);
        let task = tokio::spawn(async move {
            let _sender = sender;
            panic!("a decoding bug");
        });
        while !task.is_finished() {
            tokio::task::yield_now().await;
        }
        let mut reader = Reader { receiver, task };
        assert!(matches!(reader.try_next(), Some(Err(ReadError::Ended))));
        assert!(matches!(reader.next().await, Err(ReadError::Ended)));
        assert!(ReadError::Ended.is_transient());
    }

    #[test]
    fn given_truncate_statements_when_read_should_name_their_table() {
        assert_eq!(
            truncated_table("TRUNCATE TABLE `shop`.`orders`").as_deref(),
            Some("shop.orders")
        );
        assert_eq!(truncated_table("truncate users").as_deref(), Some("users"));
        assert_eq!(truncated_table("DROP TABLE users"), None);
        assert_eq!(file_number("/var/lib/mysql/binlog.000042"), 42);
    }

    #[test]
    fn given_connection_strings_when_read_for_replication_should_keep_the_credentials_and_choose_tls()
     {
        let opts = replication_opts(&SecretString::from(
            "mysql://repl:p%40ss@db.example:3307/shop?ssl-mode=REQUIRED",
        ))
        .unwrap();
        assert_eq!(opts.user(), Some("repl"));
        assert_eq!(opts.pass(), Some("p@ss"));
        assert_eq!(opts.tcp_port(), 3307);
        assert!(opts.ssl_opts().is_some());
        let plain = replication_opts(&SecretString::from("mariadb://root@127.0.0.1/shop")).unwrap();
        assert!(plain.ssl_opts().is_none());
        let error = replication_opts(&SecretString::from("mysql://root@h/db?ssl-mode=sometimes"))
            .unwrap_err();
        assert_eq!(error.field, "connection_string");
    }
}
