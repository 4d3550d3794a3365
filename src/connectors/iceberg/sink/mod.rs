//! `iceberg` sink: appends JSON messages to Apache Iceberg tables through the
//! `iceberg` crate, exactly once, with a REST catalog (upstream's) or a
//! memory catalog over a local filesystem warehouse (ours, for local use).
//! Table files go to the local filesystem or to S3 (`files.rs`).
//!
//! The sink defers acknowledgement (rule K6, docs/ARCHITECTURE.md): `write`
//! decodes each batch's JSON payloads into Arrow rows of every target table's
//! schema (a payload that does not fit is rejected by its index) and buffers
//! them per table and partition; a flush (count, size, `flush_interval`, a
//! stop) writes each table's rows as Parquet data files and commits them in
//! one fast-append snapshot. The snapshot's summary records, per partition,
//! the last offset the table holds: `iggy-connect.{key}.{stream}/{topic}/{partition}`.
//! Before committing, the sink reads those markers from the table's snapshot
//! ancestry and leaves out rows at or below them, so messages read again
//! after a crash between the Iceberg commit and the offset commit are not
//! appended twice. Every commit carries all of the connector's markers
//! forward, so they survive snapshot expiry of older snapshots. Only once
//! every table holding a partition's rows committed does `durable` report it.
//!
//! Commit conflicts, connection errors, 5xx and commits slower than
//! `commit_timeout` are transient: the engine retries the flush, which reads
//! the table and its markers again (each commit is made against exactly the
//! snapshot its markers came from, see `pinned.rs`); a missing table (without
//! `create_table`), columns that differ from `columns` or a refused request
//! are fatal, naming the field to fix.

mod catalog;
mod config;
mod files;
mod pinned;
mod rows;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use arrow_select::concat::concat_batches;
use async_trait::async_trait;
use iceberg::Catalog;
use iceberg::arrow::schema_to_arrow_schema;
use iceberg::spec::DataFileFormat;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::writer::base_writer::data_file_writer::DataFileWriterBuilder;
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::file::properties::WriterProperties;
use tracing::{debug, info};

use crate::connectors::kit::lake;
use crate::connectors::{
    ConnectorContext, ConnectorError, Deferred, Flush, PluginConfigError, Rejection, Sink,
    SinkEntry, SinkError, parse_plugin_config, schema_of,
};
use crate::message::{SinkMessage, TopicRef};
use crate::sync::lock;

use catalog::{classify, table_name};
use config::Checked;
pub use config::IcebergSinkConfig;

