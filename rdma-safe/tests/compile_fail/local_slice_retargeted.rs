// A scatter/gather entry names only the region it borrows: its fields are
// private, so safe code cannot point one at another region, which could then be
// dropped under a work request built from the entry.
use rdma_safe::MemoryRegion;

fn retarget(a: &MemoryRegion, b: &MemoryRegion) {
    let mut sge = a.local(0..8).unwrap();
    sge.addr = b.addr();
    sge.lkey = b.lkey();
}

fn main() {}
