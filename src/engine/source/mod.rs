//! The source pipeline: poll -> transform -> encode -> send -> save state ->
//! commit, with up to `max_in_flight` batches polled and not committed (the
//! loop is in [`batches`]; this file holds the pipeline and what it does to
//! one batch: prepare its records, send them, report it committed).
//!
//! A failed send or state save is a NACK: the same batch is retried with capped
//! backoff, nothing is committed past it and no state covering it is saved.
//! What already succeeded within a batch (a stream's send, the state save) is
//! not repeated, so a retry duplicates as little as possible.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::{Level, debug, enabled, error, info, warn};

use crate::codec::Schema;
use crate::connectors::{
    BatchPolicy, ConnectorError, ConnectorKind, RejectedItem, Source, SourceBatch,
};
use crate::engine::backoff::Backoff;
use crate::engine::dead_letter::ErrorClass;
use crate::engine::lag::LagSampler;
use crate::engine::metrics::{ConnectorMetrics, ErrorStage, Stage};
use crate::engine::retry::{Attempt, Failure, Until, retry};
use crate::engine::status::{StatusCell, StopReason};
use crate::engine::tap::{Tap, TapStage};
use crate::engine::{BENCHMARK_TARGET, Shutdown, catch_panic, close_within, dead_letter};
use crate::iggy::{Prepared, Producer};
use crate::message::{Headers, OutgoingMessage, Payload, SourceRecord, TopicRef};
use crate::state::StateStore;
use crate::telemetry::{self, BatchSpan};
use crate::transforms::{MessageMeta, Side, TransformChain, Verdict};

mod batches;

/// One `[[streams]]` entry of a source: where its records go and how they are
/// encoded.
pub struct Route {
    pub producer: Box<dyn Producer>,
    pub schema: Schema,
    /// `stream/topic`, for logs.
    pub target: String,
    /// The same, for transforms that read it.
    pub topic: TopicRef,
}

/// Everything a running source needs; built by the runtime once the source is
/// open and its producers exist.
pub struct SourcePipeline {
    pub key: String,
    /// Registry name of the connector, stored with its state.
    pub connector: String,
    pub source: Box<dyn Source>,
    pub routes: Vec<Route>,
    pub dead_letter: Option<Box<dyn Producer>>,
    pub transforms: Arc<TransformChain>,
    pub state_store: Arc<dyn StateStore>,
    pub policy: BatchPolicy,
    pub status: Arc<StatusCell>,
    pub metrics: Arc<ConnectorMetrics>,
    pub tap: Arc<Tap>,
    pub shutdown: Shutdown,
    pub backoff: Backoff,
    /// Batches polled and not yet committed, at most.
    pub max_in_flight: usize,
    /// Payload bytes of those batches before another poll waits (a batch
    /// alone may hold more).
    pub max_in_flight_bytes: usize,
    pub verbose: bool,
    /// Emit upstream's per-batch `benchmark` event.
    pub benchmark: bool,
    /// Measures the source's lag while it runs; stopped before `close`.
    pub lag_sampler: Option<LagSampler>,
}

/// How the batch loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// A stop was requested (what was in flight is committed, or left
    /// uncommitted if its grace period ran out).
    Shutdown,
    /// The pipeline stopped on its own.
    Stopped(StopReason, String),
    /// The connector's connection is gone: the runtime closes it and opens a
    /// fresh instance with backoff, resuming from committed state.
    Disconnected(String),
}

/// Where the time of one delivered batch went, for the benchmark event and
/// the batch span.
#[derive(Debug, Default)]
struct Timings {
    iggy_send: Duration,
    state_save: Option<Duration>,
    /// NACKed delivery attempts.
    nacks: u32,
    /// Collect `stages` (the batch span records): off unless telemetry is on.
    traced: bool,
    stages: Vec<StageMark>,
}

/// One timed stage of a delivery attempt, for the batch span.
#[derive(Debug)]
struct StageMark {
    name: &'static str,
    from: Instant,
    to: Instant,
    error: Option<String>,
}

impl Timings {
    fn mark<T, E: std::fmt::Display>(
        &mut self,
        name: &'static str,
        from: Instant,
        outcome: &Result<T, E>,
    ) {
        if self.traced {
            self.stages.push(StageMark {
                name,
                from,
                to: Instant::now(),
                error: outcome.as_ref().err().map(ToString::to_string),
            });
        }
    }
}

