//! A Confluent-compatible schema registry client for Avro streams. Messages
//! carry the registry's wire format: a zero magic byte, the schema id as 4
//! big-endian bytes, then the Avro datum.
//!
//! - Decoding (sinks): the writer's schema is fetched by id
//!   (`GET /schemas/ids/{id}`) once per id and kept; the datum is resolved
//!   into the stream's configured schema when the two differ.
//! - Encoding (sources): the stream's schema is registered under its subject
//!   (`POST /subjects/{subject}/versions`, which also returns the id of a schema
//!   already registered there) once, and its id prefixes every message.
//!
//! Basic auth (`schema_registry_username`/`_password`) and TLS with an added CA
//! (`schema_registry_ca_file`) are supported. The codec's calls are synchronous,
//! so a registry call (only on a cache miss) blocks its Tokio worker thread via
//! `block_in_place`: it needs the multi-thread runtime the binary runs on. A
//! registry that cannot be reached fails the message like a bad payload
//! (counted, skipped or dead-lettered).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use apache_avro::Schema as AvroSchema;
use secrecy::{ExposeSecret, SecretString};

/// The magic byte that starts every message of the wire format.
const MAGIC: u8 = 0;
/// Magic byte and schema id.
pub const HEADER_LEN: usize = 5;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
pub struct RegistryOptions {
    pub url: String,
    /// The subject a source registers its schema under (`{topic}-value` by default).
    pub subject: String,
    pub username: Option<String>,
    pub password: Option<SecretString>,
    pub ca_file: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("schema registry {url}: {message}")]
    Request { url: String, message: String },
    #[error("schema registry lookups need Tokio's multi-thread runtime")]
    NoRuntime,
}

/// A writer schema fetched by id, and whether it equals the stream's own.
struct Writer {
    schema: AvroSchema,
    same_as_reader: bool,
}

pub struct Registry {
    options: RegistryOptions,
    client: reqwest::Client,
    reader_form: String,
    writers: Mutex<HashMap<u32, Arc<Writer>>>,
    own_id: OnceLock<u32>,
}

