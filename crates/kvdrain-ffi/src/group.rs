//! The heap owner of one ledger and its three handles, and what each handle holds.
//!
//! The core's halves borrow the ledger (`Ingest<'l>`, `Engine<'l>`), and C has no
//! lifetimes, so the binding keeps the borrow inside one allocation that outlives every
//! handle:
//!
//! ```text
//!  Group (Box, never moves)                                CoreLedger (Box, ~13 MiB)
//!  ├─ refs: handles still held by C (1 + 2 after split)     ▲       ▲
//!  ├─ kvdrain_ledger  { state, split }                      │ &mut  │ &mut
//!  ├─ kvdrain_ingest  { state, Option<Ingest<'static>> } ───┘       │
//!  ├─ kvdrain_engine  { state, Option<EngineSide> } ────────────────┘
//!  └─ core: NonNull<CoreLedger>
//! ```
//!
//! The handles C receives are pointers to the three fields. Freeing a handle marks it
//! `FREED` (a second free, or a call through it, is then detected while the group lives)
//! and drops what it holds; the group and the ledger go away with the last handle, in
//! any order. The `'static` in the halves' types is a promise kept by this file alone:
//! the halves are dropped before the ledger box, which is freed only in [`Group`]'s drop.

use core::alloc::Layout;
use core::cell::UnsafeCell;
use core::ptr::NonNull;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering, fence};
use std::panic::{AssertUnwindSafe, catch_unwind};

use kvdrain::{Config, Engine, Ingest};

use crate::config::{CoreLedger, KVDRAIN_MAX_EDGES, TABLE};
use crate::status::kvdrain_status::{self, *};
use crate::tickets::Tickets;

const N: usize = TABLE;
const E: usize = KVDRAIN_MAX_EDGES as usize;

/// The ingest half of the one instantiation.
/// cbindgen:ignore
pub(crate) type CoreIngest = Ingest<'static, N, E>;
/// The engine half of the one instantiation.
/// cbindgen:ignore
pub(crate) type CoreEngine = Engine<'static, N, E>;

/// What the engine handle holds: the core half and the tickets of the keys it handed out.
/// Decisions wait in the core's own queue until `kvdrain_engine_poll` pulls them.
#[derive(Debug)]
pub(crate) struct EngineSide {
    pub(crate) engine: CoreEngine,
    pub(crate) tickets: Tickets,
    /// The ledger's capacity: the most tickets kept at once.
    pub(crate) capacity: usize,
}

impl EngineSide {
    /// The engine half with the ticket table made for `capacity`.
    pub(crate) fn new(engine: CoreEngine, tickets: Tickets, capacity: usize) -> Self {
        EngineSide {
            engine,
            tickets,
            capacity,
        }
    }
}

bitflags::bitflags! {
    /// A handle's state word (`state: AtomicU32`): empty while usable, else why not.
    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub(crate) struct HandleState: u32 {
        /// The handle itself was freed.
        const FREED = 1;
        /// A call through it panicked.
        const POISONED = 1 << 1;
        /// (Halves) the ledger handle was freed.
        const LEDGER_FREED = 1 << 2;
        /// A call is inside the handle now (set and cleared by [`enter`] and [`leave`]).
        const BUSY = 1 << 3;
    }
}

/// Marks a call as inside the handle whose state is `word`: `KVDRAIN_ERR_BUSY` if another
/// call is inside already (two threads on one handle), `KVDRAIN_ERR_FREED` or
/// `KVDRAIN_ERR_PANIC` if the handle is unusable. On `Ok` the caller owns the handle's
/// contents until [`leave`]. One atomic read-modify-write.
pub(crate) fn enter(word: &AtomicU32) -> Result<(), kvdrain_status> {
    let before = HandleState::BUSY.raise(word);
    if before.contains(HandleState::BUSY) {
        return Err(KVDRAIN_ERR_BUSY);
    }
    if let Err(status) = check_state_bits(before) {
        leave(word);
        return Err(status);
    }
    Ok(())
}

/// Ends the call [`enter`] let in.
pub(crate) fn leave(word: &AtomicU32) {
    word.fetch_and(!HandleState::BUSY.bits(), Ordering::Release);
}

