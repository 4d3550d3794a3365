//! Everything the server keeps: streams, topics, partitions, consumer
//! groups, consumer offsets, sessions and request counters.
//!
//! Ids follow the real server: stream ids are global and 0-based (never
//! reused, and this server never deletes, so a stream's id is its index);
//! topic, partition and group ids are 0-based within their parent.

use super::ServerConfig;
use super::groups::Group;
use super::log::Log;
use iggy_binary_protocol::primitives::options::WireOptions;
use iggy_binary_protocol::responses::streams::StreamResponse;
use iggy_binary_protocol::responses::streams::get_stream::{GetStreamResponse, TopicHeader};
use iggy_binary_protocol::responses::topics::get_topic::{GetTopicResponse, PartitionResponse};
use iggy_binary_protocol::{WireIdentifier, WireName};
use std::collections::HashMap;
use std::time::{SystemTime, UNIX_EPOCH};

/// Topic defaults of the real server: no expiry, no size limit, no
/// compression (algorithm 1 is "none").
const NEVER_EXPIRE: u64 = u64::MAX;
const UNLIMITED_SIZE: u64 = u64::MAX;
const COMPRESSION_NONE: u8 = 1;

pub(crate) fn now_micros() -> u64 {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("the clock is after 1970");
    u64::try_from(since_epoch.as_micros()).expect("microseconds fit in u64 until year 586912")
}

fn matches(identifier: &WireIdentifier, id: u32, name: &str) -> bool {
    match identifier {
        WireIdentifier::Numeric(numeric) => *numeric == id,
        WireIdentifier::String(wanted) => wanted.as_str() == name,
    }
}

fn wire_name(name: &str) -> WireName {
    WireName::new(name).expect("names were validated when created")
}

fn to_u32(value: usize) -> u32 {
    u32::try_from(value).expect("collection sizes fit in u32")
}

/// Which part of a `stream/topic` path was missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Missing {
    Stream,
    Topic,
}

/// The key of a standalone consumer's offsets (groups keep theirs).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ConsumerKey {
    Numeric(u32),
    Named(String),
}

impl From<&WireIdentifier> for ConsumerKey {
    fn from(identifier: &WireIdentifier) -> Self {
        match identifier {
            WireIdentifier::Numeric(id) => Self::Numeric(*id),
            WireIdentifier::String(name) => Self::Named(name.as_str().to_owned()),
        }
    }
}

pub(crate) struct Partition {
    pub(crate) id: u32,
    pub(crate) created_at: u64,
    pub(crate) log: Log,
    /// Per-partition op counter stamped on partition-op replies.
    op: u64,
}

impl Partition {
    pub(crate) fn next_op(&mut self) -> u64 {
        self.op += 1;
        self.op
    }

    fn response(&self) -> PartitionResponse {
        PartitionResponse {
            id: self.id,
            created_at: self.created_at,
            segments_count: 1,
            current_offset: self.log.current_offset(),
            size_bytes: self.log.size_bytes(),
            messages_count: self.log.messages_count(),
        }
    }
}

pub(crate) struct Topic {
    pub(crate) stream_id: u32,
    pub(crate) id: u32,
    pub(crate) name: String,
    created_at: u64,
    pub(crate) partitions: Vec<Partition>,
    pub(crate) groups: Vec<Group>,
    /// Group ids are never reused, so a recreated group starts without the
    /// deleted one's offsets (as on the real server).
    next_group_id: u32,
    /// The options the topic was created with (key, value as text).
    pub(crate) options: Vec<(String, String)>,
    pub(crate) consumer_offsets: HashMap<(ConsumerKey, u32), u64>,
}

impl Topic {
    pub(crate) fn group_index(&self, identifier: &WireIdentifier) -> Option<usize> {
        self.groups
            .iter()
            .position(|group| matches(identifier, group.id, &group.name))
    }

    pub(crate) fn group_by_name(&self, name: &str) -> Option<&Group> {
        self.groups.iter().find(|group| group.name == name)
    }

