//! Request dispatch and the session, stream, topic and consumer-group
//! handlers. Message and offset handlers live in `messages.rs`.
//!
//! Handlers are synchronous and run under the state lock, so every request
//! is applied atomically and in arrival order.

use super::faults::{FaultAction, Faults};
use super::messages;
use super::state::{Missing, State, now_micros};
use super::wire::{self, LoginBody, Reply, decode};
use bytes::{Bytes, BytesMut};
use iggy_binary_protocol::WireName;
use iggy_binary_protocol::codes::{
    CREATE_CONSUMER_GROUP_CODE, CREATE_PARTITIONS_CODE, CREATE_STREAM_CODE, CREATE_TOPIC_CODE,
    DELETE_CONSUMER_GROUP_CODE, DELETE_CONSUMER_OFFSET_CODE, GET_CLUSTER_METADATA_CODE,
    GET_CONSUMER_GROUP_CODE, GET_CONSUMER_OFFSET_CODE, GET_STREAM_CODE, GET_TOPIC_CODE,
    JOIN_CONSUMER_GROUP_CODE, LEAVE_CONSUMER_GROUP_CODE, LOGOUT_USER_CODE, PING_CODE,
    POLL_MESSAGES_CODE, SEND_MESSAGES_CODE, STORE_CONSUMER_OFFSET_CODE, SYNC_CONSUMER_GROUP_CODE,
};
use iggy_binary_protocol::consensus::{EvictionReason, Operation, RequestHeader};
use iggy_binary_protocol::dispatch::lookup_command;
use iggy_binary_protocol::requests::consumer_groups::{
    CreateConsumerGroupRequest, DeleteConsumerGroupRequest, GetConsumerGroupRequest,
    JoinConsumerGroupRequest, LeaveConsumerGroupRequest, SyncConsumerGroupRequest,
};
use iggy_binary_protocol::requests::partitions::CreatePartitionsRequest;
use iggy_binary_protocol::requests::streams::{CreateStreamRequest, GetStreamRequest};
use iggy_binary_protocol::requests::topics::{CreateTopicRequest, GetTopicRequest};
use iggy_binary_protocol::responses::consumer_groups::SyncConsumerGroupResponse;
use iggy_binary_protocol::responses::system::get_cluster_metadata::{
    ClusterMetadataResponse, ClusterNodeResponse,
};
use iggy_binary_protocol::responses::users::login_register::LoginRegisterResponse;
use iggy_binary_protocol::version::{IGGY_PROTOCOL_VERSION, is_protocol_compatible};
use iggy_binary_protocol::{MAX_PARTITIONS_PER_REQUEST, WireIdentifier};
use secrecy::ExposeSecret;
use std::time::Instant;

/// Error codes the server answers with (`IggyError` discriminants).
pub(crate) mod status {
    pub(crate) const INVALID_COMMAND: u32 = 3;
    pub(crate) const RESOURCE_NOT_FOUND: u32 = 20;
    pub(crate) const UNAUTHENTICATED: u32 = 40;
    pub(crate) const STREAM_ID_NOT_FOUND: u32 = 1009;
    pub(crate) const STREAM_NAME_ALREADY_EXISTS: u32 = 1012;
    pub(crate) const TOPIC_ID_NOT_FOUND: u32 = 2010;
    pub(crate) const TOPIC_NAME_ALREADY_EXISTS: u32 = 2013;
    pub(crate) const INVALID_PARTITIONS_COUNT: u32 = 2019;
    pub(crate) const PARTITION_NOT_FOUND: u32 = 3007;
    pub(crate) const CONSUMER_OFFSET_NOT_FOUND: u32 = 3021;
    pub(crate) const INVALID_MESSAGES_COUNT: u32 = 4009;
    pub(crate) const INVALID_MESSAGE_CHECKSUM: u32 = 4027;
    pub(crate) const INVALID_BATCH_CHECKSUM: u32 = 4039;
    pub(crate) const INVALID_OFFSET: u32 = 4100;
    pub(crate) const CONSUMER_GROUP_NOT_FOUND: u32 = 5000;
    pub(crate) const CONSUMER_GROUP_ALREADY_EXISTS: u32 = 5004;
    pub(crate) const CONSUMER_GROUP_MEMBER_NOT_FOUND: u32 = 5006;
}

/// Server version advertised at login (cosmetic; the client does not check it).
const SERVER_VERSION: &str = "0.11.0-test";

/// Per-connection session state.
#[derive(Default)]
pub(crate) struct Session {
    pub(crate) user: Option<u32>,
    /// The client id the connection signed in with (the group member key).
    pub(crate) client: Option<u128>,
    session: u64,
}

