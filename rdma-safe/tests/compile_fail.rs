//! What must not compile: posting in the wrong queue pair state, skipping a state,
//! and using a memory region after it was deregistered.

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
