//! `surrealdb` sink: writes messages as records of a SurrealDB table over
//! its HTTP API (reqwest through the kit; no SDK crate).
//!
//! Every record has upstream's deterministic id (stream, topic, partition,
//! offset, message id) and is written with `INSERT IGNORE`, so a replayed
//! batch leaves the stored records as they are and writes nothing twice.
//! Records travel as JSON in the query's variables (`POST /rpc`, method
//! `query`, one `INSERT IGNORE INTO <table> $rN RETURN NONE` statement per
//! record, no transaction): nothing from a payload becomes SurrealQL text,
//! and each statement has its own result, so a record SurrealDB refuses (a
//! field's type, a unique index) is rejected by its index for `on_error`
//! while the others are written. `write` returns `Ok` once every statement
//! answered `OK`.
//!
//! Each request is sent once. Connection errors, timeouts, 408/429/5xx
//! (with `Retry-After`) and statements SurrealDB says can be retried end the
//! write as transient, naming the records already stored: the engine writes
//! the rest again after that wait or its backoff (a record stored by a
//! request whose answer was lost is ignored then). A request over
//! SurrealDB's body limit (413) is split in two. Credentials refused (at
//! `POST /signin` or later), a missing
//! namespace, database or table (strict mode) that `auto_define_table` does
//! not create, and a request SurrealDB refuses as a whole are fatal, naming
//! the field to fix. DDL and the open-time check go through `POST /sql`.

mod config;
mod record;

use async_trait::async_trait;
use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::{debug, info, warn};

use crate::connectors::kit::failure::Failure;
use crate::connectors::kit::http::{self, Auth, ClientOptions, HttpClient, StatusClass};
use crate::connectors::kit::outcome::Outcome;
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, RetrySettings, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};

