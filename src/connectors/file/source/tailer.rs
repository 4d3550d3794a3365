//! Following files: which file a path holds now (scan), and reading each
//! followed file on from its offset (read).
//!
//! A file is known by its device and inode and by its first bytes (the
//! fingerprint). A path whose inode is followed and whose first bytes are
//! unchanged is that file, perhaps renamed (rotation by rename). A followed
//! file that became shorter than its offset or whose first bytes changed was
//! truncated (copytruncate): it is let go, and a path that starts with its
//! first bytes (the copy) takes its place at its offset, while what the
//! truncated path holds now is a new file. A new path that starts with the
//! first bytes of a file still followed is a copy being made: left alone.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::checkpoint::{Checkpoint, FileState, Fingerprint};
use super::config::Settings;
use crate::message::{HeaderValue, Headers, Payload, SourceRecord};

/// Every file followed, and the scan that finds them.
pub struct Tailer {
    settings: Arc<Settings>,
    files: Vec<Tracked>,
    /// `read_from` applies to the files of the first scan of a source
    /// without state.
    first_scan: bool,
    last_scan: Option<Instant>,
    /// Paths that could not be opened, warned about once.
    refused: HashSet<PathBuf>,
    /// Which file the next batch starts with, so no file starves the rest.
    next_first: usize,
    /// A file was found truncated since the last scan.
    truncated: bool,
    buffer: Vec<u8>,
}

/// One file followed (or a checkpoint waiting for its file to show up).
struct Tracked {
    path: PathBuf,
    device: u64,
    inode: u64,
    fingerprint: Fingerprint,
    /// The first bytes (up to `fingerprint_bytes`), to tell a copy being made.
    head: Vec<u8>,
    /// `None`: restored from state and not found yet, or truncated and
    /// waiting for its copy.
    file: Option<File>,
    /// The first byte not sent (the start of a pending multi-line record).
    offset: u64,
    /// Where reading goes on.
    read_to: u64,
    /// The multi-line record being assembled (it starts at `offset`).
    pending: Vec<u8>,
    gzip: Option<Box<BufReader<flate2::read::MultiGzDecoder<File>>>>,
    done: bool,
    /// Since when no path of the globs holds it (or it was truncated).
    missing_since: Option<Instant>,
    last_data: Instant,
}

impl Tailer {
    pub fn new(settings: Arc<Settings>, restored: Option<FileState>) -> Self {
        let first_scan = restored.is_none();
        let now = Instant::now();
        let files = restored
            .map(|state| state.files)
            .unwrap_or_default()
            .into_iter()
            .map(|checkpoint| Tracked {
                path: PathBuf::from(checkpoint.path),
                device: checkpoint.device,
                inode: checkpoint.inode,
                fingerprint: checkpoint.fingerprint,
                head: Vec::new(),
                file: None,
                offset: checkpoint.offset,
                read_to: checkpoint.offset,
                pending: Vec::new(),
                gzip: None,
                done: checkpoint.done,
                missing_since: Some(now),
                last_data: now,
            })
            .collect();
        Self {
            settings,
            files,
            first_scan,
            last_scan: None,
            refused: HashSet::new(),
            next_first: 0,
            truncated: false,
            buffer: Vec::new(),
        }
    }

    /// The records beyond the files' offsets, up to `batch_size`; the
    /// offsets move past them.
    pub fn read_batch(&mut self) -> Vec<SourceRecord> {
        if self
            .last_scan
            .is_none_or(|at| at.elapsed() >= self.settings.scan_interval)
        {
            self.scan();
            self.last_scan = Some(Instant::now());
        }
        let mut records = Vec::new();
        let count = self.files.len();
        for step in 0..count {
            if records.len() >= self.settings.batch_size {
                break;
            }
            let index = (self.next_first + step) % count;
            let budget = self.settings.batch_size - records.len();
            let mut tracked = std::mem::replace(&mut self.files[index], Tracked::placeholder());
            let read = self.read_file(&mut tracked, budget, &mut records);
            if let Err(error) = read {
                // What this file gave before the error stays in the batch;
                // it is read on from there next time.
                warn!(path = %tracked.path.display(), %error, "file source could not read a file");
            }
            self.files[index] = tracked;
        }
        self.next_first = self.next_first.wrapping_add(1);
        if std::mem::take(&mut self.truncated) {
            // Its copy is looked for before anything is let go.
            self.scan();
        }
        let rotate_wait = self.settings.rotate_wait;
        self.files.retain(|tracked| !tracked.finished(rotate_wait));
        records
    }

