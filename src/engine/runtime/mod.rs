//! Owns the connectors of one process: starts, stops and restarts them, and
//! shows their config, status and counters to the CLI and the API.
//!
//! `slot.rs` runs one connector's task, `setup.rs` builds its pipeline (the
//! connector, its state, `open`, its producers or consumers), `factory.rs`
//! turns a config into a connector, `lease.rs` runs a source only while this
//! instance holds its lease (a state store shared by several instances),
//! `dlq.rs` lists and replays a connector's dead letters.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::config::ConnectorConfig;
use crate::config::runtime::EngineConfig;
use crate::connectors::{ConnectorKind, Degraded};
use crate::engine::backoff::Backoff;
use crate::engine::metrics::ConnectorMetrics;
use crate::engine::status::StatusCell;
use crate::iggy::Bus;
use crate::state::StateStore;

mod dlq;
mod factory;
mod lease;
mod prepared;
mod reload;
mod replay;
mod replay_log;
mod setup;
mod slot;
mod stopped_lag;

pub use dlq::{DeadLetter, DeadLetterPage, DlqError, ReplayReport, ReplayTarget, Selection};
pub use factory::{ConnectorFactory, RegistryFactory};
pub use slot::ConnectorView;
use slot::Slot;

pub struct Runtime {
    bus: Arc<dyn Bus>,
    state: Arc<dyn StateStore>,
    options: RuntimeOptions,
    slots: Mutex<Vec<Arc<Slot>>>,
    /// One lock per connector, so that changes to one connector's lifecycle
    /// (the API's start, stop, restart, state and offset changes, a reload)
    /// run one after the other.
    lifecycle: Mutex<HashMap<(ConnectorKind, String), LifecycleLock>>,
    /// Set by [`Runtime::shutdown`]: stopped sinks are not measured any more.
    closing: std::sync::atomic::AtomicBool,
}

/// See [`Runtime::lifecycle_lock`].
pub type LifecycleLock = Arc<tokio::sync::Mutex<()>>;

/// Engine settings that are not per connector.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// How long a stop waits for the batch in flight to be committed.
    pub shutdown_timeout: Duration,
    /// Retry pacing of source batches and source polls.
    pub source_backoff: Backoff,
    /// Retry pacing of sink writes, sink polls and bus setup.
    pub sink_backoff: Backoff,
    /// The longest `Retry-After` honoured (`[engine] max_retry_after`).
    pub max_retry_after: Duration,
    /// Failed opens before a connector stops with `start_failed`; `None`
    /// retries until it is stopped (`[engine] max_open_attempts`).
    pub max_open_attempts: Option<u32>,
    /// Builds connectors from their config; the registry unless a test says otherwise.
    pub factory: Arc<dyn ConnectorFactory>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(10),
            source_backoff: Backoff::SOURCE,
            sink_backoff: Backoff::SINK,
            max_retry_after: Duration::from_secs(600),
            max_open_attempts: None,
            factory: Arc::new(RegistryFactory),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuntimeError {
    #[error("no {kind} with key \"{key}\"")]
    NotFound { kind: ConnectorKind, key: String },
    #[error("a {kind} with key \"{key}\" is already configured")]
    Duplicate { kind: ConnectorKind, key: String },
}

impl Runtime {
    pub fn new(
        bus: Arc<dyn Bus>,
        state: Arc<dyn StateStore>,
        shutdown_timeout: Duration,
    ) -> Arc<Self> {
        Self::with_options(
            bus,
            state,
            RuntimeOptions {
                shutdown_timeout,
                ..RuntimeOptions::default()
            },
        )
    }

    /// A runtime with the runtime file's `[engine]` settings.
    pub fn configured(
        bus: Arc<dyn Bus>,
        state: Arc<dyn StateStore>,
        engine: &EngineConfig,
    ) -> Arc<Self> {
        Self::with_options(
            bus,
            state,
            RuntimeOptions {
                shutdown_timeout: engine.shutdown_timeout,
                max_retry_after: engine.max_retry_after,
                max_open_attempts: engine.max_open_attempts,
                ..RuntimeOptions::default()
            },
        )
    }

