//! `mysql` sink: writes messages into a MySQL or MariaDB table, one row per
//! message, with the postgres sink's layout, idempotently.
//!
//! Identity: the Iggy message id (`id DECIMAL(39,0) PRIMARY KEY`). A message
//! whose id is already stored is a copy (a redelivery after a crash) and
//! `ON DUPLICATE KEY UPDATE id = id` makes it a no-op. `INSERT IGNORE` would
//! do the same about as fast (measured in BENCHMARKS.md), but it also turns every
//! other error of the row into a warning and stores a mangled value (a string
//! in an INT column becomes 0), so a refused row would be silently written
//! instead of rejected.
//!
//! Errors: a lost connection, a deadlock, a lock wait timeout, a server
//! shutting down or out of connections, and a table that vanished mid-run are
//! transient (the engine retries the same batch); a row the server refuses
//! (a value of the wrong type, a constraint, invalid JSON) is found by
//! inserting the batch row by row inside savepoints, then rolling back, and is
//! returned as a rejection naming its index; bad credentials, a missing table
//! without `auto_create_table` or a table without the sink's columns are fatal.

mod config;

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use sqlx::mysql::{MySql, MySqlConnection, MySqlPool};
use sqlx::{AssertSqlSafe, Row};
use tracing::{debug, info};

pub use config::{MySqlSinkConfig, PayloadFormat, Target};

use crate::connectors::kit::sql::{self, append_payload};
use crate::connectors::mysql::{
    connect_options, describe, error_number, is_transient, lazy_pool, with_connect_cause,
};
use crate::connectors::{
    ConnectorError, Rejection, Sink, SinkEntry, SinkError, parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

/// Payload bytes per INSERT statement, well under the server's default
/// `max_allowed_packet` (16 MiB on MariaDB 10.11, 64 MiB on MySQL 8).
const STATEMENT_BYTES: usize = 4 << 20;
/// The protocol's limit of placeholders per prepared statement.
const MAX_PLACEHOLDERS: usize = 65_535;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "mysql",
    feature: "mysql-sink",
    description: "writes messages to a MySQL or MariaDB table, idempotently (ON DUPLICATE KEY on the message id)",
    secret_fields: &["connection_string"],
    sample_config: "connection_string = \"mysql://app:secret@localhost:3306/app\"\ntarget_table = \"iggy_messages\"\nauto_create_table = true\npayload_format = \"json\"\n",
    config_schema: schema_of::<MySqlSinkConfig>,
    build: |config| {
        let config: MySqlSinkConfig = parse_plugin_config(config)?;
        let target = config.validate()?;
        Ok(Box::new(MySqlSink::new(config, target)))
    },
};
inventory::submit!(ENTRY);

pub struct MySqlSink {
    config: MySqlSinkConfig,
    target: Target,
    pool: Option<MySqlPool>,
    /// The table is known to exist with the sink's columns.
    ready: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum MySqlSinkError {
    #[error("{}", describe(.0))]
    Connect(#[source] sqlx::Error),
    #[error(
        "target table {0} does not exist; create it (see docs/connectors/mysql.md for the layout) or set auto_create_table = true"
    )]
    MissingTable(String),
    #[error("cannot prepare target table {table}: {}", describe(.source))]
    Prepare {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "target table {table} does not fit the sink's settings (include_metadata, include_checksum, include_origin_timestamp; see docs/connectors/mysql.md for the layout): {problem}"
    )]
    Columns { table: String, problem: String },
    #[error("writing to {table} failed: {}", describe(.source))]
    Write {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "a multi-row insert into {0} failed on a row error, but every row succeeded alone; retrying the batch"
    )]
    Unattributed(String),
    #[error("the sink is not open")]
    NotOpen,
}

impl MySqlSinkError {
    fn is_transient(&self) -> bool {
        match self {
            Self::Prepare { source, .. } | Self::Write { source, .. } | Self::Connect(source) => {
                is_transient(source)
            }
            Self::Unattributed(_) => true,
            _ => false,
        }
    }
}

impl From<MySqlSinkError> for SinkError {
    fn from(error: MySqlSinkError) -> Self {
        if error.is_transient() {
            SinkError::transient(error)
        } else {
            SinkError::fatal(error)
        }
    }
}

