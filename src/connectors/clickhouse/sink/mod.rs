//! `clickhouse` sink: inserts messages into a ClickHouse table over its HTTP
//! interface, as `JSONEachRow` (JSON objects, converted by the server),
//! `RowBinaryWithDefaults` (encoded here from the table's columns, read at
//! open; plain `RowBinary` on servers without it) or text payloads as they
//! are (`JSONEachRow`, `CSV`, `TabSeparated`).
//!
//! Delivery: `write` returns `Ok` once the server acknowledged every insert
//! of the batch. A connection error, a timeout, 408/429/5xx or a "try again"
//! exception (too many parts, memory limit, read-only replica...) ends the
//! write as `Transient` (with the server's `Retry-After`, if any): the engine
//! retries what is not stored and commits nothing past it. Credentials, a
//! missing database or table are fatal, naming the field. At open, an
//! unreachable server is transient (the engine opens again) and a refusal
//! fatal.
//!
//! Refused rows: a message that cannot be encoded (not a JSON object, a value
//! that does not fit its column in `row_binary`) is rejected by index before
//! anything is sent. When the server refuses an insert for its data, the row
//! it names (`(at row N)`) is rejected and the rest sent again; when it names
//! none, the insert is split in halves until the refused rows stand alone. A
//! refused insert writes nothing (an insert of fewer rows than
//! `max_insert_block_size` is one block); the inserts that succeeded while
//! others were isolated are reported durable (`SinkError::Partial`), so the
//! engine writes only the rest again.
//!
//! Replays: where the server has `insert_deduplication_token` (22.x and
//! later), each insert carries a token derived from the offsets it holds, so
//! an insert retried after a lost answer, or replayed after a crash, is
//! deduplicated by Replicated*MergeTree tables and by MergeTree tables with
//! `non_replicated_deduplication_window`. Servers without it (18.16) still
//! deduplicate identical blocks on Replicated*MergeTree; on a plain MergeTree
//! a replay inserts the rows again (use a ReplacingMergeTree keyed by the
//! message id to fold them).

mod answer;
mod config;
mod row_binary;

use std::collections::HashSet;
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use tracing::{debug, info};

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Auth, ClientOptions, HttpClient};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, RetrySettings, Sink, SinkEntry,
    SinkError, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub use config::{ClickHouseSinkConfig, InsertFormat, StringFormat};
