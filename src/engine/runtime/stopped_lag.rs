//! A stopped sink's lag. While a sink runs, each of its consumers measures its
//! group's lag (see `crate::iggy`); once it stops, nothing reads its topics,
//! so the runtime measures them every [`STOPPED_SINK_LAG_INTERVAL`] through
//! [`Bus::measure_lag`] until the sink starts again: a stopped sink whose
//! topics grow shows its lag grow, in its status and in the same gauges.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tracing::debug;

use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::Degraded;
use crate::iggy::{Bus, ConsumerSpec};
use crate::lag::LagCell;

/// How often a stopped sink's lag is measured.
pub const STOPPED_SINK_LAG_INTERVAL: Duration = Duration::from_secs(5);

/// The measuring task of one stopped sink; it ends when this is dropped,
/// ended or replaced.
#[derive(Default)]
pub(super) struct StoppedLag(std::sync::Mutex<Option<JoinHandle<()>>>);

impl StoppedLag {
    /// Measures the sink of `config` (a source is left alone) into `lag`
    /// until [`end`](Self::end).
    pub(super) fn watch(&self, bus: Arc<dyn Bus>, config: &ConnectorConfig, lag: &LagCell) {
        let KindConfig::Sink { streams, .. } = &config.kind_config else {
            return;
        };
        let specs: Vec<ConsumerSpec> = streams
            .iter()
            .flat_map(|stream| {
                stream.topics.iter().map(|topic| ConsumerSpec {
                    stream: stream.stream.clone(),
                    topic: topic.clone(),
                    group: stream.consumer_group.clone(),
                    batch_length: stream.batch_length,
                    poll_interval: stream.poll_interval,
                    connector_key: config.key.clone(),
                    degraded: Degraded::default(),
                    lag: lag.clone(),
                })
            })
            .collect();
        let key = config.key.clone();
        let task = tokio::spawn(async move {
            loop {
                for spec in &specs {
                    if let Err(error) = bus.measure_lag(spec).await {
                        debug!(connector_key = %key, stream = %spec.stream, topic = %spec.topic, %error, "cannot measure the stopped sink's lag");
                    }
                }
                tokio::time::sleep(STOPPED_SINK_LAG_INTERVAL).await;
            }
        });
        if let Some(previous) = self.lock().replace(task) {
            previous.abort();
        }
    }

    /// Ends the measurements (the sink starts: its consumers measure).
    pub(super) fn end(&self) {
        if let Some(task) = self.lock().take() {
            task.abort();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<JoinHandle<()>>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Drop for StoppedLag {
    fn drop(&mut self) {
        self.end();
    }
}
