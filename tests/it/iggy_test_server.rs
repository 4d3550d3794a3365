//! The in-process Iggy test server, exercised through the real `iggy` 0.11.0
//! client.

use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use iggy::prelude::*;
use iggy_binary_protocol::batch::decode_batch_slice;
use iggy_binary_protocol::codec::{WireDecode, WireEncode};
use iggy_binary_protocol::codes::{
    CREATE_STREAM_CODE, CREATE_TOPIC_CODE, GET_CLUSTER_METADATA_CODE, GET_STREAM_CODE,
    LOGIN_REGISTER_CODE, LOGIN_REGISTER_WITH_PAT_CODE, PING_CODE, POLL_MESSAGES_CODE,
    SEND_MESSAGES_CODE, STORE_CONSUMER_OFFSET_CODE,
};
use iggy_binary_protocol::requests::messages::{
    PollMessagesRequest, RawMessage, SendMessagesEncoder,
};
use iggy_binary_protocol::requests::streams::GetStreamRequest;
use iggy_binary_protocol::responses::messages::poll_messages::PollMessagesResponseHeader;
use iggy_binary_protocol::responses::messages::send_messages::SendMessagesResponse as WireSendResponse;
use iggy_binary_protocol::{WireConsumer, WireIdentifier, WirePartitioning, WirePollingStrategy};

use crate::support;
use crate::support::iggy_server::{
    IggyTestServer, OFFSET_STORE_REFUSAL_STATUS, SEND_REFUSAL_STATUS, ServerConfig,
};

const STREAM: &str = "orders";
const TOPIC: &str = "created";
const GROUP: &str = "workers";
/// Upper bound for anything a test waits for; nothing should come close.
const DEADLINE: Duration = Duration::from_secs(60);

fn stream_id() -> Identifier {
    Identifier::named(STREAM).expect("a valid name")
}

fn topic_id() -> Identifier {
    Identifier::named(TOPIC).expect("a valid name")
}

async fn connect(connection_string: &str) -> IggyClient {
    let client =
        IggyClient::from_connection_string(connection_string).expect("a valid connection string");
    client.connect().await.expect("the client connects");
    client
}

/// A connection string whose client reconnects quickly after a drop (the
/// client otherwise waits 5 s since its previous connect).
fn quick_reconnect(server: &IggyTestServer) -> String {
    format!(
        "{}?reestablish_after=50ms&reconnection_interval=100ms",
        server.connection_string()
    )
}

fn message(payload: String) -> IggyMessage {
    IggyMessage::from_str(&payload).expect("a valid message")
}

fn numbered(range: std::ops::Range<u64>) -> Vec<IggyMessage> {
    range.map(|n| message(format!("message-{n}"))).collect()
}

async fn send_to_partition(client: &IggyClient, partition: u32, messages: Vec<IggyMessage>) {
    let mut messages = messages;
    client
        .send_messages(
            &stream_id(),
            &topic_id(),
            &Partitioning::partition_id(partition),
            &mut messages,
        )
        .await
        .expect("the send is accepted");
}

fn offsets(polled: &PolledMessages) -> Vec<u64> {
    polled.messages.iter().map(|m| m.header.offset).collect()
}

/// Waits, without blocking the runtime, until `condition` holds.
async fn wait_until(what: &str, condition: impl FnMut() -> bool) {
    support::wait::wait_for(what, DEADLINE, condition).await;
}

fn group_consumer(client: &IggyClient) -> IggyConsumer {
    client
        .consumer_group(GROUP, STREAM, TOPIC)
        .expect("valid names")
        .auto_commit(AutoCommit::Disabled)
        .create_consumer_group_if_not_exists()
        .auto_join_consumer_group()
        .polling_strategy(PollingStrategy::next())
        .polling_retry_interval(NonZeroIggyDuration::from_str("50ms").expect("a duration"))
        .batch_length(1000)
        .build()
}

/// The next message a consumer hands over, skipping transient errors (a
/// dropped connection surfaces once as `Disconnected`).
async fn next_message(consumer: &mut IggyConsumer) -> ReceivedMessage {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let remaining = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(remaining, consumer.next()).await {
            Ok(Some(Ok(message))) => return message,
            Ok(Some(Err(_))) => continue,
            Ok(None) => panic!("the consumer stream ended"),
            Err(_) => panic!("no message within {DEADLINE:?}"),
        }
    }
}

#[tokio::test]
async fn login_with_username_and_password_is_accepted() {
    let server = IggyTestServer::start();
    let client = connect(&server.connection_string()).await;

    client.ping().await.expect("a signed-in ping is answered");
    let metadata = client
        .get_cluster_metadata()
        .await
        .expect("metadata is served");
    assert_eq!(metadata.nodes.len(), 1, "exactly one node is advertised");
    assert_eq!(metadata.nodes[0].endpoints.tcp, server.address().port());
    assert_eq!(server.request_count(LOGIN_REGISTER_CODE), 1);
    assert!(server.request_count(GET_CLUSTER_METADATA_CODE) >= 1);
}

