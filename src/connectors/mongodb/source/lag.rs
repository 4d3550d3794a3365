//! The change stream's lag for the engine's lag sampler: how old the cluster
//! time of the last committed change is against the server's clock (`hello`'s
//! `localTime`), one command on the source's client. Zero while the stream
//! was read to its end and every polled change is committed.

use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use mongodb::Client;
use mongodb::bson::{Bson, doc};

use crate::connectors::mongodb::describe;
use crate::connectors::{ConnectorError, LagProbe};
use crate::lag::SourceLag;

/// Where the change stream stands, shared by the source (which moves it on
/// commit) and its probe.
#[derive(Debug, Default)]
pub(super) struct Position {
    /// The cluster time of the last committed change, in Unix milliseconds.
    pub(super) committed_ms: Option<u64>,
    /// The last poll read the stream to its end and nothing polled waits for
    /// its commit.
    pub(super) at_end: bool,
}

#[derive(Debug, Clone, Default)]
pub(super) struct SharedPosition(Arc<Mutex<Position>>);

impl SharedPosition {
    pub(super) fn lock(&self) -> MutexGuard<'_, Position> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

pub(super) struct ChangeStreamLag {
    pub(super) client: Client,
    pub(super) position: SharedPosition,
}

#[async_trait]
impl LagProbe for ChangeStreamLag {
    async fn measure(&self) -> Result<SourceLag, ConnectorError> {
        let (committed_ms, at_end) = {
            let position = self.position.lock();
            (position.committed_ms, position.at_end)
        };
        if at_end {
            return Ok(SourceLag {
                oldest_age_ms: Some(0),
                ..SourceLag::default()
            });
        }
        let committed_ms = committed_ms.ok_or_else(|| {
            ConnectorError::transient("no change with a known cluster time was committed yet")
        })?;
        let hello = self
            .client
            .database("admin")
            .run_command(doc! { "hello": 1 })
            .await
            .map_err(|error| ConnectorError::transient(describe(&error)))?;
        let server_ms = hello
            .get_datetime("localTime")
            .map_err(|_| ConnectorError::transient("the server's hello has no localTime"))?
            .timestamp_millis();
        Ok(SourceLag {
            oldest_age_ms: Some(
                u64::try_from(server_ms)
                    .unwrap_or(0)
                    .saturating_sub(committed_ms),
            ),
            ..SourceLag::default()
        })
    }
}

/// A change event's `clusterTime` in Unix milliseconds: a BSON timestamp (a
/// real mongod: seconds and an increment) or a date.
pub(super) fn cluster_time_ms(value: &Bson) -> Option<u64> {
    match value {
        Bson::Timestamp(timestamp) => Some(u64::from(timestamp.time) * 1000),
        Bson::DateTime(time) => u64::try_from(time.timestamp_millis()).ok(),
        _ => None,
    }
}

/// The cluster time a resume token carries, in Unix milliseconds: a real
/// mongod's `_data` is hex of a key string whose first value is the event's
/// cluster time (type byte `82`, then the seconds and the increment, 4 bytes
/// each, big-endian). `None` for any other token.
pub(super) fn token_time_ms(token: &Bson) -> Option<u64> {
    let data = token.as_document()?.get_str("_data").ok()?;
    let seconds = data.strip_prefix("82")?.get(..8)?;
    u32::from_str_radix(seconds, 16)
        .ok()
        .map(|seconds| u64::from(seconds) * 1000)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::Timestamp;

    #[test]
    fn given_a_mongod_resume_token_when_read_should_give_its_cluster_time() {
        let token = Bson::Document(doc! {
            "_data": "826553F1A2000000012B022C0100296E5A10046E0E2B5D3C0B4F2A8C1E7D3A9F0E6B1C46645F696400646553F1A2B4C3D2E1F0A9B8C70004"
        });
        assert_eq!(token_time_ms(&token), Some(0x6553_F1A2 * 1000));
        let emulated = Bson::Document(doc! { "_data": "nx:12" });
        assert_eq!(token_time_ms(&emulated), None);
    }

    #[test]
    fn given_cluster_times_as_timestamp_or_date_when_read_should_give_milliseconds() {
        let timestamp = Bson::Timestamp(Timestamp {
            time: 1_700_000_000,
            increment: 3,
        });
        assert_eq!(cluster_time_ms(&timestamp), Some(1_700_000_000_000));
        let date = Bson::DateTime(mongodb::bson::DateTime::from_millis(1_700_000_000_123));
        assert_eq!(cluster_time_ms(&date), Some(1_700_000_000_123));
        assert_eq!(cluster_time_ms(&Bson::Int32(1)), None);
    }
}
