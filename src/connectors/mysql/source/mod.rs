//! `mysql` source: polls MySQL or MariaDB tables and produces one record per
//! row, with the postgres source's fields and semantics.
//!
//! At-least-once: `poll` reads and stages; only `commit` (the batch is in
//! Iggy and its state is saved) moves the in-memory cursor and DELETEs or
//! marks the delivered rows. A NACK retries the same batch without a new
//! poll; a crash re-reads from the last saved cursor (cursor mode) or from the
//! rows still in the table (delete/mark mode), so nothing is skipped.
//!
//! The cursor is `(tracking value, key)`: with a non-unique tracking column
//! (`updated_at`) the table's primary key (or `primary_key_column`) breaks
//! ties, so rows sharing a tracking value across a batch boundary are all read.
//!
//! `mode = "cdc"` (module `cdc`) reads the tables' changes from the row
//! binlog instead.

mod cdc;
mod config;
mod lag;
mod query;
mod record;

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;
use tracing::{info, warn};

pub use cdc::{CdcSource, CdcState};
pub use config::{Consume, Mode, MySqlSourceConfig, PayloadFormat, SnapshotMode};
pub use record::write_value;

use crate::connectors::kit::sql;
use crate::connectors::kit::sql_poll::{Now, PollCore, PollSettings, PollState};
use crate::connectors::mysql::{
    connect_options, describe, is_transient, lazy_pool, with_connect_cause,
};
use crate::connectors::{
    ConnectorError, LagProbe, Source, SourceBatch, SourceEntry, parse_plugin_config, schema_of,
};
use query::{CATALOG_SQL, CatalogColumn, Placeholders, PlanError, TablePlan};
use record::{RowError, RowShape};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "mysql",
    feature: "mysql-source",
    description: "reads rows of MySQL or MariaDB tables by polling (cursor, delete or mark) or their changes from the row binlog (mode = \"cdc\"), at-least-once",
    secret_fields: &["connection_string"],
    sample_config: "connection_string = \"mysql://app:secret@localhost:3306/app\"\ntables = [\"users\"]\ntracking_column = \"id\"\npoll_interval = \"1s\"\nbatch_size = 1000\n",
    config_schema: schema_of::<MySqlSourceConfig>,
    build: |config| {
        let config: MySqlSourceConfig = parse_plugin_config(config)?;
        config.validate()?;
        Ok(match config.mode {
            Mode::Polling => Box::new(MySqlSource::new(config)),
            Mode::Cdc => Box::new(CdcSource::new(config)),
        })
    },
};
inventory::submit!(ENTRY);

/// What the source persists after each batch: the postgres source's layout.
pub type MySqlState = PollState;

pub struct MySqlSource {
    config: MySqlSourceConfig,
    pool: Option<MySqlPool>,
    /// Per-table plans, built from the catalog on first use (shared with the
    /// lag probe).
    plans: Arc<OnceCell<Vec<(TablePlan, RowShape)>>>,
    /// The committed cursor and the batches in flight.
    core: Arc<PollCore<Consumption>>,
}

/// One table's DELETE/UPDATE statements for the delivered rows.
type Consumption = (String, Vec<String>);

#[derive(Debug, thiserror::Error)]
pub enum MySqlSourceError {
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

impl From<MySqlSourceError> for ConnectorError {
    fn from(error: MySqlSourceError) -> Self {
        let transient = match &error {
            MySqlSourceError::Catalog { source, .. }
            | MySqlSourceError::Poll { source, .. }
            | MySqlSourceError::Consume { source, .. }
            | MySqlSourceError::Connect(source) => is_transient(source),
            _ => false,
        };
        if transient {
            ConnectorError::transient(error)
        } else {
            ConnectorError::fatal(error)
        }
    }
}

impl MySqlSource {
    pub fn new(config: MySqlSourceConfig) -> Self {
        let settings = PollSettings {
            poll_interval: config.poll_interval,
            stop_when_caught_up: config.stop_when_caught_up,
            verbose_logging: config.verbose_logging,
        };
        Self {
            config,
            pool: None,
            plans: Arc::new(OnceCell::new()),
            core: Arc::new(PollCore::new("mysql", settings)),
        }
    }

    fn pool(&self) -> Result<&MySqlPool, MySqlSourceError> {
        self.pool.as_ref().ok_or(MySqlSourceError::NotOpen)
    }

    async fn plans(&self) -> Result<&[(TablePlan, RowShape)], MySqlSourceError> {
        self.plans
            .get_or_try_init(|| self.build_plans())
            .await
            .map(Vec::as_slice)
    }

