//! The sink's SQL (upstream's table layout) and the column arrays of a batch.
//!
//! One INSERT per chunk: every column travels as one array parameter and
//! `UNNEST` turns the arrays back into rows, so a chunk is one round trip with
//! one prepared statement whatever its size. `ON CONFLICT (id) DO NOTHING`
//! makes a redelivered message a no-op.

use std::ops::Range;

use crate::connectors::Rejection;
use crate::connectors::kit::sql::append_payload;
use crate::message::{Payload, SinkMessage};

use super::config::PayloadFormat;
use super::numeric::PgU128;

/// Which of upstream's optional columns the table has.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    pub metadata: bool,
    pub checksum: bool,
    pub origin_timestamp: bool,
    pub format: PayloadFormat,
}

impl Layout {
    /// Upstream's auto-created table.
    pub fn create_sql(&self, table: &str) -> String {
        let mut sql = format!("CREATE TABLE IF NOT EXISTS {table} (id DECIMAL(39, 0) PRIMARY KEY");
        if self.metadata {
            sql.push_str(
                ", iggy_offset BIGINT, iggy_timestamp TIMESTAMP WITH TIME ZONE, iggy_stream TEXT, \
                 iggy_topic TEXT, iggy_partition_id INTEGER",
            );
        }
        if self.checksum {
            sql.push_str(", iggy_checksum BIGINT");
        }
        if self.origin_timestamp {
            sql.push_str(", iggy_origin_timestamp TIMESTAMP WITH TIME ZONE");
        }
        sql.push_str(&format!(
            ", payload {}, created_at TIMESTAMP WITH TIME ZONE DEFAULT NOW())",
            self.format.sql_type()
        ));
        sql
    }

    /// The chunk INSERT. Parameters: `$1` ids (numeric[]), `$2` payloads, then
    /// offsets, timestamps, stream, topic, partitions (metadata), checksums,
    /// origin timestamps, each only when its column is written.
    pub fn insert_sql(&self, table: &str) -> String {
        let payload_array = match self.format {
            PayloadFormat::Bytea => "bytea[]",
            PayloadFormat::Json | PayloadFormat::Text => "text[]",
        };
        let payload_value = match self.format {
            PayloadFormat::Json => "u.payload::jsonb",
            PayloadFormat::Bytea | PayloadFormat::Text => "u.payload",
        };
        let mut columns = vec!["id", "payload"];
        let mut values = vec!["u.id".to_owned(), payload_value.to_owned()];
        let mut arrays = vec!["$1::numeric[]".to_owned(), format!("$2::{payload_array}")];
        let mut names = vec!["id", "payload"];
        let mut next = 3;
        let mut param = || {
            let current = next;
            next += 1;
            current
        };
        let micros =
            |column: &str| format!("TIMESTAMPTZ 'epoch' + u.{column} * INTERVAL '1 microsecond'");
        if self.metadata {
            columns.extend([
                "iggy_offset",
                "iggy_timestamp",
                "iggy_stream",
                "iggy_topic",
                "iggy_partition_id",
            ]);
            arrays.push(format!("${}::int8[]", param()));
            arrays.push(format!("${}::int8[]", param()));
            values.push("u.iggy_offset".into());
            values.push(micros("iggy_timestamp"));
            values.push(format!("${}::text", param()));
            values.push(format!("${}::text", param()));
            arrays.push(format!("${}::int4[]", param()));
            values.push("u.iggy_partition_id".into());
            names.extend(["iggy_offset", "iggy_timestamp", "iggy_partition_id"]);
        }
        if self.checksum {
            columns.push("iggy_checksum");
            arrays.push(format!("${}::int8[]", param()));
            values.push("u.iggy_checksum".into());
            names.push("iggy_checksum");
        }
        if self.origin_timestamp {
            columns.push("iggy_origin_timestamp");
            arrays.push(format!("${}::int8[]", param()));
            values.push(micros("iggy_origin_timestamp"));
            names.push("iggy_origin_timestamp");
        }
        format!(
            "INSERT INTO {table} ({}) SELECT {} FROM UNNEST({}) AS u({}) ON CONFLICT (id) DO NOTHING",
            columns.join(", "),
            values.join(", "),
            arrays.join(", "),
            names.join(", ")
        )
    }
}

/// A batch laid out as columns, built once per `write`. Payloads are rendered
/// into one buffer, so a chunk binds slices of it without a copy per row.
pub struct Batch {
    pub ids: Vec<PgU128>,
    pub offsets: Vec<i64>,
    pub timestamps: Vec<i64>,
    pub partitions: Vec<i32>,
    pub checksums: Vec<i64>,
    pub origin_timestamps: Vec<i64>,
    buffer: Vec<u8>,
    /// End of each payload in `buffer`.
    ends: Vec<usize>,
}

