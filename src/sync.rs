//! The one lock helper the shell's few `Mutex`es share (the loop is one thread; they are
//! there because the values behind them are handed to callbacks that must be `Send + Sync`,
//! such as the client's write fence and between-requests hook).

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, taking the value as it is when an earlier holder panicked: a poisoned lock
/// never turns into a second panic (what was written before the panic stays, and every
/// value kept behind these locks is whole after each write).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
