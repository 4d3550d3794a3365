//! In-memory reference connectors for the self-tests: a correct source and
//! sink, and each with one deliberate flaw that one check must catch.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use iggy_connect::connectors::{
    ConnectorError, PluginConfigError, Rejection, Sink, SinkError, Source, SourceBatch,
    decode_state, encode_state,
};
use iggy_connect::message::{Payload, SinkMessage, SourceRecord, TopicRef};
use serde_json::{Value, json};

use crate::sink::{SinkBackend, SinkSubject, payload_key, poison_json};
use crate::source::{PollWait, Release, SourceBackend, SourceSubject};
use crate::{Outcome, ensure, unique};

/// What a reference source gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceFlaw {
    None,
    /// A fresh start skips the first item.
    SkipsFirstItem,
    /// `open` ignores the stored state and starts from the beginning.
    IgnoresState,
    /// A state it cannot decode is taken as a fresh start.
    AcceptsCorruptState,
    /// Each batch carries the state from before it (one batch behind).
    StaleState,
    /// `poll` consumes (deletes) what it returns.
    DeletesInPoll,
    /// `poll` moves its cursor before it waits, so a dropped poll skips items.
    AdvancesBeforeWaiting,
    /// `open` fails for good while the backend cannot be reached.
    FatalOpenWhileDown,
    /// (Over HTTP) takes a request that failed on the way as fatal.
    FatalWhenCut,
}

/// What a reference sink gets wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkFlaw {
    None,
    /// `write` returns `Ok` without writing.
    OkWithoutWriting,
    /// Claims idempotence but appends every copy.
    Duplicates,
    /// Reports a refused message one index too far (out of range at the end).
    RejectsOutOfRange,
    /// Refuses a message but stores it anyway.
    StoresRejected,
    /// Returns `Ok` while the backend is down (without writing).
    OkWhileDown,
    /// `open` fails for good while the backend cannot be reached.
    FatalOpenWhileDown,
    /// Answers a poisoned batch per message, calling durable one it did not
    /// store.
    ClaimsUnwrittenDurable,
    /// (Over HTTP) takes a request that failed on the way as written.
    OkWhenCut,
    /// (Over HTTP) answers a 429 as transient without its `Retry-After`.
    DropsRetryAfter,
}

pub fn source(flaw: SourceFlaw) -> SourceSubject {
    SourceSubject {
        name: "memory",
        build: Arc::new(
            move |config: &Value| -> Result<Box<dyn Source>, PluginConfigError> {
                Ok(Box::new(MemorySource {
                    reachable: config["address"] == "127.0.0.1:7",
                    queue: Queue::find(config)?,
                    flaw,
                    cursor: AtomicUsize::new(0),
                    staged: Mutex::new(None),
                }))
            },
        ),
    }
}

pub fn sink(flaw: SinkFlaw) -> SinkSubject {
    SinkSubject {
        name: "memory",
        build: Arc::new(
            move |config: &Value| -> Result<Box<dyn Sink>, PluginConfigError> {
                Ok(Box::new(MemorySink {
                    store: Store::find(config)?,
                    address: config["address"].as_str().unwrap_or_default().to_owned(),
                    flaw,
                }))
            },
        ),
    }
}

/// The input of a reference source: items with a consumed flag, and whether
/// it is held busy (a poll waits until it is not).
#[derive(Default)]
pub struct Queue {
    id: String,
    items: Mutex<Vec<(String, bool)>>,
    held: tokio::sync::watch::Sender<bool>,
}

impl Queue {
    pub fn new() -> Arc<Self> {
        let queue = Arc::new(Self {
            id: unique("queue"),
            ..Self::default()
        });
        queues()
            .lock()
            .unwrap()
            .insert(queue.id.clone(), queue.clone());
        queue
    }

