//! The source loop with several batches in flight (docs/ARCHITECTURE.md,
//! delivery rules S1 to S3).
//!
//! Three things run at once, each on at most one batch: the next `poll` (with
//! its transform and encode), the send of the oldest batch not yet sent, and
//! the commit of the batches Iggy has acknowledged. Sends go one batch at a
//! time in poll order, so the topic keeps the source's order. The commit of
//! several acknowledged batches is one group: one state save of the newest
//! state among them, then their `commit`s in poll order; nothing is committed
//! before the save that covers it.
//!
//! A failed send or state save is a NACK: nothing after the last committed
//! batch is committed, every batch polled since is discarded (what of them was
//! already sent stays in Iggy: duplicates, never loss), the source rewinds to
//! its last committed batch, and after the backoff polling starts again from
//! there.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::warn;

use super::{Ended, Nack, SourcePipeline, Timings, link_requests};
use crate::connectors::SourceBatch;
use crate::engine::catch_panic;
use crate::engine::metrics::{ErrorStage, Stage};
use crate::engine::status::StopReason;
use crate::message::OutgoingMessage;
use crate::state::StoredState;
use crate::telemetry::{BatchSpan, Outcome};

/// One polled batch on its way to being committed.
struct InFlight {
    groups: Arc<Vec<Vec<OutgoingMessage>>>,
    state: Option<StoredState>,
    count: usize,
    finished: bool,
    phase: Phase,
    started: Instant,
    prepared: Duration,
    timings: Timings,
    /// Records that failed to transform or encode.
    rejected: usize,
    trace: BatchSpan,
}

/// When a group's state save and commits ran, for the batch spans.
struct GroupCommit {
    state_save: Option<(Instant, Duration)>,
    commits: (Instant, Instant),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Polled,
    Sending,
    /// Iggy acknowledged every message (a batch without any starts here).
    Acked,
}

/// Why a group commit did not complete.
enum CommitFailure {
    /// The state save failed: a NACK of the group.
    Nack(Nack),
    /// The pipeline ends (a fatal commit error, a panic, the grace period).
    End(Ended),
}

