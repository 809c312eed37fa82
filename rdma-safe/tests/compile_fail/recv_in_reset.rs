// A queue pair in RESET cannot take receives.
use rdma_safe::qp::{QueuePair, Reset};
use rdma_safe::{MemoryRegion, RecvWr};

fn recv_in_reset(qp: &QueuePair<Reset>, mr: &MemoryRegion) {
    let mut sge = [mr.local(0..8).unwrap()];
    let mut wr = RecvWr::new(1, &mut sge);
    unsafe { qp.post_recv(&mut wr) }.unwrap();
}

fn main() {}
