//! `iggy` source: replicates topics of another Iggy cluster into ours.
//!
//! One consumer-group member per remote topic (the engine's own Iggy
//! consumer, on its own connection to the remote cluster) polls with the
//! `next` strategy and never auto-commits. Each member runs in a task that
//! hands one batch at a time to `poll` and then waits: the remote group's
//! offset of that batch is stored only in `commit`, that is once our cluster
//! acknowledged every message and the engine saved the state. A store that
//! fails (a remote restart can leave the member without its partition until
//! it joins again) leaves the batch to be polled again; so does a batch never
//! committed (a NACK the engine gave up on, a stop, a crash): duplicates of
//! that batch, never loss. A failed remote poll reaches the engine as a
//! transient `poll` error; the member polls again only once the engine took
//! that error (the inbox is bounded by the member count), so the engine's
//! backoff paces it.
//!
//! Message ids, user headers and origin timestamps are kept, so a consumer
//! that deduplicates by id sees each remote message once. With `partitioning
//! = "remote"` (the default) a message goes to the target partition with its
//! remote partition's id (modulo the target's partition count), so every
//! remote partition's order holds; `"balanced"` spreads them instead.
//! Partitions added to a remote topic are read too: the server reassigns the
//! group and the client re-syncs its assignment on its heartbeat.
//!
//! `max_in_flight` is 1: the group's `next` position moves only when an
//! offset is stored, so a second batch polled before the first is committed
//! would read the same messages again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use secrecy::SecretString;
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tracing::warn;

use crate::config::runtime::{IggyConfig, IggyTlsConfig};
use crate::connectors::{
    ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch, SourceEntry,
    decode_state, encode_state, parse_plugin_config, schema_of,
};
use crate::iggy::settings::SettingsError;
use crate::iggy::{
    Bus, BusError, ConnectionSettings, ConsumedBatch, Consumer, ConsumerSpec, IggyBus,
};
use crate::message::{Payload, SourceRecord};

pub const ENTRY: SourceEntry = SourceEntry {
    name: "iggy",
    feature: "iggy-source",
    description: "replicates topics of another Iggy cluster into ours (consumer group, at-least-once)",
    secret_fields: &["password", "token"],
    // Both secrets shown (the token, when set, wins), each holding "secret"
    // as the redaction tests expect of a sample.
    sample_config: "address = \"127.0.0.1:8090\"\nusername = \"iggy\"\npassword = \"secret\"\ntoken = \"secret-personal-access-token\"\ntopics = [\"orders/created\"]\nconsumer_group = \"iggy-connect-replicator\"\n",
    config_schema: schema_of::<IggySourceConfig>,
    build: |config| Ok(Box::new(IggySource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// Where the remote cluster is and what to read from it.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IggySourceConfig {
    /// The remote cluster's TCP address (`host:port`).
    pub address: String,
    /// Remote user (with `password`); ignored when `token` is set.
    #[serde(default = "default_username")]
    pub username: String,
    /// Remote user's password; a secret.
    #[serde(default = "default_password")]
    #[schemars(with = "String")]
    pub password: SecretString,
    /// A personal access token of the remote cluster, or `file:<path>`; a
    /// secret. Takes precedence over username and password.
    #[serde(default)]
    #[schemars(with = "String")]
    pub token: SecretString,
    /// TLS to the remote cluster, as in the `[iggy]` section.
    #[serde(default)]
    pub tls: TlsConfig,
    /// Remote topics to replicate, each `"stream/topic"`.
    pub topics: Vec<String>,
    /// Target names on our cluster: `"stream" = "new_stream"` renames a remote
    /// stream, `"stream/topic" = "new_stream/new_topic"` one topic (it wins over
    /// its stream's entry). Unnamed topics keep their names. Each target must
    /// be a `[[streams]]` entry of this connector.
    #[serde(default)]
    pub rename: BTreeMap<String, String>,
    /// The consumer group on the remote cluster (created when missing); its
    /// stored offsets are the replication position.
    #[serde(default = "default_consumer_group")]
    pub consumer_group: String,
    /// Most messages per remote poll (and per batch).
    #[serde(default = "default_batch_length")]
    pub batch_length: u32,
    /// Wait after a remote poll that found nothing.
    #[serde(default = "default_poll_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub poll_interval: Duration,
    /// Messages behind on the remote and no offset stored for this long: the
    /// source reports itself degraded (and rebuilds a group held by members
    /// that never commit, as sinks do).
    #[serde(default = "default_stall_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub stall_timeout: Duration,
    /// `remote`: each message goes to the target partition with its remote
    /// partition's id (modulo the target topic's partition count: give it as
    /// many partitions to keep them one to one), so a remote partition's
    /// order holds; `balanced`: the target topic's balanced partitioning.
    #[serde(default)]
    pub partitioning: PartitionMapping,
}

/// Where replicated messages go on our cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum PartitionMapping {
    #[default]
    Remote,
    Balanced,
}

/// TLS to the remote cluster.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// Connect to the remote cluster over TLS.
    #[serde(default)]
    pub enabled: bool,
    /// PEM file of the CA that signed the remote's certificate (required with TLS).
    #[serde(default)]
    pub ca_file: Option<std::path::PathBuf>,
    /// Server name to verify; empty uses the host of `address`.
    #[serde(default)]
    pub domain: String,
}

