//! The iggy client alone, as the reference the pipelines are compared with:
//! `send_messages` of ready payloads in batches, one request in flight (what a
//! source pipeline does), and a group consumer that stores offsets by hand
//! after each batch (what a sink pipeline does). Also fills topics for the
//! sink cases.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;
use iggy::prelude::{
    AutoCommit, Client, Identifier, IggyClient, IggyDuration, IggyMessage, MessageClient,
    Partitioning, PollingStrategy, StreamClient, TopicClient, TopicCreateOptions,
};

use super::Iggy;

/// A connected client with the stream and topic (one partition) created.
pub async fn topic(iggy: &Iggy, stream: &str, topic: &str) -> Arc<IggyClient> {
    let client = iggy.settings().connect().await.expect("connect to Iggy");
    let stream_id = Identifier::named(stream).expect("stream name");
    if client
        .get_stream(&stream_id)
        .await
        .expect("get stream")
        .is_none()
    {
        client.create_stream(stream).await.expect("create stream");
    }
    let topic_id = Identifier::named(topic).expect("topic name");
    if client
        .get_topic(&stream_id, &topic_id)
        .await
        .expect("get topic")
        .is_none()
    {
        let options = TopicCreateOptions {
            partitions_count: Some(1),
            ..TopicCreateOptions::default()
        };
        client
            .create_topic(&stream_id, topic, &options)
            .await
            .expect("create topic");
    }
    client
}

/// The sink cases' message `n`: a JSON document of about 130 bytes.
pub fn document(n: u64) -> Bytes {
    serde_json::to_vec(&serde_json::json!({"id": n, "name": "bench", "text": "x".repeat(100)}))
        .expect("json")
        .into()
}

/// A topic (as [`topic`]) holding `count` [`document`]s, for a sink case.
pub async fn topic_of_documents(
    iggy: &Iggy,
    stream: &str,
    topic_name: &str,
    count: u64,
) -> Arc<IggyClient> {
    let client = topic(iggy, stream, topic_name).await;
    send(&client, stream, topic_name, count, 1000, document).await;
    client
}

/// Sends `count` messages with payloads from `payload(n)`, `batch` per
/// request, one request in flight. Returns each request's duration.
pub async fn send(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    count: u64,
    batch: u64,
    payload: impl Fn(u64) -> Bytes,
) -> Vec<Duration> {
    let stream = Identifier::named(stream).expect("stream name");
    let topic = Identifier::named(topic).expect("topic name");
    let partitioning = Partitioning::balanced();
    let mut durations = Vec::with_capacity((count / batch + 1) as usize);
    let mut next = 0;
    while next < count {
        let end = (next + batch).min(count);
        let started = Instant::now();
        let mut messages: Vec<IggyMessage> = (next..end)
            .map(|n| {
                IggyMessage::builder()
                    .id(u128::from(n) + 1)
                    .payload(payload(n))
                    .build()
                    .expect("message")
            })
            .collect();
        client
            .send_messages(&stream, &topic, &partitioning, &mut messages)
            .await
            .expect("send");
        durations.push(started.elapsed());
        next = end;
    }
    durations
}

/// Reads `count` messages through consumer group `group`, `batch` at a time,
/// storing the offset after each batch. Returns each batch's duration (first
/// message received to offset stored) and the payload bytes read.
pub async fn consume(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    group: &str,
    count: u64,
    batch: u32,
) -> (Vec<Duration>, u64) {
    let mut builder = client
        .consumer_group(group, stream, topic)
        .expect("consumer group")
        .auto_commit(AutoCommit::Disabled)
        .polling_strategy(PollingStrategy::next())
        .batch_length(batch)
        .create_consumer_group_if_not_exists()
        .auto_join_consumer_group();
    // As the engine's consumer does: no interval at all for 0.
    let interval = super::poll_interval();
    if !interval.is_zero() {
        builder = builder.poll_interval(IggyDuration::from(interval));
    }
    let mut consumer = builder.build();
    consumer.init().await.expect("join group");
    let mut durations = Vec::with_capacity((count / u64::from(batch) + 1) as usize);
    let (mut read, mut bytes) = (0u64, 0u64);
    while read < count {
        let mut started = None;
        let mut in_batch = 0;
        let mut last = None;
        while in_batch < batch && read < count {
            let message = consumer
                .next()
                .await
                .expect("consumer stream")
                .expect("poll");
            started.get_or_insert_with(Instant::now);
            bytes += message.message.payload.len() as u64;
            in_batch += 1;
            read += 1;
            last = Some((message.partition_id, message.message.header.offset));
            if message.message.header.offset >= message.current_offset {
                break;
            }
        }
        if let Some((partition_id, offset)) = last {
            consumer
                .store_offset(offset, Some(partition_id))
                .await
                .expect("store offset");
        }
        if let Some(started) = started {
            durations.push(started.elapsed());
        }
    }
    let _ = consumer.shutdown().await;
    (durations, bytes)
}

/// Deletes the stream on a shared server (a no-op error on the test server).
pub async fn drop_stream(client: &IggyClient, stream: &str) {
    if let Ok(stream) = Identifier::named(stream) {
        let _ = client.delete_stream(&stream).await;
    }
    let _ = client.shutdown().await;
}
