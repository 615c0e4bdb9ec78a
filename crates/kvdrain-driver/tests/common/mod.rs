//! What the driver tests share: the consumer rank they drive (rank 0 of engine
//! `engine-d`, TP 1, with the producer engine `engine-p` in its directory), and the
//! `PUSH_REG:` that such a rank sends for one request it wants pushed from `engine-p`
//! (TP 1, PP 1) into block 7. Each test binary uses its own part of it.
#![allow(dead_code)]

use kvdrain::{Config, Duration};
use kvdrain_driver::consumer::{ConsumerConfig, ConsumerDriver, RemoteProducer};
use kvdrain_driver::registration::PushRegistration;

/// The producer engine every test pushes from.
pub const P_ENGINE: &str = "engine-p";
/// The consumer engine every test pushes into.
pub const D_ENGINE: &str = "engine-d";

/// `p0`, `p1`, ...: the agents of a producer engine of `p_tp` ranks, by rank.
pub fn producer_agents(p_tp: u16) -> Vec<String> {
    (0..p_tp).map(|r| format!("p{r}")).collect()
}

/// Rank 0 of `engine-d` (TP 1) on the ledger settings `ledger`, holding a registration
/// `lease` long, with `engine-p` in its directory: one rank per agent in `agents` (TP),
/// PP 1.
pub fn consumer_rank(
    ledger: Config,
    lease: Duration,
    agents: Vec<String>,
) -> ConsumerDriver<64, 8> {
    let mut d = ConsumerDriver::new(ConsumerConfig {
        engine_id: D_ENGINE.into(),
        host: "127.0.0.1".into(),
        port: 1,
        tp_rank: 0,
        tp_size: 1,
        lease,
        ledger,
    });
    d.add_producer_engine(RemoteProducer {
        engine_id: P_ENGINE.into(),
        host: "127.0.0.1".into(),
        port: 2,
        tp_size: u16::try_from(agents.len()).expect("a TP size"),
        pp_size: 1,
        mla: false,
        agents,
    })
    .expect("directory");
    d
}

/// The `PUSH_REG:` notification's bytes for `id`.
pub fn registration(id: &str) -> Vec<u8> {
    PushRegistration {
        request_id: id.into(),
        decode_engine_id: D_ENGINE.into(),
        decode_host: "127.0.0.1".into(),
        decode_port: 1,
        decode_tp_size: 1,
        local_block_ids: vec![vec![7]],
        remote_engine_id: P_ENGINE.into(),
        remote_host: "127.0.0.1".into(),
        remote_port: 2,
        remote_tp_size: 1,
        remote_pp_size: 1,
        transfer_id: None,
    }
    .to_notification()
}
