//! The slot's lag for the engine's lag sampler: WAL the server has written
//! past what this source confirmed (`pg_current_wal_lsn()` minus the slot's
//! `confirmed_flush_lsn`), one query on the source's pool.

use async_trait::async_trait;
use sqlx::PgPool;

use crate::connectors::postgres::describe;
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::SourceLag;

pub(super) struct SlotLag {
    pub(super) pool: PgPool,
    pub(super) slot: String,
}

#[async_trait]
impl LagProbe for SlotLag {
    async fn measure(&self) -> Result<SourceLag, ConnectorError> {
        let bytes = sqlx::query_scalar::<_, Option<i64>>(
            "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::int8 \
             FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await
        .map_err(|error| ConnectorError::transient(describe(&error)))?
        .flatten()
        .ok_or_else(|| {
            ConnectorError::transient(format!("replication slot {} is not there yet", self.slot))
        })?;
        Ok(SourceLag {
            bytes: Some(bytes.max(0) as u64),
            ..SourceLag::default()
        })
    }
}