fn default_username() -> String {
    "iggy".into()
}

fn default_password() -> SecretString {
    SecretString::from("iggy")
}

fn default_consumer_group() -> String {
    "iggy-connect-replicator".into()
}

fn default_batch_length() -> u32 {
    1000
}

fn default_poll_interval() -> Duration {
    Duration::from_millis(10)
}

fn default_stall_timeout() -> Duration {
    Duration::from_secs(60)
}

/// What the source saves: the remote offsets it committed, per `stream/topic`
/// and partition. Informational (the remote group's stored offsets are the
/// position); a state that cannot be decoded still stops the start.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IggySourceState {
    pub offsets: BTreeMap<String, BTreeMap<u32, u64>>,
}

/// A remote topic and the `[[streams]]` entry its messages go to.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Route {
    stream: String,
    topic: String,
    /// `stream/topic` on our cluster.
    target: (String, String),
}

impl Route {
    fn remote(&self) -> String {
        format!("{}/{}", self.stream, self.topic)
    }
}

/// A batch a member handed out, and how to tell it to store its offset.
struct Fetched {
    route: usize,
    batch: ConsumedBatch,
    commits: mpsc::Sender<oneshot::Sender<Result<(), BusError>>>,
}

struct Staged {
    remote: String,
    partition_id: u32,
    offset: u64,
    commits: mpsc::Sender<oneshot::Sender<Result<(), BusError>>>,
}

pub struct IggySource {
    config: IggySourceConfig,
    settings: ConnectionSettings,
    routes: Vec<Route>,
    context: ConnectorContext,
    /// Every route's target's `[[streams]]` index, resolved in `open`.
    stream_index: Vec<usize>,
    inbox: Option<tokio::sync::Mutex<mpsc::Receiver<Result<Fetched, String>>>>,
    staged: Mutex<Option<Staged>>,
    committed: Mutex<IggySourceState>,
    stop: Option<watch::Sender<()>>,
    members: Vec<JoinHandle<()>>,
}

