//! `doris` sink: loads messages into an Apache Doris table through Stream
//! Load (`PUT /api/{db}/{table}/_stream_load` on a frontend, `Expect:
//! 100-continue`, the frontend's 307 to a backend followed by the sink after
//! checking where it goes).
//!
//! Idempotency: each load carries a label derived from the target, the
//! topic, the partition and the first and last offsets of its messages
//! (`{prefix}-{stream}-{topic}-{hash16}-{partition}-{first}-{last}`), the
//! same on every replay of those offsets, so Doris loads a retried batch
//! once (`Label Already Exists` with a finished job counts as written) for
//! as long as it keeps labels (`label_keep_max_second`, 3 days by default).
//! A replay that groups other offsets into one load (a batch cut elsewhere
//! after a restart) gets a new label and is loaded again: use a Unique Key
//! table to make that harmless.
//!
//! Answers: each load is sent once. `Success`, `Publish Timeout`
//! (committed, not yet visible) and `Label Already Exists` of a finished job
//! are written. 408, 429, 5xx (with their `Retry-After`), a transport error,
//! an empty answer and a label whose job is still running or was cancelled
//! end the write as transient, naming the loads already written: the engine
//! loads the rest again, the same rows under the same labels. 401/403 and an
//! unknown database or table are fatal. `Fail` for unfit rows (Doris loads
//! nothing then): the rows its error log (`ErrorURL`) quotes are rejected by
//! index for `on_error` and the others loaded again at once, in a load of
//! their own; when the log names none of them the batch fails as fatal with
//! the URL. Other refusals
//! are fatal with Doris's message.

mod config;

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, LOCATION};
use serde_json::Value;
use tracing::{debug, info, warn};

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Answer, Auth, ClientOptions, HttpClient};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Rejection, RetrySettings, Sink, SinkEntry,
    SinkError, parse_plugin_config, schema_of,
};
use crate::message::{Payload, SinkMessage, TopicRef};

