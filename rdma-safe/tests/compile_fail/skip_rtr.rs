// INIT -> RTS skips RTR: there is no such transition.
use rdma_safe::qp::{Init, QueuePair};
use rdma_safe::RtsAttr;

fn skip(qp: QueuePair<Init>) {
    let _ = qp.to_rts(&RtsAttr::new(0));
}

fn main() {}
