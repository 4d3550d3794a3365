//! The source checks. Each takes the connector (how to build it) and a fresh
//! backend of its fixture, and returns what went wrong instead of panicking,
//! so the self-tests can assert that a broken connector fails them.

use std::collections::HashSet;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use async_trait::async_trait;
use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, KindConfig, SourceStream};
use iggy_connect::connectors::{
    BuildError, ConnectorError, ConnectorKind, PluginConfigError, Registry, Source, SourceBatch,
};
use iggy_connect::engine::runtime::{ConnectorFactory, RuntimeOptions};
use iggy_connect::engine::{Runtime, Status, StopReason};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::state::{FileStateStore, StateStore, StoredState};
use serde_json::Value;

use crate::support::proxy::Proxy;
use crate::support::wait::{Check, try_eventually};
use crate::{Outcome, ensure, unique};

/// How long a check waits for records before failing.
const DEADLINE: Duration = Duration::from_secs(15);

/// A connector's backend for the source checks: one per check, of its own.
#[async_trait]
pub trait SourceBackend: Send + Sync {
    /// The `plugin_config` that points the source at this backend.
    fn plugin_config(&self) -> Value;
    /// Whether the source keeps state. One that does not must start fresh from
    /// any stored state (its documented behaviour) and hand out none.
    fn stateful(&self) -> bool {
        true
    }
    /// Makes `count` more input items available to an open source (rows
    /// inserted, requests sent and received) and returns their keys, in the
    /// order the source must produce them.
    async fn feed(&self, count: usize) -> Vec<String>;
    /// The key of the input item a produced payload came from.
    fn key(&self, payload: &[u8]) -> String;
    /// Whether the source connects to the backend (rather than being the
    /// server its input connects to): only then is there a connection of
    /// its own to cut.
    fn dials_out(&self) -> bool {
        true
    }
    /// Whether the backend keeps what is fed while the source is away (a
    /// table, a queue, a log); pub/sub does not, by its protocol.
    fn keeps_while_away(&self) -> bool {
        true
    }
    /// How a poll can be made to wait for sure, to be dropped mid-wait
    /// (`cancelled_poll_loses_nothing`).
    fn poll_wait(&self) -> PollWait {
        PollWait::ForItems
    }
    /// With [`PollWait::WhileHeld`]: holds the backend busy (its table locked
    /// by a session of the fixture's own, the relay in front of it stalled)
    /// so that no poll can complete until the returned future, awaited,
    /// releases it. Called with items fed and not yet polled.
    async fn hold(&self) -> Option<Release> {
        None
    }
    /// Called once the source that polled `fed` was closed without `commit`:
    /// fails if the input was consumed (rows deleted or marked, clients
    /// answered with 2xx).
    async fn untouched(&self, fed: &[String]) -> Outcome;
}

/// How `cancelled_poll_loses_nothing` gets a poll that is waiting for sure
/// when it drops it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollWait {
    /// A generator answers at once (the engine paces it, rule S8): there is
    /// no wait to cancel, and the check is skipped.
    Never,
    /// The poll waits for items pushed to the backend or its client (a
    /// broker, a listener, a change stream): with nothing new fed it cannot
    /// complete with items. Items are fed once it was dropped.
    ForItems,
    /// The poll waits for the backend's answer, which [`SourceBackend::hold`]
    /// withholds: items are fed, the backend held, the poll dropped, the
    /// backend released.
    WhileHeld,
}

/// Awaited, releases what [`SourceBackend::hold`] held.
pub type Release = futures::future::BoxFuture<'static, ()>;

pub type BuildSource =
    Arc<dyn Fn(&Value) -> Result<Box<dyn Source>, PluginConfigError> + Send + Sync>;

/// The connector under test: its registry name and how to build it.
#[derive(Clone)]
pub struct SourceSubject {
    pub name: &'static str,
    pub build: BuildSource,
}

impl SourceSubject {
    /// The compiled-in connector `name`, built through its registry entry.
    pub fn registered(name: &'static str) -> Self {
        let entry = Registry::sources()
            .iter()
            .find(|entry| entry.name == name)
            .unwrap_or_else(|| panic!("no source \"{name}\" in the registry"));
        Self {
            name,
            build: Arc::new(entry.build),
        }
    }

    async fn open(
        &self,
        backend: &dyn SourceBackend,
        state: Option<&[u8]>,
    ) -> Result<Box<dyn Source>, String> {
        self.open_with(&backend.plugin_config(), state).await
    }

