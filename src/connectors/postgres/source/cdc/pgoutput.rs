//! Decodes the messages of PostgreSQL's `pgoutput` logical decoding plugin,
//! protocol version 1 (PostgreSQL's "Logical Replication Message Formats"):
//! Begin, Commit, Relation, Insert, Update, Delete, Truncate; Origin, Type and
//! logical Message are read and ignored.
//!
//! Column values are slices of the message (no copy): a change keeps the
//! frame it came in alive until its record is built.

use bytes::Bytes;

/// One column of a relation as the Relation message describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RelationColumn {
    pub name: String,
    /// `"name":`, the column's JSON key as `row_to_json` writes it.
    pub json_key: String,
    /// Part of the replica identity (the key PostgreSQL sends for deletes).
    pub key: bool,
    pub type_oid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relation {
    pub id: u32,
    pub namespace: String,
    pub name: String,
    /// `d` default (primary key), `n` nothing, `f` full, `i` index.
    pub replica_identity: u8,
    pub columns: Vec<RelationColumn>,
}

/// One column's value in a tuple.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Value {
    Null,
    /// A TOASTed value the change did not touch: PostgreSQL does not send it.
    Unchanged,
    /// The value's text output, as PostgreSQL sent it (UTF-8 when the
    /// database's encoding is).
    Text(Bytes),
}

/// The old row of an update or delete, as the replica identity defines it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OldTuple {
    /// Only the key columns are meaningful (`K`: default identity, key changed
    /// or a delete).
    Key(Vec<Value>),
    /// The whole old row (`O`: REPLICA IDENTITY FULL).
    Full(Vec<Value>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Begin {
        /// LSN of the commit record.
        final_lsn: u64,
        /// Commit time, microseconds since 2000-01-01 00:00:00 UTC.
        timestamp: i64,
        xid: u32,
    },
    Commit {
        commit_lsn: u64,
        /// LSN just past the commit record: what the slot advances to.
        end_lsn: u64,
        timestamp: i64,
    },
    Relation(Relation),
    Insert {
        relation: u32,
        new: Vec<Value>,
    },
    Update {
        relation: u32,
        old: Option<OldTuple>,
        new: Vec<Value>,
    },
    Delete {
        relation: u32,
        old: OldTuple,
    },
    Truncate {
        relations: Vec<u32>,
    },
    /// A logical decoding message (`pg_logical_emit_message`).
    Logical {
        transactional: bool,
        /// Where the message was written.
        lsn: u64,
        prefix: String,
    },
    /// Origin, Type: nothing to produce.
    Other(u8),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed pgoutput message {tag:?}: {reason}")]
pub struct DecodeError {
    pub tag: char,
    pub reason: String,
}

/// Decodes one message (the payload of one XLogData frame).
pub fn decode(frame: &Bytes) -> Result<Message, DecodeError> {
    let Some((&tag, body)) = frame.split_first() else {
        return Err(DecodeError {
            tag: '?',
            reason: "empty message".into(),
        });
    };
    let mut reader = Reader {
        frame,
        bytes: body,
        tag,
    };
    let message = match tag {
        b'B' => Message::Begin {
            final_lsn: reader.u64()?,
            timestamp: reader.i64()?,
            xid: reader.u32()?,
        },
        b'C' => {
            let _flags = reader.u8()?;
            Message::Commit {
                commit_lsn: reader.u64()?,
                end_lsn: reader.u64()?,
                timestamp: reader.i64()?,
            }
        }
        b'R' => {
            let id = reader.u32()?;
            let namespace = reader.string()?;
            let name = reader.string()?;
            let replica_identity = reader.u8()?;
            let count = reader.u16()?;
            let mut columns = Vec::with_capacity(usize::from(count));
            for _ in 0..count {
                let flags = reader.u8()?;
                let name = reader.string()?;
                let type_oid = reader.u32()?;
                let _type_modifier = reader.u32()?;
                columns.push(RelationColumn {
                    json_key: json_key(&name),
                    name,
                    key: flags & 1 == 1,
                    type_oid,
                });
            }
            Message::Relation(Relation {
                id,
                namespace: if namespace.is_empty() {
                    "pg_catalog".into()
                } else {
                    namespace
                },
                name,
                replica_identity,
                columns,
            })
        }
        b'I' => {
            let relation = reader.u32()?;
            reader.expect(b'N')?;
            Message::Insert {
                relation,
                new: reader.tuple()?,
            }
        }
        b'U' => {
            let relation = reader.u32()?;
            let old = match reader.u8()? {
                b'K' => Some(OldTuple::Key(reader.tuple()?)),
                b'O' => Some(OldTuple::Full(reader.tuple()?)),
                b'N' => None,
                other => return Err(reader.error(format!("unexpected tuple kind {other}"))),
            };
            if old.is_some() {
                reader.expect(b'N')?;
            }
            Message::Update {
                relation,
                old,
                new: reader.tuple()?,
            }
        }
        b'D' => {
            let relation = reader.u32()?;
            let old = match reader.u8()? {
                b'K' => OldTuple::Key(reader.tuple()?),
                b'O' => OldTuple::Full(reader.tuple()?),
                other => return Err(reader.error(format!("unexpected tuple kind {other}"))),
            };
            Message::Delete { relation, old }
        }
        b'T' => {
            let count = reader.u32()?;
            let _options = reader.u8()?;
            let relations = (0..count)
                .map(|_| reader.u32())
                .collect::<Result<Vec<_>, _>>()?;
            Message::Truncate { relations }
        }
        b'M' => {
            let flags = reader.u8()?;
            let lsn = reader.u64()?;
            let prefix = reader.string()?;
            let length = reader.u32()? as usize;
            reader.take(length)?;
            Message::Logical {
                transactional: flags & 1 == 1,
                lsn,
                prefix,
            }
        }
        b'O' | b'Y' => Message::Other(tag),
        other => {
            return Err(DecodeError {
                tag: char::from(other),
                reason: "unknown message type".into(),
            });
        }
    };
    Ok(message)
}

struct Reader<'a> {
    /// The whole message, which values are sliced from.
    frame: &'a Bytes,
    bytes: &'a [u8],
    tag: u8,
}

