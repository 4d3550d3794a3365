//! Whether the engine will store a source's record: a push source asks before
//! it tells its client a message is accepted, so a message the engine would
//! drop (a payload its stream's schema refuses, a failing transform) is
//! refused to the client instead of acknowledged and lost.

use std::fmt;
use std::sync::Arc;

use crate::codec::Schema;
use crate::message::Payload;
use crate::transforms::{TransformChain, Verdict};

/// The engine's own transform and encode steps of one source, run on a copy
/// of a record. Accepts everything when a dead-letter topic is configured (a
/// record that fails is stored there) and when built by default (a source
/// run outside the engine).
#[derive(Clone, Default)]
pub struct RecordCheck(Option<Arc<Steps>>);

struct Steps {
    transforms: Arc<TransformChain>,
    /// Per `[[streams]]` entry, in file order.
    schemas: Vec<Schema>,
}

impl RecordCheck {
    /// The check of a source without a dead-letter topic.
    pub fn new(transforms: Arc<TransformChain>, schemas: Vec<Schema>) -> Self {
        Self(Some(Arc::new(Steps {
            transforms,
            schemas,
        })))
    }

    /// Why a record for `stream_index` with this payload would be dropped
    /// without being stored, or `Ok` when it would be stored (or filtered out
    /// on purpose by a transform).
    pub fn check(&self, stream_index: usize, payload: &Payload) -> Result<(), String> {
        let Some(steps) = &self.0 else {
            return Ok(());
        };
        let Some(schema) = steps.schemas.get(stream_index) else {
            return Err(format!("the connector has no stream entry {stream_index}"));
        };
        let transformed;
        let payload = if steps.transforms.is_empty() {
            payload
        } else {
            let mut copy = payload.clone();
            match steps.transforms.apply(&mut copy) {
                Ok(Verdict::Keep) => {}
                Ok(Verdict::Drop) => return Ok(()),
                Err(error) => return Err(format!("a transform failed: {error}")),
            }
            transformed = copy;
            &transformed
        };
        schema
            .encode(payload)
            .map(drop)
            .map_err(|error| format!("the stream's schema refuses it: {error}"))
    }
}

impl fmt::Debug for RecordCheck {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        let schemas = self.0.as_ref().map(|steps| &steps.schemas);
        formatter
            .debug_struct("RecordCheck")
            .field("schemas", &schemas)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn json_check() -> RecordCheck {
        RecordCheck::new(Arc::new(TransformChain::default()), vec![Schema::Json])
    }

    #[test]
    fn given_a_json_stream_when_raw_bytes_are_not_json_should_refuse_them() {
        let refused = json_check().check(0, &Payload::Raw(Bytes::from_static(b"not json")));
        assert!(refused.is_err_and(|reason| reason.contains("schema")));
        assert_eq!(
            json_check().check(0, &Payload::Raw(Bytes::from_static(b"{\"n\":1}"))),
            Ok(())
        );
    }

    #[test]
    fn given_an_unknown_stream_index_when_checked_should_refuse() {
        assert!(json_check().check(1, &Payload::Text("x".into())).is_err());
    }

    #[test]
    fn given_the_default_check_when_checked_should_accept_anything() {
        let anything = Payload::Raw(Bytes::from_static(b"\xff"));
        assert_eq!(RecordCheck::default().check(7, &anything), Ok(()));
    }
}
