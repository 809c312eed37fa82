// A LeasedQp wrapped before the connection takes receives only: no send until it is
// established.
use rdma_safe::lease::{Lease, LeasedQp, SendOp};
use rdma_safe::qp::Init;
use rdma_safe::MemoryRegion;

fn early(conn: &mut LeasedQp<Init>, mr: MemoryRegion) {
    let _ = conn.post_send(1, SendOp::Send, Lease::Owned(mr), 0..64, true);
}

fn main() {}