impl From<MySqlSinkError> for ConnectorError {
    fn from(error: MySqlSinkError) -> Self {
        if error.is_transient() {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl MySqlSink {
    pub fn new(config: MySqlSinkConfig, target: Target) -> Self {
        Self {
            config,
            target,
            pool: None,
            ready: AtomicBool::new(false),
        }
    }

    fn pool(&self) -> Result<&MySqlPool, MySqlSinkError> {
        self.pool.as_ref().ok_or(MySqlSinkError::NotOpen)
    }

    /// The columns written, in bind order.
    fn columns(&self) -> Vec<&'static str> {
        let mut columns = vec!["id", "payload"];
        if self.config.include_metadata {
            columns.extend([
                "iggy_offset",
                "iggy_timestamp",
                "iggy_stream",
                "iggy_topic",
                "iggy_partition_id",
            ]);
        }
        if self.config.include_checksum {
            columns.push("iggy_checksum");
        }
        if self.config.include_origin_timestamp {
            columns.push("iggy_origin_timestamp");
        }
        columns
    }

    /// The postgres sink's table in MySQL types. Times are UTC `DATETIME(6)`
    /// (a `TIMESTAMP` column would shift with the session's time zone).
    fn create_sql(&self) -> String {
        let mut sql = format!(
            "CREATE TABLE IF NOT EXISTS {} (id DECIMAL(39, 0) NOT NULL PRIMARY KEY",
            self.target.sql
        );
        if self.config.include_metadata {
            sql.push_str(
                ", iggy_offset BIGINT, iggy_timestamp DATETIME(6), iggy_stream TEXT, \
                 iggy_topic TEXT, iggy_partition_id INT",
            );
        }
        if self.config.include_checksum {
            sql.push_str(", iggy_checksum BIGINT");
        }
        if self.config.include_origin_timestamp {
            sql.push_str(", iggy_origin_timestamp DATETIME(6)");
        }
        sql.push_str(&format!(
            ", payload {}, created_at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6))",
            self.config.payload_format.sql_type()
        ));
        sql
    }

    /// The INSERT of `rows` rows.
    fn insert_sql(&self, rows: usize) -> String {
        let columns = self.columns();
        let micros = "TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00')";
        let row = columns
            .iter()
            .map(|column| match *column {
                "iggy_timestamp" | "iggy_origin_timestamp" => micros,
                _ => "?",
            })
            .collect::<Vec<_>>()
            .join(", ");
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ",
            self.target.sql,
            columns.join(", ")
        );
        sql.reserve(rows * (row.len() + 4) + 32);
        for index in 0..rows {
            if index > 0 {
                sql.push_str(", ");
            }
            sql.push('(');
            sql.push_str(&row);
            sql.push(')');
        }
        sql.push_str(" ON DUPLICATE KEY UPDATE id = id");
        sql
    }

    /// Creates the table (auto_create_table) or checks that it exists, then
    /// checks that it has the sink's columns and a unique `id`.
    async fn prepare(&self) -> Result<(), MySqlSinkError> {
        if self.ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        let pool = self.pool()?;
        let prepare_error = |source| MySqlSinkError::Prepare {
            table: self.target.sql.clone(),
            source,
        };
        if self.config.auto_create_table
            && let Err(error) = sqlx::query(AssertSqlSafe(self.create_sql()))
                .execute(pool)
                .await
        {
            return Err(prepare_error(with_connect_cause(pool, error).await));
        }
        let columns = match sqlx::query(
            "SELECT LOWER(column_name) FROM information_schema.columns \
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ?",
        )
        .bind(&self.target.database)
        .bind(&self.target.table)
        .fetch_all(pool)
        .await
        {
            Ok(rows) => rows
                .iter()
                .map(|row| row.try_get::<String, _>(0))
                .collect::<Result<Vec<_>, _>>()
                .map_err(prepare_error)?,
            Err(error) => return Err(prepare_error(with_connect_cause(pool, error).await)),
        };
        if columns.is_empty() {
            return Err(MySqlSinkError::MissingTable(self.target.sql.clone()));
        }
        let missing: Vec<&str> = self
            .columns()
            .into_iter()
            .filter(|column| !columns.iter().any(|present| present == column))
            .collect();
        let columns_error = |problem: String| MySqlSinkError::Columns {
            table: self.target.sql.clone(),
            problem,
        };
        if !missing.is_empty() {
            return Err(columns_error(format!(
                "it has no column {}",
                missing.join(", ")
            )));
        }
        let unique_id: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM (SELECT index_name FROM information_schema.statistics \
             WHERE table_schema = COALESCE(?, DATABASE()) AND table_name = ? AND non_unique = 0 \
             GROUP BY index_name HAVING COUNT(*) = 1 AND LOWER(MAX(column_name)) = 'id') AS k",
        )
        .bind(&self.target.database)
        .bind(&self.target.table)
        .fetch_one(pool)
        .await
        .map_err(prepare_error)?;
        if unique_id == 0 {
            return Err(columns_error(
                "its id column is not a primary key or unique index, so a redelivered message would be stored twice".into(),
            ));
        }
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Splits the batch into statements of at most `batch_size` rows (and
    /// the placeholder and byte limits).
    fn chunks(&self, batch: &Batch) -> Vec<std::ops::Range<usize>> {
        let per_row = self.columns().len();
        let rows = (self.config.batch_size as usize).min(MAX_PLACEHOLDERS / per_row);
        let mut chunks = Vec::new();
        let mut start = 0;
        let mut bytes = 0;
        for index in 0..batch.len() {
            let size = batch.payload(index).len();
            if index > start && (index - start >= rows || bytes + size > STATEMENT_BYTES) {
                chunks.push(start..index);
                start = index;
                bytes = 0;
            }
            bytes += size;
        }
        if start < batch.len() {
            chunks.push(start..batch.len());
        }
        chunks
    }

    /// Inserts `range` of the batch in one statement; returns the rows written.
    async fn insert(
        &self,
        connection: &mut MySqlConnection,
        topic: &TopicRef,
        batch: &Batch,
        range: std::ops::Range<usize>,
    ) -> Result<u64, sqlx::Error> {
        let sql = self.insert_sql(range.len());
        let mut query: sqlx::query::Query<'_, MySql, _> = sqlx::query(AssertSqlSafe(sql));
        for index in range {
            let row = &batch.rows[index];
            query = query.bind(&row.id);
            query = match self.config.payload_format {
                PayloadFormat::Bytea => query.bind(batch.payload(index)),
                PayloadFormat::Json | PayloadFormat::Text => query.bind(batch.payload_text(index)),
            };
            if self.config.include_metadata {
                query = query
                    .bind(row.offset)
                    .bind(row.timestamp)
                    .bind(&topic.stream)
                    .bind(&topic.topic)
                    .bind(row.partition_id);
            }
            if self.config.include_checksum {
                query = query.bind(row.checksum);
            }
            if self.config.include_origin_timestamp {
                query = query.bind(row.origin_timestamp);
            }
        }
        Ok(query.execute(connection).await?.rows_affected())
    }

    /// Writes every chunk in one transaction, so the batch commits with one
    /// flush and a failure leaves nothing half-written.
    async fn insert_all(&self, topic: &TopicRef, batch: &Batch) -> Result<u64, sqlx::Error> {
        let pool = self.pool.as_ref().ok_or(sqlx::Error::PoolClosed)?;
        let chunks = self.chunks(batch);
        if let [only] = chunks.as_slice() {
            let mut connection = pool.acquire().await?;
            return self
                .insert(&mut connection, topic, batch, only.clone())
                .await;
        }
        let mut transaction = pool.begin().await?;
        let mut written = 0;
        for chunk in chunks {
            written += self.insert(&mut transaction, topic, batch, chunk).await?;
        }
        transaction.commit().await?;
        Ok(written)
    }

    /// After a multi-row insert failed on a row error: inserts the rows one by
    /// one inside savepoints to find the ones the server refuses, then rolls
    /// everything back (the engine writes the rest again).
    async fn find_refused(
        &self,
        topic: &TopicRef,
        batch: &Batch,
    ) -> Result<Vec<Rejection>, MySqlSinkError> {
        let pool = self.pool()?;
        let write_error = |source| MySqlSinkError::Write {
            table: self.target.sql.clone(),
            source,
        };
        let mut transaction = pool.begin().await.map_err(write_error)?;
        let mut refused = Vec::new();
        for index in 0..batch.len() {
            sqlx::query("SAVEPOINT iggy_row")
                .execute(&mut *transaction)
                .await
                .map_err(write_error)?;
            match self
                .insert(&mut transaction, topic, batch, index..index + 1)
                .await
            {
                Ok(_) => {}
                Err(error) if is_row_error(&error) => {
                    sqlx::query("ROLLBACK TO SAVEPOINT iggy_row")
                        .execute(&mut *transaction)
                        .await
                        .map_err(write_error)?;
                    refused.push(Rejection {
                        index,
                        reason: format!(
                            "{} refused the row: {}",
                            self.target.sql,
                            describe(&error)
                        ),
                    });
                }
                Err(error) => return Err(write_error(error)),
            }
        }
        transaction.rollback().await.map_err(write_error)?;
        Ok(refused)
    }
}

#[async_trait]
impl Sink for MySqlSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let options =
            connect_options(&self.config.connection_string).map_err(ConnectorError::fatal)?;
        self.pool = Some(lazy_pool(
            options,
            self.config.max_connections,
            self.config.acquire_timeout,
        ));
        // Bad credentials or a missing table fail the start; an unreachable
        // database does not: writes retry until it is back.
        let pool = self.pool()?;
        sql::check_on_open("mysql sink", "writes", self.prepare(), || async {
            let cause = with_connect_cause(pool, sqlx::Error::PoolTimedOut).await;
            if !is_transient(&cause) {
                return Err(MySqlSinkError::Connect(cause).into());
            }
            Ok(describe(&cause))
        })
        .await?;
        info!(table = %self.target.sql, payload_format = self.config.payload_format.name(), "mysql sink open");
        Ok(())
    }

