//! Where the tables' files are read and written: the local filesystem for
//! `file://` (and bare) paths, S3 for `s3://`/`s3a://` paths through
//! `object_store` with upstream's `store_*` settings, and Azure Blob / ADLS
//! Gen2 (`az://`, `abfs://`, `abfss://`) and GCS (`gs://`) paths through
//! `object_store` with `store_options`. The `iceberg` crate 0.10 has only
//! local and in-memory storage built in (its `azdls`/`gcs` property names
//! but no storage behind them); this is its S3, Azure and GCS.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileMetadata, FileRead, FileWrite, InputFile, LocalFsStorage, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use iceberg::{Error, ErrorKind, Result};
use object_store::aws::AmazonS3Builder;
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ClientOptions, ObjectStore, ObjectStoreExt};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use crate::connectors::kit::store::{self, Refusal, Requests};
use crate::sync::lock;

/// Upstream's `store_*` settings, and `store_options` for Azure and GCS.
#[derive(Debug, Default)]
pub struct S3Settings {
    pub endpoint: Option<String>,
    pub access_key_id: Option<SecretString>,
    pub secret_access_key: Option<SecretString>,
    pub region: Option<String>,
    /// `object_store`'s options of the Azure and GCS stores.
    pub options: BTreeMap<String, SecretString>,
}

/// The storage and its factory (the catalogs ask a factory). The settings
/// are not serialized: `iceberg` requires the trait, this crate never
/// serializes a storage, and secrets stay out of any serialized form.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Files {
    #[serde(skip)]
    s3: Option<Arc<S3>>,
}

#[derive(Debug, Default)]
struct S3 {
    settings: S3Settings,
    /// One client per bucket, made on first use.
    buckets: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
    /// One client per Azure container or GCS bucket (`scheme://authority`).
    clouds: Mutex<HashMap<String, Arc<dyn ObjectStore>>>,
}

impl Files {
    pub fn new(settings: S3Settings) -> Self {
        Self {
            s3: Some(Arc::new(S3 {
                settings,
                buckets: Mutex::default(),
                clouds: Mutex::default(),
            })),
        }
    }
}

/// A path on a store: the bucket's (container's) client and the key.
enum Place {
    Local,
    S3(Arc<dyn ObjectStore>, Path),
}

/// The schemes of Azure and GCS paths.
const CLOUD_SCHEMES: [&str; 4] = ["az://", "abfs://", "abfss://", "gs://"];

impl Files {
    fn place(&self, path: &str) -> Result<Place> {
        if CLOUD_SCHEMES.iter().any(|scheme| path.starts_with(scheme)) {
            return self.cloud_place(path);
        }
        let Some(rest) = path
            .strip_prefix("s3://")
            .or_else(|| path.strip_prefix("s3a://"))
        else {
            return Ok(Place::Local);
        };
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        let s3 = self
            .s3
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "the S3 storage has no settings"))?;
        let mut buckets = lock(&s3.buckets);
        let store = match buckets.get(bucket) {
            Some(store) => store.clone(),
            None => {
                let store = s3.client(bucket)?;
                buckets.insert(bucket.to_owned(), store.clone());
                store
            }
        };
        Ok(Place::S3(store, Path::from(key)))
    }
}

impl Files {
    /// An Azure or GCS path: its container's (bucket's) client, made once.
    fn cloud_place(&self, path: &str) -> Result<Place> {
        let settings = self
            .s3
            .as_ref()
            .ok_or_else(|| Error::new(ErrorKind::Unexpected, "the storage has no settings"))?;
        let url = url::Url::parse(path)
            .map_err(|error| Error::new(ErrorKind::DataInvalid, format!("{path}: {error}")))?;
        let root = format!("{}://{}", url.scheme(), url.authority());
        let mut clouds = lock(&settings.clouds);
        if let Some(client) = clouds.get(&root)
            && let Ok((_, key)) = object_store::ObjectStoreScheme::parse(&url)
        {
            return Ok(Place::S3(client.clone(), key));
        }
        let options: Vec<(String, String)> = settings
            .settings
            .options
            .iter()
            .map(|(key, value)| (key.clone(), value.expose_secret().to_owned()))
            .collect();
        // Quick retries of one request; past them the flush is retried.
        let requests = Requests {
            timeout: Duration::from_secs(60),
            attempts: 4,
            first_delay: Duration::from_millis(100),
        };
        let (opened, key) =
            store::open(&url, &options, requests).map_err(|(option, message)| {
                let field = if option.is_empty() {
                    "tables".to_owned()
                } else {
                    format!("store_options.{option}")
                };
                Error::new(
                    ErrorKind::DataInvalid,
                    format!("{field}: cannot set up the store client for {root}: {message}"),
                )
            })?;
        clouds.insert(root, opened.clone());
        Ok(Place::S3(opened, key))
    }
}

