//! The source side of the Iggy bus: make sure the stream and topic exist, then
//! send batches, reporting success only when the server acknowledged them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use iggy::prelude::{
    Client, Durability, Identifier, IggyClient, IggyError, IggyTimestamp, StreamClient,
    TopicClient, TopicCreateOptions,
};
use iggy_binary_protocol::codes::SEND_MESSAGES_CODE;
use iggy_binary_protocol::requests::messages::{RawMessage, SendMessagesEncoder};
use iggy_binary_protocol::{WireError, WireIdentifier, WirePartitioning};
use iggy_common::wire_conversions::identifier_to_wire;
use rand::RngExt;
use tracing::info;

use crate::config::runtime::TopicDurability;
use crate::iggy::headers;
use crate::iggy::{BusError, Prepared, Producer, ProducerTarget};
use crate::message::OutgoingMessage;

/// Iggy refuses payloads larger than this (bytes).
const MAX_PAYLOAD_SIZE: usize = 64_000_000;

pub struct IggyProducer {
    /// Over TCP (`connection.rs` makes no other client): requests are
    /// encoded here and sent as bytes.
    client: Arc<IggyClient>,
    /// The stream and topic in wire form.
    stream: WireIdentifier,
    topic: WireIdentifier,
    target: String,
    batch_length: usize,
    request_timeout: Duration,
    created_volatile_topic: bool,
    /// The topic's partition count when the producer opened: where a message
    /// that keeps its origin's partition goes (`partition % partitions`).
    partitions: u32,
    /// The next partition of a balanced request, round robin as the client's
    /// own balancing does.
    balanced: AtomicU32,
}

impl IggyProducer {
    /// Ensures `target`'s stream and topic exist on `client`, creating them when
    /// missing, and returns a producer for the topic.
    pub async fn open(
        client: Arc<IggyClient>,
        target: &ProducerTarget,
        request_timeout: Duration,
        durability: TopicDurability,
    ) -> Result<Self, BusError> {
        let stream = identifier(&target.stream, target)?;
        let topic = identifier(&target.topic, target)?;
        let timed = |what: &'static str| {
            move |_| {
                BusError::Unavailable(format!(
                    "{what} of {}/{} timed out",
                    target.stream, target.topic
                ))
            }
        };
        let unavailable = |what: &str, error: IggyError| {
            BusError::Unavailable(format!(
                "{what} {}/{}: {error}",
                target.stream, target.topic
            ))
        };
        let stream_exists = tokio::time::timeout(request_timeout, client.get_stream(&stream))
            .await
            .map_err(timed("reading the stream"))?
            .map_err(|error| unavailable("cannot read stream of", error))?
            .is_some();
        if !stream_exists {
            match tokio::time::timeout(request_timeout, client.create_stream(&target.stream))
                .await
                .map_err(timed("creating the stream"))?
            {
                Ok(_) => info!(stream = %target.stream, "created stream"),
                // Another instance created it in the meantime.
                Err(IggyError::StreamNameAlreadyExists(_)) => {}
                Err(error) => return Err(refused("the stream", target, &error)),
            }
        }
        let existing = tokio::time::timeout(request_timeout, client.get_topic(&stream, &topic))
            .await
            .map_err(timed("reading the topic"))?
            .map_err(|error| unavailable("cannot read topic", error))?;
        let mut partitions = existing
            .as_ref()
            .map_or(target.partitions, |details| details.partitions_count);
        let mut created_volatile_topic = false;
        if existing.is_none() {
            let options = TopicCreateOptions {
                partitions_count: Some(target.partitions),
                durability: match durability {
                    TopicDurability::Replicated => Durability::Replicated,
                    TopicDurability::Persisted => Durability::Persisted,
                },
                ..TopicCreateOptions::default()
            };
            match tokio::time::timeout(
                request_timeout,
                client.create_topic(&stream, &target.topic, &options),
            )
            .await
            .map_err(timed("creating the topic"))?
            {
                Ok(_) => {
                    created_volatile_topic = durability != TopicDurability::Persisted;
                    info!(stream = %target.stream, topic = %target.topic, partitions = target.partitions, ?durability, "created topic")
                }
                Err(IggyError::TopicNameAlreadyExists(..)) => {
                    // Another instance created it: ask for its partitions.
                    if let Ok(Ok(Some(details))) =
                        tokio::time::timeout(request_timeout, client.get_topic(&stream, &topic))
                            .await
                    {
                        partitions = details.partitions_count;
                    }
                }
                Err(error) => return Err(refused("the topic", target, &error)),
            }
        }
        let wire = |id: &Identifier| {
            identifier_to_wire(id).map_err(|error| BusError::Setup {
                stream: target.stream.clone(),
                topic: target.topic.clone(),
                reason: format!("invalid name \"{id}\": {error}"),
            })
        };
        let (stream, topic) = (wire(&stream)?, wire(&topic)?);
        Ok(Self {
            client,
            stream,
            topic,
            target: format!("{}/{}", target.stream, target.topic),
            batch_length: target.batch_length.max(1) as usize,
            request_timeout,
            created_volatile_topic,
            partitions: partitions.max(1),
            balanced: AtomicU32::new(0),
        })
    }

    /// The requests for `messages`: a run of one target partition at a
    /// time (a message that keeps its origin's partition goes to the
    /// partition it maps to; the rest are balanced), in requests of
    /// `batch_length`. Runs are cut where the target partition changes, not
    /// the origin's value: a key hash is a different value per key, and a
    /// request per message made a keyed source 40 times slower.
    fn requests(&self, messages: &[OutgoingMessage]) -> Result<Vec<Bytes>, BusError> {
        let target = |message: &OutgoingMessage| {
            message
                .partition
                .map(|partition| partition % self.partitions)
        };
        let origin_timestamp = IggyTimestamp::now().as_micros();
        let mut requests = Vec::new();
        for run in messages.chunk_by(|a, b| target(a) == target(b)) {
            for chunk in run.chunks(self.batch_length) {
                // Balanced as the client balances: round robin over the
                // topic's partitions, one request at a time.
                let partition = target(&chunk[0]).unwrap_or_else(|| {
                    self.balanced.fetch_add(1, Ordering::Relaxed) % self.partitions
                });
                let request = encode(
                    &self.stream,
                    &self.topic,
                    partition,
                    chunk,
                    origin_timestamp,
                )
                .map_err(BusError::Send)?;
                requests.push(request);
            }
        }
        Ok(requests)
    }

    /// Sends the requests one after the other, each acknowledged before the
    /// next.
    async fn send_requests(&self, requests: &[Bytes]) -> Result<(), BusError> {
        for request in requests {
            let sent = tokio::time::timeout(
                self.request_timeout,
                self.client
                    .send_binary_request(SEND_MESSAGES_CODE, request.clone()),
            )
            .await;
            match sent {
                Ok(Ok(_)) => {}
                Ok(Err(error)) => {
                    return Err(BusError::Send(format!(
                        "{}: {error} (code {})",
                        self.target,
                        error.as_code()
                    )));
                }
                Err(_) => {
                    return Err(BusError::Send(format!(
                        "{}: no acknowledgement within {:?}",
                        self.target, self.request_timeout
                    )));
                }
            }
        }
        Ok(())
    }
}

