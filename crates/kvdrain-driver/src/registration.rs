//! The `PUSH_REG:` registration D sends to every producer agent: vLLM's msgpack map, field
//! for field (`docs/protocol.md#wire-registration`).
//!
//! | field | msgpack type |
//! | --- | --- |
//! | `request_id`, `decode_engine_id`, `decode_host`, `remote_engine_id`, `remote_host` | str |
//! | `decode_port`, `decode_tp_size`, `remote_port`, `remote_tp_size`, `remote_pp_size` | int |
//! | `local_block_ids` | array of array of int (a flat array is one group, as `_as_grouped_block_ids`) |
//! | `transfer_id` | str, optional (absent or nil when unset) |
//!
//! Encoding writes exactly these keys (`transfer_id` only when set), with msgpack's
//! smallest representations, as Python's `msgpack.packb` does. Decoding follows vLLM's
//! msgspec struct: unknown keys are ignored, a key given twice takes its **last** value,
//! `remote_pp_size` may be absent (default 1) and `transfer_id` may be absent, nil or a
//! string.

use rmpv::Value;

/// A decoded or to-be-sent registration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PushRegistration {
    /// D's request id; echoed in completions and failure notices.
    pub request_id: String,
    /// D's engine id.
    pub decode_engine_id: String,
    /// D's side-channel host (P → D handshake).
    pub decode_host: String,
    /// D's side-channel port.
    pub decode_port: u16,
    /// D's tensor-parallel size.
    pub decode_tp_size: u16,
    /// D's logical block ids per KV-cache group (uncached suffix only).
    pub local_block_ids: Vec<Vec<u64>>,
    /// P's engine id.
    pub remote_engine_id: String,
    /// P's side-channel host.
    pub remote_host: String,
    /// P's side-channel port.
    pub remote_port: u16,
    /// P's tensor-parallel size.
    pub remote_tp_size: u16,
    /// P's pipeline-parallel size.
    pub remote_pp_size: u16,
    /// Router-assigned pairing key, if any.
    pub transfer_id: Option<String>,
}

