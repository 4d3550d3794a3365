//! `delta` sink: appends messages to a Delta Lake table (local, on S3, Azure
//! Blob Storage / ADLS Gen2 or GCS) through `deltalake-core`, exactly once.
//!
//! The sink defers acknowledgement (rule K6, docs/ARCHITECTURE.md): `write`
//! decodes each batch's JSON payloads into Arrow rows of the table's schema
//! (a payload that does not fit is rejected by its index) and buffers them
//! per partition; a flush (count, size, `flush_interval`, a stop) writes the
//! buffered rows as Parquet files and commits them in one Delta commit. The
//! commit carries one application transaction (`txn` action) per partition:
//! app id `iggy-connect/{key}/{stream}/{topic}/{partition}`, version the
//! partition's last offset in the commit. Before committing, the sink reads
//! those versions from the table and leaves out the rows at or below them,
//! so messages read again after a crash between the Delta commit and the
//! offset commit are not appended twice: exactly once into the table. Only
//! once the commit succeeded does `durable` report the offsets.
//!
//! Commit conflicts, connection errors and timeouts are transient (the table
//! is reloaded and the flush retried); a missing table (without
//! `create_table`), a schema that differs from `columns` or refused
//! credentials are fatal, naming the field to fix.

mod config;
mod errors;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use deltalake_core::arrow::array::RecordBatch;
use deltalake_core::arrow::compute::concat_batches;
use deltalake_core::arrow::datatypes::SchemaRef;
use deltalake_core::kernel::transaction::CommitProperties;
use deltalake_core::kernel::{StructField, Transaction};
use deltalake_core::logstore::{
    LogStore, LogStoreFactory, ObjectStoreRef, StorageConfig, default_logstore, logstore_factories,
};
use deltalake_core::protocol::SaveMode;
use deltalake_core::writer::{DeltaWriter, RecordBatchWriter};
use deltalake_core::{DeltaResult, DeltaTable, DeltaTableBuilder, DeltaTableError};
use object_store::aws::{AmazonS3Builder, S3ConditionalPut};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};
use tracing::{debug, info, warn};

use crate::connectors::kit::lake;
use crate::connectors::kit::store::{self, Requests};
use crate::connectors::{
    ConnectorContext, ConnectorError, Deferred, Flush, PluginConfigError, Sink, SinkEntry,
    SinkError, parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};
use crate::sync::lock;