#[async_trait]
impl Producer for IggyProducer {
    async fn send(&self, messages: &[OutgoingMessage]) -> Result<(), BusError> {
        self.send_requests(&self.requests(messages)?).await
    }

    /// Encodes the requests now. Sent again after a failure, they go to the
    /// same partitions with the same ids and timestamps. A batch that cannot
    /// be encoded is left to the send, which reports why.
    fn prepare(&self, messages: Vec<OutgoingMessage>) -> Prepared {
        match self.requests(&messages) {
            Ok(requests) => Prepared { messages, requests },
            Err(_) => Prepared::from(messages),
        }
    }

    async fn send_prepared(&self, prepared: &Prepared) -> Result<(), BusError> {
        if prepared.requests.is_empty() {
            return self.send(&prepared.messages).await;
        }
        self.send_requests(&prepared.requests).await
    }

    fn created_volatile_topic(&self) -> bool {
        self.created_volatile_topic
    }

    fn check(&self, message: &OutgoingMessage) -> Result<(), String> {
        if message.payload.is_empty() {
            return Err("Iggy does not store empty payloads".into());
        }
        if message.payload.len() > MAX_PAYLOAD_SIZE {
            return Err(format!(
                "payload of {} bytes exceeds Iggy's limit of {MAX_PAYLOAD_SIZE}",
                message.payload.len()
            ));
        }
        headers::check(&message.headers).map(drop)
    }
}

impl Drop for IggyProducer {
    fn drop(&mut self) {
        let client = self.client.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = client.shutdown().await;
            });
        }
    }
}