impl Session {
    /// Forgets the sign-in and releases the client id (logout, disconnect).
    pub(crate) fn end(&mut self, state: &mut State) {
        self.user = None;
        if let Some(client) = self.client.take() {
            state.release_client(client);
        }
    }
}

/// What the connection does after a request.
pub(crate) enum Outcome {
    /// Write this frame (a reply or an eviction).
    Send(Bytes),
    /// Close the connection without answering.
    Close,
}

/// Applies one request and produces its answer.
pub(crate) fn handle(
    state: &mut State,
    faults: &Faults,
    session: &mut Session,
    header: &RequestHeader,
    body: BytesMut,
) -> Outcome {
    let login = (header.operation == Operation::Register).then(|| LoginBody::parse(&body));
    let code = login
        .as_ref()
        .map_or_else(|| wire::command_code(header), LoginBody::command_code);
    state.count_request(code);
    let now = now_micros();
    if lookup_command(code).is_none() {
        return Outcome::Send(Reply::denied(status::INVALID_COMMAND).into_frame(header, now));
    }
    if login.is_none() && code != PING_CODE && session.user.is_none() {
        return Outcome::Send(Reply::denied(status::UNAUTHENTICATED).into_frame(header, now));
    }
    let action = faults.take_action(code);
    match action {
        Some(FaultAction::Refuse(code)) => {
            return Outcome::Send(Reply::denied(code).into_frame(header, now));
        }
        Some(FaultAction::LoseRequest) => return Outcome::Close,
        Some(FaultAction::LoseReply) | None => {}
    }
    let outcome = match login {
        Some(login) => sign_in(state, session, header, &login),
        None => {
            let mut reply = route(state, session, header, code, body);
            if header.operation == Operation::NonReplicated && reply.status == 0 {
                reply.op = session.session;
                reply.commit = state.metadata_commit();
            }
            Outcome::Send(reply.into_frame(header, now))
        }
    };
    if action == Some(FaultAction::LoseReply) {
        return Outcome::Close;
    }
    outcome
}

fn route(
    state: &mut State,
    session: &mut Session,
    header: &RequestHeader,
    code: u32,
    body: BytesMut,
) -> Reply {
    let client = session.client.unwrap_or(header.client);
    let reply = match code {
        PING_CODE => Some(Reply::empty()),
        LOGOUT_USER_CODE => {
            if let Some(client) = session.client {
                state.remove_memberships(client);
            }
            session.end(state);
            Some(Reply::empty().at_op(state.next_metadata_op()))
        }
        GET_CLUSTER_METADATA_CODE => Some(cluster_metadata(state)),
        GET_STREAM_CODE => decode(&body).map(|request| get_stream(state, &request)),
        CREATE_STREAM_CODE => decode(&body).map(|request| create_stream(state, &request)),
        GET_TOPIC_CODE => decode(&body).map(|request| get_topic(state, &request)),
        CREATE_TOPIC_CODE => decode(&body).map(|request| create_topic(state, &request)),
        CREATE_PARTITIONS_CODE => decode(&body).map(|request| create_partitions(state, &request)),
        GET_CONSUMER_GROUP_CODE => decode(&body).map(|request| get_group(state, &request)),
        CREATE_CONSUMER_GROUP_CODE => decode(&body).map(|request| create_group(state, &request)),
        DELETE_CONSUMER_GROUP_CODE => decode(&body).map(|request| delete_group(state, &request)),
        JOIN_CONSUMER_GROUP_CODE => {
            decode(&body).map(|request| join_group(state, client, &request))
        }
        LEAVE_CONSUMER_GROUP_CODE => {
            decode(&body).map(|request| leave_group(state, client, &request))
        }
        SYNC_CONSUMER_GROUP_CODE => {
            decode(&body).map(|request| sync_group(state, client, &request))
        }
        SEND_MESSAGES_CODE => messages::send(state, body),
        POLL_MESSAGES_CODE => decode(&body).map(|request| messages::poll(state, client, &request)),
        STORE_CONSUMER_OFFSET_CODE => {
            decode(&body).map(|request| messages::store_offset(state, client, &request))
        }
        GET_CONSUMER_OFFSET_CODE => {
            decode(&body).map(|request| messages::get_offset(state, &request))
        }
        DELETE_CONSUMER_OFFSET_CODE => {
            decode(&body).map(|request| messages::delete_offset(state, client, &request))
        }
        // Known to the protocol, not implemented here (fetch 109 included:
        // the 0.11.0 client never sends it).
        _ => Some(Reply::denied(status::INVALID_COMMAND)),
    };
    reply.unwrap_or_else(|| Reply::denied(status::INVALID_COMMAND))
}

