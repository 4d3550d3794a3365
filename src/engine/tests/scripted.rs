//! Connectors whose behaviour a test scripts, and a factory that hands them to
//! the runtime.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use crate::codec::Schema;
use crate::config::connector::{DEFAULT_BATCH_LENGTH, DEFAULT_LINGER_TIME};
use crate::config::{ConnectorConfig, KindConfig, OnError, SinkStream, SourceStream};
use crate::connectors::registry::RegistryError;
use crate::connectors::{
    BatchPolicy, BuildError, ConnectorError, ConnectorKind, Rejection, Sink, SinkError, Source,
    SourceBatch,
};
use crate::engine::runtime::ConnectorFactory;
use crate::message::{Payload, SinkMessage, SourceRecord, TopicRef};

pub const STREAM: &str = "s";
pub const TOPIC: &str = "t";
pub const GROUP: &str = "g";

/// One scripted answer to `poll`.
pub enum Step {
    Batch {
        records: Vec<SourceRecord>,
        state: Option<Vec<u8>>,
    },
    Panic,
    Fail(bool),
    /// `poll` says the source's connection is gone.
    Disconnect,
    /// The step's batch, saying the source is caught up: poll again this
    /// long after this poll (rule S8).
    CaughtUp(Box<Step>, Duration),
}

impl Step {
    /// A batch without records or state (a poll that found nothing).
    pub fn empty() -> Step {
        Step::Batch {
            records: Vec::new(),
            state: None,
        }
    }

    /// This step's batch, asking for the next poll `interval` after it.
    pub fn caught_up(self, interval: Duration) -> Step {
        Step::CaughtUp(Box::new(self), interval)
    }

    /// A batch of JSON records `{"n": i}` for `range`, whose state is the range end.
    pub fn numbers(range: std::ops::Range<u64>) -> Step {
        Step::Batch {
            state: Some(range.end.to_le_bytes().to_vec()),
            records: range
                .map(|n| {
                    SourceRecord::new(Payload::Json(serde_json::json!({ "n": n })))
                        .with_id(u128::from(n) + 1)
                })
                .collect(),
        }
    }
}

/// What a scripted source saw, shared with the test.
#[derive(Default)]
pub struct SourceLog {
    pub polls: AtomicUsize,
    /// When each `poll` was called (the engine's clock, pausable).
    pub poll_times: Mutex<Vec<tokio::time::Instant>>,
    pub commits: AtomicUsize,
    pub closes: AtomicUsize,
    /// The next n closes never end (a backend that does not answer).
    pub close_hangs: AtomicU32,
    pub opened_with: Mutex<Option<Option<Vec<u8>>>>,
    /// The state of every `open` call, failed ones included, in order.
    pub opens: Mutex<Vec<Option<Vec<u8>>>>,
    /// The next n opens fail transiently.
    pub open_failures: AtomicU32,
    /// Called at every commit; what it returns is kept in `at_commit`.
    pub probe: Mutex<Option<Box<dyn Fn() -> String + Send>>>,
    pub at_commit: Mutex<Vec<String>>,
}

pub struct ScriptedSource {
    steps: Mutex<VecDeque<Step>>,
    max_in_flight: usize,
    policy: BatchPolicy,
    pub log: Arc<SourceLog>,
}

impl ScriptedSource {
    pub fn new(steps: Vec<Step>, policy: BatchPolicy) -> (Self, Arc<SourceLog>) {
        let log = Arc::new(SourceLog::default());
        (Self::with_log(steps, policy, log.clone()), log)
    }

    /// A fresh instance reporting to an existing log (a reopened source).
    pub fn with_log(steps: Vec<Step>, policy: BatchPolicy, log: Arc<SourceLog>) -> Self {
        Self {
            steps: Mutex::new(steps.into()),
            max_in_flight: 1,
            policy,
            log,
        }
    }

    /// A source that can have `count` batches in flight.
    pub fn in_flight(mut self, count: usize) -> Self {
        self.max_in_flight = count;
        self
    }
}