impl HandleState {
    /// The state in `word` now.
    fn load(word: &AtomicU32) -> Self {
        HandleState::from_bits_retain(word.load(Ordering::Acquire))
    }

    /// Sets `self` in `word`; returns the state before.
    pub(crate) fn raise(self, word: &AtomicU32) -> Self {
        HandleState::from_bits_retain(word.fetch_or(self.bits(), Ordering::AcqRel))
    }
}

/// The owner of a ledger: create with `kvdrain_ledger_new`, split once with
/// `kvdrain_ledger_split`, free with `kvdrain_ledger_free`. Any thread, one call at a time.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct kvdrain_ledger {
    state: AtomicU32,
    split: AtomicBool,
    group: *const Group,
}

/// The half that feeds notifications: one thread at a time (the thread that drains NIXL
/// notifications; a second thread's call returns `KVDRAIN_ERR_BUSY`), concurrently with
/// the engine half.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct kvdrain_ingest {
    state: AtomicU32,
    group: *const Group,
    half: UnsafeCell<Option<CoreIngest>>,
}

/// The half that registers, aborts, fences, advances the clock and takes decisions out:
/// one thread at a time (the scheduler thread; a second thread's call returns
/// `KVDRAIN_ERR_BUSY`), concurrently with the ingest half.
#[allow(non_camel_case_types)]
#[derive(Debug)]
pub struct kvdrain_engine {
    state: AtomicU32,
    group: *const Group,
    side: UnsafeCell<Option<EngineSide>>,
}

#[derive(Debug)]
pub(crate) struct Group {
    refs: AtomicUsize,
    ledger: kvdrain_ledger,
    ingest: kvdrain_ingest,
    engine: kvdrain_engine,
    core: NonNull<CoreLedger>,
}

impl Drop for Group {
    fn drop(&mut self) {
        // The halves borrow `*core`: drop them first.
        *self.ingest.half.get_mut() = None;
        *self.engine.side.get_mut() = None;
        // SAFETY: `core` holds a ledger built by `build_core` in memory from the global
        // allocator with `Layout::new::<CoreLedger>()`, as a `Box` would own it, and
        // nothing borrows it any more (both halves are gone); it is freed once, here.
        drop(unsafe { Box::from_raw(self.core.as_ptr()) });
    }
}

/// A heap place for the ledger, handed to its construction thread and back.
struct Place(NonNull<CoreLedger>);

// SAFETY: the place is used by one thread at a time: the construction thread writes it,
// and the creating thread reads it only after joining that thread.
unsafe impl Send for Place {}

impl Place {
    /// Builds the ledger into the place (a method, so the closure captures the whole
    /// `Place`, which is `Send`, and not its pointer field).
    ///
    /// # Safety
    /// The place is valid for a write of a `CoreLedger` and no other thread uses it.
    unsafe fn build(self, config: Config) {
        // SAFETY: per the contract; nothing was there to drop.
        unsafe { self.0.as_ptr().write(CoreLedger::new(config)) };
    }
}

/// Allocates the ledger's memory (13.8 MiB) with a check instead of an abort, then builds
/// the ledger into it on a thread whose stack fits it (`Ledger::new` returns it by
/// value). `KVDRAIN_ERR_ALLOC` when the memory or the thread cannot be had.
fn build_core(config: Config) -> Result<NonNull<CoreLedger>, kvdrain_status> {
    let layout = Layout::new::<CoreLedger>();
    // SAFETY: the layout's size is not zero (the ledger holds its tables inline).
    let raw = unsafe { std::alloc::alloc(layout) }.cast::<CoreLedger>();
    let place = NonNull::new(raw).ok_or(KVDRAIN_ERR_ALLOC)?;
    let target = Place(place);
    let stack = 4 * size_of::<CoreLedger>() + (16 << 20);
    let built = std::thread::Builder::new()
        .name("kvdrain-ledger-new".into())
        .stack_size(stack)
        // SAFETY: the place is fresh and this thread is its only user until the join.
        .spawn(move || unsafe { target.build(config) })
        .map(std::thread::JoinHandle::join);
    match built {
        Ok(Ok(())) => Ok(place),
        _ => {
            // SAFETY: allocated above with `layout`; no ledger was written into it (the
            // thread did not start, or `Ledger::new` panicked before the write).
            unsafe { std::alloc::dealloc(raw.cast(), layout) };
            Err(KVDRAIN_ERR_ALLOC)
        }
    }
}

