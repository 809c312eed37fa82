// A region cannot be deregistered (dropped) while a work request still names it.
use rdma_safe::{MemoryRegion, SendWr};

fn dangling(mr: MemoryRegion) {
    let mut sge = [mr.local(0..8).unwrap()];
    drop(mr);
    let _wr = SendWr::send(1, &mut sge);
}

fn main() {}
