//! Decoding and transforming a polled batch: a message that fails is
//! counted and skipped or dead-lettered, never failing the batch.

use std::time::Instant;

use tracing::warn;

use crate::codec::Schema;
use crate::connectors::ConnectorKind;
use crate::delivery::OnError;
use crate::engine::dead_letter;
use crate::engine::metrics::{ErrorStage, Stage};
use crate::engine::tap::TapStage;
use crate::iggy::ConsumedBatch;
use crate::message::{ConsumedMessage, OutgoingMessage, Payload, SinkMessage, TopicRef};
use crate::telemetry::BatchSpan;
use crate::transforms::{MessageMeta, Side, Verdict};

use super::{Prepared, TopicLoop};

impl TopicLoop<'_> {
    /// Decodes and transforms a polled batch; `None` for an empty one.
    pub(super) fn prepare_batch(
        &self,
        topic: &TopicRef,
        schema: &Schema,
        batch: ConsumedBatch,
    ) -> Option<Prepared> {
        let started = Instant::now();
        let last_offset = batch.last_offset()?;
        let consumed = batch.messages.len();
        self.pipeline.metrics.consumed.add(consumed as u64);
        let bytes = batch
            .messages
            .iter()
            .map(|message| message.payload.len())
            .sum::<usize>();
        self.pipeline.metrics.bytes.add(bytes as u64);
        let mut dead = Vec::new();
        let (messages, rejected) = self.prepare(topic, schema, batch.messages, &mut dead);
        (self.pipeline.tap).sink_messages(TapStage::In, topic, messages.iter());
        let decoded = started.elapsed();
        self.pipeline
            .metrics
            .record_duration(Stage::Decode, decoded);
        let mut trace = BatchSpan::start("sink", &self.pipeline.key, started);
        trace.stage("decode", started, started + decoded, None);
        Some(Prepared {
            partition_id: batch.partition_id,
            last_offset,
            consumed,
            messages,
            dead,
            started,
            decoded,
            rejected,
            trace,
        })
    }

    /// Decodes and transforms a polled batch. Messages that fail are counted and
    /// queued for the dead-letter topic (with `on_error = "dlq"`) or skipped.
    pub(super) fn prepare(
        &self,
        topic: &TopicRef,
        schema: &Schema,
        consumed: Vec<ConsumedMessage>,
        dead: &mut Vec<OutgoingMessage>,
    ) -> (Vec<SinkMessage>, usize) {
        let pipeline = self.pipeline;
        let mut rejected = 0;
        let mut messages = Vec::with_capacity(consumed.len());
        // Without transforms, a sink that writes JSON as text gets the stored
        // bytes, checked, instead of a value it would serialize again.
        let keep_json_text = pipeline.transforms.is_empty() && pipeline.sink.accepts_json_bytes();
        for message in consumed {
            let ConsumedMessage {
                id,
                offset,
                partition_id,
                timestamp,
                origin_timestamp,
                checksum,
                mut headers,
                payload,
            } = message;
            let mut meta = MessageMeta {
                side: Side::Sink,
                topic: Some(topic),
                partition: Some(partition_id),
                id: Some(id),
                offset: Some(offset),
                timestamp: Some(timestamp),
                origin_timestamp: Some(origin_timestamp),
                headers: &mut headers,
                key: None,
            };
            let decoded =
                match self.decode_and_transform(schema, &payload, keep_json_text, &mut meta) {
                    Ok(Some(decoded)) => decoded,
                    Ok(None) => {
                        pipeline.metrics.filtered.add(1);
                        continue;
                    }
                    Err((stage, error)) => {
                        let origin = dead_letter::Origin::at(topic, partition_id, offset);
                        self.drop_message(stage, &error, id, headers, payload, origin, dead);
                        rejected += 1;
                        continue;
                    }
                };
            messages.push(SinkMessage {
                id,
                offset,
                partition_id,
                timestamp,
                origin_timestamp,
                checksum,
                headers,
                payload: decoded,
            });
        }
        (messages, rejected)
    }

    /// One message's payload, decoded under its schema and transformed; `None`
    /// when a transform drops it.
    pub(super) fn decode_and_transform(
        &self,
        schema: &Schema,
        payload: &bytes::Bytes,
        keep_json_text: bool,
        meta: &mut MessageMeta<'_>,
    ) -> Result<Option<Payload>, (ErrorStage, String)> {
        let decoded = if keep_json_text {
            schema.decode_keeping_json_text(payload.clone())
        } else {
            schema.decode(payload.clone())
        };
        let mut decoded = decoded.map_err(|error| (ErrorStage::Decode, error.to_string()))?;
        let transforms = &self.pipeline.transforms;
        if transforms.is_empty() {
            return Ok(Some(decoded));
        }
        match transforms.apply_with(&mut decoded, meta) {
            Ok(Verdict::Keep) => Ok(Some(decoded)),
            Ok(Verdict::Drop) => Ok(None),
            Err(error) => Err((ErrorStage::Transform, error.to_string())),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn drop_message(
        &self,
        stage: ErrorStage,
        error: &str,
        id: u128,
        headers: crate::message::Headers,
        payload: bytes::Bytes,
        origin: dead_letter::Origin<'_>,
        dead: &mut Vec<OutgoingMessage>,
    ) {
        let pipeline = self.pipeline;
        pipeline.metrics.error(stage, 1);
        let (partition_id, offset) = origin.position.unzip();
        warn!(connector_key = %pipeline.key, stage = stage.as_str(), partition_id, offset, %error, "dropping message");
        if pipeline.on_error == OnError::Dlq && pipeline.dead_letter.is_some() {
            let class = match stage {
                ErrorStage::Decode => dead_letter::ErrorClass::Decode,
                _ => dead_letter::ErrorClass::Transform,
            };
            let failure = dead_letter::Failure {
                connector_key: &pipeline.key,
                connector_type: ConnectorKind::Sink,
                stage: stage.as_str(),
                class,
                error,
            };
            dead.push(dead_letter::message(
                &failure,
                Some(id),
                headers,
                payload,
                Some(origin),
            ));
        } else {
            pipeline.metrics.skipped.add(1);
        }
    }
}
