//! `mode = "cdc"` of the mysql source: the row binlog (`binlog_format =
//! ROW`, `binlog_row_image = FULL`), read as a replica reads it, with the
//! binlog file and position as the state, moved only in `commit`.
//!
//! - Snapshot (`snapshot = "initial"`): one `START TRANSACTION WITH
//!   CONSISTENT SNAPSHOT` reads each table in primary-key order, a batch at a
//!   time; its binlog coordinates (MariaDB's `binlog_snapshot_file` and
//!   `_position`; on MySQL read under a brief `FLUSH TABLES WITH READ LOCK`)
//!   are where streaming starts. The state keeps, per table, the last key
//!   delivered and which tables are done, so a crash resumes the snapshot
//!   (under a newer snapshot: rows changed meanwhile come again from the
//!   binlog, duplicated at worst, never lost).
//! - Streaming: a task reads the binlog from the committed position and
//!   hands over whole transactions; each poll takes transactions until
//!   `batch_size` changes, and the batch's state is the position right after
//!   its last commit. A NACK resends the same batch; a crash resumes from the
//!   saved position, so nothing committed repeats and nothing unsaved is
//!   skipped. A lost connection restarts the task after the last transaction
//!   already taken.
//! - Ids: streamed changes get `(file number, rows event position, row)`,
//!   snapshot rows a hash of the table and key; both the same on a re-read.

mod binlog;
mod lag;
mod render;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySql, MySqlPool, MySqlRow};
use sqlx::pool::PoolConnection;
use sqlx::{AssertSqlSafe, Row};
use tracing::{debug, info, warn};

use super::config::{MySqlSourceConfig, Operation, SnapshotMode};
use super::query::{CatalogColumn, Column, column};
use super::record::write_columns;
use crate::connectors::kit::cdc::RecordShape;
use crate::connectors::kit::row_id::hash_id;
use crate::connectors::mysql::{
    connect_options, describe, is_transient, lazy_pool, quote_identifier, with_connect_cause,
};
use crate::connectors::{
    ConnectorContext, ConnectorError, LagProbe, Source, SourceBatch, decode_state, encode_state,
};
use crate::message::SourceRecord;
use binlog::{CapturedTable, Position, ReadError, Reader, Txn};
use render::ColumnInfo;

/// How long `open` waits for the database before leaving the setup to `poll`.
const OPEN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What a CDC source persists after each batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CdcState {
    /// Where the next unread transaction starts (unknown before the first
    /// batch).
    pub binlog: Position,
    /// The initial snapshot's progress; `None` before it started (or with
    /// `snapshot = "never"`).
    #[serde(default)]
    pub snapshot: Option<SnapshotProgress>,
    #[serde(default)]
    pub processed_rows: u64,
}

/// How far the initial snapshot got. Bounded by the number of tables.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotProgress {
    /// When the first snapshot was taken: the rows' `timestamp`.
    pub taken_at: String,
    /// Table -> primary key (one text per key column) of the last row delivered.
    pub keys: BTreeMap<String, Vec<String>>,
    /// Tables read completely.
    pub done_tables: Vec<String>,
    pub done: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum CdcError {
    #[error("{what}: {}", describe(.source))]
    Database {
        what: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("the server is not set up for mode = \"cdc\": {0}")]
    Server(String),
    #[error("tables: {0}")]
    Table(String),
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("the source is not open")]
    NotOpen,
}

