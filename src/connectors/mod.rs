//! The connector interfaces, the registry that builds connectors from config, and
//! one folder per backend (`postgres/`: its shared client code in `mod.rs`, its
//! `source` and `sink`, its `doc.md`).

pub mod describe;
pub mod entry;
pub mod kit;
pub mod record_check;
pub mod registry;

use entry::InTree;

// One module per backend folder (`postgres/`, `mqtt/`, ...) and `IN_TREE`,
// written by build.rs from Cargo.toml's features: a connector is its folder
// and its feature, and registers itself with `inventory::submit!` in its
// module (see `entry`).
include!(concat!(env!("OUT_DIR"), "/connectors.rs"));

use std::error::Error as StdError;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde::de::DeserializeOwned;

use crate::lag::SourceLag;
use crate::message::{SinkMessage, SourceRecord, TopicRef};

pub use entry::{BuildError, ConnectorKind, SinkEntry, SourceEntry, schema_of};
pub use kit::backoff::Backoff;
pub use registry::Registry;

pub type BoxError = Box<dyn StdError + Send + Sync>;

/// A source reads from an external system and hands the engine batches.
///
/// The engine drives it as `poll` -> (send to Iggy, save state) -> `commit`,
/// with up to [`max_in_flight`](Source::max_in_flight) batches polled and not
/// yet committed (the delivery contract is in docs/ARCHITECTURE.md). A source
/// may stage what it needs to finish a batch (rows to delete, clients to
/// answer) in `poll`, but it must do nothing destructive or irreversible until
/// `commit` is called: `commit` means the oldest batch polled and not yet
/// committed is in Iggy and the state returned with it (or with a later batch)
/// is saved. Commits come strictly in poll order.
///
/// `poll` may run while earlier batches are being sent or committed, up to
/// `max_in_flight` batches. A failed delivery is retried by the engine with
/// the same batch, so a source never sees its batches again. If the engine
/// gives up it calls `close` without `commit`, and the source must leave the
/// input of uncommitted batches untouched.
#[async_trait]
pub trait Source: Send + Sync {
    /// Prepares the source. `state` is what the last committed batch returned, as
    /// saved by the state store, or `None` on a fresh start. A transient error
    /// (the backend is unreachable) is retried by the engine on a fresh
    /// instance with the same state; a fatal one stops it with `start_failed`.
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError>;

    /// Returns the next batch. A source its backend pushes to (a
    /// subscription, a consumer, incoming requests) may wait inside `poll`
    /// for the next item. A source that asks its backend (a query, a
    /// listing, a generator) never sleeps: when it is caught up it returns
    /// at once, with an empty batch if it found nothing, and says in
    /// [`SourceBatch::next_poll`] when to ask again; the engine waits (rule
    /// S8 in docs/ARCHITECTURE.md). Must be cancel-safe: dropping the future
    /// (on shutdown) loses nothing.
    async fn poll(&self) -> Result<SourceBatch, ConnectorError>;

    /// The oldest batch polled and not yet committed is durable: apply what it
    /// staged.
    async fn commit(&self) -> Result<(), ConnectorError>;

    /// What the last successful `poll` read but set aside as unusable (an
    /// object that does not decode), each with why; the engine takes them
    /// right after that poll and handles them with its batch: counted as
    /// decode errors, dead-lettered when the connector has a
    /// `[dead_letter]` topic, otherwise dropped with a warning. A source
    /// that sets nothing aside keeps the default.
    fn take_rejected(&self) -> Vec<RejectedItem> {
        Vec::new()
    }

    /// How many batches this source can have polled and not yet committed
    /// (at least 1: more needs a source that stages several and applies them
    /// oldest first); the connector file's `max_in_flight` chooses up to this
    /// many.
    fn max_in_flight(&self) -> usize {
        1
    }

    /// How the engine should treat failed deliveries of this source's batches.
    fn batch_policy(&self) -> BatchPolicy {
        BatchPolicy::default()
    }

    /// The engine's retry policy for this connector, from its own retry
    /// fields (upstream's `max_retries`, `retry_delay`, ...); `None` keeps
    /// the engine's default.
    fn retry(&self) -> Option<RetrySettings> {
        None
    }

