//! `influxdb` sink: writes one point per message in line protocol to
//! InfluxDB 1.x (`version = "v1"`, `/write`), 2.x (`v2`, `/api/v2/write`) or
//! 3.x (`v3`, `/api/v3/write_lp`).
//!
//! Points are idempotent: a point is its series (measurement and tags) plus
//! its time, and one of the two holds the message's offset
//! (`offset_placement`): `tag` (upstream's layout) adds an `offset` tag to the
//! message's timestamp, one series per message; `timestamp` writes the
//! message's µs timestamp * 1000 + offset % 1000 in nanoseconds and the
//! offset as an `iggy_offset` field, so a partition is one series (see
//! `stamps`). Either way a replayed message overwrites itself with the same
//! fields.
//!
//! Delivery: `write` returns `Ok` once every request of the batch got a 2xx.
//! A connection error, a timeout, 408, 429 or 5xx ends the write as
//! transient (with the server's `Retry-After`): the engine retries what is
//! not stored. The points of requests answered 2xx before it are reported
//! durable (`SinkError::Partial`). After `circuit_breaker_threshold`
//! consecutive failures the breaker opens and the sink reports itself
//! degraded. 401/403 and a missing database or bucket are fatal.
//!
//! A 4xx refusal is read for the lines it names (v1's quoted lines, v2's
//! `line N`, v3's `line_number`): those messages are rejected by index for
//! `on_error`. A partial write (1.x and 3.x write the points they can) stored
//! the others: they are durable. Otherwise (2.x refuses the whole request)
//! the others are sent again. A refusal naming no line is split in halves
//! until the refused points stand alone, unless 1.x says it dropped every
//! point of the request.

mod config;
mod line;
mod stamps;

use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use tracing::{debug, info, warn};

use crate::connectors::influxdb::{self as shared, Breaker};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, ClientOptions, HttpClient};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, RetrySettings, Sink, SinkEntry,
    SinkError, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub use config::{InfluxDbSinkConfig, OffsetPlacement, PayloadFormat, Precision, Version};

