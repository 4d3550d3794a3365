//! What the sink engine tracks for a sink that defers acknowledgement (rule
//! K6, docs/ARCHITECTURE.md): per partition, the batches the sink accepted
//! and that are not committed yet, and how far the partition may be
//! committed given what the sink reported durable.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

/// One topic's accepted, uncommitted batches (`B`: what the engine reports
/// about a batch once it is committed).
pub struct Deferral<B> {
    partitions: BTreeMap<u32, Partition<B>>,
    flush_interval: Option<Duration>,
}

struct Partition<B> {
    /// Batches accepted and not yet covered by a durable report, in poll order.
    pending: VecDeque<Pending<B>>,
    /// The highest offset handed to the sink in this run.
    accepted: Option<u64>,
    /// Everything at or below this is durable or was handled (filtered, set
    /// aside, dead-lettered): it may be committed.
    safe: Option<u64>,
    /// The last offset committed.
    committed: Option<u64>,
}

impl<B> Default for Partition<B> {
    fn default() -> Self {
        Self {
            pending: VecDeque::new(),
            accepted: None,
            safe: None,
            committed: None,
        }
    }
}

struct Pending<B> {
    last_offset: u64,
    /// The last offset of the messages the sink accepted from this batch;
    /// `None` when it got none (all filtered or set aside).
    last_written: Option<u64>,
    accepted_at: Instant,
    batch: B,
}

/// A partition that may be committed further.
pub struct Ready<B> {
    pub partition_id: u32,
    pub offset: u64,
    /// The batches this commit covers, in poll order.
    pub batches: Vec<B>,
}

impl<B> Deferral<B> {
    pub fn new(flush_interval: Option<Duration>) -> Self {
        Self {
            partitions: BTreeMap::new(),
            flush_interval,
        }
    }

    /// The highest offset of `partition_id` handed to the sink in this run: a
    /// message at or below it is already accepted and must not be handed again
    /// (the consumer reads a partition again from its stored offset after a
    /// failed commit or a new session).
    pub fn accepted(&self, partition_id: u32) -> Option<u64> {
        self.partitions.get(&partition_id)?.accepted
    }

    /// A batch ending at `last_offset` is being handed to the sink.
    pub fn handing(&mut self, partition_id: u32, last_offset: u64) {
        let partition = self.partitions.entry(partition_id).or_default();
        partition.accepted = partition.accepted.max(Some(last_offset));
    }

    /// The sink accepted a batch.
    pub fn accepted_batch(
        &mut self,
        partition_id: u32,
        last_offset: u64,
        last_written: Option<u64>,
        batch: B,
    ) {
        let partition = self.partitions.entry(partition_id).or_default();
        partition.pending.push_back(Pending {
            last_offset,
            last_written,
            accepted_at: Instant::now(),
            batch,
        });
    }

    /// Whether some accepted batch is not committed yet.
    pub fn has_pending(&self) -> bool {
        self.partitions
            .values()
            .any(|partition| !partition.pending.is_empty() || partition.safe > partition.committed)
    }

    /// Whether a partition may be committed further than it is (a commit
    /// was refused).
    pub fn commit_owed(&self) -> bool {
        self.partitions
            .values()
            .any(|partition| partition.safe > partition.committed)
    }

    /// When the oldest accepted batch that is not yet durable is
    /// `flush_interval` old.
    pub fn flush_deadline(&self) -> Option<Instant> {
        let interval = self.flush_interval?;
        self.partitions
            .values()
            .filter_map(|partition| partition.pending.front())
            .map(|pending| pending.accepted_at + interval)
            .min()
    }

    /// An age flush started: the next is due `flush_interval` from now at
    /// the earliest, even if this one leaves something not durable.
    pub fn flush_started(&mut self) {
        let now = Instant::now();
        for partition in self.partitions.values_mut() {
            for pending in &mut partition.pending {
                pending.accepted_at = pending.accepted_at.max(now);
            }
        }
    }

    /// Applies the sink's durable report and returns the partitions that may
    /// now be committed further, with the batches each commit covers.
    pub fn ready(&mut self, durable: &[(u32, u64)]) -> Vec<Ready<B>> {
        for &(partition_id, offset) in durable {
            if let Some(partition) = self.partitions.get_mut(&partition_id) {
                // Never past what the sink was given.
                let offset = offset.min(partition.accepted.unwrap_or(0));
                if partition.accepted.is_some() {
                    partition.safe = partition.safe.max(Some(offset));
                }
            }
        }
        let mut ready = Vec::new();
        for (&partition_id, partition) in &mut self.partitions {
            let mut batches = Vec::new();
            while let Some(front) = partition.pending.front() {
                let durable = match front.last_written {
                    None => true,
                    Some(written) => partition.safe.is_some_and(|safe| written <= safe),
                };
                if !durable {
                    break;
                }
                let Some(front) = partition.pending.pop_front() else {
                    break;
                };
                partition.safe = partition.safe.max(Some(front.last_offset));
                batches.push(front.batch);
            }
            if let Some(offset) = partition.safe
                && partition.safe > partition.committed
            {
                ready.push(Ready {
                    partition_id,
                    offset,
                    batches,
                });
            }
        }
        ready
    }

