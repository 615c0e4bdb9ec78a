// Invariant 9: a failed (partial) load is never promoted to decode.
use kvdrain::{BlockHandle, Decision};

fn to_decode(decision: Decision) -> Option<BlockHandle> {
    match decision {
        Decision::Failed(failed) => Some(failed.into_decode()),
        _ => None,
    }
}

fn main() {
    let _ = to_decode;
}
