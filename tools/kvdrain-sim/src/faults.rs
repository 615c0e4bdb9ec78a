//! The fault classes the simulation injects (catalogue ids of
//! `docs/protocol.md#catalogue`), how often, and how many times each was actually exercised.
//!
//! The fault events that are not the network's (the transports, [`super::link`] and
//! [`super::decode_link`], apply those) are here as well: a prefill engine's abort (F5, silent
//! or not), a producer rank's death, the transport seeing it gone, and its replacement coming
//! up.

use kvdrain::AgentId;
use kvdrain_driver::producer::ProducerDriver;

use super::cluster::Cluster;
use super::timing::{GONE_AFTER, REDISCOVER_AFTER};
use super::workload::producer_request_id;
use super::world::{Event, World, known_engine, producer_config};

/// Injection rates in parts per million of the chances each fault gets.
#[derive(Clone, Copy, Debug)]
pub struct Rates {
    /// A WRITE fails to post (C2), per edge.
    pub post_fail: u32,
    /// A posted WRITE fails (F7, a backend error), per WRITE.
    pub write_fail: u32,
    /// A posted WRITE's status becomes unreadable (F7: NOT_FOUND the producer did not
    /// cause), per WRITE: it still lands or fails, but the producer cannot know.
    pub status_unknown: u32,
    /// A failed WRITE landed part of its data first.
    pub partial_data: u32,
    /// A notification is delivered twice (named-edge requests, or after the decision).
    pub duplicate: u32,
    /// A notification is held back so later ones overtake it.
    pub reorder: u32,
    /// NIXL reports an error after the completion was delivered (F7): a `PUSH_FAIL`
    /// follows the completion (named-edge requests only).
    pub error_after_completion: u32,
    /// A failure notice cannot be sent (the producer cannot reach the consumer).
    pub notice_lost: u32,
    /// `PUSH_REG` does not reach one producer rank (F6), per request.
    pub partial_registration: u32,
    /// The consumer aborts the request (C1/F5), per request.
    pub consumer_abort: u32,
    /// The producer aborts the request (F5), per request.
    pub producer_abort: u32,
    /// An aborting producer sends none of the failure notices it owes.
    pub producer_abort_silent: u32,
    /// The producer is slow, so its lease ends while it pushes (F3/F4), per producer rank.
    pub slow_producer: u32,
    /// A short deadline that falls while WRITEs are in flight (L1), per request.
    pub short_deadline: u32,
    /// A burst of arrivals that fills the tables, per request.
    pub burst: u32,
    /// Noise per request: a notice for an unknown id, for an expired id, malformed bytes,
    /// a misrouted producer-bound message, a notice from the wrong sender.
    pub unknown_id: u32,
    /// See `unknown_id`.
    pub expired_id: u32,
    /// See `unknown_id`.
    pub malformed: u32,
    /// See `unknown_id`.
    pub misrouted: u32,
    /// See `unknown_id`.
    pub wrong_sender: u32,
    /// A second registration of a tracked id.
    pub duplicate_registration: u32,
    /// A producer rank dies, per request.
    pub producer_death: u32,
    /// Of those deaths, the transport reports the dead agent as a peer gone and every
    /// decode rank's driver reports it gone to the core (a death seen gone: its edges fail
    /// at once and their blocks are held until they settle); otherwise nobody reports it
    /// (an unseen death).
    pub seen_gone: u32,
    /// A failed WRITE keeps landing for up to `LATE_LANDING` ms after its error, per failed
    /// WRITE. Off by default until the core settles failure notices (`settle_ms`):
    /// `kvdrain sim --late-landing` turns it on.
    pub late_landing: u32,
}

impl Default for Rates {
    fn default() -> Self {
        Rates {
            post_fail: 8_000,
            write_fail: 10_000,
            status_unknown: 2_000,
            partial_data: 500_000,
            duplicate: 20_000,
            reorder: 30_000,
            error_after_completion: 3_000,
            notice_lost: 30_000,
            partial_registration: 8_000,
            consumer_abort: 30_000,
            producer_abort: 8_000,
            producer_abort_silent: 500_000,
            slow_producer: 4_000,
            short_deadline: 20_000,
            burst: 1_000,
            unknown_id: 5_000,
            expired_id: 5_000,
            malformed: 5_000,
            misrouted: 3_000,
            wrong_sender: 3_000,
            duplicate_registration: 2_000,
            producer_death: 300,
            seen_gone: 600_000,
            late_landing: 0,
        }
    }
}