    /// Whether a commit destroys the source's own copy of the batch (rows
    /// deleted or marked, clients told their data is stored): its data then
    /// survives only as durably as the broker stores it.
    fn destructive(&self) -> bool {
        false
    }

    /// Tells the source which instance it runs as; called once, before `open`.
    fn attach(&mut self, _context: ConnectorContext) {}

    /// How to measure how far this source is behind its backend, for a
    /// source whose backend can say it cheaply (a replication slot's
    /// position, a consumer's committed offsets). Asked once after `open`;
    /// the engine measures every few seconds in a task of its own, so the
    /// probe holds its own handle to the backend (a pool, a shared client).
    fn lag_probe(&self) -> Option<Arc<dyn LagProbe>> {
        None
    }

    /// Releases resources. Called once, whether the source stopped normally or
    /// not; a batch that was polled but not committed must not be applied.
    async fn close(&mut self) -> Result<(), ConnectorError>;
}

/// Measures a source's lag; see [`Source::lag_probe`].
#[async_trait]
pub trait LagProbe: Send + Sync {
    /// One measurement, with one or two cheap requests to the backend. An
    /// error keeps the previous measurement.
    async fn measure(&self) -> Result<SourceLag, ConnectorError>;
}

/// A sink writes batches of decoded messages to an external system.
#[async_trait]
pub trait Sink: Send + Sync {
    /// Tells the sink which instance it runs as; called once, before `open`.
    fn attach(&mut self, _context: ConnectorContext) {}

    /// Connects. A transient error (the backend is unreachable or starting)
    /// is retried by the engine on a fresh instance, with backoff, while the
    /// status says `starting`; a fatal one (credentials, a refused config)
    /// stops the sink with `start_failed`.
    async fn open(&mut self) -> Result<(), ConnectorError>;

    /// Writes one batch with one request (or one transaction) and classifies
    /// the answer. `Ok` means every message is durably in the target system;
    /// only then does the engine commit the batch's offsets. Anything less is
    /// a [`SinkError`] saying what is durable, what is refused and when to try
    /// the rest again: the engine retries, the sink never loops, sleeps or
    /// remembers what it wrote. Several topics of one sink may call `write`
    /// concurrently.
    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError>;

    /// Whether the sink takes JSON payloads as their text
    /// ([`Payload::JsonBytes`](crate::message::Payload::JsonBytes)). When it
    /// does and a topic has no transforms, the engine checks each JSON payload
    /// is valid and hands over the stored bytes instead of a parsed value, so a
    /// sink that writes JSON as text re-serializes nothing. Otherwise, and
    /// always with transforms, JSON arrives as `Payload::Json`.
    fn accepts_json_bytes(&self) -> bool {
        false
    }

    /// Whether the sink can write the next batch of a topic while the
    /// previous one is still being written (its writes do not depend on each
    /// other's order). Then the engine keeps two writes per topic in flight;
    /// offsets are still committed in poll order. Otherwise batches are
    /// written one at a time (the next one polled meanwhile).
    fn writes_concurrently(&self) -> bool {
        false
    }

    /// The engine's retry policy for this connector, from its own retry
    /// fields (upstream's `max_retries`, `retry_delay`, ...); `None` keeps
    /// the engine's default.
    fn retry(&self) -> Option<RetrySettings> {
        None
    }

    /// Deferred acknowledgement (rule K6 in docs/ARCHITECTURE.md). `None`, the
    /// default, means `Ok` from `write` is durable. A sink that returns
    /// `Some` buffers instead: `Ok` from `write` means the whole batch is
    /// accepted into its buffer (a write that returns `Rejected` accepts
    /// nothing), [`flush`](Sink::flush) makes buffered messages durable, and
    /// [`durable`](Sink::durable) says how far they are. The engine commits
    /// offsets only up to what `durable` reports, writes such a sink's
    /// batches one at a time, and never hands it a message again that it
    /// accepted in the same run.
    fn deferred(&self) -> Option<Deferred> {
        None
    }

