//! `ib_read_bw`: perftest's bandwidth test of RDMA_READ, compatible with perftest 6.06 on the wire
//! and in its report (`ib_read_bw -h` lists the options).

fn main() {
    examples::perftest::main(
        examples::perftest::Verb::Read,
        examples::perftest::TestKind::Bw,
    )
}