#[async_trait]
impl Source for ScriptedSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let state = state.map(<[u8]>::to_vec);
        self.log.opens.lock().unwrap().push(state.clone());
        if countdown(&self.log.open_failures) {
            return Err(ConnectorError::transient("scripted: backend unreachable"));
        }
        *self.log.opened_with.lock().unwrap() = Some(state);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let now = tokio::time::Instant::now();
        self.log.poll_times.lock().unwrap().push(now);
        self.log.polls.fetch_add(1, Ordering::SeqCst);
        let step = self.steps.lock().unwrap().pop_front();
        let (step, next_poll) = match step {
            Some(Step::CaughtUp(step, interval)) => (Some(*step), Some(now + interval)),
            step => (step, None),
        };
        match step {
            Some(Step::Batch { records, state }) => Ok(SourceBatch {
                records,
                state,
                finished: false,
                next_poll,
            }),
            Some(Step::CaughtUp(..)) => unreachable!("a caught-up step holds a batch"),
            Some(Step::Panic) => panic!("scripted panic"),
            Some(Step::Fail(transient)) if transient => {
                Err(ConnectorError::transient("scripted poll failure"))
            }
            Some(Step::Fail(_)) => Err(ConnectorError::fatal("scripted fatal failure")),
            Some(Step::Disconnect) => {
                Err(ConnectorError::disconnected("scripted: connection reset"))
            }
            None => std::future::pending().await,
        }
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(probe) = self.log.probe.lock().unwrap().as_ref() {
            self.log.at_commit.lock().unwrap().push(probe());
        }
        self.log.commits.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight
    }

    fn batch_policy(&self) -> BatchPolicy {
        self.policy
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.log.closes.fetch_add(1, Ordering::SeqCst);
        if countdown(&self.log.close_hangs) {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
}

/// A sink that records what it wrote and fails as told.
#[derive(Default)]
pub struct SinkControl {
    pub written: Mutex<Vec<SinkMessage>>,
    pub writes: AtomicUsize,
    /// The next n writes fail transiently.
    pub transient_failures: AtomicU32,
    /// Messages whose JSON payload has `"bad": true` are rejected for good.
    pub reject_bad: std::sync::atomic::AtomicBool,
    /// The next write panics.
    pub panic_next: std::sync::atomic::AtomicBool,
    /// What `Sink::accepts_json_bytes` answers.
    pub accepts_json_bytes: std::sync::atomic::AtomicBool,
    /// What `Sink::writes_concurrently` answers.
    pub concurrent: std::sync::atomic::AtomicBool,
    /// While set, every write waits before doing anything.
    pub hold: std::sync::atomic::AtomicBool,
    /// Writes running now, and the most that ever ran at once.
    pub in_write: AtomicUsize,
    pub most_in_write: AtomicUsize,
    /// A write of a batch holding this number fails transiently while
    /// `failing_number_left` is above 0 (counting down).
    pub failing_number: Mutex<Option<u64>>,
    pub failing_number_left: AtomicU32,
    /// Set: the sink defers acknowledgement (rule K6), sealing a partition's
    /// buffer every `seal_every` messages; `written` then holds what flushes
    /// made durable.
    pub deferred: Mutex<Option<DeferredScript>>,
    /// Accepted and not durable yet: per partition, then sealed ones.
    pub buffered: Mutex<std::collections::BTreeMap<u32, Vec<SinkMessage>>>,
    pub sealed: Mutex<Vec<Vec<SinkMessage>>>,
    /// Per partition, the last offset flushes made durable.
    pub durable: Mutex<std::collections::BTreeMap<u32, u64>>,
    /// Flushes called, and how many of the next ones fail transiently.
    pub flushes: AtomicUsize,
    pub flush_failures: AtomicU32,
    /// Every flush takes this long.
    pub flush_delay: Mutex<Duration>,
    /// Instances opened (failed opens included) and closed.
    pub opens: AtomicUsize,
    pub closes: AtomicUsize,
    /// While set, `open` fails transiently (the backend is down).
    pub down_at_open: std::sync::atomic::AtomicBool,
    /// The next `open` fails for good.
    pub open_fatal: std::sync::atomic::AtomicBool,
    /// The next n writes say the connection is gone.
    pub disconnects: AtomicU32,
    /// Answers for the next writes, in order, before any other script: each
    /// gets the batch and what the sink holds, and says what the write did.
    pub answers: Mutex<VecDeque<Answer>>,
    /// When each write started (tokio's clock: a paused one in some tests).
    pub write_times: Mutex<Vec<tokio::time::Instant>>,
    /// The messages of each write, by number.
    pub batches: Mutex<Vec<Vec<u64>>>,
    /// What `Sink::retry` answers.
    pub retry: Mutex<Option<crate::connectors::RetrySettings>>,
}

/// A scripted answer to one write.
pub type Answer =
    Box<dyn FnOnce(&[SinkMessage], &mut Vec<SinkMessage>) -> Result<(), SinkError> + Send>;

/// Takes one from `counter` if it is above 0; whether it did.
fn countdown(counter: &AtomicU32) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            left.checked_sub(1)
        })
        .is_ok()
}

/// How a scripted sink defers acknowledgement.
#[derive(Debug, Clone, Copy)]
pub struct DeferredScript {
    pub seal_every: usize,
    pub flush_interval: Option<Duration>,
}

