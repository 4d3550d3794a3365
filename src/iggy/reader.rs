//! Reading a topic without a consumer group (the dead-letter list and
//! replay): a standalone consumer that stores no offset.

use std::time::Duration;

use iggy::prelude::{
    Consumer as IggyConsumerId, Identifier, IggyClient, IggyError, MessageClient, PollingStrategy,
};

use crate::iggy::BusError;
use crate::iggy::headers;
use crate::message::ConsumedMessage;

/// Reads one partition from `from` on as a standalone consumer, storing
/// nothing; a missing stream, topic or partition reads as empty.
pub(super) async fn read(
    client: &IggyClient,
    (stream, topic): (&str, &str),
    partition_id: u32,
    from: u64,
    count: u32,
    request_timeout: Duration,
) -> Result<Vec<ConsumedMessage>, BusError> {
    let named = |name: &str| {
        Identifier::named(name).map_err(|error| BusError::Setup {
            stream: stream.to_owned(),
            topic: topic.to_owned(),
            reason: format!("invalid name \"{name}\": {error}"),
        })
    };
    let reader = IggyConsumerId::new(named("iggy-connect-reader")?);
    let (stream_id, topic_id) = (named(stream)?, named(topic)?);
    let strategy = PollingStrategy::offset(from);
    let request = client.poll_messages(
        &stream_id,
        &topic_id,
        Some(partition_id),
        &reader,
        &strategy,
        count,
        false,
    );
    let polled = match tokio::time::timeout(request_timeout, request).await {
        Err(_) => {
            return Err(BusError::Unavailable(format!(
                "no answer from Iggy within {request_timeout:?} reading {stream}/{topic}"
            )));
        }
        Ok(Ok(polled)) => polled,
        Ok(Err(
            IggyError::ResourceNotFound(_)
            | IggyError::StreamNameNotFound(_)
            | IggyError::StreamIdNotFound(_)
            | IggyError::TopicNameNotFound(..)
            | IggyError::TopicIdNotFound(..)
            | IggyError::PartitionNotFound(..),
        )) => return Ok(Vec::new()),
        Ok(Err(error)) => {
            return Err(BusError::Poll(format!(
                "reading {stream}/{topic} partition {partition_id}: {error}"
            )));
        }
    };
    Ok(polled
        .messages
        .into_iter()
        .map(|message| {
            let headers = headers::from_iggy(&message);
            let header = message.header;
            ConsumedMessage {
                id: header.id,
                offset: header.offset,
                partition_id,
                timestamp: header.timestamp,
                origin_timestamp: header.origin_timestamp,
                checksum: header.checksum,
                headers,
                payload: message.payload,
            }
        })
        .collect())
}
