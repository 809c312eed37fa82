//! Safe RAII wrappers over libibverbs (work in progress).
pub use rdma_sys as sys;