#[tokio::test]
async fn login_with_a_personal_access_token_is_accepted() {
    let token = "iggypat-0123456789abcdef";
    let server = IggyTestServer::start_with(ServerConfig::default().personal_access_token(token));
    let client = connect(&server.token_connection_string(token)).await;

    client
        .create_stream("made-with-a-token")
        .await
        .expect("a token session is authenticated");
    assert_eq!(server.request_count(LOGIN_REGISTER_WITH_PAT_CODE), 1);
    assert_eq!(server.request_count(LOGIN_REGISTER_CODE), 0);
}

#[tokio::test]
async fn login_with_an_unknown_personal_access_token_is_refused() {
    let server = IggyTestServer::start_with(ServerConfig::default().personal_access_token("good"));
    let client = IggyClient::from_connection_string(&server.token_connection_string("bad"))
        .expect("a valid connection string");

    let error = client.connect().await.expect_err("the token is refused");
    assert!(
        matches!(error, IggyError::InvalidPersonalAccessToken),
        "{error:?}"
    );
}

#[tokio::test]
async fn login_with_a_bad_password_is_refused_with_invalid_credentials() {
    let server = IggyTestServer::start();
    let client = IggyClient::from_connection_string(&server.connection_string_for("iggy", "nope"))
        .expect("a valid connection string");

    let error = client.connect().await.expect_err("the password is refused");
    assert!(matches!(error, IggyError::InvalidCredentials), "{error:?}");
}

/// Sends one raw login frame and returns the 256-byte answer.
async fn raw_login(server: &IggyTestServer, protocol_version: u32, password: &str) -> [u8; 256] {
    use iggy_binary_protocol::consensus::{Command, HEADER_SIZE, Operation, RequestHeader};
    use iggy_binary_protocol::requests::users::LoginRegisterRequest;
    use iggy_binary_protocol::version::ClientVersionInfo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let body = LoginRegisterRequest {
        version_info: ClientVersionInfo {
            protocol_version,
            sdk_name: iggy_binary_protocol::WireName::new("raw-test").expect("a name"),
            sdk_version: iggy_binary_protocol::WireName::new("0.0.1").expect("a name"),
        },
        username: iggy_binary_protocol::WireName::new("iggy").expect("a name"),
        password: password.to_owned().into(),
        client_context: None,
    }
    .to_bytes();
    let header = RequestHeader {
        command: Command::Request,
        operation: Operation::Register,
        size: u32::try_from(HEADER_SIZE + body.len()).expect("small"),
        client: 0xC1_1E47,
        ..RequestHeader::default()
    };
    let mut stream = tokio::net::TcpStream::connect(server.address())
        .await
        .expect("the server accepts");
    stream
        .write_all(bytemuck::bytes_of(&header))
        .await
        .expect("the header is sent");
    stream.write_all(&body).await.expect("the body is sent");
    let mut answer = [0u8; 256];
    stream
        .read_exact(&mut answer)
        .await
        .expect("one frame comes back");
    answer
}

#[tokio::test]
async fn bad_logins_are_answered_with_eviction_frames() {
    use iggy_binary_protocol::version::{IGGY_PROTOCOL_VERSION, IGGY_PROTOCOL_VERSION_MIN};
    const EVICTION: u8 = 13;
    let server = IggyTestServer::start();

    let answer = raw_login(&server, IGGY_PROTOCOL_VERSION, "wrong").await;
    assert_eq!(answer[60], EVICTION, "command");
    assert_eq!(answer[255], 9, "reason InvalidCredentials");

    let answer = raw_login(&server, 0x400, "iggy").await;
    assert_eq!(answer[60], EVICTION, "command");
    assert_eq!(answer[255], 14, "reason IncompatibleProtocol");
    let window = |at: usize| u32::from_le_bytes(answer[at..at + 4].try_into().expect("4 bytes"));
    assert_eq!(window(144), IGGY_PROTOCOL_VERSION);
    assert_eq!(window(148), IGGY_PROTOCOL_VERSION_MIN);

    let answer = raw_login(&server, IGGY_PROTOCOL_VERSION, "iggy").await;
    assert_eq!(answer[60], 8, "a reply");
    let session = u64::from_le_bytes(answer[176..184].try_into().expect("8 bytes"));
    assert!(session > 0, "the reply op carries the new session");
}

#[tokio::test]
async fn requests_before_login_are_refused_except_ping() {
    let server = IggyTestServer::start();
    let client = IggyClient::builder()
        .with_tcp()
        .with_server_address(server.address().to_string())
        .build()
        .expect("a client");
    client.connect().await.expect("connects without signing in");

    client
        .send_binary_request(PING_CODE, Bytes::new())
        .await
        .expect("ping needs no login");
    let get_stream = GetStreamRequest {
        stream_id: WireIdentifier::named(STREAM).expect("a name"),
    };
    let error = client
        .send_binary_request(GET_STREAM_CODE, get_stream.to_bytes())
        .await
        .expect_err("a read needs a login");
    assert_eq!(error.as_code(), 40, "{error:?}");
}