use row_binary::Column;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "clickhouse",
    feature: "clickhouse-sink",
    description: "inserts messages into a ClickHouse table over HTTP (JSONEachRow, RowBinary or text)",
    secret_fields: &["password"],
    sample_config: "url = \"http://localhost:8123\"\ndatabase = \"default\"\ntable = \"events\"\nusername = \"default\"\npassword = \"secret\"\ninsert_format = \"json_each_row\"\n",
    config_schema: schema_of::<ClickHouseSinkConfig>,
    build: |config| Ok(Box::new(ClickHouseSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// Response bodies are read up to this much (errors fit well within).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

pub struct ClickHouseSink {
    config: ClickHouseSinkConfig,
    base_url: reqwest::Url,
    /// The URL without credentials, for logs and errors.
    display_url: String,
    client: Option<HttpClient>,
    server: Server,
    /// Set at open for `row_binary`: the table's insertable columns.
    columns: Vec<Column>,
    key: String,
}

/// What the server supports, learnt at open.
#[derive(Debug, Clone, Copy, Default)]
struct Server {
    deduplication_token: bool,
    parallel_parsing_setting: bool,
    best_effort_dates: bool,
    row_binary_with_defaults: bool,
}

/// One encoded message.
struct Row {
    index: usize,
    bytes: Vec<u8>,
    /// Rows it makes in the request; `None` when unknown (multi-line text),
    /// which makes a row number in an error unusable.
    rows: Option<usize>,
}

impl ClickHouseSink {
    pub fn new(config: ClickHouseSinkConfig) -> Result<Self, PluginConfigError> {
        let base_url = config.validate()?;
        let display_url = format!(
            "{}://{}{}",
            base_url.scheme(),
            base_url.host_str().unwrap_or_default(),
            base_url
                .port()
                .map(|port| format!(":{port}"))
                .unwrap_or_default()
        );
        Ok(Self {
            base_url,
            display_url,
            client: None,
            server: Server::default(),
            columns: Vec::new(),
            key: "clickhouse".into(),
            config,
        })
    }

    fn table(&self) -> String {
        format!("`{}`.`{}`", self.config.database, self.config.table)
    }

    fn format_name(&self) -> &'static str {
        match self.config.insert_format {
            InsertFormat::JsonEachRow => "JSONEachRow",
            InsertFormat::RowBinary if self.server.row_binary_with_defaults => {
                "RowBinaryWithDefaults"
            }
            InsertFormat::RowBinary => "RowBinary",
            InsertFormat::String => self.config.string_format.clickhouse_name(),
        }
    }

    /// Runs a read query at open; the answer as text. No answer or a busy
    /// server is transient (the engine opens the sink again), a refusal
    /// fatal.
    async fn query(&self, client: &HttpClient, sql: &str) -> Result<String, ConnectorError> {
        self.post(client, self.base_url.clone(), Bytes::from(sql.to_owned()))
            .await
            .map_err(|(failure, _)| match failure {
                Failure::Transient { reason, .. } => ConnectorError::transient(reason),
                Failure::Refused(reason) | Failure::Fatal(reason) => {
                    ConnectorError::fatal(format!("{sql}: {reason}"))
                }
            })
    }

    /// One request: the answer's text, or how it failed with, for refused
    /// data, the row (1-based, within the request) the server named.
    async fn post(
        &self,
        client: &HttpClient,
        url: reqwest::Url,
        body: Bytes,
    ) -> Result<String, (Failure, Option<usize>)> {
        let request = client.request(reqwest::Method::POST, url, body);
        let answer = http::exchange(request, &self.display_url, MAX_RESPONSE_BYTES)
            .await
            .map_err(|failure| (failure, None))?;
        let text = answer.text();
        match answer::failure(&answer) {
            None => Ok(text.into_owned()),
            Some(failure) => Err((failure, answer::at_row(&text))),
        }
    }

    fn insert_url(&self, topic: &TopicRef, messages: &[SinkMessage], part: &[Row]) -> reqwest::Url {
        let mut url = self.base_url.clone();
        {
            let mut query = url.query_pairs_mut();
            query.append_pair("database", &self.config.database);
            query.append_pair(
                "query",
                &format!("INSERT INTO {} FORMAT {}", self.table(), self.format_name()),
            );
            if self.server.best_effort_dates {
                query.append_pair("date_time_input_format", "best_effort");
            }
            if self.server.parallel_parsing_setting {
                // Row numbers in errors are then counted from the request's start.
                query.append_pair("input_format_parallel_parsing", "0");
            }
            if self.server.deduplication_token {
                query.append_pair("insert_deduplication_token", &token(topic, messages, part));
            }
        }
        url
    }

    /// Sends `part` as one insert.
    async fn insert(
        &self,
        client: &HttpClient,
        topic: &TopicRef,
        messages: &[SinkMessage],
        part: &[Row],
    ) -> Result<(), (Failure, Option<usize>)> {
        let url = self.insert_url(topic, messages, part);
        let body: Vec<u8> = part
            .iter()
            .flat_map(|row| row.bytes.iter().copied())
            .collect();
        let bytes = body.len();
        let started = Instant::now();
        let outcome = self.post(client, url, Bytes::from(body)).await;
        if self.config.verbose_logging {
            debug!(connector_key = %self.key, url = %self.display_url, rows = part.len(), bytes, elapsed_ms = started.elapsed().as_millis() as u64, ok = outcome.is_ok(), "ClickHouse insert");
        }
        outcome.map(drop)
    }

    fn encode(&self, message: &SinkMessage) -> Result<(Vec<u8>, Option<usize>), String> {
        match self.config.insert_format {
            InsertFormat::JsonEachRow => {
                let mut bytes = match &message.payload {
                    Payload::Json(value) if value.is_object() => {
                        serde_json::to_vec(value).map_err(|error| error.to_string())?
                    }
                    Payload::JsonBytes(bytes)
                        if bytes.iter().find(|byte| !byte.is_ascii_whitespace()) == Some(&b'{') =>
                    {
                        bytes.to_vec()
                    }
                    Payload::Json(_) | Payload::JsonBytes(_) => {
                        return Err("expected a JSON object (insert_format json_each_row)".into());
                    }
                    other => {
                        return Err(format!(
                            "expected a JSON payload (insert_format json_each_row), found {}",
                            other.kind()
                        ));
                    }
                };
                bytes.push(b'\n');
                Ok((bytes, Some(1)))
            }
            InsertFormat::RowBinary => {
                let parsed;
                let value = match &message.payload {
                    Payload::Json(value) => value,
                    Payload::JsonBytes(bytes) => {
                        parsed = serde_json::from_slice::<serde_json::Value>(bytes)
                            .map_err(|error| format!("not JSON: {error}"))?;
                        &parsed
                    }
                    other => {
                        return Err(format!(
                            "expected a JSON payload (insert_format row_binary), found {}",
                            other.kind()
                        ));
                    }
                };
                let object = value
                    .as_object()
                    .ok_or("expected a JSON object (insert_format row_binary)")?;
                let mut bytes = Vec::new();
                row_binary::encode_row(
                    &self.columns,
                    object,
                    self.server.row_binary_with_defaults,
                    &mut bytes,
                )?;
                Ok((bytes, Some(1)))
            }
            InsertFormat::String => {
                let Payload::Text(text) = &message.payload else {
                    return Err(format!(
                        "expected a text payload (insert_format string), found {}",
                        message.payload.kind()
                    ));
                };
                let text = text.trim_end_matches(['\n', '\r']);
                if text.trim().is_empty() {
                    return Err("an empty text payload makes no row".into());
                }
                let mut bytes = text.as_bytes().to_vec();
                bytes.push(b'\n');
                // A line break inside a payload may start a row or sit inside
                // a quoted field: the count is then unknown.
                let rows = (!text.contains('\n')).then_some(1);
                Ok((bytes, rows))
            }
        }
    }

    /// Inserts `rows`, isolating what the server refuses. Short of `Ok`,
    /// the answer names the rows stored by the inserts that succeeded, the
    /// rows refused, and how the others failed.
    async fn insert_isolating(
        &self,
        client: &HttpClient,
        topic: &TopicRef,
        messages: &[SinkMessage],
        rows: Vec<Row>,
    ) -> Result<(), SinkError> {
        let mut durable = Vec::new();
        let mut rejected = Vec::new();
        let mut parts = vec![rows];
        while let Some(mut part) = parts.pop() {
            if part.is_empty() {
                continue;
            }
            let (reason, row) = match self.insert(client, topic, messages, &part).await {
                Ok(()) => {
                    durable.extend(part.iter().map(|row| row.index));
                    continue;
                }
                Err((Failure::Refused(reason), row)) => (reason, row),
                Err((failure, _)) => {
                    let mut outcome = Outcome::settled(durable, rejected);
                    outcome.fail(failure, []);
                    return outcome.into_result();
                }
            };
            if let Some(position) = row.and_then(|row| position_of_row(&part, row)) {
                let refused = part.remove(position);
                rejected.push(Rejection {
                    index: refused.index,
                    reason,
                });
                parts.push(part);
            } else if part.len() == 1 {
                rejected.push(Rejection {
                    index: part[0].index,
                    reason,
                });
            } else {
                let second = part.split_off(part.len() / 2);
                parts.push(second);
                parts.push(part);
            }
        }
        Outcome::settled(durable, rejected).into_result()
    }
}

/// Which row of `part` holds the request's row `row` (1-based).
fn position_of_row(part: &[Row], row: usize) -> Option<usize> {
    let mut seen = 0;
    for (position, item) in part.iter().enumerate() {
        seen += item.rows?;
        if row <= seen {
            return Some(position);
        }
    }
    None
}

/// The deduplication token of one insert: the same offsets, the same token.
fn token(topic: &TopicRef, messages: &[SinkMessage], part: &[Row]) -> String {
    let mut hash = Fnv::default();
    hash.write(topic.stream.as_bytes());
    hash.write(&[0]);
    hash.write(topic.topic.as_bytes());
    hash.write(&[0]);
    for row in part {
        let message = &messages[row.index];
        hash.write(&message.partition_id.to_le_bytes());
        hash.write(&message.offset.to_le_bytes());
    }
    let first = &messages[part[0].index];
    let last = &messages[part[part.len() - 1].index];
    format!(
        "iggy-{}-{}-{}-{}-{:016x}",
        first.partition_id,
        first.offset,
        last.offset,
        part.len(),
        hash.0
    )
}

/// FNV-1a, 64 bits: stable across builds and platforms (a token must be the
/// same after a restart).
struct Fnv(u64);

impl Default for Fnv {
    fn default() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }
}

