//! The embedded default store: one file per source, `{dir}/source_{key}.state`.
//!
//! The state itself is a small MessagePack envelope (format version, source
//! key, connector name, CRC32 of the data, the source's own bytes). The file
//! holds two copies of it, each in its own slot of a fixed size (a power of
//! two, at least 4 KiB): a header (magic, sequence number, length, CRC32 of
//! the three) and the envelope. A save overwrites the slot that does not hold
//! the newest intact copy with a copy numbered one higher, and fsyncs the
//! file's data: one flush, where a temp file and a rename take two fsyncs and
//! a journal commit. A crash during it leaves that slot torn, its checksum
//! wrong, and a load takes the other copy: the state saved before. A load
//! takes the intact copy with the highest number; a file with none, or whose
//! envelope does not decode or match its checksum, is refused: a corrupt
//! state must never turn into a silent fresh start.
//!
//! A state too big for its slot, a missing file and a file of the older
//! one-envelope format (still read) are saved the old way: the whole file,
//! with the slots doubled until the state fits, written to
//! `source_{key}.state.tmp`, fsynced, renamed over the state file, and the
//! directory fsynced. `cargo bench --bench engine -- state_save` measures a
//! save.

use std::fs::{self, File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use tracing::warn;

use crate::state::{StateError, StateStore, StoredState};

const FORMAT_VERSION: u32 = 1;

/// The start of each copy's header.
const MAGIC: &[u8; 8] = b"IGCSTATE";
/// Magic, sequence number (u64), envelope length (u32), CRC32 (u32).
const HEADER: usize = 24;
/// The smallest slot: a page, so a torn write of one slot never reaches the other.
const MIN_SLOT: usize = 4096;

#[derive(Debug, Clone)]
pub struct FileStateStore {
    dir: PathBuf,
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    format: u32,
    /// The source key the state belongs to. Files written before it was
    /// recorded lack it; they are read as they are and get it at the next save.
    #[serde(default)]
    key: Option<String>,
    connector: String,
    crc32: u32,
    #[serde(with = "serde_bytes")]
    data: Vec<u8>,
}

/// An intact copy in a file of the two-slot format.
#[derive(Clone, Copy)]
struct Intact<'a> {
    slot: usize,
    sequence: u64,
    envelope: &'a [u8],
}

/// What a file of the two-slot format holds.
struct Slots<'a> {
    size: usize,
    newest: Option<Intact<'a>>,
    /// Why the slot of the other copy does not count, when it has a header.
    damaged: Option<(u64, &'static str)>,
}

impl<'a> Slots<'a> {
    /// `None` when `bytes` are not of the two-slot format.
    fn parse(bytes: &'a [u8]) -> Option<Self> {
        let size = bytes.len() / 2;
        let slots = [&bytes[..size], &bytes[size..]];
        let formatted = bytes.len().is_multiple_of(2)
            && size >= MIN_SLOT
            && size.is_power_of_two()
            && slots.iter().any(|slot| slot.starts_with(MAGIC));
        if !formatted {
            return None;
        }
        let mut found = Self {
            size,
            newest: None,
            damaged: None,
        };
        for (slot, bytes) in slots.into_iter().enumerate() {
            match read_copy(slot, bytes) {
                Slot::Intact(copy) => {
                    if found
                        .newest
                        .is_none_or(|newest| copy.sequence > newest.sequence)
                    {
                        found.newest = Some(copy);
                    }
                }
                Slot::Damaged { sequence, why } => found.damaged = Some((sequence, why)),
                Slot::Empty => {}
            }
        }
        Some(found)
    }
}

/// What one slot holds.
enum Slot<'a> {
    Empty,
    Damaged { sequence: u64, why: &'static str },
    Intact(Intact<'a>),
}

fn read_copy(slot: usize, bytes: &[u8]) -> Slot<'_> {
    if !bytes.starts_with(MAGIC) {
        return Slot::Empty;
    }
    let field = |range: std::ops::Range<usize>| &bytes[range];
    let sequence = u64::from_le_bytes(field(8..16).try_into().unwrap_or_default());
    let length = u32::from_le_bytes(field(16..20).try_into().unwrap_or_default()) as usize;
    let crc = u32::from_le_bytes(field(20..24).try_into().unwrap_or_default());
    let Some(envelope) = bytes.get(HEADER..HEADER + length) else {
        return Slot::Damaged {
            sequence,
            why: "a copy longer than its slot",
        };
    };
    if copy_crc(sequence, envelope) != crc {
        return Slot::Damaged {
            sequence,
            why: "checksum mismatch",
        };
    }
    Slot::Intact(Intact {
        slot,
        sequence,
        envelope,
    })
}