    async fn open_with(
        &self,
        config: &Value,
        state: Option<&[u8]>,
    ) -> Result<Box<dyn Source>, String> {
        let mut source =
            (self.build)(config).map_err(|error| format!("building {}: {error}", self.name))?;
        source
            .open(state)
            .await
            .map_err(|error| format!("open: {error}"))?;
        Ok(source)
    }
}

/// Every source check, by name.
pub const CHECKS: [&str; 8] = [
    "fresh_start",
    "restore",
    "corrupt_state_refused",
    "state_round_trip",
    "nothing_destructive_before_commit",
    "cancelled_poll_loses_nothing",
    "open_while_down_is_retried",
    "connection_dropped_mid_run",
];

/// Runs the source check named `check`.
pub async fn run(check: &str, subject: &SourceSubject, backend: &dyn SourceBackend) -> Outcome {
    match check {
        "fresh_start" => fresh_start(subject, backend).await,
        "restore" => restore(subject, backend).await,
        "corrupt_state_refused" => corrupt_state_refused(subject, backend).await,
        "state_round_trip" => state_round_trip(subject, backend).await,
        "nothing_destructive_before_commit" => {
            nothing_destructive_before_commit(subject, backend).await
        }
        "cancelled_poll_loses_nothing" => cancelled_poll_loses_nothing(subject, backend).await,
        "open_while_down_is_retried" => open_while_down_is_retried(subject, backend).await,
        "connection_dropped_mid_run" => connection_dropped_mid_run(subject, backend).await,
        other => Err(format!("no source check {other}")),
    }
}

/// A fresh start (no state) produces the input from its first item.
pub async fn fresh_start(subject: &SourceSubject, backend: &dyn SourceBackend) -> Outcome {
    let mut source = subject.open(backend, None).await?;
    let fed = backend.feed(3).await;
    let delivered = deliver(source.as_ref(), backend, &fed, true).await?;
    close(source.as_mut()).await?;
    ensure!(
        delivered.keys.first() == fed.first(),
        "a fresh start must begin with the first input item {:?}, began with {:?}",
        fed.first(),
        delivered.keys.first()
    );
    Ok(())
}

/// A source opened with the state of its last committed batch continues after
/// it: nothing committed comes again, nothing new is skipped.
pub async fn restore(subject: &SourceSubject, backend: &dyn SourceBackend) -> Outcome {
    let mut source = subject.open(backend, None).await?;
    let first = backend.feed(3).await;
    let delivered = deliver(source.as_ref(), backend, &first, true).await?;
    close(source.as_mut()).await?;
    let state = match (backend.stateful(), delivered.state) {
        (true, None) => return Err("a stateful source handed out no state".into()),
        (false, Some(_)) => return Err("a stateless source handed out a state".into()),
        (true, Some(state)) => state,
        // Its documented fresh start: any stored state is ignored.
        (false, None) => b"\xc1 not a state".to_vec(),
    };
    let mut restored = subject.open(backend, Some(&state)).await?;
    let second = backend.feed(3).await;
    let again = deliver(restored.as_ref(), backend, &second, true).await?;
    close(restored.as_mut()).await?;
    let committed: HashSet<&String> = delivered.keys.iter().collect();
    let repeated: Vec<&String> = again
        .keys
        .iter()
        .filter(|key| committed.contains(key))
        .collect();
    ensure!(
        repeated.is_empty(),
        "restored from its state, the source produced committed items again: {repeated:?}"
    );
    ensure!(
        again.keys.first() == second.first(),
        "restored from its state, the source must continue with {:?}, began with {:?}",
        second.first(),
        again.keys.first()
    );
    Ok(())
}

