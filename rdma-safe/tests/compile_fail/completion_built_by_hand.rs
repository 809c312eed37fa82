// A `Completion` has no public constructor: its fields are private.
use rdma_safe::{Completion, WorkCompletion};

fn build(cq_id: u64) -> Completion {
    Completion {
        wc: WorkCompletion::default(),
        cq: cq_id,
    }
}

fn main() {}
