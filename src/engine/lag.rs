//! Samples a source's lag every few seconds in a task beside its pipeline
//! (never on the batch path), into the connector's lag cell and the
//! `iggy_connector_source_lag_*` gauges.

use std::sync::Arc;
use std::time::Duration;

use metrics::Label;
use tokio::task::JoinHandle;
use tracing::debug;

use crate::connectors::LagProbe;
use crate::lag::{Lag, LagCell, SourceLag};

/// How often a source's lag is measured.
pub const SOURCE_LAG_INTERVAL: Duration = Duration::from_secs(5);

/// The sampling task; it ends when this is dropped (with the pipeline).
pub struct LagSampler(JoinHandle<()>);

impl LagSampler {
    pub fn start(key: &str, probe: Arc<dyn LagProbe>, cell: LagCell, interval: Duration) -> Self {
        let key = key.to_owned();
        Self(tokio::spawn(async move {
            loop {
                match tokio::time::timeout(interval, probe.measure()).await {
                    Ok(Ok(lag)) => publish(&key, &lag, &cell),
                    Ok(Err(error)) => {
                        debug!(connector_key = %key, %error, "cannot measure the source's lag")
                    }
                    Err(_) => debug!(connector_key = %key, "measuring the source's lag timed out"),
                }
                tokio::time::sleep(interval).await;
            }
        }))
    }

    /// Ends the task and waits until it is gone, with its probe (which may
    /// hold the source's client): dropping a sampler only asks for that.
    pub async fn stop(mut self) {
        self.0.abort();
        let _ = (&mut self.0).await;
    }
}

impl Drop for LagSampler {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn publish(key: &str, lag: &SourceLag, cell: &LagCell) {
    let labels = [Label::new("connector_key", key.to_owned())];
    if let Some(messages) = lag.messages {
        metrics::gauge!("iggy_connector_source_lag_messages", labels.iter()).set(messages as f64);
    }
    if let Some(bytes) = lag.bytes {
        metrics::gauge!("iggy_connector_source_lag_bytes", labels.iter()).set(bytes as f64);
    }
    if let Some(age) = lag.oldest_age_ms {
        metrics::gauge!(
            "iggy_connector_source_lag_oldest_age_seconds",
            labels.iter()
        )
        .set(age as f64 / 1e3);
    }
    for partition in &lag.partitions {
        let labels = [
            Label::new("connector_key", key.to_owned()),
            Label::new("topic", partition.topic.clone()),
            Label::new("partition", partition.partition.to_string()),
        ];
        metrics::gauge!("iggy_connector_source_partition_lag", labels.iter())
            .set(partition.messages as f64);
    }
    cell.set_source(Lag::from(lag));
}