impl IggySource {
    pub fn new(config: IggySourceConfig) -> Result<Self, PluginConfigError> {
        if config.topics.is_empty() {
            return Err(PluginConfigError::new(
                "topics",
                "expected at least one remote topic as \"stream/topic\"",
            ));
        }
        let mut routes = Vec::new();
        for (index, name) in config.topics.iter().enumerate() {
            let (stream, topic) = split_name(name).ok_or_else(|| {
                PluginConfigError::new(
                    format!("topics[{index}]"),
                    format!("expected \"stream/topic\", found {name:?}"),
                )
            })?;
            let target = match config.rename.get(name.as_str()) {
                Some(renamed) => split_name(renamed).ok_or_else(|| {
                    PluginConfigError::new(
                        format!("rename.\"{name}\""),
                        format!("a topic is renamed to \"stream/topic\", found {renamed:?}"),
                    )
                })?,
                None => match config.rename.get(stream) {
                    Some(renamed) if renamed.is_empty() || renamed.contains('/') => {
                        return Err(PluginConfigError::new(
                            format!("rename.{stream}"),
                            format!("a stream is renamed to a stream name, found {renamed:?}"),
                        ));
                    }
                    Some(renamed) => (renamed.as_str(), topic),
                    None => (stream, topic),
                },
            };
            routes.push(Route {
                stream: stream.to_owned(),
                topic: topic.to_owned(),
                target: (target.0.to_owned(), target.1.to_owned()),
            });
        }
        if config.consumer_group.is_empty() {
            return Err(PluginConfigError::new(
                "consumer_group",
                "expected a consumer group name",
            ));
        }
        let iggy = IggyConfig {
            address: config.address.clone(),
            username: config.username.clone(),
            password: config.password.clone(),
            token: config.token.clone(),
            tls: IggyTlsConfig {
                enabled: config.tls.enabled,
                ca_file: config.tls.ca_file.clone(),
                domain: config.tls.domain.clone(),
            },
            sink_stall_timeout: config.stall_timeout,
            ..IggyConfig::default()
        };
        let settings = ConnectionSettings::from_config(&iggy).map_err(settings_error)?;
        Ok(Self {
            config,
            settings,
            routes,
            context: ConnectorContext::default(),
            stream_index: Vec::new(),
            inbox: None,
            staged: Mutex::new(None),
            committed: Mutex::new(IggySourceState::default()),
            stop: None,
            members: Vec::new(),
        })
    }

    /// Which `[[streams]]` entry each route goes to. Outside the engine (no
    /// streams known) everything goes to the first.
    fn resolve_streams(&self) -> Result<Vec<usize>, ConnectorError> {
        if self.context.streams.is_empty() {
            return Ok(vec![0; self.routes.len()]);
        }
        self.routes
            .iter()
            .map(|route| {
                let (stream, topic) = &route.target;
                self.context
                    .streams
                    .iter()
                    .position(|entry| &entry.stream == stream && &entry.topic == topic)
                    .ok_or_else(|| {
                        ConnectorError::fatal(format!(
                            "plugin_config.topics: remote topic {} goes to {stream}/{topic} \
                             (after rename), but no [[streams]] entry has stream = \"{stream}\" \
                             and topic = \"{topic}\"; add one or fix rename",
                            route.remote()
                        ))
                    })
            })
            .collect()
    }

    fn spec(&self, route: &Route) -> ConsumerSpec {
        ConsumerSpec {
            stream: route.stream.clone(),
            topic: route.topic.clone(),
            group: self.config.consumer_group.clone(),
            batch_length: self.config.batch_length.max(1),
            poll_interval: self.config.poll_interval,
            connector_key: self.context.key.clone(),
            degraded: self.context.degraded.clone(),
            lag: Default::default(),
        }
    }
}

fn split_name(name: &str) -> Option<(&str, &str)> {
    let (stream, topic) = name.split_once('/')?;
    (!stream.is_empty() && !topic.is_empty() && !topic.contains('/')).then_some((stream, topic))
}

/// The `[iggy]`-section error, with this connector's field names.
fn settings_error(error: SettingsError) -> PluginConfigError {
    let field = match &error {
        SettingsError::TokenFile { .. } | SettingsError::EmptyTokenFile { .. } => "token",
        SettingsError::MissingCredentials => "password",
        SettingsError::MissingTlsCaFile | SettingsError::TlsCaFile { .. } => "tls.ca_file",
        SettingsError::TlsDomain { .. } => "tls.domain",
    };
    PluginConfigError::new(field, error.to_string().replace("iggy.", ""))
}