    /// Appends `count` partitions; every group rebalances to take them in,
    /// as the real server reassigns its groups on a partition-count change.
    pub(crate) fn add_partitions(&mut self, count: u32) {
        let created_at = now_micros();
        let first = to_u32(self.partitions.len());
        self.partitions
            .extend((first..first + count).map(|id| Partition {
                id,
                created_at,
                log: Log::default(),
                op: 0,
            }));
        for group in &mut self.groups {
            group.add_partitions(count as usize);
        }
    }

    pub(crate) fn create_group(&mut self, name: &str) -> &mut Group {
        let id = self.next_group_id;
        self.next_group_id += 1;
        self.groups
            .push(Group::new(id, name.to_owned(), self.partitions.len()));
        self.groups.last_mut().expect("just pushed")
    }

    pub(crate) fn messages_count(&self) -> u64 {
        self.partitions.iter().map(|p| p.log.messages_count()).sum()
    }

    fn size_bytes(&self) -> u64 {
        self.partitions.iter().map(|p| p.log.size_bytes()).sum()
    }

    pub(crate) fn header(&self) -> TopicHeader {
        TopicHeader {
            id: self.id,
            created_at: self.created_at,
            partitions_count: to_u32(self.partitions.len()),
            message_expiry: NEVER_EXPIRE,
            compression_algorithm: COMPRESSION_NONE,
            max_topic_size: UNLIMITED_SIZE,
            size_bytes: self.size_bytes(),
            messages_count: self.messages_count(),
            name: wire_name(&self.name),
            options: WireOptions::empty(),
            derived_options: WireOptions::empty(),
        }
    }

    pub(crate) fn response(&self) -> GetTopicResponse {
        GetTopicResponse {
            topic: self.header(),
            partitions: self.partitions.iter().map(Partition::response).collect(),
        }
    }
}

pub(crate) struct Stream {
    pub(crate) id: u32,
    pub(crate) name: String,
    created_at: u64,
    pub(crate) topics: Vec<Topic>,
}

impl Stream {
    pub(crate) fn topic_index(&self, identifier: &WireIdentifier) -> Option<usize> {
        self.topics
            .iter()
            .position(|topic| matches(identifier, topic.id, &topic.name))
    }

    pub(crate) fn topic_by_name(&self, name: &str) -> Option<&Topic> {
        self.topics.iter().find(|topic| topic.name == name)
    }

    pub(crate) fn create_topic(&mut self, name: &str, partitions: u32) -> &mut Topic {
        let created_at = now_micros();
        let id = to_u32(self.topics.len());
        self.topics.push(Topic {
            stream_id: self.id,
            id,
            name: name.to_owned(),
            created_at,
            partitions: (0..partitions)
                .map(|id| Partition {
                    id,
                    created_at,
                    log: Log::default(),
                    op: 0,
                })
                .collect(),
            groups: Vec::new(),
            next_group_id: 0,
            options: Vec::new(),
            consumer_offsets: HashMap::new(),
        });
        self.topics.last_mut().expect("just pushed")
    }

    pub(crate) fn response(&self) -> StreamResponse {
        StreamResponse {
            id: self.id,
            created_at: self.created_at,
            topics_count: to_u32(self.topics.len()),
            size_bytes: self.topics.iter().map(Topic::size_bytes).sum(),
            messages_count: self.topics.iter().map(Topic::messages_count).sum(),
            name: wire_name(&self.name),
            options: WireOptions::empty(),
        }
    }

    pub(crate) fn details(&self) -> GetStreamResponse {
        GetStreamResponse {
            stream: self.response(),
            topics: self.topics.iter().map(Topic::header).collect(),
        }
    }
}

pub(crate) struct State {
    pub(crate) config: ServerConfig,
    /// The TCP port advertised in cluster metadata.
    pub(crate) port: u16,
    pub(crate) streams: Vec<Stream>,
    metadata_op: u64,
    request_counts: HashMap<u32, u64>,
    /// Open connections per bound client id.
    clients: HashMap<u128, usize>,
    pub(crate) open_connections: usize,
    /// Set while a restart closes the connections: their clients stay group
    /// members (see [`State::release_client`]).
    pub(crate) restarting: bool,
}

