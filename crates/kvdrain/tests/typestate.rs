//! Misuse of the typestate API must not compile (trybuild). Each case names the hazard of
//! the failure catalogue (`docs/protocol.md#catalogue`) it guards against.
#![cfg(not(kvdrain_loom))]

#[test]
#[cfg_attr(miri, ignore = "runs rustc")]
fn illegal_transitions_do_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/*.rs");
}
