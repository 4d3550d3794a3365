//! The source loop (docs/ARCHITECTURE.md, rules S1 to S3, S7 and S8), the
//! same for one batch in flight as for many.
//!
//! A batch that says the source is caught up (`next_poll`) holds the next
//! poll until then; the batch itself goes on being delivered meanwhile, and
//! a stop request ends the wait at once (the waiting poll is dropped).
//!
//! Three stages run at once, each on at most one batch: the next `poll`
//! (with its transform and encode) while fewer than `max_in_flight` batches
//! are uncommitted and they hold less than `max_in_flight_bytes` of payload
//! (one batch may always be in flight, however large), the send of the oldest batch not yet sent, and the
//! commit of the batches Iggy has acknowledged. Sends go one batch at a time
//! in poll order, so the topic keeps the source's order. The commit of
//! several acknowledged batches is one group: one state save of the newest
//! state among them, then their `commit`s in poll order; nothing is
//! committed before the save that covers it. Acknowledged batches may wait
//! a little to join a group ([`COMMIT_LINGER`]).
//!
//! A failed send or state save is a NACK, retried in place: after the
//! backoff the same batch is sent again (only the streams Iggy has not
//! acknowledged yet) or the same group saved again. Batches polled after it
//! wait, and nothing after it is committed before it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use tracing::warn;

use super::{Ended, Nack, SourcePipeline, Timings, link_requests};
use crate::connectors::SourceBatch;
use crate::engine::metrics::{ErrorStage, Stage};
use crate::engine::status::StopReason;
use crate::iggy::Prepared;
use crate::state::StoredState;
use crate::telemetry::{BatchSpan, Outcome};

/// One polled batch on its way to being committed.
struct InFlight {
    /// Emptied once Iggy acknowledged every group: nothing sends them again,
    /// and a batch waits for its state save without its payloads.
    groups: Arc<Vec<Prepared>>,
    /// Messages sent to the connector's streams (not its dead-letter topic).
    routed: usize,
    /// Per group: acknowledged by Iggy (a retried send skips those).
    sent: Vec<bool>,
    state: Option<StoredState>,
    count: usize,
    /// Payload bytes of `groups`.
    bytes: usize,
    finished: bool,
    /// The earliest time to poll after this batch (the source is caught up).
    next_poll: Option<tokio::time::Instant>,
    phase: Phase,
    started: Instant,
    prepared: Duration,
    timings: Timings,
    /// Records that failed to transform or encode.
    rejected: usize,
    trace: BatchSpan,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Polled,
    Sending,
    /// Iggy acknowledged every message (a batch without any starts here).
    Acked,
}

/// What one send attempt of a batch came to.
struct Sent {
    result: Result<(), Nack>,
    sent: Vec<bool>,
    timings: Timings,
}

/// When a group's state save and commits ran, for the batch spans.
struct GroupCommit {
    state_save: Option<(Instant, Duration)>,
    commits: (Instant, Instant),
}

/// Why a group commit did not complete.
enum CommitFailure {
    /// The state save failed: a NACK of the group.
    Nack(Nack),
    /// The pipeline ends (a fatal commit error, a panic, the grace period).
    End(Ended),
}

/// What the loop holds: the uncommitted batches, the stage running on each
/// side, and the NACK count and its backoff.
struct Window<'a> {
    pending: VecDeque<InFlight>,
    /// Payload bytes of `pending`.
    bytes: usize,
    polling: Option<BoxFuture<'a, Result<InFlight, Ended>>>,
    sending: Option<BoxFuture<'a, Sent>>,
    committing: Option<BoxFuture<'a, Result<GroupCommit, CommitFailure>>>,
    /// How many batches at the front of `pending` the running commit covers.
    committing_count: usize,
    nacks: u32,
    /// After a NACK: no send or commit before this.
    retry_at: Option<tokio::time::Instant>,
    /// A batch that said it is the last one was polled.
    last_polled: bool,
    /// The last batch polled said the source is caught up: the next poll
    /// waits until then (rule S8).
    next_poll: Option<tokio::time::Instant>,
    /// When the last group commit started.
    last_commit: tokio::time::Instant,
    /// Acknowledged batches wait for a commit until then (see
    /// [`COMMIT_LINGER`]).
    commit_at: Option<tokio::time::Instant>,
}

