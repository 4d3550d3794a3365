//! Per-connector counters: kept locally for `/stats` and the tests, and exported
//! through the `metrics` facade under upstream's names. Handles are resolved once
//! per connector, so the hot path formats no labels.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram, Label};

use crate::connectors::ConnectorKind;

/// A counter readable in-process and exported to Prometheus.
#[derive(Debug)]
pub struct DualCounter {
    local: AtomicU64,
    exported: Counter,
}

impl DualCounter {
    fn new(name: &'static str, labels: &[Label]) -> Self {
        Self {
            local: AtomicU64::new(0),
            exported: metrics::counter!(name, labels.iter()),
        }
    }

    pub fn add(&self, count: u64) {
        if count > 0 {
            self.local.fetch_add(count, Ordering::Relaxed);
            self.exported.increment(count);
        }
    }

    pub fn get(&self) -> u64 {
        self.local.load(Ordering::Relaxed)
    }
}

/// Where in a pipeline an error happened; a label on the per-stage error counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStage {
    Poll,
    Decode,
    Transform,
    Encode,
    Send,
    StateSave,
    Commit,
    Write,
    OffsetCommit,
    DeadLetter,
}

impl ErrorStage {
    const ALL: [ErrorStage; 10] = [
        ErrorStage::Poll,
        ErrorStage::Decode,
        ErrorStage::Transform,
        ErrorStage::Encode,
        ErrorStage::Send,
        ErrorStage::StateSave,
        ErrorStage::Commit,
        ErrorStage::Write,
        ErrorStage::OffsetCommit,
        ErrorStage::DeadLetter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorStage::Poll => "poll",
            ErrorStage::Decode => "decode",
            ErrorStage::Transform => "transform",
            ErrorStage::Encode => "encode",
            ErrorStage::Send => "send",
            ErrorStage::StateSave => "state_save",
            ErrorStage::Commit => "commit",
            ErrorStage::Write => "write",
            ErrorStage::OffsetCommit => "offset_commit",
            ErrorStage::DeadLetter => "dead_letter",
        }
    }
}

/// Timed stages of a batch, upstream's `stage` label values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Source: poll; sink: decode.
    Decode,
    /// Transform and encode (source) or decode-to-write preparation (sink).
    Prepare,
    IggySend,
    StateSave,
    /// Sink: the connector's write.
    Write,
    /// The batch result: the source's `commit`, or the sink's offset commit.
    Commit,
    Total,
}

impl Stage {
    const ALL: [Stage; 7] = [
        Stage::Decode,
        Stage::Prepare,
        Stage::IggySend,
        Stage::StateSave,
        Stage::Write,
        Stage::Commit,
        Stage::Total,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Decode => "decode",
            Stage::Prepare => "prepare",
            Stage::IggySend => "iggy_send",
            Stage::StateSave => "state_save",
            Stage::Write => "write",
            Stage::Commit => "commit",
            Stage::Total => "total",
        }
    }
}

#[derive(Debug)]
pub struct ConnectorMetrics {
    /// Source: records returned by `poll`.
    pub produced: DualCounter,
    /// Source: messages acknowledged by the bus.
    pub sent: DualCounter,
    /// Sink: messages polled from the bus.
    pub consumed: DualCounter,
    /// Sink: messages written by the connector.
    pub processed: DualCounter,
    /// Messages dropped on purpose by a transform.
    pub filtered: DualCounter,
    /// Every error, whatever the stage (upstream's `errors_total`).
    pub errors: DualCounter,
    /// Failed deliveries of a source batch (send or state save).
    pub nacks: DualCounter,
    /// Retried attempts of a batch, source or sink.
    pub retries: DualCounter,
    /// Messages sent to the dead-letter topic.
    pub dead_lettered: DualCounter,
    /// Messages skipped under `on_error = "skip"` or dropped after a decode error.
    pub skipped: DualCounter,
    /// Failed attempts to open the connector (its backend down at start or
    /// after a lost connection), each retried.
    pub open_retries: DualCounter,
    /// Times the connector's connection was lost and it was opened again.
    pub reopens: DualCounter,
    /// Source: payload bytes of the batches polled and not yet committed.
    pub in_flight_bytes: Gauge,
    /// Payload bytes through Iggy: a source's sent messages, a sink's
    /// consumed ones (`top` and `/ui` show them as bytes/s).
    pub bytes: DualCounter,
    /// Every batch's total duration, kept locally for `/stats` (a p99 in
    /// `top` and `/ui`); Prometheus has the same in the `total` stage.
    pub batch_durations: LocalHistogram,
    errors_by_stage: Vec<Counter>,
    stage_durations: Vec<Histogram>,
}

