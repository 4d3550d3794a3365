//! Source state: what a source needs to resume where its last committed batch
//! ended. One state per source key.

pub mod file;
pub mod json;
pub mod memory;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::config::runtime::{StateConfig, StateKind};

pub use file::FileStateStore;
pub use memory::MemoryStateStore;

/// A source's committed state, as opaque MessagePack bytes written by the source,
/// plus which connector wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredState {
    /// The connector that wrote the state (`random`, `postgres`, ...). A state
    /// written by another connector under the same key is refused.
    pub connector: String,
    pub data: Vec<u8>,
}

#[async_trait]
pub trait StateStore: Send + Sync {
    /// The committed state of `key`; `Ok(None)` when there is none yet.
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError>;

    /// Replaces the state of `key` atomically: after a crash the store holds the
    /// old or the new state, never a mix.
    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError>;

    /// Removes the state of `key`, so the source's next start is a fresh
    /// start. Clearing a key that has no state is not an error.
    async fn clear(&self, key: &str) -> Result<(), StateError>;

    /// Where the state of `key` lives, for error messages and the API.
    fn location(&self, key: &str) -> String;

    /// A store shared by several instances hands each source key to one of
    /// them at a time; `None` (the file and memory stores) runs every source
    /// here.
    fn leases(&self) -> Option<&dyn Leases> {
        None
    }
}

/// Leases on source keys, held by one instance at a time. A lease is taken
/// for [`duration`](Self::duration) and renewed while its source runs; a
/// standby takes it once it has expired. Each taking raises the key's epoch,
/// and the store refuses a save under an epoch that is no longer current
/// (fencing), so an instance that lost its lease cannot overwrite the state of
/// the one that took it.
#[async_trait]
pub trait Leases: Send + Sync {
    /// Takes the lease of `key` when nobody holds it or it expired.
    async fn acquire(&self, key: &str) -> Result<Acquired, StateError>;

    /// Extends the lease this instance holds on `key`; `Ok(false)` when it is
    /// no longer ours (expired, or taken by another instance).
    async fn renew(&self, key: &str) -> Result<bool, StateError>;

    /// Gives the lease of `key` up, so a standby takes it at once.
    async fn release(&self, key: &str) -> Result<(), StateError>;

    /// How long a lease lasts without renewal.
    fn duration(&self) -> Duration;
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acquired {
    Taken,
    /// Another instance holds it, for `expires_in` more unless renewed.
    HeldBy {
        holder: String,
        expires_in: Duration,
    },
}

/// A state store kept by a backend (`type = "postgres"`): its folder
/// registers it with `inventory::submit!`, behind the feature
/// `<kind>-state`.
pub struct Backend {
    pub kind: StateKind,
    pub open: for<'a> fn(&'a StateConfig) -> Opening<'a>,
}

/// A backend store being opened.
pub type Opening<'a> = BoxFuture<'a, Result<Arc<dyn StateStore>, StateError>>;

inventory::collect!(Backend);

/// The state store `[state]` asks for.
pub async fn open(config: &StateConfig) -> Result<Arc<dyn StateStore>, StateError> {
    if config.kind == StateKind::File {
        return Ok(Arc::new(FileStateStore::new(&config.path)?));
    }
    match inventory::iter::<Backend>
        .into_iter()
        .find(|backend| backend.kind == config.kind)
    {
        Some(backend) => (backend.open)(config).await,
        None => Err(StateError::Unavailable(format!(
            "[state] type = \"{0}\" needs a build with the {0}-state feature",
            config.kind
        ))),
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "state file {path} is corrupt ({reason}); refusing to start from it (move it away to start fresh)"
    )]
    Corrupt { path: PathBuf, reason: String },
    #[error(
        "state file {path} was written by the \"{found}\" connector, not \"{expected}\"; refusing to start from it"
    )]
    WrongConnector {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error(
        "state file {path} belongs to source \"{found}\" (connector \"{connector}\"), not to source \"{expected}\"; refusing to start from it (was it copied from another source?)"
    )]
    WrongKey {
        path: PathBuf,
        found: String,
        connector: String,
        expected: String,
    },
    #[error(
        "state file {path} is a symbolic link to {target}, which does not exist; refusing to start fresh from it or to replace the link (restore the target, or remove the link to start fresh)"
    )]
    DanglingLink { path: PathBuf, target: PathBuf },
    #[error("state store refused the save: {0}")]
    Unavailable(String),
    /// The database of a shared store failed or could not be reached.
    #[error("cannot {action} {location}: {message}")]
    Database {
        action: &'static str,
        location: String,
        message: String,
    },
    /// A save or renewal under a lease this instance no longer holds.
    #[error(
        "the lease of source \"{key}\" is no longer held by this instance (another instance may run it now); the save was refused"
    )]
    LeaseLost { key: String },
    /// A change to the state of a source another instance runs.
    #[error("source \"{key}\" runs on instance {holder} (it holds the lease); stop it there first")]
    Leased { key: String, holder: String },
}
