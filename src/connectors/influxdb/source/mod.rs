//! `influxdb` source: rows of an InfluxDB query into Iggy, in time order.
//! InfluxDB 1.x (`version = "v1"`, InfluxQL over `/query`), 2.x (`v2`, Flux
//! over `/api/v2/query`, annotated CSV answers) or 3.x (`v3`, SQL over
//! `/api/v3/query_sql`, JSON lines).
//!
//! The cursor is the time of the last row emitted plus the identities of the
//! rows already emitted at exactly that time (a row's identity: a hash of its
//! columns, those a query re-computes such as Flux's `_start` left out). The
//! next query asks for rows after the cursor's time minus one nanosecond, so
//! rows sharing that time come again and the ones already emitted are told
//! apart by identity, never skipped by count: `>` and `>=` queries both work,
//! and tied rows in any order are neither lost nor repeated. `$limit` is
//! `batch_size` plus the rows already emitted at the cursor's time, so each
//! poll makes progress however many rows share one timestamp (up to
//! `stuck_batch_cap_factor`).
//!
//! The cursor lives only in the engine's state: returned with each batch,
//! saved before `commit`, which moves it (upstream moved it inside `poll`).
//! Each record's Iggy id is the row's identity, the same on every replay.
//!
//! Limits: the query must return rows in ascending time order (one table for
//! Flux: `group()` before `sort()` when it reads several series); a row
//! written later with a time before the cursor is never read.

mod config;
mod rows;
mod time;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::connectors::influxdb::{self as shared, Breaker};
use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Answer, ClientOptions, HttpClient};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, RetrySettings, Source, SourceBatch,
    SourceEntry, decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SourceRecord};
use crate::sync::lock;

pub use config::{InfluxDbSourceConfig, PayloadFormat, Version};
use rows::Row;