    /// `offset` of `partition_id` is committed.
    pub fn committed(&mut self, partition_id: u32, offset: u64) {
        if let Some(partition) = self.partitions.get_mut(&partition_id) {
            partition.committed = partition.committed.max(Some(offset));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(ready: &[Ready<&'static str>]) -> Vec<(u32, u64, Vec<&'static str>)> {
        ready
            .iter()
            .map(|ready| (ready.partition_id, ready.offset, ready.batches.clone()))
            .collect()
    }

    #[test]
    fn given_accepted_batches_when_nothing_is_durable_should_commit_nothing() {
        let mut deferral = Deferral::new(None);
        deferral.handing(0, 4);
        deferral.accepted_batch(0, 4, Some(4), "a");
        assert!(deferral.ready(&[]).is_empty());
        assert!(deferral.has_pending());
    }

    #[test]
    fn given_a_durable_report_when_ready_should_commit_each_partition_up_to_it_in_order() {
        let mut deferral = Deferral::new(None);
        for (partition, last, name) in [(0, 4, "a"), (1, 2, "b"), (0, 9, "c")] {
            deferral.handing(partition, last);
            deferral.accepted_batch(partition, last, Some(last), name);
        }
        // Partition 0 durable into the middle of its second batch.
        let ready = deferral.ready(&[(0, 6)]);
        assert_eq!(offsets(&ready), [(0, 6, vec!["a"])]);
        deferral.committed(0, 6);
        assert!(deferral.ready(&[(0, 6)]).is_empty());
        let ready = deferral.ready(&[(0, 9), (1, 2)]);
        assert_eq!(offsets(&ready), [(0, 9, vec!["c"]), (1, 2, vec!["b"])]);
    }

    #[test]
    fn given_a_batch_the_sink_got_nothing_of_when_ready_should_commit_it_after_the_ones_before() {
        let mut deferral = Deferral::new(None);
        deferral.handing(0, 4);
        deferral.accepted_batch(0, 4, Some(3), "a");
        deferral.handing(0, 8);
        deferral.accepted_batch(0, 8, None, "filtered");
        assert!(deferral.ready(&[]).is_empty());
        let ready = deferral.ready(&[(0, 3)]);
        assert_eq!(offsets(&ready), [(0, 8, vec!["a", "filtered"])]);
    }

    #[test]
    fn given_a_failed_commit_when_ready_again_should_offer_the_same_offset() {
        let mut deferral = Deferral::new(None);
        deferral.handing(0, 4);
        deferral.accepted_batch(0, 4, Some(4), "a");
        assert_eq!(offsets(&deferral.ready(&[(0, 4)])), [(0, 4, vec!["a"])]);
        assert_eq!(offsets(&deferral.ready(&[])), [(0, 4, vec![])]);
        deferral.committed(0, 4);
        assert!(deferral.ready(&[]).is_empty());
        assert!(!deferral.has_pending());
    }

    #[test]
    fn given_a_report_past_what_was_accepted_when_ready_should_commit_only_what_was_accepted() {
        let mut deferral: Deferral<&str> = Deferral::new(None);
        deferral.handing(0, 4);
        deferral.accepted_batch(0, 4, Some(4), "a");
        assert_eq!(
            offsets(&deferral.ready(&[(0, 100), (7, 3)])),
            [(0, 4, vec!["a"])]
        );
    }

    #[test]
    fn given_a_flush_interval_when_batches_wait_should_be_due_from_the_oldest() {
        let mut deferral = Deferral::new(Some(Duration::from_secs(5)));
        assert_eq!(deferral.flush_deadline(), None);
        let before = Instant::now();
        deferral.handing(0, 1);
        deferral.accepted_batch(0, 1, Some(1), "a");
        let due = deferral.flush_deadline().unwrap();
        assert!(due >= before + Duration::from_secs(5));
        // A flush that leaves the batch not durable is not due again at once.
        let flushed = Instant::now();
        deferral.flush_started();
        assert!(deferral.flush_deadline().unwrap() >= flushed + Duration::from_secs(5));
        deferral.ready(&[(0, 1)]);
        assert_eq!(deferral.flush_deadline(), None);
    }
}