/// How long acknowledged batches may wait to join a group commit, when
/// commits follow each other closely: a burst of fast batches then takes
/// one state save (one fsync) per few batches rather than one per batch,
/// as PostgreSQL's `commit_delay` groups WAL flushes. Half a window of
/// acknowledged batches, a window whose sends wait for room to poll, a
/// stop and the source's last batch commit at once; so does a batch after
/// a quiet spell. On a disk where a save took 0.4 ms, the random source
/// made a seventh of the saves with it, for a sixth less CPU and the same
/// rate (BENCHMARKS.md, "Group commits that wait").
const COMMIT_LINGER: Duration = Duration::from_millis(5);

/// What finished in one turn of the loop.
enum Event {
    Polled(Result<InFlight, Ended>),
    Sent(Sent),
    Committed(Result<GroupCommit, CommitFailure>),
    /// A stop request, or the end of a NACK's backoff.
    Woken,
}

impl SourcePipeline {
    /// Runs batches until a stop is requested or the source stops on its own.
    pub(super) async fn run_batches(&self) -> Ended {
        let mut window = Window {
            pending: VecDeque::with_capacity(self.max_in_flight),
            bytes: 0,
            polling: None,
            sending: None,
            committing: None,
            committing_count: 0,
            nacks: 0,
            retry_at: None,
            last_polled: false,
            next_poll: None,
            last_commit: tokio::time::Instant::now() - COMMIT_LINGER,
            commit_at: None,
        };
        let give_up = self.shutdown.grace_expired();
        tokio::pin!(give_up);
        loop {
            let stopping = self.start_stages(&mut window);
            if window.pending.is_empty() && window.polling.is_none() {
                return Ended::Shutdown;
            }
            let retry_at = window.retry_at;
            let commit_at = window.commit_at;
            let event = tokio::select! {
                biased;
                () = &mut give_up => return self.abandon(),
                () = self.shutdown.requested(), if !stopping => Event::Woken,
                () = sleep_until(retry_at) => {
                    window.retry_at = None;
                    Event::Woken
                }
                () = sleep_until(commit_at) => {
                    window.commit_at = None;
                    Event::Woken
                }
                committed = next(&mut window.committing) => Event::Committed(committed),
                sent = next(&mut window.sending) => Event::Sent(sent),
                polled = next(&mut window.polling) => Event::Polled(polled),
            };
            if let Err(ended) = self.on_event(&mut window, event) {
                return ended;
            }
        }
    }