pub const ENTRY: SourceEntry = SourceEntry {
    name: "influxdb",
    feature: "influxdb-source",
    description: "reads InfluxDB 1.x, 2.x or 3.x query results in time order (cursor: time + row identity)",
    secret_fields: &["token", "password"],
    sample_config: "version = \"v1\"\nurl = \"http://localhost:8086\"\ndb = \"events\"\nusername = \"iggy\"\npassword = \"secret\"\n# InfluxDB 1.8+: `Token user:password` instead of username/password\ntoken = \"iggy:secret\"\nquery = \"SELECT * FROM cpu WHERE time > '$cursor' ORDER BY time LIMIT $limit\"\npoll_interval = \"5s\"\nbatch_size = 500\ninitial_offset = \"1970-01-01T00:00:00Z\"\n",
    config_schema: schema_of::<InfluxDbSourceConfig>,
    build: |config| Ok(Box::new(InfluxDbSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// The largest answer read (upstream's bound too).
const MAX_ANSWER_BYTES: usize = 256 * 1024 * 1024;

/// Where reading resumes: rows after `time` (ns since the epoch), and the
/// rows at exactly `time` whose identity is in `seen` are already emitted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cursor {
    pub time: i64,
    /// Identities (32 hex digits) of the rows emitted at `time`.
    pub seen: Vec<String>,
}

impl Cursor {
    /// The `$cursor` text: `time` itself on a fresh start (the query's own
    /// `>`/`>=`), else one nanosecond before it so its rows come again.
    fn placeholder(&self) -> String {
        if self.seen.is_empty() {
            time::format(self.time)
        } else {
            time::format(self.time.saturating_sub(1))
        }
    }
}

pub struct InfluxDbSource {
    config: InfluxDbSourceConfig,
    base_url: reqwest::Url,
    query_url: reqwest::Url,
    display_url: String,
    initial: i64,
    client: Option<HttpClient>,
    breaker: Breaker,
    committed: Mutex<Cursor>,
    /// The cursor after each batch polled and not yet committed, oldest first.
    staged: Mutex<VecDeque<Cursor>>,
    key: String,
}

impl InfluxDbSource {
    pub fn new(config: InfluxDbSourceConfig) -> Result<Self, PluginConfigError> {
        let (base_url, initial) = config.validate()?;
        let path = match config.version {
            Version::V1 => "query",
            Version::V2 => "api/v2/query",
            Version::V3 => "api/v3/query_sql",
        };
        let mut query_url = base_url.join(path).map_err(|error| {
            PluginConfigError::new("url", format!("cannot add {path}: {error}"))
        })?;
        match config.version {
            Version::V1 => {
                query_url
                    .query_pairs_mut()
                    .append_pair("db", config.db.as_deref().unwrap_or_default())
                    .append_pair("epoch", "ns");
            }
            Version::V2 => {
                query_url
                    .query_pairs_mut()
                    .append_pair("org", config.org.as_deref().unwrap_or_default());
            }
            Version::V3 => {}
        }
        let display_url = format!(
            "{}{}",
            base_url.as_str().trim_end_matches('/'),
            query_url.path()
        );
        Ok(Self {
            breaker: Breaker::new(
                config.circuit_breaker_threshold,
                config.circuit_breaker_cool_down,
            ),
            base_url,
            query_url,
            display_url,
            initial,
            client: None,
            committed: Mutex::new(Cursor {
                time: initial,
                seen: Vec::new(),
            }),
            staged: Mutex::new(VecDeque::new()),
            key: "influxdb".into(),
            config,
        })
    }

    fn credentials_field(&self) -> &'static str {
        match (self.config.version, self.config.token.is_some()) {
            (Version::V1, false) => "username/password",
            _ => "token",
        }
    }

    fn target_field(&self) -> &'static str {
        match self.config.version {
            Version::V1 | Version::V3 => "db",
            Version::V2 => "org",
        }
    }

    fn client(&self) -> Result<&HttpClient, ConnectorError> {
        self.client
            .as_ref()
            .ok_or_else(|| ConnectorError::fatal("the influxdb source was not opened"))
    }

    /// The query with its placeholders filled in for `cursor`, and its limit.
    fn query_text(&self, cursor: &Cursor) -> Result<(String, usize), ConnectorError> {
        let batch = self.config.batch_size as usize;
        let limit = batch + cursor.seen.len();
        let cap = self.config.stuck_batch_cap_factor as usize;
        if cap > 0 && limit > cap * batch {
            return Err(ConnectorError::fatal(format!(
                "{} rows share the time {} and more may follow: raise plugin_config.stuck_batch_cap_factor (now {cap}, 0 = no bound) or batch_size",
                cursor.seen.len(),
                time::format(cursor.time)
            )));
        }
        let text = self
            .config
            .query
            .replace("$cursor", &cursor.placeholder())
            .replace("$limit", &limit.to_string())
            .replace("$offset", "0");
        Ok((text, limit))
    }

    fn request(&self, client: &HttpClient, query: &str) -> reqwest::RequestBuilder {
        match self.config.version {
            Version::V1 => {
                let mut url = self.query_url.clone();
                url.query_pairs_mut().append_pair("q", query);
                client.empty(reqwest::Method::GET, url)
            }
            Version::V2 => {
                let body = json!({
                    "query": query,
                    "dialect": {"annotations": ["datatype", "group", "default"], "delimiter": ",", "header": true, "commentPrefix": "#"},
                });
                client
                    .request(
                        reqwest::Method::POST,
                        self.query_url.clone(),
                        Bytes::from(body.to_string()),
                    )
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
                    .header(ACCEPT, HeaderValue::from_static("text/csv"))
            }
            Version::V3 => {
                let body = json!({
                    "db": self.config.db.as_deref().unwrap_or_default(),
                    "q": query,
                    "format": "jsonl",
                });
                client
                    .request(
                        reqwest::Method::POST,
                        self.query_url.clone(),
                        Bytes::from(body.to_string()),
                    )
                    .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            }
        }
    }

    /// Runs `query` with one request: its rows, or why not. No answer, a
    /// body cut short or a busy server is transient (the engine polls
    /// again); a refusal is fatal, naming the field.
    async fn run(&self, query: &str) -> Result<Vec<Row>, ConnectorError> {
        let client = self.client()?;
        self.breaker
            .allow(&self.display_url)
            .map_err(ConnectorError::transient)?;
        let started = Instant::now();
        let request = self.request(client, query);
        let text = http::exchange_whole(request, &self.display_url, MAX_ANSWER_BYTES)
            .await
            .map_err(|failure| match failure {
                Failure::Refused(reason) => {
                    Failure::Fatal(format!("{reason}: lower plugin_config.batch_size"))
                }
                failure => failure,
            })
            .and_then(|answer| self.answer(answer));
        match &text {
            Err(Failure::Transient { reason, .. }) => {
                self.breaker.failure(&self.key, &self.display_url, reason);
            }
            _ => self.breaker.success(&self.key, &self.display_url),
        }
        let text = text?;
        let rows = self.parse(&text);
        if self.config.verbose_logging {
            debug!(connector_key = %self.key, url = %self.display_url, rows = rows.as_ref().map(Vec::len).unwrap_or(0), elapsed_ms = started.elapsed().as_millis() as u64, "InfluxDB query");
        }
        rows
    }

    /// A query's answer as text, or what its status says.
    fn answer(&self, answer: Answer) -> Result<String, Failure> {
        if !answer.is_success() {
            let failure = shared::failure(
                &answer,
                &self.display_url,
                self.credentials_field(),
                self.target_field(),
            );
            return Err(match failure {
                Failure::Refused(reason) if matches!(answer.status, 400 | 422) => {
                    Failure::Fatal(format!("{reason} (check plugin_config.query)"))
                }
                failure => failure,
            });
        }
        String::from_utf8(answer.body.to_vec()).map_err(|_| {
            Failure::transient(format!("the answer of {} is not UTF-8", self.display_url))
        })
    }

    fn parse(&self, text: &str) -> Result<Vec<Row>, ConnectorError> {
        let parsed = match self.config.version {
            Version::V1 => serde_json::from_str::<Value>(text)
                .map_err(|error| format!("the answer is not JSON: {error}"))
                .and_then(|answer| rows::v1(&answer)),
            Version::V2 => rows::v2(text),
            Version::V3 => rows::v3(text),
        };
        parsed.map_err(|error| {
            let field = if error.contains("database not found") {
                "db"
            } else {
                "query"
            };
            ConnectorError::fatal(format!(
                "{} refused the query: {error} (check plugin_config.{field})",
                self.display_url
            ))
        })
    }

    /// The rows after `cursor` as records, and the cursor after them.
    fn batch(
        &self,
        mut answer: Vec<Row>,
        cursor: &Cursor,
    ) -> Result<(Vec<SourceRecord>, Cursor), ConnectorError> {
        let field = self.config.cursor_field();
        let mut timed = Vec::with_capacity(answer.len());
        for row in answer.drain(..) {
            let Some(at) = row.get(field).and_then(row_time) else {
                return Err(ConnectorError::fatal(format!(
                    "a row of the answer has no time in column {field:?}: check plugin_config.cursor_field and the query (row: {})",
                    Value::Object(row)
                )));
            };
            timed.push((at, row));
        }
        // Stable: rows of one time keep the answer's order.
        timed.sort_by_key(|(at, _)| *at);
        let mut next = cursor.clone();
        let mut records = Vec::with_capacity(timed.len());
        for (at, row) in timed {
            let id = self.identity(at, &row);
            let hex = format!("{id:032x}");
            if at < cursor.time || (at == cursor.time && cursor.seen.contains(&hex)) {
                continue;
            }
            if at > next.time {
                next.time = at;
                next.seen.clear();
            }
            next.seen.push(hex);
            match self.payload(row) {
                Ok(payload) => records.push(SourceRecord::new(payload).with_id(id)),
                Err(reason) => {
                    warn!(connector_key = %self.key, time = %time::format(at), %reason, "row skipped: its payload cannot be built");
                }
            }
        }
        Ok((records, next))
    }

    /// A stable identity of a row at `at`: FNV-1a (128 bit) of the time and
    /// the columns in name order, without those a Flux query re-computes.
    fn identity(&self, at: i64, row: &Row) -> u128 {
        const OFFSET: u128 = 0x6c62272e07bb014262b821756295c58d;
        const PRIME: u128 = 0x0000000001000000000000000000013B;
        let volatile: &[&str] = match self.config.version {
            Version::V2 => &["result", "table", "_start", "_stop"],
            Version::V1 | Version::V3 => &[],
        };
        let columns: BTreeMap<&String, &Value> = row
            .iter()
            .filter(|(name, _)| !volatile.contains(&name.as_str()))
            .collect();
        let text = serde_json::to_string(&columns).unwrap_or_default();
        let mut hash = OFFSET;
        for byte in at.to_le_bytes().into_iter().chain(text.bytes()) {
            hash ^= u128::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
        hash.max(1)
    }

    fn payload(&self, mut row: Row) -> Result<Payload, String> {
        if let Some(column) = &self.config.payload_column {
            let value = row
                .remove(column)
                .ok_or_else(|| format!("no column {column:?} (plugin_config.payload_column)"))?;
            return Ok(match (self.config.payload_format, value) {
                (PayloadFormat::Json, Value::String(text)) => {
                    Payload::Json(serde_json::from_str(&text).unwrap_or(Value::String(text)))
                }
                (PayloadFormat::Json, value) => Payload::Json(value),
                (PayloadFormat::Text, Value::String(text)) => Payload::Text(text),
                (PayloadFormat::Text, value) => Payload::Text(value.to_string()),
                (PayloadFormat::Raw, Value::String(text)) => {
                    Payload::Raw(Bytes::from(STANDARD.decode(text.trim()).map_err(
                        |error| format!("column {column:?} is not base64: {error}"),
                    )?))
                }
                (PayloadFormat::Raw, other) => {
                    return Err(format!("column {column:?} is not a base64 string: {other}"));
                }
            });
        }
        let include = self.config.include_metadata;
        Ok(Payload::Json(match self.config.version {
            Version::V2 => {
                let envelope = json!({
                    "measurement": row.get("_measurement").cloned().unwrap_or(Value::Null),
                    "field": row.get("_field").cloned().unwrap_or(Value::Null),
                    "timestamp": row.get(self.config.cursor_field()).cloned().unwrap_or(Value::Null),
                    "value": row.get("_value").cloned().unwrap_or(Value::Null),
                });
                if !include {
                    row.retain(|name, _| {
                        name == "_time" || name == "_value" || name == self.config.cursor_field()
                    });
                }
                let mut envelope = envelope;
                envelope["row"] = Value::Object(row);
                envelope
            }
            Version::V1 | Version::V3 => {
                if !include {
                    row.remove(self.config.cursor_field());
                }
                Value::Object(row)
            }
        }))
    }

    fn lock_staged(&self) -> MutexGuard<'_, VecDeque<Cursor>> {
        lock(&self.staged)
    }
}