pub use config::{DorisSinkConfig, OutputFormat};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "doris",
    feature: "doris-sink",
    description: "loads messages into an Apache Doris table through Stream Load (deterministic labels)",
    secret_fields: &["password"],
    sample_config: "fe_url = \"http://localhost:8030\"\ndatabase = \"iggy_demo\"\ntable = \"events\"\nusername = \"root\"\npassword = \"secret\"\nlabel_prefix = \"iggy\"\nbatch_size = 1000\ntimeout = \"30s\"\n",
    config_schema: schema_of::<DorisSinkConfig>,
    build: |config| Ok(Box::new(DorisSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// Redirects followed for one load at most (upstream's bound).
const MAX_REDIRECTS: usize = 5;
const MAX_ANSWER_BYTES: usize = 1024 * 1024;
/// CSV framing (control characters, as upstream): they cannot appear in
/// values a JSON text turns into.
const CSV_COLUMN_SEPARATOR: &str = "\\x01";
const CSV_LINE_DELIMITER: &str = "\\x02";

pub struct DorisSink {
    config: DorisSinkConfig,
    load_url: reqwest::Url,
    csv_columns: Vec<String>,
    client: Option<HttpClient>,
    key: String,
}

/// One message as the text of its row in the load body.
#[derive(Clone)]
struct Row {
    index: usize,
    offset: u64,
    text: String,
}

/// Rows of a load Doris refused as unfit: their batch indexes, and why.
struct Unfit {
    indexes: Vec<usize>,
    reason: String,
}

impl DorisSink {
    pub fn new(config: DorisSinkConfig) -> Result<Self, PluginConfigError> {
        let (load_url, csv_columns) = config.validate()?;
        Ok(Self {
            load_url,
            csv_columns,
            client: None,
            key: "doris".into(),
            config,
        })
    }

    fn client(&self) -> Result<&HttpClient, SinkError> {
        self.client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the doris sink was not opened"))
    }

    /// A message as one row: its compact JSON object, or its CSV line.
    fn encode(&self, message: &SinkMessage) -> Result<String, String> {
        let parsed;
        let value = match &message.payload {
            Payload::Json(value) => value,
            Payload::JsonBytes(bytes) => {
                parsed = serde_json::from_slice::<serde_json::Value>(bytes)
                    .map_err(|error| format!("the payload is not JSON: {error}"))?;
                &parsed
            }
            other => {
                return Err(format!(
                    "expected a JSON object payload (schema json), found {}",
                    other.kind()
                ));
            }
        };
        let Some(object) = value.as_object() else {
            return Err("expected a JSON object: a row of the table".into());
        };
        match self.config.output_format {
            OutputFormat::Json => serde_json::to_string(object).map_err(|error| error.to_string()),
            OutputFormat::Csv => Ok(self
                .csv_columns
                .iter()
                .map(|column| csv_field(object.get(column)))
                .collect::<Vec<_>>()
                .join("\x01")),
        }
    }

    /// The label of a load of `rows` of `partition`: stable for the same
    /// target, topic and offsets, at most 120 characters of `[-_A-Za-z0-9]`.
    fn label(&self, topic: &TopicRef, partition: u32, rows: &[Row]) -> String {
        let first = rows.first().map_or(0, |row| row.offset);
        let last = rows.last().map_or(0, |row| row.offset);
        let mut hash: u64 = 0xcbf29ce484222325;
        for part in [
            self.config.label_prefix.as_str(),
            &self.config.database,
            &self.config.table,
            &topic.stream,
            &topic.topic,
        ] {
            for byte in (part.len() as u64)
                .to_le_bytes()
                .into_iter()
                .chain(part.bytes())
            {
                hash ^= u64::from(byte);
                hash = hash.wrapping_mul(0x100000001b3);
            }
        }
        format!(
            "{}-{}-{}-{hash:016x}-{partition}-{first}-{last}",
            label_part(&self.config.label_prefix),
            label_part(&topic.stream),
            label_part(&topic.topic)
        )
    }

    fn headers(&self, label: &str) -> Result<HeaderMap, String> {
        let mut headers = HeaderMap::new();
        let mut add = |name: &'static str, value: &str| -> Result<(), String> {
            let value = HeaderValue::from_str(value).map_err(|_| {
                format!("plugin_config.{name} holds characters a header cannot carry")
            })?;
            headers.insert(HeaderName::from_static(name), value);
            Ok(())
        };
        add("expect", "100-continue")?;
        add("label", label)?;
        match self.config.output_format {
            OutputFormat::Json => {
                add("format", "json")?;
                add("strip_outer_array", "true")?;
            }
            OutputFormat::Csv => {
                add("format", "csv")?;
                add("column_separator", CSV_COLUMN_SEPARATOR)?;
                add("line_delimiter", CSV_LINE_DELIMITER)?;
                add("enclose", "\"")?;
                add("escape", "\\")?;
            }
        }
        if let Some(columns) = &self.config.columns {
            add("columns", columns)?;
        }
        if let Some(filter) = &self.config.where_clause {
            add("where", filter)?;
        }
        if let Some(ratio) = self.config.max_filter_ratio {
            add("max_filter_ratio", &ratio.to_string())?;
        }
        Ok(headers)
    }

    fn body(&self, rows: &[Row]) -> Bytes {
        let texts = rows.iter().map(|row| row.text.as_str());
        Bytes::from(match self.config.output_format {
            OutputFormat::Json => format!("[{}]", texts.collect::<Vec<_>>().join(",")),
            OutputFormat::Csv => texts.collect::<Vec<_>>().join("\x02"),
        })
    }

    /// Loads `rows` (one part of a partition) in one load under their label
    /// and notes the answer. Doris loads nothing of a load with unfit rows:
    /// those are rejected and the others loaded again in a load of their own.
    async fn load_part(
        &self,
        client: &HttpClient,
        topic: &TopicRef,
        partition: u32,
        rows: &[Row],
        outcome: &mut Outcome,
    ) {
        let label = self.label(topic, partition, rows);
        let indexes = rows.iter().map(|row| row.index);
        match self.load(client, &label, rows).await {
            Ok(None) => outcome.durable(indexes),
            Ok(Some(Unfit { indexes, reason })) => {
                for index in &indexes {
                    outcome.reject(*index, reason.clone());
                }
                // Rare: the rows of a refused load, without the unfit ones.
                let fit: Vec<Row> = rows
                    .iter()
                    .filter(|row| !indexes.contains(&row.index))
                    .cloned()
                    .collect();
                if !fit.is_empty() {
                    Box::pin(self.load_part(client, topic, partition, &fit, outcome)).await;
                }
            }
            Err(failure) => outcome.fail(failure, indexes),
        }
    }

    /// Loads `rows` under `label` with one PUT: `None` when they are loaded,
    /// the unfit rows when Doris refused the load for them.
    async fn load(
        &self,
        client: &HttpClient,
        label: &str,
        rows: &[Row],
    ) -> Result<Option<Unfit>, Failure> {
        let headers = self.headers(label).map_err(Failure::Fatal)?;
        let (url, answer) = self.put(client, &headers, self.body(rows)).await?;
        let shown = show(&url);
        let body = stream_load_answer(&shown, &answer)?;
        let message = body["Message"]
            .as_str()
            .or(body["msg"].as_str())
            .unwrap_or_default();
        match body["Status"]
            .as_str()
            .or(body["status"].as_str())
            .unwrap_or_default()
        {
            "Success" | "Publish Timeout" => {
                let filtered = body["NumberFilteredRows"].as_u64().unwrap_or(0);
                if filtered > 0 {
                    warn!(connector_key = %self.key, filtered, error_url = body["ErrorURL"].as_str().unwrap_or_default(), "Doris filtered rows out of a load (max_filter_ratio allows it): they are not in the table");
                }
                debug!(connector_key = %self.key, label = body["Label"].as_str().unwrap_or_default(), loaded = body["NumberLoadedRows"].as_u64().unwrap_or(0), "Doris Stream Load done");
                Ok(None)
            }
            "Label Already Exists" => {
                match body["ExistingJobStatus"].as_str().unwrap_or_default() {
                    "FINISHED" | "VISIBLE" | "COMMITTED" => Ok(None),
                    "RUNNING" | "PREPARE" | "CANCELLED" | "ABORTED" => {
                        Err(Failure::transient(format!(
                            "{shown}: the earlier load under label {label} is {}",
                            body["ExistingJobStatus"]
                        )))
                    }
                    other => Err(Failure::Fatal(format!(
                        "{shown}: Label Already Exists with an unknown job status {other:?}"
                    ))),
                }
            }
            "Fail" => self
                .unfit(client, &shown, message, &body, rows)
                .await
                .map(Some),
            other => Err(Failure::Fatal(format!(
                "{shown}: unknown Stream Load status {other:?}: {message}"
            ))),
        }
    }

    /// One PUT, following the frontend's redirects once checked; the URL
    /// that answered and its answer.
    async fn put(
        &self,
        client: &HttpClient,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<(reqwest::Url, Answer), Failure> {
        let mut url = self.load_url.clone();
        for _ in 0..=MAX_REDIRECTS {
            let response = client
                .request(reqwest::Method::PUT, url.clone(), body.clone())
                .headers(headers.clone())
                .send()
                .await
                .map_err(|error| http::no_answer(&show(&url), error))?;
            if !matches!(response.status().as_u16(), 307 | 308) {
                let answer = Answer::read(response, &show(&url), MAX_ANSWER_BYTES).await?;
                return Ok((url, answer));
            }
            let location = response
                .headers()
                .get(LOCATION)
                .and_then(|value| value.to_str().ok())
                .unwrap_or_default();
            url = check_redirect(
                &url,
                location,
                self.config.allow_insecure_redirect,
                self.config
                    .allowed_redirect_hosts
                    .as_deref()
                    .unwrap_or_default(),
            )
            .map_err(Failure::Fatal)?;
        }
        Err(Failure::Fatal(format!(
            "{} redirected more than {MAX_REDIRECTS} times",
            show(&self.load_url)
        )))
    }

    /// The batch indexes of the rows a `Fail` refused as unfit, from its
    /// error log, and why; fatal when the answer names no table or none of
    /// the rows.
    async fn unfit(
        &self,
        client: &HttpClient,
        shown: &str,
        message: &str,
        body: &Value,
        rows: &[Row],
    ) -> Result<Unfit, Failure> {
        let lower = message.to_ascii_lowercase();
        if lower.contains("unknown database")
            || lower.contains("unknown table")
            || lower.contains("does not exist")
        {
            return Err(Failure::Fatal(format!(
                "{shown} refused the load: {message} (check plugin_config.database and table: they must exist)"
            )));
        }
        let Some(error_url) = body["ErrorURL"].as_str().filter(|url| !url.is_empty()) else {
            return Err(Failure::Fatal(format!(
                "{shown} refused the load: {message} (check plugin_config.columns, where and the table's schema)"
            )));
        };
        let named = self.unfit_rows(client, error_url, rows).await;
        if named.is_empty() {
            return Err(Failure::Fatal(format!(
                "{shown} refused the load for unfit rows but its error log {error_url} names none of them: {message}"
            )));
        }
        Ok(Unfit {
            indexes: named
                .into_iter()
                .map(|position| rows[position].index)
                .collect(),
            reason: format!("Doris refused the row: {message} (error log {error_url})"),
        })
    }

    /// Positions of the rows the error log quotes (`src line [...]`).
    async fn unfit_rows(&self, client: &HttpClient, error_url: &str, rows: &[Row]) -> Vec<usize> {
        // The log is on a backend too: the same checks before credentials go there.
        let Ok(url) = check_redirect(
            &self.load_url,
            error_url,
            self.config.allow_insecure_redirect,
            self.config
                .allowed_redirect_hosts
                .as_deref()
                .unwrap_or_default(),
        ) else {
            return Vec::new();
        };
        let request = client.empty(reqwest::Method::GET, url);
        let log = match http::exchange(request, error_url, MAX_ANSWER_BYTES).await {
            Ok(answer) if answer.is_success() => answer.text().into_owned(),
            _ => return Vec::new(),
        };
        // `Reason: ... src line [<row>]; ` per unfit row.
        let quoted: Vec<&str> = log
            .split("src line [")
            .skip(1)
            .filter_map(|rest| rest.rsplit_once("];").map(|(line, _)| line))
            .collect();
        rows.iter()
            .enumerate()
            .filter(|(_, row)| quoted.contains(&row.text.as_str()))
            .map(|(position, _)| position)
            .collect()
    }
}

/// The JSON a frontend or backend answers a load with, or what its absence
/// means.
fn stream_load_answer(shown: &str, answer: &Answer) -> Result<Value, Failure> {
    if !answer.is_success() {
        return Err(refusal(shown, answer));
    }
    let text = answer.text();
    if text.trim().is_empty() {
        // The load may have happened: the same label tells on the retry.
        return Err(Failure::transient(format!(
            "{shown} answered {} without a body",
            answer.status
        )));
    }
    serde_json::from_str(&text).map_err(|_| {
        Failure::Fatal(format!(
            "{} (not a Stream Load answer)",
            answer.reason(shown)
        ))
    })
}

/// What a load answered with a status that is not a success means: bad
/// credentials and a missing table are fatal, 408/429/5xx transient (after
/// the `Retry-After` asked for), any other refusal fatal.
fn refusal(shown: &str, answer: &Answer) -> Failure {
    let reason = answer.reason(shown);
    match answer.status {
        401 | 403 => Failure::Fatal(format!(
            "{reason} (check plugin_config.username/password and the user's LOAD_PRIV on the table)"
        )),
        404 => Failure::Fatal(format!(
            "{reason} (check plugin_config.database and table: they must exist)"
        )),
        _ => match answer.failure(shown) {
            Failure::Refused(reason) => Failure::Fatal(reason),
            failure => failure,
        },
    }
}

/// Where a redirect may go: an absolute http(s) URL, not from https to
/// http unless allowed, and on the allow-list when there is one.
fn check_redirect(
    from: &reqwest::Url,
    location: &str,
    allow_insecure: bool,
    allowed_hosts: &[String],
) -> Result<reqwest::Url, String> {
    let to = reqwest::Url::parse(location).map_err(|_| {
        format!(
            "{} redirected to {location:?}, not an absolute URL: refused",
            show(from)
        )
    })?;
    if !matches!(to.scheme(), "http" | "https") {
        return Err(format!(
            "{} redirected to a {} URL: refused",
            show(from),
            to.scheme()
        ));
    }
    if from.scheme() == "https" && to.scheme() == "http" && !allow_insecure {
        return Err(format!(
            "{} redirected to {}, from https to http: refused, the credentials would cross in clear text (plugin_config.allow_insecure_redirect = true allows it)",
            show(from),
            show(&to)
        ));
    }
    let host = to.host_str().unwrap_or_default();
    let port = to.port_or_known_default().unwrap_or_default();
    if !allowed_hosts.is_empty()
        && !allowed_hosts.iter().any(|allowed| {
            let allowed = allowed.trim();
            allowed.eq_ignore_ascii_case(host)
                || allowed.eq_ignore_ascii_case(&format!("{host}:{port}"))
        })
    {
        return Err(format!(
            "{} redirected to {host}:{port}, which plugin_config.allowed_redirect_hosts does not list: refused",
            show(from)
        ));
    }
    Ok(to)
}

/// A URL without its query (labels and such stay out of messages).
fn show(url: &reqwest::Url) -> String {
    format!("{}{}", url.origin().ascii_serialization(), url.path())
}

/// A name as a label part: `[A-Za-z0-9_]` kept, the rest `_`, at most 16.
fn label_part(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(16)
        .collect()
}

/// A JSON value as a CSV field: `\N` for null or missing, strings and
/// nested values enclosed in `"` (with `\` escaping `"` and `\`).
fn csv_field(value: Option<&serde_json::Value>) -> String {
    let enclose = |text: &str| format!("\"{}\"", text.replace('\\', "\\\\").replace('"', "\\\""));
    match value {
        None | Some(serde_json::Value::Null) => "\\N".into(),
        Some(serde_json::Value::String(text)) => enclose(text),
        Some(serde_json::Value::Bool(flag)) => flag.to_string(),
        Some(serde_json::Value::Number(number)) => number.to_string(),
        Some(nested) => enclose(&nested.to_string()),
    }
}

#[async_trait]
impl Sink for DorisSink {
    fn accepts_json_bytes(&self) -> bool {
        true
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    /// `retry_delay`, doubling up to `max_retry_delay`, as the engine's wait
    /// between loads of what is not written yet (the same rows under the
    /// same labels); after `max_retries` consecutive failed writes the
    /// engine reports the sink degraded.
    fn retry(&self) -> Option<RetrySettings> {
        Some(RetrySettings::doubling(
            self.config.retry_delay,
            self.config.max_retry_delay,
            self.config.max_retries.max(1),
        ))
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let options = ClientOptions {
            timeout: self.config.timeout,
            connect_timeout: Some(self.config.connect_timeout),
            auth: Auth::Basic {
                username: self.config.username.clone(),
                password: self.config.password.clone(),
            },
            follow_redirects: false,
            ..ClientOptions::default()
        };
        let client =
            HttpClient::new(&options).map_err(|error| ConnectorError::fatal(error.to_string()))?;
        if self.load_url.scheme() == "http"
            && !matches!(
                self.load_url.host_str(),
                Some("localhost" | "127.0.0.1" | "[::1]")
            )
        {
            warn!(connector_key = %self.key, url = %show(&self.load_url), "fe_url is plain http: the credentials cross in clear text");
        }
        info!(connector_key = %self.key, url = %show(&self.load_url), format = ?self.config.output_format, "doris sink open");
        self.client = Some(client);
        Ok(())
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self.client()?;
        let mut by_partition: BTreeMap<u32, Vec<Row>> = BTreeMap::new();
        let mut refused = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            match self.encode(message) {
                Ok(text) => by_partition
                    .entry(message.partition_id)
                    .or_default()
                    .push(Row {
                        index,
                        offset: message.offset,
                        text,
                    }),
                Err(reason) => refused.push(Rejection { index, reason }),
            }
        }
        // Nothing loaded: the engine writes the rest again without these.
        if !refused.is_empty() {
            return Err(SinkError::Rejected(refused));
        }
        let size = self.config.batch_size as usize;
        let parts: Vec<(u32, &[Row])> = by_partition
            .iter()
            .flat_map(|(partition, rows)| rows.chunks(size).map(|part| (*partition, part)))
            .collect();
        let mut outcome = Outcome::default();
        for (partition, part) in parts {
            if outcome.stopped() {
                break;
            }
            self.load_part(client, topic, partition, part, &mut outcome)
                .await;
        }
        outcome.into_result()
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink(extra: serde_json::Value) -> DorisSink {
        let mut config = serde_json::json!({"fe_url": "http://fe:8030", "database": "d", "table": "t", "username": "root", "password": ""});
        config
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        DorisSink::new(parse_plugin_config(&config).unwrap()).unwrap()
    }

    fn rows(offsets: std::ops::Range<u64>) -> Vec<Row> {
        offsets
            .map(|offset| Row {
                index: offset as usize,
                offset,
                text: String::new(),
            })
            .collect()
    }

    #[test]
    fn given_the_same_offsets_when_labelled_should_give_the_same_label_and_others_another() {
        let sink = sink(serde_json::json!({}));
        let topic = TopicRef {
            stream: "a stream/with.signs".into(),
            topic: "t".into(),
        };
        let label = sink.label(&topic, 2, &rows(10..20));
        assert_eq!(label, sink.label(&topic, 2, &rows(10..20)));
        assert!(label.starts_with("iggy-a_stream_with_si-t-"), "{label}");
        assert!(label.ends_with("-2-10-19"), "{label}");
        assert_ne!(label, sink.label(&topic, 2, &rows(10..21)));
        assert_ne!(label, sink.label(&topic, 3, &rows(10..20)));
        let other_table = self::sink(serde_json::json!({"table": "t2"}));
        assert_ne!(label, other_table.label(&topic, 2, &rows(10..20)));
        let long = TopicRef {
            stream: "s".repeat(300),
            topic: "t".repeat(300),
        };
        let long_label = sink.label(&long, u32::MAX, &rows(u64::MAX - 1..u64::MAX));
        assert!(long_label.len() <= 128, "{}", long_label.len());
    }

    #[test]
    fn given_redirects_when_checked_should_refuse_downgrades_relative_urls_and_unlisted_hosts() {
        let https = reqwest::Url::parse("https://fe:8030/api/d/t/_stream_load").unwrap();
        assert!(check_redirect(&https, "https://be:8040/x", false, &[]).is_ok());
        let error = check_redirect(&https, "http://be:8040/x", false, &[]).unwrap_err();
        assert!(error.contains("allow_insecure_redirect"), "{error}");
        assert!(check_redirect(&https, "http://be:8040/x", true, &[]).is_ok());
        assert!(check_redirect(&https, "/api/d/t/_stream_load", false, &[]).is_err());
        let listed = vec!["be".to_owned(), "other:9".to_owned()];
        assert!(check_redirect(&https, "https://be:8040/x", false, &listed).is_ok());
        assert!(check_redirect(&https, "https://other:9/x", false, &listed).is_ok());
        let error = check_redirect(&https, "https://other:8040/x", false, &listed).unwrap_err();
        assert!(error.contains("allowed_redirect_hosts"), "{error}");
    }

    #[test]
    fn given_json_values_when_written_as_csv_should_follow_the_enclose_and_escape_rules() {
        let sink =
            sink(serde_json::json!({"output_format": "csv", "columns": "id,name,tags,gone"}));
        let message = SinkMessage {
            id: 1,
            offset: 0,
            partition_id: 1,
            timestamp: 0,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload: Payload::Json(
                serde_json::json!({"id": 7, "name": "a \"b\" \\ c", "tags": [1], "extra": true}),
            ),
        };
        assert_eq!(
            sink.encode(&message).unwrap(),
            "7\x01\"a \\\"b\\\" \\\\ c\"\x01\"[1]\"\x01\\N"
        );
        let text = SinkMessage {
            payload: Payload::Text("x".into()),
            ..message
        };
        assert!(sink.encode(&text).unwrap_err().contains("JSON"));
    }
}