#[tokio::test]
async fn unknown_and_unsupported_commands_are_answered_with_invalid_command() {
    let server = IggyTestServer::start();
    let client = connect(&server.connection_string()).await;

    for code in [9_999, 109, 201] {
        let error = client
            .send_binary_request(code, Bytes::new())
            .await
            .expect_err("the command is refused");
        assert_eq!(error.as_code(), 3, "code {code}: {error:?}");
    }
    client.ping().await.expect("the connection is still usable");
}

#[tokio::test]
async fn a_producer_creates_its_stream_and_topic_and_spreads_balanced_sends() {
    let server = IggyTestServer::start();
    let client = connect(&server.connection_string()).await;
    let producer = client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .create_stream_if_not_exists()
        .create_topic_if_not_exists(3, IggyExpiry::NeverExpire, MaxTopicSize::ServerDefault)
        .partitioning(Partitioning::balanced())
        .build();

    producer.init().await.expect("the producer initialises");
    for round in 0..3 {
        producer
            .send(numbered(round * 10..round * 10 + 10))
            .await
            .expect("the send is accepted");
    }

    assert_eq!(server.request_count(CREATE_STREAM_CODE), 1);
    assert_eq!(server.request_count(CREATE_TOPIC_CODE), 1);
    assert_eq!(server.request_count(SEND_MESSAGES_CODE), 3);
    let topic = client
        .get_topic(&stream_id(), &topic_id())
        .await
        .expect("the topic is read")
        .expect("the topic exists");
    assert_eq!(topic.partitions_count, 3);
    assert_eq!(topic.messages_count, 30);
    let stored = server.messages(STREAM, TOPIC);
    for partition in 0..3 {
        let offsets: Vec<u64> = stored
            .iter()
            .filter(|m| m.partition_id == partition)
            .map(|m| m.offset)
            .collect();
        assert_eq!(
            offsets,
            (0..10).collect::<Vec<_>>(),
            "partition {partition}"
        );
    }
}

#[tokio::test]
async fn polling_serves_every_strategy_from_the_stored_batches() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    // Three stored batches: offsets 0-3, 4-6 and 7-9.
    send_to_partition(&client, 0, numbered(0..4)).await;
    send_to_partition(&client, 0, numbered(4..7)).await;
    send_to_partition(&client, 0, numbered(7..10)).await;
    let consumer = Consumer::new(Identifier::numeric(7).expect("an id"));
    let poll = |strategy: PollingStrategy, count: u32, auto_commit: bool| {
        let client = &client;
        let consumer = &consumer;
        async move {
            client
                .poll_messages(
                    &stream_id(),
                    &topic_id(),
                    Some(0),
                    consumer,
                    &strategy,
                    count,
                    auto_commit,
                )
                .await
                .expect("the poll is answered")
        }
    };

    let sliced = poll(PollingStrategy::offset(2), 5, false).await;
    assert_eq!(offsets(&sliced), vec![2, 3, 4, 5, 6]);
    let payloads: Vec<_> = sliced.messages.iter().map(|m| m.payload.clone()).collect();
    assert_eq!(payloads[0], Bytes::from("message-2"));
    assert_eq!(payloads[4], Bytes::from("message-6"));
    assert_eq!(
        offsets(&poll(PollingStrategy::offset(5), 3, false).await),
        vec![5, 6, 7]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::first(), 2, false).await),
        vec![0, 1]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::last(), 3, false).await),
        vec![7, 8, 9]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::timestamp(0.into()), 100, false).await),
        (0..10).collect::<Vec<_>>()
    );
    let stored = server.messages(STREAM, TOPIC);
    let third_batch = stored[7].timestamp;
    let expected_first = stored
        .iter()
        .find(|m| m.timestamp >= third_batch)
        .map(|m| m.offset);
    let by_time = poll(PollingStrategy::timestamp(third_batch.into()), 100, false).await;
    assert_eq!(
        by_time.messages.first().map(|m| m.header.offset),
        expected_first
    );
    assert!(
        by_time
            .messages
            .iter()
            .all(|m| m.header.timestamp >= third_batch)
    );
    let future = poll(
        PollingStrategy::timestamp((third_batch + 1_000_000).into()),
        10,
        false,
    )
    .await;
    assert!(future.messages.is_empty());

    let beyond = poll(PollingStrategy::offset(10), 10, false).await;
    assert!(beyond.messages.is_empty(), "nothing past the end");
    assert_eq!(beyond.current_offset, 9);
    assert_eq!(beyond.partition_id, 0);

    assert_eq!(
        offsets(&poll(PollingStrategy::next(), 4, true).await),
        vec![0, 1, 2, 3]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::next(), 4, true).await),
        vec![4, 5, 6, 7]
    );
    assert_eq!(
        offsets(&poll(PollingStrategy::next(), 100, true).await),
        vec![8, 9]
    );
    assert!(
        poll(PollingStrategy::next(), 100, true)
            .await
            .messages
            .is_empty()
    );
    let stored_offset = client
        .get_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0))
        .await
        .expect("the offset is read")
        .expect("auto-commit stored an offset");
    assert_eq!(stored_offset.stored_offset, 9);
}