/// Answers are read up to this much (errors and `SHOW DATABASES` fit well within).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "influxdb",
    feature: "influxdb-sink",
    description: "writes messages as line-protocol points to InfluxDB 1.x, 2.x or 3.x",
    secret_fields: &["token", "password"],
    sample_config: "version = \"v1\"\nurl = \"http://localhost:8086\"\ndb = \"events\"\nusername = \"iggy\"\npassword = \"secret\"\n# InfluxDB 1.8+: `Token user:password` instead of username/password\ntoken = \"iggy:secret\"\nmeasurement = \"iggy_messages\"\nprecision = \"ns\"\n# the offset in the point's nanoseconds: one series per partition, not per message\noffset_placement = \"timestamp\"\n",
    config_schema: schema_of::<InfluxDbSinkConfig>,
    build: |config| Ok(Box::new(InfluxDbSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct InfluxDbSink {
    config: InfluxDbSinkConfig,
    write_url: reqwest::Url,
    base_url: reqwest::Url,
    display_url: String,
    client: Option<HttpClient>,
    breaker: Breaker,
    key: String,
    /// `offset_placement = "timestamp"`: the timestamps seen per partition.
    stamps: Mutex<stamps::Stamps>,
}

/// One message as a point.
struct Point {
    index: usize,
    text: String,
    /// Physical lines it takes (a text payload may hold line breaks).
    lines: usize,
}

impl InfluxDbSink {
    pub fn new(config: InfluxDbSinkConfig) -> Result<Self, PluginConfigError> {
        let write_url = config.validate()?;
        let mut base_url = write_url.clone();
        base_url.set_query(None);
        base_url.set_path("/");
        let display_url = format!(
            "{}{}",
            base_url.as_str().trim_end_matches('/'),
            write_url.path()
        );
        let breaker = Breaker::new(
            config.circuit_breaker_threshold,
            config.circuit_breaker_cool_down,
        );
        Ok(Self {
            write_url,
            base_url,
            display_url,
            client: None,
            breaker,
            key: "influxdb".into(),
            stamps: Mutex::default(),
            config,
        })
    }

    fn credentials_field(&self) -> &'static str {
        match self.config.version {
            Version::V1 => "username/password",
            Version::V2 | Version::V3 => "token",
        }
    }

    fn target_field(&self) -> &'static str {
        match self.config.version {
            Version::V1 | Version::V3 => "db",
            Version::V2 => "org/bucket",
        }
    }

    /// The message as one line-protocol point; `micros` is its timestamp.
    fn encode(
        &self,
        topic: &TopicRef,
        message: &SinkMessage,
        micros: u64,
    ) -> Result<String, String> {
        let config = &self.config;
        let signed = config.version == Version::V1;
        let mut out = String::with_capacity(128);
        line::measurement(&mut out, &config.measurement);
        if config.include_metadata && config.include_stream_tag {
            out.push_str(",stream=");
            line::tag(&mut out, &topic.stream)?;
        }
        if config.include_metadata && config.include_topic_tag {
            out.push_str(",topic=");
            line::tag(&mut out, &topic.topic)?;
        }
        if config.include_metadata && config.include_partition_tag {
            out.push_str(&format!(",partition={}", message.partition_id));
        }
        // In a tag or in the time: two messages of one timestamp stay two points.
        let in_time = config.offset_placement == OffsetPlacement::Timestamp;
        if !in_time {
            out.push_str(&format!(",offset={}", message.offset));
        }
        out.push_str(&format!(" message_id=\"{}\"", message.id));
        if in_time {
            out.push_str(",iggy_offset=");
            line::unsigned_field(&mut out, message.offset, signed);
        }
        if config.include_metadata && !config.include_stream_tag {
            out.push_str(",iggy_stream=");
            line::string_field(&mut out, &topic.stream);
        }
        if config.include_metadata && !config.include_topic_tag {
            out.push_str(",iggy_topic=");
            line::string_field(&mut out, &topic.topic);
        }
        if config.include_metadata && !config.include_partition_tag {
            out.push_str(",iggy_partition=");
            line::unsigned_field(&mut out, u64::from(message.partition_id), signed);
        }
        if config.include_checksum {
            out.push_str(",iggy_checksum=");
            line::unsigned_field(&mut out, message.checksum, signed);
        }
        if config.include_origin_timestamp {
            out.push_str(",iggy_origin_timestamp=");
            line::unsigned_field(&mut out, message.origin_timestamp, signed);
        }
        match config.payload_format {
            PayloadFormat::Json => {
                out.push_str(",payload_json=");
                line::string_field(&mut out, &compact_json(&message.payload)?);
            }
            PayloadFormat::Text => {
                let bytes = message.payload.to_bytes();
                let text = std::str::from_utf8(&bytes)
                    .map_err(|_| "the payload is not UTF-8 (payload_format text)".to_owned())?;
                out.push_str(",payload_text=");
                line::string_field(&mut out, text);
            }
            PayloadFormat::Base64 => {
                out.push_str(",payload_base64=\"");
                STANDARD.encode_string(message.payload.to_bytes(), &mut out);
                out.push('"');
            }
        }
        let time = if in_time {
            stamps::point_nanos(micros, message.offset)
        } else {
            config.precision.from_micros(micros)
        };
        out.push_str(&format!(" {time}"));
        Ok(out)
    }

    /// The batch's points, and the messages refused before sending (a
    /// payload or tag that does not fit; with `offset_placement =
    /// "timestamp"`, a point that would take an earlier message's time).
    fn encode_batch(
        &self,
        topic: &TopicRef,
        messages: &[SinkMessage],
    ) -> (Vec<Point>, Vec<Rejection>) {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|since| since.as_micros() as u64)
            .unwrap_or_default();
        let mut stamps = (self.config.offset_placement == OffsetPlacement::Timestamp).then(|| {
            self.stamps
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
        });
        let mut partitions = stamps.as_mut().map(|stamps| stamps.topic(topic));
        let mut points = Vec::with_capacity(messages.len());
        let mut refused = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let micros = match message.timestamp {
                0 => now,
                timestamp => timestamp,
            };
            let checked = match partitions.as_mut() {
                Some(partitions) => partitions.check(message.partition_id, micros, message.offset),
                None => Ok(()),
            };
            match checked.and_then(|()| self.encode(topic, message, micros)) {
                Ok(text) => points.push(Point {
                    index,
                    lines: text.matches('\n').count() + 1,
                    text,
                }),
                Err(reason) => refused.push(Rejection { index, reason }),
            }
        }
        (points, refused)
    }

    /// Sends one body: `Ok` on a 2xx, else how it failed and, for a
    /// refusal, what the answer says about its lines.
    async fn send(
        &self,
        client: &HttpClient,
        body: Bytes,
        points: usize,
    ) -> Result<(), (Failure, line::Refused)> {
        let nothing = line::Refused::default;
        self.breaker
            .allow(&self.display_url)
            .map_err(|reason| (Failure::transient(reason), nothing()))?;
        let started = Instant::now();
        let bytes = body.len();
        let request = client.request(reqwest::Method::POST, self.write_url.clone(), body);
        let outcome = match http::exchange(request, &self.display_url, MAX_RESPONSE_BYTES).await {
            Ok(answer) if answer.is_success() => Ok(()),
            Ok(answer) => Err((
                shared::failure(
                    &answer,
                    &self.display_url,
                    self.credentials_field(),
                    self.target_field(),
                ),
                line::refused(&answer.text()),
            )),
            Err(failure) => Err((failure, nothing())),
        };
        match &outcome {
            Err((failure @ Failure::Transient { .. }, _)) => {
                self.breaker
                    .failure(&self.key, &self.display_url, failure.reason());
            }
            _ => self.breaker.success(&self.key, &self.display_url),
        }
        if self.config.verbose_logging {
            debug!(connector_key = %self.key, url = %self.display_url, points, bytes, elapsed_ms = started.elapsed().as_millis() as u64, ok = outcome.is_ok(), "InfluxDB write");
        }
        outcome
    }

    /// Writes `points` in requests of `batch_size`, isolating what is
    /// refused. Short of `Ok`, the answer names the points stored, the
    /// points refused, and how the others failed.
    async fn write_points(&self, client: &HttpClient, points: Vec<Point>) -> Result<(), SinkError> {
        let size = self.config.batch_size as usize;
        let mut parts: Vec<Vec<Point>> = Vec::new();
        let mut points = points.into_iter().peekable();
        while points.peek().is_some() {
            parts.push(points.by_ref().take(size).collect());
        }
        parts.reverse();
        let mut durable = Vec::new();
        let mut rejected = Vec::new();
        while let Some(part) = parts.pop() {
            let body = part
                .iter()
                .map(|point| point.text.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            let (reason, refused) = match self.send(client, Bytes::from(body), part.len()).await {
                Ok(()) => {
                    durable.extend(part.iter().map(|point| point.index));
                    continue;
                }
                Err((Failure::Refused(reason), refused)) => (reason, refused),
                Err((failure, _)) => {
                    let mut outcome = Outcome::settled(durable, rejected);
                    outcome.fail(failure, []);
                    return outcome.into_result();
                }
            };
            isolate(
                part,
                &refused,
                reason,
                &mut parts,
                &mut durable,
                &mut rejected,
            );
        }
        Outcome::settled(durable, rejected).into_result()
    }

    /// v1: the credentials work and the database exists.
    async fn check_v1_database(&self, client: &HttpClient) -> Result<(), ConnectorError> {
        let mut url = self
            .base_url
            .join("query")
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        url.query_pairs_mut().append_pair("q", "SHOW DATABASES");
        let request = client.empty(reqwest::Method::GET, url);
        let answer = http::exchange(request, &self.display_url, MAX_RESPONSE_BYTES).await?;
        if !answer.is_success() {
            let field = self.credentials_field();
            return Err(shared::failure(&answer, &self.display_url, field, "db").into());
        }
        let db = self.config.db.clone().unwrap_or_default();
        let answer: serde_json::Value = serde_json::from_slice(&answer.body).unwrap_or_default();
        let exists = answer["results"][0]["series"][0]["values"]
            .as_array()
            .is_some_and(|rows| rows.iter().any(|row| row[0].as_str() == Some(db.as_str())));
        if !exists {
            return Err(ConnectorError::fatal(format!(
                "the database {db:?} does not exist on {} (plugin_config.db): create it first (CREATE DATABASE \"{db}\")",
                self.display_url
            )));
        }
        Ok(())
    }
}

