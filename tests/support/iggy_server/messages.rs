//! The data path: send (101), poll (100) and consumer offsets (120-122).

use super::commands::{missing_status, status};
use super::state::{ConsumerKey, State, Topic, now_micros};
use super::wire::Reply;
use bytes::BytesMut;
use iggy_binary_protocol::batch::decode_batch_slice;
use iggy_binary_protocol::codec::{WireDecode, WireEncode};
use iggy_binary_protocol::consensus::HEADER_SIZE;
use iggy_binary_protocol::requests::consumer_offsets::{
    DeleteConsumerOffsetRequest, GetConsumerOffsetRequest, StoreConsumerOffsetRequest,
};
use iggy_binary_protocol::requests::messages::{PollMessagesRequest, SendMessagesHeader};
use iggy_binary_protocol::responses::consumer_offsets::get_consumer_offset::ConsumerOffsetResponse;
use iggy_binary_protocol::responses::messages::poll_messages::PollMessagesResponseHeader;
use iggy_binary_protocol::responses::messages::send_messages::{
    SendMessagesConfirmationResponse, SendMessagesResponse,
};
use iggy_binary_protocol::{KIND_CONSUMER_GROUP, WireConsumer, WireError, WirePartitioning};
use iggy_common::RESYNC_REQUIRED_PARTITION_SENTINEL;
use std::time::Instant;

const POLL_HEADER_SIZE: usize = 16;

const STRATEGY_OFFSET: u8 = 1;
const STRATEGY_TIMESTAMP: u8 = 2;
const STRATEGY_FIRST: u8 = 3;
const STRATEGY_LAST: u8 = 4;
const STRATEGY_NEXT: u8 = 5;

/// `[metadata_len:u32][stream][topic][partitioning][count:u32][batch]`.
/// Verifies every frame checksum and the batch checksum, then stamps and
/// stores the batch as received. `None` means the body did not decode.
pub(crate) fn send(state: &mut State, mut body: BytesMut) -> Option<Reply> {
    let metadata_len = u32::from_le_bytes(body.get(..4)?.try_into().ok()?) as usize;
    let (header, used) = SendMessagesHeader::decode(body.get(4..4 + metadata_len)?).ok()?;
    if used != metadata_len {
        return None;
    }
    let Ok(topic) = state.topic_mut(&header.stream_id, &header.topic_id) else {
        return Some(Reply::denied(status::RESOURCE_NOT_FOUND));
    };
    // The 0.11.0 client always resolves the partition itself; a request
    // without an explicit partition is refused like a missing one.
    let WirePartitioning::PartitionId(partition_id) = header.partitioning else {
        return Some(Reply::denied(status::RESOURCE_NOT_FOUND));
    };
    let (stream_id, topic_id) = (topic.stream_id, topic.id);
    let Some(partition) = topic.partitions.get_mut(partition_id as usize) else {
        return Some(Reply::denied(status::RESOURCE_NOT_FOUND));
    };
    let record = body.split_off(4 + metadata_len);
    let count = match decode_batch_slice(&record) {
        Ok(batch) if batch.header.total_size() != record.len() => return None,
        Ok(batch) => batch.message_count(),
        Err(WireError::InvalidBatchChecksum { .. }) => {
            return Some(Reply::denied(status::INVALID_BATCH_CHECKSUM));
        }
        Err(WireError::InvalidMessageChecksum { .. }) => {
            return Some(Reply::denied(status::INVALID_MESSAGE_CHECKSUM));
        }
        Err(_) => return None,
    };
    if count == 0 || count != header.messages_count {
        return Some(Reply::denied(status::INVALID_MESSAGES_COUNT));
    }
    let base_offset = partition
        .log
        .append(record, partition_id, count, now_micros());
    let op = partition.next_op();
    Some(
        Reply::read(&SendMessagesResponse {
            confirmations: vec![SendMessagesConfirmationResponse {
                stream_id,
                topic_id,
                partition_id,
                base_offset,
            }],
        })
        .at_op(op),
    )
}

