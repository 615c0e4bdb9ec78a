//! What the producer-side tests share: the `PUSH_REG:` that one D rank (engine `engine-d`,
//! TP 1) sends for one request it wants pushed from `engine-p` (TP 1, PP 1) into block 7.

use kvdrain_driver::registration::PushRegistration;

/// The `PUSH_REG:` notification's bytes for `id`.
pub fn registration(id: &str) -> Vec<u8> {
    PushRegistration {
        request_id: id.into(),
        decode_engine_id: "engine-d".into(),
        decode_host: "127.0.0.1".into(),
        decode_port: 1,
        decode_tp_size: 1,
        local_block_ids: vec![vec![7]],
        remote_engine_id: "engine-p".into(),
        remote_host: "127.0.0.1".into(),
        remote_port: 2,
        remote_tp_size: 1,
        remote_pp_size: 1,
        transfer_id: None,
    }
    .to_notification()
}
