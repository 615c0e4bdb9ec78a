//! What a drained notification does: a `PUSH_REG` pairs with an offer (or with a retired id,
//! to answer it with failure notices), is a duplicate, or is stashed until its offer comes; a
//! heartbeat naming P's request id extends that request's lease.

use kvdrain::producer::{PushPlan, Topology};
use kvdrain::wire::{self, Message};

use super::offers::OfferEntry;
use super::pairing::{PairingKeys, TableFull};
use super::{ProducerDriver, ProducerEvent, Push};
use crate::PerRequest;
use crate::registration::PushRegistration;

impl<W> ProducerDriver<W> {
    pub(super) fn on_notification(&mut self, bytes: &[u8]) {
        match wire::parse(bytes) {
            Ok(Message::Registration(payload)) => match PushRegistration::from_msgpack(payload) {
                Ok(reg) => self.on_registration(reg),
                Err(e) => {
                    tracing::warn!(cause = "malformed_registration", error = %e, "PUSH_REG dropped");
                    self.counters.registrations_malformed += 1;
                }
            },
            Ok(Message::Heartbeat(hb)) => {
                let until = self.now + self.config.lease_extension();
                for id in hb.ids() {
                    let lease = if let Some(p) = self.pushes.get_mut(id) {
                        Some(&mut p.lease_until)
                    } else {
                        self.offers
                            .get_mut_exact(id)
                            .map(|o: &mut OfferEntry| &mut o.lease_until)
                    };
                    if let Some(lease) = lease {
                        *lease = (*lease).max(until);
                        self.counters.heartbeats += 1;
                        self.events.push_back(ProducerEvent::LeaseExtended {
                            request_id: id.to_owned(),
                        });
                    }
                }
            }
            _ => self.counters.ignored += 1,
        }
    }

    pub(super) fn on_registration(&mut self, reg: PushRegistration) {
        self.counters.registrations += 1;
        let keys = PairingKeys::new(&reg.request_id, reg.transfer_id.as_deref());
        if self.active.find(&keys).is_some() || self.stash.find(&keys).is_some() {
            self.counters.registrations_duplicate += 1;
        } else if let Some((p_keys, entry)) = self.offers.take(&keys) {
            self.begin(p_keys, reg, Some(entry));
        } else if let Some(p_id) = self.retired.find(&keys).map(str::to_owned) {
            let copy = self.retired.get(&keys).is_some_and(|a| {
                a.as_ref().is_some_and(|(engine, id)| {
                    *engine == reg.decode_engine_id && *id == reg.request_id
                })
            });
            if copy || self.pushes.contains_key(&p_id) {
                self.counters.registrations_duplicate += 1;
                return;
            }
            self.counters.registrations_retired += 1;
            self.begin(PairingKeys::new(&p_id, None), reg, None);
        } else if let Err(TableFull(..)) = self.stash.insert(keys, reg) {
            tracing::warn!(cause = "stash_full", "PUSH_REG dropped");
            self.counters.registrations_dropped += 1;
        }
    }

    /// A registration paired with an offer (or with a retired id: `entry` is `None`).
    pub(super) fn begin(
        &mut self,
        keys: PairingKeys,
        reg: PushRegistration,
        entry: Option<OfferEntry>,
    ) {
        let topology = self.topology(&reg);
        let Ok(mut plan) = PushPlan::new(&topology, self.config.pp_stage, self.config.tp_rank)
        else {
            // No edge can be named, so no notice can be owed (invariant 3); nothing was
            // posted, so the blocks go back now.
            tracing::warn!(req = %keys.id, cause = "unplannable", "registration's topology cannot be planned");
            self.counters.unplannable += 1;
            if entry.is_some() {
                self.release_source(&keys.id);
            }
            let pushed_for = (reg.decode_engine_id, reg.request_id);
            self.remember_retired(keys, Some(pushed_for));
            return;
        };
        let (source, lease_until) = match entry {
            Some(e) => (Some(e.block_ids), e.lease_until),
            None => {
                plan.retire();
                (None, self.now)
            }
        };
        let id = keys.id.clone();
        tracing::debug!(req = %id, retired = source.is_none(), "registration paired");
        // `active` has the same capacity as the offers and stash that feed it.
        let _ = self.active.insert(keys.clone(), ());
        self.pushes.insert(
            id,
            Push {
                keys,
                registration: reg,
                released: source.is_none(),
                source,
                plan,
                started: false,
                writes: PerRequest::new(),
                lease_until,
            },
        );
    }

    pub(super) fn topology(&self, reg: &PushRegistration) -> Topology {
        Topology {
            p_tp: self.config.tp_size,
            p_pp: self.config.pp_size,
            d_tp: reg.decode_tp_size,
            mla: self.config.mla,
        }
    }
}