    fn find(config: &Value) -> Result<Arc<Self>, PluginConfigError> {
        let id = config["queue"].as_str().unwrap_or_default();
        queues()
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| PluginConfigError::new("queue", "no such queue"))
    }
}

fn queues() -> &'static Mutex<HashMap<String, Arc<Queue>>> {
    static QUEUES: OnceLock<Mutex<HashMap<String, Arc<Queue>>>> = OnceLock::new();
    QUEUES.get_or_init(Mutex::default)
}

#[async_trait]
impl SourceBackend for Arc<Queue> {
    fn plugin_config(&self) -> Value {
        json!({"queue": self.id, "address": "127.0.0.1:7"})
    }

    /// Reached in memory: its address is make-believe, with no connection
    /// to cut.
    fn dials_out(&self) -> bool {
        false
    }

    fn poll_wait(&self) -> PollWait {
        PollWait::WhileHeld
    }

    async fn hold(&self) -> Option<Release> {
        self.held.send_replace(true);
        let queue = self.clone();
        Some(Box::pin(async move {
            queue.held.send_replace(false);
        }))
    }

    async fn feed(&self, count: usize) -> Vec<String> {
        let mut items = self.items.lock().unwrap();
        let first = items.len();
        let keys: Vec<String> = (first..first + count)
            .map(|n| format!("item-{n}"))
            .collect();
        items.extend(keys.iter().map(|key| (key.clone(), false)));
        keys
    }

    fn key(&self, payload: &[u8]) -> String {
        let value: Value = serde_json::from_slice(payload).unwrap_or_default();
        value["key"].as_str().unwrap_or_default().to_owned()
    }

    async fn untouched(&self, fed: &[String]) -> Outcome {
        let items = self.items.lock().unwrap();
        let consumed: Vec<&String> = items
            .iter()
            .filter(|(key, consumed)| *consumed && fed.contains(key))
            .map(|(key, _)| key)
            .collect();
        ensure!(consumed.is_empty(), "consumed before commit: {consumed:?}");
        Ok(())
    }
}

struct MemorySource {
    /// Whether its config points at the queue's address.
    reachable: bool,
    queue: Arc<Queue>,
    flaw: SourceFlaw,
    /// Index of the next item (the committed position).
    cursor: AtomicUsize,
    /// Where the batch in flight ends.
    staged: Mutex<Option<usize>>,
}