impl S3 {
    fn client(&self, bucket: &str) -> Result<Arc<dyn ObjectStore>> {
        let settings = &self.settings;
        // Neither key set: the AWS_* environment, then the instance's role.
        let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
        if let Some(endpoint) = &settings.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false)
                .with_client_options(
                    ClientOptions::new().with_allow_http(endpoint.starts_with("http://")),
                );
        }
        if let (Some(key), Some(secret)) = (&settings.access_key_id, &settings.secret_access_key) {
            builder = builder
                .with_access_key_id(key.expose_secret())
                .with_secret_access_key(secret.expose_secret());
        }
        match &settings.region {
            Some(region) => builder = builder.with_region(region),
            None if std::env::var_os("AWS_REGION").is_none() => {
                builder = builder.with_region("us-east-1")
            }
            None => {}
        }
        let store = builder.build().map_err(|error| {
            Error::new(
                ErrorKind::DataInvalid,
                format!("store_url: cannot set up the S3 client for bucket {bucket}: {error}"),
            )
        })?;
        Ok(Arc::new(store))
    }
}

/// Refused credentials and a missing bucket are not worth retrying: they
/// become errors naming the field to fix; the rest stay retryable.
fn s3_error(path: &str, error: object_store::Error) -> Error {
    let cloud = CLOUD_SCHEMES.iter().any(|scheme| path.starts_with(scheme));
    let (kind, message) = match Refusal::of(&error) {
        Some(Refusal::Credentials) if cloud => (
            ErrorKind::PreconditionFailed,
            format!(
                "store_options: the object store refused the credentials for {path}: fix the credentials in `store_options` (or the store's environment)"
            ),
        ),
        Some(Refusal::Credentials) => (
            ErrorKind::PreconditionFailed,
            format!(
                "store_access_key_id: the object store refused the credentials for {path}: fix `store_access_key_id`/`store_secret_access_key` (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)"
            ),
        ),
        Some(Refusal::NoBucket) => (
            ErrorKind::PreconditionFailed,
            format!(
                "store_url: the bucket or container of {path} does not exist: create it or fix the table's location"
            ),
        ),
        None => (ErrorKind::Unexpected, format!("object store {path}")),
    };
    Error::new(kind, message).with_source(error)
}

fn not_found(error: &object_store::Error) -> bool {
    matches!(error, object_store::Error::NotFound { .. })
}

