//! `offset_placement = "timestamp"`: the point's time carries the offset in
//! its nanoseconds, and messages that would share a time are found before
//! anything is sent.
//!
//! The Iggy server stamps every message of an appended batch with the
//! batch's timestamp (µs), so one partition's messages often share one.
//! Their points' times (µs * 1000 + offset % 1000) differ as long as fewer
//! than 1000 messages of the partition share the timestamp: offsets of one
//! timestamp are contiguous (timestamps never go back within a partition).
//!
//! The check sees a topic's batches in offset order because the sink does
//! not write concurrently (`Sink::writes_concurrently` is false); a batch
//! read again (a retry, a failed commit) finds its timestamps remembered.
//! What it cannot see are the messages handled before the sink opened: after
//! a restart inside a run of more than 1000 messages of one timestamp, it
//! counts from the first message it sees again (docs/connectors/influxdb.md).

use std::collections::{BTreeMap, HashMap};

use crate::message::TopicRef;

/// Distinct point times inside one microsecond.
pub const PER_MICROSECOND: u64 = 1000;
/// Timestamps remembered per partition (the latest ones), so a batch the
/// engine writes again is judged as it was the first time.
const REMEMBERED: usize = 4096;

/// A point's time in nanoseconds.
pub fn point_nanos(micros: u64, offset: u64) -> u64 {
    micros
        .saturating_mul(PER_MICROSECOND)
        .saturating_add(offset % PER_MICROSECOND)
}

/// Per partition: timestamp (µs) -> the lowest offset seen with it.
#[derive(Debug, Default)]
pub struct Stamps {
    topics: HashMap<(String, String), HashMap<u32, BTreeMap<u64, u64>>>,
}

impl Stamps {
    /// The partitions of one topic.
    pub fn topic(&mut self, topic: &TopicRef) -> Partitions<'_> {
        let key = (topic.stream.clone(), topic.topic.clone());
        Partitions(self.topics.entry(key).or_default())
    }
}

pub struct Partitions<'a>(&'a mut HashMap<u32, BTreeMap<u64, u64>>);

impl Partitions<'_> {
    /// Records the message; `Err` when its point would take the time of an
    /// earlier message of the partition (1000 or more offsets past the
    /// first one seen with its timestamp).
    pub fn check(&mut self, partition: u32, micros: u64, offset: u64) -> Result<(), String> {
        let seen = self.0.entry(partition).or_default();
        let first = seen.entry(micros).or_insert(offset);
        *first = (*first).min(offset);
        let first = *first;
        if seen.len() > REMEMBERED {
            seen.pop_first();
        }
        if offset - first < PER_MICROSECOND {
            return Ok(());
        }
        Err(format!(
            "offset {offset} shares its timestamp ({micros} µs) with offset {first} of partition {partition}, \
             1000 or more before it: with offset_placement = \"timestamp\" their points would have one time \
             (1000 messages per microsecond at most); set offset_placement = \"tag\" for producers appending \
             more than 1000 messages at once"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn topic(name: &str) -> TopicRef {
        TopicRef {
            stream: "s".into(),
            topic: name.into(),
        }
    }

    #[test]
    fn given_a_timestamp_and_an_offset_when_combined_should_keep_offset_mod_1000_in_the_nanoseconds()
     {
        assert_eq!(
            point_nanos(1_700_000_000_123_456, 7),
            1_700_000_000_123_456_007
        );
        assert_eq!(
            point_nanos(1_700_000_000_123_456, 123_999),
            1_700_000_000_123_456_999
        );
        assert_eq!(
            point_nanos(1_700_000_000_123_456, 124_000),
            1_700_000_000_123_456_000
        );
        assert_eq!(
            point_nanos(u64::MAX / 10, 5),
            u64::MAX,
            "saturates, never wraps"
        );
    }

    #[test]
    fn given_1000_messages_of_one_timestamp_when_checked_should_accept_them_and_reject_the_next() {
        let mut stamps = Stamps::default();
        let mut partitions = stamps.topic(&topic("t"));
        for offset in 500..1500 {
            partitions.check(1, 10, offset).unwrap();
        }
        let error = partitions.check(1, 10, 1500).unwrap_err();
        assert!(
            error.contains("offset 1500") && error.contains("offset 500"),
            "{error}"
        );
        assert!(error.contains("offset_placement = \"tag\""), "{error}");
        // Another partition, topic or timestamp has its own count.
        partitions.check(2, 10, 1500).unwrap();
        partitions.check(1, 11, 1501).unwrap();
        stamps.topic(&topic("u")).check(1, 10, 1500).unwrap();
    }

    #[test]
    fn given_a_replay_starting_later_when_checked_should_judge_from_the_first_offset_seen() {
        let mut stamps = Stamps::default();
        let mut partitions = stamps.topic(&topic("t"));
        partitions.check(1, 10, 200).unwrap();
        partitions.check(1, 10, 100).unwrap();
        assert!(
            partitions.check(1, 10, 1100).is_err(),
            "100 is the first seen"
        );
        partitions.check(1, 10, 1099).unwrap();
    }

    #[test]
    fn given_many_timestamps_when_checked_should_remember_only_the_latest() {
        let mut stamps = Stamps::default();
        let mut partitions = stamps.topic(&topic("t"));
        for micros in 0..(REMEMBERED as u64 + 10) {
            partitions.check(1, micros, micros).unwrap();
        }
        assert_eq!(partitions.0[&1].len(), REMEMBERED);
        assert_eq!(partitions.0[&1].first_key_value(), Some((&10, &10)));
    }
}