impl ConnectorMetrics {
    pub fn new(key: &str, kind: ConnectorKind) -> Self {
        let labels = vec![
            Label::new("connector_key", key.to_owned()),
            Label::new("connector_type", kind.to_string()),
        ];
        let with = |name: &'static str, value: &'static str| {
            let mut labels = labels.clone();
            labels.push(Label::new(name, value));
            labels
        };
        Self {
            produced: DualCounter::new("iggy_connector_messages_produced_total", &labels),
            sent: DualCounter::new("iggy_connector_messages_sent_total", &labels),
            consumed: DualCounter::new("iggy_connector_messages_consumed_total", &labels),
            processed: DualCounter::new("iggy_connector_messages_processed_total", &labels),
            filtered: DualCounter::new("iggy_connector_messages_filtered_total", &labels),
            errors: DualCounter::new("iggy_connector_errors_total", &labels),
            nacks: DualCounter::new("iggy_connector_nacks_total", &labels),
            retries: DualCounter::new("iggy_connector_retries_total", &labels),
            dead_lettered: DualCounter::new("iggy_connector_messages_dead_lettered_total", &labels),
            skipped: DualCounter::new("iggy_connector_messages_skipped_total", &labels),
            open_retries: DualCounter::new("iggy_connector_open_retries_total", &labels),
            reopens: DualCounter::new("iggy_connector_reopens_total", &labels),
            in_flight_bytes: metrics::gauge!("iggy_connector_in_flight_bytes", labels.iter()),
            bytes: DualCounter::new("iggy_connector_bytes_total", &labels),
            batch_durations: LocalHistogram::default(),
            errors_by_stage: ErrorStage::ALL
                .iter()
                .map(|stage| {
                    metrics::counter!(
                        "iggy_connector_stage_errors_total",
                        with("stage", stage.as_str()).iter()
                    )
                })
                .collect(),
            stage_durations: Stage::ALL
                .iter()
                .map(|stage| {
                    metrics::histogram!(
                        "iggy_connector_stage_duration_seconds",
                        with("stage", stage.as_str()).iter()
                    )
                })
                .collect(),
        }
    }

    /// Counts `count` errors at `stage`.
    pub fn error(&self, stage: ErrorStage, count: u64) {
        self.errors.add(count);
        // `ALL` lists the stages in declaration order, so the discriminant indexes it.
        self.errors_by_stage[stage as usize].increment(count);
    }

    pub fn record_duration(&self, stage: Stage, elapsed: Duration) {
        self.stage_durations[stage as usize].record(elapsed.as_secs_f64());
        if stage == Stage::Total {
            self.batch_durations.record(elapsed);
        }
    }
}

/// A histogram readable in-process: counts per power-of-two bucket of
/// microseconds (bucket `i` holds durations up to `2^i` µs, the last one
/// everything longer). Readers diff two snapshots for a recent percentile.
#[derive(Debug, Default)]
pub struct LocalHistogram {
    buckets: [AtomicU64; LocalHistogram::BUCKETS],
}

impl LocalHistogram {
    /// Up to 2^26 µs (67 s) in buckets of their own.
    pub const BUCKETS: usize = 28;

    pub fn record(&self, elapsed: Duration) {
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let index = (u64::BITS - micros.saturating_sub(1).leading_zeros()) as usize;
        self.buckets[index.min(Self::BUCKETS - 1)].fetch_add(1, Ordering::Relaxed);
    }

    /// Count per bucket, in bucket order.
    pub fn counts(&self) -> Vec<u64> {
        self.buckets
            .iter()
            .map(|bucket| bucket.load(Ordering::Relaxed))
            .collect()
    }

    /// The upper bound of bucket `index`, in microseconds (`None` for the
    /// last, open one).
    pub fn bound_micros(index: usize) -> Option<u64> {
        (index < Self::BUCKETS - 1).then(|| 1u64 << index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_durations_when_recorded_should_land_in_their_power_of_two_bucket() {
        let histogram = LocalHistogram::default();
        for micros in [0, 1, 2, 3, 4, 5, 1_000, u64::MAX] {
            histogram.record(Duration::from_micros(micros));
        }
        let counts = histogram.counts();
        // 0 and 1 µs: bucket 0 (≤ 1); 2: ≤ 2; 3, 4: ≤ 4; 5: ≤ 8; 1000: ≤ 1024.
        assert_eq!(&counts[..4], &[2, 1, 2, 1]);
        assert_eq!(counts[10], 1);
        assert_eq!(counts[LocalHistogram::BUCKETS - 1], 1);
        assert_eq!(counts.iter().sum::<u64>(), 8);
        assert_eq!(LocalHistogram::bound_micros(10), Some(1024));
        assert_eq!(
            LocalHistogram::bound_micros(LocalHistogram::BUCKETS - 1),
            None
        );
    }
}
