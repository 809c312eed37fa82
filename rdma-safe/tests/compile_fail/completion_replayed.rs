// A polled completion is handed in once: it is neither `Copy` nor `Clone`.
use rdma_safe::lease::LeasedQp;
use rdma_safe::Completion;

fn replay(conn: &mut LeasedQp, c: Completion) {
    let _ = conn.complete(c).map(|released| released.count());
    let _ = conn.complete(c);
}

fn main() {}