#[async_trait]
impl Source for MemorySource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if !self.reachable {
            let refused = "connecting to the queue: connection refused";
            return Err(match self.flaw {
                SourceFlaw::FatalOpenWhileDown => ConnectorError::fatal(refused),
                _ => ConnectorError::transient(refused),
            });
        }
        let start = match (state, self.flaw) {
            (_, SourceFlaw::IgnoresState) | (None, _) => 0,
            (Some(bytes), SourceFlaw::AcceptsCorruptState) => decode_state(bytes).unwrap_or(0),
            (Some(bytes), _) => decode_state(bytes)?,
        };
        let start = match (state, self.flaw) {
            (None, SourceFlaw::SkipsFirstItem) => 1,
            _ => start,
        };
        self.cursor.store(start, Ordering::SeqCst);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let available = self.queue.items.lock().unwrap().len();
        let start = if self.flaw == SourceFlaw::AdvancesBeforeWaiting {
            self.cursor.swap(available, Ordering::SeqCst)
        } else {
            self.cursor.load(Ordering::SeqCst)
        };
        // Waits while the queue is held busy.
        let _ = self.queue.held.subscribe().wait_for(|held| !*held).await;
        let mut items = self.queue.items.lock().unwrap();
        let end = items.len();
        if self.flaw == SourceFlaw::DeletesInPoll {
            items[start..end].iter_mut().for_each(|item| item.1 = true);
        }
        let records: Vec<SourceRecord> = items[start..end]
            .iter()
            .map(|(key, _)| SourceRecord::new(Payload::Json(json!({"key": key}))))
            .collect();
        drop(items);
        *self.staged.lock().unwrap() = Some(end);
        let caught_up = records.is_empty();
        let state = match self.flaw {
            // Saves where its batch began; a caught-up poll saves nothing,
            // so an empty batch after the items cannot put it right by
            // chance (its start is the items' end).
            SourceFlaw::StaleState if caught_up => None,
            SourceFlaw::StaleState => Some(encode_state(&start)?),
            _ => Some(encode_state(&end)?),
        };
        Ok(SourceBatch {
            records,
            state,
            finished: false,
            // Caught up: the engine polls again a little later (rule S8).
            next_poll: caught_up.then(|| tokio::time::Instant::now() + Duration::from_millis(20)),
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(end) = self.staged.lock().unwrap().take() {
            self.cursor.store(end, Ordering::SeqCst);
            let mut items = self.queue.items.lock().unwrap();
            items[..end].iter_mut().for_each(|item| item.1 = true);
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.staged.lock().unwrap().take();
        Ok(())
    }
}

/// The backend of a reference sink: the keys stored, a down flag.
#[derive(Default)]
pub struct Store {
    id: String,
    /// Where the store "listens": a sink configured with another port
    /// cannot reach it.
    port: u16,
    keys: Mutex<Vec<String>>,
    down: AtomicBool,
}

impl Store {
    pub fn new() -> Arc<Self> {
        let store = Arc::new(Self {
            id: unique("store"),
            port: 7,
            ..Self::default()
        });
        stores()
            .lock()
            .unwrap()
            .insert(store.id.clone(), store.clone());
        store
    }

    fn find(config: &Value) -> Result<Arc<Self>, PluginConfigError> {
        let id = config["store"].as_str().unwrap_or_default();
        stores()
            .lock()
            .unwrap()
            .get(id)
            .cloned()
            .ok_or_else(|| PluginConfigError::new("store", "no such store"))
    }
}

fn stores() -> &'static Mutex<HashMap<String, Arc<Store>>> {
    static STORES: OnceLock<Mutex<HashMap<String, Arc<Store>>>> = OnceLock::new();
    STORES.get_or_init(Mutex::default)
}

#[async_trait]
impl SinkBackend for Arc<Store> {
    fn plugin_config(&self) -> Value {
        json!({"store": self.id, "address": format!("127.0.0.1:{}", self.port)})
    }

    fn idempotent(&self) -> bool {
        true
    }

    async fn stored(&self) -> Result<Vec<String>, String> {
        Ok(self.keys.lock().unwrap().clone())
    }

    fn poison(&self, message: &mut SinkMessage) -> bool {
        poison_json(message);
        true
    }

    async fn fault(&self) -> bool {
        self.down.store(true, Ordering::SeqCst);
        true
    }

    async fn heal(&self) {
        self.down.store(false, Ordering::SeqCst);
    }
}

fn message_key(message: &SinkMessage) -> Option<String> {
    match &message.payload {
        Payload::Json(value) => payload_key(value),
        _ => None,
    }
}

struct MemorySink {
    store: Arc<Store>,
    address: String,
    flaw: SinkFlaw,
}

