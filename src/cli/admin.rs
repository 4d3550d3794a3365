//! `state` and `offsets`: a source's committed state and a sink's
//! consumer-group offsets, changed with the runtime stopped (the runtime
//! holds its state directory's lock while it runs; with it running, use the
//! HTTP API on a stopped connector instead).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;

use crate::config::env::EnvVars;
use crate::config::state::{FILE, StateConfig};
use crate::config::{ConnectorConfig, RuntimeConfig, load_connector_dir};
use crate::connectors::ConnectorKind;
use crate::engine::offsets;
use crate::iggy::{ConnectionSettings, IggyBus};
use crate::state::{StoredState, json};

#[derive(Debug, Subcommand)]
pub enum StateCommand {
    /// Print a source's committed state as JSON.
    Show { key: String },
    /// Replace a source's committed state with a JSON file (`-`: stdin) in
    /// the shape `show` prints (its `state` object, or the whole answer).
    Set { key: String, file: PathBuf },
    /// Remove a source's committed state: its next start is a fresh start.
    Clear { key: String },
}

/// The lock a running runtime holds on its state directory.
pub struct RuntimeLock {
    _file: File,
}

impl RuntimeLock {
    /// The lock a runtime with this `[state]` needs: the file store's
    /// directory lock; none for a shared store, which keeps several runtimes
    /// apart itself (leases, or conditional writes).
    pub fn for_state(state: &StateConfig) -> anyhow::Result<Option<Self>> {
        match state.kind == FILE {
            true => Self::take(&state.path).map(Some),
            false => Ok(None),
        }
    }

    /// Takes the lock of `dir` (created when missing), or says who holds it.
    pub fn take(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create state directory {}", dir.display()))?;
        let path = dir.join(".lock");
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .with_context(|| format!("cannot open lock file {}", path.display()))?;
        match file.try_lock() {
            Ok(()) => Ok(Self { _file: file }),
            Err(std::fs::TryLockError::WouldBlock) => bail!(
                "another iggy-connect runtime runs on state directory {} (it holds {}); \
                 stop it first, or stop the connector and use the HTTP API",
                dir.display(),
                path.display()
            ),
            Err(std::fs::TryLockError::Error(error)) => {
                Err(error).with_context(|| format!("cannot lock {}", path.display()))
            }
        }
    }
}

/// The runtime config, its connectors and the lock, for a stopped runtime.
struct Stopped {
    config: RuntimeConfig,
    connectors: Vec<ConnectorConfig>,
    _lock: Option<RuntimeLock>,
}

impl Stopped {
    fn load(path: &Path) -> anyhow::Result<Self> {
        let vars = EnvVars::from_process();
        let (config, _) = RuntimeConfig::load(path, &vars).map_err(|issues| {
            anyhow::anyhow!(
                "{}",
                issues
                    .0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        })?;
        let connectors = match config.connector_dir() {
            Some(dir) => load_connector_dir(dir, &vars).0,
            None => Vec::new(),
        };
        let lock = RuntimeLock::for_state(&config.state)?;
        Ok(Self {
            config,
            connectors,
            _lock: lock,
        })
    }

    fn connector(&self, kind: ConnectorKind, key: &str) -> anyhow::Result<&ConnectorConfig> {
        self.connectors
            .iter()
            .find(|connector| connector.kind == kind && connector.key == key)
            .with_context(|| {
                format!(
                    "no {kind} \"{key}\" in the connector directory of the runtime config (`validate` lists them)"
                )
            })
    }
}

pub async fn state(config: &Path, command: StateCommand) -> anyhow::Result<ExitCode> {
    let stopped = Stopped::load(config)?;
    let store = crate::state::open(&stopped.config.state).await?;
    let store = store.as_ref();
    match command {
        StateCommand::Show { key } => {
            stopped.connector(ConnectorKind::Source, &key)?;
            let stored = store.load(&key).await?;
            let shown = json::shown(store, &key, stored.as_ref()).map_err(anyhow::Error::msg)?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
        }
        StateCommand::Set { key, file } => {
            let connector = stopped
                .connector(ConnectorKind::Source, &key)?
                .connector
                .clone();
            let text = match file.to_str() {
                Some("-") => std::io::read_to_string(std::io::stdin())?,
                _ => std::fs::read_to_string(&file)
                    .with_context(|| format!("cannot read {}", file.display()))?,
            };
            let given: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not JSON", file.display()))?;
            // `show`'s whole answer, or just its `state`.
            let state = match given.get("state") {
                Some(state) if given.get("location").is_some() => state.clone(),
                _ => given,
            };
            let data = json::encode(&state)
                .map_err(|error| anyhow::anyhow!("{}: {error}", file.display()))?;
            let size = data.len();
            store.save(&key, &StoredState { connector, data }).await?;
            tracing::warn!(connector_key = %key, location = %store.location(&key), size, "source state replaced from the command line");
            eprintln!(
                "state of source \"{key}\" replaced ({size} bytes at {})",
                store.location(&key)
            );
        }
        StateCommand::Clear { key } => {
            stopped.connector(ConnectorKind::Source, &key)?;
            store.clear(&key).await?;
            tracing::warn!(connector_key = %key, location = %store.location(&key), "source state cleared from the command line");
            eprintln!("state of source \"{key}\" cleared");
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn offsets(
    config: &Path,
    key: &str,
    to: &str,
    only: Option<(&str, &str)>,
) -> anyhow::Result<ExitCode> {
    let to = offsets::parse_target(to).map_err(|error| anyhow::anyhow!("--to: {error}"))?;
    let stopped = Stopped::load(config)?;
    let sink = stopped.connector(ConnectorKind::Sink, key)?;
    let settings = ConnectionSettings::from_config(&stopped.config.iggy)?;
    let moved = offsets::reset(&IggyBus::new(settings), sink, &to, only).await?;
    println!("{}", serde_json::to_string_pretty(&moved)?);
    Ok(ExitCode::SUCCESS)
}