    pub fn with_options(
        bus: Arc<dyn Bus>,
        state: Arc<dyn StateStore>,
        options: RuntimeOptions,
    ) -> Arc<Self> {
        Arc::new(Self {
            bus,
            state,
            options,
            slots: Mutex::new(Vec::new()),
            lifecycle: Mutex::new(HashMap::new()),
            closing: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Registers a connector without starting it.
    pub fn add(&self, config: ConnectorConfig) -> Result<(), RuntimeError> {
        let mut slots = self.lock_slots();
        if slots
            .iter()
            .any(|slot| slot.kind == config.kind && slot.key == config.key)
        {
            return Err(RuntimeError::Duplicate {
                kind: config.kind,
                key: config.key,
            });
        }
        let total = match config.kind {
            ConnectorKind::Source => metrics::gauge!("iggy_connectors_sources_total"),
            ConnectorKind::Sink => metrics::gauge!("iggy_connectors_sinks_total"),
        };
        total.increment(1.0);
        slots.push(Arc::new(Slot {
            kind: config.kind,
            key: config.key.clone(),
            status: Arc::new(StatusCell::new(config.kind)),
            metrics: Arc::new(ConnectorMetrics::new(&config.key, config.kind)),
            tap: Arc::default(),
            degraded: Degraded::default(),
            lag: Default::default(),
            stopped_lag: Default::default(),
            reload_refusal: Mutex::new(None),
            config: RwLock::new(Arc::new(config)),
            task: tokio::sync::Mutex::new(None),
        }));
        Ok(())
    }

    /// Starts every enabled connector. Returns at once; each connector opens in
    /// its own task and reports its status.
    pub async fn start_enabled(self: &Arc<Self>) {
        let slots: Vec<Arc<Slot>> = self.lock_slots().clone();
        for slot in slots {
            if slot.config().enabled {
                self.start_slot(&slot).await;
            }
        }
    }

    /// Starts a connector (enabled or not). A running connector is left alone.
    pub async fn start(
        self: &Arc<Self>,
        kind: ConnectorKind,
        key: &str,
    ) -> Result<(), RuntimeError> {
        let slot = self.slot(kind, key)?;
        self.start_slot(&slot).await;
        Ok(())
    }

    /// Stops a connector: no more polling; the batch in flight gets the shutdown
    /// timeout to be committed. Waits until it has stopped.
    pub async fn stop(&self, kind: ConnectorKind, key: &str) -> Result<(), RuntimeError> {
        let slot = self.slot(kind, key)?;
        self.stop_slot(&slot).await;
        Ok(())
    }

    pub async fn restart(
        self: &Arc<Self>,
        kind: ConnectorKind,
        key: &str,
    ) -> Result<(), RuntimeError> {
        let slot = self.slot(kind, key)?;
        self.stop_slot(&slot).await;
        self.start_slot(&slot).await;
        Ok(())
    }

    /// Waits until a connector's task ends on its own (a finite source completing,
    /// a connector stopping with an error), without asking it to stop.
    pub async fn wait_until_stopped(
        &self,
        kind: ConnectorKind,
        key: &str,
    ) -> Result<(), RuntimeError> {
        let slot = self.slot(kind, key)?;
        let mut task = slot.task.lock().await;
        if let Some(running) = task.as_mut() {
            let _ = (&mut running.handle).await;
            *task = None;
        }
        Ok(())
    }

    /// Stops everything: sources first (so nothing new enters Iggy), then sinks.
    pub async fn shutdown(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::SeqCst);
        for kind in [ConnectorKind::Source, ConnectorKind::Sink] {
            let slots: Vec<Arc<Slot>> = self
                .lock_slots()
                .iter()
                .filter(|slot| slot.kind == kind)
                .cloned()
                .collect();
            futures::future::join_all(slots.iter().map(|slot| self.stop_slot(slot))).await;
            for slot in &slots {
                slot.stopped_lag.end();
            }
        }
    }

    fn is_closing(&self) -> bool {
        self.closing.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Replaces a connector's config; its next start runs the new one (a running
    /// connector keeps the config it started with until it is restarted). The
    /// slot, its status and its counters stay: kind and key name them. Returns
    /// the config it replaced.
    pub fn replace_config(
        &self,
        config: ConnectorConfig,
    ) -> Result<Arc<ConnectorConfig>, RuntimeError> {
        let slot = self.slot(config.kind, &config.key)?;
        let mut current = slot
            .config
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        Ok(std::mem::replace(&mut *current, Arc::new(config)))
    }

    /// The lock of one connector's lifecycle: held across a check of its
    /// status and the change that relies on it (a state reset only while it
    /// is stopped), so that nothing starts or stops it in between. A key need
    /// not be configured (yet).
    pub fn lifecycle_lock(&self, kind: ConnectorKind, key: &str) -> LifecycleLock {
        let mut locks = self
            .lifecycle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        locks.entry((kind, key.to_owned())).or_default().clone()
    }

    /// The bus the connectors run on.
    pub fn bus(&self) -> &dyn Bus {
        self.bus.as_ref()
    }

    pub fn view(&self, kind: ConnectorKind, key: &str) -> Result<ConnectorView, RuntimeError> {
        Ok(self.slot(kind, key)?.view())
    }

    pub fn views(&self) -> Vec<ConnectorView> {
        self.lock_slots().iter().map(|slot| slot.view()).collect()
    }

    fn slot(&self, kind: ConnectorKind, key: &str) -> Result<Arc<Slot>, RuntimeError> {
        self.lock_slots()
            .iter()
            .find(|slot| slot.kind == kind && slot.key == key)
            .cloned()
            .ok_or_else(|| RuntimeError::NotFound {
                kind,
                key: key.to_owned(),
            })
    }

    fn lock_slots(&self) -> std::sync::MutexGuard<'_, Vec<Arc<Slot>>> {
        self.slots
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