#[async_trait]
impl Sink for MemorySink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        if self.address != format!("127.0.0.1:{}", self.store.port) {
            let refused = format!("connecting to {}: connection refused", self.address);
            if self.flaw == SinkFlaw::FatalOpenWhileDown {
                return Err(ConnectorError::fatal(refused));
            }
            return Err(ConnectorError::transient(refused));
        }
        Ok(())
    }

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        if self.store.down.load(Ordering::SeqCst) {
            if self.flaw == SinkFlaw::OkWhileDown {
                return Ok(());
            }
            return Err(SinkError::transient("the store is down"));
        }
        let mut rejected = Vec::new();
        let mut keys = self.store.keys.lock().unwrap();
        for (index, message) in messages.iter().enumerate() {
            let Payload::Json(value) = &message.payload else {
                continue;
            };
            if value.get("poison").is_some() {
                let index = match self.flaw {
                    SinkFlaw::RejectsOutOfRange => index + messages.len(),
                    _ => index,
                };
                rejected.push(Rejection {
                    index,
                    reason: "poisoned".into(),
                });
                if self.flaw != SinkFlaw::StoresRejected {
                    continue;
                }
            }
            let Some(key) = payload_key(value) else {
                continue;
            };
            let write = match self.flaw {
                SinkFlaw::OkWithoutWriting => false,
                SinkFlaw::Duplicates => true,
                _ => !keys.contains(&key),
            };
            if write {
                keys.push(key);
            }
        }
        if rejected.is_empty() {
            return Ok(());
        }
        // The rest is stored: answer per message, as a bulk API does.
        let refused: Vec<usize> = rejected.iter().map(|rejection| rejection.index).collect();
        let mut durable: Vec<usize> = (0..messages.len())
            .filter(|index| !refused.contains(index))
            .collect();
        if self.flaw == SinkFlaw::ClaimsUnwrittenDurable
            && let Some(first) = durable.first().copied()
        {
            keys.retain(|key| Some(key) != message_key(&messages[first]).as_ref());
        }
        if self.flaw == SinkFlaw::RejectsOutOfRange || self.flaw == SinkFlaw::StoresRejected {
            durable.clear();
            return Err(SinkError::Rejected(rejected));
        }
        Err(SinkError::partial(
            durable,
            rejected,
            SinkError::transient("nothing left"),
        ))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// A reference backend reached over HTTP on loopback: `POST /keys` with a