/// Why a registration payload was refused (vLLM logs and drops these).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistrationError {
    /// The bytes are not one msgpack value.
    #[error("PUSH_REG payload is not msgpack: {0}")]
    NotMsgpack(String),
    /// The value is not a map.
    #[error("PUSH_REG payload is not a map")]
    NotAMap,
    /// A required field is missing.
    #[error("PUSH_REG field {0:?} is missing")]
    Missing(&'static str),
    /// A field has the wrong type or an out-of-range value.
    #[error("PUSH_REG field {0:?} has the wrong type or value")]
    BadField(&'static str),
    /// Bytes follow the map.
    #[error("PUSH_REG payload has {0} trailing bytes")]
    Trailing(usize),
}

impl PushRegistration {
    /// The router's `transfer_id` when set, else D's `request_id`: the key duplicates of
    /// one registration share (the producer driver pairs by exact id, `transfer_id` and
    /// base id in turn: [`crate::pairing`]).
    pub fn pairing_key(&self) -> &str {
        self.transfer_id.as_deref().unwrap_or(&self.request_id)
    }

    /// The msgpack map (without the `PUSH_REG:` prefix).
    pub fn to_msgpack(&self) -> Vec<u8> {
        let s = |v: &str| Value::from(v);
        let n = |v: u16| Value::from(v);
        let mut map = vec![
            (s("request_id"), s(&self.request_id)),
            (s("decode_engine_id"), s(&self.decode_engine_id)),
            (s("decode_host"), s(&self.decode_host)),
            (s("decode_port"), n(self.decode_port)),
            (s("decode_tp_size"), n(self.decode_tp_size)),
            (
                s("local_block_ids"),
                Value::Array(
                    self.local_block_ids
                        .iter()
                        .map(|g| Value::Array(g.iter().map(|&b| Value::from(b)).collect()))
                        .collect(),
                ),
            ),
            (s("remote_engine_id"), s(&self.remote_engine_id)),
            (s("remote_host"), s(&self.remote_host)),
            (s("remote_port"), n(self.remote_port)),
            (s("remote_tp_size"), n(self.remote_tp_size)),
            (s("remote_pp_size"), n(self.remote_pp_size)),
        ];
        if let Some(t) = &self.transfer_id {
            map.push((s("transfer_id"), s(t)));
        }
        let mut out = Vec::with_capacity(256);
        // Writing into a Vec cannot fail.
        let _ = rmpv::encode::write_value(&mut out, &Value::Map(map));
        out
    }

    /// The whole notification: `PUSH_REG:` + msgpack map.
    pub fn to_notification(&self) -> Vec<u8> {
        let payload = self.to_msgpack();
        let mut out = vec![0; kvdrain::wire::PUSH_REG_PREFIX.len() + payload.len()];
        // The buffer is sized exactly.
        let _ = kvdrain::wire::encode_registration(&payload, &mut out);
        out
    }

    /// Decodes the msgpack payload (after the `PUSH_REG:` prefix).
    ///
    /// # Errors
    /// [`RegistrationError`] naming the first problem.
    pub fn from_msgpack(payload: &[u8]) -> Result<Self, RegistrationError> {
        let mut rest = payload;
        let value = rmpv::decode::read_value(&mut rest)
            .map_err(|e| RegistrationError::NotMsgpack(e.to_string()))?;
        if !rest.is_empty() {
            return Err(RegistrationError::Trailing(rest.len()));
        }
        let Value::Map(entries) = value else {
            return Err(RegistrationError::NotAMap);
        };
        // msgspec decodes a map key by key into the struct: the last duplicate wins.
        let get = |key: &'static str| {
            entries
                .iter()
                .rev()
                .find(|(k, _)| k.as_str() == Some(key))
                .map(|(_, v)| v)
        };
        let req = |key| get(key).ok_or(RegistrationError::Missing(key));
        let string = |key| {
            req(key)?
                .as_str()
                .map(str::to_owned)
                .ok_or(RegistrationError::BadField(key))
        };
        let small = |key| {
            req(key)?
                .as_u64()
                .and_then(|v| u16::try_from(v).ok())
                .ok_or(RegistrationError::BadField(key))
        };
        Ok(PushRegistration {
            request_id: string("request_id")?,
            decode_engine_id: string("decode_engine_id")?,
            decode_host: string("decode_host")?,
            decode_port: small("decode_port")?,
            decode_tp_size: small("decode_tp_size")?,
            local_block_ids: grouped_block_ids(req("local_block_ids")?)
                .ok_or(RegistrationError::BadField("local_block_ids"))?,
            remote_engine_id: string("remote_engine_id")?,
            remote_host: string("remote_host")?,
            remote_port: small("remote_port")?,
            remote_tp_size: small("remote_tp_size")?,
            remote_pp_size: match get("remote_pp_size") {
                None => 1,
                Some(_) => small("remote_pp_size")?,
            },
            transfer_id: match get("transfer_id") {
                None | Some(Value::Nil) => None,
                Some(v) => Some(
                    v.as_str()
                        .map(str::to_owned)
                        .ok_or(RegistrationError::BadField("transfer_id"))?,
                ),
            },
        })
    }
}