fn sign_in(
    state: &mut State,
    session: &mut Session,
    header: &RequestHeader,
    login: &LoginBody,
) -> Outcome {
    let Some(protocol) = login.protocol_version() else {
        return Outcome::Send(wire::eviction_frame(
            header.client,
            EvictionReason::MalformedLogin,
        ));
    };
    if !is_protocol_compatible(protocol) {
        return Outcome::Send(wire::incompatible_protocol_frame(header.client));
    }
    let user = match login {
        LoginBody::Password(login) => state
            .config
            .users
            .iter()
            .position(|(name, password)| {
                name == login.username.as_str() && password == login.password.expose_secret()
            })
            .ok_or(EvictionReason::InvalidCredentials),
        LoginBody::Token(login) => state
            .config
            .personal_access_tokens
            .iter()
            .any(|token| token == login.token.expose_secret())
            .then_some(0)
            .ok_or(EvictionReason::InvalidToken),
        LoginBody::Malformed => Err(EvictionReason::MalformedLogin),
    };
    let user = match user {
        Ok(user) => u32::try_from(user).expect("user ids fit in u32"),
        Err(reason) => return Outcome::Send(wire::eviction_frame(header.client, reason)),
    };
    // A repeated login with the same client id keeps its group memberships.
    if session.client != Some(header.client) {
        session.end(state);
        state.bind_client(header.client);
        session.client = Some(header.client);
    }
    let session_id = state.next_metadata_op();
    session.user = Some(user);
    session.session = session_id;
    let reply = Reply::committed(&LoginRegisterResponse {
        user_id: user,
        session: session_id,
        server_protocol_version: IGGY_PROTOCOL_VERSION,
        server_version: WireName::new(SERVER_VERSION).expect("a valid name"),
    })
    .at_op(session_id);
    Outcome::Send(reply.into_frame(header, now_micros()))
}

fn cluster_metadata(state: &State) -> Reply {
    Reply::read(&ClusterMetadataResponse {
        name: "iggy-test-cluster".to_owned(),
        nodes: vec![ClusterNodeResponse {
            name: "iggy-test-node".to_owned(),
            ip: "127.0.0.1".to_owned(),
            tcp_port: state.port,
            quic_port: 0,
            http_port: 0,
            websocket_port: 0,
            role: 0,
            status: 0,
        }],
    })
}

fn get_stream(state: &State, request: &GetStreamRequest) -> Reply {
    state
        .stream(&request.stream_id)
        .map_or_else(Reply::empty, |stream| Reply::read(&stream.details()))
}

fn create_stream(state: &mut State, request: &CreateStreamRequest) -> Reply {
    let op = state.next_metadata_op();
    let name = request.name.as_str();
    if state.stream_by_name(name).is_some() {
        return Reply::rejected(status::STREAM_NAME_ALREADY_EXISTS).at_op(op);
    }
    Reply::committed(&state.create_stream(name).response()).at_op(op)
}

fn get_topic(state: &State, request: &GetTopicRequest) -> Reply {
    state
        .topic(&request.stream_id, &request.topic_id)
        .map_or_else(|_| Reply::empty(), |topic| Reply::read(&topic.response()))
}

fn create_topic(state: &mut State, request: &CreateTopicRequest) -> Reply {
    let op = state.next_metadata_op();
    let Some(index) = state.stream_index(&request.stream_id) else {
        return Reply::rejected(status::STREAM_ID_NOT_FOUND).at_op(op);
    };
    let stream = &mut state.streams[index];
    let name = request.name.as_str();
    if stream.topic_by_name(name).is_some() {
        return Reply::rejected(status::TOPIC_NAME_ALREADY_EXISTS).at_op(op);
    }
    if request.partitions_count > MAX_PARTITIONS_PER_REQUEST {
        return Reply::rejected(status::INVALID_PARTITIONS_COUNT).at_op(op);
    }
    let topic = stream.create_topic(name, request.partitions_count);
    topic.options = request
        .options
        .iter()
        .map(|entry| {
            (
                String::from_utf8_lossy(entry.key).into_owned(),
                String::from_utf8_lossy(entry.value).into_owned(),
            )
        })
        .collect();
    let mut reply = Reply::committed(&topic.response()).at_op(op);
    reply.operation = Some(Operation::CreateTopicWithAssignments);
    reply
}

/// Adds partitions to a topic; its groups rebalance onto them.
fn create_partitions(state: &mut State, request: &CreatePartitionsRequest) -> Reply {
    let op = state.next_metadata_op();
    if request.partitions_count == 0 || request.partitions_count > MAX_PARTITIONS_PER_REQUEST {
        return Reply::rejected(status::INVALID_PARTITIONS_COUNT).at_op(op);
    }
    let topic = match state.topic_mut(&request.stream_id, &request.topic_id) {
        Ok(topic) => topic,
        Err(missing) => return Reply::rejected(missing_status(missing)).at_op(op),
    };
    topic.add_partitions(request.partitions_count);
    let mut reply = Reply::committed_empty().at_op(op);
    reply.operation = Some(Operation::CreatePartitionsWithAssignments);
    reply
}

