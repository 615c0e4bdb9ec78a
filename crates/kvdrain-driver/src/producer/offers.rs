//! Offers: a finished request's source blocks held for pushing under a lease, refused when the
//! table is full or the id is offered already, retired when the lease runs out before a
//! registration pairs with it.

use kvdrain::Instant;

use super::ProducerDriver;
use super::pairing::{PairingKeys, TableFull};

/// A finished request whose source blocks are held for pushing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Offer {
    /// P's request id: heartbeats name it.
    pub request_id: String,
    /// The router's pairing key, if the engine knows it.
    pub transfer_id: Option<String>,
    /// Source block ids per KV-cache group.
    pub block_ids: Vec<Vec<u64>>,
}

/// Why an offer was refused; the offer is handed back.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// As many requests are offered as the capacity allows.
    #[error("offer table full")]
    Full(Offer),
    /// A request with this id is offered or being pushed already.
    #[error("request offered twice")]
    Duplicate(Offer),
}

pub(super) struct OfferEntry {
    pub(super) block_ids: Vec<Vec<u64>>,
    pub(super) lease_until: Instant,
}

impl<W> ProducerDriver<W> {
    /// A finished request's source blocks are held for pushing under a lease of
    /// `lease` from `now`; it is pushed once its registration arrives (or at the
    /// next tick, if it came first).
    ///
    /// # Errors
    /// [`OfferError`] with the offer: nothing is held.
    pub fn offer(&mut self, offer: Offer, now: Instant) -> Result<(), OfferError> {
        self.now = self.now.max(now);
        let keys = PairingKeys::new(&offer.request_id, offer.transfer_id.as_deref());
        if self.offers.contains(&keys.id) || self.pushes.contains_key(&keys.id) {
            self.counters.offers_refused += 1;
            return Err(OfferError::Duplicate(offer));
        }
        if self.offers.len() + self.pushes.len() >= self.config.capacity {
            self.counters.offers_refused += 1;
            return Err(OfferError::Full(offer));
        }
        let entry = OfferEntry {
            block_ids: offer.block_ids,
            lease_until: self.now + self.config.lease,
        };
        self.offers_expire_from = self.offers_expire_from.min(entry.lease_until);
        if let Some((_, reg)) = self.stash.take(&keys) {
            self.begin(keys, reg, Some(entry));
            self.work_queued = true;
            return Ok(());
        }
        match self.offers.insert(keys, entry) {
            Ok(()) => Ok(()),
            Err(TableFull(keys, entry)) => {
                self.counters.offers_refused += 1;
                Err(OfferError::Full(Offer {
                    request_id: keys.id,
                    transfer_id: keys.transfer_id,
                    block_ids: entry.block_ids,
                }))
            }
        }
    }

    pub(super) fn expire_offers(&mut self) {
        let now = self.now;
        if now < self.offers_expire_from {
            return;
        }
        self.offers_expire_from = self
            .offers
            .iter()
            .map(|(_, o)| o.lease_until)
            .filter(|&until| until > now)
            .min()
            .unwrap_or(Instant::MAX);
        let mut expired: Vec<String> = self
            .offers
            .iter()
            .filter(|(_, o)| o.lease_until <= now)
            .map(|(k, _)| k.id.clone())
            .collect();
        // A fixed order whatever the table's.
        expired.sort_unstable();
        for id in expired {
            if let Some((keys, _)) = self.offers.remove(&id) {
                self.counters.leases_expired += 1;
                self.release_source(&id);
                self.remember_retired(keys, None);
            }
        }
    }
}