/// Settles a `part` the server refused: the points it names are rejected;
/// the others are durable when the server wrote them (a partial write) or
/// go back into `parts` when it wrote nothing. A refusal naming no point
/// rejects the part when it holds one point or the server dropped them
/// all, and splits it in halves otherwise.
fn isolate(
    mut part: Vec<Point>,
    refused: &line::Refused,
    reason: String,
    parts: &mut Vec<Vec<Point>>,
    durable: &mut Vec<usize>,
    rejected: &mut Vec<Rejection>,
) {
    let named = named_points(&part, refused);
    if !named.is_empty() {
        let mut position = 0;
        part.retain(|point| {
            let is_named = named.contains(&position);
            position += 1;
            if is_named {
                rejected.push(Rejection {
                    index: point.index,
                    reason: reason.clone(),
                });
            }
            !is_named
        });
        if refused.partial {
            durable.extend(part.iter().map(|point| point.index));
        } else if !part.is_empty() {
            parts.push(part);
        }
    } else if part.len() == 1 || refused.dropped == Some(part.len()) {
        rejected.extend(part.iter().map(|point| Rejection {
            index: point.index,
            reason: reason.clone(),
        }));
    } else {
        let second = part.split_off(part.len() / 2);
        parts.push(second);
        parts.push(part);
    }
}

