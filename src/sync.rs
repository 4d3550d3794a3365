//! Locking a std mutex whose holder may have panicked: the data is still
//! what the last holder left, and a connector's panic is caught and reported
//! elsewhere, so every lock in the crate takes the guard either way.

use std::sync::{Mutex, MutexGuard};

pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