impl Group {
    /// A new ledger with its halves split off, owned by the returned ledger handle.
    pub(crate) fn create(config: Config) -> Result<*mut kvdrain_ledger, kvdrain_status> {
        let core = build_core(config)?;
        let tickets = match Tickets::try_with_capacity(config.capacity) {
            Some(t) => t,
            None => {
                // SAFETY: as in `Group::drop`; nothing borrows the new ledger yet.
                drop(unsafe { Box::from_raw(core.as_ptr()) });
                return Err(KVDRAIN_ERR_ALLOC);
            }
        };
        let raw = Box::into_raw(Box::new(Group {
            refs: AtomicUsize::new(1),
            ledger: kvdrain_ledger {
                state: AtomicU32::new(HandleState::empty().bits()),
                split: AtomicBool::new(false),
                group: core::ptr::null(),
            },
            ingest: kvdrain_ingest {
                state: AtomicU32::new(HandleState::empty().bits()),
                group: core::ptr::null(),
                half: UnsafeCell::new(None),
            },
            engine: kvdrain_engine {
                state: AtomicU32::new(HandleState::empty().bits()),
                group: core::ptr::null(),
                side: UnsafeCell::new(None),
            },
            core,
        }));
        // SAFETY: `raw` is a fresh, exclusive allocation; the writes go through raw place
        // projections. `core` is a built ledger that only `Group::drop` frees, after the
        // halves made from this `&'static mut` are dropped, so the borrow outlives them.
        unsafe {
            (*raw).ledger.group = raw;
            (*raw).ingest.group = raw;
            (*raw).engine.group = raw;
            let ledger: &'static mut CoreLedger = &mut *core.as_ptr();
            let (ingest, engine) = ledger.split();
            *(*raw).ingest.half.get() = Some(ingest);
            *(*raw).engine.side.get() = Some(EngineSide::new(engine, tickets, config.capacity));
            Ok(&raw mut (*raw).ledger)
        }
    }

    /// Gives up one handle's reference; the last one frees the group and the ledger.
    ///
    /// # Safety
    /// `group` is live and the caller held one reference, which it no longer uses.
    unsafe fn release(group: *const Group) {
        // SAFETY: live per the contract; the reference ends before any deallocation.
        let last = unsafe { (*group).refs.fetch_sub(1, Ordering::Release) } == 1;
        if last {
            // Every other handle's last use happens before this drop (as in `Arc`).
            fence(Ordering::Acquire);
            // SAFETY: the group came from `Box::into_raw` in `create`; no handle refers
            // to it any more.
            drop(unsafe { Box::from_raw(group.cast_mut()) });
        }
    }
}

/// Handle access shared by the three handle types.
pub(crate) trait Handle {
    /// What the handle gives access to.
    type Inner;
    fn state(&self) -> &AtomicU32;
    fn group(&self) -> *const Group;
    fn inner(&self) -> &UnsafeCell<Option<Self::Inner>>;
}

impl Handle for kvdrain_ingest {
    type Inner = CoreIngest;
    fn state(&self) -> &AtomicU32 {
        &self.state
    }
    fn group(&self) -> *const Group {
        self.group
    }
    fn inner(&self) -> &UnsafeCell<Option<CoreIngest>> {
        &self.half
    }
}

impl Handle for kvdrain_engine {
    type Inner = EngineSide;
    fn state(&self) -> &AtomicU32 {
        &self.state
    }
    fn group(&self) -> *const Group {
        self.group
    }
    fn inner(&self) -> &UnsafeCell<Option<EngineSide>> {
        &self.side
    }
}

fn check_state(state: &AtomicU32) -> Result<(), kvdrain_status> {
    check_state_bits(HandleState::load(state))
}