/// Whether a failed connect can never succeed by retrying (bad credentials).
fn is_fatal(error: &BusError) -> bool {
    let text = error.to_string().to_lowercase();
    text.contains("invalid credentials") || text.contains("invalid personal access token")
}

#[async_trait]
impl Source for IggySource {
    fn attach(&mut self, context: ConnectorContext) {
        self.context = context;
    }

    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if let Some(state) = state {
            *self
                .committed
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()) = decode_state(state)?;
        }
        self.stream_index = self.resolve_streams()?;
        let bus = IggyBus::new(self.settings.clone());
        let mut consumers = Vec::new();
        for route in &self.routes {
            match bus.consumer(&self.spec(route)).await {
                Ok(consumer) => consumers.push(consumer),
                Err(error) => {
                    for mut opened in consumers {
                        let _ = opened.close().await;
                    }
                    let message = format!(
                        "remote topic {} on {}: {error}",
                        route.remote(),
                        self.config.address
                    );
                    return Err(if is_fatal(&error) {
                        ConnectorError::fatal(format!(
                            "{message}; check plugin_config.username/password or token"
                        ))
                    } else {
                        ConnectorError::transient(message)
                    });
                }
            }
        }
        let (stop, stopped) = watch::channel(());
        let (sender, inbox) = mpsc::channel(self.routes.len());
        for (route, consumer) in consumers.into_iter().enumerate() {
            let member = Member {
                route,
                name: self.routes[route].remote(),
                consumer,
                inbox: sender.clone(),
                stopped: stopped.clone(),
            };
            self.members.push(tokio::spawn(member.run()));
        }
        self.stop = Some(stop);
        self.inbox = Some(tokio::sync::Mutex::new(inbox));
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let inbox = self
            .inbox
            .as_ref()
            .ok_or_else(|| ConnectorError::fatal("the iggy source was polled before open"))?;
        // Cancel-safe: a batch is taken from the channel only when it is
        // returned below.
        let fetched = inbox
            .lock()
            .await
            .recv()
            .await
            .ok_or_else(|| ConnectorError::fatal("every remote consumer stopped"))?
            .map_err(ConnectorError::transient)?;
        let Fetched {
            route,
            batch,
            commits,
        } = fetched;
        let remote = self.routes[route].remote();
        let stream_index = self.stream_index[route];
        let partition_id = batch.partition_id;
        let Some(offset) = batch.last_offset() else {
            return Ok(SourceBatch::default());
        };
        let partition =
            (self.config.partitioning == PartitionMapping::Remote).then_some(partition_id);
        let records = batch
            .messages
            .into_iter()
            .map(|message| SourceRecord {
                id: Some(message.id),
                stream_index,
                headers: message.headers,
                payload: Payload::Raw(message.payload),
                partition,
                origin_timestamp: Some(message.origin_timestamp),
            })
            .collect();
        let mut state = self
            .committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone();
        state
            .offsets
            .entry(remote.clone())
            .or_default()
            .insert(partition_id, offset);
        *self
            .staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(Staged {
            remote,
            partition_id,
            offset,
            commits,
        });
        Ok(SourceBatch {
            records,
            state: Some(encode_state(&state)?),
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let (commits, remote, partition_id, offset) = {
            let staged = self
                .staged
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let Some(staged) = staged.as_ref() else {
                return Ok(());
            };
            (
                staged.commits.clone(),
                staged.remote.clone(),
                staged.partition_id,
                staged.offset,
            )
        };
        let (reply, stored) = oneshot::channel();
        commits
            .send(reply)
            .await
            .map_err(|_| ConnectorError::transient("the remote consumer stopped"))?;
        let stored = stored
            .await
            .map_err(|_| ConnectorError::transient("the remote consumer stopped"))?;
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Err(error) = stored {
            // The batch is on our cluster: not storing its remote offset
            // only means it is polled again (duplicates, never loss).
            warn!(remote = %remote, partition_id, offset, %error, "cannot store the remote offset; the batch will be replicated again");
            return Ok(());
        }
        self.committed
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .offsets
            .entry(remote)
            .or_default()
            .insert(partition_id, offset);
        Ok(())
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        self.staged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        self.stop.take();
        self.inbox.take();
        for member in self.members.drain(..) {
            let _ = member.await;
        }
        Ok(())
    }
}

