//! `object_store` source: reads the objects under a prefix of any store the
//! `object_store` crate speaks, in a stable order (by key, or by
//! last-modified time then key), and sends one message per record.
//!
//! A batch holds up to `batch_size` records and may span several objects;
//! its state is a watermark (every object at or below it in reading order is
//! finished) plus how many records of the object being read are in a batch,
//! so a restart resumes at the record after the last committed one and never
//! reads a finished object again. Objects are deleted or moved only in
//! `commit`, after Iggy acknowledged their records and the state covering
//! them was saved. An object that cannot be decoded (or is larger than
//! `max_object_bytes`) is skipped with its key logged, set aside for the
//! engine to dead-letter, or stops the source (`on_error`). Up to
//! `parallel_reads` objects are fetched and decoded at once; their records
//! still go out in reading order. Listing and reading errors are
//! classified: a missing bucket or refused credentials are fatal, the rest
//! transient (the engine retries).

mod config;
mod decode;
mod state;

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use ::object_store::path::Path;
use ::object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use async_trait::async_trait;
use futures::TryStreamExt;
use secrecy::ExposeSecret;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::connectors::kit::row_id::hash_id;
use crate::connectors::kit::store::{self, Refusal, Requests};
use crate::connectors::{
    ConnectorError, PluginConfigError, RejectedItem, Source, SourceBatch, SourceEntry,
    decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::message::{HeaderValue, Payload, SourceRecord};
use crate::sync::lock;

use config::{After, Checked};
pub use config::{AfterCommit, Compression, Format, ObjectStoreSourceConfig, OnObjectError, Order};
pub use state::State;

pub const ENTRY: SourceEntry = SourceEntry {
    name: "object_store",
    feature: "object-store-source",
    description: "reads objects under a prefix of S3, Azure Blob, GCS or a local directory (JSON lines, JSON array, CSV, Parquet, Avro, text lines, bytes; gzip/zstd), one message per record",
    secret_fields: &["access_key_id", "secret_access_key", "options.*"],
    sample_config: "url = \"s3://iggy-data/in\"\nglob = \"**/*.jsonl.gz\"\nformat = \"json_lines\"\nregion = \"us-east-1\"\nendpoint = \"http://127.0.0.1:9000\"\naccess_key_id = \"key-id-secret\"\nsecret_access_key = \"secret\"\npoll_interval = \"10s\"\nafter_commit = \"move\"\ndone_prefix = \"done\"\noptions = { aws_session_token = \"secret-session-token\" }\n",
    config_schema: schema_of::<ObjectStoreSourceConfig>,
    build: |config| {
        Ok(Box::new(ObjectStoreSource::new(parse_plugin_config(
            config,
        )?)?))
    },
};
inventory::submit!(ENTRY);

/// Batches the engine may have in flight: each keeps the list of objects
/// it finished until its commit.
const MAX_IN_FLIGHT: usize = 16;

pub struct ObjectStoreSource {
    config: ObjectStoreSourceConfig,
    checked: Checked,
    opened: Option<Opened>,
    reader: tokio::sync::Mutex<Reader>,
    /// Per polled, uncommitted batch (oldest first): the objects it finished
    /// whole, for `after_commit`.
    uncommitted: Mutex<VecDeque<Vec<Path>>>,
    /// Bad objects of the last polled batch, for the engine to dead-letter
    /// (`on_error = "dlq"`).
    set_aside: Mutex<Vec<RejectedItem>>,
}

struct Opened {
    store: Arc<dyn ObjectStore>,
    /// The prefix under `url` (no leading or trailing slash).
    prefix: Path,
}

/// Where polling is: the state as of the last polled batch, and what was
/// listed and not yet finished.
#[derive(Default)]
struct Reader {
    state: State,
    queue: VecDeque<ObjectMeta>,
    /// Decoded records of queued objects (kept when a poll is cancelled).
    decoded: HashMap<Path, Arc<Loaded>>,
    listed_at: Option<Instant>,
}

/// An object's records, or why it has none.
enum Loaded {
    Records(Vec<Payload>),
    /// Gone between the listing and the read, or skipped as bad.
    Skipped,
    /// The object itself is bad: `on_error` applies (once).
    Bad(String),
}

impl ObjectStoreSource {
    pub fn new(config: ObjectStoreSourceConfig) -> Result<Self, PluginConfigError> {
        let checked = config.validate()?;
        Ok(Self {
            config,
            checked,
            opened: None,
            reader: tokio::sync::Mutex::new(Reader::default()),
            uncommitted: Mutex::new(VecDeque::new()),
            set_aside: Mutex::new(Vec::new()),
        })
    }

    fn opened(&self) -> Result<&Opened, ConnectorError> {
        self.opened
            .as_ref()
            .ok_or_else(|| ConnectorError::fatal("the object_store source was not opened"))
    }

    /// The store's options: the S3 fields, then `options`.
    fn store_options(&self) -> Vec<(String, String)> {
        let config = &self.config;
        let credentials = config
            .access_key_id
            .as_ref()
            .zip(config.secret_access_key.as_ref())
            .map(|(key, secret)| (key.expose_secret(), secret.expose_secret()));
        let mut options = if self.checked.url.scheme().starts_with("s3") {
            store::s3_options(
                config.region.as_deref(),
                config.endpoint.as_deref(),
                credentials,
            )
        } else {
            Vec::new()
        };
        options.extend(
            config
                .options
                .iter()
                .map(|(key, value)| (key.clone(), value.expose_secret().to_owned())),
        );
        options
    }

    /// Lists the prefix: the unread objects the glob and `after` allow, in
    /// reading order.
    async fn list(&self, state: &State) -> Result<Vec<ObjectMeta>, ConnectorError> {
        let opened = self.opened()?;
        let prefix = (!opened.prefix.as_ref().is_empty()).then_some(&opened.prefix);
        let listed: Vec<ObjectMeta> = match opened.store.list(prefix).try_collect().await {
            Ok(listed) => listed,
            Err(::object_store::Error::NotFound { .. }) => Vec::new(),
            Err(error) => return Err(self.classify("list", &self.config.url, error)),
        };
        let order = self.config.order;
        let mut unread: Vec<ObjectMeta> = listed
            .into_iter()
            .filter(|meta| self.wanted(&opened.prefix, meta) && state.is_unread(meta, order))
            .collect();
        unread.sort_by_cached_key(|meta| state::Mark::of(meta, order));
        Ok(unread)
    }

    fn wanted(&self, prefix: &Path, meta: &ObjectMeta) -> bool {
        let key = meta.location.as_ref();
        if let Some(done) = &self.checked.done_prefix
            && key
                .strip_prefix(done.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
        {
            return false;
        }
        let relative = relative_key(prefix, key);
        let options = glob::MatchOptions {
            require_literal_separator: true,
            ..Default::default()
        };
        self.checked
            .glob
            .as_ref()
            .is_none_or(|glob| glob.matches_with(relative, options))
            && match &self.checked.after {
                None => true,
                Some(After::Key(after)) => relative > after.as_str(),
                Some(After::Time(after)) => meta.last_modified > *after,
            }
    }

    /// Reads and decodes one object; `Err` only when the store failed.
    async fn load(&self, meta: &ObjectMeta) -> Result<Loaded, ConnectorError> {
        let opened = self.opened()?;
        let key = meta.location.to_string();
        let limit = self.checked.max_object_bytes;
        if meta.size > limit {
            return Ok(Loaded::Bad(format!(
                "{} bytes, more than max_object_bytes ({limit})",
                meta.size
            )));
        }
        let body = match opened.store.get(&meta.location).await {
            Ok(result) => result.bytes().await,
            Err(error) => Err(error),
        };
        let body = match body {
            Ok(body) => body,
            // Gone between the listing and the read: nothing to send.
            Err(::object_store::Error::NotFound { .. }) => return Ok(Loaded::Skipped),
            Err(error) => return Err(self.classify("read", &key, error)),
        };
        let (format, compression) = (self.config.format, self.config.compression);
        let decoded = tokio::task::spawn_blocking(move || {
            decode::decode(&key, body, format, compression, limit)
        })
        .await
        .map_err(ConnectorError::fatal)?;
        Ok(match decoded {
            Ok(records) => Loaded::Records(records),
            Err(error) => Loaded::Bad(error.to_string()),
        })
    }

    /// Reads and decodes `wanted` (the next objects in reading order) at
    /// once, keeping what loaded in `decoded`. Returns the first one's
    /// outcome; a store failure of a later one is left for its turn.
    async fn load_ahead(
        &self,
        decoded: &mut HashMap<Path, Arc<Loaded>>,
        wanted: &[ObjectMeta],
    ) -> Result<Arc<Loaded>, ConnectorError> {
        let loads = wanted
            .iter()
            .filter(|meta| !decoded.contains_key(&meta.location))
            .map(|meta| async move { (meta.location.clone(), self.load(meta).await) });
        for (location, loaded) in futures::future::join_all(loads).await {
            if let Ok(loaded) = loaded {
                decoded.insert(location, Arc::new(loaded));
            } else if location == wanted[0].location {
                return loaded.map(Arc::new);
            }
        }
        Ok(Arc::clone(&decoded[&wanted[0].location]))
    }

    /// What `on_error` makes of a bad object: `Ok(Some)` to dead-letter,
    /// `Ok(None)` to skip, `Err` to stop.
    fn on_bad_object(
        &self,
        meta: &ObjectMeta,
        reason: &str,
    ) -> Result<Option<RejectedItem>, ConnectorError> {
        let key = meta.location.as_ref();
        match self.config.on_error {
            OnObjectError::Stop => Err(ConnectorError::fatal(format!(
                "object \"{key}\" cannot be read: {reason} (on_error = \"stop\")"
            ))),
            OnObjectError::Skip => {
                warn!(key, reason, "object skipped (on_error = \"skip\")");
                Ok(None)
            }
            OnObjectError::Dlq => {
                warn!(
                    key,
                    reason, "object set aside for the dead-letter topic (on_error = \"dlq\")"
                );
                Ok(Some(self.rejected_item(meta, reason)))
            }
        }
    }

    /// A bad object as a dead letter: its key, etag, version and size in
    /// headers and in a JSON payload (the object stays in the store).
    fn rejected_item(&self, meta: &ObjectMeta, reason: &str) -> RejectedItem {
        let key = meta.location.as_ref();
        let identity = state::identity(meta);
        let mut headers = vec![("object_key".into(), key.into())];
        if let Some(etag) = &meta.e_tag {
            headers.push(("object_etag".into(), etag.as_str().into()));
        }
        if let Some(version) = &meta.version {
            headers.push(("object_version".into(), version.as_str().into()));
        }
        headers.push(("object_size".into(), HeaderValue::UInt(meta.size)));
        let payload = serde_json::json!({
            "url": self.config.url,
            "object_key": key,
            "object_etag": meta.e_tag,
            "object_version": meta.version,
            "object_size": meta.size,
            "last_modified": meta.last_modified.to_rfc3339(),
            "reason": reason,
        });
        RejectedItem {
            id: Some(hash_id(&[
                &self.config.url,
                key,
                identity.as_deref().unwrap_or(""),
                "rejected",
            ])),
            headers,
            payload: bytes::Bytes::from(payload.to_string()),
            reason: format!("object \"{key}\" cannot be read: {reason}"),
        }
    }

    /// Which store errors are worth retrying.
    fn classify(&self, action: &str, what: &str, error: ::object_store::Error) -> ConnectorError {
        match Refusal::of(&error) {
            Some(Refusal::NoBucket) => ConnectorError::fatal(format!(
                "url: the bucket or container of \"{}\" does not exist ({error})",
                self.config.url
            )),
            Some(Refusal::Credentials) => ConnectorError::fatal(format!(
                "the store refused the credentials: fix access_key_id/secret_access_key or options ({error})"
            )),
            None => ConnectorError::transient(format!("{action} {what} failed: {error}")),
        }
    }

    /// Fills one batch from the queue. Nothing of `reader` but its decoded
    /// objects changes until the batch is complete, so a cancelled poll
    /// loses nothing.
    async fn fill(&self, reader: &mut Reader) -> Result<Option<SourceBatch>, ConnectorError> {
        let order = self.config.order;
        let batch_size = self.config.batch_size;
        let mut state = reader.state.clone();
        let mut records = Vec::new();
        let mut finished = Vec::new();
        let mut rejected = Vec::new();
        let mut done = 0;
        while records.len() < batch_size && done < reader.queue.len() {
            let meta = reader.queue[done].clone();
            let loaded = match reader.decoded.get(&meta.location) {
                Some(loaded) => Arc::clone(loaded),
                None => {
                    let ahead = (done + self.config.parallel_reads).min(reader.queue.len());
                    let wanted: Vec<ObjectMeta> =
                        reader.queue.range(done..ahead).cloned().collect();
                    match self.load_ahead(&mut reader.decoded, &wanted).await {
                        Ok(loaded) => loaded,
                        // Send what the batch holds; the next poll retries.
                        Err(_) if done > 0 || !records.is_empty() => break,
                        Err(error) => return Err(error),
                    }
                }
            };
            let payloads = match loaded.as_ref() {
                Loaded::Records(payloads) => payloads.as_slice(),
                Loaded::Skipped => &[],
                Loaded::Bad(reason) => {
                    if self.config.on_error == OnObjectError::Stop
                        && (done > 0 || !records.is_empty())
                    {
                        // Deliver the records before it first.
                        break;
                    }
                    rejected.extend(self.on_bad_object(&meta, reason)?);
                    &[]
                }
            };
            let start = (state.start_of(&meta) as usize).min(payloads.len());
            let end = payloads.len().min(start + batch_size - records.len());
            records.extend(
                (start..end).map(|position| self.record(&meta, position, &payloads[position])),
            );
            if end < payloads.len() {
                state.advance(&meta, end as u64);
                break;
            }
            state.finish(&meta, order);
            if matches!(loaded.as_ref(), Loaded::Records(_)) {
                finished.push(meta.location.clone());
            }
            done += 1;
        }
        if done == 0 && records.is_empty() {
            return Ok(None);
        }
        // The batch is complete: apply it.
        for meta in reader.queue.drain(..done) {
            reader.decoded.remove(&meta.location);
        }
        reader.state = state;
        lock(&self.uncommitted).push_back(finished);
        lock(&self.set_aside).extend(rejected);
        Ok(Some(SourceBatch {
            records,
            state: Some(encode_state(&reader.state)?),
            finished: false,
            next_poll: None,
        }))
    }

    /// When the prefix may be listed again: `poll_interval` after the last
    /// listing.
    fn next_listing(&self, reader: &Reader) -> Option<Instant> {
        reader
            .listed_at
            .map(|listed_at| listed_at + self.config.poll_interval)
    }

    /// An empty batch that asks the engine to poll again at `due`; staged
    /// like any other, so each poll's batch keeps its own `commit`.
    fn idle(&self, due: Instant) -> SourceBatch {
        lock(&self.uncommitted).push_back(Vec::new());
        SourceBatch {
            next_poll: Some(due),
            ..SourceBatch::default()
        }
    }

    fn record(&self, meta: &ObjectMeta, position: usize, payload: &Payload) -> SourceRecord {
        let key = meta.location.as_ref();
        let identity = state::identity(meta);
        let mut record = SourceRecord::new(payload.clone()).with_id(hash_id(&[
            &self.config.url,
            key,
            identity.as_deref().unwrap_or(""),
            &position.to_string(),
        ]));
        record.headers.reserve(4);
        record.headers.push(("object_key".into(), key.into()));
        if let Some(etag) = &meta.e_tag {
            record
                .headers
                .push(("object_etag".into(), etag.as_str().into()));
        }
        if let Some(version) = &meta.version {
            record
                .headers
                .push(("object_version".into(), version.as_str().into()));
        }
        record
            .headers
            .push(("object_record".into(), HeaderValue::UInt(position as u64)));
        record.origin_timestamp = u64::try_from(meta.last_modified.timestamp_micros()).ok();
        record
    }

    /// Deletes or moves one finished object; one already gone is done.
    async fn retire(&self, opened: &Opened, location: &Path) -> Result<(), ConnectorError> {
        let result = match (self.config.after_commit, &self.checked.done_prefix) {
            (AfterCommit::Keep, _) => return Ok(()),
            (AfterCommit::Delete, _) => opened.store.delete(location).await,
            (AfterCommit::Move, Some(done)) => {
                let relative = relative_key(&opened.prefix, location.as_ref());
                let target = Path::from(format!("{done}/{relative}"));
                opened.store.rename(location, &target).await
            }
            (AfterCommit::Move, None) => return Ok(()),
        };
        match result {
            Ok(()) | Err(::object_store::Error::NotFound { .. }) => Ok(()),
            Err(error) => Err(self.classify("retire", location.as_ref(), error)),
        }
    }
}

/// `key` below `prefix` (the whole key when it is not below it).
fn relative_key<'a>(prefix: &Path, key: &'a str) -> &'a str {
    let prefix = prefix.as_ref();
    if prefix.is_empty() {
        return key;
    }
    key.strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(key)
}