fn poll_header(partition_id: u32, current_offset: u64) -> Reply {
    Reply::read(&PollMessagesResponseHeader {
        partition_id,
        current_offset,
        messages_count: 0,
    })
}

fn is_group(consumer: &WireConsumer) -> bool {
    consumer.kind == KIND_CONSUMER_GROUP
}

fn stored_offset(topic: &Topic, consumer: &WireConsumer, partition: u32) -> Option<u64> {
    if is_group(consumer) {
        let index = topic.group_index(&consumer.id)?;
        topic.groups[index].offsets[partition as usize]
    } else {
        let key = (ConsumerKey::from(&consumer.id), partition);
        topic.consumer_offsets.get(&key).copied()
    }
}

/// Answers at once (there is no long poll in this protocol version): a
/// 16-byte header, then the stored records covering the requested range.
pub(crate) fn poll(state: &mut State, client: u128, request: &PollMessagesRequest) -> Reply {
    let timeout = state.config.rebalancing_timeout;
    let topic = match state.topic_mut(&request.stream_id, &request.topic_id) {
        Ok(topic) => topic,
        Err(missing) => return Reply::denied(missing_status(missing)),
    };
    let group = if is_group(&request.consumer) {
        let Some(partition_id) = request.partition_id else {
            return poll_header(0, 0);
        };
        if partition_id as usize >= topic.partitions.len() {
            return Reply::denied(status::PARTITION_NOT_FOUND);
        }
        // A non-member, a partition owned by someone else and a partition
        // being revoked all get the re-sync sentinel.
        let Some(index) = topic.group_index(&request.consumer.id) else {
            return poll_header(RESYNC_REQUIRED_PARTITION_SENTINEL, 0);
        };
        let group = &mut topic.groups[index];
        group.expire_revocations(Instant::now(), timeout);
        if !group.owns(client, partition_id) {
            return poll_header(RESYNC_REQUIRED_PARTITION_SENTINEL, 0);
        }
        Some(index)
    } else {
        None
    };
    let partition_id = request.partition_id.unwrap_or(0);
    let stored = stored_offset(topic, &request.consumer, partition_id);
    let Some(partition) = topic.partitions.get(partition_id as usize) else {
        return Reply::denied(status::PARTITION_NOT_FOUND);
    };
    let log = &partition.log;
    let value = request.strategy.value;
    let start = match request.strategy.kind {
        STRATEGY_OFFSET => value,
        STRATEGY_TIMESTAMP => log.offset_at_timestamp(value),
        STRATEGY_FIRST => 0,
        STRATEGY_LAST => log.next_offset().saturating_sub(u64::from(request.count)),
        STRATEGY_NEXT => stored.map_or(0, |offset| offset + 1),
        _ => return Reply::denied(status::INVALID_COMMAND),
    };

    let available = log.next_offset().saturating_sub(start);
    let wanted = available.min(u64::from(request.count));
    let average = log.size_bytes() / log.messages_count().max(1);
    let estimate = usize::try_from(wanted * average).unwrap_or(usize::MAX);
    let mut reply = Reply::with_capacity(POLL_HEADER_SIZE + estimate.min(64 << 20));
    PollMessagesResponseHeader {
        partition_id,
        current_offset: log.current_offset(),
        messages_count: 0,
    }
    .encode(reply.body_mut());
    let read = log.read_into(start, request.count, reply.body_mut());
    let count_at = HEADER_SIZE + 12;
    reply.body_mut()[count_at..count_at + 4].copy_from_slice(&read.messages.to_le_bytes());

    if let Some(last) = read.last_offset {
        if let Some(index) = group {
            topic.groups[index].record_served(partition_id, last);
        }
        // Auto-commit stores the offset of the last message returned.
        if request.auto_commit {
            match group {
                Some(index) => topic.groups[index].store_offset(partition_id, last),
                None => {
                    let key = (ConsumerKey::from(&request.consumer.id), partition_id);
                    topic.consumer_offsets.insert(key, last);
                }
            }
        }
    }
    reply
}