#[tokio::test]
async fn message_ids_checksums_and_user_headers_round_trip() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    let headers = BTreeMap::from([
        (
            HeaderKey::from_str("content-type").expect("a key"),
            HeaderValue::from_str("application/json").expect("a value"),
        ),
        (
            HeaderKey::from_str("attempt").expect("a key"),
            HeaderValue::from(3u32),
        ),
    ]);
    let mut sent: Vec<IggyMessage> = (1..=5u128)
        .map(|id| {
            IggyMessage::builder()
                .id(id * 1_000_000_007)
                .payload(Bytes::from(format!("{{\"n\":{id}}}")))
                .user_headers(headers.clone())
                .build()
                .expect("a valid message")
        })
        .collect();
    sent.push(message("without an id or headers".to_owned()));
    send_to_partition(&client, 0, sent).await;

    let polled = client
        .poll_messages(
            &stream_id(),
            &topic_id(),
            Some(0),
            &Consumer::default(),
            &PollingStrategy::first(),
            10,
            false,
        )
        .await
        .expect("the poll is answered");
    let stored = server.messages(STREAM, TOPIC);
    assert_eq!(polled.messages.len(), 6);
    for (message, stored) in polled.messages.iter().zip(&stored) {
        assert_eq!(message.header.id, stored.id);
        assert_eq!(message.header.checksum, stored.checksum);
        assert_eq!(message.payload, stored.payload);
        assert_eq!(message.header.origin_timestamp, stored.origin_timestamp);
    }
    for (index, message) in polled.messages.iter().take(5).enumerate() {
        assert_eq!(message.header.id, (index as u128 + 1) * 1_000_000_007);
        let map = message
            .user_headers_map()
            .expect("decodes")
            .expect("present");
        assert_eq!(map, headers);
        assert_eq!(stored[index].user_headers_map(), headers);
    }
    assert_ne!(polled.messages[5].header.id, 0, "the client minted an id");
    assert!(stored[5].user_headers.is_none());

    // Raw poll from offset 1: one record sliced out of the stored batch,
    // stamped by the server, with checksums that verify.
    let request = PollMessagesRequest {
        consumer: WireConsumer::consumer(WireIdentifier::numeric(1)),
        stream_id: WireIdentifier::named(STREAM).expect("a name"),
        topic_id: WireIdentifier::named(TOPIC).expect("a name"),
        partition_id: Some(0),
        strategy: WirePollingStrategy::offset(1),
        count: 3,
        auto_commit: false,
    };
    let body = client
        .send_binary_request(POLL_MESSAGES_CODE, request.to_bytes())
        .await
        .expect("the raw poll is answered");
    let header = PollMessagesResponseHeader::decode_from(&body).expect("a poll header");
    assert_eq!(header.messages_count, 3);
    assert_eq!(header.current_offset, 5);
    let record = decode_batch_slice(&body[16..]).expect("the sliced record verifies");
    assert_eq!(
        record.header.base_offset, 0,
        "a slice keeps its base offset"
    );
    assert_eq!(record.header.partition_id, 0);
    assert!(
        record.header.base_timestamp > 0,
        "the server stamped a time"
    );
    let deltas: Vec<u32> = record.iter().map(|m| m.header.offset_delta).collect();
    assert_eq!(deltas, vec![1, 2, 3]);
    assert_eq!(16 + record.header.batch_length as usize, body.len());
}

/// A `SendMessages` body for one message, as the client encodes it.
fn send_body(payload: &[u8]) -> BytesMut {
    let mut body = BytesMut::new();
    SendMessagesEncoder::encode(
        &mut body,
        &WireIdentifier::named(STREAM).expect("a name"),
        &WireIdentifier::named(TOPIC).expect("a name"),
        &WirePartitioning::PartitionId(0),
        &[RawMessage {
            id: 42,
            origin_timestamp: 1,
            headers: None,
            payload,
        }],
    )
    .expect("the batch encodes");
    body
}

#[tokio::test]
async fn a_batch_with_a_bad_checksum_is_refused_and_nothing_is_stored() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    let payload = b"checksummed payload";

    let mut corrupt_payload = send_body(payload);
    let at = corrupt_payload
        .windows(payload.len())
        .position(|window| window == payload)
        .expect("the payload is in the body");
    corrupt_payload[at] ^= 0xff;
    let error = client
        .send_binary_request(SEND_MESSAGES_CODE, corrupt_payload.freeze())
        .await
        .expect_err("a corrupt frame is refused");
    assert_eq!(error.as_code(), 4027, "{error:?}");

    let mut corrupt_batch = send_body(payload);
    let metadata_len = u32::from_le_bytes(corrupt_batch[..4].try_into().expect("4 bytes"));
    corrupt_batch[4 + metadata_len as usize + 40] ^= 0xff;
    let error = client
        .send_binary_request(SEND_MESSAGES_CODE, corrupt_batch.freeze())
        .await
        .expect_err("a corrupt batch checksum is refused");
    assert_eq!(error.as_code(), 4039, "{error:?}");
    assert_eq!(server.message_count(STREAM, TOPIC), 0);

    let reply = client
        .send_binary_request(SEND_MESSAGES_CODE, send_body(payload).freeze())
        .await
        .expect("an intact batch is stored");
    let confirmation = WireSendResponse::decode_from(&reply).expect("a confirmation");
    assert_eq!(confirmation.confirmations.len(), 1);
    assert_eq!(confirmation.confirmations[0].base_offset, 0);
    assert_eq!(
        server.messages(STREAM, TOPIC)[0].payload,
        Bytes::from_static(payload)
    );
}

