//! `postgres` sink: writes messages into upstream's table layout, one row per
//! message, idempotently.
//!
//! Identity: the Iggy message id (`id DECIMAL(39,0) PRIMARY KEY`, upstream's
//! layout). A message whose id is already in the table is a copy of it (a
//! redelivery after a crash, or a source re-sending a row under the same
//! deterministic id) and `ON CONFLICT (id) DO NOTHING` skips it, so at-least-once
//! delivery never duplicates rows nor fails the batch. (stream, topic,
//! partition, offset) was not chosen: those columns do not exist with
//! `include_metadata = false`, and they would let a source-side duplicate in.
//!
//! Errors: connection loss, serialization failures, deadlocks, shutdowns, pool
//! timeouts and a target table that vanished mid-run are transient (the engine
//! retries the same batch); a row the database refuses (a constraint, a value of
//! the wrong type) is found by re-inserting the chunk row by row inside
//! savepoints and returned as a rejection naming its index; anything else (bad
//! credentials at start, a missing table without `auto_create_table`, a table
//! whose columns do not match) is fatal.

mod config;
mod insert;
mod numeric;

use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, PgConnection};
use tracing::{debug, info};

pub use config::{PayloadFormat, PostgresSinkConfig, table_sql};
pub use insert::Layout;
pub use numeric::PgU128;

use crate::connectors::kit::sql;
use crate::connectors::postgres::{describe, is_transient, lazy_pool, with_connect_cause};
use crate::connectors::{ConnectorError, Rejection, Sink, SinkError, parse_plugin_config};
use crate::connectors::{SinkEntry, schema_of};
use crate::message::{SinkMessage, TopicRef};
use insert::Batch;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "postgres",
    feature: "postgres-sink",
    description: "writes messages to a PostgreSQL table, idempotently (ON CONFLICT on the message id)",
    secret_fields: &["connection_string"],
    sample_config: "connection_string = \"postgres://app:secret@localhost:5432/app\"\ntarget_table = \"iggy_messages\"\nauto_create_table = true\npayload_format = \"json\"\n",
    config_schema: schema_of::<PostgresSinkConfig>,
    build: |config| {
        let config: PostgresSinkConfig = parse_plugin_config(config)?;
        let table = config.validate()?;
        Ok(Box::new(PostgresSink::new(config, table)))
    },
};
inventory::submit!(ENTRY);

pub struct PostgresSink {
    config: PostgresSinkConfig,
    /// The target table, quoted.
    table: String,
    layout: Layout,
    insert_sql: std::sync::Arc<str>,
    pool: Option<PgPool>,
    /// The table is known to exist (created or checked).
    ready: AtomicBool,
}

