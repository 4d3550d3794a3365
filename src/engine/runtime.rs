//! Owns the connectors of one process: starts, stops and restarts them, and
//! shows their config, status and counters to the CLI and the API.

use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, error, info_span, warn};

use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::{
    BuildError, ConnectorContext, ConnectorKind, Degraded, Registry, Sink, Source,
};
use crate::engine::backoff::Backoff;
use crate::engine::metrics::ConnectorMetrics;
use crate::engine::sink::{SinkContext, SinkPipeline, TopicReader};
use crate::engine::source::{Route, SourcePipeline};
use crate::engine::status::{StatusCell, StatusSnapshot, StopReason};
use crate::engine::{Shutdown, catch_panic};
use crate::iggy::{Bus, BusError, ConsumerSpec, Producer, ProducerTarget};
use crate::message::TopicRef;
use crate::state::StateStore;
use crate::transforms::TransformChain;

pub struct Runtime {
    bus: Arc<dyn Bus>,
    state: Arc<dyn StateStore>,
    options: RuntimeOptions,
    slots: Mutex<Vec<Arc<Slot>>>,
}

/// Engine settings that are not per connector.
#[derive(Clone)]
pub struct RuntimeOptions {
    /// How long a stop waits for the batch in flight to be committed.
    pub shutdown_timeout: Duration,
    /// Retry pacing of source batches and source polls.
    pub source_backoff: Backoff,
    /// Retry pacing of sink writes, sink polls and bus setup.
    pub sink_backoff: Backoff,
    /// Builds connectors from their config; the registry unless a test says otherwise.
    pub factory: Arc<dyn ConnectorFactory>,
}

impl Default for RuntimeOptions {
    fn default() -> Self {
        Self {
            shutdown_timeout: Duration::from_secs(10),
            source_backoff: Backoff::SOURCE,
            sink_backoff: Backoff::SINK,
            factory: Arc::new(RegistryFactory),
        }
    }
}

/// Turns a connector config into a connector instance (no I/O: `open` does that).
pub trait ConnectorFactory: Send + Sync {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError>;
    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError>;
}

/// Builds the compiled-in connectors named in configs.
pub struct RegistryFactory;

impl ConnectorFactory for RegistryFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        Registry::build_source(&config.connector, &config.plugin_config)
    }

    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError> {
        Registry::build_sink(&config.connector, &config.plugin_config)
    }
}

/// One configured connector, running or not.
struct Slot {
    kind: ConnectorKind,
    key: String,
    config: RwLock<Arc<ConnectorConfig>>,
    status: Arc<StatusCell>,
    metrics: Arc<ConnectorMetrics>,
    /// Set by the running connector while it cannot make progress.
    degraded: Degraded,
    task: tokio::sync::Mutex<Option<Task>>,
}

struct Task {
    shutdown: Shutdown,
    handle: JoinHandle<()>,
}

/// What the CLI and the API see of a connector.
#[derive(Debug, Clone)]
pub struct ConnectorView {
    pub config: Arc<ConnectorConfig>,
    pub status: StatusSnapshot,
    pub metrics: Arc<ConnectorMetrics>,
    /// Why the running connector says it is degraded, if it does.
    pub degraded: Option<String>,
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
            degraded: Degraded::default(),
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
        for kind in [ConnectorKind::Source, ConnectorKind::Sink] {
            let slots: Vec<Arc<Slot>> = self
                .lock_slots()
                .iter()
                .filter(|slot| slot.kind == kind)
                .cloned()
                .collect();
            futures::future::join_all(slots.iter().map(|slot| self.stop_slot(slot))).await;
        }
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

    pub fn view(&self, kind: ConnectorKind, key: &str) -> Result<ConnectorView, RuntimeError> {
        Ok(self.slot(kind, key)?.view())
    }

    pub fn views(&self) -> Vec<ConnectorView> {
        self.lock_slots().iter().map(|slot| slot.view()).collect()
    }

    async fn start_slot(self: &Arc<Self>, slot: &Arc<Slot>) {
        let mut task = slot.task.lock().await;
        if task
            .as_ref()
            .is_some_and(|running| !running.handle.is_finished())
        {
            return;
        }
        slot.status.set_starting();
        let shutdown = Shutdown::new(CancellationToken::new(), self.options.shutdown_timeout);
        let runtime = self.clone();
        let running_slot = slot.clone();
        let task_shutdown = shutdown.clone();
        // Every line the connector and its pipeline log carries its key and type.
        let span = info_span!("connector", connector_key = %slot.key, connector_type = %slot.kind);
        let handle = tokio::spawn(
            async move { runtime.run_slot(&running_slot, task_shutdown).await }.instrument(span),
        );
        *task = Some(Task { shutdown, handle });
    }

