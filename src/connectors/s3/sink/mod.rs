//! `s3` sink: writes messages as objects to Amazon S3 or an S3-compatible
//! store (MinIO, R2, ...), through `object_store`.
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
use std::time::Duration;

use async_trait::async_trait;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig,
};
use secrecy::ExposeSecret;
use tracing::{debug, info};

use crate::connectors::kit::store::Refusal;
use crate::connectors::{
    ConnectorError, Deferred, Flush, PluginConfigError, Sink, SinkEntry, SinkError,
    parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};
use crate::sync::lock;

pub use config::{Compression, FileRotation, OutputFormat, S3SinkConfig};
use file::{ClosedFile, Layout, OpenFile};

pub const ENTRY: SinkEntry = SinkEntry {
    name: "s3",
    feature: "s3-sink",
    description: "writes messages as objects to S3 or an S3-compatible store (keys from offsets: a replay overwrites)",
    secret_fields: &["access_key_id", "secret_access_key"],
    sample_config: "bucket = \"iggy-data\"\nregion = \"us-east-1\"\nprefix = \"iggy/raw\"\nendpoint = \"http://127.0.0.1:9000\"\naccess_key_id = \"key-id-secret\"\nsecret_access_key = \"secret\"\nfile_rotation = \"messages\"\nmax_messages_per_file = 10000\noutput_format = \"json_lines\"\ncompression = \"gzip\"\nflush_interval = \"60s\"\n",
    config_schema: schema_of::<S3SinkConfig>,
    build: |config| Ok(Box::new(S3Sink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct S3Sink {
    config: S3SinkConfig,
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
        let (rotation, part_size) = config.validate()?;
        let layout = Layout {
            format: config.output_format,
            include_metadata: config.include_metadata,
            include_headers: config.include_headers,
            rotation,
        };
        Ok(Self {
            config,
            layout,
            part_size,
            store: None,
            topics: Mutex::new(HashMap::new()),
        })
    }

    fn build_store(&self) -> Result<Arc<dyn ObjectStore>, ConnectorError> {
        let config = &self.config;
        // The AWS_* environment first; the file's fields win over it.
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_virtual_hosted_style_request(!config.path_style())
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: config.retry_delay,
                    max_backoff: Duration::from_secs(60),
                    base: 2.0,
                },
                max_retries: config.max_attempts.saturating_sub(1) as usize,
                retry_timeout: Duration::from_secs(180),
            })
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(config.request_timeout)
                    .with_connect_timeout(config.request_timeout.min(Duration::from_secs(10)))
                    .with_allow_http(true),
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder.with_endpoint(endpoint).with_allow_http(true);
        }
        if let (Some(key), Some(secret)) = (&config.access_key_id, &config.secret_access_key) {
            builder = builder
                .with_access_key_id(key.expose_secret())
                .with_secret_access_key(secret.expose_secret());
        }
        let store = builder.build().map_err(|error| {
            ConnectorError::fatal(format!("cannot set up the S3 client: {error}"))
        })?;
        Ok(Arc::new(store))
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
            config.prefix.as_deref(),
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
        debug!(bucket = %config.bucket, key, bytes = size, messages = file.count, "object uploaded");
        Ok(())
    }

    /// Which S3 errors are worth retrying.
    fn classify(&self, key: &str, error: object_store::Error) -> SinkError {
        match Refusal::of(&error) {
            Some(Refusal::NoBucket) => {
                SinkError::fatal(missing_bucket(&self.config.bucket, &error))
            }
            Some(Refusal::Credentials) => SinkError::fatal(refused_credentials(&error)),
            None => {
                let bucket = &self.config.bucket;
                let message = format!("upload of s3://{bucket}/{key} failed: {error}");
                match error {
                    object_store::Error::Generic { .. } => SinkError::transient(message),
                    _ => SinkError::fatal(message),
                }
            }
        }
    }
}

fn missing_bucket(bucket: &str, error: &object_store::Error) -> String {
    format!(
        "bucket: \"{bucket}\" does not exist (or is not at the endpoint): create it, or fix `bucket`, `region` or `endpoint` ({error})"
    )
}

fn refused_credentials(error: &object_store::Error) -> String {
    format!(
        "access_key_id: S3 refused the credentials: fix `access_key_id`/`secret_access_key` (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY) ({error})"
    )
}

#[async_trait]
impl Sink for S3Sink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let store = self.build_store()?;
        // One listing proves the bucket is there and the credentials work.
        let prefix = self
            .config
            .prefix
            .as_deref()
            .map(|prefix| Path::from(prefix.trim_matches('/')));
        if let Err(error) = store.list_with_delimiter(prefix.as_ref()).await {
            return Err(match Refusal::of(&error) {
                Some(Refusal::NoBucket) => {
                    ConnectorError::fatal(missing_bucket(&self.config.bucket, &error))
                }
                Some(Refusal::Credentials) => ConnectorError::fatal(refused_credentials(&error)),
                None => ConnectorError::transient(format!(
                    "cannot reach bucket \"{}\": {error}",
                    self.config.bucket
                )),
            });
        }
        info!(bucket = %self.config.bucket, endpoint = ?self.config.endpoint, "s3 sink opened");
        self.store = Some(store);
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