    /// Starts each stage that is free and has work: a poll while the window
    /// has room (none once a stop is requested; it first waits out the time
    /// the last batch asked for), the send of the oldest
    /// batch not sent, the commit of the acknowledged batches at the front.
    /// Sends and commits wait out a NACK's backoff. Returns whether a stop
    /// is requested.
    fn start_stages<'a>(&'a self, window: &mut Window<'a>) -> bool {
        let stopping = self.shutdown.is_requested();
        if stopping {
            window.polling = None;
        } else if window.polling.is_none() && !window.last_polled && self.has_room(window) {
            let not_before = window.next_poll.take();
            window.polling = Some(Box::pin(self.poll_in_flight(not_before)));
        }
        if window.retry_at.is_some() {
            return stopping;
        }
        if window.sending.is_none()
            && let Some(batch) = window
                .pending
                .iter_mut()
                .find(|batch| batch.phase == Phase::Polled)
        {
            batch.phase = Phase::Sending;
            let sent = std::mem::take(&mut batch.sent);
            let traced = batch.trace.is_recording();
            window.sending = Some(Box::pin(self.send_batch(
                batch.groups.clone(),
                sent,
                traced,
            )));
        }
        if window.committing.is_none() {
            let acked = window
                .pending
                .iter()
                .take_while(|batch| batch.phase == Phase::Acked)
                .count();
            let now = tokio::time::Instant::now();
            window.commit_at = self.commit_waits(window, acked, stopping, now);
            if acked > 0 && window.commit_at.is_none() {
                window.last_commit = now;
                // Group commit: the newest state covers every batch before it.
                let state = window
                    .pending
                    .iter()
                    .take(acked)
                    .rev()
                    .find_map(|batch| batch.state.clone());
                window.committing_count = acked;
                window.committing = Some(Box::pin(self.commit_group(state, acked)));
            }
        }
        stopping
    }

    /// Until when `acked` acknowledged batches wait to join a later group
    /// commit ([`COMMIT_LINGER`]); `None`: none wait, or they commit now.
    fn commit_waits(
        &self,
        window: &Window<'_>,
        acked: usize,
        stopping: bool,
        now: tokio::time::Instant,
    ) -> Option<tokio::time::Instant> {
        let until = window.last_commit + COMMIT_LINGER;
        let commit_now = acked == 0
            || stopping
            || window.last_polled
            || now >= until
            || 2 * acked >= self.max_in_flight
            // With no room to poll and nothing polled left to send, the
            // sends wait for this commit.
            || (!self.has_room(window)
                && !window
                    .pending
                    .iter()
                    .any(|batch| batch.phase == Phase::Polled));
        (!commit_now).then_some(until)
    }

    /// Whether the window may take another batch: fewer than `max_in_flight`
    /// uncommitted, holding less than `max_in_flight_bytes` (one batch
    /// always may be in flight).
    fn has_room(&self, window: &Window<'_>) -> bool {
        window.pending.len() < self.max_in_flight
            && (window.pending.is_empty() || window.bytes < self.max_in_flight_bytes)
    }

    /// Takes in what one stage finished. `Err` ends the loop.
    fn on_event(&self, window: &mut Window<'_>, event: Event) -> Result<(), Ended> {
        match event {
            Event::Woken => Ok(()),
            Event::Polled(polled) => {
                window.polling = None;
                match polled {
                    Ok(batch) => {
                        window.last_polled = batch.finished;
                        window.next_poll = batch.next_poll;
                        window.bytes += batch.bytes;
                        self.metrics.in_flight_bytes.set(window.bytes as f64);
                        window.pending.push_back(batch);
                        Ok(())
                    }
                    // A stop request: deliver what is in flight, then stop.
                    Err(Ended::Shutdown) => Ok(()),
                    Err(ended) => Err(ended),
                }
            }
            Event::Sent(sent) => {
                window.sending = None;
                self.on_sent(window, sent)
            }
            Event::Committed(committed) => {
                window.committing = None;
                match committed {
                    Ok(group) => {
                        window.nacks = 0;
                        let count = window.committing_count;
                        let finished = self.finish_group(window, count, &group);
                        self.metrics.in_flight_bytes.set(window.bytes as f64);
                        if finished {
                            return Err(Ended::Stopped(
                                StopReason::Completed,
                                "the source has nothing more to produce".into(),
                            ));
                        }
                        Ok(())
                    }
                    Err(CommitFailure::End(ended)) => Err(ended),
                    Err(CommitFailure::Nack(nack)) => self.nack(window, nack),
                }
            }
        }
    }

    /// A send attempt ended: the batch is acknowledged, or it waits to be
    /// sent again (what Iggy did acknowledge is not sent twice).
    fn on_sent(&self, window: &mut Window<'_>, sent: Sent) -> Result<(), Ended> {
        let Sent {
            result,
            sent,
            timings,
        } = sent;
        if let Some(batch) = window
            .pending
            .iter_mut()
            .find(|batch| batch.phase == Phase::Sending)
        {
            for mark in &timings.stages {
                batch
                    .trace
                    .stage(mark.name, mark.from, mark.to, mark.error.as_deref());
            }
            batch.timings.iggy_send += timings.iggy_send;
            batch.sent = sent;
            batch.phase = match result {
                Ok(()) => {
                    batch.groups = Arc::default();
                    Phase::Acked
                }
                Err(_) => {
                    batch.timings.nacks += 1;
                    Phase::Polled
                }
            };
        }
        match result {
            Ok(()) => Ok(()),
            Err(nack) => self.nack(window, nack),
        }
    }

    /// Counts a NACK against the limit and holds sends and commits for the
    /// backoff; the same batch or group is tried again after it.
    fn nack(&self, window: &mut Window<'_>, nack: Nack) -> Result<(), Ended> {
        window.nacks += 1;
        let nacks = window.nacks;
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
        window.retry_at = Some(tokio::time::Instant::now() + delay);
        Ok(())
    }

    /// Polls and prepares the next batch, not before `not_before` (the
    /// source said it is caught up until then). A stop request drops this
    /// future, so it never waits the time out.
    async fn poll_in_flight(
        &self,
        not_before: Option<tokio::time::Instant>,
    ) -> Result<InFlight, Ended> {
        if let Some(at) = not_before {
            tokio::time::sleep_until(at).await;
        }
        let polling = Instant::now();
        let SourceBatch {
            records,
            state,
            finished,
            next_poll,
        } = self.poll_next().await?;
        // The send of the batch before this one runs in this task: let it
        // take in Iggy's answer (and the next send start) before the
        // prepare, which holds the thread. With nothing to deliver, this
        // also lets the source finish whatever it staged. A stop request
        // that drops the poll here leaves the batch uncommitted: read again.
        tokio::task::yield_now().await;
        let set_aside = self.source.take_rejected();
        let started = Instant::now();
        let count = records.len();
        let mut trace = BatchSpan::default();
        if count > 0 || state.is_some() {
            trace = BatchSpan::start("source", &self.key, polling);
            if trace.is_recording() {
                trace.stage("poll", polling, started, None);
                link_requests(&mut trace, &records);
            }
        }
        self.metrics.produced.add(count as u64);
        let (mut groups, mut rejected) = self.prepare(records);
        rejected += self.set_aside(&mut groups, set_aside);
        let bytes = groups
            .iter()
            .flatten()
            .map(|message| message.payload.len())
            .sum();
        let routed = groups
            .get(..self.routes.len())
            .map_or(0, |routes| routes.iter().map(Vec::len).sum());
        let phase = if groups.iter().all(Vec::is_empty) {
            Phase::Acked
        } else {
            Phase::Polled
        };
        let transformed = started.elapsed();
        // Again, before the encoding holds the thread: the send before this
        // batch may have its answer by now.
        tokio::task::yield_now().await;
        let encoding = Instant::now();
        let groups = self.prepare_sends(groups);
        let encoded = Instant::now();
        let prepared = transformed + (encoded - encoding);
        self.metrics.record_duration(Stage::Prepare, prepared);
        trace.stage("transform", started, encoded, None);
        Ok(InFlight {
            sent: vec![false; groups.len()],
            groups: Arc::new(groups),
            routed,
            state: state.map(|data| StoredState {
                connector: self.connector.clone(),
                data,
            }),
            count,
            bytes,
            finished,
            next_poll,
            phase,
            started,
            prepared,
            timings: Timings {
                traced: trace.is_recording(),
                ..Timings::default()
            },
            rejected,
            trace,
        })
    }

    /// Sends the groups of a batch Iggy has not acknowledged yet.
    async fn send_batch(
        &self,
        groups: Arc<Vec<Prepared>>,
        mut sent: Vec<bool>,
        traced: bool,
    ) -> Sent {
        let mut timings = Timings {
            traced,
            ..Timings::default()
        };
        let result = self.send_all(&groups, &mut sent, &mut timings).await;
        Sent {
            result,
            sent,
            timings,
        }
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
                .map_err(|error| match error.is_permanent() {
                    // Trying again cannot help (another writer took the
                    // state over): stop before sending anything more.
                    true => CommitFailure::End(Ended::Stopped(
                        StopReason::Fatal,
                        format!("state save refused: {error}"),
                    )),
                    false => CommitFailure::Nack(Nack {
                        stage: ErrorStage::StateSave,
                        message: format!("state save failed: {error}"),
                    }),
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
    fn finish_group(&self, window: &mut Window<'_>, count: usize, group: &GroupCommit) -> bool {
        let mut finished = false;
        for index in 0..count {
            let Some(mut batch) = window.pending.pop_front() else {
                break;
            };
            window.bytes -= batch.bytes;
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
            std::mem::take(&mut batch.trace).end(batch.count, batch.timings.nacks, outcome);
            // An empty poll (a caught-up source, rule S8) is no batch to log
            // or time: it would log a line per poll interval and pull the
            // batch latencies towards zero.
            if batch.count > 0 || batch.rejected > 0 {
                self.committed(
                    batch.routed,
                    batch.count,
                    batch.started,
                    batch.prepared,
                    &batch.timings,
                );
            }
            finished |= batch.finished;
        }
        finished
    }
}

/// Awaits the future if there is one; otherwise never completes.
async fn next<T>(future: &mut Option<BoxFuture<'_, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; never completes without one.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