/// A stored state the source cannot read stops the start (naming the state
/// file) and is left as it is; a source without state starts fresh instead.
/// A state file that is not one at all is refused for every source.
pub async fn corrupt_state_refused(
    subject: &SourceSubject,
    backend: &dyn SourceBackend,
) -> Outcome {
    let dir = tempfile::tempdir().map_err(|error| error.to_string())?;
    let store = FileStateStore::new(dir.path()).map_err(|error| error.to_string())?;
    let cases: [(&str, Option<&[u8]>); 2] = [
        ("undecodable state", Some(b"\xc1\xc1 garbage")),
        ("not a state file", None),
    ];
    for (case, data) in cases {
        let key = unique("corrupt");
        let path = store.path_for(&key);
        match data {
            Some(data) => store
                .save(
                    &key,
                    &StoredState {
                        connector: subject.name.into(),
                        data: data.to_vec(),
                    },
                )
                .await
                .map_err(|error| error.to_string())?,
            None => {
                std::fs::write(&path, b"not a state file").map_err(|error| error.to_string())?
            }
        }
        let before = std::fs::read(&path).map_err(|error| error.to_string())?;
        let runtime = runtime(subject, Arc::new(MemoryBus::new()), Arc::new(store.clone()));
        runtime
            .add(source_config(subject.name, &key, backend.plugin_config()))
            .map_err(|error| error.to_string())?;
        runtime.start_enabled().await;
        let refused = data.is_none() || backend.stateful();
        // Running or stopped, whichever it comes to.
        let settled = wait_until_settled(&runtime, &key).await;
        let status = runtime
            .view(ConnectorKind::Source, &key)
            .map_err(|error| error.to_string())?
            .status;
        runtime.shutdown().await;
        settled?;
        if refused {
            ensure!(
                status.stop_reason == Some(StopReason::StartFailed),
                "{case}: the start must fail, the source stopped with {:?}",
                status.stop_reason
            );
            let message = status
                .last_error
                .map(|error| error.message)
                .unwrap_or_default();
            ensure!(
                message.contains(&path.display().to_string()),
                "{case}: the error must name the state file {}: {message}",
                path.display()
            );
        } else {
            ensure!(
                status.stop_reason.is_none(),
                "{case}: a stateless source must start fresh, it stopped with {:?}",
                status.stop_reason
            );
        }
        let after = std::fs::read(&path).map_err(|error| error.to_string())?;
        ensure!(before == after, "{case}: the state file was changed");
    }
    Ok(())
}

/// Through the real engine and the file state store: what one run committed is
/// not produced again by the next run, which goes on with new input.
pub async fn state_round_trip(subject: &SourceSubject, backend: &dyn SourceBackend) -> Outcome {
    let dir = tempfile::tempdir().map_err(|error| error.to_string())?;
    let store = Arc::new(FileStateStore::new(dir.path()).map_err(|error| error.to_string())?);
    let bus = MemoryBus::new();
    let key = unique("round_trip");
    for run in 0..2 {
        let runtime = runtime(subject, Arc::new(bus.clone()), store.clone());
        runtime
            .add(source_config(subject.name, &key, backend.plugin_config()))
            .map_err(|error| error.to_string())?;
        runtime.start_enabled().await;
        let before = bus.messages(STREAM, TOPIC).len();
        let fed = backend.feed(3).await;
        let seen = wait_for_keys(&bus, backend, &fed, before).await;
        runtime.shutdown().await;
        seen.map_err(|error| format!("run {run}: {error}"))?;
        if backend.stateful() {
            let stored = store
                .load(&key)
                .await
                .map_err(|error| error.to_string())?
                .ok_or_else(|| format!("run {run}: no state saved"))?;
            ensure!(
                stored.connector == subject.name,
                "run {run}: the state names connector {:?}",
                stored.connector
            );
        }
    }
    let keys = bus_keys(&bus, backend);
    let mut seen = HashSet::new();
    let repeated: Vec<&String> = keys.iter().filter(|key| !seen.insert(*key)).collect();
    ensure!(
        repeated.is_empty(),
        "after a clean restart from its saved state, items came twice: {repeated:?}"
    );
    Ok(())
}

/// A batch polled and never committed (the source closed instead) leaves the
/// input as it was, and a source reopened from the state before that batch
/// produces it again.
pub async fn nothing_destructive_before_commit(
    subject: &SourceSubject,
    backend: &dyn SourceBackend,
) -> Outcome {
    let mut source = subject.open(backend, None).await?;
    let fed = backend.feed(3).await;
    let delivered = deliver(source.as_ref(), backend, &fed[..1], false).await?;
    close(source.as_mut()).await?;
    backend.untouched(&fed).await?;
    if backend.stateful() {
        let mut again = subject.open(backend, None).await?;
        let redelivered = deliver(again.as_ref(), backend, &fed, true).await?;
        close(again.as_mut()).await?;
        ensure!(
            redelivered.keys.first() == delivered.keys.first(),
            "reopened from the state before an uncommitted batch, the source must produce it again from {:?}, began with {:?}",
            delivered.keys.first(),
            redelivered.keys.first()
        );
    }
    Ok(())
}