/// `[[ids], ...]`, or a flat `[ids]` re-wrapped as one group (vLLM `_as_grouped_block_ids`).
fn grouped_block_ids(v: &Value) -> Option<Vec<Vec<u64>>> {
    let outer = v.as_array()?;
    let ids = |a: &[Value]| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>();
    if outer.iter().all(Value::is_array) {
        outer.iter().map(|g| ids(g.as_array()?)).collect()
    } else {
        ids(outer).map(|flat| vec![flat])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> PushRegistration {
        PushRegistration {
            request_id: "cmpl-d-0".into(),
            decode_engine_id: "engine-d".into(),
            decode_host: "10.0.0.2".into(),
            decode_port: 5600,
            decode_tp_size: 1,
            local_block_ids: vec![vec![3, 4, 300, 70000]],
            remote_engine_id: "engine-p".into(),
            remote_host: "10.0.0.1".into(),
            remote_port: 5601,
            remote_tp_size: 2,
            remote_pp_size: 1,
            transfer_id: Some("xfer-1".into()),
        }
    }

    #[test]
    fn round_trips_and_is_prefixed() {
        let r = sample();
        assert_eq!(
            PushRegistration::from_msgpack(&r.to_msgpack()),
            Ok(r.clone())
        );
        let n = r.to_notification();
        assert!(n.starts_with(b"PUSH_REG:"));
        let no_transfer = PushRegistration {
            transfer_id: None,
            ..r
        };
        assert_eq!(no_transfer.pairing_key(), "cmpl-d-0");
        assert_eq!(
            PushRegistration::from_msgpack(&no_transfer.to_msgpack()),
            Ok(no_transfer)
        );
    }

    #[test]
    fn refuses_garbage_without_panicking() {
        for truncated in [&b""[..], b"\x82\xaarequest_id"] {
            assert!(matches!(
                PushRegistration::from_msgpack(truncated),
                Err(RegistrationError::NotMsgpack(_))
            ));
        }
        assert_eq!(
            PushRegistration::from_msgpack(b"\x91\x01"),
            Err(RegistrationError::NotAMap)
        );
        assert_eq!(
            PushRegistration::from_msgpack(b"\x80"),
            Err(RegistrationError::Missing("request_id"))
        );
        let mut bytes = sample().to_msgpack();
        bytes.push(0);
        assert_eq!(
            PushRegistration::from_msgpack(&bytes),
            Err(RegistrationError::Trailing(1))
        );
    }

    /// The bytes vLLM's encoder (msgspec) writes for a registration without `transfer_id`
    /// and without `remote_pp_size`, plus a key this decoder does not know.
    #[test]
    fn golden_without_pp_size_with_unknown_key() {
        let mut b = vec![0x8c]; // fixmap, 12 entries
        let s = |b: &mut Vec<u8>, v: &str| {
            b.push(0xa0 | v.len() as u8);
            b.extend_from_slice(v.as_bytes());
        };
        s(&mut b, "request_id");
        s(&mut b, "cmpl-abc-0-1a2b3c4d");
        s(&mut b, "decode_engine_id");
        s(&mut b, "d");
        s(&mut b, "decode_host");
        s(&mut b, "h");
        s(&mut b, "decode_port");
        b.extend_from_slice(&[0xcd, 0x15, 0xe0]); // 5600
        s(&mut b, "decode_tp_size");
        b.push(0x01);
        s(&mut b, "local_block_ids");
        b.extend_from_slice(&[0x92, 0x03, 0x04]); // flat [3, 4]
        s(&mut b, "remote_engine_id");
        s(&mut b, "p");
        s(&mut b, "remote_host");
        s(&mut b, "ph");
        s(&mut b, "remote_port");
        b.extend_from_slice(&[0xcd, 0x15, 0xe1]); // 5601
        s(&mut b, "remote_tp_size");
        b.push(0x02);
        s(&mut b, "new_field");
        b.extend_from_slice(&[0x93, 0x01, 0x02, 0x03]);
        s(&mut b, "transfer_id");
        b.push(0xc0); // nil
        let r = PushRegistration::from_msgpack(&b).expect("decodes");
        assert_eq!(r.remote_pp_size, 1, "absent remote_pp_size defaults to 1");
        assert_eq!(r.transfer_id, None);
        assert_eq!(r.local_block_ids, vec![vec![3, 4]]);
        assert_eq!(r.remote_tp_size, 2);
        assert_eq!(r.decode_port, 5600);
    }

    #[test]
    fn golden_last_duplicate_key_wins_and_transfer_id_is_a_string() {
        // {"request_id": "a", ..., "request_id": "b", "transfer_id": "t-1"} built from the
        // sample's bytes with two keys appended (fixmap count bumped by 2).
        let mut b = sample().to_msgpack();
        assert_eq!(b[0], 0x8c, "sample: 12 keys");
        b[0] = 0x8e;
        b.extend_from_slice(b"\xaarequest_id\xa1b");
        b.extend_from_slice(b"\xabtransfer_id\xa3t-1");
        let r = PushRegistration::from_msgpack(&b).expect("decodes");
        assert_eq!(r.request_id, "b", "last duplicate wins (msgspec)");
        assert_eq!(r.transfer_id.as_deref(), Some("t-1"));
        // A transfer_id that is not a string is refused.
        let mut bad = sample().to_msgpack();
        bad[0] = 0x8d;
        bad.extend_from_slice(b"\xabtransfer_id\x07");
        assert_eq!(
            PushRegistration::from_msgpack(&bad),
            Err(RegistrationError::BadField("transfer_id"))
        );
        // remote_pp_size present but wrong is still an error.
        let mut bad = sample().to_msgpack();
        bad[0] = 0x8d;
        bad.extend_from_slice(b"\xaeremote_pp_size\xa1x");
        assert_eq!(
            PushRegistration::from_msgpack(&bad),
            Err(RegistrationError::BadField("remote_pp_size"))
        );
    }
}
