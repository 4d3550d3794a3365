//! Committing offsets once batches are durable (rules K2 and K6) and the
//! report of each committed batch.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use crate::engine::BENCHMARK_TARGET;
use crate::engine::deferral::Deferral;
use crate::engine::metrics::{ErrorStage, Stage};
use crate::iggy::{BusError, Consumer};
use crate::message::TopicRef;
use crate::telemetry::Outcome;

use super::{Delivered, TopicLoop};

impl TopicLoop<'_> {
    /// Rule K6: takes the batches a deferred sink accepted into its
    /// bookkeeping and commits each partition as far as the sink reports
    /// durable.
    pub(super) async fn commit_durable(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
        deferral: &mut Deferral<Delivered>,
        written: &mut VecDeque<Delivered>,
    ) {
        for delivered in written.drain(..) {
            let (partition_id, last_offset, last_written) = (
                delivered.partition_id,
                delivered.last_offset,
                delivered.last_written,
            );
            deferral.accepted_batch(partition_id, last_offset, last_written, delivered);
        }
        if !deferral.has_pending() {
            return;
        }
        let durable = self.pipeline.sink.durable(topic);
        for ready in deferral.ready(&durable) {
            let committing = Instant::now();
            let committed = consumer.commit(ready.partition_id, ready.offset).await;
            let commit_time = committing.elapsed();
            self.pipeline
                .metrics
                .record_duration(Stage::Commit, commit_time);
            let failed = match committed {
                Ok(()) => {
                    deferral.committed(ready.partition_id, ready.offset);
                    None
                }
                Err(error) => {
                    self.commit_failed(topic, ready.partition_id, ready.offset, &error);
                    Some(error.to_string())
                }
            };
            for delivered in ready.batches {
                self.report(topic, delivered, committing, commit_time, failed.as_deref());
            }
        }
    }

    /// Commits a delivered batch's offsets and reports it.
    pub(super) async fn commit(
        &self,
        topic: &TopicRef,
        consumer: &mut dyn Consumer,
        delivered: Delivered,
    ) {
        let committing = Instant::now();
        let committed = consumer
            .commit(delivered.partition_id, delivered.last_offset)
            .await;
        let commit_time = committing.elapsed();
        self.pipeline
            .metrics
            .record_duration(Stage::Commit, commit_time);
        let failed = match committed {
            Ok(()) => None,
            Err(error) => {
                // The batch is written; a later commit covers it, or it is
                // redelivered (at-least-once).
                self.commit_failed(topic, delivered.partition_id, delivered.last_offset, &error);
                Some(error.to_string())
            }
        };
        self.report(topic, delivered, committing, commit_time, failed.as_deref());
    }

    pub(super) fn commit_failed(
        &self,
        topic: &TopicRef,
        partition_id: u32,
        offset: u64,
        error: &BusError,
    ) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(ErrorStage::OffsetCommit, 1);
        let message = format!("offset commit on {topic} failed: {error}");
        warn!(connector_key = %pipeline.key, partition_id, offset, %message);
        pipeline.status.record_error(message);
    }

    /// Reports a batch whose offsets were committed (`failed`: why the
    /// commit failed).
    pub(super) fn report(
        &self,
        topic: &TopicRef,
        delivered: Delivered,
        committing: Instant,
        commit_time: Duration,
        failed: Option<&str>,
    ) {
        let pipeline = self.pipeline;
        let Delivered {
            partition_id,
            last_offset,
            consumed: count,
            processed,
            started,
            decoded,
            written,
            rejected,
            nacks,
            mut trace,
            last_written: _,
        } = delivered;
        trace.stage("commit", committing, committing + commit_time, failed);
        let outcome = match rejected {
            0 => Outcome::Ok,
            _ => Outcome::Rejected,
        };
        trace.end(count, nacks, outcome);
        let total = started.elapsed();
        // Upstream's `prepare`: whatever is neither decoding nor the write.
        let prepared = total.saturating_sub(decoded + written);
        pipeline.metrics.record_duration(Stage::Prepare, prepared);
        pipeline.metrics.record_duration(Stage::Total, total);
        if pipeline.benchmark {
            info!(
                target: BENCHMARK_TARGET,
                connector_type = "sink",
                connector_key = %pipeline.key,
                stream = %topic.stream,
                topic = %topic.topic,
                partition_id,
                current_offset = last_offset,
                batch_size = count,
                processed_count = processed,
                decode_us = decoded.as_micros() as u64,
                prepare_us = prepared.as_micros() as u64,
                ffi_us = written.as_micros() as u64,
                total_us = total.as_micros() as u64,
                "benchmark"
            );
        }
        let elapsed_us = total.as_micros() as u64;
        if pipeline.verbose {
            info!(connector_key = %pipeline.key, %topic, partition_id, offset = last_offset, consumed = count, written = processed, elapsed_us, "batch written");
        } else {
            debug!(connector_key = %pipeline.key, %topic, partition_id, offset = last_offset, consumed = count, written = processed, elapsed_us, "batch written");
        }
    }
}
