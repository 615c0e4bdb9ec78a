// A ticket is consumed by the transition it takes part in: aborting twice is impossible.
use kvdrain::{BlockHandle, Config, Expect, Ledger, Registration};

fn main() {
    let mut ledger: Ledger<8, 2> = Ledger::new(Config::with_capacity(8));
    let registration = Registration { id: "r", blocks: BlockHandle(1), expect: Expect::Count(1), deadline: None };
    let counting = ledger.register(registration).unwrap();
    let _quarantined = ledger.abort(counting);
    let _again = ledger.abort(counting);
}
