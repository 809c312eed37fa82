// Nor can safe code build a scatter/gather entry from numbers: it would name
// memory no region of the program keeps registered (`from_raw_parts` is unsafe).
use rdma_safe::LocalSlice;

fn forge() -> LocalSlice<'static> {
    LocalSlice {
        addr: 0x1000,
        len: 8,
        lkey: 1,
        _region: std::marker::PhantomData,
    }
}

fn main() {}