fn copy_crc(sequence: u64, envelope: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&sequence.to_le_bytes());
    hasher.update(&(envelope.len() as u32).to_le_bytes());
    hasher.update(envelope);
    hasher.finalize()
}

/// The bytes of a copy: its header and `envelope`.
fn encode_copy(sequence: u64, envelope: &[u8]) -> Vec<u8> {
    let mut copy = Vec::with_capacity(HEADER + envelope.len());
    copy.extend_from_slice(MAGIC);
    copy.extend_from_slice(&sequence.to_le_bytes());
    copy.extend_from_slice(&(envelope.len() as u32).to_le_bytes());
    copy.extend_from_slice(&copy_crc(sequence, envelope).to_le_bytes());
    copy.extend_from_slice(envelope);
    copy
}

impl FileStateStore {
    /// A store in `dir`, which is created (with its parents) when missing.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, StateError> {
        let dir = dir.into();
        fs::create_dir_all(&dir).map_err(|source| StateError::Write {
            path: dir.clone(),
            source,
        })?;
        Ok(Self { dir })
    }

    pub fn path_for(&self, key: &str) -> PathBuf {
        self.dir.join(format!("source_{key}.state"))
    }

    /// The state in `path`; `key` is the source it must belong to (`None`
    /// reads whatever the file holds).
    fn load_blocking(path: &Path, key: Option<&str>) -> Result<Option<StoredState>, StateError> {
        let bytes = match fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                refuse_dangling_link(path)?;
                return Ok(None);
            }
            Err(source) => {
                return Err(StateError::Read {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let corrupt = |reason: String| StateError::Corrupt {
            path: path.to_owned(),
            reason,
        };
        let envelope = match Slots::parse(&bytes) {
            None => &bytes[..],
            Some(Slots {
                newest: Some(newest),
                damaged,
                ..
            }) => {
                if let Some((sequence, why)) =
                    damaged.filter(|(sequence, _)| *sequence > newest.sequence)
                {
                    warn!(
                        path = %path.display(),
                        "the newest copy of the state (save {sequence}) is damaged ({why}), as a crash during its save leaves it; loading the copy saved before it (save {})",
                        newest.sequence
                    );
                }
                newest.envelope
            }
            Some(Slots { damaged, .. }) => {
                let why = damaged.map_or("no copy", |(_, why)| why);
                return Err(corrupt(format!(
                    "neither of its two copies is intact: {why}"
                )));
            }
        };
        let envelope: Envelope =
            rmp_serde::from_slice(envelope).map_err(|error| corrupt(error.to_string()))?;
        if envelope.format != FORMAT_VERSION {
            return Err(corrupt(format!(
                "unknown format version {}",
                envelope.format
            )));
        }
        if crc32fast::hash(&envelope.data) != envelope.crc32 {
            return Err(corrupt("checksum mismatch".into()));
        }
        if let (Some(expected), Some(found)) = (key, &envelope.key)
            && expected != found
        {
            return Err(StateError::WrongKey {
                path: path.to_owned(),
                found: found.clone(),
                connector: envelope.connector,
                expected: expected.to_owned(),
            });
        }
        Ok(Some(StoredState {
            connector: envelope.connector,
            data: envelope.data,
        }))
    }

    /// The envelope's bytes for `state`.
    fn encode(path: &Path, key: &str, state: &StoredState) -> Result<Vec<u8>, StateError> {
        let envelope = Envelope {
            format: FORMAT_VERSION,
            key: Some(key.to_owned()),
            connector: state.connector.clone(),
            crc32: crc32fast::hash(&state.data),
            data: state.data.clone(),
        };
        rmp_serde::to_vec_named(&envelope).map_err(|error| StateError::Write {
            path: path.to_owned(),
            source: std::io::Error::other(error),
        })
    }

    /// Overwrites the older copy in the file with `envelope`, or writes the
    /// whole file anew when there is no file of the two-slot format yet or
    /// its slots are too small.
    fn save_blocking(dir: &Path, path: &Path, envelope: &[u8]) -> Result<(), StateError> {
        refuse_dangling_link(path)?;
        let write = || -> std::io::Result<()> {
            let mut file = match OpenOptions::new().read(true).write(true).open(path) {
                Ok(file) => file,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    return write_whole(dir, path, 1, envelope);
                }
                Err(error) => return Err(error),
            };
            let mut bytes = Vec::new();
            file.read_to_end(&mut bytes)?;
            let (size, newest) =
                Slots::parse(&bytes).map_or((0, None), |slots| (slots.size, slots.newest));
            let sequence = newest.map_or(1, |newest| newest.sequence + 1);
            if HEADER + envelope.len() > size {
                return write_whole(dir, path, sequence, envelope);
            }
            let slot = newest.map_or(0, |newest| 1 - newest.slot);
            file.write_all_at(&encode_copy(sequence, envelope), (slot * size) as u64)?;
            file.sync_data()
        };
        write().map_err(|source| StateError::Write {
            path: path.to_owned(),
            source,
        })
    }
}