    /// Every payload format stores JSON as text.
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if messages.is_empty() {
            return Ok(());
        }
        self.prepare().await?;
        let (batch, rejected) = Batch::encode(messages, self.config.payload_format);
        if !rejected.is_empty() {
            return Err(SinkError::Rejected(rejected));
        }
        let written = match self.insert_all(topic, &batch).await {
            Ok(written) => written,
            Err(error) if is_row_error(&error) => {
                debug!(table = %self.target.sql, error = %describe(&error), "multi-row insert refused; finding the rows");
                let refused = self.find_refused(topic, &batch).await?;
                if refused.is_empty() {
                    return Err(MySqlSinkError::Unattributed(self.target.sql.clone()).into());
                }
                return Err(SinkError::Rejected(refused));
            }
            Err(error) => {
                return Err(MySqlSinkError::Write {
                    table: self.target.sql.clone(),
                    source: with_connect_cause(self.pool()?, error).await,
                }
                .into());
            }
        };
        if self.config.verbose_logging {
            info!(table = %self.target.sql, messages = messages.len(), rows_affected = written, "mysql sink wrote a batch");
        } else {
            debug!(table = %self.target.sql, messages = messages.len(), rows_affected = written, "mysql sink wrote a batch");
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        if let Some(pool) = self.pool.take() {
            pool.close().await;
        }
        Ok(())
    }
}

