//! The sink checks: each writes batches through the sink and reads back what
//! the backend holds through the backend itself (SQL, the receiving server,
//! the file), never through the sink.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;
use iggy_connect::connectors::{Flush, Partial, PluginConfigError, Registry, Sink, SinkError};
use iggy_connect::message::{Payload, SinkMessage, TopicRef};
use serde_json::{Value, json};

use crate::support::proxy::{HttpProxy, Proxy};
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
    /// Whether the backend's protocol asks clients to wait with
    /// `Retry-After` (HTTP 429/503), so the sink must carry it to the engine;
    /// a fixture saying no names why in a comment.
    fn has_retry_after(&self) -> bool {
        true
    }
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
        self.open_with(&backend.plugin_config()).await
    }

    async fn open_with(&self, config: &Value) -> Result<Box<dyn Sink>, String> {
        let mut sink =
            (self.build)(config).map_err(|error| format!("building {}: {error}", self.name))?;
        sink.open()
            .await
            .map_err(|error| format!("open: {error}"))?;
        Ok(sink)
    }
}

/// Every sink check, by name.
pub const CHECKS: [&str; 7] = [
    "ok_means_durable",
    "replayed_batch_not_duplicated",
    "rejections_in_range",
    "transient_error_retried",
    "open_while_down_is_retried",
    "connection_dropped_mid_batch",
    "retry_after_carried",
];

