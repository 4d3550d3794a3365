//! `postgres` source: polls PostgreSQL tables and produces one record per row;
//! `mode = "cdc"` (module `cdc`) reads their changes by logical replication.
//!
//! At-least-once in every mode: `poll` reads and stages; only `commit` (the
//! batch is in Iggy and its state is saved) moves the in-memory cursor and
//! DELETEs or marks the delivered rows. A NACK retries the same batch without a
//! new poll; a crash re-reads from the last saved cursor (cursor mode) or from
//! the rows still in the table (delete/mark mode), so nothing is skipped.
//!
//! The cursor is `(tracking value, key)`: with a non-unique tracking column
//! (`updated_at`) the table's primary key (or `primary_key_column`) breaks ties,
//! so rows sharing a tracking value across a batch boundary are all read.

mod cdc;
mod config;
mod lag;
mod query;
mod quote;
mod record;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgPool, PgRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;
use tracing::{info, warn};

pub use cdc::{CdcSource, CdcState, Partial, derived_slot_name, format_lsn, parse_lsn};
pub use config::{Consume, Mode, PayloadFormat, PostgresSourceConfig, SnapshotMode};
pub use record::{message_id, to_snake_case};

use crate::connectors::kit::sql;
use crate::connectors::kit::sql_poll::{Now, PollCore, PollSettings, PollState};
use crate::connectors::postgres::{describe, is_transient, lazy_pool, with_connect_cause};
use crate::connectors::{
    ConnectorError, LagProbe, Source, SourceBatch, SourceEntry, parse_plugin_config, schema_of,
};
use query::{CATALOG_SQL, CatalogColumn, Placeholders, PlanError, TablePlan, fill_placeholders};
use record::{RowError, RowShape};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "postgres",
    feature: "postgres-source",
    description: "reads rows of PostgreSQL tables by polling (cursor, delete or mark) or their changes by logical replication (mode = \"cdc\"), at-least-once",
    secret_fields: &["connection_string"],
    sample_config: "connection_string = \"postgres://app:secret@localhost:5432/app\"\ntables = [\"users\"]\ntracking_column = \"id\"\npoll_interval = \"1s\"\nbatch_size = 1000\n",
    config_schema: schema_of::<PostgresSourceConfig>,
    build: |config| {
        let config: PostgresSourceConfig = parse_plugin_config(config)?;
        config.validate()?;
        Ok(match config.mode {
            Mode::Polling => Box::new(PostgresSource::new(config)),
            Mode::Cdc => Box::new(CdcSource::new(config)),
        })
    },
};
inventory::submit!(ENTRY);

/// What the source persists after each batch (the layout all SQL sources share).
pub type PostgresState = PollState;

pub struct PostgresSource {
    config: PostgresSourceConfig,
    pool: Option<PgPool>,
    /// Per-table SQL, built from the catalog on first use (shared with the
    /// lag probe).
    plans: Arc<OnceCell<Vec<(TablePlan, RowShape)>>>,
    /// The committed cursor and the batches in flight.
    core: Arc<PollCore<Consumption>>,
}

/// One table's DELETE/UPDATE statement and the keys it applies to.
type Consumption = (String, Arc<str>, Vec<String>);

