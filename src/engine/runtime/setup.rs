//! Building a connector's pipeline: the connector from its config, its
//! transforms, its state, `open`, and the producers or consumers it needs on
//! the bus (retried while the bus is unreachable).

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tracing::warn;

use super::Runtime;
use super::slot::Slot;
use crate::config::{ConnectorConfig, KindConfig};
use crate::connectors::{BuildError, ConnectorKind};
use crate::engine::retry::{Attempt, Until, retry};
use crate::engine::sink::{SinkContext, SinkPipeline, TopicReader};
use crate::engine::source::{Route, SourcePipeline};
use crate::engine::{Shutdown, catch_panic};
use crate::iggy::{BusError, ConsumerSpec, Producer, ProducerTarget};
use crate::message::TopicRef;
use crate::state::StateError;
use crate::transforms::{TransformChain, TransformConfigError};

pub(super) enum Prepared {
    Source(SourcePipeline),
    Sink(SinkPipeline),
}

/// Why a connector did not start; shown as its stop message.
#[derive(Debug, thiserror::Error)]
pub(super) enum SetupError {
    /// A stop was requested while the connector was still starting.
    #[error("stopped while starting")]
    Shutdown,
    #[error("not a {0} config")]
    WrongKind(ConnectorKind),
    #[error("{}: {error}", file.display())]
    Build {
        file: PathBuf,
        #[source]
        error: BuildError,
    },
    #[error("{}: transforms.{}{}: {}", file.display(), error.transform, field_suffix(&error.field), error.message)]
    Transforms {
        file: PathBuf,
        #[source]
        error: TransformConfigError,
    },
    #[error(transparent)]
    LoadState(#[from] StateError),
    #[error(
        "state {location} was written by the \"{found}\" connector, not \"{expected}\"; refusing to start from it"
    )]
    ForeignState {
        location: String,
        found: String,
        expected: String,
    },
    /// `open` failed (or panicked: `reason` is then the panic message).
    #[error("open failed{}: {reason}", restoring_from.as_ref().map(|location| format!(" (restoring state from {location})")).unwrap_or_default())]
    Open {
        restoring_from: Option<String>,
        reason: String,
    },
    /// The bus refused a producer or consumer (not merely unreachable).
    #[error("{0}")]
    Bus(BusError),
}

fn field_suffix(field: &str) -> String {
    if field.is_empty() {
        String::new()
    } else {
        format!(".{field}")
    }
}

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
        let mut source =
            self.options
                .factory
                .source(config)
                .map_err(|error| SetupError::Build {
                    file: config.origin(),
                    error,
                })?;
        source.attach(slot.context());
        let transforms = build_transforms(config)?;
        let stored = self.state.load(&config.key).await?;
        if let Some(stored) = &stored
            && stored.connector != config.connector
        {
            return Err(SetupError::ForeignState {
                location: self.state.location(&config.key),
                found: stored.connector.clone(),
                expected: config.connector.clone(),
            });
        }
        let opened =
            catch_panic(source.open(stored.as_ref().map(|stored| stored.data.as_slice()))).await;
        let open_error = match opened {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error.to_string()),
            Err(panic) => Some(panic),
        };
        if let Some(reason) = open_error {
            let restoring_from = stored.as_ref().map(|_| self.state.location(&config.key));
            return Err(open_failed(restoring_from, reason));
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
            return Err(SetupError::WrongKind(ConnectorKind::Sink));
        };
        let mut sink = self
            .options
            .factory
            .sink(config)
            .map_err(|error| SetupError::Build {
                file: config.origin(),
                error,
            })?;
        sink.attach(slot.context());
        let transforms = build_transforms(config)?;
        match catch_panic(sink.open()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => return Err(open_failed(None, error.to_string())),
            Err(panic) => return Err(open_failed(None, panic)),
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

fn open_failed(restoring_from: Option<String>, reason: String) -> SetupError {
    SetupError::Open {
        restoring_from,
        reason,
    }
}

fn build_transforms(config: &ConnectorConfig) -> Result<Arc<TransformChain>, SetupError> {
    TransformChain::build(&config.transforms)
        .map(Arc::new)
        .map_err(|error| SetupError::Transforms {
            file: config.origin(),
            error,
        })
}
