//! The sink pipeline: consume -> decode -> transform -> write -> commit offsets.
//!
//! The next batch is polled while the current one is written (rule K5), and
//! offsets move only after `write` succeeded for the batch and for every
//! batch polled before it. Transient write
//! errors retry the same batch with capped backoff; messages the backend refuses
//! go through the sink's `on_error` policy; a message that does not decode under
//! its schema is counted and skipped (or dead-lettered), never failing the batch.
//! A sink that defers acknowledgement (rule K6) has its offsets committed only
//! as far as it reports durable, with flushes at its own triggers, at
//! `flush_interval` and at a stop.
//!
//! Files: `topic.rs` the loop of one topic (prefetch, writes in flight,
//! commits), `prepare.rs` decode and transform, `write.rs` a batch's write
//! and what its answer settles, `commit.rs` offsets and the batch report.

mod commit;
mod prepare;
mod topic;
mod write;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use tracing::{error, info, warn};

use crate::codec::Schema;
use crate::connectors::{Degraded, Sink};
use crate::delivery::OnError;
use crate::engine::backoff::Backoff;
use crate::engine::metrics::ConnectorMetrics;
use crate::engine::source::Ended;
use crate::engine::status::StatusCell;
use crate::engine::tap::Tap;
use crate::engine::{Shutdown, close_within};
use crate::iggy::{Consumer, Producer};
use crate::message::{OutgoingMessage, SinkMessage, TopicRef};
use crate::telemetry::BatchSpan;
use crate::transforms::TransformChain;

/// One topic a sink reads, through its own consumer.
pub struct TopicReader {
    pub topic: TopicRef,
    pub schema: Schema,
    pub consumer: Box<dyn Consumer>,
}

pub struct SinkPipeline {
    pub readers: Vec<TopicReader>,
    pub shutdown: Shutdown,
    pub context: SinkContext,
}

/// What every topic loop of a sink shares.
pub struct SinkContext {
    pub key: String,
    pub sink: Box<dyn Sink>,
    pub dead_letter: Option<Box<dyn Producer>>,
    pub on_error: OnError,
    pub transforms: Arc<TransformChain>,
    pub status: Arc<StatusCell>,
    pub metrics: Arc<ConnectorMetrics>,
    pub tap: Arc<Tap>,
    pub backoff: Backoff,
    /// The longest wait a backend's `Retry-After` is honoured for.
    pub max_retry_after: Duration,
    /// Where write retries report that the sink cannot make progress.
    pub degraded: Degraded,
    /// Consecutive failed writes after which the sink reports itself
    /// degraded (the connector's `max_retries`).
    pub degraded_after: Option<u32>,
    pub verbose: bool,
    /// Emit upstream's per-batch `benchmark` event.
    pub benchmark: bool,
}

/// Writes in flight per topic for a sink that writes concurrently.
pub(super) const CONCURRENT_WRITES: usize = 2;

/// A polled batch, decoded and transformed, on its way to the sink.
pub(super) struct Prepared {
    pub(super) partition_id: u32,
    pub(super) last_offset: u64,
    pub(super) consumed: usize,
    pub(super) messages: Vec<SinkMessage>,
    pub(super) dead: Vec<OutgoingMessage>,
    pub(super) started: Instant,
    pub(super) decoded: Duration,
    /// Messages that failed to decode or transform.
    pub(super) rejected: usize,
    pub(super) trace: BatchSpan,
}

/// A batch the sink stored (written or set aside), ready to commit.
pub(super) struct Delivered {
    pub(super) partition_id: u32,
    pub(super) last_offset: u64,
    pub(super) consumed: usize,
    pub(super) processed: usize,
    pub(super) started: Instant,
    pub(super) decoded: Duration,
    pub(super) written: Duration,
    /// Messages not written: failed to decode, or refused by the backend.
    pub(super) rejected: usize,
    pub(super) nacks: u32,
    pub(super) trace: BatchSpan,
    /// The last offset of the messages the sink took (`None`: it got none).
    pub(super) last_written: Option<u64>,
}

/// Runs one topic's loop; shares the sink and its settings with the others.
struct TopicLoop<'a> {
    pub(super) pipeline: &'a SinkContext,
    /// Cancelled by the runtime, or by another topic of this sink that stopped.
    pub(super) shutdown: Shutdown,
}

impl SinkPipeline {
    /// Runs every topic until a stop is requested or the sink stops on its own,
    /// then leaves the consumer groups, closes the sink and records the status.
    pub async fn run(self) -> Ended {
        let SinkPipeline {
            mut readers,
            shutdown,
            mut context,
        } = self;
        context.status.set_running();
        info!(connector_key = %context.key, topics = readers.len(), "sink running");
        let topic_shutdown = shutdown.child();
        let ended = {
            let mut loops: FuturesUnordered<_> = readers
                .iter_mut()
                .map(|reader| {
                    let topic_loop = TopicLoop {
                        pipeline: &context,
                        shutdown: topic_shutdown.clone(),
                    };
                    async move { topic_loop.run(reader).await }
                })
                .collect();
            let mut first_stop = None;
            while let Some(ended) = loops.next().await {
                if ended != Ended::Shutdown {
                    // One topic stopping stops the sink: the others finish their
                    // batch in flight and end.
                    topic_shutdown.request();
                    first_stop.get_or_insert(ended);
                }
            }
            first_stop.unwrap_or(Ended::Shutdown)
        };
        for reader in &mut readers {
            if let Err(error) = reader.consumer.close().await {
                warn!(connector_key = %context.key, topic = %reader.topic, %error, "leaving the consumer group failed");
            }
        }
        match close_within(&context.key, context.sink.close()).await {
            Some(Ok(Ok(()))) | None => {}
            Some(Ok(Err(error))) => {
                warn!(connector_key = %context.key, %error, "sink close failed")
            }
            Some(Err(panic)) => warn!(connector_key = %context.key, %panic, "sink close panicked"),
        }
        context.report_end(&ended);
        ended
    }
}

impl SinkContext {
    /// Reports how the sink ended: its status, log line and stop metric.
    fn report_end(&self, ended: &Ended) {
        match ended {
            Ended::Shutdown => {
                info!(connector_key = %self.key, "sink stopped");
                self.status.set_stopped();
            }
            // The runtime reopens it and reports the status meanwhile.
            Ended::Disconnected(_) => {}
            Ended::Stopped(reason, message) => {
                error!(connector_key = %self.key, stop_reason = %reason, %message, "sink stopped");
                metrics::counter!(
                    "iggy_connector_stops_total",
                    "connector_key" => self.key.clone(),
                    "connector_type" => "sink",
                    "reason" => reason.as_str()
                )
                .increment(1);
                self.status.set_stopped_by(*reason, message.clone());
            }
        }
    }
}

impl TopicLoop<'_> {
    pub(super) fn abandon(&self) -> Ended {
        warn!(connector_key = %self.pipeline.key, "stop requested and the grace period ran out; the batch in flight stays uncommitted and will be redelivered");
        Ended::Shutdown
    }
}