impl SourcePipeline {
    pub(super) async fn run_pipelined(&self) -> Ended {
        let mut pending: VecDeque<InFlight> = VecDeque::with_capacity(self.max_in_flight);
        let mut polling: Option<BoxFuture<'_, Result<InFlight, Ended>>> = None;
        let mut sending: Option<BoxFuture<'_, (Result<(), Nack>, Timings)>> = None;
        let mut committing: Option<BoxFuture<'_, Result<GroupCommit, CommitFailure>>> = None;
        // How many batches at the front of `pending` the running commit covers.
        let mut committing_count = 0;
        let mut nacks = 0;
        // A batch that said it is the last one was polled.
        let mut last_polled = false;
        let give_up = self.shutdown.grace_expired();
        tokio::pin!(give_up);
        loop {
            let stopping = self.shutdown.is_requested();
            if stopping {
                polling = None;
            }
            if polling.is_none() && !stopping && !last_polled && pending.len() < self.max_in_flight
            {
                polling = Some(Box::pin(self.poll_in_flight()));
            }
            if sending.is_none()
                && let Some(batch) = pending
                    .iter_mut()
                    .find(|batch| batch.phase == Phase::Polled)
            {
                batch.phase = Phase::Sending;
                let traced = batch.trace.is_recording();
                sending = Some(Box::pin(self.send_batch(batch.groups.clone(), traced)));
            }
            if committing.is_none() {
                let acked = pending
                    .iter()
                    .take_while(|batch| batch.phase == Phase::Acked)
                    .count();
                if acked > 0 {
                    // Group commit: the newest state covers every batch before it.
                    let state = pending
                        .iter()
                        .take(acked)
                        .rev()
                        .find_map(|batch| batch.state.clone());
                    committing_count = acked;
                    committing = Some(Box::pin(self.commit_group(state, acked)));
                }
            }
            if pending.is_empty() && polling.is_none() {
                return Ended::Shutdown;
            }
            tokio::select! {
                biased;
                () = &mut give_up => return self.abandon(),
                () = self.shutdown.requested(), if polling.is_some() => polling = None,
                committed = next(&mut committing) => {
                    committing = None;
                    match committed {
                        Ok(group) => {
                            nacks = 0;
                            if self.finish_group(&mut pending, committing_count, &group) {
                                return Ended::Stopped(
                                    StopReason::Completed,
                                    "the source has nothing more to produce".into(),
                                );
                            }
                        }
                        Err(CommitFailure::End(ended)) => return ended,
                        Err(CommitFailure::Nack(nack)) => {
                            polling = None;
                            if let Some(send) = sending.take() {
                                // Its batch is discarded with the rest; let the
                                // send finish so the connection stays usable.
                                let _ = send.await;
                            }
                            if let Err(ended) = self.recover(nack, &mut nacks, &mut pending).await {
                                return ended;
                            }
                            last_polled = false;
                        }
                    }
                }
                (sent, timings) = next(&mut sending) => {
                    sending = None;
                    let batch = pending.iter_mut().find(|batch| batch.phase == Phase::Sending);
                    if let Some(batch) = batch {
                        for mark in &timings.stages {
                            batch.trace.stage(mark.name, mark.from, mark.to, mark.error.as_deref());
                        }
                        if sent.is_ok() {
                            batch.phase = Phase::Acked;
                            batch.timings = timings;
                        }
                    }
                    match sent {
                        Ok(()) => {}
                        Err(nack) => {
                            polling = None;
                            if let Some(commit) = committing.take() {
                                // The batches it covers were acknowledged before
                                // the failed one: they may still be committed.
                                match commit.await {
                                    Ok(group) => {
                                        nacks = 0;
                                        self.finish_group(&mut pending, committing_count, &group);
                                    }
                                    Err(CommitFailure::End(ended)) => return ended,
                                    Err(CommitFailure::Nack(_)) => {}
                                }
                            }
                            // Batches acknowledged before the failed one need
                            // not be sent again: commit them first.
                            let acked = pending
                                .iter()
                                .take_while(|batch| batch.phase == Phase::Acked)
                                .count();
                            if acked > 0 {
                                let state = pending
                                    .iter()
                                    .take(acked)
                                    .rev()
                                    .find_map(|batch| batch.state.clone());
                                match self.commit_group(state, acked).await {
                                    Ok(group) => {
                                        nacks = 0;
                                        self.finish_group(&mut pending, acked, &group);
                                    }
                                    Err(CommitFailure::End(ended)) => return ended,
                                    Err(CommitFailure::Nack(_)) => {}
                                }
                            }
                            if let Err(ended) = self.recover(nack, &mut nacks, &mut pending).await {
                                return ended;
                            }
                            last_polled = false;
                        }
                    }
                }
                polled = next(&mut polling) => {
                    polling = None;
                    match polled {
                        Ok(batch) => {
                            last_polled = batch.finished;
                            pending.push_back(batch);
                        }
                        // A stop request: deliver what is in flight, then stop.
                        Err(Ended::Shutdown) => {}
                        Err(ended) => return ended,
                    }
                }
            }
        }
    }

    /// Polls and prepares the next batch.
    async fn poll_in_flight(&self) -> Result<InFlight, Ended> {
        let polling = Instant::now();
        let SourceBatch {
            records,
            state,
            finished,
        } = self.poll_next().await?;
        let started = Instant::now();
        let count = records.len();
        let mut trace = BatchSpan::default();
        if count == 0 && state.is_none() {
            // Nothing to deliver; let the source finish whatever it staged.
            tokio::task::yield_now().await;
        } else {
            trace = BatchSpan::start("source", &self.key, polling);
            if trace.is_recording() {
                trace.stage("poll", polling, started, None);
                link_requests(&mut trace, &records);
            }
        }
        self.metrics.produced.add(count as u64);
        let (groups, rejected) = self.prepare(records);
        let prepared = started.elapsed();
        self.metrics.record_duration(Stage::Prepare, prepared);
        trace.stage("transform", started, started + prepared, None);
        let phase = if groups.iter().all(Vec::is_empty) {
            Phase::Acked
        } else {
            Phase::Polled
        };
        Ok(InFlight {
            groups: Arc::new(groups),
            state: state.map(|data| StoredState {
                connector: self.connector.clone(),
                data,
            }),
            count,
            finished,
            phase,
            started,
            prepared,
            timings: Timings::default(),
            rejected,
            trace,
        })
    }