impl SinkControl {
    pub fn written_numbers(&self) -> Vec<u64> {
        numbers(&self.written.lock().unwrap())
    }
}

/// The `"n"` of each message that has one.
fn numbers(messages: &[SinkMessage]) -> Vec<u64> {
    messages
        .iter()
        .filter_map(|message| match &message.payload {
            Payload::Json(value) => value.get("n").and_then(serde_json::Value::as_u64),
            Payload::JsonBytes(bytes) => serde_json::from_slice::<serde_json::Value>(bytes)
                .ok()?
                .get("n")?
                .as_u64(),
            _ => None,
        })
        .collect()
}

pub struct ControlledSink(pub Arc<SinkControl>);

#[async_trait]
impl Sink for ControlledSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        let control = &self.0;
        control.opens.fetch_add(1, Ordering::SeqCst);
        if control.open_fatal.swap(false, Ordering::SeqCst) {
            return Err(ConnectorError::fatal("scripted: credentials refused"));
        }
        if control.down_at_open.load(Ordering::SeqCst) {
            return Err(ConnectorError::transient("scripted: connection refused"));
        }
        Ok(())
    }

    fn retry(&self) -> Option<crate::connectors::RetrySettings> {
        *self.0.retry.lock().unwrap()
    }

    fn accepts_json_bytes(&self) -> bool {
        self.0.accepts_json_bytes.load(Ordering::SeqCst)
    }

    fn writes_concurrently(&self) -> bool {
        self.0.concurrent.load(Ordering::SeqCst)
    }

    fn deferred(&self) -> Option<crate::connectors::Deferred> {
        let script = (*self.0.deferred.lock().unwrap())?;
        Some(crate::connectors::Deferred {
            flush_interval: script.flush_interval,
        })
    }

    async fn flush(
        &self,
        _topic: &TopicRef,
        scope: crate::connectors::Flush,
    ) -> Result<(), SinkError> {
        let control = &self.0;
        control.flushes.fetch_add(1, Ordering::SeqCst);
        let delay = *control.flush_delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if scope == crate::connectors::Flush::All {
            let mut buffered = control.buffered.lock().unwrap();
            let mut sealed = control.sealed.lock().unwrap();
            sealed.extend(std::mem::take(&mut *buffered).into_values());
        }
        let failing = control
            .flush_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            return Err(SinkError::transient("scripted flush failure"));
        }
        for file in control.sealed.lock().unwrap().drain(..) {
            if let Some(last) = file.last() {
                control
                    .durable
                    .lock()
                    .unwrap()
                    .insert(last.partition_id, last.offset);
            }
            control.written.lock().unwrap().extend(file);
        }
        Ok(())
    }

    fn durable(&self, _topic: &TopicRef) -> Vec<(u32, u64)> {
        self.0
            .durable
            .lock()
            .unwrap()
            .iter()
            .map(|(&partition, &offset)| (partition, offset))
            .collect()
    }

    async fn write(&self, topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let control = &self.0;
        let running = control.in_write.fetch_add(1, Ordering::SeqCst) + 1;
        control.most_in_write.fetch_max(running, Ordering::SeqCst);
        while control.hold.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let written = self.write_now(topic, messages).await;
        control.in_write.fetch_sub(1, Ordering::SeqCst);
        written
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.0.closes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

impl ControlledSink {
    async fn write_now(
        &self,
        _topic: &TopicRef,
        messages: &[SinkMessage],
    ) -> Result<(), SinkError> {
        let control = &self.0;
        control.writes.fetch_add(1, Ordering::SeqCst);
        control
            .write_times
            .lock()
            .unwrap()
            .push(tokio::time::Instant::now());
        control.batches.lock().unwrap().push(numbers(messages));
        let answer = control.answers.lock().unwrap().pop_front();
        if let Some(answer) = answer {
            return answer(messages, &mut control.written.lock().unwrap());
        }
        if countdown(&control.disconnects) {
            return Err(SinkError::disconnected("scripted: connection reset"));
        }
        let failing_number = *control.failing_number.lock().unwrap();
        if let Some(number) = failing_number
            && numbers(messages).contains(&number)
            && control
                .failing_number_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                    left.checked_sub(1)
                })
                .is_ok()
        {
            return Err(SinkError::transient("scripted failure of one batch"));
        }
        if control.panic_next.swap(false, Ordering::SeqCst) {
            panic!("scripted sink panic");
        }
        let failing = control
            .transient_failures
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if failing {
            return Err(SinkError::transient("scripted transient failure"));
        }
        if control.reject_bad.load(Ordering::SeqCst) {
            let rejected: Vec<Rejection> = messages
                .iter()
                .enumerate()
                .filter(|(_, message)| matches!(&message.payload, Payload::Json(value) if value.get("bad") == Some(&serde_json::Value::Bool(true))))
                .map(|(index, _)| Rejection {
                    index,
                    reason: "scripted rejection".into(),
                })
                .collect();
            if !rejected.is_empty() {
                return Err(SinkError::Rejected(rejected));
            }
        }
        let deferred = *control.deferred.lock().unwrap();
        let Some(script) = deferred else {
            control.written.lock().unwrap().extend_from_slice(messages);
            return Ok(());
        };
        let mut buffered = control.buffered.lock().unwrap();
        for message in messages {
            let buffer = buffered.entry(message.partition_id).or_default();
            buffer.push(message.clone());
            if buffer.len() >= script.seal_every {
                let file = std::mem::take(buffer);
                control.sealed.lock().unwrap().push(file);
            }
        }
        Ok(())
    }
}