/// Maps a missing stream or topic to its status code.
pub(crate) fn missing_status(missing: Missing) -> u32 {
    match missing {
        Missing::Stream => status::STREAM_ID_NOT_FOUND,
        Missing::Topic => status::TOPIC_ID_NOT_FOUND,
    }
}

fn get_group(state: &mut State, request: &GetConsumerGroupRequest) -> Reply {
    let (stream, topic, group) = (&request.stream_id, &request.topic_id, &request.group_id);
    match with_group(state, stream, topic, group, |group| group.details()) {
        Ok(Some(details)) => Reply::read(&details),
        Ok(None) => Reply::empty(),
        Err(missing) => Reply::denied(missing_status(missing)),
    }
}

fn create_group(state: &mut State, request: &CreateConsumerGroupRequest) -> Reply {
    let op = state.next_metadata_op();
    let topic = match state.topic_mut(&request.stream_id, &request.topic_id) {
        Ok(topic) => topic,
        Err(missing) => return Reply::rejected(missing_status(missing)).at_op(op),
    };
    let name = request.name.as_str();
    if topic.group_by_name(name).is_some() {
        return Reply::rejected(status::CONSUMER_GROUP_ALREADY_EXISTS).at_op(op);
    }
    Reply::committed(&topic.create_group(name).details()).at_op(op)
}

/// Deletes a group with its members and stored offsets.
fn delete_group(state: &mut State, request: &DeleteConsumerGroupRequest) -> Reply {
    let op = state.next_metadata_op();
    let topic = match state.topic_mut(&request.stream_id, &request.topic_id) {
        Ok(topic) => topic,
        Err(missing) => return Reply::rejected(missing_status(missing)).at_op(op),
    };
    match topic.group_index(&request.group_id) {
        Some(index) => {
            topic.groups.remove(index);
            Reply::committed_empty().at_op(op)
        }
        None => Reply::rejected(status::CONSUMER_GROUP_NOT_FOUND).at_op(op),
    }
}

/// Resolves a group, handing over revocations whose timeout ran out first.
fn with_group<T>(
    state: &mut State,
    stream: &WireIdentifier,
    topic: &WireIdentifier,
    group: &WireIdentifier,
    apply: impl FnOnce(&mut super::groups::Group) -> T,
) -> Result<Option<T>, Missing> {
    let timeout = state.config.rebalancing_timeout;
    let topic = state.topic_mut(stream, topic)?;
    Ok(topic.group_index(group).map(|index| {
        let group = &mut topic.groups[index];
        group.expire_revocations(Instant::now(), timeout);
        apply(group)
    }))
}

fn join_group(state: &mut State, client: u128, request: &JoinConsumerGroupRequest) -> Reply {
    let op = state.next_metadata_op();
    let (stream, topic, group) = (&request.stream_id, &request.topic_id, &request.group_id);
    match with_group(state, stream, topic, group, |group| group.join(client)) {
        Ok(Some(_)) => Reply::committed_empty().at_op(op),
        Ok(None) => Reply::rejected(status::CONSUMER_GROUP_NOT_FOUND).at_op(op),
        Err(missing) => Reply::rejected(missing_status(missing)).at_op(op),
    }
}

fn leave_group(state: &mut State, client: u128, request: &LeaveConsumerGroupRequest) -> Reply {
    let op = state.next_metadata_op();
    let (stream, topic, group) = (&request.stream_id, &request.topic_id, &request.group_id);
    match with_group(state, stream, topic, group, |group| group.leave(client)) {
        Ok(Some(true)) => Reply::committed_empty().at_op(op),
        Ok(Some(false)) => Reply::rejected(status::CONSUMER_GROUP_MEMBER_NOT_FOUND).at_op(op),
        Ok(None) => Reply::rejected(status::CONSUMER_GROUP_NOT_FOUND).at_op(op),
        Err(missing) => Reply::rejected(missing_status(missing)).at_op(op),
    }
}

fn sync_group(state: &mut State, client: u128, request: &SyncConsumerGroupRequest) -> Reply {
    let (stream, topic, group) = (&request.stream_id, &request.topic_id, &request.group_id);
    let assignment = with_group(state, stream, topic, group, |group| {
        group.is_member(client).then(|| SyncConsumerGroupResponse {
            generation: group.generation,
            partitions: group.assignment(client),
        })
    });
    match assignment {
        Ok(Some(Some(assignment))) => Reply::read(&assignment),
        // Not a member, no such group, no such topic: an empty body.
        _ => Reply::empty(),
    }
}
