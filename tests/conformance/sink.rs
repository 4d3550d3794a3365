//! The sink checks: each writes batches through the sink and reads back what
//! the backend holds through the backend itself (SQL, the receiving server,
//! the file), never through the sink.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use async_trait::async_trait;
use iggy_connect::connectors::{Flush, PluginConfigError, Registry, Sink, SinkError};
use iggy_connect::message::{Payload, SinkMessage, TopicRef};
use serde_json::{Value, json};

use crate::{Outcome, ensure};

/// A connector's backend for the sink checks: one per check, of its own.
#[async_trait]
pub trait SinkBackend: Send + Sync {
    /// The `plugin_config` that points the sink at this backend.
    fn plugin_config(&self) -> Value;
    /// The sink's claim: writing a batch again stores nothing twice.
    fn idempotent(&self) -> bool {
        false
    }
    /// The `key` of every message the backend holds, once per copy stored.
    async fn stored(&self) -> Result<Vec<String>, String>;
    /// Changes a message so that the backend refuses it for good; `false` when
    /// the backend refuses nothing.
    fn poison(&self, _message: &mut SinkMessage) -> bool {
        false
    }
    /// Makes the backend fail transiently (down, 503) until [`heal`](Self::heal);
    /// `false` when the backend has no transient fault to inject.
    async fn fault(&self) -> bool {
        false
    }
    async fn heal(&self) {}
}

pub type BuildSink = Arc<dyn Fn(&Value) -> Result<Box<dyn Sink>, PluginConfigError> + Send + Sync>;

/// The connector under test: its registry name and how to build it.
#[derive(Clone)]
pub struct SinkSubject {
    pub name: &'static str,
    pub build: BuildSink,
}

impl SinkSubject {
    /// The compiled-in connector `name`, built through its registry entry.
    pub fn registered(name: &'static str) -> Self {
        let entry = Registry::sinks()
            .iter()
            .find(|entry| entry.name == name)
            .unwrap_or_else(|| panic!("no sink \"{name}\" in the registry"));
        Self {
            name,
            build: Arc::new(entry.build),
        }
    }

    async fn open(&self, backend: &dyn SinkBackend) -> Result<Box<dyn Sink>, String> {
        let mut sink = (self.build)(&backend.plugin_config())
            .map_err(|error| format!("building {}: {error}", self.name))?;
        sink.open()
            .await
            .map_err(|error| format!("open: {error}"))?;
        Ok(sink)
    }
}

/// Every sink check, by name.
pub const CHECKS: [&str; 5] = [
    "ok_means_durable",
    "replayed_batch_not_duplicated",
    "rejections_in_range",
    "transient_error_retried",
    "open_while_down_is_retried",
];

/// Runs the sink check named `check`.
pub async fn run(check: &str, subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    match check {
        "ok_means_durable" => ok_means_durable(subject, backend).await,
        "replayed_batch_not_duplicated" => replayed_batch_not_duplicated(subject, backend).await,
        "rejections_in_range" => rejections_in_range(subject, backend).await,
        "transient_error_retried" => transient_error_retried(subject, backend).await,
        "open_while_down_is_retried" => open_while_down_is_retried(subject, backend).await,
        other => Err(format!("no sink check {other}")),
    }
}

/// `Ok` from `write` means every message of the batch is in the backend.
pub async fn ok_means_durable(subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    let mut sink = subject.open(backend).await?;
    let batch = messages(0..20);
    write(sink.as_ref(), &batch).await?;
    // Read before `close`: `Ok` alone must mean durable.
    let stored = backend.stored().await?;
    close(sink.as_mut()).await?;
    let missing = missing(&batch, &stored);
    ensure!(
        missing.is_empty(),
        "write returned Ok but the backend lacks {missing:?}"
    );
    Ok(())
}

/// Where the sink claims idempotence, writing the same batch twice (a replay
/// after a crash) stores each message once. Otherwise it stores each at least
/// once and still succeeds.
pub async fn replayed_batch_not_duplicated(
    subject: &SinkSubject,
    backend: &dyn SinkBackend,
) -> Outcome {
    let mut sink = subject.open(backend).await?;
    let batch = messages(0..10);
    write(sink.as_ref(), &batch).await?;
    write(sink.as_ref(), &batch).await?;
    close(sink.as_mut()).await?;
    let counts = counts(&backend.stored().await?);
    for key in keys(&batch) {
        let copies = counts.get(&key).copied().unwrap_or(0);
        if backend.idempotent() {
            ensure!(
                copies == 1,
                "the sink claims idempotence, yet {key} is stored {copies} times after a replay"
            );
        } else {
            ensure!(copies >= 1, "{key} is missing after a replay");
        }
    }
    Ok(())
}