    async fn stop_slot(&self, slot: &Slot) {
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
        let config = slot.config();
        let prepared = match config.kind {
            ConnectorKind::Source => self
                .prepare_source(slot, &config, &shutdown)
                .await
                .map(Prepared::Source),
            ConnectorKind::Sink => self
                .prepare_sink(slot, &config, &shutdown)
                .await
                .map(Prepared::Sink),
        };
        match prepared {
            Ok(Prepared::Source(pipeline)) => {
                pipeline.run().await;
            }
            Ok(Prepared::Sink(pipeline)) => {
                pipeline.run().await;
            }
            Err(SetupError::Shutdown) => slot.status.set_stopped(),
            Err(SetupError::Failed(message)) => {
                error!(connector_key = %slot.key, connector_type = %slot.kind, %message, "connector failed to start");
                slot.status.set_stopped_by(StopReason::StartFailed, message);
            }
        }
    }

    async fn prepare_source(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<SourcePipeline, SetupError> {
        let KindConfig::Source { streams, .. } = &config.kind_config else {
            return Err(SetupError::Failed("not a source config".into()));
        };
        let mut source = self.options.factory.source(config).map_err(|error| {
            SetupError::Failed(format!("{}: {error}", config.origin().display()))
        })?;
        source.attach(slot.context());
        let transforms = build_transforms(config)?;
        let stored = self
            .state
            .load(&config.key)
            .await
            .map_err(|error| SetupError::Failed(error.to_string()))?;
        if let Some(stored) = &stored
            && stored.connector != config.connector
        {
            return Err(SetupError::Failed(format!(
                "state {} was written by the \"{}\" connector, not \"{}\"; refusing to start from it",
                self.state.location(&config.key),
                stored.connector,
                config.connector
            )));
        }
        let opened =
            catch_panic(source.open(stored.as_ref().map(|stored| stored.data.as_slice()))).await;
        let open_error = match opened {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(panic) => Some(panic),
        };
        if let Some(error) = open_error {
            let from_state = match &stored {
                Some(_) => format!(
                    " (restoring state from {})",
                    self.state.location(&config.key)
                ),
                None => String::new(),
            };
            return Err(SetupError::Failed(format!(
                "open failed{from_state}: {error}"
            )));
        }
        let policy = config.batch_policy(source.batch_policy());
        let max_in_flight = config.max_in_flight(source.max_in_flight());
        let producers = async {
            let mut routes = Vec::with_capacity(streams.len());
            for stream in streams {
                let target = ProducerTarget {
                    stream: stream.stream.clone(),
                    topic: stream.topic.clone(),
                    partitions: stream.partitions,
                    batch_length: stream.batch_length,
                    linger_time: stream.linger_time,
                };
                let producer = self
                    .connect(slot, shutdown, || self.bus.producer(&target))
                    .await?;
                if source.destructive() && producer.created_volatile_topic() {
                    warn!(
                        connector_key = %config.key, stream = %target.stream, topic = %target.topic,
                        "this source removes what it delivered from its origin, and the topic it just \
                         created acknowledges messages before they are on disk: a broker crash can \
                         lose them; set [iggy] topic_durability = \"persisted\""
                    );
                }
                routes.push(Route {
                    producer,
                    schema: stream.schema.clone(),
                    target: format!("{}/{}", stream.stream, stream.topic),
                });
            }
            let dead_letter = self.dead_letter_producer(slot, config, shutdown).await?;
            Ok((routes, dead_letter))
        }
        .await;
        let (routes, dead_letter) = match producers {
            Ok(producers) => producers,
            Err(error) => {
                let _ = catch_panic(source.close()).await;
                return Err(error);
            }
        };
        Ok(SourcePipeline {
            key: config.key.clone(),
            connector: config.connector.clone(),
            source,
            routes,
            dead_letter,
            transforms,
            state_store: self.state.clone(),
            policy,
            status: slot.status.clone(),
            metrics: slot.metrics.clone(),
            shutdown: shutdown.clone(),
            backoff: self.options.source_backoff,
            max_in_flight,
            verbose: config.verbose,
            benchmark: config.benchmark,
        })
    }

    async fn prepare_sink(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<SinkPipeline, SetupError> {
        let KindConfig::Sink { streams, on_error } = &config.kind_config else {
            return Err(SetupError::Failed("not a sink config".into()));
        };
        let mut sink = self.options.factory.sink(config).map_err(|error| {
            SetupError::Failed(format!("{}: {error}", config.origin().display()))
        })?;
        sink.attach(slot.context());
        let transforms = build_transforms(config)?;
        match catch_panic(sink.open()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(SetupError::Failed(format!("open failed: {error}"))),
            Err(panic) => return Err(SetupError::Failed(format!("open failed: {panic}"))),
        }
        let consumers = async {
            let mut readers = Vec::new();
            for stream in streams {
                for topic in &stream.topics {
                    let spec = ConsumerSpec {
                        stream: stream.stream.clone(),
                        topic: topic.clone(),
                        group: stream.consumer_group.clone(),
                        batch_length: stream.batch_length,
                        poll_interval: stream.poll_interval,
                        connector_key: config.key.clone(),
                        degraded: slot.degraded.clone(),
                    };
                    let consumer = self
                        .connect(slot, shutdown, || self.bus.consumer(&spec))
                        .await?;
                    readers.push(TopicReader {
                        topic: TopicRef {
                            stream: stream.stream.clone(),
                            topic: topic.clone(),
                        },
                        schema: stream.schema.clone(),
                        consumer,
                    });
                }
            }
            let dead_letter = self.dead_letter_producer(slot, config, shutdown).await?;
            Ok((readers, dead_letter))
        }
        .await;
        let (readers, dead_letter) = match consumers {
            Ok(consumers) => consumers,
            Err(error) => {
                let _ = catch_panic(sink.close()).await;
                return Err(error);
            }
        };
        Ok(SinkPipeline {
            readers,
            shutdown: shutdown.clone(),
            context: SinkContext {
                key: config.key.clone(),
                sink,
                dead_letter,
                on_error: *on_error,
                transforms,
                status: slot.status.clone(),
                metrics: slot.metrics.clone(),
                backoff: self.options.sink_backoff,
                verbose: config.verbose,
                benchmark: config.benchmark,
            },
        })
    }

    async fn dead_letter_producer(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<Option<Box<dyn Producer>>, SetupError> {
        let Some(target) = &config.dead_letter else {
            return Ok(None);
        };
        let target = ProducerTarget {
            stream: target.stream.clone(),
            topic: target.topic.clone(),
            partitions: 1,
            batch_length: crate::config::connector::DEFAULT_BATCH_LENGTH,
            linger_time: Duration::ZERO,
        };
        self.connect(slot, shutdown, || self.bus.producer(&target))
            .await
            .map(Some)
    }

    /// Runs a bus setup call, retrying while the bus is unreachable (a broker
    /// outage at startup must not stop a connector for good). A refusal by the
    /// bus (say, a topic it will not create) fails the connector.
    async fn connect<T, F, Fut>(
        &self,
        slot: &Slot,
        shutdown: &Shutdown,
        mut call: F,
    ) -> Result<T, SetupError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, BusError>>,
    {
        let mut failures = 0;
        loop {
            let result = tokio::select! {
                biased;
                () = shutdown.requested() => return Err(SetupError::Shutdown),
                result = call() => result,
            };
            match result {
                Ok(value) => return Ok(value),
                Err(BusError::Unavailable(message)) => {
                    failures += 1;
                    let delay = self.options.sink_backoff.delay(failures);
                    warn!(connector_key = %slot.key, attempt = failures, retry_in_ms = delay.as_millis() as u64, %message, "bus unreachable, retrying");
                    slot.status
                        .record_error(format!("bus unreachable: {message}"));
                    tokio::select! {
                        biased;
                        () = shutdown.requested() => return Err(SetupError::Shutdown),
                        () = tokio::time::sleep(delay) => {}
                    }
                }
                Err(other) => return Err(SetupError::Failed(other.to_string())),
            }
        }
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

impl Slot {
    fn config(&self) -> Arc<ConnectorConfig> {
        self.config
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn view(&self) -> ConnectorView {
        ConnectorView {
            config: self.config(),
            status: self.status.snapshot(),
            metrics: self.metrics.clone(),
            degraded: self.degraded.reason(),
        }
    }

    /// A fresh instance starts not degraded.
    fn context(&self) -> ConnectorContext {
        self.degraded.clear();
        let streams = match &self.config().kind_config {
            KindConfig::Source { streams, .. } => streams
                .iter()
                .map(|entry| TopicRef {
                    stream: entry.stream.clone(),
                    topic: entry.topic.clone(),
                })
                .collect(),
            _ => Vec::new(),
        };
        ConnectorContext {
            key: self.key.clone(),
            degraded: self.degraded.clone(),
            streams,
        }
    }
}

enum Prepared {
    Source(SourcePipeline),
    Sink(SinkPipeline),
}

enum SetupError {
    /// A stop was requested while the connector was still starting.
    Shutdown,
    Failed(String),
}

fn build_transforms(config: &ConnectorConfig) -> Result<Arc<TransformChain>, SetupError> {
    TransformChain::build(&config.transforms)
        .map(Arc::new)
        .map_err(|error| {
            SetupError::Failed(format!(
                "{}: transforms.{}{}: {}",
                config.origin().display(),
                error.transform,
                if error.field.is_empty() {
                    String::new()
                } else {
                    format!(".{}", error.field)
                },
                error.message
            ))
        })
}
