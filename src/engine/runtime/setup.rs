//! Building a connector's pipeline: the connector from its config, its
//! transforms, its state, `open`, and the producers or consumers it needs on
//! the bus (retried while the bus is unreachable).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tracing::{info, warn};

use super::prepared::{Prepared, SetupError};
use super::slot::Slot;
use super::{Runtime, RuntimeOptions};
use crate::config::{ConnectorConfig, KindConfig, SinkStream, SourceStream};
use crate::connectors::record_check::RecordCheck;
use crate::connectors::{ConnectorError, ConnectorKind, RetrySettings, Sink, Source};
use crate::delivery::OnError;
use crate::engine::backoff::Backoff;
use crate::engine::lag::{LagSampler, SOURCE_LAG_INTERVAL};
use crate::engine::retry::{Attempt, Until, retry};
use crate::engine::sink::{SinkContext, SinkPipeline, TopicReader};
use crate::engine::source::{Route, SourcePipeline};
use crate::engine::{Shutdown, catch_panic, close_within};
use crate::iggy::{BusError, ConsumerSpec, Producer, ProducerTarget};
use crate::message::TopicRef;
use crate::state::StoredState;
use crate::transforms::TransformChain;

impl Runtime {
    pub(super) async fn prepare(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<Prepared, SetupError> {
        match config.kind {
            ConnectorKind::Source => self
                .prepare_source(slot, config, shutdown)
                .await
                .map(Prepared::Source),
            ConnectorKind::Sink => self
                .prepare_sink(slot, config, shutdown)
                .await
                .map(Prepared::Sink),
        }
    }

    async fn prepare_source(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<SourcePipeline, SetupError> {
        let KindConfig::Source { streams, .. } = &config.kind_config else {
            return Err(SetupError::WrongKind(ConnectorKind::Source));
        };
        let transforms = build_transforms(config)?;
        let record_check = match &config.dead_letter {
            Some(_) => RecordCheck::default(),
            None => RecordCheck::new(
                transforms.clone(),
                streams.iter().map(|stream| stream.schema.clone()).collect(),
            ),
        };
        let mut source = self
            .open_source(slot, config, record_check, shutdown)
            .await?;
        let policy = config.batch_policy(source.batch_policy());
        let backoff = source
            .retry()
            .map_or(self.options.source_backoff, |retry| retry.backoff);
        let max_in_flight = config.max_in_flight(source.max_in_flight());
        let max_in_flight_bytes =
            usize::try_from(config.max_in_flight_bytes()).unwrap_or(usize::MAX);
        let producers = self
            .routes(slot, config, streams, source.destructive(), shutdown)
            .await;
        let (routes, dead_letter) = match producers {
            Ok(producers) => producers,
            Err(error) => {
                let _ = close_within(&config.key, source.close()).await;
                return Err(error);
            }
        };
        let lag_sampler = source.lag_probe().map(|probe| {
            LagSampler::start(&config.key, probe, slot.lag.clone(), SOURCE_LAG_INTERVAL)
        });
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
            tap: slot.tap.clone(),
            shutdown: shutdown.clone(),
            backoff,
            max_in_flight,
            max_in_flight_bytes,
            verbose: config.verbose,
            benchmark: config.benchmark,
            lag_sampler,
        })
    }

    /// Builds the source and opens it with its saved state (each attempt on
    /// a fresh instance, as [`Runtime::open`] retries).
    async fn open_source(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        record_check: RecordCheck,
        shutdown: &Shutdown,
    ) -> Result<Box<dyn Source>, SetupError> {
        let stored = self.stored_state(slot, config, shutdown).await?;
        let restoring_from = stored.as_ref().map(|_| self.state.location(&config.key));
        let state = stored.as_ref().map(|stored| stored.data.as_slice());
        let build = || {
            let mut source =
                self.options
                    .factory
                    .source(config)
                    .map_err(|error| SetupError::Build {
                        file: config.origin(),
                        error,
                    })?;
            let mut context = slot.context();
            context.record_check = record_check.clone();
            source.attach(context);
            Ok(SourceOpening { source, state })
        };
        Ok(self
            .open(slot, shutdown, restoring_from, build)
            .await?
            .source)
    }

