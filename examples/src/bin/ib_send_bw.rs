//! `ib_send_bw`: perftest's bandwidth test of SEND, compatible with perftest 6.06 on the wire
//! and in its report (`ib_send_bw -h` lists the options).

fn main() {
    examples::perftest::main(
        examples::perftest::Verb::Send,
        examples::perftest::TestKind::Bw,
    )
}
