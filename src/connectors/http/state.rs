//! `[state] storage = "http"`: every source's state on an HTTP state server,
//! as upstream's runtime keeps it (apache/iggy#3940), with upstream's
//! `[state.http]` fields.
//!
//! A source's state lives at `{url}/source_{key}`. A load remembers the
//! answer's `ETag`; a save is conditional: `If-Match` with that tag, or
//! `If-None-Match: *` when the server had no state, so a save never
//! overwrites a state another runtime wrote since this one read it (the
//! server answers 412, and the source stops). Each save carries an
//! `Idempotency-Key`, the same for every retry of that save, so a server
//! that stored it but lost its answer can answer the retry as it answered
//! the first.
//!
//! One request per call: 5xx, 408, 425, 429, timeouts and refused
//! connections are [`StateError::Unreachable`] (the engine NACKs the batch
//! and saves again after its backoff; a load at start is tried again like an
//! `open`); 412, 409, 401, 403 and every other answer are
//! [`StateError::Refused`], and the key is latched: its later saves are
//! refused without a request until the source loads again.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{
    CONTENT_TYPE, ETAG, HeaderMap, HeaderName, HeaderValue, IF_MATCH, IF_NONE_MATCH,
};
use reqwest::{Method, StatusCode, Url};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};

use crate::config::ConfigIssue;
use crate::config::env::Kind;
use crate::config::state::{StateConfig, StateField, StateKind};
use crate::state::{Backend, StateError, StateStore, StoredState};

inventory::submit!(StateKind {
    name: "http",
    feature: "http-state",
    fields: &[
        StateField::new("http.url", Kind::Str),
        StateField::new("http.load_method", Kind::Str),
        StateField::new("http.save_method", Kind::Str),
        StateField::new("http.timeout", Kind::Str),
        StateField::new("http.request_headers.*", Kind::Str),
        StateField::new("http.retry.enabled", Kind::Bool),
        StateField::new("http.retry.max_attempts", Kind::Int),
        StateField::new("http.retry.initial_backoff", Kind::Str),
        StateField::new("http.retry.max_backoff", Kind::Str),
        StateField::new("http.retry.backoff_multiplier", Kind::Int),
    ],
    check,
});

inventory::submit!(Backend {
    kind: "http",
    open: |config| {
        Box::pin(async move {
            let store: Arc<dyn StateStore> = Arc::new(HttpStateStore::open(config)?);
            Ok(store)
        })
    },
});

const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");
const OCTET_STREAM: &str = "application/octet-stream";
/// How much of an error answer's body a message quotes.
const BODY_SNIPPET: usize = 200;
const FORMAT_VERSION: u32 = 1;

/// `[state]` with `storage = "http"`: upstream's `[state.http]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(default)]
pub struct HttpStateSettings {
    pub http: HttpStateConfig,
}

/// `[state.http]`, upstream's fields and defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpStateConfig {
    /// The state server's base URL; a source's state is at `{url}/source_{key}`.
    pub url: String,
    /// The method of a load (`GET`, the default).
    pub load_method: StateMethod,
    /// The method of a save (`PUT`, the default).
    pub save_method: StateMethod,
    /// How long one request may take.
    #[serde(with = "crate::config::duration")]
    pub timeout: Duration,
    /// Headers sent with every request (an `authorization`, say); secrets.
    pub request_headers: BTreeMap<String, SecretString>,
    /// Upstream's retries inside the store. Read and checked so upstream's
    /// files work unchanged; here the engine retries a failed save (the
    /// batch is NACKed) and a failed load at start, with its own backoff.
    pub retry: RetryConfig,
}

impl Default for HttpStateConfig {
    fn default() -> Self {
        Self {
            url: String::new(),
            load_method: StateMethod::Get,
            save_method: StateMethod::Put,
            timeout: Duration::from_secs(5),
            request_headers: BTreeMap::new(),
            retry: RetryConfig::default(),
        }
    }
}

/// `[state.http.retry]`, upstream's fields and defaults.
#[derive(Debug, Clone, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RetryConfig {
    pub enabled: bool,
    pub max_attempts: u32,
    #[serde(with = "crate::config::duration")]
    pub initial_backoff: Duration,
    #[serde(with = "crate::config::duration")]
    pub max_backoff: Duration,
    pub backoff_multiplier: u32,
}