    async fn send_batch(
        &self,
        groups: Arc<Vec<Vec<OutgoingMessage>>>,
        traced: bool,
    ) -> (Result<(), Nack>, Timings) {
        let mut timings = Timings {
            traced,
            ..Timings::default()
        };
        let mut sent = vec![false; groups.len()];
        let result = self.send_all(&groups, &mut sent, &mut timings).await;
        (result, timings)
    }

    /// Saves `state` (the newest of the group) once, then commits the group's
    /// `count` batches in poll order. Returns when the save and the commits ran.
    async fn commit_group(
        &self,
        state: Option<StoredState>,
        count: usize,
    ) -> Result<GroupCommit, CommitFailure> {
        let mut state_save = None;
        if let Some(state) = &state {
            let started = Instant::now();
            self.state_store
                .save(&self.key, state)
                .await
                .map_err(|error| {
                    CommitFailure::Nack(Nack {
                        stage: ErrorStage::StateSave,
                        message: format!("state save failed: {error}"),
                    })
                })?;
            let elapsed = started.elapsed();
            self.metrics.record_duration(Stage::StateSave, elapsed);
            state_save = Some((started, elapsed));
        }
        let commits_started = Instant::now();
        for _ in 0..count {
            let started = Instant::now();
            self.commit().await.map_err(CommitFailure::End)?;
            self.metrics
                .record_duration(Stage::Commit, started.elapsed());
        }
        Ok(GroupCommit {
            state_save,
            commits: (commits_started, Instant::now()),
        })
    }

    /// Takes the `count` committed batches off the front. Returns whether one
    /// of them was the source's last. Each batch span gets the group's state
    /// save (it covers every batch of the group) and commits.
    fn finish_group(
        &self,
        pending: &mut VecDeque<InFlight>,
        count: usize,
        group: &GroupCommit,
    ) -> bool {
        let mut finished = false;
        for index in 0..count {
            let Some(mut batch) = pending.pop_front() else {
                break;
            };
            if index + 1 == count {
                batch.timings.state_save = group.state_save.map(|(_, elapsed)| elapsed);
            }
            if let Some((from, elapsed)) = group.state_save {
                batch.trace.stage("state_save", from, from + elapsed, None);
            }
            batch
                .trace
                .stage("commit", group.commits.0, group.commits.1, None);
            let outcome = match batch.rejected {
                0 => Outcome::Ok,
                _ => Outcome::Rejected,
            };
            std::mem::take(&mut batch.trace).end(batch.count, 0, outcome);
            self.committed(
                &batch.groups,
                batch.count,
                batch.started,
                batch.prepared,
                &batch.timings,
            );
            finished |= batch.finished;
        }
        finished
    }

    /// After a NACK: counts it against the limit, discards every batch not
    /// committed, rewinds the source and waits out the backoff.
    async fn recover(
        &self,
        nack: Nack,
        nacks: &mut u32,
        pending: &mut VecDeque<InFlight>,
    ) -> Result<(), Ended> {
        *nacks += 1;
        self.metrics.nacks.add(1);
        self.metrics.error(nack.stage, 1);
        self.status.record_error(nack.message.clone());
        if let Some(limit) = self.policy.max_consecutive_nacks
            && *nacks >= limit
        {
            return Err(Ended::Stopped(
                StopReason::NackLimit,
                format!(
                    "batch NACKed {nacks} times in a row (max_consecutive_nacks = {limit}); last: {}",
                    nack.message
                ),
            ));
        }
        let discarded = pending.len();
        pending.clear();
        match catch_panic(self.source.rewind()).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                return Err(Ended::Stopped(
                    StopReason::Fatal,
                    format!("rewind failed: {error}"),
                ));
            }
            Err(panic) => return Err(Ended::Stopped(StopReason::Panic, panic)),
        }
        let delay = self.backoff.delay(*nacks);
        warn!(connector_key = %self.key, nacks = *nacks, discarded, retry_in_ms = delay.as_millis() as u64, error = %nack.message, "batch NACKed; the source rewinds to its last committed batch");
        self.metrics.retries.add(1);
        if self.shutdown.pause(delay).await {
            Ok(())
        } else {
            Err(Ended::Shutdown)
        }
    }
}

/// Awaits the future if there is one; otherwise never completes.
async fn next<T>(future: &mut Option<BoxFuture<'_, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}