#[derive(Debug, thiserror::Error)]
pub enum PostgresSourceError {
    #[error("invalid connection_string: {}", describe(.0))]
    ConnectionString(#[source] sqlx::Error),
    #[error("cannot read the columns of table {table}: {}", describe(.source))]
    Catalog {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("polling table {table} failed: {}", describe(.source))]
    Poll {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("applying the committed batch to table {table} failed: {}", describe(.source))]
    Consume {
        table: String,
        #[source]
        source: sqlx::Error,
    },
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Row(#[from] RowError),
    #[error("{}", describe(.0))]
    Connect(#[source] sqlx::Error),
    #[error("the source is not open")]
    NotOpen,
}

impl From<PostgresSourceError> for ConnectorError {
    fn from(error: PostgresSourceError) -> Self {
        let transient = match &error {
            PostgresSourceError::Catalog { source, .. }
            | PostgresSourceError::Poll { source, .. }
            | PostgresSourceError::Consume { source, .. } => is_transient(source),
            _ => false,
        };
        if transient {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl PostgresSource {
    pub fn new(config: PostgresSourceConfig) -> Self {
        let settings = PollSettings {
            poll_interval: config.poll_interval,
            stop_when_caught_up: config.stop_when_caught_up,
            verbose_logging: config.verbose_logging,
        };
        Self {
            config,
            pool: None,
            plans: Arc::new(OnceCell::new()),
            core: Arc::new(PollCore::new("postgres", settings)),
        }
    }

    fn pool(&self) -> Result<&PgPool, PostgresSourceError> {
        self.pool.as_ref().ok_or(PostgresSourceError::NotOpen)
    }

    async fn plans(&self) -> Result<&[(TablePlan, RowShape)], PostgresSourceError> {
        self.plans
            .get_or_try_init(|| self.build_plans())
            .await
            .map(Vec::as_slice)
    }

    async fn build_plans(&self) -> Result<Vec<(TablePlan, RowShape)>, PostgresSourceError> {
        let pool = self.pool()?;
        let mut plans = Vec::with_capacity(self.config.tables.len());
        for table in &self.config.tables {
            let quoted = quote::quote_qualified(table).unwrap_or_default();
            let rows = match sqlx::query(CATALOG_SQL).bind(quoted).fetch_all(pool).await {
                Ok(rows) => rows,
                Err(error) => {
                    return Err(PostgresSourceError::Catalog {
                        table: table.clone(),
                        source: with_connect_cause(pool, error).await,
                    });
                }
            };
            let catalog: Vec<CatalogColumn> = rows
                .iter()
                .map(|row| {
                    Ok(CatalogColumn {
                        name: row.try_get(0)?,
                        sql_type: row.try_get(1)?,
                        primary_key: row.try_get(2)?,
                        unique: row.try_get(3)?,
                    })
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(|source| PostgresSourceError::Catalog {
                    table: table.clone(),
                    source,
                })?;
            let (plan, warning) = TablePlan::build(&self.config, table, &catalog)?;
            if let Some(warning) = warning {
                warn!("{warning}");
            }
            let shape = RowShape {
                table: table.clone(),
                payload: self.config.payload().map(|(_, format)| format),
                include_metadata: self.config.include_metadata,
                snake_case_columns: self.config.snake_case_columns,
                key_is_tracking: plan.key.is_none(),
            };
            plans.push((plan, shape));
        }
        Ok(plans)
    }

    /// Runs one table's query from `base`'s cursor. In delete and mark mode
    /// the query reads from the start (what is committed is gone or marked),
    /// except past the rows of batches still in flight (`in_flight`), which
    /// are neither yet.
    async fn fetch(
        &self,
        plan: &TablePlan,
        base: &PostgresState,
        in_flight: bool,
        now: &Now,
    ) -> Result<Vec<PgRow>, PostgresSourceError> {
        let pool = self.pool()?;
        let offset = base.tracking_offsets.get(&plan.name);
        let consume = match self.config.consume() {
            _ if in_flight => Consume::Cursor,
            consume => consume,
        };
        let query = match (&plan.custom, consume, offset) {
            (Some(template), _, _) => {
                let offset = offset
                    .or(self.config.initial_offset.as_ref())
                    .map_or("", String::as_str);
                let sql = fill_placeholders(
                    template,
                    &Placeholders {
                        table: &plan.name,
                        offset,
                        limit: self.config.batch_size,
                        now_rfc3339: &now.rfc3339,
                        now_unix: now.unix,
                    },
                );
                sqlx::query(AssertSqlSafe(sql))
            }
            (None, Consume::Cursor, Some(offset)) => {
                let query = sqlx::query(AssertSqlSafe(plan.next_sql.clone())).bind(offset);
                match plan.key {
                    Some(_) => query.bind(base.tracking_keys.get(&plan.name)),
                    None => query,
                }
            }
            (None, _, _) => {
                let query = sqlx::query(AssertSqlSafe(plan.first_sql.clone()));
                match &self.config.initial_offset {
                    Some(initial) => query.bind(initial),
                    None => query,
                }
            }
        };
        match query.fetch_all(pool).await {
            Ok(rows) => Ok(rows),
            Err(error) => Err(PostgresSourceError::Poll {
                table: plan.name.clone(),
                source: with_connect_cause(pool, error).await,
            }),
        }
    }

    async fn apply(&self, consume: &[Consumption]) -> Result<(), PostgresSourceError> {
        if consume.iter().all(|(_, _, keys)| keys.is_empty()) {
            return Ok(());
        }
        let pool = self.pool()?;
        let first_table = consume.first().map_or("", |(table, _, _)| table);
        let consume_error = |table: &str| {
            let table = table.to_owned();
            move |source| PostgresSourceError::Consume { table, source }
        };
        // One transaction: a failed commit leaves every row as it was, and the
        // engine's retry applies the whole batch again.
        let mut transaction = match pool.begin().await {
            Ok(transaction) => transaction,
            Err(error) => {
                return Err(consume_error(first_table)(
                    with_connect_cause(pool, error).await,
                ));
            }
        };
        for (table, sql, keys) in consume {
            if keys.is_empty() {
                continue;
            }
            sqlx::query(AssertSqlSafe(sql.clone()))
                .bind(keys)
                .execute(&mut *transaction)
                .await
                .map_err(consume_error(table))?;
        }
        transaction
            .commit()
            .await
            .map_err(consume_error(first_table))
    }
}

#[async_trait]
impl Source for PostgresSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            self.core.restore(bytes, &self.config.tables)?;
        }
        self.pool = Some(
            lazy_pool(
                &self.config.connection_string,
                self.config.max_connections,
                Duration::from_secs(10),
            )
            .map_err(PostgresSourceError::ConnectionString)?,
        );
        let pool = self.pool()?;
        // Fail fast on a missing table or column while the database is up; if
        // it is not, polls retry until it is.
        let check = async { self.plans().await.map(drop) };
        sql::check_on_open("postgres source", "polls", check, || async {
            let cause = with_connect_cause(pool, sqlx::Error::PoolTimedOut).await;
            if !is_transient(&cause) {
                return Err(ConnectorError::fatal(PostgresSourceError::Connect(cause)));
            }
            Ok(describe(&cause))
        })
        .await?;
        info!(tables = ?self.config.tables, mode = ?self.config.consume(), "postgres source open");
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = tokio::time::Instant::now();
        let plans = self.plans().await?;
        let (base, in_flight) = self.core.poll_base();
        let now = Now::read();
        let mut next = base.clone();
        let mut records = Vec::new();
        let mut consume = Vec::new();
        let mut full = false;
        for (plan, shape) in plans {
            let rows = self.fetch(plan, &base, in_flight, &now).await?;
            full |= rows.len() >= self.config.batch_size as usize;
            records.reserve(rows.len());
            let mut keys = Vec::new();
            let mut last = None;
            for row in &rows {
                let converted = shape
                    .convert(row, &now.rfc3339)
                    .map_err(PostgresSourceError::from)?;
                if plan.consume_sql.is_some() {
                    keys.push(
                        converted
                            .key
                            .clone()
                            .unwrap_or_else(|| converted.tracking.clone()),
                    );
                }
                records.push(converted.record);
                last = Some((converted.tracking, converted.key));
            }
            next.advance(
                &plan.name,
                last.map(|(tracking, key)| (tracking, key.filter(|_| plan.key.is_some()))),
            );
            if let Some(sql) = &plan.consume_sql {
                consume.push((plan.name.clone(), sql.clone(), keys));
            }
        }
        self.core
            .finish_poll(next, records, consume, full, &self.config.tables, started)
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let Some(consume) = self.core.oldest_consume() else {
            return Ok(());
        };
        self.apply(&consume).await?;
        self.core.committed_oldest();
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        self.config.consume().max_in_flight()
    }

    /// Deleting or marking consumed rows leaves their only copy in Iggy.
    fn destructive(&self) -> bool {
        self.config.consume().destructive()
    }

    /// Rows not committed yet, unless a custom query reads the tables.
    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        if self.config.custom_query.is_some() {
            return None;
        }
        Some(Arc::new(lag::PendingRows {
            pool: self.pool.clone()?,
            plans: self.plans.clone(),
            core: self.core.clone(),
            consume: self.config.consume(),
            initial_offset: self.config.initial_offset.clone(),
        }))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.core.forget_in_flight();
        if let Some(pool) = self.pool.take() {
            pool.close().await;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::connectors::encode_state;

    fn config() -> PostgresSourceConfig {
        parse_plugin_config(&serde_json::json!({
            "connection_string": "postgres://postgres@127.0.0.1:1/none",
            "tables": ["a", "b"],
        }))
        .unwrap()
    }

    #[tokio::test]
    async fn given_saved_cursors_when_opened_should_restore_them_and_drop_unknown_tables() {
        let mut source = PostgresSource::new(config());
        let saved = PostgresState {
            tracking_offsets: BTreeMap::from([
                ("a".into(), "10".into()),
                ("gone".into(), "5".into()),
            ]),
            tracking_keys: BTreeMap::new(),
            processed_rows: 10,
        };
        // Port 1 refuses connections: open still succeeds (polls retry).
        source
            .open(Some(&encode_state(&saved).unwrap()))
            .await
            .unwrap();
        let restored = source.core.lock_committed().clone();
        assert_eq!(
            restored.tracking_offsets,
            BTreeMap::from([("a".into(), "10".into())])
        );
        assert_eq!(restored.processed_rows, 10);
        source.close().await.unwrap();
    }
}
