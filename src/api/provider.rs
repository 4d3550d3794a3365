//! Connector config versions in the local connector directory, as upstream's
//! local provider keeps them: one file per version, written by the API as
//! `{type}_{key}_{version}.toml`, and `.active_versions.toml` naming the active
//! version of each key (else the highest wins).
//!
//! Every file is parsed with the same parser as at startup, so what the API
//! shows, accepts and restarts with is exactly what a process restart would run.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use toml::{Table, Value};

use crate::config::env::EnvVars;
use crate::config::{
    ConfigIssue, ConfigIssues, ConnectorConfig, is_connector_file, parse_connector_file,
};
use crate::connectors::ConnectorKind;

pub const ACTIVE_VERSIONS_FILE: &str = ".active_versions.toml";

/// The longest key a config can be created for: the file name
/// `{type}_{key}_{version}.toml` stays well under the usual 255-byte limit.
pub const MAX_KEY_LENGTH: usize = 200;

/// How many taken version numbers a create skips (files another process
/// wrote meanwhile) before it gives up.
const CREATE_ATTEMPTS: u64 = 64;

pub struct LocalProvider {
    dir: PathBuf,
    vars: EnvVars,
    /// Held while a version number is chosen and its file written, and while
    /// `.active_versions.toml` is read, changed and written, so concurrent
    /// requests never pick the same version or lose a pointer update.
    writing: Mutex<()>,
}

