//! What must not compile: posting in the wrong queue pair state, skipping a state,
//! using a memory region after it was deregistered, pointing a scatter/gather
//! entry at another region or building one from numbers, forging, building, cloning or
//! replaying a completion for `LeasedQp`, reading the bytes of a device region, and
//! binding a window to a region it cannot keep alive.

#[test]
fn misuse_does_not_compile() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/compile_fail/*.rs");
}