    /// The checkpoints once the records read so far are in Iggy.
    pub fn state(&self) -> FileState {
        FileState {
            files: self
                .files
                .iter()
                .map(|tracked| Checkpoint {
                    path: tracked.path.display().to_string(),
                    device: tracked.device,
                    inode: tracked.inode,
                    fingerprint: tracked.fingerprint,
                    offset: tracked.offset,
                    done: tracked.done,
                })
                .collect(),
        }
    }

    /// Matches the paths of the globs to the files followed.
    fn scan(&mut self) {
        let now = Instant::now();
        let paths = self.matching_paths();
        let mut claimed = vec![false; self.files.len()];
        let mut rest = Vec::new();
        for (path, metadata) in paths {
            let same_inode = self.files.iter().position(|tracked| {
                tracked.file.is_some()
                    && tracked.device == metadata.dev()
                    && tracked.inode == metadata.ino()
            });
            match same_inode {
                Some(index) => {
                    claimed[index] = true;
                    self.files[index].path = path;
                }
                None => rest.push((path, metadata)),
            }
        }
        let first_scan = std::mem::replace(&mut self.first_scan, false);
        for (path, metadata) in rest {
            if let Err(error) = self.place(&path, &metadata, &mut claimed, first_scan)
                && self.refused.insert(path.clone())
            {
                warn!(path = %path.display(), %error, "file source cannot read a file its globs match");
            }
        }
        for (tracked, claimed) in self.files.iter_mut().zip(claimed) {
            if claimed {
                tracked.missing_since = None;
            } else {
                tracked.missing_since.get_or_insert(now);
            }
        }
    }

    /// A path whose inode is not followed: a followed file's copy or new
    /// place, a copy being made, or a new file.
    fn place(
        &mut self,
        path: &Path,
        metadata: &std::fs::Metadata,
        claimed: &mut Vec<bool>,
        first_scan: bool,
    ) -> io::Result<()> {
        let file = File::open(path)?;
        let head = read_head(&file, self.settings.fingerprint_bytes)?;
        let length = metadata.len();
        let waiting = self.files.iter().position(|tracked| {
            tracked.file.is_none()
                && tracked.fingerprint.length > 0
                && head.len() >= tracked.fingerprint.length as usize
                && Fingerprint::of(&head[..tracked.fingerprint.length as usize])
                    == tracked.fingerprint
                && (length >= tracked.offset || is_gzip(path))
        });
        if let Some(index) = waiting {
            let tracked = &mut self.files[index];
            info!(path = %path.display(), offset = tracked.offset, "file source follows a file at its new place");
            tracked.attach(path, metadata, file, head)?;
            claimed[index] = true;
            return Ok(());
        }
        let copy = !head.is_empty()
            && self.files.iter().any(|tracked| {
                tracked.file.is_some()
                    && !tracked.head.is_empty()
                    && (head.starts_with(&tracked.head) || tracked.head.starts_with(&head))
            });
        if copy {
            return Ok(());
        }
        let gzip = is_gzip(path);
        let offset = if first_scan && self.settings.read_from_end && !gzip {
            length
        } else {
            0
        };
        let mut tracked = Tracked::placeholder();
        tracked.offset = offset;
        tracked.read_to = offset;
        tracked.attach(path, metadata, file, head)?;
        self.files.push(tracked);
        claimed.push(true);
        Ok(())
    }

    fn matching_paths(&self) -> Vec<(PathBuf, std::fs::Metadata)> {
        let mut seen = HashSet::new();
        let mut paths = Vec::new();
        for pattern in &self.settings.include {
            let Ok(entries) = glob::glob(pattern) else {
                continue;
            };
            for path in entries.flatten() {
                if self
                    .settings
                    .exclude
                    .iter()
                    .any(|exclude| exclude.matches_path(&path))
                    || !seen.insert(path.clone())
                {
                    continue;
                }
                if let Ok(metadata) = std::fs::metadata(&path)
                    && metadata.is_file()
                {
                    paths.push((path, metadata));
                }
            }
        }
        paths
    }