/// One version of a connector's config, as stored.
#[derive(Debug, Clone)]
pub struct StoredConfig {
    pub config: ConnectorConfig,
    /// The file's creation time (else its modification time), microseconds.
    pub created_at: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("no config version {version}")]
    VersionNotFound { version: u64 },
    #[error("no config for this key")]
    NoConfig,
    #[error("{0}")]
    Invalid(ConfigIssues),
    #[error("{0}")]
    BadRequest(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// What a file says about itself before it is fully parsed.
struct Candidate {
    file: PathBuf,
    version: u64,
}

impl LocalProvider {
    pub fn new(dir: PathBuf, vars: EnvVars) -> Self {
        Self {
            dir,
            vars,
            writing: Mutex::new(()),
        }
    }

    fn lock_writing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.writing
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Every valid version of a key, lowest first. Files that do not parse are
    /// left out (the startup report and `validate` name them).
    pub fn versions(
        &self,
        kind: ConnectorKind,
        key: &str,
    ) -> Result<Vec<StoredConfig>, ProviderError> {
        let mut versions = Vec::new();
        for candidate in self.candidates(kind, key)? {
            if let Ok(stored) = self.load(&candidate.file) {
                versions.push(stored);
            }
        }
        versions.sort_by_key(|stored| stored.config.version);
        Ok(versions)
    }

    pub fn version(
        &self,
        kind: ConnectorKind,
        key: &str,
        version: u64,
    ) -> Result<StoredConfig, ProviderError> {
        let candidate = self
            .candidates(kind, key)?
            .into_iter()
            .find(|candidate| candidate.version == version)
            .ok_or(ProviderError::VersionNotFound { version })?;
        self.load(&candidate.file)
    }

    /// The version named in `.active_versions.toml`, else the highest.
    pub fn active_version(&self, kind: ConnectorKind, key: &str) -> Result<u64, ProviderError> {
        if let Some(version) = self.pointer(kind, key)? {
            return Ok(version);
        }
        self.candidates(kind, key)?
            .iter()
            .map(|candidate| candidate.version)
            .max()
            .ok_or(ProviderError::NoConfig)
    }

    /// The active config: what the next start or restart runs. A broken file is
    /// an error here, never silently skipped.
    pub fn active(&self, kind: ConnectorKind, key: &str) -> Result<StoredConfig, ProviderError> {
        let version = self.active_version(kind, key)?;
        self.version(kind, key, version)
    }

    /// Whether any file declares this key.
    pub fn has_key(&self, kind: ConnectorKind, key: &str) -> Result<bool, ProviderError> {
        Ok(!self.candidates(kind, key)?.is_empty())
    }

    /// Writes `body` (a connector file as JSON, without `type`, `key` and
    /// `version`) as the next version, after checking it with the startup
    /// parser. Nothing is written when the config has an error.
    pub fn create(
        &self,
        kind: ConnectorKind,
        key: &str,
        body: serde_json::Value,
    ) -> Result<StoredConfig, ProviderError> {
        check_key(key)?;
        let serde_json::Value::Object(fields) = body else {
            return Err(ProviderError::BadRequest(
                "expected a JSON object with the connector's fields".into(),
            ));
        };
        let _writing = self.lock_writing();
        let mut version = self
            .candidates(kind, key)?
            .iter()
            .map(|candidate| candidate.version + 1)
            .max()
            .unwrap_or(0);
        // The lock orders this process's creates; `create_new_file` refuses a
        // name another process took meanwhile, and the next number is tried.
        for _ in 0..CREATE_ATTEMPTS {
            let mut table = Table::new();
            table.insert("type".into(), Value::String(kind.to_string()));
            table.insert("key".into(), Value::String(key.to_owned()));
            table.insert("version".into(), Value::Integer(version as i64));
            for (name, value) in &fields {
                if matches!(name.as_str(), "type" | "key" | "version") {
                    continue;
                }
                if let Some(value) = json_to_toml(value.clone()) {
                    table.insert(name.clone(), value);
                }
            }
            let text = toml::to_string(&table).map_err(|error| {
                ProviderError::BadRequest(format!("cannot write the config as TOML: {error}"))
            })?;
            let file = self.dir.join(format!("{kind}_{key}_{version}.toml"));
            let (config, _warnings) =
                parse_connector_file(&file, &text, &self.vars).map_err(ProviderError::Invalid)?;
            match create_new_file(&self.dir, &file, text.as_bytes()) {
                Ok(()) => {
                    return Ok(StoredConfig {
                        config,
                        created_at: created_at(&file),
                    });
                }
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => version += 1,
                Err(source) => return Err(ProviderError::Io { path: file, source }),
            }
        }
        Err(ProviderError::Io {
            path: self.dir.clone(),
            source: io::Error::other(format!(
                "{CREATE_ATTEMPTS} version numbers in a row were taken by other writers"
            )),
        })
    }

    /// Points `.active_versions.toml` at an existing version.
    pub fn set_active(
        &self,
        kind: ConnectorKind,
        key: &str,
        version: u64,
    ) -> Result<(), ProviderError> {
        self.version(kind, key, version)?;
        self.update_pointers(|pointers| {
            pointers
                .entry(section(kind).to_owned())
                .or_insert_with(|| Value::Table(Table::new()));
            if let Some(Value::Table(entries)) = pointers.get_mut(section(kind)) {
                entries.insert(key.to_owned(), Value::Integer(version as i64));
            }
        })
    }

    /// Deletes one version (the active one when `version` is `None`). When the
    /// active pointer named it, the pointer moves to the highest remaining
    /// version, or goes when none remains.
    pub fn delete(
        &self,
        kind: ConnectorKind,
        key: &str,
        version: Option<u64>,
    ) -> Result<u64, ProviderError> {
        let version = match version {
            Some(version) => version,
            None => self.active_version(kind, key)?,
        };
        let candidates = self.candidates(kind, key)?;
        let doomed: Vec<&Candidate> = candidates
            .iter()
            .filter(|candidate| candidate.version == version)
            .collect();
        if doomed.is_empty() {
            return Err(ProviderError::VersionNotFound { version });
        }
        for candidate in &doomed {
            fs::remove_file(&candidate.file).map_err(|source| ProviderError::Io {
                path: candidate.file.clone(),
                source,
            })?;
        }
        if self.pointer(kind, key)? == Some(version) {
            let highest = candidates
                .iter()
                .filter(|candidate| candidate.version != version)
                .map(|candidate| candidate.version)
                .max();
            self.update_pointers(|pointers| {
                if let Some(Value::Table(entries)) = pointers.get_mut(section(kind)) {
                    match highest {
                        Some(highest) => {
                            entries.insert(key.to_owned(), Value::Integer(highest as i64));
                        }
                        None => {
                            entries.remove(key);
                        }
                    }
                }
            })?;
        }
        Ok(version)
    }

    fn load(&self, file: &Path) -> Result<StoredConfig, ProviderError> {
        let text = fs::read_to_string(file).map_err(|source| ProviderError::Io {
            path: file.to_owned(),
            source,
        })?;
        let (config, _warnings) =
            parse_connector_file(file, &text, &self.vars).map_err(ProviderError::Invalid)?;
        Ok(StoredConfig {
            config,
            created_at: created_at(file),
        })
    }

    /// The files that declare `kind` and `key`, read only as far as `type`,
    /// `key` and `version`, so a file with a bad field still counts as a
    /// version (and is reported when it is the one asked for).
    fn candidates(&self, kind: ConnectorKind, key: &str) -> Result<Vec<Candidate>, ProviderError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(ProviderError::Io {
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        let mut candidates = Vec::new();
        for path in entries.filter_map(|entry| entry.ok().map(|entry| entry.path())) {
            if !is_connector_file(&path) {
                continue;
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            let Ok(table) = toml::from_str::<Table>(&text) else {
                continue;
            };
            let declares = table.get("type").and_then(Value::as_str) == Some(section_kind(kind))
                && table.get("key").and_then(Value::as_str) == Some(key);
            if !declares {
                continue;
            }
            let version = match table.get("version") {
                None => 0,
                Some(Value::Integer(version)) if *version >= 0 => *version as u64,
                Some(_) => continue,
            };
            candidates.push(Candidate {
                file: path,
                version,
            });
        }
        Ok(candidates)
    }

    fn pointer(&self, kind: ConnectorKind, key: &str) -> Result<Option<u64>, ProviderError> {
        let pointers = self.read_pointers()?;
        Ok(pointers
            .get(section(kind))
            .and_then(|entries| entries.get(key))
            .and_then(Value::as_integer)
            .and_then(|version| u64::try_from(version).ok()))
    }

    fn read_pointers(&self) -> Result<Table, ProviderError> {
        let path = self.dir.join(ACTIVE_VERSIONS_FILE);
        let text = match fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Table::new()),
            Err(source) => return Err(ProviderError::Io { path, source }),
        };
        toml::from_str(&text).map_err(|error| {
            ProviderError::Invalid(ConfigIssues(vec![ConfigIssue::error(
                &path,
                "",
                format!("not valid TOML: {error}"),
            )]))
        })
    }

    fn update_pointers(&self, change: impl FnOnce(&mut Table)) -> Result<(), ProviderError> {
        let _writing = self.lock_writing();
        let mut pointers = self.read_pointers()?;
        change(&mut pointers);
        let text = toml::to_string(&pointers).map_err(|error| {
            ProviderError::BadRequest(format!("cannot write {ACTIVE_VERSIONS_FILE}: {error}"))
        })?;
        write_atomically(&self.dir.join(ACTIVE_VERSIONS_FILE), text.as_bytes())
    }
}

fn section(kind: ConnectorKind) -> &'static str {
    match kind {
        ConnectorKind::Source => "sources",
        ConnectorKind::Sink => "sinks",
    }
}