impl Default for RetryConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_attempts: 4,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(2),
            backoff_multiplier: 2,
        }
    }
}

/// A request method, written in any case (`put`, `PUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateMethod {
    Get,
    Put,
    Post,
    Patch,
}

impl FromStr for StateMethod {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text.to_ascii_uppercase().as_str() {
            "GET" => Ok(StateMethod::Get),
            "PUT" => Ok(StateMethod::Put),
            "POST" => Ok(StateMethod::Post),
            "PATCH" => Ok(StateMethod::Patch),
            _ => Err(format!(
                "expected get, put, post or patch, found \"{text}\""
            )),
        }
    }
}

impl<'de> Deserialize<'de> for StateMethod {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl From<StateMethod> for Method {
    fn from(method: StateMethod) -> Self {
        match method {
            StateMethod::Get => Method::GET,
            StateMethod::Put => Method::PUT,
            StateMethod::Post => Method::POST,
            StateMethod::Patch => Method::PATCH,
        }
    }
}

/// Every field of `[state.http]` that is missing or malformed.
fn check(state: &StateConfig, file: &Path) -> Vec<ConfigIssue> {
    let settings: HttpStateSettings = match state.read(file) {
        Ok(settings) => settings,
        Err(issue) => return vec![issue],
    };
    let config = settings.http;
    let mut issues = Vec::new();
    if let Err(message) = base_url(&config.url) {
        issues.push(ConfigIssue::error(file, "state.http.url", message));
    }
    if config.timeout.is_zero() {
        issues.push(ConfigIssue::error(
            file,
            "state.http.timeout",
            "expected a duration above zero",
        ));
    }
    for (name, value) in &config.request_headers {
        if let Err(message) = header(name, value) {
            issues.push(ConfigIssue::error(
                file,
                format!("state.http.request_headers.{name}"),
                message,
            ));
        }
    }
    if config.retry.max_backoff < config.retry.initial_backoff {
        issues.push(ConfigIssue::error(
            file,
            "state.http.retry.max_backoff",
            "expected at least initial_backoff",
        ));
    }
    issues
}

/// `url` as the base of the state resources: http or https, with a path
/// segments can be added to.
fn base_url(url: &str) -> Result<Url, String> {
    if url.trim().is_empty() {
        return Err(
            "missing, expected the state server's http:// or https:// URL (storage = \"http\" keeps source state there)"
                .into(),
        );
    }
    let parsed = Url::parse(url).map_err(|error| format!("not a URL: {error}"))?;
    if parsed.cannot_be_a_base() || !matches!(parsed.scheme(), "http" | "https") {
        return Err("expected an http:// or https:// URL".into());
    }
    Ok(parsed)
}

/// One of `request_headers`; the value's error never quotes it.
fn header(name: &str, value: &SecretString) -> Result<(HeaderName, HeaderValue), String> {
    let name =
        HeaderName::from_str(name).map_err(|_| format!("\"{name}\" is not a header name"))?;
    let mut value = HeaderValue::from_str(value.expose_secret())
        .map_err(|_| "the value is not a valid header value".to_owned())?;
    value.set_sensitive(true);
    Ok((name, value))
}

pub struct HttpStateStore {
    client: reqwest::Client,
    base: Url,
    load_method: Method,
    save_method: Method,
    tracked: Mutex<HashMap<String, Tracked>>,
}

/// What this runtime knows of one source key on the server.
#[derive(Default)]
struct Tracked {
    version: Version,
    /// The write whose answer did not come (it may have been stored).
    pending: Option<Pending>,
    /// Why the server refused a save for good; later saves are refused
    /// without a request until the source loads again.
    refused: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
enum Version {
    /// Not read yet: a save reads it first (never an unconditional write).
    #[default]
    Unknown,
    /// The server had no state: the first save asks `If-None-Match: *`.
    Absent,
    Tag(String),
}

/// A write, as sent again when its answer was lost.
#[derive(Clone)]
struct Pending {
    body: Vec<u8>,
    version: Version,
    idempotency_key: String,
}

impl Pending {
    fn new(body: Vec<u8>, version: Version) -> Self {
        Self {
            body,
            version,
            idempotency_key: uuid::Uuid::new_v4().to_string(),
        }
    }
}

/// What the server holds for a source: its key and connector beside the
/// source's own bytes, so a state copied to another key, or written by
/// another connector, is refused.
#[derive(Serialize, Deserialize)]
struct Envelope {
    format: u32,
    key: String,
    connector: String,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// How one request ended, classified.
enum Answer {
    Ok(reqwest::Response),
    Transient(String),
    Refused(String),
}

impl HttpStateStore {
    /// Builds the client (headers, timeout, no redirects: a redirected
    /// conditional write could lose its body or its condition). No request
    /// is made: a server that is down delays the first load only.
    pub fn open(state: &StateConfig) -> Result<Self, StateError> {
        let settings: HttpStateSettings = state
            .settings()
            .map_err(|error| StateError::Unavailable(error.to_string()))?;
        let config = settings.http;
        let invalid = |message: String| StateError::Unavailable(format!("[state.http] {message}"));
        let base = base_url(&config.url).map_err(|message| invalid(format!("url: {message}")))?;
        let mut headers = HeaderMap::new();
        for (name, value) in &config.request_headers {
            let (name, value) = header(name, value)
                .map_err(|message| invalid(format!("request_headers.{name}: {message}")))?;
            headers.insert(name, value);
        }
        let client = reqwest::Client::builder()
            .default_headers(headers)
            .timeout(config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|error| invalid(format!("cannot build the HTTP client: {error}")))?;
        Ok(Self {
            client,
            base,
            load_method: config.load_method.into(),
            save_method: config.save_method.into(),
            tracked: Mutex::new(HashMap::new()),
        })
    }

