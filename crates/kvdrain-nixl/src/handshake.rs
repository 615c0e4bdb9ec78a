//! The P → D handshake: what a producer needs to write into one consumer rank, and where it
//! gets it.
//!
//! vLLM fetches it over a ZMQ side channel (`get_meta_msg`); kvdrain leaves the channel to the
//! engine behind the [`Handshake`] trait and ships [`StaticHandshake`], an in-memory table,
//! for tests, the demo and engines that publish metadata through their own control plane.

use std::collections::HashMap;

use crate::block_layout::BlockLayout;

/// One consumer rank, as a producer sees it after the handshake.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerRank {
    /// The consumer agent's NIXL metadata (`get_local_md`).
    pub metadata: Vec<u8>,
    /// Where its KV blocks are.
    pub layout: BlockLayout,
}

/// Why a handshake failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("handshake with {engine_id} rank {d_rank} failed: {reason}")]
pub struct HandshakeError {
    /// Consumer engine.
    pub engine_id: String,
    /// Consumer TP rank.
    pub d_rank: u16,
    /// What went wrong.
    pub reason: String,
    /// The consumer agent's metadata, if the handshake got that far (e.g. it was refused on a
    /// compatibility check afterwards): enough to tell D with a `PUSH_FAIL` (catalogue F8).
    pub metadata: Option<Vec<u8>>,
}

/// Where a producer gets consumer ranks from.
pub trait Handshake {
    /// The layout and metadata of rank `d_rank` of consumer engine `engine_id`.
    ///
    /// # Errors
    /// [`HandshakeError`] if the consumer cannot be reached or refused.
    fn consumer_rank(
        &mut self,
        engine_id: &str,
        d_rank: u16,
    ) -> Result<ConsumerRank, HandshakeError>;
}

/// An in-memory handshake table: consumers publish, producers look up.
#[derive(Clone, Debug, Default)]
pub struct StaticHandshake {
    ranks: HashMap<(String, u16), ConsumerRank>,
}

impl StaticHandshake {
    /// Publishes rank `d_rank` of `engine_id`.
    pub fn publish(&mut self, engine_id: &str, d_rank: u16, rank: ConsumerRank) {
        self.ranks.insert((engine_id.to_owned(), d_rank), rank);
    }

    /// Withdraws a rank (later handshakes with it fail).
    pub fn withdraw(&mut self, engine_id: &str, d_rank: u16) -> Option<ConsumerRank> {
        self.ranks.remove(&(engine_id.to_owned(), d_rank))
    }
}

impl Handshake for StaticHandshake {
    fn consumer_rank(
        &mut self,
        engine_id: &str,
        d_rank: u16,
    ) -> Result<ConsumerRank, HandshakeError> {
        self.ranks
            .get(&(engine_id.to_owned(), d_rank))
            .cloned()
            .ok_or_else(|| HandshakeError {
                engine_id: engine_id.to_owned(),
                d_rank,
                reason: "no such consumer rank published".to_owned(),
                metadata: None,
            })
    }
}