    async fn build_plans(&self) -> Result<Vec<(TablePlan, RowShape)>, MySqlSourceError> {
        let pool = self.pool()?;
        let mut plans = Vec::with_capacity(self.config.tables.len());
        for table in &self.config.tables {
            let (database, name) = match table.trim().split_once('.') {
                Some((database, name)) => (Some(database), name),
                None => (None, table.trim()),
            };
            let catalog_error = |source| MySqlSourceError::Catalog {
                table: table.clone(),
                source,
            };
            let rows = match sqlx::query(CATALOG_SQL)
                .bind(database)
                .bind(name)
                .fetch_all(pool)
                .await
            {
                Ok(rows) => rows,
                Err(error) => return Err(catalog_error(with_connect_cause(pool, error).await)),
            };
            let catalog: Vec<CatalogColumn> = rows
                .iter()
                .map(|row| {
                    Ok(CatalogColumn {
                        name: row.try_get(0)?,
                        data_type: row.try_get(1)?,
                        column_type: row.try_get(2)?,
                        primary_key: row.try_get::<i64, _>(3)? != 0,
                        unique: row.try_get::<i64, _>(4)? != 0,
                    })
                })
                .collect::<Result<_, sqlx::Error>>()
                .map_err(catalog_error)?;
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
    /// except past the rows of batches still in flight.
    async fn fetch(
        &self,
        plan: &TablePlan,
        base: &MySqlState,
        in_flight: bool,
        now: &Now,
    ) -> Result<Vec<MySqlRow>, MySqlSourceError> {
        let pool = self.pool()?;
        let offset = base.tracking_offsets.get(&plan.name);
        let follow_cursor = in_flight || self.config.consume() == Consume::Cursor;
        let cursor = offset.filter(|_| follow_cursor).map(|offset| {
            (
                offset.as_str(),
                base.tracking_keys.get(&plan.name).map(String::as_str),
            )
        });
        let custom_offset = offset
            .or(self.config.initial_offset.as_ref())
            .map_or("", String::as_str);
        let sql = plan.polling_sql(
            &self.config,
            cursor,
            &Placeholders {
                table: &plan.table_sql,
                offset: custom_offset,
                limit: self.config.batch_size,
                now_rfc3339: &now.rfc3339,
                now_unix: now.unix,
            },
        );
        // No bind parameters: the text protocol renders every value as text.
        match sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(pool).await {
            Ok(rows) => Ok(rows),
            Err(error) => Err(MySqlSourceError::Poll {
                table: plan.name.clone(),
                source: with_connect_cause(pool, error).await,
            }),
        }
    }

    /// Applies a batch's DELETE/UPDATE statements in one transaction: a failed
    /// commit leaves every row as it was and the engine's retry applies the
    /// whole batch again.
    async fn apply(&self, consume: &[Consumption]) -> Result<(), MySqlSourceError> {
        if consume.iter().all(|(_, statements)| statements.is_empty()) {
            return Ok(());
        }
        let pool = self.pool()?;
        let first_table = consume.first().map_or("", |(table, _)| table);
        let consume_error = |table: &str| {
            let table = table.to_owned();
            move |source| MySqlSourceError::Consume { table, source }
        };
        let mut transaction = match pool.begin().await {
            Ok(transaction) => transaction,
            Err(error) => {
                return Err(consume_error(first_table)(
                    with_connect_cause(pool, error).await,
                ));
            }
        };
        for (table, statements) in consume {
            for sql in statements {
                sqlx::raw_sql(AssertSqlSafe(sql.clone()))
                    .execute(&mut *transaction)
                    .await
                    .map_err(consume_error(table))?;
            }
        }
        transaction
            .commit()
            .await
            .map_err(consume_error(first_table))
    }
}

#[async_trait]
impl Source for MySqlSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            self.core.restore(bytes, &self.config.tables)?;
        }
        let options =
            connect_options(&self.config.connection_string).map_err(ConnectorError::fatal)?;
        self.pool = Some(lazy_pool(
            options,
            self.config.max_connections,
            Duration::from_secs(10),
        ));
        let pool = self.pool()?;
        // Fail fast on a missing table or column while the database is up; if
        // it is not, polls retry until it is.
        let check = async { self.plans().await.map(drop) };
        sql::check_on_open("mysql source", "polls", check, || async {
            let cause = with_connect_cause(pool, sqlx::Error::PoolTimedOut).await;
            if !is_transient(&cause) {
                return Err(ConnectorError::fatal(MySqlSourceError::Connect(cause)));
            }
            Ok(describe(&cause))
        })
        .await?;
        info!(tables = ?self.config.tables, mode = ?self.config.consume(), "mysql source open");
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
        let destructive = self.config.consume() != Consume::Cursor;
        for (plan, shape) in plans {
            let rows = self.fetch(plan, &base, in_flight, &now).await?;
            full |= rows.len() >= self.config.batch_size as usize;
            records.reserve(rows.len());
            let mut keys = Vec::new();
            let mut last = None;
            for row in &rows {
                let converted = shape
                    .convert(row, &now.rfc3339)
                    .map_err(MySqlSourceError::from)?;
                if destructive {
                    keys.push(converted.key.clone());
                }
                records.push(converted.record);
                last = Some((converted.tracking, converted.key));
            }
            next.advance(
                &plan.name,
                last.map(|(tracking, key)| (tracking, plan.key.is_some().then_some(key))),
            );
            if destructive && !keys.is_empty() {
                consume.push((plan.name.clone(), plan.consume_sql(&self.config, &keys)));
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
            config: self.config.clone(),
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

    #[tokio::test]
    async fn given_saved_cursors_when_opened_should_restore_them_and_drop_unknown_tables() {
        let config: MySqlSourceConfig = parse_plugin_config(&serde_json::json!({
            "connection_string": "mysql://root@127.0.0.1:1/none",
            "tables": ["a", "b"],
        }))
        .unwrap();
        let mut source = MySqlSource::new(config);
        let saved = MySqlState {
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