    /// A deferred sink makes buffered messages of `topic` durable:
    /// [`Flush::Due`] what its own triggers (size, count) sealed, called
    /// after every accepted batch; [`Flush::All`] everything it holds, called
    /// when the oldest buffered batch is `flush_interval` old and at a stop.
    /// `Transient` is retried with the engine's backoff; `Fatal` (and
    /// `Rejected`, which a flush cannot apply to single messages) stops the
    /// sink. Either way nothing past what `durable` reports is committed.
    async fn flush(&self, _topic: &TopicRef, _scope: Flush) -> Result<(), SinkError> {
        Ok(())
    }

    /// A deferred sink's progress on `topic`: per partition, the offset up to
    /// which every message it accepted is durable. Partitions it has made
    /// nothing durable on yet may be left out.
    fn durable(&self, _topic: &TopicRef) -> Vec<(u32, u64)> {
        Vec::new()
    }

    async fn close(&mut self) -> Result<(), ConnectorError>;
}

/// How a sink that defers acknowledgement wants to be flushed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deferred {
    /// Flush everything once the oldest batch accepted and not yet durable
    /// is this old; `None` flushes on the sink's own triggers and at a stop
    /// only.
    pub flush_interval: Option<std::time::Duration>,
}

/// What [`Sink::flush`] is asked to make durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// What the sink's own triggers (size, count) made ready.
    Due,
    /// Everything it holds for the topic (age, stop).
    All,
}

/// What the runtime tells a connector about the instance it runs as.
#[derive(Debug, Clone, Default)]
pub struct ConnectorContext {
    /// The connector's `key`, for labelling the connector's own metrics and logs.
    pub key: String,
    /// Where the connector says it is running but cannot make progress (an
    /// endpoint it keeps failing on). The runtime shows it with the status.
    pub degraded: Degraded,
    /// A source's `[[streams]]` targets, in file order (a record's
    /// `stream_index` indexes them); empty for a sink.
    pub streams: Vec<TopicRef>,
    /// Whether the engine will store a record (a source's only).
    pub record_check: record_check::RecordCheck,
}

/// A connector's own report that it is running but degraded, with why. Shared by
/// the connector (which sets and clears it) and the runtime (which shows it).
#[derive(Debug, Clone, Default)]
pub struct Degraded(Arc<Mutex<Option<String>>>);

impl Degraded {
    pub fn set(&self, reason: impl Into<String>) {
        *self.lock() = Some(reason.into());
    }

    pub fn clear(&self) {
        self.lock().take();
    }

