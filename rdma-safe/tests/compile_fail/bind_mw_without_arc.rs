// A window must hold its region: binding a region the window cannot keep alive (a
// plain reference) does not compile.
use rdma_safe::{Access, MemoryRegion, MemoryWindow, SendWr};

fn bind(mw: &mut MemoryWindow, mr: &MemoryRegion) {
    let _ = SendWr::bind_mw(1, mw, mr, 0..64, Access::REMOTE_READ);
}

fn main() {}
