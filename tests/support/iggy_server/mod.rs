//! An in-process Iggy server speaking the binary (VSR-framed TCP) protocol of
//! the `iggy` 0.11.0 client, for tests and benchmarks that must not depend on
//! a real broker.
//!
//! [`IggyTestServer::start`] binds `127.0.0.1:0` and serves on a dedicated OS
//! thread with its own tokio runtime, so it works the same from synchronous
//! tests, `#[tokio::test]` tests and benchmarks, and keeps serving while a
//! test blocks. Every handle method is synchronous and cheap. Dropping the
//! handle stops the server and closes every connection.
//!
//! With [`ServerConfig::tls`] it serves the same protocol over TLS (rustls,
//! the given certificate and key); faults, restarts and outages work the
//! same on TLS connections.
//!
//! # What it serves
//!
//! | Code | Command | Notes |
//! |---|---|---|
//! | 1 | ping | also before login |
//! | 40 / 45 | login with username/password / with a personal access token | bad credentials get an eviction frame (reason 9, 10 for a token); the client reports `InvalidCredentials` / `InvalidPersonalAccessToken` |
//! | 39 | logout | leaves every group |
//! | 12 | cluster.metadata | exactly one node, so the client stays on its single-node path |
//! | 200 / 202 | stream get / create | |
//! | 300 / 302 | topic get / create | partition count as requested, 0-based ids, real-server defaults; options are recorded ([`IggyTestServer::topic_option`]) and otherwise ignored |
//! | 101 | message.send | frame and batch checksums verified; the batch is stamped (partition, base offset, server timestamp, checksum) and stored as received |
//! | 100 | message.poll | strategies offset, timestamp, first, last, next; `auto_commit`; records are sliced when a range starts or ends inside a stored batch |
//! | 120 / 121 / 122 | consumer offset get / store / delete | stores may move backwards; 4100 past the end |
//! | 600 / 602 / 603 / 604 / 605 / 606 | consumer group get / create / delete / join / leave / sync | round-robin assignment, generation counter, re-sync sentinel, cooperative revocation |
//!
//! Unknown codes are answered with status 3 (`InvalidCommand`), as is every
//! known code not listed above, including 109 `message.fetch`, which the
//! 0.11.0 client never sends. Protocol 0.11.0 has no long poll, so neither
//! does this server: every poll is answered immediately, empty if nothing is
//! there yet. Every request but ping and login needs a signed-in connection
//! (status 40 otherwise).
//!
//! # Differences from the real server
//!
//! - Nothing is persisted, there are no permissions, no segments, no message
//!   expiry, no topic options (topic replies carry empty options and derived
//!   options), and a single node.
//! - A personal access token is accepted when it is listed in
//!   [`ServerConfig::personal_access_tokens`]; it signs in as user 0.
//! - Sessions are never evicted (no `SessionTooLow` on a repeated client id,
//!   no heartbeat timeout) and replicated requests are not deduplicated.
//! - A client leaves its groups as soon as its last connection closes (the
//!   real server drops members through its session lifecycle), except when
//!   [`IggyTestServer::restart`] or an outage closes it: like the real server
//!   replaying its journal, the member stays, a ghost owning its partitions
//!   until the group is deleted.
//! - A cooperative revocation is handed over inside the covering offset
//!   store, not asynchronously within about a second.
//! - Cosmetic header fields (op numbering, cluster id, server version,
//!   advertised QUIC/HTTP/WebSocket ports, which are 0) differ.

mod commands;
mod faults;
mod groups;
mod log;
mod messages;
mod net;
mod state;
mod tls;
mod wire;

#[allow(unused_imports)]
pub use faults::{Faults, OFFSET_STORE_REFUSAL_STATUS, SEND_REFUSAL_STATUS};
pub use tls::TlsFiles;

