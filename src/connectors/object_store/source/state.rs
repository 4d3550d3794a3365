//! What the source remembers: a watermark in reading order (every object at
//! or below it is finished), the keys finished at the watermark's own
//! last-modified time, and how far into the object being read it got.
//!
//! Stores give last-modified times in whole seconds (S3's HTTP dates), so an
//! object can appear after the watermark with the watermark's time and a
//! smaller key. By last-modified order, such an object is still read: at the
//! watermark's time, only the keys listed as finished are left out.

use ::object_store::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::config::Order;

/// Saved with every batch (MessagePack); compact whatever the number of
/// objects read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The last finished object's place in the reading order.
    pub watermark: Option<Mark>,
    /// The object being read, when a batch ended inside it.
    pub current: Option<Current>,
    /// By last-modified order: the keys finished with the watermark's time
    /// (empty in a state saved before they were kept: the watermark alone
    /// then decides, as it did).
    #[serde(default)]
    pub at_watermark: Vec<String>,
}

/// An object's place in the reading order: by key (`modified_ms` 0), or by
/// last-modified time then key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Mark {
    pub modified_ms: i64,
    pub key: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Current {
    pub key: String,
    /// The object's etag (or version) when it was started: a rewritten
    /// object is read from its first record.
    pub etag: Option<String>,
    /// Records of it already in a batch.
    pub next_record: u64,
}

impl Mark {
    pub fn of(meta: &ObjectMeta, order: Order) -> Self {
        Self {
            modified_ms: match order {
                Order::Key => 0,
                Order::LastModified => meta.last_modified.timestamp_millis(),
            },
            key: meta.location.to_string(),
        }
    }
}

impl State {
    /// Whether `meta` is still to be read: above the watermark, or by
    /// last-modified order at its time and not finished.
    pub fn is_unread(&self, meta: &ObjectMeta, order: Order) -> bool {
        let Some(watermark) = &self.watermark else {
            return true;
        };
        let mark = Mark::of(meta, order);
        match order {
            Order::LastModified
                if mark.modified_ms == watermark.modified_ms && !self.at_watermark.is_empty() =>
            {
                !self.at_watermark.contains(&mark.key)
            }
            _ => mark > *watermark,
        }
    }

    /// The first record of `meta` not yet in a batch.
    pub fn start_of(&self, meta: &ObjectMeta) -> u64 {
        match &self.current {
            Some(current)
                if current.key == meta.location.as_ref() && current.etag == identity(meta) =>
            {
                current.next_record
            }
            _ => 0,
        }
    }

    /// `meta` is read to its end.
    pub fn finish(&mut self, meta: &ObjectMeta, order: Order) {
        let mark = Mark::of(meta, order);
        if order == Order::LastModified {
            match &self.watermark {
                Some(watermark) if watermark.modified_ms == mark.modified_ms => {
                    self.at_watermark.push(mark.key.clone());
                }
                _ => self.at_watermark = vec![mark.key.clone()],
            }
        }
        if self
            .watermark
            .as_ref()
            .is_none_or(|watermark| mark > *watermark)
        {
            self.watermark = Some(mark);
        }
        self.current = None;
    }

    /// Records of `meta` up to `next_record` are in a batch.
    pub fn advance(&mut self, meta: &ObjectMeta, next_record: u64) {
        self.current = Some(Current {
            key: meta.location.to_string(),
            etag: identity(meta),
            next_record,
        });
    }
}

/// What tells two versions of one key apart: its etag, else its version.
pub fn identity(meta: &ObjectMeta) -> Option<String> {
    meta.e_tag.clone().or_else(|| meta.version.clone())
}

#[cfg(test)]
mod tests {
    use ::object_store::path::Path;
    use chrono::{TimeZone, Utc};

    use super::*;
    use crate::connectors::{decode_state, encode_state};

    fn meta(key: &str, modified_s: i64, etag: &str) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(key),
            last_modified: Utc.timestamp_opt(modified_s, 0).unwrap(),
            size: 1,
            e_tag: Some(etag.to_owned()),
            version: None,
        }
    }

    #[test]
    fn given_a_watermark_by_key_when_checked_should_read_only_keys_above_it() {
        let mut state = State::default();
        state.finish(&meta("in/b", 50, "e"), Order::Key);
        assert!(!state.is_unread(&meta("in/a", 99, "e"), Order::Key));
        assert!(!state.is_unread(&meta("in/b", 99, "e"), Order::Key));
        assert!(state.is_unread(&meta("in/c", 1, "e"), Order::Key));
    }

    #[test]
    fn given_a_watermark_by_time_when_checked_should_order_by_time_then_key() {
        let mut state = State::default();
        state.finish(&meta("in/m", 50, "e"), Order::LastModified);
        assert!(!state.is_unread(&meta("in/z", 49, "e"), Order::LastModified));
        assert!(!state.is_unread(&meta("in/m", 50, "e"), Order::LastModified));
        assert!(state.is_unread(&meta("in/n", 50, "e"), Order::LastModified));
        assert!(state.is_unread(&meta("in/a", 51, "e"), Order::LastModified));
    }

    #[test]
    fn given_an_object_late_at_the_watermarks_second_when_checked_by_time_should_read_it_once() {
        let mut state = State::default();
        state.finish(&meta("in/m", 50, "e"), Order::LastModified);
        // Written later in the same second, under a smaller key.
        let late = meta("in/a", 50, "e");
        assert!(state.is_unread(&late, Order::LastModified));
        state.finish(&late, Order::LastModified);
        assert!(!state.is_unread(&late, Order::LastModified));
        assert!(!state.is_unread(&meta("in/m", 50, "e"), Order::LastModified));
        assert_eq!(state.watermark.as_ref().unwrap().key, "in/m");
        // A later second starts the list again.
        state.finish(&meta("in/b", 51, "e"), Order::LastModified);
        assert_eq!(state.at_watermark, vec!["in/b".to_owned()]);
        assert!(!state.is_unread(&meta("in/z", 50, "e"), Order::LastModified));
    }

    #[test]
    fn given_a_state_saved_without_the_keys_at_the_watermark_when_checked_should_use_the_watermark_alone()
     {
        let state = State {
            watermark: Some(Mark {
                modified_ms: 50_000,
                key: "in/m".into(),
            }),
            ..State::default()
        };
        assert!(!state.is_unread(&meta("in/a", 50, "e"), Order::LastModified));
        assert!(state.is_unread(&meta("in/n", 50, "e"), Order::LastModified));
    }

    #[test]
    fn given_a_partly_read_object_when_its_etag_changed_should_start_it_again() {
        let mut state = State::default();
        state.advance(&meta("in/a", 1, "v1"), 7);
        assert_eq!(state.start_of(&meta("in/a", 1, "v1")), 7);
        assert_eq!(state.start_of(&meta("in/a", 2, "v2")), 0);
        assert_eq!(state.start_of(&meta("in/b", 1, "v1")), 0);
    }

    #[test]
    fn given_a_state_when_encoded_and_decoded_should_round_trip() {
        let mut state = State::default();
        state.finish(&meta("in/a", 1, "e"), Order::LastModified);
        state.advance(&meta("in/b", 2, "f"), 3);
        let bytes = encode_state(&state).unwrap();
        assert_eq!(decode_state::<State>(&bytes).unwrap(), state);
    }
}
