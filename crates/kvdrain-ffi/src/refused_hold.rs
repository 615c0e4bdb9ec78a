//! Refused holds: the blocks of a registration the ledger refused (`KVDRAIN_ERR_FULL`,
//! say) that producers may write into all the same, held by the ledger's clock.

use core::mem::MaybeUninit;

use kvdrain::RefusedHold;

use crate::group::{kvdrain_engine, with_half};
use crate::status::kvdrain_status::{self, *};
use crate::status::write_opt;

/// One refused hold: its number (holds are numbered from 0 in the order they were taken,
/// and end in that order) and when its blocks come back.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
pub struct kvdrain_refused_hold {
    /// The holds taken before this one.
    pub number: u64,
    /// When it ends, on the engine's clock (ms); `UINT64_MAX`: never.
    pub until_ms: u64,
}

impl From<RefusedHold> for kvdrain_refused_hold {
    fn from(h: RefusedHold) -> Self {
        kvdrain_refused_hold {
            number: h.number,
            until_ms: h.until.millis(),
        }
    }
}

/// Holds the blocks of a registration this ledger refused that producers may write into
/// all the same (on a decode engine of several ranks, another rank's registration of the
/// same request let them): the hold ends `quarantine_ms` after the clock (the last
/// `kvdrain_engine_advance`), rounded up to a 61st of the quarantine (at least 1 ms).
/// Keep your blocks handle in a queue, in this order: `kvdrain_engine_poll_refused_releases`
/// hands the ends out in it. Writes the hold to `*out` unless NULL. Changes no request;
/// never refuses. Engine thread.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `out` is NULL or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_hold_refused(
    engine: *mut kvdrain_engine,
    out: *mut kvdrain_refused_hold,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let hold = side.engine.hold_refused();
            write_opt(out, hold.into());
            KVDRAIN_OK
        })
    }
}

/// Takes out the refused holds whose end the clock has reached, oldest first: `*n` is the
/// room in `out` on entry and the number written on return; each frees the front of your
/// queue (a forced release). When `*n` comes back equal to the room given, more may wait:
/// call again. Nothing is allocated. Engine thread.
///
/// # Safety
/// `engine` is NULL or a live engine handle; `n` is NULL or points to the room in `out`;
/// `out` is writable for that many holds (it may be NULL when the room is 0).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn kvdrain_engine_poll_refused_releases(
    engine: *mut kvdrain_engine,
    out: *mut kvdrain_refused_hold,
    n: *mut usize,
) -> kvdrain_status {
    // SAFETY: as documented.
    unsafe {
        with_half(engine, |side| {
            let Some(room) = n.as_mut() else {
                return KVDRAIN_ERR_NULL;
            };
            let slots: &mut [MaybeUninit<kvdrain_refused_hold>] = if *room == 0 {
                &mut []
            } else if out.is_null() {
                return KVDRAIN_ERR_NULL;
            } else if *room > isize::MAX as usize / size_of::<kvdrain_refused_hold>() {
                return KVDRAIN_ERR_INVALID;
            } else {
                core::slice::from_raw_parts_mut(out.cast(), *room)
            };
            let mut written = 0;
            for slot in slots.iter_mut() {
                let Some(hold) = side.engine.poll_refused_release() else {
                    break;
                };
                slot.write(hold.into());
                written += 1;
            }
            *room = written;
            KVDRAIN_OK
        })
    }
}