impl Registry {
    /// A client for `options`, whose stream schema is `reader`.
    pub fn new(options: RegistryOptions, reader: &AvroSchema) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder().timeout(REQUEST_TIMEOUT);
        if let Some(path) = &options.ca_file {
            let pem =
                std::fs::read(path).map_err(|error| format!("cannot read {path}: {error}"))?;
            let certificate = reqwest::Certificate::from_pem(&pem)
                .map_err(|error| format!("{path} is not a PEM certificate: {error}"))?;
            builder = builder.add_root_certificate(certificate);
        }
        let client = builder
            .build()
            .map_err(|error| format!("cannot build the registry client: {error}"))?;
        if !(options.url.starts_with("http://") || options.url.starts_with("https://")) {
            return Err(format!(
                "expected an http:// or https:// URL, found \"{}\"",
                options.url
            ));
        }
        Ok(Self {
            options,
            client,
            reader_form: reader.canonical_form(),
            writers: Mutex::new(HashMap::new()),
            own_id: OnceLock::new(),
        })
    }

    pub fn url(&self) -> &str {
        &self.options.url
    }

    /// Splits a message into its schema id and datum.
    pub fn split(bytes: &[u8]) -> Option<(u32, &[u8])> {
        match bytes {
            [MAGIC, a, b, c, d, datum @ ..] => Some((u32::from_be_bytes([*a, *b, *c, *d]), datum)),
            _ => None,
        }
    }

    /// The writer schema of `id`, from the cache or the registry; `None` for
    /// the stream's own schema.
    pub fn writer(&self, id: u32) -> Result<Option<AvroSchemaRef>, RegistryError> {
        let cached = self.lock().get(&id).cloned();
        let writer = match cached {
            Some(writer) => writer,
            None => {
                let text = block_on(self.fetch(id))??;
                let schema = AvroSchema::parse_str(&text).map_err(|error| {
                    self.error(format!("schema {id} is not a valid Avro schema: {error}"))
                })?;
                let writer = Arc::new(Writer {
                    same_as_reader: schema.canonical_form() == self.reader_form,
                    schema,
                });
                self.lock().insert(id, writer.clone());
                writer
            }
        };
        Ok((!writer.same_as_reader).then_some(AvroSchemaRef(writer)))
    }

    /// The id the stream's schema has under its subject, registered on first use.
    pub fn own_id(&self, schema_text: &str) -> Result<u32, RegistryError> {
        if let Some(id) = self.own_id.get() {
            return Ok(*id);
        }
        let id = block_on(self.register(schema_text))??;
        Ok(*self.own_id.get_or_init(|| id))
    }

    /// The wire format's header for `id`.
    pub fn header(id: u32) -> [u8; HEADER_LEN] {
        let [a, b, c, d] = id.to_be_bytes();
        [MAGIC, a, b, c, d]
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u32, Arc<Writer>>> {
        self.writers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn fetch(&self, id: u32) -> Result<String, RegistryError> {
        let url = format!("{}/schemas/ids/{id}", self.base());
        let body = self.send(self.client.get(&url)).await?;
        schema_field(&body)
            .ok_or_else(|| self.error(format!("no \"schema\" in the answer for id {id}")))
    }

    async fn register(&self, schema_text: &str) -> Result<u32, RegistryError> {
        let url = format!("{}/subjects/{}/versions", self.base(), self.options.subject);
        let body = serde_json::json!({ "schema": schema_text }).to_string();
        let request = self
            .client
            .post(&url)
            .header("content-type", "application/vnd.schemaregistry.v1+json")
            .body(body);
        let answer = self.send(request).await?;
        answer["id"]
            .as_u64()
            .and_then(|id| u32::try_from(id).ok())
            .ok_or_else(|| {
                self.error(format!(
                    "no schema \"id\" in the answer to registering under {}",
                    self.options.subject
                ))
            })
    }

    async fn send(
        &self,
        request: reqwest::RequestBuilder,
    ) -> Result<serde_json::Value, RegistryError> {
        let request = match &self.options.username {
            Some(username) => request.basic_auth(
                username,
                self.options
                    .password
                    .as_ref()
                    .map(|p| p.expose_secret().to_owned()),
            ),
            None => request,
        };
        let response = request
            .header("accept", "application/vnd.schemaregistry.v1+json")
            .send()
            .await
            .map_err(|error| self.error(error_chain(&error)))?;
        let status = response.status();
        let body = response
            .bytes()
            .await
            .map_err(|error| self.error(error_chain(&error)))?;
        let value: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
        if !status.is_success() {
            let message = value["message"].as_str().unwrap_or("");
            return Err(self.error(format!("HTTP {status} {message}")));
        }
        Ok(value)
    }

    fn base(&self) -> &str {
        self.options.url.trim_end_matches('/')
    }

    fn error(&self, message: String) -> RegistryError {
        RegistryError::Request {
            url: self.options.url.clone(),
            message,
        }
    }
}

/// A cached writer schema.
pub struct AvroSchemaRef(Arc<Writer>);

impl std::ops::Deref for AvroSchemaRef {
    type Target = AvroSchema;
    fn deref(&self) -> &AvroSchema {
        &self.0.schema
    }
}

fn schema_field(body: &serde_json::Value) -> Option<String> {
    body["schema"].as_str().map(str::to_owned)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs a registry call from the codec's synchronous code on the current
/// multi-thread runtime.
fn block_on<F: std::future::Future>(future: F) -> Result<F::Output, RegistryError> {
    let handle = tokio::runtime::Handle::try_current().map_err(|_| RegistryError::NoRuntime)?;
    if handle.runtime_flavor() != tokio::runtime::RuntimeFlavor::MultiThread {
        return Err(RegistryError::NoRuntime);
    }
    Ok(tokio::task::block_in_place(|| handle.block_on(future)))
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("url", &self.options.url)
            .field("subject", &self.options.subject)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_wire_format_bytes_when_split_should_give_the_id_and_datum() {
        let mut bytes = Registry::header(0x0102_0304).to_vec();
        bytes.extend_from_slice(b"\x02");
        assert_eq!(Registry::split(&bytes), Some((0x0102_0304, &b"\x02"[..])));
        assert_eq!(Registry::split(b"\x01\x00\x00\x00\x01\x02"), None);
        assert_eq!(Registry::split(b"\x00\x00\x00\x01"), None);
    }
}