/// A `poll` dropped while it waits (shutdown) loses nothing: the next polls
/// still produce every item, from the first one not committed.
///
/// The poll is made to wait for sure (a timer would race a fast local
/// backend, and a query can be answered before the client first reads):
/// either the backend is held busy with items fed (`WhileHeld`), or nothing
/// new is fed until the poll was dropped (`ForItems`). The check passes only
/// once a poll was seen pending and dropped.
pub async fn cancelled_poll_loses_nothing(
    subject: &SourceSubject,
    backend: &dyn SourceBackend,
) -> Outcome {
    let wait = backend.poll_wait();
    if wait == PollWait::Never {
        return Ok(());
    }
    let mut source = subject.open(backend, None).await?;
    let first = backend.feed(2).await;
    deliver(source.as_ref(), backend, &first, true).await?;
    let second = match wait {
        PollWait::WhileHeld => {
            let second = backend.feed(3).await;
            let release = backend
                .hold()
                .await
                .ok_or("the fixture says its poll waits while held, but holds nothing")?;
            let dropped = drop_waiting_poll(source.as_ref(), true).await;
            release.await;
            dropped?;
            second
        }
        _ => {
            drop_waiting_poll(source.as_ref(), false).await?;
            backend.feed(3).await
        }
    };
    let delivered = deliver(source.as_ref(), backend, &second, true).await?;
    close(source.as_mut()).await?;
    ensure!(
        delivered.keys.first() == second.first(),
        "after a cancelled poll the source must go on with {:?}, went on with {:?}",
        second.first(),
        delivered.keys.first()
    );
    Ok(())
}

/// How long a poll of a held backend is driven before it is dropped: time
/// for its request to reach the backend and wait there. Not a bound on
/// anything: a held poll cannot complete however long it is driven.
const HELD_POLL: Duration = Duration::from_millis(300);

/// Polls once and drops the poll while it waits. With the backend `held`,
/// the poll must be pending and stay so while driven for [`HELD_POLL`].
/// Otherwise nothing new was fed: a poll that completes at once is a
/// caught-up answer with no records, committed and its `next_poll` waited
/// for (as the engine does) before the next try, until one waits.
async fn drop_waiting_poll(source: &dyn Source, held: bool) -> Outcome {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        let completed = {
            let mut poll = std::pin::pin!(source.poll());
            match std::future::poll_fn(|context| Poll::Ready(poll.as_mut().poll(context))).await {
                Poll::Pending if held => {
                    match tokio::time::timeout(HELD_POLL, poll.as_mut()).await {
                        Err(_) => None,
                        Ok(outcome) => {
                            return Err(format!(
                                "a poll completed while the backend was held ({}): the fixture's hold does not hold",
                                outcome.map_or_else(
                                    |error| format!("poll: {error}"),
                                    |batch| format!("{} records", batch.records.len())
                                )
                            ));
                        }
                    }
                }
                Poll::Pending => None,
                Poll::Ready(outcome) => Some(outcome.map_err(|error| format!("poll: {error}"))?),
            }
        };
        let Some(batch) = completed else {
            return Ok(());
        };
        ensure!(
            !held,
            "the first poll of a held backend completed at once: the fixture's hold does not hold"
        );
        ensure!(
            batch.records.is_empty(),
            "with nothing new fed, a poll produced {} records",
            batch.records.len()
        );
        source
            .commit()
            .await
            .map_err(|error| format!("commit: {error}"))?;
        ensure!(
            tokio::time::Instant::now() < deadline,
            "every poll completed at once for {DEADLINE:?}: no poll waited to be dropped"
        );
        if let Some(due) = batch.next_poll {
            tokio::time::sleep_until(due.min(deadline)).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

const STREAM: &str = "conformance";
const TOPIC: &str = "records";

struct Delivered {
    keys: Vec<String>,
    state: Option<Vec<u8>>,
}

impl Delivered {
    /// Adds what `batch` produced, and its state.
    fn take(&mut self, batch: &SourceBatch, backend: &dyn SourceBackend) {
        self.keys.extend(
            batch
                .records
                .iter()
                .map(|record| backend.key(&record.payload.to_bytes())),
        );
        if let Some(state) = &batch.state {
            self.state = Some(state.clone());
        }
    }
}

/// Polls (committing each batch when `commit`) until every key of `wanted`
/// was produced. Without `commit` it polls once: the engine never polls again
/// before the batch in flight is committed.
async fn deliver(
    source: &dyn Source,
    backend: &dyn SourceBackend,
    wanted: &[String],
    commit: bool,
) -> Result<Delivered, String> {
    let delivered = std::sync::Mutex::new(Delivered {
        keys: Vec::new(),
        state: None,
    });
    try_eventually(
        &format!("the source to produce {wanted:?}"),
        DEADLINE,
        || async {
            let batch = match source.poll().await {
                Ok(batch) => batch,
                // The engine polls again after a transient error; so does this.
                Err(error) if error.is_transient() => {
                    return Check::Pending(format!("poll (transient): {error}"));
                }
                Err(error) => return Check::Failed(format!("poll: {error}")),
            };
            let progress = {
                let mut delivered = delivered.lock().unwrap();
                delivered.keys.extend(
                    batch
                        .records
                        .iter()
                        .map(|record| backend.key(&record.payload.to_bytes())),
                );
                if batch.state.is_some() {
                    delivered.state = batch.state;
                }
                if !commit && !delivered.keys.is_empty() {
                    return Check::Ready(());
                }
                if wanted.iter().all(|key| delivered.keys.contains(key)) {
                    None
                } else {
                    Some(format!("got {:?}", delivered.keys))
                }
            };
            // Every batch, an empty one too, as the engine does: commits
            // pair with polls in order.
            if commit && let Err(error) = source.commit().await {
                return Check::Failed(format!("commit: {error}"));
            }
            progress.map_or(Check::Ready(()), Check::Pending)
        },
    )
    .await?;
    Ok(delivered.into_inner().unwrap())
}

async fn close(source: &mut dyn Source) -> Outcome {
    source
        .close()
        .await
        .map_err(|error| format!("close: {error}"))
}

/// Builds the subject for the runtime whatever the config names.
struct SubjectFactory(SourceSubject);

impl ConnectorFactory for SubjectFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        (self.0.build)(&config.plugin_config).map_err(BuildError::PluginConfig)
    }

    fn sink(
        &self,
        _config: &ConnectorConfig,
    ) -> Result<Box<dyn iggy_connect::connectors::Sink>, BuildError> {
        Err(BuildError::PluginConfig(PluginConfigError::new(
            "",
            "the source checks run no sink",
        )))
    }
}

