//! A partition's message log: stamped batches kept as the bytes they arrived
//! in, plus a small index for seeking.
//!
//! Appends are O(1) and copy nothing (a batch is a slice of the request
//! buffer). Reads binary-search the batch index and copy whole records, or
//! re-frame a slice of a record when the requested range starts or ends
//! inside it.

use bytes::{BufMut, Bytes, BytesMut};
use iggy_binary_protocol::batch::{
    BATCH_HEADER_SIZE, BatchHeader, BatchIntegrity, calculate_batch_checksum,
    decode_batch_slice_with,
};

/// One stored batch record: `[256-byte header][frames]`, already stamped.
pub(crate) struct StoredBatch {
    pub(crate) base_offset: u64,
    pub(crate) base_timestamp: u64,
    pub(crate) count: u32,
    /// The record as stored (and as served when read whole).
    pub(crate) bytes: Bytes,
    /// Start of every frame, relative to the end of the batch header.
    frame_starts: Vec<u32>,
}

impl StoredBatch {
    fn blob_len(&self) -> usize {
        self.bytes.len() - BATCH_HEADER_SIZE
    }

    fn frame_start(&self, index: usize) -> usize {
        self.frame_starts
            .get(index)
            .map_or(self.blob_len(), |&start| start as usize)
    }

    fn last_offset(&self) -> u64 {
        self.base_offset + u64::from(self.count) - 1
    }
}

#[derive(Default)]
pub(crate) struct Log {
    batches: Vec<StoredBatch>,
    next_offset: u64,
    size_bytes: u64,
    last_timestamp: u64,
}

/// What a read put into the output buffer.
pub(crate) struct ReadOutcome {
    pub(crate) messages: u32,
    pub(crate) last_offset: Option<u64>,
}

impl Log {
    pub(crate) fn messages_count(&self) -> u64 {
        self.next_offset
    }

    pub(crate) fn next_offset(&self) -> u64 {
        self.next_offset
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The partition's last offset, or 0 while it is empty (as the real
    /// server reports it).
    pub(crate) fn current_offset(&self) -> u64 {
        self.next_offset.saturating_sub(1)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.next_offset == 0
    }

    pub(crate) fn batches(&self) -> &[StoredBatch] {
        &self.batches
    }

    /// A timestamp for the next batch: now, but never earlier than the
    /// previous batch, so timestamp seeks can binary-search.
    pub(crate) fn next_timestamp(&self, now_micros: u64) -> u64 {
        now_micros.max(self.last_timestamp)
    }

    /// Stamps `record` (a verified batch with `count` messages) in place and
    /// appends it. Returns the base offset it was given.
    pub(crate) fn append(
        &mut self,
        mut record: BytesMut,
        partition_id: u32,
        count: u32,
        now_micros: u64,
    ) -> u64 {
        let base_offset = self.next_offset;
        let base_timestamp = self.next_timestamp(now_micros);
        let mut header =
            BatchHeader::decode(&record).expect("the batch was verified before appending");
        header.partition_id = u64::from(partition_id);
        header.base_offset = base_offset;
        header.base_timestamp = base_timestamp;
        header.batch_checksum = calculate_batch_checksum(&header, &record[BATCH_HEADER_SIZE..]);
        header.encode_into(&mut record[..BATCH_HEADER_SIZE]);

        let bytes = record.freeze();
        let mut frame_starts = Vec::with_capacity(count as usize);
        let batch = decode_batch_slice_with(&bytes, BatchIntegrity::LayoutOnly)
            .expect("a verified batch keeps its layout");
        for frame in batch.iter_with_offsets() {
            frame_starts.push(u32::try_from(frame.start).expect("batches stay below 4 GiB"));
        }

        self.size_bytes += bytes.len() as u64;
        self.next_offset += u64::from(count);
        self.last_timestamp = base_timestamp;
        self.batches.push(StoredBatch {
            base_offset,
            base_timestamp,
            count,
            bytes,
            frame_starts,
        });
        base_offset
    }

    /// First offset whose (server) timestamp is at least `timestamp`, or the
    /// next offset to be written when there is none.
    pub(crate) fn offset_at_timestamp(&self, timestamp: u64) -> u64 {
        let index = self
            .batches
            .partition_point(|batch| batch.base_timestamp < timestamp);
        self.batches
            .get(index)
            .map_or(self.next_offset, |batch| batch.base_offset)
    }

    /// Appends to `out` the records holding offsets `start..start + count`
    /// (clamped to what exists), slicing the first and last record when the
    /// range does not fall on record boundaries.
    pub(crate) fn read_into(&self, start: u64, count: u32, out: &mut BytesMut) -> ReadOutcome {
        let mut outcome = ReadOutcome {
            messages: 0,
            last_offset: None,
        };
        if count == 0 || start >= self.next_offset {
            return outcome;
        }
        let first = self
            .batches
            .partition_point(|batch| batch.last_offset() < start);
        let mut remaining = count;
        for batch in &self.batches[first..] {
            if remaining == 0 {
                break;
            }
            let from = usize::try_from(start.saturating_sub(batch.base_offset))
                .expect("batch-relative offsets fit in usize");
            let to = (from + remaining as usize).min(batch.count as usize);
            let taken = u32::try_from(to - from).expect("bounded by the batch count");
            if from == 0 && to == batch.count as usize {
                out.extend_from_slice(&batch.bytes);
            } else {
                write_slice(batch, from, to, out);
            }
            remaining -= taken;
            outcome.messages += taken;
            outcome.last_offset = Some(batch.base_offset + to as u64 - 1);
        }
        outcome
    }
}

/// Writes frames `from..to` of `batch` as one record. The record keeps the
/// batch's base offset and timestamps (frames keep their offset deltas);
/// only the count, length and checksum change.
fn write_slice(batch: &StoredBatch, from: usize, to: usize, out: &mut BytesMut) {
    let blob = &batch.bytes[BATCH_HEADER_SIZE..];
    let frames = &blob[batch.frame_start(from)..batch.frame_start(to)];
    let mut header = BatchHeader::decode(&batch.bytes).expect("stored batches decode");
    header.message_count = u32::try_from(to - from).expect("bounded by the batch count");
    header.batch_length = (BATCH_HEADER_SIZE + frames.len()) as u64;
    header.batch_checksum = calculate_batch_checksum(&header, frames);
    let at = out.len();
    out.put_bytes(0, BATCH_HEADER_SIZE);
    header.encode_into(&mut out[at..at + BATCH_HEADER_SIZE]);
    out.extend_from_slice(frames);
}