#[tokio::test]
async fn a_group_consumer_resumes_after_its_stored_offset_when_it_reconnects() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let producer = connect(&server.connection_string()).await;
    send_to_partition(&producer, 0, numbered(0..20)).await;

    let first = connect(&server.connection_string()).await;
    let mut consumer = group_consumer(&first);
    consumer.init().await.expect("the consumer joins");
    for expected in 0..10 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
        consumer
            .store_offset(expected, Some(received.partition_id))
            .await
            .expect("the offset is stored");
    }
    consumer.shutdown().await.expect("the consumer shuts down");
    first.shutdown().await.expect("the client shuts down");
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(9));
    wait_until("the first member to leave", || {
        server.group_members(STREAM, TOPIC, GROUP) == 0
    })
    .await;

    let second = connect(&server.connection_string()).await;
    let offset = second
        .get_consumer_offset(
            &Consumer::group(Identifier::named(GROUP).expect("a name")),
            &stream_id(),
            &topic_id(),
            Some(0),
        )
        .await
        .expect("the offset is read")
        .expect("the group stored one");
    assert_eq!(offset.stored_offset, 9);
    let mut consumer = group_consumer(&second);
    consumer.init().await.expect("the consumer joins again");
    for expected in 10..20 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
        consumer
            .store_offset(expected, Some(0))
            .await
            .expect("the offset is stored");
    }
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(19));
}

#[tokio::test]
async fn two_group_members_split_two_partitions() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 2);
    let producer = connect(&server.connection_string()).await;
    send_to_partition(&producer, 0, numbered(0..10)).await;
    send_to_partition(&producer, 1, numbered(100..110)).await;

    let first_client = connect(&server.connection_string()).await;
    let second_client = connect(&server.connection_string()).await;
    let mut first = group_consumer(&first_client);
    let mut second = group_consumer(&second_client);
    first.init().await.expect("the first member joins");
    second.init().await.expect("the second member joins");
    assert_eq!(server.group_members(STREAM, TOPIC, GROUP), 2);
    assert_eq!(
        server.group_assignment(STREAM, TOPIC, GROUP),
        vec![vec![0], vec![1]]
    );

    let mut seen = Vec::new();
    for consumer in [&mut first, &mut second] {
        let mut partitions = Vec::new();
        for _ in 0..10 {
            let received = next_message(consumer).await;
            partitions.push(received.partition_id);
            consumer
                .store_offset(received.message.header.offset, Some(received.partition_id))
                .await
                .expect("the offset is stored");
        }
        partitions.dedup();
        assert_eq!(partitions.len(), 1, "a member reads only its partition");
        seen.push(partitions[0]);
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1]);
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(9));
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 1), Some(9));
}

#[tokio::test]
async fn a_partition_moves_to_a_new_member_only_after_the_old_owner_commits_what_it_read() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 2);
    let producer = connect(&server.connection_string()).await;
    send_to_partition(&producer, 0, numbered(0..5)).await;
    send_to_partition(&producer, 1, numbered(0..5)).await;

    let first_client = connect(&server.connection_string()).await;
    let mut first = group_consumer(&first_client);
    first.init().await.expect("the first member joins");
    let mut read_from_partition_one = None;
    for _ in 0..10 {
        let received = next_message(&mut first).await;
        if received.partition_id == 1 {
            read_from_partition_one = Some(received.message.header.offset);
        }
    }
    assert_eq!(
        read_from_partition_one,
        Some(4),
        "both partitions were read"
    );

    let second_client = connect(&server.connection_string()).await;
    let mut second = group_consumer(&second_client);
    second.init().await.expect("the second member joins");
    assert_eq!(
        server.group_assignment(STREAM, TOPIC, GROUP),
        vec![vec![0], vec![]],
        "partition 1 waits for the old owner's commit"
    );

    first
        .store_offset(4, Some(1))
        .await
        .expect("the old owner commits");
    assert_eq!(
        server.group_assignment(STREAM, TOPIC, GROUP),
        vec![vec![0], vec![1]]
    );
    send_to_partition(&producer, 1, numbered(5..6)).await;
    let received = next_message(&mut second).await;
    assert_eq!(
        (received.partition_id, received.message.header.offset),
        (1, 5)
    );
}

#[tokio::test]
async fn a_group_poll_on_a_partition_owned_by_another_member_gets_the_resync_sentinel() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 2);
    let first = connect(&server.connection_string()).await;
    let second = connect(&server.connection_string()).await;
    let group = Identifier::named(GROUP).expect("a name");
    first
        .create_consumer_group(&stream_id(), &topic_id(), GROUP)
        .await
        .expect("the group is created");
    first
        .join_consumer_group(&stream_id(), &topic_id(), &group)
        .await
        .expect("the first member joins");
    second
        .join_consumer_group(&stream_id(), &topic_id(), &group)
        .await
        .expect("the second member joins");

    let polled = first
        .poll_messages(
            &stream_id(),
            &topic_id(),
            Some(1),
            &Consumer::group(group.clone()),
            &PollingStrategy::next(),
            10,
            false,
        )
        .await
        .expect("the poll is answered");
    assert_eq!(polled.partition_id, RESYNC_REQUIRED_PARTITION_SENTINEL);
    let details = first
        .get_consumer_group(&stream_id(), &topic_id(), &group)
        .await
        .expect("the group is read")
        .expect("the group exists");
    assert_eq!(details.members_count, 2);
}

