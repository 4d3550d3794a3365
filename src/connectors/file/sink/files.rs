//! The files the sink appends to: one current file per stream, topic and
//! partition, rotated by template, size and age; each batch compressed as
//! one frame, appended, and fsynced before the write is reported durable.
//!
//! A crash (SIGKILL, power loss) can leave a torn frame or line at the end of
//! a file. Nothing in it was reported durable, and the engine writes it again
//! after the restart; so when the sink opens a file that already holds data
//! it first cuts it back to its last complete line (uncompressed) or frame
//! (gzip member, zstd frame), and appends after that.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tracing::warn;

use super::config::Compression;
use super::output::Chunk;

/// When the current file of a partition gives way to a new one.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rotation {
    pub max_bytes: Option<u64>,
    pub max_age: Option<Duration>,
}

/// How an I/O error is answered: `Fatal` where the config cannot work
/// (permissions, a read-only file system, a directory where a file should
/// be), `Transient` for the rest (a full disk, an I/O error).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    Fatal,
    Transient,
}

pub fn classify(error: &io::Error) -> Class {
    match error.kind() {
        io::ErrorKind::PermissionDenied
        | io::ErrorKind::ReadOnlyFilesystem
        | io::ErrorKind::IsADirectory
        | io::ErrorKind::NotADirectory
        | io::ErrorKind::InvalidInput
        | io::ErrorKind::InvalidFilename => Class::Fatal,
        _ => Class::Transient,
    }
}

pub struct Files {
    compression: Compression,
    rotation: Rotation,
    /// The current file of each slot (stream, topic, partition).
    current: HashMap<String, Current>,
}

struct Current {
    /// The template's path with `{offset}` in it, that this file is for.
    base: String,
    path: PathBuf,
    file: File,
    length: u64,
    opened: Instant,
    /// Written since its last fsync.
    dirty: bool,
}

impl Files {
    pub fn new(compression: Compression, rotation: Rotation) -> Self {
        Self {
            compression,
            rotation,
            current: HashMap::new(),
        }
    }

    /// Appends every chunk to its file and fsyncs each file written. On an
    /// error, every file written is cut back to its length before the batch
    /// and closed (opened again, checked, by the next write).
    pub fn append(&mut self, chunks: Vec<Chunk>) -> io::Result<()> {
        let mut before: Vec<(PathBuf, u64)> = Vec::new();
        let result = self.append_all(chunks, &mut before);
        if result.is_err() {
            self.current
                .retain(|_, current| !before.iter().any(|(path, _)| *path == current.path));
            for (path, length) in &before {
                let cut = OpenOptions::new()
                    .write(true)
                    .open(path)
                    .and_then(|file| file.set_len(*length));
                if let Err(error) = cut {
                    // The torn tail is cut when the file is next opened.
                    warn!(path = %path.display(), %error, "could not cut a failed write back");
                }
            }
        }
        result
    }

    fn append_all(
        &mut self,
        chunks: Vec<Chunk>,
        before: &mut Vec<(PathBuf, u64)>,
    ) -> io::Result<()> {
        for chunk in chunks {
            let frame = compress(&chunk.bytes, self.compression)?;
            let current = self.current_for(&chunk)?;
            if !before.iter().any(|(path, _)| *path == current.path) {
                before.push((current.path.clone(), current.length));
            }
            current.dirty = true;
            current.file.write_all(&frame)?;
            current.length += frame.len() as u64;
        }
        for current in self.current.values_mut().filter(|current| current.dirty) {
            current.file.sync_data()?;
            current.dirty = false;
        }
        Ok(())
    }

    /// The chunk's file: the slot's current one, or a new one when the base
    /// changed or the current one is due for rotation.
    fn current_for(&mut self, chunk: &Chunk) -> io::Result<&mut Current> {
        let keep = self.current.get(&chunk.slot).is_some_and(|current| {
            current.base == chunk.base && !self.rotation.due(current.length, current.opened)
        });
        if !keep {
            if let Some(old) = self.current.remove(&chunk.slot)
                && old.dirty
            {
                old.file.sync_data()?;
            }
            let path = chunk.path();
            let (file, length) = open_for_append(&path, self.compression)?;
            self.current.insert(
                chunk.slot.clone(),
                Current {
                    base: chunk.base.clone(),
                    path,
                    file,
                    length,
                    opened: Instant::now(),
                    dirty: false,
                },
            );
        }
        self.current
            .get_mut(&chunk.slot)
            .ok_or_else(|| io::Error::other("no current file"))
    }

