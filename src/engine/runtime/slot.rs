//! One configured connector and its task: starting it in its own task,
//! stopping it within the shutdown timeout, and what the CLI and the API see
//! of it.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info_span, warn};

use super::Runtime;
use super::prepared::{Prepared, SetupError};
use super::stopped_lag::StoppedLag;
use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::{ConnectorContext, ConnectorKind, Degraded};
use crate::engine::Shutdown;
use crate::engine::metrics::ConnectorMetrics;
use crate::engine::source::Ended;
use crate::engine::status::{StatusCell, StatusSnapshot, StopReason};
use crate::engine::tap::Tap;
use crate::lag::{Lag, LagCell};
use crate::message::TopicRef;

/// One configured connector, running or not.
pub(super) struct Slot {
    pub(super) kind: ConnectorKind,
    pub(super) key: String,
    pub(super) config: RwLock<Arc<ConnectorConfig>>,
    pub(super) status: Arc<StatusCell>,
    pub(super) metrics: Arc<ConnectorMetrics>,
    /// Live samples of its messages for the API's tap.
    pub(super) tap: Arc<Tap>,
    /// Set by the running connector while it cannot make progress.
    pub(super) degraded: Degraded,
    /// How far behind it is, as last measured.
    pub(super) lag: LagCell,
    /// A stopped sink's lag measurements.
    pub(super) stopped_lag: StoppedLag,
    /// Why the last reload kept this connector at its running version.
    pub(super) reload_refusal: std::sync::Mutex<Option<String>>,
    pub(super) task: tokio::sync::Mutex<Option<Task>>,
}

pub(super) struct Task {
    shutdown: Shutdown,
    pub(super) handle: JoinHandle<()>,
}

/// What the CLI and the API see of a connector.
#[derive(Debug, Clone)]
pub struct ConnectorView {
    pub config: Arc<ConnectorConfig>,
    pub status: StatusSnapshot,
    pub metrics: Arc<ConnectorMetrics>,
    pub tap: Arc<Tap>,
    /// Why the running connector says it is degraded, if it does.
    pub degraded: Option<String>,
    /// How far behind it is, as last measured (kept after a stop); `None`
    /// when it cannot say or has not been measured yet.
    pub lag: Option<Lag>,
}

impl Runtime {
    pub(super) async fn start_slot(self: &Arc<Self>, slot: &Arc<Slot>) {
        let mut task = slot.task.lock().await;
        if task
            .as_ref()
            .is_some_and(|running| !running.handle.is_finished())
        {
            return;
        }
        slot.status.set_starting();
        slot.stopped_lag.end();
        slot.lag.clear();
        let shutdown = Shutdown::new(CancellationToken::new(), self.options.shutdown_timeout);
        let runtime = self.clone();
        let running_slot = slot.clone();
        let task_shutdown = shutdown.clone();
        // Every line the connector and its pipeline log carries its key and type.
        let span = info_span!("connector", connector_key = %slot.key, connector_type = %slot.kind);
        let handle = tokio::spawn(
            async move {
                runtime.run_slot(&running_slot, task_shutdown).await;
                // Not while the runtime shuts down: nobody would read it.
                if !runtime.is_closing() {
                    running_slot.stopped_lag.watch(
                        runtime.bus.clone(),
                        &running_slot.config(),
                        &running_slot.lag,
                    );
                }
            }
            .instrument(span),
        );
        *task = Some(Task { shutdown, handle });
    }

    pub(super) async fn stop_slot(&self, slot: &Slot) {
        let mut task = slot.task.lock().await;
        let Some(mut running) = task.take() else {
            return;
        };
        if running.handle.is_finished() {
            return;
        }
        slot.status.set_stopping();
        running.shutdown.request();
        // The pipeline itself gives up after the grace period; the margin covers
        // closing the connector.
        let limit = self.options.shutdown_timeout + Duration::from_secs(5);
        if tokio::time::timeout(limit, &mut running.handle)
            .await
            .is_err()
        {
            warn!(connector_key = %slot.key, "connector did not stop in time; aborting its task");
            running.handle.abort();
            slot.status.set_stopped();
        }
    }

    async fn run_slot(&self, slot: &Slot, shutdown: Shutdown) {
        match (slot.kind, self.state.leases()) {
            (ConnectorKind::Source, Some(leases)) => {
                self.run_leased(slot, shutdown, leases).await;
            }
            _ => self.run_once(slot, &shutdown).await,
        }
    }

    /// Builds the connector's pipeline and runs it until it ends. A pipeline
    /// whose connection was lost is built again (rule 5): the connector is
    /// closed, and after a backoff a fresh one opens from committed state
    /// (the saved source state, the group's committed offsets).
    pub(super) async fn run_once(&self, slot: &Slot, shutdown: &Shutdown) {
        let mut lost = 0;
        loop {
            let config = slot.config();
            let started = Instant::now();
            let ended = match self.prepare(slot, &config, shutdown).await {
                Ok(Prepared::Source(pipeline)) => pipeline.run().await,
                Ok(Prepared::Sink(pipeline)) => pipeline.run().await,
                Err(SetupError::Shutdown) => return slot.status.set_stopped(),
                Err(error) => {
                    let message = error.to_string();
                    error!(connector_key = %slot.key, connector_type = %slot.kind, %message, "connector failed to start");
                    return slot.status.set_stopped_by(StopReason::StartFailed, message);
                }
            };
            let Ended::Disconnected(message) = ended else {
                return;
            };
            // A connection that held for a while starts the backoff over.
            lost = if started.elapsed() > self.options.sink_backoff.max {
                1
            } else {
                lost + 1
            };
            let delay = self.options.sink_backoff.delay(lost);
            warn!(connector_key = %slot.key, retry_in_ms = delay.as_millis() as u64, %message, "connection lost; opening the connector again");
            slot.metrics.reopens.add(1);
            slot.status.record_open_failure(0, message);
            if !shutdown.pause(delay).await {
                return slot.status.set_stopped();
            }
        }
    }
}

impl Slot {
    pub(super) fn config(&self) -> Arc<ConnectorConfig> {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(super) fn view(&self) -> ConnectorView {
        ConnectorView {
            config: self.config(),
            status: self.status.snapshot(),
            metrics: self.metrics.clone(),
            tap: self.tap.clone(),
            degraded: self.degraded.reason().or_else(|| self.reload_refusal()),
            lag: self.lag.get(),
        }
    }

    fn reload_refusal(&self) -> Option<String> {
        self.reload_refusal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub(super) fn set_reload_refusal(&self, reason: Option<String>) {
        *self
            .reload_refusal
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = reason;
    }

    pub(super) async fn is_running(&self) -> bool {
        self.task
            .lock()
            .await
            .as_ref()
            .is_some_and(|task| !task.handle.is_finished())
    }

    /// A fresh instance starts not degraded.
    pub(super) fn context(&self) -> ConnectorContext {
        self.degraded.clear();
        let streams = match &self.config().kind_config {
            KindConfig::Source { streams, .. } => streams
                .iter()
                .map(|entry| TopicRef {
                    stream: entry.stream.clone(),
                    topic: entry.topic.clone(),
                })
                .collect(),
            KindConfig::Sink { .. } => Vec::new(),
        };
        ConnectorContext {
            key: self.key.clone(),
            degraded: self.degraded.clone(),
            streams,
            record_check: Default::default(),
        }
    }
}