#[async_trait]
impl Source for ObjectStoreSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let state: State = state.map(decode_state).transpose()?.unwrap_or_default();
        let requests = Requests {
            timeout: self.config.request_timeout,
            attempts: 1,
            first_delay: std::time::Duration::from_millis(100),
        };
        let (store, prefix) = store::open(&self.checked.url, &self.store_options(), requests)
            .map_err(|(option, message)| {
                let field = if option.is_empty() {
                    "url".to_owned()
                } else {
                    format!("options.{option}")
                };
                ConnectorError::fatal(format!("{field}: {message}"))
            })?;
        self.opened = Some(Opened { store, prefix });
        // One listing proves the store is reachable and the credentials work.
        let unread = self.list(&state).await?;
        info!(url = %self.config.url, unread = unread.len(), watermark = ?state.watermark, "object_store source opened");
        let reader = self.reader.get_mut();
        reader.queue = unread.into();
        reader.listed_at = Some(Instant::now());
        reader.state = state;
        Ok(())
    }

    /// The next batch of what the last listing found. The prefix is listed
    /// again once that is read, at most every `poll_interval` (counted from
    /// the last listing): until then a poll asks the engine to wait, with
    /// the batch that emptied the queue or with an empty one.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let mut reader = self.reader.lock().await;
        if reader.queue.is_empty() {
            if let Some(due) = self.next_listing(&reader)
                && due > Instant::now()
            {
                return Ok(self.idle(due));
            }
            let unread = self.list(&reader.state).await?;
            reader.queue = unread.into();
            reader.listed_at = Some(Instant::now());
        }
        let Some(mut batch) = self.fill(&mut reader).await? else {
            let due = self.next_listing(&reader).unwrap_or_else(Instant::now);
            return Ok(self.idle(due));
        };
        if reader.queue.is_empty() {
            batch.next_poll = self.next_listing(&reader);
        }
        Ok(batch)
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let finished = lock(&self.uncommitted).front().cloned().unwrap_or_default();
        if !finished.is_empty() {
            let opened = self.opened()?;
            for location in &finished {
                self.retire(opened, location).await?;
            }
        }
        lock(&self.uncommitted).pop_front();
        Ok(())
    }

    fn take_rejected(&self) -> Vec<RejectedItem> {
        std::mem::take(&mut *lock(&self.set_aside))
    }

    fn max_in_flight(&self) -> usize {
        MAX_IN_FLIGHT
    }

    fn destructive(&self) -> bool {
        self.config.after_commit != AfterCommit::Keep
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        lock(&self.uncommitted).clear();
        self.opened = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(dir: &std::path::Path, extra: serde_json::Value) -> ObjectStoreSource {
        let mut config = serde_json::json!({
            "url": format!("file://{}", dir.display()),
            "poll_interval": "10ms",
        });
        for (key, value) in extra.as_object().unwrap() {
            config[key] = value.clone();
        }
        ObjectStoreSource::new(parse_plugin_config(&config).unwrap()).unwrap()
    }

    fn write(dir: &std::path::Path, name: &str, body: &str) {
        std::fs::write(dir.join(name), body).unwrap();
    }

    fn texts(batch: &SourceBatch) -> Vec<String> {
        batch
            .records
            .iter()
            .map(|record| String::from_utf8(record.payload.to_bytes().to_vec()).unwrap())
            .collect()
    }

    /// Polls as the engine does (waiting until a batch's `next_poll`) up to
    /// the first batch with records.
    async fn next_records(source: &ObjectStoreSource) -> SourceBatch {
        loop {
            let batch = source.poll().await.unwrap();
            if !batch.records.is_empty() {
                return batch;
            }
            if let Some(due) = batch.next_poll {
                tokio::time::sleep_until(due).await;
            }
        }
    }

    #[tokio::test]
    async fn given_a_listing_that_found_nothing_when_polled_should_ask_the_engine_to_wait_the_poll_interval()
     {
        let dir = tempfile::tempdir().unwrap();
        let mut source = source(dir.path(), serde_json::json!({"poll_interval": "1h"}));
        source.open(None).await.unwrap();
        let listed_at = source.reader.lock().await.listed_at.unwrap();
        let batch = source.poll().await.unwrap();
        assert!(batch.records.is_empty() && batch.state.is_none());
        assert_eq!(
            batch.next_poll,
            Some(listed_at + std::time::Duration::from_secs(3600)),
            "one listing per poll_interval, counted from the last listing"
        );
        write(dir.path(), "a.jsonl", "{\"n\":1}\n");
        let batch = source.poll().await.unwrap();
        assert!(batch.records.is_empty(), "listed again before its time");
        source.commit().await.unwrap();
        source.commit().await.unwrap();
        assert!(lock(&source.uncommitted).is_empty(), "one commit per poll");
    }

    #[tokio::test]
    async fn given_no_state_when_opened_should_read_from_the_first_object() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.jsonl", "{\"n\":1}\n{\"n\":2}\n");
        write(dir.path(), "b.jsonl", "{\"n\":3}\n");
        let mut source = source(dir.path(), serde_json::json!({}));
        source.open(None).await.unwrap();
        let batch = source.poll().await.unwrap();
        assert_eq!(texts(&batch), ["{\"n\":1}", "{\"n\":2}", "{\"n\":3}"]);
    }

    #[tokio::test]
    async fn given_a_saved_state_mid_object_when_opened_should_resume_after_its_last_record() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.jsonl", "{\"n\":1}\n{\"n\":2}\n{\"n\":3}\n");
        write(dir.path(), "b.jsonl", "{\"n\":4}\n");
        let mut first = source(dir.path(), serde_json::json!({"batch_size": 2}));
        first.open(None).await.unwrap();
        let batch = first.poll().await.unwrap();
        assert_eq!(texts(&batch), ["{\"n\":1}", "{\"n\":2}"]);
        let saved = batch.state.unwrap();
        let mut second = source(dir.path(), serde_json::json!({"batch_size": 2}));
        second.open(Some(&saved)).await.unwrap();
        let batch = second.poll().await.unwrap();
        assert_eq!(texts(&batch), ["{\"n\":3}", "{\"n\":4}"]);
        let mut third = source(dir.path(), serde_json::json!({}));
        third.open(Some(&batch.state.unwrap())).await.unwrap();
        write(dir.path(), "c.jsonl", "{\"n\":5}\n");
        assert_eq!(texts(&next_records(&third).await), ["{\"n\":5}"]);
    }

    #[tokio::test]
    async fn given_a_corrupt_state_when_opened_should_refuse_to_start() {
        let dir = tempfile::tempdir().unwrap();
        let mut source = source(dir.path(), serde_json::json!({}));
        let error = source.open(Some(b"\xc1 not msgpack")).await.unwrap_err();
        assert!(matches!(error, ConnectorError::Fatal(_)), "{error}");
    }

    #[tokio::test]
    async fn given_on_error_stop_when_an_object_is_corrupt_should_stop_naming_its_key() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.jsonl", "{\"n\":1}\n");
        write(dir.path(), "b.jsonl", "{\"n\":\n");
        let mut source = source(dir.path(), serde_json::json!({"on_error": "stop"}));
        source.open(None).await.unwrap();
        assert_eq!(texts(&source.poll().await.unwrap()), ["{\"n\":1}"]);
        let error = source.poll().await.unwrap_err();
        assert!(
            matches!(&error, ConnectorError::Fatal(_)) && error.to_string().contains("b.jsonl"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn given_on_error_dlq_when_an_object_is_corrupt_should_set_it_aside_with_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.jsonl", "{\"n\":1}\n");
        write(dir.path(), "b.jsonl", "{\"n\":\n");
        write(dir.path(), "c.jsonl", "{\"n\":3}\n");
        let mut source = source(dir.path(), serde_json::json!({"on_error": "dlq"}));
        source.open(None).await.unwrap();
        let batch = source.poll().await.unwrap();
        assert_eq!(texts(&batch), ["{\"n\":1}", "{\"n\":3}"]);
        let rejected = source.take_rejected();
        assert_eq!(rejected.len(), 1, "{rejected:?}");
        let item = &rejected[0];
        assert!(
            item.reason.contains("b.jsonl") && item.reason.contains("line 1"),
            "{}",
            item.reason
        );
        let payload: serde_json::Value = serde_json::from_slice(&item.payload).unwrap();
        assert!(
            payload["object_key"].as_str().unwrap().ends_with("b.jsonl"),
            "{payload}"
        );
        assert!(item.headers.iter().any(|(name, _)| name == "object_key"));
        assert!(source.take_rejected().is_empty(), "taken once");
        let state: State = decode_state(&batch.state.unwrap()).unwrap();
        assert!(state.watermark.unwrap().key.ends_with("c.jsonl"));
    }

    #[tokio::test]
    async fn given_parallel_reads_when_polled_should_keep_reading_order_across_objects() {
        let dir = tempfile::tempdir().unwrap();
        let mut expected = Vec::new();
        for index in 0..20 {
            let lines: String = (0..3)
                .map(|line| format!("{{\"n\":{}}}\n", index * 3 + line))
                .collect();
            write(dir.path(), &format!("{index:02}.jsonl"), &lines);
            expected.extend((0..3).map(|line| format!("{{\"n\":{}}}", index * 3 + line)));
        }
        let mut source = source(
            dir.path(),
            serde_json::json!({"parallel_reads": 8, "batch_size": 7}),
        );
        source.open(None).await.unwrap();
        let mut seen = Vec::new();
        while seen.len() < expected.len() {
            seen.extend(texts(&source.poll().await.unwrap()));
        }
        assert_eq!(seen, expected);
    }

    #[tokio::test]
    async fn given_after_as_a_time_when_opened_should_read_only_objects_modified_after_it() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "old.jsonl", "{\"n\":1}\n");
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
        std::fs::File::options()
            .write(true)
            .open(dir.path().join("old.jsonl"))
            .unwrap()
            .set_modified(old)
            .unwrap();
        write(dir.path(), "new.jsonl", "{\"n\":2}\n");
        let after = chrono::Utc::now() - chrono::Duration::minutes(30);
        let mut source = source(
            dir.path(),
            serde_json::json!({"after": after.to_rfc3339(), "order": "last_modified"}),
        );
        source.open(None).await.unwrap();
        assert_eq!(texts(&source.poll().await.unwrap()), ["{\"n\":2}"]);
    }

    #[tokio::test]
    async fn given_delete_after_commit_should_delete_only_objects_of_committed_batches() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "a.jsonl", "{\"n\":1}\n");
        write(dir.path(), "b.jsonl", "{\"n\":2}\n");
        let mut source = source(
            dir.path(),
            serde_json::json!({"after_commit": "delete", "batch_size": 1}),
        );
        source.open(None).await.unwrap();
        source.poll().await.unwrap();
        source.poll().await.unwrap();
        assert!(dir.path().join("a.jsonl").exists(), "deleted before commit");
        source.commit().await.unwrap();
        assert!(!dir.path().join("a.jsonl").exists());
        assert!(
            dir.path().join("b.jsonl").exists(),
            "deleted before its commit"
        );
        source.commit().await.unwrap();
        assert!(!dir.path().join("b.jsonl").exists());
    }
}