#[tokio::test]
async fn logging_out_leaves_every_group() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    let group = Identifier::named(GROUP).expect("a name");
    client
        .create_consumer_group(&stream_id(), &topic_id(), GROUP)
        .await
        .expect("the group is created");
    client
        .join_consumer_group(&stream_id(), &topic_id(), &group)
        .await
        .expect("the client joins");
    assert_eq!(server.group_members(STREAM, TOPIC, GROUP), 1);

    client.logout_user().await.expect("the client logs out");
    assert_eq!(server.group_members(STREAM, TOPIC, GROUP), 0);
    assert_eq!(
        server.group_assignment(STREAM, TOPIC, GROUP),
        Vec::<Vec<u32>>::new()
    );
}

#[tokio::test]
async fn storing_an_offset_beyond_the_end_is_refused_and_offsets_may_move_back() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    send_to_partition(&client, 0, numbered(0..5)).await;
    let consumer = Consumer::new(Identifier::numeric(3).expect("an id"));
    let store = |offset: u64, partition: u32| {
        let client = &client;
        let consumer = &consumer;
        async move {
            client
                .store_consumer_offset(consumer, &stream_id(), &topic_id(), Some(partition), offset)
                .await
        }
    };
    let stored = || async {
        client
            .get_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0))
            .await
            .expect("the offset is read")
            .map(|offset| offset.stored_offset)
    };

    assert_eq!(stored().await, None, "nothing stored yet");
    let error = store(5, 0).await.expect_err("offset 5 does not exist yet");
    assert_eq!(error.as_code(), 4100, "{error:?}");
    store(4, 0).await.expect("the last offset is accepted");
    assert_eq!(stored().await, Some(4));
    store(1, 0).await.expect("an offset may move backwards");
    assert_eq!(stored().await, Some(1));
    client
        .delete_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0))
        .await
        .expect("the offset is deleted");
    assert_eq!(stored().await, None);
    let error = client
        .delete_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0))
        .await
        .expect_err("nothing left to delete");
    assert_eq!(error.as_code(), 3021, "{error:?}");
    let error = store(0, 7).await.expect_err("partition 7 does not exist");
    assert_eq!(error.as_code(), 20, "{error:?}");
    let error = client
        .get_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(7))
        .await
        .expect_err("partition 7 does not exist");
    assert_eq!(error.as_code(), 3007, "{error:?}");
}

#[tokio::test]
async fn refused_sends_surface_as_client_errors_and_store_nothing() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;

    server.faults().refuse_sends(1);
    let mut batch = numbered(0..10);
    let error = client
        .send_messages(
            &stream_id(),
            &topic_id(),
            &Partitioning::partition_id(0),
            &mut batch,
        )
        .await
        .expect_err("the send is refused");
    assert_eq!(error.as_code(), SEND_REFUSAL_STATUS, "{error:?}");
    assert_eq!(server.message_count(STREAM, TOPIC), 0);
    send_to_partition(&client, 0, numbered(0..10)).await;
    assert_eq!(server.message_count(STREAM, TOPIC), 10);

    let producer = client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .send_retries(Some(2), None)
        .build();
    producer.init().await.expect("the producer initialises");
    server.faults().refuse_sends_until_cleared();
    let sends_before = server.request_count(SEND_MESSAGES_CODE);
    let error = producer
        .send(numbered(10..20))
        .await
        .expect_err("every attempt is refused");
    let IggyError::ProducerSendFailed { cause, failed, .. } = &error else {
        panic!("expected a failed producer send, got {error:?}");
    };
    assert_eq!(cause.as_code(), SEND_REFUSAL_STATUS);
    assert_eq!(failed.len(), 10);
    assert_eq!(server.request_count(SEND_MESSAGES_CODE) - sends_before, 3);
    assert_eq!(server.message_count(STREAM, TOPIC), 10);
    server.faults().clear();
    producer
        .send(numbered(10..20))
        .await
        .expect("sends work again");
    assert_eq!(server.message_count(STREAM, TOPIC), 20);
}