/// Checks that a group consumer names a group `client` is a member of;
/// `Ok(None)` for a standalone consumer.
fn member_group(
    topic: &mut Topic,
    consumer: &WireConsumer,
    client: u128,
    timeout: std::time::Duration,
) -> Result<Option<usize>, u32> {
    if !is_group(consumer) {
        return Ok(None);
    }
    let index = topic
        .group_index(&consumer.id)
        .ok_or(status::RESOURCE_NOT_FOUND)?;
    let group = &mut topic.groups[index];
    group.expire_revocations(Instant::now(), timeout);
    if group.is_member(client) {
        Ok(Some(index))
    } else {
        Err(status::RESOURCE_NOT_FOUND)
    }
}

/// Stores an offset (it may move backwards). Every refusal is a status:
/// 20 for a missing stream, topic, partition or group membership, 4100 for
/// an offset past the partition's last message.
pub(crate) fn store_offset(
    state: &mut State,
    client: u128,
    request: &StoreConsumerOffsetRequest,
) -> Reply {
    let timeout = state.config.rebalancing_timeout;
    let Ok(topic) = state.topic_mut(&request.stream_id, &request.topic_id) else {
        return Reply::denied(status::RESOURCE_NOT_FOUND);
    };
    let Some(partition_id) = request
        .partition_id
        .filter(|&id| (id as usize) < topic.partitions.len())
    else {
        return Reply::denied(status::RESOURCE_NOT_FOUND);
    };
    let group = match member_group(topic, &request.consumer, client, timeout) {
        Ok(group) => group,
        Err(code) => return Reply::denied(code),
    };
    let partition = &mut topic.partitions[partition_id as usize];
    if request.offset > partition.log.current_offset() {
        return Reply::denied(status::INVALID_OFFSET);
    }
    let op = partition.next_op();
    match group {
        Some(index) => topic.groups[index].store_offset(partition_id, request.offset),
        None => {
            let key = (ConsumerKey::from(&request.consumer.id), partition_id);
            topic.consumer_offsets.insert(key, request.offset);
        }
    }
    Reply::committed_empty().at_op(op)
}

/// `[partition][current_offset][stored_offset]`, or an empty body when
/// nothing is stored (or the stream or topic is missing).
pub(crate) fn get_offset(state: &mut State, request: &GetConsumerOffsetRequest) -> Reply {
    let Ok(topic) = state.topic(&request.stream_id, &request.topic_id) else {
        return Reply::empty();
    };
    let partition_id = request.partition_id.unwrap_or(0);
    let Some(partition) = topic.partitions.get(partition_id as usize) else {
        return Reply::denied(status::PARTITION_NOT_FOUND);
    };
    match stored_offset(topic, &request.consumer, partition_id) {
        Some(stored_offset) => Reply::read(&ConsumerOffsetResponse {
            partition_id,
            current_offset: partition.log.current_offset(),
            stored_offset,
        }),
        None => Reply::empty(),
    }
}

/// Deletes a stored offset; result-framed like the store.
pub(crate) fn delete_offset(
    state: &mut State,
    client: u128,
    request: &DeleteConsumerOffsetRequest,
) -> Reply {
    let timeout = state.config.rebalancing_timeout;
    let Ok(topic) = state.topic_mut(&request.stream_id, &request.topic_id) else {
        return Reply::denied(status::RESOURCE_NOT_FOUND);
    };
    let Some(partition_id) = request
        .partition_id
        .filter(|&id| (id as usize) < topic.partitions.len())
    else {
        return Reply::denied(status::RESOURCE_NOT_FOUND);
    };
    let group = match member_group(topic, &request.consumer, client, timeout) {
        Ok(group) => group,
        Err(code) => return Reply::denied(code),
    };
    let op = topic.partitions[partition_id as usize].next_op();
    let removed = match group {
        Some(index) => topic.groups[index].offsets[partition_id as usize].take(),
        None => {
            let key = (ConsumerKey::from(&request.consumer.id), partition_id);
            topic.consumer_offsets.remove(&key)
        }
    };
    match removed {
        Some(_) => Reply::committed_empty().at_op(op),
        None => Reply::rejected(status::CONSUMER_OFFSET_NOT_FOUND).at_op(op),
    }
}