    /// Everything written is already fsynced: closing drops the handles.
    pub fn close_all(&mut self) {
        self.current.clear();
    }
}

impl Rotation {
    fn due(&self, length: u64, opened: Instant) -> bool {
        self.max_bytes.is_some_and(|max| length >= max)
            || self.max_age.is_some_and(|max| opened.elapsed() >= max)
    }
}

/// Opens (or creates, with its directories) `path` for appending, cut back
/// to its last complete line or frame; returns it and its length.
fn open_for_append(path: &Path, compression: Compression) -> io::Result<(File, u64)> {
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        create_directories(parent)?;
    }
    let existed = path.try_exists()?;
    let file = OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .open(path)?;
    let length = file.metadata()?.len();
    let complete = if length == 0 {
        0
    } else {
        complete_prefix(&file, compression, length)?
    };
    if complete < length {
        warn!(
            path = %path.display(),
            cut = length - complete,
            "cutting a torn tail left by a crash (data not reported durable, written again)"
        );
        file.set_len(complete)?;
        file.sync_data()?;
    }
    if !existed {
        sync_directory(path.parent())?;
    }
    Ok((file, complete))
}

/// `create_dir_all`, with each directory it created fsynced into its parent.
fn create_directories(directory: &Path) -> io::Result<()> {
    if directory.try_exists()? {
        return Ok(());
    }
    if let Some(parent) = directory
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        create_directories(parent)?;
    }
    match std::fs::create_dir(directory) {
        Ok(()) => sync_directory(directory.parent()),
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        Err(error) => Err(error),
    }
}

fn sync_directory(directory: Option<&Path>) -> io::Result<()> {
    let directory = match directory {
        Some(directory) if !directory.as_os_str().is_empty() => directory,
        _ => Path::new("."),
    };
    File::open(directory)?.sync_all()
}

/// The length of the file's complete part: up to its last newline, or its
/// last whole gzip member or zstd frame.
fn complete_prefix(file: &File, compression: Compression, length: u64) -> io::Result<u64> {
    match compression {
        Compression::None => after_last_newline(file, length),
        Compression::Gzip | Compression::Zstd => whole_frames(file, compression),
    }
}

fn after_last_newline(mut file: &File, length: u64) -> io::Result<u64> {
    const STEP: u64 = 64 * 1024;
    let mut end = length;
    let mut buffer = vec![0; STEP as usize];
    while end > 0 {
        let start = end.saturating_sub(STEP);
        let window = &mut buffer[..(end - start) as usize];
        file.seek(SeekFrom::Start(start))?;
        file.read_exact(window)?;
        if let Some(at) = window.iter().rposition(|byte| *byte == b'\n') {
            return Ok(start + at as u64 + 1);
        }
        end = start;
    }
    Ok(0)
}

/// Decodes frame after frame; the end of the last one that decodes whole.
fn whole_frames(mut file: &File, compression: Compression) -> io::Result<u64> {
    file.seek(SeekFrom::Start(0))?;
    let mut reader = BufReader::new(file);
    let mut complete = 0;
    while !reader.fill_buf()?.is_empty() {
        let decoded = match compression {
            Compression::Gzip => io::copy(
                &mut flate2::bufread::GzDecoder::new(&mut reader),
                &mut io::sink(),
            ),
            _ => zstd::stream::read::Decoder::with_buffer(&mut reader)
                .map(zstd::stream::read::Decoder::single_frame)
                .and_then(|mut decoder| io::copy(&mut decoder, &mut io::sink())),
        };
        if decoded.is_err() {
            break;
        }
        let end = reader.stream_position()?;
        if end == complete {
            break;
        }
        complete = end;
    }
    Ok(complete)
}

