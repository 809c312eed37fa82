// After a region is deregistered (dropped) it cannot be used at all.
use rdma_safe::MemoryRegion;

fn after(mr: MemoryRegion) {
    drop(mr);
    let _ = mr.rkey();
}

fn main() {}