impl<'a> Reader<'a> {
    fn error(&self, reason: impl Into<String>) -> DecodeError {
        DecodeError {
            tag: char::from(self.tag),
            reason: reason.into(),
        }
    }

    fn take(&mut self, count: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < count {
            return Err(self.error(format!(
                "needs {count} more bytes, has {}",
                self.bytes.len()
            )));
        }
        let (head, rest) = self.bytes.split_at(count);
        self.bytes = rest;
        Ok(head)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let mut out = [0; N];
        out.copy_from_slice(self.take(N)?);
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.array::<1>()?[0])
    }

    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.array()?))
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_be_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    fn i64(&mut self) -> Result<i64, DecodeError> {
        Ok(i64::from_be_bytes(self.array()?))
    }

    fn expect(&mut self, wanted: u8) -> Result<(), DecodeError> {
        match self.u8()? {
            found if found == wanted => Ok(()),
            found => Err(self.error(format!(
                "expected {:?}, found {:?}",
                char::from(wanted),
                char::from(found)
            ))),
        }
    }

    /// A NUL-terminated string.
    fn string(&mut self) -> Result<String, DecodeError> {
        let end = self
            .bytes
            .iter()
            .position(|byte| *byte == 0)
            .ok_or_else(|| self.error("unterminated string"))?;
        let text = String::from_utf8_lossy(&self.bytes[..end]).into_owned();
        self.bytes = &self.bytes[end + 1..];
        Ok(text)
    }

    fn tuple(&mut self) -> Result<Vec<Value>, DecodeError> {
        let count = self.u16()?;
        let mut values = Vec::with_capacity(usize::from(count));
        for _ in 0..count {
            values.push(match self.u8()? {
                b'n' => Value::Null,
                b'u' => Value::Unchanged,
                b't' => {
                    let length = self.u32()? as usize;
                    let bytes = self.take(length)?;
                    Value::Text(self.frame.slice_ref(bytes))
                }
                other => {
                    return Err(self.error(format!(
                        "unexpected column kind {:?} (binary output is not requested)",
                        char::from(other)
                    )));
                }
            });
        }
        Ok(values)
    }
}

/// `"name":` with `name` escaped as PostgreSQL's `escape_json` does.
fn json_key(name: &str) -> String {
    let mut out = Vec::with_capacity(name.len() + 3);
    push_json_string(&mut out, name);
    out.push(b':');
    String::from_utf8(out).unwrap_or_default()
}

/// `text` as a JSON string: `"`, `\\` and control characters escaped,
/// `\b \f \n \r \t` by name and the others as `\u00xx`, as PostgreSQL's
/// `escape_json` writes them (and serde_json: the same rules).
pub fn push_json_string(out: &mut Vec<u8>, text: &str) {
    // serde_json escapes exactly these; writing to a Vec cannot fail.
    let _ = serde_json::to_writer(out, text);
}

/// `X/Y`, PostgreSQL's text form of an LSN.
pub fn format_lsn(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xFFFF_FFFF)
}