/// One remote topic's consumer-group member.
struct Member {
    route: usize,
    name: String,
    consumer: Box<dyn Consumer>,
    inbox: mpsc::Sender<Result<Fetched, String>>,
    stopped: watch::Receiver<()>,
}

impl Member {
    async fn run(mut self) {
        loop {
            let polled = tokio::select! {
                _ = self.stopped.changed() => break,
                polled = self.consumer.poll() => polled,
            };
            let batch = match polled {
                Ok(batch) => batch,
                Err(error) => {
                    let message = format!("remote topic {}: {error}", self.name);
                    let reported = tokio::select! {
                        _ = self.stopped.changed() => break,
                        sent = self.inbox.send(Err(message)) => sent,
                    };
                    if reported.is_err() {
                        break;
                    }
                    continue;
                }
            };
            let (partition_id, Some(offset)) = (batch.partition_id, batch.last_offset()) else {
                continue;
            };
            let (commits, mut requests) = mpsc::channel(1);
            let fetched = Fetched {
                route: self.route,
                batch,
                commits,
            };
            if self.inbox.send(Ok(fetched)).await.is_err() {
                break;
            }
            // Until the batch is committed (its offset stored) or forgotten
            // (the source dropped it: the next poll reads it again).
            let request = tokio::select! {
                _ = self.stopped.changed() => break,
                request = requests.recv() => request,
            };
            if let Some(reply) = request {
                // Once: a failed store only means the batch is polled again.
                let _ = reply.send(self.consumer.commit(partition_id, offset).await);
            }
        }
        let _ = self.consumer.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn build(config: serde_json::Value) -> Result<IggySource, PluginConfigError> {
        IggySource::new(parse_plugin_config(&config)?)
    }

    #[test]
    fn given_rename_when_built_should_map_topic_over_stream_names() {
        let source = build(json!({
            "address": "127.0.0.1:1",
            "topics": ["a/x", "a/y", "b/z"],
            "rename": {"a": "dr_a", "a/y": "other/why"},
        }))
        .unwrap();
        let targets: Vec<_> = source.routes.iter().map(|r| r.target.clone()).collect();
        assert_eq!(
            targets,
            [
                ("dr_a".to_owned(), "x".to_owned()),
                ("other".to_owned(), "why".to_owned()),
                ("b".to_owned(), "z".to_owned()),
            ]
        );
    }

    #[test]
    fn given_bad_names_when_built_should_name_the_field() {
        let error = build(json!({"address": "h:1", "topics": ["nostream"]}))
            .err()
            .unwrap();
        assert_eq!(error.field, "topics[0]");
        let error = build(json!({"address": "h:1", "topics": ["a/b"], "rename": {"a/b": "c"}}))
            .err()
            .unwrap();
        assert_eq!(error.field, "rename.\"a/b\"");
        let error = build(json!({"address": "h:1", "topics": []}))
            .err()
            .unwrap();
        assert_eq!(error.field, "topics");
        let error = build(json!({"address": "h:1", "topics": ["a/b"], "tls": {"enabled": true}}))
            .err()
            .unwrap();
        assert_eq!(error.field, "tls.ca_file");
    }
}
