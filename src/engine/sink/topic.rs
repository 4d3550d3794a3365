//! One topic's loop (rule K5).

use std::collections::VecDeque;
use std::time::Instant;

use futures::future::BoxFuture;
use futures::stream::{FuturesOrdered, StreamExt};
use tracing::warn;

use crate::codec::Schema;
use crate::engine::deferral::Deferral;
use crate::engine::metrics::ErrorStage;
use crate::engine::retry::{Attempt, Until, retry_with};
use crate::engine::source::Ended;
use crate::iggy::{BusError, ConsumedBatch, Consumer};
use crate::message::TopicRef;

use super::{CONCURRENT_WRITES, Delivered, TopicLoop, TopicReader};

/// A prefetch: the poll that runs while batches are written, holding the
/// consumer until it returns it.
type PrefetchFuture<'a> = BoxFuture<
    'a,
    (
        &'a mut Box<dyn Consumer>,
        Result<Option<ConsumedBatch>, BusError>,
    ),
>;

/// Awaits the future if there is one; otherwise never completes.
async fn next<T>(future: &mut Option<BoxFuture<'_, T>>) -> T {
    match future {
        Some(future) => future.await,
        None => std::future::pending().await,
    }
}

/// The state of one topic's loop: what is written and in flight, the
/// consumer (idle here, or lent to the running prefetch) and the batch it
/// prefetched.
struct Lane<'r> {
    topic: &'r TopicRef,
    schema: &'r Schema,
    /// Rule K6: a sink that defers acknowledgement gets one batch at a time
    /// and its offsets move only as far as it reports durable.
    deferral: Option<Deferral<Delivered>>,
    /// A stop's flush of what a deferred sink still holds has started.
    flushed_for_stop: bool,
    /// Writes (or flushes) in flight at most.
    writes: usize,
    in_flight: FuturesOrdered<BoxFuture<'r, Result<Option<Delivered>, Ended>>>,
    /// Written, waiting for the consumer to be free to commit them.
    written: VecDeque<Delivered>,
    prefetched: Option<ConsumedBatch>,
    idle: Option<&'r mut Box<dyn Consumer>>,
    polling: Option<PrefetchFuture<'r>>,
    /// The last prefetch found nothing: none again until a write ends.
    found_nothing: bool,
}

impl<'r> TopicLoop<'r> {
    /// Rule K5 (docs/ARCHITECTURE.md): while batches are being written the
    /// next one is polled (one poll at a time, never cancelled), so it is
    /// ready when the write ends; a sink that writes concurrently also gets
    /// the next write started. Writes finish in poll order and each commit
    /// follows its own write, so no commit passes a write that has not
    /// succeeded; the consumer commits only between polls.
    pub(super) async fn run(&'r self, reader: &'r mut TopicReader) -> Ended {
        let mut lane = self.lane(reader);
        let ended = loop {
            self.commit_written(&mut lane).await;
            let stopping = self.shutdown.is_requested();
            self.start_writes(&mut lane, stopping);
            if lane.in_flight.is_empty() && lane.polling.is_none() && lane.written.is_empty() {
                match self.when_idle(&mut lane, stopping).await {
                    Some(ended) => break ended,
                    None => continue,
                }
            }
            self.start_prefetch(&mut lane, stopping);
            if let Err(ended) = self.wait(&mut lane, stopping).await {
                break ended;
            }
        };
        self.finish(lane).await;
        ended
    }