impl Batch {
    /// Renders the messages. Messages whose payload cannot be stored in the
    /// payload column at all (bytes that are not UTF-8 for a text or JSONB
    /// column) come back as rejections.
    pub fn encode(messages: &[SinkMessage], format: PayloadFormat) -> (Self, Vec<Rejection>) {
        let count = messages.len();
        let estimate: usize = messages
            .iter()
            .map(|message| match &message.payload {
                Payload::Text(text) => text.len(),
                Payload::Raw(bytes) | Payload::JsonBytes(bytes) => bytes.len(),
                Payload::Json(_) => 256,
            })
            .sum();
        let mut batch = Batch {
            ids: Vec::with_capacity(count),
            offsets: Vec::with_capacity(count),
            timestamps: Vec::with_capacity(count),
            partitions: Vec::with_capacity(count),
            checksums: Vec::with_capacity(count),
            origin_timestamps: Vec::with_capacity(count),
            buffer: Vec::with_capacity(estimate),
            ends: Vec::with_capacity(count),
        };
        let mut rejected = Vec::new();
        let text_column = format != PayloadFormat::Bytea;
        let format_name = format.sql_type().to_lowercase();
        for (index, message) in messages.iter().enumerate() {
            // Iggy's u64 values are stored in signed columns, as upstream does.
            batch.ids.push(PgU128(message.id));
            batch.offsets.push(message.offset as i64);
            batch.timestamps.push(message.timestamp as i64);
            batch.partitions.push(message.partition_id as i32);
            batch.checksums.push(message.checksum as i64);
            batch
                .origin_timestamps
                .push(message.origin_timestamp as i64);
            if let Err(reason) = append_payload(
                &mut batch.buffer,
                &message.payload,
                text_column,
                &format_name,
            ) {
                rejected.push(Rejection { index, reason });
            }
            batch.ends.push(batch.buffer.len());
        }
        (batch, rejected)
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn payload(&self, index: usize) -> &[u8] {
        let start = if index == 0 { 0 } else { self.ends[index - 1] };
        &self.buffer[start..self.ends[index]]
    }

    pub fn payload_bytes(&self, range: Range<usize>) -> Vec<&[u8]> {
        range.map(|index| self.payload(index)).collect()
    }

    /// Payloads as text. Every payload is UTF-8 here: JSON and text are by
    /// construction and raw bytes were checked in `encode`.
    pub fn payload_text(&self, range: Range<usize>) -> Vec<&str> {
        range
            .map(|index| std::str::from_utf8(self.payload(index)).unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn message(id: u128, payload: Payload) -> SinkMessage {
        SinkMessage {
            id,
            offset: id as u64,
            partition_id: 1,
            timestamp: 5,
            origin_timestamp: 4,
            checksum: 3,
            headers: Vec::new(),
            payload,
        }
    }

    #[test]
    fn given_all_columns_when_insert_is_built_should_number_parameters_in_bind_order() {
        let layout = Layout {
            metadata: true,
            checksum: true,
            origin_timestamp: true,
            format: PayloadFormat::Json,
        };
        let sql = layout.insert_sql("\"t\"");
        assert_eq!(
            sql,
            "INSERT INTO \"t\" (id, payload, iggy_offset, iggy_timestamp, iggy_stream, iggy_topic, iggy_partition_id, \
             iggy_checksum, iggy_origin_timestamp) SELECT u.id, u.payload::jsonb, u.iggy_offset, \
             TIMESTAMPTZ 'epoch' + u.iggy_timestamp * INTERVAL '1 microsecond', $5::text, $6::text, u.iggy_partition_id, \
             u.iggy_checksum, TIMESTAMPTZ 'epoch' + u.iggy_origin_timestamp * INTERVAL '1 microsecond' \
             FROM UNNEST($1::numeric[], $2::text[], $3::int8[], $4::int8[], $7::int4[], $8::int8[], $9::int8[]) \
             AS u(id, payload, iggy_offset, iggy_timestamp, iggy_partition_id, iggy_checksum, iggy_origin_timestamp) \
             ON CONFLICT (id) DO NOTHING"
        );
    }

    #[test]
    fn given_mixed_payloads_when_encoded_should_lay_them_out_and_reject_what_cannot_be_stored() {
        let messages = vec![
            message(1, Payload::Json(serde_json::json!({"a": 1}))),
            message(2, Payload::Text("hi".into())),
            message(3, Payload::Raw(Bytes::from_static(&[0xff, 0xfe]))),
        ];
        let (batch, rejected) = Batch::encode(&messages, PayloadFormat::Text);
        assert_eq!(batch.payload_text(0..3), vec!["{\"a\":1}", "hi", ""]);
        assert_eq!(rejected.len(), 1);
        assert_eq!(rejected[0].index, 2);
        let (batch, rejected) = Batch::encode(&messages, PayloadFormat::Bytea);
        assert!(rejected.is_empty());
        assert_eq!(batch.payload(2), &[0xff, 0xfe]);
    }
}