type SourceMaker = Box<dyn Fn() -> Box<dyn Source> + Send + Sync>;
type SinkMaker = Box<dyn Fn() -> Box<dyn Sink> + Send + Sync>;

/// Hands the runtime the connectors a test registered under each key.
#[derive(Default)]
pub struct ScriptedFactory {
    sources: Mutex<HashMap<String, SourceMaker>>,
    sinks: Mutex<HashMap<String, SinkMaker>>,
}

impl ScriptedFactory {
    /// Registers a source that is built once; a second start fails.
    pub fn source_once(&self, key: &str, source: impl Source + 'static) {
        let cell = Mutex::new(Some(Box::new(source) as Box<dyn Source>));
        self.source_with(key, move || {
            cell.lock().unwrap().take().unwrap_or_else(|| {
                Box::new(ScriptedSource::new(Vec::new(), BatchPolicy::default()).0)
            })
        });
    }

    pub fn source_with(
        &self,
        key: &str,
        make: impl Fn() -> Box<dyn Source> + Send + Sync + 'static,
    ) {
        self.sources
            .lock()
            .unwrap()
            .insert(key.to_owned(), Box::new(make));
    }

    pub fn sink(&self, key: &str, control: Arc<SinkControl>) {
        self.sinks.lock().unwrap().insert(
            key.to_owned(),
            Box::new(move || Box::new(ControlledSink(control.clone()))),
        );
    }
}

impl ConnectorFactory for ScriptedFactory {
    fn source(&self, config: &ConnectorConfig) -> Result<Box<dyn Source>, BuildError> {
        let sources = self.sources.lock().unwrap();
        let make = sources.get(&config.key).ok_or_else(|| unscripted(config))?;
        Ok(make())
    }

    fn sink(&self, config: &ConnectorConfig) -> Result<Box<dyn Sink>, BuildError> {
        let sinks = self.sinks.lock().unwrap();
        let make = sinks.get(&config.key).ok_or_else(|| unscripted(config))?;
        Ok(make())
    }
}

fn unscripted(config: &ConnectorConfig) -> BuildError {
    BuildError::Registry(RegistryError::Unknown {
        name: config.key.clone(),
        kind: config.kind,
        available: "the scripted connectors".into(),
    })
}

pub fn source_config(key: &str, max_consecutive_nacks: Option<u32>) -> ConnectorConfig {
    config(
        ConnectorKind::Source,
        key,
        KindConfig::Source {
            streams: vec![SourceStream {
                stream: STREAM.into(),
                topic: TOPIC.into(),
                schema: Schema::Json,
                batch_length: DEFAULT_BATCH_LENGTH,
                linger_time: DEFAULT_LINGER_TIME,
                partitions: 1,
            }],
            max_consecutive_nacks,
            max_in_flight: None,
            max_in_flight_bytes: None,
        },
    )
}

pub fn sink_config(key: &str, on_error: OnError) -> ConnectorConfig {
    config(
        ConnectorKind::Sink,
        key,
        KindConfig::Sink {
            streams: vec![SinkStream {
                stream: STREAM.into(),
                topics: vec![TOPIC.into()],
                schema: Schema::Json,
                batch_length: 100,
                poll_interval: Duration::from_millis(1),
                consumer_group: GROUP.into(),
            }],
            on_error,
        },
    )
}

fn config(kind: ConnectorKind, key: &str, kind_config: KindConfig) -> ConnectorConfig {
    ConnectorConfig {
        kind,
        key: key.into(),
        enabled: true,
        version: 0,
        name: key.into(),
        path: "scripted".into(),
        connector: "scripted".into(),
        plugin_config_format: None,
        plugin_config: serde_json::json!({}),
        verbose: false,
        benchmark: false,
        transforms: Vec::new(),
        dead_letter: None,
        kind_config,
        file: None,
    }
}
