//! `s3` sink: writes messages as objects to Amazon S3 or an S3-compatible
//! store (MinIO, R2, ...), or any other store `object_store` speaks (Azure
//! Blob Storage / ADLS Gen2, Google Cloud Storage, a local directory) named
//! by `url`.
//!
//! The sink defers acknowledgement (rule K6, docs/ARCHITECTURE.md): `write`
//! encodes each message into its partition's open file; a file closes when
//! its encoded messages reach `max_file_size` (or `max_messages_per_file`),
//! after `flush_interval` and at a stop, and is uploaded by the flush that
//! follows. Only once the PUT (or the multipart upload's completion) returned
//! success does the sink report the file's last offset durable, and the
//! engine commits no further. An object's key is built from its partition
//! and its first and last offsets (`{prefix}/{path_template}/
//! {partition:05}-{first:020}-{last:020}.{ext}`, the template's time fields
//! from the first message's timestamp), and a file's end depends only on the
//! messages from its first offset on, so data read again after a crash is
//! uploaded under the same keys and overwrites what is there: no duplicates.
//!
//! Connection errors, timeouts and 5xx are retried (`max_attempts`, then the
//! engine retries the flush with its backoff); a missing bucket or refused
//! credentials are fatal, naming the field to fix.

mod config;
mod file;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use secrecy::ExposeSecret;
use tracing::{debug, info};

use crate::connectors::kit::store::{self, Refusal, Requests};
use crate::connectors::{
    ConnectorError, Deferred, Flush, PluginConfigError, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};
use crate::sync::lock;