    /// Why the connector is degraded, or `None` when it is not.
    pub fn reason(&self) -> Option<String> {
        self.lock().clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<String>> {
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Something a source read and cannot turn into records (see
/// [`Source::take_rejected`]): what describes it and why it was set aside.
#[derive(Debug, Clone, PartialEq)]
pub struct RejectedItem {
    pub id: Option<u128>,
    pub headers: crate::message::Headers,
    /// The dead letter's payload (never empty: Iggy stores no empty payload).
    pub payload: bytes::Bytes,
    pub reason: String,
}

/// One poll's worth of records and the state the source will have once they are
/// durable.
#[derive(Debug, Default)]
pub struct SourceBatch {
    pub records: Vec<SourceRecord>,
    /// The source's state after this batch (MessagePack, see [`encode_state`]).
    /// Saved by the engine before `commit`; `None` keeps the previous state.
    pub state: Option<Vec<u8>>,
    /// The source has nothing more to produce, ever (a finite generator). The
    /// engine delivers this batch, commits it and stops the source as completed.
    pub finished: bool,
    /// The source is caught up (it read everything there is for now) or
    /// paces itself: the earliest time the engine polls it again, usually
    /// this poll's start plus the source's poll interval. The engine waits
    /// (a stop request ends the wait at once) while this batch is delivered;
    /// `None` polls again as soon as the window has room. An empty batch
    /// still gets its `commit`, but nothing is sent for it.
    pub next_poll: Option<tokio::time::Instant>,
}

/// How the engine handles NACKs (failed sends or state saves) for a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchPolicy {
    /// Stop the source after this many consecutive NACKs of the same batch.
    /// `None` retries forever.
    pub max_consecutive_nacks: Option<u32>,
}

impl BatchPolicy {
    /// With [`Backoff::SOURCE`](crate::engine::backoff::Backoff::SOURCE) the
    /// waits between these attempts add up to at least 160 s (200 s before
    /// jitter): a broker outage of two minutes stops no source (upstream's
    /// default of 5 gave up after 1.5 s).
    pub const DEFAULT_MAX_CONSECUTIVE_NACKS: u32 = 15;

    pub const fn never_stop() -> Self {
        Self {
            max_consecutive_nacks: None,
        }
    }

    /// Applies a config override, where 0 means never stop.
    pub fn with_override(self, max_consecutive_nacks: Option<u32>) -> Self {
        match max_consecutive_nacks {
            None => self,
            Some(0) => Self::never_stop(),
            Some(limit) => Self {
                max_consecutive_nacks: Some(limit),
            },
        }
    }
}

impl Default for BatchPolicy {
    fn default() -> Self {
        Self {
            max_consecutive_nacks: Some(Self::DEFAULT_MAX_CONSECUTIVE_NACKS),
        }
    }
}

/// An error from a connector's `open`, `poll`, `commit` or `close`.
///
/// A connector classifies; the engine acts (docs/ARCHITECTURE.md, "The
/// delivery contract"): it retries transient errors with backoff (`open`
/// included, so a backend that is down at start is waited for), closes and
/// opens the connector again when its connection is gone, and stops it on a
/// fatal error. A connector never loops, sleeps or reconnects to retry.
#[derive(Debug, thiserror::Error)]
pub enum ConnectorError {
    /// The operation may succeed if retried (network, timeouts, a busy backend).
    #[error("{0}")]
    Transient(#[source] BoxError),
    /// The connection the connector holds is gone (a broker closed it, a
    /// session expired): the engine closes the connector and opens it again
    /// with backoff, resuming from committed state.
    #[error("connection lost: {0}")]
    Disconnected(#[source] BoxError),
    /// The connector cannot continue; the engine stops it with reason `fatal`
    /// (`start_failed` when it comes from `open`).
    #[error("{0}")]
    Fatal(#[source] BoxError),
}

impl ConnectorError {
    pub fn transient(error: impl Into<BoxError>) -> Self {
        Self::Transient(error.into())
    }

    pub fn disconnected(error: impl Into<BoxError>) -> Self {
        Self::Disconnected(error.into())
    }

    pub fn fatal(error: impl Into<BoxError>) -> Self {
        Self::Fatal(error.into())
    }

    /// Whether the engine retries the operation (after reopening the
    /// connector when its connection is gone).
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient(_) | Self::Disconnected(_))
    }
}

/// How a sink's `write` fell short of making the whole batch durable: the
/// backend's answer, classified per message. The engine takes it from there
/// (rule K3): it keeps what is durable, applies `on_error` to what was
/// rejected, and writes only the rest again, after the wait asked for.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// Nothing of the batch is known to be written: the engine writes it
    /// again after its backoff, or after `retry_after` when the backend said
    /// when (`Retry-After`, a throttling hint), whichever is later.
    #[error("transient write failure: {error}")]
    Transient {
        #[source]
        error: BoxError,
        retry_after: Option<Duration>,
    },
    /// These messages can never be written (the backend refuses them); the
    /// rest of the batch was not written. The engine applies the sink's
    /// `on_error` policy to the rejected ones and writes the rest again at
    /// once.
    #[error("{} message(s) rejected, first: {}", .0.len(), .0.first().map(|r| r.reason.as_str()).unwrap_or(""))]
    Rejected(Vec<Rejection>),
    /// The backend answered per message ([`Partial`]): some are stored, some
    /// refused, and the rest failed as `rest` says.
    #[error("{0}")]
    Partial(Box<Partial>),
    /// The sink's connection is gone: the engine closes it, opens it again
    /// with backoff and writes what is not durable again.
    #[error("connection lost: {0}")]
    Disconnected(#[source] BoxError),
    /// The sink cannot continue (misconfiguration, lost permissions): the engine
    /// stops it with reason `fatal` without committing.
    #[error("fatal write failure: {0}")]
    Fatal(#[source] BoxError),
}

impl SinkError {
    pub fn transient(error: impl Into<BoxError>) -> Self {
        Self::Transient {
            error: error.into(),
            retry_after: None,
        }
    }

    /// Transient, with the earliest time to try again that the backend gave.
    pub fn transient_after(error: impl Into<BoxError>, retry_after: Option<Duration>) -> Self {
        Self::Transient {
            error: error.into(),
            retry_after,
        }
    }

    pub fn disconnected(error: impl Into<BoxError>) -> Self {
        Self::Disconnected(error.into())
    }

    pub fn fatal(error: impl Into<BoxError>) -> Self {
        Self::Fatal(error.into())
    }

    /// A per-message answer: `durable` and `rejected` index the batch, every
    /// other message failed as `rest` says (`Transient`, `Disconnected` or
    /// `Fatal`). With nothing else left it is just what it settles.
    pub fn partial(durable: Vec<usize>, rejected: Vec<Rejection>, rest: SinkError) -> Self {
        Self::Partial(Box::new(Partial {
            durable,
            rejected,
            rest,
        }))
    }

    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Transient { .. } | Self::Disconnected(_))
    }
}

/// A backend's answer per message for a batch it took in part
/// ([`SinkError::Partial`]).
#[derive(Debug)]
pub struct Partial {
    /// Indexes (into the batch passed to `write`) of the messages stored.
    pub durable: Vec<usize>,
    /// Messages refused for good.
    pub rejected: Vec<Rejection>,
    /// What happened to every other message of the batch.
    pub rest: SinkError,
}

impl fmt::Display for Partial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} message(s) stored, {} rejected, the rest: {}",
            self.durable.len(),
            self.rejected.len(),
            self.rest
        )
    }
}