use bytes::Bytes;
use iggy_binary_protocol::WireUserHeaders;
use iggy_binary_protocol::batch::{
    BATCH_HEADER_SIZE, BATCH_MESSAGE_HEADER_SIZE, BatchIntegrity, decode_batch_slice_with,
};
use iggy_common::wire_conversions::user_headers_from_wire;
use iggy_common::{HeaderKey, HeaderValue};
use net::{Control, Shared};
use state::{State, Topic};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Users, tokens and timing of a test server.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Accepted `(username, password)` pairs; a user's id is its index.
    pub users: Vec<(String, String)>,
    /// Accepted personal access tokens (they sign in as user 0).
    pub personal_access_tokens: Vec<String>,
    /// How long a cooperative revocation waits for the old owner to commit
    /// before the partition moves anyway (30 s on the real server).
    pub rebalancing_timeout: Duration,
    /// Serve TLS with these files instead of plain TCP.
    pub tls: Option<TlsFiles>,
}

impl Default for ServerConfig {
    /// The user `iggy`/`iggy`, no tokens, a 30 s rebalancing timeout.
    fn default() -> Self {
        Self {
            users: vec![("iggy".to_owned(), "iggy".to_owned())],
            personal_access_tokens: Vec::new(),
            rebalancing_timeout: Duration::from_secs(30),
            tls: None,
        }
    }
}

impl ServerConfig {
    /// Adds an accepted user.
    pub fn user(mut self, name: impl Into<String>, password: impl Into<String>) -> Self {
        self.users.push((name.into(), password.into()));
        self
    }

    /// Adds an accepted personal access token.
    pub fn personal_access_token(mut self, token: impl Into<String>) -> Self {
        self.personal_access_tokens.push(token.into());
        self
    }

    pub fn rebalancing_timeout(mut self, timeout: Duration) -> Self {
        self.rebalancing_timeout = timeout;
        self
    }

    /// Serves TLS only, presenting the PEM certificate (chain) and key.
    pub fn tls(mut self, cert_pem: impl Into<PathBuf>, key_pem: impl Into<PathBuf>) -> Self {
        self.tls = Some(TlsFiles {
            cert: cert_pem.into(),
            key: key_pem.into(),
        });
        self
    }
}

/// One stored message, as a consumer would see it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub partition_id: u32,
    pub offset: u64,
    pub id: u128,
    /// The frame checksum the producer computed.
    pub checksum: u64,
    pub payload: Bytes,
    /// The raw user-header TLV as sent, `None` when there were none.
    pub user_headers: Option<Bytes>,
    /// Server timestamp of the batch (µs since the epoch).
    pub timestamp: u64,
    /// Producer timestamp of the message (µs since the epoch).
    pub origin_timestamp: u64,
}

impl StoredMessage {
    /// The user headers decoded as the client decodes them (empty when there
    /// are none). Panics on headers the client could not decode either.
    pub fn user_headers_map(&self) -> BTreeMap<HeaderKey, HeaderValue> {
        let Some(raw) = &self.user_headers else {
            return BTreeMap::new();
        };
        let wire = WireUserHeaders::from_bytes(raw.clone()).expect("user headers are valid TLV");
        user_headers_from_wire(&wire).expect("user headers have known kinds")
    }
}

/// A running test server. See the module documentation.
pub struct IggyTestServer {
    address: SocketAddr,
    shared: Arc<Shared>,
    control: mpsc::UnboundedSender<Control>,
    thread: Option<JoinHandle<()>>,
    listening: bool,
}

impl IggyTestServer {
    /// Starts a server on a free local port with the default user `iggy`/`iggy`.
    pub fn start() -> Self {
        Self::start_with(ServerConfig::default())
    }

