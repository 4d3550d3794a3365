//! The source pipeline: poll -> transform -> encode -> send -> save state ->
//! commit, with exactly one batch in flight.
//!
//! A failed send or state save is a NACK: the same batch is retried with capped
//! backoff, nothing is polled past it and no state covering it is saved. What
//! already succeeded within a batch (a stream's send, the state save) is not
//! repeated, so a retry duplicates as little as possible.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{Level, debug, enabled, error, info, warn};

use crate::connectors::{BatchPolicy, Source, SourceBatch};
use crate::engine::backoff::Backoff;
use crate::engine::codec::Schema;
use crate::engine::metrics::{ConnectorMetrics, ErrorStage, Stage};
use crate::engine::status::{StatusCell, StopReason};
use crate::engine::transforms::{TransformChain, Verdict};
use crate::engine::{Shutdown, catch_panic, dead_letter};
use crate::iggy::Producer;
use crate::message::{OutgoingMessage, Payload, SourceRecord};
use crate::state::{StateStore, StoredState};

/// One `[[streams]]` entry of a source: where its records go and how they are
/// encoded.
pub struct Route {
    pub producer: Box<dyn Producer>,
    pub schema: Schema,
    /// `stream/topic`, for logs.
    pub target: String,
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
    pub shutdown: Shutdown,
    pub backoff: Backoff,
    pub verbose: bool,
}