pub use config::{Compression, FileRotation, OutputFormat, Place, S3SinkConfig};
use file::{ClosedFile, Layout, OpenFile};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "s3",
    feature: "s3-sink",
    description: "writes messages as objects to S3 (or S3-compatible), Azure Blob, GCS or a local directory (keys from offsets: a replay overwrites)",
    secret_fields: &["access_key_id", "secret_access_key", "options.*"],
    sample_config: "bucket = \"iggy-data\"\nregion = \"us-east-1\"\nprefix = \"iggy/raw\"\nendpoint = \"http://127.0.0.1:9000\"\naccess_key_id = \"key-id-secret\"\nsecret_access_key = \"secret\"\nfile_rotation = \"messages\"\nmax_messages_per_file = 10000\noutput_format = \"json_lines\"\ncompression = \"gzip\"\nflush_interval = \"60s\"\noptions = { aws_session_token = \"session-token-secret\" }\n",
    config_schema: schema_of::<S3SinkConfig>,
    build: |config| Ok(Box::new(S3Sink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct S3Sink {
    config: S3SinkConfig,
    place: Place,
    /// The key prefix: the URL's path, then `prefix`.
    prefix: Option<String>,
    layout: Layout,
    part_size: u64,
    store: Option<Arc<dyn ObjectStore>>,
    topics: Mutex<HashMap<TopicRef, TopicFiles>>,
}

/// One topic's files.
#[derive(Default)]
struct TopicFiles {
    open: BTreeMap<u32, OpenFile>,
    /// Closed, waiting for their upload, in the order they closed.
    closed: VecDeque<ClosedFile>,
    /// Per partition, the last offset uploaded.
    durable: BTreeMap<u32, u64>,
}

impl S3Sink {
    pub fn new(config: S3SinkConfig) -> Result<Self, PluginConfigError> {
        let (place, rotation, part_size) = config.validate()?;
        let layout = Layout {
            format: config.output_format,
            include_metadata: config.include_metadata,
            include_headers: config.include_headers,
            rotation,
        };
        Ok(Self {
            config,
            place,
            prefix: None,
            layout,
            part_size,
            store: None,
            topics: Mutex::new(HashMap::new()),
        })
    }

    /// The store at the root of the bucket (container, directory) and the
    /// key prefix below it: `url`'s path, then `prefix`.
    fn build_store(&self) -> Result<(Arc<dyn ObjectStore>, Option<String>), ConnectorError> {
        let config = &self.config;
        let mut options: Vec<(String, String)> = Vec::new();
        if matches!(self.place.url.scheme(), "s3" | "s3a") {
            let credentials = config
                .access_key_id
                .as_ref()
                .zip(config.secret_access_key.as_ref())
                .map(|(key, secret)| (key.expose_secret(), secret.expose_secret()));
            let region = Some(config.region.trim()).filter(|region| !region.is_empty());
            options = store::s3_options(region, config.endpoint.as_deref(), credentials);
            options.push((
                "aws_virtual_hosted_style_request".to_owned(),
                (!config.path_style()).to_string(),
            ));
        }
        options.extend(
            config
                .options
                .iter()
                .map(|(key, value)| (key.clone(), value.expose_secret().to_owned())),
        );
        let requests = Requests {
            timeout: config.request_timeout,
            attempts: config.max_attempts,
            first_delay: config.retry_delay,
        };
        let (store, path) =
            store::open(&self.place.url, &options, requests).map_err(|(option, message)| {
                let field = if option.is_empty() {
                    self.place.field.to_owned()
                } else {
                    format!("options.{option}")
                };
                ConnectorError::fatal(format!(
                    "{field}: cannot set up the store client: {message}"
                ))
            })?;
        let prefix = [path.as_ref(), config.prefix.as_deref().unwrap_or_default()]
            .iter()
            .map(|part| part.trim_matches('/'))
            .filter(|part| !part.is_empty())
            .collect::<Vec<_>>()
            .join("/");
        Ok((store, Some(prefix).filter(|prefix| !prefix.is_empty())))
    }

    fn store(&self) -> Result<&Arc<dyn ObjectStore>, SinkError> {
        self.store
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the s3 sink was not opened"))
    }

    /// Uploads one closed file under its key; `Ok` once S3 stored it.
    async fn upload(&self, topic: &TopicRef, file: &ClosedFile) -> Result<(), SinkError> {
        let store = self.store()?;
        let config = &self.config;
        let key = file::object_key(
            self.prefix.as_deref(),
            &config.path_template,
            topic,
            file,
            config.output_format,
            config.compression,
        );
        let body = file.body.clone();
        let compression = config.compression;
        let data = match compression {
            Compression::None => body,
            _ => tokio::task::spawn_blocking(move || file::compress(&body, compression))
                .await
                .map_err(SinkError::fatal)?
                .map_err(SinkError::fatal)?,
        };
        let path = Path::from(key.as_str());
        let size = data.len() as u64;
        if size > self.part_size {
            let mut upload = store
                .put_multipart(&path)
                .await
                .map_err(|error| self.classify(&key, error))?;
            let parts = async {
                let mut at = 0;
                while at < data.len() {
                    let end = (at + self.part_size as usize).min(data.len());
                    upload
                        .put_part(PutPayload::from(data.slice(at..end)))
                        .await?;
                    at = end;
                }
                upload.complete().await
            }
            .await;
            if let Err(error) = parts {
                let _ = upload.abort().await;
                return Err(self.classify(&key, error));
            }
        } else {
            store
                .put(&path, PutPayload::from(data))
                .await
                .map_err(|error| self.classify(&key, error))?;
        }
        debug!(store = %self.place.url, key, bytes = size, messages = file.count, "object uploaded");
        Ok(())
    }

    /// Which store errors are worth retrying.
    fn classify(&self, key: &str, error: object_store::Error) -> SinkError {
        match Refusal::of(&error) {
            Some(Refusal::NoBucket) => SinkError::fatal(missing_bucket(&self.place, &error)),
            Some(Refusal::Credentials) => {
                SinkError::fatal(refused_credentials(&self.place, &error))
            }
            None => {
                let store = &self.place.url;
                let message = format!("upload of {key} to {store} failed: {error}");
                match error {
                    object_store::Error::Generic { .. } => SinkError::transient(message),
                    _ => SinkError::fatal(message),
                }
            }
        }
    }
}

fn missing_bucket(place: &Place, error: &object_store::Error) -> String {
    let (field, url) = (place.field, &place.url);
    if field == "bucket" {
        let bucket = url.host_str().unwrap_or_default();
        return format!(
            "bucket: \"{bucket}\" does not exist (or is not at the endpoint): create it, or fix `bucket`, `region` or `endpoint` ({error})"
        );
    }
    format!(
        "{field}: the bucket or container of {url} does not exist: create it, or fix `{field}` ({error})"
    )
}

fn refused_credentials(place: &Place, error: &object_store::Error) -> String {
    if matches!(place.url.scheme(), "s3" | "s3a") {
        return format!(
            "access_key_id: S3 refused the credentials: fix `access_key_id`/`secret_access_key` (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) ({error})"
        );
    }
    format!(
        "options: {} refused the credentials: fix the credentials in `options` (or the store's environment) ({error})",
        place.url
    )
}

#[async_trait]
impl Sink for S3Sink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let (store, prefix) = self.build_store()?;
        // One listing proves the bucket is there and the credentials work.
        let listed = prefix.as_deref().map(Path::from);
        if let Err(error) = store.list_with_delimiter(listed.as_ref()).await {
            return Err(match Refusal::of(&error) {
                Some(Refusal::NoBucket) => {
                    ConnectorError::fatal(missing_bucket(&self.place, &error))
                }
                Some(Refusal::Credentials) => {
                    ConnectorError::fatal(refused_credentials(&self.place, &error))
                }
                None => {
                    ConnectorError::transient(format!("cannot reach {}: {error}", self.place.url))
                }
            });
        }
        info!(store = %self.place.url, endpoint = ?self.config.endpoint, "s3 sink opened");
        self.store = Some(store);
        self.prefix = prefix;
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let mut topics = lock(&self.topics);
        let files = topics.entry(topic.clone()).or_default();
        for message in messages {
            let open = files.open.entry(message.partition_id).or_default();
            if let Some(closed) = open.push(&self.layout, topic, message) {
                files.closed.push_back(closed);
            }
        }
        Ok(())
    }

    fn deferred(&self) -> Option<Deferred> {
        Some(Deferred {
            flush_interval: Some(self.config.flush_interval).filter(|every| !every.is_zero()),
        })
    }

    async fn flush(&self, topic: &TopicRef, scope: Flush) -> Result<(), SinkError> {
        let waiting: Vec<ClosedFile> = {
            let mut topics = lock(&self.topics);
            let Some(files) = topics.get_mut(topic) else {
                return Ok(());
            };
            if scope == Flush::All {
                for (&partition_id, open) in &mut files.open {
                    if !open.is_empty() {
                        files
                            .closed
                            .push_back(open.close(&self.layout, partition_id));
                    }
                }
            }
            files.closed.iter().cloned().collect()
        };
        for file in waiting {
            self.upload(topic, &file).await?;
            let mut topics = lock(&self.topics);
            if let Some(files) = topics.get_mut(topic) {
                files.closed.pop_front();
                let durable = files.durable.entry(file.partition_id).or_default();
                *durable = (*durable).max(file.last_offset);
            }
        }
        Ok(())
    }

    fn durable(&self, topic: &TopicRef) -> Vec<(u32, u64)> {
        lock(&self.topics)
            .get(topic)
            .map(|files| {
                files
                    .durable
                    .iter()
                    .map(|(&partition, &offset)| (partition, offset))
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        // What is still buffered was not reported durable: it is read again.
        lock(&self.topics).clear();
        Ok(())
    }
}
