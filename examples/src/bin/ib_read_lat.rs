//! `ib_read_lat`: perftest's latency test of RDMA_READ, compatible with perftest 6.06 on the wire
//! and in its report (`ib_read_lat -h` lists the options).

fn main() {
    examples::perftest::main(
        examples::perftest::Verb::Read,
        examples::perftest::TestKind::Lat,
    )
}
