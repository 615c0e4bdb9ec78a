//! Retired ids: a request the engine aborted or whose lease ran out posts nothing new, and a
//! registration arriving after it is answered with failure notices (F4); the ids are
//! remembered, oldest forgotten first, with the consumer registration each was answered for.

use super::ProducerDriver;
use super::pairing::PairingKeys;
use crate::registration::PushRegistration;

/// The consumer registration a retired request was pushed or failed for: D's engine id
/// and D's request id. Every rank of that consumer sends its own copy of `PUSH_REG` (F11);
/// a copy that comes after the request retired was answered already (the plan covered every
/// rank this producer writes) and is a duplicate, not a late registration owed failure
/// notices (F4): answering it again would repeat a notice per edge, which counting mode
/// cannot tell from a sibling's and which would fail a request whose data landed.
pub(super) type Answered = (String, String);

pub(super) fn answered(reg: &PushRegistration) -> Answered {
    (reg.decode_engine_id.clone(), reg.request_id.clone())
}

impl<W> ProducerDriver<W> {
    /// The request ended on this producer (aborted, or the engine's own lease): no new
    /// write is posted, a failure notice goes to every consumer rank not written yet at the
    /// next tick, and the source blocks come back once no write is in flight (F3). A
    /// registration arriving later is answered with failure notices (F4).
    pub fn retire(&mut self, request_id: &str) {
        let keys = PairingKeys::new(request_id, None);
        let pushed_for = self
            .pushes
            .get(request_id)
            .map(|p| answered(&p.registration));
        self.remember_retired(keys.clone(), pushed_for);
        if let Some(push) = self.pushes.get_mut(request_id) {
            push.plan.retire();
            self.work_queued = true;
        } else if self.offers.remove(request_id).is_some() {
            self.release_source(request_id);
        } else if let Some((_, reg)) = self.stash.take(&keys) {
            // Registered but never offered: it will never be pushed; say so now (F4).
            self.counters.registrations_retired += 1;
            self.begin(keys, reg, None);
            self.work_queued = true;
        }
    }

    /// Remembers `keys` as retired; `pushed_for`: the registration it was answered for
    /// (kept when it is remembered again with one).
    pub(super) fn remember_retired(&mut self, keys: PairingKeys, pushed_for: Option<Answered>) {
        if let Some(held) = self.retired.get_mut_exact(&keys.id) {
            if pushed_for.is_some() {
                *held = pushed_for;
            }
            return;
        }
        while self.retired.len() >= self.config.retired_capacity {
            match self.retired_order.pop_front() {
                Some(old) => {
                    self.retired.remove(&old);
                }
                None => return,
            }
        }
        self.retired_order.push_back(keys.id.clone());
        // Room was made above.
        let _ = self.retired.insert(keys, pushed_for);
    }
}
