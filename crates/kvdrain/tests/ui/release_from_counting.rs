// C1: blocks of a request whose writes may still land cannot be handed back.
use kvdrain::{BlockHandle, Config, Expect, Ledger, Registration};

fn main() {
    let mut ledger: Ledger<8, 2> = Ledger::new(Config::with_capacity(8));
    let registration = Registration { id: "r", blocks: BlockHandle(1), expect: Expect::Count(1), deadline: None };
    let counting = ledger.register(registration).unwrap();
    let _blocks: BlockHandle = counting.into_free();
}