fn runtime(
    subject: &SourceSubject,
    bus: Arc<MemoryBus>,
    store: Arc<dyn StateStore>,
) -> Arc<Runtime> {
    Runtime::with_options(
        bus,
        store,
        RuntimeOptions {
            shutdown_timeout: Duration::from_secs(10),
            factory: Arc::new(SubjectFactory(subject.clone())),
            ..RuntimeOptions::default()
        },
    )
}

fn source_config(connector: &str, key: &str, plugin_config: Value) -> ConnectorConfig {
    ConnectorConfig {
        kind: ConnectorKind::Source,
        key: key.into(),
        enabled: true,
        version: 0,
        name: key.into(),
        path: connector.into(),
        connector: connector.into(),
        plugin_config_format: None,
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config: KindConfig::Source {
            streams: vec![SourceStream {
                stream: STREAM.into(),
                topic: TOPIC.into(),
                schema: Schema::Json,
                batch_length: 1000,
                linger_time: Duration::from_millis(5),
                partitions: 1,
            }],
            max_consecutive_nacks: Some(0),
            max_in_flight: None,
            max_in_flight_bytes: None,
        },
        file: None,
    }
}

fn bus_keys(bus: &MemoryBus, backend: &dyn SourceBackend) -> Vec<String> {
    bus.messages(STREAM, TOPIC)
        .iter()
        .map(|message| backend.key(&message.payload))
        .collect()
}

/// Waits until the bus holds every key of `wanted` and something past `before`.
async fn wait_for_keys(
    bus: &MemoryBus,
    backend: &dyn SourceBackend,
    wanted: &[String],
    before: usize,
) -> Outcome {
    try_eventually(&format!("{wanted:?} in the topic"), DEADLINE, || async {
        let keys = bus_keys(bus, backend);
        if keys.len() > before && wanted.iter().all(|key| keys.contains(key)) {
            Check::Ready(())
        } else {
            Check::Pending(format!("found {keys:?}"))
        }
    })
    .await
}

/// Waits until the source runs or has stopped.
async fn wait_until_settled(runtime: &Runtime, key: &str) -> Outcome {
    try_eventually("the source to run or stop", DEADLINE, || async {
        match runtime.view(ConnectorKind::Source, key) {
            Err(error) => Check::Failed(error.to_string()),
            Ok(view)
                if matches!(
                    view.status.status,
                    Status::Running | Status::Stopped | Status::Error
                ) =>
            {
                Check::Ready(())
            }
            Ok(view) => Check::Pending(format!("{:?}", view.status)),
        }
    })
    .await
}