/// How the engine retries a connector's failing work, from the connector's
/// own retry fields (upstream's `max_retries`, `retry_delay`, ...): the
/// engine's policy for that connector, never a loop inside it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetrySettings {
    /// The waits between attempts of one write, poll or `open`.
    pub backoff: Backoff,
    /// After this many consecutive failed attempts the connector reports
    /// itself `degraded` (it keeps retrying: nothing is dropped). `None`:
    /// only the status' last error tells.
    pub degraded_after: Option<u32>,
}

impl RetrySettings {
    /// Upstream's usual fields: `retry_delay` doubling up to
    /// `max_retry_delay`, and `max_retries` consecutive failed attempts
    /// before the connector is reported degraded.
    pub fn doubling(retry_delay: Duration, max_retry_delay: Duration, max_retries: u32) -> Self {
        Self {
            backoff: Backoff {
                initial: retry_delay,
                max: max_retry_delay,
                multiplier: 2.0,
            },
            degraded_after: Some(max_retries),
        }
    }
}

/// One message of a batch that the backend refused for good.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// Index into the `messages` slice passed to `write`.
    pub index: usize,
    pub reason: String,
}

/// An invalid `plugin_config`, naming the field and what was expected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PluginConfigError {
    /// Dotted path of the offending field inside `plugin_config` (empty for the
    /// table as a whole).
    pub field: String,
    pub message: String,
    /// The other fields that do not fit, found in the same pass (so
    /// `validate` reports them all at once).
    pub more: Vec<PluginConfigError>,
}

impl fmt::Display for PluginConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.field.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

impl std::error::Error for PluginConfigError {}

impl PluginConfigError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
            more: Vec::new(),
        }
    }

    /// This error and the others found with it.
    pub fn all(&self) -> impl Iterator<Item = &PluginConfigError> {
        std::iter::once(self).chain(&self.more)
    }
}