fn section_kind(kind: ConnectorKind) -> &'static str {
    match kind {
        ConnectorKind::Source => "source",
        ConnectorKind::Sink => "sink",
    }
}

/// Keys name files: only the characters the config parser accepts, so a key
/// can never reach outside the directory.
fn check_key(key: &str) -> Result<(), ProviderError> {
    if key.len() > MAX_KEY_LENGTH {
        return Err(ProviderError::BadRequest(format!(
            "invalid key: {} characters, at most {MAX_KEY_LENGTH} allowed",
            key.len()
        )));
    }
    let valid = !key.is_empty()
        && key.chars().all(|character| {
            character.is_ascii_alphanumeric() || character == '_' || character == '-'
        });
    if valid {
        Ok(())
    } else {
        Err(ProviderError::BadRequest(format!(
            "invalid key \"{key}\": expected letters, digits, '_' or '-'"
        )))
    }
}

fn created_at(path: &Path) -> u64 {
    fs::metadata(path)
        .ok()
        .and_then(|metadata| metadata.created().or_else(|_| metadata.modified()).ok())
        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// Nulls are dropped: TOML has none, and upstream's optional fields are null
/// when unset.
pub fn json_to_toml(value: serde_json::Value) -> Option<Value> {
    Some(match value {
        serde_json::Value::Null => return None,
        serde_json::Value::Bool(flag) => Value::Boolean(flag),
        serde_json::Value::Number(number) => match number.as_i64() {
            Some(integer) => Value::Integer(integer),
            None => Value::Float(number.as_f64()?),
        },
        serde_json::Value::String(text) => Value::String(text),
        serde_json::Value::Array(items) => {
            Value::Array(items.into_iter().filter_map(json_to_toml).collect())
        }
        serde_json::Value::Object(fields) => Value::Table(
            fields
                .into_iter()
                .filter_map(|(name, value)| Some((name, json_to_toml(value)?)))
                .collect(),
        ),
    })
}

/// A temp file name in `dir` no other writer uses (process id and a counter),
/// hidden (a leading dot) so the directory scan never reads it as a config.
fn temp_path(dir: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    dir.join(format!(".tmp-{}-{count}.toml", std::process::id()))
}

/// Writes `bytes` to a new temp file (owner read/write only: configs hold
/// secrets) and syncs it.
fn write_temp(dir: &Path, bytes: &[u8]) -> io::Result<PathBuf> {
    let temp = temp_path(dir);
    let written = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut file| {
            file.write_all(bytes)?;
            file.sync_all()
        });
    match written {
        Ok(()) => Ok(temp),
        Err(error) => {
            let _ = fs::remove_file(&temp);
            Err(error)
        }
    }
}

