// A completion made up by safe code cannot release a lease: `complete` takes only a
// `Completion`, which only a poll makes.
use rdma_safe::lease::LeasedQp;
use rdma_safe::WorkCompletion;

fn forge(conn: &mut LeasedQp) {
    let mut wc = WorkCompletion::default();
    wc.0.qp_num = conn.qp().qp_num();
    let _ = conn.complete(wc);
}

fn main() {}