/// Where a serde error points and what it says: the dotted path of the field
/// (empty for the table itself) and the message. serde names a missing field
/// in its message only, at the path of the table that lacks it, so the field
/// is added to the path.
pub fn serde_field<E: fmt::Display>(error: serde_path_to_error::Error<E>) -> (String, String) {
    let path = match error.path().to_string() {
        path if path == "." => String::new(),
        path => path,
    };
    let message = error.into_inner().to_string();
    let missing = message
        .strip_prefix("missing field `")
        .and_then(|rest| rest.strip_suffix('`'));
    match missing {
        Some(name) if path.is_empty() => (name.to_owned(), MISSING.to_owned()),
        Some(name) => (format!("{path}.{name}"), MISSING.to_owned()),
        None => (path, message),
    }
}

const MISSING: &str = "missing required field";

/// Parses a connector's `plugin_config` into its typed config, naming every
/// field that does not fit: serde stops at the first, so each offending field
/// is taken out and the rest parsed again (up to 20 fields).
pub fn parse_plugin_config<T: DeserializeOwned>(
    config: &serde_json::Value,
) -> Result<T, PluginConfigError> {
    let mut error = match serde_path_to_error::deserialize(config) {
        Ok(parsed) => return Ok(parsed),
        Err(error) => error,
    };
    let mut rest = config.clone();
    let mut found = Vec::new();
    loop {
        let taken_out = remove_at(&mut rest, error.path());
        let (field, message) = serde_field(error);
        found.push(PluginConfigError::new(field, message));
        if !taken_out || found.len() == 20 {
            break;
        }
        match serde_path_to_error::deserialize::<_, T>(&rest) {
            // A required field taken out is now missing: nothing new.
            Err(next) if !next.inner().to_string().starts_with("missing field") => error = next,
            _ => break,
        }
    }
    let mut found = found.into_iter();
    let mut first = found.next().expect("one error at least");
    first.more = found.collect();
    Err(first)
}

/// Takes the value at `path` out of `value`; `false` when there is none.
fn remove_at(value: &mut serde_json::Value, path: &serde_path_to_error::Path) -> bool {
    use serde_path_to_error::Segment;
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut parent = value;
    for segment in parents {
        let next = match segment {
            Segment::Map { key } => parent.get_mut(key.as_str()),
            Segment::Seq { index } => parent.get_mut(*index),
            _ => None,
        };
        let Some(next) = next else {
            return false;
        };
        parent = next;
    }
    match (last, parent) {
        (Segment::Map { key }, serde_json::Value::Object(fields)) => fields.remove(key).is_some(),
        (Segment::Seq { index }, serde_json::Value::Array(items)) if *index < items.len() => {
            items.remove(*index);
            true
        }
        _ => false,
    }
}

/// Serializes a source's state with field names, so tools and the API can decode
/// it without knowing its type.
pub fn encode_state<T: serde::Serialize>(state: &T) -> Result<Vec<u8>, ConnectorError> {
    rmp_serde::to_vec_named(state).map_err(ConnectorError::fatal)
}

/// Decodes a state written by [`encode_state`].
pub fn decode_state<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ConnectorError> {
    rmp_serde::from_slice(bytes).map_err(ConnectorError::fatal)
}

#[cfg(test)]
mod serde_field_tests {
    use serde::Deserialize;

    use super::serde_field;

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Outer {
        name: String,
        tls: Inner,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        ca_file: String,
    }

    fn located(json: serde_json::Value) -> (String, String) {
        serde_field(serde_path_to_error::deserialize::<_, Outer>(json).unwrap_err())
    }

    #[test]
    fn given_a_missing_field_when_located_should_name_it_at_its_path() {
        let missing = "missing required field".to_owned();
        assert_eq!(
            located(serde_json::json!({"tls": {"ca_file": "ca.pem"}})),
            ("name".to_owned(), missing.clone())
        );
        assert_eq!(
            located(serde_json::json!({"name": "n", "tls": {}})),
            ("tls.ca_file".to_owned(), missing)
        );
        let (field, message) = located(serde_json::json!({"name": 7, "tls": {"ca_file": ""}}));
        assert_eq!(field, "name");
        assert!(
            message.starts_with("invalid type: integer `7`"),
            "{message}"
        );
    }
}