/// Publishes `bytes` as `path`, which must not exist yet (`AlreadyExists`
/// otherwise): a reader sees the whole file or none.
fn create_new_file(dir: &Path, path: &Path, bytes: &[u8]) -> io::Result<()> {
    let temp = write_temp(dir, bytes)?;
    // A hard link fails when the name is taken, like O_EXCL, and appears
    // atomically with the whole content.
    let linked = fs::hard_link(&temp, path);
    let _ = fs::remove_file(&temp);
    linked
}

/// Writes a temp file, then renames it over the target, so a reader never sees
/// half a file.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), ProviderError> {
    let io_error = |source| ProviderError::Io {
        path: path.to_owned(),
        source,
    };
    let dir = path.parent().unwrap_or(Path::new("."));
    let temp = write_temp(dir, bytes).map_err(io_error)?;
    fs::rename(&temp, path).map_err(|source| {
        let _ = fs::remove_file(&temp);
        io_error(source)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_the_next_file_name_taken_by_another_writer_when_creating_should_take_the_next_version()
    {
        let dir = tempfile::tempdir().unwrap();
        let provider = LocalProvider::new(dir.path().to_owned(), EnvVars::default());
        // What another process may hold while it writes: a file under the
        // next name that does not (yet) parse as a config.
        let taken = dir.path().join("source_k_0.toml");
        fs::write(&taken, "half a file = [").unwrap();
        let body = serde_json::json!({
            "enabled": false,
            "path": "random",
            "streams": [{"stream": "s", "topic": "t", "schema": "json"}],
        });
        let stored = provider.create(ConnectorKind::Source, "k", body).unwrap();
        assert_eq!(stored.config.version, 1);
        assert_eq!(fs::read_to_string(&taken).unwrap(), "half a file = [");
        assert!(dir.path().join("source_k_1.toml").is_file());
    }
}