/// An error caused by the data of a row, not by the statement or the server:
/// SQLSTATE classes 22 (data) and 23 (integrity: NOT NULL, a unique key other
/// than `id`, a CHECK such as MariaDB's JSON_VALID), and the errors strict
/// mode raises for a value that does not fit (1366, 1292, MySQL 8's 3140
/// invalid JSON).
fn is_row_error(error: &sqlx::Error) -> bool {
    let sqlx::Error::Database(database) = error else {
        return false;
    };
    database
        .code()
        .is_some_and(|code| code.starts_with("22") || code.starts_with("23"))
        || error_number(error).is_some_and(|number| matches!(number, 1366 | 1292 | 3140 | 4025))
}

/// One message's values as bound.
struct BoundRow {
    /// The message id in decimal, for the DECIMAL(39,0) column.
    id: String,
    offset: i64,
    timestamp: i64,
    partition_id: i32,
    checksum: i64,
    origin_timestamp: i64,
}

/// A batch as bound: payloads rendered into one buffer.
struct Batch {
    rows: Vec<BoundRow>,
    buffer: Vec<u8>,
    /// End of each payload in `buffer`.
    ends: Vec<usize>,
}

impl Batch {
    /// Renders the messages; payloads the payload column cannot hold at all
    /// (bytes that are not UTF-8 for a text or JSON column) are rejections.
    fn encode(messages: &[SinkMessage], format: PayloadFormat) -> (Self, Vec<Rejection>) {
        let mut batch = Batch {
            rows: Vec::with_capacity(messages.len()),
            buffer: Vec::new(),
            ends: Vec::with_capacity(messages.len()),
        };
        let mut rejected = Vec::new();
        let text_column = format != PayloadFormat::Bytea;
        for (index, message) in messages.iter().enumerate() {
            // Iggy's u64 values are stored in signed columns, as the postgres sink does.
            batch.rows.push(BoundRow {
                id: message.id.to_string(),
                offset: message.offset as i64,
                timestamp: message.timestamp as i64,
                partition_id: message.partition_id as i32,
                checksum: message.checksum as i64,
                origin_timestamp: message.origin_timestamp as i64,
            });
            if let Err(reason) = append_payload(
                &mut batch.buffer,
                &message.payload,
                text_column,
                format.name(),
            ) {
                rejected.push(Rejection { index, reason });
            }
            batch.ends.push(batch.buffer.len());
        }
        (batch, rejected)
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn payload(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.buffer[start..self.ends[index]]
    }

    /// A payload as text: UTF-8 by construction (JSON, text) or checked in
    /// `encode` (raw bytes).
    fn payload_text(&self, index: usize) -> &str {
        std::str::from_utf8(self.payload(index)).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;

    fn sink(extra: serde_json::Value) -> MySqlSink {
        let mut value = serde_json::json!({
            "connection_string": "mysql://localhost/db",
            "target_table": "t",
        });
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        let config: MySqlSinkConfig = parse_plugin_config(&value).unwrap();
        let target = config.validate().unwrap();
        MySqlSink::new(config, target)
    }

    #[test]
    fn given_all_columns_when_insert_is_built_should_bind_in_column_order_and_skip_duplicates() {
        let sql = sink(serde_json::json!({})).insert_sql(2);
        let row = "(?, ?, ?, TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'), ?, ?, ?, ?, \
                   TIMESTAMPADD(MICROSECOND, ?, '1970-01-01 00:00:00'))";
        assert_eq!(
            sql,
            format!(
                "INSERT INTO `t` (id, payload, iggy_offset, iggy_timestamp, iggy_stream, iggy_topic, \
                 iggy_partition_id, iggy_checksum, iggy_origin_timestamp) VALUES {row}, {row} \
                 ON DUPLICATE KEY UPDATE id = id"
            )
        );
        let bare = sink(
            serde_json::json!({"include_metadata": false, "include_checksum": false, "include_origin_timestamp": false}),
        );
        assert_eq!(
            bare.insert_sql(1),
            "INSERT INTO `t` (id, payload) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id"
        );
    }

    #[test]
    fn given_big_payloads_when_chunked_should_respect_rows_and_bytes() {
        let sink = sink(serde_json::json!({"batch_size": 3}));
        let messages: Vec<SinkMessage> = [10, 10, 10, 10, STATEMENT_BYTES, 1]
            .iter()
            .enumerate()
            .map(|(index, size)| SinkMessage {
                id: index as u128,
                offset: index as u64,
                partition_id: 1,
                timestamp: 0,
                origin_timestamp: 0,
                checksum: 0,
                headers: Vec::new(),
                payload: Payload::Raw(bytes::Bytes::from(vec![b'x'; *size])),
            })
            .collect();
        let (batch, rejected) = Batch::encode(&messages, PayloadFormat::Bytea);
        assert!(rejected.is_empty());
        assert_eq!(sink.chunks(&batch), vec![0..3, 3..4, 4..5, 5..6]);
    }
}
