//! The one place atomics come from.
//!
//! Every atomic in the crate is imported from here, never from `core::sync::atomic`
//! directly, so that building with `RUSTFLAGS="--cfg kvdrain_loom"` swaps all of them for
//! [loom](https://docs.rs/loom)'s model-checked versions at once. The cfg is namespaced
//! (`kvdrain_loom`, not `loom`) so that an engine running its own `--cfg loom` suite does
//! not change kvdrain under its feet.
//!
//! Only 32-bit atomics are used: they exist on every target kvdrain supports, including
//! `thumbv7em-none-eabihf`.

#[cfg(kvdrain_loom)]
pub(crate) use loom::sync::atomic::{AtomicU32, Ordering, fence};

#[cfg(not(kvdrain_loom))]
pub(crate) use core::sync::atomic::{AtomicU32, Ordering, fence};

/// Builds an array of zeroed atomics (loom's atomics are not `const`).
pub(crate) fn zeroed<const N: usize>() -> [AtomicU32; N] {
    core::array::from_fn(|_| AtomicU32::new(0))
}