/// Positions in `part` of the points a refusal names, by physical line
/// number or by the text of the line.
fn named_points(part: &[Point], refused: &line::Refused) -> Vec<usize> {
    let mut named = Vec::new();
    let mut first_line = 1;
    for (position, point) in part.iter().enumerate() {
        let last_line = first_line + point.lines - 1;
        let by_number = refused
            .lines
            .iter()
            .any(|line| (first_line..=last_line).contains(line));
        let by_text = refused.texts.contains(&point.text);
        if by_number || by_text {
            named.push(position);
        }
        first_line = last_line + 1;
    }
    named
}

/// The payload as compact JSON on one line.
fn compact_json(payload: &Payload) -> Result<String, String> {
    match payload {
        Payload::Json(value) => serde_json::to_string(value).map_err(|error| error.to_string()),
        other => {
            let bytes = other.to_bytes();
            let value: serde_json::Value = serde_json::from_slice(&bytes).map_err(|error| {
                format!("the payload is not JSON (payload_format json): {error}")
            })?;
            serde_json::to_string(&value).map_err(|error| error.to_string())
        }
    }
}

#[async_trait]
impl Sink for InfluxDbSink {
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        self.breaker.degraded = context.degraded;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let options = ClientOptions {
            timeout: self.config.timeout,
            auth: shared::auth(
                self.config.version == Version::V1,
                self.config.version == Version::V3,
                self.config.token.as_ref(),
                self.config.username.as_ref(),
                self.config.password.as_ref(),
            ),
            ..ClientOptions::default()
        };
        let client =
            HttpClient::new(&options).map_err(|error| ConnectorError::fatal(error.to_string()))?;
        shared::check_health(&client, &self.base_url, self.config.version == Version::V1).await?;
        if self.config.version == Version::V1 {
            self.check_v1_database(&client).await?;
        }
        info!(connector_key = %self.key, url = %self.display_url, version = self.config.version_name(), measurement = %self.config.measurement, "influxdb sink open");
        if self.config.offset_placement == OffsetPlacement::Tag
            && self.config.version != Version::V3
        {
            warn!(connector_key = %self.key, "offset_placement = \"tag\": one series per message; InfluxDB 1.x refuses writes past max-values-per-tag (100000 offsets per partition by default) and 2.x's index grows with every message; offset_placement = \"timestamp\" (with precision = \"ns\") keeps one series per partition");
        }
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the influxdb sink was not opened"))?;
        let (points, refused) = self.encode_batch(topic, messages);
        // Nothing sent: the engine writes the rest again without these.
        if !refused.is_empty() {
            return Err(SinkError::Rejected(refused));
        }
        self.write_points(client, points).await
    }

    /// `retry_delay` doubling up to `retry_max_delay` spaces the engine's
    /// retries; `max_retries` failed writes in a row report the sink degraded.
    fn retry(&self) -> Option<RetrySettings> {
        Some(shared::retry_settings(
            self.config.retry_delay,
            self.config.retry_max_delay,
            self.config.max_retries,
        ))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        self.breaker.degraded.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(extra: serde_json::Value) -> InfluxDbSink {
        let mut config = serde_json::json!({"url": "http://127.0.0.1:1", "org": "o", "bucket": "b", "token": "t"});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        InfluxDbSink::new(parse_plugin_config(&config).unwrap()).unwrap()
    }

    const MICROS: u64 = 1_700_000_000_123_456;

    fn message(payload: Payload) -> SinkMessage {
        SinkMessage {
            id: 42,
            offset: 7,
            partition_id: 3,
            timestamp: MICROS,
            origin_timestamp: 1_700_000_000_000_000,
            checksum: 99,
            headers: Vec::new(),
            payload,
        }
    }

    fn topic() -> TopicRef {
        TopicRef {
            stream: "my stream".into(),
            topic: "t,1".into(),
        }
    }

    #[test]
    fn given_a_message_when_encoded_should_write_upstreams_point() {
        let line = sink(serde_json::json!({}))
            .encode(
                &topic(),
                &message(Payload::Json(serde_json::json!({"a": "x y"}))),
                MICROS,
            )
            .unwrap();
        assert_eq!(
            line,
            r#"iggy_messages,stream=my\ stream,topic=t\,1,partition=3,offset=7 message_id="42",iggy_checksum=99u,iggy_origin_timestamp=1700000000000000u,payload_json="{\"a\":\"x y\"}" 1700000000123456"#
        );
    }

    #[test]
    fn given_fields_instead_of_tags_and_other_formats_when_encoded_should_follow_the_flags() {
        let sink = sink(serde_json::json!({
            "include_stream_tag": false, "include_topic_tag": false, "include_partition_tag": false,
            "include_checksum": false, "include_origin_timestamp": false,
            "payload_format": "base64", "precision": "ms"
        }));
        let line = sink
            .encode(
                &topic(),
                &message(Payload::Raw(Bytes::from_static(b"\x00\x01"))),
                MICROS,
            )
            .unwrap();
        assert_eq!(
            line,
            r#"iggy_messages,offset=7 message_id="42",iggy_stream="my stream",iggy_topic="t,1",iggy_partition=3u,payload_base64="AAE=" 1700000000123"#
        );
        let error = self::sink(serde_json::json!({}))
            .encode(&topic(), &message(Payload::Text("not json".into())), MICROS)
            .unwrap_err();
        assert!(error.contains("not JSON"), "{error}");
        let v1 = self::sink(
            serde_json::json!({"version": "v1", "db": "d", "include_partition_tag": false}),
        )
        .encode(
            &topic(),
            &message(Payload::Json(serde_json::json!(1))),
            MICROS,
        )
        .unwrap();
        assert!(
            v1.contains(
                ",iggy_partition=3i,iggy_checksum=99i,iggy_origin_timestamp=1700000000000000i,"
            ),
            "1.x has no unsigned integers: {v1}"
        );
    }

    #[test]
    fn given_offset_placement_timestamp_when_encoded_should_put_the_offset_in_a_field_and_the_nanoseconds()
     {
        let placement = serde_json::json!({"offset_placement": "timestamp", "precision": "ns", "include_checksum": false, "include_origin_timestamp": false});
        let mut json = message(Payload::Json(serde_json::json!(1)));
        json.offset = 123_007;
        let line = sink(placement.clone())
            .encode(&topic(), &json, MICROS)
            .unwrap();
        assert_eq!(
            line,
            r#"iggy_messages,stream=my\ stream,topic=t\,1,partition=3 message_id="42",iggy_offset=123007u,payload_json="1" 1700000000123456007"#
        );
        let mut v1 = placement;
        v1.as_object_mut()
            .unwrap()
            .extend([("version".into(), "v1".into()), ("db".into(), "d".into())]);
        let line = sink(v1).encode(&topic(), &json, MICROS).unwrap();
        assert!(
            line.contains(" message_id=\"42\",iggy_offset=123007i,"),
            "{line}"
        );
    }

    #[test]
    fn given_1001_messages_of_one_timestamp_when_encoded_should_refuse_the_last_naming_the_fix() {
        let sink = sink(serde_json::json!({"offset_placement": "timestamp", "precision": "ns"}));
        let batch: Vec<SinkMessage> = (0..1001)
            .map(|offset| SinkMessage {
                offset,
                ..message(Payload::Json(serde_json::json!(offset)))
            })
            .collect();
        let (points, refused) = sink.encode_batch(&topic(), &batch);
        assert_eq!(points.len(), 1000);
        assert_eq!(
            refused.len(),
            1,
            "{:?}",
            refused.iter().map(|r| &r.reason).collect::<Vec<_>>()
        );
        assert_eq!(refused[0].index, 1000);
        assert!(
            refused[0].reason.contains("offset_placement = \"tag\""),
            "{}",
            refused[0].reason
        );
        // The same batch again (the engine's retry) is judged the same way.
        assert_eq!(sink.encode_batch(&topic(), &batch).1.len(), 1);
        let tag = self::sink(serde_json::json!({}));
        assert!(
            tag.encode_batch(&topic(), &batch).1.is_empty(),
            "tags need no check"
        );
    }

    #[test]
    fn given_multi_line_points_when_a_line_is_named_should_find_its_message() {
        let part = [
            Point {
                index: 0,
                text: "a".into(),
                lines: 1,
            },
            Point {
                index: 1,
                text: "b\nc".into(),
                lines: 2,
            },
            Point {
                index: 2,
                text: "d".into(),
                lines: 1,
            },
        ];
        let by_number = line::Refused {
            lines: vec![3, 4],
            ..Default::default()
        };
        assert_eq!(named_points(&part, &by_number), vec![1, 2]);
        let by_text = line::Refused {
            texts: vec!["a".into()],
            ..Default::default()
        };
        assert_eq!(named_points(&part, &by_text), vec![0]);
    }

    fn points(count: usize) -> Vec<Point> {
        (0..count)
            .map(|index| Point {
                index,
                text: format!("p{index}"),
                lines: 1,
            })
            .collect()
    }

    fn isolated(
        part: Vec<Point>,
        refused: line::Refused,
    ) -> (Vec<Vec<usize>>, Vec<usize>, Vec<usize>) {
        let (mut parts, mut durable, mut rejected) = (Vec::new(), Vec::new(), Vec::new());
        isolate(
            part,
            &refused,
            "no".into(),
            &mut parts,
            &mut durable,
            &mut rejected,
        );
        let parts = parts
            .iter()
            .map(|part: &Vec<Point>| part.iter().map(|point| point.index).collect())
            .collect();
        (
            parts,
            durable,
            rejected.iter().map(|rejection| rejection.index).collect(),
        )
    }

    #[test]
    fn given_a_refusal_when_isolated_should_store_send_again_or_split_by_what_it_says() {
        let named = |partial| line::Refused {
            lines: vec![2],
            partial,
            ..Default::default()
        };
        assert_eq!(
            isolated(points(3), named(true)),
            (vec![], vec![0, 2], vec![1]),
            "partial write: the rest is stored"
        );
        assert_eq!(
            isolated(points(3), named(false)),
            (vec![vec![0, 2]], vec![], vec![1]),
            "nothing stored: send the rest"
        );
        assert_eq!(
            isolated(points(1), named(false)),
            (vec![], vec![], vec![0]),
            "nothing left to send"
        );
        let dropped = |count| line::Refused {
            partial: true,
            dropped: Some(count),
            ..Default::default()
        };
        assert_eq!(
            isolated(points(3), dropped(3)),
            (vec![], vec![], vec![0, 1, 2]),
            "every point dropped"
        );
        assert_eq!(
            isolated(points(3), dropped(1)),
            (vec![vec![1, 2], vec![0]], vec![], vec![]),
            "split in halves"
        );
    }
}