/// A time column's value: RFC 3339 text, or an integer of nanoseconds (v1
/// asks for `epoch=ns`).
fn row_time(value: &Value) -> Option<i64> {
    match value {
        Value::String(text) => time::parse(text),
        Value::Number(number) => number.as_i64(),
        _ => None,
    }
}

#[async_trait]
impl Source for InfluxDbSource {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        self.breaker.degraded = context.degraded;
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(bytes) = state {
            *lock(&self.committed) = decode_state::<Cursor>(bytes)?;
        }
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
        self.client = Some(client);
        let cursor = lock(&self.committed).clone();
        info!(connector_key = %self.key, url = %self.display_url, version = self.config.version.name(), cursor = %time::format(cursor.time), initial = %time::format(self.initial), "influxdb source open");
        Ok(())
    }

    /// One query after the newest cursor. A short answer (the source is
    /// caught up) asks the engine to query again `poll_interval` after this
    /// poll began.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let started = tokio::time::Instant::now();
        let cursor = self
            .lock_staged()
            .back()
            .cloned()
            .unwrap_or_else(|| lock(&self.committed).clone());
        let (query, limit) = self.query_text(&cursor)?;
        let answer = self.run(&query).await?;
        let full = answer.len() >= limit;
        let (records, next) = self.batch(answer, &cursor)?;
        // A full answer of rows already read: the query does not select
        // rows after $cursor; waiting keeps it from spinning.
        let next_poll = (!full || next == cursor).then(|| started + self.config.poll_interval);
        // Staged even when nothing moved: each poll's batch is committed by
        // one `commit`, in order.
        let state = (next != cursor).then(|| encode_state(&next)).transpose()?;
        self.lock_staged().push_back(next);
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            next_poll,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(cursor) = self.lock_staged().pop_front() {
            *lock(&self.committed) = cursor;
        }
        Ok(())
    }

    /// `retry_delay` doubling up to `retry_max_delay` spaces the engine's
    /// polls after a failed one.
    fn retry(&self) -> Option<RetrySettings> {
        Some(shared::retry_settings(
            self.config.retry_delay,
            self.config.retry_max_delay,
            self.config.max_retries,
        ))
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.lock_staged().clear();
        self.client = None;
        self.breaker.degraded.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(extra: Value) -> InfluxDbSource {
        let mut config = json!({"version": "v3", "url": "http://127.0.0.1:1", "db": "d", "token": "t",
            "query": "SELECT * FROM m WHERE time > '$cursor' ORDER BY time LIMIT $limit OFFSET $offset", "batch_size": 2});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        InfluxDbSource::new(parse_plugin_config(&config).unwrap()).unwrap()
    }

    fn row(time: &str, n: i64) -> Row {
        json!({"time": time, "n": n}).as_object().unwrap().clone()
    }

    fn numbers(records: &[SourceRecord]) -> Vec<i64> {
        records
            .iter()
            .map(|record| match &record.payload {
                Payload::Json(value) => value["n"].as_i64().unwrap(),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn given_a_cursor_when_the_query_is_filled_should_reread_its_time_and_widen_the_limit() {
        let source = source(json!({}));
        let fresh = Cursor {
            time: 0,
            seen: Vec::new(),
        };
        assert_eq!(
            source.query_text(&fresh).unwrap().0,
            "SELECT * FROM m WHERE time > '1970-01-01T00:00:00.000000000Z' ORDER BY time LIMIT 2 OFFSET 0"
        );
        let tied = Cursor {
            time: 1_000_000_000,
            seen: vec!["a".into(), "b".into(), "c".into()],
        };
        let (text, limit) = source.query_text(&tied).unwrap();
        assert_eq!(limit, 5);
        assert!(
            text.contains("time > '1970-01-01T00:00:00.999999999Z'"),
            "{text}"
        );
        let capped = self::source(json!({"stuck_batch_cap_factor": 2}));
        let error = capped.query_text(&tied).unwrap_err();
        assert!(
            error.to_string().contains("stuck_batch_cap_factor"),
            "{error}"
        );
    }

    #[test]
    fn given_tied_rows_in_any_order_when_batched_should_emit_each_once() {
        let source = source(json!({}));
        let t1 = "2024-03-01T00:00:01";
        let first = vec![row("2024-03-01T00:00:00", 0), row(t1, 2)];
        let (records, cursor) = source.batch(first, &Cursor::default()).unwrap();
        assert_eq!(numbers(&records), vec![0, 2]);
        assert_eq!(cursor.seen.len(), 1);
        // The same time again, its rows in another order, one of them new.
        let again = vec![row(t1, 1), row(t1, 2), row(t1, 3)];
        let (records, next) = source.batch(again, &cursor).unwrap();
        assert_eq!(numbers(&records), vec![1, 3]);
        assert_eq!(next.seen.len(), 3);
        assert_eq!(
            records[0].id,
            source
                .batch(vec![row(t1, 1)], &Cursor::default())
                .unwrap()
                .0[0]
                .id
        );
    }

    #[test]
    fn given_payload_settings_when_built_should_follow_upstreams_shapes() {
        let flat = source(json!({"include_metadata": false}));
        assert_eq!(
            flat.payload(row("2024-03-01T00:00:00", 1)).unwrap(),
            Payload::Json(json!({"n": 1}))
        );
        let text = source(json!({"payload_column": "n", "payload_format": "text"}));
        assert_eq!(
            text.payload(row("2024-03-01T00:00:00", 7)).unwrap(),
            Payload::Text("7".into())
        );
        let raw = source(json!({"payload_column": "b", "payload_format": "raw"}));
        let mut with_b = row("2024-03-01T00:00:00", 7);
        with_b.insert("b".into(), json!("AAE="));
        assert_eq!(
            raw.payload(with_b).unwrap(),
            Payload::Raw(Bytes::from_static(b"\x00\x01"))
        );
        assert!(raw.payload(row("2024-03-01T00:00:00", 7)).is_err());
        let v2 = InfluxDbSource::new(
            parse_plugin_config(
                &json!({"url": "http://h", "org": "o", "token": "t", "query": "$cursor"}),
            )
            .unwrap(),
        )
        .unwrap();
        let flux = json!({"result": "_result", "table": 0, "_time": "2024-03-01T00:00:00Z", "_value": 1.5, "_field": "v", "_measurement": "m"});
        assert_eq!(
            v2.payload(flux.as_object().unwrap().clone()).unwrap(),
            Payload::Json(
                json!({"measurement": "m", "field": "v", "timestamp": "2024-03-01T00:00:00Z", "value": 1.5, "row": flux})
            )
        );
    }
}