pub const ENTRY: SinkEntry = SinkEntry {
    name: "iceberg",
    feature: "iceberg-sink",
    description: "appends JSON messages to Apache Iceberg tables (REST or memory catalog), exactly once (offsets in snapshots)",
    secret_fields: &[
        "store_access_key_id",
        "store_secret_access_key",
        "store_options.*",
    ],
    sample_config: "tables = [\"shop.orders\"]\ncatalog_type = \"rest\"\nuri = \"http://localhost:8181\"\nwarehouse = \"warehouse\"\nstore_url = \"http://localhost:9000\"\nstore_access_key_id = \"key-id-secret\"\nstore_secret_access_key = \"secret\"\nstore_region = \"us-east-1\"\nstore_class = \"s3\"\ncreate_table = true\ncolumns = [\n  { name = \"id\", type = \"long\", nullable = false },\n  { name = \"customer\", type = \"string\" },\n  { name = \"total\", type = \"double\" },\n  { name = \"created_at\", type = \"timestamptz\" },\n]\nmax_messages_per_file = 100000\nflush_interval = \"10s\"\nstore_options = { azure_storage_account_name = \"iggylake\", azure_storage_account_key = \"account-key-secret\" }\n",
    config_schema: schema_of::<IcebergSinkConfig>,
    build: |config| Ok(Box::new(IcebergSink::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

pub struct IcebergSink {
    config: IcebergSinkConfig,
    checked: Checked,
    /// `tables` as `namespace.table`, the names dynamic routing matches.
    names: Vec<String>,
    /// The connector's key: part of every offset marker.
    key: String,
    catalog: Option<Arc<dyn Catalog>>,
    /// Per table (in `tables` order), the Arrow schema rows are decoded into.
    schemas: Vec<SchemaRef>,
    topics: Mutex<HashMap<TopicRef, Buffered>>,
    /// One flush at a time: two commits of one table would only conflict.
    committing: tokio::sync::Mutex<()>,
}

/// One topic's rows waiting for their commits.
#[derive(Default)]
struct Buffered {
    /// Per table index, per partition.
    tables: BTreeMap<usize, BTreeMap<u32, Rows>>,
    /// Per partition, the last offset written to the sink.
    accepted: BTreeMap<u32, u64>,
    messages: u64,
    bytes: u64,
    /// Per partition, the last offset in every table it was routed to.
    durable: BTreeMap<u32, u64>,
}

/// One partition's buffered rows for one table, in offset order.
#[derive(Default)]
struct Rows {
    batches: Vec<RecordBatch>,
    /// The offset of every row, across `batches`.
    offsets: Vec<u64>,
}

impl Rows {
    fn bytes(&self) -> u64 {
        self.batches
            .iter()
            .map(|batch| batch.get_array_memory_size() as u64)
            .sum()
    }
}

impl IcebergSink {
    pub fn new(config: IcebergSinkConfig) -> Result<Self, PluginConfigError> {
        let checked = config.validate()?;
        let names = checked.tables.iter().map(table_name).collect();
        Ok(Self {
            config,
            checked,
            names,
            key: "iceberg".to_owned(),
            catalog: None,
            schemas: Vec::new(),
            topics: Mutex::new(HashMap::new()),
            committing: tokio::sync::Mutex::new(()),
        })
    }

    /// The summary property holding a partition's last offset in the table.
    fn marker(&self, topic: &TopicRef, partition: u32) -> String {
        format!(
            "{}{}/{}/{partition}",
            self.marker_prefix(),
            topic.stream,
            topic.topic
        )
    }

    fn marker_prefix(&self) -> String {
        format!("iggy-connect.{}.", self.key)
    }

    fn catalog(&self) -> Result<&Arc<dyn Catalog>, SinkError> {
        self.catalog
            .as_ref()
            .ok_or_else(|| SinkError::fatal("the iceberg sink was not opened"))
    }

    /// Commits one table's rows of `topic` in one snapshot, leaving out what
    /// the table already holds.
    async fn commit(
        &self,
        topic: &TopicRef,
        index: usize,
        taken: &BTreeMap<u32, Rows>,
    ) -> Result<(), SinkError> {
        let catalog = self.catalog()?;
        let ident = &self.checked.tables[index];
        let name = &self.names[index];
        let table = catalog::current_table(catalog.as_ref(), &self.checked, ident)
            .await
            .map_err(|error| classify(name, error))?;
        let schema = &self.schemas[index];
        let current = schema_to_arrow_schema(table.metadata().current_schema())
            .map_err(|error| classify(name, error))?;
        if current.fields() != schema.fields() {
            return Err(SinkError::fatal(format!(
                "tables: the schema of {name} changed since the sink opened: restart the connector to write the new schema"
            )));
        }
        let mut markers = markers(&table, &self.marker_prefix());
        let mut batches = Vec::new();
        for (&partition, rows) in taken {
            let Some(&last) = rows.offsets.last() else {
                continue;
            };
            let marker = self.marker(topic, partition);
            let committed = markers.get(&marker).copied();
            let skip = committed.map_or(0, |committed| {
                rows.offsets.partition_point(|&offset| offset <= committed)
            });
            if skip > 0 {
                info!(table = %name, marker, skipped = skip, "rows already in the iceberg table (a replay) left out");
            }
            if skip == rows.offsets.len() {
                continue;
            }
            let all = concat_batches(schema, &rows.batches).map_err(SinkError::fatal)?;
            batches.push(all.slice(skip, all.num_rows() - skip));
            markers.insert(
                marker,
                committed.map_or(last, |committed| committed.max(last)),
            );
        }
        if batches.is_empty() {
            return Ok(());
        }
        let files = write_files(&table, batches)
            .await
            .map_err(|error| classify(name, error))?;
        let properties = markers
            .into_iter()
            .map(|(marker, offset)| (marker, offset.to_string()))
            .collect();
        let transaction = Transaction::new(&table);
        let append = transaction
            .fast_append()
            .add_data_files(files)
            .set_snapshot_properties(properties);
        // Committed against exactly `table` (the snapshot the markers were
        // read from): a conflict is returned, and the engine retries the
        // whole flush, which reads the markers again.
        let pinned = pinned::Pinned {
            inner: catalog.as_ref(),
            table,
        };
        let committed = append
            .apply(transaction)
            .map_err(|error| classify(name, error))?
            .commit(&pinned)
            .await
            .map_err(|error| classify(name, error))?;
        debug!(
            table = %name,
            snapshot = committed.metadata().current_snapshot_id(),
            "iceberg commit"
        );
        Ok(())
    }
}

/// The connector's markers in the table's snapshot ancestry (highest per
/// marker): the last offset of each partition the table holds.
fn markers(table: &Table, prefix: &str) -> BTreeMap<String, u64> {
    let metadata = table.metadata();
    let mut found = BTreeMap::new();
    let mut next = metadata.current_snapshot();
    while let Some(snapshot) = next {
        for (property, value) in &snapshot.summary().additional_properties {
            if property.starts_with(prefix)
                && let Ok(offset) = value.parse::<u64>()
            {
                let entry = found.entry(property.clone()).or_insert(offset);
                *entry = (*entry).max(offset);
            }
        }
        next = snapshot
            .parent_snapshot_id()
            .and_then(|parent| metadata.snapshot_by_id(parent));
    }
    found
}

/// Writes `batches` as Parquet data files of `table` (unpartitioned).
async fn write_files(
    table: &Table,
    batches: Vec<RecordBatch>,
) -> iceberg::Result<Vec<iceberg::spec::DataFile>> {
    let metadata = table.metadata();
    let parquet = ParquetWriterBuilder::new(
        WriterProperties::default(),
        metadata.current_schema().clone(),
    );
    // Unique names: a retried flush writes new files, never over old ones.
    let names = DefaultFileNameGenerator::new(
        format!("iggy-connect-{}", uuid::Uuid::now_v7()),
        None,
        DataFileFormat::Parquet,
    );
    let rolling = RollingFileWriterBuilder::new_with_default_file_size(
        parquet,
        table.file_io().clone(),
        DefaultLocationGenerator::new(metadata)?,
        names,
    );
    let mut writer = DataFileWriterBuilder::new(rolling).build(None).await?;
    for batch in batches {
        writer.write(batch).await?;
    }
    writer.close().await
}

#[async_trait]
impl Sink for IcebergSink {
    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
    }

    async fn open(&mut self) -> Result<(), ConnectorError> {
        let catalog = catalog::connect(&self.config, &self.checked).await?;
        let mut schemas = Vec::with_capacity(self.checked.tables.len());
        for (ident, name) in self.checked.tables.iter().zip(&self.names) {
            let table =
                catalog::open_table(catalog.as_ref(), &self.config, &self.checked, ident).await?;
            catalog::check_table(&table, name, &self.checked)?;
            let schema = schema_to_arrow_schema(table.metadata().current_schema())
                .map_err(|error| ConnectorError::fatal(format!("tables: {name}: {error}")))?;
            info!(
                table = %name,
                location = table.metadata().location(),
                snapshot = table.metadata().current_snapshot_id(),
                "iceberg table opened"
            );
            schemas.push(Arc::new(schema));
        }
        self.schemas = schemas;
        self.catalog = Some(catalog);
        Ok(())
    }

    fn accepts_json_bytes(&self) -> bool {
        true
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if self.schemas.is_empty() {
            return Err(SinkError::fatal("the iceberg sink was not opened"));
        }
        let mut rejected: BTreeMap<usize, String> = BTreeMap::new();
        let mut targets: BTreeMap<(usize, u32), Vec<usize>> = BTreeMap::new();
        for (index, message) in messages.iter().enumerate() {
            if self.config.dynamic_routing {
                match rows::route(message, &self.config.dynamic_route_field, &self.names) {
                    Ok(table) => targets
                        .entry((table, message.partition_id))
                        .or_default()
                        .push(index),
                    Err(reason) => {
                        rejected.insert(index, reason);
                    }
                }
            } else {
                // Upstream's static routing: every message to every table.
                for table in 0..self.schemas.len() {
                    targets
                        .entry((table, message.partition_id))
                        .or_default()
                        .push(index);
                }
            }
        }
        let mut decoded = Vec::with_capacity(targets.len());
        for ((table, partition), indexes) in targets {
            match lake::decode(&self.schemas[table], messages, &indexes) {
                Ok(batch) => decoded.push((table, partition, indexes, batch)),
                Err(rejections) => {
                    for Rejection { index, reason } in rejections {
                        rejected
                            .entry(index)
                            .or_insert_with(|| format!("table {}: {reason}", self.names[table]));
                    }
                }
            }
        }
        if !rejected.is_empty() {
            // A deferred sink's rejecting write accepts nothing: the engine
            // writes the rest again.
            return Err(SinkError::Rejected(
                rejected
                    .into_iter()
                    .map(|(index, reason)| Rejection { index, reason })
                    .collect(),
            ));
        }
        let mut topics = lock(&self.topics);
        let buffered = topics.entry(topic.clone()).or_default();
        for (table, partition, indexes, batch) in decoded {
            let rows = buffered
                .tables
                .entry(table)
                .or_default()
                .entry(partition)
                .or_default();
            rows.offsets
                .extend(indexes.iter().map(|&index| messages[index].offset));
            buffered.bytes += batch.get_array_memory_size() as u64;
            rows.batches.push(batch);
        }
        for message in messages {
            let accepted = buffered.accepted.entry(message.partition_id).or_default();
            *accepted = (*accepted).max(message.offset);
        }
        buffered.messages += messages.len() as u64;
        Ok(())
    }

    fn deferred(&self) -> Option<Deferred> {
        Some(Deferred {
            flush_interval: Some(self.config.flush_interval).filter(|every| !every.is_zero()),
        })
    }

    async fn flush(&self, topic: &TopicRef, scope: Flush) -> Result<(), SinkError> {
        let _one_at_a_time = self.committing.lock().await;
        let (taken, accepted) = {
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
            (
                std::mem::take(&mut buffered.tables),
                buffered.accepted.clone(),
            )
        };
        let mut pending = taken.into_iter();
        while let Some((table, rows)) = pending.next() {
            let timeout = self.config.commit_timeout;
            let committed = tokio::time::timeout(timeout, self.commit(topic, table, &rows))
                .await
                .unwrap_or_else(|_| {
                    Err(SinkError::transient(format!(
                        "iceberg table {}: the commit took longer than commit_timeout ({}); retried",
                        self.names[table],
                        humantime::format_duration(timeout)
                    )))
                });
            if let Err(error) = committed {
                // Put this table's rows and the untried ones back in front of
                // anything written since; the committed tables' are done.
                let mut topics = lock(&self.topics);
                let buffered = topics.entry(topic.clone()).or_default();
                for (table, partitions) in std::iter::once((table, rows)).chain(pending) {
                    let newer = buffered.tables.entry(table).or_default();
                    for (partition, mut rows) in partitions {
                        let later = newer.remove(&partition).unwrap_or_default();
                        buffered.messages += rows.offsets.len() as u64;
                        buffered.bytes += rows.bytes();
                        rows.batches.extend(later.batches);
                        rows.offsets.extend(later.offsets);
                        newer.insert(partition, rows);
                    }
                }
                return Err(error);
            }
        }
        // Everything accepted up to the take is in its tables now.
        let mut topics = lock(&self.topics);
        let buffered = topics.entry(topic.clone()).or_default();
        for (partition, offset) in accepted {
            let durable = buffered.durable.entry(partition).or_default();
            *durable = (*durable).max(offset);
        }
        Ok(())
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
        self.catalog = None;
        Ok(())
    }
}
