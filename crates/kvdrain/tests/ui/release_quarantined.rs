// C1/F5: an aborted or expired request's blocks stay fenced until `Released`.
use kvdrain::{BlockHandle, Quarantined};

fn free_now(q: Quarantined) -> BlockHandle {
    q.into_free()
}

fn main() {
    let _ = free_now;
}