/// How many times each fault class was exercised.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Faults {
    /// C2: WRITEs that failed to post.
    pub post_failed: u64,
    /// F7: WRITEs that failed after posting.
    pub failed_after_post: u64,
    /// F7: WRITEs whose status the producer could not read (no notice, sources fenced).
    pub status_unknown: u64,
    /// F7: errors reported after a delivered completion.
    pub error_after_completion: u64,
    /// Notifications delivered twice.
    pub duplicated: u64,
    /// Notifications held back behind later ones.
    pub reordered: u64,
    /// Notices for ids never registered (or not registered yet).
    pub unknown_id: u64,
    /// Notices for requests decided and gone.
    pub expired_id: u64,
    /// Consumer aborts while edges were outstanding (C1/F5).
    pub aborted_mid_push: u64,
    /// Producer aborts (F5).
    pub producer_abort: u64,
    /// Producer leases that ended while the push was unfinished (F3).
    pub lease_expired_in_flight: u64,
    /// Registrations answered with failure notices because the producer's request had
    /// ended there (F4: nothing is posted for it).
    pub deferred_post_refused: u64,
    /// Consumer deadlines that passed while WRITEs were in flight (L1).
    pub deadline_expired_in_flight: u64,
    /// Registrations that missed a producer rank (F6).
    pub partial_registration: u64,
    /// Producer deaths the transport reported as a peer gone.
    pub producer_death_seen_gone: u64,
    /// Producer deaths nobody reported.
    pub producer_death_unseen: u64,
    /// Malformed notifications.
    pub malformed: u64,
    /// `HB:` / `PUSH_REG:` delivered to a consumer.
    pub misrouted: u64,
    /// Notices from an agent that is not an edge of the request.
    pub wrong_sender: u64,
    /// Failure notices that could not be sent.
    pub notice_lost: u64,
    /// Registrations refused by a full table.
    pub table_full: u64,
    /// Second registrations of a tracked id.
    pub duplicate_registration: u64,
    /// Failed WRITEs that kept landing after their error.
    pub late_landing: u64,
}

impl Faults {
    /// `(name, count)` for every class, in output order.
    pub fn entries(&self) -> [(&'static str, u64); 23] {
        [
            ("post_failed", self.post_failed),
            ("failed_after_post", self.failed_after_post),
            ("status_unknown", self.status_unknown),
            ("error_after_completion", self.error_after_completion),
            ("duplicated", self.duplicated),
            ("reordered", self.reordered),
            ("unknown_id", self.unknown_id),
            ("expired_id", self.expired_id),
            ("aborted_mid_push", self.aborted_mid_push),
            ("producer_abort", self.producer_abort),
            ("lease_expired_in_flight", self.lease_expired_in_flight),
            ("deferred_post_refused", self.deferred_post_refused),
            (
                "deadline_expired_in_flight",
                self.deadline_expired_in_flight,
            ),
            ("partial_registration", self.partial_registration),
            ("producer_death_seen_gone", self.producer_death_seen_gone),
            ("producer_death_unseen", self.producer_death_unseen),
            ("malformed", self.malformed),
            ("misrouted", self.misrouted),
            ("wrong_sender", self.wrong_sender),
            ("notice_lost", self.notice_lost),
            ("table_full", self.table_full),
            ("duplicate_registration", self.duplicate_registration),
            ("late_landing", self.late_landing),
        ]
    }
}

impl World {
    pub(super) fn producer_abort(&mut self, req: u64) {
        let silent = self.rng.chance(self.rates.producer_abort_silent);
        let Some(request) = self.requests.get_mut(&req) else {
            return;
        };
        // F5: the producer aborts too; a silent one never sends what it owes.
        request.producer_aborted = true;
        request.producer_silent = silent;
        if silent {
            self.silent.insert(req);
        }
        self.faults.producer_abort += 1;
        let p_id = producer_request_id(req);
        for rank in self.cluster.ranks_of(request.engine) {
            if self.cluster.ranks[rank].alive {
                self.producers[rank].retire(&p_id);
                self.want_tick(rank);
            }
        }
    }

    pub(super) fn death(&mut self, rank: usize) {
        if !self.cluster.ranks[rank].alive {
            return;
        }
        self.cluster.ranks[rank].alive = false;
        let agent = self.cluster.ranks[rank].agent;
        // Its WRITEs stop: part of each may have landed, nothing more will.
        let cut: Vec<u64> = self
            .writes
            .iter()
            .filter(|(_, w)| w.agent == agent)
            .map(|(&id, _)| id)
            .collect();
        for id in cut {
            if let Some(w) = self.writes.remove(&id) {
                self.end_write(&w, false);
            }
        }
        // Everything the dead incarnation knew is gone with it.
        self.producers[rank] = ProducerDriver::new(producer_config(&self.cluster, rank));
        self.inboxes[rank].clear();
        self.finished[rank].clear();
        if self.rng.chance(self.rates.seen_gone) {
            self.faults.producer_death_seen_gone += 1;
            let at = self.now + self.between(GONE_AFTER);
            self.agenda.push(at, Event::DeathSeen { rank, agent });
        } else {
            self.faults.producer_death_unseen += 1;
            self.agenda
                .push(self.now + REDISCOVER_AFTER, Event::Rediscover { rank });
        }
    }

    /// The transport sees `agent` gone: every decode rank's transport reports it (its
    /// driver reports it gone to the core, whose edges of it fail at once and settle for
    /// `settle_ms`: a dead producer's errored WRITEs keep landing for a while after its
    /// death is seen, the late-landing fault), and its replacement comes up at once.
    pub(super) fn death_seen(&mut self, rank: usize, agent: AgentId) {
        for d in 0..self.consumers.len() {
            self.consumers[d].gone.push_back(Cluster::agent_name(agent));
        }
        self.restart(rank);
        for d in 0..self.consumers.len() {
            self.poll_decode(d);
        }
    }

    /// A new incarnation of `rank` comes up and every decode rank's driver learns its
    /// agent (`add_producer_engine` once per incarnation).
    pub(super) fn restart(&mut self, rank: usize) {
        self.cluster.restart(rank);
        let engine = known_engine(&self.cluster, self.cluster.ranks[rank].engine);
        for d in 0..self.consumers.len() {
            if let Err(e) = self.consumers[d].driver.add_producer_engine(engine.clone()) {
                self.violation(format!("rank {d} cannot learn a restarted producer: {e}"));
            }
        }
    }
}