    /// Reads `tracked` on, up to `budget` records.
    fn read_file(
        &mut self,
        tracked: &mut Tracked,
        budget: usize,
        records: &mut Vec<SourceRecord>,
    ) -> io::Result<()> {
        if tracked.done || tracked.file.is_none() {
            return Ok(());
        }
        if tracked.gzip.is_some() {
            return self.read_gzip(tracked, budget, records);
        }
        let (length, head) = match tracked.file.as_ref() {
            Some(file) => (
                file.metadata()?.len(),
                read_head(file, tracked.fingerprint.length as usize)?,
            ),
            None => return Ok(()),
        };
        if length < tracked.read_to || Fingerprint::of(&head) != tracked.fingerprint {
            info!(path = %tracked.path.display(), offset = tracked.offset, "file source found a file truncated; looking for its copy");
            tracked.file = None;
            tracked.head.clear();
            tracked.pending.clear();
            tracked.read_to = tracked.offset;
            tracked.missing_since.get_or_insert_with(Instant::now);
            self.truncated = true;
            return Ok(());
        }
        if tracked.head.len() < self.settings.fingerprint_bytes
            && length > tracked.head.len() as u64
            && let Some(file) = tracked.file.as_ref()
        {
            tracked.head = read_head(file, self.settings.fingerprint_bytes)?;
            tracked.fingerprint = Fingerprint::of(&tracked.head);
        }
        let start = records.len();
        // Grows only while a line does not fit, so a batch reads about what
        // it sends.
        let mut window = CHUNK;
        while records.len() - start < budget && tracked.read_to < length {
            let available = length - tracked.read_to;
            let want = available.min(window as u64) as usize;
            if self.buffer.len() < want {
                self.buffer.resize(want, 0);
            }
            let got = match tracked.file.as_ref() {
                Some(file) => file.read_at(&mut self.buffer[..want], tracked.read_to)?,
                None => 0,
            };
            if got == 0 {
                break;
            }
            let consumed =
                self.split_lines(tracked, got, budget - (records.len() - start), records);
            if consumed > 0 {
                tracked.last_data = Instant::now();
                continue;
            }
            if got as u64 == available || window > self.settings.max_line_bytes {
                // A partial last line: wait for its newline.
                break;
            }
            window *= 2;
        }
        if tracked.read_to == length {
            self.flush_when_idle(tracked, records);
        }
        Ok(())
    }

    /// Takes whole lines from the first `got` bytes of the buffer (and a
    /// line too long in pieces); returns the bytes consumed.
    fn split_lines(
        &self,
        tracked: &mut Tracked,
        got: usize,
        budget: usize,
        records: &mut Vec<SourceRecord>,
    ) -> usize {
        let mut consumed = 0;
        let mut emitted = 0;
        while emitted < budget {
            let rest = &self.buffer[consumed..got];
            let (line, step) = match rest.iter().position(|byte| *byte == b'\n') {
                Some(end) if end <= self.settings.max_line_bytes => (&rest[..end], end + 1),
                _ if rest.len() >= self.settings.max_line_bytes => {
                    let piece = self.settings.max_line_bytes;
                    (&rest[..piece], piece)
                }
                _ => break,
            };
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let line_start = tracked.read_to;
            tracked.read_to += step as u64;
            emitted += self.push_line(tracked, line, line_start, records);
            consumed += step;
        }
        consumed
    }

    /// One line read: a record, or part of a multi-line one. Returns how
    /// many records it completed.
    fn push_line(
        &self,
        tracked: &mut Tracked,
        line: &[u8],
        line_start: u64,
        records: &mut Vec<SourceRecord>,
    ) -> usize {
        let Some(start) = &self.settings.multiline_start else {
            records.push(self.record(tracked, line.to_vec(), line_start));
            tracked.offset = tracked.read_to;
            return 1;
        };
        if tracked.pending.is_empty() {
            tracked.offset = line_start;
            tracked.pending.extend_from_slice(line);
            return 0;
        }
        if start.is_match(line) {
            let record = std::mem::take(&mut tracked.pending);
            records.push(self.record(tracked, record, tracked.offset));
            tracked.offset = line_start;
            tracked.pending.extend_from_slice(line);
            return 1;
        }
        tracked.pending.push(b'\n');
        tracked.pending.extend_from_slice(line);
        0
    }

    /// At the end of a file: the pending multi-line record once the file
    /// was quiet for `multiline_timeout`, and, for a file about to be let
    /// go, the last line without its newline.
    fn flush_when_idle(&self, tracked: &mut Tracked, records: &mut Vec<SourceRecord>) {
        let quiet = tracked.last_data.elapsed();
        if !tracked.pending.is_empty() && quiet >= self.settings.multiline_timeout {
            let record = std::mem::take(&mut tracked.pending);
            records.push(self.record(tracked, record, tracked.offset));
            tracked.offset = tracked.read_to;
        }
        if tracked.finished(self.settings.rotate_wait) {
            // A partial last line of a file let go is all there will be.
            self.flush_partial_line(tracked, records);
        }
    }

    fn flush_partial_line(&self, tracked: &mut Tracked, records: &mut Vec<SourceRecord>) {
        let Some(file) = tracked.file.as_ref() else {
            return;
        };
        let Ok(length) = file.metadata().map(|metadata| metadata.len()) else {
            return;
        };
        if length <= tracked.read_to {
            return;
        }
        let mut tail = vec![0; (length - tracked.read_to) as usize];
        if file.read_exact_at(&mut tail, tracked.read_to).is_ok() {
            let start = tracked.read_to;
            tracked.read_to = length;
            records.push(self.record(tracked, tail, start));
            tracked.offset = length;
        }
    }