#[derive(Debug, thiserror::Error)]
pub enum PostgresSinkError {
    #[error("invalid connection_string: {}", describe(.0))]
    ConnectionString(#[source] sqlx::Error),
    #[error("{}", describe(.0))]
    Connect(#[source] sqlx::Error),
    #[error(
        "target table {0} does not exist; create it (see docs/connectors/postgres.md for upstream's layout) or set auto_create_table = true"
    )]
    MissingTable(String),
    #[error("cannot prepare target table {table}: {}", describe(.source))]
    Prepare {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(
        "target table {table} does not fit the sink's settings (include_metadata, include_checksum, include_origin_timestamp, payload_format; see docs/connectors/postgres.md for upstream's layout): {}",
        describe(.source)
    )]
    Columns {
        table: String,
        #[source]
        source: sqlx::Error,
    },
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

impl PostgresSinkError {
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

impl From<PostgresSinkError> for SinkError {
    fn from(error: PostgresSinkError) -> Self {
        if error.is_transient() {
            SinkError::transient(error)
        } else {
            SinkError::fatal(error)
        }
    }
}

impl From<PostgresSinkError> for ConnectorError {
    fn from(error: PostgresSinkError) -> Self {
        if error.is_transient() {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl PostgresSink {
    pub fn new(config: PostgresSinkConfig, table: String) -> Self {
        let layout = Layout {
            metadata: config.include_metadata,
            checksum: config.include_checksum,
            origin_timestamp: config.include_origin_timestamp,
            format: config.payload_format,
        };
        Self {
            insert_sql: layout.insert_sql(&table).into(),
            table,
            layout,
            config,
            pool: None,
            ready: AtomicBool::new(false),
        }
    }

    fn pool(&self) -> Result<&PgPool, PostgresSinkError> {
        self.pool.as_ref().ok_or(PostgresSinkError::NotOpen)
    }

    /// Creates the table (auto_create_table) or checks that it exists, then
    /// checks that its columns take what the sink writes.
    async fn prepare(&self) -> Result<(), PostgresSinkError> {
        if self.ready.load(Ordering::SeqCst) {
            return Ok(());
        }
        let pool = self.pool()?;
        let exists = if self.config.auto_create_table {
            sqlx::query(AssertSqlSafe(self.layout.create_sql(&self.table)))
                .execute(pool)
                .await
                .map(|_| true)
        } else {
            sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
                .bind(&self.table)
                .fetch_one(pool)
                .await
        };
        match exists {
            Ok(true) => {}
            Ok(false) => return Err(PostgresSinkError::MissingTable(self.table.clone())),
            Err(error) => {
                return Err(PostgresSinkError::Prepare {
                    table: self.table.clone(),
                    source: with_connect_cause(pool, error).await,
                });
            }
        }
        self.check_columns(pool).await?;
        self.ready.store(true, Ordering::SeqCst);
        Ok(())
    }

    /// Runs the sink's INSERT with no rows: the server checks every column
    /// it names and the type of every value, and `ON CONFLICT (id)` needs a
    /// unique `id`, so a table that does not fit fails here, before anything
    /// is consumed, instead of on the first batch.
    async fn check_columns(&self, pool: &PgPool) -> Result<(), PostgresSinkError> {
        let topic = TopicRef {
            stream: String::new(),
            topic: String::new(),
        };
        let (empty, _) = Batch::encode(&[], self.config.payload_format);
        let checked = match pool.acquire().await {
            Ok(mut connection) => self.insert(&mut connection, &topic, &empty, 0..0).await,
            Err(error) => Err(with_connect_cause(pool, error).await),
        };
        match checked {
            Ok(_) => Ok(()),
            Err(source) if is_transient(&source) => Err(PostgresSinkError::Prepare {
                table: self.table.clone(),
                source,
            }),
            Err(source) => Err(PostgresSinkError::Columns {
                table: self.table.clone(),
                source,
            }),
        }
    }

    /// Inserts `range` of the batch in one statement; returns the rows written
    /// (fewer than the range when some ids were already stored).
    async fn insert(
        &self,
        connection: &mut PgConnection,
        topic: &TopicRef,
        batch: &Batch,
        range: std::ops::Range<usize>,
    ) -> Result<u64, sqlx::Error> {
        let query =
            sqlx::query(AssertSqlSafe(self.insert_sql.clone())).bind(&batch.ids[range.clone()]);
        let query = match self.layout.format {
            PayloadFormat::Bytea => query.bind(batch.payload_bytes(range.clone())),
            PayloadFormat::Json | PayloadFormat::Text => {
                query.bind(batch.payload_text(range.clone()))
            }
        };
        let query = if self.layout.metadata {
            query
                .bind(&batch.offsets[range.clone()])
                .bind(&batch.timestamps[range.clone()])
                .bind(&topic.stream)
                .bind(&topic.topic)
                .bind(&batch.partitions[range.clone()])
        } else {
            query
        };
        let query = if self.layout.checksum {
            query.bind(&batch.checksums[range.clone()])
        } else {
            query
        };
        let query = if self.layout.origin_timestamp {
            query.bind(&batch.origin_timestamps[range])
        } else {
            query
        };
        Ok(query.execute(connection).await?.rows_affected())
    }

    /// Writes every chunk; one transaction when there is more than one chunk,
    /// so the batch commits with one flush.
    async fn insert_all(&self, topic: &TopicRef, batch: &Batch) -> Result<u64, sqlx::Error> {
        let pool = self.pool.as_ref().ok_or(sqlx::Error::PoolClosed)?;
        let chunk = self.config.batch_size as usize;
        if batch.is_empty() {
            return Ok(0);
        }
        if batch.len() <= chunk {
            let mut connection = pool.acquire().await?;
            return self
                .insert(&mut connection, topic, batch, 0..batch.len())
                .await;
        }
        let mut transaction = pool.begin().await?;
        let mut written = 0;
        for start in (0..batch.len()).step_by(chunk) {
            let end = (start + chunk).min(batch.len());
            written += self
                .insert(&mut transaction, topic, batch, start..end)
                .await?;
        }
        transaction.commit().await?;
        Ok(written)
    }

    /// After a multi-row insert failed on a row error: inserts the rows one by
    /// one inside savepoints to find the ones the database refuses, then rolls
    /// everything back (the engine writes the rest again).
    async fn find_refused(
        &self,
        topic: &TopicRef,
        batch: &Batch,
    ) -> Result<Vec<Rejection>, PostgresSinkError> {
        let pool = self.pool()?;
        let write_error = |source| PostgresSinkError::Write {
            table: self.table.clone(),
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
                Ok(_) => {
                    sqlx::query("RELEASE SAVEPOINT iggy_row")
                        .execute(&mut *transaction)
                        .await
                        .map_err(write_error)?;
                }
                Err(error) if is_row_error(&error) => {
                    sqlx::query("ROLLBACK TO SAVEPOINT iggy_row")
                        .execute(&mut *transaction)
                        .await
                        .map_err(write_error)?;
                    refused.push(Rejection {
                        index,
                        reason: format!("{} refused the row: {}", self.table, describe(&error)),
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
impl Sink for PostgresSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.pool = Some(
            lazy_pool(
                &self.config.connection_string,
                self.config.max_connections,
                self.config.acquire_timeout,
            )
            .map_err(PostgresSinkError::ConnectionString)?,
        );
        // Bad credentials or a missing table fail the start; an unreachable
        // database does not: writes retry until it is back.
        let pool = self.pool()?;
        sql::check_on_open("postgres sink", "writes", self.prepare(), || async {
            let cause = with_connect_cause(pool, sqlx::Error::PoolTimedOut).await;
            if !is_transient(&cause) {
                return Err(PostgresSinkError::Connect(cause).into());
            }
            Ok(describe(&cause))
        })
        .await?;
        info!(table = %self.table, payload_format = ?self.config.payload_format, "postgres sink open");
        Ok(())
    }

    /// Every payload format stores JSON as text: no value to build and
    /// serialize again.
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
                debug!(table = %self.table, %error, "multi-row insert refused; finding the rows");
                let refused = self.find_refused(topic, &batch).await?;
                if refused.is_empty() {
                    return Err(PostgresSinkError::Unattributed(self.table.clone()).into());
                }
                return Err(SinkError::Rejected(refused));
            }
            Err(error) => {
                return Err(PostgresSinkError::Write {
                    table: self.table.clone(),
                    source: with_connect_cause(self.pool()?, error).await,
                }
                .into());
            }
        };
        let skipped = messages.len() as u64 - written.min(messages.len() as u64);
        if self.config.verbose_logging {
            info!(table = %self.table, written, already_stored = skipped, "postgres sink wrote a batch");
        } else {
            debug!(table = %self.table, written, already_stored = skipped, "postgres sink wrote a batch");
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

/// A database error caused by the data of a row, not by the statement or the
/// server: data exceptions (22), integrity constraints (23), limits such as an
/// oversized row (54).
fn is_row_error(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(database) => database.code().is_some_and(|code| {
            code.starts_with("22") || code.starts_with("23") || code.starts_with("54")
        }),
        _ => false,
    }
}