/// Why one delivery attempt failed.
struct Nack {
    stage: ErrorStage,
    message: String,
}

impl SourcePipeline {
    /// Runs batches until a stop is requested or the source stops on its own,
    /// then closes the source and records the final status.
    pub async fn run(mut self) -> Ended {
        self.status.set_running();
        info!(connector_key = %self.key, connector = %self.connector, "source running");
        let ended = self.run_batches().await;
        // The probe may hold the source's client: it goes first.
        if let Some(sampler) = self.lag_sampler.take() {
            sampler.stop().await;
        }
        match close_within(&self.key, self.source.close()).await {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(error))) => warn!(connector_key = %self.key, %error, "source close failed"),
            Some(Err(panic)) => warn!(connector_key = %self.key, %panic, "source close panicked"),
        }
        match &ended {
            Ended::Shutdown => {
                info!(connector_key = %self.key, "source stopped");
                self.status.set_stopped();
            }
            // The runtime reopens it and reports the status meanwhile.
            Ended::Disconnected(_) => {}
            Ended::Stopped(reason, message) => {
                if reason.is_failure() {
                    error!(connector_key = %self.key, stop_reason = %reason, %message, "source stopped");
                    metrics::counter!(
                        "iggy_connector_stops_total",
                        "connector_key" => self.key.clone(),
                        "connector_type" => "source",
                        "reason" => reason.as_str()
                    )
                    .increment(1);
                } else {
                    info!(connector_key = %self.key, stop_reason = %reason, %message, "source finished");
                }
                self.status.set_stopped_by(*reason, message.clone());
            }
        }
        ended
    }

    /// Polls the next batch, retrying transient failures with backoff. `Err`
    /// ends the pipeline (a stop request, a fatal error or a panic).
    async fn poll_next(&self) -> Result<SourceBatch, Ended> {
        retry(
            self.backoff,
            &self.shutdown,
            Until::StopRequested,
            || async { call_attempt("poll", catch_panic(self.source.poll()).await) },
            |failure| self.retrying(ErrorStage::Poll, "poll", failure),
        )
        .await
        .map_err(|gave_up| gave_up.or(|| Ended::Shutdown))
    }

    /// Records a committed batch: its total time, its log line and, when
    /// asked for, its benchmark event.
    fn committed(
        &self,
        sent: usize,
        count: usize,
        started: Instant,
        prepared: Duration,
        timings: &Timings,
    ) {
        let total = started.elapsed();
        self.metrics.record_duration(Stage::Total, total);
        let level_info = self.verbose;
        if level_info || self.benchmark || enabled!(Level::DEBUG) {
            if self.benchmark {
                self.emit_benchmark(count, sent, prepared, timings, total);
            }
            if level_info {
                info!(connector_key = %self.key, records = count, sent, elapsed_us = total.as_micros() as u64, "batch committed");
            } else {
                debug!(connector_key = %self.key, records = count, sent, elapsed_us = total.as_micros() as u64, "batch committed");
            }
        }
    }

    /// Upstream's per-batch timing event (target `iggy_connectors::benchmark`).
    /// Sources here hand typed payloads to the engine, so nothing is decoded:
    /// `decode_us` is always 0.
    fn emit_benchmark(
        &self,
        batch_size: usize,
        sent_count: usize,
        prepared: Duration,
        timings: &Timings,
        total: Duration,
    ) {
        let (stream, topic) = match self.routes.as_slice() {
            [route] => route
                .target
                .split_once('/')
                .unwrap_or((route.target.as_str(), "")),
            _ => ("*", "*"),
        };
        info!(
            target: BENCHMARK_TARGET,
            connector_type = "source",
            connector_key = %self.key,
            stream,
            topic,
            batch_size,
            sent_count,
            decode_us = 0u64,
            prepare_us = prepared.as_micros() as u64,
            iggy_send_us = timings.iggy_send.as_micros() as u64,
            state_saved = timings.state_save.is_some(),
            state_save_us = timings.state_save.map_or(0, |elapsed| elapsed.as_micros() as u64),
            total_us = total.as_micros() as u64,
            "benchmark"
        );
    }

    /// Transforms and encodes every record. Returns one group of messages per
    /// route, plus a last group for the dead-letter topic, and how many
    /// records failed. A record that fails is counted and dead-lettered (when
    /// configured), never failing the batch.
    fn prepare(&self, records: Vec<SourceRecord>) -> (Vec<Vec<OutgoingMessage>>, usize) {
        if self.tap.is_tapped(TapStage::In) {
            let topics: Vec<&TopicRef> = self.routes.iter().map(|route| &route.topic).collect();
            self.tap.source_records(&topics, &records);
        }
        let threads = match self.transforms.is_empty() {
            true => 1,
            false => prepare_threads(records.len()),
        };
        if threads <= 1 {
            return self.prepare_records(records);
        }
        // Transforms cost far more per record than the rest of the pipeline:
        // the batch is cut into consecutive slices prepared on their own
        // threads, and the slices' groups are joined back in order.
        let per_thread = records.len().div_ceil(threads);
        let mut records = records.into_iter();
        let slices: Vec<Vec<SourceRecord>> = (0..threads)
            .map(|_| records.by_ref().take(per_thread).collect())
            .collect();
        let prepared = std::thread::scope(|scope| {
            let mut slices = slices.into_iter();
            let first = slices.next().unwrap_or_default();
            let others: Vec<_> = slices
                .map(|slice| scope.spawn(move || self.prepare_records(slice)))
                .collect();
            let mut prepared = vec![self.prepare_records(first)];
            for other in others {
                match other.join() {
                    Ok(slice) => prepared.push(slice),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
            prepared
        });
        let mut prepared = prepared.into_iter();
        let (mut groups, mut rejected) = prepared.next().unwrap_or_default();
        for (slice_groups, slice_rejected) in prepared {
            rejected += slice_rejected;
            for (group, slice_group) in groups.iter_mut().zip(slice_groups) {
                group.extend(slice_group);
            }
        }
        (groups, rejected)
    }

    /// Transforms and encodes `records` in order: per route a group of
    /// messages, then a group of dead letters; and how many were rejected.
    fn prepare_records(&self, records: Vec<SourceRecord>) -> (Vec<Vec<OutgoingMessage>>, usize) {
        let mut rejected = 0;
        let mut groups: Vec<Vec<OutgoingMessage>> =
            (0..=self.routes.len()).map(|_| Vec::new()).collect();
        if let Some(first) = groups.first_mut() {
            first.reserve(records.len());
        }
        for record in records {
            let SourceRecord {
                id,
                stream_index,
                mut headers,
                mut payload,
                mut partition,
                origin_timestamp,
            } = record;
            let outcome = match self.routes.get(stream_index) {
                Some(route) => {
                    let mut meta = MessageMeta {
                        side: Side::Source,
                        topic: Some(&route.topic),
                        partition,
                        id,
                        offset: None,
                        timestamp: None,
                        origin_timestamp,
                        headers: &mut headers,
                        key: None,
                    };
                    let outcome = self.transform_and_encode(route, &mut payload, &mut meta);
                    partition = meta.partition_for_source();
                    outcome
                }
                None => Err((
                    ErrorStage::Encode,
                    format!(
                        "record names stream entry {stream_index}, but the connector has {}",
                        self.routes.len()
                    ),
                )),
            };
            match outcome {
                Ok(Some(bytes)) => {
                    let message = OutgoingMessage {
                        id,
                        headers,
                        payload: bytes,
                        partition,
                        origin_timestamp,
                    };
                    match self.routes[stream_index].producer.check(&message) {
                        Ok(()) => groups[stream_index].push(message),
                        Err(error) => {
                            rejected += 1;
                            let OutgoingMessage { id, headers, .. } = message;
                            let failed = Failed {
                                stage: ErrorStage::Encode,
                                class: ErrorClass::Unstorable,
                                error: &error,
                                route: self.routes.get(stream_index).map(|route| &route.topic),
                            };
                            self.reject(&mut groups, failed, id, headers, &payload);
                        }
                    }
                }
                Ok(None) => self.metrics.filtered.add(1),
                Err((stage, error)) => {
                    rejected += 1;
                    let class = match stage {
                        ErrorStage::Transform => ErrorClass::Transform,
                        _ => ErrorClass::Encode,
                    };
                    let failed = Failed {
                        stage,
                        class,
                        error: &error,
                        route: self.routes.get(stream_index).map(|route| &route.topic),
                    };
                    self.reject(&mut groups, failed, id, headers, &payload);
                }
            }
        }
        (groups, rejected)
    }

    /// One record's payload, transformed and encoded with its route's schema;
    /// `None` when a transform drops it.
    fn transform_and_encode(
        &self,
        route: &Route,
        payload: &mut Payload,
        meta: &mut MessageMeta<'_>,
    ) -> Result<Option<Bytes>, (ErrorStage, String)> {
        if !self.transforms.is_empty() {
            match self.transforms.apply_with(payload, meta) {
                Ok(Verdict::Keep) => {}
                Ok(Verdict::Drop) => return Ok(None),
                Err(error) => return Err((ErrorStage::Transform, error.to_string())),
            }
        }
        route
            .schema
            .encode(payload)
            .map(Some)
            .map_err(|error| (ErrorStage::Encode, error.to_string()))
    }

    fn reject(
        &self,
        groups: &mut [Vec<OutgoingMessage>],
        failed: Failed<'_>,
        id: Option<u128>,
        headers: Headers,
        payload: &Payload,
    ) {
        let Failed {
            stage,
            class,
            error,
            route,
        } = failed;
        self.metrics.error(stage, 1);
        warn!(connector_key = %self.key, stage = stage.as_str(), %error, "dropping record");
        if self.dead_letter.is_some()
            && let Some(group) = groups.last_mut()
        {
            let failure = dead_letter::Failure {
                connector_key: &self.key,
                connector_type: ConnectorKind::Source,
                stage: stage.as_str(),
                class,
                error,
            };
            group.push(dead_letter::message(
                &failure,
                id,
                headers,
                payload.to_bytes(),
                route.map(dead_letter::Origin::topic),
            ));
        }
    }

    /// Items the source set aside at its last poll: counted and
    /// dead-lettered (class and stage `decode`) like records that fail
    /// encode, never failing the batch. Returns how many.
    fn set_aside(&self, groups: &mut [Vec<OutgoingMessage>], items: Vec<RejectedItem>) -> usize {
        let count = items.len();
        for item in items {
            let failed = Failed {
                stage: ErrorStage::Decode,
                class: ErrorClass::Decode,
                error: &item.reason,
                route: self.routes.first().map(|route| &route.topic),
            };
            self.reject(
                groups,
                failed,
                item.id,
                item.headers,
                &Payload::Raw(item.payload),
            );
        }
        count
    }

    /// Where group `index` of a batch goes: the route's producer, or for the
    /// group after the routes the dead-letter topic's (`None`: no such
    /// topic).
    fn producer(&self, index: usize) -> Option<(&dyn Producer, ErrorStage)> {
        match self.routes.get(index) {
            Some(route) => Some((route.producer.as_ref(), ErrorStage::Send)),
            None => self
                .dead_letter
                .as_deref()
                .map(|producer| (producer, ErrorStage::DeadLetter)),
        }
    }

    /// Each group made ready for its producer ([`Producer::prepare`]).
    fn prepare_sends(&self, groups: Vec<Vec<OutgoingMessage>>) -> Vec<Prepared> {
        groups
            .into_iter()
            .enumerate()
            .map(|(index, messages)| match self.producer(index) {
                Some((producer, _)) if !messages.is_empty() => producer.prepare(messages),
                _ => Prepared::from(messages),
            })
            .collect()
    }

    async fn send_all(
        &self,
        groups: &[Prepared],
        sent: &mut [bool],
        timings: &mut Timings,
    ) -> Result<(), Nack> {
        for (index, prepared) in groups.iter().enumerate() {
            let messages = &prepared.messages;
            if sent[index] || messages.is_empty() {
                continue;
            }
            let Some((producer, stage)) = self.producer(index) else {
                continue;
            };
            let started = Instant::now();
            let sent_now = producer.send_prepared(prepared).await;
            timings.mark(
                match stage {
                    ErrorStage::Send => "send",
                    _ => "dead_letter",
                },
                started,
                &sent_now,
            );
            sent_now.map_err(|error| Nack {
                stage,
                message: match self.routes.get(index) {
                    Some(route) => format!("send to {} failed: {error}", route.target),
                    None => format!("send to the dead-letter topic failed: {error}"),
                },
            })?;
            let elapsed = started.elapsed();
            self.metrics.record_duration(Stage::IggySend, elapsed);
            timings.iggy_send += elapsed;
            sent[index] = true;
            if stage == ErrorStage::Send {
                self.metrics.sent.add(messages.len() as u64);
                let bytes = messages
                    .iter()
                    .map(|message| message.payload.len())
                    .sum::<usize>();
                self.metrics.bytes.add(bytes as u64);
                let topic = self.routes.get(index).map(|route| &route.topic);
                self.tap.outgoing(TapStage::Out, topic, messages);
            } else {
                self.metrics.dead_lettered.add(messages.len() as u64);
                self.tap.outgoing(TapStage::Dlq, None, messages);
            }
        }
        Ok(())
    }

    /// Tells the source the batch is durable, retrying transient failures.
    async fn commit(&self) -> Result<(), Ended> {
        retry(
            self.backoff,
            &self.shutdown,
            Until::GraceExpired,
            || async { call_attempt("commit", catch_panic(self.source.commit()).await) },
            |failure| self.retrying(ErrorStage::Commit, "commit", failure),
        )
        .await
        .map_err(|gave_up| gave_up.or(|| self.abandon()))
    }

    /// Reports a failed `poll` or `commit` that is retried.
    fn retrying(
        &self,
        stage: ErrorStage,
        what: &str,
        failure: Failure<ConnectorError>,
    ) -> Result<(), Ended> {
        self.metrics.error(stage, 1);
        let message = format!("{what} failed: {}", failure.error);
        warn!(connector_key = %self.key, attempt = failure.attempt, %message, "retrying {what}");
        self.status.record_error(message);
        Ok(())
    }

    fn abandon(&self) -> Ended {
        warn!(connector_key = %self.key, "stop requested and the grace period ran out; the batch in flight stays uncommitted and will be read again");
        Ended::Shutdown
    }
}

/// Links the batch span to the request trace each record carries (the HTTP
/// source copies `traceparent` into the headers), once per distinct trace.
fn link_requests(trace: &mut BatchSpan, records: &[SourceRecord]) {
    let mut seen: Vec<&str> = Vec::new();
    for record in records {
        let header =
            |name: &str| {
                record.headers.iter().find(|(key, _)| key == name).and_then(
                    |(_, value)| match value {
                        crate::message::HeaderValue::String(text) => Some(text.as_str()),
                        _ => None,
                    },
                )
            };
        if let Some(parent) = header(telemetry::TRACEPARENT)
            && !seen.contains(&parent)
        {
            seen.push(parent);
            trace.link(parent, header(telemetry::TRACESTATE));
        }
    }
}

/// A source call's outcome as a retry attempt: transient errors are retried;
/// fatal errors and panics stop the pipeline.
fn call_attempt<T>(
    what: &str,
    called: Result<Result<T, ConnectorError>, String>,
) -> Attempt<T, ConnectorError, Ended> {
    match called {
        Ok(Ok(value)) => Attempt::Done(value),
        Ok(Err(ConnectorError::Disconnected(error))) => {
            Attempt::Stop(Ended::Disconnected(format!("{what} failed: {error}")))
        }
        Ok(Err(error)) if error.is_transient() => Attempt::Failed(error),
        Ok(Err(error)) => Attempt::Stop(Ended::Stopped(
            StopReason::Fatal,
            format!("{what} failed: {error}"),
        )),
        Err(panic) => Attempt::Stop(Ended::Stopped(StopReason::Panic, panic)),
    }
}

/// Why a record is set aside, and the topic it was meant for.
/// Threads that prepare a batch of `records` with transforms: one per core
/// (at most 8), each with at least [`PREPARE_SLICE_MIN`] records.
fn prepare_threads(records: usize) -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES
        .get_or_init(|| std::thread::available_parallelism().map_or(1, |cores| cores.get().min(8)));
    cores.min(records / PREPARE_SLICE_MIN).max(1)
}

/// The fewest records worth a thread of their own: far more work than
/// starting the thread costs, even for the cheapest transform.
const PREPARE_SLICE_MIN: usize = 128;

struct Failed<'a> {
    stage: ErrorStage,
    class: ErrorClass,
    error: &'a str,
    route: Option<&'a TopicRef>,
}