#[async_trait]
impl StateStore for FileStateStore {
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError> {
        let path = self.path_for(key);
        let key = key.to_owned();
        run_blocking(move || Self::load_blocking(&path, Some(&key))).await
    }

    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError> {
        let dir = self.dir.clone();
        let path = self.path_for(key);
        let envelope = Self::encode(&path, key, state)?;
        run_blocking(move || Self::save_blocking(&dir, &path, &envelope)).await
    }

    /// Removes the state file and its temp file, then fsyncs the directory.
    async fn clear(&self, key: &str) -> Result<(), StateError> {
        let dir = self.dir.clone();
        let path = self.path_for(key);
        run_blocking(move || {
            let remove = |file: &Path| match fs::remove_file(file) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(error),
                _ => Ok(()),
            };
            remove(&path.with_extension("state.tmp"))
                .and_then(|()| remove(&path))
                .and_then(|()| File::open(&dir)?.sync_all())
                .map_err(|source| StateError::Write {
                    path: path.clone(),
                    source,
                })
        })
        .await
    }

    fn location(&self, key: &str) -> String {
        self.path_for(key).display().to_string()
    }
}

/// Writes a whole file of the two-slot format, `envelope` as copy
/// `sequence` in the first slot, through a temp file (created mode 0600),
/// fsynced and renamed over `path`, and fsyncs the directory.
fn write_whole(dir: &Path, path: &Path, sequence: u64, envelope: &[u8]) -> std::io::Result<()> {
    let copy = encode_copy(sequence, envelope);
    let size = copy.len().next_power_of_two().max(MIN_SLOT);
    let mut bytes = vec![0; 2 * size];
    bytes[..copy.len()].copy_from_slice(&copy);
    let temp = path.with_extension("state.tmp");
    let result = write_synced(&temp, &bytes)
        .and_then(|()| fs::rename(&temp, path))
        .and_then(|()| File::open(dir)?.sync_all());
    if result.is_err() {
        let _ = fs::remove_file(&temp);
    }
    result
}

/// Writes `bytes` as the whole file at `path` (created mode 0600 when
/// missing) and fsyncs it.
fn write_synced(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    file.write_all_at(bytes, 0)?;
    file.sync_all()
}

/// A state path that is a symbolic link to nothing is refused: starting fresh
/// from it would silently drop whatever the link was meant to reach, and the
/// save would replace the link with a file.
fn refuse_dangling_link(path: &Path) -> Result<(), StateError> {
    let is_link =
        fs::symlink_metadata(path).is_ok_and(|metadata| metadata.file_type().is_symlink());
    if is_link && !path.exists() {
        let target = fs::read_link(path).unwrap_or_default();
        return Err(StateError::DanglingLink {
            path: path.to_owned(),
            target,
        });
    }
    Ok(())
}