pub use config::DeltaSinkConfig;
use config::{Checked, Location};
use errors::classify;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "delta",
    feature: "delta-sink",
    description: "appends JSON messages to a Delta Lake table on local disk, S3, Azure Blob/ADLS or GCS, exactly once (Parquet files, txn actions)",
    secret_fields: &[
        "aws_s3_access_key",
        "aws_s3_secret_key",
        "azure_storage_account_key",
        "azure_storage_sas_token",
        "gcs_service_account_key",
        "storage_options.*",
    ],
    sample_config: "table_uri = \"s3://lake/orders\"\naws_s3_access_key = \"key-id-secret\"\naws_s3_secret_key = \"secret\"\naws_s3_region = \"us-east-1\"\naws_s3_endpoint_url = \"http://127.0.0.1:9000\"\naws_s3_allow_http = true\ncreate_table = true\ncolumns = [\n  { name = \"id\", type = \"long\", nullable = false },\n  { name = \"customer\", type = \"string\" },\n  { name = \"total\", type = \"double\" },\n  { name = \"created_at\", type = \"timestamp\" },\n]\nmax_messages_per_file = 100000\nflush_interval = \"10s\"\nstorage_options = { aws_session_token = \"session-token-secret\" }\n# Used only by a table on Azure (az://, abfss://) or GCS (gs://):\nazure_storage_account_key = \"account-key-secret\"\nazure_storage_sas_token = \"sas-token-secret\"\ngcs_service_account_key = \"{ \\\"type\\\": \\\"service_account\\\", \\\"private_key\\\": \\\"secret\\\" }\"\n",
    config_schema: schema_of::<DeltaSinkConfig>,
    build: |config| Ok(Box::new(DeltaSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct DeltaSink {
    config: DeltaSinkConfig,
    checked: Checked,
    /// The connector's key: part of every app id.
    key: String,
    /// Loaded at open; one commit at a time.
    table: tokio::sync::Mutex<Option<DeltaTable>>,
    /// The table's Arrow schema, rows are decoded into.
    schema: Option<SchemaRef>,
    topics: Mutex<HashMap<TopicRef, Buffered>>,
}

/// One topic's rows waiting for their commit.
#[derive(Default)]
struct Buffered {
    partitions: BTreeMap<u32, Rows>,
    messages: u64,
    bytes: u64,
    /// Per partition, the last offset in the table.
    durable: BTreeMap<u32, u64>,
}

/// One partition's buffered rows, in offset order.
#[derive(Default)]
struct Rows {
    batches: Vec<RecordBatch>,
    /// The offset of every row, across `batches`.
    offsets: Vec<u64>,
}

impl DeltaSink {
    pub fn new(config: DeltaSinkConfig) -> Result<Self, PluginConfigError> {
        let checked = config.validate()?;
        Ok(Self {
            config,
            checked,
            key: "delta".to_owned(),
            table: tokio::sync::Mutex::new(None),
            schema: None,
            topics: Mutex::new(HashMap::new()),
        })
    }

    fn app_id(&self, topic: &TopicRef, partition: u32) -> String {
        format!(
            "iggy-connect/{}/{}/{}/{partition}",
            self.key, topic.stream, topic.topic
        )
    }

    /// The bucket's store, `/` at the bucket's root; commits use S3's
    /// conditional put (`If-None-Match: *`), so two writers never both
    /// commit one version.
    fn s3_store(&self) -> Result<ObjectStoreRef, ConnectorError> {
        let url = &self.checked.url;
        let mut builder = AmazonS3Builder::from_env()
            .with_url(format!("s3://{}", url.host_str().unwrap_or_default()))
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            // A few quick retries of one request; past them the flush fails
            // as transient and the engine retries it with its own backoff
            // (object_store's default keeps one request retrying for minutes).
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(5),
                    base: 2.0,
                },
                max_retries: 3,
                retry_timeout: Duration::from_secs(30),
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(self.config.aws_s3_allow_http)
                    .with_timeout(Duration::from_secs(60))
                    .with_connect_timeout(Duration::from_secs(10)),
            );
        for (key, value) in self.config.store_options(Location::S3) {
            let key = key.parse().map_err(|error| {
                ConnectorError::fatal(format!("cannot set up the S3 client: {error}"))
            })?;
            builder = builder.with_config(key, value);
        }
        if self.config.aws_s3_region.is_none() && std::env::var_os("AWS_REGION").is_none() {
            builder = builder.with_region("us-east-1");
        }
        let store = builder.build().map_err(|error| {
            ConnectorError::fatal(format!("cannot set up the S3 client: {error}"))
        })?;
        Ok(Arc::new(store))
    }

    fn table_builder(&self) -> Result<DeltaTableBuilder, ConnectorError> {
        let url = self.checked.url.clone();
        let builder = DeltaTableBuilder::from_url(url.clone())
            .map_err(|error| ConnectorError::fatal(format!("table_uri: \"{url}\": {error}")))?;
        Ok(match self.checked.location {
            Location::Local => builder,
            Location::S3 => {
                register_log_store("s3://");
                register_log_store("s3a://");
                builder.with_storage_backend(self.s3_store()?, url)
            }
            Location::Azure | Location::Gcs => {
                register_log_store(&format!("{}://", url.scheme()));
                builder.with_storage_backend(self.cloud_store()?, url)
            }
        })
    }

    /// The Azure container's or GCS bucket's store, `/` at its root. Both
    /// stores make a commit's put conditional (`If-None-Match: *`,
    /// `x-goog-if-generation-match: 0`), so two writers never both commit
    /// one version.
    fn cloud_store(&self) -> Result<ObjectStoreRef, ConnectorError> {
        let options = self.config.store_options(self.checked.location);
        // As for S3: a few quick retries of one request, then the engine's.
        let requests = Requests {
            timeout: Duration::from_secs(60),
            attempts: 4,
            first_delay: Duration::from_millis(100),
        };
        let (store, _) =
            store::open(&self.checked.url, &options, requests).map_err(|(option, message)| {
                let field = if option.is_empty() {
                    "table_uri".to_owned()
                } else {
                    format!("storage_options.{option}")
                };
                ConnectorError::fatal(format!(
                    "{field}: cannot set up the store client: {message}"
                ))
            })?;
        Ok(store)
    }

    async fn create(&self, table: DeltaTable) -> Result<DeltaTable, ConnectorError> {
        let columns = self
            .checked
            .columns
            .iter()
            .map(|(name, data_type, nullable)| {
                StructField::new(name.clone(), data_type.clone(), *nullable)
            });
        let created = table
            .create()
            .with_columns(columns)
            .with_partition_columns(self.config.partition_columns.clone())
            .with_save_mode(SaveMode::Ignore)
            .await
            .map_err(|error| self.open_error(error))?;
        info!(table = %self.checked.url, "delta table created");
        Ok(created)
    }

    /// The table's columns must be the configured ones, where any are.
    fn check_columns(&self, table: &DeltaTable) -> Result<(), ConnectorError> {
        let snapshot = table.snapshot().map_err(|error| self.open_error(error))?;
        let schema = snapshot.schema();
        for (name, data_type, _) in &self.checked.columns {
            match schema.field(name) {
                Some(field) if field.data_type() == data_type => {}
                Some(field) => {
                    return Err(ConnectorError::fatal(format!(
                        "columns: \"{name}\" is {} in the table at {}, not {data_type}: fix `columns` or the table",
                        field.data_type(),
                        self.checked.url
                    )));
                }
                None => {
                    return Err(ConnectorError::fatal(format!(
                        "columns: the table at {} has no column \"{name}\" (it has {}): fix `columns` or the table",
                        self.checked.url,
                        schema
                            .fields()
                            .map(|field| field.name().as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        Ok(())
    }

    /// The Delta kernel refuses a local table whose directory does not
    /// exist (rather than calling it "not a table"): made here when the sink
    /// is to create the table, refused naming the field otherwise.
    async fn prepare_local_directory(&self) -> Result<(), ConnectorError> {
        if self.checked.location != Location::Local {
            return Ok(());
        }
        let url = &self.checked.url;
        let path = url.to_file_path().map_err(|()| {
            ConnectorError::fatal(format!("table_uri: \"{url}\" is not a local path"))
        })?;
        if tokio::fs::metadata(&path)
            .await
            .is_ok_and(|metadata| metadata.is_dir())
        {
            return Ok(());
        }
        if !self.config.create_table {
            return Err(ConnectorError::fatal(format!(
                "table_uri: no Delta table at {url} (the directory does not exist): create it, or set create_table = true with `columns`"
            )));
        }
        tokio::fs::create_dir_all(&path).await.map_err(|error| {
            ConnectorError::fatal(format!(
                "table_uri: cannot create the table's directory {}: {error}",
                path.display()
            ))
        })
    }

    fn open_error(&self, error: DeltaTableError) -> ConnectorError {
        match classify(&self.checked.url, error) {
            SinkError::Transient { error, .. } => ConnectorError::transient(error.to_string()),
            other => ConnectorError::fatal(other.to_string()),
        }
    }

    /// Commits `taken` (one topic's rows) in one Delta commit, leaving out
    /// what the table already holds. Returns each partition's last offset.
    async fn commit(
        &self,
        topic: &TopicRef,
        taken: &BTreeMap<u32, Rows>,
    ) -> Result<BTreeMap<u32, u64>, SinkError> {
        let schema = self.schema()?;
        let mut guard = self.table.lock().await;
        let table = guard
            .as_mut()
            .ok_or_else(|| SinkError::fatal("the delta sink was not opened"))?;
        let url = &self.checked.url;
        let log_store = table.log_store();
        let snapshot = table.snapshot().map_err(|error| classify(url, error))?;
        let mut transactions = Vec::new();
        let mut batches = Vec::new();
        let mut last = BTreeMap::new();
        for (&partition, rows) in taken {
            let Some(&last_offset) = rows.offsets.last() else {
                continue;
            };
            last.insert(partition, last_offset);
            let app_id = self.app_id(topic, partition);
            let committed = snapshot
                .transaction_version(log_store.as_ref(), &app_id)
                .await
                .map_err(|error| classify(url, error))?;
            let skip = committed.map_or(0, |version| {
                rows.offsets
                    .partition_point(|&offset| i64::try_from(offset).unwrap_or(i64::MAX) <= version)
            });
            if skip > 0 {
                info!(
                    app_id,
                    skipped = skip,
                    "rows already in the delta table (a replay) left out"
                );
            }
            if skip == rows.offsets.len() {
                continue;
            }
            let rows_batch = concat_batches(schema, &rows.batches).map_err(SinkError::fatal)?;
            batches.push(rows_batch.slice(skip, rows_batch.num_rows() - skip));
            transactions.push(Transaction::new_with_last_update(
                app_id,
                i64::try_from(last_offset).map_err(SinkError::fatal)?,
                Some((crate::clock::now_micros() / 1000) as i64),
            ));
        }
        if batches.is_empty() {
            return Ok(last);
        }
        let result = async {
            let mut writer = RecordBatchWriter::for_table(table)?.with_commit_properties(
                CommitProperties::default().with_application_transactions(transactions),
            );
            for batch in batches {
                writer.write(batch).await?;
            }
            writer.flush_and_commit(table).await
        }
        .await;
        match result {
            Ok(version) => {
                debug!(table = %url, version, "delta commit");
                Ok(last)
            }
            Err(error) => {
                // Whatever happened (a conflict, a lost connection mid-commit),
                // the next attempt starts from the table as it now is.
                if let Err(reload) = table.update_state().await {
                    warn!(table = %url, error = %reload, "reloading the delta table failed");
                }
                Err(classify(url, error))
            }
        }
    }

    fn schema(&self) -> Result<&SchemaRef, SinkError> {
        self.schema
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the delta sink was not opened"))
    }
}

/// `deltalake-core` knows only local and in-memory tables; a table on
/// another store (`scheme`, as `s3://`) gets the default log store over the
/// store we build (commits by the store's conditional put).
fn register_log_store(scheme: &str) {
    struct DefaultLogStores;
    impl LogStoreFactory for DefaultLogStores {
        fn with_options(
            &self,
            prefixed_store: ObjectStoreRef,
            root_store: ObjectStoreRef,
            location: &url::Url,
            options: &StorageConfig,
        ) -> DeltaResult<Arc<dyn LogStore>> {
            Ok(default_logstore(
                prefixed_store,
                root_store,
                location,
                options,
            ))
        }
    }
    let Ok(scheme) = url::Url::parse(scheme) else {
        return;
    };
    logstore_factories()
        .entry(scheme)
        .or_insert_with(|| Arc::new(DefaultLogStores));
}

#[async_trait]
impl Sink for DeltaSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        self.prepare_local_directory().await?;
        let mut table = self
            .table_builder()?
            .build()
            .map_err(|error| self.open_error(error))?;
        match table.load().await {
            Ok(()) => {}
            Err(DeltaTableError::NotATable(_)) if self.config.create_table => {
                table = self.create(table).await?;
            }
            Err(error) => return Err(self.open_error(error)),
        }
        self.check_columns(&table)?;
        let writer =
            RecordBatchWriter::for_table(&table).map_err(|error| self.open_error(error))?;
        self.schema = Some(writer.arrow_schema());
        info!(
            table = %self.checked.url,
            version = table.version(),
            "delta sink opened"
        );
        *self.table.get_mut() = Some(table);
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let schema = self.schema()?;
        let mut by_partition: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        for (index, message) in messages.iter().enumerate() {
            by_partition
                .entry(message.partition_id)
                .or_default()
                .push(index);
        }
        let mut decoded = Vec::with_capacity(by_partition.len());
        let mut rejected = Vec::new();
        for (partition, indexes) in by_partition {
            match lake::decode(schema, messages, &indexes) {
                Ok(batch) => decoded.push((partition, indexes, batch)),
                Err(rejections) => rejected.extend(rejections),
            }
        }
        if !rejected.is_empty() {
            // A deferred sink's rejecting write accepts nothing: the engine
            // writes the rest again.
            rejected.sort_by_key(|rejection| rejection.index);
            return Err(SinkError::Rejected(rejected));
        }
        let mut topics = lock(&self.topics);
        let buffered = topics.entry(topic.clone()).or_default();
        for (partition, indexes, batch) in decoded {
            let rows = buffered.partitions.entry(partition).or_default();
            rows.offsets
                .extend(indexes.iter().map(|&index| messages[index].offset));
            buffered.messages += indexes.len() as u64;
            buffered.bytes += batch.get_array_memory_size() as u64;
            rows.batches.push(batch);
        }
        Ok(())
    }

    fn deferred(&self) -> Option<Deferred> {
        Some(Deferred {
            flush_interval: Some(self.config.flush_interval).filter(|every| !every.is_zero()),
        })
    }

    async fn flush(&self, topic: &TopicRef, scope: Flush) -> Result<(), SinkError> {
        let taken = {
            let mut topics = lock(&self.topics);
            let Some(buffered) = topics.get_mut(topic) else {
                return Ok(());
            };
            let due = buffered.messages >= self.config.max_messages_per_file
                || buffered.bytes >= self.checked.max_bytes;
            if buffered.messages == 0 || (scope == Flush::Due && !due) {
                return Ok(());
            }
            buffered.messages = 0;
            buffered.bytes = 0;
            std::mem::take(&mut buffered.partitions)
        };
        match self.commit(topic, &taken).await {
            Ok(last) => {
                let mut topics = lock(&self.topics);
                let buffered = topics.entry(topic.clone()).or_default();
                for (partition, offset) in last {
                    let durable = buffered.durable.entry(partition).or_default();
                    *durable = (*durable).max(offset);
                }
                Ok(())
            }
            Err(error) => {
                // Put the rows back in front of anything written since.
                let mut topics = lock(&self.topics);
                let buffered = topics.entry(topic.clone()).or_default();
                for (partition, mut rows) in taken {
                    let newer = buffered.partitions.remove(&partition).unwrap_or_default();
                    buffered.messages += rows.offsets.len() as u64;
                    buffered.bytes += rows
                        .batches
                        .iter()
                        .map(|batch| batch.get_array_memory_size() as u64)
                        .sum::<u64>();
                    rows.batches.extend(newer.batches);
                    rows.offsets.extend(newer.offsets);
                    buffered.partitions.insert(partition, rows);
                }
                Err(error)
            }
        }
    }

    fn durable(&self, topic: &TopicRef) -> Vec<(u32, u64)> {
        lock(&self.topics)
            .get(topic)
            .map(|buffered| {
                buffered
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
        *self.table.get_mut() = None;
        Ok(())
    }
}