    /// `{url}/source_{key}`, the key percent-encoded as one path segment.
    fn resource(&self, key: &str) -> Url {
        let mut url = self.base.clone();
        if let Ok(mut segments) = url.path_segments_mut() {
            segments.pop_if_empty().push(&format!("source_{key}"));
        }
        url
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Tracked>> {
        self.tracked
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One request, its answer classified.
    async fn send(&self, request: reqwest::RequestBuilder, action: &str) -> Answer {
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Answer::Transient(describe_send_error(error)),
        };
        let status = response.status();
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Answer::Ok(response);
        }
        let mut message = format!("HTTP {status}{}", body_snippet(response).await);
        if is_transient(status) {
            return Answer::Transient(message);
        }
        if matches!(
            status,
            StatusCode::PRECONDITION_FAILED | StatusCode::CONFLICT
        ) {
            message.push_str(&format!(
                "; the state changed since this runtime read it (does another runtime {action} it?)"
            ));
        } else if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            message.push_str("; check [state.http] request_headers");
        }
        Answer::Refused(message)
    }

    /// Reads the state and the version of `key`.
    async fn fetch(&self, key: &str) -> Result<(Version, Option<Vec<u8>>), StateError> {
        let url = self.resource(key);
        let request = self.client.request(self.load_method.clone(), url);
        let response = match self.send(request, "write").await {
            Answer::Ok(response) => response,
            Answer::Transient(message) => return Err(self.unreachable("read", key, message)),
            Answer::Refused(message) => return Err(self.refused("read", key, message)),
        };
        if response.status() == StatusCode::NOT_FOUND {
            return Ok((Version::Absent, None));
        }
        let tag = self.etag(&response, "read", key)?;
        let body = response
            .bytes()
            .await
            .map_err(|error| self.unreachable("read", key, describe_send_error(error)))?;
        Ok((Version::Tag(tag), Some(body.to_vec())))
    }

    fn etag(
        &self,
        response: &reqwest::Response,
        action: &'static str,
        key: &str,
    ) -> Result<String, StateError> {
        response
            .headers()
            .get(ETAG)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| {
                self.refused(
                    action,
                    key,
                    format!(
                        "HTTP {} without an ETag: the server does not keep the state protocol",
                        response.status()
                    ),
                )
            })
    }