/// A refused write names only messages of the batch it was given, each once,
/// with a reason. As the engine does, the rest is written again until `Ok`:
/// every refused message was named, none is stored, the rest is.
pub async fn rejections_in_range(subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    let mut sink = subject.open(backend).await?;
    let mut batch = messages(0..12);
    let mut poisoned = Vec::new();
    for index in [3, 7] {
        if backend.poison(&mut batch[index]) {
            poisoned.push(key_of(&batch[index]));
        }
    }
    let outcome = write_rejecting(sink.as_ref(), backend, batch.clone()).await;
    close(sink.as_mut()).await?;
    let rejected = outcome?;
    let mut named: Vec<&String> = rejected.iter().collect();
    named.sort();
    let mut wanted: Vec<&String> = poisoned.iter().collect();
    wanted.sort();
    ensure!(
        named == wanted,
        "the backend refuses {wanted:?}; the sink rejected {named:?}"
    );
    let stored = backend.stored().await?;
    for key in keys(&batch) {
        let refused = poisoned.contains(&key);
        ensure!(
            stored.contains(&key) != refused,
            "{key} (refused: {refused}) is {} the backend",
            if refused { "in" } else { "missing from" }
        );
    }
    Ok(())
}

/// Writes `batch` as the engine does: what an answer says is durable or
/// rejected leaves the batch (durable messages must be in the backend at
/// once), the rest is written again; returns the keys of the rejected
/// messages.
async fn write_rejecting(
    sink: &dyn Sink,
    backend: &dyn SinkBackend,
    mut batch: Vec<SinkMessage>,
) -> Result<Vec<String>, String> {
    let mut rejected_keys = Vec::new();
    for _ in 0..=batch.len() {
        let (durable, rejected) = match write_durably(sink, &batch).await {
            Ok(()) => return Ok(rejected_keys),
            Err(SinkError::Rejected(rejected)) => (Vec::new(), rejected),
            Err(SinkError::Partial(partial)) if !matches!(partial.rest, SinkError::Fatal(_)) => {
                (partial.durable, partial.rejected)
            }
            Err(error) => return Err(format!("expected Ok, Rejected or Partial, got {error}")),
        };
        ensure!(
            !rejected.is_empty() || !durable.is_empty(),
            "an answer settling no message"
        );
        let mut settled = HashSet::new();
        for index in durable
            .iter()
            .chain(rejected.iter().map(|rejection| &rejection.index))
        {
            ensure!(
                *index < batch.len(),
                "index {index} is out of range for a batch of {}",
                batch.len()
            );
            ensure!(settled.insert(*index), "index {index} settled twice");
        }
        ensure!(
            rejected
                .iter()
                .all(|rejection| !rejection.reason.is_empty()),
            "rejection without a reason"
        );
        let stored = backend.stored().await?;
        for index in &durable {
            let key = key_of(&batch[*index]);
            ensure!(
                stored.contains(&key),
                "{key} was answered durable but is not stored"
            );
        }
        let refused: HashSet<usize> = rejected.iter().map(|rejection| rejection.index).collect();
        let mut index = 0;
        batch.retain(|message| {
            let keep = !settled.contains(&index);
            if refused.contains(&index) {
                rejected_keys.push(key_of(message));
            }
            index += 1;
            keep
        });
    }
    Err("the sink kept rejecting".into())
}

/// While the backend fails transiently, `write` returns `Transient` (so the
/// engine commits nothing and writes the batch again); once it heals, the
/// retried batch is stored whole.
pub async fn transient_error_retried(subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    let mut sink = subject.open(backend).await?;
    if !backend.fault().await {
        close(sink.as_mut()).await?;
        return Ok(());
    }
    let batch = messages(0..8);
    let failed = write_durably(sink.as_ref(), &batch).await;
    backend.heal().await;
    if let Err(SinkError::Disconnected(_)) = &failed {
        // As the engine does (rule O2): a fresh instance writes again.
        close(sink.as_mut()).await?;
        sink = subject.open(backend).await?;
    }
    let outcome = async {
        match failed {
            Err(SinkError::Transient { .. } | SinkError::Disconnected(_)) => {}
            Err(SinkError::Partial(partial)) if partial.rest.is_transient() => {}
            Ok(()) => return Err("write returned Ok while the backend was down".into()),
            Err(error) => return Err(format!("expected a transient error, got {error}")),
        }
        write(sink.as_ref(), &batch).await?;
        let stored = backend.stored().await?;
        let missing = missing(&batch, &stored);
        ensure!(
            missing.is_empty(),
            "after the retry the backend lacks {missing:?}"
        );
        Ok(())
    }
    .await;
    close(sink.as_mut()).await?;
    outcome
}

