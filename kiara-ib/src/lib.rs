//! The KIARA InfiniBand transport (work in progress).
pub use rdma_safe;