/// How the batch loop ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// A stop was requested (what was in flight is committed, or left
    /// uncommitted if its grace period ran out).
    Shutdown,
    /// The pipeline stopped on its own.
    Stopped(StopReason, String),
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
        match catch_panic(self.source.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => warn!(connector_key = %self.key, %error, "source close failed"),
            Err(panic) => warn!(connector_key = %self.key, %panic, "source close panicked"),
        }
        match &ended {
            Ended::Shutdown => {
                info!(connector_key = %self.key, "source stopped");
                self.status.set_stopped();
            }
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

    async fn run_batches(&mut self) -> Ended {
        let mut poll_failures = 0;
        loop {
            let polled = tokio::select! {
                biased;
                () = self.shutdown.requested() => return Ended::Shutdown,
                polled = catch_panic(self.source.poll()) => polled,
            };
            let batch = match polled {
                Err(panic) => return Ended::Stopped(StopReason::Panic, panic),
                Ok(Err(error)) if error.is_transient() => {
                    poll_failures += 1;
                    self.metrics.error(ErrorStage::Poll, 1);
                    let message = format!("poll failed: {error}");
                    warn!(connector_key = %self.key, attempt = poll_failures, %message, "retrying poll");
                    self.status.record_error(message);
                    if !self.pause(self.backoff.delay(poll_failures)).await {
                        return Ended::Shutdown;
                    }
                    continue;
                }
                Ok(Err(error)) => {
                    return Ended::Stopped(StopReason::Fatal, format!("poll failed: {error}"));
                }
                Ok(Ok(batch)) => batch,
            };
            poll_failures = 0;
            if let Err(ended) = self.handle(batch).await {
                return ended;
            }
        }
    }

    /// Delivers one batch and commits it. `Err` ends the pipeline.
    async fn handle(&self, batch: SourceBatch) -> Result<(), Ended> {
        let started = Instant::now();
        let SourceBatch {
            records,
            state,
            finished,
        } = batch;
        let count = records.len();
        if count == 0 && state.is_none() && !finished {
            // Nothing to deliver; let the source finish whatever it staged.
            tokio::task::yield_now().await;
            return self.commit().await;
        }
        self.metrics.produced.add(count as u64);
        let groups = self.prepare(records);
        self.metrics
            .record_duration(Stage::Prepare, started.elapsed());
        let state = state.map(|data| StoredState {
            connector: self.connector.clone(),
            data,
        });
        self.deliver(&groups, state.as_ref()).await?;
        self.commit().await?;
        self.metrics
            .record_duration(Stage::Total, started.elapsed());
        let level_info = self.verbose;
        if level_info || enabled!(Level::DEBUG) {
            let sent: usize = groups[..self.routes.len()].iter().map(Vec::len).sum();
            if level_info {
                info!(connector_key = %self.key, records = count, sent, elapsed_us = started.elapsed().as_micros() as u64, "batch committed");
            } else {
                debug!(connector_key = %self.key, records = count, sent, elapsed_us = started.elapsed().as_micros() as u64, "batch committed");
            }
        }
        if finished {
            return Err(Ended::Stopped(
                StopReason::Completed,
                "the source has nothing more to produce".into(),
            ));
        }
        Ok(())
    }

    /// Transforms and encodes every record. Returns one group of messages per
    /// route, plus a last group for the dead-letter topic. A record that fails
    /// is counted and dead-lettered (when configured), never failing the batch.
    fn prepare(&self, records: Vec<SourceRecord>) -> Vec<Vec<OutgoingMessage>> {
        let mut groups: Vec<Vec<OutgoingMessage>> =
            (0..=self.routes.len()).map(|_| Vec::new()).collect();
        if let Some(first) = groups.first_mut() {
            first.reserve(records.len());
        }
        for record in records {
            let SourceRecord {
                id,
                stream_index,
                headers,
                mut payload,
            } = record;
            let Some(route) = self.routes.get(stream_index) else {
                let error = format!(
                    "record names stream entry {stream_index}, but the connector has {}",
                    self.routes.len()
                );
                self.reject(
                    &mut groups,
                    ErrorStage::Encode,
                    &error,
                    id,
                    headers,
                    &payload,
                );
                continue;
            };
            if !self.transforms.is_empty() {
                match self.transforms.apply(&mut payload) {
                    Ok(Verdict::Keep) => {}
                    Ok(Verdict::Drop) => {
                        self.metrics.filtered.add(1);
                        continue;
                    }
                    Err(error) => {
                        self.reject(
                            &mut groups,
                            ErrorStage::Transform,
                            &error.to_string(),
                            id,
                            headers,
                            &payload,
                        );
                        continue;
                    }
                }
            }
            let bytes = match route.schema.encode(&payload) {
                Ok(bytes) => bytes,
                Err(error) => {
                    let error = error.to_string();
                    self.reject(
                        &mut groups,
                        ErrorStage::Encode,
                        &error,
                        id,
                        headers,
                        &payload,
                    );
                    continue;
                }
            };
            let message = OutgoingMessage {
                id,
                headers,
                payload: bytes,
            };
            match route.producer.check(&message) {
                Ok(()) => groups[stream_index].push(message),
                Err(error) => {
                    let OutgoingMessage { id, headers, .. } = message;
                    self.reject(
                        &mut groups,
                        ErrorStage::Encode,
                        &error,
                        id,
                        headers,
                        &payload,
                    );
                }
            }
        }
        groups
    }

    fn reject(
        &self,
        groups: &mut [Vec<OutgoingMessage>],
        stage: ErrorStage,
        error: &str,
        id: Option<u128>,
        headers: crate::message::Headers,
        payload: &Payload,
    ) {
        self.metrics.error(stage, 1);
        warn!(connector_key = %self.key, stage = stage.as_str(), %error, "dropping record");
        if self.dead_letter.is_some()
            && let Some(group) = groups.last_mut()
        {
            group.push(dead_letter::message(
                &self.key,
                stage.as_str(),
                error,
                id,
                headers,
                payload.to_bytes(),
                None,
            ));
        }
    }

    /// Sends every group and saves the state, retrying the parts that failed
    /// until they succeed, the NACK limit is reached, or the grace period after a
    /// stop request runs out.
    async fn deliver(
        &self,
        groups: &[Vec<OutgoingMessage>],
        state: Option<&StoredState>,
    ) -> Result<(), Ended> {
        let mut sent = vec![false; groups.len()];
        let mut saved = state.is_none();
        let mut nacks = 0;
        let give_up = self.shutdown.grace_expired();
        tokio::pin!(give_up);
        loop {
            let attempt = tokio::select! {
                biased;
                () = &mut give_up => return Err(self.abandon()),
                attempt = self.attempt(groups, &mut sent, state, &mut saved) => attempt,
            };
            let Err(nack) = attempt else {
                return Ok(());
            };
            nacks += 1;
            self.metrics.nacks.add(1);
            self.metrics.error(nack.stage, 1);
            self.status.record_error(nack.message.clone());
            if let Some(limit) = self.policy.max_consecutive_nacks
                && nacks >= limit
            {
                return Err(Ended::Stopped(
                    StopReason::NackLimit,
                    format!(
                        "batch NACKed {nacks} times in a row (max_consecutive_nacks = {limit}); last: {}",
                        nack.message
                    ),
                ));
            }
            let delay = self.backoff.delay(nacks);
            warn!(connector_key = %self.key, nacks, retry_in_ms = delay.as_millis() as u64, error = %nack.message, "batch NACKed, retrying the same batch");
            self.metrics.retries.add(1);
            tokio::select! {
                biased;
                () = &mut give_up => return Err(self.abandon()),
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    async fn attempt(
        &self,
        groups: &[Vec<OutgoingMessage>],
        sent: &mut [bool],
        state: Option<&StoredState>,
        saved: &mut bool,
    ) -> Result<(), Nack> {
        for (index, messages) in groups.iter().enumerate() {
            if sent[index] || messages.is_empty() {
                continue;
            }
            let (producer, stage) = match self.routes.get(index) {
                Some(route) => (route.producer.as_ref(), ErrorStage::Send),
                None => match &self.dead_letter {
                    Some(producer) => (producer.as_ref(), ErrorStage::DeadLetter),
                    None => continue,
                },
            };
            let started = Instant::now();
            producer.send(messages).await.map_err(|error| Nack {
                stage,
                message: match self.routes.get(index) {
                    Some(route) => format!("send to {} failed: {error}", route.target),
                    None => format!("send to the dead-letter topic failed: {error}"),
                },
            })?;
            self.metrics
                .record_duration(Stage::IggySend, started.elapsed());
            sent[index] = true;
            if stage == ErrorStage::Send {
                self.metrics.sent.add(messages.len() as u64);
            } else {
                self.metrics.dead_lettered.add(messages.len() as u64);
            }
        }
        if let (Some(state), false) = (state, *saved) {
            let started = Instant::now();
            self.state_store
                .save(&self.key, state)
                .await
                .map_err(|error| Nack {
                    stage: ErrorStage::StateSave,
                    message: format!("state save failed: {error}"),
                })?;
            self.metrics
                .record_duration(Stage::StateSave, started.elapsed());
            *saved = true;
        }
        Ok(())
    }

    /// Tells the source the batch is durable, retrying transient failures.
    async fn commit(&self) -> Result<(), Ended> {
        let mut failures = 0;
        let give_up = self.shutdown.grace_expired();
        tokio::pin!(give_up);
        loop {
            let committed = tokio::select! {
                biased;
                () = &mut give_up => return Err(self.abandon()),
                committed = catch_panic(self.source.commit()) => committed,
            };
            let error = match committed {
                Ok(Ok(())) => return Ok(()),
                Err(panic) => return Err(Ended::Stopped(StopReason::Panic, panic)),
                Ok(Err(error)) if !error.is_transient() => {
                    return Err(Ended::Stopped(
                        StopReason::Fatal,
                        format!("commit failed: {error}"),
                    ));
                }
                Ok(Err(error)) => error,
            };
            failures += 1;
            self.metrics.error(ErrorStage::Commit, 1);
            let message = format!("commit failed: {error}");
            warn!(connector_key = %self.key, attempt = failures, %message, "retrying commit");
            self.status.record_error(message);
            tokio::select! {
                biased;
                () = &mut give_up => return Err(self.abandon()),
                () = tokio::time::sleep(self.backoff.delay(failures)) => {}
            }
        }
    }

    fn abandon(&self) -> Ended {
        warn!(connector_key = %self.key, "stop requested and the grace period ran out; the batch in flight stays uncommitted and will be read again");
        Ended::Shutdown
    }

    /// Sleeps, unless a stop is requested first. Returns whether to go on.
    async fn pause(&self, delay: Duration) -> bool {
        tokio::select! {
            biased;
            () = self.shutdown.requested() => false,
            () = tokio::time::sleep(delay) => true,
        }
    }
}