pub use config::{AuthScope, PayloadFormat, SurrealdbSinkConfig};
pub use record::record_id;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "surrealdb",
    feature: "surrealdb-sink",
    description: "writes records to a SurrealDB table over HTTP (INSERT IGNORE with deterministic record ids: replays write nothing twice)",
    secret_fields: &["password"],
    sample_config: "endpoint = \"127.0.0.1:8000\"\nnamespace = \"iggy\"\ndatabase = \"connectors\"\ntable = \"iggy_messages\"\nusername = \"root\"\npassword = \"secret\"\nauto_define_table = true\n",
    config_schema: schema_of::<SurrealdbSinkConfig>,
    build: |config| Ok(Box::new(SurrealdbSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// How much of an error message goes into a reason.
const REASON_CHARS: usize = 300;
/// Answers are read up to this much (a statement's result is ~60 bytes).
const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

pub struct SurrealdbSink {
    config: SurrealdbSinkConfig,
    base: reqwest::Url,
    /// `table`, escaped as a SurrealQL identifier.
    table: String,
    client_options: ClientOptions,
    client: Option<HttpClient>,
    key: String,
}

/// One statement's result, as `/sql` and the RPC `query` method answer it.
#[derive(Debug, Deserialize)]
struct Statement {
    status: String,
    #[serde(default)]
    result: Value,
    #[serde(default)]
    detail: Option<String>,
}

impl Statement {
    fn ok(&self) -> bool {
        self.status.eq_ignore_ascii_case("OK")
    }

    fn message(&self) -> String {
        let message = match (&self.detail, &self.result) {
            (Some(detail), _) => detail.clone(),
            (None, Value::String(text)) => text.clone(),
            (None, other) => other.to_string(),
        };
        shorten(&message)
    }
}

impl SurrealdbSink {
    pub fn new(config: SurrealdbSinkConfig) -> Result<Self, PluginConfigError> {
        let base = config.validate()?;
        let auth = match (&config.auth_scope, &config.username, &config.password) {
            (AuthScope::None, _, _) => Auth::None,
            (_, Some(username), Some(password)) => Auth::Basic {
                username: username.clone(),
                password: password.clone(),
            },
            _ => Auth::None,
        };
        let mut headers = HeaderMap::new();
        headers.insert(ACCEPT, HeaderValue::from_static("application/json"));
        // Basic auth of a namespace or database user names where it is defined.
        let levels: &[(&str, &str, &str)] = match config.auth_scope {
            AuthScope::Namespace => &[("surreal-auth-ns", "namespace", &config.namespace)],
            AuthScope::Database => &[
                ("surreal-auth-ns", "namespace", &config.namespace),
                ("surreal-auth-db", "database", &config.database),
            ],
            AuthScope::Root | AuthScope::None => &[],
        };
        for (name, field, value) in levels {
            headers.insert(HeaderName::from_static(name), header_value(field, value)?);
        }
        let client_options = ClientOptions {
            timeout: config.query_timeout,
            ca_file: config.tls_ca_file.clone(),
            accept_invalid_certs: config.tls_danger_accept_invalid_certs,
            auth,
            headers,
            ..ClientOptions::default()
        };
        // Checked here so `write` can rely on them.
        header_value("namespace", &config.namespace)?;
        header_value("database", &config.database)?;
        Ok(Self {
            table: ident(&config.table),
            base,
            client_options,
            client: None,
            key: "surrealdb".into(),
            config,
        })
    }

    fn url(&self, path: &str) -> Result<reqwest::Url, Failure> {
        self.base
            .join(path)
            .map_err(|error| Failure::Fatal(format!("{path}: {error}")))
    }

    fn credentials_refused(&self, what: &str) -> String {
        format!(
            "{what}: SurrealDB refuses the credentials: check username and password, and that the user is a {} user allowed to write (auth_scope)",
            scope_name(self.config.auth_scope)
        )
    }

    /// Sends `request` once; the body of a 2xx answer. A 413 (the body is
    /// over SurrealDB's limit) is `Refused`: split, the records may pass.
    async fn send(&self, request: reqwest::RequestBuilder, what: &str) -> Result<Bytes, Failure> {
        let answer = http::exchange(request, self.base.as_str(), MAX_ANSWER_BYTES)
            .await
            .map_err(|failure| Failure::transient(format!("{what}: {}", failure.reason())))?;
        if answer.is_success() {
            return Ok(answer.body);
        }
        let reason = format!(
            "{what}: answered {} {}",
            answer.status,
            error_text(&answer.body)
        );
        Err(match answer.status {
            401 | 403 => Failure::Fatal(self.credentials_refused(&reason)),
            413 => Failure::Refused(reason),
            status if http::classify(status) == StatusClass::Transient => Failure::Transient {
                reason,
                retry_after: answer.retry_after,
            },
            _ => Failure::Fatal(format!(
                "{reason}; SurrealDB refuses the request as a whole"
            )),
        })
    }

    async fn signin(&self, client: &HttpClient) -> Result<(), Failure> {
        let (Some(username), Some(password)) = (&self.config.username, &self.config.password)
        else {
            return Ok(());
        };
        let mut body = json!({"user": username, "pass": password.expose_secret()});
        if matches!(
            self.config.auth_scope,
            AuthScope::Namespace | AuthScope::Database
        ) {
            body["ns"] = json!(self.config.namespace);
        }
        if self.config.auth_scope == AuthScope::Database {
            body["db"] = json!(self.config.database);
        }
        let request = client
            .request(
                reqwest::Method::POST,
                self.url("signin")?,
                Bytes::from(body.to_string()),
            )
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        match self.send(request, "signing in").await {
            Ok(_) => Ok(()),
            // A refused signin is 400 in some versions, 401/403 in others.
            Err(Failure::Fatal(reason)) => Err(Failure::Fatal(
                if reason.contains("check username and password") {
                    reason
                } else {
                    self.credentials_refused(&reason)
                },
            )),
            Err(failure) => Err(failure),
        }
    }

    /// Runs `query` through `POST /sql` (DDL and checks: no payload data),
    /// in the namespace and database when `scoped`.
    async fn sql(
        &self,
        client: &HttpClient,
        query: String,
        scoped: bool,
        what: &str,
    ) -> Result<Vec<Statement>, Failure> {
        let mut request = client
            .request(reqwest::Method::POST, self.url("sql")?, Bytes::from(query))
            .header(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
        if scoped {
            request = self.scoped(request);
        }
        let body = self.send(request, what).await?;
        serde_json::from_slice(&body).map_err(|error| {
            Failure::Fatal(format!(
                "{what}: not SurrealDB's answer ({error}): {}",
                error_text(&body)
            ))
        })
    }

    fn scoped(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        // Both were checked to be valid header values in `new`.
        request
            .header("surreal-ns", self.config.namespace.as_str())
            .header("surreal-db", self.config.database.as_str())
    }

    /// Runs `query` with `vars` (a JSON object's text) through the RPC
    /// `query` method; the statements' results.
    async fn rpc_query(
        &self,
        client: &HttpClient,
        query: &str,
        vars: &[u8],
    ) -> Result<Vec<Statement>, Failure> {
        let mut body = Vec::with_capacity(query.len() + vars.len() + 48);
        body.extend_from_slice(b"{\"id\":1,\"method\":\"query\",\"params\":[");
        serde_json::to_writer(&mut body, query)
            .map_err(|error| Failure::Fatal(error.to_string()))?;
        body.push(b',');
        body.extend_from_slice(vars);
        body.extend_from_slice(b"]}");
        let request = self
            .scoped(client.request(reqwest::Method::POST, self.url("rpc")?, Bytes::from(body)))
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let what = "writing records";
        let answer = self.send(request, what).await?;
        #[derive(Deserialize)]
        struct RpcError {
            #[serde(default)]
            message: String,
        }
        #[derive(Deserialize)]
        struct RpcAnswer {
            #[serde(default)]
            result: Option<Vec<Statement>>,
            #[serde(default)]
            error: Option<RpcError>,
        }
        let answer: RpcAnswer = serde_json::from_slice(&answer).map_err(|error| {
            Failure::Fatal(format!(
                "{what}: not SurrealDB's RPC answer ({error}): {}",
                error_text(&answer)
            ))
        })?;
        match (answer.result, answer.error) {
            (_, Some(error)) => Err(self.failure(&shorten(&error.message), what)),
            (Some(statements), None) => Ok(statements),
            (None, None) => Err(Failure::Fatal(format!(
                "{what}: SurrealDB's RPC answer has neither result nor error"
            ))),
        }
    }

    /// What a statement's error message says (SurrealDB's own wording):
    /// `Ok` when its record is stored anyway, `Refused` when the record is.
    fn classify(&self, message: &str) -> Result<(), Failure> {
        let lower = message.to_ascii_lowercase();
        if lower.contains("does not exist") {
            for (thing, field) in [
                ("namespace", "namespace"),
                ("database", "database"),
                ("table", "table"),
            ] {
                if lower.contains(&format!("the {thing} ")) {
                    return Err(Failure::Fatal(format!(
                        "{message}: define it, fix {field}, or set auto_define_table = true"
                    )));
                }
            }
        }
        if lower.contains("not enough permissions")
            || lower.contains("iam error")
            || lower.contains("problem with authentication")
        {
            return Err(Failure::Fatal(self.credentials_refused(message)));
        }
        if lower.contains("can be retried")
            || lower.contains("transaction conflict")
            || lower.contains("resource busy")
            || lower.contains("timed out")
        {
            return Err(Failure::transient(message));
        }
        // Without IGNORE support a replayed record's id collides: it is stored.
        if lower.contains("database record") && lower.contains("already exists") {
            return Ok(());
        }
        Err(Failure::Refused(message.to_owned()))
    }

    /// An error of a whole request (not about one record: nothing to skip).
    fn failure(&self, message: &str, what: &str) -> Failure {
        match self.classify(message) {
            Err(Failure::Transient { reason, .. }) => {
                Failure::transient(format!("{what}: {reason}"))
            }
            Err(Failure::Fatal(reason)) => Failure::Fatal(format!("{what}: {reason}")),
            Ok(()) | Err(Failure::Refused(_)) => Failure::Fatal(format!(
                "{what}: SurrealDB refuses the request as a whole: {message}"
            )),
        }
    }

    async fn define(&self, client: &HttpClient) -> Result<(), Failure> {
        let scope = self.config.auth_scope;
        let mut unscoped = String::new();
        if matches!(scope, AuthScope::Root | AuthScope::None) {
            unscoped.push_str(&format!(
                "DEFINE NAMESPACE IF NOT EXISTS {};\n",
                ident(&self.config.namespace)
            ));
        }
        if scope != AuthScope::Database {
            unscoped.push_str(&format!(
                "USE NS {};\nDEFINE DATABASE IF NOT EXISTS {};\n",
                ident(&self.config.namespace),
                ident(&self.config.database)
            ));
        }
        if !unscoped.is_empty() {
            let statements = self
                .sql(
                    client,
                    unscoped,
                    false,
                    "defining the namespace and database",
                )
                .await?;
            self.check_ddl(&statements, "defining the namespace and database")?;
        }
        let mut scoped = format!("DEFINE TABLE IF NOT EXISTS {} SCHEMALESS;\n", self.table);
        if self.config.define_indexes {
            scoped.push_str(&format!(
                "DEFINE INDEX IF NOT EXISTS {} ON TABLE {} FIELDS iggy_stream, iggy_topic, iggy_partition_id, iggy_offset;\n",
                ident(&format!("{}_iggy_offset_idx", self.config.table)),
                self.table
            ));
        }
        let statements = self.sql(client, scoped, true, "defining the table").await?;
        self.check_ddl(&statements, "defining the table")
    }

    fn check_ddl(&self, statements: &[Statement], what: &str) -> Result<(), Failure> {
        match statements.iter().find(|statement| !statement.ok()) {
            None => Ok(()),
            Some(statement) => Err(self.failure(&statement.message(), what)),
        }
    }

    /// At most what one record adds to a request body: its statement
    /// (JSON-escaped) and its variable.
    fn statement_bytes(&self, record: &[u8]) -> usize {
        record.len() + 2 * self.table.len() + 64
    }

    /// Writes `records` (index into the batch, record JSON) with one request
    /// and notes each record's answer; a request over SurrealDB's body limit
    /// is split in two, down to the record too large alone.
    async fn write_chunk(
        &self,
        client: &HttpClient,
        mut records: Vec<(usize, Vec<u8>)>,
        outcome: &mut Outcome,
    ) {
        let (query, vars) = self.statements(&records);
        let statements = match self.rpc_query(client, &query, &vars).await {
            Ok(statements) => statements,
            Err(Failure::Refused(reason)) if records.len() == 1 => {
                outcome.reject(records[0].0, format!(
                    "{reason}: the record alone is over SurrealDB's body limit (SURREAL_HTTP_MAX_RPC_BODY_SIZE)"
                ));
                return;
            }
            Err(Failure::Refused(_)) => {
                let second = records.split_off(records.len() / 2);
                for half in [records, second] {
                    if !outcome.stopped() {
                        Box::pin(self.write_chunk(client, half, outcome)).await;
                    }
                }
                return;
            }
            Err(failure) => return outcome.fail(failure, records.iter().map(|(index, _)| *index)),
        };
        if statements.len() != records.len() {
            let failure = Failure::Fatal(format!(
                "SurrealDB answered {} results for {} statements",
                statements.len(),
                records.len()
            ));
            return outcome.fail(failure, records.iter().map(|(index, _)| *index));
        }
        for ((index, _), statement) in records.iter().zip(statements) {
            if statement.ok() {
                outcome.durable([*index]);
                continue;
            }
            // A statement SurrealDB says can be retried stops the write: the
            // engine writes its record again.
            match self.classify(&statement.message()) {
                Ok(()) => outcome.durable([*index]),
                Err(Failure::Refused(reason)) => {
                    outcome.reject(*index, format!("SurrealDB refuses the record: {reason}"));
                }
                Err(failure) => outcome.fail(failure, [*index]),
            }
        }
    }

    /// One `INSERT IGNORE` statement per record and the variables they name.
    fn statements(&self, records: &[(usize, Vec<u8>)]) -> (String, Vec<u8>) {
        let mut query = String::with_capacity(records.len() * (self.table.len() + 40));
        let mut vars = Vec::with_capacity(records.iter().map(|(_, r)| r.len() + 8).sum());
        vars.push(b'{');
        for (n, (_, record)) in records.iter().enumerate() {
            query.push_str(&format!(
                "INSERT IGNORE INTO {} $r{n} RETURN NONE;\n",
                self.table
            ));
            if n > 0 {
                vars.push(b',');
            }
            vars.extend_from_slice(format!("\"r{n}\":").as_bytes());
            vars.extend_from_slice(record);
        }
        vars.push(b'}');
        (query, vars)
    }

    /// The records of a batch in requests of at most `batch_size` records
    /// and `max_request_bytes`; a record over that alone is refused.
    fn chunks(
        &self,
        records: Vec<(usize, Vec<u8>)>,
        outcome: &mut Outcome,
    ) -> Vec<Vec<(usize, Vec<u8>)>> {
        let budget = self.config.max_request_bytes - 64;
        let mut chunks: Vec<Vec<(usize, Vec<u8>)>> = Vec::new();
        let mut size = 0;
        for (index, record) in records {
            let cost = self.statement_bytes(&record);
            if cost > budget {
                outcome.reject(
                    index,
                    format!(
                        "the record makes a {cost}-byte request, more than max_request_bytes ({})",
                        self.config.max_request_bytes
                    ),
                );
                continue;
            }
            let full = chunks
                .last()
                .is_none_or(|chunk| chunk.len() == self.config.batch_size || size + cost > budget);
            if full {
                chunks.push(Vec::new());
                size = 0;
            }
            size += cost;
            if let Some(chunk) = chunks.last_mut() {
                chunk.push((index, record));
            }
        }
        chunks
    }
}

/// `name` as a SurrealQL identifier in backticks (any characters).
fn ident(name: &str) -> String {
    let mut escaped = String::with_capacity(name.len() + 2);
    escaped.push('`');
    for c in name.chars() {
        if matches!(c, '`' | '\\') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped.push('`');
    escaped
}

fn header_value(field: &str, value: &str) -> Result<HeaderValue, PluginConfigError> {
    HeaderValue::from_str(value).map_err(|_| {
        PluginConfigError::new(
            field,
            "sent as an HTTP header: use visible ASCII characters",
        )
    })
}

fn scope_name(scope: AuthScope) -> &'static str {
    match scope {
        AuthScope::Root => "root",
        AuthScope::Namespace => "namespace",
        AuthScope::Database => "database",
        AuthScope::None => "none",
    }
}

fn shorten(text: &str) -> String {
    text.chars()
        .take(REASON_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_owned()
}

/// SurrealDB's error `information`/`description`/`details`, or the start of the body.
fn error_text(body: &[u8]) -> String {
    let text = serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|value| {
            ["information", "description", "details"]
                .iter()
                .find_map(|key| value[key].as_str().map(str::to_owned))
        })
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = shorten(&text);
    if text.is_empty() {
        text
    } else {
        format!("({text})")
    }
}

#[async_trait]
impl Sink for SurrealdbSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    /// `retry_delay`, doubling up to `max_retry_delay`, as the engine's wait
    /// between writes of what is not stored yet; after `max_retries`
    /// consecutive failed writes the engine reports the sink degraded.
    fn retry(&self) -> Option<RetrySettings> {
        Some(RetrySettings::doubling(
            self.config.retry_delay,
            self.config.max_retry_delay.max(self.config.retry_delay),
            self.config.degraded_after(),
        ))
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.config.tls_danger_accept_invalid_certs {
            warn!(connector_key = %self.key, "tls_danger_accept_invalid_certs is on: TLS certificates are NOT verified");
        }
        let client = HttpClient::new(&self.client_options)
            .map_err(|error| ConnectorError::fatal(error.to_string()))?;
        self.signin(&client).await?;
        if self.config.auto_define_table {
            self.define(&client).await?;
        } else {
            if self.config.define_indexes {
                warn!(connector_key = %self.key, "define_indexes needs auto_define_table = true: no index is defined");
            }
            let statements = self
                .sql(
                    &client,
                    "INFO FOR DB;".into(),
                    true,
                    "checking the database",
                )
                .await?;
            self.check_ddl(&statements, "checking the database")?;
        }
        info!(connector_key = %self.key, endpoint = %self.base, namespace = %self.config.namespace, database = %self.config.database, table = %self.config.table, "connected");
        self.client = Some(client);
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    fn writes_concurrently(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the surrealdb sink was not opened"))?;
        let mut outcome = Outcome::default();
        let mut records = Vec::with_capacity(messages.len());
        for (index, message) in messages.iter().enumerate() {
            match record::record_json(&self.config, topic, message) {
                Ok(record) => records.push((index, record)),
                Err(reason) => outcome.reject(index, reason),
            }
        }
        for chunk in self.chunks(records, &mut outcome) {
            if outcome.stopped() {
                break;
            }
            self.write_chunk(client, chunk, &mut outcome).await;
        }
        let outcome = outcome.into_result();
        if self.config.verbose_logging {
            info!(connector_key = %self.key, topic = %topic, messages = messages.len(), all_written = outcome.is_ok(), table = %self.config.table, "batch written");
        } else {
            debug!(connector_key = %self.key, topic = %topic, messages = messages.len(), all_written = outcome.is_ok(), "batch written");
        }
        outcome
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.client = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sink() -> SurrealdbSink {
        SurrealdbSink::new(
            parse_plugin_config(&json!({
                "endpoint": "127.0.0.1:8000", "namespace": "iggy", "database": "connectors",
                "table": "a`b\\c", "username": "root", "password": "secret",
            }))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn given_any_table_name_when_escaped_should_stay_one_identifier() {
        assert_eq!(sink().table, "`a\\`b\\\\c`");
        assert_eq!(ident("plain"), "`plain`");
    }

    #[test]
    fn given_surrealdbs_error_messages_when_classified_should_say_what_to_do() {
        let sink = sink();
        assert_eq!(
            sink.classify("Database record `t:x` already exists"),
            Ok(())
        );
        assert!(matches!(
            sink.classify("Database index `u` already contains 'a', with record `t:x`"),
            Err(Failure::Refused(_))
        ));
        assert!(matches!(
            sink.classify(
                "Found 'abc' for field `payload.n`, with record `t:x`, but expected a number"
            ),
            Err(Failure::Refused(_))
        ));
        assert!(matches!(
            sink.classify("Failed to commit transaction due to a read or write conflict. This transaction can be retried"),
            Err(Failure::Transient { .. })
        ));
        for (message, field) in [
            ("The namespace 'iggy' does not exist", "namespace"),
            ("The database 'connectors' does not exist", "database"),
            ("The table 'x' does not exist", "table"),
        ] {
            let Err(Failure::Fatal(reason)) = sink.classify(message) else {
                panic!("{message}: not fatal");
            };
            assert!(reason.contains(&format!("fix {field}")), "{reason}");
        }
        let Err(Failure::Fatal(reason)) =
            sink.classify("IAM error: Not enough permissions to perform this action")
        else {
            panic!("not fatal");
        };
        assert!(reason.contains("username and password"), "{reason}");
        assert!(!reason.contains("secret"));
    }
}
