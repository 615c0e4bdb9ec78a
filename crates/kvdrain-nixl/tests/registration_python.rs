//! The `PUSH_REG:` msgpack map checked against Python's `msgpack` (what vLLM uses), in both
//! directions and byte for byte. `scripts/setup-nixl.sh` installs `msgpack` into
//! `<repo>/.nixl/py`; without it the test fails with that hint unless `KVDRAIN_SKIP_NIXL=1`.

use std::path::Path;
use std::process::Command;

use kvdrain_nixl::registration::PushRegistration;
use kvdrain_nixl::testbed::{from_hex, to_hex};

fn sample(transfer_id: Option<&str>) -> PushRegistration {
    PushRegistration {
        request_id: "cmpl-3f2a-0-d".into(),
        decode_engine_id: "engine-d".into(),
        decode_host: "10.1.2.3".into(),
        decode_port: 5600,
        decode_tp_size: 1,
        local_block_ids: vec![vec![0, 7, 127, 128, 255, 256, 65535, 65536, 4_294_967_296]],
        remote_engine_id: "engine-p".into(),
        remote_host: "10.1.2.4".into(),
        remote_port: 5601,
        remote_tp_size: 2,
        remote_pp_size: 1,
        transfer_id: transfer_id.map(str::to_owned),
    }
}

/// The same map as a Python literal, keys in the order Rust writes them.
fn python_literal(r: &PushRegistration) -> String {
    let groups: Vec<String> = r
        .local_block_ids
        .iter()
        .map(|g| {
            format!(
                "[{}]",
                g.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            )
        })
        .collect();
    let mut s = format!(
        "{{'request_id': {:?}, 'decode_engine_id': {:?}, 'decode_host': {:?}, 'decode_port': {}, \
         'decode_tp_size': {}, 'local_block_ids': [{}], 'remote_engine_id': {:?}, \
         'remote_host': {:?}, 'remote_port': {}, 'remote_tp_size': {}, 'remote_pp_size': {}",
        r.request_id,
        r.decode_engine_id,
        r.decode_host,
        r.decode_port,
        r.decode_tp_size,
        groups.join(", "),
        r.remote_engine_id,
        r.remote_host,
        r.remote_port,
        r.remote_tp_size,
        r.remote_pp_size
    );
    if let Some(t) = &r.transfer_id {
        s += &format!(", 'transfer_id': {t:?}");
    }
    s + "}"
}

/// Runs `script` with Python and `msgpack`; `None` (after a loud line) if skipping.
fn python(script: &str) -> Option<String> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let py_path = repo.join(".nixl").join("py");
    let python = std::env::var("KVDRAIN_PYTHON").unwrap_or_else(|_| "python3".to_owned());
    let out = Command::new(&python)
        .arg("-c")
        .arg(script)
        .env("PYTHONPATH", &py_path)
        .output();
    let skip = std::env::var("KVDRAIN_SKIP_NIXL").is_ok_and(|v| !v.is_empty() && v != "0");
    let why = match out {
        Ok(o) if o.status.success() => {
            return Some(String::from_utf8_lossy(&o.stdout).trim().to_owned());
        }
        Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
        Err(e) => e.to_string(),
    };
    let msg = format!(
        "Python msgpack unavailable ({python}, PYTHONPATH={}): {why}; run scripts/setup-nixl.sh \
         (it installs msgpack into .nixl/py)",
        py_path.display()
    );
    if skip {
        eprintln!("!!!!!!!! SKIPPED: {msg}");
        None
    } else {
        panic!("{msg} (set KVDRAIN_SKIP_NIXL=1 to skip)");
    }
}

#[test]
fn rust_bytes_equal_python_packb_and_decode_there() {
    for t in [Some("xfer-9"), None] {
        let r = sample(t);
        let ours = r.to_msgpack();
        let lit = python_literal(&r);
        let Some(theirs) = python(&format!(
            "import msgpack; d = {lit}; b = bytes.fromhex('{}'); \
             assert msgpack.unpackb(b, raw=False) == d, msgpack.unpackb(b, raw=False); \
             print(msgpack.packb(d).hex())",
            to_hex(&ours)
        )) else {
            return;
        };
        assert_eq!(
            theirs,
            to_hex(&ours),
            "Python's packb bytes differ from ours"
        );
    }
}

#[test]
fn python_bytes_decode_here() {
    // Python's way of writing it (other key order, a flat block list, nil transfer id, an
    // extra field) still decodes.
    let Some(hex) = python(
        "import msgpack; print(msgpack.packb({'transfer_id': None, 'remote_pp_size': 1, \
         'remote_tp_size': 4, 'remote_port': 5601, 'remote_host': 'p', 'remote_engine_id': 'ep', \
         'local_block_ids': [5, 6, 70000], 'decode_tp_size': 2, 'decode_port': 5600, \
         'decode_host': 'd', 'decode_engine_id': 'ed', 'request_id': 'r:1', 'extra': [1.5]}).hex())",
    ) else {
        return;
    };
    let r = PushRegistration::from_msgpack(&from_hex(&hex).expect("hex")).expect("decodes");
    assert_eq!(
        r,
        PushRegistration {
            request_id: "r:1".into(),
            decode_engine_id: "ed".into(),
            decode_host: "d".into(),
            decode_port: 5600,
            decode_tp_size: 2,
            local_block_ids: vec![vec![5, 6, 70000]],
            remote_engine_id: "ep".into(),
            remote_host: "p".into(),
            remote_port: 5601,
            remote_tp_size: 4,
            remote_pp_size: 1,
            transfer_id: None,
        }
    );
    // A non-str request_id is refused, as vLLM drops it.
    let Some(hex) = python("import msgpack; print(msgpack.packb({'request_id': 5}).hex())") else {
        return;
    };
    assert!(PushRegistration::from_msgpack(&from_hex(&hex).expect("hex")).is_err());
}