/// JSON array of keys stores those it does not hold yet.
pub struct WebStore {
    pub url: String,
    keys: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl WebStore {
    pub async fn start() -> Self {
        let keys = Arc::new(Mutex::new(Vec::new()));
        let stored = keys.clone();
        let app = axum::Router::new().route(
            "/keys",
            axum::routing::post(
                move |axum::Json(batch): axum::Json<Vec<String>>| async move {
                    let mut keys = stored.lock().unwrap();
                    for key in batch {
                        if !keys.contains(&key) {
                            keys.push(key);
                        }
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self { url, keys, task }
    }
}

impl Drop for WebStore {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl SinkBackend for WebStore {
    fn plugin_config(&self) -> Value {
        json!({"url": self.url})
    }

    fn idempotent(&self) -> bool {
        true
    }

    async fn stored(&self) -> Result<Vec<String>, String> {
        Ok(self.keys.lock().unwrap().clone())
    }
}

pub fn web_sink(flaw: SinkFlaw) -> SinkSubject {
    SinkSubject {
        name: "web",
        build: Arc::new(
            move |config: &Value| -> Result<Box<dyn Sink>, PluginConfigError> {
                Ok(Box::new(WebSink {
                    url: config["url"].as_str().unwrap_or_default().to_owned(),
                    client: reqwest::Client::new(),
                    flaw,
                }))
            },
        ),
    }
}

/// Sends each batch in one request and classifies the answer.
struct WebSink {
    url: String,
    client: reqwest::Client,
    flaw: SinkFlaw,
}

#[async_trait]
impl Sink for WebSink {
    async fn open(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }

    async fn write(&self, _topic: &TopicRef, messages: &[SinkMessage]) -> Result<(), SinkError> {
        let keys: Vec<String> = messages.iter().filter_map(message_key).collect();
        let sent = self
            .client
            .post(format!("{}/keys", self.url))
            .json(&keys)
            .send()
            .await;
        let answer = match sent {
            Ok(answer) => answer,
            Err(_) if self.flaw == SinkFlaw::OkWhenCut => return Ok(()),
            Err(error) => return Err(SinkError::transient(error)),
        };
        let status = answer.status();
        if status.is_success() {
            return Ok(());
        }
        let retry_after = answer
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|value| value.to_str().ok()?.parse().ok())
            .map(Duration::from_secs)
            .filter(|_| self.flaw != SinkFlaw::DropsRetryAfter);
        let error = format!("the store answered {status}");
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(SinkError::transient_after(error, retry_after));
        }
        Err(SinkError::Fatal(error.into()))
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}

/// A reference source backend reached over HTTP on loopback:
/// `GET /items?from=N` answers the keys from the `N`th on.
pub struct WebQueue {
    pub url: String,
    keys: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

#[derive(serde::Deserialize)]
struct From {
    from: usize,
}

impl WebQueue {
    pub async fn start() -> Self {
        let keys = Arc::new(Mutex::new(Vec::<String>::new()));
        let held = keys.clone();
        let app = axum::Router::new().route(
            "/items",
            axum::routing::get(
                move |axum::extract::Query(From { from }): axum::extract::Query<From>| async move {
                    let keys = held.lock().unwrap();
                    axum::Json(keys.get(from..).unwrap_or_default().to_vec())
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.ok();
        });
        Self { url, keys, task }
    }
}

impl Drop for WebQueue {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[async_trait]
impl SourceBackend for WebQueue {
    fn plugin_config(&self) -> Value {
        json!({"url": self.url})
    }

    async fn feed(&self, count: usize) -> Vec<String> {
        let mut keys = self.keys.lock().unwrap();
        let fed: Vec<String> = (keys.len()..keys.len() + count)
            .map(|n| format!("item-{n}"))
            .collect();
        keys.extend(fed.iter().cloned());
        fed
    }

    fn key(&self, payload: &[u8]) -> String {
        let value: Value = serde_json::from_slice(payload).unwrap_or_default();
        value["key"].as_str().unwrap_or_default().to_owned()
    }

    /// Reading takes nothing away.
    async fn untouched(&self, _fed: &[String]) -> Outcome {
        Ok(())
    }
}

pub fn web_source(flaw: SourceFlaw) -> SourceSubject {
    SourceSubject {
        name: "web",
        build: Arc::new(
            move |config: &Value| -> Result<Box<dyn Source>, PluginConfigError> {
                Ok(Box::new(WebSource {
                    url: config["url"].as_str().unwrap_or_default().to_owned(),
                    client: reqwest::Client::new(),
                    flaw,
                    cursor: AtomicUsize::new(0),
                    staged: Mutex::new(None),
                }))
            },
        ),
    }
}

/// Reads the queue from its committed position, one request per poll.
struct WebSource {
    url: String,
    client: reqwest::Client,
    flaw: SourceFlaw,
    cursor: AtomicUsize,
    staged: Mutex<Option<usize>>,
}

#[async_trait]
impl Source for WebSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        let start = state.map(decode_state).transpose()?.unwrap_or(0);
        self.cursor.store(start, Ordering::SeqCst);
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let start = self.cursor.load(Ordering::SeqCst);
        let answer = self
            .client
            .get(format!("{}/items?from={start}", self.url))
            .send()
            .await
            .and_then(reqwest::Response::error_for_status);
        let keys: Vec<String> = match answer {
            Ok(answer) => answer.json().await.map_err(ConnectorError::transient)?,
            Err(error) if self.flaw == SourceFlaw::FatalWhenCut => {
                return Err(ConnectorError::fatal(error.to_string()));
            }
            Err(error) => return Err(ConnectorError::transient(error.to_string())),
        };
        let end = start + keys.len();
        *self.staged.lock().unwrap() = Some(end);
        Ok(SourceBatch {
            records: keys
                .iter()
                .map(|key| SourceRecord::new(Payload::Json(json!({"key": key}))))
                .collect(),
            state: Some(encode_state(&end)?),
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        if let Some(end) = self.staged.lock().unwrap().take() {
            self.cursor.store(end, Ordering::SeqCst);
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        Ok(())
    }
}
