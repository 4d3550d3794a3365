//! The polling source's lag for the engine's lag sampler: rows past the
//! committed cursor (cursor mode) or not consumed yet (delete and mark mode),
//! counted per table with the polling query's own conditions, up to
//! [`PENDING_CAP`] each. A custom query cannot be counted: no probe then.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::postgres::PgPool;
use sqlx::{AssertSqlSafe, PgExecutor};
use tokio::sync::OnceCell;

use super::config::Consume;
use super::query::TablePlan;
use super::record::RowShape;
use super::{Consumption, PostgresState};
use crate::connectors::kit::sql_poll::{PENDING_CAP, PollCore};
use crate::connectors::postgres::describe;
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::SourceLag;

pub(super) struct PendingRows {
    pub(super) pool: PgPool,
    pub(super) plans: Arc<OnceCell<Vec<(TablePlan, RowShape)>>>,
    pub(super) core: Arc<PollCore<Consumption>>,
    pub(super) consume: Consume,
    pub(super) initial_offset: Option<String>,
}

#[async_trait]
impl LagProbe for PendingRows {
    async fn measure(&self) -> Result<SourceLag, ConnectorError> {
        let plans = self
            .plans
            .get()
            .ok_or_else(|| ConnectorError::transient("the tables are not read yet"))?;
        let committed = self.core.lock_committed().clone();
        let mut pending = 0;
        for (plan, _) in plans {
            pending += self.count(&self.pool, plan, &committed).await?;
        }
        Ok(SourceLag {
            messages: Some(pending),
            ..SourceLag::default()
        })
    }
}

impl PendingRows {
    /// One table's rows the source has not committed, as the poll would read
    /// them from the committed cursor (capped at [`PENDING_CAP`]).
    async fn count(
        &self,
        executor: impl PgExecutor<'_>,
        plan: &TablePlan,
        committed: &PostgresState,
    ) -> Result<u64, ConnectorError> {
        let (Some(first), Some(next)) = (&plan.count_first_sql, &plan.count_next_sql) else {
            return Ok(0);
        };
        let offset = committed.tracking_offsets.get(&plan.name);
        let query = match (&self.consume, offset) {
            (Consume::Cursor, Some(offset)) => {
                let query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(next.clone())).bind(offset);
                match plan.key {
                    Some(_) => query.bind(committed.tracking_keys.get(&plan.name)),
                    None => query,
                }
            }
            _ => {
                let query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(first.clone()));
                match &self.initial_offset {
                    Some(initial) => query.bind(initial),
                    None => query,
                }
            }
        };
        let count = query
            .fetch_one(executor)
            .await
            .map_err(|error| ConnectorError::transient(describe(&error)))?;
        Ok(u64::try_from(count).unwrap_or(0).min(PENDING_CAP))
    }
}