/// Parses PostgreSQL's `X/Y` LSN text.
pub fn parse_lsn(text: &str) -> Option<u64> {
    let (high, low) = text.split_once('/')?;
    let high = u64::from_str_radix(high, 16).ok()?;
    let low = u64::from_str_radix(low, 16).ok()?;
    (high <= u64::from(u32::MAX) && low <= u64::from(u32::MAX)).then_some((high << 32) | low)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuple(values: &[Option<&str>]) -> Vec<u8> {
        let mut out = (values.len() as u16).to_be_bytes().to_vec();
        for value in values {
            match value {
                None => out.push(b'n'),
                Some("\u{0}toast") => out.push(b'u'),
                Some(text) => {
                    out.push(b't');
                    out.extend_from_slice(&(text.len() as u32).to_be_bytes());
                    out.extend_from_slice(text.as_bytes());
                }
            }
        }
        out
    }

    #[test]
    fn given_begin_and_commit_when_decoded_should_read_lsns_time_and_xid() {
        let mut begin = vec![b'B'];
        begin.extend_from_slice(&0x0000_0001_0000_0010u64.to_be_bytes());
        begin.extend_from_slice(&42i64.to_be_bytes());
        begin.extend_from_slice(&7u32.to_be_bytes());
        let begin = Bytes::from(begin);
        assert_eq!(
            decode(&begin).unwrap(),
            Message::Begin {
                final_lsn: 0x1_0000_0010,
                timestamp: 42,
                xid: 7
            }
        );
        let mut commit = vec![b'C', 0];
        for value in [16u64, 40, 42] {
            commit.extend_from_slice(&value.to_be_bytes());
        }
        let commit = Bytes::from(commit);
        assert_eq!(
            decode(&commit).unwrap(),
            Message::Commit {
                commit_lsn: 16,
                end_lsn: 40,
                timestamp: 42
            }
        );
        assert!(
            decode(&commit.slice(..10)).is_err(),
            "a short message is an error"
        );
    }

    #[test]
    fn given_relation_and_changes_when_decoded_should_keep_keys_toast_and_old_tuples() {
        let mut relation = vec![b'R'];
        relation.extend_from_slice(&16384u32.to_be_bytes());
        relation.extend_from_slice(b"public\0users\0f");
        relation.extend_from_slice(&2u16.to_be_bytes());
        relation.push(1);
        relation.extend_from_slice(b"id\0");
        relation.extend_from_slice(&20u32.to_be_bytes());
        relation.extend_from_slice(&u32::MAX.to_be_bytes());
        relation.push(0);
        relation.extend_from_slice(b"body\0");
        relation.extend_from_slice(&25u32.to_be_bytes());
        relation.extend_from_slice(&u32::MAX.to_be_bytes());
        let Message::Relation(decoded) = decode(&Bytes::from(relation)).unwrap() else {
            panic!("not a relation");
        };
        assert_eq!(decoded.name, "users");
        assert_eq!(decoded.replica_identity, b'f');
        assert!(decoded.columns[0].key && !decoded.columns[1].key);
        assert_eq!(decoded.columns[1].type_oid, 25);
        assert_eq!(decoded.columns[1].json_key, "\"body\":");

        let mut update = vec![b'U'];
        update.extend_from_slice(&16384u32.to_be_bytes());
        update.push(b'O');
        update.extend(tuple(&[Some("1"), Some("old")]));
        update.push(b'N');
        update.extend(tuple(&[Some("1"), Some("\u{0}toast")]));
        assert_eq!(
            decode(&Bytes::from(update)).unwrap(),
            Message::Update {
                relation: 16384,
                old: Some(OldTuple::Full(vec![
                    Value::Text(Bytes::from_static(b"1")),
                    Value::Text(Bytes::from_static(b"old"))
                ])),
                new: vec![Value::Text(Bytes::from_static(b"1")), Value::Unchanged],
            }
        );
        let mut delete = vec![b'D'];
        delete.extend_from_slice(&16384u32.to_be_bytes());
        delete.push(b'K');
        delete.extend(tuple(&[Some("1"), None]));
        assert_eq!(
            decode(&Bytes::from(delete)).unwrap(),
            Message::Delete {
                relation: 16384,
                old: OldTuple::Key(vec![Value::Text(Bytes::from_static(b"1")), Value::Null]),
            }
        );
        let mut truncate = vec![b'T'];
        truncate.extend_from_slice(&2u32.to_be_bytes());
        truncate.push(0);
        truncate.extend_from_slice(&1u32.to_be_bytes());
        truncate.extend_from_slice(&2u32.to_be_bytes());
        assert_eq!(
            decode(&Bytes::from(truncate)).unwrap(),
            Message::Truncate {
                relations: vec![1, 2]
            }
        );
    }

    #[test]
    fn given_a_logical_message_when_decoded_should_read_its_lsn_and_prefix() {
        let mut message = vec![b'M', 0];
        message.extend_from_slice(&99u64.to_be_bytes());
        message.extend_from_slice(b"iggy\0");
        message.extend_from_slice(&2u32.to_be_bytes());
        message.extend_from_slice(b"hi");
        let message = Bytes::from(message);
        assert_eq!(
            decode(&message).unwrap(),
            Message::Logical {
                transactional: false,
                lsn: 99,
                prefix: "iggy".into()
            }
        );
        assert!(decode(&message.slice(..message.len() - 1)).is_err());
    }

    #[test]
    fn given_lsn_text_when_parsed_should_round_trip() {
        assert_eq!(parse_lsn("16/B374D848"), Some(0x16_B374_D848));
        assert_eq!(format_lsn(0x16_B374_D848), "16/B374D848");
        assert_eq!(parse_lsn("nope"), None);
    }
}
