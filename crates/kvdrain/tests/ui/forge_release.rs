// A `Released` (blocks free for reuse) cannot be made up outside the ledger.
use kvdrain::{BlockHandle, Released, RequestKey};

fn forge(key: RequestKey) -> Released {
    Released { key, blocks: BlockHandle(1), forced: false }
}

fn main() {
    let _ = forge;
}