    async fn prepare_sink(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<SinkPipeline, SetupError> {
        let KindConfig::Sink { streams, on_error } = &config.kind_config else {
            return Err(SetupError::WrongKind(ConnectorKind::Sink));
        };
        let transforms = build_transforms(config)?;
        let sink = self.open_sink(slot, config, shutdown).await?;
        let (readers, dead_letter) = match self.readers(slot, config, streams, shutdown).await {
            Ok(consumers) => consumers,
            Err(error) => {
                let mut sink = sink;
                let _ = close_within(&config.key, sink.close()).await;
                return Err(error);
            }
        };
        Ok(SinkPipeline {
            readers,
            shutdown: shutdown.clone(),
            context: self.sink_context(slot, config, *on_error, transforms, sink, dead_letter),
        })
    }

    /// What every topic loop of an opened sink shares.
    pub(super) fn sink_context(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        on_error: OnError,
        transforms: Arc<TransformChain>,
        sink: Box<dyn Sink>,
        dead_letter: Option<Box<dyn Producer>>,
    ) -> SinkContext {
        let retry = sink.retry();
        SinkContext {
            key: config.key.clone(),
            sink,
            dead_letter,
            on_error,
            transforms,
            status: slot.status.clone(),
            metrics: slot.metrics.clone(),
            tap: slot.tap.clone(),
            backoff: retry.map_or(self.options.sink_backoff, |retry| retry.backoff),
            max_retry_after: self.options.max_retry_after,
            degraded: slot.degraded.clone(),
            degraded_after: retry.and_then(|retry| retry.degraded_after),
            verbose: config.verbose,
            benchmark: config.benchmark,
        }
    }

    /// Builds the sink of `config` and opens it (retried as at a start).
    pub(super) async fn open_sink(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<Box<dyn Sink>, SetupError> {
        let build = || {
            let mut sink =
                self.options
                    .factory
                    .sink(config)
                    .map_err(|error| SetupError::Build {
                        file: config.origin(),
                        error,
                    })?;
            sink.attach(slot.context());
            Ok(sink)
        };
        self.open(slot, shutdown, None, build).await
    }

    /// The source's saved state, refused when another connector wrote it.
    /// A store that cannot be reached for now is tried again, as an `open`
    /// whose backend is down.
    async fn stored_state(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        shutdown: &Shutdown,
    ) -> Result<Option<StoredState>, SetupError> {
        let mut attempts = 0;
        let stored = loop {
            let error = match self.state.load(&config.key).await {
                Ok(stored) => break stored,
                Err(error) if error.is_transient() => error,
                Err(error) => return Err(error.into()),
            };
            attempts += 1;
            if self
                .options
                .max_open_attempts
                .is_some_and(|limit| attempts >= limit)
            {
                return Err(error.into());
            }
            let delay = slot_backoff(slot, &self.options).delay(attempts);
            let message = format!("loading state failed: {error}");
            warn!(connector_key = %slot.key, attempt = attempts, retry_in_ms = delay.as_millis() as u64, %message, "retrying the state load");
            slot.status.record_open_failure(attempts, message);
            if !shutdown.pause(delay).await {
                return Err(SetupError::Shutdown);
            }
        };
        if let Some(stored) = &stored
            && stored.connector != config.connector
        {
            return Err(SetupError::ForeignState {
                location: self.state.location(&config.key),
                found: stored.connector.clone(),
                expected: config.connector.clone(),
            });
        }
        Ok(stored)
    }

    /// A source's producers, one per `[[streams]]` entry, and its
    /// dead-letter producer.
    async fn routes(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        streams: &[SourceStream],
        destructive: bool,
        shutdown: &Shutdown,
    ) -> Result<(Vec<Route>, Option<Box<dyn Producer>>), SetupError> {
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
            if destructive && producer.created_volatile_topic() {
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
                topic: TopicRef {
                    stream: stream.stream.clone(),
                    topic: stream.topic.clone(),
                },
            });
        }
        let dead_letter = self.dead_letter_producer(slot, config, shutdown).await?;
        Ok((routes, dead_letter))
    }