/// Rule O1: opening a sink whose backend refuses connections (its config
/// pointed at a closed port) is not fatal: it succeeds (a lazy connection)
/// or fails transiently, so the engine retries it; once the backend can be
/// reached a fresh instance opens and writes. A fixture whose config names
/// no local address has nothing to refuse, and passes.
pub async fn open_while_down_is_retried(
    subject: &SinkSubject,
    backend: &dyn SinkBackend,
) -> Outcome {
    let Some(unreachable) = unreachable(&backend.plugin_config()) else {
        return Ok(());
    };
    let built = (subject.build)(&unreachable);
    let mut down = built.map_err(|error| format!("building {}: {error}", subject.name))?;
    match down.open().await {
        Ok(()) => close(down.as_mut()).await?,
        Err(error) if error.is_transient() => {}
        Err(error) => {
            return Err(format!(
                "open while the backend was down was fatal: {error}"
            ));
        }
    }
    let mut sink = subject.open(backend).await?;
    let batch = messages(0..4);
    let written = write(sink.as_ref(), &batch).await;
    close(sink.as_mut()).await?;
    written?;
    let missing = missing(&batch, &backend.stored().await?);
    ensure!(
        missing.is_empty(),
        "once reachable the backend lacks {missing:?}"
    );
    Ok(())
}

/// `config` with every local address (`127.0.0.1:PORT`, `localhost:PORT`)
/// moved to a port nothing listens on; `None` when it names none.
pub fn unreachable(config: &Value) -> Option<Value> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .ok()?;
    let mut config = config.clone();
    let mut moved = false;
    move_ports(&mut config, closed, &mut moved);
    moved.then_some(config)
}

fn move_ports(value: &mut Value, closed: u16, moved: &mut bool) {
    match value {
        Value::String(text) => {
            for host in ["127.0.0.1:", "localhost:"] {
                let Some(start) = text.find(host).map(|at| at + host.len()) else {
                    continue;
                };
                let digits = text[start..]
                    .chars()
                    .take_while(char::is_ascii_digit)
                    .count();
                if digits > 0 {
                    text.replace_range(start..start + digits, &closed.to_string());
                    *moved = true;
                }
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| move_ports(item, closed, moved)),
        Value::Object(fields) => fields
            .values_mut()
            .for_each(|field| move_ports(field, closed, moved)),
        _ => {}
    }
}

/// The checks' messages: JSON payloads `{"key": "<id>"}`, `id` and offset `n`.
pub fn messages(range: std::ops::Range<u64>) -> Vec<SinkMessage> {
    let base = crate::id_base();
    range
        .map(|n| {
            let id = base + u128::from(n);
            SinkMessage {
                id,
                offset: n,
                partition_id: 1,
                timestamp: 1_700_000_000_000_000 + n,
                origin_timestamp: 1_700_000_000_000_000 + n,
                checksum: n,
                headers: Vec::new(),
                payload: Payload::Json(json!({"key": id.to_string(), "n": n})),
            }
        })
        .collect()
}

/// The key of a message, as backends read it back: its `id` in decimal.
pub fn key_of(message: &SinkMessage) -> String {
    message.id.to_string()
}

/// The `key` field of a stored JSON payload.
pub fn payload_key(payload: &Value) -> Option<String> {
    payload["key"].as_str().map(str::to_owned)
}

/// Marks a checks' message so that a backend refusing `poison` refuses it.
pub fn poison_json(message: &mut SinkMessage) {
    if let Payload::Json(value) = &mut message.payload {
        value["poison"] = json!(true);
    }
}

/// The keys of `batch` that are not in `stored`.
fn missing(batch: &[SinkMessage], stored: &[String]) -> Vec<String> {
    keys(batch)
        .into_iter()
        .filter(|key| !stored.contains(key))
        .collect()
}

fn keys(batch: &[SinkMessage]) -> Vec<String> {
    batch.iter().map(key_of).collect()
}

fn counts(stored: &[String]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for key in stored {
        *counts.entry(key.clone()).or_default() += 1;
    }
    counts
}

fn topic() -> TopicRef {
    TopicRef {
        stream: "conformance".into(),
        topic: "messages".into(),
    }
}

async fn write(sink: &dyn Sink, batch: &[SinkMessage]) -> Outcome {
    write_durably(sink, batch)
        .await
        .map_err(|error| format!("write: {error}"))
}

/// `write`, and for a sink that defers acknowledgement (rule K6) the flush
/// of everything it holds that the engine would call: `Ok` means durable.
async fn write_durably(sink: &dyn Sink, batch: &[SinkMessage]) -> Result<(), SinkError> {
    sink.write(&topic(), batch).await?;
    if sink.deferred().is_some() {
        sink.flush(&topic(), Flush::All).await?;
    }
    Ok(())
}

async fn close(sink: &mut dyn Sink) -> Outcome {
    sink.close()
        .await
        .map_err(|error| format!("close: {error}"))
}