impl State {
    pub(crate) fn new(config: ServerConfig, port: u16) -> Self {
        Self {
            config,
            port,
            streams: Vec::new(),
            metadata_op: 0,
            request_counts: HashMap::new(),
            clients: HashMap::new(),
            open_connections: 0,
            restarting: false,
        }
    }

    /// Consumes a metadata op (every metadata write, rejected or not, and
    /// every login does on the real server).
    pub(crate) fn next_metadata_op(&mut self) -> u64 {
        self.metadata_op += 1;
        self.metadata_op
    }

    pub(crate) fn metadata_commit(&self) -> u64 {
        self.metadata_op
    }

    pub(crate) fn count_request(&mut self, code: u32) {
        *self.request_counts.entry(code).or_default() += 1;
    }

    pub(crate) fn request_count(&self, code: u32) -> u64 {
        self.request_counts.get(&code).copied().unwrap_or_default()
    }

    pub(crate) fn stream_index(&self, identifier: &WireIdentifier) -> Option<usize> {
        self.streams
            .iter()
            .position(|stream| matches(identifier, stream.id, &stream.name))
    }

    pub(crate) fn stream(&self, identifier: &WireIdentifier) -> Option<&Stream> {
        self.stream_index(identifier)
            .map(|index| &self.streams[index])
    }

    pub(crate) fn topic(
        &self,
        stream: &WireIdentifier,
        topic: &WireIdentifier,
    ) -> Result<&Topic, Missing> {
        let stream = self.stream(stream).ok_or(Missing::Stream)?;
        let index = stream.topic_index(topic).ok_or(Missing::Topic)?;
        Ok(&stream.topics[index])
    }

    pub(crate) fn topic_mut(
        &mut self,
        stream: &WireIdentifier,
        topic: &WireIdentifier,
    ) -> Result<&mut Topic, Missing> {
        let stream_index = self.stream_index(stream).ok_or(Missing::Stream)?;
        let stream = &mut self.streams[stream_index];
        let index = stream.topic_index(topic).ok_or(Missing::Topic)?;
        Ok(&mut stream.topics[index])
    }

    pub(crate) fn stream_by_name(&self, name: &str) -> Option<&Stream> {
        self.streams.iter().find(|stream| stream.name == name)
    }

    pub(crate) fn topic_by_names(&self, stream: &str, topic: &str) -> Option<&Topic> {
        self.stream_by_name(stream)?.topic_by_name(topic)
    }

    pub(crate) fn create_stream(&mut self, name: &str) -> &mut Stream {
        let id = to_u32(self.streams.len());
        self.streams.push(Stream {
            id,
            name: name.to_owned(),
            created_at: now_micros(),
            topics: Vec::new(),
        });
        self.streams.last_mut().expect("just pushed")
    }

    /// A connection signed in as `client`.
    pub(crate) fn bind_client(&mut self, client: u128) {
        *self.clients.entry(client).or_default() += 1;
    }

    /// A connection bound to `client` went away. When it was the client's
    /// last connection, the client leaves every group it had joined, which
    /// is how a disconnect frees its partitions for the other members.
    ///
    /// Not during a restart: the real server journals every join but removes
    /// a disconnected member through a `Logout` it commits after the
    /// connection closed, which a stopping server never commits. Replaying the
    /// journal at start brings the member back, bound to a session no client
    /// will present again (the client signs in with a new id), and nothing
    /// ever evicts it (the heartbeat check only looks at open connections).
    /// Such a ghost keeps its partitions until the group is deleted.
    pub(crate) fn release_client(&mut self, client: u128) {
        let Some(count) = self.clients.get_mut(&client) else {
            return;
        };
        *count -= 1;
        if *count > 0 {
            return;
        }
        self.clients.remove(&client);
        if !self.restarting {
            self.remove_memberships(client);
        }
    }

    /// Drops `client` from every group (logout, disconnect).
    pub(crate) fn remove_memberships(&mut self, client: u128) {
        for stream in &mut self.streams {
            for topic in &mut stream.topics {
                for group in &mut topic.groups {
                    group.leave(client);
                }
            }
        }
    }
}