#[tokio::test]
async fn refused_offset_stores_surface_as_client_errors_and_store_nothing() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&server.connection_string()).await;
    send_to_partition(&client, 0, numbered(0..5)).await;
    let consumer = Consumer::new(Identifier::numeric(1).expect("an id"));

    server.faults().refuse_offset_stores(2);
    for _ in 0..2 {
        let error = client
            .store_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0), 3)
            .await
            .expect_err("the store is refused");
        assert_eq!(error.as_code(), OFFSET_STORE_REFUSAL_STATUS, "{error:?}");
    }
    let stored = client
        .get_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0))
        .await
        .expect("the offset is read");
    assert!(stored.is_none(), "a refused store stores nothing");
    client
        .store_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0), 3)
        .await
        .expect("the third store is accepted");
    assert_eq!(server.request_count(STORE_CONSUMER_OFFSET_CODE), 3);

    server.faults().refuse_offset_stores_until_cleared();
    let error = client
        .store_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0), 4)
        .await
        .expect_err("refused until cleared");
    assert_eq!(error.as_code(), OFFSET_STORE_REFUSAL_STATUS);
    server.faults().clear();
    client
        .store_consumer_offset(&consumer, &stream_id(), &topic_id(), Some(0), 4)
        .await
        .expect("stores work again");
}

#[tokio::test]
async fn topic_creation_refused_with_4041_surfaces_that_code() {
    let server = IggyTestServer::start();
    let client = connect(&server.connection_string()).await;
    server.faults().refuse_topic_creation(4041);
    let producer = client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .create_stream_if_not_exists()
        .create_topic_if_not_exists(1, IggyExpiry::NeverExpire, MaxTopicSize::ServerDefault)
        .build();

    let error = producer
        .init()
        .await
        .expect_err("topic creation is refused");
    assert_eq!(error.as_code(), 4041, "{error:?}");
    let topic = client
        .get_topic(&stream_id(), &topic_id())
        .await
        .expect("the topic is read");
    assert!(topic.is_none(), "no topic was created");

    server.faults().clear();
    producer.init().await.expect("creation works once cleared");
    assert_eq!(server.request_count(CREATE_TOPIC_CODE), 2);
}

#[tokio::test]
async fn dropped_connections_make_the_client_reconnect_and_continue() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let producer_client = connect(&quick_reconnect(&server)).await;
    let consumer_client = connect(&quick_reconnect(&server)).await;
    let producer = producer_client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .partitioning(Partitioning::partition_id(0))
        .send_retries(
            Some(20),
            Some(NonZeroIggyDuration::from_str("100ms").expect("ok")),
        )
        .build();
    producer.init().await.expect("the producer initialises");
    let mut consumer = group_consumer(&consumer_client);
    consumer.init().await.expect("the consumer joins");

    producer.send(numbered(0..10)).await.expect("sent");
    for expected in 0..10 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
        consumer
            .store_offset(expected, Some(0))
            .await
            .expect("stored");
    }
    let logins = server.request_count(LOGIN_REGISTER_CODE);
    server.faults().drop_connections();
    assert_eq!(server.connection_count(), 0, "every connection was closed");

    producer
        .send(numbered(10..20))
        .await
        .expect("the producer gets through after reconnecting");
    for expected in 10..20 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
        consumer
            .store_offset(expected, Some(0))
            .await
            .expect("stored");
    }
    assert!(server.request_count(LOGIN_REGISTER_CODE) >= logins + 2);
    assert_eq!(server.message_count(STREAM, TOPIC), 20);
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(19));
}

#[tokio::test]
async fn stalled_replies_hold_the_client_until_the_stall_ends_or_is_cleared() {
    let server = IggyTestServer::start();
    // One heartbeat ping right after connecting, then none: a held heartbeat
    // would hold the reads below behind it.
    let client = connect(&format!(
        "{}?heartbeat_interval=1h",
        server.connection_string()
    ))
    .await;
    wait_until("the first heartbeat", || {
        server.request_count(PING_CODE) >= 1
    })
    .await;

    server.faults().stall_replies(Duration::from_millis(300));
    let started = Instant::now();
    client
        .get_stream(&stream_id())
        .await
        .expect("answered late");
    assert!(started.elapsed() >= Duration::from_millis(300));

    server.faults().stall_replies(Duration::from_secs(600));
    let reads = server.request_count(GET_STREAM_CODE);
    let started = Instant::now();
    let stream = stream_id();
    let held = client.get_stream(&stream);
    tokio::pin!(held);
    tokio::select! {
        _ = &mut held => panic!("the reply must be held"),
        () = wait_until("the server to receive the read", || {
            server.request_count(GET_STREAM_CODE) > reads
        }) => {}
    }
    server.faults().clear();
    held.await.expect("the held reply arrives once cleared");
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn a_restart_keeps_messages_offsets_and_groups() {
    let mut server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let producer_client = connect(&quick_reconnect(&server)).await;
    let consumer_client = connect(&quick_reconnect(&server)).await;
    let producer = producer_client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .partitioning(Partitioning::partition_id(0))
        .send_retries(
            Some(20),
            Some(NonZeroIggyDuration::from_str("100ms").expect("ok")),
        )
        .build();
    producer.init().await.expect("the producer initialises");
    let mut consumer = group_consumer(&consumer_client);
    consumer.init().await.expect("the consumer joins");
    producer.send(numbered(0..10)).await.expect("sent");
    for expected in 0..5 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
    }
    consumer.store_offset(4, Some(0)).await.expect("stored");

    let port = server.address().port();
    server.restart();
    assert_eq!(server.address().port(), port);
    assert_eq!(server.connection_count(), 0);
    assert_eq!(server.message_count(STREAM, TOPIC), 10);
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(4));

    // The member from before the restart stays, a ghost of a session no
    // client presents again (as the real server replays its journaled join).
    assert_eq!(server.group_members(STREAM, TOPIC, GROUP), 1);
    assert_eq!(server.group_assignment(STREAM, TOPIC, GROUP), vec![vec![0]]);

    producer
        .send(numbered(10..20))
        .await
        .expect("the producer gets through after the restart");
    // Messages 5-9 were polled before the restart and are still buffered in
    // the consumer; it hands them over. It signs in again under a new client
    // id; the ghost keeps the only partition.
    for expected in 5..10 {
        let received = next_message(&mut consumer).await;
        assert_eq!(received.message.header.offset, expected);
        let _ = consumer.store_offset(expected, Some(0)).await;
    }
    assert_eq!(
        server.group_assignment(STREAM, TOPIC, GROUP)[0],
        vec![0],
        "the ghost keeps the partition"
    );
    assert_eq!(server.message_count(STREAM, TOPIC), 20);
    assert_eq!(server.stored_offset(STREAM, TOPIC, GROUP, 0), Some(4));
}

