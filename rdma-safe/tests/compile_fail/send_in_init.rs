// Posting a send on a queue pair in INIT does not compile.
use rdma_safe::qp::{Init, QueuePair};
use rdma_safe::sys;

fn send_in_init(qp: &QueuePair<Init>, wr: *mut sys::ibv_send_wr) {
    unsafe { qp.post_send_raw(wr) }.unwrap();
}

fn main() {}
