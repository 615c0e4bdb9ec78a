//! Locks that never wait while holding the GIL, and what runs under them.
//!
//! The ledger has three locks: its ingest half, its engine half (each a [`Mutex`], see
//! `tracker.rs`) and its agent-name table (`ledger.rs`). What holds:
//!
//! * **Waiting.** A thread that holds the GIL and finds a lock taken waits with the GIL
//!   released ([`Python::detach`]), so the holder can always get the GIL back and finish:
//!   two Python threads never deadlock on a lock and the GIL. A thread that runs without
//!   the GIL (`feed`'s core loop) waits plainly ([`lock_detached`]).
//! * **No Python code under a lock.** Nothing inside a locked section calls Python, no
//!   Python object is allocated there, and no reference that could be an object's last
//!   is released there: the objects a section takes out (the blocks of completed
//!   requests, refused registrations, names given back) are dropped by the caller after
//!   the guard is gone, so a `__del__` or weakref callback they run
//!   may call back into the ledger or take a lock that another thread holds while it
//!   calls the ledger. Text is converted to UTF-8 (which may raise) before a lock is
//!   taken. No allocation means no garbage collection can start under a lock; the
//!   collector's own visits (`__traverse__`, `__clear__`) only try the engine lock and
//!   skip it when it is held.
//! * **Order.** A named-edge registration holds the names lock while it takes the engine
//!   lock (so a refused registration can give its new names back); nothing takes the
//!   names lock while holding a half's lock, so there is no cycle. `feed` takes the names
//!   lock and the ingest lock one after the other, not nested.
//! * **The GIL in `feed`.** Reading the batch (iterating its values, one reference per
//!   `bytes`) holds the GIL; it goes in chunks of 65 536 messages (`feed.rs`), and each
//!   chunk of `DETACH_AT` (512) messages or more is fed to the core under the ingest lock
//!   with the GIL released, on bytes borrowed from the `bytes` objects the chunk holds.
//!   So the engine thread waits for one chunk's reading at most, not for a batch.

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
