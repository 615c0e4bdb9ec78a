//! Locks that never wait while holding the GIL.
//!
//! Each half of the ledger sits behind its own [`Mutex`]. A thread that finds a half
//! locked waits with the GIL released ([`Python::detach`]), so the holder can always get
//! the GIL back and finish: two Python threads can never deadlock on a half and the GIL.
//! Nothing inside a locked section runs Python code (no callbacks, no `__del__`): objects
//! are built and dropped after the guard is gone.

use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};

use pyo3::Python;

/// Locks `mutex`, waiting (if it must) with the GIL released.
///
/// A poisoned lock is taken anyway: a panic inside a locked section can only come from
/// this crate's own bookkeeping, never from a half-applied core operation (the core does
/// not panic on input), so the state it guards is still consistent.
pub(crate) fn lock<'m, T: Send>(py: Python<'_>, mutex: &'m Mutex<T>) -> MutexGuard<'m, T> {
    loop {
        match mutex.try_lock() {
            Ok(guard) => return guard,
            Err(TryLockError::Poisoned(poisoned)) => return poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Wait for the holder without the GIL, then race for the lock again with it.
                py.detach(|| drop(mutex.lock().unwrap_or_else(PoisonError::into_inner)));
            }
        }
    }
}

/// Locks `mutex` from a thread that does not hold the GIL (inside [`Python::detach`]):
/// the holder never waits for this thread, so a plain wait is safe.
pub(crate) fn lock_detached<T: Send>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