/// Rule O1: opening a source whose backend refuses connections (its config
/// pointed at a closed port) is not fatal: it succeeds (a lazy connection,
/// a listener of its own) or fails transiently, so the engine retries it.
/// A fixture whose config names no local address passes.
pub async fn open_while_down_is_retried(
    subject: &SourceSubject,
    backend: &dyn SourceBackend,
) -> Outcome {
    let Some(unreachable) = crate::sink::unreachable(&backend.plugin_config()) else {
        return Ok(());
    };
    let mut source = (subject.build)(&unreachable)
        .map_err(|error| format!("building {}: {error}", subject.name))?;
    match source.open(None).await {
        Ok(()) => {
            source
                .close()
                .await
                .map_err(|error| format!("close: {error}"))?;
            Ok(())
        }
        Err(error) if error.is_transient() => Ok(()),
        Err(error) => Err(format!(
            "open while the backend was down was fatal: {error}"
        )),
    }
}

/// Rule O2: the connection a source holds to its backend is cut while it
/// runs (a relay in front of the backend goes down, then comes back). As the
/// engine does, a poll failing `Disconnected` means a fresh instance opened
/// with the last committed state, a transient failure another poll: then
/// everything fed meanwhile is produced. A fixture whose config names no
/// single local address, or whose source is the server, has nothing to cut;
/// one whose backend keeps nothing for an absent reader has nothing to check.
pub async fn connection_dropped_mid_run(
    subject: &SourceSubject,
    backend: &dyn SourceBackend,
) -> Outcome {
    let config = backend.plugin_config();
    let Some(target) = crate::sink::local_address(&config)
        .filter(|_| backend.dials_out() && backend.keeps_while_away())
    else {
        return Ok(());
    };
    let proxy = Proxy::start(target).await;
    let relayed = crate::sink::with_port(&config, target.port(), proxy.addr.port());
    let mut source = subject.open_with(&relayed, None).await?;
    let first = backend.feed(3).await;
    let mut run = deliver(source.as_ref(), backend, &first, true).await?;
    proxy.set_down(true);
    let second = backend.feed(3).await;
    // One poll while the connection is gone: it may fail (not for good),
    // produce what it held, or wait (dropped, as the engine may).
    let mut reopen = false;
    if let Ok(polled) = tokio::time::timeout(Duration::from_secs(3), source.poll()).await {
        match polled {
            Ok(batch) => {
                run.take(&batch, backend);
                if !batch.records.is_empty() {
                    source
                        .commit()
                        .await
                        .map_err(|error| format!("commit: {error}"))?;
                }
            }
            Err(ConnectorError::Disconnected(_)) => reopen = true,
            Err(error) if error.is_transient() => {}
            Err(error) => {
                return Err(format!(
                    "a poll after the connection was cut was fatal: {error}"
                ));
            }
        }
    }
    proxy.set_down(false);
    let outcome = resume(
        subject,
        &relayed,
        &mut source,
        backend,
        &second,
        run,
        reopen,
    )
    .await;
    close(source.as_mut()).await?;
    outcome
}

/// Polls as the engine does after a cut connection until every key of
/// `wanted` was produced: `Disconnected` reopens with the last committed
/// state, a transient error polls again.
async fn resume(
    subject: &SourceSubject,
    config: &Value,
    source: &mut Box<dyn Source>,
    backend: &dyn SourceBackend,
    wanted: &[String],
    mut run: Delivered,
    mut reopen: bool,
) -> Outcome {
    let deadline = tokio::time::Instant::now() + DEADLINE * 2;
    while !wanted.iter().all(|key| run.keys.contains(key)) {
        ensure!(
            tokio::time::Instant::now() < deadline,
            "after the connection came back the source produced {:?}, not all of {wanted:?}",
            run.keys
        );
        if reopen {
            close(source.as_mut()).await?;
            *source = subject.open_with(config, run.state.as_deref()).await?;
            reopen = false;
        }
        match source.poll().await {
            Ok(batch) => {
                run.take(&batch, backend);
                source
                    .commit()
                    .await
                    .map_err(|error| format!("commit: {error}"))?;
                if let Some(due) = batch.next_poll {
                    tokio::time::sleep_until(due.min(deadline)).await;
                }
            }
            Err(ConnectorError::Disconnected(_)) => reopen = true,
            Err(error) if error.is_transient() => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => return Err(format!("poll after the connection came back: {error}")),
        }
    }
    Ok(())
}
