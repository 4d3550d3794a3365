//! A state store in memory: for the one-shot `pipe` command (nothing durable) and
//! for tests, which can make saves fail on demand.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use async_trait::async_trait;

use crate::state::{StateError, StateStore, StoredState};

#[derive(Default)]
pub struct MemoryStateStore {
    states: Mutex<HashMap<String, StoredState>>,
    refuse_saves: AtomicU32,
    saved: Mutex<Vec<(String, Vec<u8>)>>,
    /// Keeps no history of saves (`pipe`: one per batch, for as long as it runs).
    latest_only: bool,
}

impl MemoryStateStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// A store that keeps each key's latest state and no history of saves.
    pub fn latest_only() -> Self {
        Self {
            latest_only: true,
            ..Self::default()
        }
    }

    /// The next `count` saves fail and change nothing.
    pub fn refuse_saves(&self, count: u32) {
        self.refuse_saves.store(count, Ordering::SeqCst);
    }

    /// Every successful save so far, in order, as `(key, data)`.
    pub fn saves(&self) -> Vec<(String, Vec<u8>)> {
        self.saved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    pub fn get(&self, key: &str) -> Option<StoredState> {
        self.lock().get(key).cloned()
    }

    pub fn put(&self, key: &str, state: StoredState) {
        self.lock().insert(key.to_owned(), state);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, StoredState>> {
        self.states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl StateStore for MemoryStateStore {
    async fn load(&self, key: &str) -> Result<Option<StoredState>, StateError> {
        Ok(self.get(key))
    }

    async fn save(&self, key: &str, state: &StoredState) -> Result<(), StateError> {
        let refused = self
            .refuse_saves
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
                left.checked_sub(1)
            })
            .is_ok();
        if refused {
            return Err(StateError::Unavailable(
                "the in-memory store was told to refuse this save".into(),
            ));
        }
        self.put(key, state.clone());
        if self.latest_only {
            return Ok(());
        }
        self.saved
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push((key.to_owned(), state.data.clone()));
        Ok(())
    }

    async fn clear(&self, key: &str) -> Result<(), StateError> {
        self.lock().remove(key);
        Ok(())
    }

    fn location(&self, key: &str) -> String {
        format!("memory:{key}")
    }
}