#[async_trait]
impl Sink for ClickHouseSink {
    /// JSON is sent as stored, except that `row_binary` reads its fields.
    fn accepts_json_bytes(&self) -> bool {
        self.config.insert_format != InsertFormat::RowBinary
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let options = ClientOptions {
            timeout: self.config.timeout(),
            auth: Auth::Basic {
                username: self.config.username.clone(),
                password: self.config.password.clone(),
            },
            ..ClientOptions::default()
        };
        let client =
            HttpClient::new(&options).map_err(|error| ConnectorError::fatal(error.to_string()))?;
        let version = self.query(&client, "SELECT version()").await?;
        let settings = self
            .query(
                &client,
                "SELECT name FROM system.settings WHERE name IN ('insert_deduplication_token', 'input_format_parallel_parsing', 'date_time_input_format') FORMAT TabSeparated",
            )
            .await?;
        let settings: HashSet<&str> = settings.lines().map(str::trim).collect();
        self.server.deduplication_token = settings.contains("insert_deduplication_token");
        self.server.parallel_parsing_setting = settings.contains("input_format_parallel_parsing");
        self.server.best_effort_dates = settings.contains("date_time_input_format");
        let columns = self
            .query(
                &client,
                &format!(
                    "SELECT name, type, default_kind FROM system.columns WHERE database = '{}' AND table = '{}' FORMAT TabSeparated",
                    self.config.database, self.config.table
                ),
            )
            .await?;
        if columns.trim().is_empty() {
            return Err(ConnectorError::fatal(format!(
                "the table {}.{} does not exist on {} (plugin_config.database and plugin_config.table): create it first",
                self.config.database, self.config.table, self.display_url
            )));
        }
        if self.config.insert_format == InsertFormat::RowBinary {
            let formats = self
                .query(
                    &client,
                    "SELECT name FROM system.formats WHERE name = 'RowBinaryWithDefaults' FORMAT TabSeparated",
                )
                .await?;
            self.server.row_binary_with_defaults = formats.trim() == "RowBinaryWithDefaults";
            self.columns = parse_columns(&columns)?;
        }
        info!(connector_key = %self.key, url = %self.display_url, table = %self.table(), server_version = %version.trim(), format = self.format_name(), deduplication_token = self.server.deduplication_token, "clickhouse sink open");
        if !self.server.deduplication_token {
            info!(connector_key = %self.key, "this ClickHouse has no insert_deduplication_token: a replayed batch is deduplicated only by Replicated*MergeTree tables");
        }
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the clickhouse sink was not opened"))?;
        let mut rows = Vec::with_capacity(messages.len());
        let mut refused = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.encode(message) {
                Ok((bytes, count)) => rows.push(Row {
                    index,
                    bytes,
                    rows: count,
                }),
                Err(reason) => refused.push(Rejection { index, reason }),
            }
        }
        // Nothing is sent: the engine writes the rest again without them.
        if !refused.is_empty() {
            return Err(SinkError::Rejected(refused));
        }
        self.insert_isolating(client, topic, messages, rows).await
    }

    /// `retry_delay` (seconds, doubling, at most 30 s) spaces the engine's
    /// retries; `max_retries` failed writes in a row report the sink degraded.
    fn retry(&self) -> Option<RetrySettings> {
        Some(self.config.retry_settings())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}