#[async_trait]
#[typetag::serde(name = "IggyConnectFiles")]
impl Storage for Files {
    async fn exists(&self, path: &str) -> Result<bool> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().exists(path).await,
            Place::S3(store, key) => match store.head(&key).await {
                Ok(_) => Ok(true),
                Err(error) if not_found(&error) => Ok(false),
                Err(error) => Err(s3_error(path, error)),
            },
        }
    }

    async fn metadata(&self, path: &str) -> Result<FileMetadata> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().metadata(path).await,
            Place::S3(store, key) => {
                let meta = store.head(&key).await.map_err(|e| s3_error(path, e))?;
                Ok(FileMetadata { size: meta.size })
            }
        }
    }

    async fn read(&self, path: &str) -> Result<Bytes> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().read(path).await,
            Place::S3(store, key) => {
                let got = store.get(&key).await.map_err(|e| s3_error(path, e))?;
                got.bytes().await.map_err(|e| s3_error(path, e))
            }
        }
    }

    async fn reader(&self, path: &str) -> Result<Box<dyn FileRead>> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().reader(path).await,
            Place::S3(store, key) => Ok(Box::new(S3Read {
                store,
                key,
                path: path.to_owned(),
            })),
        }
    }

    async fn write(&self, path: &str, bs: Bytes) -> Result<()> {
        match self.place(path)? {
            // Whole files (table metadata among them) appear whole or not at
            // all: the memory catalog takes the newest metadata file it finds,
            // and a process killed mid-write must not leave half of one.
            Place::Local => write_whole(path, bs).await,
            Place::S3(store, key) => {
                store
                    .put(&key, bs.into())
                    .await
                    .map_err(|e| s3_error(path, e))?;
                Ok(())
            }
        }
    }

    async fn writer(&self, path: &str) -> Result<Box<dyn FileWrite>> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().writer(path).await,
            // Buffered, then one PUT, or a multipart upload when large.
            Place::S3(store, key) => Ok(Box::new(S3Write {
                upload: BufWriter::new(store, key),
                path: path.to_owned(),
            })),
        }
    }

    async fn delete(&self, path: &str) -> Result<()> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().delete(path).await,
            Place::S3(store, key) => match store.delete(&key).await {
                Err(error) if !not_found(&error) => Err(s3_error(path, error)),
                _ => Ok(()),
            },
        }
    }

    async fn delete_prefix(&self, path: &str) -> Result<()> {
        match self.place(path)? {
            Place::Local => LocalFsStorage::new().delete_prefix(path).await,
            Place::S3(store, prefix) => {
                let mut listed = store.list(Some(&prefix));
                while let Some(meta) = listed.next().await {
                    let meta = meta.map_err(|e| s3_error(path, e))?;
                    store
                        .delete(&meta.location)
                        .await
                        .map_err(|e| s3_error(path, e))?;
                }
                Ok(())
            }
        }
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> Result<()> {
        while let Some(path) = paths.next().await {
            self.delete(&path).await?;
        }
        Ok(())
    }

    fn new_input(&self, path: &str) -> Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_owned()))
    }

    fn new_output(&self, path: &str) -> Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_owned()))
    }
}

/// Writes `bs` to a temporary file beside `path`, syncs it and renames it
/// over `path`.
async fn write_whole(path: &str, bs: Bytes) -> Result<()> {
    let local = path
        .strip_prefix("file://")
        .or_else(|| path.strip_prefix("file:"))
        .unwrap_or(path)
        .to_owned();
    let io = |error: std::io::Error| {
        Error::new(ErrorKind::Unexpected, format!("writing {path}")).with_source(error)
    };
    tokio::task::spawn_blocking(move || {
        let target = std::path::PathBuf::from(&local);
        let dir = target
            .parent()
            .map(std::path::Path::to_path_buf)
            .unwrap_or_default();
        std::fs::create_dir_all(&dir)?;
        let temporary = dir.join(format!(".{}.tmp", uuid::Uuid::now_v7()));
        let result = (|| {
            let mut file = std::fs::File::create(&temporary)?;
            std::io::Write::write_all(&mut file, &bs)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &target)?;
            std::fs::File::open(&dir)?.sync_all()
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        result
    })
    .await
    .map_err(|error| {
        Error::new(ErrorKind::Unexpected, format!("writing {path}")).with_source(error)
    })?
    .map_err(io)
}

#[typetag::serde(name = "IggyConnectFilesFactory")]
impl StorageFactory for Files {
    fn build(&self, _config: &StorageConfig) -> Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.clone()))
    }
}

struct S3Read {
    store: Arc<dyn ObjectStore>,
    key: Path,
    path: String,
}

#[async_trait]
impl FileRead for S3Read {
    async fn read(&self, range: Range<u64>) -> Result<Bytes> {
        self.store
            .get_range(&self.key, range)
            .await
            .map_err(|e| s3_error(&self.path, e))
    }
}

struct S3Write {
    upload: BufWriter,
    path: String,
}

#[async_trait]
impl FileWrite for S3Write {
    async fn write(&mut self, bs: Bytes) -> Result<()> {
        self.upload
            .put(bs)
            .await
            .map_err(|e| s3_error(&self.path, e))
    }

    async fn close(&mut self) -> Result<()> {
        self.upload.shutdown().await.map_err(|error| {
            Error::new(ErrorKind::Unexpected, format!("S3 {}", self.path)).with_source(error)
        })
    }
}