    pub fn start_with(config: ServerConfig) -> Self {
        // Below the ephemeral range: an outage listens again on this port.
        let listener = super::ports::listener();
        listener
            .set_nonblocking(true)
            .expect("the listener can be made non-blocking");
        let address = listener
            .local_addr()
            .expect("a bound listener has an address");
        let (control, control_rx) = mpsc::unbounded_channel();
        let faults = Faults::new(control.clone());
        let tls = config.tls.as_ref().map(TlsFiles::acceptor);
        let shared = Shared::new(State::new(config, address.port()), faults);
        let thread = net::spawn(listener, tls, Arc::clone(&shared), control_rx);
        Self {
            address,
            shared,
            control,
            thread: Some(thread),
            listening: true,
        }
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `iggy://USER:PASSWORD@127.0.0.1:PORT` for the first configured user
    /// (or the first token when there are no users).
    pub fn connection_string(&self) -> String {
        let state = self.shared.state();
        if let Some((user, password)) = state.config.users.first() {
            return self.connection_string_for(user, password);
        }
        let token = state
            .config
            .personal_access_tokens
            .first()
            .expect("the server has neither users nor tokens to connect with");
        self.token_connection_string(token)
    }

    /// `iggy://USER:PASSWORD@127.0.0.1:PORT`, whether the server accepts the
    /// credentials or not.
    pub fn connection_string_for(&self, user: &str, password: &str) -> String {
        format!("iggy://{user}:{password}@{}", self.address)
    }

    /// `iggy://TOKEN@127.0.0.1:PORT`: the client signs in with the token.
    pub fn token_connection_string(&self, token: &str) -> String {
        format!("iggy://{token}@{}", self.address)
    }

    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// A simulated broker restart: closes every connection and the listener,
    /// keeps all data (messages, offsets, groups and their members, which
    /// stay as ghosts: clients sign in again with new ids), and listens again
    /// on the same port.
    pub fn restart(&mut self) {
        self.begin_outage();
        self.end_outage();
    }

    /// Stops listening and closes every connection; connects are refused
    /// until [`end_outage`](Self::end_outage). Data is kept. The port is
    /// released meanwhile; `end_outage` binds it again (and panics if another
    /// process took it within 5 s).
    pub fn begin_outage(&mut self) {
        if self.listening {
            self.request(Control::StopListening);
            self.listening = false;
        }
    }

    /// Listens again on the same port after [`begin_outage`](Self::begin_outage).
    pub fn end_outage(&mut self) {
        if !self.listening {
            let listener = bind(self.address);
            self.request(|ack| Control::Listen(listener, ack));
            self.listening = true;
        }
    }

    fn request(&self, message: impl FnOnce(std_mpsc::Sender<()>) -> Control) {
        let (ack, done) = std_mpsc::channel();
        self.control
            .send(message(ack))
            .expect("the test server thread is running");
        done.recv_timeout(Duration::from_secs(10))
            .expect("the test server thread answers control requests");
    }

    /// Creates the stream if missing (a no-op otherwise).
    pub fn create_stream(&self, stream: &str) {
        let mut state = self.shared.state();
        if state.stream_by_name(stream).is_none() {
            state.create_stream(stream);
        }
    }

    /// Creates the stream and topic if missing. Panics when the topic exists
    /// with another partition count.
    pub fn create_topic(&self, stream: &str, topic: &str, partitions: u32) {
        let mut state = self.shared.state();
        let index = match state.streams.iter().position(|s| s.name == stream) {
            Some(index) => index,
            None => {
                state.create_stream(stream);
                state.streams.len() - 1
            }
        };
        let stream_state = &mut state.streams[index];
        match stream_state.topic_by_name(topic) {
            Some(existing) => assert_eq!(
                existing.partitions.len(),
                partitions as usize,
                "topic {stream}/{topic} already exists with another partition count"
            ),
            None => {
                stream_state.create_topic(topic, partitions);
            }
        }
    }

    /// Every stored message of a topic, ordered by (partition, offset);
    /// empty when the topic does not exist.
    pub fn messages(&self, stream: &str, topic: &str) -> Vec<StoredMessage> {
        self.with_topic(stream, topic, stored_messages)
            .unwrap_or_default()
    }

    /// Messages stored in a topic, 0 when it does not exist.
    pub fn message_count(&self, stream: &str, topic: &str) -> u64 {
        self.with_topic(stream, topic, Topic::messages_count)
            .unwrap_or_default()
    }

    /// The offset stored by consumer group `group` for a partition.
    pub fn stored_offset(
        &self,
        stream: &str,
        topic: &str,
        group: &str,
        partition_id: u32,
    ) -> Option<u64> {
        self.with_topic(stream, topic, |topic| {
            topic
                .group_by_name(group)?
                .offsets
                .get(partition_id as usize)
                .copied()
                .flatten()
        })
        .flatten()
    }

    /// The value (as text) of an option the topic was created with.
    pub fn topic_option(&self, stream: &str, topic: &str, key: &str) -> Option<String> {
        self.with_topic(stream, topic, |topic| {
            topic
                .options
                .iter()
                .find(|(name, _)| name == key)
                .map(|(_, value)| value.clone())
        })
        .flatten()
    }

    /// Current members of consumer group `group` (0 when it does not exist).
    pub fn group_members(&self, stream: &str, topic: &str, group: &str) -> usize {
        self.with_topic(stream, topic, |topic| {
            topic.group_by_name(group).map(|g| g.members_count())
        })
        .flatten()
        .unwrap_or_default()
    }

    /// The partitions each member of `group` owns, members in join order.
    pub fn group_assignment(&self, stream: &str, topic: &str, group: &str) -> Vec<Vec<u32>> {
        self.with_topic(stream, topic, |topic| {
            topic.group_by_name(group).map(|g| g.details())
        })
        .flatten()
        .map(|details| {
            details
                .members
                .into_iter()
                .map(|member| member.partitions)
                .collect()
        })
        .unwrap_or_default()
    }

    /// Requests received with `command_code` (refused and failed ones too).
    pub fn request_count(&self, command_code: u32) -> u64 {
        self.shared.state().request_count(command_code)
    }

    /// Connections currently open.
    pub fn connection_count(&self) -> usize {
        self.shared.state().open_connections
    }

    fn with_topic<T>(
        &self,
        stream: &str,
        topic: &str,
        read: impl FnOnce(&Topic) -> T,
    ) -> Option<T> {
        let state = self.shared.state();
        state.topic_by_names(stream, topic).map(read)
    }
}

impl Drop for IggyTestServer {
    fn drop(&mut self) {
        let _ = self.control.send(Control::Shutdown);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Binds a non-blocking listener, retrying briefly when a just-released port
/// is not free yet.
fn bind(address: SocketAddr) -> std::net::TcpListener {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match std::net::TcpListener::bind(address) {
            Ok(listener) => {
                listener
                    .set_nonblocking(true)
                    .expect("the listener can be made non-blocking");
                return listener;
            }
            Err(error) if Instant::now() >= deadline => {
                panic!("the test server cannot listen on {address}: {error}")
            }
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn stored_messages(topic: &Topic) -> Vec<StoredMessage> {
    let mut messages = Vec::with_capacity(usize::try_from(topic.messages_count()).unwrap_or(0));
    for partition in &topic.partitions {
        for batch in partition.log.batches() {
            let decoded = decode_batch_slice_with(&batch.bytes, BatchIntegrity::LayoutOnly)
                .expect("stored batches decode");
            let header = decoded.header;
            for frame in decoded.iter_with_offsets() {
                let view = frame.message.header;
                let payload_start = BATCH_HEADER_SIZE + frame.start + BATCH_MESSAGE_HEADER_SIZE;
                let payload_end = payload_start + view.payload_length as usize;
                let headers_end = payload_end + view.user_headers_length as usize;
                messages.push(StoredMessage {
                    partition_id: partition.id,
                    offset: header.base_offset + u64::from(view.offset_delta),
                    id: view.id,
                    checksum: view.checksum,
                    payload: batch.bytes.slice(payload_start..payload_end),
                    user_headers: (headers_end > payload_end)
                        .then(|| batch.bytes.slice(payload_end..headers_end)),
                    timestamp: header.base_timestamp,
                    origin_timestamp: header.origin_timestamp + u64::from(view.timestamp_delta),
                });
            }
        }
    }
    messages
}
