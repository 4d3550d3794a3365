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

use crate::config::state::{FILE, StateConfig};

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

/// A state store kept by a backend's folder, behind the feature
/// `<kind>-state`: registered there with `inventory::submit!`, beside the
/// [`StateKind`](crate::config::state::StateKind) that declares its config.
pub struct Backend {
    /// The name `[state] type` (or `storage`) gives it.
    pub kind: &'static str,
    pub open: for<'a> fn(&'a StateConfig) -> Opening<'a>,
}

/// A backend store being opened.
pub type Opening<'a> = BoxFuture<'a, Result<Arc<dyn StateStore>, StateError>>;

inventory::collect!(Backend);

/// The state store `[state]` asks for.
pub async fn open(config: &StateConfig) -> Result<Arc<dyn StateStore>, StateError> {
    if config.kind == FILE {
        return Ok(Arc::new(FileStateStore::new(&config.path)?));
    }
    match inventory::iter::<Backend>
        .into_iter()
        .find(|backend| backend.kind == config.kind)
    {
        Some(backend) => (backend.open)(config).await,
        // `validate` and `run` refuse such a config before this.
        None => Err(StateError::Unavailable(format!(
            "[state] type = \"{0}\" is not a state store of this build",
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
    /// A shared store could not be reached, or failed for now: the save is
    /// tried again (the batch is NACKed), a load at start too.
    #[error("cannot {action} {location}: {message}")]
    Unreachable {
        action: &'static str,
        location: String,
        message: String,
    },
    /// A shared store refused the change for good (another writer changed the
    /// state since it was read, or the store refuses the credentials): the
    /// source stops rather than retry.
    #[error("{location} refused to {action}: {message}")]
    Refused {
        action: &'static str,
        location: String,
        message: String,
    },
    /// What a shared store holds for a source does not decode.
    #[error(
        "state {location} is corrupt ({reason}); refusing to start from it (remove it to start fresh)"
    )]
    CorruptAt { location: String, reason: String },
    /// A change to the state of a source another instance runs.
    #[error("source \"{key}\" runs on instance {holder} (it holds the lease); stop it there first")]
    Leased { key: String, holder: String },
}

impl StateError {
    /// Whether trying again cannot help: the source stops.
    pub fn is_permanent(&self) -> bool {
        matches!(self, StateError::Refused { .. })
    }

    /// Whether the store could not be reached for now, so a load at start is
    /// tried again like an `open` whose backend is down.
    pub fn is_transient(&self) -> bool {
        matches!(self, StateError::Unreachable { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::state::StateKind;

    #[test]
    fn given_the_registered_stores_when_listed_should_each_have_a_config_and_an_opener() {
        let openers: Vec<&str> = inventory::iter::<Backend>
            .into_iter()
            .map(|backend| backend.kind)
            .collect();
        let configs: Vec<&str> = StateKind::all().iter().map(|kind| kind.name).collect();
        for kind in &configs {
            assert!(openers.contains(kind), "{kind} has a config but no opener");
        }
        for kind in &openers {
            assert!(configs.contains(kind), "{kind} has an opener but no config");
        }
        for kind in StateKind::all() {
            assert_eq!(kind.feature, format!("{}-state", kind.name));
        }
    }
}