impl From<CdcError> for ConnectorError {
    fn from(error: CdcError) -> Self {
        let transient = match &error {
            CdcError::Database { source, .. } => is_transient(source),
            CdcError::Read(read) => read.is_transient(),
            _ => false,
        };
        if transient {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

/// One captured table: how the binlog names it, its columns, and how the
/// snapshot reads it.
#[derive(Debug, Clone)]
struct TablePlan {
    captured: CapturedTable,
    table_sql: String,
    /// Primary key columns in key order.
    key: Vec<(String, Column)>,
}

pub struct CdcSource {
    config: MySqlSourceConfig,
    operations: Vec<Operation>,
    key: String,
    pool: Option<MySqlPool>,
    replication: Option<mysql_async::Opts>,
    plans: tokio::sync::OnceCell<Vec<TablePlan>>,
    /// The snapshot's transaction while it runs.
    snapshot: tokio::sync::Mutex<Option<PoolConnection<MySql>>>,
    /// The binlog task, started on the first streaming poll.
    reader: tokio::sync::Mutex<Option<Reader>>,
    /// Transactions taken from the reader and not yet in a batch.
    pending: Mutex<VecDeque<Txn>>,
    /// Shared with the lag probe.
    committed: Arc<Mutex<CdcState>>,
    /// The state of the batch polled and not yet committed (one at a time).
    staged: Mutex<Option<CdcState>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl CdcSource {
    pub fn new(config: MySqlSourceConfig) -> Self {
        let operations = config.operations().unwrap_or_default();
        Self {
            config,
            operations,
            key: String::new(),
            pool: None,
            replication: None,
            plans: tokio::sync::OnceCell::new(),
            snapshot: tokio::sync::Mutex::new(None),
            reader: tokio::sync::Mutex::new(None),
            pending: Mutex::new(VecDeque::new()),
            committed: Arc::new(Mutex::new(CdcState::default())),
            staged: Mutex::new(None),
        }
    }

    fn pool(&self) -> Result<&MySqlPool, CdcError> {
        self.pool.as_ref().ok_or(CdcError::NotOpen)
    }

    /// `server_id`, or one derived from the connector key, so two connectors
    /// on one server never register as the same replica.
    fn server_id(&self) -> u32 {
        self.config.server_id.unwrap_or_else(|| {
            let hash = hash_id(&["mysql-cdc", &self.key]);
            0x4000_0000 | (hash as u32 & 0x3fff_ffff)
        })
    }

    async fn plans(&self) -> Result<&[TablePlan], CdcError> {
        self.plans
            .get_or_try_init(|| self.set_up())
            .await
            .map(Vec::as_slice)
    }

    /// Checks the server writes a row binlog this source can read, and reads
    /// the captured tables' columns.
    async fn set_up(&self) -> Result<Vec<TablePlan>, CdcError> {
        let pool = self.pool()?;
        let database = |what: &str| {
            let what = what.to_owned();
            move |source| CdcError::Database { what, source }
        };
        let settings = sqlx::query(
            "SELECT CAST(@@log_bin AS CHAR), CAST(@@binlog_format AS CHAR), \
             CAST(@@binlog_row_image AS CHAR), CAST(DATABASE() AS CHAR)",
        )
        .fetch_one(pool)
        .await;
        let settings = match settings {
            Ok(row) => row,
            Err(error) => {
                return Err(database("reading the server's binlog settings")(
                    with_connect_cause(pool, error).await,
                ));
            }
        };
        let text = |index: usize| -> String {
            settings
                .try_get::<Option<String>, _>(index)
                .ok()
                .flatten()
                .unwrap_or_default()
        };
        let (log_bin, format, image, current) = (text(0), text(1), text(2), text(3));
        if !matches!(log_bin.as_str(), "1" | "ON") {
            return Err(CdcError::Server(
                "the binary log is off; start the server with log_bin".into(),
            ));
        }
        if !format.eq_ignore_ascii_case("ROW") {
            return Err(CdcError::Server(format!(
                "binlog_format is {format}; set binlog_format = ROW"
            )));
        }
        if !image.eq_ignore_ascii_case("FULL") {
            return Err(CdcError::Server(format!(
                "binlog_row_image is {image}; set binlog_row_image = FULL (updates need whole rows)"
            )));
        }
        let mut plans = Vec::with_capacity(self.config.tables.len());
        for table in &self.config.tables {
            let (schema, name) = match table.trim().split_once('.') {
                Some((schema, name)) => (schema.to_owned(), name.to_owned()),
                None => (current.clone(), table.trim().to_owned()),
            };
            if schema.is_empty() {
                return Err(CdcError::Table(format!(
                    "table {table} names no database and the connection_string selects none; write it as database.table"
                )));
            }
            let rows = sqlx::query(CDC_CATALOG_SQL)
                .bind(&schema)
                .bind(&name)
                .fetch_all(pool)
                .await
                .map_err(database(&format!("reading the columns of table {table}")))?;
            if rows.is_empty() {
                return Err(CdcError::Table(format!(
                    "table {table} does not exist (or is not visible to this user)"
                )));
            }
            let mut columns = Vec::with_capacity(rows.len());
            let mut key = Vec::new();
            for row in &rows {
                let read = |index| row.try_get::<String, _>(index);
                let (column_name, data_type, column_type) =
                    (|| Ok::<_, sqlx::Error>((read(0)?, read(1)?, read(2)?)))()
                        .map_err(database(&format!("reading the columns of table {table}")))?;
                let key_position: Option<i64> = row.try_get(3).unwrap_or(None);
                if let Some(position) = key_position {
                    let catalog = CatalogColumn {
                        name: column_name.clone(),
                        data_type: data_type.clone(),
                        column_type: column_type.clone(),
                        primary_key: true,
                        unique: true,
                    };
                    key.push((position, column_name.clone(), column(&catalog)));
                }
                columns.push(ColumnInfo::new(&column_name, &data_type, &column_type));
            }
            if key.is_empty() && self.config.snapshot == SnapshotMode::Initial {
                return Err(CdcError::Table(format!(
                    "table {table} has no primary key, which the initial snapshot reads it by; add one or set snapshot = \"never\""
                )));
            }
            key.sort_by_key(|(position, _, _)| *position);
            plans.push(TablePlan {
                captured: CapturedTable {
                    name: table.clone(),
                    database: schema.clone(),
                    table: name.clone(),
                    columns,
                },
                table_sql: format!(
                    "{}.{}",
                    quote_identifier(&schema).unwrap_or_default(),
                    quote_identifier(&name).unwrap_or_default()
                ),
                key: key
                    .into_iter()
                    .map(|(_, name, column)| (name, column))
                    .collect(),
            });
        }
        Ok(plans)
    }

    fn snapshot_pending(&self, state: &CdcState) -> bool {
        self.config.snapshot == SnapshotMode::Initial
            && !state
                .snapshot
                .as_ref()
                .is_some_and(|progress| progress.done)
    }

    /// The server's current binlog position (where a capture without a
    /// snapshot starts).
    async fn current_position(&self) -> Result<Position, CdcError> {
        server_position(self.pool()?).await
    }

    /// Starts the snapshot transaction and returns its binlog coordinates.
    async fn begin_snapshot(&self) -> Result<(PoolConnection<MySql>, Position), CdcError> {
        let pool = self.pool()?;
        let database = |what: &'static str| {
            move |source| CdcError::Database {
                what: what.into(),
                source,
            }
        };
        let mut connection = pool
            .acquire()
            .await
            .map_err(database("starting the snapshot"))?;
        let run = |sql: &'static str| sqlx::raw_sql(AssertSqlSafe(sql));
        run("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .execute(&mut *connection)
            .await
            .map_err(database("starting the snapshot"))?;
        run("START TRANSACTION WITH CONSISTENT SNAPSHOT")
            .execute(&mut *connection)
            .await
            .map_err(database("starting the snapshot"))?;
        // MariaDB (and Percona) tell where in the binlog the snapshot is.
        let status = run("SHOW STATUS LIKE 'binlog_snapshot_%'")
            .fetch_all(&mut *connection)
            .await
            .map_err(database("reading the snapshot's binlog position"))?;
        let mut file = String::new();
        let mut position = None;
        for row in &status {
            let name: String = row.try_get(0).unwrap_or_default();
            let value: String = row.try_get(1).unwrap_or_default();
            match name.to_ascii_lowercase().as_str() {
                "binlog_snapshot_file" => file = value,
                "binlog_snapshot_position" => position = value.parse().ok(),
                _ => {}
            }
        }
        if let (false, Some(position)) = (file.is_empty(), position) {
            return Ok((connection, Position { file, position }));
        }
        // MySQL: hold writes off while the snapshot and the position are read.
        run("ROLLBACK")
            .execute(&mut *connection)
            .await
            .map_err(database("starting the snapshot"))?;
        run("FLUSH TABLES WITH READ LOCK")
            .execute(&mut *connection)
            .await
            .map_err(database(
                "locking tables for the snapshot (needs the RELOAD privilege)",
            ))?;
        let started = async {
            run("START TRANSACTION WITH CONSISTENT SNAPSHOT")
                .execute(&mut *connection)
                .await?;
            let mut row = None;
            for statement in ["SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"] {
                if let Ok(found) = run(statement).fetch_optional(&mut *connection).await {
                    row = found;
                    break;
                }
            }
            Ok::<_, sqlx::Error>(row)
        }
        .await;
        run("UNLOCK TABLES")
            .execute(&mut *connection)
            .await
            .map_err(database("unlocking tables"))?;
        let row = started
            .map_err(database("starting the snapshot"))?
            .ok_or_else(|| {
                CdcError::Server(
                    "SHOW MASTER STATUS returned nothing: the binary log is off".into(),
                )
            })?;
        let position = position_of(&row)?;
        Ok((connection, position))
    }

    async fn snapshot_batch(
        &self,
        plans: &[TablePlan],
        base: &CdcState,
    ) -> Result<(Vec<SourceRecord>, CdcState), CdcError> {
        let mut guard = self.snapshot.lock().await;
        let mut next = base.clone();
        if guard.is_none() {
            let (connection, position) = self.begin_snapshot().await?;
            *guard = Some(connection);
            if next.snapshot.is_none() {
                next.binlog = position;
                next.snapshot = Some(SnapshotProgress {
                    taken_at: rfc3339(
                        SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .unwrap_or_default()
                            .as_secs() as i64,
                    ),
                    ..SnapshotProgress::default()
                });
                info!(connector_key = %self.key, binlog = %next.binlog, "mysql cdc source started its snapshot");
            } else {
                info!(connector_key = %self.key, binlog = %next.binlog, "mysql cdc source resumes its snapshot");
            }
        }
        let Some(connection) = guard.as_mut() else {
            return Err(CdcError::NotOpen);
        };
        let mut progress = next.snapshot.take().unwrap_or_default();
        let shape = self.shape();
        let mut records = Vec::new();
        let limit = self.config.batch_size as usize;
        for plan in plans {
            let name = &plan.captured.name;
            if progress.done_tables.contains(name) {
                continue;
            }
            let wanted = limit - records.len();
            let sql = snapshot_sql(plan, progress.keys.get(name), wanted);
            let rows: Vec<MySqlRow> = sqlx::raw_sql(AssertSqlSafe(sql))
                .fetch_all(&mut **connection)
                .await
                .map_err(|source| CdcError::Database {
                    what: format!("reading table {name} for the snapshot"),
                    source,
                })?;
            let key_columns = plan.key.len();
            for row in &rows {
                let key: Vec<String> = (0..key_columns)
                    .map(|index| text_at(row, index))
                    .collect::<Result<_, _>>()
                    .map_err(|source| CdcError::Database {
                        what: format!("reading the key of a row of table {name}"),
                        source,
                    })?;
                let mut data = Vec::with_capacity(256);
                write_columns(&mut data, row, key_columns, false).map_err(|source| {
                    CdcError::Database {
                        what: format!("reading a row of table {name}"),
                        source,
                    }
                })?;
                let data = String::from_utf8_lossy(&data);
                let payload = shape.payload(name, "SELECT", &progress.taken_at, Some(&data), None);
                let mut parts = vec!["mysql-snapshot", name.as_str()];
                parts.extend(key.iter().map(String::as_str));
                records.push(SourceRecord::new(payload).with_id(hash_id(&parts)));
                progress.keys.insert(name.clone(), key);
            }
            if rows.len() < wanted {
                progress.done_tables.push(name.clone());
            }
            if records.len() >= limit {
                break;
            }
        }
        progress.done = plans
            .iter()
            .all(|plan| progress.done_tables.contains(&plan.captured.name));
        if progress.done {
            if let Some(mut connection) = guard.take()
                && let Err(error) = sqlx::raw_sql(AssertSqlSafe("COMMIT"))
                    .execute(&mut *connection)
                    .await
            {
                debug!(error = %describe(&error), "ending the snapshot transaction");
            }
            progress.keys.clear();
            info!(connector_key = %self.key, binlog = %next.binlog, "mysql cdc source finished its snapshot; streaming the binlog");
        }
        next.snapshot = Some(progress);
        Ok((records, next))
    }

    /// Where the binlog task starts after a lost connection: right after the
    /// last transaction taken from it.
    fn read_position(&self, base: &CdcState) -> Position {
        lock(&self.pending)
            .back()
            .map(|txn| txn.end.clone())
            .unwrap_or_else(|| base.binlog.clone())
    }

    async fn stream_batch(
        &self,
        plans: &[TablePlan],
        base: &CdcState,
    ) -> Result<(Vec<SourceRecord>, CdcState), CdcError> {
        let mut reader = self.reader.lock().await;
        if reader.is_none() {
            let opts = self.replication.clone().ok_or(CdcError::NotOpen)?;
            let from = self.read_position(base);
            debug!(connector_key = %self.key, binlog = %from, "starting the binlog reader");
            *reader = Some(Reader::spawn(
                opts,
                self.server_id(),
                from,
                plans.iter().map(|plan| plan.captured.clone()).collect(),
                self.operations.clone(),
            ));
        }
        let Some(task) = reader.as_mut() else {
            return Err(CdcError::NotOpen);
        };
        let limit = self.config.batch_size as usize;
        let queued = |pending: &VecDeque<Txn>| {
            pending
                .iter()
                .map(|txn| txn.changes.len().max(1))
                .sum::<usize>()
        };
        let mut failure = None;
        if lock(&self.pending).is_empty() {
            match tokio::time::timeout(self.config.poll_interval, task.next()).await {
                Ok(Ok(txn)) => lock(&self.pending).push_back(txn),
                Ok(Err(error)) => failure = Some(error),
                Err(_) => {}
            }
        }
        while failure.is_none() && queued(&lock(&self.pending)) < limit {
            match task.try_next() {
                Some(Ok(txn)) => lock(&self.pending).push_back(txn),
                Some(Err(error)) => failure = Some(error),
                None => break,
            }
        }
        if let Some(error) = failure {
            // The task ended; the next poll starts another after what was taken.
            *reader = None;
            if lock(&self.pending).is_empty() {
                return Err(error.into());
            }
            warn!(connector_key = %self.key, %error, "the binlog connection failed; delivering what was read, then reconnecting");
        }
        let mut next = base.clone();
        let mut records = Vec::new();
        let shape = self.shape();
        let mut pending = lock(&self.pending);
        while records.len() < limit
            && let Some(txn) = pending.pop_front()
        {
            let timestamp = rfc3339(i64::from(txn.timestamp));
            for change in txn.changes {
                let table = &plans[change.table].captured.name;
                let payload = shape.payload(
                    table,
                    change.operation.name(),
                    &timestamp,
                    change.data.as_deref(),
                    change.old_data.as_deref(),
                );
                records.push(SourceRecord::new(payload).with_id(change.id));
            }
            next.binlog = txn.end;
        }
        Ok((records, next))
    }

    fn shape(&self) -> RecordShape {
        RecordShape {
            include_metadata: self.config.include_metadata,
            snake_case_columns: self.config.snake_case_columns,
        }
    }
}

#[async_trait]
impl Source for CdcSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        Some(Arc::new(lag::BinlogLag {
            pool: self.pool.clone()?,
            committed: self.committed.clone(),
        }))
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            let restored: CdcState = decode_state(bytes)?;
            info!(connector_key = %self.key, binlog = %restored.binlog, "mysql cdc source restored its position");
            *lock(&self.committed) = restored;
        }
        let options =
            connect_options(&self.config.connection_string).map_err(ConnectorError::fatal)?;
        self.replication = Some(
            binlog::replication_opts(&self.config.connection_string)
                .map_err(ConnectorError::fatal)?,
        );
        self.pool = Some(lazy_pool(
            options,
            self.config.max_connections.max(2),
            Duration::from_secs(10),
        ));
        match tokio::time::timeout(OPEN_CHECK_TIMEOUT, self.plans()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                let error = ConnectorError::from(error);
                if !error.is_transient() {
                    return Err(error);
                }
                warn!(connector_key = %self.key, %error, "mysql cdc source cannot reach the database yet; polls will retry");
            }
            Err(_) => {
                let cause = with_connect_cause(self.pool()?, sqlx::Error::PoolTimedOut).await;
                if !is_transient(&cause) {
                    return Err(ConnectorError::fatal(CdcError::Database {
                        what: "connecting".into(),
                        source: cause,
                    }));
                }
                warn!(connector_key = %self.key, error = %describe(&cause), "mysql cdc source cannot reach the database yet; polls will retry");
            }
        }
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let plans = self.plans().await?;
        let base = lock(&self.committed).clone();
        let (records, mut next) = if self.snapshot_pending(&base) {
            self.snapshot_batch(plans, &base).await?
        } else if !base.binlog.is_known() {
            let mut next = base.clone();
            next.binlog = self.current_position().await?;
            info!(connector_key = %self.key, binlog = %next.binlog, "mysql cdc source starts at the current binlog position");
            (Vec::new(), next)
        } else {
            self.stream_batch(plans, &base).await?
        };
        next.processed_rows += records.len() as u64;
        let state = if next == base {
            None
        } else {
            Some(encode_state(&next)?)
        };
        if self.config.verbose_logging {
            info!(connector_key = %self.key, records = records.len(), binlog = %next.binlog, "mysql cdc source polled a batch");
        }
        *lock(&self.staged) = Some(next);
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(next) = lock(&self.staged).take() {
            *lock(&self.committed) = next;
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        lock(&self.staged).take();
        lock(&self.pending).clear();
        self.reader.lock().await.take();
        if let Some(mut connection) = self.snapshot.lock().await.take()
            && let Err(error) = sqlx::raw_sql(AssertSqlSafe("ROLLBACK"))
                .execute(&mut *connection)
                .await
        {
            debug!(error = %describe(&error), "ending the snapshot transaction");
        }
        if let Some(pool) = self.pool.take() {
            pool.close().await;
        }
        Ok(())
    }
}

/// Columns of a captured table in order, with each primary key column's
/// place in the key.
const CDC_CATALOG_SQL: &str = "\
SELECT CAST(c.column_name AS CHAR), CAST(c.data_type AS CHAR), CAST(c.column_type AS CHAR), \
  (SELECT CAST(s.seq_in_index AS SIGNED) FROM information_schema.statistics s WHERE s.table_schema = c.table_schema \
     AND s.table_name = c.table_name AND s.index_name = 'PRIMARY' AND s.column_name = c.column_name) \
FROM information_schema.columns c \
WHERE c.table_schema = ? AND c.table_name = ? \
ORDER BY c.ordinal_position";

/// The next rows of a table in key order: the key columns, then every column.
fn snapshot_sql(plan: &TablePlan, after: Option<&Vec<String>>, limit: usize) -> String {
    let keys: Vec<&str> = plan
        .key
        .iter()
        .map(|(_, column)| column.quoted.as_str())
        .collect();
    let mut sql = format!(
        "SELECT {}, t.* FROM {} t",
        keys.iter()
            .map(|key| format!("t.{key}"))
            .collect::<Vec<_>>()
            .join(", "),
        plan.table_sql
    );
    if let Some(after) = after.filter(|after| after.len() == plan.key.len()) {
        let literals: Vec<String> = plan
            .key
            .iter()
            .zip(after)
            .map(|((_, column), value)| column.literal(value))
            .collect();
        if keys.len() == 1 {
            sql.push_str(&format!(" WHERE t.{} > {}", keys[0], literals[0]));
        } else {
            sql.push_str(&format!(
                " WHERE ({}) > ({})",
                keys.iter()
                    .map(|key| format!("t.{key}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                literals.join(", ")
            ));
        }
    }
    sql.push_str(&format!(
        " ORDER BY {} LIMIT {limit}",
        keys.iter()
            .map(|key| format!("t.{key}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    sql
}

/// A column of a text-protocol row as the text the server sent.
fn text_at(row: &MySqlRow, index: usize) -> Result<String, sqlx::Error> {
    use sqlx::ValueRef;
    let value = row.try_get_raw(index)?;
    if value.is_null() {
        return Ok(String::new());
    }
    let bytes = <&[u8] as sqlx::Decode<MySql>>::decode(value).map_err(sqlx::Error::Decode)?;
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// The server's current binlog position.
async fn server_position(pool: &MySqlPool) -> Result<Position, CdcError> {
    let mut last_error = None;
    // `SHOW BINARY LOG STATUS` on MySQL 8.4 and later.
    for statement in ["SHOW MASTER STATUS", "SHOW BINARY LOG STATUS"] {
        match sqlx::raw_sql(AssertSqlSafe(statement))
            .fetch_optional(pool)
            .await
        {
            Ok(Some(row)) => return position_of(&row),
            Ok(None) => {
                return Err(CdcError::Server(
                    "SHOW MASTER STATUS returned nothing: the binary log is off".into(),
                ));
            }
            Err(error) => last_error = Some(error),
        }
    }
    Err(CdcError::Database {
        what: "reading the binlog position".into(),
        source: last_error.unwrap_or(sqlx::Error::RowNotFound),
    })
}

/// `File` and `Position` of a `SHOW MASTER STATUS` row.
fn position_of(row: &MySqlRow) -> Result<Position, CdcError> {
    let file: String = row.try_get(0).map_err(|source| CdcError::Database {
        what: "reading the binlog position".into(),
        source,
    })?;
    let position: u64 = row.try_get(1).map_err(|source| CdcError::Database {
        what: "reading the binlog position".into(),
        source,
    })?;
    Ok(Position { file, position })
}

/// Seconds since the epoch as RFC 3339 UTC.
fn rfc3339(seconds: i64) -> String {
    humantime::format_rfc3339_seconds(UNIX_EPOCH + Duration::from_secs(seconds.max(0) as u64))
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(keys: &[(&str, &str, &str)]) -> TablePlan {
        TablePlan {
            captured: CapturedTable {
                name: "shop.orders".into(),
                database: "shop".into(),
                table: "orders".into(),
                columns: Vec::new(),
            },
            table_sql: "`shop`.`orders`".into(),
            key: keys
                .iter()
                .map(|(name, data_type, column_type)| {
                    let catalog = CatalogColumn {
                        name: (*name).into(),
                        data_type: (*data_type).into(),
                        column_type: (*column_type).into(),
                        primary_key: true,
                        unique: true,
                    };
                    ((*name).into(), column(&catalog))
                })
                .collect(),
        }
    }

    #[test]
    fn given_snapshot_progress_when_the_next_rows_are_read_should_continue_after_the_last_key() {
        let single = plan(&[("id", "bigint", "bigint(20)")]);
        assert_eq!(
            snapshot_sql(&single, None, 10),
            "SELECT t.`id`, t.* FROM `shop`.`orders` t ORDER BY t.`id` LIMIT 10"
        );
        assert_eq!(
            snapshot_sql(&single, Some(&vec!["7".into()]), 10),
            "SELECT t.`id`, t.* FROM `shop`.`orders` t WHERE t.`id` > CAST(_utf8mb4 X'37' AS SIGNED) ORDER BY t.`id` LIMIT 10"
        );
        let composite = plan(&[
            ("region", "varchar", "varchar(8)"),
            ("id", "int", "int(11)"),
        ]);
        assert_eq!(
            snapshot_sql(&composite, Some(&vec!["eu".into(), "3".into()]), 5),
            "SELECT t.`region`, t.`id`, t.* FROM `shop`.`orders` t WHERE (t.`region`, t.`id`) > (_utf8mb4 X'6575', CAST(_utf8mb4 X'33' AS SIGNED)) ORDER BY t.`region`, t.`id` LIMIT 5"
        );
    }

    #[test]
    fn given_connector_keys_when_no_server_id_is_set_should_derive_distinct_nonzero_ones() {
        let config: MySqlSourceConfig =
            crate::connectors::parse_plugin_config(&serde_json::json!({
                "connection_string": "mysql://root@127.0.0.1/shop",
                "mode": "cdc",
                "tables": ["orders"],
            }))
            .unwrap();
        let mut ids = std::collections::HashSet::new();
        for key in ["a", "b", "orders-cdc"] {
            let mut source = CdcSource::new(config.clone());
            source.key = key.into();
            let id = source.server_id();
            assert!(id >= 0x4000_0000, "{id}");
            ids.insert(id);
        }
        assert_eq!(ids.len(), 3);
    }

    #[test]
    fn given_unix_seconds_when_formatted_should_be_rfc3339_utc() {
        assert_eq!(rfc3339(1_704_164_645), "2024-01-02T03:04:05Z");
    }
}
