// A polled completion cannot be cloned to release a slot twice.
use rdma_safe::Completion;

fn twice(c: &Completion) -> (Completion, Completion) {
    (c.clone(), c.clone())
}

fn main() {}