/// Runs the sink check named `check`.
pub async fn run(check: &str, subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    match check {
        "ok_means_durable" => ok_means_durable(subject, backend).await,
        "replayed_batch_not_duplicated" => replayed_batch_not_duplicated(subject, backend).await,
        "rejections_in_range" => rejections_in_range(subject, backend).await,
        "transient_error_retried" => transient_error_retried(subject, backend).await,
        "open_while_down_is_retried" => open_while_down_is_retried(subject, backend).await,
        "connection_dropped_mid_batch" => connection_dropped_mid_batch(subject, backend).await,
        "retry_after_carried" => retry_after_carried(subject, backend).await,
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
/// batch written again as the engine does is stored whole.
pub async fn transient_error_retried(subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    let mut sink = subject.open(backend).await?;
    if !backend.fault().await {
        close(sink.as_mut()).await?;
        return Ok(());
    }
    let batch = messages(0..8);
    let failed = write_durably(sink.as_ref(), &batch).await;
    backend.heal().await;
    let outcome = async {
        match &failed {
            Err(SinkError::Transient { .. } | SinkError::Disconnected(_)) => {}
            Err(SinkError::Partial(partial)) if partial.rest.is_transient() => {}
            Ok(()) => return Err("write returned Ok while the backend was down".into()),
            Err(error) => return Err(format!("expected a transient error, got {error}")),
        }
        // As the engine does: what is not durable is written again (a lost
        // connection by a fresh instance) until `Ok`.
        let config = backend.plugin_config();
        settle(subject, &config, &mut sink, batch.clone(), failed).await?;
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

/// Rule O2: the connection a sink holds is cut in the middle of a batch (a
/// relay in front of the backend drops it halfway through the bytes such a
/// batch takes). As the engine does, what the answer calls durable leaves the
/// batch, a lost connection is opened again and the rest written until `Ok`:
/// then every message is stored, each once where the sink claims
/// idempotence. A fixture whose config names no single local address (or
/// a backend not reached over TCP) has nothing to cut, and passes.
pub async fn connection_dropped_mid_batch(
    subject: &SinkSubject,
    backend: &dyn SinkBackend,
) -> Outcome {
    let config = backend.plugin_config();
    let Some(target) = local_address(&config) else {
        return Ok(());
    };
    let proxy = Proxy::start(target).await;
    let relayed = with_port(&config, target.port(), proxy.addr.port());
    let mut sink = subject.open_with(&relayed).await?;
    let first = messages(0..10);
    let before = proxy.sent();
    let outcome = async {
        write(sink.as_ref(), &first).await?;
        let cost = proxy.sent() - before;
        if cost < 2 {
            // The batch did not go over this address (an in-memory backend).
            return Ok(());
        }
        let second = messages(10..20);
        proxy.cut_after(cost / 2);
        let cut = bounded(write_durably(sink.as_ref(), &second)).await?;
        eprintln!(
            "{target}: cut after {} of the {cost} bytes a batch took; the sink answered {cut:?}",
            cost / 2
        );
        proxy.set_down(false);
        settle(subject, &relayed, &mut sink, second.clone(), cut).await?;
        let written: Vec<SinkMessage> = first.iter().chain(&second).cloned().collect();
        stored_once(backend, &written).await
    }
    .await;
    close(sink.as_mut()).await?;
    outcome
}

/// Writes what is not durable again as the engine does after `answer`
/// (rules S2, O2, K6): durable messages leave the batch; a lost connection
/// means a fresh instance, written the rest; a transient failure a short
/// wait, then the rest written again, or, for a sink holding what it took
/// (deferred), flushed again; until `Ok`.
async fn settle(
    subject: &SinkSubject,
    config: &Value,
    sink: &mut Box<dyn Sink>,
    mut rest: Vec<SinkMessage>,
    mut answer: Result<(), SinkError>,
) -> Outcome {
    let topic = topic();
    let mut wait = Duration::from_millis(50);
    for _ in 0..40 {
        let reopen = match answer {
            Ok(()) => return Ok(()),
            Err(SinkError::Disconnected(_)) => true,
            Err(SinkError::Transient { .. }) => false,
            Err(SinkError::Partial(partial)) if partial.rejected.is_empty() => {
                let Partial {
                    durable,
                    rest: failed,
                    ..
                } = *partial;
                let mut index = 0;
                rest.retain(|_| {
                    index += 1;
                    !durable.contains(&(index - 1))
                });
                match failed {
                    SinkError::Disconnected(_) => true,
                    error if error.is_transient() => false,
                    error => {
                        return Err(format!("the rest failed for good: {error}"));
                    }
                }
            }
            Err(error) => {
                return Err(format!(
                    "a lost connection or an outage must be answered transient or Disconnected, got {error}"
                ));
            }
        };
        let retried = if reopen {
            close(sink.as_mut()).await?;
            *sink = subject.open_with(config).await?;
            write_durably(sink.as_ref(), &rest)
        } else {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(1));
            if sink.deferred().is_some() {
                Box::pin(sink.flush(&topic, Flush::All))
            } else {
                write_durably(sink.as_ref(), &rest)
            }
        };
        answer = bounded(retried).await?;
    }
    Err(format!(
        "still failing after the backend came back: {}",
        answer
            .err()
            .map(|error| error.to_string())
            .unwrap_or_default()
    ))
}

/// Rule S3: a backend answering `429 Too Many Requests` with `Retry-After`
/// makes `write` fail transiently carrying that time, for the engine to wait
/// (a relay in front of the backend answers for it); once it no longer
/// throttles, the batch is written. Fixtures not speaking HTTP to a single
/// local address pass.
pub async fn retry_after_carried(subject: &SinkSubject, backend: &dyn SinkBackend) -> Outcome {
    let config = backend.plugin_config();
    let Some(target) = local_address(&config)
        .filter(|target| backend.has_retry_after() && speaks_http(&config, *target))
    else {
        return Ok(());
    };
    let proxy = HttpProxy::start(target).await;
    let relayed = with_port(&config, target.port(), proxy.addr.port());
    let mut sink = subject.open_with(&relayed).await?;
    let batch = messages(0..6);
    let outcome = async {
        const ASKED: Duration = Duration::from_secs(7);
        proxy.throttle(Some(ASKED));
        let throttled = bounded(write_durably(sink.as_ref(), &batch)).await?;
        proxy.throttle(None);
        let carried = match &throttled {
            Err(SinkError::Transient { retry_after, .. }) => *retry_after,
            Err(SinkError::Partial(partial)) => match &partial.rest {
                SinkError::Transient { retry_after, .. } => *retry_after,
                other => return Err(format!("a 429 answered as {other}")),
            },
            Ok(()) => return Err("write returned Ok while the backend answered 429".into()),
            Err(other) => return Err(format!("a 429 answered as {other}, not transient")),
        };
        ensure!(
            carried == Some(ASKED),
            "the backend said Retry-After: 7; the sink told the engine {carried:?}"
        );
        write(sink.as_ref(), &batch).await?;
        let missing = missing(&batch, &backend.stored().await?);
        ensure!(
            missing.is_empty(),
            "after the throttling the backend lacks {missing:?}"
        );
        Ok(())
    }
    .await;
    close(sink.as_mut()).await?;
    outcome
}

/// Every message of `written` is stored; once each where the sink claims
/// idempotence.
async fn stored_once(backend: &dyn SinkBackend, written: &[SinkMessage]) -> Outcome {
    let counts = counts(&backend.stored().await?);
    for key in keys(written) {
        let copies = counts.get(&key).copied().unwrap_or(0);
        ensure!(copies >= 1, "{key} is lost");
        ensure!(
            copies == 1 || !backend.idempotent(),
            "the sink claims idempotence, yet {key} is stored {copies} times"
        );
    }
    Ok(())
}

/// A write that neither answers nor fails within a minute hangs: a sink
/// must notice a dead connection.
async fn bounded(
    write: impl Future<Output = Result<(), SinkError>>,
) -> Result<Result<(), SinkError>, String> {
    tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .map_err(|_| "write hung for a minute after its connection was cut".to_owned())
}

/// `config` with every local address (`127.0.0.1:PORT`, `localhost:PORT`,
/// a `port` field) moved to a port nothing listens on; `None` when it names
/// none.
pub fn unreachable(config: &Value) -> Option<Value> {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .ok()?;
    let mut config = config.clone();
    let mut moved = false;
    map_ports(&mut config, &mut |_| {
        moved = true;
        Some(closed)
    });
    moved.then_some(config)
}

/// The one local address `config` names (`127.0.0.1:PORT`,
/// `localhost:PORT`, or a `port` field); `None` for none or several.
pub fn local_address(config: &Value) -> Option<SocketAddr> {
    let mut ports = Vec::new();
    map_ports(&mut config.clone(), &mut |port| {
        ports.push(port);
        None
    });
    ports.sort_unstable();
    ports.dedup();
    match ports[..] {
        [port] => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        _ => None,
    }
}

/// `config` with the local port `from` replaced by `to`.
pub fn with_port(config: &Value, from: u16, to: u16) -> Value {
    let mut config = config.clone();
    map_ports(&mut config, &mut |port| (port == from).then_some(to));
    config
}

/// Whether `config` reaches `target` by `http://` URL.
fn speaks_http(config: &Value, target: SocketAddr) -> bool {
    let urls = [
        format!("http://127.0.0.1:{}", target.port()),
        format!("http://localhost:{}", target.port()),
    ];
    let text = config.to_string();
    urls.iter().any(|url| text.contains(url.as_str()))
}

/// Calls `map` with every local port `value` names (in a `127.0.0.1:PORT`
/// or `localhost:PORT` string, or a `port` field) and puts back the port it
/// returns.
fn map_ports(value: &mut Value, map: &mut impl FnMut(u16) -> Option<u16>) {
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
                let Ok(port) = text[start..start + digits].parse() else {
                    continue;
                };
                if let Some(new) = map(port) {
                    text.replace_range(start..start + digits, &new.to_string());
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|item| map_ports(item, map)),
        Value::Object(fields) => {
            for (name, field) in fields.iter_mut() {
                match field.as_u64().and_then(|port| u16::try_from(port).ok()) {
                    Some(port) if name == "port" => {
                        if let Some(new) = map(port) {
                            *field = Value::from(new);
                        }
                    }
                    _ => map_ports(field, map),
                }
            }
        }
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
fn write_durably<'a>(
    sink: &'a dyn Sink,
    batch: &'a [SinkMessage],
) -> BoxFuture<'a, Result<(), SinkError>> {
    Box::pin(async move {
        sink.write(&topic(), batch).await?;
        if sink.deferred().is_some() {
            sink.flush(&topic(), Flush::All).await?;
        }
        Ok(())
    })
}

async fn close(sink: &mut dyn Sink) -> Outcome {
    sink.close()
        .await
        .map_err(|error| format!("close: {error}"))
}
