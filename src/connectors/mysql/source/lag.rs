//! The polling source's lag for the engine's lag sampler: rows past the
//! committed cursor (cursor mode) or not consumed yet (delete and mark mode),
//! counted per table with the polling query's own conditions, up to
//! [`PENDING_CAP`] each. A custom query cannot be counted: no probe then.

use std::sync::Arc;

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OnceCell;

use super::config::{Consume, MySqlSourceConfig};
use super::query::TablePlan;
use super::record::RowShape;
use super::{Consumption, MySqlState};
use crate::connectors::kit::sql_poll::{PENDING_CAP, PollCore};
use crate::connectors::mysql::describe;
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::SourceLag;

pub(super) struct PendingRows {
    pub(super) pool: MySqlPool,
    pub(super) plans: Arc<OnceCell<Vec<(TablePlan, RowShape)>>>,
    pub(super) core: Arc<PollCore<Consumption>>,
    pub(super) config: MySqlSourceConfig,
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
            pending += self.count(plan, &committed).await?;
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
    async fn count(&self, plan: &TablePlan, committed: &MySqlState) -> Result<u64, ConnectorError> {
        let cursor = committed
            .tracking_offsets
            .get(&plan.name)
            .filter(|_| self.config.consume() == Consume::Cursor)
            .map(|offset| {
                (
                    offset.as_str(),
                    committed.tracking_keys.get(&plan.name).map(String::as_str),
                )
            });
        let Some(sql) = plan.pending_sql(&self.config, cursor) else {
            return Ok(0);
        };
        // No bind parameters, as the poll: the text protocol.
        let row = sqlx::raw_sql(AssertSqlSafe(sql))
            .fetch_one(&self.pool)
            .await
            .map_err(|error| ConnectorError::transient(describe(&error)))?;
        let count: i64 = row
            .try_get(0)
            .map_err(|error| ConnectorError::transient(describe(&error)))?;
        Ok(u64::try_from(count).unwrap_or(0).min(PENDING_CAP))
    }
}
