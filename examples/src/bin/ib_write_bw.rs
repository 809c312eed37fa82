//! `ib_write_bw`: perftest's bandwidth test of RDMA_WRITE, compatible with perftest 6.06 on the wire
//! and in its report (`ib_write_bw -h` lists the options).

fn main() {
    examples::perftest::main(
        examples::perftest::Verb::Write,
        examples::perftest::TestKind::Bw,
    )
}