    /// A `.gz` file: decompressed and read on from its offset (in
    /// decompressed bytes) to its end, once.
    fn read_gzip(
        &self,
        tracked: &mut Tracked,
        budget: usize,
        records: &mut Vec<SourceRecord>,
    ) -> io::Result<()> {
        let Some(reader) = tracked.gzip.as_mut() else {
            return Ok(());
        };
        let mut lines = Vec::new();
        let mut line = Vec::new();
        while lines.len() < budget {
            line.clear();
            let read = reader.read_until(b'\n', &mut line)?;
            if read == 0 {
                break;
            }
            lines.push((std::mem::take(&mut line), read));
        }
        let at_end = lines.len() < budget;
        for (mut bytes, read) in lines {
            if bytes.last() == Some(&b'\n') {
                bytes.pop();
            }
            let start = tracked.read_to;
            tracked.read_to += read as u64;
            records.push(self.record(tracked, bytes, start));
            tracked.offset = tracked.read_to;
        }
        if at_end {
            tracked.done = true;
            tracked.gzip = None;
        }
        Ok(())
    }

    fn record(&self, tracked: &Tracked, bytes: Vec<u8>, offset: u64) -> SourceRecord {
        let payload = match String::from_utf8(bytes) {
            Ok(text) => Payload::Text(text),
            Err(error) => Payload::Raw(error.into_bytes().into()),
        };
        let mut record = SourceRecord::new(payload);
        // One file's lines go to one partition, in order.
        record.partition = Some((tracked.inode ^ tracked.device.rotate_left(32)) as u32);
        if self.settings.headers {
            let headers: Headers = vec![
                (
                    "file".into(),
                    HeaderValue::String(tracked.path.display().to_string().into()),
                ),
                ("offset".into(), HeaderValue::UInt(offset)),
            ];
            record.headers = headers;
        }
        record
    }
}

/// Bytes read from a file per read call.
const CHUNK: usize = 128 * 1024;

impl Tracked {
    fn placeholder() -> Self {
        let now = Instant::now();
        Self {
            path: PathBuf::new(),
            device: 0,
            inode: 0,
            fingerprint: Fingerprint::default(),
            head: Vec::new(),
            file: None,
            offset: 0,
            read_to: 0,
            pending: Vec::new(),
            gzip: None,
            done: false,
            missing_since: None,
            last_data: now,
        }
    }

    /// Follows `file` at `path` from this entry's offset.
    fn attach(
        &mut self,
        path: &Path,
        metadata: &std::fs::Metadata,
        file: File,
        head: Vec<u8>,
    ) -> io::Result<()> {
        self.path = path.to_path_buf();
        self.device = metadata.dev();
        self.inode = metadata.ino();
        self.read_to = self.offset;
        self.pending.clear();
        self.missing_since = None;
        self.last_data = Instant::now();
        if is_gzip(path) {
            self.fingerprint = Fingerprint::of(&head);
            self.head = head;
            if !self.done {
                let mut reader =
                    BufReader::new(flate2::read::MultiGzDecoder::new(file.try_clone()?));
                io::copy(&mut (&mut reader).take(self.offset), &mut io::sink())?;
                self.gzip = Some(Box::new(reader));
            }
            self.file = Some(file);
            return Ok(());
        }
        if self.fingerprint.length as usize > head.len() {
            return Err(io::Error::other("the file is shorter than its fingerprint"));
        }
        self.fingerprint = Fingerprint::of(&head);
        self.head = head;
        self.file = Some(file);
        Ok(())
    }

    /// Let go: gone from the globs (or truncated) and quiet for
    /// `rotate_wait`, read to its end; or a `.gz` read whole whose path is gone.
    fn finished(&self, rotate_wait: Duration) -> bool {
        let Some(missing_since) = self.missing_since else {
            return false;
        };
        missing_since.elapsed() >= rotate_wait && self.last_data.elapsed() >= rotate_wait
    }
}

fn is_gzip(path: &Path) -> bool {
    path.extension().is_some_and(|extension| extension == "gz")
}

/// The first `length` bytes of the file (fewer if it is shorter).
fn read_head(file: &File, length: usize) -> io::Result<Vec<u8>> {
    let mut head = vec![0; length];
    let mut filled = 0;
    while filled < length {
        let got = file.read_at(&mut head[filled..], filled as u64)?;
        if got == 0 {
            break;
        }
        filled += got;
    }
    head.truncate(filled);
    Ok(head)
}
