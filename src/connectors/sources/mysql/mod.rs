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
//! `mode = "cdc"` (the row binlog) is not built yet: such a config is refused
//! at validation, naming the field.

mod config;
mod query;
mod record;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use sqlx::mysql::{MySqlPool, MySqlRow};
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;
use tracing::{debug, info, warn};

pub use config::{Consume, Mode, MySqlSourceConfig, PayloadFormat};
pub use record::write_value;

use crate::connectors::mysql::{
    connect_options, describe, is_transient, lazy_pool, with_connect_cause,
};
use crate::connectors::{
    ConnectorError, Source, SourceBatch, SourceEntry, decode_state, encode_state,
    parse_plugin_config, schema_of,
};
use query::{CATALOG_SQL, CatalogColumn, PlanError, Placeholders, TablePlan};
use record::{RowError, RowShape};

/// How long `open` waits for the database before leaving the checks to `poll`.
const OPEN_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

pub const ENTRY: SourceEntry = SourceEntry {
    name: "mysql",
    feature: "mysql-source",
    description: "reads rows of MySQL or MariaDB tables by polling (cursor, delete or mark), at-least-once",
    secret_fields: &["connection_string"],
    sample_config: "connection_string = \"mysql://app:secret@localhost:3306/app\"\ntables = [\"users\"]\ntracking_column = \"id\"\npoll_interval = \"1s\"\nbatch_size = 1000\n",
    config_schema: schema_of::<MySqlSourceConfig>,
    build: |config| {
        let config: MySqlSourceConfig = parse_plugin_config(config)?;
        config.validate()?;
        Ok(Box::new(MySqlSource::new(config)))
    },
};

/// What the source persists after each batch: per table, the cursor of the
/// last delivered row (the postgres source's state layout).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MySqlState {
    /// Table -> tracking value of the last delivered row.
    pub tracking_offsets: BTreeMap<String, String>,
    /// Table -> key of that row, when ties are broken by a key column.
    #[serde(default)]
    pub tracking_keys: BTreeMap<String, String>,
    #[serde(default)]
    pub processed_rows: u64,
}

pub struct MySqlSource {
    config: MySqlSourceConfig,
    pool: Option<MySqlPool>,
    /// Per-table plans, built from the catalog on first use.
    plans: OnceCell<Vec<(TablePlan, RowShape)>>,
    /// The state of the last committed batch: where the next poll starts.
    committed: Mutex<MySqlState>,
    /// What each batch in flight applies on commit, oldest first.
    staged: Mutex<VecDeque<Staged>>,
    /// The last poll found every table caught up: wait `poll_interval` first.
    caught_up: AtomicBool,
}

