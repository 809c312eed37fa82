// Posting a send on a queue pair that is only ready to receive does not compile.
use rdma_safe::qp::{QueuePair, Rtr};
use rdma_safe::{MemoryRegion, SendWr};

fn send_too_early(qp: &QueuePair<Rtr>, mr: &MemoryRegion) {
    let mut sge = [mr.local(0..8).unwrap()];
    let mut wr = SendWr::send(1, &mut sge);
    unsafe { qp.post_send(&mut wr) }.unwrap();
}

fn main() {}