#[tokio::test]
async fn connects_are_refused_during_an_outage_and_accepted_after_it() {
    let mut server = IggyTestServer::start();
    let refused = IggyClient::from_connection_string(&format!(
        "{}?reconnection_retries=0",
        server.connection_string()
    ))
    .expect("a valid connection string");

    server.begin_outage();
    let error = refused.connect().await.expect_err("nobody listens");
    assert!(
        matches!(error, IggyError::CannotEstablishConnection),
        "{error:?}"
    );
    server.end_outage();
    let client = connect(&server.connection_string()).await;
    client.ping().await.expect("the server answers again");
}

#[tokio::test]
async fn a_lost_reply_makes_a_retried_send_a_duplicate_and_a_lost_request_does_not() {
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let client = connect(&quick_reconnect(&server)).await;
    let producer = client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .partitioning(Partitioning::partition_id(0))
        .send_retries(
            Some(20),
            Some(NonZeroIggyDuration::from_str("100ms").expect("ok")),
        )
        .build();
    producer.init().await.expect("the producer initialises");

    server.faults().lose_replies(SEND_MESSAGES_CODE, 1);
    producer
        .send(numbered(0..5))
        .await
        .expect("the retry succeeds");
    assert_eq!(server.message_count(STREAM, TOPIC), 10, "stored twice");

    server.faults().lose_requests(SEND_MESSAGES_CODE, 1);
    producer
        .send(numbered(5..10))
        .await
        .expect("the retry succeeds");
    assert_eq!(server.message_count(STREAM, TOPIC), 15, "stored once");
}

#[tokio::test]
async fn a_throughput_smoke_moves_100k_messages_through_a_producer_and_a_group_consumer() {
    const MESSAGES: u64 = 100_000;
    const BATCH: u64 = 1_000;
    let server = IggyTestServer::start();
    server.create_topic(STREAM, TOPIC, 1);
    let producer_client = connect(&server.connection_string()).await;
    let consumer_client = connect(&server.connection_string()).await;
    let producer = producer_client
        .producer(STREAM, TOPIC)
        .expect("valid names")
        .partitioning(Partitioning::balanced())
        .build();
    producer.init().await.expect("the producer initialises");
    let payload = Bytes::from(vec![b'x'; 200]);

    let started = Instant::now();
    for _ in 0..MESSAGES / BATCH {
        let batch = (0..BATCH)
            .map(|_| {
                IggyMessage::builder()
                    .payload(payload.clone())
                    .build()
                    .expect("a message")
            })
            .collect();
        producer.send(batch).await.expect("the batch is accepted");
    }
    let produced_in = started.elapsed();
    assert_eq!(server.message_count(STREAM, TOPIC), MESSAGES);
    assert_eq!(server.request_count(SEND_MESSAGES_CODE), MESSAGES / BATCH);

    let mut consumer = group_consumer(&consumer_client);
    consumer.init().await.expect("the consumer joins");
    let started = Instant::now();
    let mut received = 0u64;
    let mut bytes = 0usize;
    while received < MESSAGES {
        let message = next_message(&mut consumer).await;
        assert_eq!(message.message.header.offset, received);
        bytes += message.message.payload.len();
        received += 1;
        if message.message.header.offset % BATCH == BATCH - 1 {
            consumer
                .store_offset(message.message.header.offset, Some(message.partition_id))
                .await
                .expect("the offset is stored");
        }
    }
    let consumed_in = started.elapsed();
    assert_eq!(bytes, 200 * MESSAGES as usize);
    assert_eq!(
        server.stored_offset(STREAM, TOPIC, GROUP, 0),
        Some(MESSAGES - 1)
    );

    let rate = |elapsed: Duration| MESSAGES as f64 / elapsed.as_secs_f64();
    println!(
        "throughput smoke (debug build): produced {MESSAGES} msgs in {produced_in:?} ({:.0} msg/s), \
         consumed in {consumed_in:?} ({:.0} msg/s)",
        rate(produced_in),
        rate(consumed_in)
    );
}