    fn unreachable(&self, action: &'static str, key: &str, message: String) -> StateError {
        StateError::Unreachable {
            action,
            location: self.location(key),
            message,
        }
    }

    fn refused(&self, action: &'static str, key: &str, message: String) -> StateError {
        StateError::Refused {
            action,
            location: self.location(key),
            message,
        }
    }

    /// Records what a write came to.
    fn saved(&self, key: &str, outcome: &Result<String, StateError>) {
        let mut tracked = self.lock();
        let entry = tracked.entry(key.to_owned()).or_default();
        match outcome {
            Ok(tag) => {
                entry.version = Version::Tag(tag.clone());
                entry.pending = None;
            }
            Err(error) if error.is_permanent() => {
                entry.pending = None;
                entry.refused = Some(error.to_string());
            }
            Err(_) => {}
        }
    }

    /// Sends `write` once (or again: same key, body and condition) and
    /// records its outcome; the new version's tag when stored.
    async fn write(&self, key: &str, write: Pending) -> Result<String, StateError> {
        let mut request = self
            .client
            .request(self.save_method.clone(), self.resource(key))
            .header(IDEMPOTENCY_KEY, write.idempotency_key.as_str())
            .header(CONTENT_TYPE, OCTET_STREAM)
            .body(write.body.clone());
        request = match &write.version {
            Version::Tag(tag) => request.header(IF_MATCH, tag.as_str()),
            _ => request.header(IF_NONE_MATCH, "*"),
        };
        self.lock().entry(key.to_owned()).or_default().pending = Some(write);
        let outcome = match self.send(request, "write").await {
            Answer::Ok(response) if response.status() == StatusCode::NOT_FOUND => {
                Err(self.refused("save", key, "HTTP 404 Not Found on a write".into()))
            }
            Answer::Ok(response) => self.etag(&response, "save", key),
            Answer::Transient(message) => Err(self.unreachable("save to", key, message)),
            Answer::Refused(message) => Err(self.refused("save", key, message)),
        };
        self.saved(key, &outcome);
        outcome
    }
}

#[async_trait]
impl StateStore for HttpStateStore {
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError> {
        let (version, body) = self.fetch(key).await?;
        *self.lock().entry(key.to_owned()).or_default() = Tracked {
            version,
            ..Tracked::default()
        };
        let Some(body) = body else {
            return Ok(None);
        };
        let corrupt = |reason: String| StateError::CorruptAt {
            location: self.location(key),
            reason,
        };
        let envelope: Envelope = rmp_serde::from_slice(&body)
            .map_err(|error| corrupt(format!("does not decode: {error}")))?;
        if envelope.format != FORMAT_VERSION {
            return Err(corrupt(format!("unknown format {}", envelope.format)));
        }
        if envelope.key != key {
            return Err(corrupt(format!(
                "it belongs to source \"{}\", not \"{key}\"",
                envelope.key
            )));
        }
        Ok(Some(StoredState {
            connector: envelope.connector,
            data: envelope.data,
        }))
    }

    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError> {
        let (version, refused) = {
            let tracked = self.lock();
            let entry = tracked.get(key);
            (
                entry.map(|entry| entry.version.clone()).unwrap_or_default(),
                entry.and_then(|entry| entry.refused.clone()),
            )
        };
        if let Some(reason) = refused {
            return Err(self.refused(
                "save",
                key,
                format!("an earlier save was refused ({reason}); load the state again"),
            ));
        }
        let version = match version {
            Version::Unknown => {
                let (version, _) = self.fetch(key).await?;
                self.lock().entry(key.to_owned()).or_default().version = version.clone();
                version
            }
            known => known,
        };
        let body = rmp_serde::to_vec_named(&Envelope {
            format: FORMAT_VERSION,
            key: key.to_owned(),
            connector: state.connector.clone(),
            data: state.data.clone(),
        })
        .map_err(|error| StateError::Unavailable(format!("cannot encode the state: {error}")))?;
        // A write whose answer was lost may have been stored: it is sent
        // again (same key, the server answers as it did) before a new one,
        // so its outcome is known and the new one is conditioned on it.
        let in_doubt = self.lock().get(key).and_then(|entry| entry.pending.clone());
        let write = match in_doubt {
            Some(pending) if pending.body == body => pending,
            Some(pending) => {
                let tag = self.write(key, pending).await?;
                Pending::new(body, Version::Tag(tag))
            }
            None => Pending::new(body, version),
        };
        self.write(key, write).await.map(drop)
    }