    /// A sink's consumers, one per topic of its `[[streams]]` entries, and
    /// its dead-letter producer.
    async fn readers(
        &self,
        slot: &Slot,
        config: &ConnectorConfig,
        streams: &[SinkStream],
        shutdown: &Shutdown,
    ) -> Result<(Vec<TopicReader>, Option<Box<dyn Producer>>), SetupError> {
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
                    lag: slot.lag.clone(),
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

    /// Builds a fresh instance with `build` and opens it, until it opens or
    /// fails for good (rule 5 of docs/ARCHITECTURE.md): a transient failure
    /// (the backend is down or starting) is retried with the connector's
    /// backoff while the status says `starting` with the error and the
    /// count; a fatal one, a panic, or `[engine] max_open_attempts` failures
    /// end with [`SetupError::Open`].
    async fn open<C: Opening>(
        &self,
        slot: &Slot,
        shutdown: &Shutdown,
        restoring_from: Option<String>,
        build: impl Fn() -> Result<C, SetupError>,
    ) -> Result<C, SetupError> {
        let mut attempts = 0;
        loop {
            let mut connector = build()?;
            let error = match catch_panic(connector.open()).await {
                Ok(Ok(())) => {
                    if attempts > 0 {
                        info!(connector_key = %slot.key, attempts, "opened after failed attempts");
                    }
                    return Ok(connector);
                }
                Ok(Err(error)) if error.is_transient() => error,
                Ok(Err(error)) => return Err(open_failed(restoring_from, error.to_string())),
                Err(panic) => return Err(open_failed(restoring_from, panic)),
            };
            let _ = close_within(&slot.key, connector.close()).await;
            attempts += 1;
            if self
                .options
                .max_open_attempts
                .is_some_and(|limit| attempts >= limit)
            {
                let reason = format!(
                    "{error} (gave up after {attempts} attempts: [engine] max_open_attempts)"
                );
                return Err(open_failed(restoring_from, reason));
            }
            let backoff = connector
                .retry()
                .map_or(slot_backoff(slot, &self.options), |retry| retry.backoff);
            let delay = backoff.delay(attempts);
            let message = format!("open failed: {error}");
            warn!(connector_key = %slot.key, attempt = attempts, retry_in_ms = delay.as_millis() as u64, %message, "retrying open");
            slot.status.record_open_failure(attempts, message);
            slot.metrics.open_retries.add(1);
            if !shutdown.pause(delay).await {
                return Err(SetupError::Shutdown);
            }
        }
    }

    pub(super) async fn dead_letter_producer(
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
        retry(
            self.options.sink_backoff,
            shutdown,
            Until::StopRequested,
            || {
                let call = call();
                async move {
                    match call.await {
                        Ok(value) => Attempt::Done(value),
                        Err(BusError::Unavailable(message)) => Attempt::Failed(message),
                        Err(other) => Attempt::Stop(SetupError::Bus(other)),
                    }
                }
            },
            |failure| {
                let message = failure.error;
                warn!(connector_key = %slot.key, attempt = failure.attempt, retry_in_ms = failure.delay.as_millis() as u64, %message, "bus unreachable, retrying");
                slot.status
                    .record_error(format!("bus unreachable: {message}"));
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| SetupError::Shutdown))
    }
}

/// A connector being opened, retried by [`Runtime::open`].
#[async_trait]
trait Opening: Send {
    async fn open(&mut self) -> Result<(), ConnectorError>;
    async fn close(&mut self) -> Result<(), ConnectorError>;
    fn retry(&self) -> Option<RetrySettings>;
}

/// A source with the state it opens from (the same on every attempt).
struct SourceOpening<'a> {
    source: Box<dyn Source>,
    state: Option<&'a [u8]>,
}

#[async_trait]
impl Opening for SourceOpening<'_> {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.source.open(self.state).await
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.source.close().await
    }

    fn retry(&self) -> Option<RetrySettings> {
        self.source.retry()
    }
}

#[async_trait]
impl Opening for Box<dyn Sink> {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.as_mut().open().await
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.as_mut().close().await
    }

    fn retry(&self) -> Option<RetrySettings> {
        self.as_ref().retry()
    }
}

/// The engine's default backoff for a connector of the slot's kind.
fn slot_backoff(slot: &Slot, options: &RuntimeOptions) -> Backoff {
    match slot.kind {
        ConnectorKind::Source => options.source_backoff,
        ConnectorKind::Sink => options.sink_backoff,
    }
}

fn open_failed(restoring_from: Option<String>, reason: String) -> SetupError {
    SetupError::Open {
        restoring_from,
        reason,
    }
}

pub(super) fn build_transforms(
    config: &ConnectorConfig,
) -> Result<Arc<TransformChain>, SetupError> {
    TransformChain::build(&config.transforms)
        .map(Arc::new)
        .map_err(|error| SetupError::Transforms {
            file: config.origin(),
            error,
        })
}
