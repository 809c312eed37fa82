// A region handed to the device for many requests shows no bytes: its clones give no
// slice, no copy and no `&MemoryRegion` that could read what the device may write.
use rdma_safe::lease::DeviceRegion;

fn peek(buffer: &DeviceRegion) -> Vec<u8> {
    buffer.region().to_vec()
}

fn main() {}