    async fn clear(&self, key: &str) -> Result<(), StateError> {
        let request = self.client.delete(self.resource(key));
        let outcome = match self.send(request, "write").await {
            Answer::Ok(_) => Ok(()),
            Answer::Transient(message) => Err(self.unreachable("clear", key, message)),
            Answer::Refused(message) => Err(self.refused("clear", key, message)),
        };
        self.lock().remove(key);
        outcome
    }

    /// The resource's URL without credentials or query (they may hold secrets).
    fn location(&self, key: &str) -> String {
        let mut url = self.resource(key);
        let _ = url.set_username("");
        let _ = url.set_password(None);
        url.set_query(None);
        url.to_string()
    }
}

/// 5xx, and the 4xx that mean "not now": 408, 425, 429.
fn is_transient(status: StatusCode) -> bool {
    status.is_server_error()
        || matches!(
            status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::TOO_EARLY | StatusCode::TOO_MANY_REQUESTS
        )
}

/// The error of a request that got no answer, without its URL (the caller
/// names the redacted one), and its deepest cause.
fn describe_send_error(error: reqwest::Error) -> String {
    let timeout = error.is_timeout();
    let error = error.without_url();
    let mut cause: &dyn std::error::Error = &error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let cause = match std::ptr::addr_eq(cause, &error) {
        true => String::new(),
        false => format!(": {cause}"),
    };
    match timeout {
        true => format!("no answer within [state.http] timeout{cause}"),
        false => format!("{error}{cause}"),
    }
}

async fn body_snippet(response: reqwest::Response) -> String {
    match response.text().await {
        Ok(body) if !body.trim().is_empty() => {
            let snippet: String = body.trim().chars().take(BODY_SNIPPET).collect();
            format!(": {snippet}")
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(text: &str) -> StateConfig {
        toml::from_str(text).unwrap()
    }

    #[test]
    fn given_upstreams_http_state_section_when_read_should_take_every_field() {
        let config = state(
            "storage = \"http\"\n[http]\nurl = \"http://127.0.0.1:8080/connectors/state\"\n\
             load_method = \"post\"\nsave_method = \"PATCH\"\ntimeout = \"10s\"\n\
             [http.request_headers]\nauthorization = \"Bearer secret-token\"\n\
             [http.retry]\nenabled = true\nmax_attempts = 7\ninitial_backoff = \"100ms\"\n\
             max_backoff = \"1s\"\nbackoff_multiplier = 3\n",
        );
        assert_eq!(config.kind, "http");
        assert!(check(&config, Path::new("c.toml")).is_empty());
        let settings: HttpStateSettings = config.settings().unwrap();
        assert_eq!(settings.http.load_method, StateMethod::Post);
        assert_eq!(settings.http.save_method, StateMethod::Patch);
        assert_eq!(settings.http.timeout, Duration::from_secs(10));
        assert_eq!(settings.http.retry.max_attempts, 7);
        assert!(!format!("{settings:?}").contains("secret-token"));
    }

    #[test]
    fn given_bad_http_state_fields_when_checked_should_name_each() {
        let fields = |text: &str| -> Vec<String> {
            check(&state(text), Path::new("c.toml"))
                .into_iter()
                .map(|issue| issue.field)
                .collect()
        };
        assert_eq!(fields("storage = \"http\""), ["state.http.url"]);
        assert_eq!(
            fields(
                "storage = \"http\"\n[http]\nurl = \"ftp://h/x\"\ntimeout = \"0s\"\n[http.request_headers]\n\"bad name\" = \"x\"\n"
            ),
            [
                "state.http.url",
                "state.http.timeout",
                "state.http.request_headers.bad name"
            ]
        );
        assert_eq!(
            fields("storage = \"http\"\n[http]\nurl = \"http://h\"\nsave_method = \"delete\"\n"),
            ["state.http.save_method"]
        );
    }
}