#[derive(Debug)]
struct Staged {
    state: MySqlState,
    /// Per table: the DELETE/UPDATE statements of the delivered rows.
    consume: Arc<Vec<(String, Vec<String>)>>,
}

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
        Self {
            config,
            pool: None,
            plans: OnceCell::new(),
            committed: Mutex::new(MySqlState::default()),
            staged: Mutex::new(VecDeque::new()),
            caught_up: AtomicBool::new(false),
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

    fn lock_committed(&self) -> MutexGuard<'_, MySqlState> {
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<Staged>> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Where the next poll starts: after the newest batch in flight, or after
    /// the last committed one. `true` when batches are in flight.
    fn poll_base(&self) -> (MySqlState, bool) {
        let staged = self.lock_staged();
        match staged.back() {
            Some(newest) => (newest.state.clone(), true),
            None => (self.lock_committed().clone(), false),
        }
    }

    /// Applies a batch's DELETE/UPDATE statements in one transaction: a failed
    /// commit leaves every row as it was and the engine's retry applies the
    /// whole batch again.
    async fn apply(&self, consume: &[(String, Vec<String>)]) -> Result<(), MySqlSourceError> {
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
            let mut restored: MySqlState = decode_state(bytes)?;
            restored.retain_tables(&self.config.tables);
            info!(tracking_offsets = ?restored.tracking_offsets, processed_rows = restored.processed_rows, "mysql source restored its cursor");
            *self.lock_committed() = restored;
        }
        let options =
            connect_options(&self.config.connection_string).map_err(ConnectorError::fatal)?;
        self.pool = Some(lazy_pool(
            options,
            self.config.max_connections,
            Duration::from_secs(10),
        ));
        // Fail fast on a missing table or column while the database is up; if
        // it is not, polls retry until it is.
        match tokio::time::timeout(OPEN_CHECK_TIMEOUT, self.plans()).await {
            Ok(Ok(_)) => {}
            Ok(Err(error)) => {
                let error = ConnectorError::from(error);
                if !error.is_transient() {
                    return Err(error);
                }
                warn!(%error, "mysql source cannot reach the database yet; polls will retry");
            }
            Err(_) => {
                let cause = with_connect_cause(self.pool()?, sqlx::Error::PoolTimedOut).await;
                if !is_transient(&cause) {
                    return Err(ConnectorError::fatal(MySqlSourceError::Connect(cause)));
                }
                warn!(error = %describe(&cause), "mysql source cannot reach the database yet; polls will retry");
            }
        }
        info!(tables = ?self.config.tables, mode = ?self.config.consume(), "mysql source open");
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        if self.caught_up.load(Ordering::SeqCst) && !self.config.stop_when_caught_up {
            tokio::time::sleep(self.config.poll_interval).await;
        }
        let plans = self.plans().await?;
        let (base, in_flight) = self.poll_base();
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
            if let Some((tracking, key)) = last {
                next.tracking_offsets.insert(plan.name.clone(), tracking);
                if plan.key.is_some() {
                    next.tracking_keys.insert(plan.name.clone(), key);
                } else {
                    next.tracking_keys.remove(&plan.name);
                }
            }
            if destructive && !keys.is_empty() {
                consume.push((plan.name.clone(), plan.consume_sql(&self.config, &keys)));
            }
        }
        self.caught_up.store(!full, Ordering::SeqCst);
        if records.is_empty() {
            // Staged too: each poll's batch is committed, in order, by one
            // `commit`, so an empty one must not take a later batch's turn.
            self.lock_staged().push_back(Staged {
                state: next,
                consume: Arc::new(Vec::new()),
            });
            if self.config.stop_when_caught_up {
                info!(tables = ?self.config.tables, "mysql source caught up with every table; finishing");
            }
            return Ok(SourceBatch {
                finished: self.config.stop_when_caught_up,
                ..SourceBatch::default()
            });
        }
        next.processed_rows += records.len() as u64;
        let state = encode_state(&next)?;
        if self.config.verbose_logging {
            info!(records = records.len(), "mysql source polled a batch");
        } else {
            debug!(records = records.len(), "mysql source polled a batch");
        }
        self.lock_staged().push_back(Staged {
            state: next,
            consume: Arc::new(consume),
        });
        Ok(SourceBatch {
            records,
            state: Some(state),
            finished: false,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        // The batch stays staged while it is applied, so a poll meanwhile
        // still reads past its rows; a failure leaves it for the retry.
        let Some(consume) = self
            .lock_staged()
            .front()
            .map(|oldest| oldest.consume.clone())
        else {
            return Ok(());
        };
        self.apply(&consume).await?;
        let mut staged = self.lock_staged();
        if let Some(oldest) = staged.pop_front() {
            *self.lock_committed() = oldest.state;
        }
        Ok(())
    }

    /// Several batches in flight in cursor mode; delete and mark mode keep
    /// one, as the postgres source does.
    fn max_in_flight(&self) -> usize {
        match self.config.consume() {
            Consume::Cursor => crate::config::connector::MAX_IN_FLIGHT as usize,
            Consume::Delete | Consume::Mark(_) => 1,
        }
    }

    async fn rewind(&self) -> Result<(), ConnectorError> {
        self.lock_staged().clear();
        Ok(())
    }

    /// Deleting or marking consumed rows leaves their only copy in Iggy.
    fn destructive(&self) -> bool {
        !matches!(self.config.consume(), Consume::Cursor)
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.lock_staged().clear();
        if let Some(pool) = self.pool.take() {
            pool.close().await;
        }
        Ok(())
    }
}

impl MySqlState {
    /// Drops cursors of tables no longer configured, so the state stays bounded.
    fn retain_tables(&mut self, tables: &[String]) {
        self.tracking_offsets
            .retain(|table, _| tables.contains(table));
        self.tracking_keys.retain(|table, _| tables.contains(table));
    }
}

/// The poll's clock, for `DatabaseRecord.timestamp` and `$now`/`$now_unix`.
struct Now {
    rfc3339: String,
    unix: u64,
}

impl Now {
    fn read() -> Self {
        let now = SystemTime::now();
        Self {
            rfc3339: humantime::format_rfc3339_micros(now).to_string(),
            unix: now
                .duration_since(UNIX_EPOCH)
                .map_or(0, |since| since.as_secs()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let restored = source.lock_committed().clone();
        assert_eq!(
            restored.tracking_offsets,
            BTreeMap::from([("a".into(), "10".into())])
        );
        assert_eq!(restored.processed_rows, 10);
        source.close().await.unwrap();
    }
}