fn check_state_bits(s: HandleState) -> Result<(), kvdrain_status> {
    let s = s - HandleState::BUSY;
    if s.is_empty() {
        Ok(())
    } else if s.intersects(HandleState::FREED | HandleState::LEDGER_FREED) {
        Err(KVDRAIN_ERR_FREED)
    } else {
        Err(KVDRAIN_ERR_PANIC)
    }
}

/// Runs `f` on the half behind `ptr`: NULL, freed and poisoned handles (and halves of a
/// freed ledger) are refused with a status, and so is a second call while one is inside
/// (`KVDRAIN_ERR_BUSY`: two threads on one half); a panic in `f` poisons the handle and
/// becomes `KVDRAIN_ERR_PANIC`.
///
/// # Safety
/// `ptr` is NULL or a handle from `kvdrain_ledger_split` whose group is still allocated
/// (at least one handle of it not freed).
pub(crate) unsafe fn with_half<H: Handle>(
    ptr: *const H,
    f: impl FnOnce(&mut H::Inner) -> kvdrain_status,
) -> kvdrain_status {
    // SAFETY: NULL or a live handle, per the contract.
    let Some(handle) = (unsafe { ptr.as_ref() }) else {
        return KVDRAIN_ERR_NULL;
    };
    // One read-modify-write covers another call inside, the handle's own free, its
    // ledger's free and poisoning.
    if let Err(status) = enter(handle.state()) {
        return status;
    }
    // SAFETY: `enter` let this call alone in: no other call touches the cell until
    // `leave`, and `free_half` waits for `leave` before it takes the cell's contents.
    let status = match (unsafe { &mut *handle.inner().get() }).as_mut() {
        None => KVDRAIN_ERR_FREED,
        Some(inner) => match catch_unwind(AssertUnwindSafe(|| f(inner))) {
            Ok(status) => status,
            Err(_) => {
                HandleState::POISONED.raise(handle.state());
                KVDRAIN_ERR_PANIC
            }
        },
    };
    leave(handle.state());
    status
}

/// Frees a half: later calls through it read `KVDRAIN_ERR_FREED` while its group lives; a
/// second free does nothing.
///
/// # Safety
/// As [`with_half`].
pub(crate) unsafe fn free_half<H: Handle>(ptr: *const H) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: NULL or a live handle, per the contract.
        let Some(handle) = (unsafe { ptr.as_ref() }) else {
            return;
        };
        if HandleState::FREED
            .raise(handle.state())
            .contains(HandleState::FREED)
        {
            return;
        }
        // A call that entered before `FREED` was raised may still be inside: wait for it
        // (calls never block, so this is short). Calls that come later see `FREED`.
        while HandleState::load(handle.state()).contains(HandleState::BUSY) {
            std::thread::yield_now();
        }
        // SAFETY: no call is inside and none can enter (`FREED`); drop what it holds.
        drop(unsafe { (*handle.inner().get()).take() });
        let group = handle.group();
        // SAFETY: this handle held one reference and is not used after this.
        unsafe { Group::release(group) };
    }));
}

/// `kvdrain_ledger_split`: hands out the halves once.
///
/// # Safety
/// `ledger` is NULL or a live ledger handle.
pub(crate) unsafe fn split(
    ledger: *const kvdrain_ledger,
) -> Result<(*mut kvdrain_ingest, *mut kvdrain_engine), kvdrain_status> {
    // SAFETY: NULL or live, per the contract.
    let handle = unsafe { ledger.as_ref() }.ok_or(KVDRAIN_ERR_NULL)?;
    check_state(&handle.state)?;
    if handle.split.swap(true, Ordering::AcqRel) {
        return Err(KVDRAIN_ERR_BUSY);
    }
    let group = handle.group;
    // SAFETY: the group is live while this handle is; two more handles now hold it.
    unsafe {
        (*group).refs.fetch_add(2, Ordering::Relaxed);
        Ok((
            (&raw const (*group).ingest).cast_mut(),
            (&raw const (*group).engine).cast_mut(),
        ))
    }
}

