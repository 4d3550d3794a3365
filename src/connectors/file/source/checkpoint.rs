//! The source's state: where each file it follows stands, and how to know
//! that file again (device, inode, and a fingerprint of its first bytes).

use serde::{Deserialize, Serialize};

use crate::connectors::{ConnectorError, decode_state};

/// Saved with each batch: the checkpoints once the batch is in Iggy.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileState {
    pub files: Vec<Checkpoint>,
}

/// One file's position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Where it was last seen (for people reading the state; identity is
    /// the rest).
    pub path: String,
    pub device: u64,
    pub inode: u64,
    pub fingerprint: Fingerprint,
    /// The first byte not yet sent: the start of the line (or multi-line
    /// record) after the last one sent. For a `.gz` file, in decompressed
    /// bytes.
    pub offset: u64,
    /// A `.gz` file read to its end: never read again.
    #[serde(default)]
    pub done: bool,
}

/// A hash of a file's first `length` bytes (up to `fingerprint_bytes`: a
/// file shorter than that is fingerprinted as far as it goes, and again as
/// it grows).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Fingerprint {
    pub length: u32,
    pub hash: u32,
}

impl Fingerprint {
    pub fn of(bytes: &[u8]) -> Self {
        Self {
            length: u32::try_from(bytes.len()).unwrap_or(u32::MAX),
            hash: crc32fast::hash(bytes),
        }
    }
}

impl FileState {
    pub fn decode(bytes: &[u8]) -> Result<Self, ConnectorError> {
        decode_state(bytes).map_err(|error| {
            ConnectorError::fatal(format!(
                "the file source's saved state does not decode ({error}); `iggy-connect state clear KEY` starts afresh"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::encode_state;

    #[test]
    fn given_a_state_when_encoded_and_decoded_should_round_trip() {
        let state = FileState {
            files: vec![Checkpoint {
                path: "/var/log/app.log".into(),
                device: 2049,
                inode: 77,
                fingerprint: Fingerprint::of(b"first line\n"),
                offset: 11,
                done: false,
            }],
        };
        let bytes = encode_state(&state).unwrap();
        assert_eq!(FileState::decode(&bytes).unwrap(), state);
    }

    #[test]
    fn given_corrupt_state_when_decoded_should_refuse_fatally() {
        let error = FileState::decode(b"\xc1not msgpack").unwrap_err();
        assert!(!error.is_transient(), "{error}");
    }
}
