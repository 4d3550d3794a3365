//! The binlog lag for the engine's lag sampler: bytes of binlog between the
//! position this source committed and the server's current one (`SHOW
//! MASTER STATUS`; across files, with the sizes `SHOW BINARY LOGS` gives).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use sqlx::mysql::MySqlPool;
use sqlx::{AssertSqlSafe, Row};

use super::{CdcError, CdcState, lock, server_position};
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::SourceLag;

pub(super) struct BinlogLag {
    pub(super) pool: MySqlPool,
    pub(super) committed: Arc<Mutex<CdcState>>,
}

#[async_trait]
impl LagProbe for BinlogLag {
    async fn measure(&self) -> Result<SourceLag, ConnectorError> {
        let current = server_position(&self.pool).await?;
        let ours = lock(&self.committed).binlog.clone();
        if !ours.is_known() {
            return Err(ConnectorError::transient(
                "no binlog position committed yet",
            ));
        }
        let bytes = if ours.file == current.file {
            current.position.saturating_sub(ours.position)
        } else {
            let files = binary_logs(&self.pool).await?;
            between(
                &files,
                &ours.file,
                ours.position,
                &current.file,
                current.position,
            )
        };
        Ok(SourceLag {
            bytes: Some(bytes),
            ..SourceLag::default()
        })
    }
}

/// `SHOW BINARY LOGS`: each file with its size, oldest first.
async fn binary_logs(pool: &MySqlPool) -> Result<Vec<(String, u64)>, CdcError> {
    let rows = sqlx::raw_sql(AssertSqlSafe("SHOW BINARY LOGS"))
        .fetch_all(pool)
        .await
        .map_err(|source| CdcError::Database {
            what: "listing the binary logs".into(),
            source,
        })?;
    Ok(rows
        .iter()
        .filter_map(|row| Some((row.try_get(0).ok()?, row.try_get(1).ok()?)))
        .collect())
}

/// Bytes from `(from, at)` to `(to, upto)` over the listed files.
fn between(files: &[(String, u64)], from: &str, at: u64, to: &str, upto: u64) -> u64 {
    let mut bytes = 0;
    let mut counting = false;
    for (file, size) in files {
        if file == from {
            counting = true;
            bytes += size.saturating_sub(at);
        } else if file == to {
            return bytes + upto;
        } else if counting {
            bytes += size;
        }
    }
    bytes + upto
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_positions_in_different_files_when_measured_should_add_the_files_between() {
        let files = [
            ("bin.000001".to_owned(), 1000),
            ("bin.000002".to_owned(), 500),
            ("bin.000003".to_owned(), 700),
        ];
        assert_eq!(
            between(&files, "bin.000001", 900, "bin.000003", 40),
            100 + 500 + 40
        );
    }
}