/// The insertable columns of a `system.columns` answer (name, type,
/// default_kind per line); MATERIALIZED and ALIAS columns take no value.
fn parse_columns(text: &str) -> Result<Vec<Column>, ConnectorError> {
    let mut columns = Vec::new();
    for line in text.lines().filter(|line| !line.is_empty()) {
        let mut fields = line.split('\t');
        let (Some(name), Some(kind)) = (fields.next(), fields.next()) else {
            return Err(ConnectorError::fatal(format!(
                "unexpected system.columns line: {line:?}"
            )));
        };
        let default_kind = fields.next().unwrap_or("");
        if matches!(default_kind, "MATERIALIZED" | "ALIAS" | "EPHEMERAL") {
            continue;
        }
        let kind = row_binary::parse_type(kind).map_err(|reason| {
            ConnectorError::fatal(format!(
                "column `{name}`: {reason} (plugin_config.insert_format: use json_each_row for this table)"
            ))
        })?;
        columns.push(Column {
            name: name.to_owned(),
            kind,
            has_default: !default_kind.is_empty(),
        });
    }
    Ok(columns)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(index: usize, rows: Option<usize>) -> Row {
        Row {
            index,
            bytes: Vec::new(),
            rows,
        }
    }

    #[test]
    fn given_row_counts_when_a_row_is_named_should_find_its_message() {
        let part = [row(4, Some(1)), row(5, Some(1)), row(9, Some(1))];
        assert_eq!(position_of_row(&part, 1), Some(0));
        assert_eq!(position_of_row(&part, 3), Some(2));
        assert_eq!(position_of_row(&part, 4), None);
        let unknown = [row(0, Some(1)), row(1, None)];
        assert_eq!(position_of_row(&unknown, 1), Some(0));
        assert_eq!(position_of_row(&unknown, 2), None);
    }

    #[test]
    fn given_the_same_offsets_when_tokened_should_give_the_same_token() {
        let topic = TopicRef {
            stream: "s".into(),
            topic: "t".into(),
        };
        let messages: Vec<SinkMessage> = (0..3)
            .map(|offset| SinkMessage {
                id: 1,
                offset,
                partition_id: 1,
                timestamp: 0,
                origin_timestamp: 0,
                checksum: 0,
                headers: Vec::new(),
                payload: Payload::Text("x".into()),
            })
            .collect();
        let all = [row(0, Some(1)), row(1, Some(1)), row(2, Some(1))];
        let gap = [row(0, Some(1)), row(2, Some(1))];
        assert_eq!(
            token(&topic, &messages, &all),
            token(&topic, &messages, &all)
        );
        assert_ne!(
            token(&topic, &messages, &all),
            token(&topic, &messages, &gap)
        );
        assert!(token(&topic, &messages, &gap).starts_with("iggy-1-0-2-2-"));
    }

    #[test]
    fn given_columns_with_an_unsupported_type_when_parsed_should_fail_naming_it() {
        let error = parse_columns("id\tUInt64\t\nprice\tDecimal(9, 2)\t\n").unwrap_err();
        assert!(error.to_string().contains("`price`"), "{error}");
        let columns =
            parse_columns("id\tUInt64\t\nm\tUInt64\tMATERIALIZED\nd\tString\tDEFAULT\n").unwrap();
        assert_eq!(columns.len(), 2);
        assert!(columns[1].has_default);
    }
}