    fn lane(&self, reader: &'r mut TopicReader) -> Lane<'r> {
        let sink = &self.pipeline.sink;
        let deferral = sink
            .deferred()
            .map(|deferred| Deferral::new(deferred.flush_interval));
        let writes = if deferral.is_none() && sink.writes_concurrently() {
            CONCURRENT_WRITES
        } else {
            1
        };
        Lane {
            topic: &reader.topic,
            schema: &reader.schema,
            deferral,
            flushed_for_stop: false,
            writes,
            in_flight: FuturesOrdered::new(),
            written: VecDeque::new(),
            prefetched: None,
            idle: Some(&mut reader.consumer),
            polling: None,
            found_nothing: false,
        }
    }

    /// Commits what is written, if the consumer is free (a deferred sink:
    /// as far as it reports durable).
    async fn commit_written(&self, lane: &mut Lane<'r>) {
        let Some(consumer) = lane.idle.as_deref_mut() else {
            return;
        };
        match lane.deferral.as_mut() {
            None => {
                while let Some(delivered) = lane.written.pop_front() {
                    self.commit(lane.topic, consumer.as_mut(), delivered).await;
                }
            }
            Some(deferral) => {
                self.commit_durable(lane.topic, consumer.as_mut(), deferral, &mut lane.written)
                    .await;
            }
        }
    }

    /// Starts a deferred sink's flush once its oldest batch is
    /// `flush_interval` old, and the writes the prefetched batch allows.
    fn start_writes(&'r self, lane: &mut Lane<'r>, stopping: bool) {
        if let Some(deferral) = lane.deferral.as_mut()
            && !stopping
            && lane.in_flight.is_empty()
            && deferral
                .flush_deadline()
                .is_some_and(|due| due <= Instant::now())
        {
            deferral.flush_started();
            lane.in_flight
                .push_back(Box::pin(self.flush_all(lane.topic)));
        }
        while !stopping && lane.in_flight.len() < lane.writes {
            let Some(mut batch) = lane.prefetched.take() else {
                break;
            };
            if let Some(deferral) = lane.deferral.as_mut() {
                // Read again (a failed commit, a new session): what the
                // sink already holds is not handed to it twice.
                if let Some(accepted) = deferral.accepted(batch.partition_id) {
                    batch.messages.retain(|message| message.offset > accepted);
                }
                if let Some(last_offset) = batch.last_offset() {
                    deferral.handing(batch.partition_id, last_offset);
                }
            }
            if let Some(prepared) = self.prepare_batch(lane.topic, lane.schema, batch) {
                lane.in_flight
                    .push_back(Box::pin(self.deliver_batch(lane.topic, prepared)));
            }
        }
    }

    /// Nothing in flight: at a stop, a deferred sink's last flush or the
    /// end; otherwise wait for the next batch (a stop request ends the
    /// wait), or until a deferred sink's flush is due. `Some` ends the loop.
    async fn when_idle(&'r self, lane: &mut Lane<'r>, stopping: bool) -> Option<Ended> {
        if stopping {
            if let Some(deferral) = &lane.deferral
                && deferral.has_pending()
                && !lane.flushed_for_stop
            {
                // What the sink holds gets the grace period to become
                // durable; what does not is read again after a restart.
                lane.flushed_for_stop = true;
                lane.in_flight
                    .push_back(Box::pin(self.flush_all(lane.topic)));
                return None;
            }
            return Some(Ended::Shutdown);
        }
        let consumer = match (&lane.prefetched, lane.idle.as_deref_mut()) {
            (None, Some(consumer)) => consumer,
            _ => return None,
        };
        let due = lane.deferral.as_ref().and_then(|deferral| {
            // A refused commit of durable data is tried again soon.
            let retry_commit = deferral
                .commit_owed()
                .then(|| Instant::now() + self.pipeline.backoff.delay(1));
            deferral
                .flush_deadline()
                .into_iter()
                .chain(retry_commit)
                .min()
        });
        match self.poll_until(lane.topic, consumer.as_mut(), due).await {
            Ok(polled) => lane.prefetched = polled,
            // A stop request: the next turn ends the loop (after a deferred
            // sink's flush).
            Err(Ended::Shutdown) if self.shutdown.is_requested() => {}
            Err(ended) => return Some(ended),
        }
        None
    }

    /// Lends the consumer to a prefetch while writes run.
    fn start_prefetch(&self, lane: &mut Lane<'r>, stopping: bool) {
        if stopping || lane.found_nothing || lane.prefetched.is_some() || lane.in_flight.is_empty()
        {
            return;
        }
        if let Some(consumer) = lane.idle.take() {
            lane.polling = Some(Box::pin(async move {
                let polled = consumer.poll_available().await;
                (consumer, polled)
            }));
        }
    }

    /// Waits for a write to end, the prefetch to return, or a stop request.
    async fn wait(&self, lane: &mut Lane<'r>, stopping: bool) -> Result<(), Ended> {
        tokio::select! {
            biased;
            Some(delivered) = lane.in_flight.next() => {
                lane.found_nothing = false;
                lane.written.extend(delivered?);
            }
            (consumer, polled) = next(&mut lane.polling) => {
                lane.polling = None;
                lane.idle = Some(consumer);
                match polled {
                    Ok(Some(batch)) => lane.prefetched = Some(batch),
                    Ok(None) => lane.found_nothing = true,
                    Err(error) => {
                        lane.found_nothing = true;
                        self.poll_failed(lane.topic, 0, &error);
                    }
                }
            }
            () = self.shutdown.requested(), if !stopping => {}
        }
        Ok(())
    }

    /// The loop ended: lets a prefetch in progress finish (one request,
    /// not cut off before the consumer is closed), then commits the batches
    /// written before a failure (durable: a reopened sink must not write
    /// them again).
    async fn finish(&self, mut lane: Lane<'r>) {
        if let Some(polling) = lane.polling.take() {
            lane.idle = Some(polling.await.0);
        }
        if lane.deferral.is_none()
            && let Some(consumer) = lane.idle
        {
            while let Some(delivered) = lane.written.pop_front() {
                self.commit(lane.topic, consumer.as_mut(), delivered).await;
            }
        }
    }

    /// Waits for the next batch, retrying failed polls until a stop is requested.
    async fn poll(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
    ) -> Result<ConsumedBatch, Ended> {
        retry_with(
            self.pipeline.backoff,
            &self.shutdown,
            Until::StopRequested,
            consumer,
            |consumer| async move {
                let outcome = match consumer.poll().await {
                    Ok(batch) => Attempt::Done(batch),
                    Err(error) => Attempt::Failed(error),
                };
                (consumer, outcome)
            },
            |failure| {
                self.poll_failed(topic, failure.attempt, &failure.error);
                Ok(())
            },
        )
        .await
        .map_err(|gave_up| gave_up.or(|| Ended::Shutdown))
    }

    /// [`poll`](Self::poll) until `due`, when it gives `None`.
    pub(super) async fn poll_until(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
        due: Option<Instant>,
    ) -> Result<Option<ConsumedBatch>, Ended> {
        let Some(due) = due else {
            return self.poll(topic, consumer).await.map(Some);
        };
        tokio::select! {
            biased;
            polled = self.poll(topic, consumer) => polled.map(Some),
            () = tokio::time::sleep_until(due.into()) => Ok(None),
        }
    }

    /// Reports a failed poll (`attempt` 0: a prefetch, not retried itself).
    pub(super) fn poll_failed(&self, topic: &TopicRef, attempt: u32, error: &BusError) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(ErrorStage::Poll, 1);
        let message = format!("poll of {topic} failed: {error}");
        warn!(connector_key = %pipeline.key, attempt, %message, "retrying poll");
        pipeline.status.record_error(message);
    }
}