/// A send request for `messages`, encoded straight from them: the client's
/// `send_messages` takes its own message type (a vector of them per request,
/// a payload handle cloned and dropped per message) and turns it into the
/// same borrowed form first. A message without an id gets a random one, as
/// the client would give it, from the thread's generator rather than a
/// system call per message; one without an origin timestamp gets the
/// request's, read once (a clock read per message was about 5% of a
/// source's CPU time). `check` already refused what Iggy cannot store.
fn encode(
    stream: &WireIdentifier,
    topic: &WireIdentifier,
    partition: u32,
    messages: &[OutgoingMessage],
    origin_timestamp: u64,
) -> Result<Bytes, String> {
    if messages.iter().any(|message| message.payload.is_empty()) {
        return Err("invalid message: empty payload".into());
    }
    let mut wire = BytesMut::new();
    let headers = messages
        .iter()
        .map(|message| headers::put_wire(&message.headers, &mut wire))
        .collect::<Result<Vec<_>, String>>()?;
    let wire = wire.freeze();
    let mut rng = rand::rng();
    let raw = messages
        .iter()
        .zip(headers)
        .map(|(message, headers)| RawMessage {
            id: message
                .id
                .filter(|id| *id != 0)
                .unwrap_or_else(|| rng.random::<u128>().max(1)),
            origin_timestamp: message.origin_timestamp.unwrap_or(origin_timestamp),
            headers: headers.map(|range| &wire[range]),
            payload: &message.payload,
        })
        .collect::<Vec<_>>();
    let partitioning = WirePartitioning::PartitionId(partition);
    let mut request = BytesMut::with_capacity(SendMessagesEncoder::encoded_size(
        stream,
        topic,
        &partitioning,
        &raw,
    ));
    SendMessagesEncoder::encode(&mut request, stream, topic, &partitioning, &raw).map_err(
        |error| match error {
            WireError::InvalidMessageTimestampDelta(delta) => {
                IggyError::InvalidMessageTimestampDelta(delta).to_string()
            }
            other => format!("cannot encode the request: {other}"),
        },
    )?;
    Ok(request.freeze())
}

fn identifier(name: &str, target: &ProducerTarget) -> Result<Identifier, BusError> {
    Identifier::named(name).map_err(|error| BusError::Setup {
        stream: target.stream.clone(),
        topic: target.topic.clone(),
        reason: format!("invalid name \"{name}\": {error}"),
    })
}

/// The server refused to create something: a setup error naming the stream, the
/// topic and the server's answer. Connection trouble stays retryable.
fn refused(what: &str, target: &ProducerTarget, error: &IggyError) -> BusError {
    if matches!(
        error,
        IggyError::Disconnected
            | IggyError::NotConnected
            | IggyError::CannotEstablishConnection
            | IggyError::TcpError
    ) {
        return BusError::Unavailable(format!(
            "creating {what} {}/{}: {error}",
            target.stream, target.topic
        ));
    }
    BusError::Setup {
        stream: target.stream.clone(),
        topic: target.topic.clone(),
        reason: format!(
            "the server refused to create {what}: {error} (code {})",
            error.as_code()
        ),
    }
}

#[cfg(test)]
mod tests {
    use iggy_binary_protocol::WireDecode;
    use iggy_binary_protocol::batch::decode_batch_slice;
    use iggy_binary_protocol::requests::messages::SendMessagesHeader;

    use super::*;
    use crate::message::HeaderValue;

    #[test]
    fn given_outgoing_messages_when_encoded_should_decode_as_the_server_reads_them() {
        let stream = WireIdentifier::named("s").unwrap();
        let topic = WireIdentifier::named("t").unwrap();
        let mut keyed = OutgoingMessage::new(
            Some(7),
            vec![("k".into(), HeaderValue::String("v".into()))],
            Bytes::from_static(b"second"),
        );
        keyed.origin_timestamp = Some(1_500);
        let messages = [
            OutgoingMessage::new(None, Vec::new(), Bytes::from_static(b"first")),
            keyed,
            OutgoingMessage::new(
                None,
                vec![("n".into(), HeaderValue::Int(3))],
                Bytes::from_static(b"third"),
            ),
        ];

        let request = encode(&stream, &topic, 3, &messages, 1_000).unwrap();

        let metadata = u32::from_le_bytes(request[..4].try_into().unwrap()) as usize;
        let (header, _) = SendMessagesHeader::decode(&request[4..4 + metadata]).unwrap();
        assert_eq!(
            (header.stream_id, header.topic_id, header.partitioning),
            (stream, topic, WirePartitioning::PartitionId(3))
        );
        assert_eq!(header.messages_count, 3);
        let batch = decode_batch_slice(&request[4 + metadata..]).unwrap();
        let frames: Vec<_> = batch.iter().collect();
        assert_ne!(frames[0].header.id, 0, "a message without an id gets one");
        assert_eq!(frames[0].payload, b"first");
        assert_eq!(frames[0].user_headers, b"");
        assert_eq!(frames[1].header.id, 7);
        assert_eq!(frames[1].payload, b"second");
        // The batch's headers share one buffer: each frame gets its own.
        for index in [1, 2] {
            assert_eq!(
                Some(Bytes::copy_from_slice(frames[index].user_headers)),
                headers::tests::to_wire(&messages[index].headers).unwrap()
            );
        }
        assert_eq!(batch.header.origin_timestamp, 1_000);
        assert_eq!(frames[1].header.timestamp_delta, 500);
    }

    #[test]
    fn given_an_empty_payload_when_encoded_should_refuse_the_request() {
        let name = WireIdentifier::named("s").unwrap();
        let messages = [OutgoingMessage::new(None, Vec::new(), Bytes::new())];
        assert!(encode(&name, &name, 0, &messages, 0).is_err());
    }
}