/// One batch as one frame: a gzip member or a zstd frame with its checksum,
/// so a torn one never decodes.
fn compress(bytes: &[u8], compression: Compression) -> io::Result<std::borrow::Cow<'_, [u8]>> {
    match compression {
        Compression::None => Ok(std::borrow::Cow::Borrowed(bytes)),
        Compression::Gzip => {
            let mut encoder = flate2::write::GzEncoder::new(
                Vec::with_capacity(bytes.len() / 4),
                flate2::Compression::default(),
            );
            encoder.write_all(bytes)?;
            encoder.finish().map(std::borrow::Cow::Owned)
        }
        Compression::Zstd => {
            let mut encoder =
                zstd::stream::write::Encoder::new(Vec::with_capacity(bytes.len() / 4), 3)?;
            encoder.include_checksum(true)?;
            encoder.write_all(bytes)?;
            encoder.finish().map(std::borrow::Cow::Owned)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(base: &str, first_offset: u64, bytes: &[u8]) -> Chunk {
        Chunk {
            slot: "stream/topic/1".into(),
            base: base.into(),
            first_offset,
            bytes: bytes.to_vec(),
        }
    }

    fn decode(path: &Path, compression: Compression) -> Vec<u8> {
        let bytes = std::fs::read(path).unwrap();
        let mut out = Vec::new();
        match compression {
            Compression::None => out = bytes,
            Compression::Gzip => {
                flate2::read::MultiGzDecoder::new(&bytes[..])
                    .read_to_end(&mut out)
                    .unwrap();
            }
            Compression::Zstd => {
                zstd::stream::read::Decoder::new(&bytes[..])
                    .unwrap()
                    .read_to_end(&mut out)
                    .unwrap();
            }
        }
        out
    }

    #[test]
    fn given_a_torn_tail_when_the_file_is_opened_again_should_cut_it_and_append_after_the_last_whole_frame()
     {
        for compression in [Compression::None, Compression::Gzip, Compression::Zstd] {
            let dir = tempfile::tempdir().unwrap();
            let base = dir.path().join("out.log").display().to_string();
            let mut files = Files::new(compression, Rotation::default());
            files.append(vec![chunk(&base, 0, b"one\ntwo\n")]).unwrap();
            files.append(vec![chunk(&base, 2, b"three\n")]).unwrap();
            files.close_all();
            // A crash in the middle of the next frame (line).
            let frame = compress(b"four\nfive\n", compression).unwrap();
            let torn = match compression {
                Compression::None => &frame[..3],
                _ => &frame[..frame.len() - 3],
            };
            let mut file = OpenOptions::new().append(true).open(&base).unwrap();
            file.write_all(torn).unwrap();
            drop(file);

            let mut files = Files::new(compression, Rotation::default());
            files
                .append(vec![chunk(&base, 3, b"four\nfive\n")])
                .unwrap();
            assert_eq!(
                String::from_utf8(decode(Path::new(&base), compression)).unwrap(),
                "one\ntwo\nthree\nfour\nfive\n",
                "{compression:?}"
            );
        }
    }

    #[test]
    fn given_a_size_limit_when_reached_should_start_a_file_named_by_the_next_offset() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir
            .path()
            .join("deep/er/{offset}.log")
            .display()
            .to_string();
        let rotation = Rotation {
            max_bytes: Some(8),
            max_age: None,
        };
        let mut files = Files::new(Compression::None, rotation);
        files.append(vec![chunk(&base, 0, b"0\n1\n2\n")]).unwrap();
        files.append(vec![chunk(&base, 3, b"3\n4\n")]).unwrap();
        files.append(vec![chunk(&base, 5, b"5\n")]).unwrap();
        let read =
            |name: &str| std::fs::read_to_string(dir.path().join("deep/er").join(name)).unwrap();
        assert_eq!(read("0.log"), "0\n1\n2\n3\n4\n");
        assert_eq!(read("5.log"), "5\n");
    }

    #[test]
    fn given_a_file_where_a_directory_should_be_when_appending_should_be_fatal_and_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("blocker"), "x").unwrap();
        let base = dir.path().join("blocker/out.log").display().to_string();
        let mut files = Files::new(Compression::None, Rotation::default());
        let error = files.append(vec![chunk(&base, 0, b"a\n")]).unwrap_err();
        assert_eq!(classify(&error), Class::Fatal, "{error}");
    }
}
