//! `ib_send_lat`: perftest's latency test of SEND, compatible with perftest 6.06 on the wire
//! and in its report (`ib_send_lat -h` lists the options).

fn main() {
    examples::perftest::main(
        examples::perftest::Verb::Send,
        examples::perftest::TestKind::Lat,
    )
}