async fn run_blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, StateError> + Send + 'static,
) -> Result<T, StateError> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|join_error| Err(StateError::Unavailable(join_error.to_string())))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn state(data: &[u8]) -> StoredState {
        StoredState {
            connector: "random".into(),
            data: data.to_vec(),
        }
    }

    #[tokio::test]
    async fn given_a_saved_state_when_loaded_should_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"abc")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"abc")));
        assert!(store.path_for("key").ends_with("source_key.state"));
    }

    #[tokio::test]
    async fn given_no_file_when_loaded_should_be_a_fresh_start() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path().join("nested/dir")).unwrap();
        assert_eq!(store.load("key").await.unwrap(), None);
    }

    #[tokio::test]
    async fn given_a_saved_state_when_written_should_be_readable_by_the_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"abc")).await.unwrap();
        let mode = fs::metadata(store.path_for("key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn given_a_corrupt_file_when_loaded_should_refuse_it_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        fs::write(store.path_for("key"), b"\xc1 definitely not msgpack").unwrap();
        let error = store.load("key").await.unwrap_err();
        assert!(matches!(error, StateError::Corrupt { .. }), "{error}");
        assert!(
            error
                .to_string()
                .contains(&store.path_for("key").display().to_string())
        );
    }

    #[tokio::test]
    async fn given_a_flipped_bit_in_the_data_when_loaded_should_fail_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"abcdefgh")).await.unwrap();
        let path = store.path_for("key");
        let mut bytes = fs::read(&path).unwrap();
        let at = bytes
            .windows(8)
            .position(|window| window == b"abcdefgh")
            .unwrap();
        bytes[at] ^= 0x01;
        fs::write(&path, bytes).unwrap();
        let error = store.load("key").await.unwrap_err();
        assert!(matches!(error, StateError::Corrupt { .. }), "{error}");
        assert!(error.to_string().contains("checksum mismatch"), "{error}");
        assert!(error.to_string().contains("source_key.state"), "{error}");
    }

    #[tokio::test]
    async fn given_a_crash_between_temp_write_and_rename_when_loaded_should_see_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"old")).await.unwrap();
        // What a crash right before the rename leaves behind: a complete temp file.
        let path = store.path_for("key");
        write_synced(&path.with_extension("state.tmp"), b"half-written new state").unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"old")));
        // The next save replaces the stale temp file and lands.
        store.save("key", &state(b"new")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"new")));
    }

    /// Flips a byte inside the copy of `data` in the state file.
    fn damage_copy_of(path: &Path, data: &[u8]) {
        let mut bytes = fs::read(path).unwrap();
        let at = bytes
            .windows(data.len())
            .position(|window| window == data)
            .unwrap();
        bytes[at] ^= 0x01;
        fs::write(path, bytes).unwrap();
    }

    #[tokio::test]
    async fn given_saves_in_turn_when_saved_should_overwrite_the_older_copy_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"first")).await.unwrap();
        let path = store.path_for("key");
        let inode = |path: &Path| std::os::unix::fs::MetadataExt::ino(&fs::metadata(path).unwrap());
        let created = inode(&path);
        for data in [&b"second"[..], b"third", b"fourth"] {
            store.save("key", &state(data)).await.unwrap();
            let restarted = FileStateStore::new(dir.path()).unwrap();
            assert_eq!(restarted.load("key").await.unwrap(), Some(state(data)));
        }
        assert_eq!(
            inode(&path),
            created,
            "saves rewrote the file instead of a slot"
        );
        assert!(!path.with_extension("state.tmp").exists());
        let bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 2 * MIN_SLOT);
        let contains = |data: &[u8]| bytes.windows(data.len()).any(|window| window == data);
        assert!(
            contains(b"third") && contains(b"fourth"),
            "the newest two saves are the copies"
        );
        assert!(!contains(b"second"), "the older copy was overwritten");
    }

    #[tokio::test]
    async fn given_a_torn_newest_copy_when_loaded_should_read_the_state_saved_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        for data in [&b"one"[..], b"two", b"three"] {
            store.save("key", &state(data)).await.unwrap();
        }
        // What a crash in the middle of the save of "three" leaves.
        let path = store.path_for("key");
        damage_copy_of(&path, b"three");
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"two")));
        // The next save goes into the damaged slot and keeps "two" until it lands.
        store.save("key", &state(b"four")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"four")));
        damage_copy_of(&path, b"four");
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"two")));
    }

    #[tokio::test]
    async fn given_both_copies_damaged_when_loaded_should_refuse_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"one")).await.unwrap();
        store.save("key", &state(b"two")).await.unwrap();
        let path = store.path_for("key");
        damage_copy_of(&path, b"one");
        damage_copy_of(&path, b"two");
        let error = store.load("key").await.unwrap_err();
        assert!(matches!(error, StateError::Corrupt { .. }), "{error}");
        let message = error.to_string();
        assert!(message.contains("neither of its two copies"), "{message}");
        assert!(message.contains("source_key.state"), "{message}");
        // Replacing the state (an operator's `state set`) writes it anew.
        store.save("key", &state(b"given")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"given")));
    }

    #[tokio::test]
    async fn given_states_of_changing_sizes_when_saved_in_turn_should_load_exactly_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        let long = vec![7u8; 3 * MIN_SLOT];
        for data in [
            &long[..100],
            &long[..],
            b"s",
            &long[..MIN_SLOT],
            b"",
            &long[..],
        ] {
            store.save("key", &state(data)).await.unwrap();
            let restarted = FileStateStore::new(dir.path()).unwrap();
            assert_eq!(restarted.load("key").await.unwrap(), Some(state(data)));
        }
        // The slots grew to hold the longest state once, and stayed.
        let size = fs::metadata(store.path_for("key")).unwrap().len();
        assert_eq!(size, 2 * 4 * MIN_SLOT as u64);
    }

    #[tokio::test]
    async fn given_a_state_file_of_the_one_envelope_format_when_loaded_should_be_read_and_the_next_save_converts_it()
     {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        let path = store.path_for("key");
        let envelope = FileStateStore::encode(&path, "key", &state(b"old")).unwrap();
        fs::write(&path, envelope).unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"old")));
        store.save("key", &state(b"new")).await.unwrap();
        assert_eq!(fs::metadata(&path).unwrap().len(), 2 * MIN_SLOT as u64);
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"new")));
        store.save("key", &state(b"newer")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"newer")));
    }

    #[tokio::test]
    async fn given_a_saved_state_when_cleared_should_leave_no_file_and_load_none() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"one")).await.unwrap();
        store.save("key", &state(b"two")).await.unwrap();
        store.clear("key").await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), None);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        store.save("key", &state(b"three")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"three")));
        store.clear("key").await.unwrap();
        store.clear("key").await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), None);
    }

    #[tokio::test]
    async fn given_the_state_file_removed_by_hand_when_saved_should_create_it_again() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"one")).await.unwrap();
        store.save("key", &state(b"two")).await.unwrap();
        fs::remove_file(store.path_for("key")).unwrap();
        assert_eq!(store.load("key").await.unwrap(), None);
        store.save("key", &state(b"three")).await.unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"three")));
        let mode = fs::metadata(store.path_for("key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }

    #[tokio::test]
    async fn given_another_sources_state_file_copied_over_when_loaded_should_refuse_it_naming_both_keys()
     {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("r2", &state(b"r2 position")).await.unwrap();
        fs::copy(store.path_for("r2"), store.path_for("r1")).unwrap();
        let error = store.load("r1").await.unwrap_err();
        assert!(matches!(error, StateError::WrongKey { .. }), "{error}");
        let message = error.to_string();
        for part in ["\"r2\"", "\"r1\"", "\"random\"", "source_r1.state"] {
            assert!(message.contains(part), "{part} missing from: {message}");
        }
        assert_eq!(store.load("r2").await.unwrap(), Some(state(b"r2 position")));
    }

    #[tokio::test]
    async fn given_a_state_file_written_before_keys_were_recorded_when_loaded_should_be_read() {
        #[derive(Serialize)]
        struct OldEnvelope {
            format: u32,
            connector: String,
            crc32: u32,
            #[serde(with = "serde_bytes")]
            data: Vec<u8>,
        }
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        let old = OldEnvelope {
            format: FORMAT_VERSION,
            connector: "random".into(),
            crc32: crc32fast::hash(b"old"),
            data: b"old".to_vec(),
        };
        fs::write(
            store.path_for("key"),
            rmp_serde::to_vec_named(&old).unwrap(),
        )
        .unwrap();
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"old")));
        // The next save records the key.
        store.save("key", &state(b"new")).await.unwrap();
        fs::copy(store.path_for("key"), store.path_for("other")).unwrap();
        assert!(matches!(
            store.load("other").await,
            Err(StateError::WrongKey { .. })
        ));
    }

    #[tokio::test]
    async fn given_a_dangling_symlink_as_the_state_path_when_loaded_or_saved_should_refuse_and_keep_the_link()
     {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        let path = store.path_for("key");
        let target = dir.path().join("elsewhere/missing.state");
        std::os::unix::fs::symlink(&target, &path).unwrap();
        let error = store.load("key").await.unwrap_err();
        assert!(matches!(error, StateError::DanglingLink { .. }), "{error}");
        assert!(error.to_string().contains("missing.state"), "{error}");
        let error = store.save("key", &state(b"new")).await.unwrap_err();
        assert!(matches!(error, StateError::DanglingLink { .. }), "{error}");
        assert!(
            fs::symlink_metadata(&path)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(fs::read_link(&path).unwrap(), target);
    }

    #[tokio::test]
    async fn given_an_unwritable_directory_when_saving_should_fail_and_keep_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStateStore::new(dir.path()).unwrap();
        store.save("key", &state(b"old")).await.unwrap();
        // A state too big for its slot is written through the temp file; a
        // directory in its place makes that fail for every user, root included.
        let path = store.path_for("key");
        fs::create_dir(path.with_extension("state.tmp")).unwrap();
        let big = vec![1u8; 2 * MIN_SLOT];
        let error = store.save("key", &state(&big)).await.unwrap_err();
        assert!(matches!(error, StateError::Write { .. }), "{error}");
        assert!(error.to_string().contains("source_key.state"), "{error}");
        assert_eq!(store.load("key").await.unwrap(), Some(state(b"old")));
    }
}