/// `kvdrain_ledger_free`.
///
/// # Safety
/// `ledger` is NULL or a live ledger handle not used by another call now.
pub(crate) unsafe fn free_ledger(ledger: *const kvdrain_ledger) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: NULL or live, per the contract.
        let Some(handle) = (unsafe { ledger.as_ref() }) else {
            return;
        };
        if HandleState::FREED
            .raise(&handle.state)
            .contains(HandleState::FREED)
        {
            return;
        }
        let group = handle.group;
        // SAFETY: the group is live while this handle is: its halves now refuse calls.
        unsafe {
            HandleState::LEDGER_FREED.raise(&(*group).ingest.state);
            HandleState::LEDGER_FREED.raise(&(*group).engine.state);
        }
        // SAFETY: the ledger handle held one reference and is not used after this.
        unsafe { Group::release(group) };
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::kvdrain_config;
    use crate::{kvdrain_engine_advance, kvdrain_engine_free, kvdrain_ingest_free};
    use crate::{kvdrain_ledger_free, kvdrain_ledger_new, kvdrain_ledger_split};

    /// A panic inside a call becomes `KVDRAIN_ERR_PANIC`, poisons that handle only, and the
    /// handles still free cleanly.
    #[test]
    fn a_panic_poisons_the_handle_and_unwinds_no_further() {
        let config = kvdrain_config::defaults(8);
        let mut ledger = core::ptr::null_mut();
        let (mut ingest, mut engine) = (core::ptr::null_mut(), core::ptr::null_mut());
        // SAFETY: valid pointers throughout; every handle is freed once at the end.
        unsafe {
            assert_eq!(kvdrain_ledger_new(&config, &mut ledger), KVDRAIN_OK);
            assert_eq!(
                kvdrain_ledger_split(ledger, &mut ingest, &mut engine),
                KVDRAIN_OK
            );
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let status = with_half(engine.cast_const(), |_| panic!("injected"));
            std::panic::set_hook(hook);
            assert_eq!(status, KVDRAIN_ERR_PANIC);
            assert_eq!(kvdrain_engine_advance(engine, 1), KVDRAIN_ERR_PANIC);
            // The other half is not poisoned.
            assert_eq!(
                with_half(ingest.cast_const(), |half| {
                    assert_eq!(half.counters().completions, 0);
                    KVDRAIN_OK
                }),
                KVDRAIN_OK
            );
            kvdrain_engine_free(engine);
            kvdrain_ledger_free(ledger);
            assert_eq!(
                with_half(ingest.cast_const(), |_| KVDRAIN_OK),
                KVDRAIN_ERR_FREED
            );
            kvdrain_ingest_free(ingest);
        }
    }

    /// A call into a half while another is inside it is refused with `KVDRAIN_ERR_BUSY`
    /// (here the second call comes from inside the first, which is what a second thread
    /// would see), and the half works again once the first call returns.
    #[test]
    fn a_second_call_inside_a_half_is_busy() {
        let config = kvdrain_config::defaults(8);
        let mut ledger = core::ptr::null_mut();
        let (mut ingest, mut engine) = (core::ptr::null_mut(), core::ptr::null_mut());
        // SAFETY: valid pointers throughout; every handle is freed once at the end.
        unsafe {
            assert_eq!(kvdrain_ledger_new(&config, &mut ledger), KVDRAIN_OK);
            assert_eq!(
                kvdrain_ledger_split(ledger, &mut ingest, &mut engine),
                KVDRAIN_OK
            );
            let inner = with_half(engine.cast_const(), |_| {
                assert_eq!(kvdrain_engine_advance(engine, 1), KVDRAIN_ERR_BUSY);
                // The other half is not busy.
                with_half(ingest.cast_const(), |_| KVDRAIN_OK)
            });
            assert_eq!(inner, KVDRAIN_OK);
            assert_eq!(kvdrain_engine_advance(engine, 2), KVDRAIN_OK);
            kvdrain_ingest_free(ingest);
            kvdrain_engine_free(engine);
            kvdrain_ledger_free(ledger);
        }
    }

    /// A push plan is poisoned by a panic like every other handle, and refuses a call
    /// made while another is inside.
    #[test]
    fn a_panic_poisons_a_push_plan() {
        use crate::producer::{kvdrain_push_plan_free, kvdrain_push_plan_new};
        use crate::{kvdrain_push_plan_retire, kvdrain_topology};
        let topology = kvdrain_topology {
            p_tp: 1,
            p_pp: 1,
            d_tp: 1,
            mla: 0,
        };
        let mut plan = core::ptr::null_mut();
        // SAFETY: valid pointers; the plan is freed once at the end.
        unsafe {
            assert_eq!(
                kvdrain_push_plan_new(&topology, 0, 0, &mut plan),
                KVDRAIN_OK
            );
            let busy =
                crate::producer::with_plan_for_tests(plan, |_| kvdrain_push_plan_retire(plan));
            assert_eq!(busy, KVDRAIN_ERR_BUSY);
            assert_eq!(kvdrain_push_plan_retire(plan), KVDRAIN_OK);
            let hook = std::panic::take_hook();
            std::panic::set_hook(Box::new(|_| {}));
            let status = crate::producer::with_plan_for_tests(plan, |_| panic!("injected"));
            std::panic::set_hook(hook);
            assert_eq!(status, KVDRAIN_ERR_PANIC);
            assert_eq!(kvdrain_push_plan_retire(plan), KVDRAIN_ERR_PANIC);
            kvdrain_push_plan_free(plan);
        }
    }

    /// The edge state is written through the out-pointer, whatever the memory held.
    #[test]
    fn edge_state_writes_over_memory_that_holds_no_valid_state() {
        use crate::producer::{kvdrain_push_plan_free, kvdrain_push_plan_new};
        use crate::{kvdrain_edge_state, kvdrain_push_plan_edge_state, kvdrain_topology};
        let topology = kvdrain_topology {
            p_tp: 1,
            p_pp: 1,
            d_tp: 1,
            mla: 0,
        };
        let mut plan = core::ptr::null_mut();
        let mut word = core::mem::MaybeUninit::<u32>::new(0xDEAD_BEEF);
        // SAFETY: valid pointers; `word` has the size and alignment of the enum.
        unsafe {
            assert_eq!(
                kvdrain_push_plan_new(&topology, 0, 0, &mut plan),
                KVDRAIN_OK
            );
            let out = word.as_mut_ptr().cast::<kvdrain_edge_state>();
            assert_eq!(kvdrain_push_plan_edge_state(plan, 0, out), KVDRAIN_OK);
            assert_eq!(*out, kvdrain_edge_state::KVDRAIN_EDGE_PLANNED);
            kvdrain_push_plan_free(plan);
        }
    }

    /// Ids that can never complete are refused at registration.
    #[test]
    fn ids_that_can_never_complete_are_invalid() {
        use crate::{kvdrain_engine_register, kvdrain_registration};
        let config = kvdrain_config::defaults(8);
        let mut ledger = core::ptr::null_mut();
        let (mut ingest, mut engine) = (core::ptr::null_mut(), core::ptr::null_mut());
        let registration = |id: &'static str| kvdrain_registration {
            id: id.as_ptr(),
            id_len: id.len(),
            blocks: 0,
            count: 1,
            agents: core::ptr::null(),
            agents_len: 0,
            deadline_ms: 0,
        };
        // SAFETY: valid pointers throughout; every handle is freed once at the end.
        unsafe {
            assert_eq!(kvdrain_ledger_new(&config, &mut ledger), KVDRAIN_OK);
            assert_eq!(
                kvdrain_ledger_split(ledger, &mut ingest, &mut engine),
                KVDRAIN_OK
            );
            for id in [
                "",
                "HB",
                "HB:x",
                "PUSH_REG:x",
                "PUSH_FAIL:x",
                "PUSH_FAIL",
                "PUSH_CANCEL:x",
            ] {
                let r = registration(id);
                let status = kvdrain_engine_register(engine, &r, core::ptr::null_mut());
                assert_eq!(status, KVDRAIN_ERR_INVALID, "{id:?}");
            }
            let r = registration("a:b");
            let status = kvdrain_engine_register(engine, &r, core::ptr::null_mut());
            assert_eq!(status, KVDRAIN_OK);
            kvdrain_ingest_free(ingest);
            kvdrain_engine_free(engine);
            kvdrain_ledger_free(ledger);
        }
    }
}
